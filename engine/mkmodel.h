/* mkmodel.h — random-weights models in Kimi-K2.5's Hugging Face checkpoint layout, for
 * tests, demos and benchmarks on machines without the real 600 GB checkpoint.
 *
 * eg_mkmodel_run writes into DIR:
 *   config.json                    Kimi-K2.5's nested form (text_config; INT4 experts
 *                                  announce compressed-tensors pack-quantized inside it)
 *   model.safetensors.index.json   + model-0000i-of-0000n.safetensors shards, tensors
 *                                  prefixed `language_model.`, streamed (never in RAM)
 *   tiktoken.model                 byte-level base vocabulary (see below)
 *   tokenizer_config.json          Kimi's special tokens at n_base.. n_base+255 with the
 *                                  same names and offsets as Kimi's real file
 * Presets: "tiny" (tests/demo), "moonlight-16b", "kimi-k2.5" (real dimensions; use
 * `layers` to keep it small). Weights come from a counter-based RNG keyed by (seed,
 * tensor name, element index), so the output is identical whatever the thread count
 * or shard split.
 *
 * Ownership: strings returned through out-parameters are malloc'd; the caller frees.
 * Thread safety: functions are reentrant; eg_mkmodel_run uses its own worker pool. */
#ifndef EG_MKMODEL_H
#define EG_MKMODEL_H

#include <stdio.h>

#include "common/eg_common.h"

enum { EG_MK_EXPERTS_DEFAULT = 0, EG_MK_EXPERTS_INT4, EG_MK_EXPERTS_BF16 };

typedef struct eg_mkmodel_opts {
    const char *preset;   /* "tiny", "moonlight-16b", "kimi-k2.5" */
    const char *out_dir;  /* created if missing (run only) */
    uint64_t seed;
    int layers;           /* num_hidden_layers override; 0 = preset default */
    int experts;          /* EG_MK_EXPERTS_*; default is INT4 for every preset */
    int64_t shard_bytes;  /* split shards above this; 0 = 4 GiB */
    int threads;          /* 0 = eg_num_threads() */
    int no_weights;       /* write config.json and the tokenizer only (no shards, no index) */
    int sparse;           /* all-zero weights written as holes (sparse files): the full
                             layout at no disk cost, for loader and planning tests;
                             weight_shape tensors are real */
    FILE *log;            /* progress lines (NULL: quiet) */
} eg_mkmodel_opts;

typedef struct eg_mkmodel_plan_info {
    int64_t n_tensors;
    int64_t total_bytes;  /* tensor data bytes (= index metadata.total_size) */
    int n_shards;
    int vocab, n_base, n_layers;
} eg_mkmodel_plan_info;

/* Names of the presets (static strings), *n set to their count. */
const char *const *eg_mkmodel_presets(int *n);

/* The config.json text the preset would write. */
eg_status eg_mkmodel_config_json(const eg_mkmodel_opts *o, char **json, eg_error *err);

/* Plan without writing: fills info; when `list` is non-NULL prints one line per tensor
 * ("name dtype [shape] bytes shard") and a closing total line. */
eg_status eg_mkmodel_plan(const eg_mkmodel_opts *o, eg_mkmodel_plan_info *info, FILE *list,
                          eg_error *err);

/* Write the model. */
eg_status eg_mkmodel_run(const eg_mkmodel_opts *o, eg_mkmodel_plan_info *info, eg_error *err);

/* ---- EAGLE-3 drafter (mkmodel --drafter-for) ----
 * eg_mkmodel_drafter writes into out_dir a random drafter for the model in target_dir, in
 * SpecForge's LlamaForCausalLMEagle3 layout (engine/drafter_eagle3.h): config.json and one
 * model.safetensors, BF16 weights, d2t I64, t2d BOOL. Dimensions follow the target:
 * hidden = the target's H, heads = its NH (head_dim H/NH), kv heads NH/8 (NH/2 below 8
 * heads, at least 1), intermediate = its dense intermediate_size, vocab = its V,
 * rms_norm_eps / rope_theta / max_position_embeddings its values, no rope scaling. Weight
 * scales as for models (N(0, 1/fan_in) linears, norms 1 + N(0, 0.05^2), embedding N(0, 1),
 * lm_head N(0, 16/H)), counter-based from (seed, tensor name, index). */
typedef struct eg_mkdrafter_opts {
    const char *target_dir;   /* the target model (its config.json is read) */
    const char *out_dir;      /* created if missing */
    uint64_t seed;
    int draft_vocab;          /* Vd; 0 = min(V, 32000) */
    const int64_t *d2t;       /* [draft_vocab] target = d + d2t[d] (e.g. `eaglegen vocab`);
                                 NULL = the lowest ids 0..Vd-1 */
    int n_aux;                /* 0 = the target's default aux layers [1, L/2-1, L-4] */
    const int *aux_layers;    /* [n_aux] output-of-layer ids, ascending, distinct */
    int no_embed;             /* omit embed_tokens.weight (the loader then uses the target's) */
    int fc_norm;              /* write vLLM's fc_norm: an RMSNorm per aux row before fc
                                 (fc_norm.{i}.weight) and "fc_norm": true */
    int mla;                  /* vLLM's Eagle3DeepseekV2ForCausalLM layout: the decoder layer's
                                 attention is MLA with the target's q_lora / kv_lora / head
                                 dims and RoPE (YaRN included), as TorchSpec's
                                 lightseekorg/kimi-k2.5-eagle3-mla */
} eg_mkdrafter_opts;

eg_status eg_mkmodel_drafter(const eg_mkdrafter_opts *o, eg_error *err);

#endif
