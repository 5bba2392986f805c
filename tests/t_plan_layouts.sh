#!/usr/bin/env bash
# plan --gpus/--box (issue 17): every layout (replicated, +ffn and +split dense parts) with its
# KV slots, concurrency and modelled decode/prefill rates; the C model (engine/layout.c) and docs/perf_model.py agree row for
# row (the same formulas in double precision, printed exactly by both JSON writers: a
# relative difference above 1e-9 is a divergence, not rounding); expert parallelism
# holds the cache once (its token slots grow with the group, tensor parallelism's do
# not); layouts whose group does not divide the experts are left out; nonsense refused.
set -eu
: "${EAGLEGEN:?}" "${PYTHON:=/usr/bin/python3}"
E=$EAGLEGEN
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; cat out err 2>/dev/null | tail -n 20; exit 1; }
$E mkmodel --preset kimi-k2.5 --no-weights --out kimi >/dev/null 2>&1 || fail "mkmodel --no-weights"
for box in rtx-pro-6000x8 h200x8; do
    for len in 4096 8192; do
        for mem in "" "--gpu-mem-gb 103.08"; do
            $E plan --preset kimi-k2.5 --box $box --mean-len $len $mem --json > c.json 2> err || fail "plan $box $len $mem"
            "$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box $box --mean-len $len $mem --json \
                > p.json || fail "perf_model.py $box $len"
            "$PYTHON" - "$box $len $mem" <<'PY' || fail "C and Python disagree ($box $len $mem)"
import json, sys
c, p = json.load(open("c.json")), json.load(open("p.json"))
assert [r["layout"] for r in c["layouts"]] == [r["layout"] for r in p["layouts"]], (c["layouts"], p["layouts"])
for a, b in zip(c["layouts"], p["layouts"]):
    for k in ("kv_tokens", "concurrency", "decode_tok_s", "prefill_tok_s", "weights_gb", "decode_step_ms",
              "comm_ms", "comm_bytes_token_layer"):
        x, y = float(a[k]), float(b[k])
        assert abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1e-30), (sys.argv[1], a["layout"], k, x, y)
    for k in ("runnable", "fits", "decode_bound", "prefill_bound", "stages", "ep", "dense_split"):
        assert a[k] == b[k], (sys.argv[1], a["layout"], k, a[k], b[k])
assert c["recommended_decode"] == p["recommended_decode"] and c["recommended_prefill"] == p["recommended_prefill"]
rows = {r["layout"]: r for r in c["layouts"]}
assert set(rows) >= {"pp8", "pp4xep2", "pp4xep2+ffn", "pp4xep2+split", "pp2xep4", "pp2xep4+ffn", "pp2xep4+split",
                     "ep8", "ep8+ffn", "ep8+split", "tp8"}, sorted(rows)
act = {"rtx-pro-6000x8": 3.0, "h200x8": 4.0}[c["box"]["name"]]
usable = c["box"]["mem_gb"] * c["box"]["frac"] - act
L, kvb, H = 61, 1152.0, 7168
for name, r in rows.items():
    if r["ep"] > 1:
        assert r["kv_tokens"] % r["ep"] == 0, (name, "a group holds ep x its worst stage's slots")
    for k in ("layout", "kv_tokens", "concurrency", "decode_tok_s", "prefill_tok_s", "dense_split"):
        assert k in r
    assert r["fits"] == (r["concurrency"] >= 1) and (r["decode_tok_s"] > 0) == r["fits"]
    # the cache is held once: a copy on every GPU (tensor parallelism) holds the heaviest GPU's free
    # memory over 61 layers' cache bytes box-wide; every other layout at least 8/2 times that
    copy = (usable - r["weights_gb"]) * 1e9 / (L * kvb)
    if name == "tp8":
        assert abs(r["kv_tokens"] - copy) <= 1, (name, r["kv_tokens"], copy)
    elif r["fits"]:
        assert r["kv_tokens"] >= 4 * copy, (name, r["kv_tokens"], copy)
    split = {"": "none", "+ffn": "ffn", "+split": "all"}[name[len(name.rstrip("+fnsplit")):] if "+" in name else ""]
    assert r["dense_split"] == split, (name, r["dense_split"])
# what runs as modelled: the pipeline, EP groups replicated, +ffn (the shared expert / dense MLP
# of layer l whole on rank l mod E) or +split (and the vocab split of the embedding and
# lm_head), and stages x groups (stage groups: a GPU per rank and stage); tensor parallelism
# is modelled only
assert not rows["tp8"]["runnable"] and rows["ep8"]["runnable"] and rows["pp8"]["runnable"]
assert rows["ep8+ffn"]["runnable"] and rows["ep8+split"]["runnable"]
for n in ("pp2xep4", "pp2xep4+ffn", "pp2xep4+split", "pp4xep2", "pp4xep2+ffn", "pp4xep2+split"):
    assert rows[n]["runnable"], n
SH, DENSE = 2 * 3 * H * 2048, 2 * 3 * H * 18432  # one shared expert, the dense MLP (BF16 bytes)
for g in ("ep8", "pp2xep4", "pp4xep2"):
    none, ffn, full = rows[g], rows[g + "+ffn"], rows[g + "+split"]
    E = none["ep"]
    # +ffn frees memory and slots, and costs: each token's FP32 row to the layer's owner and back
    assert ffn["weights_gb"] < none["weights_gb"] and full["weights_gb"] < ffn["weights_gb"], (g, full, ffn, none)
    assert none["kv_tokens"] <= ffn["kv_tokens"] <= full["kv_tokens"], (g, full, ffn, none)
    if ffn["fits"]:
        assert none["kv_tokens"] < ffn["kv_tokens"] < full["kv_tokens"], (g, full, ffn, none)
    extra = ffn["comm_bytes_token_layer"] - none["comm_bytes_token_layer"]
    assert abs(extra - 2 * (E - 1) / E * H * 4) <= 1e-6, (g, extra)
    assert full["comm_bytes_token_layer"] == ffn["comm_bytes_token_layer"], g
    if none["fits"]:
        assert ffn["decode_step_ms"] > none["decode_step_ms"] and ffn["comm_ms"] > none["comm_ms"], (g, ffn, none)
        assert full["comm_ms"] > ffn["comm_ms"], (g, "the vocab exchange costs on top")
# round-robin memory, exactly: in EP8 rank 0 keeps the dense MLP (layer 0) and the shared experts of
# layers 8, 16, .., 56; the heaviest GPU frees the other 53 shared experts
freed = (rows["ep8"]["weights_gb"] - rows["ep8+ffn"]["weights_gb"]) * 1e9
assert abs(freed - 53 * SH) <= 1e-3 * SH, (freed, 53 * SH)
PY
        done
    done
done
# speculative decoding (issue 21): the same agreement with K drafts verified per pass, for
# the modelled drafter (64 kv heads: 32,768 cache bytes per token) and an MLA drafter's
# 1,152 (--draft-cache-bytes); a pass committing one token costs more than plain decode
# (k + 1 rows, the drafter), one committing K + 1 is faster on the HBM-bound pipeline with
# the small cache, while the large one, held for every sequence on the last stage's GPU,
# takes most of the pipeline's pool; nonsense refused
for box in rtx-pro-6000x8 h200x8; do
  for dc in 0 1152; do
    dflag=""
    [ "$dc" = 0 ] || dflag="--draft-cache-bytes $dc"
    for ka in "3 3" "3 1" "5 4.2"; do
        set -- $ka
        $E plan --preset kimi-k2.5 --box $box --draft-tokens $1 --accept $2 $dflag --json > c.json 2> err ||
            fail "plan spec $box $ka $dflag"
        "$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box $box --draft-tokens $1 --accept $2 $dflag \
            --json > p.json || fail "perf_model.py spec $box $ka $dflag"
        $E plan --preset kimi-k2.5 --box $box --json > plain.json 2> err || fail "plan $box"
        "$PYTHON" - "$box" "$1" "$2" "$dc" <<'PY' || fail "speculative model ($box $ka $dflag)"
import json, sys
c, p, plain = (json.load(open(f)) for f in ("c.json", "p.json", "plain.json"))
k, acc, dc = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
assert c["draft_tokens"] == p["draft_tokens"] == k and c["accept"] == p["accept"] == acc
for a, b in zip(c["layouts"], p["layouts"]):
    for key in ("kv_tokens", "concurrency", "decode_tok_s", "prefill_tok_s", "decode_step_ms", "comm_ms", "draft_ms"):
        x, y = float(a[key]), float(b[key])
        assert abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1e-30), (sys.argv[1:], a["layout"], key, x, y)
    for key in ("decode_bound", "prefill_bound", "fits", "runnable"):
        assert a[key] == b[key], (a["layout"], key)
base = {r["layout"]: r for r in plain["layouts"]}
for r in c["layouts"]:
    q = base[r["layout"]]
    assert r["prefill_tok_s"] == q["prefill_tok_s"], "speculation changes decode only"
    assert r["kv_tokens"] <= q["kv_tokens"], "the drafter's weights and cache take memory"
    if r["fits"]:
        assert r["draft_ms"] > 0 and r["decode_step_ms"] > r["draft_ms"]
        # with the small cache the batch stays and the drafter's time shows in the step; with
        # the 32 KB one the shrunken batch may make the step shorter than plain decode's
        if dc:
            assert r["decode_step_ms"] > q["decode_step_ms"], (r["layout"], "a drafter costs step time")
        if acc == 1:
            assert r["decode_tok_s"] < q["decode_tok_s"], (r["layout"], "nothing accepted must be slower")
pp = {r["layout"]: r for r in c["layouts"]}["pp8"]
if acc == k and dc:
    assert pp["decode_tok_s"] > base["pp8"]["decode_tok_s"], ("pp8 is HBM-bound: accepted drafts pay", pp, base["pp8"])
PY
    done
  done
done
# --whole-layers: every stage whole layers (C and Python alike); the layer split never holds
# fewer slots, and pp8 holds more with it (the 8-layer stages bound the pool: the plan --stages
# 8 split line). With the 32 KB drafter cache, at whole layers, on the last GPU of eight, the
# drafter's cache takes over half of pp8's pool; the split moves layers off that stage
for box in rtx-pro-6000x8 h200x8; do
    for spec in "" "--draft-tokens 3 --accept 3"; do
        $E plan --preset kimi-k2.5 --box $box $spec --whole-layers --json > w.json 2> err || fail "plan --whole-layers"
        "$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box $box $spec --whole-layers --json \
            > pw.json || fail "perf_model.py --whole-layers"
        $E plan --preset kimi-k2.5 --box $box $spec --json > s.json 2> err || fail "plan $box $spec"
        $E plan --preset kimi-k2.5 --box $box --whole-layers --json > w0.json 2> err || fail "plan --whole-layers plain"
        "$PYTHON" - "$box" "$spec" <<'PY' || fail "--whole-layers ($box $spec)"
import json, sys
w, p, s, w0 = (json.load(open(f)) for f in ("w.json", "pw.json", "s.json", "w0.json"))
for a, b in zip(w["layouts"], p["layouts"]):
    for k in ("kv_tokens", "decode_tok_s", "prefill_tok_s", "decode_step_ms"):
        x, y = float(a[k]), float(b[k])
        assert abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1e-30), (sys.argv[1:], a["layout"], k, x, y)
ws, ss = ({r["layout"]: r for r in d["layouts"]} for d in (w, s))
for n, r in ws.items():
    assert ss[n]["kv_tokens"] >= r["kv_tokens"], (n, ss[n]["kv_tokens"], r["kv_tokens"])
    if r["stages"] == 1:
        assert ss[n] == r, n
    else:
        assert ss[n]["decode_step_ms"] > 0 or not ss[n]["fits"]
assert ss["pp8"]["kv_tokens"] > ws["pp8"]["kv_tokens"], (ss["pp8"], ws["pp8"])
if sys.argv[2]:  # the modelled drafter, 32 KB per token
    plain = {r["layout"]: r for r in w0["layouts"]}["pp8"]
    assert ws["pp8"]["kv_tokens"] < 0.5 * plain["kv_tokens"], ("32 KB per token on one GPU of eight", ws["pp8"], plain)
PY
    done
done
$E plan --preset kimi-k2.5 --box h200x8 --draft-tokens 3 --accept 3 --draft-cache-bytes 1152 > out 2> err ||
    fail "plan --draft-cache-bytes: $(cat err)"
grep -q "its cache 1152 bytes per token (from the options)" out || fail "the plan does not say the drafter's cache: $(head -3 out)"
# --draft-model DIR: the cache per token from a drafter's config (an MLA one in vLLM's layout
# at Kimi-K2.5's dims, and SpecForge's Kimi-K2.5 MHA config): the same rows as the number
mkdir -p dmla dmha
cat > dmla/config.json <<'JSON'
{"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
 "num_attention_heads": 64, "num_hidden_layers": 1, "intermediate_size": 18432, "vocab_size": 163840,
 "draft_vocab_size": 163840, "rms_norm_eps": 1e-05, "rope_theta": 50000.0, "max_position_embeddings": 262144,
 "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
 "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
 "first_k_dense_replace": 1, "moe_layer_freq": 1, "hidden_act": "silu",
 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": true}}
JSON
cat > dmha/config.json <<'JSON'
{"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168, "head_dim": 128,
 "num_attention_heads": 64, "num_key_value_heads": 64, "num_hidden_layers": 1, "intermediate_size": 18432,
 "vocab_size": 163840, "draft_vocab_size": 32000, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
 "rope_scaling": null, "hidden_act": "silu",
 "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": true}}
JSON
# the MLA drafter's weights on a GPU, counted from its config here (BF16, no embedding): fc,
# 4 norms, q_a + q_a_layernorm + q_b, kv_a, kv_a_layernorm, kv_b, o, the MLP, lm_head
mla_w=$("$PYTHON" -c "
H, A, I, V, NH, QL, C, DN, DR, DV = 7168, 3 * 7168, 18432, 163840, 64, 1536, 512, 128, 64, 128
el = H * A + 4 * H + QL * 2 * H + QL + NH * (DN + DR) * QL + (C + DR) * 2 * H + C + NH * (DN + DV) * C
el += H * NH * DV + 3 * H * I + V * H
print(2 * el)")
for box in rtx-pro-6000x8 h200x8; do
    $E plan --preset kimi-k2.5 --box $box --draft-tokens 3 --accept 3 --draft-model dmla --json > a.json 2> err ||
        fail "plan --draft-model (MLA) $box: $(cat err)"
    $E plan --preset kimi-k2.5 --box $box --draft-tokens 3 --accept 3 --draft-cache-bytes 1152 \
        --draft-weight-bytes "$mla_w" --json > b.json || fail "plan --draft-cache-bytes 1152 --draft-weight-bytes $box"
    "$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box $box --draft-tokens 3 --accept 3 \
        --draft-cache-bytes 1152 --draft-weight-bytes "$mla_w" --json > p.json || fail "perf_model.py, MLA weights"
    "$PYTHON" - <<'PY' || fail "plan and perf_model.py disagree on the MLA drafter ($box)"
import json
c, p = json.load(open("b.json")), json.load(open("p.json"))
for a, b in zip(c["layouts"], p["layouts"]):
    for key in ("kv_tokens", "decode_tok_s", "draft_ms"):
        x, y = float(a[key]), float(b[key])
        assert abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1e-30), (a["layout"], key, x, y)
PY
    $E plan --preset kimi-k2.5 --box $box --draft-tokens 3 --accept 3 --draft-model dmha --json > c.json 2> err ||
        fail "plan --draft-model (MHA) $box: $(cat err)"
    $E plan --preset kimi-k2.5 --box $box --draft-tokens 3 --accept 3 --json > d.json || fail "plan $box"
    cmp -s a.json b.json || fail "plan --draft-model (MLA) differs from --draft-cache-bytes 1152 on $box"
    cmp -s c.json d.json || fail "plan --draft-model (64 kv heads) differs from the modelled drafter on $box"
done
$E plan --preset kimi-k2.5 --box h200x8 --draft-tokens 3 --accept 3 --draft-model dmla > out 2> err || fail "plan --draft-model text"
grep -q "its cache 1152 bytes per token (from the options)" out || fail "plan --draft-model: $(head -3 out)"
! $E plan --preset kimi-k2.5 --box h200x8 --draft-tokens 3 --accept 3 --draft-model dmla --draft-cache-bytes 9 \
    > out 2> err || fail "--draft-model with --draft-cache-bytes accepted"
grep -q "not both" err || fail "--draft-model with --draft-cache-bytes: $(cat err)"
! $E plan --preset moonlight-16b --box h200x8 --draft-tokens 3 --accept 3 --draft-model dmla > out 2> err ||
    fail "a Kimi drafter accepted for moonlight-16b"
grep -q "dmla" err && grep -q "hidden size\|vocab" err || fail "a drafter for another model: $(cat err)"
! $E plan --preset kimi-k2.5 --box h200x8 --draft-cache-bytes 1152 > out 2> err || fail "--draft-cache-bytes alone accepted"
! $E plan --preset kimi-k2.5 --box h200x8 --draft-tokens 3 > out 2> err || fail "--draft-tokens without --accept accepted"
grep -q -- '--accept' err || fail "--draft-tokens alone: $(cat err)"
! $E plan --preset kimi-k2.5 --box h200x8 --draft-tokens 3 --accept 4.5 > out 2> err || fail "--accept above K + 1 accepted"
# more memory per GPU: more slots in every layout
$E plan --preset kimi-k2.5 --box h200x8 --json > a.json
$E plan --preset kimi-k2.5 --box h200x8 --gpu-mem-gb 200 --json > b.json
"$PYTHON" - <<'PY' || fail "slots must grow with memory"
import json
a, b = (json.load(open(f))["layouts"] for f in ("a.json", "b.json"))
for x, y in zip(a, b):
    assert y["kv_tokens"] > x["kv_tokens"], (x["layout"], x["kv_tokens"], y["kv_tokens"])
PY
# text table: a recommendation per mode and the reason rows are modelled only
$E plan --preset kimi-k2.5 --box h200x8 > out 2> err || fail "plan h200x8 text"
grep -q '^recommended for decode: ep8, .*x pp8, the pipeline' out || fail "h200x8 decode recommendation"
# what the recommendation splits and why: on H200 the ffn owner's group-wide FFN costs more than
# its slots buy
grep -q '^dense parts: replicated chosen' out || fail "h200x8 split choice"
grep -q '^  ffn split .*: frees 4.7 GB per GPU = +[0-9]*K KV tokens, costs [0-9.]* ms/step exchange .*ep8+ffn [0-9]* tok/s against ep8 ' out ||
    fail "h200x8 ffn split line"
grep -q '^recommended for capture-mode prefill: ' out || fail "prefill recommendation"
grep -q 'modelled only: eaglegen does not run tensor parallelism' out || fail "tp row note"
grep -q '^ep8+split .*--ep-split all (CPU and CUDA ranks)' out || fail "+split row note"
grep -q '^ep8+ffn .*--ep-split ffn' out || fail "+ffn row note"
# on the RTX box the KV slots are what decode lacks: the fastest layout splits stages over EP
# groups with the FFN and the vocabulary split, run as stage groups (a GPU per rank and stage;
# pp2xep4+split and pp4xep2+split within 1% of each other with the layer split); it is the
# recommendation, so no faster modelled-only row is named
$E plan --preset kimi-k2.5 --box rtx-pro-6000x8 > out 2> err || fail "plan rtx text"
grep -Eq '^recommended for decode: pp[24]xep[42]\+split, .*x pp8, the pipeline' out || fail "rtx decode recommendation"
! grep -q '^fastest modelled for decode' out || fail "rtx: a faster modelled-only row named"
grep -q '^pp2xep4+split .*--ep-split all (CPU and CUDA ranks)' out || fail "rtx: pp2xep4+split row note"
# the tiny model has 16 experts and 5 layers: with 6 GPUs no EP group of 3 or 6 appears, 2
# does, and no pipeline of 6 stages (more stages than layers)
$E plan --preset tiny --gpus 6 --json > t.json 2> err || fail "plan tiny --gpus 6"
"$PYTHON" - <<'PY' || fail "layouts not dividing the experts must be left out"
import json
names = [r["layout"] for r in json.load(open("t.json"))["layouts"]]
assert "pp3xep2" in names and "tp6" in names and "pp6" not in names, names
assert not any("ep3" in n or "ep6" in n for n in names), names
PY
# the drafter's weights count in the last stage's share of the whole-layer split: a 10 GB
# one beside pp8's 7-layer last stage leaves the 8-layer stages binding the pool (as without
# a drafter), and pp4xep2 fits (with the target's bytes alone its last stage kept 15 layers
# and the drafter did not fit beside them). With the layer split the pool is the box's free
# memory shared out, so the drafter's 10 GB take slots from every row, and pp4xep2 fits
$E plan --preset kimi-k2.5 --box rtx-pro-6000x8 --whole-layers --json > d0.json 2> err || fail "plan rtx plain"
$E plan --preset kimi-k2.5 --box rtx-pro-6000x8 --draft-tokens 3 --accept 3 --draft-cache-bytes 1152 \
    --draft-weight-bytes 10e9 --whole-layers --json > d1.json 2> err || fail "plan rtx, a 10 GB drafter"
$E plan --preset kimi-k2.5 --box rtx-pro-6000x8 --json > d2.json 2> err || fail "plan rtx plain, split"
$E plan --preset kimi-k2.5 --box rtx-pro-6000x8 --draft-tokens 3 --accept 3 --draft-cache-bytes 1152 \
    --draft-weight-bytes 10e9 --json > d3.json 2> err || fail "plan rtx, a 10 GB drafter, split"
"$PYTHON" - <<'PY' || fail "the split does not count the drafter's weights"
import json
a, b, c, d = ({r["layout"]: r for r in json.load(open(f))["layouts"]} for f in ("d0.json", "d1.json", "d2.json", "d3.json"))
assert b["pp8"]["kv_tokens"] == a["pp8"]["kv_tokens"], (a["pp8"], b["pp8"])
assert b["pp4xep2"]["fits"] and b["pp4xep2"]["kv_tokens"] > 0, b["pp4xep2"]
for n in ("pp8", "pp4xep2", "pp2xep4+split"):
    assert 0 < d[n]["kv_tokens"] < c[n]["kv_tokens"] and d[n]["fits"], (n, c[n], d[n])
PY
# perf_model.py --balance-memory (a what-if, an upper bound): a pipeline's pool as if its
# stages' free memory were pooled. Single-stage rows are unchanged, no pipeline row loses
# slots against whole layers, the pipelines are marked modelled only, and pp8's pool is the
# box's free memory (the per-stage free GB that `plan --stages 8`, the C memory plan, prints)
# over the cache bytes per token; the layer split (the default) stays under it, and is the
# pool of the split line `plan --stages 8` prints
$E plan --preset kimi-k2.5 --stages 8 > st.txt 2> err || fail "plan --stages 8"
"$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box rtx-pro-6000x8 --whole-layers --json > p0.json ||
    fail "perf_model.py rtx"
"$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box rtx-pro-6000x8 --json > p2.json ||
    fail "perf_model.py rtx, the layer split"
"$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box rtx-pro-6000x8 --balance-memory --json \
    > p1.json || fail "perf_model.py --balance-memory"
"$PYTHON" - <<'PY' || fail "--balance-memory"
import json
a = {r["layout"]: r for r in json.load(open("p0.json"))["layouts"]}
b = {r["layout"]: r for r in json.load(open("p1.json"))["layouts"]}
assert set(a) == set(b)
for n in a:
    if a[n]["stages"] == 1 or n.startswith("tp"):
        assert a[n] == b[n], n
    else:
        assert b[n]["kv_tokens"] >= a[n]["kv_tokens"] and not b[n]["runnable"], (n, a[n], b[n])
free = [float(l.split()[4]) for l in open("st.txt") if l[:1].isdigit()]
assert len(free) == 8 and min(free) < 0.6 * max(free), free
want = sum(free) * 1e9 / (61 * 1152)
got = b["pp8"]["kv_tokens"]
assert abs(got - want) <= 1e-3 * want and got > 1.6 * a["pp8"]["kv_tokens"], (got, want, a["pp8"]["kv_tokens"])
cut = json.load(open("p2.json"))["layouts"][0]
assert cut["layout"] == "pp8" and a["pp8"]["kv_tokens"] < cut["kv_tokens"] <= got, (cut, got)
line = [l for l in open("st.txt") if l.startswith("  ") and "token slots box-wide" in l]
assert line and int(line[0].split()[0]) == cut["kv_tokens"], (line, cut["kv_tokens"])
PY
# perf_model.py --ffn-rows (a what-if: the FFNs split by weight rows over the group, not built):
# rows without a dense split are unchanged; the split rows are modelled only, hold no fewer
# slots (each rank 1/E of every FFN, at most what the heaviest owner holds) and weigh no more;
# on H200 ep8+ffn's step loses the owner's serial FFN (shorter) and its rate rises
for box in rtx-pro-6000x8 h200x8; do
    "$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box $box --json > f0.json || fail "perf_model.py $box"
    "$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box $box --ffn-rows --json > f1.json ||
        fail "perf_model.py --ffn-rows $box"
    "$PYTHON" - $box <<'PY' || fail "--ffn-rows ($box)"
import json, sys
a = {r["layout"]: r for r in json.load(open("f0.json"))["layouts"]}
b = {r["layout"]: r for r in json.load(open("f1.json"))["layouts"]}
assert set(a) == set(b)
split = [n for n in a if n.endswith("+ffn") or n.endswith("+split")]
assert len(split) == 6, split
for n in a:
    if n not in split:
        assert a[n] == b[n], n
        continue
    assert not b[n]["runnable"] and a[n]["runnable"], n
    assert b[n]["kv_tokens"] >= a[n]["kv_tokens"] and b[n]["weights_gb"] <= a[n]["weights_gb"] + 1e-9, (n, a[n], b[n])
if sys.argv[1] == "h200x8":
    x, y = a["ep8+ffn"], b["ep8+ffn"]
    assert y["decode_step_ms"] < x["decode_step_ms"] and y["decode_tok_s"] > x["decode_tok_s"], (x, y)
PY
done
# a config that ties the embeddings: a pipeline's last stage holds its own copy of the head
# (every layout with stages gets the untied slots), one stage shares the embedding's bytes
# (the C side: t_gen_stage_cut.sh, over a tied checkpoint)
cp -r kimi kimit
"$PYTHON" - <<'PY'
import json
c = json.load(open("kimit/config.json"))
(c.get("text_config") or c)["tie_word_embeddings"] = True
json.dump(c, open("kimit/config.json", "w"))
PY
for m in kimi kimit; do
    "$PYTHON" "$root/docs/perf_model.py" --config $m/config.json --box rtx-pro-6000x8 --gpu-mem-gb 103.08 --json \
        > tie_$m.json || fail "perf_model.py $m"
done
"$PYTHON" - <<'PY' || fail "a tied head in the layout model"
import json
a = {r["layout"]: r for r in json.load(open("tie_kimi.json"))["layouts"]}
b = {r["layout"]: r for r in json.load(open("tie_kimit.json"))["layouts"]}
assert set(a) == set(b)
for n in a:
    if a[n]["stages"] > 1:
        assert a[n]["kv_tokens"] == b[n]["kv_tokens"], (n, a[n]["kv_tokens"], b[n]["kv_tokens"])
    else:
        assert b[n]["kv_tokens"] >= a[n]["kv_tokens"], (n, a[n]["kv_tokens"], b[n]["kv_tokens"])
assert all(b[n]["kv_tokens"] > a[n]["kv_tokens"] for n in ("ep8+ffn", "ep8+split", "tp8")), (a, b)
PY
# sequences in flight as generate runs them: --batch N box-wide, --batch auto up to the chunk
# per rank; C and Python agree, concurrency is the least of the cache's and the cap, and the
# cap can change the recommendation (what --layout auto then takes)
for cap in "--batch 64" "--batch auto --prefill-chunk 512"; do
    pcap=${cap/--batch auto/--batch-per-rank 512}
    $E plan --preset kimi-k2.5 --box h200x8 $cap --json > c.json 2> err || fail "plan $cap"
    uncap=${cap#--batch 64}; uncap=${uncap#--batch auto }
    $E plan --preset kimi-k2.5 --box h200x8 $uncap --json > u.json 2> err || fail "plan without $cap"
    "$PYTHON" "$root/docs/perf_model.py" --config kimi/config.json --box h200x8 $pcap --json > p.json ||
        fail "perf_model.py $pcap"
    "$PYTHON" - "$cap" <<'PY' || fail "the sequence cap ($cap)"
import json, sys
c, p, u = (json.load(open(f)) for f in ("c.json", "p.json", "u.json"))
cap = sys.argv[1]
for a, b, x in zip(c["layouts"], p["layouts"], u["layouts"]):
    for k in ("concurrency", "decode_tok_s", "prefill_tok_s"):
        assert abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), abs(b[k]), 1e-30), (cap, a["layout"], k, a[k], b[k])
    lim = 64 if "64" in cap else 512 * x["ep"] if x["layout"][:2] != "tp" else 512
    assert a["concurrency"] == min(x["concurrency"], lim), (cap, a["layout"], a["concurrency"], x["concurrency"], lim)
assert c["recommended_decode"] == p["recommended_decode"], (c["recommended_decode"], p["recommended_decode"])
if "64" in cap:
    assert c["max_seqs"] == 64 and c["recommended_decode"] != u["recommended_decode"], (c["recommended_decode"],)
PY
done
$E plan --preset kimi-k2.5 --box h200x8 --batch 64 | grep -q "at most 64 box-wide (--batch 64)" || fail "the table does not say --batch"

# a model without routed experts has no expert-parallel layouts (every E divided 0); the
# JSON's exit status is the table's when nothing runs
"$PYTHON" -c "import json; c = json.load(open('kimi/config.json')); t = c.get('text_config') or c; t['n_routed_experts'] = 0
import os; os.makedirs('dense', exist_ok=True); json.dump(c, open('dense/config.json', 'w'))"
$E plan --model dense --box h200x8 --json > d.json 2> err || true
"$PYTHON" -c "import json; d = json.load(open('d.json')); assert all(r['ep'] == 1 for r in d['layouts']), [r['layout'] for r in d['layouts']]" ||
    fail "expert-parallel rows for a model without experts"
"$PYTHON" "$root/docs/perf_model.py" --config dense/config.json --box h200x8 --json > pd.json || fail "perf_model.py on a dense config"
set +e; $E plan --preset kimi-k2.5 --gpus 3 --json > out 2> err; rc=$?; set -e
[ $rc -eq 1 ] || fail "plan --json with nothing runnable: exit $rc"
set +e; $E plan --preset kimi-k2.5 --gpus 1000 > out 2> err; rc=$?; set -e
[ $rc -eq 1 ] && grep -q "E dividing its 384 routed experts" out || fail "--gpus 1000: exit $rc: $(tail -n 2 out)"

# refusals, each naming what is wrong
for bad in "--gpu-mem-gb 1e10" "--act-gb 1e18" "--mean-len 1e12" "--batch 0" "--batch x"; do
    ! $E plan --preset kimi-k2.5 --box h200x8 $bad > out 2> err || fail "$bad accepted"
    grep -q -- "${bad%% *}" err || fail "$bad: message $(cat err)"
done
! $E plan --preset nope --box h200x8 > out 2> err; [ $? -eq 0 ] || true
set +e; $E plan --preset nope --box h200x8 > out 2> err; rc=$?; set -e
[ $rc -eq 2 ] && grep -q "unknown preset" err || fail "unknown preset: exit $rc: $(cat err)"
$E plan --model kimi --box h200x8 > out 2> err || fail "plan --model (config only) --box: $(cat err)"
! $E plan --preset kimi-k2.5 --gpus 0 > out 2> err || fail "--gpus 0 accepted"
grep -q -- '--gpus' err || fail "--gpus 0 message: $(cat err)"
! $E plan --preset kimi-k2.5 --gpus 8 --stages 8 > out 2> err || fail "--gpus with --stages accepted"
grep -q 'give one of them' err || fail "--gpus with --stages message: $(cat err)"
! $E plan --preset kimi-k2.5 --box dgx > out 2> err || fail "unknown box accepted"
grep -q "rtx-pro-6000x8 or h200x8" err || fail "box message: $(cat err)"
! $E plan --preset kimi-k2.5 --gpus 8 --link carrier-pigeon > out 2> err || fail "unknown link accepted"
grep -q "pcie or nvlink" err || fail "link message: $(cat err)"
# the prefill recommendation says what a step of --prefill-chunk rows holds beyond --act-gb:
# the forward's buffers and the expert exchange's, from the sizes the runtime allocates
# (recomputed here from the config: engine/forward.c, engine/collective_cuda.c)
$E plan --preset kimi-k2.5 --box h200x8 > out 2> err || fail "plan h200x8: $(cat err)"
"$PYTHON" - out <<'PY' || fail "the prefill memory note"
import re, sys
H, QL, NH, DN, DR, C, DV, K, V = 7168, 1536, 64, 128, 64, 512, 128, 8, 163840
T, R = 8192, 2  # --prefill-chunk's default; the recommended pp4xep2's group
fw = 4 * T * (4 * H + 2 * QL + NH * (DN + DR) + C + DR + NH * DV + 2 * K + 4) + 4 * (DR // 2 + 1)
M = min(K, R)
ex = 4 * (8 * R + T * M + T * M * H + 3 * T * K + T * K + R * T * H + 3 * R * T * K + T * H + R * T * K * H + T * K * H)
text = open(sys.argv[1]).read()
assert "recommended for capture-mode prefill: pp4xep2," in text, text[-600:]
m = re.search(r"memory at --prefill-chunk 8192: the table holds 4.0 GB .* buffers take ([0-9.]+) GB \(on the last "
              r"stage's GPUs ([0-9.]+) MB more a sequence in flight, its logits\) and the expert exchange's ([0-9.]+) GB",
              text)
assert m and m.groups() == (f"{fw / 1e9:.2f}", f"{4 * V / 1e6:.2f}", f"{ex / 1e9:.2f}"), (m and m.groups(), fw, ex)
print(f"prefill note: forward {m.group(1)} GB, logits {m.group(2)} MB a sequence, exchange {m.group(3)} GB at 8192 rows")
PY
$E plan --preset kimi-k2.5 --box h200x8 --prefill-chunk 512 > out 2> err || fail "plan --prefill-chunk 512"
! grep -q "memory at --prefill-chunk" out || fail "a memory note at 512 rows, within --act-gb"
echo "t_plan_layouts: ok"
