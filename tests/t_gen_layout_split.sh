#!/usr/bin/env bash
# generate --layout with dense splits (issue 17): `auto` takes plan's recommendation among the
# layouts the backend runs as modelled. On the RTX box at 4K mean length that is pp8 on CUDA
# (stages x EP groups are modelled only there: a rank's stages share its GPU), and on CPU ranks
# pp2xep4+split (the shared experts and dense MLP owned whole by one rank per layer, and the
# embedding and lm_head split by vocab rows). Kimi-K2.5's config without weights:
# the layout is resolved before the model loads, so each run stops at the missing weights (a
# non-zero exit) after saying what it chose.
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
[ "$want" = pp8 ] || fail "plan recommends '$want' on the RTX box, expected pp8 (what the GPUs run as modelled)"
# on CUDA auto takes plan's recommendation; on CPU ranks stages x groups run (threads, no GPU
# memory to fit), so auto there takes the fastest modelled row, pp2xep4+split
for be in cpu cuda; do
    if [ $be = cpu ]; then w=pp2xep4+split; else w=$want; fi
    ! $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --backend $be > out 2> err ||
        fail "generate without weights ran ($be)"
    grep -q -- "--layout auto: $w on rtx-pro-6000x8 (modelled" err || fail "auto on $be did not take $w"
    $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --backend $be --dry-run > out 2> err ||
        fail "dry run of auto ($be)"
    [ $be = cuda ] && continue
    # the +split choice reaches the runtime as --ep-split all (the dry run's rank plan)
    grep -q -- "--ep 4+split" out err || fail "auto on $be took $w but the dry run shows no vocab split"
    grep -q "the shared expert / dense MLP of layers 0, 4, .*embedding / lm_head vocab rows 0..40959" out err ||
        fail "auto on $be: no ffn owners or vocab rows in the dry run"
done
$E generate "${args[@]}" --layout ep8+ffn --backend cuda --dry-run > out 2> err || fail "dry run of ep8+ffn on cuda"
grep -q -- "--ep 8+ffn" out err || fail "ep8+ffn on cuda: no ffn split in the dry run"
grep -q "the shared expert / dense MLP of layers 0, 8, " out err || fail "ep8+ffn on cuda: no ffn owners"
$E generate "${args[@]}" --layout pp4xep2+split --backend cpu --dry-run > out 2> err || fail "dry run of pp4xep2+split on cpu"
grep -q "embedding / lm_head vocab rows 81920..163839" out err || fail "pp4xep2+split on cpu: no vocab rows"
# on CUDA stages x groups would put a rank's stages on its one GPU: refused, saying so
! $E generate "${args[@]}" --layout pp4xep2+split --backend cuda > out 2> err || fail "pp4xep2+split on cuda accepted"
grep -q "runs its 4 stages on its one GPU in this build, so this would use 2 GPUs" err || fail "pp4xep2 on cuda: message"
! $E generate "${args[@]}" --layout ep8+halves > out 2> err || fail "ep8+halves accepted"
grep -q "with +ffn or +split after an epE" err || fail "ep8+halves: message"
! $E generate "${args[@]}" --layout pp8+ffn > out 2> err || fail "pp8+ffn (no group) accepted"
echo "t_gen_layout_split: ok (auto: $want on cuda, pp2xep4+split on cpu)"
