/* Batch engine tests on the fixture model tiny-a: results do not depend on batch
 * composition, chunk size or a pipeline split (bit-identical); stop tokens, length
 * limits, KV pressure and oversized requests behave. */
#include <math.h>
#include <stdlib.h>

#include <pthread.h>
#include <signal.h>

#include "common/eg_thread.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "engine/transport.h"
#include "tests/check.h"

#define MODEL "../shared/fixtures/models/tiny-a"
#define NREQ 5

typedef struct {
    int32_t *tokens[NREQ];
    int n_tokens[NREQ];
    float *aux[NREQ], *final[NREQ];
    eg_finish finish[NREQ];
    int n_gen[NREQ];
} results;

typedef struct {
    int next, only; /* only >= 0: submit just that request */
    int max_new;
    float temp;
    int32_t stop;
    results *out;
    int n_aux;
    int64_t H;
} run_ctx;

static int32_t prompt_tok(int r, int i) { return (int32_t)((r * 131 + i * 37 + 11) % 500); }
static int prompt_len(int r) { return 3 + r * 9; }

static int next_req(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    run_ctx *c = vc;
    static int32_t buf[NREQ][64];
    if (c->only >= 0) {
        if (c->next) return 0;
        c->next = 1;
    } else if (c->next >= NREQ) return 0;
    int r = c->only >= 0 ? c->only : c->next++;
    for (int i = 0; i < prompt_len(r); i++) buf[r][i] = prompt_tok(r, i);
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)r;
    q->tokens = buf[r];
    q->n_tokens = prompt_len(r);
    q->max_new = c->max_new;
    q->sp.temperature = c->temp;
    q->sp.top_p = 0.9f;
    q->rng = eg_rng_seed(42, (uint64_t)r);
    q->stop_ids = &c->stop;
    q->n_stop = c->stop >= 0;
    return 1;
}

static eg_status on_done(void *vc, const eg_result *r, eg_error *err) {
    (void)err;
    run_ctx *c = vc;
    int i = (int)r->id;
    results *o = c->out;
    o->n_tokens[i] = r->n_tokens;
    o->tokens[i] = malloc(4 * (size_t)r->n_tokens);
    memcpy(o->tokens[i], r->tokens, 4 * (size_t)r->n_tokens);
    size_t na = (size_t)r->n_tokens * (size_t)c->n_aux * (size_t)c->H, nf = (size_t)r->n_tokens * (size_t)c->H;
    o->aux[i] = malloc(4 * na);
    o->final[i] = malloc(4 * nf);
    memcpy(o->aux[i], r->aux, 4 * na);
    memcpy(o->final[i], r->final, 4 * nf);
    o->finish[i] = r->finish;
    o->n_gen[i] = r->n_generated;
    CHECK(r->prompt_len == prompt_len(i));
    CHECK(r->n_tokens == r->prompt_len + r->n_generated);
    return EG_OK;
}

static void free_results(results *r) {
    for (int i = 0; i < NREQ; i++) { free(r->tokens[i]); free(r->aux[i]); free(r->final[i]); }
    memset(r, 0, sizeof *r);
}

static eg_model model;
static int have_model;

static eg_engine_stats last_stats;
static const char *test_transport;      /* eg_engine_opts.transport for run_ex */
static const char *last_transport_name; /* what the engine chose */

/* threaded > 0: one backend per stage, stages on their own threads, `threaded`
 * micro-batches. */
static eg_status run_ex(int slots, int max_tokens, const int *stages, int n_stages, int threaded, int only, int max_new,
                        float temp, int32_t stop, int64_t kv_blocks, results *out, eg_error *err) {
    eg_backend *be = NULL, *sb[8] = {0};
    eg_engine *e = NULL;
    int aux[3] = {-1, 1, 4};
    eg_backend_opts bo = {.name = "cpu", .max_tokens = max_tokens, .max_seq_len = 128, .nthreads = threaded ? 1 : 2};
    eg_status st = eg_backend_create(&model.cfg, &bo, &be, err);
    for (int k = 0; k < n_stages && threaded && !st; k++) st = eg_backend_create(&model.cfg, &bo, &sb[k], err);
    if (!st) {
        eg_engine_opts eo = {.n_slots = slots, .max_seq_len = 128, .max_tokens = max_tokens, .block_size = 8,
                             .kv_blocks = kv_blocks, .aux_layers = aux, .n_aux = 3, .stage_ends = stages, .n_stages = n_stages,
                             .stage_backends = threaded ? sb : NULL, .micro_batches = threaded,
                             .transport = test_transport};
        st = eg_engine_create(&model, be, &eo, &e, err);
    }
    if (!st) {
        run_ctx c = {.only = only, .max_new = max_new, .temp = temp, .stop = stop, .out = out, .n_aux = 3, .H = model.cfg.hidden};
        st = eg_engine_run(e, next_req, on_done, &c, err);
        eg_engine_get_stats(e, &last_stats);
        last_transport_name = eg_engine_transport(e);
    }
    eg_engine_free(e);
    eg_backend_free(be);
    for (int k = 0; k < 8; k++) eg_backend_free(sb[k]);
    return st;
}

static eg_status run(int slots, int max_tokens, const int *stages, int n_stages, int only, int max_new, float temp,
                     int32_t stop, int64_t kv_blocks, results *out, eg_error *err) {
    return run_ex(slots, max_tokens, stages, n_stages, 0, only, max_new, temp, stop, kv_blocks, out, err);
}

static int same(const results *a, const results *b, int i, int64_t H) {
    if (a->n_tokens[i] != b->n_tokens[i]) return 0;
    size_t n = (size_t)a->n_tokens[i];
    return !memcmp(a->tokens[i], b->tokens[i], 4 * n) && !memcmp(a->aux[i], b->aux[i], 4 * n * 3 * (size_t)H) &&
           !memcmp(a->final[i], b->final[i], 4 * n * (size_t)H);
}

static void load_model(void) {
    if (have_model) return;
    eg_error err = {0};
    CHECK_OK(eg_model_load(MODEL, &model, &err), &err);
    have_model = err.code == EG_OK;
}

static void test_batch_independence(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results full = {0}, alone = {0};
    CHECK_OK(run(3, 16, NULL, 0, -1, 12, 1.0f, -1, 0, &full, &err), &err);
    for (int r = 0; r < NREQ; r++) {
        CHECK_OK(run(1, 7, NULL, 0, r, 12, 1.0f, -1, 0, &alone, &err), &err);
        CHECKF(same(&full, &alone, r, model.cfg.hidden), "request %d differs between batched and alone", r);
        CHECK(full.finish[r] == EG_FINISH_LENGTH && full.n_gen[r] == 12);
        free(alone.tokens[r]); free(alone.aux[r]); free(alone.final[r]);
        alone.tokens[r] = NULL; alone.aux[r] = NULL; alone.final[r] = NULL;
    }
    /* sampling at temperature 1 produced varied tokens (not a degenerate stream) */
    int distinct = 0;
    for (int i = prompt_len(4) + 1; i < full.n_tokens[4]; i++) distinct += full.tokens[4][i] != full.tokens[4][i - 1];
    CHECK(distinct > 3);
    free_results(&full);
}

static void test_pipeline_split_exact(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0}, split = {0};
    CHECK_OK(run(2, 10, NULL, 0, -1, 6, 0.7f, -1, 0, &base, &err), &err);
    int s2[2] = {2, 5}, s4[4] = {1, 2, 3, 5};
    CHECK_OK(run(2, 10, s2, 2, -1, 6, 0.7f, -1, 0, &split, &err), &err);
    for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &split, r, model.cfg.hidden), "2 stages: request %d differs", r);
    free_results(&split);
    CHECK_OK(run(2, 10, s4, 4, -1, 6, 0.7f, -1, 0, &split, &err), &err);
    for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &split, r, model.cfg.hidden), "4 stages: request %d differs", r);
    free_results(&split);
    int bad[2] = {3, 2};
    CHECK(run(2, 10, bad, 2, -1, 6, 0.7f, -1, 0, &split, &err) == EG_ERR_INVALID);
    free_results(&split);
    free_results(&base);
}

/* Stages on their own threads with micro-batches in flight: identical tensors, and the
 * scheduler really keeps at least N micro-batches in flight (counted). */
static void test_pipeline_threaded(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0}, split = {0};
    CHECK_OK(run(4, 10, NULL, 0, -1, 6, 0.7f, -1, 0, &base, &err), &err);
    int s2[2] = {2, 5}, s4[4] = {1, 2, 3, 5};
    CHECK_OK(run_ex(4, 10, s2, 2, 2, -1, 6, 0.7f, -1, 0, &split, &err), &err);
    for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &split, r, model.cfg.hidden), "threaded 2 stages: request %d differs", r);
    CHECKF(last_stats.max_in_flight >= 2, "max in flight %d", last_stats.max_in_flight);
    CHECK(last_stats.stage_steps[0] == last_stats.stage_steps[1] && last_stats.stage_steps[0] == last_stats.steps);
    free_results(&split);
    CHECK_OK(run_ex(5, 10, s4, 4, 5, -1, 6, 0.7f, -1, 0, &split, &err), &err);
    for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &split, r, model.cfg.hidden), "threaded 4 stages: request %d differs", r);
    CHECKF(last_stats.max_in_flight >= 4, "max in flight %d with 4 stages, 5 micro-batches", last_stats.max_in_flight);
    for (int k = 1; k < 4; k++) CHECK(last_stats.stage_steps[k] == last_stats.steps);
    free_results(&split);
    free_results(&base);
}

/* The transport interface: the local transport moves rows exactly and rejects bad
 * links; the factory picks local for CPU stages and refuses NCCL there; the engine
 * with an explicit local transport equals the unsplit run, and with nccl on CPU
 * backends it fails at create, saying why. */
static void test_transports(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_backend *b[3] = {0};
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 4, .max_seq_len = 16, .nthreads = 1};
    for (int k = 0; k < 3; k++) CHECK_OK(eg_backend_create(&model.cfg, &bo, &b[k], &err), &err);
    eg_transport *t = NULL;
    eg_transport_opts to = {.name = "local", .stages = b, .n_stages = 3, .n_micro_batches = 2, .max_floats = 64};
    CHECK_OK(eg_transport_create(&to, &t, &err), &err);
    if (t) {
        CHECK(!strcmp(eg_transport_name(t), "local"));
        float src[2][64], dst[2][64];
        for (int m = 0; m < 2; m++)
            for (int i = 0; i < 64; i++) { src[m][i] = (float)(m * 1000 + i) * 0.37f; dst[m][i] = -1; }
        /* two micro-batches in flight on link 1: each arrives intact, in any order */
        CHECK_OK(t->ops->send(t, 1, 0, src[0], 64, &err), &err);
        CHECK_OK(t->ops->send(t, 1, 1, src[1], 50, &err), &err);
        CHECK_OK(t->ops->recv(t, 1, 1, dst[1], 50, &err), &err);
        CHECK_OK(t->ops->recv(t, 1, 0, dst[0], 64, &err), &err);
        CHECK(!memcmp(dst[0], src[0], sizeof src[0]) && !memcmp(dst[1], src[1], 50 * sizeof(float)));
        CHECK(dst[1][50] == -1);
        CHECK(t->ops->send(t, 2, 0, src[0], 8, &err) == EG_ERR_INVALID); /* 3 stages: links 0, 1 */
        CHECK(t->ops->recv(t, 0, 2, dst[0], 8, &err) == EG_ERR_INVALID); /* 2 micro-batches */
        CHECK(t->ops->send(t, 0, 0, src[0], 65, &err) == EG_ERR_INVALID);
        CHECK(strstr(err.msg, "65 floats") != NULL);
    }
    eg_transport_free(t);
    eg_transport_free(NULL);
    t = NULL;
    to.name = "auto";
    CHECK_OK(eg_transport_create(&to, &t, &err), &err);
    CHECK(t && !strcmp(eg_transport_name(t), "local"));
    eg_transport_free(t);
    t = NULL;
    to.name = "carrier-pigeon";
    CHECK(eg_transport_create(&to, &t, &err) == EG_ERR_INVALID && !t);
    CHECK(strstr(err.msg, "carrier-pigeon") != NULL);
    to.name = "nccl";
    CHECK(eg_transport_create(&to, &t, &err) == EG_ERR_UNSUPPORTED && !t);
    CHECKF(strstr(err.msg, eg_transport_have_nccl() ? "not on a CUDA backend" : "without NCCL") != NULL, "%s", err.msg);
    to.name = "local";
    to.n_stages = 1;
    CHECK(eg_transport_create(&to, &t, &err) == EG_ERR_INVALID && !t);
    for (int k = 0; k < 3; k++) eg_backend_free(b[k]);

    results base = {0}, split = {0};
    CHECK_OK(run(4, 10, NULL, 0, -1, 6, 0.7f, -1, 0, &base, &err), &err);
    int s3[3] = {1, 3, 5};
    test_transport = "local";
    CHECK_OK(run_ex(4, 10, s3, 3, 3, -1, 6, 0.7f, -1, 0, &split, &err), &err);
    CHECK(last_transport_name && !strcmp(last_transport_name, "local"));
    for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &split, r, model.cfg.hidden), "local transport: request %d differs", r);
    free_results(&split);
    test_transport = "nccl";
    CHECK(run_ex(4, 10, s3, 3, 3, -1, 6, 0.7f, -1, 0, &split, &err) == EG_ERR_UNSUPPORTED);
    CHECKF(strstr(err.msg, "transport") != NULL, "%s", err.msg);
    test_transport = NULL;
    free_results(&split);
    free_results(&base);
}

/* Roofline accounting: at batch 1 exactly top-k experts per MoE layer are read, and the
 * bytes add up to the per-layer totals with the unread experts taken out; at a large
 * batch every expert is hit; the cache read is B * (ctx + 1) rows per layer. */
static void test_step_cost(void) {
    load_model();
    if (!have_model) return;
    const eg_config *c = &model.cfg;
    eg_step_cost one, big;
    eg_plan_decode_cost(&model, 0, c->n_layers, 1, 0, &one);
    double want = 0;
    for (int l = 0; l < c->n_layers; l++) {
        double lb = (double)eg_plan_layer_bytes(&model, l);
        if (model.layers[l].is_moe) {
            const eg_expert_w *x = &model.layers[l].experts[0];
            double eb = (double)(eg_weight_bytes(&x->gate) + eg_weight_bytes(&x->up) + eg_weight_bytes(&x->down));
            lb += (c->topk - c->n_experts) * eb;
        }
        want += lb;
    }
    int64_t tail = 0, head = eg_plan_head_bytes(&model, &tail);
    want += (double)tail + (double)head / c->vocab; /* one embedding row */
    CHECKF(fabs(one.weight_bytes - want) <= 1e-6 * want, "decode bytes %.1f, expected %.1f", one.weight_bytes, want);
    CHECK(fabs(one.experts_hit - c->topk) < 1e-9);
    CHECK(one.kv_bytes == (double)c->n_layers * (c->kv_lora_rank + c->qk_rope) * 2);
    eg_plan_decode_cost(&model, 0, c->n_layers, 4096, 100, &big);
    CHECK(fabs(big.experts_hit - c->n_experts) < 1e-6);
    CHECK(big.kv_bytes == 4096.0 * 101 * c->n_layers * (c->kv_lora_rank + c->qk_rope) * 2);
    CHECK(big.flops > 4096 * one.flops && big.expert_bytes > one.expert_bytes);
    /* a pipeline stage's share: the layers split exactly, the head counted once */
    eg_step_cost a, b;
    eg_plan_decode_cost(&model, 0, 2, 8, 50, &a);
    eg_plan_decode_cost(&model, 2, c->n_layers, 8, 50, &b);
    eg_plan_decode_cost(&model, 0, c->n_layers, 8, 50, &big);
    CHECK(fabs(a.weight_bytes + b.weight_bytes - big.weight_bytes) < 1e-6 * big.weight_bytes);
    CHECK(fabs(a.flops + b.flops - big.flops) < 1e-6 * big.flops);
    eg_plan_prefill_cost(&model, 0, c->n_layers, 2, 16, &a);
    CHECK(a.flops > 32 * one.flops * 0.5 && a.kv_bytes == 0);
}

/* Weights drawn by the backend (benchmarks of a preset): the counter-based values land
 * as stored, at the requested scale, INT4 nibbles in 1..15; a forward pass over them is
 * finite and repeatable. */
static void test_random_weights(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_backend *be = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 8, .max_seq_len = 32, .nthreads = 1};
    CHECK_OK(eg_backend_create(&model.cfg, &bo, &be, &err), &err);
    if (!be) return;
    eg_weight shape = {.fmt = EG_W_BF16, .rows = 64, .cols = 128, .name = "w"}, d;
    eg_weight_rand r = {.seed = 7, .mean = 0, .std = 0.125f};
    CHECK_OK(be->ops->weight_random(be, &shape, &r, &d, &err), &err);
    double s1 = 0, s2 = 0;
    int exact = 1;
    for (int i = 0; i < 64 * 128; i++) {
        float v = eg_bf16_to_f32(((const uint16_t *)d.data)[i]);
        exact &= v == eg_bf16_round(eg_weight_rand_value(&r, i));
        s1 += v;
        s2 += (double)v * v;
    }
    double mean = s1 / 8192, sd = sqrt(s2 / 8192 - mean * mean);
    CHECK(exact);
    CHECKF(fabs(mean) < 0.01 && fabs(sd - 0.125) < 0.01, "mean %g sd %g", mean, sd);
    be->ops->weight_release(be, &d);
    CHECK(!d.data && !d.owned);
    eg_weight q = {.fmt = EG_W_INT4, .rows = 16, .cols = 64, .group = 32, .name = "q"};
    CHECK_OK(be->ops->weight_random(be, &q, &r, &d, &err), &err);
    int nib_ok = 1, hist[16] = {0};
    for (int i = 0; i < 16 * 8; i++) {
        uint32_t w = ((const uint32_t *)d.data)[i];
        CHECK(w == eg_weight_rand_int4_word(&r, i));
        for (int j = 0; j < 8; j++) hist[(w >> (4 * j)) & 15]++;
    }
    nib_ok = hist[0] == 0;
    for (int v = 1; v < 16; v++) nib_ok &= hist[v] > 0;
    CHECK(nib_ok);
    for (int i = 0; i < 16 * 2; i++) {
        float sc = eg_bf16_to_f32(((const uint16_t *)d.scale)[i]);
        CHECK(sc >= 0.125f * 0.79f && sc <= 0.125f * 1.21f);
    }
    be->ops->weight_release(be, &d);
    eg_weight f8 = {.fmt = EG_W_FP8, .rows = 4, .cols = 4, .name = "f8"};
    CHECK(be->ops->weight_random(be, &f8, &r, &d, &err) == EG_ERR_UNSUPPORTED && strstr(err.msg, "f8"));

    float logits[2][2 * 1024];
    for (int run = 0; run < 2; run++) {
        eg_forward *f = NULL;
        eg_forward_opts fo = {.max_tokens = 8, .n_slots = 1, .max_seq_len = 32, .random_weights = 1, .random_seed = 3};
        CHECK_OK(eg_forward_create(&model, be, &fo, &f, &err), &err);
        if (!f) break;
        CHECK_OK(eg_kv_reserve(eg_forward_kv(f), 0, 8, &err), &err);
        int32_t tok[2] = {5, 9}, pos[2] = {0, 1}, slot[2] = {0, 0}, rows[2] = {0, 1};
        eg_step st = {.T = 2, .tokens = tok, .pos = pos, .slot = slot, .n_logits = 2, .logit_rows = rows,
                      .logits = logits[run]};
        CHECK(model.cfg.vocab <= 1024);
        CHECK_OK(eg_forward_step(f, &st, &err), &err);
        eg_forward_free(f);
    }
    int finite = 1;
    for (int i = 0; i < 2 * model.cfg.vocab; i++) finite &= isfinite(logits[0][i]);
    CHECK(finite);
    CHECK(!memcmp(logits[0], logits[1], sizeof(float) * 2 * (size_t)model.cfg.vocab));
    eg_backend_free(be);
}

static void test_stop_and_kv_pressure(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results a = {0}, b = {0};
    /* greedy, then stop on the 3rd generated token of request 2 */
    CHECK_OK(run(2, 16, NULL, 0, -1, 10, 0.0f, -1, 0, &a, &err), &err);
    int32_t stop = a.tokens[2][prompt_len(2) + 2];
    CHECK_OK(run(4, 16, NULL, 0, -1, 10, 0.0f, stop, 0, &b, &err), &err);
    int first = -1;
    for (int i = prompt_len(2); i < a.n_tokens[2]; i++)
        if (a.tokens[2][i] == stop) { first = i; break; }
    CHECK(b.finish[2] == EG_FINISH_STOP && b.n_tokens[2] == first + 1 && b.tokens[2][first] == stop);
    /* the stop token's own hidden state was captured: it equals the unstopped run's row */
    CHECK(!memcmp(b.final[2], a.final[2], 4 * (size_t)b.n_tokens[2] * (size_t)model.cfg.hidden));
    free_results(&b);
    /* a cache of 8 blocks (64 tokens) for 4 slots: requests wait for room, all finish */
    CHECK_OK(run(4, 16, NULL, 0, -1, 10, 0.0f, -1, 8, &b, &err), &err);
    for (int r = 0; r < NREQ; r++) CHECKF(same(&a, &b, r, model.cfg.hidden), "kv pressure: request %d differs", r);
    free_results(&b);
    /* a request larger than the whole cache is an error, not a hang */
    CHECK(run(2, 16, NULL, 0, -1, 10, 0.0f, -1, 4, &b, &err) == EG_ERR_NOMEM);
    free_results(&b);
    /* nonsense lengths are refused by name, not wrapped around */
    CHECK(run(2, 16, NULL, 0, 1, INT32_MAX, 0.0f, -1, 0, &b, &err) == EG_ERR_INVALID && strstr(err.msg, "exceed"));
    free_results(&b);
    CHECK(run(2, 16, NULL, 0, 1, -5, 0.0f, -1, 0, &b, &err) == EG_ERR_INVALID && strstr(err.msg, "negative"));
    free_results(&b);
    free_results(&a);
}

static void test_teacher_forced(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results a = {0}, b = {0};
    CHECK_OK(run(3, 16, NULL, 0, -1, 0, 0.0f, -1, 0, &a, &err), &err);
    CHECK_OK(run(2, 5, NULL, 0, -1, 0, 0.0f, -1, 0, &b, &err), &err);
    for (int r = 0; r < NREQ; r++) {
        CHECK(a.finish[r] == EG_FINISH_NONE && a.n_tokens[r] == prompt_len(r));
        CHECKF(same(&a, &b, r, model.cfg.hidden), "chunk size changed request %d", r);
    }
    free_results(&a);
    free_results(&b);
}

/* Threads the library starts block SIGINT/SIGTERM, so gen/'s handler runs on the main
 * thread (a handler on a stage or writer thread raced the main thread's teardown). */
static void *mask_probe(void *arg) {
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    *(int *)arg = sigismember(&cur, SIGINT) == 1 && sigismember(&cur, SIGTERM) == 1;
    return NULL;
}
static void test_thread_signals(void) {
    int blocked = 0;
    pthread_t th;
    CHECK(eg_thread_start(&th, mask_probe, &blocked) == 0);
    pthread_join(th, NULL);
    CHECK(blocked);
    sigset_t cur; /* the caller's own mask is left as it was */
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    CHECK(!sigismember(&cur, SIGINT));
}

static void test_cleanup(void) {
    if (have_model) eg_model_free(&model);
    have_model = 0;
    eg_model_free(NULL);
}

static const eg_test tests[] = {
    {"batch_independence", test_batch_independence},
    {"thread_signals", test_thread_signals},
    {"pipeline_split_exact", test_pipeline_split_exact},
    {"pipeline_threaded", test_pipeline_threaded},
    {"transport", test_transports},
    {"step_cost", test_step_cost},
    {"random_weights", test_random_weights},
    {"stop_and_kv_pressure", test_stop_and_kv_pressure},
    {"teacher_forced", test_teacher_forced},
    {"cleanup", test_cleanup},
};
EG_TEST_MAIN("engine_batch", tests)
