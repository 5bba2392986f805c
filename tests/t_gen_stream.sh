#!/usr/bin/env bash
# A corpus streamed through a pipe is worked on as it arrives: a producer writes one
# record, waits (up to 60 s) until generate has committed its sample while the pipe stays
# open, then writes the next in two parts, and so on; stdin and a named FIFO, plain and
# zstd; and a process substitution. Before, libarchive's format sniffing held the first 64 KiB (here: everything) and
# a free slot waited in read() for the next line while the sequences in flight stalled.
# The samples equal those of the same records read from a file.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 5 >/dev/null 2>&1
args=(--model model --max-new-tokens 24 --max-seq-len 256 --batch 4 --aux-layers 1 --threads 1 --seed 2)
printf '%s\n' '{"id": "a", "prompt": "first one"}' '{"id": "b", "prompt": "second, sent in two parts"}' \
    '{"id": "c", "prompt": "third"}' > c.jsonl
$E generate "${args[@]}" --prompts c.jsonl --out ref 2>/dev/null

# produce OUT: writes c.jsonl's lines to stdout one by one, each after the previous one's
# sample is in OUT/done.jsonl; exits 3 when one does not come within 60 s
produce() {
    "$PYTHON" - "$1" <<'PY'
import json, os, sys, time
out = sys.argv[1]
def done_ids():
    try:
        return {json.loads(l)["id"] for l in open(os.path.join(out, "done.jsonl")) if l.strip()}
    except FileNotFoundError:
        return set()
lines = open("c.jsonl", "rb").read().splitlines(keepends=True)
for i, line in enumerate(lines):
    if i == 1:  # half a line, a pause, the rest
        sys.stdout.buffer.write(line[:10]); sys.stdout.flush(); time.sleep(0.5); line = line[10:]
    sys.stdout.buffer.write(line); sys.stdout.flush()
    want = json.loads(lines[i])["id"]
    t0 = time.time()
    while want not in done_ids():
        if time.time() - t0 > 60:
            sys.stderr.write(f"produce: sample {want} not written within 60 s while the pipe stayed open\n")
            sys.exit(3)
        time.sleep(0.05)
print(f"produce: {len(lines)} samples written as their lines arrived", file=sys.stderr)
PY
}
same() { # OUT: the same samples as ref
    "$PYTHON" - "$1" <<'PY'
import json, sys
a = sorted(open("ref/done.jsonl").read().split())
b = sorted(open(sys.argv[1] + "/done.jsonl").read().split())
assert a == b, (a, b)
PY
}

produce s.plain | $E generate "${args[@]}" --prompts - --out s.plain 2>s.plain.log
same s.plain
echo "ok: stdin, plain: each sample made while the pipe stayed open"

mkfifo f.fifo
produce s.fifo > f.fifo &
pid=$!
$E generate "${args[@]}" --prompts f.fifo --out s.fifo 2>s.fifo.log
wait $pid
same s.fifo
echo "ok: named FIFO, plain"

# a process substitution is a pipe too: nothing else may read it first (the job's input
# fingerprint and the progress line count each ate the first MiB: no sample came out)
$E generate "${args[@]}" --prompts <(cat c.jsonl) --out s.subst 2>/dev/null
same s.subst
grep -q '"pipe": true' s.subst/job.json
$E generate "${args[@]}" --prompts <(cat c.jsonl) --out s.subst 2>s.subst.log # resumes: a pipe matches a pipe
grep -q "0 samples written, 3 already done" s.subst.log
echo "ok: <(...) read once, resumed"

if command -v zstd >/dev/null; then
    # compressed: frames are flushed per line, so libarchive sees each line's bytes; it may
    # read ahead, so only the end result is checked
    zstd -q -c c.jsonl | $E generate "${args[@]}" --prompts - --out s.zst 2>/dev/null
    same s.zst
    echo "ok: stdin, zstd"
fi
# a stdin its parent left non-blocking (O_NONBLOCK): waited on, not a read error
"$PYTHON" - "$E" "${args[@]}" <<'PY'
import fcntl, os, subprocess, sys, time
r, w = os.pipe()
fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
p = subprocess.Popen([sys.argv[1], "generate", *sys.argv[2:], "--prompts", "-", "--out", "s.nonblock"], stdin=r,
                     stderr=subprocess.DEVNULL)
os.close(r)
for line in open("c.jsonl", "rb"):
    time.sleep(0.3)
    os.write(w, line)
os.close(w)
assert p.wait() == 0, p.returncode
PY
same s.nonblock
echo "ok: non-blocking stdin"
# an empty pipe and a pipe that ends without a newline
: | $E generate "${args[@]}" --prompts - --out s.empty 2>/dev/null
test "$(wc -c < s.empty/done.jsonl)" -eq 0
printf '%s' '{"id": "a", "prompt": "first one"}' | $E generate "${args[@]}" --prompts - --out s.nonl 2>/dev/null
grep -q '"a"' s.nonl/done.jsonl
echo "t_gen_stream: ok"
