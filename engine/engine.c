/* The batch engine; see engine.h. */
#include "common/eg_thread.h"
#include "engine/engine.h"

#include "engine/collective.h"
#include "engine/cuda_plan.h"
#include "engine/transport.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    uint64_t age;       /* admission order, smaller = older: the preemption order */
    int recompute_to;   /* positions [0, recompute_to) were captured before the cache was
                           dropped: a recompute does not capture them again */
    int want;           /* > 0: stalled, needs positions [0, want) mapped for its next rows */
    float *aux;         /* [cap][n_aux][H] (F32 capture) */
    float *final;       /* [cap][H] (F32 capture) */
    uint16_t *aux16;    /* [cap][n_aux][H] (BF16 capture) */
    uint16_t *final16;  /* [cap][H] (BF16 capture) */
    float *final_pre;   /* [cap][H] pre-norm final state (F32 capture, opts.final_both) */
    uint16_t *final_pre16; /* [cap][H] likewise (BF16 capture) */
    float *logits;      /* [cap][V] */
    int64_t buf_cap;    /* capacity (tokens) of aux/final/logits */
    int stop_cap;
    /* speculative decoding (opts.drafter) */
    int dlen;           /* positions of this sequence the drafter holds (drafter.h) */
    int n_draft;        /* drafts verified by the step in flight (0: a plain row) */
    int32_t *draft;     /* [k] */
    eg_spec_q q;        /* k rows of the engine's q_cap ids: the proposer's distributions
                           (sampled requests; q.n NULL until one) */
    /* the host's draws for the step in flight (host_draws): the accepted drafts and the
       token after them, or a plain row's token in v_next */
    int v_acc;
    int32_t v_next;
} slot_state;

/* A preempted sequence waiting for cache room: its state as it left its slot, and its
 * cache on the host (swapped) or nothing (recompute on return). */
typedef struct parked_seq {
    slot_state s;
    int swapped;        /* 1: host[k] holds its first n_blocks blocks of stage k */
    int n_blocks;
    uint16_t **host;    /* [n_stages] eg_kv_save layout, page-locked where CUDA is present */
    int64_t *host_cap;  /* [n_stages] bytes allocated in host[k] (kept for reuse) */
} parked_seq;

/* One draw of a step on the host (host_draws): a verify chunk's or a plain sampled row's. */
typedef struct host_job {
    int slot, lr, verify; /* lr: the chunk's first logit row of the step */
    int fr;               /* its first row in mb->logits (= lr unless the step deferred) */
    int decided, n, rejected; /* deferred: the acceptance tests ran (eg_spec_accept) */
    int on_backend, bi;   /* deferred: its token was drawn on the backend, entry bi of the
                             micro-batch's b* lists (tok) */
    int ki;               /* deferred, rejected: entry ki of the k* lists holds the row's kept
                             set (-1: the row came over instead) */
    int32_t tok;
} host_job;

/* A micro-batch: a fixed group of slots (slot i belongs to micro-batch i % M) with its
 * own step buffers, so M of them can be in flight through the pipeline at once. */
typedef struct micro_batch {
    int index;
    int busy;
    int rr;              /* rotation of its decode pass over its own slots (a drafter's) */
    eg_status status;    /* of the step in flight */
    int sent_to;         /* stage whose receive of this step's rows is posted-for (a send is in flight), -1 none */
    eg_error err;
    int T, n_rows;
    int32_t *tok, *pos, *slt, *rows, *sampled; /* [T] */
    eg_sample_params *sp;                      /* [T] */
    uint64_t *rng;                             /* [T] */
    float *cap;                                /* [n_aux][T][H] */
    float *fin;                                /* [T][H] */
    float *fin_pre;                            /* [T][H] pre-norm final state (opts.final_both) */
    float *logits;                             /* [T][V] when want_logits; [rows][V] with a
                                                  drafter: the rows logit_rows lists */
    int32_t *ptok;                             /* [T] by logit row: the draft whose p the
                                                  backend gives (-1 none); NULL = the host's */
    double *prob;                              /* [T] by logit row: those p (NaN = not given) */
    int n_ptok;                                /* logit rows of this step with a ptok */
    int defer;                                 /* sampled verify rows with the backend's p: the
                                                  logits rows stay on the backend until the
                                                  rule knows which it needs (defer_decide) */
    int argmax_only;                           /* with a drafter, every logit row greedy: the
                                                  backend's argmaxes (sampled) come back,
                                                  not the rows (logits) */
    int n_spec;                                /* sequences verifying drafts in this step */
    /* the step's host draws (host_draws): its jobs, and for a deferred step (defer_decide:
     * on the last stage's thread when the stages are threaded, else the driver's) the
     * lists: [max_tokens] each the logit rows it takes to the host and the rows drawn on
     * the backend with their parameters, RNG states and tokens; where the backend offers
     * kept_probs, [mb_slots] each a rejected draft's logit row, its parameters and the
     * kept set the backend gave (n, or -1: the row comes over instead) in rows of kept_cap */
    int mb_slots;                              /* its slots: ceil(n_slots / M) at most */
    host_job *hjobs;                           /* [mb_slots] one job a slot at most */
    int n_jobs, n_verify;
    int decided;                               /* defer_decide ran for this step */
    int32_t *fetch, *brow, *btok;
    eg_sample_params *bsp;
    uint64_t *brng;
    int32_t *krow, *kn, *kid;
    eg_sample_params *ksp;
    double *kp;
    int64_t n_fetched, n_bdraws, n_kresid;     /* its rows taken, backend draws, kept-set residuals */
    int leave;                                 /* a marker, not a step: stage k leaves its
                                                  expert-parallel group (eg_engine_ep_leave) */
    struct micro_batch *qnext;
} micro_batch;

/* A blocking FIFO of micro-batches between threads. */
typedef struct mb_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    micro_batch *head, *tail;
    int closed;
} mb_queue;

struct eg_engine {
    const eg_model *m;
    eg_backend *be;
    eg_engine_opts o;
    int *aux_layers;
    int64_t *stage_count; /* [n_stages] steps each stage ran; stage k's thread alone adds to its own */
    int n_stages;
    eg_forward **stages;
    eg_transport *transport; /* hands rows between stages (n_stages > 1) */
    eg_backend **stage_be;   /* [n_stages] each stage's backend (borrowed) */
    slot_state *slots;
    int n_mb;
    micro_batch *mbs;
    int threaded;
    pthread_t *threads;
    mb_queue *queues;    /* [n_stages + 1]: input of each stage, then completions */
    micro_batch *leave_mb; /* [n_stages] threaded expert-parallel rank: the leave markers */
    /* host sampling (want_logits or a drafter): a step's rows drawn at once (host_draws) */
    eg_pool *hpool;        /* NULL: on the driving thread */
    eg_spec_scratch **hsc; /* [n_hsc] a scratch per thread */
    int n_hsc;
    int kept_cap;          /* ids of a kept set asked for (0: the backend offers no kept_probs) */
    int backend_probs;     /* the last stage's backend gives sampled verify rows' p(draft) */
    int spec_in_flight;    /* threaded: micro-batches with verify rows in the pipeline */
    double spec_since;     /* when the first of them went in */
    eg_request pending;
    int have_pending;
    int32_t *pending_tok, *pending_stop;
    int pending_tok_cap, pending_stop_cap;
    int stop_requested; /* eg_engine_request_stop: atomic accesses only */
    eg_engine_stats stats;     /* written by the thread that runs the engine only */
    pthread_mutex_t pub_mu;    /* guards pub */
    eg_engine_stats pub;       /* stats as of the start of the run loop's last pass (and the
                                  run's end): what other threads read */
    /* KV scheduling (on-demand policy) */
    parked_seq *parked;  /* [n_slots]; [0, n_parked) hold sequences */
    int n_parked, n_active;
    int starved;         /* slots stalled for a block since the last preemption pass */
    int draining;        /* launching paused until nothing is in flight */
    uint64_t next_age;
    int64_t watermark;   /* blocks */
    int64_t host_held;   /* bytes allocated for swapped caches (all parked entries) */
    /* speculative decoding */
    eg_drafter *dr;      /* opts.drafter (borrowed) */
    int dk;              /* opts.draft_tokens */
    int q_cap;           /* ids per q row: the drafter's info.q_cap, or V */
    int n_daux;          /* the drafter's aux layers */
    int *daux;           /* [n_daux] index of each in aux_layers */
    float *dstage;       /* [max_tokens][n_daux][H] aux rows handed to the drafter */
    int32_t *dnext;      /* [max_tokens] their next tokens */
    eg_draft_extend *dx;  /* [n_slots] one batched catch-up's items */
    eg_draft_propose *dp; /* [n_slots] one step's proposals */
    int *pend_slot, *pend_row; /* [n_slots] a micro-batch's verify chunks: slot, first row */
};

static void q_init(mb_queue *q) {
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->head = q->tail = NULL;
    q->closed = 0;
}
static void q_destroy(mb_queue *q) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}
static void q_push(mb_queue *q, micro_batch *mb) {
    pthread_mutex_lock(&q->mu);
    mb->qnext = NULL;
    if (q->tail) q->tail->qnext = mb; else q->head = mb;
    q->tail = mb;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
static micro_batch *q_pop(mb_queue *q) { /* NULL once closed and empty */
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
    micro_batch *mb = q->head;
    if (mb) {
        q->head = mb->qnext;
        if (!q->head) q->tail = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    return mb;
}
static void q_close(mb_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Host step buffers that receive device copies (captures, hand-over, logits) are
 * page-locked where CUDA is present, so to_host is truly asynchronous. */
static void mb_free(micro_batch *mb) {
    free(mb->tok); free(mb->pos); free(mb->slt); free(mb->rows); free(mb->sampled);
    free(mb->sp); free(mb->rng); free(mb->ptok); free(mb->prob);
    free(mb->hjobs);
    free(mb->fetch); free(mb->brow); free(mb->btok); free(mb->bsp); free(mb->brng);
    free(mb->krow); free(mb->kn); free(mb->kid); free(mb->ksp); free(mb->kp);
    eg_cuda_host_free(mb->cap); eg_cuda_host_free(mb->fin); eg_cuda_host_free(mb->logits);
    eg_cuda_host_free(mb->fin_pre);
}

static void stop_threads(eg_engine *e) {
    if (!e->threads) return;
    for (int k = 0; k <= e->n_stages; k++) q_close(&e->queues[k]);
    for (int k = 0; k < e->n_stages; k++) pthread_join(e->threads[k], NULL);
    free(e->threads);
    e->threads = NULL;
}

/* The slot's q for the acceptance rule: sampled requests only (a greedy one's drafts
 * are deterministic; its q rows, if any, are a former request's). */
static eg_spec_q *slot_q(slot_state *s) { return s->req.sp.temperature > 0.0f && s->q.n ? &s->q : NULL; }

/* The buffers of s without its sequence: what a free slot or an unused parked entry
 * keeps for the next sequence admitted (admit takes a spare set before allocating). */
static slot_state slot_spare(const slot_state *s) {
    slot_state b;
    memset(&b, 0, sizeof b);
    b.tokens = s->tokens; b.cap = s->cap;
    b.stop = s->stop; b.stop_cap = s->stop_cap;
    b.aux = s->aux; b.final = s->final; b.final_pre = s->final_pre;
    b.aux16 = s->aux16; b.final16 = s->final16; b.final_pre16 = s->final_pre16;
    b.logits = s->logits; b.buf_cap = s->buf_cap;
    b.draft = s->draft; b.q = s->q;
    return b;
}

static void slot_free(slot_state *s) {
    free(s->tokens); free(s->stop); free(s->aux); free(s->final); free(s->aux16); free(s->final16); free(s->logits);
    free(s->final_pre); free(s->final_pre16);
    free(s->draft);
    eg_spec_q_free(&s->q);
    memset(s, 0, sizeof *s);
}

void eg_engine_free(eg_engine *e) {
    if (!e) return;
    stop_threads(e);
    pthread_mutex_destroy(&e->pub_mu);
    eg_transport_free(e->transport);
    if (e->queues) {
        for (int k = 0; k <= e->n_stages; k++) q_destroy(&e->queues[k]);
        free(e->queues);
    }
    if (e->stages)
        for (int i = 0; i < e->n_stages; i++) eg_forward_free(e->stages[i]);
    free(e->stages);
    free(e->stage_be);
    if (e->slots)
        for (int i = 0; i < e->o.n_slots; i++) slot_free(&e->slots[i]);
    free(e->slots);
    if (e->parked)
        for (int i = 0; i < e->o.n_slots; i++) {
            parked_seq *p = &e->parked[i];
            slot_free(&p->s);
            for (int k = 0; p->host && k < e->n_stages; k++) eg_cuda_host_free(p->host[k]);
            free(p->host);
            free(p->host_cap);
        }
    free(e->parked);
    if (e->mbs)
        for (int j = 0; j < e->n_mb; j++) mb_free(&e->mbs[j]);
    free(e->mbs);
    free(e->leave_mb);
    free(e->aux_layers);
    free(e->stage_count);
    for (int t = 0; e->hsc && t < e->n_hsc; t++) eg_spec_scratch_free(e->hsc[t]);
    free(e->hsc);
    eg_pool_free(e->hpool);
    free(e->pending_tok); free(e->pending_stop);
    free(e->daux); free(e->dstage); free(e->dnext);
    free(e->dx); free(e->dp); free(e->pend_slot); free(e->pend_row);
    free(e);
}

static eg_status defer_decide(eg_engine *e, micro_batch *mb, eg_error *err);

/* Run one micro-batch's step through stage k (any thread): receive its rows from
 * stage k-1, compute, send them on to stage k+1. Only the last stage waits for its
 * backend; earlier stages leave ordering to the transport (transport.h). */
static eg_status run_stage(eg_engine *e, int k, micro_batch *mb) {
    eg_step s = {.T = mb->T, .tokens = mb->tok, .pos = mb->pos, .slot = mb->slt,
                 .capture = e->o.n_aux ? mb->cap : NULL, .x_device = 1};
    eg_status st = EG_OK;
    if (k > 0 && (st = e->transport->ops->recv(e->transport, k - 1, mb->index, eg_forward_in(e->stages[k]),
                                               (size_t)mb->T * (size_t)eg_forward_in_floats(e->stages[k]), &mb->err)))
        return eg_wrap(&mb->err, "pipeline stage %d", k);
    if (k < e->n_stages - 1) {
        s.async = 1;
    } else {
        s.final_hidden = mb->fin;
        s.final_pre_hidden = mb->fin_pre;
        s.logit_rows = mb->rows;
        if (mb->argmax_only) { /* greedy verify and plain rows: ids, no logits to the host */
            s.n_logits = mb->n_rows;
            s.sampled = mb->sampled;
            s.sp = mb->sp;
            s.rng = mb->rng;
        } else if (e->o.want_logits || e->dr) {
            s.n_logits = e->o.want_logits ? mb->T : mb->n_rows;
            s.logits = mb->defer ? NULL : mb->logits;
            if (mb->n_ptok) { /* the verify rows' p(draft) from the backend */
                s.sp = mb->sp;
                s.prob_tok = mb->ptok;
                s.prob = mb->prob;
            }
        } else {
            s.n_logits = mb->n_rows;
            s.sampled = mb->sampled;
            s.sp = mb->sp;
            s.rng = mb->rng;
        }
    }
    st = eg_forward_step(e->stages[k], &s, &mb->err);
    /* threaded: the decisions that need the last stage's logits rows are taken here, on
     * its thread, before its backend moves on to the next micro-batch */
    if (!st && k == e->n_stages - 1 && e->threaded && mb->defer) st = defer_decide(e, mb, &mb->err);
    if (!st && k < e->n_stages - 1) {
        st = e->transport->ops->send(e->transport, k, mb->index, eg_forward_out(e->stages[k]),
                                     (size_t)mb->T * (size_t)eg_forward_out_floats(e->stages[k]), &mb->err);
        if (!st) mb->sent_to = k + 1;
    }
    if (st && e->n_stages > 1) eg_wrap(&mb->err, "pipeline stage %d", k);
    return st;
}

typedef struct { eg_engine *e; int k; } stage_arg;

static void *stage_thread(void *vp) {
    stage_arg *a = vp;
    eg_engine *e = a->e;
    int k = a->k;
    free(a);
    micro_batch *mb;
    eg_error bind_err;
    eg_status bind_st = eg_backend_bind(e->stage_be[k], &bind_err);
    while ((mb = q_pop(&e->queues[k]))) {
        if (mb->leave) {
            /* pass the marker on first: the next stage must leave (serve) while this one
             * waits in its group for ranks whose later stages still run their steps */
            if (k + 1 < e->n_stages) q_push(&e->queues[k + 1], &e->leave_mb[k + 1]);
            /* a stage that cannot bind its device cannot serve: the group must not wait on it */
            if (bind_st && e->o.ep_stages && e->o.ep_stages[k]) eg_ep_fail(e->o.ep_stages[k]);
            mb->status = bind_st ? (mb->err = bind_err, bind_st)
                                 : eg_ep_leave(e->o.ep_stages[k], e->o.ep_rank, e->stage_be[k], &mb->err);
            q_push(&e->queues[e->n_stages], mb);
            continue;
        }
        if (!mb->status && bind_st) {
            mb->status = bind_st;
            mb->err = bind_err;
        }
        if (mb->status && mb->sent_to == k) {
            /* stage k-1 sent before this stage failed (its bind, say): take the rows
             * anyway, or the sender's stream (NCCL) holds a transfer nobody completes */
            eg_error ignored;
            e->transport->ops->recv(e->transport, k - 1, mb->index, eg_forward_in(e->stages[k]),
                                    (size_t)mb->T * (size_t)eg_forward_in_floats(e->stages[k]), &ignored);
        }
        mb->sent_to = -1;
        if (!mb->status) mb->status = run_stage(e, k, mb);
        /* stage k's own counter; the driver reads them while stages run (progress) */
        __atomic_fetch_add(&e->stage_count[k], 1, __ATOMIC_RELAXED);
        q_push(&e->queues[k + 1], mb);
    }
    return NULL;
}

typedef struct stage_build {
    const eg_model *m;
    eg_backend *be;
    eg_forward_opts fo;
    eg_forward **out;
    eg_status st;
    eg_error err;
    pthread_t th;
    int started;
} stage_build;

static void *stage_build_thread(void *vp) {
    stage_build *b = vp;
    /* this thread uploads the stage's weights: it must drive the stage's own GPU */
    if (!(b->st = eg_backend_bind(b->be, &b->err))) b->st = eg_forward_create(b->m, b->be, &b->fo, b->out, &b->err);
    return NULL;
}

static eg_status mb_alloc(eg_engine *e, micro_batch *mb, eg_error *err) {
    size_t T = (size_t)e->o.max_tokens, H = (size_t)e->m->cfg.hidden, V = (size_t)e->m->cfg.vocab;
    mb->tok = eg_malloc(4 * T, err); mb->pos = eg_malloc(4 * T, err); mb->slt = eg_malloc(4 * T, err);
    mb->rows = eg_malloc(4 * T, err); mb->sampled = eg_malloc(4 * T, err);
    mb->sp = eg_malloc(sizeof *mb->sp * T, err); mb->rng = eg_malloc(8 * T, err);
    mb->cap = eg_cuda_host_alloc(4 * T * H * (size_t)(e->o.n_aux + 1), err);
    mb->fin = eg_cuda_host_alloc(4 * T * H, err);
    if (e->o.final_both && !(mb->fin_pre = eg_cuda_host_alloc(4 * T * H, err))) return EG_ERR_NOMEM;
    size_t LR = T; /* logit rows: every row, or with a drafter at most k + 1 per sequence */
    if (!e->o.want_logits && e->o.drafter && (size_t)e->o.n_slots * (size_t)(e->o.draft_tokens + 1) < LR)
        LR = (size_t)e->o.n_slots * (size_t)(e->o.draft_tokens + 1);
    int want_l = e->o.want_logits || e->o.drafter;
    if (want_l) mb->logits = eg_cuda_host_alloc(4 * LR * V, err);
    if (e->backend_probs) {
        mb->ptok = eg_malloc(4 * T, err);
        mb->prob = eg_malloc(sizeof(double) * T, err);
    }
    if (!mb->tok || !mb->pos || !mb->slt || !mb->rows || !mb->sampled || !mb->sp || !mb->rng || !mb->cap || !mb->fin ||
        (want_l && !mb->logits) || (e->backend_probs && (!mb->ptok || !mb->prob)))
        return EG_ERR_NOMEM;
    mb->mb_slots = (e->o.n_slots + e->n_mb - 1) / e->n_mb; /* slot i is micro-batch i % M's */
    const size_t ns = (size_t)mb->mb_slots, kc = ns * (size_t)e->kept_cap;
    if (e->hsc && !(mb->hjobs = eg_malloc(sizeof *mb->hjobs * ns, err))) return EG_ERR_NOMEM;
    if (e->backend_probs &&
        (!(mb->fetch = eg_malloc(4 * T, err)) || !(mb->brow = eg_malloc(4 * T, err)) ||
         !(mb->btok = eg_malloc(4 * T, err)) || !(mb->bsp = eg_malloc(sizeof *mb->bsp * T, err)) ||
         !(mb->brng = eg_malloc(8 * T, err))))
        return EG_ERR_NOMEM;
    if (e->kept_cap &&
        (!(mb->krow = eg_malloc(4 * ns, err)) || !(mb->kn = eg_malloc(4 * ns, err)) ||
         !(mb->ksp = eg_malloc(sizeof *mb->ksp * ns, err)) || !(mb->kid = eg_malloc(4 * kc, err)) ||
         !(mb->kp = eg_malloc(sizeof(double) * kc, err))))
        return EG_ERR_NOMEM;
    return EG_OK;
}

/* Speculative decoding: check the drafter against the engine, map its aux layers onto
 * the captured ones, allocate the hand-over buffers. */
static eg_status spec_setup(eg_engine *e, eg_error *err) {
    const eg_engine_opts *o = &e->o;
    const eg_drafter_info *di = &o->drafter->info;
    const eg_config *c = &e->m->cfg;
    const char *kind = di->kind ? di->kind : "drafter";
    if (o->draft_tokens < 1)
        return eg_fail(err, EG_ERR_INVALID, "speculative decoding: %d draft tokens (need at least 1)", o->draft_tokens);
    if (o->max_tokens < o->draft_tokens + 1)
        return eg_fail(err, EG_ERR_INVALID,
                       "speculative decoding: %d rows per step cannot hold a verify chunk of %d drafts + 1", o->max_tokens,
                       o->draft_tokens);
    if (o->spec_rule != EG_SPEC_EXACT && o->spec_rule != EG_SPEC_BROKEN_ACCEPT)
        return eg_fail(err, EG_ERR_INVALID, "speculative decoding: unknown acceptance rule %d", (int)o->spec_rule);
    if (di->target_vocab != c->vocab || di->hidden != c->hidden)
        return eg_fail(err, EG_ERR_INVALID, "%s: made for a target with vocabulary %d and hidden size %d, the model has %d and %d",
                       kind, di->target_vocab, di->hidden, c->vocab, c->hidden);
    if (di->n_slots < o->n_slots || di->max_seq_len < o->max_seq_len)
        return eg_fail(err, EG_ERR_INVALID, "%s: holds %d slots of %d positions, the engine needs %d of %d", kind,
                       di->n_slots, di->max_seq_len, o->n_slots, o->max_seq_len);
    e->dr = o->drafter;
    e->dk = o->draft_tokens;
    e->q_cap = di->q_cap > 0 && di->q_cap < c->vocab ? di->q_cap : (int)c->vocab;
    e->n_daux = di->n_aux;
    e->daux = eg_malloc(sizeof(int) * (size_t)(di->n_aux + 1), err);
    if (!e->daux) return EG_ERR_NOMEM;
    for (int a = 0; a < di->n_aux; a++) {
        int j = 0;
        while (j < o->n_aux && e->aux_layers[j] != di->aux_layers[a]) j++;
        if (j == o->n_aux)
            return eg_fail(err, EG_ERR_INVALID, "%s reads target layer %d, which is not among the %d captured layers", kind,
                           di->aux_layers[a], o->n_aux);
        e->daux[a] = j;
    }
    size_t rows = (size_t)o->max_tokens;
    e->dstage = eg_malloc(sizeof(float) * rows * (size_t)(di->n_aux > 0 ? di->n_aux : 1) * (size_t)c->hidden, err);
    e->dnext = eg_malloc(sizeof(int32_t) * rows, err);
    e->dx = eg_malloc(sizeof *e->dx * (size_t)o->n_slots, err);
    e->dp = eg_malloc(sizeof *e->dp * (size_t)o->n_slots, err);
    e->pend_slot = eg_malloc(sizeof(int) * (size_t)o->n_slots, err);
    e->pend_row = eg_malloc(sizeof(int) * (size_t)o->n_slots, err);
    if (!e->dstage || !e->dnext || !e->dx || !e->dp || !e->pend_slot || !e->pend_row) return EG_ERR_NOMEM;
    return EG_OK;
}

eg_status eg_engine_create(const eg_model *m, eg_backend *be, const eg_engine_opts *o, eg_engine **out,
                           eg_error *err) {
    *out = NULL;
    const eg_config *c = &m->cfg;
    if (o->n_slots < 1 || o->max_seq_len < 2 || o->max_tokens < 1)
        return eg_fail(err, EG_ERR_INVALID, "engine: need n_slots >= 1, max_seq_len >= 2, max_tokens >= 1");
    if (o->final_both && o->final_pre_norm)
        return eg_fail(err, EG_ERR_INVALID, "engine: final_both keeps the post-norm state as final; final_pre_norm must be 0");
    for (int i = 0; i < o->n_aux; i++)
        if (o->aux_layers[i] < -1 || o->aux_layers[i] >= c->n_layers)
            return eg_fail(err, EG_ERR_INVALID, "capture layer %d out of range for a %d-layer model (0..%d)",
                           o->aux_layers[i], c->n_layers, c->n_layers - 1);
    eg_engine *e = eg_calloc(1, sizeof *e, err);
    if (!e) return EG_ERR_NOMEM;
    pthread_mutex_init(&e->pub_mu, NULL);
    e->m = m;
    e->be = be;
    e->o = *o;
    e->aux_layers = eg_malloc(sizeof(int) * (size_t)(o->n_aux + 1), err);
    if (!e->aux_layers) { free(e); return EG_ERR_NOMEM; }
    if (o->n_aux) memcpy(e->aux_layers, o->aux_layers, sizeof(int) * (size_t)o->n_aux);
    e->o.aux_layers = e->aux_layers;
    e->n_stages = o->stage_ends && o->n_stages > 0 ? o->n_stages : 1;
    e->o.stage_ends = NULL;
    e->o.stage_cuts = NULL;
    e->o.stage_backends = NULL;
    e->threaded = e->n_stages > 1 && o->stage_backends;
    eg_status st = EG_OK;
    if (o->ep && e->threaded && !o->ep_stages) {
        eg_engine_free(e);
        return eg_fail(err, EG_ERR_INVALID, "an expert-parallel rank with %d stage threads needs a group per stage "
                       "(ep_stages)", e->n_stages);
    }
    if (o->ep && e->threaded &&
        !(e->leave_mb = eg_calloc((size_t)e->n_stages, sizeof *e->leave_mb, err))) {
        eg_engine_free(e);
        return EG_ERR_NOMEM;
    }
    for (int k = 0; e->leave_mb && k < e->n_stages; k++) e->leave_mb[k] = (micro_batch){.index = -1, .leave = 1, .sent_to = -1};
    if (o->drafter && (st = spec_setup(e, err))) {
        eg_engine_free(e);
        return st;
    }
    e->n_mb = e->threaded ? (o->micro_batches > e->n_stages ? o->micro_batches : e->n_stages) : 1;
    if (e->n_mb > o->n_slots) e->n_mb = o->n_slots;
    e->stages = eg_calloc((size_t)e->n_stages, sizeof *e->stages, err);
    e->stage_count = eg_calloc((size_t)e->n_stages, sizeof *e->stage_count, err);
    e->stage_be = eg_calloc((size_t)e->n_stages, sizeof *e->stage_be, err);
    e->slots = eg_calloc((size_t)o->n_slots, sizeof *e->slots, err);
    e->mbs = eg_calloc((size_t)e->n_mb, sizeof *e->mbs, err);
    e->parked = eg_calloc((size_t)o->n_slots, sizeof *e->parked, err);
    if (!e->stages || !e->stage_count || !e->stage_be || !e->slots || !e->mbs || !e->parked) {
        eg_engine_free(e);
        return EG_ERR_NOMEM;
    }
    if (o->want_logits || o->drafter) { /* the host's draws: a pool and a scratch per thread */
        int nt = o->host_threads > 0 ? o->host_threads : eg_num_threads();
        if (nt > 16) nt = 16;
        if (nt > o->n_slots) nt = o->n_slots;
        if (nt < 1) nt = 1;
        eg_status hst = nt > 1 ? eg_pool_create(nt, &e->hpool, err) : EG_OK;
        e->n_hsc = e->hpool ? eg_pool_size(e->hpool) : 1;
        e->hsc = hst ? NULL : eg_calloc((size_t)e->n_hsc, sizeof *e->hsc, err);
        for (int t = 0; e->hsc && !hst && t < e->n_hsc; t++) hst = eg_spec_scratch_create(c->vocab, &e->hsc[t], err);
        if (hst || !e->hsc) {
            eg_engine_free(e);
            return hst ? hst : EG_ERR_NOMEM;
        }
    }
    if (o->kv_policy != EG_KV_ON_DEMAND && o->kv_policy != EG_KV_RESERVE) {
        eg_engine_free(e);
        return eg_fail(err, EG_ERR_INVALID, "engine: unknown KV policy %d", (int)o->kv_policy);
    }
    for (int i = 0; i < o->n_slots; i++) {
        e->parked[i].host = eg_calloc((size_t)e->n_stages, sizeof *e->parked[i].host, err);
        e->parked[i].host_cap = eg_calloc((size_t)e->n_stages, sizeof *e->parked[i].host_cap, err);
        if (!e->parked[i].host || !e->parked[i].host_cap) { eg_engine_free(e); return EG_ERR_NOMEM; }
    }
    if (e->dr && o->spec_probs >= 0) { /* who gives the verify rows' p(draft) */
        const eg_backend *lb = e->threaded ? o->stage_backends[e->n_stages - 1] : be;
        e->backend_probs = lb->ops->token_probs && (o->spec_probs > 0 || strcmp(lb->ops->name, "cpu") != 0);
        if (e->backend_probs && lb->ops->kept_probs) e->kept_cap = m->cfg.vocab < EG_KEPT_CAP ? m->cfg.vocab : EG_KEPT_CAP;
    }
    for (int j = 0; j < e->n_mb; j++) {
        e->mbs[j].index = j;
        if ((st = mb_alloc(e, &e->mbs[j], err))) { eg_engine_free(e); return st; }
    }
    /* validate the split, then build the stages: with one backend per stage (one GPU
     * each) every stage uploads its own layers from the mmapped shards in parallel */
    stage_build *sbs = eg_calloc((size_t)e->n_stages, sizeof *sbs, err);
    if (!sbs) { eg_engine_free(e); return EG_ERR_NOMEM; }
    int begin = 0, prev_end = 0, head = 0, any_cut = 0;
    for (int i = 0; i < e->n_stages; i++) {
        int end = o->stage_ends && o->n_stages > 0 ? o->stage_ends[i] : c->n_layers;
        int cut = o->stage_cuts && i < e->n_stages - 1 ? o->stage_cuts[i] : 0;
        if (end <= prev_end || end > c->n_layers || (i == e->n_stages - 1 && end != c->n_layers)) {
            free(sbs);
            eg_engine_free(e);
            return eg_fail(err, EG_ERR_INVALID, "pipeline stages: stage %d ends at layer %d (must increase and end at %d)",
                           i, end, c->n_layers);
        }
        const char *why = cut < 0 || (cut && cut >= c->n_experts) ? "the cut must be in 1..routed experts - 1"
                          : cut && !m->layers[end - 1].is_moe             ? "the layer is dense (no routed experts)"
                                                                          : NULL;
        if (why) {
            free(sbs);
            eg_engine_free(e);
            return eg_fail(err, EG_ERR_INVALID, "pipeline stages: stage %d splits layer %d at expert %d of %d: %s", i,
                           end - 1, cut, c->n_experts, why);
        }
        any_cut |= cut > 0;
        e->stage_be[i] = e->threaded ? o->stage_backends[i] : be;
        sbs[i] = (stage_build){.m = m, .be = e->stage_be[i], .out = &e->stages[i],
                               .fo = {.layer_begin = begin, .layer_end = end, .max_tokens = o->max_tokens,
                                      .logit_rows = eg_forward_logit_rows(o->max_tokens, o->n_slots,
                                                                          o->drafter ? o->draft_tokens : 0,
                                                                          o->want_logits),
                                      .n_slots = o->n_slots, .max_seq_len = o->max_seq_len, .block_size = o->block_size,
                                      .kv_blocks = o->kv_blocks, .capture = e->aux_layers, .n_capture = o->n_aux,
                                      .final_pre_norm = o->final_pre_norm,
                                      .ep = o->ep && e->threaded ? o->ep_stages[i] : o->ep,
                                      .ep_rank = o->ep_rank, .head_cut = head, .tail_cut = cut}};
        /* after a cut the next stage starts with the same layer's remaining experts */
        prev_end = end;
        begin = cut ? end - 1 : end;
        head = cut;
    }
    for (int i = 1; i < e->n_stages; i++) /* a thread each (inline if none can start) */
        if (!e->threaded || eg_thread_start(&sbs[i].th, stage_build_thread, &sbs[i])) stage_build_thread(&sbs[i]);
        else sbs[i].started = 1;
    stage_build_thread(&sbs[0]);
    for (int i = 0; i < e->n_stages; i++)
        if (sbs[i].started) pthread_join(sbs[i].th, NULL);
    for (int i = 0; i < e->n_stages; i++)
        if (sbs[i].st) {
            st = sbs[i].st;
            *err = sbs[i].err;
            eg_wrap(err, "stage %d (layers %d..%d)", i, sbs[i].fo.layer_begin, sbs[i].fo.layer_end - 1);
            free(sbs);
            eg_engine_free(e);
            return st;
        }
    free(sbs);
    if (e->n_stages > 1) {
        eg_transport_opts to = {.name = o->transport, .stages = e->stage_be, .n_stages = e->n_stages,
                                .n_micro_batches = e->n_mb,
                                .max_floats = (size_t)o->max_tokens *
                                              (size_t)(any_cut ? eg_forward_handover_floats(c) : c->hidden)};
        if ((st = eg_transport_create(&to, &e->transport, err))) { eg_engine_free(e); return st; }
    }
    if (e->threaded) {
        e->queues = eg_calloc((size_t)e->n_stages + 1, sizeof *e->queues, err);
        e->threads = eg_calloc((size_t)e->n_stages, sizeof *e->threads, err);
        if (!e->queues || !e->threads) { eg_engine_free(e); return EG_ERR_NOMEM; }
        for (int k = 0; k <= e->n_stages; k++) q_init(&e->queues[k]);
        for (int k = 0; k < e->n_stages; k++) {
            stage_arg *a = malloc(sizeof *a);
            if (!a || eg_thread_start(&e->threads[k], stage_thread, a ? (a->e = e, a->k = k, a) : NULL)) {
                free(a);
                for (int j = 0; j < k; j++) q_close(&e->queues[j]);
                for (int j = 0; j < k; j++) pthread_join(e->threads[j], NULL);
                free(e->threads);
                e->threads = NULL;
                eg_engine_free(e);
                return eg_fail(err, EG_ERR_NOMEM, "cannot start pipeline stage thread %d", k);
            }
        }
    }
    {
        int64_t pool = eg_forward_kv(e->stages[0])->n_blocks;
        e->watermark = o->kv_watermark > 0 ? o->kv_watermark : (pool + 99) / 100;
        if (e->watermark < 1) e->watermark = 1;
    }
    *out = e;
    return EG_OK;
}

/* From another thread or a signal handler: an atomic store (lock-free, signal-safe), read
 * with an atomic load at the engine's checks. */
void eg_engine_request_stop(eg_engine *e) { __atomic_store_n(&e->stop_requested, 1, __ATOMIC_RELAXED); }
void eg_engine_get_stats(const eg_engine *e, eg_engine_stats *s) {
    *s = e->stats;
    if (e->dr) {
        s->draft_kept = e->dr->draws.kept;
        s->draft_argmax = e->dr->draws.argmax;
        s->draft_host_rows = e->dr->draws.host_rows;
    }
    for (int k = 0; k < e->n_stages; k++)
        s->stage_steps[k < 8 ? k : 7] += __atomic_load_n(&e->stage_count[k], __ATOMIC_RELAXED);
}
static void publish_stats(eg_engine *e) {
    eg_engine_stats s;
    eg_engine_get_stats(e, &s);
    pthread_mutex_lock(&e->pub_mu);
    e->pub = s;
    pthread_mutex_unlock(&e->pub_mu);
}
void eg_engine_get_stats_shared(eg_engine *e, eg_engine_stats *s) {
    pthread_mutex_lock(&e->pub_mu);
    *s = e->pub;
    pthread_mutex_unlock(&e->pub_mu);
}
void eg_engine_graph_stats(const eg_engine *e, eg_forward_graph_stats *out) {
    memset(out, 0, sizeof *out);
    for (int k = 0; k < e->n_stages; k++) {
        eg_forward_graph_stats g;
        eg_forward_get_graph_stats(e->stages[k], &g);
        out->recorded += g.recorded;
        out->replays += g.replays;
        out->failed += g.failed;
        out->stale += g.stale;
        out->evicted += g.evicted;
        if (!out->first_failure[0] && g.first_failure[0]) {
            int n = snprintf(out->first_failure, sizeof out->first_failure, "stage %d: ", k);
            if (n > 0 && (size_t)n < sizeof out->first_failure)
                snprintf(out->first_failure + n, sizeof out->first_failure - (size_t)n, "%.*s",
                         (int)(sizeof out->first_failure - (size_t)n - 1), g.first_failure);
        }
    }
}
const char *eg_engine_transport(const eg_engine *e) { return e->transport ? eg_transport_name(e->transport) : "none"; }
int64_t eg_engine_kv_capacity(const eg_engine *e) {
    eg_kv_cache *kv = eg_forward_kv(e->stages[0]);
    return kv->n_blocks * kv->block_size;
}
int64_t eg_engine_kv_watermark(const eg_engine *e) { return e->watermark; }
int64_t eg_engine_weight_bytes(const eg_engine *e) {
    int64_t n = 0;
    for (int i = 0; i < e->n_stages; i++) n += eg_forward_weight_bytes(e->stages[i]);
    return n;
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

/* ---- KV blocks on every stage ------------------------------------------------------
 * Every stage's cache has the same geometry and sees the same reserve/release calls in
 * the same order, so the stages' tables stay alike; checks still look at each stage. */

static eg_kv_cache *kv_of(eg_engine *e, int k) { return eg_forward_kv(e->stages[k]); }
static int64_t blocks_for(eg_engine *e, int64_t n_tokens) { return eg_kv_blocks_for(kv_of(e, 0), n_tokens); }

/* 1 when every stage could grow slot i (or a free slot, i = -1) to n_tokens with
 * `margin` blocks to spare. */
static int room_for(eg_engine *e, int i, int64_t n_tokens, int64_t margin) {
    for (int k = 0; k < e->n_stages; k++) {
        eg_kv_cache *kv = kv_of(e, k);
        int64_t more = eg_kv_blocks_for(kv, n_tokens) - (i >= 0 ? eg_kv_slot_blocks(kv, i) : 0);
        if (more > 0 && more + margin > eg_kv_free_blocks(kv)) return 0;
    }
    return 1;
}

/* Map blocks so slot i holds n_tokens on every stage. 0 (nothing changed) when any
 * stage lacks the blocks. */
static int grow(eg_engine *e, int i, int64_t n_tokens) {
    if (!room_for(e, i, n_tokens, 0)) return 0;
    eg_error ignored;
    for (int k = 0; k < e->n_stages; k++)
        if (eg_kv_reserve(kv_of(e, k), i, n_tokens, &ignored)) return 0; /* not reached: room checked */
    return 1;
}

/* The drafter's positions go with the target's blocks: its paged cache then never holds
 * more of a slot than the target has mapped for it (a pool of the target's size cannot
 * run out; drafter_eagle3.h). A parked sequence's drafter state is rebuilt on restore. */
static void release_blocks(eg_engine *e, int i) {
    for (int k = 0; k < e->n_stages; k++) eg_kv_release(kv_of(e, k), i);
    if (e->dr) eg_drafter_truncate(e->dr, i, 0);
}

/* Positions of slot i mapped on every stage (the least over the stages). */
static int64_t mapped_tokens(eg_engine *e, int i) {
    int64_t have = -1;
    for (int k = 0; k < e->n_stages; k++) {
        eg_kv_cache *kv = kv_of(e, k);
        int64_t hk = (int64_t)eg_kv_slot_blocks(kv, i) * kv->block_size;
        if (have < 0 || hk < have) have = hk;
    }
    return have < 0 ? 0 : have;
}

/* The driving thread may issue ops on stage k's backend: no step is in flight. */
static eg_status drive_stage(eg_engine *e, int k, eg_error *err) {
    return e->threaded ? eg_backend_bind(e->stage_be[k], err) : EG_OK;
}

static eg_status grow_u16(uint16_t **p, int64_t n, eg_error *err) {
    uint16_t *q = realloc(*p, sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (%lld bf16 values)", (long long)n);
    *p = q;
    return EG_OK;
}

/* Capture buffers for `need` tokens. */
static eg_status slot_buffers(eg_engine *e, slot_state *s, int need, eg_error *err) {
    eg_status st;
    if (need <= s->buf_cap) return EG_OK;
    e->stats.buffer_sets += s->buf_cap == 0;
    int64_t H = e->m->cfg.hidden, A = (int64_t)need * (e->o.n_aux > 0 ? e->o.n_aux : 1) * H;
    if (e->o.capture_bf16) {
        if ((st = grow_u16(&s->aux16, A, err)) || (st = grow_u16(&s->final16, (int64_t)need * H, err))) return st;
        if (e->o.final_both && (st = grow_u16(&s->final_pre16, (int64_t)need * H, err))) return st;
    } else if ((st = grow_f32(&s->aux, A, err)) || (st = grow_f32(&s->final, (int64_t)need * H, err))) {
        return st;
    } else if (e->o.final_both && (st = grow_f32(&s->final_pre, (int64_t)need * H, err))) {
        return st;
    }
    if (e->o.want_logits && (st = grow_f32(&s->logits, (int64_t)need * e->m->cfg.vocab, err))) return st;
    s->buf_cap = need;
    return EG_OK;
}

/* Try to place the pending request in slot i. Returns 1 placed, 0 no room in cache.
 * Reserve policy: the whole sequence's blocks; on demand: the prompt's, leaving the
 * watermark free unless nothing else is live. */
static int admit(eg_engine *e, int i, eg_error *err, eg_status *st) {
    const eg_request *r = &e->pending;
    slot_state *s = &e->slots[i];
    int need = r->n_tokens + r->max_new; /* <= max_seq_len: checked when taken */
    int64_t mapped = e->o.kv_policy == EG_KV_RESERVE ? need : r->n_tokens;
    int64_t margin = e->o.kv_policy == EG_KV_ON_DEMAND && e->n_active + e->n_parked > 0 ? e->watermark : 0;
    *st = EG_OK;
    if (!room_for(e, i, mapped, margin)) return 0;
    /* a set too small for it: the largest spare a restored sequence left in a parked
       entry, if larger, before allocating (a slot's set moves with a preempted sequence) */
    int sj = -1;
    for (int j = e->n_parked; s->buf_cap < need && j < e->o.n_slots; j++)
        if (e->parked[j].s.buf_cap > (sj < 0 ? s->buf_cap : e->parked[sj].s.buf_cap)) sj = j;
    if (sj >= 0) {
        slot_state mine = slot_spare(s);
        *s = e->parked[sj].s;
        e->parked[sj].s = mine;
    }
    if ((*st = grow_i32(&s->tokens, &s->cap, need, err)) || (*st = grow_i32(&s->stop, &s->stop_cap, r->n_stop, err)) ||
        (*st = slot_buffers(e, s, need, err)))
        return 0;
    if (e->dr) { /* the draft buffers stay with the slot (and travel with a preempted sequence) */
        if (!s->draft) s->draft = eg_malloc(sizeof(int32_t) * (size_t)e->dk, err);
        if (s->draft && r->sp.temperature > 0.0f && !s->q.n) (void)eg_spec_q_alloc(&s->q, e->dk, e->q_cap, err);
        if (!s->draft || (r->sp.temperature > 0.0f && !s->q.n)) {
            *st = EG_ERR_NOMEM;
            return 0;
        }
    }
    if (!grow(e, i, mapped)) return 0; /* not reached: room checked */
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
    s->age = e->next_age++;
    s->recompute_to = 0;
    s->want = 0;
    s->dlen = 0;
    s->n_draft = 0;
    if (e->dr) eg_drafter_truncate(e->dr, i, 0);
    e->n_active++;
    e->have_pending = 0;
    return 1;
}

static eg_status finish_slot(eg_engine *e, int i, eg_done_fn done, void *ctx, eg_error *err) {
    slot_state *s = &e->slots[i];
    int bf = e->o.capture_bf16;
    eg_result r = {.id = s->req.id, .user = s->req.user, .tokens = s->tokens, .n_tokens = s->n_total,
                   .prompt_len = s->req.n_tokens, .n_generated = s->n_generated, .finish = s->finish,
                   .n_aux = e->o.n_aux, .aux = bf ? NULL : s->aux, .final = bf ? NULL : s->final,
                   .aux_bf16 = bf ? s->aux16 : NULL, .final_bf16 = bf ? s->final16 : NULL,
                   .final_pre = e->o.final_both && !bf ? s->final_pre : NULL,
                   .final_pre_bf16 = e->o.final_both && bf ? s->final_pre16 : NULL,
                   .logits = e->o.want_logits ? s->logits : NULL};
    s->active = 0;
    e->n_active--;
    release_blocks(e, i);
    e->stats.sequences++;
    return done(ctx, &r, err);
}

/* ---- preemption -------------------------------------------------------------------- */

/* Make p's host buffers hold n_blocks blocks of every stage within the host budget,
 * first giving back buffers of entries that hold no swapped cache. 0: over budget. */
static int host_room(eg_engine *e, parked_seq *p, int n_blocks, eg_error *err) {
    int64_t extra = 0;
    for (int k = 0; k < e->n_stages; k++) {
        int64_t need = eg_kv_save_bytes(kv_of(e, k), n_blocks);
        if (need > p->host_cap[k]) extra += need - p->host_cap[k];
    }
    if (e->host_held + extra > e->o.host_kv_bytes)
        for (int j = 0; j < e->o.n_slots && e->host_held + extra > e->o.host_kv_bytes; j++) {
            parked_seq *q = &e->parked[j];
            if (q == p || (j < e->n_parked && q->swapped)) continue;
            for (int k = 0; k < e->n_stages; k++) {
                eg_cuda_host_free(q->host[k]);
                q->host[k] = NULL;
                e->host_held -= q->host_cap[k];
                q->host_cap[k] = 0;
            }
        }
    if (e->host_held + extra > e->o.host_kv_bytes) return 0;
    for (int k = 0; k < e->n_stages; k++) {
        int64_t need = eg_kv_save_bytes(kv_of(e, k), n_blocks);
        if (need <= p->host_cap[k]) continue;
        eg_cuda_host_free(p->host[k]);
        e->host_held -= p->host_cap[k];
        p->host_cap[k] = 0;
        if (!(p->host[k] = eg_cuda_host_alloc((size_t)need, err))) return 0; /* no memory: recompute instead */
        p->host_cap[k] = need;
        e->host_held += need;
    }
    /* the peak of what is allocated (pinned, kept for the next victim), not only of what
       swapped caches fill: the memory the host must give */
    if (e->host_held > e->stats.host_kv_peak) e->stats.host_kv_peak = e->host_held;
    return 1;
}

/* Preempt the sequence in slot v (nothing in flight): its cache goes to the host when
 * the budget allows, else it is dropped for a recompute; its slot is freed. */
static eg_status park(eg_engine *e, int v, eg_error *err) {
    slot_state *s = &e->slots[v];
    EG_ASSERT(s->active && e->n_parked < e->o.n_slots);
    parked_seq *p = &e->parked[e->n_parked];
    int nb = (int)blocks_for(e, s->n_done);
    eg_error ignored;
    int swap = nb > 0 && host_room(e, p, nb, &ignored);
    eg_status st = EG_OK;
    for (int k = 0; swap && k < e->n_stages && !st; k++) {
        eg_kv_cache *kv = kv_of(e, k);
        if (!(st = drive_stage(e, k, err)) && !(st = eg_kv_save(kv, v, nb, p->host[k], err)))
            st = e->stage_be[k]->ops->sync(e->stage_be[k], err);
        if (!st) e->stats.swap_bytes += eg_kv_save_bytes(kv, nb);
    }
    if (st) return eg_wrap(err, "preempting request %llu", (unsigned long long)s->req.id);
    release_blocks(e, v);
    if (!swap) {
        if (s->n_done > s->recompute_to) s->recompute_to = s->n_done;
        s->n_done = 0;
    }
    s->want = 0;
    slot_state left = p->s; /* a spare set, or none: what the sequence last restored from this entry left */
    p->s = *s;
    *s = left;
    s->active = 0;
    p->swapped = swap;
    p->n_blocks = swap ? nb : 0;
    e->n_parked++;
    e->n_active--;
    e->stats.preemptions++;
    e->stats.swap_outs += swap;
    return EG_OK;
}

static int oldest_parked(const eg_engine *e) {
    int best = -1;
    for (int j = 0; j < e->n_parked; j++)
        if (best < 0 || e->parked[j].s.age < e->parked[best].s.age) best = j;
    return best;
}

static int drafts_for(const eg_engine *e, const slot_state *s);

/* Tokens parked sequence p needs mapped to resume: a swapped one's cached rows and its
 * next step beside them (a prefill chunk, or a decode row and its drafts), a recomputed
 * one all its tokens. Restoring a swapped sequence with room for its cache alone let it
 * stall on its next step, be parked again as the youngest and come back the step after,
 * its cache saved and loaded every step without progress, while free blocks stayed over
 * the watermark but under a chunk (an audit found it: a swapped prefill part-way through;
 * or a decode whose verify step crosses a block). Alone in the cache it always fits:
 * the step stays within prompt + max_new. */
static int64_t resume_tokens(const eg_engine *e, const parked_seq *p) {
    const slot_state *s = &p->s;
    if (!p->swapped) return s->n_total;
    int64_t left = s->n_total - s->n_done;
    if (left == 1 && (s->n_generated > 0 || s->finishing)) return (int64_t)s->n_done + 1 + drafts_for(e, s);
    return s->n_done + (left < e->o.max_tokens ? left : e->o.max_tokens);
}

/* Bring parked sequence j back into free slot i (nothing in flight) when its blocks and
 * the watermark are free. Returns 1 restored, 0 no room. */
static int restore(eg_engine *e, int j, int i, eg_error *err, eg_status *st) {
    parked_seq *p = &e->parked[j];
    *st = EG_OK;
    const int64_t need = resume_tokens(e, p);
    if (!room_for(e, i, need, e->n_active > 0 ? e->watermark : 0) || !grow(e, i, need)) return 0;
    for (int k = 0; p->swapped && k < e->n_stages && !*st; k++)
        if (!(*st = drive_stage(e, k, err))) *st = eg_kv_load(kv_of(e, k), i, p->n_blocks, p->host[k], err);
    if (*st) {
        release_blocks(e, i); /* the slot stays free */
        eg_wrap(err, "restoring request %llu", (unsigned long long)p->s.req.id);
        return 0;
    }
    e->stats.swap_ins += p->swapped;
    slot_state *s = &e->slots[i];
    slot_state spare = slot_spare(s); /* the free slot's set: the sequence brings its own */
    *s = p->s;
    if (e->dr) { /* the drafter's state for it was left in its old slot: rebuilt from its kept rows */
        eg_drafter_truncate(e->dr, i, 0);
        s->dlen = 0;
        s->n_draft = 0;
    }
    p->s = spare; /* kept for a later admission or park: no set is freed and made again */
    p->swapped = 0;
    p->n_blocks = 0;
    e->n_active++;
    /* keep [0, n_parked) dense; entries swap whole, host buffers included */
    parked_seq last = e->parked[e->n_parked - 1];
    e->parked[e->n_parked - 1] = *p;
    *p = last;
    e->n_parked--;
    return 1;
}

/* With nothing in flight: give every stalled slot, oldest first, the block it waits
 * for, preempting the youngest live sequence (possibly the stalled one itself) until it
 * fits. The oldest sequence alone always fits, so this ends. */
static eg_status preempt_for_stalled(eg_engine *e, eg_error *err) {
    eg_status st;
    for (;;) {
        int i = -1;
        for (int k = 0; k < e->o.n_slots; k++)
            if (e->slots[k].active && e->slots[k].want > 0 && (i < 0 || e->slots[k].age < e->slots[i].age)) i = k;
        if (i < 0) break;
        slot_state *s = &e->slots[i];
        while (s->active && s->want > 0) {
            if (grow(e, i, s->want)) { s->want = 0; break; }
            int v = -1;
            for (int k = 0; k < e->o.n_slots; k++)
                if (e->slots[k].active && (v < 0 || e->slots[k].age > e->slots[v].age)) v = k;
            if (v == i && e->n_active == 1)
                return eg_fail(err, EG_ERR_INVALID, "request %llu cannot grow to %d tokens in an otherwise empty KV cache",
                               (unsigned long long)s->req.id, s->want);
            if ((st = park(e, v, err))) return st;
        }
    }
    e->starved = 0;
    return EG_OK;
}

/* With nothing in flight: serve stalled slots (preempting), then bring preempted
 * sequences back, oldest first, into any free slot while their blocks fit. */
static eg_status housekeeping(eg_engine *e, eg_error *err) {
    eg_status st;
    if (e->starved && (st = preempt_for_stalled(e, err))) return st;
    while (e->n_parked && !__atomic_load_n(&e->stop_requested, __ATOMIC_RELAXED)) {
        int i = 0;
        while (i < e->o.n_slots && e->slots[i].active) i++;
        if (i == e->o.n_slots) break;
        if (!restore(e, oldest_parked(e), i, err, &st)) return st;
    }
    return EG_OK;
}

/* Admit new requests into the free slots of micro-batch mb, only while no preempted
 * sequence waits (they come back first: housekeeping). Returns 0, or an error. */
static eg_status admit_mb(eg_engine *e, micro_batch *mb, eg_next_fn next, void *ctx, int *exhausted, eg_error *err) {
    eg_status st;
    for (int i = mb->index; i < e->o.n_slots && !__atomic_load_n(&e->stop_requested, __ATOMIC_RELAXED); i += e->n_mb) {
        if (e->slots[i].active) continue;
        if (e->n_parked) return EG_OK;
        if (!e->have_pending) {
            if (*exhausted) return EG_OK;
            eg_request r;
            memset(&r, 0, sizeof r);
            int got = next(ctx, &r, err);
            if (got < 0) return err->code ? err->code : EG_ERR_INVALID;
            if (got == 0) { *exhausted = 1; return EG_OK; }
            if (got == EG_NEXT_LATER) return EG_OK; /* not for this engine now */
            if (r.n_tokens < 1) return eg_fail(err, EG_ERR_INVALID, "request %llu has no tokens", (unsigned long long)r.id);
            if (r.max_new < 0)
                return eg_fail(err, EG_ERR_INVALID, "request %llu: max_new %d is negative", (unsigned long long)r.id,
                               r.max_new);
            if ((int64_t)r.n_tokens + r.max_new > e->o.max_seq_len)
                return eg_fail(err, EG_ERR_INVALID, "request %llu: %d prompt + %d new tokens exceed max_seq_len %d",
                               (unsigned long long)r.id, r.n_tokens, r.max_new, e->o.max_seq_len);
            if (blocks_for(e, (int64_t)r.n_tokens + r.max_new) > kv_of(e, 0)->n_blocks)
                return eg_fail(err, EG_ERR_NOMEM,
                               "request %llu (%d tokens) does not fit in the KV cache (%lld tokens) even alone",
                               (unsigned long long)r.id, r.n_tokens + r.max_new, (long long)eg_engine_kv_capacity(e));
            if ((st = keep_pending(e, &r, err))) return st;
        }
        if (!admit(e, i, err, &st)) return st; /* cache full: wait for a slot to finish */
    }
    return EG_OK;
}

/* The end of the positions slot i can hand the drafter: the rows kept (computed now or
 * captured before a dropped cache) that have a next token, no further than the target's
 * blocks (release_blocks: a sequence restored in the middle of a recompute holds fewer
 * blocks than the rows it captured before). */
static int catch_up_end(eg_engine *e, int i) {
    slot_state *s = &e->slots[i];
    int have = s->n_done > s->recompute_to ? s->n_done : s->recompute_to;
    int end = have < s->n_total - 1 ? have : s->n_total - 1;
    int64_t mapped = mapped_tokens(e, i);
    return end > mapped ? (int)mapped : end;
}

/* Stage slot i's positions [from, from + n) at rows at.. of the drafter's staging: the
 * rows come from the slot's capture buffers, so the drafter sees the same features
 * whether or not the sequence was preempted (BF16 capture: the rounded rows, widened). */
static void stage_rows(eg_engine *e, int i, int from, int n, int at) {
    slot_state *s = &e->slots[i];
    const int64_t H = e->m->cfg.hidden;
    const int na = e->o.n_aux, nd = e->n_daux;
    for (int t = 0; t < n; t++) {
        int p = from + t;
        for (int a = 0; a < nd; a++) {
            int64_t src = ((int64_t)p * na + e->daux[a]) * H;
            float *dst = e->dstage + ((int64_t)(at + t) * nd + a) * H;
            if (e->o.capture_bf16)
                for (int64_t h = 0; h < H; h++) dst[h] = eg_bf16_to_f32(s->aux16[src + h]);
            else
                memcpy(dst, s->aux + src, sizeof(float) * (size_t)H);
        }
        e->dnext[at + t] = s->tokens[p + 1];
    }
}

/* Hand the drafter the positions of slot i it lacks, [dlen, catch_up_end), in chunks of
 * the staging's max_tokens rows. */
static eg_status drafter_catch_up(eg_engine *e, int i, eg_error *err) {
    slot_state *s = &e->slots[i];
    int end = catch_up_end(e, i);
    while (s->dlen < end) {
        int n = end - s->dlen < e->o.max_tokens ? end - s->dlen : e->o.max_tokens;
        stage_rows(e, i, s->dlen, n, 0);
        double t0 = eg_now();
        eg_status st = eg_drafter_extend(e->dr, i, s->dlen, n, e->n_daux ? e->dstage : NULL, e->dnext, err);
        e->stats.draft_seconds += eg_now() - t0;
        if (st)
            return eg_wrap(err, "drafter: extending request %llu at positions %d..%d", (unsigned long long)s->req.id,
                           s->dlen, s->dlen + n - 1);
        s->dlen += n;
    }
    return EG_OK;
}

/* The same for slots[0..n) at once: their positions in batched extends (each at most the
 * staging's rows; a slot lacking more goes alone, as above). */
static eg_status drafter_catch_up_many(eg_engine *e, const int *slots, int n, eg_error *err) {
    const int64_t arow = (int64_t)e->n_daux * e->m->cfg.hidden;
    int used = 0, nx = 0;
    eg_status st = EG_OK;
    for (int j = 0; j <= n && !st; j++) {
        int i = j < n ? slots[j] : -1, need = i >= 0 ? catch_up_end(e, i) - e->slots[i].dlen : 0;
        if (i >= 0 && need <= 0) continue;
        if (nx && (i < 0 || need > e->o.max_tokens - used)) { /* flush */
            double t0 = eg_now();
            st = eg_drafter_extend_many(e->dr, nx, e->dx, err);
            e->stats.draft_seconds += eg_now() - t0;
            if (st) return eg_wrap(err, "drafter: extending %d sequences' positions", nx);
            for (int x = 0; x < nx; x++) e->slots[e->dx[x].slot].dlen += e->dx[x].n;
            nx = used = 0;
        }
        if (i < 0) break;
        if (need > e->o.max_tokens) {
            st = drafter_catch_up(e, i, err);
            continue;
        }
        stage_rows(e, i, e->slots[i].dlen, need, used);
        e->dx[nx++] = (eg_draft_extend){i, e->slots[i].dlen, need, e->n_daux ? e->dstage + used * arow : NULL,
                                        e->dnext + used};
        used += need;
    }
    return st;
}

/* The drafts of micro-batch mb's verify chunks (build_mb packed them: slot pend_slot[c]
 * from row pend_row[c]): every slot's drafter state caught up and its k proposals made in
 * one batch, then written as the chunks' tokens. */
static eg_status spec_drafts(eg_engine *e, micro_batch *mb, int n_pend, eg_error *err) {
    const int64_t V = e->m->cfg.vocab;
    eg_status st = drafter_catch_up_many(e, e->pend_slot, n_pend, err);
    if (st) return st;
    for (int c = 0; c < n_pend; c++) {
        slot_state *s = &e->slots[e->pend_slot[c]];
        EG_ASSERT(s->dlen == s->n_total - 1);
        e->dp[c] = (eg_draft_propose){e->pend_slot[c], s->tokens, s->n_total, s->n_draft, &s->req.sp, &s->rng, s->draft,
                                      slot_q(s)};
    }
    double t0 = eg_now();
    st = eg_drafter_propose_many(e->dr, n_pend, e->dp, err);
    e->stats.draft_seconds += eg_now() - t0;
    if (st)
        return eg_wrap(err, "drafter: proposing for %d sequences (request %llu first)", n_pend,
                       (unsigned long long)e->slots[e->pend_slot[0]].req.id);
    for (int c = 0; c < n_pend; c++) {
        slot_state *s = &e->slots[e->pend_slot[c]];
        for (int k = 0; k < s->n_draft; k++) {
            if (s->draft[k] < 0 || s->draft[k] >= V)
                return eg_fail(err, EG_ERR_INVALID, "drafter: proposed token %d for request %llu (vocabulary %lld)",
                               s->draft[k], (unsigned long long)s->req.id, (long long)V);
            e->stats.draft_no_q += eg_spec_no_q(slot_q(s), k, s->draft[k]);
        }
        for (int k = 0; k <= s->n_draft; k++) mb->tok[e->pend_row[c] + k] = k ? s->draft[k - 1] : s->tokens[s->n_done];
    }
    return EG_OK;
}

/* Drafts slot i verifies in its next decode step: k, less what max_new leaves (the
 * verify step commits up to drafts + 1 tokens). 0: a plain decode row. */
static int drafts_for(const eg_engine *e, const slot_state *s) {
    if (!e->dr || s->finishing) return 0;
    int k = s->req.max_new - s->n_generated - 1;
    return k < e->dk ? (k > 0 ? k : 0) : e->dk;
}

/* Pack the step of micro-batch mb: decode rows first, then prefill chunks. With a
 * drafter a generating sequence's decode rows are its last token and its drafts (one
 * chunk, never split), and the decode pass starts at a rotating slot. */
static eg_status build_mb(eg_engine *e, micro_batch *mb, eg_error *err) {
    const int S = e->o.n_slots, Tmax = e->o.max_tokens;
    int T = 0, n_rows = 0, n_pend = 0;
    int r0 = 0;
    mb->n_spec = 0;
    const int own = (S - mb->index + e->n_mb - 1) / e->n_mb; /* slots mb->index + m * n_mb */
    if (e->dr) {
        /* each micro-batch its own counter: with one shared by all, a micro-batch could see
           only start values of one residue (2 micro-batches of 2 slots: always even) and
           its first slot would go first every time */
        r0 = mb->rr;
        mb->rr = (mb->rr + 1) % own;
        for (int i = mb->index; i < S; i += e->n_mb) e->slots[i].n_draft = 0;
    }
    for (int pass = 0; pass < 2 && T < Tmax; pass++)
        for (int j = mb->index; j < S && T < Tmax; j += e->n_mb) {
            /* the decode pass rotates over the micro-batch's own slots (all of them with
               one micro-batch: slot (j + r0) % S) */
            int i = pass == 0 && e->dr ? mb->index + (int)(((j - mb->index) / e->n_mb + r0) % own) * e->n_mb : j;
            slot_state *s = &e->slots[i];
            if (!s->active || s->n_done >= s->n_total) continue;
            if (s->want > 0) continue; /* stalled until the next preemption pass */
            int remaining = s->n_total - s->n_done;
            /* a recompute of a generated sequence is a prefill */
            int is_decode = remaining == 1 && (s->n_generated > 0 || s->finishing);
            if ((pass == 0) != is_decode) continue;
            int kd = is_decode ? drafts_for(e, s) : 0;
            if (kd && kd + 1 > Tmax - T) continue; /* the chunk waits for a step with room */
            int n = kd ? kd + 1 : remaining < Tmax - T ? remaining : Tmax - T;
            /* a recompute of a generated sequence stops one row short with a drafter: its
             * last token goes through a verify step, as it would have without preemption
             * (the same drafts and RNG draws, so the same tokens) */
            if (e->dr && !is_decode && s->n_generated > 0 && !s->finishing && s->n_done + n == s->n_total) n--;
            if (n < 1) continue;
            if (e->o.kv_policy == EG_KV_ON_DEMAND && !grow(e, i, (int64_t)s->n_done + n)) {
                /* a prefill takes what is mapped (its blocks came at admission); the
                 * rest stalls and asks for a preemption pass */
                int have = (int)(mapped_tokens(e, i) - s->n_done);
                if (is_decode || have <= 0) {
                    s->want = s->n_done + n;
                    e->starved++;
                    continue;
                }
                if (have < n) n = have;
            }
            if (kd) { /* its tokens (the drafts) come once every chunk is packed: spec_drafts */
                e->pend_slot[n_pend] = i;
                e->pend_row[n_pend++] = T;
                for (int k = 0; k < n; k++) {
                    mb->pos[T + k] = s->n_done + k;
                    mb->slt[T + k] = i;
                    if (!e->o.want_logits) mb->rows[n_rows++] = T + k;
                }
                s->n_draft = kd;
                mb->n_spec++;
                T += n;
                continue;
            }
            for (int k = 0; k < n; k++) {
                mb->tok[T + k] = s->tokens[s->n_done + k];
                mb->pos[T + k] = s->n_done + k;
                mb->slt[T + k] = i;
            }
            int samples = s->n_done + n == s->n_total && !s->finishing && s->n_generated < s->req.max_new;
            if (!e->o.want_logits && samples) {
                mb->rows[n_rows] = T + n - 1;
                mb->sp[n_rows] = s->req.sp;
                mb->rng[n_rows] = s->rng;
                n_rows++;
            }
            T += n;
        }
    if (n_pend) {
        eg_status st = spec_drafts(e, mb, n_pend, err);
        if (st) return st;
    }
    if (e->o.want_logits)
        for (int r = 0; r < T; r++) mb->rows[r] = r;
    /* every logit row greedy (a drafter, logits not kept): the backend's argmax of each
     * is all the host needs, for the greedy rule and the plain rows alike, the same ids
     * as its own argmax (the lowest among equal maxima); no row of V logits is copied */
    mb->argmax_only = e->dr && !e->o.want_logits && n_rows > 0;
    for (int j = 0; mb->argmax_only && j < n_rows; j++)
        mb->argmax_only = !(e->slots[mb->slt[mb->rows[j]]].req.sp.temperature > 0.0f);
    for (int j = 0; mb->argmax_only && j < n_rows; j++) mb->sp[j] = (eg_sample_params){0.0f, 1.0f, 0};
    mb->n_ptok = 0;
    if (e->backend_probs && mb->n_spec && !mb->argmax_only) {
        /* a sampled verify chunk's rows but its last: row j's draft is the next row's token */
        int n_lr = e->o.want_logits ? T : n_rows;
        for (int j = 0; j < n_lr; j++) {
            int r = mb->rows[j];
            const slot_state *s = &e->slots[mb->slt[r]];
            int k = mb->pos[r] - s->n_done;
            mb->ptok[j] = -1;
            if (s->n_draft > 0 && k >= 0 && k < s->n_draft && s->req.sp.temperature > 0.0f) {
                EG_ASSERT(r + 1 < T && mb->slt[r + 1] == mb->slt[r]);
                mb->ptok[j] = mb->tok[r + 1];
                mb->sp[j] = s->req.sp;
                mb->n_ptok++;
            }
        }
    }
    /* the last stage's logits stay on its backend until the rule knows which rows it
     * needs: one engine thread driving every stage takes them in host_draws (its backend
     * waits for the next step), threaded stages on the last stage's thread (run_stage) */
    mb->defer = mb->n_ptok > 0 && !e->o.want_logits;
    mb->decided = 0;
    mb->T = T;
    mb->n_rows = n_rows;
    mb->status = EG_OK;
    mb->sent_to = -1;
    return EG_OK;
}

/* 1 when any of x[0..n) is NaN or infinite: exponent bits all set. An integer OR
 * reduction (vectorises), run over every captured row, since a NaN row written to a
 * shard would poison the drafter's training silently. */
static int any_nonfinite(const float *x, int64_t n) {
    const uint32_t *b = (const uint32_t *)(const void *)x;
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (uint32_t)((b[i] & 0x7f800000u) == 0x7f800000u);
    return (int)bad;
}

/* One captured row into a sequence's buffer, F32 or rounded to BF16 exactly as a shard
 * would round it (eg_f32_to_bf16). */
static void put_row(const eg_engine *e, float *f32, uint16_t *bf16, int64_t off, const float *src) {
    const int64_t H = e->m->cfg.hidden;
    if (e->o.capture_bf16)
        for (int64_t h = 0; h < H; h++) bf16[off + h] = eg_f32_to_bf16(src[h]);
    else
        memcpy(f32 + off, src, sizeof(float) * (size_t)H);
}

static int same_row(const eg_engine *e, const float *f32, const uint16_t *bf16, int64_t off, const float *src) {
    const int64_t H = e->m->cfg.hidden;
    if (!e->o.capture_bf16) return !memcmp(f32 + off, src, sizeof(float) * (size_t)H);
    for (int64_t h = 0; h < H; h++)
        if (bf16[off + h] != eg_f32_to_bf16(src[h])) return 0;
    return 1;
}

/* opts.check_recompute: a recomputed row must equal the row captured the first time. */
static eg_status check_row(const eg_engine *e, const micro_batch *mb, const slot_state *s, int r, int p, eg_error *err) {
    const int64_t H = e->m->cfg.hidden, T = mb->T;
    int ok = same_row(e, s->final, s->final16, (int64_t)p * H, mb->fin + (int64_t)r * H);
    if (ok && e->o.final_both) ok = same_row(e, s->final_pre, s->final_pre16, (int64_t)p * H, mb->fin_pre + (int64_t)r * H);
    for (int a = 0; a < e->o.n_aux && ok; a++)
        ok = same_row(e, s->aux, s->aux16, ((int64_t)p * e->o.n_aux + a) * H, mb->cap + ((int64_t)a * T + r) * H);
    if (ok) return EG_OK;
    return eg_fail(err, EG_ERR_INVALID, "request %llu: recomputed position %d differs from its first capture",
                   (unsigned long long)s->req.id, p);
}

static int is_stop_token(const slot_state *s, int32_t tok) {
    int is_stop = 0;
    for (int k = 0; k < s->req.n_stop; k++) is_stop |= s->stop[k] == tok;
    return is_stop || (s->req.stop_at > 0 && s->n_generated >= s->req.stop_at);
}

/* Slot i verified its drafts in mb's step (rows row .. row+k, logit rows lr .. lr+k):
 * accept by spec.h's rule, commit the accepted drafts and the correction/bonus token
 * (cut after a stop token), keep the rows of committed positions only, give back the
 * cache blocks past the sequence, bring the drafter back to the committed length. */
static eg_status complete_spec(eg_engine *e, micro_batch *mb, int i, int row, int lr, eg_done_fn done, void *ctx,
                               eg_error *err) {
    slot_state *s = &e->slots[i];
    const int T = mb->T, n_aux = e->o.n_aux, kd = s->n_draft;
    const int64_t H = e->m->cfg.hidden, V = e->m->cfg.vocab;
    double t0 = eg_now();
    /* its logits rows were verified by host_draws */
    int n_acc = s->v_acc;
    int32_t next = s->v_next;
    int m = 0; /* tokens committed */
    for (int j = 0; j <= n_acc && !s->finishing; j++) {
        int32_t tok = j < n_acc ? s->draft[j] : next;
        s->tokens[s->n_total++] = tok;
        s->n_generated++;
        m++;
        if (is_stop_token(s, tok)) {
            s->finish = EG_FINISH_STOP;
            s->finishing = 1;
        } else if (s->n_generated >= s->req.max_new) {
            s->finish = EG_FINISH_LENGTH;
            s->finishing = 1;
        }
    }
    /* rows 0..n_acc were computed over committed tokens; a stop among the accepted
     * drafts ends the sequence at its own row (m + 1 rows), else the last committed
     * token's row comes next step (n_acc + 1 = m rows) */
    int keep = m + 1 < n_acc + 1 ? m + 1 : n_acc + 1;
    for (int k = 0; k < keep; k++) {
        int p = mb->pos[row + k];
        EG_ASSERT(p >= s->recompute_to && p == s->n_done + k);
        for (int a = 0; a < n_aux; a++)
            put_row(e, s->aux, s->aux16, ((int64_t)p * n_aux + a) * H, mb->cap + ((int64_t)a * T + row + k) * H);
        put_row(e, s->final, s->final16, (int64_t)p * H, mb->fin + (int64_t)(row + k) * H);
        if (e->o.final_both)
            put_row(e, s->final_pre, s->final_pre16, (int64_t)p * H, mb->fin_pre + (int64_t)(row + k) * H);
        if (e->o.want_logits)
            memcpy(s->logits + (int64_t)p * V, mb->logits + (int64_t)(lr + k) * V, sizeof(float) * (size_t)V);
    }
    s->n_done += keep;
    s->n_draft = 0;
    e->stats.verify_steps++;
    e->stats.drafted += kd;
    e->stats.accepted += m < n_acc ? m : n_acc; /* drafts committed: none past a stop */
    e->stats.spec_tokens += m;
    e->stats.decode_tokens += m;
    if (e->o.kv_policy == EG_KV_ON_DEMAND) /* the rejected drafts' blocks */
        for (int k = 0; k < e->n_stages; k++) eg_kv_truncate(kv_of(e, k), i, s->n_total);
    /* threaded: only outside the pipeline's verify window (engine_run), which holds it else */
    if (!e->threaded || !e->spec_in_flight) e->stats.verify_seconds += eg_now() - t0;
    if (s->n_done == s->n_total) {
        EG_ASSERT(s->finishing);
        return finish_slot(e, i, done, ctx, err);
    }
    double t1 = eg_now();
    eg_drafter_truncate(e->dr, i, s->dlen); /* its speculative positions */
    e->stats.draft_seconds += eg_now() - t1;
    return EG_OK; /* the committed positions reach the drafter before its next proposal (spec_drafts) */
}

/* Rows of mb from row on that belong to the same slot (a step holds one chunk a slot). */
static int chunk_rows(const micro_batch *mb, int row) {
    int n = 0;
    while (row + n < mb->T && mb->slt[row + n] == mb->slt[row]) n++;
    return n;
}

/* A plain chunk of n rows that ends slot s's sequence draws its next token (the state
 * before complete_mb takes the chunk). */
static int chunk_samples(const slot_state *s, int n) {
    return s->n_done + n == s->n_total && !s->finishing && s->n_generated < s->req.max_new;
}

typedef struct { eg_engine *e; const micro_batch *mb; } host_draw_ctx;

static void host_draw(void *vp, int64_t b, int64_t end, int tid) {
    const host_draw_ctx *c = vp;
    eg_engine *e = c->e;
    const int64_t V = e->m->cfg.vocab;
    for (int64_t j = b; j < end; j++) {
        const micro_batch *mb = c->mb;
        const host_job *h = &mb->hjobs[j];
        slot_state *s = &e->slots[h->slot];
        const float *lg = mb->logits + (int64_t)h->fr * V;
        if (h->on_backend) { /* drawn there: a bonus token or a plain row's */
            if (h->verify) s->v_acc = h->n;
            s->v_next = h->tok;
        } else if (h->decided && h->ki >= 0) { /* a draft was rejected; the backend gave its row's kept set */
            s->v_acc = h->n;
            s->v_next = eg_spec_finish_kept(e->hsc[tid], mb->kid + (int64_t)h->ki * e->kept_cap,
                                            mb->kp + (int64_t)h->ki * e->kept_cap, mb->kn[h->ki], s->draft, slot_q(s),
                                            h->n, &s->rng);
        } else if (h->decided) { /* the tests ran, a draft was rejected; lg is its row */
            s->v_acc = h->n;
            s->v_next = eg_spec_finish(e->hsc[tid], lg, (int)V, &s->req.sp, s->draft, slot_q(s), h->n, h->rejected, &s->rng);
        } else if (c->mb->argmax_only) {
            const int32_t *am = c->mb->sampled + h->lr;
            if (h->verify) eg_spec_verify_argmax(am, s->draft, s->n_draft, e->o.spec_rule, &s->v_acc, &s->v_next);
            else s->v_next = am[0];
        } else if (h->verify)
            eg_spec_verify(e->hsc[tid], lg, (int)V, &s->req.sp, s->draft, slot_q(s),
                           c->mb->n_ptok ? c->mb->prob + h->lr : NULL, s->n_draft, e->o.spec_rule, &s->rng,
                           &s->v_acc, &s->v_next);
        else
            s->v_next = eg_sample_row(lg, (int)V, &s->req.sp, &s->rng, e->hsc[tid]->sort, NULL);
    }
}

/* mb's host jobs: every verify chunk and every plain row that samples, in row order
 * (complete_mb's walk: the same rows, the same logit rows). Reads only mb's slots. */
static void mb_jobs(const eg_engine *e, micro_batch *mb) {
    const int T = mb->T;
    int row = 0, srow = 0, nj = 0, n_verify = 0;
    while (row < T) {
        int i = mb->slt[row];
        const slot_state *s = &e->slots[i];
        int n = chunk_rows(mb, row);
        EG_ASSERT(nj < mb->mb_slots || !(s->n_draft > 0 || chunk_samples(s, n)));
        if (s->n_draft > 0) {
            int lr = e->o.want_logits ? row : srow;
            mb->hjobs[nj++] = (host_job){.slot = i, .lr = lr, .verify = 1, .fr = lr, .ki = -1};
            n_verify++;
            if (!e->o.want_logits) srow += n;
        } else if (chunk_samples(s, n)) {
            int lr = e->o.want_logits ? row + n - 1 : srow;
            mb->hjobs[nj++] = (host_job){.slot = i, .lr = lr, .verify = 0, .fr = lr, .ki = -1};
            if (!e->o.want_logits) srow++;
        }
        row += n;
    }
    mb->n_jobs = nj;
    mb->n_verify = n_verify;
}

/* A deferred step's decisions, on the thread that drives the last stage (its logits rows
 * still on that stage's backend): the acceptance tests first, from the backend's p (k
 * uniforms a sequence, in the order eg_spec_verify draws them); then the bonus rows and
 * the plain rows are drawn on the backend (one uniform each, as eg_sample_row draws),
 * rejected drafts' kept sets are asked for, and only the rows the host's own code needs
 * come over: a rejected draft's whose kept set the backend cannot give (its residual),
 * and every row of a chunk with a p left to the host (NaN) or of a greedy one. Touches
 * only mb and its slots (their RNG states advance here), so with threaded stages it runs
 * on the last stage's thread while the driver builds other micro-batches. */
static eg_status defer_decide(eg_engine *e, micro_batch *mb, eg_error *err) {
    mb_jobs(e, mb);
    const int nj = mb->n_jobs;
    int nf = 0, nb = 0, nk = 0;
    for (int j = 0; j < nj; j++) {
        host_job *h = &mb->hjobs[j];
        slot_state *s = &e->slots[h->slot];
        int all = h->verify && s->req.sp.temperature > 0.0f;
        for (int k = 0; all && k < s->n_draft; k++) all = !isnan(mb->prob[h->lr + k]);
        h->fr = nf;
        h->ki = -1;
        if (all) {
            h->n = eg_spec_accept(mb->prob + h->lr, slot_q(s), s->draft, s->n_draft, e->o.spec_rule, &s->rng,
                                  &h->rejected);
            h->decided = 1;
        }
        if (!h->verify || (h->decided && !h->rejected)) { /* (rows ascend with j) */
            h->on_backend = 1;
            h->bi = nb;
            mb->brow[nb] = h->lr + (h->verify ? h->n : 0);
            mb->bsp[nb] = s->req.sp;
            mb->brng[nb++] = s->rng;
        } else if (h->decided && e->kept_cap) { /* its residual from the kept set, below */
            h->ki = nk;
            mb->krow[nk] = h->lr + h->n;
            mb->ksp[nk++] = s->req.sp;
        } else if (h->decided) {
            mb->fetch[nf++] = h->lr + h->n;
        } else {
            for (int k = 0; k <= s->n_draft; k++) mb->fetch[nf++] = h->lr + k;
        }
    }
    eg_forward *last = e->stages[e->n_stages - 1];
    eg_status st = eg_forward_kept_probs(last, mb->krow, nk, mb->ksp, e->kept_cap, mb->kn, mb->kid, mb->kp, err);
    if (st) return eg_wrap(err, "a verify step: the kept sets of %d rejected drafts' rows", nk);
    int64_t kresid = 0;
    for (int j = 0; j < nj && nk; j++) { /* a kept set the backend could not give: the row comes over */
        host_job *h = &mb->hjobs[j];
        if (h->ki < 0) continue;
        if (mb->kn[h->ki] >= 0) {
            kresid++;
            continue;
        }
        h->fr = nf;
        h->ki = -1;
        mb->fetch[nf++] = h->lr + h->n;
    }
    st = eg_forward_fetch_logits(last, mb->fetch, nf, mb->logits, err);
    if (!st) st = eg_forward_sample_logits(last, mb->brow, nb, mb->bsp, mb->brng, mb->btok, err);
    if (st) return eg_wrap(err, "a verify step: taking %d logits rows, drawing %d on the backend", nf, nb);
    for (int j = 0; j < nj; j++) {
        host_job *h = &mb->hjobs[j];
        if (!h->on_backend) continue;
        e->slots[h->slot].rng = mb->brng[h->bi];
        h->tok = mb->btok[h->bi];
    }
    mb->n_fetched = nf;
    mb->n_bdraws = nb;
    mb->n_kresid = kresid;
    mb->decided = 1;
    return EG_OK;
}

/* The host's draws of mb's step (logits kept, or a drafter), before complete_mb takes
 * them: every verify chunk's acceptance and every sampling row's token, in parallel over
 * the sequences. Each draw reads only its own sequence's logits rows and advances only its
 * own RNG, so the tokens are the serial ones whatever the threads (at Kimi's 163,840 ids
 * a row costs ~3 ms on one core, a verify chunk up to k + 1 rows). A deferred step's
 * decisions (defer_decide) come first, unless its last stage's thread took them. */
static eg_status host_draws(eg_engine *e, micro_batch *mb, eg_error *err) {
    const int T = mb->T;
    for (int j = 0; mb->n_ptok && j < (e->o.want_logits ? T : mb->n_rows); j++)
        e->stats.backend_probs += mb->ptok[j] >= 0 && !isnan(mb->prob[j]);
    double t0 = eg_now();
    if (mb->defer) {
        eg_status st = mb->decided ? EG_OK : defer_decide(e, mb, err);
        if (st) return st;
        e->stats.logit_rows += mb->n_fetched;
        e->stats.backend_draws += mb->n_bdraws;
        e->stats.backend_residuals += mb->n_kresid;
    } else {
        mb_jobs(e, mb);
        if (!mb->argmax_only) e->stats.logit_rows += e->o.want_logits ? T : mb->n_rows;
    }
    host_draw_ctx c = {e, mb};
    eg_pool_for(e->hpool, mb->n_jobs, 1, host_draw, &c);
    if (mb->n_verify && (!e->threaded || !e->spec_in_flight)) e->stats.verify_seconds += eg_now() - t0;
    return EG_OK;
}

/* After mb's step: scatter captures, take sampled tokens, finish sequences. */
static eg_status complete_mb(eg_engine *e, micro_batch *mb, eg_done_fn done, void *ctx, eg_error *err) {
    const int T = mb->T, n_aux = e->o.n_aux;
    const int64_t H = e->m->cfg.hidden, V = e->m->cfg.vocab;
    eg_status st;
    if (any_nonfinite(mb->fin, (int64_t)T * H) || (n_aux && any_nonfinite(mb->cap, (int64_t)n_aux * T * H)))
        for (int t = 0; t < T; t++) {
            int bad = any_nonfinite(mb->fin + t * H, H);
            for (int a = 0; a < n_aux && !bad; a++) bad = any_nonfinite(mb->cap + ((int64_t)a * T + t) * H, H);
            if (bad)
                return eg_fail(err, EG_ERR_INVALID,
                               "request %llu: the forward pass produced a NaN or infinite hidden state at position %d "
                               "(broken weights or config?); nothing of it was written",
                               (unsigned long long)e->slots[mb->slt[t]].req.id, mb->pos[t]);
        }
    if ((e->o.want_logits || e->dr) && (st = host_draws(e, mb, err))) return st;
    int row = 0, srow = 0; /* srow: the next sampled row, or with a drafter the next logit row */
    while (row < T) {
        int i = mb->slt[row];
        slot_state *s = &e->slots[i];
        int n = chunk_rows(mb, row);
        if (s->n_draft > 0) {
            EG_ASSERT(n == s->n_draft + 1);
            if ((st = complete_spec(e, mb, i, row, e->o.want_logits ? row : srow, done, ctx, err))) return st;
            if (!e->o.want_logits) srow += n;
            row += n;
            continue;
        }
        for (int k = 0; k < n; k++) {
            int p = mb->pos[row + k];
            if (p < s->recompute_to) { /* captured before its cache was dropped */
                e->stats.recomputed_tokens++;
                if (e->o.check_recompute && (st = check_row(e, mb, s, row + k, p, err))) return st;
                continue;
            }
            if (p < s->req.n_tokens) e->stats.prefill_tokens++;
            for (int a = 0; a < n_aux; a++)
                put_row(e, s->aux, s->aux16, ((int64_t)p * n_aux + a) * H, mb->cap + ((int64_t)a * T + row + k) * H);
            put_row(e, s->final, s->final16, (int64_t)p * H, mb->fin + (int64_t)(row + k) * H);
            if (e->o.final_both)
                put_row(e, s->final_pre, s->final_pre16, (int64_t)p * H, mb->fin_pre + (int64_t)(row + k) * H);
            if (e->o.want_logits)
                memcpy(s->logits + (int64_t)p * V, mb->logits + (int64_t)(row + k) * V, sizeof(float) * (size_t)V);
        }
        int samples = chunk_samples(s, n);
        s->n_done += n;
        if (samples) {
            int32_t tok;
            if (e->o.want_logits || e->dr) { /* the host sampler, as the CPU backend samples */
                if (!e->o.want_logits) srow++;
                tok = s->v_next; /* drawn by host_draws */
            } else {
                tok = mb->sampled[srow];
                s->rng = mb->rng[srow];
                srow++;
            }
            s->tokens[s->n_total++] = tok;
            s->n_generated++;
            e->stats.decode_tokens++;
            if (is_stop_token(s, tok)) {
                s->finish = EG_FINISH_STOP;
                s->finishing = 1;
            } else if (s->n_generated >= s->req.max_new) {
                s->finish = EG_FINISH_LENGTH;
                s->finishing = 1;
            }
        }
        /* a prefill's rows reach the drafter with the slot's first proposal (spec_drafts) */
        if (s->n_done == s->n_total && (s->finishing || s->req.max_new == 0))
            if ((st = finish_slot(e, i, done, ctx, err))) return st;
        row += n;
    }
    return EG_OK;
}

/* Scheduler statistics of a step about to launch. */
static void account_step(eg_engine *e, int exhausted) {
    eg_kv_cache *kv = kv_of(e, 0);
    int64_t live = 0;
    for (int i = 0; i < e->o.n_slots; i++)
        if (e->slots[i].active) live += eg_kv_blocks_for(kv, e->slots[i].n_done);
    e->stats.sum_concurrency += e->n_active;
    if (e->n_active > e->stats.peak_concurrency) e->stats.peak_concurrency = e->n_active;
    e->stats.sum_kv_live += (double)live / (double)kv->n_blocks;
    if (!exhausted || e->have_pending || e->n_parked) {
        e->stats.backlog_steps++;
        e->stats.backlog_concurrency += e->n_active;
    }
}

/* Launching pauses (threaded pipeline) until nothing is in flight when a slot stalled
 * for a block or a preempted sequence could come back: both drive every stage. */
static int wants_drain(eg_engine *e) {
    if (e->starved) return 1;
    if (!e->n_parked) return 0;
    const parked_seq *p = &e->parked[oldest_parked(e)];
    return room_for(e, -1, resume_tokens(e, p), e->n_active > 0 ? e->watermark : 0);
}

static eg_status engine_run(eg_engine *e, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err) {
    int exhausted = 0, in_flight = 0;
    eg_status st = EG_OK;
    double busy_since = 0;
    for (;;) {
        publish_stats(e); /* once per pass: a mutex, no allocation */
        /* launch every idle micro-batch that has work */
        for (int j = 0; j < e->n_mb && !st; j++) {
            micro_batch *mb = &e->mbs[j];
            if (mb->busy) continue;
            if (in_flight) {
                if (wants_drain(e)) {
                    if (!e->draining) e->stats.drains++;
                    e->draining = 1;
                    break;
                }
            } else {
                e->draining = 0;
                if ((st = housekeeping(e, err))) break;
            }
            if ((st = admit_mb(e, mb, next, ctx, &exhausted, err))) break;
            /* a stop request abandons in-flight sequences: their tokens depend only on
             * their own inputs, so a resumed run regenerates them identically */
            if (__atomic_load_n(&e->stop_requested, __ATOMIC_RELAXED)) break;
            if ((st = build_mb(e, mb, err))) break;
            if (!mb->T) continue;
            if (!in_flight) busy_since = eg_now();
            mb->busy = 1;
            in_flight++;
            if (in_flight > e->stats.max_in_flight) e->stats.max_in_flight = in_flight;
            e->stats.steps++;
            account_step(e, exhausted);
            if (e->threaded) {
                /* verify time of a pipeline: the wall time while a verify step is in it */
                if (mb->n_spec && !e->spec_in_flight++) e->spec_since = eg_now();
                q_push(&e->queues[0], mb);
            } else {
                double t_step = eg_now();
                for (int k = 0; k < e->n_stages && !mb->status; k++) {
                    mb->status = run_stage(e, k, mb);
                    e->stage_count[k]++;
                }
                if (mb->n_spec) e->stats.verify_seconds += eg_now() - t_step;
                mb->busy = 0;
                in_flight--;
                e->stats.seconds += eg_now() - busy_since;
                if (mb->status) { *err = mb->err; st = mb->status; break; }
                if ((st = complete_mb(e, mb, done, ctx, err))) break;
                j--; /* refill the same micro-batch at once */
            }
        }
        if (!in_flight) {
            if (st) return st;
            if (__atomic_load_n(&e->stop_requested, __ATOMIC_RELAXED)) return eg_fail(err, EG_ERR_INTERRUPTED, "stopped on request");
            /* live sequences (or stalled ones, or preempted ones waiting) are picked up
             * by the launch loop above */
            if (e->n_active || e->n_parked) continue;
            if (!exhausted && !e->have_pending) continue; /* next() said "later": ask again */
            if (e->have_pending)
                return eg_fail(err, EG_ERR_NOMEM, "request %llu (%d tokens) does not fit in the KV cache (%lld tokens)",
                               (unsigned long long)e->pending.id, e->pending.n_tokens + e->pending.max_new,
                               (long long)eg_engine_kv_capacity(e));
            return EG_OK;
        }
        /* threaded: wait for a micro-batch to come out of the last stage */
        micro_batch *mb = q_pop(&e->queues[e->n_stages]);
        if (!mb) return eg_fail(err, EG_ERR_INVALID, "pipeline queue closed unexpectedly");
        mb->busy = 0;
        in_flight--;
        if (!in_flight) e->stats.seconds += eg_now() - busy_since;
        if (mb->n_spec && !--e->spec_in_flight) e->stats.verify_seconds += eg_now() - e->spec_since;
        if (st) continue; /* draining after an error */
        if (mb->status) {
            *err = mb->err;
            st = mb->status;
            /* its stages stop waiting on their links, and its teardown does not wait on a dead peer */
            if (e->transport) __atomic_store_n(&e->transport->failed, 1, __ATOMIC_RELEASE);
            continue;
        }
        eg_status cst = complete_mb(e, mb, done, ctx, err);
        if (cst) st = cst;
    }
}

eg_status eg_engine_ep_leave(eg_engine *e, eg_error *err) {
    if (!e->o.ep) return EG_OK;
    if (!e->threaded) return eg_ep_leave(e->o.ep, e->o.ep_rank, e->be, err);
    /* nothing is in flight once the run has returned: every completion is a marker */
    for (int k = 0; k < e->n_stages; k++) e->leave_mb[k].status = EG_OK;
    q_push(&e->queues[0], &e->leave_mb[0]);
    eg_status st = EG_OK;
    for (int k = 0; k < e->n_stages; k++) {
        micro_batch *mb = q_pop(&e->queues[e->n_stages]);
        if (!mb) return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: pipeline queue closed while leaving",
                                e->o.ep_rank);
        EG_ASSERT(mb->leave);
        /* the first real failure; "another rank failed" only when there is nothing else */
        if (mb->status && (!st || (st == EG_ERR_INTERRUPTED && mb->status != EG_ERR_INTERRUPTED))) {
            st = mb->status;
            *err = mb->err;
            eg_wrap(err, "stage %d", (int)(mb - e->leave_mb));
        }
    }
    return st;
}

eg_status eg_engine_run(eg_engine *e, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err) {
    eg_status st = engine_run(e, next, done, ctx, err);
    publish_stats(e);
    return st;
}
