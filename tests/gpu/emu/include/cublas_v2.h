/* Emulation stand-in for cuBLAS (tests/gpu/emu): column-major GEMMs on the host. */
#ifndef EMU_CUBLAS_V2_H
#define EMU_CUBLAS_V2_H
#include "cuda_runtime_api.h"
#ifdef __cplusplus
extern "C" {
#endif
typedef struct emu_blas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_NOT_SUPPORTED = 15 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
const char *cublasGetStatusName(cublasStatus_t s);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt,
                            int ldb, const void *beta, void *C, cudaDataType Ct, int ldc, cublasComputeType_t ct,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType At, int lda,
                                          long long sA, const void *B, cudaDataType Bt, int ldb, long long sB,
                                          const void *beta, void *C, cudaDataType Ct, int ldc, long long sC, int batch,
                                          cublasComputeType_t ct, cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc);
#ifdef __cplusplus
}
#endif
#endif
