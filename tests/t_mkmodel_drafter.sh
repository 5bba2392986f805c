#!/usr/bin/env bash
# `eaglegen mkmodel --drafter-for`: the layout SpecForge's LlamaForCausalLMEagle3 writes
# (config keys, tensor names, shapes, dtypes, d2t/t2d), determinism per seed, --vocab from
# a d2t.npy, --no-embed, --aux-layers, and refusal of nonsense flags (exit 2, one line).
set -eu
: "${EAGLEGEN:?}"
E=$EAGLEGEN
PY=${PYTHON:-/usr/bin/python3}
M=${FIXTURES:-../shared/fixtures}/models/tiny-a
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; cat "$tmp/err" 2>/dev/null; exit 1; }
usage_err() { # pattern command...
    local want=$1; shift
    set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
    [ $rc = 2 ] || fail "exit $rc (want 2): $*"
    [ "$(wc -l <"$tmp/err")" = 1 ] || fail "more than one line: $*"
    grep -qF -- "$want" "$tmp/err" || fail "want '$want': $*"
}

$E mkmodel --drafter-for "$M" --out "$tmp/d1" --seed 3 --draft-vocab 100 2>"$tmp/err" || fail "mkmodel drafter"
$E mkmodel --drafter-for "$M" --out "$tmp/d2" --seed 3 --draft-vocab 100 2>"$tmp/err" || fail "mkmodel drafter again"
cmp -s "$tmp/d1/model.safetensors" "$tmp/d2/model.safetensors" || fail "same seed, different bytes"
$E mkmodel --drafter-for "$M" --out "$tmp/d3" --seed 4 --draft-vocab 100 2>"$tmp/err" || fail "mkmodel seed 4"
cmp -s "$tmp/d1/model.safetensors" "$tmp/d3/model.safetensors" && fail "seed ignored"

# a draft vocabulary from d2t.npy (as `eaglegen vocab` writes it)
mkdir -p "$tmp/vocab"
"$PY" - "$tmp/vocab" <<'PYEOF'
import sys, numpy as np
ids = np.array(sorted({5, 17, 300, 301, 511, 2, 64, 400}), dtype=np.int64)
np.save(sys.argv[1] + "/d2t.npy", ids - np.arange(len(ids)))
PYEOF
$E mkmodel --drafter-for "$M" --out "$tmp/dv" --vocab "$tmp/vocab" --aux-layers 0,2,4 --no-embed 2>"$tmp/err" \
    || fail "mkmodel --vocab"

"$PY" - "$tmp/d1" "$tmp/dv" <<'PYEOF' || fail "layout"
import json, struct, sys
import numpy as np
def header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw, 8 + n
H, V, I = 64, 512, 96
for d, Vd, aux, embed in ((sys.argv[1], 100, [1], True), (sys.argv[2], 8, [0, 2, 4], False)):
    c = json.load(open(d + "/config.json"))
    assert c["architectures"] == ["LlamaForCausalLMEagle3"], c["architectures"]
    assert (c["hidden_size"], c["vocab_size"], c["draft_vocab_size"], c["num_hidden_layers"]) == (H, V, Vd, 1)
    assert c["target_hidden_size"] == H and c["intermediate_size"] == I
    ec = c["eagle_config"]
    assert ec["eagle_aux_hidden_state_layer_ids"] == aux, ec
    assert ec["eaglegen_aux_convention"] == "output_of_layer"
    nh, nkv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    h, raw, base = header(d + "/model.safetensors")
    want = {"fc.weight": [H, len(aux) * H], "midlayer.input_layernorm.weight": [H],
            "midlayer.hidden_norm.weight": [H], "midlayer.self_attn.q_proj.weight": [nh * hd, 2 * H],
            "midlayer.self_attn.k_proj.weight": [nkv * hd, 2 * H], "midlayer.self_attn.v_proj.weight": [nkv * hd, 2 * H],
            "midlayer.self_attn.o_proj.weight": [H, nh * hd], "midlayer.post_attention_layernorm.weight": [H],
            "midlayer.mlp.gate_proj.weight": [I, H], "midlayer.mlp.up_proj.weight": [I, H],
            "midlayer.mlp.down_proj.weight": [H, I], "norm.weight": [H], "lm_head.weight": [Vd, H]}
    if embed:
        want["embed_tokens.weight"] = [V, H]
    got = {k: v for k, v in h.items() if k != "__metadata__"}
    assert set(got) == set(want) | {"d2t", "t2d"}, sorted(set(got) ^ (set(want) | {"d2t", "t2d"}))
    for k, s in want.items():
        assert got[k]["shape"] == s and got[k]["dtype"] == "BF16", (k, got[k])
    assert got["d2t"]["dtype"] == "I64" and got["d2t"]["shape"] == [Vd]
    assert got["t2d"]["dtype"] == "BOOL" and got["t2d"]["shape"] == [V]
    a, b = got["d2t"]["data_offsets"]
    d2t = np.frombuffer(raw[base + a:base + b], dtype="<i8")
    a, b = got["t2d"]["data_offsets"]
    t2d = np.frombuffer(raw[base + a:base + b], dtype=np.uint8).astype(bool)
    tgt = np.arange(Vd) + d2t
    ref = np.arange(Vd) if Vd == 100 else np.array([2, 5, 17, 64, 300, 301, 400, 511])
    assert (tgt == ref).all(), tgt
    assert t2d.sum() == Vd and t2d[tgt].all()
PYEOF

usage_err "--drafter-for needs --out DIR" $E mkmodel --drafter-for "$M"
usage_err "bad --draft-vocab '0'" $E mkmodel --drafter-for "$M" --out "$tmp/x" --draft-vocab 0
usage_err "bad --aux-layers '3,1'" $E mkmodel --drafter-for "$M" --out "$tmp/x" --aux-layers 3,1
usage_err "bad --aux-layers '1,,2'" $E mkmodel --drafter-for "$M" --out "$tmp/x" --aux-layers 1,,2
usage_err "'--preset' is not a --drafter-for option" $E mkmodel --drafter-for "$M" --out "$tmp/x" --preset tiny
usage_err "--vocab sets the draft vocabulary" $E mkmodel --drafter-for "$M" --out "$tmp/x" --vocab "$tmp/vocab" --draft-vocab 8
usage_err "--seed needs a value" $E mkmodel --drafter-for "$M" --out "$tmp/x" --seed
usage_err "draft vocabulary 600 outside [1, 512]" $E mkmodel --drafter-for "$M" --out "$tmp/x" --draft-vocab 600
usage_err "aux layers must be ascending, distinct, in [0, 5)" $E mkmodel --drafter-for "$M" --out "$tmp/x" --aux-layers 1,5
set +e; $E mkmodel --drafter-for "$tmp/nope" --out "$tmp/x" >/dev/null 2>"$tmp/err"; rc=$?; set -e
[ $rc = 1 ] && grep -q "nope" "$tmp/err" || fail "missing target: exit $rc"
$E mkmodel --help | grep -q -- "--drafter-for DIR" || fail "--help lacks --drafter-for"
echo "ok"
