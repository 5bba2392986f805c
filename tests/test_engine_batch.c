/* Batch engine tests on the fixture model tiny-a: results do not depend on batch
 * composition, chunk size, a pipeline split or KV preemption (bit-identical); stop
 * tokens, length limits, KV pressure and oversized requests behave; the block manager
 * uploads only changed table rows and moves a slot's blocks to the host and back
 * exactly; prefill and decode write the same cache bytes. */
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
    uint16_t *aux16[NREQ], *final16[NREQ]; /* capture_bf16 runs */
    float *final_pre[NREQ];                /* final_both runs */
    uint16_t *final_pre16[NREQ];
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
    CHECK(!r->aux != !r->aux_bf16 && !r->final != !r->final_bf16);
    if (r->aux) {
        o->aux[i] = malloc(4 * na);
        o->final[i] = malloc(4 * nf);
        memcpy(o->aux[i], r->aux, 4 * na);
        memcpy(o->final[i], r->final, 4 * nf);
    } else {
        o->aux16[i] = malloc(2 * na);
        o->final16[i] = malloc(2 * nf);
        memcpy(o->aux16[i], r->aux_bf16, 2 * na);
        memcpy(o->final16[i], r->final_bf16, 2 * nf);
    }
    CHECK(!r->final_pre || !r->final_pre_bf16);
    if (r->final_pre) {
        o->final_pre[i] = malloc(4 * nf);
        memcpy(o->final_pre[i], r->final_pre, 4 * nf);
    }
    if (r->final_pre_bf16) {
        o->final_pre16[i] = malloc(2 * nf);
        memcpy(o->final_pre16[i], r->final_pre_bf16, 2 * nf);
    }
    o->finish[i] = r->finish;
    o->n_gen[i] = r->n_generated;
    CHECK(r->prompt_len == prompt_len(i));
    CHECK(r->n_tokens == r->prompt_len + r->n_generated);
    return EG_OK;
}

static void free_results(results *r) {
    for (int i = 0; i < NREQ; i++) {
        free(r->tokens[i]); free(r->aux[i]); free(r->final[i]); free(r->aux16[i]); free(r->final16[i]);
        free(r->final_pre[i]); free(r->final_pre16[i]);
    }
    memset(r, 0, sizeof *r);
}

static eg_model model;
static int have_model;

static eg_engine_stats last_stats;
static const char *test_transport;      /* eg_engine_opts.transport for run_ex */
static const char *last_transport_name; /* what the engine chose */
/* KV scheduling options for run_ex (kv_policy, host_kv_bytes, kv_watermark,
 * capture_bf16); check_recompute is on in every run: a recomputed row that differs
 * from its first capture fails the run. */
static eg_engine_opts kv_opts;

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
                             .transport = test_transport, .kv_policy = kv_opts.kv_policy,
                             .host_kv_bytes = kv_opts.host_kv_bytes, .kv_watermark = kv_opts.kv_watermark,
                             .capture_bf16 = kv_opts.capture_bf16, .check_recompute = 1,
                             .final_pre_norm = kv_opts.final_pre_norm, .final_both = kv_opts.final_both};
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
    int64_t tail = 0, head = eg_plan_head_bytes(&model, 1, &tail);
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

/* ---- KV on demand ------------------------------------------------------------------ */

/* Host bytes of n cache blocks over all layers (block size 8, as run_ex uses). */
static int64_t kv_block_bytes(int64_t n) {
    return n * model.cfg.n_layers * 8 * (int64_t)(model.cfg.kv_lora_rank + model.cfg.qk_rope) * 2;
}

/* A swapped sequence comes back with room for its next step, not for its cache alone:
 * restored part-way through its prefill into a pool whose free blocks were over the
 * watermark but under its next chunk, it stalled, was parked again as the youngest and
 * came back the step after, its cache saved and loaded each step without progress (14
 * swaps here before, 5 now; an audit found it). Tokens equal the ample pool's. */
typedef struct { int next, n_done; int32_t *tok[5]; int n[5]; } thrash_ctx;
static const int thrash_len[5] = {85, 57, 32, 60, 16}, thrash_new[5] = {64, 97, 43, 75, 21};
static int thrash_next(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    thrash_ctx *c = vc;
    static int32_t buf[5][96];
    if (c->next >= 5) return 0;
    int r = c->next++;
    for (int i = 0; i < thrash_len[r]; i++) buf[r][i] = prompt_tok(r, i);
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)r;
    q->tokens = buf[r];
    q->n_tokens = thrash_len[r];
    q->max_new = thrash_new[r];
    q->sp = (eg_sample_params){.temperature = 0.8f, .top_p = 0.9f};
    q->rng = eg_rng_seed(42, (uint64_t)r);
    return 1;
}
static eg_status thrash_done(void *vc, const eg_result *r, eg_error *err) {
    (void)err;
    thrash_ctx *c = vc;
    c->tok[r->id] = malloc(4 * (size_t)r->n_tokens);
    if (c->tok[r->id]) memcpy(c->tok[r->id], r->tokens, 4 * (size_t)r->n_tokens);
    c->n[r->id] = r->n_tokens;
    c->n_done++;
    return EG_OK;
}
static void test_kv_restore_no_thrash(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    thrash_ctx c[2] = {{0}};
    eg_engine_stats st[2];
    int aux[3] = {-1, 1, 4};
    for (int pass = 0; pass < 2; pass++) {
        eg_backend *be = NULL;
        eg_engine *e = NULL;
        eg_backend_opts bo = {.name = "cpu", .max_tokens = 30, .max_seq_len = 256, .nthreads = 1};
        CHECK_OK(eg_backend_create(&model.cfg, &bo, &be, &err), &err);
        eg_engine_opts eo = {.n_slots = 4, .max_seq_len = 256, .max_tokens = 30, .block_size = 8,
                             .kv_blocks = pass ? 32 : 0, .aux_layers = aux, .n_aux = 3, .kv_policy = EG_KV_ON_DEMAND,
                             .host_kv_bytes = (int64_t)1 << 40, .check_recompute = 1};
        if (be) CHECK_OK(eg_engine_create(&model, be, &eo, &e, &err), &err);
        if (e) CHECK_OK(eg_engine_run(e, thrash_next, thrash_done, &c[pass], &err), &err);
        if (e) eg_engine_get_stats(e, &st[pass]);
        eg_engine_free(e);
        eg_backend_free(be);
    }
    CHECK(c[0].n_done == 5 && c[1].n_done == 5);
    for (int r = 0; r < 5; r++)
        CHECKF(c[0].n[r] == c[1].n[r] && c[0].tok[r] && c[1].tok[r] && !memcmp(c[0].tok[r], c[1].tok[r], 4 * (size_t)c[0].n[r]),
               "request %d differs from the ample pool's", r);
    CHECK(st[0].preemptions == 0);
    CHECKF(st[1].swap_outs > 0 && st[1].swap_outs <= 8, "%lld swaps (the thrash gave 14)", (long long)st[1].swap_outs);
    printf("    32 blocks of 8, chunk 30: %lld preemptions, %lld swaps\n", (long long)st[1].preemptions,
           (long long)st[1].swap_outs);
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < 5; r++) free(c[p].tok[r]);
}

/* A pool far too small for 4 slots forces many preemptions; whether victims are
 * swapped to the host, recomputed, or both, on one stage or several, threaded or not,
 * at any chunk size, every sample equals the ample-pool run bit for bit (tokens under
 * temperature sampling, so the RNG state survives too; captured rows; recomputed rows
 * are compared with their first capture as they arrive). */
static void test_kv_preempt_exact(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results base = {0}, b = {0};
    memset(&kv_opts, 0, sizeof kv_opts);
    kv_opts.kv_policy = EG_KV_RESERVE;
    CHECK_OK(run(4, 16, NULL, 0, -1, 40, 0.8f, -1, 0, &base, &err), &err);
    CHECK(last_stats.preemptions == 0);
    /* reserve on the pool the cases use: whole sequences fit one or two at a time */
    CHECK_OK(run(4, 16, NULL, 0, -1, 40, 0.8f, -1, 12, &b, &err), &err);
    for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &b, r, model.cfg.hidden), "reserve, 12 blocks: request %d differs", r);
    CHECK(last_stats.preemptions == 0);
    int64_t reserve_peak = last_stats.peak_concurrency;
    CHECKF(reserve_peak <= 2, "reserve on 12 blocks ran %lld sequences at once", (long long)reserve_peak);
    free_results(&b);
    int s2[2] = {2, 5}, s4[4] = {1, 2, 3, 5};
    /* the longest request is 39 + 40 = 79 tokens: 10 blocks of 8 */
    const struct {
        int64_t host_blocks; /* host budget in blocks; -1 = unlimited */
        int chunk, blocks;
        const int *stages;
        int n_stages, threaded;
    } cases[] = {
        {0, 16, 12, NULL, 0, 0},  {-1, 5, 12, NULL, 0, 0}, {12, 3, 12, NULL, 0, 0}, {12, 16, 13, s2, 2, 0},
        {12, 7, 12, s2, 2, 2},    {0, 16, 11, s4, 4, 4},   {-1, 9, 12, s4, 4, 4},
    };
    int64_t swaps = 0, recomputed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(&kv_opts, 0, sizeof kv_opts);
        kv_opts.host_kv_bytes = cases[c].host_blocks < 0 ? (int64_t)1 << 40 : kv_block_bytes(cases[c].host_blocks);
        CHECK_OK(run_ex(4, cases[c].chunk, cases[c].stages, cases[c].n_stages, cases[c].threaded, -1, 40, 0.8f, -1,
                        cases[c].blocks, &b, &err), &err);
        for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &b, r, model.cfg.hidden), "case %zu: request %d differs", c, r);
        CHECKF(last_stats.preemptions >= 3, "case %zu: only %lld preemptions", c, (long long)last_stats.preemptions);
        if (cases[c].host_blocks == 0) CHECK(last_stats.swap_outs == 0 && last_stats.recomputed_tokens > 0);
        if (cases[c].host_blocks < 0) CHECK(last_stats.swap_outs == last_stats.preemptions && last_stats.recomputed_tokens == 0);
        CHECK(last_stats.swap_ins == last_stats.swap_outs);
        /* threaded stages preempt with nothing in flight: the launch loop paused for it */
        if (cases[c].threaded) CHECKF(last_stats.drains > 0, "case %zu: no drain counted", c);
        CHECK(last_stats.host_kv_peak <= kv_opts.host_kv_bytes);
        /* a preempted sequence takes its buffers and leaves its slot a spare set: preempting
           allocates none beyond one set per slot (no malloc in the decode loop) */
        CHECKF(last_stats.buffer_sets >= 1 && last_stats.buffer_sets <= 4, "case %zu: %lld buffer sets for 4 slots", c,
               (long long)last_stats.buffer_sets);
        CHECKF(last_stats.peak_concurrency > reserve_peak, "case %zu: peak %d vs reserve %lld", c,
               last_stats.peak_concurrency, (long long)reserve_peak);
        if (cases[c].host_blocks > 0) {
            swaps += last_stats.swap_outs;
            recomputed += last_stats.recomputed_tokens;
        }
        free_results(&b);
    }
    CHECKF(swaps > 0 && recomputed > 0, "mixed budgets: %lld swaps, %lld recomputed rows", (long long)swaps,
           (long long)recomputed);
    /* a pool that fits only the longest sequence alone still finishes everything */
    memset(&kv_opts, 0, sizeof kv_opts);
    kv_opts.host_kv_bytes = kv_block_bytes(4);
    CHECK_OK(run(4, 16, NULL, 0, -1, 40, 0.8f, -1, 10, &b, &err), &err);
    for (int r = 0; r < NREQ; r++) CHECKF(same(&base, &b, r, model.cfg.hidden), "one-sequence pool: request %d differs", r);
    free_results(&b);
    CHECK_OK(run_ex(4, 16, s2, 2, 2, -1, 40, 0.8f, -1, 10, &b, &err), &err);
    for (int r = 0; r < NREQ; r++)
        CHECKF(same(&base, &b, r, model.cfg.hidden), "one-sequence pool, 2 threaded stages: request %d differs", r);
    free_results(&b);
    /* one block short of the longest request: refused when taken, not a hang */
    CHECK(run(4, 16, NULL, 0, -1, 40, 0.8f, -1, 9, &b, &err) == EG_ERR_NOMEM && strstr(err.msg, "even alone"));
    free_results(&b);
    /* the reserve policy refuses the same as on demand */
    kv_opts.kv_policy = EG_KV_RESERVE;
    CHECK(run(4, 16, NULL, 0, -1, 40, 0.8f, -1, 9, &b, &err) == EG_ERR_NOMEM);
    free_results(&b);
    memset(&kv_opts, 0, sizeof kv_opts);
    free_results(&base);
}

/* Captured rows kept as BF16 are exactly the F32 rows rounded as a shard rounds them. */
static void test_capture_bf16(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results a = {0}, b = {0};
    memset(&kv_opts, 0, sizeof kv_opts);
    CHECK_OK(run(3, 16, NULL, 0, -1, 8, 0.8f, -1, 0, &a, &err), &err);
    kv_opts.capture_bf16 = 1;
    kv_opts.host_kv_bytes = kv_block_bytes(3);
    CHECK_OK(run(3, 6, NULL, 0, -1, 8, 0.8f, -1, 7, &b, &err), &err); /* preempting too */
    CHECK(last_stats.preemptions > 0);
    size_t H = (size_t)model.cfg.hidden;
    for (int r = 0; r < NREQ; r++) {
        CHECK(a.n_tokens[r] == b.n_tokens[r] && !memcmp(a.tokens[r], b.tokens[r], 4 * (size_t)a.n_tokens[r]));
        CHECK(!a.aux16[r] && b.aux16[r] && !b.aux[r]);
        size_t nf = (size_t)a.n_tokens[r] * H, bad = 0;
        for (size_t k = 0; k < 3 * nf; k++) bad += b.aux16[r][k] != eg_f32_to_bf16(a.aux[r][k]);
        for (size_t k = 0; k < nf; k++) bad += b.final16[r][k] != eg_f32_to_bf16(a.final[r][k]);
        CHECKF(bad == 0, "request %d: %zu BF16 values differ from the rounded F32 rows", r, bad);
    }
    memset(&kv_opts, 0, sizeof kv_opts);
    free_results(&a);
    free_results(&b);
}

/* final_both: the post-norm state equals a default run's, the pre-norm one a
 * final_pre_norm run's, bit for bit; also split over stages, preempting (recomputed
 * rows are checked against their first capture), and as BF16. */
static void test_final_both(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    results post = {0}, pre = {0}, both = {0};
    memset(&kv_opts, 0, sizeof kv_opts);
    CHECK_OK(run(3, 16, NULL, 0, -1, 8, 0.8f, -1, 0, &post, &err), &err);
    kv_opts.final_pre_norm = 1;
    CHECK_OK(run(3, 16, NULL, 0, -1, 8, 0.8f, -1, 0, &pre, &err), &err);
    kv_opts.final_both = 1;
    CHECK(run(3, 16, NULL, 0, -1, 8, 0.8f, -1, 0, &both, &err) == EG_ERR_INVALID); /* both and pre-norm: refused */
    free_results(&both);
    kv_opts.final_pre_norm = 0;
    size_t H = (size_t)model.cfg.hidden;
    int s2[2] = {2, 5};
    for (int mode = 0; mode < 3; mode++) {
        if (mode == 1) kv_opts.host_kv_bytes = kv_block_bytes(3);
        if (mode == 2) kv_opts.capture_bf16 = 1;
        CHECK_OK(run(3, mode ? 6 : 16, mode == 0 ? s2 : NULL, mode == 0 ? 2 : 0, -1, 8, 0.8f, -1, mode ? 7 : 0, &both, &err),
                 &err);
        if (mode) CHECK(last_stats.preemptions > 0);
        for (int r = 0; r < NREQ; r++) {
            size_t nf = (size_t)post.n_tokens[r] * H, bad = 0, differ = 0;
            CHECK(both.n_tokens[r] == post.n_tokens[r] && !memcmp(both.tokens[r], post.tokens[r], 4 * (size_t)post.n_tokens[r]));
            if (mode < 2) {
                CHECK(both.final_pre[r] && !both.final_pre16[r]);
                if (!both.final_pre[r]) continue;
                bad = memcmp(both.final[r], post.final[r], 4 * nf) != 0;
                bad += memcmp(both.final_pre[r], pre.final[r], 4 * nf) != 0;
            } else {
                CHECK(both.final_pre16[r] && !both.final_pre[r]);
                if (!both.final_pre16[r]) continue;
                for (size_t k = 0; k < nf; k++) {
                    bad += both.final16[r][k] != eg_f32_to_bf16(post.final[r][k]);
                    bad += both.final_pre16[r][k] != eg_f32_to_bf16(pre.final[r][k]);
                }
            }
            for (size_t k = 0; k < nf; k++) differ += post.final[r][k] != pre.final[r][k];
            CHECKF(bad == 0, "mode %d request %d: %zu final values differ", mode, r, bad);
            CHECK(differ > nf / 2); /* the two states are not the same thing */
        }
        free_results(&both);
    }
    memset(&kv_opts, 0, sizeof kv_opts);
    free_results(&post);
    free_results(&pre);
}

/* The block table goes up row by row: only rows that changed, coalesced, and one
 * span when many scattered rows changed; the device copy equals the host table. */
static void test_kv_table_upload(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_backend *be = NULL;
    eg_kv_cache *kv = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 4, .max_seq_len = 40, .nthreads = 1};
    CHECK_OK(eg_backend_create(&model.cfg, &bo, &be, &err), &err);
    if (!be) return;
    CHECK_OK(eg_kv_create(be, 2, 8, 4, 64, 20, 40, &kv, &err), &err); /* MB = 10: 40 bytes a row */
    if (!kv) { eg_backend_free(be); return; }
    size_t row = 40, all = row * 20;
    CHECK_OK(eg_kv_sync_table(kv, &err), &err);
    CHECK(kv->upload_bytes == (int64_t)all && kv->upload_calls == 1);
    CHECK_OK(eg_kv_sync_table(kv, &err), &err); /* nothing changed: nothing sent */
    CHECK(kv->upload_bytes == (int64_t)all && kv->upload_calls == 1);
    CHECK_OK(eg_kv_reserve(kv, 3, 10, &err), &err);
    CHECK_OK(eg_kv_sync_table(kv, &err), &err);
    CHECK(kv->upload_bytes == (int64_t)(all + row) && kv->upload_calls == 2);
    CHECK(!memcmp(kv->table_dev, kv->table, all));
    CHECK_OK(eg_kv_reserve(kv, 1, 4, &err), &err);
    CHECK_OK(eg_kv_reserve(kv, 2, 4, &err), &err);
    CHECK_OK(eg_kv_reserve(kv, 7, 4, &err), &err);
    CHECK_OK(eg_kv_sync_table(kv, &err), &err); /* runs [1,3) and [7,8) */
    CHECK(kv->upload_bytes == (int64_t)(all + 4 * row) && kv->upload_calls == 4);
    CHECK(!memcmp(kv->table_dev, kv->table, all));
    int64_t b0 = kv->upload_bytes, c0 = kv->upload_calls;
    for (int r = 0; r < 20; r += 2) CHECK_OK(eg_kv_reserve(kv, r, 8, &err), &err); /* 10 scattered rows */
    CHECK_OK(eg_kv_sync_table(kv, &err), &err);
    CHECK(kv->upload_bytes == b0 + (int64_t)(19 * row) && kv->upload_calls == c0 + 1);
    eg_kv_release(kv, 3);
    CHECK_OK(eg_kv_sync_table(kv, &err), &err);
    CHECK(!memcmp(kv->table_dev, kv->table, all) && kv->table_dev[3 * 10] == -1);
    CHECK(eg_kv_slot_blocks(kv, 3) == 0 && eg_kv_slot_blocks(kv, 0) == 2);
    eg_kv_free(kv);
    eg_backend_free(be);
}

/* eg_kv_save/eg_kv_load move a slot's blocks to the host and back into other physical
 * blocks, exactly. */
static void test_kv_save_load(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_backend *be = NULL;
    eg_kv_cache *kv = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 4, .max_seq_len = 40, .nthreads = 1};
    CHECK_OK(eg_backend_create(&model.cfg, &bo, &be, &err), &err);
    if (!be) return;
    const int L = 3, W = 6, BS = 4;
    CHECK_OK(eg_kv_create(be, L, W, BS, 16, 3, 40, &kv, &err), &err);
    if (!kv) { eg_backend_free(be); return; }
    CHECK_OK(eg_kv_reserve(kv, 0, 11, &err), &err); /* 3 blocks */
    for (int l = 0; l < L; l++)
        for (int p = 0; p < 12; p++)
            for (int w = 0; w < W; w++) {
                int blk = kv->table[p / BS];
                kv->layers[l].data[((size_t)blk * BS + p % BS) * W + w] = (uint16_t)(l * 1000 + p * 10 + w);
            }
    uint16_t *host = malloc((size_t)eg_kv_save_bytes(kv, 3));
    CHECK(eg_kv_save_bytes(kv, 3) == (int64_t)L * 3 * BS * W * 2);
    CHECK_OK(eg_kv_save(kv, 0, 3, host, &err), &err);
    CHECK(host[((size_t)(1 * 3 + 2) * BS + 1) * W + 4] == 1000 + 9 * 10 + 4); /* layer 1, position 9, element 4 */
    CHECK(eg_kv_save(kv, 0, 4, host, &err) == EG_ERR_INVALID); /* more blocks than mapped */
    eg_kv_release(kv, 0);
    CHECK_OK(eg_kv_reserve(kv, 1, 5, &err), &err); /* takes the freed blocks first */
    CHECK_OK(eg_kv_reserve(kv, 2, 12, &err), &err);
    for (int l = 0; l < L; l++) /* slot 2's blocks start as garbage */
        for (int j = 0; j < 3; j++)
            memset(kv->layers[l].data + (size_t)kv->table[2 * kv->max_blocks + j] * BS * W, 0xa5, 2 * (size_t)BS * W);
    CHECK_OK(eg_kv_load(kv, 2, 3, host, &err), &err);
    int bad = 0;
    for (int l = 0; l < L; l++)
        for (int p = 0; p < 12; p++)
            for (int w = 0; w < W; w++) {
                int blk = kv->table[2 * kv->max_blocks + p / BS];
                bad += kv->layers[l].data[((size_t)blk * BS + p % BS) * W + w] != (uint16_t)(l * 1000 + p * 10 + w);
            }
    CHECK(bad == 0);
    free(host);
    eg_kv_free(kv);
    eg_backend_free(be);
}

/* A recompute replaces decode steps by a prefill: the cache bytes a prompt leaves
 * must not depend on how it was chunked (attention reads every latent, the chunk's own
 * included, back from the BF16 cache). Slot 0 takes 30 tokens in one step, slot 1 the
 * same tokens one per step, slot 2 in chunks of 7: every layer's cache rows agree. */
static void test_prefill_decode_cache_bytes(void) {
    load_model();
    if (!have_model) return;
    eg_error err = {0};
    eg_backend *be = NULL;
    eg_forward *f = NULL;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = 32, .max_seq_len = 64, .nthreads = 2};
    CHECK_OK(eg_backend_create(&model.cfg, &bo, &be, &err), &err);
    eg_forward_opts fo = {.max_tokens = 32, .n_slots = 3, .max_seq_len = 64, .block_size = 8};
    if (be) CHECK_OK(eg_forward_create(&model, be, &fo, &f, &err), &err);
    if (!f) { eg_backend_free(be); return; }
    eg_kv_cache *kv = eg_forward_kv(f);
    enum { N = 30 };
    int32_t tok[N], pos[N], slot[N];
    for (int i = 0; i < N; i++) tok[i] = prompt_tok(3, i);
    for (int s = 0; s < 3; s++) {
        CHECK_OK(eg_kv_reserve(kv, s, N, &err), &err);
        int step = s == 0 ? N : s == 1 ? 1 : 7;
        for (int p0 = 0; p0 < N; p0 += step) {
            int T = p0 + step <= N ? step : N - p0;
            for (int t = 0; t < T; t++) { pos[t] = p0 + t; slot[t] = s; }
            eg_step st = {.T = T, .tokens = tok + p0, .pos = pos, .slot = slot};
            CHECK_OK(eg_forward_step(f, &st, &err), &err);
        }
    }
    int bad = 0;
    size_t W = (size_t)kv->width;
    for (int l = 0; l < kv->n_layers; l++)
        for (int p = 0; p < N; p++) {
            const uint16_t *r0 = kv->layers[l].data + ((size_t)kv->table[0 * kv->max_blocks + p / 8] * 8 + p % 8) * W;
            for (int s = 1; s < 3; s++) {
                const uint16_t *rs = kv->layers[l].data + ((size_t)kv->table[s * kv->max_blocks + p / 8] * 8 + p % 8) * W;
                bad += memcmp(r0, rs, 2 * W) != 0;
            }
        }
    CHECKF(bad == 0, "%d cache rows differ between one prefill, decode steps and chunks of 7", bad);
    eg_forward_free(f);
    eg_backend_free(be);
}

/* The scheduling estimates `plan` and `generate --batch auto` use. */
static void test_plan_kv_estimates(void) {
    double med = 0, sig = 0;
    eg_error err = {0};
    CHECK_OK(eg_plan_workload_parse("lognormal:2000:1.0", &med, &sig, &err), &err);
    CHECK(med == 2000 && sig == 1.0);
    CHECK(eg_plan_workload_parse("lognormal:2000", &med, &sig, &err) == EG_ERR_INVALID);
    CHECK(eg_plan_workload_parse("normal:2000:1", &med, &sig, &err) == EG_ERR_INVALID);
    CHECK(eg_plan_workload_parse("lognormal:0:1", &med, &sig, &err) == EG_ERR_INVALID);
    CHECK(eg_plan_lognormal_mean_cut(500, 0, 1000) == 500 && eg_plan_lognormal_mean_cut(500, 0, 100) == 100);
    double uncut = 2000 * exp(0.5); /* the lognormal mean */
    CHECKF(fabs(eg_plan_lognormal_mean_cut(2000, 1.0, 1e12) - uncut) < 1e-3 * uncut, "%g vs %g",
           eg_plan_lognormal_mean_cut(2000, 1.0, 1e12), uncut);
    double cut = eg_plan_lognormal_mean_cut(2000, 1.0, 4096);
    CHECK(cut < uncut && cut > 2000 * 0.9 && cut < 4096);
    CHECK(eg_plan_concurrency_reserve(743450, 1024, 32768) == 22);
    CHECK(fabs(eg_plan_concurrency_on_demand(743450, 3000, 0.01) - 743450 * 0.99 / 3000) < 1e-9);
    /* auto slots: the pool at 256 tokens each, the row budget, half the RAM */
    CHECK(eg_plan_auto_slots(1024, 4096, 512, (int64_t)1 << 40, 1000) == 4);
    CHECK(eg_plan_auto_slots(1 << 20, 4096, 512, (int64_t)1 << 40, 1000) == 512);
    CHECK(eg_plan_auto_slots(1 << 20, 4096, 512, 20000, 1000) == 10);
    CHECK(eg_plan_auto_slots(10, 100, 512, 0, 1000) == 1);
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
    {"kv_preempt_exact", test_kv_preempt_exact},
    {"kv_restore_no_thrash", test_kv_restore_no_thrash},
    {"capture_bf16", test_capture_bf16},
    {"final_both", test_final_both},
    {"kv_table_upload", test_kv_table_upload},
    {"kv_save_load", test_kv_save_load},
    {"prefill_decode_cache_bytes", test_prefill_decode_cache_bytes},
    {"plan_kv_estimates", test_plan_kv_estimates},
    {"cleanup", test_cleanup},
};
EG_TEST_MAIN("engine_batch", tests)
