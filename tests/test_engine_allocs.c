/* "No malloc in the decode loop", measured: the test binary is linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc (Makefile), so every allocation the
 * engine, its backend, the stage transport, the expert-parallel exchange and the drafter
 * make from their own code comes through a counter here. The same requests run twice,
 * generating 4 and then 36 tokens each: a run's allocations may depend on its requests
 * (admission sizes a slot's buffers for prompt + max_new once, a sampled request's q rows
 * with a drafter) but not on its steps, so the two counts must be equal in every layout.
 * The requests are alike (one prompt length; all greedy, then all sampled): expert-
 * parallel ranks take requests least-loaded first, so which slot gets which request
 * depends on timing, and alike requests make the first admissions the same either way
 * (each slot's set sized once). The layouts: one engine, threaded stages, --ep 2,
 * --ep 2 with stages and --ep-split all, a drafter (verify steps), and a pool small
 * enough to preempt at 36 tokens: a recomputed sequence allocates nothing (its buffers
 * travel with it and its slot takes a spare set), a swapped one at most the host buffer
 * its cache goes to (kept for the next victim). Allocations inside libc, zstd or the CPU's thread pool internals that do not
 * come from our code are not seen (the wrap binds our objects' calls only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/mkmodel.h"
#include "engine/runtime.h"
#include "tests/check.h"

#define MODEL "../shared/fixtures/models/tiny-a"
#define NREQ 8

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);

static int counting;     /* atomic: count only inside eg_runtime_run */
static long long n_allocs; /* atomic */

static void count(void) {
    if (__atomic_load_n(&counting, __ATOMIC_RELAXED)) __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
}
void *__wrap_malloc(size_t n) { count(); return __real_malloc(n); }
void *__wrap_calloc(size_t k, size_t n) { count(); return __real_calloc(k, n); }
void *__wrap_realloc(void *p, size_t n) { count(); return __real_realloc(p, n); }

static const int aux_layers[3] = {-1, 1, 3};

typedef struct {
    int next, max_new, done;
    float temperature;
    int32_t buf[64];
    uint64_t tok_sum; /* the run did generate: a checksum of its tokens */
} ctx;

static int next_req(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    ctx *c = vc;
    if (c->next >= NREQ) return 0;
    int r = c->next++;
    int n = 12;
    for (int i = 0; i < n; i++) c->buf[i] = (int32_t)((r * 131 + i * 37 + 11) % 500);
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)r;
    q->tokens = c->buf;
    q->n_tokens = n;
    q->max_new = c->max_new; /* no stop ids: every request generates max_new tokens */
    q->sp.temperature = c->temperature;
    q->sp.top_p = 0.9f;
    q->rng = eg_rng_seed(3, (uint64_t)r);
    return 1;
}

static eg_status on_done(void *vc, const eg_result *r, eg_error *err) {
    (void)err;
    ctx *c = vc;
    c->done++;
    CHECK(r->n_generated == c->max_new);
    for (int i = 0; i < r->n_tokens; i++) c->tok_sum = c->tok_sum * 31 + (uint64_t)r->tokens[i];
    return EG_OK;
}

static eg_model model;
static int have_model;
static char draft_dir[64];

static void load_model(void) {
    if (have_model) return;
    eg_error err = {0};
    CHECK_OK(eg_model_load(MODEL, &model, &err), &err);
    have_model = err.code == EG_OK;
}

/* Allocations during one run of the requests at max_new; -1 when it failed. */
static long long run_counted(const eg_runtime_opts *o, int max_new, float temperature, eg_engine_stats *st) {
    eg_error err = {0};
    eg_runtime *rt = NULL;
    CHECK_OK(eg_runtime_create(o, &rt, &err), &err);
    if (!rt) return -1;
    ctx c = {.max_new = max_new, .temperature = temperature};
    __atomic_store_n(&n_allocs, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&counting, 1, __ATOMIC_RELAXED);
    eg_status s = eg_runtime_run(rt, next_req, on_done, &c, &err);
    __atomic_store_n(&counting, 0, __ATOMIC_RELAXED);
    CHECK_OK(s, &err);
    CHECK(c.done == NREQ && c.tok_sum != 0);
    eg_runtime_stats(rt, st);
    eg_runtime_free(rt);
    return s ? -1 : __atomic_load_n(&n_allocs, __ATOMIC_RELAXED);
}

static void test_decode_allocs(void) {
    load_model();
    if (!have_model) return;
    snprintf(draft_dir, sizeof draft_dir, "/tmp/eg_alloc_drafter_%d", (int)getpid());
    static const int daux[2] = {1, 3};
    eg_mkdrafter_opts mo = {.target_dir = MODEL, .out_dir = draft_dir, .seed = 5, .draft_vocab = 300, .n_aux = 2,
                            .aux_layers = daux};
    eg_error err = {0};
    CHECK_OK(eg_mkmodel_drafter(&mo, &err), &err);
    const struct {
        const char *name, *stages;
        int ep;
        eg_ep_split split;
        int draft, pool; /* pool: a 128-token one that preempts, 1 recomputing, 2 swapping */
    } v[] = {
        {"one engine", NULL, 0, 0, 0, 0},
        {"2 threaded stages", "2", 0, 0, 0, 0},
        {"--ep 2", NULL, 2, 0, 0, 0},
        {"--ep 2 --stages 2 --ep-split all", "2", 2, EG_EP_SPLIT_ALL, 0, 0},
        {"a drafter, K 3", NULL, 0, 0, 1, 0},
        {"--ep 2 with a drafter", NULL, 2, 0, 1, 0},
        {"preempting (recompute)", NULL, 0, 0, 0, 1},
        {"preempting (swap)", NULL, 0, 0, 0, 2},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        if (v[k].draft && err.code) continue;
        eg_runtime_opts o = {.model = &model, .backend = "cpu", .threads = 2, .n_slots = 4, .max_seq_len = 128,
                             .max_tokens = 16, .block_size = 8, .aux_layers = aux_layers, .n_aux = 3,
                             .ram_bytes = (int64_t)1 << 30, .stages = v[k].stages, .stage_threads = 1, .ep = v[k].ep,
                             .ep_split = v[k].split};
        if (v[k].pool) {
            o.kv_tokens = 128;
            o.host_kv_bytes = v[k].pool == 2 ? (int64_t)1 << 30 : 0;
        }
        if (v[k].draft) {
            o.draft_model = draft_dir;
            o.draft_tokens = 3;
        }
        for (int sampled = 0; sampled < 2; sampled++) {
            float t = sampled ? 0.8f : 0.0f;
            eg_engine_stats s4, s36;
            long long a4 = run_counted(&o, 4, t, &s4), a36 = run_counted(&o, 36, t, &s36);
            printf("    %-34s %s: %lld allocations at 4 tokens (%lld steps), %lld at 36 (%lld steps, %lld preemptions)\n",
                   v[k].name, sampled ? "sampled" : "greedy", a4, (long long)s4.steps, a36, (long long)s36.steps,
                   (long long)s36.preemptions);
            CHECK(a4 >= 0 && s36.steps > s4.steps + 20);
            /* a swap may allocate the host buffer its cache goes to (kept for the next victim,
               within the host budget): at most one per swap on one stage */
            long long allowed = v[k].pool == 2 ? s36.swap_outs : 0;
            CHECKF(a36 >= a4 && a36 - a4 <= allowed, "%s, %s: %lld allocations over %lld steps, %lld over %lld (%lld swaps)",
                   v[k].name, sampled ? "sampled" : "greedy", a4, (long long)s4.steps, a36, (long long)s36.steps,
                   (long long)s36.swap_outs);
            CHECK(v[k].pool ? s36.preemptions > 0 : s36.preemptions == 0);
            if (v[k].pool == 2) CHECK(s36.swap_outs > 0);
            if (v[k].draft) CHECK(s36.verify_steps > 0);
        }
    }
}

static void test_cleanup(void) {
    if (draft_dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", draft_dir);
        CHECK(system(cmd) == 0);
    }
    if (have_model) eg_model_free(&model);
}

static const eg_test tests[] = {
    {"decode_allocs", test_decode_allocs},
    {"cleanup", test_cleanup},
};

int main(int argc, char **argv) { return eg_test_main("engine_allocs", tests, sizeof tests / sizeof tests[0], argc, argv); }
