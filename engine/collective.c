/* collective.c — the expert-parallel group (collective.h): the local implementation, and
 * the dispatch to the CUDA ones (collective_cuda.c). */
#include "engine/collective.h"

#include "engine/collective_cuda.h"
#include "engine/cuda_plan.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { EP_MOE = 0, EP_FFN = 1, EP_EMBED = 2, EP_LOGITS = 3 };

static const char *kind_name(int kind) {
    return kind == EP_MOE ? "routed" : kind == EP_FFN ? "shared/dense" : kind == EP_EMBED ? "embedding" : "lm_head";
}

typedef struct ep_post {
    int kind;                   /* EP_MOE (eg_ep_moe), EP_FFN (eg_ep_ffn), EP_EMBED, EP_LOGITS */
    int T;
    const float *x;             /* [T][H] the rank's normed rows (EP_LOGITS: its final rows) */
    const int32_t *tok;         /* [T] EP_EMBED: the rank's token ids */
    float *y;                   /* EP_EMBED: [T][H] its rows; EP_LOGITS: [T][V] its logits
                                   (written by the owners in phase 2) */
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
    int *ord;       /* [K] one token's combine order (eg_moe_order) */
    float *ffn_y;   /* [max_tokens][H] ffn_split: this rank's rows' outputs, written by the owner */
    float *vlog;    /* [max_tokens][V/R + 1] vocab_split: its lm_head slice's logits of one rank's rows */
    const eg_weight *vembed, *vhead; /* vocab_split: its [v1-v0][H] slices (borrowed; NULL until registered) */
    int64_t remote_pairs, bytes, ffn_rows, embed_rows, logit_rows;
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
    const eg_expert_w **layers; /* [n_ranks][2 n_layers] each rank's registered experts per
                                   call id (eg_ep_head_id: a split layer's second half) */
    int *cuts;                  /* [n_layers] copy of opts.layer_cuts (0 = whole), or NULL */
    const eg_weight **ffn_w;    /* [n_layers][3] ffn_split: the owner's gate, up, down (NULL
                                   until registered) */
    eg_ep_cuda *cuda;           /* CUDA ranks (nccl or cuda-local), or NULL: local CPU ranks */
};

void eg_ep_group_free(eg_ep_group *g) {
    if (!g) return;
    for (int r = 0; g->rk && r < g->o.n_ranks; r++) {
        free(g->rk[r].contrib); free(g->rk[r].xs); free(g->rk[r].ys);
        free(g->rk[r].ids1); free(g->rk[r].w1); free(g->rk[r].dst); free(g->rk[r].ord); free(g->rk[r].ffn_y); free(g->rk[r].vlog);
    }
    free(g->rk);
    free(g->post);
    free(g->layers);
    free(g->cuts);
    free(g->ffn_w);
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
    if (o->vocab_split && (o->vocab < o->n_ranks || o->n_ranks < 2))
        return eg_fail(err, EG_ERR_INVALID, "--ep-split all: a vocabulary of %d rows over %d ranks (needs ep >= 2 and "
                       "at least one row per rank)", o->vocab, o->n_ranks);
    for (int l = 0; o->layer_cuts && l < o->n_layers; l++)
        if (o->layer_cuts[l] < 0 || o->layer_cuts[l] >= o->n_experts)
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel group: layer %d split at expert %d (0 < cut < %d)", l,
                           o->layer_cuts[l], o->n_experts);
    eg_ep_group *g = eg_calloc(1, sizeof *g, err);
    if (!g) return EG_ERR_NOMEM;
    g->o = *o;
    g->o.backends = NULL; /* borrowed only for the duration of create */
    g->o.layer_cuts = NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->layers = eg_calloc((size_t)o->n_ranks * 2 * (size_t)o->n_layers, sizeof *g->layers, err);
    if (!g->layers) { eg_ep_group_free(g); return EG_ERR_NOMEM; }
    if (o->layer_cuts) {
        if (!(g->cuts = eg_malloc(sizeof(int) * (size_t)o->n_layers, err))) { eg_ep_group_free(g); return EG_ERR_NOMEM; }
        memcpy(g->cuts, o->layer_cuts, sizeof(int) * (size_t)o->n_layers);
        g->o.layer_cuts = g->cuts;
    }
    if (o->ffn_split && !(g->ffn_w = eg_calloc((size_t)o->n_layers * 3, sizeof *g->ffn_w, err))) {
        eg_ep_group_free(g);
        return EG_ERR_NOMEM;
    }
    if (n_cuda) {
        eg_ep_opts co = *o;
        co.layer_cuts = g->cuts; /* the group's copy: it outlives the cuda exchange */
        eg_status st = eg_ep_cuda_create(&co, &g->cuda, err);
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
        k->ord = eg_malloc(sizeof(int) * ((size_t)o->topk + 1), err);
        if (o->ffn_split) k->ffn_y = eg_malloc(sizeof(float) * T * H, err);
        if (o->vocab_split) k->vlog = eg_malloc(sizeof(float) * T * ((size_t)o->vocab / (size_t)o->n_ranks + 1), err);
        if (!k->contrib || !k->xs || !k->ys || !k->ids1 || !k->w1 || !k->dst || !k->ord || (o->ffn_split && !k->ffn_y) ||
            (o->vocab_split && !k->vlog)) {
            eg_ep_group_free(g);
            return EG_ERR_NOMEM;
        }
    }
    *out = g;
    return EG_OK;
}

void eg_ep_call_range(const eg_ep_opts *o, int id, int *lo, int *hi) {
    int L = o->n_layers, l = id >= L ? id - L : id, cut = o->layer_cuts && l >= 0 && l < L ? o->layer_cuts[l] : 0;
    *lo = id >= L && cut > 0 ? cut : 0;
    *hi = id < L && cut > 0 ? cut : o->n_experts;
}

void eg_ep_share(const eg_ep_opts *o, int rank, int id, int *e0, int *e1) {
    int lo, hi;
    eg_ep_call_range(o, id, &lo, &hi);
    int64_t n = hi - lo, R = o->n_ranks;
    *e0 = lo + (int)(rank * n / R);
    *e1 = lo + (int)((rank + 1) * n / R);
}

void eg_ep_range(const eg_ep_group *g, int rank, int id, int *e0, int *e1) { eg_ep_share(&g->o, rank, id, e0, e1); }

int eg_ep_head_id(const eg_ep_group *g, int layer) { return g->o.n_layers + layer; }
int eg_ep_layer_cut(const eg_ep_group *g, int layer) {
    return g->cuts && layer >= 0 && layer < g->o.n_layers ? g->cuts[layer] : 0;
}

const char *eg_ep_kind(const eg_ep_group *g) { return g->cuda ? eg_ep_cuda_kind(g->cuda) : "local"; }

int64_t eg_ep_device_bytes(const eg_ep_opts *o) { return eg_ep_cuda_bytes(o); }

void eg_ep_register(eg_ep_group *g, int rank, int layer, const eg_expert_w *experts) {
    if (rank >= 0 && rank < g->o.n_ranks && layer >= 0 && layer < 2 * g->o.n_layers)
        g->layers[(size_t)rank * 2 * (size_t)g->o.n_layers + (size_t)layer] = experts;
}

int eg_ep_ffn_owner(const eg_ep_group *g, int layer) {
    return g && g->o.ffn_split && layer >= 0 ? layer % g->o.n_ranks : -1;
}

void eg_ep_register_ffn(eg_ep_group *g, int rank, int layer, const eg_weight *gate, const eg_weight *up,
                        const eg_weight *down) {
    if (g->ffn_w && layer >= 0 && layer < g->o.n_layers && rank == eg_ep_ffn_owner(g, layer)) {
        g->ffn_w[3 * (size_t)layer] = gate;
        g->ffn_w[3 * (size_t)layer + 1] = up;
        g->ffn_w[3 * (size_t)layer + 2] = down;
    }
}

int eg_ep_vocab_split(const eg_ep_group *g) { return g && g->o.vocab_split; }

void eg_ep_vocab_range(const eg_ep_group *g, int rank, int64_t *v0, int64_t *v1) {
    int64_t V = g->o.vocab, R = g->o.n_ranks;
    *v0 = (int64_t)rank * V / R;
    *v1 = (int64_t)(rank + 1) * V / R;
}

void eg_ep_register_vocab(eg_ep_group *g, int rank, const eg_weight *embed, const eg_weight *lm_head) {
    if (g->cuda) eg_ep_cuda_register_vocab(g->cuda, rank, embed, lm_head);
    if (!g->rk || rank < 0 || rank >= g->o.n_ranks) return;
    if (embed) g->rk[rank].vembed = embed;
    if (lm_head) g->rk[rank].vhead = lm_head;
}

void eg_ep_vocab_rows(const eg_ep_group *g, int64_t *embed_rows, int64_t *logit_rows) {
    if (g->cuda) {
        eg_ep_cuda_vocab_rows(g->cuda, embed_rows, logit_rows);
        return;
    }
    *embed_rows = *logit_rows = 0;
    for (int r = 0; g->rk && r < g->o.n_ranks; r++) {
        *embed_rows += g->rk[r].embed_rows;
        *logit_rows += g->rk[r].logit_rows;
    }
}

int64_t eg_ep_ffn_rows(const eg_ep_group *g) {
    if (g->cuda) return eg_ep_cuda_ffn_rows(g->cuda);
    int64_t n = 0;
    for (int r = 0; g->rk && r < g->o.n_ranks; r++) n += g->rk[r].ffn_rows;
    return n;
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

static eg_status flush(eg_ep_group *g, int rank, eg_backend *be, const eg_expert_w *experts, int e0, int e1, int n,
                       float *contrib, eg_error *err) {
    ep_rank *k = &g->rk[rank];
    size_t H = (size_t)g->o.hidden;
    if (!n) return EG_OK;
    memset(k->ys, 0, sizeof(float) * (size_t)n * H);
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
    int layer = -1;
    for (int q = 0; q < R && layer < 0; q++)
        if (!g->post[q].left) layer = g->post[q].layer;
    if (layer < 0) return EG_OK;
    int e0, e1;
    eg_ep_range(g, rank, layer, &e0, &e1);
    /* this rank's own experts (a rank holds only its range: forward.c) */
    const eg_expert_w *ex = g->layers[(size_t)rank * 2 * (size_t)g->o.n_layers + (size_t)layer];
    for (int q = 0; q < R; q++) {
        const ep_post *p = &g->post[q];
        if (p->left || !p->T) continue;
        if (p->layer != layer || p->kind != EP_MOE)
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: ranks out of step (layer %d and %d, a routed "
                           "and a%s %s exchange)", rank, layer, p->layer, p->kind == EP_EMBED ? "n" : "",
                           kind_name(p->kind));
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
                eg_status st = flush(g, rank, be, ex, e0, e1, n, g->rk[q].contrib, err);
                if (st) return st;
                n = 0;
            }
        }
        eg_status st = flush(g, rank, be, ex, e0, e1, n, g->rk[q].contrib, err);
        if (st) return st;
    }
    return EG_OK;
}

/* Phase 2 of an ffn call (ffn_split): the layer's owner runs the SwiGLU MLP over each
 * rank's posted rows, rank by rank, into that rank's ffn_y; the other ranks do nothing. */
static eg_status serve_ffn(eg_ep_group *g, int rank, eg_backend *be, int layer, eg_error *err) {
    int R = g->o.n_ranks;
    for (int q = 0; q < R; q++) {
        const ep_post *p = &g->post[q];
        if (p->left) continue;
        if (p->layer != layer || p->kind != EP_FFN)
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: ranks out of step (layer %d and %d, a "
                           "shared/dense and a%s %s exchange)", rank, layer, p->layer, p->kind == EP_EMBED ? "n" : "",
                           kind_name(p->kind));
    }
    if (rank != eg_ep_ffn_owner(g, layer)) return EG_OK;
    const eg_weight *const *w = g->ffn_w + 3 * (size_t)layer;
    if (!w[0] || !w[1] || !w[2])
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: no shared expert / dense MLP registered for layer %d",
                       rank, layer);
    size_t H = (size_t)g->o.hidden;
    for (int q = 0; q < R; q++) {
        const ep_post *p = &g->post[q];
        if (p->left || !p->T) continue;
        /* the same op on the same rows as the unsplit call; accumulate 0: the token's
           owner adds (or writes) the rows at the point the unsplit op would */
        eg_status st = be->ops->swiglu_mlp(be, p->x, p->T, w[0], w[1], w[2], g->rk[q].ffn_y, 0, err);
        if (st) return eg_wrap(err, "expert-parallel rank %d: layer %d's shared expert / dense MLP for rank %d", rank,
                               layer, q);
        if (q != rank) {
            g->rk[rank].ffn_rows += p->T;
            g->rk[rank].bytes += (int64_t)(2 * (size_t)p->T * H * sizeof(float));
        }
    }
    return EG_OK;
}

/* Phase 2 of an embedding or lm_head call (vocab_split): the rank computes, for every
 * rank's posted rows, what its vocab slice owns of them, straight into that rank's
 * output (the owner of each row or column is unique, so no two ranks write one float). */
static eg_status serve_vocab(eg_ep_group *g, int rank, eg_backend *be, int kind, eg_error *err) {
    int R = g->o.n_ranks;
    for (int q = 0; q < R; q++) {
        const ep_post *p = &g->post[q];
        if (!p->left && p->kind != kind)
            return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: ranks out of step (a%s %s and a%s %s exchange)",
                           rank, kind == EP_EMBED ? "n" : "", kind_name(kind), p->kind == EP_EMBED ? "n" : "",
                           kind_name(p->kind));
    }
    ep_rank *k = &g->rk[rank];
    size_t H = (size_t)g->o.hidden, V = (size_t)g->o.vocab;
    int64_t v0, v1;
    eg_ep_vocab_range(g, rank, &v0, &v1);
    const eg_weight *w = kind == EP_EMBED ? k->vembed : k->vhead;
    if (!w)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: no %s slice registered (vocab rows %lld..%lld)",
                       rank, kind == EP_EMBED ? "embedding" : "lm_head", (long long)v0, (long long)v1);
    for (int q = 0; q < R; q++) {
        const ep_post *p = &g->post[q];
        if (p->left || !p->T) continue;
        eg_status st = EG_OK;
        if (kind == EP_EMBED) {
            for (int t = 0; t < p->T && !st; t++) {
                int32_t id = p->tok[t];
                if (id < v0 || id >= v1) continue;
                int32_t local = (int32_t)(id - v0);
                st = be->ops->embed(be, &local, 1, w, p->y + (size_t)t * H, err);
                if (q != rank) { k->embed_rows++; k->bytes += (int64_t)(H * sizeof(float)); }
            }
        } else {
            size_t n = (size_t)(v1 - v0);
            st = be->ops->linear(be, p->x, p->T, w, k->vlog, err);
            for (int t = 0; t < p->T && !st; t++)
                memcpy(p->y + (size_t)t * V + (size_t)v0, k->vlog + (size_t)t * n, sizeof(float) * n);
            if (q != rank) {
                k->logit_rows += p->T;
                k->bytes += (int64_t)((size_t)p->T * (H + n) * sizeof(float));
            }
        }
        if (st)
            return eg_wrap(err, "expert-parallel rank %d: the %s of rank %d's rows (vocab %lld..%lld)", rank,
                           kind == EP_EMBED ? "embedding" : "lm_head", q, (long long)v0, (long long)v1);
    }
    return EG_OK;
}

/* Phase 2 of whatever call the ranks still running made (they all make the same one). */
static eg_status serve_any(eg_ep_group *g, int rank, eg_backend *be, eg_error *err) {
    for (int q = 0; q < g->o.n_ranks; q++)
        if (!g->post[q].left) {
            int kind = g->post[q].kind;
            if (kind == EP_FFN) return serve_ffn(g, rank, be, g->post[q].layer, err);
            if (kind == EP_EMBED || kind == EP_LOGITS) return serve_vocab(g, rank, be, kind, err);
            return serve(g, rank, be, err);
        }
    return EG_OK;
}

static eg_status failed_status(eg_error *err) {
    return eg_fail(err, EG_ERR_INTERRUPTED, "expert-parallel group: another rank failed");
}

/* Phases 1 and 2 of every local call: post, barrier, serve whatever the running ranks
 * posted, barrier. After it the rank's outputs (contrib, ffn_y, or the vocab owners'
 * writes into its buffers) are complete. */
static eg_status exchange(eg_ep_group *g, int rank, eg_backend *be, const ep_post *mine, eg_error *err) {
    g->post[rank] = *mine;
    if (barrier(g)) return failed_status(err);
    eg_status st = serve_any(g, rank, be, err);
    if (st) { eg_ep_fail(g); return st; }
    if (barrier(g)) return failed_status(err);
    return EG_OK;
}

eg_status eg_ep_moe(eg_ep_group *g, int rank, int layer, eg_backend *be, const eg_moe_args *a, eg_error *err) {
    int K = g->o.topk;
    size_t H = (size_t)g->o.hidden;
    if (a->T > g->o.max_tokens || a->topk != K || layer < 0 || layer >= 2 * g->o.n_layers) {
        eg_ep_fail(g);
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel moe: T=%d topk=%d call %d (group: max %d, topk %d, %d layers)",
                       a->T, a->topk, layer, g->o.max_tokens, K, g->o.n_layers);
    }
    if (g->cuda) {
        eg_status st = eg_ep_cuda_moe(g->cuda, rank, layer, g->layers + (size_t)rank * 2 * (size_t)g->o.n_layers, be, a, err);
        if (st) eg_ep_fail(g);
        return st;
    }
    ep_post p = {.kind = EP_MOE, .T = a->T, .x = a->x, .ids = a->ids, .w = a->weights, .layer = layer};
    eg_status st = exchange(g, rank, be, &p, err);
    if (st) return st;
    /* Phase 3: add the contributions in ascending expert id, as the unsplit op does (those
       of the call's range: the rest of a split layer's fold is the other call's) */
    const float *c = g->rk[rank].contrib;
    int *ord = g->rk[rank].ord, lo, hi;
    eg_ep_call_range(&g->o, layer, &lo, &hi);
    for (int t = 0; t < a->T; t++) {
        eg_moe_order(a->ids + (size_t)t * (size_t)K, K, ord);
        for (int j = 0; j < K; j++) {
            int e = a->ids[(size_t)t * (size_t)K + (size_t)ord[j]];
            if (e < lo || e >= hi) continue;
            const float *o = c + ((size_t)t * (size_t)K + (size_t)ord[j]) * H;
            float *y = a->y + (size_t)t * H;
            for (size_t h = 0; h < H; h++) y[h] += o[h];
        }
    }
    return EG_OK;
}

eg_status eg_ep_leave(eg_ep_group *g, int rank, eg_backend *be, eg_error *err) {
    if (g->cuda) {
        eg_status st = eg_ep_cuda_leave(g->cuda, rank, g->layers + (size_t)rank * 2 * (size_t)g->o.n_layers, g->ffn_w, be, err);
        if (st) eg_ep_fail(g);
        return st;
    }
    for (;;) {
        g->post[rank] = (ep_post){.left = 1};
        if (barrier(g)) return failed_status(err);
        int all = 1;
        for (int q = 0; q < g->o.n_ranks; q++) all &= g->post[q].left;
        if (all) return EG_OK; /* every rank saw the same posts: all return together */
        eg_status st = serve_any(g, rank, be, err);
        if (st) { eg_ep_fail(g); return st; }
        if (barrier(g)) return failed_status(err);
    }
}

eg_status eg_ep_ffn(eg_ep_group *g, int rank, int layer, eg_backend *be, const float *x, int T, float *y,
                    int accumulate, eg_error *err) {
    if (!g->o.ffn_split || T < 1 || T > g->o.max_tokens || layer < 0 || layer >= g->o.n_layers) {
        eg_ep_fail(g);
        return eg_fail(err, EG_ERR_INVALID,
                       "expert-parallel ffn: T=%d layer %d (group: max %d tokens, %d layers, split %s, exchange %s)", T,
                       layer, g->o.max_tokens, g->o.n_layers, g->o.ffn_split ? "ffn" : "none", eg_ep_kind(g));
    }
    if (g->cuda) {
        eg_status st = eg_ep_cuda_ffn(g->cuda, rank, layer, g->ffn_w, be, x, T, y, accumulate, err);
        if (st) eg_ep_fail(g);
        return st;
    }
    ep_post p = {.kind = EP_FFN, .T = T, .x = x, .layer = layer};
    eg_status st = exchange(g, rank, be, &p, err);
    if (st) return st;
    /* Phase 3: the rows as the unsplit op leaves them (accumulate: y[i] += out[i], the
       accumulating swiglu_mlp's own addition) */
    const float *o = g->rk[rank].ffn_y;
    size_t n = (size_t)T * (size_t)g->o.hidden;
    if (accumulate)
        for (size_t i = 0; i < n; i++) y[i] += o[i];
    else
        memcpy(y, o, sizeof(float) * n);
    return EG_OK;
}

/* A vocab-split call of min_rows..max_tokens rows; the owners write the rank's output
 * directly, so the exchange is all there is. */
static eg_status vocab_call(eg_ep_group *g, int rank, eg_backend *be, const ep_post *mine, int min_rows,
                            eg_error *err) {
    if (!g->o.vocab_split || mine->T < min_rows || mine->T > g->o.max_tokens) {
        eg_ep_fail(g);
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel %s: %d rows (group: max %d, vocab split %s, exchange %s)",
                       mine->kind == EP_EMBED ? "embedding" : "lm_head", mine->T, g->o.max_tokens,
                       g->o.vocab_split ? "on" : "off", eg_ep_kind(g));
    }
    if (g->cuda) {
        eg_status st = mine->kind == EP_EMBED
                           ? eg_ep_cuda_embed(g->cuda, rank, be, mine->tok, mine->T, mine->y, err)
                           : eg_ep_cuda_logits(g->cuda, rank, be, mine->x, mine->T, mine->y, err);
        if (st) eg_ep_fail(g);
        return st;
    }
    return exchange(g, rank, be, mine, err);
}

eg_status eg_ep_embed(eg_ep_group *g, int rank, eg_backend *be, const int32_t *tokens, int T, float *x,
                      eg_error *err) {
    ep_post p = {.kind = EP_EMBED, .T = T, .tok = tokens, .y = x, .layer = -1};
    return vocab_call(g, rank, be, &p, 1, err);
}

eg_status eg_ep_logits(eg_ep_group *g, int rank, eg_backend *be, const float *rows, int n, float *logits,
                       eg_error *err) {
    ep_post p = {.kind = EP_LOGITS, .T = n, .x = rows, .y = logits, .layer = -1};
    return vocab_call(g, rank, be, &p, 0, err);
}
