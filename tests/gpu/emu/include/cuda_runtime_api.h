/* Emulation stand-in for the CUDA runtime API (tests/gpu/emu): the subset eaglegen
 * uses, implemented on the host in emu_runtime.cpp. C and C++. */
#ifndef EMU_CUDA_RUNTIME_API_H
#define EMU_CUDA_RUNTIME_API_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
                         cudaErrorNoDevice = 100, cudaErrorNotReady = 600, cudaErrorStreamCaptureUnsupported = 900,
                         cudaErrorStreamCaptureInvalidated = 901 } cudaError_t;
typedef struct emu_stream *cudaStream_t;
/* Stream capture: ops on a capturing stream are recorded, not run; a graph replays them
 * in order. Calls a real capture refuses (synchronisation, host copies, allocation from
 * the capturing thread) fail and invalidate the capture, as they do on a GPU. */
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;
typedef enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                                     cudaStreamCaptureModeRelaxed = 2 } cudaStreamCaptureMode;
typedef enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1,
                                       cudaStreamCaptureStatusInvalidated = 2 } cudaStreamCaptureStatus;
typedef struct emu_event *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
#define cudaStreamNonBlocking 1u
#define cudaEventDisableTiming 2u
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st);
/* device-to-device only (the only kind the engine issues) */
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
cudaError_t cudaGetLastError(void);
cudaError_t cudaMemGetInfo(size_t *fr, size_t *to);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
/* an H200's limits (sm_90): 227 KB per block with the opt-in, 228 KB per SM */
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int dev);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
#ifdef __cplusplus
}
#include <functional>
/* Record fn when s is capturing (true), else leave it to the caller to run (false). */
bool emu_capture_record(cudaStream_t s, std::function<void()> fn);
/* Run fn as work on stream s: recorded while s captures, else queued for s's worker
 * (run later, in order; at once for the null stream or with EMU_STREAMS=sync). */
void emu_stream_exec(cudaStream_t s, std::function<void()> fn);
/* Per-kernel opt-in above 48 KB of dynamic shared memory (the launch checks it), the
 * device's limits (an H200's unless EMU_SMEM_PER_SM / EMU_SMEM_OPTIN say otherwise:
 * 102400 / 101376 for an sm_120), and the error the next cudaGetLastError returns. */
extern "C" {
void emu_func_set_smem(const void *k, int bytes);
int emu_func_smem(const void *k);
int emu_smem_limit(int per_sm);
void emu_set_last_error(cudaError_t e);
}
/* the one field the kernels read: the kernel's dynamic shared memory limit (48 KB until
 * raised) */
struct cudaFuncAttributes {
    int maxDynamicSharedSizeBytes;
};
template <class F> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F f) {
    if (!a) return cudaErrorInvalidValue;
    a->maxDynamicSharedSizeBytes = emu_func_smem(reinterpret_cast<const void *>(f));
    return cudaSuccess;
}
template <class F> static inline cudaError_t cudaFuncSetAttribute(F f, enum cudaFuncAttribute, int v) {
    if (v < 0 || v > emu_smem_limit(0)) return cudaErrorInvalidValue;
    emu_func_set_smem(reinterpret_cast<const void *>(f), v);
    return cudaSuccess;
}
#endif
#endif
