#!/usr/bin/env bash
# The CPU engine against the fixtures' reference goldens (DeepSeek-V3 reference code,
# float64, BF16 latent cache): per-layer relative error <= 1e-3 for hidden, normed and
# logits, teacher-forced argmax and greedy continuation equal wherever the margin > 1e-2.
set -eu
: "${EAGLEGEN:?}" "${FIXTURES:?}" "${PYTHON:=/usr/bin/python3}"
M=$FIXTURES/models
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
for case in a:tiny-a q4:tiny-q4 fp8:tiny-fp8 a-long:tiny-a; do
    g=${case%%:*}; model=${case#*:}
    gold=$M/golden-$g-bf16kv.safetensors
    [ -f "$gold" ] || { echo "missing $gold"; fail=1; continue; }
    # prompts = the golden's full token sequences (teacher-forced), and the bare prompts
    "$PYTHON" - "$gold" "$tmp/$g-full.json" <<'PY'
import json, struct, sys, numpy as np
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
ps = []
i = 0
while f"p{i}.tokens" in h:
    a, b = h[f"p{i}.tokens"]["data_offsets"]; ps.append(np.frombuffer(d[a:b], np.int32).tolist()); i += 1
json.dump({"prompts": ps}, open(sys.argv[2], "w"))
PY
    echo "-- $g ($model), teacher-forced"
    "$EAGLEGEN" forward --model "$M/$model" --prompts "$tmp/$g-full.json" --out "$tmp/$g.safetensors" --chunk 37
    "$PYTHON" tests/golden_compare.py "$tmp/$g.safetensors" "$gold" --tol 1e-3 || fail=1
    if [ -f "$M/prompts-$g.json" ]; then
        echo "-- $g ($model), greedy --generate 16"
        "$EAGLEGEN" forward --model "$M/$model" --prompts "$M/prompts-$g.json" --out "$tmp/$g-gen.safetensors" --generate 16
        "$PYTHON" tests/golden_compare.py "$tmp/$g-gen.safetensors" "$gold" --what greedy || fail=1
    fi
done
exit $fail
