# Sourced by tests/trainer_check_*.sh: the small dataset both trainer checks export
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
