/* Recorded replay (forward.c's graph logic) without a GPU: a wrapper backend around the
 * CPU backend records ops between graph_begin and graph_end instead of running them and
 * replays the list on graph_launch, the way CUDA graphs do. It refuses host copies,
 * sample and sync while recording, and checks that every activation pointer a recorded
 * op takes lies in memory the backend allocated (a host pointer in a recorded op would
 * be read at recording time on a GPU, never again). Steps run through it must give the
 * CPU backend's results bit for bit, with recordings, replays, injected recording
 * failures and stale graphs, in one forward object and in a 2-stage engine. */
#include <stdlib.h>

#include "engine/engine.h"
#include "tests/check.h"

#define MODEL "../shared/fixtures/models/tiny-a"

/* ---- the recording backend ------------------------------------------------------- */

typedef enum {
    R_EMBED, R_RMSNORM, R_ADD_RMSNORM, R_ADD, R_LINEAR, R_SWIGLU, R_MLA, R_ROUTER, R_MOE, R_GATHER, R_MEMSET, R_COPY
} rop;

typedef struct rec {
    rop op;
    const void *p[3];
    void *q[2];
    const eg_weight *w[3];
    int T, D, acc;
    int64_t n;
    float eps;
    eg_mla_args mla;
    eg_router_args router;
    eg_moe_args moe;
} rec;

typedef struct rgraph {
    rec *r;
    int n;
} rgraph;

typedef struct rb {
    eg_backend *in;
    int recording;
    rec *cur;
    int n, cap;
    struct { const char *p; size_t n; } *mem;
    int n_mem, cap_mem;
    int fail_end;      /* the next graph_end calls fail */
    int stale_in;      /* > 0: the stale_in-th graph_launch from now reports a stale graph */
    int bad_ptrs;      /* recorded activation pointers outside backend memory */
    int refused;       /* host copies / sample / sync refused while recording */
    int64_t replayed_ops;
    int disabled;      /* graphs switched off: graph_enabled says 0, graph_begin fails UNSUPPORTED */
    int64_t live, peak; /* bytes allocated now and at most */
} rb;

static rb *R(eg_backend *b) { return (rb *)b->impl; }

static int owned(rb *r, const void *p) {
    for (int i = 0; i < r->n_mem; i++)
        if ((const char *)p >= r->mem[i].p && (const char *)p < r->mem[i].p + r->mem[i].n) return 1;
    return 0;
}

/* Record when recording (after checking the activation pointers); 0 = run it now. */
static int record(rb *r, const rec *x, const void *const *ptrs, int n) {
    if (!r->recording) return 0;
    for (int i = 0; i < n; i++)
        if (ptrs[i] && !owned(r, ptrs[i])) r->bad_ptrs++;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->cur = realloc(r->cur, sizeof *r->cur * (size_t)r->cap);
    }
    r->cur[r->n++] = *x;
    return 1;
}

#define IN(b) (R(b)->in)
#define REFUSE(b, what)                                                                  \
    do {                                                                                 \
        if (R(b)->recording) {                                                           \
            R(b)->refused++;                                                             \
            return eg_fail(err, EG_ERR_INVALID, "%s while recording", what);             \
        }                                                                                \
    } while (0)

static eg_status r_alloc(eg_backend *b, size_t n, void **p, eg_error *err) {
    eg_status st = IN(b)->ops->alloc(IN(b), n, p, err);
    rb *r = R(b);
    if (!st) {
        if (r->n_mem == r->cap_mem) {
            r->cap_mem = r->cap_mem ? 2 * r->cap_mem : 32;
            r->mem = realloc(r->mem, sizeof *r->mem * (size_t)r->cap_mem);
        }
        r->mem[r->n_mem].p = *p;
        r->mem[r->n_mem++].n = n ? n : 1;
        r->live += (int64_t)(n ? n : 1);
        if (r->live > r->peak) r->peak = r->live;
    }
    return st;
}
static void r_release(eg_backend *b, void *p) {
    rb *r = R(b);
    for (int i = 0; i < r->n_mem; i++)
        if (r->mem[i].p == p) {
            r->live -= (int64_t)r->mem[i].n;
            r->mem[i] = r->mem[--r->n_mem];
            break;
        }
    IN(b)->ops->release(IN(b), p);
}
static eg_status r_to_device(eg_backend *b, void *d, const void *s, size_t n, eg_error *err) {
    REFUSE(b, "to_device");
    return IN(b)->ops->to_device(IN(b), d, s, n, err);
}
static eg_status r_to_host(eg_backend *b, void *d, const void *s, size_t n, eg_error *err) {
    REFUSE(b, "to_host");
    return IN(b)->ops->to_host(IN(b), d, s, n, err);
}
static eg_status r_sync(eg_backend *b, eg_error *err) {
    REFUSE(b, "sync");
    return IN(b)->ops->sync(IN(b), err);
}
static eg_status r_memset0(eg_backend *b, void *d, size_t n, eg_error *err) {
    rec x = {.op = R_MEMSET, .q = {d}, .n = (int64_t)n};
    const void *ps[] = {d};
    return record(R(b), &x, ps, 1) ? EG_OK : IN(b)->ops->memset0(IN(b), d, n, err);
}
static eg_status r_copy(eg_backend *b, void *d, const void *s, size_t n, eg_error *err) {
    rec x = {.op = R_COPY, .q = {d}, .p = {s}, .n = (int64_t)n};
    const void *ps[] = {d, s};
    return record(R(b), &x, ps, 2) ? EG_OK : IN(b)->ops->copy(IN(b), d, s, n, err);
}
static eg_status r_weight_upload(eg_backend *b, const eg_weight *h, eg_weight *d, eg_error *err) {
    return IN(b)->ops->weight_upload(IN(b), h, d, err);
}
static void r_weight_release(eg_backend *b, eg_weight *d) { IN(b)->ops->weight_release(IN(b), d); }
static eg_status r_embed(eg_backend *b, const int32_t *tok, int T, const eg_weight *E, float *x, eg_error *err) {
    rec y = {.op = R_EMBED, .p = {tok}, .q = {x}, .w = {E}, .T = T};
    const void *ps[] = {tok, x};
    return record(R(b), &y, ps, 2) ? EG_OK : IN(b)->ops->embed(IN(b), tok, T, E, x, err);
}
static eg_status r_rmsnorm(eg_backend *b, const float *x, const eg_weight *w, int T, int D, float eps, float *y,
                           eg_error *err) {
    rec r = {.op = R_RMSNORM, .p = {x}, .q = {y}, .w = {w}, .T = T, .D = D, .eps = eps};
    const void *ps[] = {x, y};
    return record(R(b), &r, ps, 2) ? EG_OK : IN(b)->ops->rmsnorm(IN(b), x, w, T, D, eps, y, err);
}
static eg_status r_add_rmsnorm(eg_backend *b, float *x, const float *dx, const eg_weight *w, int T, int D, float eps,
                               float *y, eg_error *err) {
    rec r = {.op = R_ADD_RMSNORM, .p = {dx}, .q = {x, y}, .w = {w}, .T = T, .D = D, .eps = eps};
    const void *ps[] = {x, dx, y};
    return record(R(b), &r, ps, 3) ? EG_OK : IN(b)->ops->add_rmsnorm(IN(b), x, dx, w, T, D, eps, y, err);
}
static eg_status r_add(eg_backend *b, float *x, const float *dx, int64_t n, eg_error *err) {
    rec r = {.op = R_ADD, .p = {dx}, .q = {x}, .n = n};
    const void *ps[] = {x, dx};
    return record(R(b), &r, ps, 2) ? EG_OK : IN(b)->ops->add(IN(b), x, dx, n, err);
}
static eg_status r_linear(eg_backend *b, const float *x, int T, const eg_weight *W, float *y, eg_error *err) {
    rec r = {.op = R_LINEAR, .p = {x}, .q = {y}, .w = {W}, .T = T};
    const void *ps[] = {x, y};
    return record(R(b), &r, ps, 2) ? EG_OK : IN(b)->ops->linear(IN(b), x, T, W, y, err);
}
static eg_status r_swiglu(eg_backend *b, const float *x, int T, const eg_weight *g, const eg_weight *u,
                          const eg_weight *d, float *y, int acc, eg_error *err) {
    rec r = {.op = R_SWIGLU, .p = {x}, .q = {y}, .w = {g, u, d}, .T = T, .acc = acc};
    const void *ps[] = {x, y};
    return record(R(b), &r, ps, 2) ? EG_OK : IN(b)->ops->swiglu_mlp(IN(b), x, T, g, u, d, y, acc, err);
}
static eg_status r_mla(eg_backend *b, const eg_mla_args *a, eg_error *err) {
    rec r = {.op = R_MLA, .mla = *a};
    const void *ps[] = {a->pos, a->slot, a->block_table, a->q, a->kv, a->cache.data, a->rope_inv_freq, a->out};
    return record(R(b), &r, ps, 8) ? EG_OK : IN(b)->ops->mla_attention(IN(b), a, err);
}
static eg_status r_router(eg_backend *b, const eg_router_args *a, eg_error *err) {
    rec r = {.op = R_ROUTER, .router = *a};
    const void *ps[] = {a->x, a->ids, a->weights};
    return record(R(b), &r, ps, 3) ? EG_OK : IN(b)->ops->router(IN(b), a, err);
}
static eg_status r_moe(eg_backend *b, const eg_moe_args *a, eg_error *err) {
    rec r = {.op = R_MOE, .moe = *a};
    const void *ps[] = {a->x, a->ids, a->weights, a->y};
    return record(R(b), &r, ps, 4) ? EG_OK : IN(b)->ops->moe(IN(b), a, err);
}
static eg_status r_gather(eg_backend *b, const float *x, const int32_t *idx, int n, int D, float *out, eg_error *err) {
    rec r = {.op = R_GATHER, .p = {x, idx}, .q = {out}, .T = n, .D = D};
    const void *ps[] = {x, idx, out};
    return record(R(b), &r, ps, 3) ? EG_OK : IN(b)->ops->gather_rows(IN(b), x, idx, n, D, out, err);
}
static eg_status r_sample(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *p, uint64_t *rng,
                          int32_t *out, eg_error *err) {
    REFUSE(b, "sample");
    return IN(b)->ops->sample(IN(b), logits, N, V, p, rng, out, err);
}

static eg_status replay(eg_backend *in, const rec *x, eg_error *err) {
    const eg_backend_ops *o = in->ops;
    switch (x->op) {
    case R_EMBED: return o->embed(in, x->p[0], x->T, x->w[0], x->q[0], err);
    case R_RMSNORM: return o->rmsnorm(in, x->p[0], x->w[0], x->T, x->D, x->eps, x->q[0], err);
    case R_ADD_RMSNORM: return o->add_rmsnorm(in, x->q[0], x->p[0], x->w[0], x->T, x->D, x->eps, x->q[1], err);
    case R_ADD: return o->add(in, x->q[0], x->p[0], x->n, err);
    case R_LINEAR: return o->linear(in, x->p[0], x->T, x->w[0], x->q[0], err);
    case R_SWIGLU: return o->swiglu_mlp(in, x->p[0], x->T, x->w[0], x->w[1], x->w[2], x->q[0], x->acc, err);
    case R_MLA: return o->mla_attention(in, &x->mla, err);
    case R_ROUTER: return o->router(in, &x->router, err);
    case R_MOE: return o->moe(in, &x->moe, err);
    case R_GATHER: return o->gather_rows(in, x->p[0], x->p[1], x->T, x->D, x->q[0], err);
    case R_MEMSET: return o->memset0(in, x->q[0], (size_t)x->n, err);
    case R_COPY: return o->copy(in, x->q[0], x->p[0], (size_t)x->n, err);
    }
    return EG_ERR_INVALID;
}

static eg_status r_graph_begin(eg_backend *b, eg_error *err) {
    rb *r = R(b);
    if (r->disabled) return eg_fail(err, EG_ERR_UNSUPPORTED, "graphs switched off");
    if (r->recording) return eg_fail(err, EG_ERR_INVALID, "graph_begin while recording");
    r->recording = 1;
    r->n = 0;
    return EG_OK;
}
static eg_status r_graph_end(eg_backend *b, void **g, eg_error *err) {
    rb *r = R(b);
    *g = NULL;
    if (!r->recording) return eg_fail(err, EG_ERR_INVALID, "graph_end without graph_begin");
    r->recording = 0;
    if (r->fail_end > 0) {
        r->fail_end--;
        return eg_fail(err, EG_ERR_DEVICE, "injected recording failure");
    }
    rgraph *gr = calloc(1, sizeof *gr);
    gr->r = malloc(sizeof *gr->r * (size_t)(r->n ? r->n : 1));
    memcpy(gr->r, r->cur, sizeof *gr->r * (size_t)r->n);
    gr->n = r->n;
    *g = gr;
    return EG_OK;
}
static eg_status r_graph_launch(eg_backend *b, void *g, int *ran, eg_error *err) {
    rb *r = R(b);
    rgraph *gr = g;
    *ran = 0;
    REFUSE(b, "graph_launch");
    if (r->stale_in > 0 && --r->stale_in == 0) return EG_OK;
    for (int i = 0; i < gr->n; i++) {
        eg_status st = replay(r->in, &gr->r[i], err);
        if (st) return st;
    }
    r->replayed_ops += gr->n;
    *ran = 1;
    return EG_OK;
}
static int r_graph_enabled(eg_backend *b) { return !R(b)->disabled; }
static void r_graph_free(eg_backend *b, void *g) {
    (void)b;
    rgraph *gr = g;
    if (gr) free(gr->r);
    free(gr);
}
static void r_destroy(eg_backend *b) {
    rb *r = R(b);
    eg_backend_free(r->in);
    free(r->cur);
    free(r->mem);
    free(r);
    free(b);
}

static const eg_backend_ops rec_ops = {
    .name = "recording", .destroy = r_destroy, .alloc = r_alloc, .release = r_release, .to_device = r_to_device,
    .to_host = r_to_host, .memset0 = r_memset0, .copy = r_copy, .sync = r_sync, .weight_upload = r_weight_upload,
    .weight_release = r_weight_release, .embed = r_embed, .rmsnorm = r_rmsnorm, .add_rmsnorm = r_add_rmsnorm,
    .add = r_add, .linear = r_linear, .swiglu_mlp = r_swiglu, .mla_attention = r_mla, .router = r_router,
    .moe = r_moe, .gather_rows = r_gather, .sample = r_sample, .graph_begin = r_graph_begin, .graph_enabled = r_graph_enabled,
    .graph_end = r_graph_end, .graph_launch = r_graph_launch, .graph_free = r_graph_free,
};

static eg_backend *rec_create(const eg_config *c, int max_tokens) {
    eg_error err = {0};
    eg_backend_opts o = {.name = "cpu", .max_tokens = max_tokens, .max_seq_len = 128, .nthreads = 2};
    eg_backend *in = NULL;
    CHECK_OK(eg_backend_create(c, &o, &in, &err), &err);
    if (!in) return NULL;
    eg_backend *b = calloc(1, sizeof *b);
    rb *r = calloc(1, sizeof *r);
    r->in = in;
    b->ops = &rec_ops;
    b->impl = r;
    return b;
}

/* ---- a scripted sequence of steps ------------------------------------------------ */

static eg_model model;
static int have_model;

static void load_model(void) {
    if (have_model) return;
    eg_error err = {0};
    CHECK_OK(eg_model_load(MODEL, &model, &err), &err);
    have_model = err.code == EG_OK;
}

#define NSTEP 14
#define NS 3

/* Everything a step hands back, per step. */
typedef struct outs {
    float *cap[NSTEP], *fin[NSTEP], *logits[NSTEP];
    int32_t sampled[NSTEP][16];
    int T[NSTEP];
} outs;

static void outs_free(outs *o) {
    for (int s = 0; s < NSTEP; s++) {
        free(o->cap[s]);
        free(o->fin[s]);
        free(o->logits[s]);
    }
    memset(o, 0, sizeof *o);
}

/* One prefill step of 3 prompts (16 tokens), then decode steps of 3 tokens (a shape that
 * repeats: recorded on its second sighting, replayed after), with one step of 2 tokens
 * in the middle (another shape) and captures on every step. */
static int script_logit_rows; /* eg_forward_opts.logit_rows of the script's forward (0: max_tokens) */
static eg_status script(eg_backend *be, int no_graphs, outs *o, eg_forward_graph_stats *gs, eg_error *err) {
    const eg_config *c = &model.cfg;
    int capture[3] = {-1, 1, 4}, H = c->hidden, V = c->vocab;
    eg_forward_opts fo = {.max_tokens = 16, .n_slots = NS, .max_seq_len = 128, .block_size = 8, .capture = capture,
                          .n_capture = 3, .no_graphs = no_graphs, .logit_rows = script_logit_rows};
    eg_forward *f = NULL;
    eg_status st = eg_forward_create(&model, be, &fo, &f, err);
    if (st) return st;
    int plen[NS] = {5, 7, 4}, len[NS];
    for (int s = 0; s < NS && !st; s++) st = eg_kv_reserve(eg_forward_kv(f), s, 64, err);
    uint64_t rng[NS];
    for (int s = 0; s < NS; s++) rng[s] = eg_rng_seed(9, (uint64_t)s);
    eg_sample_params sp[NS] = {{0.8f, 0.95f, 0}, {0.0f, 1.0f, 0}, {1.0f, 1.0f, 20}};
    int32_t tok[16], pos[16], slot[16], rows[NS], last[NS];
    for (int k = 0; k < NSTEP && !st; k++) {
        int T = 0, n = 0;
        uint64_t r2[NS];
        eg_sample_params p2[NS];
        if (k == 0) {
            for (int s = 0; s < NS; s++) {
                for (int i = 0; i < plen[s]; i++, T++) {
                    tok[T] = (int32_t)((s * 97 + i * 31 + 5) % V);
                    pos[T] = i;
                    slot[T] = s;
                }
                rows[n] = T - 1;
                p2[n] = sp[s];
                r2[n++] = rng[s];
                len[s] = plen[s];
            }
        } else {
            int ns = k == 6 ? 2 : NS; /* one step without the last sequence */
            for (int s = 0; s < ns; s++, T++) {
                tok[T] = last[s];
                pos[T] = len[s]++;
                slot[T] = s;
                rows[n] = T;
                p2[n] = sp[s];
                r2[n++] = rng[s];
            }
        }
        o->T[k] = T;
        o->cap[k] = calloc((size_t)3 * (size_t)T * (size_t)H, 4);
        o->fin[k] = calloc((size_t)T * (size_t)H, 4);
        o->logits[k] = calloc((size_t)n * (size_t)V, 4);
        eg_step step = {.T = T, .tokens = tok, .pos = pos, .slot = slot, .n_logits = n, .logit_rows = rows,
                        .logits = o->logits[k], .sampled = o->sampled[k], .sp = p2, .rng = r2,
                        .capture = o->cap[k], .final_hidden = o->fin[k]};
        st = eg_forward_step(f, &step, err);
        for (int i = 0; i < n; i++) {
            int s = slot[rows[i]];
            rng[s] = r2[i];
            last[s] = o->sampled[k][i];
        }
    }
    eg_forward_get_graph_stats(f, gs);
    eg_forward_free(f);
    return st;
}

static int outs_same(const outs *a, const outs *b, int H, int V) {
    for (int k = 0; k < NSTEP; k++) {
        size_t T = (size_t)a->T[k], n = k == 0 ? NS : T;
        if (a->T[k] != b->T[k] || memcmp(a->cap[k], b->cap[k], 4 * 3 * T * (size_t)H) ||
            memcmp(a->fin[k], b->fin[k], 4 * T * (size_t)H) || memcmp(a->logits[k], b->logits[k], 4 * n * (size_t)V) ||
            memcmp(a->sampled[k], b->sampled[k], 4 * n)) {
            printf("    step %d (T %zu) differs: T %d, captures %d, final %d, logits %d, sampled %d\n", k, T,
                   a->T[k] != b->T[k], !!memcmp(a->cap[k], b->cap[k], 4 * 3 * T * (size_t)H),
                   !!memcmp(a->fin[k], b->fin[k], 4 * T * (size_t)H),
                   !!memcmp(a->logits[k], b->logits[k], 4 * n * (size_t)V), !!memcmp(a->sampled[k], b->sampled[k], 4 * n));
            return 0;
        }
    }
    return 1;
}

static void test_replay_equals_ops(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    const eg_config *c = &model.cfg;
    outs ref = {0}, got = {0};
    eg_forward_graph_stats gs;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 16, .max_seq_len = 128, .nthreads = 2};
    eg_backend *cpu = NULL;
    CHECK_OK(eg_backend_create(c, &bo, &cpu, &err), &err);
    if (!cpu) return;
    CHECK_OK(script(cpu, 0, &ref, &gs, &err), &err);
    CHECK(gs.recorded == 0 && gs.replays == 0); /* the CPU backend has no graph ops */
    eg_backend_free(cpu);

    /* recorded and replayed: the decode shape (T 3) once, replayed from its third step on */
    eg_backend *b = rec_create(c, 16);
    if (!b) return;
    CHECK_OK(script(b, 0, &got, &gs, &err), &err);
    printf("    recorded %lld, replays %lld, failed %lld, stale %lld; %lld ops replayed; bad pointers %d, refused %d\n",
           (long long)gs.recorded, (long long)gs.replays, (long long)gs.failed, (long long)gs.stale,
           (long long)R(b)->replayed_ops, R(b)->bad_ptrs, R(b)->refused);
    CHECK(outs_same(&ref, &got, c->hidden, c->vocab));
    CHECK(gs.recorded >= 1 && gs.replays >= NSTEP - 4 && gs.failed == 0 && gs.stale == 0);
    CHECK(R(b)->bad_ptrs == 0 && R(b)->refused == 0 && R(b)->replayed_ops > 0);
    outs_free(&got);

    /* a failed recording falls back to running the ops; a stale graph is recorded again */
    R(b)->fail_end = 1;
    CHECK_OK(script(b, 0, &got, &gs, &err), &err);
    CHECK(outs_same(&ref, &got, c->hidden, c->vocab));
    CHECKF(gs.failed == 1 && gs.recorded >= 1 && strstr(gs.first_failure, "injected"), "failed %lld: %s",
           (long long)gs.failed, gs.first_failure);
    outs_free(&got);
    R(b)->stale_in = 4; /* a replay, not the launch right after a recording */
    CHECK_OK(script(b, 0, &got, &gs, &err), &err);
    CHECK(outs_same(&ref, &got, c->hidden, c->vocab));
    CHECKF(gs.stale == 1 && gs.recorded >= 2, "stale %lld recorded %lld", (long long)gs.stale, (long long)gs.recorded);
    outs_free(&got);

    /* switched off per forward object */
    int64_t before = R(b)->replayed_ops;
    R(b)->peak = R(b)->live;
    CHECK_OK(script(b, 1, &got, &gs, &err), &err);
    CHECK(outs_same(&ref, &got, c->hidden, c->vocab));
    CHECK(gs.recorded == 0 && gs.replays == 0 && R(b)->replayed_ops == before);
    outs_free(&got);
    int64_t peak_off = R(b)->peak;

    /* switched off in the backend (EG_CUDA_GRAPHS=0): nothing recorded, and the forward
     * object holds no staging buffer for captured rows (3 captures x 16 rows x H) */
    eg_backend_free(b);
    b = rec_create(c, 16);
    if (!b) return;
    CHECK_OK(script(b, 0, &got, &gs, &err), &err);
    int64_t peak_on = R(b)->peak;
    outs_free(&got);
    eg_backend_free(b);
    b = rec_create(c, 16);
    if (!b) return;
    R(b)->disabled = 1;
    CHECK_OK(script(b, 0, &got, &gs, &err), &err);
    CHECK(outs_same(&ref, &got, c->hidden, c->vocab));
    CHECK(gs.recorded == 0 && gs.replays == 0 && gs.failed == 0 && R(b)->replayed_ops == 0);
    CHECKF(R(b)->peak == peak_off && peak_on - R(b)->peak == 4LL * 3 * 16 * c->hidden &&
               eg_forward_act_bytes(c, 16, 16, 3) - eg_forward_act_bytes(c, 16, 16, 0) == 4LL * 3 * 16 * c->hidden,
           "peak bytes: graphs on %lld, off in the backend %lld, off per forward %lld", (long long)peak_on,
           (long long)R(b)->peak, (long long)peak_off);
    CHECK(eg_forward_staged_captures((int[]){-1, 1, 4}, 3, 0, 2) == 2 &&
          eg_forward_staged_captures((int[]){-1, 1, 4}, 3, 2, 5) == 1);
    outs_free(&got);
    eg_backend_free(b);
    outs_free(&ref);
}

/* The engine, 2 pipeline stages on one recording backend, equals the CPU backend. */
typedef struct {
    int next;
    int32_t *tok[4];
    int n[4];
    float *fin[4];
} eng_ctx;

static int eng_next(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    eng_ctx *c = vc;
    static int32_t buf[4][16];
    if (c->next >= 4) return 0;
    int r = c->next++;
    for (int i = 0; i < 6 + r; i++) buf[r][i] = (int32_t)((r * 53 + i * 17 + 3) % 500);
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)r;
    q->tokens = buf[r];
    q->n_tokens = 6 + r;
    q->max_new = 10;
    q->sp.temperature = 0.7f;
    q->sp.top_p = 0.9f;
    q->rng = eg_rng_seed(4, (uint64_t)r);
    return 1;
}

static eg_status eng_done(void *vc, const eg_result *r, eg_error *err) {
    (void)err;
    eng_ctx *c = vc;
    int i = (int)r->id;
    c->n[i] = r->n_tokens;
    c->tok[i] = malloc(4 * (size_t)r->n_tokens);
    memcpy(c->tok[i], r->tokens, 4 * (size_t)r->n_tokens);
    size_t fb = 4 * (size_t)r->n_tokens * (size_t)model.cfg.hidden;
    c->fin[i] = malloc(fb);
    memcpy(c->fin[i], r->final, fb);
    return EG_OK;
}

static eg_status eng_run(eg_backend *be, eng_ctx *c, eg_forward_graph_stats *gs, eg_error *err) {
    int aux[2] = {0, 3}, stages[2] = {2, model.cfg.n_layers};
    eg_engine_opts eo = {.n_slots = 4, .max_seq_len = 128, .max_tokens = 16, .block_size = 8, .aux_layers = aux,
                         .n_aux = 2, .stage_ends = stages, .n_stages = 2};
    eg_engine *e = NULL;
    eg_status st = eg_engine_create(&model, be, &eo, &e, err);
    if (!st) st = eg_engine_run(e, eng_next, eng_done, c, err);
    if (e) eg_engine_graph_stats(e, gs);
    eg_engine_free(e);
    return st;
}

static void test_engine_stages(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eng_ctx a = {0}, b = {0};
    eg_forward_graph_stats gs;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 16, .max_seq_len = 128, .nthreads = 2};
    eg_backend *cpu = NULL;
    CHECK_OK(eg_backend_create(&model.cfg, &bo, &cpu, &err), &err);
    eg_backend *rec = rec_create(&model.cfg, 16);
    if (!cpu || !rec) return;
    CHECK_OK(eng_run(cpu, &a, &gs, &err), &err);
    CHECK_OK(eng_run(rec, &b, &gs, &err), &err);
    printf("    2 stages: recorded %lld, replays %lld, failed %lld; bad pointers %d\n", (long long)gs.recorded,
           (long long)gs.replays, (long long)gs.failed, R(rec)->bad_ptrs);
    CHECK(gs.recorded >= 2 && gs.replays > 0 && gs.failed == 0 && R(rec)->bad_ptrs == 0);
    for (int i = 0; i < 4; i++) {
        CHECKF(a.n[i] == b.n[i] && a.tok[i] && b.tok[i] && !memcmp(a.tok[i], b.tok[i], 4 * (size_t)a.n[i]) &&
                   !memcmp(a.fin[i], b.fin[i], 4 * (size_t)a.n[i] * (size_t)model.cfg.hidden),
               "request %d differs", i);
        free(a.tok[i]); free(b.tok[i]); free(a.fin[i]); free(b.fin[i]);
    }
    eg_backend_free(cpu);
    eg_backend_free(rec);
}

static void test_pos_bucket(void) {
    CHECK(eg_forward_pos_bucket(1, 1 << 20) == 256);
    CHECK(eg_forward_pos_bucket(256, 1 << 20) == 256);
    CHECK(eg_forward_pos_bucket(257, 1 << 20) == 512);
    CHECK(eg_forward_pos_bucket(2047, 1 << 20) == 2048);
    CHECK(eg_forward_pos_bucket(2049, 1 << 20) == 2560);  /* a quarter of 2048 past 2K */
    CHECK(eg_forward_pos_bucket(8193, 1 << 20) == 10240);
    CHECK(eg_forward_pos_bucket(2049, 2100) == 2100);     /* never past the cache */
    CHECK(eg_forward_pos_bucket(5000, 4000) == 5000);     /* never below max_pos */
    for (int m = 1; m < 100000; m += 97) {
        int b = eg_forward_pos_bucket(m, 1 << 30);
        CHECK(b >= m && b <= m + m / 4 + 256);
    }
}

/* The last stage holds logits for logit_rows rows only (a step asks one a sequence, or
 * k + 1 with a drafter: Kimi's 8,192-row chunk held 5.4 GB of them), a stage before it
 * none; the steps give the same bits with the smaller buffer, and a step asking more
 * rows than it holds fails, naming them. */
static int64_t created_bytes(eg_backend *b, int layer_end, int logit_rows) {
    eg_error err = {0};
    int capture[1] = {-1};
    eg_forward_opts fo = {.max_tokens = 16, .n_slots = NS, .max_seq_len = 128, .block_size = 8, .capture = capture,
                          .n_capture = 1, .layer_end = layer_end, .logit_rows = logit_rows, .no_graphs = 1};
    int64_t before = R(b)->live;
    eg_forward *f = NULL;
    CHECK_OK(eg_forward_create(&model, b, &fo, &f, &err), &err);
    int64_t made = R(b)->live - before;
    eg_forward_free(f);
    return made;
}

static void test_logit_rows(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    const eg_config *c = &model.cfg;
    int64_t V = c->vocab, L = c->n_layers;
    eg_backend *b = rec_create(c, 16);
    if (!b) return;
    int64_t all = created_bytes(b, 0, 0), three = created_bytes(b, 0, 3), over = created_bytes(b, 0, 99);
    CHECKF(all - three == 4 * (16 - 3) * V && over == all, "last stage: %lld bytes (all rows), %lld (3), %lld (99)",
           (long long)all, (long long)three, (long long)over);
    CHECK(eg_forward_act_bytes(c, 16, 16, 0) - eg_forward_act_bytes(c, 16, 3, 0) == 4 * (16 - 3) * V);
    CHECK(eg_forward_act_bytes(c, 16, 16, 0) - eg_forward_act_bytes(c, 16, 0, 0) == 4 * 16 * V);
    int64_t mid = created_bytes(b, (int)L - 1, 0), mid3 = created_bytes(b, (int)L - 1, 3);
    CHECKF(mid == mid3, "a stage before the last: %lld and %lld bytes", (long long)mid, (long long)mid3);
    /* the rows an engine asks for: one a sequence, k + 1 with k drafts, all when kept */
    CHECK(eg_forward_logit_rows(512, 16, 0, 0) == 16 && eg_forward_logit_rows(512, 16, 3, 0) == 64 &&
          eg_forward_logit_rows(512, 16, 3, 1) == 512 && eg_forward_logit_rows(512, 0, 0, 0) == 512 &&
          eg_forward_logit_rows(512, 600, 0, 0) == 512 && eg_forward_logit_rows(512, 200, 3, 0) == 512);
    outs ref = {0}, got = {0};
    eg_forward_graph_stats gs;
    CHECK_OK(script(b, 0, &ref, &gs, &err), &err);
    script_logit_rows = NS; /* the script asks at most one row a sequence */
    CHECK_OK(script(b, 0, &got, &gs, &err), &err);
    CHECK(outs_same(&ref, &got, c->hidden, c->vocab));
    outs_free(&got);
    script_logit_rows = NS - 1;
    eg_status st = script(b, 0, &got, &gs, &err);
    CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "3 logit rows asked for; the forward holds 2"), "%d: %s", st,
           err.msg);
    script_logit_rows = 0;
    outs_free(&got);
    outs_free(&ref);
    eg_backend_free(b);
}

static void test_cleanup(void) {
    if (have_model) eg_model_free(&model);
    have_model = 0;
}

static const eg_test tests[] = {
    {"pos_bucket", test_pos_bucket},
    {"logit_rows", test_logit_rows},
    {"replay_equals_ops", test_replay_equals_ops},
    {"engine_stages", test_engine_stages},
    {"cleanup", test_cleanup},
};

int main(int argc, char **argv) { return eg_test_main("engine_graphs", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv); }
