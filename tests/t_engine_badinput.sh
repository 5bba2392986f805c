#!/usr/bin/env bash
# Loader and mkmodel through the CLI.
# 1. Broken copies of the tiny-a fixture, built here with Python (independently of our
#    safetensors writer): missing tensor, wrong shape, wrong dtype, unknown dtype,
#    truncated shard, corrupt header, bad index/config JSON, unsupported config. Each
#    must make `eaglegen forward` exit 1 with a message naming the tensor and the file
#    (or the config field), with no crash and no output file.
# 2. mkmodel: usage errors exit 2; the tiny preset loads and generates varied tokens;
#    output is byte-identical across thread counts; the kimi-k2.5 plan (dry run); the
#    163,840-vocabulary tokenizer is gap-free with Kimi's exact special-token layout.
set -u
: "${EAGLEGEN:?}" "${FIXTURES:?}" "${PYTHON:=/usr/bin/python3}"
M=$FIXTURES/models
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# ---- 1. broken models --------------------------------------------------------------
"$PYTHON" - "$M/tiny-a" "$tmp" <<'PY' || { echo "FAIL: could not build bad models"; exit 1; }
import json, os, shutil, struct, sys
src, out = sys.argv[1], sys.argv[2]
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"

def copy(name):
    d = os.path.join(out, name)
    shutil.copytree(src, d)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    return d

def edit_header(d, shard, fn):
    p = os.path.join(d, shard)
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    fn(h)
    hj = json.dumps(h).encode()
    hj += b" " * (-len(hj) % 8)
    open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + b[8 + n:])

P = "language_model.model.layers."
d = copy("missing")
edit_header(d, S1, lambda h: h.pop(P + "1.self_attn.kv_b_proj.weight"))
d = copy("shape")
def sh(h):
    h[P + "0.self_attn.q_b_proj.weight"]["shape"] = [48, 96]
edit_header(d, S1, sh)
d = copy("dtype")
def dt(h):
    h[P + "3.post_attention_layernorm.weight"]["dtype"] = "I16"
edit_header(d, S2, dt)
d = copy("unkdtype")
def udt(h):
    h[P + "2.mlp.experts.15.up_proj.weight"]["dtype"] = "F8_E5M2"
edit_header(d, S2, udt)
d = copy("truncated")
p = os.path.join(d, S2); b = open(p, "rb").read(); open(p, "wb").write(b[: len(b) - 1000])
d = copy("corrupt")
p = os.path.join(d, S1); b = bytearray(open(p, "rb").read()); b[40:44] = b"\x00}{]"; open(p, "wb").write(b)
d = copy("badindex")
open(os.path.join(d, "model.safetensors.index.json"), "w").write('{"weight_map": {"x": ')
d = copy("badconfig")
open(os.path.join(d, "config.json"), "w").write('{"text_config": {"hidden_size": 64,,}}')
d = copy("softmax")
c = json.load(open(os.path.join(d, "config.json"))); c["text_config"]["scoring_func"] = "softmax"
json.dump(c, open(os.path.join(d, "config.json"), "w"))
d = copy("q8")
c = json.load(open(os.path.join(d, "config.json")))
c["text_config"]["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}}}
json.dump(c, open(os.path.join(d, "config.json"), "w"))
PY

# name | needles (| separated; all must appear in stderr)
cases=(
  "missing|model.layers.1.self_attn.kv_b_proj.weight|model-00001-of-00002.safetensors|missing"
  "shape|model.layers.0.self_attn.q_b_proj.weight|model-00001-of-00002.safetensors|shape [48, 96], expected [96, 48]"
  "dtype|model.layers.3.post_attention_layernorm.weight|model-00002-of-00002.safetensors|I16"
  "unkdtype|model.layers.2.mlp.experts.15.up_proj.weight|model-00002-of-00002.safetensors|F8_E5M2"
  "truncated|model-00002-of-00002.safetensors|truncated"
  "corrupt|model-00001-of-00002.safetensors|corrupt header"
  "badindex|model.safetensors.index.json|bad JSON"
  "badconfig|config.json|bad JSON"
  "softmax|config.json|text_config.scoring_func|softmax"
  "q8|num_bits"
)
for c in "${cases[@]}"; do
    IFS='|' read -r -a f <<<"$c"
    name=${f[0]}
    rm -f "$tmp/out.safetensors"
    "$EAGLEGEN" forward --model "$tmp/$name" --prompts "$M/prompts-a.json" --out "$tmp/out.safetensors" \
        >"$tmp/stdout" 2>"$tmp/stderr"
    rc=$?
    [ "$rc" -eq 1 ] || bad "$name: exit $rc, expected 1: $(head -c 400 "$tmp/stderr")"
    for ((i = 1; i < ${#f[@]}; i++)); do
        grep -qF -- "${f[$i]}" "$tmp/stderr" || bad "$name: '${f[$i]}' not in: $(head -c 400 "$tmp/stderr")"
    done
    if grep -qE "AddressSanitizer|runtime error|Segmentation|core dumped" "$tmp/stderr"; then bad "$name: crashed"; fi
    [ ! -e "$tmp/out.safetensors" ] || bad "$name: wrote an output file"
    echo "ok   $name: $(head -n 1 "$tmp/stderr" | cut -c1-160)"
done

# ---- 2. mkmodel ------------------------------------------------------------------------
E=$EAGLEGEN
"$E" mkmodel --help >"$tmp/help" 2>&1 || bad "mkmodel --help exit $?"
for w in tiny moonlight-16b kimi-k2.5 --preset --out --seed --layers --experts --dry-run --no-weights; do
    grep -q -- "$w" "$tmp/help" || bad "mkmodel --help lacks $w"
done
expect_rc() { local want=$1; shift; "$@" >"$tmp/o" 2>&1; local rc=$?; [ "$rc" -eq "$want" ] || bad "$* -> exit $rc (want $want): $(head -c 300 "$tmp/o")"; }
expect_rc 2 "$E" mkmodel
expect_rc 2 "$E" mkmodel --preset nope --out "$tmp/x"
grep -q "nope" "$tmp/o" || bad "unknown preset not named"
expect_rc 2 "$E" mkmodel --preset tiny --out "$tmp/x" --experts fp4
expect_rc 2 "$E" mkmodel --preset tiny --out "$tmp/x" --layers 0
expect_rc 2 "$E" mkmodel --preset tiny --out "$tmp/x" --bogus
expect_rc 2 "$E" mkmodel --preset tiny
expect_rc 1 "$E" mkmodel --preset tiny --out /proc/no/such/dir

"$E" mkmodel --preset tiny --out "$tmp/tiny" --seed 3 --threads 2 2>"$tmp/mk.log" || bad "mkmodel tiny: $(cat "$tmp/mk.log")"
"$E" mkmodel --preset tiny --out "$tmp/tiny1" --seed 3 --threads 1 2>/dev/null || bad "mkmodel tiny (1 thread)"
cmp -s "$tmp/tiny/model-00001-of-00001.safetensors" "$tmp/tiny1/model-00001-of-00001.safetensors" ||
    bad "mkmodel output depends on the thread count"
echo '{"prompts": [[256, 72, 101, 108, 108, 111], [1, 2, 3, 4, 5, 6, 7, 8], [300]]}' >"$tmp/p.json"
if "$E" forward --model "$tmp/tiny" --prompts "$tmp/p.json" --out "$tmp/tiny-out.safetensors" --generate 24 2>"$tmp/fw.log"; then
    "$PYTHON" - "$tmp/tiny-out.safetensors" <<'PY' || bad "tiny model output degenerate"
import json, struct, sys, numpy as np
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
def get(k, dt):
    a, e = h[k]["data_offsets"]; return np.frombuffer(d[a:e], dt).reshape(h[k]["shape"])
ok = True
for i in range(3):
    t = get(f"p{i}.tokens", np.int32)[-24:]
    lg = get(f"p{i}.logits", np.float32)
    std = float(lg.std(axis=1).mean())
    print(f"prompt {i}: {len(set(t.tolist()))} distinct of 24 generated, logit std {std:.2f}")
    ok &= len(set(t.tolist())) >= 8 and 2.0 < std < 6.0 and np.isfinite(lg).all()
sys.exit(0 if ok else 1)
PY
else
    bad "forward on the mkmodel tiny model: $(tail -c 400 "$tmp/fw.log")"
fi

# forward's metadata lists every prompt's length (a fixed 64 KB buffer cut it short past
# ~21,000 one-token prompts), and a run past max_position_embeddings says so
"$PYTHON" -c 'import json; json.dump({"prompts": [[1 + i % 200] * (1 + i % 2) for i in range(22000)]}, open("'"$tmp"'/many.json", "w"))'
if "$E" forward --model "$tmp/tiny" --prompts "$tmp/many.json" --out "$tmp/many.st" 2>"$tmp/many.log"; then
    "$PYTHON" - "$tmp/many.st" <<'PY' || bad "forward's prompt_lens"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
lens = json.loads(json.loads(f.read(n))["__metadata__"]["prompt_lens"])
assert lens == [1 + i % 2 for i in range(22000)], (len(lens), lens[-3:])
print("forward: prompt_lens lists all 22000 prompts")
PY
    ! grep -q "max_position_embeddings" "$tmp/many.log" || bad "a max_position note for 2-token prompts"
else
    bad "forward of 22000 prompts: $(tail -c 300 "$tmp/many.log")"
fi
mkdir -p "$tmp/short"
cp "$tmp/tiny"/* "$tmp/short/"
"$PYTHON" - "$tmp/short/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); t = c.get("text_config", c); t["max_position_embeddings"] = 7
json.dump(c, open(sys.argv[1], "w"))
PY
"$E" forward --model "$tmp/short" --prompts "$tmp/p.json" --out "$tmp/short.st" 2>"$tmp/short.log" ||
    bad "forward past max_position_embeddings: $(tail -c 300 "$tmp/short.log")"
grep -q "note: 8 positions (longest prompt 8 + --generate 0) are past the model's max_position_embeddings 7" \
    "$tmp/short.log" || bad "no max_position note: $(cat "$tmp/short.log")"

# the kimi-k2.5 plan without writing anything
"$E" mkmodel --preset kimi-k2.5 --layers 2 --dry-run >"$tmp/plan.txt" || bad "kimi dry run"
"$PYTHON" - "$tmp/plan.txt" <<'PY' || bad "kimi plan"
import sys
lines = open(sys.argv[1]).read().splitlines()
body, total = lines[:-1], lines[-1]
H, V, E, F = 7168, 163840, 384, 2048
assert len(body) == 3 + 12 + (9 + 2 + E * 9 + 3), len(body)
s = sum(int(l.split()[-2]) for l in body)
assert total == f"total: {len(body)} tensors, {s} bytes in {total.split()[-2]} shards", total
names = [l.split()[0] for l in body]
assert all(n.startswith("language_model.") for n in names)
want = {"language_model.model.layers.1.mlp.experts.383.down_proj.weight_packed I32 [7168, 256]",
        "language_model.model.layers.1.mlp.experts.0.gate_proj.weight_scale BF16 [2048, 224]",
        "language_model.model.layers.1.mlp.experts.0.gate_proj.weight_shape I32 [2]",
        "language_model.model.layers.0.self_attn.q_b_proj.weight BF16 [12288, 1536]",
        "language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight BF16 [576, 7168]",
        "language_model.model.layers.1.mlp.gate.e_score_correction_bias F32 [384]",
        "language_model.lm_head.weight BF16 [163840, 7168]"}
got = {" ".join(l.split()[:-2]) for l in body}
assert want <= got, want - got
print("kimi-k2.5 --layers 2 plan:", total)
PY

# the 163,840-vocabulary tokenizer: gap-free ranks, unique bytes, Kimi's special layout
"$E" mkmodel --preset kimi-k2.5 --no-weights --out "$tmp/kimi-tok" 2>/dev/null || bad "kimi --no-weights"
[ ! -e "$tmp/kimi-tok/model.safetensors.index.json" ] || bad "--no-weights wrote weights"
# --no-weights over a model already there: its index goes, so the new config is never
# loaded with the old tensors (a load says there are no weights)
"$E" mkmodel --preset tiny --layers 4 --out "$tmp/over" >/dev/null 2>&1 || bad "tiny model to overwrite"
"$E" mkmodel --preset tiny --layers 2 --no-weights --out "$tmp/over" >/dev/null 2>&1 || bad "--no-weights over a model"
[ ! -e "$tmp/over/model.safetensors.index.json" ] || bad "--no-weights left the old model's index"
echo '{"prompts": [[1, 2, 3]]}' > "$tmp/over.json"
if "$E" forward --model "$tmp/over" --prompts "$tmp/over.json" --out "$tmp/over.st" 2>"$tmp/over.err"; then
    bad "a --no-weights directory over an old model loaded"
fi
grep -q "no model.safetensors.index.json" "$tmp/over.err" || bad "over: $(cat "$tmp/over.err")"
"$PYTHON" - "$tmp/kimi-tok" "$FIXTURES/tokenizer/tokenizer_config.json" <<'PY' || bad "kimi tokenizer files"
import base64, json, sys
d, ref = sys.argv[1], sys.argv[2]
toks = []
for i, line in enumerate(open(f"{d}/tiktoken.model")):
    b, r = line.split()
    assert int(r) == i, (i, r)
    toks.append(base64.b64decode(b))
assert len(toks) == 163584 and len(set(toks)) == len(toks)
assert toks[:256] == [bytes([i]) for i in range(256)]
mine = json.load(open(f"{d}/tokenizer_config.json"))
kimi = json.load(open(ref))
assert mine["added_tokens_decoder"] == kimi["added_tokens_decoder"], "special tokens differ from Kimi's"
for k in ("bos_token", "eos_token", "pad_token", "unk_token", "additional_special_tokens"):
    assert mine[k] == kimi[k], k
assert mine["eaglegen_chat_template"] == "kimi-k2.5"
cfg = json.load(open(f"{d}/config.json"))["text_config"]
assert cfg["vocab_size"] == 163840 and cfg["eos_token_id"] == 163585 and cfg["bos_token_id"] == 163584
print("kimi-k2.5 tokenizer: 163584 base tokens, specials identical to Kimi's tokenizer_config.json")
PY
"$E" mkmodel --preset moonlight-16b --print-config >"$tmp/ml.json" || bad "moonlight --print-config"
"$PYTHON" -c "
import json,sys; c=json.load(open(sys.argv[1]))['text_config']
assert (c['num_hidden_layers'],c['hidden_size'],c['n_routed_experts'],c['num_experts_per_tok'],c['q_lora_rank'],c['moe_intermediate_size'],c['n_shared_experts'])==(27,2048,64,6,None,1408,2), c
" "$tmp/ml.json" || bad "moonlight config"

[ "$fail" -eq 0 ] && echo "t_engine_badinput: all ok"
exit $fail
