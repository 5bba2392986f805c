/* runtime_bench.c — bench's timed prefill and decode rows (runtime_bench.h). */
#include "engine/runtime_bench.h"

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
