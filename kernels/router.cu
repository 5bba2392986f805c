/* router.cu — DeepSeek-V3 noaux_tc expert selection from FP32 router logits (the
 * logits themselves come from the FP32 GEMM). One warp per token; the selection rules
 * mirror the CPU backend exactly: strict "greater" comparisons scanning ids upward, so
 * ties go to the lower id (and the lower group). */
#include "kernels/common.cuh"

#include <limits.h>

/* Is (v, i) better than (bv, bi)? Higher value, then lower id; bi == INT_MAX is empty. */
static __device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
    return bi == INT_MAX || v > bv || (v == bv && i < bi);
}

static __global__ void router_kernel(const float *logits, int E, int bias_fmt, const void *bias, int G,
                                     int topk_group, int K, int norm_topk, float routed_scale, int32_t *ids,
                                     float *weights) {
    extern __shared__ float sm[];
    float *sc = sm, *bs = sm + E, *gs = bs + E;
    int *taken = (int *)(gs + G);
    int t = blockIdx.x, lane = threadIdx.x;
    const float *lg = logits + (int64_t)t * E;
    for (int e = lane; e < E; e += 32) {
        float s = 1.0f / (1.0f + expf(-lg[e]));
        sc[e] = s;
        bs[e] = s + (bias_fmt ? egk_vload(bias_fmt, bias, e) : 0.0f);
        taken[e] = 0;
    }
    __syncwarp();
    if (G > 1) {
        int per = E / G;
        for (int g = lane; g < G; g += 32) {
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                float v = bs[e];
                if (v > m1) {
                    m2 = m1;
                    m1 = v;
                } else if (v > m2) {
                    m2 = v;
                }
            }
            gs[g] = per > 1 ? m1 + m2 : m1;
        }
        __syncwarp();
        if (lane == 0) {
            /* gs[g] becomes NaN-free flags: +1 kept, else dropped (reuse taken[] later). */
            for (int n = 0; n < topk_group; n++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (gs[g] != INFINITY && (best < 0 || gs[g] > gs[best])) best = g;
                if (best >= 0) gs[best] = INFINITY; /* mark kept */
            }
        }
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            if (gs[e / per] != INFINITY) bs[e] = -INFINITY;
        __syncwarp();
    }
    int32_t *out_id = ids + (int64_t)t * K;
    float *out_w = weights + (int64_t)t * K;
    double sum = 0;
    for (int k = 0; k < K; k++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int e = lane; e < E; e += 32)
            if (!taken[e] && better(bs[e], e, bv, bi)) {
                bv = bs[e];
                bi = e;
            }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != INT_MAX && better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (bi == INT_MAX) bi = 0; /* K > E: cannot happen with a valid config */
        if (lane == 0) {
            out_id[k] = bi;
            out_w[k] = sc[bi];
            taken[bi] = 1;
        }
        sum += sc[bi];
        __syncwarp();
    }
    if (lane == 0)
        for (int k = 0; k < K; k++) {
            float v = norm_topk ? (float)(out_w[k] / sum) : out_w[k];
            out_w[k] = v * routed_scale;
        }
}

extern "C" int egk_router_select(const float *logits, int T, int E, egk_weight bias, int n_group, int topk_group,
                                 int topk, int norm_topk, float routed_scale, int32_t *ids, float *weights,
                                 void *stream) {
    if (T <= 0) return 0;
    int G = n_group > 0 ? n_group : 1;
    if (E % G || topk > E) return (int)cudaErrorInvalidValue;
    size_t shm = sizeof(float) * (2 * (size_t)E + (size_t)G) + sizeof(int) * (size_t)E;
    /* past 48 KB from about 4,090 experts */
    cudaError_t e = egk_smem_opt_in(router_kernel, shm, (cudaStream_t)stream);
    if (e != cudaSuccess) return (int)e;
    router_kernel<<<T, 32, shm, (cudaStream_t)stream>>>(logits, E, bias.data ? bias.fmt : 0, bias.data, G,
                                                        topk_group, topk, norm_topk, routed_scale, ids, weights);
    return EGK_LAUNCH_RESULT();
}
