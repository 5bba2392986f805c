/* Tests of `eaglegen fidelity` and its measurement caches: the FP8 E4M3 encoder, the
 * cache row layouts, that the forward pass's default (and the engine's, hence
 * generate's) cache is BF16, that the error of each cache dtype orders as its precision,
 * and that an audit finds nothing in a CPU-made dataset and finds every alteration of
 * a copy of it (states or tokens). Runs mkmodel/generate/fidelity in-process. */
#include <jansson.h>
#include <sys/stat.h>

#include "dataset/reader.h"
#include "dataset/writer.h"
#include "engine/engine.h"
#include "gen/commands.h"
#include "tests/check.h"

static char root[256];

static const char *tmp_root(void) {
    if (!root[0]) {
        snprintf(root, sizeof root, "/tmp/eg_fid_test_%d", (int)getpid());
        mkdir(root, 0755);
    }
    return root;
}

static void cleanup(void) {
    if (!root[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) fprintf(stderr, "    (could not remove %s)\n", root);
}

static int run_cmd(int (*fn)(int, char **), int argc, const char **argv) { return fn(argc, (char **)argv); }

/* The tiny model and a greedy CPU dataset from the sample corpus, made once. */
static const char *model_dir(void) {
    static char p[300];
    if (!p[0]) {
        snprintf(p, sizeof p, "%s/model", tmp_root());
        const char *av[] = {"mkmodel", "--preset", "tiny", "--out", p, "--seed", "11"};
        if (run_cmd(cmd_mkmodel, 7, av)) p[0] = 0;
    }
    return p;
}

static const char *dataset_dir(void) {
    static char p[300];
    if (!p[0] && model_dir()[0]) {
        snprintf(p, sizeof p, "%s/data", tmp_root());
        const char *av[] = {"generate", "--model", model_dir(), "--prompts", "prompts/samples/sample.jsonl", "--out", p,
                            "--max-new-tokens", "12", "--max-seq-len", "1024", "--limit", "6", "--temperature", "0",
                            "--threads", "2", "--aux-layers", "0,1"};
        if (run_cmd(cmd_generate, 19, av)) p[0] = 0;
    }
    return p;
}

/* ---- FP8 E4M3 ------------------------------------------------------------------------ */

static void t_fp8_roundtrip(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN */
        float v = eg_fp8e4m3_to_f32((uint8_t)c);
        uint8_t back = eg_f32_to_fp8e4m3(v);
        if (back != c && !(c == 0x80 && back == 0x80)) bad++;
    }
    CHECKF(bad == 0, "%d codes do not survive decode+encode", bad);
    CHECK(eg_f32_to_fp8e4m3(NAN) == 0x7f);
    CHECK(eg_f32_to_fp8e4m3(1e6f) == 0x7e && eg_f32_to_fp8e4m3(-1e6f) == 0xfe); /* saturate at 448 */
    CHECK(eg_f32_to_fp8e4m3(INFINITY) == 0x7e);
    CHECK(eg_f32_to_fp8e4m3(464.0f) == 0x7e); /* past the last code still saturates */
}

static void t_fp8_round_to_nearest_even(void) {
    int bad = 0;
    for (int c = 0; c < 0x7e; c++) {
        float a = eg_fp8e4m3_to_f32((uint8_t)c), b = eg_fp8e4m3_to_f32((uint8_t)(c + 1));
        float mid = 0.5f * (a + b);
        uint8_t want = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c; /* tie: the even code */
        if (eg_f32_to_fp8e4m3(mid) != want) bad++;
        if (eg_f32_to_fp8e4m3(nextafterf(mid, a)) != c || eg_f32_to_fp8e4m3(nextafterf(mid, b)) != c + 1) bad++;
        if (eg_f32_to_fp8e4m3(-mid) != (want | 0x80)) bad++;
    }
    CHECKF(bad == 0, "%d rounding cases wrong", bad);
    CHECK(eg_f32_to_fp8e4m3(0x1p-10f) == 0x00);  /* half the smallest subnormal: tie to 0 */
    CHECK(eg_f32_to_fp8e4m3(0x1.8p-10f) == 0x01);
}

static void t_row_layouts(void) {
    /* Kimi-K2.5: C 512, DR 64 */
    CHECK(eg_kv_row_bytes(EG_KV_BF16, 512, 64) == 1152);
    CHECK(eg_kv_row_bytes(EG_KV_FP32, 512, 64) == 2304);
    CHECK(eg_kv_row_bytes(EG_KV_FP8, 512, 64) == 576);
    CHECK(eg_kv_row_bytes(EG_KV_FP8_TILE, 512, 64) == 656); /* 512 e4m3 + 4 scales + 64 bf16 */
    CHECK(eg_kv_row_bytes(EG_KV_FP8_TILE, 32, 8) == 32 + 4 + 16);
    CHECK(eg_kv_row_bytes(EG_KV_FP8, 30, 7) == 40); /* padded to 4 bytes */
}

/* ---- the cache dtypes through the forward pass ------------------------------------------ */

typedef struct fwd_run {
    float *x;       /* [L][T][H] */
    float *logits;  /* [T][V] */
    uint8_t *rows;  /* [T][row_bytes] layer 0's cache rows, in position order */
    int row_bytes;
} fwd_run;

static int run_forward(const eg_model *m, eg_backend *be, const eg_forward_opts *base, eg_kv_dtype dt,
                       const int32_t *tok, int T, fwd_run *out, eg_kv_dtype *seen) {
    const eg_config *c = &m->cfg;
    eg_error err = {0};
    eg_forward_opts o = *base;
    o.kv_dtype = dt;
    eg_forward *f = NULL;
    if (eg_forward_create(m, be, &o, &f, &err)) { fprintf(stderr, "    %s\n", err.msg); return 0; }
    if (seen) *seen = eg_forward_kv(f)->dtype;
    int32_t pos[64], slot[64] = {0}, rows[64];
    for (int i = 0; i < T; i++) pos[i] = rows[i] = i;
    out->x = malloc(sizeof(float) * (size_t)c->n_layers * (size_t)T * (size_t)c->hidden);
    out->logits = malloc(sizeof(float) * (size_t)T * (size_t)c->vocab);
    eg_step s = {.T = T, .tokens = tok, .pos = pos, .slot = slot, .n_logits = T, .logit_rows = rows,
                 .logits = out->logits, .capture = out->x};
    eg_kv_cache *kv = eg_forward_kv(f);
    int ok = !eg_kv_reserve(kv, 0, T, &err) && !eg_forward_step(f, &s, &err);
    if (!ok) fprintf(stderr, "    %s\n", err.msg);
    out->row_bytes = kv->row_bytes;
    out->rows = malloc((size_t)T * (size_t)kv->row_bytes);
    for (int p = 0; ok && p < T; p++) {
        int64_t blk = kv->table[p / kv->block_size]; /* slot 0's row of the block table */
        memcpy(out->rows + (size_t)p * (size_t)kv->row_bytes,
               (const uint8_t *)kv->layers[0].data + (blk * kv->block_size + p % kv->block_size) * kv->row_bytes,
               (size_t)kv->row_bytes);
    }
    eg_forward_free(f);
    return ok;
}

static double rel(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

static void t_kv_dtypes_order(void) {
    if (!model_dir()[0]) { CHECK(!"mkmodel failed"); return; }
    eg_error err = {0};
    eg_model m;
    memset(&m, 0, sizeof m);
    CHECK_OK(eg_model_load(model_dir(), &m, &err), &err);
    if (err.code) return;
    const eg_config *c = &m.cfg;
    eg_backend *be = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 64, .max_seq_len = 64, .nthreads = 2};
    CHECK_OK(eg_backend_create(c, &bo, &be, &err), &err);
    int L = c->n_layers, T = 40;
    int *cap = malloc(sizeof(int) * (size_t)L);
    for (int l = 0; l < L; l++) cap[l] = l;
    int32_t tok[64];
    for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 37 + 11) % c->vocab);
    eg_forward_opts base = {.max_tokens = 64, .n_slots = 1, .max_seq_len = 64, .capture = cap, .n_capture = L};
    fwd_run r32 = {0}, r16 = {0}, r8 = {0}, r8t = {0}, rdef = {0};
    eg_kv_dtype seen = EG_KV_FP8;
    /* opts without kv_dtype (as the engine builds them): BF16 */
    eg_forward_opts plain = {.max_tokens = 64, .n_slots = 1, .max_seq_len = 64, .capture = cap, .n_capture = L};
    CHECK(run_forward(&m, be, &plain, plain.kv_dtype, tok, T, &rdef, &seen));
    CHECK(seen == EG_KV_BF16);
    CHECK(run_forward(&m, be, &base, EG_KV_FP32, tok, T, &r32, &seen) && seen == EG_KV_FP32);
    CHECK(run_forward(&m, be, &base, EG_KV_BF16, tok, T, &r16, NULL));
    CHECK(run_forward(&m, be, &base, EG_KV_FP8, tok, T, &r8, NULL));
    CHECK(run_forward(&m, be, &base, EG_KV_FP8_TILE, tok, T, &r8t, NULL));
    if (r32.x && r16.x && r8.x && r8t.x && rdef.x) {
        int64_t n = (int64_t)T * c->hidden;
        CHECK(memcmp(rdef.x, r16.x, sizeof(float) * (size_t)(L * n)) == 0); /* default == BF16, bit for bit */
        double e16 = rel(r16.x, r32.x, n), e8 = rel(r8.x, r32.x, n), e8t = rel(r8t.x, r32.x, n);
        fprintf(stderr, "    layer 0 vs FP32 cache: bf16 %.2e, fp8 %.2e, fp8-token %.2e\n", e16, e8, e8t);
        /* BF16 rounding is ~2^-9 relative, E4M3 ~2^-4: an order of magnitude apart */
        CHECK(e16 > 1e-5 && e16 < 1e-2);
        CHECK(e8 > 4 * e16 && e8t > 4 * e16);
        CHECK(e8 < 0.2 && e8t < 0.2);
    }
    /* layer 0 sees the same input under every dtype, so its cache rows are the same
     * values stored in each layout */
    if (r32.rows && r16.rows && r8.rows && r8t.rows) {
        int C = c->kv_lora_rank, DR = c->qk_rope, W = C + DR, bad16 = 0, bad8 = 0, bad8t = 0;
        CHECK(r32.row_bytes == 4 * W && r16.row_bytes == 2 * W && r8t.row_bytes == eg_kv_row_bytes(EG_KV_FP8_TILE, C, DR));
        for (int p = 0; p < T; p++) {
            const float *e = (const float *)(r32.rows + (size_t)p * (size_t)r32.row_bytes);
            const uint16_t *b = (const uint16_t *)(r16.rows + (size_t)p * (size_t)r16.row_bytes);
            const uint8_t *q = r8.rows + (size_t)p * (size_t)r8.row_bytes;
            const uint8_t *qt = r8t.rows + (size_t)p * (size_t)r8t.row_bytes;
            const float *sc = (const float *)(qt + (C + 3) / 4 * 4);
            const uint16_t *pe = (const uint16_t *)(sc + (C + 127) / 128);
            float amax = 0;
            for (int k = 0; k < C; k++) amax = fmaxf(amax, fabsf(e[k]));
            if (C <= 128 && fabsf(sc[0] - amax / 448.0f) > 1e-6f * amax) bad8t++;
            for (int k = 0; k < W; k++) {
                bad16 += b[k] != eg_f32_to_bf16(e[k]);
                bad8 += q[k] != eg_f32_to_fp8e4m3(e[k]);
                if (k < C) bad8t += qt[k] != eg_f32_to_fp8e4m3(e[k] / sc[k / 128]);
                else bad8t += pe[k - C] != eg_f32_to_bf16(e[k]);
            }
        }
        CHECKF(bad16 == 0 && bad8 == 0 && bad8t == 0, "cache rows differ: bf16 %d, fp8 %d, fp8-token %d", bad16, bad8,
               bad8t);
    }
    fwd_run *rs[] = {&r32, &r16, &r8, &r8t, &rdef};
    for (size_t i = 0; i < 5; i++) { free(rs[i]->x); free(rs[i]->logits); free(rs[i]->rows); }
    free(cap);
    eg_backend_free(be);
    eg_model_free(&m);
}

/* ---- audit ----------------------------------------------------------------------------- */

static json_t *audit_json(const char *dir, const char *kv) {
    char out[300];
    snprintf(out, sizeof out, "%s/audit.json", tmp_root());
    char js[320];
    snprintf(js, sizeof js, "--json=%s", out);
    const char *av[] = {"fidelity", "--audit", dir, "--model", model_dir(), "--samples", "6", "--threads", "2", js,
                        "--kv", kv};
    if (run_cmd(cmd_fidelity, 12, av)) return NULL;
    json_error_t je;
    return json_load_file(out, 0, &je);
}

static double sample_worst(json_t *s) {
    double w = json_real_value(json_object_get(json_object_get(s, "final"), "rel_worst"));
    json_t *aux = json_object_get(s, "aux"), *e;
    size_t i;
    json_array_foreach(aux, i, e) w = fmax(w, json_real_value(json_object_get(e, "rel_worst")));
    return w;
}

static void t_audit_clean(void) {
    if (!dataset_dir()[0]) { CHECK(!"generate failed"); return; }
    json_t *j = audit_json(dataset_dir(), "bf16");
    CHECK(j != NULL);
    if (!j) return;
    json_t *samples = json_object_get(j, "samples"), *s;
    CHECK(json_array_size(samples) == 6);
    size_t i;
    int64_t checked = 0;
    json_array_foreach(samples, i, s) {
        CHECKF(sample_worst(s) <= 1e-6, "sample %zu: %.3g", i, sample_worst(s));
        CHECK(json_integer_value(json_object_get(s, "tokens_off")) == 0);
        checked += json_integer_value(json_object_get(s, "tokens_checked"));
        CHECK(json_array_size(json_object_get(s, "aux")) == 2);
    }
    CHECK(checked > 20); /* greedy tokens were actually compared */
    CHECK(json_real_value(json_object_get(j, "worst")) <= 1e-6);
    json_decref(j);
    /* against the exact (FP32) cache the BF16 cache's own effect shows */
    j = audit_json(dataset_dir(), "fp32");
    CHECK(j && json_real_value(json_object_get(j, "worst")) > 1e-4);
    json_decref(j);
}

/* Copy the dataset, changing sample 1's aux layer 1 at token 3 by 1%, sample 3's final
 * state at its last token by 0.5%, and sample 4's first generated token. */
static int write_altered(const char *src, const char *dst) {
    eg_error err = {0};
    eg_ds_reader *rd = NULL;
    if (dataset_open(src, &rd, &err)) { fprintf(stderr, "    %s\n", err.msg); return 0; }
    const eg_ds_info *in = dataset_info(rd);
    eg_shard_writer_opts o = {.model_name = in->model_name, .model_config_sha256 = in->model_config_sha256,
                              .tokenizer_sha256 = in->tokenizer_sha256, .chat_template = in->chat_template,
                              .thinking = in->thinking, .n_aux = in->n_aux, .aux_layers = in->aux_layers,
                              .hidden_size = in->hidden_size, .target_vocab_size = in->target_vocab_size,
                              .final_source = in->final_source, .threads = 1};
    eg_shard_writer *w = NULL;
    int ok = !shard_writer_open(dst, &o, &w, &err);
    for (int64_t i = 0; ok && i < dataset_num_samples(rd); i++) {
        eg_ds_sample s;
        memset(&s, 0, sizeof s);
        ok = !dataset_read(rd, i, 0, &s, &err);
        if (!ok) break;
        s.hidden_dtype = EG_DS_BF16;
        uint16_t *aux = s.aux_hidden, *fin = s.final_hidden;
        int64_t H = s.H;
        if (i == 1)
            for (int64_t h = 0; h < H; h++) {
                uint16_t *v = &aux[(3 * s.n_aux + 1) * H + h];
                *v = eg_f32_to_bf16(eg_bf16_to_f32(*v) * 1.01f);
            }
        if (i == 3)
            for (int64_t h = 0; h < H; h++) {
                uint16_t *v = &fin[(s.T - 1) * H + h];
                *v = eg_f32_to_bf16(eg_bf16_to_f32(*v) + 0.005f * (h % 2 ? 1.0f : -1.0f) * fabsf(eg_bf16_to_f32(*v)));
            }
        if (i == 4) s.input_ids[s.prompt_len] = (s.input_ids[s.prompt_len] + 1) % (int32_t)in->target_vocab_size;
        ok = !shard_writer_add(w, &s, &err);
        eg_ds_sample_clear(&s);
    }
    if (ok) ok = !shard_writer_close(w, &err);
    shard_writer_free(w);
    if (!ok) fprintf(stderr, "    %s\n", err.msg);
    dataset_close(rd);
    return ok;
}

static void t_audit_altered(void) {
    if (!dataset_dir()[0]) { CHECK(!"generate failed"); return; }
    char dst[300];
    snprintf(dst, sizeof dst, "%s/altered", tmp_root());
    CHECK(write_altered(dataset_dir(), dst));
    json_t *j = audit_json(dst, "bf16");
    CHECK(j != NULL);
    if (!j) return;
    json_t *samples = json_object_get(j, "samples");
    CHECK(json_array_size(samples) == 6);
    for (size_t i = 0; i < json_array_size(samples); i++) {
        json_t *s = json_array_get(samples, i);
        double w = sample_worst(s);
        int64_t off = json_integer_value(json_object_get(s, "tokens_off"));
        double aux1 = json_real_value(json_object_get(json_array_get(json_object_get(s, "aux"), 1), "rel_worst"));
        double fin = json_real_value(json_object_get(json_object_get(s, "final"), "rel_worst"));
        if (i == 1) CHECKF(aux1 > 5e-3 && aux1 < 2e-2 && fin <= 1e-6, "aux %.3g final %.3g", aux1, fin);
        else if (i == 3) CHECKF(fin > 2e-3 && fin < 1e-2 && aux1 <= 1e-6, "aux %.3g final %.3g", aux1, fin);
        else if (i == 4) CHECKF(off >= 1 || w > 1e-3, "altered token not reported (off %lld, states %.3g)", (long long)off, w);
        else CHECKF(w <= 1e-6 && off == 0, "sample %zu: %.3g, %lld tokens off", i, w, (long long)off);
    }
    CHECK(json_real_value(json_object_get(j, "worst")) > 5e-3);
    json_decref(j);
    /* --fail-above turns the report into an exit status */
    const char *av[] = {"fidelity", "--audit", dst, "--model", model_dir(), "--threads", "2", "--fail-above", "1e-4"};
    CHECK(run_cmd(cmd_fidelity, 9, av) == 1);
    const char *av2[] = {"fidelity", "--audit", (char *)dataset_dir(), "--model", model_dir(), "--threads", "2",
                         "--fail-above", "1e-4"};
    CHECK(run_cmd(cmd_fidelity, 9, av2) == 0);
    /* 0 is a bound too (any error fails), not "off" */
    const char *av3[] = {"fidelity", "--audit", dst, "--model", model_dir(), "--threads", "2", "--fail-above", "0"};
    CHECK(run_cmd(cmd_fidelity, 9, av3) == 1);
}

/* generate records its precision in the manifest: always the BF16 cache */
static void t_manifest_precision(void) {
    if (!dataset_dir()[0]) { CHECK(!"generate failed"); return; }
    char mp[320];
    snprintf(mp, sizeof mp, "%s/manifest.json", dataset_dir());
    json_error_t je;
    json_t *m = json_load_file(mp, 0, &je), *p = json_object_get(m, "precision");
    CHECK(json_is_array(p) && json_array_size(p) == 1);
    json_t *x = json_array_get(p, 0);
    CHECK(!strcmp(json_string_value(json_object_get(x, "kv_cache")) ?: "", "bf16"));
    CHECK(!strcmp(json_string_value(json_object_get(x, "activations")) ?: "", "fp32"));
    CHECK(!strcmp(json_string_value(json_object_get(x, "backend")) ?: "", "cpu"));
    CHECK(json_string_value(json_object_get(x, "device")) && json_is_object(json_object_get(x, "kernels")));
    json_decref(m);
    /* the list keeps distinct runs once each */
    eg_error err = {0};
    char *list = NULL;
    CHECK_OK(eg_ds_precision_add(&list, "{\"kv_cache\":\"bf16\",\"device\":\"a\"}", &err), &err);
    CHECK_OK(eg_ds_precision_add(&list, "[{\"kv_cache\":\"bf16\",\"device\":\"a\"},{\"kv_cache\":\"bf16\",\"device\":\"b\"}]", &err), &err);
    CHECK(list && !strcmp(list, "[{\"kv_cache\":\"bf16\",\"device\":\"a\"},{\"kv_cache\":\"bf16\",\"device\":\"b\"}]"));
    CHECK(eg_ds_precision_add(&list, "7", &err) != EG_OK);
    free(list);
}

static void t_cli_refuses(void) {
    const char *a1[] = {"fidelity", "--model", "x"};
    CHECK(run_cmd(cmd_fidelity, 3, a1) == 2);
    const char *a2[] = {"fidelity", "--model", "x", "--prompts", "p.json", "--compare", "kv=fp32"};
    CHECK(run_cmd(cmd_fidelity, 7, a2) == 2);
    const char *a3[] = {"fidelity", "--model", "x", "--prompts", "p.json", "--compare", "kv=bf16,kv=bf16"};
    CHECK(run_cmd(cmd_fidelity, 7, a3) == 2);
    const char *a4[] = {"fidelity", "--model", "x", "--prompts", "p.json", "--compare", "kv=int4"};
    CHECK(run_cmd(cmd_fidelity, 7, a4) == 2);
    const char *a5[] = {"fidelity", "--model", "x", "--audit", "d", "--kv", "fp8"};
    CHECK(run_cmd(cmd_fidelity, 7, a5) == 2);
    /* an option of the other mode is refused, not ignored */
    const char *a6[] = {"fidelity", "--model", "x", "--prompts", "p.json", "--fail-above", "0"};
    CHECK(run_cmd(cmd_fidelity, 7, a6) == 2);
    const char *a7[] = {"fidelity", "--model", "x", "--audit", "d", "--steps", "5"};
    CHECK(run_cmd(cmd_fidelity, 7, a7) == 2);
    const char *a8[] = {"fidelity", "--model", "x", "--prompts", "p.json", "--samples", "3"};
    CHECK(run_cmd(cmd_fidelity, 7, a8) == 2);
}

int main(int argc, char **argv) {
    static const eg_test tests[] = {
        {"fp8_roundtrip", t_fp8_roundtrip},
        {"fp8_round_to_nearest_even", t_fp8_round_to_nearest_even},
        {"row_layouts", t_row_layouts},
        {"kv_dtypes_order", t_kv_dtypes_order},
        {"audit_clean", t_audit_clean},
        {"audit_altered", t_audit_altered},
        {"manifest_precision", t_manifest_precision},
        {"cli_refuses", t_cli_refuses},
    };
    int rc = eg_test_main("gen_fidelity", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    cleanup();
    return rc;
}
