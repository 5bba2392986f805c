/* config.h — the model configuration, read from a Hugging Face config.json.
 *
 * Accepts the flat DeepseekV3ForCausalLM form (DeepSeek-V3, Kimi-K2-Instruct) and
 * Kimi-K2.5's nested form (`text_config`, `quantization_config` at either level,
 * `rope_scaling` or `rope_parameters`). Every dimension comes from here: nothing in
 * eaglegen assumes 61 layers, 384 experts or a 163,840 vocabulary.
 * Ownership: eg_config is a plain value; eg_config_free releases eos_ids (NULL ok).
 * Thread safety: read-only after load. */
#ifndef EG_CONFIG_H
#define EG_CONFIG_H

#include "common/eg_common.h"

typedef enum eg_expert_format {
    EG_EXPERTS_DENSE = 0,  /* BF16/F32 routed experts */
    EG_EXPERTS_INT4,       /* compressed-tensors pack-quantized, symmetric, group-wise */
    EG_EXPERTS_FP8_BLOCK   /* DeepSeek F8_E4M3 with 128x128 weight_scale_inv */
} eg_expert_format;

typedef struct eg_config {
    char model_type[64];  /* text model's model_type, e.g. "kimi_k2", "deepseek_v3" */
    int hidden;           /* H  */
    int n_layers;         /* L  (num_hidden_layers; MTP layers beyond it are ignored) */
    int n_heads;          /* NH */
    int q_lora_rank;      /* QL; 0 = no q LoRA (q_proj) */
    int kv_lora_rank;     /* C  (512 on Kimi) */
    int qk_nope;          /* DN (128) */
    int qk_rope;          /* DR (64)  */
    int v_head;           /* DV (128) */
    int inter;            /* dense MLP intermediate */
    int moe_inter;        /* F: per-expert intermediate */
    int n_experts;        /* E  */
    int n_shared;         /* shared experts (their MLP width is n_shared * F) */
    int topk;             /* K: num_experts_per_tok */
    int n_group, topk_group;
    float routed_scale;   /* routed_scaling_factor */
    int norm_topk;        /* norm_topk_prob */
    int first_dense;      /* first_k_dense_replace */
    int moe_freq;         /* moe_layer_freq */
    double rope_theta;
    int yarn;             /* rope_scaling type yarn */
    double yarn_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
    int orig_max_pos;     /* original_max_position_embeddings */
    int max_pos;          /* max_position_embeddings */
    float rms_eps;
    int vocab;            /* V */
    int tie_embeddings;
    int bos_id;
    int n_eos;
    int *eos_ids;         /* [n_eos] */
    eg_expert_format expert_format;
    int quant_group;      /* INT4 group size (32 on Kimi) */
    int quant_ignore_all_but_experts; /* sanity flag: only routed experts quantised */
    char hash[65];        /* sha256 of config.json bytes */
} eg_config;

/* Parse DIR/config.json. Unsupported settings (scoring_func other than sigmoid,
 * topk_method other than noaux_tc, non-SiLU activation, ...) are refused with a
 * message naming the field. */
eg_status eg_config_load(const char *dir, eg_config *cfg, eg_error *err);
/* Same from JSON text already in memory (tests, fuzzing). `what` names it in errors. */
eg_status eg_config_parse(const char *json, size_t len, const char *what, eg_config *cfg, eg_error *err);
void eg_config_free(eg_config *cfg);

static inline int eg_config_layer_is_moe(const eg_config *c, int layer) {
    return c->n_experts > 0 && layer >= c->first_dense && (layer % (c->moe_freq > 0 ? c->moe_freq : 1)) == 0;
}
/* mscale(f, m) = 0.1 m ln f + 1, 1 when f <= 1 (DeepSeek-V3 YaRN). */
double eg_yarn_mscale(double factor, double m);
/* Softmax scale: (DN+DR)^-0.5 * mscale(factor, mscale_all_dim)^2 when YaRN. */
double eg_config_softmax_scale(const eg_config *c);
/* inv_freq[i], i < DR/2, with YaRN blending; out has DR/2 entries. */
void eg_config_rope_inv_freq(const eg_config *c, double *out);
/* Multiplier on cos/sin: mscale(factor, mscale) / mscale(factor, mscale_all_dim). */
double eg_config_rope_attn_factor(const eg_config *c);
/* Default aux capture layers: [1, L/2-1, L-4] (clamped to [0, L-1], deduplicated). */
int eg_config_default_aux_layers(const eg_config *c, int out[3]);

#endif
