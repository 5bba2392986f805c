/* Tests for the EAGLE-3 drafter (engine/drafter_eagle3.h) and `mkmodel --drafter-for`
 * (eg_mkmodel_drafter): logits against an independent numpy reference
 * (tests/ref/eagle3_ref.py, float64) at every committed position and two chained draft
 * steps, relative error per row < 1e-4 (the C side is FP32 with BF16 weights and BF16
 * K/V, the reference float64 over the same BF16 weights and BF16-rounded K/V);
 * truncate/extend consistency (bit-identical to a straight extend); the processed
 * distribution q against spec.h's processing over the target vocabulary; sampled drafts
 * against q (chi-square); aux-layer conventions; bad checkpoints and calls, each error naming the file / tensor / key. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/drafter_eagle3.h"
#include "engine/mkmodel.h"
#include "engine/safetensors.h"
#include "engine/spec.h"
#include "engine/weights.h"
#include "tests/check.h"
#include "tests/spec_q.h"

#define TARGET "../shared/fixtures/models/tiny-a"

static char g_tmp[256];
static eg_model g_target;
static int g_have_target;

static const eg_model *target(void) {
    if (!g_have_target) {
        eg_error e = {0};
        if (eg_model_load(TARGET, &g_target, &e)) {
            fprintf(stderr, "    cannot load %s: %s\n", TARGET, e.msg);
            exit(1);
        }
        g_have_target = 1;
    }
    return &g_target;
}

static const char *tmpdir(const char *sub) {
    static char buf[8][512];
    static int k;
    if (!g_tmp[0]) {
        snprintf(g_tmp, sizeof g_tmp, "/tmp/eg_drafter_XXXXXX");
        if (!mkdtemp(g_tmp)) exit(1);
    }
    char *b = buf[k++ % 8];
    snprintf(b, 512, "%s/%s", g_tmp, sub);
    mkdir(b, 0755);
    return b;
}

static uint64_t g_rng = 12345;
static double urand(void) { return eg_rng_uniform(&g_rng); }

static int g_mla; /* make_drafter writes vLLM's MLA layout (Eagle3DeepseekV2ForCausalLM) */
static int g_fcn; /* make_drafter writes vLLM's fc_norm (a norm per aux row before fc) */

/* A drafter for tiny-a: aux [0,2,4], draft vocab 200 at target ids 2d+50 (monotone). */
static void make_drafter(const char *dir, int no_embed, const int64_t *d2t) {
    static const int aux[3] = {0, 2, 4};
    int64_t def[200];
    for (int i = 0; i < 200; i++) def[i] = i + 50; /* target = 2i + 50 */
    eg_mkdrafter_opts o = {.target_dir = TARGET, .out_dir = dir, .seed = 7, .draft_vocab = 200,
                           .d2t = d2t ? d2t : def, .n_aux = 3, .aux_layers = aux, .no_embed = no_embed,
                           .mla = g_mla, .fc_norm = g_fcn};
    eg_error e = {0};
    CHECK_OK(eg_mkmodel_drafter(&o, &e), &e);
}

static json_t *load_cfg(const char *dir) {
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    EG_ASSERT(j);
    return j;
}
static void save_cfg(const char *dir, json_t *j) {
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    EG_ASSERT(json_dump_file(j, p, JSON_INDENT(1)) == 0);
    json_decref(j);
}

/* The drafter's path in the tests below: NULL = its own CPU code; "cpu" = through the
 * CPU backend's ops (eg_eagle3_opts.backend), g_rows rows per pass. */
static const char *g_backend;
static int g_rows;
static int g_block;         /* eg_eagle3_opts.block_size (0: its default) */
static int64_t g_pool;      /* eg_eagle3_opts.pool_blocks (0: its default) */
static int g_draws;         /* eg_eagle3_opts.backend_draws of load_pair's b (0: its default) */
static int g_kept_cap;      /* eg_eagle3_opts.kept_cap of load_pair's b */

static eg_status load(const char *dir, int S, int T, eg_drafter **d, eg_error *e) {
    eg_eagle3_opts o = {.threads = 2, .backend = g_backend, .max_rows = g_rows, .block_size = g_block,
                        .pool_blocks = g_pool, .backend_draws = g_draws, .kept_cap = g_kept_cap};
    return eg_drafter_eagle3_load_opts(dir, target(), S, T, &o, d, e);
}

/* A reference drafter (ref_backend: NULL = its own code) and one on the CPU backend's ops
 * in passes of `rows` rows; 1 when both loaded (else both freed). */
static int load_pair(const char *dir, int S, int T, const char *ref_backend, int rows, eg_drafter **a,
                     eg_drafter **b, eg_error *e) {
    const int draws = g_draws, cap = g_kept_cap;
    g_backend = ref_backend;
    g_draws = g_kept_cap = 0;
    CHECK_OK(load(dir, S, T, a, e), e);
    g_backend = "cpu";
    g_rows = rows;
    g_draws = draws;
    g_kept_cap = cap;
    CHECK_OK(load(dir, S, T, b, e), e);
    g_backend = NULL;
    g_rows = 0;
    g_draws = g_kept_cap = 0;
    if (*a && *b) return 1;
    eg_drafter_free(*a);
    eg_drafter_free(*b);
    return 0;
}

static double rel_err(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static const eg_sample_params greedy = {0.0f, 1.0f, 0};

/* ---------------------------------------------------------------- reference */

static void to_speculators(const char *src, const char *dst, const char *drop_layer_tensor, int variants);

/* spec: the drafter in speculators' layout with its norm_before_fc and norm_output on
 * (an input_norm over the concatenated aux rows, the chain fed the normed output) and a
 * sliding window of 3 positions. */
static void ref_case(int no_embed, int nbr, int spec) {
    const char *dir = tmpdir(spec ? "ref_speculators" : no_embed ? "ref_noembed" : "ref_embed");
    const char *src = spec ? tmpdir("ref_speculators_src") : dir;
    make_drafter(src, no_embed, NULL);
    if (nbr) {
        json_t *j = load_cfg(src);
        json_object_set_new(j, "norm_before_residual", json_true());
        save_cfg(src, j);
    }
    if (spec) to_speculators(src, dir, NULL, 1);
    enum { N = 6, NA = 3, H = 64 };
    static float aux[N][NA][H];
    int32_t next[N];
    for (int t = 0; t < N; t++) {
        for (int a = 0; a < NA; a++)
            for (int c = 0; c < H; c++) aux[t][a][c] = (float)(4.0 * urand() - 2.0);
        next[t] = (int32_t)(urand() * 512);
    }
    char in[600], out[600], cmd[2400];
    snprintf(in, sizeof in, "%s/in.safetensors", dir);
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    eg_error e = {0};
    eg_st_writer *w;
    CHECK_OK(eg_st_writer_new(&w, &e), &e);
    int64_t sa[3] = {N, NA, H}, sn = N;
    CHECK_OK(eg_st_writer_add(w, "aux", EG_ST_F32, 3, sa, aux, &e), &e);
    CHECK_OK(eg_st_writer_add(w, "next", EG_ST_I32, 1, &sn, next, &e), &e);
    CHECK_OK(eg_st_writer_write(w, in, &e), &e);
    eg_st_writer_free(w);
    const char *py = getenv("PYTHON") ? getenv("PYTHON") : "/usr/bin/python3";
    snprintf(cmd, sizeof cmd, "%s tests/ref/eagle3_ref.py %s %s %s %s", py, dir, TARGET, in, out);
    CHECK(system(cmd) == 0);
    eg_st_file *rf = NULL;
    CHECK_OK(eg_st_open(out, &rf, &e), &e);
    if (!rf) return;
    const eg_st_tensor *pl = eg_st_find(rf, "pos_logits"), *cl = eg_st_find(rf, "chain_logits"),
                       *cd = eg_st_find(rf, "chain_draft");
    CHECK(pl && cl && cd && pl->shape[0] == N && pl->shape[1] == 200 && cl->shape[0] == 2);
    if (!pl || !cl || !cd) return;
    const float *P = pl->data, *C = cl->data;
    const int32_t *D = cd->data;

    eg_drafter *d = NULL;
    CHECK_OK(load(dir, 2, 32, &d, &e), &e);
    if (!d) return;
    CHECK(!strcmp(d->info.kind, "eagle3") && d->info.n_aux == 3 && d->info.hidden == 64 && d->info.target_vocab == 512);
    CHECK(d->info.aux_layers[0] == 0 && d->info.aux_layers[1] == 2 && d->info.aux_layers[2] == 4);
    /* the default pool holds every slot full: 2 slots of 2 blocks of 16 positions at
       4 * NKV * HD bytes (NKV 2, HD 16; MLA: the latent, 2 * (C 32 + DR 8)), and per slot
       its FP32 row (H 64) and table row */
    const int64_t per_tok = g_mla ? 2 * (32 + 8) : 4 * 2 * 16;
    CHECK(d->info.block_size == 16 && d->info.pool_blocks == 4 && d->info.cache_bytes_per_token == per_tok);
    CHECKF(d->info.state_bytes == 4 * 16 * per_tok + 2 * (4 * 64 + 4 * 2), "state %lld bytes",
           (long long)d->info.state_bytes);
    double worst = 0;
    int32_t seq[64], dr[3];
    uint64_t rng = 1;
    for (int t = 0; t < N; t++) { /* slot 1: one position at a time */
        CHECK_OK(eg_drafter_extend(d, 1, t, 1, &aux[t][0][0], &next[t], &e), &e);
        CHECK_OK(eg_drafter_propose(d, 1, seq, t + 2, 1, &greedy, &rng, dr, NULL, &e), &e);
        double r = rel_err(eg_drafter_eagle3_last_logits(d), P + t * 200, 200);
        CHECKF(r < 1e-4, "position %d: rel err %.3g", t, r);
        if (r > worst) worst = r;
    }
    CHECK(eg_drafter_eagle3_slot_len(d, 1) == N);
    CHECK_OK(eg_drafter_propose(d, 1, seq, N + 1, 3, &greedy, &rng, dr, NULL, &e), &e);
    CHECKF(dr[0] == D[0] && dr[1] == D[1] && dr[2] == D[2], "drafts %d %d %d, reference %d %d %d", dr[0], dr[1], dr[2],
           D[0], D[1], D[2]);
    double r3 = rel_err(eg_drafter_eagle3_last_logits(d), C + 200, 200);
    float keep3[200];
    memcpy(keep3, eg_drafter_eagle3_last_logits(d), sizeof keep3);
    CHECK(eg_drafter_eagle3_slot_len(d, 1) == N + 2);
    eg_drafter_truncate(d, 1, N);
    CHECK_OK(eg_drafter_propose(d, 1, seq, N + 1, 2, &greedy, &rng, dr, NULL, &e), &e);
    double r2 = rel_err(eg_drafter_eagle3_last_logits(d), C, 200);
    CHECKF(r2 < 1e-4 && r3 < 1e-4, "chain steps: rel err %.3g %.3g", r2, r3);
    if (r2 > worst) worst = r2;
    if (r3 > worst) worst = r3;
    /* slot 0: all positions in one call gives the same bits */
    CHECK_OK(eg_drafter_extend(d, 0, 0, N, &aux[0][0][0], next, &e), &e);
    int32_t dr0[3];
    CHECK_OK(eg_drafter_propose(d, 0, seq, N + 1, 3, &greedy, &rng, dr0, NULL, &e), &e);
    CHECK(dr0[0] == D[0] && dr0[1] == D[1] && dr0[2] == D[2]);
    CHECK(!memcmp(keep3, eg_drafter_eagle3_last_logits(d), sizeof keep3));
    CHECK(rng == 1); /* greedy draws nothing */
    printf("    %s%s%s embedding%s%s%s%s: max rel err %.2e over %d positions + 2 chained steps (bound 1e-4)\n",
           g_mla ? "MLA, " : "", g_fcn ? "fc_norm, " : "", no_embed ? "target" : "own", nbr ? ", norm_before_residual" : "",
           spec ? ", speculators layout with norm_before_fc, norm_output and a sliding window of 3" : "", g_backend ? ", backend " : "",
           g_backend ? g_backend : "", worst, N);
    const char *want_be = g_backend ? g_backend : g_mla ? "cpu" : NULL; /* MLA: always through a backend */
    CHECK(want_be ? eg_drafter_eagle3_backend(d) && !strcmp(eg_drafter_eagle3_backend(d), want_be)
                  : eg_drafter_eagle3_backend(d) == NULL);
    eg_drafter_free(d);
    eg_st_close(rf);
}

static void test_reference_own_embed(void) { ref_case(0, 0, 0); }
static void test_reference_target_embed_nbr(void) { ref_case(1, 1, 0); }
static void test_reference_speculators(void) { ref_case(0, 1, 1); }
/* The same reference through the CPU backend's ops (gqa_attention, copy_rows, linear,
 * ...), extends in passes of 4 rows (the 6-position extend is 4 + 2). */
/* vLLM's fc_norm (an RMSNorm per aux row before fc): alone, with speculators' options
 * (norm_before_fc first, then fc_norm), through the CPU backend's ops (gathered chunks),
 * and on an MLA drafter. */
static void test_reference_fc_norm(void) {
    g_fcn = 1;
    ref_case(0, 0, 0);
    ref_case(0, 1, 1);
    g_backend = "cpu";
    g_rows = 4;
    ref_case(1, 0, 0);
    ref_case(0, 1, 1);
    g_backend = NULL;
    g_rows = 0;
    g_mla = 1;
    ref_case(0, 0, 0);
    g_mla = 0;
    g_fcn = 0;
}

/* vLLM's MLA drafter (mkmodel --mla: tiny-a's q LoRA 48, kv_lora 32, nope 16 / rope 8 /
 * v 12, YaRN factor 64) through the CPU backend's mla_attention op, against the numpy
 * reference's DeepSeek MLA; in passes of one call and of 4 rows. */
static void test_reference_mla(void) {
    g_mla = 1;
    ref_case(0, 0, 0);
    ref_case(1, 1, 0);
    g_backend = "cpu";
    g_rows = 4;
    ref_case(0, 1, 0);
    g_backend = NULL;
    g_rows = 0;
    g_mla = 0;
}

static void test_reference_backend_cpu(void) {
    g_backend = "cpu";
    g_rows = 4;
    ref_case(0, 0, 0);
    ref_case(1, 1, 0);
    ref_case(0, 1, 1);
    g_backend = NULL;
    g_rows = 0;
}

/* ---------------------------------------------------------------- consistency */

static void test_truncate_extend(void) {
    const char *dir = tmpdir("trunc");
    make_drafter(dir, 0, NULL);
    eg_error e = {0};
    eg_drafter *d = NULL;
    CHECK_OK(load(dir, 3, 16, &d, &e), &e);
    if (!d) return;
    enum { N = 8 };
    static float aux[N][3][64];
    int32_t next[N], seq[32], a[4], b[4], c[4];
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < 3 * 64; i++) aux[t][i / 64][i % 64] = (float)(2.0 * urand() - 1.0);
        next[t] = (int32_t)(urand() * 512);
    }
    uint64_t rng = 0;
    float ref[200];
    CHECK_OK(eg_drafter_extend(d, 0, 0, N, &aux[0][0][0], next, &e), &e);
    CHECK_OK(eg_drafter_propose(d, 0, seq, N + 1, 2, &greedy, &rng, a, NULL, &e), &e);
    memcpy(ref, eg_drafter_eagle3_last_logits(d), sizeof ref);
    /* slot 1: extend 5, speculate 3 (2 speculative positions), truncate, extend the rest */
    CHECK_OK(eg_drafter_extend(d, 1, 0, 5, &aux[0][0][0], next, &e), &e);
    CHECK_OK(eg_drafter_propose(d, 1, seq, 6, 3, &greedy, &rng, c, NULL, &e), &e);
    CHECK(eg_drafter_eagle3_slot_len(d, 1) == 7);
    eg_drafter_truncate(d, 1, 5);
    CHECK_OK(eg_drafter_extend(d, 1, 5, N - 5, &aux[5][0][0], next + 5, &e), &e);
    CHECK_OK(eg_drafter_propose(d, 1, seq, N + 1, 2, &greedy, &rng, b, NULL, &e), &e);
    CHECK(a[0] == b[0] && a[1] == b[1]);
    CHECK(!memcmp(ref, eg_drafter_eagle3_last_logits(d), sizeof ref));
    /* slot 2: extend all, truncate to 3, re-extend */
    CHECK_OK(eg_drafter_extend(d, 2, 0, N, &aux[0][0][0], next, &e), &e);
    eg_drafter_truncate(d, 2, 3);
    /* the last position's state is gone: propose refuses until extended */
    CHECK(eg_drafter_propose(d, 2, seq, 4, 1, &greedy, &rng, c, NULL, &e) == EG_ERR_INVALID);
    CHECK(strstr(e.msg, "extend it first") != NULL);
    CHECK_OK(eg_drafter_extend(d, 2, 3, N - 3, &aux[3][0][0], next + 3, &e), &e);
    CHECK_OK(eg_drafter_propose(d, 2, seq, N + 1, 2, &greedy, &rng, c, NULL, &e), &e);
    CHECK(a[0] == c[0] && a[1] == c[1]);
    CHECK(!memcmp(ref, eg_drafter_eagle3_last_logits(d), sizeof ref));
    /* a slot reused from 0 equals a fresh one */
    eg_drafter_truncate(d, 1, 0);
    CHECK_OK(eg_drafter_extend(d, 1, 0, N, &aux[0][0][0], next, &e), &e);
    CHECK_OK(eg_drafter_propose(d, 1, seq, N + 1, 2, &greedy, &rng, b, NULL, &e), &e);
    CHECK(!memcmp(ref, eg_drafter_eagle3_last_logits(d), sizeof ref));
    eg_drafter_free(d);
}

static void test_truncate_extend_backend_cpu(void) {
    g_backend = "cpu";
    g_rows = 3;
    test_truncate_extend();
    g_backend = NULL;
    g_rows = 0;
}

/* The paged cache: blocks of 3 positions, slots growing in turn so their blocks
 * interleave in the pool, a pool with no block to spare, speculation, truncation and
 * reuse: logits and drafts bit-identical to a drafter whose slots each sit in one block.
 * Then the pool running out: the extend fails naming the pool, the slot as it was, and
 * the blocks a truncate returns serve it. Own code and the CPU backend's op. */
static void paged_case(const char *backend) {
    const char *dir = tmpdir(backend ? "paged_backend" : "paged");
    make_drafter(dir, 0, NULL);
    g_backend = backend;
    g_rows = backend ? 2 : 0;
    eg_error e = {0};
    enum { N = 8 };
    static float aux[N][3][64];
    int32_t next[N], seq[32], want[2][4], got[4];
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < 3 * 64; i++) aux[t][i / 64][i % 64] = (float)(2.0 * urand() - 1.0);
        next[t] = (int32_t)(urand() * 512);
    }
    static float ref[2][200];
    uint64_t rng = 0;
    eg_drafter *d = NULL;
    CHECK_OK(load(dir, 3, 16, &d, &e), &e); /* one block of 16 per slot */
    if (!d) return;
    CHECK_OK(eg_drafter_extend(d, 0, 0, 5, &aux[0][0][0], next, &e), &e);
    CHECK_OK(eg_drafter_propose(d, 0, seq, 6, 3, &greedy, &rng, want[0], NULL, &e), &e);
    memcpy(ref[0], eg_drafter_eagle3_last_logits(d), sizeof ref[0]);
    eg_drafter_truncate(d, 0, 5);
    CHECK_OK(eg_drafter_extend(d, 0, 5, N - 5, &aux[5][0][0], next + 5, &e), &e);
    CHECK_OK(eg_drafter_propose(d, 0, seq, N + 1, 4, &greedy, &rng, want[1], NULL, &e), &e);
    memcpy(ref[1], eg_drafter_eagle3_last_logits(d), sizeof ref[1]);
    eg_drafter_free(d);
    /* three slots of at most N + 3 = 11 positions in blocks of 3: 4 blocks each, 12 in all */
    g_block = 3;
    g_pool = 12;
    CHECK_OK(load(dir, 3, 16, &d, &e), &e);
    if (!d) goto out;
    CHECK(d->info.block_size == 3 && d->info.pool_blocks == 12);
    for (int s = 0; s < 3; s++) /* interleaved growth: 2 positions per slot per round */
        for (int t = 0; t < 5; t += 2) {
            int n = t + 2 <= 5 ? 2 : 5 - t;
            CHECK_OK(eg_drafter_extend(d, s, t, n, &aux[t][0][0], next + t, &e), &e);
        }
    for (int s = 0; s < 3; s++) {
        CHECK_OK(eg_drafter_propose(d, s, seq, 6, 3, &greedy, &rng, got, NULL, &e), &e);
        CHECKF(!memcmp(got, want[0], sizeof(int32_t) * 3) && !memcmp(ref[0], eg_drafter_eagle3_last_logits(d), sizeof ref[0]),
               "slot %d: the paged cache's drafts or logits differ", s);
    }
    for (int s = 2; s >= 0; s--) {
        eg_drafter_truncate(d, s, 5);
        CHECK_OK(eg_drafter_extend(d, s, 5, N - 5, &aux[5][0][0], next + 5, &e), &e);
    }
    for (int s = 0; s < 3; s++) {
        CHECK_OK(eg_drafter_propose(d, s, seq, N + 1, 4, &greedy, &rng, got, NULL, &e), &e);
        CHECKF(!memcmp(got, want[1], sizeof got) && !memcmp(ref[1], eg_drafter_eagle3_last_logits(d), sizeof ref[1]),
               "slot %d after truncation: drafts or logits differ", s);
    }
    eg_drafter_free(d);
    d = NULL;
    /* a pool of 5 blocks: slot 0 takes 3 (8 positions), slot 1 2 (5); slot 1's chain of 3
       drafts needs a third and is refused, the slot as it was; the block slot 0's
       truncate returns serves it */
    g_pool = 5;
    CHECK_OK(load(dir, 3, 16, &d, &e), &e);
    if (!d) goto out;
    CHECK_OK(eg_drafter_extend(d, 0, 0, N, &aux[0][0][0], next, &e), &e);
    CHECK_OK(eg_drafter_extend(d, 1, 0, 5, &aux[0][0][0], next, &e), &e);
    eg_status st = eg_drafter_propose(d, 1, seq, 6, 3, &greedy, &rng, got, NULL, &e);
    CHECKF(st == EG_ERR_NOMEM && strstr(e.msg, "cache pool (5 blocks of 3 positions) is full"), "%d: %s", (int)st, e.msg);
    CHECK(eg_drafter_eagle3_slot_len(d, 1) == 5);
    st = eg_drafter_extend(d, 2, 0, 1, &aux[0][0][0], next, &e); /* nothing left for slot 2 either */
    CHECK(st == EG_ERR_NOMEM && eg_drafter_eagle3_slot_len(d, 2) == 0);
    eg_drafter_truncate(d, 0, 5);
    CHECK_OK(eg_drafter_propose(d, 1, seq, 6, 3, &greedy, &rng, got, NULL, &e), &e);
    CHECKF(!memcmp(got, want[0], sizeof(int32_t) * 3) && !memcmp(ref[0], eg_drafter_eagle3_last_logits(d), sizeof ref[0]),
           "slot 1 after the pool ran out: drafts or logits differ");
    eg_drafter_free(d);
out:
    g_block = 0;
    g_pool = 0;
    g_backend = NULL;
    g_rows = 0;
}

static void test_paged_cache(void) { paged_case(NULL); }
static void test_paged_cache_backend_cpu(void) { paged_case("cpu"); }
static void test_paged_cache_mla(void) {
    g_mla = 1;
    paged_case(NULL);
    g_mla = 0;
}

/* The backend path on the CPU backend against the drafter's own code: the same
 * products in the same order (BF16 weights, row lengths multiples of 8), so the same
 * bits: logits of every step, drafts, q and the rng, sampled, own and target
 * embedding, an extend of 9 rows in passes of 4. */
static void backend_bits_case(int no_embed) {
    const char *dir = tmpdir(no_embed ? "bits_noembed" : "bits_embed");
    make_drafter(dir, no_embed, NULL);
    enum { N = 9, K = 3, V = 512, VD = 200 };
    static float aux[N][3][64];
    int32_t next[N], seq[32], da[K], db[K];
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < 3 * 64; i++) aux[t][i / 64][i % 64] = (float)(3.0 * urand() - 1.5);
        next[t] = (int32_t)(urand() * V);
    }
    eg_error e = {0};
    eg_drafter *a = NULL, *b = NULL;
    if (!load_pair(dir, 2, 24, NULL, 4, &a, &b, &e)) return;
    CHECK(a->info.state_bytes == b->info.state_bytes);
    static double qa[K][V], qb[K][V];
    eg_spec_q sqa = tq_alloc(K, V), sqb = tq_alloc(K, V);
    const eg_sample_params sp = {0.8f, 0.95f, 40};
    uint64_t ra = 99, rb = 99;
    int same = 1;
    for (int round = 0; round < 2; round++) {
        const int p0 = round ? 5 : 0, n = round ? N - 5 : 5;
        CHECK_OK(eg_drafter_extend(a, 1, p0, n, &aux[p0][0][0], next + p0, &e), &e);
        CHECK_OK(eg_drafter_extend(b, 1, p0, n, &aux[p0][0][0], next + p0, &e), &e);
        CHECK_OK(eg_drafter_propose(a, 1, seq, p0 + n + 1, K, &sp, &ra, da, &sqa, &e), &e);
        CHECK_OK(eg_drafter_propose(b, 1, seq, p0 + n + 1, K, &sp, &rb, db, &sqb, &e), &e);
        tq_dense(&sqa, K, V, &qa[0][0]);
        tq_dense(&sqb, K, V, &qb[0][0]);
        same &= !memcmp(eg_drafter_eagle3_last_logits(a), eg_drafter_eagle3_last_logits(b), sizeof(float) * VD);
        same &= !memcmp(da, db, sizeof da) && !memcmp(qa, qb, sizeof qa) && ra == rb;
        eg_drafter_truncate(a, 1, p0 + n);
        eg_drafter_truncate(b, 1, p0 + n);
    }
    CHECKF(same, "%s embedding: the CPU backend path differs from the drafter's own code", no_embed ? "target" : "own");
    printf("    %s embedding: backend cpu == own code, bit for bit (logits, %d drafts x 2, q, rng)\n",
           no_embed ? "target" : "own", K);
    tq_free(&sqa);
    tq_free(&sqb);
    eg_drafter_free(a);
    eg_drafter_free(b);
}
static void test_backend_cpu_bits(void) {
    backend_bits_case(0);
    backend_bits_case(1);
}

/* Batched calls (extend_many, propose_many) on the backend path, in passes of 3 rows
 * over 5 slots of uneven lengths (an extend pass holding the end of one slot and the
 * start of the next; propose groups of 3 slots, chains of 1 to 4 drafts, k descending
 * across items given in shuffled slot order), against the per-slot calls of a reference:
 * the own code (MLA: the backend path, one slot at a time). Three rounds of extend,
 * propose and truncate; greedy and sampled slots mixed. Drafts, q and every rng equal
 * bit for bit. Then the refusals: a slot twice in one batch. draws: b reduces the rows on
 * the backend (backend_draws 1, kept sets of at most 64 ids: greedy rows by the backend's
 * argmax, sampled ones from kept sets, the sets over the cap and, with a non-monotone
 * d2t, every sampled row from the row on the host), against a on the host. */
static void many_case(int mla, int draws, const int64_t *d2t) {
    const char *dir = tmpdir(draws ? (d2t ? "many_draws_perm" : "many_draws") : mla ? "many_mla" : "many");
    g_mla = mla;
    make_drafter(dir, 0, d2t);
    g_mla = 0;
    enum { S = 5, T = 40, K = 4, V = 512, NA = 3, H = 64 };
    eg_error e = {0};
    eg_drafter *a = NULL, *b = NULL;
    g_draws = draws ? 1 : 0;
    g_kept_cap = draws ? 64 : 0;
    if (!load_pair(dir, S, T, mla ? "cpu" : NULL, 3, &a, &b, &e)) return;
    static float aux[S][T][NA][H];
    static int32_t next[S][T], seq[T + 1];
    for (int i = 0; i < S * T * NA * H; i++) (&aux[0][0][0][0])[i] = (float)(2.0 * urand() - 1.0);
    for (int i = 0; i < S * T; i++) (&next[0][0])[i] = (int32_t)(urand() * V);
    static const int order[S] = {3, 0, 4, 1, 2};
    static const eg_sample_params sps[S] = {{0.8f, 0.95f, 40}, {0.0f, 1.0f, 0}, {1.0f, 1.0f, 0}, {0.6f, 0.5f, 0},
                                            {1.3f, 1.0f, 100}};
    int len[S] = {0}, add[S] = {1, 6, 2, 9, 4};
    uint64_t ra[S], rb[S];
    for (int s2 = 0; s2 < S; s2++) ra[s2] = rb[s2] = 1000 + (uint64_t)s2;
    static int32_t da[S][K], db[S][K];
    static double qa[S][K][V], qb[S][K][V];
    eg_spec_q sqa[S], sqb[S];
    for (int s2 = 0; s2 < S; s2++) sqa[s2] = tq_alloc(K, V), sqb[s2] = tq_alloc(K, V);
    int same = 1, rounds = 3;
    for (int round = 0; round < rounds; round++) {
        eg_draft_extend xs[S];
        eg_draft_propose ps[S];
        for (int j = 0; j < S; j++) {
            int s2 = order[j];
            xs[j] = (eg_draft_extend){s2, len[s2], add[s2], &aux[s2][len[s2]][0][0], &next[s2][len[s2]]};
            CHECK_OK(eg_drafter_extend(a, s2, len[s2], add[s2], &aux[s2][len[s2]][0][0], &next[s2][len[s2]], &e), &e);
        }
        CHECK_OK(eg_drafter_extend_many(b, S, xs, &e), &e);
        for (int s2 = 0; s2 < S; s2++) len[s2] += add[s2];
        for (int j = 0; j < S; j++) {
            int s2 = order[j], k = 1 + (s2 + round) % K;
            ps[j] = (eg_draft_propose){s2, seq, len[s2] + 1, k, &sps[s2], &rb[s2], db[s2], &sqb[s2]};
            CHECK_OK(eg_drafter_propose(a, s2, seq, len[s2] + 1, k, &sps[s2], &ra[s2], da[s2], &sqa[s2], &e), &e);
        }
        CHECK_OK(eg_drafter_propose_many(b, S, ps, &e), &e);
        for (int s2 = 0; s2 < S; s2++) {
            int k = 1 + (s2 + round) % K;
            tq_dense(&sqa[s2], k, V, &qa[s2][0][0]);
            tq_dense(&sqb[s2], k, V, &qb[s2][0][0]);
            same &= !memcmp(da[s2], db[s2], sizeof(int32_t) * (size_t)k) && ra[s2] == rb[s2] &&
                    !memcmp(qa[s2], qb[s2], sizeof(double) * (size_t)(k * V));
            eg_drafter_truncate(a, s2, len[s2]);
            eg_drafter_truncate(b, s2, len[s2]);
            CHECK(eg_drafter_eagle3_slot_len(b, s2) == len[s2]);
            add[s2] = 1 + (int)(urand() * k); /* accepted drafts + 1 */
        }
    }
    CHECKF(same, "%s: the batched calls differ from the per-slot ones", mla ? "MLA" : "own-code reference");
    printf("    %s: extend_many / propose_many (3 rows a pass) == per-slot calls, bit for bit, %d rounds x %d slots\n",
           mla ? "MLA (backend path both)" : "own code reference", rounds, S);
    /* a slot twice in one batch is refused and changes nothing */
    eg_draft_extend twice[2] = {{0, len[0], 1, &aux[0][len[0]][0][0], &next[0][len[0]]},
                                {0, len[0], 1, &aux[0][len[0]][0][0], &next[0][len[0]]}};
    CHECK(eg_drafter_extend_many(b, 2, twice, &e) == EG_ERR_INVALID && strstr(e.msg, "slot 0 twice"));
    CHECK(eg_drafter_eagle3_slot_len(b, 0) == len[0]);
    eg_draft_propose ptwice[2] = {{1, seq, len[1] + 1, 1, &sps[1], &rb[1], db[1], NULL},
                                  {1, seq, len[1] + 1, 1, &sps[1], &rb[1], db[1], NULL}};
    CHECK(eg_drafter_propose_many(b, 2, ptwice, &e) == EG_ERR_INVALID && strstr(e.msg, "slot 1 twice"));
    const int64_t kept = b->draws.kept, am = b->draws.argmax, host = b->draws.host_rows;
    if (draws) {
        printf("    backend draws%s: %lld from kept sets, %lld by the backend's argmax, %lld rows to the host\n",
               d2t ? " (d2t not monotone)" : "", (long long)kept, (long long)am, (long long)host);
        CHECK(am > 0 && host > 0 && (d2t ? kept == 0 : kept > 0));
    } else {
        CHECK(kept == 0 && am == 0 && host > 0); /* the CPU backend leaves the draws to the host */
    }
    for (int s2 = 0; s2 < S; s2++) tq_free(&sqa[s2]), tq_free(&sqb[s2]);
    eg_drafter_free(a);
    eg_drafter_free(b);
}
static void test_many_equals_one(void) {
    many_case(0, 0, NULL);
    many_case(1, 0, NULL);
}
static void test_backend_draws(void) {
    many_case(0, 1, NULL);
    int64_t d2t[200]; /* target ids 511, 509, ... (descending: not monotone) */
    for (int i = 0; i < 200; i++) d2t[i] = (511 - 2 * i) - i;
    many_case(0, 1, d2t);
}

/* ---------------------------------------------------------------- q */

static void q_case(const char *sub, const int64_t *d2t) {
    const char *dir = tmpdir(sub);
    make_drafter(dir, 0, d2t);
    eg_error e = {0};
    eg_drafter *d = NULL;
    CHECK_OK(load(dir, 1, 16, &d, &e), &e);
    if (!d) return;
    static float aux[4][3][64];
    int32_t next[4], seq[16], dr[2];
    for (int i = 0; i < 4 * 3 * 64; i++) (&aux[0][0][0])[i] = (float)(2.0 * urand() - 1.0);
    for (int t = 0; t < 4; t++) next[t] = (int32_t)(urand() * 512);
    CHECK_OK(eg_drafter_extend(d, 0, 0, 4, &aux[0][0][0], next, &e), &e);
    const int V = 512, Vd = 200;
    const int64_t *map = eg_drafter_eagle3_d2t(d);
    uint8_t in_draft[512] = {0};
    for (int i = 0; i < Vd; i++) in_draft[i + map[i]] = 1;
    static double q[2 * 512], ref[512];
    eg_spec_q sq = tq_alloc(2, Vd); /* a row holds the draft vocabulary's ids at most */
    float full[512];
    eg_spec_scratch *sc = NULL;
    CHECK_OK(eg_spec_scratch_create(V, &sc, &e), &e);
    const eg_sample_params sps[] = {{0.8f, 0.9f, 50}, {1.0f, 1.0f, 0}, {0.5f, 0.3f, 0}, {1.3f, 1.0f, 300}};
    for (size_t s = 0; s < sizeof sps / sizeof sps[0]; s++) {
        uint64_t rng = 99 + s, rng2 = 99 + s;
        CHECK_OK(eg_drafter_propose(d, 0, seq, 5, 1, &sps[s], &rng, dr, &sq, &e), &e);
        CHECK(rng != rng2); /* one draw */
        int ascending = sq.n[0] >= 1;
        for (int j = 0; j < sq.n[0]; j++) ascending &= sq.p[j] > 0 && (j == 0 || sq.id[j] > sq.id[j - 1]);
        CHECKF(ascending, "%s params %zu: q row not ascending ids of positive p", sub, s);
        CHECK(eg_spec_q_at(&sq, 0, dr[0]) > 0);
        tq_dense(&sq, 1, V, q);
        const float *lg = eg_drafter_eagle3_last_logits(d);
        for (int t = 0; t < V; t++) full[t] = -INFINITY;
        for (int i = 0; i < Vd; i++) full[i + map[i]] = lg[i];
        eg_spec_probs(sc, full, V, &sps[s], ref);
        double sum = 0, md = 0, outside = 0;
        for (int t = 0; t < V; t++) {
            sum += q[t];
            if (fabs(q[t] - ref[t]) > md) md = fabs(q[t] - ref[t]);
            if (!in_draft[t]) outside += q[t];
        }
        CHECKF(md < 1e-12, "%s params %zu: q differs from spec processing by %.3g", sub, s, md);
        CHECK(fabs(sum - 1) < 1e-9 && outside == 0 && q[dr[0]] > 0);
        /* the same rng gives the same draft */
        int32_t again[1];
        CHECK_OK(eg_drafter_propose(d, 0, seq, 5, 1, &sps[s], &rng2, again, NULL, &e), &e);
        CHECK(again[0] == dr[0] && rng == rng2);
        /* chained: q of both steps valid */
        eg_drafter_truncate(d, 0, 4);
        CHECK_OK(eg_drafter_propose(d, 0, seq, 5, 2, &sps[s], &rng, dr, &sq, &e), &e);
        tq_dense(&sq, 2, V, q);
        for (int k = 0; k < 2; k++) {
            double sk = 0;
            for (int t = 0; t < V; t++) sk += q[k * V + t];
            CHECK(fabs(sk - 1) < 1e-9 && q[k * V + dr[k]] > 0 && in_draft[dr[k]]);
        }
        eg_drafter_truncate(d, 0, 4);
    }
    /* greedy: one-hot at the argmax (lowest draft index among ties) */
    uint64_t rng = 5;
    CHECK_OK(eg_drafter_propose(d, 0, seq, 5, 1, &greedy, &rng, dr, &sq, &e), &e);
    CHECK(sq.n[0] == 1);
    tq_dense(&sq, 1, V, q);
    const float *lg = eg_drafter_eagle3_last_logits(d);
    int best = 0;
    for (int i = 1; i < Vd; i++)
        if (lg[i] > lg[best]) best = i;
    CHECK(dr[0] == best + map[best] && q[dr[0]] == 1.0 && rng == 5);
    double s1 = 0;
    for (int t = 0; t < V; t++) s1 += q[t];
    CHECK(s1 == 1.0);
    /* rows narrower than the draft vocabulary are refused */
    eg_spec_q narrow = tq_alloc(1, Vd - 1);
    CHECK(eg_drafter_propose(d, 0, seq, 5, 1, &sps[0], &rng, dr, &narrow, &e) == EG_ERR_INVALID &&
          strstr(e.msg, "q rows of 199 ids"));
    tq_free(&narrow);
    tq_free(&sq);
    eg_spec_scratch_free(sc);
    eg_drafter_free(d);
}

static void test_q_monotone(void) { q_case("q_mono", NULL); }
static void test_q_permuted(void) {
    int64_t d2t[200]; /* target ids 511, 509, ... (descending: not monotone) */
    for (int i = 0; i < 200; i++) d2t[i] = (511 - 2 * i) - i;
    q_case("q_perm", d2t);
}

/* Sampled drafts follow q: 4000 draws (one rng per draw) at temperature 1, top-k 8,
 * against the expected counts N q. Chi-square with 7 degrees of freedom; the bound 41.9 is
 * the 1 - 1e-6 quantile (Wilson-Hilferty), so a correct sampler fails one run in a million. */
static void test_draws_follow_q(void) {
    const char *dir = tmpdir("draws");
    make_drafter(dir, 0, NULL);
    eg_error e = {0};
    eg_drafter *d = NULL;
    CHECK_OK(load(dir, 1, 8, &d, &e), &e);
    if (!d) return;
    static float aux[2][3][64];
    for (int i = 0; i < 2 * 3 * 64; i++) (&aux[0][0][0])[i] = (float)(2.0 * urand() - 1.0);
    int32_t next[2] = {17, 300}, seq[8], dr[1];
    CHECK_OK(eg_drafter_extend(d, 0, 0, 2, &aux[0][0][0], next, &e), &e);
    const eg_sample_params sp = {1.0f, 1.0f, 8};
    static double q[512];
    static int count[512];
    uint64_t rng = eg_rng_seed(eg_test_seed(), 1);
    eg_spec_q sq = tq_alloc(1, 512);
    CHECK_OK(eg_drafter_propose(d, 0, seq, 3, 1, &sp, &rng, dr, &sq, &e), &e);
    tq_dense(&sq, 1, 512, q);
    tq_free(&sq);
    const int N = 4000;
    for (int i = 0; i < N; i++) {
        uint64_t r = eg_rng_seed(eg_test_seed(), 100 + (uint64_t)i);
        CHECK_OK(eg_drafter_propose(d, 0, seq, 3, 1, &sp, &r, dr, NULL, &e), &e);
        count[dr[0]]++;
    }
    double chi = 0;
    int support = 0, outside = 0;
    for (int t = 0; t < 512; t++) {
        if (q[t] > 0) {
            support++;
            chi += (count[t] - N * q[t]) * (count[t] - N * q[t]) / (N * q[t]);
        } else outside += count[t];
    }
    CHECK(support == 8 && outside == 0);
    CHECKF(chi < 41.9, "chi-square %.2f over 8 outcomes (bound 41.9)", chi);
    printf("    chi-square %.2f (7 dof, bound 41.9 at a 1e-6 false-alarm rate)\n", chi);
    eg_drafter_free(d);
}

/* ---------------------------------------------------------------- conventions */

static eg_status load_with_ids(const char *dir, const int *ids, int n, const char *conv, eg_aux_convention ask,
                               eg_drafter **d, eg_error *e) {
    json_t *j = load_cfg(dir), *ec = json_object_get(j, "eagle_config"), *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    json_object_set_new(ec, "eagle_aux_hidden_state_layer_ids", a);
    if (conv) json_object_set_new(ec, "eaglegen_aux_convention", json_string(conv));
    else json_object_del(ec, "eaglegen_aux_convention");
    save_cfg(dir, j);
    eg_eagle3_opts o = {.aux_convention = ask, .threads = 1};
    *d = NULL;
    return eg_drafter_eagle3_load_opts(dir, target(), 1, 8, &o, d, e);
}

static void test_aux_conventions(void) {
    const char *dir = tmpdir("conv");
    static const int aux1[1] = {1};
    eg_mkdrafter_opts o = {.target_dir = TARGET, .out_dir = dir, .draft_vocab = 64, .n_aux = 1, .aux_layers = aux1};
    eg_error e = {0};
    CHECK_OK(eg_mkmodel_drafter(&o, &e), &e);
    eg_drafter *d;
    /* tiny-a has 5 layers: the default set is [1] (output-of-layer), [2] as an HF index */
    int one[1] = {1}, two[1] = {2}, zero[1] = {0}, six[1] = {6}, five[1] = {5};
    CHECK_OK(load_with_ids(dir, one, 1, NULL, EG_AUX_CONV_AUTO, &d, &e), &e);
    CHECK(d && d->info.aux_layers[0] == 1);
    eg_drafter_free(d);
    CHECK_OK(load_with_ids(dir, two, 1, NULL, EG_AUX_CONV_AUTO, &d, &e), &e);
    CHECK(d && d->info.aux_layers[0] == 1);
    eg_drafter_free(d);
    CHECK(load_with_ids(dir, zero, 1, NULL, EG_AUX_CONV_AUTO, &d, &e) == EG_ERR_CONFIG && !d);
    CHECK(strstr(e.msg, "ambiguous") && strstr(e.msg, "config.json"));
    CHECK_OK(load_with_ids(dir, zero, 1, NULL, EG_AUX_CONV_OUTPUT_OF_LAYER, &d, &e), &e);
    CHECK(d && d->info.aux_layers[0] == 0);
    eg_drafter_free(d);
    CHECK_OK(load_with_ids(dir, five, 1, "hf_hidden_states", EG_AUX_CONV_AUTO, &d, &e), &e);
    CHECK(d && d->info.aux_layers[0] == 4);
    eg_drafter_free(d);
    CHECK(load_with_ids(dir, zero, 1, "hf_hidden_states", EG_AUX_CONV_AUTO, &d, &e) == EG_ERR_UNSUPPORTED);
    CHECK(strstr(e.msg, "embedding output") != NULL);
    CHECK(load_with_ids(dir, six, 1, "hf_hidden_states", EG_AUX_CONV_AUTO, &d, &e) == EG_ERR_CONFIG);
    CHECK(strstr(e.msg, "past the target") != NULL);
    CHECK(load_with_ids(dir, five, 1, "output_of_layer", EG_AUX_CONV_AUTO, &d, &e) == EG_ERR_CONFIG);
    CHECK(load_with_ids(dir, one, 1, "output_of_layer", EG_AUX_CONV_HF_INDEX, &d, &e) == EG_ERR_CONFIG);
    CHECK(strstr(e.msg, "contradicts") != NULL);
    CHECK(load_with_ids(dir, one, 1, "sideways", EG_AUX_CONV_AUTO, &d, &e) == EG_ERR_CONFIG);
    CHECK(strstr(e.msg, "eaglegen_aux_convention") != NULL);
    int unsorted[2] = {3, 1};
    CHECK(load_with_ids(dir, unsorted, 2, "output_of_layer", EG_AUX_CONV_AUTO, &d, &e) == EG_ERR_CONFIG);
    CHECK(strstr(e.msg, "ascending") != NULL);
    CHECK(load_with_ids(dir, NULL, 0, "output_of_layer", EG_AUX_CONV_AUTO, &d, &e) == EG_ERR_CONFIG);
}

/* ---------------------------------------------------------------- bad inputs */

/* What copy_tensors changes on the way: each name through `rename` (NULL: kept), then the
 * tensor named `skip` left out, `shrink` given one column fewer, d2t / t2d data replaced
 * when given, and `add` ([add_n] F32) appended as `add_name`. */
typedef struct st_edit {
    void (*rename)(const char *in, char *out, size_t n);
    const char *skip, *shrink;
    const int64_t *d2t;
    const uint8_t *t2d;
    const char *add_name;
    const float *add;
    int64_t add_n;
} st_edit;

static void copy_tensors(const char *src, const char *dst, const st_edit *ed) {
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    eg_error e = {0};
    eg_st_file *f;
    eg_st_writer *w;
    EG_ASSERT(eg_st_open(p, &f, &e) == EG_OK && eg_st_writer_new(&w, &e) == EG_OK);
    for (int i = 0; i < eg_st_count(f); i++) {
        const eg_st_tensor *t = eg_st_at(f, i);
        char name[300];
        if (ed->rename) ed->rename(t->name, name, sizeof name);
        else snprintf(name, sizeof name, "%s", t->name);
        if (ed->skip && !strcmp(name, ed->skip)) continue;
        int64_t shape[EG_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (ed->shrink && !strcmp(name, ed->shrink)) shape[t->ndim - 1]--;
        const void *data = t->data;
        if (ed->d2t && !strcmp(name, "d2t")) data = ed->d2t;
        if (ed->t2d && !strcmp(name, "t2d")) data = ed->t2d;
        EG_ASSERT(eg_st_writer_add(w, name, t->dtype, t->ndim, shape, data, &e) == EG_OK);
    }
    if (ed->add) EG_ASSERT(eg_st_writer_add(w, ed->add_name, EG_ST_F32, 1, &ed->add_n, ed->add, &e) == EG_OK);
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    EG_ASSERT(eg_st_writer_write(w, p, &e) == EG_OK);
    eg_st_writer_free(w);
    eg_st_close(f);
}

static void copy_config(const char *src, const char *dst) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/config.json", src, dst);
    EG_ASSERT(system(cmd) == 0);
}

/* Copy src to dst without `skip`, with `shrink` given one column fewer, and with d2t/t2d
 * replaced when given. */
static void rewrite(const char *src, const char *dst, const char *skip, const char *shrink, const int64_t *d2t,
                    const uint8_t *t2d) {
    copy_config(src, dst);
    st_edit ed = {.skip = skip, .shrink = shrink, .d2t = d2t, .t2d = t2d};
    copy_tensors(src, dst, &ed);
}

static void expect_fail(const char *dir, eg_status code, const char *w1, const char *w2) {
    eg_error e = {0};
    eg_drafter *d = (eg_drafter *)1;
    eg_status st = load(dir, 1, 8, &d, &e);
    CHECKF(st == code && d == NULL, "%s: status %s (want %s): %s", dir, eg_status_name(st), eg_status_name(code), e.msg);
    CHECKF(strstr(e.msg, w1) && (!w2 || strstr(e.msg, w2)), "message lacks '%s'/'%s': %s", w1, w2 ? w2 : "", e.msg);
}

/* The same drafter in speculators' layout, also with vLLM's model. prefix on the names
 * (Eagle3SpeculatorConfig: the layer's Llama
 * config nested in transformer_layer_config, aux ids counted as vLLM does, k + 1; the
 * decoder layer's tensors named layers.0.* instead of midlayer.*), as speculators 0.9's
 * save_pretrained writes it: loads to the same drafter (the same aux layers, logits bit for
 * bit at every position and along a chain). Its variants that change the math, another
 * layer type, and a missing layer tensor are refused, naming the key or both names. */
static void layer0_name(const char *in, char *out, size_t n) {
    if (!strncmp(in, "midlayer.", 9)) snprintf(out, n, "layers.0.%s", in + 9);
    else snprintf(out, n, "%s", in);
}

static void to_speculators(const char *src, const char *dst, const char *drop_layer_tensor, int variants) {
    json_t *c = load_cfg(src), *ec = json_object_get(c, "eagle_config"), *ids = json_array();
    json_t *a = json_object_get(ec, "eagle_aux_hidden_state_layer_ids");
    for (size_t i = 0; i < json_array_size(a); i++)
        json_array_append_new(ids, json_integer(json_integer_value(json_array_get(a, i)) + 1));
    json_t *lc = json_pack("{s:s, s:O, s:O, s:O, s:O, s:O, s:O, s:i, s:O, s:{s:O, s:s}, s:b, s:b, s:s}", "model_type",
                           "llama", "hidden_size", json_object_get(c, "hidden_size"), "num_attention_heads",
                           json_object_get(c, "num_attention_heads"), "num_key_value_heads",
                           json_object_get(c, "num_key_value_heads"), "head_dim", json_object_get(c, "head_dim"),
                           "intermediate_size", json_object_get(c, "intermediate_size"), "vocab_size",
                           json_object_get(c, "vocab_size"), "num_hidden_layers", 1, "rms_norm_eps",
                           json_object_get(c, "rms_norm_eps"), "rope_parameters", "rope_theta",
                           json_object_get(c, "rope_theta"), "rope_type", "default", "attention_bias", 0, "mlp_bias", 0,
                           "hidden_act", "silu");
    if (variants) { /* and a sliding window of 3, shorter than the test's 6 positions + 2 drafts */
        json_object_set_new(lc, "layer_types", json_pack("[s]", "sliding_attention"));
        json_object_set_new(lc, "sliding_window", json_integer(3));
    }
    json_t *sp = json_pack("{s:[s], s:s, s:o, s:O, s:O, s:O, s:b, s:b, s:b, s:o}", "architectures", "Eagle3Speculator",
                           "speculators_model_type", "eagle3", "transformer_layer_config", lc, "draft_vocab_size",
                           json_object_get(c, "draft_vocab_size"), "target_hidden_size",
                           json_object_get(c, "target_hidden_size"), "norm_before_residual",
                           json_object_get(c, "norm_before_residual"), "norm_before_fc", variants, "fc_norm",
                           json_is_true(json_object_get(c, "fc_norm")),
                           "norm_output", variants, "eagle_aux_hidden_state_layer_ids", ids);
    EG_ASSERT(sp);
    save_cfg(dst, sp);
    static float in_norm[3 * 64]; /* norm_before_fc's weight over the 3 aux rows of 64 */
    int64_t n_in = (int64_t)json_array_size(a) * json_integer_value(json_object_get(c, "target_hidden_size"));
    json_decref(c);
    EG_ASSERT(n_in <= (int64_t)(sizeof in_norm / sizeof in_norm[0]));
    if (variants)
        for (int64_t i = 0; i < n_in; i++) in_norm[i] = (float)(0.5 + urand());
    st_edit ed = {.rename = layer0_name, .skip = drop_layer_tensor, .add_name = "input_norm.weight",
                  .add = variants ? in_norm : NULL, .add_n = n_in};
    copy_tensors(src, dst, &ed);
}

/* src's tensors under vLLM's module prefix (model.X), lm_head and the vocabulary maps as
 * they were. */
static void model_prefixed(const char *in, char *out, size_t n) {
    int keep = !strcmp(in, "lm_head.weight") || !strcmp(in, "d2t") || !strcmp(in, "t2d");
    snprintf(out, n, "%s%s", keep ? "" : "model.", in);
}

static void with_model_prefix(const char *src, const char *dst) {
    copy_config(src, dst);
    st_edit ed = {.rename = model_prefixed};
    copy_tensors(src, dst, &ed);
}

static void test_speculators_layout(void) {
    const char *sf = tmpdir("sf_layout"), *sp = tmpdir("sp_layout"), *bad = tmpdir("sp_bad"), *mp = tmpdir("sp_model");
    make_drafter(sf, 0, NULL);
    to_speculators(sf, sp, NULL, 0);
    with_model_prefix(sp, mp); /* model.layers.0.*, model.fc.weight, ...: vLLM's parameter names */
    eg_drafter *a = NULL, *b = NULL, *c = NULL;
    eg_error e = {0};
    CHECK_OK(load(sf, 1, 32, &a, &e), &e);
    CHECK_OK(load(sp, 1, 32, &b, &e), &e);
    CHECK_OK(load(mp, 1, 32, &c, &e), &e);
    if (!a || !b || !c) { eg_drafter_free(a); eg_drafter_free(b); eg_drafter_free(c); return; }
    CHECK(b->info.n_aux == 3 && b->info.aux_layers[0] == 0 && b->info.aux_layers[1] == 2 && b->info.aux_layers[2] == 4);
    CHECKF(strstr(eg_drafter_eagle3_aux_source(b), "speculators"), "aux source: %s", eg_drafter_eagle3_aux_source(b));
    CHECK(b->info.weight_bytes == a->info.weight_bytes && b->info.state_bytes == a->info.state_bytes);
    enum { N = 5, NA = 3, H = 64 };
    static float aux[N][NA][H];
    int32_t next[N], seq[64] = {0}, da[3], db[3], dc[3];
    for (int t = 0; t < N; t++) {
        for (int k = 0; k < NA; k++)
            for (int c = 0; c < H; c++) aux[t][k][c] = (float)(4.0 * urand() - 2.0);
        next[t] = (int32_t)(urand() * 512);
    }
    int same = 1;
    uint64_t ra = 3, rb = 3, rc = 3;
    for (int t = 0; t < N; t++) {
        CHECK_OK(eg_drafter_extend(a, 0, t, 1, &aux[t][0][0], &next[t], &e), &e);
        CHECK_OK(eg_drafter_extend(b, 0, t, 1, &aux[t][0][0], &next[t], &e), &e);
        CHECK_OK(eg_drafter_extend(c, 0, t, 1, &aux[t][0][0], &next[t], &e), &e);
        CHECK_OK(eg_drafter_propose(a, 0, seq, t + 2, t == N - 1 ? 3 : 1, &greedy, &ra, da, NULL, &e), &e);
        CHECK_OK(eg_drafter_propose(b, 0, seq, t + 2, t == N - 1 ? 3 : 1, &greedy, &rb, db, NULL, &e), &e);
        CHECK_OK(eg_drafter_propose(c, 0, seq, t + 2, t == N - 1 ? 3 : 1, &greedy, &rc, dc, NULL, &e), &e);
        same &= !memcmp(eg_drafter_eagle3_last_logits(a), eg_drafter_eagle3_last_logits(b), sizeof(float) * 200) &&
                !memcmp(eg_drafter_eagle3_last_logits(a), eg_drafter_eagle3_last_logits(c), sizeof(float) * 200) &&
                da[0] == db[0] && da[0] == dc[0];
        eg_drafter_truncate(a, 0, t + 1);
        eg_drafter_truncate(b, 0, t + 1);
        eg_drafter_truncate(c, 0, t + 1);
    }
    CHECKF(same && !memcmp(da, db, sizeof da) && !memcmp(da, dc, sizeof da),
           "speculators layout (or with model. names): logits or drafts differ from SpecForge layout's");
    eg_drafter_free(a);
    eg_drafter_free(b);
    eg_drafter_free(c);
    /* refusals: one config key set (val) or removed (NULL), at the top or in the layer's
       transformer_layer_config */
    struct { int in_layer; const char *key; json_t *val; eg_status code; const char *want; } rf[] = {
        {0, "fc_norm", json_true(), EG_ERR_FORMAT, "fc_norm.0.weight (or model.fc_norm.0.weight) is missing"},
        {0, "norm_before_fc", json_true(), EG_ERR_FORMAT, "input_norm.weight (or model.input_norm.weight) is missing"},
        {0, "norm_output", json_string("yes"), EG_ERR_CONFIG, "\"norm_output\" must be a boolean"},
        {1, "layer_types", json_pack("[s]", "chunked"), EG_ERR_UNSUPPORTED, "layer_types[0] \"chunked\""},
        {1, "model_type", json_string("qwen3"), EG_ERR_UNSUPPORTED, "transformer_layer_config.model_type \"qwen3\""},
        {0, "speculators_model_type", json_string("mlp"), EG_ERR_UNSUPPORTED, "speculators_model_type \"mlp\""},
        {0, "transformer_layer_config", NULL, EG_ERR_CONFIG, "transformer_layer_config"},
    };
    for (size_t i = 0; i < sizeof rf / sizeof rf[0]; i++) {
        to_speculators(sf, bad, NULL, 0);
        json_t *j = load_cfg(bad), *at = rf[i].in_layer ? json_object_get(j, "transformer_layer_config") : j;
        if (rf[i].val) json_object_set_new(at, rf[i].key, rf[i].val);
        else json_object_del(at, rf[i].key);
        save_cfg(bad, j);
        expect_fail(bad, rf[i].code, rf[i].want, NULL);
    }
    to_speculators(sf, bad, "layers.0.self_attn.o_proj.weight", 0);
    expect_fail(bad, EG_ERR_FORMAT,
                "midlayer.self_attn.o_proj.weight (or layers.0.self_attn.o_proj.weight, with or without model.) is missing",
                NULL);
}

/* The MLA layout's own rules: its aux ids count as vLLM counts (the only engine that runs
 * it) without eaglegen's key; refusals name the tensor or key (a MoE layer, a sliding
 * window, two layers, kv_b of the wrong shape or missing, no kv_lora_rank). */
static void test_mla_layout(void) {
    /* a public Kimi-K2.5 MLA drafter's config.json as published (k-l-lambda/Kimi-K2.5-Eagle3,
       the layout of lightseekorg/kimi-k2.5-eagle3-mla), against Kimi-K2.5's shape */
    static const char kimi_mla[] =
        "{\"architectures\": [\"Eagle3DeepseekV2ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
        " \"bos_token_id\": 163584, \"draft_vocab_size\": 163840, \"dtype\": \"bfloat16\", \"eagle_config\":"
        " {\"eagle_aux_hidden_state_layer_ids\": [2, 30, 58], \"use_aux_hidden_state\": true}, \"eos_token_id\": 163585,"
        " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 7168, \"initializer_range\": 0.02,"
        " \"intermediate_size\": 18432, \"max_position_embeddings\": 262144, \"max_window_layers\": 48, \"mlp_bias\": false,"
        " \"model_type\": \"kimi_k2\", \"num_attention_heads\": 64, \"num_hidden_layers\": 1, \"num_key_value_heads\": 64,"
        " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0,"
        " \"factor\": 64.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096,"
        " \"type\": \"yarn\"}, \"rope_theta\": 50000.0, \"sliding_window\": null, \"tie_word_embeddings\": false,"
        " \"transformers_version\": \"4.57.1\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 163840,"
        " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"q_lora_rank\": 1536, \"kv_lora_rank\": 512,"
        " \"v_head_dim\": 128, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1}";
    {
        eg_config kt;
        memset(&kt, 0, sizeof kt);
        kt.hidden = 7168;
        kt.vocab = 163840;
        kt.n_layers = 61;
        eg_eagle3_config kc;
        eg_eagle3_opts ko = {0};
        eg_error ke = {0};
        CHECK_OK(eg_drafter_eagle3_parse_config(kimi_mla, sizeof kimi_mla - 1, "kimi-k2.5-eagle3-mla", &kt, &ko, &kc, &ke),
                 &ke);
        CHECKF(kc.mla && kc.heads == 64 && kc.kv_lora == 512 && kc.qk_rope == 64 && kc.cache_bytes_per_token == 1152 &&
                   kc.draft_vocab == 163840 && kc.n_aux == 3 && kc.aux_layers[0] == 1 && kc.aux_layers[1] == 29 &&
                   kc.aux_layers[2] == 57,
               "the public MLA config: mla %d, cache %lld, aux %d %d %d", kc.mla, (long long)kc.cache_bytes_per_token,
               kc.n_aux > 0 ? kc.aux_layers[0] : -1, kc.n_aux > 1 ? kc.aux_layers[1] : -1,
               kc.n_aux > 2 ? kc.aux_layers[2] : -1);
        eg_eagle3_config_free(&kc);
    }
    const char *good = tmpdir("mla_good"), *bad = tmpdir("mla_bad");
    g_mla = 1;
    make_drafter(good, 0, NULL);
    g_mla = 0;
    eg_error e = {0};
    eg_drafter *d = NULL;
    rewrite(good, bad, NULL, NULL, NULL, NULL);
    json_t *j = load_cfg(bad);
    json_t *ec = json_object_get(j, "eagle_config");
    json_object_del(ec, "eaglegen_aux_convention");
    json_object_set_new(ec, "eagle_aux_hidden_state_layer_ids", json_pack("[i,i,i]", 1, 3, 5));
    save_cfg(bad, j);
    CHECK_OK(load(bad, 1, 8, &d, &e), &e);
    if (d) {
        CHECKF(d->info.aux_layers[0] == 0 && d->info.aux_layers[1] == 2 && d->info.aux_layers[2] == 4 &&
                   strstr(eg_drafter_eagle3_aux_source(d), "vLLM"),
               "ids [1, 3, 5] read as layers %d %d %d (%s)", d->info.aux_layers[0], d->info.aux_layers[1],
               d->info.aux_layers[2], eg_drafter_eagle3_aux_source(d));
        CHECK(!strcmp(eg_drafter_eagle3_backend(d), "cpu") && d->info.cache_bytes_per_token == 2 * (32 + 8));
        eg_drafter_free(d);
    }
    rewrite(good, bad, "midlayer.self_attn.kv_b_proj.weight", NULL, NULL, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "midlayer.self_attn.kv_b_proj.weight", "model.safetensors");
    rewrite(good, bad, NULL, "midlayer.self_attn.kv_b_proj.weight", NULL, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "midlayer.self_attn.kv_b_proj.weight", "shape");
    rewrite(good, bad, NULL, "midlayer.self_attn.q_a_proj.weight", NULL, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "midlayer.self_attn.q_a_proj.weight", "shape");
    struct { const char *key; json_t *val; eg_status code; const char *want; } cases[] = {
        {"n_routed_experts", json_integer(4), EG_ERR_UNSUPPORTED, "dense MLP"},
        {"use_sliding_window", json_true(), EG_ERR_UNSUPPORTED, "sliding window"},
        {"num_hidden_layers", json_integer(2), EG_ERR_UNSUPPORTED, "num_hidden_layers"},
        {"kv_lora_rank", json_integer(0), EG_ERR_CONFIG, "kv_lora_rank"},
        {"vocab_size", json_integer(1000), EG_ERR_CONFIG, "vocab_size 1000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(good, bad, NULL, NULL, NULL, NULL);
        j = load_cfg(bad);
        json_object_set_new(j, cases[i].key, cases[i].val);
        if (!strcmp(cases[i].key, "use_sliding_window")) json_object_set_new(j, "sliding_window", json_integer(4));
        if (!strcmp(cases[i].key, "n_routed_experts")) { /* a whole MoE layer, as DeepSeek's config spells it */
            json_object_set_new(j, "moe_intermediate_size", json_integer(32));
            json_object_set_new(j, "num_experts_per_tok", json_integer(2));
            json_object_set_new(j, "n_shared_experts", json_integer(1));
            json_object_set_new(j, "first_k_dense_replace", json_integer(0));
        }
        save_cfg(bad, j);
        expect_fail(bad, cases[i].code, cases[i].want, "config.json");
    }
}

static void test_bad_checkpoints(void) {
    const char *good = tmpdir("good"), *bad = tmpdir("bad");
    make_drafter(good, 0, NULL);
    rewrite(good, bad, "midlayer.self_attn.k_proj.weight", NULL, NULL, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "midlayer.self_attn.k_proj.weight", "model.safetensors");
    rewrite(good, bad, NULL, "midlayer.mlp.down_proj.weight", NULL, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "midlayer.mlp.down_proj.weight", "shape [64, 95]");
    rewrite(good, bad, NULL, "fc.weight", NULL, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "fc.weight", "[64, 192]");
    rewrite(good, bad, "d2t", NULL, NULL, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "d2t", "draft_vocab_size");
    int64_t d2t[200];
    for (int i = 0; i < 200; i++) d2t[i] = 0;
    d2t[7] = 600; /* target id 607 >= 512 */
    rewrite(good, bad, NULL, NULL, d2t, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "d2t[7]", "outside the vocabulary");
    d2t[7] = 1; /* target 8 twice: d2t[8] = 0 is the repeat */
    rewrite(good, bad, NULL, NULL, d2t, NULL);
    expect_fail(bad, EG_ERR_FORMAT, "d2t[8]", "already taken");
    uint8_t t2d[512] = {0};
    for (int i = 0; i < 200; i++) t2d[2 * i + 50] = 1;
    t2d[51] = 1;
    rewrite(good, bad, NULL, NULL, NULL, t2d);
    expect_fail(bad, EG_ERR_FORMAT, "t2d[51]", "disagrees");
    /* embedding absent is fine (the target's is used) */
    rewrite(good, bad, "embed_tokens.weight", NULL, NULL, NULL);
    eg_error e = {0};
    eg_drafter *d = NULL;
    CHECK_OK(load(bad, 1, 8, &d, &e), &e);
    eg_drafter_free(d);
    /* config */
    struct { const char *key; json_t *val; eg_status code; const char *want; } cases[] = {
        {"num_hidden_layers", json_integer(2), EG_ERR_UNSUPPORTED, "num_hidden_layers"},
        {"rope_scaling", json_pack("{s:s, s:f}", "rope_type", "yarn", "factor", 4.0), EG_ERR_UNSUPPORTED, "rope_scaling"},
        {"vocab_size", json_integer(1000), EG_ERR_CONFIG, "vocab_size 1000"},
        {"target_hidden_size", json_integer(32), EG_ERR_CONFIG, "target_hidden_size"},
        {"architectures", json_pack("[s]", "LlamaForCausalLM"), EG_ERR_UNSUPPORTED, "architectures"},
        {"hidden_size", json_string("64"), EG_ERR_CONFIG, "hidden_size"},
        {"attention_bias", json_true(), EG_ERR_UNSUPPORTED, "attention_bias"},
        {"num_key_value_heads", json_integer(3), EG_ERR_CONFIG, "num_key_value_heads"},
        {"draft_vocab_size", json_integer(199), EG_ERR_FORMAT, "lm_head.weight"},
        {"hidden_act", json_string("gelu"), EG_ERR_UNSUPPORTED, "hidden_act"},
        {"eagle_config", json_string("x"), EG_ERR_CONFIG, "eagle_config"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rewrite(good, bad, NULL, NULL, NULL, NULL);
        json_t *j = load_cfg(bad);
        json_object_set_new(j, cases[i].key, cases[i].val);
        save_cfg(bad, j);
        expect_fail(bad, cases[i].code, cases[i].want, i == 8 ? "model.safetensors" : "config.json");
    }
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", bad);
    FILE *f = fopen(p, "w");
    fputs("{\"hidden_size\": 64,", f);
    fclose(f);
    expect_fail(bad, EG_ERR_CONFIG, "config.json", NULL);
    unlink(p);
    expect_fail(bad, EG_ERR_CONFIG, "config.json", NULL);
}

/* TorchSpec's Kimi-K2.5 drafter config (configs/draft_models/kimi_k25_eagle3.json, what
 * the public lightseekorg/kimi-k2.5-eagle3 was trained with) pins no aux layers, has no
 * draft_vocab_size, target_hidden_size or eagle_config, and its checkpoint no d2t / t2d
 * (full vocabulary). The same key set at tiny-a's sizes must load as the drafter it is:
 * the default aux set (the serving engines' choice), Vd = V, identity vocabulary map, and
 * proposals and logits bit-identical to the same weights under mkmodel's config. */
static void test_torchspec_kimi_config(void) {
    const char *ref = tmpdir("ts_ref"), *ts = tmpdir("ts_cfg");
    static const int aux1[1] = {1}; /* tiny-a (5 layers): the default set is [1] */
    eg_mkdrafter_opts mo = {.target_dir = TARGET, .out_dir = ref, .seed = 11, .draft_vocab = 512, .n_aux = 1,
                            .aux_layers = aux1};
    eg_error e = {0};
    CHECK_OK(eg_mkmodel_drafter(&mo, &e), &e);
    const char *mid = tmpdir("ts_mid");
    rewrite(ref, mid, "d2t", NULL, NULL, NULL);
    rewrite(mid, ts, "t2d", NULL, NULL, NULL);
    json_t *r = load_cfg(ref);
    json_t *j = json_pack("{s:[s], s:b, s:f, s:i, s:i, s:O, s:s, s:O, s:f, s:O, s:i, s:i, s:s, s:O, s:i, s:O, s:O, "
                          "s:n, s:O, s:n, s:b, s:s, s:s, s:b, s:b, s:O}",
                          "architectures", "LlamaForCausalLMEagle3", "attention_bias", 0, "attention_dropout", 0.0,
                          "bos_token_id", 1, "eos_token_id", 2, "head_dim", json_object_get(r, "head_dim"),
                          "hidden_act", "silu", "hidden_size", json_object_get(r, "hidden_size"),
                          "initializer_range", 0.02, "intermediate_size", json_object_get(r, "intermediate_size"),
                          "max_position_embeddings", 262144, "max_window_layers", 36, "model_type", "llama",
                          "num_attention_heads", json_object_get(r, "num_attention_heads"), "num_hidden_layers", 1,
                          "num_key_value_heads", json_object_get(r, "num_key_value_heads"), "rms_norm_eps",
                          json_object_get(r, "rms_norm_eps"), "rope_scaling", "rope_theta",
                          json_object_get(r, "rope_theta"), "sliding_window", "tie_word_embeddings", 0,
                          "torch_dtype", "bfloat16", "transformers_version", "4.51.0", "use_cache", 1,
                          "use_sliding_window", 0, "vocab_size", json_object_get(r, "vocab_size"));
    EG_ASSERT(j);
    json_decref(r);
    save_cfg(ts, j);
    eg_drafter *a = NULL, *b = NULL;
    CHECK_OK(load(ref, 1, 16, &a, &e), &e);
    CHECK_OK(load(ts, 1, 16, &b, &e), &e);
    if (!a || !b) {
        eg_drafter_free(a);
        eg_drafter_free(b);
        return;
    }
    CHECK(b->info.n_aux == 1 && b->info.aux_layers[0] == 1);
    CHECKF(strstr(eg_drafter_eagle3_aux_source(b), "none pinned") != NULL, "aux source: %s",
           eg_drafter_eagle3_aux_source(b));
    enum { N = 6 };
    static float aux[N][64];
    int32_t next[N], seq[16] = {0}, pa[3], pb[3];
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < 64; i++) aux[t][i] = (float)(2.0 * urand() - 1.0);
        next[t] = (int32_t)(urand() * 512);
    }
    uint64_t ra = 0, rb = 0;
    CHECK_OK(eg_drafter_extend(a, 0, 0, N, &aux[0][0], next, &e), &e);
    CHECK_OK(eg_drafter_extend(b, 0, 0, N, &aux[0][0], next, &e), &e);
    CHECK_OK(eg_drafter_propose(a, 0, seq, N + 1, 3, &greedy, &ra, pa, NULL, &e), &e);
    CHECK_OK(eg_drafter_propose(b, 0, seq, N + 1, 3, &greedy, &rb, pb, NULL, &e), &e);
    CHECK(!memcmp(pa, pb, sizeof pa));
    CHECK(!memcmp(eg_drafter_eagle3_last_logits(a), eg_drafter_eagle3_last_logits(b), sizeof(float) * 512));
    eg_drafter_free(a);
    eg_drafter_free(b);
    /* only a config that pins nothing gets the default: ids pinned without a convention
       are still read by the rules above (here ambiguous), and pinned as the default set but
       three of them where the fc takes one, the fc's shape names the mismatch */
    j = load_cfg(ts);
    json_object_set_new(j, "eagle_aux_hidden_state_layer_ids", json_pack("[i,i,i]", 0, 2, 4));
    save_cfg(ts, j);
    expect_fail(ts, EG_ERR_CONFIG, "ambiguous", "config.json");
    j = load_cfg(ts);
    json_object_set_new(j, "eagle_config", json_pack("{s:[i,i,i], s:s}", "eagle_aux_hidden_state_layer_ids", 0, 2, 4,
                                                     "eaglegen_aux_convention", "output_of_layer"));
    json_object_del(j, "eagle_aux_hidden_state_layer_ids");
    save_cfg(ts, j);
    expect_fail(ts, EG_ERR_FORMAT, "fc.weight", NULL);
}

static void test_bad_calls(void) {
    const char *dir = tmpdir("calls");
    make_drafter(dir, 0, NULL);
    eg_error e = {0};
    eg_drafter *d = NULL;
    CHECK_OK(load(dir, 2, 6, &d, &e), &e);
    if (!d) return;
    static float aux[8][3][64];
    int32_t next[8] = {1, 2, 3, 4, 5, 6, 7, 8}, seq[16], dr[8];
    uint64_t rng = 0;
    CHECK(eg_drafter_propose(d, 0, seq, 1, 1, &greedy, &rng, dr, NULL, &e) == EG_ERR_INVALID);
    CHECK(strstr(e.msg, "extend it first") != NULL);
    CHECK(eg_drafter_extend(d, 0, 1, 1, &aux[0][0][0], next, &e) == EG_ERR_INVALID && strstr(e.msg, "length is 0"));
    CHECK(eg_drafter_extend(d, 2, 0, 1, &aux[0][0][0], next, &e) == EG_ERR_INVALID && strstr(e.msg, "slot 2"));
    CHECK(eg_drafter_extend(d, 0, 0, 7, &aux[0][0][0], next, &e) == EG_ERR_INVALID && strstr(e.msg, "max_seq_len 6"));
    int32_t badtok = 512;
    CHECK(eg_drafter_extend(d, 0, 0, 1, &aux[0][0][0], &badtok, &e) == EG_ERR_INVALID && strstr(e.msg, "512"));
    CHECK(eg_drafter_eagle3_slot_len(d, 0) == 0);
    CHECK_OK(eg_drafter_extend(d, 0, 0, 4, &aux[0][0][0], next, &e), &e);
    CHECK(eg_drafter_propose(d, 0, seq, 4, 1, &greedy, &rng, dr, NULL, &e) == EG_ERR_INVALID); /* n_seq - 1 != 4 */
    CHECK(eg_drafter_propose(d, 0, seq, 5, 4, &greedy, &rng, dr, NULL, &e) == EG_ERR_INVALID); /* 4 + 3 > 6 */
    CHECK(strstr(e.msg, "max_seq_len") != NULL);
    CHECK_OK(eg_drafter_propose(d, 0, seq, 5, 3, &greedy, &rng, dr, NULL, &e), &e);
    CHECK(eg_drafter_eagle3_slot_len(d, 0) == 6);
    CHECK(eg_drafter_propose(d, 0, seq, 0, 0, &greedy, &rng, dr, NULL, &e) == EG_ERR_INVALID);
    eg_drafter_free(d);
    eg_drafter_free(NULL);
    CHECK(load(dir, 0, 8, &d, &e) == EG_ERR_INVALID);
    eg_eagle3_opts bo = {.threads = 1, .backend = "tpu"};
    d = NULL;
    CHECK(eg_drafter_eagle3_load_opts(dir, target(), 1, 8, &bo, &d, &e) == EG_ERR_INVALID && d == NULL);
    CHECK(strstr(e.msg, "\"tpu\"") != NULL);
    bo.backend = "cpu";
    bo.max_rows = -1;
    CHECK(eg_drafter_eagle3_load_opts(dir, target(), 1, 8, &bo, &d, &e) == EG_ERR_INVALID && d == NULL);
    CHECK(strstr(e.msg, "max_rows -1") != NULL);
}

static void cleanup(void) {
    if (!g_tmp[0]) return;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (system(cmd) != 0) fprintf(stderr, "    could not remove %s\n", g_tmp);
}

int main(int argc, char **argv) {
    static const eg_test tests[] = {
        {"reference_own_embed", test_reference_own_embed},
        {"reference_target_embed_nbr", test_reference_target_embed_nbr},
        {"reference_speculators", test_reference_speculators},
        {"truncate_extend", test_truncate_extend},
        {"reference_backend_cpu", test_reference_backend_cpu},
        {"truncate_extend_backend_cpu", test_truncate_extend_backend_cpu},
        {"paged_cache", test_paged_cache},
        {"paged_cache_backend_cpu", test_paged_cache_backend_cpu},
        {"paged_cache_mla", test_paged_cache_mla},
        {"reference_mla", test_reference_mla},
        {"mla_layout", test_mla_layout},
        {"reference_fc_norm", test_reference_fc_norm},
        {"backend_draws", test_backend_draws},
        {"backend_cpu_bits", test_backend_cpu_bits},
        {"many_equals_one", test_many_equals_one},
        {"q_monotone", test_q_monotone},
        {"q_permuted", test_q_permuted},
        {"draws_follow_q", test_draws_follow_q},
        {"aux_conventions", test_aux_conventions},
        {"torchspec_kimi_config", test_torchspec_kimi_config},
        {"speculators_layout", test_speculators_layout},
        {"bad_checkpoints", test_bad_checkpoints},
        {"bad_calls", test_bad_calls},
    };
    int rc = eg_test_main("test_engine_drafter", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    cleanup();
    if (g_have_target) eg_model_free(&g_target);
    return rc;
}
