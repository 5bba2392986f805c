#!/usr/bin/env bash
# Resume allows what leaves samples as they are (issue 20): --limit raised, another
# --shard-samples, the corpus reached by another path, an input added at the end, a bad
# line fixed after an error stop; each gives exactly the dataset of one uninterrupted run.
# What changes samples (temperature, seed, ...) is refused with the differences, floats as
# typed; --restart starts over; a changed record with a done id is reported; N > 1
# workers refuse an input change that renumbers records. Another checkpoint of the same
# config and size is refused (the weights by content); capture mode accepts changes of the
# options it ignores; --log-json ends with how the run ended and a bad path is refused
# before anything is made.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=${EG_KEEP:-$(mktemp -d)}; [ -n "${EG_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 11 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
def write(name, n, start=0, bad=None):
    with open(name, "w") as f:
        for i in range(start, start + n):
            f.write('{"prompt": 5\n' if i == bad else json.dumps({"prompt": f"Record {i}: about {i * 7}."}) + "\n")
write("c.jsonl", 10)
write("e.jsonl", 4, start=100)
write("bad.jsonl", 8, bad=5)
write("fixed.jsonl", 8)
# over 2 MiB, the bad line in neither the first nor the last MiB (what the input's
# fingerprint hashes), and fixed in place at the same size: only the ledger's line hash
# can see the fix (DS-2)
pad = "p" * (1200 * 1024)
def write_big(name, fixed):
    with open(name, "w") as f:
        f.write(json.dumps({"id": "head", "prompt": "Head record.", "meta": pad}) + "\n")
        for i in range(1, 4): f.write(json.dumps({"prompt": f"Record {i}: about {i * 7}."}) + "\n")
        f.write('{"prompt": "1234"}\n' if fixed else '{"prompt": "12345"\n')
        for i in range(5, 7): f.write(json.dumps({"prompt": f"Record {i}: about {i * 7}."}) + "\n")
        f.write(json.dumps({"id": "tail", "prompt": "Tail record.", "meta": pad}) + "\n")
write_big("bigbad.jsonl", False)
write_big("bigfixed.jsonl", True)
import os
assert os.path.getsize("bigbad.jsonl") == os.path.getsize("bigfixed.jsonl") > 2 << 20
PY
mkdir sub && cp c.jsonl sub/
args=(--model model --max-new-tokens 6 --max-seq-len 128 --batch 3 --chunk 8 --aux-layers 1,2,3 --threads 1)
gen() { $E generate "${args[@]}" "$@"; }
fail() { echo "FAIL: $*"; [ -f err ] && cat err; exit 1; }

gen --prompts c.jsonl --out ref 2>/dev/null
gen --prompts c.jsonl e.jsonl --out ref2 2>/dev/null

echo "-- --limit 3, then the full run, another --shard-samples, another path"
gen --prompts c.jsonl --out j --limit 3 --shard-samples 2 2>/dev/null
"$PYTHON" "$here/gen_check.py" count j 3
gen --prompts c.jsonl --out j --shard-samples 4 2>err || fail "the full run after --limit 3 was refused"
grep -q "limit: 3 -> -1" err && grep -q "shard_samples: 2 -> 4" err || fail "accepted changes not listed"
grep -q "7 samples written, 3 already done" err || fail "resume did not skip the done ids"
"$PYTHON" "$here/gen_check.py" same ref j
(cd sub && $E generate "${args[@]}" --model ../model --prompts ../sub/../c.jsonl --out ../j 2>../err) \
    || fail "the same corpus by another relative path was refused"
grep -q "reached by another path" err && grep -q "0 samples written, 10 already done" err || fail "path change"
"$PYTHON" "$here/gen_check.py" same ref j

echo "-- an input added at the end"
gen --prompts c.jsonl e.jsonl --out j 2>err || fail "an added input was refused"
grep -q "1 file added at the end" err && grep -q "4 samples written, 10 already done" err || fail "added input"
"$PYTHON" "$here/gen_check.py" same ref2 j

echo "-- a --limit that covers the whole corpus leaves the job complete, one short of it does not"
gen --prompts c.jsonl --out l10 --limit 10 2>/dev/null
gen --prompts c.jsonl --out l9 --limit 9 2>/dev/null
"$PYTHON" - <<'PY'
import json
s10, s9 = (json.load(open(d + "/manifest.json"))["job"]["state"] for d in ("l10", "l9"))
assert (s10, s9) == ("complete", "limit"), (s10, s9)
PY

echo "-- a bad line fixed after an error stop"

cp bad.jsonl in.jsonl
if gen --prompts in.jsonl --out fj 2>err; then fail "the bad line did not stop the run"; fi
grep -q "in.jsonl:6: bad record" err || fail "bad record message"
cp fixed.jsonl in.jsonl
gen --prompts in.jsonl --out fj 2>err || fail "the fixed corpus was refused"
# ids are FILE:LINE: compare against a reference made from a file of the same name
mkdir r && cp fixed.jsonl r/in.jsonl && (cd r && $E generate "${args[@]}" --model ../model --prompts in.jsonl \
    --out ../fref3 2>/dev/null)
"$PYTHON" "$here/gen_check.py" same fref3 fj
# skipped bad records, then the line fixed: the ledger is rebuilt, the record is made
cp bad.jsonl in2.jsonl
gen --prompts in2.jsonl --out sj --on-bad-record skip 2>/dev/null
grep -q '"outcome":"rejected"' sj/rejects.jsonl || fail "no reject logged"
cp fixed.jsonl in2.jsonl
gen --prompts in2.jsonl --out sj 2>err || fail "fixed after skip"
grep -q "set aside as rejects.jsonl.1" err || fail "the ledger was not set aside"
"$PYTHON" "$here/gen_check.py" count sj 8

echo "-- a bad line fixed in place, same size, mid-file in a corpus over 2 MiB (DS-2)"
cp bigbad.jsonl in3.jsonl
gen --prompts in3.jsonl --out bj --on-bad-record skip 2>/dev/null
grep -q '"outcome":"rejected".*"line_hash":"[0-9a-f]\{16\}"' bj/rejects.jsonl || fail "no line hash logged"
cp bigfixed.jsonl in3.jsonl
gen --prompts in3.jsonl --out bj 2>err || fail "fixed in place refused"
grep -q 'in3.jsonl:5: record "in3.jsonl:5" changed since the ledger logged it' err &&
    grep -q "1 record logged in rejects.jsonl changed since and was read again" err || fail "the fix was not seen"
grep -q '"outcome":"cleared"' bj/rejects.jsonl || fail "no cleared line"
cp bigfixed.jsonl in3.jsonl
mkdir b && cp bigfixed.jsonl b/in3.jsonl && (cd b && $E generate "${args[@]}" --model ../model --prompts in3.jsonl \
    --out ../bref 2>/dev/null)
"$PYTHON" "$here/gen_check.py" same bref bj
# a resume reads the cleared line back: nothing new, nothing rejected
gen --prompts in3.jsonl --out bj 2>err || fail "second resume"
grep -q "0 samples written, 8 already done.*rejected 0," err || fail "second resume counts"
! grep -q "changed since the ledger" err || fail "a cleared entry came back"
# broken again, differently: logged again, once
sed -i 's/{"prompt": "1234"}/{"prompt": "1234"]/' in3.jsonl
gen --prompts in3.jsonl --out bj --on-bad-record skip 2>err || fail "broken again"
[ "$(grep -c '"outcome":"rejected"' bj/rejects.jsonl)" = 2 ] && grep -q "rejected 1," err || fail "re-broken line not logged once"

echo "-- what changes samples is refused, floats as typed"
set +e; gen --prompts c.jsonl --out j --temperature 0.7 --seed 3 2>err; rc=$?; set -e
[ $rc = 1 ] || fail "temperature change: exit $rc"
grep -q "temperature: 1 -> 0.7$" err && grep -q "seed: 0 -> 3" err && grep -q -- "--restart" err || fail "diff"
set +e; gen --prompts c.jsonl --out j --top-p 0.9 2>err; rc=$?; set -e
[ $rc = 1 ] && grep -q "top_p: 0.95 -> 0.9$" err || fail "top-p diff not as typed"

echo "-- another checkpoint of the same config and size is refused (a fine-tune: other bytes)"
$E mkmodel --preset tiny --out model12 --seed 12 >/dev/null 2>&1
cp model/config.json model12/config.json
mkdir -p mv && cp -r model mv/model
[ "$(du -b model12/*.safetensors | cut -f1)" = "$(du -b model/*.safetensors | cut -f1)" ] || fail "the two models differ in size"
gen --prompts c.jsonl --out fm --limit 3 2>/dev/null
set +e; $E generate "${args[@]}" --model model12 --prompts c.jsonl --out fm 2>err; rc=$?; set -e
[ $rc = 1 ] || fail "another model's weights resumed: exit $rc"
grep -q "fingerprints.model_weights" err && grep -q -- "--restart" err || fail "weights diff not named"
$E generate "${args[@]}" --model mv/model --prompts c.jsonl --out fm 2>err || fail "the same model moved was refused"
"$PYTHON" "$here/gen_check.py" same ref fm
"$PYTHON" - fm/job.json <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["fingerprints"]["model_weights"]
assert w and all(set(f) == {"path", "size", "sha256_head_tail"} and "/" not in f["path"] for f in w), w
PY
echo "-- a job written before the weights were fingerprinted resumes as before"
gen --prompts c.jsonl --out old --limit 3 2>/dev/null
"$PYTHON" - old/job.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); del j["fingerprints"]["model_weights"]; json.dump(j, open(sys.argv[1], "w"))
PY
gen --prompts c.jsonl --out old 2>err || fail "an older job without model_weights was refused"
"$PYTHON" "$here/gen_check.py" same ref old

echo "-- capture mode: the sampling options it ignores may change on resume"
"$PYTHON" - <<'PY'
import json
with open("conv.jsonl", "w") as f:
    for i in range(5):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"Add {i} and 2."},
                                         {"role": "assistant", "content": f"{i + 2}."}]}) + "\n")
PY
gen --prompts conv.jsonl --mode capture --out capref 2>/dev/null
gen --prompts conv.jsonl --mode capture --out capj --limit 2 2>/dev/null
gen --prompts conv.jsonl --mode capture --out capj --max-new-tokens 5 --temperature 0.3 --top-p 0.5 --top-k 4 \
    --drop-truncated 2>err || fail "capture resume with ignored options refused"
grep -q "max_new_tokens: 6 -> 5" err && grep -q "temperature: 1 -> 0.3" err || fail "capture changes not listed"
"$PYTHON" "$here/gen_check.py" same capref capj
set +e; gen --prompts conv.jsonl --mode capture --out capj --seed 9 2>err; rc=$?; set -e
[ $rc = 1 ] && grep -q "seed: 0 -> 9" err || fail "capture: a seed change (recorded per sample) accepted: exit $rc"

echo "-- --restart starts over"
gen --prompts c.jsonl --out j --temperature 0.7 --restart 2>err || fail "--restart"
grep -q "removed .* shards" err || fail "restart did not say what it removed"
"$PYTHON" "$here/gen_check.py" count j 10
"$PYTHON" - j <<'PY'
import json, sys
job = json.load(open(sys.argv[1] + "/job.json"))
assert abs(job["params"]["temperature"] - 0.7) < 1e-12, job["params"]
m = json.load(open(sys.argv[1] + "/manifest.json"))
assert m["job"]["state"] == "complete", m["job"].get("state")
assert m["job"]["eaglegen_versions"], m["job"]
PY
[ -z "$(ls j/*.tar.tmp 2>/dev/null)" ] && [ "$(ls j/*.tar | wc -l)" -ge 1 ] || fail "shards after restart"

gen --prompts c.jsonl --out fresh --restart 2>err || fail "--restart on a new --out"
"$PYTHON" "$here/gen_check.py" same ref fresh

echo "-- a changed record with a done id is reported"
cp c.jsonl cc.jsonl
gen --prompts cc.jsonl --out cj 2>/dev/null
sed -i 's/Record 4: about 28/Record 4: about 29/' cc.jsonl
gen --prompts cc.jsonl --out cj 2>err || fail "edited corpus refused"
grep -q 'cc.jsonl:5: record "cc.jsonl:5" differs' err && grep -q "1 record with a done id changed" err \
    || fail "changed record not reported"

echo "-- workers: an appended input is fine, a renumbering change is refused"
cp c.jsonl w.jsonl
for w in 0 1; do gen --prompts w.jsonl --out wj --worker $w/2 2>/dev/null; done
for w in 0 1; do gen --prompts w.jsonl e.jsonl --out wj --worker $w/2 2>/dev/null || fail "worker $w: appended"; done
$E merge wj --out wj 2>/dev/null
"$PYTHON" "$here/gen_check.py" count wj 14
sed -i '3d' w.jsonl
if gen --prompts w.jsonl e.jsonl --out wj --worker 0/2 2>err; then fail "renumbered inputs accepted by a worker"; fi
grep -q "renumbers the records" err || fail "renumbering message"
echo "-- --log-json lines carry time, worker, phase and counts; the run ends with a summary"
gen --prompts c.jsonl e.jsonl --out lj --log-json lj.log 2>err || fail "log run"
grep -q "summary: .* s wall, 14 samples, .* tokens .* GB written, 0 rejected/dropped/duplicate" err || fail "summary"
"$PYTHON" - lj.log <<'PY'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines and lines[-1]["phase"] == "done", lines[-1:]
for l in lines:
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", l["time"]), l
    assert l["worker"] == "0/1" and "records_skipped" in l and "rejected" in l, l
assert lines[-1]["samples"] == 14 and lines[-1]["records_done"] == 14, lines[-1]
PY
echo "-- a run stopped by a bad record ends its log with phase error"
if gen --prompts bad.jsonl --out le --log-json le.log 2>err; then fail "the bad line did not stop the run"; fi
"$PYTHON" - le.log <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines and lines[-1]["phase"] == "error", lines[-1:]
PY
echo "-- a --log-json path that cannot be written is refused before anything is made"
if gen --prompts c.jsonl --out lbad --log-json nodir/x.log 2>err; then fail "a log in a missing directory accepted"; fi
grep -q -- "--log-json nodir/x.log: nodir: No such file or directory" err || fail "log path message"
[ ! -e lbad ] || fail "a refused --log-json left a job directory"
gen --prompts c.jsonl --out lin --log-json lin/log.jsonl 2>/dev/null || fail "a log inside --out refused"
[ -s lin/log.jsonl ] || fail "no log inside --out"
echo "t_gen_resume_changes: ok"
