/* forward.h — the Kimi-K2.5 / DeepSeek-V3 forward pass over a range of layers,
 * written once against the backend interface (backend.h).
 *
 *   x = embed(tokens)                                     (first stage only)
 *   for each layer l in [l0, l1):
 *       x += attn(rmsnorm(x));  x += ffn(rmsnorm(x))      (dense MLP or MoE)
 *   normed = rmsnorm_final(x); logits = lm_head(normed)   (last stage only)
 *
 * A step processes T tokens from any mix of sequences (prefill chunks and decode
 * tokens together); token t belongs to cache slot slot[t] at position pos[t], and its
 * latent is written to the cache before attention reads it. A forward object owns its
 * layers' device weights (uploaded at create), scratch for max_tokens, and the KV cache
 * of those layers. A pipeline stage is a forward object over a layer sub-range; it takes
 * x_in and gives x_out instead of tokens/logits.
 * Ownership: eg_forward borrows model and backend (both must outlive it).
 * Thread safety: one thread drives a forward object. */
#ifndef EG_FORWARD_H
#define EG_FORWARD_H

#include "engine/kv_cache.h"

typedef struct eg_forward_opts {
    int layer_begin, layer_end; /* [l0, l1); 0, 0 = the whole model */
    int max_tokens;             /* T bound per step */
    int logit_rows;             /* rows of logits a step may ask for (the last stage's buffer
                                   of [logit_rows][V]; eg_forward_logit_rows); 0 = max_tokens */
    int n_slots;                /* sequence slots */
    int max_seq_len;            /* per sequence */
    int block_size;             /* cache block size in tokens (0 = 64) */
    int64_t kv_blocks;          /* 0 = n_slots * ceil(max_seq_len / block_size) */
    const int *capture;         /* layers whose output is captured: k = output of decoder
                                   layer k (HF hidden_states[k+1]); -1 = the embedding */
    int n_capture;
    int final_pre_norm;         /* capture the residual before the final norm instead */
    int random_weights;         /* draw every weight on the backend (weight_random) instead
                                   of uploading the model's data: benchmarks of a preset
                                   whose checkpoint is only a sparse layout. Scales follow
                                   mkmodel.h's (linear N(0,1/fan_in)-like, norms near 1) */
    uint64_t random_seed;
    int no_graphs;              /* never record/replay steps, even where the backend can */
    struct eg_ep_group *ep;     /* expert-parallel group (collective.h): the routed experts of
                                   every MoE layer run over the group; NULL = all here */
    int ep_rank;                /* this forward's rank in ep */
    /* A layer split between two stages (a boundary layer's routed experts on both sides
     * of it, so the stages' memory can balance finer than whole layers). The routed sum
     * goes in ascending expert id (backend.h eg_moe_order), so the two halves are one left
     * fold and the split changes no bit. With ep the group splits the same layer at the
     * same expert (collective.h layer_cuts): each half is a routed call of its own. */
    int tail_cut;               /* > 0: layer_end - 1 is split at this expert: its attention,
                                   router and routed experts [0, tail_cut) run here, and the
                                   stage gives the hand-over (eg_forward_out) instead of x */
    int head_cut;               /* > 0: layer_begin is the previous stage's split layer: only its
                                   routed experts [head_cut, E), its shared expert and the
                                   residual add run here, on the hand-over it takes in (no
                                   attention, no cache for that layer) */
    eg_kv_dtype kv_dtype;       /* latent cache element type. 0 = EG_KV_BF16, the only one
                                   eaglegen makes data with (eg_engine_opts cannot set it,
                                   so `generate` never runs another); the others are
                                   `eaglegen fidelity`'s measurement caches (backend.h),
                                   CPU backend only: any other backend is refused */
} eg_forward_opts;

typedef struct eg_step {
    int T;
    const int32_t *tokens;  /* [T] host; first stage */
    const int32_t *pos;     /* [T] host */
    const int32_t *slot;    /* [T] host */
    const float *x_in;      /* [T][eg_forward_in_floats] host; stages after the first (unless
                               x_device) */
    float *x_out;           /* [T][eg_forward_out_floats] host; stages before the last (NULL
                               otherwise) */
    int x_device;           /* the rows are in eg_forward_in() already (a transport put them
                               there) and the stage leaves its own in eg_forward_out() for a
                               transport to take: x_in and x_out unused */
    int async;              /* return without waiting for the backend: capture and x_out
                               copies complete later (the caller orders them, e.g. by a
                               transport send or a sync); only for stages before the last */
    /* Rows whose logits are wanted (last stage): */
    int n_logits;
    const int32_t *logit_rows; /* [n_logits] indices into 0..T-1 */
    float *logits;             /* [n_logits][V] host, or NULL when sampling only */
    int32_t *sampled;          /* [n_logits] host: sample these rows (NULL = no sampling) */
    const eg_sample_params *sp;/* [n_logits] */
    uint64_t *rng;             /* [n_logits] per-row RNG states, advanced */
    const int32_t *prob_tok;   /* [n_logits] host: a token per row whose probability under
                                  sp is wanted (-1 = none), or NULL; needs sp */
    double *prob;              /* [n_logits] host: the backend's token_probs (NaN = the
                                  host must compute it); untouched where prob_tok is -1, and
                                  all NaN when the backend offers none */
    /* Capture (host, NULL = skip): */
    float *capture;            /* [n_capture][T][H]; entries for layers outside [l0,l1) untouched */
    float *final_hidden;       /* [T][H] final-norm output (or pre-norm residual) */
    float *final_pre_hidden;   /* [T][H] pre-norm residual (the final norm's input), NULL = skip */
} eg_step;

typedef struct eg_forward eg_forward;

eg_status eg_forward_create(const eg_model *m, eg_backend *be, const eg_forward_opts *o, eg_forward **out, eg_error *err);
void eg_forward_free(eg_forward *f);
eg_status eg_forward_step(eg_forward *f, const eg_step *s, eg_error *err);
eg_kv_cache *eg_forward_kv(eg_forward *f);
/* The last stage, after a step that took no logits to the host (eg_step.logits NULL):
 * out[i][0..V) = the step's logit row rows[i] (an index into its logit rows), i < n, out
 * host memory; then waits for the copies. Valid until the next step, on the thread that
 * drives the backend. Lets a caller take only the rows it turns out to need. */
eg_status eg_forward_fetch_logits(eg_forward *f, const int32_t *rows, int n, float *out, eg_error *err);
/* Then out[i] = a token drawn from logit row rows[i] (ascending, distinct) with sp[i] and
 * rng[i] (advanced), as eg_step.sampled draws: the backend's sample op, the rows first
 * moved to the front of the logits buffer, so the step's rows are gone after it (fetch
 * before). Same thread and lifetime as eg_forward_fetch_logits. */
/* Before those two: the kept sets of logit rows rows[i], i < n (backend.h kept_probs:
 * n_out[i], ids / probs [i][cap]); n = 0 is a no-op. Fails where the backend does not
 * offer kept_probs. Same thread and lifetime. */
eg_status eg_forward_kept_probs(eg_forward *f, const int32_t *rows, int n, const eg_sample_params *sp, int cap,
                                int32_t *n_out, int32_t *ids, double *probs, eg_error *err);
eg_status eg_forward_sample_logits(eg_forward *f, const int32_t *rows, int n, const eg_sample_params *sp, uint64_t *rng,
                                   int32_t *out, eg_error *err);
/* The residual stream buffer [max_tokens][H] in backend memory: after a step of a
 * stage before the last it holds the rows for the next stage; a stage after the first
 * takes its input from it when eg_step.x_device is set. */
float *eg_forward_x(eg_forward *f);
/* What a stage takes in and gives out, in backend memory: [T][H] rows (eg_forward_x), or
 * across a split layer the hand-over of T rows, planes of [T][H] residual, [T][H] normed
 * row, [T][H] partial routed sum, [T][K] router ids (int32 bits) and [T][K] weights:
 * 3H + 2K floats per row. *_floats: floats per row. */
float *eg_forward_in(eg_forward *f);
float *eg_forward_out(eg_forward *f);
int64_t eg_forward_in_floats(const eg_forward *f);
int64_t eg_forward_out_floats(const eg_forward *f);
/* 3H + 2K: floats per row of a split layer's hand-over. */
int64_t eg_forward_handover_floats(const eg_config *c);
int eg_forward_is_first(const eg_forward *f);
int eg_forward_is_last(const eg_forward *f);
/* The logit rows a step of an engine can ask for: every row with kept logits
 * (want_logits) or unknown slots (n_slots <= 0: --batch auto); else one a sequence, k + 1
 * with draft_tokens k; at most max_tokens. */
int eg_forward_logit_rows(int max_tokens, int n_slots, int draft_tokens, int want_logits);

/* Backend bytes a forward object allocates for activations at max_tokens rows (for
 * memory planning before it exists; an upper bound). logit_rows: its logits buffer's
 * rows (eg_forward_opts.logit_rows as the forward takes it; 0 for a stage before the
 * last, which holds none). n_staged: captured layers this stage owns when its backend
 * records replays (their rows are staged in backend memory), 0 when it does not;
 * eg_forward_staged_captures counts them. */
int64_t eg_forward_act_bytes(const eg_config *c, int max_tokens, int logit_rows, int n_staged);
/* Of capture[0..n_capture) (layer ids, -1 = embedding output), those a stage over
 * layers [layer_begin, layer_end) owns. */
int eg_forward_staged_captures(const int *capture, int n_capture, int layer_begin, int layer_end);

/* Recorded replay. On a backend with graph ops (CUDA graphs), a step of at most 512
 * tokens is recorded the second time its shape (tokens, position bound, logit rows,
 * capture on/off) is seen and replayed after that: one launch per step instead of one
 * per op. Captured rows then go through a device buffer and are copied out after the
 * step. A recording that fails (e.g. an op that cannot be recorded) falls back to
 * running the ops one by one; the first reason is kept here. */
typedef struct eg_forward_graph_stats {
    int64_t recorded, replays, failed, stale, evicted;
    char first_failure[256];
} eg_forward_graph_stats;
void eg_forward_get_graph_stats(const eg_forward *f, eg_forward_graph_stats *out);
/* The position bound a step is run with: max_pos rounded up (to a multiple of 256, or of
 * a quarter of its power of two when larger), at most limit, never below max_pos. */
int eg_forward_pos_bucket(int max_pos, int limit);
/* Bytes of this forward's weights as stored on the backend. */
int64_t eg_forward_weight_bytes(const eg_forward *f);

#endif
