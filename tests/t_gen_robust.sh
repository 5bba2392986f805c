#!/usr/bin/env bash
# What fuzzing and fault injection found (issue 22), one check each:
#  1. a model directory whose name is not UTF-8: the manifest keeps its "model" key
#     (escaped), so inspect --verify, vocab and resume accept the dataset;
#  2. a corpus file whose name is not UTF-8: generate works (no "out of memory"), ids,
#     source_file and the job file hold the escaped name, resume matches;
#  4. SIGTERM while the model is still loading exits 130, not 143;
#  5. an unreadable job.json or dataset directory is reported as unreadable;
#  6. a UTF-8 byte-order mark at the start of a corpus is skipped.
# (3, the record codec refusing what its decoder refuses, is in tests/test_dataset_codec.c.)
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }
$E mkmodel --preset tiny --out model --seed 5 >/dev/null 2>&1
printf '{"prompt": "Say one word."}\n{"prompt": "Count to three."}\n{"prompt": "Name a colour."}\n' > corpus.jsonl
args=(--max-new-tokens 6 --max-seq-len 128 --threads 1 --aux-layers 1,2,3)

echo "-- 1: model directory name not UTF-8"
bad_model=$'mod\xe9le'
cp -r model "$bad_model"
$E generate --model "$bad_model" --prompts corpus.jsonl --out d1 "${args[@]}" 2>/dev/null
"$PYTHON" - d1/manifest.json <<'PY' || fail "manifest lost its model key"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["model"]["name"] == "mod\\xE9le", m.get("model")
PY
$E inspect d1 --verify >/dev/null || fail "inspect --verify refused the dataset"
$E vocab d1 --draft-vocab 16 --out d1v >/dev/null 2>&1 || fail "vocab refused the dataset"
$E generate --model "$bad_model" --prompts corpus.jsonl --out d1 "${args[@]}" 2>err1 || { cat err1; fail "resume refused"; }
"$PYTHON" "$here/gen_check.py" count d1 3

echo "-- 2: corpus file name not UTF-8"
bad_corpus=$'corp\xff.jsonl'
printf '{"prompt": "Say one word."}\n{"prompt": "Count to three."}\n' > "$bad_corpus"
$E generate --model model --prompts "$bad_corpus" --out d2 "${args[@]}" 2>err2 || { cat err2; fail "generate failed"; }
grep -q "out of memory" err2 && fail "reported as out of memory"
$E inspect d2 --verify >/dev/null || fail "inspect --verify refused the dataset"
HERE=$here "$PYTHON" - d2 <<'PY' || fail "escaped file name not stored"
import json, os, sys
sys.path.insert(0, os.environ["HERE"] + "/../dataset/python")
from eaglegen_data import EagleGenDataset
ds = EagleGenDataset(sys.argv[1], as_torch=False)
ids = sorted(ds.metadata(i)["id"] for i in range(len(ds)))
assert ids == ["corp\\xFF.jsonl:1", "corp\\xFF.jsonl:2"], ids
assert all(ds.metadata(i)["source_file"] == "corp\\xFF.jsonl" for i in range(len(ds)))
job = json.load(open(sys.argv[1] + "/job.json"))
assert job["fingerprints"]["inputs"][0]["path"] == "corp\\xFF.jsonl", job["fingerprints"]
PY
$E generate --model model --prompts "$bad_corpus" --out d2 "${args[@]}" 2>err2 || { cat err2; fail "resume refused"; }
"$PYTHON" "$here/gen_check.py" count d2 2

echo "-- 4: SIGTERM during the model load exits 130"
# config.json as a FIFO nobody writes: the load blocks in open() until the signal
mkdir slow_model
cp model/* slow_model/ && rm slow_model/config.json && mkfifo slow_model/config.json
for sig in TERM INT; do
    $E generate --model slow_model --prompts corpus.jsonl --out d4 "${args[@]}" 2>err4 &
    pid=$!
    for _ in $(seq 1 50); do # wait until it sits in the load (its open of the FIFO)
        [ -n "$(ls -l /proc/$pid/fd 2>/dev/null | grep config.json)" ] && break
        grep -q wait_for_partner "/proc/$pid/wchan" 2>/dev/null && break
        sleep 0.1
    done
    kill -$sig $pid
    # a build that ignores the signal is killed after 10 s. No watchdog subshell to kill
    # afterwards: a signal that reaches a just-forked subshell before bash has reset its
    # traps runs this script's EXIT trap there, deleting $tmp under the running test.
    timeout 10 tail --pid=$pid -f /dev/null || kill -9 $pid 2>/dev/null || true
    set +e; wait $pid; rc=$?; set -e
    [ $rc -eq 130 ] || { cat err4; fail "SIG$sig during the model load: exit status $rc (expected 130)"; }
done

echo "-- 5: unreadable job file and dataset directory"
mkdir -p d5/job.json # a job.json that cannot be read as a file
set +e; $E generate --model model --prompts corpus.jsonl --out d5 "${args[@]}" 2>err5; rc=$?; set -e
[ $rc -eq 1 ] || fail "exit status $rc with an unreadable job.json"
grep -q ":-1:" err5 && { cat err5; fail "unreadable job.json reported with line -1"; }
grep -q "cannot read the job file" err5 || { cat err5; fail "unreadable job.json not reported as unreadable"; }
cp -r d1 d5ds
chmod 000 d5ds
as_user=()
if [ "$(id -u)" -eq 0 ]; then
    # root reads a mode-000 directory anyway; run the check as nobody where possible
    if command -v setpriv >/dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
        as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
        chmod 755 "$tmp"
    else
        as_user=(SKIP)
    fi
fi
if [ "${as_user[*]:-}" = SKIP ]; then
    echo "  SKIP mode-000 dataset directory: running as root without setpriv"
else
    set +e; ${as_user[@]+"${as_user[@]}"} $E inspect d5ds 2>err5b >/dev/null; rc=$?; set -e
    [ $rc -ne 0 ] || fail "inspect read a mode-000 directory"
    grep -q "not a dataset" err5b && { cat err5b; fail "a mode-000 dataset directory called 'not a dataset'"; }
    grep -q "Permission denied" err5b || { cat err5b; fail "no permission message"; }
fi
chmod 755 d5ds

echo "-- 6: byte-order mark at the start of a corpus"
printf '\xef\xbb\xbf{"prompt": "Say one word."}\r\n{"prompt": "Count to three."}\r\n' > bom.jsonl
$E generate --model model --prompts bom.jsonl --out d6 "${args[@]}" 2>err6 || { cat err6; fail "BOM corpus failed"; }
"$PYTHON" "$here/gen_check.py" count d6 2
printf '{"prompt": "Say one word."}\n{"prompt": "Count to three."}\n' > nobom.jsonl
$E tokenize --tokenizer model bom.jsonl > t_bom.jsonl 2>/dev/null
$E tokenize --tokenizer model nobom.jsonl > t_nobom.jsonl 2>/dev/null
sed 's/bom\.jsonl//; s/nobom\.jsonl//' t_bom.jsonl > a.txt
sed 's/bom\.jsonl//; s/nobom\.jsonl//' t_nobom.jsonl > b.txt
cmp -s a.txt b.txt || fail "a BOM changes the tokens of line 1"
echo "ok"
