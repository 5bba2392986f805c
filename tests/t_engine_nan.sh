#!/usr/bin/env bash
# A model whose weights make the forward pass produce NaN (one norm weight set to NaN,
# written here with Python, independently of our writer): `generate` must stop with an
# error naming the request, exit 1, and leave no sample holding a NaN row.
set -u
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
$E mkmodel --preset tiny --out model --seed 7 >/dev/null 2>&1 || { echo "FAIL: mkmodel"; exit 1; }
"$PYTHON" - model <<'PY' || { echo "FAIL: could not poison the model"; exit 1; }
import json, os, struct, sys
d = sys.argv[1]
name = "model.layers.1.post_attention_layernorm.weight"
for f in sorted(os.listdir(d)):
    if not f.endswith(".safetensors"): continue
    p = os.path.join(d, f)
    with open(p, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
        key = next((k for k in hdr if k.endswith(name)), None)
        if key is None: continue
        t = hdr[key]
        assert t["dtype"] == "BF16", t["dtype"]
        a, b = t["data_offsets"]
        fh.seek(8 + n + a)
        fh.write(b"\xc0\x7f" * ((b - a) // 2))  # BF16 quiet NaN
        sys.exit(0)
sys.exit("tensor not found")
PY
printf '{"id":"a","prompt":"Hello there"}\n{"id":"b","prompt":"Count to three"}\n' > corpus.jsonl
$E generate --model model --prompts corpus.jsonl --out ds --max-new-tokens 4 > log 2>&1
rc=$?
[ "$rc" -eq 1 ] || bad "generate on a NaN model exited $rc, expected 1"
grep -q "NaN or infinite hidden state" log || bad "no NaN message: $(tail -n 3 log)"
grep -Eq "request [0-9]+|request" log || bad "message does not name the request"
if [ -f ds/manifest.json ]; then
    $E inspect ds --verify > vlog 2>&1 || bad "a dataset with NaN rows was left: $(tail -n 2 vlog)"
fi
[ "$fail" -eq 0 ] && echo "t_engine_nan: ok"
exit "$fail"
