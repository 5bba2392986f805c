/* Speculative decoding tests on the fixture model tiny-a (docs/ENGINE.md, "Speculative
 * decoding"): a row of a k + 1-row chunk equals the same row decoded alone (bytes); the
 * acceptance rule (greedy, a hand-computed sampled case); greedy output with a drafter
 * that is always right, always wrong or half right is byte-identical to greedy without
 * one (tokens and captured rows), for k in {1, 2, 4}, under KV preemption and with stop
 * tokens inside accepted runs; sampled output is independent of batch composition and
 * preemption, its captured rows equal a teacher-forced pass, and the distribution of
 * the first generated tokens matches the non-speculative run's (chi-square), while a
 * deliberately broken acceptance rule fails that test. The test proposers check that
 * the engine drives them by drafter.h's protocol. */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/drafter_eagle3.h"
#include "engine/engine.h"
#include "engine/mkmodel.h"
#include "engine/ep_runtime.h"
#include "tests/check.h"
#include "tests/spec_q.h"

#define MODEL "../shared/fixtures/models/tiny-a"
#define MAX_SEQ 128
#define MAXREQ 4096

static eg_model model;
static int have_model;

static void load_model(void) {
    if (have_model) return;
    eg_error err = {0};
    CHECK_OK(eg_model_load(MODEL, &model, &err), &err);
    have_model = err.code == EG_OK;
}

/* ---- results of a run ---------------------------------------------------------- */

typedef struct results {
    int n;
    int32_t *tokens[MAXREQ];
    int n_tokens[MAXREQ], n_gen[MAXREQ], prompt_len[MAXREQ];
    eg_finish finish[MAXREQ];
    int64_t done_step[MAXREQ];          /* the engine's step count when it finished */
    float *aux[MAXREQ], *final[MAXREQ]; /* F32 capture; NULL when not kept */
} results;

static void free_results(results *r) {
    for (int i = 0; i < MAXREQ; i++) { free(r->tokens[i]); free(r->aux[i]); free(r->final[i]); }
    memset(r, 0, sizeof *r);
}

#define N_AUX 3
static const int aux_layers[N_AUX] = {-1, 1, 4};

/* ---- requests ------------------------------------------------------------------- */

static int32_t prompt_tok(int r, int i) { return (int32_t)((r * 131 + i * 37 + 11) % 500); }
static int prompt_len(int r) { return 3 + r * 9; }

typedef struct run_cfg {
    int n_req;               /* requests 0..n_req-1 */
    int same_prompt;         /* >= 0: every request has prompt same_prompt (distribution runs) */
    int only;                /* >= 0: just that request */
    const int32_t *forced[MAXREQ]; /* teacher-forced sequences (max_new 0), or NULL */
    int forced_len[MAXREQ];
    int max_new;
    float temp, top_p;
    int top_k;
    uint64_t seed;
    int32_t stop;            /* -1 none */
    int slots, max_tokens;
    int64_t kv_blocks;
    int64_t host_kv;
    eg_kv_policy policy;
    int keep_rows;           /* keep aux/final of each result */
    eg_drafter *drafter;
    int k;
    eg_spec_rule rule;
    const int *stage_ends;   /* stages on the calling thread */
    int n_stages;
    int capture_bf16;        /* rows kept rounded (results keep them widened back to F32) */
    int want_logits;
    int ep;                  /* > 1: expert-parallel ranks (ep_runtime.h), rank r driving rank_drafters[r] */
    eg_drafter *const *rank_drafters;
    int threaded;            /* stage_ends on threads of their own (a backend per stage) */
    int host_threads;        /* eg_engine_opts.host_threads (0: its default) */
    int micro_batches;
    int spec_probs;          /* eg_engine_opts.spec_probs */
    int nan_probs;           /* > 0: the backend's token_probs answer NaN on every nan_probs-th
                                row asked (one engine, stages on the calling thread) */
    int nan_kept;            /* > 0: and its kept_probs -1 on every nan_kept-th row asked */
    int no_kept;             /* the backend offers no kept_probs (one engine, not threaded) */
    int mix;                 /* odd requests sample at temp_odd, even ones at temp */
    float temp_odd;
} run_cfg;

typedef struct run_ctx {
    const run_cfg *c;
    eg_engine *e;       /* one engine's run (not ep): done_step recorded */
    int next;
    results *out;
    int32_t buf[MAX_SEQ];
} run_ctx;

static int next_req(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    run_ctx *x = vc;
    const run_cfg *c = x->c;
    if (x->next >= (c->only >= 0 ? 1 : c->n_req)) return 0;
    int r = c->only >= 0 ? c->only : x->next;
    x->next++;
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)r;
    if (c->forced[r]) {
        q->tokens = c->forced[r];
        q->n_tokens = c->forced_len[r];
        q->max_new = 0;
    } else {
        int pr = c->same_prompt >= 0 ? c->same_prompt : r;
        for (int i = 0; i < prompt_len(pr); i++) x->buf[i] = prompt_tok(pr, i);
        q->tokens = x->buf;
        q->n_tokens = prompt_len(pr);
        q->max_new = c->max_new;
    }
    q->sp.temperature = c->mix && (r & 1) ? c->temp_odd : c->temp;
    q->sp.top_p = c->top_p;
    q->sp.top_k = c->top_k;
    q->rng = eg_rng_seed(c->seed, (uint64_t)r);
    q->stop_ids = &c->stop;
    q->n_stop = c->stop >= 0;
    return 1;
}

static eg_status on_done(void *vc, const eg_result *r, eg_error *err) {
    (void)err;
    run_ctx *x = vc;
    results *o = x->out;
    int i = (int)r->id;
    o->n_tokens[i] = r->n_tokens;
    o->n_gen[i] = r->n_generated;
    o->prompt_len[i] = r->prompt_len;
    o->finish[i] = r->finish;
    if (x->e) {
        eg_engine_stats es;
        eg_engine_get_stats(x->e, &es);
        o->done_step[i] = es.steps;
    }
    o->tokens[i] = malloc(4 * (size_t)r->n_tokens);
    memcpy(o->tokens[i], r->tokens, 4 * (size_t)r->n_tokens);
    if (x->c->keep_rows) {
        size_t H = (size_t)model.cfg.hidden, na = (size_t)r->n_tokens * N_AUX * H, nf = (size_t)r->n_tokens * H;
        o->aux[i] = malloc(4 * na);
        o->final[i] = malloc(4 * nf);
        if (x->c->capture_bf16) {
            for (size_t j = 0; j < na; j++) o->aux[i][j] = eg_bf16_to_f32(r->aux_bf16[j]);
            for (size_t j = 0; j < nf; j++) o->final[i][j] = eg_bf16_to_f32(r->final_bf16[j]);
        } else {
            memcpy(o->aux[i], r->aux, 4 * na);
            memcpy(o->final[i], r->final, 4 * nf);
        }
    }
    if (x->c->want_logits) { /* every position's logits: the generated tokens are their argmax (greedy) */
        CHECK(r->logits != NULL);
        if (r->logits && !(x->c->temp > 0))
            for (int t = r->prompt_len; t < r->n_tokens; t++) {
                const float *l = r->logits + (size_t)(t - 1) * (size_t)model.cfg.vocab;
                int32_t best = 0;
                for (int v = 1; v < model.cfg.vocab; v++)
                    if (l[v] > l[best]) best = v;
                CHECK(best == r->tokens[t]);
            }
    }
    o->n++;
    CHECK(r->n_tokens == r->prompt_len + r->n_generated && r->n_generated <= x->c->max_new);
    return EG_OK;
}

static eg_engine_stats last_stats;

/* The CPU backend with a token_probs that leaves every nan_every-th row it is asked for to
 * the host (NaN), as a GPU does with a row its first M candidates cannot settle. */
static eg_backend_ops nan_ops;
static eg_status (*nan_inner)(eg_backend *, const float *, int, int, const eg_sample_params *, const int32_t *,
                              double *, eg_error *);
static int nan_every;
static int64_t nan_asked, nan_given;
static eg_status nan_token_probs(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *p,
                                 const int32_t *tok, double *out, eg_error *err) {
    eg_status st = nan_inner(b, logits, N, V, p, tok, out, err);
    for (int i = 0; !st && i < N; i++)
        if (tok[i] >= 0 && nan_asked++ % nan_every == 0) {
            out[i] = NAN;
            nan_given++;
        }
    return st;
}

/* and a kept_probs that leaves every kept_every-th row to the host (-1), as a GPU does
 * with a kept set its top-M selection cannot settle */
static eg_status (*kept_inner)(eg_backend *, const float *, const int32_t *, int, int, const eg_sample_params *, int,
                               int32_t *, int32_t *, double *, eg_error *);
static int kept_every;
static int64_t kept_asked, kept_given;
static eg_status nan_kept_probs(eg_backend *b, const float *logits, const int32_t *rows, int N, int V,
                                const eg_sample_params *p, int cap, int32_t *n_out, int32_t *ids, double *probs,
                                eg_error *err) {
    eg_status st = kept_inner(b, logits, rows, N, V, p, cap, n_out, ids, probs, err);
    for (int i = 0; !st && i < N; i++)
        if (kept_asked++ % kept_every == 0) {
            n_out[i] = -1;
            kept_given++;
        }
    return st;
}

static eg_status run(const run_cfg *c, results *out, eg_error *err) {
    eg_backend *be = NULL, *sbe[8] = {0};
    eg_engine *e = NULL;
    eg_ep_runtime *ep = NULL;
    memset(out, 0, sizeof *out);
    eg_backend_opts bo = {.name = "cpu", .max_tokens = c->max_tokens, .max_seq_len = MAX_SEQ, .nthreads = 1};
    eg_engine_opts eo = {.n_slots = c->slots, .max_seq_len = MAX_SEQ, .max_tokens = c->max_tokens, .block_size = 8,
                         .kv_blocks = c->kv_blocks, .aux_layers = aux_layers, .n_aux = N_AUX,
                         .kv_policy = c->policy, .host_kv_bytes = c->host_kv, .check_recompute = 1,
                         .drafter = c->drafter, .draft_tokens = c->k, .spec_rule = c->rule,
                         .stage_ends = c->stage_ends, .n_stages = c->n_stages, .capture_bf16 = c->capture_bf16,
                         .want_logits = c->want_logits, .micro_batches = c->micro_batches,
                         .host_threads = c->host_threads, .spec_probs = c->spec_probs};
    eg_status st = EG_OK;
    run_ctx x = {.c = c, .out = out};
    if (c->ep > 1) {
        eo.drafter = NULL;
        if (!(st = eg_ep_runtime_create(&model, &bo, &eo, c->ep, c->threaded, c->rank_drafters, &ep, err))) {
            st = eg_ep_runtime_run(ep, next_req, on_done, &x, err);
            eg_ep_runtime_stats(ep, &last_stats);
        }
        eg_ep_runtime_free(ep);
        return st;
    }
    if (c->threaded) {
        for (int k = 0; k < c->n_stages && k < 8 && !st; k++) st = eg_backend_create(&model.cfg, &bo, &sbe[k], err);
        eo.stage_backends = sbe;
    } else {
        st = eg_backend_create(&model.cfg, &bo, &be, err);
        kept_asked = kept_given = 0;
        if (!st && (c->nan_probs > 0 || c->nan_kept > 0 || c->no_kept)) {
            nan_ops = *be->ops;
            if (c->nan_probs > 0) {
                nan_inner = be->ops->token_probs;
                nan_ops.token_probs = nan_token_probs;
                nan_every = c->nan_probs;
                nan_asked = nan_given = 0;
            }
            if (c->nan_kept > 0) {
                kept_inner = be->ops->kept_probs;
                nan_ops.kept_probs = nan_kept_probs;
                kept_every = c->nan_kept;
            }
            if (c->no_kept) nan_ops.kept_probs = NULL;
            be->ops = &nan_ops;
        }
    }
    if (!st) st = eg_engine_create(&model, c->threaded ? sbe[0] : be, &eo, &e, err);
    if (!st) {
        x.e = e;
        st = eg_engine_run(e, next_req, on_done, &x, err);
        eg_engine_get_stats(e, &last_stats);
    }
    eg_engine_free(e);
    eg_backend_free(be);
    for (int k = 0; k < 8; k++) eg_backend_free(sbe[k]);
    return st;
}

static run_cfg base_cfg(void) {
    run_cfg c;
    memset(&c, 0, sizeof c);
    c.n_req = 5;
    c.same_prompt = -1;
    c.only = -1;
    c.max_new = 24;
    c.top_p = 1.0f;
    c.seed = 42;
    c.stop = -1;
    c.slots = 3;
    c.max_tokens = 16;
    c.keep_rows = 1;
    c.k = 2;
    return c;
}

static int same_result(const results *a, const results *b, int i) {
    if (!a->tokens[i] || !b->tokens[i] || a->n_tokens[i] != b->n_tokens[i] || a->finish[i] != b->finish[i]) return 0;
    size_t n = (size_t)a->n_tokens[i], H = (size_t)model.cfg.hidden;
    if (memcmp(a->tokens[i], b->tokens[i], 4 * n)) return 0;
    if (!a->aux[i] || !b->aux[i]) return 1;
    return !memcmp(a->aux[i], b->aux[i], 4 * n * N_AUX * H) && !memcmp(a->final[i], b->final[i], 4 * n * H);
}

/* ---- test proposers (drafter.h) ------------------------------------------------- */

typedef enum { P_RIGHT, P_WRONG, P_HALF, P_SAMPLED } prop_mode;

typedef struct test_prop {
    eg_drafter d;
    prop_mode mode;
    int aux[2];                 /* target layers it reads: 1 and 4 (engine capture indices 1, 2) */
    const results *ref;         /* greedy modes: the reference greedy run (continuations, rows) */
    const double *marg;         /* P_SAMPLED: [n_marg][V] the proposal distribution per generated index */
    int n_marg;
    int prompt;                 /* P_SAMPLED: the prompt length (every request alike) */
    int V, H;
    int *len;                   /* [S] positions held per slot */
    int32_t *nt;                /* [S][MAX_SEQ] next tokens fed per position */
    float *rows;                /* [S][MAX_SEQ][2][H] aux rows fed */
    int bf16_rows;              /* the engine keeps BF16 rows: compare with the reference rounded */
    int64_t violations;         /* protocol breaches seen */
    int64_t row_mismatch;       /* fed rows that differ from the reference run's captured rows */
    int64_t proposals;
} test_prop;

static int find_ref(const test_prop *p, const int32_t *seq, int n_seq) {
    for (int r = 0; r < MAXREQ; r++)
        if (p->ref->tokens[r] && p->ref->n_tokens[r] >= n_seq && !memcmp(p->ref->tokens[r], seq, 4 * (size_t)n_seq))
            return r;
    return -1;
}

static eg_status tp_extend(eg_drafter *d, int slot, int pos0, int n, const float *aux, const int32_t *next,
                           eg_error *err) {
    (void)err;
    test_prop *p = d->impl;
    if (slot < 0 || slot >= d->info.n_slots || pos0 != p->len[slot] || n < 1 || pos0 + n > MAX_SEQ || !aux) {
        p->violations++;
        return EG_OK;
    }
    for (int t = 0; t < n; t++) {
        p->nt[slot * MAX_SEQ + pos0 + t] = next[t];
        memcpy(p->rows + ((size_t)slot * MAX_SEQ + (size_t)(pos0 + t)) * 2 * (size_t)p->H, aux + (size_t)t * 2 * (size_t)p->H,
               sizeof(float) * 2 * (size_t)p->H);
    }
    p->len[slot] += n;
    return EG_OK;
}

static eg_status tp_propose(eg_drafter *d, int slot, const int32_t *seq, int n_seq, int k, const eg_sample_params *sp,
                            uint64_t *rng, int32_t *draft, eg_spec_q *q, eg_error *err) {
    (void)err;
    test_prop *p = d->impl;
    p->proposals++;
    if (slot < 0 || slot >= d->info.n_slots || p->len[slot] != n_seq - 1 || k < 1) {
        p->violations++;
        return eg_fail(err, EG_ERR_INVALID, "test proposer: slot %d holds %d positions, asked after %d tokens", slot,
                       slot >= 0 && slot < d->info.n_slots ? p->len[slot] : -1, n_seq);
    }
    for (int t = 0; t + 1 < n_seq; t++)
        if (p->nt[slot * MAX_SEQ + t] != seq[t + 1]) p->violations++;
    const int V = p->V;
    if (p->mode == P_SAMPLED) {
        if (!(sp->temperature > 0) || !q) { p->violations++; return EG_OK; }
        for (int i = 0; i < k; i++) {
            int g = n_seq + i - p->prompt;
            if (g >= p->n_marg) g = p->n_marg - 1;
            const double *m = p->marg + (size_t)g * V;
            int n = 0;
            for (int v = 0; v < V; v++)
                if (m[v] > 0) {
                    q->id[(size_t)i * (size_t)q->cap + (size_t)n] = v;
                    q->p[(size_t)i * (size_t)q->cap + (size_t)n++] = m[v];
                }
            q->n[i] = n;
            draft[i] = eg_spec_draw(m, V, rng);
        }
    } else {
        int r = find_ref(p, seq, n_seq);
        if (r < 0) { p->violations++; return EG_OK; }
        /* the rows fed are the target's own (the reference run captured the same) */
        size_t H = (size_t)p->H;
        for (int t = 0; t + 1 < n_seq; t++)
            for (int a = 0; a < 2; a++) {
                const float *got = p->rows + (((size_t)slot * MAX_SEQ + (size_t)t) * 2 + (size_t)a) * H;
                const float *want = p->ref->aux[r] + ((size_t)t * N_AUX + (size_t)(a + 1)) * H;
                for (size_t h = 0; h < H; h++)
                    if (got[h] != (p->bf16_rows ? eg_bf16_round(want[h]) : want[h])) { p->row_mismatch++; break; }
            }
        for (int i = 0; i < k; i++) {
            int at = n_seq + i;
            int32_t right = at < p->ref->n_tokens[r] ? p->ref->tokens[r][at] : 0;
            int ok = p->mode == P_RIGHT || (p->mode == P_HALF && at % 2 == 0);
            draft[i] = ok ? right : (right + 1) % V;
            if (q) {
                q->n[i] = 1;
                q->id[(size_t)i * (size_t)q->cap] = draft[i];
                q->p[(size_t)i * (size_t)q->cap] = 1;
            }
        }
    }
    /* a proposal may grow the state by k - 1 speculative positions: the engine must cut them */
    p->len[slot] += k - 1;
    return EG_OK;
}

static void tp_truncate(eg_drafter *d, int slot, int len) {
    test_prop *p = d->impl;
    if (slot < 0 || slot >= d->info.n_slots || len < 0 || len > p->len[slot]) {
        p->violations++;
        return;
    }
    p->len[slot] = len;
}

static void tp_destroy(eg_drafter *d) {
    test_prop *p = d->impl;
    free(p->len); free(p->nt); free(p->rows);
    free(p);
}

static const eg_drafter_vtbl tp_vtbl = {tp_extend, tp_propose, tp_truncate, tp_destroy, NULL, NULL};

static test_prop *prop_new(prop_mode mode, int n_slots) {
    test_prop *p = calloc(1, sizeof *p);
    p->mode = mode;
    p->aux[0] = 1;
    p->aux[1] = 4;
    p->V = model.cfg.vocab;
    p->H = model.cfg.hidden;
    p->len = calloc((size_t)n_slots, sizeof *p->len);
    p->nt = calloc((size_t)n_slots * MAX_SEQ, sizeof *p->nt);
    p->rows = calloc((size_t)n_slots * MAX_SEQ * 2 * (size_t)p->H, sizeof *p->rows);
    static const char *names[] = {"always-right", "always-wrong", "half-right", "sampled"};
    p->d = (eg_drafter){.vt = &tp_vtbl, .impl = p,
                        .info = {.kind = names[mode], .n_aux = 2, .aux_layers = p->aux, .hidden = p->H,
                                 .target_vocab = p->V, .n_slots = n_slots, .max_seq_len = MAX_SEQ}};
    return p;
}

/* ---- the first check: a chunk row equals the decoded row ------------------------ */

/* Slot 0 decodes positions P..P+4 one token per step; slot 1 runs the same five tokens
 * as one 5-row chunk (a verify pass): every captured layer, the final state and the
 * logits of each row are the same bytes. */
static void test_chunk_row_equals_decode(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_backend *be = NULL;
    eg_forward *f = NULL;
    const int H = model.cfg.hidden, V = model.cfg.vocab, L = model.cfg.n_layers;
    int cap[6] = {-1, 0, 1, 2, 3, 4};
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 32, .max_seq_len = 64, .nthreads = 2};
    CHECK_OK(eg_backend_create(&model.cfg, &bo, &be, &err), &err);
    eg_forward_opts fo = {.max_tokens = 32, .n_slots = 2, .max_seq_len = 64, .block_size = 8, .capture = cap,
                          .n_capture = L + 1};
    if (be) CHECK_OK(eg_forward_create(&model, be, &fo, &f, &err), &err);
    if (!f) { eg_backend_free(be); return; }
    enum { P = 21, K1 = 5 };
    int32_t tok[P + K1], pos[32], slot[32], rows[32];
    for (int i = 0; i < P + K1; i++) tok[i] = prompt_tok(2, i);
    size_t NC = (size_t)(L + 1);
    float *capd = calloc(NC * 32 * (size_t)H, 4), *capc = calloc(NC * 32 * (size_t)H, 4);
    float *find = calloc(32 * (size_t)H, 4), *finc = calloc(32 * (size_t)H, 4);
    float *logd = calloc(32 * (size_t)V, 4), *logc = calloc(32 * (size_t)V, 4);
    float *cap1 = calloc(NC * 32 * (size_t)H, 4);
    for (int s = 0; s < 2; s++) {
        CHECK_OK(eg_kv_reserve(eg_forward_kv(f), s, P + K1, &err), &err);
        for (int t = 0; t < P; t++) { pos[t] = t; slot[t] = s; }
        eg_step st = {.T = P, .tokens = tok, .pos = pos, .slot = slot};
        CHECK_OK(eg_forward_step(f, &st, &err), &err);
    }
    for (int j = 0; j < K1; j++) { /* slot 0: one row per step */
        pos[0] = P + j;
        slot[0] = 0;
        rows[0] = 0;
        eg_step st = {.T = 1, .tokens = tok + P + j, .pos = pos, .slot = slot, .n_logits = 1, .logit_rows = rows,
                      .logits = logd + (size_t)j * V, .capture = cap1, .final_hidden = find + (size_t)j * H};
        CHECK_OK(eg_forward_step(f, &st, &err), &err);
        for (size_t c = 0; c < NC; c++) memcpy(capd + (c * K1 + (size_t)j) * H, cap1 + c * H, 4 * (size_t)H);
    }
    for (int j = 0; j < K1; j++) { pos[j] = P + j; slot[j] = 1; rows[j] = j; }
    eg_step st = {.T = K1, .tokens = tok + P, .pos = pos, .slot = slot, .n_logits = K1, .logit_rows = rows,
                  .logits = logc, .capture = capc, .final_hidden = finc};
    CHECK_OK(eg_forward_step(f, &st, &err), &err);
    int bad_cap = 0, bad_fin = 0, bad_log = 0;
    for (int j = 0; j < K1; j++) {
        for (size_t c = 0; c < NC; c++)
            bad_cap += memcmp(capd + (c * K1 + (size_t)j) * H, capc + (c * K1 + (size_t)j) * H, 4 * (size_t)H) != 0;
        bad_fin += memcmp(find + (size_t)j * H, finc + (size_t)j * H, 4 * (size_t)H) != 0;
        bad_log += memcmp(logd + (size_t)j * V, logc + (size_t)j * V, 4 * (size_t)V) != 0;
    }
    CHECKF(bad_cap == 0 && bad_fin == 0 && bad_log == 0,
           "chunk vs decode: %d captured rows, %d final rows, %d logit rows differ", bad_cap, bad_fin, bad_log);
    free(capd); free(capc); free(find); free(finc); free(logd); free(logc); free(cap1);
    eg_forward_free(f);
    eg_backend_free(be);
}

/* ---- eg_spec_verify unit tests -------------------------------------------------- */

static void test_verify_greedy(void) {
    enum { V = 6, K = 3 };
    eg_error err = {0};
    eg_spec_scratch *sc = NULL;
    CHECK_OK(eg_spec_scratch_create(V, &sc, &err), &err);
    if (!sc) return;
    /* argmax per row: 2, 4, 1 (a tie of ids 1 and 5: the lower wins), 0 */
    float lg[(K + 1) * V] = {0, 1, 3, 0, 0, 0, /**/ 0, 0, 0, 1, 5, 0, /**/ 0, 7, 2, 0, 0, 7, /**/ 9, 0, 0, 0, 0, 0};
    eg_sample_params sp = {.temperature = 0, .top_p = 1};
    uint64_t rng = 7, rng0 = 7;
    int na = -1;
    int32_t next = -1;
    int32_t all[K] = {2, 4, 1}, two[K] = {2, 4, 5}, none[K] = {3, 4, 1};
    eg_spec_verify(sc, lg, V, &sp, all, NULL, NULL, K, EG_SPEC_EXACT, &rng, &na, &next);
    CHECK(na == 3 && next == 0);
    eg_spec_verify(sc, lg, V, &sp, two, NULL, NULL, K, EG_SPEC_EXACT, &rng, &na, &next);
    CHECK(na == 2 && next == 1);
    eg_spec_verify(sc, lg, V, &sp, none, NULL, NULL, K, EG_SPEC_EXACT, &rng, &na, &next);
    CHECK(na == 0 && next == 2);
    CHECK(rng == rng0); /* greedy draws nothing */
    eg_spec_verify(sc, lg, V, &sp, none, NULL, NULL, K, EG_SPEC_BROKEN_ACCEPT, &rng, &na, &next);
    CHECK(na == 3 && next == 0);
    eg_spec_scratch_free(sc);
    eg_spec_scratch_free(NULL);
}

/* p = (0.5, 0.3, 0.2) (logits log p, temperature 1); a draft x = 1 proposed with
 * q = (0.2, 0.6, 0.2) is accepted with probability p1/q1 = 1/2 (exactly when
 * u * 0.6 < 0.3 for the first uniform u of the state); a rejection emits from
 * norm(max(0, p - q)) = (1, 0, 0): always token 0. A draft x = 0 (q0 = 0.2 < p0) is
 * always accepted. Overall the first token is distributed as p. top-k / top-p cut as
 * the sampler does. */
static void test_verify_sampled(void) {
    enum { V = 3 };
    eg_error err = {0};
    eg_spec_scratch *sc = NULL;
    CHECK_OK(eg_spec_scratch_create(V, &sc, &err), &err);
    if (!sc) return;
    float lg[2 * V] = {logf(0.5f), logf(0.3f), logf(0.2f), 0, 0, 0};
    eg_sample_params sp = {.temperature = 1, .top_p = 1};
    double q[V] = {0.2, 0.6, 0.2}, pr[V];
    eg_spec_q sq = tq_alloc(1, V);
    tq_pack(q, 1, V, &sq);
    eg_spec_probs(sc, lg, V, &sp, pr);
    CHECK(fabs(pr[0] - 0.5) < 1e-6 && fabs(pr[1] - 0.3) < 1e-6 && fabs(pr[2] - 0.2) < 1e-6);
    eg_sample_params k2 = {.temperature = 1, .top_p = 1, .top_k = 2}, p7 = {.temperature = 1, .top_p = 0.7f};
    eg_spec_probs(sc, lg, V, &k2, pr);
    CHECK(fabs(pr[0] - 0.625) < 1e-6 && fabs(pr[1] - 0.375) < 1e-6 && pr[2] == 0);
    eg_spec_probs(sc, lg, V, &p7, pr);
    CHECK(fabs(pr[0] - 0.625) < 1e-6 && fabs(pr[1] - 0.375) < 1e-6 && pr[2] == 0);
    enum { N = 200000 };
    int32_t x1 = 1, x0 = 0;
    int acc = 0, first[V] = {0}, bad = 0, acc0 = 0;
    for (int t = 0; t < N; t++) {
        uint64_t rng = eg_rng_seed(99, (uint64_t)t), peek = rng;
        double u = eg_rng_uniform(&peek);
        int na;
        int32_t next;
        eg_spec_verify(sc, lg, V, &sp, &x1, &sq, NULL, 1, EG_SPEC_EXACT, &rng, &na, &next);
        bad += (na == 1) != (u * 0.6 < 0.3);
        if (na == 0) bad += next != 0;
        acc += na;
        rng = eg_rng_seed(7, (uint64_t)t);
        eg_spec_verify(sc, lg, V, &sp, &x0, &sq, NULL, 1, EG_SPEC_EXACT, &rng, &na, &next);
        acc0 += na;
        /* a draft drawn from q: the emitted token is distributed as p */
        rng = eg_rng_seed(5, (uint64_t)t);
        int32_t x = eg_spec_draw(q, V, &rng);
        eg_spec_verify(sc, lg, V, &sp, &x, &sq, NULL, 1, EG_SPEC_EXACT, &rng, &na, &next);
        first[na ? x : next]++;
    }
    CHECK(bad == 0);
    CHECK(acc0 == N);
    /* binomial: 5 sigma bounds */
    double pa = (double)acc / N;
    CHECKF(fabs(pa - 0.5) < 5 * sqrt(0.25 / N), "accept rate %g, expected 0.5", pa);
    for (int v = 0; v < V; v++) {
        double pv = v == 0 ? 0.5 : v == 1 ? 0.3 : 0.2, f = (double)first[v] / N;
        CHECKF(fabs(f - pv) < 5 * sqrt(pv * (1 - pv) / N), "token %d: frequency %g, p %g", v, f, pv);
    }
    tq_free(&sq);
    eg_spec_scratch_free(sc);
}

/* A draft its own q gives no probability (a drafter whose logits row was NaN draws id 0
 * and leaves its q row empty): tested as a deterministic proposal, the emitted token is
 * distributed as p by every path (the whole rule, accept + finish from the row, accept +
 * finish from the kept set), and eg_spec_no_q says so. Testing it against q(x) = 0 instead
 * accepted it whenever p(x) > 0: token 0 every time. */
static void test_verify_no_q(void) {
    enum { V = 3, N = 200000 };
    eg_error err = {0};
    eg_spec_scratch *sc = NULL;
    CHECK_OK(eg_spec_scratch_create(V, &sc, &err), &err);
    if (!sc) return;
    float lg[V] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    const double p[V] = {0.5, 0.3, 0.2};
    eg_sample_params sp = {.temperature = 1, .top_p = 1};
    const int32_t kid[V] = {2, 0, 1};
    const double kp[V] = {0.2, 0.5, 0.3};
    const double qrow[V] = {0, 1, 0}; /* case 1: a row without the draft */
    for (int c = 0; c < 2; c++) {
        eg_spec_q sq = tq_alloc(1, V);
        if (c == 1) tq_pack(qrow, 1, V, &sq); /* case 0: the row left empty (n 0) */
        const int32_t x = c == 0 ? 0 : 2;
        CHECK(eg_spec_no_q(&sq, 0, x) && !eg_spec_no_q(NULL, 0, x));
        int got[3][V] = {{0}};
        for (int t = 0; t < N; t++) {
            int na, rejected;
            int32_t next;
            uint64_t rng = eg_rng_seed(11 + c, (uint64_t)t), r2 = rng, r3 = rng;
            float row2[2 * V];
            memcpy(row2, lg, sizeof lg);
            memcpy(row2 + V, lg, sizeof lg);
            eg_spec_verify(sc, row2, V, &sp, &x, &sq, NULL, 1, EG_SPEC_EXACT, &rng, &na, &next);
            got[0][na ? x : next]++;
            int n = eg_spec_accept(&p[x], &sq, &x, 1, EG_SPEC_EXACT, &r2, &rejected);
            got[1][n ? x : eg_spec_finish(sc, lg, V, &sp, &x, &sq, 0, rejected, &r2)]++;
            n = eg_spec_accept(&p[x], &sq, &x, 1, EG_SPEC_EXACT, &r3, &rejected);
            got[2][n ? x : eg_spec_finish_kept(sc, kid, kp, V, &x, &sq, 0, &r3)]++;
        }
        for (int w = 0; w < 3; w++)
            for (int v = 0; v < V; v++) {
                double f = (double)got[w][v] / N;
                CHECKF(fabs(f - p[v]) < 5 * sqrt(p[v] * (1 - p[v]) / N),
                       "case %d, path %d: token %d frequency %g, p %g", c, w, v, f, p[v]);
            }
        tq_free(&sq);
    }
    eg_spec_scratch_free(sc);
}

/* ---- greedy: byte-identical with any drafter ------------------------------------ */

static void test_greedy_identical(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0}, b = {0};
    run_cfg c = base_cfg();
    CHECK_OK(run(&c, &base, &err), &err);
    CHECK(base.n == 5);
    int64_t base_steps = last_stats.steps;
    const int ks[3] = {1, 2, 4};
    for (int mode = P_RIGHT; mode <= P_HALF; mode++)
        for (int ki = 0; ki < 3; ki++) {
            test_prop *p = prop_new((prop_mode)mode, c.slots);
            p->ref = &base;
            run_cfg s = c;
            s.drafter = &p->d;
            s.k = ks[ki];
            CHECK_OK(run(&s, &b, &err), &err);
            for (int r = 0; r < 5; r++)
                CHECKF(same_result(&base, &b, r), "%s k=%d: request %d differs", p->d.info.kind, s.k, r);
            CHECKF(p->violations == 0 && p->row_mismatch == 0, "%s k=%d: %lld protocol breaches, %lld rows differ",
                   p->d.info.kind, s.k, (long long)p->violations, (long long)p->row_mismatch);
            CHECK(last_stats.verify_steps > 0 && last_stats.drafted >= last_stats.verify_steps);
            if (mode == P_RIGHT) CHECK(last_stats.accepted == last_stats.drafted);
            if (mode == P_WRONG) CHECK(last_stats.accepted == 0);
            if (mode == P_HALF) CHECK(last_stats.accepted > 0 && last_stats.accepted < last_stats.drafted);
            /* every generated token but the first comes from a verify step or a plain
             * decode row (k capped near max_new) */
            CHECK(last_stats.decode_tokens == 5 * 24);
            printf("    %s k=%d: %lld steps (without drafter %lld), %lld verify steps, %.2f accepted drafts and %.2f "
                   "tokens per verify step\n", p->d.info.kind, s.k, (long long)last_stats.steps, (long long)base_steps,
                   (long long)last_stats.verify_steps, (double)last_stats.accepted / (double)last_stats.verify_steps,
                   (double)last_stats.spec_tokens / (double)last_stats.verify_steps);
            if (mode == P_RIGHT && s.k == 4)
                CHECKF(last_stats.steps * 2 < 5 * 24 + 5 * 4, "always right, k=4: %lld steps", (long long)last_stats.steps);
            free_results(&b);
            eg_drafter_free(&p->d);
        }
    free_results(&base);
}

/* A stop token inside an accepted run ends the sequence there; KV pressure preempts
 * (recompute and swap) sequences mid-speculation: the same bytes as without drafter. */
static void test_greedy_stop_and_preempt(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results ref = {0}, base = {0}, b = {0};
    run_cfg c = base_cfg();
    c.max_new = 40;
    CHECK_OK(run(&c, &ref, &err), &err);
    /* stop: a token request 4 generates at its 6th step (with k 4 its first verify step's
     * bonus token), then at its 3rd (that step's second draft: the two after it are cut) */
    run_cfg cs = c;
    for (int at = 5; at >= 2; at -= 3) {
    cs.stop = ref.tokens[4] ? ref.tokens[4][prompt_len(4) + at] : 0;
    CHECK_OK(run(&cs, &base, &err), &err);
    int stopped = 0;
    for (int r = 0; r < 5; r++) stopped += base.finish[r] == EG_FINISH_STOP;
    CHECK(stopped >= 1);
    for (int mode = P_RIGHT; mode <= P_HALF; mode += 2) {
        test_prop *p = prop_new((prop_mode)mode, cs.slots);
        p->ref = &ref;
        run_cfg s = cs;
        s.drafter = &p->d;
        s.k = 4;
        CHECK_OK(run(&s, &b, &err), &err);
        for (int r = 0; r < 5; r++)
            CHECKF(same_result(&base, &b, r), "stop %d, %s: request %d differs (gen %d vs %d)", cs.stop, p->d.info.kind, r,
                   b.n_gen[r], base.n_gen[r]);
        CHECK(p->violations == 0 && p->row_mismatch == 0);
        /* a step commits its accepted drafts and one more token, except a stopping
         * sequence's last step when the stop was a draft: the drafts after it are not
         * counted as accepted (they were never committed) */
        int64_t extra = last_stats.spec_tokens - last_stats.accepted;
        CHECKF(extra >= last_stats.verify_steps - stopped && extra <= last_stats.verify_steps,
               "%s: %lld tokens committed, %lld drafts accepted, %lld verify steps, %d stopped", p->d.info.kind,
               (long long)last_stats.spec_tokens, (long long)last_stats.accepted, (long long)last_stats.verify_steps,
               stopped);
        free_results(&b);
        eg_drafter_free(&p->d);
    }
    free_results(&base);
    }
    /* a small pool: 4 slots, 12 blocks of 8 (the longest sequence, 39 + 40, takes 10) */
    const struct { int64_t host; int k, chunk; prop_mode mode; } cases[] = {
        {0, 2, 16, P_RIGHT}, {0, 4, 5, P_HALF}, {(int64_t)1 << 40, 4, 16, P_RIGHT}, {(int64_t)1 << 40, 1, 9, P_HALF},
        {0, 4, 16, P_WRONG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_prop *p = prop_new(cases[i].mode, 4);
        p->ref = &ref;
        run_cfg s = c;
        s.slots = 4;
        s.kv_blocks = 12;
        s.host_kv = cases[i].host;
        s.max_tokens = cases[i].chunk;
        s.drafter = &p->d;
        s.k = cases[i].k;
        CHECK_OK(run(&s, &b, &err), &err);
        for (int r = 0; r < 5; r++) CHECKF(same_result(&ref, &b, r), "pool case %zu: request %d differs", i, r);
        CHECKF(last_stats.preemptions >= 2, "pool case %zu: %lld preemptions", i, (long long)last_stats.preemptions);
        CHECKF(last_stats.buffer_sets <= 4, "pool case %zu: %lld buffer sets for 4 slots", i, (long long)last_stats.buffer_sets);
        if (!cases[i].host) CHECK(last_stats.recomputed_tokens > 0);
        else CHECK(last_stats.swap_outs > 0);
        CHECKF(p->violations == 0 && p->row_mismatch == 0, "pool case %zu: %lld breaches, %lld rows differ", i,
               (long long)p->violations, (long long)p->row_mismatch);
        free_results(&b);
        eg_drafter_free(&p->d);
    }
    /* the reserve policy: the reservation (prompt + max_new) covers every verify chunk */
    {
        test_prop *p = prop_new(P_HALF, 4);
        p->ref = &ref;
        run_cfg s = c;
        s.slots = 4;
        s.kv_blocks = 12;
        s.policy = EG_KV_RESERVE;
        s.drafter = &p->d;
        s.k = 4;
        CHECK_OK(run(&s, &b, &err), &err);
        for (int r = 0; r < 5; r++) CHECKF(same_result(&ref, &b, r), "reserve: request %d differs", r);
        CHECK(last_stats.preemptions == 0 && p->violations == 0);
        free_results(&b);
        eg_drafter_free(&p->d);
    }
    free_results(&ref);
    free_results(&base);
}

/* Stages on one thread, BF16 capture (the drafter gets the rounded rows) and kept
 * logits work with a drafter: the same tokens (and rows) as without. */
static void test_greedy_other_configs(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results ref = {0}, base = {0}, b = {0};
    run_cfg c = base_cfg();
    CHECK_OK(run(&c, &ref, &err), &err);
    const int s2[2] = {2, 5};
    for (int cfg = 0; cfg < 3; cfg++) {
        run_cfg s = c;
        if (cfg == 0) { s.stage_ends = s2; s.n_stages = 2; }
        if (cfg == 1) s.capture_bf16 = 1;
        if (cfg == 2) s.want_logits = 1;
        CHECK_OK(run(&s, &base, &err), &err);
        test_prop *p = prop_new(P_HALF, s.slots);
        p->ref = &ref;
        p->bf16_rows = s.capture_bf16;
        s.drafter = &p->d;
        s.k = 3;
        CHECK_OK(run(&s, &b, &err), &err);
        for (int r = 0; r < 5; r++) CHECKF(same_result(&base, &b, r), "config %d: request %d differs", cfg, r);
        CHECKF(p->violations == 0 && p->row_mismatch == 0, "config %d: %lld breaches, %lld rows differ", cfg,
               (long long)p->violations, (long long)p->row_mismatch);
        CHECK(last_stats.accepted > 0);
        free_results(&b);
        free_results(&base);
        eg_drafter_free(&p->d);
    }
    free_results(&ref);
}

/* eg_kv_truncate gives back the blocks past a length, last first, and nothing else. */
static void test_kv_truncate(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_backend *be = NULL;
    eg_kv_cache *kv = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 8, .max_seq_len = 64, .nthreads = 1};
    CHECK_OK(eg_backend_create(&model.cfg, &bo, &be, &err), &err);
    if (be) CHECK_OK(eg_kv_create(be, 1, 8, 8, 10, 2, 64, &kv, &err), &err);
    if (!kv) { eg_backend_free(be); return; }
    CHECK_OK(eg_kv_reserve(kv, 0, 40, &err), &err); /* 5 blocks */
    CHECK_OK(eg_kv_reserve(kv, 1, 9, &err), &err);  /* 2 */
    int32_t first3[3];
    memcpy(first3, kv->table, sizeof first3);
    CHECK(eg_kv_free_blocks(kv) == 3);
    eg_kv_truncate(kv, 0, 17); /* keeps 3 */
    CHECK(eg_kv_slot_blocks(kv, 0) == 3 && eg_kv_free_blocks(kv) == 5 && eg_kv_slot_blocks(kv, 1) == 2);
    CHECK(!memcmp(first3, kv->table, sizeof first3) && kv->table[3] == -1 && kv->table[4] == -1);
    eg_kv_truncate(kv, 0, 24); /* exactly 3 blocks: nothing */
    CHECK(eg_kv_slot_blocks(kv, 0) == 3 && eg_kv_free_blocks(kv) == 5);
    eg_kv_truncate(kv, 0, 60); /* longer than mapped: nothing */
    CHECK(eg_kv_slot_blocks(kv, 0) == 3);
    CHECK_OK(eg_kv_reserve(kv, 0, 64, &err), &err); /* the freed blocks come back */
    CHECK(eg_kv_slot_blocks(kv, 0) == 8 && eg_kv_free_blocks(kv) == 0);
    eg_kv_truncate(kv, 1, 0);
    CHECK(eg_kv_slot_blocks(kv, 1) == 0 && eg_kv_free_blocks(kv) == 2);
    eg_kv_truncate(NULL, 0, 0);
    eg_kv_free(kv);
    eg_backend_free(be);
}

/* Refused combinations and bad drafters, with clear messages. */
static void test_refusals(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results b = {0};
    test_prop *p = prop_new(P_WRONG, 3);
    run_cfg s = base_cfg();
    s.drafter = &p->d;
    s.k = 0;
    CHECK(run(&s, &b, &err) == EG_ERR_INVALID && strstr(err.msg, "draft tokens"));
    s.k = 16;
    CHECK(run(&s, &b, &err) == EG_ERR_INVALID && strstr(err.msg, "verify chunk"));
    s.k = 2;
    s.slots = 4; /* the proposer holds 3 */
    CHECK(run(&s, &b, &err) == EG_ERR_INVALID && strstr(err.msg, "slots"));
    s.slots = 3;
    p->aux[1] = 3; /* not captured */
    CHECK(run(&s, &b, &err) == EG_ERR_INVALID && strstr(err.msg, "layer 3"));
    p->aux[1] = 4;
    p->d.info.hidden = 65;
    CHECK(run(&s, &b, &err) == EG_ERR_INVALID && strstr(err.msg, "hidden"));
    free_results(&b);
    eg_drafter_free(&p->d);
}

/* Expert-parallel ranks (each driving its own proposer for its own slots; verify rows go
 * through the exchange as ordinary rows) and threaded pipeline stages (the proposer on the
 * driving thread as a micro-batch leaves the last stage, several micro-batches in flight):
 * greedy with an always-right, always-wrong or half-right proposer is byte-identical to
 * greedy without one on one engine; sampled with a proposer equals sampled with it on
 * one engine. */
static void test_layouts(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0}, b = {0};
    run_cfg c = base_cfg();
    c.slots = 4;
    CHECK_OK(run(&c, &base, &err), &err);
    static const int ends[3] = {2, 4, 5};
    struct {
        const char *name;
        int ep, n_stages, threaded, micro_batches;
        int64_t kv_blocks;
    } v[] = {
        {"--ep 2", 2, 0, 0, 0, 0},
        {"--ep 4", 4, 0, 0, 0, 0},
        {"--ep 2, stages on the rank's thread", 2, 3, 0, 0, 0},
        {"three threaded stages", 0, 3, 1, 0, 0},
        {"three threaded stages, 4 micro-batches", 0, 3, 1, 4, 0},
        {"three threaded stages, a pool that preempts", 0, 3, 1, 0, 14},
    };
    for (size_t l = 0; l < sizeof v / sizeof v[0]; l++)
        for (int mode = P_RIGHT; mode <= P_HALF; mode++) {
            int R = v[l].ep > 1 ? v[l].ep : 1;
            test_prop *p[4] = {0};
            eg_drafter *d[4] = {0};
            for (int r = 0; r < R; r++) {
                p[r] = prop_new((prop_mode)mode, v[l].ep > 1 ? eg_ep_runtime_rank_slots(c.slots, R, r) : c.slots);
                p[r]->ref = &base;
                d[r] = &p[r]->d;
            }
            run_cfg s = c;
            s.k = 3;
            s.ep = v[l].ep;
            s.rank_drafters = d;
            s.drafter = v[l].ep > 1 ? NULL : d[0];
            s.stage_ends = v[l].n_stages ? ends : NULL;
            s.n_stages = v[l].n_stages;
            s.threaded = v[l].threaded;
            s.micro_batches = v[l].micro_batches;
            s.kv_blocks = v[l].kv_blocks;
            eg_status st = run(&s, &b, &err);
            CHECKF(st == EG_OK, "%s, %s: %s", v[l].name, p[0]->d.info.kind, err.msg);
            for (int r = 0; r < 5; r++)
                CHECKF(same_result(&base, &b, r), "%s, %s: request %d differs from greedy without a drafter", v[l].name,
                       p[0]->d.info.kind, r);
            int64_t bad = 0;
            for (int r = 0; r < R; r++) bad += p[r]->violations + p[r]->row_mismatch;
            CHECKF(bad == 0, "%s, %s: %lld protocol breaches or rows that differ", v[l].name, p[0]->d.info.kind,
                   (long long)bad);
            CHECKF(last_stats.verify_steps > 0 && last_stats.decode_tokens == 5 * 24, "%s: %lld verify steps, %lld tokens",
                   v[l].name, (long long)last_stats.verify_steps, (long long)last_stats.decode_tokens);
            if (mode == P_RIGHT) CHECK(last_stats.accepted == last_stats.drafted);
            if (mode == P_WRONG) CHECK(last_stats.accepted == 0);
            if (mode == P_HALF) CHECK(last_stats.accepted > 0 && last_stats.accepted < last_stats.drafted);
            if (v[l].kv_blocks) CHECKF(last_stats.preemptions > 0, "%s: no preemption", v[l].name);
            if (v[l].ep > 1)
                for (int r = 0; r < R; r++) CHECKF(p[r]->proposals > 0, "%s: rank %d never drafted", v[l].name, r);
            free_results(&b);
            for (int r = 0; r < R; r++) eg_drafter_free(d[r]);
        }
    free_results(&base);
    /* sampled: uniform proposals (rejections and residual draws), per-request RNG */
    double *m = malloc(sizeof(double) * (size_t)model.cfg.vocab);
    for (int i = 0; i < model.cfg.vocab; i++) m[i] = 1.0 / model.cfg.vocab;
    results one = {0};
    c.temp = 0.8f;
    c.top_p = 0.9f;
    c.k = 3;
    for (size_t l = 0; l < 2 + 1; l++) {
        static const struct { const char *name; int ep, threaded; } w[3] = {
            {"one engine", 0, 0}, {"--ep 2", 2, 0}, {"three threaded stages", 0, 1}};
        int R = w[l].ep > 1 ? w[l].ep : 1;
        test_prop *p[2] = {0};
        eg_drafter *d[2] = {0};
        for (int r = 0; r < R; r++) {
            p[r] = prop_new(P_SAMPLED, R > 1 ? eg_ep_runtime_rank_slots(c.slots, R, r) : c.slots);
            p[r]->marg = m;
            p[r]->n_marg = 1;
            d[r] = &p[r]->d;
        }
        run_cfg s = c;
        s.ep = w[l].ep;
        s.rank_drafters = d;
        s.drafter = R > 1 ? NULL : d[0];
        s.threaded = w[l].threaded;
        s.stage_ends = w[l].threaded ? ends : NULL;
        s.n_stages = w[l].threaded ? 3 : 0;
        CHECK_OK(run(&s, l ? &b : &one, &err), &err);
        CHECK(last_stats.verify_steps > 0);
        for (int r = 0; l && r < 5; r++)
            CHECKF(same_result(&one, &b, r), "sampled, %s: request %d differs from one engine", w[l].name, r);
        for (int r = 0; r < R; r++) CHECK(p[r]->violations == 0);
        if (l) free_results(&b);
        for (int r = 0; r < R; r++) eg_drafter_free(d[r]);
    }
    free_results(&one);
    free(m);
}

/* ---- sampled --------------------------------------------------------------------- */

/* A proposal distribution per generated index that overlaps the target's: 0.7 x the
 * non-speculative run's marginal at that index + 0.3 x uniform (any q with q(x) > 0 at
 * its draft keeps the rule exact; this one makes accepts and rejects both common). */
static double *marginals(const results *base, int n_req, int prompt, int n_pos) {
    const int V = model.cfg.vocab;
    double *m = calloc((size_t)n_pos * V, sizeof *m);
    for (int j = 0; j < n_pos; j++) {
        int n = 0;
        for (int r = 0; r < n_req; r++)
            if (base->tokens[r] && base->n_gen[r] > j) { m[(size_t)j * V + base->tokens[r][prompt + j]] += 1; n++; }
        for (int v = 0; v < V; v++) m[(size_t)j * V + v] = 0.7 * (n ? m[(size_t)j * V + v] / n : 0) + 0.3 / V;
    }
    return m;
}

/* Sampled speculative output does not depend on batch composition or preemption (per
 * sequence RNG: a resumed job regenerates it bit for bit), and its captured rows are
 * those of a teacher-forced pass over the final sequence. */
static void test_sampled_deterministic(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0}, a = {0}, b = {0}, tf = {0};
    run_cfg c = base_cfg();
    c.temp = 0.8f;
    c.top_p = 0.9f;
    c.max_new = 40;
    c.slots = 4;
    CHECK_OK(run(&c, &base, &err), &err);
    double *m = malloc(sizeof(double) * (size_t)model.cfg.vocab); /* uniform, for every index */
    for (int i = 0; i < model.cfg.vocab; i++) m[i] = 1.0 / model.cfg.vocab;
    test_prop *p = prop_new(P_SAMPLED, 4);
    p->marg = m;
    p->n_marg = 1;
    p->prompt = 0;
    run_cfg s = c;
    s.drafter = &p->d;
    s.k = 3;
    /* uniform proposals: rejections dominate, the residual rule does the work */
    CHECK_OK(run(&s, &a, &err), &err);
    CHECK(last_stats.verify_steps > 0);
    for (int r = 0; r < 5; r++) {
        run_cfg one = s;
        one.only = r;
        one.slots = 1;
        one.max_tokens = 5;
        CHECK_OK(run(&one, &b, &err), &err);
        CHECKF(same_result(&a, &b, r), "sampled spec: request %d differs alone", r);
        free_results(&b);
    }
    run_cfg small = s;
    small.kv_blocks = 12;
    CHECK_OK(run(&small, &b, &err), &err);
    CHECK(last_stats.preemptions >= 2);
    for (int r = 0; r < 5; r++) CHECKF(same_result(&a, &b, r), "sampled spec, 12 blocks: request %d differs", r);
    free_results(&b);
    CHECK(p->violations == 0);
    /* teacher-forced pass over the final sequences */
    run_cfg t = base_cfg();
    for (int r = 0; r < 5; r++) { t.forced[r] = a.tokens[r]; t.forced_len[r] = a.n_tokens[r]; }
    CHECK_OK(run(&t, &tf, &err), &err);
    for (int r = 0; r < 5; r++) {
        CHECK(tf.n_tokens[r] == a.n_tokens[r] && tf.finish[r] == EG_FINISH_NONE);
        size_t n = (size_t)a.n_tokens[r], H = (size_t)model.cfg.hidden;
        CHECKF(a.aux[r] && tf.aux[r] && !memcmp(a.aux[r], tf.aux[r], 4 * n * N_AUX * H) &&
                   !memcmp(a.final[r], tf.final[r], 4 * n * H),
               "request %d: captured rows differ from the teacher-forced pass", r);
    }
    free_results(&tf);
    free_results(&a);
    free_results(&base);
    eg_drafter_free(&p->d);
    free(m);
}

/* z with P(Z > z) = alpha, by bisection on erfc. */
static double z_upper(double alpha) {
    double lo = 0, hi = 10;
    for (int i = 0; i < 200; i++) {
        double mid = (lo + hi) / 2;
        if (0.5 * erfc(mid / sqrt(2.0)) > alpha) lo = mid; else hi = mid;
    }
    return lo;
}
/* The chi-square upper quantile (Wilson-Hilferty). */
static double chi2_crit(int df, double alpha) {
    double z = z_upper(alpha), a = 2.0 / (9.0 * df);
    double t = 1 - a + z * sqrt(a);
    return df * t * t * t;
}

/* Two-sample chi-square homogeneity statistic of counts a[V] (total na) and b[V] (nb):
 * categories whose pooled count is under 10 are pooled into one. */
static double chi2_two(const int *a, const int *b, int V, int *df) {
    double na = 0, nb = 0;
    for (int v = 0; v < V; v++) { na += a[v]; nb += b[v]; }
    double stat = 0, ra = 0, rb = 0;
    int cats = 0;
    for (int v = 0; v <= V; v++) {
        double x, y;
        if (v < V) {
            if (a[v] + b[v] < 10) { ra += a[v]; rb += b[v]; continue; }
            x = a[v]; y = b[v];
        } else {
            if (ra + rb == 0) break;
            x = ra; y = rb;
        }
        double tot = x + y, ea = tot * na / (na + nb), eb = tot * nb / (na + nb);
        stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
        cats++;
    }
    *df = cats - 1;
    return stat;
}

/* The first three generated tokens of one prompt over N seeds: the speculative run
 * (k = 3, a proposer close to the target's marginals) against the non-speculative
 * run, per position a two-sample chi-square at a false-alarm rate of 1e-3 over the
 * three tests together (1e-3 / 3 each; Wilson-Hilferty quantile). A rule that accepts
 * every draft must fail it. */
static void test_sampled_distribution(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    enum { N = 3000, NP = 3, PR = 1 };
    const int V = model.cfg.vocab, plen = prompt_len(PR);
    static results base, sp;
    run_cfg c = base_cfg();
    c.n_req = N;
    c.same_prompt = PR;
    c.max_new = NP;
    c.temp = 1.0f;
    c.top_p = 0.95f;
    c.slots = 64;
    c.max_tokens = 256;
    c.keep_rows = 0;
    c.seed = 1001;
    double t0 = eg_now();
    CHECK_OK(run(&c, &base, &err), &err);
    CHECK(base.n == N);
    double *m = marginals(&base, N, plen, NP);
    int *ca = calloc((size_t)V, sizeof *ca), *cb = calloc((size_t)V, sizeof *cb);
    const double alpha = 1e-3 / NP;
    for (int broken = 0; broken < 2; broken++) {
        test_prop *p = prop_new(P_SAMPLED, c.slots);
        p->marg = m;
        p->n_marg = NP;
        p->prompt = plen;
        run_cfg s = c;
        s.drafter = &p->d;
        s.k = 3;
        s.seed = 2002; /* independent draws */
        s.rule = broken ? EG_SPEC_BROKEN_ACCEPT : EG_SPEC_EXACT;
        CHECK_OK(run(&s, &sp, &err), &err);
        CHECK(sp.n == N && p->violations == 0);
        double mean_acc = last_stats.verify_steps ? (double)last_stats.accepted / last_stats.verify_steps : 0;
        int fails = 0;
        for (int j = 0; j < NP; j++) {
            memset(ca, 0, sizeof *ca * (size_t)V);
            memset(cb, 0, sizeof *cb * (size_t)V);
            for (int r = 0; r < N; r++) {
                if (base.n_gen[r] > j) ca[base.tokens[r][plen + j]]++;
                if (sp.n_gen[r] > j) cb[sp.tokens[r][plen + j]]++;
            }
            int df = 0;
            double stat = chi2_two(ca, cb, V, &df), crit = df > 0 ? chi2_crit(df, alpha) : 0;
            fails += df > 0 && stat > crit;
            printf("    %s rule, position %d: chi2 %.1f, df %d, critical %.1f (mean accepted %.2f per verify step)\n",
                   broken ? "broken" : "exact", j, stat, df, crit, mean_acc);
            if (!broken) CHECKF(df >= 3 && stat <= crit, "exact rule, position %d: chi2 %.1f > %.1f (df %d)", j, stat, crit, df);
        }
        /* both branches of the rule ran often */
        if (!broken)
            CHECKF(last_stats.accepted > last_stats.drafted / 20 && last_stats.accepted < last_stats.drafted * 19 / 20,
                   "%lld of %lld drafts accepted", (long long)last_stats.accepted, (long long)last_stats.drafted);
        if (broken) CHECKF(fails >= 1, "the broken rule passed the distribution test");
        free_results(&sp);
        eg_drafter_free(&p->d);
    }
    printf("    distribution test: %.1f s\n", eg_now() - t0);
    free(ca); free(cb); free(m);
    free_results(&base);
}

/* The decode pass's rotation with several micro-batches: 2 threaded stages, 2 micro-batches
 * of 2 slots, one verify chunk per step (max_tokens = K + 1): each micro-batch's two
 * sequences take turns, so they finish within a few steps of each other. With one counter
 * shared by the micro-batches each saw start values of one parity, and a micro-batch's
 * first slot went first every time: its second sequence decoded only once the first was
 * done (finishing 12+ steps later). */
static void test_rotation_fair(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0}, b = {0};
    run_cfg c = base_cfg();
    c.n_req = 4;
    c.same_prompt = 0; /* every pair alike: only the order of the decode pass differs */
    c.slots = 4;
    c.max_new = 25;
    CHECK_OK(run(&c, &base, &err), &err);
    static const int ends[2] = {3, 5};
    test_prop *p = prop_new(P_RIGHT, c.slots);
    p->ref = &base;
    run_cfg s = c;
    s.drafter = &p->d;
    s.k = 3;
    s.max_tokens = 7; /* one verify chunk of 4, and 3 rows for prefill */
    s.stage_ends = ends;
    s.n_stages = 2;
    s.threaded = 1;
    s.micro_batches = 2;
    CHECK_OK(run(&s, &b, &err), &err);
    for (int r = 0; r < 4; r++) CHECKF(same_result(&base, &b, r), "request %d differs", r);
    /* micro-batch 0 admits requests 0 and 1 into its slots 0 and 2, micro-batch 1 requests
       2 and 3 */
    for (int m = 0; m < 2; m++) {
        int64_t gap = b.done_step[2 * m + 1] - b.done_step[2 * m];
        CHECKF(gap >= -6 && gap <= 6, "micro-batch %d: requests %d and %d finished at steps %lld and %lld", m, 2 * m,
               2 * m + 1, (long long)b.done_step[2 * m], (long long)b.done_step[2 * m + 1]);
    }
    printf("    finished at steps %lld %lld %lld %lld (requests 0-3)\n", (long long)b.done_step[0],
           (long long)b.done_step[1], (long long)b.done_step[2], (long long)b.done_step[3]);
    free_results(&base);
    free_results(&b);
    eg_drafter_free(&p->d);
}

/* A random EAGLE-3 drafter for the test model (mkmodel --drafter-for: a 300-id draft
 * vocabulary, aux layers 1 and 4) in /tmp/eg_spec_<tag>_<pid>; 0 (a failed check) when it
 * could not be written. remove_dir: rm -rf it. */
static int make_drafter(char *dir, size_t n, const char *tag, uint64_t seed) {
    static const int daux[2] = {1, 4};
    snprintf(dir, n, "/tmp/eg_spec_%s_%d", tag, (int)getpid());
    eg_mkdrafter_opts mo = {.target_dir = MODEL, .out_dir = dir, .seed = seed, .draft_vocab = 300, .n_aux = 2,
                            .aux_layers = daux};
    eg_error err = {0};
    CHECK_OK(eg_mkmodel_drafter(&mo, &err), &err);
    return !err.code;
}

static void remove_dir(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "    could not remove %s\n", dir);
}

/* The EAGLE-3 drafter through the CPU backend's ops, where the engine's batched calls
 * (drafter.h extend_many / propose_many: one pass over every pending slot's rows, in
 * passes of 3 rows here) run, against its own code slot by slot: the same drafts (the
 * backend path is the own code's products in the same order, engine_drafter
 * backend_cpu_bits), so the same run token for token, captured rows, draft and
 * acceptance counts. Sampled and greedy, 4 slots with uneven lengths, and a pool small
 * enough to preempt (the drafter rebuilt from kept rows); the batched runs draw the
 * step's rows on 3 host threads (host_draws), the reference on the driving thread. */
static void test_eagle3_batched(void) {
    load_model();
    if (!have_model) return;
    char dir[64];
    if (!make_drafter(dir, sizeof dir, "e3", 5)) return;
    eg_error err = {0};
    /* hot temperatures flatten p and q alike, so drafts are accepted often */
    const struct { float temp; int64_t kv_blocks; int k; } cases[] = {{4.0f, 0, 3}, {0.0f, 0, 4}, {2.5f, 12, 3}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        results own = {0}, bat = {0};
        eg_engine_stats st_own = {0};
        for (int path = 0; path < 2; path++) {
            run_cfg c = base_cfg();
            c.slots = 4;
            c.max_new = 30;
            c.temp = cases[ci].temp;
            c.kv_blocks = cases[ci].kv_blocks;
            c.k = cases[ci].k;
            c.host_threads = path ? 3 : 1; /* the host's draws in parallel, or on the driving thread */
            eg_eagle3_opts po = {.threads = 1, .backend = path ? "cpu" : NULL, .max_rows = 3, .block_size = 8};
            eg_drafter *d = NULL;
            CHECK_OK(eg_drafter_eagle3_load_opts(dir, &model, c.slots, MAX_SEQ, &po, &d, &err), &err);
            if (!d) return;
            c.drafter = d;
            CHECK_OK(run(&c, path ? &bat : &own, &err), &err);
            if (!path) st_own = last_stats;
            eg_drafter_free(d);
        }
        for (int r = 0; r < 5; r++) CHECKF(same_result(&own, &bat, r), "case %zu: request %d differs", ci, r);
        CHECKF(last_stats.drafted == st_own.drafted && last_stats.accepted == st_own.accepted &&
                   last_stats.verify_steps == st_own.verify_steps,
               "case %zu: drafted %lld / %lld, accepted %lld / %lld", ci, (long long)last_stats.drafted,
               (long long)st_own.drafted, (long long)last_stats.accepted, (long long)st_own.accepted);
        CHECK(last_stats.drafted > 0);
        if (cases[ci].kv_blocks) CHECKF(last_stats.preemptions > 0, "case %zu: no preemption", ci);
        printf("    case %zu: %lld verify steps, %lld drafted, %lld accepted, %lld preemptions: batched == slot by slot\n",
               ci, (long long)last_stats.verify_steps, (long long)last_stats.drafted, (long long)last_stats.accepted,
               (long long)last_stats.preemptions);
        free_results(&own);
        free_results(&bat);
    }
    remove_dir(dir);
}

/* The acceptance tests' p(draft) from the backend (eg_engine_opts.spec_probs 1; the CPU
 * backend's token_probs are the host's numbers) write what the host's own give: the same
 * tokens, rows, drafts and acceptances, with the backend's values used on every sampled
 * draft row. Hot and cooler temperatures, top-p and top-k cuts, a preempting pool, two
 * threaded stages (their decisions on the last stage's thread). */
static void test_backend_probs(void) {
    load_model();
    if (!have_model) return;
    char dir[64];
    if (!make_drafter(dir, sizeof dir, "bp", 9)) return;
    static const int ends[2] = {3, 5};
    eg_error err = {0};
    const struct {
        float temp, top_p;
        int top_k;
        int64_t kv_blocks;
        int k, stages, want_logits, ep, nan_probs; /* stages: 2 threaded, 3 = 2 on the calling thread */
        int no_kept, nan_kept;
    } cases[] = {{4.0f, 1.0f, 0, 0, 3, 0, 0, 0, 0, 0, 0},   {1.5f, 0.9f, 0, 0, 2, 0, 0, 0, 0, 0, 0},
                 {2.5f, 1.0f, 40, 12, 3, 0, 0, 0, 0, 0, 0},  {3.0f, 0.95f, 0, 0, 3, 2, 0, 0, 0, 0, 0},
                 {3.0f, 0.95f, 0, 0, 3, 0, 1, 0, 0, 0, 0},   {3.0f, 0.95f, 0, 0, 3, 0, 0, 2, 0, 0, 0},
                 {4.0f, 0.95f, 0, 0, 3, 0, 0, 0, 3, 0, 0},   {3.0f, 0.95f, 0, 12, 3, 3, 0, 0, 0, 0, 0},
                 {3.0f, 0.95f, 0, 0, 3, 0, 0, 0, 0, 1, 0},   {1.5f, 1.0f, 7, 0, 3, 0, 0, 0, 0, 0, 2}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        results host = {0}, be = {0};
        eg_engine_stats st_host = {0};
        int R = cases[ci].ep > 1 ? cases[ci].ep : 1;
        for (int path = 0; path < 2; path++) {
            run_cfg c = base_cfg();
            c.slots = 4;
            c.max_new = 30;
            c.temp = cases[ci].temp;
            c.top_p = cases[ci].top_p;
            c.top_k = cases[ci].top_k;
            c.kv_blocks = cases[ci].kv_blocks;
            c.k = cases[ci].k;
            c.want_logits = cases[ci].want_logits;
            if (cases[ci].stages) {
                c.stage_ends = ends;
                c.n_stages = 2;
                c.threaded = cases[ci].stages == 2;
            }
            c.spec_probs = path ? 1 : -1;
            c.nan_probs = path ? cases[ci].nan_probs : 0;
            c.no_kept = path ? cases[ci].no_kept : 0;
            c.nan_kept = path ? cases[ci].nan_kept : 0;
            eg_eagle3_opts po = {.threads = 1, .backend = "cpu", .max_rows = 4, .block_size = 8};
            eg_drafter *d[4] = {0};
            for (int r = 0; r < R; r++) {
                int slots = R > 1 ? eg_ep_runtime_rank_slots(c.slots, R, r) : c.slots;
                CHECK_OK(eg_drafter_eagle3_load_opts(dir, &model, slots, MAX_SEQ, &po, &d[r], &err), &err);
                if (!d[r]) return;
            }
            c.ep = cases[ci].ep;
            c.rank_drafters = d;
            c.drafter = R > 1 ? NULL : d[0];
            CHECK_OK(run(&c, path ? &be : &host, &err), &err);
            if (!path) st_host = last_stats;
            for (int r = 0; r < R; r++) eg_drafter_free(d[r]);
        }
        for (int r = 0; r < 5; r++) CHECKF(same_result(&host, &be, r), "case %zu: request %d differs", ci, r);
        CHECKF(last_stats.drafted == st_host.drafted && last_stats.accepted == st_host.accepted &&
                   last_stats.verify_steps == st_host.verify_steps,
               "case %zu: drafted %lld / %lld, accepted %lld / %lld", ci, (long long)last_stats.drafted,
               (long long)st_host.drafted, (long long)last_stats.accepted, (long long)st_host.accepted);
        /* every drafted token is a row the backend was asked for, and answered but where it
         * said NaN (the host computed those); a rejected draft's row is still sorted on the
         * host, for its residual */
        int64_t left = cases[ci].nan_probs ? nan_given : 0;
        CHECKF(st_host.backend_probs == 0 && last_stats.backend_probs == last_stats.drafted - left,
               "case %zu: backend p for %lld rows of %lld drafted, %lld left NaN (host run: %lld)", ci,
               (long long)last_stats.backend_probs, (long long)last_stats.drafted, (long long)left,
               (long long)st_host.backend_probs);
        if (cases[ci].nan_probs) CHECK(left > 0 && nan_asked == last_stats.drafted);
        /* logits not kept: the rule took only the rows it needed (a verify chunk's rejected
         * or bonus row), not every logit row; with threaded stages on the last stage's
         * thread (defer_decide), else on the driver's */
        int deferred = !cases[ci].want_logits;
        CHECKF(deferred ? last_stats.logit_rows < st_host.logit_rows : last_stats.logit_rows == st_host.logit_rows,
               "case %zu: %lld logits rows taken, %lld on the host's path", ci, (long long)last_stats.logit_rows,
               (long long)st_host.logit_rows);
        /* and drew the bonus and plain rows' tokens on the backend */
        CHECKF(deferred ? last_stats.backend_draws > 0 : last_stats.backend_draws == 0, "case %zu: %lld drawn there", ci,
               (long long)last_stats.backend_draws);
        /* and every rejected draft's residual from the kept set the backend gave, but where
         * it gave none (then its row came over) */
        CHECKF(deferred && !cases[ci].no_kept
                   ? last_stats.backend_residuals > 0 &&
                         (!cases[ci].nan_kept || last_stats.backend_residuals == kept_asked - kept_given)
                   : last_stats.backend_residuals == 0,
               "case %zu: %lld residuals from kept sets, %lld asked, %lld left to the host", ci,
               (long long)last_stats.backend_residuals, (long long)kept_asked, (long long)kept_given);
        if (cases[ci].nan_kept) CHECK(kept_given > 0);
        if (cases[ci].no_kept) CHECK(last_stats.logit_rows > last_stats.backend_residuals);
        CHECK(st_host.backend_residuals == 0);
        CHECK(last_stats.accepted > 0 && last_stats.accepted < last_stats.drafted);
        if (cases[ci].kv_blocks) CHECKF(last_stats.preemptions > 0, "case %zu: no preemption", ci);
        printf("    case %zu%s%s%s: %lld drafted, %lld accepted, %lld rows' p from the backend, %lld left to the host; "
               "%lld logits rows taken (%lld on the host's path), %lld tokens drawn on the backend, %lld residuals from "
               "its kept sets%s\n",
               ci, cases[ci].want_logits ? " (logits kept)" : "", cases[ci].ep ? " (--ep 2)" : "",
               cases[ci].stages == 2 ? " (2 threaded stages)" : cases[ci].stages ? " (2 stages, one thread)" : "",
               (long long)last_stats.drafted, (long long)last_stats.accepted, (long long)last_stats.backend_probs,
               (long long)left, (long long)last_stats.logit_rows, (long long)st_host.logit_rows,
               (long long)last_stats.backend_draws, (long long)last_stats.backend_residuals,
               cases[ci].no_kept ? " (none offered)" : "");
        free_results(&host);
        free_results(&be);
    }
    remove_dir(dir);
}

/* Greedy and sampled sequences in one batch: each writes what it writes in a batch of its
 * own kind. An all-greedy step takes the backend's argmaxes (no logits rows to the host),
 * a mixed one the rows, so both of the greedy rule's paths run, and a sampled sequence's
 * tokens do not depend on its neighbours. */
static void test_mixed_greedy_sampled(void) {
    load_model();
    if (!have_model) return;
    char dir[64];
    if (!make_drafter(dir, sizeof dir, "mix", 4)) return;
    eg_error err = {0};
    results g = {0}, smp = {0}, mixed = {0}, plain = {0};
    eg_engine_stats st[3];
    for (int run_i = 0; run_i < 3; run_i++) {
        run_cfg c = base_cfg();
        c.slots = 4;
        c.max_new = 30;
        c.k = 3;
        c.temp = run_i == 1 ? 3.0f : 0.0f;
        c.mix = run_i == 2;
        c.temp_odd = 3.0f;
        eg_eagle3_opts po = {.threads = 1, .backend = "cpu", .max_rows = 4, .block_size = 8};
        eg_drafter *d = NULL;
        CHECK_OK(eg_drafter_eagle3_load_opts(dir, &model, c.slots, MAX_SEQ, &po, &d, &err), &err);
        if (!d) return;
        c.drafter = d;
        CHECK_OK(run(&c, run_i == 0 ? &g : run_i == 1 ? &smp : &mixed, &err), &err);
        st[run_i] = last_stats;
        eg_drafter_free(d);
    }
    run_cfg c = base_cfg();
    c.max_new = 30;
    CHECK_OK(run(&c, &plain, &err), &err);
    for (int r = 0; r < 5; r++) {
        CHECKF(same_result(&plain, &g, r), "greedy with the drafter: request %d differs from greedy without", r);
        CHECKF(same_result(r & 1 ? &smp : &g, &mixed, r), "mixed batch: request %d (%s) differs", r,
               r & 1 ? "sampled" : "greedy");
    }
    CHECK(st[0].drafted > 0 && st[2].accepted > 0 && st[1].drafted > 0); /* (a random drafter: greedy accepts none) */
    /* all greedy: no logits row reached the host; mixed: the sampled steps' rows did */
    CHECKF(st[0].logit_rows == 0 && st[1].logit_rows > 0 && st[2].logit_rows > 0,
           "logits rows to the host: greedy %lld, sampled %lld, mixed %lld", (long long)st[0].logit_rows,
           (long long)st[1].logit_rows, (long long)st[2].logit_rows);
    printf("    greedy %lld / %lld accepted, sampled %lld / %lld, mixed %lld / %lld; logits rows to the host %lld, %lld, "
           "%lld\n", (long long)st[0].accepted, (long long)st[0].drafted, (long long)st[1].accepted,
           (long long)st[1].drafted, (long long)st[2].accepted, (long long)st[2].drafted, (long long)st[0].logit_rows,
           (long long)st[1].logit_rows, (long long)st[2].logit_rows);
    free_results(&g);
    free_results(&smp);
    free_results(&mixed);
    free_results(&plain);
    remove_dir(dir);
}

/* eg_spec_finish_kept from a row's kept set (in any order) gives eg_spec_finish's token
 * and RNG state at a rejection: q one-hot (NULL), q a random distribution, q = p (no
 * residual mass: the draw falls back to p), q above p on part of the set; ties in the
 * logits, top-k and top-p cuts, several temperatures. */
static void test_finish_kept(void) {
    enum { V = 1500 };
    eg_error err = {0};
    eg_spec_scratch *sc = NULL, *sk = NULL;
    CHECK_OK(eg_spec_scratch_create(V, &sc, &err), &err);
    CHECK_OK(eg_spec_scratch_create(V, &sk, &err), &err);
    float *lg = malloc(sizeof(float) * V), *sort = malloc(sizeof(float) * eg_sample_scratch_floats(V));
    double *qd = malloc(sizeof(double) * 2 * V), *pr = malloc(sizeof(double) * V), *probs = malloc(sizeof(double) * V);
    int32_t *ids = malloc(sizeof(int32_t) * V);
    eg_spec_q sq = tq_alloc(2, V);
    if (!sc || !sk || !lg || !sort || !qd || !pr || !probs || !ids || !sq.p) goto out;
    static const float temps[] = {0.7f, 1.0f, 3.0f}, tops[] = {1.0f, 0.9f, 0.5f};
    static const int topk[] = {0, 50};
    uint64_t g = eg_rng_seed(2024, 1);
    int trials = 0, same = 0, no_mass = 0, cut = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int pi = 0; pi < 3; pi++)
            for (int ki = 0; ki < 2; ki++)
                for (int mode = 0; mode < 4; mode++)
                    for (int rep = 0; rep < 6; rep++) {
                        eg_sample_params sp = {.temperature = temps[ti], .top_p = tops[pi], .top_k = topk[ki]};
                        for (int v = 0; v < V; v++) /* coarse values: many ties */
                            lg[v] = (float)floor(eg_rng_uniform(&g) * 40.0) * 0.25f;
                        double total;
                        int n = eg_sample_kept(lg, V, &sp, sort, &total);
                        const eg_sample_cand *c = (const eg_sample_cand *)sort;
                        const double *ex = (const double *)(c + V);
                        for (int j = 0; j < n; j++) {
                            ids[j] = c[j].id;
                            probs[j] = ex[j] / total;
                        }
                        for (int j = n - 1; j > 0; j--) { /* any order */
                            int o = (int)(eg_rng_uniform(&g) * (j + 1));
                            int32_t ti2 = ids[j]; ids[j] = ids[o]; ids[o] = ti2;
                            double tp = probs[j]; probs[j] = probs[o]; probs[o] = tp;
                        }
                        cut += n < V;
                        eg_spec_probs(sc, lg, V, &sp, pr);
                        double *q1 = qd + V; /* the rejected draft is draft[1]: its q is row 1 */
                        double qs = 0;
                        for (int v = 0; v < V; v++) {
                            double u = eg_rng_uniform(&g);
                            q1[v] = mode == 2 ? pr[v] : mode == 3 ? (u < 0.5 ? pr[v] * 1.5 : pr[v] * 0.5)
                                                                  : (u < 0.3 ? 0 : u);
                            qs += q1[v];
                        }
                        if (mode == 1)
                            for (int v = 0; v < V; v++) q1[v] /= qs;
                        for (int v = 0; v < V; v++) qd[v] = 1.0 / V;
                        int32_t draft[2] = {ids[0], c[0].id};
                        uint64_t ra = eg_rng_seed(77, (uint64_t)trials), rb = ra;
                        tq_pack(qd, 2, V, &sq);
                        const eg_spec_q *q = mode == 0 ? NULL : &sq;
                        int32_t a = eg_spec_finish(sc, lg, V, &sp, draft, q, 1, 1, &ra);
                        int32_t b = eg_spec_finish_kept(sk, ids, probs, n, draft, q, 1, &rb);
                        trials++;
                        same += a == b && ra == rb;
                        if (mode == 2) { /* no residual mass: both drew from p */
                            double m = 0;
                            for (int v = 0; v < V; v++) m += pr[v] - q1[v] > 0 ? pr[v] - q1[v] : 0;
                            no_mass += m == 0;
                        }
                    }
    CHECKF(same == trials, "%d of %d draws equal eg_spec_finish's", same, trials);
    CHECK(no_mass == 3 * 3 * 2 * 6 && cut > trials / 2);
    printf("    %d rejections, %d with a cut kept set, %d with no residual mass: every token and RNG state equal\n",
           trials, cut, no_mass);
out:
    eg_spec_scratch_free(sc);
    eg_spec_scratch_free(sk);
    free(lg); free(sort); free(qd); free(pr); free(probs); free(ids);
    tq_free(&sq);
}

static void test_cleanup(void) {
    if (have_model) eg_model_free(&model);
    have_model = 0;
}

static const eg_test tests[] = {
    {"chunk_row_equals_decode", test_chunk_row_equals_decode},
    {"eagle3_batched", test_eagle3_batched},
    {"backend_probs", test_backend_probs},
    {"mixed_greedy_sampled", test_mixed_greedy_sampled},
    {"rotation_fair", test_rotation_fair},
    {"verify_greedy", test_verify_greedy},
    {"verify_sampled", test_verify_sampled},
    {"verify_no_q", test_verify_no_q},
    {"finish_kept", test_finish_kept},
    {"greedy_identical", test_greedy_identical},
    {"greedy_stop_and_preempt", test_greedy_stop_and_preempt},
    {"greedy_other_configs", test_greedy_other_configs},
    {"kv_truncate", test_kv_truncate},
    {"refusals", test_refusals},
    {"layouts", test_layouts},
    {"sampled_deterministic", test_sampled_deterministic},
    {"sampled_distribution", test_sampled_distribution},
    {"cleanup", test_cleanup},
};
EG_TEST_MAIN("engine_spec", tests)
