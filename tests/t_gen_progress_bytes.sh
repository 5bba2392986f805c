#!/usr/bin/env bash
# Progress on compressed corpora (gz, zst, xz, bz2), whose record count is not known in
# advance, follows the input bytes consumed: --log-json lines carry input_bytes_done and
# input_bytes_total (the files' stored size), never decreasing, ending at the total; a
# plain file has a record count instead; stdin has neither.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 3 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json, random
random.seed(1)
with open("c.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"prompt": f"item {i} " + " ".join(str(random.random()) for _ in range(4))}) + "\n")
PY
args=(--model model --max-new-tokens 1 --max-seq-len 512 --batch 16 --chunk 64 --shard-samples 1000 --aux-layers 1 --threads 1)
check() { # LOG SIZE (SIZE -1: unknown) RECORDS_TOTAL
    "$PYTHON" - "$@" <<'PY'
import json, sys
log, size, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = [json.loads(l) for l in open(log)]
assert lines and lines[-1]["phase"] == "done", lines[-1:]
done = [l["input_bytes_done"] for l in lines]
assert all(a <= b for a, b in zip(done, done[1:])), done
last = lines[-1]
assert last["input_bytes_total"] == size, (last["input_bytes_total"], size)
assert last["records_total"] == total, (last["records_total"], total)
if size > 0:
    assert last["input_bytes_done"] == size, (last["input_bytes_done"], size)
else:
    assert last["input_bytes_done"] > 0, last
print(f"ok: {log}: {len(lines)} lines, {last['input_bytes_done']} of {size} bytes, records_total {total}")
PY
}
for z in "gzip -c" "zstd -q -c" "xz -c" "bzip2 -c"; do
    ext=${z%% *}
    $z c.jsonl > "c.$ext"
    $E generate "${args[@]}" --prompts "c.$ext" --out "o.$ext" --log-json "$ext.log" 2>/dev/null
    check "$ext.log" "$(stat -c %s "c.$ext")" -1
done
$E generate "${args[@]}" --prompts c.jsonl --out o.plain --log-json plain.log 2>/dev/null
check plain.log "$(stat -c %s c.jsonl)" 40
$E generate "${args[@]}" --prompts - --out o.stdin --log-json stdin.log < c.jsonl 2>/dev/null
check stdin.log -1 -1
echo "t_gen_progress_bytes: ok"
