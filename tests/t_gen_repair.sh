#!/usr/bin/env bash
# Damaged shards: a resume refuses a committed shard with a flipped byte, a truncated or a
# deleted one, naming it and pointing at `eaglegen repair`; repair sets exactly the damaged
# shards aside (into quarantine/, never deleted) and takes them out of the manifest; the
# rerun regenerates exactly their samples, and the final dataset equals an uninterrupted
# run's (every sample bit-identical, same totals and loss-token histogram).
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 5 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
with open("corpus.jsonl", "w") as f:
    for i in range(24):
        f.write(json.dumps({"id": f"r{i}", "prompt": f"Record {i}: say something about {i * 3}."}) + "\n")
PY
args=(--model model --prompts corpus.jsonl --max-new-tokens 12 --max-seq-len 128 --batch 4 --chunk 8
      --shard-samples 4 --aux-layers 1,2 --threads 1)
$E generate "${args[@]}" --out ref 2>/dev/null
$E generate "${args[@]}" --out job 2>/dev/null
shards=$(ls job/shard-*.tar | wc -l)
[ "$shards" -eq 6 ] || { echo "expected 6 shards, got $shards"; exit 1; }

refuse() { # DIR SHARD: a resume of DIR must fail naming SHARD and repair
    set +e; $E generate "${args[@]}" --out "$1" 2>err.txt; rc=$?; set -e
    if [ $rc -eq 0 ]; then echo "resume over a damaged $2 succeeded"; cat err.txt; exit 1; fi
    grep -q "$2" err.txt || { echo "resume error does not name $2:"; cat err.txt; exit 1; }
    grep -q "eaglegen repair" err.txt || { echo "resume error does not point at repair:"; cat err.txt; exit 1; }
}
flip() { "$PYTHON" -c "
import os, sys
p = sys.argv[1]; n = os.path.getsize(p); off = n // 3
with open(p, 'r+b') as f:
    f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x10]))" "$1"; }

echo "-- a resume hashes only shards changed since they were hashed (stamps); a copy hashes all"
$E generate "${args[@]}" --out job 2>err.txt
grep -q "resuming: 6 committed shards intact (0 hashed" err.txt || { cat err.txt; exit 1; }
cp -r job copy
$E generate "${args[@]}" --out copy 2>err.txt
grep -q "resuming: 6 committed shards intact (6 hashed" err.txt || { cat err.txt; exit 1; }
$E generate "${args[@]}" --out copy 2>err.txt
grep -q "(0 hashed" err.txt || { cat err.txt; exit 1; }
rm copy/.stamps.manifest.json
$E generate "${args[@]}" --out copy 2>err.txt
grep -q "(6 hashed" err.txt || { cat err.txt; exit 1; }

echo "-- a flipped byte, a truncated shard, a deleted shard: resume refuses, naming each"
cp -r copy touched
$E generate "${args[@]}" --out touched 2>/dev/null   # its stamps now match its own files
cp -p touched/shard-000002.tar orig.tar
flip touched/shard-000002.tar; touch -r orig.tar touched/shard-000002.tar  # mtime put back: ctime still tells
refuse touched shard-000002.tar
cp -r job flip; flip flip/shard-000001.tar; refuse flip shard-000001.tar
cp -r job trunc; truncate -s -700 trunc/shard-000003.tar; refuse trunc shard-000003.tar
cp -r job del; rm del/shard-000004.tar; refuse del shard-000004.tar
# nothing was changed by the refusals
cmp flip/manifest.json job/manifest.json

echo "-- repair: all three damaged shards at once"
flip job/shard-000001.tar; truncate -s -700 job/shard-000003.tar; rm job/shard-000004.tar
$E repair job --dry-run > dry.txt
grep -q "3 damaged shards (12 samples) would be set aside" dry.txt || { cat dry.txt; exit 1; }
[ -f job/shard-000001.tar ] && [ ! -d job/quarantine ]
$E repair job > rep.txt
cat rep.txt
grep -q "3 damaged shards set aside" rep.txt
[ -f job/quarantine/shard-000001.tar ] && [ -f job/quarantine/shard-000003.tar ] && [ ! -e job/shard-000001.tar ]
"$PYTHON" - <<'PY'
import json
lines = [json.loads(l) for l in open("job/quarantine/repair.jsonl")]
got = {l["shard"]: l for l in lines}
assert sorted(got) == ["shard-000001.tar", "shard-000003.tar", "shard-000004.tar"], sorted(got)
assert got["shard-000001.tar"]["state"] == "checksum differs", got["shard-000001.tar"]
assert got["shard-000003.tar"]["state"] == "wrong size"
assert got["shard-000004.tar"]["state"] == "missing" and got["shard-000004.tar"]["ids"] is None
assert len(got["shard-000001.tar"]["ids"]) == 4, got["shard-000001.tar"]["ids"]
m = json.load(open("job/manifest.json"))
assert [s["file"] for s in m["shards"]] == ["shard-000000.tar", "shard-000002.tar", "shard-000005.tar"]
PY
$E inspect job --verify >/dev/null
$E repair job | grep -q "every shard of job is intact"

echo "-- the rerun makes exactly the 12 samples set aside; the dataset equals the uninterrupted run"
$E generate "${args[@]}" --out job 2>gen.txt
"$PYTHON" "$here/gen_check.py" same ref job
"$PYTHON" - <<'PY'
import json
a, b = json.load(open("ref/manifest.json")), json.load(open("job/manifest.json"))
ta = [sum(s[k] for s in a["shards"]) for k in ("samples", "tokens", "loss_tokens")]
tb = [sum(s[k] for s in b["shards"]) for k in ("samples", "tokens", "loss_tokens")]
assert ta == tb, (ta, tb)
ha = {k: v for k, v in a.items() if "hist" in k}
hb = {k: v for k, v in b.items() if "hist" in k}
assert ha and ha == hb, "loss-token histogram differs after repair and rerun"
assert a["counts"]["generated"] == b["counts"]["generated"], (a["counts"], b["counts"])
print("ok: totals, counts and histogram equal")
PY
grep -q "this run: 12 samples written, 12 already done" gen.txt || { echo "rerun did not make exactly 12 samples:"; cat gen.txt; exit 1; }
$E inspect job --verify >/dev/null

echo "-- two workers in one directory, merged: repair fixes both manifests; merge refuses until the rerun"
for w in 0 1; do $E generate "${args[@]}" --out shared --worker $w/2 2>/dev/null; done
$E merge shared --out shared 2>/dev/null
flip shared/shard-w1of2-000001.tar
refuse_w() {
    set +e; $E generate "${args[@]}" --out shared --worker 1/2 2>err.txt; rc=$?; set -e
    [ $rc -ne 0 ] && grep -q shard-w1of2-000001.tar err.txt || { echo "worker 1 resumed over a damaged shard"; cat err.txt; exit 1; }
}
refuse_w
$E repair shared > rep2.txt
cat rep2.txt
grep -q "1 damaged shard set aside" rep2.txt || { echo "want exactly 1 shard counted"; exit 1; }
grep -q "the same shard" rep2.txt
[ "$(wc -l < shared/quarantine/repair.jsonl)" = 1 ]
"$PYTHON" - <<'PY'
import json
for name in ("shared/manifest.json", "shared/manifest.w1of2.json"):
    m = json.load(open(name))
    assert "shard-w1of2-000001.tar" not in [s["file"] for s in m["shards"]], name
assert json.load(open("shared/manifest.w1of2.json"))["job"]["state"] == "repaired"
PY
$E inspect shared --verify >/dev/null
set +e; $E merge shared --out shared 2>err.txt; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "repaired" err.txt || { echo "merge accepted a repaired worker before its rerun"; cat err.txt; exit 1; }
$E generate "${args[@]}" --out shared --worker 1/2 2>/dev/null
$E merge shared --out shared 2>/dev/null
"$PYTHON" "$here/gen_check.py" same ref shared
$E inspect shared --verify >/dev/null
echo "-- a record edited, then its shard repaired and remade: later resumes check the remade sample"
cp corpus.jsonl ed.jsonl
eargs=(--model model --prompts ed.jsonl --max-new-tokens 12 --max-seq-len 128 --batch 4 --chunk 8 --shard-samples 4
       --aux-layers 1,2 --threads 1)
$E generate "${eargs[@]}" --out ed 2>/dev/null
sed -i 's/Record 5: say something about 15/Record 5: say something else about 15/' ed.jsonl
$E generate "${eargs[@]}" --out ed 2>err.txt
grep -q 'record "r5" differs' err.txt || { echo "the edit was not reported"; cat err.txt; exit 1; }
for f in ed/shard-*.tar; do flip "$f"; done
$E repair ed >/dev/null
$E generate "${eargs[@]}" --out ed 2>err.txt # every sample remade, r5 from the edited line
grep -q "this run: 24 samples written" err.txt || { cat err.txt; exit 1; }
$E generate "${eargs[@]}" --out ed 2>err.txt
! grep -q "differs" err.txt || { echo "a remade sample was reported as changed (the done log's first line won)"; cat err.txt; exit 1; }
echo "-- a deleted shard alone (nothing to move, so no quarantine/ yet): dropped, logged, remade"
$E generate "${args[@]}" --out del2 2>/dev/null
rm del2/shard-000002.tar
$E repair del2 > rep.txt 2>&1 || { echo "repair of a deleted shard failed:"; cat rep.txt; exit 1; }
grep -q '"shard":"shard-000002.tar","state":"missing"' del2/quarantine/repair.jsonl || { cat del2/quarantine/repair.jsonl; exit 1; }
$E generate "${args[@]}" --out del2 2>/dev/null
"$PYTHON" "$here/gen_check.py" same ref del2 >/dev/null
echo "t_gen_repair: ok"
