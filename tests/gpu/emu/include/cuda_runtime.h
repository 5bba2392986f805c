/* Emulation stand-in for cuda_runtime.h when the kernels are compiled as host C++
 * (tests/gpu/emu): every CUDA thread of a block is an OS thread, __syncthreads a
 * std::barrier, warp shuffles go through a per-warp exchange buffer and barrier.
 * Blocks run one after another, one launch at a time process-wide, on the worker
 * thread of the launch's stream (later than the launch call). Slow, and only for checking index arithmetic and
 * logic on small shapes; it says nothing about races that need real concurrency
 * across blocks or about memory-model subtleties. */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

struct uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct emu_warp {
    std::unique_ptr<std::barrier<>> bar;
    uint64_t slot[32];
    uint32_t ma[32][4], mb[32][2]; /* mma fragments of each lane */
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline thread_local std::barrier<> *emu_bar;
inline thread_local emu_warp *emu_w;
inline unsigned char *emu_dyn_smem;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

static inline void __syncthreads() { emu_bar->arrive_and_wait(); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_w->bar->arrive_and_wait(); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    int lane = threadIdx.x & 31;
    std::memcpy(&emu_w->slot[lane], &v, sizeof(T));
    emu_w->bar->arrive_and_wait();
    T r;
    std::memcpy(&r, &emu_w->slot[lane ^ o], sizeof(T));
    emu_w->bar->arrive_and_wait();
    return r;
}
/* mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 with the fragment layout documented in
 * kernels/common.cuh (the PTX ISA's): every lane publishes its fragments, each lane then
 * rebuilds A (16x16) and B (16x8) and computes its four outputs in FP32, k in order. */
static inline float emu_bf16_half(uint32_t r, int hi) {
    uint32_t u = (hi ? (r >> 16) : (r & 0xffffu)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline void emu_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    int lane = threadIdx.x & 31;
    for (int i = 0; i < 4; i++) emu_w->ma[lane][i] = a[i];
    emu_w->mb[lane][0] = b[0];
    emu_w->mb[lane][1] = b[1];
    emu_w->bar->arrive_and_wait();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        const uint32_t *fa = emu_w->ma[l], *fb = emu_w->mb[l];
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = emu_bf16_half(fa[0], h);
            A[g + 8][2 * t + h] = emu_bf16_half(fa[1], h);
            A[g][2 * t + 8 + h] = emu_bf16_half(fa[2], h);
            A[g + 8][2 * t + 8 + h] = emu_bf16_half(fa[3], h);
            B[2 * t + h][g] = emu_bf16_half(fb[0], h);
            B[2 * t + 8 + h][g] = emu_bf16_half(fb[1], h);
        }
    }
    emu_w->bar->arrive_and_wait();
    int g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[e] = acc;
    }
}
/* cp.async: by default a thread's copies land only when its cp.async.wait_group lets
 * their group finish (the latest moment the PTX contract allows), so a read of the
 * destination before the wait sees stale bytes and fails a test; EMU_CP_ASYNC=early
 * copies at issue (the earliest moment: a copy into a buffer other warps still read shows). */
struct emu_cp {
    void *dst;
    const void *src;
    unsigned n;
    long group;
};
inline thread_local std::vector<emu_cp> emu_cp_pending;
inline thread_local long emu_cp_committed;
inline int emu_cp_early() {
    static const int early = [] { const char *e = std::getenv("EMU_CP_ASYNC"); return e && !std::strcmp(e, "early"); }();
    return early;
}
static inline void emu_cp_async(void *dst, const void *src, unsigned n) {
    if (((uintptr_t)dst | (uintptr_t)src) & (n - 1)) {
        std::fprintf(stderr, "emulator: cp.async of %u bytes from %p to %p is misaligned\n", n, src, dst);
        std::abort();
    }
    if (emu_cp_early()) std::memcpy(dst, src, n);
    else emu_cp_pending.push_back(emu_cp{dst, src, n, emu_cp_committed});
}
static inline void emu_cp_commit() { emu_cp_committed++; }
static inline void emu_cp_wait(int n) {
    std::vector<emu_cp> keep;
    for (const emu_cp &c : emu_cp_pending) {
        if (c.group < emu_cp_committed - n) std::memcpy(c.dst, c.src, c.n);
        else keep.push_back(c);
    }
    emu_cp_pending.swap(keep);
}
/* ldmatrix .x2/.x4 (.trans), the contract in kernels/common.cuh: every lane publishes its
 * row address, then each lane gathers its elements of every tile. A misaligned row
 * address aborts (the GPU faults). */
static inline void emu_ldmatrix(uint32_t *d, int n, bool trans, const void *row) {
    int lane = threadIdx.x & 31;
    if (lane < 8 * n && ((uintptr_t)row & 15u)) {
        std::fprintf(stderr, "emulator: ldmatrix row address %p of lane %d is not 16-byte aligned\n", row, lane);
        std::abort();
    }
    emu_w->slot[lane] = (uint64_t)(uintptr_t)row;
    emu_w->bar->arrive_and_wait();
    int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < n; i++) {
        uint32_t e[2];
        for (int h = 0; h < 2; h++) {
            int r = trans ? 2 * t + h : g, c = trans ? g : 2 * t + h;
            e[h] = ((const uint16_t *)(uintptr_t)emu_w->slot[8 * i + r])[c];
        }
        d[i] = e[0] | e[1] << 16;
    }
    emu_w->bar->arrive_and_wait();
}
/* Static __shared__ variables are process-wide statics here (tests/gpu/emu/rewrite.py
 * adds this call after each declaration): the first thread of a block to reach one fills
 * it with 0xFF bytes (NaN, -1, wild pointers), so a read of a value the block never wrote
 * shows, as it would on a GPU; later threads and later calls in the block leave it. */
inline std::mutex emu_poison_mu;
inline std::map<const void *, unsigned long> emu_poisoned;
inline unsigned long emu_block_gen = 1; /* bumped per block by emu_launch */
static inline void emu_poison_shared(void *p, size_t n) {
    std::lock_guard<std::mutex> g(emu_poison_mu);
    unsigned long &gen = emu_poisoned[p];
    if (gen != emu_block_gen) {
        std::memset(p, 0xFF, n);
        gen = emu_block_gen;
    }
}
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicMin(int *p, int v) {
    int cur = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return cur;
}
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long min(long a, long b) { return a < b ? a : b; }
using std::cos;
using std::exp;
using std::sin;
using std::sqrt;

/* Run a grid: blocks in order, each block's threads concurrently. One launch at a time
 * in the whole process (gridDim, blockDim, static __shared__ and the dynamic buffer are
 * process-wide here), so host threads driving several emulated GPUs take turns. */
inline std::mutex emu_launch_mu;
/* A kernel call with its arguments converted to the parameter types and kept by value
 * (a recorded launch runs after the launcher's locals are gone). */
template <class... P, class... A> inline std::function<void()> emu_bind(void (*k)(P...), A &&...a) {
    return [k, t = std::tuple<std::decay_t<P>...>(std::forward<A>(a)...)] { std::apply(k, t); };
}
/* What a real launch refuses (the launch then reports cudaErrorInvalidValue through
 * cudaGetLastError and nothing runs): more dynamic shared memory than 48 KB without the
 * kernel's cudaFuncSetAttribute opt-in, or than the device's opt-in limit; a grid or
 * block beyond CUDA's dimensions. */
inline bool emu_launch_ok(const void *k, dim3 g, dim3 b, size_t shm) {
    unsigned nt = b.x * b.y * b.z;
    if (!g.x || !g.y || !g.z || g.y > 65535 || g.z > 65535 || !nt || nt > 1024) return false;
    if (shm > 48 * 1024 && (shm > (size_t)emu_func_smem(k) || shm > (size_t)emu_smem_limit(0))) return false;
    return true;
}
inline void emu_launch_run(dim3 g, dim3 b, size_t shm, const std::function<void()> &fn);
/* A launch is checked at the call (a refused one reports through cudaGetLastError, as on
 * a GPU) and runs when its stream gets to it (tests/gpu/emu/emu_runtime.cpp). */
inline void emu_launch(const void *k, dim3 g, dim3 b, size_t shm, cudaStream_t s, const std::function<void()> &fn) {
    if (!emu_launch_ok(k, g, b, shm)) {
        std::fprintf(stderr, "emulator: launch refused (grid %u,%u,%u block %u,%u,%u, %zu bytes of dynamic shared memory)\n",
                     g.x, g.y, g.z, b.x, b.y, b.z, shm);
        emu_set_last_error(cudaErrorInvalidValue);
        return;
    }
    emu_stream_exec(s, [g, b, shm, fn] { emu_launch_run(g, b, shm, fn); });
}
inline void emu_launch_run(dim3 g, dim3 b, size_t shm, const std::function<void()> &fn) {
    std::lock_guard<std::mutex> serial(emu_launch_mu);
    gridDim = g;
    blockDim = b;
    unsigned nt = b.x * b.y * b.z;
    std::vector<unsigned char> dyn(shm + 64);
    emu_dyn_smem = dyn.data();
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                /* a block's shared memory starts as garbage on a GPU: NaN bytes here, so a
                 * tile column or row the kernel forgot to write shows in the results */
                std::memset(dyn.data(), 0xFF, dyn.size());
                emu_block_gen++;
                std::barrier<> bar((std::ptrdiff_t)nt);
                std::vector<emu_warp> warps((nt + 31) / 32);
                for (unsigned w = 0; w < warps.size(); w++)
                    warps[w].bar = std::make_unique<std::barrier<>>((std::ptrdiff_t)std::min(32u, nt - 32 * w));
                std::vector<std::thread> th;
                th.reserve(nt);
                for (unsigned i = 0; i < nt; i++)
                    th.emplace_back([&, i] {
                        threadIdx = dim3(i % b.x, (i / b.x) % b.y, i / (b.x * b.y));
                        blockIdx = dim3(x, y, z);
                        emu_bar = &bar;
                        emu_w = &warps[i / 32];
                        fn();
                        emu_w->bar->arrive_and_drop();
                        emu_bar->arrive_and_drop();
                    });
                for (auto &t : th) t.join();
            }
}
#endif
#endif
