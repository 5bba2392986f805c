#!/usr/bin/env python3
"""Checks for tests/t_gen_*.sh, on datasets written by `eaglegen generate` (numpy only).

  gen_check.py same DIR_A DIR_B            the two datasets hold the same ids, each sample
                                           bit-identical (tokens, mask, hidden states, metadata
                                           minus nothing)
  gen_check.py prompts DIR TOKENIZED.jsonl stored input_ids start with the tokenized prompt of
                                           the same record; loss mask covers exactly the response;
                                           finish reasons agree with the tokens
  gen_check.py forward DIR IDS.json OUT.st compare stored hidden states with `eaglegen forward`
                                           output (IDS.json lists the sample ids in order)
  gen_check.py forward-exact DIR IDS.json OUT.st
                                           the same, bit for bit (the CPU backend)
  gen_check.py export-prompts DIR N IDS.json PROMPTS.json
                                           write the first N samples' tokens for `forward`
  gen_check.py count DIR EXPECTED          exactly EXPECTED samples, ids unique
  gen_check.py capture DIR CONFIG          capture mode: mask = assistant spans (tokenizer config)
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dataset", "python"))
from eaglegen_data import EagleGenDataset, float32_to_bf16, bf16_to_float32  # noqa: E402


def load(d):
    return EagleGenDataset(d, as_torch=False)


def ids_of(ds):
    return {ds.metadata(i)["id"]: i for i in range(len(ds))}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def cmd_same(a, b):
    da, db = load(a), load(b)
    ia, ib = ids_of(da), ids_of(db)
    if set(ia) != set(ib):
        fail(f"id sets differ: only in {a}: {sorted(set(ia) - set(ib))[:5]}, only in {b}: {sorted(set(ib) - set(ia))[:5]}")
    for sid in ia:
        x, y = da[ia[sid]], db[ib[sid]]
        for k in ("input_ids", "loss_mask", "hidden_states", "target_hidden_states"):
            if x[k].shape != y[k].shape or not np.array_equal(x[k], y[k]):
                fail(f"sample {sid}: {k} differs")
        mx, my = da.metadata(ia[sid]), db.metadata(ib[sid])
        for k in ("prompt_len", "gen_len", "finish", "seed", "source_line"):
            if mx.get(k) != my.get(k):
                fail(f"sample {sid}: metadata {k} {mx.get(k)} != {my.get(k)}")
    print(f"ok: {len(ia)} samples identical")


def cmd_prompts(d, tokenized):
    ds = load(d)
    ids = ids_of(ds)
    want = [json.loads(l) for l in open(tokenized)]
    cfg = json.load(open(os.path.join(os.path.dirname(tokenized), "stop.json")))
    stops = set(cfg["stop"])
    checked = 0
    for rec in want:
        sid = rec["id"]
        if sid not in ids:
            fail(f"record {sid} has no sample")
        s = ds[ids[sid]]
        m = ds.metadata(ids[sid])
        p = rec["ids"]
        t = s["input_ids"].tolist()
        if t[:len(p)] != p:
            fail(f"{sid}: stored prompt differs from the tokenized prompt")
        if m["prompt_len"] != len(p) or m["gen_len"] != len(t) - len(p):
            fail(f"{sid}: prompt_len/gen_len {m['prompt_len']}/{m['gen_len']} vs {len(p)}/{len(t) - len(p)}")
        mask = s["loss_mask"].tolist()
        if mask != [0] * len(p) + [1] * (len(t) - len(p)):
            fail(f"{sid}: loss mask does not cover exactly the response")
        if m["finish"] == "stop" and t[-1] not in stops:
            fail(f"{sid}: finish stop but last token {t[-1]} is not a stop id")
        if m["finish"] == "length" and (m["gen_len"] != cfg["max_new"] or any(x in stops for x in t[len(p):])):
            fail(f"{sid}: finish length but gen_len {m['gen_len']} / a stop id inside")
        if s["hidden_states"].shape[0] != len(t) or s["target_hidden_states"].shape[0] != len(t):
            fail(f"{sid}: hidden states do not cover every position")
        checked += 1
    print(f"ok: {checked} samples: prompt tokens, loss mask, finish reasons")


def st_load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    hdr.pop("__metadata__", None)
    out = {}
    for k, v in hdr.items():
        a, b = v["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32}[v["dtype"]]
        out[k] = np.frombuffer(data[a:b], dtype=dt).reshape(v["shape"])
    return out


def cmd_export_prompts(d, n, ids_path, prompts_path):
    ds = load(d)
    n = min(int(n), len(ds))
    json.dump([ds.metadata(i)["id"] for i in range(n)], open(ids_path, "w"))
    json.dump({"prompts": [ds[i]["input_ids"].tolist() for i in range(n)]}, open(prompts_path, "w"))


def cmd_forward(d, ids_path, st_path, exact=False):
    """Stored rows against `eaglegen forward`'s teacher-forced pass over the same tokens,
    BF16-rounded: within 1e-3 relative, or with exact (forward-exact) bit for bit, which
    the CPU backend gives because its ops do not depend on how rows are chunked or
    batched (sampled, speculative, preempted and recomputed samples alike)."""
    ds = load(d)
    ids = ids_of(ds)
    fw = st_load(st_path)
    aux = json.load(open(os.path.join(d, "manifest.json")))["aux_layers"]["ids"]
    worst, rows = 0.0, 0
    for i, sid in enumerate(json.load(open(ids_path))):
        s = ds[ids[sid]]
        T, H = s["target_hidden_states"].shape
        hid = fw[f"p{i}.hidden"]
        if T != hid.shape[1]:
            fail(f"{sid}: {T} tokens stored, forward saw {hid.shape[1]}")
        pre = bf16_to_float32(float32_to_bf16(hid[hid.shape[0] - 1]))  # the last layer's output
        post = bf16_to_float32(float32_to_bf16(fw[f"p{i}.normed"]))
        checks = [(f"aux layer {layer}", s["hidden_states"][:, a * H:(a + 1) * H],
                   bf16_to_float32(float32_to_bf16(hid[layer + 1]))) for a, layer in enumerate(aux)]
        checks.append(("final state", s["target_hidden_states"], pre if ds.final_source == "pre_norm" else post))
        if "pre_norm_hidden_states" in s:
            checks.append(("pre-norm final state", s["pre_norm_hidden_states"], pre))
        for what, got, want in checks:
            if exact:
                bad = np.nonzero(~np.all(got == want, axis=1))[0]
                if len(bad):
                    fail(f"{sid}: {what}: {len(bad)} of {T} rows differ from the teacher-forced pass (first: {bad[0]})")
            else:
                worst = max(worst, np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
        rows += T
    if exact:
        print(f"ok: {rows} rows bit-identical to the teacher-forced pass")
        return
    print(f"  stored vs eaglegen forward (BF16-rounded): worst relative error {worst:.3e}")
    if worst > 1e-3:
        fail("stored hidden states differ from eaglegen forward")
    print("ok")


def cmd_count(d, expected):
    ds = load(d)
    ids = [ds.metadata(i)["id"] for i in range(len(ds))]
    if len(ids) != len(set(ids)):
        fail("duplicate ids")
    if len(ids) != int(expected):
        fail(f"{len(ids)} samples, expected {expected}")
    print(f"ok: {len(ids)} unique samples")


def cmd_capture(d, tok_dir):
    cfg = json.load(open(os.path.join(tok_dir, "tokenizer_config.json")))
    sp = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
    ast, mid, end = sp["<|im_assistant|>"], sp["<|im_middle|>"], sp["<|im_end|>"]
    ds = load(d)
    for i in range(len(ds)):
        s = ds[i]
        t = s["input_ids"].tolist()
        want = [0] * len(t)
        j = 0
        while j < len(t):
            if t[j] == ast:
                k = t.index(mid, j)
                e = t.index(end, k)
                for q in range(k + 1, e + 1):
                    want[q] = 1
                j = e
            j += 1
        if s["loss_mask"].tolist() != want:
            fail(f"sample {i}: capture mask is not the assistant spans")
        if sum(want) == 0:
            fail(f"sample {i}: nothing captured")
    print(f"ok: {len(ds)} capture samples, masks are the assistant spans")


if __name__ == "__main__":
    c, args = sys.argv[1], sys.argv[2:]
    {"same": cmd_same, "prompts": cmd_prompts, "forward": cmd_forward,
     "forward-exact": lambda *a: cmd_forward(*a, exact=True), "count": cmd_count,
     "export-prompts": cmd_export_prompts, "capture": cmd_capture}[c](*args)
