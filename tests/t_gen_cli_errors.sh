#!/usr/bin/env bash
# Usage errors say one thing, in one line (issue 20): an unknown option names the closest
# one (not the whole --help), an ambiguous abbreviation its candidates, a missing value
# the flag, a missing required argument what is missing; --version prints the version the
# manifest records.
set -eu
: "${EAGLEGEN:?}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; cat "$tmp/err"; exit 1; }
# status 2 and exactly one line on stderr matching the pattern
one_line() { # pattern command...
    local want=$1; shift
    set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
    [ $rc = 2 ] || fail "exit $rc (want 2): $*"
    [ "$(wc -l <"$tmp/err")" = 1 ] || fail "$(wc -l <"$tmp/err") lines (want 1): $*"
    grep -qF -- "$want" "$tmp/err" || fail "want '$want': $*"
}
one_line "unknown option '--tempreature'; did you mean --temperature?" \
    $E generate --model m --prompts p --out o --tempreature 0.7
one_line "unknown option '--shard-sampels'; did you mean --shard-samples?" $E generate --shard-sampels=3
one_line "unknown option '--bogus' (see eaglegen generate --help)" $E generate --bogus
one_line "unknown option '--modle'; did you mean --model? (see eaglegen bench --help)" $E bench --modle x
one_line "unknown option '--dry-rn'; did you mean --dry-run?" $E repair d --dry-rn
one_line "missing the dataset DIR" $E repair
one_line "option '--t' is ambiguous: --tokenizer --temperature" $E generate --t 1
one_line "--model needs a value" $E generate --prompts p --out o --model
one_line "missing --out (required: --model DIR, --prompts PATH..., --out DIR)" $E generate --model m --prompts p
one_line "missing --model, --prompts, --out" $E generate --seed 1
one_line "unknown option '--allow-partail'; did you mean --allow-partial?" $E merge a --out b --allow-partail
one_line "missing --out" $E merge a
one_line "unknown option '--verfy'; did you mean --verify?" $E inspect d --verfy
one_line "unknown option '-q'" $E plan -q

$E --version >"$tmp/out" 2>"$tmp/err" || fail "--version"
grep -qE '^eaglegen [0-9]+\.[0-9]+\.[0-9]+ \(git [^)]+\)$' "$tmp/out" || fail "version line: $(cat "$tmp/out")"
$E version | cmp - "$tmp/out" || fail "eaglegen version differs from --version"
echo "t_gen_cli_errors: ok"
