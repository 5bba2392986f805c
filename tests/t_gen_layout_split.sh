#!/usr/bin/env bash
# generate --layout with dense splits (issue 17): `auto` takes plan's recommendation among the
# layouts the backend runs — on the RTX box at 4K mean length that is a "+ffn" layout (the
# shared experts and dense MLP owned whole by one rank per layer) on CUDA ranks, and on CPU
# ranks, which also run "+split" (the vocab split of embedding and lm_head), the fastest
# modelled layout (pp2xep4+split); "+split" is refused on CUDA. Kimi-K2.5's
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
fastest=$($E plan --preset kimi-k2.5 --box rtx-pro-6000x8 --mean-len 4096 | sed -n 's/^fastest modelled for decode: \([^,]*\),.*/\1/p')
[ "$fastest" = pp2xep4+split ] || fail "plan's fastest modelled on the RTX box is '$fastest', expected pp2xep4+split"
! $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 > out 2> err || fail "generate without weights ran"
grep -q -- "--layout auto: $fastest on rtx-pro-6000x8 (modelled" err || fail "auto on cpu did not take $fastest"
# the +split choice reaches the runtime as --ep-split all (the dry run's rank plan)
$E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --dry-run > out 2> err || fail "dry run of auto"
grep -q -- "--ep 4+split" out err || fail "auto took $fastest but the dry run shows no vocab split"
grep -q "the shared expert / dense MLP of layers 0, 4, .*embedding / lm_head vocab rows 0..40959" out err ||
    fail "auto: no ffn owners or vocab rows in the dry run"
! $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --backend cuda > out 2> err || fail "generate ran"
grep -q -- "--layout auto: $want on rtx-pro-6000x8 (modelled" err || fail "auto on cuda: expected $want"
$E generate "${args[@]}" --layout ep8+ffn --backend cuda --dry-run > out 2> err || fail "dry run of ep8+ffn on cuda"
grep -q -- "--ep 8+ffn" out err || fail "ep8+ffn on cuda: no ffn split in the dry run"
grep -q "the shared expert / dense MLP of layers 0, 8, " out err || fail "ep8+ffn on cuda: no ffn owners"
! $E generate "${args[@]}" --layout ep8+split --backend cuda > out 2> err || fail "ep8+split accepted on cuda"
grep -q "the cuda backend does not run the all split (the vocab split of the embedding and lm_head runs on CPU ranks" err ||
    fail "ep8+split on cuda: message"
! $E generate "${args[@]}" --layout ep8+halves > out 2> err || fail "ep8+halves accepted"
grep -q "with +ffn or +split after an epE" err || fail "ep8+halves: message"
! $E generate "${args[@]}" --layout pp8+ffn > out 2> err || fail "pp8+ffn (no group) accepted"
echo "t_gen_layout_split: ok (auto: $fastest on cpu, $want on cuda)"
