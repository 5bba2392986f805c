#!/usr/bin/env bash
# Runs every C test binary, every tests/t_*.sh script and the Python tests. Each C binary
# and Python suite reports "suite: N passed, N failed" for its own test functions; each
# shell script counts as one test. Prints one closing "total: N passed, N failed" line and
# exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
export BUILD PYTHON EAGLEGEN="$PWD/$BUILD/eaglegen" FIXTURES="${FIXTURES:-$PWD/../shared/fixtures}"
[ -d "$FIXTURES" ] || echo "note: no reference fixtures at $FIXTURES: the golden and fixture tests will fail (README: make test)"
passed=0 failed=0 failed_names=()
out=$(mktemp); trap 'rm -f "$out"' EXIT
# count a suite's own "N passed, M failed" line; a suite that dies without one counts as 1 failure
suite() { # count|one name command...
    local mode=$1 name=$2; shift 2
    echo "== $name"
    "$@" 2>&1 | tee "$out"
    local rc=${PIPESTATUS[0]}
    local line p f
    line=""
    [ "$mode" = count ] && line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
    if [ -n "$line" ]; then
        p=$(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')
        f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    else
        p=$((rc == 0)) f=$((rc != 0))
    fi
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    passed=$((passed + p)) failed=$((failed + f))
    [ "$rc" -eq 0 ] || failed_names+=("$name")
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d|*.o) continue ;; esac
    suite count "$(basename "$t")" "$t"
done
for s in tests/t_*.sh; do
    [ -f "$s" ] || continue
    suite one "$(basename "$s")" bash "$s"
done
for p in tests/test_*.py dataset/python/test_*.py; do
    [ -f "$p" ] || continue
    suite count "$(basename "$p")" "$PYTHON" "$p"
done
[ ${#failed_names[@]} -eq 0 ] || echo "failed suites: ${failed_names[*]}"
echo "total: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ ${#failed_names[@]} -eq 0 ]
