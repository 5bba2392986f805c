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
/* Block (head group of 16, split, token), 4 warps. Per tile of TC_ROWS cache rows (BF16
 * straight from the cache into shared memory, read once for the 16 heads):
 *   S = Q K^T on tensor cores: warp w scores rows 8w..8w+7 for the 16 heads (m16n8k16,
 *       Q as BF16 hi + lo, the cache exact), masked past the split's end;
 *   online softmax per head in FP32 (16 threads), P = exp(S - m) as BF16 hi + lo;
 *   O = O * alpha + P V on tensor cores: warp w owns latent columns [w C/4, (w+1) C/4).
 * The partial (O, max, sum) rows have the CUDA-core kernel's layout and meaning, so the
 * same combine kernel merges the splits. */
#define TC_HEADS 16
#define TC_ROWS 32
#define TC_WARPS 4
#define TC_MAX_NT 16 /* 8-column tiles per warp: C <= 4 * 8 * 16 = 512 */

static __device__ __forceinline__ uint32_t tc_pack(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

/* W rounded up to the mma's k of 16; the padding columns are zeros in Q and K. */
static __host__ __device__ __forceinline__ int tc_wp(int W) { return (W + 15) & ~15; }

static size_t tc_smem_bytes(int W) {
    size_t ldq = (size_t)tc_wp(W) + 8;
    return sizeof(uint16_t) * (2 * TC_HEADS * ldq + TC_ROWS * ldq + 2 * TC_HEADS * (TC_ROWS + 8)) +
           sizeof(float) * (TC_HEADS * (TC_ROWS + 1) + 3 * TC_HEADS);
}

static __global__ void __launch_bounds__(TC_WARPS * 32) mla_attn_tc_kernel(egk_mla a, int nsplit, int split_len) {
    extern __shared__ float smem[];
    const int C = a.C, DR = a.DR, W = C + DR, Wp = tc_wp(W), ldq = Wp + 8, ldp = TC_ROWS + 8;
    uint16_t *Qh = (uint16_t *)smem, *Ql = Qh + TC_HEADS * ldq, *Kt = Ql + TC_HEADS * ldq;
    uint16_t *Ph = Kt + TC_ROWS * ldq, *Pl = Ph + TC_HEADS * ldp;
    float *S = (float *)(Pl + TC_HEADS * ldp), *mrun = S + TC_HEADS * (TC_ROWS + 1), *lrun = mrun + TC_HEADS,
          *alpha = lrun + TC_HEADS;
    int hg = blockIdx.x, sp = blockIdx.y, t = blockIdx.z, nhl = a.h1 - a.h0;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    int p = a.pos[t], sl = a.slot[t];
    int s0 = sp * split_len, s1 = min(s0 + split_len, p + 1);
    /* queries of the group's heads (zero rows past h1) as BF16 hi + lo */
    for (int i = tid; i < TC_HEADS * Wp; i += blockDim.x) {
        int hh = i / Wp, c = i % Wp, hl = hg * TC_HEADS + hh, h = a.h0 + hl;
        float v = 0.0f;
        if (hl < nhl && c < W) v = c < C ? a.q_lat[((int64_t)t * a.NH + h) * C + c] : a.q_pe[((int64_t)t * a.NH + h) * DR + c - C];
        uint16_t hb = egk_f32_to_bf16(v);
        Qh[hh * ldq + c] = hb;
        Ql[hh * ldq + c] = egk_f32_to_bf16(v - egk_bf16_to_f32(hb));
    }
    if (tid < TC_HEADS) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.0f;
    }
    const int NT = C / (8 * TC_WARPS), c0 = warp * (C / TC_WARPS);
    float o[TC_MAX_NT][4];
#pragma unroll
    for (int j = 0; j < TC_MAX_NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    const int32_t *bt = a.block_table + (int64_t)sl * a.max_blocks;
    for (int r0 = s0; r0 < s1; r0 += TC_ROWS) {
        __syncthreads(); /* the previous tile's Kt, S and P are no longer read */
        if ((W & 7) == 0) { /* 16-byte loads and stores (Kimi: 72 per row) */
            for (int i = tid; i < TC_ROWS * (Wp / 8); i += blockDim.x) {
                int r = i / (Wp / 8), q = i % (Wp / 8), s = r0 + r;
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (s < s1 && 8 * q < W) {
                    int blk = bt[s / a.block_size];
                    v = ((const uint4 *)(a.cache + ((int64_t)blk * a.block_size + s % a.block_size) * W))[q];
                }
                *(uint4 *)(Kt + r * ldq + 8 * q) = v;
            }
        } else {
            for (int i = tid; i < TC_ROWS * (Wp / 2); i += blockDim.x) {
                int r = i / (Wp / 2), q = i % (Wp / 2), s = r0 + r;
                uint32_t two = 0;
                if (s < s1 && 2 * q < W) {
                    int blk = bt[s / a.block_size];
                    two = ((const uint32_t *)(a.cache + ((int64_t)blk * a.block_size + s % a.block_size) * W))[q];
                }
                Kt[r * ldq + 2 * q] = (uint16_t)(two & 0xffffu);
                Kt[r * ldq + 2 * q + 1] = (uint16_t)(two >> 16);
            }
        }
        __syncthreads();
        /* scores: warp w, cache rows 8w + g (B) for heads g, g + 8 (A) */
        float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = 0; k < Wp; k += 16) {
            const uint16_t *q0 = Qh + g * ldq + k, *q8 = Qh + (g + 8) * ldq + k;
            const uint16_t *l0 = Ql + g * ldq + k, *l8 = Ql + (g + 8) * ldq + k;
            uint32_t ah[4] = {tc_pack(q0[2 * t4], q0[2 * t4 + 1]), tc_pack(q8[2 * t4], q8[2 * t4 + 1]),
                              tc_pack(q0[2 * t4 + 8], q0[2 * t4 + 9]), tc_pack(q8[2 * t4 + 8], q8[2 * t4 + 9])};
            uint32_t al[4] = {tc_pack(l0[2 * t4], l0[2 * t4 + 1]), tc_pack(l8[2 * t4], l8[2 * t4 + 1]),
                              tc_pack(l0[2 * t4 + 8], l0[2 * t4 + 9]), tc_pack(l8[2 * t4 + 8], l8[2 * t4 + 9])};
            const uint16_t *kr = Kt + (warp * 8 + g) * ldq + k;
            uint32_t b[2] = {tc_pack(kr[2 * t4], kr[2 * t4 + 1]), tc_pack(kr[2 * t4 + 8], kr[2 * t4 + 9])};
            egk_mma_bf16_16816(sc, ah, b);
            egk_mma_bf16_16816(sc, al, b);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int hh = g + (e >= 2 ? 8 : 0), col = warp * 8 + 2 * t4 + (e & 1);
            S[hh * (TC_ROWS + 1) + col] = r0 + col < s1 ? sc[e] * a.scale : -INFINITY;
        }
        __syncthreads();
        if (tid < TC_HEADS) { /* online softmax of head tid over this tile */
            float *srow = S + tid * (TC_ROWS + 1), mx = -INFINITY;
            for (int j = 0; j < TC_ROWS; j++) mx = fmaxf(mx, srow[j]);
            float mo = mrun[tid], mn = fmaxf(mo, mx), sum = 0.0f;
            for (int j = 0; j < TC_ROWS; j++) {
                float pe = srow[j] == -INFINITY ? 0.0f : expf(srow[j] - mn);
                sum += pe;
                uint16_t hb = egk_f32_to_bf16(pe);
                Ph[tid * ldp + j] = hb;
                Pl[tid * ldp + j] = egk_f32_to_bf16(pe - egk_bf16_to_f32(hb));
            }
            float al_ = expf(mo - mn); /* 0 on the first tile (mo = -inf) */
            lrun[tid] = lrun[tid] * al_ + sum;
            mrun[tid] = mn;
            alpha[tid] = al_;
        }
        __syncthreads();
        float a0 = alpha[g], a8 = alpha[g + 8];
        uint32_t ph[2][4], pl[2][4];
#pragma unroll
        for (int ks = 0; ks < 2; ks++) {
            const uint16_t *p0 = Ph + g * ldp + 16 * ks, *p8 = Ph + (g + 8) * ldp + 16 * ks;
            const uint16_t *m0 = Pl + g * ldp + 16 * ks, *m8 = Pl + (g + 8) * ldp + 16 * ks;
            ph[ks][0] = tc_pack(p0[2 * t4], p0[2 * t4 + 1]);
            ph[ks][1] = tc_pack(p8[2 * t4], p8[2 * t4 + 1]);
            ph[ks][2] = tc_pack(p0[2 * t4 + 8], p0[2 * t4 + 9]);
            ph[ks][3] = tc_pack(p8[2 * t4 + 8], p8[2 * t4 + 9]);
            pl[ks][0] = tc_pack(m0[2 * t4], m0[2 * t4 + 1]);
            pl[ks][1] = tc_pack(m8[2 * t4], m8[2 * t4 + 1]);
            pl[ks][2] = tc_pack(m0[2 * t4 + 8], m0[2 * t4 + 9]);
            pl[ks][3] = tc_pack(m8[2 * t4 + 8], m8[2 * t4 + 9]);
        }
#pragma unroll
        for (int j = 0; j < TC_MAX_NT; j++) {
            if (j >= NT) break;
            o[j][0] *= a0;
            o[j][1] *= a0;
            o[j][2] *= a8;
            o[j][3] *= a8;
            int c = c0 + 8 * j + g; /* B = V: element (k = cache row, n = latent column c) */
#pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                int k = 16 * ks + 2 * t4;
                uint32_t b[2] = {tc_pack(Kt[k * ldq + c], Kt[(k + 1) * ldq + c]),
                                 tc_pack(Kt[(k + 8) * ldq + c], Kt[(k + 9) * ldq + c])};
                egk_mma_bf16_16816(o[j], ph[ks], b);
                egk_mma_bf16_16816(o[j], pl[ks], b);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < TC_MAX_NT; j++) {
        if (j >= NT) break;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int hl = hg * TC_HEADS + g + (e >= 2 ? 8 : 0), c = c0 + 8 * j + 2 * t4 + (e & 1);
            if (hl < nhl) a.part_o[(((int64_t)t * nhl + hl) * nsplit + sp) * C + c] = o[j][e];
        }
    }
    if (tid < TC_HEADS && hg * TC_HEADS + tid < nhl) {
        int64_t pr = ((int64_t)t * nhl + hg * TC_HEADS + tid) * nsplit + sp;
        a.part_ml[2 * pr] = mrun[tid];
        a.part_ml[2 * pr + 1] = lrun[tid];
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
    if (!a->simt && a->C % (8 * TC_WARPS) == 0 && a->C <= 8 * TC_WARPS * TC_MAX_NT && W % 2 == 0) {
        size_t shm = tc_smem_bytes(W);
        /* the opt-in above 48 KB of shared memory: per device, so set at every launch (a
         * host-side attribute write, no synchronisation) rather than cached; not while the
         * stream is recorded (the same shape ran, and set it, before any recording) */
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cudaError_t e = cudaStreamIsCapturing(s, &cs);
        if (e == cudaSuccess && cs == cudaStreamCaptureStatusNone)
            e = cudaFuncSetAttribute(mla_attn_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
        if (e != cudaSuccess) return (int)e;
        dim3 grid((unsigned)((nhl + TC_HEADS - 1) / TC_HEADS), (unsigned)nsplit, (unsigned)a->T);
        mla_attn_tc_kernel<<<grid, TC_WARPS * 32, shm, s>>>(*a, nsplit, split_len);
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
