/* The forward pass over a layer range; see forward.h. Backend-neutral: every
 * computation goes through eg_backend_ops. */
#include "engine/forward.h"
#include "engine/collective.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Recorded replay (backend graph ops): steps of at most this many tokens (decode-sized)
 * are recorded once per shape and replayed, so a decode step costs one launch instead
 * of hundreds. Prefill-sized steps are few and long: they run op by op. */
#define EG_GRAPH_MAX_TOKENS 512
#define EG_GRAPH_SLOTS 32
#define EG_GRAPH_MAX_FAILS 3

enum { GRAPH_NEW = 0, GRAPH_SEEN, GRAPH_READY, GRAPH_OFF };

/* One step shape: everything the recorded ops depend on that is not device data. */
typedef struct graph_key {
    int T, max_pos, n_logits, staged_capture;
} graph_key;

typedef struct graph_entry {
    graph_key key;
    int state, fails;
    void *graph;
    uint64_t last_use;
} graph_entry;

struct eg_forward {
    const eg_model *m;
    eg_backend *be;
    const eg_backend_ops *ops;
    eg_forward_opts o;
    int l0, l1;
    int *capture; /* copy of o.capture */
    /* device weights */
    eg_weight embed, final_norm, lm_head;
    eg_layer_w *layers; /* [l1-l0] */
    int64_t weight_bytes;
    eg_kv_cache *kv;
    /* device scratch; dims in the legend of backend.h */
    float *x;       /* [T][H] residual stream */
    float *xn;      /* [T][H] normed */
    float *dx;      /* [T][H] block output */
    float *qa;      /* [T][QL] */
    float *qan;     /* [T][QL] */
    float *q;       /* [T][NH][DN+DR] */
    float *kvbuf;   /* [T][C+DR] */
    float *attn;    /* [T][NH][DV] */
    int32_t *ids;   /* [T][K] */
    float *rw;      /* [T][K] */
    float *g;       /* [T][H] gathered rows for lm_head; in a layer, the shared expert's rows */
    float *logits;  /* [LR][V]: the last stage's logit rows (LR = logit_rows), else NULL */
    int logit_rows; /* LR: rows a step may ask logits of */
    float *hand;    /* head_cut or tail_cut: [max_tokens][3H+2K], holding x, xn, dx, ids and rw as
                       planes of the step's T rows (bind_planes): the hand-over in place */
    int32_t *tok_d, *pos_d, *slot_d, *rows_d; /* [T] */
    float *inv_freq_d;                          /* [DR/2] */
    float rope_attn_factor, softmax_scale;
    /* recorded replay */
    int graph_T;            /* steps of T <= graph_T are recorded; 0 = never */
    float *cap_d;           /* [captures in this range][graph_T][H]: captured rows, copied out after the step */
    int *cap_slot;          /* [n_capture] entry -> its rows in cap_d, -1 = another stage's layer */
    graph_entry graphs[EG_GRAPH_SLOTS];
    uint64_t tick;
    eg_forward_graph_stats gstats;
};

/* Random-weights mode: the draw for h, at mkmodel's scales (mkmodel.c's header): linear
 * weights of unit-variance projections, norms near 1, small router biases, the
 * embedding N(0,1)-like and lm_head 4/sqrt(H). Each tensor's seed comes from its name. */
static eg_weight_rand rand_for(const eg_forward *f, const eg_weight *h) {
    uint64_t k = 1469598103934665603ull;
    for (const char *c = h->name ? h->name : ""; *c; c++) k = (k ^ (uint8_t)*c) * 1099511628211ull;
    eg_weight_rand r = {.seed = f->o.random_seed ^ k, .mean = 0, .std = 1};
    double fan_in = (double)(h->cols > 0 ? h->cols : 1);
    if (h == &f->m->embed) r.std = 1.0f;
    else if (h == &f->m->lm_head) r.std = (float)(4.0 / sqrt(fan_in));
    else if (h->rows == 1 && h->fmt == EG_W_F32) r.std = 0.02f;                  /* router bias */
    else if (h->rows == 1) { r.mean = 1.0f; r.std = 0.05f; }                      /* norm */
    else if (h->fmt == EG_W_INT4) r.std = (float)(1.0 / (4.32 * sqrt(fan_in)));  /* group scale */
    else r.std = (float)(1.0 / sqrt(fan_in));
    return r;
}

static eg_status up(eg_forward *f, const eg_weight *h, eg_weight *d, eg_error *err) {
    if (h->fmt == EG_W_NONE) { memset(d, 0, sizeof *d); return EG_OK; }
    eg_status st;
    if (f->o.random_weights) {
        eg_weight_rand r = rand_for(f, h);
        st = f->ops->weight_random ? f->ops->weight_random(f->be, h, &r, d, err)
                                   : eg_fail(err, EG_ERR_UNSUPPORTED, "backend %s cannot draw weights", f->ops->name);
    } else {
        st = f->ops->weight_upload(f->be, h, d, err);
    }
    if (st) return eg_wrap(err, "uploading %s", h->name ? h->name : "weight");
    f->weight_bytes += eg_weight_bytes(h);
    return EG_OK;
}

static void down(eg_forward *f, eg_weight *d) {
    if (d->fmt != EG_W_NONE && f->ops->weight_release) f->ops->weight_release(f->be, d);
}

/* ffn_split (collective.h): layer's shared expert / dense MLP runs on its owner rank
 * only; 1 when this forward is a rank that neither holds nor computes it. */
static int ffn_elsewhere(const eg_forward *f, int layer) {
    int owner = f->o.ep ? eg_ep_ffn_owner(f->o.ep, layer) : -1;
    return owner >= 0 && owner != f->o.ep_rank;
}

/* The captured layer ids whose rows this stage produces: the embedding on the first
 * stage; a layer's output where its residual add runs (a split layer's on the stage
 * after the cut). */
static int owns_capture(const eg_forward *f, int layer) {
    if (layer == -1) return f->l0 == 0 && !f->o.head_cut;
    return layer >= f->l0 && layer < f->l1 - (f->o.tail_cut > 0);
}

/* A stage beside a cut: x, xn, dx, ids and rw are the planes of T rows in hand, so the
 * rows a transport brings (or takes) are the stage's working buffers, no copy. The
 * pointers depend on T, which every recorded step's shape includes. */
static void bind_planes(eg_forward *f, int T) {
    if (!f->hand) return;
    size_t H = (size_t)f->m->cfg.hidden, K = (size_t)(f->m->cfg.topk > 0 ? f->m->cfg.topk : 1), t = (size_t)T;
    f->x = f->hand;
    f->xn = f->hand + t * H;
    f->dx = f->hand + 2 * t * H;
    f->ids = (int32_t *)(f->hand + 3 * t * H);
    f->rw = f->hand + 3 * t * H + t * K;
}

/* side: 0 the whole layer; 1 the attention side of a split layer (all but the routed
 * experts [cut, E) and the shared expert); 2 the expert side (only those). */
static eg_status upload_layer(eg_forward *f, int layer, const eg_layer_w *h, eg_layer_w *d, int side, int cut,
                              eg_error *err) {
    eg_status st;
    memset(d, 0, sizeof *d);
    d->is_moe = h->is_moe;
    /* another rank owns this layer's shared expert / dense MLP: never uploaded here (the
       weights stay EG_W_NONE; ffn() asks the host model whether the layer has one) */
    int skip_ffn = ffn_elsewhere(f, layer);
    const eg_weight *hs[] = {&h->attn_norm, &h->ffn_norm, &h->q_a, &h->q_a_norm, &h->q_b, &h->q, &h->kv_a,
                             &h->kv_a_norm, &h->kv_b, &h->o, &h->mlp_gate, &h->mlp_up, &h->mlp_down,
                             &h->router, &h->router_bias, &h->sh_gate, &h->sh_up, &h->sh_down};
    eg_weight *ds[] = {&d->attn_norm, &d->ffn_norm, &d->q_a, &d->q_a_norm, &d->q_b, &d->q, &d->kv_a,
                       &d->kv_a_norm, &d->kv_b, &d->o, &d->mlp_gate, &d->mlp_up, &d->mlp_down,
                       &d->router, &d->router_bias, &d->sh_gate, &d->sh_up, &d->sh_down};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
        int dense_mlp = hs[i] == &h->mlp_gate || hs[i] == &h->mlp_up || hs[i] == &h->mlp_down;
        int shared = hs[i] == &h->sh_gate || hs[i] == &h->sh_up || hs[i] == &h->sh_down;
        if (skip_ffn && (h->is_moe ? shared : dense_mlp)) continue;
        if ((side == 1 && shared) || (side == 2 && !shared)) continue;
        if ((st = up(f, hs[i], ds[i], err))) return st;
    }
    if (h->is_moe && h->experts) {
        int E = f->m->cfg.n_experts, e0 = 0, e1 = E;
        if (side == 1) e1 = cut;
        if (side == 2) e0 = cut;
        /* an expert-parallel rank holds only its own routed experts of the layer's call
           (the others stay EG_W_NONE: computed by their owners); a split layer's halves
           are calls of their own, each split over the group (collective.h) */
        if (f->o.ep) eg_ep_range(f->o.ep, f->o.ep_rank, side == 2 ? eg_ep_head_id(f->o.ep, layer) : layer, &e0, &e1);
        d->experts = eg_calloc((size_t)E, sizeof *d->experts, err);
        if (!d->experts) return EG_ERR_NOMEM;
        for (int e = e0; e < e1; e++)
            if ((st = up(f, &h->experts[e].gate, &d->experts[e].gate, err)) ||
                (st = up(f, &h->experts[e].up, &d->experts[e].up, err)) ||
                (st = up(f, &h->experts[e].down, &d->experts[e].down, err)))
                return st;
    }
    return EG_OK;
}

static void release_layer(eg_forward *f, eg_layer_w *d) {
    eg_weight *ds[] = {&d->attn_norm, &d->ffn_norm, &d->q_a, &d->q_a_norm, &d->q_b, &d->q, &d->kv_a,
                       &d->kv_a_norm, &d->kv_b, &d->o, &d->mlp_gate, &d->mlp_up, &d->mlp_down,
                       &d->router, &d->router_bias, &d->sh_gate, &d->sh_up, &d->sh_down};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) down(f, ds[i]);
    if (d->experts) {
        for (int e = 0; e < f->m->cfg.n_experts; e++) {
            down(f, &d->experts[e].gate);
            down(f, &d->experts[e].up);
            down(f, &d->experts[e].down);
        }
        free(d->experts);
    }
}

void eg_forward_free(eg_forward *f) {
    if (!f) return;
    for (int i = 0; i < EG_GRAPH_SLOTS; i++)
        if (f->graphs[i].graph) f->ops->graph_free(f->be, f->graphs[i].graph);
    if (f->layers) {
        for (int l = 0; l < f->l1 - f->l0; l++) release_layer(f, &f->layers[l]);
        free(f->layers);
    }
    down(f, &f->embed);
    down(f, &f->final_norm);
    if (!(eg_model_head_tied(f->m) && f->lm_head.data == f->embed.data)) down(f, &f->lm_head);
    eg_kv_free(f->kv);
    if (f->hand) f->x = f->xn = f->dx = f->rw = NULL, f->ids = NULL; /* views of hand */
    void *bufs[] = {f->x, f->xn, f->dx, f->qa, f->qan, f->q, f->kvbuf, f->attn, f->ids, f->rw,
                    f->g, f->logits, f->tok_d, f->pos_d, f->slot_d, f->rows_d, f->inv_freq_d, f->cap_d, f->hand};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) f->ops->release(f->be, bufs[i]);
    free(f->capture);
    free(f->cap_slot);
    free(f);
}

static eg_status alloc(eg_forward *f, void **p, size_t bytes, eg_error *err) {
    return f->ops->alloc(f->be, bytes ? bytes : 4, p, err);
}

eg_status eg_forward_create(const eg_model *m, eg_backend *be, const eg_forward_opts *o, eg_forward **out,
                            eg_error *err) {
    *out = NULL;
    const eg_config *c = &m->cfg;
    eg_forward *f = eg_calloc(1, sizeof *f, err);
    if (!f) return EG_ERR_NOMEM;
    f->m = m;
    f->be = be;
    f->ops = be->ops;
    f->o = *o;
    f->l0 = o->layer_begin;
    f->l1 = o->layer_end ? o->layer_end : c->n_layers;
    if (f->o.block_size <= 0) f->o.block_size = 64;
    if (f->l0 < 0 || f->l1 > c->n_layers || f->l0 >= f->l1) {
        free(f);
        return eg_fail(err, EG_ERR_INVALID, "layer range [%d, %d) invalid for a %d-layer model", o->layer_begin,
                       o->layer_end, c->n_layers);
    }
    if (o->head_cut || o->tail_cut) {
        const char *why = NULL;
        int hl = f->l0, tl = f->l1 - 1;
        if (o->head_cut && (o->head_cut < 1 || o->head_cut >= c->n_experts || !m->layers[hl].is_moe))
            why = "the head cut needs a MoE first layer and 0 < cut < the routed expert count";
        else if (o->tail_cut && (o->tail_cut < 1 || o->tail_cut >= c->n_experts || !m->layers[tl].is_moe ||
                                 f->l1 == c->n_layers))
            why = "the tail cut needs a MoE last layer before the model's end and 0 < cut < the routed expert count";
        else if (o->head_cut && o->tail_cut && f->l1 - f->l0 < 2)
            why = "a stage that finishes one split layer and splits another needs two layers";
        else if (o->ep && ((o->head_cut && eg_ep_layer_cut(o->ep, hl) != o->head_cut) ||
                           (o->tail_cut && eg_ep_layer_cut(o->ep, tl) != o->tail_cut)))
            why = "the expert-parallel group splits the layer elsewhere (its layer_cuts)";
        if (why) {
            eg_status fst = eg_fail(err, EG_ERR_INVALID, "stage over layers [%d, %d) with cuts %d / %d: %s", f->l0,
                                    f->l1, o->head_cut, o->tail_cut, why);
            free(f);
            return fst;
        }
    }
    if (o->n_capture > 0) {
        f->capture = eg_malloc(sizeof(int) * (size_t)o->n_capture, err);
        if (!f->capture) { free(f); return EG_ERR_NOMEM; }
        memcpy(f->capture, o->capture, sizeof(int) * (size_t)o->n_capture);
        f->o.capture = f->capture;
    }
    eg_status st = EG_OK;
    int nl = f->l1 - f->l0;
    f->layers = eg_calloc((size_t)nl, sizeof *f->layers, err);
    if (!f->layers) { eg_forward_free(f); return EG_ERR_NOMEM; }
    /* vocab split (collective.h): this rank holds only its vocab rows of the embedding
       and lm_head; the group computes the rest on their owners */
    int vsplit = eg_ep_vocab_split(o->ep);
    int64_t v0 = 0, v1 = c->vocab;
    if (vsplit) {
        eg_ep_vocab_range(o->ep, o->ep_rank, &v0, &v1);
        if (o->random_weights) {
            st = eg_fail(err, EG_ERR_UNSUPPORTED, "--ep-split all with random weights: a rank's draw of its vocab rows "
                         "would not be the unsplit draw's rows (use a checkpoint, or --ep-split ffn)");
            goto fail;
        }
    }
    if (f->l0 == 0 && !o->head_cut) {
        eg_weight e = m->embed;
        if ((vsplit && (st = eg_weight_rows(&m->embed, v0, v1, &e, err))) || (st = up(f, &e, &f->embed, err))) goto fail;
    }
    if (f->l1 == c->n_layers) {
        if ((st = up(f, &m->final_norm, &f->final_norm, err))) goto fail;
        eg_weight h = m->lm_head;
        if (eg_model_head_tied(m) && f->l0 == 0) f->lm_head = f->embed; /* (not a stored head's bytes) */
        else if ((vsplit && (st = eg_weight_rows(&m->lm_head, v0, v1, &h, err))) || (st = up(f, &h, &f->lm_head, err)))
            goto fail;
    }
    if (vsplit)
        eg_ep_register_vocab(o->ep, o->ep_rank, f->l0 == 0 && !o->head_cut ? &f->embed : NULL,
                             f->l1 == c->n_layers ? &f->lm_head : NULL);
    for (int l = 0; l < nl; l++) {
        int side = l == 0 && o->head_cut ? 2 : l == nl - 1 && o->tail_cut ? 1 : 0;
        int cut = side == 2 ? o->head_cut : o->tail_cut;
        if ((st = upload_layer(f, f->l0 + l, &m->layers[f->l0 + l], &f->layers[l], side, cut, err))) goto fail;
        /* a rank that ran out of work serves its experts for the others: it finds them here */
        const eg_layer_w *d = &f->layers[l];
        if (o->ep && d->experts)
            eg_ep_register(o->ep, o->ep_rank, side == 2 ? eg_ep_head_id(o->ep, f->l0 + l) : f->l0 + l, d->experts);
        /* and the shared expert / dense MLP of the layers it owns (ffn_split; a split
           layer's shared expert runs after the cut) */
        if (o->ep && side != 1 && eg_ep_ffn_owner(o->ep, f->l0 + l) == o->ep_rank) {
            if (d->is_moe) eg_ep_register_ffn(o->ep, o->ep_rank, f->l0 + l, &d->sh_gate, &d->sh_up, &d->sh_down);
            else eg_ep_register_ffn(o->ep, o->ep_rank, f->l0 + l, &d->mlp_gate, &d->mlp_up, &d->mlp_down);
        }
    }

    size_t T = (size_t)(o->max_tokens > 0 ? o->max_tokens : 1);
    f->o.max_tokens = (int)T;
    /* logits only where lm_head runs, and only as many rows as a step can ask for: at
       Kimi's 163,840 ids each row is 655 KB (8,192 rows: 5.4 GB of a GPU's cache) */
    f->logit_rows = !eg_forward_is_last(f) ? 0 : o->logit_rows > 0 && (size_t)o->logit_rows < T ? o->logit_rows : (int)T;
    size_t H = (size_t)c->hidden, NH = (size_t)c->n_heads, QL = (size_t)c->q_lora_rank;
    size_t DQ = NH * (size_t)(c->qk_nope + c->qk_rope), W = (size_t)(c->kv_lora_rank + c->qk_rope);
    size_t K = (size_t)(c->topk > 0 ? c->topk : 1), V = (size_t)c->vocab;
    int cut = o->head_cut || o->tail_cut;
    if ((cut && (st = alloc(f, (void **)&f->hand, 4 * T * (3 * H + 2 * K), err)))) goto fail;
    if (cut) bind_planes(f, (int)T);
    if ((!cut && ((st = alloc(f, (void **)&f->x, 4 * T * H, err)) || (st = alloc(f, (void **)&f->xn, 4 * T * H, err)) ||
                  (st = alloc(f, (void **)&f->dx, 4 * T * H, err)) || (st = alloc(f, (void **)&f->ids, 4 * T * K, err)) ||
                  (st = alloc(f, (void **)&f->rw, 4 * T * K, err)))) ||
        (st = alloc(f, (void **)&f->qa, 4 * T * QL, err)) ||
        (st = alloc(f, (void **)&f->qan, 4 * T * QL, err)) || (st = alloc(f, (void **)&f->q, 4 * T * DQ, err)) ||
        (st = alloc(f, (void **)&f->kvbuf, 4 * T * W, err)) ||
        (st = alloc(f, (void **)&f->attn, 4 * T * NH * (size_t)c->v_head, err)) ||
        (st = alloc(f, (void **)&f->g, 4 * T * H, err)) ||
        (f->logit_rows > 0 && (st = alloc(f, (void **)&f->logits, 4 * (size_t)f->logit_rows * V, err))) ||
        (st = alloc(f, (void **)&f->tok_d, 4 * T, err)) || (st = alloc(f, (void **)&f->pos_d, 4 * T, err)) ||
        (st = alloc(f, (void **)&f->slot_d, 4 * T, err)) || (st = alloc(f, (void **)&f->rows_d, 4 * T, err)) ||
        (st = alloc(f, (void **)&f->inv_freq_d, 4 * (size_t)(c->qk_rope / 2 + 1), err)))
        goto fail;
    {
        int half = c->qk_rope / 2;
        double *inv = eg_malloc(sizeof(double) * (size_t)(half + 1), err);
        float *invf = eg_malloc(sizeof(float) * (size_t)(half + 1), err);
        if (!inv || !invf) { free(inv); free(invf); st = EG_ERR_NOMEM; goto fail; }
        eg_config_rope_inv_freq(c, inv);
        for (int i = 0; i < half; i++) invf[i] = (float)inv[i];
        st = f->ops->to_device(be, f->inv_freq_d, invf, sizeof(float) * (size_t)half, err);
        free(inv);
        free(invf);
        if (st) goto fail;
    }
    if (f->ops->graph_begin && f->ops->graph_end && f->ops->graph_launch && f->ops->graph_free && f->ops->copy &&
        (!f->ops->graph_enabled || f->ops->graph_enabled(be)) && !o->no_graphs &&
        !o->ep) { /* an expert-parallel step waits on the host for the exchange's counts */
        f->graph_T = (int)T < EG_GRAPH_MAX_TOKENS ? (int)T : EG_GRAPH_MAX_TOKENS;
        int n_here = 0;
        if (o->n_capture > 0) {
            f->cap_slot = eg_malloc(sizeof(int) * (size_t)o->n_capture, err);
            if (!f->cap_slot) { st = EG_ERR_NOMEM; goto fail; }
            for (int i = 0; i < o->n_capture; i++)
                f->cap_slot[i] = owns_capture(f, o->capture[i]) ? n_here++ : -1;
        }
        if (n_here > 0 && (st = alloc(f, (void **)&f->cap_d, 4 * (size_t)n_here * (size_t)f->graph_T * H, err)))
            goto fail;
    }
    f->rope_attn_factor = (float)eg_config_rope_attn_factor(c);
    f->softmax_scale = (float)eg_config_softmax_scale(c);
    {
        int bs = f->o.block_size;
        int64_t per_seq = (o->max_seq_len + bs - 1) / bs;
        int64_t nb = o->kv_blocks > 0 ? o->kv_blocks : per_seq * (o->n_slots > 0 ? o->n_slots : 1);
        /* a head-cut stage runs no attention for its first layer: no cache for it */
        st = eg_kv_create(be, nl - (o->head_cut > 0), (int)W, bs, nb, o->n_slots > 0 ? o->n_slots : 1, o->max_seq_len,
                          &f->kv, err);
        if (st) goto fail;
    }
    if (o->kv_dtype != EG_KV_BF16) { /* a measurement cache (eaglegen fidelity) */
        if (strcmp(be->ops->name, "cpu")) {
            st = eg_fail(err, EG_ERR_UNSUPPORTED, "a non-BF16 KV cache exists only on the cpu backend, not %s",
                         be->ops->name);
            goto fail;
        }
        if ((st = eg_kv_set_dtype(f->kv, o->kv_dtype, c->kv_lora_rank, err))) goto fail;
    }
    *out = f;
    return EG_OK;
fail:
    eg_forward_free(f);
    return st;
}

int eg_forward_staged_captures(const int *capture, int n_capture, int layer_begin, int layer_end) {
    int n = 0;
    for (int i = 0; i < n_capture; i++) {
        int l = capture[i];
        n += l == -1 ? layer_begin == 0 : l >= layer_begin && l < layer_end;
    }
    return n;
}

int eg_forward_logit_rows(int max_tokens, int n_slots, int draft_tokens, int want_logits) {
    int64_t T = max_tokens > 0 ? max_tokens : 1, per = draft_tokens > 0 ? (int64_t)draft_tokens + 1 : 1;
    if (want_logits || n_slots <= 0 || (int64_t)n_slots * per >= T) return (int)T;
    return (int)((int64_t)n_slots * per);
}

int64_t eg_forward_act_bytes(const eg_config *c, int max_tokens, int logit_rows, int n_staged) {
    int64_t T = max_tokens > 0 ? max_tokens : 1, H = c->hidden, NH = c->n_heads;
    int64_t LR = logit_rows < 0 ? 0 : logit_rows > T ? T : logit_rows;
    int64_t TG = T < EG_GRAPH_MAX_TOKENS ? T : EG_GRAPH_MAX_TOKENS;
    int64_t DQ = NH * (c->qk_nope + c->qk_rope), W = c->kv_lora_rank + c->qk_rope, K = c->topk > 0 ? c->topk : 1;
    /* x, xn, dx, g [T][H]; qa, qan [T][QL]; q; kv; attn; ids, weights; 4 index arrays; logits [LR][V] */
    return 4 * T * (4 * H + 2 * (int64_t)c->q_lora_rank + DQ + W + NH * c->v_head + 2 * K + 4) + 4 * LR * c->vocab +
           4 * (int64_t)(c->qk_rope / 2 + 1) + 4 * TG * H * (n_staged > 0 ? n_staged : 0);
}

int eg_forward_pos_bucket(int max_pos, int limit) {
    int64_t g = 256;
    while (g * 8 <= max_pos) g *= 2;
    int64_t b = ((int64_t)max_pos + g - 1) / g * g;
    if (b > limit) b = limit;
    return (int)(b > max_pos ? b : max_pos);
}

void eg_forward_get_graph_stats(const eg_forward *f, eg_forward_graph_stats *out) { *out = f->gstats; }

eg_status eg_forward_fetch_logits(eg_forward *f, const int32_t *rows, int n, float *out, eg_error *err) {
    if (!eg_forward_is_last(f)) return eg_fail(err, EG_ERR_INVALID, "fetch_logits: not the last stage");
    const eg_backend_ops *ops = f->be->ops;
    const size_t V = (size_t)f->m->cfg.vocab;
    for (int i = 0; i < n;) { /* runs of consecutive rows in one copy each */
        int j = i + 1;
        while (j < n && rows[j] == rows[j - 1] + 1) j++;
        if (rows[i] < 0 || rows[j - 1] >= f->logit_rows)
            return eg_fail(err, EG_ERR_INVALID, "fetch_logits: row %d out of range [0, %d)",
                           rows[i] < 0 ? rows[i] : rows[j - 1], f->logit_rows);
        eg_status st = ops->to_host(f->be, out + (size_t)i * V, f->logits + (size_t)rows[i] * V,
                                    sizeof(float) * V * (size_t)(j - i), err);
        if (st) return st;
        i = j;
    }
    return ops->sync(f->be, err);
}

eg_status eg_forward_kept_probs(eg_forward *f, const int32_t *rows, int n, const eg_sample_params *sp, int cap,
                                int32_t *n_out, int32_t *ids, double *probs, eg_error *err) {
    if (n <= 0) return EG_OK;
    if (!eg_forward_is_last(f)) return eg_fail(err, EG_ERR_INVALID, "kept_probs: not the last stage");
    const eg_backend_ops *ops = f->be->ops;
    if (!ops->kept_probs) return eg_fail(err, EG_ERR_INVALID, "kept_probs: the %s backend does not offer it", ops->name);
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= f->logit_rows)
            return eg_fail(err, EG_ERR_INVALID, "kept_probs: row %d out of range [0, %d)", rows[i], f->logit_rows);
    return ops->kept_probs(f->be, f->logits, rows, n, (int)f->m->cfg.vocab, sp, cap, n_out, ids, probs, err);
}

eg_status eg_forward_sample_logits(eg_forward *f, const int32_t *rows, int n, const eg_sample_params *sp, uint64_t *rng,
                                   int32_t *out, eg_error *err) {
    if (!eg_forward_is_last(f)) return eg_fail(err, EG_ERR_INVALID, "sample_logits: not the last stage");
    const eg_backend_ops *ops = f->be->ops;
    const size_t V = (size_t)f->m->cfg.vocab;
    for (int i = 0; i < n; i++) {
        if (rows[i] < i || rows[i] >= f->logit_rows || (i && rows[i] <= rows[i - 1]))
            return eg_fail(err, EG_ERR_INVALID, "sample_logits: row %d (%d of %d) not ascending in [0, %d)", rows[i], i,
                           n, f->logit_rows);
        /* row i <- row rows[i] >= i: never a row a later copy reads */
        eg_status st = rows[i] == i ? EG_OK
                                    : ops->copy(f->be, f->logits + (size_t)i * V, f->logits + (size_t)rows[i] * V,
                                                sizeof(float) * V, err);
        if (st) return st;
    }
    return n > 0 ? ops->sample(f->be, f->logits, n, (int)V, sp, rng, out, err) : EG_OK;
}

eg_kv_cache *eg_forward_kv(eg_forward *f) { return f->kv; }
float *eg_forward_x(eg_forward *f) { return f->x; }
float *eg_forward_in(eg_forward *f) { return f->o.head_cut ? f->hand : f->x; }
float *eg_forward_out(eg_forward *f) { return f->o.tail_cut ? f->hand : f->x; }
int64_t eg_forward_handover_floats(const eg_config *c) { return 3 * (int64_t)c->hidden + 2 * (int64_t)(c->topk > 0 ? c->topk : 1); }
int64_t eg_forward_in_floats(const eg_forward *f) {
    return f->o.head_cut ? eg_forward_handover_floats(&f->m->cfg) : f->m->cfg.hidden;
}
int64_t eg_forward_out_floats(const eg_forward *f) {
    return f->o.tail_cut ? eg_forward_handover_floats(&f->m->cfg) : f->m->cfg.hidden;
}
int eg_forward_is_first(const eg_forward *f) { return f->l0 == 0 && !f->o.head_cut; }
int eg_forward_is_last(const eg_forward *f) { return f->l1 == f->m->cfg.n_layers; }
int64_t eg_forward_weight_bytes(const eg_forward *f) { return f->weight_bytes; }

/* Rows after `layer`: straight to the host, or (staged, when the step may be recorded)
 * into cap_d, copied out by copy_out_captures after the step's ops. */
static eg_status capture_rows(eg_forward *f, const eg_step *s, int staged, int layer, const float *x, eg_error *err) {
    if (!s->capture) return EG_OK;
    size_t H = (size_t)f->m->cfg.hidden, T = (size_t)s->T;
    for (int i = 0; i < f->o.n_capture; i++)
        if (f->o.capture[i] == layer) {
            eg_status st = staged ? f->ops->copy(f->be, f->cap_d + (size_t)f->cap_slot[i] * T * H, x,
                                                 sizeof(float) * T * H, err)
                                  : f->ops->to_host(f->be, s->capture + (size_t)i * T * H, x, sizeof(float) * T * H, err);
            if (st) return st;
        }
    return EG_OK;
}

static eg_status copy_out_captures(eg_forward *f, const eg_step *s, eg_error *err) {
    if (!s->capture) return EG_OK;
    size_t H = (size_t)f->m->cfg.hidden, T = (size_t)s->T;
    for (int i = 0; i < f->o.n_capture; i++)
        if (f->cap_slot[i] >= 0) {
            eg_status st = f->ops->to_host(f->be, s->capture + (size_t)i * T * H, f->cap_d + (size_t)f->cap_slot[i] * T * H,
                                           sizeof(float) * T * H, err);
            if (st) return st;
        }
    return EG_OK;
}

#define TRY(call)                                                                        \
    do {                                                                                 \
        eg_status st_ = (call);                                                          \
        if (st_) return st_;                                                             \
    } while (0)

static eg_status attention(eg_forward *f, const eg_layer_w *L, int T, int max_pos, eg_kv_layer cache, eg_error *err) {
    const eg_config *c = &f->m->cfg;
    const eg_backend_ops *ops = f->ops;
    eg_backend *be = f->be;
    if (c->q_lora_rank > 0) {
        TRY(ops->linear(be, f->xn, T, &L->q_a, f->qa, err));
        TRY(ops->rmsnorm(be, f->qa, &L->q_a_norm, T, c->q_lora_rank, c->rms_eps, f->qan, err));
        TRY(ops->linear(be, f->qan, T, &L->q_b, f->q, err));
    } else {
        TRY(ops->linear(be, f->xn, T, &L->q, f->q, err));
    }
    TRY(ops->linear(be, f->xn, T, &L->kv_a, f->kvbuf, err));
    eg_mla_args a = {
        .T = T, .pos = f->pos_d, .slot = f->slot_d, .block_table = f->kv->table_dev,
        .max_blocks = f->kv->max_blocks, .block_size = f->kv->block_size, .max_pos = max_pos,
        .q = f->q, .kv = f->kvbuf, .kv_a_norm = &L->kv_a_norm, .kv_b = &L->kv_b, .cache = cache,
        .rope_inv_freq = f->inv_freq_d, .rope_attn_factor = f->rope_attn_factor,
        .softmax_scale = f->softmax_scale, .eps = c->rms_eps, .h0 = 0, .h1 = c->n_heads, .out = f->attn,
    };
    TRY(ops->mla_attention(be, &a, err));
    return ops->linear(be, f->attn, T, &L->o, f->dx, err);
}

static eg_status ffn(eg_forward *f, const eg_layer_w *L, int layer, int T, eg_error *err) {
    const eg_config *c = &f->m->cfg;
    const eg_backend_ops *ops = f->ops;
    eg_backend *be = f->be;
    /* ffn_split: every rank calls the exchange for every layer (lockstep), the owner
       computes; the weights sit on the owner only */
    int split = f->o.ep && eg_ep_ffn_owner(f->o.ep, layer) >= 0;
    if (!L->is_moe) {
        if (split) return eg_ep_ffn(f->o.ep, f->o.ep_rank, layer, be, f->xn, T, f->dx, 0, err);
        return ops->swiglu_mlp(be, f->xn, T, &L->mlp_gate, &L->mlp_up, &L->mlp_down, f->dx, 0, err);
    }
    eg_router_args r = {.T = T, .x = f->xn, .gate = &L->router, .bias = &L->router_bias, .n_group = c->n_group,
                        .topk_group = c->topk_group, .topk = c->topk, .norm_topk = c->norm_topk,
                        .routed_scale = c->routed_scale, .ids = f->ids, .weights = f->rw};
    TRY(ops->router(be, &r, err));
    TRY(ops->memset0(be, f->dx, sizeof(float) * (size_t)T * (size_t)c->hidden, err));
    eg_moe_args a = {.T = T, .x = f->xn, .ids = f->ids, .weights = f->rw, .topk = c->topk,
                     .experts = L->experts, .e0 = 0, .e1 = c->n_experts, .y = f->dx};
    if (f->o.ep) TRY(eg_ep_moe(f->o.ep, f->o.ep_rank, layer, be, &a, err));
    else TRY(ops->moe(be, &a, err));
    /* the host model says whether the layer has a shared expert (a rank of a split group
       holds none of the layers it does not own) */
    if (split && f->m->layers[layer].sh_gate.fmt != EG_W_NONE)
        TRY(eg_ep_ffn(f->o.ep, f->o.ep_rank, layer, be, f->xn, T, f->dx, 1, err));
    else if (!split && L->sh_gate.fmt != EG_W_NONE) {
        /* the finished shared-expert rows added to the routed sum in a separate op (f->g,
           free until the logits, holds them): the order the split takes, where the owner
           computes the rows and the token's rank adds them. A GEMM that accumulated into
           dx itself (CUDA: beta 1, then the BF16 residual's GEMM) rounds differently. */
        TRY(ops->swiglu_mlp(be, f->xn, T, &L->sh_gate, &L->sh_up, &L->sh_down, f->g, 0, err));
        TRY(ops->add(be, f->dx, f->g, (int64_t)T * c->hidden, err));
    }
    return EG_OK;
}

/* Tail of a stage whose last layer is split (tail_cut): after its attention (x holds the
 * residual, xn the normed row) the router and the routed experts [0, cut) into dx from
 * zero, then the hand-over. The next stage continues the same fold. */
static eg_status split_start(eg_forward *f, const eg_layer_w *L, int T, eg_error *err) {
    const eg_config *c = &f->m->cfg;
    eg_router_args r = {.T = T, .x = f->xn, .gate = &L->router, .bias = &L->router_bias, .n_group = c->n_group,
                        .topk_group = c->topk_group, .topk = c->topk, .norm_topk = c->norm_topk,
                        .routed_scale = c->routed_scale, .ids = f->ids, .weights = f->rw};
    TRY(f->ops->router(f->be, &r, err));
    TRY(f->ops->memset0(f->be, f->dx, sizeof(float) * (size_t)T * (size_t)c->hidden, err));
    eg_moe_args a = {.T = T, .x = f->xn, .ids = f->ids, .weights = f->rw, .topk = c->topk,
                     .experts = L->experts, .e0 = 0, .e1 = f->o.tail_cut, .y = f->dx};
    /* the planes are the hand-over (bind_planes); with ep the call's range is the group's
       (collective.h layer_cuts), the same [0, cut) */
    if (f->o.ep) return eg_ep_moe(f->o.ep, f->o.ep_rank, f->l1 - 1, f->be, &a, err);
    return f->ops->moe(f->be, &a, err);
}

/* Head of a stage after a cut (head_cut): on the hand-over's planes, the routed experts
 * [cut, E) added to the partial sum, then the shared expert and the residual add, in
 * ffn()'s order; the layer's output is captured here. */
static eg_status split_finish(eg_forward *f, const eg_step *s, int staged, eg_error *err) {
    const eg_config *c = &f->m->cfg;
    const eg_layer_w *L = &f->layers[0];
    int T = s->T;
    eg_moe_args a = {.T = T, .x = f->xn, .ids = f->ids, .weights = f->rw, .topk = c->topk,
                     .experts = L->experts, .e0 = f->o.head_cut, .e1 = c->n_experts, .y = f->dx};
    if (f->o.ep) TRY(eg_ep_moe(f->o.ep, f->o.ep_rank, eg_ep_head_id(f->o.ep, f->l0), f->be, &a, err));
    else TRY(f->ops->moe(f->be, &a, err));
    /* the shared expert as ffn() runs it: on its owner where the group splits it */
    int split = f->o.ep && eg_ep_ffn_owner(f->o.ep, f->l0) >= 0;
    if (split && f->m->layers[f->l0].sh_gate.fmt != EG_W_NONE)
        TRY(eg_ep_ffn(f->o.ep, f->o.ep_rank, f->l0, f->be, f->xn, T, f->dx, 1, err));
    else if (!split && L->sh_gate.fmt != EG_W_NONE) {
        TRY(f->ops->swiglu_mlp(f->be, f->xn, T, &L->sh_gate, &L->sh_up, &L->sh_down, f->g, 0, err));
        TRY(f->ops->add(f->be, f->dx, f->g, (int64_t)T * c->hidden, err));
    }
    TRY(f->ops->add(f->be, f->x, f->dx, (int64_t)T * c->hidden, err));
    return capture_rows(f, s, staged, f->l0, f->x, err);
}

/* The ops of a step on backend memory only (recordable): embedding, the layers, the
 * final norm and the logits of the gathered rows. Inputs are on the device already. */
static eg_status step_ops(eg_forward *f, const eg_step *s, int max_pos, int staged, eg_error *err) {
    const eg_config *c = &f->m->cfg;
    const eg_backend_ops *ops = f->ops;
    eg_backend *be = f->be;
    int T = s->T;
    int vsplit = eg_ep_vocab_split(f->o.ep); /* tok_d, x, g and logits in the rank backend's memory */
    int l_first = f->l0;
    if (f->l0 == 0 && !f->o.head_cut) {
        if (vsplit) TRY(eg_ep_embed(f->o.ep, f->o.ep_rank, be, f->tok_d, T, f->x, err));
        else TRY(ops->embed(be, f->tok_d, T, &f->embed, f->x, err));
        TRY(capture_rows(f, s, staged, -1, f->x, err));
    }
    if (f->o.head_cut) {
        eg_status st = split_finish(f, s, staged, err);
        if (st) return eg_wrap(err, "layer %d (experts %d..%d, after the cut)", f->l0, f->o.head_cut,
                               c->n_experts - 1);
        l_first++;
    }
    int kv0 = f->l0 + (f->o.head_cut > 0); /* the first layer with a cache here */
    for (int l = l_first; l < f->l1; l++) {
        const eg_layer_w *L = &f->layers[l - f->l0];
        eg_status st;
        if ((st = ops->rmsnorm(be, f->x, &L->attn_norm, T, c->hidden, c->rms_eps, f->xn, err)) ||
            (st = attention(f, L, T, max_pos, f->kv->layers[l - kv0], err)) ||
            (st = ops->add_rmsnorm(be, f->x, f->dx, &L->ffn_norm, T, c->hidden, c->rms_eps, f->xn, err)))
            return eg_wrap(err, "layer %d", l);
        if (f->o.tail_cut && l == f->l1 - 1) {
            if ((st = split_start(f, L, T, err)))
                return eg_wrap(err, "layer %d (experts 0..%d, before the cut)", l, f->o.tail_cut - 1);
            break;
        }
        if ((st = ffn(f, L, l, T, err)) || (st = ops->add(be, f->x, f->dx, (int64_t)T * c->hidden, err)) ||
            (st = capture_rows(f, s, staged, l, f->x, err)))
            return eg_wrap(err, "layer %d", l);
    }
    if (f->l1 == c->n_layers) {
        TRY(ops->rmsnorm(be, f->x, &f->final_norm, T, c->hidden, c->rms_eps, f->xn, err));
        if (s->n_logits > 0) TRY(ops->gather_rows(be, f->xn, f->rows_d, s->n_logits, c->hidden, f->g, err));
        /* split: every rank calls, with or without rows, as the others compute its columns */
        if (vsplit) TRY(eg_ep_logits(f->o.ep, f->o.ep_rank, be, f->g, s->n_logits, f->logits, err));
        else if (s->n_logits > 0) TRY(ops->linear(be, f->g, s->n_logits, &f->lm_head, f->logits, err));
    }
    return EG_OK;
}

static int key_eq(const graph_key *a, const graph_key *b) {
    return a->T == b->T && a->max_pos == b->max_pos && a->n_logits == b->n_logits &&
           a->staged_capture == b->staged_capture;
}

/* The entry of this shape; a new one replaces the least recently used (its graph is
 * freed: graph_free waits for a replay in flight). */
static graph_entry *graph_lookup(eg_forward *f, const graph_key *k) {
    graph_entry *victim = NULL;
    for (int i = 0; i < EG_GRAPH_SLOTS; i++) {
        graph_entry *g = &f->graphs[i];
        if (g->state != GRAPH_NEW && key_eq(&g->key, k)) return g;
        if (!victim || (victim->state != GRAPH_NEW &&
                        (g->state == GRAPH_NEW || g->last_use < victim->last_use)))
            victim = g;
    }
    if (victim->graph) {
        f->ops->graph_free(f->be, victim->graph);
        f->gstats.evicted++;
    }
    memset(victim, 0, sizeof *victim);
    victim->key = *k;
    return victim;
}

static void note_graph_failure(eg_forward *f, graph_entry *g, const eg_error *why) {
    f->gstats.failed++;
    if (!f->gstats.first_failure[0])
        snprintf(f->gstats.first_failure, sizeof f->gstats.first_failure, "%.*s",
                 (int)sizeof f->gstats.first_failure - 1, why->msg);
    g->state = ++g->fails >= EG_GRAPH_MAX_FAILS ? GRAPH_OFF : GRAPH_SEEN;
}

/* Run the step's ops: replayed when this shape was recorded, recorded on its second
 * sighting (the first runs op by op and warms every lazily built device table), op by
 * op otherwise. Same kernels, same arguments either way: results are bit-identical. */
static eg_status run_ops(eg_forward *f, const eg_step *s, int max_pos, int *staged, eg_error *err) {
    *staged = s->T <= f->graph_T;
    if (!*staged) return step_ops(f, s, max_pos, 0, err);
    graph_key k = {.T = s->T, .max_pos = max_pos, .n_logits = eg_forward_is_last(f) ? s->n_logits : 0,
                   .staged_capture = s->capture != NULL};
    graph_entry *g = graph_lookup(f, &k);
    g->last_use = ++f->tick;
    if (g->state == GRAPH_READY) {
        int ran = 0;
        TRY(f->ops->graph_launch(f->be, g->graph, &ran, err));
        if (ran) {
            f->gstats.replays++;
            return EG_OK;
        }
        f->ops->graph_free(f->be, g->graph); /* stale: record again next time */
        g->graph = NULL;
        g->state = GRAPH_SEEN;
        f->gstats.stale++;
        return step_ops(f, s, max_pos, 1, err);
    }
    if (g->state != GRAPH_SEEN) {
        if (g->state == GRAPH_NEW) g->state = GRAPH_SEEN;
        return step_ops(f, s, max_pos, 1, err);
    }
    eg_error why;
    eg_status st = f->ops->graph_begin(f->be, &why);
    if (st == EG_ERR_UNSUPPORTED) { /* switched off: never try again */
        f->graph_T = 0;
        return step_ops(f, s, max_pos, 1, err);
    }
    if (st) return eg_fail(err, st, "%s", why.msg);
    void *graph = NULL;
    st = step_ops(f, s, max_pos, 1, &why);
    eg_error end_why;
    eg_status est = f->ops->graph_end(f->be, &graph, &end_why);
    if (st || est) {
        /* nothing ran while recording: run the ops for real (a genuine error shows there) */
        note_graph_failure(f, g, st ? &why : &end_why);
        return step_ops(f, s, max_pos, 1, err);
    }
    g->graph = graph;
    g->state = GRAPH_READY;
    f->gstats.recorded++;
    int ran = 0;
    TRY(f->ops->graph_launch(f->be, graph, &ran, err));
    if (!ran) return eg_fail(err, EG_ERR_DEVICE, "a graph went stale between recording and its first replay");
    f->gstats.replays++;
    return EG_OK;
}

eg_status eg_forward_step(eg_forward *f, const eg_step *s, eg_error *err) {
    const eg_config *c = &f->m->cfg;
    const eg_backend_ops *ops = f->ops;
    eg_backend *be = f->be;
    int T = s->T;
    size_t H = (size_t)c->hidden;
    if (T < 1 || T > f->o.max_tokens)
        return eg_fail(err, EG_ERR_INVALID, "step of %d tokens (this engine takes 1..%d)", T, f->o.max_tokens);
    int max_pos = 0;
    for (int t = 0; t < T; t++) {
        if (s->slot[t] < 0 || s->slot[t] >= f->kv->n_slots)
            return eg_fail(err, EG_ERR_INVALID, "token %d: slot %d out of range", t, s->slot[t]);
        if (s->pos[t] < 0 || (int64_t)s->pos[t] >= (int64_t)f->kv->n_mapped[s->slot[t]] * f->kv->block_size)
            return eg_fail(err, EG_ERR_INVALID, "token %d: position %d of slot %d has no cache block reserved", t,
                           s->pos[t], s->slot[t]);
        if (s->pos[t] + 1 > max_pos) max_pos = s->pos[t] + 1;
    }
    /* max_pos only bounds work (kernels read each token's own position); rounding it up
     * keeps the step's shape, and a recorded replay of it, for hundreds of steps */
    max_pos = eg_forward_pos_bucket(max_pos, f->kv->max_blocks * f->kv->block_size);
    bind_planes(f, T);
    int last = eg_forward_is_last(f);
    if (last && s->n_logits > T) return eg_fail(err, EG_ERR_INVALID, "more logit rows than tokens");
    if (last && s->n_logits > f->logit_rows)
        return eg_fail(err, EG_ERR_INVALID, "%d logit rows asked for; the forward holds %d (eg_forward_opts.logit_rows)",
                       s->n_logits, f->logit_rows);
    TRY(ops->to_device(be, f->pos_d, s->pos, sizeof(int32_t) * (size_t)T, err));
    TRY(ops->to_device(be, f->slot_d, s->slot, sizeof(int32_t) * (size_t)T, err));
    TRY(eg_kv_sync_table(f->kv, err));
    if (f->l0 == 0 && !f->o.head_cut) {
        /* checked here, on the host: a device embedding cannot report a bad id without a sync */
        for (int t = 0; t < T; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= c->vocab)
                return eg_fail(err, EG_ERR_INVALID, "token %d: id %d out of range [0, %d)", t, s->tokens[t], c->vocab);
        TRY(ops->to_device(be, f->tok_d, s->tokens, sizeof(int32_t) * (size_t)T, err));
    } else if (!s->x_device) {
        if (!s->x_in) return eg_fail(err, EG_ERR_INVALID, "pipeline stage starting at layer %d needs x_in", f->l0);
        TRY(ops->to_device(be, eg_forward_in(f), s->x_in, sizeof(float) * (size_t)T * (size_t)eg_forward_in_floats(f),
                           err));
    }
    if (last && s->n_logits > 0)
        TRY(ops->to_device(be, f->rows_d, s->logit_rows, sizeof(int32_t) * (size_t)s->n_logits, err));
    int staged = 0;
    TRY(run_ops(f, s, max_pos, &staged, err));
    if (staged) TRY(copy_out_captures(f, s, err));
    if (last) {
        if (s->final_hidden)
            TRY(ops->to_host(be, s->final_hidden, f->o.final_pre_norm ? f->x : f->xn, sizeof(float) * (size_t)T * H, err));
        if (s->final_pre_hidden)
            TRY(ops->to_host(be, s->final_pre_hidden, f->x, sizeof(float) * (size_t)T * H, err));
        if (s->n_logits > 0) {
            if (s->logits)
                TRY(ops->to_host(be, s->logits, f->logits, sizeof(float) * (size_t)s->n_logits * (size_t)c->vocab, err));
            if (s->sampled)
                TRY(ops->sample(be, f->logits, s->n_logits, c->vocab, s->sp, s->rng, s->sampled, err));
            if (s->prob_tok && s->prob) {
                if (ops->token_probs)
                    TRY(ops->token_probs(be, f->logits, s->n_logits, c->vocab, s->sp, s->prob_tok, s->prob, err));
                else
                    for (int j = 0; j < s->n_logits; j++)
                        if (s->prob_tok[j] >= 0) s->prob[j] = NAN;
            }
        }
    } else {
        if (s->x_out && !s->x_device)
            TRY(ops->to_host(be, s->x_out, eg_forward_out(f), sizeof(float) * (size_t)T * (size_t)eg_forward_out_floats(f),
                             err));
        if (s->async) return EG_OK;
    }
    return ops->sync(be, err);
}
