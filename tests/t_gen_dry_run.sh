#!/usr/bin/env bash
# generate --dry-run (issue 20): records accepted and rejected by reason, prompt token
# statistics, output tokens under a stated assumption, disk and shards for the model's H
# and aux count; it loads no weights (a model directory without any) and writes nothing.
# docs/DISTRIBUTED.md's Slurm command runs as written (dry) for a Kimi-K2.5 layout, with a
# layout flag. Byte-sized shards (--shard-size) in a real run.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=${EG_KEEP:-$(mktemp -d)}; [ -n "${EG_KEEP:-}" ] || trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; cat out 2>/dev/null; cat err 2>/dev/null; exit 1; }
$E mkmodel --preset tiny --out model --seed 11 >/dev/null 2>&1
mkdir noweights && cp model/config.json model/tiktoken.model model/tokenizer_config.json noweights/
"$PYTHON" - <<'PY'
import json
with open("c.jsonl", "w") as f:
    for i in range(10):
        f.write(json.dumps({"id": f"r{i}", "prompt": "word " * (i + 1)}) + "\n")
    f.write('{"prompt": 5\n')                                  # bad JSON
    f.write(json.dumps({"id": "r3", "prompt": "again"}) + "\n")   # duplicate id
    f.write(json.dumps({"prompt": "word " * 200}) + "\n")         # too long
    f.write(json.dumps({"prompt": "word " * 300}) + "\n")         # too long
PY

echo "-- the report, from config.json alone"
$E generate --dry-run --model noweights --prompts c.jsonl --max-seq-len 128 --max-new-tokens 16 \
    --aux-layers 1,2,3 >out 2>err || fail "dry run"
grep -q "config.json only (no weights loaded): 5 layers, hidden 64" out || fail "model line"
grep -q "records:       14 read: 10 accepted, 4 rejected" out || fail "counts"
grep -q "rejected 2: prompt has N tokens, over the limit of 127 (e.g. c.jsonl:13:" out || fail "too long"
grep -q "rejected 1: duplicate id (e.g. c.jsonl:12:" out || fail "duplicate"
grep -q "rejected 1: invalid JSON" out || fail "bad json"
# a reason's numbers are shown where its records agree on them, N where they differ (they
# were all N: "[N, N)" for the vocabulary's range)
printf '%s\n' '{"input_ids": [1, 999]}' '{"input_ids": [2, 999]}' > ids.jsonl
$E generate --dry-run --model noweights --prompts ids.jsonl --max-seq-len 128 > ids.out 2>err || fail "dry run of ids"
grep -q "rejected 2: input_ids\[1\] is not a token id in \[0, 512) (e.g. ids.jsonl:1:" ids.out || fail "a repeated reason"
printf '%s\n' '{"input_ids": [1, 2, 3, 700]}' >> ids.jsonl
$E generate --dry-run --model noweights --prompts ids.jsonl --max-seq-len 128 > ids.out 2>err || fail "dry run of ids"
grep -q "rejected 3: input_ids\[N\] is not a token id in \[0, 512) (e.g. ids.jsonl:1:" ids.out || fail "a varied reason"
# a byte 0x01 in a reason (the marker of a varied number) is shown as '?', the numbers kept
printf '%s\n' '{"messages": [{"role": "user", "content": [{"type": "img\u00017"}]}]}' > ctl.jsonl
cat ctl.jsonl ctl.jsonl > ctl2.jsonl
$E generate --dry-run --model noweights --prompts ctl2.jsonl --max-seq-len 128 > ids.out 2>err || fail "dry run of ctl"
grep -q 'rejected 2: message 0: content part 0 has unsupported type "img?7"' ids.out || fail "a control byte: $(cat ids.out)"
# --restart of a job needs no weights in a dry run (config only, as on a login node)
$E generate --model model --prompts ids.jsonl --max-seq-len 128 --max-new-tokens 2 --on-bad-record skip --out R1 \
    >/dev/null 2>&1 || fail "a job to restart"
$E generate --dry-run --model noweights --prompts ids.jsonl --max-seq-len 128 --out R1 --restart > ids.out 2>err ||
    fail "dry run --restart with a config-only model: $(cat err)"
grep -q "R1/job.json: --restart deletes this job" ids.out || fail "dry run --restart: $(cat ids.out)"
# prompt lengths straight from the tokenizer, for the same records
"$PYTHON" - <<'PY' || fail "prompt statistics"
import json, re, subprocess, os
E = os.environ["EAGLEGEN"]
lines = [l for l in open("c.jsonl") if l.strip()][:10]
open("ok.jsonl", "w").writelines(lines)
out = subprocess.run([E, "tokenize", "--tokenizer", "noweights", "--chat"], stdin=open("ok.jsonl"),
                     capture_output=True, text=True, check=True).stdout
n = sorted(len(json.loads(l)["ids"]) for l in out.splitlines())
rep = open("out").read()
m = re.search(r"prompt tokens: (\d+) in all; per record min (\d+), median (\d+), p90 (\d+), p99 (\d+), max (\d+)", rep)
assert m, rep
got = [int(x) for x in m.groups()]
assert got == [sum(n), n[0], n[5], n[9], n[9], n[9]], (got, n)
out_tokens = sum(min(16, 128 - k) for k in n)
assert f"output tokens: at most {out_tokens}, assuming every response runs to --max-new-tokens 16" in rep, rep
per = (3 + 2) * 64 * 2 + 5
assert f"{per} B per token = (3 aux + 2 final) x H 64" in rep, rep
PY
grep -q "shards:        1 shard of" out || fail "shards line"
[ ! -e j ] || fail "wrote something"
$E generate --dry-run --model noweights --prompts c.jsonl --out j >/dev/null 2>&1 || fail "dry run with --out"
[ ! -e j ] || fail "a dry run made --out"

echo "-- docs/DISTRIBUTED.md's Slurm command, as written, for Kimi-K2.5 (dry)"
$E mkmodel --preset kimi-k2.5 --no-weights --out kimi >/dev/null 2>&1
mkdir corpus && cp c.jsonl corpus/
"$PYTHON" - "$here/../docs/DISTRIBUTED.md" <<'PY' > slurm.sh || fail "no Slurm script in DISTRIBUTED.md"
import sys, re
doc = open(sys.argv[1]).read()
block = doc.split("## A Slurm array job", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
assert block.startswith("#!/bin/bash"), block[:40]
assert "--stages 8" in block and "--backend cuda" in block, "no layout flag for 8 GPUs"
print(block.replace("/models/Kimi-K2.5", "kimi").replace("/data/corpus/", "corpus/")
      .replace("/shared/kimi-eagle3", "slurm-out").replace("--seed 1", "--seed 1 --dry-run"))
PY
srun() { "$@"; }; export -f srun
EAGLEGEN=$E SLURM_ARRAY_TASK_ID=5 SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=15 SLURM_ARRAY_TASK_STEP=1 \
    SLURM_ARRAY_TASK_COUNT=16 SLURM_PROCID=0 SLURM_NTASKS=1 bash slurm.sh >out 2>err || fail "the Slurm script"
grep -q "worker 5/16" out && grep -q "61 layers, hidden 7168" out || fail "worker or model"
grep -q "cuda backend, 8 pipeline stages over 61 layers (stage k on GPU k)" out || fail "layout"
grep -q "71.69 KB per token = (3 aux + 2 final) x H 7168" out || fail "Kimi width"
[ ! -e slurm-out ] || fail "the dry run wrote a job"

echo "-- shards by bytes"
$E generate --model model --prompts corpus/c.jsonl --out sz --max-new-tokens 8 --max-seq-len 128 --batch 3 --chunk 8 \
    --aux-layers 1,2,3 --threads 1 --shard-size 20K --on-bad-record skip 2>/dev/null || fail "--shard-size run"
"$PYTHON" - sz <<'PY' || fail "shard sizes"
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
sh = m["shards"]
assert len(sh) >= 3, [(s["samples"], s["bytes"]) for s in sh]
# every shard but the last ended at the sample that took it past 20 KB
per = max(s["bytes"] / s["samples"] for s in sh)
for s in sh[:-1]:
    assert 20000 <= s["bytes"] <= 20000 + 2 * per, (s["samples"], s["bytes"])
assert sum(s["samples"] for s in sh) == 10
PY
$E inspect sz --verify >/dev/null || fail "verify"
$E generate --model model --prompts corpus/c.jsonl --out sd --max-new-tokens 8 --max-seq-len 128 --batch 3 --chunk 8 \
    --aux-layers 1,2,3 --threads 1 --on-bad-record skip 2>/dev/null || fail "default run"
[ "$(ls sd/*.tar | wc -l)" = 1 ] || fail "default shards: $(ls sd)"
echo "-- --ep: checked as the run checks it, each rank's experts and slots printed"
$E generate --dry-run --model noweights --prompts c.jsonl --max-seq-len 128 --max-new-tokens 16 --ep 2 --batch 5 \
    >out 2>err || fail "dry run --ep 2"
grep -q "expert ranks:  --ep 2 (rank r on its own thread.*each rank holds 8 of the 16 routed experts" out \
    || fail "--ep 2 layout line"
grep -q "^  rank 0: experts 0..7, 3 of the 5 slots" out && grep -q "^  rank 1: experts 8..15, 2 of the 5 slots" out \
    || fail "--ep 2 ranks"
for bad in "--ep 3:does not divide the model's 16 routed experts" "--ep 4 --batch 2:needs at least one sequence slot"; do
    set +e
    # shellcheck disable=SC2086
    $E generate --dry-run --model noweights --prompts c.jsonl --max-seq-len 128 ${bad%%:*} >out 2>err; rc=$?
    set -e
    [ $rc = 1 ] && grep -qF "${bad#*:}" err || fail "dry run ${bad%%:*}: exit $rc"
done
echo "-- an existing job: the dry run says what the run would do with it (resume, refuse, --restart)"
# sd holds the default run above; the dry run checks the same job file the run checks
job=(--prompts corpus/c.jsonl --out sd --max-new-tokens 8 --max-seq-len 128 --batch 3 --chunk 8 --aux-layers 1,2,3
     --threads 1 --on-bad-record skip)
$E generate --dry-run --model model "${job[@]}" >out 2>err || fail "dry run of the same job"
grep -q "already holds 10 samples; a run resumes it" out && grep -q "checked as the run checks them" out ||
    fail "dry run: no resume line"
# the aux layers left to the config's default resolve as the run resolves them (a job made
# without --aux-layers resumes)
$E generate --model model --prompts corpus/c.jsonl --out sdef --max-new-tokens 2 --max-seq-len 128 --threads 1 \
    --on-bad-record skip --limit 2 2>/dev/null || fail "a run with the default aux layers"
$E generate --dry-run --model model --prompts corpus/c.jsonl --out sdef --max-new-tokens 2 --max-seq-len 128 \
    --threads 1 --on-bad-record skip --limit 2 >out 2>err || fail "dry run of a default-aux job"
grep -q "a run resumes it" out || fail "default aux: no resume line"
set +e
$E generate --dry-run --model model "${job[@]}" --temperature 0.3 >out 2>err; rc=$?
set -e
[ $rc = 1 ] && grep -q "refusing to resume" err && grep -q "temperature: 1 -> 0.3" err ||
    fail "dry run with another temperature: exit $rc, not the run's refusal"
grep -q "a run resumes it" out && fail "dry run promises a resume the run refuses"
set +e
$E generate --model model "${job[@]}" --temperature 0.3 >/dev/null 2>err2; rc2=$?
set -e
[ $rc2 != 0 ] && grep -q "refusing to resume" err2 || fail "the run itself did not refuse (exit $rc2)"
$E generate --dry-run --model model "${job[@]}" --temperature 0.3 --restart >out 2>err ||
    fail "dry run with --restart"
grep -q -- "--restart deletes this job (10 samples) and starts over" out || fail "dry run --restart: no restart line"
[ "$(ls sd/*.tar | wc -l)" = 1 ] || fail "a dry run --restart deleted something"
echo "t_gen_dry_run: ok"
