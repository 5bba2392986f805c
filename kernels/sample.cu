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

#define SAMPLE_THREADS 512

static __global__ void argmax_kernel(const float *logits, int V, int32_t *out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *row = logits + (int64_t)blockIdx.x * V;
    float bv = -INFINITY;
    int bi = INT_MAX;
    /* the host's rule (best = 0; best = i where l[i] > l[best]): a NaN is never taken,
     * and a NaN at id 0 wins (nothing compares greater) */
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = row[j];
        if (v != v) continue;
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
        out[blockIdx.x] = bi == INT_MAX || row[0] != row[0] ? 0 : bi;
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

/* which: the rows to sample (block b takes row which[b]); NULL = block b takes row b. */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *keys, const int32_t *ids, int V, const egk_sample_row *rows, const int32_t *which,
                  int32_t *out) {
    __shared__ scan_state st;
    __shared__ double sh[32];
    int i = which ? which[blockIdx.x] : blockIdx.x;
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

/* ---- top-M selection: the same answer without sorting the vocabulary -------------- */

/* Orderable bits: a larger float gives a larger key; -0 and +0 give one key (they are
 * equal logits, ordered by id like every tie). */
static __device__ __forceinline__ uint32_t logit_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* a comes before b in eg_sample_row's order: higher logit, then lower id */
static __device__ __forceinline__ bool cand_before(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

typedef cub::BlockScan<int, SAMPLE_THREADS> block_scan_i;

struct topm_smem {
    float v[EGK_SAMPLE_TOPM_MAX];
    int32_t id[EGK_SAMPLE_TOPM_MAX];
    int hist[256];
    uint32_t prefix;
    int need, n_gt, taken, last;
    block_scan_i::TempStorage ti;
    scan_state st;
    double sh[32];
};

/* s.v / s.id [0..m) = the first m candidates of row (V logits) in eg_sample_row's order:
 * a 4-pass radix select on the logits' bits (ties at the threshold taken lowest id
 * first), then a bitonic sort in shared memory. Every thread of the block calls it. */
static __device__ void topm_select(const float *row, int V, int m, topm_smem &s) {
    int tid = threadIdx.x;
    /* radix select: the key of the m-th candidate, and how many of its ties to take */
    if (tid == 0) {
        s.prefix = 0;
        s.need = m;
    }
    uint32_t mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = tid; d < 256; d += blockDim.x) s.hist[d] = 0;
        __syncthreads();
        uint32_t pre = s.prefix;
        for (int j = tid; j < V; j += blockDim.x) {
            uint32_t k = logit_key(row[j]);
            if ((k & mask) == pre) atomicAdd(&s.hist[(k >> shift) & 255], 1);
        }
        __syncthreads();
        if (tid == 0) {
            int need = s.need, d = 255;
            for (; d > 0 && need > s.hist[d]; d--) need -= s.hist[d];
            s.need = need;
            s.prefix = pre | ((uint32_t)d << shift);
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    uint32_t thr = s.prefix;
    int ties = s.need, n_gt = m - ties;
    if (tid == 0) {
        s.n_gt = 0;
        s.taken = 0;
    }
    __syncthreads();
    for (int j = tid; j < V; j += blockDim.x) {
        float v = row[j];
        if (logit_key(v) > thr) {
            int at = atomicAdd(&s.n_gt, 1);
            s.v[at] = v;
            s.id[at] = j;
        }
    }
    /* ties at the threshold in id order: a block-wide count per chunk of ids */
    for (int base = 0; base < V; base += blockDim.x) {
        int j = base + tid;
        int flag = j < V && logit_key(row[j]) == thr, inc;
        block_scan_i(s.ti).InclusiveSum(flag, inc);
        int rank = s.taken + inc - flag;
        if (flag && rank < ties) {
            s.v[n_gt + rank] = row[j];
            s.id[n_gt + rank] = j;
        }
        if (tid == blockDim.x - 1) s.last = inc;
        __syncthreads();
        if (tid == 0) s.taken += s.last;
        __syncthreads();
        if (s.taken >= ties) break;
    }
    /* bitonic sort of the m candidates (padded to a power of two) */
    int P = 1;
    while (P < m) P <<= 1;
    for (int j = m + tid; j < P; j += blockDim.x) {
        s.v[j] = -INFINITY;
        s.id[j] = INT_MAX;
    }
    __syncthreads();
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int a = tid; a < P; a += blockDim.x) {
                int b = a ^ j;
                if (b > a) {
                    bool up = (a & k) == 0;
                    float av = s.v[a], bv = s.v[b];
                    int ai = s.id[a], bi = s.id[b];
                    if (up ? cand_before(bv, bi, av, ai) : cand_before(av, ai, bv, bi)) {
                        s.v[a] = bv; s.id[a] = bi;
                        s.v[b] = av; s.id[b] = ai;
                    }
                }
            }
            __syncthreads();
        }
}

/* The kept set of a non-greedy row from its first candidates: s.v / s.id [0..*m) =
 * the first m = min(n0, M) in eg_sample_row's order (n0 = top_k or V), *mx their max,
 * *total the kept mass; returns the kept count n (V when nothing is cut and n0 > M: every
 * id kept, the mass summed over the whole row), or -1 when the first M cannot settle it
 * (a top_k above M, a top-p cut beyond them). Every thread of the block calls it. */
static __device__ int topm_kept(const float *row, int V, const egk_sample_row &p, int M, topm_smem &s, int *m,
                                double *mx, double *total) {
    int tid = threadIdx.x;
    int n0 = p.top_k > 0 && p.top_k < V ? p.top_k : V;
    if (n0 > M && n0 < V) return -1;
    *m = n0 < M ? n0 : M;
    topm_select(row, V, *m, s);
    double temp = p.temperature, part = 0;
    *mx = s.v[0];
    int exact = n0 <= M, n = exact ? *m : V;
    if (exact)
        for (int j = tid; j < *m; j += blockDim.x) part += exp(((double)s.v[j] - *mx) / temp);
    else
        for (int j = tid; j < V; j += blockDim.x) part += exp(((double)row[j] - *mx) / temp);
    *total = egk_block_sum_d(part, s.sh);
    if (p.top_p > 0.0f && p.top_p < 1.0f) {
        double at, end;
        int f = first_prefix(s.v, *m, *mx, temp, (double)p.top_p * *total, 1, &s.st, &at, &end);
        if (f >= 0) {
            n = f + 1;
            *total = at;
        } else if (exact) {
            *total = end;
        } else {
            return -1;
        }
    }
    return n;
}

/* One row per block: the m = min(n0, M) first candidates in eg_sample_row's order (n0 =
 * top_k or V) found by a 4-pass radix select on the logits' bits (ties at the threshold
 * taken lowest id first), sorted in shared memory (bitonic), then sample_kernel's
 * arithmetic on them. When n0 <= M that is the whole candidate list: the answer is
 * exact. Otherwise the total mass comes from the whole row, and the top-p cut and the
 * draw are exact as long as they land inside the first M (the prefix sums are the same
 * numbers); a row where they do not gets out = -1, and the caller sorts it fully. */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_topm_kernel(const float *logits, int V, const egk_sample_row *rows, int M, int32_t *out) {
    __shared__ topm_smem s;
    int i = blockIdx.x, tid = threadIdx.x;
    egk_sample_row p = rows[i];
    if (!(p.temperature > 0.0f)) return; /* greedy: argmax_kernel's answer stands */
    const float *row = logits + (int64_t)i * V;
    int m;
    double mx, total, at, end;
    int n = topm_kept(row, V, p, M, s, &m, &mx, &total);
    if (n < 0) { /* unsettled: the caller sorts the row */
        if (tid == 0) out[i] = -1;
        return;
    }
    int f = first_prefix(s.v, n < m ? n : m, mx, p.temperature, p.u * total, 0, &s.st, &at, &end);
    if (tid == 0) out[i] = f >= 0 ? s.id[f] : n <= m ? s.id[n - 1] : -1;
}

extern "C" int egk_sample_topm(const float *logits, int N, int V, const egk_sample_row *rows, int M, int32_t *out,
                               void *stream) {
    if (N <= 0) return 0;
    if (M < 1 || M > EGK_SAMPLE_TOPM_MAX || V < 1) return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    argmax_kernel<<<N, 1024, 0, s>>>(logits, V, out);
    int rc = EGK_LAUNCH_RESULT();
    if (rc) return rc;
    sample_topm_kernel<<<N, SAMPLE_THREADS, 0, s>>>(logits, V, rows, M, out);
    return EGK_LAUNCH_RESULT();
}

/* out[i] = p(tok[i]) under row i's parameters (rows with tok[i] < 0 untouched), from
 * sample_topm_kernel's numbers: the first m = min(n0, M) candidates, the total mass
 * over them (n0 <= M) or over the whole row, the top-p cut among them. Exact where
 * that settles the kept set: n0 <= M, or the cut inside the first M, or nothing cut
 * (every id kept: x's own logit over the row's total); NaN where it does not (a top_k
 * above M, a cut beyond M), and for greedy rows: the caller computes those. */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
    token_prob_kernel(const float *logits, int V, const egk_sample_row *rows, const int32_t *tok, int M, double *out) {
    __shared__ topm_smem s;
    __shared__ int where;
    int i = blockIdx.x, tid = threadIdx.x, x = tok[i];
    if (x < 0) return;
    egk_sample_row p = rows[i];
    const float *row = logits + (int64_t)i * V;
    int m = 0, n = -1;
    double mx = 0, total = 0, temp = p.temperature;
    if (p.temperature > 0.0f && x < V) n = topm_kept(row, V, p, M, s, &m, &mx, &total);
    if (n < 0) { /* greedy, or unsettled: the caller computes it */
        if (tid == 0) out[i] = (double)NAN;
        return;
    }
    if (n > m) { /* nothing cut: every id is kept */
        if (tid == 0) out[i] = exp(((double)row[x] - mx) / temp) / total;
        return;
    }
    if (tid == 0) where = INT_MAX;
    __syncthreads();
    for (int j = tid; j < n; j += blockDim.x)
        if (s.id[j] == x) atomicMin(&where, j);
    __syncthreads();
    if (tid == 0) out[i] = where < n ? exp(((double)s.v[where] - mx) / temp) / total : 0.0;
}

extern "C" int egk_token_probs(const float *logits, int N, int V, const egk_sample_row *rows, const int32_t *tok, int M,
                               double *out, void *stream) {
    if (N <= 0) return 0;
    if (M < 1 || M > EGK_SAMPLE_TOPM_MAX || V < 1) return (int)cudaErrorInvalidValue;
    token_prob_kernel<<<N, SAMPLE_THREADS, 0, (cudaStream_t)stream>>>(logits, V, rows, tok, M, out);
    return EGK_LAUNCH_RESULT();
}

/* A row's kept set, for a rejected draft's residual on the host (egk_kept_probs): the
 * candidates topm_kept settles, with token_prob_kernel's arithmetic for each. */
static __global__ void __launch_bounds__(SAMPLE_THREADS)
    kept_prob_kernel(const float *logits, int V, const int32_t *which, const egk_sample_row *rows, int M,
                     int32_t *n_out, int32_t *ids, double *probs) {
    __shared__ topm_smem s;
    int i = blockIdx.x, tid = threadIdx.x;
    egk_sample_row p = rows[i];
    const float *row = logits + (int64_t)which[i] * V;
    int m = 0, n = -1;
    double mx = 0, total = 0, temp = p.temperature;
    if (p.temperature > 0.0f) n = topm_kept(row, V, p, M, s, &m, &mx, &total);
    if (n > m) n = -1; /* nothing cut, over more ids than the first M */
    if (tid == 0) n_out[i] = n;
    for (int j = tid; j < n; j += blockDim.x) {
        ids[(int64_t)i * M + j] = s.id[j];
        probs[(int64_t)i * M + j] = exp(((double)s.v[j] - mx) / temp) / total;
    }
}

extern "C" int egk_kept_probs(const float *logits, int N, int V, const int32_t *which, const egk_sample_row *rows, int M,
                              int32_t *n_out, int32_t *ids, double *probs, void *stream) {
    if (N <= 0) return 0;
    if (M < 1 || M > EGK_SAMPLE_TOPM_MAX || V < 1) return (int)cudaErrorInvalidValue;
    kept_prob_kernel<<<N, SAMPLE_THREADS, 0, (cudaStream_t)stream>>>(logits, V, which, rows, M, n_out, ids, probs);
    return EGK_LAUNCH_RESULT();
}

/* CUB's segmented sort counts items and segment offsets in int: a pass sorts at most
 * INT_MAX (row, id) pairs (the backend's chunk of 64 rows x 163,840 ids is 10.5M). */
static bool sort_fits(int64_t N, int64_t V) { return N >= 0 && V >= 0 && N * V <= 2147483647LL; }

extern "C" size_t egk_sample_temp_bytes(int N, int V) {
    size_t bytes = 0;
    if (!sort_fits(N, V)) return 0;
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
    if (!sort_fits(N, V)) return (int)cudaErrorInvalidValue;
    /* (the whole pass, every row: the EG_CUDA_SAMPLE=sort path; egk_sample_rows sorts
     * chosen rows only) */
    int64_t n = (int64_t)N * V;
    unsigned g = (unsigned)((n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536);
    iota_kernel<<<g, 256, 0, s>>>(N, V, ids_in, offsets);
    if ((rc = EGK_LAUNCH_RESULT())) return rc;
    size_t tb = temp_bytes;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(temp, tb, logits, keys, ids_in, ids_out,
                                                                       (int)n, N, offsets, offsets + 1, 0, 32, s);
    if (e != cudaSuccess) return (int)e;
    sample_kernel<<<N, SAMPLE_THREADS, 0, s>>>(keys, ids_out, V, rows, (const int32_t *)NULL, out);
    return EGK_LAUNCH_RESULT();
}

/* Segments of the chosen rows (begin, end into the [N][V] layout) and their ids. */
static __global__ void rows_seg_kernel(const int32_t *which, int n, int V, int32_t *ids, int32_t *begin, int32_t *end) {
    int64_t total = (int64_t)n * V;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = which[i / V];
        ids[row * V + i % V] = (int32_t)(i % V);
    }
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        begin[j] = which[j] * V;
        end[j] = which[j] * V + V;
    }
}

extern "C" int egk_sample_rows(const float *logits, int N, int V, const egk_sample_row *rows, const int32_t *which,
                               int n, float *keys, int32_t *ids_in, int32_t *ids_out, int32_t *seg, void *temp,
                               size_t temp_bytes, int32_t *out, void *stream) {
    if (n <= 0) return 0;
    if (n > N || !sort_fits(N, V)) return (int)cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    int64_t items = (int64_t)n * V;
    unsigned g = (unsigned)((items + 255) / 256 < 65536 ? (items + 255) / 256 : 65536);
    rows_seg_kernel<<<g, 256, 0, s>>>(which, n, V, ids_in, seg, seg + n);
    int rc = EGK_LAUNCH_RESULT();
    if (rc) return rc;
    size_t tb = temp_bytes;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(temp, tb, logits, keys, ids_in, ids_out,
                                                                       (int)((int64_t)N * V), n, seg, seg + n, 0, 32, s);
    if (e != cudaSuccess) return (int)e;
    sample_kernel<<<n, SAMPLE_THREADS, 0, s>>>(keys, ids_out, V, rows, which, out);
    return EGK_LAUNCH_RESULT();
}
