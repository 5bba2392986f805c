/* The EAGLE-3 drafter on the CPU; see drafter_eagle3.h.
 *
 * One decoder layer (SpecForge's `midlayer`) at position p of a slot, inputs the token
 * embedding e [H] and a hidden input h [H] (fc(concat aux) for committed positions, the
 * previous step's pre-norm output for chained drafts):
 *   r   = h                       (norm_before_residual: r = hidden_norm(h))
 *   c   = concat(input_layernorm(e), hidden_norm(h))                 [2H]
 *   q,k,v = Wq c, Wk c, Wv c;  RoPE (rotate-half, rope_theta) on q and k at p
 *   K[p], V[p] = bf16(k), bf16(v)  (the cache; attention reads every key from it)
 *                                  (paged: blocks of BS positions mapped as a slot grows)
 *   a   = softmax(q . K[0..p] / sqrt(HD)) V[0..p] per head (GQA: head h reads kv head
 *         h / (NH/NKV))
 *   x   = r + Wo a;  out = x + Wdown(silu(Wgate y) * Wup y), y = post_attention_layernorm(x)
 * logits = lm_head(norm(out)) over the draft vocabulary; target id = d + d2t[d].
 * Everything is FP32; weights are widened element by element. */
#include "engine/drafter_eagle3.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/eg_thread.h"
#include "engine/cuda_plan.h"
#include "engine/safetensors.h"
#include "engine/spec.h"

/* A draw's scratch (pick): one per pool thread, so a pass's rows are drawn at once. */
typedef struct pick_scr {
    eg_spec_scratch *sc;       /* over Vd (monotone) or V */
    double *pd;                /* [Vd] processed distribution over the draft vocabulary */
    double *pt;                /* [V] the same over the target vocabulary (non-monotone d2t) */
    float *logits_t;           /* [V] the logits scattered to target ids (non-monotone d2t) */
} pick_scr;

typedef struct dw {            /* a plain weight [rows][cols] in the checkpoint */
    eg_st_dtype dt;            /* BF16, F16 or F32 */
    int64_t rows, cols;
    const void *data;          /* aligned to its element size */
} dw;

typedef struct e3 {
    eg_drafter base;
    /* dimensions */
    int H, Ht, NH, NKV, HD, I, V, Vd, n_aux, L_target, S, T;
    float eps;
    int norm_before_residual;
    int norm_before_fc;        /* speculators: RMSNorm of the concatenated aux rows before fc */
    int fc_norm;               /* vLLM / speculators: an RMSNorm per aux row before fc (after
                                  norm_before_fc when both are on) */
    int norm_output;           /* speculators: the chain's hidden input is norm(out), not out */
    int window;                /* sliding-window attention: a position attends to its last `window` (0: all) */
    int monotone;              /* d2t strictly increasing target ids: draft-index order is
                                  target-id order, so q can be processed over Vd */
    int *aux_buf;              /* [n_aux] target layers, eaglegen convention, ascending */
    const char *aux_source;    /* how the convention was decided (static string) */
    double theta;              /* rope_theta */
    /* MLA (vLLM's Eagle3DeepseekV2ForCausalLM): the layer's attention is DeepSeek's MLA,
       run by the backend's mla_attention op (the target's, YaRN RoPE included) over the
       drafter's own paged latent cache; backend path only */
    int mla;
    int QL, C, DN, DR, DV;     /* q_lora_rank (0: q_proj), kv_lora_rank, nope / rope / value head dims */
    eg_config mcfg;            /* the layer's config as a DeepSeek model's (dimensions, RoPE / YaRN) */
    float attn_factor, mla_scale; /* eg_config_rope_attn_factor / eg_config_softmax_scale of mcfg */
    /* weights */
    dw fc, in_norm, hid_norm, wq, wk, wv, wo, post_norm, wg, wu, wd, norm, lm_head, embed;
    dw input_norm;             /* [n_aux*Ht] norm_before_fc only */
    dw *fcn;                   /* [n_aux] of [Ht]: fc_norm only (fc_norm.{i}.weight) */
    /* MLA: q_a [QL][2H], q_a_norm [QL], q_b [NH*(DN+DR)][QL] (or q_full [NH*(DN+DR)][2H]),
       kv_a [C+DR][2H], kv_a_norm [C], kv_b [NH*(DN+DV)][C]; wo is then [H][NH*DV] */
    dw q_a, q_a_norm, q_b, q_full, kv_a, kv_a_norm, kv_b;
    int own_embed;             /* 0: the target's embedding */
    const eg_model *target;
    const eg_config *tcfg;     /* the target's config (config parsing reads only this) */
    int64_t *d2t;              /* [Vd] */
    float *inv_freq;           /* [HD/2] */
    /* files */
    int n_files;
    eg_st_file **files;
    /* the paged cache's blocks (both paths): position p of slot s is row p % BS of
       block table[s][p / BS]; a slot maps blocks as it grows and returns them on truncate */
    int BS, MB;                /* positions per block, blocks per slot (ceil(T / BS)) */
    int64_t n_blocks;          /* the pool */
    int32_t *table;            /* [S][MB] physical block; -1 unmapped */
    int32_t *n_mapped;         /* [S] */
    int32_t *free_list;        /* [n_blocks] stack of free blocks */
    int64_t n_free;
    uint8_t *dirty;            /* [S] the row changed since the backend's copy was written */
    /* state */
    uint16_t *kc, *vc;         /* [n_blocks][BS][NKV][HD] bf16 (own path) */
    float *last;               /* [S][H] pre-norm output of each slot's last position */
    int *len;                  /* [S] */
    int *last_pos;             /* [S] position `last` belongs to (-1: none) */
    /* scratch */
    float *emb, *hid, *res, *cat, *q, *k, *v, *att, *x, *y, *g, *u, *out, *scores, *logits;
    float *auxn;               /* [n_aux*Ht] norm_before_fc / fc_norm: the normed aux row */
    struct pick_scr *ps;       /* [n_ps] a draw's scratch per pool thread (pick) */
    int n_ps;
    int have_logits;           /* 1: logits holds the last row; 2: row dev_rows - 1 of the
                                  backend's g->logits does (eg_drafter_eagle3_last_logits) */
    int dev_rows;
    float *mlogits;            /* [R][Vd] backend path: the logits of a pass's rows (host) */
    int *order;                /* [S] propose_many: items by k, descending */
    uint8_t *mark;             /* [S] a batch's slots (distinct) */
    eg_pool *pool;
    struct e3_dev *dev;        /* the backend path (eg_eagle3_opts.backend); NULL: own code */
} e3;

/* The backend path's state: device weights, caches and activations (backend memory,
 * R = rows per pass), host staging of the embedding rows. */
typedef struct e3_dev {
    eg_backend *be;
    int R;
    eg_weight fc, in_norm, hid_norm, wq, wk, wv, wo, post_norm, wg, wu, wd, norm, lm_head;
    eg_weight input_norm;      /* [n_aux*Ht] norm_before_fc only */
    eg_weight *fcn;            /* [n_fcn] fc_norm only */
    int n_fcn;
    float *fa, *fb;            /* [R][Ht] x2: fc_norm's gathered chunk and its norm */
    eg_weight q_a, q_a_norm, q_b, q_full, kv_a, kv_a_norm, kv_b; /* MLA */
    float *qa, *qan, *kvb;     /* MLA: [R][QL] x2, [R][C+DR] */
    uint16_t *kc, *vc;         /* [n_blocks][BS][NKV][HD] bf16 (MLA: kc the latent
                                  [n_blocks][BS][C+DR], vc unused) */
    int32_t *table;            /* [S][MB] the block table's copy */
    float *last;               /* [S][H] */
    float *inv_freq;           /* [HD/2] */
    int32_t *pos, *slot;       /* [R] */
    float *emb, *aux, *hid, *ne, *nh, *cat, *q, *k, *v, *att, *x, *y, *out, *logits;
    float *auxn;               /* [R][n_aux*Ht] norm_before_fc / fc_norm only */
    float *lr;                 /* [R][H] a propose pass's slots' last rows, gathered */
    /* [R][H] x5 (emb, hid, ne, nh, x, y, out), [R][n_aux*Ht], [R][2H], [R][NH*HD] (q, att),
       [R][NKV*HD] (k, v), [R][Vd] (logits) */
    float *h_emb;              /* host [R][H] */
    int32_t *h_pos, *h_slot;   /* host [R] */
    uint8_t *h_end;            /* host [R] an extend pass's row is its item's last */
    /* draws from the backend's answers (dev_pick; kcap 0: every row comes to the host) */
    int kcap;                  /* ids of a kept set asked for (EG_KEPT_CAP, at most Vd) */
    eg_sample_params *k_sp;    /* host [R] the asked rows' parameters */
    int32_t *k_rows, *k_n;     /* host [R] the asked rows, their kept sets' sizes (-1: none) */
    int32_t *k_id;             /* host [R][kcap] kept draft ids, then sorted with k_p */
    double *k_p;               /* host [R][kcap] */
    int32_t *k_am;             /* host [R] greedy rows' argmax (the backend's greedy sample) */
    uint64_t *k_rng;           /* host [R] that sample's states (a greedy draw takes none) */
    int8_t *k_how;             /* host [R] how pass row r is drawn (PICK_*) */
    int32_t *k_at;             /* host [R] a PICK_KEPT row's index among the asked */
    eg_sample_params *k_greedy; /* host [R] greedy parameters, for that sample */
} e3_dev;

enum { PICK_HOST = 0, PICK_KEPT = 1, PICK_ARGMAX = 2 };

/* ------------------------------------------------------------------ products */

static inline float dw_get(const dw *w, int64_t i) {
    switch (w->dt) {
    case EG_ST_BF16: return eg_bf16_to_f32(((const uint16_t *)w->data)[i]);
    case EG_ST_F16: return eg_f16_to_f32(((const uint16_t *)w->data)[i]);
    default: return ((const float *)w->data)[i];
    }
}

static float dot_row(const dw *w, int64_t r, const float *x) {
    const int64_t n = w->cols;
    float acc = 0;
    if (w->dt == EG_ST_BF16) { /* 8 partial sums (a fixed order: results do not depend on threads) */
        const uint16_t *p = (const uint16_t *)w->data + r * n;
        float part[8] = {0};
        int64_t c = 0;
        for (; c + 8 <= n; c += 8)
            for (int j = 0; j < 8; j++) {
                uint32_t u = (uint32_t)p[c + j] << 16;
                float wv;
                memcpy(&wv, &u, 4);
                part[j] += wv * x[c + j];
            }
        for (; c < n; c++) acc += eg_bf16_to_f32(p[c]) * x[c];
        acc += ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    } else if (w->dt == EG_ST_F32) {
        const float *p = (const float *)w->data + r * n;
        for (int64_t c = 0; c < n; c++) acc += p[c] * x[c];
    } else {
        const uint16_t *p = (const uint16_t *)w->data + r * n;
        for (int64_t c = 0; c < n; c++) acc += eg_f16_to_f32(p[c]) * x[c];
    }
    return acc;
}

typedef struct mv_ctx { const dw *w; const float *x; float *y; } mv_ctx;
static void mv_body(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    mv_ctx *c = ctx;
    for (int64_t r = b; r < e; r++) c->y[r] = dot_row(c->w, r, c->x);
}
/* y[rows] = W x[cols] */
static void matvec(e3 *d, const dw *w, const float *x, float *y) {
    mv_ctx c = {w, x, y};
    int64_t grain = w->rows * w->cols < 65536 ? w->rows : 16;
    eg_pool_for(d->pool, w->rows, grain, mv_body, &c);
}

static void rmsnorm(const float *x, const dw *w, int n, float eps, float *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * r * dw_get(w, i);
}

static void embed_row(e3 *d, int32_t id, float *out) {
    if (d->own_embed) {
        for (int c = 0; c < d->H; c++) out[c] = dw_get(&d->embed, (int64_t)id * d->H + c);
    } else {
        eg_weight_row(&d->target->embed, id, out);
    }
}

/* Rotate-half RoPE on one head vector at position p. */
static void rope(const e3 *d, float *v, int p) {
    const int half = d->HD / 2;
    for (int i = 0; i < half; i++) {
        double a = (double)p * d->inv_freq[i];
        float cs = (float)cos(a), sn = (float)sin(a);
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs - x1 * sn;
        v[i + half] = x1 * cs + x0 * sn;
    }
}

/* ------------------------------------------------------------------ the paged cache */

/* Bytes per cached position: K and V of the kv heads, or an MLA layer's latent. */
static int64_t cache_bytes(const e3 *d) {
    return d->mla ? 2 * ((int64_t)d->C + d->DR) : 4 * (int64_t)d->NKV * d->HD;
}

/* The cache row (token index into [n_blocks][BS]) of position p of slot s (mapped). */
static inline int64_t cache_row(const e3 *d, int s, int p) {
    return (int64_t)d->table[(int64_t)s * d->MB + p / d->BS] * d->BS + p % d->BS;
}

static void cache_unmap(e3 *d, int s, int64_t len);

/* Map blocks so slot s holds positions [0, n). EG_ERR_NOMEM, the slot as it was (its
 * length's blocks), when the pool runs out. */
static eg_status cache_map(e3 *d, int s, int64_t n, eg_error *err) {
    const int64_t need = (n + d->BS - 1) / d->BS;
    while (d->n_mapped[s] < need) {
        if (d->n_free == 0) {
            cache_unmap(d, s, d->len[s]);
            return eg_fail(err, EG_ERR_NOMEM,
                           "eagle3 drafter: its cache pool (%lld blocks of %d positions) is full: slot %d needs %lld "
                           "positions (the pool is sized to the target's KV pool, which bounds it; a larger "
                           "eg_eagle3_opts.pool_blocks lifts it)",
                           (long long)d->n_blocks, d->BS, s, (long long)n);
        }
        d->table[(int64_t)s * d->MB + d->n_mapped[s]++] = d->free_list[--d->n_free];
        d->dirty[s] = 1;
    }
    return EG_OK;
}

/* Return slot s's blocks past those holding positions [0, len). */
static void cache_unmap(e3 *d, int s, int64_t len) {
    const int64_t keep = (len + d->BS - 1) / d->BS;
    while (d->n_mapped[s] > keep) {
        int32_t *e = &d->table[(int64_t)s * d->MB + --d->n_mapped[s]];
        d->free_list[d->n_free++] = *e;
        *e = -1;
        d->dirty[s] = 1;
    }
}

/* The decoder layer at position p of slot s: reads d->emb and d->hid, writes the cache
 * row p and d->out (pre-norm output). */
static void layer(e3 *d, int s, int p) {
    const int H = d->H, HD = d->HD, NKV = d->NKV, NH = d->NH;
    rmsnorm(d->emb, &d->in_norm, H, d->eps, d->cat);
    rmsnorm(d->hid, &d->hid_norm, H, d->eps, d->cat + H);
    if (d->norm_before_residual) memcpy(d->res, d->cat + H, sizeof(float) * (size_t)H);
    else memcpy(d->res, d->hid, sizeof(float) * (size_t)H);
    matvec(d, &d->wq, d->cat, d->q);
    matvec(d, &d->wk, d->cat, d->k);
    matvec(d, &d->wv, d->cat, d->v);
    for (int h = 0; h < NH; h++) rope(d, d->q + (int64_t)h * HD, p);
    for (int h = 0; h < NKV; h++) rope(d, d->k + (int64_t)h * HD, p);
    const int64_t row = (int64_t)NKV * HD;
    uint16_t *kc = d->kc + cache_row(d, s, p) * row, *vc = d->vc + cache_row(d, s, p) * row;
    for (int64_t i = 0; i < row; i++) {
        kc[i] = eg_f32_to_bf16(d->k[i]);
        vc[i] = eg_f32_to_bf16(d->v[i]);
    }
    const uint16_t *K = d->kc, *V = d->vc;
    const float scale = 1.0f / sqrtf((float)HD);
    const int grp = NH / NKV;
    for (int h = 0; h < NH; h++) {
        const float *qh = d->q + (int64_t)h * HD;
        const int kvh = h / grp;
        float mx = -FLT_MAX;
        const int lo = d->window > 0 && p - d->window + 1 > 0 ? p - d->window + 1 : 0; /* sliding window */
        for (int j = lo; j <= p; j++) {
            const uint16_t *kj = K + cache_row(d, s, j) * row + (int64_t)kvh * HD;
            float acc = 0;
            for (int c = 0; c < HD; c++) acc += qh[c] * eg_bf16_to_f32(kj[c]);
            d->scores[j] = acc * scale;
            if (d->scores[j] > mx) mx = d->scores[j];
        }
        float sum = 0;
        for (int j = lo; j <= p; j++) {
            d->scores[j] = expf(d->scores[j] - mx);
            sum += d->scores[j];
        }
        float *ah = d->att + (int64_t)h * HD;
        for (int c = 0; c < HD; c++) ah[c] = 0;
        for (int j = lo; j <= p; j++) {
            const uint16_t *vj = V + cache_row(d, s, j) * row + (int64_t)kvh * HD;
            const float w = d->scores[j] / sum;
            for (int c = 0; c < HD; c++) ah[c] += w * eg_bf16_to_f32(vj[c]);
        }
    }
    matvec(d, &d->wo, d->att, d->x);
    for (int i = 0; i < H; i++) d->x[i] += d->res[i];
    rmsnorm(d->x, &d->post_norm, H, d->eps, d->y);
    matvec(d, &d->wg, d->y, d->g);
    matvec(d, &d->wu, d->y, d->u);
    for (int i = 0; i < d->I; i++) d->g[i] = d->g[i] / (1.0f + expf(-d->g[i])) * d->u[i];
    matvec(d, &d->wd, d->g, d->out);
    for (int i = 0; i < H; i++) d->out[i] += d->x[i];
}

/* logits [Vd] from a pre-norm output. */
static void head(e3 *d, const float *prenorm) {
    rmsnorm(prenorm, &d->norm, d->H, d->eps, d->y);
    matvec(d, &d->lm_head, d->y, d->logits);
    d->have_logits = 1;
}

/* ------------------------------------------------------------------ backend path */

/* The same layer through engine/backend.h's ops, for n rows: row i at position
 * g->h_pos[i] of slot g->h_slot[i] (the caller fills both; rows of several slots, each
 * slot's positions consecutive and ascending). Inputs in dev->emb and dev->hid [n][H];
 * writes the cache rows and dev->out [n][H]. */
static eg_status dev_layer(e3 *d, int n, eg_error *err) {
    e3_dev *g = d->dev;
    eg_backend *b = g->be;
    const eg_backend_ops *o = b->ops;
    const int H = d->H;
    int max_pos = 0;
    eg_status st;
    for (int i = 0; i < n; i++) {
        int s = g->h_slot[i];
        if (g->h_pos[i] + 1 > max_pos) max_pos = g->h_pos[i] + 1;
        if (d->dirty[s]) { /* the slot's blocks changed: its row of the table's copy */
            if ((st = o->to_device(b, g->table + (int64_t)s * d->MB, d->table + (int64_t)s * d->MB,
                                   sizeof(int32_t) * (size_t)d->MB, err)))
                return st;
            d->dirty[s] = 0;
        }
    }
    if ((st = o->to_device(b, g->pos, g->h_pos, sizeof(int32_t) * (size_t)n, err)) ||
        (st = o->to_device(b, g->slot, g->h_slot, sizeof(int32_t) * (size_t)n, err)) ||
        (st = o->rmsnorm(b, g->emb, &g->in_norm, n, H, d->eps, g->ne, err)) ||
        (st = o->rmsnorm(b, g->hid, &g->hid_norm, n, H, d->eps, g->nh, err)) ||
        (st = o->copy_rows(b, g->cat, 2 * (int64_t)H, g->ne, H, n, H, err)) ||
        (st = o->copy_rows(b, g->cat + H, 2 * (int64_t)H, g->nh, H, n, H, err)))
        return st;
    if (d->mla) {
        /* DeepSeek's MLA over the concat: q through its LoRA (or q_proj), the latent and
           k_pe from kv_a; the op normalises the latent, rotates k_pe and q_pe (YaRN), caches
           both in BF16 and attends with kv_b's absorbed halves */
        if ((d->QL ? (st = o->linear(b, g->cat, n, &g->q_a, g->qa, err)) ||
                         (st = o->rmsnorm(b, g->qa, &g->q_a_norm, n, d->QL, d->eps, g->qan, err)) ||
                         (st = o->linear(b, g->qan, n, &g->q_b, g->q, err))
                   : (st = o->linear(b, g->cat, n, &g->q_full, g->q, err))) ||
            (st = o->linear(b, g->cat, n, &g->kv_a, g->kvb, err)))
            return st;
        eg_mla_args m = {.T = n, .pos = g->pos, .slot = g->slot, .block_table = g->table, .max_blocks = d->MB,
                         .block_size = d->BS, .max_pos = max_pos, .q = g->q, .kv = g->kvb, .kv_a_norm = &g->kv_a_norm,
                         .kv_b = &g->kv_b, .cache = {.data = g->kc, .dtype = EG_KV_BF16, .row_bytes = 2 * (d->C + d->DR)},
                         .rope_inv_freq = g->inv_freq, .rope_attn_factor = d->attn_factor,
                         .softmax_scale = d->mla_scale, .eps = d->eps, .h0 = 0, .h1 = d->NH, .out = g->att};
        if ((st = o->mla_attention(b, &m, err))) return st;
        goto attended;
    }
    if ((st = o->linear(b, g->cat, n, &g->wq, g->q, err)) || (st = o->linear(b, g->cat, n, &g->wk, g->k, err)) ||
        (st = o->linear(b, g->cat, n, &g->wv, g->v, err)))
        return st;
    eg_gqa_args a = {.T = n, .n_heads = d->NH, .n_kv_heads = d->NKV, .head_dim = d->HD, .block_size = d->BS,
                     .max_blocks = d->MB, .n_blocks = d->n_blocks, .max_pos = max_pos, .pos = g->pos,
                     .slot = g->slot, .block_table = g->table, .q = g->q, .k = g->k, .v = g->v,
                     .k_cache = g->kc, .v_cache = g->vc, .rope_inv_freq = g->inv_freq,
                     .softmax_scale = 1.0f / sqrtf((float)d->HD), .window = d->window, .out = g->att};
    if ((st = o->gqa_attention(b, &a, err))) return st;
attended:;
    const int64_t nH = (int64_t)n * H;
    if ((st = o->linear(b, g->att, n, &g->wo, g->x, err)) ||
        (st = o->add(b, g->x, d->norm_before_residual ? g->nh : g->hid, nH, err)) ||
        (st = o->rmsnorm(b, g->x, &g->post_norm, n, H, d->eps, g->y, err)) ||
        (st = o->swiglu_mlp(b, g->y, n, &g->wg, &g->wu, &g->wd, g->out, 0, err)) ||
        (st = o->add(b, g->out, g->x, nH, err)))
        return st;
    return EG_OK;
}

/* logits [m][Vd] (backend g->logits) from m pre-norm rows in backend memory: lm_head
 * read once for all of them. The rows stay there: dev_pick takes to the host only those
 * its draws need; the last one is fetched for eg_drafter_eagle3_last_logits on demand. */
static eg_status dev_head(e3 *d, const float *prenorm, int m, eg_error *err) {
    e3_dev *g = d->dev;
    eg_backend *b = g->be;
    eg_status st;
    if ((st = b->ops->rmsnorm(b, prenorm, &g->norm, m, d->H, d->eps, g->y, err)) ||
        (st = b->ops->linear(b, g->y, m, &g->lm_head, g->logits, err)))
        return st;
    d->have_logits = 2; /* row m - 1 of g->logits */
    d->dev_rows = m;
    return EG_OK;
}

/* Embedding rows (looked up on the host: neither the drafter's nor the target's [V][H]
 * table is copied to the device) staged at rows at .. at+n-1 of g->h_emb; dev_embed_put
 * moves rows [0, n) to dev->emb. */
static void dev_embed_stage(e3 *d, const int32_t *tokens, int n, int at) {
    for (int i = 0; i < n; i++) embed_row(d, tokens[i], d->dev->h_emb + (int64_t)(at + i) * d->H);
}
static eg_status dev_embed_put(e3 *d, int n, eg_error *err) {
    e3_dev *g = d->dev;
    return g->be->ops->to_device(g->be, g->emb, g->h_emb, sizeof(float) * (size_t)n * (size_t)d->H, err);
}

/* fc_norm on m rows [m][n_aux][Ht] of src into g->auxn: chunk i of every row gathered
 * (copy_rows, stride n_aux * Ht), normalised with fc_norm.{i}, scattered back. */
static eg_status dev_fc_norm(e3 *d, int m, const float *src, eg_error *err) {
    e3_dev *g = d->dev;
    eg_backend *b = g->be;
    const int64_t Ht = d->Ht, arow = (int64_t)d->n_aux * Ht;
    eg_status st = EG_OK;
    for (int i = 0; i < d->n_aux && !st; i++)
        if (!(st = b->ops->copy_rows(b, g->fa, Ht, src + i * Ht, arow, m, Ht, err)) &&
            !(st = b->ops->rmsnorm(b, g->fa, &g->fcn[i], m, (int)Ht, d->eps, g->fb, err)))
            st = b->ops->copy_rows(b, g->auxn + i * Ht, arow, g->fb, Ht, m, Ht, err);
    return st;
}

/* The items' rows in passes of up to R rows over all of them (a pass may hold the end of
 * one item and the start of the next): fc, the layer and each item's last row. */
static eg_status dev_extend_many(e3 *d, int n_items, const eg_draft_extend *it, eg_error *err) {
    e3_dev *g = d->dev;
    eg_backend *b = g->be;
    const int64_t arow = (int64_t)d->n_aux * d->Ht;
    eg_status st = eg_backend_bind(b, err);
    int i = 0, t = 0; /* the next row: item i's row t */
    while (!st && i < n_items) {
        int m = 0;
        while (i < n_items && m < g->R) { /* fill the pass with the items' segments */
            int seg = it[i].n - t < g->R - m ? it[i].n - t : g->R - m;
            if (seg > 0) {
                dev_embed_stage(d, it[i].next_tokens + t, seg, m);
                if ((st = b->ops->to_device(b, g->aux + m * arow, it[i].aux + t * arow,
                                            sizeof(float) * (size_t)(seg * arow), err)))
                    return st;
            }
            for (int r = 0; r < seg; r++) {
                g->h_slot[m + r] = it[i].slot;
                g->h_pos[m + r] = it[i].pos0 + t + r;
                g->h_end[m + r] = t + r + 1 == it[i].n;
            }
            m += seg;
            t += seg;
            if (t == it[i].n) {
                i++;
                t = 0;
            }
        }
        if (!m) break;
        if ((st = dev_embed_put(d, m, err)) ||
            (d->norm_before_fc &&
             (st = b->ops->rmsnorm(b, g->aux, &g->input_norm, m, (int)arow, d->eps, g->auxn, err))) ||
            (d->fc_norm && (st = dev_fc_norm(d, m, d->norm_before_fc ? g->auxn : g->aux, err))) ||
            (st = b->ops->linear(b, d->norm_before_fc || d->fc_norm ? g->auxn : g->aux, m, &g->fc, g->hid, err)) ||
            (st = dev_layer(d, m, err)))
            break;
        for (int r = 0; r < m && !st; r++) /* an item's last row: the slot's hidden state */
            if (g->h_end[r])
                st = b->ops->copy(b, g->last + (int64_t)g->h_slot[r] * d->H, g->out + (int64_t)r * d->H,
                                  sizeof(float) * (size_t)d->H, err);
    }
    if (!st) st = b->ops->sync(b, err);
    return st;
}

static int32_t pick(const e3 *d, pick_scr *ps, const float *logits, const eg_sample_params *sp, uint64_t *rng,
                    eg_spec_q *q, int qi);

/* A greedy draft: target id of draft index best, q row qi (when q) one-hot there. */
static int32_t pick_greedy(const e3 *d, int best, eg_spec_q *q, int qi) {
    const int32_t tid = (int32_t)(best + d->d2t[best]);
    if (q) {
        q->id[(int64_t)qi * q->cap] = tid;
        q->p[(int64_t)qi * q->cap] = 1.0;
        q->n[qi] = 1;
    }
    return tid;
}

/* pick's sampled draw (d2t monotone) from a row's kept set instead of the row: ids / probs
 * [n] (kept_probs: any order, distinct draft ids, eg_spec_probs' numbers). Sorted by id,
 * the positive ones are pd's nonzero entries in pd's order, so eg_spec_draw_sparse gives
 * eg_spec_draw's draft and RNG state, and the q row is pick's. O(n log n), not O(Vd). */
static int32_t pick_kept(const e3 *d, pick_scr *ps, const int32_t *ids, const double *probs, int n, uint64_t *rng,
                         eg_spec_q *q, int qi) {
    const int m = eg_spec_sort_kept(ps->sc, ids, probs, n);
    const int32_t *di = ps->sc->ids;
    const double *w = ps->sc->p;
    const int32_t x = eg_spec_draw_sparse(w, di, m, rng);
    if (q) {
        int32_t *qid = q->id + (int64_t)qi * q->cap;
        double *qp = q->p + (int64_t)qi * q->cap;
        for (int j = 0; j < m; j++) {
            qid[j] = (int32_t)(di[j] + d->d2t[di[j]]);
            qp[j] = w[j];
        }
        q->n[qi] = m;
    }
    return (int32_t)(x + d->d2t[x]);
}

/* A propose pass's rows drawn at once over the drafter's pool (dev_propose_many): row r
 * of the pass is item grp[r]'s draft j, from its own rng, as dev_pick sorted it out
 * (g->k_how[r]): from its logits on the host, its kept set, or its argmax. */
typedef struct pick_job {
    const e3 *d;
    const eg_draft_propose *it;
    const int *grp;
    int j;
} pick_job;
static void pick_rows(void *vp, int64_t b, int64_t end, int tid) {
    const pick_job *c = vp;
    const e3 *d = c->d;
    const e3_dev *g = d->dev;
    for (int64_t r = b; r < end; r++) {
        const eg_draft_propose *p = &c->it[c->grp[r]];
        int32_t *out = &p->draft[c->j];
        if (g->k_how[r] == PICK_KEPT) {
            const int i = g->k_at[r];
            *out = pick_kept(d, &d->ps[tid], g->k_id + (int64_t)i * g->kcap, g->k_p + (int64_t)i * g->kcap, g->k_n[i],
                             p->rng, p->q, c->j);
        } else if (g->k_how[r] == PICK_ARGMAX) { /* pick's greedy branch on the backend's argmax */
            *out = pick_greedy(d, g->k_am[r], p->q, c->j);
        } else {
            *out = pick(d, &d->ps[tid], d->mlogits + r * d->Vd, p->sp, p->rng, p->q, c->j);
        }
    }
}

/* Sort out a pass's m rows of logits (backend g->logits; row r is item grp[r]'s) for
 * pick_rows, asking the backend for what it can reduce (opts.backend_draws): greedy rows'
 * argmax in one greedy sample over the pass (no RNG: a greedy draw takes none), sampled
 * rows' kept sets (d2t monotone); the rest, and kept sets the backend leaves (-1: over
 * kcap, unsettled), come to the host as their rows. */
static eg_status dev_pick(e3 *d, int m, const eg_draft_propose *it, const int *grp, eg_error *err) {
    e3_dev *g = d->dev;
    eg_backend *b = g->be;
    eg_status st = EG_OK;
    int na = 0, ng = 0, nh = 0;
    for (int r = 0; r < m; r++) {
        const eg_sample_params *sp = it[grp[r]].sp;
        g->k_how[r] = PICK_HOST;
        if (!g->kcap) continue;
        if (!(sp->temperature > 0.0f)) {
            g->k_how[r] = PICK_ARGMAX;
            ng++;
        } else if (d->monotone) {
            g->k_how[r] = PICK_KEPT;
            g->k_at[r] = na;
            g->k_rows[na] = r;
            g->k_sp[na++] = *sp;
        }
    }
    if (ng && (st = b->ops->sample(b, g->logits, m, d->Vd, g->k_greedy, g->k_rng, g->k_am, err))) return st;
    if (na && (st = b->ops->kept_probs(b, g->logits, g->k_rows, na, d->Vd, g->k_sp, g->kcap, g->k_n, g->k_id, g->k_p,
                                       err)))
        return st;
    for (int r = 0; r < m; r++) {
        if (g->k_how[r] == PICK_KEPT && g->k_n[g->k_at[r]] < 0) g->k_how[r] = PICK_HOST;
        nh += g->k_how[r] == PICK_HOST;
    }
    if (nh == m) { /* every row: one copy */
        st = b->ops->to_host(b, d->mlogits, g->logits, sizeof(float) * (size_t)m * (size_t)d->Vd, err);
    } else {
        for (int r = 0; r < m && !st; r++)
            if (g->k_how[r] == PICK_HOST)
                st = b->ops->to_host(b, d->mlogits + (int64_t)r * d->Vd, g->logits + (int64_t)r * d->Vd,
                                     sizeof(float) * (size_t)d->Vd, err);
    }
    if (!st && nh) st = b->ops->sync(b, err);
    d->base.draws.host_rows += nh;
    d->base.draws.argmax += ng;
    d->base.draws.kept += m - nh - ng;
    return st;
}

/* The items' chains in groups of up to R slots, each group one pass per draft position
 * over all its slots' rows (the weights read once per pass, not once per slot). Items in
 * d->order (k descending), so the rows of draft position j are a prefix of the group's:
 * row r is the same item at every position. Each item's draws come from its own rng in
 * its own order, so the drafts equal the per-slot chains'. */
static eg_status dev_propose_many(e3 *d, int n_items, const eg_draft_propose *it, const int *L0, eg_error *err) {
    e3_dev *g = d->dev;
    eg_backend *b = g->be;
    const int64_t H = d->H;
    eg_status st = eg_backend_bind(b, err);
    for (int g0 = 0; !st && g0 < n_items; g0 += g->R) {
        const int *grp = d->order + g0;
        const int m0 = n_items - g0 < g->R ? n_items - g0 : g->R;
        for (int r = 0; r < m0 && !st; r++) /* each slot's last row: the chain's first hidden input */
            st = b->ops->copy(b, g->lr + r * H, g->last + (int64_t)it[grp[r]].slot * H, sizeof(float) * (size_t)H, err);
        if (st || (st = dev_head(d, g->lr, m0, err)) || (st = dev_pick(d, m0, it, grp, err))) return st;
        pick_job pj = {d, it, grp, 0};
        eg_pool_for(d->pool, m0, 1, pick_rows, &pj);
        for (int j = 1; j < it[grp[0]].k; j++) {
            int m = 0;
            while (m < m0 && it[grp[m]].k > j) m++;
            const float *prev = j == 1 ? g->lr : g->out;
            if ((st = d->norm_output ? b->ops->rmsnorm(b, prev, &g->norm, m, d->H, d->eps, g->hid, err)
                                     : b->ops->copy(b, g->hid, prev, sizeof(float) * (size_t)(m * H), err)))
                return st;
            for (int r = 0; r < m; r++) {
                const eg_draft_propose *p = &it[grp[r]];
                dev_embed_stage(d, &p->draft[j - 1], 1, r);
                g->h_slot[r] = p->slot;
                g->h_pos[r] = L0[grp[r]] + j - 1;
            }
            if ((st = dev_embed_put(d, m, err)) || (st = dev_layer(d, m, err)) || (st = dev_head(d, g->out, m, err)) ||
                (st = dev_pick(d, m, it, grp, err)))
                return st;
            pj.j = j;
            eg_pool_for(d->pool, m, 1, pick_rows, &pj);
        }
    }
    return st;
}

static void dev_free(e3_dev *g) {
    if (!g) return;
    if (g->be) {
        eg_backend *b = g->be;
        eg_error e = {0};
        (void)eg_backend_bind(b, &e);
        eg_weight *ws[] = {&g->fc, &g->in_norm, &g->hid_norm, &g->wq, &g->wk, &g->wv, &g->wo, &g->post_norm,
                           &g->wg, &g->wu, &g->wd, &g->norm, &g->lm_head, &g->input_norm, &g->q_a, &g->q_a_norm,
                           &g->q_b, &g->q_full, &g->kv_a, &g->kv_a_norm, &g->kv_b};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]->data) b->ops->weight_release(b, ws[i]);
        for (int i = 0; g->fcn && i < g->n_fcn; i++)
            if (g->fcn[i].data) b->ops->weight_release(b, &g->fcn[i]);
        void *bufs[] = {g->kc, g->vc, g->table, g->last, g->inv_freq, g->pos, g->slot, g->emb, g->aux, g->hid,
                        g->ne, g->nh, g->cat, g->q, g->k, g->v, g->att, g->x, g->y, g->out, g->logits, g->auxn,
                        g->qa, g->qan, g->kvb, g->fa, g->fb, g->lr};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) b->ops->release(b, bufs[i]);
        eg_backend_free(b);
    }
    free(g->h_emb);
    free(g->h_pos);
    free(g->h_slot);
    free(g->h_end);
    free(g->k_how); free(g->k_at); free(g->k_sp); free(g->k_greedy); free(g->k_rows); free(g->k_n); free(g->k_am);
    free(g->k_rng); free(g->k_id); free(g->k_p);
    free(g->fcn);
    free(g);
}

static eg_status dev_upload(e3 *d, const dw *w, const char *name, eg_weight *out, eg_error *err) {
    eg_weight h;
    memset(&h, 0, sizeof h);
    h.fmt = w->dt == EG_ST_BF16 ? EG_W_BF16 : w->dt == EG_ST_F16 ? EG_W_F16 : EG_W_F32;
    h.rows = w->rows;
    h.cols = w->cols;
    h.data = w->data;
    h.name = name;
    return d->dev->be->ops->weight_upload(d->dev->be, &h, out, err);
}

/* A config shaped like the drafter's layer, so the backend's scratch covers its products:
 * widest input n_aux*Ht / 2H / NH*HD in q_lora_rank (the field only sizes scratch here),
 * the MLP width in inter, the draft vocabulary as vocab. MLA: the layer's own DeepSeek
 * config, whose head and latent dims the backend's mla_attention op reads (q_lora_rank
 * then only sizes scratch, as above). */
static eg_status dev_config(const e3 *d, eg_config *out, eg_error *err) {
    eg_config c;
    memset(&c, 0, sizeof c);
    if (d->mla) {
        c = d->mcfg;
        c.n_eos = 0;
        c.eos_ids = NULL;
    }
    snprintf(c.model_type, sizeof c.model_type, "eagle3_drafter");
    const int64_t wide = (int64_t)d->n_aux * d->Ht > 2 * (int64_t)d->H ? (int64_t)d->n_aux * d->Ht : 2 * (int64_t)d->H;
    const int64_t qd = d->mla ? (int64_t)d->NH * (d->DN + d->DR > d->DV ? d->DN + d->DR : d->DV)
                              : (int64_t)d->NH * d->HD;
    if ((wide > qd ? wide : qd) > (1 << 30) || (int64_t)d->QL > (1 << 30))
        return eg_fail(err, EG_ERR_UNSUPPORTED, "eagle3 drafter: %lld input columns", (long long)wide);
    c.hidden = d->H;
    c.n_layers = 1;
    c.n_heads = d->NH;
    c.q_lora_rank = (int)(wide > qd ? wide : qd);
    if (d->QL > c.q_lora_rank) c.q_lora_rank = d->QL;
    c.inter = d->I;
    c.vocab = d->Vd;
    c.rms_eps = d->eps;
    c.rope_theta = d->theta;
    c.max_pos = d->T;
    *out = c;
    return EG_OK;
}

/* The backend path's buffers for R rows per pass, in bytes (dev_create allocates these,
 * in this order, into dev_buffer_ptrs' pointers). */
enum { E3_DEV_BUFS = 28 };
static void dev_buffer_sizes(const e3 *d, int64_t R, size_t *sz) {
    const int64_t H = d->H, row = d->mla ? (int64_t)d->C + d->DR : (int64_t)d->NKV * d->HD,
                  cache = d->n_blocks * d->BS * row, vcache = d->mla ? 1 : cache, half = d->mla ? d->DR / 2 : d->HD / 2,
                  kvw = d->mla ? 1 : row;
    const int64_t qd = d->mla ? (int64_t)d->NH * (d->DN + d->DR > d->DV ? d->DN + d->DR : d->DV)
                              : (int64_t)d->NH * d->HD;
    const size_t v[E3_DEV_BUFS] = {
        2 * (size_t)cache, 2 * (size_t)vcache, 4 * (size_t)d->S * (size_t)d->MB, 4 * (size_t)(d->S * H),
        4 * (size_t)half, d->mla && d->QL ? 4 * (size_t)(R * d->QL) : 4, d->mla && d->QL ? 4 * (size_t)(R * d->QL) : 4,
        d->mla ? 4 * (size_t)(R * row) : 4, 4 * (size_t)R, 4 * (size_t)R, 4 * (size_t)(R * H),
        4 * (size_t)(R * d->n_aux * d->Ht), 4 * (size_t)(R * H), 4 * (size_t)(R * H), 4 * (size_t)(R * H),
        4 * (size_t)(R * 2 * H), 4 * (size_t)(R * qd), 4 * (size_t)(R * kvw), 4 * (size_t)(R * kvw),
        4 * (size_t)(R * qd), 4 * (size_t)(R * H), 4 * (size_t)(R * H), 4 * (size_t)(R * H),
        4 * (size_t)(R * d->Vd), 4 * (size_t)(R * H),
        d->norm_before_fc || d->fc_norm ? 4 * (size_t)(R * d->n_aux * d->Ht) : 4,
        d->fc_norm ? 4 * (size_t)(R * d->Ht) : 4, d->fc_norm ? 4 * (size_t)(R * d->Ht) : 4};
    memcpy(sz, v, sizeof v);
}
static void dev_buffer_ptrs(e3_dev *g, void ***p) {
    void **v[E3_DEV_BUFS] = {(void **)&g->kc, (void **)&g->vc, (void **)&g->table, (void **)&g->last,
                             (void **)&g->inv_freq, (void **)&g->qa, (void **)&g->qan, (void **)&g->kvb,
                             (void **)&g->pos, (void **)&g->slot, (void **)&g->emb, (void **)&g->aux,
                             (void **)&g->hid, (void **)&g->ne, (void **)&g->nh, (void **)&g->cat, (void **)&g->q,
                             (void **)&g->k, (void **)&g->v, (void **)&g->att, (void **)&g->x, (void **)&g->y,
                             (void **)&g->out, (void **)&g->logits, (void **)&g->lr, (void **)&g->auxn,
                             (void **)&g->fa, (void **)&g->fb};
    memcpy(p, v, sizeof v);
}

int64_t eg_drafter_eagle3_device_bytes(const eg_drafter *dr, int rows) {
    const e3 *d = dr->impl;
    const int64_t R = rows > 0 ? rows : 64;
    size_t sz[E3_DEV_BUFS];
    dev_buffer_sizes(d, R, sz);
    int64_t b = 0;
    for (int i = 2; i < E3_DEV_BUFS; i++) b += (int64_t)sz[i]; /* not the caches: state_bytes counts them */
    eg_config c;
    eg_error e = {0};
    if (dev_config(d, &c, &e)) return b;
    eg_backend_opts bo = {.name = "cuda", .max_tokens = (int)R, .max_seq_len = d->T};
    return b + eg_cuda_scratch_bytes(&c, &bo);
}

/* Create the backend and move the weights and state there. */
static eg_status dev_create(e3 *d, const eg_eagle3_opts *opts, eg_error *err) {
    const char *name = opts->backend;
    if (strcmp(name, "cpu") && strcmp(name, "cuda"))
        return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: backend \"%s\" (expected \"cpu\" or \"cuda\")", name);
    if (opts->max_rows < 0 || opts->device < 0 || opts->kept_cap < 0)
        return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: max_rows %d / device %d / kept_cap %d", opts->max_rows,
                       opts->device, opts->kept_cap);
    e3_dev *g = eg_calloc(1, sizeof *g, err);
    if (!g) return EG_ERR_NOMEM;
    d->dev = g;
    g->R = opts->max_rows ? opts->max_rows : 64;
    eg_config c;
    eg_status st = dev_config(d, &c, err);
    if (st) return st;
    eg_backend_opts bo = {.name = name, .max_tokens = g->R, .max_seq_len = d->T, .nthreads = opts->threads,
                          .device = opts->device};
    st = eg_backend_create(&c, &bo, &g->be, err);
    if (st) return st;
    eg_backend *b = g->be;
    if (!b->ops->gqa_attention || !b->ops->copy_rows || !b->ops->mla_attention)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "eagle3 drafter: backend %s has no gqa/mla_attention or copy_rows", name);
    if ((st = dev_upload(d, &d->fc, "fc.weight", &g->fc, err)) ||
        (st = dev_upload(d, &d->in_norm, "midlayer.input_layernorm.weight", &g->in_norm, err)) ||
        (st = dev_upload(d, &d->hid_norm, "midlayer.hidden_norm.weight", &g->hid_norm, err)) ||
        (!d->mla && ((st = dev_upload(d, &d->wq, "midlayer.self_attn.q_proj.weight", &g->wq, err)) ||
                     (st = dev_upload(d, &d->wk, "midlayer.self_attn.k_proj.weight", &g->wk, err)) ||
                     (st = dev_upload(d, &d->wv, "midlayer.self_attn.v_proj.weight", &g->wv, err)))) ||
        (d->mla && d->QL &&
         ((st = dev_upload(d, &d->q_a, "midlayer.self_attn.q_a_proj.weight", &g->q_a, err)) ||
          (st = dev_upload(d, &d->q_a_norm, "midlayer.self_attn.q_a_layernorm.weight", &g->q_a_norm, err)) ||
          (st = dev_upload(d, &d->q_b, "midlayer.self_attn.q_b_proj.weight", &g->q_b, err)))) ||
        (d->mla && !d->QL && (st = dev_upload(d, &d->q_full, "midlayer.self_attn.q_proj.weight", &g->q_full, err))) ||
        (d->mla &&
         ((st = dev_upload(d, &d->kv_a, "midlayer.self_attn.kv_a_proj_with_mqa.weight", &g->kv_a, err)) ||
          (st = dev_upload(d, &d->kv_a_norm, "midlayer.self_attn.kv_a_layernorm.weight", &g->kv_a_norm, err)) ||
          (st = dev_upload(d, &d->kv_b, "midlayer.self_attn.kv_b_proj.weight", &g->kv_b, err)))) ||
        (st = dev_upload(d, &d->wo, "midlayer.self_attn.o_proj.weight", &g->wo, err)) ||
        (st = dev_upload(d, &d->post_norm, "midlayer.post_attention_layernorm.weight", &g->post_norm, err)) ||
        (st = dev_upload(d, &d->wg, "midlayer.mlp.gate_proj.weight", &g->wg, err)) ||
        (st = dev_upload(d, &d->wu, "midlayer.mlp.up_proj.weight", &g->wu, err)) ||
        (st = dev_upload(d, &d->wd, "midlayer.mlp.down_proj.weight", &g->wd, err)) ||
        (st = dev_upload(d, &d->norm, "norm.weight", &g->norm, err)) ||
        (st = dev_upload(d, &d->lm_head, "lm_head.weight", &g->lm_head, err)) ||
        (d->norm_before_fc && (st = dev_upload(d, &d->input_norm, "input_norm.weight", &g->input_norm, err))))
        return st;
    if (d->fc_norm) {
        if (!(g->fcn = eg_calloc((size_t)d->n_aux, sizeof *g->fcn, err))) return EG_ERR_NOMEM;
        g->n_fcn = d->n_aux;
        for (int i = 0; i < d->n_aux; i++)
            if ((st = dev_upload(d, &d->fcn[i], "fc_norm.weight", &g->fcn[i], err))) return st;
    }
    /* the cache: K and V rows of NKV * HD, or one latent row of C + DR (MLA); the rows of a pass */
    const int64_t R = g->R, H = d->H, row = d->mla ? (int64_t)d->C + d->DR : (int64_t)d->NKV * d->HD,
                  cache = d->n_blocks * d->BS * row, vcache = d->mla ? 1 : cache, half = d->mla ? d->DR / 2 : d->HD / 2;
    size_t sz[E3_DEV_BUFS];
    void **ptr[E3_DEV_BUFS];
    dev_buffer_sizes(d, R, sz);
    dev_buffer_ptrs(g, ptr);
    for (int i = 0; i < E3_DEV_BUFS; i++)
        if ((st = b->ops->alloc(b, sz[i], ptr[i], err))) return st;
    g->h_emb = eg_malloc(sizeof(float) * (size_t)(R * H), err);
    g->h_pos = eg_malloc(sizeof(int32_t) * (size_t)R, err);
    g->h_slot = eg_malloc(sizeof(int32_t) * (size_t)R, err);
    g->h_end = eg_malloc((size_t)R, err);
    d->mlogits = eg_malloc(sizeof(float) * (size_t)(R * d->Vd), err);
    if (!g->h_emb || !g->h_pos || !g->h_slot || !g->h_end || !d->mlogits) return EG_ERR_NOMEM;
    /* the draws' reductions on the backend (opts.backend_draws) */
    const int bd = opts->backend_draws;
    if (b->ops->kept_probs && (bd > 0 || (bd == 0 && strcmp(b->ops->name, "cpu") != 0)))
        g->kcap = d->Vd < EG_KEPT_CAP ? d->Vd : EG_KEPT_CAP;
    if (g->kcap && opts->kept_cap > 0 && opts->kept_cap < g->kcap) g->kcap = opts->kept_cap;
    const size_t kc = (size_t)R * (size_t)(g->kcap > 0 ? g->kcap : 1);
    g->k_how = eg_calloc((size_t)R, sizeof *g->k_how, err);
    g->k_at = eg_calloc((size_t)R, sizeof *g->k_at, err);
    g->k_sp = eg_calloc((size_t)R, sizeof *g->k_sp, err);
    g->k_greedy = eg_calloc((size_t)R, sizeof *g->k_greedy, err);
    g->k_rows = eg_calloc((size_t)R, sizeof *g->k_rows, err);
    g->k_n = eg_calloc((size_t)R, sizeof *g->k_n, err);
    g->k_am = eg_calloc((size_t)R, sizeof *g->k_am, err);
    g->k_rng = eg_calloc((size_t)R, sizeof *g->k_rng, err);
    g->k_id = eg_calloc(kc, sizeof *g->k_id, err);
    g->k_p = eg_calloc(kc, sizeof *g->k_p, err);
    if (!g->k_how || !g->k_at || !g->k_sp || !g->k_greedy || !g->k_rows || !g->k_n || !g->k_am || !g->k_rng ||
        !g->k_id || !g->k_p)
        return EG_ERR_NOMEM;
    for (int64_t r = 0; r < R; r++) g->k_greedy[r] = (eg_sample_params){0.0f, 1.0f, 0};
    if ((st = b->ops->to_device(b, g->inv_freq, d->inv_freq, sizeof(float) * (size_t)half, err)) ||
        (st = b->ops->memset0(b, g->kc, 2 * (size_t)cache, err)) ||
        (st = b->ops->memset0(b, g->vc, 2 * (size_t)vcache, err)))
        return st;
    for (int s = 0; s < d->S; s++) d->dirty[s] = 1; /* every row is written before its first use */
    return b->ops->sync(b, err);
}

/* ------------------------------------------------------------------ vtable */

/* An extend's arguments are valid: then its blocks are mapped. */
static eg_status extend_check(e3 *d, const eg_draft_extend *x, eg_error *err) {
    const int slot = x->slot, pos0 = x->pos0, n = x->n;
    if (slot < 0 || slot >= d->S) return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: slot %d outside [0, %d)", slot, d->S);
    if (pos0 != d->len[slot])
        return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: extend of slot %d at position %d, but its length is %d",
                       slot, pos0, d->len[slot]);
    if (n < 0 || (int64_t)pos0 + n > d->T)
        return eg_fail(err, EG_ERR_INVALID,
                       "eagle3 drafter: extend of slot %d by %d positions from %d passes max_seq_len %d", slot, n, pos0,
                       d->T);
    if (n == 0) return EG_OK;
    if (!x->aux || !x->next_tokens) return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: extend needs aux rows and next tokens");
    for (int t = 0; t < n; t++)
        if (x->next_tokens[t] < 0 || x->next_tokens[t] >= d->V)
            return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: slot %d position %d: next token %d outside [0, %d)",
                           slot, pos0 + t, x->next_tokens[t], d->V);
    return cache_map(d, slot, (int64_t)pos0 + n, err);
}

/* A batch's slots are distinct (d->mark is clear on return). */
static eg_status slots_distinct(e3 *d, int n, const int *slot_of, size_t stride, const char *what, eg_error *err) {
    eg_status st = EG_OK;
    int i = 0;
    for (; i < n; i++) {
        int s = *(const int *)((const char *)slot_of + (size_t)i * stride);
        if (s < 0 || s >= d->S) { st = eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: slot %d outside [0, %d)", s, d->S); break; }
        if (d->mark[s]) { st = eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: slot %d twice in one %s", s, what); break; }
        d->mark[s] = 1;
    }
    for (int j = 0; j < i; j++) d->mark[*(const int *)((const char *)slot_of + (size_t)j * stride)] = 0;
    return st;
}

static eg_status e3_extend_many(eg_drafter *dr, int n_items, const eg_draft_extend *it, eg_error *err) {
    e3 *d = dr->impl;
    const int64_t arow = (int64_t)d->n_aux * d->Ht;
    eg_status st = slots_distinct(d, n_items, &it[0].slot, sizeof *it, "extend", err);
    for (int i = 0; !st && i < n_items; i++) st = extend_check(d, &it[i], err);
    if (st) return st;
    if (d->dev) {
        for (int i = 0; i < n_items; i++)
            if (it[i].n) d->last_pos[it[i].slot] = -1; /* until the backend's rows are in */
        if ((st = dev_extend_many(d, n_items, it, err))) return st;
    } else {
        for (int i = 0; i < n_items; i++) {
            const int slot = it[i].slot, pos0 = it[i].pos0;
            for (int t = 0; t < it[i].n; t++) {
                embed_row(d, it[i].next_tokens[t], d->emb);
                const float *a = it[i].aux + t * arow;
                if (d->norm_before_fc) rmsnorm(a, &d->input_norm, (int)arow, d->eps, d->auxn);
                for (int c = 0; d->fc_norm && c < d->n_aux; c++) /* in place on auxn: each chunk read before written */
                    rmsnorm((d->norm_before_fc ? d->auxn : a) + (int64_t)c * d->Ht, &d->fcn[c], d->Ht, d->eps,
                            d->auxn + (int64_t)c * d->Ht);
                matvec(d, &d->fc, d->norm_before_fc || d->fc_norm ? d->auxn : a, d->hid);
                layer(d, slot, pos0 + t);
            }
            if (it[i].n) memcpy(d->last + (int64_t)slot * d->H, d->out, sizeof(float) * (size_t)d->H);
        }
    }
    for (int i = 0; i < n_items; i++)
        if (it[i].n) {
            d->last_pos[it[i].slot] = it[i].pos0 + it[i].n - 1;
            d->len[it[i].slot] = it[i].pos0 + it[i].n;
        }
    return EG_OK;
}

static eg_status e3_extend(eg_drafter *dr, int slot, int pos0, int n, const float *aux, const int32_t *next,
                           eg_error *err) {
    eg_draft_extend x = {slot, pos0, n, aux, next};
    return e3_extend_many(dr, 1, &x, err);
}

/* Draw one draft from logits [Vd] with the sampling parameters; fills row qi of q when
 * q != NULL (its positive entries, ascending target ids). Returns the target id. */
static int32_t pick(const e3 *d, pick_scr *ps, const float *logits, const eg_sample_params *sp, uint64_t *rng,
                    eg_spec_q *q, int qi) {
    const int greedy = !(sp->temperature > 0.0f);
    int32_t *qid = q ? q->id + (int64_t)qi * q->cap : NULL;
    double *qp = q ? q->p + (int64_t)qi * q->cap : NULL;
    int32_t tid;
    int n = 0;
    if (greedy) {
        int best = 0;
        for (int i = 1; i < d->Vd; i++)
            if (logits[i] > logits[best]) best = i;
        return pick_greedy(d, best, q, qi);
    }
    if (d->monotone) {
        eg_spec_probs(ps->sc, logits, d->Vd, sp, ps->pd);
        int32_t di = eg_spec_draw(ps->pd, d->Vd, rng);
        tid = (int32_t)(di + d->d2t[di]);
        for (int i = 0; q && i < d->Vd; i++) /* draft-index order is target-id order */
            if (ps->pd[i] > 0) {
                qid[n] = (int32_t)(i + d->d2t[i]);
                qp[n++] = ps->pd[i];
            }
        if (q) q->n[qi] = n;
        return tid;
    }
    for (int i = 0; i < d->V; i++) ps->logits_t[i] = -INFINITY;
    for (int i = 0; i < d->Vd; i++) ps->logits_t[i + d->d2t[i]] = logits[i];
    eg_spec_probs(ps->sc, ps->logits_t, d->V, sp, ps->pt);
    tid = eg_spec_draw(ps->pt, d->V, rng);
    for (int t = 0; q && t < d->V; t++)
        if (ps->pt[t] > 0) {
            qid[n] = t;
            qp[n++] = ps->pt[t];
        }
    if (q) q->n[qi] = n;
    return tid;
}

/* A propose's arguments are valid: then the chain's k - 1 positions are mapped and *L0
 * is the slot's committed length. */
static eg_status propose_check(e3 *d, const eg_draft_propose *p, int *L0, eg_error *err) {
    const int slot = p->slot, k = p->k;
    if (slot < 0 || slot >= d->S) return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: slot %d outside [0, %d)", slot, d->S);
    if (k < 1) return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: propose of %d tokens", k);
    if (p->q && p->q->cap < d->base.info.q_cap)
        return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: q rows of %d ids for a draft vocabulary of %d", p->q->cap,
                       d->base.info.q_cap);
    *L0 = d->len[slot];
    if (p->n_seq - 1 != *L0)
        return eg_fail(err, EG_ERR_INVALID,
                       "eagle3 drafter: propose for slot %d with %d committed tokens, but the slot holds %d positions "
                       "(expected n_seq - 1)", slot, p->n_seq, *L0);
    if (*L0 < 1 || d->last_pos[slot] != *L0 - 1)
        return eg_fail(err, EG_ERR_INVALID,
                       "eagle3 drafter: slot %d has no hidden state for its last position %d: extend it first", slot,
                       *L0 - 1);
    if ((int64_t)*L0 + k - 1 > d->T)
        return eg_fail(err, EG_ERR_INVALID,
                       "eagle3 drafter: %d drafts after %d positions of slot %d pass max_seq_len %d", k, *L0, slot, d->T);
    return cache_map(d, slot, (int64_t)*L0 + k - 1, err); /* the chain's k - 1 positions */
}

/* The own path's chain for one slot. */
static void own_propose(e3 *d, const eg_draft_propose *p, int L0) {
    const float *h = d->last + (int64_t)p->slot * d->H;
    head(d, h);
    p->draft[0] = pick(d, &d->ps[0], d->logits, p->sp, p->rng, p->q, 0);
    for (int i = 1; i < p->k; i++) {
        /* chained: the previous step's pre-norm output as the hidden input (no fc; with
         * norm_output its final-normed form), the previous draft's embedding, at the next
         * position */
        if (d->norm_output) rmsnorm(i == 1 ? h : d->out, &d->norm, d->H, d->eps, d->hid);
        else memcpy(d->hid, i == 1 ? h : d->out, sizeof(float) * (size_t)d->H);
        embed_row(d, p->draft[i - 1], d->emb);
        layer(d, p->slot, L0 + i - 1);
        head(d, d->out);
        p->draft[i] = pick(d, &d->ps[0], d->logits, p->sp, p->rng, p->q, i);
    }
}

static eg_status e3_propose_many(eg_drafter *dr, int n_items, const eg_draft_propose *it, eg_error *err) {
    e3 *d = dr->impl;
    eg_status st = slots_distinct(d, n_items, &it[0].slot, sizeof *it, "propose", err);
    int *L0 = d->order + d->S; /* [n] beside the order */
    for (int i = 0; !st && i < n_items; i++) st = propose_check(d, &it[i], &L0[i], err);
    if (st) return st;
    if (d->dev) {
        /* the order: k descending, ties in item order (insertion sort: n is a batch's slots) */
        for (int i = 0; i < n_items; i++) {
            int j = i;
            for (; j > 0 && it[d->order[j - 1]].k < it[i].k; j--) d->order[j] = d->order[j - 1];
            d->order[j] = i;
        }
        if ((st = dev_propose_many(d, n_items, it, L0, err))) return st;
    } else {
        for (int i = 0; i < n_items; i++) own_propose(d, &it[i], L0[i]);
    }
    for (int i = 0; i < n_items; i++) d->len[it[i].slot] = L0[i] + it[i].k - 1; /* speculative; the caller truncates */
    return EG_OK;
}

static eg_status e3_propose(eg_drafter *dr, int slot, const int32_t *seq, int n_seq, int k, const eg_sample_params *sp,
                            uint64_t *rng, int32_t *draft, eg_spec_q *q, eg_error *err) {
    eg_draft_propose p = {slot, seq, n_seq, k, sp, rng, draft, q};
    return e3_propose_many(dr, 1, &p, err);
}

static void e3_truncate(eg_drafter *dr, int slot, int len) {
    e3 *d = dr->impl;
    EG_ASSERT(slot >= 0 && slot < d->S);
    EG_ASSERT(len >= 0 && len <= d->len[slot]);
    d->len[slot] = len;
    if (d->last_pos[slot] >= len) d->last_pos[slot] = -1;
    cache_unmap(d, slot, len);
}

static void e3_destroy(eg_drafter *dr) {
    e3 *d = dr->impl;
    for (int i = 0; i < d->n_files; i++) eg_st_close(d->files[i]);
    free(d->files);
    free(d->aux_buf);
    free(d->d2t);
    free(d->inv_freq);
    free(d->kc);
    free(d->vc);
    free(d->table);
    free(d->n_mapped);
    free(d->free_list);
    free(d->dirty);
    free(d->last);
    free(d->len);
    free(d->last_pos);
    free(d->auxn);
    free(d->fcn);
    float *bufs[] = {d->emb, d->hid, d->res, d->cat, d->q, d->k, d->v, d->att, d->x, d->y, d->g, d->u, d->out,
                     d->scores, d->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    for (int t = 0; d->ps && t < d->n_ps; t++) {
        eg_spec_scratch_free(d->ps[t].sc);
        free(d->ps[t].pd);
        free(d->ps[t].pt);
        free(d->ps[t].logits_t);
    }
    free(d->ps);
    free(d->mlogits);
    free(d->order);
    free(d->mark);
    eg_pool_free(d->pool);
    dev_free(d->dev);
    eg_config_free(&d->mcfg);
    free(d);
}

static const eg_drafter_vtbl e3_vt = {e3_extend, e3_propose, e3_truncate, e3_destroy, e3_extend_many, e3_propose_many};

/* ------------------------------------------------------------------ accessors */

int eg_drafter_eagle3_draft_vocab(const eg_drafter *d) { return ((const e3 *)d->impl)->Vd; }
const int64_t *eg_drafter_eagle3_d2t(const eg_drafter *d) { return ((const e3 *)d->impl)->d2t; }
const float *eg_drafter_eagle3_last_logits(const eg_drafter *d) {
    e3 *x = d->impl;
    if (x->have_logits == 2) { /* still on the backend (dev_head): fetched once, now */
        eg_backend *b = x->dev->be;
        eg_error e = {0};
        if (eg_backend_bind(b, &e) ||
            b->ops->to_host(b, x->logits, x->dev->logits + (int64_t)(x->dev_rows - 1) * x->Vd,
                            sizeof(float) * (size_t)x->Vd, &e) ||
            b->ops->sync(b, &e))
            return NULL;
        x->have_logits = 1;
    }
    return x->have_logits ? x->logits : NULL;
}

const char *eg_drafter_eagle3_aux_source(const eg_drafter *d) { return ((const e3 *)d->impl)->aux_source; }
const char *eg_drafter_eagle3_backend(const eg_drafter *d) {
    const e3 *x = d->impl;
    return x->dev ? x->dev->be->ops->name : NULL;
}
int eg_drafter_eagle3_slot_len(const eg_drafter *d, int slot) {
    const e3 *x = d->impl;
    EG_ASSERT(slot >= 0 && slot < x->S);
    return x->len[slot];
}

/* ------------------------------------------------------------------ config */

static eg_status cfg_int(json_t *root, const char *path, const char *key, int required, int def, int lo, int *out,
                         eg_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return eg_fail(err, EG_ERR_CONFIG, "%s: missing \"%s\"", path, key);
        *out = def;
        return EG_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > (1 << 30))
        return eg_fail(err, EG_ERR_CONFIG, "%s: \"%s\" must be an integer >= %d", path, key, lo);
    *out = (int)json_integer_value(v);
    return EG_OK;
}

static eg_status cfg_num(json_t *root, const char *path, const char *key, double def, double *out, eg_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return EG_OK;
    }
    if (!json_is_number(v)) return eg_fail(err, EG_ERR_CONFIG, "%s: \"%s\" must be a number", path, key);
    *out = json_number_value(v);
    return EG_OK;
}

static eg_status cfg_bool(json_t *root, const char *path, const char *key, int *out, eg_error *err) {
    json_t *v = json_object_get(root, key);
    *out = 0;
    if (!v || json_is_null(v)) return EG_OK;
    if (!json_is_boolean(v)) return eg_fail(err, EG_ERR_CONFIG, "%s: \"%s\" must be a boolean", path, key);
    *out = json_is_true(v);
    return EG_OK;
}

static eg_status cfg_false(json_t *root, const char *path, const char *key, eg_error *err) {
    json_t *v = json_object_get(root, key);
    if (v && !json_is_null(v) && !json_is_false(v))
        return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: \"%s\" is set; the eagle3 drafter supports only %s false", path,
                       key, key);
    return EG_OK;
}

/* aux ids -> eaglegen convention into d->aux_buf. speculators: 1 speculators' layout, 2
 * vLLM's MLA layout (both count as vLLM does), 0 SpecForge's. */
static eg_status read_aux(e3 *d, json_t *root, const char *path, const eg_eagle3_opts *o, int speculators,
                          eg_error *err) {
    json_t *ec = json_object_get(root, "eagle_config");
    if (ec && !json_is_object(ec)) return eg_fail(err, EG_ERR_CONFIG, "%s: \"eagle_config\" must be an object", path);
    json_t *a_in = ec ? json_object_get(ec, "eagle_aux_hidden_state_layer_ids") : NULL;
    json_t *a_top = json_object_get(root, "eagle_aux_hidden_state_layer_ids");
    if (a_in && json_is_null(a_in)) a_in = NULL;
    if (a_top && json_is_null(a_top)) a_top = NULL;
    if (a_in && a_top && !json_equal(a_in, a_top))
        return eg_fail(err, EG_ERR_CONFIG,
                       "%s: eagle_config.eagle_aux_hidden_state_layer_ids and the top-level "
                       "eagle_aux_hidden_state_layer_ids differ",
                       path);
    json_t *a = a_in ? a_in : a_top;
    if (ec) {
        json_t *u = json_object_get(ec, "use_aux_hidden_state");
        if (u && json_is_false(u))
            return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: eagle_config.use_aux_hidden_state false is not supported", path);
    }
    if (!a) {
        /* No ids pinned (TorchSpec's Kimi-K2.5 drafter config, for one): vLLM and SGLang then
         * hand the drafter the target's default set, captured before layers [2, L/2, L-3],
         * i.e. the outputs of layers [1, L/2-1, L-4], which is eaglegen's default. A wrong
         * guess could only lower acceptance: the target verifies every token. */
        int def[3], nd = eg_config_default_aux_layers(d->tcfg, def);
        d->n_aux = nd;
        d->aux_buf = eg_malloc(sizeof(int) * (size_t)nd, err);
        if (!d->aux_buf) return EG_ERR_NOMEM;
        memcpy(d->aux_buf, def, sizeof(int) * (size_t)nd);
        d->aux_source = "none pinned in the config: the serving engines' default, outputs of layers [1, L/2-1, L-4]";
        return EG_OK;
    }
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    if (n == 0) return eg_fail(err, EG_ERR_CONFIG, "%s: eagle_aux_hidden_state_layer_ids must be a non-empty array", path);
    d->n_aux = (int)n;
    d->aux_buf = eg_malloc(sizeof(int) * n, err);
    if (!d->aux_buf) return EG_ERR_NOMEM;
    char list[256];
    size_t ll = 0;
    list[0] = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 20))
            return eg_fail(err, EG_ERR_CONFIG, "%s: eagle_aux_hidden_state_layer_ids[%zu] is not a layer id", path, i);
        d->aux_buf[i] = (int)json_integer_value(v);
        if (i > 0 && d->aux_buf[i] <= d->aux_buf[i - 1])
            return eg_fail(err, EG_ERR_CONFIG,
                           "%s: eagle_aux_hidden_state_layer_ids must be ascending and distinct (serving engines hand "
                           "the drafter its aux states in ascending layer order)",
                           path);
        if (ll < sizeof list - 16) ll += (size_t)snprintf(list + ll, sizeof list - ll, "%s%d", i ? ", " : "", d->aux_buf[i]);
    }
    eg_aux_convention conv = o->aux_convention;
    const char *why = "the caller's choice";
    json_t *cv = ec ? json_object_get(ec, "eaglegen_aux_convention") : NULL;
    if (cv && !json_is_null(cv)) {
        const char *s = json_is_string(cv) ? json_string_value(cv) : "";
        eg_aux_convention c2 = !strcmp(s, "output_of_layer")    ? EG_AUX_CONV_OUTPUT_OF_LAYER
                               : !strcmp(s, "hf_hidden_states") ? EG_AUX_CONV_HF_INDEX
                                                                : EG_AUX_CONV_AUTO;
        if (c2 == EG_AUX_CONV_AUTO)
            return eg_fail(err, EG_ERR_CONFIG,
                           "%s: eagle_config.eaglegen_aux_convention must be \"output_of_layer\" or \"hf_hidden_states\"",
                           path);
        if (conv != EG_AUX_CONV_AUTO && conv != c2)
            return eg_fail(err, EG_ERR_CONFIG, "%s: eagle_config.eaglegen_aux_convention \"%s\" contradicts the convention asked for",
                           path, s);
        conv = c2;
        why = "eagle_config.eaglegen_aux_convention";
    }
    const int L = d->L_target;
    if (conv == EG_AUX_CONV_AUTO && speculators) {
        /* speculators counts as vLLM does: the state entering decoder layer k + 1; vLLM's
           MLA drafter layout runs only there */
        conv = EG_AUX_CONV_HF_INDEX;
        why = speculators == 2 ? "vLLM's convention, the only engine running its MLA drafter layout (hidden_states "
                                 "index: output of layer k is k + 1)"
                               : "speculators' convention (vLLM hidden_states index: output of layer k is k + 1)";
    }
    if (conv == EG_AUX_CONV_AUTO) {
        /* the default set [1, L/2-1, L-4] (deduplicated for tiny models, as generate's
         * default), and the same layers counted as hidden-states indices */
        int def[3], nd = eg_config_default_aux_layers(d->tcfg, def);
        int is_def = (size_t)nd == n, is_hf = (size_t)nd == n;
        for (int i = 0; i < nd && (size_t)i < n; i++) {
            is_def &= d->aux_buf[i] == def[i];
            is_hf &= d->aux_buf[i] == def[i] + 1;
        }
        if (is_def) conv = EG_AUX_CONV_OUTPUT_OF_LAYER, why = "the output-of-layer default set [1, L/2-1, L-4]";
        else if (is_hf) conv = EG_AUX_CONV_HF_INDEX, why = "the hidden-states-index default set [2, L/2, L-3]";
        else
            return eg_fail(err, EG_ERR_CONFIG,
                           "%s: eagle_aux_hidden_state_layer_ids [%s] is ambiguous for a %d-layer target: SpecForge/SGLang "
                           "count the output of decoder layer k as k, vLLM/speculators as k+1; say which (eagle_config."
                           "eaglegen_aux_convention \"output_of_layer\" or \"hf_hidden_states\")",
                           path, list, L);
    }
    d->aux_source = why;
    for (int i = 0; i < d->n_aux; i++) {
        int v = d->aux_buf[i];
        if (conv == EG_AUX_CONV_HF_INDEX) {
            if (v == 0)
                return eg_fail(err, EG_ERR_UNSUPPORTED,
                               "%s: aux id 0 in the hidden-states convention is the embedding output, which eaglegen does "
                               "not capture",
                               path);
            v -= 1;
        }
        if (v >= L)
            return eg_fail(err, EG_ERR_CONFIG, "%s: aux layer %d (ids [%s], %s convention) is past the target's %d layers",
                           path, v, list, conv == EG_AUX_CONV_HF_INDEX ? "hidden-states" : "output-of-layer", L);
        d->aux_buf[i] = v;
    }
    return EG_OK;
}

/* vLLM's Eagle3DeepseekV2ForCausalLM (Eagle3DeepseekV3ForCausalLM): one DeepSeek decoder
 * layer whose MLA attention reads the 2H concat and whose MLP is dense; its keys are a
 * DeepSeek model's (MLA dims, YaRN RoPE), read by the target's own config parser. Only
 * vLLM runs this layout, so the aux ids count as vLLM counts (hidden-states indices). */
static eg_status parse_mla(e3 *d, json_t *root, const char *text, size_t len, const char *path,
                           const eg_eagle3_opts *o, eg_error *err) {
    eg_status st = eg_config_parse(text, len, path, &d->mcfg, err);
    if (st) return eg_wrap(err, "the MLA drafter's layer (Eagle3DeepseekV2ForCausalLM)"), st;
    const eg_config *mc = &d->mcfg, *tc = d->tcfg;
    if (mc->n_layers != 1)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: num_hidden_layers %d: the EAGLE-3 drafter has one decoder layer",
                       path, mc->n_layers);
    if (mc->n_experts > 0)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: n_routed_experts %d: the MLA drafter's layer has a dense MLP", path,
                       mc->n_experts);
    if (mc->kv_lora_rank < 1 || mc->qk_rope < 2 || mc->qk_rope % 2 || mc->qk_nope < 1 || mc->v_head < 1 ||
        mc->n_heads < 1 || mc->inter < 1)
        return eg_fail(err, EG_ERR_CONFIG,
                       "%s: an MLA layer needs kv_lora_rank, an even qk_rope_head_dim, qk_nope_head_dim, v_head_dim, "
                       "heads and intermediate_size (got %d, %d, %d, %d, %d, %d)",
                       path, mc->kv_lora_rank, mc->qk_rope, mc->qk_nope, mc->v_head, mc->n_heads, mc->inter);
    d->mla = 1;
    d->H = mc->hidden;
    d->NH = d->NKV = mc->n_heads;
    d->I = mc->inter;
    d->V = mc->vocab;
    d->QL = mc->q_lora_rank;
    d->C = mc->kv_lora_rank;
    d->DN = mc->qk_nope;
    d->DR = mc->qk_rope;
    d->DV = mc->v_head;
    d->HD = d->DN + d->DR + (d->DN + d->DR) % 2; /* sizes the own path's unused scratch */
    if ((st = cfg_int(root, path, "draft_vocab_size", 0, d->V, 1, &d->Vd, err)) ||
        (st = cfg_int(root, path, "target_hidden_size", 0, d->H, 1, &d->Ht, err)) ||
        (st = cfg_false(root, path, "attention_bias", err)) || (st = cfg_false(root, path, "mlp_bias", err)))
        return st;
    if (d->window)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: a sliding window on the MLA drafter's layer is not supported", path);
    if (d->V != tc->vocab)
        return eg_fail(err, EG_ERR_CONFIG, "%s: vocab_size %d but the target's vocabulary is %d", path, d->V, tc->vocab);
    if (d->Vd > d->V)
        return eg_fail(err, EG_ERR_CONFIG, "%s: draft_vocab_size %d exceeds vocab_size %d", path, d->Vd, d->V);
    if (d->Ht != tc->hidden)
        return eg_fail(err, EG_ERR_CONFIG, "%s: target_hidden_size %d but the target's hidden size is %d", path, d->Ht,
                       tc->hidden);
    d->eps = mc->rms_eps;
    d->theta = mc->rope_theta;
    d->attn_factor = (float)eg_config_rope_attn_factor(mc);
    d->mla_scale = (float)eg_config_softmax_scale(mc);
    json_t *nbr = json_object_get(root, "norm_before_residual");
    if (nbr && !json_is_null(nbr) && !json_is_boolean(nbr))
        return eg_fail(err, EG_ERR_CONFIG, "%s: norm_before_residual must be a boolean", path);
    d->norm_before_residual = nbr && json_is_true(nbr);
    return read_aux(d, root, path, o, 2, err);
}

static eg_status parse_config(e3 *d, const char *text, size_t len, const char *path, const eg_eagle3_opts *o,
                              eg_error *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return eg_fail(err, EG_ERR_CONFIG, "%s: %s (line %d)", path, je.text, je.line);
    eg_status st = EG_OK;
    if (!json_is_object(root)) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: not a JSON object", path);
        goto done;
    }
    json_t *ar = json_object_get(root, "architectures");
    int arch_ok = 0, spec = 0, mla = 0;
    for (size_t i = 0; json_is_array(ar) && i < json_array_size(ar); i++) {
        const char *s = json_string_value(json_array_get(ar, i));
        if (s && (!strcmp(s, "LlamaForCausalLMEagle3") || !strcmp(s, "Eagle3LlamaForCausalLM"))) arch_ok = 1;
        if (s && !strcmp(s, "Eagle3Speculator")) arch_ok = spec = 1;
        if (s && (!strcmp(s, "Eagle3DeepseekV2ForCausalLM") || !strcmp(s, "Eagle3DeepseekV3ForCausalLM")))
            arch_ok = mla = 1;
    }
    json_t *smt = json_object_get(root, "speculators_model_type");
    if (smt && !json_is_null(smt)) {
        if (!json_is_string(smt) || strcmp(json_string_value(smt), "eagle3")) {
            st = eg_fail(err, EG_ERR_UNSUPPORTED, "%s: speculators_model_type \"%s\": only \"eagle3\" is an EAGLE-3 drafter",
                         path, json_is_string(smt) ? json_string_value(smt) : "?");
            goto done;
        }
        arch_ok = spec = 1;
    }
    if (!arch_ok) {
        st = eg_fail(err, EG_ERR_UNSUPPORTED,
                     "%s: \"architectures\" must name LlamaForCausalLMEagle3 (SpecForge's EAGLE-3 Llama drafter), "
                     "Eagle3Speculator (speculators' eagle3) or Eagle3DeepseekV2ForCausalLM (vLLM's MLA drafter)", path);
        goto done;
    }
    if (mla && spec) {
        st = eg_fail(err, EG_ERR_UNSUPPORTED, "%s: an MLA drafter in speculators' layout is not supported", path);
        goto done;
    }
    /* speculators (Eagle3SpeculatorConfig): the decoder layer's Llama config nested in
       transformer_layer_config, the drafter's own keys at the top; SpecForge: all at the top */
    json_t *lc = root;
    if (spec) {
        lc = json_object_get(root, "transformer_layer_config");
        const char *mt = json_is_object(lc) ? json_string_value(json_object_get(lc, "model_type")) : NULL;
        if (!json_is_object(lc)) {
            st = eg_fail(err, EG_ERR_CONFIG, "%s: a speculators eagle3 config needs a transformer_layer_config object", path);
            goto done;
        }
        if (mt && strcmp(mt, "llama")) {
            st = eg_fail(err, EG_ERR_UNSUPPORTED, "%s: transformer_layer_config.model_type \"%s\": the eagle3 drafter runs "
                         "a Llama decoder layer (a %s layer has other norms)", path, mt, mt);
            goto done;
        }
    }
    /* speculators' variants (read in either layout: the same architecture's options): a
       norm over the concatenated aux rows before fc, the normed output fed back along the
       chain (built); a norm per aux row (refused) */
    if ((st = cfg_bool(root, path, "norm_before_fc", &d->norm_before_fc, err)) ||
        (st = cfg_bool(root, path, "norm_output", &d->norm_output, err)) ||
        (st = cfg_bool(root, path, "fc_norm", &d->fc_norm, err)))
        goto done;
    {   /* transformers' sliding window: layer_types[0] says, else use_sliding_window */
        json_t *lt = json_object_get(lc, "layer_types"), *usw = json_object_get(lc, "use_sliding_window");
        const char *t0 = json_is_array(lt) ? json_string_value(json_array_get(lt, 0)) : NULL;
        int sliding = t0 ? !strcmp(t0, "sliding_attention") : json_is_true(usw);
        if (t0 && strcmp(t0, "sliding_attention") && strcmp(t0, "full_attention")) {
            st = eg_fail(err, EG_ERR_UNSUPPORTED, "%s: %slayer_types[0] \"%s\"", path,
                         spec ? "transformer_layer_config." : "", t0);
            goto done;
        }
        if (sliding && (st = cfg_int(lc, path, "sliding_window", 1, 0, 1, &d->window, err))) goto done;
    }
    if (mla) {
        st = parse_mla(d, root, text, len, path, o, err);
        goto done;
    }
    const eg_config *tc = d->tcfg;
    int nl;
    double eps, theta;
    if ((st = cfg_int(lc, path, "hidden_size", 1, 0, 1, &d->H, err)) ||
        (st = cfg_int(lc, path, "num_attention_heads", 1, 0, 1, &d->NH, err)) ||
        (st = cfg_int(lc, path, "num_key_value_heads", 0, d->NH, 1, &d->NKV, err)) ||
        (st = cfg_int(lc, path, "head_dim", 0, d->H / d->NH, 2, &d->HD, err)) ||
        (st = cfg_int(lc, path, "intermediate_size", 1, 0, 1, &d->I, err)) ||
        (st = cfg_int(lc, path, "vocab_size", 1, 0, 1, &d->V, err)) ||
        (st = cfg_int(root, path, "draft_vocab_size", 0, d->V, 1, &d->Vd, err)) ||
        (st = cfg_int(root, path, "target_hidden_size", 0, d->H, 1, &d->Ht, err)) ||
        (st = cfg_int(lc, path, "num_hidden_layers", 0, 1, 1, &nl, err)) ||
        (st = cfg_num(lc, path, "rms_norm_eps", 1e-6, &eps, err)) ||
        (st = cfg_num(lc, path, "rope_theta", 10000.0, &theta, err)) ||
        (st = cfg_false(lc, path, "attention_bias", err)) || (st = cfg_false(lc, path, "mlp_bias", err)))
        goto done;
    /* transformers 5 writes the RoPE base inside rope_parameters */
    json_t *rp = json_object_get(lc, "rope_parameters");
    if (rp && !json_is_null(rp)) {
        const char *t = json_is_object(rp) ? json_string_value(json_object_get(rp, "rope_type")) : NULL;
        if (!json_is_object(rp) || (t && strcmp(t, "default"))) {
            st = eg_fail(err, EG_ERR_UNSUPPORTED, "%s: rope_parameters type \"%s\" is not supported by the eagle3 drafter "
                         "(plain RoPE only)", path, t ? t : "?");
            goto done;
        }
        json_t *rt = json_object_get(lc, "rope_theta");
        if ((!rt || json_is_null(rt)) && (st = cfg_num(rp, path, "rope_theta", 10000.0, &theta, err))) goto done;
    }
    if (d->HD % 2) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: head_dim %d is odd (RoPE rotates halves)", path, d->HD);
        goto done;
    }
    if (d->NH % d->NKV) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path,
                     d->NH, d->NKV);
        goto done;
    }
    if (nl != 1) {
        st = eg_fail(err, EG_ERR_UNSUPPORTED, "%s: num_hidden_layers %d: the EAGLE-3 drafter has one decoder layer", path, nl);
        goto done;
    }
    if (d->V != tc->vocab) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: vocab_size %d but the target's vocabulary is %d", path, d->V, tc->vocab);
        goto done;
    }
    if (d->Vd > d->V) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: draft_vocab_size %d exceeds vocab_size %d", path, d->Vd, d->V);
        goto done;
    }
    if (d->Ht != tc->hidden) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: target_hidden_size %d but the target's hidden size is %d", path, d->Ht,
                     tc->hidden);
        goto done;
    }
    if (!(eps > 0 && eps < 1) || !(theta > 1)) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: rms_norm_eps %g / rope_theta %g out of range", path, eps, theta);
        goto done;
    }
    d->eps = (float)eps;
    d->theta = theta;
    json_t *act = json_object_get(lc, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu"))) {
        st = eg_fail(err, EG_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\"", path);
        goto done;
    }
    json_t *rs = json_object_get(lc, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *t = json_string_value(json_object_get(rs, "rope_type"));
        if (!t) t = json_string_value(json_object_get(rs, "type"));
        if (!t || strcmp(t, "default")) {
            st = eg_fail(err, EG_ERR_UNSUPPORTED,
                         "%s: rope_scaling type \"%s\" is not supported by the eagle3 drafter (plain RoPE only)", path,
                         t ? t : "?");
            goto done;
        }
    }
    json_t *nbr = json_object_get(root, "norm_before_residual");
    if (nbr && !json_is_null(nbr) && !json_is_boolean(nbr)) {
        st = eg_fail(err, EG_ERR_CONFIG, "%s: norm_before_residual must be a boolean", path);
        goto done;
    }
    d->norm_before_residual = nbr && json_is_true(nbr);
    st = read_aux(d, root, path, o, spec, err);
done:
    json_decref(root);
    return st;
}

/* DIR/config.json into *buf (malloc'd) of *n bytes; path gets its name. */
static eg_status read_config_text(const char *dir, char *path, size_t path_n, char **out, size_t *out_n,
                                  eg_error *err) {
    *out = NULL;
    *out_n = 0;
    snprintf(path, path_n, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return eg_fail(err, EG_ERR_CONFIG, "cannot open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    eg_status st = EG_OK;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = cap > ((size_t)1 << 26) ? NULL : realloc(buf, cap);
            if (!nb) {
                st = eg_fail(err, EG_ERR_CONFIG, "%s: larger than 64 MiB or out of memory", path);
                break;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    if (!st && ferror(f)) st = eg_fail(err, EG_ERR_IO, "%s: read error", path);
    fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    *out = buf;
    *out_n = n;
    return EG_OK;
}

static eg_status read_config(e3 *d, const char *dir, const eg_eagle3_opts *o, eg_error *err) {
    char path[4096], *buf;
    size_t n;
    eg_status st = read_config_text(dir, path, sizeof path, &buf, &n, err);
    if (!st) st = parse_config(d, buf, n, path, o, err);
    free(buf);
    return st;
}

eg_status eg_drafter_eagle3_read_config(const char *dir, const eg_config *target, const eg_eagle3_opts *opts,
                                        eg_eagle3_config *out, eg_error *err) {
    char path[4096], *buf;
    size_t n;
    memset(out, 0, sizeof *out);
    eg_status st = read_config_text(dir, path, sizeof path, &buf, &n, err);
    if (!st) st = eg_drafter_eagle3_parse_config(buf, n, path, target, opts, out, err);
    free(buf);
    return st;
}

eg_status eg_drafter_eagle3_parse_config(const char *json, size_t len, const char *what, const eg_config *target,
                                         const eg_eagle3_opts *opts, eg_eagle3_config *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    e3 d;
    memset(&d, 0, sizeof d);
    d.tcfg = target;
    d.L_target = target->n_layers;
    eg_status st = parse_config(&d, json, len, what, opts, err);
    eg_config_free(&d.mcfg);
    if (st) {
        free(d.aux_buf);
        return st;
    }
    /* the weights a backend holds, BF16 (the embedding stays on the host) */
    const int64_t H = d.H, A = (int64_t)d.n_aux * d.Ht;
    int64_t el = H * A + 4 * H + 3 * H * d.I + (int64_t)d.Vd * H + (d.norm_before_fc ? A : 0) + (d.fc_norm ? A : 0);
    if (d.mla) {
        const int64_t QH = (int64_t)d.NH * (d.DN + d.DR);
        el += (d.QL ? (int64_t)d.QL * 2 * H + d.QL + QH * d.QL : QH * 2 * H) + ((int64_t)d.C + d.DR) * 2 * H + d.C +
              (int64_t)d.NH * (d.DN + d.DV) * d.C + H * (int64_t)d.NH * d.DV;
    } else {
        el += ((int64_t)d.NH + 2 * (int64_t)d.NKV) * d.HD * 2 * H + H * (int64_t)d.NH * d.HD;
    }
    *out = (eg_eagle3_config){d.H, d.Ht, d.NH, d.NKV, d.HD, d.I, d.V, d.Vd, d.n_aux, d.aux_buf, d.aux_source,
                              d.eps, d.theta, d.norm_before_residual, d.mla, d.C, d.DR,
                              cache_bytes(&d), 2 * el};
    return EG_OK;
}

void eg_eagle3_config_free(eg_eagle3_config *c) {
    if (!c) return;
    free(c->aux_layers);
    c->aux_layers = NULL;
}

/* ------------------------------------------------------------------ tensors */

static eg_status open_files(e3 *d, const char *dir, eg_error *err) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &sb) == 0) {
        d->files = eg_calloc(1, sizeof *d->files, err);
        if (!d->files) return EG_ERR_NOMEM;
        d->n_files = 1;
        return eg_st_open(path, &d->files[0], err);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_error_t je;
    json_t *ix = json_load_file(path, 0, &je);
    if (!ix)
        return eg_fail(err, EG_ERR_IO, "%s: neither model.safetensors nor a readable model.safetensors.index.json (%s)",
                       dir, je.text);
    json_t *wm = json_object_get(ix, "weight_map");
    eg_status st = EG_OK;
    if (!json_is_object(wm)) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: no weight_map object", path);
        goto done;
    }
    size_t cap = json_object_size(wm);
    const char **names = eg_calloc(cap ? cap : 1, sizeof *names, err);
    if (!names) {
        st = EG_ERR_NOMEM;
        goto done;
    }
    int nn = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *f = json_string_value(val);
        if (!f || strchr(f, '/')) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name", path, key);
            break;
        }
        int seen = 0;
        for (int i = 0; i < nn; i++) seen |= !strcmp(names[i], f);
        if (!seen) names[nn++] = f;
    }
    if (!st) {
        d->files = eg_calloc((size_t)(nn ? nn : 1), sizeof *d->files, err);
        if (!d->files) st = EG_ERR_NOMEM;
    }
    for (int i = 0; !st && i < nn; i++) {
        char fp[4096];
        snprintf(fp, sizeof fp, "%s/%s", dir, names[i]);
        st = eg_st_open(fp, &d->files[i], err);
        if (!st) d->n_files = i + 1;
    }
    free(names);
done:
    json_decref(ix);
    return st;
}

static const eg_st_tensor *find_exact(const e3 *d, const char *name, int *fi) {
    for (int i = 0; i < d->n_files; i++) {
        const eg_st_tensor *t = eg_st_find(d->files[i], name);
        if (t) {
            if (fi) *fi = i;
            return t;
        }
    }
    return NULL;
}

/* A tensor under SpecForge's name, else the decoder layer's under speculators' and vLLM's
 * (layers.0.X for midlayer.X), else either with vLLM's module prefix (model.X, as
 * exporters that save vLLM's own parameter names write them): the same weight each way. */
static const eg_st_tensor *find(const e3 *d, const char *name, int *fi) {
    static const char mid[] = "midlayer.";
    char layer0[256] = "", pre[256];
    if (!strncmp(name, mid, sizeof mid - 1)) snprintf(layer0, sizeof layer0, "layers.0.%s", name + sizeof mid - 1);
    const char *base[2] = {name, layer0};
    for (int pass = 0; pass < 2; pass++) /* as named, then under model. */
        for (int i = 0; i < 2; i++) {
            if (!base[i][0]) continue;
            if (pass) snprintf(pre, sizeof pre, "model.%.240s", base[i]);
            const eg_st_tensor *t = find_exact(d, pass ? pre : base[i], fi);
            if (t) return t;
        }
    return NULL;
}

/* A plain weight of shape [rows][cols] (cols 0: 1-D [rows]). optional: absent -> data NULL. */
static eg_status get_w(e3 *d, const char *name, int64_t rows, int64_t cols, int optional, dw *w, eg_error *err) {
    int fi = 0;
    const eg_st_tensor *t = find(d, name, &fi);
    memset(w, 0, sizeof *w);
    if (!t) {
        if (optional) return EG_OK;
        if (!strncmp(name, "midlayer.", 9))
            return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s (or layers.0.%s, with or without model.) is missing",
                           eg_st_path(d->files[0]), name, name + 9);
        return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s (or model.%s) is missing", eg_st_path(d->files[0]), name,
                       name);
    }
    const char *fp = eg_st_path(d->files[fi]);
    if (t->dtype != EG_ST_BF16 && t->dtype != EG_ST_F16 && t->dtype != EG_ST_F32)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: tensor %s is %s; the eagle3 drafter reads BF16, F16 or F32", fp, name,
                       eg_st_dtype_name(t->dtype));
    int want_nd = cols ? 2 : 1;
    if (t->ndim != want_nd || t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        char got[128];
        size_t gl = 0;
        got[0] = 0;
        for (int i = 0; i < t->ndim && gl < sizeof got - 24; i++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (cols)
            return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s has shape [%s], the config gives [%lld, %lld]", fp, name, got,
                           (long long)rows, (long long)cols);
        return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s has shape [%s], the config gives [%lld]", fp, name, got,
                       (long long)rows);
    }
    if (!eg_st_aligned(t))
        return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s is not aligned to its element size", fp, name);
    w->dt = t->dtype;
    w->rows = rows;
    w->cols = cols ? cols : rows;
    if (!cols) w->rows = 1;
    w->data = t->data;
    return EG_OK;
}

static eg_status read_vocab_map(e3 *d, eg_error *err) {
    int fi = 0;
    const eg_st_tensor *t = find(d, "d2t", &fi);
    d->d2t = eg_malloc(sizeof(int64_t) * (size_t)d->Vd, err);
    if (!d->d2t) return EG_ERR_NOMEM;
    if (!t) {
        if (d->Vd != d->V)
            return eg_fail(err, EG_ERR_FORMAT, "%s: tensor d2t is missing (required when draft_vocab_size %d < vocab_size %d)",
                           eg_st_path(d->files[0]), d->Vd, d->V);
        memset(d->d2t, 0, sizeof(int64_t) * (size_t)d->Vd);
    } else {
        const char *fp = eg_st_path(d->files[fi]);
        if (t->dtype != EG_ST_I64 || t->ndim != 1 || t->shape[0] != d->Vd)
            return eg_fail(err, EG_ERR_FORMAT, "%s: tensor d2t must be I64 [%d] (draft_vocab_size), is %s with %d dims", fp,
                           d->Vd, eg_st_dtype_name(t->dtype), t->ndim);
        memcpy(d->d2t, t->data, sizeof(int64_t) * (size_t)d->Vd);
    }
    uint8_t *seen = eg_calloc((size_t)d->V, 1, err);
    if (!seen) return EG_ERR_NOMEM;
    eg_status st = EG_OK;
    d->monotone = 1;
    int64_t prev = -1;
    for (int i = 0; i < d->Vd && !st; i++) {
        int64_t tid = i + d->d2t[i];
        if (tid < 0 || tid >= d->V || seen[tid])
            st = eg_fail(err, EG_ERR_FORMAT, "%s: d2t[%d] = %lld maps draft id %d to target id %lld (%s)",
                         eg_st_path(d->files[0]), i, (long long)d->d2t[i], i, (long long)tid,
                         tid < 0 || tid >= d->V ? "outside the vocabulary" : "already taken");
        else seen[tid] = 1;
        if (tid <= prev) d->monotone = 0;
        prev = tid;
    }
    const eg_st_tensor *tt = st ? NULL : find(d, "t2d", &fi);
    if (tt) {
        const char *fp = eg_st_path(d->files[fi]);
        if (tt->dtype != EG_ST_BOOL || tt->ndim != 1 || tt->shape[0] != d->V)
            st = eg_fail(err, EG_ERR_FORMAT, "%s: tensor t2d must be BOOL [%d] (vocab_size)", fp, d->V);
        for (int i = 0; !st && i < d->V; i++)
            if ((((const uint8_t *)tt->data)[i] != 0) != (seen[i] != 0))
                st = eg_fail(err, EG_ERR_FORMAT, "%s: tensor t2d[%d] = %d disagrees with d2t (target id %d is %sin the draft "
                             "vocabulary)", fp, i, ((const uint8_t *)tt->data)[i] != 0, i, seen[i] ? "" : "not ");
    }
    free(seen);
    return st;
}

static eg_status read_mla_weights(e3 *d, eg_error *err) {
    const int64_t H = d->H, QH = (int64_t)d->NH * (d->DN + d->DR);
    eg_status st;
    if (d->QL ? (st = get_w(d, "midlayer.self_attn.q_a_proj.weight", d->QL, 2 * H, 0, &d->q_a, err)) ||
                    (st = get_w(d, "midlayer.self_attn.q_a_layernorm.weight", d->QL, 0, 0, &d->q_a_norm, err)) ||
                    (st = get_w(d, "midlayer.self_attn.q_b_proj.weight", QH, d->QL, 0, &d->q_b, err))
              : (st = get_w(d, "midlayer.self_attn.q_proj.weight", QH, 2 * H, 0, &d->q_full, err)))
        return st;
    return (st = get_w(d, "midlayer.self_attn.kv_a_proj_with_mqa.weight", (int64_t)d->C + d->DR, 2 * H, 0, &d->kv_a,
                       err)) ||
                   (st = get_w(d, "midlayer.self_attn.kv_a_layernorm.weight", d->C, 0, 0, &d->kv_a_norm, err)) ||
                   (st = get_w(d, "midlayer.self_attn.kv_b_proj.weight", (int64_t)d->NH * (d->DN + d->DV), d->C, 0,
                               &d->kv_b, err))
               ? st
               : EG_OK;
}

/* fc_norm.{i}.weight [Ht], one per aux row (vLLM's ModuleList). */
static eg_status read_fc_norm(e3 *d, eg_error *err) {
    if (!(d->fcn = eg_calloc((size_t)d->n_aux, sizeof *d->fcn, err))) return EG_ERR_NOMEM;
    for (int i = 0; i < d->n_aux; i++) {
        char name[64];
        snprintf(name, sizeof name, "fc_norm.%d.weight", i);
        eg_status st = get_w(d, name, d->Ht, 0, 0, &d->fcn[i], err);
        if (st) return st;
    }
    return EG_OK;
}

static eg_status read_weights(e3 *d, eg_error *err) {
    const int64_t H = d->H, q = (int64_t)d->NH * d->HD, kv = (int64_t)d->NKV * d->HD,
                  o_in = d->mla ? (int64_t)d->NH * d->DV : q;
    eg_status st;
    if ((st = get_w(d, "fc.weight", H, (int64_t)d->n_aux * d->Ht, 0, &d->fc, err)) ||
        (st = get_w(d, "midlayer.input_layernorm.weight", H, 0, 0, &d->in_norm, err)) ||
        (st = get_w(d, "midlayer.hidden_norm.weight", H, 0, 0, &d->hid_norm, err)) ||
        (d->mla && (st = read_mla_weights(d, err))) ||
        (!d->mla && ((st = get_w(d, "midlayer.self_attn.q_proj.weight", q, 2 * H, 0, &d->wq, err)) ||
                     (st = get_w(d, "midlayer.self_attn.k_proj.weight", kv, 2 * H, 0, &d->wk, err)) ||
                     (st = get_w(d, "midlayer.self_attn.v_proj.weight", kv, 2 * H, 0, &d->wv, err)))) ||
        (st = get_w(d, "midlayer.self_attn.o_proj.weight", H, o_in, 0, &d->wo, err)) ||
        (st = get_w(d, "midlayer.post_attention_layernorm.weight", H, 0, 0, &d->post_norm, err)) ||
        (st = get_w(d, "midlayer.mlp.gate_proj.weight", d->I, H, 0, &d->wg, err)) ||
        (st = get_w(d, "midlayer.mlp.up_proj.weight", d->I, H, 0, &d->wu, err)) ||
        (st = get_w(d, "midlayer.mlp.down_proj.weight", H, d->I, 0, &d->wd, err)) ||
        (st = get_w(d, "norm.weight", H, 0, 0, &d->norm, err)) ||
        (st = get_w(d, "lm_head.weight", d->Vd, H, 0, &d->lm_head, err)) ||
        (st = get_w(d, "embed_tokens.weight", d->V, H, 1, &d->embed, err)) ||
        (d->norm_before_fc && (st = get_w(d, "input_norm.weight", (int64_t)d->n_aux * d->Ht, 0, 0, &d->input_norm, err))) ||
        (d->fc_norm && (st = read_fc_norm(d, err))))
        return st;
    static const char *const biases[] = {"midlayer.self_attn.q_proj.bias", "midlayer.self_attn.k_proj.bias",
                                         "midlayer.self_attn.v_proj.bias", "midlayer.self_attn.o_proj.bias", "fc.bias",
                                         "midlayer.self_attn.q_a_proj.bias", "midlayer.self_attn.kv_a_proj_with_mqa.bias"};
    for (size_t i = 0; i < sizeof biases / sizeof biases[0]; i++)
        if (find(d, biases[i], NULL))
            return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: tensor %s: biases are not supported", eg_st_path(d->files[0]),
                           biases[i]);
    d->own_embed = d->embed.data != NULL;
    if (!d->own_embed) {
        if (d->target->embed.fmt == EG_W_NONE || d->target->embed.cols != d->H)
            return eg_fail(err, EG_ERR_FORMAT,
                           "%s: no embed_tokens.weight, and the target's embedding [%lld][%lld] cannot stand in for a "
                           "hidden size of %d",
                           eg_st_path(d->files[0]), (long long)d->target->embed.rows, (long long)d->target->embed.cols,
                           d->H);
    }
    return read_vocab_map(d, err);
}

/* ------------------------------------------------------------------ load */

eg_status eg_drafter_eagle3_load(const char *dir, const eg_model *target, int n_slots, int max_seq_len,
                                 eg_drafter **out, eg_error *err) {
    eg_eagle3_opts o = {0};
    return eg_drafter_eagle3_load_opts(dir, target, n_slots, max_seq_len, &o, out, err);
}

eg_status eg_drafter_eagle3_load_opts(const char *dir, const eg_model *target, int n_slots, int max_seq_len,
                                      const eg_eagle3_opts *opts, eg_drafter **out, eg_error *err) {
    *out = NULL;
    if (n_slots < 1 || max_seq_len < 1)
        return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter %s: %d slots of %d positions", dir, n_slots, max_seq_len);
    if (opts->threads < 0) return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: %d threads", opts->threads);
    if (opts->block_size < 0 || opts->pool_blocks < 0)
        return eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: cache blocks of %d positions, a pool of %lld blocks",
                       opts->block_size, (long long)opts->pool_blocks);
    e3 *d = eg_calloc(1, sizeof *d, err);
    if (!d) return EG_ERR_NOMEM;
    d->target = target;
    d->tcfg = &target->cfg;
    d->L_target = target->cfg.n_layers;
    d->S = n_slots;
    d->T = max_seq_len;
    d->base.vt = &e3_vt;
    d->base.impl = d;
    eg_status st;
    if ((st = read_config(d, dir, opts, err))) goto fail;
    if ((st = open_files(d, dir, err)) || (st = read_weights(d, err))) goto fail;
    /* an MLA drafter runs through a backend's ops (the target's MLA op): "cpu" unless told */
    eg_eagle3_opts mopts = *opts;
    if (d->mla && !(opts->backend && opts->backend[0])) mopts.backend = "cpu";
    opts = &mopts;
    const int on_backend = opts->backend && opts->backend[0];
    /* the pool: by default every slot can reach max_seq_len; the runtime passes the
       target's KV pool (the same blocks: the drafter never holds more positions of a
       sequence than the target has mapped for it, see engine.c) */
    d->BS = opts->block_size ? opts->block_size : 16;
    d->MB = (int)((d->T + (int64_t)d->BS - 1) / d->BS);
    d->n_blocks = opts->pool_blocks ? opts->pool_blocks : (int64_t)d->S * d->MB;
    if (d->n_blocks > INT32_MAX) {
        st = eg_fail(err, EG_ERR_INVALID, "eagle3 drafter: a pool of %lld blocks", (long long)d->n_blocks);
        goto fail;
    }
    const int64_t row = (int64_t)d->NKV * d->HD, cache = on_backend ? 1 : d->n_blocks * d->BS * row;
    d->kc = eg_malloc(sizeof(uint16_t) * (size_t)cache, err); /* the backend path keeps its caches there */
    d->vc = eg_malloc(sizeof(uint16_t) * (size_t)cache, err);
    d->table = eg_malloc(sizeof(int32_t) * (size_t)d->S * (size_t)d->MB, err);
    d->n_mapped = eg_calloc((size_t)d->S, sizeof(int32_t), err);
    d->free_list = eg_malloc(sizeof(int32_t) * (size_t)d->n_blocks, err);
    d->dirty = eg_calloc((size_t)d->S, 1, err);
    if (!d->table || !d->n_mapped || !d->free_list || !d->dirty) {
        st = EG_ERR_NOMEM;
        goto fail;
    }
    for (int64_t i = 0; i < (int64_t)d->S * d->MB; i++) d->table[i] = -1;
    for (int64_t i = 0; i < d->n_blocks; i++) d->free_list[i] = (int32_t)(d->n_blocks - 1 - i); /* block 0 first */
    d->n_free = d->n_blocks;
    d->last = eg_calloc((size_t)d->S * (size_t)d->H, sizeof(float), err);
    d->len = eg_calloc((size_t)d->S, sizeof(int), err);
    d->last_pos = eg_malloc(sizeof(int) * (size_t)d->S, err);
    d->inv_freq = eg_malloc(sizeof(float) * (size_t)(d->HD / 2), err);
    const int64_t H = d->H;
    struct { float **p; int64_t n; } sz[] = {
        {&d->emb, H}, {&d->hid, H}, {&d->res, H}, {&d->cat, 2 * H}, {&d->q, (int64_t)d->NH * d->HD}, {&d->k, row},
        {&d->v, row}, {&d->att, (int64_t)d->NH * d->HD}, {&d->x, H}, {&d->y, H}, {&d->g, d->I}, {&d->u, d->I},
        {&d->out, H}, {&d->scores, d->T}, {&d->logits, d->Vd}};
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) *sz[i].p = eg_malloc(sizeof(float) * (size_t)sz[i].n, err);
    d->order = eg_malloc(sizeof(int) * 2 * (size_t)d->S, err); /* and propose_many's L0 */
    d->mark = eg_calloc((size_t)d->S, 1, err);
    if (!d->order || !d->mark) st = EG_ERR_NOMEM;
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++)
        if (!*sz[i].p) st = EG_ERR_NOMEM;
    if ((d->norm_before_fc || d->fc_norm) && !(d->auxn = eg_malloc(sizeof(float) * (size_t)d->n_aux * (size_t)d->Ht, err)))
        st = EG_ERR_NOMEM;
    if (!d->kc || !d->vc || !d->last || !d->len || !d->last_pos || !d->inv_freq) st = EG_ERR_NOMEM;
    if (st) goto fail;
    if ((st = eg_pool_create(opts->threads ? opts->threads : eg_num_threads(), &d->pool, err))) goto fail;
    d->n_ps = eg_pool_size(d->pool);
    if (!(d->ps = eg_calloc((size_t)d->n_ps, sizeof *d->ps, err))) {
        st = EG_ERR_NOMEM;
        goto fail;
    }
    for (int t = 0; t < d->n_ps; t++) {
        pick_scr *ps = &d->ps[t];
        ps->pd = eg_malloc(sizeof(double) * (size_t)d->Vd, err);
        ps->pt = eg_malloc(sizeof(double) * (size_t)(d->monotone ? 1 : d->V), err);
        ps->logits_t = eg_malloc(sizeof(float) * (size_t)(d->monotone ? 1 : d->V), err);
        if (!ps->pd || !ps->pt || !ps->logits_t) {
            st = EG_ERR_NOMEM;
            goto fail;
        }
        if ((st = eg_spec_scratch_create(d->monotone ? d->Vd : d->V, &ps->sc, err))) goto fail;
    }
    for (int s = 0; s < d->S; s++) d->last_pos[s] = -1;
    if (d->mla) { /* DeepSeek's (YaRN-blended) frequencies of the rope dims, as the target's */
        double *fr = eg_malloc(sizeof(double) * (size_t)(d->DR / 2), err);
        if (!fr) {
            st = EG_ERR_NOMEM;
            goto fail;
        }
        eg_config_rope_inv_freq(&d->mcfg, fr);
        for (int i = 0; i < d->DR / 2; i++) d->inv_freq[i] = (float)fr[i];
        free(fr);
    } else {
        for (int i = 0; i < d->HD / 2; i++) d->inv_freq[i] = (float)(1.0 / pow(d->theta, (2.0 * i) / d->HD));
    }
    if (on_backend && (st = dev_create(d, opts, err))) goto fail;
    eg_drafter_info *in = &d->base.info;
    in->kind = "eagle3";
    in->n_aux = d->n_aux;
    in->aux_layers = d->aux_buf;
    in->hidden = d->Ht;
    in->target_vocab = d->V;
    in->q_cap = d->Vd; /* a row holds the draft vocabulary's kept ids at most */
    in->n_slots = d->S;
    in->max_seq_len = d->T;
    in->cache_bytes_per_token = cache_bytes(d);
    in->block_size = d->BS;
    in->pool_blocks = d->n_blocks;
    in->state_bytes = d->n_blocks * d->BS * in->cache_bytes_per_token + (int64_t)d->S * (4 * H + 4 * d->MB);
    {   /* as stored (the target's embedding, when borrowed, is not the drafter's), and d2t */
        const dw *ws[] = {&d->fc, &d->in_norm, &d->hid_norm, &d->wq, &d->wk, &d->wv, &d->wo, &d->post_norm,
                          &d->wg, &d->wu, &d->wd, &d->norm, &d->lm_head, &d->embed, &d->input_norm, &d->q_a,
                          &d->q_a_norm, &d->q_b, &d->q_full, &d->kv_a, &d->kv_a_norm, &d->kv_b};
        in->weight_bytes = (int64_t)sizeof(int64_t) * d->Vd;
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]->data) in->weight_bytes += ws[i]->rows * ws[i]->cols * (ws[i]->dt == EG_ST_F32 ? 4 : 2);
        for (int i = 0; d->fcn && i < d->n_aux; i++)
            in->weight_bytes += d->fcn[i].cols * (d->fcn[i].dt == EG_ST_F32 ? 4 : 2);
    }
    *out = &d->base;
    return EG_OK;
fail:
    e3_destroy(&d->base);
    return st;
}
