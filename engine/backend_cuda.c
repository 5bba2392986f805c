/* The CUDA backend: every op of backend.h on one GPU, through the kernels' extern "C"
 * surface (kernels/eg_cuda.h), cuBLAS for the BF16 GEMMs and the CUDA runtime for
 * memory and the stream.
 *
 *  - One stream per backend; ops enqueue and return (no host synchronisation) except
 *    sample (it returns tokens to the host), sync, and to_device of more than
 *    EG_CUDA_STAGE_SLOT bytes (it waits so the caller may reuse the source).
 *  - Small to_device copies go through a ring of pinned staging slots guarded by
 *    events, so they are asynchronous and the caller's buffer is free on return.
 *  - to_host is cudaMemcpyAsync: asynchronous into pinned memory (eg_cuda_host_alloc),
 *    complete after sync.
 *  - BF16 weights: activations converted FP32->BF16 into scratch, cuBLAS GEMM with FP32
 *    accumulation and FP32 output. Other formats (INT4, FP8, F16, F32): kernels/gemm.cu
 *    (FP32 arithmetic, dequantised on the fly). The router is FP32 throughout.
 *  - All scratch is one allocation sized at create from cfg and max_tokens; no op
 *    allocates device memory.
 *  - Graph ops record a step's ops as a CUDA graph (stream capture, thread-local mode)
 *    and replay it: one launch per decode step. cuBLAS gets a fixed workspace in the
 *    scratch, so recorded GEMMs never allocate. A graph remembers the expert-table
 *    generation it was recorded under and refuses to replay after a table was rebuilt.
 *    EG_CUDA_GRAPHS=0 switches recording off (graph_begin: EG_ERR_UNSUPPORTED).
 *  - Host waits (sample, sync, a large to_device, a staging slot, an expert table) are
 *    cudaStreamSynchronize / cudaEventSynchronize, unless the stream carries another
 *    party's work that may never finish (the NCCL pipeline transport's sends and recvs,
 *    an expert-parallel group's exchange): each such party adds a wait check
 *    (eg_backend_cuda_add_wait_check) and the waits
 *    poll the stream (spinning for 200 us, then every 20 us) and, about every
 *    millisecond, the check, which fails the wait when the link reported an error or
 *    the run failed elsewhere.
 *  - Every CUDA/cuBLAS call is checked; the error names the call. Kernel faults show at
 *    the next checked call (run with CUDA_LAUNCH_BLOCKING=1 to pin them down).
 * Without EG_HAVE_CUDA this file compiles to stubs that report EG_ERR_UNSUPPORTED. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/backend.h"
#include "engine/cuda_plan.h"

#define EG_CUDA_HEADROOM ((int64_t)512 << 20)


void eg_cuda_plan_format(const eg_cuda_mem_plan *p, int device, char *buf, size_t n) {
    const double G = 1024.0 * 1024.0 * 1024.0;
    char extra[96] = ""; /* a drafter's paged cache grows with the target's */
    if (p->extra_per_token > 0)
        snprintf(extra, sizeof extra, ", %lld of them the drafter's cache", (long long)p->extra_per_token);
    snprintf(buf, n,
             "GPU %d: %.1f GiB total, %.1f GiB free, budget %.1f GiB (fraction %.2f); weights %.2f GiB, "
             "activations %.2f GiB, backend scratch %.2f GiB; KV capacity %lld tokens (%lld blocks, %lld bytes/token%s)",
             device, (double)p->total_bytes / G, (double)p->free_bytes / G, (double)p->budget_bytes / G,
             p->fraction, (double)p->weight_bytes / G, (double)p->act_bytes / G, (double)p->scratch_bytes / G,
             (long long)p->kv_tokens, (long long)p->kv_blocks, (long long)p->kv_bytes_per_token, extra);
}

int eg_cuda_graphs_enabled(void) {
    const char *gr = getenv("EG_CUDA_GRAPHS"), *pf = getenv("EG_CUDA_PROFILE");
    return !(gr && !strcmp(gr, "0")) && !(pf && !strcmp(pf, "1")); /* profiling records op by op */
}

/* The plan from given memory figures (both builds: the runtime's tests plan without a GPU). */
eg_status eg_cuda_plan_mem(const eg_config *cfg, const eg_backend_opts *o, double fraction, int64_t total_bytes,
                           int64_t free_bytes, int64_t weight_bytes, int64_t act_bytes, int n_layers,
                           int64_t extra_per_token, int block_size, eg_cuda_mem_plan *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    if (!(fraction > 0.0 && fraction <= 1.0))
        return eg_fail(err, EG_ERR_INVALID, "gpu memory fraction %g must be in (0, 1]", fraction);
    if (block_size <= 0 || n_layers <= 0 || extra_per_token < 0)
        return eg_fail(err, EG_ERR_INVALID,
                       "planner: block_size %d and n_layers %d must be positive, extra bytes per token %lld not negative",
                       block_size, n_layers, (long long)extra_per_token);
    out->free_bytes = free_bytes;
    out->total_bytes = total_bytes;
    out->fraction = fraction;
    out->weight_bytes = weight_bytes;
    out->act_bytes = act_bytes;
    out->scratch_bytes = eg_cuda_scratch_bytes(cfg, o);
    out->headroom_bytes = EG_CUDA_HEADROOM;
    /* What others (and this process so far) hold counts against the budget. */
    out->budget_bytes = (int64_t)((double)out->total_bytes * fraction) - (out->total_bytes - out->free_bytes) -
                        out->headroom_bytes;
    out->extra_per_token = extra_per_token;
    out->kv_bytes_per_token = (int64_t)n_layers * (cfg->kv_lora_rank + cfg->qk_rope) * 2 + extra_per_token;
    int64_t left = out->budget_bytes - weight_bytes - act_bytes - out->scratch_bytes;
    int64_t per_block = out->kv_bytes_per_token * block_size;
    out->kv_blocks = left > 0 && per_block > 0 ? left / per_block : 0;
    out->kv_tokens = out->kv_blocks * block_size;
    if (out->kv_blocks < 1) {
        char buf[512];
        eg_cuda_plan_format(out, o->device, buf, sizeof buf);
        return eg_fail(err, EG_ERR_NOMEM, "not enough GPU memory for one KV block: %s", buf);
    }
    return EG_OK;
}

#ifndef EG_HAVE_CUDA

eg_status eg_backend_cuda_create(const eg_config *cfg, const eg_backend_opts *o, eg_backend **out, eg_error *err) {
    (void)cfg;
    (void)o;
    *out = NULL;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: built without CUDA (nvcc not found at build time)");
}

eg_status eg_cuda_mem_info(int device, int64_t *free_bytes, int64_t *total_bytes, eg_error *err) {
    (void)device;
    *free_bytes = *total_bytes = 0;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: built without CUDA");
}

int64_t eg_cuda_scratch_bytes(const eg_config *cfg, const eg_backend_opts *o) {
    (void)cfg;
    (void)o;
    return 0;
}

eg_status eg_cuda_plan(const eg_config *cfg, const eg_backend_opts *o, double fraction, int64_t weight_bytes,
                       int64_t act_bytes, int n_layers, int64_t extra_per_token, int block_size,
                       eg_cuda_mem_plan *out, eg_error *err) {
    (void)cfg; (void)o; (void)fraction; (void)weight_bytes; (void)act_bytes; (void)n_layers; (void)block_size;
    (void)extra_per_token;
    memset(out, 0, sizeof *out);
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: built without CUDA");
}

void *eg_cuda_host_alloc(size_t bytes, eg_error *err) { return eg_malloc(bytes ? bytes : 1, err); }

eg_status eg_cuda_measure(int device, double *copy_bytes_per_s, double *bf16_flops_per_s, eg_error *err) {
    (void)device;
    *copy_bytes_per_s = *bf16_flops_per_s = 0;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: built without CUDA");
}

eg_status eg_backend_cuda_device(eg_backend *b, int *device, void **stream) {
    (void)b;
    if (device) *device = -1;
    if (stream) *stream = NULL;
    return EG_ERR_UNSUPPORTED;
}
int64_t eg_cuda_sample_sorted_rows(eg_backend *b) {
    (void)b;
    return 0;
}
eg_status eg_backend_cuda_add_wait_check(eg_backend *b, eg_cuda_wait_hook *h) {
    (void)b; (void)h;
    return EG_ERR_UNSUPPORTED;
}
void eg_backend_cuda_remove_wait_check(eg_backend *b, eg_cuda_wait_hook *h) { (void)b; (void)h; }
void eg_cuda_host_free(void *p) { free(p); }
eg_status eg_cuda_ep_pack(eg_backend *b, const int32_t *ids, const float *weights, int T, int K, int R, int lo,
                          int ne, int rank, int layer, int left, int32_t *counts, int32_t *sendtok, int32_t *meta,
                          int32_t *tk2pair, eg_error *err) {
    (void)b; (void)ids; (void)weights; (void)T; (void)K; (void)R; (void)lo; (void)ne; (void)rank; (void)layer; (void)left;
    (void)counts; (void)sendtok; (void)meta; (void)tk2pair;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: built without CUDA");
}
eg_status eg_cuda_ep_combine(eg_backend *b, const float *back, const int32_t *tk2pair, const int32_t *ids, int T,
                             int K, int H, float *y,
                             eg_error *err) {
    (void)b; (void)back; (void)tk2pair; (void)ids; (void)T; (void)K; (void)H; (void)y;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: built without CUDA");
}
eg_status eg_cuda_gather_received(eg_backend *b, const float *x, int64_t n_src, const int32_t *idx, int n, int D,
                                  float *out, eg_error *err) {
    (void)b; (void)x; (void)n_src; (void)idx; (void)n; (void)D; (void)out;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: built without CUDA");
}

#else /* EG_HAVE_CUDA */

#include <cublas_v2.h>
#include <math.h>
#include <cuda_runtime_api.h>
#include <sched.h>
#include <time.h>

#include "kernels/eg_cuda.h"

_Static_assert((int)EGK_F32 == (int)EG_W_F32 && (int)EGK_BF16 == (int)EG_W_BF16 && (int)EGK_F16 == (int)EG_W_F16 &&
                   (int)EGK_INT4 == (int)EG_W_INT4 && (int)EGK_FP8 == (int)EG_W_FP8,
               "kernels/eg_cuda.h format codes must equal eg_wfmt");

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

#define EG_CUDA_STAGE_SLOTS 16
#define EG_CUDA_STAGE_SLOT ((size_t)1 << 20)
#define EG_CUDA_MOE_CHUNK 1024   /* tokens per MoE pass: bounds the [T*K][H] scratch */
#define EG_CUDA_SAMPLE_CHUNK 64  /* rows per sampling pass: bounds the [N][V] sort scratch */
#define EG_CUDA_KEPT_CHUNK 16    /* rows per kept_probs pass: bounds its [N][M] answers */
/* Up to this many rows, a BF16 GEMM with hi + lo activations runs as ONE GEMM over the
 * 2T stacked rows (the weight is read once, not twice: at decode batch sizes the GEMM is
 * bound by weight bytes), then a kernel adds the two halves. Above it, two GEMMs (the
 * work is compute-bound and the same either way, and the scratch stays small). */
#define EG_CUDA_FUSE_T 64
#define EG_CUDA_BLAS_WS ((size_t)32 << 20) /* cuBLAS workspace: fixed, so captured GEMMs never allocate */

/* ---- error helpers -------------------------------------------------------------- */

static eg_status cuda_fail(eg_error *err, const char *call, cudaError_t e) {
    return eg_fail(err, e == cudaErrorMemoryAllocation ? EG_ERR_NOMEM : EG_ERR_DEVICE, "cuda backend: %s failed: %s (%s)",
                   call, cudaGetErrorName(e), cudaGetErrorString(e));
}
static eg_status blas_fail(eg_error *err, const char *call, cublasStatus_t s) {
    return eg_fail(err, EG_ERR_DEVICE, "cuda backend: %s failed: %s (%s)", call, cublasGetStatusName(s),
                   cublasGetStatusString(s));
}
static eg_status kern_fail(eg_error *err, const char *call, int rc) {
    return eg_fail(err, EG_ERR_DEVICE, "cuda backend: %s failed: %s (%s)", call, egk_error_name(rc),
                   egk_error_string(rc));
}

#define CU(name, call)                                                                   \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) return cuda_fail(err, name, e_);                          \
    } while (0)
#define BL(name, call)                                                                   \
    do {                                                                                 \
        cublasStatus_t s_ = (call);                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) return blas_fail(err, name, s_);                \
    } while (0)
#define KR(name, call)                                                                   \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_) return kern_fail(err, name, rc_);                                       \
    } while (0)

/* ---- state -------------------------------------------------------------------------- */

typedef struct xtab {          /* device pointer table of one layer's experts [e0, e1) */
    const eg_expert_w *key;
    int e0, e1, fmt, group, valid;
    egk_expert_ptrs *host;     /* pinned [E] */
    egk_expert_ptrs *dev;      /* scratch [E] */
} xtab;

typedef struct scratch_layout {
    uint16_t *xb, *xb_lo;      /* [Tm + FUSE_T][maxdim] bf16 activations for cuBLAS (with room
                                  for a fused lo half after T rows), [Tm][maxdim] residuals */
    float *fuse_y;             /* [2*FUSE_T][max(maxdim, V)] hi and lo products of a fused GEMM */
    float *mlp_g, *mlp_u;      /* [Tm][I] */
    uint16_t *q_bf16, *q_bf16_lo; /* [Tm][NH][DN+DR] */
    float *q_pe;               /* [Tm][NH][DR] */
    float *q_lat;              /* [Tm][NH][C] */
    float *part_o, *part_ml;   /* [part_rows][C], [part_rows][2] */
    uint16_t *o_lat, *o_lat_lo; /* [Tm][NH][C] */
    uint16_t *kvb;             /* [NH*(DN+DV)][C] kv_b as BF16 when stored otherwise */
    float *router_logits;      /* [Tm][E] */
    unsigned char *blas_ws;    /* [EG_CUDA_BLAS_WS] cuBLAS workspace */
    egk_moe_ws moe;
    egk_expert_ptrs *xtab_dev; /* [n_xtab][E] */
    float *s_keys;             /* [Ns][V] */
    int32_t *s_ids_in, *s_ids_out, *s_offsets, *s_out;
    int32_t *s_which, *s_seg;  /* [Ns], [2 Ns]: rows the top-M sampler left to the sort */
    int32_t *s_tok;            /* [Ns] token_probs: the token per row */
    double *s_prob;            /* [Ns] token_probs: its probability */
    int32_t *k_n, *k_ids;      /* [Nk], [Nk][Mk] kept_probs: each row's kept count, its ids */
    double *k_p;               /* [Nk][Mk] and their probabilities */
    egk_sample_row *s_rows;
    void *s_temp;
    size_t s_temp_bytes;
    int64_t xb_elems, mlp_elems, part_rows, kvb_elems, fuse_rows;
    int moe_chunk, sample_chunk, n_xtab, E;
    int kept_chunk, kept_m;    /* Nk rows a pass (<= Ns: they share s_rows / s_tok), Mk = min(V,
                                  EGK_SAMPLE_TOPM_MAX) ids a row */
    size_t total;
} scratch_layout;

typedef struct cuda_impl {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    eg_config cfg;
    int max_tokens;
    int split;            /* BF16 GEMM inputs as hi + lo pairs (default; EG_CUDA_GEMM=bf16: hi only) */
    int fuse;             /* hi + lo as one GEMM up to EG_CUDA_FUSE_T rows (EG_CUDA_FUSE=0: two) */
    int moe_path;         /* EGK_MOE_AUTO (tensor cores where they apply; INT4 through cp.async);
                             EG_CUDA_MOE=reg: INT4 via the register prefetch; =simt: CUDA cores */
    int mla_simt;         /* EG_CUDA_MLA=simt: the CUDA-core attention kernel everywhere */
    int mla_rows;         /* EG_CUDA_MLA=tc16|tc32: tensor-core tiles of 16/32 cache rows (0: by device) */
    void *scratch;
    scratch_layout L;
    unsigned char *stage; /* pinned [SLOTS][SLOT] */
    cudaEvent_t stage_ev[EG_CUDA_STAGE_SLOTS];
    int stage_next, n_events;
    egk_sample_row *rows_h; /* pinned [Ns] */
    int32_t *out_h;         /* pinned [Ns] */
    int32_t *which_h;       /* pinned [Ns] */
    int32_t *tok_h;         /* pinned [Ns] token_probs' tokens */
    double *prob_h;         /* pinned [Ns] token_probs' answers */
    int32_t *kn_h, *kid_h;  /* pinned [Nk], [Nk][Mk] kept_probs' answers */
    double *kp_h;           /* pinned [Nk][Mk] */
    xtab *xt;               /* [n_xtab] */
    egk_expert_ptrs *xt_host; /* pinned [n_xtab][E] */
    int xt_victim;
    int graphs;             /* recording allowed (EG_CUDA_GRAPHS=0: no) */
    int capturing;          /* between graph_begin and graph_end */
    uint64_t xt_gen;        /* bumped whenever an expert table is rebuilt */
    int sample_m;           /* candidates of the top-M sampler (EG_CUDA_SAMPLE=sort: 0, always sort) */
    int64_t sample_sorted_rows; /* rows the top-M path could not settle (sorted) */
    struct cuda_prof *prof; /* EG_CUDA_PROFILE=1: device time per op (NULL: off) */
    eg_cuda_wait_hook *waits; /* the wait checks (cuda_plan.h); NULL: host waits block in the CUDA runtime */
} cuda_impl;

/* A recorded step: the executable graph and the expert-table generation it reads. */
typedef struct cu_graph {
    cudaGraphExec_t exec;
    uint64_t xt_gen;
} cu_graph;

/* Ops that move data to or from the host, or wait, cannot be recorded. */
#define NOT_WHILE_RECORDING(im, what)                                                    \
    do {                                                                                 \
        if ((im)->capturing)                                                             \
            return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s while recording a graph", what); \
    } while (0)

static cuda_impl *impl_of(eg_backend *b) { return (cuda_impl *)b->impl; }

/* Wait for ev (NULL: the whole stream). With a wait check, by polling: the stream's work
 * may include a transfer whose peer or link failed, which would never complete, and a
 * blocking synchronise would never return (see the file comment). */
static eg_status host_wait(cuda_impl *im, cudaEvent_t ev, const char *what, eg_error *err) {
    if (!im->waits) {
        cudaError_t e = ev ? cudaEventSynchronize(ev) : cudaStreamSynchronize(im->stream);
        return e == cudaSuccess ? EG_OK : cuda_fail(err, what, e);
    }
    double t0 = eg_now(), t_check = t0;
    for (;;) {
        cudaError_t q = ev ? cudaEventQuery(ev) : cudaStreamQuery(im->stream);
        if (q == cudaSuccess) return EG_OK;
        if (q != cudaErrorNotReady) return cuda_fail(err, what, q);
        double now = eg_now();
        if (now - t_check > 1e-3) {
            for (eg_cuda_wait_hook *h = im->waits; h; h = h->next) {
                eg_status st = h->check(h->ctx, err);
                if (st) {
                    eg_wrap(err, "cuda backend: %s", what);
                    return st;
                }
            }
            t_check = now;
        }
        /* spin for the first 200 us (a short wait ends at once), then poll every 20 us: a
           stage waiting out a long step leaves the cores to the host's draws (engine.c) */
        if (now - t0 < 2e-4) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Place (base != NULL) or size (base == NULL) the scratch. */
static void layout_scratch(const eg_config *c, int max_tokens, size_t sample_temp, unsigned char *base,
                           scratch_layout *L) {
    int64_t Tm = max_tokens > 0 ? max_tokens : 1;
    int64_t H = c->hidden, NH = c->n_heads, C = c->kv_lora_rank, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head;
    int64_t F = c->moe_inter, E = c->n_experts > 0 ? c->n_experts : 1, K = c->topk > 0 ? c->topk : 1;
    int64_t V = c->vocab > 0 ? c->vocab : 1;
    int64_t I = max64(max64(c->inter, F * (c->n_shared > 0 ? c->n_shared : 1)), max64(F, 1));
    int64_t maxdim = max64(max64(max64(H, I), max64(NH * DV, c->q_lora_rank)),
                           max64(max64(C + DR, E), NH * (DN + DR)));
    size_t off = 0;
#define PLACE(field, type, count)                                                        \
    do {                                                                                 \
        off = (off + 255) & ~(size_t)255;                                                \
        L->field = base ? (type *)(base + off) : NULL;                                   \
        off += sizeof(type) * (size_t)max64((count), 1);                                 \
    } while (0)
    L->E = (int)E;
    L->xb_elems = Tm * maxdim;
    L->mlp_elems = Tm * I;
    L->part_rows = NH * max64(Tm, 64);
    L->kvb_elems = NH * (DN + DV) * C;
    L->moe_chunk = (int)min64(Tm, EG_CUDA_MOE_CHUNK);
    L->sample_chunk = (int)min64(Tm, EG_CUDA_SAMPLE_CHUNK);
    L->kept_chunk = (int)min64(L->sample_chunk, EG_CUDA_KEPT_CHUNK);
    L->kept_m = (int)min64(V, EGK_SAMPLE_TOPM_MAX);
    /* a slot per layer and per second half of a split layer (its own expert array: a
       backend holding both halves, ranks' stages on one GPU, would evict in a cycle) */
    L->n_xtab = 2 * c->n_layers + 2;
    int64_t R = (int64_t)L->moe_chunk * K;
    L->moe.max_rows = (int)R;
    L->moe.max_tiles = (int)(R / EGK_MOE_BM + E + 1);
    L->fuse_rows = max64(maxdim, V);
    PLACE(xb, uint16_t, L->xb_elems + (int64_t)EG_CUDA_FUSE_T * maxdim);
    PLACE(xb_lo, uint16_t, L->xb_elems);
    PLACE(fuse_y, float, 2 * (int64_t)min64(Tm, EG_CUDA_FUSE_T) * L->fuse_rows);
    PLACE(mlp_g, float, L->mlp_elems);
    PLACE(mlp_u, float, L->mlp_elems);
    PLACE(q_bf16, uint16_t, Tm * NH * (DN + DR));
    PLACE(q_bf16_lo, uint16_t, Tm * NH * (DN + DR));
    PLACE(q_pe, float, Tm * NH * DR);
    PLACE(q_lat, float, Tm * NH * C);
    PLACE(part_o, float, L->part_rows * C);
    PLACE(part_ml, float, L->part_rows * 2);
    PLACE(o_lat, uint16_t, Tm * NH * C);
    PLACE(o_lat_lo, uint16_t, Tm * NH * C);
    PLACE(kvb, uint16_t, L->kvb_elems);
    PLACE(router_logits, float, Tm * E);
    PLACE(blas_ws, unsigned char, (int64_t)EG_CUDA_BLAS_WS);
    PLACE(moe.row_tk, int32_t, R);
    PLACE(moe.rowmap, int32_t, R);
    PLACE(moe.offsets, int32_t, E + 1);
    PLACE(moe.tiles, int32_t, 2 * (int64_t)L->moe.max_tiles);
    PLACE(moe.ntiles, int32_t, 1);
    PLACE(moe.h, float, R * F);
    PLACE(moe.o, float, R * H);
    L->moe.part_rows = (int)min64(R, EGK_MOE_SPLIT_ROWS);
    PLACE(moe.part, float, (int64_t)EGK_MOE_KSPLIT * L->moe.part_rows * max64(2 * F, H));
    PLACE(xtab_dev, egk_expert_ptrs, (int64_t)L->n_xtab * E);
    int64_t Ns = L->sample_chunk;
    PLACE(s_keys, float, Ns * V);
    PLACE(s_ids_in, int32_t, Ns * V);
    PLACE(s_ids_out, int32_t, Ns * V);
    PLACE(s_offsets, int32_t, Ns + 1);
    PLACE(s_out, int32_t, Ns);
    PLACE(s_which, int32_t, Ns);
    PLACE(s_seg, int32_t, 2 * Ns);
    PLACE(s_rows, egk_sample_row, Ns);
    PLACE(s_tok, int32_t, Ns);
    PLACE(s_prob, double, Ns);
    PLACE(k_n, int32_t, L->kept_chunk);
    PLACE(k_ids, int32_t, (int64_t)L->kept_chunk * L->kept_m);
    PLACE(k_p, double, (int64_t)L->kept_chunk * L->kept_m);
    PLACE(s_temp, unsigned char, (int64_t)sample_temp);
    L->s_temp_bytes = sample_temp;
#undef PLACE
    L->total = off;
}

static size_t sample_temp_bytes(const eg_config *c, int max_tokens) {
    int64_t Tm = max_tokens > 0 ? max_tokens : 1;
    return egk_sample_temp_bytes((int)min64(Tm, EG_CUDA_SAMPLE_CHUNK), c->vocab > 0 ? c->vocab : 1);
}

int64_t eg_cuda_scratch_bytes(const eg_config *cfg, const eg_backend_opts *o) {
    scratch_layout L;
    memset(&L, 0, sizeof L);
    int count = 0;
    size_t tb = cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? sample_temp_bytes(cfg, o->max_tokens) : 0;
    layout_scratch(cfg, o->max_tokens, tb, NULL, &L);
    return (int64_t)L.total;
}

static egk_weight kw(const eg_weight *w) {
    egk_weight k;
    k.fmt = (int)w->fmt;
    k.group = w->group;
    k.rows = w->rows;
    k.cols = w->cols;
    k.data = w->data;
    k.scale = w->scale;
    return k;
}

static const char *wname(const eg_weight *w) { return w && w->name ? w->name : "weight"; }

/* ---- memory ------------------------------------------------------------------------ */

static eg_status cu_alloc(eg_backend *b, size_t bytes, void **ptr, eg_error *err) {
    (void)b;
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *ptr = NULL;
        cudaGetLastError();
        return eg_fail(err, e == cudaErrorMemoryAllocation ? EG_ERR_NOMEM : EG_ERR_DEVICE,
                       "cuda backend: cudaMalloc(%zu bytes) failed: %s", bytes, cudaGetErrorString(e));
    }
    return EG_OK;
}

static void cu_release(eg_backend *b, void *p) {
    (void)b;
    if (p) cudaFree(p);
}

static eg_status cu_to_device(eg_backend *b, void *dst, const void *src, size_t n, eg_error *err) {
    cuda_impl *im = impl_of(b);
    NOT_WHILE_RECORDING(im, "to_device");
    if (!n) return EG_OK;
    if (n <= EG_CUDA_STAGE_SLOT) {
        int s = im->stage_next;
        im->stage_next = (s + 1) % EG_CUDA_STAGE_SLOTS;
        eg_status st = host_wait(im, im->stage_ev[s], "cudaEventSynchronize (staging slot)", err);
        if (st) return st;
        unsigned char *slot = im->stage + (size_t)s * EG_CUDA_STAGE_SLOT;
        memcpy(slot, src, n);
        CU("cudaMemcpyAsync (to_device)", cudaMemcpyAsync(dst, slot, n, cudaMemcpyHostToDevice, im->stream));
        CU("cudaEventRecord (staging slot)", cudaEventRecord(im->stage_ev[s], im->stream));
        return EG_OK;
    }
    CU("cudaMemcpyAsync (to_device)", cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, im->stream));
    return host_wait(im, NULL, "cudaStreamSynchronize (to_device)", err);
}

static eg_status cu_to_host(eg_backend *b, void *dst, const void *src, size_t n, eg_error *err) {
    cuda_impl *im = impl_of(b);
    NOT_WHILE_RECORDING(im, "to_host");
    if (!n) return EG_OK;
    CU("cudaMemcpyAsync (to_host)", cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, im->stream));
    return EG_OK;
}

static eg_status cu_memset0(eg_backend *b, void *dst, size_t n, eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (!n) return EG_OK;
    CU("cudaMemsetAsync", cudaMemsetAsync(dst, 0, n, im->stream));
    return EG_OK;
}

static eg_status cu_copy(eg_backend *b, void *dst, const void *src, size_t n, eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (!n) return EG_OK;
    CU("cudaMemcpyAsync (copy)", cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, im->stream));
    return EG_OK;
}

static eg_status cu_graph_begin(eg_backend *b, eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (!im->graphs) return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: graphs switched off (EG_CUDA_GRAPHS=0)");
    if (im->capturing) return eg_fail(err, EG_ERR_INVALID, "cuda backend: graph_begin while recording");
    CU("cudaStreamBeginCapture", cudaStreamBeginCapture(im->stream, cudaStreamCaptureModeThreadLocal));
    im->capturing = 1;
    return EG_OK;
}

static int cu_graph_enabled(eg_backend *b) { return impl_of(b)->graphs; }

static eg_status cu_graph_end(eg_backend *b, void **graph, eg_error *err) {
    cuda_impl *im = impl_of(b);
    *graph = NULL;
    if (!im->capturing) return eg_fail(err, EG_ERR_INVALID, "cuda backend: graph_end without graph_begin");
    im->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(im->stream, &g);
    cudaGetLastError(); /* a failed capture leaves its error pending; it is reported here */
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        return cuda_fail(err, "cudaStreamEndCapture", e);
    }
    cu_graph *cg = eg_calloc(1, sizeof *cg, err);
    if (!cg) {
        cudaGraphDestroy(g);
        return EG_ERR_NOMEM;
    }
    e = cudaGraphInstantiate(&cg->exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        free(cg);
        cudaGetLastError();
        return cuda_fail(err, "cudaGraphInstantiate", e);
    }
    cg->xt_gen = im->xt_gen;
    *graph = cg;
    return EG_OK;
}

static eg_status cu_graph_launch(eg_backend *b, void *graph, int *ran, eg_error *err) {
    cuda_impl *im = impl_of(b);
    cu_graph *cg = graph;
    *ran = 0;
    NOT_WHILE_RECORDING(im, "graph_launch");
    if (cg->xt_gen != im->xt_gen) return EG_OK;
    CU("cudaGraphLaunch", cudaGraphLaunch(cg->exec, im->stream));
    *ran = 1;
    return EG_OK;
}

static void cu_graph_free(eg_backend *b, void *graph) {
    cu_graph *cg = graph;
    if (!cg) return;
    cudaSetDevice(impl_of(b)->device); /* freed by whichever thread tears the forward down */
    cudaStreamSynchronize(impl_of(b)->stream); /* it may still be running */
    cudaGraphExecDestroy(cg->exec);
    free(cg);
}

/* ---- EG_CUDA_PROFILE=1: device time per op ---------------------------------------------
 * For measurements (issue 7: where the time goes). Each compute op is bracketed by two
 * timing events on the stream; the pairs are read at sync (or when the pool fills, which
 * waits for the stream) and summed per (op, tokens); destroying the backend prints the
 * table to stderr. Recording graphs is off while profiling (a graph cannot hold these
 * events), so the numbers are op by op: launch gaps show as the difference between the
 * ops' sum and the step's wall time. Numerics are unchanged. */
#define EG_PROF_PAIRS 1024
#define EG_PROF_ROWS 256
enum { P_EMBED, P_RMSNORM, P_ADD_RMSNORM, P_ADD, P_LINEAR, P_GATHER, P_SWIGLU, P_MLA, P_ROUTER, P_MOE, P_SAMPLE,
       P_GQA, P_COPY_ROWS, P_N };
static const char *const prof_names[P_N] = {"embed", "rmsnorm", "add_rmsnorm", "add", "linear", "gather_rows",
                                            "swiglu_mlp", "mla_attention", "router", "moe", "sample",
                                            "gqa_attention", "copy_rows"};

typedef struct prof_row {
    int op, T;
    long calls;
    double ms;
} prof_row;

typedef struct cuda_prof {
    cudaEvent_t ev[2 * EG_PROF_PAIRS];
    int n_ev;                        /* events created */
    int op[EG_PROF_PAIRS], T[EG_PROF_PAIRS], n_pend;
    prof_row rows[EG_PROF_ROWS];
    int n_rows;
    long dropped;                    /* calls past EG_PROF_ROWS distinct (op, tokens) rows */
} cuda_prof;

static eg_status prof_create(cuda_impl *im, eg_error *err) {
    cuda_prof *p = eg_calloc(1, sizeof *p, err);
    if (!p) return EG_ERR_NOMEM;
    for (; p->n_ev < 2 * EG_PROF_PAIRS; p->n_ev++) {
        cudaError_t e = cudaEventCreateWithFlags(&p->ev[p->n_ev], 0u);
        if (e != cudaSuccess) {
            for (int i = 0; i < p->n_ev; i++) cudaEventDestroy(p->ev[i]);
            free(p);
            return cuda_fail(err, "cudaEventCreate (profile)", e);
        }
    }
    im->prof = p;
    return EG_OK;
}

/* Read every pending pair (waits for the last one) into the rows. */
static eg_status prof_flush(cuda_impl *im, eg_error *err) {
    cuda_prof *p = im->prof;
    if (!p || !p->n_pend) return EG_OK;
    CU("cudaEventSynchronize (profile)", cudaEventSynchronize(p->ev[2 * p->n_pend - 1]));
    for (int k = 0; k < p->n_pend; k++) {
        float ms = 0.0f;
        CU("cudaEventElapsedTime (profile)", cudaEventElapsedTime(&ms, p->ev[2 * k], p->ev[2 * k + 1]));
        int r = 0;
        while (r < p->n_rows && (p->rows[r].op != p->op[k] || p->rows[r].T != p->T[k])) r++;
        if (r == p->n_rows) {
            if (r == EG_PROF_ROWS) {
                p->dropped++;
                continue;
            }
            p->rows[r].op = p->op[k];
            p->rows[r].T = p->T[k];
            p->n_rows++;
        }
        p->rows[r].calls++;
        p->rows[r].ms += ms;
    }
    p->n_pend = 0;
    return EG_OK;
}

static eg_status prof_begin(cuda_impl *im, eg_error *err) {
    cuda_prof *p = im->prof;
    if (p->n_pend == EG_PROF_PAIRS) {
        eg_status st = prof_flush(im, err);
        if (st) return st;
    }
    CU("cudaEventRecord (profile)", cudaEventRecord(p->ev[2 * p->n_pend], im->stream));
    return EG_OK;
}

static eg_status prof_end(cuda_impl *im, int op, int T, eg_error *err) {
    cuda_prof *p = im->prof;
    CU("cudaEventRecord (profile)", cudaEventRecord(p->ev[2 * p->n_pend + 1], im->stream));
    p->op[p->n_pend] = op;
    p->T[p->n_pend] = T;
    p->n_pend++;
    return EG_OK;
}

static int prof_row_cmp(const void *a, const void *b) {
    const prof_row *x = a, *y = b;
    if (x->T != y->T) return x->T < y->T ? -1 : 1;
    return x->ms > y->ms ? -1 : x->ms < y->ms;
}

static void prof_report(cuda_impl *im) {
    cuda_prof *p = im->prof;
    eg_error e = {0};
    if (prof_flush(im, &e)) fprintf(stderr, "cuda profile: %s\n", e.msg);
    qsort(p->rows, (size_t)p->n_rows, sizeof p->rows[0], prof_row_cmp);
    fprintf(stderr, "cuda profile, GPU %d (EG_CUDA_PROFILE=1, graphs off): device time per op and token count\n",
            im->device);
    fprintf(stderr, "  %7s  %-14s %8s %11s %10s %7s\n", "tokens", "op", "calls", "total ms", "mean us", "share");
    for (int i = 0; i < p->n_rows;) {
        int j = i;
        double tot = 0.0;
        for (; j < p->n_rows && p->rows[j].T == p->rows[i].T; j++) tot += p->rows[j].ms;
        for (int k = i; k < j; k++)
            fprintf(stderr, "  %7d  %-14s %8ld %11.3f %10.1f %6.1f%%\n", p->rows[k].T, prof_names[p->rows[k].op],
                    p->rows[k].calls, p->rows[k].ms, 1000.0 * p->rows[k].ms / (double)p->rows[k].calls,
                    tot > 0 ? 100.0 * p->rows[k].ms / tot : 0.0);
        fprintf(stderr, "  %7d  %-14s %8s %11.3f\n", p->rows[i].T, "(sum)", "", tot);
        i = j;
    }
    if (p->dropped) fprintf(stderr, "  (%ld calls of further (op, tokens) pairs not tabulated)\n", p->dropped);
}

static void prof_free(cuda_impl *im) {
    if (!im->prof) return;
    for (int i = 0; i < im->prof->n_ev; i++) cudaEventDestroy(im->prof->ev[i]);
    free(im->prof);
    im->prof = NULL;
}

static eg_status cu_sync(eg_backend *b, eg_error *err) {
    cuda_impl *im = impl_of(b);
    NOT_WHILE_RECORDING(im, "sync");
    eg_status st = host_wait(im, NULL, "cudaStreamSynchronize", err);
    if (st) return st;
    CU("cudaGetLastError", cudaGetLastError());
    return im->prof ? prof_flush(im, err) : EG_OK;
}

static eg_status cu_bind(eg_backend *b, eg_error *err) {
    CU("cudaSetDevice", cudaSetDevice(impl_of(b)->device));
    return EG_OK;
}

static int64_t data_bytes(const eg_weight *w) {
    switch (w->fmt) {
    case EG_W_F32: return w->rows * w->cols * 4;
    case EG_W_BF16:
    case EG_W_F16: return w->rows * w->cols * 2;
    case EG_W_INT4: return w->rows * (w->cols / 8) * 4;
    case EG_W_FP8: return w->rows * w->cols;
    default: return 0;
    }
}

static int64_t scale_bytes(const eg_weight *w) {
    if (w->fmt == EG_W_INT4) return w->rows * ((w->cols + w->group - 1) / w->group) * 2;
    if (w->fmt == EG_W_FP8) return ((w->rows + 127) / 128) * ((w->cols + 127) / 128) * 4;
    return 0;
}

/* One device allocation for a weight: data, then its scales at *soff (256-aligned). */
static eg_status weight_alloc(const eg_weight *h, void **p, int64_t *soff, eg_error *err) {
    int64_t db = data_bytes(h), sb = scale_bytes(h);
    *soff = (db + 255) & ~(int64_t)255;
    cudaError_t e = cudaMalloc(p, (size_t)(*soff + sb > 0 ? *soff + sb : 1));
    if (e != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        return eg_fail(err, e == cudaErrorMemoryAllocation ? EG_ERR_NOMEM : EG_ERR_DEVICE,
                       "cuda backend: cudaMalloc for %s (%lld bytes) failed: %s", wname(h), (long long)(*soff + sb),
                       cudaGetErrorString(e));
    }
    return EG_OK;
}

static eg_status cu_weight_upload(eg_backend *b, const eg_weight *h, eg_weight *d, eg_error *err) {
    cuda_impl *im = impl_of(b);
    *d = *h;
    d->data = d->scale = NULL;
    if (h->fmt == EG_W_NONE) return EG_OK;
    if (h->fmt < EG_W_F32 || h->fmt > EG_W_FP8)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: %s: unknown weight format %d", wname(h), (int)h->fmt);
    if (h->fmt == EG_W_INT4 && (h->cols % 8 || h->group <= 0 || h->cols % h->group || !h->scale))
        return eg_fail(err, EG_ERR_UNSUPPORTED,
                       "cuda backend: %s: INT4 needs cols (%lld) divisible by 8 and by the group (%d), and a scale",
                       wname(h), (long long)h->cols, h->group);
    if (h->fmt == EG_W_FP8 && !h->scale)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: %s: FP8 weight without scale", wname(h));
    if (!h->data) return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s: no data", wname(h));
    int64_t db = data_bytes(h), sb = scale_bytes(h), soff;
    void *p = NULL;
    eg_status st = weight_alloc(h, &p, &soff, err);
    if (st) return st;
    /* From pageable (mmapped) memory cudaMemcpyAsync returns once the source is staged,
     * and stream order makes the data visible to every later op. */
    cudaError_t e = cudaMemcpyAsync(p, h->data, (size_t)db, cudaMemcpyHostToDevice, im->stream);
    if (e == cudaSuccess && sb)
        e = cudaMemcpyAsync((char *)p + soff, h->scale, (size_t)sb, cudaMemcpyHostToDevice, im->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return eg_fail(err, EG_ERR_DEVICE, "cuda backend: cudaMemcpyAsync uploading %s failed: %s", wname(h),
                       cudaGetErrorString(e));
    }
    d->data = p;
    d->scale = sb ? (char *)p + soff : NULL;
    return EG_OK;
}

static eg_status cu_weight_random(eg_backend *b, const eg_weight *h, const eg_weight_rand *r, eg_weight *d,
                                  eg_error *err) {
    cuda_impl *im = impl_of(b);
    *d = *h;
    d->data = d->scale = NULL;
    d->owned = 0; /* device copies are always freed by weight_release */
    int int4 = h->fmt == EG_W_INT4;
    if (!(h->fmt == EG_W_BF16 || h->fmt == EG_W_F32 || (int4 && h->cols % 8 == 0 && h->group > 0 && h->cols % h->group == 0)))
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: cannot draw %s (format %d, %lld x %lld)", wname(h),
                       (int)h->fmt, (long long)h->rows, (long long)h->cols);
    int64_t sb = scale_bytes(h), soff;
    void *p = NULL;
    eg_status st = weight_alloc(h, &p, &soff, err);
    if (st) return st;
    int rc = int4 ? egk_fill_random(p, h->rows * h->cols / 8, EGK_RAND_INT4_WORDS, r->seed, r->mean, r->std, im->stream)
                  : egk_fill_random(p, h->rows * h->cols, h->fmt == EG_W_F32 ? EGK_RAND_F32 : EGK_RAND_BF16, r->seed,
                                    r->mean, r->std, im->stream);
    if (!rc && int4)
        rc = egk_fill_random((char *)p + soff, h->rows * (h->cols / h->group), EGK_RAND_SCALE_BF16, r->seed, r->mean,
                             r->std, im->stream);
    if (rc) {
        cudaFree(p);
        return kern_fail(err, "egk_fill_random", rc);
    }
    d->data = p;
    d->scale = sb ? (char *)p + soff : NULL;
    return EG_OK;
}

static void cu_weight_release(eg_backend *b, eg_weight *d) {
    (void)b;
    if (d && d->data) cudaFree((void *)d->data);
    if (d) {
        d->data = d->scale = NULL;
        d->fmt = EG_W_NONE;
    }
}

/* ---- GEMM helpers --------------------------------------------------------------------- */

/* y[T][rows] = beta*y + xb[T][cols] W^T with W BF16 [rows][cols], FP32 accumulate/output;
 * with xb_lo (the BF16 residual of the activations) a second GEMM adds xb_lo W^T, which
 * makes the product accurate to ~1e-5 instead of BF16's ~3e-3.
 * Column-major view: y^T (rows x T, ld rows) = W^T-as-stored (op T of cols x rows) * xb^T. */
static eg_status gemm_bf16(cuda_impl *im, const uint16_t *xb, const uint16_t *xb_lo, int T, const eg_weight *W,
                           float *y, float beta, eg_error *err) {
    const float one = 1.0f, zero = 0.0f;
    if (W->rows > 0x7fffffff || W->cols > 0x7fffffff)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: %s too large for cublasGemmEx", wname(W));
    if (im->fuse && xb_lo && xb_lo == xb + (int64_t)T * W->cols && T <= EG_CUDA_FUSE_T && W->rows <= im->L.fuse_rows) {
        /* fused: one GEMM over [x_hi; x_lo] (2T rows), then y = (beta y + hi) + lo, the
         * same additions in the same order as the two-GEMM path */
        int64_t n = (int64_t)T * W->rows;
        BL("cublasGemmEx (hi+lo)",
           cublasGemmEx(im->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->rows, 2 * T, (int)W->cols, &one, W->data,
                        CUDA_R_16BF, (int)W->cols, xb, CUDA_R_16BF, (int)W->cols, &zero, im->L.fuse_y, CUDA_R_32F,
                        (int)W->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        KR("egk_add_pair", egk_add_pair(y, im->L.fuse_y, im->L.fuse_y + n, n, beta != 0.0f, im->stream));
        return EG_OK;
    }
    BL("cublasGemmEx", cublasGemmEx(im->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->rows, T, (int)W->cols, &one, W->data,
                                    CUDA_R_16BF, (int)W->cols, xb, CUDA_R_16BF, (int)W->cols, &beta, y, CUDA_R_32F,
                                    (int)W->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (xb_lo)
        BL("cublasGemmEx (residual)",
           cublasGemmEx(im->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->rows, T, (int)W->cols, &one, W->data, CUDA_R_16BF,
                        (int)W->cols, xb_lo, CUDA_R_16BF, (int)W->cols, &one, y, CUDA_R_32F, (int)W->rows,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return EG_OK;
}

static uint16_t *lo_of(cuda_impl *im, uint16_t *p) { return im->split ? p : NULL; }
/* Where the lo half of T rows of `cols` BF16 activations in xb goes: right after them
 * (so gemm_bf16 can fuse) when T is small enough, else the separate residual buffer. */
static uint16_t *xb_lo_for(cuda_impl *im, int T, int64_t cols) {
    if (!im->split) return NULL;
    return T <= EG_CUDA_FUSE_T ? im->L.xb + (int64_t)T * cols : im->L.xb_lo;
}

/* y (+)= x W^T for any format; BF16 through cuBLAS, F32 through SGEMM, others ours. */
static eg_status linear_any(cuda_impl *im, const float *x, int T, const eg_weight *W, float *y, int accumulate,
                            eg_error *err) {
    if (T <= 0) return EG_OK;
    if (T > im->max_tokens)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s: %d tokens exceed max_tokens %d", wname(W), T,
                       im->max_tokens);
    if (!W->data) return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s: weight not uploaded", wname(W));
    if (W->fmt == EG_W_BF16) {
        if ((int64_t)T * W->cols > im->L.xb_elems)
            return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s: %lld columns exceed the activation scratch",
                           wname(W), (long long)W->cols);
        uint16_t *lo = xb_lo_for(im, T, W->cols);
        KR("egk_f32_to_bf16", egk_f32_to_bf16(x, im->L.xb, lo, (int64_t)T * W->cols, im->stream));
        return gemm_bf16(im, im->L.xb, lo, T, W, y, accumulate ? 1.0f : 0.0f, err);
    }
    if (W->fmt == EG_W_F32 && W->rows <= 0x7fffffff && W->cols <= 0x7fffffff) {
        const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
        BL("cublasSgemm", cublasSgemm(im->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)W->rows, T, (int)W->cols, &one,
                                      (const float *)W->data, (int)W->cols, x, (int)W->cols, &beta, y, (int)W->rows));
        return EG_OK;
    }
    KR("egk_gemm", egk_gemm(x, T, kw(W), y, accumulate, im->stream));
    return EG_OK;
}

/* ---- ops ----------------------------------------------------------------------------- */

static int vector_fmt_ok(const eg_weight *w) {
    return w->fmt == EG_W_F32 || w->fmt == EG_W_BF16 || w->fmt == EG_W_F16;
}

static eg_status cu_embed(eg_backend *b, const int32_t *tokens, int T, const eg_weight *E, float *x, eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (!vector_fmt_ok(E))
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: embedding %s must be F32/BF16/F16", wname(E));
    KR("egk_embed", egk_embed(tokens, T, kw(E), x, im->stream));
    return EG_OK;
}

static eg_status cu_rmsnorm(eg_backend *b, const float *x, const eg_weight *w, int T, int D, float eps, float *y,
                            eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (!vector_fmt_ok(w)) return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: norm %s format", wname(w));
    KR("egk_rmsnorm", egk_rmsnorm(x, kw(w), T, D, eps, y, im->stream));
    return EG_OK;
}

static eg_status cu_add_rmsnorm(eg_backend *b, float *x, const float *dx, const eg_weight *w, int T, int D, float eps,
                                float *y, eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (!vector_fmt_ok(w)) return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: norm %s format", wname(w));
    KR("egk_add_rmsnorm", egk_add_rmsnorm(x, dx, kw(w), T, D, eps, y, im->stream));
    return EG_OK;
}

static eg_status cu_add(eg_backend *b, float *x, const float *dx, int64_t n, eg_error *err) {
    KR("egk_add", egk_add(x, dx, n, impl_of(b)->stream));
    return EG_OK;
}

static eg_status cu_linear(eg_backend *b, const float *x, int T, const eg_weight *W, float *y, eg_error *err) {
    return linear_any(impl_of(b), x, T, W, y, 0, err);
}

static eg_status cu_gather_rows(eg_backend *b, const float *x, const int32_t *idx, int n, int D, float *out,
                                eg_error *err) {
    KR("egk_gather_rows", egk_gather_rows(x, idx, n, D, 0, out, impl_of(b)->stream));
    return EG_OK;
}

static eg_status cu_swiglu_mlp(eg_backend *b, const float *x, int T, const eg_weight *gate, const eg_weight *up,
                               const eg_weight *down, float *y, int accumulate, eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (T <= 0) return EG_OK;
    int64_t I = gate->rows, n = (int64_t)T * I;
    if (T > im->max_tokens || n > im->L.mlp_elems || up->rows != I || down->cols != I)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: swiglu %s: T=%d I=%lld exceeds scratch or shapes differ",
                       wname(gate), T, (long long)I);
    eg_status st;
    if (gate->fmt == EG_W_BF16 && up->fmt == EG_W_BF16) {
        if ((int64_t)T * gate->cols > im->L.xb_elems)
            return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s: columns exceed scratch", wname(gate));
        uint16_t *lo = xb_lo_for(im, T, gate->cols);
        KR("egk_f32_to_bf16", egk_f32_to_bf16(x, im->L.xb, lo, (int64_t)T * gate->cols, im->stream));
        if ((st = gemm_bf16(im, im->L.xb, lo, T, gate, im->L.mlp_g, 0.0f, err)) ||
            (st = gemm_bf16(im, im->L.xb, lo, T, up, im->L.mlp_u, 0.0f, err)))
            return st;
    } else if ((st = linear_any(im, x, T, gate, im->L.mlp_g, 0, err)) ||
               (st = linear_any(im, x, T, up, im->L.mlp_u, 0, err))) {
        return st;
    }
    if (down->fmt == EG_W_BF16 && n <= im->L.xb_elems) {
        /* h goes straight to BF16 for cuBLAS (xb is free again: stream order). */
        uint16_t *lo = xb_lo_for(im, T, I);
        KR("egk_swiglu", egk_swiglu(im->L.mlp_g, im->L.mlp_u, NULL, im->L.xb, lo, n, im->stream));
        return gemm_bf16(im, im->L.xb, lo, T, down, y, accumulate ? 1.0f : 0.0f, err);
    }
    KR("egk_swiglu", egk_swiglu(im->L.mlp_g, im->L.mlp_u, im->L.mlp_g, NULL, NULL, n, im->stream));
    return linear_any(im, im->L.mlp_g, T, down, y, accumulate, err);
}

static eg_status cu_mla_attention(eg_backend *b, const eg_mla_args *a, eg_error *err) {
    cuda_impl *im = impl_of(b);
    const eg_config *c = &im->cfg;
    int NH = c->n_heads, C = c->kv_lora_rank, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head, T = a->T;
    if (T <= 0 || a->h1 <= a->h0) return EG_OK;
    if (T > im->max_tokens || a->h0 < 0 || a->h1 > NH)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: mla: T=%d heads [%d,%d) out of range", T, a->h0, a->h1);
    if (!vector_fmt_ok(a->kv_a_norm))
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: %s format", wname(a->kv_a_norm));
    const eg_weight *kvb = a->kv_b;
    if (kvb->rows != (int64_t)NH * (DN + DV) || kvb->cols != C)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s is [%lld][%lld], expected [%d][%d]", wname(kvb),
                       (long long)kvb->rows, (long long)kvb->cols, NH * (DN + DV), C);
    const uint16_t *wkv = (const uint16_t *)kvb->data;
    if (kvb->fmt != EG_W_BF16) {
        KR("egk_dequant_bf16", egk_dequant_bf16(kw(kvb), 0, kvb->rows, im->L.kvb, im->stream));
        wkv = im->L.kvb;
    }
    egk_mla m;
    memset(&m, 0, sizeof m);
    m.T = T;
    m.NH = NH;
    m.C = C;
    m.DN = DN;
    m.DR = DR;
    m.DV = DV;
    m.h0 = a->h0;
    m.h1 = a->h1;
    m.pos = a->pos;
    m.slot = a->slot;
    m.block_table = a->block_table;
    m.max_blocks = a->max_blocks;
    m.block_size = a->block_size;
    m.max_pos = a->max_pos;
    m.q = a->q;
    m.kv = a->kv;
    m.kv_norm = kw(a->kv_a_norm);
    m.cache = a->cache.data;
    m.inv_freq = a->rope_inv_freq;
    m.attn_factor = a->rope_attn_factor;
    m.scale = a->softmax_scale;
    m.eps = a->eps;
    m.q_bf16 = im->L.q_bf16;
    m.q_bf16_lo = lo_of(im, im->L.q_bf16_lo);
    m.q_pe = im->L.q_pe;
    m.q_lat = im->L.q_lat;
    m.part_o = im->L.part_o;
    m.part_ml = im->L.part_ml;
    m.part_rows = im->L.part_rows;
    m.simt = im->mla_simt;
    m.tile_rows = im->mla_rows;
    m.o_lat = im->L.o_lat;
    m.o_lat_lo = lo_of(im, im->L.o_lat_lo);
    if (egk_mla_splits(&m) < 1)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: mla: partial-result scratch too small");
    KR("egk_mla_prep", egk_mla_prep(&m, im->stream));
    const float one = 1.0f, zero = 0.0f;
    int nb = a->h1 - a->h0;
    long long hstride = (long long)(DN + DV) * C;
    /* q_lat[t][h][:] = W_UK_h^T q_nope[t][h]: per head, column-major
     * (C x T, ld NH*C) = (C x DN, ld C) * (DN x T, ld NH*(DN+DR)); then the residual. */
    for (int part = 0; part < (im->split ? 2 : 1); part++) {
        const uint16_t *qb = part ? im->L.q_bf16_lo : im->L.q_bf16;
        BL("cublasGemmStridedBatchedEx (q_nope W_UK)",
           cublasGemmStridedBatchedEx(im->blas, CUBLAS_OP_N, CUBLAS_OP_N, C, T, DN, &one,
                                      wkv + (int64_t)a->h0 * hstride, CUDA_R_16BF, C, hstride,
                                      qb + (int64_t)a->h0 * (DN + DR), CUDA_R_16BF, NH * (DN + DR), DN + DR,
                                      part ? &one : &zero, im->L.q_lat + (int64_t)a->h0 * C, CUDA_R_32F, NH * C, C,
                                      nb, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    KR("egk_mla_attend", egk_mla_attend(&m, im->stream));
    /* out[t][h][:] = W_UV_h o_lat[t][h]: (DV x T, ld NH*DV) = (C x DV, ld C)^T * (C x T, ld NH*C). */
    for (int part = 0; part < (im->split ? 2 : 1); part++) {
        const uint16_t *ob = part ? im->L.o_lat_lo : im->L.o_lat;
        BL("cublasGemmStridedBatchedEx (o_lat W_UV)",
           cublasGemmStridedBatchedEx(im->blas, CUBLAS_OP_T, CUBLAS_OP_N, DV, T, C, &one,
                                      wkv + (int64_t)a->h0 * hstride + (int64_t)DN * C, CUDA_R_16BF, C, hstride,
                                      ob + (int64_t)a->h0 * C, CUDA_R_16BF, NH * C, C, part ? &one : &zero,
                                      a->out + (int64_t)a->h0 * DV, CUDA_R_32F, NH * DV, DV, nb, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
    }
    return EG_OK;
}

static eg_status cu_gqa_attention(eg_backend *b, const eg_gqa_args *a, eg_error *err) {
    cuda_impl *im = impl_of(b);
    if (a->T <= 0) return EG_OK;
    if (a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads || a->head_dim < 2 || a->head_dim % 2 ||
        a->block_size < 1 || a->max_blocks < 1 || a->n_blocks < 1 || !a->block_table || a->max_pos < 1 ||
        a->max_pos > (int64_t)a->max_blocks * a->block_size || a->window < 0)
        return eg_fail(err, EG_ERR_INVALID,
                       "cuda backend: gqa attention with %d heads, %d kv heads of %d over %d positions (blocks of %d, "
                       "%d per slot)",
                       a->n_heads, a->n_kv_heads, a->head_dim, a->max_pos, a->block_size, a->max_blocks);
    if (((uintptr_t)a->k_cache | (uintptr_t)a->v_cache) & 3)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: gqa attention caches not 4-byte aligned");
    const size_t shm = egk_gqa_smem_bytes(a->n_heads, a->n_kv_heads, a->head_dim);
    if (shm > 48 * 1024) {
        int optin = 0;
        CU("cudaDeviceGetAttribute",
           cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, im->device));
        if (shm > (size_t)optin)
            return eg_fail(err, EG_ERR_UNSUPPORTED,
                           "cuda backend: gqa attention with %d heads per kv head of %d needs %zu bytes of shared "
                           "memory, the device allows %d",
                           a->n_heads / a->n_kv_heads, a->head_dim, shm, optin);
    }
    egk_gqa g = {a->T, a->n_heads, a->n_kv_heads, a->head_dim, a->block_size, a->max_blocks, a->pos, a->slot,
                 a->block_table, a->q, a->k, a->v, a->k_cache, a->v_cache, a->rope_inv_freq, a->softmax_scale,
                 a->window, a->out};
    KR("egk_gqa_attention", egk_gqa_attention(&g, im->stream));
    return EG_OK;
}

static eg_status cu_copy_rows(eg_backend *b, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                              int rows, int64_t width, eg_error *err) {
    if (rows < 0 || width < 0 || (rows > 1 && (dst_stride < width || src_stride < width)) || rows > 0x7fffffff)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: copy_rows of %d rows of %lld (strides %lld, %lld)", rows,
                       (long long)width, (long long)dst_stride, (long long)src_stride);
    KR("egk_copy_rows", egk_copy_rows(dst, dst_stride, src, src_stride, rows, width, impl_of(b)->stream));
    return EG_OK;
}

static eg_status cu_router(eg_backend *b, const eg_router_args *a, eg_error *err) {
    cuda_impl *im = impl_of(b);
    int E = (int)a->gate->rows;
    if (a->T <= 0) return EG_OK;
    if (a->T > im->max_tokens || E > im->L.E)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: router: T=%d E=%d exceed scratch", a->T, E);
    if (!a->gate->data) return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s not uploaded", wname(a->gate));
    int G = a->n_group > 0 ? a->n_group : 1;
    if (E % G) return eg_fail(err, EG_ERR_CONFIG, "n_routed_experts %d not divisible by n_group %d", E, G);
    if (a->topk > E) return eg_fail(err, EG_ERR_CONFIG, "topk %d exceeds %d experts", a->topk, E);
    /* FP32 logits whatever the gate's format (never BF16 activations here). */
    KR("egk_gemm (router)", egk_gemm(a->x, a->T, kw(a->gate), im->L.router_logits, 0, im->stream));
    egk_weight bias;
    memset(&bias, 0, sizeof bias);
    if (a->bias && a->bias->fmt != EG_W_NONE) {
        if (!vector_fmt_ok(a->bias))
            return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: %s format", wname(a->bias));
        bias = kw(a->bias);
    }
    KR("egk_router_select", egk_router_select(im->L.router_logits, a->T, E, bias, a->n_group, a->topk_group, a->topk,
                                              a->norm_topk, a->routed_scale, a->ids, a->weights, im->stream));
    return EG_OK;
}

static void fill_ptrs(const eg_expert_w *x, egk_expert_ptrs *p) {
    p->gate = x->gate.data;
    p->gate_s = x->gate.scale;
    p->up = x->up.data;
    p->up_s = x->up.scale;
    p->down = x->down.data;
    p->down_s = x->down.scale;
}

/* The device pointer table for experts [e0, e1) of this array: cached per array and
 * rebuilt (once, with a host sync so no queued kernel still reads the old table) when
 * the array is new or its pointers changed. */
static eg_status expert_table(cuda_impl *im, const eg_moe_args *a, xtab **out, eg_error *err) {
    const eg_config *c = &im->cfg;
    int n = a->e1 - a->e0;
    for (int i = 0; i < im->L.n_xtab; i++) {
        xtab *t = &im->xt[i];
        if (!t->valid || t->key != a->experts || t->e0 != a->e0 || t->e1 != a->e1) continue;
        int same = 1;
        for (int e = 0; e < n && same; e++) {
            egk_expert_ptrs p;
            fill_ptrs(&a->experts[a->e0 + e], &p);
            same = !memcmp(&p, &t->host[e], sizeof p);
        }
        if (same) {
            *out = t;
            return EG_OK;
        }
    }
    int slot = -1;
    for (int i = 0; i < im->L.n_xtab && slot < 0; i++)
        if (!im->xt[i].valid || im->xt[i].key == a->experts) slot = i;
    if (slot < 0) slot = im->xt_victim++ % im->L.n_xtab;
    xtab *t = &im->xt[slot];
    const eg_expert_w *x0 = &a->experts[a->e0];
    int fmt = (int)x0->gate.fmt, group = x0->gate.group;
    int64_t H = c->hidden, F = c->moe_inter;
    for (int e = a->e0; e < a->e1; e++) {
        const eg_expert_w *x = &a->experts[e];
        const eg_weight *ws[3] = {&x->gate, &x->up, &x->down};
        for (int j = 0; j < 3; j++) {
            const eg_weight *w = ws[j];
            int64_t r = j < 2 ? F : H, cc = j < 2 ? H : F;
            if ((int)w->fmt != fmt || w->group != group || !w->data || w->rows != r || w->cols != cc)
                return eg_fail(err, EG_ERR_UNSUPPORTED,
                               "cuda backend: expert %d %s: format %d group %d [%lld][%lld], expected the format of "
                               "expert %d (%d, group %d) and [%lld][%lld]",
                               e, wname(w), (int)w->fmt, w->group, (long long)w->rows, (long long)w->cols, a->e0, fmt,
                               group, (long long)r, (long long)cc);
        }
    }
    t->valid = 0;
    im->xt_gen++; /* graphs recorded before may read this slot's old table */
    NOT_WHILE_RECORDING(im, "building an expert table (first use of a layer's experts)");
    eg_status st = host_wait(im, NULL, "cudaStreamSynchronize (expert table)", err);
    if (st) return st;
    for (int e = 0; e < n; e++) fill_ptrs(&a->experts[a->e0 + e], &t->host[e]);
    CU("cudaMemcpyAsync (expert table)", cudaMemcpyAsync(t->dev, t->host, sizeof(egk_expert_ptrs) * (size_t)n,
                                                         cudaMemcpyHostToDevice, im->stream));
    t->key = a->experts;
    t->e0 = a->e0;
    t->e1 = a->e1;
    t->fmt = fmt;
    t->group = group;
    t->valid = 1;
    *out = t;
    return EG_OK;
}

static eg_status cu_moe(eg_backend *b, const eg_moe_args *a, eg_error *err) {
    cuda_impl *im = impl_of(b);
    const eg_config *c = &im->cfg;
    int K = a->topk, H = c->hidden, F = c->moe_inter;
    if (a->T <= 0 || a->e1 <= a->e0) return EG_OK;
    if (a->T > im->max_tokens || K > (c->topk > 0 ? c->topk : 1) || a->e0 < 0 || a->e1 > c->n_experts)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: moe: T=%d K=%d experts [%d,%d) exceed scratch", a->T, K,
                       a->e0, a->e1);
    xtab *t = NULL;
    eg_status st = expert_table(im, a, &t, err);
    if (st) return st;
    for (int t0 = 0; t0 < a->T; t0 += im->L.moe_chunk) {
        int Tc = a->T - t0 < im->L.moe_chunk ? a->T - t0 : im->L.moe_chunk;
        KR("egk_moe", egk_moe(a->x + (int64_t)t0 * H, Tc, H, F, a->ids + (int64_t)t0 * K, a->weights + (int64_t)t0 * K,
                              K, a->e0, a->e1, t->dev, t->fmt, t->group, &im->L.moe, im->moe_path,
                              a->y + (int64_t)t0 * H, im->stream));
    }
    return EG_OK;
}

static eg_status cu_sample(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *params,
                           uint64_t *rng, int32_t *out, eg_error *err) {
    cuda_impl *im = impl_of(b);
    NOT_WHILE_RECORDING(im, "sample");
    if (V > im->cfg.vocab) return eg_fail(err, EG_ERR_INVALID, "cuda backend: sample: V=%d exceeds the vocabulary", V);
    int chunk = im->L.sample_chunk;
    for (int i0 = 0; i0 < N; i0 += chunk) {
        int n = N - i0 < chunk ? N - i0 : chunk, any = 0;
        for (int i = 0; i < n; i++) {
            const eg_sample_params *p = &params[i0 + i];
            egk_sample_row *r = &im->rows_h[i];
            r->temperature = p->temperature;
            r->top_p = p->top_p;
            r->top_k = p->top_k;
            r->pad = 0;
            /* One draw per non-greedy row, exactly as eg_sample_row advances the state. */
            r->u = p->temperature > 0.0f ? eg_rng_uniform(&rng[i0 + i]) : 0.0;
            any |= p->temperature > 0.0f;
        }
        CU("cudaMemcpyAsync (sample params)", cudaMemcpyAsync(im->L.s_rows, im->rows_h, sizeof(egk_sample_row) * (size_t)n,
                                                              cudaMemcpyHostToDevice, im->stream));
        /* first the top-M path (no vocabulary sort); the rows it cannot settle exactly
         * come back as -1 and only they are sorted (EG_CUDA_SAMPLE=sort: every row) */
        const float *lg = logits + (int64_t)i0 * V;
        if (im->sample_m > 0 && any) /* all greedy: egk_sample runs just the argmax */
            KR("egk_sample_topm", egk_sample_topm(lg, n, V, im->L.s_rows, im->sample_m, im->L.s_out, im->stream));
        else
            KR("egk_sample", egk_sample(lg, n, V, im->L.s_rows, any, im->L.s_keys, im->L.s_ids_in, im->L.s_ids_out,
                                        im->L.s_offsets, im->L.s_temp, im->L.s_temp_bytes, im->L.s_out, im->stream));
        for (int round = 0;; round++) {
            CU("cudaMemcpyAsync (sampled tokens)", cudaMemcpyAsync(im->out_h, im->L.s_out, sizeof(int32_t) * (size_t)n,
                                                                   cudaMemcpyDeviceToHost, im->stream));
            eg_status st = host_wait(im, NULL, "cudaStreamSynchronize (sample)", err);
            if (st) return st;
            int nw = 0;
            for (int i = 0; i < n; i++)
                if (im->out_h[i] < 0) im->which_h[nw++] = i;
            if (!nw) break;
            if (round) return eg_fail(err, EG_ERR_DEVICE, "cuda backend: sampling left %d rows unsettled after the sort", nw);
            im->sample_sorted_rows += nw;
            CU("cudaMemcpyAsync (rows to sort)", cudaMemcpyAsync(im->L.s_which, im->which_h, sizeof(int32_t) * (size_t)nw,
                                                                 cudaMemcpyHostToDevice, im->stream));
            KR("egk_sample_rows", egk_sample_rows(lg, n, V, im->L.s_rows, im->L.s_which, nw, im->L.s_keys,
                                                  im->L.s_ids_in, im->L.s_ids_out, im->L.s_seg, im->L.s_temp,
                                                  im->L.s_temp_bytes, im->L.s_out, im->stream));
        }
        memcpy(out + i0, im->out_h, sizeof(int32_t) * (size_t)n);
    }
    return EG_OK;
}

/* The top-M sampler's selection gives p(token) without sorting a row (egk_token_probs);
 * rows it cannot settle come back NaN, for the host. EG_CUDA_SAMPLE=sort: all NaN. */
static eg_status cu_token_probs(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *params,
                                const int32_t *tok, double *out, eg_error *err) {
    cuda_impl *im = impl_of(b);
    NOT_WHILE_RECORDING(im, "token_probs");
    if (V > im->cfg.vocab) return eg_fail(err, EG_ERR_INVALID, "cuda backend: token_probs: V=%d exceeds the vocabulary", V);
    for (int i = 0; i < N; i++)
        if (tok[i] >= V)
            return eg_fail(err, EG_ERR_INVALID, "cuda backend: token_probs: row %d: token %d out of range [0, %d)", i,
                           tok[i], V);
    if (im->sample_m <= 0) {
        for (int i = 0; i < N; i++)
            if (tok[i] >= 0) out[i] = NAN;
        return EG_OK;
    }
    int chunk = im->L.sample_chunk;
    for (int i0 = 0; i0 < N; i0 += chunk) {
        int n = N - i0 < chunk ? N - i0 : chunk, any = 0;
        for (int i = 0; i < n; i++) {
            const eg_sample_params *p = &params[i0 + i];
            int live = tok[i0 + i] >= 0;
            im->tok_h[i] = tok[i0 + i];
            im->rows_h[i] = (egk_sample_row){live ? p->temperature : 0.0f, live ? p->top_p : 1.0f, live ? p->top_k : 0,
                                             0, 0.0};
            any |= live;
        }
        if (!any) continue;
        CU("cudaMemcpyAsync (token_probs params)", cudaMemcpyAsync(im->L.s_rows, im->rows_h, sizeof(egk_sample_row) * (size_t)n,
                                                                   cudaMemcpyHostToDevice, im->stream));
        CU("cudaMemcpyAsync (token_probs tokens)", cudaMemcpyAsync(im->L.s_tok, im->tok_h, sizeof(int32_t) * (size_t)n,
                                                                   cudaMemcpyHostToDevice, im->stream));
        KR("egk_token_probs", egk_token_probs(logits + (int64_t)i0 * V, n, V, im->L.s_rows, im->L.s_tok, im->sample_m,
                                              im->L.s_prob, im->stream));
        CU("cudaMemcpyAsync (token_probs out)", cudaMemcpyAsync(im->prob_h, im->L.s_prob, sizeof(double) * (size_t)n,
                                                                cudaMemcpyDeviceToHost, im->stream));
        eg_status st = host_wait(im, NULL, "cudaStreamSynchronize (token_probs)", err);
        if (st) return st;
        for (int i = 0; i < n; i++)
            if (tok[i0 + i] >= 0) out[i0 + i] = im->prob_h[i];
    }
    return EG_OK;
}

/* A rejected draft's kept set from the same selection (egk_kept_probs), so its residual is
 * drawn on the host without the row; rows the selection cannot settle come back -1.
 * EG_CUDA_SAMPLE=sort: all -1. */
static eg_status cu_kept_probs(eg_backend *b, const float *logits, const int32_t *rows, int N, int V,
                               const eg_sample_params *params, int cap, int32_t *n_out, int32_t *ids, double *probs,
                               eg_error *err) {
    cuda_impl *im = impl_of(b);
    NOT_WHILE_RECORDING(im, "kept_probs");
    if (V > im->cfg.vocab) return eg_fail(err, EG_ERR_INVALID, "cuda backend: kept_probs: V=%d exceeds the vocabulary", V);
    if (cap < 1) return eg_fail(err, EG_ERR_INVALID, "cuda backend: kept_probs: cap %d < 1", cap);
    for (int i = 0; i < N; i++) {
        if (rows[i] < 0) return eg_fail(err, EG_ERR_INVALID, "cuda backend: kept_probs: row %d: index %d < 0", i, rows[i]);
        n_out[i] = -1;
    }
    int M = im->sample_m < cap ? im->sample_m : cap;
    if (M > im->L.kept_m) M = im->L.kept_m;
    if (M <= 0) return EG_OK;
    int chunk = im->L.kept_chunk;
    for (int i0 = 0; i0 < N; i0 += chunk) {
        int n = N - i0 < chunk ? N - i0 : chunk, any = 0;
        for (int i = 0; i < n; i++) {
            const eg_sample_params *p = &params[i0 + i];
            im->tok_h[i] = rows[i0 + i];
            im->rows_h[i] = (egk_sample_row){p->temperature, p->top_p, p->top_k, 0, 0.0};
            any |= p->temperature > 0.0f;
        }
        if (!any) continue;
        CU("cudaMemcpyAsync (kept_probs params)", cudaMemcpyAsync(im->L.s_rows, im->rows_h, sizeof(egk_sample_row) * (size_t)n,
                                                                  cudaMemcpyHostToDevice, im->stream));
        CU("cudaMemcpyAsync (kept_probs rows)", cudaMemcpyAsync(im->L.s_tok, im->tok_h, sizeof(int32_t) * (size_t)n,
                                                                cudaMemcpyHostToDevice, im->stream));
        KR("egk_kept_probs", egk_kept_probs(logits, n, V, im->L.s_tok, im->L.s_rows, M, im->L.k_n, im->L.k_ids,
                                            im->L.k_p, im->stream));
        size_t nm = (size_t)n * (size_t)M;
        CU("cudaMemcpyAsync (kept_probs counts)", cudaMemcpyAsync(im->kn_h, im->L.k_n, sizeof(int32_t) * (size_t)n,
                                                                  cudaMemcpyDeviceToHost, im->stream));
        CU("cudaMemcpyAsync (kept_probs ids)", cudaMemcpyAsync(im->kid_h, im->L.k_ids, sizeof(int32_t) * nm,
                                                               cudaMemcpyDeviceToHost, im->stream));
        CU("cudaMemcpyAsync (kept_probs probabilities)", cudaMemcpyAsync(im->kp_h, im->L.k_p, sizeof(double) * nm,
                                                                         cudaMemcpyDeviceToHost, im->stream));
        eg_status st = host_wait(im, NULL, "cudaStreamSynchronize (kept_probs)", err);
        if (st) return st;
        for (int i = 0; i < n; i++) {
            int k = im->kn_h[i];
            if (k < 0 || k > cap) continue;
            memcpy(ids + (int64_t)(i0 + i) * cap, im->kid_h + (size_t)i * M, sizeof(int32_t) * (size_t)k);
            memcpy(probs + (int64_t)(i0 + i) * cap, im->kp_h + (size_t)i * M, sizeof(double) * (size_t)k);
            n_out[i0 + i] = k;
        }
    }
    return EG_OK;
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static void cu_destroy(eg_backend *b) {
    if (!b) return;
    cuda_impl *im = impl_of(b);
    if (im) {
        cudaSetDevice(im->device); /* the destroying thread may have another GPU selected */
        if (im->stream) cudaStreamSynchronize(im->stream);
        if (im->prof) prof_report(im);
        prof_free(im);
        for (int i = 0; i < im->n_events; i++) cudaEventDestroy(im->stage_ev[i]);
        if (im->blas) cublasDestroy(im->blas);
        if (im->scratch) cudaFree(im->scratch);
        if (im->stage) cudaFreeHost(im->stage);
        if (im->rows_h) cudaFreeHost(im->rows_h);
        if (im->out_h) cudaFreeHost(im->out_h);
        if (im->which_h) cudaFreeHost(im->which_h);
        if (im->tok_h) cudaFreeHost(im->tok_h);
        if (im->prob_h) cudaFreeHost(im->prob_h);
        if (im->kn_h) cudaFreeHost(im->kn_h);
        if (im->kid_h) cudaFreeHost(im->kid_h);
        if (im->kp_h) cudaFreeHost(im->kp_h);
        if (im->xt_host) cudaFreeHost(im->xt_host);
        free(im->xt);
        if (im->stream) cudaStreamDestroy(im->stream);
        free(im);
    }
    free(b);
}

/* Profiled entries (EG_CUDA_PROFILE=1): the op between two timing events. */
#define PROFILED(op, T, call)                                                            \
    do {                                                                                 \
        cuda_impl *im_ = impl_of(b);                                                     \
        eg_status st_ = prof_begin(im_, err);                                            \
        if (!st_) st_ = (call);                                                          \
        return st_ ? st_ : prof_end(im_, op, T, err);                                    \
    } while (0)

static eg_status pf_embed(eg_backend *b, const int32_t *tokens, int T, const eg_weight *E, float *x, eg_error *err) {
    PROFILED(P_EMBED, T, cu_embed(b, tokens, T, E, x, err));
}
static eg_status pf_rmsnorm(eg_backend *b, const float *x, const eg_weight *w, int T, int D, float eps, float *y,
                            eg_error *err) {
    PROFILED(P_RMSNORM, T, cu_rmsnorm(b, x, w, T, D, eps, y, err));
}
static eg_status pf_add_rmsnorm(eg_backend *b, float *x, const float *dx, const eg_weight *w, int T, int D, float eps,
                                float *y, eg_error *err) {
    PROFILED(P_ADD_RMSNORM, T, cu_add_rmsnorm(b, x, dx, w, T, D, eps, y, err));
}
static eg_status pf_add(eg_backend *b, float *x, const float *dx, int64_t n, eg_error *err) {
    PROFILED(P_ADD, (int)(n / impl_of(b)->cfg.hidden), cu_add(b, x, dx, n, err));
}
static eg_status pf_linear(eg_backend *b, const float *x, int T, const eg_weight *W, float *y, eg_error *err) {
    PROFILED(P_LINEAR, T, cu_linear(b, x, T, W, y, err));
}
static eg_status pf_gather_rows(eg_backend *b, const float *x, const int32_t *idx, int n, int D, float *out,
                                eg_error *err) {
    PROFILED(P_GATHER, n, cu_gather_rows(b, x, idx, n, D, out, err));
}
static eg_status pf_swiglu_mlp(eg_backend *b, const float *x, int T, const eg_weight *gate, const eg_weight *up,
                               const eg_weight *down, float *y, int accumulate, eg_error *err) {
    PROFILED(P_SWIGLU, T, cu_swiglu_mlp(b, x, T, gate, up, down, y, accumulate, err));
}
static eg_status pf_mla_attention(eg_backend *b, const eg_mla_args *a, eg_error *err) {
    PROFILED(P_MLA, a->T, cu_mla_attention(b, a, err));
}
static eg_status pf_router(eg_backend *b, const eg_router_args *a, eg_error *err) {
    PROFILED(P_ROUTER, a->T, cu_router(b, a, err));
}
static eg_status pf_moe(eg_backend *b, const eg_moe_args *a, eg_error *err) {
    PROFILED(P_MOE, a->T, cu_moe(b, a, err));
}
static eg_status pf_gqa_attention(eg_backend *b, const eg_gqa_args *a, eg_error *err) {
    PROFILED(P_GQA, a->T, cu_gqa_attention(b, a, err));
}
static eg_status pf_copy_rows(eg_backend *b, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                              int rows, int64_t width, eg_error *err) {
    PROFILED(P_COPY_ROWS, rows, cu_copy_rows(b, dst, dst_stride, src, src_stride, rows, width, err));
}
static eg_status pf_sample(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *params,
                           uint64_t *rng, int32_t *out, eg_error *err) {
    PROFILED(P_SAMPLE, N, cu_sample(b, logits, N, V, params, rng, out, err));
}

/* Everything but the compute ops (CUDA_OPS_COMPUTE below). */
#define CUDA_OPS_COMMON                                                                  \
    .name = "cuda", .destroy = cu_destroy, .alloc = cu_alloc, .release = cu_release,     \
    .to_device = cu_to_device, .to_host = cu_to_host, .memset0 = cu_memset0, .copy = cu_copy, \
    .sync = cu_sync, .graph_begin = cu_graph_begin, .graph_enabled = cu_graph_enabled,   \
    .graph_end = cu_graph_end, .graph_launch = cu_graph_launch, .graph_free = cu_graph_free, \
    .bind = cu_bind, .weight_upload = cu_weight_upload, .weight_release = cu_weight_release, \
    .weight_random = cu_weight_random, .token_probs = cu_token_probs, .kept_probs = cu_kept_probs

/* The compute ops, plain (cu_) or profiled (pf_). */
#define CUDA_OPS_COMPUTE(P)                                                              \
    .embed = P##_embed, .rmsnorm = P##_rmsnorm, .add_rmsnorm = P##_add_rmsnorm, .add = P##_add, \
    .linear = P##_linear, .swiglu_mlp = P##_swiglu_mlp, .mla_attention = P##_mla_attention, \
    .router = P##_router, .moe = P##_moe, .gather_rows = P##_gather_rows, .sample = P##_sample, \
    .gqa_attention = P##_gqa_attention, .copy_rows = P##_copy_rows

static const eg_backend_ops cuda_ops = {CUDA_OPS_COMMON, CUDA_OPS_COMPUTE(cu)};
static const eg_backend_ops cuda_ops_profiled = {CUDA_OPS_COMMON, CUDA_OPS_COMPUTE(pf)};

static eg_status device_check(int device, eg_error *err);

/* The timed loops of eg_cuda_measure; buffers and handles are freed by the caller. */
static eg_status measure_run(cudaStream_t st, cublasHandle_t h, void *a, void *b, size_t bytes, double *copy,
                             double *flops, eg_error *err) {
    const int reps = 8, n = 8192, greps = 4;
    const float one = 1.0f, zero = 0.0f;
    CU("cudaMemsetAsync (measure)", cudaMemsetAsync(a, 0, bytes, st));
    CU("cudaMemcpyAsync (measure warm-up)", cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
    CU("cudaStreamSynchronize (measure)", cudaStreamSynchronize(st));
    double t0 = eg_now();
    for (int i = 0; i < reps; i++)
        CU("cudaMemcpyAsync (measure)", cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, st));
    CU("cudaStreamSynchronize (measure)", cudaStreamSynchronize(st));
    *copy = 2.0 * (double)bytes * reps / (eg_now() - t0);
    /* A, B: bf16 [n][n] in the first 256 MiB of a; C: f32 [n][n] in b */
    const uint16_t *A = a, *B = (const uint16_t *)a + (size_t)n * n;
    BL("cublasSetStream (measure)", cublasSetStream(h, st));
    for (int i = 0; i <= greps; i++) {
        if (i == 1) {
            CU("cudaStreamSynchronize (measure)", cudaStreamSynchronize(st));
            t0 = eg_now();
        }
        BL("cublasGemmEx (measure)", cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B,
                                                  CUDA_R_16BF, n, &zero, b, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                                  CUBLAS_GEMM_DEFAULT));
    }
    CU("cudaStreamSynchronize (measure)", cudaStreamSynchronize(st));
    *flops = 2.0 * n * (double)n * n * greps / (eg_now() - t0);
    return EG_OK;
}

eg_status eg_cuda_measure(int device, double *copy_bytes_per_s, double *bf16_flops_per_s, eg_error *err) {
    *copy_bytes_per_s = *bf16_flops_per_s = 0;
    eg_status st = device_check(device, err);
    if (st) return st;
    CU("cudaSetDevice", cudaSetDevice(device));
    size_t bytes = (size_t)1 << 30; /* also holds the GEMM's A, B (256 MiB) and C (256 MiB) */
    void *a = NULL, *b = NULL;
    cudaStream_t s = NULL;
    cublasHandle_t h = NULL;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cudaGetLastError();
        st = cuda_fail(err, "cudaMalloc/cudaStreamCreate (measure)", e);
    } else {
        cublasStatus_t bs = cublasCreate(&h);
        st = bs != CUBLAS_STATUS_SUCCESS ? blas_fail(err, "cublasCreate (measure)", bs)
                                         : measure_run(s, h, a, b, bytes, copy_bytes_per_s, bf16_flops_per_s, err);
    }
    if (h) cublasDestroy(h);
    if (s) cudaStreamDestroy(s);
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    return st;
}

/* A CUDA backend is one with either ops table: a profiled run (EG_CUDA_PROFILE=1) must
 * be recognised as CUDA everywhere (transport choice, device binding), or it would
 * measure another pipeline than the one it profiles. */
static int is_cuda(const eg_backend *b) { return b && (b->ops == &cuda_ops || b->ops == &cuda_ops_profiled); }

eg_status eg_backend_cuda_device(eg_backend *b, int *device, void **stream) {
    if (device) *device = -1;
    if (stream) *stream = NULL;
    if (!is_cuda(b)) return EG_ERR_UNSUPPORTED;
    if (device) *device = impl_of(b)->device;
    if (stream) *stream = (void *)impl_of(b)->stream;
    return EG_OK;
}

int64_t eg_cuda_sample_sorted_rows(eg_backend *b) {
    return is_cuda(b) ? impl_of(b)->sample_sorted_rows : 0;
}

eg_status eg_backend_cuda_add_wait_check(eg_backend *b, eg_cuda_wait_hook *h) {
    if (!is_cuda(b)) return EG_ERR_UNSUPPORTED;
    h->next = impl_of(b)->waits;
    impl_of(b)->waits = h;
    return EG_OK;
}

void eg_backend_cuda_remove_wait_check(eg_backend *b, eg_cuda_wait_hook *h) {
    if (!b || !is_cuda(b)) return;
    for (eg_cuda_wait_hook **p = &impl_of(b)->waits; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            h->next = NULL;
            return;
        }
}

/* The EG_CUDA_* switches (docs/CUDA.md): a value none of them knows is an error, not a
 * silent default, so a typo cannot make a measurement run the path it meant to avoid. */
static eg_status switches_check(eg_error *err) {
    static const struct {
        const char *name, *values[5];
    } sw[] = {
        {"EG_CUDA_GEMM", {"hilo", "bf16"}},          {"EG_CUDA_FUSE", {"1", "0"}},
        {"EG_CUDA_MOE", {"auto", "reg", "simt"}},    {"EG_CUDA_MLA", {"auto", "tc16", "tc32", "simt"}},
        {"EG_CUDA_SAMPLE", {"auto", "sort"}},        {"EG_CUDA_GRAPHS", {"1", "0"}},
        {"EG_CUDA_PROFILE", {"0", "1"}},
    };
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
        const char *v = getenv(sw[i].name);
        if (!v || !*v) continue;
        char known[64] = "";
        int ok = 0;
        for (int j = 0; j < 5 && sw[i].values[j]; j++) {
            ok |= !strcmp(v, sw[i].values[j]);
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "", sw[i].values[j]);
        }
        if (!ok) return eg_fail(err, EG_ERR_INVALID, "cuda backend: %s=%s: expected one of %s", sw[i].name, v, known);
    }
    const char *m = getenv("EG_CUDA_SAMPLE_M");
    if (m && *m) {
        char *end;
        long n = strtol(m, &end, 10);
        if (*end || n < 1 || n > EGK_SAMPLE_TOPM_MAX)
            return eg_fail(err, EG_ERR_INVALID, "cuda backend: EG_CUDA_SAMPLE_M=%s: expected an integer in 1..%d", m,
                           EGK_SAMPLE_TOPM_MAX);
    }
    return EG_OK;
}

static eg_status device_check(int device, eg_error *err) {
    eg_status st = switches_check(err);
    if (st) return st;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: no CUDA device (cudaGetDeviceCount: %s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device < 0 || device >= count)
        return eg_fail(err, EG_ERR_INVALID, "cuda backend: device %d out of range (%d present)", device, count);
    return EG_OK;
}

/* Everything below may fail halfway; cu_destroy frees whatever was made. */
static eg_status cuda_init(cuda_impl *im, eg_error *err) {
    if ((int64_t)EG_CUDA_SAMPLE_CHUNK * im->cfg.vocab > INT32_MAX) /* CUB counts a pass's items in int */
        return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda backend: a vocabulary of %d ids is over the sampler's limit (%lld)",
                       im->cfg.vocab, (long long)(INT32_MAX / EG_CUDA_SAMPLE_CHUNK));
    CU("cudaSetDevice", cudaSetDevice(im->device));
    CU("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking));
    BL("cublasCreate", cublasCreate(&im->blas));
    BL("cublasSetStream", cublasSetStream(im->blas, im->stream));
    for (; im->n_events < EG_CUDA_STAGE_SLOTS; im->n_events++)
        CU("cudaEventCreateWithFlags",
           cudaEventCreateWithFlags(&im->stage_ev[im->n_events], cudaEventDisableTiming));
    size_t tb = sample_temp_bytes(&im->cfg, im->max_tokens);
    layout_scratch(&im->cfg, im->max_tokens, tb, NULL, &im->L);
    size_t total = im->L.total;
    cudaError_t e = cudaMalloc(&im->scratch, total);
    if (e != cudaSuccess) {
        im->scratch = NULL;
        cudaGetLastError();
        return eg_fail(err, EG_ERR_NOMEM, "cuda backend: cudaMalloc of %zu bytes of scratch (max_tokens %d) failed: %s",
                       total, im->max_tokens, cudaGetErrorString(e));
    }
    layout_scratch(&im->cfg, im->max_tokens, tb, (unsigned char *)im->scratch, &im->L);
    BL("cublasSetWorkspace", cublasSetWorkspace(im->blas, im->L.blas_ws, EG_CUDA_BLAS_WS));
    CU("cudaMallocHost (staging)", cudaMallocHost((void **)&im->stage, EG_CUDA_STAGE_SLOTS * EG_CUDA_STAGE_SLOT));
    CU("cudaMallocHost (sample rows)",
       cudaMallocHost((void **)&im->rows_h, sizeof(egk_sample_row) * (size_t)im->L.sample_chunk));
    CU("cudaMallocHost (sample out)", cudaMallocHost((void **)&im->out_h, sizeof(int32_t) * (size_t)im->L.sample_chunk));
    CU("cudaMallocHost (sample rows)", cudaMallocHost((void **)&im->which_h, sizeof(int32_t) * (size_t)im->L.sample_chunk));
    CU("cudaMallocHost (token_probs tokens)", cudaMallocHost((void **)&im->tok_h, sizeof(int32_t) * (size_t)im->L.sample_chunk));
    CU("cudaMallocHost (token_probs out)", cudaMallocHost((void **)&im->prob_h, sizeof(double) * (size_t)im->L.sample_chunk));
    size_t nk = (size_t)im->L.kept_chunk, nkm = nk * (size_t)im->L.kept_m;
    CU("cudaMallocHost (kept_probs counts)", cudaMallocHost((void **)&im->kn_h, sizeof(int32_t) * nk));
    CU("cudaMallocHost (kept_probs ids)", cudaMallocHost((void **)&im->kid_h, sizeof(int32_t) * nkm));
    CU("cudaMallocHost (kept_probs probabilities)", cudaMallocHost((void **)&im->kp_h, sizeof(double) * nkm));
    size_t nx = (size_t)im->L.n_xtab, E = (size_t)im->L.E;
    CU("cudaMallocHost (expert tables)", cudaMallocHost((void **)&im->xt_host, sizeof(egk_expert_ptrs) * nx * E));
    im->xt = eg_calloc(nx, sizeof *im->xt, err);
    if (!im->xt) return EG_ERR_NOMEM;
    for (size_t i = 0; i < nx; i++) {
        im->xt[i].host = im->xt_host + i * E;
        im->xt[i].dev = im->L.xtab_dev + i * E;
    }
    return EG_OK;
}

eg_status eg_backend_cuda_create(const eg_config *cfg, const eg_backend_opts *o, eg_backend **out, eg_error *err) {
    *out = NULL;
    eg_status st = device_check(o->device, err);
    if (st) return st;
    eg_backend *b = eg_calloc(1, sizeof *b, err);
    cuda_impl *im = b ? eg_calloc(1, sizeof *im, err) : NULL;
    if (!im) {
        free(b);
        return EG_ERR_NOMEM;
    }
    b->ops = &cuda_ops;
    b->impl = im;
    im->cfg = *cfg;
    im->cfg.eos_ids = NULL;
    im->cfg.n_eos = 0;
    im->device = o->device;
    im->max_tokens = o->max_tokens > 0 ? o->max_tokens : 1;
    const char *gm = getenv("EG_CUDA_GEMM");
    im->split = !(gm && !strcmp(gm, "bf16"));
    /* switches for before/after benchmarks of issue 7's levers; the defaults are the fast paths */
    const char *fz = getenv("EG_CUDA_FUSE"), *mp = getenv("EG_CUDA_MOE");
    im->fuse = !(fz && !strcmp(fz, "0"));
    im->moe_path = mp && !strcmp(mp, "simt") ? EGK_MOE_SIMT : mp && !strcmp(mp, "reg") ? EGK_MOE_REG : EGK_MOE_AUTO;
    const char *ml = getenv("EG_CUDA_MLA");
    im->mla_simt = ml && !strcmp(ml, "simt");
    im->mla_rows = ml && !strcmp(ml, "tc16") ? 16 : ml && !strcmp(ml, "tc32") ? 32 : 0;
    const char *sm = getenv("EG_CUDA_SAMPLE"), *smm = getenv("EG_CUDA_SAMPLE_M");
    im->sample_m = sm && !strcmp(sm, "sort") ? 0 : EGK_SAMPLE_TOPM_MAX;
    if (im->sample_m && smm && *smm) im->sample_m = atoi(smm); /* range checked by switches_check */
    im->graphs = eg_cuda_graphs_enabled();
    const char *pf = getenv("EG_CUDA_PROFILE");
    if (pf && !strcmp(pf, "1")) {
        b->ops = &cuda_ops_profiled;
        im->graphs = 0;
    }
    if ((st = cuda_init(im, err)) || (b->ops == &cuda_ops_profiled && (st = prof_create(im, err)))) {
        cu_destroy(b);
        return st;
    }
    *out = b;
    return EG_OK;
}

/* ---- planner and pinned memory ------------------------------------------------------------- */

eg_status eg_cuda_mem_info(int device, int64_t *free_bytes, int64_t *total_bytes, eg_error *err) {
    *free_bytes = *total_bytes = 0;
    eg_status st = device_check(device, err);
    if (st) return st;
    CU("cudaSetDevice", cudaSetDevice(device));
    size_t fr = 0, to = 0;
    CU("cudaMemGetInfo", cudaMemGetInfo(&fr, &to));
    *free_bytes = (int64_t)fr;
    *total_bytes = (int64_t)to;
    return EG_OK;
}

eg_status eg_cuda_plan(const eg_config *cfg, const eg_backend_opts *o, double fraction, int64_t weight_bytes,
                       int64_t act_bytes, int n_layers, int64_t extra_per_token, int block_size,
                       eg_cuda_mem_plan *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    int64_t free_b = 0, total_b = 0;
    eg_status st = eg_cuda_mem_info(o->device, &free_b, &total_b, err);
    if (st) return st;
    return eg_cuda_plan_mem(cfg, o, fraction, total_b, free_b, weight_bytes, act_bytes, n_layers, extra_per_token,
                            block_size, out, err);
}

/* A 64-byte header records how the block was allocated, so free needs no lookup. */
#define HOST_HDR 64
void *eg_cuda_host_alloc(size_t bytes, eg_error *err) {
    unsigned char *p = NULL;
    int count = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0 &&
        cudaMallocHost((void **)&p, bytes + HOST_HDR) == cudaSuccess) {
        p[0] = 1;
        return p + HOST_HDR;
    }
    cudaGetLastError();
    p = eg_malloc(bytes + HOST_HDR, err);
    if (!p) return NULL;
    p[0] = 0;
    return p + HOST_HDR;
}

void eg_cuda_host_free(void *q) {
    if (!q) return;
    unsigned char *p = (unsigned char *)q - HOST_HDR;
    if (p[0]) cudaFreeHost(p);
    else free(p);
}

eg_status eg_cuda_ep_pack(eg_backend *b, const int32_t *ids, const float *weights, int T, int K, int R, int lo,
                          int ne, int rank, int layer, int left, int32_t *counts, int32_t *sendtok, int32_t *meta,
                          int32_t *tk2pair, eg_error *err) {
    if (!is_cuda(b)) return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: ep pack on a non-CUDA backend");
    cuda_impl *im = impl_of(b);
    KR("egk_ep_pack", egk_ep_pack(ids, weights, T, K, R, lo, ne, rank, layer, left, counts, sendtok, meta, tk2pair,
                                  im->stream));
    return EG_OK;
}

eg_status eg_cuda_ep_combine(eg_backend *b, const float *back, const int32_t *tk2pair, const int32_t *ids, int T,
                             int K, int H, float *y,
                             eg_error *err) {
    if (!is_cuda(b)) return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: ep combine on a non-CUDA backend");
    KR("egk_ep_combine", egk_ep_combine(back, tk2pair, ids, T, K, H, y, impl_of(b)->stream));
    return EG_OK;
}

eg_status eg_cuda_gather_received(eg_backend *b, const float *x, int64_t n_src, const int32_t *idx, int n, int D,
                                  float *out, eg_error *err) {
    if (!is_cuda(b)) return eg_fail(err, EG_ERR_UNSUPPORTED, "cuda: gather on a non-CUDA backend");
    if (n_src < 1) return eg_fail(err, EG_ERR_INVALID, "cuda: gather of %d rows from %lld", n, (long long)n_src);
    KR("egk_gather_rows", egk_gather_rows(x, idx, n, D, n_src, out, impl_of(b)->stream));
    return EG_OK;
}

#endif /* EG_HAVE_CUDA */
