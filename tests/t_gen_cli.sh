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
         --on-bad-record --batch --chunk --shard-samples --threads --worker --log-json --stages --micro-batches --gpus --gpu-mem-fraction; do
    $E generate --help | grep -q -- "$f" || { echo "generate --help lacks $f"; exit 1; }
done
expect 2 $E nosuchcommand
expect 2 $E generate --model m
expect 2 $E generate --model m --prompts p --out o --temperature hot
expect 2 $E generate --model m --prompts p --out o --worker 3/2
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
fi

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
echo "-- bench on a drawn preset (removed afterwards)"
$E bench --preset tiny --batch 2 --prompt-len 16 --decode-steps 2 --scratch "$tmp" > "$tmp/bench"
grep -q "^cpu  *2  *16 " "$tmp/bench" || { cat "$tmp/bench"; exit 1; }
[ -z "$(ls -d "$tmp"/eaglegen-bench-* 2>/dev/null)" ] || { echo "bench left its drawn model behind"; exit 1; }
echo "t_gen_cli: ok"
