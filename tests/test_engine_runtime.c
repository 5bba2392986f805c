/* Runtime tests (engine/runtime.h) on the fixture model tiny-a (5 layers, 16 routed
 * experts): one stage, two stages (threaded and one after another, balanced and
 * explicit), --ep 2 (alone and with two stages), --batch auto and a KV pool small
 * enough to preempt all give bit-identical tokens and captured rows for the same
 * requests; describe() reports what was chosen; bad combinations are refused with a
 * message naming them, before anything is run. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/cuda_plan.h"
#include "engine/drafter_eagle3.h"
#include "engine/ep_runtime.h"
#include "engine/mkmodel.h"
#include "engine/plan.h"
#include "engine/runtime.h"
#include "engine/runtime_bench.h"
#include "tests/check.h"

#define MODEL "../shared/fixtures/models/tiny-a"
#define NREQ 6
#define NAUX 3

static const int aux_layers[NAUX] = {-1, 1, 3};

typedef struct {
    int32_t *tokens[NREQ];
    int n_tokens[NREQ];
    float *aux[NREQ], *final[NREQ];
    int done[NREQ];
} results;

typedef struct {
    int next;
    int32_t buf[64];
    results *out;
    int64_t H;
} run_ctx;

static int prompt_len(int r) { return 3 + r * 7; }

static int next_req(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    run_ctx *c = vc;
    if (c->next >= NREQ) return 0;
    int r = c->next++;
    for (int i = 0; i < prompt_len(r); i++) c->buf[i] = (int32_t)((r * 131 + i * 37 + 11) % 500);
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)r;
    q->tokens = c->buf; /* reused at the next call: the runtime must copy */
    q->n_tokens = prompt_len(r);
    q->max_new = 10 + 3 * r;
    q->sp.temperature = r % 2 ? 0.8f : 0.0f; /* sampled and greedy */
    q->sp.top_p = 0.9f;
    q->rng = eg_rng_seed(7, (uint64_t)r);
    return 1;
}

static eg_status on_done(void *vc, const eg_result *r, eg_error *err) {
    (void)err;
    run_ctx *c = vc;
    int i = (int)r->id;
    results *o = c->out;
    CHECK(i >= 0 && i < NREQ && !o->done[i]);
    if (i < 0 || i >= NREQ || o->done[i]) return EG_OK;
    size_t T = (size_t)r->n_tokens, H = (size_t)c->H;
    o->done[i] = 1;
    o->n_tokens[i] = r->n_tokens;
    o->tokens[i] = malloc(4 * T);
    o->aux[i] = malloc(4 * T * NAUX * H);
    o->final[i] = malloc(4 * T * H);
    CHECK(r->aux && r->final && r->n_aux == NAUX);
    if (o->tokens[i] && o->aux[i] && o->final[i] && r->aux && r->final) {
        memcpy(o->tokens[i], r->tokens, 4 * T);
        memcpy(o->aux[i], r->aux, 4 * T * NAUX * H);
        memcpy(o->final[i], r->final, 4 * T * H);
    }
    return EG_OK;
}

static void free_results(results *r) {
    for (int i = 0; i < NREQ; i++) { free(r->tokens[i]); free(r->aux[i]); free(r->final[i]); }
    memset(r, 0, sizeof *r);
}

static eg_model model;
static int have_model;

static void load_model(void) {
    if (have_model) return;
    eg_error err = {0};
    CHECK_OK(eg_model_load(MODEL, &model, &err), &err);
    have_model = err.code == EG_OK;
}

/* The options every run shares; a test changes the layout fields. */
static eg_runtime_opts base_opts(void) {
    return (eg_runtime_opts){.model = &model, .backend = "cpu", .threads = 2, .n_slots = 4, .max_seq_len = 128,
                             .max_tokens = 16, .block_size = 8, .aux_layers = aux_layers, .n_aux = NAUX,
                             .check_recompute = 1, .ram_bytes = (int64_t)1 << 30};
}

static eg_engine_stats last_stats;
/* describe()'s arrays live with the runtime: copied out for the checks */
static int last_ends[8];
static int64_t last_stage_bytes[8];

static eg_status run(const eg_runtime_opts *o, results *out, eg_runtime_info *info, eg_error *err) {
    eg_runtime *rt = NULL;
    eg_status st = eg_runtime_create(o, &rt, err);
    if (!st) {
        const eg_runtime_info *in = eg_runtime_describe(rt);
        CHECK(in->n_stages >= 1 && in->n_stages <= 8);
        for (int k = 0; k < in->n_stages && k < 8; k++) {
            last_ends[k] = in->stage_ends[k];
            last_stage_bytes[k] = in->stage_weight_bytes[k];
        }
        if (info) {
            *info = *in;
            info->stage_ends = last_ends;
            info->stage_weight_bytes = last_stage_bytes;
            info->stage_device = NULL;
        }
        run_ctx c = {.out = out, .H = eg_runtime_model(rt)->cfg.hidden};
        st = eg_runtime_run(rt, next_req, on_done, &c, err);
        eg_runtime_stats(rt, &last_stats);
    }
    eg_runtime_free(rt);
    return st;
}

static int same(const results *a, const results *b, int64_t H) {
    for (int i = 0; i < NREQ; i++) {
        if (!a->done[i] || !b->done[i] || a->n_tokens[i] != b->n_tokens[i]) return 0;
        size_t T = (size_t)a->n_tokens[i];
        if (memcmp(a->tokens[i], b->tokens[i], 4 * T) || memcmp(a->aux[i], b->aux[i], 4 * T * NAUX * (size_t)H) ||
            memcmp(a->final[i], b->final[i], 4 * T * (size_t)H))
            return 0;
    }
    return 1;
}

static void test_layouts_identical(void) {
    load_model();
    if (!have_model) return;
    int64_t H = model.cfg.hidden;
    eg_error err = {0};
    results ref = {0};
    eg_runtime_info info;
    eg_runtime_opts o = base_opts();
    CHECK_OK(run(&o, &ref, &info, &err), &err);
    CHECK(info.n_stages == 1 && info.ep == 1 && info.n_slots == 4 && !info.auto_slots);
    CHECK(!strcmp(info.transport, "none"));
    CHECK(info.kv_capacity == info.kv_capacity_all && info.kv_capacity >= 4 * 128);
    CHECK(info.experts_per_rank == 16);
    CHECK(info.stage_ends[0] == 5 && info.stage_weight_bytes[0] == model.weight_bytes);
    int gen = 0;
    for (int i = 0; i < NREQ; i++) gen += ref.done[i] ? ref.n_tokens[i] - prompt_len(i) : 0;
    CHECKF(gen > 0, "nothing generated");
    CHECK(last_stats.decode_tokens == gen && last_stats.sequences == NREQ);

    static const int ends25[2] = {2, 5}, ends345[3] = {3, 4, 5}, cuts345[3] = {11, 3, 0};
    struct {
        const char *name;
        const char *stages;
        const int *ends;
        int n_ends, threaded, ep, n_stages_want;
        int64_t kv_tokens, host_kv_bytes;
        int max_seq_len;
        int auto_slots;
        const int *cuts; /* with ends: stage_cuts */
        int n_slots;     /* 0: base_opts' */
    } v[] = {
        {"two balanced stages, threaded", "2", NULL, 0, 1, 0, 2, 0, 0, 128, 0, NULL, 0},
        {"stages 1,3,5 one after another", "1,3,5", NULL, 0, 0, 0, 3, 0, 0, 128, 0, NULL, 0},
        {"explicit ends {2,5}, threaded", NULL, ends25, 2, 1, 0, 2, 0, 0, 128, 0, NULL, 0},
        {"--ep 2", NULL, NULL, 0, 1, 2, 1, 0, 0, 128, 0, NULL, 0},
        {"--ep 2 with two stages (stage groups)", "2", NULL, 0, 1, 2, 2, 0, 0, 128, 0, NULL, 0},
        {"--ep 2 with two stages, one after another on each rank", "2", NULL, 0, 0, 2, 2, 0, 0, 128, 0, NULL, 0},
        {"--ep 2 with three stage groups, 8 slots", "3", NULL, 0, 1, 2, 3, 0, 0, 128, 0, NULL, 8},
        {"--ep 4 with two stage groups, 8 slots, a pool that preempts (host copies)", "2", NULL, 0, 1, 4, 2, 256, -1,
         64, 0, NULL, 8},
        {"--batch auto", NULL, NULL, 0, 1, 0, 1, 0, 0, 128, 1, NULL, 0},
        {"a pool that preempts (host copies)", NULL, NULL, 0, 1, 0, 1, 80, -1, 64, 0, NULL, 0},
        {"--ep 2 with two stages, a pool that preempts (recomputed)", "2", NULL, 0, 1, 2, 2, 144, 0, 64, 0, NULL, 0},
        /* a layer's routed experts split between two stages (END:CUT), the sum continued */
        {"layer 1 split at expert 5, threaded", "2:5,5", NULL, 0, 1, 0, 2, 0, 0, 128, 0, NULL, 0},
        {"three splits (one of expert 0 alone, one of expert 15 alone), one after another", "2:1,3:8,4:15,5", NULL,
         0, 0, 0, 4, 0, 0, 128, 0, NULL, 0},
        {"explicit ends {3,4,5} with cuts {11,3,0}, threaded", NULL, ends345, 3, 1, 0, 3, 0, 0, 128, 0, cuts345, 0},
        {"layer 2 split, a pool that preempts (host copies)", "3:7,5", NULL, 0, 1, 0, 2, 80, -1, 64, 0, NULL, 0},
        {"layer 2 split, a pool that preempts (recomputed)", "3:7,5", NULL, 0, 0, 0, 2, 80, 0, 64, 0, NULL, 0},
        /* a split layer inside expert-parallel groups: each half a routed call of its own,
           split over the ranks (stage groups: the two halves in two groups) */
        {"--ep 2, stage groups, layer 1 split at expert 5", "2:5,5", NULL, 0, 1, 2, 2, 0, 0, 128, 0, NULL, 0},
        {"--ep 2, stages one after another on each rank, three splits", "2:1,3:8,4:15,5", NULL, 0, 0, 2, 4, 0, 0,
         128, 0, NULL, 0},
        {"--ep 4, stage groups, layer 1 split at expert 1 (ranks with none of a half), 8 slots", "2:1,5", NULL, 0, 1,
         4, 2, 0, 0, 128, 0, NULL, 8},
        {"--ep 4, three stage groups, two splits, 8 slots, a pool that preempts (host copies)", "2:3,4:13,5", NULL, 0,
         1, 4, 3, 256, -1, 64, 0, NULL, 8},
        {"--ep 2, stage groups, explicit ends {3,4,5} with cuts {11,3,0}", NULL, ends345, 3, 1, 2, 3, 0, 0, 128, 0,
         cuts345, 0},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        results r = {0};
        o = base_opts();
        o.stages = v[k].stages;
        o.stage_ends = v[k].ends;
        o.stage_cuts = v[k].cuts;
        o.n_stages = v[k].n_ends;
        o.stage_threads = v[k].threaded;
        o.ep = v[k].ep;
        o.kv_tokens = v[k].kv_tokens;
        o.host_kv_bytes = v[k].host_kv_bytes;
        o.max_seq_len = v[k].max_seq_len;
        if (v[k].auto_slots) o.n_slots = 0;
        if (v[k].n_slots) o.n_slots = v[k].n_slots;
        eg_status st = run(&o, &r, &info, &err);
        CHECKF(st == EG_OK, "%s: %s", v[k].name, err.msg);
        CHECKF(same(&ref, &r, H), "%s: results differ from the one-stage runtime", v[k].name);
        CHECKF(info.n_stages == v[k].n_stages_want, "%s: %d stages", v[k].name, info.n_stages);
        CHECKF(info.stage_ends[info.n_stages - 1] == 5, "%s: last stage ends at %d", v[k].name,
               info.stage_ends[info.n_stages - 1]);
        int64_t wsum = 0;
        for (int s = 0; s < info.n_stages; s++) wsum += info.stage_weight_bytes[s];
        CHECKF(wsum == model.weight_bytes, "%s: stage weights %lld of %lld", v[k].name, (long long)wsum,
               (long long)model.weight_bytes);
        if (v[k].ep) {
            CHECK(info.ep == v[k].ep && info.experts_per_rank == 16 / v[k].ep);
            CHECK(info.kv_capacity_all > info.kv_capacity);
        }
        CHECKF(info.ep_groups == (v[k].ep > 1 && v[k].threaded && info.n_stages > 1), "%s: stage groups %d", v[k].name,
               info.ep_groups);
        /* stage groups: every rank's every stage ran steps (its own thread) */
        if (info.ep_groups)
            for (int s = 0; s < info.n_stages; s++) CHECKF(last_stats.stage_steps[s] > 0, "%s: stage %d ran nothing", v[k].name, s);
        if (info.n_stages > 1 && v[k].threaded && !v[k].ep) CHECK(!strcmp(info.transport, "local"));
        if (info.n_stages > 1) CHECK(info.micro_batches >= 1 && info.micro_batches <= info.n_slots);
        if (v[k].auto_slots) CHECKF(info.auto_slots && info.n_slots >= 1 && info.n_slots <= 16, "auto: %d slots", info.n_slots);
        if (v[k].kv_tokens) {
            CHECK(info.kv_blocks == v[k].kv_tokens / 8);
            CHECKF(last_stats.preemptions > 0, "%s: no preemption", v[k].name);
            /* < 0: a quarter of ram_bytes */
            CHECK(info.host_kv_bytes == (v[k].host_kv_bytes < 0 ? (int64_t)1 << 28 : v[k].host_kv_bytes));
            if (v[k].host_kv_bytes) CHECK(last_stats.swap_outs > 0);
            else CHECK(last_stats.recomputed_tokens > 0 && last_stats.swap_outs == 0);
        }
        free_results(&r);
    }
    /* --ep-split ffn: each layer's shared expert / dense MLP on one rank; --ep-split all:
       also the embedding and lm_head by vocab rows; the same results */
    for (int k = 0; k < 6; k++) { /* k % 3: one stage; two on each rank's thread; two stage groups */
        results r = {0};
        o = base_opts();
        o.ep = 2;
        o.ep_split = k < 3 ? EG_EP_SPLIT_FFN : EG_EP_SPLIT_ALL;
        const char *name = k < 3 ? "ffn" : "all";
        if (k % 3) { o.stages = "2"; o.kv_tokens = 144; o.host_kv_bytes = 0; o.max_seq_len = 64; }
        o.stage_threads = k % 3 == 2;
        eg_status st = run(&o, &r, &info, &err);
        CHECKF(st == EG_OK, "ep split %s %d: %s", name, k, err.msg);
        CHECKF(same(&ref, &r, H), "ep split %s%s: results differ from the one-stage runtime", name,
               k % 3 == 2 ? ", two stage groups" : k % 3 ? ", two stages" : "");
        CHECK(info.ep == 2 && info.ep_split == o.ep_split && info.ep_groups == (k % 3 == 2));
        if (k % 3) CHECKF(last_stats.preemptions > 0, "ep split %s, small pool: no preemption", name);
        /* the group's backlogged steps are among its steps (they were summed over the ranks) */
        CHECKF(last_stats.backlog_steps <= last_stats.steps && (!(k % 3) || last_stats.backlog_steps > 0),
               "ep split %s %d: %lld backlogged steps of %lld", name, k, (long long)last_stats.backlog_steps,
               (long long)last_stats.steps);
        free_results(&r);
    }
    /* the splits with a layer split between stages: the split layer's shared expert on
       its owner after the cut; stage groups and one thread per rank */
    for (int k = 0; k < 4; k++) {
        results r = {0};
        o = base_opts();
        o.ep = 2;
        o.ep_split = k < 2 ? EG_EP_SPLIT_FFN : EG_EP_SPLIT_ALL;
        o.stages = k % 2 ? "2:9,5" : "3:7,5";
        o.stage_threads = k % 2 == 0;
        eg_status st = run(&o, &r, &info, &err);
        CHECKF(st == EG_OK, "ep split %d with a layer split: %s", k, err.msg);
        CHECKF(same(&ref, &r, H), "ep split %s, --stages %s%s: results differ from the one-stage runtime",
               k < 2 ? "ffn" : "all", o.stages, k % 2 ? "" : " (stage groups)");
        CHECK(info.ep_groups == (k % 2 == 0) && info.n_stages == 2);
        free_results(&r);
    }
    free_results(&ref);
}

/* The model loaded by the runtime itself (model_dir) gives the same results. */
static void test_model_dir(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results a = {0}, b = {0};
    eg_runtime_opts o = base_opts();
    CHECK_OK(run(&o, &a, NULL, &err), &err);
    o.model = NULL;
    o.model_dir = MODEL;
    o.ep = 2;
    CHECK_OK(run(&o, &b, NULL, &err), &err);
    CHECK(same(&a, &b, model.cfg.hidden));
    free_results(&a);
    free_results(&b);
    o.model_dir = "../shared/fixtures/models/no-such-model";
    eg_runtime *rt = NULL;
    CHECK(eg_runtime_create(&o, &rt, &err) != EG_OK && rt == NULL);
    CHECKF(strstr(err.msg, "no-such-model") != NULL, "%s", err.msg);
}

static void test_stop(void) {
    load_model();
    if (!have_model) return;
    for (int ep = 1; ep <= 2; ep++) {
        eg_error err = {0};
        eg_runtime_opts o = base_opts();
        o.ep = ep;
        eg_runtime *rt = NULL;
        CHECK_OK(eg_runtime_create(&o, &rt, &err), &err);
        if (!rt) continue;
        results r = {0};
        run_ctx c = {.out = &r, .H = model.cfg.hidden};
        eg_runtime_request_stop(rt);
        CHECKF(eg_runtime_run(rt, next_req, on_done, &c, &err) == EG_ERR_INTERRUPTED, "ep %d: %s", ep, err.msg);
        eg_runtime_free(rt);
        free_results(&r);
    }
    eg_runtime_request_stop(NULL);
}

/* A stop reaches every rank of a group: rank 0 (the caller's thread) takes one short
 * request and then runs out of work, so it only serves the others' exchanges; rank 1
 * runs two long ones. A stop asked then (what generate's signal handler does) must end
 * the run as "stopped on request" with neither long request finished, as on one engine;
 * it used to reach rank 0's engine only, and the group ran every request to its end. */
typedef struct {
    pthread_t rank0;
    int handed, short_given, rank0_out, stop, full_long, ep1;
    int32_t buf[8];
} stop_ctx;
static int stop_next(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    stop_ctx *c = vc;
    if (__atomic_load_n(&c->stop, __ATOMIC_SEQ_CST)) return 0; /* as generate's next after a signal */
    int on0 = c->ep1 ? !c->short_given : pthread_equal(pthread_self(), c->rank0);
    if (on0 && c->short_given) {
        __atomic_store_n(&c->rank0_out, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (!on0 && c->handed >= 2) return 0;
    int id = on0 ? 1000 : c->handed++;
    if (on0) c->short_given = 1;
    memset(q, 0, sizeof *q);
    for (int i = 0; i < 8; i++) c->buf[i] = (int32_t)((id * 131 + i * 37 + 11) % 500);
    q->id = (uint64_t)id;
    q->tokens = c->buf;
    q->n_tokens = 8;
    q->max_new = on0 ? 1 : 480;
    q->rng = eg_rng_seed(7, (uint64_t)id);
    return 1;
}
static eg_status stop_done(void *vc, const eg_result *r, eg_error *err) {
    (void)err;
    stop_ctx *c = vc;
    if (r->id == 1000 && c->ep1) __atomic_store_n(&c->rank0_out, 1, __ATOMIC_SEQ_CST);
    if (r->id != 1000 && r->n_generated == 480) c->full_long++;
    return EG_OK;
}
typedef struct { eg_runtime *rt; stop_ctx *c; } stop_mon;
static void *stop_monitor(void *v) {
    stop_mon *m = v;
    while (!__atomic_load_n(&m->c->rank0_out, __ATOMIC_SEQ_CST)) usleep(100);
    usleep(2000);
    __atomic_store_n(&m->c->stop, 1, __ATOMIC_SEQ_CST);
    eg_runtime_request_stop(m->rt);
    return NULL;
}
static void test_stop_idle_rank(void) {
    load_model();
    if (!have_model) return;
    for (int ep = 1; ep <= 2; ep++) {
        eg_error err = {0};
        eg_runtime_opts o = base_opts();
        o.ep = ep;
        o.n_slots = 2 * ep;
        o.max_seq_len = 512;
        o.n_aux = 0;
        o.aux_layers = NULL;
        eg_runtime *rt = NULL;
        CHECK_OK(eg_runtime_create(&o, &rt, &err), &err);
        if (!rt) continue;
        stop_ctx c = {.rank0 = pthread_self(), .ep1 = ep == 1};
        stop_mon m = {rt, &c};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, stop_monitor, &m) == 0);
        eg_status st = eg_runtime_run(rt, stop_next, stop_done, &c, &err);
        __atomic_store_n(&c.rank0_out, 1, __ATOMIC_SEQ_CST); /* the monitor ends either way */
        pthread_join(th, NULL);
        printf("    ep %d: %s, %d of 2 long requests ran to the end\n", ep, st ? err.msg : "ok", c.full_long);
        CHECKF(st == EG_ERR_INTERRUPTED && strstr(err.msg, "stopped on request"), "ep %d: status %d (%s)", ep, (int)st,
               err.msg);
        CHECKF(c.full_long == 0, "ep %d: %d long requests ran to the end after the stop", ep, c.full_long);
        eg_runtime_free(rt);
    }
}

/* A caller's next() may say "later" (EG_NEXT_LATER: a request exists, not for now); the
 * expert-parallel ranks' least-loaded admission took that for a request (an empty one of
 * id 0 in the rank's table, its open count raised), until the table filled and the run
 * failed ("6 requests open (table of 6)"), and a stale id 0 could take the real id 0's
 * completion. Every request now runs once, identical to the plain run, in every layout. */
static int same_req(const results *a, const results *b, int i, int64_t H);
typedef struct { run_ctx c; int calls, laters; } later_ctx;
static int later_next(void *vc, eg_request *q, eg_error *err) {
    later_ctx *l = vc;
    if (l->calls++ % 3 == 1) { l->laters++; return EG_NEXT_LATER; }
    return next_req(&l->c, q, err);
}
static eg_status later_done(void *vc, const eg_result *r, eg_error *err) { return on_done(&((later_ctx *)vc)->c, r, err); }
static void test_next_later(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0};
    eg_runtime_opts o = base_opts();
    CHECK_OK(run(&o, &base, NULL, &err), &err);
    const struct { const char *name, *stages; int ep, n_slots; } v[] = {
        {"one engine", NULL, 0, 4}, {"--ep 2", NULL, 2, 4}, {"--ep 2, two slots", NULL, 2, 2},
        {"--ep 2 --stages 2", "2", 2, 4}};
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        o = base_opts();
        o.ep = v[k].ep;
        o.stages = v[k].stages;
        o.stage_threads = 1;
        o.n_slots = v[k].n_slots;
        results b = {0};
        later_ctx l = {.c = {.out = &b, .H = model.cfg.hidden}};
        eg_runtime *rt = NULL;
        CHECK_OK(eg_runtime_create(&o, &rt, &err), &err);
        if (rt) CHECK_OK(eg_runtime_run(rt, later_next, later_done, &l, &err), &err);
        eg_runtime_free(rt);
        int n = 0;
        for (int r = 0; r < NREQ; r++) {
            n += b.done[r];
            CHECKF(same_req(&base, &b, r, model.cfg.hidden), "%s: request %d differs or is missing", v[k].name, r);
        }
        printf("    %s: %d of %d requests, %d \"later\" answers\n", v[k].name, n, NREQ, l.laters);
        CHECK(l.laters >= NREQ / 2);
        free_results(&b);
    }
    free_results(&base);
}

/* The host budget for preempted caches is the group's, split over the ranks: a pool of
 * 96 tokens per rank under 16 requests swaps, and the ranks' peaks together stay within
 * it (each rank used to get the whole budget: 2 x 16,000 bytes held against 20,000). */
typedef struct { int next; int32_t buf[20]; } budget_ctx;
static int budget_next(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    budget_ctx *c = vc;
    if (c->next >= 16) return 0;
    int r = c->next++;
    memset(q, 0, sizeof *q);
    for (int i = 0; i < 20; i++) c->buf[i] = (int32_t)((r * 131 + i * 37 + 11) % 500);
    q->id = (uint64_t)r;
    q->tokens = c->buf;
    q->n_tokens = 20;
    q->max_new = 40;
    q->rng = eg_rng_seed(7, (uint64_t)r);
    return 1;
}
static eg_status budget_done(void *vc, const eg_result *r, eg_error *err) {
    (void)vc; (void)r; (void)err;
    return EG_OK;
}
static void test_ep_host_budget(void) {
    load_model();
    if (!have_model) return;
    const int64_t budget = 20000;
    eg_error err = {0};
    eg_runtime_opts o = base_opts();
    o.ep = 2;
    o.n_slots = 8;
    o.max_seq_len = 64;
    o.kv_tokens = 192;
    o.host_kv_bytes = budget;
    o.n_aux = 0;
    o.aux_layers = NULL;
    eg_runtime *rt = NULL;
    CHECK_OK(eg_runtime_create(&o, &rt, &err), &err);
    if (!rt) return;
    budget_ctx c = {0};
    CHECK_OK(eg_runtime_run(rt, budget_next, budget_done, &c, &err), &err);
    eg_engine_stats s;
    eg_runtime_stats(rt, &s);
    int64_t sum = 0;
    for (int r = 0; r < 2; r++) {
        eg_engine_stats q;
        eg_ep_runtime_rank_stats(eg_runtime_ep_ranks(rt), r, &q);
        sum += q.host_kv_peak;
    }
    printf("    %lld swap-outs; host peaks of the ranks together %lld bytes, budget %lld\n", (long long)s.swap_outs,
           (long long)sum, (long long)budget);
    CHECKF(s.swap_outs > 0, "no swap-out: the test does not reach the budget");
    CHECKF(sum <= budget, "the ranks held %lld bytes of preempted caches, over the budget of %lld", (long long)sum,
           (long long)budget);
    eg_runtime_free(rt);
}

/* Whose error it is: a rank's own failure names the rank (with 8 GPUs, which one), the
 * caller's callback failing comes back with the caller's message as it is. Request 5 is
 * too long for max_seq_len (the rank's engine refuses it) or next() fails there. */
typedef struct { int next, fail_at, caller_fails; int32_t buf[20]; } errctx;
static int errctx_next(void *vc, eg_request *q, eg_error *err) {
    errctx *c = vc;
    if (c->next >= 8) return 0;
    int r = c->next++;
    if (r == c->fail_at && c->caller_fails) return eg_fail(err, EG_ERR_FORMAT, "prompts.jsonl:6: bad record"), -1;
    memset(q, 0, sizeof *q);
    for (int i = 0; i < 20; i++) c->buf[i] = (int32_t)((r * 131 + i * 37 + 11) % 500);
    q->id = (uint64_t)r;
    q->tokens = c->buf;
    q->n_tokens = 20;
    q->max_new = r == c->fail_at ? 200 : 4;
    q->rng = eg_rng_seed(7, (uint64_t)r);
    return 1;
}
static void test_ep_error_context(void) {
    load_model();
    if (!have_model) return;
    for (int caller = 0; caller < 2; caller++) {
        eg_error err = {0};
        eg_runtime_opts o = base_opts();
        o.ep = 2;
        eg_runtime *rt = NULL;
        CHECK_OK(eg_runtime_create(&o, &rt, &err), &err);
        if (!rt) return;
        errctx c = {.fail_at = 5, .caller_fails = caller};
        eg_status st = eg_runtime_run(rt, errctx_next, budget_done, &c, &err);
        printf("    %s: %s\n", caller ? "the caller's next() fails" : "a rank refuses a request", err.msg);
        CHECK(st != EG_OK);
        if (caller) CHECKF(st == EG_ERR_FORMAT && !strcmp(err.msg, "prompts.jsonl:6: bad record"), "%s", err.msg);
        else CHECKF(!strncmp(err.msg, "expert-parallel rank ", 21) && strstr(err.msg, "request 5") &&
                        strstr(err.msg, "max_seq_len"), "%s", err.msg);
        eg_runtime_free(rt);
    }
}

/* A refused combination returns an error naming it and no runtime. */
static void refused(const char *what, const eg_runtime_opts *o, const char *want, const char *want2) {
    eg_error err = {0};
    eg_runtime *rt = (eg_runtime *)&err; /* must come back NULL */
    eg_status st = eg_runtime_create(o, &rt, &err);
    CHECKF(st != EG_OK, "%s: accepted", what);
    CHECKF(rt == NULL, "%s: a runtime came back", what);
    CHECKF(strstr(err.msg, want) != NULL, "%s: '%s' does not say '%s'", what, err.msg, want);
    if (want2) CHECKF(strstr(err.msg, want2) != NULL, "%s: '%s' does not say '%s'", what, err.msg, want2);
}

static void test_refusals(void) {
    load_model();
    if (!have_model) return;
    eg_runtime_opts o = base_opts();
    o.ep = 3;
    refused("ep 3", &o, "--ep 3 does not divide the model's 16 routed experts", NULL);
    o = base_opts();
    o.ep = 8;
    refused("ep 8, 4 slots", &o, "--ep 8 needs at least one sequence slot per rank", "--batch 4");
    o = base_opts();
    o.ep = 2;
    o.backend = "metal"; /* ranks run on cpu (local exchange) and cuda (nccl) backends only */
    refused("ep 2 on another backend", &o, "--ep 2 on the metal backend", "CUDA ranks (nccl)");
    o = base_opts();
    o.ep_split = EG_EP_SPLIT_FFN; /* the shared expert / dense MLP split needs a group */
    refused("ep split, no ep", &o, "--ep-split ffn needs an expert-parallel group", "got 0");
    o = base_opts();
    o.ep = 2;
    o.ep_split = (eg_ep_split)7;
    refused("ep split 7", &o, "expert-parallel split 7 (expected none, ffn or all)", NULL);
    o = base_opts();
    o.ep_split = EG_EP_SPLIT_ALL;
    refused("ep split all, no ep", &o, "--ep-split all needs an expert-parallel group", "got 0");
    o = base_opts();
    o.ep = 4;
    o.kv_tokens = 256;
    refused("ep 4, small pool", &o, "--ep 4: each rank's share of the KV pool", "--max-seq-len 128");
    o = base_opts();
    o.stages = "9";
    refused("stages 9", &o, "--stages 9: the model has 5 layers", NULL);
    o.stages = "1,2";
    refused("stages 1,2", &o, "--stages 1,2: end layers must increase and the last must be 5", NULL);
    o.stages = "3,2,5";
    refused("stages 3,2,5", &o, "end layers must increase", NULL);
    o.stages = "two";
    refused("stages two", &o, "--stages: expected N or comma-separated end layers, got 'two'", NULL);
    o.stages = "2";
    static const int ends[2] = {2, 5};
    o.stage_ends = ends;
    o.n_stages = 2;
    refused("stages twice", &o, "as text or as end layers, not both", NULL);
    o = base_opts();
    o.kv_tokens = 100;
    refused("pool < one sequence", &o, "the KV pool (96 tokens) cannot hold one sequence of --max-seq-len 128", NULL);
    o = base_opts();
    o.model = NULL;
    refused("no model", &o, "no model", NULL);
    o = base_opts();
    o.max_tokens = 0;
    refused("no rows", &o, "max_tokens 0", NULL);
    o = base_opts();
    static const int bad_ends[2] = {2, 4};
    o.stage_ends = bad_ends;
    o.n_stages = 2;
    o.stage_threads = 0;
    refused("explicit ends not ending at L", &o, "stage", NULL);
    eg_runtime_free(NULL);
}

/* ---- speculative decoding over layouts ------------------------------------------- */

static char draft_dir[256];

/* A random EAGLE-3 drafter for tiny-a reading two of the captured layers. */
static int make_drafter(void) {
    if (draft_dir[0]) return 1;
    snprintf(draft_dir, sizeof draft_dir, "/tmp/eg_rt_drafter_%d", (int)getpid());
    static const int daux[2] = {1, 3};
    eg_mkdrafter_opts mo = {.target_dir = MODEL, .out_dir = draft_dir, .seed = 11, .draft_vocab = 300, .n_aux = 2,
                            .aux_layers = daux};
    eg_error err = {0};
    CHECK_OK(eg_mkmodel_drafter(&mo, &err), &err);
    if (err.code) draft_dir[0] = 0;
    return draft_dir[0] != 0;
}

/* Request i of a and b: the same tokens and captured rows, bit for bit. */
static int same_req(const results *a, const results *b, int i, int64_t H) {
    if (!a->done[i] || !b->done[i] || a->n_tokens[i] != b->n_tokens[i]) return 0;
    size_t T = (size_t)a->n_tokens[i];
    return !memcmp(a->tokens[i], b->tokens[i], 4 * T) && !memcmp(a->aux[i], b->aux[i], 4 * T * NAUX * (size_t)H) &&
           !memcmp(a->final[i], b->final[i], 4 * T * (size_t)H);
}

/* Greedy requests (even ids) with a drafter, in every layout, equal greedy without one
 * on one engine; sampled requests (odd ids, per-request RNG) equal sampled with the
 * drafter on one engine: --ep 2 and 4 (a drafter per rank, verify rows through the
 * exchange), threaded stages, --ep 2 with stages, and a pool that preempts; --ep-split ffn
 * and all too (verify rows through the shared expert / dense MLP exchange, and the verify
 * chunk's embedding and logits through the vocab owners). */
static void test_spec_layouts(void) {
    load_model();
    if (!have_model || !make_drafter()) return;
    int64_t H = model.cfg.hidden;
    eg_error err = {0};
    results plain = {0}, spec1 = {0};
    eg_runtime_info info;
    eg_runtime_opts o = base_opts();
    CHECK_OK(run(&o, &plain, &info, &err), &err);
    const int64_t plain_seq_host = info.seq_host_bytes;
    o.draft_model = draft_dir;
    o.draft_tokens = 3;
    CHECK_OK(run(&o, &spec1, &info, &err), &err);
    CHECK(info.n_drafters == 1 && info.draft_weight_bytes > 0 && info.draft_slot_bytes > 0 && info.draft_token_bytes > 0);
    /* a sampled slot's draft distributions (K x V doubles) count in its host bytes */
    CHECKF(info.seq_host_bytes == plain_seq_host + (int64_t)sizeof(double) * 3 * model.cfg.vocab,
           "host bytes per sequence %lld with a drafter, %lld without", (long long)info.seq_host_bytes,
           (long long)plain_seq_host);
    /* the drafter's paged cache is the engine's KV pool, block for block, plus the slots' rows */
    CHECKF(info.draft_state_bytes == info.kv_capacity_all * info.draft_token_bytes + 4 * info.draft_slot_bytes &&
               info.draft_device_bytes == 0,
           "drafter state %lld bytes, pool %lld tokens of %lld, 4 slots of %lld", (long long)info.draft_state_bytes,
           (long long)info.kv_capacity_all, (long long)info.draft_token_bytes, (long long)info.draft_slot_bytes);
    CHECKF(last_stats.verify_steps > 0, "no verify step with a drafter");
    for (int i = 0; i < NREQ; i += 2) CHECKF(same_req(&plain, &spec1, i, H), "request %d: greedy with a drafter differs", i);
    struct {
        const char *name, *stages;
        int ep, threaded, k;
        int64_t kv_tokens;
        eg_ep_split split;
    } v[] = {
        {"--ep 2", NULL, 2, 1, 3, 0, EG_EP_SPLIT_NONE},
        {"--ep 4", NULL, 4, 1, 3, 0, EG_EP_SPLIT_NONE},
        {"two threaded stages", "2", 0, 1, 3, 0, EG_EP_SPLIT_NONE},
        {"three threaded stages, k 2", "3", 0, 1, 2, 0, EG_EP_SPLIT_NONE},
        {"--ep 2 with two stage groups", "2", 2, 1, 3, 0, EG_EP_SPLIT_NONE},
        {"--ep 2 with two stages one after another on each rank", "2", 2, 0, 3, 0, EG_EP_SPLIT_NONE},
        {"--ep 2 with three stage groups, k 2", "3", 2, 1, 2, 0, EG_EP_SPLIT_NONE},
        {"--ep 2, a pool that preempts", NULL, 2, 1, 3, 144, EG_EP_SPLIT_NONE},
        {"two threaded stages, a pool that preempts", "2", 0, 1, 3, 80, EG_EP_SPLIT_NONE},
        {"a layer split between two threaded stages (3:6,5), a pool that preempts", "3:6,5", 0, 1, 3, 80,
         EG_EP_SPLIT_NONE},
        {"three threaded stages over two split layers (2:9,4:2,5), k 2", "2:9,4:2,5", 0, 1, 2, 0, EG_EP_SPLIT_NONE},
        {"--ep 4 --ep-split ffn", NULL, 4, 1, 3, 0, EG_EP_SPLIT_FFN},
        {"--ep 2 --ep-split ffn with two stages, a pool that preempts", "2", 2, 1, 3, 144, EG_EP_SPLIT_FFN},
        {"--ep 4 --ep-split all", NULL, 4, 1, 3, 0, EG_EP_SPLIT_ALL},
        {"--ep 2 --ep-split all with two stages, a pool that preempts", "2", 2, 1, 3, 144, EG_EP_SPLIT_ALL},
        /* a layer split inside expert-parallel groups (each half a routed call of its own) */
        {"--ep 2, stage groups over a split layer (3:6,5), a pool that preempts", "3:6,5", 2, 1, 3, 144,
         EG_EP_SPLIT_NONE},
        {"--ep 2 --ep-split ffn, two split layers one after another on each rank (2:9,4:2,5), k 2", "2:9,4:2,5", 2, 0,
         2, 0, EG_EP_SPLIT_FFN},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        results r = {0}, ref = {0};
        const results *want = &spec1;
        o = base_opts();
        o.draft_model = draft_dir;
        o.draft_tokens = v[k].k;
        if (v[k].k != 3) { /* sampled tokens depend on k: the one-engine run with this k */
            CHECK_OK(run(&o, &ref, NULL, &err), &err);
            want = &ref;
        }
        o.stages = v[k].stages;
        o.stage_threads = v[k].threaded;
        o.ep = v[k].ep;
        o.ep_split = v[k].split;
        o.kv_tokens = v[k].kv_tokens;
        if (v[k].kv_tokens) o.max_seq_len = 64; /* each rank's share holds one sequence */
        eg_status st = run(&o, &r, &info, &err);
        CHECKF(st == EG_OK, "%s: %s", v[k].name, err.msg);
        CHECKF(last_stats.verify_steps > 0, "%s: no verify step", v[k].name);
        if (getenv("EG_TEST_VERBOSE"))
            printf("    %s: %lld verify steps, %lld drafted, %lld accepted, %lld preemptions\n", v[k].name,
                   (long long)last_stats.verify_steps, (long long)last_stats.drafted, (long long)last_stats.accepted,
                   (long long)last_stats.preemptions);
        for (int i = 0; i < NREQ; i++)
            CHECKF(same_req(i % 2 ? want : &plain, &r, i, H), "%s: request %d (%s) differs", v[k].name, i,
                   i % 2 ? "sampled, from the one-engine spec run" : "greedy, from the run without a drafter");
        int ranks = v[k].ep > 1 ? v[k].ep : 1;
        CHECKF(info.n_drafters == ranks, "%s: %d drafters", v[k].name, info.n_drafters);
        /* each rank's drafter pool is its engine's (the 4 slots over the ranks) */
        CHECKF(info.draft_state_bytes == info.kv_capacity_all * info.draft_token_bytes + 4 * info.draft_slot_bytes,
               "%s: drafter state %lld bytes, pools %lld tokens", v[k].name, (long long)info.draft_state_bytes,
               (long long)info.kv_capacity_all);
        if (v[k].kv_tokens) CHECKF(last_stats.preemptions > 0, "%s: no preemption", v[k].name);
        CHECK(info.ep == ranks);
        CHECKF(info.ep_groups == (ranks > 1 && v[k].threaded && info.n_stages > 1), "%s: stage groups %d", v[k].name,
               info.ep_groups);
        free_results(&r);
        free_results(&ref);
    }
    free_results(&plain);
    free_results(&spec1);
}


/* --stages N with bytes beside the last stage (on CUDA the drafter on its GPU): they count
 * in its share, so the last stage gives up layers as they grow and never gains one; with
 * none the split is the weight-balanced one of eg_plan_split. */
static void test_stage_split_tail(void) {
    load_model();
    if (!have_model) return;
    const int L = model.cfg.n_layers;
    int *e0 = calloc((size_t)L, sizeof *e0), *e1 = calloc((size_t)L, sizeof *e1), *ref = calloc((size_t)L, sizeof *ref);
    double *cost = calloc((size_t)L, sizeof *cost);
    eg_error err = {0};
    int n = 0;
    int64_t tail = 0, head = eg_plan_head_bytes(&model, 2, &tail), total = head + tail;
    for (int l = 0; l < L; l++) total += (int64_t)(cost[l] = (double)eg_plan_layer_bytes(&model, l));
    CHECK(L >= 3 && e0 && e1 && ref && cost);
    if (!(L >= 3 && e0 && e1 && ref && cost)) goto out;
    CHECK_OK(eg_runtime_parse_stages("2", &model, 0, e0, &n, &err), &err);
    CHECK_OK(eg_plan_split(cost, L, (double)head, (double)tail, 2, ref, &err), &err);
    CHECKF(n == 2 && e0[0] == ref[0] && e0[1] == L, "without extra bytes: ends %d,%d, eg_plan_split %d", e0[0], e0[1],
           ref[0]);
    int prev = L - e0[0], moved = 0;
    for (int64_t x = (int64_t)cost[L - 1] / 4; x <= 2 * total; x *= 2) {
        CHECK_OK(eg_runtime_parse_stages("2", &model, x, e1, &n, &err), &err);
        int last = L - e1[0];
        CHECKF(n == 2 && last >= 1 && last <= prev, "%lld bytes beside the last stage: %d layers there, %d before",
               (long long)x, last, prev);
        moved |= last < L - e0[0];
        prev = last;
    }
    CHECKF(prev == 1, "twice the model's bytes beside the last stage leave it %d layers", prev);
    CHECK(moved || L - e0[0] == 1);
out:
    free(e0);
    free(e1);
    free(ref);
    free(cost);
}

/* The GPU plan (as if on a device of given memory; no GPU needed: the plan comes before
 * any backend) counts, on the GPU of the last stage, the drafter's weights and slots'
 * rows with the activations and its paged cache per token of the KV pool: the pool of
 * that GPU is smaller by exactly those bytes and the target's k more logit rows a
 * sequence (checked against the plan's own figures), the other GPUs' pools are not, and
 * the plan line says so. */
typedef struct { char lines[8][1024]; int n; } notes;
static void keep_note(void *ctx, const char *line) {
    notes *n = ctx;
    if (n->n < 8) snprintf(n->lines[n->n++], sizeof n->lines[0], "%s", line);
}

/* base_opts on CUDA with a memory plan of 2 GiB GPUs, all free (no device asked) */
static eg_runtime_opts planned_opts(void) {
    eg_runtime_opts o = base_opts();
    o.backend = "cuda";
    o.gpu_mem_fraction = 0.5;
    o.plan_total_bytes = o.plan_free_bytes = (int64_t)2 << 30;
    return o;
}

static int64_t plan_tokens(const notes *n, int line) {
    const char *p = line < n->n ? strstr(n->lines[line], "KV capacity ") : NULL;
    return p ? strtoll(p + strlen("KV capacity "), NULL, 10) : -1;
}

/* --batch auto plans the slots it chooses: the last stage's logits for their rows, not for
 * every row of a step (at a 2,048-row chunk every row's were 4 MB of a tiny model's pool,
 * as a fixed --batch of 2,048 plans them); no more pool than the fewest rows allow. */
static int64_t planned_capacity(int n_slots) {
    notes nn = {0};
    eg_runtime_opts o = planned_opts();
    o.n_slots = n_slots;
    o.max_tokens = 2048;
    o.max_seq_len = 256;
    o.block_size = 64;
    o.note = keep_note;
    o.note_ctx = &nn;
    eg_runtime *rt = NULL;
    eg_error err = {0};
    eg_status st = eg_runtime_create(&o, &rt, &err);
    CHECKF(st == EG_OK || strstr(err.msg, "cuda") || strstr(err.msg, "CUDA"), "%d slots: %s", n_slots, err.msg);
    eg_runtime_free(rt);
    return plan_tokens(&nn, 0);
}

static void test_auto_logit_rows(void) {
    load_model();
    if (!have_model) return;
    int64_t a = planned_capacity(0), all = planned_capacity(2048), one = planned_capacity(1);
    CHECKF(a > 0 && all > 0 && a > all && a <= one, "KV tokens: --batch auto %lld, 2048 slots %lld, 1 slot %lld",
           (long long)a, (long long)all, (long long)one);
}

static void test_spec_plan(void) {
    load_model();
    if (!have_model || !make_drafter()) return;
    const int64_t G = (int64_t)1 << 30;
    struct {
        const char *name, *stages;
        int ep, n_slots;
    } v[] = {{"one GPU", NULL, 0, 4}, {"two stages (the drafter on the second GPU)", "3,5", 0, 6},
             {"--ep 2 (each rank's GPU)", NULL, 2, 4}, {"--batch auto", NULL, 0, 0}};
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        notes without = {0}, with = {0};
        eg_runtime_info ia = {0}, ib = {0};
        for (int d = 0; d < 2; d++) {
            eg_runtime_opts o = planned_opts();
            o.stages = v[k].stages;
            o.whole_layers = 1; /* the same split with and without the drafter (stage_balance; the
                                   two stages are given: a split by bytes would move a layer
                                   off the drafter's GPU) */
            o.stage_threads = 1;
            o.ep = v[k].ep;
            o.n_slots = v[k].n_slots;
            o.max_seq_len = 4096; /* a drafter cache of some size */
            o.max_tokens = 64;
            o.block_size = 64;
            if (d) {
                o.draft_model = draft_dir;
                o.draft_tokens = 3;
            }
            o.note = keep_note;
            o.note_ctx = d ? &with : &without;
            eg_runtime *rt = NULL;
            eg_error err = {0};
            eg_status st = eg_runtime_create(&o, &rt, &err);
            /* without a GPU the backend cannot be made: the plan was made and noted first */
            CHECKF(st == EG_OK || strstr(err.msg, "cuda") || strstr(err.msg, "CUDA"), "%s: %s", v[k].name, err.msg);
            if (!st) *(d ? &ib : &ia) = *eg_runtime_describe(rt);
            eg_runtime_free(rt);
        }
        int gpus = v[k].stages ? 2 : 1;
        CHECKF(without.n == gpus && with.n == gpus, "%s: %d and %d plan lines", v[k].name, without.n, with.n);
        if (without.n != gpus || with.n != gpus) continue;
        /* the drafter's bytes as its loader counts them: the probe's one slot, its
           default pool of one slot's blocks at the runtime's block size */
        eg_drafter *probe = NULL;
        eg_error err = {0};
        eg_eagle3_opts po = {.threads = 1, .block_size = 64};
        CHECK_OK(eg_drafter_eagle3_load_opts(draft_dir, &model, 1, 4096, &po, &probe, &err), &err);
        if (!probe) continue;
        const int64_t w = probe->info.weight_bytes, tok = probe->info.cache_bytes_per_token,
                      slot = probe->info.state_bytes - probe->info.pool_blocks * 64 * tok,
                      buf = eg_drafter_eagle3_device_bytes(probe, EG_EAGLE3_GPU_ROWS);
        CHECK(probe->info.pool_blocks == 4096 / 64 && probe->info.block_size == 64);
        eg_drafter_free(probe);
        CHECK(w > 0 && slot > 0 && tok > 0);
        int last = gpus - 1;
        for (int g = 0; g < last; g++)
            CHECKF(plan_tokens(&without, g) == plan_tokens(&with, g), "%s: GPU %d's pool changed (%lld -> %lld)",
                   v[k].name, g, (long long)plan_tokens(&without, g), (long long)plan_tokens(&with, g));
        CHECKF(!strstr(without.lines[last], "drafter"), "%s: '%s'", v[k].name, without.lines[last]);
        const char *p = strstr(with.lines[last], "the activations include the drafter's ");
        long long got = 0, got_w = 0, got_buf = 0, got_slot = 0;
        int got_slots = 0;
        CHECKF(p && sscanf(p, "the activations include the drafter's %lld bytes (weights %lld, buffers %lld, %d slots' "
                              "rows of %lld",
                           &got, &got_w, &got_buf, &got_slots, &got_slot) == 5,
               "%s: no drafter in '%s'", v[k].name, with.lines[last]);
        int slots = v[k].n_slots ? (v[k].ep > 1 ? (v[k].n_slots + v[k].ep - 1) / v[k].ep : v[k].n_slots) : got_slots;
        /* its passes' buffers and backend scratch too (EG_EAGLE3_GPU_ROWS rows) */
        int64_t draft = w + buf + (int64_t)slots * slot;
        CHECKF(got == draft && got_w == w && got_buf == buf && got_slots == slots && got_slot == slot,
               "%s: the plan reserved %lld (weights %lld, buffers %lld, %d slots of %lld), the drafter takes %lld (%lld, "
               "%lld, %d of %lld)",
               v[k].name, got, got_w, got_buf, got_slots, got_slot, (long long)draft, (long long)w, (long long)buf,
               slots, (long long)slot);
        CHECK(buf > (int64_t)EG_EAGLE3_GPU_ROWS * 4 * (int64_t)model.cfg.hidden);
        if (!v[k].n_slots) CHECKF(got_slots >= 1, "%s: %d slots", v[k].name, got_slots);
        /* bytes per token: the target's layers' plus the drafter's cache, on its GPU only */
        int64_t t0 = plan_tokens(&without, last), t1 = plan_tokens(&with, last), pt0 = 0, pt1 = 0;
        const char *q0 = strstr(without.lines[last], "blocks, "), *q1 = strstr(with.lines[last], "blocks, ");
        pt0 = q0 ? strtoll(q0 + strlen("blocks, "), NULL, 10) : 0;
        pt1 = q1 ? strtoll(q1 + strlen("blocks, "), NULL, 10) : 0;
        CHECKF(pt0 > 0 && t0 > 0 && t1 > 0, "%s: no capacity in '%s'", v[k].name, without.lines[last]);
        CHECKF(pt1 == pt0 + tok, "%s: %lld bytes/token with the drafter, %lld without, its cache %lld", v[k].name,
               (long long)pt1, (long long)pt0, (long long)tok);
        char want[96];
        snprintf(want, sizeof want, "%lld of them the drafter's cache", (long long)tok);
        CHECKF(strstr(with.lines[last], want), "%s: '%s' lacks '%s'", v[k].name, with.lines[last], want);
        if (pt0 > 0 && t0 > 0 && t1 > 0) {
            /* the bytes left for the pool without it were in [B0, B0 + 1) blocks of pb0; with
               it `draft` fewer, in blocks of pb1: B1 lies between the two ends */
            /* and the target's logits on that GPU: k + 1 rows a sequence for the verify
               steps, one without (every row while --batch auto is unplanned) */
            int64_t lr1 = eg_forward_logit_rows(64, v[k].n_slots ? slots : got_slots, 3, 0),
                    lr0 = eg_forward_logit_rows(64, v[k].n_slots ? slots : 0, 0, 0);
            int64_t more = draft + 4 * (int64_t)model.cfg.vocab * (lr1 - lr0);
            int64_t pb0 = pt0 * 64, pb1 = (pt0 + tok) * 64, B0 = t0 / 64, B1 = t1 / 64;
            int64_t lo = (B0 * pb0 - more) / pb1, hi = ((B0 + 1) * pb0 - 1 - more) / pb1;
            CHECKF(t1 % 64 == 0 && B1 >= lo && B1 <= hi,
                   "%s: the pool has %lld blocks with the drafter, %lld without; expected %lld..%lld", v[k].name,
                   (long long)B1, (long long)B0, (long long)lo, (long long)hi);
        }
        if (ia.n_slots && ib.n_slots) CHECK(ib.draft_device_bytes == draft && ia.draft_device_bytes == 0);
    }
    /* eg_cuda_plan_mem directly: the drafter's bytes among the activations take exactly
       their whole blocks from the pool; bytes per token beside the layers' make every block
       dearer by that much */
    {
        const eg_config *c = &model.cfg;
        eg_backend_opts bo = {.name = "cuda", .max_tokens = 64, .max_seq_len = 4096};
        eg_cuda_mem_plan a, b, x;
        eg_error err = {0};
        const int64_t per_tok = (int64_t)c->n_layers * (c->kv_lora_rank + c->qk_rope) * 2, per_block = per_tok * 64;
        CHECK_OK(eg_cuda_plan_mem(c, &bo, 0.5, 2 * G, 2 * G, 1000, 5000, c->n_layers, 0, 64, &a, &err), &err);
        int64_t draft = 7 * per_block; /* a whole number of blocks */
        CHECK_OK(eg_cuda_plan_mem(c, &bo, 0.5, 2 * G, 2 * G, 1000, 5000 + draft, c->n_layers, 0, 64, &b, &err), &err);
        CHECKF(a.kv_blocks - b.kv_blocks == 7 && a.kv_tokens - b.kv_tokens == 7 * 64, "%lld -> %lld blocks",
               (long long)a.kv_blocks, (long long)b.kv_blocks);
        /* as many bytes again per token: half the blocks (the budget's remainder aside) */
        CHECK_OK(eg_cuda_plan_mem(c, &bo, 0.5, 2 * G, 2 * G, 1000, 5000, c->n_layers, per_tok, 64, &x, &err), &err);
        CHECKF(x.kv_bytes_per_token == 2 * per_tok && x.extra_per_token == per_tok && x.kv_blocks == a.kv_blocks / 2,
               "%lld blocks of %lld bytes/token with the extra, %lld without", (long long)x.kv_blocks,
               (long long)x.kv_bytes_per_token, (long long)a.kv_blocks);
        CHECK(eg_cuda_plan_mem(c, &bo, 0.5, 2 * G, 2 * G, 1000, 5000, c->n_layers, -1, 64, &x, &err) == EG_ERR_INVALID);
    }
}

static void test_cleanup(void) {
    if (draft_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", draft_dir);
        CHECK(system(cmd) == 0);
    }
    if (have_model) eg_model_free(&model);
    have_model = 0;
}

/* forward_only (bench's prefill and decode rows): one forward on one backend, refused
 * with what an engine needs, and the timed rows run the steps they say. */
static void test_forward_only(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_runtime *rt = NULL;
    eg_runtime_opts o = base_opts();
    o.forward_only = 1;
    o.n_slots = 0;
    CHECK(eg_runtime_create(&o, &rt, &err) == EG_ERR_INVALID && !rt && strstr(err.msg, "forward_only"));
    o.n_slots = 4;
    o.stages = "2";
    CHECK(eg_runtime_create(&o, &rt, &err) == EG_ERR_INVALID && !rt);
    o.stages = NULL;
    o.draft_model = "no-such-drafter";
    CHECK(eg_runtime_create(&o, &rt, &err) == EG_ERR_INVALID && !rt);
    o.draft_model = NULL;
    o.kv_tokens = 4 * 48; /* less than 4 x max_seq_len: the caller maps what it needs */
    CHECK_OK(eg_runtime_create(&o, &rt, &err), &err);
    if (!rt) return;
    CHECK(eg_runtime_forward(rt) && eg_runtime_backend(rt));
    CHECK(eg_runtime_describe(rt)->kv_capacity == 4 * 48);
    CHECK(eg_runtime_run(rt, next_req, on_done, NULL, &err) == EG_ERR_INVALID);
    CHECK_OK(eg_runtime_bench_clear(rt, &err), &err);
    eg_bench_timing bt;
    CHECK_OK(eg_runtime_bench_prefill(rt, 3, 20, 16, &bt, &err), &err);
    CHECK(bt.steps == 4 && bt.tokens == 60 && bt.seconds >= 0);
    eg_sample_params sp = {.temperature = 0.0f, .top_p = 1.0f};
    CHECK_OK(eg_runtime_bench_decode(rt, 4, 30, 1, 3, &sp, &bt, &err), &err);
    CHECK(bt.steps == 3 && bt.tokens == 12);
    /* every block was given back: the same rows run again */
    CHECK_OK(eg_runtime_bench_decode(rt, 4, 30, 1, 3, &sp, &bt, &err), &err);
    CHECK(eg_runtime_bench_decode(rt, 5, 30, 1, 3, &sp, &bt, &err) == EG_ERR_INVALID);
    CHECK(eg_runtime_bench_decode(rt, 4, 60, 1, 3, &sp, &bt, &err) != EG_OK); /* past the pool */
    eg_runtime_free(rt);
    /* an engine runtime has no forward for the rows */
    eg_runtime_opts e = base_opts();
    CHECK_OK(eg_runtime_create(&e, &rt, &err), &err);
    CHECK(rt && !eg_runtime_forward(rt));
    CHECK(eg_runtime_bench_prefill(rt, 1, 4, 4, &bt, &err) == EG_ERR_INVALID && strstr(err.msg, "forward_only"));
    eg_runtime_free(rt);
}

/* --stages 2 --ep 2 on 4 planned GPUs: stage groups, one plan per stage (the GPU of each
 * rank's stage k holds that stage's share alone, so its cache per token is its layers'),
 * against each rank's one GPU holding both stages (stage threads off). Whole layers (the
 * split chosen for the pool: stage_balance). */
static void test_ep_groups_plan(void) {
    load_model();
    if (!have_model) return;
    notes nt[2];
    memset(nt, 0, sizeof nt);
    for (int groups = 0; groups < 2; groups++) {
        eg_runtime_opts o = planned_opts();
        o.stages = "2";
        o.ep = 2;
        o.gpus = 4;
        o.stage_threads = groups;
        o.whole_layers = 1;
        o.note = keep_note;
        o.note_ctx = &nt[groups];
        eg_runtime *rt = NULL;
        eg_error err = {0};
        eg_status st = eg_runtime_create(&o, &rt, &err);
        /* without 4 GPUs the backends cannot be made: the plan was made and noted first */
        CHECKF(st == EG_OK || strstr(err.msg, "cuda") || strstr(err.msg, "CUDA") || strstr(err.msg, "GPU"), "%s: %s",
               groups ? "stage groups" : "one GPU per rank", err.msg);
        if (!st) CHECK(eg_runtime_describe(rt)->ep_groups == groups);
        eg_runtime_free(rt);
    }
    int plans[2] = {0, 0};
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < nt[g].n; i++) plans[g] += !strncmp(nt[g].lines[i], "GPU ", 4);
    CHECKF(plans[0] == 1 && plans[1] == 2, "plan lines: %d one GPU per rank, %d stage groups", plans[0], plans[1]);
    if (plans[0] != 1 || plans[1] != 2) return;
    CHECKF(!strncmp(nt[1].lines[0], "GPU 0:", 6) && strstr(nt[1].lines[0], "(stage 0 of each rank: GPUs 0..1, one per rank)") &&
               !strncmp(nt[1].lines[1], "GPU 2:", 6) && strstr(nt[1].lines[1], "(stage 1 of each rank: GPUs 2..3, one per rank)"),
           "stage groups' plan lines: %s | %s", nt[1].lines[0], nt[1].lines[1]);
    CHECKF(strstr(nt[0].lines[0], "(shared by its stages)") != NULL, "one GPU per rank: %s", nt[0].lines[0]);
    /* a GPU holds one stage's layers (2 or 3 of 5): more tokens in the same memory */
    int64_t one = plan_tokens(&nt[0], 0), g0 = plan_tokens(&nt[1], 0), g1 = plan_tokens(&nt[1], 1);
    CHECKF(one > 0 && g0 > 3 * one / 2 && g1 > 3 * one / 2, "KV tokens: %lld on a rank's one GPU, %lld and %lld per stage GPU",
           (long long)one, (long long)g0, (long long)g1);
}

/* The common pool (the smallest stage's KV capacity in plan_cuda's notes) of a runtime over
 * 2 planned GPUs (2 * ep with ranks) with free bytes `free_b`: 0 when the runtime refused
 * the memory, -1 when no plan was noted; the split the runtime chose, if its note names
 * one, into split ("" otherwise). */
static int64_t planned_pool_of(const eg_model *mdl, const char *stages, int ep, eg_ep_split ep_split, int whole,
                                int64_t free_b, char *split, size_t split_n) {
    const int64_t G = (int64_t)1 << 30;
    eg_error err = {0};
    notes nt = {0};
    if (split) split[0] = 0;
    eg_runtime_opts o = base_opts();
    o.model = mdl;
    o.backend = "cuda";
    o.stages = stages;
    o.stage_threads = 1;
    o.whole_layers = whole;
    o.ep = ep;
    o.ep_split = ep_split;
    o.gpus = 2 * ep;
    o.gpu_mem_fraction = 0.5;
    o.plan_total_bytes = 2 * G; /* the budget: free_b - 1.5 GiB (the fraction, the headroom) */
    o.plan_free_bytes = free_b;
    o.note = keep_note;
    o.note_ctx = &nt;
    eg_runtime *rt = NULL;
    eg_status st = eg_runtime_create(&o, &rt, &err);
    eg_runtime_free(rt);
    /* (no GPU here: the plan is made, then the backends or the ranks' GPUs are refused) */
    if (st && !strstr(err.msg, "cuda") && !strstr(err.msg, "CUDA") && !strstr(err.msg, "GPUs found") &&
        !strstr(err.msg, "GPUs, one per rank and stage"))
        return 0; /* e.g. too little memory: no pool */
    int first = 0;
    if (nt.n > 0 && !strncmp(nt.lines[0], "stage split: --stages ", 22)) {
        if (split) {
            char fmt[32];
            snprintf(fmt, sizeof fmt, "%%%zu[0-9:,]", split_n - 1);
            sscanf(nt.lines[0] + 22, fmt, split);
            size_t sl = strlen(split);
            if (sl && split[sl - 1] == ',') split[sl - 1] = 0; /* the note's own comma */
        }
        first = 1;
    }
    int64_t pool = -1;
    for (int g = first; g < nt.n; g++) {
        int64_t t = plan_tokens(&nt, g);
        if (t >= 0 && (pool < 0 || t < pool)) pool = t;
    }
    return pool;
}

static int64_t planned_pool(const char *stages, int ep, eg_ep_split ep_split, int whole, int64_t free_b, char *split,
                             size_t split_n) {
    return planned_pool_of(&model, stages, ep, ep_split, whole, free_b, split, split_n);
}

/* --stages 2 on planned GPUs (as if on devices of given memory: no GPU needed, the plan
 * comes before any backend), one per stage, or with ep one per rank and stage (stage
 * groups); whole_layers keeps the byte-balanced split. Over a sweep of budgets the split generate chooses holds at least the pool of
 * the whole-layer split, sometimes more, by cutting a layer, and no less than any split
 * given by hand (with ep up to the rounding of a range's experts to the heaviest rank);
 * the split it names gives the one-stage results on the CPU backend. */
static void stage_balance_case(int ep, eg_ep_split ep_split) {
    eg_error err = {0};
    const int64_t G = (int64_t)1 << 30;
    int64_t tail = 0, head = eg_plan_head_bytes(&model, 2, &tail), layers = 0;
    for (int l = 0; l < model.cfg.n_layers; l++) layers += eg_plan_layer_bytes(&model, l);
    results ref = {0};
    eg_runtime_info info;
    eg_runtime_opts o = base_opts();
    CHECK_OK(run(&o, &ref, &info, &err), &err);
    int chose = 0, better = 0;
    double worst_ratio = 1;
    /* with ep the split balances 1/ep of each expert while a rank holds whole experts: at
       most one expert's bytes more on a stage than balanced, the cache of that many tokens
       of one layer */
    int64_t slack = 0;
    if (ep > 1)
        for (int l = 0; l < model.cfg.n_layers && !slack; l++) {
            eg_plan_layer_parts pp;
            eg_plan_layer_parts_of(&model, l, &pp);
            if (pp.n_experts) slack = (pp.expert + eg_plan_kv_bytes_per_token_layer(&model.cfg) - 1) /
                                      eg_plan_kv_bytes_per_token_layer(&model.cfg);
        }
    char chosen[128] = "";
    for (int step = 0; step <= 24; step++) {
        int64_t pool[2] = {0, 0};
        char split[128] = "";
        /* the budget for weights and cache: free - 1.5 GiB (the fraction, the 512 MiB headroom)
           less activations and scratch; swept over half to twice the layers */
        eg_backend_opts bo = {.name = "cuda", .max_tokens = o.max_tokens, .max_seq_len = o.max_seq_len,
                              .nthreads = o.threads};
        int64_t act = eg_forward_act_bytes(&model.cfg, o.max_tokens, o.max_tokens, NAUX), scratch = eg_cuda_scratch_bytes(&model.cfg, &bo);
        int64_t free_b = 3 * G / 2 + act + scratch + head + tail + layers / 2 + layers * step / 16;
        for (int whole = 0; whole < 2; whole++) {
            char sp[128];
            pool[whole] = planned_pool("2", ep, ep_split, whole, free_b, sp, sizeof sp);
            CHECKF(!whole || !sp[0], "whole_layers split layers: --stages %s", sp);
            if (!whole) snprintf(split, sizeof split, "%s", sp);
        }
        if (!pool[0] && !pool[1]) continue;
        CHECKF(pool[0] >= pool[1], "step %d: a pool of %lld tokens with the split, %lld with whole layers", step,
               (long long)pool[0], (long long)pool[1]);
        if (split[0]) { /* every two-stage split by hand: none holds more */
            int64_t best = -1;
            char best_s[32] = "";
            for (int end = 1; end < model.cfg.n_layers; end++)
                for (int cut = 0; cut < (model.layers[end - 1].is_moe ? model.cfg.n_experts : 1); cut++) {
                    char st2[32];
                    if (cut) snprintf(st2, sizeof st2, "%d:%d,%d", end, cut, model.cfg.n_layers);
                    else snprintf(st2, sizeof st2, "%d,%d", end, model.cfg.n_layers);
                    int64_t t = planned_pool(st2, ep, ep_split, 0, free_b, NULL, 0);
                    if (t > best) best = t, snprintf(best_s, sizeof best_s, "%s", st2);
                }
            CHECKF(best > 0, "step %d: no split by hand was planned", step);
            worst_ratio = best > 0 && (double)pool[0] / (double)best < worst_ratio ? (double)pool[0] / (double)best
                                                                                  : worst_ratio;
            CHECKF(pool[0] >= best - slack, "step %d: the chosen --stages %s holds %lld tokens, --stages %s %lld",
                   step, split, (long long)pool[0], best_s, (long long)best);
        }
        if (split[0]) {
            chose++;
            better += pool[0] > pool[1];
            snprintf(chosen, sizeof chosen, "%s", split);
        }
    }
    printf("    ep %d, split %d: %d of 25 budgets split layers, %d with a larger pool; last: --stages %s; the chosen pool "
           ">= %.4f x the best split by hand\n", ep, (int)ep_split, chose, better, chosen, worst_ratio);
    CHECKF(chose > 0 && better > 0, "no budget split layers for a larger pool (%d, %d)", chose, better);
    CHECKF(strchr(chosen, ':') != NULL, "the chosen split '%s' cuts no layer", chosen);
    if (chosen[0]) { /* the split it names, on the CPU backend: the one-stage results */
        results r = {0};
        o = base_opts();
        o.stages = chosen;
        o.stage_threads = 1;
        o.ep = ep;
        o.ep_split = ep_split;
        CHECK_OK(run(&o, &r, &info, &err), &err);
        CHECKF(same(&ref, &r, model.cfg.hidden), "--stages %s --ep %d: results differ from one stage", chosen, ep);
        free_results(&r);
    }
    free_results(&ref);
}

static void test_stage_balance(void) {
    load_model();
    if (!have_model) return;
    stage_balance_case(1, EG_EP_SPLIT_NONE);
    stage_balance_case(2, EG_EP_SPLIT_NONE);
    stage_balance_case(2, EG_EP_SPLIT_FFN);
    stage_balance_case(2, EG_EP_SPLIT_ALL);
    stage_balance_case(4, EG_EP_SPLIT_FFN);
    stage_balance_case(4, EG_EP_SPLIT_ALL);
}

/* Kimi-K2.5's real layer shapes (8 layers, written sparse: no data) in 2 stages of a
 * 4-rank group with the dense parts split: layer 0's dense MLP (0.79 GB) lives on rank 0
 * of stage 0 alone, so the split that balances the average rank leaves that rank short.
 * The split generate chooses holds, on its heaviest rank, no less than any split by hand
 * less one expert's worth of tokens (the rounding of a range's experts), over budgets
 * where the MLP is a large part of what is left. */
static void test_stage_balance_kimi(void) {
    char d[] = "/tmp/eg_rt_kimi_XXXXXX";
    CHECK(mkdtemp(d) != NULL);
    eg_error err = {0};
    eg_mkmodel_plan_info info;
    eg_mkmodel_opts mo = {.preset = "kimi-k2.5", .out_dir = d, .layers = 8, .sparse = 1};
    CHECK_OK(eg_mkmodel_run(&mo, &info, &err), &err);
    eg_model km;
    CHECK_OK(eg_model_load(d, &km, &err), &err);
    if (err.code) {
        eg_test_rm_dir(d);
        return;
    }
    const int64_t G = (int64_t)1 << 30;
    eg_plan_layer_parts pp;
    eg_plan_layer_parts_of(&km, 1, &pp);
    const int64_t kvb = eg_plan_kv_bytes_per_token_layer(&km.cfg);
    const eg_ep_split splits[2] = {EG_EP_SPLIT_FFN, EG_EP_SPLIT_ALL};
    double t0 = eg_now();
    for (int si = 0; si < 2; si++)
        for (int gb = 14; gb <= 18; gb += 4) {
            char sp[128] = "", best_s[32] = "";
            int64_t chosen = planned_pool_of(&km, "2", 4, splits[si], 0, gb * G, sp, sizeof sp), best = -1;
            for (int e = 1; e < km.cfg.n_layers; e++)
                for (int c = 0; c < (km.layers[e - 1].is_moe ? km.cfg.n_experts : 1); c++) {
                    char st2[32];
                    if (c) snprintf(st2, sizeof st2, "%d:%d,%d", e, c, km.cfg.n_layers);
                    else snprintf(st2, sizeof st2, "%d,%d", e, km.cfg.n_layers);
                    int64_t t = planned_pool_of(&km, st2, 4, splits[si], 0, gb * G, NULL, 0);
                    if (t > best) best = t, snprintf(best_s, sizeof best_s, "%s", st2);
                }
            /* the chosen split holds up to one expert more on a stage than balanced */
            int64_t slack = (pp.expert + kvb - 1) / kvb;
            printf("    kimi-k2.5 x 8 layers, ep 4, split %d, %lld GiB: --stages %s holds %lld tokens per rank, the best "
                   "by hand (--stages %s) %lld\n", (int)splits[si], (long long)gb, sp[0] ? sp : "(whole layers)",
                   (long long)chosen, best_s, (long long)best);
            CHECKF(best > 0 && chosen >= best - slack, "ep 4 split %d at %d GiB: --stages %s holds %lld, --stages %s %lld",
                   (int)splits[si], gb, sp, (long long)chosen, best_s, (long long)best);
        }
    printf("    (%.1f s)\n", eg_now() - t0);
    eg_model_free(&km);
    eg_test_rm_dir(d);
}

static const eg_test tests[] = {
    {"layouts_identical", test_layouts_identical},
    {"model_dir", test_model_dir},
    {"stop", test_stop},
    {"stop_idle_rank", test_stop_idle_rank},
    {"next_later", test_next_later},
    {"ep_host_budget", test_ep_host_budget},
    {"refusals", test_refusals},
    {"spec_layouts", test_spec_layouts},
    {"spec_plan", test_spec_plan},
    {"auto_logit_rows", test_auto_logit_rows},
    {"stage_split_tail", test_stage_split_tail},
    {"stage_balance", test_stage_balance},
    {"stage_balance_kimi", test_stage_balance_kimi},
    {"ep_groups_plan", test_ep_groups_plan},
    {"cleanup", test_cleanup},
    {"forward_only", test_forward_only},
    {"ep_error_context", test_ep_error_context},
};
EG_TEST_MAIN("engine_runtime", tests)
