/* Expert-parallel group, the shared expert / dense MLP split (collective.h, ffn_split):
 * three CPU ranks on threads with different token counts call eg_ep_ffn for five layers
 * (layer 0 dense: written; layers 1..4 shared experts: added to rows that already hold
 * a routed sum); layer l's weights are registered by rank l mod 3 only. Every rank's
 * rows must equal, bit for bit, the unsplit swiglu_mlp on its own backend's twin. In a
 * second round rank 2 has left (eg_ep_leave) and must still serve layer 2 for the
 * others. Also: the rows counted as crossing ranks, and calls the group must refuse. */
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
    eg_backend *be[R] = {0}, *ref_be = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = MAXT, .max_seq_len = 64, .nthreads = 1};
    for (int r = 0; r < R; r++) CHECK_OK(eg_backend_create(&c, &bo, &be[r], &err), &err);
    CHECK_OK(eg_backend_create(&c, &bo, &ref_be, &err), &err);
    if (!be[R - 1] || !ref_be) return;
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
    pthread_t th[R];
    int started[R] = {0};
    for (int r = 1; r < R; r++) started[r] = !eg_thread_start(&th[r], rank_main, &jobs[r]);
    for (int r = 1; r < R; r++) CHECKF(started[r], "rank %d: no thread", r);
    if (!started[1] || !started[2]) eg_ep_fail(g);
    rank_main(&jobs[0]);
    for (int r = 1; r < R; r++)
        if (started[r]) pthread_join(th[r], NULL);
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

static const eg_test tests[] = {
    {"ffn_split_exact", test_ffn_split_exact},
    {"ffn_split_refusals", test_ffn_split_refusals},
};
EG_TEST_MAIN("engine_ep", tests)
