/* ep.cu — index work of the expert-parallel row exchange (engine/collective_nccl.c):
 * group a rank's (token, k) pairs by the rank owning their expert, and add the returned
 * contributions in ascending expert id. No model logic: ids, weights and rows only. See
 * eg_cuda.h. */
#include "kernels/common.cuh"

#define EP_NT 64 /* threads per block; each takes a contiguous run of tokens */

/* The rank owning expert e of a call over [lo, lo + n): the even split of the range
 * (rank r from lo + floor(r n / R)), -1 outside the range. */
static __device__ __forceinline__ int ep_owner(int e, int lo, int n, int R) {
    if (e < lo || e >= lo + n) return -1;
    return (int)(((int64_t)(e - lo + 1) * R - 1) / n);
}

/* Block q (one per destination rank): the rows (tokens with at least one expert in q's
 * range, in token order) and pairs ((t, k) with the expert in q's range, in (t, k) order)
 * that go to q, placed after those of ranks < q. Block 0 also marks the pairs outside the
 * call's range (tk2pair -1: no owner, not combined). */
static __global__ void ep_pack_kernel(const int32_t *ids, const float *w, int T, int K, int R, int lo, int n, int rank,
                                      int layer, int left, int32_t *counts, int32_t *sendtok, int32_t *meta,
                                      int32_t *tk2pair) {
    __shared__ int s_rb[EP_NT], s_pb[EP_NT], s_r[EP_NT], s_p[EP_NT];
    __shared__ int s_tot[4]; /* rows before q, pairs before q, rows of q, pairs of q */
    int q = blockIdx.x, tid = threadIdx.x;
    int ch = (T + EP_NT - 1) / EP_NT, t0 = tid * ch, t1 = t0 + ch < T ? t0 + ch : T;
    int rb = 0, pb = 0, nr = 0, np = 0;
    for (int t = t0; t < t1; t++) {
        int c = 0;
        for (int k = 0; k < K; k++) {
            int d = ep_owner(ids[t * K + k], lo, n, R);
            if (d == q) c++;
            if (d >= 0 && d < q) {
                pb++;
                int seen = 0;
                for (int j = 0; j < k; j++) seen |= ep_owner(ids[t * K + j], lo, n, R) == d;
                rb += !seen;
            }
        }
        nr += c > 0;
        np += c;
    }
    s_rb[tid] = rb;
    s_pb[tid] = pb;
    s_r[tid] = nr;
    s_p[tid] = np;
    __syncthreads();
    if (tid == 0) {
        int a = 0, b = 0, r = 0, p = 0;
        for (int i = 0; i < EP_NT; i++) {
            a += s_rb[i];
            b += s_pb[i];
            int x = s_r[i], y = s_p[i];
            s_r[i] = r; /* exclusive prefix */
            s_p[i] = p;
            r += x;
            p += y;
        }
        s_tot[0] = a;
        s_tot[1] = b;
        s_tot[2] = r;
        s_tot[3] = p;
        int32_t v[4] = {r, p, layer, left};
        for (int i = 0; i < 4; i++) {
            counts[q * 4 + i] = v[i];
            if (q == rank) counts[(R + q) * 4 + i] = v[i]; /* what this rank "receives" from itself */
        }
    }
    __syncthreads();
    int base_r = s_tot[0], base_p = s_tot[1], n_p = s_tot[3];
    int32_t *m_row = meta + 3 * base_p, *m_id = m_row + n_p;
    float *m_w = (float *)(m_id + n_p);
    int rp = s_r[tid], pp = s_p[tid];
    for (int t = t0; t < t1; t++) {
        int any = 0;
        for (int k = 0; k < K; k++) {
            int e = ids[t * K + k], d = ep_owner(e, lo, n, R);
            if (d < 0 && q == 0) tk2pair[t * K + k] = -1;
            if (d != q) continue;
            any = 1;
            m_row[pp] = rp;
            m_id[pp] = e;
            m_w[pp] = w[t * K + k];
            tk2pair[t * K + k] = base_p + pp;
            pp++;
        }
        if (any) sendtok[base_r + rp++] = t;
    }
}

extern "C" int egk_ep_pack(const int32_t *ids, const float *weights, int T, int K, int R, int lo, int n, int rank,
                           int layer, int left, int32_t *counts, int32_t *sendtok, int32_t *meta, int32_t *tk2pair,
                           void *stream) {
    if (R <= 0 || n <= 0 || lo < 0 || K <= 0 || T < 0) return (int)cudaErrorInvalidValue;
    ep_pack_kernel<<<R, EP_NT, 0, (cudaStream_t)stream>>>(ids, weights, T, K, R, lo, n, rank, layer, left, counts,
                                                          sendtok, meta, tk2pair);
    return EGK_LAUNCH_RESULT();
}

/* egk_ep_combine is the MoE op's own combine (kernels/gemm.cu): one kernel for both. */
