/* The CPU backend: plain, readable C11 for every op in backend.h, multithreaded with
 * eg_pool. This is the reference the CUDA backend is tested against, so clarity wins
 * over speed, with two rules kept for faithfulness and determinism:
 *  - all arithmetic is FP32 (RMSNorm sums and the sampler in FP64), weights are
 *    dequantised exactly as stored (BF16, INT4 value*scale, FP8 * scale_inv);
 *  - each output element is reduced in a fixed order that does not depend on T,
 *    the thread count or what else is in the batch, so a sequence's tokens do not
 *    depend on its batch neighbours.
 * Scratch is allocated once at create time from the config and max_tokens; no op
 * allocates. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "common/eg_thread.h"
#include "engine/backend.h"
#include "engine/kv_cache.h"

typedef struct cpu_impl {
    eg_pool *pool;
    int nthreads;
    int64_t max_cols;   /* widest weight row any op dequantises */
    float *row_scratch; /* [nthreads][max_cols] */
    /* MLA: per thread [(DN+DV)][C] head weights, plus q_lat/o_lat [C], q_pe [DR] */
    float *mla_scratch;
    int64_t mla_stride;
    /* MLP / MoE intermediates */
    float *mlp_g, *mlp_u;   /* [max_tokens][max_inter] */
    float *moe_out;         /* [max_tokens*K][H] */
    float *moe_act;         /* [nthreads][max_tokens][F] */
    int32_t *moe_tok;       /* [E][max_tokens*K]: (t*K+k) routed to e */
    int32_t *moe_cnt;       /* [E] */
    int *moe_ord;           /* [K] one token's combine order (eg_moe_order) */
    float *sample_scratch;  /* [eg_sample_scratch_floats(V)] */
    float *gqa_scores;      /* [nthreads][max_seq_len] attention weights of one (row, head) */
    int max_seq_len;        /* bound on eg_gqa_args.max_pos */
    eg_config cfg;          /* copy of the dims (eos_ids not used) */
    int max_tokens;
} cpu_impl;

static cpu_impl *impl_of(eg_backend *b) { return (cpu_impl *)b->impl; }

/* ---- memory ---------------------------------------------------------------- */

static eg_status cpu_alloc(eg_backend *b, size_t bytes, void **ptr, eg_error *err) {
    (void)b;
    *ptr = calloc(1, bytes ? bytes : 1);
    return *ptr ? EG_OK : eg_fail(err, EG_ERR_NOMEM, "cpu backend: out of memory (%zu bytes)", bytes);
}
static void cpu_release(eg_backend *b, void *p) { (void)b; free(p); }
static eg_status cpu_copy(eg_backend *b, void *dst, const void *src, size_t n, eg_error *err) {
    (void)b; (void)err;
    if (n) memmove(dst, src, n);
    return EG_OK;
}
static eg_status cpu_memset0(eg_backend *b, void *dst, size_t n, eg_error *err) {
    (void)b; (void)err;
    memset(dst, 0, n);
    return EG_OK;
}
static eg_status cpu_sync(eg_backend *b, eg_error *err) { (void)b; (void)err; return EG_OK; }
static eg_status cpu_weight_upload(eg_backend *b, const eg_weight *h, eg_weight *d, eg_error *err) {
    (void)b; (void)err;
    *d = *h;
    return EG_OK;
}
static void cpu_weight_release(eg_backend *b, eg_weight *d) {
    (void)b;
    if (d && d->owned) {
        free((void *)d->data);
        free((void *)d->scale);
        d->data = d->scale = NULL;
        d->owned = 0;
    }
}

static eg_status cpu_weight_random(eg_backend *b, const eg_weight *h, const eg_weight_rand *r, eg_weight *d,
                                   eg_error *err) {
    (void)b;
    *d = *h;
    d->data = d->scale = NULL;
    d->owned = 1;
    const char *name = h->name ? h->name : "weight";
    int64_t n = h->rows * h->cols;
    if (h->fmt == EG_W_BF16 || h->fmt == EG_W_F32) {
        size_t es = h->fmt == EG_W_F32 ? 4 : 2;
        void *p = malloc((size_t)n * es + 1);
        if (!p) return eg_fail(err, EG_ERR_NOMEM, "cpu backend: drawing %s: out of memory", name);
        for (int64_t i = 0; i < n; i++) {
            float v = eg_weight_rand_value(r, i);
            if (es == 4) ((float *)p)[i] = v;
            else ((uint16_t *)p)[i] = eg_f32_to_bf16(v);
        }
        d->data = p;
        return EG_OK;
    }
    if (h->fmt == EG_W_INT4 && h->cols % 8 == 0 && h->group > 0 && h->cols % h->group == 0) {
        int64_t nw = h->rows * h->cols / 8, ns = h->rows * (h->cols / h->group);
        uint32_t *w = malloc(sizeof *w * (size_t)nw + 1);
        uint16_t *sc = malloc(sizeof *sc * (size_t)ns + 1);
        if (!w || !sc) {
            free(w);
            free(sc);
            return eg_fail(err, EG_ERR_NOMEM, "cpu backend: drawing %s: out of memory", name);
        }
        for (int64_t i = 0; i < nw; i++) w[i] = eg_weight_rand_int4_word(r, i);
        for (int64_t i = 0; i < ns; i++) sc[i] = eg_f32_to_bf16(eg_weight_rand_scale(r, i));
        d->data = w;
        d->scale = sc;
        return EG_OK;
    }
    d->owned = 0;
    return eg_fail(err, EG_ERR_UNSUPPORTED, "cpu backend: cannot draw %s (format %d, %lld x %lld)", name, (int)h->fmt,
                   (long long)h->rows, (long long)h->cols);
}

/* ---- helpers ---------------------------------------------------------------- */

/* Fixed-order dot product: 8 lanes then a fixed tree. */
static float dotf(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s[0] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* The same reduction as dotf with BF16 weights converted on the fly (exact), so the
 * result is bit-identical to dequantising the row first; saves a pass over memory. */
static float dot_bf16(const float *a, const uint16_t *w, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * eg_bf16_to_f32(w[i + j]);
    for (; i < n; i++) s[0] += a[i] * eg_bf16_to_f32(w[i]);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Row r of W as floats: a pointer into W for F32, else dequantised into buf. The BF16
 * and INT4 loops are the hot path of CPU inference, so they are written out here
 * (straight-line, vectorisable) rather than going through eg_weight_row; the values
 * are the same (test_engine_ops checks linear against eg_weight_get). */
static const float *weight_row(const eg_weight *w, int64_t r, float *buf) {
    const int64_t cols = w->cols;
    switch (w->fmt) {
    case EG_W_F32: return (const float *)w->data + r * cols;
    case EG_W_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + r * cols;
        uint32_t *o = (uint32_t *)buf;
        for (int64_t c = 0; c < cols; c++) o[c] = (uint32_t)p[c] << 16;
        return buf;
    }
    case EG_W_INT4: {
        const int64_t G = w->group, nw = cols / 8;
        const uint32_t *q = (const uint32_t *)w->data + r * nw;
        const uint16_t *sc = (const uint16_t *)w->scale + r * (cols / G);
        for (int64_t g = 0; g < cols / G; g++) {
            float s = eg_bf16_to_f32(sc[g]);
            for (int64_t j = g * G / 8; j < (g + 1) * G / 8; j++) {
                uint32_t word = q[j];
                for (int i = 0; i < 8; i++) buf[8 * j + i] = (float)((int)((word >> (4 * i)) & 15u) - 8) * s;
            }
        }
        return buf;
    }
    default:
        eg_weight_row(w, r, buf);
        return buf;
    }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- linear ------------------------------------------------------------------ */

typedef struct {
    cpu_impl *im;
    const float *x;
    int T;
    const eg_weight *W;
    float *y;
} linear_ctx;

static void linear_body(void *vc, int64_t r0, int64_t r1, int tid) {
    linear_ctx *c = vc;
    float *buf = c->im->row_scratch + (int64_t)tid * c->im->max_cols;
    int64_t rows = c->W->rows, cols = c->W->cols;
    if (c->W->fmt == EG_W_BF16 && c->T <= 4) { /* matrix-vector: fuse the conversion */
        for (int64_t r = r0; r < r1; r++) {
            const uint16_t *w = (const uint16_t *)c->W->data + r * cols;
            for (int t = 0; t < c->T; t++) c->y[(int64_t)t * rows + r] = dot_bf16(c->x + (int64_t)t * cols, w, cols);
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const float *w = weight_row(c->W, r, buf);
        for (int t = 0; t < c->T; t++) c->y[(int64_t)t * rows + r] = dotf(c->x + (int64_t)t * cols, w, cols);
    }
}

static eg_status check_cols(cpu_impl *im, const eg_weight *W, eg_error *err) {
    if (W->cols > im->max_cols)
        return eg_fail(err, EG_ERR_INVALID, "cpu backend: weight %s has %lld columns, scratch holds %lld",
                       W->name ? W->name : "?", (long long)W->cols, (long long)im->max_cols);
    return EG_OK;
}

static eg_status cpu_linear(eg_backend *b, const float *x, int T, const eg_weight *W, float *y, eg_error *err) {
    cpu_impl *im = impl_of(b);
    if (check_cols(im, W, err)) return err->code;
    linear_ctx c = {im, x, T, W, y};
    eg_pool_for(im->pool, W->rows, 4, linear_body, &c);
    return EG_OK;
}

/* ---- elementwise ------------------------------------------------------------- */

static eg_status cpu_embed(eg_backend *b, const int32_t *tokens, int T, const eg_weight *E, float *x, eg_error *err) {
    (void)b;
    for (int t = 0; t < T; t++) {
        if (tokens[t] < 0 || tokens[t] >= E->rows)
            return eg_fail(err, EG_ERR_INVALID, "token id %d out of range [0, %lld)", tokens[t], (long long)E->rows);
        eg_weight_row(E, tokens[t], x + (int64_t)t * E->cols);
    }
    return EG_OK;
}

static void rmsnorm_row(const float *x, const eg_weight *w, int D, float eps, float *y) {
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / D + eps));
    for (int i = 0; i < D; i++) y[i] = x[i] * inv * eg_weight_get(w, 0, i);
}

static eg_status cpu_rmsnorm(eg_backend *b, const float *x, const eg_weight *w, int T, int D, float eps, float *y,
                             eg_error *err) {
    (void)b; (void)err;
    for (int t = 0; t < T; t++) rmsnorm_row(x + (int64_t)t * D, w, D, eps, y + (int64_t)t * D);
    return EG_OK;
}

static eg_status cpu_add(eg_backend *b, float *x, const float *dx, int64_t n, eg_error *err) {
    (void)b; (void)err;
    for (int64_t i = 0; i < n; i++) x[i] += dx[i];
    return EG_OK;
}

static eg_status cpu_add_rmsnorm(eg_backend *b, float *x, const float *dx, const eg_weight *w, int T, int D, float eps,
                                 float *y, eg_error *err) {
    cpu_add(b, x, dx, (int64_t)T * D, err);
    return cpu_rmsnorm(b, x, w, T, D, eps, y, err);
}

static eg_status cpu_gather_rows(eg_backend *b, const float *x, const int32_t *idx, int n, int D, float *out,
                                 eg_error *err) {
    (void)b; (void)err;
    for (int i = 0; i < n; i++) memcpy(out + (int64_t)i * D, x + (int64_t)idx[i] * D, sizeof(float) * (size_t)D);
    return EG_OK;
}

/* ---- dense SwiGLU MLP -------------------------------------------------------- */

static eg_status cpu_swiglu_mlp(eg_backend *b, const float *x, int T, const eg_weight *gate, const eg_weight *up,
                                const eg_weight *down, float *y, int accumulate, eg_error *err) {
    cpu_impl *im = impl_of(b);
    int64_t I = gate->rows, H = down->rows;
    if (T > im->max_tokens || I > im->max_cols)
        return eg_fail(err, EG_ERR_INVALID, "cpu backend: swiglu shape T=%d I=%lld exceeds scratch", T, (long long)I);
    eg_status st;
    if ((st = cpu_linear(b, x, T, gate, im->mlp_g, err)) || (st = cpu_linear(b, x, T, up, im->mlp_u, err))) return st;
    for (int64_t i = 0; i < (int64_t)T * I; i++) im->mlp_g[i] = silu(im->mlp_g[i]) * im->mlp_u[i];
    if (!accumulate) return cpu_linear(b, im->mlp_g, T, down, y, err);
    if ((st = cpu_linear(b, im->mlp_g, T, down, im->mlp_u, err))) return st;
    for (int64_t i = 0; i < (int64_t)T * H; i++) y[i] += im->mlp_u[i];
    return EG_OK;
}

/* ---- MLA attention (absorbed) -------------------------------------------------- */

/* Rotate interleaved pairs (v[2i], v[2i+1]) by pos * inv_freq[i], cos/sin scaled. */
static void rope_rotate(float *v, int DR, int pos, const float *inv_freq, float attn_factor) {
    for (int i = 0; i < DR / 2; i++) {
        double ang = (double)pos * inv_freq[i];
        float c = (float)(cos(ang) * attn_factor), s = (float)(sin(ang) * attn_factor);
        float a = v[2 * i], bb = v[2 * i + 1];
        v[2 * i] = a * c - bb * s;
        v[2 * i + 1] = a * s + bb * c;
    }
}

static uint16_t *cache_row(const eg_mla_args *a, int slot, int pos, int W) {
    int blk = a->block_table[(int64_t)slot * a->max_blocks + pos / a->block_size];
    int64_t row = (int64_t)blk * a->block_size + pos % a->block_size;
    if (a->cache.dtype == EG_KV_BF16) return a->cache.data + row * W;
    return (uint16_t *)((unsigned char *)a->cache.data + row * a->cache.row_bytes);
}

/* Measurement caches (backend.h's eg_kv_dtype; `eaglegen fidelity` only): store one row
 * v[C+DR] (normalised latent, rotated k_pe) and load it back as floats. */
static void cache_store_measure(eg_kv_dtype dt, void *row, const float *v, int C, int DR) {
    unsigned char *b = row;
    if (dt == EG_KV_FP32) {
        memcpy(b, v, sizeof(float) * (size_t)(C + DR));
    } else if (dt == EG_KV_FP8) {
        for (int k = 0; k < C + DR; k++) b[k] = eg_f32_to_fp8e4m3(v[k]);
    } else { /* FP8_TILE: [C e4m3, padded to 4][tiles f32 scale][DR bf16] */
        float *scale = (float *)(b + (C + 3) / 4 * 4);
        int n_tiles = (C + 127) / 128;
        for (int t = 0; t < n_tiles; t++) {
            int k0 = t * 128, k1 = k0 + 128 < C ? k0 + 128 : C;
            float amax = 0;
            for (int k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(v[k]));
            float sc = fmaxf(amax / 448.0f, FLT_MIN);
            scale[t] = sc;
            for (int k = k0; k < k1; k++) b[k] = eg_f32_to_fp8e4m3(v[k] / sc);
        }
        uint16_t *pe = (uint16_t *)(scale + n_tiles);
        for (int k = 0; k < DR; k++) pe[k] = eg_f32_to_bf16(v[C + k]);
    }
}

static void cache_load_measure(eg_kv_dtype dt, const void *row, float *v, int C, int DR) {
    const unsigned char *b = row;
    if (dt == EG_KV_FP32) {
        memcpy(v, b, sizeof(float) * (size_t)(C + DR));
    } else if (dt == EG_KV_FP8) {
        for (int k = 0; k < C + DR; k++) v[k] = eg_fp8e4m3_to_f32(b[k]);
    } else {
        const float *scale = (const float *)(b + (C + 3) / 4 * 4);
        for (int k = 0; k < C; k++) v[k] = eg_fp8e4m3_to_f32(b[k]) * scale[k / 128];
        const uint16_t *pe = (const uint16_t *)(scale + (C + 127) / 128);
        for (int k = 0; k < DR; k++) v[C + k] = eg_bf16_to_f32(pe[k]);
    }
}

typedef struct {
    cpu_impl *im;
    const eg_mla_args *a;
} mla_ctx;

static void mla_head_body(void *vc, int64_t i0, int64_t i1, int tid) {
    mla_ctx *c = vc;
    const eg_mla_args *a = c->a;
    const eg_config *cfg = &c->im->cfg;
    int C = cfg->kv_lora_rank, DN = cfg->qk_nope, DR = cfg->qk_rope, DV = cfg->v_head, NH = cfg->n_heads;
    int W = C + DR;
    float *wk = c->im->mla_scratch + (int64_t)tid * c->im->mla_stride; /* [DN][C] W_UK of this head */
    float *wv = wk + (int64_t)DN * C;                                   /* [DV][C] W_UV */
    float *q_lat = wv + (int64_t)DV * C;                                /* [C] */
    float *o_lat = q_lat + C;                                           /* [C] */
    float *q_pe = o_lat + C;                                            /* [DR] */
    float *lat = q_pe + DR;                                             /* [W] one cache row as floats */
    for (int64_t h = a->h0 + i0; h < a->h0 + i1; h++) {
        for (int d = 0; d < DN; d++) {
            const float *src = weight_row(a->kv_b, h * (DN + DV) + d, wk + (int64_t)d * C);
            if (src != wk + (int64_t)d * C) memcpy(wk + (int64_t)d * C, src, sizeof(float) * (size_t)C);
        }
        for (int d = 0; d < DV; d++) {
            const float *src = weight_row(a->kv_b, h * (DN + DV) + DN + d, wv + (int64_t)d * C);
            if (src != wv + (int64_t)d * C) memcpy(wv + (int64_t)d * C, src, sizeof(float) * (size_t)C);
        }
        for (int t = 0; t < a->T; t++) {
            const float *q = a->q + ((int64_t)t * NH + h) * (DN + DR);
            /* q_lat[c] = sum_d q_nope[d] * W_UK[d][c] */
            for (int cc = 0; cc < C; cc++) q_lat[cc] = 0;
            for (int d = 0; d < DN; d++) {
                float qd = q[d];
                const float *row = wk + (int64_t)d * C;
                for (int cc = 0; cc < C; cc++) q_lat[cc] += qd * row[cc];
            }
            memcpy(q_pe, q + DN, sizeof(float) * (size_t)DR);
            rope_rotate(q_pe, DR, a->pos[t], a->rope_inv_freq, a->rope_attn_factor);
            /* online softmax over positions 0..pos of this token's sequence */
            float m = -INFINITY, l = 0;
            for (int cc = 0; cc < C; cc++) o_lat[cc] = 0;
            for (int j = 0; j <= a->pos[t]; j++) {
                const uint16_t *row = cache_row(a, a->slot[t], j, W);
                if (a->cache.dtype == EG_KV_BF16)
                    for (int k = 0; k < W; k++) lat[k] = eg_bf16_to_f32(row[k]);
                else
                    cache_load_measure(a->cache.dtype, row, lat, C, DR);
                float s = (dotf(q_lat, lat, C) + dotf(q_pe, lat + C, DR)) * a->softmax_scale;
                if (s > m) {
                    float r = expf(m - s);
                    l *= r;
                    for (int cc = 0; cc < C; cc++) o_lat[cc] *= r;
                    m = s;
                }
                float p = expf(s - m);
                l += p;
                for (int cc = 0; cc < C; cc++) o_lat[cc] += p * lat[cc];
            }
            for (int cc = 0; cc < C; cc++) o_lat[cc] /= l;
            float *out = a->out + ((int64_t)t * NH + h) * DV;
            for (int d = 0; d < DV; d++) out[d] = dotf(wv + (int64_t)d * C, o_lat, C);
        }
    }
}

static eg_status cpu_mla_attention(eg_backend *b, const eg_mla_args *a, eg_error *err) {
    cpu_impl *im = impl_of(b);
    const eg_config *cfg = &im->cfg;
    int C = cfg->kv_lora_rank, DR = cfg->qk_rope, W = C + DR;
    float *tmp = im->row_scratch; /* thread 0's row: [W] */
    if (W > im->max_cols) return eg_fail(err, EG_ERR_INVALID, "cpu backend: latent width exceeds scratch");
    if (a->cache.dtype != EG_KV_BF16 && a->cache.row_bytes < eg_kv_row_bytes(a->cache.dtype, C, DR))
        return eg_fail(err, EG_ERR_INVALID, "cpu backend: cache rows of %d bytes for kv dtype %d", a->cache.row_bytes,
                       (int)a->cache.dtype);
    /* 1. write every token's normalised latent and rotated k_pe to the cache (BF16, RNE;
     *    `eaglegen fidelity`'s measurement dtypes as backend.h describes)
     *    before any attention, so all reads come from the cache, the chunk's own too. */
    for (int t = 0; t < a->T; t++) {
        const float *kv = a->kv + (int64_t)t * W;
        if (a->pos[t] / a->block_size >= a->max_blocks)
            return eg_fail(err, EG_ERR_INVALID, "position %d beyond the slot's block table", a->pos[t]);
        rmsnorm_row(kv, a->kv_a_norm, C, a->eps, tmp);
        memcpy(tmp + C, kv + C, sizeof(float) * (size_t)DR);
        rope_rotate(tmp + C, DR, a->pos[t], a->rope_inv_freq, a->rope_attn_factor);
        uint16_t *row = cache_row(a, a->slot[t], a->pos[t], W);
        if (a->cache.dtype == EG_KV_BF16)
            for (int k = 0; k < W; k++) row[k] = eg_f32_to_bf16(tmp[k]);
        else
            cache_store_measure(a->cache.dtype, row, tmp, C, DR);
    }
    /* 2. attention, parallel over heads */
    mla_ctx c = {im, a};
    eg_pool_for(im->pool, a->h1 - a->h0, 1, mla_head_body, &c);
    return EG_OK;
}


/* ---- plain MHA/GQA attention over a BF16 cache (the EAGLE-3 drafter) ------------- */

/* Rotate-half RoPE (pairs i, i + HD/2) at position p: the drafter's own formula. */
static void rope_half(float *v, int HD, int p, const float *inv_freq) {
    const int half = HD / 2;
    for (int i = 0; i < half; i++) {
        double a = (double)p * inv_freq[i];
        float cs = (float)cos(a), sn = (float)sin(a);
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * cs - x1 * sn;
        v[i + half] = x1 * cs + x0 * sn;
    }
}

typedef struct {
    cpu_impl *im;
    const eg_gqa_args *a;
} gqa_ctx;

/* The cache row (token index into [n_blocks][BS]) of position j of slot s. */
static inline int64_t gqa_row(const eg_gqa_args *a, int s, int j) {
    return (int64_t)a->block_table[(int64_t)s * a->max_blocks + j / a->block_size] * a->block_size + j % a->block_size;
}

/* One (row, head) per item: scores in a fixed order (c, then j), two-pass softmax. */
static void gqa_body(void *vc, int64_t i0, int64_t i1, int tid) {
    gqa_ctx *c = vc;
    const eg_gqa_args *a = c->a;
    const int NH = a->n_heads, NKV = a->n_kv_heads, HD = a->head_dim, grp = NH / NKV;
    const int64_t row = (int64_t)NKV * HD;
    float *qh = c->im->row_scratch + (int64_t)tid * c->im->max_cols;
    float *sc = c->im->gqa_scores + (int64_t)tid * c->im->max_seq_len;
    for (int64_t i = i0; i < i1; i++) {
        const int t = (int)(i / NH), h = (int)(i % NH), kvh = h / grp, p = a->pos[t], s = a->slot[t];
        memcpy(qh, a->q + ((int64_t)t * NH + h) * HD, sizeof(float) * (size_t)HD);
        rope_half(qh, HD, p, a->rope_inv_freq);
        const uint16_t *K = a->k_cache + (int64_t)kvh * HD, *V = a->v_cache + (int64_t)kvh * HD;
        const int lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        float mx = -FLT_MAX;
        for (int j = lo; j <= p; j++) {
            const uint16_t *kj = K + gqa_row(a, s, j) * row;
            float acc = 0;
            for (int d = 0; d < HD; d++) acc += qh[d] * eg_bf16_to_f32(kj[d]);
            sc[j] = acc * a->softmax_scale;
            if (sc[j] > mx) mx = sc[j];
        }
        float sum = 0;
        for (int j = lo; j <= p; j++) {
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        float *o = a->out + ((int64_t)t * NH + h) * HD;
        for (int d = 0; d < HD; d++) o[d] = 0;
        for (int j = lo; j <= p; j++) {
            const uint16_t *vj = V + gqa_row(a, s, j) * row;
            const float w = sc[j] / sum;
            for (int d = 0; d < HD; d++) o[d] += w * eg_bf16_to_f32(vj[d]);
        }
    }
}

static eg_status cpu_gqa_attention(eg_backend *b, const eg_gqa_args *a, eg_error *err) {
    cpu_impl *im = impl_of(b);
    const int NH = a->n_heads, NKV = a->n_kv_heads, HD = a->head_dim;
    if (a->T <= 0) return EG_OK;
    if (NH < 1 || NKV < 1 || NH % NKV || HD < 2 || HD % 2 || HD > im->max_cols || a->block_size < 1 ||
        a->max_blocks < 1 || a->n_blocks < 1 || a->window < 0 || !a->block_table)
        return eg_fail(err, EG_ERR_INVALID,
                       "cpu backend: gqa attention with %d heads, %d kv heads of %d (blocks of %d, %d per slot, %lld)",
                       NH, NKV, HD, a->block_size, a->max_blocks, (long long)a->n_blocks);
    const int64_t max_len = (int64_t)a->max_blocks * a->block_size;
    if (a->max_pos > im->max_seq_len || a->max_pos > max_len)
        return eg_fail(err, EG_ERR_INVALID, "cpu backend: gqa attention over %d positions, scratch holds %d, slots %lld",
                       a->max_pos, im->max_seq_len, (long long)max_len);
    const int64_t row = (int64_t)NKV * HD;
    for (int t = 0; t < a->T; t++) {
        const int p = a->pos[t], s = a->slot[t];
        if (p < 0 || p >= a->max_pos || s < 0)
            return eg_fail(err, EG_ERR_INVALID, "cpu backend: gqa attention row %d: position %d (max_pos %d), slot %d", t,
                           p, a->max_pos, s);
        /* every block the row reads (its window) must be mapped: a -1 would read outside the cache */
        const int lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        for (int j = lo / a->block_size; j <= p / a->block_size; j++) {
            const int32_t blk = a->block_table[(int64_t)s * a->max_blocks + j];
            if (blk < 0 || blk >= a->n_blocks)
                return eg_fail(err, EG_ERR_INVALID,
                               "cpu backend: gqa attention row %d: block %d of slot %d is %s (physical %d of %lld)", t, j,
                               s, blk < 0 ? "unmapped" : "out of range", blk, (long long)a->n_blocks);
        }
        uint16_t *kc = a->k_cache + gqa_row(a, s, p) * row;
        uint16_t *vc = a->v_cache + gqa_row(a, s, p) * row;
        float *kr = im->row_scratch;
        for (int h = 0; h < NKV; h++) {
            memcpy(kr, a->k + (int64_t)t * row + (int64_t)h * HD, sizeof(float) * (size_t)HD);
            rope_half(kr, HD, p, a->rope_inv_freq);
            for (int d = 0; d < HD; d++) {
                kc[(int64_t)h * HD + d] = eg_f32_to_bf16(kr[d]);
                vc[(int64_t)h * HD + d] = eg_f32_to_bf16(a->v[(int64_t)t * row + (int64_t)h * HD + d]);
            }
        }
    }
    gqa_ctx c = {im, a};
    eg_pool_for(im->pool, (int64_t)a->T * NH, 1, gqa_body, &c);
    return EG_OK;
}

static eg_status cpu_copy_rows(eg_backend *b, float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                               int rows, int64_t width, eg_error *err) {
    (void)b;
    if (rows < 0 || width < 0 || (rows > 1 && (dst_stride < width || src_stride < width)))
        return eg_fail(err, EG_ERR_INVALID, "cpu backend: copy_rows of %d rows of %lld (strides %lld, %lld)", rows,
                       (long long)width, (long long)dst_stride, (long long)src_stride);
    for (int r = 0; r < rows; r++)
        memmove(dst + (int64_t)r * dst_stride, src + (int64_t)r * src_stride, sizeof(float) * (size_t)width);
    return EG_OK;
}

/* ---- router ------------------------------------------------------------------ */

static eg_status cpu_router(eg_backend *b, const eg_router_args *a, eg_error *err) {
    cpu_impl *im = impl_of(b);
    int E = (int)a->gate->rows, K = a->topk, G = a->n_group > 0 ? a->n_group : 1;
    if (E % G) return eg_fail(err, EG_ERR_CONFIG, "n_routed_experts %d not divisible by n_group %d", E, G);
    if (a->T > im->max_tokens) return eg_fail(err, EG_ERR_INVALID, "router: T exceeds scratch");
    /* logits via the linear op (FP32) into moe_out scratch: [T][E] */
    float *logit = im->moe_out;
    eg_status st = cpu_linear(b, a->x, a->T, a->gate, logit, err);
    if (st) return st;
    float *sc = im->mlp_g, *biased = im->mlp_u; /* [E] each, reused per token */
    int per = E / G;
    for (int t = 0; t < a->T; t++) {
        for (int e = 0; e < E; e++) {
            sc[e] = 1.0f / (1.0f + expf(-logit[(int64_t)t * E + e]));
            biased[e] = sc[e] + (a->bias && a->bias->fmt ? eg_weight_get(a->bias, 0, e) : 0.0f);
        }
        if (G > 1) {
            /* keep topk_group groups by the sum of their top-2 biased scores */
            float gscore[G];
            int keep[G];
            for (int g = 0; g < G; g++) {
                float m1 = -INFINITY, m2 = -INFINITY;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    float v = biased[e];
                    if (v > m1) { m2 = m1; m1 = v; } else if (v > m2) m2 = v;
                }
                gscore[g] = per > 1 ? m1 + m2 : m1;
                keep[g] = 0;
            }
            for (int n = 0; n < a->topk_group; n++) {
                int best = -1;
                for (int g = 0; g < G; g++)
                    if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
                if (best >= 0) keep[best] = 1;
            }
            for (int g = 0; g < G; g++)
                if (!keep[g])
                    for (int e = g * per; e < (g + 1) * per; e++) biased[e] = -INFINITY;
        }
        int32_t *ids = a->ids + (int64_t)t * K;
        float *w = a->weights + (int64_t)t * K;
        double sum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= ids[j] == e;
                if (taken) continue;
                if (best < 0 || biased[e] > biased[best]) best = e;
            }
            ids[k] = best;
            w[k] = sc[best];
            sum += sc[best];
        }
        for (int k = 0; k < K; k++) {
            float v = a->norm_topk ? (float)(w[k] / sum) : w[k];
            w[k] = v * a->routed_scale;
        }
    }
    return EG_OK;
}

/* ---- MoE experts ------------------------------------------------------------- */

typedef struct {
    cpu_impl *im;
    const eg_moe_args *a;
    int64_t H, F;
} moe_ctx;

/* One expert: for each (t,k) routed to it, out[t*K+k] = w * down(silu(gate x) * up x). */
static void moe_expert_body(void *vc, int64_t i0, int64_t i1, int tid) {
    moe_ctx *c = vc;
    cpu_impl *im = c->im;
    const eg_moe_args *a = c->a;
    int64_t H = c->H, F = c->F, TK = (int64_t)im->max_tokens * a->topk;
    float *row = im->row_scratch + (int64_t)tid * im->max_cols;
    float *act = im->moe_act + (int64_t)tid * im->max_tokens * F * 2; /* [n][F] gate, then [n][F] up */
    for (int64_t e = a->e0 + i0; e < a->e0 + i1; e++) {
        int n = im->moe_cnt[e];
        if (!n) continue;
        const int32_t *list = im->moe_tok + e * TK;
        const eg_expert_w *ex = &a->experts[e];
        float *g = act, *u = act + (int64_t)n * F;
        for (int64_t f = 0; f < F; f++) {
            const float *w = weight_row(&ex->gate, f, row);
            for (int i = 0; i < n; i++) g[(int64_t)i * F + f] = dotf(a->x + (int64_t)(list[i] / a->topk) * H, w, H);
            w = weight_row(&ex->up, f, row);
            for (int i = 0; i < n; i++) u[(int64_t)i * F + f] = dotf(a->x + (int64_t)(list[i] / a->topk) * H, w, H);
        }
        for (int64_t i = 0; i < (int64_t)n * F; i++) g[i] = silu(g[i]) * u[i];
        for (int64_t h = 0; h < H; h++) {
            const float *w = weight_row(&ex->down, h, row);
            for (int i = 0; i < n; i++) {
                float v = dotf(g + (int64_t)i * F, w, F);
                im->moe_out[(int64_t)list[i] * H + h] = v * a->weights[list[i]];
            }
        }
    }
}

static eg_status cpu_moe(eg_backend *b, const eg_moe_args *a, eg_error *err) {
    cpu_impl *im = impl_of(b);
    int K = a->topk;
    int64_t H = im->cfg.hidden, F = im->cfg.moe_inter, TK = (int64_t)im->max_tokens * K;
    if (a->T > im->max_tokens || K > im->cfg.topk)
        return eg_fail(err, EG_ERR_INVALID, "moe: T=%d K=%d exceed scratch", a->T, K);
    memset(im->moe_cnt, 0, sizeof(int32_t) * (size_t)im->cfg.n_experts);
    for (int64_t i = 0; i < (int64_t)a->T * K; i++) {
        int e = a->ids[i];
        if (e < 0 || e >= im->cfg.n_experts) return eg_fail(err, EG_ERR_INVALID, "moe: expert id %d out of range", e);
        if (e >= a->e0 && e < a->e1) im->moe_tok[(int64_t)e * TK + im->moe_cnt[e]++] = (int32_t)i;
    }
    moe_ctx c = {im, a, H, F};
    eg_pool_for(im->pool, a->e1 - a->e0, 1, moe_expert_body, &c);
    /* combine in ascending expert id for every token (eg_moe_order): deterministic
       whatever the thread split, and a split by expert range continues the same fold */
    int *ord = im->moe_ord;
    for (int t = 0; t < a->T; t++) {
        eg_moe_order(a->ids + (int64_t)t * K, K, ord);
        for (int j = 0; j < K; j++) {
            int k = ord[j];
            int e = a->ids[(int64_t)t * K + k];
            if (e < a->e0 || e >= a->e1) continue;
            const float *o = im->moe_out + ((int64_t)t * K + k) * H;
            float *y = a->y + (int64_t)t * H;
            for (int64_t h = 0; h < H; h++) y[h] += o[h];
        }
    }
    return EG_OK;
}

/* ---- sampling ---------------------------------------------------------------- */

static eg_status cpu_sample(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *p, uint64_t *rng,
                            int32_t *out, eg_error *err) {
    cpu_impl *im = impl_of(b);
    if (V > im->cfg.vocab) return eg_fail(err, EG_ERR_INVALID, "sample: V exceeds scratch");
    for (int i = 0; i < N; i++)
        out[i] = eg_sample_row(logits + (int64_t)i * V, V, &p[i], &rng[i], im->sample_scratch, NULL);
    return EG_OK;
}

/* One row at a time, on the calling thread: offered so the engine's use of a backend's
 * probabilities runs on this backend too (bit for bit the host's numbers); the engine
 * asks for them only where told to (eg_engine_opts.spec_probs), as its own draws run in
 * parallel. */
static eg_status cpu_token_probs(eg_backend *b, const float *logits, int N, int V, const eg_sample_params *p,
                                 const int32_t *tok, double *out, eg_error *err) {
    cpu_impl *im = impl_of(b);
    if (V > im->cfg.vocab) return eg_fail(err, EG_ERR_INVALID, "token_probs: V exceeds scratch");
    for (int i = 0; i < N; i++) {
        if (tok[i] < 0) continue;
        if (tok[i] >= V)
            return eg_fail(err, EG_ERR_INVALID, "token_probs: row %d: token %d out of range [0, %d)", i, tok[i], V);
        out[i] = eg_sample_prob(logits + (int64_t)i * V, V, &p[i], tok[i], im->sample_scratch);
    }
    return EG_OK;
}

/* The kept set from eg_sample_kept, the sampler's own numbers (so a residual drawn from
 * it is the host's bit for bit); one row at a time on the calling thread, as token_probs. */
static eg_status cpu_kept_probs(eg_backend *b, const float *logits, const int32_t *rows, int N, int V,
                                const eg_sample_params *p, int cap, int32_t *n_out, int32_t *ids, double *probs,
                                eg_error *err) {
    cpu_impl *im = impl_of(b);
    if (V > im->cfg.vocab) return eg_fail(err, EG_ERR_INVALID, "kept_probs: V exceeds scratch");
    if (cap < 1) return eg_fail(err, EG_ERR_INVALID, "kept_probs: cap %d < 1", cap);
    for (int i = 0; i < N; i++) {
        if (rows[i] < 0) return eg_fail(err, EG_ERR_INVALID, "kept_probs: row %d: index %d < 0", i, rows[i]);
        n_out[i] = -1;
        if (!(p[i].temperature > 0.0f)) continue;
        double total;
        int n = eg_sample_kept(logits + (int64_t)rows[i] * V, V, &p[i], im->sample_scratch, &total);
        if (n > cap) continue;
        const eg_sample_cand *c = (const eg_sample_cand *)im->sample_scratch;
        const double *ex = (const double *)(c + V);
        for (int j = 0; j < n; j++) {
            ids[(int64_t)i * cap + j] = c[j].id;
            probs[(int64_t)i * cap + j] = ex[j] / total;
        }
        n_out[i] = n;
    }
    return EG_OK;
}

/* ---- lifecycle ---------------------------------------------------------------- */

static void cpu_destroy(eg_backend *b) {
    cpu_impl *im = impl_of(b);
    if (im) {
        eg_pool_free(im->pool);
        free(im->row_scratch);
        free(im->mla_scratch);
        free(im->mlp_g);
        free(im->mlp_u);
        free(im->moe_out);
        free(im->moe_act);
        free(im->moe_tok);
        free(im->moe_cnt);
        free(im->moe_ord);
        free(im->sample_scratch);
        free(im->gqa_scores);
        free(im);
    }
    free(b);
}

static const eg_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .memset0 = cpu_memset0,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .weight_upload = cpu_weight_upload,
    .weight_release = cpu_weight_release,
    .weight_random = cpu_weight_random,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .add = cpu_add,
    .linear = cpu_linear,
    .swiglu_mlp = cpu_swiglu_mlp,
    .mla_attention = cpu_mla_attention,
    .router = cpu_router,
    .moe = cpu_moe,
    .gather_rows = cpu_gather_rows,
    .gqa_attention = cpu_gqa_attention,
    .copy_rows = cpu_copy_rows,
    .sample = cpu_sample,
    .token_probs = cpu_token_probs,
    .kept_probs = cpu_kept_probs,
};

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

eg_status eg_backend_cpu_create(const eg_config *cfg, const eg_backend_opts *o, eg_backend **out, eg_error *err) {
    *out = NULL;
    eg_backend *b = eg_calloc(1, sizeof *b, err);
    cpu_impl *im = b ? eg_calloc(1, sizeof *im, err) : NULL;
    if (!im) { free(b); return EG_ERR_NOMEM; }
    b->ops = &cpu_ops;
    b->impl = im;
    im->cfg = *cfg;
    im->cfg.eos_ids = NULL;
    im->cfg.n_eos = 0;
    im->max_tokens = o->max_tokens > 0 ? o->max_tokens : 1;
    im->nthreads = o->nthreads > 0 ? o->nthreads : eg_num_threads();
    int64_t T = im->max_tokens, H = cfg->hidden, NH = cfg->n_heads, C = cfg->kv_lora_rank;
    int64_t DN = cfg->qk_nope, DR = cfg->qk_rope, DV = cfg->v_head, F = cfg->moe_inter;
    int64_t K = cfg->topk > 0 ? cfg->topk : 1, E = cfg->n_experts > 0 ? cfg->n_experts : 1;
    int64_t I = max64(cfg->inter, F * (cfg->n_shared > 0 ? cfg->n_shared : 1));
    im->max_cols = max64(max64(max64(H, I), max64(cfg->q_lora_rank, C + DR)), max64(NH * DV, max64(F, E)));
    im->mla_stride = (DN + DV) * C + 2 * C + DR + C + DR;
    eg_status st = eg_pool_create(im->nthreads, &im->pool, err);
    if (st) { cpu_destroy(b); return st; }
    size_t nt = (size_t)im->nthreads;
    im->row_scratch = eg_malloc(sizeof(float) * nt * (size_t)im->max_cols, err);
    im->mla_scratch = eg_malloc(sizeof(float) * nt * (size_t)im->mla_stride, err);
    im->mlp_g = eg_malloc(sizeof(float) * (size_t)(T * max64(I, E)), err);
    im->mlp_u = eg_malloc(sizeof(float) * (size_t)(T * max64(I, max64(H, E))), err);
    im->moe_out = eg_malloc(sizeof(float) * (size_t)(T * max64(K * H, E)), err);
    im->moe_act = eg_malloc(sizeof(float) * nt * (size_t)(T * F * 2 + 1), err);
    im->moe_tok = eg_malloc(sizeof(int32_t) * (size_t)(E * T * K), err);
    im->moe_cnt = eg_malloc(sizeof(int32_t) * (size_t)E, err);
    im->moe_ord = eg_malloc(sizeof(int) * (size_t)(K + 1), err);
    im->sample_scratch = eg_malloc(sizeof(float) * eg_sample_scratch_floats(cfg->vocab + 1), err);
    im->max_seq_len = o->max_seq_len > 0 ? o->max_seq_len : 1;
    im->gqa_scores = eg_malloc(sizeof(float) * nt * (size_t)im->max_seq_len, err);
    if (!im->row_scratch || !im->mla_scratch || !im->mlp_g || !im->mlp_u || !im->moe_out || !im->moe_act ||
        !im->moe_tok || !im->moe_cnt || !im->moe_ord || !im->sample_scratch || !im->gqa_scores) {
        cpu_destroy(b);
        return EG_ERR_NOMEM;
    }
    *out = b;
    return EG_OK;
}
