#!/usr/bin/env bash
# CPU emulation of the CUDA backend (no GPU needed): kernels/*.cu rewritten to host
# C++ (tests/gpu/emu/rewrite.py) where each CUDA thread of a block is an OS thread
# (tests/gpu/emu/include/cuda_runtime.h); the CUDA runtime, cuBLAS and CUB replaced by
# host code (emu_runtime.cpp, include/cub/cub.cuh); engine/backend_cuda.c compiled
# unchanged against them; tests/gpu/test_cuda_ops.c run on the cases small enough to
# emulate. It checks index arithmetic, layouts, the cuBLAS parameterisation (against
# BLAS's column-major definition) and the backend's logic; not timing, not concurrency
# between blocks, not device math libraries. Slow (minutes: thread creation).
# usage: tests/gpu/emu/run_emu.sh [test-name filters...]
#        tests/gpu/emu/run_emu.sh --forward   (tiny-a forward vs golden-a-bf16kv)
set -eu
cd "$(dirname "$0")/../../.."
B=${BUILD_EMU:-build-emu}
mkdir -p "$B/emu"
make -s BUILD="$B" NO_CUDA=1 "$B/libeg_engine.a" "$B/libeg_common.a"
INC="-Itests/gpu/emu/include -I."
for f in elementwise gemm mla router sample; do
    python3 tests/gpu/emu/rewrite.py kernels/$f.cu "$B/emu/$f.cpp"
    g++ -std=c++20 -O1 -g -w $INC -include cuda_runtime.h -c "$B/emu/$f.cpp" -o "$B/emu/$f.o"
done
g++ -std=c++20 -O1 -g -w $INC -c tests/gpu/emu/emu_runtime.cpp -o "$B/emu/emu_runtime.o"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -DEG_HAVE_CUDA=1 $INC -c engine/backend_cuda.c \
    -o "$B/emu/backend_cuda.o"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -D_GNU_SOURCE -pthread $INC -c tests/gpu/test_cuda_ops.c -o "$B/emu/test.o"
g++ -o "$B/emu/test_cuda_ops_emu" "$B/emu/test.o" "$B/emu/backend_cuda.o" "$B/emu"/elementwise.o "$B/emu"/gemm.o \
    "$B/emu"/mla.o "$B/emu"/router.o "$B/emu"/sample.o "$B/emu/emu_runtime.o" "$B/libeg_engine.a" "$B/libeg_common.a" \
    -ljansson -lzstd -larchive -lpcre2-8 -lm -pthread
if [ "${1:-}" = --forward ]; then
    # the whole forward pass of tiny-a through the emulated backend vs its golden (~15 min)
    make -s BUILD="$B" NO_CUDA=1 "$B/libeg_gen.a" "$B/libeg_dataset.a" "$B/libeg_prompts.a" "$B/gen/main.o"
    g++ -o "$B/emu/eaglegen_emu" "$B/gen/main.o" "$B/emu/backend_cuda.o" "$B/emu"/elementwise.o "$B/emu"/gemm.o \
        "$B/emu"/mla.o "$B/emu"/router.o "$B/emu"/sample.o "$B/emu/emu_runtime.o" "$B/libeg_gen.a" "$B/libeg_engine.a" \
        "$B/libeg_dataset.a" "$B/libeg_prompts.a" "$B/libeg_common.a" -ljansson -lzstd -larchive -lpcre2-8 -lm -pthread
    FX=${FIXTURES:-../shared/fixtures}
    G=$FX/models/golden-a-bf16kv.safetensors
    /usr/bin/python3 tests/gpu/golden_gpu.py prompts "$G" "$B/emu/a-full.json"
    nice -n 19 "$B/emu/eaglegen_emu" forward --backend cuda --model "$FX/models/tiny-a" --prompts "$B/emu/a-full.json" \
        --out "$B/emu/a.safetensors" --chunk 37
    exec /usr/bin/python3 tests/gpu/golden_gpu.py teacher "$B/emu/a.safetensors" "$G" --tol 2e-2 --margin 0.1
fi
filters=${*:-errors embed linear_small swiglu mla_small router moe_small sample_small}
rc=0
for f in $filters; do nice -n 19 "$B/emu/test_cuda_ops_emu" "$f" || rc=1; done
exit $rc
