/* Emulation stand-in for cuda_runtime.h when the kernels are compiled as host C++
 * (tests/gpu/emu): every CUDA thread of a block is an OS thread, __syncthreads a
 * std::barrier, warp shuffles go through a per-warp exchange buffer and barrier.
 * Blocks run one after another. Slow, and only for checking index arithmetic and
 * logic on small shapes; it says nothing about races that need real concurrency
 * across blocks or about memory-model subtleties. */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#ifdef __cplusplus
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct emu_warp {
    std::unique_ptr<std::barrier<>> bar;
    uint64_t slot[32];
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
using std::cos;
using std::exp;
using std::sin;
using std::sqrt;

/* Run a grid: blocks in order, each block's threads concurrently. */
inline void emu_launch(dim3 g, dim3 b, size_t shm, const std::function<void()> &fn) {
    gridDim = g;
    blockDim = b;
    unsigned nt = b.x * b.y * b.z;
    std::vector<unsigned char> dyn(shm + 64);
    emu_dyn_smem = dyn.data();
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
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
