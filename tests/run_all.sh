#!/usr/bin/env bash
# Runs every C test binary, every tests/t_*.sh script and the Python tests; prints one
# closing "N passed, N failed" line for the whole run and exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
export BUILD PYTHON EAGLEGEN="$PWD/$BUILD/eaglegen" FIXTURES="${FIXTURES:-$PWD/../shared/fixtures}"
passed=0 failed=0 failed_names=()
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue ;; esac
    echo "== $(basename "$t")"
    if "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names+=("$(basename "$t")"); fi
done
for s in tests/t_*.sh; do
    [ -f "$s" ] || continue
    echo "== $(basename "$s")"
    if bash "$s"; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names+=("$(basename "$s")"); fi
done
for p in tests/test_*.py dataset/python/test_*.py; do
    [ -f "$p" ] || continue
    echo "== $(basename "$p")"
    if "$PYTHON" "$p"; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names+=("$(basename "$p")"); fi
done
[ "$failed" -eq 0 ] || echo "failed suites: ${failed_names[*]}"
echo "total: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
