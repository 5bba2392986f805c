#!/usr/bin/env bash
# Crash safety of the shard writer: kill -9 a writer at random moments (~20 times),
# then check that every visible shard and the manifest are complete and valid, that
# nothing committed was lost, and that the writer continues from the manifest.
set -u
BIN="$BUILD/tests/test_dataset_writer"
[ -x "$BIN" ] || { echo "t_dataset_kill: $BIN not built"; exit 1; }
DIR=$(mktemp -d /tmp/eg_ds_kill.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
DS="$DIR/ds"
RANDOM=${EG_SEED:-12345}
echo "  (seed ${EG_SEED:-12345}; set EG_SEED to change)"
"$BIN" --loop "$DS" 0 || { echo "cannot create dataset"; exit 1; }
prev=0
for i in $(seq 1 20); do
    "$BIN" --loop "$DS" &
    pid=$!
    sleep "0.$(printf %03d $((RANDOM % 300 + 20)))"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    n=$("$BIN" --check "$DS") || { echo "iteration $i: check failed after kill -9"; exit 1; }
    if [ "$n" -lt "$prev" ]; then echo "iteration $i: committed samples went from $prev to $n"; exit 1; fi
    prev=$n
done
echo "  $prev samples committed across 20 kills"
[ "$prev" -gt 0 ] || { echo "writer never committed anything"; exit 1; }
# continue to a clean end: exactly 10 more, no leftovers
"$BIN" --loop "$DS" 10 || { echo "resume failed"; exit 1; }
n=$("$BIN" --check "$DS") || { echo "final check failed"; exit 1; }
[ "$n" -eq $((prev + 10)) ] || { echo "after resume: $n samples, expected $((prev + 10))"; exit 1; }
if ls "$DS" | grep -q '\.tmp$'; then echo "temporary files left after a clean close"; ls "$DS"; exit 1; fi
echo "t_dataset_kill: ok"
