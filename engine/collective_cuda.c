/* collective_cuda.c — the expert-parallel group of CUDA ranks (collective_cuda.h,
 * collective.h): nccl, or cuda-local where ranks share a GPU or NCCL is not built.
 * Built with EG_HAVE_CUDA (NCCL parts with EG_HAVE_NCCL); otherwise create reports
 * EG_ERR_UNSUPPORTED.
 *
 * One call on rank r (T tokens, K pairs each, R ranks, M = min(K, R)):
 *   1. eg_cuda_ep_pack (kernels/ep.cu) groups the pairs by owner: counts {rows, pairs, layer, left} per peer,
 *      the tokens to send (each once per owning rank) and the pairs' row/id/weight.
 *   2. counts to every peer and from every peer: one grouped ncclSend/ncclRecv (or the
 *      cuda-local copies: the same segments, pulled by the reader); then the
 *      sent and received counts to page-locked host memory and the call's one host wait.
 *   3. the rows gathered into segments by destination (gather_rows), every segment with
 *      its pair metadata to its rank, the peers' segments received (one group).
 *   4. per source, per chunk of at most max_tokens pairs: the rows gathered per pair and
 *      the backend's moe op with topk 1 over r's experts: 0 + w * expert(x), the bits the
 *      unsplit op adds for that pair.
 *   5. the contributions back to their token's owner (one group); eg_cuda_ep_combine adds
 *      each token's K contributions in ascending expert id into y.
 * A shared-expert / dense-MLP call (ffn_split, eg_ep_cuda_ffn) shares step 2 and the
 * posts: counts {rows to q, 0, layer, flags} written from the host (flags bit 0: left,
 * bit 1: an ffn call; a rank that left learns the call's kind from the counts), every
 * rank's rows to the layer's owner (layer mod R, collective.h's eg_ep_ffn_owner), the
 * owner's swiglu_mlp over each source's rows (accumulate 0: the rows the unsplit op
 * computes for that rank's call of the same size), the rows back, and the token's rank
 * writes them (dense) or adds them after the routed sum (MoE), as forward.c's unsplit
 * path does.
 * The vocab split's calls (vocab_split, eg_ep_cuda_embed / eg_ep_cuda_logits) share step 2
 * too (flags bit 2: an embedding call, bit 3: an lm_head call): the embedding's ids go to
 * the host once, grouped by owner, to the owners (embed op on the slice) and the rows back;
 * the lm_head's rows go to every rank (linear per source with the slice) and each slice's
 * [n][v1-v0] block back into its columns (post_segs: one segment per peer and direction).
 * Sends and receives between two ranks happen in the same order on both sides and are
 * sized from the exchanged counts, so they pair up. Rank r's own segment is copied on
 * its device instead of sent. A rank enqueues NCCL work under its own mutex, which
 * eg_ep_cuda_fail takes to abort that rank's communicator, so no call uses an aborted one;
 * one lock per rank, not one for the group, because ncclGroupEnd may block (a launch queue
 * that drains only once a peer posts, or NCCL_LAUNCH_MODE=GROUP waiting for every rank's
 * launch), and a peer waiting for a group-wide lock would never post. Host waits on an
 * nccl stream poll it with the communicator's asynchronous error (stream_wait): a
 * transfer whose link or peer failed never completes. */
#include "engine/collective_cuda.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The exchange's buffers: host arithmetic, in both builds (the planners count them
 * without CUDA too). Sizes in elements, per rank. */
typedef struct ep_sizes {
    size_t counts, sendtok, sendrows, sendmeta, tk2pair, recvrows, recvmeta, xs, res, back;
} ep_sizes;

static ep_sizes sizes_of(int R, int K, int H, int T) {
    size_t M = (size_t)(K < R ? K : R), TK = (size_t)T * (size_t)K, h = (size_t)H;
    ep_sizes z = {.counts = 8 * (size_t)R, .sendtok = (size_t)T * M, .sendrows = (size_t)T * M * h,
                  .sendmeta = 3 * TK, .tk2pair = TK, .recvrows = (size_t)R * (size_t)T * h,
                  .recvmeta = 3 * (size_t)R * TK, .xs = (size_t)T * h, .res = (size_t)R * TK * h, .back = TK * h};
    return z;
}

/* The lm_head exchange's rows per source and round: its two logit buffers are sized by it,
 * not by max_tokens (Kimi-K2.5: 2 x 128 x 163,840 floats = 168 MB, where 2 x max_tokens
 * rows would take 1.3 GB at a 512-token chunk); a step's logit rows are one per sequence
 * (k + 1 with a drafter), so one round covers most steps. */
#define EP_VOCAB_ROUND_ROWS 128
static int vocab_rows(const eg_ep_opts *o) {
    return o->max_tokens < EP_VOCAB_ROUND_ROWS ? o->max_tokens : EP_VOCAB_ROUND_ROWS;
}

/* vocab_split's two logit buffers, in floats */
static size_t vres_of(const eg_ep_opts *o) {
    return o->vocab_split ? (size_t)o->n_ranks * (size_t)vocab_rows(o) * ((size_t)o->vocab / (size_t)o->n_ranks + 1) : 0;
}
static size_t vback_of(const eg_ep_opts *o) {
    return o->vocab_split ? (size_t)vocab_rows(o) * (size_t)o->vocab : 0;
}

int64_t eg_ep_cuda_bytes(const eg_ep_opts *o) {
    ep_sizes z = sizes_of(o->n_ranks, o->topk, o->hidden, o->max_tokens);
    return 4 * (int64_t)(z.counts + z.sendtok + z.sendrows + z.sendmeta + z.tk2pair + z.recvrows + z.recvmeta + z.xs +
                         z.res + z.back + vres_of(o) + vback_of(o));
}

#ifndef EG_HAVE_CUDA

eg_status eg_ep_cuda_create(const eg_ep_opts *o, eg_ep_cuda **out, eg_error *err) {
    (void)o;
    *out = NULL;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "--ep on CUDA backends: built without CUDA");
}
const char *eg_ep_cuda_kind(const eg_ep_cuda *n) {
    (void)n;
    return "none";
}
int eg_ep_cuda_devices(void) { return 0; }
void eg_ep_cuda_free(eg_ep_cuda *n) { (void)n; }
eg_status eg_ep_cuda_moe(eg_ep_cuda *n, int rank, int layer, const eg_expert_w *const *layers, eg_backend *be,
                         const eg_moe_args *a, eg_error *err) {
    (void)n; (void)rank; (void)layer; (void)layers; (void)be; (void)a;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel group: built without CUDA");
}
eg_status eg_ep_cuda_ffn(eg_ep_cuda *n, int rank, int layer, const eg_weight *const *ffn_w, eg_backend *be,
                         const float *x, int T, float *y, int accumulate, eg_error *err) {
    (void)n; (void)rank; (void)layer; (void)ffn_w; (void)be; (void)x; (void)T; (void)y; (void)accumulate;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel group: built without CUDA");
}
eg_status eg_ep_cuda_leave(eg_ep_cuda *n, int rank, const eg_expert_w *const *layers, const eg_weight *const *ffn_w,
                           eg_backend *be, eg_error *err) {
    (void)n; (void)rank; (void)layers; (void)ffn_w; (void)be;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel group: built without CUDA");
}
int64_t eg_ep_cuda_ffn_rows(const eg_ep_cuda *n) {
    (void)n;
    return 0;
}
void eg_ep_cuda_fail(eg_ep_cuda *n) { (void)n; }
void eg_ep_cuda_traffic(const eg_ep_cuda *n, int64_t *remote_pairs, int64_t *bytes) {
    (void)n;
    *remote_pairs = *bytes = 0;
}
void eg_ep_cuda_register_vocab(eg_ep_cuda *n, int rank, const eg_weight *embed, const eg_weight *lm_head) {
    (void)n; (void)rank; (void)embed; (void)lm_head;
}
eg_status eg_ep_cuda_embed(eg_ep_cuda *n, int rank, eg_backend *be, const int32_t *tokens, int T, float *x,
                           eg_error *err) {
    (void)n; (void)rank; (void)be; (void)tokens; (void)T; (void)x;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel group: built without CUDA");
}
eg_status eg_ep_cuda_logits(eg_ep_cuda *n, int rank, eg_backend *be, const float *rows, int n_rows, float *logits,
                            eg_error *err) {
    (void)n; (void)rank; (void)be; (void)rows; (void)n_rows; (void)logits;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel group: built without CUDA");
}
void eg_ep_cuda_vocab_rows(const eg_ep_cuda *n, int64_t *embed_rows, int64_t *logit_rows) {
    (void)n;
    *embed_rows = *logit_rows = 0;
}

#else

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#ifdef EG_HAVE_NCCL
#include <nccl.h>
#else
typedef void *ncclComm_t; /* never created: cuda-local only */
#endif

#include "engine/cuda_plan.h"

/* One transfer to or from a peer: bytes at p (on the rank's GPU). */
typedef struct ep_seg {
    void *p;
    size_t bytes;
} ep_seg;

typedef struct ep_nrank {
    int32_t *counts_d;  /* [2][R][4] device: sent to each peer, then received from each */
    int32_t *counts_h;  /* [2][2][R][4] page-locked: the copy of counts_d read back, then the counts an
                           ffn call uploads (its own area: never a copy's source and a later one's target) */
    int32_t *sendtok;   /* [T*M] token of each send row, segments by destination */
    float *sendrows;    /* [T*M][H] */
    int32_t *sendmeta;  /* [3*T*K] per destination: row-in-segment, id, weight bits */
    int32_t *tk2pair;   /* [T*K] position of (t,k) in back */
    float *recvrows;    /* [R*T][H] rows received, segments by source (a source sends a token once per rank) */
    int32_t *recvmeta;  /* [3*R*T*K] */
    float *xs;          /* [T][H] one chunk's rows, one per pair */
    float *res;         /* [R*T*K][H] contributions computed here, segments by source */
    float *back;        /* [T*K][H] contributions to this rank's pairs, segments by owner */
    int64_t *so_r, *so_p, *ro_r, *ro_p; /* [R+1] host offsets: sent rows/pairs, received rows/pairs */
    /* vocab_split only */
    int32_t *vh;        /* [3][T] page-locked: an embedding call's ids read back, their local ids by owner, and
                           each token's position in the rows that come back */
    float *vres;        /* [R*VL][V/R+1] this rank's lm_head slice's logits of a round's rows, by source */
    float *vback;       /* [VL*V] the other ranks' logits of this rank's round rows: from rank p at m*v0(p) */
    ep_seg *snd, *rcv;  /* [R] a vocab call's one segment to / from each peer (post_segs) */
    const eg_weight *vembed, *vhead; /* [v1-v0][H] this rank's slices (borrowed; NULL until registered) */
    int64_t remote_pairs, bytes, ffn_rows, embed_rows, logit_rows;
    pthread_mutex_t mu; /* held while enqueueing on this rank's communicator, and to abort it */
    int mu_made;
    /* nccl: the rank backend's wait check (rank_wait_check), so its own host waits (sample,
       sync, an expert table) on a stream that still carries the exchange's transfers stop
       when the link or the group fails, instead of blocking on a transfer that never ends */
    eg_cuda_wait_hook hook;
    eg_backend *be;     /* the backend it was added to (borrowed), or NULL */
    struct eg_ep_cuda *n;
    int r;
} ep_nrank;

struct eg_ep_cuda {
    eg_ep_opts o; /* backends NULL */
    int R, K, H, T, M;
    int64_t V; /* vocab_split: the vocabulary, else 0 */
    int VL;    /* vocab_split: the lm_head exchange's rows per source and round (vocab_rows) */
    int *dev;           /* [R] */
    cudaStream_t *strm; /* [R] the backends' streams (borrowed) */
    ncclComm_t *comm;   /* [R] */
    ep_nrank *rk;       /* [R] */
    int use_nccl;       /* else cuda-local */
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* cuda-local barriers */
    int arrived;
    uint64_t gen;
    int failed; /* set once under mu; read without it too (atomically) */
};

const char *eg_ep_cuda_kind(const eg_ep_cuda *n) { return n->use_nccl ? "nccl" : "cuda-local"; }

int eg_ep_cuda_devices(void) {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return c;
}

static eg_status cu_err(eg_error *err, int rank, const char *call, cudaError_t e) {
    return eg_fail(err, EG_ERR_DEVICE, "expert-parallel rank %d: %s: %s", rank, call, cudaGetErrorString(e));
}
#ifdef EG_HAVE_NCCL
static eg_status nc_err(eg_error *err, int rank, const char *call, ncclResult_t r) {
    return eg_fail(err, EG_ERR_DEVICE, "expert-parallel rank %d: %s: %s", rank, call, ncclGetErrorString(r));
}
#endif
static eg_status interrupted(eg_error *err) {
    return eg_fail(err, EG_ERR_INTERRUPTED, "expert-parallel group: another rank failed");
}

void eg_ep_cuda_traffic(const eg_ep_cuda *n, int64_t *remote_pairs, int64_t *bytes) {
    *remote_pairs = *bytes = 0;
    for (int r = 0; r < n->R; r++) {
        *remote_pairs += n->rk[r].remote_pairs;
        *bytes += n->rk[r].bytes;
    }
}

int64_t eg_ep_cuda_ffn_rows(const eg_ep_cuda *n) {
    int64_t rows = 0;
    for (int r = 0; r < n->R; r++) rows += n->rk[r].ffn_rows;
    return rows;
}

void eg_ep_cuda_vocab_rows(const eg_ep_cuda *n, int64_t *embed_rows, int64_t *logit_rows) {
    *embed_rows = *logit_rows = 0;
    for (int r = 0; r < n->R; r++) {
        *embed_rows += n->rk[r].embed_rows;
        *logit_rows += n->rk[r].logit_rows;
    }
}

void eg_ep_cuda_register_vocab(eg_ep_cuda *n, int rank, const eg_weight *embed, const eg_weight *lm_head) {
    if (rank < 0 || rank >= n->R) return;
    if (embed) n->rk[rank].vembed = embed;
    if (lm_head) n->rk[rank].vhead = lm_head;
}

void eg_ep_cuda_fail(eg_ep_cuda *n) {
    pthread_mutex_lock(&n->mu);
    pthread_cond_broadcast(&n->cv);
    int first = !n->failed;
    __atomic_store_n(&n->failed, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&n->mu);
    if (!first) return;
#ifdef EG_HAVE_NCCL
    /* Each rank's communicator under its own lock (NCCL takes no two calls on one
       communicator at once), a transfer whose peer gave up would never finish. The lock
       is tried, not waited for: a rank inside ncclGroupEnd holds it, and that call may
       block until a peer posts, which a failed peer never does. Such a rank aborts its
       own communicator when the call returns (abort_own); a lock held for a moment (a
       wait's error query) is retried for about 50 ms. */
    int prev = 0;
    cudaGetDevice(&prev);
    for (int r = 0; n->comm && r < n->R; r++) {
        int locked = !n->rk[r].mu_made;
        for (int i = 0; !locked && i < 500; i++) {
            locked = !pthread_mutex_trylock(&n->rk[r].mu);
            if (!locked) {
                struct timespec ts = {0, 100000};
                nanosleep(&ts, NULL);
            }
        }
        if (!locked) continue; /* left to the rank itself */
        if (n->comm[r]) {
            cudaSetDevice(n->dev[r]);
            ncclCommAbort(n->comm[r]);
            n->comm[r] = NULL;
        }
        if (n->rk[r].mu_made) pthread_mutex_unlock(&n->rk[r].mu);
    }
    cudaSetDevice(prev);
#endif
}

#ifdef EG_HAVE_NCCL
/* Rank's thread, rk[rank].mu held, the group failed: its communicator aborted here when
 * eg_ep_cuda_fail could not take the lock. */
static void abort_own(eg_ep_cuda *n, int rank) {
    if (!n->comm[rank]) return;
    ncclCommAbort(n->comm[rank]);
    n->comm[rank] = NULL;
}
#endif

static int failed_now(eg_ep_cuda *n) { return __atomic_load_n(&n->failed, __ATOMIC_ACQUIRE); }

void eg_ep_cuda_free(eg_ep_cuda *n) {
    if (!n) return;
    for (int r = 0; n->rk && r < n->R; r++) /* the backends outlive the group */
        if (n->rk[r].be) eg_backend_cuda_remove_wait_check(n->rk[r].be, &n->rk[r].hook);
    int prev = 0;
    cudaGetDevice(&prev);
#ifdef EG_HAVE_NCCL
    for (int r = 0; n->comm && n->dev && r < n->R; r++)
        if (n->comm[r]) {
            cudaSetDevice(n->dev[r]);
            if (failed_now(n)) { /* one eg_ep_cuda_fail left to its rank: never waited for */
                ncclCommAbort(n->comm[r]);
                continue;
            }
            cudaStreamSynchronize(n->strm[r]);
            ncclCommDestroy(n->comm[r]);
        }
#endif
    for (int r = 0; n->rk && n->dev && r < n->R; r++) { /* (dev NULL: create failed before any buffer) */
        ep_nrank *k = &n->rk[r];
        cudaSetDevice(n->dev[r]);
        void *ps[] = {k->counts_d, k->sendtok, k->sendrows, k->sendmeta, k->tk2pair, k->recvrows, k->recvmeta, k->xs,
                      k->res, k->back, k->vres, k->vback};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
            if (ps[i]) cudaFree(ps[i]);
        eg_cuda_host_free(k->counts_h);
        eg_cuda_host_free(k->vh);
        if (k->mu_made) pthread_mutex_destroy(&k->mu);
        free(k->snd);
        free(k->rcv);
        free(k->so_r);
        free(k->so_p);
        free(k->ro_r);
        free(k->ro_p);
    }
    cudaSetDevice(prev);
    free(n->rk);
    free(n->comm);
    free(n->strm);
    free(n->dev);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n);
}

#ifdef EG_HAVE_NCCL
/* The asynchronous error of communicator c (a link or peer that failed after the work was
 * enqueued): the query's own failure, else the error it reports; ncclSuccess while fine. */
static ncclResult_t async_error(ncclComm_t c) {
    ncclResult_t ae = ncclSuccess, r = ncclCommGetAsyncError(c, &ae);
    return r == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress ? ae : r;
}

/* The same for rank's communicator, under the rank's lock (eg_ep_cuda_fail aborts it
 * under that lock); ncclSuccess once it is aborted. */
static ncclResult_t rank_async_error(eg_ep_cuda *n, int rank) {
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&n->rk[rank].mu);
    if (n->comm[rank]) r = async_error(n->comm[rank]);
    pthread_mutex_unlock(&n->rk[rank].mu);
    return r;
}

/* Rank k->r's backend, while it waits on its stream (the rank's thread): the group's
 * failure, and the communicator's asynchronous error (stream_wait's checks). */
static eg_status rank_wait_check(void *ctx, eg_error *err) {
    ep_nrank *k = ctx;
    if (failed_now(k->n))
        return eg_fail(err, EG_ERR_INTERRUPTED, "expert-parallel rank %d stops waiting: the group failed", k->r);
    ncclResult_t r = rank_async_error(k->n, k->r);
    if (r != ncclSuccess) return nc_err(err, k->r, "ncclCommGetAsyncError (waiting on the rank's stream)", r);
    return EG_OK;
}

/* Every ordered pair connected now, from this thread, in one group (transport_nccl.c's
 * nccl_connect explains why: NCCL connects a pair in its first send/recv, on the calling
 * thread, waiting for the peer's half). */
static eg_status connect_all(eg_ep_cuda *n, eg_error *err) {
    for (int a = 0; a < n->R; a++) { /* every device usable before the group starts */
        cudaError_t ce = cudaSetDevice(n->dev[a]);
        if (ce != cudaSuccess) return cu_err(err, a, "cudaSetDevice (connecting)", ce);
    }
    ncclResult_t r = ncclGroupStart();
    for (int a = 0; a < n->R && r == ncclSuccess; a++) {
        cudaSetDevice(n->dev[a]); /* checked above */
        for (int b = 0; b < n->R && r == ncclSuccess; b++) {
            if (a == b) continue;
            r = ncclSend(n->rk[a].counts_d, 1, ncclInt32, b, n->comm[a], n->strm[a]);
            if (r == ncclSuccess) r = ncclRecv(n->rk[a].counts_d + 4 * n->R + b, 1, ncclInt32, b, n->comm[a], n->strm[a]);
        }
    }
    ncclResult_t re = ncclGroupEnd();
    if (r == ncclSuccess) r = re;
    if (r != ncclSuccess) return nc_err(err, 0, "ncclSend/ncclRecv (connecting every pair)", r);
    /* polled, as stream_wait polls: a pair whose connection fails after the group was
       enqueued would leave a plain synchronise waiting forever */
    for (int a = 0; a < n->R; a++) {
        cudaSetDevice(n->dev[a]);
        for (double t_check = eg_now();;) {
            cudaError_t ce = cudaStreamQuery(n->strm[a]);
            if (ce == cudaSuccess) break;
            if (ce != cudaErrorNotReady) return cu_err(err, a, "cudaStreamQuery (connecting)", ce);
            if (eg_now() - t_check > 1e-3) {
                ncclResult_t q = async_error(n->comm[a]);
                if (q != ncclSuccess) return nc_err(err, a, "ncclCommGetAsyncError (connecting every pair)", q);
                t_check = eg_now();
            }
            sched_yield();
        }
    }
    return EG_OK;
}
#endif

eg_status eg_ep_cuda_create(const eg_ep_opts *o, eg_ep_cuda **out, eg_error *err) {
    *out = NULL;
    int R = o->n_ranks;
    if (R < 2) return eg_fail(err, EG_ERR_INVALID, "expert-parallel CUDA group: needs at least 2 ranks (got %d)", R);
    eg_ep_cuda *n = eg_calloc(1, sizeof *n, err);
    if (!n) return EG_ERR_NOMEM;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    n->o = *o;
    n->o.backends = NULL;
    n->R = R;
    n->K = o->topk;
    n->H = o->hidden;
    n->T = o->max_tokens;
    n->M = o->topk < R ? o->topk : R;
    n->V = o->vocab_split ? o->vocab : 0;
    n->VL = vocab_rows(o);
    n->dev = eg_calloc((size_t)R, sizeof *n->dev, err);
    n->strm = eg_calloc((size_t)R, sizeof *n->strm, err);
    n->comm = eg_calloc((size_t)R, sizeof *n->comm, err);
    n->rk = eg_calloc((size_t)R, sizeof *n->rk, err);
    if (!n->dev || !n->strm || !n->comm || !n->rk) { eg_ep_cuda_free(n); return EG_ERR_NOMEM; }
    for (int r = 0; r < R; r++) {
        void *s = NULL;
        if (eg_backend_cuda_device(o->backends[r], &n->dev[r], &s)) {
            eg_ep_cuda_free(n);
            return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel CUDA group: rank %d is not a CUDA backend", r);
        }
        n->strm[r] = (cudaStream_t)s;
    }
    /* EG_EP_EXCHANGE=cuda-local: the copies through host barriers even on distinct GPUs
       (where NCCL cannot start, e.g. a container with a small /dev/shm); slower, the same
       bits. nccl, the default: NCCL where it is built and every rank has its own GPU. */
    const char *xk = getenv("EG_EP_EXCHANGE");
    if (xk && *xk && strcmp(xk, "nccl") && strcmp(xk, "cuda-local")) {
        eg_ep_cuda_free(n);
        return eg_fail(err, EG_ERR_INVALID, "EG_EP_EXCHANGE=%s: expected nccl or cuda-local", xk);
    }
#ifdef EG_HAVE_NCCL
    n->use_nccl = !(xk && !strcmp(xk, "cuda-local")); /* NCCL needs one GPU per rank */
    for (int r = 0; r < R; r++)
        for (int q = 0; q < r; q++) n->use_nccl &= n->dev[q] != n->dev[r];
    const char *lm = getenv("NCCL_LAUNCH_MODE");
    if (n->use_nccl && lm && !strcasecmp(lm, "GROUP")) {
        /* every communicator of the set would wait for the others' launches, but each rank
           posts on its own thread and a rank with nothing to move launches nothing */
        eg_ep_cuda_free(n);
        return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel group: NCCL_LAUNCH_MODE=GROUP would hang the "
                       "exchange (each rank launches on its own thread); unset it or set it to PARALLEL");
    }
#endif
    int prev = 0;
    cudaGetDevice(&prev);
    ep_sizes z = sizes_of(R, n->K, n->H, n->T);
    eg_status st = EG_OK;
    for (int r = 0; r < R && !st; r++) {
        ep_nrank *k = &n->rk[r];
        k->mu_made = !pthread_mutex_init(&k->mu, NULL);
        if (!k->mu_made) { st = eg_fail(err, EG_ERR_NOMEM, "expert-parallel rank %d: pthread_mutex_init failed", r); break; }
        cudaError_t ce = cudaSetDevice(n->dev[r]);
        struct { void **p; size_t n; const char *what; } bufs[] = {
            {(void **)&k->counts_d, z.counts, "counts"}, {(void **)&k->sendtok, z.sendtok, "send tokens"},
            {(void **)&k->sendrows, z.sendrows, "send rows"}, {(void **)&k->sendmeta, z.sendmeta, "send pairs"},
            {(void **)&k->tk2pair, z.tk2pair, "pair map"}, {(void **)&k->recvrows, z.recvrows, "received rows"},
            {(void **)&k->recvmeta, z.recvmeta, "received pairs"}, {(void **)&k->xs, z.xs, "chunk rows"},
            {(void **)&k->res, z.res, "contributions out"}, {(void **)&k->back, z.back, "contributions in"},
            {(void **)&k->vres, vres_of(o), "lm_head slice logits"}, {(void **)&k->vback, vback_of(o), "logits in"}};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0] && ce == cudaSuccess; i++) {
            ce = cudaMalloc(bufs[i].p, 4 * (bufs[i].n ? bufs[i].n : 1));
            if (ce != cudaSuccess) {
                st = eg_fail(err, EG_ERR_NOMEM, "expert-parallel rank %d (GPU %d): cudaMalloc of %zu bytes (%s): %s", r,
                             n->dev[r], 4 * bufs[i].n, bufs[i].what, cudaGetErrorString(ce));
                *bufs[i].p = NULL;
            }
        }
        if (!st && ce != cudaSuccess) st = cu_err(err, r, "cudaSetDevice", ce);
        if (!st && (ce = cudaMemsetAsync(k->counts_d, 0, 4 * z.counts, n->strm[r])) != cudaSuccess)
            st = cu_err(err, r, "cudaMemsetAsync", ce);
        if (st) break;
        k->counts_h = eg_cuda_host_alloc(2 * 4 * z.counts, err);
        k->so_r = eg_calloc((size_t)R + 1, sizeof(int64_t), err);
        k->so_p = eg_calloc((size_t)R + 1, sizeof(int64_t), err);
        k->ro_r = eg_calloc((size_t)R + 1, sizeof(int64_t), err);
        k->ro_p = eg_calloc((size_t)R + 1, sizeof(int64_t), err);
        k->snd = eg_calloc((size_t)R, sizeof *k->snd, err);
        k->rcv = eg_calloc((size_t)R, sizeof *k->rcv, err);
        if (n->V) k->vh = eg_cuda_host_alloc(3 * sizeof(int32_t) * (size_t)n->T, err);
        if (!k->counts_h || !k->so_r || !k->so_p || !k->ro_r || !k->ro_p || !k->snd || !k->rcv || (n->V && !k->vh))
            st = EG_ERR_NOMEM;
    }
#ifdef EG_HAVE_NCCL
    if (!st && n->use_nccl) {
        ncclResult_t r = ncclCommInitAll(n->comm, R, n->dev);
        if (r != ncclSuccess) {
            /* the communicators NCCL made before the failure stay ours to free (an init
               that failed early leaves its entry NULL): aborted, never waited for */
            for (int q = 0; q < R; q++)
                if (n->comm[q]) {
                    cudaSetDevice(n->dev[q]);
                    ncclCommAbort(n->comm[q]);
                    n->comm[q] = NULL;
                }
            st = nc_err(err, 0, "ncclCommInitAll", r);
        }
        if (!st && (st = connect_all(n, err))) eg_ep_cuda_fail(n); /* a half-made connection is not waited for */
    }
#endif
    for (int r = 0; r < R && !st; r++) { /* the zeroed counts, before any peer reads them */
        cudaSetDevice(n->dev[r]);
        cudaError_t ce = cudaStreamSynchronize(n->strm[r]);
        if (ce != cudaSuccess) st = cu_err(err, r, "cudaStreamSynchronize", ce);
    }
    cudaSetDevice(prev);
#ifdef EG_HAVE_NCCL
    for (int r = 0; r < R && !st && n->use_nccl; r++) {
        ep_nrank *k = &n->rk[r];
        k->n = n;
        k->r = r;
        k->hook = (eg_cuda_wait_hook){rank_wait_check, k, NULL};
        if (!(st = eg_backend_cuda_add_wait_check(o->backends[r], &k->hook))) k->be = o->backends[r];
        else st = eg_fail(err, st, "expert-parallel rank %d: its backend takes no wait check", r);
    }
#endif
    if (st) { eg_ep_cuda_free(n); return st; }
    *out = n;
    return EG_OK;
}

#define CU(call, expr)                                                      \
    do {                                                                    \
        cudaError_t ce_ = (expr);                                           \
        if (ce_ != cudaSuccess) return cu_err(err, rank, call, ce_);        \
    } while (0)

/* Waits for rank's stream. Over nccl by polling: the stream, the group's failure (another
 * rank's abort), and about every millisecond the communicator's asynchronous error, which
 * is how NCCL reports a link or peer that failed after the work was enqueued (the
 * transfer would never complete and cudaStreamSynchronize never return). */
static eg_status stream_wait(eg_ep_cuda *n, int rank, const char *what, eg_error *err) {
    cudaStream_t s = n->strm[rank];
#ifdef EG_HAVE_NCCL
    if (n->use_nccl) {
        double t_check = eg_now();
        for (;;) {
            cudaError_t q = cudaStreamQuery(s);
            if (q == cudaSuccess) return EG_OK;
            if (q != cudaErrorNotReady) return cu_err(err, rank, what, q);
            if (failed_now(n)) return interrupted(err);
            if (eg_now() - t_check > 1e-3) {
                ncclResult_t r = rank_async_error(n, rank);
                if (r != ncclSuccess) /* the caller fails the group (collective.c) */
                    return nc_err(err, rank, "ncclCommGetAsyncError (waiting for the exchange)", r);
                t_check = eg_now();
            }
            sched_yield();
        }
    }
#else
    (void)n;
#endif
    cudaError_t ce = cudaStreamSynchronize(s);
    return ce == cudaSuccess ? EG_OK : cu_err(err, rank, what, ce);
}

/* Every rank arrives; 1 = the group failed. */
static int barrier(eg_ep_cuda *n) {
    pthread_mutex_lock(&n->mu);
    uint64_t gen = n->gen;
    if (++n->arrived == n->R) {
        n->arrived = 0;
        n->gen++;
        pthread_cond_broadcast(&n->cv);
    } else {
        while (gen == n->gen && !n->failed) pthread_cond_wait(&n->cv, &n->mu);
    }
    int f = n->failed;
    pthread_mutex_unlock(&n->mu);
    return f;
}

/* cuda-local: what the peers' sends would carry, pulled by this rank from their buffers.
 * Before: every rank's stream has finished writing what it sends (sync, barrier); after:
 * this rank's copies have finished before any peer overwrites its buffers (sync, barrier). */
static eg_status post_local(eg_ep_cuda *n, int rank, int which, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R;
    size_t H = (size_t)n->H;
    cudaStream_t s = n->strm[rank];
    CU("cudaStreamSynchronize (exchange)", cudaStreamSynchronize(s));
    if (barrier(n)) return interrupted(err);
    for (int q = 0; q < R; q++) {
        if (q == rank) continue;
        const ep_nrank *p = &n->rk[q];
        if (which == 0) {
            CU("cudaMemcpyAsync (counts)", cudaMemcpyAsync(k->counts_d + 4 * (R + q), p->counts_d + 4 * rank,
                                                           4 * sizeof(int32_t), cudaMemcpyDefault, s));
        } else if (which == 1) {
            int64_t nr = p->so_r[rank + 1] - p->so_r[rank], np = p->so_p[rank + 1] - p->so_p[rank];
            if (nr)
                CU("cudaMemcpyAsync (rows)", cudaMemcpyAsync(k->recvrows + (size_t)k->ro_r[q] * H,
                                                             p->sendrows + (size_t)p->so_r[rank] * H,
                                                             sizeof(float) * (size_t)nr * H, cudaMemcpyDefault, s));
            if (np)
                CU("cudaMemcpyAsync (pairs)", cudaMemcpyAsync(k->recvmeta + 3 * k->ro_p[q], p->sendmeta + 3 * p->so_p[rank],
                                                              sizeof(int32_t) * 3 * (size_t)np, cudaMemcpyDefault, s));
        } else {
            int64_t np = p->ro_p[rank + 1] - p->ro_p[rank];
            if (np)
                CU("cudaMemcpyAsync (contributions)", cudaMemcpyAsync(k->back + (size_t)k->so_p[q] * H,
                                                                      p->res + (size_t)p->ro_p[rank] * H,
                                                                      sizeof(float) * (size_t)np * H, cudaMemcpyDefault, s));
        }
    }
    CU("cudaStreamSynchronize (exchange)", cudaStreamSynchronize(s));
    if (barrier(n)) return interrupted(err);
    return EG_OK;
}

#ifdef EG_HAVE_NCCL
/* One grouped set of sends and receives, enqueued under the mutex (refused once the
 * group failed). which: 0 counts, 1 rows + pairs, 2 contributions back. */
static eg_status post_nccl(eg_ep_cuda *n, int rank, int which, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R;
    size_t H = (size_t)n->H;
    cudaStream_t s = n->strm[rank];
    pthread_mutex_lock(&k->mu);
    if (failed_now(n)) { pthread_mutex_unlock(&k->mu); return interrupted(err); }
    ncclComm_t c = n->comm[rank];
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < R && r == ncclSuccess; q++) {
        if (q == rank) continue;
        int64_t sr = k->so_r[q + 1] - k->so_r[q], sp = k->so_p[q + 1] - k->so_p[q];
        int64_t rr = k->ro_r[q + 1] - k->ro_r[q], rp = k->ro_p[q + 1] - k->ro_p[q];
        if (which == 0) {
            r = ncclSend(k->counts_d + 4 * q, 4, ncclInt32, q, c, s);
            if (r == ncclSuccess) r = ncclRecv(k->counts_d + 4 * (R + q), 4, ncclInt32, q, c, s);
        } else if (which == 1) {
            /* rows, then their pairs' metadata (none in an ffn call) */
            if (sr) {
                r = ncclSend(k->sendrows + (size_t)k->so_r[q] * H, (size_t)sr * H, ncclFloat32, q, c, s);
                if (r == ncclSuccess && sp)
                    r = ncclSend(k->sendmeta + 3 * k->so_p[q], 3 * (size_t)sp, ncclInt32, q, c, s);
            }
            if (rr && r == ncclSuccess) {
                r = ncclRecv(k->recvrows + (size_t)k->ro_r[q] * H, (size_t)rr * H, ncclFloat32, q, c, s);
                if (r == ncclSuccess && rp)
                    r = ncclRecv(k->recvmeta + 3 * k->ro_p[q], 3 * (size_t)rp, ncclInt32, q, c, s);
            }
        } else {
            if (rp) r = ncclSend(k->res + (size_t)k->ro_p[q] * H, (size_t)rp * H, ncclFloat32, q, c, s);
            if (sp && r == ncclSuccess) r = ncclRecv(k->back + (size_t)k->so_p[q] * H, (size_t)sp * H, ncclFloat32, q, c, s);
        }
    }
    ncclResult_t re = ncclGroupEnd();
    if (failed_now(n)) abort_own(n, rank);
    pthread_mutex_unlock(&k->mu);
    if (r == ncclSuccess) r = re;
    static const char *const what[] = {"ncclSend/ncclRecv (counts)", "ncclSend/ncclRecv (rows to the experts' ranks)",
                                       "ncclSend/ncclRecv (contributions back)"};
    return r == ncclSuccess ? EG_OK : nc_err(err, rank, what[which], r);
}
#endif

static eg_status post(eg_ep_cuda *n, int rank, int which, eg_error *err) {
#ifdef EG_HAVE_NCCL
    if (n->use_nccl) return post_nccl(n, rank, which, err);
#endif
    return post_local(n, rank, which, err);
}

/* A vocab call's transfers: rk[rank].snd[q] to peer q and rk[rank].rcv[q] from it, one
 * segment each way per peer (empty ones skipped; a pair's sizes agree, both come from the
 * exchanged counts). nccl: one group of sends and receives (every segment is int32s or
 * floats: counted as 4-byte words); cuda-local: each rank pulls rk[q].snd[rank] into its
 * rcv[q] between the two barriers, as post_local. */
static eg_status post_segs(eg_ep_cuda *n, int rank, const char *what, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R;
    cudaStream_t s = n->strm[rank];
#ifdef EG_HAVE_NCCL
    if (n->use_nccl) {
        pthread_mutex_lock(&k->mu);
        if (failed_now(n)) { pthread_mutex_unlock(&k->mu); return interrupted(err); }
        ncclComm_t c = n->comm[rank];
        ncclResult_t r = ncclGroupStart();
        for (int q = 0; q < R && r == ncclSuccess; q++) {
            if (q == rank) continue;
            if (k->snd[q].bytes) r = ncclSend(k->snd[q].p, k->snd[q].bytes / 4, ncclInt32, q, c, s);
            if (r == ncclSuccess && k->rcv[q].bytes) r = ncclRecv(k->rcv[q].p, k->rcv[q].bytes / 4, ncclInt32, q, c, s);
        }
        ncclResult_t re = ncclGroupEnd();
        if (failed_now(n)) abort_own(n, rank);
        pthread_mutex_unlock(&k->mu);
        if (r == ncclSuccess) r = re;
        return r == ncclSuccess ? EG_OK : nc_err(err, rank, what, r);
    }
#endif
    CU("cudaStreamSynchronize (exchange)", cudaStreamSynchronize(s));
    if (barrier(n)) return interrupted(err);
    for (int q = 0; q < R; q++) {
        if (q == rank || !k->rcv[q].bytes) continue;
        const ep_seg *src = &n->rk[q].snd[rank];
        if (src->bytes != k->rcv[q].bytes)
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: %s: rank %d sends %zu bytes, %zu expected", rank,
                           what, q, src->bytes, k->rcv[q].bytes);
        CU(what, cudaMemcpyAsync(k->rcv[q].p, src->p, src->bytes, cudaMemcpyDefault, s));
    }
    CU("cudaStreamSynchronize (exchange)", cudaStreamSynchronize(s));
    if (barrier(n)) return interrupted(err);
    return EG_OK;
}

/* the flags word of a rank's counts: left, and the kind of call (none set: routed) */
enum { EP_LEFT = 1, EP_FFN_CALL = 2, EP_EMBED_CALL = 4, EP_LOGITS_CALL = 8 };
#define EP_KIND_MASK (EP_FFN_CALL | EP_EMBED_CALL | EP_LOGITS_CALL)

static const char *kind_name(int kind) {
    return kind == EP_FFN_CALL ? "shared/dense" : kind == EP_EMBED_CALL ? "embedding" : kind == EP_LOGITS_CALL ? "lm_head"
                                                                                                              : "routed";
}

/* A shared-expert / dense-MLP call of this rank (ffn_split): T rows x, y written (dense)
 * or added to (MoE, accumulate). */
typedef struct ep_ffn_call {
    const float *x;
    int T;
    float *y;
    int accumulate;
} ep_ffn_call;

static eg_status ffn_rest(eg_ep_cuda *n, int rank, int lay, const eg_weight *const *ffn_w, eg_backend *be,
                          const ep_ffn_call *fc, eg_error *err);

/* An embedding (tokens [T] on the device, x [T][H] written) or lm_head (rows [T][H],
 * logits [T][V] written; T may be 0) call of this rank (vocab_split). */
typedef struct ep_vocab_call {
    int kind; /* EP_EMBED_CALL or EP_LOGITS_CALL */
    int T;
    const int32_t *tokens;
    const float *rows;
    float *out;
} ep_vocab_call;

static eg_status embed_rest(eg_ep_cuda *n, int rank, eg_backend *be, const ep_vocab_call *vc, eg_error *err);
static eg_status logits_rest(eg_ep_cuda *n, int rank, eg_backend *be, const ep_vocab_call *vc, eg_error *err);

static int64_t vocab_lo(const eg_ep_cuda *n, int q) { return (int64_t)q * n->V / n->R; }

static int vocab_owner(const eg_ep_cuda *n, int32_t id) {
    int q = (int)((int64_t)id * n->R / n->V);
    while (q + 1 < n->R && vocab_lo(n, q + 1) <= id) q++;
    while (q > 0 && vocab_lo(n, q) > id) q--;
    return q;
}

/* An embedding call's ids to the host, grouped by owner: vh[T..2T) their local ids in
 * owner order, vh[2T..3T) each token's position in that order (where its row comes back);
 * c[q] the ids rank q owns. The call's first host wait (the counts need the ids). */
static eg_status embed_pack(eg_ep_cuda *n, int rank, const ep_vocab_call *vc, int64_t *c, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R, T = vc->T;
    int32_t *ids = k->vh, *loc = k->vh + n->T, *inv = k->vh + 2 * n->T;
    cudaStream_t s = n->strm[rank];
    for (int q = 0; q < R; q++) c[q] = 0;
    if (!T) return EG_OK;
    CU("cudaMemcpyAsync (ids to the host)",
       cudaMemcpyAsync(ids, vc->tokens, sizeof(int32_t) * (size_t)T, cudaMemcpyDeviceToHost, s));
    eg_status st = stream_wait(n, rank, "cudaStreamSynchronize (ids)", err);
    if (st) return st;
    for (int t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= n->V)
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: token %d: id %d out of range [0, %lld)", rank, t,
                           ids[t], (long long)n->V);
        c[vocab_owner(n, ids[t])]++;
    }
    int64_t *at = k->so_p; /* free until the counts come back */
    at[0] = 0;
    for (int q = 0; q < R; q++) at[q + 1] = at[q] + c[q];
    for (int t = 0; t < T; t++) {
        int q = vocab_owner(n, ids[t]);
        int64_t j = at[q]++;
        loc[j] = (int32_t)(ids[t] - vocab_lo(n, q));
        inv[t] = (int32_t)j;
    }
    CU("cudaMemcpyAsync (local ids)", cudaMemcpyAsync(k->sendmeta, loc, sizeof(int32_t) * (size_t)T,
                                                      cudaMemcpyHostToDevice, s));
    CU("cudaMemcpyAsync (row positions)", cudaMemcpyAsync(k->tk2pair, inv, sizeof(int32_t) * (size_t)T,
                                                          cudaMemcpyHostToDevice, s));
    return EG_OK;
}

/* One exchange. a == NULL and fc == NULL: this rank has left (no tokens; serves the
 * others, whichever kind of call they make). fc: a shared-expert / dense-MLP call, else
 * a routed one (a). ffn_w: [n_layers][3] the owner's registered weights (ffn_split) or
 * NULL. *all_left: every rank has left (nothing else was done). */
static eg_status exchange(eg_ep_cuda *n, int rank, int layer, const eg_expert_w *const *layers,
                          const eg_weight *const *ffn_w, eg_backend *be, const eg_moe_args *a, const ep_ffn_call *fc,
                          const ep_vocab_call *vc, int *all_left, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R, K = n->K, T = a ? a->T : 0;
    size_t H = (size_t)n->H;
    cudaStream_t s = n->strm[rank];
    *all_left = 0;
    eg_status st = EG_OK;
    if (fc || vc) {
        /* ffn: rows to the layer's owner only; embedding: each owner its ids; lm_head: the
           rows to every rank. The upload area is free (the last call's upload finished
           before its counts were read back and waited for). */
        int32_t *h = k->counts_h + 8 * R;
        int64_t *c = k->so_r; /* free until the counts come back */
        if (vc && vc->kind == EP_EMBED_CALL && (st = embed_pack(n, rank, vc, c, err))) return st;
        for (int q = 0; q < R; q++) {
            int32_t v[4] = {q == layer % R ? (fc ? fc->T : 0) : 0, 0, layer, EP_FFN_CALL};
            if (vc) {
                v[0] = vc->kind == EP_EMBED_CALL ? (int32_t)c[q] : vc->T;
                v[2] = -1;
                v[3] = vc->kind;
            }
            memcpy(h + 4 * q, v, sizeof v);
            if (q == rank) memcpy(h + 4 * (R + q), v, sizeof v);
        }
        CU("cudaMemcpyAsync (ffn counts)",
           cudaMemcpyAsync(k->counts_d, h, sizeof(int32_t) * 8 * (size_t)R, cudaMemcpyHostToDevice, s));
    } else {
        int lo = 0, hi = n->o.n_experts; /* the call's range (a leaving rank packs nothing) */
        if (a) eg_ep_call_range(&n->o, layer, &lo, &hi);
        st = eg_cuda_ep_pack(be, a ? a->ids : NULL, a ? a->weights : NULL, T, K, R, lo, hi - lo, rank, a ? layer : -1,
                             a ? 0 : EP_LEFT, k->counts_d, k->sendtok, k->sendmeta, k->tk2pair, err);
    }
    if (st || (st = post(n, rank, 0, err))) return st;
    CU("cudaMemcpyAsync (counts)", cudaMemcpyAsync(k->counts_h, k->counts_d, sizeof(int32_t) * 8 * (size_t)R,
                                                   cudaMemcpyDeviceToHost, s));
    st = stream_wait(n, rank, "cudaStreamSynchronize (counts)", err);
    if (failed_now(n)) return interrupted(err);
    if (st) return st;
    const int32_t *sc = k->counts_h, *rc = k->counts_h + 4 * R;
    int lay = -1, kind = 0, active = 0;
    for (int q = 0; q < R; q++) {
        if (rc[4 * q + 3] & EP_LEFT) continue;
        int kq = rc[4 * q + 3] & EP_KIND_MASK;
        if (active++ && (rc[4 * q + 2] != lay || kq != kind))
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: ranks out of step (layer %d %s from a rank, %d %s "
                           "from rank %d)", rank, lay, kind_name(kind), rc[4 * q + 2], kind_name(kq), q);
        lay = rc[4 * q + 2];
        kind = kq;
    }
    if (!active) {
        *all_left = 1;
        return EG_OK;
    }
    if (kind == EP_FFN_CALL) return ffn_rest(n, rank, lay, ffn_w, be, fc, err);
    if (kind == EP_EMBED_CALL) return embed_rest(n, rank, be, vc, err);
    if (kind == EP_LOGITS_CALL) return logits_rest(n, rank, be, vc, err);
    if (fc || vc) /* cannot happen: this rank's own kind is among the running ranks' */
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: a %s call in a routed exchange", rank,
                       kind_name(fc ? EP_FFN_CALL : vc->kind));
    k->so_r[0] = k->so_p[0] = k->ro_r[0] = k->ro_p[0] = 0;
    for (int q = 0; q < R; q++) {
        k->so_r[q + 1] = k->so_r[q] + sc[4 * q];
        k->so_p[q + 1] = k->so_p[q] + sc[4 * q + 1];
        k->ro_r[q + 1] = k->ro_r[q] + rc[4 * q];
        k->ro_p[q + 1] = k->ro_p[q] + rc[4 * q + 1];
    }
    if (k->so_p[R] > (int64_t)T * K || k->ro_r[R] > (int64_t)R * n->T || k->ro_p[R] > (int64_t)R * n->T * K)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: %lld pairs packed of %lld, %lld rows / %lld "
                       "pairs received (bounds %lld / %lld)", rank, (long long)k->so_p[R], (long long)T * K,
                       (long long)k->ro_r[R], (long long)k->ro_p[R], (long long)R * n->T,
                       (long long)R * n->T * K);
    const eg_expert_w *own = lay >= 0 && lay < 2 * n->o.n_layers ? layers[lay] : NULL;
    if (k->ro_p[R] && !own)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: no experts registered for layer %d", rank, lay);
    /* rows out, own segment in place */
    if (k->so_r[R]) {
        st = be->ops->gather_rows(be, a->x, k->sendtok, (int)k->so_r[R], n->H, k->sendrows, err);
        if (st) return st;
    }
    int64_t self_r = k->so_r[rank + 1] - k->so_r[rank], self_p = k->so_p[rank + 1] - k->so_p[rank];
    if (self_r) {
        CU("cudaMemcpyAsync (own rows)", cudaMemcpyAsync(k->recvrows + (size_t)k->ro_r[rank] * H,
                                                         k->sendrows + (size_t)k->so_r[rank] * H,
                                                         sizeof(float) * (size_t)self_r * H, cudaMemcpyDeviceToDevice, s));
        CU("cudaMemcpyAsync (own pairs)", cudaMemcpyAsync(k->recvmeta + 3 * k->ro_p[rank], k->sendmeta + 3 * k->so_p[rank],
                                                          sizeof(int32_t) * 3 * (size_t)self_p, cudaMemcpyDeviceToDevice, s));
    }
    if ((st = post(n, rank, 1, err))) return st;
    /* this rank's experts over every source's pairs */
    int e0, e1; /* this rank's share of the call's range */
    eg_ep_share(&n->o, rank, lay, &e0, &e1);
    for (int q = 0; q < R; q++) {
        int64_t np = k->ro_p[q + 1] - k->ro_p[q];
        const float *rows = k->recvrows + (size_t)k->ro_r[q] * H;
        const int32_t *m_row = k->recvmeta + 3 * k->ro_p[q], *m_id = m_row + np;
        const float *m_w = (const float *)(m_id + np);
        for (int64_t j0 = 0; j0 < np; j0 += n->T) {
            int c = (int)(np - j0 < n->T ? np - j0 : n->T);
            float *y = k->res + (size_t)(k->ro_p[q] + j0) * H;
            eg_moe_args m = {.T = c, .x = k->xs, .ids = m_id + j0, .weights = m_w + j0, .topk = 1, .experts = own,
                             .e0 = e0, .e1 = e1, .y = y};
            int64_t nr = k->ro_r[q + 1] - k->ro_r[q]; /* the rows from q the pairs index */
            if ((st = eg_cuda_gather_received(be, rows, nr, m_row + j0, c, n->H, k->xs, err)) ||
                (st = be->ops->memset0(be, y, sizeof(float) * (size_t)c * H, err)) || (st = be->ops->moe(be, &m, err)))
                return eg_wrap(err, "expert-parallel rank %d, layer %d, pairs from rank %d", rank, lay, q);
        }
    }
    if (self_p)
        CU("cudaMemcpyAsync (own contributions)",
           cudaMemcpyAsync(k->back + (size_t)k->so_p[rank] * H, k->res + (size_t)k->ro_p[rank] * H,
                           sizeof(float) * (size_t)self_p * H, cudaMemcpyDeviceToDevice, s));
    if ((st = post(n, rank, 2, err))) return st;
    if (T && (st = eg_cuda_ep_combine(be, k->back, k->tk2pair, a->ids, T, K, n->H, a->y, err))) return st;
    int64_t remote_r = k->so_r[R] - self_r, remote_p = k->so_p[R] - self_p;
    k->remote_pairs += remote_p;
    k->bytes += remote_r * (int64_t)H * 4 + remote_p * (12 + (int64_t)H * 4);
    return EG_OK;
}

/* The rest of a shared-expert / dense-MLP call (counts exchanged): rows to the owner,
 * its swiglu_mlp per source, the rows back, written or added. fc NULL: this rank left. */
static eg_status ffn_rest(eg_ep_cuda *n, int rank, int lay, const eg_weight *const *ffn_w, eg_backend *be,
                          const ep_ffn_call *fc, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R, owner = lay % R, T = fc ? fc->T : 0;
    size_t H = (size_t)n->H;
    cudaStream_t s = n->strm[rank];
    const int32_t *sc = k->counts_h, *rc = k->counts_h + 4 * R;
    if (lay < 0 || lay >= n->o.n_layers)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: shared/dense exchange of layer %d (%d layers)", rank,
                       lay, n->o.n_layers);
    /* phase 1: rows only (no pair metadata) */
    k->so_r[0] = k->ro_r[0] = k->so_p[0] = k->ro_p[0] = 0;
    for (int q = 0; q < R; q++) {
        k->so_r[q + 1] = k->so_r[q] + sc[4 * q];
        k->ro_r[q + 1] = k->ro_r[q] + rc[4 * q];
        k->so_p[q + 1] = k->ro_p[q + 1] = 0;
    }
    if (k->so_r[R] != T || k->ro_r[R] > (int64_t)R * n->T || (rank != owner && k->ro_r[R]))
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: shared/dense exchange of layer %d: %lld rows sent "
                       "of %d, %lld received (owner rank %d, bound %lld)", rank, lay, (long long)k->so_r[R], T,
                       (long long)k->ro_r[R], owner, (long long)R * n->T);
    const eg_weight *const *w = ffn_w ? ffn_w + 3 * (size_t)lay : NULL;
    if (rank == owner && (!w || !w[0] || !w[1] || !w[2]))
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: no shared expert / dense MLP registered for layer %d",
                       rank, lay);
    if (rank != owner && T)
        CU("cudaMemcpyAsync (rows to the owner)",
           cudaMemcpyAsync(k->sendrows, fc->x, sizeof(float) * (size_t)T * H, cudaMemcpyDeviceToDevice, s));
    eg_status st = post(n, rank, 1, err);
    if (st) return st;
    if (rank == owner) {
        /* each source's rows as its own call (the row count the unsplit op has on that
           rank), its own straight from x */
        for (int q = 0; q < R; q++) {
            int nq = (int)(k->ro_r[q + 1] - k->ro_r[q]);
            if (!nq) continue;
            const float *rows = q == rank ? fc->x : k->recvrows + (size_t)k->ro_r[q] * H;
            if ((st = be->ops->swiglu_mlp(be, rows, nq, w[0], w[1], w[2], k->res + (size_t)k->ro_r[q] * H, 0, err)))
                return eg_wrap(err, "expert-parallel rank %d: layer %d's shared expert / dense MLP for rank %d", rank,
                               lay, q);
            if (q != rank) {
                k->ffn_rows += nq;
                k->bytes += 2 * (int64_t)nq * (int64_t)H * 4;
            }
        }
    }
    /* phase 2: the rows back, each row a "pair" of post()'s return leg (res segments by
       source on the owner, back by owner elsewhere; a rank's own segment is not posted) */
    for (int q = 0; q <= R; q++) {
        k->so_p[q] = k->so_r[q];
        k->ro_p[q] = k->ro_r[q];
    }
    if ((st = post(n, rank, 2, err))) return st;
    if (!T) return EG_OK;
    const float *out = rank == owner ? k->res + (size_t)k->ro_r[rank] * H : k->back + (size_t)k->so_r[owner] * H;
    if (fc->accumulate) return be->ops->add(be, fc->y, out, (int64_t)T * (int64_t)H, err);
    return be->ops->copy(be, fc->y, out, sizeof(float) * (size_t)T * H, err);
}

/* The rest of an embedding call (counts exchanged; vc NULL: this rank left): the local
 * ids to their owners, each owner's embed op over all it received (its slice: a copy,
 * exact), the rows back by source, and this rank's rows put in token order. */
static eg_status embed_rest(eg_ep_cuda *n, int rank, eg_backend *be, const ep_vocab_call *vc, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R, T = vc ? vc->T : 0;
    size_t H = (size_t)n->H;
    cudaStream_t s = n->strm[rank];
    const int32_t *sc = k->counts_h, *rc = k->counts_h + 4 * R;
    k->so_p[0] = k->ro_p[0] = 0;
    for (int q = 0; q < R; q++) {
        k->so_p[q + 1] = k->so_p[q] + sc[4 * q];
        k->ro_p[q + 1] = k->ro_p[q] + rc[4 * q];
    }
    if (k->so_p[R] != T || k->ro_p[R] > (int64_t)R * n->T)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: embedding exchange: %lld ids sent of %d, %lld "
                       "received (bound %lld)", rank, (long long)k->so_p[R], T, (long long)k->ro_p[R],
                       (long long)R * n->T);
    int64_t v0 = vocab_lo(n, rank), v1 = vocab_lo(n, rank + 1);
    if (k->ro_p[R] && !k->vembed)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: no embedding slice registered (vocab rows "
                       "%lld..%lld)", rank, (long long)v0, (long long)v1);
    for (int q = 0; q < R; q++) {
        int64_t ns = k->so_p[q + 1] - k->so_p[q], nr = k->ro_p[q + 1] - k->ro_p[q];
        k->snd[q] = (ep_seg){k->sendmeta + k->so_p[q], sizeof(int32_t) * (size_t)ns};
        k->rcv[q] = (ep_seg){k->recvmeta + k->ro_p[q], sizeof(int32_t) * (size_t)nr};
    }
    int64_t self = k->so_p[rank + 1] - k->so_p[rank];
    if (self)
        CU("cudaMemcpyAsync (own ids)", cudaMemcpyAsync(k->rcv[rank].p, k->snd[rank].p, k->snd[rank].bytes,
                                                        cudaMemcpyDeviceToDevice, s));
    eg_status st = post_segs(n, rank, "ncclSend/ncclRecv (ids to their embedding rows' ranks)", err);
    if (st) return st;
    for (int64_t j0 = 0; j0 < k->ro_p[R]; j0 += n->T) { /* the embed op's calls stay within max_tokens */
        int c = (int)(k->ro_p[R] - j0 < n->T ? k->ro_p[R] - j0 : n->T);
        if ((st = be->ops->embed(be, k->recvmeta + j0, c, k->vembed, k->res + (size_t)j0 * H, err)))
            return eg_wrap(err, "expert-parallel rank %d: embedding rows %lld..%lld", rank, (long long)v0, (long long)v1);
    }
    for (int q = 0; q < R; q++) {
        int64_t ns = k->so_p[q + 1] - k->so_p[q], nr = k->ro_p[q + 1] - k->ro_p[q];
        k->snd[q] = (ep_seg){k->res + (size_t)k->ro_p[q] * H, sizeof(float) * (size_t)nr * H};
        k->rcv[q] = (ep_seg){k->back + (size_t)k->so_p[q] * H, sizeof(float) * (size_t)ns * H};
        if (q != rank) {
            k->embed_rows += nr;
            k->bytes += (int64_t)(sizeof(float) * H + sizeof(int32_t)) * nr;
        }
    }
    if (self)
        CU("cudaMemcpyAsync (own rows)", cudaMemcpyAsync(k->rcv[rank].p, k->snd[rank].p, k->snd[rank].bytes,
                                                         cudaMemcpyDeviceToDevice, s));
    if ((st = post_segs(n, rank, "ncclSend/ncclRecv (embedding rows back)", err))) return st;
    if (!T) return EG_OK;
    return be->ops->gather_rows(be, k->back, k->tk2pair, T, n->H, vc->out, err);
}

/* The rest of an lm_head call (counts exchanged; vc NULL: this rank left), in rounds of at
 * most L = vocab_rows(n) rows per source (every rank knows every rank's row count, so all
 * run the same number of rounds): the round's rows of every rank to every rank, this rank's
 * linear over each source's rows with its slice (one call per source), the logits back,
 * and each owner's columns put in place with one strided copy. */
static eg_status logits_rest(eg_ep_cuda *n, int rank, eg_backend *be, const ep_vocab_call *vc, eg_error *err) {
    ep_nrank *k = &n->rk[rank];
    int R = n->R, T = vc ? vc->T : 0, L = n->VL, rounds = 0;
    size_t H = (size_t)n->H;
    cudaStream_t s = n->strm[rank];
    const int32_t *rc = k->counts_h + 4 * R;
    for (int q = 0; q < R; q++) {
        if (rc[4 * q] < 0 || rc[4 * q] > n->T || (q == rank && rc[4 * q] != T))
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: lm_head exchange: %d rows from rank %d (this "
                           "rank %d, bound %d)", rank, rc[4 * q], q, T, n->T);
        int rq = (rc[4 * q] + L - 1) / L;
        rounds = rq > rounds ? rq : rounds;
    }
    int64_t v0 = vocab_lo(n, rank), v1 = vocab_lo(n, rank + 1), nv = v1 - v0;
    if (rounds && !k->vhead)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: no lm_head slice registered (vocab rows "
                       "%lld..%lld)", rank, (long long)v0, (long long)v1);
    eg_status st = EG_OK;
    for (int j = 0; j < rounds; j++) {
        /* rows [j*L, j*L + m) of each source this round; ro_r: their offsets in recvrows / vres */
        int64_t r0 = (int64_t)j * L, m = T - r0 < 0 ? 0 : T - r0 < L ? T - r0 : L;
        k->ro_r[0] = 0;
        for (int q = 0; q < R; q++) {
            int64_t mq = rc[4 * q] - r0 < 0 ? 0 : rc[4 * q] - r0 < L ? rc[4 * q] - r0 : L;
            k->ro_r[q + 1] = k->ro_r[q] + mq;
            k->snd[q] = (ep_seg){m ? (void *)(vc->rows + (size_t)r0 * H) : NULL, sizeof(float) * (size_t)m * H};
            k->rcv[q] = (ep_seg){k->recvrows + (size_t)k->ro_r[q] * H, sizeof(float) * (size_t)mq * H};
        }
        if ((st = post_segs(n, rank, "ncclSend/ncclRecv (rows to every lm_head slice)", err))) return st;
        for (int q = 0; q < R; q++) {
            int nr = (int)(k->ro_r[q + 1] - k->ro_r[q]);
            if (!nr) continue;
            const float *x = q == rank ? vc->rows + (size_t)r0 * H : k->recvrows + (size_t)k->ro_r[q] * H;
            if ((st = be->ops->linear(be, x, nr, k->vhead, k->vres + (size_t)k->ro_r[q] * (size_t)nv, err)))
                return eg_wrap(err, "expert-parallel rank %d: lm_head rows %lld..%lld of rank %d's rows", rank,
                               (long long)v0, (long long)v1, q);
            if (q != rank) {
                k->logit_rows += nr;
                k->bytes += (int64_t)(sizeof(float) * (H + (size_t)nv)) * nr;
            }
        }
        for (int q = 0; q < R; q++) {
            int64_t nr = k->ro_r[q + 1] - k->ro_r[q], p0 = vocab_lo(n, q), np = vocab_lo(n, q + 1) - p0;
            k->snd[q] = (ep_seg){k->vres + (size_t)k->ro_r[q] * (size_t)nv, sizeof(float) * (size_t)nr * (size_t)nv};
            k->rcv[q] = (ep_seg){k->vback + (size_t)m * (size_t)p0, sizeof(float) * (size_t)m * (size_t)np};
        }
        if ((st = post_segs(n, rank, "ncclSend/ncclRecv (logits back)", err))) return st;
        for (int q = 0; q < R && m; q++) { /* [m][np] from rank q into columns p0.. of rows r0.. of [T][V] */
            int64_t p0 = vocab_lo(n, q), np = vocab_lo(n, q + 1) - p0;
            const float *src = q == rank ? k->vres + (size_t)k->ro_r[rank] * (size_t)nv : k->vback + (size_t)m * (size_t)p0;
            CU("cudaMemcpy2DAsync (logit columns)",
               cudaMemcpy2DAsync(vc->out + (size_t)r0 * (size_t)n->V + p0, sizeof(float) * (size_t)n->V, src,
                                 sizeof(float) * (size_t)np, sizeof(float) * (size_t)np, (size_t)m,
                                 cudaMemcpyDeviceToDevice, s));
        }
    }
    return EG_OK;
}

/* The checks a vocab call makes before it joins the exchange. */
static eg_status vocab_entry(eg_ep_cuda *n, int rank, eg_backend *be, const ep_vocab_call *vc, eg_error *err) {
    int min = vc->kind == EP_EMBED_CALL;
    if (!n->V || vc->T < min || vc->T > n->T)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: %s call of %d rows (max %d, vocab split %s)", rank,
                       kind_name(vc->kind), vc->T, n->T, n->V ? "on" : "off");
    int all_left = 0;
    eg_status st = exchange(n, rank, -1, NULL, NULL, be, NULL, NULL, vc, &all_left, err);
    if (!st && all_left)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: every rank reported leaving", rank);
    return st;
}

eg_status eg_ep_cuda_embed(eg_ep_cuda *n, int rank, eg_backend *be, const int32_t *tokens, int T, float *x,
                           eg_error *err) {
    ep_vocab_call vc = {.kind = EP_EMBED_CALL, .T = T, .tokens = tokens, .out = x};
    return vocab_entry(n, rank, be, &vc, err);
}

eg_status eg_ep_cuda_logits(eg_ep_cuda *n, int rank, eg_backend *be, const float *rows, int n_rows, float *logits,
                            eg_error *err) {
    ep_vocab_call vc = {.kind = EP_LOGITS_CALL, .T = n_rows, .rows = rows, .out = logits};
    return vocab_entry(n, rank, be, &vc, err);
}

eg_status eg_ep_cuda_moe(eg_ep_cuda *n, int rank, int layer, const eg_expert_w *const *layers, eg_backend *be,
                         const eg_moe_args *a, eg_error *err) {
    int all_left = 0;
    eg_status st = exchange(n, rank, layer, layers, NULL, be, a, NULL, NULL, &all_left, err);
    if (!st && all_left) /* cannot happen: this rank has not left */
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: every rank reported leaving", rank);
    return st;
}

eg_status eg_ep_cuda_ffn(eg_ep_cuda *n, int rank, int layer, const eg_weight *const *ffn_w, eg_backend *be,
                         const float *x, int T, float *y, int accumulate, eg_error *err) {
    if (T < 1 || T > n->T || layer < 0 || layer >= n->o.n_layers)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: shared/dense call of %d rows, layer %d (max %d, "
                       "%d layers)", rank, T, layer, n->T, n->o.n_layers);
    ep_ffn_call fc = {.x = x, .T = T, .y = y, .accumulate = accumulate};
    int all_left = 0;
    eg_status st = exchange(n, rank, layer, NULL, ffn_w, be, NULL, &fc, NULL, &all_left, err);
    if (!st && all_left)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: every rank reported leaving", rank);
    return st;
}

eg_status eg_ep_cuda_leave(eg_ep_cuda *n, int rank, const eg_expert_w *const *layers, const eg_weight *const *ffn_w,
                           eg_backend *be, eg_error *err) {
    for (;;) {
        int all_left = 0;
        eg_status st = exchange(n, rank, -1, layers, ffn_w, be, NULL, NULL, NULL, &all_left, err);
        if (st || all_left) return st;
    }
}

#endif
