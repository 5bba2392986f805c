#!/usr/bin/env bash
# Format v2 (issue 18): both final states by default, aux ids in both trainers'
# conventions, ascending/distinct aux layers.
# - generate on an 8-layer model (three distinct default aux layers) stores post-norm and
#   pre-norm final states; the manifest says so and records the ids as SpecForge/SGLang
#   (k) and vLLM/speculators (k + 1, final = L) count them;
# - post-norm == rmsnorm(pre-norm) * w of the checkpoint's final norm, computed here
#   independently (numpy, float64) within the two BF16 roundings (and a second norm
#   applied, what speculators would do to post-norm data, does not pass);
# - --final-hidden post-norm / pre-norm store exactly the same bits as the two halves;
# - a manifest that disagrees with its records, unsorted or repeated aux layers and an
#   unknown --final-hidden are refused with the reason.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }
$E mkmodel --preset tiny --layers 8 --out model --seed 3 >/dev/null 2>&1
"$PYTHON" - <<'PY'
import json
with open("c.jsonl", "w") as f:
    for i in range(6):
        f.write(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Question {i}: {'why ' * i}?"}]}) + "\n")
PY
gen() { # OUT EXTRA...
    local o=$1; shift
    $E generate --model model --prompts c.jsonl --out "$o" --max-new-tokens 12 --max-seq-len 256 --batch 3 \
        --seed 5 --temperature 0 "$@" >/dev/null 2>"$o.log" || { cat "$o.log"; fail "generate $o"; }
}
echo "-- generate: default (both), post-norm, pre-norm"
gen both
gen post --final-hidden post-norm
gen pre --final-hidden pre-norm
$E inspect both --verify >/dev/null || fail "inspect --verify"
$E inspect both | grep -q "final hidden: both" || fail "inspect does not say both"
"$PYTHON" - "$here/../dataset/python" <<'PY'
import json, struct, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import eaglegen_data as eg
m = json.load(open("both/manifest.json"))
assert m["format_version"] == 2, m["format_version"]
assert m["num_layers"] == 8
assert m["final_hidden"]["source"] == "both" and m["final_hidden"]["stored"] == ["post_norm", "pre_norm"], m["final_hidden"]
assert m["tensors"]["final_pre_hidden"] == {"dtype": "bfloat16", "shape": "[T, hidden_size]"}
a = m["aux_layers"]
assert a["ids"] == [1, 3, 4] and a["convention"].startswith("output of decoder layer k, 0-based"), a
assert a["hf_hidden_states_index"] == [2, 4, 5], a
t = a["trainer_ids"]
assert t["specforge_sglang"]["aux_ids"] == [1, 3, 4], t
assert t["vllm_speculators"]["aux_ids"] == [2, 4, 5] and t["vllm_speculators"]["final_id"] == 8, t
for name, src in (("post", "post_norm"), ("pre", "pre_norm")):
    mm = json.load(open(f"{name}/manifest.json"))
    assert mm["final_hidden"] == {"source": src, "stored": [src], "description": mm["final_hidden"]["description"]}
    assert "final_pre_hidden" not in mm["tensors"]

# the checkpoint's final norm weight and eps, read here (not through eaglegen)
f = open("model/model-00001-of-00001.safetensors", "rb")
n = struct.unpack("<Q", f.read(8))[0]
hdr = json.loads(f.read(n))
e = hdr["language_model.model.norm.weight"]
assert e["dtype"] == "BF16"
f.seek(8 + n + e["data_offsets"][0])
w = eg.bf16_to_float32(np.frombuffer(f.read(e["data_offsets"][1] - e["data_offsets"][0]), "<u2")).astype(np.float64)
eps = json.load(open("model/config.json"))["text_config"]["rms_norm_eps"]

both, post, pre = (eg.EagleGenDataset(d, as_torch=False) for d in ("both", "post", "pre"))
assert both.final_source == "both" and post.final_source == "post_norm" and pre.final_source == "pre_norm"
assert len(both) == len(post) == len(pre) == 6
# each BF16 rounding (of the stored pre-norm input, of the stored post-norm output) is at
# most half an ulp, 2^-8 relative; the float64 recomputation adds nothing measurable
bound = 2 * 2.0 ** -8 * 1.01
worst = worst_twice = 0.0
for i in range(len(both)):
    sid = both.metadata(i)["id"]
    rb, rp, rq = both.read_raw(i), post.read_raw(post.index_of(sid)), pre.read_raw(pre.index_of(sid))
    assert rb["final_pre_hidden"] is not None and rp["final_pre_hidden"] is None and rq["final_pre_hidden"] is None
    assert np.array_equal(rb["input_ids"], rp["input_ids"]) and np.array_equal(rb["input_ids"], rq["input_ids"]), sid
    assert np.array_equal(rb["aux_hidden"], rp["aux_hidden"]), sid
    assert np.array_equal(rb["final_hidden"], rp["final_hidden"]), f"{sid}: post-norm bits differ from a post-norm run"
    assert np.array_equal(rb["final_pre_hidden"], rq["final_hidden"]), f"{sid}: pre-norm bits differ from a pre-norm run"
    it = both[i]
    assert it["pre_norm_hidden_states"].shape == it["target_hidden_states"].shape == (len(it["input_ids"]), both.hidden_size)
    assert "pre_norm_hidden_states" not in post[post.index_of(sid)]
    q = pre[pre.index_of(sid)]
    assert np.array_equal(q["pre_norm_hidden_states"], q["target_hidden_states"])
    x = it["pre_norm_hidden_states"].astype(np.float64)
    y = it["target_hidden_states"].astype(np.float64)
    assert not np.array_equal(x, y)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    worst = max(worst, float((np.abs(y - want) / np.abs(want)).max()))
    twice = y / np.sqrt((y * y).mean(-1, keepdims=True) + eps) * w
    worst_twice = max(worst_twice, float((np.abs(twice - want) / np.abs(want)).max()))
print(f"post vs rmsnorm(pre)*w: worst relative error {worst:.3g} (bound {bound:.3g}); norm applied twice: {worst_twice:.3g}")
assert worst <= bound, (worst, bound)
assert worst_twice > 4 * bound, worst_twice
PY

echo "-- disk cost of the second final state"
"$PYTHON" - <<'PY'
import json
b, p = (json.load(open(f"{d}/manifest.json"))["totals"] for d in ("both", "post"))
print(f"both: {b['bytes']} bytes, post-norm only: {p['bytes']} bytes (x{b['bytes'] / p['bytes']:.3f}); "
      f"raw x{b['raw_bytes'] / p['raw_bytes']:.3f}")
# raw: (n_aux + 2) / (n_aux + 1) of the hidden-state bytes, plus ids and mask
H, na = 64, 3
assert b["raw_bytes"] - p["raw_bytes"] == b["tokens"] * H * 2, (b, p)
PY

echo "-- a manifest that disagrees with its records"
cp -r post lie
"$PYTHON" - <<'PY'
import json
m = json.load(open("lie/manifest.json"))
m["final_hidden"]["source"] = "both"
json.dump(m, open("lie/manifest.json", "w"))
PY
if $E inspect lie --verify >out 2>&1; then fail "inspect accepted a record without the pre-norm state"; fi
grep -q "lacks a pre-norm final state" out || { cat out; fail "message"; }
"$PYTHON" - "$here/../dataset/python" <<'PY' || fail "python loader accepted it"
import sys
sys.path.insert(0, sys.argv[1])
import eaglegen_data as eg
try:
    eg.EagleGenDataset("lie", as_torch=False)[0]
except eg.EagleGenDataError as e:
    assert "disagree with the manifest" in str(e), e
else:
    sys.exit(1)
PY

echo "-- refusals"
for bad in "3,1,2" "1,1" "4,3"; do
    if $E generate --model model --prompts c.jsonl --out r --aux-layers "$bad" >out 2>&1; then fail "--aux-layers $bad accepted"; fi
    grep -q "ascending and distinct" out || { cat out; fail "--aux-layers $bad: no reason"; }
done
if $E generate --model model --prompts c.jsonl --out r --final-hidden mid-norm >out 2>&1; then fail "--final-hidden mid-norm"; fi
grep -q "both, post-norm or pre-norm" out || { cat out; fail "--final-hidden message"; }
[ ! -e r ] || fail "a refused run wrote r"
$E generate --help | grep -q -- "--final-hidden both|post-norm|pre-norm" || fail "--help"
echo ok
