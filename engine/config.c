/* config.json parsing and the YaRN helpers; see config.h.
 *
 * YaRN on/off: DeepSeek-V3's reference (inference/model.py) blends inv_freq and scales
 * the softmax only when `max_seq_len > original_seq_len`. Its max_seq_len is the
 * serving context; for a checkpoint the equivalent is max_position_embeddings, so
 * cfg->yarn is 1 exactly when rope_scaling.type is "yarn" AND max_position_embeddings >
 * original_max_position_embeddings (true for every real Kimi/DeepSeek config and for
 * the fixtures: 2048 > 32). When it is 0 the helpers give plain RoPE (inv_freq =
 * theta^(-2i/d), factors 1). */
#include "engine/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/eg_hash.h"

void eg_config_free(eg_config *cfg) {
    if (!cfg) return;
    free(cfg->eos_ids);
    cfg->eos_ids = NULL;
    cfg->n_eos = 0;
}

/* ---- field readers: every error names the field ---- */

typedef struct cfgp {
    const char *what;
    const char *scope; /* "text_config." or "" */
    eg_error *err;
} cfgp;

/* Key k of o, or NULL when absent or null; then -1 (error filled) if it is required. */
static json_t *get_key(cfgp *p, json_t *o, const char *k, int required, int *rc) {
    json_t *v = json_object_get(o, k);
    *rc = 0;
    if (v && !json_is_null(v)) return v;
    if (required) *rc = -1, eg_fail(p->err, EG_ERR_CONFIG, "%s: missing %s%s", p->what, p->scope, k);
    return NULL;
}

static int get_int(cfgp *p, json_t *o, const char *k, int required, int def, int minv, int *out) {
    int rc;
    json_t *v = get_key(p, o, k, required, &rc);
    if (!v) {
        if (!rc) *out = def;
        return rc;
    }
    json_int_t x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
             fabs(json_real_value(v)) < 1e15)
        x = (json_int_t)json_real_value(v);
    else {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %s%s must be an integer", p->what, p->scope, k);
        return -1;
    }
    if (x < minv || x > 1000000000) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %s%s = %lld out of range (min %d)", p->what, p->scope,
                k, (long long)x, minv);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int get_num(cfgp *p, json_t *o, const char *k, int required, double def, double *out) {
    int rc;
    json_t *v = get_key(p, o, k, required, &rc);
    if (!v) {
        if (!rc) *out = def;
        return rc;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v))) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %s%s must be a number", p->what, p->scope, k);
        return -1;
    }
    *out = json_number_value(v);
    return 0;
}

static int get_bool(cfgp *p, json_t *o, const char *k, int def, int *out) {
    int rc;
    json_t *v = get_key(p, o, k, 0, &rc);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %s%s must be true or false", p->what, p->scope, k);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* A string field that, when present, must equal one of the allowed values. */
static int want_str(cfgp *p, json_t *o, const char *k, const char *allowed, const char *allowed2) {
    int rc;
    json_t *v = get_key(p, o, k, 0, &rc);
    if (!v) return 0;
    if (!json_is_string(v)) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %s%s must be a string", p->what, p->scope, k);
        return -1;
    }
    const char *s = json_string_value(v);
    if (!strcmp(s, allowed) || (allowed2 && !strcmp(s, allowed2))) return 0;
    eg_fail(p->err, EG_ERR_CONFIG, "%s: unsupported %s%s = \"%.60s\" (only \"%s\" is supported)",
            p->what, p->scope, k, s, allowed);
    return -1;
}

static int parse_rope(cfgp *p, json_t *tc, eg_config *c) {
    const char *fname = "rope_scaling";
    json_t *rs = json_object_get(tc, "rope_scaling");
    if (!rs || json_is_null(rs)) {
        rs = json_object_get(tc, "rope_parameters");
        fname = "rope_parameters";
    }
    if (get_num(p, tc, "rope_theta", 0, 10000.0, &c->rope_theta)) return -1;
    c->yarn = 0;
    c->yarn_factor = 1.0;
    c->beta_fast = 32.0;
    c->beta_slow = 1.0;
    c->mscale = 1.0;
    c->mscale_all_dim = 0.0;
    c->orig_max_pos = c->max_pos;
    if (!rs || json_is_null(rs)) goto done;
    if (!json_is_object(rs)) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %s%s must be an object", p->what, p->scope, fname);
        return -1;
    }
    /* transformers >= 4.5x moves rope_theta into rope_parameters */
    if (!json_object_get(tc, "rope_theta") && json_object_get(rs, "rope_theta")) {
        char sc[64];
        snprintf(sc, sizeof sc, "%s%s.", p->scope, fname);
        cfgp q = {p->what, sc, p->err};
        if (get_num(&q, rs, "rope_theta", 1, 0, &c->rope_theta)) return -1;
    }
    json_t *ty = json_object_get(rs, "type");
    const char *tname = "type";
    if (!ty || json_is_null(ty)) {
        ty = json_object_get(rs, "rope_type");
        tname = "rope_type";
    }
    const char *t = json_is_string(ty) ? json_string_value(ty) : NULL;
    if (ty && !json_is_null(ty) && !t) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %s%s.%s must be a string", p->what, p->scope, fname,
                tname);
        return -1;
    }
    if (!t || !strcmp(t, "default")) goto done;
    if (strcmp(t, "yarn") != 0) {
        eg_fail(p->err, EG_ERR_CONFIG,
                "%s: unsupported %s%s.%s = \"%.40s\" (supported: yarn, default)", p->what,
                p->scope, fname, tname, t);
        return -1;
    }
    char sc[64];
    snprintf(sc, sizeof sc, "%s%s.", p->scope, fname);
    cfgp q = {p->what, sc, p->err};
    if (get_num(&q, rs, "factor", 1, 1.0, &c->yarn_factor) ||
        get_num(&q, rs, "beta_fast", 0, 32.0, &c->beta_fast) ||
        get_num(&q, rs, "beta_slow", 0, 1.0, &c->beta_slow) ||
        get_num(&q, rs, "mscale", 0, 1.0, &c->mscale) ||
        get_num(&q, rs, "mscale_all_dim", 0, 0.0, &c->mscale_all_dim) ||
        get_int(&q, rs, "original_max_position_embeddings", 1, 0, 1, &c->orig_max_pos))
        return -1;
    if (c->yarn_factor <= 0 || c->beta_fast <= 0 || c->beta_slow <= 0) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %sfactor/beta_fast/beta_slow must be positive",
                p->what, sc);
        return -1;
    }
    c->yarn = c->max_pos > c->orig_max_pos;
done:
    /* a non-positive or absurd base gives non-finite inverse frequencies: NaN hidden states */
    if (!(c->rope_theta > 1.0) || !(c->rope_theta < 1e30)) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %srope_theta = %g is out of range (must be > 1 and < 1e30)", p->what,
                p->scope, c->rope_theta);
        return -1;
    }
    return 0;
}

static int parse_quant(cfgp *p, json_t *q, const char *qscope, eg_config *c) {
    char sc[96];
    snprintf(sc, sizeof sc, "%squantization_config.", qscope);
    cfgp r = {p->what, sc, p->err};
    if (!json_is_object(q)) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %squantization_config must be an object", p->what,
                qscope);
        return -1;
    }
    json_t *m = json_object_get(q, "quant_method");
    if (!json_is_string(m)) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: missing %squant_method", p->what, sc);
        return -1;
    }
    const char *meth = json_string_value(m);
    if (!strcmp(meth, "fp8")) {
        if (want_str(&r, q, "fmt", "e4m3", NULL)) return -1;
        json_t *bs = json_object_get(q, "weight_block_size");
        if (bs && !json_is_null(bs)) {
            if (!json_is_array(bs) || json_array_size(bs) != 2 ||
                json_integer_value(json_array_get(bs, 0)) != 128 ||
                json_integer_value(json_array_get(bs, 1)) != 128) {
                eg_fail(p->err, EG_ERR_CONFIG,
                        "%s: unsupported %sweight_block_size (only [128, 128] is supported)",
                        p->what, sc);
                return -1;
            }
        }
        if (want_str(&r, q, "activation_scheme", "dynamic", NULL)) return -1;
        c->expert_format = EG_EXPERTS_FP8_BLOCK;
        return 0;
    }
    if (strcmp(meth, "compressed-tensors") != 0) {
        eg_fail(p->err, EG_ERR_CONFIG,
                "%s: unsupported %squant_method = \"%.40s\" (supported: compressed-tensors "
                "pack-quantized INT4, fp8)",
                p->what, sc, meth);
        return -1;
    }
    json_t *fmt = json_object_get(q, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "pack-quantized") != 0) {
        eg_fail(p->err, EG_ERR_CONFIG,
                "%s: unsupported %sformat = \"%.40s\" (only \"pack-quantized\" is supported)",
                p->what, sc, json_is_string(fmt) ? json_string_value(fmt) : "(missing)");
        return -1;
    }
    json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: missing %sconfig_groups", p->what, sc);
        return -1;
    }
    const char *gname;
    json_t *g;
    int group = 0;
    json_object_foreach(groups, gname, g) {
        char gs[160];
        snprintf(gs, sizeof gs, "%sconfig_groups.%.40s.weights.", sc, gname);
        cfgp w = {p->what, gs, p->err};
        json_t *wt = json_is_object(g) ? json_object_get(g, "weights") : NULL;
        if (!json_is_object(wt)) {
            eg_fail(p->err, EG_ERR_CONFIG, "%s: missing %sconfig_groups.%.40s.weights", p->what, sc,
                    gname);
            return -1;
        }
        json_t *ia = json_object_get(g, "input_activations");
        if (ia && !json_is_null(ia)) {
            eg_fail(p->err, EG_ERR_CONFIG,
                    "%s: unsupported %sconfig_groups.%.40s.input_activations (only weight-only "
                    "quantisation is supported)",
                    p->what, sc, gname);
            return -1;
        }
        int bits, sym, gsz, dyn;
        if (get_int(&w, wt, "num_bits", 1, 0, 1, &bits)) return -1;
        if (bits != 4) {
            eg_fail(p->err, EG_ERR_CONFIG, "%s: unsupported %snum_bits = %d (only 4)", p->what, gs,
                    bits);
            return -1;
        }
        if (want_str(&w, wt, "type", "int", NULL) || want_str(&w, wt, "strategy", "group", NULL) ||
            get_bool(&w, wt, "symmetric", 0, &sym) || get_bool(&w, wt, "dynamic", 0, &dyn) ||
            get_int(&w, wt, "group_size", 1, 0, 1, &gsz))
            return -1;
        if (!sym) {
            eg_fail(p->err, EG_ERR_CONFIG,
                    "%s: unsupported %ssymmetric = false (only symmetric INT4)", p->what, gs);
            return -1;
        }
        if (dyn) {
            eg_fail(p->err, EG_ERR_CONFIG, "%s: unsupported %sdynamic = true", p->what, gs);
            return -1;
        }
        json_t *ao = json_object_get(wt, "actorder");
        if (ao && !json_is_null(ao) && !(json_is_false(ao))) {
            eg_fail(p->err, EG_ERR_CONFIG, "%s: unsupported %sactorder", p->what, gs);
            return -1;
        }
        if (group && gsz != group) {
            eg_fail(p->err, EG_ERR_CONFIG, "%s: %sconfig_groups use different group_size values",
                    p->what, sc);
            return -1;
        }
        group = gsz;
    }
    c->expert_format = EG_EXPERTS_INT4;
    c->quant_group = group;
    /* The loader detects each tensor's format itself; this flag only records that the
     * ignore list keeps attention, shared experts, dense MLPs and lm_head unquantised,
     * as Kimi-K2.5 ships it. */
    json_t *ign = json_object_get(q, "ignore");
    int a = 0, s = 0, l = 0;
    if (json_is_array(ign)) {
        size_t i;
        json_t *e;
        json_array_foreach(ign, i, e) {
            const char *x = json_is_string(e) ? json_string_value(e) : "";
            a |= strstr(x, "self_attn") != NULL;
            s |= strstr(x, "shared_experts") != NULL;
            l |= strstr(x, "lm_head") != NULL;
        }
    }
    c->quant_ignore_all_but_experts = a && s && l;
    return 0;
}

static int parse_eos(cfgp *p, json_t *tc, json_t *root, eg_config *c) {
    json_t *e = json_object_get(tc, "eos_token_id");
    if (!e || json_is_null(e)) e = json_object_get(root, "eos_token_id");
    if (!e || json_is_null(e)) return 0;
    size_t n = json_is_array(e) ? json_array_size(e) : 1;
    c->eos_ids = calloc(n ? n : 1, sizeof *c->eos_ids);
    if (!c->eos_ids) {
        eg_fail(p->err, EG_ERR_NOMEM, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(e) ? json_array_get(e, i) : e;
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= c->vocab) {
            eg_fail(p->err, EG_ERR_CONFIG,
                    "%s: eos_token_id must be an id or a list of ids below vocab_size %d",
                    p->what, c->vocab);
            return -1;
        }
        c->eos_ids[c->n_eos++] = (int)json_integer_value(v);
    }
    return 0;
}

static int parse_all(cfgp *p, json_t *root, eg_config *c) {
    if (!json_is_object(root)) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: not a JSON object", p->what);
        return -1;
    }
    json_t *tc = json_object_get(root, "text_config");
    if (tc && !json_is_null(tc)) {
        if (!json_is_object(tc)) {
            eg_fail(p->err, EG_ERR_CONFIG, "%s: text_config must be an object", p->what);
            return -1;
        }
        p->scope = "text_config.";
    } else {
        tc = root;
        p->scope = "";
    }
    json_t *mt = json_object_get(tc, "model_type");
    if (!json_is_string(mt)) mt = json_object_get(root, "model_type");
    snprintf(c->model_type, sizeof c->model_type, "%s",
             json_is_string(mt) ? json_string_value(mt) : "");

    if (want_str(p, tc, "hidden_act", "silu", NULL) ||
        want_str(p, tc, "scoring_func", "sigmoid", NULL) ||
        want_str(p, tc, "topk_method", "noaux_tc", NULL))
        return -1;
    int attn_bias = 0;
    if (get_bool(p, tc, "attention_bias", 0, &attn_bias)) return -1;
    if (attn_bias) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: unsupported %sattention_bias = true", p->what,
                p->scope);
        return -1;
    }
    double eps = 1e-6, rsf = 1.0;
    if (get_int(p, tc, "hidden_size", 1, 0, 1, &c->hidden) ||
        get_int(p, tc, "num_hidden_layers", 1, 0, 1, &c->n_layers) ||
        get_int(p, tc, "num_attention_heads", 1, 0, 1, &c->n_heads) ||
        get_int(p, tc, "q_lora_rank", 0, 0, 0, &c->q_lora_rank) ||
        get_int(p, tc, "kv_lora_rank", 1, 0, 1, &c->kv_lora_rank) ||
        get_int(p, tc, "qk_nope_head_dim", 1, 0, 1, &c->qk_nope) ||
        get_int(p, tc, "qk_rope_head_dim", 1, 0, 2, &c->qk_rope) ||
        get_int(p, tc, "v_head_dim", 1, 0, 1, &c->v_head) ||
        get_int(p, tc, "intermediate_size", 1, 0, 1, &c->inter) ||
        get_int(p, tc, "n_routed_experts", 0, 0, 0, &c->n_experts) ||
        get_int(p, tc, "moe_intermediate_size", c->n_experts > 0, 0, 1, &c->moe_inter) ||
        get_int(p, tc, "n_shared_experts", 0, 0, 0, &c->n_shared) ||
        get_int(p, tc, "num_experts_per_tok", c->n_experts > 0, 0, 1, &c->topk) ||
        get_int(p, tc, "n_group", 0, 1, 1, &c->n_group) ||
        get_int(p, tc, "topk_group", 0, 1, 1, &c->topk_group) ||
        get_num(p, tc, "routed_scaling_factor", 0, 1.0, &rsf) ||
        get_bool(p, tc, "norm_topk_prob", 1, &c->norm_topk) ||
        get_int(p, tc, "first_k_dense_replace", 0, 0, 0, &c->first_dense) ||
        get_int(p, tc, "moe_layer_freq", 0, 1, 1, &c->moe_freq) ||
        get_int(p, tc, "max_position_embeddings", 0, 4096, 1, &c->max_pos) ||
        get_num(p, tc, "rms_norm_eps", 0, 1e-6, &eps) ||
        get_int(p, tc, "vocab_size", 1, 0, 1, &c->vocab) ||
        get_bool(p, tc, "tie_word_embeddings", -1, &c->tie_embeddings))
        return -1;
    /* Multimodal wrappers often state tie_word_embeddings only at the top level. */
    if (c->tie_embeddings < 0) {
        cfgp r = {p->what, "", p->err};
        if (get_bool(&r, root, "tie_word_embeddings", 0, &c->tie_embeddings)) return -1;
    }
    c->routed_scale = (float)rsf;
    c->rms_eps = (float)eps;
    /* both are used as float: a value that does not survive the cast is refused here */
    if (!(eps > 0) || !(rsf > 0) || !(eps < 1) || !(rsf < 1e6) || !(c->rms_eps > 0)) {
        eg_fail(p->err, EG_ERR_CONFIG,
                "%s: %srms_norm_eps = %g and routed_scaling_factor = %g must lie in (1e-38, 1) and (0, 1e6)",
                p->what, p->scope, eps, rsf);
        return -1;
    }
    if (c->qk_rope % 2) {
        eg_fail(p->err, EG_ERR_CONFIG, "%s: %sqk_rope_head_dim must be even", p->what, p->scope);
        return -1;
    }
    if (c->n_experts > 0) {
        if (c->topk > c->n_experts) {
            eg_fail(p->err, EG_ERR_CONFIG, "%s: %snum_experts_per_tok %d > n_routed_experts %d",
                    p->what, p->scope, c->topk, c->n_experts);
            return -1;
        }
        if (c->n_experts % c->n_group || c->topk_group > c->n_group ||
            (c->n_group > 1 && c->n_experts / c->n_group < 2) ||
            c->topk > c->topk_group * (c->n_experts / c->n_group)) {
            eg_fail(p->err, EG_ERR_CONFIG,
                    "%s: inconsistent %sn_group = %d / topk_group = %d for %d experts top-%d",
                    p->what, p->scope, c->n_group, c->topk_group, c->n_experts, c->topk);
            return -1;
        }
    }
    {
        json_t *b = json_object_get(tc, "bos_token_id");
        if (!json_is_integer(b)) b = json_object_get(root, "bos_token_id");
        c->bos_id = json_is_integer(b) ? (int)json_integer_value(b) : -1;
    }
    if (parse_rope(p, tc, c) || parse_eos(p, tc, root, c)) return -1;
    /* Kimi-K2.5 may put quantization_config inside text_config or at the top. */
    json_t *q = json_object_get(tc, "quantization_config");
    const char *qs = p->scope;
    if (!q || json_is_null(q)) {
        q = json_object_get(root, "quantization_config");
        qs = "";
    }
    c->expert_format = EG_EXPERTS_DENSE;
    if (q && !json_is_null(q) && parse_quant(p, q, qs, c)) return -1;
    return 0;
}

eg_status eg_config_parse(const char *json, size_t len, const char *what, eg_config *cfg,
                          eg_error *err) {
    memset(cfg, 0, sizeof *cfg);
    if (!what) what = "config.json";
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return eg_fail(err, EG_ERR_FORMAT, "%s: bad JSON at line %d column %d: %s", what, je.line,
                       je.column, je.text);
    cfgp p = {what, "", err};
    int bad = parse_all(&p, root, cfg);
    json_decref(root);
    if (bad) {
        eg_config_free(cfg);
        return err ? err->code : EG_ERR_CONFIG;
    }
    eg_sha256_hex(json, len, cfg->hash);
    return EG_OK;
}

eg_status eg_config_load(const char *dir, eg_config *cfg, eg_error *err) {
    memset(cfg, 0, sizeof *cfg);
    size_t pl = strlen(dir) + 16;
    char *path = malloc(pl);
    if (!path) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    snprintf(path, pl, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        eg_status s = eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
        free(path);
        return s;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            if (cap > ((size_t)64 << 20)) break; /* a config.json is a few KB */
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    int rerr = ferror(f) || !feof(f);
    fclose(f);
    eg_status st;
    if (rerr) st = eg_fail(err, EG_ERR_IO, "%s: read failed or file too large", path);
    else st = eg_config_parse(buf ? buf : "", n, path, cfg, err);
    free(buf);
    free(path);
    return st;
}

/* ---- RoPE / YaRN ---- */

double eg_yarn_mscale(double factor, double m) {
    if (factor <= 1.0) return 1.0;
    return 0.1 * m * log(factor) + 1.0;
}

double eg_config_softmax_scale(const eg_config *c) {
    double s = 1.0 / sqrt((double)(c->qk_nope + c->qk_rope));
    if (c->yarn) {
        double m = eg_yarn_mscale(c->yarn_factor, c->mscale_all_dim);
        s *= m * m;
    }
    return s;
}

double eg_config_rope_attn_factor(const eg_config *c) {
    if (!c->yarn) return 1.0;
    return eg_yarn_mscale(c->yarn_factor, c->mscale) /
           eg_yarn_mscale(c->yarn_factor, c->mscale_all_dim);
}

/* DeepSeek-V3 inference/model.py precompute_freqs_cis, in double. */
static double find_correction_dim(double rot, int dim, double base, double max_seq) {
    return dim * log(max_seq / (rot * 2.0 * M_PI)) / (2.0 * log(base));
}

void eg_config_rope_inv_freq(const eg_config *c, double *out) {
    const int dim = c->qk_rope, half = dim / 2;
    const double base = c->rope_theta;
    for (int i = 0; i < half; i++) out[i] = 1.0 / pow(base, (double)(2 * i) / dim);
    if (!c->yarn) return;
    double lo = floor(find_correction_dim(c->beta_fast, dim, base, c->orig_max_pos));
    double hi = ceil(find_correction_dim(c->beta_slow, dim, base, c->orig_max_pos));
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double smooth = 1.0 - ramp;
        out[i] = out[i] / c->yarn_factor * (1.0 - smooth) + out[i] * smooth;
    }
}

int eg_config_default_aux_layers(const eg_config *c, int out[3]) {
    int L = c->n_layers, v[3] = {1, L / 2 - 1, L - 4}, n = 0;
    for (int i = 0; i < 3; i++) {
        if (v[i] < 0) v[i] = 0;
        if (v[i] > L - 1) v[i] = L - 1;
    }
    /* sort 3 values, then drop repeats */
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (v[j] < v[i]) {
                int t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
    for (int i = 0; i < 3; i++)
        if (!n || out[n - 1] != v[i]) out[n++] = v[i];
    return n;
}
