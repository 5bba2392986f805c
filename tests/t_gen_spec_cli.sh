#!/usr/bin/env bash
# generate --draft-model / --draft-tokens (speculative decoding): nonsense is refused
# with one clear line (exit 2), a drafter directory that cannot be used with a clear
# error (exit 1) and nothing left in --out; --help documents both flags. With an EAGLE-3
# drafter (`mkmodel --drafter-for` makes one): greedy with the drafter writes
# the very samples greedy without it writes; a sampled job with the drafter stopped by
# --limit and resumed (another --batch) equals an uninterrupted one; a resume with another
# K or without the drafter is refused, naming the difference. With --ep 2/4 (a drafter per
# rank) and threaded --stages 2 greedy equals greedy without a drafter, and sampled equals
# sampled spec unsplit. Preempted under a small cache and host budget (some swapped out in
# the middle of a recompute), greedy and sampled with a drafter equal runs with room.
set -eu
: "${EAGLEGEN:?}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
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
usage_err "a step of max(--chunk 4, --batch 2) rows cannot hold a verify step of --draft-tokens 4" $E generate "${base[@]}" --out o --chunk 4 --batch 2 \
    --draft-model d --draft-tokens 4
# a directory without a drafter: refused before anything is written
mkdir nodrafter
set +e; $E generate "${base[@]}" --out o1 --draft-model nodrafter >"$tmp/out" 2>"$tmp/err"; rc=$?; set -e
[ $rc = 1 ] || fail "exit $rc (want 1) for a directory without config.json"
grep -qF -- "--draft-model nodrafter" "$tmp/err" || fail "the error names the flag and directory"
[ ! -e o1 ] || fail "a refused start left o1"
$E generate --help >"$tmp/out"
grep -qF -- "--draft-model DIR" "$tmp/out" && grep -qF -- "--draft-tokens K" "$tmp/out" || fail "--help lacks the flags"

$E mkmodel --drafter-for model --out drafter --seed 5 >/dev/null 2>"$tmp/err" || fail "mkmodel --drafter-for"
: "${PYTHON:=/usr/bin/python3}"
for i in $(seq 1 9); do echo "{\"prompt\": \"Record $i: tell me about $((i * 7)).\"}"; done >c.jsonl
run=(--model model --prompts c.jsonl --max-new-tokens 24 --max-seq-len 128 --batch 3 --chunk 8 --shard-samples 4
     --threads 1)
$E generate "${run[@]}" --temperature 0 --out g0 2>/dev/null || fail "greedy without drafter"
$E generate "${run[@]}" --temperature 0 --out g3 --draft-model drafter --draft-tokens 3 --log-json g3.log \
    2>"$tmp/err" || fail "greedy with drafter"
grep -q "speculative: .* verify steps" "$tmp/err" || fail "no speculative report"
grep -q '"phase":"speculative"' g3.log || fail "no speculative --log-json line"
"$PYTHON" "$here/gen_check.py" same g0 g3 >/dev/null || fail "greedy with a drafter differs from greedy without"
# greedy_same DRAFTER PREFIX STDERR_PATTERN LAYOUT: greedy with the drafter under LAYOUT writes g0's samples
greedy_same() {
    local d="$2_$(echo "$4" | tr -d ' -')"
    # shellcheck disable=SC2086
    $E generate "${run[@]}" --temperature 0 --out "$d" --draft-model "$1" --draft-tokens 3 $4 2>"$tmp/err" ||
        fail "greedy with $1, $4: $(tail -2 "$tmp/err")"
    grep -q "$3" "$tmp/err" || fail "$1, $4: no '$3' on stderr"
    "$PYTHON" "$here/gen_check.py" same g0 "$d" >/dev/null || fail "greedy with $1, $4, differs from greedy"
}
# expert-parallel ranks (a drafter per rank) and threaded pipeline stages: the same samples
for lay in "--ep 2" "--ep 4 --batch 4" "--stages 2" "--ep 2 --stages 2"; do greedy_same drafter g "drafter: " "$lay"; done
# vLLM's MLA drafter layout (mkmodel --mla): its latent cache paged in the KV pool's blocks,
# greedy equal to greedy without a drafter, one engine and a drafter per rank
$E mkmodel --drafter-for model --out drafter_mla --seed 6 --mla >/dev/null 2>"$tmp/err" || fail "mkmodel --drafter-for --mla"
grep -q '"Eagle3DeepseekV2ForCausalLM"' drafter_mla/config.json || fail "mkmodel --mla: not the MLA layout"
for lay in "" "--ep 2"; do greedy_same drafter_mla m "paged cache 80 bytes per token" "$lay"; done
sp=("${run[@]}" --temperature 1.0 --draft-model drafter --draft-tokens 2)
$E generate "${sp[@]}" --out s_ref 2>/dev/null || fail "sampled with drafter"
$E generate "${sp[@]}" --out s_ep --ep 2 2>/dev/null || fail "sampled with drafter, --ep 2"
"$PYTHON" "$here/gen_check.py" same s_ref s_ep >/dev/null || fail "sampled spec with --ep 2 differs from unsplit"
$E generate "${sp[@]}" --out s_st --stages 2 2>/dev/null || fail "sampled with drafter, --stages 2"
"$PYTHON" "$here/gen_check.py" same s_ref s_st >/dev/null || fail "sampled spec with --stages 2 differs from unsplit"
$E generate "${sp[@]}" --out s_part --limit 4 2>/dev/null || fail "sampled, --limit 4"
$E generate "${sp[@]}" --out s_part --batch 2 2>/dev/null || fail "sampled, resumed"
"$PYTHON" "$here/gen_check.py" same s_ref s_part >/dev/null || fail "a resumed speculative job differs"
set +e; $E generate "${sp[@]}" --out s_part --draft-tokens 3 >"$tmp/out" 2>"$tmp/err"; rc=$?; set -e
[ $rc = 1 ] && grep -qF "draft_tokens: 2 -> 3" "$tmp/err" || fail "a resume with another K was not refused ($rc)"
set +e; $E generate "${run[@]}" --temperature 1.0 --out s_part >"$tmp/out" 2>"$tmp/err"; rc=$?; set -e
[ $rc = 1 ] && grep -qF "draft_model" "$tmp/err" || fail "a resume without the drafter was not refused ($rc)"
# a small cache and a host budget of a few blocks: sequences are preempted, some swapped
# out in the middle of a recompute (holding fewer blocks than the rows they captured
# before). The drafter must not run past the target's blocks (its pool is the target's
# size and ran out): greedy equals greedy without a drafter, sampled equals sampled with
# room for everything
$E mkmodel --preset tiny --out m21 --seed 21 >/dev/null 2>&1
$E mkmodel --drafter-for m21 --out d21 --seed 5 >/dev/null 2>"$tmp/err" || fail "mkmodel --drafter-for m21"
pre=(--model m21 --prompts c.jsonl --max-new-tokens 400 --max-seq-len 512 --batch 4 --chunk 8 --threads 1)
tight=(--kv-tokens 704 --host-kv-gb 0.00003)
$E generate "${pre[@]}" --temperature 0 --out p0 2>/dev/null || fail "greedy, m21"
$E generate "${pre[@]}" "${tight[@]}" --temperature 0 --out p1 --draft-model d21 --draft-tokens 2 2>"$tmp/err" ||
    fail "greedy with a drafter, preempted: $(tail -2 "$tmp/err")"
grep -qE "preemptions \([1-9][0-9]* swapped to host" "$tmp/err" || fail "no sequence was swapped out: the case is not covered"
"$PYTHON" "$here/gen_check.py" same p0 p1 >/dev/null || fail "greedy with a drafter, preempted, differs from greedy"
sp21=("${pre[@]}" --temperature 1.0 --draft-model d21 --draft-tokens 2)
$E generate "${sp21[@]}" --out q0 2>/dev/null || fail "sampled with a drafter, m21"
$E generate "${sp21[@]}" "${tight[@]}" --out q1 2>"$tmp/err" || fail "sampled with a drafter, preempted"
"$PYTHON" "$here/gen_check.py" same q0 q1 >/dev/null || fail "sampled with a drafter, preempted, differs"
# a drafter whose logits are NaN (one lm_head row NaN): it draws without them, so its q
# gives its drafts no probability; they are tested as deterministic proposals (exact:
# test_engine_spec verify_no_q) and the run says the drafter is broken, in the report and
# in --log-json. Before, such drafts were accepted whenever the target gave them p > 0.
cp -r drafter dnan
"$PYTHON" - dnan/model.safetensors <<'PY'
import json, struct, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))["lm_head.weight"]
    rows, cols = t["shape"]
    f.seek(8 + n + t["data_offsets"][0] + 5 * cols * 2)  # row 5: every element a BF16 NaN
    f.write(b"\xc0\x7f" * cols)
PY
$E generate "${run[@]}" --temperature 1.0 --out nan1 --draft-model dnan --draft-tokens 2 --log-json nan1.log \
    2>"$tmp/err" || fail "sampled with a NaN drafter: $(tail -2 "$tmp/err")"
grep -q "warning: [1-9][0-9]* drafts had no probability under the drafter's own distribution" "$tmp/err" ||
    fail "a NaN drafter is not reported: $(grep speculative "$tmp/err")"
grep -q '"draft_no_q":[1-9]' nan1.log || fail "--log-json lacks draft_no_q"
grep -q '"draft_no_q":0' g3.log || fail "a working drafter's draft_no_q is not 0"
echo "t_gen_spec_cli: ok"
