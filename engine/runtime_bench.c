/* runtime_bench.c — bench's timed prefill and decode rows (runtime_bench.h). */
#include "engine/runtime_bench.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_buf {
    int32_t *tok, *pos, *slot, *rows, *sampled;
    eg_sample_params *sp;
    uint64_t *rng;
} bench_buf;

static void buf_free(bench_buf *b) {
    free(b->tok); free(b->pos); free(b->slot); free(b->rows); free(b->sampled); free(b->sp); free(b->rng);
}

static eg_status buf_alloc(bench_buf *b, int n, eg_error *err) {
    memset(b, 0, sizeof *b);
    size_t k = (size_t)(n > 0 ? n : 1);
    b->tok = malloc(4 * k); b->pos = malloc(4 * k); b->slot = malloc(4 * k); b->rows = malloc(4 * k);
    b->sampled = malloc(4 * k); b->sp = calloc(k, sizeof *b->sp); b->rng = calloc(k, 8);
    if (b->tok && b->pos && b->slot && b->rows && b->sampled && b->sp && b->rng) return EG_OK;
    buf_free(b);
    return eg_fail(err, EG_ERR_NOMEM, "bench: out of memory for %d rows", n);
}

static eg_forward *fwd_of(eg_runtime *rt, eg_error *err) {
    eg_forward *f = eg_runtime_forward(rt);
    if (!f) eg_fail(err, EG_ERR_INVALID, "bench: the runtime was not made forward_only");
    return f;
}

eg_status eg_runtime_bench_clear(eg_runtime *rt, eg_error *err) {
    eg_forward *f = fwd_of(rt, err);
    if (!f) return EG_ERR_INVALID;
    eg_backend *be = eg_runtime_backend(rt);
    eg_kv_cache *kv = eg_forward_kv(f);
    size_t bytes = sizeof(uint16_t) * (size_t)kv->n_layers * (size_t)kv->n_blocks * (size_t)kv->block_size *
                   (size_t)kv->width;
    eg_status st = be->ops->memset0(be, kv->storage, bytes, err);
    return st ? st : be->ops->sync(be, err);
}

eg_status eg_runtime_bench_prefill(eg_runtime *rt, int n_seq, int plen, int chunk, eg_bench_timing *out,
                                   eg_error *err) {
    memset(out, 0, sizeof *out);
    eg_forward *f = fwd_of(rt, err);
    if (!f) return EG_ERR_INVALID;
    const eg_config *c = &eg_runtime_model(rt)->cfg;
    const eg_runtime_info *in = eg_runtime_describe(rt);
    if (n_seq < 1 || n_seq > in->n_slots || plen < 1 || chunk < 1 || chunk > in->max_tokens)
        return eg_fail(err, EG_ERR_INVALID, "bench prefill: %d sequences of %d in chunks of %d (the runtime has %d slots "
                       "and %d rows per step)", n_seq, plen, chunk, in->n_slots, in->max_tokens);
    bench_buf b;
    eg_status st = buf_alloc(&b, chunk, err);
    if (st) return st;
    eg_kv_cache *kv = eg_forward_kv(f);
    int reserved = 0;
    for (; reserved < n_seq && !st; reserved++) st = eg_kv_reserve(kv, reserved, plen, err);
    if (st) reserved--;
    int64_t total = (int64_t)n_seq * plen, done = 0;
    double t0 = eg_now();
    while (!st && done < total) {
        int T = 0, n_rows = 0;
        while (T < chunk && done < total) {
            int s = (int)(done / plen), p = (int)(done % plen);
            b.tok[T] = (int32_t)((s * 7919 + p * 104729) % c->vocab);
            b.pos[T] = p;
            b.slot[T] = s;
            if (p == plen - 1) b.rows[n_rows++] = T; /* logits for each prompt's last token */
            T++;
            done++;
        }
        eg_step step = {.T = T, .tokens = b.tok, .pos = b.pos, .slot = b.slot, .n_logits = n_rows,
                        .logit_rows = b.rows, .sampled = n_rows ? b.sampled : NULL, .sp = b.sp, .rng = b.rng};
        if (!(st = eg_forward_step(f, &step, err))) out->steps++;
    }
    out->seconds = eg_now() - t0;
    out->tokens = total;
    for (int s = 0; s < reserved; s++) eg_kv_release(kv, s);
    buf_free(&b);
    return st;
}

eg_status eg_runtime_bench_decode(eg_runtime *rt, int B, int ctx, int warmup, int steps, const eg_sample_params *sp,
                                  eg_bench_timing *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    eg_forward *f = fwd_of(rt, err);
    if (!f) return EG_ERR_INVALID;
    const eg_config *c = &eg_runtime_model(rt)->cfg;
    const eg_runtime_info *in = eg_runtime_describe(rt);
    if (B < 1 || B > in->n_slots || B > in->max_tokens || ctx < 0 || warmup < 0 || steps < 1)
        return eg_fail(err, EG_ERR_INVALID, "bench decode: batch %d at context %d, %d + %d steps (the runtime has %d "
                       "slots and %d rows per step)", B, ctx, warmup, steps, in->n_slots, in->max_tokens);
    bench_buf b;
    eg_status st = buf_alloc(&b, B, err);
    if (st) return st;
    eg_kv_cache *kv = eg_forward_kv(f);
    int reserved = 0;
    for (; reserved < B && !st; reserved++) st = eg_kv_reserve(kv, reserved, ctx + warmup + steps + 1, err);
    if (st) reserved--;
    for (int s = 0; s < B; s++) {
        b.tok[s] = (int32_t)((s * 131 + 7) % c->vocab);
        b.slot[s] = s;
        b.rows[s] = s;
        b.sp[s] = *sp;
        b.rng[s] = eg_rng_seed(1, (uint64_t)s);
    }
    double t0 = eg_now();
    for (int k = 0; k < warmup + steps && !st; k++) {
        if (k == warmup) t0 = eg_now();
        for (int s = 0; s < B; s++) b.pos[s] = ctx + k;
        eg_step step = {.T = B, .tokens = b.tok, .pos = b.pos, .slot = b.slot, .n_logits = B, .logit_rows = b.rows,
                        .sampled = b.sampled, .sp = b.sp, .rng = b.rng};
        if ((st = eg_forward_step(f, &step, err))) break;
        memcpy(b.tok, b.sampled, 4 * (size_t)B);
        if (k >= warmup) out->steps++;
    }
    out->seconds = eg_now() - t0;
    out->tokens = (int64_t)B * out->steps;
    for (int s = 0; s < reserved; s++) eg_kv_release(kv, s);
    buf_free(&b);
    return st;
}

/* Unit-scale deterministic values in [-0.5, 0.5) (the bench needs finite inputs, not
 * statistics). */
static void fill_unit(float *x, size_t n, uint64_t *r) {
    for (size_t i = 0; i < n; i++) x[i] = (float)eg_rng_uniform(r) - 0.5f;
}

enum { GQA_BUFS = 10 }; /* k cache, v cache, q, k, v, out, pos, slot, block table, inv_freq */

eg_status eg_runtime_bench_gqa(const eg_bench_gqa_opts *o, eg_bench_timing *out, double *bytes_per_call,
                               eg_error *err) {
    memset(out, 0, sizeof *out);
    *bytes_per_call = 0;
    const int NH = o->n_heads, NKV = o->n_kv_heads, HD = o->head_dim, B = o->batch, ctx = o->ctx;
    /* the block table holds int32 block indices: B x (ctx / 16 + 1) of them */
    if (NH < 1 || NKV < 1 || NH % NKV || HD < 2 || HD % 2 || (int64_t)NH * HD > 1 << 30 || B < 1 || ctx < 0 ||
        (int64_t)B * (ctx / 16 + 1) > INT32_MAX || o->warmup < 0 || o->steps < 1)
        return eg_fail(err, EG_ERR_INVALID, "bench draft attention: %d heads / %d kv heads of %d, batch %d at context "
                       "%d, %d + %d calls (heads a multiple of kv heads, an even head dim)", NH, NKV, HD, B, ctx,
                       o->warmup, o->steps);
    /* the drafter's layer as a one-layer model: rows as wide as its heads */
    eg_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model_type, sizeof c.model_type, "eagle3_drafter");
    c.hidden = NH * HD;
    c.n_layers = 1;
    c.n_heads = NH;
    c.inter = NH * HD;
    c.vocab = 2;
    c.rms_eps = 1e-6f;
    c.rope_theta = 10000.0;
    c.max_pos = ctx + 1;
    eg_backend_opts bo = {.name = o->backend, .max_tokens = B, .max_seq_len = ctx + 1, .nthreads = o->threads,
                          .device = o->device};
    eg_backend *be = NULL;
    eg_status st = eg_backend_create(&c, &bo, &be, err);
    if (st) return st;
    if (!be->ops->gqa_attention) {
        st = eg_fail(err, EG_ERR_UNSUPPORTED, "bench draft attention: the %s backend has no gqa_attention",
                     be->ops->name);
        eg_backend_free(be);
        return st;
    }
    enum { BS = 16 }; /* the drafter's default block size (the bound above) */
    const int MB = ctx / BS + 1; /* blocks for positions 0..ctx */
    const size_t row = (size_t)NKV * HD, cache = sizeof(uint16_t) * (size_t)B * MB * BS * row;
    const size_t nq = (size_t)B * NH * HD, nk = (size_t)B * row, nt = (size_t)B * MB;
    const size_t bytes[GQA_BUFS] = {cache, cache, 4 * nq, 4 * nk, 4 * nk, 4 * nq, 4 * (size_t)B, 4 * (size_t)B,
                                    4 * nt, 4 * (size_t)(HD / 2)};
    static const char *const what[GQA_BUFS] = {"k cache", "v cache", "q", "k", "v", "out", "pos", "slot",
                                               "block table", "rope frequencies"};
    void *dev[GQA_BUFS] = {0};
    float *hq = malloc(4 * nq), *hk = malloc(4 * nk), *hv = malloc(4 * nk), *inv = malloc(4 * (size_t)(HD / 2));
    int32_t *hpos = malloc(4 * (size_t)B), *hslot = malloc(4 * (size_t)B), *htab = malloc(4 * nt);
    const void *src[GQA_BUFS] = {NULL, NULL, hq, hk, hv, NULL, hpos, hslot, htab, inv};
    if (!hq || !hk || !hv || !inv || !hpos || !hslot || !htab)
        st = eg_fail(err, EG_ERR_NOMEM, "bench draft attention: out of host memory for %d rows", B);
    for (int i = 0; i < GQA_BUFS && !st; i++)
        if ((st = be->ops->alloc(be, bytes[i], &dev[i], err)))
            eg_wrap(err, "bench draft attention: %s of %.2f GB (%d rows at context %d)", what[i], bytes[i] / 1e9, B,
                    ctx);
    if (!st) {
        uint64_t r = eg_rng_seed(1, 0);
        fill_unit(hq, nq, &r), fill_unit(hk, nk, &r), fill_unit(hv, nk, &r);
        for (int i = 0; i < HD / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / HD);
        for (int s = 0; s < B; s++) {
            hpos[s] = ctx;
            hslot[s] = s;
            for (int j = 0; j < MB; j++) htab[(size_t)s * MB + j] = (int32_t)((int64_t)s * MB + j);
        }
        /* zeroed caches: device memory starts as garbage, possibly NaN patterns */
        st = be->ops->memset0(be, dev[0], cache, err);
        if (!st) st = be->ops->memset0(be, dev[1], cache, err);
        for (int i = 0; i < GQA_BUFS && !st; i++)
            if (src[i]) st = be->ops->to_device(be, dev[i], src[i], bytes[i], err);
        if (!st) st = be->ops->sync(be, err);
    }
    eg_gqa_args a = {.T = B, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .block_size = BS, .max_blocks = MB,
                     .n_blocks = (int64_t)nt, .max_pos = ctx + 1, .pos = dev[6], .slot = dev[7],
                     .block_table = dev[8], .q = dev[2], .k = dev[3], .v = dev[4], .k_cache = dev[0],
                     .v_cache = dev[1], .rope_inv_freq = dev[9], .softmax_scale = (float)(1.0 / sqrt((double)HD)),
                     .out = dev[5]};
    const int warmup = o->warmup, steps = o->steps;
    double t0 = eg_now();
    for (int k = 0; k < warmup + steps && !st; k++) {
        if (k == warmup) { /* the warmup calls finish outside the timed span */
            if ((st = be->ops->sync(be, err))) break;
            t0 = eg_now();
        }
        if (!(st = be->ops->gqa_attention(be, &a, err)) && k >= warmup) out->steps++;
    }
    if (!st) st = be->ops->sync(be, err);
    out->seconds = eg_now() - t0;
    out->tokens = (int64_t)B * out->steps;
    *bytes_per_call = 2.0 * sizeof(uint16_t) * (double)B * (ctx + 1) * (double)row;
    for (int i = 0; i < GQA_BUFS; i++)
        if (dev[i]) be->ops->release(be, dev[i]);
    eg_backend_free(be);
    free(hq), free(hk), free(hv), free(inv), free(hpos), free(hslot), free(htab);
    return st;
}
