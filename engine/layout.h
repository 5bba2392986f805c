/* layout.h — which multi-GPU layouts a model can run on a box, and a roofline model of
 * each (`eaglegen plan --gpus N`, `generate --layout auto`, docs/perf_model.py).
 *
 * A layout is P pipeline stages x an expert-parallel group of E GPUs (P * E = GPUs):
 * inside a group attention is data-parallel (each GPU holds the cache of its own
 * sequences: the cache is held once), the routed experts are split E ways, and the
 * dense parts are (dense_split) replicated in the group ("ep8"), or "+ffn": the shared
 * expert of each MoE layer and the dense MLP of each dense layer owned whole by rank
 * (l mod E) of the group, which computes it for all the group's rows (each token's FP32
 * normed row goes there and the FP32 output row comes back: exact, the same op on the
 * same row), or "+split": +ffn and the embedding and lm_head vocab-split over the group
 * (each rank holds V / E rows; the embedding row comes from the id's range owner, each
 * rank computes its vocab slice of the logits for every group row and the slices are
 * gathered at the token's owner; modelled only). P = GPUs, E = 1 is the pipeline; tensor parallelism
 * over every GPU (weights split, the latent cache copied onto every GPU) is modelled
 * for comparison only: eaglegen does not run it.
 *
 * Per GPU and step the model counts bytes read (weights of the experts the step hits,
 * the always-read weights, the BF16 cache) and FLOPs (2 per multiply-add, times 2 for
 * eaglegen's BF16 hi + lo activations), times each part as max(bytes / (HBM * eff),
 * FLOPs / (tensor rate * eff)), and adds the collectives: per MoE layer each token's
 * FP32 row goes to the other GPUs that own one of its K experts and its K weighted
 * expert outputs come back (FP32, one row per remote expert, so the owner adds them
 * in the unsplit order), each collective costing the link's latency plus bytes over
 * its per-GPU bandwidth; communication is not overlapped with compute. +ffn: per layer
 * the owner receives the (E - 1)/E of the group's rows that live elsewhere and sends their
 * outputs back (its link is the bottleneck), riding the MoE layer's exchange (no extra
 * latency) or, on a dense layer, in an exchange of its own; the layer waits for the owner,
 * which reads the whole FFN and computes it for every group row (per layer the slowest
 * rank: the stage's step charges every layer's FFN bytes and group-wide FLOPs), while its
 * weights sit on one rank (memory: each rank's own layers, round-robin, exactly). (The CPU ranks'
 * local exchange, engine/collective.c, sends a row per remote (token, expert) pair
 * rather than per remote GPU; the NCCL exchange, engine/collective_cuda.c, sends one per
 * owning GPU, as counted here, plus the pairs' metadata.) Micro-batches:
 * a pipeline of P stages keeps P micro-batches in flight, each with 1/P of the
 * sequences, and every stage reads the experts each micro-batch hits. Experts hit by
 * B tokens per MoE layer: E (1 - (1 - K/E)^B) (uniform routing). docs/perf_model.py
 * is the same model in Python; tests/t_plan_layouts.sh checks they agree.
 * Thread safety: pure functions. */
#ifndef EG_LAYOUT_H
#define EG_LAYOUT_H

#include "engine/config.h"

typedef struct eg_box {
    char name[48];
    int gpus;
    double mem_gb;      /* memory per GPU, GB (1e9) */
    double frac;        /* share of it usable (0.92) */
    double act_gb;      /* activations + workspace per GPU, GB */
    double hbm_tbs;     /* memory bandwidth per GPU, TB/s */
    double tflops;      /* dense BF16 tensor rate per GPU, TFLOP/s */
    double eff;         /* share of bandwidth and tensor rate the kernels reach (0.6 / 0.85) */
    char link[16];      /* "pcie" or "nvlink" */
    double link_gbs;    /* per-GPU bandwidth of a collective, each direction, GB/s */
    double link_us;     /* latency per collective, microseconds */
} eg_box;

/* "rtx-pro-6000x8" (8 x 96 GB, 1.8 TB/s, 500 TFLOP/s, PCIe 25 GB/s + 30 us) or
 * "h200x8" (8 x 141 GB, 4.8 TB/s, 990 TFLOP/s, NVLink 450 GB/s + 10 us); eff 0.6. */
eg_status eg_box_preset(const char *name, eg_box *out, eg_error *err);
/* Link figures of "pcie" (25 GB/s, 30 us) or "nvlink" (450 GB/s, 10 us). */
eg_status eg_box_link(const char *link, eg_box *box, eg_error *err);

typedef enum eg_layout_kind { EG_LAYOUT_PP_EP = 0, EG_LAYOUT_TP } eg_layout_kind;

/* What of the dense parts an EP group splits (see the top of this file). */
typedef enum eg_dense_split {
    EG_SPLIT_NONE = 0, /* replicated on every rank of the group */
    EG_SPLIT_FFN,      /* "+ffn": shared expert / dense MLP of layer l whole on rank l mod E */
    EG_SPLIT_ALL       /* "+split": +ffn, and the embedding and lm_head vocab-split */
} eg_dense_split;

/* "none", "ffn" or "all" (plan --json's dense_split). */
const char *eg_dense_split_name(eg_dense_split s);
/* Whether eaglegen runs a split on `backend` ("cpu", "cuda"; NULL: plan's view of a GPU
 * box). Every split runs on CPU ranks and on CUDA ranks today; THE one place that decides
 * it: plan's runnable column, the recommendations, generate --layout. */
int eg_layout_split_runnable(eg_dense_split s, const char *backend);

typedef struct eg_layout {
    eg_layout_kind kind;
    int stages;         /* P */
    int ep;             /* E: expert-parallel group size (1 = none) */
    eg_dense_split dense_split; /* what of the dense parts the group splits (NONE when ep = 1) */
} eg_layout;

/* Whether eaglegen runs the layout as it is modelled on `backend` (NULL: plan's view of a
 * GPU box): tensor parallel never (modelled for comparison); the others as
 * eg_layout_split_runnable says. ppPxepE (P, E > 1) runs as stage groups (ep_runtime.h):
 * rank r's stage k on GPU k*E + r, P x E GPUs, as the model counts them. */
int eg_layout_runnable(const eg_layout *lay, const char *backend);

typedef struct eg_layout_row {
    eg_layout lay;
    char name[48];        /* "pp8", "ep8", "ep8+ffn", "ep8+split", "pp2xep4+ffn", "tp8" */
    int runnable;         /* eaglegen runs it (tensor parallel and the vocab split are modelled only) */
    int fits;             /* weights fit with room for at least one sequence's cache */
    double weights_gb;    /* per GPU, the heaviest */
    int64_t kv_tokens;    /* token slots box-wide (distinct tokens; a copy counts once) */
    double concurrency;   /* sequences at the mean length (on-demand KV, 1% watermark), at most
                             the opts' max_seqs / max_seqs_per_rank */
    double decode_tok_s;
    double prefill_tok_s; /* capture mode: teacher-forced prefill, prefill_chunk rows per GPU per step */
    double decode_step_ms, comm_ms; /* decode: slowest stage's step; its collectives */
    double comm_bytes_token_layer;  /* bytes one token sends + receives per MoE layer (EP) */
    const char *decode_bound, *prefill_bound; /* "hbm", "compute" or "link" */
    double draft_ms;      /* speculative decoding: the drafter's share of decode_step_ms */
} eg_layout_row;

/* The mean sequence length plan and generate --layout auto model by default (tokens,
 * prompt + response; auto takes at most --max-seq-len). */
#define EG_LAYOUT_MEAN_LEN 4096

typedef struct eg_layout_opts {
    double mean_len;       /* tokens per sequence, prompt + response (cache held) */
    int prefill_chunk;     /* prefill rows per GPU per step (0 = 8192) */
    double watermark;      /* share of the pool kept free (0 = 0.01) */
    /* Speculative decoding (generate --draft-model): k drafted tokens per sequence and
     * step, verified in one target pass of k + 1 rows that commits `accept` tokens on
     * average (accepted drafts + the correction/bonus token, 1 <= accept <= k + 1; generate
     * --draft-model reports it). 0 = plain decode. The drafter is modelled as an EAGLE-3 layer of the
     * target's hidden size (eg_layout_drafter_bytes), replicated on every GPU, run k times
     * per step on the GPU's own sequences, not overlapped. */
    int draft_tokens;
    double accept;
    /* The drafter's cache per token (bytes; 0 = the modelled drafter's, 32,768 on Kimi-K2.5:
     * 64 kv heads of 128). A GQA drafter of 8 kv heads caches 4,096, an MLA drafter
     * (lightseekorg/kimi-k2.5-eagle3-mla: kv_lora 512 + rope 64) 1,152. */
    double draft_cache_bytes;
    /* The drafter's weights on a GPU (bytes; 0 = the modelled drafter's): what it reads per
     * draft step and holds beside the pool (the embedding stays on the host). */
    double draft_weight_bytes;
    /* 1: every stage holds whole layers (generate --whole-layers). 0: a pipeline's stages may
     * end inside a MoE layer (--stages N on planned GPUs; runtime.c balance_stages): the
     * pool is eg_plan_split_kv's over a rank's units (1/E of each routed expert; with +ffn
     * each shared expert / dense MLP on its owner, a stage counting its heaviest rank; 1/E
     * of the vocabulary with +split), where that holds
     * more than whole layers; the step times are then that split's stages' (a layer split
     * between two stages: its attention and experts [0, cut) on one, the rest and its shared
     * expert on the other, the hand-over 3H + 2K floats a row). */
    int whole_layers;
    /* Sequences in flight at most, as generate runs them (0 = as many as the cache holds):
     * max_seqs box-wide (--batch N), max_seqs_per_rank per expert-parallel rank (--batch
     * auto takes at most --chunk slots per rank). Concurrency is the least of these. */
    int max_seqs, max_seqs_per_rank;
} eg_layout_opts;

/* The modelled EAGLE-3 drafter, shaped as the public Kimi-K2.5 drafters (SpecForge's
 * kimi-k25-eagle3 config, AQ-MedAI/Kimi-K25-eagle3, lightseekorg/kimi-k2.5-eagle3): one
 * Llama decoder layer of width H = the target's hidden size with the target's head count
 * of heads of 128 and as many KV heads (no GQA), q/k/v over 2H inputs, fc over 3 aux
 * states, the target's dense MLP width, a 32,000-id draft lm_head, BF16 (the embedding is
 * the target's). Weights in bytes; *kv_token = its BF16 cache per token (held per token
 * of the KV pool: the drafter's cache is paged like the target's). */
double eg_layout_drafter_bytes(const eg_config *c, double *kv_token);

/* Room eg_layout_enumerate needs for a box of `gpus` GPUs. */
int eg_layout_max_rows(int gpus);
/* Every layout of box->gpus GPUs for the config, in a fixed order: for each P dividing
 * the GPU count (largest P first), E = GPUs / P, then (when E > 1) "+ffn" and "+split";
 * then tensor parallel. E must divide the expert count (E > 1 needs routed experts) and
 * P must not exceed the layer count (others are left out). rows has room for max_rows; returns the
 * number written, or -1 with err set. */
int eg_layout_enumerate(const eg_config *c, const eg_box *box, const eg_layout_opts *o, eg_layout_row *rows,
                        int max_rows, eg_error *err);
/* The model of one layout. Prefill models capture mode, which runs without a drafter: its
 * figures ignore draft_tokens (the plain row's). */
eg_status eg_layout_model(const eg_config *c, const eg_box *box, const eg_layout_opts *o, const eg_layout *lay,
                          eg_layout_row *row, eg_error *err);
/* The recommended row for decode (prefill = 0) or capture-mode prefill (1): the
 * fastest runnable row that fits; -1 if none. */
int eg_layout_recommend(const eg_layout_row *rows, int n, int prefill);
/* "pp8", "ep8", "pp2xep4", "ep8+ffn", "pp2xep4+split", ... parsed into a layout ("auto" is
 * the caller's). */
eg_status eg_layout_parse(const char *s, int gpus, eg_layout *out, eg_error *err);

#endif
