#!/usr/bin/env bash
# make bench: throughput with the roofline columns (docs/PERFORMANCE.md). Weights are
# drawn by the backend (--preset), so nothing is downloaded or written. CPU always; the
# CUDA rows (issue 7's table: Kimi-K2.5's real layer shapes and moonlight-16b) only when
# a GPU answers. Numbers are printed, never asserted.
set -eu
cd "$(dirname "$0")/.."
E=${BUILD:-build}/eaglegen
echo "== the shard writer: encode rate per thread at Kimi-K2.5 width (its pool has --threads of them)"
"${BUILD:-build}/tests/test_dataset_codec" --speed
echo "== CPU: tiny"
"$E" bench --backend cpu --preset tiny --batch 1,16,64 --context 128,1024 --prefill-tokens 4096 --prompt-len 512
echo "== CPU: the EAGLE-3 drafter's attention alone (8 heads over 2 kv heads of 64)"
"$E" bench --backend cpu --preset tiny --batch 1,16 --context 1024 --prefill-tokens 0 --decode-steps 4 \
    --draft-attention 8:2:64
echo "== CPU: moonlight-16b, 2 layers, INT4 experts"
"$E" bench --backend cpu --preset moonlight-16b --layers 2 --batch 1,4 --context 128 --prefill-tokens 256 \
    --prompt-len 128 --chunk 128 --decode-steps 3 --warmup 1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    for args in "--preset kimi-k2.5 --layers 4 --experts int4" "--preset moonlight-16b --layers 4 --experts bf16"; do
        echo "== CUDA: $args"
        # shellcheck disable=SC2086
        "$E" bench --backend cuda $args --batch 1,16,64,256 --context 2048,8192 --prefill-tokens 8192 \
            --prompt-len 2048 --chunk 2048 --decode-steps 8
    done
    echo "== CUDA: the EAGLE-3 drafter's attention alone (the public Kimi drafters' 64 kv heads of 128)"
    "$E" bench --backend cuda --preset tiny --batch 16,64,256 --context 2048,4096 --prefill-tokens 0 \
        --decode-steps 10 --draft-attention 64:64:128
else
    echo "== CUDA: no GPU here (tests/gpu/run.sh runs these rows on a GPU machine)"
fi
