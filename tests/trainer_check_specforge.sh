#!/usr/bin/env bash
# `make trainer-check`, SpecForge part (optional, like ref-check; not in `make test`):
# installs torch 2.9.1 + transformers 4.57.1 (what SpecForge 0.2.0 pins) and specforge
# 0.2.0 itself (--no-deps: its sglang pin is not needed to read data or train offline)
# into build/trainer-venv once (PyPI; ~3 GB of wheels, PyPI's torch pulls the CUDA
# libraries), generates a small dataset with eaglegen (8-layer tiny model, aux layers
# 1,3,4, both final states), exports it with `eaglegen export --to specforge --model`
# (twice: the default draft vocab, and 100 ids so the SpecForge padding rule is used) and
# runs tests/trainer_check_specforge.py in the venv: SpecForge's OfflineEagle3Dataset and
# collator against eaglegen's reader, its own generate_vocab_mapping_file against the
# exported mapping, and one CPU training step of its LlamaForCausalLMEagle3 drafter.
# Exit status: 0 ok, 1 fail, 77 when the packages cannot be had (skip).
# Environment: TRAINER_VENV (default build/trainer-venv), TRAINER_PIP_ARGS (extra pip args).
set -eu
cd "$(dirname "$0")/.."
root=$PWD
: "${EAGLEGEN:=$root/build/eaglegen}" "${PYTHON:=/usr/bin/python3}"
VENV=${TRAINER_VENV:-$root/build/trainer-venv}
T0=$(date +%s)
have() { "$VENV/bin/python" -c "import torch, transformers, datasets, specforge.data.preprocessing, zstandard" 2>/dev/null; }
if ! have; then
    echo "-- installing torch, transformers, specforge 0.2.0 into $VENV (PyPI; ~3 GB)"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV" || { echo "SKIP: no venv"; exit 77; }
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q ${TRAINER_PIP_ARGS:-} "torch==2.9.1" "transformers==4.57.1" datasets tqdm \
        accelerate pydantic openai-harmony psutil safetensors zstandard &&
        "$VENV/bin/python" -m pip install -q ${TRAINER_PIP_ARGS:-} --no-deps "specforge==0.2.0" ||
        { echo "SKIP: pip install failed (offline?)"; exit 77; }
    have || { echo "SKIP: installed but not importable"; exit 77; }
fi
echo "-- python: $("$VENV/bin/python" -c 'import torch, transformers, importlib.metadata as m; print("torch", torch.__version__, "transformers", transformers.__version__, "specforge", m.version("specforge"))')"
[ -x "$EAGLEGEN" ] || { echo "trainer-check: $EAGLEGEN not built"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
. "$root/tests/trainer_check_lib.sh"
trainer_check_dataset
rc=0
for N in 512 100; do
    echo "-- eaglegen export --to specforge --model model --draft-vocab $N"
    "$EAGLEGEN" export ds --to specforge --out sf$N --model model --draft-vocab $N 2>/dev/null | sed 's/^/   /'
    TORCHDYNAMO_DISABLE=1 "$VENV/bin/python" "$root/tests/trainer_check_specforge.py" ds sf$N 2>&1 |
        grep -E '^\[specforge\]|Error|error' || rc=1
    grep -q . sf$N/draft_config.json || rc=1
done
# the Python loader's own tests with torch importable (make test runs them without: its
# torch tensors and export_specforge, with the exporter's refusals, run only here)
writer=$(dirname "$EAGLEGEN")/tests/test_dataset_writer
if [ -x "$writer" ]; then
    echo "-- dataset/python/test_eaglegen_data.py with torch"
    (cd "$root" && BUILD=$(dirname "$EAGLEGEN") "$VENV/bin/python" dataset/python/test_eaglegen_data.py) | sed 's/^/   /'
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
else
    echo "-- $writer not built: the loader's torch tests not run"; rc=1
fi
echo "-- trainer-check specforge: $([ $rc = 0 ] && echo OK || echo FAIL) in $(( $(date +%s) - T0 )) s"
exit $rc
