#!/usr/bin/env bash
# `inspect SHARD.tar` on one shard prints that shard's own numbers (samples, tokens,
# loss tokens, bytes, uncompressed bytes), with the description (aux layers, zstd level,
# model) from the manifest beside it when one lists it; `inspect --sample` decodes text
# with the tokenizer the manifest records, and says clearly when it was moved.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 4 >/dev/null 2>&1
for i in $(seq 0 9); do echo "{\"id\": \"s$i\", \"prompt\": \"hello number $i\"}"; done > c.jsonl
$E generate --model model --prompts c.jsonl --max-new-tokens 6 --max-seq-len 64 --shard-samples 4 \
    --aux-layers 1,3 --threads 1 --out d 2>/dev/null
$E inspect d/shard-000001.tar > one.txt
$E inspect d --json > all.json
cp d/shard-000001.tar lone.tar
$E inspect lone.tar > lone.txt
$E inspect d/shard-000001.tar --json > one.json
$E inspect lone.tar --json > lone.json
"$PYTHON" - <<'PY'
import json, re
m = json.load(open("d/manifest.json"))
s = [x for x in m["shards"] if x["file"] == "shard-000001.tar"][0]
for name in ("one.txt", "lone.txt"):
    t = open(name).read()
    want = f"samples {s['samples']}, tokens {s['tokens']}, loss-masked tokens {s['loss_tokens']}"
    assert want in t, (name, want, t)
    want = f"bytes on disk {s['bytes']}, uncompressed tensors {s['raw_bytes']}, ratio x{s['raw_bytes'] / s['bytes']:.3f}"
    assert want in t, (name, want, t)
    assert f"finish: stop {s['finish_stop']}, length {s['finish_length']}" in t, (name, t)
one, lone = open("one.txt").read(), open("lone.txt").read()
assert "aux layers (output of decoder layer k, 0-based): 1 3\n" in one and "zstd level 3" in one, one
assert "aux[0] L1" in one and "aux[1] L3" in one, one
assert "L-1" not in lone and "2 of them" in lone and "zstd level 0" not in lone, lone
j1, jl = json.load(open("one.json")), json.load(open("lone.json"))
for j in (j1, jl):
    assert (j["samples"], j["tokens"], j["loss_tokens"], j["bytes"], j["raw_bytes"]) == \
        (s["samples"], s["tokens"], s["loss_tokens"], s["bytes"], s["raw_bytes"]), j
assert j1["aux_layers"] == [1, 3] and j1["described_by"] == "d/manifest.json" and j1["model"]["name"] == "model", j1
assert jl["aux_layers"] is None and jl["n_aux"] == 2 and "model" not in jl, jl
print("ok: single-shard numbers")
PY
echo "-- --sample finds the tokenizer the manifest records"
$E inspect d --sample s3 > s.txt
grep -q "hello number 3" s.txt || { echo "--sample did not decode the text:"; cat s.txt; exit 1; }
for w in 0 1; do
    $E generate --model model --prompts c.jsonl --max-new-tokens 6 --max-seq-len 64 --aux-layers 1,3 --threads 1 \
        --worker $w/2 --out w 2>/dev/null
done
$E merge w --out w 2>/dev/null
$E inspect w --sample s3 | grep -q "hello number 3" || { echo "merged: --sample did not decode"; exit 1; }
mv model model.moved
set +e; $E inspect d --sample s3 > s2.txt 2> e.txt; rc=$?; set -e
[ $rc -eq 1 ] || { echo "moved tokenizer: rc $rc"; exit 1; }
grep -q "is not there" e.txt && grep -q -- "--tokenizer DIR" e.txt && grep -q "$tmp/model" e.txt || { cat e.txt; exit 1; }
$E inspect d --sample s3 --tokenizer model.moved | grep -q "hello number 3"
echo "t_gen_inspect_shard: ok"
