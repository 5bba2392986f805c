#!/usr/bin/env bash
# coverage.sh [NAME...] — line coverage per source file of what a fuzzing campaign's
# corpus reaches (`make fuzz-cov`, after `make fuzz`). Each replay driver
# ($COV_BUILD/tests/fuzz/replay_NAME, clang -fprofile-instr-generate -fcoverage-mapping,
# no sanitizers) runs once over the target's working corpus ($FUZZ_BUILD/fuzz-work/NAME),
# its stored inputs (tests/fuzz/corpus/NAME) and the generated seeds; llvm-profdata
# merges the profile and llvm-cov reports each project file the target executes
# (lines covered / lines in the file). Prints one block per target and a summary line
# per target (the target's own parser file first).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
COV_BUILD=${COV_BUILD:-build-cov}
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
PROFDATA=${LLVM_PROFDATA:-$(command -v llvm-profdata || command -v llvm-profdata-14)}
COV=${LLVM_COV:-$(command -v llvm-cov || command -v llvm-cov-14)}
[ -n "$PROFDATA" ] && [ -n "$COV" ] || { echo "coverage.sh: needs llvm-profdata and llvm-cov (Debian: llvm)"; exit 1; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=($(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||'))
out=$COV_BUILD/fuzz-cov
mkdir -p "$out"
rc=0
summary=()
for t in "${targets[@]}"; do
    bin=$COV_BUILD/tests/fuzz/replay_$t
    [ -x "$bin" ] || { echo "no $bin (make fuzz-cov builds it)"; exit 1; }
    dirs=()
    for d in "$FUZZ_BUILD/fuzz-work/$t" "tests/fuzz/corpus/$t" "$FUZZ_BUILD/fuzz-seeds/$t"; do
        [ -d "$d" ] && dirs+=("$d")
    done
    [ ${#dirs[@]} -gt 0 ] || { echo "$t: no corpus (run make fuzz first)"; rc=1; continue; }
    rm -f "$out/$t".*.profraw
    # A crash here would be a finding the campaign missed: report it, keep going.
    if ! LLVM_PROFILE_FILE="$out/$t.%p.profraw" "$bin" "${dirs[@]}" > "$out/$t.replay.log" 2>&1; then
        echo "$t: replay failed (see $out/$t.replay.log)"; rc=1
    fi
    "$PROFDATA" merge -sparse "$out/$t".*.profraw -o "$out/$t.profdata" || { rc=1; continue; }
    # Project files only (not tests/ or system headers); columns: file, lines, missed, cover.
    "$COV" report "$bin" -instr-profile="$out/$t.profdata" 2>/dev/null |
        awk -v root="$root/" '
            $1 ~ /\.(c|h)$/ && $1 !~ /(^|\/)tests\// {
                f = $1; sub(root, "", f)
                lines = $8; missed = $9; cov = $10
                if (lines > 0 && lines != missed) printf "  %-28s %6d lines %6d covered %8s\n", f, lines, lines - missed, cov
            }' > "$out/$t.files"
    echo "== $t (inputs: ${dirs[*]})"
    cat "$out/$t.files"
    n_in=$(grep -E 'passed' "$out/$t.replay.log" | tail -n 1)
    summary+=("$(printf '%-14s %s' "$t" "$n_in")")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $rc
