#!/usr/bin/env bash
# eaglegen inspect on damaged or hostile datasets: a shard index declaring 2^30 aux layers,
# an index id with a NUL byte, a manifest histogram id far outside the vocabulary, and bad
# --stats-samples values, index and trailer fields both readers check (flags, finish
# byte, entry order, reserved bytes) are refused with a message naming the file (no crash, no huge
# allocation); a single shard's summary counts its distinct loss-masked ids.
set -u
BIN="$BUILD/tests/test_dataset_writer"
EG="${EAGLEGEN:-$BUILD/eaglegen}"
PY="${PYTHON:-/usr/bin/python3}"
[ -x "$BIN" ] && [ -x "$EG" ] || { echo "t_dataset_corrupt: $BIN or $EG not built"; exit 1; }
DIR=$(mktemp -d /tmp/eg_ds_corrupt.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "t_dataset_corrupt: $*"; exit 1; }
rewrite() { # SRC DST KWARGS: shard copy with its index rewritten (dataset/python/test_eaglegen_data.py)
    "$PY" -c "import sys; sys.path.insert(0, 'dataset/python'); import test_eaglegen_data as t; t.rewrite_index('$1', '$2', $3)"
}

"$BIN" --fixture "$DIR/ds" >/dev/null || fail "fixture"
SH="$DIR/ds/shard-000000.tar"

# index with n_aux = 2^30: refused at open, naming the shard
rewrite "$SH" "$DIR/naux.tar" "n_aux=1 << 30" || fail "rewrite n_aux"
"$EG" inspect "$DIR/naux.tar" > /dev/null 2> "$DIR/err"; rc=$?
[ $rc -eq 1 ] || fail "n_aux 2^30: rc $rc"
grep -q "naux.tar.*n_aux=1073741824" "$DIR/err" || fail "n_aux 2^30: message: $(cat "$DIR/err")"

# index id with a NUL byte: refused (a prefix id must not match it)
rewrite "$SH" "$DIR/nul.tar" "id0=b'py000000\\0zz'" || fail "rewrite nul"
"$EG" inspect "$DIR/nul.tar" --verify > /dev/null 2> "$DIR/err"; rc=$?
[ $rc -eq 1 ] || fail "NUL id: rc $rc"
grep -q "nul.tar.*NUL" "$DIR/err" || fail "NUL id: message: $(cat "$DIR/err")"
rewrite "$SH" "$DIR/same.tar" "id0=b'py000000'" || fail "rewrite same"
"$EG" inspect "$DIR/same.tar" --verify > /dev/null 2> "$DIR/err" || fail "rewritten shard with an unchanged id: $(cat "$DIR/err")"

# index and trailer fields both readers check alike (each refuses, the message naming
# what is wrong): flags that differ, an unknown flag bit in both, a finish byte of 2,
# entries out of order, a reserved byte of an entry or of the trailer
pyread() { # SHARD: the Python loader's verdict, "read N" or the error
    "$PY" -c "import sys; sys.path.insert(0, 'dataset/python'); import eaglegen_data as g
try:
    d = g.EagleGenDataset('$1'); print('read', len(d))
except g.EagleGenDataError as e: print(e)"
}
fl=$("$PY" -c "import struct; b=open('$SH','rb').read(); print(struct.unpack_from('<I', b, len(b)-1536+12)[0])")
for case in "flags=$((fl ^ 1))|index flags" "flags=$((fl | 8)), trailer_flags=$((fl | 8))|unknown flags" \
            "finish0_byte=2|entry 0 malformed" "swap01=True|bad offset/size" \
            "entry0_reserved=1|entry 0 malformed" "trailer_reserved=1|trailer: reserved bytes are not zero"; do
    kw=${case%%|*} want=${case#*|}
    rewrite "$SH" "$DIR/x.tar" "$kw" || fail "rewrite $kw"
    "$EG" inspect "$DIR/x.tar" > /dev/null 2> "$DIR/err" && fail "$kw: accepted by inspect"
    grep -q "x.tar.*$want" "$DIR/err" || fail "$kw: C message: $(cat "$DIR/err")"
    pyread "$DIR/x.tar" > "$DIR/py" 2>&1
    grep -q "x.tar.*$want" "$DIR/py" || fail "$kw: Python loader: $(cat "$DIR/py")"
done
# a reserved byte of the first record's header (CRC fixed): that sample is refused, the
# next one reads
rewrite "$SH" "$DIR/r.tar" "record0_reserved=64" || fail "rewrite record0_reserved"
"$EG" inspect "$DIR/r.tar" --verify > "$DIR/out" 2>&1 && fail "record reserved byte: accepted by inspect --verify"
grep -q "r.tar.*reserved header bytes are not zero" "$DIR/out" || fail "record reserved byte, C: $(cat "$DIR/out")"
"$PY" -c "import sys; sys.path.insert(0, 'dataset/python'); import eaglegen_data as g
d = g.EagleGenDataset('$DIR/r.tar'); d.read_raw(1)
try:
    d.read_raw(0); print('read')
except g.EagleGenDataError as e: print(e)" > "$DIR/py" 2>&1
grep -q "r.tar.*sample 0.*reserved header bytes are not zero" "$DIR/py" || fail "record reserved byte, Python: $(cat "$DIR/py")"
rewrite "$SH" "$DIR/x.tar" "flags=$fl, trailer_flags=$fl" || fail "rewrite unchanged flags"
"$EG" inspect "$DIR/x.tar" --verify > /dev/null 2> "$DIR/err" || fail "unchanged flags refused: $(cat "$DIR/err")"
pyread "$DIR/x.tar" | grep -q "^read 4" || fail "unchanged flags, Python: $(pyread "$DIR/x.tar")"

# manifest histogram id 2^31-1 with vocab_size known: refused, naming the manifest
cp -r "$DIR/ds" "$DIR/hist"
"$PY" - "$DIR/hist/manifest.json" <<'PYEOF' || fail "edit manifest"
import json, sys
m = json.load(open(sys.argv[1]))
m["loss_token_histogram"] = {"ids": [2147483647], "counts": [1]}
json.dump(m, open(sys.argv[1], "w"))
PYEOF
"$EG" inspect "$DIR/hist" > /dev/null 2> "$DIR/err"; rc=$?
[ $rc -eq 1 ] || fail "huge histogram id: rc $rc"
grep -q "hist/manifest.json.*2147483647" "$DIR/err" || fail "huge histogram id: message: $(cat "$DIR/err")"

# manifest without "job": read as {} (under ASan/LSan: nothing leaked)
cp -r "$DIR/ds" "$DIR/nojob"
"$PY" - "$DIR/nojob/manifest.json" <<'PYEOF' || fail "edit manifest (job)"
import json, sys
m = json.load(open(sys.argv[1]))
m.pop("job", None)
json.dump(m, open(sys.argv[1], "w"))
PYEOF
"$EG" inspect "$DIR/nojob" > "$DIR/nojob.txt" 2> "$DIR/err" || fail "manifest without job: $(cat "$DIR/err")"
grep -q "^  job {}$" "$DIR/nojob.txt" || fail "manifest without job: summary lacks 'job {}'"

# a single shard: distinct loss-masked ids counted from its samples
"$EG" inspect "$SH" --json > "$DIR/one.json" || fail "inspect single shard"
"$PY" - "$DIR/one.json" "$SH" <<'PYEOF' || fail "single-shard distinct ids"
import json, sys
sys.path.insert(0, "dataset/python")
import numpy as np
import eaglegen_data as eg
d = json.load(open(sys.argv[1]))
ds = eg.EagleGenDataset(sys.argv[2], as_torch=False)
ids = set()
for i in range(len(ds)):
    r = ds.read_raw(i)
    ids |= set(r["input_ids"][r["loss_mask"] == 1].tolist())
assert len(ids) > 0 and d["distinct_loss_tokens"] == len(ids), (d["distinct_loss_tokens"], len(ids))
PYEOF
"$EG" inspect "$SH" > "$DIR/one.txt" || fail "inspect single shard (text)"
grep -q "(0 distinct ids)" "$DIR/one.txt" && fail "single shard reports 0 distinct ids"

# --stats-samples / --show: strict integers, exit 2
for v in 99999999999999999999 '' -1 3x; do
    "$EG" inspect "$SH" --stats-samples "$v" > /dev/null 2>&1; rc=$?
    [ $rc -eq 2 ] || fail "--stats-samples '$v': rc $rc"
    "$EG" inspect "$SH" --show "$v" > /dev/null 2>&1; rc=$?
    [ $rc -eq 2 ] || fail "--show '$v': rc $rc"
done
"$EG" inspect "$SH" --stats-samples 2 > /dev/null || fail "--stats-samples 2"
echo "t_dataset_corrupt: ok"
