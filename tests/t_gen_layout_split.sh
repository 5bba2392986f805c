#!/usr/bin/env bash
# generate --layout with dense splits (issue 17): `auto` takes plan's recommendation among the
# layouts the backend runs as modelled. On the RTX box at 4K mean length that is stages x EP
# groups with +split (pp4xep2+split, pp2xep4+split within 1% with the layer split) on CUDA
# and CPU ranks alike (stage groups; the shared experts and dense MLP owned whole by one rank
# per layer, and the embedding and lm_head split by vocab rows).
# Kimi-K2.5's config without weights:
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
args=(--model kimi --prompts p.jsonl --out o --max-seq-len 8192 --batch auto)
# auto plans as the run goes: mean length 4096 (plan's default), --batch auto (up to --chunk
# 512 slots a rank), prefill chunks of --chunk rows: plan with the same figures
pargs=(--mean-len 4096 --batch auto --prefill-chunk 512)
want=$($E plan --preset kimi-k2.5 --box rtx-pro-6000x8 "${pargs[@]}" | sed -n 's/^recommended for decode: \([^,]*\),.*/\1/p')
case "$want" in pp2xep4+split|pp4xep2+split) ;; *) fail "plan recommends '$want' on the RTX box, expected ppPxepE+split" ;; esac
ep=${want#*xep}; ep=${ep%+split}; vend=$((163840 / ep - 1))
# auto takes plan's recommendation on either backend
for be in cpu cuda; do
    w=$want
    ! $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --backend $be > out 2> err ||
        fail "generate without weights ran ($be)"
    grep -q -- "--layout auto: $w on rtx-pro-6000x8: modelled" err || fail "auto on $be did not take $w"
    $E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --backend $be --dry-run > out 2> err ||
        fail "dry run of auto ($be)"
    if [ $be = cuda ]; then
        grep -q "as stage groups (a GPU per rank and stage, stage k's exchange among GPUs" out err ||
            fail "auto on cuda: the dry run does not say stage groups"
        continue
    fi
    grep -q "as stage groups (a thread per rank and stage" out err || fail "auto on cpu: the dry run does not say stage groups"
    # the +split choice reaches the runtime as --ep-split all (the dry run's rank plan)
    grep -q -- "--ep $ep+split" out err || fail "auto on $be took $w but the dry run shows no vocab split"
    grep -q "the shared expert / dense MLP of layers 0, $ep, .*embedding / lm_head vocab rows 0..$vend" out err ||
        fail "auto on $be: no ffn owners or vocab rows in the dry run"
done
# --whole-layers: auto ranks the whole-layer rows, plan --whole-layers's recommendation
ww=$($E plan --preset kimi-k2.5 --box rtx-pro-6000x8 "${pargs[@]}" --whole-layers |
    sed -n 's/^recommended for decode: \([^,]*\),.*/\1/p')
[ -n "$ww" ] || fail "plan --whole-layers recommends nothing"
$E generate "${args[@]}" --layout auto --box rtx-pro-6000x8 --whole-layers --dry-run > out 2> err ||
    fail "dry run of auto --whole-layers"
grep -q -- "--layout auto: $ww on rtx-pro-6000x8: modelled" err || fail "auto --whole-layers did not take $ww"
$E generate "${args[@]}" --layout ep8+ffn --backend cuda --dry-run > out 2> err || fail "dry run of ep8+ffn on cuda"
grep -q -- "--ep 8+ffn" out err || fail "ep8+ffn on cuda: no ffn split in the dry run"
grep -q "the shared expert / dense MLP of layers 0, 8, " out err || fail "ep8+ffn on cuda: no ffn owners"
$E generate "${args[@]}" --layout pp4xep2+split --backend cpu --dry-run > out 2> err || fail "dry run of pp4xep2+split on cpu"
grep -q "embedding / lm_head vocab rows 81920..163839" out err || fail "pp4xep2+split on cpu: no vocab rows"
# on CUDA stages x groups are stage groups too: 4 x 2 GPUs, stage k's exchange among GPUs 2k, 2k+1
$E generate "${args[@]}" --layout pp4xep2+split --backend cuda --dry-run > out 2> err || fail "dry run of pp4xep2+split on cuda"
grep -q -- "--ep 2+split (rank r's stage k on GPU k\*ranks + r" out err || fail "pp4xep2+split on cuda: no stage groups"
! $E generate "${args[@]}" --layout tp8 > out 2> err || fail "tp8 accepted"
! $E generate "${args[@]}" --layout ep8+halves > out 2> err || fail "ep8+halves accepted"
grep -q "with +ffn or +split after an epE" err || fail "ep8+halves: message"
! $E generate "${args[@]}" --layout pp8+ffn > out 2> err || fail "pp8+ffn (no group) accepted"
echo "t_gen_layout_split: ok (auto: $want on cuda and cpu)"
