#!/usr/bin/env bash
# Replays every stored fuzz input (tests/fuzz/corpus/NAME/: seeds and what campaigns
# found) through its harness, built with cc and tests/fuzz/replay.c — the CI half of
# `make fuzz` (docs/ARCHITECTURE.md). A broken property or crash fails the test.
set -eu
: "${BUILD:=build}"
cd "$(dirname "$0")/.."
n=0
for src in tests/fuzz/fuzz_*.c; do
    t=$(basename "$src" .c); t=${t#fuzz_}
    bin=$BUILD/tests/fuzz/replay_$t
    [ -x "$bin" ] || { echo "missing $bin (make builds it)"; exit 1; }
    [ -d "tests/fuzz/corpus/$t" ] || { echo "no stored inputs for $t"; exit 1; }
    "$bin" "tests/fuzz/corpus/$t"
    n=$((n + 1))
done
[ $n -ge 10 ] || { echo "only $n fuzz targets"; exit 1; }
