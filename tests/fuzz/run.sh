#!/usr/bin/env bash
# run.sh [NAME...] — the fuzzing campaign behind `make fuzz`: each target
# ($BUILD/tests/fuzz/fuzz_NAME, libFuzzer + ASan + UBSan + LeakSanitizer) runs FUZZ_S
# seconds (default 60) over its working corpus ($BUILD/fuzz-work/NAME), seeded from
# tests/fuzz/corpus/NAME and the generated seeds (seeds.sh). A crash, leak, timeout or
# broken property stops that target and leaves the input in tests/fuzz/corpus/NAME/ as a
# regression case (`make test` replays it). Prints one line per target: executions,
# coverage (edges), features, corpus size; exits non-zero when a target found something.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
BUILD=${BUILD:-build-fuzz}
FUZZ_S=${FUZZ_S:-60}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||'))
seeds=$BUILD/fuzz-seeds
if [ ! -d "$seeds" ]; then bash tests/fuzz/seeds.sh "$seeds" "$BUILD/eaglegen" || exit 1; fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
found=0
summary=()
for t in "${targets[@]}"; do
    bin=$BUILD/tests/fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "no $bin (make fuzz builds it)"; exit 1; }
    work=$BUILD/fuzz-work/$t
    mkdir -p "$work" "tests/fuzz/corpus/$t"
    log=$BUILD/fuzz-$t.log
    echo "== fuzz_$t: ${FUZZ_S}s"
    # Inputs up to 64 KB (8 KB for the tokenizer, whose cost per input grows with its
    # length while its logic is reached by short texts), but never shorter than the
    # largest seed: a truncated seed shard is only a bad trailer, and the reader behind it
    # would go unfuzzed.
    max_len=65536
    [ "$t" = tokenizer ] && max_len=8192
    big=$(find "tests/fuzz/corpus/$t" "$seeds/$t" -type f -printf '%s\n' 2>/dev/null | sort -n | tail -n 1)
    [ -n "$big" ] && [ "$big" -gt "$max_len" ] && max_len=$big
    "$bin" -max_total_time="$FUZZ_S" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" -print_final_stats=1 \
        -artifact_prefix="tests/fuzz/corpus/$t/found-" "$work" "tests/fuzz/corpus/$t" "$seeds/$t" >"$log" 2>&1
    rc=$?
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    last=$(grep -E '#[0-9]+.*(cov|DONE)' "$log" | tail -n 1)
    cov=$(echo "$last" | sed -nE 's/.*cov: ([0-9]+).*/\1/p')
    ft=$(echo "$last" | sed -nE 's/.*ft: ([0-9]+).*/\1/p')
    corp=$(echo "$last" | sed -nE 's/.*corp: ([0-9]+)\/.*/\1/p')
    status=clean
    if [ $rc -ne 0 ]; then status="FOUND (rc $rc, see $log)"; found=1; tail -n 30 "$log"; fi
    summary+=("$(printf '%-14s execs %-10s cov %-6s ft %-6s corpus %-6s %s' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$status")")
done
echo "== summary (FUZZ_S=$FUZZ_S)"
printf '%s\n' "${summary[@]}"
exit $found
