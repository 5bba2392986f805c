#!/usr/bin/env python3
"""Layouts of a DeepSeek-V3-architecture model (Kimi-K2.5 by default) on an 8-GPU box,
with a roofline model of decode and capture-mode prefill: the same model as
engine/layout.c (`eaglegen plan --gpus N` / `--box NAME`), formula for formula, so the
two can be checked against each other (tests/t_plan_layouts.sh).

Layouts: P pipeline stages x expert-parallel groups of E GPUs (P * E = GPUs). Inside a
group attention is data-parallel (each GPU holds the cache of its own sequences: the
cache is held once), the routed experts are split E ways, and the dense parts are
replicated in the group ("ep8"), or "+ffn": the shared expert of each MoE layer and the
dense MLP of each dense layer owned whole by rank l mod E of the group (generate
--ep-split ffn; built on CPU and CUDA ranks), or "+split": +ffn and the embedding
and lm_head vocab-split over the group (generate --ep-split all; built on CPU and CUDA
ranks). ppG is the pipeline, epG one
group over every GPU; tpG (tensor parallel: weights split, the latent cache copied onto
every GPU) is what serving stacks run, modelled for comparison.

Per GPU and step: bytes read (always-read weights, the routed experts the step hits,
the BF16 cache) and FLOPs (2 per multiply-add, x2 for eaglegen's BF16 hi + lo
activations); each part takes max(bytes / (HBM * eff), FLOPs / (tensor rate * eff)).
Collectives: per MoE layer a token's FP32 row goes to the other GPUs owning one of its K
experts, (E - 1)(1 - (1 - 1/E)^K) rows on average, and its K weighted expert outputs come
back as FP32 rows, K (E - 1)/E (one per remote expert, so the owner adds them in the
unsplit order); each collective costs the link latency plus bytes over the per-GPU link
bandwidth, not overlapped with compute. +ffn: per layer the owner receives the FP32 rows
of the group's tokens that live elsewhere, B (E - 1)/E for B group rows, and sends their
FP32 outputs back (its link is the bottleneck), in the MoE layer's exchange (no extra
latency) or, on a dense layer, an exchange of its own (2 latencies); it reads the whole
FFN and computes it for all B rows while the other ranks wait (the layer's time is the
owner's), and the FFN weights sit on one rank (memory per rank: its own layers,
round-robin, exactly). +split adds the embedding (ids to their vocab-range owner, BF16
rows back) and lm_head (the FP32 final rows to every rank, each rank's V/E FP32 logit
columns back to the row's owner), each rank holding V/E rows of both. Tensor parallel: two
BF16 all-reduces per layer.
A pipeline keeps P micro-batches in flight, each with 1/P of the sequences, and each
stage reads the experts every micro-batch hits: E (1 - (1 - K/E)^B) per MoE layer for B
tokens (uniform routing). Capacity: each stage's free memory over its layers' cache
bytes per token (its heaviest rank); a group holds E times the worst stage's tokens;
concurrency is the token slots (1% kept free) over the mean length, generate's
on-demand KV policy.

Boxes: rtx-pro-6000x8 (8 x 96 GB, 1.8 TB/s, 500 TFLOP/s BF16, PCIe: 25 GB/s per GPU per
direction + 30 us per collective), h200x8 (8 x 141 GB, 4.8 TB/s, 990 TFLOP/s, NVLink:
450 GB/s + 10 us). eff (default 0.6) is the share of bandwidth and tensor rate the
kernels reach, an input until `eaglegen bench --backend cuda` measures it.

usage: python3 docs/perf_model.py [--box NAME] [--config config.json] [--eff F]
       [--mean-len N] [--held-len N] [--gpu-mem-gb F] [--link-gbs F] [--link-us F]
       [--prefill-chunk N] [--whole-layers | --balance-memory] [--ffn-rows]
       [--draft-tokens K --accept A [--draft-cache-bytes N] [--draft-weight-bytes N]] [--json]
--draft-tokens K --accept A: speculative decoding, K drafts verified per target pass of K + 1 rows
committing A tokens on average (generate --draft-model reports A); the drafter (drafter_bytes)
sits beside lm_head on the last stage, runs K times per step on its micro-batch, not overlapped.
--draft-cache-bytes: its paged cache per token (default the modelled drafter's: 64 kv heads of
128, 32,768 bytes, as the public Kimi-K2.5 drafters; 8 kv heads 4,096; an MLA drafter 1,152);
--draft-weight-bytes: its weights on a GPU (default the modelled drafter's, 2.38 GB on Kimi-K2.5).
A pipeline's pool (P > 1) is the stage with the least free memory per cached token times the
stages. By default stages may end inside a MoE layer, a boundary layer's routed experts split
between the two stages beside it, as `generate --stages N` does on planned GPUs (split_kv, the
search of engine/plan.c, over a rank's units), where that holds more than whole layers: on
8x RTX PRO 6000 pp8 at whole layers keeps 6.9 GB free on its four 8-layer stages against 13-17
GB on the others. The step times are that split's stages' (the hand-over across a cut 3H + 2K
floats a row); prefill, capture mode, ignores the drafter. Needs numpy.
--whole-layers: every stage holds whole layers (generate --whole-layers).
--balance-memory: what-if, an upper bound on the pool: a pipeline's pool as if the stages' free
memory were pooled (box-wide free bytes over box-wide cache bytes per token), with the step times
of whole layers. Those rows are marked modelled only.
--ffn-rows: what-if, +ffn and +split with the FFNs split by weight rows instead of owned whole
(not built; modelled only): every rank holds 1/E of each shared expert / dense MLP (gate and up
by their output rows, down by its output rows: each element the unsplit dot product, so exact),
runs it over all B group rows, and per layer four collectives move the group's rows to every
rank, each rank's activation columns back to the rows' owners, the activation rows to every rank
and each rank's output columns back: B (E - 1)/E rows of H and F in, B/E (E - 1)/E rows of F
and H out per rank.
--held-len: cache tokens each sequence holds, for concurrency (default: --mean-len; with
--kv-policy reserve a sequence holds prompt + max_new whatever it generates).
--batch N: at most N sequences in flight box-wide (generate --batch N); --batch-per-rank N: at
most N per expert-parallel rank (generate --batch auto, which takes up to --chunk slots a rank).
"""
import json
import math
import sys

KIMI_K25 = dict(hidden_size=7168, num_hidden_layers=61, num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512,
                qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=18432,
                moe_intermediate_size=2048, n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=8,
                first_k_dense_replace=1, moe_layer_freq=1, vocab_size=163840, tie_word_embeddings=False,
                experts="int4", group=32)

BOXES = {
    "rtx-pro-6000x8": dict(gpus=8, mem_gb=96, frac=0.92, act_gb=3, hbm_tbs=1.8, tflops=500, eff=0.6, link="pcie"),
    "h200x8": dict(gpus=8, mem_gb=141, frac=0.92, act_gb=4, hbm_tbs=4.8, tflops=990, eff=0.6, link="nvlink"),
}
LINKS = {"pcie": (25.0, 30.0), "nvlink": (450.0, 10.0)}


def load_config(path):
    """The fields the model uses from a Hugging Face config.json (flat or Kimi's nested text_config)."""
    root = json.load(open(path))
    t = root.get("text_config", root)
    q = t.get("quantization_config") or root.get("quantization_config")
    c = {k: t[k] for k in KIMI_K25 if k in t}
    c.setdefault("q_lora_rank", 0)
    c["q_lora_rank"] = c["q_lora_rank"] or 0
    c.setdefault("tie_word_embeddings", False)
    c.setdefault("moe_layer_freq", 1)
    c.setdefault("first_k_dense_replace", 0)
    c.setdefault("n_shared_experts", 0)
    c["experts"], c["group"] = "bf16", 32
    if q and q.get("quant_method") == "compressed-tensors":
        c["experts"] = "int4"
        c["group"] = next(iter(q["config_groups"].values()))["weights"]["group_size"]
    elif q and q.get("quant_method") == "fp8":
        c["experts"] = "fp8"
    return c


def is_moe(c, l):
    return c["n_routed_experts"] > 0 and l >= c["first_k_dense_replace"] and l % max(c["moe_layer_freq"], 1) == 0


def expert_matrix_bytes(c, rows, cols):
    if c["experts"] == "int4":
        return rows * cols / 2 + rows * math.floor(cols / c["group"]) * 2
    if c["experts"] == "fp8":
        return rows * cols + math.ceil(rows / 128) * math.ceil(cols / 128) * 4
    return rows * cols * 2


def parts_of(c, l):
    H, NH, QL, C, F = (c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"],
                       c["moe_intermediate_size"])
    DN, DR, DV = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    DQ, W = NH * (DN + DR), C + DR
    p = dict(attn_b=2 * H * 2 + (2 * (QL * H + QL + DQ * QL) if QL > 0 else 2 * DQ * H)
             + 2 * (W * H + C + NH * (DN + DV) * C + H * NH * DV),
             router_b=0.0, router_p=0.0, expert_b=0.0, expert_p=0.0, moe=is_moe(c, l))
    p["attn_p"] = p["attn_b"] / 2
    E = c["n_routed_experts"]
    if p["moe"]:
        p["router_b"] = 2 * E * H + 4.0 * E
        p["router_p"] = E * H
        p["mlp_b"] = 2 * 3 * H * F * c["n_shared_experts"]
        p["expert_b"] = 2 * expert_matrix_bytes(c, F, H) + expert_matrix_bytes(c, H, F)
        p["expert_p"] = 3 * H * F
    else:
        p["mlp_b"] = 2 * 3 * H * c["intermediate_size"]
    p["mlp_p"] = p["mlp_b"] / 2
    return p


class Acc:
    def __init__(self):
        self.hbm = self.fl = 0.0

    def part(self, nbytes, flops, bw, rate):
        tb, tf = nbytes / bw, flops / rate
        if tb >= tf:
            self.hbm += tb
            return tb
        self.fl += tf
        return tf


def hit(E, K, tokens):
    return 0.0 if tokens <= 0 or E <= 0 else E * (1 - (1 - K / E) ** tokens)


def cap_seqs(S, E):
    """Sequences in flight: at most --batch N box-wide, or --batch-per-rank N per
    expert-parallel rank (generate --batch auto: --chunk slots per rank)."""
    if MAX_SEQS and S > MAX_SEQS:
        S = float(MAX_SEQS)
    if MAX_SEQS_PER_RANK and S > MAX_SEQS_PER_RANK * E:
        S = float(MAX_SEQS_PER_RANK * E)
    return S


def split_layers(cost, first, last, n):
    """Minimise the largest stage (eg_plan_split): ends[i] = end layer of stage i."""
    L = len(cost)
    pre = [0.0]
    for x in cost:
        pre.append(pre[-1] + x)
    INF = 1e300
    best = [[INF] * (L + 1) for _ in range(n + 1)]
    cut = [[-1] * (L + 1) for _ in range(n + 1)]
    for j in range(L + 1):
        best[1][j] = pre[j] + first + (last if n == 1 else 0) if j else INF
    for k in range(2, n + 1):
        for j in range(L + 1):
            for i in range(k - 1, j):
                stage = pre[j] - pre[i] + (last if k == n and j == L else 0)
                v = best[k - 1][i] if best[k - 1][i] > stage else stage
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    ends, j = [0] * n, L
    for k in range(n, 0, -1):
        ends[k - 1] = j
        j = cut[k][j] if k > 1 else 0
    return ends


def split_kv(parts, budget, kvb, extra_last):
    """eg_plan_split_kv (engine/plan.c), the same search in integers: the largest X such that the units
    (per layer its attention part, then each routed expert, then the shared expert) fill len(budget)
    stages in order, stage k holding its units' bytes + X * kvb per attention unit (+ X * extra_last
    on the last) within budget[k]; a stage begins at a layer's attention or (a layer split) before
    expert c of a MoE layer, 0 < c < E, with a later layer left for the next stage's attention, and a
    stage beginning inside layer l runs past layer l + 1's attention. parts: (attn, expert, shared,
    n_experts) ints per layer. Returns (X, ends, cuts) as the C function gives them (the same split
    traced back), or None when even X = 0 does not fit. owner (the fifth item, optional): 1 + the
    rank that alone holds the layer's `shared` (a dense layer's MLP then, not in attn), 0 every rank;
    a stage's bytes are its heaviest rank's. Vectorised (numpy): per stage the starts it may have,
    and the interval of ends each start reaches (the last end: the least over ranks of each rank's
    last)."""
    import numpy as np
    n, L = len(budget), len(parts)
    nbytes, layer, kind, attn_at, owner = [], [], [], [], []
    for l, p in enumerate(parts):
        a, e, sh, ne = p[:4]
        ow = p[4] if len(p) > 4 else 0
        attn_at.append(len(nbytes))
        nbytes.append(a), layer.append(l), kind.append(0), owner.append(0)
        if ne > 0:
            nbytes += [e] * ne
            layer += [l] * ne
            kind += list(range(1, ne + 1))
            owner += [0] * ne
        if ne > 0 or sh > 0:
            nbytes.append(sh), layer.append(l), kind.append(-1), owner.append(ow)
    U = len(nbytes)
    attn_at.append(U)
    kind, layer, attn_at, owner = np.array(kind), np.array(layer), np.array(attn_at), np.array(owner)
    nb = np.array(nbytes, np.int64)
    pre = np.zeros(U + 1, np.int64)
    pre[1:] = np.cumsum(np.where(owner == 0, nb, 0))
    R = int(owner.max()) if U else 0
    own = np.zeros((max(R, 1), U + 1), np.int64)  # own[r]: prefix of the bytes rank r holds alone
    for r in range(R):
        own[r, 1:] = np.cumsum(np.where(owner == r + 1, nb, 0))
    pa = np.zeros(U + 1, np.int64)
    pa[1:] = np.cumsum(kind == 0)
    ne_of = np.array([p[3] for p in parts])[layer]
    may = (kind == 0) | ((kind >= 2) & (kind - 1 < ne_of) & (layer + 1 < L))
    may[0] = False
    idx = np.arange(U)
    least = np.where((idx == 0) | (kind == 0), idx + 1, attn_at[np.minimum(layer + 1, L)] + 1)

    def fits(kvx, extra_x):
        g = pre + kvx * pa  # a rank's stage cost of units [s, e): h[r][e] - h[r][s], non-decreasing in e
        h = g[None, :] + own

        def cost(st, e):
            return (h[:, e][:, None] - h[:, st]).max(axis=0)

        reach = [np.zeros(U, bool) for _ in range(n)]
        reach[0][0] = True
        for k in range(n - 1):
            st = np.nonzero(reach[k])[0]
            lo = least[st]
            last = np.min([np.searchsorted(h[r], h[r][st] + budget[k], side="right") for r in range(len(h))], axis=0)
            hi = np.maximum(last - 1, st)
            hi = np.minimum(hi, U - 1)  # a later stage needs a unit
            ok = lo <= hi
            diff = np.zeros(U + 2, np.int64)
            np.add.at(diff, lo[ok], 1)
            np.add.at(diff, hi[ok] + 1, -1)
            reach[k + 1] = (np.cumsum(diff[:U]) > 0) & may
        e, begin = U, [0] * n
        for k in range(n - 1, -1, -1):  # the last stage ends at U; trace a split back
            cap = budget[k] - (extra_x if k == n - 1 else 0)
            st = np.nonzero(reach[k][:e])[0]
            cand = st[(least[st] <= e) & (cost(st, e) <= cap)]
            if not len(cand):
                return None
            e = begin[k] = int(cand[0])
        return begin if e == 0 else None

    best = fits(0, 0)
    if best is None:
        return None
    lo, hi = 0, 1
    for b in budget:
        hi += b if b > 0 else 0
    hi = hi // (kvb if kvb > 0 else 1) + 1
    while lo + 1 < hi:  # lo fits, hi does not
        mid = lo + (hi - lo) // 2
        got = fits(mid * kvb, mid * extra_last)
        if got is not None:
            lo, best = mid, got
        else:
            hi = mid
    ends, cuts = [0] * n, [0] * n  # begins_to_ends
    for k in range(n):
        if k == n - 1:
            ends[k] = int(layer[U - 1]) + 1
            continue
        b = best[k + 1]
        if kind[b] == 0:
            ends[k] = int(layer[b])
        else:
            ends[k], cuts[k] = int(layer[b]) + 1, int(kind[b]) - 1
    return lo, ends, cuts


def pool_of(c, lp, ends, cuts, P, E, own, usable, head_w, tail_w, dw, kvb, dkv):
    """engine/layout.c pool_of: the KV tokens per rank of stages split at ends and cuts (None: whole
    layers) as the heaviest rank holds them (each range of routed experts shared out, the heaviest
    share ceil(n / E); the FFNs of the layers whose FFN runs on the stage, a split layer's after the
    cut, on their owners with own; the embedding on the first, the head and a drafter on the last).
    Returns (the smallest stage's tokens, the heaviest stage's bytes, the stages' free bytes summed,
    their cache bytes per token summed)."""
    NE = c["n_routed_experts"]
    min_tok, wmax, free_sum, per_sum, b0 = None, 0.0, 0.0, 0.0, 0
    for s in range(P):
        hc = cuts[s - 1] if s and cuts else 0
        tc = cuts[s] if s < P - 1 and cuts else 0
        end = ends[s]
        w, ffn_max = (head_w if s == 0 else 0) + (tail_w if s == P - 1 else 0), 0.0
        for l in range(b0, end):
            w += lp[l]["attn_b"] + lp[l]["router_b"] + (math.ceil((tc if tc and l == end - 1 else NE) / E)
                                                        if lp[l]["moe"] else 0) * lp[l]["expert_b"]
        if hc:
            w += math.ceil((NE - hc) / E) * lp[b0 - 1]["expert_b"]
        for j in range(E if own and not FFN_ROWS else 1):  # rank j holds the FFNs of layers l = j mod E
            f = 0.0
            for l in range(b0 - 1 if hc else b0, end - (1 if tc > 0 else 0)):
                if own and FFN_ROWS:  # every rank 1/E of each FFN's rows
                    f += lp[l]["mlp_b"] / E
                elif not own or l % E == j:
                    f += lp[l]["mlp_b"]
            ffn_max = max(ffn_max, f)
        w += ffn_max
        hold = s == P - 1  # the drafter beside lm_head: its weights and its sequences' cache
        free = usable - w - (dw if hold else 0)
        tok = math.floor(free / ((end - b0) * kvb + (dkv if hold else 0))) if free > 0 else 0
        min_tok = tok if min_tok is None or tok < min_tok else min_tok
        wmax = max(wmax, w)
        free_sum, per_sum = free_sum + free, per_sum + (end - b0) * kvb + (dkv if hold else 0)
        b0 = end
    return min_tok, wmax, free_sum, per_sum


def split_tokens(c, lp, P, E, own, usable, head_w, tail_w, dw, kvb, dkv):
    """Tokens per rank of the layer split (eg_layout_opts.whole_layers 0; engine/layout.c split_tokens):
    split_kv over a rank's units (1/E of each routed expert; with a dense split each shared expert /
    dense MLP on its owner, a stage counting its heaviest rank), every stage's budget its GPU's usable memory less the embedding (stage 0), the
    head and the drafter's weights (the last, whose cache grows by the drafter's per token); then that
    split as the heaviest rank holds it (pool_of). Returns (tokens, ends, cuts, the heaviest stage's
    bytes), tokens 0 if none fits."""
    NE, parts = c["n_routed_experts"], []
    for l, p in enumerate(lp):  # with own each FFN on its owner alone, a dense one too
        if own and FFN_ROWS:  # --ffn-rows: 1/E of every FFN on every rank, a dense layer's beside its attention
            m = int(math.ceil(p["mlp_b"] / E))
            parts.append((int(p["attn_b"] + p["router_b"] + (0 if p["moe"] else m)),
                          int(math.ceil(p["expert_b"] / E)) if p["moe"] else 0, m if p["moe"] else 0,
                          NE if p["moe"] else 0, 0))
            continue
        parts.append((int(p["attn_b"] + p["router_b"] + (0 if p["moe"] or own else p["mlp_b"])),
                      int(math.ceil(p["expert_b"] / E)) if p["moe"] else 0,
                      int(p["mlp_b"]) if p["moe"] or own else 0, NE if p["moe"] else 0, l % E + 1 if own else 0))
    budget = [int(math.floor(usable - (head_w if s == 0 else 0) - (tail_w + dw if s == P - 1 else 0)))
              for s in range(P)]
    got = split_kv(parts, budget, int(kvb), int(dkv))
    if got is None:
        return 0, None, None, 0.0
    _, ends, cuts = got
    min_tok, wmax, _, _ = pool_of(c, lp, ends, cuts, P, E, own, usable, head_w, tail_w, dw, kvb, dkv)
    return (min_tok if min_tok > 0 else 0), ends, cuts, wmax


WHOLE_LAYERS = False  # --whole-layers: every stage holds whole layers (else stages may end inside a MoE layer)
BALANCE_MEMORY = False  # --balance-memory: pipelines as if every stage's free memory held cache
FFN_ROWS = False  # --ffn-rows: +ffn / +split as the exact row split of every FFN's weights (not built)
MAX_SEQS = 0  # --batch N: sequences in flight at most, box-wide (generate --batch N)
MAX_SEQS_PER_RANK = 0  # --batch-per-rank N: at most N per expert-parallel rank (generate --batch auto: --chunk)
DRAFT_CACHE_BYTES = None  # --draft-cache-bytes: the drafter's cache per token instead of the modelled one's
DRAFT_WEIGHT_BYTES = None  # --draft-weight-bytes: its weights on a GPU instead of the modelled one's


def drafter_bytes(c):
    """The modelled EAGLE-3 drafter (eg_layout_drafter_bytes), shaped as the public Kimi-K2.5 drafters:
    one Llama layer of the target's hidden size, the target's head count of heads of 128 and as many KV
    heads (no GQA), q/k/v over 2H inputs, fc over 3 aux states, the target's dense MLP width, a 32,000-id
    draft lm_head, BF16. Returns (weight bytes, cache bytes per token; the cache is paged, held per token)."""
    H, D, I, VD = c["hidden_size"], 128, c["intermediate_size"], 32000
    NQ = NKV = c["num_attention_heads"]
    w = 2 * (3 * H * H + 2 * H * NQ * D + 2 * 2 * H * NKV * D + NQ * D * H + 3 * H * I + VD * H + 4 * H)
    return (DRAFT_WEIGHT_BYTES if DRAFT_WEIGHT_BYTES else w,
            DRAFT_CACHE_BYTES if DRAFT_CACHE_BYTES else 2.0 * 2 * NKV * D)


def layer_terms(p, attn, ffn, fr, E, K, hits, r, b, q, own, away, H, lat, link, a):
    """Layer p's terms on a stage (engine/layout.c layer_terms): its attention and router (attn), its
    shared expert / dense MLP (ffn), the share fr of its routed experts (1, or a layer split between
    two stages: cut / E beside the attention, (E - cut) / E after the cut), the routed exchange of the
    pairs in the share (K fr experts per token)."""
    if attn:
        a["fixed_b"] += p["attn_b"] + p["router_b"]
        a["fixed_f"] += 4 * r * q * (p["attn_p"] + p["router_p"])
    if ffn and own and FFN_ROWS:  # 1/E of the FFN on every rank over every group row: rows to all,
        F = p["mlp_p"] / (3 * H)   # activation columns back, activation rows to all, output columns back
        a["fixed_b"] += p["mlp_b"] / E
        a["fixed_f"] += 4 * b * q * p["mlp_p"] / E
        a["comm"] += 4 * lat + (away * (H + F) + r * q * (E - 1) / E * (F + H)) * 4 / link
    elif ffn and own:  # the owner reads the whole FFN and runs it on every group row; the layer waits for it
        a["ffn_b"] += p["mlp_b"]
        a["ffn_f"] += 4 * b * q * p["mlp_p"]
    elif ffn:
        a["fixed_b"] += p["mlp_b"]
        a["fixed_f"] += 4 * r * q * p["mlp_p"]
    if p["moe"]:
        kf = K * fr
        disp, ret = (E - 1) * (1 - (1 - 1 / E) ** kf), kf * (E - 1) / E
        a["exp_b"] += hits * p["expert_b"] / E * fr
        a["exp_f"] += 4 * b * q * K * p["expert_p"] / E * fr
        if E > 1:
            a["comm"] += 2 * lat + (r * q * (disp + ret) + (2 * away if ffn and not FFN_ROWS else 0)) * H * 4 / link
    elif own and ffn and not FFN_ROWS:
        a["comm"] += 2 * lat + 2 * away * H * 4 / link


def stage_step(c, box, lp, l0, l1, hc, tc, first, last, E, split, b, prefill, length, q=1.0):
    """hc > 0: the stage begins with layer l0 - 1's experts [hc, E) and its shared expert; tc > 0: its
    last layer runs experts [0, tc) and hands the partial sum over (3H + 2K floats a row)."""
    acc = Acc()
    bw, rate = box["hbm_tbs"] * 1e12 * box["eff"], box["tflops"] * 1e12 * box["eff"]
    H, K, NE, NH = c["hidden_size"], c["num_experts_per_tok"], c["n_routed_experts"], c["num_attention_heads"]
    C, DR = c["kv_lora_rank"], c["qk_rope_head_dim"]
    kvb, r, lat, link = 2 * (C + DR), b / E, box["link_us"] * 1e-6, box["link_gbs"] * 1e9
    nl, hits = l1 - l0, hit(NE, K, b * q)
    own = split != "none" and E > 1  # each layer's FFN whole on rank l mod E
    away = b * q * (E - 1) / E if own else 0.0  # rows the layer's owner receives and sends back
    a = dict(fixed_b=0.0, fixed_f=0.0, ffn_b=0.0, ffn_f=0.0, exp_b=0.0, exp_f=0.0, comm=0.0)
    if hc > 0:
        layer_terms(lp[l0 - 1], False, True, (NE - hc) / NE, E, K, hits, r, b, q, own, away, H, lat, link, a)
    for l in range(l0, l1):
        tail = tc > 0 and l == l1 - 1
        layer_terms(lp[l], True, not tail, tc / NE if tail else 1, E, K, hits, r, b, q, own, away, H, lat, link, a)
    fixed_b, fixed_f, ffn_b, ffn_f, exp_b, exp_f = a["fixed_b"], a["fixed_f"], a["ffn_b"], a["ffn_f"], a["exp_b"], a["exp_f"]
    comm = a["comm"]
    if prefill:
        keys = (length + 1) / 2
        kv_b = r * nl * kvb
        kv_f = 4 * r * nl * NH * (c["qk_nope_head_dim"] + DR + c["v_head_dim"]) * keys
    else:
        kv_b = r * length * nl * kvb
        kv_f = r * q * length * nl * 4 * NH * (2 * C + DR)
    vocab = split == "all" and E > 1
    if first and vocab:  # ids to their vocab-range owners, BF16 embedding rows back
        comm += 2 * lat + r * q * (E - 1) / E * H * 2 / link
    if last:
        V = c["vocab_size"]
        fixed_b += (2 * V * H / E if vocab else 2 * V * H) + 2 * H
        fixed_f += 4 * r * q * V * H
        if vocab:  # FP32 final rows to every rank, FP32 logit slices to the rows' owners
            comm += 2 * lat + r * q * (E - 1) * 4 * (H + V / E) / link
    t = (acc.part(fixed_b, fixed_f, bw, rate) + acc.part(ffn_b, ffn_f, bw, rate) + acc.part(exp_b, exp_f, bw, rate)
         + acc.part(kv_b, kv_f, bw, rate))
    if not last and box["gpus"] > E:  # the hand-over to the next stage
        comm += lat + r * q * (3 * H + 2 * K if tc > 0 else H) * 4 / link
    return dict(t=t + comm, hbm=acc.hbm, fl=acc.fl, comm=comm, acc=acc)


SPLITS = ("none", "ffn", "all")  # eg_dense_split: replicated, "+ffn", "+split"


def split_runnable(split):
    """eg_layout_split_runnable for the GPU box (backend NULL): +ffn and the vocab split (+split)
    are built on CPU ranks (local exchange) and CUDA ranks (nccl, cuda-local)."""
    return {"none": True, "ffn": True, "all": True}[split]


def layout_runnable(P, E, split):
    """eg_layout_runnable for the GPU box: every stages x group layout runs as modelled, as stage
    groups (rank r's stage k on GPU k*E + r, P x E GPUs); only the split decides."""
    del P, E
    return split_runnable(split)


def bound_of(hbm, fl, comm):
    return "link" if comm >= hbm and comm >= fl else ("compute" if fl > hbm else "hbm")


def layout_model(c, box, kind, P, E, split, mean_len, chunk=8192, wm=0.01, held_len=None, draft=0, accept=1.0):
    """One layout's row (eg_layout_model). Prefill is capture mode, which runs without a drafter: with
    draft > 0 its figures are the plain row's (the drafter's memory would move the stage split)."""
    row = layout_model_one(c, box, kind, P, E, split, mean_len, chunk, wm, held_len, draft, accept)
    if draft:
        plain = layout_model_one(c, box, kind, P, E, split, mean_len, chunk, wm, held_len, 0, 1.0)
        row["prefill_tok_s"], row["prefill_bound"] = plain["prefill_tok_s"], plain["prefill_bound"]
    return row


def layout_model_one(c, box, kind, P, E, split, mean_len, chunk=8192, wm=0.01, held_len=None, draft=0, accept=1.0):
    held = held_len or mean_len
    acc, q = (accept if draft else 1.0), draft + 1.0
    dw, dkv = drafter_bytes(c) if draft else (0.0, 0.0)
    L, G = c["num_hidden_layers"], box["gpus"]
    usable = box["mem_gb"] * 1e9 * box["frac"] - box["act_gb"] * 1e9
    C, DR, H, V = c["kv_lora_rank"], c["qk_rope_head_dim"], c["hidden_size"], c["vocab_size"]
    kvb = 2.0 * (C + DR)
    emb_b = 2 * V * H
    tail_b = 2 * H + (0 if c["tie_word_embeddings"] else emb_b)
    lp = [parts_of(c, l) for l in range(L)]
    K, NE, NH = c["num_experts_per_tok"], c["n_routed_experts"], c["num_attention_heads"]
    row = dict(stages=P, ep=E, dense_split=split, draft_ms=0.0)
    if kind == "tp":
        row["layout"] = f"tp{G}"
        total = emb_b + tail_b
        fixed_b = fixed_p = exp_b = exp_p = 0.0
        for p in lp:
            total += p["attn_b"] + p["router_b"] + p["mlp_b"] + NE * p["expert_b"]
            fixed_b += p["attn_b"] + p["router_b"] + p["mlp_b"]
            fixed_p += p["attn_p"] + p["router_p"] + p["mlp_p"]
            if p["moe"]:
                exp_b += p["expert_b"]
                exp_p += p["expert_p"]
        fixed_b += emb_b + 2 * H
        fixed_p += V * H
        row["weights_gb"] = total / G / 1e9
        free = usable - (total + dw) / G
        tok = math.floor(free / (L * kvb + dkv / G)) if free > 0 else 0
        row["kv_tokens"] = int(tok)
        S = cap_seqs(tok * (1 - wm) / held, 1)
        row["concurrency"], row["fits"], row["runnable"] = S, S >= 1, False
        bw, rate = box["hbm_tbs"] * 1e12 * box["eff"], box["tflops"] * 1e12 * box["eff"]
        lat, link = box["link_us"] * 1e-6, box["link_gbs"] * 1e9
        for pf in (0, 1):
            T = chunk if pf else S
            Q = 1.0 if pf else q
            a = Acc()
            t = a.part(fixed_b / G, 4 * T * Q * fixed_p / G, bw, rate)
            t += a.part(hit(NE, K, T * Q) * exp_b / G, 4 * T * Q * K * exp_p / G, bw, rate)
            if pf:
                t += a.part(T * L * kvb, 4 * T * L * NH * (c["qk_nope_head_dim"] + DR + c["v_head_dim"])
                            * (mean_len + 1) / 2 / G, bw, rate)
            else:
                t += a.part(T * mean_len * L * kvb, T * Q * mean_len * L * 4 * NH * (2 * C + DR) / G, bw, rate)
            comm = 2 * L * (lat + 2.0 * (G - 1) / G * T * Q * H * 2 / link)
            t += comm
            if not pf and draft:
                dt = draft * a.part(dw / G + T * mean_len * dkv / G, 4 * T * dw / 2 / G, bw, rate)
                row["draft_ms"] = dt * 1e3
                t += dt
            if pf:
                row["prefill_tok_s"] = T / t if row["fits"] else 0.0
                row["prefill_bound"] = bound_of(a.hbm, a.fl, comm)
            else:
                row["decode_tok_s"] = S * acc / t if row["fits"] else 0.0
                row["decode_step_ms"], row["comm_ms"] = t * 1e3, comm * 1e3
                row["decode_bound"] = bound_of(a.hbm, a.fl, comm)
        row["comm_bytes_token_layer"] = 0.0
        return row
    suffix = {"none": "", "ffn": "+ffn", "all": "+split"}[split]
    row["layout"] = f"pp{P}" if E == 1 else (f"ep{E}" if P == 1 else f"pp{P}xep{E}") + suffix
    own = split != "none"
    fshare = 1 / E if own else 1.0
    vshare = 1 / E if split == "all" else 1.0
    head_w = emb_b * vshare
    tail_w = 2 * H + (0 if c["tie_word_embeddings"] and P <= 1 else emb_b * vshare)  # a tied head: one copy per stage holding it
    cost = [p["attn_b"] + p["router_b"] + p["mlp_b"] * fshare + NE * p["expert_b"] / E for p in lp]
    ends = split_layers(cost, head_w, tail_w + dw, P)  # a drafter beside lm_head counts in the last stage's share
    min_tok, wmax, free_sum, per_sum = pool_of(c, lp, ends, None, P, E, own, usable, head_w, tail_w, dw, kvb, dkv)
    cuts = [0] * P
    if P > 1 and not WHOLE_LAYERS and not BALANCE_MEMORY:  # stages may end inside a layer where that holds
        x, sends, scuts, sw = split_tokens(c, lp, P, E, own, usable, head_w, tail_w, dw, kvb, dkv)  # more: its
        if float(x) > min_tok:  # stages, memory and times
            min_tok, ends, cuts, wmax = float(x), sends, scuts, sw
    if BALANCE_MEMORY and P > 1:  # every stage's free memory holding cache: a what-if (docstring)
        min_tok = math.floor(free_sum / per_sum) if free_sum > 0 else 0
    row["weights_gb"] = wmax / 1e9
    row["kv_tokens"] = int(E * min_tok)
    S = cap_seqs(row["kv_tokens"] * (1 - wm) / held, E)
    row["concurrency"], row["fits"] = S, S >= 1
    row["runnable"] = (layout_runnable(P, E, split) and not (BALANCE_MEMORY and P > 1)
                       and not (FFN_ROWS and split != "none" and E > 1))
    row["comm_bytes_token_layer"] = (H * 4 * ((E - 1) * (1 - (1 - 1.0 / E) ** K) + K * (E - 1.0) / E
                                              + (2 * (E - 1.0) / E if own else 0)) if E > 1 else 0.0)
    for pf in (0, 1):
        b = chunk * E if pf else S / P
        worst, b0 = None, 0
        for s in range(P):
            t = stage_step(c, box, lp, b0, ends[s], cuts[s - 1] if s else 0, cuts[s] if s < P - 1 else 0, s == 0,
                           s == P - 1, E, split, b, pf, mean_len, 1.0 if pf else q)
            if not pf and draft and s == P - 1:
                bw, rate = box["hbm_tbs"] * 1e12 * box["eff"], box["tflops"] * 1e12 * box["eff"]
                r = b / E
                dt = draft * t["acc"].part(dw + r * mean_len * dkv, 4 * r * dw / 2, bw, rate)
                row["draft_ms"] = dt * 1e3
                t = dict(t, t=t["t"] + dt, hbm=t["acc"].hbm, fl=t["acc"].fl)
            if worst is None or t["t"] > worst["t"]:
                worst = t
            b0 = ends[s]
        if pf:
            row["prefill_tok_s"] = b / worst["t"] if row["fits"] else 0.0
            row["prefill_bound"] = bound_of(worst["hbm"], worst["fl"], worst["comm"])
        else:
            row["decode_tok_s"] = S * acc / (P * worst["t"]) if row["fits"] else 0.0
            row["decode_step_ms"], row["comm_ms"] = worst["t"] * 1e3, worst["comm"] * 1e3
            row["decode_bound"] = bound_of(worst["hbm"], worst["fl"], worst["comm"])
    return row


def enumerate_layouts(c, box, mean_len, chunk=8192, held_len=None, draft=0, accept=1.0):
    rows, G = [], box["gpus"]
    for P in range(G, 0, -1):
        if G % P or P > c["num_hidden_layers"]:
            continue
        E = G // P
        if c["n_routed_experts"] % E or (E > 1 and c["n_routed_experts"] < 1):
            continue
        for split in (SPLITS if E > 1 else SPLITS[:1]):
            rows.append(layout_model(c, box, "pp_ep", P, E, split, mean_len, chunk, held_len=held_len, draft=draft,
                                     accept=accept))
    if G > 1:
        rows.append(layout_model(c, box, "tp", 1, 1, "none", mean_len, chunk, held_len=held_len, draft=draft,
                                 accept=accept))
    return rows


def recommend(rows, key):
    ok = [r for r in rows if r["runnable"] and r["fits"]]
    return max(ok, key=lambda r: r[key])["layout"] if ok else None


def arg(a, name, conv, default):
    return conv(a[a.index(name) + 1]) if name in a else default


def main():
    a = sys.argv[1:]
    if "-h" in a or "--help" in a:
        print(__doc__)
        return
    c = load_config(arg(a, "--config", str, None)) if "--config" in a else dict(KIMI_K25)
    mean_len = arg(a, "--mean-len", float, 4096.0)
    held = arg(a, "--held-len", float, None)
    chunk = arg(a, "--prefill-chunk", int, 8192)
    draft = arg(a, "--draft-tokens", int, 0)
    accept = arg(a, "--accept", float, 1.0 if not draft else None)
    global DRAFT_CACHE_BYTES, DRAFT_WEIGHT_BYTES, BALANCE_MEMORY, WHOLE_LAYERS, FFN_ROWS, MAX_SEQS, MAX_SEQS_PER_RANK
    MAX_SEQS = arg(a, "--batch", int, 0)
    MAX_SEQS_PER_RANK = arg(a, "--batch-per-rank", int, 0)
    BALANCE_MEMORY = "--balance-memory" in a
    FFN_ROWS = "--ffn-rows" in a
    WHOLE_LAYERS = "--whole-layers" in a
    DRAFT_CACHE_BYTES = arg(a, "--draft-cache-bytes", float, None)
    DRAFT_WEIGHT_BYTES = arg(a, "--draft-weight-bytes", float, None)
    for v in (DRAFT_CACHE_BYTES, DRAFT_WEIGHT_BYTES):
        if v is not None and (not draft or v <= 0):
            sys.exit("perf_model.py: --draft-cache-bytes / --draft-weight-bytes N > 0 describe the drafter of "
                     "--draft-tokens K --accept A")
    if draft and (accept is None or not 1 <= accept <= draft + 1):
        sys.exit("perf_model.py: --draft-tokens K needs --accept A with 1 <= A <= K + 1")
    names = [arg(a, "--box", str, None)] if "--box" in a else list(BOXES)
    out = []
    for name in names:
        if name not in BOXES:
            sys.exit(f"perf_model.py: box '{name}': expected one of {', '.join(BOXES)}")
        box = dict(BOXES[name], name=name)
        box["link_gbs"], box["link_us"] = LINKS[box["link"]]
        box["eff"] = arg(a, "--eff", float, box["eff"])
        box["mem_gb"] = arg(a, "--gpu-mem-gb", float, box["mem_gb"])
        box["link_gbs"] = arg(a, "--link-gbs", float, box["link_gbs"])
        box["link_us"] = arg(a, "--link-us", float, box["link_us"])
        rows = enumerate_layouts(c, box, mean_len, chunk, held, draft, accept)
        out.append(dict(box=box, mean_len=mean_len, draft_tokens=draft, accept=accept if draft else 1.0, layouts=rows, recommended_decode=recommend(rows, "decode_tok_s"),
                        recommended_prefill=recommend(rows, "prefill_tok_s")))
    if "--json" in a:
        print(json.dumps(out[0] if len(out) == 1 else out, indent=1))
        return
    for o in out:
        b = o["box"]
        print(f"{b['name']}: {b['gpus']} x {b['mem_gb']:.0f} GB, {b['hbm_tbs']} TB/s, {b['tflops']:.0f} TFLOP/s, "
              f"eff {b['eff']:.2f}, {b['link']} {b['link_gbs']:.0f} GB/s + {b['link_us']:.0f} us, "
              f"mean length {mean_len:.0f}")
        print(f"  {'layout':13s} {'weights GB':>10s} {'KV tokens':>10s} {'seqs':>6s} {'decode t/s':>10s} "
              f"{'bound':8s} {'prefill t/s':>11s} {'bound':8s}")
        for r in o["layouts"]:
            note = "" if r["runnable"] else "  (modelled only)"
            print(f"  {r['layout']:13s} {r['weights_gb']:10.1f} {r['kv_tokens']:10d} {r['concurrency']:6.0f} "
                  f"{r['decode_tok_s']:10.0f} {r['decode_bound']:8s} {r['prefill_tok_s']:11.0f} "
                  f"{r['prefill_bound']:8s}{note}")
        print(f"  recommended: decode {o['recommended_decode']}, prefill {o['recommended_prefill']}")


if __name__ == "__main__":
    main()
