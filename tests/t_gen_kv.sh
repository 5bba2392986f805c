#!/usr/bin/env bash
# KV cache on demand: a pool small enough to force many preemptions (swapped to host,
# recomputed, or both; one stage or two; several chunk sizes) writes exactly the samples
# of an ample reserve-policy run; a pool that holds one sequence of --max-seq-len still
# finishes; a smaller one is refused at start; kill -9 while sequences are preempted,
# then resume: nothing lost or duplicated, every sample identical.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 11 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
with open("corpus.jsonl", "w") as f:
    for i in range(12):
        f.write(json.dumps({"prompt": f"Record {i}: tell me something about {i * 7}."}) + "\n")
PY
args=(--model model --prompts corpus.jsonl --max-new-tokens 160 --max-seq-len 256 --batch 4
      --aux-layers 1,2,3 --threads 1 --shard-samples 3)

echo "-- reference: reserve policy, ample pool"
$E generate "${args[@]}" --chunk 8 --kv-policy reserve --out ref 2>ref.log
grep -q "KV cache: reserve" ref.log
grep -q " 0 preemptions" ref.log

# run NAME FLAGS...: generate, compare with ref, require preemptions
run() {
    local name=$1; shift
    $E generate "${args[@]}" "$@" --out "$name" 2>"$name.log"
    "$PYTHON" "$here/gen_check.py" same ref "$name" >/dev/null
    local line
    line=$(grep "preemptions" "$name.log")
    echo "  $name: ${line#*KV: }"
    n=$(echo "$line" | sed -E 's/.*; ([0-9]+) preemptions \(([0-9]+) swapped.* ([0-9]+) rows recomputed.*/\1 \2 \3/')
    set -- $n
    [ "$1" -ge 3 ] || { echo "FAIL: $name: only $1 preemptions"; exit 1; }
    case "$name" in
        recompute*) [ "$2" -eq 0 ] && [ "$3" -gt 0 ] || { echo "FAIL: $name: expected recompute only"; exit 1; } ;;
        swap*) [ "$2" -eq "$1" ] && [ "$3" -eq 0 ] || { echo "FAIL: $name: expected swaps only"; exit 1; } ;;
        mixed*) [ "$2" -gt 0 ] && [ "$3" -gt 0 ] || { echo "FAIL: $name: expected swaps and recomputes"; exit 1; } ;;
    esac
}
echo "-- 320-token pool (5 blocks) for 4 slots: preemptions, samples identical"
run mixed8 --chunk 8 --kv-tokens 320 --host-kv-gb 0.00006
run recompute3 --chunk 3 --kv-tokens 320 --host-kv-gb 0
run swap16 --chunk 16 --kv-tokens 320 --host-kv-gb 1
run mixed5s2 --chunk 5 --kv-tokens 320 --host-kv-gb 0.00006 --stages 2
run swap8s2 --chunk 8 --kv-tokens 384 --host-kv-gb 1 --stages 2 --micro-batches 2

echo "-- a pool of exactly one --max-seq-len sequence finishes every request"
$E generate "${args[@]}" --chunk 8 --kv-tokens 256 --out one 2>one.log
"$PYTHON" "$here/gen_check.py" same ref one

echo "-- a pool smaller than one sequence is refused at start"
set +e
$E generate "${args[@]}" --chunk 8 --kv-tokens 200 --out small 2>small.log; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "cannot hold one sequence of --max-seq-len 256" small.log || { cat small.log; echo "FAIL: small pool"; exit 1; }
[ ! -e small/manifest.json ]

echo "-- --batch auto prints its choice; bad policy refused"
$E generate --model model --prompts corpus.jsonl --max-new-tokens 16 --max-seq-len 256 --batch auto --chunk 8 \
    --kv-tokens 1024 --threads 1 --out auto 2>auto.log
grep -q "4 slots (--batch auto)" auto.log || { cat auto.log; echo "FAIL: auto slots (1024 tokens / 256)"; exit 1; }
set +e
$E generate "${args[@]}" --kv-policy sometimes --out bad 2>bad.log; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "on-demand or reserve" bad.log

echo "-- kill -9 while sequences are preempted, resume each time"
seed=${EG_SEED:-12345}
RANDOM=$seed
echo "  (kill timings from seed $seed; set EG_SEED to change)"
kargs=(--chunk 8 --kv-tokens 320 --host-kv-gb 0.00006 --out job)
kills=0
for round in $(seq 1 8); do
    $E generate "${args[@]}" "${kargs[@]}" 2>/dev/null &
    pid=$!
    sleep "0.$(printf '%02d' $((RANDOM % 60 + 5)))"
    if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); fi
    wait $pid 2>/dev/null || true
    if [ -f job/manifest.json ]; then $E inspect job --verify >/dev/null; fi
done
echo "  killed $kills runs"
$E generate "${args[@]}" "${kargs[@]}" 2>/dev/null
"$PYTHON" "$here/gen_check.py" count job 12
"$PYTHON" "$here/gen_check.py" same ref job
$E inspect job --verify >/dev/null
echo "-- plan: concurrency from the expected length, not from max_new"
$E plan --preset kimi-k2.5 --stages 8 --mean-len 3000 --prompt-len 1024 --max-new 32768 > plan.txt
"$PYTHON" - plan.txt <<'PY'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"pipeline \(8 stages\): (\d+) token slots box-wide, (\d+) concurrent sequences at mean length 3000 "
              r"\(--mean-len; on demand\); reserving prompt 1024 \+ max_new 32768 each: (\d+)", t)
assert m, t
tokens, od, rs = map(int, m.groups())
assert abs(od - tokens * 0.99 / 3000) <= 1, (od, tokens)
assert rs == tokens // (1024 + 32768), (rs, tokens)
assert od > 5 * rs
PY
$E plan --preset kimi-k2.5 --stages 8 --workload lognormal:2000:1.0 --prompt-len 1024 --max-new 32768 > planw.txt
grep -q "mean length 4287 (prompt 1024 + expected response 3263 of lognormal:2000:1.0 cut at 32768" planw.txt \
    || { cat planw.txt; echo "FAIL: plan --workload"; exit 1; }

echo "-- bench workload mode: one JSON row per policy, on demand holds more in flight"
$E bench --model model --requests 6 --workload lognormal:40:0.5 --max-new 96 --kv-tokens 256 --prompt-len 16 \
    --chunk 32 --threads 1 --json > wl.json
"$PYTHON" - wl.json <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert [r["policy"] for r in rows] == ["on-demand", "reserve"], rows
for r in rows:
    for k in ("mean_concurrency", "peak_concurrency", "kv_utilisation", "preemptions", "swap_bytes",
              "recomputed_tokens", "tokens_per_step"):
        assert k in r, (k, r)
od, rs = rows
assert rs["preemptions"] == 0 and rs["peak_concurrency"] <= 2, rs
assert od["mean_concurrency"] > rs["mean_concurrency"], (od, rs)
assert od["decode_tokens"] == rs["decode_tokens"], (od, rs)  # the same drawn lengths
PY
echo "t_gen_kv: ok"
