/* common.cuh — device helpers shared by the kernels: BF16/FP8 conversion, weight
 * element loads by format, warp/block reductions. Internal to kernels/. */
#ifndef EG_KERNELS_COMMON_CUH
#define EG_KERNELS_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/eg_cuda.h"

#define EGK_LAUNCH_RESULT() ((int)cudaGetLastError())

/* Kernel k's opt-in above 48 KB of dynamic shared memory, raised to shm where it is below:
 * a per-device attribute, so read back at each launch (a host-side query, no
 * synchronisation) rather than cached, and only ever raised (setting each call's exact
 * size would lower it for a later, larger call, which a recorded launch cannot raise
 * again). Not touched while the stream is recorded: the same shape ran, and raised it,
 * before any recording; were it still short, the launch reports it. */
template <class F> static inline cudaError_t egk_smem_opt_in(F k, size_t shm, cudaStream_t s) {
    if (shm <= 48 * 1024) return cudaSuccess;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s, &cs);
    if (e != cudaSuccess || cs != cudaStreamCaptureStatusNone) return e;
    cudaFuncAttributes fa;
    e = cudaFuncGetAttributes(&fa, k);
    if (e != cudaSuccess || (size_t)fa.maxDynamicSharedSizeBytes >= shm) return e;
    return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
}

/* One token's combine order over ids[K], once per block into shared memory: ord[j] is
 * the k added j-th, in ascending expert id, ties by k (engine/backend.h eg_moe_order).
 * Each k finds its rank by counting; every thread of the block must call it (it ends
 * with a barrier). ord: [K] ints of the kernel's dynamic shared memory. */
static __device__ __forceinline__ void egk_moe_order_block(const int32_t *ids, int K, int *ord) {
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        int e = ids[k], r = 0;
        for (int j = 0; j < K; j++) r += ids[j] < e || (ids[j] == e && j < k);
        ord[r] = k;
    }
    __syncthreads();
}

static __device__ __forceinline__ float egk_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Round to nearest even; NaN kept quiet (same bits as eg_f32_to_bf16 on the host). */
static __device__ __forceinline__ uint16_t egk_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* OCP E4M3 (fn): bias 7, no infinities, S.1111.111 is NaN. */
static __device__ __forceinline__ float egk_fp8_to_f32(uint8_t v) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7) r = __int_as_float(0x7fc00000);
    else if (e == 0) r = ldexpf((float)m, -9);
    else r = ldexpf((float)(8 + m), e - 10);
    return s ? -r : r;
}

/* Element (r, c) of a weight of format FMT, as float. */
template <int FMT>
static __device__ __forceinline__ float egk_wload(const void *data, const void *scale, int64_t cols, int group,
                                                  int64_t r, int64_t c) {
    if (FMT == EGK_F32) return ((const float *)data)[r * cols + c];
    if (FMT == EGK_BF16) return egk_bf16_to_f32(((const uint16_t *)data)[r * cols + c]);
    if (FMT == EGK_F16) return __half2float(((const __half *)data)[r * cols + c]);
    if (FMT == EGK_INT4) {
        uint32_t word = ((const uint32_t *)data)[r * (cols >> 3) + (c >> 3)];
        int nib = (int)((word >> (4 * (int)(c & 7))) & 15u);
        int64_t sg = (cols + group - 1) / group;
        float s = egk_bf16_to_f32(((const uint16_t *)scale)[r * sg + c / group]);
        return (float)(nib - 8) * s;
    }
    /* EGK_FP8 */
    float v = egk_fp8_to_f32(((const uint8_t *)data)[r * cols + c]);
    int64_t sc = (cols + 127) / 128;
    return v * ((const float *)scale)[(r >> 7) * sc + (c >> 7)];
}

/* d += A B for one warp: mma.sync m16n8k16, BF16 inputs, FP32 accumulation (sm_80+:
 * Hopper and Blackwell alike). Fragments, g = lane / 4, t = lane % 4, two BF16 per
 * register with the lower index in the low half:
 *   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..]   a[3] = A[g+8][2t+8..]
 *   b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]          (B is K x N, stored as [n][k])
 *   d[0..1] = D[g][2t..2t+1]   d[2..3] = D[g+8][2t..2t+1]
 * The CPU emulator (tests/gpu/emu) implements the same contract lane by lane. */
static __device__ __forceinline__ void egk_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef EMU_CUDA_RUNTIME_H
    emu_mma_bf16_16816(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* d = a * b + c on two BF16 lanes, rounded to nearest even (fma.rn.bf16x2, sm_80+). The
 * emulator's stand-in rounds to FP32 first, then to BF16: the same result wherever the
 * FP32 value is exact (i4_pair's small integers), not in general. */
static __device__ __forceinline__ uint32_t egk_fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
#ifdef EMU_CUDA_RUNTIME_H
    uint32_t d = 0;
    for (int h = 0; h < 2; h++) {
        float r = fmaf(egk_bf16_to_f32((uint16_t)(a >> (16 * h))), egk_bf16_to_f32((uint16_t)(b >> (16 * h))),
                       egk_bf16_to_f32((uint16_t)(c >> (16 * h))));
        d |= (uint32_t)egk_f32_to_bf16(r) << (16 * h);
    }
    return d;
#else
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

/* ldmatrix (sm_75+): N (2 or 4) 8x8 tiles of 16-bit values from shared memory in one
 * warp-wide instruction; lane 8i + r passes the 16-byte-aligned address of row r of tile
 * i (lanes past 8N: any valid address). Lane l = 4g + t receives in d[i] the elements
 * (g, 2t..2t+1) of tile i, or with TRANS (2t..2t+1, g): exactly the mma's A fragment
 * registers (non-transposed) and B fragment registers of a row-major K x N tile
 * (transposed). The CPU emulator implements the same contract lane by lane. */
template <int N, bool TRANS> static __device__ __forceinline__ void egk_ldmatrix(uint32_t d[N], const void *row) {
#ifdef EMU_CUDA_RUNTIME_H
    emu_ldmatrix(d, N, TRANS, row);
#else
    uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
    if (N == 4 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(s));
    else if (N == 4)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(s));
    else if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(d[0]), "=r"(d[1]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(d[0]), "=r"(d[1]) : "r"(s));
#endif
}

/* cp.async (sm_80+, Hopper and Blackwell alike): global -> shared without registers, in
 * groups; egk_cp_async_wait<N>() waits until at most N of this thread's most recent
 * groups are in flight. dst/src 16-byte (egk_cp_async16) or 4-byte aligned. The CPU
 * emulator lands each copy at the wait that completes its group (or, EMU_CP_ASYNC=early,
 * at issue): both are valid orders of the same program. */
static __device__ __forceinline__ void egk_cp_async16(void *dst, const void *src) {
#ifdef EMU_CUDA_RUNTIME_H
    emu_cp_async(dst, src, 16);
#else
    uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
#endif
}
static __device__ __forceinline__ void egk_cp_async4(void *dst, const void *src) {
#ifdef EMU_CUDA_RUNTIME_H
    emu_cp_async(dst, src, 4);
#else
    uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
#endif
}
static __device__ __forceinline__ void egk_cp_async_commit() {
#ifdef EMU_CUDA_RUNTIME_H
    emu_cp_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> static __device__ __forceinline__ void egk_cp_async_wait() {
#ifdef EMU_CUDA_RUNTIME_H
    emu_cp_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* A 1-D vector element (norm weights, biases): F32, BF16 or F16. */
static __device__ __forceinline__ float egk_vload(int fmt, const void *data, int64_t i) {
    if (fmt == EGK_F32) return ((const float *)data)[i];
    if (fmt == EGK_F16) return __half2float(((const __half *)data)[i]);
    return egk_bf16_to_f32(((const uint16_t *)data)[i]);
}

static __device__ __forceinline__ float egk_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double egk_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it.
 * sh: 32 doubles of shared memory. */
static __device__ __forceinline__ double egk_block_sum_d(double v, double *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = egk_warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < nw; i++) t += sh[i];
    return t;
}

static inline unsigned egk_blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

#endif
