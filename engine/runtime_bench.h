/* runtime_bench.h — the timed rows of `eaglegen bench` (prefill, and decode at a context)
 * on a forward_only runtime (runtime.h), and the drafter-attention row on a backend of its
 * own: gen/cmd_bench.c parses and reports, these run.
 *
 * Decode at context N needs no prefill: each sequence's cache blocks for positions < N
 * are mapped (eg_kv_reserve) and read as zeros (eg_runtime_bench_clear zeroes the whole
 * cache once: device memory starts as garbage, possibly NaN patterns), and attention
 * reads them as it would a real prompt's. Prefill: n_seq sequences of plen synthetic
 * tokens in steps of at most `chunk` rows, logits (and a greedy sample) for each prompt's
 * last token. Each call maps the blocks it needs and gives them back.
 * Ownership: scratch is allocated per call (outside the timed loop) and freed.
 * Thread safety: one thread per runtime. */
#ifndef EG_RUNTIME_BENCH_H
#define EG_RUNTIME_BENCH_H

#include "engine/runtime.h"

typedef struct eg_bench_timing {
    double seconds;   /* the timed steps */
    int64_t steps;    /* timed forward steps */
    int64_t tokens;   /* rows they ran */
} eg_bench_timing;

/* Zero the whole cache of rt's forward (and wait for the backend). */
eg_status eg_runtime_bench_clear(eg_runtime *rt, eg_error *err);
/* n_seq sequences (slots 0..n_seq-1) of plen tokens, chunk rows per step. */
eg_status eg_runtime_bench_prefill(eg_runtime *rt, int n_seq, int plen, int chunk, eg_bench_timing *out,
                                   eg_error *err);
/* B sequences (slots 0..B-1) whose caches hold ctx positions: warmup untimed steps, then
 * `steps` timed ones of one token each, sampled on the backend with sp. */
eg_status eg_runtime_bench_decode(eg_runtime *rt, int B, int ctx, int warmup, int steps, const eg_sample_params *sp,
                                  eg_bench_timing *out, eg_error *err);

/* The EAGLE-3 drafter's attention alone (the backend's gqa_attention: the op the drafter's
 * layer runs per draft row), on a backend of its own sized for that shape, as the drafter
 * makes one: `batch` rows, one per slot, each at position ctx of its slot, so each reads
 * ctx + 1 cached positions of NKV x HD BF16 keys and values (zeroed caches in blocks of
 * 16, the drafter's default, a slot's blocks contiguous). warmup untimed calls, then
 * `steps` timed ones, then a sync. bytes_per_call: the cache bytes one call reads. The
 * backend and its buffers are made per call (outside the timed loop) and freed. */
typedef struct eg_bench_gqa_opts {
    const char *backend; /* "cpu" or "cuda" */
    int device, threads;
    int n_heads, n_kv_heads, head_dim;
    int batch, ctx, warmup, steps;
} eg_bench_gqa_opts;
eg_status eg_runtime_bench_gqa(const eg_bench_gqa_opts *o, eg_bench_timing *out, double *bytes_per_call,
                               eg_error *err);

#endif
