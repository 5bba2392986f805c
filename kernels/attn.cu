/* attn.cu — ordinary multi-head / grouped-query attention over a paged BF16 cache with
 * rotate-half RoPE (what the EAGLE-3 drafter's decoder layer needs), and a strided row
 * copy. Shapes only, no model logic; see eg_cuda.h.
 *
 * Legend: T rows, NH heads, NKV kv heads, G = NH / NKV heads per kv head, HD head dim,
 * HW = HD / 2 BF16 pairs (32-bit words) per cache row of one kv head, TP positions per
 * tile. */
#include "kernels/common.cuh"

#define GQA_THREADS 128 /* threads per (kv head, row) block: 4 warps */
#define GQA_WARPS (GQA_THREADS / 32)
#define GQA_TILE_MAX 64 /* positions per tile where the shared memory allows */

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

/* Words between tile rows in shared memory: HW rounded up to odd, so the 32 lanes that
 * read one word of 32 consecutive rows hit 32 banks. */
static __host__ __device__ __forceinline__ int gqa_stride(int HD) { return (HD / 2) | 1; }

/* The attend kernel's dynamic shared memory at TP positions a tile (layout in the
 * kernel's comment). */
static size_t gqa_smem(int G, int HD, int TP) {
    return sizeof(int64_t) * (size_t)TP + sizeof(float) * ((size_t)2 * G * HD + (size_t)G * TP + 3 * (size_t)G) +
           sizeof(uint32_t) * 2 * (size_t)TP * gqa_stride(HD);
}

/* Positions a tile: GQA_TILE_MAX, halved while the shared memory exceeds 48 KB (down to
 * 8; above that the launch opts in to more). */
static int gqa_tile(int G, int HD) {
    int tp = GQA_TILE_MAX;
    while (tp > 8 && gqa_smem(G, HD, tp) > 48 * 1024) tp /= 2;
    return tp;
}

/* Block (kvh, t): the G heads kvh * G .. kvh * G + G - 1 of row t over positions
 * [lo, pos[t]] of its slot (lo 0, or pos[t] - window + 1 with a sliding window), in
 * tiles of TP positions. Each tile's K and V rows of the kv head are read from the cache
 * once, in coalesced 32-bit words, into shared memory, and serve all G heads; online
 * softmax per head (running max and sum, the accumulator rescaled per tile), FP32.
 * Dynamic shared memory, in this order (each part's alignment kept by the one before):
 * srow [TP] int64 (the tile's cache rows), sq [G][HD] (rotated q), acc [G][HD], sp [G][TP]
 * (scores, then weights), sm / sl / sc [G] (running max, running sum, this tile's
 * rescale) floats, kt / vt [TP][gqa_stride] words (BF16 pairs, low half first). */
static __global__ void __launch_bounds__(GQA_THREADS) gqa_attend_kernel(egk_gqa a, int TP) {
    extern __shared__ float gqa_sh[]; /* the dynamic buffer starts 16-byte aligned */
    const int kvh = blockIdx.x, t = blockIdx.y, HD = a.HD, half = HD / 2, G = a.NH / a.NKV;
    const int p = a.pos[t], tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, KS = gqa_stride(HD);
    int64_t *srow = (int64_t *)gqa_sh;
    float *sq = (float *)(srow + TP), *acc = sq + G * HD, *sp = acc + G * HD, *sm = sp + G * TP, *sl = sm + G,
          *sc = sl + G;
    uint32_t *kt = (uint32_t *)(sc + G), *vt = kt + TP * KS;
    for (int i = tid; i < G * half; i += GQA_THREADS) {
        const int g = i / half, d = i % half;
        const float *q = a.q + ((int64_t)t * a.NH + (int64_t)kvh * G + g) * HD;
        rope_pair(q[d], q[d + half], p, a.inv_freq[d], &sq[g * HD + d], &sq[g * HD + d + half]);
    }
    for (int i = tid; i < G * HD; i += GQA_THREADS) acc[i] = 0.0f;
    for (int g = tid; g < G; g += GQA_THREADS) sm[g] = -INFINITY, sl[g] = 0.0f;
    const int64_t row = (int64_t)a.NKV * HD;
    /* HD and NKV * HD are even, so every kv head's row starts on a 32-bit word */
    const uint32_t *K = (const uint32_t *)(a.k_cache + (int64_t)kvh * HD);
    const uint32_t *V = (const uint32_t *)(a.v_cache + (int64_t)kvh * HD);
    const int64_t wrow = row / 2;
    const int sl_ = a.slot[t];
    const int lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    for (int j0 = lo; j0 <= p; j0 += TP) {
        const int n = min(TP, p - j0 + 1);
        for (int jj = tid; jj < n; jj += GQA_THREADS) srow[jj] = gqa_row(a, sl_, j0 + jj);
        __syncthreads(); /* srow published; the previous tile's kt, vt, sp, sc all read */
        for (int w = tid; w < n * half; w += GQA_THREADS) {
            const int jj = w / half, c = w % half;
            const int64_t at = srow[jj] * wrow + c;
            kt[jj * KS + c] = K[at];
            vt[jj * KS + c] = V[at];
        }
        __syncthreads();
        /* scores: thread (g, jj), the dot in the CPU's order (d ascending) */
        for (int i = tid; i < G * n; i += GQA_THREADS) {
            const int g = i / n, jj = i % n;
            const float *qg = sq + g * HD;
            const uint32_t *kj = kt + jj * KS;
            float s = 0.0f;
            for (int c = 0; c < half; c++) {
                const uint32_t w = kj[c];
                s += qg[2 * c] * __uint_as_float(w << 16);
                s += qg[2 * c + 1] * __uint_as_float(w & 0xffff0000u);
            }
            sp[g * TP + jj] = s * a.scale;
        }
        __syncthreads();
        /* per head, one warp: the tile's max, its weights, their sum */
        for (int g = warp; g < G; g += GQA_WARPS) {
            float mx = -INFINITY;
            for (int jj = lane; jj < n; jj += 32) mx = fmaxf(mx, sp[g * TP + jj]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m = sm[g], mn = fmaxf(m, mx); /* finite: the tile holds position j0 */
            float ts = 0.0f;
            for (int jj = lane; jj < n; jj += 32) {
                const float e = expf(sp[g * TP + jj] - mn);
                sp[g * TP + jj] = e;
                ts += e;
            }
            for (int o = 16; o > 0; o >>= 1) ts += __shfl_xor_sync(0xffffffffu, ts, o);
            __syncwarp();
            if (lane == 0) {
                const float corr = expf(m - mn); /* 0 on the first tile (m = -inf) */
                sl[g] = sl[g] * corr + ts;
                sm[g] = mn;
                sc[g] = corr;
            }
        }
        __syncthreads();
        for (int i = tid; i < G * HD; i += GQA_THREADS) {
            const int g = i / HD, d = i % HD, hi = d & 1; /* element d: the high half of word d / 2 if odd */
            const float *pg = sp + g * TP;
            const uint32_t *vd = vt + d / 2;
            float o = acc[i] * sc[g];
            for (int jj = 0; jj < n; jj++) {
                const uint32_t w = vd[jj * KS];
                o += pg[jj] * __uint_as_float(hi ? w & 0xffff0000u : w << 16);
            }
            acc[i] = o;
        }
    }
    __syncthreads();
    for (int i = tid; i < G * HD; i += GQA_THREADS) {
        const int g = i / HD;
        a.out[((int64_t)t * a.NH + (int64_t)kvh * G + g) * HD + i % HD] = acc[i] / sl[g];
    }
}

extern "C" size_t egk_gqa_smem_bytes(int NH, int NKV, int HD) {
    if (NH < 1 || NKV < 1 || NH % NKV || HD < 2 || HD % 2) return 0;
    const int G = NH / NKV;
    return gqa_smem(G, HD, gqa_tile(G, HD));
}

extern "C" int egk_gqa_attention(const egk_gqa *a, void *stream) {
    if (a->T <= 0) return 0;
    if (a->T > 65535 || a->NKV < 1 || a->NH % a->NKV || a->HD < 2 || a->HD % 2)
        return (int)cudaErrorInvalidValue; /* the grid's y; the shapes the kernel assumes */
    cudaStream_t s = (cudaStream_t)stream;
    gqa_write_kernel<<<a->T, 128, 0, s>>>(*a);
    int rc = EGK_LAUNCH_RESULT();
    if (rc) return rc;
    const int G = a->NH / a->NKV, TP = gqa_tile(G, a->HD);
    const size_t shm = gqa_smem(G, a->HD, TP);
    cudaError_t e = egk_smem_opt_in(gqa_attend_kernel, shm, s);
    if (e != cudaSuccess) return (int)e;
    gqa_attend_kernel<<<dim3((unsigned)a->NKV, (unsigned)a->T), GQA_THREADS, shm, s>>>(*a, TP);
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
