#!/usr/bin/env bash
# Workers and merge cannot silently duplicate or mix data (issue 20): a Slurm array with an
# offset and a step maps to workers 0..N-1; inconsistent launcher variables are refused
# naming them; merge refuses workers made with different parameters (listing them) or
# other inputs, reports missing and unfinished workers (refused unless --allow-partial,
# which the manifest records), and never doubles its message prefix; a worker's --restart
# does not delete shards a merged manifest.json in its directory lists; repeated ids
# split over workers merge as one run's (each worker meets the others' ids).
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=${EG_KEEP:-$(mktemp -d)}; [ -n "${EG_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 11 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
for name, k in (("c.jsonl", 1), ("other.jsonl", 2)):
    with open(name, "w") as f:
        for i in range(12):
            f.write(json.dumps({"prompt": f"Record {i * k}: about {i * 7}."}) + "\n")
PY
args=(--model model --max-new-tokens 6 --max-seq-len 128 --batch 3 --chunk 8 --aux-layers 1,2,3 --threads 1
      --prompts c.jsonl)
gen() { $E generate "${args[@]}" "$@"; }
fail() { echo "FAIL: $*"; [ -f err ] && cat err; exit 1; }
nodouble() { if grep -q "merge: merge:" err; then fail "doubled message prefix"; fi; }
gen --out ref 2>/dev/null

echo "-- a Slurm array with an offset and a step: --array=16-20:2 is workers 0..2 of 3"
for id in 16 18 20; do
    env SLURM_ARRAY_TASK_ID=$id SLURM_ARRAY_TASK_MIN=16 SLURM_ARRAY_TASK_MAX=20 SLURM_ARRAY_TASK_STEP=2 \
        SLURM_ARRAY_TASK_COUNT=3 $E generate "${args[@]}" --out arr 2>err || fail "array task $id"
    grep -q "worker $(((id - 16) / 2))/3 from SLURM_ARRAY_TASK_ID $id" err || fail "array task $id: worker line"
done
ls arr/manifest.w0of3.json arr/manifest.w1of3.json arr/manifest.w2of3.json >/dev/null
$E merge arr --out arr 2>err || fail "merge of the array"
nodouble
"$PYTHON" "$here/gen_check.py" same ref arr
echo "-- --restart of a worker whose shards a merged manifest.json lists is refused, touching nothing"
if gen --out arr --worker 1/3 --restart 2>err; then fail "--restart under a merged manifest"; fi
grep -q "the merged arr/manifest.json lists this job's shard shard-w1of3-" err || fail "restart refusal message"
$E inspect arr --verify >/dev/null 2>err || fail "the merged dataset no longer verifies"
"$PYTHON" "$here/gen_check.py" same ref arr
echo "-- inconsistent launcher variables are refused, naming them"
set +e
SLURM_ARRAY_TASK_ID=3 $E generate "${args[@]}" --out bad 2>err; rc=$?
set -e
[ $rc = 2 ] && grep -q "SLURM_ARRAY_TASK_COUNT is not" err || fail "ID without COUNT: exit $rc"
set +e
RANK=4 WORLD_SIZE=4 $E generate "${args[@]}" --out bad 2>err; rc=$?
set -e
[ $rc = 2 ] && grep -q "RANK=4 is not below WORLD_SIZE=4" err || fail "rank >= size: exit $rc"
[ ! -e bad ] || fail "a refused start made its --out"

echo "-- workers in separate directories"
for w in 0 1 2; do gen --out w$w --worker $w/3 2>/dev/null; done
echo "-- 1 of 3 workers: refused, then --allow-partial records it"
if $E merge w0 --out m1 2>err; then fail "1 of 3 workers merged"; fi
nodouble
grep -q "worker 1/3 of the job on c.jsonl is missing" err && grep -q "worker 2/3" err \
    && grep -q "2 workers missing, 0 unfinished" err && grep -q -- "--allow-partial" err || fail "missing workers"
[ ! -e m1/manifest.json ] || fail "a refused merge wrote a manifest"
$E merge w0 --out m1 --allow-partial 2>err || fail "--allow-partial"
"$PYTHON" - m1 <<'PY'
import json, sys
job = json.load(open(sys.argv[1] + "/manifest.json"))["job"]
assert job["partial"]["missing"] == ["1/3", "2/3"], job["partial"]
assert job["partial"]["unfinished"] == [], job["partial"]
PY
$E merge w0 w1 w2 --out m3 2>err || fail "all three workers"
"$PYTHON" "$here/gen_check.py" same ref m3
"$PYTHON" -c "import json,sys; assert 'partial' not in json.load(open('m3/manifest.json'))['job']"

echo "-- workers made with different parameters are refused, listing the differences"
gen --out t1 --worker 1/3 --temperature 0.7 --seed 5 --max-new-tokens 5 --drop-truncated 2>/dev/null
if $E merge w0 t1 w2 --out mx 2>err; then fail "a mix of parameters merged"; fi
nodouble
for k in "temperature: 1 -> 0.7" "seed: 0 -> 5" "max_new_tokens: 6 -> 5" "drop_truncated: false -> true"; do
    grep -q "$k" err || fail "difference '$k' not listed"
done
grep -q "different parameters" err || fail "summary"
[ ! -e mx/manifest.json ] && [ "$(ls mx 2>/dev/null | wc -l)" = 0 ] || fail "a refused merge left files in mx"
# a --allow-partial cannot override a mix
if $E merge w0 t1 w2 --out mx --allow-partial 2>/dev/null; then fail "--allow-partial merged a mix"; fi

echo "-- a worker made from other inputs is refused"
$E generate "${args[@]/c.jsonl/other.jsonl}" --out o1 --worker 1/3 2>/dev/null
if $E merge w0 o1 w2 --out mo 2>err; then fail "a worker with another corpus merged"; fi
grep -q "worker 1/3 of the job on c.jsonl is missing; a worker 1/3 made from other input files is in o1" err \
    || fail "other corpus not named"

echo "-- an unfinished worker (stopped at --limit) is refused, --allow-partial records it"
gen --out u1 --worker 1/3 --limit 2 2>/dev/null
if $E merge w0 u1 w2 --out mu 2>err; then fail "an unfinished worker merged"; fi
grep -q "u1/manifest.w1of3.json is unfinished: it stopped at --limit" err || fail "unfinished not named"
$E merge w0 u1 w2 --out mu --allow-partial 2>/dev/null || fail "--allow-partial with an unfinished worker"
"$PYTHON" - mu <<'PY'
import json, sys
job = json.load(open(sys.argv[1] + "/manifest.json"))["job"]
assert job["partial"]["missing"] == [], job
assert job["partial"]["unfinished"] == ["u1/manifest.w1of3.json (limit)"], job["partial"]
PY
# resumed to the end, it merges
gen --out u1 --worker 1/3 2>/dev/null
$E merge w0 u1 w2 --out mu2 2>err || fail "the resumed worker"
"$PYTHON" "$here/gen_check.py" same ref mu2

echo "-- repeated ids across workers: each worker meets the others' ids, so they merge as one run"
"$PYTHON" - <<'PY'
import json
recs = [{"id": "X", "prompt": "hello a"}, {"id": "X", "prompt": "hello b"}, {"id": "Y", "prompt": "hello c"},
        {"id": 7, "prompt": "hello d"}, {"id": "Y"}, {"id": "Q"}, {"id": "Q", "prompt": "q"},
        {"prompt": "no id"}, {"id": "7", "prompt": "the integer's text"}, {"id": "Z", "prompt": "z"}]
with open("dup.jsonl", "w") as f:
    for r in recs: f.write(json.dumps(r) + "\n")
PY
dargs=(--model model --max-new-tokens 6 --max-seq-len 128 --batch 3 --chunk 8 --aux-layers 1,2,3 --threads 1
       --prompts dup.jsonl --on-bad-record skip)
$E generate "${dargs[@]}" --out dref 2>/dev/null
for w in 0 1 2; do $E generate "${dargs[@]}" --out dw --worker $w/3 2>/dev/null || fail "worker $w"; done
$E merge dw --out dw 2>err || fail "workers with repeated ids did not merge"
"$PYTHON" "$here/gen_check.py" same dref dw
"$PYTHON" - dref dw <<'PY'
import glob, json, sys
def rej(d):
    out = []
    for p in glob.glob(d + "/rejects*.jsonl"):
        for l in open(p):
            r = json.loads(l); r.pop("line_hash", None); out.append(json.dumps(r, sort_keys=True))
    return sorted(out)
a, b = rej(sys.argv[1]), rej(sys.argv[2])
assert a == b, (a, b)
kinds = sorted(json.loads(x)["outcome"] for x in a)
# X again, Q after the bad Q (a record naming its id claims it), "7" after 7; two bad records
assert kinds == ["duplicate"] * 3 + ["rejected"] * 2, kinds
PY
$E generate "${dargs[@]}" --out ddry --worker 1/3 --dry-run > dry.out 2>&1 || fail "dry run"
grep -q "duplicate id" dry.out || fail "the dry run of worker 1 did not see the repeat of another worker's id"

echo "-- a merged dataset merges again with the same checks"
$E merge m1 w1 w2 --out mm 2>err || fail "merged + workers: $(cat err)"
"$PYTHON" "$here/gen_check.py" count mm 12
echo "t_gen_merge_jobs: ok"
