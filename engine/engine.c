/* The batch engine; see engine.h. */
#include "engine/engine.h"

#include <signal.h>
#include <stdlib.h>

typedef struct slot_state {
    int active;
    int finishing;      /* generation ended; the last token still needs its pass */
    eg_request req;     /* tokens/stop_ids point at the copies below */
    int32_t *tokens;    /* [cap] */
    int32_t *stop;      /* [n_stop] */
    int cap;
    int n_total, n_done, n_generated;
    eg_finish finish;
    uint64_t rng;
    float *aux;         /* [cap][n_aux][H] */
    float *final;       /* [cap][H] */
    float *logits;      /* [cap][V] */
    int64_t buf_cap;    /* capacity (tokens) of aux/final/logits */
    int stop_cap;
} slot_state;

struct eg_engine {
    const eg_model *m;
    eg_backend *be;
    eg_engine_opts o;
    int *aux_layers;
    int n_stages;
    eg_forward **stages;
    slot_state *slots;
    int rr;             /* round-robin start for fairness */
    /* step buffers, host, sized for max_tokens */
    int32_t *tok, *pos, *slt, *rows, *sampled, *row_slot;
    eg_sample_params *sp;
    uint64_t *rng;
    float *cap;         /* [n_aux][T][H] */
    float *fin;         /* [T][H] */
    float *logits;      /* [T][V] when want_logits */
    float *xa, *xb;     /* [T][H] stage hand-over */
    float *sample_scratch; /* [2V] host sampling when logits are kept */
    eg_request pending;
    int have_pending;
    int32_t *pending_tok, *pending_stop;
    int pending_tok_cap, pending_stop_cap;
    volatile sig_atomic_t stop_requested;
    eg_engine_stats stats;
};

void eg_engine_free(eg_engine *e) {
    if (!e) return;
    if (e->stages)
        for (int i = 0; i < e->n_stages; i++) eg_forward_free(e->stages[i]);
    free(e->stages);
    if (e->slots)
        for (int i = 0; i < e->o.n_slots; i++) {
            slot_state *s = &e->slots[i];
            free(s->tokens); free(s->stop); free(s->aux); free(s->final); free(s->logits);
        }
    free(e->slots);
    free(e->aux_layers);
    free(e->tok); free(e->pos); free(e->slt); free(e->rows); free(e->sampled); free(e->row_slot);
    free(e->sp); free(e->rng); free(e->cap); free(e->fin); free(e->logits); free(e->xa); free(e->xb); free(e->sample_scratch);
    free(e->pending_tok); free(e->pending_stop);
    free(e);
}

eg_status eg_engine_create(const eg_model *m, eg_backend *be, const eg_engine_opts *o, eg_engine **out,
                           eg_error *err) {
    *out = NULL;
    const eg_config *c = &m->cfg;
    if (o->n_slots < 1 || o->max_seq_len < 2 || o->max_tokens < 1)
        return eg_fail(err, EG_ERR_INVALID, "engine: need n_slots >= 1, max_seq_len >= 2, max_tokens >= 1");
    for (int i = 0; i < o->n_aux; i++)
        if (o->aux_layers[i] < -1 || o->aux_layers[i] >= c->n_layers)
            return eg_fail(err, EG_ERR_INVALID, "capture layer %d out of range for a %d-layer model (0..%d)",
                           o->aux_layers[i], c->n_layers, c->n_layers - 1);
    eg_engine *e = eg_calloc(1, sizeof *e, err);
    if (!e) return EG_ERR_NOMEM;
    e->m = m;
    e->be = be;
    e->o = *o;
    e->aux_layers = eg_malloc(sizeof(int) * (size_t)(o->n_aux + 1), err);
    if (!e->aux_layers) { free(e); return EG_ERR_NOMEM; }
    if (o->n_aux) memcpy(e->aux_layers, o->aux_layers, sizeof(int) * (size_t)o->n_aux);
    e->o.aux_layers = e->aux_layers;
    e->n_stages = o->stage_ends && o->n_stages > 0 ? o->n_stages : 1;
    e->o.stage_ends = NULL;
    eg_status st = EG_OK;
    e->stages = eg_calloc((size_t)e->n_stages, sizeof *e->stages, err);
    e->slots = eg_calloc((size_t)o->n_slots, sizeof *e->slots, err);
    size_t T = (size_t)o->max_tokens, H = (size_t)c->hidden, V = (size_t)c->vocab;
    e->tok = eg_malloc(4 * T, err); e->pos = eg_malloc(4 * T, err); e->slt = eg_malloc(4 * T, err);
    e->rows = eg_malloc(4 * T, err); e->sampled = eg_malloc(4 * T, err); e->row_slot = eg_malloc(4 * T, err);
    e->sp = eg_malloc(sizeof *e->sp * T, err); e->rng = eg_malloc(8 * T, err);
    e->cap = eg_malloc(4 * T * H * (size_t)(o->n_aux + 1), err);
    e->fin = eg_malloc(4 * T * H, err);
    e->xa = eg_malloc(4 * T * H, err); e->xb = eg_malloc(4 * T * H, err);
    if (o->want_logits) {
        e->logits = eg_malloc(4 * T * V, err);
        e->sample_scratch = eg_malloc(4 * 2 * V, err);
    }
    if (!e->stages || !e->slots || !e->tok || !e->pos || !e->slt || !e->rows || !e->sampled || !e->row_slot ||
        !e->sp || !e->rng || !e->cap || !e->fin || !e->xa || !e->xb || (o->want_logits && (!e->logits || !e->sample_scratch))) {
        eg_engine_free(e);
        return EG_ERR_NOMEM;
    }
    int begin = 0;
    for (int i = 0; i < e->n_stages; i++) {
        int end = o->stage_ends && o->n_stages > 0 ? o->stage_ends[i] : c->n_layers;
        if (end <= begin || end > c->n_layers || (i == e->n_stages - 1 && end != c->n_layers)) {
            eg_engine_free(e);
            return eg_fail(err, EG_ERR_INVALID, "pipeline stages: stage %d ends at layer %d (must increase and end at %d)",
                           i, end, c->n_layers);
        }
        eg_forward_opts fo = {.layer_begin = begin, .layer_end = end, .max_tokens = o->max_tokens,
                              .n_slots = o->n_slots, .max_seq_len = o->max_seq_len, .block_size = o->block_size,
                              .kv_blocks = o->kv_blocks, .capture = e->aux_layers, .n_capture = o->n_aux,
                              .final_pre_norm = o->final_pre_norm};
        if ((st = eg_forward_create(m, be, &fo, &e->stages[i], err))) {
            eg_engine_free(e);
            return eg_wrap(err, "stage %d (layers %d..%d)", i, begin, end - 1);
        }
        begin = end;
    }
    *out = e;
    return EG_OK;
}

void eg_engine_request_stop(eg_engine *e) { e->stop_requested = 1; }
void eg_engine_get_stats(const eg_engine *e, eg_engine_stats *s) { *s = e->stats; }
int64_t eg_engine_kv_capacity(const eg_engine *e) {
    eg_kv_cache *kv = eg_forward_kv(e->stages[0]);
    return kv->n_blocks * kv->block_size;
}

static eg_status grow_i32(int32_t **p, int *cap, int need, eg_error *err) {
    if (need <= *cap) return EG_OK;
    int32_t *q = realloc(*p, sizeof(int32_t) * (size_t)(need > 0 ? need : 1));
    if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (%d tokens)", need);
    *p = q;
    *cap = need;
    return EG_OK;
}

static eg_status grow_f32(float **p, int64_t n, eg_error *err) {
    float *q = realloc(*p, sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (%lld floats)", (long long)n);
    *p = q;
    return EG_OK;
}

/* Copy a request's arrays into engine-owned storage (the pending buffer). */
static eg_status keep_pending(eg_engine *e, const eg_request *r, eg_error *err) {
    eg_status st;
    if ((st = grow_i32(&e->pending_tok, &e->pending_tok_cap, r->n_tokens, err)) ||
        (st = grow_i32(&e->pending_stop, &e->pending_stop_cap, r->n_stop, err)))
        return st;
    if (r->n_tokens) memcpy(e->pending_tok, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
    if (r->n_stop) memcpy(e->pending_stop, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop);
    e->pending = *r;
    e->pending.tokens = e->pending_tok;
    e->pending.stop_ids = e->pending_stop;
    e->have_pending = 1;
    return EG_OK;
}

/* Try to place the pending request in slot i. Returns 1 placed, 0 no room in cache. */
static int admit(eg_engine *e, int i, eg_error *err, eg_status *st) {
    const eg_request *r = &e->pending;
    slot_state *s = &e->slots[i];
    int need = r->n_tokens + r->max_new;
    *st = EG_OK;
    for (int k = 0; k < e->n_stages; k++) {
        eg_kv_cache *kv = eg_forward_kv(e->stages[k]);
        if (eg_kv_blocks_for(kv, need) > kv->n_free) {
            for (int j = 0; j < k; j++) eg_kv_release(eg_forward_kv(e->stages[j]), i);
            return 0;
        }
        if ((*st = eg_kv_reserve(kv, i, need, err))) return 0;
    }
    if ((*st = grow_i32(&s->tokens, &s->cap, need, err)) || (*st = grow_i32(&s->stop, &s->stop_cap, r->n_stop, err)))
        return 0;
    if (need > s->buf_cap) {
        int64_t H = e->m->cfg.hidden;
        if ((*st = grow_f32(&s->aux, (int64_t)need * (e->o.n_aux > 0 ? e->o.n_aux : 1) * H, err)) ||
            (*st = grow_f32(&s->final, (int64_t)need * H, err)) ||
            (e->o.want_logits && (*st = grow_f32(&s->logits, (int64_t)need * e->m->cfg.vocab, err))))
            return 0;
        s->buf_cap = need;
    }
    memcpy(s->tokens, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
    if (r->n_stop) memcpy(s->stop, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop);
    s->req = *r;
    s->req.tokens = s->tokens;
    s->req.stop_ids = s->stop;
    s->active = 1;
    s->finishing = 0;
    s->n_total = r->n_tokens;
    s->n_done = 0;
    s->n_generated = 0;
    s->finish = EG_FINISH_NONE;
    s->rng = r->rng;
    e->have_pending = 0;
    return 1;
}

static eg_status run_stages(eg_engine *e, eg_step *step, eg_error *err) {
    const float *in = NULL;
    for (int k = 0; k < e->n_stages; k++) {
        eg_step s = *step;
        float *out = (k % 2) ? e->xb : e->xa;
        s.x_in = in;
        s.x_out = k < e->n_stages - 1 ? out : NULL;
        if (k < e->n_stages - 1) { s.n_logits = 0; s.final_hidden = NULL; s.sampled = NULL; s.logits = NULL; }
        eg_status st = eg_forward_step(e->stages[k], &s, err);
        if (st) return st;
        in = out;
    }
    return EG_OK;
}

static eg_status finish_slot(eg_engine *e, int i, eg_done_fn done, void *ctx, eg_error *err) {
    slot_state *s = &e->slots[i];
    eg_result r = {.id = s->req.id, .user = s->req.user, .tokens = s->tokens, .n_tokens = s->n_total,
                   .prompt_len = s->req.n_tokens, .n_generated = s->n_generated, .finish = s->finish,
                   .n_aux = e->o.n_aux, .aux = s->aux, .final = s->final,
                   .logits = e->o.want_logits ? s->logits : NULL};
    s->active = 0;
    for (int k = 0; k < e->n_stages; k++) eg_kv_release(eg_forward_kv(e->stages[k]), i);
    e->stats.sequences++;
    return done(ctx, &r, err);
}

eg_status eg_engine_run(eg_engine *e, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err) {
    const int S = e->o.n_slots, Tmax = e->o.max_tokens, n_aux = e->o.n_aux;
    const int64_t H = e->m->cfg.hidden, V = e->m->cfg.vocab;
    int exhausted = 0;
    eg_status st;
    for (;;) {
        /* admission */
        for (int i = 0; i < S && !e->stop_requested; i++) {
            if (e->slots[i].active) continue;
            if (!e->have_pending) {
                if (exhausted) break;
                eg_request r;
                memset(&r, 0, sizeof r);
                int got = next(ctx, &r, err);
                if (got < 0) return err->code ? err->code : EG_ERR_INVALID;
                if (got == 0) { exhausted = 1; break; }
                if (r.n_tokens < 1) return eg_fail(err, EG_ERR_INVALID, "request %llu has no tokens", (unsigned long long)r.id);
                if (r.n_tokens + r.max_new > e->o.max_seq_len)
                    return eg_fail(err, EG_ERR_INVALID, "request %llu: %d prompt + %d new tokens exceed max_seq_len %d",
                                   (unsigned long long)r.id, r.n_tokens, r.max_new, e->o.max_seq_len);
                if ((st = keep_pending(e, &r, err))) return st;
            }
            if (!admit(e, i, err, &st)) {
                if (st) return st;
                break; /* cache full: wait for a slot to finish */
            }
        }
        int n_active = 0;
        for (int i = 0; i < S; i++) n_active += e->slots[i].active;
        if (!n_active) {
            if (e->have_pending)
                return eg_fail(err, EG_ERR_NOMEM, "request %llu (%d tokens) does not fit in the KV cache (%lld tokens)",
                               (unsigned long long)e->pending.id, e->pending.n_tokens + e->pending.max_new,
                               (long long)eg_engine_kv_capacity(e));
            return e->stop_requested ? eg_fail(err, EG_ERR_INTERRUPTED, "stopped on request") : EG_OK;
        }
        /* build a step: decode rows first, then prefill chunks, round-robin from rr */
        int T = 0, n_rows = 0;
        for (int pass = 0; pass < 2 && T < Tmax; pass++)
            for (int j = 0; j < S && T < Tmax; j++) {
                int i = (e->rr + j) % S;
                slot_state *s = &e->slots[i];
                if (!s->active || s->n_done >= s->n_total) continue;
                int remaining = s->n_total - s->n_done;
                int is_decode = s->n_generated > 0 || s->finishing;
                if ((pass == 0) != is_decode) continue;
                int n = remaining < Tmax - T ? remaining : Tmax - T;
                for (int k = 0; k < n; k++) {
                    e->tok[T + k] = s->tokens[s->n_done + k];
                    e->pos[T + k] = s->n_done + k;
                    e->slt[T + k] = i;
                    e->row_slot[T + k] = i;
                }
                int last = T + n - 1;
                int samples = s->n_done + n == s->n_total && !s->finishing && s->n_generated < s->req.max_new;
                if (e->o.want_logits) {
                    /* logits of every row; sampling rows are marked below */
                } else if (samples) {
                    e->rows[n_rows] = last;
                    e->sp[n_rows] = s->req.sp;
                    e->rng[n_rows] = s->rng;
                    n_rows++;
                }
                T += n;
            }
        e->rr = (e->rr + 1) % S;
        eg_step step = {.T = T, .tokens = e->tok, .pos = e->pos, .slot = e->slt, .capture = n_aux ? e->cap : NULL,
                        .final_hidden = e->fin};
        if (e->o.want_logits) {
            for (int r = 0; r < T; r++) e->rows[r] = r;
            step.n_logits = T;
            step.logit_rows = e->rows;
            step.logits = e->logits;
        } else {
            step.n_logits = n_rows;
            step.logit_rows = e->rows;
            step.sampled = e->sampled;
            step.sp = e->sp;
            step.rng = e->rng;
        }
        double t0 = eg_now();
        if ((st = run_stages(e, &step, err))) return st;
        e->stats.seconds += eg_now() - t0;
        e->stats.steps++;
        /* scatter captures, sample, advance */
        int row = 0, srow = 0;
        while (row < T) {
            int i = e->row_slot[row];
            slot_state *s = &e->slots[i];
            int n = 0;
            while (row + n < T && e->row_slot[row + n] == i) n++;
            for (int k = 0; k < n; k++) {
                int p = e->pos[row + k];
                for (int a = 0; a < n_aux; a++)
                    memcpy(s->aux + ((int64_t)p * n_aux + a) * H, e->cap + ((int64_t)a * T + row + k) * H, sizeof(float) * (size_t)H);
                memcpy(s->final + (int64_t)p * H, e->fin + (int64_t)(row + k) * H, sizeof(float) * (size_t)H);
                if (e->o.want_logits)
                    memcpy(s->logits + (int64_t)p * V, e->logits + (int64_t)(row + k) * V, sizeof(float) * (size_t)V);
            }
            if (s->n_generated == 0 && !s->finishing) e->stats.prefill_tokens += n;
            s->n_done += n;
            if (s->n_done == s->n_total && !s->finishing && s->n_generated < s->req.max_new) {
                int32_t tok;
                if (e->o.want_logits) {
                    /* sample on the host from the kept logits row */
                    tok = eg_sample_row(e->logits + (int64_t)(row + n - 1) * V, (int)V, &s->req.sp, &s->rng,
                                        e->sample_scratch, NULL);
                } else {
                    tok = e->sampled[srow];
                    s->rng = e->rng[srow];
                    srow++;
                }
                s->tokens[s->n_total++] = tok;
                s->n_generated++;
                e->stats.decode_tokens++;
                int is_stop = 0;
                for (int k = 0; k < s->req.n_stop; k++) is_stop |= s->stop[k] == tok;
                if (is_stop) { s->finish = EG_FINISH_STOP; s->finishing = 1; }
                else if (s->n_generated >= s->req.max_new) { s->finish = EG_FINISH_LENGTH; s->finishing = 1; }
            }
            if (s->n_done == s->n_total && (s->finishing || s->req.max_new == 0))
                if ((st = finish_slot(e, i, done, ctx, err))) return st;
            row += n;
        }
    }
}
