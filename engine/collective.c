/* collective.c — the expert-parallel group (collective.h): the local implementation, and
 * the dispatch to the CUDA ones (collective_cuda.c). */
#include "engine/collective.h"

#include "engine/collective_cuda.h"
#include "engine/cuda_plan.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ep_post {
    int T;
    const float *x;             /* [T][H] the rank's normed rows */
    const int32_t *ids;         /* [T][K] */
    const float *w;             /* [T][K] */
    int layer;                  /* the MoE layer of the call */
    int left;
} ep_post;

typedef struct ep_rank {
    float *contrib; /* [max_tokens*K][H] contributions to this rank's (t,k) pairs */
    float *xs, *ys; /* [max_tokens][H] chunk rows in / out */
    int32_t *ids1;  /* [max_tokens] */
    float *w1;      /* [max_tokens] */
    int32_t *dst;   /* [max_tokens] pair index in the owner */
    int64_t remote_pairs, bytes;
} ep_rank;

struct eg_ep_group {
    eg_ep_opts o;
    ep_post *post;  /* [n_ranks] */
    ep_rank *rk;    /* [n_ranks] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t gen;
    int failed;
    const eg_expert_w **layers; /* [n_ranks][n_layers] each rank's registered experts */
    eg_ep_cuda *cuda;           /* CUDA ranks (nccl or cuda-local), or NULL: local CPU ranks */
};

void eg_ep_group_free(eg_ep_group *g) {
    if (!g) return;
    for (int r = 0; g->rk && r < g->o.n_ranks; r++) {
        free(g->rk[r].contrib); free(g->rk[r].xs); free(g->rk[r].ys);
        free(g->rk[r].ids1); free(g->rk[r].w1); free(g->rk[r].dst);
    }
    free(g->rk);
    free(g->post);
    free(g->layers);
    eg_ep_cuda_free(g->cuda);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

eg_status eg_ep_group_create(const eg_ep_opts *o, eg_ep_group **out, eg_error *err) {
    *out = NULL;
    if (o->n_ranks < 1 || o->n_experts < 1 || o->n_experts % o->n_ranks)
        return eg_fail(err, EG_ERR_INVALID, "--ep %d: must be >= 1 and divide the expert count %d", o->n_ranks,
                       o->n_experts);
    if (o->topk < 1 || o->hidden < 1 || o->max_tokens < 1)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel group: topk %d, hidden %d, max_tokens %d", o->topk,
                       o->hidden, o->max_tokens);
    if (o->n_layers < 1)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel group: n_layers %d", o->n_layers);
    int n_cuda = 0;
    for (int r = 0; o->backends && r < o->n_ranks; r++) n_cuda += !eg_backend_cuda_device(o->backends[r], NULL, NULL);
    if (n_cuda && n_cuda != o->n_ranks)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "expert-parallel group: %d of %d ranks on CUDA backends (all or none)",
                       n_cuda, o->n_ranks);
    eg_ep_group *g = eg_calloc(1, sizeof *g, err);
    if (!g) return EG_ERR_NOMEM;
    g->o = *o;
    g->o.backends = NULL; /* borrowed only for the duration of create */
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->layers = eg_calloc((size_t)o->n_ranks * (size_t)o->n_layers, sizeof *g->layers, err);
    if (!g->layers) { eg_ep_group_free(g); return EG_ERR_NOMEM; }
    if (n_cuda) {
        eg_status st = eg_ep_cuda_create(o, &g->cuda, err);
        if (st) { eg_ep_group_free(g); return st; }
        *out = g;
        return EG_OK;
    }
    g->post = eg_calloc((size_t)o->n_ranks, sizeof *g->post, err);
    g->rk = eg_calloc((size_t)o->n_ranks, sizeof *g->rk, err);
    if (!g->post || !g->rk) { eg_ep_group_free(g); return EG_ERR_NOMEM; }
    size_t H = (size_t)o->hidden, T = (size_t)o->max_tokens;
    for (int r = 0; r < o->n_ranks; r++) {
        ep_rank *k = &g->rk[r];
        k->contrib = eg_malloc(sizeof(float) * T * (size_t)o->topk * H, err);
        k->xs = eg_malloc(sizeof(float) * T * H, err);
        k->ys = eg_malloc(sizeof(float) * T * H, err);
        k->ids1 = eg_malloc(sizeof(int32_t) * T, err);
        k->w1 = eg_malloc(sizeof(float) * T, err);
        k->dst = eg_malloc(sizeof(int32_t) * T, err);
        if (!k->contrib || !k->xs || !k->ys || !k->ids1 || !k->w1 || !k->dst) { eg_ep_group_free(g); return EG_ERR_NOMEM; }
    }
    *out = g;
    return EG_OK;
}

void eg_ep_range(const eg_ep_group *g, int rank, int *e0, int *e1) {
    int per = g->o.n_experts / g->o.n_ranks;
    *e0 = rank * per;
    *e1 = *e0 + per;
}

const char *eg_ep_kind(const eg_ep_group *g) { return g->cuda ? eg_ep_cuda_kind(g->cuda) : "local"; }

int64_t eg_ep_device_bytes(const eg_ep_opts *o) { return eg_ep_cuda_bytes(o); }

void eg_ep_register(eg_ep_group *g, int rank, int layer, const eg_expert_w *experts) {
    if (rank >= 0 && rank < g->o.n_ranks && layer >= 0 && layer < g->o.n_layers)
        g->layers[(size_t)rank * (size_t)g->o.n_layers + (size_t)layer] = experts;
}

void eg_ep_fail(eg_ep_group *g) {
    if (g->cuda) eg_ep_cuda_fail(g->cuda);
    pthread_mutex_lock(&g->mu);
    g->failed = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void eg_ep_traffic(const eg_ep_group *g, int64_t *remote_pairs, int64_t *bytes) {
    *remote_pairs = 0;
    *bytes = 0;
    if (g->cuda) {
        eg_ep_cuda_traffic(g->cuda, remote_pairs, bytes);
        return;
    }
    for (int r = 0; r < g->o.n_ranks; r++) {
        *remote_pairs += g->rk[r].remote_pairs;
        *bytes += g->rk[r].bytes;
    }
}

/* Every rank arrives; 1 = a rank failed. */
static int barrier(eg_ep_group *g) {
    pthread_mutex_lock(&g->mu);
    uint64_t gen = g->gen;
    if (++g->arrived == g->o.n_ranks) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->gen && !g->failed) pthread_cond_wait(&g->cv, &g->mu);
    }
    int f = g->failed;
    pthread_mutex_unlock(&g->mu);
    return f;
}

static eg_status flush(eg_ep_group *g, int rank, eg_backend *be, const eg_expert_w *experts, int n, float *contrib,
                       eg_error *err) {
    ep_rank *k = &g->rk[rank];
    size_t H = (size_t)g->o.hidden;
    if (!n) return EG_OK;
    memset(k->ys, 0, sizeof(float) * (size_t)n * H);
    int e0, e1;
    eg_ep_range(g, rank, &e0, &e1);
    /* each pair as a one-expert token: 0 + w * expert(x), the bits the unsplit op adds */
    eg_moe_args a = {.T = n, .x = k->xs, .ids = k->ids1, .weights = k->w1, .topk = 1, .experts = experts,
                     .e0 = e0, .e1 = e1, .y = k->ys};
    eg_status st = be->ops->moe(be, &a, err);
    if (st) return st;
    for (int j = 0; j < n; j++) memcpy(contrib + (size_t)k->dst[j] * H, k->ys + (size_t)j * H, sizeof(float) * H);
    return EG_OK;
}

/* Phase 2: rank computes every posted pair routed to its experts. */
static eg_status serve(eg_ep_group *g, int rank, eg_backend *be, eg_error *err) {
    ep_rank *k = &g->rk[rank];
    int K = g->o.topk, R = g->o.n_ranks;
    size_t H = (size_t)g->o.hidden;
    int e0, e1;
    eg_ep_range(g, rank, &e0, &e1);
    int layer = -1;
    for (int q = 0; q < R && layer < 0; q++)
        if (!g->post[q].left) layer = g->post[q].layer;
    if (layer < 0) return EG_OK;
    /* this rank's own experts (a rank holds only its range: forward.c) */
    const eg_expert_w *ex = g->layers[(size_t)rank * (size_t)g->o.n_layers + (size_t)layer];
    for (int q = 0; q < R; q++) {
        const ep_post *p = &g->post[q];
        if (p->left || !p->T) continue;
        if (p->layer != layer)
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: ranks out of step (layer %d and %d)", rank,
                           layer, p->layer);
        if (!ex) return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: no experts registered for layer %d", rank, layer);
        int n = 0;
        for (int i = 0; i < p->T * K; i++) {
            int e = p->ids[i];
            if (e < e0 || e >= e1) continue;
            memcpy(k->xs + (size_t)n * H, p->x + (size_t)(i / K) * H, sizeof(float) * H);
            k->ids1[n] = e;
            k->w1[n] = p->w[i];
            k->dst[n] = i;
            if (q != rank) { k->remote_pairs++; k->bytes += (int64_t)(2 * H * sizeof(float)); }
            if (++n == g->o.max_tokens) {
                eg_status st = flush(g, rank, be, ex, n, g->rk[q].contrib, err);
                if (st) return st;
                n = 0;
            }
        }
        eg_status st = flush(g, rank, be, ex, n, g->rk[q].contrib, err);
        if (st) return st;
    }
    return EG_OK;
}

static eg_status failed_status(eg_error *err) {
    return eg_fail(err, EG_ERR_INTERRUPTED, "expert-parallel group: another rank failed");
}

eg_status eg_ep_moe(eg_ep_group *g, int rank, int layer, eg_backend *be, const eg_moe_args *a, eg_error *err) {
    int K = g->o.topk;
    size_t H = (size_t)g->o.hidden;
    if (a->T > g->o.max_tokens || a->topk != K || layer < 0 || layer >= g->o.n_layers) {
        eg_ep_fail(g);
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel moe: T=%d topk=%d layer %d (group: max %d, topk %d, %d layers)",
                       a->T, a->topk, layer, g->o.max_tokens, K, g->o.n_layers);
    }
    if (g->cuda) {
        eg_status st = eg_ep_cuda_moe(g->cuda, rank, layer, g->layers + (size_t)rank * (size_t)g->o.n_layers, be, a, err);
        if (st) eg_ep_fail(g);
        return st;
    }
    g->post[rank] = (ep_post){.T = a->T, .x = a->x, .ids = a->ids, .w = a->weights, .layer = layer};
    if (barrier(g)) return failed_status(err);
    eg_status st = serve(g, rank, be, err);
    if (st) { eg_ep_fail(g); return st; }
    if (barrier(g)) return failed_status(err);
    /* Phase 3: add the contributions in k order, as the unsplit op does */
    const float *c = g->rk[rank].contrib;
    for (int t = 0; t < a->T; t++)
        for (int k = 0; k < K; k++) {
            const float *o = c + ((size_t)t * (size_t)K + (size_t)k) * H;
            float *y = a->y + (size_t)t * H;
            for (size_t h = 0; h < H; h++) y[h] += o[h];
        }
    return EG_OK;
}

eg_status eg_ep_leave(eg_ep_group *g, int rank, eg_backend *be, eg_error *err) {
    if (g->cuda) {
        eg_status st = eg_ep_cuda_leave(g->cuda, rank, g->layers + (size_t)rank * (size_t)g->o.n_layers, be, err);
        if (st) eg_ep_fail(g);
        return st;
    }
    for (;;) {
        g->post[rank] = (ep_post){.left = 1};
        if (barrier(g)) return failed_status(err);
        int all = 1;
        for (int q = 0; q < g->o.n_ranks; q++) all &= g->post[q].left;
        if (all) return EG_OK; /* every rank saw the same posts: all return together */
        eg_status st = serve(g, rank, be, err);
        if (st) { eg_ep_fail(g); return st; }
        if (barrier(g)) return failed_status(err);
    }
}
