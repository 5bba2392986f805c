#!/usr/bin/env bash
# eaglegen export --to specforge (issue 18), without torch:
# - the layout (rows_*/data_*.ckpt, vocab_mapping.pt, draft_config.json) read back with a
#   numpy-only torch.load (tests/export_specforge_check.py: zip members, alignment, CRCs,
#   pickle opcodes, storages) and every tensor equal to eaglegen's reader; post-norm final
#   state; aux concat order; --max-len;
# - the draft vocabulary under both tie rules, the SpecForge one recomputed in Python from
#   its source (Counter, most_common, set(range(N)) - seen padding), on cuts where the two
#   rules differ; the CPython set-order padding against the running CPython;
# - aux ids in SpecForge's convention (= eaglegen's) in the draft config and the printed
#   command; --model's target directory (lm_head + embedding bytes, index, flat config);
# - kill -9 mid-export leaves no partial .ckpt, a rerun resumes to the same files (also a kill
#   before the marker's rename, which leaves only its .tmp);
# - refusals: foreign files in --out, a complete export, other options or another dataset
#   (same ids and shapes, other content) on resume, unknown
#   --to / --tie-order, --model with speculators, pre-norm-only data, a model that is not
#   the dataset's, n_aux != 3; --help and --log-json.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
CHK="$PYTHON $here/export_specforge_check.py"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }
$E mkmodel --preset tiny --layers 8 --out model --seed 3 >/dev/null 2>&1
$E mkmodel --preset tiny --layers 6 --out model6 --seed 4 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
with open("c.jsonl", "w") as f:
    for i in range(6):
        f.write(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Question {i}: {'why ' * i}?"}]}) + "\n")
with open("big.jsonl", "w") as f:
    for i in range(60):
        f.write(json.dumps({"id": f"b{i}", "messages": [{"role": "user", "content": f"Tell {i}: {'more ' * (i % 9)}"}]}) + "\n")
PY
gen() { # OUT PROMPTS EXTRA...
    local o=$1 p=$2; shift 2
    $E generate --model model --prompts "$p" --out "$o" --max-new-tokens 12 --max-seq-len 256 --batch 3 --seed 5 \
        --temperature 0 "$@" >/dev/null 2>"$o.log" || { cat "$o.log"; fail "generate $o"; }
}
gen ds c.jsonl
gen pre c.jsonl --final-hidden pre-norm
gen one c.jsonl --aux-layers 2
gen big big.jsonl --max-new-tokens 40 --temperature 1.0

echo "-- export: default (tie order specforge, draft vocab = V = 512), --model"
$E export ds --to specforge --out sf --model model >sf.out 2>sf.err || { cat sf.err; fail "export"; }
$CHK ds sf --tie specforge | tee chk.out
grep -q "^ok: 6 samples" chk.out || fail "checker"
grep -q "eagle_aux_hidden_state_layer_ids \[1,3,4\]" sf.out || fail "summary lacks the aux ids: $(cat sf.out)"
grep -q -- "--train-hidden-states-path sf/hidden_states" sf.out || fail "no trainer command"
grep -q -- "--draft-model-config sf/draft_config.json" sf.out || fail "no draft config in the command"
grep -q -- "--target-model-path sf/target" sf.out || fail "no target in the command"
grep -q "samples" sf.err || fail "no progress on stderr"
# an --out with a space and a quote: the printed command is still one pasteable line
$E export ds --to specforge --out "sp ace's" >sq.out 2>sq.err || { cat sq.err; fail "export into a path with a space"; }
"$PYTHON" - <<'PY' || fail "the command does not quote the paths: $(grep -o 'torchrun.*' sq.out)"
import shlex
line = next(l for l in open("sq.out") if "torchrun" in l)
w = shlex.split(line[line.index("torchrun"):])
for flag, sub in (("--target-model-path", "target"), ("--train-hidden-states-path", "hidden_states"),
                  ("--draft-model-config", "draft_config.json"), ("--output-dir", "draft-out")):
    assert w[w.index(flag) + 1] == "sp ace's/" + sub, (flag, w)
PY
"$PYTHON" - "$here/../dataset/python" <<'PY'
import json, struct, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
m = json.load(open("ds/manifest.json"))
cfg = json.load(open("sf/draft_config.json"))
assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == m["aux_layers"]["trainer_ids"]["specforge_sglang"]["aux_ids"] == [1, 3, 4]
def st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]]) for k, v in h.items()}
src = st("model/model-00001-of-00001.safetensors")
tgt = st("sf/target/model.safetensors")
assert sorted(tgt) == ["lm_head.weight", "model.embed_tokens.weight"], sorted(tgt)
assert tgt["lm_head.weight"] == src["language_model.lm_head.weight"]
assert tgt["model.embed_tokens.weight"] == src["language_model.model.embed_tokens.weight"]
ix = json.load(open("sf/target/model.safetensors.index.json"))
assert ix["weight_map"] == {"lm_head.weight": "model.safetensors", "model.embed_tokens.weight": "model.safetensors"}
c = json.load(open("sf/target/config.json"))
mc = json.load(open("model/config.json")); mt = mc.get("text_config", mc)
assert c["model_type"] == "llama" and "text_config" not in c, c
assert (c["hidden_size"], c["vocab_size"]) == (mt["hidden_size"], mt["vocab_size"]) == (64, 512), c
import os
assert os.path.exists("sf/target/tokenizer_config.json")
print("target dir and draft config ok")
PY

echo "-- tie orders: cuts where eaglegen's rule and SpecForge's differ"
for N in 10 20 40; do
    $E export ds --to specforge --out t$N --draft-vocab $N >/dev/null 2>&1 || fail "export --draft-vocab $N"
    $CHK ds t$N --tie specforge --draft-vocab $N | tee chk.out
    grep -q "differs from eaglegen's rule: True" chk.out || fail "N=$N: the two rules agree here, the test would not see the difference"
    $E export ds --to specforge --out e$N --draft-vocab $N --tie-order eaglegen >/dev/null 2>&1 || fail "export eaglegen $N"
    $CHK ds e$N --tie eaglegen --draft-vocab $N >/dev/null || fail "eaglegen rule N=$N"
    ! cmp -s t$N/vocab_mapping.pt e$N/vocab_mapping.pt || fail "N=$N: both rules wrote the same mapping"
done
$E export ds --to specforge --out t300 --draft-vocab 300 >/dev/null 2>&1
$CHK ds t300 --tie specforge --draft-vocab 300 >/dev/null || fail "padding N=300"
$E export big --to specforge --out tb --draft-vocab 150 >/dev/null 2>&1
$CHK big tb --tie specforge --draft-vocab 150 >/dev/null || fail "big N=150"
"$PYTHON" "$here/pyset_check.py" "$(dirname "$E")/tests/test_dataset_vocab"

echo "-- --max-len"
$E export ds --to specforge --out ml --max-len 16 >/dev/null 2>&1 || fail "--max-len"
$CHK ds ml --tie specforge --max-len 16 >/dev/null || fail "--max-len 16 content"
# the mapping counts what the trainer is given: the cut samples (here it differs from whole samples)
$E export ds --to specforge --out ml20 --max-len 16 --draft-vocab 20 >/dev/null 2>&1 || fail "--max-len --draft-vocab"
$CHK ds ml20 --tie specforge --max-len 16 --draft-vocab 20 >/dev/null || fail "--max-len 16 vocab"
! cmp -s ml20/vocab_mapping.pt t20/vocab_mapping.pt || fail "--max-len did not change the counted tokens"

echo "-- kill -9 mid-export, then resume"
t0=$(date +%s%N)
$E export big --to specforge --out full --draft-vocab 64 >/dev/null 2>&1 || fail "big export"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
partial=0
for f in 10 25 40 55 70 85; do  # kill at these percentages of a clean export's time
    rm -rf k
    $E export big --to specforge --out k --draft-vocab 64 >/dev/null 2>&1 &
    pid=$!
    sleep "$(awk -v m="$ms" -v f="$f" 'BEGIN { printf "%.3f", m * f / 100000 }')"
    kill -9 $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    [ -d k ] || continue
    n=0
    for c in $(find k -name '*.ckpt'); do  # every visible .ckpt is whole
        cmp -s "$c" "full/${c#k/}" || fail "$c after kill -9 differs from a clean export's"
        n=$((n + 1))
    done
    if grep -q '"state":"complete"' k/.eaglegen-export.json 2>/dev/null; then continue; fi
    [ "$n" -gt 0 ] && [ "$n" -lt 60 ] && partial=$((partial + 1))
    $E export big --to specforge --out k --draft-vocab 64 >resume.out 2>&1 || { cat resume.out; fail "resume after kill at $f%"; }
    grep -q "($n already there)" resume.out || fail "resume did not keep the $n files: $(head -1 resume.out)"
    [ -z "$(find k -name '*.tmp')" ] || fail "resume left .tmp files"
    diff -r full k >/dev/null || fail "resumed export differs from a clean one"
done
echo "   clean export $ms ms; $partial kills left some but not all .ckpt files, each resumed to a clean export's bytes"
[ "$partial" -ge 1 ] || fail "no kill landed mid-export"
# A kill between mkdir and the marker's rename leaves only the marker's .tmp: that start resumes.
rm -rf k && mkdir k && printf '{"state":"runn' >k/.eaglegen-export.json.tmp
$E export big --to specforge --out k --draft-vocab 64 >resume.out 2>&1 || { cat resume.out; fail "resume after a kill before the marker"; }
diff -r full k >/dev/null || fail "export after a kill before the marker differs from a clean one"
# ...but a foreign file beside it is still refused.
rm -rf k && mkdir k && : >k/.eaglegen-export.json.tmp && : >k/notes.txt
if $E export big --to specforge --out k --draft-vocab 64 >resume.out 2>&1; then fail "foreign file accepted"; fi
grep -q "holds 1 files and is not an unfinished eaglegen export" resume.out || fail "foreign-file refusal: $(cat resume.out)"

echo "-- refusals"
set +e
mkdir foreign; touch foreign/x
$E export ds --to specforge --out foreign 2>err; rc=$?
[ $rc = 2 ] && grep -q "not an unfinished eaglegen export" err || fail "foreign files: rc $rc $(cat err)"
$E export ds --to specforge --out sf 2>err; rc=$?
[ $rc = 2 ] && grep -q "already holds a complete export" err || fail "complete export: rc $rc $(cat err)"
rm -rf k2; $E export big --to specforge --out k2 --draft-vocab 64 >/dev/null 2>&1 & pid=$!
for _ in $(seq 1 400); do [ -f k2/.eaglegen-export.json ] && break; sleep 0.02; done  # killed once it has started
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
[ -f k2/.eaglegen-export.json ] || fail "the export wrote no resume marker before the kill"
if grep -q complete k2/.eaglegen-export.json; then
    echo "   (the export finished before the kill: resume with other options not exercised)"
else
    $E export big --to specforge --out k2 --draft-vocab 65 2>err; rc=$?
    [ $rc = 2 ] && grep -q "another dataset or with other options" err || fail "resume with other options: rc $rc $(cat err)"
fi
# an unfinished export of another dataset of the same corpus, shapes and counts (another
# seed): refused, not resumed into a mix of both (the marker knew no content); the same
# dataset's unfinished export still resumes
gen big2 big.jsonl --max-new-tokens 40 --temperature 1.0 --seed 6
cmp -s big/shard-000000.tar big2/shard-000000.tar && fail "big2 equals big: the seed did not change it"
rm -rf km && cp -r full km && sed -i 's/"state":"complete"/"state":"running"/' km/.eaglegen-export.json
grep -q '"state":"running"' km/.eaglegen-export.json || fail "could not make the marker unfinished"
$E export big2 --to specforge --out km --draft-vocab 64 2>err; rc=$?
[ $rc = 2 ] && grep -q "another dataset or with other options" err || fail "another dataset's unfinished export: rc $rc $(cat err)"
$E export big --to specforge --out km --draft-vocab 64 >resume.out 2>&1 || fail "resume of the same dataset: $(cat resume.out)"
grep -q "(60 already there)" resume.out || fail "same dataset did not resume: $(head -1 resume.out)"
$E export ds --to trainer9 --out x 2>err; rc=$?
[ $rc = 2 ] && grep -q "specforge and speculators" err || fail "unknown --to: rc $rc"
$E export ds --to specforge --out x --tie-order random 2>err; rc=$?
[ $rc = 2 ] && grep -q "bad --tie-order" err || fail "bad --tie-order: rc $rc"
$E export ds --to speculators --out x --model model 2>err; rc=$?
[ $rc = 2 ] && grep -q "model is for --to specforge" err || fail "--model with speculators: rc $rc"
$E export pre --to specforge --out x 2>err; rc=$?
[ $rc = 2 ] && grep -q "only the pre-norm final state" err || fail "pre-norm data: rc $rc $(cat err)"
$E export one --to specforge --out x 2>err; rc=$?
[ $rc = 2 ] && grep -q "stores 1 aux layers" err || fail "n_aux 1: rc $rc $(cat err)"
# aux layers out of order in the manifest (a version-1 dataset may hold that): SpecForge
# concatenates its three low to high
cp -r ds rev && "$PYTHON" - <<'PY'
import json
m = json.load(open("rev/manifest.json"))
m["aux_layers"]["ids"] = m["aux_layers"]["ids"][::-1]
json.dump(m, open("rev/manifest.json", "w"))
PY
$E export rev --to specforge --out x 2>err; rc=$?
[ $rc = 2 ] && grep -q "aux layers must be ascending and distinct for SpecForge" err || fail "reversed aux: rc $rc $(cat err)"
$E export ds --to specforge --out x --model model6 2>err; rc=$?
[ $rc = 2 ] && grep -q "is not the dataset's target" err || fail "wrong model: rc $rc $(cat err)"
[ ! -e x ] || fail "a refused export created its output directory"
$E export ds --to specforge --out x --draft-vocab 0 2>err; rc=$?
[ $rc = 2 ] || fail "--draft-vocab 0: rc $rc"
$E export ds --to specforge --out x --draft-vocab 513 2>err; rc=$?
[ $rc = 2 ] && grep -q "must be 1..512" err || fail "--draft-vocab 513: rc $rc $(cat err)"
set -e
$E export --help | grep -q -- "--tie-order" || fail "--help lacks --tie-order"
$E export --help | grep -q -- "--model DIR" || fail "--help lacks --model"
$E export ds --to specforge --out lj --log-json >lj.out 2>lj.err
"$PYTHON" -c "
import json
d = json.loads(open('lj.out').read()); assert d['event'] == 'done' and d['samples'] == 6 and d['tie_order'] == 'specforge', d
for l in open('lj.err'):
    e = json.loads(l); assert e['event'] == 'progress', e
print('log-json ok')"
echo "PASS"
