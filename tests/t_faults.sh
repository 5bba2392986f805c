#!/usr/bin/env bash
# Fault injection on the writer with strace (-f: the writer's I/O thread too):
#  - kill -9 on entering the Nth rename / fsync / openat / write (strace
#    -e inject=SYSCALL:signal=SIGKILL:when=N);
#  - ENOSPC / EIO returned by the Nth write, fsync or rename (-e inject=...:error=E).
# After each: whatever dataset is visible passes `inspect --verify`, and rerunning the same
# command (no strace) ends bit-identical to an uninterrupted run (tests/gen_check.py same).
# `repair` is killed the same way at its log lines and renames; a plain repair then logs
# every damaged shard with its ids and the rerun is identical.
# A few chosen points on a tiny model keep it short. SKIPs (passes, says why) where strace
# is missing or ptrace is not permitted.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v strace >/dev/null; then echo "SKIP: strace not installed (.ci/deps.sh installs it)"; exit 0; fi
if ! strace -f -o /dev/null true 2>/dev/null; then echo "SKIP: strace cannot trace here (ptrace not permitted)"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
$E mkmodel --preset tiny --out model --seed 21 >/dev/null 2>&1
for i in $(seq 1 8); do echo "{\"prompt\": \"Record $i: say something about $((i * 7)).\"}"; done > corpus.jsonl
echo '{"prompt": 5}' >> corpus.jsonl # a bad record, so the rejects ledger is written too
args=(--model model --prompts corpus.jsonl --max-new-tokens 8 --max-seq-len 128 --batch 3 --chunk 8
      --shard-samples 2 --threads 1 --on-bad-record=skip)
$E generate "${args[@]}" --out ref 2>/dev/null
"$PYTHON" "$here/gen_check.py" count ref 8 >/dev/null

runs=0
fault() { # SPEC (strace inject expression) EXPECT (kill|error)
    local spec=$1 expect=$2 dir=job$runs
    runs=$((runs + 1))
    set +e
    strace -f -qq -o /dev/null -e inject="$spec" $E generate "${args[@]}" --out "$dir" 2>"$dir.err" &
    wait $! # (in the background: the shell does not announce the kill)
    local rc=$?
    set -e
    case "$expect:$rc" in
        kill:137 | error:1 | error:0) ;; # error:0 — the fault hit a write that does not matter (stderr)
        *) echo "FAIL: $spec: exit status $rc"; tail -n 5 "$dir.err"; exit 1 ;;
    esac
    if [ "$expect:$rc" = error:1 ] && ! grep -qE "No space left on device|Input/output error" "$dir.err"; then
        echo "FAIL: $spec: the failure does not name the error"; tail -n 3 "$dir.err"; exit 1
    fi
    if [ -f "$dir/manifest.json" ]; then
        $E inspect "$dir" --verify >/dev/null 2>"$dir.verify" || { echo "FAIL: $spec: inspect --verify"; cat "$dir.verify"; exit 1; }
    fi
    $E generate "${args[@]}" --out "$dir" 2>"$dir.resume" || { echo "FAIL: $spec: resume"; tail -n 5 "$dir.resume"; exit 1; }
    "$PYTHON" "$here/gen_check.py" same ref "$dir" >/dev/null || { echo "FAIL: $spec: not identical after resume"; exit 1; }
    $E inspect "$dir" --verify >/dev/null
    printf '  %-40s exit %3d, resumed identical\n' "$spec" "$rc"
}

# when=N counts per thread: this run makes about 2 renames, 6 fsyncs, 36 openats and 22-24
# writes on the main thread (stderr lines, ledgers, job.json) and 9 / 18 / 19 / 61 on the
# writer's I/O thread (shard appends, shard and manifest renames, their fsyncs); the points
# below fall on both. An injected write error lands only past the main thread's writes
# (when >= 40) or before its first error could be reported (when=3): a failure injected
# into the very line that reports the error would hide it, which no real disk does to
# stderr.
echo "-- kill -9 at chosen system calls"
for n in 1 2 5 9; do fault "rename:signal=SIGKILL:when=$n" kill; done
for n in 2 6 11 17; do fault "fsync:signal=SIGKILL:when=$n" kill; done
for n in 12 20 36; do fault "openat:signal=SIGKILL:when=$n" kill; done
for n in 5 30 57; do fault "write:signal=SIGKILL:when=$n" kill; done
echo "-- disk full and I/O errors"
for n in 3 40 50; do fault "write:error=ENOSPC:when=$n" error; done
for n in 3 12; do fault "fsync:error=EIO:when=$n" error; done
fault "rename:error=EIO:when=4" error
fault "write:error=EIO:when=45" error

echo "-- kill -9 at each rename of a resume whose inputs changed (the rejects ledger is rebuilt)"
# The ledger names bad records by their index in the inputs. A fixed bad line changes the
# inputs: the old ledger is set aside and job.json takes the new fingerprint. Killed between
# the two, the next run must not find the new fingerprint beside the old ledger, which would
# skip the fixed record for good.
mkdir -p cj r
for i in 1 2 3; do echo "{\"prompt\": \"Fixed $i: count to $i.\"}"; done > r/in.jsonl
{ sed -n 1p r/in.jsonl; echo '{"prompt": 5'; sed -n 3p r/in.jsonl; } > cj/in.jsonl
cargs=(--model ../model --prompts in.jsonl --max-new-tokens 6 --max-seq-len 128 --batch 3 --chunk 8
       --threads 1 --on-bad-record skip)
(cd r && $E generate "${cargs[@]}" --out ../cref 2>/dev/null)
(cd cj && $E generate "${cargs[@]}" --out ../cbase 2>/dev/null)
"$PYTHON" "$here/gen_check.py" count cbase 2 >/dev/null
cp r/in.jsonl cj/in.jsonl
renames=0
for n in 1 2 3 4; do
    rm -rf cjob && cp -r cbase cjob
    set +e
    (cd cj && strace -f -qq -o /dev/null -e inject=rename,renameat,renameat2:signal=SIGKILL:when=$n \
        $E generate "${cargs[@]}" --out ../cjob 2>../cjob.err) 2>/dev/null &
    wait $!
    rc=$?
    set -e
    (cd cj && $E generate "${cargs[@]}" --out ../cjob 2>../cjob.resume) \
        || { echo "FAIL: changed inputs, rename $n: resume"; tail -n 5 cjob.resume; exit 1; }
    "$PYTHON" "$here/gen_check.py" same cref cjob >/dev/null \
        || { echo "FAIL: changed inputs, kill at rename $n (exit $rc): the fixed record is missing after resume"; exit 1; }
    printf '  %-40s exit %3d, resumed identical\n' "changed inputs, rename when=$n" "$rc"
    [ $rc = 137 ] && renames=$((renames + 1))
    runs=$((runs + 1))
done
[ $renames -ge 2 ] || { echo "FAIL: only $renames of the kills hit a rename: the test no longer covers the set-aside"; exit 1; }
echo "-- kill -9 inside repair: at each log line, each rename (the shards moved, the manifest)"
# Two damaged shards. After the kill, a plain repair finishes the job: every damaged shard
# has a line in quarantine/repair.jsonl with the ids it held (the line is written before
# the shard moves; the other order, killed between them, left the shard in quarantine and
# its rerun saw it missing: ids null), quarantine/ holds the damaged bytes, and the rerun
# of generate is identical to the reference.
$E generate "${args[@]}" --out rbase 2>/dev/null
ids_of() { "$PYTHON" -c "import sys; sys.path.insert(0, '$here/../dataset/python'); import eaglegen_data as g
print(' '.join(g.ShardIndex('$1').ids))"; }
s1=$(ls rbase/shard-*.tar | sed -n 2p) s3=$(ls rbase/shard-*.tar | sed -n 4p)
ids1=$(ids_of "$s1") ids3=$(ids_of "$s3")
"$PYTHON" -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[700] ^= 1; open(p, 'wb').write(b)" "$s1"
"$PYTHON" -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[900] ^= 4; open(p, 'wb').write(b)" "$s3"
cp "$s1" bad1.tar && cp "$s3" bad3.tar
kills=0
for spec in "-P @/quarantine/repair.jsonl -e inject=openat:signal=SIGKILL:when=1" \
            "-P @/quarantine/repair.jsonl -e inject=openat:signal=SIGKILL:when=2" \
            "-e inject=rename:signal=SIGKILL:when=1" "-e inject=rename:signal=SIGKILL:when=2" \
            "-e inject=rename:signal=SIGKILL:when=3"; do
    d=$tmp/rjob$kills
    rm -rf "$d" && cp -r rbase "$d"
    set +e
    strace -f -qq -o /dev/null ${spec//@/$d} $E repair "$d" >/dev/null 2>&1 &
    { wait $!; } 2>/dev/null
    rc=$?
    set -e
    [ $rc = 137 ] || { echo "FAIL: repair under '$spec': exit $rc, not killed"; exit 1; }
    $E repair "$d" > "$d.out" 2>&1 || { echo "FAIL: repair after '$spec'"; cat "$d.out"; exit 1; }
    "$PYTHON" - "$d" "$(basename "$s1")" "$ids1" "$(basename "$s3")" "$ids3" <<'PYEOF' || { echo "FAIL: after '$spec'"; exit 1; }
import json, sys
d, pairs = sys.argv[1], sys.argv[2:]
lines = [json.loads(l) for l in open(f"{d}/quarantine/repair.jsonl")]
for shard, ids in zip(pairs[::2], pairs[1::2]):
    got = [l["ids"] for l in lines if l["shard"] == shard and l["ids"] is not None]
    if not got or any(g != ids.split() for g in got):
        sys.exit(f"{shard}: logged ids {[l['ids'] for l in lines if l['shard'] == shard]}, the shard held {ids.split()}")
PYEOF
    cmp -s "$d/quarantine/$(basename "$s1")" bad1.tar && cmp -s "$d/quarantine/$(basename "$s3")" bad3.tar \
        || { echo "FAIL: after '$spec': quarantine/ does not hold the damaged shards"; ls "$d/quarantine"; exit 1; }
    $E generate "${args[@]}" --out "$d" 2>"$d.resume" || { echo "FAIL: after '$spec': rerun"; tail -n 5 "$d.resume"; exit 1; }
    "$PYTHON" "$here/gen_check.py" same ref "$d" >/dev/null || { echo "FAIL: after '$spec': not identical"; exit 1; }
    printf '  %-62s repaired, rerun identical\n' "${spec#-P @/}"
    kills=$((kills + 1)); runs=$((runs + 1))
done

echo "-- two workers starting at once into a new directory (the first one's lock delayed 2 s)"
# The one refused (another model's weights; the same worker index twice) takes back only
# what it made: it used to remove the job file, or the whole directory it had created,
# from under the worker that runs.
$E mkmodel --preset tiny --out other --seed 22 >/dev/null 2>&1
cp model/config.json other/config.json # one config, other weights
wargs=(--prompts corpus.jsonl --max-new-tokens 8 --max-seq-len 128 --batch 3 --chunk 8 --threads 1 --on-bad-record=skip)
for case in "0/2 other 1/2 model" "1/2 model 1/2 model"; do
    set -- $case
    d=$tmp/race$runs
    rm -rf "$d"
    strace -f -qq -o /dev/null -e trace=flock -e inject=flock:delay_enter=2000000 \
        $E generate --model model "${wargs[@]}" --out "$d" --worker $1 > /dev/null 2> "$d.a" &
    pa=$!
    sleep 0.7
    $E generate --model $2 "${wargs[@]}" --out "$d" --worker $3 2> "$d.b" || { echo "FAIL: race $case: the second worker failed"; tail -n 3 "$d.b"; exit 1; }
    set +e; { wait $pa; } 2>/dev/null; rca=$?; set -e
    # other weights: refused; the same worker: refused while the other holds it, or (the
    # other done by the time the lock came) resumed with nothing left to do
    if [ $2 = other ]; then
        [ $rca -ne 0 ] && grep -q "fingerprints.model_weights: " "$d.a" || { echo "FAIL: race $case: exit $rca: $(tail -n 2 "$d.a")"; exit 1; }
    elif [ $rca -ne 0 ]; then
        grep -q "another writer is using this dataset" "$d.a" || { echo "FAIL: race $case: exit $rca: $(tail -n 2 "$d.a")"; exit 1; }
    fi
    $E inspect "$d" --verify > /dev/null 2> "$d.v" || { echo "FAIL: race $case: the running worker's data: $(cat "$d.v")"; exit 1; }
    b=${3%/2}
    [ -f "$d/job.w${b}of2.json" ] || { echo "FAIL: race $case: the running worker's job file is gone"; ls -a "$d"; exit 1; }
    $E generate --model $2 "${wargs[@]}" --out "$d" --worker $3 2> "$d.c" || { echo "FAIL: race $case: its resume: $(tail -n 2 "$d.c")"; exit 1; }
    printf '  %-40s the refused one left the other intact\n' "race: $1 model vs $3 $2"
    runs=$((runs + 1))
done

echo "ok: $runs injected runs, each verified and resumed bit-identical"
