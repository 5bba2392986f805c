// Host implementations of the emulated CUDA runtime and cuBLAS subset
// (tests/gpu/emu/include). Streams are asynchronous, as on a GPU: every stream has a
// worker thread that runs its queued work (launches, copies, memsets, GEMMs, CUB sorts,
// NCCL transfers, event records) in order, later than the call that queued it, so a
// host read of a copy's destination before the stream or an event says it is done sees
// poisoned bytes, and a host write to a pinned source before the copy ran changes what
// is copied. EMU_STREAMS=sync runs everything at the call instead (the old model). On
// a capturing stream, launches, copies, memsets and GEMMs are recorded for a graph to
// replay.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cublas_v2.h"
#include "cuda_runtime.h"

struct emu_stream {
    int capturing = 0, invalid = 0;
    std::vector<std::function<void()>> rec;
    std::deque<std::function<void()>> q; /* queued work, run in order by the worker */
    int running = 0;                     /* the worker is inside an item */
    bool stop = false;
    std::thread worker;
};
struct emu_graph {
    std::shared_ptr<const std::vector<std::function<void()>>> ops;
};
struct emu_blas {
    cudaStream_t s;
};
/* streams this thread is capturing: a real capture (thread-local mode) refuses
 * synchronisation and allocation from the capturing thread */
static thread_local int emu_thread_captures;

bool emu_capture_record(cudaStream_t s, std::function<void()> fn) {
    if (!s || !s->capturing) return false;
    s->rec.push_back(std::move(fn));
    return true;
}
/* A call a capture refuses: it fails and the capture is invalidated. */
static cudaError_t emu_refuse(cudaStream_t s) {
    if (s && s->capturing) s->invalid = 1;
    return cudaErrorStreamCaptureUnsupported;
}
static std::vector<cudaStream_t> emu_capturing_streams;
static void emu_invalidate_thread_captures(void) {
    for (cudaStream_t s : emu_capturing_streams) s->invalid = 1;
}

/* ---- asynchronous streams --------------------------------------------------------- */
static std::mutex emu_smu;              /* every stream's queue, every event's counters */
static std::condition_variable emu_scv; /* work queued, an item done, an event reached */
static std::vector<cudaStream_t> emu_live_streams;
static int emu_async(void) {
    static const int a = [] { const char *e = std::getenv("EMU_STREAMS"); return !(e && !std::strcmp(e, "sync")); }();
    return a;
}
static void emu_worker(cudaStream_t s) {
    std::unique_lock<std::mutex> l(emu_smu);
    for (;;) {
        emu_scv.wait(l, [&] { return s->stop || !s->q.empty(); });
        if (s->q.empty()) return; /* stopped and drained */
        std::function<void()> fn = std::move(s->q.front());
        s->q.pop_front();
        s->running = 1;
        l.unlock();
        fn();
        l.lock();
        s->running = 0;
        emu_scv.notify_all();
    }
}
/* Run fn on stream s: recorded while s captures, queued for s's worker otherwise (at
 * once for the null stream, inside a graph replay, or with EMU_STREAMS=sync). */
void emu_stream_exec(cudaStream_t s, std::function<void()> fn) {
    if (emu_capture_record(s, fn)) return;
    if (!s || !emu_async()) {
        fn();
        return;
    }
    std::lock_guard<std::mutex> g(emu_smu);
    s->q.push_back(std::move(fn));
    emu_scv.notify_all();
}
static void emu_drain(cudaStream_t s) {
    std::unique_lock<std::mutex> l(emu_smu);
    emu_scv.wait(l, [&] { return s->q.empty() && !s->running; });
}
/* cudaFree and cudaFreeHost wait for the whole device, as CUDA's do */
static void emu_drain_all(void) {
    std::vector<cudaStream_t> all;
    {
        std::lock_guard<std::mutex> g(emu_smu);
        all = emu_live_streams;
    }
    for (cudaStream_t s : all) emu_drain(s);
}
/* Pinned host memory (cudaMallocHost): copies from it are read when the stream gets to
 * them, copies into it land then; pageable memory is read at the call (H2D) or waited
 * for (D2H), as CUDA does. */
static std::mutex emu_pin_mu;
static std::map<uintptr_t, size_t> emu_pinned;
static bool emu_is_pinned(const void *p) {
    std::lock_guard<std::mutex> g(emu_pin_mu);
    auto it = emu_pinned.upper_bound((uintptr_t)p);
    if (it == emu_pinned.begin()) return false;
    --it;
    return (uintptr_t)p < it->first + it->second;
}

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
int emu_smem_limit(int per_sm) {
    const char *e = std::getenv(per_sm ? "EMU_SMEM_PER_SM" : "EMU_SMEM_OPTIN");
    return e && *e ? std::atoi(e) : per_sm ? 233472 : 232448;
}
static std::mutex emu_func_mu;
static std::map<const void *, int> emu_func_smem_map;
void emu_func_set_smem(const void *k, int bytes) {
    std::lock_guard<std::mutex> g(emu_func_mu);
    emu_func_smem_map[k] = bytes;
}
int emu_func_smem(const void *k) {
    std::lock_guard<std::mutex> g(emu_func_mu);
    auto it = emu_func_smem_map.find(k);
    return it == emu_func_smem_map.end() ? 48 * 1024 : it->second;
}
static thread_local cudaError_t emu_last_error = cudaSuccess;
void emu_set_last_error(cudaError_t e) { emu_last_error = e; }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int dev) {
    if (dev < 0 || dev >= emu_devices()) return cudaErrorInvalidValue;
    switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = emu_smem_limit(1); return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = emu_smem_limit(0); return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = new emu_stream();
    if (emu_async()) (*s)->worker = std::thread(emu_worker, *s);
    std::lock_guard<std::mutex> g(emu_smu);
    emu_live_streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s && s->capturing) return emu_refuse(s);
    if (emu_thread_captures) { emu_invalidate_thread_captures(); return cudaErrorStreamCaptureUnsupported; }
    if (s) emu_drain(s);
    else emu_drain_all();
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (s && s->capturing) return emu_refuse(s);
    if (!s) return cudaSuccess;
    std::lock_guard<std::mutex> g(emu_smu);
    return s->q.empty() && !s->running ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaErrorInvalidValue;
    {
        std::lock_guard<std::mutex> g(emu_smu);
        s->stop = true; /* the worker finishes the queue first */
        emu_scv.notify_all();
        for (size_t i = 0; i < emu_live_streams.size(); i++)
            if (emu_live_streams[i] == s) emu_live_streams.erase(emu_live_streams.begin() + (long)i);
    }
    if (s->worker.joinable()) s->worker.join();
    delete s;
    return cudaSuccess;
}
/* An event's time is the host's clock when its stream reaches it (a recording inside a
 * capture keeps the previous time); it is complete once the stream got there. */
struct emu_event {
    double t = 0;
    long recorded = 0, reached = 0;
};
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { *e = new emu_event(); return cudaSuccess; }
static void emu_event_wait(cudaEvent_t e) {
    std::unique_lock<std::mutex> l(emu_smu);
    emu_scv.wait(l, [&] { return e->reached >= e->recorded; });
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return cudaErrorInvalidValue;
    emu_event_wait(e); /* a pending record still writes it */
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return cudaErrorInvalidValue;
    if (s && s->capturing) return cudaSuccess;
    long seq;
    {
        std::lock_guard<std::mutex> g(emu_smu);
        seq = ++e->recorded;
    }
    emu_stream_exec(s, [e, seq] {
        double t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        std::lock_guard<std::mutex> g(emu_smu);
        e->t = t;
        if (seq > e->reached) e->reached = seq;
        emu_scv.notify_all();
    });
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms || !a || !b) return cudaErrorInvalidValue;
    emu_event_wait(a);
    emu_event_wait(b);
    *ms = (float)(1000.0 * (b->t - a->t));
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (emu_thread_captures) { emu_invalidate_thread_captures(); return cudaErrorStreamCaptureUnsupported; }
    if (!e) return cudaErrorInvalidValue;
    emu_event_wait(e);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (emu_thread_captures) { emu_invalidate_thread_captures(); return cudaErrorStreamCaptureUnsupported; }
    if (!e) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> g(emu_smu);
    return e->reached >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    if (!s || s->capturing) return cudaErrorInvalidValue;
    s->capturing = 1;
    s->invalid = 0;
    s->rec.clear();
    emu_thread_captures++;
    emu_capturing_streams.push_back(s);
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    *g = NULL;
    if (!s || !s->capturing) return cudaErrorInvalidValue;
    s->capturing = 0;
    emu_thread_captures--;
    for (size_t i = 0; i < emu_capturing_streams.size(); i++)
        if (emu_capturing_streams[i] == s) emu_capturing_streams.erase(emu_capturing_streams.begin() + (long)i);
    if (s->invalid) { s->rec.clear(); return cudaErrorStreamCaptureInvalidated; }
    *g = new emu_graph{std::make_shared<const std::vector<std::function<void()>>>(std::move(s->rec))};
    s->rec.clear();
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *st) {
    *st = s && s->capturing ? (s->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive)
                            : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    *e = new emu_graph{g->ops};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    if (s && s->capturing) return emu_refuse(s); /* no nested graphs here */
    std::shared_ptr<const std::vector<std::function<void()>>> ops = e->ops;
    emu_stream_exec(s, [ops] {
        for (auto &op : *ops) op();
    });
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
/* Device memory each emulated device holds (cudaMalloc'd, not yet freed): cudaMemGetInfo
 * reports it as in use, so the memory plan can be checked against what a run allocates. */
static std::mutex emu_dev_mu;
static std::map<uintptr_t, std::pair<size_t, int>> emu_dev_allocs; /* ptr -> (bytes, device) */
static size_t emu_dev_used[64];
static cudaError_t emu_alloc(void **p, size_t n) {
    if (emu_thread_captures) { emu_invalidate_thread_captures(); return cudaErrorStreamCaptureUnsupported; }
    if (n > ((size_t)64 << 30)) { *p = NULL; return cudaErrorMemoryAllocation; }
    *p = malloc(n);
    if (*p) memset(*p, 0xA5, n); /* garbage, as device memory is */
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    cudaError_t e = emu_alloc(p, n);
    if (e == cudaSuccess) {
        std::lock_guard<std::mutex> g(emu_dev_mu);
        emu_dev_allocs[(uintptr_t)*p] = std::make_pair(n, emu_current);
        emu_dev_used[emu_current & 63] += n;
        if (getenv("EMU_MALLOC_TRACE")) fprintf(stderr, "emu: cudaMalloc %zu bytes on device %d\n", n, emu_current);
    }
    return e;
}
cudaError_t cudaFree(void *p) {
    emu_drain_all();
    {
        std::lock_guard<std::mutex> g(emu_dev_mu);
        auto it = emu_dev_allocs.find((uintptr_t)p);
        if (it != emu_dev_allocs.end()) {
            emu_dev_used[it->second.second & 63] -= it->second.first;
            emu_dev_allocs.erase(it);
        }
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    cudaError_t e = emu_alloc(p, n);
    if (e == cudaSuccess) {
        std::lock_guard<std::mutex> g(emu_pin_mu);
        emu_pinned[(uintptr_t)*p] = n;
    }
    return e;
}
cudaError_t cudaFreeHost(void *p) {
    emu_drain_all();
    {
        std::lock_guard<std::mutex> g(emu_pin_mu);
        emu_pinned.erase((uintptr_t)p);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    if (st && st->capturing) {
        /* host memory in a graph must be pinned and stay valid for every replay; the
         * backend never records host copies, so any is a bug here */
        if (k != cudaMemcpyDeviceToDevice) return emu_refuse(st);
        st->rec.push_back([d, s, n] { memmove(d, s, n); });
        return cudaSuccess;
    }
    if (!st || !emu_async() || !n) {
        memmove(d, s, n);
        return cudaSuccess;
    }
    if (k == cudaMemcpyHostToDevice && !emu_is_pinned(s)) {
        /* pageable source: staged at the call, so the caller may reuse it at once */
        auto copy = std::make_shared<std::vector<unsigned char>>((const unsigned char *)s, (const unsigned char *)s + n);
        emu_stream_exec(st, [d, copy] { std::memcpy(d, copy->data(), copy->size()); });
        return cudaSuccess;
    }
    if (k == cudaMemcpyDeviceToHost && !emu_is_pinned(d)) {
        /* pageable destination: CUDA returns once the copy is done */
        emu_stream_exec(st, [d, s, n] { memmove(d, s, n); });
        emu_drain(st);
        return cudaSuccess;
    }
    /* a pinned destination holds garbage until the stream gets to the copy: a host read
     * that does not wait for it sees NaN bytes (a buffer that is both the source of a
     * queued copy and the destination of a later one in the same stream would read the
     * poison too; the backend has none) */
    if (k == cudaMemcpyDeviceToHost) std::memset(d, 0xFF, n);
    emu_stream_exec(st, [d, s, n] { memmove(d, s, n); });
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind k, cudaStream_t st) {
    /* CUDA's rule: a row wider than either pitch is an error */
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    if (k != cudaMemcpyDeviceToDevice && k != cudaMemcpyDefault) return cudaErrorInvalidValue;
    auto run = [d, dpitch, s, spitch, width, height] {
        for (size_t r = 0; r < height; r++)
            memmove((char *)d + r * dpitch, (const char *)s + r * spitch, width);
    };
    if (st && st->capturing) {
        st->rec.push_back(run);
        return cudaSuccess;
    }
    if (!st || !emu_async() || !width || !height) {
        run();
        return cudaSuccess;
    }
    emu_stream_exec(st, run);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    emu_stream_exec(st, [d, v, n] { memset(d, v, n); });
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu_last_error;
    emu_last_error = cudaSuccess;
    return e;
}
/* EMU_MEM_GB sets the emulated device's size (default 80), 1% of it in use before the
 * process's own cudaMalloc'd bytes */
cudaError_t cudaMemGetInfo(size_t *fr, size_t *to) {
    const char *e = getenv("EMU_MEM_GB");
    double gb = e ? atof(e) : 80.0;
    *to = (size_t)(gb * (double)(1 << 30));
    size_t used;
    {
        std::lock_guard<std::mutex> g(emu_dev_mu);
        used = emu_dev_used[emu_current & 63];
    }
    *fr = *to / 100 * 99 > used ? *to / 100 * 99 - used : 0;
    return cudaSuccess;
}
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation" : "cudaErrorEmulated"; }
const char *cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_blas(); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->s = s; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *ws, size_t bytes) {
    return ws && bytes ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
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
static cublasStatus_t gemm_check(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb,
                                 cudaDataType Ct, int ldc) {
    if (Ct != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
static cublasStatus_t gemm1(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                            const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt, int ldb,
                            float beta, void *C, cudaDataType Ct, int ldc) {
    if (cublasStatus_t st = gemm_check(ta, tb, m, n, k, lda, ldb, Ct, ldc)) return st;
    float *c = (float *)C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? ld(A, At, i + (long long)p * lda) : ld(A, At, p + (long long)i * lda);
                float b = tb == CUBLAS_OP_N ? ld(B, Bt, p + (long long)j * ldb) : ld(B, Bt, j + (long long)p * ldb);
                s += (double)a * b;
            }
            /* the epilogue as cuBLAS's FP32 compute type does it: the product rounded to
               FP32 first, then alpha * acc + beta * C in FP32. Folding C into the double
               sum instead rounds once where a GPU rounds twice, so y += x_lo W^T (the
               residual GEMM with beta 1) differed in the last bit from the fused hi+lo
               path's y + lo, and a prompt prefilled in one chunk (T > EG_CUDA_FUSE_T)
               from the same prompt in small ones (make sweep EMU_SWEEP=1 found it) */
            float *dst = c + i + (long long)j * ldc;
            float acc = (float)s, out = alpha * acc;
            if (beta != 0) out += beta * *dst;
            *dst = out;
        }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt,
                            int ldb, const void *beta, void *C, cudaDataType Ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
    float al = *(const float *)alpha, be = *(const float *)beta; /* host pointer mode: read at the call */
    if (cublasStatus_t st = gemm_check(ta, tb, m, n, k, lda, ldb, Ct, ldc)) return st;
    emu_stream_exec(h->s, [=] { gemm1(ta, tb, m, n, k, al, A, At, lda, B, Bt, ldb, be, C, Ct, ldc); });
    return CUBLAS_STATUS_SUCCESS;
}

static size_t esz(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType At, int lda,
                                          long long sA, const void *B, cudaDataType Bt, int ldb, long long sB,
                                          const void *beta, void *C, cudaDataType Ct, int ldc, long long sC, int batch,
                                          cublasComputeType_t, cublasGemmAlgo_t) {
    float al = *(const float *)alpha, be = *(const float *)beta;
    auto run = [=] {
        for (int i = 0; i < batch; i++) {
            cublasStatus_t s = gemm1(ta, tb, m, n, k, al, (const char *)A + i * sA * esz(At), At, lda,
                                     (const char *)B + i * sB * esz(Bt), Bt, ldb, be, (char *)C + i * sC * esz(Ct),
                                     Ct, ldc);
            if (s) return s;
        }
        return CUBLAS_STATUS_SUCCESS;
    };
    if (cublasStatus_t st = gemm_check(ta, tb, m, n, k, lda, ldb, Ct, ldc)) return st;
    emu_stream_exec(h->s, [run] { run(); });
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    float al = *alpha, be = *beta;
    if (cublasStatus_t st = gemm_check(ta, tb, m, n, k, lda, ldb, CUDA_R_32F, ldc)) return st;
    emu_stream_exec(h->s, [=] { gemm1(ta, tb, m, n, k, al, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, be, C, CUDA_R_32F,
                                      ldc); });
    return CUBLAS_STATUS_SUCCESS;
}

}
