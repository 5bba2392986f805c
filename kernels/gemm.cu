/* gemm.cu — the dequantising GEMM (any weight format, FP32 arithmetic) and the MoE
 * pipeline built on the same tile: permutation by expert (counting sort on the
 * device), grouped gate/up GEMM with SwiGLU in the epilogue, grouped down GEMM with the
 * routing weight in the epilogue, and a deterministic combine.
 *
 * Tile: BM=32 tokens x BN=64 output rows x BK=32 inputs, 256 threads, each thread 2x4
 * outputs. Weights are dequantised into shared memory as FP32, so every format shares
 * one code path. INT4 (group 32) and BF16 experts take a tensor-core path with the same
 * tiles and tile list (mma.sync m16n8k16, activations as BF16 hi + lo; see below). The grid's tile list for the grouped
 * GEMM is built on the device, so the host never learns the per-expert counts (no
 * synchronisation) and no per-expert launches are needed. */
#include "kernels/common.cuh"

#define BM EGK_MOE_BM
#define BN 64
#define BK 32
#define NTHREADS 256

/* Accumulate acc[w][i][j] += X[row i] . W_w[row n0 + tx + 16j] over all K columns.
 * xrow[i]: pointer to the i-th activation row of the tile (NULL = zero row). */
template <int FMT, int NW>
static __device__ __forceinline__ void tile_product(const float *const *xrow, int64_t K, const void *const *wdata,
                                                    const void *const *wscale, int64_t wrows, int group, int64_t n0,
                                                    float (*Xs)[BK + 1], float (*Ws)[BN][BK + 1],
                                                    float acc[NW][2][4]) {
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        for (int i = 0; i < BM * BK / NTHREADS; i++) {
            int idx = tid + i * NTHREADS, r = idx / BK, c = idx % BK;
            int64_t k = k0 + c;
            Xs[r][c] = (xrow[r] && k < K) ? xrow[r][k] : 0.0f;
        }
#pragma unroll
        for (int w = 0; w < NW; w++)
            for (int i = 0; i < BN * BK / NTHREADS; i++) {
                int idx = tid + i * NTHREADS, r = idx / BK, c = idx % BK;
                int64_t n = n0 + r, k = k0 + c;
                Ws[w][r][c] = (n < wrows && k < K) ? egk_wload<FMT>(wdata[w], wscale[w], K, group, n, k) : 0.0f;
            }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < BK; kk++) {
            float a0 = Xs[ty * 2][kk], a1 = Xs[ty * 2 + 1][kk];
#pragma unroll
            for (int w = 0; w < NW; w++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float b = Ws[w][tx + 16 * j][kk];
                    acc[w][0][j] += a0 * b;
                    acc[w][1][j] += a1 * b;
                }
        }
        __syncthreads();
    }
}

/* ---- plain GEMM ------------------------------------------------------------------ */

template <int FMT>
static __global__ void __launch_bounds__(NTHREADS) gemm_kernel(const float *x, int T, egk_weight W, float *y,
                                                               int accumulate) {
    __shared__ float Xs[BM][BK + 1];
    __shared__ float Ws[1][BN][BK + 1];
    __shared__ const float *xrow[BM];
    int64_t n0 = (int64_t)blockIdx.x * BN;
    int m0 = blockIdx.y * BM;
    if (threadIdx.x < BM) {
        int m = m0 + threadIdx.x;
        xrow[threadIdx.x] = m < T ? x + (int64_t)m * W.cols : NULL;
    }
    __syncthreads();
    float acc[1][2][4] = {};
    const void *wd[1] = {W.data}, *ws[1] = {W.scale};
    tile_product<FMT, 1>(xrow, W.cols, wd, ws, W.rows, W.group, n0, Xs, Ws, acc);
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    for (int i = 0; i < 2; i++) {
        int m = m0 + ty * 2 + i;
        if (m >= T) continue;
        for (int j = 0; j < 4; j++) {
            int64_t n = n0 + tx + 16 * j;
            if (n >= W.rows) continue;
            float *dst = y + (int64_t)m * W.rows + n;
            *dst = accumulate ? *dst + acc[0][i][j] : acc[0][i][j];
        }
    }
}

extern "C" int egk_gemm(const float *x, int T, egk_weight W, float *y, int accumulate, void *stream) {
    if (T <= 0 || W.rows <= 0) return 0;
    dim3 grid(egk_blocks(W.rows, BN), egk_blocks(T, BM));
    cudaStream_t s = (cudaStream_t)stream;
    switch (W.fmt) {
    case EGK_F32: gemm_kernel<EGK_F32><<<grid, NTHREADS, 0, s>>>(x, T, W, y, accumulate); break;
    case EGK_BF16: gemm_kernel<EGK_BF16><<<grid, NTHREADS, 0, s>>>(x, T, W, y, accumulate); break;
    case EGK_F16: gemm_kernel<EGK_F16><<<grid, NTHREADS, 0, s>>>(x, T, W, y, accumulate); break;
    case EGK_INT4: gemm_kernel<EGK_INT4><<<grid, NTHREADS, 0, s>>>(x, T, W, y, accumulate); break;
    case EGK_FP8: gemm_kernel<EGK_FP8><<<grid, NTHREADS, 0, s>>>(x, T, W, y, accumulate); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return EGK_LAUNCH_RESULT();
}

/* ---- MoE ------------------------------------------------------------------------- */

/* One block: counting sort of the T*K (token, slot) pairs by local expert, the
 * per-expert row offsets, and the list of (expert, first row) tiles of BM rows.
 * Row order inside an expert depends on atomics, which changes nothing numerically:
 * each row's outputs are reduced in a fixed order, and the combine goes by (t, k). */
static __global__ void moe_permute_kernel(const int32_t *ids, int TK, int e0, int e1, int32_t *row_tk,
                                          int32_t *rowmap, int32_t *offsets, int32_t *tiles, int32_t *ntiles) {
    extern __shared__ int32_t sh[]; /* cnt[nl], cursor[nl] */
    int nl = e1 - e0;
    int32_t *cnt = sh, *cur = sh + nl;
    for (int e = threadIdx.x; e < nl; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < TK; i += blockDim.x) {
        int e = ids[i];
        if (e >= e0 && e < e1) atomicAdd(&cnt[e - e0], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, nt = 0;
        for (int e = 0; e < nl; e++) {
            offsets[e] = off;
            cur[e] = off;
            for (int r = 0; r < cnt[e]; r += BM) {
                tiles[2 * nt] = e;
                tiles[2 * nt + 1] = off + r;
                nt++;
            }
            off += cnt[e];
        }
        offsets[nl] = off;
        *ntiles = nt;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TK; i += blockDim.x) {
        int e = ids[i];
        if (e >= e0 && e < e1) {
            int r = atomicAdd(&cur[e - e0], 1);
            row_tk[r] = i;
            rowmap[i] = r;
        } else {
            rowmap[i] = -1;
        }
    }
}

/* This block's tile of a grouped GEMM: expert e, rows [r0, r1), and xrow[i] = the input
 * row of row r0 + i (NULL past r1): per token, x + (row_tk[r] / K) * ld, for gate/up;
 * per row, x + r * ld, for down (row_tk NULL). Returns 0 when the block has no tile;
 * that is block-uniform, so the caller may return before any barrier. */
static __device__ __forceinline__ int moe_tile(const int32_t *tiles, const int32_t *ntiles, const int32_t *offsets,
                                               const float *x, int64_t ld, const int32_t *row_tk, int K,
                                               const float **xrow, int *e, int *r0, int *r1) {
    int tile = blockIdx.x;
    if (tile >= *ntiles) return 0;
    *e = tiles[2 * tile];
    *r0 = tiles[2 * tile + 1];
    *r1 = offsets[*e + 1];
    if (threadIdx.x < BM) {
        int r = *r0 + threadIdx.x;
        xrow[threadIdx.x] = r < *r1 ? x + (row_tk ? (int64_t)(row_tk[r] / K) : (int64_t)r) * ld : NULL;
    }
    __syncthreads();
    return 1;
}

/* h[r][f] = silu(x_t . gate_e[f]) * (x_t . up_e[f]) for the rows of one tile. */
template <int FMT>
static __global__ void __launch_bounds__(NTHREADS)
    moe_gate_up_kernel(const float *x, int H, int F, int K, const egk_expert_ptrs *tab, int group,
                       const int32_t *tiles, const int32_t *ntiles, const int32_t *offsets, const int32_t *row_tk,
                       float *h) {
    __shared__ float Xs[BM][BK + 1];
    __shared__ float Ws[2][BN][BK + 1];
    __shared__ const float *xrow[BM];
    int e, r0, r1;
    if (!moe_tile(tiles, ntiles, offsets, x, H, row_tk, K, xrow, &e, &r0, &r1)) return;
    int64_t n0 = (int64_t)blockIdx.y * BN;
    egk_expert_ptrs p = tab[e];
    const void *wd[2] = {p.gate, p.up}, *ws[2] = {p.gate_s, p.up_s};
    float acc[2][2][4] = {};
    tile_product<FMT, 2>(xrow, H, wd, ws, F, group, n0, Xs, Ws, acc);
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    for (int i = 0; i < 2; i++) {
        int r = r0 + ty * 2 + i;
        if (r >= r1) continue;
        for (int j = 0; j < 4; j++) {
            int64_t n = n0 + tx + 16 * j;
            if (n >= F) continue;
            float g = acc[0][i][j];
            h[(int64_t)r * F + n] = g / (1.0f + expf(-g)) * acc[1][i][j];
        }
    }
}

/* o[r][n] = weight(r) * (h[r] . down_e[n]). */
template <int FMT>
static __global__ void __launch_bounds__(NTHREADS)
    moe_down_kernel(const float *h, int H, int F, const float *weights, const egk_expert_ptrs *tab, int group,
                    const int32_t *tiles, const int32_t *ntiles, const int32_t *offsets, const int32_t *row_tk,
                    float *o) {
    __shared__ float Xs[BM][BK + 1];
    __shared__ float Ws[1][BN][BK + 1];
    __shared__ const float *xrow[BM];
    int e, r0, r1;
    if (!moe_tile(tiles, ntiles, offsets, h, F, NULL, 1, xrow, &e, &r0, &r1)) return;
    int64_t n0 = (int64_t)blockIdx.y * BN;
    egk_expert_ptrs p = tab[e];
    const void *wd[1] = {p.down}, *ws[1] = {p.down_s};
    float acc[1][2][4] = {};
    tile_product<FMT, 1>(xrow, F, wd, ws, H, group, n0, Xs, Ws, acc);
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    for (int i = 0; i < 2; i++) {
        int r = r0 + ty * 2 + i;
        if (r >= r1) continue;
        float wgt = weights[row_tk[r]];
        for (int j = 0; j < 4; j++) {
            int64_t n = n0 + tx + 16 * j;
            if (n < H) o[(int64_t)r * H + n] = acc[0][i][j] * wgt;
        }
    }
}

/* y[t][n] += o[rowmap[t*K+k]][n] over the token's k in ascending expert id (like the
 * CPU backend: a split by expert range continues the same fold; rowmap -1: a pair outside
 * the call's range). The MoE op's combine, and the expert-parallel exchange's
 * (egk_ep_combine: the contributions that came back, mapped by tk2pair). */
static __global__ void moe_combine_kernel(const float *o, const int32_t *rowmap, const int32_t *ids, int K, int H,
                                          float *y) {
    extern __shared__ int32_t sh[]; /* [K] the token's combine order */
    int t = blockIdx.y;
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    egk_moe_order_block(ids + (int64_t)t * K, K, sh);
    if (n >= H) return;
    float v = y[(int64_t)t * H + n];
    for (int j = 0; j < K; j++) {
        int r = rowmap[t * K + sh[j]];
        if (r >= 0) v += o[(int64_t)r * H + n];
    }
    y[(int64_t)t * H + n] = v;
}

/* ---- MoE on tensor cores ----------------------------------------------------------- */
/* The same tiles (BM rows of one expert x BN outputs), K in steps of MK = 64 (two INT4
 * groups of 32). 8 warps: warp w computes rows 16*(w&1).. and outputs 16*(w>>1).. as
 * two m16n8 mma tiles. Activations enter shared memory as BF16 hi + lo pairs (lo = the
 * rounding residual), both multiplied by the same weight fragment, so a product carries
 * ~16 mantissa bits of the activation. INT4 weights enter as their exact integer values
 * (-8..7 in BF16) and each 32-column group's partial sum is scaled in FP32 afterwards,
 * so nothing is rounded that the FP32 reference does not round. */
#define MK 64
#define MKP (MK + 8) /* padded row (BF16 elements): spreads fragment loads over banks */

/* Per k-step, each thread moves XN activations and WN weight words (plus, for INT4, at
 * most one group scale per matrix) from global memory to shared. They are loaded into
 * registers one step ahead, so the next step's global reads are in flight while the
 * tensor cores work on this one. */
#define XN (BM * MK / NTHREADS)

/* The tile's activations for columns [k0, k0 + MK): XN per thread into registers, then
 * into shared memory as BF16 hi + lo. */
static __device__ __forceinline__ void x_load(const float *const *xrow, int64_t k0, float *xr) {
#pragma unroll
    for (int j = 0; j < XN; j++) {
        int i = threadIdx.x + j * NTHREADS, r = i / MK, c = i % MK;
        xr[j] = xrow[r] ? xrow[r][k0 + c] : 0.0f;
    }
}
static __device__ __forceinline__ void x_store(const float *xr, uint16_t (*Xh)[MKP], uint16_t (*Xl)[MKP]) {
#pragma unroll
    for (int j = 0; j < XN; j++) {
        int i = threadIdx.x + j * NTHREADS, r = i / MK, c = i % MK;
        uint16_t h = egk_f32_to_bf16(xr[j]);
        Xh[r][c] = h;
        Xl[r][c] = egk_f32_to_bf16(xr[j] - egk_bf16_to_f32(h));
    }
}
/* The mma A fragments (hi and lo) of rows mr.., columns kk.. (layout in common.cuh): one
 * ldmatrix.x4 each, lane 8i + r addressing row r of 8x8 tile i (tiles: rows +0/+8 x
 * columns +0/+8). Xh and Xl rows are 144 bytes: 16-byte aligned, and the 8 rows of a
 * tile fall on distinct banks. */
static __device__ __forceinline__ void a_frags(const uint16_t (*Xh)[MKP], const uint16_t (*Xl)[MKP], int mr, int kk,
                                               uint32_t ah[4], uint32_t al[4]) {
    int lane = threadIdx.x & 31, li = lane >> 3, r = mr + (lane & 7) + 8 * (li & 1), c = kk + 8 * (li >> 1);
    egk_ldmatrix<4, false>(ah, &Xh[r][c]);
    egk_ldmatrix<4, false>(al, &Xl[r][c]);
}

template <int FMT>
struct mma_wn {
    static const int n = FMT == EGK_INT4 ? BN * (MK / 8) / NTHREADS : BN * (MK / 2) / NTHREADS;
};

template <int FMT>
static __device__ __forceinline__ void mma_load(const float *const *xrow, int64_t K, const void *wdata,
                                                const void *wscale, int64_t wrows, int group, int64_t n0, int64_t k0,
                                                float *xr, uint32_t *wr, float *sr, int with_x) {
    int tid = threadIdx.x;
    if (with_x) x_load(xrow, k0, xr);
#pragma unroll
    for (int j = 0; j < mma_wn<FMT>::n; j++) {
        int i = tid + j * NTHREADS;
        if (FMT == EGK_INT4) { /* 8 words (64 nibbles) per row: a warp reads 4 whole rows of 32 bytes */
            int r = i / (MK / 8), q = i % (MK / 8);
            int64_t n = n0 + r;
            wr[j] = n < wrows ? ((const uint32_t *)wdata)[n * (K >> 3) + (k0 >> 3) + q] : 0x88888888u;
        } else {
            int r = i / (MK / 2), q = i % (MK / 2);
            int64_t n = n0 + r;
            wr[j] = n < wrows ? ((const uint32_t *)wdata)[(n * K + k0) / 2 + q] : 0u;
        }
    }
    if (FMT == EGK_INT4 && tid < BN * 2) {
        int64_t n = n0 + (tid >> 1);
        *sr = n < wrows ? egk_bf16_to_f32(((const uint16_t *)wscale)[n * (K / group) + (k0 / group) + (tid & 1)]) : 0.0f;
    }
}

template <int FMT>
static __device__ __forceinline__ void mma_store(const float *xr, const uint32_t *wr, float sr, uint16_t (*Xh)[MKP],
                                                 uint16_t (*Xl)[MKP], uint16_t (*Wt)[MKP], float (*Sc)[2], int with_x) {
    int tid = threadIdx.x;
    if (with_x) x_store(xr, Xh, Xl);
#pragma unroll
    for (int j = 0; j < mma_wn<FMT>::n; j++) {
        int i = tid + j * NTHREADS;
        if (FMT == EGK_INT4) {
            int r = i / (MK / 8), q = i % (MK / 8);
#pragma unroll
            for (int b = 0; b < 8; b++) Wt[r][q * 8 + b] = egk_f32_to_bf16((float)((int)((wr[j] >> (4 * b)) & 15u) - 8));
        } else {
            int r = i / (MK / 2), q = i % (MK / 2);
            Wt[r][2 * q] = (uint16_t)(wr[j] & 0xffffu);
            Wt[r][2 * q + 1] = (uint16_t)(wr[j] >> 16);
        }
    }
    if (FMT == EGK_INT4 && tid < BN * 2) Sc[tid >> 1][tid & 1] = sr;
}

/* Columns [kb, ke) of rows with K columns (kb, ke multiples of MK). */
template <int FMT, int NW>
static __device__ __forceinline__ void mma_tile(const float *const *xrow, int64_t K, int64_t kb, int64_t ke,
                                                const void *const *wdata, const void *const *wscale, int64_t wrows,
                                                int group, int64_t n0, uint16_t (*Xh)[MKP], uint16_t (*Xl)[MKP],
                                                uint16_t (*Wt)[BN][MKP], float (*Sc)[BN][2], float acc[NW][2][4]) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int t4 = lane & 3, mr = (warp & 1) * 16, nc = (warp >> 1) * 16;
    float xr[XN], sr[NW] = {};
    uint32_t wr[NW][mma_wn<FMT>::n];
#pragma unroll
    for (int w = 0; w < NW; w++)
        if (kb < ke) mma_load<FMT>(xrow, K, wdata[w], wscale[w], wrows, group, n0, kb, xr, wr[w], &sr[w], w == 0);
    for (int64_t k0 = kb; k0 < ke; k0 += MK) {
#pragma unroll
        for (int w = 0; w < NW; w++) mma_store<FMT>(xr, wr[w], sr[w], Xh, Xl, Wt[w], Sc[w], w == 0);
        __syncthreads();
        if (k0 + MK < ke)
#pragma unroll
            for (int w = 0; w < NW; w++)
                mma_load<FMT>(xrow, K, wdata[w], wscale[w], wrows, group, n0, k0 + MK, xr, wr[w], &sr[w], w == 0);
        /* the A fragments serve every weight matrix; each accumulator still sums its
         * k-steps in order, and groups into acc in order */
#pragma unroll
        for (int grp = 0; grp < MK / 32; grp++) {
            float part[NW][2][4] = {};
#pragma unroll
            for (int kk = grp * 32; kk < grp * 32 + 32; kk += 16) {
                uint32_t ah[4], al[4];
                a_frags(Xh, Xl, mr, kk, ah, al);
#pragma unroll
                for (int w = 0; w < NW; w++) {
                    /* B fragments of both 8-row slices: tiles (rows +0, +8 of the slice) x
                     * (columns +0, +8), i.e. b[0..1] of slice 0, then of slice 1 */
                    uint32_t b[4];
                    int li = lane >> 3;
                    egk_ldmatrix<4, false>(b, &Wt[w][nc + 8 * (li >> 1) + (lane & 7)][kk + 8 * (li & 1)]);
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        egk_mma_bf16_16816(part[w][j], ah, b + 2 * j);
                        egk_mma_bf16_16816(part[w][j], al, b + 2 * j);
                    }
                }
            }
#pragma unroll
            for (int w = 0; w < NW; w++)
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float sc = FMT == EGK_INT4 ? Sc[w][nc + 8 * j + 2 * t4 + (e & 1)][grp] : 1.0f;
                        acc[w][j][e] += part[w][j][e] * sc;
                    }
        }
        __syncthreads();
    }
}

/* INT4 (group 32) weights through a cp.async pipeline: MOE_STAGES k-steps of raw INT4
 * words and their group scales are in flight to shared memory at once (the register
 * prefetch above keeps one step, ~4 KB per block, in flight: too little to cover HBM
 * latency when one block fits per SM), and the nibbles are turned into the mma's BF16
 * B fragments in registers, so the weights never pass through a BF16 tile in shared
 * memory. Same products, same order, same FP32 group scaling as mma_tile. */
#define MOE_STAGES 4
#define WQ_LD 12 /* words per weight row in shared memory: 8 used; 48 bytes keeps 16-byte
                    alignment and puts the 8 rows a fragment load touches on distinct banks */

template <int NW>
static __device__ __forceinline__ void i4_issue(const void *const *wdata, const void *const *wscale, int64_t K,
                                                int64_t wrows, int group, int64_t n0, int64_t k0,
                                                uint32_t (*Wq)[BN][WQ_LD], uint32_t (*Sq)[BN]) {
    int tid = threadIdx.x;
    for (int i = tid; i < NW * BN * 2; i += NTHREADS) { /* two 16-byte halves of a row's 32 bytes */
        int w = i / (BN * 2), r = (i >> 1) % BN, half = i & 1;
        int64_t n = n0 + r;
        uint32_t *dst = &Wq[w][r][half * 4];
        if (n < wrows) egk_cp_async16(dst, (const uint32_t *)wdata[w] + n * (K >> 3) + (k0 >> 3) + half * 4);
        else dst[0] = dst[1] = dst[2] = dst[3] = 0x88888888u; /* nibble 8: value 0 */
    }
    for (int i = tid; i < NW * BN; i += NTHREADS) { /* the two group scales of the step, 4 bytes */
        int w = i / BN, r = i % BN;
        int64_t n = n0 + r;
        if (n < wrows) egk_cp_async4(&Sq[w][r], (const uint16_t *)wscale[w] + n * (K / group) + k0 / group);
        else Sq[w][r] = 0u;
    }
}

/* The two low nibbles of v as a BF16 pair (nibble - 8, low nibble in the low half):
 * each nibble goes into the mantissa of BF16 128 (0x4300: one unit per mantissa step
 * at that exponent, so 0x4300 | n is 128 + n), then one bf16x2 FMA subtracts 136 from
 * both halves. Every value is a small integer: exact, the bits of bf16(n - 8). */
static __device__ __forceinline__ uint32_t i4_pair(uint32_t v) {
    uint32_t t = (v & 0xFu) | ((v << 12) & 0xF0000u) | 0x43004300u;
    return egk_fma_bf16x2(t, 0x3F803F80u /* 1, 1 */, 0xC308C308u /* -136, -136 */);
}

template <int NW>
static __device__ __forceinline__ void mma_tile_i4(const float *const *xrow, int64_t K, int64_t kb, int64_t ke,
                                                   const void *const *wdata, const void *const *wscale, int64_t wrows,
                                                   int group, int64_t n0, uint16_t (*Xh)[MKP], uint16_t (*Xl)[MKP],
                                                   uint32_t (*Wq)[NW][BN][WQ_LD], uint32_t (*Sq)[NW][BN],
                                                   float acc[NW][2][4]) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t4 = lane & 3, mr = (warp & 1) * 16, nc = (warp >> 1) * 16;
    int nk = (int)((ke - kb) / MK);
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; s++) {
        if (s < nk) i4_issue<NW>(wdata, wscale, K, wrows, group, n0, kb + (int64_t)s * MK, Wq[s], Sq[s]);
        egk_cp_async_commit(); /* (empty groups keep the count uniform) */
    }
    float xr[XN];
    if (nk > 0) x_load(xrow, kb, xr);
    for (int step = 0; step < nk; step++) {
        int64_t k0 = kb + (int64_t)step * MK;
        int st = step % MOE_STAGES;
        x_store(xr, Xh, Xl);
        egk_cp_async_wait<MOE_STAGES - 2>(); /* this step's group has landed (this thread's part) */
        __syncthreads();                     /* ... and everyone's; X stored */
        /* refill the stage read one step ago (its readers passed the trailing barrier) */
        if (step + MOE_STAGES - 1 < nk)
            i4_issue<NW>(wdata, wscale, K, wrows, group, n0, k0 + (int64_t)(MOE_STAGES - 1) * MK,
                         Wq[(step + MOE_STAGES - 1) % MOE_STAGES], Sq[(step + MOE_STAGES - 1) % MOE_STAGES]);
        egk_cp_async_commit();
        if (step + 1 < nk) x_load(xrow, k0 + MK, xr);
        /* the A fragments serve every weight matrix; each accumulator still sums its
         * k-steps in order, and groups into acc in order (the register path's order) */
#pragma unroll
        for (int grp = 0; grp < MK / 32; grp++) {
            float part[NW][2][4] = {};
#pragma unroll
            for (int kk = grp * 32; kk < grp * 32 + 32; kk += 16) {
                uint32_t ah[4], al[4];
                a_frags(Xh, Xl, mr, kk, ah, al);
#pragma unroll
                for (int w = 0; w < NW; w++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        /* columns kk + 2t4 (+1) and kk + 2t4 + 8 (+9) of row nc + 8j + g: nibbles
                         * 2t4, 2t4+1 of words kk/8 and kk/8 + 1 */
                        const uint32_t *wrow = Wq[st][w][nc + 8 * j + g];
                        uint32_t b[2] = {i4_pair(wrow[kk >> 3] >> (8 * t4)), i4_pair(wrow[(kk >> 3) + 1] >> (8 * t4))};
                        egk_mma_bf16_16816(part[w][j], ah, b);
                        egk_mma_bf16_16816(part[w][j], al, b);
                    }
            }
#pragma unroll
            for (int w = 0; w < NW; w++)
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        uint32_t sp = Sq[st][w][nc + 8 * j + 2 * t4 + (e & 1)];
                        acc[w][j][e] += part[w][j][e] * egk_bf16_to_f32((uint16_t)(grp ? sp >> 16 : sp & 0xffffu));
                    }
        }
        __syncthreads();
    }
    egk_cp_async_wait<0>();
}

/* The weight tiles' shared memory for the path, and the path's k-loop. */
template <int FMT, bool ASYNC, int NW>
static __device__ __forceinline__ void mma_tile_any(const float *const *xrow, int64_t K, int64_t kb, int64_t ke,
                                                    const void *const *wdata, const void *const *wscale,
                                                    int64_t wrows, int group, int64_t n0, uint16_t (*Xh)[MKP],
                                                    uint16_t (*Xl)[MKP], float acc[NW][2][4]) {
    if constexpr (ASYNC) {
        __shared__ __align__(16) uint32_t Wq[MOE_STAGES][NW][BN][WQ_LD];
        __shared__ uint32_t Sq[MOE_STAGES][NW][BN];
        mma_tile_i4<NW>(xrow, K, kb, ke, wdata, wscale, wrows, group, n0, Xh, Xl, Wq, Sq, acc);
    } else {
        __shared__ __align__(16) uint16_t Wt[NW][BN][MKP];
        __shared__ float Sc[NW][BN][2];
        mma_tile<FMT, NW>(xrow, K, kb, ke, wdata, wscale, wrows, group, n0, Xh, Xl, Wt, Sc, acc);
    }
}

/* Row and output column of accumulator element (j, e) of this thread. */
static __device__ __forceinline__ int mma_row(int e) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return (warp & 1) * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
}
static __device__ __forceinline__ int mma_col(int j, int e) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return (warp >> 1) * 16 + 8 * j + 2 * (lane & 3) + (e & 1);
}

template <int FMT, bool ASYNC>
static __global__ void __launch_bounds__(NTHREADS, 2) /* <= 128 registers: two blocks per SM */
    moe_gate_up_mma_kernel(const float *x, int H, int F, int K, const egk_expert_ptrs *tab, int group,
                           const int32_t *tiles, const int32_t *ntiles, const int32_t *offsets, const int32_t *row_tk,
                           float *h, float *part, int R) {
    __shared__ __align__(16) uint16_t Xh[BM][MKP];
    __shared__ __align__(16) uint16_t Xl[BM][MKP];
    __shared__ const float *xrow[BM];
    int e, r0, r1;
    if (!moe_tile(tiles, ntiles, offsets, x, H, row_tk, K, xrow, &e, &r0, &r1)) return;
    int64_t n0 = (int64_t)blockIdx.y * BN;
    egk_expert_ptrs p = tab[e];
    const void *wd[2] = {p.gate, p.up}, *ws[2] = {p.gate_s, p.up_s};
    float acc[2][2][4] = {};
    int64_t per = ((H / MK + gridDim.z - 1) / gridDim.z) * MK, kb = blockIdx.z * per, ke = min((int64_t)H, kb + per);
    mma_tile_any<FMT, ASYNC, 2>(xrow, H, kb, ke, wd, ws, F, group, n0, Xh, Xl, acc);
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int r = r0 + mma_row(q);
            int64_t n = n0 + mma_col(j, q);
            if (r >= r1 || n >= F) continue;
            if (part) { /* split K: partial gate and up sums, finished by moe_gate_up_finish */
                float *dst = part + (((int64_t)blockIdx.z * R + r) * 2) * F + n;
                dst[0] = acc[0][j][q];
                dst[F] = acc[1][j][q];
                continue;
            }
            float gv = acc[0][j][q];
            h[(int64_t)r * F + n] = gv / (1.0f + expf(-gv)) * acc[1][j][q];
        }
}

/* h = silu(sum gate) * (sum up) over the splits, in split order; rows of the call only. */
static __global__ void moe_gate_up_finish(const float *part, int nsplit, int R, int F, const int32_t *nrows, float *h) {
    int r = blockIdx.y;
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= *nrows || n >= F) return;
    float g = 0.0f, u = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        const float *src = part + (((int64_t)s * R + r) * 2) * F + n;
        g += src[0];
        u += src[F];
    }
    h[(int64_t)r * F + n] = g / (1.0f + expf(-g)) * u;
}

/* o = (sum of the splits) * routing weight. */
static __global__ void moe_down_finish(const float *part, int nsplit, int R, int H, const float *weights,
                                       const int32_t *row_tk, const int32_t *nrows, float *o) {
    int r = blockIdx.y;
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= *nrows || n >= H) return;
    float v = 0.0f;
    for (int s = 0; s < nsplit; s++) v += part[((int64_t)s * R + r) * H + n];
    o[(int64_t)r * H + n] = v * weights[row_tk[r]];
}

template <int FMT, bool ASYNC>
static __global__ void __launch_bounds__(NTHREADS, 2) /* <= 128 registers: two blocks per SM */
    moe_down_mma_kernel(const float *h, int H, int F, const float *weights, const egk_expert_ptrs *tab, int group,
                        const int32_t *tiles, const int32_t *ntiles, const int32_t *offsets, const int32_t *row_tk,
                        float *o, float *part, int R) {
    __shared__ __align__(16) uint16_t Xh[BM][MKP];
    __shared__ __align__(16) uint16_t Xl[BM][MKP];
    __shared__ const float *xrow[BM];
    int e, r0, r1;
    if (!moe_tile(tiles, ntiles, offsets, h, F, NULL, 1, xrow, &e, &r0, &r1)) return;
    int64_t n0 = (int64_t)blockIdx.y * BN;
    egk_expert_ptrs p = tab[e];
    const void *wd[1] = {p.down}, *ws[1] = {p.down_s};
    float acc[1][2][4] = {};
    int64_t per = ((F / MK + gridDim.z - 1) / gridDim.z) * MK, kb = blockIdx.z * per, ke = min((int64_t)F, kb + per);
    mma_tile_any<FMT, ASYNC, 1>(xrow, F, kb, ke, wd, ws, H, group, n0, Xh, Xl, acc);
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int r = r0 + mma_row(q);
            int64_t n = n0 + mma_col(j, q);
            if (r >= r1 || n >= H) continue;
            if (part) part[((int64_t)blockIdx.z * R + r) * H + n] = acc[0][j][q];
            else o[(int64_t)r * H + n] = acc[0][j][q] * weights[row_tk[r]];
        }
}

/* K splits for a GEMM over K columns with TK rows: only small calls, at least 8 k-steps
 * of MK per split. */
static int moe_ksplit(const egk_moe_ws *ws, int TK, int K) {
    if (!ws->part || TK > ws->part_rows) return 1;
    int n = (K / MK) / 8;
    return n < 2 ? 1 : (n > EGK_MOE_KSPLIT ? EGK_MOE_KSPLIT : n);
}

template <int FMT, bool ASYNC>
static void moe_gemms_mma(const float *x, int H, int F, int K, int TK, int nl, const float *weights,
                          const egk_expert_ptrs *tab, int group, const egk_moe_ws *ws, int max_tiles, cudaStream_t s) {
    int k1 = moe_ksplit(ws, TK, H), k2 = moe_ksplit(ws, TK, F), R = ws->part_rows;
    const int32_t *nrows = ws->offsets + nl; /* rows of the call (local experts), on the device */
    dim3 g1((unsigned)max_tiles, egk_blocks(F, BN), (unsigned)k1), g2((unsigned)max_tiles, egk_blocks(H, BN), (unsigned)k2);
    moe_gate_up_mma_kernel<FMT, ASYNC><<<g1, NTHREADS, 0, s>>>(x, H, F, K, tab, group, ws->tiles, ws->ntiles, ws->offsets,
                                                       ws->row_tk, ws->h, k1 > 1 ? ws->part : NULL, R);
    if (k1 > 1)
        moe_gate_up_finish<<<dim3(egk_blocks(F, 256), (unsigned)TK), 256, 0, s>>>(ws->part, k1, R, F, nrows, ws->h);
    moe_down_mma_kernel<FMT, ASYNC><<<g2, NTHREADS, 0, s>>>(ws->h, H, F, weights, tab, group, ws->tiles, ws->ntiles,
                                                    ws->offsets, ws->row_tk, ws->o, k2 > 1 ? ws->part : NULL, R);
    if (k2 > 1)
        moe_down_finish<<<dim3(egk_blocks(H, 256), (unsigned)TK), 256, 0, s>>>(ws->part, k2, R, H, weights, ws->row_tk,
                                                                              nrows, ws->o);
}

template <int FMT>
static void moe_gemms(const float *x, int H, int F, int K, const float *weights, const egk_expert_ptrs *tab,
                      int group, const egk_moe_ws *ws, int max_tiles, cudaStream_t s) {
    dim3 g1((unsigned)max_tiles, egk_blocks(F, BN)), g2((unsigned)max_tiles, egk_blocks(H, BN));
    moe_gate_up_kernel<FMT><<<g1, NTHREADS, 0, s>>>(x, H, F, K, tab, group, ws->tiles, ws->ntiles, ws->offsets,
                                                   ws->row_tk, ws->h);
    moe_down_kernel<FMT><<<g2, NTHREADS, 0, s>>>(ws->h, H, F, weights, tab, group, ws->tiles, ws->ntiles,
                                                ws->offsets, ws->row_tk, ws->o);
}

extern "C" int egk_moe(const float *x, int T, int H, int F, const int32_t *ids, const float *weights, int K, int e0,
                       int e1, const egk_expert_ptrs *tab, int fmt, int group, const egk_moe_ws *ws, int path,
                       float *y, void *stream) {
    int TK = T * K, nl = e1 - e0;
    if (T <= 0 || K <= 0 || nl <= 0) return 0; /* no rows: a zero grid would be refused */
    /* The grid's tile bound. At most m = min(nl, TK) local experts have rows, and an
     * expert with c rows has ceil(c / BM) tiles, so the list holds at most
     * floor((TK + m (BM - 1)) / BM) tiles (the sum of the ceilings is at most the ceiling
     * of the sum). Sized by the experts alone (TK / BM + nl + 1), a decode step of one
     * token on Kimi (TK 8, 384 experts) launched 385 tiles' worth of blocks for at most 8
     * with work, and a block past the list's end still takes a scheduling slot. */
    int m_exp = nl < TK ? nl : TK;
    int max_tiles = (int)(((int64_t)TK + (int64_t)m_exp * (BM - 1)) / BM);
    if (TK > ws->max_rows || max_tiles > ws->max_tiles) return (int)cudaErrorInvalidValue;
    if (T > 65535) return (int)cudaErrorInvalidValue; /* the combine's grid y (the backend calls in chunks) */
    cudaStream_t s = (cudaStream_t)stream;
    size_t shm = sizeof(int32_t) * 2 * (size_t)nl;
    moe_permute_kernel<<<1, 1024, shm, s>>>(ids, TK, e0, e1, ws->row_tk, ws->rowmap, ws->offsets, ws->tiles,
                                            ws->ntiles);
    int rc = EGK_LAUNCH_RESULT();
    if (rc) return rc;
    int mma = (path == EGK_MOE_AUTO || path == EGK_MOE_REG) && H % MK == 0 && F % MK == 0 &&
              (fmt == EGK_BF16 || (fmt == EGK_INT4 && group == 32));
    if (mma && fmt == EGK_INT4 && path == EGK_MOE_AUTO)
        moe_gemms_mma<EGK_INT4, true>(x, H, F, K, TK, nl, weights, tab, group, ws, max_tiles, s);
    else if (mma && fmt == EGK_INT4)
        moe_gemms_mma<EGK_INT4, false>(x, H, F, K, TK, nl, weights, tab, group, ws, max_tiles, s);
    else if (mma) moe_gemms_mma<EGK_BF16, false>(x, H, F, K, TK, nl, weights, tab, group, ws, max_tiles, s);
    else switch (fmt) {
    case EGK_F32: moe_gemms<EGK_F32>(x, H, F, K, weights, tab, group, ws, max_tiles, s); break;
    case EGK_BF16: moe_gemms<EGK_BF16>(x, H, F, K, weights, tab, group, ws, max_tiles, s); break;
    case EGK_F16: moe_gemms<EGK_F16>(x, H, F, K, weights, tab, group, ws, max_tiles, s); break;
    case EGK_INT4: moe_gemms<EGK_INT4>(x, H, F, K, weights, tab, group, ws, max_tiles, s); break;
    case EGK_FP8: moe_gemms<EGK_FP8>(x, H, F, K, weights, tab, group, ws, max_tiles, s); break;
    default: return (int)cudaErrorInvalidValue;
    }
    rc = EGK_LAUNCH_RESULT();
    if (rc) return rc;
    moe_combine_kernel<<<dim3(egk_blocks(H, 256), (unsigned)T), 256, sizeof(int32_t) * (size_t)K, s>>>(ws->o, ws->rowmap,
                                                                                                     ids, K, H, y);
    return EGK_LAUNCH_RESULT();
}

extern "C" int egk_ep_combine(const float *back, const int32_t *tk2pair, const int32_t *ids, int T, int K, int H,
                              float *y, void *stream) {
    if (T <= 0) return 0;
    if (T > 65535) return (int)cudaErrorInvalidValue; /* the grid's y */
    moe_combine_kernel<<<dim3(egk_blocks(H, 256), (unsigned)T), 256, sizeof(int32_t) * (size_t)K, (cudaStream_t)stream>>>(
        back, tk2pair, ids, K, H, y);
    return EGK_LAUNCH_RESULT();
}
