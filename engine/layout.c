/* Layouts and their roofline model; see layout.h. docs/perf_model.py mirrors every
 * formula here line for line (tests/t_plan_layouts.sh compares the two). */
#include "engine/layout.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan.h"

eg_status eg_box_link(const char *link, eg_box *b, eg_error *err) {
    if (!strcmp(link, "pcie")) { b->link_gbs = 25; b->link_us = 30; }
    else if (!strcmp(link, "nvlink")) { b->link_gbs = 450; b->link_us = 10; }
    else return eg_fail(err, EG_ERR_INVALID, "link '%s': expected pcie or nvlink", link);
    snprintf(b->link, sizeof b->link, "%s", link);
    return EG_OK;
}

eg_status eg_box_preset(const char *name, eg_box *b, eg_error *err) {
    memset(b, 0, sizeof *b);
    b->gpus = 8;
    b->frac = 0.92;
    b->eff = 0.6;
    if (!strcmp(name, "rtx-pro-6000x8")) {
        b->mem_gb = 96; b->act_gb = 3; b->hbm_tbs = 1.8; b->tflops = 500;
        eg_box_link("pcie", b, err);
    } else if (!strcmp(name, "h200x8")) {
        b->mem_gb = 141; b->act_gb = 4; b->hbm_tbs = 4.8; b->tflops = 990;
        eg_box_link("nvlink", b, err);
    } else {
        return eg_fail(err, EG_ERR_INVALID, "box '%s': expected rtx-pro-6000x8 or h200x8", name);
    }
    snprintf(b->name, sizeof b->name, "%s", name);
    return EG_OK;
}

/* One layer's parts, in bytes as stored and in multiply-adds per token. */
typedef struct layer_parts {
    double attn_b, router_b, mlp_b, expert_b; /* mlp: shared expert (MoE) or dense MLP */
    double attn_p, router_p, mlp_p, expert_p;
    int moe;
} layer_parts;

static layer_parts parts_of(const eg_config *c, int l) {
    layer_parts p = {0};
    double H = c->hidden, F = c->moe_inter;
    p.attn_b = (double)eg_plan_attn_bytes_cfg(c);
    p.attn_p = p.attn_b / 2;
    p.moe = eg_config_layer_is_moe(c, l);
    if (p.moe) {
        p.router_b = 2 * c->n_experts * H + 4.0 * c->n_experts;
        p.router_p = c->n_experts * H;
        p.mlp_b = 2 * 3 * H * F * c->n_shared;
        p.expert_b = (double)eg_plan_expert_bytes_cfg(c);
        p.expert_p = 3 * H * F;
    } else {
        p.mlp_b = 2 * 3 * H * c->inter;
    }
    p.mlp_p = p.mlp_b / 2;
    return p;
}

/* max(bytes / bw, flops / rate), adding the winning side to *hbm or *fl. */
static double part(double bytes, double flops, double bw, double rate, double *hbm, double *fl) {
    double tb = bytes / bw, tf = flops / rate;
    if (tb >= tf) { *hbm += tb; return tb; }
    *fl += tf;
    return tf;
}

double eg_layout_drafter_bytes(const eg_config *c, double *kv_token) {
    /* the public Kimi-K2.5 drafters' shape: the target's head count, heads of 128, no GQA */
    double H = c->hidden, NQ = c->n_heads, NKV = NQ, D = 128, I = c->inter, VD = 32000;
    if (kv_token) *kv_token = 2.0 * 2 * NKV * D;
    return 2 * (3 * H * H + 2 * H * NQ * D + 2 * 2 * H * NKV * D + NQ * D * H + 3 * H * I + VD * H + 4 * H);
}

static double hit(double E, double K, double tokens) { return tokens <= 0 || E <= 0 ? 0 : E * (1 - pow(1 - K / E, tokens)); }

/* Sequences in flight: what the cache holds (S), at most generate's --batch N box-wide,
 * or with --batch auto at most --chunk per expert-parallel rank (eg_plan_auto_slots). */
static double cap_seqs(const eg_layout_opts *o, double S, int E) {
    if (o->max_seqs > 0 && S > o->max_seqs) S = o->max_seqs;
    if (o->max_seqs_per_rank > 0 && S > (double)o->max_seqs_per_rank * E) S = (double)o->max_seqs_per_rank * E;
    return S;
}

/* One stage's time per micro-batch of b group tokens (r = b / E per GPU), decode
 * (ctx = cached tokens per sequence) or prefill (keys = mean keys per query). */
typedef struct stage_time { double t, hbm, fl, comm; } stage_time;

/* What a stage reads, computes and exchanges, summed over its layers' parts. */
typedef struct step_acc { double fixed_b, fixed_f, ffn_b, ffn_f, exp_b, exp_f, comm; } step_acc;

/* Layer p's terms on a stage: its attention and router (attn), its shared expert / dense
 * MLP (ffn), and the share fr of its routed experts (1, or a layer split between two stages:
 * cut / E on the side with the attention, (E - cut) / E on the other). The routed exchange
 * moves the rows and contributions of the pairs in the share (K fr experts per token). */
static void layer_terms(const layer_parts *p, int attn, int ffn, double fr, double E, double K, double hits, double r,
                        double b, double q, int own, double away, double H, double lat, double link, step_acc *a) {
    if (attn) {
        a->fixed_b += p->attn_b + p->router_b;
        a->fixed_f += 4 * r * q * (p->attn_p + p->router_p);
    }
    if (ffn && own) { /* the owner reads the whole FFN and runs it on every group row; the layer waits for it */
        a->ffn_b += p->mlp_b;
        a->ffn_f += 4 * b * q * p->mlp_p;
    } else if (ffn) {
        a->fixed_b += p->mlp_b;
        a->fixed_f += 4 * r * q * p->mlp_p;
    }
    if (p->moe) {
        /* rows a token sends to / receives from other GPUs for its routed experts (FP32) */
        double kf = K * fr, disp = (E - 1) * (1 - pow(1 - 1 / E, kf)), ret = kf * (E - 1) / E;
        a->exp_b += hits * p->expert_b / E * fr;
        a->exp_f += 4 * b * q * K * p->expert_p / E * fr;
        if (E > 1) a->comm += 2 * lat + (r * q * (disp + ret) + (ffn ? 2 * away : 0)) * H * 4 / link; /* the owner's link */
    } else if (own && ffn) {
        a->comm += 2 * lat + 2 * away * H * 4 / link; /* a dense layer's own exchange */
    }
}

/* hc > 0: the stage begins with layer l0 - 1's experts [hc, E) and its shared expert (the
 * previous stage ends inside that layer); tc > 0: its last layer runs experts [0, tc) and
 * hands the partial sum over (3H + 2K floats a row). */
static stage_time stage_step(const eg_config *c, const eg_box *box, const layer_parts *lp, int l0, int l1, int hc,
                             int tc, int first, int last, double E, eg_dense_split split, double b, int prefill,
                             double len, double q) {
    /* q: target rows per sequence (k + 1 when verifying k drafts, else 1): every row is
     * computed and exchanged, the cache is read once per sequence */
    stage_time s = {0};
    double bw = box->hbm_tbs * 1e12 * box->eff, rate = box->tflops * 1e12 * box->eff;
    double H = c->hidden, K = c->topk, NE = c->n_experts, NH = c->n_heads, C = c->kv_lora_rank, DR = c->qk_rope;
    double kvb = 2 * (C + DR), r = b / E, lat = box->link_us * 1e-6, link = box->link_gbs * 1e9;
    double kv_b = 0, kv_f = 0;
    double nl = l1 - l0, hits = hit(NE, K, b * q);
    int own = split != EG_SPLIT_NONE && E > 1; /* each layer's FFN on one rank */
    /* +ffn: the rows the layer's owner receives, and sends back, per layer: the group's rows
     * that live on the other ranks */
    double away = own ? b * q * (E - 1) / E : 0;
    step_acc a = {0};
    if (hc > 0) layer_terms(&lp[l0 - 1], 0, 1, (NE - hc) / NE, E, K, hits, r, b, q, own, away, H, lat, link, &a);
    for (int l = l0; l < l1; l++) {
        int tail = tc > 0 && l == l1 - 1;
        layer_terms(&lp[l], 1, !tail, tail ? tc / NE : 1, E, K, hits, r, b, q, own, away, H, lat, link, &a);
    }
    double fixed_b = a.fixed_b, fixed_f = a.fixed_f, ffn_b = a.ffn_b, ffn_f = a.ffn_f, exp_b = a.exp_b, exp_f = a.exp_f;
    double comm = a.comm;
    if (prefill) {
        double keys = (len + 1) / 2;
        kv_b = r * nl * kvb;
        kv_f = 4 * r * nl * NH * (c->qk_nope + c->qk_rope + c->v_head) * keys;
    } else {
        kv_b = r * len * nl * kvb;
        kv_f = r * q * len * nl * 4 * NH * (2 * C + DR);
    }
    int vocab = split == EG_SPLIT_ALL && E > 1;
    /* +split: the token ids to their vocab-range owners, the BF16 embedding rows (exact
     * weight rows) back */
    if (first && vocab) comm += 2 * lat + r * q * (E - 1) / E * H * 2 / link;
    if (last) {
        double V = c->vocab;
        fixed_b += (vocab ? 2 * V * H / E : 2 * V * H) + 2 * H;
        fixed_f += 4 * r * q * V * H; /* +split: every group row times V / E columns, the same FLOPs */
        /* +split: the FP32 final rows to every rank (all-gather), each rank's FP32 logit slices
         * to the rows' owners */
        if (vocab) comm += 2 * lat + r * q * (E - 1) * 4 * (H + V / E) / link;
    }
    s.t = part(fixed_b, fixed_f, bw, rate, &s.hbm, &s.fl) + part(ffn_b, ffn_f, bw, rate, &s.hbm, &s.fl) +
          part(exp_b, exp_f, bw, rate, &s.hbm, &s.fl) + part(kv_b, kv_f, bw, rate, &s.hbm, &s.fl);
    if (!last && box->gpus > E) comm += lat + r * q * (tc > 0 ? 3 * H + 2 * K : H) * 4 / link; /* hand-over */
    s.comm = comm;
    s.t += comm;
    return s;
}

/* The KV tokens per rank of stages split at ends ([P]) and cuts ([P]; NULL: whole layers),
 * as the heaviest rank holds them: stage s has the attention of layers [ends[s-1], ends[s]),
 * each range of routed experts shared out over the E ranks (the heaviest share ceil(n / E);
 * a layer split at cut: [0, cut) beside its attention, [cut, E) on the next stage), and the
 * FFNs of the layers whose FFN runs there (a split layer's after the cut), on their owners
 * with own (rank j the layers l = j mod E). The first stage holds the embedding, the last
 * the head and a drafter (its weights, and its cache per token beside the layers'). The
 * smallest stage's tokens; *wmax its heaviest stage's bytes. */
static double pool_of(const eg_config *c, const layer_parts *lp, const int *ends, const int *cuts, int P, int E, int own,
                      double usable, double head_w, double tail_w, double dw, double kvb, double dkv, double *wmax) {
    double NE = c->n_experts, min_tok = -1;
    *wmax = 0;
    for (int s = 0, b0 = 0; s < P; b0 = ends[s], s++) {
        int hc = s && cuts ? cuts[s - 1] : 0, tc = s < P - 1 && cuts ? cuts[s] : 0, end = ends[s];
        double w = (s == 0 ? head_w : 0) + (s == P - 1 ? tail_w : 0), ffn_max = 0;
        for (int l = b0; l < end; l++)
            w += lp[l].attn_b + lp[l].router_b + (lp[l].moe ? ceil((tc && l == end - 1 ? tc : NE) / E) : 0) * lp[l].expert_b;
        if (hc) w += ceil((NE - hc) / E) * lp[b0 - 1].expert_b;
        for (int j = 0; j < (own ? E : 1); j++) {
            double f = 0;
            for (int l = hc ? b0 - 1 : b0; l < end - (tc > 0); l++)
                if (!own || l % E == j) f += lp[l].mlp_b;
            if (f > ffn_max) ffn_max = f;
        }
        w += ffn_max;
        int hold = s == P - 1;
        double freeb = usable - w - (hold ? dw : 0);
        double tok = freeb > 0 ? floor(freeb / ((end - b0) * kvb + (hold ? dkv : 0))) : 0;
        if (w > *wmax) *wmax = w;
        if (min_tok < 0 || tok < min_tok) min_tok = tok;
    }
    return min_tok;
}

/* Tokens per rank of the layer split (eg_layout_opts.whole_layers 0): eg_plan_split_kv over
 * a rank's units (1/E of each routed expert; with own each shared expert / dense MLP on its
 * owner, so a stage counts its heaviest rank), every stage's budget its GPU's usable memory less the embedding (stage 0), the head
 * and the drafter's weights (the last, whose cache grows by the drafter's per token); then
 * that split as the heaviest rank holds it (pool_of), as the runtime's memory plan counts
 * it. 0 when none fits; the split in out_ends / out_cuts ([P]) and its heaviest stage's
 * bytes in *out_w. */
static int64_t split_tokens(const eg_config *c, const layer_parts *lp, int L, int P, int E, int own, double usable,
                            double head_w, double tail_w, double dw, double kvb, double dkv, int *out_ends,
                            int *out_cuts, double *out_w) {
    eg_plan_layer_parts *parts = calloc((size_t)L, sizeof *parts);
    int64_t *budget = calloc((size_t)P, sizeof *budget), x = 0;
    int *ends = calloc((size_t)P, sizeof *ends), *cuts = calloc((size_t)P, sizeof *cuts);
    double min_tok = 0;
    *out_w = 0;
    if (parts && budget && ends && cuts) {
        for (int l = 0; l < L; l++) { /* with own each FFN on its owner alone, a dense one too */
            parts[l].n_experts = lp[l].moe ? c->n_experts : 0;
            parts[l].attn = (int64_t)(lp[l].attn_b + lp[l].router_b + (lp[l].moe || own ? 0 : lp[l].mlp_b));
            parts[l].expert = lp[l].moe ? (int64_t)ceil(lp[l].expert_b / E) : 0;
            parts[l].shared = lp[l].moe || own ? (int64_t)lp[l].mlp_b : 0;
            parts[l].owner = own ? l % E + 1 : 0;
        }
        for (int s = 0; s < P; s++)
            budget[s] = (int64_t)floor(usable - (s == 0 ? head_w : 0) - (s == P - 1 ? tail_w + dw : 0));
        eg_error ignored;
        if (!eg_plan_split_kv(parts, L, budget, P, (int64_t)kvb, (int64_t)dkv, 1, ends, cuts, &x, &ignored))
            min_tok = pool_of(c, lp, ends, cuts, P, E, own, usable, head_w, tail_w, dw, kvb, dkv, out_w);
        memcpy(out_ends, ends, sizeof(int) * (size_t)P);
        memcpy(out_cuts, cuts, sizeof(int) * (size_t)P);
    }
    free(parts); free(budget); free(ends); free(cuts);
    return min_tok > 0 ? (int64_t)min_tok : 0;
}

static const char *bound_of(double hbm, double fl, double comm) {
    return comm >= hbm && comm >= fl ? "link" : fl > hbm ? "compute" : "hbm";
}

static const char *split_suffix(eg_dense_split s) {
    return s == EG_SPLIT_FFN ? "+ffn" : s == EG_SPLIT_ALL ? "+split" : "";
}

const char *eg_dense_split_name(eg_dense_split s) {
    return s == EG_SPLIT_FFN ? "ffn" : s == EG_SPLIT_ALL ? "all" : "none";
}

int eg_layout_split_runnable(eg_dense_split s, const char *backend) {
    switch (s) {
    case EG_SPLIT_NONE: return 1; /* EP groups run on CPU ranks (local exchange) and CUDA ranks (NCCL) */
    case EG_SPLIT_FFN: (void)backend; return 1; /* CPU ranks (local exchange) and CUDA ranks (nccl, cuda-local) */
    case EG_SPLIT_ALL: (void)backend; return 1; /* the vocab split too: CPU ranks and CUDA ranks (nccl, cuda-local) */
    }
    return 0;
}

int eg_layout_runnable(const eg_layout *lay, const char *backend) {
    if (lay->kind == EG_LAYOUT_TP) return 0;
    /* ppPxepE runs as stage groups (ep_runtime.h): on CUDA one GPU per rank and stage */
    return eg_layout_split_runnable(lay->dense_split, backend);
}

int eg_layout_max_rows(int gpus) { return 3 * (gpus > 0 ? gpus : 0) + 2; }

static void layout_name(const eg_layout *l, int gpus, char *out, size_t n) {
    if (l->kind == EG_LAYOUT_TP) snprintf(out, n, "tp%d", gpus);
    else if (l->ep == 1) snprintf(out, n, "pp%d", l->stages);
    else if (l->stages == 1) snprintf(out, n, "ep%d%s", l->ep, split_suffix(l->dense_split));
    else snprintf(out, n, "pp%dxep%d%s", l->stages, l->ep, split_suffix(l->dense_split));
}

static eg_status layout_model_one(const eg_config *c, const eg_box *box, const eg_layout_opts *o,
                                  const eg_layout *lay, eg_layout_row *row, eg_error *err) {
    memset(row, 0, sizeof *row);
    row->lay = *lay;
    layout_name(lay, box->gpus, row->name, sizeof row->name);
    int L = c->n_layers, G = box->gpus;
    double wm = o->watermark > 0 ? o->watermark : 0.01, len = o->mean_len;
    double chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 8192;
    double usable = box->mem_gb * 1e9 * box->frac - box->act_gb * 1e9;
    double kvb = 2.0 * (c->kv_lora_rank + c->qk_rope), H = c->hidden, V = c->vocab;
    double emb_b = 2 * V * H, tail_b = 2 * H + (c->tie_embeddings ? 0 : emb_b);
    if (G < 1 || len < 1) return eg_fail(err, EG_ERR_INVALID, "layout model: %d GPUs, mean length %g", G, len);
    int k = o->draft_tokens;
    double acc = k > 0 ? o->accept : 1, q = k + 1.0, dkv = 0, dw = 0;
    if (k < 0 || (k > 0 && (acc < 1 || acc > k + 1)))
        return eg_fail(err, EG_ERR_INVALID, "layout model: %d draft tokens with %g tokens per verify pass (1..k+1)", k,
                       acc);
    if (o->draft_cache_bytes < 0 || o->draft_weight_bytes < 0)
        return eg_fail(err, EG_ERR_INVALID, "layout model: a drafter cache of %g bytes per token, weights of %g bytes",
                       o->draft_cache_bytes, o->draft_weight_bytes);
    if (k > 0) dw = eg_layout_drafter_bytes(c, &dkv);
    if (k > 0 && o->draft_cache_bytes > 0) dkv = o->draft_cache_bytes;
    if (k > 0 && o->draft_weight_bytes > 0) dw = o->draft_weight_bytes;
    layer_parts *lp = malloc(sizeof *lp * (size_t)L);
    double *cost = malloc(sizeof *cost * (size_t)L);
    size_t np = (size_t)(lay->stages > 0 ? lay->stages : 1);
    int *ends = malloc(sizeof *ends * np), *cuts = calloc(np, sizeof *cuts);
    int *sends = malloc(sizeof *sends * np), *scuts = calloc(np, sizeof *scuts);
    if (!lp || !cost || !ends || !cuts || !sends || !scuts) {
        free(lp); free(cost); free(ends); free(cuts); free(sends); free(scuts);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    for (int l = 0; l < L; l++) lp[l] = parts_of(c, l);
    eg_status st = EG_OK;
    if (lay->kind == EG_LAYOUT_TP) {
        double total = emb_b + tail_b, fixed_b = 0, fixed_p = 0, exp_b = 0, exp_p = 0, nmoe = 0;
        for (int l = 0; l < L; l++) {
            total += lp[l].attn_b + lp[l].router_b + lp[l].mlp_b + c->n_experts * lp[l].expert_b;
            fixed_b += lp[l].attn_b + lp[l].router_b + lp[l].mlp_b;
            fixed_p += lp[l].attn_p + lp[l].router_p + lp[l].mlp_p;
            if (lp[l].moe) { exp_b += lp[l].expert_b; exp_p += lp[l].expert_p; nmoe++; }
        }
        fixed_b += emb_b + 2 * H; /* lm_head (or the tied embedding) and the final norm */
        fixed_p += V * H;
        row->weights_gb = total / G / 1e9;
        double freeb = usable - (total + dw) / G; /* a drafter is split like the target */
        double tok = freeb > 0 ? floor(freeb / (L * kvb + dkv / G)) : 0;
        row->kv_tokens = (int64_t)tok;
        double S = cap_seqs(o, tok * (1 - wm) / len, 1);
        row->concurrency = S;
        row->fits = S >= 1;
        double bw = box->hbm_tbs * 1e12 * box->eff, rate = box->tflops * 1e12 * box->eff;
        double lat = box->link_us * 1e-6, link = box->link_gbs * 1e9, K = c->topk, NE = c->n_experts;
        double NH = c->n_heads, C = c->kv_lora_rank, DR = c->qk_rope;
        for (int pf = 0; pf < 2; pf++) {
            double T = pf ? chunk : S, hb = 0, fl = 0, Q = pf ? 1 : q;
            double t = part(fixed_b / G, 4 * T * Q * fixed_p / G, bw, rate, &hb, &fl);
            t += part(hit(NE, K, T * Q) * exp_b / G, 4 * T * Q * K * exp_p / G, bw, rate, &hb, &fl);
            if (pf) t += part(T * L * kvb, 4 * T * L * NH * (c->qk_nope + c->qk_rope + c->v_head) * (len + 1) / 2 / G,
                              bw, rate, &hb, &fl);
            else t += part(T * len * L * kvb, T * Q * len * L * 4 * NH * (2 * C + DR) / G, bw, rate, &hb, &fl);
            double comm = 2 * L * (lat + 2.0 * (G - 1) / G * T * Q * H * 2 / link); /* two BF16 all-reduces per layer */
            t += comm;
            if (!pf && k > 0) { /* the drafter on the whole batch (TP: split like the target) */
                double dt = k * part(dw / G + T * len * dkv / G, 4 * T * dw / 2 / G, bw, rate, &hb, &fl);
                row->draft_ms = dt * 1e3;
                t += dt;
            }
            if (pf) { row->prefill_tok_s = row->fits ? T / t : 0; row->prefill_bound = bound_of(hb, fl, comm); }
            else {
                row->decode_tok_s = row->fits ? S * acc / t : 0;
                row->decode_step_ms = t * 1e3;
                row->comm_ms = comm * 1e3;
                row->decode_bound = bound_of(hb, fl, comm);
            }
        }
        row->runnable = 0;
        goto out;
    }
    int P = lay->stages, E = lay->ep;
    eg_dense_split split = lay->dense_split;
    if (P < 1 || E < 1 || P * E != G || P > L || c->n_experts % E || (E > 1 && c->n_experts < 1) || (int)split < (int)EG_SPLIT_NONE || (int)split > (int)EG_SPLIT_ALL ||
        (split != EG_SPLIT_NONE && E == 1)) {
        st = eg_fail(err, EG_ERR_INVALID,
                     "layout %s: needs stages x ep = %d GPUs, stages <= %d layers, ep dividing %d experts, a dense "
                     "split only with ep > 1",
                     row->name, G, L, c->n_experts);
        goto out;
    }
    int own = split != EG_SPLIT_NONE;
    double fshare = own ? 1.0 / E : 1.0, vshare = split == EG_SPLIT_ALL ? 1.0 / E : 1.0;
    /* a tied head shares the embedding's bytes only where one stage holds both */
    double head_w = emb_b * vshare, tail_w = 2 * H + (c->tie_embeddings && P <= 1 ? 0 : emb_b * vshare);
    /* the whole-layer split balances the average rank; the memory below is each rank's own */
    for (int l = 0; l < L; l++)
        cost[l] = lp[l].attn_b + lp[l].router_b + lp[l].mlp_b * fshare + c->n_experts * lp[l].expert_b / E;
    /* a drafter sits on the last stage's GPUs (below): its weights count in that stage's share */
    if ((st = eg_plan_split(cost, L, head_w, tail_w + dw, P, ends, err))) goto out;
    /* whole layers; a drafter lives on the last stage's GPUs, beside lm_head: its weights and
     * the cache of each GPU's own sequences */
    double wmax = 0, min_tok = pool_of(c, lp, ends, NULL, P, E, own, usable, head_w, tail_w, dw, kvb, dkv, &wmax);
    if (P > 1 && !o->whole_layers) { /* stages may end inside a layer where that holds more: that split's
                                           stages, memory and times */
        double sw = 0;
        double x = (double)split_tokens(c, lp, L, P, E, own, usable, head_w, tail_w, dw, kvb, dkv, sends, scuts, &sw);
        if (x > min_tok) {
            min_tok = x;
            wmax = sw;
            memcpy(ends, sends, sizeof *ends * (size_t)P);
            memcpy(cuts, scuts, sizeof *cuts * (size_t)P);
        }
    }
    row->weights_gb = wmax / 1e9;
    row->kv_tokens = (int64_t)(E * min_tok);
    double S = cap_seqs(o, (double)row->kv_tokens * (1 - wm) / len, E);
    row->concurrency = S;
    row->fits = S >= 1;
    row->comm_bytes_token_layer =
        E > 1 ? H * 4 * ((E - 1) * (1 - pow(1 - 1.0 / E, c->topk)) + c->topk * (E - 1.0) / E +
                         (own ? 2 * (E - 1.0) / E : 0))
              : 0;
    for (int pf = 0; pf < 2; pf++) {
        double b = pf ? chunk * E : S / P; /* group tokens per micro-batch */
        stage_time worst = {0};
        for (int s = 0, b0 = 0; s < P; b0 = ends[s], s++) {
            stage_time t = stage_step(c, box, lp, b0, ends[s], s ? cuts[s - 1] : 0, s < P - 1 ? cuts[s] : 0, s == 0,
                                      s == P - 1, E, split, b, pf, len, pf ? 1 : q);
            if (!pf && k > 0 && s == P - 1) { /* the drafter runs where the logits are, on its micro-batch */
                double bw = box->hbm_tbs * 1e12 * box->eff, rate = box->tflops * 1e12 * box->eff, r = b / E;
                double dt = k * part(dw + r * len * dkv, 4 * r * dw / 2, bw, rate, &t.hbm, &t.fl);
                row->draft_ms = dt * 1e3;
                t.t += dt;
            }
            if (t.t > worst.t) worst = t;
        }
        if (pf) {
            row->prefill_tok_s = row->fits ? b / worst.t : 0;
            row->prefill_bound = bound_of(worst.hbm, worst.fl, worst.comm);
        } else {
            row->decode_tok_s = row->fits ? S * acc / (P * worst.t) : 0;
            row->decode_step_ms = worst.t * 1e3;
            row->comm_ms = worst.comm * 1e3;
            row->decode_bound = bound_of(worst.hbm, worst.fl, worst.comm);
        }
    }
    row->runnable = eg_layout_runnable(lay, NULL);
out:
    free(lp); free(cost); free(ends); free(cuts); free(sends); free(scuts);
    return st;
}

/* Prefill is capture mode, which runs without a drafter: with draft_tokens its figures are
 * the plain row's (the drafter's memory would move the stage split). */
eg_status eg_layout_model(const eg_config *c, const eg_box *box, const eg_layout_opts *o, const eg_layout *lay,
                          eg_layout_row *row, eg_error *err) {
    eg_status st = layout_model_one(c, box, o, lay, row, err);
    if (st || o->draft_tokens <= 0) return st;
    eg_layout_opts po = *o;
    po.draft_tokens = 0;
    po.accept = 1;
    eg_layout_row plain;
    if ((st = layout_model_one(c, box, &po, lay, &plain, err))) return st;
    row->prefill_tok_s = plain.prefill_tok_s;
    row->prefill_bound = plain.prefill_bound;
    return EG_OK;
}

int eg_layout_enumerate(const eg_config *c, const eg_box *box, const eg_layout_opts *o, eg_layout_row *rows,
                        int max_rows, eg_error *err) {
    int n = 0, G = box->gpus;
    for (int P = G; P >= 1; P--) {
        if (G % P || P > c->n_layers) continue;
        int E = G / P;
        if (c->n_experts % E || (E > 1 && c->n_experts < 1)) continue; /* no routed experts: no group */
        for (int split = EG_SPLIT_NONE; split <= (E > 1 ? EG_SPLIT_ALL : EG_SPLIT_NONE); split++) {
            if (n >= max_rows) return eg_fail(err, EG_ERR_INVALID, "more than %d layouts", max_rows), -1;
            eg_layout lay = {EG_LAYOUT_PP_EP, P, E, (eg_dense_split)split};
            if (eg_layout_model(c, box, o, &lay, &rows[n], err)) return -1;
            n++;
        }
    }
    if (G > 1) {
        if (n >= max_rows) return eg_fail(err, EG_ERR_INVALID, "more than %d layouts", max_rows), -1;
        eg_layout lay = {EG_LAYOUT_TP, 1, 1, 0};
        if (eg_layout_model(c, box, o, &lay, &rows[n], err)) return -1;
        n++;
    }
    return n;
}

int eg_layout_recommend(const eg_layout_row *rows, int n, int prefill) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!rows[i].runnable || !rows[i].fits) continue;
        double v = prefill ? rows[i].prefill_tok_s : rows[i].decode_tok_s;
        if (best < 0 || v > (prefill ? rows[best].prefill_tok_s : rows[best].decode_tok_s)) best = i;
    }
    return best;
}

/* "KEY" then decimal digits (no sign, no blank, at most 4096: the largest --stages and
 * --ep take) at *p: advances *p past them, 0 if absent or out of range. */
static int layout_num(const char **p, const char *key, int *v) {
    size_t k = strlen(key);
    if (strncmp(*p, key, k) || !isdigit((unsigned char)(*p)[k])) return 0;
    const char *q = *p + k;
    long x = 0;
    while (isdigit((unsigned char)*q) && x <= 4096) x = 10 * x + (*q++ - '0');
    if (x > 4096 || isdigit((unsigned char)*q)) return 0;
    *v = (int)x;
    *p = q;
    return 1;
}

eg_status eg_layout_parse(const char *s, int gpus, eg_layout *out, eg_error *err) {
    int P = 1, E = 1;
    eg_dense_split split = EG_SPLIT_NONE;
    const char *rest = NULL, *q = s;
    memset(out, 0, sizeof *out);
    if (layout_num(&q, "pp", &P)) {
        if (*q == 'x') { /* ppPxepE */
            q++;
            if (!layout_num(&q, "ep", &E)) q = NULL;
        }
    } else if (!layout_num(&q, "ep", &E)) q = NULL;
    rest = q;
    if (rest && !strcmp(rest, "+ffn")) split = EG_SPLIT_FFN, rest = "";
    else if (rest && !strcmp(rest, "+split")) split = EG_SPLIT_ALL, rest = "";
    if (!rest || *rest || P < 1 || E < 1 || (gpus > 0 && P * E != gpus) || (split && E == 1)) {
        char n_gpus[48] = "";
        if (gpus > 0) snprintf(n_gpus, sizeof n_gpus, " (P x E = %d GPUs)", gpus);
        return eg_fail(err, EG_ERR_INVALID,
                       "layout '%s': expected ppP, epE, ppPxepE%s, with +ffn or +split after an epE, or auto", s,
                       n_gpus);
    }
    out->kind = EG_LAYOUT_PP_EP;
    out->stages = P;
    out->ep = E;
    out->dense_split = split;
    return EG_OK;
}
