/* Expert-parallel group, the shared expert / dense MLP split (collective.h, ffn_split):
 * three CPU ranks on threads with different token counts call eg_ep_ffn for five layers
 * (layer 0 dense: written; layers 1..4 shared experts: added to rows that already hold
 * a routed sum); layer l's weights are registered by rank l mod 3 only. Every rank's
 * rows must equal, bit for bit, the unsplit swiglu_mlp on its own backend's twin. In a
 * second round rank 2 has left (eg_ep_leave) and must still serve layer 2 for the
 * others. Also: the rows counted as crossing ranks, and calls the group must refuse.
 * And the vocab split (vocab_split): eg_ep_embed and eg_ep_logits against the unsplit
 * embed and linear, a rank that left still serving its vocab rows. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/eg_thread.h"
#include "engine/backend.h"
#include "engine/collective.h"
#include "tests/check.h"

enum { R = 3, L = 5, MAXT = 8, ROUNDS = 2 };
static const int T_of[R] = {5, 1, 7};

static uint64_t rs;
static double urand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) * 0x1.0p-53;
}
static float nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static eg_config small_cfg(void) {
    eg_config c;
    memset(&c, 0, sizeof c);
    c.hidden = 48; c.n_layers = L; c.n_heads = 3; c.q_lora_rank = 0; c.kv_lora_rank = 24;
    c.qk_nope = 8; c.qk_rope = 6; c.v_head = 10; c.inter = 40; c.moe_inter = 16; c.n_experts = 6;
    c.n_shared = 1; c.topk = 2; c.n_group = 1; c.topk_group = 1; c.routed_scale = 1.0f; c.norm_topk = 1;
    c.rms_eps = 1e-6f; c.vocab = 50; c.rope_theta = 10000;
    return c;
}

static eg_weight bf16_w(int64_t rows, int64_t cols, float sd) {
    uint16_t *d = malloc(2 * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) d[i] = eg_f32_to_bf16(nrand() * sd);
    eg_weight w;
    memset(&w, 0, sizeof w);
    w.fmt = EG_W_BF16; w.rows = rows; w.cols = cols; w.name = "test"; w.data = d;
    return w;
}

/* n CPU backends for c (one thread each); 0 when one could not be made (checked). */
static int cpu_backends(const eg_config *c, eg_backend **be, int n) {
    eg_error err = {0};
    eg_backend_opts bo = {.name = "cpu", .max_tokens = MAXT, .max_seq_len = 64, .nthreads = 1};
    int ok = 1;
    for (int r = 0; r < n; r++) {
        CHECK_OK(eg_backend_create(c, &bo, &be[r], &err), &err);
        ok &= be[r] != NULL;
    }
    return ok;
}

/* Ranks 1..R-1 on threads, rank 0 on this one: fn(jobs + r * stride) for each, joined. */
static void run_ranks(eg_ep_group *g, void *(*fn)(void *), void *jobs, size_t stride) {
    pthread_t th[R];
    int started[R] = {0}, all = 1;
    for (int r = 1; r < R; r++) {
        started[r] = !eg_thread_start(&th[r], fn, (char *)jobs + (size_t)r * stride);
        CHECKF(started[r], "rank %d: no thread", r);
        all &= started[r];
    }
    if (!all) eg_ep_fail(g);
    fn(jobs);
    for (int r = 1; r < R; r++)
        if (started[r]) pthread_join(th[r], NULL);
}

typedef struct rank_job {
    eg_ep_group *g;
    eg_backend *be;
    int rank, rounds;    /* rounds of the L layers it runs before it leaves */
    float *x[ROUNDS];    /* [T][H] its rows per round */
    float *y[ROUNDS][L]; /* [T][H] per round and layer: starts as y0, ends as the call left it */
    eg_status st;
    eg_error err;
} rank_job;

static void *rank_main(void *v) {
    rank_job *j = v;
    for (int k = 0; k < j->rounds && !j->st; k++)
        for (int l = 0; l < L && !j->st; l++)
            j->st = eg_ep_ffn(j->g, j->rank, l, j->be, j->x[k], T_of[j->rank], j->y[k][l], l > 0, &j->err);
    if (!j->st) j->st = eg_ep_leave(j->g, j->rank, j->be, &j->err);
    return NULL;
}

static void test_ffn_split_exact(void) {
    rs = eg_test_seed() + 17;
    eg_config c = small_cfg();
    int H = c.hidden, I = c.inter;
    eg_error err = {0};
    eg_backend *be[R + 1] = {0}; /* the ranks', then the unsplit reference's */
    if (!cpu_backends(&c, be, R + 1)) return;
    eg_backend *ref_be = be[R];
    eg_ep_opts go = {.n_ranks = R, .n_experts = c.n_experts, .topk = c.topk, .hidden = H, .max_tokens = MAXT,
                     .n_layers = L, .backends = be, .ffn_split = 1};
    eg_ep_group *g = NULL;
    CHECK_OK(eg_ep_group_create(&go, &g, &err), &err);
    if (!g) return;
    eg_weight w[L][3];
    for (int l = 0; l < L; l++) {
        w[l][0] = bf16_w(I, H, 0.2f), w[l][1] = bf16_w(I, H, 0.2f), w[l][2] = bf16_w(H, I, 0.2f);
        CHECKF(eg_ep_ffn_owner(g, l) == l % R, "layer %d owned by %d", l, eg_ep_ffn_owner(g, l));
        /* every rank offers; only the owner's registration counts */
        for (int r = 0; r < R; r++) eg_ep_register_ffn(g, r, l, &w[l][0], &w[l][1], &w[l][2]);
    }
    rank_job jobs[R];
    memset(jobs, 0, sizeof jobs);
    float *y0[R][ROUNDS];
    for (int r = 0; r < R; r++) {
        size_t n = (size_t)T_of[r] * (size_t)H;
        jobs[r] = (rank_job){.g = g, .be = be[r], .rank = r, .rounds = r == 2 ? 1 : 2};
        for (int k = 0; k < ROUNDS; k++) {
            jobs[r].x[k] = malloc(sizeof(float) * n);
            y0[r][k] = malloc(sizeof(float) * n);
            for (size_t i = 0; i < n; i++) {
                jobs[r].x[k][i] = nrand() * 2;
                /* a routed sum r1 + r2, as the moe op leaves the block output */
                float r1 = nrand(), r2 = nrand();
                y0[r][k][i] = r1;
                y0[r][k][i] += r2;
            }
            for (int l = 0; l < L; l++) {
                jobs[r].y[k][l] = malloc(sizeof(float) * n);
                memcpy(jobs[r].y[k][l], y0[r][k], sizeof(float) * n);
            }
        }
    }
    run_ranks(g, rank_main, jobs, sizeof jobs[0]);
    for (int r = 0; r < R; r++) CHECKF(!jobs[r].st, "rank %d: %s", r, jobs[r].err.msg);
    /* the unsplit op on each rank's own rows (the batch the unsplit rank runs) */
    int64_t crossed = 0;
    for (int r = 0; r < R; r++) {
        size_t n = (size_t)T_of[r] * (size_t)H;
        float *ref = malloc(sizeof(float) * n);
        for (int k = 0; k < jobs[r].rounds; k++)
            for (int l = 0; l < L; l++) {
                memcpy(ref, y0[r][k], sizeof(float) * n);
                CHECK_OK(ref_be->ops->swiglu_mlp(ref_be, jobs[r].x[k], T_of[r], &w[l][0], &w[l][1], &w[l][2], ref,
                                                 l > 0, &err), &err);
                int diff = 0;
                for (size_t i = 0; i < n; i++) diff += memcmp(&ref[i], &jobs[r].y[k][l][i], sizeof(float)) != 0;
                CHECKF(diff == 0, "rank %d round %d layer %d (owner %d%s): %d of %zu elements differ from unsplit", r,
                       k, l, l % R, k == 1 && l % R == 2 ? ", left" : "", diff, n);
                if (l % R != r) crossed += T_of[r];
            }
        free(ref);
    }
    CHECKF(eg_ep_ffn_rows(g) == crossed, "rows to another rank: %lld, expected %lld", (long long)eg_ep_ffn_rows(g),
           (long long)crossed);
    int64_t pairs = -1, bytes = -1;
    eg_ep_traffic(g, &pairs, &bytes);
    CHECKF(pairs == 0 && bytes == crossed * 2 * H * (int64_t)sizeof(float), "traffic %lld pairs %lld bytes",
           (long long)pairs, (long long)bytes);
    eg_ep_group_free(g);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < ROUNDS; k++) {
            free(jobs[r].x[k]);
            free(y0[r][k]);
            for (int l = 0; l < L; l++) free(jobs[r].y[k][l]);
        }
    for (int l = 0; l < L; l++)
        for (int i = 0; i < 3; i++) free((void *)w[l][i].data);
    for (int r = 0; r < R; r++) eg_backend_free(be[r]);
    eg_backend_free(ref_be);
}

/* A group without the split has no owners and refuses the call; a split group refuses
 * more rows than it was sized for and a layer it does not have. One rank: the refusals
 * come before any barrier. */
static void test_ffn_split_refusals(void) {
    eg_config c = small_cfg();
    eg_error err = {0};
    eg_backend *be = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = MAXT, .max_seq_len = 64, .nthreads = 1};
    CHECK_OK(eg_backend_create(&c, &bo, &be, &err), &err);
    if (!be) return;
    float x[(MAXT + 1) * 48] = {0}, y[(MAXT + 1) * 48] = {0};
    for (int split = 0; split <= 1; split++) {
        eg_ep_opts go = {.n_ranks = 1, .n_experts = c.n_experts, .topk = c.topk, .hidden = c.hidden,
                         .max_tokens = MAXT, .n_layers = L, .backends = &be, .ffn_split = split};
        eg_ep_group *g = NULL;
        CHECK_OK(eg_ep_group_create(&go, &g, &err), &err);
        if (!g) continue;
        CHECK(eg_ep_ffn_owner(g, 3) == (split ? 0 : -1));
        eg_status st = eg_ep_ffn(g, 0, 1, be, x, split ? MAXT + 1 : 2, y, 1, &err);
        CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "expert-parallel ffn"), "split %d: %d %s", split, st, err.msg);
        if (split) {
            st = eg_ep_ffn(g, 0, L, be, x, 2, y, 1, &err);
            CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "layer 5"), "layer out of range: %d %s", st, err.msg);
        } else {
            CHECKF(strstr(err.msg, "split none"), "%s", err.msg);
        }
        eg_ep_group_free(g);
    }
    eg_ep_group_free(NULL);
    eg_backend_free(be);
}

/* The vocab split (vocab_split): V = 50 rows over three ranks (16, 17, 17). Each rank
 * embeds its tokens (ids from every rank's range) and computes the logits of its rows,
 * both through the group; rank 1 has no logit rows in round 2, and rank 2 leaves after
 * round 1 and must still serve its rows and columns. Every row and logit must equal, bit
 * for bit, the unsplit embed and linear over the whole tables. */
typedef struct vocab_job {
    eg_ep_group *g;
    eg_backend *be;
    int rank, rounds;
    int32_t tok[ROUNDS][MAXT];
    int n_log[ROUNDS];
    float *rows[ROUNDS];   /* [MAXT][H] logit rows in */
    float *x[ROUNDS];      /* [T][H] embedded */
    float *logits[ROUNDS]; /* [n][V] */
    eg_status st;
    eg_error err;
} vocab_job;

static void *vocab_main(void *v) {
    vocab_job *j = v;
    for (int k = 0; k < j->rounds && !j->st; k++) {
        j->st = eg_ep_embed(j->g, j->rank, j->be, j->tok[k], T_of[j->rank], j->x[k], &j->err);
        if (!j->st) j->st = eg_ep_logits(j->g, j->rank, j->be, j->rows[k], j->n_log[k], j->logits[k], &j->err);
    }
    if (!j->st) j->st = eg_ep_leave(j->g, j->rank, j->be, &j->err);
    return NULL;
}

static void test_vocab_split_exact(void) {
    rs = eg_test_seed() + 29;
    eg_config c = small_cfg();
    int H = c.hidden, V = c.vocab;
    eg_error err = {0};
    eg_backend *be[R + 1] = {0}; /* the ranks', then the unsplit reference's */
    if (!cpu_backends(&c, be, R + 1)) return;
    eg_backend *ref_be = be[R];
    eg_ep_opts go = {.n_ranks = R, .n_experts = c.n_experts, .topk = c.topk, .hidden = H, .max_tokens = MAXT,
                     .n_layers = L, .backends = be, .ffn_split = 1, .vocab_split = 1, .vocab = V};
    eg_ep_group *g = NULL;
    CHECK_OK(eg_ep_group_create(&go, &g, &err), &err);
    if (!g) return;
    CHECK(eg_ep_vocab_split(g) && !eg_ep_vocab_split(NULL));
    eg_weight emb = bf16_w(V, H, 1.0f), head = bf16_w(V, H, 0.3f), es[R], hs[R];
    int64_t want_v0[R] = {0, 16, 33};
    for (int r = 0; r < R; r++) {
        int64_t v0, v1;
        eg_ep_vocab_range(g, r, &v0, &v1);
        CHECKF(v0 == want_v0[r] && v1 == (r + 1 < R ? want_v0[r + 1] : V), "rank %d: rows %lld..%lld", r,
               (long long)v0, (long long)v1);
        CHECK_OK(eg_weight_rows(&emb, v0, v1, &es[r], &err), &err);
        CHECK_OK(eg_weight_rows(&head, v0, v1, &hs[r], &err), &err);
        eg_ep_register_vocab(g, r, &es[r], &hs[r]);
    }
    vocab_job jobs[R];
    memset(jobs, 0, sizeof jobs);
    int64_t remote_embed = 0, remote_logit = 0;
    for (int r = 0; r < R; r++) {
        jobs[r] = (vocab_job){.g = g, .be = be[r], .rank = r, .rounds = r == 2 ? 1 : 2};
        for (int k = 0; k < ROUNDS; k++) {
            for (int t = 0; t < T_of[r]; t++) {
                jobs[r].tok[k][t] = (int32_t)(urand() * V);
                if (k < jobs[r].rounds && (jobs[r].tok[k][t] < want_v0[r] ||
                                           jobs[r].tok[k][t] >= (r + 1 < R ? want_v0[r + 1] : V)))
                    remote_embed++;
            }
            jobs[r].n_log[k] = k == 1 && r == 1 ? 0 : T_of[r];
            if (k < jobs[r].rounds) remote_logit += (int64_t)jobs[r].n_log[k] * (R - 1);
            jobs[r].rows[k] = malloc(sizeof(float) * MAXT * (size_t)H);
            jobs[r].x[k] = calloc((size_t)MAXT * (size_t)H, sizeof(float));
            jobs[r].logits[k] = calloc((size_t)MAXT * (size_t)V, sizeof(float));
            for (int i = 0; i < MAXT * H; i++) jobs[r].rows[k][i] = nrand();
        }
    }
    run_ranks(g, vocab_main, jobs, sizeof jobs[0]);
    for (int r = 0; r < R; r++) CHECKF(!jobs[r].st, "rank %d: %s", r, jobs[r].err.msg);
    float *xr = malloc(sizeof(float) * MAXT * (size_t)H), *lr = malloc(sizeof(float) * MAXT * (size_t)V);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < jobs[r].rounds; k++) {
            int T = T_of[r], n = jobs[r].n_log[k];
            CHECK_OK(ref_be->ops->embed(ref_be, jobs[r].tok[k], T, &emb, xr, &err), &err);
            CHECKF(!memcmp(xr, jobs[r].x[k], sizeof(float) * (size_t)T * (size_t)H),
                   "rank %d round %d: embedding rows differ from unsplit", r, k);
            if (n) CHECK_OK(ref_be->ops->linear(ref_be, jobs[r].rows[k], n, &head, lr, &err), &err);
            int diff = 0;
            for (int i = 0; i < n * V; i++) diff += memcmp(&lr[i], &jobs[r].logits[k][i], sizeof(float)) != 0;
            CHECKF(diff == 0, "rank %d round %d: %d of %d logits differ from unsplit", r, k, diff, n * V);
        }
    int64_t er = -1, lrows = -1;
    eg_ep_vocab_rows(g, &er, &lrows);
    CHECKF(er == remote_embed && lrows == remote_logit, "crossed: %lld embedded (want %lld), %lld logit rows (want %lld)",
           (long long)er, (long long)remote_embed, (long long)lrows, (long long)remote_logit);
    free(xr);
    free(lr);
    eg_ep_group_free(g);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < ROUNDS; k++) { free(jobs[r].rows[k]); free(jobs[r].x[k]); free(jobs[r].logits[k]); }
    free((void *)emb.data);
    free((void *)head.data);
    for (int r = 0; r < R; r++) eg_backend_free(be[r]);
    eg_backend_free(ref_be);
}

/* What the vocab split refuses: one rank, fewer vocab rows than ranks; calls on a group
 * without it; more logit rows than the group was sized for; row views out of range. */
static void test_vocab_split_refusals(void) {
    eg_config c = small_cfg();
    eg_error err = {0};
    eg_backend *be[2] = {0};
    if (!cpu_backends(&c, be, 2)) return;
    eg_ep_opts go = {.n_ranks = 1, .n_experts = c.n_experts, .topk = c.topk, .hidden = c.hidden, .max_tokens = MAXT,
                     .n_layers = L, .backends = be, .vocab_split = 1, .vocab = c.vocab};
    eg_ep_group *g = NULL;
    eg_status st = eg_ep_group_create(&go, &g, &err);
    CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "over 1 ranks"), "one rank: %d %s", st, err.msg);
    go.n_ranks = 2;
    go.vocab = 1;
    st = eg_ep_group_create(&go, &g, &err);
    CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "a vocabulary of 1 rows over 2 ranks"), "V 1: %d %s", st, err.msg);
    go.n_ranks = 1;
    go.vocab_split = 0;
    CHECK_OK(eg_ep_group_create(&go, &g, &err), &err);
    if (g) {
        int32_t tok[2] = {1, 2};
        float x[2 * 48], lg[2 * 50];
        st = eg_ep_embed(g, 0, be[0], tok, 2, x, &err);
        CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "vocab split off"), "embed without the split: %s", err.msg);
        st = eg_ep_logits(g, 0, be[0], x, MAXT + 1, lg, &err);
        CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "lm_head: 9 rows"), "logits: %s", err.msg);
        eg_ep_group_free(g);
    }
    eg_weight w = bf16_w(10, 4, 1.0f), v;
    CHECK(eg_weight_rows(&w, 3, 11, &v, &err) == EG_ERR_INVALID && strstr(err.msg, "rows [3, 11) of 10"));
    CHECK(eg_weight_rows(&w, 4, 4, &v, &err) == EG_ERR_INVALID);
    CHECK_OK(eg_weight_rows(&w, 3, 10, &v, &err), &err);
    CHECK(v.rows == 7 && v.cols == 4 && (const uint16_t *)v.data == (const uint16_t *)w.data + 12);
    eg_weight f8 = {.fmt = EG_W_FP8, .rows = 300, .cols = 200, .data = w.data, .scale = w.data, .name = "f8"};
    CHECK(eg_weight_rows(&f8, 100, 300, &v, &err) == EG_ERR_UNSUPPORTED && strstr(err.msg, "128-row"));
    CHECK_OK(eg_weight_rows(&f8, 128, 300, &v, &err), &err);
    CHECK(v.rows == 172 && (const char *)v.scale == (const char *)f8.scale + 4 * 2);
    free((void *)w.data);
    for (int r = 0; r < 2; r++) eg_backend_free(be[r]);
}

static const eg_test tests[] = {
    {"ffn_split_exact", test_ffn_split_exact},
    {"ffn_split_refusals", test_ffn_split_refusals},
    {"vocab_split_exact", test_vocab_split_exact},
    {"vocab_split_refusals", test_vocab_split_refusals},
};
EG_TEST_MAIN("engine_ep", tests)
