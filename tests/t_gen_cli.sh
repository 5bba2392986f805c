#!/usr/bin/env bash
# The CLI surface: every --help is there and exits 0, usage errors exit 2, runtime errors
# exit 1 with a message; --backend cuda without a GPU says so; forward split into
# pipeline stages writes the same bytes as unsplit; plan prints a split.
set -eu
: "${EAGLEGEN:?}" "${FIXTURES:?}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
expect() { # expected-status command...
    local want=$1; shift
    set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
    if [ $rc -ne "$want" ]; then echo "expected exit $want, got $rc: $*"; cat "$tmp/err"; exit 1; fi
}
expect 0 $E --help
for c in generate merge inspect vocab tokenize forward mkmodel bench plan; do
    expect 0 $E $c --help
    grep -q "usage: eaglegen $c" "$tmp/out" || { echo "$c --help has no usage line"; exit 1; }
done
# every generate flag is documented with its default
for f in --model --prompts --out --tokenizer --backend --mode --max-new-tokens --max-seq-len --temperature \
         --top-p --top-k --seed --thinking --aux-layers --final-hidden --drop-truncated --limit \
         --on-bad-record --batch --chunk --shard-samples --threads --worker --log-json --stages --micro-batches --gpus --transport --gpu-mem-fraction; do
    $E generate --help | grep -q -- "$f" || { echo "generate --help lacks $f"; exit 1; }
done
expect 2 $E nosuchcommand
expect 2 $E generate --model m
expect 2 $E generate --model m --prompts p --out o --temperature hot
expect 2 $E generate --model m --prompts p --out o --worker 3/2
expect 2 $E generate --model m --prompts p --out o --transport pigeon
grep -q "local, nccl or auto" "$tmp/err"
expect 2 $E generate --model m --prompts p --out o --micro-batches 4
grep -q "add --stages" "$tmp/err"
expect 2 $E forward --model m --prompts p --out o --backend tpu
expect 2 $E mkmodel --preset tiny --out o --seed -1
expect 2 $E mkmodel --preset tiny --out o --bogus
grep -q "unknown option '--bogus'" "$tmp/err"
expect 2 $E forward --model m
expect 2 $E plan --preset kimi-k2.5 --stages 0
expect 1 $E forward --model "$tmp/none" --prompts "$FIXTURES/models/prompts-a.json" --out "$tmp/x.st"
grep -q "config.json" "$tmp/err"
printf '{"prompts": [[1, 2, 99999]]}' > "$tmp/badp.json"
expect 1 $E forward --model "$FIXTURES/models/tiny-a" --prompts "$tmp/badp.json" --out "$tmp/x.st"
grep -q "prompt 0, token 2" "$tmp/err"

echo "-- --backend cuda on this machine"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    echo "  (a GPU is present: skipped; tests/gpu/run.sh covers it)"
else
    expect 1 $E forward --model "$FIXTURES/models/tiny-a" --prompts "$FIXTURES/models/prompts-a.json" \
        --out "$tmp/x.st" --backend cuda
    grep -qi "cuda" "$tmp/err" || { cat "$tmp/err"; exit 1; }
    echo "  refused: $(tail -1 "$tmp/err")"
    if ! grep -q "built without CUDA" "$tmp/err"; then
        # a misspelt switch is named before anything else (no GPU needed to see it)
        EG_CUDA_MLA=tc64 expect 1 $E forward --model "$FIXTURES/models/tiny-a" \
            --prompts "$FIXTURES/models/prompts-a.json" --out "$tmp/x.st" --backend cuda
        grep -q "EG_CUDA_MLA=tc64: expected one of auto, tc16, tc32, simt" "$tmp/err" || { cat "$tmp/err"; exit 1; }
        EG_CUDA_SAMPLE_M=4k expect 1 $E forward --model "$FIXTURES/models/tiny-a" \
            --prompts "$FIXTURES/models/prompts-a.json" --out "$tmp/x.st" --backend cuda
        grep -q "EG_CUDA_SAMPLE_M=4k" "$tmp/err" || { cat "$tmp/err"; exit 1; }
    fi
fi

echo "-- bench: a preset drawn by the backend, decode at a context, roofline columns"
expect 0 $E bench --preset tiny --batch 1,4 --context 0,40 --prefill-tokens 96 --prompt-len 48 --chunk 32 \
    --decode-steps 2 --warmup 1 --scratch "$tmp"
[ "$(grep -c '^decode ' "$tmp/out")" = 4 ] && [ "$(grep -c '^prefill ' "$tmp/out")" = 1 ] || { cat "$tmp/out"; exit 1; }
grep -q "weights drawn" "$tmp/out" && grep -q "CPU measured: copy" "$tmp/out" && grep -q "%copy" "$tmp/out" || { cat "$tmp/out"; exit 1; }
[ -z "$(ls -d "$tmp"/eaglegen-bench-* 2>/dev/null)" ] || { echo "bench left its layout behind"; exit 1; }
echo "-- bench --draft-attention: the drafter's attention op after each decode row"
expect 0 $E bench --preset tiny --batch 1,4 --context 0,40 --prefill-tokens 0 --decode-steps 2 --warmup 1 \
    --draft-attention 64:64:128 --scratch "$tmp"
[ "$(grep -c '^draft-attn ' "$tmp/out")" = 4 ] && [ "$(grep -c '^decode ' "$tmp/out")" = 4 ] || { cat "$tmp/out"; exit 1; }
# the cache bytes one call reads: K and V, 2 bytes, NKV 64 x HD 128, context + 1 positions a row
# (4 x 41 x 8192 x 4 = 5.37 MB at batch 4, context 40; 0.03 MB for one row at context 0)
awk '$1 == "draft-attn" && $2 == 4 && $3 == 40 && $6 == "5.37" {ok = 1} END {exit !ok}' "$tmp/out" &&
    awk '$1 == "draft-attn" && $2 == 1 && $3 == 0 && $6 == "0.03" {ok = 1} END {exit !ok}' "$tmp/out" ||
    { cat "$tmp/out"; exit 1; }
for bad in 64:3:128 64:64:127 64:64 a:b:c 64:64:128:1 0:1:2; do
    expect 2 $E bench --preset tiny --draft-attention $bad
    grep -q "draft-attention expects NH:NKV:HD" "$tmp/err" || { cat "$tmp/err"; exit 1; }
done
expect 2 $E bench --preset tiny --requests 2 --kv-tokens 8192 --draft-attention 8:2:64
grep -q "not to workload mode" "$tmp/err" || { cat "$tmp/err"; exit 1; }
expect 2 $E bench --preset tiny --context x
expect 2 $E bench --preset tiny --backend tpu

echo "-- forward over pipeline stages writes the same bytes"
$E forward --model "$FIXTURES/models/tiny-a" --prompts "$FIXTURES/models/prompts-a.json" --out "$tmp/one.st" 2>/dev/null
$E forward --model "$FIXTURES/models/tiny-a" --prompts "$FIXTURES/models/prompts-a.json" --out "$tmp/two.st" --stages 2,5 2>/dev/null
$E forward --model "$FIXTURES/models/tiny-a" --prompts "$FIXTURES/models/prompts-a.json" --out "$tmp/four.st" --stages 1,2,4,5 --chunk 7 2>/dev/null
cmp "$tmp/one.st" "$tmp/two.st"
cmp "$tmp/one.st" "$tmp/four.st"

echo "-- plan"
$E plan --preset kimi-k2.5 --stages 8 > "$tmp/plan"
grep -q "weights 594.2 GB" "$tmp/plan"
[ "$(grep -c '^[0-7] ' "$tmp/plan")" -eq 8 ]
$E plan --model "$FIXTURES/models/tiny-a" --stages 2 --gpu-mem-gb 0.01 --act-gb 0 > "$tmp/plan2"
grep -q "^1 " "$tmp/plan2"
# a split that does not fit says so and exits 1 (the table is still printed)
expect 1 $E plan --preset kimi-k2.5 --stages 2 --gpu-mem-gb 96
grep -q "stage 0 does not fit" "$tmp/err"
echo "t_gen_cli: ok"
