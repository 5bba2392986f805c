#!/usr/bin/env bash
# tests/ref/run.sh — independent reference check of the engine against Hugging Face
# transformers' DeepseekV3 at real widths (OPTIONAL: not part of `make test`/`make demo`;
# `make ref-check` runs it). Steps:
#   1. python: a venv at $REF_VENV (default build/ref-venv) with torch, transformers,
#      safetensors from PyPI (~2.9 GB of wheels: PyPI's torch pulls the CUDA libraries
#      even for CPU use; 5.6 GB installed). Skipped when $REF_PYTHON is set, or when
#      REF_SKIP_INSTALL=1 and python3 already imports them. Extra pip arguments (e.g. a
#      local wheel dir: --no-index --find-links DIR) go in $REF_PIP_ARGS.
#   2. model:  eaglegen mkmodel --preset $REF_PRESET (moonlight-16b) --layers $REF_LAYERS
#      (4: layer 0 dense, 1-3 MoE) --experts bf16 into $REF_DIR (default build/ref;
#      ~5 GB, drawn once and reused; REF_FRESH=1 redraws it)
#   3. compare: tests/ref/hf_compare.py runs `eaglegen forward` and HF on 4 seeded random
#      prompts (16-64 tokens), prints the per-layer error table, exits 1 on a violation.
# Arguments pass through to hf_compare.py, e.g. `--backend cuda`, `--tol 1e-2`,
# `--ours OUT.safetensors --prompts P.json` (compare a forward run made elsewhere, e.g.
# on a GPU machine that has no PyPI access). Exit status: that of hf_compare.py
# (0 ok, 1 fail, 2 setup error), 77 when the python packages cannot be had (skip).
# Needs ~16 GB RAM for 4 layers (the fp32 HF model is ~10 GB); REF_LAYERS=2 halves it.
# About 4 minutes on 2 cores once the venv and the model exist.
set -u
cd "$(dirname "$0")/../.." || exit 2
REF_DIR=${REF_DIR:-build/ref}
REF_VENV=${REF_VENV:-build/ref-venv}
REF_PRESET=${REF_PRESET:-moonlight-16b}
REF_LAYERS=${REF_LAYERS:-4}
EAGLEGEN=${EAGLEGEN:-build/eaglegen}
T0=$(date +%s)
say() { printf '[ref] %s\n' "$*"; }

# ---- 1. python with torch + transformers + safetensors
have_pkgs() { "$1" -c 'import torch, safetensors; from transformers import DeepseekV3ForCausalLM' >/dev/null 2>&1; }
PY=${REF_PYTHON:-}
if [ -z "$PY" ] && [ -x "$REF_VENV/bin/python" ] && have_pkgs "$REF_VENV/bin/python"; then
    PY=$REF_VENV/bin/python
fi
if [ -z "$PY" ] && [ "${REF_SKIP_INSTALL:-0}" = 1 ]; then
    have_pkgs python3 || { say "SKIP: REF_SKIP_INSTALL=1 and python3 lacks torch/transformers/safetensors"; exit 77; }
    PY=python3
fi
if [ -z "$PY" ]; then
    if [ ! -x "$REF_VENV/bin/python" ]; then
        say "creating venv $REF_VENV"
        /usr/bin/python3 -m venv --system-site-packages "$REF_VENV" || {
            say "SKIP: cannot create a venv (python3-venv missing?)"; exit 77; }
    fi
    PY=$REF_VENV/bin/python
    say "installing torch transformers safetensors into $REF_VENV (~2.9 GB download)"
    # shellcheck disable=SC2086
    "$PY" -m pip install --progress-bar off ${REF_PIP_ARGS:-} torch transformers safetensors ||
        { say "SKIP: pip install failed (offline? set REF_SKIP_INSTALL=1 or REF_PYTHON)"; exit 77; }
    have_pkgs "$PY" || { say "SKIP: packages installed but not importable"; exit 77; }
fi
say "python: $PY ($("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"

# ---- 2. the model
if [ ! -x "$EAGLEGEN" ]; then
    say "building $EAGLEGEN"
    make -j"$(nproc)" "$EAGLEGEN" >/dev/null || { say "FAIL: cannot build $EAGLEGEN"; exit 2; }
fi
MODEL=$REF_DIR/$REF_PRESET-l$REF_LAYERS
if [ "${REF_FRESH:-0}" = 1 ] || [ ! -f "$MODEL/.complete" ]; then
    rm -rf "$MODEL"
    mkdir -p "$REF_DIR"
    say "drawing $MODEL: mkmodel --preset $REF_PRESET --layers $REF_LAYERS --experts bf16"
    "$EAGLEGEN" mkmodel --preset "$REF_PRESET" --layers "$REF_LAYERS" --experts bf16 --out "$MODEL" ||
        { say "FAIL: mkmodel"; exit 2; }
    touch "$MODEL/.complete"
else
    say "reusing $MODEL (REF_FRESH=1 redraws it)"
fi

# ---- 3. compare
WORK=$REF_DIR/run-$REF_PRESET-l$REF_LAYERS
mkdir -p "$WORK"
say "comparing (log: $WORK/hf_compare.log)"
"$PY" tests/ref/hf_compare.py --model "$MODEL" --eaglegen "$EAGLEGEN" --work "$WORK" \
    --json "$WORK/result.json" "$@" 2>&1 | tee "$WORK/hf_compare.log"
rc=${PIPESTATUS[0]}
say "hf_compare exit $rc, $(($(date +%s) - T0)) s in all"
exit "$rc"
