#!/usr/bin/env bash
# `eaglegen export --to speculators` (issue 18), checked without torch/pyarrow/datasets by
# tests/speculators_export_check.py (Arrow stream and safetensors parsed by hand):
# - a generated dataset (8-layer model, aux layers 1,3,4, both final states) exported whole,
#   cut (--max-len, with rows left without a supervised token dropped as prepare-data drops
#   them), with a small draft vocabulary, and split into several Arrow shards / batches:
#   every tensor equals eaglegen's reader, the last hidden plane is the PRE-norm state,
#   ids are k + 1, d2t/t2d follow speculators' own rule;
# - a pre-norm-only dataset exports the same bits; post-norm-only, a v1 manifest, a single
#   shard and a non-empty output directory are refused with the reason;
# - kill -9 mid-export leaves only whole files (no loadable dataset, every hs_*.safetensors
#   complete), and the output directory is not silently reused.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
CHECK="$PYTHON $here/speculators_export_check.py"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }
$E mkmodel --preset tiny --layers 8 --out model --seed 3 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
with open("c.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Question {i}: {'why ' * (i % 9)}?"}]}) + "\n")
PY
gen() { # OUT EXTRA...
    local o=$1; shift
    $E generate --model model --prompts c.jsonl --out "$o" --max-new-tokens 10 --max-seq-len 256 --batch 8 \
        --seed 5 --temperature 0 "$@" >/dev/null 2>"$o.log" || { cat "$o.log"; fail "generate $o"; }
}
gen both
gen pre --final-hidden pre-norm
gen post --final-hidden post-norm

echo "-- whole dataset"
$E export both --to speculators --out sp >out 2>err || { cat out err; fail "export"; }
grep -q "speculators train --speculator-type eagle3 --verifier-name-or-path VERIFIER_DIR --data-path sp --target-layer-ids 2 4 5 --draft-vocab-size 512 --on-missing raise" out \
    || { cat out; fail "printed command"; }
$CHECK both sp
$E export both --to speculators --out "sp ace's" >sq.out 2>err || { cat out err; fail "export into a path with a space"; }
"$PYTHON" -c "
import shlex
line = next(l for l in open('sq.out') if 'speculators train' in l)
w = shlex.split(line[line.index('speculators train'):])
assert w[w.index('--data-path') + 1] == \"sp ace's\", w" || fail "the command does not quote the path: $(cat sq.out)"

echo "-- cut to 45 tokens, draft vocabulary 24, several shards of 2-row batches"
EG_EXPORT_SHARD_BYTES=3000 EG_EXPORT_BATCH_ROWS=2 $E export both --to speculators --out sp2 --max-len 45 --draft-vocab 24 >out 2>&1 \
    || { cat out; fail "export --max-len"; }
grep -q "without a supervised token left out" out || { cat out; fail "no unsupervised rows left out: the cut does not test that"; }
[ "$(ls sp2 | grep -c '^data-')" -ge 3 ] || { ls sp2; fail "expected several Arrow shards"; }
$CHECK both sp2 --max-len 45 --draft-vocab 24

echo "-- a shard per row (the last row closes a shard: no empty shard after it)"
EG_EXPORT_SHARD_BYTES=1 $E export both --to speculators --out sp3 --max-len 45 --draft-vocab 24 >/dev/null 2>&1 || fail "export sp3"
$CHECK both sp3 --max-len 45 --draft-vocab 24
[ "$(ls sp3 | grep -c '^data-')" -eq "$(ls sp3/hidden_states | wc -l)" ] || { ls sp3; fail "shards != rows"; }

echo "-- whole rows: the mapping equals eaglegen vocab's (manifest histogram)"
$E export both --to speculators --out sp4 --draft-vocab 24 >/dev/null 2>&1 || fail "export sp4"
$E vocab both --draft-vocab 24 --out voc >/dev/null 2>&1 || fail "eaglegen vocab"
cmp sp4/d2t-24.npy voc/d2t.npy && cmp sp4/t2d-24.npy voc/t2d.npy || fail "export's d2t/t2d differ from eaglegen vocab's"

echo "-- pre-norm-only data: the same planes"
$E export pre --to speculators --out spq >/dev/null 2>&1 || fail "export of pre-norm data"
$CHECK pre spq
cmp sp/hidden_states/hs_3.safetensors spq/hidden_states/hs_3.safetensors || fail "pre-norm-only export differs from both"

echo "-- refusals"
refuse() { # WHY ARGS...
    local why=$1; shift
    if $E export "$@" >out 2>&1; then fail "accepted: $*"; fi
    grep -q -- "$why" out || { cat out; fail "no reason '$why' for: $*"; }
}
refuse "normed twice" post --to speculators --out r1
[ ! -e r1 ] || fail "a refused export created r1"
cp -r both v1
"$PYTHON" - <<'PY'
import json
m = json.load(open("v1/manifest.json"))
m["format_version"] = 1
for k in ("num_layers",):
    m.pop(k)
m["final_hidden"] = {"source": "pre_norm", "stored": ["pre_norm"], "description": ""}
json.dump(m, open("v1/manifest.json", "w"))
PY
refuse "does not record the model's layer count" v1 --to speculators --out r2
refuse "needs the dataset's manifest" "both/$(ls both | grep '\.tar$' | head -n 1)" --to speculators --out r3
refuse "is not empty" both --to speculators --out sp
refuse "--draft-vocab expects an integer" both --to speculators --out r4 --draft-vocab 0
EG_EXPORT_SHARD_BYTES=x refuse "EG_EXPORT_SHARD_BYTES='x'" both --to speculators --out r5
refuse "larger than the target vocabulary" both --to speculators --out r6 --draft-vocab 513
refuse "no sample has a supervised (loss-masked) token within --max-len" both --to speculators --out r7 --max-len 5
[ ! -e r7 ] || { ls -R r7; fail "a refused export left r7 behind"; }

echo "-- kill -9 mid-export"
"$PYTHON" - <<'PY'
import json
with open("k.jsonl", "w") as f:
    for i in range(160):
        f.write(json.dumps({"id": f"k{i}", "messages": [{"role": "user", "content": f"Item {i}: {'more ' * (i % 13)}"}]}) + "\n")
PY
$E generate --model model --prompts k.jsonl --out kds --max-new-tokens 8 --max-seq-len 256 --batch 16 --seed 5 \
    --temperature 0 >/dev/null 2>&1 || fail "generate kds"
RANDOM=${EG_SEED:-4242}
mid=0
for i in 1 2 3 4 5 6; do
    rm -rf k
    EG_EXPORT_BATCH_ROWS=8 $E export kds --to speculators --out k >/dev/null 2>&1 &
    pid=$!
    # start the clock once the export writes (opening the dataset and counting the vocab
    # take longer than the window on a loaded machine), then kill at a random point
    for _ in $(seq 1 400); do
        compgen -G "k/hidden_states/*.safetensors" >/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    sleep "0.$(printf %03d $((RANDOM % 60 + 1)))"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    verdict=$("$PYTHON" - <<'PY'
import json, os, struct, sys
import numpy as np
d = "k"
if not os.path.isdir(d):
    print("none"); sys.exit(0)
names = os.listdir(d)
done = "eaglegen_export.json" in names
arrow = [n for n in names if n.endswith(".arrow")]
if arrow and "state.json" not in names and not done:
    # shards are renamed only after the last row; state.json follows them at once
    pass
hs = os.listdir(os.path.join(d, "hidden_states")) if os.path.isdir(os.path.join(d, "hidden_states")) else []
for n in hs:
    if not n.endswith(".safetensors"):
        if not n.endswith(".tmp"):
            print(f"bad: stray {n}"); sys.exit(0)
        continue
    b = open(os.path.join(d, "hidden_states", n), "rb").read()
    hl = struct.unpack_from("<Q", b, 0)[0]
    h = json.loads(b[8:8 + hl])
    end = max(e["data_offsets"][1] for e in h.values())
    if len(b) != 8 + hl + end:
        print(f"bad: {n} is partial ({len(b)} of {8 + hl + end} bytes)"); sys.exit(0)
for n in names:
    if n.startswith("data-") and n.endswith(".arrow"):
        b = open(os.path.join(d, n), "rb").read()
        if b[-8:] != b"\xff\xff\xff\xff\x00\x00\x00\x00":
            print(f"bad: {n} has no end-of-stream marker"); sys.exit(0)
print("done" if done else ("mid" if hs and not arrow else "early"))
PY
)
    case "$verdict" in
    bad*) fail "after kill $i: $verdict" ;;
    mid) mid=$((mid + 1))
         if $E export kds --to speculators --out k >out 2>&1; then fail "export reused a half-written directory"; fi
         grep -q "is not empty" out || { cat out; fail "reuse refusal"; } ;;
    done) $CHECK kds k >/dev/null || fail "a finished export does not check" ;;
    esac
    echo "  kill $i: $verdict"
done
[ "$mid" -ge 1 ] || fail "no kill landed mid-export (make the dataset bigger)"
echo ok
