/* Loader robustness: models rebuilt from the fixtures with one defect each (missing
 * tensor, wrong shape, wrong dtype, bad INT4/FP8 companions, truncated shard, corrupt
 * header, bad JSON, unsupported config) must fail with a message naming the tensor and
 * the file, never crash; and the layouts that must load do (single model.safetensors
 * without the language_model. prefix, tied embeddings, ignored vision/MTP tensors). */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/safetensors.h"
#include "engine/weights.h"
#include "tests/check.h"

#define FIX "../shared/fixtures/models"


static void write_all(const char *p, const void *d, size_t n) {
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fwrite(d, 1, n, f);
    fclose(f);
}

/* One defect (or layout change) applied while copying a fixture. */
typedef struct mut {
    const char *drop[4];         /* tensors left out of their shard */
    int drop_index;              /* ... and out of the index too */
    const char *reshape;         /* same bytes, new shape */
    int ndim;
    int64_t shape[2];
    const char *redtype;         /* same bytes, new dtype (same element size) */
    eg_st_dtype dtype;
    const char *replace;         /* same dtype/shape, new bytes */
    const void *replace_data;
    const char *add_name;        /* extra tensor, bytes/dtype/shape of add_from */
    const char *add_from;
    int extras;                  /* vision tower, projector, MTP layer, rotary inv_freq */
    int single;                  /* one model.safetensors, no index */
    int strip;                   /* drop the language_model. prefix */
    const char *cfg_from, *cfg_to; /* textual edit of config.json */
} mut;

typedef struct src_t {
    eg_st_file *f[8];
    int nf;
} src_t;

static const eg_st_tensor *src_find(src_t *s, const char *name) {
    for (int i = 0; i < s->nf; i++) {
        const eg_st_tensor *t = eg_st_find(s->f[i], name);
        if (t) return t;
    }
    return NULL;
}

static void put(eg_st_writer *w, const mut *m, const char *name, const eg_st_tensor *t, json_t *wm,
                const char *fname) {
    eg_error e;
    for (int i = 0; i < 4; i++)
        if (m->drop[i] && !strcmp(name, m->drop[i])) {
            if (!m->drop_index && wm) json_object_set_new(wm, name, json_string(fname));
            return;
        }
    const char *out = name;
    if (m->strip && !strncmp(name, "language_model.", 15)) out = name + 15;
    eg_st_dtype dt = t->dtype;
    int nd = t->ndim;
    const int64_t *sh = t->shape;
    const void *data = t->data;
    if (m->reshape && !strcmp(name, m->reshape)) nd = m->ndim, sh = m->shape;
    if (m->redtype && !strcmp(name, m->redtype)) dt = m->dtype;
    if (m->replace && !strcmp(name, m->replace)) data = m->replace_data;
    CHECK_OK(eg_st_writer_add(w, out, dt, nd, sh, data, &e), &e);
    if (wm) json_object_set_new(wm, out, json_string(fname));
}

/* Copy fixture `name` into a fresh temp dir with mutation m. Returns the dir (static). */
static const char *build(const char *name, const mut *m) {
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/eg_bad_XXXXXX");
    if (!mkdtemp(dir)) return NULL;
    char p[512], q[512];
    size_t n;
    snprintf(p, sizeof p, FIX "/%s/config.json", name);
    char *cfg = eg_test_read_file(p, &n);
    if (m->cfg_from) {
        char *at = strstr(cfg, m->cfg_from);
        CHECKF(at != NULL, "config edit '%s' not found", m->cfg_from);
        if (at) {
            size_t a = (size_t)(at - cfg), lf = strlen(m->cfg_from), lt = strlen(m->cfg_to);
            char *nc = malloc(n - lf + lt + 1);
            memcpy(nc, cfg, a);
            memcpy(nc + a, m->cfg_to, lt);
            memcpy(nc + a + lt, cfg + a + lf, n - a - lf + 1);
            free(cfg);
            cfg = nc;
            n = n - lf + lt;
        }
    }
    snprintf(q, sizeof q, "%s/config.json", dir);
    write_all(q, cfg, n);
    free(cfg);

    snprintf(p, sizeof p, FIX "/%s/model.safetensors.index.json", name);
    json_error_t je;
    json_t *idx = json_load_file(p, 0, &je);
    json_t *wm_in = json_object_get(idx, "weight_map");
    /* the fixture shards, in order */
    src_t s = {0};
    const char *shards[8];
    int ns = 0;
    const char *k;
    json_t *v;
    json_object_foreach(wm_in, k, v) {
        const char *fn = json_string_value(v);
        int seen = 0;
        for (int i = 0; i < ns; i++) seen |= !strcmp(shards[i], fn);
        if (!seen && ns < 8) shards[ns++] = fn;
    }
    eg_error e;
    for (int i = 0; i < ns; i++) {
        snprintf(p, sizeof p, FIX "/%s/%s", name, shards[i]);
        CHECK_OK(eg_st_open(p, &s.f[s.nf++], &e), &e);
    }
    json_t *idx_out = json_object(), *wm = json_object();
    json_object_set_new(idx_out, "metadata", json_object());
    json_object_set_new(idx_out, "weight_map", wm);
    eg_st_writer *w = NULL;
    for (int i = 0; i < ns; i++) {
        if (!w) CHECK_OK(eg_st_writer_new(&w, &e), &e);
        const char *fname = m->single ? "model.safetensors" : shards[i];
        for (int j = 0; j < eg_st_count(s.f[i]); j++) {
            const eg_st_tensor *t = eg_st_at(s.f[i], j);
            put(w, m, t->name, t, m->single ? NULL : wm, fname);
        }
        int last = i == ns - 1;
        if (last) {
            const eg_st_tensor *t0 = src_find(&s, m->add_from ? m->add_from : "");
            if (m->add_name && t0) {
                CHECK_OK(eg_st_writer_add(w, m->add_name, t0->dtype, t0->ndim, t0->shape, t0->data, &e), &e);
                if (!m->single) json_object_set_new(wm, m->add_name, json_string(fname));
            }
            if (m->extras) {
                static const float junk[6] = {1, 2, 3, 4, 5, 6};
                static const char *const xn[] = {
                    "vision_tower.encoder.blocks.0.wqkv.weight", "mm_projector.proj.0.weight",
                    "language_model.model.layers.0.self_attn.rotary_emb.inv_freq",
                    "language_model.model.layers.99.self_attn.q_a_proj.weight",
                    "language_model.model.layers.99.eh_proj.weight"};
                int64_t sh[1] = {6};
                for (size_t x = 0; x < sizeof xn / sizeof xn[0]; x++) {
                    CHECK_OK(eg_st_writer_add(w, xn[x], EG_ST_F32, 1, sh, junk, &e), &e);
                    if (!m->single) json_object_set_new(wm, xn[x], json_string(fname));
                }
            }
        }
        if (!m->single || last) {
            snprintf(q, sizeof q, "%s/%s", dir, fname);
            CHECK_OK(eg_st_writer_write(w, q, &e), &e);
            eg_st_writer_free(w);
            w = NULL;
        }
    }
    if (!m->single) {
        snprintf(q, sizeof q, "%s/model.safetensors.index.json", dir);
        json_dump_file(idx_out, q, JSON_INDENT(1));
    }
    json_decref(idx_out);
    json_decref(idx);
    for (int i = 0; i < s.nf; i++) eg_st_close(s.f[i]);
    return dir;
}

/* Load must fail with every needle in the message. */
static void expect_fail(const char *dir, const char *what, const char *n1, const char *n2, const char *n3) {
    eg_model m;
    eg_error e = {0};
    eg_status st = eg_model_load(dir, &m, &e);
    CHECKF(st != EG_OK, "%s: loaded", what);
    if (st == EG_OK) {
        eg_model_free(&m);
        return;
    }
    const char *nn[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (nn[i]) CHECKF(strstr(e.msg, nn[i]) != NULL, "%s: '%s' not in: %s", what, nn[i], e.msg);
    CHECK(m.layers == NULL && m.priv == NULL); /* left empty */
    eg_model_free(&m);
    if (getenv("EG_VERBOSE")) fprintf(stderr, "  %s -> %s\n", what, e.msg);
}

#define L1 "language_model.model.layers."

static void test_missing_tensor(void) {
    mut m = {.drop = {L1 "2.self_attn.kv_b_proj.weight"}};
    const char *d = build("tiny-a", &m);
    expect_fail(d, "dropped from shard", "model.layers.2.self_attn.kv_b_proj.weight",
                "model-00001-of-00002.safetensors", "missing");
    eg_test_rm_dir(d);
    mut m2 = {.drop = {L1 "3.mlp.experts.7.down_proj.weight"}, .drop_index = 1};
    d = build("tiny-a", &m2);
    expect_fail(d, "dropped from index", "model.layers.3.mlp.experts.7.down_proj.weight",
                "model.safetensors.index.json", "missing");
    eg_test_rm_dir(d);
    /* a layer count past the checkpoint is refused before it sizes anything */
    mut m4 = {.cfg_from = "\"num_hidden_layers\": 5", .cfg_to = "\"num_hidden_layers\": 1000000000"};
    d = build("tiny-a", &m4);
    expect_fail(d, "layer count", "num_hidden_layers = 1000000000", "model.layers.999999999.input_layernorm.weight",
                NULL);
    eg_test_rm_dir(d);
    mut m3 = {.drop = {"language_model.model.norm.weight"}, .drop_index = 1, .single = 1, .strip = 1};
    d = build("tiny-a", &m3);
    expect_fail(d, "single file", "model.norm.weight", "model.safetensors", "missing");
    eg_test_rm_dir(d);
}

static void test_wrong_shape_dtype(void) {
    mut m = {.reshape = L1 "0.self_attn.q_a_proj.weight", .ndim = 2, .shape = {64, 48}};
    const char *d = build("tiny-a", &m);
    expect_fail(d, "shape", "model.layers.0.self_attn.q_a_proj.weight", "model-00001-of-00002.safetensors",
                "shape [64, 48], expected [48, 64]");
    eg_test_rm_dir(d);
    mut m2 = {.redtype = L1 "3.input_layernorm.weight", .dtype = EG_ST_I16};
    d = build("tiny-a", &m2);
    expect_fail(d, "dtype", "model.layers.3.input_layernorm.weight", "model-00002-of-00002.safetensors",
                "dtype I16");
    eg_test_rm_dir(d);
    mut m3 = {.reshape = "language_model.lm_head.weight", .ndim = 2, .shape = {256, 128}};
    d = build("tiny-a", &m3);
    expect_fail(d, "lm_head shape", "lm_head.weight", "model-00002-of-00002.safetensors", "expected [512, 64]");
    eg_test_rm_dir(d);
    mut m4 = {.redtype = L1 "1.mlp.gate.e_score_correction_bias", .dtype = EG_ST_I32};
    d = build("tiny-a", &m4);
    expect_fail(d, "bias dtype", "e_score_correction_bias", "model-00001-of-00002.safetensors", "dtype I32");
    eg_test_rm_dir(d);
}

static void test_int4_defects(void) {
    static const int32_t bad_shape[2] = {32, 65};
    mut m = {.replace = L1 "2.mlp.experts.5.gate_proj.weight_shape", .replace_data = bad_shape};
    const char *d = build("tiny-q4", &m);
    expect_fail(d, "weight_shape value", "model.layers.2.mlp.experts.5.gate_proj.weight_shape",
                "model-00002-of-00002.safetensors", "[32, 65], expected [32, 64]");
    eg_test_rm_dir(d);
    mut m2 = {.reshape = L1 "1.mlp.experts.0.down_proj.weight_scale", .ndim = 2, .shape = {32, 2}};
    d = build("tiny-q4", &m2);
    expect_fail(d, "scale shape", "model.layers.1.mlp.experts.0.down_proj.weight_scale",
                "model-00001-of-00002.safetensors", "expected [64, 1]");
    eg_test_rm_dir(d);
    mut m3 = {.redtype = L1 "1.mlp.experts.3.up_proj.weight_packed", .dtype = EG_ST_F32};
    d = build("tiny-q4", &m3);
    expect_fail(d, "packed dtype", "model.layers.1.mlp.experts.3.up_proj.weight_packed", "dtype F32", "I32");
    eg_test_rm_dir(d);
    mut m4 = {.drop = {L1 "3.mlp.experts.11.gate_proj.weight_scale"}, .drop_index = 1};
    d = build("tiny-q4", &m4);
    expect_fail(d, "no scale", "model.layers.3.mlp.experts.11.gate_proj.weight_scale", "missing", NULL);
    eg_test_rm_dir(d);
    /* a routed expert stored as BF16 although the config announces INT4 */
    mut m5 = {.drop = {L1 "1.mlp.experts.0.up_proj.weight_packed", L1 "1.mlp.experts.0.up_proj.weight_scale",
                       L1 "1.mlp.experts.0.up_proj.weight_shape"},
              .drop_index = 1,
              .add_name = L1 "1.mlp.experts.0.up_proj.weight",
              .add_from = L1 "1.mlp.shared_experts.gate_proj.weight"};
    d = build("tiny-q4", &m5);
    expect_fail(d, "unquantised expert", "model.layers.1.mlp.experts.0.up_proj.weight", "unquantised",
                "model-00002-of-00002.safetensors");
    eg_test_rm_dir(d);
    /* INT4 tensors but no quantization_config */
    mut m6 = {.cfg_from = "\"quantization_config\"", .cfg_to = "\"quantization_config_off\""};
    d = build("tiny-q4", &m6);
    expect_fail(d, "int4 without config", "model.layers.1.mlp.experts.0.gate_proj.weight_packed",
                "quantization_config", NULL);
    eg_test_rm_dir(d);
}

static void test_fp8_defects(void) {
    mut m = {.drop = {"model.layers.2.self_attn.o_proj.weight_scale_inv"}, .drop_index = 1};
    const char *d = build("tiny-fp8", &m);
    expect_fail(d, "fp8 no scale", "model.layers.2.self_attn.o_proj.weight_scale_inv", "missing", NULL);
    eg_test_rm_dir(d);
    mut m2 = {.reshape = "model.layers.0.self_attn.o_proj.weight_scale_inv", .ndim = 2, .shape = {1, 2}};
    d = build("tiny-fp8", &m2);
    expect_fail(d, "fp8 scale shape", "model.layers.0.self_attn.o_proj.weight_scale_inv",
                "model-00001-of-00002.safetensors", "expected [2, 1]");
    eg_test_rm_dir(d);
    mut m3 = {.cfg_from = "\"quant_method\": \"fp8\"", .cfg_to = "\"quant_method_x\": \"fp8\""};
    d = build("tiny-fp8", &m3);
    expect_fail(d, "fp8 method", "quant_method", NULL, NULL);
    eg_test_rm_dir(d);
    mut m4 = {.cfg_from = "\"quantization_config\"", .cfg_to = "\"quantization_config_off\""};
    d = build("tiny-fp8", &m4);
    expect_fail(d, "fp8 without config", "model.layers.0.self_attn.q_a_proj.weight", "F8_E4M3",
                "model-00001-of-00002.safetensors");
    eg_test_rm_dir(d);
    /* an FP8 norm is refused */
    mut m5 = {.redtype = "model.layers.1.self_attn.kv_a_layernorm.weight", .dtype = EG_ST_I16};
    d = build("tiny-fp8", &m5);
    expect_fail(d, "norm dtype", "kv_a_layernorm.weight", "dtype I16", NULL);
    eg_test_rm_dir(d);
}

static void test_damaged_files(void) {
    mut none = {0};
    char p[512];
    /* truncated shard: every cut point in the header region and a few in the data */
    const char *d = build("tiny-a", &none);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
    size_t n;
    char *orig = eg_test_read_file(p, &n);
    size_t cuts[] = {0, 3, 8, 9, 100, 16000, 16583, 16584, 16585, 20000, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_all(p, orig, cuts[i]);
        expect_fail(d, "truncated", "model-00002-of-00002.safetensors", NULL, NULL);
    }
    write_all(p, orig, n - 1);
    expect_fail(d, "truncated by one", "truncated", "model-00002-of-00002.safetensors", NULL);
    /* corrupt header */
    memcpy(orig + 20, "\x01\x02!!", 4);
    write_all(p, orig, n);
    expect_fail(d, "corrupt header", "corrupt header", "model-00002-of-00002.safetensors", NULL);
    memset(orig, 0xff, 8); /* absurd header length */
    write_all(p, orig, n);
    expect_fail(d, "header length", "model-00002-of-00002.safetensors", "header length", NULL);
    free(orig);
    /* a shard the index names does not exist */
    unlink(p);
    expect_fail(d, "missing shard", "model-00002-of-00002.safetensors", NULL, NULL);
    /* bad index JSON */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    write_all(p, "{\"weight_map\": {\"a\": ", 21);
    expect_fail(d, "bad index json", "model.safetensors.index.json", "bad JSON", NULL);
    write_all(p, "{\"weight_map\": {\"a\": \"../x.safetensors\"}}", 41);
    expect_fail(d, "index path escape", "../x.safetensors", NULL, NULL);
    write_all(p, "{\"weight_map\": []}", 18);
    expect_fail(d, "index not object", "weight_map", NULL, NULL);
    unlink(p);
    expect_fail(d, "no weights at all", "no model.safetensors.index.json or model.safetensors", NULL, NULL);
    /* bad config JSON / unsupported config */
    snprintf(p, sizeof p, "%s/config.json", d);
    write_all(p, "{\"text_config\": {", 17);
    expect_fail(d, "bad config json", "config.json", "bad JSON", NULL);
    unlink(p);
    expect_fail(d, "no config", "config.json", NULL, NULL);
    eg_test_rm_dir(d);
    mut sm = {.cfg_from = "\"sigmoid\"", .cfg_to = "\"softmax\""};
    d = build("tiny-a", &sm);
    expect_fail(d, "softmax", "text_config.scoring_func", "softmax", NULL);
    eg_test_rm_dir(d);
    mut rope = {.cfg_from = "\"type\": \"yarn\"", .cfg_to = "\"type\": \"dynamic\""};
    d = build("tiny-q4", &rope);
    expect_fail(d, "rope type", "rope_scaling.type", "dynamic", NULL);
    eg_test_rm_dir(d);
    mut bits = {.cfg_from = "\"num_bits\": 4", .cfg_to = "\"num_bits\": 8"};
    d = build("tiny-q4", &bits);
    expect_fail(d, "num_bits", "num_bits", NULL, NULL);
    eg_test_rm_dir(d);
    mut dup = {.add_name = "model.norm.weight", .add_from = "language_model.model.norm.weight"};
    d = build("tiny-a", &dup);
    expect_fail(d, "duplicate", "model.norm.weight", "twice", NULL);
    eg_test_rm_dir(d);
}

static void test_layouts_that_load(void) {
    eg_model ref, m;
    eg_error e = {0};
    CHECK_OK(eg_model_load(FIX "/tiny-q4", &ref, &e), &e);
    /* one model.safetensors, no prefix, extra tensors the text model ignores */
    mut m1 = {.single = 1, .strip = 1, .extras = 1};
    const char *d = build("tiny-q4", &m1);
    CHECK_OK(eg_model_load(d, &m, &e), &e);
    if (!e.code) {
        CHECK(m.weight_bytes == ref.weight_bytes);
        CHECK(eg_weight_get(&m.layers[2].experts[4].down, 60, 30) ==
              eg_weight_get(&ref.layers[2].experts[4].down, 60, 30));
        CHECK(eg_weight_get(&m.lm_head, 511, 63) == eg_weight_get(&ref.lm_head, 511, 63));
        eg_model_free(&m);
    }
    eg_test_rm_dir(d);
    /* sharded, prefixed, with extras */
    mut m2 = {.extras = 1};
    d = build("tiny-q4", &m2);
    CHECK_OK(eg_model_load(d, &m, &e), &e);
    if (!e.code) eg_model_free(&m);
    eg_test_rm_dir(d);
    /* tied embeddings: no lm_head tensor at all */
    mut m3 = {.drop = {"language_model.lm_head.weight"}, .drop_index = 1,
              .cfg_from = "\"tie_word_embeddings\": false", .cfg_to = "\"tie_word_embeddings\": true"};
    d = build("tiny-q4", &m3);
    CHECK_OK(eg_model_load(d, &m, &e), &e);
    if (!e.code) {
        CHECK(m.cfg.tie_embeddings && m.lm_head.data == m.embed.data && m.lm_head.rows == 512);
        CHECK(m.weight_bytes == ref.weight_bytes - 512 * 64 * 2);
        eg_model_free(&m);
    }
    eg_test_rm_dir(d);
    /* tie_word_embeddings true but the checkpoint has its own lm_head: the stored one */
    mut m4 = {.cfg_from = "\"tie_word_embeddings\": false", .cfg_to = "\"tie_word_embeddings\": true"};
    d = build("tiny-q4", &m4);
    CHECK_OK(eg_model_load(d, &m, &e), &e);
    if (!e.code) {
        CHECK(m.cfg.tie_embeddings && m.lm_head.data != m.embed.data);
        CHECK(eg_weight_get(&m.lm_head, 7, 9) == eg_weight_get(&ref.lm_head, 7, 9));
        CHECK(m.weight_bytes == ref.weight_bytes);
        eg_model_free(&m);
    }
    eg_test_rm_dir(d);
    eg_model_free(&ref);
}

static const eg_test tests[] = {
    {"missing_tensor", test_missing_tensor},
    {"wrong_shape_dtype", test_wrong_shape_dtype},
    {"int4_defects", test_int4_defects},
    {"fp8_defects", test_fp8_defects},
    {"damaged_files", test_damaged_files},
    {"layouts_that_load", test_layouts_that_load},
};
EG_TEST_MAIN("engine_load_bad", tests)
