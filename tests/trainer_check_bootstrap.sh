#!/usr/bin/env bash
# `make trainer-check-bootstrap` (part of `make trainer-check`; optional, never in `make test`):
# the bootstrap of issue 21 — generate a slice, train a drafter on it, regenerate the rest
# faster — end to end on the CPU with SpecForge's own code:
#  1. a tiny 8-layer random model (mkmodel --preset tiny --layers 8 --seed 3), greedy, so the
#     text the drafter learns is a deterministic function of the prompt;
#  2. `eaglegen generate` on the first SLICE prompts, `eaglegen export --to specforge --model
#     model --draft-vocab 256`;
#  3. tests/trainer_check_bootstrap.py in the SpecForge venv: STEPS training steps of
#     LlamaForCausalLMEagle3 (TTT unroll 3, SpecForge's reference loss on the CPU), saved as
#     SpecForge saves a drafter (config.json + model.safetensors, no embedding);
#  4. `eaglegen generate --draft-model THAT_DIR --draft-tokens 3` on the other prompts (as
#     saved: no conversion), and the same with a random drafter (mkmodel --drafter-for, same
#     draft vocabulary size) and with none;
#  5. asserts: both drafter runs succeed, their samples are byte-identical to the run without
#     a drafter (greedy is lossless), and the trained drafter's mean accepted drafts per verify
#     step (the "phase":"speculative" line of --log-json) is at least 0.02 and 5x the random
#     one's. Prints every number (accept lengths, tokens per target pass, the loss curve).
# With BOOTSTRAP_TRAINER=speculators (`make trainer-check-bootstrap-speculators`) steps 2-3
# use speculators 0.9 instead: `export --to speculators`, its Eagle3 drafter built from the
# export's printed command and trained on the CPU (tests/trainer_check_bootstrap_speculators.py),
# saved with its own save_pretrained (speculators' config and layers.0.* names), loaded by
# `generate --draft-model` as saved.
# Exit status: 0 ok, 1 fail, 77 when the trainer's venv cannot be had (skip).
# Environment: BOOTSTRAP_TRAINER (specforge, the default, or speculators), TRAINER_VENV
# (default build/trainer-venv; tests/trainer_check_specforge.sh installs it),
# SPECULATORS_VENV (default build/trainer-venv-speculators; tests/trainer_check_speculators.sh
# installs it), BOOTSTRAP_STEPS (default 300), BOOTSTRAP_SLICE (default 200 of 240 prompts),
# BOOTSTRAP_KEEP=DIR (keep the work directory there).
set -eu
cd "$(dirname "$0")/.."
root=$PWD
: "${EAGLEGEN:=$root/build/eaglegen}" "${PYTHON:=/usr/bin/python3}"
VENV=${TRAINER_VENV:-$root/build/trainer-venv}
STEPS=${BOOTSTRAP_STEPS:-300}
SLICE=${BOOTSTRAP_SLICE:-200}
NPROMPTS=240
K=3
case "$STEPS" in ''|*[!0-9]*|0) echo "trainer-check-bootstrap: BOOTSTRAP_STEPS must be a positive integer, not '$STEPS'"; exit 1;; esac
case "$SLICE" in ''|*[!0-9]*|0) echo "trainer-check-bootstrap: BOOTSTRAP_SLICE must be a positive integer, not '$SLICE'"; exit 1;; esac
[ "$SLICE" -lt $NPROMPTS ] || { echo "trainer-check-bootstrap: BOOTSTRAP_SLICE must be below $NPROMPTS"; exit 1; }
TRAINER=${BOOTSTRAP_TRAINER:-specforge}
T0=$(date +%s)
if [ "$TRAINER" = speculators ]; then
    VENV=${SPECULATORS_VENV:-$root/build/trainer-venv-speculators}
    if ! "$VENV/bin/python" -c "import speculators, datasets, torch" 2>/dev/null; then
        if [ -z "${SPECULATORS_VENV:-}" ]; then
            bash "$root/tests/trainer_check_speculators.sh" >/dev/null || { echo "SKIP: no speculators venv"; exit 77; }
        fi
        "$VENV/bin/python" -c "import speculators, torch" 2>/dev/null || { echo "SKIP: no speculators venv at $VENV"; exit 77; }
    fi
elif [ "$TRAINER" = specforge ]; then
    if ! "$VENV/bin/python" -c "import torch, transformers, specforge.data.preprocessing, safetensors" 2>/dev/null; then
        if [ -z "${TRAINER_VENV:-}" ]; then
            bash "$root/tests/trainer_check_specforge.sh" >/dev/null || { echo "SKIP: no SpecForge venv"; exit 77; }
        fi
        "$VENV/bin/python" -c "import torch, specforge.data.preprocessing" 2>/dev/null || { echo "SKIP: no SpecForge venv at $VENV"; exit 77; }
    fi
else
    echo "trainer-check-bootstrap: BOOTSTRAP_TRAINER must be specforge or speculators, not '$TRAINER'"; exit 1
fi
[ -x "$EAGLEGEN" ] || { echo "trainer-check-bootstrap: $EAGLEGEN not built"; exit 1; }
if [ -n "${BOOTSTRAP_KEEP:-}" ]; then
    tmp=$BOOTSTRAP_KEEP; rm -rf "$tmp"; mkdir -p "$tmp"
else
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fi
cd "$tmp"
fail() { echo "trainer-check-bootstrap: FAIL: $*"; exit 1; }

"$EAGLEGEN" mkmodel --preset tiny --layers 8 --out model --seed 3 >/dev/null 2>&1
"$PYTHON" - "$NPROMPTS" "$SLICE" <<'PY'
import json, sys
n, s = int(sys.argv[1]), int(sys.argv[2])
words = "why how what the a cat dog runs blue red sky over under".split()
rows = []
for i in range(n):
    w = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(i % 5 + 1))
    rows.append(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"Q{i}: {w}?"}]}))
open("slice.jsonl", "w").write("\n".join(rows[:s]) + "\n")
open("rest.jsonl", "w").write("\n".join(rows[s:]) + "\n")
PY
GEN=(--model model --max-new-tokens 96 --max-seq-len 256 --batch 8 --seed 5 --temperature 0)

echo "-- 1. generate the slice ($SLICE prompts, greedy) and export it --to $TRAINER"
"$EAGLEGEN" generate "${GEN[@]}" --prompts slice.jsonl --out ds >/dev/null 2>gen.log || { cat gen.log; fail "generate"; }
if [ "$TRAINER" = speculators ]; then
    . "$root/tests/trainer_check_lib.sh"
    trainer_check_verifier model verifier
    "$EAGLEGEN" export ds --to speculators --out sp --draft-vocab 256 2>/dev/null | head -3 | sed 's/^/   /'
    echo "-- 2. train speculators' Eagle3 drafter on it ($STEPS CPU steps)"
    TORCHDYNAMO_DISABLE=1 "$VENV/bin/python" "$root/tests/trainer_check_bootstrap_speculators.py" sp verifier drafter \
        "$STEPS" 3e-3 >train.log 2>&1 || { cat train.log; fail "training"; }
else
    "$EAGLEGEN" export ds --to specforge --out sf --model model --draft-vocab 256 2>/dev/null | head -3 | sed 's/^/   /'
    echo "-- 2. train SpecForge's LlamaForCausalLMEagle3 on it ($STEPS CPU steps)"
    TORCHDYNAMO_DISABLE=1 "$VENV/bin/python" "$root/tests/trainer_check_bootstrap.py" sf drafter "$STEPS" 3 8 1e-2 \
        >train.log 2>&1 || { cat train.log; fail "training"; }
fi
grep '^\[bootstrap\]' train.log | sed 's/^/   /'
[ -f drafter/config.json ] && [ -f drafter/model.safetensors ] || fail "the $TRAINER save wrote no config.json + model.safetensors"

echo "-- 3. regenerate the other $(( NPROMPTS - SLICE )) prompts: no drafter, the trained one, a random one (K = $K)"
"$EAGLEGEN" mkmodel --drafter-for model --out random --seed 1 --draft-vocab 256 >/dev/null 2>&1 || fail "mkmodel --drafter-for"
"$EAGLEGEN" generate "${GEN[@]}" --prompts rest.jsonl --out plain >/dev/null 2>plain.log || { cat plain.log; fail "generate without a drafter"; }
for d in drafter random; do
    "$EAGLEGEN" generate "${GEN[@]}" --prompts rest.jsonl --out out_$d --draft-model $d --draft-tokens $K \
        --log-json $d.jsonl >/dev/null 2>$d.log || { cat $d.log; fail "generate --draft-model $d"; }
    grep 'speculative:' $d.log | sed "s/^eaglegen generate:/   $d:/"
done

echo "-- 4. check"
"$PYTHON" - "$root/dataset/python" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import eaglegen_data as eg

def spec(name):
    rows = [json.loads(l) for l in open(name + ".jsonl") if '"speculative"' in l]
    if not rows:
        sys.exit(f"trainer-check-bootstrap: FAIL: no \"phase\":\"speculative\" line in {name}.jsonl")
    return rows[-1]

def samples(d):
    ds = eg.EagleGenDataset(d)
    out = {}
    for i in range(len(ds)):
        r = ds[i]
        out[r["id"] if "id" in r else i] = r
    return ds, out

plain_ds, plain = samples("plain")
bad = []
for name in ("drafter", "random"):
    ds, got = samples("out_" + name)
    if sorted(got) != sorted(plain):
        bad.append(f"{name}: other sample ids")
        continue
    for k, r in plain.items():
        g = got[k]
        for key, v in r.items():
            a, b = (v.tobytes(), g[key].tobytes()) if hasattr(v, "tobytes") else (v, g[key])
            if a != b:
                bad.append(f"{name}: sample {k} field {key} differs from the run without a drafter")
                break
print(f"   greedy samples with each drafter == without ({len(plain)} samples, every field): {not bad}")
t, r = spec("drafter"), spec("random")
def num(row, *keys):
    for k in keys:
        if k in row:
            return float(row[k])
    sys.exit(f"trainer-check-bootstrap: FAIL: none of {keys} in {row}")
def acc(row):
    return num(row, "mean_accepted_per_verify")
def tpp(row):
    return num(row, "tokens_per_verify")
at, ar = acc(t), acc(r)
print(f"   accepted drafts per verify step: trained {at:.3f}, random {ar:.3f}; tokens per target pass: "
      f"trained {tpp(t):.3f}, random {tpp(r):.3f}")
if bad:
    sys.exit("trainer-check-bootstrap: FAIL: " + "; ".join(bad[:5]))
if not (at >= 0.02 and at >= 5 * ar):
    sys.exit(f"trainer-check-bootstrap: FAIL: the trained drafter's accept length {at:.3f} is not clearly above "
             f"the random one's {ar:.3f} (wanted >= 0.02 and >= 5x)")
PY
echo "-- trainer-check bootstrap ($TRAINER): OK in $(( $(date +%s) - T0 )) s"
