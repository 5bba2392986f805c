/* mla.cu — MLA attention in the absorbed form over the paged BF16 latent cache.
 *
 *   prep:   cache[slot, pos] = bf16(rmsnorm(latent) * w) ++ bf16(rope(k_pe));
 *           q_pe rotated; q_nope converted to BF16 (the W_UK GEMM is cuBLAS, in the backend)
 *   attend: tensor cores, 16 heads per block where the shapes allow (below), else
 *           per (head, split, token) block, 4 warps stream the cache rows of positions
 *           [split*len, min((split+1)*len, pos+1)) with an online softmax (one cache row
 *           per warp at a time, each lane holding C/32 latent values in registers), then
 *           the warps merge; a second kernel merges the splits by log-sum-exp and writes
 *           o_lat in BF16 (+ its BF16 residual when asked) for the caller's W_UV GEMM.
 * RoPE pairs are interleaved (x[2i], x[2i+1]) with angle pos*inv_freq[i] computed in
 * FP64 and cos/sin scaled by attn_factor, exactly as the CPU backend; products that
 * feed the cache are not contracted into FMAs so both backends write the same bits. */
#include "kernels/common.cuh"

#define MLA_WARPS 4
#define MLA_MAX_SPLITS 64
#define MLA_MIN_SPLIT_LEN 256

static __device__ __forceinline__ void rot(float a0, float a1, float c, float s, float *o0, float *o1) {
    *o0 = __fsub_rn(__fmul_rn(a0, c), __fmul_rn(a1, s));
    *o1 = __fadd_rn(__fmul_rn(a0, s), __fmul_rn(a1, c));
}

static __global__ void mla_prep_kernel(egk_mla a) {
    extern __shared__ float cs[]; /* [DR/2] cos then [DR/2] sin */
    __shared__ double sh[32];
    int t = blockIdx.x, C = a.C, DR = a.DR, W = C + DR, half = DR / 2;
    float *sn = cs + half;
    int p = a.pos[t], sl = a.slot[t];
    const float *kv = a.kv + (int64_t)t * W;
    double ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += (double)kv[c] * kv[c];
    ss = egk_block_sum_d(ss, sh);
    float inv = (float)(1.0 / sqrt(ss / C + (double)a.eps));
    int blk = a.block_table[(int64_t)sl * a.max_blocks + p / a.block_size];
    uint16_t *row = a.cache + ((int64_t)blk * a.block_size + p % a.block_size) * W;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        row[c] = egk_f32_to_bf16(__fmul_rn(__fmul_rn(kv[c], inv), egk_vload(a.kv_norm.fmt, a.kv_norm.data, c)));
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double ang = (double)p * (double)a.inv_freq[i];
        cs[i] = (float)(cos(ang) * (double)a.attn_factor);
        sn[i] = (float)(sin(ang) * (double)a.attn_factor);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float o0, o1;
        rot(kv[C + 2 * i], kv[C + 2 * i + 1], cs[i], sn[i], &o0, &o1);
        row[C + 2 * i] = egk_f32_to_bf16(o0);
        row[C + 2 * i + 1] = egk_f32_to_bf16(o1);
    }
    int nhl = a.h1 - a.h0, DQ = a.DN + DR;
    for (int idx = threadIdx.x; idx < nhl * half; idx += blockDim.x) {
        int h = a.h0 + idx / half, i = idx % half;
        const float *q = a.q + ((int64_t)t * a.NH + h) * DQ + a.DN;
        float *o = a.q_pe + ((int64_t)t * a.NH + h) * DR;
        rot(q[2 * i], q[2 * i + 1], cs[i], sn[i], &o[2 * i], &o[2 * i + 1]);
    }
    for (int idx = threadIdx.x; idx < nhl * a.DN; idx += blockDim.x) {
        int h = a.h0 + idx / a.DN, d = idx % a.DN;
        int64_t off = ((int64_t)t * a.NH + h) * DQ + d;
        float v = a.q[off];
        uint16_t b = egk_f32_to_bf16(v);
        a.q_bf16[off] = b;
        if (a.q_bf16_lo) a.q_bf16_lo[off] = egk_f32_to_bf16(v - egk_bf16_to_f32(b));
    }
}

extern "C" int egk_mla_prep(const egk_mla *a, void *stream) {
    if (a->T <= 0) return 0;
    size_t shm = sizeof(float) * (size_t)(a->DR > 0 ? a->DR : 1);
    mla_prep_kernel<<<a->T, 256, shm, (cudaStream_t)stream>>>(*a);
    return EGK_LAUNCH_RESULT();
}

extern "C" int egk_mla_splits(const egk_mla *a) {
    int64_t rows = (int64_t)a->T * (a->h1 - a->h0);
    if (rows <= 0 || a->part_rows < rows) return 0;
    int64_t want = (a->max_pos + MLA_MIN_SPLIT_LEN - 1) / MLA_MIN_SPLIT_LEN;
    int64_t cap = a->part_rows / rows;
    int64_t n = want < cap ? want : cap;
    if (n > MLA_MAX_SPLITS) n = MLA_MAX_SPLITS;
    return n < 1 ? 1 : (int)n;
}

/* Partial attention of one (split, head, token). NC = latent values per lane. */
template <int NC>
static __global__ void __launch_bounds__(MLA_WARPS * 32) mla_attn_kernel(egk_mla a, int nsplit, int split_len) {
    extern __shared__ float smem[];
    int C = a.C, DR = a.DR, W = C + DR;
    float *q_s = smem, *qr_s = q_s + C, *wo = qr_s + DR, *wml = wo + MLA_WARPS * C;
    int hl = blockIdx.x, sp = blockIdx.y, t = blockIdx.z, h = a.h0 + hl, nhl = a.h1 - a.h0;
    int p = a.pos[t], sl = a.slot[t];
    int s0 = sp * split_len, s1 = min(s0 + split_len, p + 1);
    const float *ql = a.q_lat + ((int64_t)t * a.NH + h) * C;
    const float *qr = a.q_pe + ((int64_t)t * a.NH + h) * DR;
    for (int c = threadIdx.x; c < C; c += blockDim.x) q_s[c] = ql[c];
    for (int r = threadIdx.x; r < DR; r += blockDim.x) qr_s[r] = qr[r];
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float m = -INFINITY, l = 0.0f, o[NC];
#pragma unroll
    for (int j = 0; j < NC; j++) o[j] = 0.0f;
    const int32_t *bt = a.block_table + (int64_t)sl * a.max_blocks;
    for (int s = s0 + warp; s < s1; s += MLA_WARPS) {
        int blk = bt[s / a.block_size];
        const uint16_t *row = a.cache + ((int64_t)blk * a.block_size + s % a.block_size) * W;
        float lat[NC], dot = 0.0f;
#pragma unroll
        for (int j = 0; j < NC; j++) {
            int c = lane + 32 * j;
            lat[j] = c < C ? egk_bf16_to_f32(row[c]) : 0.0f;
            dot += c < C ? q_s[c] * lat[j] : 0.0f;
        }
        for (int r = lane; r < DR; r += 32) dot += qr_s[r] * egk_bf16_to_f32(row[C + r]);
        dot = egk_warp_sum(dot);
        float sc = dot * a.scale, mn = fmaxf(m, sc);
        float alpha = expf(m - mn), pe = expf(sc - mn);
        l = l * alpha + pe;
#pragma unroll
        for (int j = 0; j < NC; j++) o[j] = o[j] * alpha + pe * lat[j];
        m = mn;
    }
    if (lane == 0) {
        wml[2 * warp] = m;
        wml[2 * warp + 1] = l;
    }
#pragma unroll
    for (int j = 0; j < NC; j++) {
        int c = lane + 32 * j;
        if (c < C) wo[warp * C + c] = o[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < MLA_WARPS; w++) M = fmaxf(M, wml[2 * w]);
    float fac[MLA_WARPS], L = 0.0f;
    for (int w = 0; w < MLA_WARPS; w++) {
        fac[w] = (M == -INFINITY || wml[2 * w + 1] == 0.0f) ? 0.0f : expf(wml[2 * w] - M);
        L += wml[2 * w + 1] * fac[w];
    }
    int64_t pr = ((int64_t)t * nhl + hl) * nsplit + sp;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < MLA_WARPS; w++) v += wo[w * C + c] * fac[w];
        a.part_o[pr * C + c] = v;
    }
    if (threadIdx.x == 0) {
        a.part_ml[2 * pr] = M;
        a.part_ml[2 * pr + 1] = L;
    }
}

/* ---- tensor-core attention: 16 heads per block ------------------------------------- */
/* Block (head group of 16, split, token), 4 warps, tiles of ROWS cache rows (32 where
 * two 86 KB blocks fit an SM, as on sm_90; 16 elsewhere, 43 KB, two blocks per SM on
 * sm_120's 100 KB). The cache streams through two shared-memory buffers with cp.async:
 * tile i + 1 is in flight while tile i is computed, each byte read once for the 16 heads.
 *   S = Q K^T on tensor cores: warp w owns a quarter of the k-steps of the row (Kimi:
 *       9 of 36), its Q fragments (BF16 hi + lo) live in registers for the whole
 *       split, and it scores all ROWS rows for the 16 heads; the four partial scores
 *       are added in warp order (fixed: the result does not depend on scheduling);
 *   online softmax per head in FP32, 8 lanes per head (shuffle max and sum), P = exp(S - m)
 *       as BF16 hi + lo; each head's running max and sum stay in its 8 lanes' registers;
 *   O = O * alpha + P V on tensor cores: warp w owns latent columns [w C/4, (w+1) C/4).
 * The partial (O, max, sum) rows have the CUDA-core kernel's layout and meaning, so the
 * same combine kernel merges the splits. */
#define TC_HEADS 16
#define TC_WARPS 4
#define TC_MAX_NT 16 /* PV: 8-column tiles per warp, C <= 4 * 8 * 16 = 512 */
#define TC_MAX_KQ 9  /* scores: k-steps of 16 per warp, C + DR <= 4 * 9 * 16 = 576 */

static __device__ __forceinline__ uint32_t tc_pack(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* W rounded up to the mma's k of 16; the padding columns are zeros in Q and K. */
static __host__ __device__ __forceinline__ int tc_wp(int W) { return (W + 15) & ~15; }

/* Shared memory: Kt [2][ROWS][ldq] bf16, partial scores [TC_WARPS][TC_HEADS][ROWS + 1]
 * f32, P hi and lo [TC_HEADS][ROWS + 8] bf16 each, alpha [TC_HEADS] f32. */
static size_t tc_smem_bytes(int W, int rows) {
    size_t ldq = (size_t)tc_wp(W) + 8;
    return sizeof(uint16_t) * (2 * (size_t)rows * ldq + 2 * TC_HEADS * (size_t)(rows + 8)) +
           sizeof(float) * (TC_WARPS * TC_HEADS * (size_t)(rows + 1) + TC_HEADS);
}

/* Start copying cache rows [r0, r0 + ROWS) of the split (zeros past s1 and in the
 * padding columns: P V multiplies every row, and a stale NaN times P = 0 is NaN) into Kt,
 * as one cp.async group. 16-byte copies where rows are 16-byte multiples (Kimi: 72 per
 * row), else 4-byte ones (W is even on this path). */
template <int E> /* halves per copy: 8 (16 bytes) or 2 (4 bytes) */
static __device__ __forceinline__ void tc_copy_rows(const egk_mla &a, const int32_t *bt, int r0, int s1, int rows,
                                                    uint16_t *Kt, int W, int Wp, int ldq) {
    for (int i = threadIdx.x; i < rows * (Wp / E); i += blockDim.x) {
        int r = i / (Wp / E), q = i % (Wp / E), s = r0 + r;
        uint16_t *dst = Kt + r * ldq + E * q;
        if (s < s1 && E * q < W) {
            const uint16_t *src = a.cache + ((int64_t)bt[s / a.block_size] * a.block_size + s % a.block_size) * W + E * q;
            if (E == 8) egk_cp_async16(dst, src);
            else egk_cp_async4(dst, src);
        } else if (E == 8) {
            *(uint4 *)dst = make_uint4(0u, 0u, 0u, 0u);
        } else {
            *(uint32_t *)dst = 0u;
        }
    }
}
static __device__ __forceinline__ void tc_load_tile(const egk_mla &a, const int32_t *bt, int r0, int s1, int rows,
                                                    uint16_t *Kt, int W, int Wp, int ldq) {
    if ((W & 7) == 0) tc_copy_rows<8>(a, bt, r0, s1, rows, Kt, W, Wp, ldq);
    else tc_copy_rows<2>(a, bt, r0, s1, rows, Kt, W, Wp, ldq);
    egk_cp_async_commit();
}

/* Query value (head hh of the group, column c of the padded row), 0 outside. */
static __device__ __forceinline__ float tc_q(const egk_mla &a, int t, int hg, int hh, int c) {
    int hl = hg * TC_HEADS + hh, nhl = a.h1 - a.h0, h = a.h0 + hl;
    if (hl >= nhl || c >= a.C + a.DR) return 0.0f;
    return c < a.C ? a.q_lat[((int64_t)t * a.NH + h) * a.C + c] : a.q_pe[((int64_t)t * a.NH + h) * a.DR + c - a.C];
}

template <int ROWS>
static __global__ void __launch_bounds__(TC_WARPS * 32) mla_attn_tc_kernel(egk_mla a, int nsplit, int split_len) {
    constexpr int NS = ROWS / 8;   /* score n-tiles per warp (all rows) */
    constexpr int KP = ROWS / 16;  /* P V k-steps per tile */
    constexpr int PC = ROWS / 8;   /* softmax columns per lane */
    extern __shared__ float smem[];
    const int C = a.C, DR = a.DR, W = C + DR, Wp = tc_wp(W), ldq = Wp + 8, ldp = ROWS + 8;
    uint16_t *Kbuf = (uint16_t *)smem;
    float *Sp = (float *)(Kbuf + 2 * ROWS * ldq);
    uint16_t *Ph = (uint16_t *)(Sp + TC_WARPS * TC_HEADS * (ROWS + 1)), *Pl = Ph + TC_HEADS * ldp;
    float *alpha = (float *)(Pl + TC_HEADS * ldp);
    int hg = blockIdx.x, sp = blockIdx.y, t = blockIdx.z, nhl = a.h1 - a.h0;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    int p = a.pos[t], sl = a.slot[t];
    int s0 = sp * split_len, s1 = min(s0 + split_len, p + 1);
    const int32_t *bt = a.block_table + (int64_t)sl * a.max_blocks;
    int ntiles = s1 > s0 ? (s1 - s0 + ROWS - 1) / ROWS : 0;
    if (ntiles > 0) tc_load_tile(a, bt, s0, s1, ROWS, Kbuf, W, Wp, ldq);

    /* this warp's k-steps [kb, kb + nk) and their Q fragments, BF16 hi + lo */
    const int KS = Wp / 16, KQ = (KS + TC_WARPS - 1) / TC_WARPS, kb = warp * KQ;
    const int nk = KS - kb < KQ ? (KS - kb > 0 ? KS - kb : 0) : KQ;
    uint32_t qh[TC_MAX_KQ][4], ql[TC_MAX_KQ][4];
#pragma unroll
    for (int kk = 0; kk < TC_MAX_KQ; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint16_t h2[2] = {0, 0}, l2[2] = {0, 0};
            if (kk < nk) {
                int hh = g + (i & 1) * 8, c = 16 * (kb + kk) + 2 * t4 + (i >= 2 ? 8 : 0);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float v = tc_q(a, t, hg, hh, c + e);
                    h2[e] = egk_f32_to_bf16(v);
                    l2[e] = egk_f32_to_bf16(v - egk_bf16_to_f32(h2[e]));
                }
            }
            qh[kk][i] = tc_pack(h2[0], h2[1]);
            ql[kk][i] = tc_pack(l2[0], l2[1]);
        }

    const int NT = C / (8 * TC_WARPS), c0 = warp * (C / TC_WARPS);
    const int hs = tid >> 3, js = (tid & 7) * PC; /* softmax: head hs, columns [js, js + PC) */
    float m_run = -INFINITY, l_run = 0.0f;        /* head hs, the same in its 8 lanes */
    float o[TC_MAX_NT][4];
#pragma unroll
    for (int j = 0; j < TC_MAX_NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    for (int it = 0; it < ntiles; it++) {
        int r0 = s0 + it * ROWS;
        const uint16_t *Kt = Kbuf + (it & 1) * ROWS * ldq;
        if (it + 1 < ntiles) { /* the other buffer was last read before the previous barrier */
            tc_load_tile(a, bt, r0 + ROWS, s1, ROWS, Kbuf + ((it + 1) & 1) * ROWS * ldq, W, Wp, ldq);
            egk_cp_async_wait<1>();
        } else {
            egk_cp_async_wait<0>();
        }
        __syncthreads(); /* tile it has landed for every thread */
        float sc[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < TC_MAX_KQ; kk++) {
            if (kk >= nk) break;
            int k = 16 * (kb + kk) + 2 * t4;
#pragma unroll
            for (int n = 0; n < NS; n++) { /* B = K^T: element (k, row 8n + g) */
                const uint16_t *kr = Kt + (8 * n + g) * ldq + k;
                uint32_t b[2] = {*(const uint32_t *)kr, *(const uint32_t *)(kr + 8)};
                egk_mma_bf16_16816(sc[n], qh[kk], b);
                egk_mma_bf16_16816(sc[n], ql[kk], b);
            }
        }
        float *sw = Sp + warp * TC_HEADS * (ROWS + 1);
#pragma unroll
        for (int n = 0; n < NS; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sw[(g + (e >= 2 ? 8 : 0)) * (ROWS + 1) + 8 * n + 2 * t4 + (e & 1)] = sc[n][e];
        __syncthreads();
        {
            float sv[PC], mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < PC; j++) {
                int col = js + j;
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < TC_WARPS; w++) v += Sp[(w * TC_HEADS + hs) * (ROWS + 1) + col];
                sv[j] = r0 + col < s1 ? v * a.scale : -INFINITY;
                mx = fmaxf(mx, sv[j]);
            }
            /* xor butterflies inside the head's 8 lanes: every lane ends with the same bits */
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            float mn = fmaxf(m_run, mx), sum = 0.0f;
#pragma unroll
            for (int j = 0; j < PC; j++) {
                float pe = sv[j] == -INFINITY ? 0.0f : expf(sv[j] - mn);
                sum += pe;
                uint16_t hb = egk_f32_to_bf16(pe);
                Ph[hs * ldp + js + j] = hb;
                Pl[hs * ldp + js + j] = egk_f32_to_bf16(pe - egk_bf16_to_f32(hb));
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            float al_ = expf(m_run - mn); /* 0 on the first tile (m_run = -inf) */
            l_run = l_run * al_ + sum;
            m_run = mn;
            if ((tid & 7) == 0) alpha[hs] = al_;
        }
        __syncthreads();
        float a0 = alpha[g], a8 = alpha[g + 8];
        /* A = P (16 heads x 16 rows per k-step) and B = V (16 rows x 8 latent columns) by
         * ldmatrix: lane 8i + r addresses row r of 8x8 tile i */
        const int li = lane >> 3, lr = lane & 7;
        uint32_t ph[KP][4], pl[KP][4];
#pragma unroll
        for (int ks = 0; ks < KP; ks++) {
            int off = (lr + 8 * (li & 1)) * ldp + 16 * ks + 8 * (li >> 1);
            egk_ldmatrix<4, false>(ph[ks], Ph + off);
            egk_ldmatrix<4, false>(pl[ks], Pl + off);
        }
        const uint16_t *vrow = Kt + (lr + 8 * (li & 1)) * ldq + c0;
#pragma unroll
        for (int j = 0; j < TC_MAX_NT; j++) {
            if (j >= NT) break;
            o[j][0] *= a0;
            o[j][1] *= a0;
            o[j][2] *= a8;
            o[j][3] *= a8;
#pragma unroll
            for (int ks = 0; ks < KP; ks++) {
                uint32_t b[2];
                egk_ldmatrix<2, true>(b, vrow + 16 * ks * ldq + 8 * j);
                egk_mma_bf16_16816(o[j], ph[ks], b);
                egk_mma_bf16_16816(o[j], pl[ks], b);
            }
        }
        __syncthreads(); /* Kt, Sp, P and alpha of this tile are no longer read */
    }
#pragma unroll
    for (int j = 0; j < TC_MAX_NT; j++) {
        if (j >= NT) break;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int hl = hg * TC_HEADS + g + (e >= 2 ? 8 : 0), c = c0 + 8 * j + 2 * t4 + (e & 1);
            if (hl < nhl) a.part_o[(((int64_t)t * nhl + hl) * nsplit + sp) * C + c] = o[j][e];
        }
    }
    if ((tid & 7) == 0 && hg * TC_HEADS + hs < nhl) {
        int64_t pr = ((int64_t)t * nhl + hg * TC_HEADS + hs) * nsplit + sp;
        a.part_ml[2 * pr] = m_run;
        a.part_ml[2 * pr + 1] = l_run;
    }
}

/* Merge the splits of one (head, token) and write o_lat in BF16. */
static __global__ void mla_combine_kernel(egk_mla a, int nsplit) {
    __shared__ float fac[MLA_MAX_SPLITS];
    __shared__ float invL;
    int hl = blockIdx.x, t = blockIdx.y, h = a.h0 + hl, nhl = a.h1 - a.h0, C = a.C;
    int64_t base = ((int64_t)t * nhl + hl) * nsplit;
    if (threadIdx.x == 0) {
        float M = -INFINITY, L = 0.0f;
        for (int s = 0; s < nsplit; s++) M = fmaxf(M, a.part_ml[2 * (base + s)]);
        for (int s = 0; s < nsplit; s++) {
            float ls = a.part_ml[2 * (base + s) + 1];
            fac[s] = (M == -INFINITY || ls == 0.0f) ? 0.0f : expf(a.part_ml[2 * (base + s)] - M);
            L += ls * fac[s];
        }
        invL = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    int64_t row = ((int64_t)t * a.NH + h) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < nsplit; s++) v += a.part_o[(base + s) * C + c] * fac[s];
        v *= invL;
        uint16_t b = egk_f32_to_bf16(v);
        a.o_lat[row + c] = b;
        if (a.o_lat_lo) a.o_lat_lo[row + c] = egk_f32_to_bf16(v - egk_bf16_to_f32(b));
    }
}

/* The tensor-core kernel's tile rows for this call and device in *rows, 0 where it does
 * not apply (the CUDA-core kernel runs): 32 where two such blocks fit in an SM's shared
 * memory (sm_90: 228 KB), else 16 (sm_120: 100 KB), unless a->tile_rows forces one.
 * Returns the failing runtime call's error, if any. */
static cudaError_t tc_rows(const egk_mla *a, int *rows) {
    int W = a->C + a->DR;
    *rows = 0;
    if (a->simt || a->C % (8 * TC_WARPS) || a->C > 8 * TC_WARPS * TC_MAX_NT || W % 2 ||
        tc_wp(W) > 16 * TC_WARPS * TC_MAX_KQ)
        return cudaSuccess;
    int dev = 0, per_block = 0, per_sm = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    if (e != cudaSuccess) return e;
    const size_t reserved = 1024; /* the runtime's per-block share (sm_80 and later) */
    if (a->tile_rows == 16 || a->tile_rows == 32)
        *rows = tc_smem_bytes(W, a->tile_rows) <= (size_t)per_block ? a->tile_rows : 0;
    else if (2 * (tc_smem_bytes(W, 32) + reserved) <= (size_t)per_sm && tc_smem_bytes(W, 32) <= (size_t)per_block)
        *rows = 32;
    else
        *rows = tc_smem_bytes(W, 16) <= (size_t)per_block ? 16 : 0;
    return cudaSuccess;
}

extern "C" int egk_mla_attend(const egk_mla *a, void *stream) {
    int nhl = a->h1 - a->h0;
    if (a->T <= 0 || nhl <= 0) return 0;
    if (a->T > 65535 || nhl > 65535 || a->C > 32 * 32) return (int)cudaErrorInvalidValue;
    int nsplit = egk_mla_splits(a);
    if (nsplit < 1) return (int)cudaErrorInvalidValue;
    int split_len = (a->max_pos + nsplit - 1) / nsplit;
    if (split_len < 1) split_len = 1;
    cudaStream_t s = (cudaStream_t)stream;
    int W = a->C + a->DR;
    int rows = 0;
    cudaError_t re = tc_rows(a, &rows);
    if (re != cudaSuccess) return (int)re;
    if (rows > 0) {
        size_t shm = tc_smem_bytes(W, rows);
        cudaError_t e = rows == 32 ? egk_smem_opt_in(mla_attn_tc_kernel<32>, shm, s)
                                    : egk_smem_opt_in(mla_attn_tc_kernel<16>, shm, s);
        if (e != cudaSuccess) return (int)e;
        dim3 grid((unsigned)((nhl + TC_HEADS - 1) / TC_HEADS), (unsigned)nsplit, (unsigned)a->T);
        if (rows == 32) mla_attn_tc_kernel<32><<<grid, TC_WARPS * 32, shm, s>>>(*a, nsplit, split_len);
        else mla_attn_tc_kernel<16><<<grid, TC_WARPS * 32, shm, s>>>(*a, nsplit, split_len);
        int rc = EGK_LAUNCH_RESULT();
        if (rc) return rc;
        mla_combine_kernel<<<dim3((unsigned)nhl, (unsigned)a->T), 128, 0, s>>>(*a, nsplit);
        return EGK_LAUNCH_RESULT();
    }
    /* heads vary fastest: the blocks of all heads of one (split, token) run together and
     * read the same cache rows, so those come from HBM once and from L2 for the other heads */
    dim3 grid((unsigned)nhl, (unsigned)nsplit, (unsigned)a->T);
    size_t shm = sizeof(float) * ((size_t)a->C * (1 + MLA_WARPS) + (size_t)a->DR + 2 * MLA_WARPS);
    if (a->C <= 128) mla_attn_kernel<4><<<grid, MLA_WARPS * 32, shm, s>>>(*a, nsplit, split_len);
    else if (a->C <= 256) mla_attn_kernel<8><<<grid, MLA_WARPS * 32, shm, s>>>(*a, nsplit, split_len);
    else if (a->C <= 512) mla_attn_kernel<16><<<grid, MLA_WARPS * 32, shm, s>>>(*a, nsplit, split_len);
    else mla_attn_kernel<32><<<grid, MLA_WARPS * 32, shm, s>>>(*a, nsplit, split_len);
    int rc = EGK_LAUNCH_RESULT();
    if (rc) return rc;
    mla_combine_kernel<<<dim3((unsigned)nhl, (unsigned)a->T), 128, 0, s>>>(*a, nsplit);
    return EGK_LAUNCH_RESULT();
}
