#!/usr/bin/env bash
# CPU emulation of the CUDA backend (no GPU needed): kernels/*.cu rewritten to host
# C++ (tests/gpu/emu/rewrite.py) where each CUDA thread of a block is an OS thread
# (tests/gpu/emu/include/cuda_runtime.h); the CUDA runtime (asynchronous streams, a
# worker thread each), cuBLAS, CUB and NCCL replaced by host code (emu_runtime.cpp,
# include/cub/cub.cuh, emu_nccl.cpp); engine/backend_cuda.c compiled
# unchanged against them; tests/gpu/test_cuda_ops.c run on the cases small enough to
# emulate. It checks index arithmetic, layouts, the cuBLAS parameterisation (against
# BLAS's column-major definition) and the backend's logic; not timing, not concurrency
# between blocks, not device math libraries. Slow (minutes: thread creation).
# usage: tests/gpu/emu/run_emu.sh [test-name filters...]
#        tests/gpu/emu/run_emu.sh --forward   (tiny-a forward vs golden-a-bf16kv)
#        tests/gpu/emu/run_emu.sh --pipeline  (3 stages on 3 emulated GPUs over emulated NCCL; layers split too;
#                                              a link failing mid-run stops it with the error named)
#        tests/gpu/emu/run_emu.sh --ep        (--ep 4 on 4 emulated GPUs and --ep 2 --stages 2 on 2,
#                                              expert rows over emulated NCCL; --ep 2 on one GPU,
#                                              cuda-local; --ep 2 --ep-split ffn and all on both
#                                              exchanges, --ep 4 --ep-split all; each == one GPU;
#                                              --ep 2 --stages 2 as stage groups on 4 GPUs, and
#                                              --stages 2:5,3 (a layer split) +ffn there
#                                              (EMU_EP_ONLY_GROUPS=1: those and the reference only);
#                                              first, NCCL's asynchronous error (EMU_NCCL_ASYNC_ERROR)
#                                              must stop --ep 2 with the error named, and
#                                              EG_EP_EXCHANGE=cuda-local on 2 GPUs == one; ~12-15 min)
#        tests/gpu/emu/run_emu.sh ep_vocab    (the vocab split's op test: nccl and cuda-local, ~2 min)
#        tests/gpu/emu/run_emu.sh ep_group    (the group's op test: nccl and cuda-local, whole and split layers, ~10-20 min)
#        tests/gpu/emu/run_emu.sh --spec      (generate --draft-model with target and drafter on the
#                                              emulated GPU (an MHA and an MLA drafter), and with --ep 2
#                                              on 2 emulated GPUs over emulated NCCL: greedy == greedy
#                                              without the drafter)
#        tests/gpu/emu/run_emu.sh --spec-stages (sampled with the drafter in 2 threaded stages on 2
#                                              emulated GPUs: the decisions on the last stage's
#                                              thread take only the rows the rule needs; samples
#                                              == the run with every row on the host)
#        tests/gpu/emu/run_emu.sh --link      (build and link the emulated eaglegen, build-emu/emu/eaglegen_emu, and stop)
#        tests/gpu/emu/run_emu.sh --memory    (generate on 1, 2 and 4 emulated GPUs, a drafter, --batch auto, --ep,
#                                              stages: what each planned GPU holds after load is within its
#                                              memory plan's budget; ~5 min)
#        tests/gpu/emu/run_emu.sh --graphs    (generate with recorded steps == without, bit for bit, a split layer too;
#                                              and with EG_CUDA_PROFILE=1: a table, the same samples)
set -eu
cd "$(dirname "$0")/../../.."
B=${BUILD_EMU:-build-emu}
mkdir -p "$B/emu"
make -s BUILD="$B" NO_CUDA=1 "$B/libeg_engine.a" "$B/libeg_common.a"
INC="-Itests/gpu/emu/include -I."
for f in elementwise gemm mla router sample ep attn; do
    python3 tests/gpu/emu/rewrite.py kernels/$f.cu "$B/emu/$f.cpp"
    g++ -std=c++20 -O1 -g -w $INC -include cuda_runtime.h -c "$B/emu/$f.cpp" -o "$B/emu/$f.o"
done
g++ -std=c++20 -O1 -g -w $INC -c tests/gpu/emu/emu_runtime.cpp -o "$B/emu/emu_runtime.o"
g++ -std=c++20 -O1 -g -Wall -Wextra $INC -c tests/gpu/emu/emu_nccl.cpp -o "$B/emu/emu_nccl.o"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -DEG_HAVE_CUDA=1 -DEG_HAVE_NCCL=1 $INC \
    -c engine/transport_nccl.c -o "$B/emu/transport_nccl.o"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -DEG_HAVE_CUDA=1 -DEG_HAVE_NCCL=1 $INC \
    -c engine/collective_cuda.c -o "$B/emu/collective_cuda.o"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -DEG_HAVE_CUDA=1 $INC -c engine/backend_cuda.c \
    -o "$B/emu/backend_cuda.o"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread $INC -c tests/gpu/test_cuda_ops.c -o "$B/emu/test.o"
g++ -o "$B/emu/test_cuda_ops_emu" "$B/emu/test.o" "$B/emu/backend_cuda.o" "$B/emu/transport_nccl.o" "$B/emu/collective_cuda.o" \
    "$B/emu"/elementwise.o "$B/emu"/gemm.o "$B/emu"/mla.o "$B/emu"/router.o "$B/emu"/sample.o "$B/emu"/ep.o "$B/emu"/attn.o \
    "$B/emu/emu_runtime.o" "$B/emu/emu_nccl.o" "$B/libeg_engine.a" "$B/libeg_common.a" \
    -ljansson -lzstd -larchive -lpcre2-8 -lm -pthread
link_eaglegen() {
    make -s BUILD="$B" NO_CUDA=1 "$B/libeg_gen.a" "$B/libeg_dataset.a" "$B/libeg_prompts.a" "$B/gen/main.o"
    g++ -o "$B/emu/eaglegen_emu" "$B/gen/main.o" "$B/emu/backend_cuda.o" "$B/emu/transport_nccl.o" "$B/emu/collective_cuda.o" \
        "$B/emu"/elementwise.o "$B/emu"/gemm.o "$B/emu"/mla.o "$B/emu"/router.o "$B/emu"/sample.o "$B/emu"/ep.o "$B/emu"/attn.o \
        "$B/emu/emu_runtime.o" "$B/emu/emu_nccl.o" "$B/libeg_gen.a" "$B/libeg_engine.a" "$B/libeg_dataset.a" \
        "$B/libeg_prompts.a" "$B/libeg_common.a" -ljansson -lzstd -larchive -lpcre2-8 -lm -pthread
}
if [ "${1:-}" = --link ]; then # the emulated eaglegen only (make sweep EMU_SWEEP=1 runs it)
    link_eaglegen
    echo "$B/emu/eaglegen_emu"
    exit 0
fi
if [ "${1:-}" = --memory ]; then
    # the memory plan against what the run allocates: the emulated cudaMemGetInfo counts the
    # process's cudaMalloc'd bytes, and every planned GPU must stay within its plan's budget
    # after load (no driver or library memory here to take the headroom), but for what the
    # plan leaves out: each weight's allocation rounded up to 256 bytes (its scales start
    # 256-aligned after its data), at most 255 bytes a tensor, none at Kimi-K2.5's shapes,
    # and the KV block tables, 4 bytes a slot and block (16 KB here at most)
    link_eaglegen
    W=$B/emu/mem
    rm -rf "$W" && mkdir -p "$W"
    "$B/emu/eaglegen_emu" mkmodel --preset tiny --out "$W/model" --layers 3 >/dev/null
    "$B/emu/eaglegen_emu" mkmodel --drafter-for "$W/model" --out "$W/drafter" >/dev/null
    for i in 1 2; do echo "{\"prompt\": \"Tell me about $i.\"}"; done > "$W/c.jsonl"
    export EMU_MEM_GB=2
    pad=$(/usr/bin/python3 -c "
import json, struct, sys
n = 0
for f in sys.argv[1:]:
    b = open(f, 'rb'); h = json.loads(b.read(struct.unpack('<Q', b.read(8))[0])); n += len(h) - ('__metadata__' in h)
print(255 * n + 16384)" "$W"/model/*.safetensors "$W"/drafter/*.safetensors)
    rc=0 k=0
    for v in "1:" "1:--draft-model $W/drafter" "1:--batch auto" "2:--ep 2" "2:--ep 2 --ep-split all" \
        "2:--stages 2 --transport nccl" "4:--ep 2 --stages 2"; do
        dev=${v%%:*} extra=${v#*:} k=$((k + 1))
        EMU_DEVICES=$dev nice -n 19 "$B/emu/eaglegen_emu" generate --backend cuda --model "$W/model" --prompts "$W/c.jsonl" \
            --max-new-tokens 1 --max-seq-len 64 --chunk 16 --batch 2 --gpu-mem-fraction 0.4 $extra --out "$W/o$k" \
            2> "$W/o$k.log" || { echo "FAIL: $extra on $dev: $(tail -n 3 "$W/o$k.log")"; rc=1; continue; }
        n=$(grep -c "after load:" "$W/o$k.log" || true)
        bad=0
        while read -r line; do
            case $line in
                *"within its plan's budget"*) ;;
                *" bytes over its plan's budget"*)
                    b=$(echo "$line" | sed -n 's/.*, \([0-9]*\) bytes over its plan.*/\1/p')
                    [ -n "$b" ] && [ "$b" -le "$pad" ] || bad=$((bad + 1)) ;;
                *) bad=$((bad + 1)) ;;
            esac
        done < <(grep "after load:" "$W/o$k.log" | sed 's/^ *//')
        echo "$dev GPU(s) $extra: $n planned GPU(s), $bad over budget beyond $pad bytes: $(grep 'after load:' "$W/o$k.log" | sed 's/^ *//' | tr '\n' ';')"
        [ "$n" -ge 1 ] && [ "$bad" -eq 0 ] || rc=1
    done
    [ $rc = 0 ] && echo "ok: every planned GPU within its budget after load (up to the weights' alignment and the block tables, $pad bytes)"
    exit $rc
fi
# The speculative runs' fixture in W (set to $1): the emulator linked, a 3-layer tiny model,
# a random drafter for it, 3 prompts.
spec_fixture() {
    link_eaglegen
    W=$1
    rm -rf "$W" && mkdir -p "$W"
    "$B/emu/eaglegen_emu" mkmodel --preset tiny --out "$W/model" --layers 3 --seed 3 >/dev/null
    "$B/emu/eaglegen_emu" mkmodel --drafter-for "$W/model" --out "$W/drafter" --seed 5 >/dev/null
    for i in 1 2 3; do printf '{"id": "s%d", "input_ids": [%d, 72, 101, 108, %d]}\n' $i $((i * 5)) $((i + 30)); done > "$W/corpus.jsonl"
}
if [ "${1:-}" = --pipeline ]; then
    # issue 8's NCCL path without GPUs: a tiny model generated in 3 stages on 3 emulated
    # GPUs, rows handed over by the emulated NCCL (stage threads, micro-batches in flight,
    # no host sync in the first stages), must equal the same run with the local transport
    # and the unsplit emulated run, sample for sample (~5 min). The emulated NCCL blocks
    # where NCCL does (emu_nccl.cpp): a pair's first send/recv waits for the peer's, and
    # with a 1 KiB pair buffer the prefill hand-overs (7 tokens x 64 floats) wait on
    # their stream for the recv while decode ones (1 token) are buffered; a hang aborts
    # with a message after EMU_NCCL_TIMEOUT (60 s).
    link_eaglegen
    W=$B/emu/pp
    rm -rf "$W" && mkdir -p "$W"
    "$B/emu/eaglegen_emu" mkmodel --preset tiny --out "$W/model" --layers 4 >/dev/null
    for i in 1 2 3 4 5; do printf '{"id": "p%d", "input_ids": [%d, 72, 101, 108, 108, 111, %d]}\n' $i $((i * 7)) $((i + 40)); done > "$W/corpus.jsonl"
    common=(generate --backend cuda --model "$W/model" --prompts "$W/corpus.jsonl" --max-new-tokens 4
            --max-seq-len 64 --batch 4 --chunk 16 --aux-layers 0,1,2 --seed 3 --gpu-mem-fraction 0.4)
    export EMU_MEM_GB=2
    EMU_DEVICES=1 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/one" 2> "$W/one.log" || { cat "$W/one.log"; exit 1; }
    EMU_DEVICES=3 EMU_NCCL_BUFFER=${EMU_NCCL_BUFFER:-1024} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
        --out "$W/nccl" --stages 1,2,4 --micro-batches 4 --transport nccl 2> "$W/nccl.log" ||
        { cat "$W/nccl.log"; exit 1; }
    grep -q "transport between stages: nccl" "$W/nccl.log" || { cat "$W/nccl.log"; exit 1; }
    # a link that fails after its hand-overs were enqueued (EMU_NCCL_DEAD_AFTER: from the
    # 8th message on nothing moves and ncclCommGetAsyncError reports it): the stages' host
    # waits poll it, so the run stops naming the error instead of waiting forever (the
    # emulator would call that a hang after EMU_NCCL_TIMEOUT)
    if EMU_DEVICES=3 EMU_NCCL_BUFFER=1024 EMU_NCCL_DEAD_AFTER=8 EMU_NCCL_TIMEOUT=120 timeout 300 nice -n 19 \
        "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/deadlink" --stages 1,2,4 --micro-batches 4 --transport nccl \
        2> "$W/deadlink.log"; then
        echo "FAIL: the pipeline ignored a failed link"; exit 1
    fi
    grep -q "ncclCommGetAsyncError (waiting for a hand-over)" "$W/deadlink.log" && ! grep -q "this is a hang" "$W/deadlink.log" ||
        { cat "$W/deadlink.log"; echo "FAIL: a failed link between stages is not reported"; exit 1; }
    echo "a failed link between stages stops the pipeline, named: $(grep -m1 -o 'stage [0-9]*: ncclCommGetAsyncError[^;]*' "$W/deadlink.log")"
    EMU_DEVICES=1 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/local" --stages 1,2,4 --micro-batches 4 \
        --gpus 1 --transport local 2> "$W/local.log" || { cat "$W/local.log"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/nccl" "$W/local"
    /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/nccl"
    # layers 1 and 2 split between stages (2:9, 3:2): each hand-over is 3H + 2K floats a
    # row (the residual, the normed row, the partial routed sum, the routing) over NCCL;
    # the stage after a cut continues the routed sum in ascending expert id
    EMU_DEVICES=3 EMU_NCCL_BUFFER=${EMU_NCCL_BUFFER:-1024} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
        --out "$W/cut" --stages 2:9,3:2,4 --micro-batches 4 --transport nccl 2> "$W/cut.log" ||
        { cat "$W/cut.log"; exit 1; }
    grep -q "layer 1's experts 9-15, then layers 2-2 (layer 2: attention and experts 0-1)" "$W/cut.log" ||
        { cat "$W/cut.log"; exit 1; }
    exec /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/cut"
fi
if [ "${1:-}" = --ep ]; then
    # issue 17's NCCL expert exchange without GPUs: a tiny model (16 routed experts, top-4)
    # generated with --ep 4 on 4 emulated GPUs and --ep 2 --stages 2 on 2, expert rows and
    # contributions over the emulated NCCL (which blocks where NCCL does), must equal the
    # unsplit run on one emulated GPU sample for sample. Prompts of 3 to 19 tokens and
    # stop-free sampling of different lengths per rank give uneven counts per peer, and
    # ranks that run out of work serve the others (eg_ep_leave). A 1 KiB pair buffer makes
    # the prefill rows (up to 16 x 64 floats) wait on their stream for the recv.
    link_eaglegen
    W=$B/emu/ep
    rm -rf "$W" && mkdir -p "$W"
    "$B/emu/eaglegen_emu" mkmodel --preset tiny --out "$W/model" --layers 3 >/dev/null
    for i in 1 2 3 4 5 6; do
        n=$((3 + (i * i) % 17)); ids=""
        for j in $(seq 1 $n); do ids="$ids${ids:+, }$(( (i * 31 + j * 7) % 200 + 1 ))"; done
        printf '{"id": "e%d", "input_ids": [%s]}\n' $i "$ids"
    done > "$W/corpus.jsonl"
    common=(generate --backend cuda --model "$W/model" --prompts "$W/corpus.jsonl" --max-seq-len 64 --batch 4
            --chunk 16 --aux-layers 0,1,2 --seed 3 --gpu-mem-fraction 0.4 --temperature 0.9)
    export EMU_MEM_GB=2
    # 4 emulated GPUs of OS threads on 2 shared cores: a rank can take longer than the
    # default 60 s between two exchanges, which the emulator would report as a hang
    export EMU_NCCL_TIMEOUT=${EMU_NCCL_TIMEOUT:-900}
    t0=$(date +%s)
    EMU_DEVICES=1 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --max-new-tokens 4 --out "$W/one" 2> "$W/one.log" ||
        { cat "$W/one.log"; exit 1; }
    # a link that fails after the work was enqueued (NCCL's asynchronous error): the run
    # stops with the error named, it does not wait forever on the transfer
    if EMU_DEVICES=2 EMU_NCCL_ASYNC_ERROR=1 timeout 300 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
        --max-new-tokens 4 --out "$W/asyncerr" --ep 2 2> "$W/asyncerr.log"; then
        echo "FAIL: the run ignored NCCL's asynchronous error"; exit 1
    fi
    # (whichever wait sees it first: the exchange's, the rank backend's, or the connection's
    # at create, which polls too; the dead-link sweep below covers each wait on its own)
    grep -Eq "ncclCommGetAsyncError \((waiting for the exchange|waiting on the rank's stream|connecting every pair)\)" "$W/asyncerr.log" ||
        { cat "$W/asyncerr.log"; echo "FAIL: the asynchronous error is not reported"; exit 1; }
    # the same in stage groups (--ep 2 --stages 2 on 4 GPUs): the failed groups and the
    # ranks' stage-to-stage NCCL transports are torn down without waiting on a dead transfer
    if EMU_DEVICES=4 EMU_NCCL_BUFFER=1024 EMU_NCCL_ASYNC_ERROR=1 timeout 300 nice -n 19 "$B/emu/eaglegen_emu" \
        "${common[@]}" --max-new-tokens 4 --out "$W/asyncerr_g" --ep 2 --stages 2 2> "$W/asyncerr_g.log"; then
        echo "FAIL: stage groups ignored NCCL's asynchronous error"; exit 1
    fi
    # (whichever wait sees it first: a stage's exchange, or a stage's own stream holding a hand-over)
    grep -Eq "ncclCommGetAsyncError \((waiting for (the exchange|a hand-over)|waiting on the rank's stream|connecting every pair)\)" "$W/asyncerr_g.log" ||
        { cat "$W/asyncerr_g.log"; echo "FAIL: the asynchronous error is not reported (stage groups)"; exit 1; }
    echo "NCCL's asynchronous error stops the group, named, alone and in stage groups ($(( $(date +%s) - t0 )) s so far)"
    # a link that dies mid-run (EMU_NCCL_DEAD_AFTER=N: from the N-th message on nothing
    # moves): wherever it dies, every run stops with the error named, no hang and no crash.
    # Some N leave a transfer queued on a rank's stream while that rank waits in its own
    # backend (sample, an expert table) rather than in the exchange: the group's wait
    # check on each rank backend must catch those (without it N = 4 hung), and the
    # kernels queued behind an aborted receive must not index with its stale bytes
    # (without the bounded gather N = 8 crashed in a gather)
    printf '{"id": "d1", "input_ids": [5, 72, 101, 108]}\n{"id": "d2", "input_ids": [10, 72, 101, 108]}\n' > "$W/dead.jsonl"
    seen_rank_wait=0
    for n in 3 4 5 6 7 8; do
        if EMU_DEVICES=2 EMU_NCCL_DEAD_AFTER=$n EMU_NCCL_TIMEOUT=60 timeout 300 nice -n 19 "$B/emu/eaglegen_emu" \
            generate --backend cuda --model "$W/model" --prompts "$W/dead.jsonl" --max-seq-len 32 --batch 2 --chunk 16 \
            --aux-layers 0,1,2 --seed 3 --gpu-mem-fraction 0.4 --temperature 0.9 --max-new-tokens 2 \
            --out "$W/dead$n" --ep 2 > "$W/dead$n.log" 2>&1; then
            echo "FAIL: --ep 2 ignored a link dead after $n messages"; exit 1
        else rc=$?; fi
        [ $rc = 1 ] && grep -q "ncclCommGetAsyncError" "$W/dead$n.log" ||
            { tail -5 "$W/dead$n.log"; echo "FAIL: a link dead after $n messages: exit $rc, not named"; exit 1; }
        grep -q "waiting on the rank's stream" "$W/dead$n.log" && seen_rank_wait=1
    done
    [ $seen_rank_wait = 1 ] || { echo "FAIL: no dead link reached a rank's own wait (the sweep lost its point)"; exit 1; }
    # and in stage groups (--ep 2 --stages 2 on 4 GPUs: a stage backend carries the
    # transport's wait check and its group's)
    for n in 4 14; do
        if EMU_DEVICES=4 EMU_NCCL_BUFFER=1024 EMU_NCCL_DEAD_AFTER=$n EMU_NCCL_TIMEOUT=60 timeout 300 nice -n 19 \
            "$B/emu/eaglegen_emu" generate --backend cuda --model "$W/model" --prompts "$W/dead.jsonl" --max-seq-len 32 \
            --batch 2 --chunk 16 --aux-layers 0,1,2 --seed 3 --gpu-mem-fraction 0.4 --temperature 0.9 \
            --max-new-tokens 2 --out "$W/deadg$n" --ep 2 --stages 2 > "$W/deadg$n.log" 2>&1; then
            echo "FAIL: stage groups ignored a link dead after $n messages"; exit 1
        else rc=$?; fi
        [ $rc = 1 ] && grep -q "ncclCommGetAsyncError" "$W/deadg$n.log" ||
            { tail -5 "$W/deadg$n.log"; echo "FAIL: stage groups, a link dead after $n messages: exit $rc"; exit 1; }
    done
    echo "a link dead after 3..8 messages stops --ep 2 (and 4, 14 stage groups) named, no hang or crash ($(( $(date +%s) - t0 )) s so far)"
    # EG_EP_EXCHANGE=cuda-local: the copies on distinct GPUs, where NCCL cannot start; the same samples
    EMU_DEVICES=2 EG_EP_EXCHANGE=cuda-local nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --max-new-tokens 4 \
        --out "$W/forcelocal" --ep 2 2> "$W/forcelocal.log" || { cat "$W/forcelocal.log"; exit 1; }
    grep -q "expert parallel: 2 ranks.*exchange cuda-local" "$W/forcelocal.log" || { cat "$W/forcelocal.log"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/forcelocal"
    if EMU_DEVICES=2 EG_EP_EXCHANGE=shm "$B/emu/eaglegen_emu" "${common[@]}" --max-new-tokens 4 --out "$W/badx" --ep 2 \
        2> "$W/badx.log" || ! grep -q "EG_EP_EXCHANGE=shm: expected nccl or cuda-local" "$W/badx.log"; then
        cat "$W/badx.log"; echo "FAIL: EG_EP_EXCHANGE=shm not refused"; exit 1
    fi
    echo "EG_EP_EXCHANGE=cuda-local on 2 GPUs == one GPU ($(( $(date +%s) - t0 )) s so far)"
    if [ "${EMU_EP_ONLY_GROUPS:-0}" != 1 ]; then
    EMU_DEVICES=4 EMU_NCCL_BUFFER=${EMU_NCCL_BUFFER:-1024} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
        --max-new-tokens 4 --out "$W/ep4" --ep 4 2> "$W/ep4.log" || { cat "$W/ep4.log"; exit 1; }
    grep -q "expert parallel: 4 ranks.*exchange nccl" "$W/ep4.log" || { cat "$W/ep4.log"; exit 1; }
    grep "expert exchange:" "$W/ep4.log"
    /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/ep4"
    echo "ep4 == one GPU ($(( $(date +%s) - t0 )) s so far)"
    # both ranks on one emulated GPU: the cuda-local exchange (device copies between barriers)
    EMU_DEVICES=1 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --max-new-tokens 4 --out "$W/ep2one" --ep 2 \
        2> "$W/ep2one.log" || { cat "$W/ep2one.log"; exit 1; }
    grep -q "expert parallel: 2 ranks.*exchange cuda-local" "$W/ep2one.log" || { cat "$W/ep2one.log"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/ep2one"
    echo "ep2 on one GPU (cuda-local) == one GPU ($(( $(date +%s) - t0 )) s so far)"
    # --ep-split ffn: each layer's shared expert / dense MLP on rank l mod 2 only, every
    # rank's rows to it and back over the emulated NCCL (2 GPUs) and by device copies
    # (cuda-local, both ranks on one GPU); the samples stay the unsplit ones
    EMU_DEVICES=2 EMU_NCCL_BUFFER=${EMU_NCCL_BUFFER:-1024} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
        --max-new-tokens 4 --out "$W/ep2ffn" --ep 2 --ep-split ffn 2> "$W/ep2ffn.log" || { cat "$W/ep2ffn.log"; exit 1; }
    grep -q "expert parallel: 2 ranks.*exchange nccl" "$W/ep2ffn.log" || { cat "$W/ep2ffn.log"; exit 1; }
    grep -Eq "[1-9][0-9]* token rows to another rank.s shared expert" "$W/ep2ffn.log" || { echo "no ffn rows moved"; cat "$W/ep2ffn.log"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/ep2ffn"
    EMU_DEVICES=1 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --max-new-tokens 4 --out "$W/ep2ffn1" --ep 2 \
        --ep-split ffn 2> "$W/ep2ffn1.log" || { cat "$W/ep2ffn1.log"; exit 1; }
    grep -q "expert parallel: 2 ranks.*exchange cuda-local" "$W/ep2ffn1.log" || { cat "$W/ep2ffn1.log"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/ep2ffn1"
    echo "ep2 --ep-split ffn (nccl and cuda-local) == one GPU ($(( $(date +%s) - t0 )) s so far)"
    # --ep-split all: each rank holds vocab rows [r*V/2, (r+1)*V/2) of the embedding and
    # lm_head; ids to their owners and the rows back, every rank's final rows to every
    # rank and each slice's logits back (nccl on 2 GPUs, and cuda-local); 4 ranks on 4
    # GPUs over the emulated NCCL (the uneven split, V 50 over 3 ranks, is ep_vocab's)
    for v in "2 2 nccl" "1 2 cuda-local" "4 4 nccl"; do
        set -- $v
        EMU_DEVICES=$1 EMU_NCCL_BUFFER=${EMU_NCCL_BUFFER:-1024} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
            --max-new-tokens 4 --out "$W/all$1$2" --ep $2 --ep-split all 2> "$W/all$1$2.log" || { cat "$W/all$1$2.log"; exit 1; }
        grep -q "expert parallel: $2 ranks.*exchange $3" "$W/all$1$2.log" || { cat "$W/all$1$2.log"; exit 1; }
        grep -Eq "[1-9][0-9]* tokens embedded by another rank" "$W/all$1$2.log" || { echo "no embedding rows moved"; cat "$W/all$1$2.log"; exit 1; }
        grep -Eq "[1-9][0-9]* logit rows" "$W/all$1$2.log" || { echo "no logit rows moved"; cat "$W/all$1$2.log"; exit 1; }
        /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/all$1$2"
    done
    echo "--ep-split all (ep2 nccl, ep2 cuda-local, ep4 nccl) == one GPU ($(( $(date +%s) - t0 )) s so far)"
    if [ "${EMU_EP_STAGES:-1}" = 1 ]; then
        EMU_DEVICES=2 EMU_NCCL_BUFFER=${EMU_NCCL_BUFFER:-1024} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
            --max-new-tokens 4 --out "$W/ep2pp2" --ep 2 --stages 2 2> "$W/ep2pp2.log" || { cat "$W/ep2pp2.log"; exit 1; }
        grep -q "expert parallel: 2 ranks.*exchange nccl" "$W/ep2pp2.log" || { cat "$W/ep2pp2.log"; exit 1; }
        /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/ep2pp2"
        echo "ep2 x pp2 (each rank's stages on its one GPU) == one GPU ($(( $(date +%s) - t0 )) s)"
    fi
    fi # EMU_EP_ONLY_GROUPS
    if [ "${EMU_EP_GROUPS:-1}" = 1 ]; then
        # stage groups: rank r's stage k on GPU 2k + r (4 emulated GPUs), the hand-over inside
        # a rank over the NCCL transport, stage k's exchange among GPUs 2k, 2k+1; micro-batches
        # in flight through the stages, each stage thread leaving its group at the end; and
        # layer 1 split between the stages at expert 5 (2:5,3), each half's experts shared
        # out over its group, the shared expert on its owner after the cut (+ffn)
        for variant in none:2 all:2 ffn:2:5,3; do
            split=${variant%%:*} stages=${variant#*:}
            EMU_DEVICES=4 EMU_NCCL_BUFFER=${EMU_NCCL_BUFFER:-1024} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
                --max-new-tokens 4 --out "$W/g22$split" --ep 2 --stages $stages --ep-split $split 2> "$W/g22$split.log" ||
                { cat "$W/g22$split.log"; exit 1; }
            [ "$stages" = 2 ] || grep -q "layer 1 split between stages 0 and 1" "$W/g22$split.log" ||
                { cat "$W/g22$split.log"; exit 1; }
            grep -q "expert parallel: 2 stage groups of 2 ranks: .*(GPUs 0..1, 2..3)" "$W/g22$split.log" &&
                grep -q "expert parallel: 2 ranks.*exchange nccl" "$W/g22$split.log" &&
                grep -q "transport between stages: nccl" "$W/g22$split.log" || { cat "$W/g22$split.log"; exit 1; }
            /usr/bin/python3 tests/gen_check.py same "$W/one" "$W/g22$split"
            echo "ep2 x pp2 as stage groups on 4 GPUs (--stages $stages --ep-split $split) == one GPU ($(( $(date +%s) - t0 )) s)"
        done
    fi
    exit 0
fi
if [ "${1:-}" = --graphs ]; then
    # recorded replay of decode steps (CUDA graphs, emulated by stream capture that records
    # and replays): the same samples bit for bit as op by op, in one stage and in two
    # stages sharing one GPU, with aux captures staged through the device buffer (~5 min)
    link_eaglegen
    W=$B/emu/gr
    rm -rf "$W" && mkdir -p "$W"
    "$B/emu/eaglegen_emu" mkmodel --preset tiny --out "$W/model" --layers 3 >/dev/null
    for i in 1 2 3; do printf '{"id": "g%d", "input_ids": [%d, 72, 101, 108, %d]}\n' $i $((i * 5)) $((i + 30)); done > "$W/corpus.jsonl"
    common=(generate --backend cuda --model "$W/model" --prompts "$W/corpus.jsonl" --max-new-tokens 8
            --max-seq-len 64 --batch 3 --chunk 16 --aux-layers 0,1,2 --seed 5 --gpu-mem-fraction 0.4)
    export EMU_MEM_GB=2
    EG_CUDA_GRAPHS=0 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/off" 2> "$W/off.log" || { cat "$W/off.log"; exit 1; }
    nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/on" 2> "$W/on.log" || { cat "$W/on.log"; exit 1; }
    nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/on2" --stages 1,3 --gpus 1 --transport local \
        2> "$W/on2.log" || { cat "$W/on2.log"; exit 1; }
    # layer 1 split between two stages: the hand-over's packing copies are recorded too
    nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/on3" --stages 2:5,3 --gpus 1 --transport local \
        2> "$W/on3.log" || { cat "$W/on3.log"; exit 1; }
    grep "graphs:" "$W/on.log" "$W/on2.log" "$W/on3.log"
    if grep -q "graphs:" "$W/off.log"; then echo "graphs recorded with EG_CUDA_GRAPHS=0"; exit 1; fi
    for l in on on2 on3; do
        grep -Eq "graphs: [1-9][0-9]* step shapes recorded, [1-9][0-9]* replays, 0 recordings fell back" "$W/$l.log" ||
            { echo "no replays without fallbacks in $l"; cat "$W/$l.log"; exit 1; }
    done
    # the per-op profile (EG_CUDA_PROFILE=1): op by op, a table per token count, same samples
    EG_CUDA_PROFILE=1 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/prof" 2> "$W/prof.log" ||
        { cat "$W/prof.log"; exit 1; }
    grep -q "cuda profile, GPU 0" "$W/prof.log" && grep -Eq "mla_attention +[0-9]+" "$W/prof.log" ||
        { echo "no profile table"; cat "$W/prof.log"; exit 1; }
    if grep -q "graphs:" "$W/prof.log"; then echo "graphs recorded while profiling"; exit 1; fi
    /usr/bin/python3 tests/gen_check.py same "$W/off" "$W/on"
    /usr/bin/python3 tests/gen_check.py same "$W/off" "$W/prof"
    /usr/bin/python3 tests/gen_check.py same "$W/off" "$W/on3"
    exec /usr/bin/python3 tests/gen_check.py same "$W/off" "$W/on2"
fi
if [ "${1:-}" = --spec ]; then
    # issue 21: speculative decoding with the target on the emulated CUDA backend, the
    # EAGLE-3 drafter through its own emulated CUDA backend (gqa_attention, copy_rows, ...):
    # greedy with the drafter (K 3) writes the samples greedy without it writes; the run
    # reports its verify steps and accepted lengths.
    spec_fixture "$B/emu/spec"
    common=(generate --backend cuda --model "$W/model" --prompts "$W/corpus.jsonl" --max-new-tokens 8
            --max-seq-len 64 --batch 3 --chunk 8 --seed 5 --gpu-mem-fraction 0.4 --temperature 0)
    export EMU_MEM_GB=2
    nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/plain" 2> "$W/plain.log" || { cat "$W/plain.log"; exit 1; }
    # profiled (numerics unchanged): the drafter's own CUDA backend prints its table at the
    # end, so its gqa_attention rows show the drafter ran on the (emulated) GPU
    EG_CUDA_PROFILE=1 nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/spec" --draft-model "$W/drafter" \
        --draft-tokens 3 --log-json "$W/spec.jsonl" 2> "$W/spec.log" || { cat "$W/spec.log"; exit 1; }
    grep "speculative:" "$W/spec.log" || { echo "no speculative report"; cat "$W/spec.log"; exit 1; }
    grep -E "gqa_attention +[0-9]+" "$W/spec.log" || { echo "the drafter did not run on the GPU"; cat "$W/spec.log"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/plain" "$W/spec"
    # greedy: the device's argmaxes came back, no logits rows (--log-json counts them)
    grep -q '"logit_rows":0,' "$W/spec.jsonl" || { echo "greedy: logits rows copied"; cat "$W/spec.jsonl"; exit 1; }
    # sampled (temperature 8, top-p 0.9: 11 of 27 drafts accepted): the acceptance tests'
    # p(draft) from the device (token_probs, counted in --log-json) and from the host
    # (EG_CUDA_SAMPLE=sort leaves every one to it) give the same samples
    for how in dev host; do
        if [ $how = host ]; then export EG_CUDA_SAMPLE=sort; fi
        nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --temperature 8 --top-p 0.9 --out "$W/spec_$how" \
            --draft-model "$W/drafter" --draft-tokens 3 --log-json "$W/spec_$how.jsonl" 2> "$W/spec_$how.log" ||
            { cat "$W/spec_$how.log"; exit 1; }
        unset EG_CUDA_SAMPLE
    done
    dev=$(grep -o '"backend_probs":[0-9]*' "$W/spec_dev.jsonl" | tail -1 | cut -d: -f2)
    host=$(grep -o '"backend_probs":[0-9]*' "$W/spec_host.jsonl" | tail -1 | cut -d: -f2)
    dev_rows=$(grep -o '"logit_rows":[0-9]*' "$W/spec_dev.jsonl" | tail -1 | cut -d: -f2)
    host_rows=$(grep -o '"logit_rows":[0-9]*' "$W/spec_host.jsonl" | tail -1 | cut -d: -f2)
    dev_res=$(grep -o '"backend_residuals":[0-9]*' "$W/spec_dev.jsonl" | tail -1 | cut -d: -f2)
    host_res=$(grep -o '"backend_residuals":[0-9]*' "$W/spec_host.jsonl" | tail -1 | cut -d: -f2)
    echo "sampled: p(draft) of $dev rows from the device (host run: $host); $dev_rows logits rows taken ($host_rows);" \
        "$dev_res residuals from the device's kept sets ($host_res)"
    [ "${dev:-0}" -gt 0 ] && [ "${host:-1}" = 0 ] || { echo "token_probs not used as expected"; exit 1; }
    # one GPU, one thread: only the rows the rule needs came over, and a rejected draft's
    # residual came from the device's kept set (kept_probs) instead of its row
    [ -n "$dev_rows" ] && [ "$dev_rows" -lt "${host_rows:-0}" ] || { echo "every row was taken"; exit 1; }
    [ "${dev_res:-0}" -gt 0 ] && [ "${host_res:-1}" = 0 ] || { echo "kept_probs not used as expected"; exit 1; }
    # and the drafter's draws from its own device's kept sets (sampled) and argmaxes (greedy)
    dkept=$(grep -o '"draft_kept":[0-9]*' "$W/spec_dev.jsonl" | tail -1 | cut -d: -f2)
    dam=$(grep -o '"draft_argmax":[0-9]*' "$W/spec.jsonl" | tail -1 | cut -d: -f2)
    echo "the drafter: $dkept sampled draws from its device's kept sets, $dam greedy ones by its argmax"
    [ "${dkept:-0}" -gt 0 ] && [ "${dam:-0}" -gt 0 ] || { echo "the drafter's rows came to the host"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/spec_dev" "$W/spec_host"
    # vLLM's MLA drafter layout: its layer through the drafter's CUDA backend's mla_attention
    # over its paged latent cache; greedy stays the plain samples
    "$B/emu/eaglegen_emu" mkmodel --drafter-for "$W/model" --out "$W/drafter_mla" --seed 5 --mla >/dev/null
    nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/spec_mla" --draft-model "$W/drafter_mla" \
        --draft-tokens 3 2> "$W/spec_mla.log" || { cat "$W/spec_mla.log"; exit 1; }
    grep "speculative:" "$W/spec_mla.log" || { echo "no speculative report (MLA)"; cat "$W/spec_mla.log"; exit 1; }
    grep -q "paged cache 80 bytes per token" "$W/spec_mla.log" || { echo "not the latent cache"; cat "$W/spec_mla.log"; exit 1; }
    /usr/bin/python3 tests/gen_check.py same "$W/plain" "$W/spec_mla"
    # --ep 2 on 2 emulated GPUs: each rank drives its own drafter on its own device while
    # the target's expert rows cross the emulated NCCL; greedy stays the plain samples
    EMU_DEVICES=2 EMU_NCCL_TIMEOUT=${EMU_NCCL_TIMEOUT:-900} nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" \
        --out "$W/spec_ep2" --draft-model "$W/drafter" --draft-tokens 2 --ep 2 2> "$W/spec_ep2.log" ||
        { cat "$W/spec_ep2.log"; exit 1; }
    grep -q "expert parallel: 2 ranks.*exchange nccl" "$W/spec_ep2.log" || { cat "$W/spec_ep2.log"; exit 1; }
    grep "speculative:" "$W/spec_ep2.log" || { echo "no speculative report under --ep 2"; cat "$W/spec_ep2.log"; exit 1; }
    exec /usr/bin/python3 tests/gen_check.py same "$W/plain" "$W/spec_ep2"
fi
if [ "${1:-}" = --spec-stages ]; then
    # issue 21 with threaded stages: 2 stages on 2 emulated GPUs over emulated NCCL, sampled
    # with the drafter: the decisions of a verify step run on the last stage's thread
    # (defer_decide) before its backend takes the next micro-batch, so only the rows the
    # rule needs come over, and the samples are those of the same run with every row
    # taken to the host (EG_CUDA_SAMPLE=sort leaves p, the kept sets and the draws to it)
    spec_fixture "$B/emu/spec_stages"
    common=(generate --backend cuda --model "$W/model" --prompts "$W/corpus.jsonl" --max-new-tokens 8
            --max-seq-len 64 --batch 3 --chunk 8 --seed 5 --gpu-mem-fraction 0.4 --temperature 8 --top-p 0.9
            --draft-model "$W/drafter" --draft-tokens 3 --stages 2,3 --micro-batches 2 --transport nccl)
    export EMU_MEM_GB=2 EMU_DEVICES=2 EMU_NCCL_TIMEOUT=${EMU_NCCL_TIMEOUT:-900}
    for how in dev host; do
        if [ $how = host ]; then export EG_CUDA_SAMPLE=sort; fi
        nice -n 19 "$B/emu/eaglegen_emu" "${common[@]}" --out "$W/$how" --log-json "$W/$how.jsonl" 2> "$W/$how.log" ||
            { cat "$W/$how.log"; exit 1; }
        unset EG_CUDA_SAMPLE
    done
    grep -q "transport between stages: nccl" "$W/dev.log" || { cat "$W/dev.log"; exit 1; }
    grep "speculative:" "$W/dev.log" || { echo "no speculative report"; cat "$W/dev.log"; exit 1; }
    last() { grep -o "\"$1\":[0-9]*" "$2" | tail -1 | cut -d: -f2; }
    dev_rows=$(last logit_rows "$W/dev.jsonl"); host_rows=$(last logit_rows "$W/host.jsonl")
    dev_res=$(last backend_residuals "$W/dev.jsonl"); dev_draws=$(last backend_draws "$W/dev.jsonl")
    echo "threaded stages, sampled: $dev_rows logits rows taken (host run: $host_rows), $dev_res residuals from the" \
        "device's kept sets, $dev_draws tokens drawn on the device"
    [ -n "$dev_rows" ] && [ "$dev_rows" -lt "${host_rows:-0}" ] || { echo "every row was taken"; exit 1; }
    exec /usr/bin/python3 tests/gen_check.py same "$W/dev" "$W/host"
fi
if [ "${1:-}" = --forward ]; then
    # the whole forward pass of tiny-a through the emulated backend vs its golden (~15 min)
    link_eaglegen
    FX=${FIXTURES:-../shared/fixtures}
    G=$FX/models/golden-a-bf16kv.safetensors
    /usr/bin/python3 tests/gpu/golden_gpu.py prompts "$G" "$B/emu/a-full.json"
    nice -n 19 "$B/emu/eaglegen_emu" forward --backend cuda --model "$FX/models/tiny-a" --prompts "$B/emu/a-full.json" \
        --out "$B/emu/a.safetensors" --chunk 37
    exec /usr/bin/python3 tests/gpu/golden_gpu.py teacher "$B/emu/a.safetensors" "$G" --tol 2e-2 --margin 0.1
fi
filters=${*:-errors profiled embed linear_small swiglu mla_small router moe_small sample_small token_probs random_weights gqa copy_rows drafter}
rc=0
# two emulated GPUs: the profiled-backend test checks the transport choice across two
for f in $filters; do EMU_DEVICES=${EMU_DEVICES:-2} nice -n 19 "$B/emu/test_cuda_ops_emu" "$f" || rc=1; done
exit $rc
