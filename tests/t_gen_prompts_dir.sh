#!/usr/bin/env bash
# A prompts directory that holds a job directory: the job's ledgers, job.json and
# manifest end in .jsonl / .json, but are no prompts. Read back, they stopped a rerun as
# bad records, or (with --on-bad-record skip) claimed the ids of the real records, so a
# job wrote nothing. Now --out inside the prompts directory, and any directory holding
# job.json, is skipped; --out equal to a prompts directory is refused.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "t_gen_prompts_dir: $*"; exit 1; }
$E mkmodel --preset tiny --out model --seed 3 >/dev/null 2>&1
mkdir c
for i in 1 2 3 4 5; do echo "{\"id\": \"r$i\", \"prompt\": \"Record $i: name a colour.\"}"; done > c/a.jsonl
args=(--model model --max-new-tokens 4 --max-seq-len 128 --batch 2 --threads 1)

# --out inside the prompts directory: the rerun resumes (nothing to do), with either policy
$E generate "${args[@]}" --prompts c --out c/out 2>/dev/null || fail "first run"
"$PYTHON" "$here/gen_check.py" count c/out 5 >/dev/null || fail "first run: not 5 samples"
$E generate "${args[@]}" --prompts c --out c/out 2> err.txt || fail "rerun: $(tail -n 3 err.txt)"
$E generate "${args[@]}" --prompts c --out c/out --on-bad-record skip 2> err.txt || fail "rerun (skip): $(tail -n 3 err.txt)"
"$PYTHON" "$here/gen_check.py" count c/out 5 >/dev/null || fail "rerun: not 5 samples"
[ ! -s c/out/rejects.jsonl ] || fail "rerun rejected records: $(head -n 3 c/out/rejects.jsonl)"

# another job inside the prompts directory (c/out, from above): a new job elsewhere reads
# only c/a.jsonl
$E generate "${args[@]}" --prompts c --out job2 --on-bad-record skip 2>/dev/null || fail "job2"
"$PYTHON" "$here/gen_check.py" same c/out job2 >/dev/null || fail "job2 differs from c/out"
[ ! -s job2/rejects.jsonl ] || fail "job2 rejected records: $(head -n 3 job2/rejects.jsonl)"

# --out is the prompts directory: refused before anything is written, dry run too
for dry in "" --dry-run; do
    set +e; $E generate "${args[@]}" --prompts c --out c $dry > out.txt 2> err.txt; rc=$?; set -e
    [ $rc -eq 1 ] || fail "--out = --prompts dir ${dry}: exit $rc"
    grep -q "c: an eaglegen job directory" err.txt || fail "--out = --prompts dir ${dry}: $(cat err.txt)"
    [ ! -e c/job.json ] || fail "--out = --prompts dir ${dry}: job.json written"
done
# a prompts directory that is a job directory (holds job.json) is refused by name too
set +e; $E generate "${args[@]}" --prompts c/out --out job3 2> err.txt; rc=$?; set -e
[ $rc -eq 1 ] && grep -q "c/out: an eaglegen job directory" err.txt || fail "job dir as prompts: exit $rc: $(cat err.txt)"
# a directory given with a trailing slash names its files as without one (ids FILE:LINE)
mkdir d && echo '{"prompt": "no id here"}' > d/b.jsonl
$E generate "${args[@]}" --prompts d/ --out slash 2>/dev/null || fail "--prompts d/"
$E inspect slash --list | grep -q " d/b.jsonl:1 " || fail "ids of d/: $($E inspect slash --list | tail -n 1)"
echo "t_gen_prompts_dir: ok"
