/* backend.h — the one ops interface the forward pass and scheduler call.
 *
 * A backend owns its memory ("device" memory; plain host memory on the CPU backend)
 * and implements each op of the Kimi-K2.5 / DeepSeek-V3 forward pass. Activations are
 * FP32 row-major [T][D] in backend memory; weights are eg_weight views made by
 * weight_upload (a view of the mmap on the CPU, a device copy on CUDA). Ops take local
 * head and expert ranges so a tensor/expert split needs no new ops.
 *
 * Dimension legend: T tokens in the step, H hidden, NH heads, DN/DR/DV nope/rope/value
 * head dims, C kv_lora_rank, E experts, K experts per token, F expert width, V vocab,
 * S sequence slots, MB max blocks per sequence, BS cache block size (tokens); for the
 * plain GQA op: NKV kv heads, HD head dim, MB blocks per slot of its paged cache.
 *
 * Ordering: ops on one backend run in issue order (a CUDA stream); to_host may be
 * asynchronous and is complete after sync.
 * Ownership: the caller owns eg_backend and frees it with eg_backend_free (NULL ok).
 * Thread safety: one thread drives a backend at a time; a thread that did not create
 * it calls eg_backend_bind first. */
#ifndef EG_BACKEND_H
#define EG_BACKEND_H

#include "engine/weights.h"

typedef struct eg_backend eg_backend;

/* Element type of the latent cache. EG_KV_BF16 is the only cache eaglegen produces data
 * with (`generate` cannot select another: eg_engine_opts has no such field). The others
 * are measurement caches that exist only for `eaglegen fidelity`, on the CPU backend:
 *   FP32     the exact reference (no rounding at the cache write);
 *   FP8      every latent and k_pe value in OCP E4M3 at scale 1 (vLLM's kv_cache_dtype
 *            "fp8" with its default scale 1.0): row = W bytes;
 *   FP8_TILE DeepSeek/vLLM "fp8_ds_mla" layout: the latent in tiles of 128 values (one
 *            tile when C < 128) as E4M3 with one FP32 scale per tile, amax / 448, and k_pe
 *            kept in BF16: row = C + 4 * tiles + 2 * DR bytes (656 on Kimi-K2.5). */
typedef enum eg_kv_dtype { EG_KV_BF16 = 0, EG_KV_FP32, EG_KV_FP8, EG_KV_FP8_TILE } eg_kv_dtype;

/* The MLA latent cache of one layer: [n_blocks][BS][C+DR] bf16, each row the
 * normalised latent then the rotated k_pe (round to nearest even). With a measurement
 * dtype the same [n_blocks][BS] rows hold row_bytes bytes each (layout above). */
typedef struct eg_kv_layer {
    uint16_t *data;
    eg_kv_dtype dtype; /* EG_KV_BF16 except inside `eaglegen fidelity` */
    int row_bytes;     /* bytes per cached token: 2 * (C + DR) for BF16 */
} eg_kv_layer;

/* Everything one MLA attention call needs. Positions/slots/tables live in backend memory. */
typedef struct eg_mla_args {
    int T;
    const int32_t *pos;         /* [T] position of each token in its sequence */
    const int32_t *slot;        /* [T] sequence slot of each token */
    const int32_t *block_table; /* [S][MB] physical block of each logical block */
    int max_blocks;             /* MB */
    int block_size;             /* BS */
    int max_pos;                /* max over pos[] + 1 in this call (bounds work, host-known) */
    const float *q;             /* [T][NH][DN+DR] q projection output (q_pe unrotated) */
    const float *kv;            /* [T][C+DR] kv_a output: raw latent, unrotated k_pe */
    const eg_weight *kv_a_norm; /* [C] */
    const eg_weight *kv_b;      /* [NH*(DN+DV)][C] */
    eg_kv_layer cache;          /* this layer's cache */
    const float *rope_inv_freq; /* [DR/2] in backend memory */
    float rope_attn_factor;     /* multiplies cos and sin */
    float softmax_scale;
    float eps;                  /* rms_norm_eps for kv_a_layernorm */
    int h0, h1;                 /* heads [h0, h1) computed here */
    float *out;                 /* [T][NH][DV]: rows for heads h0..h1 written */
} eg_mla_args;

/* Ordinary multi-head / grouped-query attention over a paged BF16 cache (the EAGLE-3
 * drafter's decoder layer; engine/drafter_eagle3.c). The K and V caches are
 * [n_blocks][BS][NKV][HD] bf16; position p of slot s lives in physical block
 * block_table[s][p / BS], row p % BS, so a slot holds only the blocks its positions
 * fill (mapped by the caller). The op first applies rotate-half RoPE (Llama's: pairs
 * (i, i + HD/2), angle pos * inv_freq[i] in FP64, cos/sin rounded to FP32) to every
 * row's k and writes k, v as BF16 (round to nearest even) at (slot[t], pos[t]); then
 * each row t attends, per head h (kv head h / (NH/NKV)), with its rotated q over
 * positions [0, pos[t]] of its slot, keys and values read back from the cache (so rows
 * of one call see each other causally): out = softmax(softmax_scale * q . K) V, FP32.
 * Positions, slots and the table live in backend memory; every block a row reads or
 * writes must be mapped. */
typedef struct eg_gqa_args {
    int T;
    int n_heads, n_kv_heads, head_dim; /* NH, NKV (divides NH), HD (even) */
    int block_size;             /* BS: positions per cache block */
    int max_blocks;             /* MB: blocks per slot (positions < MB * BS) */
    int64_t n_blocks;           /* physical blocks in each cache (bounds the table's entries) */
    int max_pos;                /* max over pos[] + 1 in this call (<= MB * BS, host-known) */
    const int32_t *pos;         /* [T] position of each row in its slot */
    const int32_t *slot;        /* [T] cache slot of each row */
    const int32_t *block_table; /* [S][MB] physical block of each logical block; -1 unmapped */
    const float *q;             /* [T][NH][HD] unrotated */
    const float *k;             /* [T][NKV][HD] unrotated */
    const float *v;             /* [T][NKV][HD] */
    uint16_t *k_cache;          /* [n_blocks][BS][NKV][HD] bf16, rotated keys */
    uint16_t *v_cache;          /* [n_blocks][BS][NKV][HD] bf16 */
    const float *rope_inv_freq; /* [HD/2] */
    float softmax_scale;        /* 1/sqrt(HD) for Llama */
    int window;                 /* > 0: sliding window, a row at position p attends to
                                   positions (p - window, p] only; 0: to [0, p] */
    float *out;                 /* [T][NH][HD] */
} eg_gqa_args;

typedef struct eg_router_args {
    int T;
    const float *x;               /* [T][H] normed */
    const eg_weight *gate;        /* [E][H] */
    const eg_weight *bias;        /* [E] e_score_correction_bias */
    int n_group, topk_group, topk;
    int norm_topk;
    float routed_scale;
    int32_t *ids;                 /* [T][K] chosen experts */
    float *weights;               /* [T][K] their weights (scaled) */
} eg_router_args;

typedef struct eg_moe_args {
    int T;
    const float *x;               /* [T][H] normed */
    const int32_t *ids;           /* [T][K] */
    const float *weights;         /* [T][K] */
    int topk;
    const eg_expert_w *experts;   /* [E] */
    int e0, e1;                   /* experts [e0, e1) computed here; others skipped */
    float *y;                     /* [T][H]: y += sum_k w * expert_k(x), in ascending expert id */
} eg_moe_args;

/* The order every backend and every expert-parallel combine adds one token's K routed
 * contributions in: ascending expert id (ties, which a router never makes, by k). That
 * is DeepSeek-V3's reference order (inference/model.py MoE.forward loops over the
 * experts), and it makes a split by expert range one left fold: the sum over [0, x)
 * continued over [x, E) gives the bits of the sum over [0, E). ids: [K]; ord: [K] out,
 * ord[j] the k added j-th. */
static inline void eg_moe_order(const int32_t *ids, int K, int *ord) {
    for (int j = 0; j < K; j++) {
        int k = j, i = j;
        for (; i > 0 && ids[ord[i - 1]] > ids[k]; i--) ord[i] = ord[i - 1];
        ord[i] = k;
    }
}

/* How weight_random draws a weight in place of uploading one (benchmarks of a preset:
 * no checkpoint bytes are read or written). Values are mean + std * U with U uniform of
 * unit variance; INT4 nibbles are uniform over 1..15 (values -7..7) with per-group BF16
 * scales std * (0.8 + 0.4 u); FP8 is not drawn. Element i depends only on (seed, i). */
typedef struct eg_weight_rand {
    uint64_t seed;
    float mean, std;
} eg_weight_rand;

typedef struct eg_sample_params {
    float temperature;            /* 0 = greedy */
    float top_p;                  /* 1 = off */
    int top_k;                    /* 0 = off */
} eg_sample_params;

/* The kept-set size callers ask kept_probs for: what a GPU's top-M selection settles at
 * most (EGK_SAMPLE_TOPM_MAX in kernels/); a larger set comes to the host as its row. */
#define EG_KEPT_CAP 2048

typedef struct eg_backend_ops {
    const char *name;
    void (*destroy)(eg_backend *b);
    /* memory */
    eg_status (*alloc)(eg_backend *b, size_t bytes, void **ptr, eg_error *err);
    void (*release)(eg_backend *b, void *ptr);
    eg_status (*to_device)(eg_backend *b, void *dst, const void *src, size_t bytes, eg_error *err);
    eg_status (*to_host)(eg_backend *b, void *dst, const void *src, size_t bytes, eg_error *err);
    eg_status (*memset0)(eg_backend *b, void *dst, size_t bytes, eg_error *err);
    eg_status (*sync)(eg_backend *b, eg_error *err);
    /* Make the calling thread able to drive b (CUDA: select b's GPU, a per-thread
     * setting). Every thread other than the creator calls it first. NULL = no-op. */
    eg_status (*bind)(eg_backend *b, eg_error *err);
    /* Make a weight usable by this backend (CPU: the view itself; CUDA: a device copy). */
    eg_status (*weight_upload)(eg_backend *b, const eg_weight *host, eg_weight *dev, eg_error *err);
    void (*weight_release)(eg_backend *b, eg_weight *dev);
    /* Allocate a weight of shape's format and dimensions (shape->data unused) and fill
     * it as r says. */
    eg_status (*weight_random)(eg_backend *b, const eg_weight *shape, const eg_weight_rand *r, eg_weight *dev,
                               eg_error *err);

    /* dst = src, both in backend memory. */
    eg_status (*copy)(eg_backend *b, void *dst, const void *src, size_t bytes, eg_error *err);
    /* Recorded replay (CUDA graphs); NULL where the backend has none. Between graph_begin
     * and graph_end the ops are recorded, not run; only ops on backend memory may be
     * issued (no to_device, to_host, sample or sync: they fail while recording). graph_end
     * stops recording either way and returns the replayable sequence, or fails (the
     * recording is discarded). graph_begin fails with EG_ERR_UNSUPPORTED when replay is
     * switched off (EG_CUDA_GRAPHS=0). graph_launch enqueues a replay; *ran = 0 means the
     * graph went stale (device tables it reads were rebuilt since it was recorded): it did
     * not run and the caller records again. graph_free: NULL ok, waits if it may be running. */
    eg_status (*graph_begin)(eg_backend *b, eg_error *err);
    /* 0 when graph_begin would only fail EG_ERR_UNSUPPORTED (switched off), so callers
     * need not hold buffers for replays; NULL = as graph_begin != NULL says. */
    int (*graph_enabled)(eg_backend *b);
    eg_status (*graph_end)(eg_backend *b, void **graph, eg_error *err);
    eg_status (*graph_launch)(eg_backend *b, void *graph, int *ran, eg_error *err);
    void (*graph_free)(eg_backend *b, void *graph);

    /* x[t] = E[tokens[t]] */
    eg_status (*embed)(eg_backend *b, const int32_t *tokens, int T, const eg_weight *E, float *x, eg_error *err);
    /* y[t] = x[t] / rms(x[t]) * w, FP32, eps from config */
    eg_status (*rmsnorm)(eg_backend *b, const float *x, const eg_weight *w, int T, int D, float eps, float *y, eg_error *err);
    /* x += dx, then y = rmsnorm(x) (the residual add fused with the next norm) */
    eg_status (*add_rmsnorm)(eg_backend *b, float *x, const float *dx, const eg_weight *w, int T, int D, float eps, float *y, eg_error *err);
    /* x += dx */
    eg_status (*add)(eg_backend *b, float *x, const float *dx, int64_t n, eg_error *err);
    /* y[T][rows] = x[T][cols] W^T, any weight format */
    eg_status (*linear)(eg_backend *b, const float *x, int T, const eg_weight *W, float *y, eg_error *err);
    /* y (+)= down(silu(gate x) * up x); accumulate selects += */
    eg_status (*swiglu_mlp)(eg_backend *b, const float *x, int T, const eg_weight *gate, const eg_weight *up, const eg_weight *down, float *y, int accumulate, eg_error *err);
    eg_status (*mla_attention)(eg_backend *b, const eg_mla_args *a, eg_error *err);
    eg_status (*router)(eg_backend *b, const eg_router_args *a, eg_error *err);
    eg_status (*moe)(eg_backend *b, const eg_moe_args *a, eg_error *err);
    /* out[i] = x[idx[i]] rows of width D */
    eg_status (*gather_rows)(eg_backend *b, const float *x, const int32_t *idx, int n, int D, float *out, eg_error *err);
    /* Ordinary MHA/GQA attention with its cache write (eg_gqa_args above). */
    eg_status (*gqa_attention)(eg_backend *b, const eg_gqa_args *a, eg_error *err);
    /* dst[r][0..width) = src[r][0..width) for r < rows; row strides in floats (writes a
     * column block of a wider matrix, e.g. the halves of a [T][2H] concat). */
    eg_status (*copy_rows)(eg_backend *b, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                           int rows, int64_t width, eg_error *err);
    /* Sample one token per row of logits [N][V]. params, rng and out are host arrays;
     * rng[i] is sequence i's generator state, advanced in place. */
    eg_status (*sample)(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *params, uint64_t *rng, int32_t *out, eg_error *err);
    /* out[i] = the probability row i's distribution (eg_sample_prob: params[i]'s
     * temperature, top-k and top-p over logits [N][V]) gives token tok[i], for rows with
     * tok[i] >= 0; NaN where the backend cannot tell it without sorting the row (the
     * caller computes those on the host); rows with tok[i] < 0 untouched. tok, params and
     * out are host arrays; no RNG is drawn. Lets a speculative verify chunk's acceptance
     * tests run without taking the rows to the host sampler. NULL = not offered. */
    eg_status (*token_probs)(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *params,
                             const int32_t *tok, double *out, eg_error *err);
    /* The kept set of logits row rows[i]'s distribution (params[i]'s temperature, top-k
     * and top-p, as eg_sample_row keeps it), i < N: n_out[i] = its size n, and ids[i][j] /
     * probs[i][j], j < n, its candidates in eg_sample_row's order with their probabilities
     * (eg_sample_prob's numbers), rows of stride cap; n_out[i] = -1 where the kept set has
     * more than cap ids, where the backend cannot settle it without sorting the row, and
     * for greedy rows (the caller takes those rows to the host). rows, params, n_out, ids
     * and probs are host arrays; no RNG is drawn. Lets a rejected draft's residual be drawn
     * without the row. NULL = not offered. */
    eg_status (*kept_probs)(eg_backend *b, const float *logits, const int32_t *rows, int N, int V,
                            const eg_sample_params *params, int cap, int32_t *n_out, int32_t *ids, double *probs,
                            eg_error *err);
} eg_backend_ops;

struct eg_backend {
    const eg_backend_ops *ops;
    void *impl;
};

/* Create a backend by name ("cpu" or "cuda"). max_tokens bounds T of any op call (the
 * backend sizes its scratch from it and cfg, so no op allocates). nthreads: CPU worker
 * threads (0 = eg_num_threads()). device: CUDA device index. */
typedef struct eg_backend_opts {
    const char *name;
    int max_tokens;
    int max_seq_len;  /* longest sequence any op will see */
    int nthreads;
    int device;
} eg_backend_opts;

eg_status eg_backend_create(const eg_config *cfg, const eg_backend_opts *o, eg_backend **out, eg_error *err);
void eg_backend_free(eg_backend *b);
/* Human-readable name of the device a backend of that name runs on (the CPU model from
 * /proc/cpuinfo; the CUDA device's name), for the manifest's precision record. Never
 * fails: an unknown device reads "unknown". */
void eg_device_name(const char *backend, int device, char *out, size_t n);
/* b->ops->bind when present; EG_OK otherwise. */
eg_status eg_backend_bind(eg_backend *b, eg_error *err);

eg_status eg_backend_cpu_create(const eg_config *cfg, const eg_backend_opts *o, eg_backend **out, eg_error *err);
/* Returns EG_ERR_UNSUPPORTED when built without CUDA or no GPU is present. */
eg_status eg_backend_cuda_create(const eg_config *cfg, const eg_backend_opts *o, eg_backend **out, eg_error *err);

/* The sampler shared by backends that sample on the host: temperature, top-k, top-p
 * with a per-sequence splitmix64 RNG; greedy picks the lowest id among equal maxima.
 * Candidates are ordered by logit (desc), then id; top-k keeps the first k, top-p the
 * shortest prefix whose probability mass reaches p; one uniform draw picks within it.
 * scratch must hold eg_sample_scratch_floats(V) floats, aligned as a double (malloc's);
 * iscratch is unused (may be NULL).
 * O(V): the order comes from a radix sort (eg_sample_order), and each kept candidate's
 * exp is taken once (the same numbers, summed in the same order, as the definition). */
int32_t eg_sample_row(const float *logits, int V, const eg_sample_params *p, uint64_t *rng, float *scratch, int32_t *iscratch);
/* The kept candidates of a non-greedy row, the numbers eg_sample_row samples from: the
 * order in scratch[0..V) as candidates, exp((v - max) / temperature) of the first n (the
 * return value: top_k, then the top_p cut) as doubles after them, *total their sum in
 * that order. scratch as for eg_sample_row. */
int eg_sample_kept(const float *logits, int V, const eg_sample_params *p, float *scratch, double *total);
/* The probability eg_sample_row's distribution gives token x (its kept candidate's exp
 * over the kept total; 0 outside; greedy: 1 at the argmax): bit for bit what
 * eg_spec_probs writes for x. scratch as for eg_sample_row. */
double eg_sample_prob(const float *logits, int V, const eg_sample_params *p, int32_t x, float *scratch);
/* Floats of scratch eg_sample_row needs for a vocabulary of V: 4V (two candidate arrays). */
size_t eg_sample_scratch_floats(int V);
/* A candidate of the sampler's order. */
typedef struct eg_sample_cand {
    float v;    /* the logit */
    int32_t id; /* its token id */
} eg_sample_cand;
/* out[0..V) = logits[0..V) in the sampler's order: higher logit first, equal logits (-0
 * and +0 are equal) by lower id; what qsort with that comparison gives, by a stable LSD
 * radix sort on the logits' orderable bits (4 passes of 8 bits). tmp: V entries. */
void eg_sample_order(const float *logits, int V, eg_sample_cand *out, eg_sample_cand *tmp);
/* Seed a per-sequence RNG state from (job seed, sample id). */
uint64_t eg_rng_seed(uint64_t seed, uint64_t id);
/* The value weight_random gives element i (BF16/F32 formats, before rounding): the
 * reference for backends and tests. */
float eg_weight_rand_value(const eg_weight_rand *r, int64_t i);
/* Word i of a drawn INT4 weight (8 nibbles, each 1..15) and group scale i. */
uint32_t eg_weight_rand_int4_word(const eg_weight_rand *r, int64_t i);
float eg_weight_rand_scale(const eg_weight_rand *r, int64_t i);
/* Uniform [0,1) from the state (splitmix64 step). */
double eg_rng_uniform(uint64_t *state);

#endif
