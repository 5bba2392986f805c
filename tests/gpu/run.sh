#!/usr/bin/env bash
# tests/gpu/run.sh — verify the CUDA backend on a machine with a GPU, in one call
# (budget: under 8 minutes on an H200). Steps:
#   1. build: make -j16 eaglegen + GPU test programs (BUILD, default build-gpu)
#   2. ops:   build-gpu/gpu/test_cuda_ops — every op CUDA vs CPU backend, small and
#             Kimi-K2.5 shapes (offsets past 2^31 too: big_embed_lmhead, big_mla_cache),
#             normalised errors printed; then compute-sanitizer
#             (memcheck, racecheck) on the attention and MoE op tests
#   3. golden: eaglegen forward --backend cuda on the fixtures vs golden-*-bf16kv,
#             teacher-forced (per-layer rel error, argmax at high-margin steps) and
#             greedy --generate 16 (tests/gpu/golden_gpu.py)
#   4. e2e:   mkmodel tiny -> generate --backend cuda -> inspect --verify (and what the GPU
#             holds after load against the memory plan's budget); the same run
#             with EG_CUDA_GRAPHS=0 must write the same samples bit for bit
#   4b. pipeline: 2 and 4 stages on the one GPU equal the unsplit run (forward, generate), and
#             3 stages with layers split between them (--stages 2:3,4:13,5)
#   4d. ep: generate --ep 2 (and --ep-split ffn, all, and layer 2 split between two stages:
#             --stages 3:5,5) on the one GPU (cuda-local; nccl where 2 GPUs) equals
#             the unsplit run at --batch 1
#   4e. drafter: the EAGLE-3 drafter's ops and logits through the CUDA backend vs its CPU
#             code, and generate --draft-model with the drafter on the GPU (issue 21):
#             greedy, and sampled with the device's p(draft) and with the host's (the
#             logits rows taken and the tokens drawn on the device printed)
#   4c. hf-reference: transformers' DeepseekV3 vs ours (only where torch+transformers exist)
#   5. bench: eaglegen bench --backend cuda, weights drawn on the GPU: tiny, moonlight-16b
#             4 layers BF16 experts, kimi-k2.5 4 layers INT4 (issue 7's table), decode at
#             batch 1/16/64/256 x context 2K/8K and prefill, with roofline shares; Kimi
#             again with CUDA graphs off, with the register-prefetch MoE, with every
#             lever off (before/after), a per-op device-time profile (EG_CUDA_PROFILE=1),
#             the MLA kernels at 8K context, and sampled decode both ways; the EAGLE-3
#             drafter's attention op alone (--draft-attention) at the public Kimi
#             drafters' 64 kv heads of 128 and a GQA drafter's 8, 4K context
# Every step is guarded: a missing piece (binary, fixture, command, device, tool) is SKIP
# with the reason, a failure is FAIL; the script always reaches the final table. Every
# command runs under `timeout`, and a step starts only when the elapsed time plus its
# timeout fits the budget (GPU_RUN_BUDGET, default 450 s), so the call never overruns;
# each step's row is appended to the summary file as soon as it finishes, so a call cut
# short still leaves the rows so far. Without a GPU (no device in nvidia-smi -L and no
# /dev/nvidia0) nothing is built or run: every step is SKIP with the reason, in seconds
# (GPU_RUN_BUILD=1 builds anyway). Python: $PYTHON, else the first of `python3` on PATH
# and /usr/bin/python3 that imports numpy (printed). NCCL: where the toolkit, the
# system or a Python nvidia-nccl wheel has it (passed to make as NCCL_HOME), else the
# table says the NCCL transport was not built. Logs go to $OUT/gpu-logs when $OUT is
# set (the device runner brings $OUT back), else $BUILD/gpu-logs; the table is
# $LOGS/summary.txt. Exit status 1 when any step failed.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build-gpu}
BUDGET=${GPU_RUN_BUDGET:-450} # seconds; a step whose timeout would pass it is skipped
if [ -z "${FIXTURES:-}" ]; then
    for d in "$ROOT/../shared/fixtures" "$ROOT/shared/fixtures" /work/shared/fixtures; do
        if [ -d "$d/models" ]; then FIXTURES=$(cd "$d" && pwd); break; fi
    done
fi
FIXTURES=${FIXTURES:-}
LOGS=${OUT:+$OUT/gpu-logs}
LOGS=${LOGS:-$ROOT/$BUILD/gpu-logs}
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/summary.txt
SUMMARY_FILE=$LOGS/summary.txt
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
E=$ROOT/$BUILD/eaglegen
T0=$(date +%s)
NAMES=() STATUS=() NOTES=() SECS=()
FAILED=0
NO_GPU=0
NO_GPU_WHY=""

elapsed() { echo $(($(date +%s) - T0)); }
row() { printf '%-28s %-5s %6s  %s\n' "$@"; }
{ echo "tests/gpu/run.sh summary (started $(date -u '+%F %T') UTC; budget ${BUDGET}s; logs in $LOGS)"
  row step result secs note; } > "$SUMMARY_FILE"
record() { # name status note seconds: kept for the final table and appended to the summary now
    NAMES+=("$1"); STATUS+=("$2"); NOTES+=("$3"); SECS+=("$4")
    [ "$2" = FAIL ] && FAILED=1
    row "$1" "$2" "$4" "$3" >> "$SUMMARY_FILE"
    echo "-- $1: $2 ${3:+($3)}"
}
# run NAME TIMEOUT LOG cmd... : runs with a timeout, keeps the log, records PASS/FAIL;
# SKIP (time budget) when the timeout would end past the budget
run() {
    local name=$1 to=$2 log=$3
    shift 3
    local s rc
    if late "$to"; then record "$name" SKIP "time budget: $(elapsed)s elapsed + ${to}s timeout > ${BUDGET}s" 0; return 125; fi
    s=$(date +%s)
    echo "== $name: $*" | tee "$LOGS/$log"
    timeout -k 10 "$to" "$@" >> "$LOGS/$log" 2>&1
    rc=$?
    tail -n 60 "$LOGS/$log" | sed 's/^/   | /'
    local note="rc $rc"
    [ $rc -eq 124 ] && note="timed out after ${to}s"
    if [ $rc -eq 0 ]; then record "$name" PASS "${SUMMARY:-}" $(($(date +%s) - s))
    else record "$name" FAIL "$note${SUMMARY:+; $SUMMARY}" $(($(date +%s) - s)); fi
    return $rc
}
have_cmd() { [ -x "$E" ] && timeout 20 "$E" "$1" --help 2>&1 | grep -q -- "${2:---}"; }
late() { [ $(($(elapsed) + ${1:-0})) -gt "$BUDGET" ]; } # late TIMEOUT: would a step of TIMEOUT s overrun?

echo "== machine"
{ timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi unavailable"
  timeout 20 /usr/local/cuda/bin/nvcc --version 2>&1 | tail -1; nproc; } | tee "$LOGS/machine.log"

# a device at all? (nvidia-smi -L lists one line per GPU; containers without it may
# still expose /dev/nvidia0)
ngpu=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${ngpu:-0}" -eq 0 ] && ! [ -e /dev/nvidia0 ]; then
    NO_GPU=1
    if command -v nvidia-smi > /dev/null 2>&1; then NO_GPU_WHY="no GPU: nvidia-smi -L lists none"
    else NO_GPU_WHY="no GPU: no nvidia-smi and no /dev/nvidia0"; fi
    echo "== $NO_GPU_WHY"
fi

# Python with numpy (the golden comparer and gen_check need it): the H200 image has it
# in the python3 first on PATH (under /opt), not in /usr/bin/python3
PYTHON_WHY=""
pick_python() {
    local p
    for p in ${PYTHON:-} "$(command -v python3 2>/dev/null)" /usr/bin/python3; do
        [ -n "$p" ] && [ -x "$p" ] || continue
        if timeout 30 "$p" -c "import numpy" > /dev/null 2>&1; then echo "$p"; return 0; fi
    done
    return 1
}
if PY=$(pick_python); then
    PYTHON=$PY
    echo "== python: $PYTHON (numpy $(timeout 30 "$PYTHON" -c 'import numpy; print(numpy.__version__)' 2>/dev/null))" |
        tee -a "$LOGS/machine.log"
else
    PYTHON=${PYTHON:-/usr/bin/python3}
    PYTHON_WHY="no python3 with numpy (tried \$PYTHON, python3 on PATH, /usr/bin/python3)"
    echo "== python: $PYTHON_WHY" | tee -a "$LOGS/machine.log"
fi

# NCCL: the Makefile looks next to nvcc and in the system; the H200 image has it only in
# Python's nvidia-nccl wheel (site-packages/nvidia/nccl/{include,lib}), which make gets as
# NCCL_HOME. Without it the NCCL transport is not built (pipelines use --transport local).
NCCL_WHERE=""
for f in /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do [ -f "$f" ] && NCCL_WHERE=$(dirname "$(dirname "$f")"); done
NCCL_MAKE=()
if [ -z "$NCCL_WHERE" ]; then
    for sp in $(timeout 30 "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null); do
        d=$sp/nvidia/nccl
        if [ -f "$d/include/nccl.h" ] && ls "$d"/lib/libnccl.so* > /dev/null 2>&1; then
            NCCL_WHERE=$d
            NCCL_MAKE=(NCCL_HOME="$d")
            break
        fi
    done
fi
if [ -n "$NCCL_WHERE" ]; then echo "== nccl: $NCCL_WHERE" | tee -a "$LOGS/machine.log"
else echo "== nccl: not found: the NCCL transport is not built" | tee -a "$LOGS/machine.log"; fi

if [ $NO_GPU = 1 ] && [ "${GPU_RUN_BUILD:-0}" != 1 ]; then
    record build SKIP "$NO_GPU_WHY (make test builds the CUDA code; GPU_RUN_BUILD=1 builds here)" 0
    for step in nccl ops sanitizer golden e2e pipeline hf-reference bench; do record "$step" SKIP "$NO_GPU_WHY" 0; done
    { echo; echo "($(elapsed)s total)"; } >> "$SUMMARY_FILE"
    echo
    cat "$SUMMARY_FILE"
    exit 0
fi

# 1. build --------------------------------------------------------------------------
SUMMARY="" run build 300 build.log make -j16 BUILD="$BUILD" "${NCCL_MAKE[@]}" "$BUILD/eaglegen" gpu-tests
grep -E "warning|error" "$LOGS/build.log" | head -20
if grep -q "DEG_HAVE_NCCL=1" "$LOGS/build.log"; then record nccl PASS "NCCL transport built ($NCCL_WHERE)" 0
elif grep -q "DEG_HAVE_CUDA=1" "$LOGS/build.log"; then
    record nccl SKIP "NCCL not found (toolkit, /usr, Python nvidia-nccl wheel): NCCL transport not built" 0
fi

# 2. op tests -----------------------------------------------------------------------
OPS=$ROOT/$BUILD/gpu/test_cuda_ops
if [ $NO_GPU = 1 ]; then
    record ops SKIP "$NO_GPU_WHY" 0
elif [ -x "$OPS" ]; then
    SUMMARY="" run ops 240 ops.log "$OPS"
    [ $? -eq 2 ] && grep -q "no CUDA device" "$LOGS/ops.log" && NO_GPU=1
    grep -E "rel |differ|identical|DIFFERENT|FAIL|passed" "$LOGS/ops.log" > "$LOGS/ops-summary.log"
    # keep the numbers in the table's note
    n=${#STATUS[@]}
    NOTES[$((n - 1))]="${NOTES[$((n - 1))]} $(tail -n 1 "$LOGS/ops.log")"
else
    if grep -q "built without CUDA" "$LOGS/build.log"; then
        record ops SKIP "built without CUDA: nvcc not found at build time" 0
    else
        record ops SKIP "no $OPS (build failed?)" 0
    fi
    NO_GPU=1
fi

# 2b. compute-sanitizer on small op tests: out-of-bounds and misaligned accesses
# (memcheck) and shared-memory races (racecheck) on the real GPU, which the CPU emulator
# cannot show (it runs a block's threads, not the hardware's memory system).
# GPU_RUN_SANITIZE=0 skips it.
SANI=$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ $NO_GPU = 1 ] || [ "${GPU_RUN_SANITIZE:-1}" = 0 ]; then
    :
elif [ -z "$SANI" ]; then
    record sanitizer SKIP "compute-sanitizer not found" 0
elif late 60; then
    record sanitizer SKIP "time budget" 0
else
    # probe once on a cheap test: a sanitizer that refuses the device ("Device not
    # supported" on some images) is SKIP with its words, not three FAILs
    timeout -k 10 60 "$SANI" --tool memcheck --error-exitcode 3 "$OPS" errors_and_plan > "$LOGS/sanitize-probe.log" 2>&1
    prc=$?
    if [ $prc -ne 0 ] && ! grep -Eq "ERROR SUMMARY: [1-9]" "$LOGS/sanitize-probe.log"; then
        why=$(grep -m1 -iE "not supported|error" "$LOGS/sanitize-probe.log" | sed 's/^[= ]*//' | cut -c1-120)
        record sanitizer SKIP "compute-sanitizer cannot run here (rc $prc: ${why:-see sanitize-probe.log})" 0
        SANI=""
    fi
fi
if [ -n "$SANI" ] && [ $NO_GPU = 0 ] && [ "${GPU_RUN_SANITIZE:-1}" != 0 ]; then
    for spec in memcheck:mla_paths racecheck:mla_paths memcheck:moe_small memcheck:gqa_attention \
        racecheck:gqa_attention; do
        tool=${spec%%:*} f=${spec#*:}
        SUMMARY="" run "sanitize-$tool-$f" 60 "sanitize-$tool-$f.log" "$SANI" --tool "$tool" --error-exitcode 3 \
            "$OPS" "$f"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|Hazard" "$LOGS/sanitize-$tool-$f.log" | head -5
    done
fi

# 3. fixtures vs golden (bf16kv) ------------------------------------------------------
if [ $NO_GPU = 1 ]; then
    record rest SKIP "${NO_GPU_WHY:-no CUDA device or no CUDA build}: steps 2b-5 not run" 0
elif [ -z "$FIXTURES" ]; then
    record golden SKIP "fixtures not found (set FIXTURES)" 0
elif [ -n "$PYTHON_WHY" ]; then
    record golden SKIP "$PYTHON_WHY" 0
elif ! have_cmd forward --backend; then
    record golden SKIP "eaglegen forward has no --backend" 0
else
    for case in a:tiny-a q4:tiny-q4 fp8:tiny-fp8 a-long:tiny-a; do
        g=${case%%:*}
        model=${case#*:}
        gold=$FIXTURES/models/golden-$g-bf16kv.safetensors
        if [ ! -f "$gold" ] || [ ! -d "$FIXTURES/models/$model" ]; then
            record "golden-$g" SKIP "missing $gold or $model" 0
            continue
        fi
        # prompt list 30 s + forward 45 s + comparer 30 s (tiny models: seconds each on a GPU)
        if late 105; then record "golden-$g" SKIP "time budget: $(elapsed)s elapsed + 105s > ${BUDGET}s" 0; continue; fi
        timeout -k 5 30 "$PYTHON" tests/gpu/golden_gpu.py prompts "$gold" "$TMP/$g-full.json"
        s=$(date +%s)
        {
            timeout -k 10 45 "$E" forward --backend cuda --model "$FIXTURES/models/$model" --prompts "$TMP/$g-full.json" \
                --out "$TMP/$g.safetensors" --chunk 37 &&
                timeout -k 10 30 "$PYTHON" tests/gpu/golden_gpu.py teacher "$TMP/$g.safetensors" "$gold" --tol 2e-2 \
                    --margin 0.1
        } > "$LOGS/golden-$g.log" 2>&1
        rc=$?
        sed 's/^/   | /' "$LOGS/golden-$g.log" | tail -n 30
        sum=$(grep SUMMARY "$LOGS/golden-$g.log" | sed 's/.*SUMMARY //')
        if [ $rc -eq 0 ]; then record "golden-$g teacher" PASS "$sum" $(($(date +%s) - s))
        else record "golden-$g teacher" FAIL "rc $rc; $sum" $(($(date +%s) - s)); fi
        if [ -f "$FIXTURES/models/prompts-$g.json" ] && late 75; then
            record "golden-$g greedy" SKIP "time budget: $(elapsed)s elapsed + 75s > ${BUDGET}s" 0
        elif [ -f "$FIXTURES/models/prompts-$g.json" ]; then
            s=$(date +%s)
            {
                timeout -k 10 45 "$E" forward --backend cuda --model "$FIXTURES/models/$model" \
                    --prompts "$FIXTURES/models/prompts-$g.json" --out "$TMP/$g-gen.safetensors" --generate 16 &&
                    timeout -k 10 30 "$PYTHON" tests/gpu/golden_gpu.py greedy "$TMP/$g-gen.safetensors" "$gold" --margin 0.1
            } > "$LOGS/golden-$g-greedy.log" 2>&1
            rc=$?
            sed 's/^/   | /' "$LOGS/golden-$g-greedy.log" | tail -n 10
            sum=$(grep SUMMARY "$LOGS/golden-$g-greedy.log" | sed 's/.*SUMMARY //')
            if [ $rc -eq 0 ]; then record "golden-$g greedy" PASS "$sum" $(($(date +%s) - s))
            else record "golden-$g greedy" FAIL "rc $rc; $sum" $(($(date +%s) - s)); fi
        fi
    done
    # the CPU backend on the same case, for scale (same comparer, same bounds)
    if ! late 180 && [ -f "$FIXTURES/models/golden-a-bf16kv.safetensors" ]; then
        s=$(date +%s)
        { timeout -k 10 120 "$E" forward --backend cpu --model "$FIXTURES/models/tiny-a" --prompts "$TMP/a-full.json" \
              --out "$TMP/a-cpu.safetensors" --chunk 37 &&
              timeout -k 10 60 "$PYTHON" tests/gpu/golden_gpu.py teacher "$TMP/a-cpu.safetensors" \
                  "$FIXTURES/models/golden-a-bf16kv.safetensors" --tol 2e-2 --margin 0.1; } > "$LOGS/golden-a-cpu.log" 2>&1
        rc=$?
        sum=$(grep SUMMARY "$LOGS/golden-a-cpu.log" | sed 's/.*SUMMARY //')
        record "golden-a (cpu, for scale)" "$([ $rc -eq 0 ] && echo PASS || echo FAIL)" "$sum" $(($(date +%s) - s))
    fi
fi

# 4. generate end to end on a mkmodel model -----------------------------------------------
if [ $NO_GPU = 1 ]; then
    :
elif ! have_cmd mkmodel --preset; then
    record e2e SKIP "eaglegen mkmodel not available" 0
elif ! have_cmd generate --backend; then
    record e2e SKIP "eaglegen generate has no --backend" 0
else
    CORPUS=$ROOT/prompts/samples/sample.jsonl
    if [ ! -f "$CORPUS" ]; then
        CORPUS=$TMP/corpus.jsonl
        for i in 1 2 3 4 5 6 7 8; do
            echo "{\"id\": \"gpu-$i\", \"messages\": [{\"role\": \"user\", \"content\": \"Count to $i and explain.\"}]}"
        done > "$CORPUS"
    fi
    gen_ok=0
    SUMMARY="" run mkmodel-tiny 60 mkmodel.log "$E" mkmodel --preset tiny --out "$TMP/tiny" --seed 1 &&
        SUMMARY="" run generate-cuda 180 generate.log "$E" generate --backend cuda --model "$TMP/tiny" \
            --prompts "$CORPUS" --out "$TMP/ds" --max-new-tokens 64 --max-seq-len 1024 --shard-samples 16 \
            --batch 8 --temperature 0.8 --top-p 0.95 --seed 7 --on-bad-record skip && gen_ok=1
    if [ $gen_ok = 1 ]; then
        # what the GPU holds after load against the memory plan's budget (the driver's and
        # libraries' memory may take the headroom; past it the plan misses allocations)
        al=$(grep -m1 "after load:" "$LOGS/generate.log" | sed 's/^ *//')
        if [ -z "$al" ]; then record memory-after-load SKIP "no 'after load' line in generate.log" 0
        elif echo "$al" | grep -q "allocations the plan does not count"; then record memory-after-load FAIL "$al" 0
        else record memory-after-load PASS "$al" 0; fi
        # recorded replay (CUDA graphs) runs the same kernels with the same arguments
        SUMMARY="" EG_CUDA_GRAPHS=0 run generate-no-graphs 180 generate-nograph.log "$E" generate --backend cuda \
            --model "$TMP/tiny" --prompts "$CORPUS" --out "$TMP/ds-nograph" --max-new-tokens 64 --max-seq-len 1024 \
            --shard-samples 16 --batch 8 --temperature 0.8 --top-p 0.95 --seed 7 --on-bad-record skip &&
            SUMMARY="$(grep 'graphs:' "$LOGS/generate.log" | sed 's/.*graphs: //')" run graphs-same 60 graphs-same.log \
                "$PYTHON" tests/gen_check.py same "$TMP/ds" "$TMP/ds-nograph"
        if "$E" inspect --help 2>&1 | grep -q -- --verify; then
            SUMMARY="" run inspect-verify 60 inspect.log "$E" inspect "$TMP/ds" --verify
        else
            record inspect-verify SKIP "eaglegen inspect --verify not available" 0
        fi
    fi
fi

# 4b. pipeline stages on one GPU (issue 8): forward split into 2 and 4 stages must write the
# same bytes as unsplit (same steps, same GEMM shapes); generate with 2 stages on threads,
# both on GPU 0, must produce a dataset that verifies.
if [ $NO_GPU = 1 ]; then
    :
elif ! have_cmd forward --stages; then
    record pipeline SKIP "eaglegen forward has no --stages" 0
else
    P=$FIXTURES/models/prompts-a.json M=$FIXTURES/models/tiny-a
    SUMMARY="" run pipeline-forward 120 pipeline.log bash -c "
        '$E' forward --backend cuda --model '$M' --prompts '$P' --out '$TMP/p1.st' &&
        '$E' forward --backend cuda --model '$M' --prompts '$P' --out '$TMP/p2.st' --stages 2,5 &&
        '$E' forward --backend cuda --model '$M' --prompts '$P' --out '$TMP/p4.st' --stages 1,2,4,5 &&
        '$E' forward --backend cuda --model '$M' --prompts '$P' --out '$TMP/pc.st' --stages 2:3,4:13,5 &&
        cmp '$TMP/p1.st' '$TMP/p2.st' && cmp '$TMP/p1.st' '$TMP/p4.st' && cmp '$TMP/p1.st' '$TMP/pc.st' &&
        echo 'split outputs identical (layers 1 and 3 split between stages too)'"
    if [ -d "$TMP/tiny" ] && [ -f "${CORPUS:-}" ]; then
        SUMMARY="" run pipeline-generate 180 pipeline-gen.log bash -c "
            '$E' generate --backend cuda --model '$TMP/tiny' --prompts '$CORPUS' --out '$TMP/ds2' \
                --max-new-tokens 64 --max-seq-len 1024 --batch 8 --stages 2 --gpus 1 --micro-batches 4 \
                --on-bad-record skip --transport local &&
            '$E' inspect '$TMP/ds2' --verify"
        # (cuBLAS may pick other kernels for other row counts, so a micro-batched run is not
        # expected to be bit-identical to an unsplit one on the GPU; the forward split above
        # runs the same steps and is)
    fi
fi

# 4d. expert parallelism (issue 17): generate --ep 2 with both ranks on this GPU (the
# cuda-local exchange: device copies between host barriers) and, where there are two GPUs,
# on GPUs 0 and 1 (nccl) must write the samples of the unsplit run at --batch 1: each rank
# holds one sequence, so every GEMM sees the unsplit run's row counts, and a pair's MoE bits
# do not depend on the other rows of its call (the tiny model never splits K). The same
# with --ep-split ffn (each layer's shared expert / dense MLP on one rank, the owner's
# swiglu_mlp per source rank: again the unsplit row counts), and with --ep-split all (also
# the embedding and lm_head by vocab rows: the lm_head GEMM has V/2 rows, so equality also
# says cuBLAS reduced both shapes alike; a difference here is that, not a lost row).
if [ $NO_GPU = 1 ]; then
    :
elif ! have_cmd generate --ep; then
    record ep SKIP "eaglegen generate has no --ep" 0
elif [ ! -d "$TMP/tiny" ] || [ ! -f "${CORPUS:-}" ]; then
    record ep SKIP "no tiny model / corpus (step 4 failed)" 0
elif late 240; then
    record ep SKIP "time budget" 0
else
    EPA=(generate --backend cuda --model "$TMP/tiny" --prompts "$CORPUS" --max-new-tokens 32 --max-seq-len 512
         --temperature 0.8 --seed 11 --on-bad-record skip)
    EP_DEV=${CUDA_VISIBLE_DEVICES:-0}; EP_DEV=${EP_DEV%%,*} # both ranks on the first visible GPU
    SUMMARY="" run ep-one-gpu 200 ep.log bash -c "
        '$E' ${EPA[*]} --batch 1 --out '$TMP/ep-ref' &&
        CUDA_VISIBLE_DEVICES=$EP_DEV '$E' ${EPA[*]} --batch 2 --ep 2 --out '$TMP/ep2' 2> '$TMP/ep2.log' && cat '$TMP/ep2.log' &&
        grep -q 'exchange cuda-local' '$TMP/ep2.log' && grep 'expert exchange:' '$TMP/ep2.log' &&
        '$PYTHON' tests/gen_check.py same '$TMP/ep-ref' '$TMP/ep2' && '$E' inspect '$TMP/ep2' --verify &&
        CUDA_VISIBLE_DEVICES=$EP_DEV '$E' ${EPA[*]} --batch 2 --ep 2 --ep-split ffn --out '$TMP/ep2f' 2> '$TMP/ep2f.log' &&
        cat '$TMP/ep2f.log' && grep 'token rows to another rank' '$TMP/ep2f.log' &&
        '$PYTHON' tests/gen_check.py same '$TMP/ep-ref' '$TMP/ep2f' &&
        CUDA_VISIBLE_DEVICES=$EP_DEV '$E' ${EPA[*]} --batch 2 --ep 2 --ep-split all --out '$TMP/ep2a' 2> '$TMP/ep2a.log' &&
        cat '$TMP/ep2a.log' && grep 'tokens embedded by another rank' '$TMP/ep2a.log' &&
        '$PYTHON' tests/gen_check.py same '$TMP/ep-ref' '$TMP/ep2a' &&
        CUDA_VISIBLE_DEVICES=$EP_DEV '$E' ${EPA[*]} --batch 2 --ep 2 --stages 3:5,5 --gpus 1 --out '$TMP/ep2c' \
            2> '$TMP/ep2c.log' && cat '$TMP/ep2c.log' && grep 'layer 2 split between stages 0 and 1' '$TMP/ep2c.log' &&
        '$PYTHON' tests/gen_check.py same '$TMP/ep-ref' '$TMP/ep2c'"
    if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] && ! late 120; then
        SUMMARY="" run ep-nccl 120 ep-nccl.log bash -c "
            '$E' ${EPA[*]} --batch 2 --ep 2 --out '$TMP/ep2n' 2> '$TMP/ep2n.log' && cat '$TMP/ep2n.log' &&
            grep -q 'exchange nccl' '$TMP/ep2n.log' && '$PYTHON' tests/gen_check.py same '$TMP/ep-ref' '$TMP/ep2n'"
    fi
fi

# 4e. the EAGLE-3 drafter on the GPU (issue 21): its ops (gqa_attention, copy_rows) and
# the drafter through the CUDA backend vs its own CPU code on a random drafter for tiny-a
# (test_cuda_ops gqa_attention copy_rows drafter); then generate --backend cuda
# --draft-model (the drafter on the target's GPU) greedy, which must report its verify
# steps and verify; whether its samples equal greedy without the drafter is printed, not
# required (cuBLAS may pick other kernels for the k + 1 verify rows than for 1 decode row);
# then sampled (temperature 1, top-p 0.95) with the device's p(draft) (token_probs, only the
# rows the rule needs taken to the host) and with EG_CUDA_SAMPLE=sort (every p on the host):
# the two write the same samples unless a test lands within 2 V eps of a boundary (printed).
if [ $NO_GPU = 1 ]; then
    :
elif [ -z "$FIXTURES" ]; then
    record drafter-ops SKIP "fixtures not found (set FIXTURES)" 0
else
    SUMMARY="" run drafter-ops 90 drafter-ops.log bash -c "
        '$OPS' gqa_attention && '$OPS' copy_rows && FIXTURES='$FIXTURES' '$OPS' drafter"
    n=${#STATUS[@]}
    NOTES[$((n - 1))]="${NOTES[$((n - 1))]} $(grep 'drafter via cuda vs' "$LOGS/drafter-ops.log" | tail -n 1)"
fi
if [ $NO_GPU = 1 ]; then
    :
elif ! have_cmd generate --draft-model; then
    record spec-cuda SKIP "eaglegen generate has no --draft-model" 0
elif [ ! -d "$TMP/tiny" ] || [ ! -f "${CORPUS:-}" ]; then
    record spec-cuda SKIP "no tiny model / corpus (step 4 failed)" 0
else
    SPA=(generate --backend cuda --model "$TMP/tiny" --prompts "$CORPUS" --max-new-tokens 32 --max-seq-len 512
         --batch 8 --temperature 0 --seed 11 --on-bad-record skip)
    SUMMARY="" run spec-cuda 180 spec-cuda.log bash -c "
        '$E' mkmodel --drafter-for '$TMP/tiny' --out '$TMP/drafter' --seed 5 &&
        '$E' ${SPA[*]} --out '$TMP/spec0' &&
        '$E' ${SPA[*]} --out '$TMP/spec3' --draft-model '$TMP/drafter' --draft-tokens 3 2> '$TMP/spec3.log' &&
        cat '$TMP/spec3.log' && grep 'speculative:' '$TMP/spec3.log' && '$E' inspect '$TMP/spec3' --verify &&
        { '$PYTHON' tests/gen_check.py same '$TMP/spec0' '$TMP/spec3' && echo 'greedy with drafter == without' ||
          echo 'greedy with drafter differs from without (see above; not a failure on the GPU)'; } &&
        '$E' mkmodel --drafter-for '$TMP/tiny' --out '$TMP/drafter_mla' --seed 5 --mla &&
        '$E' ${SPA[*]} --out '$TMP/spec3m' --draft-model '$TMP/drafter_mla' --draft-tokens 3 2> '$TMP/spec3m.log' &&
        grep 'speculative:' '$TMP/spec3m.log' && '$E' inspect '$TMP/spec3m' --verify &&
        { '$PYTHON' tests/gen_check.py same '$TMP/spec0' '$TMP/spec3m' && echo 'greedy with the MLA drafter == without' ||
          echo 'greedy with the MLA drafter differs from without (see above; not a failure on the GPU)'; } &&
        '$E' ${SPA[*]} --temperature 1 --top-p 0.95 --out '$TMP/spec3s' --draft-model '$TMP/drafter' --draft-tokens 3 \
            --log-json '$TMP/spec3s.jsonl' 2> '$TMP/spec3s.log' && grep 'speculative:' '$TMP/spec3s.log' &&
        '$E' inspect '$TMP/spec3s' --verify &&
        EG_CUDA_SAMPLE=sort '$E' ${SPA[*]} --temperature 1 --top-p 0.95 --out '$TMP/spec3h' --draft-model '$TMP/drafter' \
            --draft-tokens 3 --log-json '$TMP/spec3h.jsonl' 2> '$TMP/spec3h.log' &&
        echo 'sampled, the device p (token_probs) then the host p (EG_CUDA_SAMPLE=sort):' &&
        grep -o '\"logit_rows\":[0-9]*,\"backend_probs\":[0-9]*,\"backend_draws\":[0-9]*,\"backend_residuals\":[0-9]*,\"draft_kept\":[0-9]*,\"draft_argmax\":[0-9]*,\"draft_host_rows\":[0-9]*' \
            '$TMP/spec3s.jsonl' '$TMP/spec3h.jsonl' &&
        { '$PYTHON' tests/gen_check.py same '$TMP/spec3s' '$TMP/spec3h' && echo 'sampled: device p == host p' ||
          echo 'sampled: device p differs from host p (p agree to 2 V eps; see above)'; }"
fi

# 4c. issue 6's step 4: an independent reference at real widths, transformers'
# DeepseekV3 on a moonlight-16b checkpoint (tests/ref/run.sh; needs torch+transformers,
# which this machine cannot download: run where they are installed)
if [ $NO_GPU = 1 ]; then
    :
elif [ ! -f tests/ref/run.sh ]; then
    record hf-reference SKIP "tests/ref/run.sh missing" 0
elif ! timeout 60 "$PYTHON" -c "import torch, transformers" > /dev/null 2>&1; then
    record hf-reference SKIP "no torch/transformers here (tests/ref/run.sh on the CPU covers the CPU backend)" 0
elif late; then
    record hf-reference SKIP "time budget" 0
else
    SUMMARY="" REF_SKIP_INSTALL=1 run hf-reference 240 hf-reference.log bash tests/ref/run.sh --backend cuda
fi

# 5. bench (issue 7): weights drawn on the GPU by the backend (no disk, no upload), the
# roofline columns against the measured copy bandwidth and BF16 GEMM rate ------------------
if [ $NO_GPU = 1 ]; then
    :
elif ! have_cmd bench --context; then
    record bench SKIP "eaglegen bench has no --context" 0
else
    SUMMARY="" run bench-tiny 60 bench-tiny.log "$E" bench --backend cuda --preset tiny --batch 1,16,64 \
        --context 128 --prefill-tokens 4096 --prompt-len 512
    # (a) Kimi-K2.5's real layer shapes: 4 layers (layer 0 dense), INT4 experts, ~41 GB on the GPU
    if late; then record bench-kimi-4l SKIP "time budget" 0
    else
        SUMMARY="" run bench-kimi-4l 200 bench-kimi.log "$E" bench --backend cuda --preset kimi-k2.5 --layers 4 \
            --experts int4 --batch 1,16,64,256 --context 2048,8192 --prefill-tokens 8192 --prompt-len 2048 \
            --chunk 2048 --decode-steps 8
    fi
    # the drafter's attention kernel alone (kernels/attn.cu): the draft-attn rows' GB/s and
    # %copy are its cache reads against the measured copy bandwidth, at the public Kimi
    # drafters' shape (64 heads over 64 kv heads of 128: 32 KB a token; 34 GB of cache at
    # batch 256) and a GQA drafter's (8 kv heads: each tile read once for 8 heads)
    if have_cmd bench --draft-attention; then
        SUMMARY="" run bench-draft-attn 90 bench-draft-attn.log bash -c "
            '$E' bench --backend cuda --preset tiny --batch 16,256 --context 4096 --prefill-tokens 0 \
                --decode-steps 10 --draft-attention 64:64:128 &&
            '$E' bench --backend cuda --preset tiny --batch 16,256 --context 4096 --prefill-tokens 0 \
                --decode-steps 10 --no-roofline --draft-attention 64:8:128"
    else
        record bench-draft-attn SKIP "eaglegen bench has no --draft-attention" 0
    fi
    # where the time goes: device time per op (EG_CUDA_PROFILE=1, op by op), decode at batch
    # 1 and 256 (8K context) and prefill in 2K chunks; the table is in the summary
    if late; then record bench-kimi-4l-profile SKIP "time budget" 0
    else
        SUMMARY="" EG_CUDA_PROFILE=1 run bench-kimi-4l-profile 150 bench-kimi-profile.log "$E" bench --backend cuda \
            --preset kimi-k2.5 --layers 4 --experts int4 --batch 1,256 --context 8192 --prefill-tokens 4096 \
            --prompt-len 2048 --chunk 2048 --decode-steps 4 --no-roofline
    fi
    # the same without issue 7's switchable levers (SIMT MoE tiles, two GEMMs for hi + lo,
    # no graphs): the "before" column of the closing note's table
    if late; then record bench-kimi-4l-before SKIP "time budget" 0
    else
        SUMMARY="" EG_CUDA_MOE=simt EG_CUDA_MLA=simt EG_CUDA_FUSE=0 EG_CUDA_GRAPHS=0 run bench-kimi-4l-before 150 bench-kimi-before.log \
            "$E" bench --backend cuda --preset kimi-k2.5 --layers 4 --experts int4 --batch 1,64,256 \
            --context 2048 --prefill-tokens 4096 --prompt-len 2048 --chunk 2048 --decode-steps 6
    fi
    # (b) moonlight-16b with BF16 experts, 4 layers (after Kimi and its "before" run: the
    # time budget skips from the end)
    if late; then record bench-moonlight SKIP "time budget" 0
    else
        SUMMARY="" run bench-moonlight 150 bench-moon.log "$E" bench --backend cuda --preset moonlight-16b \
            --layers 4 --experts bf16 --batch 1,16,64,256 --context 2048,8192 --prefill-tokens 8192 \
            --prompt-len 2048 --chunk 2048 --decode-steps 8
    fi
    # recorded replay alone off (CUDA graphs: launch overhead, the batch-1 lever)
    if late; then record bench-kimi-4l-nographs SKIP "time budget" 0
    else
        SUMMARY="" EG_CUDA_GRAPHS=0 run bench-kimi-4l-nographs 100 bench-kimi-nographs.log "$E" bench --backend cuda \
            --preset kimi-k2.5 --layers 4 --experts int4 --batch 1,16,64 --context 2048 --prefill-tokens 0 \
            --decode-steps 8
    fi
    # INT4 experts through the one-step register prefetch instead of the cp.async pipeline
    # (the large-batch lever)
    if late; then record bench-kimi-4l-moe-reg SKIP "time budget" 0
    else
        SUMMARY="" EG_CUDA_MOE=reg run bench-kimi-4l-moe-reg 100 bench-kimi-moe-reg.log "$E" bench --backend cuda \
            --preset kimi-k2.5 --layers 4 --experts int4 --batch 64,256 --context 2048 --prefill-tokens 0 \
            --decode-steps 8 --no-roofline
    fi
    # MLA decode at 8K context, where attention is a quarter of the bytes: the tensor-core
    # kernel with 16-row tiles (what sm_120 runs; the H200 takes 32) and the CUDA-core one
    for how in tc16 simt; do
        if late; then record "bench-kimi-4l-mla-$how" SKIP "time budget" 0; continue; fi
        SUMMARY="" EG_CUDA_MLA=$how run "bench-kimi-4l-mla-$how" 90 "bench-kimi-mla-$how.log" "$E" bench --backend cuda \
            --preset kimi-k2.5 --layers 4 --experts int4 --batch 64,256 --context 8192 --prefill-tokens 0 \
            --decode-steps 6 --no-roofline
    done
    # sampled decode (generate's defaults: temperature 1, top-p 0.95): the top-M sampler,
    # then the full vocabulary sort (the last line of each log counts the rows sorted)
    for how in topm sort; do
        if late; then record "bench-kimi-4l-sample-$how" SKIP "time budget" 0; continue; fi
        SUMMARY="" EG_CUDA_SAMPLE=$([ $how = sort ] && echo sort || echo auto) run "bench-kimi-4l-sample-$how" 90 \
            "bench-kimi-sample-$how.log" "$E" bench --backend cuda --preset kimi-k2.5 --layers 4 --experts int4 \
            --batch 64,256 --context 2048 --prefill-tokens 0 --decode-steps 6 --temperature 1 --top-p 0.95 --no-roofline
    done
fi

# table (its rows are in the summary already, one per finished step) ------------------------------
{
    echo
    echo "($(elapsed)s total)"
    [ -f "$LOGS/ops-summary.log" ] && { echo; echo "op errors (CUDA vs CPU):"; cat "$LOGS/ops-summary.log"; }
    for f in "$LOGS"/bench-*.log; do
        [ -f "$f" ] || continue
        echo
        echo "$(basename "$f"):"
        if grep -q "^cuda profile" "$f"; then sed -n '/^cuda profile/,$p' "$f"; else tail -n 20 "$f"; fi
    done
} >> "$SUMMARY_FILE"
echo
cat "$SUMMARY_FILE"
exit $FAILED
