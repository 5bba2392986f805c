#!/usr/bin/env bash
# End to end on a mkmodel model: generate -> shards; the stored tokens are the rendered,
# tokenized prompt plus the generated tokens, the loss mask covers exactly the response,
# the stored hidden states equal `eaglegen forward` over the same tokens; capture mode;
# bad records per policy; changed parameters refused on resume.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 7 >/dev/null 2>&1

# a corpus of every record style, each ending on a user turn (so the regenerate prompt
# is the whole conversation + the generation prompt)
"$PYTHON" - <<'PY'
import json
recs = []
for i in range(10):
    recs.append({"id": f"m{i}", "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]})
recs.append({"id": "sg", "conversations": [{"from": "human", "value": "Say hello in French."}]})
recs.append({"id": "sf", "conversations": [{"role": "user", "content": "Count to five."}]})
recs.append({"id": "pr", "prompt": "Name three primes."})
recs.append({"id": "mt", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "How are you?"}]})
with open("corpus.jsonl", "w") as f:
    for r in recs: f.write(json.dumps(r) + "\n")
PY
$E tokenize --tokenizer model < corpus.jsonl > tokenized.raw
"$PYTHON" - <<'PY'
import json
recs = [json.loads(l) for l in open("corpus.jsonl")]
toks = [json.loads(l) for l in open("tokenized.raw")]
with open("tokenized.jsonl", "w") as f:
    for r, t in zip(recs, toks): f.write(json.dumps({"id": r["id"], "ids": t["ids"]}) + "\n")
cfg = json.load(open("model/config.json")); tc = cfg.get("text_config", cfg)
sp = {v["content"]: int(k) for k, v in json.load(open("model/tokenizer_config.json"))["added_tokens_decoder"].items()}
eos = tc.get("eos_token_id", cfg.get("eos_token_id")); eos = eos if isinstance(eos, list) else [eos]
json.dump({"stop": [sp["<|im_end|>"]] + eos, "max_new": 24}, open("stop.json", "w"))
PY

echo "-- regenerate: prompts, mask, finish reasons"
$E generate --model model --prompts corpus.jsonl --out job --max-new-tokens 24 --max-seq-len 512 \
    --batch 4 --chunk 16 --shard-samples 3 --aux-layers 0,2,3 --seed 5 2> log || { cat log; exit 1; }
"$PYTHON" "$here/gen_check.py" count job 14
"$PYTHON" "$here/gen_check.py" prompts job tokenized.jsonl
$E inspect job --verify >/dev/null

echo "-- stored hidden states equal eaglegen forward, bit for bit (the CPU backend is chunk- and batch-invariant)"
"$PYTHON" "$here/gen_check.py" export-prompts job 5 ids.json fw.json
$E forward --model model --prompts fw.json --out fw.safetensors 2>/dev/null
"$PYTHON" "$here/gen_check.py" forward-exact job ids.json fw.safetensors

echo "-- resume with the same command adds nothing; a changed parameter is refused"
$E generate --model model --prompts corpus.jsonl --out job --max-new-tokens 24 --max-seq-len 512 \
    --batch 4 --chunk 16 --shard-samples 3 --aux-layers 0,2,3 --seed 5 2> log2
grep -q "0 samples written, 14 already done" log2 || { cat log2; echo "resume did not skip the done records"; exit 1; }
if $E generate --model model --prompts corpus.jsonl --out job --max-new-tokens 24 --max-seq-len 512 \
    --batch 4 --chunk 16 --shard-samples 3 --aux-layers 0,2,3 --seed 6 2> log3; then
    echo "a changed --seed was accepted"; exit 1
fi
grep -q "seed: 5 -> 6" log3 || { cat log3; exit 1; }

echo "-- batch size and chunking do not change any sample (per-sample seeds)"
$E generate --model model --prompts corpus.jsonl --out job-b1 --max-new-tokens 24 --max-seq-len 512 \
    --batch 1 --chunk 5 --shard-samples 100 --aux-layers 0,2,3 --seed 5 2>/dev/null
"$PYTHON" "$here/gen_check.py" same job job-b1

echo "-- pipeline stages on threads (local transport, micro-batches in flight): same samples"
$E generate --model model --prompts corpus.jsonl --out job-pp --max-new-tokens 24 --max-seq-len 512 \
    --batch 4 --chunk 16 --shard-samples 3 --aux-layers 0,2,3 --seed 5 --stages 1,3,5 --micro-batches 4 \
    --transport local 2> logpp || { cat logpp; exit 1; }
grep -q "transport between stages: local, 4 micro-batches" logpp || { cat logpp; exit 1; }
"$PYTHON" "$here/gen_check.py" same job job-pp
if $E generate --model model --prompts corpus.jsonl --out job-nccl --max-new-tokens 24 --max-seq-len 512 \
    --batch 4 --stages 2 --transport nccl 2> lognccl; then
    echo "--transport nccl on CPU stages was accepted"; exit 1
fi
grep -q "nccl transport" lognccl || { cat lognccl; exit 1; }

echo "-- capture mode: teacher-forced assistant turns, mask on the assistant spans"
head -c 0 /dev/null > conv.jsonl
"$PYTHON" - <<'PY'
import json
with open("conv.jsonl", "w") as f:
    for i in range(4):
        f.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Add {i} and 2."},
                {"role": "assistant", "content": f"{i + 2}."}, {"role": "user", "content": "Thanks"},
                {"role": "assistant", "content": "You are welcome."}]}) + "\n")
PY
$E generate --model model --prompts conv.jsonl --out cap --mode capture --max-seq-len 512 --log-json cap.log 2>/dev/null
"$PYTHON" -c "
import json
rows = [json.loads(l) for l in open('cap.log')]
assert rows and rows[-1]['samples'] == 4 and rows[-1]['records_done'] == 4, rows[-1]
"
"$PYTHON" "$here/gen_check.py" capture cap model
"$PYTHON" "$here/gen_check.py" count cap 4

echo "-- bad records: error names file and line; skip logs them and counts"
cp corpus.jsonl bad.jsonl
printf '%s\n' '{"messages": [{"role": "wizard", "content": "x"}]}' '{"broken' >> bad.jsonl
if $E generate --model model --prompts bad.jsonl --out bad-err --max-new-tokens 8 --max-seq-len 512 2> log4; then
    echo "a bad record did not stop the run"; exit 1
fi
grep -q "bad.jsonl:15" log4 || { cat log4; echo "the error does not name file:line"; exit 1; }
$E generate --model model --prompts bad.jsonl --out bad-skip --max-new-tokens 8 --max-seq-len 512 \
    --on-bad-record skip 2> log5
[ "$(wc -l < bad-skip/rejects.jsonl)" -eq 2 ] || { cat bad-skip/rejects.jsonl; exit 1; }
grep -q '"line":16' bad-skip/rejects.jsonl
"$PYTHON" - <<'PY'
import json
m = json.load(open("bad-skip/manifest.json"))
c = m["counts"]
assert c["rejected"] == 2 and c["generated"] == 14, c
PY
"$PYTHON" "$here/gen_check.py" count bad-skip 14

echo "-- --drop-truncated leaves out and counts samples that hit the limit"
$E generate --model model --prompts corpus.jsonl --out trunc --max-new-tokens 3 --max-seq-len 512 \
    --drop-truncated --temperature 0 2>/dev/null
"$PYTHON" - <<'PY'
import json
m = json.load(open("trunc/manifest.json"))
c = m["counts"]
assert c["dropped"] + c["generated"] == 14 and c["dropped"] > 0, c
PY
echo "t_gen_e2e: ok"
