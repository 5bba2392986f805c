/* drafter_eagle3.h — an EAGLE-3 drafter (SpecForge's LlamaForCausalLMEagle3 checkpoint)
 * behind the proposer interface of drafter.h, computed on the CPU by its own code or
 * through a backend's ops (eg_eagle3_opts.backend: "cpu" or "cuda").
 *
 * Checkpoint (DIR): config.json + model.safetensors (or model.safetensors.index.json and
 * its shards), tensor names without a `model.` prefix (or with it: vLLM's parameter names;
 * the decoder layer's `midlayer.*` as
 * SpecForge saves them, or `layers.0.*` as speculators does; speculators' config, the
 * layer's Llama keys nested in transformer_layer_config, is read too, docs/ENGINE.md):
 *   fc.weight                                   [H][n_aux*Ht]  (Ht: target hidden)
 *   midlayer.input_layernorm.weight             [H]   (normalises the token embedding)
 *   midlayer.hidden_norm.weight                 [H]   (normalises the hidden input)
 *   midlayer.self_attn.q_proj.weight            [NH*HD][2H]   input concat(emb, hidden)
 *   midlayer.self_attn.{k,v}_proj.weight        [NKV*HD][2H]
 *   midlayer.self_attn.o_proj.weight            [H][NH*HD]
 *   midlayer.post_attention_layernorm.weight    [H]
 *   midlayer.mlp.{gate,up}_proj.weight          [I][H];  midlayer.mlp.down_proj.weight [H][I]
 *   norm.weight [H];  lm_head.weight [Vd][H];  d2t int64 [Vd] (target = d + d2t[d]);
 *   t2d bool [V];  embed_tokens.weight [V][H] (optional: absent = the target's embedding)
 * BF16, F16 or F32 weights (widened to FP32 per element; FP32 accumulation). The aux
 * layers come from `eagle_config.eagle_aux_hidden_state_layer_ids` (or the same key at the
 * top level) and are converted to eaglegen's convention (output of decoder layer k,
 * 0-based); see eg_aux_convention. speculators' options norm_before_residual,
 * norm_before_fc (input_norm.weight [n_aux*Ht] over the concatenated aux row before fc)
 * and norm_output (the chain's hidden input is the final-normed output) are built, and
 * vLLM's fc_norm (fc_norm.{i}.weight [Ht]: an RMSNorm per aux row before fc, after
 * norm_before_fc when both are on).
 * Anything unsupported (rope_scaling, attention bias, more than one decoder layer, another
 * architecture) is refused naming the key; a sliding-window layer
 * (transformer_layer_config layer_types sliding_attention) attends over its window.
 *
 * MLA drafters (vLLM's Eagle3DeepseekV2ForCausalLM, as TorchSpec's
 * lightseekorg/kimi-k2.5-eagle3-mla): the decoder layer's attention is DeepSeek's MLA over
 * the 2H concat, its keys a DeepSeek model's (q_lora_rank, kv_lora_rank, qk_nope/rope/v head
 * dims, rope_theta and YaRN rope_scaling, read by eg_config_parse), its MLP dense:
 *   midlayer.self_attn.q_a_proj.weight [QL][2H], q_a_layernorm [QL], q_b_proj
 *   [NH*(DN+DR)][QL] (or q_proj [NH*(DN+DR)][2H] without q LoRA);
 *   midlayer.self_attn.kv_a_proj_with_mqa.weight [C+DR][2H], kv_a_layernorm [C],
 *   kv_b_proj [NH*(DN+DV)][C]; o_proj [H][NH*DV]; the rest as above.
 * It runs through the backend's mla_attention op (the target's, YaRN included: the same
 * op the target's layers use) over the drafter's own paged latent cache, (C + DR) BF16
 * values per position, so always on a backend ("cpu" when none is named). Its aux ids count
 * as vLLM counts (hidden-states indices), the only engine that runs this layout.
 *
 * State: a paged BF16 KV cache for K (after RoPE) and V, blocks of BS positions
 * ([BS][NKV][HD] each) that a slot maps as it grows (extend, and propose's k - 1 chained
 * positions) and returns on truncate, from a pool of pool_blocks (eg_eagle3_opts); and
 * per slot the pre-norm output [H] of its last committed position (what the first
 * draft's logits and the chain's first hidden input come from). So the cache holds the
 * positions the slots hold, not max_seq_len per slot: cache_bytes_per_token =
 * 4 * NKV * HD (K and V at 2 bytes each), state_bytes = pool_blocks * BS *
 * cache_bytes_per_token + S * (4 * H + 4 * MB) (the FP32 rows, the block table). Host
 * memory on the own CPU path, backend memory (the GPU's for "cuda") on the backend path,
 * which also holds the uploaded weights there (embeddings stay on the host). A slot that
 * would pass the pool fails its extend or propose with EG_ERR_NOMEM.
 *
 * Ownership: eg_drafter_eagle3_load returns a drafter the caller frees with
 * eg_drafter_free (NULL ok); it borrows `target` (its config and, when the checkpoint has
 * no embed_tokens, its embedding), which must outlive the drafter.
 * Thread safety: one thread drives the drafter (drafter.h); matrix-vector products run
 * on the drafter's own worker pool (or the backend's; a CUDA backend is bound to the
 * driving thread at each call). */
#ifndef EG_DRAFTER_EAGLE3_H
#define EG_DRAFTER_EAGLE3_H

#include "engine/drafter.h"

/* How eagle_aux_hidden_state_layer_ids counts layers. The key is spelled the same by every
 * trainer but counted two ways: SpecForge / SGLang write the output of decoder layer k as
 * k (eaglegen's convention); vLLM / speculators write Hugging Face hidden-states indices,
 * k + 1 (0 would be the embedding output). */
typedef enum eg_aux_convention {
    EG_AUX_CONV_AUTO = 0,        /* config key "eaglegen_aux_convention" when present; else
                                    the ids must be the default set for the target's L
                                    counted one way or the other: [1, L/2-1, L-4]
                                    (deduplicated, as eg_config_default_aux_layers) ->
                                    output-of-layer, the same + 1 ([2, L/2, L-3]) ->
                                    hidden-states index; anything else is refused */
    EG_AUX_CONV_OUTPUT_OF_LAYER, /* id k = output of decoder layer k */
    EG_AUX_CONV_HF_INDEX         /* id i = hidden_states[i] = output of decoder layer i-1 */
} eg_aux_convention;

typedef struct eg_eagle3_opts {
    eg_aux_convention aux_convention;
    int threads; /* worker threads for the products; 0 = eg_num_threads() */
    /* Where the layer runs. NULL or "": the drafter's own CPU code (the reference, one
     * position at a time). "cpu" or "cuda": through the ops of engine/backend.h on a
     * backend of that name the drafter creates and owns (rows of an extend in passes of
     * up to max_rows, the caches and the last rows in backend memory; a draft's [Vd]
     * logits row copied to the host only where backend_draws leaves its draw there);
     * `threads` then sizes the CPU backend's pool. */
    const char *backend;
    int device;   /* CUDA device index for backend "cuda" */
    int max_rows; /* rows per backend pass of an extend; 0 = 64 */
    /* Who reduces a propose pass's logits rows for the draws (backend path). 0: the
     * backend where it offers kept_probs and is not the CPU backend: a greedy row's
     * argmax by its greedy sample, a sampled row's kept set (ids and p, at most
     * EG_KEPT_CAP, d2t monotone) by kept_probs, so no row crosses to the host unless its
     * set is over the cap or unsettled; else every row comes to the host and is sorted
     * there. 1: the backend whenever it offers kept_probs (tests: the CPU backend's are
     * the host's numbers). -1: the host. The drafts, q and RNG states are the same. */
    int backend_draws;
    int kept_cap;      /* tests: the kept-set size asked for (0: EG_KEPT_CAP, at most Vd) */
    /* The paged cache: positions per block (0 = 16) and blocks in the pool (0 = every
     * slot can hold max_seq_len positions: n_slots * ceil(max_seq_len / block_size)). The
     * runtime passes the target's block size and KV pool: the engine keeps a slot's
     * drafter positions within the blocks the target has mapped for it, so the same
     * count never runs out. */
    int block_size;
    int64_t pool_blocks;
} eg_eagle3_opts;

/* Load DIR as a drafter for `target` with state for n_slots slots of max_seq_len
 * positions (defaults: automatic aux convention, all threads). */
eg_status eg_drafter_eagle3_load(const char *dir, const eg_model *target, int n_slots, int max_seq_len,
                                 eg_drafter **out, eg_error *err);
eg_status eg_drafter_eagle3_load_opts(const char *dir, const eg_model *target, int n_slots, int max_seq_len,
                                      const eg_eagle3_opts *opts, eg_drafter **out, eg_error *err);

/* config.json alone (no tensors), as the loader reads it, against the target's config:
 * for checks before loading and the fuzz harness. `what` names the text in messages.
 * out->aux_layers is malloc'd: eg_eagle3_config_free (NULL ok). */
typedef struct eg_eagle3_config {
    int hidden, target_hidden, heads, kv_heads, head_dim, inter, vocab, draft_vocab;
    int n_aux;
    int *aux_layers;        /* [n_aux] eaglegen convention, ascending, < target layers */
    const char *aux_source; /* how the convention was decided (static string) */
    float eps;
    double rope_theta;
    int norm_before_residual;
    int mla;                /* Eagle3DeepseekV2ForCausalLM: kv_lora and qk_rope below; heads and
                               head_dim then describe q (head_dim = nope + rope) */
    int kv_lora, qk_rope;
    int64_t cache_bytes_per_token; /* its paged cache per position: 4 * kv_heads * head_dim,
                                      MLA 2 * (kv_lora + qk_rope) */
    int64_t weight_bytes;   /* the weights a backend holds for it in BF16 (every matrix and
                               norm of its config; the embedding stays on the host) */
} eg_eagle3_config;
eg_status eg_drafter_eagle3_parse_config(const char *json, size_t len, const char *what, const eg_config *target,
                                         const eg_eagle3_opts *opts, eg_eagle3_config *out, eg_error *err);
void eg_eagle3_config_free(eg_eagle3_config *c);
/* The same from DIR/config.json (what the loader reads), for tools that size a drafter
 * before loading it (bench's check, plan --draft-model). */
eg_status eg_drafter_eagle3_read_config(const char *dir, const eg_config *target, const eg_eagle3_opts *opts,
                                        eg_eagle3_config *out, eg_error *err);

/* For tests and diagnostics (d must be an eagle3 drafter). */
int eg_drafter_eagle3_draft_vocab(const eg_drafter *d);                 /* Vd */
const int64_t *eg_drafter_eagle3_d2t(const eg_drafter *d);              /* [Vd] */
/* The draft-vocabulary logits [Vd] the most recent proposal was drawn from (the last
 * step of the last propose call); NULL before any. */
const float *eg_drafter_eagle3_last_logits(const eg_drafter *d);

/* How the aux-layer convention was decided (e.g. "eagle_config.eaglegen_aux_convention"). */
const char *eg_drafter_eagle3_aux_source(const eg_drafter *d);
/* The backend the drafter runs on (NULL: its own CPU code). */
const char *eg_drafter_eagle3_backend(const eg_drafter *d);
/* Current length (committed positions) of a slot. */
int eg_drafter_eagle3_slot_len(const eg_drafter *d, int slot);
/* Backend memory the backend path holds besides its weights and caches, for passes of
 * `rows` rows (eg_eagle3_opts.max_rows; 0 = 64): its activation buffers and its CUDA
 * backend's scratch (eg_cuda_scratch_bytes of its layer's config). From the dimensions
 * alone (any path), for the planner. */
int64_t eg_drafter_eagle3_device_bytes(const eg_drafter *d, int rows);
/* The rows of a pass the runtime gives a drafter on a GPU: a step's verify chunks are
 * proposed for in groups of this many slots, each group reading the drafter's weights once
 * per draft position; its buffers (~600 KB a row for a Kimi-K2.5 drafter) are planned. */
#define EG_EAGLE3_GPU_ROWS 256

#endif
