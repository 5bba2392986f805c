/* Stage splitting and memory planning; see plan.h. */
#include "engine/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t eg_plan_layer_bytes(const eg_model *m, int l) {
    const eg_layer_w *L = &m->layers[l];
    const eg_weight *ws[] = {&L->attn_norm, &L->ffn_norm, &L->q_a, &L->q_a_norm, &L->q_b, &L->q, &L->kv_a,
                             &L->kv_a_norm, &L->kv_b, &L->o, &L->mlp_gate, &L->mlp_up, &L->mlp_down,
                             &L->router, &L->router_bias, &L->sh_gate, &L->sh_up, &L->sh_down};
    int64_t b = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        if (ws[i]->fmt != EG_W_NONE) b += eg_weight_bytes(ws[i]);
    if (L->is_moe && L->experts)
        for (int e = 0; e < m->cfg.n_experts; e++)
            b += eg_weight_bytes(&L->experts[e].gate) + eg_weight_bytes(&L->experts[e].up) +
                 eg_weight_bytes(&L->experts[e].down);
    return b;
}

int64_t eg_plan_head_bytes(const eg_model *m, int64_t *tail) {
    *tail = eg_weight_bytes(&m->final_norm) + (m->cfg.tie_embeddings ? 0 : eg_weight_bytes(&m->lm_head));
    return eg_weight_bytes(&m->embed);
}

static int64_t expert_matrix_bytes(const eg_config *c, int64_t rows, int64_t cols) {
    switch (c->expert_format) {
    case EG_EXPERTS_INT4: return rows * cols / 2 + rows * (cols / (c->quant_group > 0 ? c->quant_group : 32)) * 2;
    case EG_EXPERTS_FP8_BLOCK: return rows * cols + ((rows + 127) / 128) * ((cols + 127) / 128) * 4;
    default: return rows * cols * 2;
    }
}

int64_t eg_plan_attn_bytes_cfg(const eg_config *c) {
    int64_t H = c->hidden, NH = c->n_heads, QL = c->q_lora_rank, C = c->kv_lora_rank;
    int64_t DQ = NH * (c->qk_nope + c->qk_rope), W = C + c->qk_rope;
    int64_t b = 2 * H * 2; /* two norms */
    b += QL > 0 ? 2 * (QL * H + QL + DQ * QL) : 2 * DQ * H;
    b += 2 * (W * H + C + NH * (c->qk_nope + c->v_head) * C + H * NH * c->v_head);
    return b;
}

int64_t eg_plan_expert_bytes_cfg(const eg_config *c) {
    int64_t H = c->hidden, F = c->moe_inter;
    return 2 * expert_matrix_bytes(c, F, H) + expert_matrix_bytes(c, H, F);
}

int64_t eg_plan_layer_bytes_cfg(const eg_config *c, int l) {
    int64_t H = c->hidden, F = c->moe_inter;
    int64_t b = eg_plan_attn_bytes_cfg(c);
    if (eg_config_layer_is_moe(c, l)) {
        b += 2 * (int64_t)c->n_experts * H + 4 * (int64_t)c->n_experts; /* router, bias */
        b += (int64_t)c->n_experts * eg_plan_expert_bytes_cfg(c);
        b += 2 * 3 * H * F * c->n_shared;
    } else {
        b += 2 * 3 * H * (int64_t)c->inter;
    }
    return b;
}

int64_t eg_plan_head_bytes_cfg(const eg_config *c, int64_t *tail) {
    int64_t e = 2 * (int64_t)c->vocab * c->hidden;
    *tail = 2 * (int64_t)c->hidden + (c->tie_embeddings ? 0 : e);
    return e;
}

int64_t eg_plan_kv_bytes_per_token_layer(const eg_config *c) { return 2 * (int64_t)(c->kv_lora_rank + c->qk_rope); }

eg_status eg_plan_split(const double *cost, int L, double first, double last, int n, int *ends, eg_error *err) {
    if (n < 1 || n > L) return eg_fail(err, EG_ERR_INVALID, "cannot split %d layers into %d stages", L, n);
    /* best[k][j]: minimal largest-stage cost placing layers [0, j) into k stages */
    double *pre = malloc(sizeof(double) * (size_t)(L + 1));
    double *best = malloc(sizeof(double) * (size_t)(n + 1) * (size_t)(L + 1));
    int *cut = malloc(sizeof(int) * (size_t)(n + 1) * (size_t)(L + 1));
    if (!pre || !best || !cut) { free(pre); free(best); free(cut); return eg_fail(err, EG_ERR_NOMEM, "out of memory"); }
    pre[0] = 0;
    for (int l = 0; l < L; l++) pre[l + 1] = pre[l] + cost[l];
#define B(k, j) best[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
#define CUT(k, j) cut[(size_t)(k) * (size_t)(L + 1) + (size_t)(j)]
    for (int j = 0; j <= L; j++) B(1, j) = j ? pre[j] + first + (n == 1 ? last : 0) : 1e300;
    for (int k = 2; k <= n; k++)
        for (int j = 0; j <= L; j++) {
            B(k, j) = 1e300;
            CUT(k, j) = -1;
            for (int i = k - 1; i < j; i++) { /* stage k holds [i, j) */
                double stage = pre[j] - pre[i] + (k == n && j == L ? last : 0);
                double v = B(k - 1, i) > stage ? B(k - 1, i) : stage;
                if (v < B(k, j)) { B(k, j) = v; CUT(k, j) = i; }
            }
        }
    int j = L;
    for (int k = n; k >= 1; k--) {
        ends[k - 1] = j;
        if (k > 1) j = CUT(k, j);
    }
#undef B
#undef CUT
    free(pre);
    free(best);
    free(cut);
    return EG_OK;
}

void eg_plan_memory(const eg_config *c, const int64_t *layer_bytes, int64_t head, int64_t tail, const int *ends, int n,
                    int64_t device_bytes, double fraction, int64_t act_bytes, eg_stage_mem *st) {
    int begin = 0;
    int64_t per_layer = eg_plan_kv_bytes_per_token_layer(c);
    for (int k = 0; k < n; k++) {
        eg_stage_mem *s = &st[k];
        s->begin = begin;
        s->end = ends[k];
        s->weight_bytes = (k == 0 ? head : 0) + (k == n - 1 ? tail : 0);
        for (int l = begin; l < ends[k]; l++) s->weight_bytes += layer_bytes[l];
        s->kv_bytes_per_token = per_layer * (ends[k] - begin);
        s->free_bytes = (int64_t)((double)device_bytes * fraction) - s->weight_bytes - act_bytes;
        s->kv_tokens = s->free_bytes > 0 && s->kv_bytes_per_token > 0 ? s->free_bytes / s->kv_bytes_per_token : 0;
        begin = ends[k];
    }
}

/* ---- roofline accounting ------------------------------------------------------ */

static double elems(const eg_weight *w) { return w->fmt == EG_W_NONE ? 0 : (double)w->rows * (double)w->cols; }
static double wbytes(const eg_weight *w) { return w->fmt == EG_W_NONE ? 0 : (double)eg_weight_bytes(w); }

/* One layer's always-read weights (everything except routed experts): bytes, and the
 * multiply-adds per token of its projections (kv_b counted once: absorbed or expanded,
 * each token passes through W_UK and W_UV once). */
static void layer_fixed(const eg_model *m, int l, double *bytes, double *madds) {
    const eg_layer_w *L = &m->layers[l];
    const eg_weight *ws[] = {&L->attn_norm, &L->ffn_norm, &L->q_a, &L->q_a_norm, &L->q_b, &L->q, &L->kv_a,
                             &L->kv_a_norm, &L->kv_b, &L->o, &L->mlp_gate, &L->mlp_up, &L->mlp_down,
                             &L->router, &L->router_bias, &L->sh_gate, &L->sh_up, &L->sh_down};
    *bytes = *madds = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        *bytes += wbytes(ws[i]);
        if (ws[i]->rows > 1) *madds += elems(ws[i]);
    }
}

static void expert_size(const eg_model *m, int l, double *bytes, double *madds) {
    const eg_layer_w *L = &m->layers[l];
    *bytes = *madds = 0;
    if (!L->is_moe || !L->experts) return;
    const eg_expert_w *x = &L->experts[0];
    *bytes = wbytes(&x->gate) + wbytes(&x->up) + wbytes(&x->down);
    *madds = elems(&x->gate) + elems(&x->up) + elems(&x->down);
}

static void head_cost(const eg_model *m, int l0, int l1, double tokens, double logit_rows, eg_step_cost *o) {
    const eg_config *c = &m->cfg;
    if (l0 == 0) o->weight_bytes += tokens * (double)c->hidden * (double)eg_weight_bytes(&m->embed) /
                                    (elems(&m->embed) > 0 ? elems(&m->embed) : 1);
    if (l1 == c->n_layers) {
        o->weight_bytes += wbytes(&m->final_norm) + wbytes(&m->lm_head);
        o->flops += 2.0 * logit_rows * elems(&m->lm_head);
    }
}

/* What the two costs share: T tokens through layers [l0, l1) (every projection, the
 * routed experts expected to be hit), plus per layer the given attention FLOPs per token
 * and cache bytes read; the head with logit_rows rows of lm_head. */
static void step_cost(const eg_model *m, int l0, int l1, double T, double logit_rows, double attn_flops_per_token,
                      double kv_bytes_per_layer, eg_step_cost *o) {
    const eg_config *c = &m->cfg;
    memset(o, 0, sizeof *o);
    double E = c->n_experts, K = c->topk;
    double hit = E > 0 ? E * (1.0 - pow(1.0 - K / E, T)) : 0;
    o->experts_hit = hit;
    for (int l = l0; l < l1; l++) {
        double fb, fm, eb, em;
        layer_fixed(m, l, &fb, &fm);
        expert_size(m, l, &eb, &em);
        o->weight_bytes += fb + hit * eb;
        o->expert_bytes += hit * eb;
        o->kv_bytes += kv_bytes_per_layer;
        o->flops += 2.0 * T * (fm + (eb > 0 ? K * em : 0)) + T * attn_flops_per_token;
    }
    head_cost(m, l0, l1, T, logit_rows, o);
}

void eg_plan_decode_cost(const eg_model *m, int l0, int l1, int B, int ctx, eg_step_cost *o) {
    const eg_config *c = &m->cfg;
    double NH = c->n_heads, C = c->kv_lora_rank, DR = c->qk_rope, keys = ctx + 1.0;
    step_cost(m, l0, l1, B, B, 2.0 * NH * keys * (C + DR + C), (double)B * keys * (C + DR) * 2.0, o);
}

void eg_plan_prefill_cost(const eg_model *m, int l0, int l1, int n_seq, int P, eg_step_cost *o) {
    const eg_config *c = &m->cfg;
    double keys = (P + 1) / 2.0;
    step_cost(m, l0, l1, (double)n_seq * P, n_seq,
              2.0 * c->n_heads * keys * ((double)c->qk_nope + c->qk_rope + c->v_head), 0.0, o);
}

/* ---- KV scheduling estimates ---------------------------------------------------------- */

int64_t eg_plan_seq_host_bytes(const eg_config *c, int n_capture, int64_t n_tokens, int elem_bytes) {
    return n_tokens * ((int64_t)(n_capture + 1) * c->hidden * elem_bytes + 4);
}

int eg_plan_auto_slots(int64_t pool_tokens, int max_seq_len, int max_slots, int64_t ram_bytes, int64_t seq_host_bytes) {
    int64_t short_seq = max_seq_len < 256 ? max_seq_len : 256;
    int64_t n = max_slots;
    if (short_seq > 0 && pool_tokens / short_seq < n) n = pool_tokens / short_seq;
    if (seq_host_bytes > 0 && ram_bytes > 0 && ram_bytes / 2 / seq_host_bytes < n) n = ram_bytes / 2 / seq_host_bytes;
    return n < 1 ? 1 : (int)n;
}

eg_status eg_plan_workload_parse(const char *spec, double *median, double *sigma, eg_error *err) {
    char *end;
    const char *p = spec && !strncmp(spec, "lognormal:", 10) ? spec + 10 : NULL;
    double m = p ? strtod(p, &end) : 0, s = 0;
    int ok = p && end != p && *end == ':' && m >= 1 && m <= 1e9;
    if (ok) {
        const char *q = end + 1;
        s = strtod(q, &end);
        ok = end != q && !*end && s >= 0 && s <= 10;
    }
    if (!ok)
        return eg_fail(err, EG_ERR_INVALID,
                       "workload '%s': expected lognormal:MEDIAN:SIGMA (MEDIAN >= 1 tokens, 0 <= SIGMA <= 10)",
                       spec ? spec : "");
    *median = m;
    *sigma = s;
    return EG_OK;
}

double eg_plan_lognormal_mean_cut(double median, double sigma, double cut) {
    if (sigma <= 0) return median < cut ? median : cut;
    /* E[min(X, c)] = integral over the normal z of min(median e^(sigma z), c) */
    double sum = 0, dz = 1e-3;
    for (double z = -8; z < 8; z += dz) {
        double x = median * exp(sigma * (z + dz / 2));
        sum += (x < cut ? x : cut) * exp(-(z + dz / 2) * (z + dz / 2) / 2) * dz;
    }
    return sum / sqrt(2 * M_PI);
}

double eg_plan_concurrency_on_demand(int64_t pool_tokens, double mean_len, double watermark) {
    return mean_len > 0 ? (double)pool_tokens * (1.0 - watermark) / mean_len : 0;
}

double eg_plan_concurrency_reserve(int64_t pool_tokens, int64_t prompt_len, int64_t max_new) {
    int64_t per = prompt_len + max_new;
    return per > 0 ? (double)(pool_tokens / per) : 0;
}
