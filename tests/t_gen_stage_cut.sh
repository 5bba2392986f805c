#!/usr/bin/env bash
# A layer split between two pipeline stages (--stages END:CUT, issue 17): layer END-1's
# attention and routed experts [0, CUT) on one stage, its experts [CUT, E), shared expert
# and residual add on the next, which continues the routed sum in ascending expert id. The
# samples, captured rows included, equal the unsplit run's byte for byte: sampled with
# stops, capture mode, a pool that preempts, several cuts (expert 0 alone, expert 15 alone),
# and `forward` over the reference fixture; the same inside expert-parallel groups (--ep,
# stage groups, +ffn / +split). `plan --stages 8` shows the cuts generate
# chooses on planned GPUs. Bad cuts are refused naming the layer.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; [ -f err ] && tail -n 20 err; exit 1; }
$E mkmodel --preset tiny --out model --seed 11 >/dev/null 2>&1 # 5 layers, 0 dense, 16 routed experts
"$PYTHON" - <<'PY'
import json
with open("c.jsonl", "w") as f:
    for i in range(7):
        f.write(json.dumps({"prompt": f"Record {i}: " + "about " * (i * 3) + f"{i * 7}."}) + "\n")
with open("conv.jsonl", "w") as f:
    for i in range(4):
        f.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Add {i} and 2."},
                {"role": "assistant", "content": f"{i + 2}."}, {"role": "user", "content": "Thanks"},
                {"role": "assistant", "content": "You are welcome."}]}) + "\n")
PY
args=(--model model --prompts c.jsonl --max-new-tokens 20 --max-seq-len 160 --batch 3 --chunk 8
      --aux-layers 1,2,3 --threads 2 --temperature 0.9)
gen() { $E generate "${args[@]}" "$@"; }
gen --out ref 2>/dev/null

echo "-- sampled: one cut, three cuts, micro-batches in flight"
gen --out s1 --stages 2:5,5 2>err || fail "2:5,5"
grep -q "stage 0: layers 0-1 (layer 1: attention and experts 0-4)" err &&
    grep -q "stage 1: layer 1's experts 5-15, then layers 2-4" err || fail "the stage lines"
"$PYTHON" "$here/gen_check.py" same ref s1
gen --out s3 --stages 2:1,3:8,4:15,5 --micro-batches 4 2>err || fail "three cuts"
grep -q "stage 3: layer 3's experts 15-15, then layers 4-4" err || fail "the last stage's line"
"$PYTHON" "$here/gen_check.py" same ref s3

echo "-- a pool of three blocks that preempts across a cut: swapped to host, and recomputed"
gen --out r60 --max-new-tokens 60 2>/dev/null
gen --out q1 --max-new-tokens 60 --stages 3:7,5 --kv-tokens 192 --host-kv-gb 1 2>err || fail "small pool, swaps"
grep -Eq "[1-9][0-9]* preemptions \([1-9][0-9]* swapped" err || fail "no swap"
"$PYTHON" "$here/gen_check.py" same r60 q1
gen --out q0 --max-new-tokens 60 --stages 3:7,5 --kv-tokens 192 --host-kv-gb 0 2>err || fail "small pool, recomputes"
grep -Eq "[1-9][0-9]* rows recomputed" err || fail "no recompute"
"$PYTHON" "$here/gen_check.py" same r60 q0

echo "-- inside expert-parallel groups: each half's experts shared out over the ranks"
gen --out g1 --stages 2:5,5 --ep 2 2>err || fail "2:5,5 --ep 2"
grep -q "2 stage groups of 2 ranks" err || fail "no stage groups"
grep -q "layer 1 split between stages 0 and 1: its experts 0..4 shared out over the ranks (rank 0: 0..1), then 5..15 (rank 0: 5..9)" err ||
    fail "the split line"
"$PYTHON" "$here/gen_check.py" same ref g1
gen --out g3 --stages 2:1,3:8,4:15,5 --ep 4 --batch 4 --ep-split ffn 2>err || fail "three cuts, --ep 4, +ffn"
grep -q "its experts 0..0 shared out over the ranks (rank 0: none)" err || fail "an empty share"
grep -q "then 15..15 (rank 0: none)" err || fail "an empty share of a second half"
"$PYTHON" "$here/gen_check.py" same ref g3
gen --out q2 --max-new-tokens 60 --stages 3:7,5 --ep 2 --ep-split all --batch 6 2>err || fail "--ep 2, +split"
"$PYTHON" "$here/gen_check.py" same r60 q2

gen --out dr --stages 2:5,4:3,5 --ep 2 --dry-run > out 2>&1 || fail "dry run with cuts"
grep -q "^layer splits:  layer 1: experts 0..4 on stage 0, 5.. on 1; layer 3: experts 0..2 on stage 1, 3.. on 2 " out &&
    grep -q "each half's experts are shared out over the ranks of its stage" out || fail "the dry run's split line: $(cat out)"

echo "-- a config that ties the embeddings but ships its own lm_head: the stored head, in every layout"
cp -r model tmodel
"$PYTHON" - <<'PY'
import json
c = json.load(open("tmodel/config.json"))
(c.get("text_config") or c)["tie_word_embeddings"] = True
json.dump(c, open("tmodel/config.json", "w"), indent=1)
PY
targs=("${args[@]}")
targs[1]=tmodel
$E generate "${targs[@]}" --out t1 2>/dev/null || fail "tied config, one stage"
"$PYTHON" "$here/gen_check.py" same ref t1
$E generate "${targs[@]}" --out t2 --stages 2 2>/dev/null || fail "tied config, two stages"
"$PYTHON" "$here/gen_check.py" same ref t2
$E generate "${targs[@]}" --out t3 --ep 2 --ep-split all 2>/dev/null || fail "tied config, --ep 2 +split"
"$PYTHON" "$here/gen_check.py" same ref t3

echo "-- a truly tied checkpoint (no lm_head tensor): every layout samples alike, and plan counts the copy"
cp -r tmodel tied # the tied config above, its lm_head.weight removed
"$PYTHON" - <<'PY'
import json, struct
ix = json.load(open("tied/model.safetensors.index.json"))
key = next(k for k in ix["weight_map"] if k.endswith("lm_head.weight"))
f = "tied/" + ix["weight_map"].pop(key)
json.dump(ix, open("tied/model.safetensors.index.json", "w"))
b = open(f, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), b[8 + n:]
meta = h.pop("__metadata__", None)
del h[key]
out, nh = bytearray(), {}
for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    s, e = v["data_offsets"]
    nh[k] = dict(v, data_offsets=[len(out), len(out) + e - s])
    out += data[s:e]
if meta is not None:
    nh["__metadata__"] = meta
hb = json.dumps(nh).encode()
hb += b" " * (-len(hb) % 8)
open(f, "wb").write(struct.pack("<Q", len(hb)) + hb + out)
PY
targs[1]=tied
$E generate "${targs[@]}" --out u1 2>/dev/null || fail "tied checkpoint, one stage"
$E generate "${targs[@]}" --out u2 --stages 2:5,5 2>/dev/null || fail "tied checkpoint, two stages"
"$PYTHON" "$here/gen_check.py" same u1 u2
$E generate "${targs[@]}" --out u3 --ep 2 --ep-split all 2>/dev/null || fail "tied checkpoint, --ep 2 +split"
"$PYTHON" "$here/gen_check.py" same u1 u3
# the last stage holds its own copy of the tied head: two stages need the bytes of the
# stored-head model, one stage (tensor parallelism too) shares the embedding's
popt=(--stages 2 --gpu-mem-gb 0.01 --act-gb 0 --mem-fraction 1)
$E plan --model model "${popt[@]}" > plan_stored || fail "plan, stored head"
$E plan --model tied "${popt[@]}" > plan_tied || fail "plan, tied head"
[ "$(grep -E '^[01] |token slots box-wide' plan_stored)" = "$(grep -E '^[01] |token slots box-wide' plan_tied)" ] ||
    fail "plan --stages 2 does not count the tied head's copy: $(diff plan_stored plan_tied)"
[ "$(grep '^tensor parallel' plan_stored)" != "$(grep '^tensor parallel' plan_tied)" ] ||
    fail "plan: tensor parallelism shares a tied head with the embedding"

echo "-- capture mode"
$E generate --model model --prompts conv.jsonl --out cref --mode capture --max-seq-len 256 --aux-layers 1,2,3 \
    2>/dev/null
$E generate --model model --prompts conv.jsonl --out ccut --mode capture --max-seq-len 256 --aux-layers 1,2,3 \
    --stages 2:11,4:4,5 2>/dev/null || fail "capture with cuts"
"$PYTHON" "$here/gen_check.py" same cref ccut
$E generate --model model --prompts conv.jsonl --out cep --mode capture --max-seq-len 256 --aux-layers 1,2,3 \
    --stages 2:11,4:4,5 --ep 2 2>/dev/null || fail "capture with cuts and --ep 2"
"$PYTHON" "$here/gen_check.py" same cref cep

echo "-- forward over the fixture: the same bytes"
if [ -d "${FIXTURES:-}/models/tiny-a" ]; then
    F=$FIXTURES/models
    $E forward --model "$F/tiny-a" --prompts "$F/prompts-a.json" --out one.st 2>/dev/null
    $E forward --model "$F/tiny-a" --prompts "$F/prompts-a.json" --out cut.st --stages 2:3,4:13,5 --chunk 7 2>/dev/null
    cmp one.st cut.st || fail "forward with cuts differs"
else
    echo "(no fixtures: forward skipped)"
fi

echo "-- plan --stages 8 shows the split generate takes on planned GPUs, with its larger pool"
$E plan --preset kimi-k2.5 --stages 8 > plan.txt
grep -Eq "^with layers split between stages .*: --stages ([0-9]+(:[0-9]+)?,){7}61$" plan.txt || fail "no split line"
grep -q -- "--stages [0-9,]*[0-9]:[0-9]" plan.txt || fail "the split cuts no layer"
whole=$(sed -n 's/^pipeline (8 stages): \([0-9]*\) token slots.*/\1/p' plan.txt)
cut=$(sed -n 's/^  \([0-9]*\) token slots box-wide (+.*/\1/p' plan.txt)
[ -n "$whole" ] && [ -n "$cut" ] && [ "$cut" -gt "$whole" ] || fail "split $cut vs whole layers $whole"

echo "-- bad cuts are refused, naming the layer"
expect() { # rc pattern args...
    local want=$1 pat=$2; shift 2
    set +e; "$@" > out 2> err; local rc=$?; set -e
    [ $rc = "$want" ] || fail "exit $rc (want $want): $*"
    grep -q -- "$pat" err || fail "no '$pat' for: $*"
}
expect 1 "layer 0 of 5, 16 routed experts): layer END-1 is dense" gen --out b1 --stages 1:3,5
expect 1 "CUT must be below the routed expert count" gen --out b2 --stages 2:16,5
expect 1 "the last stage ends the model" gen --out b3 --stages 2:3,5:4
expect 2 "an end as END:CUT" gen --out b5 --stages 2:,5
expect 2 "--whole-layers and --transport apply to pipeline stages" gen --out b6 --whole-layers
echo '{"prompts": [[1, 2, 3]]}' > x.json
expect 2 "an end as a:CUT" $E forward --model model --prompts x.json --out x.st --stages 2:x,5
echo "t_gen_stage_cut: ok"
