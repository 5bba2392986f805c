/* engine.h — the fixed-shape batch engine: continuous batching over sequence slots,
 * chunked prefill mixed with decode, per-sequence sampling, hidden-state capture.
 *
 * The caller supplies requests through a pull callback and receives finished
 * sequences through a done callback. Each step packs decode tokens (one per generating
 * slot) and prefill chunks into at most max_tokens rows; a finished sequence frees its
 * slot and its cache blocks for the next request at once. Capture covers every
 * position, the last generated token included (it is run through the model once more,
 * without sampling).
 *
 * KV cache (opts.kv_policy). EG_KV_ON_DEMAND (the default): a request is admitted when
 * the cache can hold its prompt plus a small watermark of free blocks; a sequence takes
 * one more block each time it crosses a block boundary. When a step cannot get a block,
 * the engine drains the pipeline and preempts: the victim is the youngest live sequence
 * (latest admitted), so the oldest always progress and finish first (no livelock: the
 * oldest sequence alone always fits, since a request larger than the whole cache is
 * refused when taken). The victim leaves its slot and every stage's cache together:
 * its blocks are copied to host memory (exact bytes; at most opts.host_kv_bytes held)
 * or, past that budget, dropped and recomputed later by a prefill of its tokens, with
 * the rows captured so far kept (recomputed positions are not captured again). Its
 * tokens, RNG state and captured rows stay with it. Preempted sequences come back,
 * oldest first, before any new request is admitted. A sequence is never truncated or
 * dropped. EG_KV_RESERVE: a request is admitted only when the cache can hold its whole
 * sequence (prompt + max_new), so nothing is ever preempted.
 *
 * Speculative decoding (opts.drafter, drafter.h): a generating sequence's decode rows
 * are its last token and up to draft_tokens drafts, verified in one chunk by spec.h's
 * rule; the cache and the drafter roll back past the first rejection (docs/ENGINE.md).
 *
 * Determinism: a sequence's tokens depend only on the model, its tokens, its sampling
 * parameters and RNG state — not on batch composition, preemption or recomputation
 * (the CPU backend reduces in a fixed order per row, and prefill and decode write the
 * same cache bytes).
 * Pipeline split: opts.stage_ends cuts the layers into stages run one after another
 * with the hidden rows handed over between them by a transport (transport.h), and
 * opts.stage_cuts may split a boundary layer's routed experts between two stages (the
 * hand-over then carries 3H + 2K floats per row); the output equals the unsplit engine. Preemption and swap-in run while no micro-batch is
 * in flight, on the driving thread (bound to each stage's backend in turn).
 * Ownership: the engine borrows model and backend(s); result buffers passed to the
 * done callback are valid only during the call.
 * Thread safety: one thread drives an engine; eg_engine_request_stop and
 * eg_engine_get_stats_shared may be called from any thread. */
#ifndef EG_ENGINE_H
#define EG_ENGINE_H

#include "engine/drafter.h"
#include "engine/forward.h"
#include "engine/spec.h"

typedef enum eg_finish {
    EG_FINISH_NONE = 0, /* teacher-forced (capture mode): nothing generated */
    EG_FINISH_STOP,     /* a stop token was generated (it is kept) */
    EG_FINISH_LENGTH    /* max_new tokens generated without a stop token */
} eg_finish;

typedef struct eg_request {
    uint64_t id;
    const int32_t *tokens;   /* [n_tokens] prompt, or the whole sequence when max_new == 0; copied */
    int n_tokens;
    int max_new;             /* tokens to generate; 0 = teacher-forced only */
    eg_sample_params sp;
    uint64_t rng;            /* initial RNG state, e.g. eg_rng_seed(job_seed, sample_index) */
    const int32_t *stop_ids; /* [n_stop]; copied */
    int n_stop;
    int stop_at;             /* benchmarks only (never generate): finish as if a stop token came
                                after this many generated tokens; 0 = off */
    void *user;
} eg_request;

typedef struct eg_result {
    uint64_t id;
    void *user;
    const int32_t *tokens;   /* [n_tokens] prompt + generated */
    int n_tokens;
    int prompt_len;
    int n_generated;
    eg_finish finish;
    int n_aux;
    const float *aux;        /* [n_tokens][n_aux][H] residual after each capture layer; NULL
                                with opts.capture_bf16 */
    const float *final;      /* [n_tokens][H] final-norm output (or pre-norm, per opts); NULL
                                with opts.capture_bf16 */
    const uint16_t *aux_bf16;   /* [n_tokens][n_aux][H] the same rounded to BF16 (eg_f32_to_bf16)
                                   with opts.capture_bf16, else NULL */
    const uint16_t *final_bf16; /* [n_tokens][H] likewise */
    const float *final_pre;     /* [n_tokens][H] pre-norm final state (residual after the last
                                   layer) with opts.final_both (F32 capture), else NULL */
    const uint16_t *final_pre_bf16; /* [n_tokens][H] likewise with opts.capture_bf16 */
    const float *logits;     /* [n_tokens][V] when opts.want_logits, else NULL */
} eg_result;

typedef enum eg_kv_policy {
    EG_KV_ON_DEMAND = 0,     /* blocks as sequences grow; preempt when the cache is full */
    EG_KV_RESERVE            /* prompt + max_new reserved at admission; never preempts */
} eg_kv_policy;

/* What an expert-parallel group splits besides the routed experts (ep_runtime.h). */
typedef enum eg_ep_split {
    EG_EP_SPLIT_NONE = 0,    /* shared expert and dense MLP whole on every rank */
    EG_EP_SPLIT_FFN,         /* layer l's shared expert / dense MLP on rank l mod ep only */
    EG_EP_SPLIT_ALL          /* FFN, and the embedding and lm_head vocab-split: rank r holds
                                rows [r*V/ep, (r+1)*V/ep) of each (CPU and CUDA ranks) */
} eg_ep_split;

typedef struct eg_engine_opts {
    int n_slots;             /* concurrent sequences at most */
    int max_seq_len;         /* prompt + generated, per sequence */
    int max_tokens;          /* rows per step (prefill chunk budget); >= 1 */
    int block_size;          /* cache block size (0 = 64) */
    int64_t kv_blocks;       /* 0 = enough for every slot at max_seq_len */
    const int *aux_layers;   /* capture: output of decoder layer k (0-based); -1 = embedding */
    int n_aux;
    int final_pre_norm;      /* final hidden = residual before the final norm */
    int final_both;          /* also capture the pre-norm final state (eg_result.final_pre*);
                                final stays post-norm (final_pre_norm must be 0) */
    int want_logits;         /* keep logits for every position (small vocabularies only) */
    int host_threads;        /* sampling on the host (want_logits, or a drafter: every row a
                                step samples, and the acceptance rule): threads drawing a
                                step's rows at once, each from its own sequence's RNG, so the
                                tokens do not depend on it (0: eg_num_threads(), at most 16) */
    const int *stage_ends;   /* pipeline: end layer of each stage (ascending, last = L); NULL = one stage */
    const int *stage_cuts;   /* [n_stages] or NULL: > 0 splits stage k's last layer at that routed
                                expert (forward.h tail_cut): stage k + 1 starts with the same
                                layer's experts [cut, E) (head_cut); 0 = whole layers */
    int n_stages;
    /* Pipeline execution. With stage_backends (one backend per stage, [n_stages]; the
     * `be` argument is then unused) every stage runs on its own thread and
     * micro_batches groups of slots are in flight at once (default and minimum:
     * n_stages), so every stage stays busy. Without, stages run one after another on
     * the calling thread (same results, no overlap). */
    eg_backend *const *stage_backends;
    int micro_batches;
    const char *transport;   /* hand-over between stages: "local", "nccl" or NULL/"auto"
                                (transport.h) */
    eg_kv_policy kv_policy;
    int64_t kv_watermark;    /* on-demand: blocks left free after an admission (0 = 1% of the
                                pool, at least 1); not required when nothing else is live */
    int64_t host_kv_bytes;   /* on-demand: host memory for swapped-out caches (pinned where
                                CUDA is present); 0 = none: every victim is recomputed */
    int capture_bf16;        /* keep captured rows as BF16 (eg_result.aux_bf16/final_bf16):
                                half the host memory; the rounding a BF16 shard does anyway */
    int check_recompute;     /* tests: compare recomputed rows with the rows captured before
                                (bit for bit) and fail on a difference, instead of skipping them */
    struct eg_ep_group *ep;  /* expert-parallel group (collective.h) this engine is rank ep_rank
                                of: its own slots and cache, the routed experts over the group.
                                Without stage_backends every stage calls this group (layers
                                numbered 0..L-1, the stages one after another on one thread).
                                With stage_cuts the group(s) must split the same layers at the
                                same experts (collective.h layer_cuts; ep_runtime.c builds them so) */
    struct eg_ep_group *const *ep_stages; /* [n_stages] with ep and stage_backends (required
                                then): stage k's group, the ranks' stage-k backends; stage k's
                                thread makes its calls there and leaves it (eg_engine_ep_leave) */
    int ep_rank;
    eg_ep_split ep_split;    /* read by eg_ep_runtime_create (it builds the group); the
                                engine itself ignores it */
    /* Speculative decoding (docs/ENGINE.md "Speculative decoding"): with a drafter
     * (borrowed; NULL = off) each generating sequence proposes up to draft_tokens (k >= 1)
     * tokens per step, verified by the target in one k + 1-row chunk and accepted by
     * spec.h's rule. With stage_backends the drafter runs on the driving thread as each
     * micro-batch leaves the last stage; with ep each rank's engine needs a drafter of its
     * own (ep_runtime.h). The drafter's aux layers must be among aux_layers; max_tokens >=
     * k + 1. */
    eg_drafter *drafter;
    int draft_tokens;
    eg_spec_rule spec_rule;  /* EG_SPEC_EXACT; tests set EG_SPEC_BROKEN_ACCEPT */
    int spec_probs;          /* sampled verify chunks: who computes p(draft) for the
                                acceptance tests. 0: the last stage's backend where it
                                offers token_probs and is not the CPU backend (a GPU then
                                sorts no row for them; the host sorts only a rejection's
                                row and the bonus row), else the host; 1: the backend
                                whenever it offers them (tests: the CPU backend's are the
                                host's numbers, so the tokens are the same); -1: the host */
} eg_engine_opts;

/* Return 1 and fill req when a request is available, 0 when there are no more,
 * EG_NEXT_LATER (2) when there is one but not for this engine now (it asks again at its
 * next admission: an expert-parallel group admits to its least-loaded rank), negative on
 * error (err filled). The request's arrays need only live until the call
 * returns to the engine's next admission (they are copied). */
typedef int (*eg_next_fn)(void *ctx, eg_request *req, eg_error *err);
#define EG_NEXT_LATER 2
typedef eg_status (*eg_done_fn)(void *ctx, const eg_result *res, eg_error *err);

typedef struct eg_engine_stats {
    int64_t steps;
    int64_t prefill_tokens;  /* prompt / teacher-forced rows processed */
    int64_t decode_tokens;   /* generated tokens */
    int64_t sequences;
    double seconds;          /* wall time with at least one step in flight */
    int max_in_flight;       /* most micro-batches in flight at once */
    int64_t stage_steps[8];  /* steps run by stages 0..7 (pipeline accounting) */
    /* KV scheduling */
    int64_t preemptions;     /* sequences preempted (swapped out or dropped for recompute) */
    int64_t swap_outs, swap_ins;
    int64_t swap_bytes;      /* cache bytes copied to host */
    int64_t recomputed_tokens; /* rows run again to rebuild dropped caches */
    int64_t drains;          /* times launching paused for the pipeline to empty */
    double sum_concurrency;  /* over steps: live sequences in slots when the step launched */
    int peak_concurrency;
    int64_t backlog_steps;   /* steps launched while requests (or preempted sequences) waited
                                for room: the cache, not the workload, bounded concurrency */
    double backlog_concurrency; /* sum of live sequences over those steps */
    double sum_kv_live;      /* over steps: blocks holding cached tokens / pool blocks */
    int64_t host_kv_peak;    /* most host bytes allocated for swapped-out caches (page-locked
                                where CUDA is present, kept for the next swap; within
                                opts.host_kv_bytes) */
    int64_t buffer_sets;     /* sequence buffer sets created (captured rows, tokens, drafts):
                                one per slot at most, preempting or not, since a preempted
                                sequence takes its set and leaves the slot a spare one */
    /* speculative decoding (opts.drafter) */
    int64_t verify_steps;    /* per-sequence verify steps (a sequence's k + 1-row chunk) */
    int64_t drafted;         /* draft tokens proposed */
    int64_t accepted;        /* of them accepted and committed (none after a stop token among
                                them; accepted / verify_steps: mean accepted per step) */
    int64_t spec_tokens;     /* tokens committed by verify steps (accepted + correction/bonus,
                                less any cut after a stop token) */
    int64_t logit_rows;      /* rows of V logits the host took for its draws (kept logits,
                                or a drafter's steps with a sampled row: an all-greedy
                                step takes the backend's argmaxes instead) */
    int64_t backend_draws;   /* tokens a deferred step drew on the backend (bonus and plain
                                rows: engine.c host_draws) */
    int64_t backend_residuals; /* rejected drafts of a deferred step whose residual was drawn
                                from the kept set the backend gave (backend.h kept_probs),
                                without taking the row to the host */
    int64_t draft_kept, draft_argmax, draft_host_rows; /* the drafter's draws (drafter.h
                                eg_drafter_draws): from its backend's kept sets, by its
                                argmax, from rows taken to the host */
    int64_t draft_no_q;      /* sampled drafts their own proposal row gives no probability (a
                                drafter whose logits row was not finite: spec.h eg_spec_no_q),
                                tested as deterministic proposals, which is exact */
    int64_t backend_probs;   /* sampled verify rows whose p(draft) came from the backend
                                (opts.spec_probs; the host sorts such a row only when its
                                draft is rejected, for the residual, and the backend
                                gives no kept set for it) */
    double draft_seconds;    /* in the drafter (extend, propose, truncate) */
    double verify_seconds;   /* target steps that verified drafts, and the acceptance rule
                                (threaded pipeline stages: the wall time while a micro-batch
                                with verify rows is in the pipeline, which drafting overlaps,
                                plus the rule's time outside it) */
} eg_engine_stats;

typedef struct eg_engine eg_engine;

eg_status eg_engine_create(const eg_model *m, eg_backend *be, const eg_engine_opts *o, eg_engine **out, eg_error *err);
void eg_engine_free(eg_engine *e);
/* Run until next() reports no more requests and every slot has finished. A done()
 * error stops the run and is returned. */
eg_status eg_engine_run(eg_engine *e, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err);
/* An expert-parallel rank whose run returned without error: keep serving the group(s)
 * until every rank has left (eg_ep_leave; with ep_stages each stage's thread leaves its
 * own group, stage 0 first, so a stage still serving never waits on a later one). */
eg_status eg_engine_ep_leave(eg_engine *e, eg_error *err);
/* Ask a running engine to stop (e.g. on SIGINT): at the next step boundary it returns
 * EG_ERR_INTERRUPTED; unfinished sequences are abandoned (done() is not called for
 * them). Safe from a signal handler. */
void eg_engine_request_stop(eg_engine *e);
/* The engine's counters: from the thread that runs it, or once it has returned. */
void eg_engine_get_stats(const eg_engine *e, eg_engine_stats *s);
/* From any thread, also while another runs the engine: the counters as published at the
 * start of each pass of its run loop (at most one step behind) and at the run's end. */
void eg_engine_get_stats_shared(eg_engine *e, eg_engine_stats *s);
/* Recorded-replay counts summed over the stages (forward.h); call when no run is active. */
void eg_engine_graph_stats(const eg_engine *e, eg_forward_graph_stats *out);
/* The transport between stages ("local", "nccl"; "none" for one stage). */
const char *eg_engine_transport(const eg_engine *e);
/* The KV capacity in tokens (stage 0's cache). */
int64_t eg_engine_kv_capacity(const eg_engine *e);
/* The admission watermark in blocks (on-demand policy). */
int64_t eg_engine_kv_watermark(const eg_engine *e);
/* Bytes of weights the engine's stages hold on their backends (eg_forward_weight_bytes
 * summed): with an expert-parallel group, this rank's share. */
int64_t eg_engine_weight_bytes(const eg_engine *e);

#endif
