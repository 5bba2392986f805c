/* elementwise.cu — embedding gather, RMSNorm (+ fused residual add), add, BF16
 * conversion, SwiGLU, row gather, dequantisation to BF16. See eg_cuda.h. */
#include "kernels/common.cuh"

extern "C" const char *egk_error_name(int code) { return cudaGetErrorName((cudaError_t)code); }
extern "C" const char *egk_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

static __global__ void embed_kernel(const int32_t *tokens, int fmt, const void *E, int64_t V, int64_t D, float *x) {
    int t = blockIdx.x;
    int64_t id = tokens[t];
    float *row = x + (int64_t)t * D;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x)
        row[c] = (id >= 0 && id < V) ? egk_vload(fmt, E, id * D + c) : 0.0f;
}

extern "C" int egk_embed(const int32_t *tokens, int T, egk_weight E, float *x, void *stream) {
    if (T <= 0) return 0;
    embed_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(tokens, E.fmt, E.data, E.rows, E.cols, x);
    return EGK_LAUNCH_RESULT();
}

/* One block per row. When dx is given, x += dx first (x written back). */
static __global__ void rmsnorm_kernel(float *x, const float *dx, int fmt, const void *w, int D, float eps, float *y) {
    __shared__ double sh[32];
    int64_t base = (int64_t)blockIdx.x * D;
    double ss = 0;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float v = x[base + c];
        if (dx) {
            v += dx[base + c];
            x[base + c] = v;
        }
        ss += (double)v * v;
    }
    ss = egk_block_sum_d(ss, sh);
    float inv = (float)(1.0 / sqrt(ss / D + (double)eps));
    /* Each thread re-reads only the elements it wrote itself, so no barrier is needed. */
    for (int c = threadIdx.x; c < D; c += blockDim.x) y[base + c] = x[base + c] * inv * egk_vload(fmt, w, c);
}

extern "C" int egk_rmsnorm(const float *x, egk_weight w, int T, int D, float eps, float *y, void *stream) {
    if (T <= 0) return 0;
    rmsnorm_kernel<<<T, 256, 0, (cudaStream_t)stream>>>((float *)x, NULL, w.fmt, w.data, D, eps, y);
    return EGK_LAUNCH_RESULT();
}

extern "C" int egk_add_rmsnorm(float *x, const float *dx, egk_weight w, int T, int D, float eps, float *y,
                               void *stream) {
    if (T <= 0) return 0;
    rmsnorm_kernel<<<T, 256, 0, (cudaStream_t)stream>>>(x, dx, w.fmt, w.data, D, eps, y);
    return EGK_LAUNCH_RESULT();
}

static __global__ void add_kernel(float *x, const float *dx, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += dx[i];
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

extern "C" int egk_add(float *x, const float *dx, int64_t n, void *stream) {
    if (n <= 0) return 0;
    add_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(x, dx, n);
    return EGK_LAUNCH_RESULT();
}

static __global__ void to_bf16_kernel(const float *x, uint16_t *y, uint16_t *lo, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        uint16_t h = egk_f32_to_bf16(v);
        y[i] = h;
        if (lo) lo[i] = egk_f32_to_bf16(v - egk_bf16_to_f32(h));
    }
}

extern "C" int egk_f32_to_bf16(const float *x, uint16_t *y, uint16_t *lo, int64_t n, void *stream) {
    if (n <= 0) return 0;
    to_bf16_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(x, y, lo, n);
    return EGK_LAUNCH_RESULT();
}

static __global__ void swiglu_kernel(const float *g, const float *u, float *hf, uint16_t *hb, uint16_t *hb_lo,
                                     int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a = g[i];
        float h = a / (1.0f + expf(-a)) * u[i];
        if (hf) hf[i] = h;
        if (hb) {
            uint16_t b = egk_f32_to_bf16(h);
            hb[i] = b;
            if (hb_lo) hb_lo[i] = egk_f32_to_bf16(h - egk_bf16_to_f32(b));
        }
    }
}

extern "C" int egk_swiglu(const float *g, const float *u, float *hf, uint16_t *hb, uint16_t *hb_lo, int64_t n,
                          void *stream) {
    if (n <= 0) return 0;
    swiglu_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(g, u, hf, hb, hb_lo, n);
    return EGK_LAUNCH_RESULT();
}

static __global__ void gather_kernel(const float *x, const int32_t *idx, int D, int64_t n_src, float *out) {
    int i = blockIdx.x;
    const int64_t r = idx[i];
    float *dst = out + (int64_t)i * D;
    if (n_src > 0 && (r < 0 || r >= n_src)) {
        for (int c = threadIdx.x; c < D; c += blockDim.x) dst[c] = 0.0f;
        return;
    }
    const float *src = x + r * D;
    for (int c = threadIdx.x; c < D; c += blockDim.x) dst[c] = src[c];
}

extern "C" int egk_gather_rows(const float *x, const int32_t *idx, int n, int D, int64_t n_src, float *out,
                               void *stream) {
    if (n <= 0) return 0;
    gather_kernel<<<n, 256, 0, (cudaStream_t)stream>>>(x, idx, D, n_src, out);
    return EGK_LAUNCH_RESULT();
}

template <int FMT>
static __global__ void dequant_kernel(egk_weight w, int64_t row0, int64_t nrows, uint16_t *out) {
    int64_t n = nrows * w.cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / w.cols, c = i - r * w.cols;
        out[i] = egk_f32_to_bf16(egk_wload<FMT>(w.data, w.scale, w.cols, w.group, row0 + r, c));
    }
}

extern "C" int egk_dequant_bf16(egk_weight w, int64_t row0, int64_t nrows, uint16_t *out, void *stream) {
    int64_t n = nrows * w.cols;
    if (n <= 0) return 0;
    cudaStream_t s = (cudaStream_t)stream;
    switch (w.fmt) {
    case EGK_F32: dequant_kernel<EGK_F32><<<grid_for(n), 256, 0, s>>>(w, row0, nrows, out); break;
    case EGK_BF16: dequant_kernel<EGK_BF16><<<grid_for(n), 256, 0, s>>>(w, row0, nrows, out); break;
    case EGK_F16: dequant_kernel<EGK_F16><<<grid_for(n), 256, 0, s>>>(w, row0, nrows, out); break;
    case EGK_INT4: dequant_kernel<EGK_INT4><<<grid_for(n), 256, 0, s>>>(w, row0, nrows, out); break;
    case EGK_FP8: dequant_kernel<EGK_FP8><<<grid_for(n), 256, 0, s>>>(w, row0, nrows, out); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return EGK_LAUNCH_RESULT();
}

static __global__ void add_pair_kernel(float *y, const float *a, const float *b, int64_t n, int accumulate) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(__fadd_rn(accumulate ? y[i] : 0.0f, a[i]), b[i]);
}

extern "C" int egk_add_pair(float *y, const float *a, const float *b, int64_t n, int accumulate, void *stream) {
    if (n <= 0) return 0;
    unsigned blocks = egk_blocks(n, 256);
    if (blocks > 8192) blocks = 8192;
    add_pair_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(y, a, b, n, accumulate);
    return EGK_LAUNCH_RESULT();
}

/* ---- random weights (engine/weight_rand.c, bit for bit) ------------------------------ */

static __device__ __forceinline__ uint64_t rand_mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static __device__ __forceinline__ float rand_unit(uint64_t h) { return (float)(h >> 40) * (1.0f / 16777216.0f); }

/* explicit _rn operations: no FMA contraction, so the host's float arithmetic is matched */
static __global__ void fill_random_kernel(void *dst, int64_t n, int kind, uint64_t seed, float mean, float std) {
    const uint64_t golden = 0x9e3779b97f4a7c15ull;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if (kind == EGK_RAND_INT4_WORDS) {
            uint64_t h = rand_mix((seed ^ 0x1234567887654321ull) + (uint64_t)(i + 1) * golden);
            uint32_t w = 0;
            for (int j = 0; j < 8; j++) w |= (uint32_t)(1 + ((h >> (8 * j)) & 0xff) % 15) << (4 * j);
            ((uint32_t *)dst)[i] = w;
        } else if (kind == EGK_RAND_SCALE_BF16) {
            float u = rand_unit(rand_mix((seed ^ 0x5ca1e5ca1e5ca1e5ull) + (uint64_t)(i + 1) * golden));
            ((uint16_t *)dst)[i] = egk_f32_to_bf16(__fmul_rn(std, __fadd_rn(0.8f, __fmul_rn(0.4f, u))));
        } else {
            float u = rand_unit(rand_mix(seed + (uint64_t)(i + 1) * golden));
            float v = __fadd_rn(mean, __fmul_rn(__fmul_rn(std, 1.7320508f), __fsub_rn(__fmul_rn(2.0f, u), 1.0f)));
            if (kind == EGK_RAND_F32) ((float *)dst)[i] = v;
            else ((uint16_t *)dst)[i] = egk_f32_to_bf16(v);
        }
    }
}

extern "C" int egk_fill_random(void *dst, int64_t n, int kind, uint64_t seed, float mean, float std, void *stream) {
    if (n <= 0) return 0;
    unsigned blocks = egk_blocks(n, 256);
    if (blocks > 8192) blocks = 8192;
    fill_random_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(dst, n, kind, seed, mean, std);
    return EGK_LAUNCH_RESULT();
}
