/* Stage splitting and memory planning; see plan.h. */
#include "engine/plan.h"

#include <math.h>
#include <stdint.h>
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

int64_t eg_plan_split_layer_bytes(const eg_model *m, int l, int cut, int side) {
    const eg_layer_w *L = &m->layers[l];
    int64_t side1 = eg_weight_bytes(&L->sh_gate) + eg_weight_bytes(&L->sh_up) + eg_weight_bytes(&L->sh_down);
    if (L->sh_gate.fmt == EG_W_NONE) side1 = 0;
    for (int e = cut; L->is_moe && L->experts && e < m->cfg.n_experts; e++)
        side1 += eg_weight_bytes(&L->experts[e].gate) + eg_weight_bytes(&L->experts[e].up) +
                 eg_weight_bytes(&L->experts[e].down);
    return side ? side1 : eg_plan_layer_bytes(m, l) - side1;
}

int64_t eg_plan_head_bytes(const eg_model *m, int n_stages, int64_t *tail) {
    int shared = eg_model_head_tied(m) && n_stages <= 1;
    *tail = eg_weight_bytes(&m->final_norm) + (shared ? 0 : eg_weight_bytes(&m->lm_head));
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

int64_t eg_plan_head_bytes_cfg(const eg_config *c, int n_stages, int64_t *tail) {
    int64_t e = 2 * (int64_t)c->vocab * c->hidden;
    *tail = 2 * (int64_t)c->hidden + (c->tie_embeddings && n_stages <= 1 ? 0 : e);
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

void eg_plan_layer_parts_of(const eg_model *m, int l, eg_plan_layer_parts *out) {
    const eg_layer_w *L = &m->layers[l];
    memset(out, 0, sizeof *out);
    if (L->is_moe && L->experts && m->cfg.n_experts > 0) {
        out->n_experts = m->cfg.n_experts;
        out->expert = eg_weight_bytes(&L->experts[0].gate) + eg_weight_bytes(&L->experts[0].up) +
                      eg_weight_bytes(&L->experts[0].down);
        out->shared = eg_plan_split_layer_bytes(m, l, out->n_experts, 1);
    }
    out->attn = eg_plan_layer_bytes(m, l) - out->shared - (int64_t)out->n_experts * out->expert;
}

void eg_plan_layer_parts_cfg(const eg_config *c, int l, eg_plan_layer_parts *out) {
    memset(out, 0, sizeof *out);
    if (eg_config_layer_is_moe(c, l) && c->n_experts > 0) {
        out->n_experts = c->n_experts;
        out->expert = eg_plan_expert_bytes_cfg(c);
        out->shared = 2 * 3 * (int64_t)c->hidden * c->moe_inter * c->n_shared;
    }
    out->attn = eg_plan_layer_bytes_cfg(c, l) - out->shared - (int64_t)out->n_experts * out->expert;
}

/* The units of a split in layer order: per layer its attention part, then (MoE) each
 * routed expert, then its shared expert (a dense layer: its MLP, where one rank owns it).
 * A stage may begin before a layer's attention unit, or before expert c of a MoE layer
 * (0 < c < E). A unit one rank owns counts in that rank's prefix, not in pre. */
typedef struct split_units {
    int64_t *bytes;  /* [U] */
    int *layer;      /* [U] */
    int *kind;       /* [U] 0 attention, 1 + e routed expert e, -1 shared / owned MLP */
    int64_t *pre;    /* [U + 1] prefix of the bytes every rank holds */
    int64_t *own;    /* [R][U + 1] prefix of the bytes rank r holds alone (R 0: none) */
    int *pre_attn;   /* [U + 1] prefix of attention units */
    int *attn_at;    /* [L + 1] unit index of layer l's attention unit (L: U) */
    int U, L, R;
} split_units;

static void units_free(split_units *u) {
    free(u->bytes); free(u->layer); free(u->kind); free(u->pre); free(u->own); free(u->pre_attn); free(u->attn_at);
}

static int units_make(const eg_plan_layer_parts *p, int L, split_units *u) {
    memset(u, 0, sizeof *u);
    int64_t U = 0;
    for (int l = 0; l < L; l++) {
        U += 1 + (p[l].n_experts > 0 ? p[l].n_experts + 1 : p[l].shared > 0);
        if (p[l].owner > u->R) u->R = p[l].owner;
    }
    u->bytes = malloc(sizeof(int64_t) * (size_t)U);
    u->layer = malloc(sizeof(int) * (size_t)U);
    u->kind = malloc(sizeof(int) * (size_t)U);
    u->pre = malloc(sizeof(int64_t) * (size_t)(U + 1));
    u->own = u->R ? calloc((size_t)u->R * (size_t)(U + 1), sizeof(int64_t)) : NULL;
    u->pre_attn = malloc(sizeof(int) * (size_t)(U + 1));
    u->attn_at = malloc(sizeof(int) * (size_t)(L + 1));
    int *owner = malloc(sizeof(int) * (size_t)(U + 1));
    if (!u->bytes || !u->layer || !u->kind || !u->pre || (u->R && !u->own) || !u->pre_attn || !u->attn_at || !owner) {
        units_free(u);
        free(owner);
        return 0;
    }
    int i = 0;
    for (int l = 0; l < L; l++) {
        u->attn_at[l] = i;
        owner[i] = 0, u->bytes[i] = p[l].attn, u->layer[i] = l, u->kind[i++] = 0;
        for (int e = 0; e < p[l].n_experts; e++)
            owner[i] = 0, u->bytes[i] = p[l].expert, u->layer[i] = l, u->kind[i++] = 1 + e;
        if (p[l].n_experts > 0 || p[l].shared > 0)
            owner[i] = p[l].owner, u->bytes[i] = p[l].shared, u->layer[i] = l, u->kind[i++] = -1;
    }
    u->U = i;
    u->L = L;
    u->attn_at[L] = i;
    u->pre[0] = 0;
    u->pre_attn[0] = 0;
    for (int j = 0; j < i; j++) {
        u->pre[j + 1] = u->pre[j] + (owner[j] ? 0 : u->bytes[j]);
        u->pre_attn[j + 1] = u->pre_attn[j] + (u->kind[j] == 0);
        for (int r = 0; r < u->R; r++) {
            int64_t *o = u->own + (size_t)r * (size_t)(U + 1);
            o[j + 1] = o[j] + (owner[j] == r + 1 ? u->bytes[j] : 0);
        }
    }
    free(owner);
    return 1;
}

/* 1: a stage may begin at unit b. */
static int may_begin(const split_units *u, const eg_plan_layer_parts *p, int b, int allow_cuts) {
    if (b <= 0 || b >= u->U) return 0;
    if (u->kind[b] == 0) return 1;
    /* experts c in 1..E-1, and a layer after this one for the next stage's attention */
    return allow_cuts && u->kind[b] >= 2 && u->kind[b] - 1 < p[u->layer[b]].n_experts && u->layer[b] + 1 < u->L;
}

/* Stage cost of units [b0, b1) at X tokens, as its heaviest rank holds them. */
static double unit_cost(const split_units *u, int b0, int b1, double per_tok_x) {
    int64_t most = 0;
    for (int r = 0; r < u->R; r++) {
        const int64_t *o = u->own + (size_t)r * (size_t)(u->U + 1);
        if (o[b1] - o[b0] > most) most = o[b1] - o[b0];
    }
    return (double)(u->pre[b1] - u->pre[b0] + most) + per_tok_x * (double)(u->pre_attn[b1] - u->pre_attn[b0]);
}

/* The least end of a stage beginning at unit s: one unit on, and after a cut inside layer
 * l past layer l+1's attention (the next stage runs one; stage ends stay increasing). */
static int least_end(const split_units *u, int s) {
    return s == 0 || u->kind[s] == 0 ? s + 1 : u->attn_at[u->layer[s] + 1] + 1;
}

/* The last end e <= U of a stage beginning at s whose cost fits cap (s when none). */
static int last_end(const split_units *u, int s, double kvx, double cap) {
    int lo = s, hi = u->U; /* cost(s, lo) fits (0 units); find the last e that fits */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (unit_cost(u, s, mid, kvx) <= cap) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Whether n stages can hold every unit at X (kvx = X * bytes per token and layer): the
 * units where stage k may begin, stage by stage (reach[k][b]); a stage from s may end at
 * any e in [least_end(s), last_end(s)] where the next stage may begin (or at U, the
 * last). Stage costs grow with their end, so these are intervals, marked by differences.
 * begin[k]: a split found, traced back from U. Budgets differ per stage (the head, the
 * drafter), which is why a greedy fill would not do. */
static int split_fits(const split_units *u, const eg_plan_layer_parts *p, const int64_t *budget, int n, double kvx,
                      double extra_x, int allow_cuts, int *begin, unsigned char *reach, int *diff) {
    int U = u->U;
    memset(reach, 0, (size_t)n * (size_t)(U + 1));
    reach[0] = 1;
    for (int k = 0; k + 1 < n; k++) {
        memset(diff, 0, sizeof(int) * (size_t)(U + 2));
        const unsigned char *r = reach + (size_t)k * (size_t)(U + 1);
        double cap = (double)budget[k];
        for (int s0 = 0; s0 < U; s0++) {
            if (!r[s0]) continue;
            int lo = least_end(u, s0), hi = last_end(u, s0, kvx, cap);
            if (hi > U - 1) hi = U - 1; /* a later stage needs a unit */
            if (lo <= hi) { diff[lo]++; diff[hi + 1]--; }
        }
        unsigned char *nx = reach + (size_t)(k + 1) * (size_t)(U + 1);
        for (int b = 0, run = 0; b < U; b++) {
            run += diff[b];
            nx[b] = run > 0 && may_begin(u, p, b, allow_cuts);
        }
    }
    /* the last stage ends at U; trace back a split */
    int e = U;
    for (int k = n - 1; k >= 0; k--) {
        const unsigned char *r = reach + (size_t)k * (size_t)(U + 1);
        double cap = (double)budget[k] - (k == n - 1 ? extra_x : 0);
        int found = -1;
        for (int s0 = 0; s0 < e && found < 0; s0++)
            if (r[s0] && least_end(u, s0) <= e && unit_cost(u, s0, e, kvx) <= cap) found = s0;
        if (found < 0) return 0;
        begin[k] = found;
        e = found;
    }
    return e == 0;
}

static void begins_to_ends(const split_units *u, const int *begin, int n, int *ends, int *cuts) {
    for (int k = 0; k < n; k++) {
        if (k == n - 1) { ends[k] = u->layer[u->U - 1] + 1; cuts[k] = 0; continue; }
        int b = begin[k + 1];
        if (u->kind[b] == 0) { ends[k] = u->layer[b]; cuts[k] = 0; }
        else { ends[k] = u->layer[b] + 1; cuts[k] = u->kind[b] - 1; }
    }
}

eg_status eg_plan_split_kv(const eg_plan_layer_parts *parts, int L, const int64_t *budget, int n,
                           int64_t kv_per_token_layer, int64_t extra_last_per_token, int allow_cuts, int *ends,
                           int *cuts, int64_t *tokens, eg_error *err) {
    *tokens = 0;
    if (n < 1 || L < 1) return eg_fail(err, EG_ERR_INVALID, "cannot split %d layers into %d stages", L, n);
    split_units u;
    int *begin = malloc(sizeof(int) * (size_t)n), *best = malloc(sizeof(int) * (size_t)n), *diff = NULL;
    unsigned char *reach = NULL;
    if (!begin || !best || !units_make(parts, L, &u)) {
        free(begin);
        free(best);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    reach = malloc((size_t)n * (size_t)(u.U + 1));
    diff = malloc(sizeof(int) * (size_t)(u.U + 2));
    if (!reach || !diff) {
        free(reach); free(diff); free(begin); free(best); units_free(&u);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    eg_status st = EG_OK;
    if (!split_fits(&u, parts, budget, n, 0, 0, allow_cuts, begin, reach, diff)) {
        st = eg_fail(err, EG_ERR_NOMEM, "the weights of %d layers do not fit %d stages' memory, even without a cache",
                     L, n);
    } else {
        memcpy(best, begin, sizeof(int) * (size_t)n);
        int64_t lo = 0, hi = 1;
        for (int k = 0; k < n; k++) hi += budget[k] > 0 ? budget[k] : 0;
        hi = hi / (kv_per_token_layer > 0 ? kv_per_token_layer : 1) + 1;
        while (lo + 1 < hi) { /* lo fits, hi does not */
            int64_t mid = lo + (hi - lo) / 2;
            if (split_fits(&u, parts, budget, n, (double)mid * (double)kv_per_token_layer,
                           (double)mid * (double)extra_last_per_token, allow_cuts, begin, reach, diff)) {
                lo = mid;
                memcpy(best, begin, sizeof(int) * (size_t)n);
            } else {
                hi = mid;
            }
        }
        begins_to_ends(&u, best, n, ends, cuts);
        *tokens = lo;
    }
    units_free(&u);
    free(reach);
    free(diff);
    free(begin);
    free(best);
    return st;
}

int64_t eg_plan_split_kv_tokens(const eg_plan_layer_parts *parts, int L, const int64_t *budget, int n,
                                int64_t kv_per_token_layer, int64_t extra_last_per_token, const int *ends,
                                const int *cuts) {
    int64_t best = -1;
    int R = 0;
    for (int l = 0; l < L; l++)
        if (parts[l].owner > R) R = parts[l].owner;
    for (int k = 0, b0 = 0; k < n; b0 = ends[k++]) {
        int head = k && cuts && cuts[k - 1] ? cuts[k - 1] : 0, tail = k < n - 1 && cuts ? cuts[k] : 0;
        int end = ends[k] < L ? ends[k] : L;
        int64_t w = 0, layers = 0;
        if (head) w += (int64_t)(parts[b0 - 1].n_experts - head) * parts[b0 - 1].expert;
        for (int l = b0; l < end; l++) {
            const eg_plan_layer_parts *q = &parts[l];
            layers++;
            w += q->attn + (int64_t)(tail && l == end - 1 ? tail : q->n_experts) * q->expert;
        }
        /* the FFNs on this stage (a split layer's after its cut): common, or on their owner */
        int f0 = head ? b0 - 1 : b0, f1 = tail ? end - 1 : end;
        int64_t most = 0;
        for (int r = 0; r <= R; r++) {
            int64_t f = 0;
            for (int l = f0; l < f1; l++)
                if (parts[l].owner == r) f += parts[l].shared;
            if (r == 0) w += f;
            else if (f > most) most = f;
        }
        w += most;
        int64_t per = kv_per_token_layer * layers + (k == n - 1 ? extra_last_per_token : 0);
        int64_t left = budget[k] - w;
        if (left < 0) return -1;
        int64_t x = per > 0 ? left / per : INT64_MAX;
        if (best < 0 || x < best) best = x;
    }
    return best;
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
