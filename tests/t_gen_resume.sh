#!/usr/bin/env bash
# Jobs that survive anything: kill -9 at random moments, then resume, gives exactly the
# dataset of an uninterrupted run (same ids, bit-identical samples); SIGINT commits and
# exits 130; N workers into one directory cover every record exactly once and merge into
# the same dataset.
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
    for i in range(40):
        f.write(json.dumps({"prompt": f"Record {i}: tell me something about the number {i * 7}."}) + "\n")
PY
args=(--model model --prompts corpus.jsonl --max-new-tokens 40 --max-seq-len 256 --batch 3 --chunk 8
      --shard-samples 4 --aux-layers 1,2,3 --threads 1)

echo "-- uninterrupted reference run"
$E generate "${args[@]}" --out ref 2>/dev/null
"$PYTHON" "$here/gen_check.py" count ref 40

echo "-- kill -9 at random moments, resume each time"
seed=${EG_SEED:-12345}
RANDOM=$seed
echo "  (kill timings from seed $seed; set EG_SEED to change)"
kills=0
for round in $(seq 1 12); do
    $E generate "${args[@]}" --out job 2>/dev/null &
    pid=$!
    sleep "0.$(printf '%02d' $((RANDOM % 40 + 2)))"
    if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); fi
    wait $pid 2>/dev/null || true
    # whatever is visible must verify
    if [ -f job/manifest.json ]; then $E inspect job --verify >/dev/null; fi
done
echo "  killed $kills runs"
$E generate "${args[@]}" --out job 2>/dev/null
"$PYTHON" "$here/gen_check.py" same ref job
$E inspect job --verify >/dev/null

echo "-- SIGINT: commit what is complete, exit 130, resume"
$E generate "${args[@]}" --out sig 2>/dev/null &
pid=$!
sleep 0.3
kill -INT $pid
set +e; wait $pid; rc=$?; set -e
if [ $rc -ne 130 ] && [ $rc -ne 0 ]; then echo "SIGINT exit status $rc (expected 130)"; exit 1; fi
$E generate "${args[@]}" --out sig 2>/dev/null
"$PYTHON" "$here/gen_check.py" same ref sig

echo "-- 3 workers into one directory, then merge"
for w in 0 1 2; do $E generate "${args[@]}" --out shared --worker $w/3 2>/dev/null; done
ls shared/manifest.w*of3.json >/dev/null
$E merge shared --out shared 2>/dev/null
"$PYTHON" "$here/gen_check.py" count shared 40
"$PYTHON" "$here/gen_check.py" same ref shared

echo "-- Slurm array variables choose the worker"
SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_COUNT=2 $E generate "${args[@]}" --out slurm 2>/dev/null
ls slurm/manifest.w1of2.json >/dev/null
"$PYTHON" "$here/gen_check.py" count slurm 20
echo "t_gen_resume: ok"
