/* eaglegen bench — prefill and decode throughput of a backend, next to the roofline the
 * step's bytes and FLOPs allow. Performance is measured here (and in `make bench`),
 * never asserted in tests.
 *
 * With --preset the model's weights are never written or read: mkmodel lays out a
 * sparse checkpoint (shapes only, file holes) in --scratch, and every weight is drawn
 * by the backend itself (weight_random; on a GPU straight into device memory), so
 * Kimi-K2.5's real layer shapes cost no disk and no upload. Decode at context N needs
 * no prefill: each sequence's cache blocks for positions < N are mapped and zeroed,
 * and attention reads them as it would a real prompt's.
 *
 * Workload mode (--requests) measures the KV scheduler instead: N requests whose
 * response lengths are drawn from a distribution run through the batch engine on a
 * fixed pool, once per KV policy and --max-new value, and each row reports how many
 * sequences were in flight, how full the cache was, preemptions and swap traffic. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "engine/cuda_plan.h"
#include "engine/drafter_eagle3.h"
#include "engine/drafter_replay.h"
#include "engine/engine.h"
#include "engine/forward.h"
#include "engine/layout.h"
#include "engine/mkmodel.h"
#include "engine/plan.h"
#include "engine/runtime.h"
#include "engine/runtime_bench.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen bench (--model DIR | --preset NAME [--layers N]) [options]\n"
            "\n"
            "Prefill: sequences of --prompt-len tokens, --prefill-tokens in all, in chunks of --chunk\n"
            "rows. Decode: for each --context N and --batch B, B sequences whose caches hold N\n"
            "positions take --decode-steps steps of one token each (sampled on the backend)\n"
            "after --warmup untimed steps. Each row prints tokens/s and, against the device's\n"
            "measured copy bandwidth and BF16 GEMM rate, the share of the roofline reached: decode\n"
            "by the bytes a step must read (weights of the experts expected to be hit, attention and\n"
            "dense weights, lm_head, the KV cache), prefill by its FLOPs (docs/PERFORMANCE.md).\n"
            "\n"
            "options:\n"
            "  --model DIR        checkpoint directory (weights uploaded from it)\n"
            "  --preset NAME      instead of --model: a random model of this mkmodel preset (tiny,\n"
            "                     moonlight-16b, kimi-k2.5) drawn by the backend itself, in device\n"
            "                     memory on a GPU; only a sparse layout (no weight bytes) is written\n"
            "  --layers N         with --preset: layer count (kimi-k2.5 --layers 4: the real layer shapes)\n"
            "  --experts int4|bf16  with --preset: routed expert format (default int4)\n"
            "  --scratch DIR      with --preset: where the sparse layout goes (default /dev/shm when\n"
            "                     present, else /tmp); deleted afterwards\n"
            "  --backend NAME     cpu or cuda (default cpu)\n"
            "  --device N         cuda: GPU index (default 0)\n"
            "  --batch LIST       decode batch sizes, comma-separated (default 1,8)\n"
            "  --context LIST     decode context lengths (default 128)\n"
            "  --decode-steps N   timed decode steps per row (default 8)\n"
            "  --warmup N         untimed decode steps before them (default 2)\n"
            "  --prefill-tokens N prefill tokens in all, 0 = no prefill row (default 2048)\n"
            "  --prompt-len N     prefill sequence length (default 512)\n"
            "  --chunk N          prefill rows per step (default 512)\n"
            "  --no-roofline      do not measure the device (no bandwidth/FLOP columns)\n"
            "  --temperature F    decode sampling temperature (default 0: greedy)\n"
            "  --top-p F          decode top-p (default 1: off)\n"
            "  --top-k N          decode top-k (default 0: off)\n"
            "  --draft-attention NH:NKV:HD\n"
            "                     after each decode row, a draft-attn row: the backend's gqa_attention\n"
            "                     (an EAGLE-3 drafter's attention) alone for the batch's rows at that\n"
            "                     context, NH heads over NKV kv heads of HD, one row per sequence\n"
            "                     reading context + 1 BF16 keys and values; MB/step and GB/s are the\n"
            "                     cache bytes a call reads (the public Kimi-K2.5 drafters: 64:64:128)\n"
            "  --threads N        CPU threads (default: all cores, or $EG_THREADS)\n"
            "  -h, --help         this text\n"
            "\n"
            "\n"
            "workload mode (the KV scheduler; --requests selects it):\n"
            "  --requests N       N requests of --prompt-len random prompt tokens each\n"
            "  --workload lognormal:MEDIAN:SIGMA\n"
            "                     response lengths drawn per request (seeded), cut at --max-new; the\n"
            "                     request stops there (a bench-only stop; generate never does this)\n"
            "                     (default lognormal:1500:1.0)\n"
            "  --max-new LIST     max new tokens per request, one row per value (default 4096)\n"
            "  --kv-tokens N      the KV pool in tokens, the same for every row (required); must hold\n"
            "                     --prompt-len + the largest --max-new\n"
            "  --kv-policy P      on-demand, reserve or both (default both: a row each)\n"
            "  --batch N          slots at most (default 256)\n"
            "  --host-kv-gb F     host memory for preempted caches (default: a quarter of free RAM;\n"
            "                     with --ep the group's, split over the ranks)\n"
            "  --seed N           draws of lengths and prompts (default 1)\n"
            "  --json             one JSON object per row instead of the table\n"
            "  --ep E             every row on an expert-parallel group of E ranks (generate --ep:\n"
            "                     the routed experts split, each rank its own sequences and cache);\n"
            "                     --kv-tokens is then split over the ranks. The JSON rows add ep,\n"
            "                     ep_split and the exchange (exchange_pairs, exchange_bytes)\n"
            "  --ep-split S       with --ep: none (default), ffn or all, as generate --ep-split\n"
            "  --draft-model DIR  speculative decoding: every row runs without, then with this EAGLE-3\n"
            "                     drafter (the layouts generate --draft-model reads) on the same requests,\n"
            "                     and reports accepted drafts and the accept length A (tokens committed per\n"
            "                     verify step: accepted + 1), target passes (engine steps) and generated\n"
            "                     tokens per pass against the plain run, draft / verify time shares,\n"
            "                     generated tok/s with and without, whether greedy tokens are identical,\n"
            "                     and Kimi-K2.5's modelled decode tok/s on rtx-pro-6000x8 and h200x8 at\n"
            "                     that A (the layout model of eaglegen plan --draft-tokens K --accept A,\n"
            "                     with --draft-cache-bytes of Kimi-K2.5's latent for an MLA drafter)\n"
            "  --draft-tokens K   drafts per verify step (default 3; --chunk or --batch >= K + 1)\n"
            "  --replay-drafter RATE\n"
            "                     instead of --draft-model, for tests: an oracle that proposes the plain\n"
            "                     run's own greedy tokens, each right with probability RATE (0..1), else\n"
            "                     wrong; greedy only. Its A is set by RATE and says nothing about a drafter\n"
            "  --plan-mean-len N  mean sequence length of the modelled boxes (default 4096)\n"
            "  Columns: mean_concurrency and peak_concurrency (sequences in slots per step),\n"
            "  kv_utilisation (blocks holding cached tokens / pool, mean over steps), preemptions,\n"
            "  swap_bytes, recomputed_tokens, tokens_per_step (prompt, generated and recomputed tokens\n"
            "  per forward step: the rows of a step without a drafter; with one, the tokens committed,\n"
            "  not the K + 1 rows each verify holds); JSON also has\n"
            "  backlog_concurrency: the mean over steps launched while requests still waited for room\n"
            "  (the cache, not the end of the workload, bounded concurrency then).\n"
            "\n"
            "On CUDA a step shape seen twice is recorded as a CUDA graph and replayed (one launch\n"
            "per step); the default --warmup 2 keeps the recording out of the timed steps. The\n"
            "last line says how many shapes were recorded. Switches for before/after columns:\n"
            "EG_CUDA_GRAPHS=0, EG_CUDA_MOE=reg|simt, EG_CUDA_MLA=simt, EG_CUDA_FUSE=0, and for sampled\n"
            "decode EG_CUDA_SAMPLE=sort (docs/CUDA.md).\n");
}

typedef struct bench_opts {
    const char *backend;
    int device, threads, random;
    int batch[64], n_batch, ctx[64], n_ctx;
    int steps, warmup, prefill_tokens, plen, chunk;
    double copy_bps, gemm_fps; /* measured roofline; 0 = unknown */
    eg_sample_params sample;   /* decode rows' sampling (default greedy) */
    /* workload mode */
    int requests;              /* 0 = off */
    double wl_median, wl_sigma;
    int max_new[16], n_max_new;
    int64_t kv_tokens;
    int policies;              /* bit 0 on-demand, bit 1 reserve */
    int slots;
    int64_t host_kv_bytes;
    uint64_t seed;
    int json;
    /* speculative decoding (workload mode): each row runs without, then with the drafter */
    const char *draft_model;   /* an EAGLE-3 drafter directory; NULL = none */
    double replay_rate;        /* < 0 = off; else the replay proposer (drafter_replay.h) */
    int draft_tokens;          /* K */
    double plan_mean_len;      /* mean length the modelled boxes are planned at */
    int draft_mla;             /* the drafter is an MLA one: modelled with Kimi-K2.5's latent
                                  cache per token, not the MHA drafters' (set by check_drafter) */
    int ep;                    /* workload mode: expert-parallel ranks (generate --ep; 0/1 = none) */
    eg_ep_split ep_split;      /* with ep: generate --ep-split */
    int gqa[3];                /* --draft-attention NH, NKV, HD; gqa[0] == 0: no such rows */
} bench_opts;

static int imax(const int *v, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static void print_row(const bench_opts *o, const char *phase, int batch, int ctx, double tokens, double secs,
                      double steps, const eg_step_cost *c) {
    double tps = tokens / secs, ms = 1e3 * secs / steps;
    double gb = c->weight_bytes / steps + c->kv_bytes / steps; /* per step */
    double bw = (c->weight_bytes + c->kv_bytes) / secs, fl = c->flops / secs;
    printf("%-10s %6d %7d %11.1f %9.3f", phase, batch, ctx, tps, ms);
    if (gb > 0) printf(" %10.2f %8.1f", gb / 1e6, bw / 1e9);
    else printf(" %10s %8s", "-", "-"); /* prefill: bound by FLOPs, bytes not reported */
    if (o->copy_bps > 0 && gb > 0) printf(" %6.1f%%", 100.0 * bw / o->copy_bps);
    else printf(" %7s", "-");
    printf(" %9.2f", fl / 1e12);
    if (o->gemm_fps > 0) printf(" %6.1f%%", 100.0 * fl / o->gemm_fps);
    else printf(" %7s", "-");
    if (c->experts_hit >= 0) printf(" %8.1f\n", c->experts_hit);
    else printf(" %8s\n", "-"); /* a row without a MoE layer */
    fflush(stdout);
}

static eg_status run_bench(const eg_model *m, bench_opts *o, eg_error *err) {
    const eg_config *c = &m->cfg;
    int maxb = imax(o->batch, o->n_batch), maxctx = imax(o->ctx, o->n_ctx);
    int n_seq = o->prefill_tokens > 0 ? (o->prefill_tokens + o->plen - 1) / o->plen : 0;
    int max_tokens = o->chunk > maxb ? o->chunk : maxb;
    int dec_len = maxctx + o->warmup + o->steps + 1;
    int seq = dec_len > o->plen ? dec_len : o->plen;
    int slots = maxb > n_seq ? maxb : n_seq;
    /* cache for the largest row only: prefill and each decode row run alone */
    int64_t bs = 64, need = (int64_t)maxb * ((dec_len + bs - 1) / bs), pneed = (int64_t)n_seq * ((o->plen + bs - 1) / bs);
    eg_runtime *rt = NULL;
    eg_runtime_opts ro = {.model = m, .backend = o->backend, .threads = o->threads, .device = o->device,
                          .n_slots = slots, .max_seq_len = seq, .max_tokens = max_tokens, .block_size = (int)bs,
                          .kv_tokens = (need > pneed ? need : pneed) * bs, .forward_only = 1,
                          .random_weights = o->random, .random_seed = 1};
    double t0 = eg_now();
    eg_status st = eg_runtime_create(&ro, &rt, err);
    if (!st) st = eg_runtime_bench_clear(rt, err);
    if (st) goto out;
    eg_forward *f = eg_runtime_forward(rt);
    eg_backend *be = eg_runtime_backend(rt);
    eg_kv_cache *kv = eg_forward_kv(f);
    printf("weights %s in %.1f s: %.2f GB on the %s backend; KV cache %.2f GB (%lld tokens)\n",
           o->random ? "drawn" : "uploaded", eg_now() - t0, (double)eg_forward_weight_bytes(f) / 1e9, o->backend,
           (double)kv->n_blocks * bs * (double)eg_kv_bytes_per_token(kv) / 1e9, (long long)(kv->n_blocks * bs));
    printf("%-10s %6s %7s %11s %9s %10s %8s %7s %9s %7s %8s\n", "phase", "batch", "context", "tok/s", "ms/step",
           "MB/step", "GB/s", "%copy", "TFLOP/s", "%gemm", "experts");

    if (n_seq > 0) {
        eg_bench_timing bt;
        if ((st = eg_runtime_bench_prefill(rt, n_seq, o->plen, o->chunk, &bt, err))) goto out;
        eg_step_cost cost;
        eg_plan_prefill_cost(m, 0, c->n_layers, n_seq, o->plen, &cost);
        cost.kv_bytes = 0; /* weights once per step are not prefill's bound; report FLOPs */
        cost.weight_bytes = 0;
        print_row(o, "prefill", n_seq, o->plen, (double)bt.tokens, bt.seconds, (double)bt.steps, &cost);
    }

    for (int ci = 0; ci < o->n_ctx; ci++)
        for (int bi = 0; bi < o->n_batch; bi++) {
            int B = o->batch[bi], ctx = o->ctx[ci];
            eg_bench_timing bt;
            if ((st = eg_runtime_bench_decode(rt, B, ctx, o->warmup, o->steps, &o->sample, &bt, err))) goto out;
            eg_step_cost one, cost;
            memset(&cost, 0, sizeof cost);
            for (int k = 0; k < o->steps; k++) { /* the context grows by one per step */
                eg_plan_decode_cost(m, 0, c->n_layers, B, ctx + o->warmup + k, &one);
                cost.weight_bytes += one.weight_bytes;
                cost.kv_bytes += one.kv_bytes;
                cost.flops += one.flops;
                cost.experts_hit = one.experts_hit;
            }
            print_row(o, "decode", B, ctx, (double)bt.tokens, bt.seconds, (double)o->steps, &cost);
            if (o->gqa[0]) {
                double per_call;
                const int NH = o->gqa[0], HD = o->gqa[2];
                eg_bench_gqa_opts go = {.backend = o->backend, .device = o->device, .threads = o->threads,
                                        .n_heads = NH, .n_kv_heads = o->gqa[1], .head_dim = HD, .batch = B,
                                        .ctx = ctx, .warmup = o->warmup, .steps = o->steps};
                if ((st = eg_runtime_bench_gqa(&go, &bt, &per_call, err))) goto out;
                /* q.K and p.V: 2 FLOPs per multiply-add, HD of each per head and position */
                eg_step_cost ga = {.kv_bytes = per_call * (double)bt.steps,
                                   .flops = 4.0 * B * (ctx + 1.0) * NH * HD * (double)bt.steps, .experts_hit = -1};
                print_row(o, "draft-attn", B, ctx, (double)bt.tokens, bt.seconds, (double)bt.steps, &ga);
            }
        }
    {
        eg_forward_graph_stats gs;
        eg_runtime_graph_stats(rt, &gs);
        if (gs.recorded || gs.failed)
            printf("graphs: %lld step shapes recorded, %lld replays, %lld recordings fell back to op-by-op%s%s\n",
                   (long long)gs.recorded, (long long)gs.replays, (long long)gs.failed, gs.failed ? "; first: " : "",
                   gs.first_failure);
        else
            printf("graphs: none recorded (%s)\n", be->ops->graph_begin ? "switched off, or no step shape repeated"
                                                                         : "this backend has no graphs");
        if (o->sample.temperature > 0 && !strcmp(o->backend, "cuda"))
            printf("sampling: temperature %g, top-p %g, top-k %d; %lld rows sorted the vocabulary\n",
                   o->sample.temperature, o->sample.top_p, o->sample.top_k,
                   (long long)eg_cuda_sample_sorted_rows(be));
    }
out:
    eg_runtime_free(rt);
    return st;
}

/* ---- workload mode -------------------------------------------------------------------- */

typedef struct wl_ctx {
    const bench_opts *o;
    int vocab, max_new, next;
    const int *len;   /* [requests] drawn response lengths */
    int32_t *prompt;  /* [plen] */
    /* with a drafter: each request's tokens as finished (NULL = not kept) */
    int32_t *out;     /* [requests][plen + max_new] prompt + generated */
    int *n_out;       /* [requests] tokens in out (0 = not finished) */
    int64_t generated;
} wl_ctx;

static int wl_next(void *vc, eg_request *q, eg_error *err) {
    (void)err;
    wl_ctx *w = vc;
    if (w->next >= w->o->requests) return 0;
    int i = w->next++;
    uint64_t r = eg_rng_seed(w->o->seed ^ 0x9e3779b97f4a7c15ull, (uint64_t)i);
    for (int t = 0; t < w->o->plen; t++) w->prompt[t] = (int32_t)(eg_rng_uniform(&r) * w->vocab) % w->vocab;
    memset(q, 0, sizeof *q);
    q->id = (uint64_t)i;
    q->tokens = w->prompt;
    q->n_tokens = w->o->plen;
    q->max_new = w->max_new;
    q->stop_at = w->len[i] < w->max_new ? w->len[i] : w->max_new;
    q->sp = w->o->sample;
    q->rng = eg_rng_seed(w->o->seed, (uint64_t)i);
    return 1;
}

static eg_status wl_done(void *vc, const eg_result *res, eg_error *err) {
    wl_ctx *w = vc;
    w->generated += res->n_generated;
    if (!w->out) return EG_OK;
    size_t cap = (size_t)w->o->plen + (size_t)w->max_new;
    if (res->id >= (uint64_t)w->o->requests || (size_t)res->n_tokens > cap)
        return eg_fail(err, EG_ERR_INVALID, "bench: request %llu finished with %d tokens (at most %zu)",
                       (unsigned long long)res->id, res->n_tokens, cap);
    memcpy(w->out + res->id * cap, res->tokens, sizeof(int32_t) * (size_t)res->n_tokens);
    w->n_out[res->id] = res->n_tokens;
    return EG_OK;
}

/* Response length of request i: lognormal(log median, sigma), at least 1. */
static int wl_length(const bench_opts *o, int i) {
    uint64_t r = eg_rng_seed(o->seed, 0x5eed0000ull + (uint64_t)i);
    double u1 = eg_rng_uniform(&r), u2 = eg_rng_uniform(&r);
    double z = sqrt(-2.0 * log(u1 > 0 ? u1 : 1e-300)) * cos(2.0 * M_PI * u2);
    double x = o->wl_median * exp(o->wl_sigma * z);
    return x < 1 ? 1 : x > 1e9 ? 1000000000 : (int)(x + 0.5);
}

/* One workload run: a fresh runtime on the fixed pool (no memory plan: every row gets the
 * same one), with the drafter directory or proposer when given. */
typedef struct wl_result {
    eg_engine_stats es;
    double secs;
    int64_t generated; /* tokens generated over the requests (from done()) */
    int64_t ex_pairs, ex_bytes; /* with --ep: the group's exchange (eg_runtime_traffic) */
} wl_result;

static eg_status wl_run(const eg_model *m, const bench_opts *o, wl_ctx *w, int pol, const int *aux, int n_aux,
                        const char *draft_dir, eg_drafter *dr, wl_result *r, eg_error *err) {
    int max_tokens = o->chunk > o->slots ? o->chunk : o->slots;
    eg_runtime *rt = NULL;
    eg_runtime_opts ro = {.model = m, .backend = o->backend, .threads = o->threads, .device = o->device,
                          .n_slots = o->slots, .max_seq_len = o->plen + w->max_new, .max_tokens = max_tokens,
                          .block_size = 64, .kv_policy = pol ? EG_KV_RESERVE : EG_KV_ON_DEMAND,
                          .kv_tokens = o->kv_tokens, .host_kv_bytes = o->host_kv_bytes, .aux_layers = aux,
                          .n_aux = n_aux, .capture_bf16 = 1, .draft_model = draft_dir, .drafter = dr,
                          .draft_tokens = draft_dir || dr ? o->draft_tokens : 0, .ep = o->ep,
                          .ep_split = o->ep > 1 ? o->ep_split : EG_EP_SPLIT_NONE};
    w->next = 0;
    w->generated = 0;
    if (w->n_out) memset(w->n_out, 0, sizeof(int) * (size_t)o->requests);
    double t0 = eg_now();
    eg_status st = eg_runtime_create(&ro, &rt, err);
    if (!st) st = eg_runtime_run(rt, wl_next, wl_done, w, err);
    r->secs = eg_now() - t0;
    if (!st) eg_runtime_stats(rt, &r->es);
    if (!st) eg_runtime_traffic(rt, &r->ex_pairs, &r->ex_bytes);
    r->generated = w->generated;
    eg_runtime_free(rt);
    return st;
}

static void wl_print_row(const bench_opts *o, const char *name, const char *run, int M, double mean,
                         const wl_result *r) {
    const eg_engine_stats *es = &r->es;
    double steps = es->steps > 0 ? (double)es->steps : 1;
    double rows = (double)(es->prefill_tokens + es->decode_tokens + es->recomputed_tokens);
    if (o->json) {
        printf("{");
        if (run) printf("\"run\": \"%s\", ", run);
        printf("\"policy\": \"%s\", \"max_new\": %d, \"requests\": %d, \"kv_tokens\": %lld, "
               "\"prompt_len\": %d, \"workload\": \"lognormal:%g:%g\", \"mean_len\": %.1f, \"steps\": %lld, "
               "\"mean_concurrency\": %.3f, \"peak_concurrency\": %d, \"kv_utilisation\": %.4f, "
               "\"preemptions\": %lld, \"swap_bytes\": %lld, \"recomputed_tokens\": %lld, "
               "\"tokens_per_step\": %.3f, \"backlog_concurrency\": %.3f, \"backlog_steps\": %lld, "
               "\"decode_tokens\": %lld, \"seconds\": %.2f",
               name, M, o->requests, (long long)(o->kv_tokens / 64 * 64), o->plen, o->wl_median, o->wl_sigma, mean,
               (long long)es->steps, es->sum_concurrency / steps, es->peak_concurrency, es->sum_kv_live / steps,
               (long long)es->preemptions, (long long)es->swap_bytes, (long long)es->recomputed_tokens, rows / steps,
               es->backlog_steps ? es->backlog_concurrency / (double)es->backlog_steps : 0.0,
               (long long)es->backlog_steps, (long long)es->decode_tokens, r->secs);
        if (o->ep > 1)
            printf(", \"ep\": %d, \"ep_split\": \"%s\", \"exchange_pairs\": %lld, \"exchange_bytes\": %lld", o->ep,
                   o->ep_split == EG_EP_SPLIT_ALL ? "all" : o->ep_split == EG_EP_SPLIT_FFN ? "ffn" : "none",
                   (long long)r->ex_pairs, (long long)r->ex_bytes);
        if (!run) printf("}\n");
    } else {
        printf("%-9s %7d %8.0f %7lld %8.2f %9d %8.2f %4.0f%% %7lld %8.1f %10lld %11.2f %9.0f %8.1f\n", name, M, mean,
               (long long)es->steps, es->sum_concurrency / steps, es->peak_concurrency,
               es->backlog_steps ? es->backlog_concurrency / (double)es->backlog_steps : 0.0,
               100.0 * es->sum_kv_live / steps, (long long)es->preemptions, (double)es->swap_bytes / 1e6,
               (long long)es->recomputed_tokens, rows / steps, rows / r->secs, r->secs);
    }
}

/* Kimi-K2.5's decode on each preset box by the layout model (engine/layout.h), plain and
 * with K drafts per verify pass committing A tokens: the recommended runnable layout of
 * each. */
typedef struct box_model {
    char box[48], plain_layout[48], spec_layout[48];
    double plain_tok_s, spec_tok_s;
    double draft_cache;        /* the modelled drafter's cache per token (0: the layout model's default) */
} box_model;

/* The modelled drafter's cache per token on Kimi-K2.5: an MLA drafter's latent, else the
 * layout model's default (the public MHA drafters'). */
static double draft_cache_kimi(const eg_config *kimi, const bench_opts *o) {
    return o->draft_mla ? 2.0 * (kimi->kv_lora_rank + kimi->qk_rope) : 0.0;
}

static eg_status model_boxes(const bench_opts *o, double accept, box_model *out, int *n_out, eg_error *err) {
    static const char *const boxes[] = {"rtx-pro-6000x8", "h200x8"};
    *n_out = 0;
    eg_mkmodel_opts mo = {.preset = "kimi-k2.5"};
    char *json = NULL;
    eg_config cfg;
    eg_status st = eg_mkmodel_config_json(&mo, &json, err);
    if (st) return st;
    st = eg_config_parse(json, strlen(json), "kimi-k2.5", &cfg, err);
    free(json);
    if (st) return st;
    for (int b = 0; b < 2 && !st; b++) {
        eg_box box;
        if ((st = eg_box_preset(boxes[b], &box, err))) break;
        int max_rows = eg_layout_max_rows(box.gpus);
        eg_layout_row *rows = eg_calloc((size_t)max_rows, sizeof *rows, err);
        if (!rows) { st = EG_ERR_NOMEM; break; }
        box_model *bm = &out[b];
        memset(bm, 0, sizeof *bm);
        snprintf(bm->box, sizeof bm->box, "%s", box.name);
        bm->draft_cache = draft_cache_kimi(&cfg, o);
        for (int spec = 0; spec < 2 && !st; spec++) {
            eg_layout_opts lo = {.mean_len = o->plan_mean_len, .draft_tokens = spec ? o->draft_tokens : 0,
                                 .accept = spec ? accept : 0,
                                 .draft_cache_bytes = spec && o->draft_mla ? draft_cache_kimi(&cfg, o) : 0};
            int n = eg_layout_enumerate(&cfg, &box, &lo, rows, max_rows, err);
            if (n < 0) { st = EG_ERR_INVALID; break; }
            int best = eg_layout_recommend(rows, n, 0);
            if (best < 0) continue; /* nothing fits: left empty */
            snprintf(spec ? bm->spec_layout : bm->plain_layout, sizeof bm->box, "%s", rows[best].name);
            *(spec ? &bm->spec_tok_s : &bm->plain_tok_s) = rows[best].decode_tok_s;
        }
        free(rows);
        if (!st) *n_out = b + 1;
    }
    eg_config_free(&cfg);
    return st;
}

/* The speculative run against the plain one on the same workload: its row, then what the
 * drafter did (engine stats as they are: accepted drafts, committed tokens per verify
 * step = SGLang's accept length A, target passes = engine steps) and the modelled boxes. */
static eg_status wl_report_spec(const bench_opts *o, const char *name, int M, double mean, const wl_result *plain,
                                const wl_result *sp, int identical, int compared, eg_error *err) {
    const eg_engine_stats *es = &sp->es;
    double vs = es->verify_steps > 0 ? (double)es->verify_steps : 1;
    double acc = (double)es->accepted / vs, A = (double)es->spec_tokens / vs;
    double ds = es->draft_seconds + es->verify_seconds > 0 ? es->draft_seconds + es->verify_seconds : 1;
    double pp = plain->es.steps > 0 ? (double)plain->es.steps : 1, spp = es->steps > 0 ? (double)es->steps : 1;
    double gen_tps = (double)sp->generated / sp->secs, plain_tps = (double)plain->generated / plain->secs;
    box_model bm[2];
    int n_bm = 0;
    eg_status st = EG_OK;
    if (es->verify_steps > 0 && (st = model_boxes(o, A, bm, &n_bm, err))) return eg_wrap(err, "modelling the boxes"), st;
    char who[512];
    if (o->draft_model) snprintf(who, sizeof who, "%s", o->draft_model);
    else snprintf(who, sizeof who, "replay:%g", o->replay_rate);
    wl_print_row(o, o->json ? name : "+drafter", "speculative", M, mean, sp);
    if (o->json) {
        printf(", \"drafter\": \"%s\", \"draft_tokens\": %d, \"verify_steps\": %lld, \"drafted\": %lld, "
               "\"accepted\": %lld, \"spec_tokens\": %lld, \"mean_accepted\": %.4f, \"accept_length\": %.4f, "
               "\"generated\": %lld, \"target_passes\": %lld, \"plain_target_passes\": %lld, \"pass_ratio\": %.4f, "
               "\"tokens_per_pass\": %.4f, \"plain_tokens_per_pass\": %.4f, \"draft_seconds\": %.3f, "
               "\"verify_seconds\": %.3f, \"draft_share\": %.4f, \"verify_share\": %.4f, \"gen_tok_s\": %.1f, "
               "\"plain_gen_tok_s\": %.1f, \"speedup\": %.4f, \"logit_rows\": %lld, \"backend_probs\": %lld, "
               "\"backend_draws\": %lld, \"backend_residuals\": %lld, \"draft_kept\": %lld, \"draft_argmax\": %lld, "
               "\"draft_host_rows\": %lld, \"greedy_identical\": ",
               o->draft_model ? "eagle3" : "replay", o->draft_tokens, (long long)es->verify_steps,
               (long long)es->drafted, (long long)es->accepted, (long long)es->spec_tokens, acc, A,
               (long long)sp->generated, (long long)es->steps, (long long)plain->es.steps, spp / pp,
               (double)sp->generated / spp, (double)plain->generated / pp, es->draft_seconds, es->verify_seconds,
               es->draft_seconds / ds, es->verify_seconds / ds, gen_tps, plain_tps, gen_tps / plain_tps,
               (long long)es->logit_rows, (long long)es->backend_probs, (long long)es->backend_draws,
               (long long)es->backend_residuals, (long long)es->draft_kept, (long long)es->draft_argmax,
               (long long)es->draft_host_rows);
        if (compared) printf("%s", identical == compared ? "true" : "false");
        else printf("null");
        printf(", \"identical_requests\": %d, \"modelled_mean_len\": %.0f, \"modelled\": [", identical,
               o->plan_mean_len);
        for (int b = 0; b < n_bm; b++)
            printf("%s{\"box\": \"%s\", \"plain_layout\": \"%s\", \"plain_decode_tok_s\": %.1f, \"spec_layout\": \"%s\", "
                   "\"spec_decode_tok_s\": %.1f}", b ? ", " : "", bm[b].box, bm[b].plain_layout, bm[b].plain_tok_s,
                   bm[b].spec_layout, bm[b].spec_tok_s);
        printf("]}\n");
        fflush(stdout);
        return EG_OK;
    }
    printf("  speculative (%s, K %d): %lld verify steps, %lld drafted, %lld accepted: %.2f accepted drafts and "
           "accept length A %.2f (tokens committed) per verify step\n",
           who, o->draft_tokens, (long long)es->verify_steps, (long long)es->drafted, (long long)es->accepted, acc, A);
    printf("  target passes %lld -> %lld (%.2fx), generated tokens per pass %.2f -> %.2f; drafting %.1f s (%.1f%%), "
           "verify steps %.1f s (%.1f%%); %.0f -> %.0f generated tok/s (%.2fx)",
           (long long)plain->es.steps, (long long)es->steps, spp / pp, (double)plain->generated / pp,
           (double)sp->generated / spp, es->draft_seconds, 100 * es->draft_seconds / ds, es->verify_seconds,
           100 * es->verify_seconds / ds, plain_tps, gen_tps, gen_tps / plain_tps);
    if (compared) printf("; greedy tokens identical to the plain run: %d of %d requests", identical, compared);
    printf("\n  logits rows to the host for the rule and the draws: %lld; drafts' p from the backend: %lld; tokens "
           "drawn there: %lld; residuals from its kept sets: %lld; the drafter's draws from its backend's kept sets: "
           "%lld, by its argmax: %lld, from rows on the host: %lld\n",
           (long long)es->logit_rows, (long long)es->backend_probs, (long long)es->backend_draws,
           (long long)es->backend_residuals, (long long)es->draft_kept, (long long)es->draft_argmax,
           (long long)es->draft_host_rows);
    if (n_bm) {
        char dflag[64] = "";
        if (bm[0].draft_cache > 0) /* Kimi-K2.5's latent */
            snprintf(dflag, sizeof dflag, " --draft-cache-bytes %.0f", bm[0].draft_cache);
        printf("  modelled Kimi-K2.5 decode at mean length %.0f, K %d, A %.2f, %s drafter (eaglegen plan --preset "
               "kimi-k2.5 --box BOX --mean-len %.0f --draft-tokens %d --accept %.2f%s):",
               o->plan_mean_len, o->draft_tokens, A, o->draft_mla ? "an MLA" : "a 64-kv-head", o->plan_mean_len,
               o->draft_tokens, A, dflag);
        for (int b = 0; b < n_bm; b++)
            printf("%s %s %s %.0f -> %s %.0f tok/s (%.2fx)", b ? ";" : "", bm[b].box,
                   *bm[b].plain_layout ? bm[b].plain_layout : "(none fits)", bm[b].plain_tok_s,
                   *bm[b].spec_layout ? bm[b].spec_layout : "(none fits)", bm[b].spec_tok_s,
                   bm[b].plain_tok_s > 0 ? bm[b].spec_tok_s / bm[b].plain_tok_s : 0.0);
        printf("\n");
    }
    fflush(stdout);
    return EG_OK;
}

/* --draft-model's config.json against the model, before any row runs (the runtime loads
 * the drafter itself for each speculative row, as generate's does). */
static eg_status check_drafter(const char *dir, const eg_model *m, int *mla, eg_error *err) {
    eg_eagle3_config dc;
    eg_eagle3_opts eo = {0};
    eg_status st = eg_drafter_eagle3_read_config(dir, &m->cfg, &eo, &dc, err);
    *mla = dc.mla;
    eg_eagle3_config_free(&dc);
    return st ? eg_wrap(err, "--draft-model %s", dir), st : EG_OK;
}

static eg_status run_workload(const eg_model *m, bench_opts *o, eg_error *err) {
    const eg_config *c = &m->cfg;
    int spec = o->draft_model || o->replay_rate >= 0;
    int max_new = imax(o->max_new, o->n_max_new);
    size_t cap = (size_t)o->plen + (size_t)max_new;
    int *len = malloc(sizeof(int) * (size_t)o->requests);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)o->plen);
    int32_t *out[2] = {NULL, NULL};
    int *n_out[2] = {NULL, NULL};
    eg_status st = EG_OK;
    if (spec)
        for (int k = 0; k < 2; k++) {
            out[k] = malloc(sizeof(int32_t) * cap * (size_t)o->requests);
            n_out[k] = malloc(sizeof(int) * (size_t)o->requests);
            if (!out[k] || !n_out[k]) st = eg_fail(err, EG_ERR_NOMEM, "out of memory for %d requests' tokens", o->requests);
        }
    if (!len || !prompt) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    if (!st && o->draft_model) st = check_drafter(o->draft_model, m, &o->draft_mla, err);
    if (st) goto out;
    for (int i = 0; i < o->requests; i++) len[i] = wl_length(o, i);
    int aux[64], n_aux = eg_config_default_aux_layers(c, aux);
    if (!o->json)
        printf("%-9s %7s %8s %7s %8s %9s %8s %5s %7s %8s %9s %11s %9s %8s\n", "policy", "max_new", "mean_len", "steps",
               "mean_conc", "peak_conc", "backlog", "kv%", "preempt", "swap_MB", "recomputed", "tokens/step", "tok/s",
               "seconds");
    for (int mi = 0; mi < o->n_max_new && !st; mi++)
        for (int pol = 0; pol < 2 && !st; pol++) {
            if (!(o->policies & (1 << pol))) continue;
            int M = o->max_new[mi];
            double mean = 0;
            for (int i = 0; i < o->requests; i++) mean += len[i] < M ? len[i] : M;
            mean /= o->requests;
            const char *name = pol ? "reserve" : "on-demand";
            size_t rcap = (size_t)o->plen + (size_t)M;
            wl_ctx w = {.o = o, .vocab = c->vocab, .max_new = M, .len = len, .prompt = prompt, .out = out[0],
                        .n_out = n_out[0]};
            wl_result plain, sp;
            memset(&plain, 0, sizeof plain);
            memset(&sp, 0, sizeof sp);
            if ((st = wl_run(m, o, &w, pol, aux, n_aux, NULL, NULL, &plain, err))) break;
            wl_print_row(o, name, spec && o->json ? "plain" : NULL, M, mean, &plain);
            if (spec && o->json) printf("}\n");
            fflush(stdout);
            if (!spec) continue;
            eg_drafter *dr = NULL;
            if (o->replay_rate >= 0) { /* the oracle: the plain run's own tokens */
                st = eg_drafter_replay_create(c, o->slots, o->plen + M, o->replay_rate, &dr, err);
                for (int i = 0; i < o->requests && !st; i++)
                    st = eg_drafter_replay_add(dr, out[0] + (size_t)i * rcap, o->plen, n_out[0][i], err);
            }
            w.out = out[1];
            w.n_out = n_out[1];
            if (!st) st = wl_run(m, o, &w, pol, aux, n_aux, o->draft_model, dr, &sp, err);
            eg_drafter_free(dr);
            if (st) break;
            int identical = 0, compared = 0;
            if (o->sample.temperature == 0.0f)
                for (int i = 0; i < o->requests; i++, compared++)
                    identical += n_out[0][i] == n_out[1][i] &&
                                 !memcmp(out[0] + (size_t)i * rcap, out[1] + (size_t)i * rcap,
                                         sizeof(int32_t) * (size_t)n_out[0][i]);
            st = wl_report_spec(o, name, M, mean, &plain, &sp, identical, compared, err);
        }
out:
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(n_out[k]);
    }
    free(len);
    free(prompt);
    return st;
}

/* The CPU's copy bandwidth, bytes read + written per second (memcpy of 256 MiB; called
 * through a volatile pointer so the compiler cannot drop copies nobody reads). */
static void *(*volatile bench_memcpy)(void *, const void *, size_t) = memcpy;
static double cpu_copy_rate(void) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    double r = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        double t0 = eg_now();
        for (int i = 0; i < 4; i++) bench_memcpy(i % 2 ? a : b, i % 2 ? b : a, n);
        r = 2.0 * (double)n * 4 / (eg_now() - t0);
    }
    free(a);
    free(b);
    return r;
}

int cmd_bench(int argc, char **argv) {
    const char *model_dir = NULL, *batches = "1,8", *contexts = "128", *preset = NULL, *scratch = NULL;
    int layers = 0, experts = EG_MK_EXPERTS_INT4, roofline = 1;
    bench_opts o = {.backend = "cpu", .steps = 8, .warmup = 2, .prefill_tokens = 2048, .plen = 512, .chunk = 512,
                    .sample = {.temperature = 0.0f, .top_p = 1.0f, .top_k = 0}};
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"backend", required_argument, 0, 'b'},
        {"batch", required_argument, 0, 'B'},      {"prompt-len", required_argument, 0, 'p'},
        {"decode-steps", required_argument, 0, 's'}, {"chunk", required_argument, 0, 'c'},
        {"threads", required_argument, 0, 't'},    {"help", no_argument, 0, 'h'},
        {"preset", required_argument, 0, 'P'},     {"layers", required_argument, 0, 'L'},
        {"experts", required_argument, 0, 'E'},    {"scratch", required_argument, 0, 'S'},
        {"context", required_argument, 0, 'C'},    {"warmup", required_argument, 0, 'w'},
        {"prefill-tokens", required_argument, 0, 'T'}, {"device", required_argument, 0, 'd'},
        {"no-roofline", no_argument, 0, 'R'},      {"temperature", required_argument, 0, 'e'},
        {"top-p", required_argument, 0, 'p' + 256}, {"top-k", required_argument, 0, 'k'},
        {"requests", required_argument, 0, 'r'},   {"workload", required_argument, 0, 'W'},
        {"max-new", required_argument, 0, 'n'},    {"kv-tokens", required_argument, 0, 'K'},
        {"kv-policy", required_argument, 0, 'y'},  {"host-kv-gb", required_argument, 0, 'H'},
        {"seed", required_argument, 0, 'x'},       {"json", no_argument, 0, 'j'},
        {"draft-model", required_argument, 0, 0x100}, {"draft-tokens", required_argument, 0, 0x101},
        {"replay-drafter", required_argument, 0, 0x102}, {"plan-mean-len", required_argument, 0, 0x103},
        {"ep", required_argument, 0, 0x104},        {"ep-split", required_argument, 0, 0x105},
        {"draft-attention", required_argument, 0, 0x106}, {0, 0, 0, 0}};
    const char *workload = "lognormal:1500:1.0", *max_new = "4096";
    double host_gb = -1;
    int kv_tokens = 0, batch_given = 0, plan_mean_len = 4096, ep_split_given = 0;
    o.policies = 3;
    o.replay_rate = -1;
    o.seed = 1;
    optind = 1;
    int ch;
    /* the first option given of workload mode, and of --preset (reported if the mode is not on) */
    const char *workload_only = NULL, *preset_only = NULL;
    static const int workload_ch[] = {'W', 'n', 'K', 'y', 'H', 'x', 'j', 0x103};
    while ((ch = gen_getopt(argc, argv, "bench", "h", opts)) != -1) {
        for (const struct option *o2 = opts; ch > 0 && o2->name; o2++) {
            if (o2->val != ch) continue;
            for (size_t i = 0; i < sizeof workload_ch / sizeof workload_ch[0]; i++)
                if (ch == workload_ch[i] && !workload_only) workload_only = o2->name;
            if ((ch == 'L' || ch == 'E' || ch == 'S') && !preset_only) preset_only = o2->name;
        }
        switch (ch) {
        case 'm': model_dir = optarg; break;
        case 'b': o.backend = optarg; break;
        case 'B': batches = optarg; batch_given = 1; break;
        case 'r': if (!gen_arg_int("bench", "--requests", optarg, 1, 1 << 24, &o.requests)) return 2; break;
        case 'W': workload = optarg; break;
        case 'n': max_new = optarg; break;
        case 'K': if (!gen_arg_int("bench", "--kv-tokens", optarg, 64, 2000000000, &kv_tokens)) return 2; break;
        case 'H': if (!gen_arg_double("bench", "--host-kv-gb", optarg, 0, 1e9, &host_gb)) return 2; break;
        case 'j': o.json = 1; break;
        case 0x104: if (!gen_arg_int("bench", "--ep", optarg, 1, 4096, &o.ep)) return 2; break;
        case 0x105:
            if (!strcmp(optarg, "none")) o.ep_split = EG_EP_SPLIT_NONE;
            else if (!strcmp(optarg, "ffn")) o.ep_split = EG_EP_SPLIT_FFN;
            else if (!strcmp(optarg, "all")) o.ep_split = EG_EP_SPLIT_ALL;
            else {
                fprintf(stderr, "eaglegen bench: --ep-split expects none, ffn or all\n");
                return 2;
            }
            ep_split_given = 1;
            break;
        case 0x100: o.draft_model = optarg; break;
        case 0x106: {
            char tail;
            int *g = o.gqa;
            if (sscanf(optarg, "%d:%d:%d%c", &g[0], &g[1], &g[2], &tail) != 3 || g[0] < 1 || g[1] < 1 || g[2] < 2 ||
                g[0] > 1 << 16 || g[2] > 1 << 16 || g[0] % g[1] || g[2] % 2) {
                fprintf(stderr, "eaglegen bench: --draft-attention expects NH:NKV:HD (heads a multiple of kv heads, "
                                "an even head dim), not '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case 0x101: if (!gen_arg_int("bench", "--draft-tokens", optarg, 1, 64, &o.draft_tokens)) return 2; break;
        case 0x102: if (!gen_arg_double("bench", "--replay-drafter", optarg, 0, 1, &o.replay_rate)) return 2; break;
        case 0x103: if (!gen_arg_int("bench", "--plan-mean-len", optarg, 1, 1 << 24, &plan_mean_len)) return 2; break;
        case 'x': {
            int v;
            if (!gen_arg_int("bench", "--seed", optarg, 0, 2000000000, &v)) return 2;
            o.seed = (uint64_t)v;
            break;
        }
        case 'y':
            if (!strcmp(optarg, "on-demand")) o.policies = 1;
            else if (!strcmp(optarg, "reserve")) o.policies = 2;
            else if (!strcmp(optarg, "both")) o.policies = 3;
            else { fprintf(stderr, "eaglegen bench: --kv-policy expects on-demand, reserve or both\n"); return 2; }
            break;
        case 'C': contexts = optarg; break;
        case 'p': if (!gen_arg_int("bench", "--prompt-len", optarg, 1, 1 << 24, &o.plen)) return 2; break;
        case 's': if (!gen_arg_int("bench", "--decode-steps", optarg, 1, 1 << 24, &o.steps)) return 2; break;
        case 'w': if (!gen_arg_int("bench", "--warmup", optarg, 0, 1 << 20, &o.warmup)) return 2; break;
        case 'T': if (!gen_arg_int("bench", "--prefill-tokens", optarg, 0, 1 << 30, &o.prefill_tokens)) return 2; break;
        case 'c': if (!gen_arg_int("bench", "--chunk", optarg, 1, 1 << 20, &o.chunk)) return 2; break;
        case 't': if (!gen_arg_int("bench", "--threads", optarg, 1, 4096, &o.threads)) return 2; break;
        case 'd': if (!gen_arg_int("bench", "--device", optarg, 0, 4096, &o.device)) return 2; break;
        case 'P': preset = optarg; break;
        case 'L': if (!gen_arg_int("bench", "--layers", optarg, 1, 1 << 20, &layers)) return 2; break;
        case 'S': scratch = optarg; break;
        case 'R': roofline = 0; break;
        case 'e': {
            double v;
            if (!gen_arg_double("bench", "--temperature", optarg, 0, 100, &v)) return 2;
            o.sample.temperature = (float)v;
            break;
        }
        case 'p' + 256: {
            double v;
            if (!gen_arg_double("bench", "--top-p", optarg, 1e-9, 1, &v)) return 2;
            o.sample.top_p = (float)v;
            break;
        }
        case 'k': if (!gen_arg_int("bench", "--top-k", optarg, 0, 1 << 24, &o.sample.top_k)) return 2; break;
        case 'E':
            if (!strcmp(optarg, "int4")) experts = EG_MK_EXPERTS_INT4;
            else if (!strcmp(optarg, "bf16")) experts = EG_MK_EXPERTS_BF16;
            else { fprintf(stderr, "eaglegen bench: --experts expects int4 or bf16\n"); return 2; }
            break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why, in one line */
        }
    }
    if (optind < argc) { fprintf(stderr, "eaglegen bench: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!model_dir == !preset) {
        fprintf(stderr, "eaglegen bench: give one of --model or --preset\n");
        usage(stderr);
        return 2;
    }
    if (model_dir && preset_only) {
        fprintf(stderr, "eaglegen bench: --%s applies to --preset (a checkpoint's config says it)\n", preset_only);
        return 2;
    }
    if (!o.requests && workload_only) {
        fprintf(stderr, "eaglegen bench: --%s applies to workload mode (--requests N)\n", workload_only);
        return 2;
    }
    if (!gen_arg_int_list("bench", "--batch", batches, 1, o.batch, 64, &o.n_batch) ||
        !gen_arg_int_list("bench", "--context", contexts, 0, o.ctx, 64, &o.n_ctx))
        return 2;
    o.plan_mean_len = plan_mean_len;
    if (o.draft_model && o.replay_rate >= 0) {
        fprintf(stderr, "eaglegen bench: give --draft-model DIR or --replay-drafter RATE, not both\n");
        return 2;
    }
    int spec = o.draft_model || o.replay_rate >= 0;
    if (o.draft_tokens && !spec) {
        fprintf(stderr, "eaglegen bench: --draft-tokens needs --draft-model DIR (or --replay-drafter RATE)\n");
        return 2;
    }
    if (spec && !o.requests) {
        fprintf(stderr, "eaglegen bench: %s runs in workload mode (--requests N): the prefill and decode rows have no "
                        "prompts for a drafter to follow\n", o.draft_model ? "--draft-model" : "--replay-drafter");
        return 2;
    }
    if (o.replay_rate >= 0 && o.sample.temperature > 0) {
        fprintf(stderr, "eaglegen bench: --replay-drafter replays the greedy run's tokens; it needs --temperature 0\n");
        return 2;
    }
    if (spec && !o.draft_tokens) o.draft_tokens = 3;
    if (o.gqa[0] && o.requests) {
        fprintf(stderr, "eaglegen bench: --draft-attention adds rows to the decode rows, not to workload mode\n");
        return 2;
    }
    if ((o.ep > 1 || ep_split_given) && !o.requests) {
        fprintf(stderr, "eaglegen bench: --ep and --ep-split run in workload mode (--requests N): the prefill and "
                        "decode rows time one backend's forward\n");
        return 2;
    }
    if (ep_split_given && o.ep_split != EG_EP_SPLIT_NONE && o.ep < 2) {
        fprintf(stderr, "eaglegen bench: --ep-split needs an expert-parallel group (--ep E with E > 1)\n");
        return 2;
    }
    if (o.ep > 1 && o.replay_rate >= 0) {
        fprintf(stderr, "eaglegen bench: --replay-drafter drives one engine; with --ep give --draft-model DIR (a "
                        "drafter per rank)\n");
        return 2;
    }
    if (o.requests) {
        eg_error werr = {0};
        if (eg_plan_workload_parse(workload, &o.wl_median, &o.wl_sigma, &werr)) {
            fprintf(stderr, "eaglegen bench: --workload: %s\n", werr.msg);
            return 2;
        }
        if (!gen_arg_int_list("bench", "--max-new", max_new, 1, o.max_new, 16, &o.n_max_new)) return 2;
        if (!kv_tokens) {
            fprintf(stderr, "eaglegen bench: workload mode needs --kv-tokens (the pool every row shares)\n");
            return 2;
        }
        o.kv_tokens = kv_tokens;
        for (int i = 0; i < o.n_max_new; i++)
            if ((int64_t)o.plen + o.max_new[i] > o.kv_tokens / 64 * 64) {
                fprintf(stderr, "eaglegen bench: --kv-tokens %d cannot hold one request of --prompt-len %d + --max-new %d\n",
                        kv_tokens, o.plen, o.max_new[i]);
                return 2;
            }
        if (batch_given && o.n_batch > 1) {
            fprintf(stderr, "eaglegen bench: in workload mode --batch is one number (slots at most), got '%s'\n",
                    batches);
            return 2;
        }
        o.slots = batch_given ? o.batch[0] : 256;
        if (spec && (o.chunk > o.slots ? o.chunk : o.slots) < o.draft_tokens + 1) { /* the engine's rows per step */
            fprintf(stderr, "eaglegen bench: a step of max(--chunk %d, --batch %d) rows cannot hold a verify step of "
                    "--draft-tokens %d + 1 rows\n", o.chunk, o.slots, o.draft_tokens);
            return 2;
        }
        int64_t avail = gen_mem_available_bytes();
        o.host_kv_bytes = host_gb >= 0 ? (int64_t)(host_gb * 1e9) : avail / 4;
        roofline = 0;
    }
    if (strcmp(o.backend, "cpu") && strcmp(o.backend, "cuda")) {
        fprintf(stderr, "eaglegen bench: --backend expects cpu or cuda, not '%s'\n", o.backend);
        return 2;
    }
    eg_error err = {0};
    eg_model m;
    memset(&m, 0, sizeof m);
    char drawn[4096] = "";
    if (preset) {
        struct stat sb;
        if (!scratch) scratch = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
        snprintf(drawn, sizeof drawn, "%s/eaglegen-bench-XXXXXX", scratch);
        if (!mkdtemp(drawn)) {
            fprintf(stderr, "eaglegen bench: cannot create a directory in %s: %s\n", scratch, strerror(errno));
            return 1;
        }
        eg_mkmodel_opts mo = {.preset = preset, .out_dir = drawn, .seed = 1, .layers = layers, .experts = experts,
                              .threads = o.threads, .sparse = 1};
        eg_mkmodel_plan_info info;
        if (eg_mkmodel_run(&mo, &info, &err)) {
            fprintf(stderr, "eaglegen bench: laying out the %s model: %s\n", preset, err.msg);
            eg_rm_flat_dir(drawn);
            return 1;
        }
        model_dir = drawn;
        o.random = 1;
    }
    if (eg_model_load(model_dir, &m, &err)) {
        fprintf(stderr, "eaglegen bench: %s\n", err.msg);
        if (*drawn) eg_rm_flat_dir(drawn);
        return 1;
    }
    printf("model %s: %d layers, hidden %d, %d experts top-%d, weights %.2f GB%s\n", preset ? preset : model_dir,
           m.cfg.n_layers, m.cfg.hidden, m.cfg.n_experts, m.cfg.topk, (double)m.weight_bytes / 1e9,
           preset ? " (drawn on the backend)" : "");
    if (roofline) {
        if (!strcmp(o.backend, "cuda")) {
            if (eg_cuda_measure(o.device, &o.copy_bps, &o.gemm_fps, &err))
                fprintf(stderr, "eaglegen bench: measuring GPU %d: %s (no roofline columns)\n", o.device, err.msg);
            else
                printf("GPU %d measured: copy %.0f GB/s (read + write), BF16 GEMM %.1f TFLOP/s (cuBLAS 8192^3)\n",
                       o.device, o.copy_bps / 1e9, o.gemm_fps / 1e12);
        } else {
            o.copy_bps = cpu_copy_rate();
            printf("CPU measured: copy %.1f GB/s (read + write, memcpy); no GEMM reference\n", o.copy_bps / 1e9);
        }
    }
    int rc = 0;
    if (o.requests) {
        if (!o.json)
            printf("workload: %d requests, prompt %d tokens, responses lognormal median %g sigma %g; KV pool %lld tokens, "
                   "%d slots at most\n", o.requests, o.plen, o.wl_median, o.wl_sigma, (long long)(o.kv_tokens / 64 * 64),
                   o.slots);
        if (!o.json && o.ep > 1)
            printf("expert parallel: %d ranks (--ep-split %s), the pool and the slots split over them\n", o.ep,
                   o.ep_split == EG_EP_SPLIT_ALL ? "all" : o.ep_split == EG_EP_SPLIT_FFN ? "ffn" : "none");
        if (run_workload(&m, &o, &err)) {
            fprintf(stderr, "eaglegen bench: %s\n", err.msg);
            rc = 1;
        }
    } else if (run_bench(&m, &o, &err)) {
        fprintf(stderr, "eaglegen bench: %s\n", err.msg);
        rc = 1;
    }
    eg_model_free(&m);
    if (*drawn) eg_rm_flat_dir(drawn);
    return rc;
}
