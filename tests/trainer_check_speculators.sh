#!/usr/bin/env bash
# `make trainer-check`, speculators part (optional, like ref-check; not in `make test`):
# installs speculators 0.9.0 from PyPI (with torch, datasets, pyarrow: several GB) into
# build/trainer-venv-speculators once, generates a small dataset with eaglegen (8-layer
# tiny model, aux layers 1,3,4, both final states), exports it with
# `eaglegen export --to speculators` and runs tests/trainer_check_speculators.py in that
# venv: speculators' own dataset class, collator, config resolution and drafter, compared
# with eaglegen's reader, and one CPU training step.
# The verifier directory speculators needs (a config.json its AutoConfig reads, and the
# embedding / lm_head / final norm weights) is assembled here from the model: a flat Llama
# text config with the model's sizes, and an index naming the checkpoint's three tensors.
set -eu
cd "$(dirname "$0")/.."
root=$PWD
: "${EAGLEGEN:=$root/build/eaglegen}" "${PYTHON:=/usr/bin/python3}"
VENV=${SPECULATORS_VENV:-$root/build/trainer-venv-speculators}
if ! "$VENV/bin/python" -c "import speculators, datasets, torch, zstandard" 2>/dev/null; then
    echo "-- installing speculators 0.9.0 into $VENV (PyPI; several GB)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "speculators==0.9.0" zstandard
fi
[ -x "$EAGLEGEN" ] || { echo "trainer-check: $EAGLEGEN not built"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
. "$root/tests/trainer_check_lib.sh"
trainer_check_dataset
"$EAGLEGEN" export ds --to speculators --out sp --draft-vocab 64 2>/dev/null
EG_EXPORT_SHARD_BYTES=4000 EG_EXPORT_BATCH_ROWS=2 "$EAGLEGEN" export ds --to speculators --out sp_split --draft-vocab 64 \
    >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json, os
c = json.load(open("model/config.json"))
t = c.get("text_config", c)
os.mkdir("verifier")
flat = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "rms_norm_eps", "vocab_size", "max_position_embeddings", "rope_theta", "hidden_act", "bos_token_id",
          "eos_token_id", "pad_token_id"):
    if k in t:
        flat[k] = t[k]
flat["tie_word_embeddings"] = False
json.dump(flat, open("verifier/config.json", "w"), indent=1)
wm = json.load(open("model/model.safetensors.index.json"))["weight_map"]
keep = {}
for want in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
    ks = sorted((k for k in wm if k.endswith(want) and ".layers." not in k), key=len)
    assert ks, want
    keep[ks[0]] = wm[ks[0]]
for f in set(keep.values()):
    os.symlink(os.path.abspath(os.path.join("model", f)), os.path.join("verifier", f))
json.dump({"metadata": {}, "weight_map": keep}, open("verifier/model.safetensors.index.json", "w"), indent=1)
PY
"$VENV/bin/python" "$root/tests/trainer_check_speculators.py" ds sp verifier sp_split
