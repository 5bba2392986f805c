#!/usr/bin/env bash
# make demo: install what is missing, build, make a tiny random model, generate a dataset
# from the bundled prompts, verify it and show a sample.
set -eu
cd "$(dirname "$0")/.."
bash .ci/deps.sh
make -j2 build/eaglegen
E=build/eaglegen
out=demo-out
rm -rf "$out"
mkdir -p "$out"
echo "== mkmodel: a tiny random Kimi-K2.5-layout model, 8 layers (the default aux layers 1, 3, 4 are distinct)"
$E mkmodel --preset tiny --layers 8 --out "$out/model" --seed 1
echo "== generate over prompts/samples/sample.jsonl"
# The sample's {"input_ids"} record holds ids of Kimi's real vocabulary, which the tiny
# model's 512-id vocabulary does not have: it is rejected by design and logged, showing
# the bad-record policy (without --on-bad-record=skip the run would stop there).
$E generate --model "$out/model" --prompts prompts/samples/sample.jsonl --out "$out/dataset" \
    --max-new-tokens 64 --max-seq-len 1024 --shard-samples 16 --batch 8 --on-bad-record skip
echo "== rejected records"
cat "$out/dataset/rejects.jsonl"
echo "== inspect --verify"
$E inspect "$out/dataset" --verify
echo "== one sample"
$E inspect "$out/dataset" --sample 0 --tokenizer "$out/model"
echo
echo "demo done: the dataset is in $out/dataset (rerun the generate command to see it resume)"
