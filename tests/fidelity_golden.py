#!/usr/bin/env python3
"""The fixtures' golden pair as a fidelity measurement (numpy only), for t_fidelity.sh.

usage: fidelity_golden.py prompts GOLDEN GOLDEN_BF16KV OUT.json
       fidelity_golden.py check   GOLDEN GOLDEN_BF16KV FIDELITY.json

golden-X (float64, exact latent cache) and golden-X-bf16kv (the same with the cache
rounded to BF16) differ exactly by the cache rounding, so their per-layer, per-token
relative error ||b - a|| / ||a|| is what `eaglegen fidelity` measures as kv=bf16 against
kv=fp32. Each golden's tokens end in its own greedy continuation; only the common prefix
(up to the first differing token) is comparable, so `prompts` writes those prefixes.
`check` requires, for kv=bf16: worst and median over tokens within 2x of the goldens' at
every layer, and top-1 disagreements (reference margin > 1e-2) within 2x (+1); for
kv=fp8 and kv=fp8-token: a larger median error than kv=bf16 at every layer, a larger
mean KL and no better top-1 agreement; and the JSON object's exact schema.
"""
import json
import struct
import sys

import numpy as np

DT = {"F32": np.float32, "F64": np.float64, "I32": np.int32}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    hdr.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], DT[v["dtype"]]).reshape(v["shape"])
            for k, v in hdr.items()}


def prefixes(a, b):
    out = []
    i = 0
    while f"p{i}.tokens" in a:
        ta, tb = a[f"p{i}.tokens"], b[f"p{i}.tokens"]
        n = min(len(ta), len(tb))
        d = np.nonzero(ta[:n] != tb[:n])[0]
        out.append(int(d[0]) if len(d) else n)
        i += 1
    return out


def check_schema(fid, n_prompts, n_layers):
    assert set(fid) == {"reference", "settings"}, f"top-level keys {sorted(fid)}"
    assert fid["reference"] == "kv=fp32"
    for s in fid["settings"]:
        assert set(s) == {"name", "layers", "top1_agree", "kl_mean", "divergence_steps"}, f"setting keys {sorted(s)}"
        assert [e["layer"] for e in s["layers"]] == list(range(n_layers))
        for e in s["layers"]:
            assert set(e) == {"layer", "rel_worst", "rel_median"}
        assert len(s["divergence_steps"]) == n_prompts
        assert all(d is None or (isinstance(d, int) and d >= 0) for d in s["divergence_steps"])
        assert 0 <= s["top1_agree"] <= 1 and s["kl_mean"] >= 0


def main():
    mode, ga, gb, path = sys.argv[1:5]
    a, b = load(ga), load(gb)
    pre = prefixes(a, b)
    if mode == "prompts":
        json.dump({"prompts": [a[f"p{i}.tokens"][:p].tolist() for i, p in enumerate(pre)]}, open(path, "w"))
        return 0
    fid = json.load(open(path))
    L = a["p0.hidden"].shape[0] - 1
    check_schema(fid, len(pre), L)
    rel = [[] for _ in range(L)]
    counted = disagree = 0
    for i, p in enumerate(pre):
        ha = a[f"p{i}.hidden"][:, :p].astype(np.float64)
        hb = b[f"p{i}.hidden"][:, :p].astype(np.float64)
        for l in range(L):
            rel[l] += (np.linalg.norm(hb[l + 1] - ha[l + 1], axis=1) / np.linalg.norm(ha[l + 1], axis=1)).tolist()
        la, lb = a[f"p{i}.logits"][:p], b[f"p{i}.logits"][:p]
        s = np.sort(la, axis=1)
        sel = s[:, -1] - s[:, -2] > 1e-2
        counted += int(sel.sum())
        disagree += int((la.argmax(1) != lb.argmax(1))[sel].sum())
    sets = {s["name"]: s for s in fid["settings"]}
    bf = sets["kv=bf16"]
    bad = 0
    print(f"{'layer':>5}  {'goldens worst':>13} {'median':>9}   {'fidelity worst':>14} {'median':>9}")
    for l in range(L):
        g = np.array(rel[l])
        gw, gm = float(g.max()), float(np.median(g))
        e = bf["layers"][l]
        ok = 0.5 <= e["rel_worst"] / gw <= 2 and 0.5 <= e["rel_median"] / gm <= 2
        bad += not ok
        print(f"{l:>5}  {gw:13.3e} {gm:9.3e}   {e['rel_worst']:14.3e} {e['rel_median']:9.3e}  {'ok' if ok else 'BAD'}")
    ours = round((1 - bf["top1_agree"]) * counted)
    ok = 0.5 <= (ours + 1) / (disagree + 1) <= 2
    bad += not ok
    print(f"top-1 disagreements (margin > 1e-2, {counted} positions): goldens {disagree}, fidelity ~{ours}"
          f"  {'ok' if ok else 'BAD'}")
    for name in ("kv=fp8", "kv=fp8-token"):
        s = sets[name]
        worse = all(s["layers"][l]["rel_median"] > bf["layers"][l]["rel_median"] for l in range(L))
        worse = worse and s["kl_mean"] > bf["kl_mean"] and s["top1_agree"] <= bf["top1_agree"]
        bad += not worse
        print(f"{name}: median {s['layers'][0]['rel_median']:.2e}..{s['layers'][-1]['rel_median']:.2e}, "
              f"KL {s['kl_mean']:.2e}, top-1 {100 * s['top1_agree']:.1f}% vs kv=bf16 "
              f"{bf['layers'][0]['rel_median']:.2e}..{bf['layers'][-1]['rel_median']:.2e}, KL {bf['kl_mean']:.2e}, "
              f"{100 * bf['top1_agree']:.1f}%  {'worse: ok' if worse else 'NOT WORSE: BAD'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
