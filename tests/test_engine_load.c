/* Tests for config.json parsing (variants and refusals), the YaRN helpers, loading the
 * three fixture checkpoints (known values computed independently with numpy from the
 * raw shard bytes), INT4 / FP8 dequantisation against scalar formulas, and mkmodel
 * (every preset's config parses; the kimi-k2.5 plan without writing; a tiny round trip
 * through the loader). */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/mkmodel.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "tests/check.h"

#define FIX "../shared/fixtures/models"


/* ------------------------------------------------------------ config helpers */

/* A flat DeepseekV3 config as a jansson object, mutated per case. */
static json_t *base_flat(void) {
    return json_pack(
        "{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s,"
        " s:s, s:s, s:f, s:b, s:i, s:i, s:f, s:i, s:f, s:i, s:{s:s, s:f, s:f, s:f, s:f, s:f, s:i},"
        " s:i, s:i}",
        "model_type", "deepseek_v3", "hidden_size", 64, "num_hidden_layers", 4,
        "num_attention_heads", 4, "q_lora_rank", 48, "kv_lora_rank", 32, "qk_nope_head_dim", 16,
        "qk_rope_head_dim", 8, "v_head_dim", 12, "intermediate_size", 96, "moe_intermediate_size",
        32, "n_routed_experts", 8, "n_shared_experts", 1, "num_experts_per_tok", 2, "n_group", 2,
        "topk_group", 1, "topk_method", "noaux_tc", "scoring_func", "sigmoid", "hidden_act",
        "silu", "routed_scaling_factor", 2.5, "norm_topk_prob", 1, "first_k_dense_replace", 1,
        "moe_layer_freq", 1, "rope_theta", 50000.0, "max_position_embeddings", 2048,
        "rms_norm_eps", 1e-6, "vocab_size", 512, "rope_scaling", "type", "yarn", "factor", 64.0,
        "beta_fast", 32.0, "beta_slow", 1.0, "mscale", 1.0, "mscale_all_dim", 1.0,
        "original_max_position_embeddings", 32, "bos_token_id", 1, "eos_token_id", 2);
}

static json_t *int4_quant(void) {
    return json_pack("{s:s, s:s, s:{s:{s:[s], s:n, s:{s:i, s:s, s:b, s:s, s:i, s:b}}}, s:[s,s]}",
                     "quant_method", "compressed-tensors", "format", "pack-quantized",
                     "config_groups", "group_0", "targets", "Linear", "input_activations",
                     "weights", "num_bits", 4, "type", "int", "symmetric", 1, "strategy", "group",
                     "group_size", 32, "dynamic", 0, "ignore", "re:.*self_attn.*", "lm_head");
}

static eg_status parse_obj(json_t *j, eg_config *c, eg_error *e) {
    char *s = json_dumps(j, 0);
    eg_status st = eg_config_parse(s, strlen(s), "test.json", c, e);
    free(s);
    return st;
}

/* ------------------------------------------------------------ config tests */

static void test_config_fixtures(void) {
    eg_config c;
    eg_error e = {0};
    CHECK_OK(eg_config_load(FIX "/tiny-a", &c, &e), &e);
    CHECK(c.hidden == 64 && c.n_layers == 5 && c.n_heads == 4 && c.q_lora_rank == 48);
    CHECK(c.kv_lora_rank == 32 && c.qk_nope == 16 && c.qk_rope == 8 && c.v_head == 12);
    CHECK(c.inter == 96 && c.moe_inter == 24 && c.n_experts == 16 && c.n_shared == 1);
    CHECK(c.topk == 4 && c.n_group == 4 && c.topk_group == 2 && c.first_dense == 1);
    CHECK(fabsf(c.routed_scale - 2.5f) < 1e-6f && c.norm_topk == 1 && c.moe_freq == 1);
    CHECK(c.yarn == 1 && c.yarn_factor == 64.0 && c.orig_max_pos == 32 && c.max_pos == 2048);
    CHECK(c.beta_fast == 32.0 && c.beta_slow == 1.0 && c.mscale == 1.0 && c.mscale_all_dim == 1.0);
    CHECK(c.rope_theta == 50000.0 && fabsf(c.rms_eps - 1e-5f) < 1e-12f && c.vocab == 512);
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 2 && c.bos_id == 1 && !c.tie_embeddings);
    CHECK(c.expert_format == EG_EXPERTS_DENSE && !strcmp(c.model_type, "kimi_k2"));
    CHECK(strlen(c.hash) == 64);
    eg_config_free(&c);

    CHECK_OK(eg_config_load(FIX "/tiny-q4", &c, &e), &e);
    CHECK(c.expert_format == EG_EXPERTS_INT4 && c.quant_group == 32);
    CHECK(c.quant_ignore_all_but_experts == 1);
    CHECK(c.n_experts == 12 && c.topk == 3 && c.n_group == 1 && c.moe_inter == 32);
    CHECK(fabsf(c.routed_scale - 2.827f) < 1e-6f);
    eg_config_free(&c);

    CHECK_OK(eg_config_load(FIX "/tiny-fp8", &c, &e), &e);
    CHECK(c.expert_format == EG_EXPERTS_FP8_BLOCK && c.hidden == 192 && c.vocab == 384);
    CHECK(c.yarn && c.yarn_factor == 32.0 && c.beta_fast == 1.0 && c.orig_max_pos == 16);
    CHECK(fabsf(c.rms_eps - 1e-6f) < 1e-12f);
    eg_config_free(&c);
    eg_config_free(NULL);
}

static void test_config_variants(void) {
    eg_config c;
    eg_error e = {0};
    /* flat */
    json_t *j = base_flat();
    CHECK_OK(parse_obj(j, &c, &e), &e);
    CHECK(c.hidden == 64 && c.expert_format == EG_EXPERTS_DENSE && c.n_eos == 1);
    eg_config_free(&c);
    /* q_lora_rank null -> 0 (q_proj) */
    json_object_set_new(j, "q_lora_rank", json_null());
    CHECK_OK(parse_obj(j, &c, &e), &e);
    CHECK(c.q_lora_rank == 0);
    eg_config_free(&c);
    /* eos list */
    json_object_set_new(j, "eos_token_id", json_pack("[i,i]", 2, 3));
    CHECK_OK(parse_obj(j, &c, &e), &e);
    CHECK(c.n_eos == 2 && c.eos_ids[0] == 2 && c.eos_ids[1] == 3);
    eg_config_free(&c);
    /* quantization_config in the flat (top-level) form */
    json_object_set_new(j, "quantization_config", int4_quant());
    CHECK_OK(parse_obj(j, &c, &e), &e);
    CHECK(c.expert_format == EG_EXPERTS_INT4 && c.quant_group == 32);
    CHECK(c.quant_ignore_all_but_experts == 0); /* no shared_experts pattern in this list */
    eg_config_free(&c);

    /* nested: text_config, quant at the top level */
    json_t *tc = base_flat();
    json_t *root = json_pack("{s:s, s:o, s:o, s:i}", "model_type", "kimi_k25", "text_config", tc,
                             "quantization_config", int4_quant(), "eos_token_id", 7);
    json_object_del(tc, "eos_token_id");
    CHECK_OK(parse_obj(root, &c, &e), &e);
    CHECK(c.expert_format == EG_EXPERTS_INT4 && !strcmp(c.model_type, "deepseek_v3"));
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 7); /* falls back to the top-level eos */
    CHECK(c.tie_embeddings == 0);
    eg_config_free(&c);
    /* tie_word_embeddings only at the top level is honoured; text_config's wins */
    json_object_set_new(root, "tie_word_embeddings", json_true());
    CHECK_OK(parse_obj(root, &c, &e), &e);
    CHECK(c.tie_embeddings == 1);
    eg_config_free(&c);
    json_object_set_new(tc, "tie_word_embeddings", json_false());
    CHECK_OK(parse_obj(root, &c, &e), &e);
    CHECK(c.tie_embeddings == 0);
    eg_config_free(&c);
    json_object_del(tc, "tie_word_embeddings");
    json_object_del(root, "tie_word_embeddings");
    /* quant inside text_config wins */
    json_t *q8 = int4_quant();
    json_object_set_new(tc, "quantization_config", q8);
    json_object_set_new(json_object_get(json_object_get(json_object_get(q8, "config_groups"), "group_0"), "weights"),
                        "group_size", json_integer(64));
    CHECK_OK(parse_obj(root, &c, &e), &e);
    CHECK(c.quant_group == 64);
    eg_config_free(&c);
    /* rope_parameters (newer transformers): rope_type + rope_theta inside */
    json_object_del(tc, "rope_scaling");
    json_object_del(tc, "rope_theta");
    json_object_set_new(tc, "rope_parameters",
                        json_pack("{s:s, s:f, s:f, s:i, s:f, s:f}", "rope_type", "yarn", "factor",
                                  40.0, "rope_theta", 10000.0, "original_max_position_embeddings",
                                  4096, "mscale", 0.707, "mscale_all_dim", 0.707));
    json_object_set_new(tc, "max_position_embeddings", json_integer(163840));
    CHECK_OK(parse_obj(root, &c, &e), &e);
    CHECK(c.yarn == 1 && c.yarn_factor == 40.0 && c.rope_theta == 10000.0);
    CHECK(c.beta_fast == 32.0 && c.beta_slow == 1.0 && c.orig_max_pos == 4096);
    eg_config_free(&c);
    /* default rope: no scaling */
    json_object_set_new(tc, "rope_parameters", json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", 1e6));
    CHECK_OK(parse_obj(root, &c, &e), &e);
    CHECK(c.yarn == 0 && c.rope_theta == 1e6);
    eg_config_free(&c);
    json_decref(root);

    /* fp8 at the top level */
    json_object_set_new(j, "quantization_config",
                        json_pack("{s:s, s:s, s:s, s:[i,i]}", "quant_method", "fp8", "fmt", "e4m3",
                                  "activation_scheme", "dynamic", "weight_block_size", 128, 128));
    CHECK_OK(parse_obj(j, &c, &e), &e);
    CHECK(c.expert_format == EG_EXPERTS_FP8_BLOCK);
    eg_config_free(&c);
    json_decref(j);
}

typedef void (*mut_fn)(json_t *tc);
static void m_softmax(json_t *t) { json_object_set_new(t, "scoring_func", json_string("softmax")); }
static void m_greedy(json_t *t) { json_object_set_new(t, "topk_method", json_string("greedy")); }
static void m_gelu(json_t *t) { json_object_set_new(t, "hidden_act", json_string("gelu")); }
static void m_linear(json_t *t) {
    json_object_set_new(t, "rope_scaling", json_pack("{s:s, s:f}", "type", "linear", "factor", 2.0));
}
static void m_llama3(json_t *t) {
    json_object_del(t, "rope_scaling");
    json_object_set_new(t, "rope_parameters", json_pack("{s:s}", "rope_type", "llama3"));
}
static json_t *qw(json_t *t) {
    json_t *q = int4_quant();
    json_object_set_new(t, "quantization_config", q);
    return json_object_get(json_object_get(json_object_get(q, "config_groups"), "group_0"), "weights");
}
static void m_bits8(json_t *t) { json_object_set_new(qw(t), "num_bits", json_integer(8)); }
static void m_asym(json_t *t) { json_object_set_new(qw(t), "symmetric", json_false()); }
static void m_fmt(json_t *t) {
    qw(t);
    json_object_set_new(json_object_get(t, "quantization_config"), "format", json_string("int-quantized"));
}
static void m_awq(json_t *t) {
    qw(t);
    json_object_set_new(json_object_get(t, "quantization_config"), "quant_method", json_string("awq"));
}
static void m_block64(json_t *t) {
    json_object_set_new(t, "quantization_config",
                        json_pack("{s:s, s:s, s:[i,i]}", "quant_method", "fp8", "fmt", "e4m3",
                                  "weight_block_size", 64, 64));
}
static void m_nohidden(json_t *t) { json_object_del(t, "hidden_size"); }
static void m_strhidden(json_t *t) { json_object_set_new(t, "hidden_size", json_string("64")); }
static void m_topk(json_t *t) { json_object_set_new(t, "num_experts_per_tok", json_integer(20)); }
static void m_oddrope(json_t *t) { json_object_set_new(t, "qk_rope_head_dim", json_integer(7)); }
static void m_eos(json_t *t) { json_object_set_new(t, "eos_token_id", json_integer(9999)); }
static void m_bias(json_t *t) { json_object_set_new(t, "attention_bias", json_true()); }
static void m_group(json_t *t) { json_object_set_new(t, "n_group", json_integer(3)); }
static void m_act(json_t *t) {
    json_t *w = qw(t);
    (void)w;
    json_object_set_new(json_object_get(json_object_get(json_object_get(t, "quantization_config"), "config_groups"), "group_0"),
                        "input_activations", json_pack("{s:i}", "num_bits", 8));
}
static void m_noyarnfactor(json_t *t) { json_object_del(json_object_get(t, "rope_scaling"), "factor"); }
/* numbers that parse but make every hidden state NaN or zero */
static void m_theta_neg(json_t *t) { json_object_set_new(t, "rope_theta", json_real(-50000.0)); }
static void m_theta_0(json_t *t) { json_object_set_new(t, "rope_theta", json_integer(0)); }
static void m_eps_huge(json_t *t) { json_object_set_new(t, "rms_norm_eps", json_real(1e300)); }
static void m_eps_tiny(json_t *t) { json_object_set_new(t, "rms_norm_eps", json_real(1e-300)); }
static void m_rsf_huge(json_t *t) { json_object_set_new(t, "routed_scaling_factor", json_real(1e300)); }

static void test_config_refusals(void) {
    static const struct {
        mut_fn f;
        const char *field;
    } cases[] = {
        {m_softmax, "scoring_func"}, {m_greedy, "topk_method"}, {m_gelu, "hidden_act"},
        {m_linear, "rope_scaling.type"}, {m_llama3, "rope_parameters.rope_type"},
        {m_bits8, "num_bits"}, {m_asym, "symmetric"}, {m_fmt, "quantization_config.format"},
        {m_awq, "quant_method"}, {m_block64, "weight_block_size"}, {m_nohidden, "hidden_size"},
        {m_strhidden, "hidden_size"}, {m_topk, "num_experts_per_tok"},
        {m_oddrope, "qk_rope_head_dim"}, {m_eos, "eos_token_id"}, {m_bias, "attention_bias"},
        {m_group, "n_group"}, {m_act, "input_activations"}, {m_noyarnfactor, "rope_scaling.factor"},
        {m_theta_neg, "rope_theta"}, {m_theta_0, "rope_theta"}, {m_eps_huge, "rms_norm_eps"},
        {m_eps_tiny, "rms_norm_eps"}, {m_rsf_huge, "routed_scaling_factor"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int nested = 0; nested < 2; nested++) {
            json_t *tc = base_flat(), *root = tc;
            if (nested) root = json_pack("{s:o}", "text_config", tc);
            cases[i].f(tc);
            eg_config c;
            eg_error e = {0};
            eg_status st = parse_obj(root, &c, &e);
            CHECKF(st != EG_OK, "case %s accepted", cases[i].field);
            CHECKF(strstr(e.msg, cases[i].field) != NULL, "message for %s: %s", cases[i].field, e.msg);
            if (nested && cases[i].f != m_eos)
                CHECKF(strstr(e.msg, "text_config.") != NULL, "nested message: %s", e.msg);
            CHECK(c.eos_ids == NULL);
            json_decref(root);
        }
    }
    /* bad JSON and a non-object */
    eg_config c;
    eg_error e = {0};
    CHECK(eg_config_parse("{\"hidden_size\": 64,", 19, "x.json", &c, &e) == EG_ERR_FORMAT);
    CHECK(strstr(e.msg, "x.json") != NULL);
    CHECK(eg_config_parse("[1,2]", 5, "x.json", &c, &e) != EG_OK);
    CHECK(eg_config_load("/nonexistent-dir", &c, &e) == EG_ERR_IO);
    CHECK(strstr(e.msg, "/nonexistent-dir/config.json") != NULL);
}


/* Every truncation of a real config and seeded byte mutations: no crash, and a clean
 * error or a config whose dimensions passed validation. */
static void test_config_fuzz(void) {
    FILE *fp = fopen(FIX "/tiny-q4/config.json", "rb");
    CHECK(fp != NULL);
    if (!fp) return;
    static char orig[8192];
    size_t n = fread(orig, 1, sizeof orig, fp);
    fclose(fp);
    int ok = 0;
    for (size_t cut = 0; cut < n; cut++) {
        char *b = malloc(cut ? cut : 1);
        memcpy(b, orig, cut);
        eg_config c;
        eg_error e = {0};
        if (eg_config_parse(b, cut, "cut", &c, &e) == EG_OK) ok++, eg_config_free(&c);
        else CHECK(e.msg[0] != 0);
        free(b);
    }
    CHECK(ok == 0 || ok == 1); /* only the cut before the trailing newline may parse */
    uint64_t seed = eg_test_seed(), st = seed;
    static const char tok[] = "{}[]\":,0123456789-.eEtrunlfas ";
    int accepted = 0;
    for (int it = 0; it < 3000; it++) {
        char *b = malloc(n);
        memcpy(b, orig, n);
        for (int k = 0; k < 3; k++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(st >> 33) % n;
            b[pos] = (st >> 20) & 1 ? tok[(st >> 40) % (sizeof tok - 1)] : (char)(st >> 48);
        }
        eg_config c;
        eg_error e = {0};
        if (eg_config_parse(b, n, "fuzz", &c, &e) == EG_OK) {
            accepted++;
            CHECK(c.hidden > 0 && c.n_layers > 0 && c.vocab > 0 && c.qk_rope % 2 == 0);
            CHECK(c.n_experts == 0 || (c.topk <= c.n_experts && c.n_experts % c.n_group == 0));
            for (int i = 0; i < c.n_eos; i++) CHECK(c.eos_ids[i] >= 0 && c.eos_ids[i] < c.vocab);
            eg_config_free(&c);
        } else {
            CHECK(e.msg[0] != 0);
        }
        free(b);
    }
    fprintf(stderr, "  (config fuzz seed %llu: %d of 3000 mutated configs accepted)\n",
            (unsigned long long)seed, accepted);
}

static void test_config_yarn(void) {
    eg_config c;
    eg_error e = {0};
    double f[64];
    CHECK_OK(eg_config_load(FIX "/tiny-a", &c, &e), &e);
    /* dim 8, base 5e4, original 32, beta 32/1: correction range [0, 1], so inv_freq[0]
     * keeps theta^0 and the rest are divided by the factor. */
    eg_config_rope_inv_freq(&c, f);
    CHECK(fabs(f[0] - 1.0) < 1e-15);
    for (int i = 1; i < 4; i++)
        CHECKF(fabs(f[i] - pow(50000.0, -2.0 * i / 8) / 64.0) < 1e-15, "i=%d %g", i, f[i]);
    double m = 0.1 * log(64.0) + 1.0;
    CHECK(fabs(eg_config_softmax_scale(&c) - m * m / sqrt(24.0)) < 1e-12);
    CHECK(fabs(eg_config_rope_attn_factor(&c) - 1.0) < 1e-15);
    CHECK(eg_yarn_mscale(1.0, 5.0) == 1.0 && eg_yarn_mscale(0.5, 1.0) == 1.0);
    CHECK(fabs(eg_yarn_mscale(40.0, 0.707) - (0.0707 * log(40.0) + 1)) < 1e-12);
    eg_config_free(&c);

    /* DeepSeek-V3's numbers: dim 64, base 1e4, original 4096, factor 40, beta 32/1:
     * correction dims 10.47 -> floor 10 and 22.51 -> ceil 23. */
    json_t *j = base_flat();
    json_object_set_new(j, "qk_rope_head_dim", json_integer(64));
    json_object_set_new(j, "rope_theta", json_real(10000.0));
    json_object_set_new(j, "max_position_embeddings", json_integer(163840));
    json_object_set_new(j, "rope_scaling",
                        json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:i}", "type", "yarn", "factor",
                                  40.0, "beta_fast", 32.0, "beta_slow", 1.0, "mscale", 1.0,
                                  "mscale_all_dim", 0.5, "original_max_position_embeddings", 4096));
    CHECK_OK(parse_obj(j, &c, &e), &e);
    eg_config_rope_inv_freq(&c, f);
    for (int i = 0; i < 32; i++) {
        double base = pow(10000.0, -2.0 * i / 64), ramp = (i - 10) / 13.0;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double want = base * (1 - ramp) + base / 40.0 * ramp;
        CHECKF(fabs(f[i] - want) <= 1e-15 * want + 1e-300, "i=%d got %.17g want %.17g", i, f[i], want);
    }
    CHECK(f[5] == 1.0 / pow(10000.0, 10.0 / 64));
    double m1 = 0.1 * log(40.0) + 1.0, mh = 0.05 * log(40.0) + 1.0;
    CHECK(fabs(eg_config_rope_attn_factor(&c) - m1 / mh) < 1e-12);
    CHECK(fabs(eg_config_softmax_scale(&c) - mh * mh / sqrt(16.0 + 64.0)) < 1e-12);
    eg_config_free(&c);

    /* max_position_embeddings <= original: the reference leaves RoPE unscaled. */
    json_object_set_new(j, "max_position_embeddings", json_integer(4096));
    CHECK_OK(parse_obj(j, &c, &e), &e);
    CHECK(c.yarn == 0);
    eg_config_rope_inv_freq(&c, f);
    CHECK(f[31] == 1.0 / pow(10000.0, 62.0 / 64));
    CHECK(eg_config_softmax_scale(&c) == 1.0 / sqrt(80.0) && eg_config_rope_attn_factor(&c) == 1.0);
    eg_config_free(&c);
    json_decref(j);
}

static void test_config_aux_layers(void) {
    eg_config c = {0};
    int out[3], n;
    c.n_layers = 61;
    n = eg_config_default_aux_layers(&c, out);
    CHECK(n == 3 && out[0] == 1 && out[1] == 29 && out[2] == 57);
    c.n_layers = 5;
    n = eg_config_default_aux_layers(&c, out);
    CHECK(n == 1 && out[0] == 1);
    c.n_layers = 4;
    n = eg_config_default_aux_layers(&c, out);
    CHECK(n == 2 && out[0] == 0 && out[1] == 1);
    c.n_layers = 1;
    n = eg_config_default_aux_layers(&c, out);
    CHECK(n == 1 && out[0] == 0);
}

/* ------------------------------------------------------------ fixture loading */

static void test_load_tiny_a(void) {
    eg_model m;
    eg_error e = {0};
    double t0 = eg_now();
    CHECK_OK(eg_model_load(FIX "/tiny-a", &m, &e), &e);
    if (e.code) return;
    fprintf(stderr, "  (tiny-a loaded in %.1f ms)\n", 1e3 * (eg_now() - t0));
    CHECK(m.weight_bytes == 974240); /* = index metadata.total_size: every tensor is used */
    CHECK(m.embed.fmt == EG_W_BF16 && m.embed.rows == 512 && m.embed.cols == 64);
    CHECK(fabsf(eg_weight_get(&m.embed, 3, 5) - 0.16796875f) == 0);
    CHECK(!strcmp(m.embed.name, "model.embed_tokens.weight"));
    CHECK(m.lm_head.data != m.embed.data && m.lm_head.rows == 512);
    CHECK(!m.layers[0].is_moe && m.layers[1].is_moe && m.layers[4].is_moe);
    CHECK(m.layers[0].mlp_gate.rows == 96 && m.layers[0].mlp_down.cols == 96 && !m.layers[0].experts);
    const eg_layer_w *y = &m.layers[1];
    CHECK(y->q_a.rows == 48 && y->q_a.cols == 64 && y->q_b.rows == 4 * 24 && y->q.fmt == EG_W_NONE);
    CHECK(y->kv_a.rows == 40 && y->kv_b.rows == 4 * 28 && y->kv_b.cols == 32 && y->o.cols == 48);
    CHECK(y->attn_norm.rows == 1 && y->attn_norm.cols == 64 && y->q_a_norm.cols == 48);
    CHECK(y->router.rows == 16 && y->router_bias.fmt == EG_W_F32 && y->router_bias.cols == 16);
    CHECK(fabsf(eg_weight_get(&y->router_bias, 0, 0) - -0.36990714f) < 1e-7f);
    CHECK(fabsf(eg_weight_get(&y->router_bias, 0, 2) - 0.49616235f) < 1e-7f);
    CHECK(y->sh_gate.rows == 24 && y->sh_down.cols == 24);
    CHECK(fabsf(eg_weight_get(&m.layers[4].experts[15].down, 63, 23) - -0.32617188f) < 1e-7f);
    float row[64];
    eg_weight_row(&m.embed, 3, row);
    CHECK(row[5] == eg_weight_get(&m.embed, 3, 5));
    eg_model_free(&m);
    eg_model_free(NULL);
}

/* INT4: value of (r, c) straight from the packed words, the scalar formula of the issue. */
static float int4_ref(const eg_st_tensor *packed, const eg_st_tensor *scale, int64_t r, int64_t c,
                      int64_t cols, int group) {
    int32_t w;
    memcpy(&w, (const char *)packed->data + 4 * (r * (cols / 8) + c / 8), 4);
    int nib = (int)(((uint32_t)w >> (4 * (c % 8))) & 15u);
    uint16_t s;
    memcpy(&s, (const char *)scale->data + 2 * (r * (cols / group) + c / group), 2);
    return (float)(nib - 8) * eg_bf16_to_f32(s);
}

static void test_load_tiny_q4(void) {
    eg_model m;
    eg_error e = {0};
    CHECK_OK(eg_model_load(FIX "/tiny-q4", &m, &e), &e);
    if (e.code) return;
    CHECK(m.weight_bytes == 471792);
    const eg_weight *g = &m.layers[1].experts[0].gate;
    CHECK(g->fmt == EG_W_INT4 && g->rows == 32 && g->cols == 64 && g->group == 32);
    CHECK(eg_weight_get(g, 5, 17) == 0.036376953125f);
    CHECK(m.layers[1].sh_gate.fmt == EG_W_BF16 && m.layers[1].q_a.fmt == EG_W_BF16);
    /* every routed expert weight of layer 2, element by element, against the formula
     * over the raw tensors opened separately with the safetensors reader */
    eg_st_file *f[2];
    CHECK_OK(eg_st_open(FIX "/tiny-q4/model-00001-of-00002.safetensors", &f[0], &e), &e);
    CHECK_OK(eg_st_open(FIX "/tiny-q4/model-00002-of-00002.safetensors", &f[1], &e), &e);
    int64_t checked = 0, bad = 0;
    static const char *const pn[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int ex = 0; ex < 12; ex++)
        for (int p = 0; p < 3; p++) {
            char n1[160], n2[160];
            snprintf(n1, sizeof n1, "language_model.model.layers.2.mlp.experts.%d.%s.weight_packed", ex, pn[p]);
            snprintf(n2, sizeof n2, "language_model.model.layers.2.mlp.experts.%d.%s.weight_scale", ex, pn[p]);
            const eg_st_tensor *pk = eg_st_find(f[0], n1), *sc = eg_st_find(f[0], n2);
            if (!pk) pk = eg_st_find(f[1], n1);
            if (!sc) sc = eg_st_find(f[1], n2);
            CHECK(pk && sc);
            if (!pk || !sc) continue;
            const eg_expert_w *x = &m.layers[2].experts[ex];
            const eg_weight *w = p == 0 ? &x->gate : p == 1 ? &x->up : &x->down;
            float row[64];
            for (int64_t r = 0; r < w->rows; r++) {
                eg_weight_row(w, r, row);
                for (int64_t c = 0; c < w->cols; c++) {
                    float want = int4_ref(pk, sc, r, c, w->cols, 32);
                    bad += row[c] != want || eg_weight_get(w, r, c) != want;
                    checked++;
                }
            }
        }
    CHECKF(bad == 0 && checked == 12 * 3 * 32 * 64, "%lld of %lld differ", (long long)bad, (long long)checked);
    eg_st_close(f[0]);
    eg_st_close(f[1]);
    eg_model_free(&m);

    /* synthetic: known nibbles, two groups of 32 */
    uint32_t words[2 * 8];
    uint16_t scales[2 * 2] = {eg_f32_to_bf16(0.5f), eg_f32_to_bf16(2.0f), eg_f32_to_bf16(-1.0f),
                              eg_f32_to_bf16(0.25f)};
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 8; j++) {
            uint32_t w = 0;
            for (int i = 0; i < 8; i++) w |= (uint32_t)((r * 64 + 8 * j + i) % 16) << (4 * i);
            words[r * 8 + j] = w;
        }
    eg_weight s = {.fmt = EG_W_INT4, .rows = 2, .cols = 64, .data = words, .scale = scales, .group = 32};
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 64; c++) {
            float want = (float)((r * 64 + c) % 16 - 8) * eg_bf16_to_f32(scales[r * 2 + c / 32]);
            CHECKF(eg_weight_get(&s, r, c) == want, "r%d c%d", r, c);
        }
    CHECK(eg_weight_get(&s, 0, 0) == -4.0f && eg_weight_get(&s, 0, 15) == 3.5f);
    CHECK(eg_weight_get(&s, 0, 47) == 14.0f && eg_weight_get(&s, 1, 8) == 0.0f);
    CHECK(eg_weight_bytes(&s) == 2 * 8 * 4 + 2 * 2 * 2 + 8);
}

static void test_load_tiny_fp8(void) {
    eg_model m;
    eg_error e = {0};
    CHECK_OK(eg_model_load(FIX "/tiny-fp8", &m, &e), &e);
    if (e.code) return;
    CHECK(m.weight_bytes == 2318104);
    const eg_weight *g = &m.layers[1].experts[0].gate;
    CHECK(g->fmt == EG_W_FP8 && g->rows == 144 && g->cols == 192);
    CHECK(fabs(eg_weight_get(g, 5, 17) - 0.0660209497436881) < 5e-8);
    CHECK(fabs(eg_weight_get(g, 143, 191) - -0.12850095983594656) < 5e-8);
    CHECK(fabs(eg_weight_get(g, 130, 100) - -0.06363779585808516) < 5e-8);
    CHECK(fabs(eg_weight_get(&m.layers[0].q_a, 135, 191) - -0.16532916575670242) < 5e-8);
    /* which tensors are FP8 in tiny-fp8: every linear layer; embed, norms, router, lm_head not */
    const eg_layer_w *y = &m.layers[1];
    CHECK(y->q_a.fmt == EG_W_FP8 && y->q_b.fmt == EG_W_FP8 && y->kv_a.fmt == EG_W_FP8);
    CHECK(y->kv_b.fmt == EG_W_FP8 && y->o.fmt == EG_W_FP8 && y->sh_down.fmt == EG_W_FP8);
    CHECK(m.layers[0].mlp_up.fmt == EG_W_FP8 && y->router.fmt == EG_W_BF16);
    CHECK(m.embed.fmt == EG_W_BF16 && m.lm_head.fmt == EG_W_BF16 && y->attn_norm.fmt == EG_W_BF16);
    float row[192];
    eg_weight_row(g, 130, row);
    CHECK(row[100] == eg_weight_get(g, 130, 100));
    eg_model_free(&m);

    /* synthetic 130 x 200 with 2 x 2 blocks: the block of (r, c) is (r/128, c/128) */
    static uint8_t d[130 * 200];
    float sc[4] = {1.0f, 2.0f, 4.0f, 8.0f};
    for (int i = 0; i < 130 * 200; i++) d[i] = (uint8_t)(i * 7 % 256 == 0x7f ? 0 : i * 7 % 256);
    eg_weight w = {.fmt = EG_W_FP8, .rows = 130, .cols = 200, .data = d, .scale = sc};
    int bad = 0;
    for (int r = 0; r < 130; r++)
        for (int c = 0; c < 200; c++) {
            float want = eg_fp8e4m3_to_f32(d[r * 200 + c]) * sc[(r / 128) * 2 + c / 128];
            float got = eg_weight_get(&w, r, c);
            bad += !(got == want || (isnan(got) && isnan(want)));
        }
    CHECK(bad == 0);
    CHECK(eg_weight_bytes(&w) == 130 * 200 + 16);
    /* E4M3 spot values */
    CHECK(eg_fp8e4m3_to_f32(0x38) == 1.0f && eg_fp8e4m3_to_f32(0x7e) == 448.0f);
    CHECK(eg_fp8e4m3_to_f32(0x01) == ldexpf(1.0f, -9) && eg_fp8e4m3_to_f32(0xc0) == -2.0f);
    CHECK(isnan(eg_fp8e4m3_to_f32(0x7f)));
}

/* ------------------------------------------------------------ mkmodel */

static void test_mkmodel_configs(void) {
    int n;
    const char *const *names = eg_mkmodel_presets(&n);
    CHECK(n == 3);
    for (int i = 0; i < n; i++) {
        eg_mkmodel_opts o = {.preset = names[i]};
        char *js = NULL;
        eg_error e = {0};
        eg_config c;
        CHECK_OK(eg_mkmodel_config_json(&o, &js, &e), &e);
        if (!js) continue;
        CHECK_OK(eg_config_parse(js, strlen(js), names[i], &c, &e), &e);
        CHECK(c.expert_format == EG_EXPERTS_INT4 && c.quant_group == 32 && c.quant_ignore_all_but_experts);
        CHECK(c.n_eos == 1 && c.eos_ids[0] == c.vocab - 256 + 1 && c.bos_id == c.vocab - 256);
        if (!strcmp(names[i], "kimi-k2.5")) {
            CHECK(c.hidden == 7168 && c.n_layers == 61 && c.n_heads == 64 && c.q_lora_rank == 1536);
            CHECK(c.kv_lora_rank == 512 && c.qk_nope == 128 && c.qk_rope == 64 && c.v_head == 128);
            CHECK(c.n_experts == 384 && c.topk == 8 && c.moe_inter == 2048 && c.inter == 18432);
            CHECK(c.n_shared == 1 && c.n_group == 1 && c.topk_group == 1 && c.first_dense == 1);
            CHECK(fabsf(c.routed_scale - 2.827f) < 1e-6f && c.vocab == 163840);
            CHECK(c.yarn && c.yarn_factor == 64.0 && c.orig_max_pos == 4096 && c.max_pos == 262144);
            CHECK(c.beta_fast == 1.0 && c.beta_slow == 1.0 && c.mscale_all_dim == 1.0);
            CHECK(c.eos_ids[0] == 163585);
            int aux[3];
            CHECK(eg_config_default_aux_layers(&c, aux) == 3 && aux[0] == 1 && aux[1] == 29 && aux[2] == 57);
        } else if (!strcmp(names[i], "moonlight-16b")) {
            CHECK(c.hidden == 2048 && c.n_layers == 27 && c.n_heads == 16 && c.q_lora_rank == 0);
            CHECK(c.kv_lora_rank == 512 && c.qk_rope == 64 && c.qk_nope == 128 && c.v_head == 128);
            CHECK(c.n_experts == 64 && c.topk == 6 && c.n_shared == 2 && c.moe_inter == 1408);
            CHECK(c.inter == 11264 && c.vocab == 163840 && !c.yarn && !strcmp(c.model_type, "deepseek_v3"));
            CHECK(fabsf(c.routed_scale - 2.446f) < 1e-6f);
        } else {
            CHECK(c.hidden == 64 && c.n_layers == 5 && c.vocab == 512 && c.n_group == 4 && c.yarn);
        }
        eg_config_free(&c);
        free(js);
        o.layers = 2;
        o.experts = EG_MK_EXPERTS_BF16;
        CHECK_OK(eg_mkmodel_config_json(&o, &js, &e), &e);
        CHECK_OK(eg_config_parse(js, strlen(js), names[i], &c, &e), &e);
        CHECK(c.n_layers == 2 && c.expert_format == EG_EXPERTS_DENSE);
        eg_config_free(&c);
        free(js);
    }
    eg_mkmodel_opts bad = {.preset = "kimi-k3"};
    char *js;
    eg_error e = {0};
    CHECK(eg_mkmodel_config_json(&bad, &js, &e) == EG_ERR_INVALID && strstr(e.msg, "kimi-k3"));
}

/* The full Kimi-K2.5 plan, without writing: tensor count and bytes from the dims. */
static void test_mkmodel_kimi_plan(void) {
    eg_mkmodel_opts o = {.preset = "kimi-k2.5"};
    eg_mkmodel_plan_info info;
    eg_error e = {0};
    CHECK_OK(eg_mkmodel_plan(&o, &info, NULL, &e), &e);
    const int64_t H = 7168, V = 163840, L = 61, E = 384, F = 2048, I = 18432, QL = 1536, C = 512,
                  NH = 64;
    int64_t attn = 2 * (QL * H + QL + NH * 192 * QL + (C + 64) * H + C + NH * 256 * C + H * NH * 128) + 2 * 2 * H;
    int64_t dense = 3 * 2 * I * H;
    int64_t expert = 3 * (F * H / 2 + F * H / 32 * 2 + 8); /* packed + scales + weight_shape */
    int64_t moe = 2 * E * H + 4 * E + E * expert + 3 * 2 * F * H;
    int64_t total = 2 * V * H * 2 + 2 * H + L * attn + dense + (L - 1) * moe;
    CHECKF(info.total_bytes == total, "%lld vs %lld", (long long)info.total_bytes, (long long)total);
    CHECK(info.n_tensors == 3 + 12 + (L - 1) * (9 + 2 + E * 9 + 3));
    CHECK(info.vocab == 163840 && info.n_base == 163584 && info.n_layers == 61);
    CHECK(info.n_shards == (int)((info.total_bytes + (4ll << 30) - 1) / (4ll << 30)) || info.n_shards > 1);
    fprintf(stderr, "  (kimi-k2.5 full plan: %lld tensors, %.1f GB, %d shards)\n",
            (long long)info.n_tensors, info.total_bytes / 1e9, info.n_shards);
    o.layers = 1;
    CHECK_OK(eg_mkmodel_plan(&o, &info, NULL, &e), &e);
    CHECK(info.n_tensors == 15 && info.total_bytes == 2 * V * H * 2 + 2 * H + attn + dense);
}

static int64_t file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

static void test_mkmodel_tiny_roundtrip(void) {
    char d1[] = "/tmp/eg_mk1_XXXXXX", d2[] = "/tmp/eg_mk2_XXXXXX";
    CHECK(mkdtemp(d1) && mkdtemp(d2));
    eg_error e = {0};
    eg_mkmodel_plan_info info;
    /* small shards so the index spans several files; one thread vs two must agree */
    eg_mkmodel_opts o = {.preset = "tiny", .out_dir = d1, .seed = 7, .shard_bytes = 150000, .threads = 2};
    CHECK_OK(eg_mkmodel_run(&o, &info, &e), &e);
    CHECK(info.n_shards >= 4);
    eg_mkmodel_opts o2 = o;
    o2.out_dir = d2;
    o2.shard_bytes = 0;
    o2.threads = 1;
    CHECK_OK(eg_mkmodel_run(&o2, NULL, &e), &e);
    eg_model a, b;
    CHECK_OK(eg_model_load(d1, &a, &e), &e);
    CHECK_OK(eg_model_load(d2, &b, &e), &e);
    if (e.code) return;
    CHECK(a.cfg.expert_format == EG_EXPERTS_INT4 && a.cfg.n_layers == 5 && a.cfg.vocab == 512);
    CHECK(a.weight_bytes == info.total_bytes && b.weight_bytes == info.total_bytes);
    /* identical weights whatever the threads and shard split */
    int diff = 0;
    for (int r = 0; r < 512; r++)
        for (int c = 0; c < 64; c++)
            diff += eg_weight_get(&a.lm_head, r, c) != eg_weight_get(&b.lm_head, r, c) ||
                    eg_weight_get(&a.embed, r, c) != eg_weight_get(&b.embed, r, c);
    const eg_weight *ga = &a.layers[3].experts[11].down, *gb = &b.layers[3].experts[11].down;
    CHECK(ga->fmt == EG_W_INT4 && ga->rows == 64 && ga->cols == 32);
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 32; c++) diff += eg_weight_get(ga, r, c) != eg_weight_get(gb, r, c);
    CHECK(diff == 0);
    /* scales: embed ~ N(0,1), lm_head ~ N(0, 16/H), nibbles never -8, norms near 1 */
    double s1 = 0, s2 = 0, l2 = 0;
    for (int r = 0; r < 512; r++)
        for (int c = 0; c < 64; c++) {
            double x = eg_weight_get(&a.embed, r, c), y = eg_weight_get(&a.lm_head, r, c);
            s1 += x;
            s2 += x * x;
            l2 += y * y;
        }
    double n = 512.0 * 64;
    CHECKF(fabs(s1 / n) < 0.03 && fabs(sqrt(s2 / n) - 1.0) < 0.03, "embed mean %g std %g", s1 / n, sqrt(s2 / n));
    CHECKF(fabs(sqrt(l2 / n) - 0.5) < 0.02, "lm_head std %g", sqrt(l2 / n));
    int minnib = 99, maxnib = -99;
    for (int r = 0; r < 32; r++) {
        uint32_t w;
        for (int j = 0; j < 8; j++) {
            memcpy(&w, (const char *)a.layers[1].experts[0].gate.data + 4 * (r * 8 + j), 4);
            for (int i = 0; i < 8; i++) {
                int v = (int)((w >> (4 * i)) & 15) - 8;
                minnib = v < minnib ? v : minnib;
                maxnib = v > maxnib ? v : maxnib;
            }
        }
    }
    CHECK(minnib == -7 && maxnib == 7);
    float nm = eg_weight_get(&a.layers[2].attn_norm, 0, 3);
    CHECK(nm > 0.7f && nm < 1.3f);
    CHECK(fabsf(eg_weight_get(&a.layers[2].router_bias, 0, 1)) < 0.2f);
    eg_model_free(&a);
    eg_model_free(&b);

    /* tokenizer files: 256 byte tokens, Kimi's specials at 256.. */
    char p[512];
    size_t len;
    snprintf(p, sizeof p, "%s/tiktoken.model", d1);
    char *tk = eg_test_read_file(p, &len);
    CHECK(tk && !strncmp(tk, "AA== 0\nAQ== 1\n", 14) && strstr(tk, "/w== 255\n"));
    int lines = 0;
    for (size_t i = 0; tk && i < len; i++) lines += tk[i] == '\n';
    CHECK(lines == 256);
    free(tk);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", d1);
    json_error_t je;
    json_t *tc = json_load_file(p, 0, &je);
    CHECK(tc != NULL);
    json_t *ad = json_object_get(tc, "added_tokens_decoder");
    static const struct { const char *id, *name; } sp[] = {
        {"256", "[BOS]"}, {"257", "[EOS]"}, {"258", "<|im_end|>"}, {"259", "<|im_user|>"},
        {"260", "<|im_assistant|>"}, {"266", "<|im_system|>"}, {"273", "<|im_middle|>"},
        {"278", "<think>"}, {"279", "</think>"}, {"269", "<|tool_call_begin|>"}, {"511", "[PAD]"}};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        CHECKF(!strcmp(json_string_value(json_object_get(json_object_get(ad, sp[i].id), "content")) ?: "", sp[i].name),
               "special %s", sp[i].id);
    CHECK(json_object_size(ad) == 23);
    CHECK(!strcmp(json_string_value(json_object_get(tc, "eaglegen_chat_template")) ?: "", "kimi-k2.5"));
    json_decref(tc);
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", d2);
    CHECK(file_size(p) > 0);

    /* a different seed gives different weights; bf16 experts load as DENSE */
    eg_mkmodel_opts o3 = {.preset = "tiny", .out_dir = d2, .seed = 8, .layers = 2, .experts = EG_MK_EXPERTS_BF16};
    CHECK_OK(eg_mkmodel_run(&o3, NULL, &e), &e);
    CHECK_OK(eg_model_load(d2, &b, &e), &e);
    CHECK_OK(eg_model_load(d1, &a, &e), &e);
    if (!e.code) {
        CHECK(b.cfg.n_layers == 2 && b.cfg.expert_format == EG_EXPERTS_DENSE);
        CHECK(b.layers[1].experts[3].up.fmt == EG_W_BF16 && b.layers[1].experts[3].up.rows == 32);
        CHECK(eg_weight_get(&a.embed, 0, 0) != eg_weight_get(&b.embed, 0, 0) ||
              eg_weight_get(&a.embed, 0, 1) != eg_weight_get(&b.embed, 0, 1));
        eg_model_free(&a);
        eg_model_free(&b);
    }
    eg_test_rm_dir(d1);
    eg_test_rm_dir(d2);
}


/* Kimi-K2.5's real dimensions through the loader without the data: --sparse writes the
 * shards as holes (15.5 GB apparent, a few MB on disk) with real weight_shape tensors. */
static void test_mkmodel_kimi_sparse(void) {
    char d[] = "/tmp/eg_mkk_XXXXXX";
    CHECK(mkdtemp(d) != NULL);
    eg_error e = {0};
    eg_mkmodel_plan_info info;
    eg_mkmodel_opts o = {.preset = "kimi-k2.5", .out_dir = d, .layers = 2, .sparse = 1};
    double t0 = eg_now();
    CHECK_OK(eg_mkmodel_run(&o, &info, &e), &e);
    double t1 = eg_now();
    eg_model m;
    CHECK_OK(eg_model_load(d, &m, &e), &e);
    if (!e.code) {
        fprintf(stderr, "  (kimi-k2.5 --layers 2 sparse: written in %.2f s, loaded in %.0f ms)\n",
                t1 - t0, 1e3 * (eg_now() - t1));
        CHECK(m.weight_bytes == info.total_bytes && info.n_shards == 4);
        CHECK(m.cfg.hidden == 7168 && m.cfg.n_experts == 384 && m.cfg.vocab == 163840);
        const eg_layer_w *y = &m.layers[1];
        CHECK(y->is_moe && !m.layers[0].is_moe && y->q_b.rows == 64 * 192 && y->q_b.cols == 1536);
        CHECK(y->kv_b.rows == 64 * 256 && y->kv_b.cols == 512 && y->o.rows == 7168 && y->o.cols == 8192);
        CHECK(y->experts[383].down.fmt == EG_W_INT4 && y->experts[383].down.rows == 7168);
        CHECK(y->experts[383].down.cols == 2048 && y->sh_gate.rows == 2048 && y->router.rows == 384);
        CHECK(eg_weight_get(&y->experts[100].up, 2047, 7167) == 0.0f);
        CHECK(eg_weight_get(&m.lm_head, 163839, 7167) == 0.0f);
        eg_model_free(&m);
    }
    eg_test_rm_dir(d);
}

static const eg_test tests[] = {
    {"config_fixtures", test_config_fixtures},
    {"config_variants", test_config_variants},
    {"config_refusals", test_config_refusals},
    {"config_fuzz", test_config_fuzz},
    {"config_yarn", test_config_yarn},
    {"config_aux_layers", test_config_aux_layers},
    {"load_tiny_a", test_load_tiny_a},
    {"load_tiny_q4_int4", test_load_tiny_q4},
    {"load_tiny_fp8", test_load_tiny_fp8},
    {"mkmodel_configs", test_mkmodel_configs},
    {"mkmodel_kimi_plan", test_mkmodel_kimi_plan},
    {"mkmodel_tiny_roundtrip", test_mkmodel_tiny_roundtrip},
    {"mkmodel_kimi_sparse", test_mkmodel_kimi_sparse},
};
EG_TEST_MAIN("engine_load", tests)
