/* attn.cu — ordinary multi-head / grouped-query attention over a paged BF16 cache with
 * rotate-half RoPE (what the EAGLE-3 drafter's decoder layer needs), and a strided row
 * copy. Shapes only, no model logic; see eg_cuda.h. */
#include "kernels/common.cuh"

#define GQA_THREADS 64 /* threads per (head, row) block; also the positions per tile */

/* Rotate-half RoPE of the pair (x0, x1) = (v[i], v[i + HD/2]) at position p: the angle
 * in FP64, cos/sin rounded to FP32, products and sums rounded separately (no FMA
 * contraction), so the rotated values are the CPU backend's bit for bit. */
static __device__ __forceinline__ void rope_pair(float x0, float x1, int p, float inv, float *o0, float *o1) {
    double a = (double)p * (double)inv;
    float cs = (float)cos(a), sn = (float)sin(a);
    *o0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    *o1 = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
}

/* The cache row (token index into [n_blocks][BS]) of position j of slot s. */
static __device__ __forceinline__ int64_t gqa_row(const egk_gqa &a, int s, int j) {
    return (int64_t)a.table[(int64_t)s * a.MB + j / a.BS] * a.BS + j % a.BS;
}

/* One block per row: rotated k and v of every kv head to the cache as BF16 (RNE). */
static __global__ void gqa_write_kernel(egk_gqa a) {
    const int t = blockIdx.x, half = a.HD / 2, p = a.pos[t];
    const int64_t row = (int64_t)a.NKV * a.HD, r = gqa_row(a, a.slot[t], p);
    uint16_t *kc = a.k_cache + r * row;
    uint16_t *vc = a.v_cache + r * row;
    const float *k = a.k + (int64_t)t * row, *v = a.v + (int64_t)t * row;
    for (int i = threadIdx.x; i < a.NKV * half; i += blockDim.x) {
        const int h = i / half, d = i % half;
        const int64_t o = (int64_t)h * a.HD + d;
        float r0, r1;
        rope_pair(k[o], k[o + half], p, a.inv_freq[d], &r0, &r1);
        kc[o] = egk_f32_to_bf16(r0);
        kc[o + half] = egk_f32_to_bf16(r1);
        vc[o] = egk_f32_to_bf16(v[o]);
        vc[o + half] = egk_f32_to_bf16(v[o + half]);
    }
}

/* Tree reduction over the block's GQA_THREADS values in red (every thread gets it). */
static __device__ __forceinline__ float block_reduce(float *red, float v, int is_max) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = GQA_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float o = red[threadIdx.x + s];
            red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], o) : red[threadIdx.x] + o;
        }
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

/* Block (h, t): row t, head h over positions [lo, pos[t]] of its slot (lo 0, or
 * pos[t] - window + 1 with a sliding window), in tiles of
 * GQA_THREADS positions (one score per thread), online softmax (running max and sum,
 * the accumulator rescaled per tile). Dynamic shared memory: q [HD], acc [HD],
 * p [GQA_THREADS], red [GQA_THREADS] floats, then the tile's cache rows
 * [GQA_THREADS] int64 (each thread looks up its position's block once). */
static __global__ void __launch_bounds__(GQA_THREADS) gqa_attend_kernel(egk_gqa a) {
    extern __shared__ float gqa_sh[]; /* the dynamic buffer starts 16-byte aligned */
    const int h = blockIdx.x, t = blockIdx.y, HD = a.HD, half = HD / 2;
    const int kvh = h / (a.NH / a.NKV), p = a.pos[t], tid = threadIdx.x;
    float *sq = gqa_sh, *acc = sq + HD, *sp = acc + HD, *red = sp + GQA_THREADS;
    int64_t *srow = (int64_t *)(red + GQA_THREADS); /* 8-byte aligned: 2 * HD + 128 floats, HD even */
    const float *q = a.q + ((int64_t)t * a.NH + h) * HD;
    for (int i = tid; i < half; i += GQA_THREADS) rope_pair(q[i], q[i + half], p, a.inv_freq[i], &sq[i], &sq[i + half]);
    for (int d = tid; d < HD; d += GQA_THREADS) acc[d] = 0.0f;
    __syncthreads();
    const int64_t row = (int64_t)a.NKV * HD;
    const uint16_t *K = a.k_cache + (int64_t)kvh * HD;
    const uint16_t *V = a.v_cache + (int64_t)kvh * HD;
    const int sl = a.slot[t];
    float m = -INFINITY, l = 0.0f;
    const int lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    for (int j0 = lo; j0 <= p; j0 += GQA_THREADS) {
        const int j = j0 + tid, n = min(GQA_THREADS, p - j0 + 1);
        float sc = -INFINITY;
        if (j <= p) {
            const int64_t rj = gqa_row(a, sl, j);
            srow[tid] = rj; /* published by block_reduce's barriers */
            const uint16_t *kj = K + rj * row;
            float s = 0.0f;
            for (int d = 0; d < HD; d++) s += sq[d] * egk_bf16_to_f32(kj[d]);
            sc = s * a.scale;
        }
        const float mn = fmaxf(m, block_reduce(red, sc, 1)); /* finite: the tile holds position j0 */
        const float pj = j <= p ? expf(sc - mn) : 0.0f;
        sp[tid] = pj;
        const float ts = block_reduce(red, pj, 0); /* its barriers also publish sp */
        const float corr = expf(m - mn);           /* 0 on the first tile (m = -inf) */
        l = l * corr + ts;
        for (int d = tid; d < HD; d += GQA_THREADS) {
            float o = acc[d] * corr;
            for (int jj = 0; jj < n; jj++) o += sp[jj] * egk_bf16_to_f32(V[srow[jj] * row + d]);
            acc[d] = o;
        }
        m = mn;
        __syncthreads(); /* sp is rewritten by the next tile */
    }
    float *out = a.out + ((int64_t)t * a.NH + h) * HD;
    for (int d = tid; d < HD; d += GQA_THREADS) out[d] = acc[d] / l;
}

extern "C" int egk_gqa_attention(const egk_gqa *a, void *stream) {
    if (a->T <= 0) return 0;
    if (a->T > 65535 || a->NH > 65535) return (int)cudaErrorInvalidValue; /* the grid's y (and x) */
    cudaStream_t s = (cudaStream_t)stream;
    gqa_write_kernel<<<a->T, 128, 0, s>>>(*a);
    int rc = EGK_LAUNCH_RESULT();
    if (rc) return rc;
    size_t shm = sizeof(float) * (size_t)(2 * a->HD + 2 * GQA_THREADS) + sizeof(int64_t) * GQA_THREADS;
    gqa_attend_kernel<<<dim3((unsigned)a->NH, (unsigned)a->T), GQA_THREADS, shm, s>>>(*a);
    return EGK_LAUNCH_RESULT();
}

static __global__ void copy_rows_kernel(float *dst, int64_t ds, const float *src, int64_t ss, int64_t width) {
    const int64_t r = blockIdx.x;
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[r * ds + c] = src[r * ss + c];
}

extern "C" int egk_copy_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride, int rows,
                             int64_t width, void *stream) {
    if (rows <= 0 || width <= 0) return 0;
    copy_rows_kernel<<<rows, 256, 0, (cudaStream_t)stream>>>(dst, dst_stride, src, src_stride, width);
    return EGK_LAUNCH_RESULT();
}
