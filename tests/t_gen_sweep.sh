#!/usr/bin/env bash
# A short run of the randomised differential sweep (tests/sweep_generate.py; `make sweep`
# runs longer ones): random sampling families, each against random layouts, batching,
# preemption, kill -9 and resume, and merged workers, every variant bit-identical to its
# reference and every reference to a teacher-forced forward pass.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
here=$(cd "$(dirname "$0")" && pwd)
seed=${EG_SEED:-12345}
echo "  (families from seed $seed; set EG_SEED to change)"
log=$(mktemp); trap 'rm -f "$log"' EXIT
rc=0
EAGLEGEN=$EAGLEGEN PYTHON=$PYTHON "$PYTHON" "$here/sweep_generate.py" --seed "$seed" --families 6 >"$log" 2>&1 || rc=$?
grep -v '^\[[0-9.]*\] identical: ' "$log" || true
echo "  $(grep -c '^\[[0-9.]*\] identical: ' "$log") variants identical"
exit $rc
