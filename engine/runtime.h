/* runtime.h — the one assembly of an engine run, shared by every command that runs the
 * model (generate, bench's workload mode, forward): from options to the model, the
 * backend(s), the memory plan and the engine(s) — one engine, a pipeline of stages
 * (one backend and thread per stage, or stages one after another on one backend), or
 * expert-parallel ranks (ep_runtime.h), each possibly with stages.
 *
 * eg_runtime_create decides, in this order (what gen/ printed before, unchanged): the
 * stage split (--stages N balanced by weight bytes, or explicit end layers), on CUDA
 * with gpu_mem_fraction > 0 the per-GPU memory plan (engine/cuda_plan.h; each GPU's
 * line goes to opts.note as it is planned, so a later refusal still shows it), the KV
 * pool (the plan, capped by kv_tokens), the slot count (n_slots 0: --batch auto,
 * eg_plan_auto_slots), the check that the pool holds one sequence of max_seq_len, the
 * host budget for preempted caches, then backends and engines (with draft_model: a
 * one-slot probe of the drafter first, for its bytes in the plan; then one drafter per
 * engine, per rank with ep). eg_runtime_describe says
 * what was chosen, for gen/ to print in its own words.
 * Errors are values naming the option at fault; nothing here prints or exits.
 * Ownership: the runtime owns its backends and engines, and the model when it loaded
 * it (opts.model_dir); a borrowed opts.model must outlive it. The option arrays
 * (aux_layers, stage_ends, stage_cuts) are copied. eg_runtime_free accepts NULL.
 * Thread safety: one thread creates, runs and frees a runtime; eg_runtime_request_stop
 * is safe from a signal handler; eg_runtime_stats may be called from next()/done(). */
#ifndef EG_RUNTIME_H
#define EG_RUNTIME_H

#include "engine/engine.h"

typedef void (*eg_runtime_note_fn)(void *ctx, const char *line);

typedef struct eg_runtime_opts {
    /* the model: borrowed when set, else loaded from model_dir (and owned) */
    const eg_model *model;
    const char *model_dir;
    /* backends */
    const char *backend;        /* "cpu" (NULL = cpu) or "cuda" */
    int threads;                /* CPU threads in all, split over stages or ranks; 0 = eg_num_threads() */
    int device;                 /* cuda: first GPU (stage k on device + k, or + k % gpus) */
    int gpus;                   /* cuda: stage k on GPU k mod gpus; 0 = one GPU per stage */
    double gpu_mem_fraction;    /* cuda: plan the KV pool from this share of each GPU's memory;
                                   0 = no plan (the pool is kv_tokens, or the engine's default) */
    /* layout */
    const char *stages;         /* "N" (balanced by bytes) or "e0,e1,...,L", an end as END:CUT to
                                   split layer END-1 between two stages; NULL = one stage */
    const int *stage_ends;      /* instead of stages: [n_stages] end layers, passed as given */
    const int *stage_cuts;      /* with stage_ends: [n_stages] 0 or a layer split (engine.h), or NULL */
    int whole_layers;           /* "N" on planned GPUs: keep the byte-balanced whole-layer split
                                   (else layers may be split for the largest KV pool) */
    int n_stages;
    int stage_threads;          /* 1: a backend and a thread per stage (generate); 0: stages one
                                   after another on one backend (forward) */
    int micro_batches;          /* with stage_threads (0 = the stage count) */
    const char *transport;      /* "local", "nccl", NULL/"auto" (transport.h) */
    int ep;                     /* expert-parallel ranks; 0 or 1 = none */
    eg_ep_split ep_split;       /* with ep > 1: EG_EP_SPLIT_FFN puts each layer's shared expert /
                                   dense MLP on one rank (ep_runtime.h; cpu and cuda ranks);
                                   EG_EP_SPLIT_ALL also splits the embedding and lm_head by
                                   vocab rows (cpu and cuda ranks); needs ep > 1 */
    /* batch */
    int n_slots;                /* concurrent sequences; 0 = auto (eg_plan_auto_slots) */
    int max_seq_len;
    int max_tokens;             /* rows per step; also caps n_slots 0 (auto) */
    int block_size;             /* cache block tokens; 0 = 64 */
    /* KV cache */
    eg_kv_policy kv_policy;
    int64_t kv_tokens;          /* cap on the pool in tokens; 0 = none */
    int64_t host_kv_bytes;      /* host memory for preempted caches; < 0 = a quarter of ram_bytes */
    int64_t ram_bytes;          /* host memory available (for auto slots and host_kv_bytes < 0) */
    /* capture (eg_engine_opts) */
    const int *aux_layers;      /* [n_aux] */
    int n_aux;
    int final_pre_norm, final_both, want_logits, capture_bf16, check_recompute;
    /* speculative decoding (engine.h, drafter.h): an EAGLE-3 drafter checkpoint, loaded for
       the slot count chosen here and owned by the runtime; NULL = none */
    const char *draft_model;
    eg_drafter *drafter;        /* instead of draft_model: a proposer the caller made (borrowed,
                                   e.g. drafter_replay.h), holding at least n_slots slots; one
                                   engine (no --ep ranks) */
    int draft_tokens;           /* K drafted tokens per verify step (>= 1 with a drafter) */
    /* tests: plan the GPUs as if each had plan_total_bytes of memory, plan_free_bytes free,
       instead of asking the device (0 = ask) */
    int64_t plan_total_bytes, plan_free_bytes;
    /* forward only (bench's prefill and decode rows, runtime_bench.h): one backend and one
       eg_forward (eg_runtime_forward), no engine; n_slots > 0, no stages, ranks or drafter, and
       the pool is not checked against max_seq_len (the caller maps the blocks it needs) */
    int forward_only;
    int random_weights;         /* forward only: every weight drawn on the backend (eg_forward_opts) */
    uint64_t random_seed;
    /* what was decided, one line at a time, as it is decided (e.g. each GPU's memory
       plan); NULL = none */
    eg_runtime_note_fn note;
    void *note_ctx;
} eg_runtime_opts;

/* What eg_runtime_create chose. Arrays live as long as the runtime. */
typedef struct eg_runtime_info {
    const char *backend;
    int n_slots;                /* the slot count (over every rank) */
    int auto_slots;             /* n_slots was chosen (opts.n_slots == 0) */
    int max_tokens, block_size;
    int64_t kv_blocks;          /* the pool given to the engine(s) (over every rank); 0 = default */
    int64_t kv_capacity;        /* tokens in stage 0's cache (rank 0's with ep) */
    int64_t kv_capacity_all;    /* summed over the ranks */
    int64_t kv_watermark;       /* admission watermark in blocks (rank 0's) */
    int64_t host_kv_bytes;      /* the host budget for preempted caches */
    int64_t seq_host_bytes;     /* host bytes of one in-flight sequence at max_seq_len (captured
                                   rows in BF16 with capture_bf16, else F32, and its tokens) */
    int n_stages;               /* 1 = no split */
    const int *stage_ends;      /* [n_stages] */
    const int *stage_cuts;      /* [n_stages] 0, or the routed expert stage k's last layer is split
                                   at (the next stage runs experts [cut, E) of that layer) */
    const int *stage_device;    /* [n_stages] GPU (cuda) or stage thread (cpu) */
    const int64_t *stage_weight_bytes; /* [n_stages] as stored, with embedding / head */
    const char *transport;      /* between stages ("none" for one stage) */
    int micro_batches;          /* in flight with threaded stages: max(opts, n_stages), at most n_slots */
    int ep;                     /* ranks (1 = none) */
    int ep_groups;              /* 1: stage groups (ep > 1, n_stages > 1: each rank's stage k on a
                                   backend and thread of its own, GPU device + k*ep + r; the
                                   stage's exchange among the ranks' stage-k GPUs); 0: each rank
                                   runs its stages on its one backend */
    int experts_per_rank;
    eg_ep_split ep_split;       /* what the group splits besides the routed experts */
    int64_t draft_state_bytes;  /* the drafters' caches summed over the ranks (0 = no drafter) */
    int64_t draft_weight_bytes; /* one drafter's weights as stored (each rank holds one) */
    int64_t draft_slot_bytes;   /* its fixed state per slot (the FP32 row, the block table's row) */
    int64_t draft_token_bytes;  /* its paged cache per position held (K and V, BF16) */
    int64_t draft_device_bytes; /* cuda plan: what it reserved for the drafter on the GPU of the
                                   last stage (each rank's with ep) besides its cache: weights +
                                   slots * slot bytes; its cache is counted per token of the KV
                                   pool (the plan line's bytes/token). 0 without a plan */
    int n_drafters;             /* 1, or ep with --ep (0 = no drafter) */
    int n_draft_aux;            /* the loaded drafter's aux layers (output-of-layer ids) */
    const int *draft_aux;       /* [n_draft_aux], owned by the drafter; NULL without one */
    const char *draft_aux_source; /* which rule gave them (eg_drafter_eagle3_aux_source) */
} eg_runtime_info;

typedef struct eg_runtime eg_runtime;

eg_status eg_runtime_create(const eg_runtime_opts *o, eg_runtime **out, eg_error *err);
void eg_runtime_free(eg_runtime *rt);
/* Run until next() has no more requests and every sequence has finished (eg_engine_run;
 * with ep, next() and done() are called under one lock by the ranks' threads). */
eg_status eg_runtime_run(eg_runtime *rt, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err);
/* eg_engine_request_stop of the driving engine (rank 0's with ep: the others follow). */
void eg_runtime_request_stop(eg_runtime *rt);
/* Stats of the engine, or summed over the ranks (eg_ep_runtime_stats); zeros for NULL. */
void eg_runtime_stats(const eg_runtime *rt, eg_engine_stats *s);
/* Recorded-replay counts of the engine (rank 0's with ep). */
void eg_runtime_graph_stats(const eg_runtime *rt, eg_forward_graph_stats *gs);
/* ep: (token, expert) pairs and bytes that crossed ranks; zeros without ep. */
void eg_runtime_traffic(const eg_runtime *rt, int64_t *pairs, int64_t *bytes);
const eg_runtime_info *eg_runtime_describe(const eg_runtime *rt);
/* The expert-parallel ranks (ep_runtime.h) for per-rank reports; NULL without ep. */
struct eg_ep_runtime *eg_runtime_ep_ranks(const eg_runtime *rt);
const eg_model *eg_runtime_model(const eg_runtime *rt);
/* The backend of a single-backend runtime (no threaded stages, no ep), else NULL. */
eg_backend *eg_runtime_backend(const eg_runtime *rt);
/* The forward of a forward_only runtime, else NULL. */
eg_forward *eg_runtime_forward(const eg_runtime *rt);

/* --stages text: "N" = N stages balanced by weight bytes (eg_plan_split), or explicit
 * end layers (ascending, the last = L). ends: [L] at least. tail_extra: bytes the last
 * stage holds beside its layers and lm_head (the drafter on its GPU), counted in its share. */
eg_status eg_runtime_parse_stages(const char *stages, const eg_model *m, int64_t tail_extra, int *ends, int *n,
                                  eg_error *err);
/* The syntax of --stages, with no model: "" or comma-separated entries END or END:CUT,
 * decimal digits only, both >= 1 (at most 1 << 20). Fills ends[i] and cuts[i] (0 for an
 * END alone) when not NULL, up to cap entries. Returns the entry count, or -1 for bad
 * syntax or more than cap entries. Ascending ends and the model's layers are checked by
 * eg_runtime_parse_stages_cuts and the engine. */
int eg_runtime_stages_syntax(const char *s, int *ends, int *cuts, int cap);
/* The same, where an end may split its stage's last layer: "END:CUT" runs layer END-1's
 * attention and routed experts [0, CUT) on that stage and its experts [CUT, E), shared
 * expert and residual add on the next (engine.h stage_cuts; a MoE layer, not the last
 * stage's). cuts: [L] at least, 0 for a whole-layer end; NULL refuses the syntax. */
eg_status eg_runtime_parse_stages_cuts(const char *stages, const eg_model *m, int64_t tail_extra, int *ends, int *cuts,
                                       int *n, eg_error *err);

/* --layout: an explicit "ppP", "epE", "ppPxepE", "epE+ffn" / "ppPxepE+ffn" or "epE+split" /
 * "ppPxepE+split", or "auto":
 * the layout engine/layout.h recommends for the box preset `box` and the config in
 * model_dir, for decode (or prefill with `prefill`) as generate runs it: mean sequence
 * length mean_len, prefill chunk `chunk` rows per rank step, at most `batch` sequences in
 * flight (0: --batch auto, up to `chunk` per rank; eg_layout_opts), and no drafter
 * modelled (its acceptance is not known before the run) (pipelines with the layer split --stages N makes on planned GPUs, or
 * whole layers with whole_layers), among the layouts that run as modelled on `backend` (eg_layout_runnable;
 * an explicit one that does not is refused, saying so; ppPxepE runs as stage groups, P x E
 * GPUs on cuda: generate needs that many). Sets *stages and *ep (1 = none) and *ep_split (may be NULL) to
 * the layout's eg_dense_split (EG_SPLIT_FFN: each layer's shared expert / dense MLP on
 * one rank, what generate --ep-split ffn runs; EG_SPLIT_ALL: that and the vocab split,
 * --ep-split all; EG_SPLIT_NONE without a group). With auto, why (may be NULL) gets
 * what was chosen and on what assumptions: "--layout auto: NAME on BOX (modelled N tok/s
 * decode at mean length M, S sequences ...)". */
eg_status eg_runtime_layout(const char *layout, const char *box, const char *model_dir, const char *backend,
                            int prefill, int whole_layers, double mean_len, int chunk, int batch, int *stages, int *ep,
                            int *ep_split, char *why, size_t why_n, eg_error *err);

#endif
