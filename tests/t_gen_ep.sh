#!/usr/bin/env bash
# Expert parallelism (--ep E, CPU ranks on threads, local exchange): every --ep / --stages
# combination writes samples bit-identical to the unsplit run — sampling with stop tokens
# mid-batch and prompts of very different lengths (uneven per rank), capture mode, and a
# KV pool small enough to force preemptions on every rank. Bad values are refused with
# the numbers named.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 7 >/dev/null 2>&1   # 16 routed experts, top-4
"$PYTHON" - <<'PY'
import json
with open("corpus.jsonl", "w") as f:
    for i in range(12):  # prompt lengths from a few tokens to ~200
        f.write(json.dumps({"id": f"r{i}", "prompt": f"Record {i}: tell me about {i * 7}." + " more" * (i * i // 3)}) + "\n")
with open("conv.jsonl", "w") as f:
    for i in range(6):
        f.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Add {i} and 2." + " x" * (20 * i)},
                {"role": "assistant", "content": f"{i + 2}." + " y" * (9 * i)}, {"role": "user", "content": "Thanks"},
                {"role": "assistant", "content": "You are welcome."}]}) + "\n")
PY
args=(--model model --prompts corpus.jsonl --max-new-tokens 48 --max-seq-len 384 --batch 4 --chunk 16
      --aux-layers 0,2,3 --seed 5 --temperature 0.8 --shard-samples 5)

echo "-- reference: unsplit"
$E generate "${args[@]}" --out ref 2>ref.log || { cat ref.log; exit 1; }
# stop tokens mid-batch: some samples end before max-new-tokens
dec=$(grep "summary:" ref.log | sed -E 's/.*\+ ([0-9]+) decode.*/\1/')
[ "$dec" -lt $((12 * 48)) ] || { echo "FAIL: no sample stopped early ($dec decode tokens)"; exit 1; }

same() { # NAME FLAGS...
    local name=$1; shift
    $E generate "${args[@]}" "$@" --out "$name" 2>"$name.log" || { cat "$name.log"; exit 1; }
    "$PYTHON" "$here/gen_check.py" same ref "$name" >/dev/null || { echo "FAIL: $name differs from unsplit"; exit 1; }
    grep -q "expert parallel: " "$name.log" || { cat "$name.log"; exit 1; }
    echo "  $name: identical; $(grep 'expert exchange' "$name.log" | sed 's/^ *//')"
}
echo "-- sampling with stop tokens, uneven lengths per rank"
same ep2 --ep 2
same ep4 --ep 4
same ep2s2 --ep 2 --stages 2
same ep4c3 --ep 4 --chunk 3 --batch 5

echo "-- --ep-split ffn: layer l's shared expert / dense MLP on rank l mod E only"
wmb() { grep -o 'weights per rank (MB): [0-9. ]*' "$1" | sed 's/.*: //'; } # per-rank weight MB
lighter() { # NAME LOG BASE-LOG WHAT BASE UNIFORM: every rank of LOG holds fewer weight MB than in
            # BASE-LOG (and, with UNIFORM 1, BASE-LOG's ranks all hold the same)
    local with without
    with=$(wmb "$2"); without=$(wmb "$3")
    "$PYTHON" -c "
import sys
w, n = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()]
assert len(w) == len(n) > 1 and all(a < b for a, b in zip(w, n)), (w, n)
assert sys.argv[5] != '1' or len(set(n)) == 1, n
print('  weights per rank (MB): %s with %s, %s %s' % (sys.argv[1], sys.argv[3], sys.argv[2], sys.argv[4]))
" "$with" "$without" "$4" "$5" "$6" || { echo "FAIL: $1: weights per rank $with ($4) vs $without ($5)"; exit 1; }
}
ffn() { # NAME FLAGS...: identical to unsplit, the split named, every rank lighter than replicated
    local name=$1; shift
    same "$name" "$@" --ep-split ffn
    grep -q "(+ffn)" "$name.log" || { cat "$name.log"; echo "FAIL: $name does not say +ffn"; exit 1; }
    grep -q "token rows to another rank's shared expert" "$name.log" || { cat "$name.log"; echo "FAIL: $name no rows"; exit 1; }
    $E generate "${args[@]}" "$@" --limit 1 --out "$name.none" 2>"$name.none.log" || { cat "$name.none.log"; exit 1; }
    lighter "$name" "$name.log" "$name.none.log" ffn replicated 1
}
ffn ffn2 --ep 2
ffn ffn4 --ep 4
ffn ffn2s2 --ep 2 --stages 2
ffn ffn4c3 --ep 4 --chunk 3 --batch 5

echo "-- --ep-split all: +ffn, and the embedding and lm_head split by vocab rows (V/E each)"
vsplit() { # NAME FLAGS...: identical to unsplit, rows embedded and logit columns from other ranks,
           # every rank lighter than with --ep-split ffn
    local name=$1; shift
    same "$name" "$@" --ep-split all
    grep -q "(+split)" "$name.log" || { cat "$name.log"; echo "FAIL: $name does not say +split"; exit 1; }
    grep -Eq "[1-9][0-9]* tokens embedded by another rank, [1-9][0-9]* logit rows with columns from other ranks" \
        "$name.log" || { cat "$name.log"; echo "FAIL: $name: no rows crossed for the vocab split"; exit 1; }
    $E generate "${args[@]}" "$@" --ep-split ffn --limit 1 --out "$name.ffn" 2>"$name.ffn.log" || { cat "$name.ffn.log"; exit 1; }
    lighter "$name" "$name.log" "$name.ffn.log" all "with ffn" 0
}
vsplit all2 --ep 2
vsplit all4 --ep 4
vsplit all2s2 --ep 2 --stages 2
vsplit all4c3 --ep 4 --chunk 3 --batch 5
same lay2split --layout ep2+split
grep -q "(+split)" lay2split.log || { cat lay2split.log; echo "FAIL: --layout ep2+split is not the vocab split"; exit 1; }
# an uneven vocab split (512 rows over 3 ranks: 170, 171, 171) on the fixture with 12 experts,
# with the tokenizer of the tiny model
if [ -d "${FIXTURES:-}/models/tiny-q4" ]; then
    mkdir q4
    for f in "$FIXTURES"/models/tiny-q4/*; do ln -s "$f" q4/; done
    cp model/tiktoken.model model/tokenizer_config.json q4/
    qargs=(--model q4 --prompts corpus.jsonl --max-new-tokens 24 --max-seq-len 384 --batch 6 --chunk 16
           --aux-layers 0,1,2 --seed 5 --temperature 0.8 --shard-samples 5)
    $E generate "${qargs[@]}" --out q4ref 2>q4ref.log || { cat q4ref.log; exit 1; }
    for f in "--ep 3 --ep-split all" "--ep 3 --ep-split all --stages 2"; do
        n=q4$(echo "$f" | tr -d ' -')
        $E generate "${qargs[@]}" $f --out "$n" 2>"$n.log" || { cat "$n.log"; exit 1; }
        "$PYTHON" "$here/gen_check.py" same q4ref "$n" >/dev/null || { echo "FAIL: tiny-q4 $f differs"; exit 1; }
        echo "  tiny-q4 (vocab 512 over 3 ranks) $f: identical"
    done
else
    echo "FAIL: no fixture tiny-q4 under FIXTURES=${FIXTURES:-} (README: make test)"; exit 1
fi
$E generate "${args[@]}" --ep 4 --ep-split all --dry-run >dry.txt 2>&1 || { cat dry.txt; exit 1; }
grep -q -- "--ep 4+split" dry.txt && grep -q "rank 3: .*vocab rows 384..511$" dry.txt \
    || { cat dry.txt; echo "FAIL: --dry-run does not show the vocab rows"; exit 1; }

# --dry-run names each rank's layers (layer l on rank l mod E)
$E generate "${args[@]}" --ep 2 --ep-split ffn --dry-run >dry.txt 2>&1 || { cat dry.txt; exit 1; }
grep -q "rank 0: .*dense MLP of layers 0, 2, 4$" dry.txt && grep -q "rank 1: .*dense MLP of layers 1, 3$" dry.txt \
    || { cat dry.txt; echo "FAIL: --dry-run does not show the owners"; exit 1; }

echo "-- --layout: the same layouts by name, and auto from the planner"
same lay22 --layout pp2xep2
$E generate "${args[@]}" --layout auto --box h200x8 --batch 8 --out lauto 2>lauto.log || { cat lauto.log; exit 1; }
grep -q -- "--layout auto: .* on h200x8: modelled .* sequences in flight (--batch 8)" lauto.log || { cat lauto.log; echo "FAIL: auto says nothing"; exit 1; }
"$PYTHON" "$here/gen_check.py" same ref lauto >/dev/null || { echo "FAIL: --layout auto differs from unsplit"; exit 1; }
echo "  auto: $(grep -o 'layout auto: [^ ]*' lauto.log): identical"

echo "-- on-demand KV with preemptions on the ranks (4 slots per rank, 5 blocks per rank)"
"$PYTHON" -c "
import json
with open('short.jsonl', 'w') as f:
    for i in range(12): f.write(json.dumps({'prompt': f'Record {i}: tell me something about {i * 7}.'}) + '\\n')
"
kargs=(--model model --prompts short.jsonl --max-new-tokens 160 --max-seq-len 256 --chunk 8
       --aux-layers 1,3 --seed 9 --shard-samples 4)
$E generate "${kargs[@]}" --batch 4 --kv-policy reserve --out kref 2>kref.log || { cat kref.log; exit 1; }
for f in "--ep 2 --host-kv-gb 0.00006" "--ep 2 --stages 2 --host-kv-gb 0" "--ep 4 --host-kv-gb 1" \
         "--ep 2 --ep-split ffn --host-kv-gb 0.00006" "--ep 4 --ep-split ffn --host-kv-gb 0" \
         "--ep 2 --ep-split all --host-kv-gb 0.00006" "--ep 2 --stages 2 --ep-split all --host-kv-gb 0"; do
    n=kv$(echo "$f" | tr -d ' -.' | tr -d -c 'a-z0-9')
    ep=$(echo "$f" | sed -E 's/--ep ([0-9]+).*/\1/')
    $E generate "${kargs[@]}" $f --batch $((4 * ep)) --kv-tokens $((320 * ep)) --out "$n" 2>"$n.log" \
        || { cat "$n.log"; exit 1; }
    "$PYTHON" "$here/gen_check.py" same kref "$n" >/dev/null || { echo "FAIL: $f (small pool) differs"; exit 1; }
    p=$(grep "preemptions" "$n.log" | sed -E 's/.*; ([0-9]+) preemptions.*/\1/')
    echo "  $f, pool $((320 * ep)) tokens: identical, $p preemptions"
    [ "$p" -ge 3 ] || { grep preemptions "$n.log"; echo "FAIL: only $p preemptions"; exit 1; }
done

echo "-- capture mode (teacher-forced)"
cargs=(--model model --prompts conv.jsonl --mode capture --max-seq-len 512 --batch 4 --chunk 8 --aux-layers 0,2,3)
$E generate "${cargs[@]}" --out cref 2>cref.log || { cat cref.log; exit 1; }
for f in "--ep 2" "--ep 4" "--ep 2 --stages 2" "--ep 2 --ep-split ffn" "--ep 4 --ep-split ffn" \
         "--ep 2 --stages 2 --ep-split ffn" "--ep 2 --ep-split all" "--ep 4 --stages 2 --ep-split all"; do
    n=cap$(echo "$f" | tr -d ' -')
    $E generate "${cargs[@]}" $f --out "$n" 2>"$n.log" || { cat "$n.log"; exit 1; }
    "$PYTHON" "$here/gen_check.py" same cref "$n" >/dev/null || { echo "FAIL: capture $f differs"; exit 1; }
    echo "  capture $f: identical"
done

echo "-- least-loaded admission: a skewed workload keeps both ranks busy (steps, not time)"
# two long records first, then six short ones; 2 slots per rank. Taking whatever comes
# while a slot is free, the first rank to ask would hold both long ones (its two slots)
# and the other would run the short ones and then sit idle: 60 / 28 steps here. Least-loaded
# admission gives each rank one long record: 44 / 44 (the group: 44 steps instead of 60).
"$PYTHON" - <<'PY'
import json
with open("skew.jsonl", "w") as f:
    for i in range(8):
        user = f"Tell me {i}." + (" more" * 40 if i < 2 else "")
        f.write(json.dumps({"id": f"s{i}", "messages": [{"role": "user", "content": user},
                                                       {"role": "assistant", "content": f"Yes {i}."}]}) + "\n")
PY
sargs=(--model model --prompts skew.jsonl --mode capture --max-seq-len 256 --batch 4 --chunk 8 --aux-layers 1)
$E generate "${sargs[@]}" --out sref 2>sref.log || { cat sref.log; exit 1; }
$E generate "${sargs[@]}" --ep 2 --out sep 2>sep.log || { cat sep.log; exit 1; }
"$PYTHON" "$here/gen_check.py" same sref sep >/dev/null || { echo "FAIL: skewed --ep 2 differs"; exit 1; }
steps=$(grep -o 'steps per rank: [0-9 ]*' sep.log | sed 's/steps per rank: //')
set -- $steps
[ $# -eq 2 ] || { cat sep.log; echo "FAIL: no steps per rank"; exit 1; }
lo=$(( $1 < $2 ? $1 : $2 )) hi=$(( $1 > $2 ? $1 : $2 ))
echo "  steps per rank: $1 $2"
[ $((10 * lo)) -ge $((7 * hi)) ] || { echo "FAIL: one rank idle most of the run (steps $1 / $2)"; exit 1; }

echo "-- --batch auto with ranks: every rank gets slots, the same count each"
$E generate "${args[@]}" --batch auto --ep 16 --chunk 8 --out auto16 2>auto16.log || { cat auto16.log; echo "FAIL: --batch auto --ep 16"; exit 1; }
n=$(sed -n 's/.*expert parallel: 16 ranks, .*, \([0-9]*\) slots and .*/\1/p' auto16.log)
[ -n "$n" ] && [ $((n % 16)) -eq 0 ] || { cat auto16.log; echo "FAIL: --batch auto --ep 16 took '$n' slots"; exit 1; }
"$PYTHON" "$here/gen_check.py" same ref auto16 >/dev/null || { echo "FAIL: --batch auto --ep 16 differs"; exit 1; }
echo "  --batch auto --ep 16: $n slots, identical"

echo "-- bad values refused"
bad() { # EXPECTED-TEXT FLAGS...
    local want=$1; shift
    if $E generate "${args[@]}" "$@" --out bad 2>bad.log; then echo "FAIL: accepted $*"; exit 1; fi
    grep -q -- "$want" bad.log || { cat bad.log; echo "FAIL: $* not refused with '$want'"; exit 1; }
}
bad "--ep" --ep 0
bad "--ep 3 does not divide the model's 16 routed experts" --ep 3
bad "--ep 8 needs at least one sequence slot per rank (--batch 4)" --ep 8
# with a drafter too: the check comes before the ranks' drafters are loaded (one per rank,
# for its slots), which used to fail first with "0 slots of 384 positions"
$E mkmodel --drafter-for model --out drafter --aux-layers 0,2,3 >/dev/null 2>&1
bad "--ep 8 needs at least one sequence slot per rank (--batch 4)" --ep 8 --draft-model drafter
bad "--ep 4: each rank's share of the KV pool" --ep 4 --kv-tokens 1024
# CUDA ranks are no longer refused up front (the nccl exchange: tests/gpu/emu/run_emu.sh --ep);
# here (no GPU) the run stops at the device, not at the option check
if $E generate "${args[@]}" --ep 2 --backend cuda --out bad 2>bad.log; then echo "FAIL: cuda ran without a GPU"; exit 1; fi
if grep -q "is not implemented yet\|CPU ranks only" bad.log; then cat bad.log; echo "FAIL: --ep refused on cuda"; exit 1; fi
bad "--ep-split ffn splits within an expert-parallel group: it needs --ep E with E > 1 (got 1)" --ep-split ffn
bad "--ep-split ffn splits within an expert-parallel group: it needs --ep E with E > 1 (got 1)" --ep-split ffn --ep 1
bad "--ep-split: expected none, ffn or all, got 'dense'" --ep 2 --ep-split dense
bad "--ep-split all splits within an expert-parallel group: it needs --ep E with E > 1 (got 1)" --ep-split all
# the vocab split on CUDA ranks (run_emu.sh --ep and ep_vocab check it): not refused, the run
# stops at the device; the dry run shows each rank's vocab rows
if $E generate "${args[@]}" --ep 2 --ep-split all --backend cuda --out bad 2>bad.log; then
    echo "FAIL: cuda ran without a GPU"; exit 1
fi
if grep -q "CPU ranks only\|ep-split all with --backend cuda" bad.log; then cat bad.log; echo "FAIL: --ep-split all refused on cuda"; exit 1; fi
$E generate "${args[@]}" --ep 2 --ep-split all --backend cuda --dry-run --out bad >bad.log 2>&1 ||
    { cat bad.log; echo "FAIL: dry run of --ep 2 --ep-split all on cuda"; exit 1; }
grep -q "embedding / lm_head vocab rows 256..511" bad.log || { cat bad.log; echo "FAIL: the cuda dry run shows no vocab rows"; exit 1; }
# the ffn split on CUDA ranks is not refused either (run_emu.sh --ep checks it): the run
# stops at the device, and the dry run shows the owners
if $E generate "${args[@]}" --ep 2 --ep-split ffn --backend cuda --out bad 2>bad.log; then
    echo "FAIL: cuda ran without a GPU"; exit 1
fi
if grep -q "ep-split ffn with --backend cuda" bad.log; then cat bad.log; echo "FAIL: --ep-split ffn refused on cuda"; exit 1; fi
$E generate "${args[@]}" --ep 2 --ep-split ffn --backend cuda --dry-run --out bad >bad.log 2>&1 ||
    { cat bad.log; echo "FAIL: dry run of --ep 2 --ep-split ffn on cuda"; exit 1; }
grep -q -- "--ep 2+ffn" bad.log || { cat bad.log; echo "FAIL: the cuda dry run shows no ffn split"; exit 1; }
bad "--layout sets --stages, --ep and --ep-split" --layout ep2 --ep 2
# the layout's split is its own: an explicit --ep-split beside it is refused, not overridden
bad "--layout sets --stages, --ep and --ep-split" --layout ep2+ffn --ep-split none
bad "--layout sets --stages, --ep and --ep-split" --layout ep2 --ep-split ffn
bad "expected ppP, epE, ppPxepE" --layout tp8
bad "--layout auto needs --box" --layout auto
echo "ok"
