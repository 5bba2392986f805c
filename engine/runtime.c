/* runtime.c — backends, stages, ranks and the memory plan of an engine run (runtime.h). */
#include "engine/runtime.h"

#include "engine/drafter_eagle3.h"

#include "engine/collective_cuda.h"
#include "engine/cuda_plan.h"
#include "engine/ep_runtime.h"
#include "engine/layout.h"
#include "engine/plan.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


struct eg_runtime {
    eg_model own_model;       /* when loaded from opts.model_dir */
    int owns_model;
    const eg_model *m;
    eg_backend *be;           /* one backend (no threaded stages, no ep) */
    eg_backend **stage_be;    /* [n_stages] with threaded stages */
    eg_engine *engine;        /* the engine, or rank 0's */
    eg_ep_runtime *ep_rt;     /* ep > 1 */
    int ep_groups;            /* ep > 1 with stages: stage groups (ep_runtime.h), each rank's
                                 stage k on a backend (GPU) and thread of its own */
    eg_drafter **drafters;    /* [n_drafters] opts.draft_model: one per engine (per rank with ep) */
    int n_drafters;
    eg_forward *fwd;          /* opts.forward_only */
    eg_engine *volatile stop_engine; /* what eg_runtime_request_stop stops */
    eg_ep_runtime *volatile stop_ep;  /* or, with ep ranks, every rank of this */
    int *aux;                 /* [n_aux] copy */
    int *stage_ends;          /* [n_stages] */
    int *stage_cuts;          /* [n_stages] 0, or the expert stage k's last layer is split at */
    int *stage_device;        /* [n_stages] */
    int64_t *stage_bytes;     /* [n_stages] */
    /* the GPUs the memory plan measured (not the as-if figures of plan_total_bytes): device,
       bytes in use before the run, the run's budget; checked once everything is made */
    struct planned_gpu {
        int device;
        int64_t before, budget, headroom;
    } *planned; /* [n_planned] */
    int n_planned;
    eg_runtime_info info;
};

/* A decimal number of digits only at *p, 1 .. 1 << 20; advances *p. 0 when there is none. */
static int stage_number(const char **p) {
    long v = 0;
    if (!isdigit((unsigned char)**p)) return 0;
    for (; isdigit((unsigned char)**p); (*p)++)
        if ((v = v * 10 + (**p - '0')) > 1 << 20) return 0;
    return (int)v;
}

int eg_runtime_stages_syntax(const char *s, int *ends, int *cuts, int cap) {
    int n = 0;
    while (*s) {
        int v = stage_number(&s), x = 0;
        if (v < 1 || n >= cap) return -1;
        if (*s == ':' && (s++, (x = stage_number(&s)) < 1)) return -1;
        if (*s == ',' && !*++s) return -1; /* a trailing comma */
        if (*s && !isdigit((unsigned char)*s)) return -1;
        if (ends) ends[n] = v;
        if (cuts) cuts[n] = x;
        n++;
    }
    return n;
}

eg_status eg_runtime_parse_stages(const char *stages, const eg_model *m, int64_t tail_extra, int *ends, int *n,
                                  eg_error *err) {
    return eg_runtime_parse_stages_cuts(stages, m, tail_extra, ends, NULL, n, err);
}

eg_status eg_runtime_parse_stages_cuts(const char *stages, const eg_model *m, int64_t tail_extra, int *ends, int *cuts,
                                       int *n, eg_error *err) {
    const eg_config *c = &m->cfg;
    int cap = 1;
    for (const char *p = stages; *p; p++) cap += *p == ',';
    int *vals = eg_calloc((size_t)cap, sizeof *vals, err), *vcut = eg_calloc((size_t)cap, sizeof *vcut, err), nv = 0;
    if (!vals || !vcut) { free(vals); free(vcut); return EG_ERR_NOMEM; }
    eg_status st = EG_OK;
    if ((nv = eg_runtime_stages_syntax(stages, vals, vcut, cap)) < 0) {
        free(vals);
        free(vcut);
        return eg_fail(err, EG_ERR_INVALID, "--stages: expected N or comma-separated end layers, got '%s' (an end is "
                       "END, or END:CUT to split layer END-1's routed experts)", stages);
    }
    for (int i = 0; i < nv; i++) {
        if (!vcut[i]) continue;
        const char *why = !cuts ? "a layer split (END:CUT) is not taken here"
                          : i == nv - 1 ? "the last stage ends the model and has no layer to split"
                          : vals[i] > c->n_layers ? "END is past the model's layers"
                          : !m->layers[vals[i] - 1].is_moe ? "layer END-1 is dense (no routed experts to split)"
                          : vcut[i] >= c->n_experts ? "CUT must be below the routed expert count"
                                                    : NULL;
        if (why) {
            st = eg_fail(err, EG_ERR_INVALID, "--stages %s: stage %d's end %d:%d (layer %d of %d, %d routed experts): %s",
                         stages, i, vals[i], vcut[i], vals[i] - 1, c->n_layers, c->n_experts, why);
            free(vals);
            free(vcut);
            return st;
        }
    }
    if (cuts) memcpy(cuts, vcut, sizeof(int) * (size_t)nv);
    free(vcut);
    if (nv == 1) {
        if (vals[0] > c->n_layers) {
            st = eg_fail(err, EG_ERR_INVALID, "--stages %d: the model has %d layers", vals[0], c->n_layers);
            free(vals);
            return st;
        }
        double *cost = eg_calloc((size_t)c->n_layers, sizeof *cost, err);
        if (!cost) { free(vals); return EG_ERR_NOMEM; }
        *n = vals[0];
        int64_t tail, head = eg_plan_head_bytes(m, *n, &tail);
        for (int l = 0; l < c->n_layers; l++) cost[l] = (double)eg_plan_layer_bytes(m, l);
        st = eg_plan_split(cost, c->n_layers, (double)head, (double)(tail + tail_extra), *n, ends, err);
        free(cost);
        free(vals);
        return st;
    }
    for (int i = 0; i < nv; i++)
        if ((i && vals[i] <= vals[i - 1]) || (i == nv - 1 && vals[i] != c->n_layers)) {
            free(vals);
            return eg_fail(err, EG_ERR_INVALID, "--stages %s: end layers must increase and the last must be %d", stages,
                           c->n_layers);
        }
    memcpy(ends, vals, sizeof(int) * (size_t)nv);
    *n = nv;
    free(vals);
    return EG_OK;
}

void eg_runtime_free(eg_runtime *rt) {
    if (!rt) return;
    if (rt->ep_rt) eg_ep_runtime_free(rt->ep_rt);
    else eg_engine_free(rt->engine);
    eg_forward_free(rt->fwd);
    for (int r = 0; rt->drafters && r < rt->n_drafters; r++) eg_drafter_free(rt->drafters[r]); /* after the engines */
    free(rt->drafters);
    eg_backend_free(rt->be);
    for (int k = 0; rt->stage_be && k < rt->info.n_stages; k++) eg_backend_free(rt->stage_be[k]);
    free(rt->stage_be);
    if (rt->owns_model) eg_model_free(&rt->own_model);
    free(rt->aux);
    free(rt->stage_ends);
    free(rt->stage_cuts);
    free(rt->stage_device);
    free(rt->stage_bytes);
    free(rt->planned);
    free(rt);
}

/* --stages P --ep E with stage threads run as stage groups (ep_runtime.h) on CPU ranks, and
 * on CUDA where P*E GPUs are there (--gpus, else the devices found); otherwise each rank
 * runs all its stages on its one GPU, one after another. */
static int ep_stage_groups(const eg_runtime_opts *o, int n_stages, int cuda) {
    int gpus = o->gpus > 0 ? o->gpus : eg_ep_cuda_devices();
    return o->ep > 1 && o->stage_threads && n_stages > 1 && (!cuda || gpus >= n_stages * o->ep);
}

/* One side of layer l split at cut (cut 0: the whole layer), on one GPU: alone, or with
 * ep > 1 on the heaviest rank of the group (ep_runtime.h, ffn_rank as there). */
static int64_t part_bytes(const eg_model *m, int l, int cut, int side, int ep, int ffn_rank) {
    if (ep > 1) return eg_ep_runtime_layer_bytes(m, l, ep, ffn_rank, cut, side);
    return cut ? eg_plan_split_layer_bytes(m, l, cut, side) : eg_plan_layer_bytes(m, l);
}

/* Stage k's layer bytes (no embedding or head): its whole layers, and each side of a split
 * layer it holds (stage_cuts: its own last layer's attention side, the previous stage's
 * last layer's expert side); with ep > 1 a rank's share (part_bytes). */
static int64_t stage_layer_bytes(const eg_model *m, const int *ends, const int *cuts, int n_stages, int k, int ep,
                                 int ffn_rank) {
    int b0 = k ? ends[k - 1] : 0, end = n_stages > 1 ? ends[k] : m->cfg.n_layers;
    int head = k && cuts[k - 1] ? cuts[k - 1] : 0, tail = k < n_stages - 1 ? cuts[k] : 0;
    int64_t b = head ? part_bytes(m, b0 - 1, head, 1, ep, ffn_rank) : 0;
    for (int l = b0; l < end && l < m->cfg.n_layers; l++)
        b += part_bytes(m, l, tail && l == end - 1 ? tail : 0, 0, ep, ffn_rank);
    return b;
}

/* The captures stage k makes (eg_forward_staged_captures' count, forward.c owns_capture):
 * the embedding on stage 0, a layer's output where its residual add runs, which for a
 * split layer is the stage after the cut. */
static int stage_captures(const eg_runtime *rt, int n_aux, int n_stages, int k) {
    int b0 = k ? rt->stage_ends[k - 1] - (rt->stage_cuts[k - 1] > 0) : 0;
    int end = n_stages > 1 ? rt->stage_ends[k] - (k < n_stages - 1 && rt->stage_cuts[k] > 0) : rt->m->cfg.n_layers;
    int n = 0;
    for (int i = 0; i < n_aux; i++) n += rt->aux[i] == -1 ? k == 0 : rt->aux[i] >= b0 && rt->aux[i] < end;
    return n;
}

/* The logit rows the last stage's forward holds, as the engines it serves size them
 * (eg_forward_logit_rows): a rank's share of the slots with --ep; every row while the
 * slot count is not chosen yet (slots 0: --batch auto's first pass), and for forward_only. */
static int runtime_logit_rows(const eg_runtime_opts *o, int slots) {
    if (o->forward_only) return o->max_tokens; /* its callers step the forward directly, any rows */
    int ep = o->ep > 1 ? o->ep : 1, draft = (o->draft_model || o->drafter) ? o->draft_tokens : 0;
    int per = slots > 0 && ep > 1 ? eg_ep_runtime_rank_slots(slots, ep, 0) : slots;
    return eg_forward_logit_rows(o->max_tokens, per, draft, o->want_logits);
}

/* --stages N on planned GPUs, one stage per GPU (ep 1), or one per rank and stage (stage
 * groups, ep > 1: stage k on GPUs device + k*ep ..): the split with the largest common KV
 * pool (eg_plan_split_kv), layers cut inside where that holds more than the byte-balanced
 * whole-layer split already in rt->stage_ends; the output is the same either way (the
 * routed sum continues across a cut). Each stage's budget is what its (first) GPU's plan
 * leaves for weights and cache, less the embedding (stage 0), the head and the drafter's
 * weights (the last, whose cache also grows by the drafter's per token); activations are
 * counted with every capture staged (an upper bound), with ep the exchange's buffers too.
 * With ep the units are a rank's: 1/ep of each routed expert (each range is shared out),
 * each shared expert / dense MLP on the rank that owns it where the group splits them (a
 * stage's bytes its heaviest rank's, as the layout model counts them), 1/ep of the
 * embedding and head with the vocab split; tail_extra is one rank's drafter. plan_cuda
 * then plans the heaviest rank of the split chosen. Notes the choice. */
static eg_status balance_stages(eg_runtime *rt, const eg_runtime_opts *o, const eg_backend_opts *bo, int n, int ep,
                                int64_t tail_extra, int64_t draft_tok, eg_error *err) {
    const eg_model *m = rt->m;
    const eg_config *c = &m->cfg;
    int L = c->n_layers;
    if (ep < 1) ep = 1;
    eg_plan_layer_parts *parts = eg_calloc((size_t)L, sizeof *parts, err);
    int64_t *budget = eg_calloc((size_t)n, sizeof *budget, err);
    int *ends = eg_calloc((size_t)n, sizeof *ends, err), *cuts = eg_calloc((size_t)n, sizeof *cuts, err);
    eg_status st = EG_OK;
    if (!parts || !budget || !ends || !cuts) { st = EG_ERR_NOMEM; goto out; }
    int ffn = ep > 1 && o->ep_split != EG_EP_SPLIT_NONE, vocab = ep > 1 && o->ep_split == EG_EP_SPLIT_ALL;
    for (int l = 0; l < L; l++) {
        eg_plan_layer_parts_of(m, l, &parts[l]);
        if (ep > 1) {
            parts[l].expert = (parts[l].expert + ep - 1) / ep;
            if (ffn) { /* the FFN on its owner alone (eg_ep_ffn_owner: layer mod ep); a dense
                          layer's MLP leaves its attn part for shared */
                const eg_layer_w *h = &m->layers[l];
                int64_t d = parts[l].n_experts ? 0 : eg_weight_bytes(&h->mlp_gate) + eg_weight_bytes(&h->mlp_up) +
                                                         eg_weight_bytes(&h->mlp_down);
                parts[l].attn -= d;
                parts[l].shared += d;
                parts[l].owner = l % ep + 1;
            }
        }
    }
    int64_t tail = 0, head = eg_plan_head_bytes(m, n, &tail);
    if (vocab) {
        int64_t nb = eg_weight_bytes(&m->final_norm);
        head = (head + ep - 1) / ep;
        tail = nb + (tail - nb + ep - 1) / ep;
    }
    int staged = eg_cuda_graphs_enabled() ? eg_forward_staged_captures(rt->aux, o->n_aux, 0, L) : 0;
    for (int k = 0; k < n; k++) {
        /* the logits only on the last stage (at most; --batch auto: every row) */
        int64_t act = eg_forward_act_bytes(c, o->max_tokens, k == n - 1 ? runtime_logit_rows(o, o->n_slots) : 0, staged);
        if (ep > 1) act += eg_ep_runtime_device_bytes(c, ep, o->max_tokens, vocab);
        eg_backend_opts so = *bo;
        so.device = o->device + k * ep;
        eg_cuda_mem_plan mp;
        eg_error ignored;
        st = o->plan_total_bytes > 0 ? eg_cuda_plan_mem(c, &so, o->gpu_mem_fraction, o->plan_total_bytes,
                                                        o->plan_free_bytes, 0, act, 1, 0, 64, &mp, &ignored)
                                     : eg_cuda_plan(c, &so, o->gpu_mem_fraction, 0, act, 1, 0, 64, &mp, &ignored);
        if (st) { st = EG_OK; goto out; } /* no plan for this GPU: the whole-layer split stays (plan_cuda says why) */
        budget[k] = mp.budget_bytes - act - mp.scratch_bytes - (k == 0 ? head : 0) - (k == n - 1 ? tail + tail_extra : 0);
    }
    int64_t kvb = eg_plan_kv_bytes_per_token_layer(c), x_cut = 0;
    int64_t x_whole = eg_plan_split_kv_tokens(parts, L, budget, n, kvb, draft_tok, rt->stage_ends, NULL);
    eg_error ignored;
    if (eg_plan_split_kv(parts, L, budget, n, kvb, draft_tok, 1, ends, cuts, &x_cut, &ignored) || x_cut <= x_whole)
        goto out;
    memcpy(rt->stage_ends, ends, sizeof(int) * (size_t)n);
    memcpy(rt->stage_cuts, cuts, sizeof(int) * (size_t)n);
    if (o->note) {
        char line[1024];
        int at = snprintf(line, sizeof line, "stage split: --stages");
        for (int k = 0; k < n && at < (int)sizeof line - 24; k++)
            at += snprintf(line + at, sizeof line - (size_t)at, cuts[k] ? "%s%d:%d" : "%s%d", k ? "," : " ", ends[k],
                           cuts[k]);
        snprintf(line + at, sizeof line - (size_t)at, ", layers split between stages for the largest common KV pool "
                 "(about %lld tokens; %lld at whole layers; the same samples either way)", (long long)x_cut,
                 (long long)(x_whole > 0 ? x_whole : 0));
        o->note(o->note_ctx, line);
    }
out:
    free(parts);
    free(budget);
    free(ends);
    free(cuts);
    return st;
}

/* The per-GPU memory plan (cuda, gpu_mem_fraction > 0): weights and activations of
 * every stage on a GPU first (each stage backend has its own scratch), the KV pool from
 * what is left; every stage gets the same number of cache blocks, the smallest any GPU
 * allows. */
/* With a drafter (draft_w its weights, draft_buf its passes' buffers and backend scratch
 * (eg_drafter_eagle3_device_bytes), draft_slot its fixed bytes per slot, draft_tok its
 * paged cache's bytes per token, plan_slots slots in all; 0 while --batch auto is still
 * being chosen) the GPU of the last stage (each rank's with ep) also holds the drafter:
 * its weights and slots' rows with the activations (*draft_dev gets those bytes, per rank
 * with ep), its cache per token beside that GPU's layers' (it grows with the target's
 * pool, block for block). quiet: no notes (a first pass). */
static eg_status plan_cuda(eg_runtime *rt, const eg_runtime_opts *o, const eg_backend_opts *bo, int n_stages,
                           int64_t draft_w, int64_t draft_buf, int64_t draft_slot, int64_t draft_tok, int plan_slots,
                           int quiet,
                           int64_t *kv_blocks, int64_t *draft_dev, eg_error *err) {
    const eg_model *m = rt->m;
    const eg_config *c = &m->cfg;
    /* --ep: every rank's GPU holds all stages and the same share (planned once, as GPU 0);
       stage groups: rank r's stage k on GPU device + k*ep + r, planned once per stage (the
       group's heaviest rank), as its first GPU */
    int ep = o->ep > 1 ? o->ep : 1, groups = ep > 1 && rt->ep_groups;
    int n_dev = groups ? n_stages : ep > 1 ? 1 : o->gpus > 0 && o->gpus < n_stages ? o->gpus : n_stages;
    *kv_blocks = 0;
    *draft_dev = 0;
    if (!quiet) {
        free(rt->planned);
        rt->n_planned = 0;
        if (!(rt->planned = eg_calloc((size_t)n_dev, sizeof *rt->planned, err))) return EG_ERR_NOMEM;
    }
    if (o->draft_model) /* the ranks' slots: rank 0 has the most */
        *draft_dev = draft_w + draft_buf + draft_slot * (ep > 1 ? eg_ep_runtime_rank_slots(plan_slots, ep, 0) : plan_slots);
    for (int d = 0; d < n_dev; d++) {
        int64_t tail = 0, head = eg_plan_head_bytes(m, n_stages, &tail), wbytes = 0, act = 0;
        int layers = 0, on_dev = 0;
        if (ep > 1 && o->ep_split == EG_EP_SPLIT_ALL) { /* the vocab split: the largest rank's slices */
            int64_t rows = (c->vocab + ep - 1) / ep, nb = eg_weight_bytes(&m->final_norm);
            head = (head * rows + c->vocab - 1) / c->vocab;
            tail = nb + ((tail - nb) * rows + c->vocab - 1) / c->vocab;
        }
        for (int k = 0, b0 = 0; k < n_stages; b0 = rt->stage_ends[k++]) {
            int end = n_stages > 1 ? rt->stage_ends[k] : c->n_layers;
            if (k % n_dev != d) continue;
            /* (a stage beside a cut holds its working rows as the hand-over's planes: the
               same activation bytes) */
            if (ep > 1 && o->ep_split != EG_EP_SPLIT_NONE) { /* the heaviest rank: owners differ per layer */
                int64_t most = 0;
                for (int r = 0; r < ep; r++) {
                    int64_t mine = stage_layer_bytes(m, rt->stage_ends, rt->stage_cuts, n_stages, k, ep, r);
                    if (mine > most) most = mine;
                }
                wbytes += most;
            } else {
                wbytes += stage_layer_bytes(m, rt->stage_ends, rt->stage_cuts, n_stages, k, ep, -1);
            }
            wbytes += (b0 == 0 ? head : 0) + (end == c->n_layers ? tail : 0);
            int staged = eg_cuda_graphs_enabled() ? stage_captures(rt, o->n_aux, n_stages, k) : 0;
            int lrows = end == c->n_layers ? runtime_logit_rows(o, plan_slots) : 0;
            act += eg_forward_act_bytes(c, o->max_tokens, lrows, staged) + (on_dev++ ? eg_cuda_scratch_bytes(c, bo) : 0);
            layers += end - b0;
        }
        if (ep > 1) /* the nccl exchange's buffers (the vocab split's logit blocks too) */
            act += eg_ep_runtime_device_bytes(c, ep, o->max_tokens, o->ep_split == EG_EP_SPLIT_ALL);
        int with_draft = *draft_dev > 0 && (n_stages - 1) % n_dev == d; /* it reads the last stage's rows */
        if (with_draft) act += *draft_dev;
        /* ranks sharing a GPU (fewer GPUs than ranks): each holds its weights, buffers and
           backend scratch there, and the pool is split between them */
        int rpg = ep > 1 && !groups ? eg_ep_runtime_ranks_per_gpu(ep) : 1;
        if (rpg > 1) {
            wbytes *= rpg;
            act = act * rpg + (rpg - 1) * eg_cuda_scratch_bytes(c, bo);
        }
        eg_backend_opts so = *bo;
        so.device = o->device + (groups ? d * ep : d);
        eg_cuda_mem_plan mp;
        char line[512], note[900];
        const int64_t extra = with_draft ? draft_tok : 0;
        eg_status st = o->plan_total_bytes > 0
                           ? eg_cuda_plan_mem(c, &so, o->gpu_mem_fraction, o->plan_total_bytes, o->plan_free_bytes,
                                              wbytes, act, layers, extra, 64, &mp, err)
                           : eg_cuda_plan(c, &so, o->gpu_mem_fraction, wbytes, act, layers, extra, 64, &mp, err);
        if (st) return eg_wrap(err, "memory plan for GPU %d", so.device), st;
        eg_cuda_plan_format(&mp, so.device, line, sizeof line);
        if (!quiet && o->plan_total_bytes <= 0)
            rt->planned[rt->n_planned++] = (struct planned_gpu){so.device, mp.total_bytes - mp.free_bytes,
                                                                mp.budget_bytes, mp.headroom_bytes};
        char dnote[240] = "";
        if (with_draft)
            snprintf(dnote, sizeof dnote, "; the activations include the drafter's %lld bytes (weights %lld, buffers %lld, %d "
                     "slots' rows of %lld%s), its cache grows with the pool", (long long)*draft_dev, (long long)draft_w,
                     (long long)draft_buf,
                     ep > 1 ? eg_ep_runtime_rank_slots(plan_slots, ep, 0) : plan_slots, (long long)draft_slot,
                     ep > 1 ? ", per rank" : "");
        char gnote[96] = "";
        if (groups)
            snprintf(gnote, sizeof gnote, " (stage %d of each rank: GPUs %d..%d, one per rank)", d, so.device,
                     so.device + ep - 1);
        snprintf(note, sizeof note, "%s%s%s%s", line, on_dev > 1 ? " (shared by its stages)" : "", gnote, dnote);
        if (o->note && !quiet) o->note(o->note_ctx, note);
        if (!*kv_blocks || mp.kv_blocks < *kv_blocks) *kv_blocks = mp.kv_blocks;
    }
    /* the runtime splits the pool over the ranks: each rank's GPU share times the ranks */
    if (ep > 1) *kv_blocks = *kv_blocks / (groups ? 1 : eg_ep_runtime_ranks_per_gpu(ep)) * ep;
    return EG_OK;
}

/* Once weights, buffers and the KV pool are allocated: what each planned GPU holds for this
 * run against the budget its plan filled (the pool takes what the rest leaves, in whole
 * blocks, so a plan that counts every cudaMalloc stays within it). Past it, the driver's
 * and libraries' own memory (contexts, cuBLAS, NCCL) has the headroom the budget kept
 * back; past that too, the plan misses allocations (rounding, or a buffer it does not
 * count), and the line says so. */
static void note_after_load(const eg_runtime *rt, const eg_runtime_opts *o) {
    for (int i = 0; i < rt->n_planned && o->note; i++) {
        int64_t fr = 0, to = 0;
        eg_error ignored = {0};
        const struct planned_gpu *g = &rt->planned[i];
        if (eg_cuda_mem_info(g->device, &fr, &to, &ignored)) continue;
        int64_t used = to - fr - g->before, budget = g->budget, room = g->headroom;
        int64_t d = used <= budget ? budget - used : used - budget;
        char diff[48], line[400];
        if (d < (1 << 20)) snprintf(diff, sizeof diff, "%lld bytes", (long long)d);
        else snprintf(diff, sizeof diff, "%.2f MiB", (double)d / (1 << 20));
        int n = snprintf(line, sizeof line, "GPU %d after load: %.3f GiB held by this run, ", g->device,
                         (double)used / (1 << 30));
        if (used <= budget)
            snprintf(line + n, sizeof line - (size_t)n, "within its plan's budget of %.3f GiB (%s to spare)",
                     (double)budget / (1 << 30), diff);
        else if (used <= budget + room)
            snprintf(line + n, sizeof line - (size_t)n, "%s over its plan's budget of %.3f GiB, within the %lld MiB "
                     "kept for the driver and libraries", diff, (double)budget / (1 << 30), (long long)(room >> 20));
        else
            snprintf(line + n, sizeof line - (size_t)n, "%s over its plan's budget of %.3f GiB and the %lld MiB "
                     "headroom: allocations the plan does not count", diff, (double)budget / (1 << 30),
                     (long long)(room >> 20));
        o->note(o->note_ctx, line);
    }
}

eg_status eg_runtime_create(const eg_runtime_opts *o, eg_runtime **out, eg_error *err) {
    *out = NULL;
    if (!o->model && !o->model_dir) return eg_fail(err, EG_ERR_INVALID, "runtime: no model (model or model_dir)");
    if (o->max_seq_len < 1 || o->max_tokens < 1)
        return eg_fail(err, EG_ERR_INVALID, "runtime: max_seq_len %d and max_tokens %d must be at least 1",
                       o->max_seq_len, o->max_tokens);
    if (o->stages && o->stage_ends)
        return eg_fail(err, EG_ERR_INVALID, "runtime: give the stages as text or as end layers, not both");
    if (o->forward_only && (o->n_slots < 1 || o->stages || o->stage_ends || o->ep > 1 || o->draft_model || o->drafter))
        return eg_fail(err, EG_ERR_INVALID, "runtime: forward_only runs one forward of n_slots %d > 0 slots on one "
                       "backend (no stages, ranks or drafter)", o->n_slots);
    if (o->ep_split != EG_EP_SPLIT_NONE && o->ep_split != EG_EP_SPLIT_FFN && o->ep_split != EG_EP_SPLIT_ALL)
        return eg_fail(err, EG_ERR_INVALID, "runtime: expert-parallel split %d (expected none, ffn or all)",
                       (int)o->ep_split);
    if (o->ep_split != EG_EP_SPLIT_NONE && o->ep < 2)
        return eg_fail(err, EG_ERR_INVALID, "--ep-split %s needs an expert-parallel group (--ep > 1, got %d)",
                       o->ep_split == EG_EP_SPLIT_ALL ? "all" : "ffn", o->ep);
    eg_runtime *rt = eg_calloc(1, sizeof *rt, err);
    if (!rt) return EG_ERR_NOMEM;
    rt->info.n_stages = 1;
    rt->info.ep = 1;
    eg_status st = EG_OK;
    if (o->model) rt->m = o->model;
    else {
        if ((st = eg_model_load(o->model_dir, &rt->own_model, err))) goto fail;
        rt->owns_model = 1;
        rt->m = &rt->own_model;
    }
    const eg_model *m = rt->m;
    const eg_config *c = &m->cfg;
    const char *backend = o->backend ? o->backend : "cpu";
    int cuda = !strcmp(backend, "cuda");
    if (o->n_aux > 0) {
        if (!(rt->aux = eg_calloc((size_t)o->n_aux, sizeof *rt->aux, err))) { st = EG_ERR_NOMEM; goto fail; }
        memcpy(rt->aux, o->aux_layers, sizeof(int) * (size_t)o->n_aux);
    }
    int max_tokens = o->max_tokens;
    eg_backend_opts bo = {.name = backend, .max_tokens = max_tokens, .max_seq_len = o->max_seq_len,
                          .nthreads = o->threads, .device = o->device};
    /* the drafter's size (a probe of one slot: the checkpoint is mapped, not read), for the plan */
    int64_t draft_w = 0, draft_slot = 0, draft_tok = 0, draft_dev = 0, draft_buf = 0;
    const int64_t block = o->block_size > 0 ? o->block_size : 64;
    if (o->draft_model) {
        eg_drafter *probe = NULL;
        eg_eagle3_opts po = {.threads = 1, .block_size = (int)block};
        if ((st = eg_drafter_eagle3_load_opts(o->draft_model, m, 1, o->max_seq_len, &po, &probe, err))) {
            eg_wrap(err, "--draft-model %s", o->draft_model);
            goto fail;
        }
        const eg_drafter_info *pi = &probe->info;
        draft_w = pi->weight_bytes;
        draft_tok = pi->cache_bytes_per_token;
        /* the probe's one slot: its fixed rows, past its default pool of one slot's blocks */
        draft_slot = pi->state_bytes - pi->pool_blocks * pi->block_size * pi->cache_bytes_per_token;
        /* on the GPU: its rows of a pass (EG_EAGLE3_GPU_ROWS) and its backend's scratch */
        if (cuda) draft_buf = eg_drafter_eagle3_device_bytes(probe, EG_EAGLE3_GPU_ROWS);
        eg_drafter_free(probe);
    }
    /* the stage split */
    int n_stages = 1, explicit_ends = 0;
    rt->stage_ends = eg_calloc((size_t)(c->n_layers > o->n_stages ? c->n_layers : o->n_stages) + 1, sizeof(int), err);
    rt->stage_cuts = eg_calloc((size_t)(c->n_layers > o->n_stages ? c->n_layers : o->n_stages) + 1, sizeof(int), err);
    if (!rt->stage_ends || !rt->stage_cuts) { st = EG_ERR_NOMEM; goto fail; }
    rt->stage_ends[0] = c->n_layers;
    if (o->stages) {
        /* on CUDA the drafter sits on the last stage's GPU (each rank's with ep, where the
         * split weighs whole layers): its weights count in that stage's share */
        int64_t tail_extra = cuda ? (draft_w + draft_buf) * (o->ep > 1 ? o->ep : 1) : 0;
        if ((st = eg_runtime_parse_stages_cuts(o->stages, m, tail_extra, rt->stage_ends, rt->stage_cuts, &n_stages, err)))
            goto fail;
        /* "N" on planned GPUs, one each (no ranks) or one per rank and stage (stage groups,
           below): layers may be split for a larger pool */
        if (n_stages > 1 && !strchr(o->stages, ',') && cuda && o->gpu_mem_fraction > 0 &&
            (o->ep <= 1 || ep_stage_groups(o, n_stages, cuda)) &&
            (o->ep > 1 || o->gpus <= 0 || o->gpus >= n_stages) && !o->whole_layers &&
            (st = balance_stages(rt, o, &bo, n_stages, o->ep, o->ep > 1 ? draft_w + draft_buf : tail_extra, draft_tok,
                                 err)))
            goto fail;
        if (n_stages < 1) { /* "--stages ''": one stage */
            n_stages = 1;
            rt->stage_ends[0] = c->n_layers;
        }
    } else if (o->stage_ends && o->n_stages > 0) {
        memcpy(rt->stage_ends, o->stage_ends, sizeof(int) * (size_t)o->n_stages);
        if (o->stage_cuts) memcpy(rt->stage_cuts, o->stage_cuts, sizeof(int) * (size_t)o->n_stages);
        n_stages = o->n_stages;
        explicit_ends = 1;
    }
    int any_cut = 0;
    for (int k = 0; k < n_stages; k++) any_cut |= rt->stage_cuts[k] > 0;
    rt->info.n_stages = n_stages;
    rt->ep_groups = ep_stage_groups(o, n_stages, cuda);
    /* the KV pool, the slot count and the host budget */
    int64_t kv_blocks = 0;
    int n_slots = o->n_slots;
    int planned = cuda && o->gpu_mem_fraction > 0;
    int64_t seq_host =
        eg_plan_seq_host_bytes(c, o->n_aux + (o->final_both != 0), o->max_seq_len, o->capture_bf16 ? 2 : 4);
    /* with a drafter a sampled slot keeps the draft distributions, K x V doubles (engine.c
       slot buffers; they travel with a preempted sequence): 3.1 MB at K 3 on Kimi's vocab,
       66 MB at K 64. Counted for every slot, as any may sample. */
    if ((o->draft_model || o->drafter) && o->draft_tokens > 0)
        seq_host += (int64_t)sizeof(double) * o->draft_tokens * c->vocab;
    rt->info.auto_slots = n_slots == 0;
    /* --batch auto on a planned GPU: a first pass (every row's logits, no slot's drafter
       cache) chooses a slot count, the second plans that many slots: their logit rows on
       the last stage (fewer: the pool gets the rest) and, with a drafter, their caches (at
       least as many slots as the smaller pool then chooses) */
    for (int pass = planned && n_slots == 0 ? 0 : 1; pass < 2; pass++) {
        int plan_slots = pass ? (n_slots ? n_slots : 0) : 0;
        if (planned && (st = plan_cuda(rt, o, &bo, n_stages, draft_w, draft_buf, draft_slot, draft_tok, plan_slots, !pass,
                                       &kv_blocks, &draft_dev, err)))
            goto fail;
        if (o->kv_tokens > 0) {
            int64_t cap = o->kv_tokens / block > 0 ? o->kv_tokens / block : 1;
            if (!kv_blocks || cap < kv_blocks) kv_blocks = cap;
        }
        if (!rt->info.auto_slots) continue;
        if (!kv_blocks) kv_blocks = 16 * ((o->max_seq_len + block - 1) / block); /* cpu: what 16 slots hold */
        /* on the cpu backend the drafter's cache is host memory like the rows: counted as
           the most a slot can hold */
        /* with ranks the pool is the group's, and every rank steps max_tokens rows: up to
           that many slots per rank, the same count on each, at least one */
        int ranks = o->ep > 1 ? o->ep : 1;
        int ns = eg_plan_auto_slots(kv_blocks * block, o->max_seq_len, max_tokens * ranks, o->ram_bytes,
                                    seq_host + (cuda ? 0 : draft_slot + draft_tok * o->max_seq_len));
        if (ranks > 1) ns = ns < ranks ? ranks : ns / ranks * ranks;
        if (!pass || !n_slots || ns < n_slots) n_slots = ns;
    }
    if (!o->forward_only && kv_blocks && kv_blocks < (o->max_seq_len + block - 1) / block) {
        st = eg_fail(err, EG_ERR_INVALID,
                     "the KV pool (%lld tokens) cannot hold one sequence of --max-seq-len %d: raise --kv-tokens (or "
                     "--gpu-mem-fraction) or lower --max-seq-len",
                     (long long)(kv_blocks * block), o->max_seq_len);
        goto fail;
    }
    int64_t host_kv = o->host_kv_bytes >= 0 ? o->host_kv_bytes : o->ram_bytes / 4;
    /* backends and engines */
    int threaded = o->stage_threads && n_stages > 1;
    if (!(rt->stage_device = eg_calloc((size_t)n_stages, sizeof(int), err)) ||
        !(rt->stage_bytes = eg_calloc((size_t)n_stages, sizeof(int64_t), err))) {
        st = EG_ERR_NOMEM;
        goto fail;
    }
    for (int k = 0; k < n_stages; k++) {
        int64_t tail = 0, head = eg_plan_head_bytes(m, n_stages, &tail);
        int64_t bytes = stage_layer_bytes(m, rt->stage_ends, rt->stage_cuts, n_stages, k, 1, -1);
        rt->stage_bytes[k] = bytes + (k == 0 ? head : 0) + (k == n_stages - 1 ? tail : 0);
        rt->stage_device[k] = cuda ? (rt->ep_groups ? eg_ep_runtime_stage_device(o->device, o->ep, 1, 0, k)
                                                    : o->device + (o->gpus > 0 ? k % o->gpus : k))
                                   : k;
    }
    if (o->ep > 1) {
        /* the ranks' backends are built by the expert-parallel runtime */
    } else if (threaded) {
        if (!(rt->stage_be = eg_calloc((size_t)n_stages, sizeof *rt->stage_be, err))) { st = EG_ERR_NOMEM; goto fail; }
        int per = (o->threads > 0 ? o->threads : eg_num_threads()) / n_stages;
        for (int k = 0; k < n_stages; k++) {
            eg_backend_opts so = bo;
            so.device = rt->stage_device[k];
            so.nthreads = per > 0 ? per : 1;
            if ((st = eg_backend_create(c, &so, &rt->stage_be[k], err))) { eg_wrap(err, "stage %d", k); goto fail; }
        }
    } else if ((st = eg_backend_create(c, &bo, &rt->be, err))) goto fail;
    if (o->forward_only) {
        eg_forward_opts fo = {.max_tokens = max_tokens, .n_slots = n_slots, .max_seq_len = o->max_seq_len,
                              .block_size = (int)block, .kv_blocks = kv_blocks, .capture = rt->aux,
                              .n_capture = o->n_aux, .final_pre_norm = o->final_pre_norm,
                              .random_weights = o->random_weights, .random_seed = o->random_seed};
        if ((st = eg_forward_create(m, rt->be, &fo, &rt->fwd, err))) goto fail;
        eg_runtime_info *in = &rt->info;
        in->backend = backend;
        in->n_slots = n_slots;
        in->max_tokens = max_tokens;
        in->block_size = (int)block;
        in->kv_blocks = eg_forward_kv(rt->fwd)->n_blocks;
        in->kv_capacity = in->kv_capacity_all = in->kv_blocks * block;
        in->stage_ends = rt->stage_ends;
        in->stage_cuts = rt->stage_cuts;
        in->stage_device = rt->stage_device;
        in->stage_weight_bytes = rt->stage_bytes;
        in->transport = "none";
        in->micro_batches = 1;
        in->experts_per_rank = c->n_experts;
        note_after_load(rt, o);
        *out = rt;
        return EG_OK;
    }
    int pass_ends = explicit_ends || n_stages > 1;
    eg_engine_opts eo = {.n_slots = n_slots, .max_seq_len = o->max_seq_len, .max_tokens = max_tokens,
                         .block_size = (int)block, .kv_blocks = kv_blocks, .aux_layers = rt->aux, .n_aux = o->n_aux,
                         .final_pre_norm = o->final_pre_norm, .final_both = o->final_both,
                         .want_logits = o->want_logits, .stage_ends = pass_ends ? rt->stage_ends : NULL,
                         .stage_cuts = pass_ends && any_cut ? rt->stage_cuts : NULL,
                         .n_stages = pass_ends ? n_stages : 0, .stage_backends = threaded ? rt->stage_be : NULL,
                         .micro_batches = o->micro_batches, .transport = o->transport, .kv_policy = o->kv_policy,
                         .host_kv_bytes = host_kv, .capture_bf16 = o->capture_bf16,
                         .check_recompute = o->check_recompute, .ep_split = o->ep > 1 ? o->ep_split : EG_EP_SPLIT_NONE};
    if (o->draft_model && o->drafter) {
        st = eg_fail(err, EG_ERR_INVALID, "runtime: give a drafter directory or a drafter, not both");
        goto fail;
    }
    if (o->drafter) {
        if (o->ep > 1) {
            st = eg_fail(err, EG_ERR_INVALID,
                         "runtime: a caller's drafter drives one engine; expert-parallel ranks (--ep) each load "
                         "their own from --draft-model");
            goto fail;
        }
        eo.drafter = o->drafter;
        eo.draft_tokens = o->draft_tokens;
    }
    /* before the ranks' drafters, which each need a slot */
    if (o->ep > 1 && (st = eg_ep_runtime_check(&m->cfg, o->ep, n_slots, err))) goto fail;
    if (o->draft_model) {
        /* one drafter per engine: with --ep each rank's, for its own slots, driven by its
           thread (the checkpoint is mapped read-only, so its pages are shared) */
        int nd = o->ep > 1 ? o->ep : 1;
        if (!(rt->drafters = eg_calloc((size_t)nd, sizeof *rt->drafters, err))) { st = EG_ERR_NOMEM; goto fail; }
        rt->n_drafters = nd;
        int all = o->threads > 0 ? o->threads : eg_num_threads();
        /* on the GPU that reads its rows (the rank's, or the last stage's) when the target
           runs on CUDA, its ops through a CUDA backend of its own; else its own CPU code */
        /* its paged cache in the target's blocks, its pool the engine's (a rank's share with
           ep, as eg_ep_runtime_create splits it; 0 = the engine's default, every slot full) */
        eg_eagle3_opts dopt = {.threads = nd > 1 ? (all / nd > 0 ? all / nd : 1) : 0,
                               .backend = cuda ? "cuda" : NULL, .block_size = (int)block,
                               .max_rows = cuda ? EG_EAGLE3_GPU_ROWS : 0};
        for (int r = 0; r < nd; r++) {
            int slots = nd > 1 ? eg_ep_runtime_rank_slots(n_slots, nd, r) : n_slots;
            dopt.pool_blocks = kv_blocks > 0 ? kv_blocks / nd + (r < kv_blocks % nd) : 0;
            dopt.device = nd > 1 ? eg_ep_runtime_stage_device(o->device, nd, rt->ep_groups, r, n_stages - 1)
                                 : rt->stage_device[n_stages - 1];
            if ((st = eg_drafter_eagle3_load_opts(o->draft_model, m, slots, o->max_seq_len, &dopt, &rt->drafters[r],
                                                  err))) {
                eg_wrap(err, "--draft-model %s", o->draft_model);
                goto fail;
            }
        }
        if (nd == 1) eo.drafter = rt->drafters[0];
        eo.draft_tokens = o->draft_tokens;
    }
    if (o->ep > 1) {
        /* the ranks' host draws (a drafter's, or kept logits) share the cores, as their
           drafters' pools do */
        int all = o->threads > 0 ? o->threads : eg_num_threads();
        eo.host_threads = all / o->ep > 0 ? all / o->ep : 1;
        eo.stage_backends = NULL;
        if ((st = eg_ep_runtime_create(m, &bo, &eo, o->ep, rt->ep_groups, rt->drafters, &rt->ep_rt, err))) goto fail;
        rt->engine = eg_ep_runtime_engine(rt->ep_rt, 0);
    } else if ((st = eg_engine_create(m, rt->be, &eo, &rt->engine, err))) goto fail;
    rt->stop_engine = rt->engine;
    rt->stop_ep = rt->ep_rt;
    /* what was chosen */
    eg_runtime_info *in = &rt->info;
    in->backend = backend;
    in->n_slots = n_slots;
    in->max_tokens = max_tokens;
    in->block_size = (int)block;
    in->kv_blocks = kv_blocks;
    in->kv_capacity = eg_engine_kv_capacity(rt->engine);
    in->kv_capacity_all = in->kv_capacity;
    if (rt->ep_rt) {
        in->kv_capacity_all = 0;
        for (int r = 0; r < o->ep; r++) in->kv_capacity_all += eg_engine_kv_capacity(eg_ep_runtime_engine(rt->ep_rt, r));
    }
    in->kv_watermark = eg_engine_kv_watermark(rt->engine);
    in->host_kv_bytes = host_kv;
    in->seq_host_bytes = seq_host;
    in->stage_ends = rt->stage_ends;
    in->stage_cuts = rt->stage_cuts;
    in->stage_device = rt->stage_device;
    in->stage_weight_bytes = rt->stage_bytes;
    in->transport = eg_engine_transport(rt->engine);
    {
        /* a rank's engine has its own slots (rank 0 the most) and caps its micro-batches there */
        int mb = o->micro_batches > n_stages ? o->micro_batches : n_stages;
        int slots = o->ep > 1 ? eg_ep_runtime_rank_slots(n_slots, o->ep, 0) : n_slots;
        in->micro_batches = mb < slots ? mb : slots;
    }
    in->ep = o->ep > 1 ? o->ep : 1;
    in->ep_groups = rt->ep_groups;
    in->experts_per_rank = c->n_experts / in->ep;
    in->ep_split = eo.ep_split;
    in->draft_state_bytes = o->drafter ? o->drafter->info.state_bytes : 0;
    for (int r = 0; r < rt->n_drafters; r++) in->draft_state_bytes += rt->drafters[r]->info.state_bytes;
    in->draft_weight_bytes = draft_w;
    in->draft_slot_bytes = draft_slot;
    in->draft_token_bytes = draft_tok;
    in->draft_device_bytes = draft_dev;
    in->n_drafters = rt->n_drafters; /* loaded here (a caller's drafter is not counted) */
    if (rt->n_drafters) {
        in->n_draft_aux = rt->drafters[0]->info.n_aux;
        in->draft_aux = rt->drafters[0]->info.aux_layers;
        in->draft_aux_source = eg_drafter_eagle3_aux_source(rt->drafters[0]);
    }
    note_after_load(rt, o);
    *out = rt;
    return EG_OK;
fail:
    eg_runtime_free(rt);
    return st;
}

eg_status eg_runtime_run(eg_runtime *rt, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err) {
    if (rt->fwd) return eg_fail(err, EG_ERR_INVALID, "runtime: a forward_only runtime has no engine to run");
    return rt->ep_rt ? eg_ep_runtime_run(rt->ep_rt, next, done, ctx, err) : eg_engine_run(rt->engine, next, done, ctx, err);
}

void eg_runtime_request_stop(eg_runtime *rt) {
    if (rt && rt->stop_ep) eg_ep_runtime_request_stop(rt->stop_ep); /* every rank: see ep_runtime.h */
    else if (rt && rt->stop_engine) eg_engine_request_stop(rt->stop_engine);
}

void eg_runtime_stats(const eg_runtime *rt, eg_engine_stats *s) {
    memset(s, 0, sizeof *s);
    if (!rt) return;
    if (rt->ep_rt) eg_ep_runtime_stats(rt->ep_rt, s);
    else if (rt->engine) eg_engine_get_stats(rt->engine, s);
}

void eg_runtime_graph_stats(const eg_runtime *rt, eg_forward_graph_stats *gs) {
    if (rt->fwd) eg_forward_get_graph_stats(rt->fwd, gs);
    else eg_engine_graph_stats(rt->engine, gs);
}

void eg_runtime_traffic(const eg_runtime *rt, int64_t *pairs, int64_t *bytes) {
    *pairs = *bytes = 0;
    if (rt && rt->ep_rt) eg_ep_runtime_traffic(rt->ep_rt, pairs, bytes);
}

const eg_runtime_info *eg_runtime_describe(const eg_runtime *rt) { return &rt->info; }
struct eg_ep_runtime *eg_runtime_ep_ranks(const eg_runtime *rt) { return rt ? rt->ep_rt : NULL; }
const eg_model *eg_runtime_model(const eg_runtime *rt) { return rt->m; }
eg_backend *eg_runtime_backend(const eg_runtime *rt) { return rt ? rt->be : NULL; }
eg_forward *eg_runtime_forward(const eg_runtime *rt) { return rt ? rt->fwd : NULL; }

eg_status eg_runtime_layout(const char *layout, const char *box_name, const char *model_dir, const char *backend,
                            int prefill, int whole_layers, double mean_len, int chunk, int batch, int *stages, int *ep,
                            int *ep_split, char *why, size_t why_n, eg_error *err) {
    eg_layout lay;
    eg_status st;
    if (why && why_n) why[0] = 0;
    if (strcmp(layout, "auto")) {
        if ((st = eg_layout_parse(layout, 0, &lay, err))) return eg_wrap(err, "--layout"), st;
        if (!eg_layout_split_runnable(lay.dense_split, backend))
            return eg_fail(err, EG_ERR_UNSUPPORTED, "--layout %s: the %s backend does not run the %s split", layout,
                           backend, eg_dense_split_name(lay.dense_split));
        if (!eg_layout_runnable(&lay, backend))
            return eg_fail(err, EG_ERR_UNSUPPORTED, "--layout %s: modelled only, the %s backend does not run it", layout,
                           backend);
    } else {
        eg_box box;
        eg_config cfg;
        if (!box_name)
            return eg_fail(err, EG_ERR_INVALID,
                           "--layout auto needs --box NAME (rtx-pro-6000x8 or h200x8: the figures it plans with; "
                           "`eaglegen plan --box NAME` shows every layout)");
        if ((st = eg_box_preset(box_name, &box, err))) return eg_wrap(err, "--box"), st;
        if ((st = eg_config_load(model_dir, &cfg, err))) return eg_wrap(err, "--layout auto"), st;
        eg_layout_opts lo = {.mean_len = mean_len, .prefill_chunk = chunk, .whole_layers = whole_layers,
                             .max_seqs = batch > 0 ? batch : 0, .max_seqs_per_rank = batch > 0 ? 0 : chunk};
        int max_rows = eg_layout_max_rows(box.gpus), n, best = -1;
        eg_layout_row *rows = calloc((size_t)max_rows, sizeof *rows);
        n = rows ? eg_layout_enumerate(&cfg, &box, &lo, rows, max_rows, err) : -1;
        for (int i = 0; i < n; i++) /* what this backend runs (plan's rows: the GPU box's view) */
            rows[i].runnable = eg_layout_runnable(&rows[i].lay, backend);
        if (n >= 0) best = eg_layout_recommend(rows, n, prefill);
        if (best < 0) {
            if (n >= 0) st = eg_fail(err, EG_ERR_INVALID, "--layout auto: no runnable layout fits this box (eaglegen plan --box)");
            else if (!rows) st = eg_fail(err, EG_ERR_NOMEM, "--layout auto: out of memory");
            else st = eg_wrap(err, "--layout auto");
            free(rows);
            eg_config_free(&cfg);
            return st ? st : EG_ERR_INVALID;
        }
        lay = rows[best].lay;
        if (why && why_n) {
            /* what the figure assumes, the run's own limits among it, and where --batch holds
               the run well below what the layout's cache would keep in flight */
            char lim[32];
            if (batch > 0) snprintf(lim, sizeof lim, "--batch %d", batch);
            else snprintf(lim, sizeof lim, "--batch auto, %d a rank", chunk);
            size_t k = 0;
            int w = snprintf(why, why_n, "--layout auto: %s on %s: modelled %.0f tok/s %s at mean length %.0f, %.0f "
                             "sequences in flight (%s), prefill chunks of %d rows", rows[best].name, box.name,
                             prefill ? rows[best].prefill_tok_s : rows[best].decode_tok_s, prefill ? "prefill" : "decode",
                             lo.mean_len, rows[best].concurrency, lim, chunk);
            if (w > 0) k = (size_t)w < why_n ? (size_t)w : why_n - 1;
            eg_layout_opts open = lo;
            open.max_seqs = open.max_seqs_per_rank = 0;
            eg_layout_row un;
            eg_error e2 = {0};
            if (!prefill && !eg_layout_model(&cfg, &box, &open, &lay, &un, &e2) && un.concurrency > 2 * rows[best].concurrency) {
                w = snprintf(why + k, why_n - k, "; its cache holds %.0f at this length: a larger --batch runs faster",
                             un.concurrency);
                if (w > 0) k += (size_t)w < why_n - k ? (size_t)w : why_n - k - 1;
            }
            if (!strcmp(backend, "cpu"))
                snprintf(why + k, why_n - k, " (the GPU box's figures; --backend cpu runs the layout on CPU ranks)");
        }
        free(rows);
        eg_config_free(&cfg);
    }
    *stages = lay.stages > 1 ? lay.stages : 1;
    *ep = lay.ep > 1 ? lay.ep : 1;
    if (ep_split) *ep_split = lay.ep > 1 ? (int)lay.dense_split : EG_SPLIT_NONE;
    return EG_OK;
}
