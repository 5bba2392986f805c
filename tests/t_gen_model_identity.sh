#!/usr/bin/env bash
# The model is known by its content, not its directory name: a job resumes from a copy of
# the checkpoint under another name, and workers that name the same checkpoint by
# different paths write one dataset that inspect, merge and the Python loader read. Another
# checkpoint of the same config (here: other random weights) is refused: on resume (job.json
# fingerprints), by a worker joining a shared directory, and by inspect, merge and the
# loader for manifests already written (model.weights_sha256).
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "t_gen_model_identity: $*"; exit 1; }
$E mkmodel --preset tiny --out model --seed 4 >/dev/null 2>&1
$E mkmodel --preset tiny --out other --seed 5 >/dev/null 2>&1
cp model/config.json other/config.json # one config (mkmodel records its seed there), other weights
cmp -s model/*.safetensors other/*.safetensors && fail "the two models' weights are equal"
mkdir -p moved && cp -r model moved/kimi-copy
for i in 1 2 3 4 5 6; do echo "{\"prompt\": \"Record $i: a word.\"}"; done > c.jsonl
args=(--prompts c.jsonl --max-new-tokens 4 --max-seq-len 128 --batch 2 --threads 1)

$E generate --model model "${args[@]}" --out ref 2>/dev/null
# a resume from the copy under another name: nothing left to do, the data unchanged
$E generate --model model "${args[@]}" --out job --limit 3 2>/dev/null
$E generate --model moved/kimi-copy "${args[@]}" --out job 2> err.txt || fail "resume from the moved copy: $(tail -n 2 err.txt)"
"$PYTHON" "$here/gen_check.py" same ref job >/dev/null || fail "resumed from the copy: not identical"
# other weights: the resume is refused
set +e; $E generate --model other "${args[@]}" --out job 2> err.txt; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "model_weights" err.txt || fail "resume with other weights: exit $rc: $(tail -n 3 err.txt)"

# workers naming one checkpoint by different paths: one dataset
$E generate --model "$tmp/model" "${args[@]}" --out w --worker 0/2 2>/dev/null
$E generate --model moved/kimi-copy "${args[@]}" --out w --worker 1/2 2> err.txt || fail "worker 1 (copy): $(tail -n 2 err.txt)"
$E inspect w > /dev/null 2> err.txt || fail "inspect of the workers: $(cat err.txt)"
"$PYTHON" -c "import sys; sys.path.insert(0, '$here/../dataset/python'); import eaglegen_data as g; assert len(g.EagleGenDataset('w', as_torch=False)) == 6" \
    || fail "the loader on the workers"
cp -r w wm && $E merge wm --out wm > /dev/null 2> err.txt || fail "merge of the workers: $(cat err.txt)"
"$PYTHON" "$here/gen_check.py" same ref wm >/dev/null || fail "merged workers: not identical to one run"

# a worker with other weights joining w: refused before it writes anything
rm -rf x && cp -r w x && rm x/manifest.w1of2.json x/shard-w1of2-* x/job.w1of2.json 2>/dev/null || true
ls x/manifest.w1of2.json >/dev/null 2>&1 && fail "setup"
# (by worker 0's job file, before the model loads; without one, by its manifest when the
# writer opens)
set +e; $E generate --model other "${args[@]}" --out x --worker 1/2 2> err.txt; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "job.w0of2.json, another worker of this dataset, was made with parameters that change" err.txt \
    && grep -q "fingerprints.model_weights: " err.txt || fail "worker with other weights: exit $rc: $(tail -n 3 err.txt)"
[ ! -e x/manifest.w1of2.json ] && [ ! -e x/job.w1of2.json ] || fail "the refused worker wrote its files"
mv x/job.w0of2.json job.w0of2.json.kept
set +e; $E generate --model other "${args[@]}" --out x --worker 1/2 2> err.txt; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "manifest.w0of2.json, another worker of this dataset: datasets differ in model weights" err.txt \
    || fail "worker with other weights, no job file beside: exit $rc: $(tail -n 3 err.txt)"
[ ! -e x/manifest.w1of2.json ] || fail "the refused worker wrote its manifest"
mv job.w0of2.json.kept x/job.w0of2.json
# ... and written elsewhere, then put beside worker 0: inspect, merge and the loader refuse
$E generate --model other "${args[@]}" --out y --worker 1/2 2>/dev/null
cp y/manifest.w1of2.json y/shard-w1of2-* x/
set +e; $E inspect x > /dev/null 2> err.txt; rc=$?; set -e
[ $rc -eq 1 ] && grep -q "model weights" err.txt || fail "inspect of mixed weights: exit $rc: $(cat err.txt)"
set +e; $E merge x --out xm > /dev/null 2> err.txt; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "model.weights" err.txt || fail "merge of mixed weights: exit $rc: $(cat err.txt)"
"$PYTHON" -c "import sys; sys.path.insert(0, '$here/../dataset/python'); import eaglegen_data as g
try:
    g.EagleGenDataset('x', as_torch=False); print('read')
except g.EagleGenDataError as e: print(e)" > py.txt
grep -q "model weights" py.txt || fail "the loader on mixed weights: $(cat py.txt)"
echo "t_gen_model_identity: ok"
