/* The NCCL pipeline transport: one rank per stage GPU (ncclCommInitAll), every link
 * connected at creation (nccl_connect), rows moved by ncclSend/ncclRecv on each stage's
 * own stream, so no host thread waits for a hand-over. See transport.h for the ordering contract.
 * A send or recv whose link fails after it was enqueued never completes, so the stage
 * backends' host waits must not block on their streams: the transport installs a wait
 * check on each (eg_backend_cuda_add_wait_check) that polls the stage's communicator's
 * asynchronous error and the owner's failure flag (t->failed). Built with EG_HAVE_NCCL (the
 * Makefile sets it when nccl.h and libnccl are found next to nvcc); otherwise
 * eg_transport_nccl_create reports EG_ERR_UNSUPPORTED. */
#include "engine/transport.h"

#include <stdlib.h>

#include "engine/cuda_plan.h"

#ifndef EG_HAVE_NCCL

int eg_transport_have_nccl(void) { return 0; }

eg_status eg_transport_nccl_create(const eg_transport_opts *o, eg_transport **out, eg_error *err) {
    (void)o;
    *out = NULL;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "nccl transport: built without NCCL (nccl.h/libnccl not found at build time)");
}

#else

#include <cuda_runtime_api.h>
#include <nccl.h>

typedef struct nccl_impl nccl_impl;
typedef struct stage_wait { /* a stage backend's wait check */
    eg_transport *t;
    nccl_impl *N;
    int k;
    eg_cuda_wait_hook hook; /* on the stage's backend while the transport lives */
} stage_wait;

struct nccl_impl {
    int n;              /* ranks = stages */
    int *dev;           /* [n] */
    cudaStream_t *strm; /* [n] each stage backend's stream (borrowed) */
    ncclComm_t *comm;   /* [n] */
    eg_backend **be;    /* [n] the stage backends (borrowed), their wait checks installed */
    stage_wait *wait;   /* [n] */
};

static eg_status nccl_fail(eg_error *err, const char *call, ncclResult_t r) {
    return eg_fail(err, EG_ERR_DEVICE, "nccl transport: %s failed: %s", call, ncclGetErrorString(r));
}

static eg_status nccl_send(eg_transport *t, int k, int mb, const float *src, size_t n, eg_error *err) {
    nccl_impl *N = t->impl;
    (void)mb;
    if (k < 0 || k >= N->n - 1) return eg_fail(err, EG_ERR_INVALID, "nccl transport: no link %d", k);
    ncclResult_t r = ncclSend(src, n, ncclFloat32, k + 1, N->comm[k], N->strm[k]);
    if (r != ncclSuccess) return nccl_fail(err, "ncclSend", r);
    return EG_OK;
}

static eg_status nccl_recv(eg_transport *t, int k, int mb, float *dst, size_t n, eg_error *err) {
    nccl_impl *N = t->impl;
    (void)mb;
    if (k < 0 || k >= N->n - 1) return eg_fail(err, EG_ERR_INVALID, "nccl transport: no link %d", k);
    ncclResult_t r = ncclRecv(dst, n, ncclFloat32, k, N->comm[k + 1], N->strm[k + 1]);
    if (r != ncclSuccess) return nccl_fail(err, "ncclRecv", r);
    return EG_OK;
}

/* Stage k's backend, while it waits on its stream (its thread): stage k's communicator
 * carries only stage k's own sends and recvs, which this thread posts, so the query needs
 * no lock. */
static eg_status stage_wait_check(void *ctx, eg_error *err) {
    stage_wait *w = ctx;
    if (__atomic_load_n(&w->t->failed, __ATOMIC_ACQUIRE))
        return eg_fail(err, EG_ERR_INTERRUPTED, "nccl transport: stage %d stops waiting: the run failed", w->k);
    ncclResult_t ae = ncclSuccess, r = ncclCommGetAsyncError(w->N->comm[w->k], &ae);
    if (r == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress) r = ae;
    if (r != ncclSuccess)
        return eg_fail(err, EG_ERR_DEVICE, "nccl transport: stage %d: ncclCommGetAsyncError (waiting for a hand-over): %s",
                       w->k, ncclGetErrorString(r));
    return EG_OK;
}

static void nccl_destroy(eg_transport *t) {
    if (!t) return;
    nccl_impl *N = t->impl;
    if (N) {
        for (int k = 0; N->be && k < N->n; k++) /* the backends outlive the transport */
            if (N->be[k]) eg_backend_cuda_remove_wait_check(N->be[k], &N->wait[k].hook);
        for (int k = 0; N->comm && k < N->n; k++)
            if (N->comm[k]) {
                cudaSetDevice(N->dev[k]);
                if (t->failed) { /* a send or receive whose peer gave up would never finish */
                    ncclCommAbort(N->comm[k]);
                    continue;
                }
                if (N->strm) cudaStreamSynchronize(N->strm[k]);
                ncclCommDestroy(N->comm[k]);
            }
        free(N->comm);
        free(N->be);
        free(N->wait);
        free(N->strm);
        free(N->dev);
        free(N);
    }
    free(t);
}

static const eg_transport_ops nccl_ops = {"nccl", nccl_send, nccl_recv, nccl_destroy};

/* Connect every link now, from this one thread, in one group: one float from each stage
 * to the next. NCCL connects a pair lazily, in the first ncclSend/ncclRecv between them,
 * on the calling thread, and that call returns only once the peer's first call has run
 * its half of the setup (transport setup exchanges connection data through the
 * bootstrap and waits for the answer). Left to the stage threads, stage k's first send
 * would wait for stage k+1's first recv, which stage k+1 posts only after the
 * micro-batch arrives, i.e. after that send returned: every pipeline would hang on its
 * first hand-over. Connected here, a send only enqueues its kernel, whatever its size,
 * and the host never waits for a peer (transport.h, ordering contract). */
static eg_status nccl_connect(nccl_impl *N, eg_error *err) {
    float **one = eg_calloc((size_t)N->n, sizeof *one, err);
    if (!one) return EG_ERR_NOMEM;
    eg_status st = EG_OK;
    cudaError_t ce = cudaSuccess;
    for (int k = 0; k < N->n && ce == cudaSuccess; k++) {
        ce = cudaSetDevice(N->dev[k]);
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&one[k], 2 * sizeof(float));
        if (ce == cudaSuccess) ce = cudaMemsetAsync(one[k], 0, 2 * sizeof(float), N->strm[k]);
    }
    if (ce != cudaSuccess) {
        st = eg_fail(err, EG_ERR_DEVICE, "nccl transport: connecting the links: %s", cudaGetErrorString(ce));
    } else {
        ncclResult_t r = ncclGroupStart();
        for (int k = 0; k + 1 < N->n && r == ncclSuccess; k++) {
            cudaSetDevice(N->dev[k]);
            r = ncclSend(one[k], 1, ncclFloat32, k + 1, N->comm[k], N->strm[k]);
            cudaSetDevice(N->dev[k + 1]);
            if (r == ncclSuccess) r = ncclRecv(one[k + 1] + 1, 1, ncclFloat32, k, N->comm[k + 1], N->strm[k + 1]);
        }
        ncclResult_t re = ncclGroupEnd();
        if (r == ncclSuccess) r = re;
        if (r != ncclSuccess) st = nccl_fail(err, "ncclSend/ncclRecv (connecting the links)", r);
        for (int k = 0; k < N->n && !st; k++) {
            cudaSetDevice(N->dev[k]);
            if ((ce = cudaStreamSynchronize(N->strm[k])) != cudaSuccess)
                st = eg_fail(err, EG_ERR_DEVICE, "nccl transport: connecting link to stage %d: %s", k,
                             cudaGetErrorString(ce));
        }
    }
    for (int k = 0; k < N->n; k++)
        if (one[k]) {
            cudaSetDevice(N->dev[k]);
            cudaFree(one[k]);
        }
    free(one);
    return st;
}

int eg_transport_have_nccl(void) { return 1; }

eg_status eg_transport_nccl_create(const eg_transport_opts *o, eg_transport **out, eg_error *err) {
    *out = NULL;
    if (!o->stages || o->n_stages < 2)
        return eg_fail(err, EG_ERR_INVALID, "nccl transport: need at least 2 stages");
    eg_transport *t = eg_calloc(1, sizeof *t, err);
    nccl_impl *N = t ? eg_calloc(1, sizeof *N, err) : NULL;
    if (!N) { free(t); return EG_ERR_NOMEM; }
    t->ops = &nccl_ops;
    t->impl = N;
    N->n = o->n_stages;
    N->dev = eg_calloc((size_t)N->n, sizeof *N->dev, err);
    N->strm = eg_calloc((size_t)N->n, sizeof *N->strm, err);
    N->comm = eg_calloc((size_t)N->n, sizeof *N->comm, err);
    N->be = eg_calloc((size_t)N->n, sizeof *N->be, err);
    N->wait = eg_calloc((size_t)N->n, sizeof *N->wait, err);
    if (!N->dev || !N->strm || !N->comm || !N->be || !N->wait) { nccl_destroy(t); return EG_ERR_NOMEM; }
    for (int k = 0; k < N->n; k++) {
        void *s = NULL;
        if (eg_backend_cuda_device(o->stages[k], &N->dev[k], &s)) {
            nccl_destroy(t);
            return eg_fail(err, EG_ERR_UNSUPPORTED, "nccl transport: stage %d is not on a CUDA backend (use --transport local)", k);
        }
        N->strm[k] = (cudaStream_t)s;
        for (int j = 0; j < k; j++)
            if (N->dev[j] == N->dev[k]) {
                int d = N->dev[k];
                nccl_destroy(t);
                return eg_fail(err, EG_ERR_UNSUPPORTED, "nccl transport: stages %d and %d share GPU %d; NCCL needs one "
                               "GPU per stage (use --transport local)", j, k, d);
            }
    }
    int prev = 0;
    cudaGetDevice(&prev);
    ncclResult_t r = ncclCommInitAll(N->comm, N->n, N->dev);
    cudaSetDevice(prev);
    if (r != ncclSuccess) {
        t->failed = 1; /* the communicators NCCL made before the failure are aborted, not waited for */
        nccl_destroy(t);
        return nccl_fail(err, "ncclCommInitAll", r);
    }
    eg_status st = nccl_connect(N, err);
    cudaSetDevice(prev);
    if (st) {
        t->failed = 1; /* a half-made connection must not be waited for */
        nccl_destroy(t);
        return st;
    }
    for (int k = 0; k < N->n; k++) {
        N->wait[k] = (stage_wait){t, N, k, {0}};
        N->wait[k].hook = (eg_cuda_wait_hook){stage_wait_check, &N->wait[k], NULL};
        N->be[k] = o->stages[k];
        eg_backend_cuda_add_wait_check(N->be[k], &N->wait[k].hook);
    }
    *out = t;
    return EG_OK;
}

#endif
