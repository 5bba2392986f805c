#!/usr/bin/env bash
# eaglegen merge (docs/FORMAT.md §8): merging again into an --out that holds an earlier
# merge (workers resumed in between); plain single-writer datasets (all start at
# shard-000000.tar); a failed merge leaves nothing behind, so a corrected retry works;
# shared sample ids are refused naming the id and both inputs; a different file under a
# shard's output name is a conflict, an identical one is not; an --out holding a single
# writer's dataset, or an earlier merge of other inputs, is refused (its manifest kept).
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=${EG_KEEP:-$(mktemp -d)}; [ -n "${EG_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 11 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
for n in "abc":
    with open(n + ".jsonl", "w") as f:
        for i in range(8):
            f.write(json.dumps({"prompt": f"{n} record {i}: say something about {i * 3}."}) + "\n")
PY
args=(--model model --max-new-tokens 8 --max-seq-len 128 --batch 4 --chunk 8 --shard-samples 2
      --aux-layers 1,2,3 --threads 2)
gen() { $E generate "${args[@]}" "$@" 2>/dev/null; }
fail() { echo "FAIL: $*"; exit 1; }
ntar() { find "$1" -maxdepth 1 -name '*.tar' 2>/dev/null | wc -l; }

echo "-- merge again into the same --out after a worker committed more shards"
gen --prompts a.jsonl --out rw0 --worker 0/2
gen --prompts a.jsonl --out rw1 --worker 1/2
# the state of worker 0 before its last shards were committed: a manifest listing only its
# first shard (test_dataset_writer's merge test does the same with a real resume)
cp rw0/manifest.w0of2.json full.json
"$PYTHON" - rw0/manifest.w0of2.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["shards"] = m["shards"][:1]
json.dump(m, open(sys.argv[1], "w"))
PY
$E merge rw0 rw1 --out rwm 2>/dev/null
"$PYTHON" "$here/gen_check.py" count rwm 6
cp full.json rw0/manifest.w0of2.json                    # worker 0 resumed and committed the rest
$E merge rw0 rw1 --out rwm || fail "second merge into rwm"
"$PYTHON" "$here/gen_check.py" count rwm 8
$E inspect rwm --verify >/dev/null
# a byte-identical copy under the output name is accepted, a different file is not
f=shard-w0of2-000000.tar
cp rw0/$f rwm/$f.copy && mv rwm/$f.copy rwm/$f
$E merge rw0 rw1 --out rwm 2>/dev/null || fail "identical copy refused"
cp rw1/shard-w1of2-000000.tar rwm/$f
if $E merge rw0 rw1 --out rwm 2>err; then fail "a different file of the same name was accepted"; fi
grep -q "$f" err || fail "conflict message: $(cat err)"
cp rw0/$f rwm/$f

echo "-- a worker manifest's name is manifest.w{digits}of{digits}.json, for C and Python alike"
# (the C reader's sscanf took "w+1of2" for worker 1; the Python loader did not)
cp -r rw0 wk && cp rw1/manifest.w1of2.json wk/manifest.w+1of2.json
$E inspect wk >wk.txt 2>&1 || fail "a dir with a misnamed manifest beside worker 0's: $(tail -1 wk.txt)"
c_n=$(sed -n 's/^  samples \([0-9]*\),.*/\1/p' wk.txt)
py_n=$("$PYTHON" -c "import sys; sys.path.insert(0, '$here/../dataset/python'); import eaglegen_data as g; print(len(g.EagleGenDataset('wk')))")
[ -n "$c_n" ] && [ "$c_n" = "$py_n" ] || fail "C reads $c_n samples, Python $py_n"

echo "-- two plain (single-writer) datasets"
gen --prompts a.jsonl --out A
gen --prompts b.jsonl --out B
$E merge A B --out M || fail "plain datasets"
$E inspect M --verify >/dev/null
"$PYTHON" "$here/gen_check.py" count M 16
# the merged dataset holds exactly the samples of A and B, bit for bit (Python loader)
"$PYTHON" - "$here/../dataset/python" M A B <<'PY'
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from eaglegen_data import EagleGenDataset
m = EagleGenDataset(sys.argv[2], as_torch=False)
n = 0
for d in sys.argv[3:]:
    x = EagleGenDataset(d, as_torch=False)
    for i in range(len(x)):
        sid = x.metadata(i)["id"]
        xa, xb = x[i], m.by_id(sid)
        for k in ("input_ids", "loss_mask", "hidden_states", "target_hidden_states"):
            assert np.array_equal(xa[k], xb[k]), (sid, k)
        n += 1
assert n == len(m), (n, len(m))
PY
$E merge A B --out M 2>/dev/null || fail "rerun of the plain merge"
"$PYTHON" "$here/gen_check.py" count M 16
# merging the merged dataset with another plain one (names stay unique)
gen --prompts c.jsonl --out C
$E merge M C --out MC || fail "merged + plain"
$E inspect MC --verify >/dev/null
"$PYTHON" "$here/gen_check.py" count MC 24

echo "-- an --out whose manifest.json would be lost is refused, unchanged"
# a single writer's dataset: the merge replaced its manifest (its shards unlisted) and a
# resume of its job then deleted them
cp -r A PO
cp PO/manifest.json po.before
if $E merge B --out PO 2>err; then fail "merge over a single writer's dataset accepted"; fi
grep -q "holds the dataset generate writes there" err || fail "refusal: $(cat err)"
cmp -s PO/manifest.json po.before || fail "the refused merge changed PO/manifest.json"
[ "$(ntar PO)" = "$(ntar A)" ] || fail "the refused merge left shards in PO"
if $E merge PO B --out PO 2>err; then fail "merge into a single writer's dataset given as input accepted"; fi
cmp -s PO/manifest.json po.before || fail "the refused merge changed PO/manifest.json"
# an earlier merge of other inputs: refused (it would unlist A's and B's shards); of the
# same DIRs (above) or of more (nothing dropped): accepted
cp M/manifest.json m.before
if $E merge C --out M 2>err; then fail "merge of other inputs over an earlier merge accepted"; fi
grep -q "holds an earlier merge" err && grep -q "would drop" err || fail "refusal: $(cat err)"
cmp -s M/manifest.json m.before || fail "the refused merge changed M/manifest.json"
$E merge A B C --out M || fail "a merge of more inputs (dropping nothing) over an earlier merge"
"$PYTHON" "$here/gen_check.py" count M 24
# a shard it would drop whose bytes in --out are damaged (repair set it aside in its
# worker's directory; the link in --out holds the damaged bytes) loses nothing: accepted
$E merge A B --out M3 2>/dev/null || fail "merge A B --out M3"
for f in M3/in1-*.tar; do rm "$f"; printf 'damaged' > "$f"; done  # B's links, B untouched
$E merge A --out M3 || fail "a merge dropping only damaged shards refused"
"$PYTHON" "$here/gen_check.py" count M3 8
$E inspect B --verify >/dev/null || fail "B was changed"

echo "-- a failed merge leaves nothing; the corrected retry works"
$E generate "${args[@]}" --aux-layers 1,2 --prompts c.jsonl --out X 2>/dev/null
if $E merge A B X --out F 2>err; then fail "incompatible inputs merged"; fi
[ "$(ntar F)" = 0 ] || fail "failed merge left $(ntar F) shard(s) in F"
[ ! -e F/manifest.json ] || fail "failed merge wrote a manifest"
$E merge A B --out F || fail "retry after a failed merge"
"$PYTHON" "$here/gen_check.py" count F 16
# into an existing directory: the shards it already had stay, no new ones remain
mkdir G && echo keep >G/other.txt
if $E merge rw0 rw1 X --out G 2>/dev/null; then fail "incompatible inputs merged"; fi
[ "$(ntar G)" = 0 ] && [ -f G/other.txt ] || fail "failed merge into G: $(ls G)"

echo "-- the same job twice is refused naming both; shared sample ids too, naming the id and both inputs"
gen --prompts a.jsonl --out A2
if $E merge A A2 --out D 2>err; then fail "the same job merged twice"; fi
grep -q "appears twice: A/manifest.json and A2/manifest.json" err || fail "same job twice: $(cat err)"
grep -q "merge: merge:" err && fail "doubled prefix: $(cat err)"
[ ! -e D ] || [ "$(ntar D)" = 0 ] || fail "refused merge left shards in D"
# two different corpora whose records carry the same explicit ids
"$PYTHON" - <<'PY'
import json
for n in "pq":
    with open(n + ".jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"rec-{i}", "prompt": f"{n} {i}: say something."}) + "\n")
PY
gen --prompts p.jsonl --out P
gen --prompts q.jsonl --out Q
if $E merge P Q --out D 2>err; then fail "duplicate ids merged"; fi
grep -q "sample id rec-0 is in two inputs: P " err && grep -q " and Q " err || fail "duplicate id message: $(cat err)"
grep -q "merge: merge:" err && fail "doubled prefix: $(cat err)"
[ ! -e D ] || [ "$(ntar D)" = 0 ] || fail "refused merge left shards in D"
echo "t_dataset_merge: ok"
