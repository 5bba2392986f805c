#!/usr/bin/env bash
# generate --draft-model / --draft-tokens (speculative decoding): nonsense is refused
# with one clear line (exit 2), a drafter directory that cannot be used with a clear
# error (exit 1) and nothing left in --out; --help documents both flags.
set -eu
: "${EAGLEGEN:?}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; cat "$tmp/err"; exit 1; }
usage_err() { # pattern command...
    local want=$1; shift
    set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
    [ $rc = 2 ] || fail "exit $rc (want 2): $*"
    grep -qF -- "$want" "$tmp/err" || fail "want '$want': $*"
}
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 3 >/dev/null 2>&1
echo '{"prompt": "hello there"}' >p.jsonl
base=(--model model --prompts p.jsonl --max-new-tokens 8 --max-seq-len 64 --threads 1)
usage_err "--draft-tokens needs --draft-model DIR" $E generate "${base[@]}" --out o --draft-tokens 2
usage_err "--draft-tokens" $E generate "${base[@]}" --out o --draft-model d --draft-tokens 0
usage_err "--mode capture generates nothing" $E generate "${base[@]}" --out o --mode capture --draft-model d
usage_err "--ep is not supported" $E generate "${base[@]}" --out o --ep 2 --draft-model d
usage_err "pipeline stages" $E generate "${base[@]}" --out o --stages 2 --draft-model d
usage_err "cannot hold a verify step of --draft-tokens 4" $E generate "${base[@]}" --out o --chunk 4 --batch 2 \
    --draft-model d --draft-tokens 4
# a directory without a drafter: refused before anything is written
mkdir nodrafter
set +e; $E generate "${base[@]}" --out o1 --draft-model nodrafter >"$tmp/out" 2>"$tmp/err"; rc=$?; set -e
[ $rc = 1 ] || fail "exit $rc (want 1) for a directory without config.json"
grep -qF -- "--draft-model nodrafter" "$tmp/err" || fail "the error names the flag and directory"
[ ! -e o1 ] || fail "a refused start left o1"
$E generate --help >"$tmp/out"
grep -qF -- "--draft-model DIR" "$tmp/out" && grep -qF -- "--draft-tokens K" "$tmp/out" || fail "--help lacks the flags"
echo "t_gen_spec_cli: ok"
