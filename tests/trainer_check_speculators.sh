#!/usr/bin/env bash
# `make trainer-check`, speculators part (optional, like ref-check; not in `make test`):
# installs speculators 0.9.0 from PyPI (with torch, datasets, pyarrow: several GB) into
# build/trainer-venv-speculators once, generates a small dataset with eaglegen (8-layer
# tiny model, aux layers 1,3,4, both final states), exports it with
# `eaglegen export --to speculators` and runs tests/trainer_check_speculators.py in that
# venv: speculators' own dataset class, collator, config resolution and drafter, compared
# with eaglegen's reader, and one CPU training step.
# The verifier directory speculators needs is assembled from the model by
# trainer_check_lib.sh's trainer_check_verifier.
set -eu
cd "$(dirname "$0")/.."
root=$PWD
: "${EAGLEGEN:=$root/build/eaglegen}" "${PYTHON:=/usr/bin/python3}"
VENV=${SPECULATORS_VENV:-$root/build/trainer-venv-speculators}
if ! "$VENV/bin/python" -c "import speculators, datasets, torch, zstandard" 2>/dev/null; then
    echo "-- installing speculators 0.9.0 into $VENV (PyPI; several GB)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "speculators==0.9.0" zstandard
fi
[ -x "$EAGLEGEN" ] || { echo "trainer-check: $EAGLEGEN not built"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
. "$root/tests/trainer_check_lib.sh"
trainer_check_dataset
"$EAGLEGEN" export ds --to speculators --out sp --draft-vocab 64 2>/dev/null
EG_EXPORT_SHARD_BYTES=4000 EG_EXPORT_BATCH_ROWS=2 "$EAGLEGEN" export ds --to speculators --out sp_split --draft-vocab 64 \
    >/dev/null 2>&1
trainer_check_verifier model verifier
"$VENV/bin/python" "$root/tests/trainer_check_speculators.py" ds sp verifier sp_split
