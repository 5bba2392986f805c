#!/usr/bin/env python3
"""Decode-throughput model of Kimi-K2.5 on an 8-GPU box: pipeline parallel (eaglegen's
design) against tensor parallel (the serving-stack layout), both with a BF16 latent cache.

A decode step reads the weights of every expert hit, the attention/dense/shared weights
and the KV cache, and does the tensor work on them. Per part (always-read weights,
experts, cache), time = max(bytes / (bandwidth * eff), FLOPs / (BF16 tensor rate * eff));
step time is their sum, plus, for tensor parallelism, two all-reduces per layer over
PCIe. FLOPs count eaglegen's precision: activations as BF16 hi + lo pairs (4 FLOPs per
weight per token), and the absorbed attention's 64 x (576 + 512) multiply-adds per cached
row, again hi + lo (~242 FLOPs per cache byte: compute-bound on both boxes at full
bandwidth). `eff` is the fraction of the copy bandwidth and tensor rate the kernels
achieve; it is an input here (issue 7's goal is >= 0.5 at large batch) until
`eaglegen bench --backend cuda` measures it.

usage: python3 docs/perf_model.py [--eff 0.6] [--mean-len 4096] [--held-len N]
--held-len: the cache tokens each sequence holds (default: --mean-len). With generate's
default on-demand KV policy a sequence holds what it has filled, so the mean length;
with --kv-policy reserve it holds prompt + --max-new-tokens whatever it generates, so
fewer sequences fit while each still reads only its own length of cache per step.
Capacities come from `eaglegen plan --preset kimi-k2.5 --stages 8` (same arithmetic).
"""
import math
import sys

H, L, E, K, F, NH, QL, C, DR, DN, DV, V, INTER = 7168, 61, 384, 8, 2048, 64, 1536, 512, 64, 128, 128, 163840, 18432
EXPERT = 3 * H * F * (0.5 + 2 / 32)                 # one INT4 expert, with BF16 group-32 scales
ATTN = 2 * (QL * H + NH * (DN + DR) * QL + (C + DR) * H + NH * (DN + DV) * C + H * NH * DV)
SHARED = 2 * 3 * H * F
ROUTER = 2 * E * H
DENSE = 2 * 3 * H * INTER
EMB = 2 * V * H
KV_TOK_LAYER = 2 * (C + DR)                          # BF16 latent + rope key
ATTN_FLOP_PER_KV_BYTE = NH * (C + DR + C) * 2 * 2 / KV_TOK_LAYER  # scores + values, hi + lo


def hit(tokens):
    """Expected distinct experts per layer hit by `tokens` tokens routed top-K of E."""
    return E * (1 - (1 - 1 / E) ** (K * tokens))


def moe_layer_bytes(tokens):
    return ATTN + SHARED + ROUTER + hit(tokens) * EXPERT


def part_time(nbytes, flops, bw, tc):
    return max(nbytes / bw, flops / tc)


def moe_layers_time(layers, tokens, kv_bytes, bw, tc, heads_share=1.0):
    """`layers` MoE layers for `tokens` tokens: always-read weights, experts, cache.
    heads_share: the fraction of the attention heads computed here (tensor parallel: 1/gpus)."""
    fixed = ATTN + SHARED + ROUTER
    t = part_time(layers * fixed, layers * 4 * tokens * fixed / 2, bw, tc)
    t += part_time(layers * hit(tokens) * EXPERT, layers * 4 * tokens * K * 3 * H * F, bw, tc)
    t += part_time(kv_bytes, kv_bytes * ATTN_FLOP_PER_KV_BYTE * heads_share, bw, tc)
    return t


def model(name, gpus, mem_gb, bw_tbs, tc_tflops, eff, mean_len, act_gb=3.0, frac=0.92, pcie_gbs=25.0,
          ar_lat_us=30.0, held_len=None):
    held_len = held_len or mean_len
    total = EMB * 2 + DENSE + ATTN + (L - 1) * (ATTN + SHARED + ROUTER + E * EXPERT)
    usable = mem_gb * 1e9 * frac - act_gb * 1e9
    bw = bw_tbs * 1e12 * eff
    tc = tc_tflops * 1e12 * eff
    # pipeline: the heaviest stage holds ceil(L/gpus) MoE layers and bounds the capacity
    per_stage_layers = math.ceil(L / gpus)
    stage_w = per_stage_layers * (ATTN + SHARED + ROUTER + E * EXPERT)
    pp_tokens = (usable - stage_w) / (per_stage_layers * KV_TOK_LAYER)
    pp_seqs = pp_tokens / held_len
    M = gpus                                          # micro-batches in flight
    b = pp_seqs / M
    stage_kv = b * mean_len * per_stage_layers * KV_TOK_LAYER
    stage_bytes = per_stage_layers * moe_layer_bytes(b) + stage_kv
    t_step = moe_layers_time(per_stage_layers, b, stage_kv, bw, tc)
    pp_tps = pp_seqs / (M * t_step)
    # tensor parallel: weights sharded 1/gpus, the whole latent cache on every GPU
    tp_tokens = (usable - total / gpus) / (L * KV_TOK_LAYER)
    tp_seqs = tp_tokens / held_len
    tp_kv = tp_seqs * mean_len * L * KV_TOK_LAYER
    tp_bytes = (L - 1) * moe_layer_bytes(tp_seqs) / gpus + tp_kv
    ar = 2 * L * (ar_lat_us * 1e-6 + 2 * (gpus - 1) / gpus * tp_seqs * H * 2 / (pcie_gbs * 1e9))
    # each GPU holds 1/gpus of every weight and computes 1/gpus of the heads over the whole cache
    tp_step = moe_layers_time((L - 1) / gpus, tp_seqs, tp_kv, bw, tc, heads_share=1 / gpus) + ar
    tp_tps = tp_seqs / tp_step
    print(f"{name}: {gpus} GPUs x {mem_gb:.0f} GB, {bw_tbs} TB/s, {tc_tflops:.0f} TFLOP/s BF16, kernel efficiency "
          f"{eff:.2f}, mean length {mean_len}, held per sequence {held_len}")
    print(f"  weights {total / 1e9:.1f} GB; KV per token all layers {L * KV_TOK_LAYER / 1e3:.1f} KB")
    print(f"  pipeline : {pp_tokens / 1e3:8.0f}K token slots, {pp_seqs:6.0f} sequences, micro-batch {b:5.1f}, "
          f"stage step {t_step * 1e3:6.1f} ms ({stage_bytes / 1e9:5.1f} GB), {pp_tps:6.0f} tok/s")
    print(f"  tensor-p.: {tp_tokens / 1e3:8.0f}K token slots, {tp_seqs:6.0f} sequences, "
          f"step {tp_step * 1e3:6.1f} ms ({tp_bytes / 1e9:5.1f} GB/GPU + {ar * 1e3:.1f} ms all-reduce), {tp_tps:6.0f} tok/s")
    print(f"  ratio pipeline / tensor-parallel: capacity {pp_tokens / tp_tokens:.1f}x, throughput {pp_tps / tp_tps:.2f}x")


def main():
    eff, mean_len, held = 0.6, 4096, None
    a = sys.argv[1:]
    if "--eff" in a: eff = float(a[a.index("--eff") + 1])
    if "--mean-len" in a: mean_len = int(a[a.index("--mean-len") + 1])
    if "--held-len" in a: held = int(a[a.index("--held-len") + 1])
    model("8x RTX PRO 6000 Blackwell", 8, 96, 1.8, 500, eff, mean_len, held_len=held)
    model("8x H200", 8, 141, 4.8, 990, eff, mean_len, act_gb=4.0, held_len=held)


if __name__ == "__main__":
    main()
