#!/usr/bin/env python3
"""Reference EAGLE-3 drafter forward (numpy, float64) for tests/test_engine_drafter.c.

Written from the architecture description (SpecForge's LlamaForCausalLMEagle3 / vLLM's
Eagle3 Llama drafter), not from eaglegen's C code:

  hidden input h: fc(concat of the aux rows) at committed positions; at chained draft
  steps, the previous step's pre-norm layer output.
  residual = h (hidden_norm(h) when norm_before_residual)
  x = concat(rmsnorm(embed(token), input_layernorm), rmsnorm(h, hidden_norm))
  q, k, v = x Wq^T, x Wk^T, x Wv^T; rotate-half RoPE at the position (rope_theta);
  K and V are kept as BF16 (round to nearest even), the cache the drafter attends over;
  causal softmax(q k^T / sqrt(head_dim)) v per head, kv head = head // (NH / NKV)
  x = residual + o_proj(attn);  out = x + down(silu(gate(y)) * up(y)), y = rmsnorm(x)
  logits = lm_head(rmsnorm(out, norm)) over the draft vocabulary; target = d + d2t[d].

speculators' Eagle3 layout too (speculators_model_type "eagle3": the layer's config in
transformer_layer_config, tensors layers.0.* for midlayer.*) with its options, written from
speculators' description: norm_before_fc, h = fc(rmsnorm(concat aux, input_norm)) over the
whole concatenated row; norm_output, the chained hidden input is rmsnorm(out, norm) instead
of out; a sliding window (transformer_layer_config layer_types sliding_attention,
sliding_window W): a position p attends to positions (p - W, p] only. fc_norm (vLLM's): after
norm_before_fc, each aux row of the concatenation normalised by its own RMSNorm (fc_norm.{i}).

vLLM's MLA drafter too (architectures Eagle3DeepseekV2ForCausalLM), written from DeepSeek-V3's
attention (inference/model.py and the Hugging Face DeepseekV3 description): the same layer with
MLA over the 2H concat x: q = q_b(rmsnorm(q_a x, q_a_layernorm)) (or q_proj x), [NH][DN + DR];
latent, k_pe = kv_a x ([C], [DR]); latent = rmsnorm(latent, kv_a_layernorm); q_pe and k_pe
rotated in interleaved pairs (x[2i], x[2i+1]) at angle pos * inv_freq[i], inv_freq YaRN-blended
when max_position_embeddings > original_max_position_embeddings, cos and sin times
mscale(factor, mscale) / mscale(factor, mscale_all_dim); the latent and k_pe cached in BF16;
per head k_nope = W_UK latent, v = W_UV latent (kv_b viewed [NH][DN + DV][C]), scores
(q_nope . k_nope + q_pe . k_pe) * (DN + DR)^-0.5 * mscale(factor, mscale_all_dim)^2;
o_proj over the [NH][DV] outputs.

usage: eagle3_ref.py DRAFTER_DIR TARGET_DIR INPUTS.safetensors OUT.safetensors
INPUTS: aux F32 [n, n_aux, Ht], next I32 [n] (token at position t+1 for each position t).
OUT: pos_logits F32 [n, Vd] (after each committed position), chain_logits F32 [2, Vd]
(draft steps 2 and 3), chain_draft I32 [3] (greedy target ids of the 3 drafts).
Only /usr/bin/python3 + numpy.
"""
import json
import math
import os
import struct
import sys

import numpy as np

DT = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_,
      "U8": np.uint8}


def st_read(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        buf = raw[base + a:base + b]
        if e["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=np.dtype(DT[e["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(e["shape"]).copy()
    return out


def st_write(path, tensors):
    hdr, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[arr.dtype]
        b = arr.tobytes()
        hdr[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * w


def target_embedding(target_dir):
    ix = os.path.join(target_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(ix))["weight_map"].values())) if os.path.exists(ix) else ["model.safetensors"]
    for fn in files:
        t = st_read(os.path.join(target_dir, fn))
        for k in ("language_model.model.embed_tokens.weight", "model.embed_tokens.weight"):
            if k in t:
                return t[k].astype(np.float64)
    raise SystemExit("no embedding in " + target_dir)


def yarn_mscale(factor, m):
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


class MLA:
    """DeepSeek-V3 multi-head latent attention of the drafter's layer (see the module text)."""

    def __init__(self, cfg, w, kv):
        self.w, self.kv = w, kv
        self.NH = cfg["num_attention_heads"]
        self.QL = cfg.get("q_lora_rank") or 0
        self.C, self.DN, self.DR, self.DV = (cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                                             cfg["v_head_dim"])
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        base, dim = cfg.get("rope_theta", 10000.0), self.DR
        inv = 1.0 / base ** (np.arange(0, dim, 2) / dim)
        rs = cfg.get("rope_scaling") or {}
        yarn = (rs.get("type") or rs.get("rope_type")) == "yarn" and \
            cfg.get("max_position_embeddings", 0) > rs.get("original_max_position_embeddings", 0)
        self.scale, self.factor = (self.DN + self.DR) ** -0.5, 1.0
        if yarn:
            f, orig = rs["factor"], rs["original_max_position_embeddings"]

            def corr(rot):
                return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
            lo, hi = max(math.floor(corr(rs.get("beta_fast", 32))), 0), min(math.ceil(corr(rs.get("beta_slow", 1))), dim - 1)
            if lo == hi:
                hi += 0.001
            ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
            smooth = 1 - ramp
            inv = inv / f * (1 - smooth) + inv * smooth
            m_all = yarn_mscale(f, rs.get("mscale_all_dim", 0))
            self.scale *= m_all * m_all
            self.factor = yarn_mscale(f, rs.get("mscale", 1)) / m_all
        self.inv = inv
        self.lat, self.kpe = [], []  # per position: the normed latent [C], rotated k_pe [DR], BF16

    def rope(self, x, pos):  # interleaved pairs
        a = pos * self.inv
        c, s = np.cos(a) * self.factor, np.sin(a) * self.factor
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def __call__(self, x, pos):
        w, NH, DN, DR, DV, C = self.w, self.NH, self.DN, self.DR, self.DV, self.C
        if self.QL:
            qa = rmsnorm(w["midlayer.self_attn.q_a_proj.weight"] @ x, w["midlayer.self_attn.q_a_layernorm.weight"],
                         self.eps)
            q = (w["midlayer.self_attn.q_b_proj.weight"] @ qa).reshape(NH, DN + DR)
        else:
            q = (w["midlayer.self_attn.q_proj.weight"] @ x).reshape(NH, DN + DR)
        kv = w["midlayer.self_attn.kv_a_proj_with_mqa.weight"] @ x
        lat = rmsnorm(kv[:C], w["midlayer.self_attn.kv_a_layernorm.weight"], self.eps)
        assert len(self.lat) == pos
        self.lat.append(self.kv(lat))
        self.kpe.append(self.kv(self.rope(kv[C:], pos)))
        qn, qp = q[:, :DN], self.rope(q[:, DN:], pos)
        L, P = np.stack(self.lat), np.stack(self.kpe)  # [pos+1, C], [pos+1, DR]
        kvb = w["midlayer.self_attn.kv_b_proj.weight"].reshape(NH, DN + DV, C)
        att = np.zeros((NH, DV))
        for h in range(NH):
            kn, v = L @ kvb[h, :DN].T, L @ kvb[h, DN:].T  # [pos+1, DN], [pos+1, DV]
            sc = (kn @ qn[h] + P @ qp[h]) * self.scale
            p = np.exp(sc - sc.max())
            p /= p.sum()
            att[h] = p @ v
        return att.reshape(-1)


class Drafter:
    def __init__(self, ddir, tdir, kv_bf16=True):
        cfg = json.load(open(os.path.join(ddir, "config.json")))
        w = st_read(os.path.join(ddir, "model.safetensors"))
        self.w = {("midlayer." + k[9:] if k.startswith("layers.0.") else k): (v.astype(np.float64) if v.dtype.kind == "f" else v)
                  for k, v in w.items()}
        lc = cfg["transformer_layer_config"] if cfg.get("speculators_model_type") == "eagle3" else cfg
        self.H = lc["hidden_size"]
        self.NH = lc["num_attention_heads"]
        self.NKV = lc.get("num_key_value_heads", self.NH)
        self.HD = lc.get("head_dim", self.H // self.NH)
        self.eps = lc.get("rms_norm_eps", 1e-6)
        self.theta = lc.get("rope_theta") or (lc.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        self.nbr = bool(cfg.get("norm_before_residual", False))
        self.nbf = bool(cfg.get("norm_before_fc", False))
        self.nout = bool(cfg.get("norm_output", False))
        self.fcn = bool(cfg.get("fc_norm", False))
        lt = lc.get("layer_types") or []
        sliding = lt[0] == "sliding_attention" if lt else bool(lc.get("use_sliding_window", False))
        self.window = int(lc["sliding_window"]) if sliding else 0  # attend to the last `window` positions
        self.emb = self.w["embed_tokens.weight"] if "embed_tokens.weight" in self.w else target_embedding(tdir)
        self.d2t = self.w["d2t"].astype(np.int64)
        self.kv = bf16 if kv_bf16 else (lambda a: a)  # eaglegen keeps K and V in BF16
        self.K, self.V = [], []  # per position: [NKV, HD] bf16 values
        arch = cfg.get("architectures") or []
        self.mla = MLA(cfg, self.w, self.kv) if any(a.startswith("Eagle3Deepseek") for a in arch) else None

    def rope(self, x, pos):
        half = self.HD // 2
        inv = 1.0 / self.theta ** (np.arange(half) * 2.0 / self.HD)
        a = pos * inv
        c, s = np.cos(a), np.sin(a)
        x0, x1 = x[..., :half].copy(), x[..., half:].copy()
        return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)

    def layer(self, token, h, pos):
        w, H = self.w, self.H
        res = rmsnorm(h, w["midlayer.hidden_norm.weight"], self.eps) if self.nbr else h
        x = np.concatenate([rmsnorm(self.emb[token], w["midlayer.input_layernorm.weight"], self.eps),
                            rmsnorm(h, w["midlayer.hidden_norm.weight"], self.eps)])
        if self.mla:
            return self.mlp(res + w["midlayer.self_attn.o_proj.weight"] @ self.mla(x, pos))
        q = (w["midlayer.self_attn.q_proj.weight"] @ x).reshape(self.NH, self.HD)
        k = (w["midlayer.self_attn.k_proj.weight"] @ x).reshape(self.NKV, self.HD)
        v = (w["midlayer.self_attn.v_proj.weight"] @ x).reshape(self.NKV, self.HD)
        q, k = self.rope(q, pos), self.rope(k, pos)
        assert len(self.K) == pos
        self.K.append(self.kv(k))
        self.V.append(self.kv(v))
        lo = max(0, pos - self.window + 1) if self.window else 0
        Ks, Vs = np.stack(self.K[lo:]), np.stack(self.V[lo:])  # [pos+1-lo, NKV, HD]
        grp = self.NH // self.NKV
        att = np.zeros((self.NH, self.HD))
        for hh in range(self.NH):
            sc = Ks[:, hh // grp, :] @ q[hh] / np.sqrt(self.HD)
            p = np.exp(sc - sc.max())
            p /= p.sum()
            att[hh] = p @ Vs[:, hh // grp, :]
        return self.mlp(res + w["midlayer.self_attn.o_proj.weight"] @ att.reshape(-1))

    def mlp(self, x1):
        w = self.w
        y = rmsnorm(x1, w["midlayer.post_attention_layernorm.weight"], self.eps)
        g = w["midlayer.mlp.gate_proj.weight"] @ y
        u = w["midlayer.mlp.up_proj.weight"] @ y
        return x1 + w["midlayer.mlp.down_proj.weight"] @ (g / (1 + np.exp(-g)) * u)

    def logits(self, pre):
        return self.w["lm_head.weight"] @ rmsnorm(pre, self.w["norm.weight"], self.eps)

    def hidden_in(self, aux_row):
        a = aux_row.reshape(-1)
        if self.nbf:
            a = rmsnorm(a, self.w["input_norm.weight"], self.eps)
        if self.fcn:  # vLLM's fc_norm: one RMSNorm per aux row, after norm_before_fc
            n = aux_row.shape[0]
            a = np.concatenate([rmsnorm(c, self.w["fc_norm.%d.weight" % i], self.eps)
                                for i, c in enumerate(np.split(a, n))])
        return self.w["fc.weight"] @ a

    def chained(self, pre):
        return rmsnorm(pre, self.w["norm.weight"], self.eps) if self.nout else pre


def main():
    ddir, tdir, inp, outp = sys.argv[1:5]
    t = st_read(inp)
    aux, nxt = t["aux"].astype(np.float64), t["next"].astype(np.int64)
    d = Drafter(ddir, tdir)
    n = aux.shape[0]
    pos_logits, pre = [], None
    for p in range(n):
        pre = d.layer(nxt[p], d.hidden_in(aux[p]), p)
        pos_logits.append(d.logits(pre))
    drafts, chain = [], []
    lg = pos_logits[-1]
    for step in range(3):
        di = int(np.argmax(lg))
        drafts.append(di + int(d.d2t[di]))
        if step == 2:
            break
        pre = d.layer(drafts[-1], d.chained(pre), n + step)
        lg = d.logits(pre)
        chain.append(lg)
    st_write(outp, {"pos_logits": np.array(pos_logits, dtype=np.float32),
                    "chain_logits": np.array(chain, dtype=np.float32),
                    "chain_draft": np.array(drafts, dtype=np.int32)})


if __name__ == "__main__":
    main()
