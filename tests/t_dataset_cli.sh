#!/usr/bin/env bash
# eaglegen inspect and vocab on datasets written by the C writer: summary, --json,
# --sample, --verify on good and damaged data (non-zero exit naming shard and sample),
# and the draft vocabulary on a known histogram.
set -u
BIN="$BUILD/tests/test_dataset_writer"
EG="${EAGLEGEN:-$BUILD/eaglegen}"
PY="${PYTHON:-/usr/bin/python3}"
[ -x "$BIN" ] && [ -x "$EG" ] || { echo "t_dataset_cli: $BIN or $EG not built"; exit 1; }
DIR=$(mktemp -d /tmp/eg_ds_cli.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail() { echo "t_dataset_cli: $*"; exit 1; }

"$BIN" --fixture "$DIR/ds" >/dev/null || fail "fixture"
"$EG" inspect "$DIR/ds" > "$DIR/sum.txt" || fail "inspect summary"
grep -q "samples 11, tokens" "$DIR/sum.txt" || fail "summary lacks counts"
grep -q "ratio x" "$DIR/sum.txt" || fail "summary lacks ratio"
"$EG" inspect "$DIR/ds" --json --list --sample py000004 --sample 2 > "$DIR/sum.json" || fail "inspect --json"
"$PY" - "$DIR/sum.json" <<'PYEOF' || fail "json content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] and d["samples"] == 11 and d["n_aux"] == 3 and d["hidden_size"] == 48, d
assert d["aux_layers"] == [1, 29, 57]
assert len(d["list"]) == 11 and d["list"][4]["id"] == "py000004"
s = d["samples_shown"]
assert [x["id"] for x in s] == ["py000004", "py000002"], s
assert len(s[0]["input_ids"]) == s[0]["tokens"] == len(s[0]["loss_mask"])
assert sum(s[0]["loss_mask"]) == s[0]["loss_tokens"]
assert d["finish_reasons"]["stop"] + d["finish_reasons"]["length"] == 11
PYEOF
"$EG" inspect "$DIR/ds" --verify --json > "$DIR/v.json" || fail "verify of a good dataset failed"
"$EG" inspect "$DIR/ds/shard-000001.tar" --verify >/dev/null || fail "verify of a single shard failed"
"$EG" inspect "$DIR/ds" --sample nope >/dev/null 2>&1 && fail "unknown sample accepted"
"$EG" inspect "$DIR/ds" --bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "bad option is not a usage error"
"$EG" inspect --help | grep -q -- "--verify" || fail "help"
# a directory that is no dataset: said so, without pointing at `repair` (which cannot mend
# it), nor for a damaged manifest (repair needs to read it: it refuses one); a dataset
# with a shard missing: the pointer is there, and repair does set that shard aside
mkdir "$DIR/empty"
"$EG" inspect "$DIR/empty" 2> "$DIR/e.txt" && fail "inspect of an empty directory succeeded"
grep -q "repair" "$DIR/e.txt" && fail "inspect points an empty directory at repair: $(cat "$DIR/e.txt")"
cp -r "$DIR/ds" "$DIR/dm" && printf '{"broken' > "$DIR/dm/manifest.json"
"$EG" inspect "$DIR/dm" 2> "$DIR/e.txt" && fail "inspect of a damaged manifest succeeded"
grep -q "repair" "$DIR/e.txt" && fail "inspect points a damaged manifest at repair: $(cat "$DIR/e.txt")"
"$EG" repair "$DIR/dm" --dry-run >/dev/null 2>&1 && fail "repair took a manifest it cannot read"
cp "$DIR/ds/manifest.json" "$DIR/dm/manifest.json" && rm "$DIR/dm/shard-000001.tar"
"$EG" inspect "$DIR/dm" 2> "$DIR/e.txt" && fail "inspect of a dataset with a shard missing succeeded"
grep -q "eaglegen repair" "$DIR/e.txt" || fail "no repair pointer for a missing shard: $(cat "$DIR/e.txt")"
"$EG" repair "$DIR/dm" --dry-run 2>&1 | grep -q "1 damaged shard" || fail "repair does not take the missing shard"

# manifest numbers that disagree (the shards intact): a shard entry's raw_bytes, the
# totals, the finish reasons, totals missing; each named by --verify, the manifest and
# the figure; plain inspect still opens the data
for edit in "m['shards'][1]['raw_bytes'] += 2|shard-000001.tar: manifest says .* raw bytes" \
            "m['totals']['raw_bytes'] -= 1|manifest.json: totals say .*raw bytes" \
            "m['totals']['samples'] = 10|manifest.json: totals say 10 samples" \
            "m['finish_reasons']['stop'] += 1|manifest.json: totals say .*stop/length" \
            "m.pop('totals')|manifest.json: totals or finish_reasons missing"; do
    code=${edit%%|*} want=${edit#*|}
    rm -rf "$DIR/mt" && cp -r "$DIR/ds" "$DIR/mt"
    "$PY" -c "import json, sys; p = sys.argv[1]; m = json.load(open(p)); $code; json.dump(m, open(p, 'w'))" \
        "$DIR/mt/manifest.json" || fail "edit: $code"
    "$EG" inspect "$DIR/mt" > /dev/null || fail "$code: plain inspect refused the data"
    "$EG" inspect "$DIR/mt" --verify > "$DIR/t.out" 2> "$DIR/t.err" && fail "$code: passed --verify"
    grep -q "$want" "$DIR/t.err" || fail "$code: $(cat "$DIR/t.err")"
    grep -q "repair" "$DIR/t.out" && fail "$code: pointed at repair: $(cat "$DIR/t.out")"
done

# NaN values written into a plane (records intact): --verify names the plane and the
# sample, the pre-norm final state included (it was never looked at), and does not point
# at repair (the shards are not damaged)
for plane in aux final pre; do
    "$BIN" --nan-fixture "$DIR/nan.$plane" $plane >/dev/null || fail "nan fixture $plane"
    "$EG" inspect "$DIR/nan.$plane" --verify > "$DIR/n.out" 2> "$DIR/n.err" && fail "NaN in $plane passed --verify"
    case $plane in aux) want="aux\[[0-9]\] L[0-9]* has 1 NaN";; final) want=": final has 1 NaN";; pre) want="final pre-norm has 1 NaN";; esac
    grep -q "sample 1 .*id nan000001).*$want" "$DIR/n.err" || fail "NaN in $plane not named: $(cat "$DIR/n.err")"
    [ "$(grep -c NaN "$DIR/n.err")" -eq 1 ] || fail "NaN in $plane: $(cat "$DIR/n.err")"
    grep -q "repair" "$DIR/n.out" && fail "NaN values pointed at repair: $(cat "$DIR/n.out")"
done
"$EG" inspect "$DIR/nan.pre" > "$DIR/n.out" || fail "inspect nan.pre"
grep -q "final pre-norm .*nan 1" "$DIR/n.out" || fail "summary lacks the pre-norm plane: $(cat "$DIR/n.out")"

# damage sample 1's record: flip a byte in the middle of its aux frame
off=$("$PY" - "$DIR/ds/shard-000000.tar" <<'PYEOF'
import struct, sys, zstandard
f = open(sys.argv[1], "rb").read()
t = f[-1536:-1536 + 64]
off, size, raw = struct.unpack_from("<QQQ", t, 16)
ix = zstandard.ZstdDecompressor().decompress(f[off:off + size])
p = 32 + 32 + struct.unpack_from("<I", ix, 32 + 24)[0]  # entry 1
o, s = struct.unpack_from("<QQ", ix, p)
print(o + s - 300)
PYEOF
) || fail "locating sample"
cp "$DIR/ds/shard-000000.tar" "$DIR/orig.tar"
printf '\xff' | dd of="$DIR/ds/shard-000000.tar" bs=1 seek="$off" conv=notrunc status=none
"$EG" inspect "$DIR/ds" --verify > "$DIR/bad.out" 2> "$DIR/bad.err"; rc=$?
[ $rc -eq 1 ] || fail "verify of a damaged shard exited $rc"
grep -q "shard-000000.tar" "$DIR/bad.err" || fail "verify error does not name the shard: $(cat "$DIR/bad.err")"
grep -q "py000001" "$DIR/bad.err" || fail "verify error does not name the sample: $(cat "$DIR/bad.err")"
cp "$DIR/orig.tar" "$DIR/ds/shard-000000.tar"
# truncated shard
head -c 20000 "$DIR/orig.tar" > "$DIR/ds/shard-000000.tar"
"$EG" inspect "$DIR/ds" --verify >/dev/null 2> "$DIR/bad.err" && fail "truncated shard passed"
grep -q "shard-000000.tar" "$DIR/bad.err" || fail "truncation error does not name the shard"
cp "$DIR/orig.tar" "$DIR/ds/shard-000000.tar"

# vocab on a known histogram: 3 x5, 7 x5, 9 x4, 100 x2, 2 x1 (50 unmasked x30), V = 200
"$BIN" --vocab-fixture "$DIR/v" || fail "vocab fixture"
"$EG" vocab "$DIR/v" --draft-vocab 3 --out "$DIR/v3" >/dev/null || fail "vocab 3"
"$EG" vocab "$DIR/v" --draft-vocab 1 --out "$DIR/v1" >/dev/null || fail "vocab 1"
"$EG" vocab "$DIR/v" --draft-vocab 7 --out "$DIR/v7" >/dev/null || fail "vocab 7"
"$EG" vocab "$DIR/v" --draft-vocab 7 --target-vocab 300 --out "$DIR/vx" >/dev/null 2>&1 && fail "conflicting --target-vocab accepted"
"$EG" vocab "$DIR/v" --draft-vocab 201 --out "$DIR/vx" >/dev/null 2>&1; [ $? -eq 2 ] || fail "N > V accepted"
"$EG" vocab "$DIR/v" --out "$DIR/vx" >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing --draft-vocab accepted"
"$PY" - "$DIR" <<'PYEOF' || fail "vocab content"
import sys, numpy as np
d = sys.argv[1]
def check(n, want):
    d2t = np.load(f"{d}/v{n}/d2t.npy"); t2d = np.load(f"{d}/v{n}/t2d.npy")
    assert d2t.dtype == np.int64 and d2t.shape == (n,), (d2t.dtype, d2t.shape)
    assert t2d.dtype == np.bool_ and t2d.shape == (200,), (t2d.dtype, t2d.shape)
    target = np.arange(n) + d2t
    assert target.tolist() == want, (n, target.tolist(), want)
    assert np.flatnonzero(t2d).tolist() == want
check(3, [3, 7, 9])
check(1, [3])                       # tie 3/7 -> lower id
check(7, [0, 1, 2, 3, 7, 9, 100])   # 5 seen + lowest unused 0, 1
PYEOF
echo "t_dataset_cli: ok"
