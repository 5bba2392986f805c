/* ep_runtime.c — an expert-parallel group of engines on threads (ep_runtime.h). */
#include "engine/ep_runtime.h"

#include "common/eg_thread.h"
#include "engine/collective.h"
#include "engine/collective_cuda.h"
#include "engine/plan.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ep_rank_run {
    struct eg_ep_runtime *rt;
    int rank;
    pthread_t th;
    int started;
    eg_status st;
    eg_error err;
    int caller_failed; /* st is the caller's next() or done() failing: its message, as is */
    /* the last request's arrays, copied under the lock: the caller's next() may reuse its
       buffers at its next call, which another rank can make before this engine copies */
    int32_t *tok, *stop;
    int tok_cap, stop_cap;
    /* admission balance (under the runtime's lock): the rank's requests admitted and not
       done, with the tokens each may hold (prompt + max_new) */
    int slots, open, exhausted;
    int64_t load;
    uint64_t *ids;    /* [2 * slots + 2] ids of the open requests */
    int64_t *sizes;   /* [2 * slots + 2] their tokens */
    int cap;
} ep_rank_run;

struct eg_ep_runtime {
    int ep;
    int P;               /* stage groups: each rank's stages on threads and backends of their
                            own, a group per stage; 1: a rank's stages on its one thread */
    eg_ep_group **groups;/* [P] group k: the ranks' stage-k backends (P == 1: every stage) */
    eg_backend **be;  /* [ep][P] rank r's stage k at r * P + k */
    eg_engine **eng;  /* [ep] */
    ep_rank_run *runs;/* [ep] */
    pthread_mutex_t mu;
    eg_next_fn next;
    eg_done_fn done;
    void *ctx;
    int stop_requested; /* eg_ep_runtime_request_stop (sticky, as the engines'): atomic accesses only */
};

void eg_ep_runtime_free(eg_ep_runtime *rt) {
    if (!rt) return;
    for (int r = 0; rt->eng && r < rt->ep; r++) eg_engine_free(rt->eng[r]);
    /* the groups before the backends: the nccl groups use their streams */
    for (int k = 0; rt->groups && k < rt->P; k++) eg_ep_group_free(rt->groups[k]);
    free(rt->groups);
    for (int r = 0; rt->be && r < rt->ep * rt->P; r++) eg_backend_free(rt->be[r]);
    free(rt->eng);
    free(rt->be);
    for (int r = 0; rt->runs && r < rt->ep; r++) {
        free(rt->runs[r].tok);
        free(rt->runs[r].stop);
        free(rt->runs[r].ids);
        free(rt->runs[r].sizes);
    }
    free(rt->runs);
    pthread_mutex_destroy(&rt->mu);
    free(rt);
}

int eg_ep_runtime_stage_device(int first, int ep, int stage_groups, int rank, int stage) {
    return eg_ep_runtime_rank_device(first, (stage_groups ? stage : 0) * ep + rank);
}

eg_status eg_ep_runtime_check(const eg_config *c, int ep, int n_slots, eg_error *err) {
    if (ep < 1) return eg_fail(err, EG_ERR_INVALID, "--ep %d: must be at least 1", ep);
    if (c->n_experts < 1 || c->n_experts % ep)
        return eg_fail(err, EG_ERR_INVALID, "--ep %d does not divide the model's %d routed experts", ep, c->n_experts);
    if (n_slots < ep)
        return eg_fail(err, EG_ERR_INVALID, "--ep %d needs at least one sequence slot per rank (--batch %d)", ep,
                       n_slots);
    return EG_OK;
}

static void fail_all(eg_ep_runtime *rt) {
    for (int k = 0; k < rt->P; k++) eg_ep_fail(rt->groups[k]);
}

eg_status eg_ep_runtime_create(const eg_model *m, const eg_backend_opts *bo, const eg_engine_opts *o, int ep,
                               int stage_groups, eg_drafter *const *drafters, eg_ep_runtime **out, eg_error *err) {
    *out = NULL;
    const eg_config *c = &m->cfg;
    if (o->drafter)
        return eg_fail(err, EG_ERR_INVALID,
                       "--ep %d: one drafter cannot serve every rank (its state is driven by one thread): give one "
                       "per rank", ep);
    eg_status st0 = eg_ep_runtime_check(c, ep, o->n_slots, err);
    if (st0) return st0;
    if (o->stage_backends || o->ep_stages)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel ranks: the runtime builds the stages' backends and groups "
                       "(stage_groups), not the caller");
    int cuda = bo->name && !strcmp(bo->name, "cuda");
    int P = stage_groups && o->stage_ends && o->n_stages > 1 ? o->n_stages : 1;
    if (cuda && P > 1 && eg_ep_cuda_devices() < P * ep)
        return eg_fail(err, EG_ERR_INVALID, "--stages %d --ep %d as stage groups needs %d GPUs, one per rank and "
                       "stage; %d found", P, ep, P * ep, eg_ep_cuda_devices());
    if (bo->name && strcmp(bo->name, "cpu") && !cuda)
        return eg_fail(err, EG_ERR_UNSUPPORTED, "--ep %d on the %s backend: the expert exchange runs CPU ranks (local) "
                       "or CUDA ranks (nccl)", ep, bo->name);
    if (o->ep_split != EG_EP_SPLIT_NONE && o->ep_split != EG_EP_SPLIT_FFN && o->ep_split != EG_EP_SPLIT_ALL)
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel split %d: expected none, ffn or all", (int)o->ep_split);
    if (o->ep_split != EG_EP_SPLIT_NONE && ep < 2)
        return eg_fail(err, EG_ERR_INVALID, "--ep-split %s needs an expert-parallel group (--ep > 1, got %d)",
                       o->ep_split == EG_EP_SPLIT_ALL ? "all" : "ffn", ep);
    int bs = o->block_size > 0 ? o->block_size : 64;
    if (o->kv_blocks > 0 && (o->kv_blocks / ep) * bs < o->max_seq_len)
        return eg_fail(err, EG_ERR_INVALID,
                       "--ep %d: each rank's share of the KV pool (%lld of %lld blocks of %d tokens) cannot hold one "
                       "sequence of --max-seq-len %d: raise --kv-tokens or lower --ep",
                       ep, (long long)(o->kv_blocks / ep), (long long)o->kv_blocks, bs, o->max_seq_len);
    eg_ep_runtime *rt = eg_calloc(1, sizeof *rt, err);
    if (!rt) return EG_ERR_NOMEM;
    rt->ep = ep;
    rt->P = P;
    pthread_mutex_init(&rt->mu, NULL);
    rt->be = eg_calloc((size_t)(ep * P), sizeof *rt->be, err);
    rt->groups = eg_calloc((size_t)P, sizeof *rt->groups, err);
    rt->eng = eg_calloc((size_t)ep, sizeof *rt->eng, err);
    rt->runs = eg_calloc((size_t)ep, sizeof *rt->runs, err);
    eg_backend **gbe = eg_calloc((size_t)ep, sizeof *gbe, err); /* one group's backends */
    /* the layers split between stages (engine.h stage_cuts), per layer, as every group
       splits them: each half a routed call of its own (collective.h) */
    int *cuts = eg_calloc((size_t)c->n_layers, sizeof *cuts, err);
    eg_status st = EG_OK;
    if (!rt->be || !rt->groups || !rt->eng || !rt->runs || !gbe || !cuts) {
        st = EG_ERR_NOMEM;
        goto fail;
    }
    int threads = bo->nthreads > 0 ? bo->nthreads : eg_num_threads();
    for (int r = 0; r < ep; r++)
        for (int k = 0; k < P; k++) {
            eg_backend_opts so = *bo;
            so.nthreads = threads / (ep * P) > 0 ? threads / (ep * P) : 1;
            if (cuda) so.device = eg_ep_runtime_stage_device(bo->device, ep, P > 1, r, k);
            if ((st = eg_backend_create(c, &so, &rt->be[r * P + k], err))) {
                if (P > 1) eg_wrap(err, "expert-parallel rank %d, stage %d", r, k);
                else eg_wrap(err, "expert-parallel rank %d", r);
                goto fail;
            }
        }
    for (int k = 0; o->stage_ends && o->stage_cuts && k + 1 < o->n_stages; k++)
        if (o->stage_cuts[k] > 0 && o->stage_ends[k] >= 1 && o->stage_ends[k] <= c->n_layers)
            cuts[o->stage_ends[k] - 1] = o->stage_cuts[k];
    for (int k = 0; k < P; k++) {
        for (int r = 0; r < ep; r++) gbe[r] = rt->be[r * P + k];
        eg_ep_opts go = {.n_ranks = ep, .n_experts = c->n_experts, .topk = c->topk, .hidden = c->hidden,
                         .max_tokens = o->max_tokens, .n_layers = c->n_layers, .layer_cuts = cuts, .backends = gbe,
                         .ffn_split = o->ep_split != EG_EP_SPLIT_NONE,
                         .vocab_split = o->ep_split == EG_EP_SPLIT_ALL, .vocab = c->vocab};
        if ((st = eg_ep_group_create(&go, &rt->groups[k], err))) {
            if (P > 1) eg_wrap(err, "stage %d's expert-parallel group", k);
            goto fail;
        }
    }
    free(cuts);
    free(gbe);
    cuts = NULL;
    gbe = NULL;
    for (int r = 0; r < ep; r++) {
        eg_engine_opts ro = *o;
        /* slots and blocks split over the ranks, the remainder to the first ones */
        ro.n_slots = eg_ep_runtime_rank_slots(o->n_slots, ep, r);
        ro.drafter = drafters ? drafters[r] : NULL; /* its own state, for this rank's slots */
        ep_rank_run *x = &rt->runs[r];
        x->slots = ro.n_slots;
        x->cap = 2 * ro.n_slots + 2; /* active + parked <= slots, one pending; slack */
        x->ids = eg_calloc((size_t)x->cap, sizeof *x->ids, err);
        x->sizes = eg_calloc((size_t)x->cap, sizeof *x->sizes, err);
        if (!x->ids || !x->sizes) {
            st = EG_ERR_NOMEM;
            goto fail;
        }
        if (o->kv_blocks > 0) ro.kv_blocks = o->kv_blocks / ep + (r < o->kv_blocks % ep);
        /* the host budget for preempted caches is the group's: each rank keeps its swap
           buffers for the next victim, so E whole budgets would all be held at once */
        if (o->host_kv_bytes > 0) ro.host_kv_bytes = o->host_kv_bytes / ep + (r < o->host_kv_bytes % ep);
        if (o->micro_batches > ro.n_slots) ro.micro_batches = ro.n_slots;
        ro.ep = rt->groups[0];
        ro.ep_rank = r;
        if (P > 1) { /* a thread and a backend per stage, stage k's calls in group k */
            ro.stage_backends = &rt->be[r * P];
            ro.ep_stages = rt->groups;
        }
        if ((st = eg_backend_bind(rt->be[r * P], err)) || /* CUDA: this thread on the rank's (first) GPU */
            (st = eg_engine_create(m, rt->be[r * P], &ro, &rt->eng[r], err))) {
            eg_wrap(err, "expert-parallel rank %d", r);
            goto fail;
        }
    }
    *out = rt;
    return EG_OK;
fail:
    free(cuts);
    free(gbe);
    eg_ep_runtime_free(rt);
    return st;
}

eg_engine *eg_ep_runtime_engine(eg_ep_runtime *rt, int rank) { return rt->eng[rank]; }
int eg_ep_runtime_rank_slots(int n_slots, int ep, int rank) { return n_slots / ep + (rank < n_slots % ep); }
int eg_ep_runtime_ranks(const eg_ep_runtime *rt) { return rt->ep; }
void eg_ep_runtime_request_stop(eg_ep_runtime *rt) {
    if (rt) __atomic_store_n(&rt->stop_requested, 1, __ATOMIC_RELAXED);
    for (int r = 0; rt && rt->eng && r < rt->ep; r++)
        if (rt->eng[r]) eg_engine_request_stop(rt->eng[r]);
}
int64_t eg_ep_runtime_rank_weight_bytes(const eg_ep_runtime *rt, int rank) {
    return eg_engine_weight_bytes(rt->eng[rank]);
}
int eg_ep_runtime_stages(const eg_ep_runtime *rt) { return rt->P; }
int64_t eg_ep_runtime_ffn_rows(const eg_ep_runtime *rt) {
    int64_t n = 0;
    for (int k = 0; k < rt->P; k++) n += eg_ep_ffn_rows(rt->groups[k]);
    return n;
}
void eg_ep_runtime_vocab_rows(const eg_ep_runtime *rt, int64_t *embed_rows, int64_t *logit_rows) {
    *embed_rows = *logit_rows = 0;
    for (int k = 0; k < rt->P; k++) {
        int64_t a, b;
        eg_ep_vocab_rows(rt->groups[k], &a, &b);
        *embed_rows += a;
        *logit_rows += b;
    }
}
int64_t eg_ep_runtime_device_bytes(const eg_config *c, int ep, int max_tokens, int vocab_split) {
    eg_ep_opts go = {.n_ranks = ep, .n_experts = c->n_experts, .topk = c->topk, .hidden = c->hidden,
                     .max_tokens = max_tokens, .vocab_split = vocab_split, .vocab = c->vocab};
    return eg_ep_device_bytes(&go);
}
int64_t eg_ep_runtime_layer_bytes(const eg_model *m, int layer, int ep, int ffn_rank, int cut, int side) {
    const eg_layer_w *L = &m->layers[layer];
    int E = m->cfg.n_experts;
    if (cut <= 0 || cut >= E || !L->is_moe) cut = 0;
    int64_t all = cut ? eg_plan_split_layer_bytes(m, layer, cut, side) : eg_plan_layer_bytes(m, layer);
    if (ffn_rank >= 0 && ep > 1 && layer % ep != ffn_rank && (!cut || side)) { /* forward.c's upload_layer skips them */
        const eg_weight *f[] = {&L->mlp_gate, &L->mlp_up, &L->mlp_down, &L->sh_gate, &L->sh_up, &L->sh_down};
        for (size_t i = L->is_moe ? 3 : 0; i < (L->is_moe ? 6u : 3u); i++)
            if (f[i]->fmt != EG_W_NONE) all -= eg_weight_bytes(f[i]);
    }
    if (!L->is_moe || !L->experts || ep <= 1) return all;
    /* the group's shares (collective.h): a one-layer group split where this layer is */
    eg_ep_opts go = {.n_ranks = ep, .n_experts = E, .n_layers = 1, .layer_cuts = &cut};
    int64_t worst = 0, total = 0;
    for (int r = 0; r < ep; r++) {
        int64_t mine = 0;
        int e0, e1;
        eg_ep_share(&go, r, cut && side ? 1 : 0, &e0, &e1);
        for (int e = e0; e < e1; e++)
            mine += eg_weight_bytes(&L->experts[e].gate) + eg_weight_bytes(&L->experts[e].up) +
                    eg_weight_bytes(&L->experts[e].down);
        total += mine;
        if (mine > worst) worst = mine;
    }
    return all - total + worst;
}

int eg_ep_runtime_rank_device(int first, int rank) {
    int n = eg_ep_cuda_devices();
    return n > 0 ? (first + rank) % n : first + rank;
}

int eg_ep_runtime_ranks_per_gpu(int ep) {
    int n = eg_ep_cuda_devices();
    return n > 0 && ep > n ? (ep + n - 1) / n : 1;
}
const char *eg_ep_runtime_exchange(const eg_ep_runtime *rt) { return eg_ep_kind(rt->groups[0]); }

static int grow(int32_t **buf, int *cap, int n, eg_error *err) {
    if (n <= *cap) return 0;
    int32_t *nb = realloc(*buf, sizeof(int32_t) * (size_t)n);
    if (!nb) return eg_fail(err, EG_ERR_NOMEM, "expert-parallel rank: out of memory for a request of %d tokens", n), -1;
    *buf = nb;
    *cap = n;
    return 0;
}

/* Least-loaded admission: a rank takes the next request only when no other rank that
 * could take it (not finished, a slot free) holds fewer tokens; otherwise "later" (it
 * asks again at its next step). A rank with nothing open is never refused, so no rank
 * waits idle while another queues work, and a long sequence does not pile onto a rank
 * that already has one. */
static int locked_next(void *vc, eg_request *req, eg_error *err) {
    ep_rank_run *x = vc;
    eg_ep_runtime *rt = x->rt;
    pthread_mutex_lock(&rt->mu);
    for (int q = 0; q < rt->ep; q++) {
        const ep_rank_run *y = &rt->runs[q];
        if (y != x && !y->exhausted && y->open < y->slots && y->load < x->load) {
            pthread_mutex_unlock(&rt->mu);
            return EG_NEXT_LATER;
        }
    }
    if (x->open >= x->cap) { /* cannot happen: the engine holds at most slots + 1 */
        pthread_mutex_unlock(&rt->mu);
        return eg_fail(err, EG_ERR_INVALID, "expert-parallel rank %d: %d requests open (table of %d)", x->rank,
                       x->open, x->cap), -1;
    }
    int r = rt->next(rt->ctx, req, err);
    if (r < 0) x->caller_failed = 1;
    if (r == 0) x->exhausted = 1;
    if (r == 1) { /* not EG_NEXT_LATER, the caller's own "later": no request came */
        x->ids[x->open] = req->id;
        x->sizes[x->open] = (int64_t)req->n_tokens + req->max_new;
        x->load += x->sizes[x->open++];
        if (grow(&x->tok, &x->tok_cap, req->n_tokens, err) || grow(&x->stop, &x->stop_cap, req->n_stop, err)) {
            r = -1;
        } else {
            if (req->n_tokens) memcpy(x->tok, req->tokens, sizeof(int32_t) * (size_t)req->n_tokens);
            if (req->n_stop) memcpy(x->stop, req->stop_ids, sizeof(int32_t) * (size_t)req->n_stop);
            req->tokens = x->tok;
            req->stop_ids = x->stop;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    return r;
}

static eg_status locked_done(void *vc, const eg_result *res, eg_error *err) {
    ep_rank_run *x = vc;
    eg_ep_runtime *rt = x->rt;
    pthread_mutex_lock(&rt->mu);
    for (int i = 0; i < x->open; i++)
        if (x->ids[i] == res->id) {
            x->load -= x->sizes[i];
            x->ids[i] = x->ids[--x->open];
            x->sizes[i] = x->sizes[x->open];
            break;
        }
    eg_status st = rt->done(rt->ctx, res, err);
    if (st) x->caller_failed = 1;
    pthread_mutex_unlock(&rt->mu);
    return st;
}

static void *rank_thread(void *v) {
    ep_rank_run *x = v;
    eg_ep_runtime *rt = x->rt;
    x->st = eg_backend_bind(rt->be[x->rank * rt->P], &x->err);
    if (!x->st) x->st = eg_engine_run(rt->eng[x->rank], locked_next, locked_done, x, &x->err);
    /* the rank's own failure (its backend, its cache) says which rank (and so which GPU);
       a caller's message (a bad record) and another rank's echo are passed on as they are */
    if (x->st && x->st != EG_ERR_INTERRUPTED && !x->caller_failed && !strstr(x->err.msg, "expert-parallel rank"))
        eg_wrap(&x->err, "expert-parallel rank %d", x->rank);
    if (x->st) {
        fail_all(rt); /* the others stop at their next exchange */
        for (int q = 0; q < rt->ep; q++) eg_engine_request_stop(rt->eng[q]);
    } else if ((x->st = eg_engine_ep_leave(rt->eng[x->rank], &x->err))) {
        fail_all(rt);
    }
    return NULL;
}

eg_status eg_ep_runtime_run(eg_ep_runtime *rt, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err) {
    rt->next = next;
    rt->done = done;
    rt->ctx = ctx;
    for (int r = 0; r < rt->ep; r++) {
        ep_rank_run *x = &rt->runs[r];
        x->rt = rt;
        x->rank = r;
        x->started = 0;
        x->st = EG_OK;
        memset(&x->err, 0, sizeof x->err);
        x->open = x->exhausted = x->caller_failed = 0;
        x->load = 0;
    }
    /* every rank's admission state is reset before any rank thread runs: a started rank
       reads the others' (under the lock, which these plain writes do not take) */
    for (int r = 1; r < rt->ep; r++) {
        if (!eg_thread_start(&rt->runs[r].th, rank_thread, &rt->runs[r])) rt->runs[r].started = 1;
        else {
            fail_all(rt);
            rt->runs[r].st = eg_fail(&rt->runs[r].err, EG_ERR_NOMEM, "expert-parallel rank %d: no thread", r);
        }
    }
    rank_thread(&rt->runs[0]);
    for (int r = 1; r < rt->ep; r++)
        if (rt->runs[r].started) pthread_join(rt->runs[r].th, NULL);
    /* the first real failure (not the "another rank failed" echo); a stop asked of the
       group is reported as one engine reports it, whichever rank saw it first */
    for (int r = 0; r < rt->ep; r++)
        if (rt->runs[r].st && rt->runs[r].st != EG_ERR_INTERRUPTED) {
            *err = rt->runs[r].err;
            return rt->runs[r].st;
        }
    if (__atomic_load_n(&rt->stop_requested, __ATOMIC_RELAXED))
        for (int r = 0; r < rt->ep; r++)
            if (rt->runs[r].st) return eg_fail(err, EG_ERR_INTERRUPTED, "stopped on request");
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < rt->ep; r++)
            if (rt->runs[r].st && (pass || rt->runs[r].st != EG_ERR_INTERRUPTED)) {
                *err = rt->runs[r].err;
                return rt->runs[r].st;
            }
    return EG_OK;
}

void eg_ep_runtime_stats(const eg_ep_runtime *rt, eg_engine_stats *s) {
    memset(s, 0, sizeof *s);
    for (int r = 0; r < rt->ep; r++) {
        eg_engine_stats q;
        eg_engine_get_stats_shared(rt->eng[r], &q); /* other ranks may be running */
        s->steps = q.steps > s->steps ? q.steps : s->steps;
        s->prefill_tokens += q.prefill_tokens;
        s->decode_tokens += q.decode_tokens;
        s->sequences += q.sequences;
        s->seconds = q.seconds > s->seconds ? q.seconds : s->seconds;
        s->max_in_flight = q.max_in_flight > s->max_in_flight ? q.max_in_flight : s->max_in_flight;
        for (int k = 0; k < 8; k++) s->stage_steps[k] += q.stage_steps[k];
        s->preemptions += q.preemptions;
        s->swap_outs += q.swap_outs;
        s->swap_ins += q.swap_ins;
        s->swap_bytes += q.swap_bytes;
        s->recomputed_tokens += q.recomputed_tokens;
        s->drains += q.drains;
        s->sum_concurrency += q.sum_concurrency;
        s->peak_concurrency += q.peak_concurrency;
        /* ranks step in lockstep: the group's steps and backlogged steps are a rank's (the
           most), its concurrency the ranks' sum, so backlog_concurrency / backlog_steps is
           the group's, as sum_concurrency / steps is (the ranks wait for room together when
           the cache is the wall; each rank's pool is a share of it) */
        s->backlog_steps = q.backlog_steps > s->backlog_steps ? q.backlog_steps : s->backlog_steps;
        s->backlog_concurrency += q.backlog_concurrency;
        s->sum_kv_live += q.sum_kv_live / rt->ep;
        s->host_kv_peak += q.host_kv_peak;
        s->buffer_sets += q.buffer_sets;
        /* speculative decoding: counts and seconds summed (rank-seconds: the shares hold) */
        s->verify_steps += q.verify_steps;
        s->drafted += q.drafted;
        s->accepted += q.accepted;
        s->spec_tokens += q.spec_tokens;
        s->backend_probs += q.backend_probs;
        s->draft_no_q += q.draft_no_q;
        s->logit_rows += q.logit_rows;
        s->backend_draws += q.backend_draws;
        s->backend_residuals += q.backend_residuals;
        s->draft_kept += q.draft_kept;
        s->draft_argmax += q.draft_argmax;
        s->draft_host_rows += q.draft_host_rows;
        s->draft_seconds += q.draft_seconds;
        s->verify_seconds += q.verify_seconds;
    }
}

void eg_ep_runtime_rank_stats(const eg_ep_runtime *rt, int rank, eg_engine_stats *s) {
    eg_engine_get_stats_shared(rt->eng[rank], s);
}

void eg_ep_runtime_traffic(const eg_ep_runtime *rt, int64_t *pairs, int64_t *bytes) {
    *pairs = *bytes = 0;
    for (int k = 0; k < rt->P; k++) {
        int64_t a, b;
        eg_ep_traffic(rt->groups[k], &a, &b);
        *pairs += a;
        *bytes += b;
    }
}
