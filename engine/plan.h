/* plan.h — splitting the layers into pipeline stages and sizing each stage's memory.
 *
 * A stage is a contiguous layer range on one GPU: the first also holds the embedding,
 * the last the final norm and lm_head. eg_plan_split balances stages by bytes (each
 * layer's weights plus its share of the KV cache for a token budget), minimising the
 * largest stage. eg_plan_memory then gives each stage its KV capacity in tokens from
 * the device memory left after weights and activations. Per-layer bytes come from a
 * loaded model (exact, as stored) or from the config alone (for presets too large to
 * write). The cache is BF16: (kv_lora_rank + qk_rope_head_dim) * 2 bytes per token and
 * layer.
 * Thread safety: pure functions. */
#ifndef EG_PLAN_H
#define EG_PLAN_H

#include "engine/weights.h"

/* Bytes of layer l's weights as stored in a loaded model. */
int64_t eg_plan_layer_bytes(const eg_model *m, int layer);
/* Bytes of a layer split between two stages at expert cut (forward.h tail_cut/head_cut),
 * on one side: side 0 everything but the routed experts [cut, E) and the shared expert
 * (the stage that runs its attention), side 1 those. The sides sum to eg_plan_layer_bytes. */
int64_t eg_plan_split_layer_bytes(const eg_model *m, int layer, int cut, int side);
/* Bytes of the embedding (stage 0) and of final norm + lm_head (last stage) over n_stages
 * stages: a tied head (eg_model_head_tied) shares the embedding's bytes on one stage, and is
 * the last stage's own copy with more. */
int64_t eg_plan_head_bytes(const eg_model *m, int n_stages, int64_t *tail);
/* The same from the config alone: BF16 dense weights, experts as the config's format
 * says (INT4: 0.5 byte per weight + a BF16 scale per group; FP8: 1 byte + F32 per 128x128). */
int64_t eg_plan_layer_bytes_cfg(const eg_config *c, int layer);
/* eg_plan_head_bytes from the config alone (tie_word_embeddings means no stored head). */
int64_t eg_plan_head_bytes_cfg(const eg_config *c, int n_stages, int64_t *tail);
/* Parts of a layer from the config: its two norms and attention (BF16), and one routed
 * expert (gate, up, down in the config's expert format). */
int64_t eg_plan_attn_bytes_cfg(const eg_config *c);
int64_t eg_plan_expert_bytes_cfg(const eg_config *c);
/* BF16 latent cache bytes per token per layer. */
int64_t eg_plan_kv_bytes_per_token_layer(const eg_config *c);

/* Split L layers into n stages minimising the largest stage cost. cost[l] is layer l's
 * cost; first/last add to stage 0 / stage n-1. ends[i] = end layer (exclusive) of stage i. */
eg_status eg_plan_split(const double *cost, int L, double first, double last, int n, int *ends, eg_error *err);

/* A split that may end a stage inside a MoE layer (engine.h stage_cuts), chosen for the
 * largest common KV pool. Per layer: attn its bytes besides the routed and shared experts
 * (norms, attention, router, or a dense MLP), expert one routed expert's bytes and
 * n_experts their count (0 for a dense layer), shared the shared expert's bytes.
 * owner (an expert-parallel group with its dense parts split, --ep-split ffn/all): 1 + the
 * rank that alone holds the layer's FFN, `shared`, which for a dense layer is then its MLP
 * (no longer in attn); 0 (the default): every rank holds `shared`. A stage's bytes are
 * then its heaviest rank's: every rank's common bytes plus the FFNs that rank owns there
 * (a dense layer's MLP on rank 0 of a group decides where stage 0 ends). */
typedef struct eg_plan_layer_parts {
    int64_t attn, expert, shared;
    int n_experts;
    int owner;
} eg_plan_layer_parts;
/* parts[l] from a loaded model (exact bytes; every routed expert of a layer the same size),
 * or from the config alone (eg_plan_layer_bytes_cfg's parts). */
void eg_plan_layer_parts_of(const eg_model *m, int layer, eg_plan_layer_parts *out);
void eg_plan_layer_parts_cfg(const eg_config *c, int layer, eg_plan_layer_parts *out);
/* Split L layers into n stages for the largest X such that every stage k fits
 *   budget[k] >= its weights + X * (kv_per_token_layer * the layers whose attention it runs
 *                                   + (k == n - 1 ? extra_last_per_token : 0)),
 * budget[k] being what its device holds for weights and cache (with the embedding and head
 * already taken off stage 0 and the last). A stage ends at a layer boundary or, with
 * allow_cuts, inside a MoE layer between experts c-1 and c (cuts[k] = c, 0 < c < E; the
 * next stage then holds experts [c, E), the shared expert, and at least the next layer's
 * attention). ends/cuts: [n]; *tokens: X. EG_ERR_NOMEM (the message says so) when even X
 * = 0 does not fit, or the layers cannot fill n stages. A binary search over X; per X, the
 * units where each stage may begin, stage by stage (exact: budgets differ per stage, which
 * a greedy fill gets wrong; engine_ops.plan_split_kv checks it against a brute force). */
eg_status eg_plan_split_kv(const eg_plan_layer_parts *parts, int L, const int64_t *budget, int n,
                           int64_t kv_per_token_layer, int64_t extra_last_per_token, int allow_cuts, int *ends,
                           int *cuts, int64_t *tokens, eg_error *err);
/* X of a given split (ends, cuts as above; cuts NULL = whole layers): min over stages of
 * (budget - weights) / per-token bytes; -1 when some stage's weights do not fit. */
int64_t eg_plan_split_kv_tokens(const eg_plan_layer_parts *parts, int L, const int64_t *budget, int n,
                                int64_t kv_per_token_layer, int64_t extra_last_per_token, const int *ends,
                                const int *cuts);

typedef struct eg_stage_mem {
    int begin, end;          /* layers [begin, end) */
    int64_t weight_bytes;
    int64_t kv_bytes_per_token;
    int64_t free_bytes;      /* device memory usable: mem * fraction - weights - activations */
    int64_t kv_tokens;       /* capacity in tokens */
} eg_stage_mem;

/* Fill stages [n] from per-layer bytes and the split. device_bytes: each GPU's memory;
 * fraction: share usable (e.g. 0.92); act_bytes: activations/workspace per GPU. */
void eg_plan_memory(const eg_config *c, const int64_t *layer_bytes, int64_t head, int64_t tail, const int *ends, int n,
                    int64_t device_bytes, double fraction, int64_t act_bytes, eg_stage_mem *stages);

/* Roofline accounting for benchmarks (docs/PERFORMANCE.md): what one step must read
 * and compute over layers [l0, l1) of a loaded model (the embedding rows when l0 == 0,
 * final norm and lm_head when l1 == L). Weight bytes are as stored (INT4 with scales);
 * FLOPs count 2 per multiply-add with every weight format as one element. */
typedef struct eg_step_cost {
    double weight_bytes;  /* every weight the step reads: attention, norms, dense/shared MLPs,
                             router, head, and the routed experts expected to be hit */
    double expert_bytes;  /* of which routed experts */
    double kv_bytes;      /* BF16 cache read by attention */
    double experts_hit;   /* expected distinct routed experts per MoE layer */
    double flops;
} eg_step_cost;
/* A decode step: B sequences, one new token each, attending over ctx cached positions
 * plus itself (absorbed MLA: scores over C+DR, values over C, per head). Experts hit
 * per MoE layer: E(1 - (1 - K/E)^B), the expectation under uniform independent
 * routing (random weights route near-uniformly; real traffic is skewed, hitting fewer). */
void eg_plan_decode_cost(const eg_model *m, int l0, int l1, int B, int ctx, eg_step_cost *out);
/* Prefill of n_seq sequences of P tokens from an empty cache, logits for each
 * sequence's last token; attention counted in the expanded (MHA) form over the causal
 * half, (P+1)/2 keys per query on average. */
void eg_plan_prefill_cost(const eg_model *m, int l0, int l1, int n_seq, int P, eg_step_cost *out);

/* ---- KV scheduling estimates ---------------------------------------------------------- */

/* Host bytes a sequence of n_tokens holds while in flight in `generate`: its captured
 * rows (n_capture aux layers + the final hidden, elem_bytes each: 2 for BF16) and its
 * token ids. */
int64_t eg_plan_seq_host_bytes(const eg_config *c, int n_capture, int64_t n_tokens, int elem_bytes);
/* `--batch auto`: as many slots as the pool holds sequences of min(max_seq_len, 256)
 * tokens, as half of ram_bytes holds sequences at max length (seq_host_bytes each), at
 * most max_slots (the step's row budget, one decode row per slot); at least 1. */
int eg_plan_auto_slots(int64_t pool_tokens, int max_seq_len, int max_slots, int64_t ram_bytes, int64_t seq_host_bytes);
/* A response-length workload "lognormal:MEDIAN:SIGMA" (tokens; SIGMA the log-space
 * standard deviation). */
eg_status eg_plan_workload_parse(const char *spec, double *median, double *sigma, eg_error *err);
/* E[min(X, cut)] for X lognormal(log median, sigma): the mean response length when
 * responses stop at max_new = cut. */
double eg_plan_lognormal_mean_cut(double median, double sigma, double cut);
/* Concurrent sequences a pool of pool_tokens holds: on demand, sequences of mean_len
 * tokens (prompt + expected response) with `watermark` of the pool kept free;
 * reserved, sequences of prompt + max_new tokens each. */
double eg_plan_concurrency_on_demand(int64_t pool_tokens, double mean_len, double watermark);
double eg_plan_concurrency_reserve(int64_t pool_tokens, int64_t prompt_len, int64_t max_new);

#endif
