# Sourced by tests/trainer_check_*.sh. trainer_check_dataset: the small dataset both trainer checks export
# (a tiny 8-layer random model, 12 chat records, sampled responses), made in the
# current directory as model/ and ds/.
trainer_check_dataset() {
    "$EAGLEGEN" mkmodel --preset tiny --layers 8 --out model --seed 3 >/dev/null 2>&1
    "$PYTHON" - <<'PY'
import json
with open("c.jsonl", "w") as f:
    for i in range(12):
        f.write(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Question {i}: {'why ' * i}?"}]}) + "\n")
PY
    "$EAGLEGEN" generate --model model --prompts c.jsonl --out ds --max-new-tokens 24 --max-seq-len 256 --batch 4 \
        --seed 5 --temperature 0.7 >/dev/null 2>gen.log || { cat gen.log; exit 1; }
}

# trainer_check_verifier MODEL_DIR OUT_DIR: the verifier directory speculators needs (a
# config.json its AutoConfig reads, and the embedding / lm_head / final norm weights),
# assembled from an eaglegen model: a flat Llama text config with the model's sizes, and an
# index naming the checkpoint's three tensors (symlinked shards).
trainer_check_verifier() {
    "$PYTHON" - "$1" "$2" <<'PY'
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(src, "config.json")))
t = c.get("text_config", c)
os.mkdir(dst)
flat = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "rms_norm_eps", "vocab_size", "max_position_embeddings", "rope_theta", "hidden_act", "bos_token_id",
          "eos_token_id", "pad_token_id"):
    if k in t:
        flat[k] = t[k]
flat["tie_word_embeddings"] = False
json.dump(flat, open(os.path.join(dst, "config.json"), "w"), indent=1)
wm = json.load(open(os.path.join(src, "model.safetensors.index.json")))["weight_map"]
keep = {}
for want in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
    ks = sorted((k for k in wm if k.endswith(want) and ".layers." not in k), key=len)
    assert ks, want
    keep[ks[0]] = wm[ks[0]]
for f in set(keep.values()):
    os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(dst, f))
json.dump({"metadata": {}, "weight_map": keep}, open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=1)
PY
}
