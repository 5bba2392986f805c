/* Random-weights model writer; see mkmodel.h.
 *
 * Weight scales (so a random model behaves like a model, not noise or a constant):
 * linear weights ~ N(0, 1/fan_in) rounded to BF16, so each projection keeps unit
 * variance; norm weights 1 + N(0, 0.05^2); router weights N(0, 1/H) with F32
 * e_score_correction_bias N(0, 0.02^2), so routing varies from token to token; the
 * embedding N(0, 1); lm_head N(0, 16/H), so logits of the unit-RMS final norm output
 * have a standard deviation near 4 (a peaked but not one-hot distribution, as in the
 * fixtures). INT4 experts draw nibbles uniformly from 1..15 (values -7..7, mean 0,
 * std 4.32) with per-group BF16 scales near 1/(4.32 sqrt(fan_in)).
 *
 * Randomness is counter-based: element i of tensor NAME is a function of
 * (seed, NAME, i) only (splitmix64 of a per-tensor key plus the counter), so shards
 * can be filled in parallel chunks and the output never depends on the thread count
 * or the shard split.
 *
 * Tokenizer: tiktoken.model must list ranks 0..n_base-1 without gaps (prompts/
 * tokenizer.c checks that). For tiny, n_base = 256: one token per byte, vocab 512.
 * For the 163,840-vocabulary presets n_base = 163,584: the 256 single bytes (rank =
 * byte value), then all 65,536 byte pairs, then 97,792 three-byte strings of printable
 * ASCII — a valid byte-level BPE (every multi-byte token is reachable by merges), just
 * not Kimi's merge table. */
#include "engine/mkmodel.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/eg_thread.h"
#include "engine/config.h"
#include "engine/safetensors.h"

/* ---------------------------------------------------------------- presets */

typedef struct mk_preset {
    const char *name, *model_type;
    int hidden, layers, heads, q_lora, kv_lora, nope, rope, v, inter, moe_inter, experts,
        shared, topk, n_group, topk_group, first_dense;
    double routed_scale, rope_theta;
    int yarn;
    double factor, beta_fast, beta_slow, mscale, mscale_all;
    int orig_max, max_pos;
    double eps;
    int n_base, group;
} mk_preset;

static const mk_preset presets[] = {
    /* tiny: the fixtures' dimensions (tiny-a) with 32-wide experts so INT4 groups fit,
     * group-limited routing, YaRN with a short original context. */
    {"tiny", "kimi_k2", 64, 5, 4, 48, 32, 16, 8, 12, 96, 32, 16, 1, 4, 4, 2, 1, 2.5, 50000.0, 1,
     64.0, 32.0, 1.0, 1.0, 1.0, 32, 4096, 1e-5, 256, 32},
    /* moonshotai/Moonlight-16B-A3B config.json: no q LoRA, no rope scaling. */
    {"moonlight-16b", "deepseek_v3", 2048, 27, 16, 0, 512, 128, 64, 128, 11264, 1408, 64, 2, 6,
     1, 1, 1, 2.446, 50000.0, 0, 1.0, 32.0, 1.0, 1.0, 1.0, 8192, 8192, 1e-5, 163584, 32},
    /* moonshotai/Kimi-K2.5 text_config. */
    {"kimi-k2.5", "kimi_k2", 7168, 61, 64, 1536, 512, 128, 64, 128, 18432, 2048, 384, 1, 8, 1, 1,
     1, 2.827, 50000.0, 1, 64.0, 1.0, 1.0, 1.0, 1.0, 4096, 262144, 1e-6, 163584, 32},
};
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

const char *const *eg_mkmodel_presets(int *n) {
    static const char *const names[] = {"tiny", "moonlight-16b", "kimi-k2.5"};
    *n = N_PRESETS;
    return names;
}

/* Special tokens: offset from n_base -> name, and the "special" flag, exactly as in
 * Kimi's tokenizer_config.json (tool-call and think markers are not "special" there). */
static const struct {
    int off;
    const char *name;
    int special;
} specials[] = {
    {0, "[BOS]", 1}, {1, "[EOS]", 1}, {2, "<|im_end|>", 1}, {3, "<|im_user|>", 1},
    {4, "<|im_assistant|>", 1}, {6, "<|start_header_id|>", 1}, {7, "<|end_header_id|>", 1},
    {9, "[EOT]", 1}, {10, "<|im_system|>", 1}, {11, "<|tool_calls_section_begin|>", 0},
    {12, "<|tool_calls_section_end|>", 0}, {13, "<|tool_call_begin|>", 0},
    {14, "<|tool_call_argument_begin|>", 0}, {15, "<|tool_call_end|>", 0},
    {17, "<|im_middle|>", 1}, {18, "<|media_begin|>", 1}, {19, "<|media_content|>", 1},
    {20, "<|media_end|>", 1}, {21, "<|media_pad|>", 1}, {22, "<think>", 0}, {23, "</think>", 0},
    {254, "[UNK]", 1}, {255, "[PAD]", 1},
};
static const char *const additional_special[] = {
    "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>", "<|end_header_id|>",
    "[EOT]", "<|im_system|>", "<|im_middle|>", "<|media_begin|>", "<|media_content|>",
    "<|media_end|>", "<|media_pad|>"};

typedef struct mk_cfg {
    mk_preset p;
    int int4;
    int vocab;
} mk_cfg;

static eg_status resolve(const eg_mkmodel_opts *o, mk_cfg *c, eg_error *err) {
    const mk_preset *p = NULL;
    for (int i = 0; i < N_PRESETS; i++)
        if (o->preset && !strcmp(o->preset, presets[i].name)) p = &presets[i];
    if (!p)
        return eg_fail(err, EG_ERR_INVALID,
                       "unknown preset '%s' (expected tiny, moonlight-16b or kimi-k2.5)",
                       o->preset ? o->preset : "(none)");
    c->p = *p;
    if (o->layers < 0) return eg_fail(err, EG_ERR_INVALID, "--layers must be positive");
    if (o->layers > 0) c->p.layers = o->layers;
    c->int4 = o->experts != EG_MK_EXPERTS_BF16;
    c->vocab = c->p.n_base + 256;
    return EG_OK;
}

/* ---------------------------------------------------------------- config.json */

static json_t *config_json(const mk_cfg *c, const eg_mkmodel_opts *o) {
    const mk_preset *p = &c->p;
    const int bos = p->n_base, eos = p->n_base + 1, pad = p->n_base + 255;
    json_t *tc = json_object();
    json_object_set_new(tc, "architectures", json_pack("[s]", "DeepseekV3ForCausalLM"));
    json_object_set_new(tc, "model_type", json_string(p->model_type));
    json_object_set_new(tc, "hidden_size", json_integer(p->hidden));
    json_object_set_new(tc, "num_hidden_layers", json_integer(p->layers));
    json_object_set_new(tc, "num_attention_heads", json_integer(p->heads));
    json_object_set_new(tc, "num_key_value_heads", json_integer(p->heads));
    json_object_set_new(tc, "q_lora_rank", p->q_lora ? json_integer(p->q_lora) : json_null());
    json_object_set_new(tc, "kv_lora_rank", json_integer(p->kv_lora));
    json_object_set_new(tc, "qk_nope_head_dim", json_integer(p->nope));
    json_object_set_new(tc, "qk_rope_head_dim", json_integer(p->rope));
    json_object_set_new(tc, "v_head_dim", json_integer(p->v));
    json_object_set_new(tc, "intermediate_size", json_integer(p->inter));
    json_object_set_new(tc, "moe_intermediate_size", json_integer(p->moe_inter));
    json_object_set_new(tc, "n_routed_experts", json_integer(p->experts));
    json_object_set_new(tc, "n_shared_experts", json_integer(p->shared));
    json_object_set_new(tc, "num_experts_per_tok", json_integer(p->topk));
    json_object_set_new(tc, "n_group", json_integer(p->n_group));
    json_object_set_new(tc, "topk_group", json_integer(p->topk_group));
    json_object_set_new(tc, "topk_method", json_string("noaux_tc"));
    json_object_set_new(tc, "scoring_func", json_string("sigmoid"));
    json_object_set_new(tc, "routed_scaling_factor", json_real(p->routed_scale));
    json_object_set_new(tc, "norm_topk_prob", json_true());
    json_object_set_new(tc, "first_k_dense_replace", json_integer(p->first_dense));
    json_object_set_new(tc, "moe_layer_freq", json_integer(1));
    json_object_set_new(tc, "rope_theta", json_real(p->rope_theta));
    if (p->yarn)
        json_object_set_new(
            tc, "rope_scaling",
            json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:i}", "type", "yarn", "factor", p->factor,
                      "beta_fast", p->beta_fast, "beta_slow", p->beta_slow, "mscale", p->mscale,
                      "mscale_all_dim", p->mscale_all, "original_max_position_embeddings",
                      p->orig_max));
    else
        json_object_set_new(tc, "rope_scaling", json_null());
    json_object_set_new(tc, "max_position_embeddings", json_integer(p->max_pos));
    json_object_set_new(tc, "rms_norm_eps", json_real(p->eps));
    json_object_set_new(tc, "vocab_size", json_integer(c->vocab));
    json_object_set_new(tc, "hidden_act", json_string("silu"));
    json_object_set_new(tc, "tie_word_embeddings", json_false());
    json_object_set_new(tc, "num_nextn_predict_layers", json_integer(0));
    json_object_set_new(tc, "bos_token_id", json_integer(bos));
    json_object_set_new(tc, "eos_token_id", json_integer(eos));
    json_object_set_new(tc, "pad_token_id", json_integer(pad));
    if (c->int4) {
        json_t *w = json_pack("{s:n, s:n, s:b, s:i, s:i, s:s, s:{}, s:s, s:b, s:s}", "actorder",
                              "block_structure", "dynamic", 0, "group_size", p->group, "num_bits",
                              4, "observer", "minmax", "observer_kwargs", "strategy", "group",
                              "symmetric", 1, "type", "int");
        json_t *q = json_object();
        json_object_set_new(q, "config_groups",
                            json_pack("{s:{s:n, s:n, s:[s], s:o}}", "group_0", "input_activations",
                                      "output_activations", "targets", "Linear", "weights", w));
        json_object_set_new(q, "format", json_string("pack-quantized"));
        /* The ignore list style of Kimi's checkpoints: everything but routed experts. */
        json_object_set_new(q, "ignore",
                            json_pack("[s,s,s,s]", "re:.*self_attn.*", "re:.*shared_experts.*",
                                      "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*"));
        json_object_set_new(q, "kv_cache_scheme", json_null());
        json_object_set_new(q, "quant_method", json_string("compressed-tensors"));
        json_object_set_new(q, "quantization_status", json_string("compressed"));
        json_object_set_new(tc, "quantization_config", q);
    }
    json_t *root = json_object();
    json_object_set_new(root, "architectures", json_pack("[s]", "KimiK25ForConditionalGeneration"));
    json_object_set_new(root, "model_type", json_string("kimi_k25"));
    json_object_set_new(root, "bos_token_id", json_integer(bos));
    json_object_set_new(root, "eos_token_id", json_integer(eos));
    json_object_set_new(root, "pad_token_id", json_integer(pad));
    json_object_set_new(root, "text_config", tc);
    json_object_set_new(root, "eaglegen_mkmodel",
                        json_pack("{s:s, s:I, s:s}", "preset", p->name, "seed",
                                  (json_int_t)o->seed, "experts", c->int4 ? "int4" : "bf16"));
    return root;
}

#define JSON_FLAGS (JSON_INDENT(2) | JSON_REAL_PRECISION(10))

eg_status eg_mkmodel_config_json(const eg_mkmodel_opts *o, char **json, eg_error *err) {
    mk_cfg c;
    eg_status st = resolve(o, &c, err);
    if (st) return st;
    json_t *root = config_json(&c, o);
    *json = root ? json_dumps(root, JSON_FLAGS) : NULL;
    json_decref(root);
    return *json ? EG_OK : eg_fail(err, EG_ERR_NOMEM, "out of memory building config.json");
}

/* ---------------------------------------------------------------- tensor plan */

enum { G_NORMAL, G_NORMONE, G_PACKED, G_SCALE, G_SHAPE };

typedef struct mk_tensor {
    char *name;
    eg_st_dtype dtype;
    int ndim;
    int64_t shape[2];
    int gen;
    float std;          /* G_NORMAL: std; G_SCALE: base scale */
    int64_t shp[2];     /* G_SHAPE: the logical [out, in] */
    uint64_t key;       /* per-tensor RNG key */
    uint64_t bytes;
    int shard;
    eg_pool *pool;
} mk_tensor;

typedef struct mk_plan {
    mk_tensor *t;
    int64_t n, cap;
    int n_shards;
    uint64_t total;
    uint64_t seed;
} mk_plan;

static void plan_free(mk_plan *pl) {
    for (int64_t i = 0; i < pl->n; i++) free(pl->t[i].name);
    free(pl->t);
    memset(pl, 0, sizeof *pl);
}

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t name_key(uint64_t seed, const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return splitmix(seed ^ splitmix(h));
}

static eg_status add_t(mk_plan *pl, const char *name, eg_st_dtype dt, int ndim, int64_t a,
                       int64_t b, int gen, float std, eg_error *err) {
    if (pl->n == pl->cap) {
        int64_t nc = pl->cap ? 2 * pl->cap : 1024;
        mk_tensor *nt = realloc(pl->t, (size_t)nc * sizeof *nt);
        if (!nt) return eg_fail(err, EG_ERR_NOMEM, "out of memory planning tensors");
        pl->t = nt;
        pl->cap = nc;
    }
    mk_tensor *t = &pl->t[pl->n];
    memset(t, 0, sizeof *t);
    size_t nl = strlen(name) + 16;
    if (!(t->name = malloc(nl))) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    snprintf(t->name, nl, "language_model.%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->gen = gen;
    t->std = std;
    t->key = name_key(pl->seed, t->name);
    t->bytes = (uint64_t)a * (uint64_t)(ndim == 2 ? b : 1) * eg_st_dtype_size(dt);
    pl->n++;
    return EG_OK;
}

/* A linear weight [out][in]: BF16 normal, or the INT4 triple. */
static eg_status add_lin(mk_plan *pl, const char *base, int64_t out, int64_t in, int int4,
                         int group, eg_error *err) {
    char n[640];
    eg_status st;
    if (!int4) {
        snprintf(n, sizeof n, "%s.weight", base);
        return add_t(pl, n, EG_ST_BF16, 2, out, in, G_NORMAL, (float)(1.0 / sqrt((double)in)), err);
    }
    snprintf(n, sizeof n, "%s.weight_packed", base);
    if ((st = add_t(pl, n, EG_ST_I32, 2, out, in / 8, G_PACKED, 0, err))) return st;
    snprintf(n, sizeof n, "%s.weight_scale", base);
    if ((st = add_t(pl, n, EG_ST_BF16, 2, out, in / group, G_SCALE,
                    (float)(1.0 / (4.32 * sqrt((double)in))), err)))
        return st;
    snprintf(n, sizeof n, "%s.weight_shape", base);
    if ((st = add_t(pl, n, EG_ST_I32, 1, 2, 0, G_SHAPE, 0, err))) return st;
    pl->t[pl->n - 1].shp[0] = out;
    pl->t[pl->n - 1].shp[1] = in;
    return EG_OK;
}

/* What a plan amounts to, for the caller (info may be NULL). */
static void fill_info(eg_mkmodel_plan_info *info, const mk_plan *pl, const mk_cfg *c) {
    if (!info) return;
    info->n_tensors = pl->n;
    info->total_bytes = (int64_t)pl->total;
    info->n_shards = pl->n_shards;
    info->vocab = c->vocab;
    info->n_base = c->p.n_base;
    info->n_layers = c->p.layers;
}

static eg_status build_plan(const mk_cfg *c, uint64_t seed, int64_t shard_bytes, mk_plan *pl,
                            eg_error *err) {
    const mk_preset *p = &c->p;
    const int64_t H = p->hidden, V = c->vocab, NH = p->heads, DQ = p->nope + p->rope;
    char b[160], n[512];
    eg_status st = EG_OK;
    memset(pl, 0, sizeof *pl);
    pl->seed = seed;
    if (c->int4 && (H % p->group || p->moe_inter % p->group))
        return eg_fail(err, EG_ERR_CONFIG, "preset %s: dimensions not divisible by INT4 group %d",
                       p->name, p->group);
#define T(name_, dt, nd, a, bb, g, s)                                                    \
    do {                                                                                 \
        if ((st = add_t(pl, name_, dt, nd, a, bb, g, s, err))) goto fail;                \
    } while (0)
#define LIN(suffix, o, i, q)                                                             \
    do {                                                                                 \
        snprintf(n, sizeof n, "%s%s", b, suffix);                                        \
        if ((st = add_lin(pl, n, o, i, q, p->group, err))) goto fail;                    \
    } while (0)
#define NORM(suffix, d)                                                                  \
    do {                                                                                 \
        snprintf(n, sizeof n, "%s%s.weight", b, suffix);                                 \
        T(n, EG_ST_BF16, 1, d, 0, G_NORMONE, 0.05f);                                     \
    } while (0)
    T("model.embed_tokens.weight", EG_ST_BF16, 2, V, H, G_NORMAL, 1.0f);
    for (int l = 0; l < p->layers; l++) {
        snprintf(b, sizeof b, "model.layers.%d.", l);
        NORM("input_layernorm", H);
        NORM("post_attention_layernorm", H);
        if (p->q_lora) {
            LIN("self_attn.q_a_proj", p->q_lora, H, 0);
            NORM("self_attn.q_a_layernorm", p->q_lora);
            LIN("self_attn.q_b_proj", NH * DQ, p->q_lora, 0);
        } else {
            LIN("self_attn.q_proj", NH * DQ, H, 0);
        }
        LIN("self_attn.kv_a_proj_with_mqa", p->kv_lora + p->rope, H, 0);
        NORM("self_attn.kv_a_layernorm", p->kv_lora);
        LIN("self_attn.kv_b_proj", NH * (p->nope + p->v), p->kv_lora, 0);
        LIN("self_attn.o_proj", H, NH * p->v, 0);
        if (l < p->first_dense || p->experts == 0) {
            LIN("mlp.gate_proj", p->inter, H, 0);
            LIN("mlp.up_proj", p->inter, H, 0);
            LIN("mlp.down_proj", H, p->inter, 0);
            continue;
        }
        LIN("mlp.gate", p->experts, H, 0);
        snprintf(n, sizeof n, "%smlp.gate.e_score_correction_bias", b);
        T(n, EG_ST_F32, 1, p->experts, 0, G_NORMAL, 0.02f);
        for (int e = 0; e < p->experts; e++) {
            char eb[64];
            snprintf(eb, sizeof eb, "mlp.experts.%d.gate_proj", e);
            LIN(eb, p->moe_inter, H, c->int4);
            snprintf(eb, sizeof eb, "mlp.experts.%d.up_proj", e);
            LIN(eb, p->moe_inter, H, c->int4);
            snprintf(eb, sizeof eb, "mlp.experts.%d.down_proj", e);
            LIN(eb, H, p->moe_inter, c->int4);
        }
        if (p->shared) {
            int64_t SF = (int64_t)p->shared * p->moe_inter;
            LIN("mlp.shared_experts.gate_proj", SF, H, 0);
            LIN("mlp.shared_experts.up_proj", SF, H, 0);
            LIN("mlp.shared_experts.down_proj", H, SF, 0);
        }
    }
    b[0] = 0;
    NORM("model.norm", H);
    T("lm_head.weight", EG_ST_BF16, 2, V, H, G_NORMAL, (float)(4.0 / sqrt((double)H)));
#undef T
#undef LIN
#undef NORM
    /* Shards in plan order, a new one when the next tensor would overflow. */
    uint64_t cur = 0;
    int s = 0;
    for (int64_t i = 0; i < pl->n; i++) {
        if (cur > 0 && cur + pl->t[i].bytes > (uint64_t)shard_bytes) {
            s++;
            cur = 0;
        }
        pl->t[i].shard = s;
        cur += pl->t[i].bytes;
        pl->total += pl->t[i].bytes;
    }
    pl->n_shards = s + 1;
    return EG_OK;
fail:
    plan_free(pl);
    return st;
}

/* ---------------------------------------------------------------- generation */

static inline float unit24(uint64_t h) { return (float)(h & 0xffffff) * (1.0f / 16777216.0f); }

/* Element i of a normal stream: pair i/2 gives two Box-Muller values. */
static inline float normal_at(uint64_t key, int64_t i) {
    uint64_t h = splitmix(key + (uint64_t)(i >> 1) * 0x9e3779b97f4a7c15ull);
    float u1 = ((float)(h >> 40) + 1.0f) * (1.0f / 16777216.0f); /* (0, 1] */
    float u2 = unit24(h);
    float r = sqrtf(-2.0f * logf(u1));
    float a = 6.2831853071795864f * u2;
    return (i & 1) ? r * sinf(a) : r * cosf(a);
}

typedef struct fill_job {
    const mk_tensor *t;
    int64_t e0;
    void *buf;
} fill_job;

/* Both values of Box-Muller pair p (elements 2p and 2p+1). */
static inline void normal_pair(uint64_t key, int64_t p, float *z0, float *z1) {
    uint64_t h = splitmix(key + (uint64_t)p * 0x9e3779b97f4a7c15ull);
    float u1 = ((float)(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
    float r = sqrtf(-2.0f * logf(u1)), a = 6.2831853071795864f * unit24(h);
    *z0 = r * cosf(a);
    *z1 = r * sinf(a);
}

static void fill_range(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    const fill_job *j = ctx;
    const mk_tensor *t = j->t;
    if (t->gen == G_NORMAL && t->dtype == EG_ST_BF16) {
        /* the bulk of every model: pairs at a time (normal_at computes a pair per call) */
        int64_t k = b;
        if (k < e && ((j->e0 + k) & 1)) {
            uint16_t h = eg_f32_to_bf16(t->std * normal_at(t->key, j->e0 + k));
            memcpy((char *)j->buf + 2 * k, &h, 2);
            k++;
        }
        for (; k + 1 < e; k += 2) {
            float z0, z1;
            normal_pair(t->key, (j->e0 + k) >> 1, &z0, &z1);
            uint16_t h[2] = {eg_f32_to_bf16(t->std * z0), eg_f32_to_bf16(t->std * z1)};
            memcpy((char *)j->buf + 2 * k, h, 4);
        }
        if (k < e) {
            uint16_t h = eg_f32_to_bf16(t->std * normal_at(t->key, j->e0 + k));
            memcpy((char *)j->buf + 2 * k, &h, 2);
        }
        return;
    }
    for (int64_t k = b; k < e; k++) {
        int64_t i = j->e0 + k;
        switch (t->gen) {
        case G_NORMAL: {
            float v = t->std * normal_at(t->key, i);
            if (t->dtype == EG_ST_F32) memcpy((char *)j->buf + 4 * k, &v, 4);
            else {
                uint16_t h = eg_f32_to_bf16(v);
                memcpy((char *)j->buf + 2 * k, &h, 2);
            }
            break;
        }
        case G_NORMONE: {
            uint16_t h = eg_f32_to_bf16(1.0f + t->std * normal_at(t->key, i));
            memcpy((char *)j->buf + 2 * k, &h, 2);
            break;
        }
        case G_PACKED: {
            uint64_t r = splitmix(t->key + (uint64_t)i * 0x9e3779b97f4a7c15ull);
            uint32_t w = 0;
            for (int q = 0; q < 8; q++) {
                uint32_t nib = 1u + ((((uint32_t)(r >> (8 * q)) & 255u) * 15u) >> 8);
                w |= nib << (4 * q);
            }
            memcpy((char *)j->buf + 4 * k, &w, 4);
            break;
        }
        case G_SCALE: {
            uint64_t r = splitmix(t->key + (uint64_t)i * 0x9e3779b97f4a7c15ull);
            uint16_t h = eg_f32_to_bf16(t->std * (0.8f + 0.4f * unit24(r)));
            memcpy((char *)j->buf + 2 * k, &h, 2);
            break;
        }
        case G_SHAPE: {
            int32_t v = (int32_t)t->shp[i];
            memcpy((char *)j->buf + 4 * k, &v, 4);
            break;
        }
        }
    }
}

static eg_status mk_fill(void *ctx, uint64_t offset, void *buf, size_t n, eg_error *err) {
    const mk_tensor *t = ctx;
    size_t es = eg_st_dtype_size(t->dtype);
    if (offset % es || n % es)
        return eg_fail(err, EG_ERR_INVALID, "fill chunk not aligned to %zu-byte elements", es);
    fill_job j = {t, (int64_t)(offset / es), buf};
    eg_pool_for(t->pool, (int64_t)(n / es), 16384, fill_range, &j);
    return EG_OK;
}

/* ---------------------------------------------------------------- files */

static eg_status write_file_atomic(const char *path, const void *data, size_t len, eg_error *err) {
    size_t pl = strlen(path) + 32;
    char *tmp = malloc(pl);
    if (!tmp) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    snprintf(tmp, pl, "%s.tmp.%ld", path, (long)getpid());
    eg_status st = EG_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = eg_fail(err, EG_ERR_IO, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    const char *p = data;
    while (len && !st) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) st = eg_fail(err, EG_ERR_IO, "%s: write: %s", tmp, strerror(errno));
        else {
            p += k;
            len -= (size_t)k;
        }
    }
    if (!st && fsync(fd) != 0) st = eg_fail(err, EG_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st) st = eg_fail(err, EG_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
    free(tmp);
    return st;
}

static eg_status write_json(const char *dir, const char *name, json_t *j, eg_error *err) {
    char *s = j ? json_dumps(j, JSON_FLAGS) : NULL;
    if (!s) return eg_fail(err, EG_ERR_NOMEM, "out of memory writing %s", name);
    size_t pl = strlen(dir) + strlen(name) + 2;
    char *path = malloc(pl);
    eg_status st;
    if (!path) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    else {
        snprintf(path, pl, "%s/%s", dir, name);
        size_t n = strlen(s);
        s[n] = '\n'; /* replace the NUL: the file ends with a newline */
        st = write_file_atomic(path, s, n + 1, err);
        s[n] = 0;
    }
    free(path);
    free(s);
    return st;
}

static eg_status mkdir_p(const char *dir, eg_error *err) {
    char *d = strdup(dir);
    if (!d) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    for (char *p = d + 1;; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(d, 0755) != 0 && errno != EEXIST) {
                eg_status st = eg_fail(err, EG_ERR_IO, "mkdir %s: %s", d, strerror(errno));
                free(d);
                return st;
            }
            *p = c;
            if (!c) break;
        }
    }
    free(d);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return eg_fail(err, EG_ERR_IO, "%s: not a directory", dir);
    return EG_OK;
}

static size_t b64(const uint8_t *in, size_t n, char *out) {
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n) v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        out[o++] = tbl[(v >> 18) & 63];
        out[o++] = tbl[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? tbl[v & 63] : '=';
    }
    return o;
}

static eg_status write_tokenizer(const char *dir, int n_base, eg_error *err) {
    /* tiktoken.model: "base64 rank" lines, ranks 0..n_base-1. */
    size_t cap = (size_t)n_base * 20 + 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    int rank = 0;
    uint8_t tok[3];
    for (int bt = 0; bt < 256 && rank < n_base; bt++, rank++) {
        tok[0] = (uint8_t)bt;
        len += b64(tok, 1, buf + len);
        len += (size_t)sprintf(buf + len, " %d\n", rank);
    }
    for (int a = 0; a < 256 && rank < n_base; a++)
        for (int bt = 0; bt < 256 && rank < n_base; bt++, rank++) {
            tok[0] = (uint8_t)a;
            tok[1] = (uint8_t)bt;
            len += b64(tok, 2, buf + len);
            len += (size_t)sprintf(buf + len, " %d\n", rank);
        }
    for (int a = 0x20; a < 0x7f && rank < n_base; a++)
        for (int bt = 0x20; bt < 0x7f && rank < n_base; bt++)
            for (int c = 0x20; c < 0x7f && rank < n_base; c++, rank++) {
                tok[0] = (uint8_t)a;
                tok[1] = (uint8_t)bt;
                tok[2] = (uint8_t)c;
                len += b64(tok, 3, buf + len);
                len += (size_t)sprintf(buf + len, " %d\n", rank);
            }
    eg_status st = EG_OK;
    if (rank != n_base) st = eg_fail(err, EG_ERR_INVALID, "cannot build %d base tokens", n_base);
    size_t pl = strlen(dir) + 32;
    char *path = malloc(pl);
    if (!st && !path) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    if (!st) {
        snprintf(path, pl, "%s/tiktoken.model", dir);
        st = write_file_atomic(path, buf, len, err);
    }
    free(path);
    free(buf);
    if (st) return st;

    json_t *root = json_object(), *added = json_object(), *extra = json_array();
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        char id[32];
        snprintf(id, sizeof id, "%d", n_base + specials[i].off);
        json_object_set_new(added, id,
                            json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content",
                                      specials[i].name, "lstrip", 0, "normalized", 0, "rstrip",
                                      0, "single_word", 0, "special", specials[i].special));
    }
    for (size_t i = 0; i < sizeof additional_special / sizeof additional_special[0]; i++)
        json_array_append_new(extra, json_string(additional_special[i]));
    json_object_set_new(root, "added_tokens_decoder", added);
    json_object_set_new(root, "additional_special_tokens", extra);
    json_object_set_new(root, "bos_token", json_string("[BOS]"));
    json_object_set_new(root, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(root, "eos_token", json_string("[EOS]"));
    json_object_set_new(root, "model_max_length", json_integer(1048576));
    json_object_set_new(root, "pad_token", json_string("[PAD]"));
    json_object_set_new(root, "tokenizer_class", json_string("TikTokenTokenizer"));
    json_object_set_new(root, "unk_token", json_string("[UNK]"));
    /* Marker for eaglegen: which chat template renders prompts for this model. */
    json_object_set_new(root, "eaglegen_chat_template", json_string("kimi-k2.5"));
    st = write_json(dir, "tokenizer_config.json", root, err);
    json_decref(root);
    return st;
}

static void shard_name(char *out, size_t n, int i, int total) {
    snprintf(out, n, "model-%05d-of-%05d.safetensors", i + 1, total);
}

static const char *dt_short(eg_st_dtype d) { return eg_st_dtype_name(d); }

eg_status eg_mkmodel_plan(const eg_mkmodel_opts *o, eg_mkmodel_plan_info *info, FILE *list,
                          eg_error *err) {
    mk_cfg c;
    mk_plan pl;
    eg_status st = resolve(o, &c, err);
    if (st) return st;
    int64_t sb = o->shard_bytes > 0 ? o->shard_bytes : ((int64_t)4 << 30);
    if ((st = build_plan(&c, o->seed, sb, &pl, err))) return st;
    if (list) {
        for (int64_t i = 0; i < pl.n; i++) {
            const mk_tensor *t = &pl.t[i];
            char sh[64], fn[64];
            if (t->ndim == 2)
                snprintf(sh, sizeof sh, "[%" PRId64 ", %" PRId64 "]", t->shape[0], t->shape[1]);
            else snprintf(sh, sizeof sh, "[%" PRId64 "]", t->shape[0]);
            shard_name(fn, sizeof fn, t->shard, pl.n_shards);
            fprintf(list, "%s %s %s %" PRIu64 " %s\n", t->name, dt_short(t->dtype), sh, t->bytes,
                    fn);
        }
        fprintf(list, "total: %" PRId64 " tensors, %" PRIu64 " bytes in %d shards\n", pl.n,
                pl.total, pl.n_shards);
    }
    fill_info(info, &pl, &c);
    plan_free(&pl);
    return EG_OK;
}

eg_status eg_mkmodel_run(const eg_mkmodel_opts *o, eg_mkmodel_plan_info *info, eg_error *err) {
    mk_cfg c;
    mk_plan pl;
    eg_pool *pool = NULL;
    json_t *idx = NULL;
    eg_st_writer *w = NULL;
    char *path = NULL;
    eg_status st = resolve(o, &c, err);
    if (st) return st;
    if (!o->out_dir || !*o->out_dir) return eg_fail(err, EG_ERR_INVALID, "no output directory");
    int64_t sb = o->shard_bytes > 0 ? o->shard_bytes : ((int64_t)4 << 30);
    if ((st = build_plan(&c, o->seed, sb, &pl, err))) return st;
    if ((st = mkdir_p(o->out_dir, err))) goto out;
    /* a model already in the directory is replaced: its index (or single file) goes first,
       so a loader never pairs the new config with the old tensors (--no-weights writes no
       index; an interrupted write has none yet) */
    for (int k = 0; k < 2 && !st; k++) {
        const char *name = k ? "model.safetensors" : "model.safetensors.index.json";
        size_t n = strlen(o->out_dir) + strlen(name) + 2;
        char *p = malloc(n);
        if (!p) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
        snprintf(p, n, "%s/%s", o->out_dir, name);
        if (unlink(p) && errno != ENOENT) st = eg_fail(err, EG_ERR_IO, "%s: removing the old model: %s", p, strerror(errno));
        free(p);
    }
    if (st) goto out;
    if ((st = eg_pool_create(o->threads > 0 ? o->threads : eg_num_threads(), &pool, err))) goto out;
    for (int64_t i = 0; i < pl.n; i++) pl.t[i].pool = pool;

    /* config and tokenizer first: small, and a reader fails cleanly on the missing index
     * if the shards are interrupted. */
    json_t *cfg = config_json(&c, o);
    st = write_json(o->out_dir, "config.json", cfg, err);
    json_decref(cfg);
    if (st || (st = write_tokenizer(o->out_dir, c.p.n_base, err))) goto out;
    if (o->no_weights) goto done;

    size_t plen = strlen(o->out_dir) + 64;
    if (!(path = malloc(plen))) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto out;
    }
    idx = json_object();
    json_t *wm = json_object();
    json_object_set_new(idx, "metadata", json_pack("{s:I}", "total_size", (json_int_t)pl.total));
    json_object_set_new(idx, "weight_map", wm);
    int64_t i = 0;
    for (int s = 0; s < pl.n_shards; s++) {
        char fn[64];
        shard_name(fn, sizeof fn, s, pl.n_shards);
        if ((st = eg_st_writer_new(&w, err))) goto out;
        if ((st = eg_st_writer_meta(w, "format", "pt", err))) goto out;
        uint64_t bytes = 0;
        for (; i < pl.n && pl.t[i].shard == s; i++) {
            mk_tensor *t = &pl.t[i];
            eg_st_fill_fn fill = o->sparse && t->gen != G_SHAPE ? NULL : mk_fill;
            if ((st = eg_st_writer_add_fill(w, t->name, t->dtype, t->ndim, t->shape, fill, t, err)))
                goto out;
            json_object_set_new(wm, t->name, json_string(fn));
            bytes += t->bytes;
        }
        snprintf(path, plen, "%s/%s", o->out_dir, fn);
        double t0 = eg_now();
        if ((st = eg_st_writer_write(w, path, err))) goto out;
        eg_st_writer_free(w);
        w = NULL;
        if (o->log) {
            double dt = eg_now() - t0;
            fprintf(o->log, "mkmodel: wrote %s (%.1f MB, %.1f MB/s)\n", fn, (double)bytes / 1e6,
                    dt > 0 ? (double)bytes / 1e6 / dt : 0.0);
        }
    }
    if ((st = write_json(o->out_dir, "model.safetensors.index.json", idx, err))) goto out;
done:
    fill_info(info, &pl, &c);
out:
    eg_st_writer_free(w);
    json_decref(idx);
    free(path);
    eg_pool_free(pool);
    plan_free(&pl);
    return st;
}

/* ---------------------------------------------------------------- EAGLE-3 drafter */

typedef struct dr_fill {
    uint64_t key;
    float scale; /* std of the normal draw */
    float base;  /* added (1 for norm weights) */
} dr_fill;

static eg_status dr_fill_fn(void *ctx, uint64_t offset, void *buf, size_t n, eg_error *err) {
    (void)err;
    const dr_fill *f = ctx;
    uint16_t *o = buf;
    int64_t e0 = (int64_t)(offset / 2), ne = (int64_t)(n / 2);
    for (int64_t i = 0; i < ne; i++) o[i] = eg_f32_to_bf16(f->base + f->scale * normal_at(f->key, e0 + i));
    return EG_OK;
}

eg_status eg_mkmodel_drafter(const eg_mkdrafter_opts *o, eg_error *err) {
    if (!o->target_dir || !o->out_dir) return eg_fail(err, EG_ERR_INVALID, "mkmodel drafter: target and output directories are required");
    eg_config tc;
    eg_status st = eg_config_load(o->target_dir, &tc, err);
    if (st) return eg_wrap(err, "mkmodel --drafter-for %s", o->target_dir);
    const int H = tc.hidden, V = tc.vocab, L = tc.n_layers, NH = tc.n_heads;
    const int Vd = o->draft_vocab ? o->draft_vocab : (V < 32000 ? V : 32000);
    const int NKV = NH >= 8 ? NH / 8 : (NH / 2 > 0 ? NH / 2 : 1), HD = H / NH, I = tc.inter;
    int def[3], n_aux = o->n_aux ? o->n_aux : eg_config_default_aux_layers(&tc, def);
    const int *aux = o->n_aux ? o->aux_layers : def;
    int64_t *d2t = NULL;
    uint8_t *t2d = NULL;
    eg_st_writer *w = NULL;
    json_t *root = NULL;
    dr_fill *fills = NULL, *fcn_fill = NULL; /* fcn_fill: [n_aux], fc_norm only */
    if (Vd < 1 || Vd > V) {
        st = eg_fail(err, EG_ERR_INVALID, "mkmodel drafter: draft vocabulary %d outside [1, %d] (the target's vocabulary)", Vd, V);
        goto done;
    }
    if (H % NH || HD % 2) {
        st = eg_fail(err, EG_ERR_INVALID, "mkmodel drafter: hidden %d over %d heads gives no even head_dim", H, NH);
        goto done;
    }
    for (int i = 0; i < n_aux; i++)
        if (aux[i] < 0 || aux[i] >= L || (i && aux[i] <= aux[i - 1])) {
            st = eg_fail(err, EG_ERR_INVALID, "mkmodel drafter: aux layers must be ascending, distinct, in [0, %d)", L);
            goto done;
        }
    d2t = eg_malloc(sizeof *d2t * (size_t)Vd, err);
    t2d = eg_calloc((size_t)V, 1, err);
    fills = eg_calloc(16, sizeof *fills, err);
    if (!d2t || !t2d || !fills) {
        st = EG_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < Vd; i++) {
        int64_t t = o->d2t ? i + o->d2t[i] : i;
        if (t < 0 || t >= V || t2d[t]) {
            st = eg_fail(err, EG_ERR_INVALID, "mkmodel drafter: d2t[%d] = %lld maps to target id %lld (%s)", i,
                         (long long)(t - i), (long long)t, t < 0 || t >= V ? "outside the vocabulary" : "repeated");
            goto done;
        }
        t2d[t] = 1;
        d2t[i] = t - i;
    }
    if ((st = mkdir_p(o->out_dir, err)) || (st = eg_st_writer_new(&w, err))) goto done;
    if (o->mla && (tc.kv_lora_rank < 1 || tc.qk_rope < 2 || tc.qk_nope < 1 || tc.v_head < 1)) {
        st = eg_fail(err, EG_ERR_INVALID, "mkmodel drafter: --mla needs an MLA target (kv_lora_rank and head dims)");
        goto done;
    }
    /* MLA: the target's dims; 0 rows skip a tensor (q_a/q_b without q LoRA, q_proj with it) */
    const int64_t QL = tc.q_lora_rank, C = tc.kv_lora_rank, DR = tc.qk_rope, QH = (int64_t)NH * (tc.qk_nope + DR),
                  KVB = (int64_t)NH * (tc.qk_nope + tc.v_head), OV = (int64_t)NH * tc.v_head;
    struct { const char *name; int64_t rows, cols; float scale, base; } mla_ts[] = {
        {"midlayer.self_attn.q_a_proj.weight", QL, 2 * H, 0, 0},
        {"midlayer.self_attn.q_a_layernorm.weight", QL, 0, 0.05f, 1},
        {"midlayer.self_attn.q_b_proj.weight", QL ? QH : 0, QL, 0, 0},
        {"midlayer.self_attn.q_proj.weight", QL ? 0 : QH, 2 * H, 0, 0},
        {"midlayer.self_attn.kv_a_proj_with_mqa.weight", C + DR, 2 * H, 0, 0},
        {"midlayer.self_attn.kv_a_layernorm.weight", C, 0, 0.05f, 1},
        {"midlayer.self_attn.kv_b_proj.weight", KVB, C, 0, 0},
        {"midlayer.self_attn.o_proj.weight", H, OV, 0, 0},
    };
    dr_fill mla_fills[8];
    for (size_t i = 0; o->mla && i < sizeof mla_ts / sizeof mla_ts[0]; i++) {
        if (!mla_ts[i].rows) continue;
        mla_fills[i].key = name_key(o->seed, mla_ts[i].name);
        mla_fills[i].scale = mla_ts[i].scale > 0 ? mla_ts[i].scale : 1.0f / sqrtf((float)mla_ts[i].cols);
        mla_fills[i].base = mla_ts[i].base;
        int64_t shape[2] = {mla_ts[i].rows, mla_ts[i].cols};
        if ((st = eg_st_writer_add_fill(w, mla_ts[i].name, EG_ST_BF16, mla_ts[i].cols ? 2 : 1, shape, dr_fill_fn,
                                        &mla_fills[i], err)))
            goto done;
    }
    struct { const char *name; int64_t rows, cols; float scale, base; } ts[] = {
        {"fc.weight", H, (int64_t)n_aux * H, 0, 0},
        {"midlayer.input_layernorm.weight", H, 0, 0.05f, 1},
        {"midlayer.hidden_norm.weight", H, 0, 0.05f, 1},
        {"midlayer.self_attn.q_proj.weight", (int64_t)NH * HD, 2 * H, 0, 0},
        {"midlayer.self_attn.k_proj.weight", (int64_t)NKV * HD, 2 * H, 0, 0},
        {"midlayer.self_attn.v_proj.weight", (int64_t)NKV * HD, 2 * H, 0, 0},
        {"midlayer.self_attn.o_proj.weight", H, (int64_t)NH * HD, 0, 0},
        {"midlayer.post_attention_layernorm.weight", H, 0, 0.05f, 1},
        {"midlayer.mlp.gate_proj.weight", I, H, 0, 0},
        {"midlayer.mlp.up_proj.weight", I, H, 0, 0},
        {"midlayer.mlp.down_proj.weight", H, I, 0, 0},
        {"norm.weight", H, 0, 0.05f, 1},
        {"lm_head.weight", Vd, H, 4.0f / sqrtf((float)H), 0},
        {"embed_tokens.weight", V, H, 1.0f, 0},
    };
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        if (o->no_embed && !strcmp(ts[i].name, "embed_tokens.weight")) continue;
        if (o->mla && strstr(ts[i].name, ".self_attn.")) continue; /* the MLA layer's above */
        fills[i].key = name_key(o->seed, ts[i].name);
        fills[i].scale = ts[i].scale > 0 ? ts[i].scale : 1.0f / sqrtf((float)ts[i].cols);
        fills[i].base = ts[i].base;
        int64_t shape[2] = {ts[i].rows, ts[i].cols};
        if ((st = eg_st_writer_add_fill(w, ts[i].name, EG_ST_BF16, ts[i].cols ? 2 : 1, shape, dr_fill_fn, &fills[i], err)))
            goto done;
    }
    if (o->fc_norm && !(fcn_fill = eg_calloc((size_t)n_aux, sizeof *fcn_fill, err))) {
        st = EG_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; o->fc_norm && i < n_aux; i++) {
        char name[48];
        snprintf(name, sizeof name, "fc_norm.%d.weight", i);
        fcn_fill[i] = (dr_fill){name_key(o->seed, name), 0.05f, 1.0f};
        int64_t shape[1] = {H};
        if ((st = eg_st_writer_add_fill(w, name, EG_ST_BF16, 1, shape, dr_fill_fn, &fcn_fill[i], err))) goto done;
    }
    int64_t sd = Vd, sv = V;
    if ((st = eg_st_writer_add(w, "d2t", EG_ST_I64, 1, &sd, d2t, err)) ||
        (st = eg_st_writer_add(w, "t2d", EG_ST_BOOL, 1, &sv, t2d, err)) ||
        (st = eg_st_writer_meta(w, "format", "pt", err)))
        goto done;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", o->out_dir);
    if ((st = eg_st_writer_write(w, path, err))) goto done;
    json_t *ids = json_array();
    for (int i = 0; i < n_aux; i++) json_array_append_new(ids, json_integer(aux[i]));
    root = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:n, s:s, s:i, s:b, s:s,"
                     " s:b, s:b, s:{s:o, s:b, s:s}, s:{s:s, s:s, s:I}}",
                     "architectures", "LlamaForCausalLMEagle3", "model_type", "llama", "hidden_size", H,
                     "num_attention_heads", NH, "num_key_value_heads", NKV, "head_dim", HD, "intermediate_size", I,
                     "num_hidden_layers", 1, "vocab_size", V, "draft_vocab_size", Vd, "target_hidden_size", H,
                     "rms_norm_eps", (double)tc.rms_eps, "rope_theta", tc.rope_theta, "rope_scaling", "hidden_act",
                     "silu", "max_position_embeddings", tc.max_pos, "tie_word_embeddings", 0, "torch_dtype", "bfloat16",
                     "attention_bias", 0, "norm_before_residual", 0, "eagle_config",
                     "eagle_aux_hidden_state_layer_ids", ids, "use_aux_hidden_state", 1, "eaglegen_aux_convention",
                     "output_of_layer", "eaglegen", "drafter_for", tc.model_type, "target_config_sha256", tc.hash,
                     "seed", (json_int_t)o->seed);
    if (!root) {
        st = eg_fail(err, EG_ERR_NOMEM, "mkmodel drafter: building config.json");
        goto done;
    }
    if (o->fc_norm) json_object_set_new(root, "fc_norm", json_true());
    if (o->mla) { /* vLLM's DeepSeek EAGLE-3 layout: the target's model_type and MLA keys */
        json_object_set_new(root, "architectures", json_pack("[s]", "Eagle3DeepseekV2ForCausalLM"));
        json_object_set_new(root, "model_type", json_string(tc.model_type));
        json_object_del(root, "num_key_value_heads");
        json_object_del(root, "head_dim");
        json_object_set_new(root, "q_lora_rank", QL ? json_integer(QL) : json_null());
        json_object_set_new(root, "kv_lora_rank", json_integer(C));
        json_object_set_new(root, "qk_nope_head_dim", json_integer(tc.qk_nope));
        json_object_set_new(root, "qk_rope_head_dim", json_integer(DR));
        json_object_set_new(root, "v_head_dim", json_integer(tc.v_head));
        json_object_set_new(root, "first_k_dense_replace", json_integer(1));
        json_object_set_new(root, "moe_layer_freq", json_integer(1));
        json_object_set_new(root, "rope_scaling",
                            tc.yarn ? json_pack("{s:s, s:f, s:i, s:f, s:f, s:f, s:f}", "type", "yarn", "factor",
                                                tc.yarn_factor, "original_max_position_embeddings", tc.orig_max_pos,
                                                "beta_fast", tc.beta_fast, "beta_slow", tc.beta_slow, "mscale",
                                                tc.mscale, "mscale_all_dim", tc.mscale_all_dim)
                                    : json_null());
    }
    st = write_json(o->out_dir, "config.json", root, err);
done:
    json_decref(root);
    eg_st_writer_free(w);
    free(fills);
    free(fcn_fill);
    free(d2t);
    free(t2d);
    eg_config_free(&tc);
    return st;
}
