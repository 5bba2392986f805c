// Host implementations of the emulated CUDA runtime and cuBLAS subset
// (tests/gpu/emu/include). Streams are synchronous: every call completes on return.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cublas_v2.h"

extern "C" {
/* EMU_DEVICES=N pretends N devices (default 1); the current device is per thread, as
 * in CUDA, so a thread that forgets cudaSetDevice is caught by the emulated NCCL. */
static int emu_devices(void) {
    const char *e = getenv("EMU_DEVICES");
    int n = e ? atoi(e) : 1;
    return n > 0 ? n : 1;
}
static thread_local int emu_current;
cudaError_t cudaGetDeviceCount(int *n) { *n = emu_devices(); return cudaSuccess; }
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_devices()) return cudaErrorInvalidValue;
    emu_current = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) { *d = emu_current; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (cudaStream_t)malloc(1); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { *e = (cudaEvent_t)malloc(1); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) {
    if (n > ((size_t)64 << 30)) { *p = NULL; return cudaErrorMemoryAllocation; }
    *p = malloc(n);
    if (*p) memset(*p, 0xA5, n); /* garbage, as device memory is */
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
/* EMU_MEM_GB sets the emulated device's size (default 80), 1% of it in use */
cudaError_t cudaMemGetInfo(size_t *fr, size_t *to) {
    const char *e = getenv("EMU_MEM_GB");
    double gb = e ? atof(e) : 80.0;
    *to = (size_t)(gb * (double)(1 << 30));
    *fr = *to / 100 * 99;
    return cudaSuccess;
}
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation" : "cudaErrorEmulated"; }
const char *cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)malloc(1); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMULATED"; }
const char *cublasGetStatusString(cublasStatus_t) { return "emulated cuBLAS error"; }

static float ld(const void *p, cudaDataType t, long long i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Column-major BLAS semantics: X(i,j) = X[i + j*ld]; op(X) = X or X^T;
 * C = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n, C m x n. */
static cublasStatus_t gemm1(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                            const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt, int ldb,
                            float beta, void *C, cudaDataType Ct, int ldc) {
    if (Ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    float *c = (float *)C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? ld(A, At, i + (long long)p * lda) : ld(A, At, p + (long long)i * lda);
                float b = tb == CUBLAS_OP_N ? ld(B, Bt, p + (long long)j * ldb) : ld(B, Bt, j + (long long)p * ldb);
                s += (double)a * b;
            }
            float *dst = c + i + (long long)j * ldc;
            *dst = (float)(alpha * s + (beta != 0 ? beta * *dst : 0));
        }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt,
                            int ldb, const void *beta, void *C, cudaDataType Ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
    return gemm1(ta, tb, m, n, k, *(const float *)alpha, A, At, lda, B, Bt, ldb, *(const float *)beta, C, Ct, ldc);
}

static size_t esz(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType At, int lda,
                                          long long sA, const void *B, cudaDataType Bt, int ldb, long long sB,
                                          const void *beta, void *C, cudaDataType Ct, int ldc, long long sC, int batch,
                                          cublasComputeType_t, cublasGemmAlgo_t) {
    for (int i = 0; i < batch; i++) {
        cublasStatus_t s = gemm1(ta, tb, m, n, k, *(const float *)alpha, (const char *)A + i * sA * esz(At), At, lda,
                                 (const char *)B + i * sB * esz(Bt), Bt, ldb, *(const float *)beta,
                                 (char *)C + i * sC * esz(Ct), Ct, ldc);
        if (s) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    return gemm1(ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, CUDA_R_32F, ldc);
}

}
