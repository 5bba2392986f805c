/* sample.cu — token sampling on the device, the algorithm of eg_sample_row
 * (engine/sampler.c): greedy = lowest id among equal maxima; otherwise candidates
 * sorted by (logit desc, id asc) with a stable segmented radix sort (CUB), top_k cut,
 * softmax at temperature in FP64, top_p cut at the first prefix whose mass reaches
 * top_p of the total, then the first candidate whose cumulative mass exceeds u * kept
 * mass. The uniform u is drawn on the host from the row's RNG state, so RNG states
 * advance exactly as on the CPU. Prefix sums here are parallel (FP64) where the CPU's
 * are sequential: a draw can differ only when u falls within ~1e-15 of a boundary. */
#include <cub/cub.cuh>

#include "kernels/common.cuh"

#include <limits.h>

#define SAMPLE_THREADS 1024

static __global__ void argmax_kernel(const float *logits, int V, int32_t *out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *row = logits + (int64_t)blockIdx.x * V;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = row[j];
        if (bi == INT_MAX || v > bv) {
            bv = v;
            bi = j;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < (int)(blockDim.x >> 5); i++)
            if (si[i] != INT_MAX && (bi == INT_MAX || sv[i] > bv || (sv[i] == bv && si[i] < bi))) {
                bv = sv[i];
                bi = si[i];
            }
        out[blockIdx.x] = bi == INT_MAX ? 0 : bi;
    }
}

static __global__ void iota_kernel(int N, int V, int32_t *ids, int32_t *offsets) {
    int64_t n = (int64_t)N * V;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ids[i] = (int32_t)(i % V);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= N; i += (int64_t)gridDim.x * blockDim.x)
        offsets[i] = (int32_t)(i * V);
}

typedef cub::BlockScan<double, SAMPLE_THREADS> block_scan;

struct scan_state {
    block_scan::TempStorage ts;
    double carry, found_cum;
    int found;
};

/* First j < n whose inclusive prefix sum of exp((v[j]-mx)/temp) is >= lim (ge = 1) or
 * > lim (ge = 0); -1 when none. *at = that prefix; *end = the prefix over all n. */
static __device__ int first_prefix(const float *v, int n, double mx, double temp, double lim, int ge, scan_state *st,
                                   double *at, double *end) {
    int tid = threadIdx.x;
    if (tid == 0) {
        st->carry = 0;
        st->found = INT_MAX;
    }
    __syncthreads();
    for (int base = 0; base < n; base += SAMPLE_THREADS) {
        int j = base + tid;
        double e = j < n ? exp(((double)v[j] - mx) / temp) : 0.0, inc;
        block_scan(st->ts).InclusiveSum(e, inc);
        double cum = st->carry + inc;
        if (j < n && (ge ? cum >= lim : lim < cum)) atomicMin(&st->found, j);
        __syncthreads();
        if (st->found == j) st->found_cum = cum;
        if (tid == SAMPLE_THREADS - 1) st->carry = cum;
        __syncthreads();
        if (st->found != INT_MAX) break;
    }
    *at = st->found_cum;
    *end = st->carry;
    int f = st->found;
    __syncthreads();
    return f == INT_MAX ? -1 : f;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *keys, const int32_t *ids, int V, const egk_sample_row *rows, int32_t *out) {
    __shared__ scan_state st;
    __shared__ double sh[32];
    int i = blockIdx.x;
    egk_sample_row p = rows[i];
    if (!(p.temperature > 0.0f)) return; /* greedy: argmax_kernel's answer stands */
    const float *v = keys + (int64_t)i * V;
    const int32_t *id = ids + (int64_t)i * V;
    int n = V;
    if (p.top_k > 0 && p.top_k < n) n = p.top_k;
    double mx = v[0], temp = p.temperature;
    double part = 0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) part += exp(((double)v[j] - mx) / temp);
    double total = egk_block_sum_d(part, sh);
    double at, end;
    if (p.top_p > 0.0f && p.top_p < 1.0f) {
        double lim = (double)p.top_p * total;
        int f = first_prefix(v, n, mx, temp, lim, 1, &st, &at, &end);
        if (f >= 0) {
            n = f + 1;
            total = at;
        } else {
            total = end;
        }
    }
    double u = p.u * total;
    int f = first_prefix(v, n, mx, temp, u, 0, &st, &at, &end);
    if (threadIdx.x == 0) out[i] = id[f >= 0 ? f : n - 1];
}

extern "C" size_t egk_sample_temp_bytes(int N, int V) {
    size_t bytes = 0;
    cub::DeviceSegmentedRadixSort::SortPairsDescending((void *)NULL, bytes, (const float *)NULL, (float *)NULL,
                                                       (const int32_t *)NULL, (int32_t *)NULL, N * V, N,
                                                       (const int32_t *)NULL, (const int32_t *)NULL, 0, 32,
                                                       (cudaStream_t)0);
    return bytes;
}

extern "C" int egk_sample(const float *logits, int N, int V, const egk_sample_row *rows, int any_random, float *keys,
                          int32_t *ids_in, int32_t *ids_out, int32_t *offsets, void *temp, size_t temp_bytes,
                          int32_t *out, void *stream) {
    if (N <= 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    argmax_kernel<<<N, 1024, 0, s>>>(logits, V, out);
    int rc = EGK_LAUNCH_RESULT();
    if (rc || !any_random) return rc;
    int64_t n = (int64_t)N * V;
    unsigned g = (unsigned)((n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536);
    iota_kernel<<<g, 256, 0, s>>>(N, V, ids_in, offsets);
    if ((rc = EGK_LAUNCH_RESULT())) return rc;
    size_t tb = temp_bytes;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(temp, tb, logits, keys, ids_in, ids_out,
                                                                       (int)n, N, offsets, offsets + 1, 0, 32, s);
    if (e != cudaSuccess) return (int)e;
    sample_kernel<<<N, SAMPLE_THREADS, 0, s>>>(keys, ids_out, V, rows, out);
    return EGK_LAUNCH_RESULT();
}
