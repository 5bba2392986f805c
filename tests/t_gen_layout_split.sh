#!/usr/bin/env bash
# generate --layout with dense splits (issue 17): `auto` takes plan's recommendation among the
# layouts the backend runs — on the RTX box at 4K mean length that is a "+ffn" layout (the
# shared experts and dense MLP owned whole by one rank per layer) on CPU and CUDA ranks
# alike; "+split" (the vocab split, modelled only) is refused everywhere. Kimi-K2.5's
# config without weights: the layout is resolved before the model loads, so each run stops
# at the missing weights (a non-zero exit) after saying what it chose.
set -eu
: "${EAGLEGEN:?}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; tail -n 20 err 2>/dev/null; exit 1; }
$E mkmodel --preset kimi-k2.5 --no-weights --out kimi >/dev/null 2>&1 || fail "mkmodel --no-weights"
echo '{"prompt": "hi"}' > p.jsonl
args=(--model kimi --prompts p.jsonl --out o --max-seq-len 8192)
want=$($E plan --preset kimi-k2.5 --box rtx-pro-6000x8 --mean-len 4096 | sed -n 's/^recommended for decode: \([^,]*\),.*/\1/p')
case "$want" in *+ffn) ;; *) fail "plan recommends '$want' on the RTX box, expected a +ffn layout" ;; esac
! $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 > out 2> err || fail "generate without weights ran"
grep -q -- "--layout auto: $want on rtx-pro-6000x8 (modelled" err || fail "auto on cpu did not take $want"
# the +ffn recommendation reaches the runtime as --ep-split ffn (the dry run's rank plan)
$E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --dry-run > out 2> err || fail "dry run of auto"
grep -q -- "--ep [0-9]*+ffn" out err || fail "auto took $want but the dry run shows no ffn split"
grep -q "the shared expert / dense MLP of layers 0, " out err || fail "auto: no ffn owners in the dry run"
! $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --backend cuda > out 2> err || fail "generate ran"
grep -q -- "--layout auto: $want on rtx-pro-6000x8 (modelled" err || fail "auto on cuda: expected $want"
$E generate "${args[@]}" --layout ep8+ffn --backend cuda --dry-run > out 2> err || fail "dry run of ep8+ffn on cuda"
grep -q -- "--ep 8+ffn" out err || fail "ep8+ffn on cuda: no ffn split in the dry run"
grep -q "the shared expert / dense MLP of layers 0, 8, " out err || fail "ep8+ffn on cuda: no ffn owners"
! $E generate "${args[@]}" --layout ep8+split > out 2> err || fail "ep8+split accepted"
grep -q "vocab split of the embedding and lm_head is modelled only" err || fail "ep8+split: message"
! $E generate "${args[@]}" --layout ep8+halves > out 2> err || fail "ep8+halves accepted"
grep -q "with +ffn or +split after an epE" err || fail "ep8+halves: message"
! $E generate "${args[@]}" --layout pp8+ffn > out 2> err || fail "pp8+ffn (no group) accepted"
echo "t_gen_layout_split: ok (auto: $want on cpu and cuda)"
