#!/usr/bin/env python3
"""Independent reference check: eaglegen's engine vs Hugging Face transformers' DeepseekV3.

What it checks
  Loads a Kimi-K2.5-layout checkpoint (nested `text_config`, tensors prefixed
  `language_model.`; e.g. from `eaglegen mkmodel --preset moonlight-16b --layers 4
  --experts bf16`) into `transformers.DeepseekV3ForCausalLM` in float32: the config is
  mapped to a flat DeepseekV3Config, tensor names lose the prefix, routed experts are
  fused into HF's 3-D `experts.gate_up_proj` / `experts.down_proj`, INT4 pack-quantized
  and FP8 block-quantized weights are dequantised, and the state dict is loaded with
  `load_state_dict(strict=True)` so nothing is silently missing or left over.
  It runs a few random prompts teacher-forced through HF and through `eaglegen forward`
  (or reads an existing `--ours` file) and compares, per prompt:
    hidden[0]   embedding output
    hidden[l]   output of decoder layer l-1 (captured with forward hooks: HF's own
                `output_hidden_states` ends with the final-norm output instead)
    normed      final RMSNorm output, logits  all positions
  as the relative L2 error ||ours - ref|| / ||ref||, worst over prompts, and greedy
  (argmax) agreement at positions where the reference top-1/top-2 margin > --margin.
  References, all from the same weights in float32:
    hf       transformers' DeepseekV3 as shipped
    +eps     q_a_layernorm/kv_a_layernorm eps = rms_norm_eps (HF hard-codes 1e-6 there;
             eaglegen, like vLLM, uses rms_norm_eps; only when the two differ, e.g.
             Moonlight's 1e-5; Kimi-K2.5 and DeepSeek-V3 have 1e-6)
    +kv      the MLA latent cache rounded to BF16 as eaglegen's cache is (kv_a_layernorm
             output and the rotated k_pe), i.e. like-for-like with the engine
    +pin     fp32 cache, but every MoE layer takes the experts the +kv run chose
  A BF16 cache moves the router input by ~1e-3, which flips a few expert choices that sit
  on near-ties (random weights have many); a flipped token moves by 10-50 %. So the
  gate is: every reference within --tol up to the last dense layer, and the +kv reference
  within --tol on every row with the positions whose reference routing gap (distance of
  the top-k choice from changing, in score units) is below --tie-gap left out (the
  unfiltered numbers are printed too), plus argmax agreement with +kv at margin > --margin
  except at such positions. --strict-fp32 also gates hf / hf+eps on every row.
  Exit 0: pass; 1: violation; 2: usage/setup error; 77: torch/transformers missing (skip).

How to run
  bash tests/ref/run.sh [ARGS]       # venv + mkmodel + forward + this script (make ref-check)
  build/ref-venv/bin/python tests/ref/hf_compare.py --model build/ref/moonlight-16b-l4 \
      --eaglegen build/eaglegen [--backend cuda] [--tol 1e-2] [--prompts P.json]
  build/ref-venv/bin/python tests/ref/hf_compare.py --model DIR --ours OUT.safetensors \
      --prompts P.json               # compare an existing `eaglegen forward` output
  A GPU machine without PyPI: draw the same model there (mkmodel is deterministic), run
  `eaglegen forward --backend cuda --prompts P.json` (P.json from --write-prompts), bring
  the output back and compare here with --ours/--prompts.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

EXIT_SKIP = 77


# --------------------------------------------------------------------------- helpers
def log(msg):
    print(msg, flush=True)


def read_st(path):
    """Minimal safetensors reader for eaglegen's output (numpy, memory-mapped)."""
    dt = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", {}) or {}
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        out[k] = mm[a:b].view(dt[v["dtype"]]).reshape(v["shape"])
    return out, meta


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    d = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (d if d > 0 else 1.0))


def worst_token_rel(a, b):
    """max over positions t of ||a_t - b_t|| / ||b_t|| (a, b: [T, H])."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    num = np.linalg.norm(a - b, axis=-1)
    den = np.linalg.norm(b, axis=-1)
    den[den == 0] = 1.0
    r = num / den
    return float(r.max()), int(r.argmax())


# --------------------------------------------------------------------------- config
def text_config(cfg):
    """Kimi-K2.5 nests the DeepSeek-V3 text config in `text_config`; flat configs pass."""
    return cfg.get("text_config", cfg)


def quant_config(cfg):
    tc = text_config(cfg)
    return tc.get("quantization_config") or cfg.get("quantization_config")


def hf_config_kwargs(tc):
    """Map a (DeepSeek-V3 / Kimi) text config onto DeepseekV3Config keyword arguments.
    Refuses settings that HF's DeepseekV3 does not implement (it always routes with
    sigmoid scores + e_score_correction_bias, group-limited top-k, every layer from
    first_k_dense_replace on being MoE)."""
    problems = []
    if tc.get("scoring_func", "sigmoid") != "sigmoid":
        problems.append(f"scoring_func={tc.get('scoring_func')!r} (HF DeepseekV3 only has sigmoid)")
    if tc.get("topk_method", "noaux_tc") != "noaux_tc":
        problems.append(f"topk_method={tc.get('topk_method')!r} (HF DeepseekV3 only has noaux_tc)")
    if int(tc.get("moe_layer_freq", 1)) != 1:
        problems.append(f"moe_layer_freq={tc.get('moe_layer_freq')} (HF DeepseekV3 assumes 1)")
    if problems:
        raise SystemExit("hf_compare: config not representable in HF DeepseekV3: " + "; ".join(problems))
    keys = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
            "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "kv_lora_rank",
            "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "n_group",
            "topk_group", "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob",
            "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
            "attention_bias", "bos_token_id", "eos_token_id", "pad_token_id"]
    kw = {k: tc[k] for k in keys if k in tc}
    # DeepSeek/Kimi checkpoints store q/k rope dims as interleaved pairs (complex
    # multiply in DeepSeek's inference/model.py); HF's rope_interleave=True is that.
    kw["rope_interleave"] = bool(tc.get("rope_interleave", True))
    kw["num_mtp_layers"] = 0  # MTP layers are not part of the teacher-forced forward
    rp = {"rope_type": "default", "rope_theta": float(tc.get("rope_theta", 10000.0))}
    rs = tc.get("rope_scaling")
    if rs:
        rtype = rs.get("rope_type", rs.get("type"))
        if rtype != "yarn":
            raise SystemExit(f"hf_compare: rope_scaling type {rtype!r} not handled (only yarn)")
        rp["rope_type"] = "yarn"
        for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                  "mscale", "mscale_all_dim"):
            if k in rs:
                rp[k] = rs[k]
    kw["rope_parameters"] = rp
    return kw


# --------------------------------------------------------------------------- weights
class CheckpointReader:
    """Reads tensors by (unprefixed) name from the sharded checkpoint, dequantising
    INT4 pack-quantized (compressed-tensors) and FP8 block-quantized weights to fp32."""

    def __init__(self, model_dir, cfg):
        import torch
        from safetensors import safe_open
        self.torch = torch
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(idx):
            wm = json.load(open(idx))["weight_map"]
        else:
            f = os.path.join(model_dir, "model.safetensors")
            with safe_open(f, framework="pt") as h:
                wm = {k: "model.safetensors" for k in h.keys()}
        self.prefix = "language_model." if any(k.startswith("language_model.") for k in wm) else ""
        self.files = {}
        self.where = {}
        for k, shard in wm.items():
            if self.prefix and not k.startswith(self.prefix):
                continue  # vision tower / projector of the multimodal checkpoint
            self.where[k[len(self.prefix):]] = os.path.join(model_dir, shard)
        self._open = safe_open
        q = quant_config(cfg) or {}
        self.int4_group = None
        self.fp8_block = None
        if q.get("format") == "pack-quantized" or q.get("quant_method") == "compressed-tensors":
            for g in (q.get("config_groups") or {}).values():
                self.int4_group = int(g["weights"]["group_size"])
        if q.get("quant_method") == "fp8":
            self.fp8_block = tuple(q.get("weight_block_size", [128, 128]))
        self.used = set()

    def _raw(self, name):
        path = self.where[name]
        h = self.files.get(path)
        if h is None:
            h = self.files[path] = self._open(path, framework="pt")
        self.used.add(name)
        return h.get_tensor(self.prefix + name)

    def names(self):
        """Logical weight names (quantisation side tensors folded into BASE.weight)."""
        out = set()
        for n in self.where:
            for suf in (".weight_packed", ".weight_scale_inv", ".weight_scale", ".weight_shape"):
                if n.endswith(suf):
                    out.add(n[: -len(suf)] + ".weight")
                    break
            else:
                out.add(n)
        return out

    def get(self, name):
        """fp32 torch tensor for logical name (BASE.weight or any other tensor)."""
        torch = self.torch
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base and base + ".weight_packed" in self.where:
            packed = self._raw(base + ".weight_packed")            # I32 [out, in/8]
            scale = self._raw(base + ".weight_scale").float()      # [out, in/group]
            shape = [int(x) for x in self._raw(base + ".weight_shape").tolist()]
            out_f, in_f = shape
            p = packed.to(torch.int64) & 0xFFFFFFFF
            shifts = torch.arange(8, dtype=torch.int64) * 4
            nib = ((p.unsqueeze(-1) >> shifts) & 15).reshape(out_f, -1)[:, :in_f]
            g = self.int4_group or (in_f // scale.shape[1])
            w = (nib.float() - 8.0) * scale.repeat_interleave(g, dim=1)[:, :in_f]
            return w.contiguous()
        t = self._raw(name)
        if base and base + ".weight_scale_inv" in self.where:
            s = self._raw(base + ".weight_scale_inv").float()
            bo, bi = self.fp8_block or (128, 128)
            o, i = t.shape
            s = s.repeat_interleave(bo, dim=0)[:o].repeat_interleave(bi, dim=1)[:, :i]
            return (t.float() * s).contiguous()
        return t.float()

    def unused(self):
        return sorted(set(self.where) - self.used)


def build_hf_model(model_dir, cfg, attn="eager"):
    import torch
    import transformers
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    tc = text_config(cfg)
    kw = hf_config_kwargs(tc)
    config = DeepseekV3Config(**kw)
    config._attn_implementation = attn
    t0 = time.time()
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config)
    want = model.state_dict()
    rd = CheckpointReader(model_dir, cfg)
    L = config.num_hidden_layers
    E = config.n_routed_experts
    sd = {}
    for name, ref in want.items():
        if name.endswith("mlp.experts.gate_up_proj"):       # fused [E, 2I, H], gate first
            pre = name[: -len("gate_up_proj")]
            t = torch.empty(ref.shape, dtype=torch.float32)
            inter = ref.shape[1] // 2
            for e in range(E):
                t[e, :inter] = rd.get(f"{pre}{e}.gate_proj.weight")
                t[e, inter:] = rd.get(f"{pre}{e}.up_proj.weight")
        elif name.endswith("mlp.experts.down_proj"):        # fused [E, H, I]
            pre = name[: -len("down_proj")]
            t = torch.empty(ref.shape, dtype=torch.float32)
            for e in range(E):
                t[e] = rd.get(f"{pre}{e}.down_proj.weight")
        else:
            if name not in rd.names():
                raise SystemExit(f"hf_compare: HF expects {name} {tuple(ref.shape)}; not in checkpoint")
            t = rd.get(name)
        if tuple(t.shape) != tuple(ref.shape):
            raise SystemExit(f"hf_compare: {name}: checkpoint shape {tuple(t.shape)} != HF {tuple(ref.shape)}")
        sd[name] = t
    # Everything in the checkpoint must have been consumed, except layers past
    # num_hidden_layers (MTP) which the teacher-forced forward does not use.
    left = [n for n in rd.unused()
            if not (n.startswith("model.layers.") and int(n.split(".")[2]) >= L)]
    if left:
        raise SystemExit(f"hf_compare: {len(left)} checkpoint tensors unused, e.g. {left[:5]}")
    model.load_state_dict(sd, strict=True, assign=True)
    del sd
    # Non-persistent buffers (rotary inv_freq) were created on the meta device.
    model.model.rotary_emb = type(model.model.rotary_emb)(config)
    for n, b in list(model.named_parameters()) + list(model.named_buffers()):
        if b.device.type == "meta":
            raise SystemExit(f"hf_compare: {n} still on the meta device after loading")
        if b.dtype != torch.float32 and b.is_floating_point():
            raise SystemExit(f"hf_compare: {n} is {b.dtype}, expected float32")
    model.eval()
    log(f"HF model: transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params fp32, "
        f"loaded in {time.time() - t0:.1f} s (strict)")
    return model, config


# --------------------------------------------------------------------------- HF forward
class Capture:
    """Forward hooks: embedding output, every decoder layer's output, final norm output."""

    def __init__(self, model):
        self.h = []
        self.normed = None
        m = model.model
        self.handles = [m.embed_tokens.register_forward_hook(self._emb)]
        for layer in m.layers:
            self.handles.append(layer.register_forward_hook(self._layer))
        self.handles.append(m.norm.register_forward_hook(self._norm))

    def reset(self):
        self.h = []
        self.normed = None

    def _emb(self, mod, inp, out):
        self.h.append(out[0].detach().clone())

    def _layer(self, mod, inp, out):
        out = out[0] if isinstance(out, tuple) else out
        self.h.append(out[0].detach().clone())

    def _norm(self, mod, inp, out):
        self.normed = out[0].detach().clone()

    def remove(self):
        for h in self.handles:
            h.remove()


class Bf16KvEmulation:
    """Round the MLA latent cache contents to BF16 (RNE) like eaglegen's BF16 KV cache:
    the kv_a_layernorm output and the rotated k_pe. The query side stays fp32."""

    def __init__(self, model):
        import torch
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdl
        self.mdl = mdl
        self.orig = (mdl.apply_rotary_pos_emb_interleave, mdl.apply_rotary_pos_emb)
        r = lambda x: x.to(torch.bfloat16).to(torch.float32)  # noqa: E731

        def wrap(fn):
            def f(q, k, cos, sin, *a, **kw):
                qe, ke = fn(q, k, cos, sin, *a, **kw)
                return qe, r(ke)
            return f

        mdl.apply_rotary_pos_emb_interleave = wrap(self.orig[0])
        mdl.apply_rotary_pos_emb = wrap(self.orig[1])
        self.handles = [layer.self_attn.kv_a_layernorm.register_forward_hook(lambda m, i, o: r(o))
                        for layer in model.model.layers]

    def remove(self):
        self.mdl.apply_rotary_pos_emb_interleave, self.mdl.apply_rotary_pos_emb = self.orig
        for h in self.handles:
            h.remove()


def routing_gap(g, logits):
    """Per token: how far the reference's expert choice is from changing, in score units
    (sigmoid + e_score_correction_bias): the smaller of the top-k / top-(k+1) expert gap
    among the selected groups and, with group routing, the topk_group / next group gap
    (group score = sum of its top-2 scores, as HF and DeepSeek-V3 compute it)."""
    import torch
    s = logits.sigmoid() + g.e_score_correction_bias
    T, E = s.shape
    G, TG, K = g.num_group, g.topk_group, g.top_k
    inf = torch.full((T,), float("inf"))
    ggap = inf
    if G > 1:
        gs = s.view(T, G, E // G).topk(2, dim=-1)[0].sum(-1)
        top = gs.topk(min(TG + 1, G), dim=-1)
        if TG < G:
            ggap = top[0][:, TG - 1] - top[0][:, TG]
        mask = torch.zeros(T, G, dtype=torch.bool)
        mask.scatter_(1, top[1][:, :TG], True)
        s = s.masked_fill(~mask.repeat_interleave(E // G, dim=1), float("-inf"))
    avail = E if G == 1 else TG * (E // G)
    egap = inf
    if K < avail:
        top = s.topk(K + 1, dim=-1)[0]
        egap = top[:, K - 1] - top[:, K]
    return torch.minimum(egap, ggap)


class RouterTap:
    """Wraps every MoE gate: records the chosen experts (sorted) and routing_gap, and optionally pins the choice to a given set of experts (the expert
    weights are then recomputed from this run's own scores, as HF's router does)."""

    def __init__(self, model):
        self.gates = [(l, layer.mlp.gate) for l, layer in enumerate(model.model.layers)
                      if hasattr(layer.mlp, "gate")]
        self.pin = None    # {layer: LongTensor [T, k]} for the current prompt
        self.rec = {}
        self.gap = {}
        for l, g in self.gates:
            g.forward = self._wrap(l, g, g.forward)

    def _wrap(self, l, g, orig):
        import torch

        def fwd(hidden_states):
            logits, w, idx = orig(hidden_states)
            self.gap[l] = routing_gap(g, logits).numpy().copy()
            if self.pin is not None:
                idx = self.pin[l]
                w = logits.sigmoid().gather(1, idx)
                if g.norm_topk_prob:
                    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
                w = w * g.routed_scaling_factor
            self.rec[l] = torch.sort(idx, dim=-1)[0].clone()
            return logits, w, idx
        return fwd

    def remove(self):
        for _, g in self.gates:
            del g.forward  # back to the class's forward


def set_attn_norm_eps(model, eps):
    for layer in model.model.layers:
        at = layer.self_attn
        at.kv_a_layernorm.variance_epsilon = eps
        if at.q_a_layernorm is not None:
            at.q_a_layernorm.variance_epsilon = eps


def hf_run(model, prompts, bf16kv=False, pin=None):
    """Teacher-forced HF forward of each prompt. pin: per-prompt routing to force."""
    import torch
    cap = Capture(model)
    tap = RouterTap(model)
    emu = Bf16KvEmulation(model) if bf16kv else None
    res = []
    try:
        with torch.inference_mode():
            for i, p in enumerate(prompts):
                cap.reset()
                tap.rec, tap.gap = {}, {}
                tap.pin = pin[i] if pin else None
                ids = torch.tensor([p], dtype=torch.long)
                out = model(input_ids=ids, use_cache=False)
                res.append({
                    "hidden": torch.stack(cap.h).numpy(),
                    "normed": cap.normed.numpy(),
                    "logits": out.logits[0].float().numpy(),
                    "routing": dict(tap.rec),
                    "gap": dict(tap.gap),
                })
    finally:
        cap.remove()
        tap.remove()
        if emu:
            emu.remove()
    return res


def routing_diff(ra, rb):
    """Per MoE layer: tokens whose expert set differs between two runs (all prompts)."""
    out = {}
    for a, b in zip(ra, rb):
        for l in a["routing"]:
            d = (a["routing"][l] != b["routing"][l]).any(dim=-1)
            n, tot = out.get(l, (0, 0))
            out[l] = (n + int(d.sum()), tot + int(d.numel()))
    return out


def hf_hidden_states_convention(model, prompt):
    """Does HF's output_hidden_states end with the final-norm output or the last layer's?"""
    import torch
    cap = Capture(model)
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([prompt[:8]]), use_cache=False, output_hidden_states=True)
        hs = out.hidden_states
        last = hs[-1][0].numpy()
        return {"n": len(hs),
                "last_vs_layer": rel(last, cap.h[-1].numpy()),
                "last_vs_normed": rel(last, cap.normed.numpy()),
                "first_vs_embed": rel(hs[0][0].numpy(), cap.h[0].numpy())}
    finally:
        cap.remove()


# --------------------------------------------------------------------------- compare
def near_ties(ref, L1, tie_gap):
    """Boolean [L1 + 1, T] per prompt: positions whose reference routing came within
    tie_gap of another choice in some MoE layer feeding hidden[l] (row L1: any layer,
    for normed and logits). A flip there is a discontinuity, not an error to measure."""
    T = ref["hidden"].shape[1]
    out = np.zeros((L1 + 1, T), dtype=bool)
    for l in sorted(ref["gap"]):            # decoder layer l feeds hidden[l + 1] onwards
        out[l + 1:] |= ref["gap"][l] < tie_gap
    return out


def compare(ours, refs, prompts, margin_th, tie_gap):
    """Worst-over-prompts relative errors of hidden[l], normed, logits, over all positions
    and over the positions without a routing near-tie; greedy agreement."""
    L1 = refs[0]["hidden"].shape[0]
    r = {"all": [0.0] * (L1 + 2), "excl": [0.0] * (L1 + 2), "tok": [(0.0, -1, -1)] * (L1 + 2),
         "ties": [0] * (L1 + 2), "checked": 0, "agree": 0, "all_pos": 0, "all_agree": 0,
         "mismatch": [], "tie_mismatch": 0}
    for i, (p, ref) in enumerate(zip(prompts, refs)):
        oh = ours[f"p{i}.hidden"]
        if oh.shape != ref["hidden"].shape:
            raise SystemExit(f"hf_compare: p{i}.hidden shape {oh.shape} != reference {ref['hidden'].shape}")
        ties = near_ties(ref, L1, tie_gap)
        pairs = [(oh[l], ref["hidden"][l], ties[l]) for l in range(L1)]
        pairs.append((ours[f"p{i}.normed"], ref["normed"], ties[L1]))
        pairs.append((np.asarray(ours[f"p{i}.logits"]), ref["logits"], ties[L1]))
        for k, (o, g, tie) in enumerate(pairs):
            r["all"][k] = max(r["all"][k], rel(o, g))
            keep = ~tie
            r["excl"][k] = max(r["excl"][k], rel(o[keep], g[keep]) if keep.any() else 0.0)
            r["ties"][k] += int(tie.sum())
            wt, t = worst_token_rel(o, g)
            if wt > r["tok"][k][0]:
                r["tok"][k] = (wt, i, t)
        ol, rl = pairs[-1][0], pairs[-1][1]
        top2 = np.sort(np.partition(rl, -2, axis=-1)[:, -2:], axis=-1)
        marg = top2[:, 1] - top2[:, 0]
        ra, oa = rl.argmax(-1), ol.argmax(-1)
        for t in range(len(p)):
            r["all_pos"] += 1
            r["all_agree"] += int(ra[t] == oa[t])
            if marg[t] > margin_th:
                r["checked"] += 1
                if ra[t] == oa[t]:
                    r["agree"] += 1
                elif ties[L1][t]:
                    r["tie_mismatch"] += 1
                else:
                    r["mismatch"].append((i, t, int(oa[t]), int(ra[t]), float(marg[t])))
    return r


def fmt_tok(x):
    v, i, t = x
    return f"{v:.2e} (p{i} t{t})"


def layer_kind(l, tc):
    if l == 0:
        return "embed"
    return "dense" if (l - 1) < int(tc.get("first_k_dense_replace", 0)) else "moe"


# --------------------------------------------------------------------------- main
def random_prompts(a, V):
    """--n-prompts prompts of uniform random ids < V; lengths in [min_len, max_len], the
    first two exactly min_len and max_len; fixed by --seed."""
    rng = np.random.default_rng(a.seed)
    lens = rng.integers(a.min_len, a.max_len + 1, size=a.n_prompts)
    if a.n_prompts >= 2:
        lens[0], lens[1] = a.min_len, a.max_len
    return [[int(x) for x in rng.integers(0, V, size=int(n))] for n in lens]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--write-prompts", metavar="FILE",
                    help="only write the random prompts JSON (numpy only, no torch) and exit")
    ap.add_argument("--model", required=True, help="checkpoint directory (Kimi-K2.5 or DeepSeek-V3 layout)")
    ap.add_argument("--ours", help="existing `eaglegen forward` output for --prompts (skips running eaglegen)")
    ap.add_argument("--eaglegen", default="build/eaglegen", help="eaglegen binary (default build/eaglegen)")
    ap.add_argument("--backend", default="cpu", help="eaglegen forward --backend (cpu|cuda)")
    ap.add_argument("--threads", type=int, default=0, help="eaglegen/torch threads (0 = all cores)")
    ap.add_argument("--chunk", type=int, default=0, help="eaglegen forward --chunk (0 = its default)")
    ap.add_argument("--block-size", type=int, default=0, help="eaglegen forward --block-size (0 = its default)")
    ap.add_argument("--prompts", help="prompts JSON {\"prompts\": [[ids...], ...]} (default: random)")
    ap.add_argument("--n-prompts", type=int, default=4, help="random prompts to draw (default 4)")
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0, help="prompt RNG seed (default 0)")
    ap.add_argument("--tol", type=float, default=1e-2, help="max per-layer relative error (default 1e-2)")
    ap.add_argument("--margin", type=float, default=1e-2,
                    help="argmax must agree where the reference top1-top2 margin exceeds this (default 1e-2)")
    ap.add_argument("--tie-gap", type=float, default=1e-4,
                    help="positions whose reference routing gap (score units) is below this in a "
                         "MoE layer are left out of the gated error (default 1e-4)")
    ap.add_argument("--no-bf16kv", action="store_true",
                    help="only the plain fp32 HF reference (then it gates every row)")
    ap.add_argument("--strict-fp32", action="store_true",
                    help="gate the fp32-cache references (hf, hf+eps) on every row too "
                         "(fails when a routing near-tie flips)")
    ap.add_argument("--hf-eps", action="store_true",
                    help="keep HF's own q_a/kv_a_layernorm eps (1e-6) in every reference")
    ap.add_argument("--work", help="directory for prompts/output files (default: a temp dir)")
    ap.add_argument("--json", help="write the measured numbers here")
    a = ap.parse_args()

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    tc = text_config(cfg)
    V = int(tc["vocab_size"])
    if a.write_prompts:
        json.dump({"prompts": random_prompts(a, V)}, open(a.write_prompts, "w"))
        return 0
    try:
        import torch
        import transformers  # noqa: F401
        from transformers import DeepseekV3ForCausalLM  # noqa: F401
        import safetensors  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        print(f"hf_compare: SKIP: needs torch, transformers (with DeepseekV3) and safetensors: {e}\n"
              f"  install them with `bash tests/ref/run.sh` (creates build/ref-venv) or\n"
              f"  pip install torch transformers safetensors", file=sys.stderr)
        return EXIT_SKIP

    nthreads = a.threads or os.cpu_count() or 1
    torch.set_num_threads(nthreads)
    work = a.work or tempfile.mkdtemp(prefix="hf_compare.")
    os.makedirs(work, exist_ok=True)

    if a.prompts:
        prompts = json.load(open(a.prompts))["prompts"]
        ppath = a.prompts
    else:
        prompts = random_prompts(a, V)
        ppath = os.path.join(work, "prompts.json")
        json.dump({"prompts": prompts}, open(ppath, "w"))
    log(f"model {a.model}: {tc.get('num_hidden_layers')} layers (first_k_dense_replace "
        f"{tc.get('first_k_dense_replace')}), hidden {tc.get('hidden_size')}, vocab {V}; "
        f"{len(prompts)} prompts, lengths {[len(p) for p in prompts]}")

    timing = {}
    # 1. our engine first (before the fp32 HF model takes ~2x the checkpoint in RAM)
    if a.ours:
        ours_path = a.ours
    else:
        ours_path = os.path.join(work, "ours.safetensors")
        cmd = [a.eaglegen, "forward", "--model", a.model, "--prompts", ppath, "--out", ours_path,
               "--backend", a.backend]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        if a.chunk:
            cmd += ["--chunk", str(a.chunk)]
        if a.block_size:
            cmd += ["--block-size", str(a.block_size)]
        log("$ " + " ".join(cmd))
        t0 = time.time()
        rc = subprocess.call(cmd)
        timing["eaglegen_forward_s"] = time.time() - t0
        if rc != 0:
            print(f"hf_compare: eaglegen forward failed (exit {rc})", file=sys.stderr)
            return 1
    ours, _ = read_st(ours_path)
    for i, p in enumerate(prompts):
        if f"p{i}.tokens" not in ours or list(map(int, ours[f"p{i}.tokens"])) != list(p):
            print(f"hf_compare: {ours_path}: p{i}.tokens differs from the prompt", file=sys.stderr)
            return 2

    # 2. HF references
    t0 = time.time()
    model, config = build_hf_model(a.model, cfg)
    timing["hf_load_s"] = time.time() - t0
    conv = hf_hidden_states_convention(model, prompts[0])
    cfg_eps = float(tc.get("rms_norm_eps", 1e-6))
    hf_eps = model.model.layers[0].self_attn.kv_a_layernorm.variance_epsilon
    t0 = time.time()
    refs = {"hf": hf_run(model, prompts)}
    timing["hf_forward_s"] = time.time() - t0
    base = "hf"
    if hf_eps != cfg_eps and not a.hf_eps:
        # HF builds q_a_layernorm / kv_a_layernorm with its default eps (1e-6), ignoring
        # rms_norm_eps; eaglegen (like vLLM/SGLang) uses rms_norm_eps for every RMSNorm.
        set_attn_norm_eps(model, cfg_eps)
        refs["hf+eps"] = hf_run(model, prompts)
        base = "hf+eps"
    flips = None
    if not a.no_bf16kv:
        refs[base + "+kv"] = hf_run(model, prompts, bf16kv=True)
        flips = routing_diff(refs[base], refs[base + "+kv"])
        # fp32 cache, but each MoE layer takes the experts the BF16-cache run chose:
        # separates "different routing decision at a near-tie" from everything else.
        pin = [r["routing"] for r in refs[base + "+kv"]]
        refs[base + "+pin"] = hf_run(model, prompts, pin=pin)
    del model
    # The gate: the like-for-like reference (`+kv`, or `base` with --no-bf16kv), every
    # row, positions with a routing near-tie left out; every reference on the rows
    # before the first MoE layer (no routing there); with --strict-fp32 also hf / base.
    gate = base + "+kv" if not a.no_bf16kv else base
    strict = {"hf", base} if a.strict_fp32 else set()
    first_moe = 1 + int(tc.get("first_k_dense_replace", 0))  # hidden index of the first MoE output

    # 3. compare
    names = [n for n in ("hf", "hf+eps", base + "+pin", base + "+kv") if n in refs]
    res = {n: compare(ours, refs[n], prompts, a.margin, a.tie_gap) for n in names}
    L1 = refs["hf"][0]["hidden"].shape[0]
    g = res[gate]
    bad = 0
    log("")
    log(f"HF output_hidden_states: {conv['n']} entries, the last is the final-norm output "
        f"(rel {conv['last_vs_normed']:.0e} to it); hooks capture each layer's output instead")
    log("references (all fp32 activations, weights as stored):")
    log(f"  hf      transformers' DeepseekV3 as shipped (q_a/kv_a_layernorm eps {hf_eps:g})")
    if "hf+eps" in refs:
        log(f"  +eps    q_a/kv_a_layernorm eps = rms_norm_eps {cfg_eps:g}, as eaglegen")
    if not a.no_bf16kv:
        log("  +kv     MLA latent cache rounded to BF16 as eaglegen's (kv_a_layernorm output, rotated k_pe)")
        log("  +pin    fp32 cache, MoE experts pinned to the +kv run's choice")
    log(f"relative L2 error ||ours - ref|| / ||ref||, worst over {len(prompts)} prompts. Gate: "
        f"<= {a.tol:g} for {gate} without near-tie positions (routing gap < {a.tie_gap:g}), "
        f"and for every reference up to hidden[{first_moe - 1}]"
        + (f"; --strict-fp32: {', '.join(sorted(strict))} on every row" if strict else ""))
    hdr = f"{'tensor':<11}{'kind':<6}" + "".join(f"{n:>12}" for n in names) + \
        f"{gate + ' w/o ties':>20}{'ties':>6}   worst position ({gate})"
    log(hdr)
    log("-" * len(hdr))
    labels = [(f"hidden[{l}]", layer_kind(l, tc)) for l in range(L1)] + [("normed", "norm"), ("logits", "head")]
    for k, (name, kind) in enumerate(labels):
        vals = [res[n]["all"][k] for n in names]
        hard = [gate] if not (g["excl"][k] <= a.tol) else []
        hard += [n for n, v in zip(names, vals) if not (v <= a.tol) and (k < first_moe or n in strict)]
        soft = [n for n, v in zip(names, vals) if not (v <= a.tol) and n not in hard]
        flag = ""
        if hard:
            flag = "  <-- over tol: " + ", ".join(dict.fromkeys(hard))
            bad += 1
        elif soft:
            flag = "  (" + ", ".join(soft) + " over tol: routing, see below)"
        log(f"{name:<11}{kind:<6}" + "".join(f"{v:>12.3e}" for v in vals) +
            f"{g['excl'][k]:>20.3e}{g['ties'][k]:>6}   {fmt_tok(g['tok'][k])}{flag}")
    for n in names:
        r = res[n]
        log(f"greedy vs {n}: {r['agree']}/{r['checked']} positions with ref top1-top2 margin > "
            f"{a.margin:g} agree ({r['tie_mismatch']} of the others at routing near-ties); "
            f"{r['all_agree']}/{r['all_pos']} of all positions" + ("" if n == gate else " (not gated)"))
        for (i, t, o, gt, m) in r["mismatch"][:8]:
            log(f"  p{i} t{t}: ours argmax {o} != ref {gt} (margin {m:.3g})")
        if n == gate or n in strict:
            bad += len(r["mismatch"])
    kv_alone = eps_alone = None
    if "hf+eps" in refs:
        eps_alone = max(rel(x["hidden"][-1], y["hidden"][-1]) for x, y in zip(refs["hf+eps"], refs["hf"]))
        log(f"HF vs itself, q_a/kv_a eps {cfg_eps:g} vs {hf_eps:g}: last layer rel {eps_alone:.3e}")
    if flips is not None:
        kv_alone = max(rel(x["hidden"][-1], y["hidden"][-1]) for x, y in zip(refs[base + "+kv"], refs[base]))
        log(f"HF vs itself, BF16 cache vs fp32 cache ({base}+kv vs {base}): last layer rel {kv_alone:.3e}")
        for l, (nd, tot) in sorted(flips.items()):
            gaps = np.concatenate([r["gap"][l] for r in refs[base]])
            log(f"  decoder layer {l} (MoE -> hidden[{l + 1}]): experts differ at {nd}/{tot} tokens; "
                f"routing gap median {np.median(gaps):.1e}, min {gaps.min():.1e}, "
                f"{int((gaps < a.tie_gap).sum())} below {a.tie_gap:g}")
    timing["total_s"] = time.time() - T_START
    log("time: " + ", ".join(f"{k} {v:.1f}" for k, v in timing.items()))
    if a.json:
        json.dump({"tol": a.tol, "margin": a.margin, "tie_gap": a.tie_gap, "gate": gate,
                   "rows": [n for n, _ in labels], "prompt_lens": [len(p) for p in prompts],
                   "timing": timing, "hf_eps": hf_eps, "rms_norm_eps": cfg_eps,
                   "eps_alone": eps_alone, "bf16_cache_alone": kv_alone,
                   "routing_flips": {str(l): v for l, v in (flips or {}).items()},
                   "results": res}, open(a.json, "w"), indent=1)
    log("FAIL" if bad else "ok")
    return 1 if bad else 0


T_START = time.time()

if __name__ == "__main__":
    sys.exit(main())
