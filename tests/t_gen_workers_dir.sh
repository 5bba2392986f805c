#!/usr/bin/env bash
# Workers, merges and repairs that used to mix or lose data without a word (from an audit):
# a merge of a merge was checked one level down only (mixed parameters and a partial merge
# passed as complete); a worker started in a merge's output replaced the merged shards; a
# directory's manifest.json listing more than its workers' manifests lost those samples in
# the next merge; workers and a single writer shared a directory (readers see only one of
# them); a repaired merged manifest still read as complete; a worker of another model with
# another worker count joined a directory; a worker with other sampling parameters, or over
# the same inputs with another worker count, joined a directory that readers then took as one
# dataset (mixed or repeated samples). Each is now refused, naming the file.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "t_gen_workers_dir: $*"; exit 1; }
refused() { # WANT CMD...: CMD fails, its stderr holding WANT
    local want=$1; shift
    set +e; "$@" > out.txt 2> err.txt; local rc=$?; set -e
    [ $rc -ne 0 ] && grep -q -- "$want" err.txt || fail "'$*': exit $rc, wanted '$want': $(tail -n 3 err.txt)"
}
$E mkmodel --preset tiny --out model --seed 6 >/dev/null 2>&1
$E mkmodel --preset tiny --out other --seed 7 >/dev/null 2>&1
cp model/config.json other/config.json # one config, other weights
for i in $(seq 1 8); do echo "{\"prompt\": \"Record $i: a colour.\"}"; done > c.jsonl
for i in $(seq 1 3); do echo "{\"id\": \"d$i\", \"prompt\": \"Other $i.\"}"; done > d.jsonl
args=(--model model --prompts c.jsonl --max-new-tokens 4 --max-seq-len 128 --batch 2 --threads 1 --shard-samples 2)
$E generate "${args[@]}" --out ref 2>/dev/null
for w in 0 1; do $E generate "${args[@]}" --out sw$w --worker $w/2 2>/dev/null; done

echo "-- a merge of a merge is checked down to the generate jobs"
$E merge sw0 sw1 --out M >/dev/null 2>&1 && $E merge M --out X >/dev/null 2>&1 || fail "merges of the workers"
"$PYTHON" "$here/gen_check.py" same ref X >/dev/null || fail "a merge of a merge differs from one run"
$E generate --model model --prompts d.jsonl --max-new-tokens 5 --seed 5 --out s5 2>/dev/null
refused "different parameters" $E merge X s5 --out Y
$E merge sw0 --out P1 --allow-partial >/dev/null 2>&1 && $E merge P1 --out P2 --allow-partial >/dev/null 2>&1 ||
    fail "partial merges"
refused "missing" $E merge P2 --out P3
$E merge P2 --out P3 --allow-partial >/dev/null 2>&1 || fail "--allow-partial on a merge of a partial merge"

echo "-- a worker started in a merge's output does not replace the merged shards"
refused "lists shard-w0of2-000000.tar, which this worker's manifest.w0of2.json does not" \
    $E generate "${args[@]}" --out M --worker 0/2 --seed 3
$E inspect M --verify >/dev/null 2>&1 || fail "the merged dataset was damaged by the refused worker"

echo "-- a manifest.json listing more than its directory's workers is not merged from them alone"
cp -a sw0 S && $E generate "${args[@]}" --out S --worker 1/2 2>/dev/null
$E generate --model model --prompts d.jsonl --max-new-tokens 4 --max-seq-len 128 --out dd 2>/dev/null
$E merge S dd --out S >/dev/null 2>&1 || fail "merge S dd --out S"
refused "which no worker manifest of S lists" $E merge S --out S2

echo "-- workers and a single writer in one directory"
$E generate "${args[@]}" --out S1 2>/dev/null
refused "is a single writer's dataset" $E generate "${args[@]}" --out S1 --worker 0/2
[ ! -e S1/manifest.w0of2.json ] && [ ! -e S1/job.w0of2.json ] || fail "the refused worker left files"
refused "workers write this directory" $E generate "${args[@]}" --out sw0
$E inspect sw0 >/dev/null 2>&1 || fail "the workers' directory after the refused single writer"

echo "-- a repaired merged manifest is not complete"
rm -f M/shard-w1of2-000001.tar
$E repair M > /dev/null 2>&1 || fail "repair of the merged dataset"
refused "repaired" $E merge M --out R
$E merge M --out R --allow-partial >/dev/null 2>&1 || fail "--allow-partial on the repaired merge"

echo "-- a worker of another model and another worker count"
$E generate "${args[@]}" --out mn --worker 0/2 2>/dev/null
refused "fingerprints.model_weights: " $E generate --model other "${args[@]:2}" --out mn --worker 0/3

echo "-- a worker with other sampling parameters, or the same inputs split another way"
cp -a sw0 J
refused "job.w0of2.json, another worker of this dataset, was made with parameters that change samples" \
    $E generate "${args[@]}" --out J --worker 1/2 --seed 9
grep -q "seed: 0 -> 9" err.txt || fail "the difference is not listed: $(cat err.txt)"
refused "job.w0of2.json, another worker of this dataset, was made with parameters that change samples" \
    $E generate "${args[@]}" --out J --worker 1/2 --seed 9 --dry-run
grep -q "seed: 0 -> 9" err.txt || fail "the dry run does not list the difference: $(cat err.txt)"
$E generate "${args[@]}" --out J --worker 1/2 --dry-run > out.txt 2> err.txt || fail "dry run of the worker that agrees"
grep -q "no job yet" out.txt || fail "dry run: $(cat out.txt)"
[ ! -e J/job.w1of2.json ] && [ ! -e J/manifest.w1of2.json ] || fail "the refused worker left files"
refused "splits its inputs over 2 workers, this one over 3, and they share an input file" $E generate "${args[@]}" --out J --worker 1/3
[ ! -e J/job.w1of3.json ] || fail "the refused worker 1/3 left its job file"
# an input list that extends the other one shares its records too
refused "splits its inputs over 2 workers, this one over 3, and they share an input file" \
    $E generate "${args[@]}" --prompts d.jsonl --out J --worker 1/3
$E generate "${args[@]:0:2}" --prompts d.jsonl "${args[@]:4}" --out J --worker 1/3 2>/dev/null ||
    fail "a worker over other inputs with the same parameters"
# a worker's resume refused for its parameters does not point to --restart, which its
# neighbours' job files would refuse too
refused "a worker's --restart keeps the other workers' parameters" $E generate "${args[@]}" --out J --worker 0/2 --seed 9
refused "another worker of this dataset, was made with parameters that change samples" \
    $E generate "${args[@]}" --out J --worker 0/2 --seed 9 --restart
[ -e J/job.w0of2.json ] || fail "the refused --restart removed the worker's job file"
$E generate "${args[@]}" --out J --worker 1/2 2>/dev/null || fail "the missing worker with the same parameters"
$E inspect J --verify >/dev/null 2>&1 || fail "J after the workers that agree"
echo "t_gen_workers_dir: ok"
