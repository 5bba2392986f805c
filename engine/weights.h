/* weights.h — the model's tensors, mmapped from safetensors shards.
 *
 * eg_model_load maps every shard named by model.safetensors.index.json (or the single
 * model.safetensors), parses each header with jansson, and fills eg_model with views
 * into the mapped files: no weight is copied. Every tensor the text model needs is
 * validated (present, dtype, shape); a missing or malformed one is reported by name and
 * file. Tensors the text model does not use (vision tower, projector, MTP layers at
 * index >= num_hidden_layers, rotary inv_freq) are ignored. The `language_model.`
 * prefix is optional.
 * Ownership: eg_model owns the mappings; eg_model_free unmaps (NULL ok). eg_weight
 * views stay valid until then.
 * Thread safety: read-only after load; any number of threads may read. */
#ifndef EG_WEIGHTS_H
#define EG_WEIGHTS_H

#include "engine/config.h"

typedef enum eg_wfmt {
    EG_W_NONE = 0, /* absent (optional tensor) */
    EG_W_F32,
    EG_W_BF16,
    EG_W_F16,
    EG_W_INT4,     /* data: int32 [rows][cols/8], column 8j+i in bits 4i..4i+3, value = nibble-8;
                      scale: bf16 [rows][cols/group]; w = value * scale */
    EG_W_FP8       /* data: u8 e4m3 [rows][cols]; scale: f32 [ceil(rows/128)][ceil(cols/128)];
                      w = fp8 * scale_inv (DeepSeek's "weight_scale_inv" multiplies) */
} eg_wfmt;

/* A 2-D weight [rows=out][cols=in] (1-D vectors have rows = 1). */
typedef struct eg_weight {
    eg_wfmt fmt;
    int64_t rows, cols;
    const void *data;
    const void *scale; /* INT4: bf16 [rows][cols/group]; FP8: f32 [ceil(rows/128)][ceil(cols/128)] */
    int group;         /* INT4 group size */
    const char *name;  /* tensor name without prefix, for messages (points into eg_model) */
    int owned;         /* data/scale were allocated by a backend's weight_random (the CPU
                          backend frees them on weight_release); 0 for views and uploads */
} eg_weight;

typedef struct eg_expert_w {
    eg_weight gate;  /* [F][H] */
    eg_weight up;    /* [F][H] */
    eg_weight down;  /* [H][F] */
} eg_expert_w;

typedef struct eg_layer_w {
    eg_weight attn_norm;  /* [H] input_layernorm */
    eg_weight ffn_norm;   /* [H] post_attention_layernorm */
    /* attention (MLA) */
    eg_weight q_a;        /* [QL][H]            (q_lora_rank > 0) */
    eg_weight q_a_norm;   /* [QL] */
    eg_weight q_b;        /* [NH*(DN+DR)][QL] */
    eg_weight q;          /* [NH*(DN+DR)][H]    (q_lora_rank == 0) */
    eg_weight kv_a;       /* [C+DR][H]  kv_a_proj_with_mqa */
    eg_weight kv_a_norm;  /* [C] */
    eg_weight kv_b;       /* [NH*(DN+DV)][C]: per head DN rows of W_UK then DV rows of W_UV */
    eg_weight o;          /* [H][NH*DV] */
    /* feed-forward */
    int is_moe;
    eg_weight mlp_gate;   /* [I][H] dense layers */
    eg_weight mlp_up;     /* [I][H] */
    eg_weight mlp_down;   /* [H][I] */
    eg_weight router;     /* [E][H] mlp.gate.weight */
    eg_weight router_bias;/* [E] e_score_correction_bias (F32 in the real checkpoint) */
    eg_expert_w *experts; /* [E] */
    eg_weight sh_gate;    /* [S*F][H] shared_experts (absent when n_shared == 0) */
    eg_weight sh_up;      /* [S*F][H] */
    eg_weight sh_down;    /* [H][S*F] */
} eg_layer_w;

typedef struct eg_model {
    eg_config cfg;
    char *dir;
    eg_weight embed;      /* [V][H] */
    eg_weight final_norm; /* [H] */
    eg_weight lm_head;    /* [V][H] (the embedding when tied) */
    eg_layer_w *layers;   /* [L] */
    int64_t weight_bytes; /* bytes of all used tensors, as stored */
    void *priv;           /* mappings, names */
} eg_model;

eg_status eg_model_load(const char *dir, eg_model *m, eg_error *err);
void eg_model_free(eg_model *m);
/* 1 when lm_head is the embedding itself: tie_word_embeddings and no stored lm_head.weight
 * (a checkpoint that ties in its config but ships its own head uses that head, everywhere). */
int eg_model_head_tied(const eg_model *m);

/* Element (r, c) of any weight format, as float. For tests and reference code; the
 * backends dequantise in bulk. */
float eg_weight_get(const eg_weight *w, int64_t r, int64_t c);
/* Dequantise row r into out[cols]. */
void eg_weight_row(const eg_weight *w, int64_t r, float *out);
/* *out = a view of rows [r0, r1) of w (data and scales point into w's). F32, BF16, F16
 * and INT4 split at any row; FP8 at multiples of its 128-row scale blocks (r1 may be the
 * last row). An error names the tensor. */
eg_status eg_weight_rows(const eg_weight *w, int64_t r0, int64_t r1, eg_weight *out, eg_error *err);
/* Bytes the weight occupies as stored (data + scales). */
int64_t eg_weight_bytes(const eg_weight *w);

#endif
