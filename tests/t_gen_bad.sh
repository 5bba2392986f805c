#!/usr/bin/env bash
# generate on awkward corpora and job directories: repeated ids are duplicates (never
# "already done") under --on-bad-record; a refused start leaves no job.json and no empty
# --out behind; skip mode logs binary / invalid UTF-8 lines; > 4096 prompt paths; the
# policy may change on resume; empty / NUL ids are bad records; --model dir/ names the
# model dir; a relative or absolute corpus path resumes the same job; a damaged ledger
# line is an error (not a truncation); strict --seed and --aux-layers.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; [ -f err ] && cat err; exit 1; }
expect() { # expected-status command...
    local want=$1; shift
    set +e; "$@" >out 2>err; local rc=$?; set -e
    [ $rc -eq "$want" ] || fail "expected exit $want, got $rc: $*"
}
$E mkmodel --preset tiny --out model --seed 5 >/dev/null 2>&1
args=(--model model --max-new-tokens 3 --max-seq-len 128 --batch 4 --chunk 16 --aux-layers 1,2 --threads 1)
"$PYTHON" - <<'PY'
import json
for name in ("a.jsonl", "b.jsonl"):
    with open(name, "w") as f:
        for i in range(50): f.write(json.dumps({"id": i, "prompt": f"{name} record {i}"}) + "\n")
with open("ok.jsonl", "w") as f:
    for i in range(6): f.write(json.dumps({"id": f"r{i}", "prompt": f"record {i}"}) + "\n")
PY
nrej() { if [ -f "$1/rejects.jsonl" ]; then wc -l < "$1/rejects.jsonl"; else echo 0; fi; }

echo "-- 1. repeated ids: error names file:line; skip logs every duplicate"
expect 1 $E generate "${args[@]}" --prompts a.jsonl b.jsonl --out dup_err
grep -q "b.jsonl:1: bad record: duplicate id" err || fail "no duplicate-id error at b.jsonl:1"
expect 0 $E generate "${args[@]}" --prompts a.jsonl b.jsonl --out dup --on-bad-record skip
"$PYTHON" "$here/gen_check.py" count dup 50
[ "$(grep -c '"outcome":"duplicate"' dup/rejects.jsonl)" -eq 50 ] || fail "want 50 duplicates logged, have $(nrej dup)"
grep -q "0 already done" err || fail "a fresh run reports ids already done"
expect 0 $E generate "${args[@]}" --prompts a.jsonl b.jsonl --out dup --on-bad-record skip
grep -q "50 already done" err || fail "the rerun does not resume the 50 samples"
[ "$(nrej dup)" -eq 50 ] || fail "the rerun changed the ledger"

echo "-- 2. refused starts leave nothing behind"
expect 1 $E generate "${args[@]}" --model nomodel --prompts ok.jsonl --out empty_out
[ ! -e empty_out ] || fail "a failed model load left $tmp/empty_out behind"
expect 1 $E generate "${args[@]}" --prompts ok.jsonl --out refused --stages 99
[ ! -e refused/job.json ] || fail "a refused start wrote job.json"
expect 0 $E generate "${args[@]}" --prompts ok.jsonl --out refused --seed 3
"$PYTHON" "$here/gen_check.py" count refused 6
expect 0 $E generate "${args[@]}" --prompts ok.jsonl --out newdir --log-json newdir/progress.jsonl --limit 1
[ -s newdir/progress.jsonl ] || fail "--log-json inside a new --out"

echo "-- 3. skip mode logs invalid UTF-8 and binary lines"
{ echo '{"id": "g1", "prompt": "fine"}'; printf '{"id": "x", "prompt": "bad \xff\xfe byte"}\n';
  head -c 300 /dev/urandom | tr -d '\n\000'; echo; echo '{"id": "g2", "prompt": "fine too"}'; } > bin.jsonl
expect 0 $E generate "${args[@]}" --prompts bin.jsonl --out bin --on-bad-record skip
"$PYTHON" "$here/gen_check.py" count bin 2
[ "$(grep -c '"outcome":"rejected"' bin/rejects.jsonl)" -eq 2 ] || fail "want 2 rejected lines"
"$PYTHON" -c 'import json,sys; [json.loads(l)["raw"] for l in open(sys.argv[1])]' bin/rejects.jsonl
grep -q 'bad \\\\xFF\\\\xFE byte' bin/rejects.jsonl || fail "raw line not escaped as \\xFF"

echo "-- 4. more than 4096 prompt paths"
mkdir many
"$PYTHON" - <<'PY'
import json
for i in range(4100):
    with open(f"many/p{i:05d}.jsonl", "w") as f: f.write(json.dumps({"id": f"p{i}", "prompt": "hi"}) + "\n")
PY
expect 0 $E generate "${args[@]}" --limit 0 --prompts many/p*.jsonl --out many_out
[ "$("$PYTHON" -c 'import json; print(len(json.load(open("many_out/job.json"))["fingerprints"]["inputs"]))')" -eq 4100 ] \
    || fail "prompt paths beyond 4096 were dropped"

echo "-- 5. the bad-record policy may change on resume, and is recorded"
printf '{"id": "k0", "prompt": "a"}\nnot json\n{"id": "k1", "prompt": "b"}\n' > pol.jsonl
expect 1 $E generate "${args[@]}" --prompts pol.jsonl --out pol
grep -q "pol.jsonl:2: bad record" err || fail "no bad record error"
expect 0 $E generate "${args[@]}" --prompts pol.jsonl --out pol --on-bad-record skip
"$PYTHON" "$here/gen_check.py" count pol 2
grep -q '"on_bad_record": "skip"' pol/job.json || fail "job.json does not record the new policy"

echo "-- 6. empty and NUL ids are bad records with a location"
printf '{"id": "", "prompt": "a"}\n{"id": "a\\u0000b", "prompt": "b"}\n{"id": "c", "prompt": "c"}\n' > ids.jsonl
expect 1 $E generate "${args[@]}" --prompts ids.jsonl --out ids_err
grep -q 'ids.jsonl:1: bad record: "id" is empty' err || fail "empty id not reported at ids.jsonl:1"
expect 0 $E generate "${args[@]}" --prompts ids.jsonl --out ids --on-bad-record skip
"$PYTHON" "$here/gen_check.py" count ids 1
grep -q '"line":2,.*NUL' ids/rejects.jsonl || fail "NUL id not rejected at line 2"

echo "-- 7. --model dir/ and --model dir name the same model; the workers merge"
a2=("${args[@]:2}")
expect 0 $E generate --model model/ "${a2[@]}" --prompts ok.jsonl --out mw --worker 0/2
expect 0 $E generate --model model "${a2[@]}" --prompts ok.jsonl --out mw --worker 1/2
[ "$("$PYTHON" -c 'import json; print(json.load(open("mw/manifest.w0of2.json"))["model"]["name"])')" = model ] \
    || fail "model name with a trailing slash"
expect 0 $E merge mw --out mw

echo "-- 8. resume does not depend on how the corpus path is spelled"
expect 0 $E generate "${args[@]}" --prompts ok.jsonl --out sp --limit 3
expect 0 $E generate "${args[@]}" --prompts "$tmp/ok.jsonl" --out sp --limit 3
grep -q "3 already done" err || fail "absolute path did not resume"

echo "-- 9. a damaged ledger line is an error naming path:line, nothing is truncated"
cp -r bin bin2
"$PYTHON" - <<'PY'
import json
L = open("bin2/rejects.jsonl").read().splitlines()
j = json.loads(L[0]); j["index"] = str(j["index"]); L[0] = json.dumps(j)
open("bin2/rejects.jsonl", "w").write("\n".join(L) + "\n")
PY
before=$(wc -l < bin2/rejects.jsonl)
expect 1 $E generate "${args[@]}" --prompts bin.jsonl --out bin2 --on-bad-record skip
grep -q "rejects.jsonl:1:" err || fail "damaged ledger line not reported"
[ "$(wc -l < bin2/rejects.jsonl)" -eq "$before" ] || fail "ledger lines were deleted"
printf '{"index": 9' >> bin2/rejects.jsonl   # a torn last line is dropped quietly
"$PYTHON" - <<'PY'
L = open("bin2/rejects.jsonl").read().split("\n")
import json; j = json.loads(L[0]); j["index"] = int(j["index"]); L[0] = json.dumps(j)
open("bin2/rejects.jsonl", "w").write("\n".join(L))
PY
expect 0 $E generate "${args[@]}" --prompts bin.jsonl --out bin2 --on-bad-record skip
[ "$(wc -l < bin2/rejects.jsonl)" -eq 2 ] || fail "torn tail handling"

echo "-- 10. strict --seed and --aux-layers"
expect 2 $E generate "${args[@]}" --prompts ok.jsonl --out s1 --seed ' -5'
expect 2 $E generate "${args[@]}" --prompts ok.jsonl --out s1 --seed 18446744073709551615
expect 2 $E generate "${args[@]}" --prompts ok.jsonl --out s1 --aux-layers 1,1
# aux layers out of order would be stored in that order and read by position (issue 18)
$E generate "${args[@]}" --prompts ok.jsonl --out s1 --aux-layers 3,1,2 2> aux.err && fail "--aux-layers 3,1,2 accepted"
grep -q "ascending and distinct (out of order: 1 after 3)" aux.err || fail "--aux-layers 3,1,2: $(cat aux.err)"
expect 0 $E generate "${args[@]}" --prompts ok.jsonl --out s1 --seed 9223372036854775807 --limit 1
grep -q '"seed": 9223372036854775807' s1/job.json || fail "seed not stored losslessly"

echo "-- 11. killed after job.json, before the first manifest: the next run resumes"
mkdir g1
cp s1/job.json g1/
expect 0 $E generate "${args[@]}" --prompts ok.jsonl --out g1 --seed 9223372036854775807 --limit 1
$E inspect g1 --verify > out 2>&1 || fail "resumed job does not verify"
echo "-- 12. Ctrl-C while reading an idle stdin stops the run (it waited for the producer)"
{ echo '{"id": "s1", "prompt": "one"}'; exec sleep 61.25; } 2>/dev/null | $E generate "${args[@]}" --prompts - --out st1 > out 2> err &
gpid=$!
for _ in $(seq 100); do grep -q "starting" err 2>/dev/null && break; sleep 0.1; done
sleep 1
pkill -INT -f -- "eaglegen generate.*--out st1" || true
for _ in $(seq 150); do pgrep -f -- "eaglegen generate.*--out st1" >/dev/null || break; sleep 0.1; done
pgrep -f -- "eaglegen generate.*--out st1" >/dev/null && { pkill -KILL -f -- "eaglegen generate.*--out st1"; fail "generate hung on stdin after SIGINT"; }
grep -q "interrupted" err || fail "no interrupted message"
pkill -f "sleep 61.25" 2>/dev/null || true  # the idle producer
wait $gpid 2>/dev/null || true
echo "-- 13. a dataset of only rejected records: vocab refuses it (it wrote ids 0..N-1 with nothing behind them)"
echo '{"input_ids": [99999999]}' > rej.jsonl
expect 0 $E generate "${args[@]}" --prompts rej.jsonl --out rej --on-bad-record skip
expect 1 $E vocab rej --draft-vocab 10 --out rejv
grep -q "no loss-masked tokens" err || fail "vocab of an empty dataset: $(cat err)"
[ ! -e rejv ] || fail "vocab of an empty dataset wrote rejv"
echo "-- 14. --max-seq-len past the model's max_position_embeddings is said at the start"
expect 0 $E generate "${args[@]/128/8000}" --prompts rej.jsonl --out mpos --on-bad-record skip
grep -q "past the model's max_position_embeddings 4096" err || fail "no note for --max-seq-len 8000: $(cat err)"
echo "t_gen_bad: ok"
