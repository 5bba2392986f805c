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
# a short option in a cluster after a positional argument (getopt permutes them): the option
# is named, not the argument before it
one_line "unknown option '-Z'" $E inspect d -Zx
one_line "unknown option '-q'" $E inspect d -q
one_line "unexpected argument 'extra'" $E bench --preset tiny extra
one_line "unexpected argument 'extra'" $E plan --preset tiny --stages 2 extra
one_line "--workload gives the lengths instead of --mean-len" $E plan --preset tiny --stages 2 --workload \
    lognormal:500:1 --mean-len 77
one_line "(--json writes to a file given as --json=FILE)" $E fidelity --json out.json --model m --prompts p
# a value for a flag that takes none is said so (getopt calls it unknown)
one_line "--allow-partial takes no value, got '--allow-partial=1'" $E merge a --out b --allow-partial=1
# the missing pieces named (not the whole usage), no stray separator, no empty line
one_line "missing --model (required: --model DIR" $E generate --dry-run --prompts p
one_line "missing PATH (a dataset directory or a shard file)" $E inspect
one_line "unexpected argument 'b'" $E inspect a b
one_line "missing --draft-vocab, --out (usage: eaglegen vocab" $E vocab d
one_line "missing --to (usage: eaglegen export" $E export d --out e
one_line "--draft-vocab expects an integer in [1, 2147483647], got '99999999999999999999'" \
    $E vocab d --out v --draft-vocab 99999999999999999999
one_line "--max-len expects an integer" $E export d --to specforge --out e --max-len 99999999999999999999
one_line "--draft-tokens K and --accept A go together" $E plan --preset tiny --gpus 2 --draft-tokens 3
one_line "unknown option '--stpes'; did you mean --steps? (see eaglegen fidelity --help)" $E fidelity --stpes 3
one_line "--stages expects N or ascending end layers" $E generate --model m --prompts p --out o --stages abc
one_line "--stages expects N or ascending end layers" $E generate --model m --prompts p --out o --stages 2,
# an option of another mode is refused, not ignored
one_line "--box applies to --layout auto" $E generate --model m --prompts p --out o --box h200x8
one_line "--json applies to the layout table (--gpus/--box), not to --stages" $E plan --preset tiny --stages 2 --json
one_line "--link applies to the layout table" $E plan --preset tiny --stages 2 --link foo
one_line "--layers applies to --preset" $E plan --model m --stages 2 --layers 2
one_line "--kv-policy applies to workload mode (--requests N)" $E bench --preset tiny --kv-policy reserve
one_line "--layers applies to --preset" $E bench --model m --layers 3
one_line "in workload mode --batch is one number" \
    $E bench --preset tiny --requests 2 --kv-tokens 8192 --prompt-len 16 --max-new 32 --batch 1,8
one_line "--steps applies to --prompts (compare), not --audit" $E fidelity --model m --audit d --steps 5
one_line "--samples applies to --audit, not --prompts (compare)" $E fidelity --model m --prompts p --samples 3

# numbers are decimal everywhere: mkmodel --seed 010 is ten, as generate's (not octal eight)
$E mkmodel --preset tiny --out "$tmp/s1" --seed 010 >/dev/null 2>&1 || fail "mkmodel --seed 010"
$E mkmodel --preset tiny --out "$tmp/s2" --seed 10 >/dev/null 2>&1 || fail "mkmodel --seed 10"
cmp -s "$tmp/s1/model-00001-of-00001.safetensors" "$tmp/s2/model-00001-of-00001.safetensors" ||
    fail "mkmodel --seed 010 and --seed 10 differ"
$E --version >"$tmp/out" 2>"$tmp/err" || fail "--version"
grep -qE '^eaglegen [0-9]+\.[0-9]+\.[0-9]+ \(git [^)]+\)$' "$tmp/out" || fail "version line: $(cat "$tmp/out")"
$E version | cmp - "$tmp/out" || fail "eaglegen version differs from --version"
echo "t_gen_cli_errors: ok"
