/* GPU op tests: every op of the CUDA backend against the CPU backend (the reference,
 * itself tested against scalar double code in tests/test_engine_ops.c) on seeded
 * random inputs, at small shapes and at Kimi-K2.5's (hidden 7168, 64 heads, kv_lora
 * 512, rope 64, nope 128, v 128, 384 experts top-8, F 2048, INT4 group 32), including a
 * long paged-cache case (4K positions, shuffled blocks, many sequence splits).
 * Each comparison prints ||cuda - cpu|| / ||cpu||. Bounds: 1e-3 where the CUDA path
 * feeds BF16 hi+lo activation pairs to cuBLAS (BF16 linear/MLP, MLA's W_UK/W_UV GEMMs;
 * 1e-2 with EG_CUDA_GEMM=bf16, plain BF16 activations), 1e-4 where both sides compute
 * in FP32 (dequantising GEMM, MoE, router logits; 1e-6 for norms),
 * exact for copies and for sampling (same logits and RNG states give the same tokens).
 * Needs a GPU: exits 2 with "no CUDA device" otherwise. Filter: argv[1] substring. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include "engine/backend.h"
#include "engine/collective.h"
#include "engine/drafter_eagle3.h"
#include "engine/mkmodel.h"
#include "engine/safetensors.h"
#include "engine/cuda_plan.h"
#include "engine/transport.h"
#include "kernels/eg_cuda.h" /* egk_gqa_smem_bytes: the attention tile's shared memory */
#include "tests/check.h"
#include "tests/spec_q.h"

/* ---- random numbers ------------------------------------------------------------ */

static uint64_t rs;
static void seed(uint64_t salt) { rs = eg_test_seed() * 0x9e3779b97f4a7c15ull ^ (salt + 1) * 0xd1b54a32d192ed03ull; }
static uint64_t next64(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static double urand(void) { return (double)(next64() >> 11) * 0x1.0p-53; }
static float nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* ---- configs ------------------------------------------------------------------------ */

static eg_config kimi_cfg(void) {
    eg_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.model_type, "kimi_k2");
    c.hidden = 7168; c.n_layers = 4; c.n_heads = 64; c.q_lora_rank = 1536; c.kv_lora_rank = 512;
    c.qk_nope = 128; c.qk_rope = 64; c.v_head = 128; c.inter = 2048; c.moe_inter = 2048; c.n_experts = 384;
    c.n_shared = 1; c.topk = 8; c.n_group = 1; c.topk_group = 1; c.routed_scale = 2.827f; c.norm_topk = 1;
    c.first_dense = 1; c.moe_freq = 1; c.rope_theta = 50000; c.rms_eps = 1e-6f; c.vocab = 163840;
    c.expert_format = EG_EXPERTS_INT4; c.quant_group = 32;
    return c;
}

static eg_config small_cfg(void) {
    eg_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.model_type, "deepseek_v3");
    c.hidden = 256; c.n_layers = 2; c.n_heads = 4; c.q_lora_rank = 0; c.kv_lora_rank = 32;
    c.qk_nope = 16; c.qk_rope = 16; c.v_head = 16; c.inter = 320; c.moe_inter = 128; c.n_experts = 16;
    c.n_shared = 1; c.topk = 4; c.n_group = 4; c.topk_group = 2; c.routed_scale = 2.5f; c.norm_topk = 1;
    c.rope_theta = 10000; c.rms_eps = 1e-6f; c.vocab = 5000; c.quant_group = 32;
    return c;
}

/* ---- the pair of backends --------------------------------------------------------------- */

typedef struct pair {
    eg_backend *cpu, *gpu;
} pair;

static int no_gpu;

static int pair_make(const eg_config *c, int max_tokens, pair *p) {
    eg_error err = {0};
    memset(p, 0, sizeof *p);
    eg_backend_opts o = {.name = "cpu", .max_tokens = max_tokens, .max_seq_len = 8192, .nthreads = 0, .device = 0};
    eg_status st = eg_backend_cpu_create(c, &o, &p->cpu, &err);
    CHECKF(st == EG_OK, "cpu backend: %s", err.msg);
    if (st) return 0;
    o.name = "cuda";
    st = eg_backend_cuda_create(c, &o, &p->gpu, &err);
    CHECKF(st == EG_OK, "cuda backend: %s", err.msg);
    if (st) {
        eg_backend_free(p->cpu);
        p->cpu = NULL;
        return 0;
    }
    return 1;
}

static void pair_free(pair *p) {
    eg_backend_free(p->cpu);
    eg_backend_free(p->gpu);
}

/* A buffer on both backends, filled from host data (NULL = zeros). */
typedef struct buf2 {
    void *c, *g;
    size_t n;
} buf2;

static buf2 b2(pair *p, const void *host, size_t bytes) {
    eg_error err = {0};
    buf2 b = {NULL, NULL, bytes};
    CHECK_OK(p->cpu->ops->alloc(p->cpu, bytes, &b.c, &err), &err);
    CHECK_OK(p->gpu->ops->alloc(p->gpu, bytes, &b.g, &err), &err);
    if (host) {
        memcpy(b.c, host, bytes);
        CHECK_OK(p->gpu->ops->to_device(p->gpu, b.g, host, bytes, &err), &err);
    } else {
        memset(b.c, 0, bytes);
        CHECK_OK(p->gpu->ops->memset0(p->gpu, b.g, bytes, &err), &err);
    }
    return b;
}

static void b2_free(pair *p, buf2 *b) {
    if (b->c) p->cpu->ops->release(p->cpu, b->c);
    if (b->g) p->gpu->ops->release(p->gpu, b->g);
    b->c = b->g = NULL;
}

/* The GPU copy on the host (caller frees). */
static void *fetch(pair *p, const buf2 *b) {
    eg_error err = {0};
    void *h = malloc(b->n ? b->n : 1);
    CHECK_OK(p->gpu->ops->to_host(p->gpu, h, b->g, b->n, &err), &err);
    CHECK_OK(p->gpu->ops->sync(p->gpu, &err), &err);
    return h;
}

/* Bound for paths that feed BF16 to cuBLAS: the backend splits activations into BF16
 * hi + lo pairs by default (near-FP32 products); EG_CUDA_GEMM=bf16 turns that off. */
static double bf16_bound(void) {
    const char *g = getenv("EG_CUDA_GEMM");
    return g && !strcmp(g, "bf16") ? 1e-2 : 1e-3;
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (isnan(a[i]) != isnan(b[i])) return INFINITY;
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

/* Compare a float buffer; print and check against bound. */
static double cmp_f32(pair *p, const buf2 *b, const char *what, double bound) {
    float *g = fetch(p, b);
    double e = rel_err(g, (const float *)b->c, (int64_t)(b->n / 4));
    printf("    %-58s rel %.3e (bound %.0e)\n", what, e, bound);
    CHECKF(e <= bound, "%s: relative error %.3e > %.0e", what, e, bound);
    free(g);
    return e;
}

/* ---- host weights ----------------------------------------------------------------------- */

typedef struct hw {
    eg_weight w;
    void *data, *scale;
    eg_weight dc, dg; /* uploaded to cpu / gpu */
} hw;

static void fill_bf16(uint16_t *d, int64_t n, float sd) {
    for (int64_t i = 0; i < n; i++) d[i] = eg_f32_to_bf16(nrand() * sd);
}

static hw make_w(eg_wfmt fmt, int64_t rows, int64_t cols, float sd) {
    hw o;
    memset(&o, 0, sizeof o);
    o.w.fmt = fmt;
    o.w.rows = rows;
    o.w.cols = cols;
    o.w.name = "test.weight";
    int64_t n = rows * cols;
    if (fmt == EG_W_F32) {
        float *d = malloc(4 * (size_t)n);
        for (int64_t i = 0; i < n; i++) d[i] = nrand() * sd;
        o.data = d;
    } else if (fmt == EG_W_BF16) {
        o.data = malloc(2 * (size_t)n);
        fill_bf16(o.data, n, sd);
    } else if (fmt == EG_W_F16) {
        /* values k/1024 with small k: exactly representable in F16 */
        uint16_t *d = malloc(2 * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            int k = (int)(urand() * 64) - 32;
            float v = (float)k / 1024.0f;
            /* build the half: sign, exponent, mantissa for |k| in [1, 32] */
            uint16_t h = 0;
            if (k) {
                int a = k < 0 ? -k : k, e = 0;
                while ((a >> e) > 1) e++;
                int mant = ((a << 10) >> e) & 0x3ff; /* a = 2^e * (1 + mant/1024) */
                h = (uint16_t)(((k < 0) << 15) | ((e - 10 + 15) << 10) | mant);
            }
            (void)v;
            d[i] = h;
        }
        o.data = d;
    } else if (fmt == EG_W_INT4) {
        int g = 32;
        int64_t words = rows * (cols / 8);
        uint32_t *d = malloc(4 * (size_t)words);
        for (int64_t i = 0; i < words; i++) d[i] = (uint32_t)next64();
        int64_t ns = rows * ((cols + g - 1) / g);
        uint16_t *s = malloc(2 * (size_t)ns);
        for (int64_t i = 0; i < ns; i++) s[i] = eg_f32_to_bf16(sd * (0.05f + (float)urand() * 0.2f));
        o.w.group = g;
        o.data = d;
        o.scale = s;
    } else if (fmt == EG_W_FP8) {
        uint8_t *d = malloc((size_t)n);
        for (int64_t i = 0; i < n; i++) {
            uint8_t v;
            do v = (uint8_t)next64(); while ((v & 0x7f) == 0x7f || ((v >> 3) & 15) > 9); /* no NaN, |v| <= 8 */
            d[i] = v;
        }
        int64_t ns = ((rows + 127) / 128) * ((cols + 127) / 128);
        float *s = malloc(4 * (size_t)ns);
        for (int64_t i = 0; i < ns; i++) s[i] = sd * (0.2f + (float)urand());
        o.data = d;
        o.scale = s;
    }
    o.w.data = o.data;
    o.w.scale = o.scale;
    return o;
}

static void hw_up(pair *p, hw *o) {
    eg_error err = {0};
    CHECK_OK(p->cpu->ops->weight_upload(p->cpu, &o->w, &o->dc, &err), &err);
    CHECK_OK(p->gpu->ops->weight_upload(p->gpu, &o->w, &o->dg, &err), &err);
}

static void hw_free(pair *p, hw *o) {
    if (p && p->gpu && o->dg.data) p->gpu->ops->weight_release(p->gpu, &o->dg);
    free(o->data);
    free(o->scale);
    memset(o, 0, sizeof *o);
}

static float *randv(int64_t n, float sd) {
    float *v = malloc(4 * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = nrand() * sd;
    return v;
}

static const char *fmt_name(eg_wfmt f) {
    switch (f) {
    case EG_W_F32: return "F32";
    case EG_W_BF16: return "BF16";
    case EG_W_F16: return "F16";
    case EG_W_INT4: return "INT4";
    case EG_W_FP8: return "FP8";
    default: return "?";
    }
}

/* ---- elementwise ops ------------------------------------------------------------------------ */

static void test_embed_norm_add_gather(void) {
    seed(1);
    eg_config c = small_cfg();
    pair p;
    if (!pair_make(&c, 64, &p)) return;
    eg_error err = {0};
    int T = 33, V = 5000, H = 7168;
    hw E = make_w(EG_W_BF16, V, H, 1.0f);
    hw_up(&p, &E);
    int32_t tok[33];
    for (int t = 0; t < T; t++) tok[t] = t == 0 ? 0 : t == 1 ? V - 1 : (int32_t)(urand() * V);
    buf2 tk = b2(&p, tok, sizeof tok), x = b2(&p, NULL, 4 * (size_t)T * H);
    CHECK_OK(p.cpu->ops->embed(p.cpu, tk.c, T, &E.dc, x.c, &err), &err);
    CHECK_OK(p.gpu->ops->embed(p.gpu, tk.g, T, &E.dg, x.g, &err), &err);
    cmp_f32(&p, &x, "embed BF16 [5000][7168], T=33", 0.0);

    /* rmsnorm / add_rmsnorm at H=7168 with BF16 and F32 weights */
    float *xv = randv((int64_t)T * H, 3.0f), *dv = randv((int64_t)T * H, 1.0f);
    buf2 xx = b2(&p, xv, 4 * (size_t)T * H), dx = b2(&p, dv, 4 * (size_t)T * H), y = b2(&p, NULL, 4 * (size_t)T * H);
    hw nw = make_w(EG_W_BF16, 1, H, 1.0f), nf = make_w(EG_W_F32, 1, H, 1.0f);
    hw_up(&p, &nw);
    hw_up(&p, &nf);
    CHECK_OK(p.cpu->ops->rmsnorm(p.cpu, xx.c, &nw.dc, T, H, 1e-6f, y.c, &err), &err);
    CHECK_OK(p.gpu->ops->rmsnorm(p.gpu, xx.g, &nw.dg, T, H, 1e-6f, y.g, &err), &err);
    cmp_f32(&p, &y, "rmsnorm H=7168 (BF16 weight)", 1e-6);
    CHECK_OK(p.cpu->ops->rmsnorm(p.cpu, xx.c, &nf.dc, T, H, 1e-6f, y.c, &err), &err);
    CHECK_OK(p.gpu->ops->rmsnorm(p.gpu, xx.g, &nf.dg, T, H, 1e-6f, y.g, &err), &err);
    cmp_f32(&p, &y, "rmsnorm H=7168 (F32 weight)", 1e-6);
    CHECK_OK(p.cpu->ops->add_rmsnorm(p.cpu, xx.c, dx.c, &nw.dc, T, H, 1e-6f, y.c, &err), &err);
    CHECK_OK(p.gpu->ops->add_rmsnorm(p.gpu, xx.g, dx.g, &nw.dg, T, H, 1e-6f, y.g, &err), &err);
    cmp_f32(&p, &xx, "add_rmsnorm residual x += dx", 0.0);
    cmp_f32(&p, &y, "add_rmsnorm output", 1e-6);
    CHECK_OK(p.cpu->ops->add(p.cpu, xx.c, dx.c, (int64_t)T * H - 5, &err), &err);
    CHECK_OK(p.gpu->ops->add(p.gpu, xx.g, dx.g, (int64_t)T * H - 5, &err), &err);
    cmp_f32(&p, &xx, "add (n = T*H - 5)", 0.0);
    int32_t idx[7] = {32, 0, 5, 5, 17, 1, 31};
    buf2 ix = b2(&p, idx, sizeof idx), g = b2(&p, NULL, 4 * 7 * (size_t)H);
    CHECK_OK(p.cpu->ops->gather_rows(p.cpu, xx.c, ix.c, 7, H, g.c, &err), &err);
    CHECK_OK(p.gpu->ops->gather_rows(p.gpu, xx.g, ix.g, 7, H, g.g, &err), &err);
    cmp_f32(&p, &g, "gather_rows n=7", 0.0);
    /* indices that came over a link (eg_cuda_gather_received): those outside the 33 source
       rows (an aborted receive's stale bytes) give zero rows, the rest as gather_rows */
    int32_t idx2[7] = {32, -1, 5, 33, 1000000, 0, 31}, safe[7];
    for (int i = 0; i < 7; i++) safe[i] = idx2[i] >= 0 && idx2[i] < 33 ? idx2[i] : 0;
    buf2 ix2 = b2(&p, idx2, sizeof idx2), ixs = b2(&p, safe, sizeof safe);
    CHECK_OK(p.cpu->ops->gather_rows(p.cpu, xx.c, ixs.c, 7, H, g.c, &err), &err);
    for (int i = 0; i < 7; i++)
        if (safe[i] != idx2[i]) memset((float *)g.c + (size_t)i * H, 0, sizeof(float) * (size_t)H);
    CHECK_OK(eg_cuda_gather_received(p.gpu, xx.g, 33, ix2.g, 7, H, g.g, &err), &err);
    cmp_f32(&p, &g, "gather of received indices (3 of 7 outside the rows: zeros)", 0.0);
    buf2 *bs[] = {&tk, &x, &xx, &dx, &y, &ix, &g, &ix2, &ixs};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) b2_free(&p, bs[i]);
    hw_free(&p, &E);
    hw_free(&p, &nw);
    hw_free(&p, &nf);
    free(xv);
    free(dv);
    pair_free(&p);
}

/* ---- linear ---------------------------------------------------------------------------------- */

static void linear_case(pair *p, eg_wfmt fmt, int64_t rows, int64_t cols, int T, double bound) {
    eg_error err = {0};
    hw W = make_w(fmt, rows, cols, 1.0f / sqrtf((float)cols));
    hw_up(p, &W);
    float *xv = randv((int64_t)T * cols, 1.0f);
    buf2 x = b2(p, xv, 4 * (size_t)T * cols), y = b2(p, NULL, 4 * (size_t)T * rows);
    CHECK_OK(p->cpu->ops->linear(p->cpu, x.c, T, &W.dc, y.c, &err), &err);
    CHECK_OK(p->gpu->ops->linear(p->gpu, x.g, T, &W.dg, y.g, &err), &err);
    char what[128];
    snprintf(what, sizeof what, "linear %s [%lld][%lld] T=%d", fmt_name(fmt), (long long)rows, (long long)cols, T);
    cmp_f32(p, &y, what, bound);
    b2_free(p, &x);
    b2_free(p, &y);
    hw_free(p, &W);
    free(xv);
}

/* Kimi widths (cuBLAS and the dequantising GEMM at size). */
static void test_linear_kimi(void) {
    seed(2);
    eg_config c = kimi_cfg();
    pair p;
    if (!pair_make(&c, 256, &p)) return;
    int Ts[] = {1, 37, 256};
    for (int i = 0; i < 3; i++) linear_case(&p, EG_W_BF16, 2048, 7168, Ts[i], bf16_bound());
    linear_case(&p, EG_W_BF16, 1536 + 64 + 512 - 64, 7168, 5, bf16_bound()); /* odd rows */
    linear_case(&p, EG_W_BF16, 32768, 7168, 3, bf16_bound());                /* lm_head-like */
    for (int i = 0; i < 2; i++) linear_case(&p, EG_W_INT4, 2048, 7168, Ts[i], 1e-4);
    linear_case(&p, EG_W_INT4, 7168, 2048, 37, 1e-4);
    linear_case(&p, EG_W_FP8, 1536, 7168, 37, 1e-4);
    pair_free(&p);
}

/* Every format at small and ragged shapes (partial tiles and scale blocks). */
static void test_linear_small(void) {
    seed(13);
    eg_config c = small_cfg();
    c.hidden = 1024; /* the CPU backend's row scratch must hold 544 columns */
    pair p;
    if (!pair_make(&c, 64, &p)) return;
    linear_case(&p, EG_W_BF16, 77, 130, 5, bf16_bound());
    /* one row (a drafter's chained step, a batch's last sequence) on the MLA drafter's
       q_a / kv_a / q_b shapes */
    linear_case(&p, EG_W_BF16, 40, 128, 1, bf16_bound());
    linear_case(&p, EG_W_BF16, 48, 128, 1, bf16_bound());
    linear_case(&p, EG_W_BF16, 96, 48, 1, bf16_bound());
    linear_case(&p, EG_W_INT4, 100, 96, 3, 1e-4);   /* cols not a multiple of the tile */
    linear_case(&p, EG_W_INT4, 130, 256, 40, 1e-4); /* rows and T past one tile */
    linear_case(&p, EG_W_FP8, 300, 544, 7, 1e-4);   /* partial 128-blocks both ways */
    linear_case(&p, EG_W_F32, 100, 200, 9, 1e-5);
    linear_case(&p, EG_W_F16, 64, 96, 9, 1e-5);
    pair_free(&p);
}

/* ---- SwiGLU MLP -------------------------------------------------------------------------------- */

static void mlp_case(pair *p, eg_wfmt fmt, int H, int I, int T, int accumulate, double bound) {
    eg_error err = {0};
    hw G = make_w(fmt, I, H, 1.0f / sqrtf((float)H)), U = make_w(fmt, I, H, 1.0f / sqrtf((float)H));
    hw D = make_w(fmt, H, I, 1.0f / sqrtf((float)I));
    hw_up(p, &G);
    hw_up(p, &U);
    hw_up(p, &D);
    float *xv = randv((int64_t)T * H, 1.0f), *yv = randv((int64_t)T * H, 0.1f);
    buf2 x = b2(p, xv, 4 * (size_t)T * H), y = b2(p, yv, 4 * (size_t)T * H);
    CHECK_OK(p->cpu->ops->swiglu_mlp(p->cpu, x.c, T, &G.dc, &U.dc, &D.dc, y.c, accumulate, &err), &err);
    CHECK_OK(p->gpu->ops->swiglu_mlp(p->gpu, x.g, T, &G.dg, &U.dg, &D.dg, y.g, accumulate, &err), &err);
    char what[128];
    snprintf(what, sizeof what, "swiglu_mlp %s H=%d I=%d T=%d%s", fmt_name(fmt), H, I, T, accumulate ? " (+=)" : "");
    cmp_f32(p, &y, what, bound);
    b2_free(p, &x);
    b2_free(p, &y);
    hw_free(p, &G);
    hw_free(p, &U);
    hw_free(p, &D);
    free(xv);
    free(yv);
}

static void test_swiglu(void) {
    seed(3);
    eg_config c = kimi_cfg();
    pair p;
    if (!pair_make(&c, 64, &p)) return;
    mlp_case(&p, EG_W_BF16, 7168, 2048, 37, 0, bf16_bound());
    mlp_case(&p, EG_W_BF16, 7168, 2048, 1, 1, bf16_bound());
    mlp_case(&p, EG_W_INT4, 1024, 512, 19, 1, 1e-4);
    mlp_case(&p, EG_W_FP8, 640, 384, 5, 0, 1e-4);
    pair_free(&p);
}

/* ---- MLA attention ------------------------------------------------------------------------------ */

typedef struct mla_setup {
    pair *p;
    eg_config c;
    int NH, C, DN, DR, DV, W, S, MB, BS;
    int64_t nblocks;
    buf2 cache, table, inv_freq;
    hw norm, kvb;
    int record; /* the CUDA call recorded as a graph and replayed */
} mla_setup;

static void mla_init(mla_setup *m, pair *p, const eg_config *c, int S, int MB, int BS) {
    memset(m, 0, sizeof *m);
    m->p = p;
    m->c = *c;
    m->NH = c->n_heads; m->C = c->kv_lora_rank; m->DN = c->qk_nope; m->DR = c->qk_rope; m->DV = c->v_head;
    m->W = m->C + m->DR; m->S = S; m->MB = MB; m->BS = BS;
    m->nblocks = (int64_t)S * MB;
    /* shuffled block table: slot s's logical block i lives anywhere */
    int32_t *tab = malloc(sizeof(int32_t) * (size_t)m->nblocks);
    for (int64_t i = 0; i < m->nblocks; i++) tab[i] = (int32_t)i;
    for (int64_t i = m->nblocks - 1; i > 0; i--) {
        int64_t j = (int64_t)(urand() * (double)(i + 1));
        int32_t t = tab[i]; tab[i] = tab[j]; tab[j] = t;
    }
    m->table = b2(p, tab, sizeof(int32_t) * (size_t)m->nblocks);
    free(tab);
    size_t cbytes = 2 * (size_t)m->nblocks * (size_t)BS * (size_t)m->W;
    /* random BF16 history (the same bits on both sides) */
    uint16_t *hist = malloc(cbytes);
    fill_bf16(hist, (int64_t)(cbytes / 2), 1.0f);
    m->cache = b2(p, hist, cbytes);
    free(hist);
    float *inv = malloc(sizeof(float) * (size_t)(m->DR / 2));
    for (int i = 0; i < m->DR / 2; i++) inv[i] = (float)pow(c->rope_theta, -2.0 * i / m->DR);
    m->inv_freq = b2(p, inv, sizeof(float) * (size_t)(m->DR / 2));
    free(inv);
    m->norm = make_w(EG_W_BF16, 1, m->C, 1.0f);
    for (int i = 0; i < m->C; i++) ((uint16_t *)m->norm.data)[i] = eg_f32_to_bf16(1.0f + 0.3f * nrand());
    m->kvb = make_w(EG_W_BF16, (int64_t)m->NH * (m->DN + m->DV), m->C, 1.0f / sqrtf((float)m->C));
    hw_up(p, &m->norm);
    hw_up(p, &m->kvb);
}

static void mla_free(mla_setup *m) {
    b2_free(m->p, &m->cache);
    b2_free(m->p, &m->table);
    b2_free(m->p, &m->inv_freq);
    hw_free(m->p, &m->norm);
    hw_free(m->p, &m->kvb);
}

/* One call on both backends with T tokens at (slot, pos); compares out and the cache. */
static void mla_call(mla_setup *m, int T, const int32_t *slot, const int32_t *pos, int h0, int h1, float attn_factor,
                     const char *what) {
    pair *p = m->p;
    eg_error err = {0};
    int max_pos = 0;
    for (int t = 0; t < T; t++) max_pos = pos[t] + 1 > max_pos ? pos[t] + 1 : max_pos;
    float *q = randv((int64_t)T * m->NH * (m->DN + m->DR), 1.0f), *kv = randv((int64_t)T * m->W, 1.0f);
    buf2 bq = b2(p, q, 4 * (size_t)T * m->NH * (m->DN + m->DR)), bkv = b2(p, kv, 4 * (size_t)T * m->W);
    buf2 bpos = b2(p, pos, 4 * (size_t)T), bslot = b2(p, slot, 4 * (size_t)T);
    buf2 out = b2(p, NULL, 4 * (size_t)T * m->NH * m->DV);
    eg_mla_args a = {.T = T, .max_blocks = m->MB, .block_size = m->BS, .max_pos = max_pos,
                     .rope_attn_factor = attn_factor,
                     .softmax_scale = 1.0f / sqrtf((float)(m->DN + m->DR)), .eps = 1e-6f, .h0 = h0, .h1 = h1};
    a.pos = bpos.c; a.slot = bslot.c; a.block_table = m->table.c; a.q = bq.c; a.kv = bkv.c;
    a.kv_a_norm = &m->norm.dc; a.kv_b = &m->kvb.dc; a.cache.data = m->cache.c; a.rope_inv_freq = m->inv_freq.c;
    a.out = out.c;
    CHECK_OK(p->cpu->ops->mla_attention(p->cpu, &a, &err), &err);
    a.pos = bpos.g; a.slot = bslot.g; a.block_table = m->table.g; a.q = bq.g; a.kv = bkv.g;
    a.kv_a_norm = &m->norm.dg; a.kv_b = &m->kvb.dg; a.cache.data = m->cache.g; a.rope_inv_freq = m->inv_freq.g;
    a.out = out.g;
    if (m->record) {
        void *graph = NULL;
        int ran = 0;
        CHECK_OK(p->gpu->ops->graph_begin(p->gpu, &err), &err);
        CHECK_OK(p->gpu->ops->mla_attention(p->gpu, &a, &err), &err);
        CHECK_OK(p->gpu->ops->graph_end(p->gpu, &graph, &err), &err);
        CHECK_OK(p->gpu->ops->graph_launch(p->gpu, graph, &ran, &err), &err);
        CHECK(ran == 1);
        p->gpu->ops->graph_free(p->gpu, graph);
    } else {
        CHECK_OK(p->gpu->ops->mla_attention(p->gpu, &a, &err), &err);
    }
    cmp_f32(p, &out, what, bf16_bound());
    /* the cache rows written by this call: identical bits expected */
    uint16_t *gc = fetch(p, &m->cache);
    const uint16_t *cc = m->cache.c;
    int32_t *tab = m->table.c;
    int64_t diff = 0, total = 0;
    for (int t = 0; t < T; t++) {
        int64_t row = ((int64_t)tab[(int64_t)slot[t] * m->MB + pos[t] / m->BS] * m->BS + pos[t] % m->BS) * m->W;
        for (int k = 0; k < m->W; k++, total++) diff += gc[row + k] != cc[row + k];
    }
    int64_t alldiff = 0;
    for (size_t i = 0; i < m->cache.n / 2; i++) alldiff += gc[i] != cc[i];
    printf("    %-58s %lld of %lld cache values differ (%lld in the whole cache)\n", "  cache rows written", (long long)diff,
           (long long)total, (long long)alldiff);
    CHECKF(diff * 1000 <= total && alldiff == diff, "%s: %lld cache values differ", what, (long long)alldiff);
    free(gc);
    free(q);
    free(kv);
    buf2 *bs[] = {&bq, &bkv, &bpos, &bslot, &out};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) b2_free(p, bs[i]);
}

static void test_mla_small(void) {
    seed(4);
    eg_config c = small_cfg();
    pair p;
    if (!pair_make(&c, 64, &p)) return;
    mla_setup m;
    mla_init(&m, &p, &c, 2, 8, 4);
    int32_t slot[16], pos[16];
    for (int t = 0; t < 10; t++) { slot[t] = 0; pos[t] = t; }
    for (int t = 0; t < 6; t++) { slot[10 + t] = 1; pos[10 + t] = t; }
    mla_call(&m, 16, slot, pos, 0, c.n_heads, 1.0f, "mla small: mixed prefill T=16 (2 slots)");
    int32_t s2[2] = {0, 1}, p2[2] = {10, 6};
    mla_call(&m, 2, s2, p2, 0, c.n_heads, 1.0f, "mla small: decode T=2");
    int32_t s3[3] = {1, 0, 1}, p3[3] = {7, 11, 8};
    mla_call(&m, 3, s3, p3, 1, 3, 1.3f, "mla small: decode heads [1,3), attn_factor 1.3");
    int32_t s1[1] = {0}, p1[1] = {12}; /* one row alone (a drafter's chained step, a batch's last sequence) */
    mla_call(&m, 1, s1, p1, 0, c.n_heads, 1.0f, "mla small: decode T=1");
    mla_free(&m);
    pair_free(&p);
}

/* Both attention kernels: 20 heads (a full and a partial group of 16 on the tensor-core
 * path), the same through the CUDA-core kernel (EG_CUDA_MLA=simt), a latent width the
 * tensor-core path does not take (48: falls back), a row of C + DR = 72 that the
 * tensor-core path pads to 80, one of 70 (no multiple of 8: 4-byte copies), and the
 * tensor-core kernel's 16- and 32-row tiles forced (EG_CUDA_MLA=tc16 / tc32: sm_120
 * takes 16, sm_90 32). Sequence 1 sits at 600: many tiles, so the cp.async double
 * buffer turns over. */
static void test_mla_paths(void) {
    const char *what[7] = {"mla 20 heads C=64: tensor cores, prefill + decode",
                           "mla 20 heads C=64: CUDA cores (EG_CUDA_MLA=simt)",
                           "mla 20 heads C=48: CUDA-core fallback",
                           "mla 20 heads C=64 DR=8: tensor cores, row padded",
                           "mla 20 heads C=64: tensor cores, 16-row tiles (tc16)",
                           "mla 20 heads C=64: tensor cores, 32-row tiles (tc32)",
                           "mla 20 heads C=64 DR=6: tensor cores, 4-byte copies"};
    const char *env[7] = {NULL, "simt", NULL, NULL, "tc16", "tc32", "tc16"};
    for (int v = 0; v < 7; v++) {
        seed(20 + (uint64_t)v);
        eg_config c = small_cfg();
        c.n_heads = 20;
        c.kv_lora_rank = v == 2 ? 48 : 64;
        if (v == 3) c.qk_rope = 8;
        if (v == 6) c.qk_rope = 6;
        if (env[v]) setenv("EG_CUDA_MLA", env[v], 1);
        pair p;
        int ok = pair_make(&c, 64, &p);
        unsetenv("EG_CUDA_MLA");
        if (!ok) return;
        mla_setup m;
        mla_init(&m, &p, &c, 2, 80, 8);
        int32_t slot[12], pos[12];
        for (int t = 0; t < 9; t++) { slot[t] = 0; pos[t] = t; }
        slot[9] = 1; pos[9] = 600;
        slot[10] = 1; pos[10] = 601;
        slot[11] = 0; pos[11] = 9;
        mla_call(&m, 12, slot, pos, 0, c.n_heads, 1.0f, what[v]);
        int32_t s1[2] = {1, 0}, p1[2] = {602, 10};
        mla_call(&m, 2, s1, p1, 3, 19, 1.1f, "   ... decode, heads [3,19)");
        mla_free(&m);
        pair_free(&p);
    }
}

/* Small dims, long history: several sequence splits, and a short sequence in the same
 * call whose later splits are empty. */
static void test_mla_small_long(void) {
    seed(12);
    eg_config c = small_cfg();
    pair p;
    if (!pair_make(&c, 64, &p)) return;
    mla_setup m;
    mla_init(&m, &p, &c, 2, 300, 4);
    int32_t s[3] = {0, 0, 1}, q[3] = {1000, 1001, 3};
    mla_call(&m, 3, s, q, 0, c.n_heads, 1.0f, "mla small long: 1000/1001 with a 4-token sequence");
    int32_t s1[1] = {1}, q1[1] = {1199};
    mla_call(&m, 1, s1, q1, 0, c.n_heads, 1.0f, "mla small long: T=1 at 1199");
    mla_free(&m);
    pair_free(&p);
}

static void test_mla_kimi(void) {
    seed(5);
    eg_config c = kimi_cfg();
    pair p;
    if (!pair_make(&c, 128, &p)) return;
    mla_setup m;
    mla_init(&m, &p, &c, 2, 4, 64);
    int32_t slot[128], pos[128];
    for (int t = 0; t < 100; t++) { slot[t] = 0; pos[t] = t; }
    for (int t = 0; t < 28; t++) { slot[100 + t] = 1; pos[100 + t] = t; }
    mla_call(&m, 128, slot, pos, 0, 64, 1.0f, "mla Kimi: mixed prefill T=128");
    int32_t s2[2] = {0, 1}, p2[2] = {100, 28};
    mla_call(&m, 2, s2, p2, 8, 40, 1.0f, "mla Kimi: decode T=2 heads [8,40)");
    mla_free(&m);
    pair_free(&p);
}

/* The tensor-core kernel's shared-memory opt-in is only ever raised: Kimi's rows (W 576,
 * ~75 KB with 32-row tiles), then a narrow call (W 72, under 48 KB) on the same kernel,
 * then Kimi's again recorded as a graph, where the opt-in cannot be raised. Setting each
 * call's exact size lowered it, and the recorded launch was refused. */
static void test_mla_graph(void) {
    seed(7);
    eg_config ck = kimi_cfg(), cs = small_cfg();
    cs.n_heads = 20;
    cs.kv_lora_rank = 64;
    setenv("EG_CUDA_MLA", "tc32", 1); /* the same kernel for both on sm_90 and sm_120 */
    pair pk, ps;
    int ok = pair_make(&ck, 8, &pk);
    if (ok && !pair_make(&cs, 8, &ps)) {
        pair_free(&pk);
        ok = 0;
    }
    unsetenv("EG_CUDA_MLA");
    if (!ok) return;
    mla_setup mk, ms;
    mla_init(&mk, &pk, &ck, 2, 4, 64);
    mla_init(&ms, &ps, &cs, 2, 8, 8);
    int32_t sl[2] = {0, 1}, pa[2] = {100, 28}, pb[2] = {40, 20}, pc[2] = {101, 29};
    mla_call(&mk, 2, sl, pa, 0, 64, 1.0f, "mla graph: Kimi decode T=2");
    mla_call(&ms, 2, sl, pb, 0, 20, 1.0f, "mla graph: then W 72, T=2");
    mk.record = 1;
    mla_call(&mk, 2, sl, pc, 0, 64, 1.0f, "mla graph: then Kimi recorded and replayed");
    mla_free(&mk);
    mla_free(&ms);
    pair_free(&pk);
    pair_free(&ps);
}

/* 4K-position history in a shuffled paged cache: the decode splits the sequence. */
static void test_mla_long(void) {
    seed(6);
    eg_config c = kimi_cfg();
    pair p;
    if (!pair_make(&c, 16, &p)) return;
    mla_setup m;
    mla_init(&m, &p, &c, 2, 72, 64);
    int32_t s[3] = {0, 0, 1}, q[3] = {4096, 4097, 1500};
    mla_call(&m, 3, s, q, 0, 64, 1.0f, "mla Kimi long: decode at 4096/4097 and 1500");
    int32_t s1[1] = {1}, q1[1] = {4600};
    mla_call(&m, 1, s1, q1, 0, 64, 1.0f, "mla Kimi long: decode T=1 at 4600");
    mla_free(&m);
    pair_free(&p);
}

/* ---- router ------------------------------------------------------------------------------------- */

static void router_case(int E, int G, int TG, int K, int H, int T, int norm, float scale) {
    eg_config c = kimi_cfg();
    c.n_experts = E; c.n_group = G; c.topk_group = TG; c.topk = K; c.hidden = H; c.norm_topk = norm;
    c.routed_scale = scale;
    pair p;
    if (!pair_make(&c, T, &p)) return;
    eg_error err = {0};
    hw gate = make_w(EG_W_BF16, E, H, 1.0f / sqrtf((float)H)), bias = make_w(EG_W_F32, 1, E, 0.05f);
    hw_up(&p, &gate);
    hw_up(&p, &bias);
    float *xv = randv((int64_t)T * H, 1.0f);
    buf2 x = b2(&p, xv, 4 * (size_t)T * H), ids = b2(&p, NULL, 4 * (size_t)T * K), w = b2(&p, NULL, 4 * (size_t)T * K);
    eg_router_args a = {.T = T, .n_group = G, .topk_group = TG, .topk = K, .norm_topk = norm, .routed_scale = scale};
    a.x = x.c; a.gate = &gate.dc; a.bias = &bias.dc; a.ids = ids.c; a.weights = w.c;
    CHECK_OK(p.cpu->ops->router(p.cpu, &a, &err), &err);
    a.x = x.g; a.gate = &gate.dg; a.bias = &bias.dg; a.ids = ids.g; a.weights = w.g;
    CHECK_OK(p.gpu->ops->router(p.gpu, &a, &err), &err);
    int32_t *gi = fetch(&p, &ids), *ci = ids.c;
    float *gw = fetch(&p, &w), *cw = w.c;
    int bad_tokens = 0;
    double num = 0, den = 0;
    for (int t = 0; t < T; t++) {
        int same = !memcmp(gi + t * K, ci + t * K, sizeof(int32_t) * (size_t)K);
        bad_tokens += !same;
        if (same)
            for (int k = 0; k < K; k++) {
                double d = gw[t * K + k] - cw[t * K + k];
                num += d * d;
                den += (double)cw[t * K + k] * cw[t * K + k];
            }
    }
    double e = sqrt(num) / (den > 0 ? sqrt(den) : 1);
    printf("    router E=%d groups %d/%d top-%d H=%d T=%d: %d token(s) with different experts, weights rel %.3e\n", E, TG,
           G, K, H, T, bad_tokens, e);
    /* FP32 logits summed in another order can flip a near-tie; more than one is a bug */
    CHECKF(bad_tokens <= 1, "router: %d tokens chose different experts", bad_tokens);
    CHECKF(e <= 1e-5, "router weights rel %.3e", e);
    free(gi);
    free(gw);
    free(xv);
    b2_free(&p, &x);
    b2_free(&p, &ids);
    b2_free(&p, &w);
    hw_free(&p, &gate);
    hw_free(&p, &bias);
    pair_free(&p);
}

static void test_router(void) {
    seed(7);
    router_case(384, 1, 1, 8, 7168, 64, 1, 2.827f); /* Kimi */
    router_case(16, 4, 2, 4, 256, 50, 1, 2.5f);     /* tiny-a: group-limited */
    router_case(256, 8, 4, 8, 7168, 20, 1, 2.5f);   /* DeepSeek-V3 */
    router_case(64, 8, 3, 6, 512, 30, 0, 1.0f);     /* no normalisation */
    router_case(5000, 1, 1, 8, 256, 6, 1, 2.5f);    /* 60 KB of shared memory: the opt-in */
}

/* ---- MoE ---------------------------------------------------------------------------------------- */

/* E routed experts of fmt on both backends: gate and up [F][H], down [H][F]. */
typedef struct moe_experts {
    hw *w;              /* [E][3] */
    eg_expert_w *c, *g; /* [E] views on the CPU and the GPU backend */
    int E;
} moe_experts;

static moe_experts moe_experts_make(pair *p, eg_wfmt fmt, int E, int H, int F) {
    moe_experts x = {calloc((size_t)E, 3 * sizeof(hw)), calloc((size_t)E, sizeof(eg_expert_w)),
                     calloc((size_t)E, sizeof(eg_expert_w)), E};
    for (int e = 0; e < E; e++) {
        hw *w3 = x.w + 3 * e;
        w3[0] = make_w(fmt, F, H, 1.0f / sqrtf((float)H));
        w3[1] = make_w(fmt, F, H, 1.0f / sqrtf((float)H));
        w3[2] = make_w(fmt, H, F, 1.0f / sqrtf((float)F));
        for (int j = 0; j < 3; j++) hw_up(p, &w3[j]);
        x.c[e].gate = w3[0].dc; x.c[e].up = w3[1].dc; x.c[e].down = w3[2].dc;
        x.g[e].gate = w3[0].dg; x.g[e].up = w3[1].dg; x.g[e].down = w3[2].dg;
    }
    return x;
}

static void moe_experts_free(pair *p, moe_experts *x) {
    for (int i = 0; i < 3 * x->E; i++) hw_free(p, &x->w[i]);
    free(x->w);
    free(x->c);
    free(x->g);
}

/* Routing of T tokens: K distinct experts each, in random slot order; weights 0.1 + u, or
 * with spread over six decades (1e3, 1, 1e-3 times 0.5 + u), where an order of addition
 * shows in the bits. ids, wts: [T][K]. */
static void moe_routing(int T, int K, int E, int spread, int32_t *ids, float *wts) {
    static const float mag[3] = {1e3f, 1.0f, 1e-3f};
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                e = (int)(urand() * E);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= ids[t * K + j] == e;
            } while (dup);
            ids[t * K + k] = e;
            wts[t * K + k] = spread ? mag[(t + k) % 3] * (0.5f + (float)urand()) : 0.1f + (float)urand();
        }
}

/* out (optional): the GPU result, fetched (caller frees). */
static void moe_case_out(eg_wfmt fmt, int E, int K, int H, int F, int T, int e0, int e1, double bound, float **out) {
    eg_config c = kimi_cfg();
    c.n_experts = E; c.topk = K; c.hidden = H; c.moe_inter = F; c.inter = F;
    pair p;
    if (!pair_make(&c, T, &p)) return;
    eg_error err = {0};
    double t0 = eg_now();
    moe_experts ex = moe_experts_make(&p, fmt, E, H, F);
    eg_expert_w *xc = ex.c, *xg = ex.g;
    double t1 = eg_now();
    /* routing: distinct experts per token, random weights */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * K);
    float *wts = malloc(sizeof(float) * (size_t)T * K);
    moe_routing(T, K, E, 0, ids, wts);
    float *xv = randv((int64_t)T * H, 1.0f), *yv = randv((int64_t)T * H, 0.1f);
    buf2 x = b2(&p, xv, 4 * (size_t)T * H), y = b2(&p, yv, 4 * (size_t)T * H);
    buf2 bi = b2(&p, ids, 4 * (size_t)T * K), bw = b2(&p, wts, 4 * (size_t)T * K);
    eg_moe_args a = {.T = T, .topk = K, .e0 = e0, .e1 = e1};
    a.x = x.c; a.ids = bi.c; a.weights = bw.c; a.experts = xc; a.y = y.c;
    CHECK_OK(p.cpu->ops->moe(p.cpu, &a, &err), &err);
    double t2 = eg_now();
    a.x = x.g; a.ids = bi.g; a.weights = bw.g; a.experts = xg; a.y = y.g;
    CHECK_OK(p.gpu->ops->moe(p.gpu, &a, &err), &err);
    /* a second call reuses the cached expert table */
    CHECK_OK(p.gpu->ops->sync(p.gpu, &err), &err);
    char what[160];
    snprintf(what, sizeof what, "moe %s E=%d top-%d H=%d F=%d T=%d experts [%d,%d)", fmt_name(fmt), E, K, H, F, T, e0,
             e1);
    cmp_f32(&p, &y, what, bound);
    /* a fingerprint of the result's bits, to compare builds (e.g. a launch change that
     * must not move a bit) and machines */
    float *got = fetch(&p, &y);
    uint64_t fp = 1469598103934665603ull;
    const unsigned char *gb = (const unsigned char *)got;
    for (size_t i = 0; gb && i < 4 * (size_t)T * (size_t)H; i++) fp = (fp ^ gb[i]) * 1099511628211ull;
    if (out) *out = got;
    else free(got);
    printf("      (make+upload %.1fs, cpu %.1fs; result bits %016llx)\n", t1 - t0, t2 - t1, (unsigned long long)fp);
    free(ids);
    free(wts);
    free(xv);
    free(yv);
    buf2 *bs[] = {&x, &y, &bi, &bw};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) b2_free(&p, bs[i]);
    moe_experts_free(&p, &ex);
    pair_free(&p);
}

static void moe_case(eg_wfmt fmt, int E, int K, int H, int F, int T, int e0, int e1, double bound) {
    moe_case_out(fmt, E, K, H, F, T, e0, e1, bound, NULL);
}

/* INT4 through the cp.async pipeline (default) and through the register prefetch
 * (EG_CUDA_MOE=reg): the same products in the same order, so the same bits; a
 * multi-tile call and a split-K decode call. */
static void moe_int4_paths(int E, int K, int H, int F, int T, uint64_t salt) {
    float *a = NULL, *b = NULL;
    seed(salt);
    moe_case_out(EG_W_INT4, E, K, H, F, T, 0, E, 1e-4, &a);
    setenv("EG_CUDA_MOE", "reg", 1);
    seed(salt);
    moe_case_out(EG_W_INT4, E, K, H, F, T, 0, E, 1e-4, &b);
    unsetenv("EG_CUDA_MOE");
    int same = a && b && !memcmp(a, b, sizeof(float) * (size_t)T * (size_t)H);
    printf("    moe INT4 H=%d F=%d T=%d: cp.async pipeline vs register prefetch: %s\n", H, F, T,
           same ? "bit-identical" : "DIFFERENT");
    CHECK(same);
    free(a);
    free(b);
}

static void test_moe_small(void) {
    seed(8);
    moe_case(EG_W_BF16, 8, 2, 256, 128, 300, 0, 8, 1e-4);    /* > 32 rows per expert: several tiles */
    moe_case(EG_W_BF16, 8, 2, 256, 128, 300, 2, 6, 1e-4);    /* expert range */
    moe_case(EG_W_INT4, 16, 4, 512, 192, 50, 0, 16, 1e-4);
    moe_case(EG_W_FP8, 16, 4, 384, 256, 40, 3, 16, 1e-4);
    moe_case(EG_W_BF16, 16, 4, 256, 128, 1500, 0, 16, 1e-4); /* > 1024 tokens: two passes */
    /* the same shapes through the FP32 CUDA-core tiles (BF16 and INT4 above took the
     * tensor-core path): both paths stay checked */
    setenv("EG_CUDA_MOE", "simt", 1);
    moe_case(EG_W_BF16, 8, 2, 256, 128, 300, 0, 8, 1e-4);
    moe_case(EG_W_INT4, 16, 4, 512, 192, 50, 0, 16, 1e-4);
    unsetenv("EG_CUDA_MOE");
    /* widths not a multiple of 64 fall back to the CUDA-core tiles */
    moe_case(EG_W_INT4, 8, 2, 96, 160, 20, 0, 8, 1e-4);
    /* decode-sized calls (T*K <= 64) split K on the tensor-core path: 2 splits of
     * H = F = 1024 (with an expert range, so fewer rows than T*K), 4 splits of H = 2048 */
    moe_case(EG_W_INT4, 16, 4, 1024, 1024, 3, 3, 12, 1e-4);
    moe_case(EG_W_BF16, 8, 2, 2048, 512, 1, 0, 8, 1e-4);
    moe_int4_paths(8, 2, 512, 192, 70, 31); /* several tiles per expert, 8 k-steps > the 4 stages */
    moe_int4_paths(16, 4, 1024, 512, 2, 32); /* split K */
}

/* The combine's order on the GPU: each token's contributions go in ascending expert id
 * (engine/backend.h eg_moe_order), so experts [0, x) then [x, E) into the same y give the
 * full call's bits at every cut (what a layer split between two pipeline stages needs),
 * with router slots in random order and weights over six decades so that an order shows.
 * The full call is also checked against the CPU backend (bound 1e-4). */
static void moe_fold_case(eg_wfmt fmt, int E, int K, int H, int F, int T) {
    eg_config c = kimi_cfg();
    c.n_experts = E; c.topk = K; c.hidden = H; c.moe_inter = F; c.inter = F;
    pair p;
    if (!pair_make(&c, T, &p)) return;
    eg_error err = {0};
    moe_experts ex = moe_experts_make(&p, fmt, E, H, F);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * K);
    float *wts = malloc(sizeof(float) * (size_t)T * K);
    moe_routing(T, K, E, 1, ids, wts);
    float *xv = randv((int64_t)T * H, 1.0f);
    size_t yb = 4 * (size_t)T * H;
    buf2 x = b2(&p, xv, 4 * (size_t)T * H), y = b2(&p, NULL, yb), y2 = b2(&p, NULL, yb);
    buf2 bi = b2(&p, ids, 4 * (size_t)T * K), bw = b2(&p, wts, 4 * (size_t)T * K);
    eg_moe_args a = {.T = T, .topk = K, .e0 = 0, .e1 = E};
    a.x = x.c; a.ids = bi.c; a.weights = bw.c; a.experts = ex.c; a.y = y.c;
    CHECK_OK(p.cpu->ops->moe(p.cpu, &a, &err), &err);
    a.x = x.g; a.ids = bi.g; a.weights = bw.g; a.experts = ex.g; a.y = y.g;
    CHECK_OK(p.gpu->ops->moe(p.gpu, &a, &err), &err);
    char what[160];
    snprintf(what, sizeof what, "moe fold %s E=%d top-%d H=%d F=%d T=%d, the full call", fmt_name(fmt), E, K, H, F, T);
    cmp_f32(&p, &y, what, 1e-4);
    float *full = fetch(&p, &y);
    int cuts[3] = {1, E / 2, E - 1}, bad = 0;
    for (int i = 0; i < 3 && full; i++) {
        CHECK_OK(p.gpu->ops->memset0(p.gpu, y2.g, yb, &err), &err);
        eg_moe_args lo = a, hi = a;
        lo.e1 = cuts[i]; lo.y = y2.g;
        hi.e0 = cuts[i]; hi.y = y2.g;
        CHECK_OK(p.gpu->ops->moe(p.gpu, &lo, &err), &err);
        CHECK_OK(p.gpu->ops->moe(p.gpu, &hi, &err), &err);
        float *got = fetch(&p, &y2);
        int diff = 0;
        for (size_t j = 0; got && j < (size_t)T * H; j++) diff += memcmp(&got[j], &full[j], 4) != 0;
        printf("    %s: experts [0,%d) then [%d,%d): %d of %d elements differ\n", fmt_name(fmt), cuts[i], cuts[i], E,
               diff, T * H);
        bad += diff != 0;
        free(got);
    }
    CHECK(bad == 0);
    free(full);
    free(ids);
    free(wts);
    free(xv);
    buf2 *bs[] = {&x, &y, &y2, &bi, &bw};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) b2_free(&p, bs[i]);
    moe_experts_free(&p, &ex);
    pair_free(&p);
}

static void test_moe_fold(void) {
    seed(12);
    moe_fold_case(EG_W_BF16, 8, 3, 256, 128, 40);  /* tensor-core tiles */
    moe_fold_case(EG_W_INT4, 16, 4, 512, 192, 3);  /* decode-sized: split K */
    setenv("EG_CUDA_MOE", "simt", 1);
    moe_fold_case(EG_W_INT4, 16, 4, 512, 192, 20); /* the FP32 CUDA-core tiles */
    unsetenv("EG_CUDA_MOE");
}

static void test_moe_kimi(void) {
    seed(9);
    moe_case(EG_W_INT4, 384, 8, 7168, 2048, 37, 0, 384, 1e-4);
}

static void test_moe_kimi_range(void) {
    seed(10);
    moe_case(EG_W_INT4, 384, 8, 7168, 2048, 1, 100, 300, 1e-4);
}

/* ---- offsets past 2^31 (bytes or elements) at Kimi's real sizes ---------------------------------- */

/* The whole BF16 [163840][7168] table (2.35 GB): embed of ids near its end, then the same
 * table as lm_head through cuBLAS, the last rows (byte offsets past 2^31) on their own.
 * ~2.5 min on the emulator; not among run_emu.sh's default cases. */
static void test_big_embed_lmhead(void) {
    seed(101);
    eg_config c = kimi_cfg();
    pair p;
    if (!pair_make(&c, 64, &p)) return;
    eg_error err = {0};
    int V = 163840, H = 7168, T = 4;
    hw E = make_w(EG_W_BF16, V, H, 0.05f); /* 2.35 GB: byte offsets of the last rows > 2^31 */
    hw_up(&p, &E);
    int32_t tok[4] = {V - 1, 150001, 0, 149797};
    buf2 tk = b2(&p, tok, sizeof tok), x = b2(&p, NULL, 4 * (size_t)T * H);
    CHECK_OK(p.cpu->ops->embed(p.cpu, tk.c, T, &E.dc, x.c, &err), &err);
    CHECK_OK(p.gpu->ops->embed(p.gpu, tk.g, T, &E.dg, x.g, &err), &err);
    cmp_f32(&p, &x, "embed BF16 [163840][7168], ids up to 163839", 0.0);
    /* the same table as lm_head: logits [T][163840] through cuBLAS (rows > 2^31 bytes in) */
    buf2 y = b2(&p, NULL, 4 * (size_t)T * V);
    CHECK_OK(p.cpu->ops->linear(p.cpu, x.c, T, &E.dc, y.c, &err), &err);
    CHECK_OK(p.gpu->ops->linear(p.gpu, x.g, T, &E.dg, y.g, &err), &err);
    cmp_f32(&p, &y, "lm_head BF16 [163840][7168] T=4", bf16_bound());
    /* the last rows alone (where a 32-bit byte offset would wrap) */
    {
        float *g = fetch(&p, &y);
        const float *cc = y.c;
        double num = 0, den = 0;
        for (int t = 0; t < T; t++)
            for (int r = 150000; r < V; r++) {
                double d = g[(size_t)t * V + r] - cc[(size_t)t * V + r];
                num += d * d; den += (double)cc[(size_t)t * V + r] * cc[(size_t)t * V + r];
            }
        double e = sqrt(num) / sqrt(den > 0 ? den : 1);
        printf("    lm_head rows 150000..163839 only: rel %.3e\n", e);
        CHECK(e <= bf16_bound());
        free(g);
    }
    b2_free(&p, &tk); b2_free(&p, &x); b2_free(&p, &y);
    hw_free(&p, &E);
    pair_free(&p);
}

/* A latent cache of more than 2^31 BF16 elements (4.3 GB) with the slot's blocks mapped at
 * the end of the pool: row offsets (blk*BS + pos%BS)*576 exceed 2^31. ~5 min and 13 GB of
 * host memory on the emulator; not among run_emu.sh's default cases. */
static void test_big_mla_cache(void) {
    seed(102);
    eg_config c = kimi_cfg();
    pair p;
    if (!pair_make(&c, 16, &p)) return;
    eg_error err = {0};
    mla_setup m;
    memset(&m, 0, sizeof m);
    m.p = &p; m.c = c;
    m.NH = c.n_heads; m.C = c.kv_lora_rank; m.DN = c.qk_nope; m.DR = c.qk_rope; m.DV = c.v_head;
    m.W = m.C + m.DR; m.S = 2; m.BS = 64; m.MB = 8;
    m.nblocks = 58300; /* 58300*64*576 = 2.149e9 elements > 2^31 */
    int32_t tab[16];
    for (int i = 0; i < 16; i++) tab[i] = (int32_t)(m.nblocks - 1 - i * 3); /* both slots at the pool's end */
    m.table = b2(&p, tab, sizeof tab);
    size_t cbytes = 2 * (size_t)m.nblocks * (size_t)m.BS * (size_t)m.W;
    m.cache = b2(&p, NULL, cbytes);
    /* random history in the blocks the table maps (same bits on both sides) */
    size_t blk = 2 * (size_t)m.BS * (size_t)m.W;
    uint16_t *hb = malloc(blk);
    for (int i = 0; i < 16; i++) {
        fill_bf16(hb, (int64_t)(blk / 2), 1.0f);
        memcpy((char *)m.cache.c + (size_t)tab[i] * blk, hb, blk);
        CHECK_OK(p.gpu->ops->to_device(p.gpu, (char *)m.cache.g + (size_t)tab[i] * blk, hb, blk, &err), &err);
    }
    free(hb);
    float *inv = malloc(sizeof(float) * (size_t)(m.DR / 2));
    for (int i = 0; i < m.DR / 2; i++) inv[i] = (float)pow(c.rope_theta, -2.0 * i / m.DR);
    m.inv_freq = b2(&p, inv, sizeof(float) * (size_t)(m.DR / 2));
    free(inv);
    m.norm = make_w(EG_W_BF16, 1, m.C, 1.0f);
    for (int i = 0; i < m.C; i++) ((uint16_t *)m.norm.data)[i] = eg_f32_to_bf16(1.0f + 0.3f * nrand());
    m.kvb = make_w(EG_W_BF16, (int64_t)m.NH * (m.DN + m.DV), m.C, 1.0f / sqrtf((float)m.C));
    hw_up(&p, &m.norm);
    hw_up(&p, &m.kvb);
    int32_t s[3] = {0, 1, 0}, q[3] = {300, 511, 301};
    mla_call(&m, 3, s, q, 0, 64, 1.0f, "mla Kimi, cache of 2.15e9 elements, blocks at its end");
    mla_free(&m);
    pair_free(&p);
}

/* ---- drawn weights (benchmarks of a preset) ----------------------------------------------------------- */

/* weight_random on the GPU gives the CPU's values bit for bit, in every drawn format. */
static void test_random_weights(void) {
    eg_config c = small_cfg();
    pair p;
    if (!pair_make(&c, 4, &p)) return;
    eg_error err = {0};
    const eg_wfmt fmts[3] = {EG_W_BF16, EG_W_F32, EG_W_INT4};
    for (int i = 0; i < 3; i++) {
        eg_weight shape = {.fmt = fmts[i], .rows = 300, .cols = 7168, .group = 32, .name = "drawn"}, dc, dg;
        eg_weight_rand r = {.seed = 11 + (uint64_t)i, .mean = i == 1 ? 1.0f : 0.0f, .std = 0.02f};
        CHECK_OK(p.cpu->ops->weight_random(p.cpu, &shape, &r, &dc, &err), &err);
        CHECK_OK(p.gpu->ops->weight_random(p.gpu, &shape, &r, &dg, &err), &err);
        size_t db = (size_t)shape.rows * (size_t)shape.cols * (fmts[i] == EG_W_F32 ? 4 : 2);
        size_t sb = 0;
        if (fmts[i] == EG_W_INT4) {
            db = (size_t)shape.rows * (size_t)shape.cols / 2;
            sb = (size_t)shape.rows * (size_t)(shape.cols / 32) * 2;
        }
        unsigned char *h = malloc(db + sb + 1);
        CHECK_OK(p.gpu->ops->to_host(p.gpu, h, dg.data, db, &err), &err);
        if (sb) CHECK_OK(p.gpu->ops->to_host(p.gpu, h + db, dg.scale, sb, &err), &err);
        CHECK_OK(p.gpu->ops->sync(p.gpu, &err), &err);
        int same = !memcmp(h, dc.data, db) && (!sb || !memcmp(h + db, dc.scale, sb));
        CHECKF(same, "drawn %s weight differs between CUDA and CPU", fmt_name(fmts[i]));
        printf("    weight_random %-5s %lld x %lld: %s\n", fmt_name(fmts[i]), (long long)shape.rows,
               (long long)shape.cols, same ? "identical" : "DIFFERENT");
        free(h);
        p.cpu->ops->weight_release(p.cpu, &dc);
        p.gpu->ops->weight_release(p.gpu, &dg);
    }
    pair_free(&p);
}

/* ---- sampling -------------------------------------------------------------------------------------- */

/* The sampling cases' logits: N rows of V, N(0, 4) noise, plus (peak > 0) five spikes of
 * peak per row, and (quant) rounded to halves so that ties are common. */
static float *sample_logits(int N, int V, float peak, int quant) {
    float *lg = randv((int64_t)N * V, 4.0f);
    for (int i = 0; peak > 0 && i < N; i++)
        for (int k = 0; k < 5; k++) lg[(int64_t)i * V + (int64_t)(urand() * V)] += peak;
    for (int64_t j = 0; quant && j < (int64_t)N * V; j++) lg[j] = roundf(lg[j] * 2.0f) / 2.0f;
    return lg;
}

/* The sampling cases' pair of backends: small_cfg at vocabulary V, N rows a call. */
static int sample_pair(int N, int V, pair *p) {
    eg_config c = small_cfg();
    c.vocab = V;
    return pair_make(&c, N, p);
}

/* The device's top-M candidate count as the backend reads it (EG_CUDA_SAMPLE_M, 2048). */
static int sample_m(void) {
    const char *ms = getenv("EG_CUDA_SAMPLE_M");
    return ms ? atoi(ms) : 2048;
}

/* The sampled kinds token_probs and kept_probs cycle through; the last is greedy. */
static const eg_sample_params probs_kinds[7] = {{1.0f, 1, 0},      {0.7f, 1, 50}, {1.0f, 0.9f, 0},
                                                {0.8f, 0.5f, 200}, {1.2f, 1, 1},  {1.0f, 0.999f, 0},
                                                {0, 1, 0}};

/* peak > 0: five tokens per row get +peak (a peaked distribution, like a trained
 * model's); cap_k > 0: top_k above it becomes cap_k; quant: logits rounded to halves
 * (many ties, also at the top-M threshold). Returns the rows the top-M path left to
 * the full sort. */
static int64_t sample_case_ex(int N, int V, int rounds, float peak, int cap_k, int quant) {
    pair p;
    if (!sample_pair(N, V, &p)) return -1;
    eg_error err = {0};
    eg_sample_params *sp = malloc(sizeof *sp * (size_t)N);
    uint64_t *rc = malloc(8 * (size_t)N), *rg = malloc(8 * (size_t)N);
    int32_t *oc = malloc(4 * (size_t)N), *og = malloc(4 * (size_t)N);
    const eg_sample_params kinds[8] = {{0, 1, 0},      {0, 1, 0},     {1.0f, 1, 0},   {0.7f, 1, 50},
                                       {1.0f, 0.9f, 0}, {0.8f, 0.5f, 200}, {1.2f, 1, 1}, {1.0f, 0.999f, 0}};
    for (int i = 0; i < N; i++) {
        sp[i] = kinds[i % 8];
        if (cap_k > 0 && sp[i].top_k > cap_k) sp[i].top_k = cap_k;
        rc[i] = rg[i] = eg_rng_seed(1234, (uint64_t)i);
    }
    int mismatches = 0, draws = 0;
    for (int r = 0; r < rounds; r++) {
        float *lg = sample_logits(N, V, peak, quant);
        /* row 1 (mod 8): a tie at the maximum between ids 5 and 100 (above any peak: five
         * peaks may land on one id) */
        for (int i = 1; i < N; i += 8) {
            lg[(int64_t)i * V + 5] = 1e4f;
            lg[(int64_t)i * V + 100] = 1e4f;
        }
        /* greedy row 0 (mod 8): NaNs (never taken, as on the host), and at id 0 in the
         * second such row (taken: nothing compares greater) */
        for (int i = 0; i < N; i += 8) {
            for (int k = 0; k < 3; k++) lg[(int64_t)i * V + 1 + (int64_t)(urand() * (V - 1))] = NAN;
            if (i == 8) lg[(int64_t)i * V] = NAN;
        }
        buf2 l = b2(&p, lg, 4 * (size_t)N * V);
        CHECK_OK(p.cpu->ops->sample(p.cpu, l.c, N, V, sp, rc, oc, &err), &err);
        CHECK_OK(p.gpu->ops->sample(p.gpu, l.g, N, V, sp, rg, og, &err), &err);
        for (int i = 0; i < N; i++) {
            mismatches += oc[i] != og[i] || rc[i] != rg[i];
            draws++;
        }
        for (int i = 1; i < N; i += 8) CHECKF(og[i] == 5, "greedy tie: got %d, want 5", og[i]);
        b2_free(&p, &l);
        free(lg);
    }
    int64_t sorted = eg_cuda_sample_sorted_rows(p.gpu);
    const char *m = getenv("EG_CUDA_SAMPLE_M"), *how = getenv("EG_CUDA_SAMPLE");
    printf("    sample N=%d V=%d x %d rounds%s%s%s (%s%s): %d of %d tokens/RNG states differ; %lld rows sorted in full\n",
           N, V, rounds, peak > 0 ? ", peaked" : "", cap_k > 0 ? ", top_k capped" : "", quant ? ", ties" : "",
           how ? how : "top-M, M=", how ? "" : m ? m : "2048", mismatches, draws, (long long)sorted);
    CHECKF(mismatches == 0, "sampling differs from the CPU in %d of %d draws", mismatches, draws);
    free(sp);
    free(rc);
    free(rg);
    free(oc);
    free(og);
    pair_free(&p);
    return sorted;
}

static void sample_case(int N, int V, int rounds) { (void)sample_case_ex(N, V, rounds, 0.0f, 0, 0); }

static void test_sample_kimi(void) {
    seed(11);
    sample_case(8, 163840, 6);
    CHECK(sample_case_ex(64, 163840, 2, 30.0f, 0, 0) == 0); /* a full pass settled without a sort */
}

static void test_sample_small(void) {
    seed(14);
    sample_case(8, 3000, 4);
    sample_case(100, 5000, 3); /* more rows than one sampling pass */
    /* a peaked distribution: every row settles among the first M candidates, no sort */
    CHECK(sample_case_ex(16, 5000, 2, 30.0f, 0, 0) == 0);
    /* few candidates (M = 64): flat rows and top_k 200 > M fall back to the sort; with
     * top_k capped at 32 and peaked rows every row settles on the top-M path alone
     * (exact top-k, top-p and the draw inside the first 64), also with ties at the
     * threshold */
    setenv("EG_CUDA_SAMPLE_M", "64", 1);
    CHECK(sample_case_ex(16, 3000, 2, 0.0f, 0, 0) > 0);
    CHECK(sample_case_ex(16, 3000, 2, 30.0f, 0, 0) > 0);
    CHECK(sample_case_ex(16, 3000, 2, 30.0f, 32, 0) == 0);
    CHECK(sample_case_ex(16, 3000, 2, 30.0f, 32, 1) == 0);
    unsetenv("EG_CUDA_SAMPLE_M");
    /* the full sort alone (before/after switch) */
    setenv("EG_CUDA_SAMPLE", "sort", 1);
    sample_case(8, 3000, 2);
    unsetenv("EG_CUDA_SAMPLE");
}

/* token_probs (a speculative verify row's p(draft) on the device) against the CPU
 * backend's (eg_sample_prob, the host's numbers): per row the top candidate, a random id,
 * or no token (-1: left untouched). Answers given agree to 2 V eps relative (the device's
 * sums are parallel, the host's sequential), a zero where the host's is zero; NaN (the host computes it) only
 * for greedy rows and where the first M candidates cannot settle the kept set (a top_k
 * above M, a top-p cut beyond them). Returns the non-greedy rows answered NaN. */
static int token_probs_case(int N, int V, float peak, int quant) {
    pair p;
    if (!sample_pair(N, V, &p)) return -1;
    eg_error err = {0};
    int M = sample_m();
    eg_sample_params *sp = malloc(sizeof *sp * (size_t)N);
    int32_t *tok = malloc(4 * (size_t)N);
    double *pc = malloc(sizeof(double) * (size_t)N), *pg = malloc(sizeof(double) * (size_t)N);
    float *lg = sample_logits(N, V, peak, quant);
    float *scr = malloc(sizeof(float) * eg_sample_scratch_floats(V));
    for (int i = 0; i < N; i++) {
        sp[i] = probs_kinds[i % 7];
        const float *r = lg + (int64_t)i * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (r[v] > r[best]) best = v;
        /* the argmax, a random id, none, or the kept set's edges in the host's order: its
         * last candidate and the first one cut (ties at a cut come in id order) */
        int pick = (i / 7) % 5, n = V;
        const eg_sample_cand *cand = (const eg_sample_cand *)scr;
        double kept;
        if (pick >= 3 && sp[i].temperature > 0.0f) n = eg_sample_kept(r, V, &sp[i], scr, &kept);
        tok[i] = pick == 0 ? best
               : pick == 1 ? (int32_t)(urand() * V) % V
               : pick == 2 ? -1
               : !(sp[i].temperature > 0.0f) ? best
               : pick == 3 ? cand[n - 1].id
                           : cand[n < V ? n : V - 1].id;
        pc[i] = pg[i] = 7.0;
    }
    free(scr);
    buf2 l = b2(&p, lg, 4 * (size_t)N * V);
    CHECK_OK(p.cpu->ops->token_probs(p.cpu, l.c, N, V, sp, tok, pc, &err), &err);
    CHECK_OK(p.gpu->ops->token_probs(p.gpu, l.g, N, V, sp, tok, pg, &err), &err);
    int given = 0, nan_rows = 0, bad = 0, zeros = 0;
    /* two sums of the same V non-negative terms in different orders: each within
     * (V - 1) eps of the exact one */
    double worst = 0, tol = 2.0 * V * 0x1p-52;
    for (int i = 0; i < N; i++) {
        if (tok[i] < 0) {
            CHECKF(pc[i] == 7.0 && pg[i] == 7.0, "row %d (no token) was written", i);
            continue;
        }
        int greedy = !(sp[i].temperature > 0.0f);
        int n0 = sp[i].top_k > 0 && sp[i].top_k < V ? sp[i].top_k : V;
        int settles = !greedy && (n0 <= M || (n0 == V && !(sp[i].top_p > 0.0f && sp[i].top_p < 1.0f)));
        if (isnan(pg[i])) {
            if (!greedy) nan_rows++;
            CHECKF(!settles, "row %d (T %.1f, top_p %.3f, top_k %d): NaN where the first %d settle it", i,
                   sp[i].temperature, sp[i].top_p, sp[i].top_k, M);
            continue;
        }
        CHECKF(!greedy, "row %d: a greedy row answered (%g)", i, pg[i]);
        given++;
        if (pc[i] == 0.0) {
            zeros++;
            bad += pg[i] != 0.0;
            continue;
        }
        double rel = fabs(pg[i] - pc[i]) / pc[i];
        if (rel > worst) worst = rel;
        bad += !(rel <= tol);
    }
    printf("    token_probs N=%d V=%d%s%s (M=%d): %d answered (%d zeros), %d left NaN, worst rel %.2e (bound %.1e)\n",
           N, V, peak > 0 ? ", peaked" : "", quant ? ", ties" : "", M, given, zeros, nan_rows, worst, tol);
    CHECKF(bad == 0, "token_probs: %d answers differ from the host's", bad);
    CHECK(given > 0);
    b2_free(&p, &l);
    free(lg);
    free(sp);
    free(tok);
    free(pc);
    free(pg);
    pair_free(&p);
    return nan_rows;
}

/* kept_probs (a rejected draft's kept set on the device) against the CPU backend's
 * (eg_sample_kept, the host's numbers), on rows asked in a shuffled order (one twice): a
 * set the device gives has the host's size and ids in the host's order, each p within
 * 2 V eps relative; -1 (the host takes the row) only for greedy rows, where the host's
 * set has more than cap ids, and where the first M cannot settle it. Returns the rows the
 * host settles but the device leaves -1. */
static int kept_probs_case(int N, int V, float peak, int quant, int cap) {
    pair p;
    if (!sample_pair(N, V, &p)) return -1;
    eg_error err = {0};
    int M = sample_m();
    if (cap < M) M = cap; /* the device selects no more candidates than it may return */
    const int R = N + 1;
    eg_sample_params *sp = malloc(sizeof *sp * (size_t)R);
    int32_t *rows = malloc(4 * (size_t)R), *nc = malloc(4 * (size_t)R), *ng = malloc(4 * (size_t)R);
    int32_t *ic = malloc(4 * (size_t)R * cap), *ig = malloc(4 * (size_t)R * cap);
    double *pc = malloc(sizeof(double) * (size_t)R * cap), *pg = malloc(sizeof(double) * (size_t)R * cap);
    float *lg = sample_logits(N, V, peak, quant);
    for (int i = 0; i < N; i++) rows[i] = i;
    for (int i = N - 1; i > 0; i--) {
        int o = (int)(urand() * (i + 1)) % (i + 1), t = rows[i];
        rows[i] = rows[o];
        rows[o] = t;
    }
    rows[N] = rows[0];
    for (int i = 0; i < R; i++) sp[i] = probs_kinds[(rows[i] + i) % 7];
    buf2 l = b2(&p, lg, 4 * (size_t)N * V);
    CHECK_OK(p.cpu->ops->kept_probs(p.cpu, l.c, rows, R, V, sp, cap, nc, ic, pc, &err), &err);
    CHECK_OK(p.gpu->ops->kept_probs(p.gpu, l.g, rows, R, V, sp, cap, ng, ig, pg, &err), &err);
    int given = 0, left = 0, bad = 0, over = 0, ids_total = 0;
    double worst = 0, tol = 2.0 * V * 0x1p-52;
    for (int i = 0; i < R; i++) {
        int greedy = !(sp[i].temperature > 0.0f);
        int n0 = sp[i].top_k > 0 && sp[i].top_k < V ? sp[i].top_k : V;
        if (greedy) {
            CHECKF(nc[i] == -1 && ng[i] == -1, "row %d (greedy): kept %d / %d", i, nc[i], ng[i]);
            continue;
        }
        if (nc[i] < 0) { /* the host's set is over cap: never the device's to give */
            over++;
            CHECKF(ng[i] == -1, "row %d: the device gave %d ids, over cap %d", i, ng[i], cap);
            continue;
        }
        if (ng[i] < 0) {
            left++;
            CHECKF(n0 > M, "row %d (T %.1f, top_p %.3f, top_k %d): -1 where the first %d settle it", i,
                   sp[i].temperature, sp[i].top_p, sp[i].top_k, M);
            continue;
        }
        given++;
        if (ng[i] != nc[i]) {
            bad++;
            CHECKF(0, "row %d: the device kept %d ids, the host %d", i, ng[i], nc[i]);
            continue;
        }
        ids_total += nc[i];
        for (int j = 0; j < nc[i]; j++) {
            int64_t at = (int64_t)i * cap + j;
            if (ig[at] != ic[at]) { bad++; break; }
            double rel = fabs(pg[at] - pc[at]) / pc[at];
            if (rel > worst) worst = rel;
            bad += !(rel <= tol);
        }
    }
    printf("    kept_probs N=%d V=%d%s%s (M=%d, cap %d): %d sets given (%d ids), %d over cap, %d left to the host, "
           "worst rel %.2e (bound %.1e)\n", R, V, peak > 0 ? ", peaked" : "", quant ? ", ties" : "", M, cap, given,
           ids_total, over, left, worst, tol);
    CHECKF(bad == 0, "kept_probs: %d sets differ from the host's", bad);
    CHECK(given > 0);
    b2_free(&p, &l);
    free(lg); free(sp); free(rows); free(nc); free(ng); free(ic); free(ig); free(pc); free(pg);
    pair_free(&p);
    return left;
}

static void test_token_probs(void) {
    seed(17);
    /* 70 rows: each of the 7 parameter kinds with each of the 5 token picks, twice */
    token_probs_case(70, 3000, 0.0f, 0);
    CHECK(token_probs_case(70, 3000, 30.0f, 0) == 0); /* peaked: every cut inside the first M */
    token_probs_case(70, 3000, 0.0f, 1);              /* logits in halves: ties at every cut */
    token_probs_case(14, 163840, 30.0f, 0);
    /* M = 64: top_k 200 and the flat rows' top-p cuts are left to the host */
    setenv("EG_CUDA_SAMPLE_M", "64", 1);
    CHECK(token_probs_case(70, 3000, 0.0f, 0) > 0);
    token_probs_case(70, 3000, 30.0f, 1);
    unsetenv("EG_CUDA_SAMPLE_M");
}

static void test_kept_probs(void) {
    seed(19);
    CHECK(kept_probs_case(70, 3000, 0.0f, 0, 2048) == 0);
    CHECK(kept_probs_case(70, 3000, 30.0f, 0, 2048) == 0);
    CHECK(kept_probs_case(70, 3000, 0.0f, 1, 2048) == 0); /* ties at every cut */
    kept_probs_case(70, 3000, 0.0f, 0, 100);               /* sets over cap: the host's */
    kept_probs_case(14, 163840, 30.0f, 0, 2048);
    setenv("EG_CUDA_SAMPLE_M", "64", 1);
    CHECK(kept_probs_case(70, 3000, 0.0f, 0, 2048) > 0);   /* top_k 200 and flat cuts: the host's */
    unsetenv("EG_CUDA_SAMPLE_M");
}

/* ---- recorded replay (CUDA graphs) ------------------------------------------------------------------ */

/* The recorded ops: y = moe(linear(x)) with a fresh zeroed y. */
static void graph_ops(eg_backend *b, const void *x, void *h, void *y, int T, const eg_weight *W,
                      const eg_moe_args *proto, eg_error *err) {
    eg_moe_args a = *proto;
    a.x = h;
    a.y = y;
    CHECK_OK(b->ops->memset0(b, y, 4 * (size_t)T * (size_t)W->rows, err), err);
    CHECK_OK(b->ops->linear(b, x, T, W, h, err), err);
    CHECK_OK(b->ops->moe(b, &a, err), err);
}

/* Recording runs nothing; a replay on new inputs equals the ops run one by one, bit for
 * bit; host copies and syncs are refused while recording; a rebuilt expert table makes
 * a graph stale; EG_CUDA_GRAPHS=0 switches recording off. */
static void test_graphs(void) {
    seed(21);
    eg_config c = kimi_cfg();
    int E = 8, K = 2, H = 256, F = 128, T = 5;
    c.n_experts = E; c.topk = K; c.hidden = H; c.moe_inter = F; c.inter = F;
    pair p;
    if (!pair_make(&c, T, &p)) return;
    eg_backend *g = p.gpu;
    eg_error err = {0};
    hw W = make_w(EG_W_BF16, H, H, 1.0f / 16.0f);
    hw_up(&p, &W);
    hw ex[2][8][3];
    eg_expert_w xg[2][8];
    for (int s = 0; s < 2; s++)
        for (int e = 0; e < E; e++) {
            for (int j = 0; j < 3; j++) {
                ex[s][e][j] = make_w(EG_W_INT4, j < 2 ? F : H, j < 2 ? H : F, 0.05f);
                hw_up(&p, &ex[s][e][j]);
            }
            xg[s][e] = (eg_expert_w){.gate = ex[s][e][0].dg, .up = ex[s][e][1].dg, .down = ex[s][e][2].dg};
        }
    int32_t ids[5 * 2] = {0, 3, 1, 7, 2, 5, 3, 0, 6, 4};
    float wts[5 * 2] = {0.6f, 0.4f, 0.9f, 0.1f, 0.5f, 0.5f, 0.3f, 0.7f, 0.2f, 0.8f};
    float *x1 = randv((int64_t)T * H, 1.0f), *x2 = randv((int64_t)T * H, 1.0f);
    buf2 x = b2(&p, x1, 4 * (size_t)T * H), hb = b2(&p, NULL, 4 * (size_t)T * H), y = b2(&p, NULL, 4 * (size_t)T * H);
    buf2 bi = b2(&p, ids, sizeof ids), bw = b2(&p, wts, sizeof wts);
    eg_moe_args proto = {.T = T, .ids = bi.g, .weights = bw.g, .topk = K, .experts = xg[0], .e0 = 0, .e1 = E};
    /* op by op on x2: the reference (and the expert table gets built) */
    CHECK_OK(g->ops->to_device(g, x.g, x2, 4 * (size_t)T * H, &err), &err);
    graph_ops(g, x.g, hb.g, y.g, T, &W.dg, &proto, &err);
    float *want = fetch(&p, &y);
    /* record with x1 in place; y holds the reference and must keep it: nothing runs */
    CHECK_OK(g->ops->to_device(g, x.g, x1, 4 * (size_t)T * H, &err), &err);
    CHECK_OK(g->ops->sync(g, &err), &err);
    void *graph = NULL;
    CHECK_OK(g->ops->graph_begin(g, &err), &err);
    graph_ops(g, x.g, hb.g, y.g, T, &W.dg, &proto, &err);
    CHECK_OK(g->ops->graph_end(g, &graph, &err), &err);
    float *after_rec = fetch(&p, &y);
    CHECK(memcmp(after_rec, want, 4 * (size_t)T * H) == 0);
    /* replay on x2: the reference exactly */
    CHECK_OK(g->ops->to_device(g, x.g, x2, 4 * (size_t)T * H, &err), &err);
    CHECK_OK(g->ops->memset0(g, y.g, 4 * (size_t)T * H, &err), &err);
    int ran = 0;
    CHECK_OK(g->ops->graph_launch(g, graph, &ran, &err), &err);
    CHECK(ran == 1);
    float *got = fetch(&p, &y);
    int same = !memcmp(got, want, 4 * (size_t)T * H);
    printf("    replay on new inputs vs op by op: %s\n", same ? "bit-identical" : "DIFFERENT");
    CHECK(same);
    /* and against the CPU reference */
    eg_moe_args ac = proto;
    ac.ids = bi.c; ac.weights = bw.c;
    eg_expert_w xc[8];
    for (int e = 0; e < E; e++) xc[e] = (eg_expert_w){.gate = ex[0][e][0].dc, .up = ex[0][e][1].dc, .down = ex[0][e][2].dc};
    ac.experts = xc;
    memcpy(x.c, x2, 4 * (size_t)T * H);
    graph_ops(p.cpu, x.c, hb.c, y.c, T, &W.dc, &ac, &err);
    cmp_f32(&p, &y, "graph replay vs cpu", 1e-3);
    /* refused while recording, and the recording stays usable */
    CHECK_OK(g->ops->graph_begin(g, &err), &err);
    float tmp[4];
    eg_status st = g->ops->to_host(g, tmp, y.g, sizeof tmp, &err);
    printf("    to_host while recording -> %s: %s\n", eg_status_name(st), err.msg);
    CHECK(st == EG_ERR_INVALID);
    CHECK(g->ops->to_device(g, y.g, tmp, sizeof tmp, &err) == EG_ERR_INVALID);
    CHECK(g->ops->sync(g, &err) == EG_ERR_INVALID);
    void *g2 = NULL;
    CHECK_OK(g->ops->graph_end(g, &g2, &err), &err);
    g->ops->graph_free(g, g2);
    g->ops->graph_free(g, NULL);
    /* an expert table built for another expert array, with a different layer's pointers,
     * while recording: refused, and the recording fails at graph_end */
    CHECK_OK(g->ops->graph_begin(g, &err), &err);
    eg_moe_args other = proto;
    other.experts = xg[1];
    other.x = hb.g;
    other.y = y.g;
    st = g->ops->moe(g, &other, &err);
    printf("    new expert table while recording -> %s: %s\n", eg_status_name(st), err.msg);
    CHECK(st != EG_OK);
    g2 = NULL;
    eg_status est = g->ops->graph_end(g, &g2, &err);
    printf("    graph_end after it -> %s\n", eg_status_name(est));
    if (est == EG_OK) g->ops->graph_free(g, g2);
    /* the same call outside a recording builds that table: the old graph is stale */
    CHECK_OK(g->ops->moe(g, &other, &err), &err);
    ran = 1;
    CHECK_OK(g->ops->graph_launch(g, graph, &ran, &err), &err);
    CHECK(ran == 0);
    g->ops->graph_free(g, graph);
    CHECK_OK(g->ops->sync(g, &err), &err);
    /* switched off */
    setenv("EG_CUDA_GRAPHS", "0", 1);
    eg_backend *off = NULL;
    eg_backend_opts o = {.name = "cuda", .max_tokens = T, .max_seq_len = 64, .device = 0};
    CHECK_OK(eg_backend_cuda_create(&c, &o, &off, &err), &err);
    unsetenv("EG_CUDA_GRAPHS");
    if (off) CHECK(off->ops->graph_begin(off, &err) == EG_ERR_UNSUPPORTED);
    eg_backend_free(off);
    free(want); free(after_rec); free(got); free(x1); free(x2);
    buf2 *bs[] = {&x, &hb, &y, &bi, &bw};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) b2_free(&p, bs[i]);
    for (int s = 0; s < 2; s++)
        for (int e = 0; e < E; e++)
            for (int j = 0; j < 3; j++) hw_free(&p, &ex[s][e][j]);
    hw_free(&p, &W);
    pair_free(&p);
}

/* ---- errors, planner ---------------------------------------------------------------------------------- */

static void test_errors_and_plan(void) {
    eg_config c = kimi_cfg();
    eg_error err = {0};
    eg_backend_opts o = {.name = "cuda", .max_tokens = 256, .max_seq_len = 8192, .device = 0};
    eg_backend *b = NULL;
    CHECK_OK(eg_backend_cuda_create(&c, &o, &b, &err), &err);
    if (!b) return;
    void *ptr = NULL;
    eg_status st = b->ops->alloc(b, (size_t)1 << 50, &ptr, &err);
    printf("    alloc 1 PiB -> %s: %s\n", eg_status_name(st), err.msg);
    CHECK(st == EG_ERR_NOMEM && ptr == NULL);
    hw W = make_w(EG_W_BF16, 64, 7168, 0.01f);
    eg_weight d;
    CHECK_OK(b->ops->weight_upload(b, &W.w, &d, &err), &err);
    st = b->ops->linear(b, NULL, 1000, &d, NULL, &err);
    printf("    linear T=1000 > max_tokens -> %s: %s\n", eg_status_name(st), err.msg);
    CHECK(st == EG_ERR_INVALID);
    CHECK_OK(b->ops->sync(b, &err), &err); /* still usable */
    b->ops->weight_release(b, &d);
    hw_free(NULL, &W);
    int64_t fr = 0, to = 0;
    CHECK_OK(eg_cuda_mem_info(0, &fr, &to, &err), &err);
    CHECK(fr > 0 && to >= fr);
    eg_cuda_mem_plan plan;
    CHECK_OK(eg_cuda_plan(&c, &o, 0.9, (int64_t)20 << 30, (int64_t)1 << 30, c.n_layers, 0, 64, &plan, &err), &err);
    char line[512];
    eg_cuda_plan_format(&plan, 0, line, sizeof line);
    printf("    plan: %s\n", line);
    CHECK(plan.kv_tokens > 0 && plan.kv_tokens % 64 == 0);
    CHECK(plan.kv_bytes_per_token == (int64_t)c.n_layers * 576 * 2);
    st = eg_cuda_plan(&c, &o, 0.9, (int64_t)1 << 50, 0, c.n_layers, 0, 64, &plan, &err);
    CHECK(st == EG_ERR_NOMEM);
    void *h = eg_cuda_host_alloc(1 << 20, &err);
    CHECK(h != NULL);
    eg_cuda_host_free(h);
    eg_cuda_host_free(NULL);
    eg_backend_free(b);
    eg_backend_free(NULL);
}

/* EG_CUDA_PROFILE=1 gives the backend the profiled ops table; it must still count as a
 * CUDA backend (device query, transport choice), or `--transport auto` silently takes
 * the local transport and `--transport nccl` fails: a profiled run would measure another
 * pipeline than the one it profiles. With two devices and NCCL, `auto` between two
 * profiled GPUs must be nccl, and rows must cross it intact. */
static void test_profiled_transport(void) {
    eg_config c = small_cfg();
    eg_error err = {0};
    eg_backend_opts o = {.name = "cuda", .max_tokens = 16, .max_seq_len = 64, .device = 0};
    eg_backend *plain = NULL, *prof[2] = {NULL, NULL};
    CHECK_OK(eg_backend_cuda_create(&c, &o, &plain, &err), &err);
    setenv("EG_CUDA_PROFILE", "1", 1);
    CHECK_OK(eg_backend_cuda_create(&c, &o, &prof[0], &err), &err);
    o.device = 1;
    eg_error err1 = {0};
    eg_status st1 = eg_backend_cuda_create(&c, &o, &prof[1], &err1);
    unsetenv("EG_CUDA_PROFILE");
    int d = -2;
    void *strm = NULL;
    if (plain && prof[0]) {
        CHECK(prof[0]->ops != plain->ops); /* the profiled table is the one in use */
        eg_status st = eg_backend_cuda_device(prof[0], &d, &strm);
        printf("    profiled backend: device query %s, device %d\n", eg_status_name(st), d);
        CHECK(st == EG_OK && d == 0 && strm != NULL);
    }
    if (st1 || !eg_transport_have_nccl()) {
        printf("    transport choice not checked: %s\n", st1 ? "one device" : "built without NCCL");
    } else if (prof[0]) {
        eg_transport *t = NULL;
        eg_transport_opts to = {.name = "auto", .stages = prof, .n_stages = 2, .n_micro_batches = 1, .max_floats = 64};
        CHECK_OK(eg_transport_create(&to, &t, &err), &err);
        printf("    auto transport between two profiled GPUs: %s\n", eg_transport_name(t));
        CHECK(t && !strcmp(eg_transport_name(t), "nccl"));
        float host[64], back[64];
        for (int i = 0; i < 64; i++) host[i] = (float)i * 0.5f - 3.0f;
        void *src = NULL, *dst = NULL;
        if (t && !prof[0]->ops->alloc(prof[0], sizeof host, &src, &err) &&
            !prof[1]->ops->alloc(prof[1], sizeof host, &dst, &err)) {
            memset(back, 0, sizeof back);
            CHECK_OK(eg_backend_bind(prof[0], &err), &err);
            CHECK_OK(prof[0]->ops->to_device(prof[0], src, host, sizeof host, &err), &err);
            CHECK_OK(t->ops->send(t, 0, 0, src, 64, &err), &err);
            CHECK_OK(eg_backend_bind(prof[1], &err), &err);
            CHECK_OK(t->ops->recv(t, 0, 0, dst, 64, &err), &err);
            CHECK_OK(prof[1]->ops->to_host(prof[1], back, dst, sizeof back, &err), &err);
            CHECK_OK(prof[1]->ops->sync(prof[1], &err), &err);
            CHECK_OK(eg_backend_bind(prof[0], &err), &err);
            CHECK_OK(prof[0]->ops->sync(prof[0], &err), &err);
            CHECK(!memcmp(host, back, sizeof host));
        }
        eg_transport_free(t);
        if (src) prof[0]->ops->release(prof[0], src);
        if (dst) prof[1]->ops->release(prof[1], dst);
    }
    eg_backend_free(plain);
    eg_backend_free(prof[0]);
    eg_backend_free(prof[1]);
}


/* ---- the expert-parallel group over CUDA ranks (engine/collective_cuda.c) ------------------- */

typedef struct ep_rank_case {
    eg_ep_group *g;
    int rank, n_calls; /* calls = layers 0..n_calls-1, then eg_ep_leave */
    int cut;           /* > 0: layer 0 is split there: its calls 0 and eg_ep_head_id(0) on one y */
    eg_backend *be;
    eg_moe_args a[2];
    eg_status st;
    eg_error err;
} ep_rank_case;

static void *ep_rank_thread(void *v) {
    ep_rank_case *x = v;
    x->st = eg_backend_bind(x->be, &x->err);
    for (int l = 0; l < x->n_calls && !x->st; l++) {
        x->st = eg_ep_moe(x->g, x->rank, l, x->be, &x->a[l], &x->err);
        if (!x->st && l == 0 && x->cut) x->st = eg_ep_moe(x->g, x->rank, eg_ep_head_id(x->g, 0), x->be, &x->a[0], &x->err);
    }
    if (!x->st) x->st = eg_ep_leave(x->g, x->rank, x->be, &x->err);
    if (x->st) eg_ep_fail(x->g);
    return NULL;
}

/* A reference backend on GPU 0 and R rank backends on GPUs r mod the device count (the
 * devices that exist, up to R), each for calls of max_tokens rows. 0 (all freed): one
 * failed, the failure reported. */
static int ep_backends(const eg_config *c, int R, int max_tokens, eg_backend **ref, eg_backend ***be, int *ndev) {
    eg_error err = {0};
    *ref = NULL;
    *be = calloc((size_t)R, sizeof **be);
    eg_backend_opts o = {.name = "cuda", .max_tokens = max_tokens, .max_seq_len = 16, .device = 0};
    CHECK_OK(eg_backend_cuda_create(c, &o, ref, &err), &err);
    for (*ndev = 1; *ndev < R; ++*ndev) {
        eg_backend *t = NULL;
        eg_error probe = {0};
        o.device = *ndev;
        if (eg_backend_cuda_create(c, &o, &t, &probe)) break;
        eg_backend_free(t);
    }
    for (int r = 0; r < R; r++) {
        o.device = r % *ndev;
        CHECK_OK(eg_backend_cuda_create(c, &o, &(*be)[r], &err), &err);
    }
    if (*ref && !err.msg[0]) return 1;
    eg_backend_free(*ref);
    for (int r = 0; r < R; r++) eg_backend_free((*be)[r]);
    free(*be);
    *ref = NULL, *be = NULL;
    return 0;
}

/* The rank of a group with options go that owns expert e of layer l (split at go's
 * layer_cuts: each half shared out on its own, collective.h eg_ep_range). */
static int ep_owner_of(const eg_ep_opts *go, int l, int e) {
    int cut = go->layer_cuts ? go->layer_cuts[l] : 0, id = cut && e >= cut ? go->n_layers + l : l;
    for (int r = 0; r < go->n_ranks; r++) {
        int e0, e1;
        eg_ep_share(go, r, id, &e0, &e1);
        if (e >= e0 && e < e1) return r;
    }
    return -1;
}

/* R ranks on GPUs r mod the device count (nccl when each has its own, cuda-local when
 * they share), two MoE layers, rank r with T[r] tokens: every rank's y must equal, bit
 * for bit, one backend's moe over all experts of its tokens. Rank 0 leaves after layer 0
 * (it serves layer 1 from its registered experts); skew routes every pair of rank 1 to
 * rank 0's experts (the receive buffers' worst case); each rank holds only its experts.
 * cut > 0 splits layer 0 there (a layer between two stages): two calls, experts [0, cut)
 * and [cut, E), each shared out over the ranks, onto the same y. */
static void ep_group_case(eg_wfmt fmt, int R, const int *T, int skew, int cut) {
    eg_config c = small_cfg();
    int E = c.n_experts, K = c.topk, H = c.hidden, F = c.moe_inter, per = E / R, L = 2, Tmax = 0;
    int cuts[2] = {cut, 0};
    eg_ep_opts go = {.n_ranks = R, .n_experts = E, .topk = K, .hidden = H, .max_tokens = 1, .n_layers = L,
                     .layer_cuts = cut ? cuts : NULL};
    for (int r = 0; r < R; r++) Tmax = T[r] > Tmax ? T[r] : Tmax;
    eg_error err = {0};
    int ndev = 0;
    eg_backend *ref = NULL, **be = NULL;
    if (R < 1 || !ep_backends(&c, R, Tmax, &ref, &be, &ndev)) return;
    /* experts of both layers: host data, the reference's copies, each owner's copies */
    hw *ex = calloc((size_t)(L * E * 3), sizeof(hw));
    eg_expert_w *xr = calloc((size_t)(L * E), sizeof *xr), *xo = calloc((size_t)(R * L * E), sizeof *xo);
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
            hw *w3 = ex + 3 * (l * E + e);
            w3[0] = make_w(fmt, F, H, 1.0f / sqrtf((float)H));
            w3[1] = make_w(fmt, F, H, 1.0f / sqrtf((float)H));
            w3[2] = make_w(fmt, H, F, 1.0f / sqrtf((float)F));
            eg_weight *dr[3] = {&xr[l * E + e].gate, &xr[l * E + e].up, &xr[l * E + e].down};
            int r = ep_owner_of(&go, l, e);
            eg_expert_w *own = &xo[(r * L + l) * E + e];
            eg_weight *dw[3] = {&own->gate, &own->up, &own->down};
            for (int j = 0; j < 3; j++) {
                CHECK_OK(ref->ops->weight_upload(ref, &w3[j].w, dr[j], &err), &err);
                CHECK_OK(eg_backend_bind(be[r], &err), &err);
                CHECK_OK(be[r]->ops->weight_upload(be[r], &w3[j].w, dw[j], &err), &err);
                CHECK_OK(eg_backend_bind(ref, &err), &err);
            }
        }
    go.max_tokens = Tmax;
    go.backends = be;
    eg_ep_group *g = NULL;
    CHECK_OK(eg_ep_group_create(&go, &g, &err), &err);
    if (!g) goto out;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < L; l++) {
            eg_ep_register(g, r, l, &xo[(r * L + l) * E]);
            if (cuts[l]) eg_ep_register(g, r, eg_ep_head_id(g, l), &xo[(r * L + l) * E]); /* the same array: both halves */
        }
    ep_rank_case *rc = calloc((size_t)R, sizeof *rc);
    float **want = calloc((size_t)R * (size_t)L, sizeof *want);
    void **devp = calloc((size_t)R * (size_t)L * 4, sizeof *devp);
    for (int r = 0; r < R; r++) {
        rc[r] = (ep_rank_case){.g = g, .rank = r, .n_calls = r == 0 && R > 1 ? 1 : L, .cut = cut, .be = be[r]};
        for (int l = 0; l < rc[r].n_calls; l++) {
            int n = T[r];
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * K);
            float *wts = malloc(sizeof(float) * (size_t)n * K);
            for (int t = 0; t < n; t++)
                for (int k = 0; k < K; k++) {
                    int e, dup;
                    do {
                        e = skew && r == 1 ? (int)(urand() * per) : (int)(urand() * E);
                        dup = 0;
                        for (int j = 0; j < k; j++) dup |= ids[t * K + j] == e;
                    } while (dup);
                    ids[t * K + k] = e;
                    wts[t * K + k] = 0.1f + (float)urand();
                }
            float *xv = randv((int64_t)n * H, 1.0f);
            /* the reference: one backend, every expert */
            void *rx, *ry, *ri, *rw;
            CHECK_OK(eg_backend_bind(ref, &err), &err);
            CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)n * H, &rx, &err), &err);
            CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)n * H, &ry, &err), &err);
            CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)n * K, &ri, &err), &err);
            CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)n * K, &rw, &err), &err);
            CHECK_OK(ref->ops->to_device(ref, rx, xv, 4 * (size_t)n * H, &err), &err);
            CHECK_OK(ref->ops->to_device(ref, ri, ids, 4 * (size_t)n * K, &err), &err);
            CHECK_OK(ref->ops->to_device(ref, rw, wts, 4 * (size_t)n * K, &err), &err);
            CHECK_OK(ref->ops->memset0(ref, ry, 4 * (size_t)n * H, &err), &err);
            eg_moe_args a = {.T = n, .x = rx, .ids = ri, .weights = rw, .topk = K, .experts = xr + l * E, .e0 = 0,
                             .e1 = E, .y = ry};
            CHECK_OK(ref->ops->moe(ref, &a, &err), &err);
            want[r * L + l] = malloc(4 * (size_t)n * H);
            CHECK_OK(ref->ops->to_host(ref, want[r * L + l], ry, 4 * (size_t)n * H, &err), &err);
            CHECK_OK(ref->ops->sync(ref, &err), &err);
            ref->ops->release(ref, rx); ref->ops->release(ref, ry); ref->ops->release(ref, ri); ref->ops->release(ref, rw);
            /* the rank's inputs */
            void **d = devp + (r * L + l) * 4;
            eg_backend *b = be[r];
            CHECK_OK(eg_backend_bind(b, &err), &err);
            CHECK_OK(b->ops->alloc(b, 4 * (size_t)n * H, &d[0], &err), &err);
            CHECK_OK(b->ops->alloc(b, 4 * (size_t)n * H, &d[1], &err), &err);
            CHECK_OK(b->ops->alloc(b, 4 * (size_t)n * K, &d[2], &err), &err);
            CHECK_OK(b->ops->alloc(b, 4 * (size_t)n * K, &d[3], &err), &err);
            CHECK_OK(b->ops->to_device(b, d[0], xv, 4 * (size_t)n * H, &err), &err);
            CHECK_OK(b->ops->to_device(b, d[2], ids, 4 * (size_t)n * K, &err), &err);
            CHECK_OK(b->ops->to_device(b, d[3], wts, 4 * (size_t)n * K, &err), &err);
            CHECK_OK(b->ops->memset0(b, d[1], 4 * (size_t)n * H, &err), &err);
            CHECK_OK(b->ops->sync(b, &err), &err);
            rc[r].a[l] = (eg_moe_args){.T = n, .x = d[0], .ids = d[2], .weights = d[3], .topk = K,
                                       .experts = &xo[(r * L + l) * E], .e0 = 0, .e1 = E, .y = d[1]};
            free(ids); free(wts); free(xv);
        }
    }
    pthread_t *th = calloc((size_t)R, sizeof *th);
    for (int r = 1; r < R; r++) pthread_create(&th[r], NULL, ep_rank_thread, &rc[r]);
    ep_rank_thread(&rc[0]);
    for (int r = 1; r < R; r++) pthread_join(th[r], NULL);
    int64_t pairs = 0, bytes = 0;
    eg_ep_traffic(g, &pairs, &bytes);
    int same = 1;
    for (int r = 0; r < R; r++) {
        CHECKF(rc[r].st == EG_OK, "rank %d: %s", r, rc[r].err.msg);
        for (int l = 0; l < rc[r].n_calls; l++) {
            size_t nb = 4 * (size_t)T[r] * H;
            float *got = malloc(nb ? nb : 1);
            CHECK_OK(eg_backend_bind(be[r], &err), &err);
            CHECK_OK(be[r]->ops->to_host(be[r], got, rc[r].a[l].y, nb, &err), &err);
            CHECK_OK(be[r]->ops->sync(be[r], &err), &err);
            if (memcmp(got, want[r * L + l], nb)) {
                same = 0;
                printf("      rank %d layer %d: differs from the unsplit moe (rel %.3g)\n", r, l,
                       rel_err(got, want[r * L + l], (int64_t)T[r] * H));
            }
            free(got);
        }
    }
    CHECKF(same, "ep %d (%s, %s, cut %d): every rank's y equals the unsplit moe bit for bit", R, eg_ep_kind(g),
           fmt_name(fmt), cut);
    CHECKF(pairs > 0 && bytes > 0, "ep %d: pairs crossed ranks (%lld, %lld bytes)", R, (long long)pairs, (long long)bytes);
    printf("  ep %d over %d GPU(s), exchange %s, %s, tokens", R, ndev, eg_ep_kind(g), fmt_name(fmt));
    for (int r = 0; r < R; r++) printf(" %d", T[r]);
    printf("%s%s: identical to the unsplit moe; %lld pairs crossed, %lld bytes\n", skew ? " (skewed)" : "",
           cut ? ", layer 0 split between two calls" : "", (long long)pairs, (long long)bytes);
    if (cut) printf("    (layer 0 split at expert %d)\n", cut);
    eg_ep_group_free(g);
    for (int i = 0; i < R * L; i++) {
        int r = i / L;
        for (int j = 0; j < 4; j++)
            if (devp[i * 4 + j]) be[r]->ops->release(be[r], devp[i * 4 + j]);
        free(want[i]);
    }
    free(devp); free(want); free(rc); free(th);
out:
    for (int i = 0; i < L * E; i++) {
        int r = ep_owner_of(&go, i / E, i % E);
        eg_weight *dr[3] = {&xr[i].gate, &xr[i].up, &xr[i].down};
        eg_expert_w *own = &xo[(r * L + i / E) * E + i % E];
        eg_weight *dw[3] = {&own->gate, &own->up, &own->down};
        for (int j = 0; j < 3; j++) {
            eg_backend_bind(ref, &err);
            if (dr[j]->data) ref->ops->weight_release(ref, dr[j]);
            eg_backend_bind(be[r], &err);
            if (dw[j]->data) be[r]->ops->weight_release(be[r], dw[j]);
        }
    }
    for (int i = 0; i < L * E * 3; i++) hw_free(NULL, &ex[i]);
    free(ex); free(xr); free(xo);
    for (int r = 0; r < R; r++) eg_backend_free(be[r]);
    free(be);
    eg_backend_free(ref);
}

/* The vocab split (collective.h's vocab_split) over CUDA ranks: an embedding and an
 * lm_head call per round, two rounds; rank 0 leaves after the first round and serves the
 * second from its slices, rank 1 has no logit rows in round 0. V 50 over 3 ranks splits
 * unevenly (16 / 17 / 17). Each rank holds only its rows. The embedding rows must be the
 * unsplit table's bit for bit (a copy); every logit column must equal, bit for bit, one
 * backend's linear of the same rows with the owner's slice (the exchange moves floats,
 * nothing else); against the unsplit lm_head GEMM (V rows, not V/R) the difference is
 * printed: cuBLAS may reduce a different shape in another order. */
typedef struct ep_vocab_rank {
    eg_ep_group *g;
    int rank, rounds;
    eg_backend *be;
    const int32_t *tok[2];
    int T[2], n[2];
    float *x[2], *rows[2], *logits[2];
    eg_status st;
    eg_error err;
} ep_vocab_rank;

static void *ep_vocab_thread(void *v) {
    ep_vocab_rank *x = v;
    x->st = eg_backend_bind(x->be, &x->err);
    for (int i = 0; i < x->rounds && !x->st; i++)
        if (!(x->st = eg_ep_embed(x->g, x->rank, x->be, x->tok[i], x->T[i], x->x[i], &x->err)))
            x->st = eg_ep_logits(x->g, x->rank, x->be, x->rows[i], x->n[i], x->logits[i], &x->err);
    if (!x->st) x->st = eg_ep_leave(x->g, x->rank, x->be, &x->err);
    if (x->st) eg_ep_fail(x->g);
    return NULL;
}

static void ep_vocab_case(int R, int V, int Tmax, const int (*T)[2], const int (*N)[2]) {
    eg_config c = small_cfg();
    c.vocab = V;
    int H = c.hidden;
    eg_error err = {0};
    int ndev = 0;
    eg_backend *ref = NULL, **be = NULL;
    if (R < 1 || !ep_backends(&c, R, Tmax, &ref, &be, &ndev)) return;
    hw emb = make_w(EG_W_BF16, V, H, 1.0f), head = make_w(EG_W_BF16, V, H, 1.0f / sqrtf((float)H));
    eg_weight rh[3], ref_slice[3], full_e = {0}, full_h = {0}, se[3], sh[3];
    memset(se, 0, sizeof se); memset(sh, 0, sizeof sh); memset(ref_slice, 0, sizeof ref_slice);
    CHECK_OK(eg_backend_bind(ref, &err), &err);
    CHECK_OK(ref->ops->weight_upload(ref, &emb.w, &full_e, &err), &err);
    CHECK_OK(ref->ops->weight_upload(ref, &head.w, &full_h, &err), &err);
    eg_ep_opts go = {.n_ranks = R, .n_experts = R, .topk = 1, .hidden = H, .max_tokens = Tmax, .n_layers = 1,
                     .vocab_split = 1, .vocab = V, .backends = be};
    eg_ep_group *g = NULL;
    CHECK_OK(eg_ep_group_create(&go, &g, &err), &err);
    if (!g) goto out;
    for (int r = 0; r < R; r++) {
        int64_t v0, v1;
        eg_ep_vocab_range(g, r, &v0, &v1);
        eg_weight ve, vh;
        CHECK_OK(eg_weight_rows(&emb.w, v0, v1, &ve, &err), &err);
        CHECK_OK(eg_weight_rows(&head.w, v0, v1, &vh, &err), &err);
        rh[r] = vh;
        CHECK_OK(ref->ops->weight_upload(ref, &vh, &ref_slice[r], &err), &err);
        CHECK_OK(eg_backend_bind(be[r], &err), &err);
        CHECK_OK(be[r]->ops->weight_upload(be[r], &ve, &se[r], &err), &err);
        CHECK_OK(be[r]->ops->weight_upload(be[r], &vh, &sh[r], &err), &err);
        CHECK_OK(eg_backend_bind(ref, &err), &err);
        eg_ep_register_vocab(g, r, &se[r], &sh[r]);
    }
    ep_vocab_rank *rk = calloc((size_t)R, sizeof *rk);
    int32_t *tok_h[3][2];
    float *rows_h[3][2];
    for (int r = 0; r < R; r++) {
        rk[r] = (ep_vocab_rank){.g = g, .rank = r, .rounds = r == 0 ? 1 : 2, .be = be[r]};
        CHECK_OK(eg_backend_bind(be[r], &err), &err);
        for (int i = 0; i < 2; i++) {
            int t = T[r][i] ? T[r][i] : 1, n = N[r][i];
            rk[r].T[i] = t;
            rk[r].n[i] = n;
            tok_h[r][i] = malloc(sizeof(int32_t) * (size_t)t);
            for (int j = 0; j < t; j++) tok_h[r][i][j] = (int32_t)((r * 13 + i * 7 + j * 11) % V);
            rows_h[r][i] = randv((int64_t)(n ? n : 1) * H, 1.0f);
            void *p;
            CHECK_OK(be[r]->ops->alloc(be[r], 4 * (size_t)t, &p, &err), &err);
            rk[r].tok[i] = p;
            CHECK_OK(be[r]->ops->to_device(be[r], p, tok_h[r][i], 4 * (size_t)t, &err), &err);
            CHECK_OK(be[r]->ops->alloc(be[r], 4 * (size_t)t * H, &p, &err), &err);
            rk[r].x[i] = p;
            CHECK_OK(be[r]->ops->alloc(be[r], 4 * (size_t)(n ? n : 1) * H, &p, &err), &err);
            rk[r].rows[i] = p;
            CHECK_OK(be[r]->ops->to_device(be[r], p, rows_h[r][i], 4 * (size_t)(n ? n : 1) * H, &err), &err);
            CHECK_OK(be[r]->ops->alloc(be[r], 4 * (size_t)(n ? n : 1) * V, &p, &err), &err);
            rk[r].logits[i] = p;
        }
        CHECK_OK(be[r]->ops->sync(be[r], &err), &err);
    }
    pthread_t *th = calloc((size_t)R, sizeof *th);
    for (int r = 1; r < R; r++) pthread_create(&th[r], NULL, ep_vocab_thread, &rk[r]);
    ep_vocab_thread(&rk[0]);
    for (int r = 1; r < R; r++) pthread_join(th[r], NULL);
    int same_x = 1, same_l = 1;
    double worst = 0;
    void *rx, *rrow, *rl;
    CHECK_OK(eg_backend_bind(ref, &err), &err);
    CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)Tmax * H, &rx, &err), &err);
    CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)Tmax * H, &rrow, &err), &err);
    CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)Tmax * V, &rl, &err), &err);
    for (int r = 0; r < R; r++) {
        CHECKF(rk[r].st == EG_OK, "rank %d: %s", r, rk[r].err.msg);
        for (int i = 0; i < rk[r].rounds; i++) {
            int t = rk[r].T[i], n = rk[r].n[i];
            float *got = malloc(4 * (size_t)t * H), *want = malloc(4 * (size_t)t * H);
            float *gl = malloc(4 * (size_t)(n ? n : 1) * V), *wl = malloc(4 * (size_t)(n ? n : 1) * V);
            float *full = malloc(4 * (size_t)(n ? n : 1) * V), *part = malloc(4 * (size_t)(n ? n : 1) * V);
            CHECK_OK(eg_backend_bind(be[r], &err), &err);
            CHECK_OK(be[r]->ops->to_host(be[r], got, rk[r].x[i], 4 * (size_t)t * H, &err), &err);
            if (n) CHECK_OK(be[r]->ops->to_host(be[r], gl, rk[r].logits[i], 4 * (size_t)n * V, &err), &err);
            CHECK_OK(be[r]->ops->sync(be[r], &err), &err);
            CHECK_OK(eg_backend_bind(ref, &err), &err);
            void *rt;
            CHECK_OK(ref->ops->alloc(ref, 4 * (size_t)t, &rt, &err), &err);
            CHECK_OK(ref->ops->to_device(ref, rt, tok_h[r][i], 4 * (size_t)t, &err), &err);
            CHECK_OK(ref->ops->embed(ref, rt, t, &full_e, rx, &err), &err);
            CHECK_OK(ref->ops->to_host(ref, want, rx, 4 * (size_t)t * H, &err), &err);
            if (n) {
                CHECK_OK(ref->ops->to_device(ref, rrow, rows_h[r][i], 4 * (size_t)n * H, &err), &err);
                for (int q = 0; q < R; q++) { /* the owner's slice, this rank's rows: its columns */
                    int64_t v0, v1;
                    eg_ep_vocab_range(g, q, &v0, &v1);
                    CHECK_OK(ref->ops->linear(ref, rrow, n, &ref_slice[q], rl, &err), &err);
                    CHECK_OK(ref->ops->to_host(ref, part, rl, 4 * (size_t)n * (size_t)(v1 - v0), &err), &err);
                    CHECK_OK(ref->ops->sync(ref, &err), &err);
                    for (int j = 0; j < n; j++)
                        memcpy(wl + (size_t)j * V + v0, part + (size_t)j * (v1 - v0), 4 * (size_t)(v1 - v0));
                }
                CHECK_OK(ref->ops->linear(ref, rrow, n, &full_h, rl, &err), &err);
                CHECK_OK(ref->ops->to_host(ref, full, rl, 4 * (size_t)n * V, &err), &err);
            }
            CHECK_OK(ref->ops->sync(ref, &err), &err);
            ref->ops->release(ref, rt);
            if (memcmp(got, want, 4 * (size_t)t * H)) {
                same_x = 0;
                printf("      rank %d round %d: embedding rows differ from the unsplit table's\n", r, i);
            }
            if (n && memcmp(gl, wl, 4 * (size_t)n * V)) {
                same_l = 0;
                printf("      rank %d round %d: logits differ from the owners' slices' (rel %.3g)\n", r, i,
                       rel_err(gl, wl, (int64_t)n * V));
            }
            if (n) {
                double e = rel_err(gl, full, (int64_t)n * V);
                worst = e > worst ? e : worst;
            }
            free(got); free(want); free(gl); free(wl); free(full); free(part);
        }
    }
    int64_t er = 0, lr = 0;
    eg_ep_vocab_rows(g, &er, &lr);
    CHECKF(same_x, "vocab split over %d ranks (%s): every embedding row is the unsplit table's, bit for bit", R,
           eg_ep_kind(g));
    CHECKF(same_l, "vocab split over %d ranks (%s): every logit column is its owner's slice's, bit for bit", R,
           eg_ep_kind(g));
    CHECKF(er > 0 && lr > 0, "vocab split: rows crossed ranks (%lld embedded elsewhere, %lld logit rows)", (long long)er,
           (long long)lr);
    printf("  vocab split: V %d over %d ranks on %d GPU(s), exchange %s: embedding %s, logits %s; %lld tokens "
           "embedded by another rank, %lld logit rows served; against the unsplit lm_head GEMM: rel %.3g%s\n", V, R, ndev,
           eg_ep_kind(g), same_x ? "identical" : "DIFFERENT", same_l ? "identical" : "DIFFERENT", (long long)er,
           (long long)lr, worst, worst == 0 ? " (identical)" : "");
    ref->ops->release(ref, rx); ref->ops->release(ref, rrow); ref->ops->release(ref, rl);
    for (int r = 0; r < R; r++) {
        eg_backend_bind(be[r], &err);
        for (int i = 0; i < 2; i++) {
            be[r]->ops->release(be[r], (void *)rk[r].tok[i]);
            be[r]->ops->release(be[r], rk[r].x[i]);
            be[r]->ops->release(be[r], rk[r].rows[i]);
            be[r]->ops->release(be[r], rk[r].logits[i]);
            free(tok_h[r][i]);
            free(rows_h[r][i]);
        }
    }
    free(rk); free(th);
    eg_ep_group_free(g);
out:
    for (int r = 0; r < R; r++) {
        eg_backend_bind(be[r], &err);
        if (se[r].data) be[r]->ops->weight_release(be[r], &se[r]);
        if (sh[r].data) be[r]->ops->weight_release(be[r], &sh[r]);
        eg_backend_bind(ref, &err);
        if (ref_slice[r].data) ref->ops->weight_release(ref, &ref_slice[r]);
    }
    eg_backend_bind(ref, &err);
    if (full_e.data) ref->ops->weight_release(ref, &full_e);
    if (full_h.data) ref->ops->weight_release(ref, &full_h);
    hw_free(NULL, &emb);
    hw_free(NULL, &head);
    (void)rh;
    for (int r = 0; r < R; r++) eg_backend_free(be[r]);
    free(be);
    eg_backend_free(ref);
}

static void test_ep_vocab(void) {
    seed(21);
    static const int T3[3][2] = {{4, 0}, {6, 3}, {2, 5}}, N3[3][2] = {{3, 0}, {0, 2}, {2, 5}};
    ep_vocab_case(3, 50, 6, T3, N3);
    ep_vocab_case(2, 64, 6, T3, N3);
    /* more logit rows than one round of the lm_head exchange (128 per source): 130 rows
       on rank 1 take two rounds, rank 0's 3 rows one, in the second round it only serves */
    static const int T2[3][2] = {{5, 0}, {7, 130}, {0, 0}}, N2[3][2] = {{3, 0}, {2, 130}, {0, 0}};
    ep_vocab_case(2, 64, 130, T2, N2);
}

static void test_ep_group(void) {
    seed(12);
    int t2[2] = {5, 11}, t4[4] = {3, 9, 1, 16};
    ep_group_case(EG_W_BF16, 2, t2, 0, 0);
    ep_group_case(EG_W_INT4, 4, t4, 1, 0);
    /* a layer split between two stages: each half a call of its own, shared out over the
       ranks (cut 3 of 16 over 4 ranks: ranks with no expert of the first half) */
    ep_group_case(EG_W_BF16, 2, t2, 0, 5);
    ep_group_case(EG_W_INT4, 4, t4, 1, 3);
}


/* ---- plain MHA/GQA attention (the EAGLE-3 drafter's layer) and copy_rows ------------- */

/* The paged cache of the gqa tests: BS positions per block, MB blocks per slot, the
 * slots' blocks shuffled over the pool (and one slot row ending unmapped). */
typedef struct gqa_cache {
    int BS, MB;
    int64_t n_blocks;
    buf2 table; /* [S][MB] */
} gqa_cache;

/* One gqa_attention call on both backends: rows (slot, pos); the caches must match bit
 * for bit (the same rotation, the same BF16 rounding), the outputs to 1e-5 (FP32 both
 * sides; the CUDA kernel's online softmax sums in another order). */
static void gqa_call(pair *p, int NH, int NKV, int HD, const gqa_cache *gc, int window, buf2 *kc, buf2 *vc,
                     const buf2 *inv, int T, const int32_t *slot, const int32_t *pos, const char *what, double *worst) {
    eg_error err = {0};
    int max_pos = 0;
    for (int t = 0; t < T; t++)
        if (pos[t] + 1 > max_pos) max_pos = pos[t] + 1;
    float *q = randv((int64_t)T * NH * HD, 1.0f), *k = randv((int64_t)T * NKV * HD, 1.0f),
          *v = randv((int64_t)T * NKV * HD, 1.0f);
    buf2 bq = b2(p, q, sizeof(float) * (size_t)T * NH * HD), bk = b2(p, k, sizeof(float) * (size_t)T * NKV * HD),
         bv = b2(p, v, sizeof(float) * (size_t)T * NKV * HD), bs = b2(p, slot, sizeof(int32_t) * (size_t)T),
         bp = b2(p, pos, sizeof(int32_t) * (size_t)T), bo = b2(p, NULL, sizeof(float) * (size_t)T * NH * HD);
    eg_gqa_args a = {.T = T, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .block_size = gc->BS,
                     .max_blocks = gc->MB, .n_blocks = gc->n_blocks, .max_pos = max_pos, .rope_inv_freq = inv->c,
                     .softmax_scale = 1.0f / sqrtf((float)HD), .window = window};
    a.pos = bp.c, a.slot = bs.c, a.q = bq.c, a.k = bk.c, a.v = bv.c, a.k_cache = kc->c, a.v_cache = vc->c, a.out = bo.c;
    a.block_table = gc->table.c;
    CHECK_OK(p->cpu->ops->gqa_attention(p->cpu, &a, &err), &err);
    a.pos = bp.g, a.slot = bs.g, a.q = bq.g, a.k = bk.g, a.v = bv.g, a.k_cache = kc->g, a.v_cache = vc->g, a.out = bo.g;
    a.block_table = gc->table.g;
    a.rope_inv_freq = inv->g;
    CHECK_OK(p->gpu->ops->gqa_attention(p->gpu, &a, &err), &err);
    double r = cmp_f32(p, &bo, what, 1e-5);
    if (r > *worst) *worst = r;
    uint16_t *hk = fetch(p, kc), *hv = fetch(p, vc);
    int same = !memcmp(hk, kc->c, kc->n) && !memcmp(hv, vc->c, vc->n);
    CHECKF(same, "%s: cache bits differ", what);
    free(hk);
    free(hv);
    b2_free(p, &bq), b2_free(p, &bk), b2_free(p, &bv), b2_free(p, &bs), b2_free(p, &bp), b2_free(p, &bo);
    free(q), free(k), free(v);
}

/* window > 0: a sliding window (positions (p - window, p]); 70 starts the GPU's tiles of
 * 64 off their boundary and cuts the early positions at 150. BS: the cache's block size
 * (the slots' blocks shuffled over a pool with spare blocks; 160 = one block per slot). */
static void gqa_case(int NH, int NKV, int HD, double theta, int window, int BS, const char *name) {
    seed(77 + NH + HD + BS);
    eg_config c = small_cfg();
    pair p;
    if (!pair_make(&c, 128, &p)) return;
    enum { S = 2, L = 160 };
    gqa_cache gc = {.BS = BS, .MB = (L + BS - 1) / BS};
    gc.n_blocks = (int64_t)S * gc.MB + 3;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)gc.n_blocks), *tab = malloc(sizeof(int32_t) * (size_t)S * gc.MB);
    for (int64_t i = 0; i < gc.n_blocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = gc.n_blocks - 1; i > 0; i--) { /* Fisher-Yates on the test's seeded stream */
        int64_t j = (int64_t)(urand() * (double)(i + 1));
        if (j > i) j = i;
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < (int64_t)S * gc.MB; i++) tab[i] = perm[i]; /* slot s block b: perm[s * MB + b] */
    if (gc.MB > 1) tab[2 * gc.MB - 1] = -1; /* slot 1 never reaches its last block */
    gc.table = b2(&p, tab, sizeof(int32_t) * (size_t)S * gc.MB);
    size_t cb = sizeof(uint16_t) * (size_t)gc.n_blocks * gc.BS * NKV * HD;
    buf2 kc = b2(&p, NULL, cb), vc = b2(&p, NULL, cb);
    float inv[256];
    for (int i = 0; i < HD / 2; i++) inv[i] = (float)(1.0 / pow(theta, (2.0 * i) / HD));
    buf2 bi = b2(&p, inv, sizeof(float) * (size_t)(HD / 2));
    double worst = 0;
    char what[160];
    /* mixed prefill: slot 1 positions 0..4 and slot 0 positions 0..6 interleaved */
    int32_t slot[128], pos[128];
    int T = 0;
    for (int i = 0; i < 7; i++) {
        if (i < 5) slot[T] = 1, pos[T++] = i;
        slot[T] = 0, pos[T++] = i;
    }
    snprintf(what, sizeof what, "gqa %s: mixed prefill of 2 slots (T %d)", name, T);
    gqa_call(&p, NH, NKV, HD, &gc, window, &kc, &vc, &bi, T, slot, pos, what, &worst);
    /* decode: one row per slot */
    slot[0] = 0, pos[0] = 7, slot[1] = 1, pos[1] = 5;
    snprintf(what, sizeof what, "gqa %s: decode, 2 slots", name);
    gqa_call(&p, NH, NKV, HD, &gc, window, &kc, &vc, &bi, 2, slot, pos, what, &worst);
    /* slot 0 to 150 positions in one call (three tiles of 64 on the GPU), then decode */
    for (int i = 0; i < 128; i++) slot[i] = 0, pos[i] = 8 + i;
    snprintf(what, sizeof what, "gqa %s: extend 128 rows, positions 8..135", name);
    gqa_call(&p, NH, NKV, HD, &gc, window, &kc, &vc, &bi, 128, slot, pos, what, &worst);
    for (int i = 0; i < 14; i++) slot[i] = 0, pos[i] = 136 + i;
    snprintf(what, sizeof what, "gqa %s: extend 14 rows, positions 136..149", name);
    gqa_call(&p, NH, NKV, HD, &gc, window, &kc, &vc, &bi, 14, slot, pos, what, &worst);
    slot[0] = 0, pos[0] = 150;
    snprintf(what, sizeof what, "gqa %s: decode at position 150", name);
    gqa_call(&p, NH, NKV, HD, &gc, window, &kc, &vc, &bi, 1, slot, pos, what, &worst);
    printf("    gqa %s: worst rel %.2e, caches bit-identical\n", name, worst);
    b2_free(&p, &kc), b2_free(&p, &vc), b2_free(&p, &bi), b2_free(&p, &gc.table);
    free(perm);
    free(tab);
    pair_free(&p);
}

static void test_gqa_attention(void) {
    gqa_case(4, 2, 16, 10000.0, 0, 160, "4 heads / 2 kv of 16, one block per slot");
    gqa_case(4, 2, 16, 10000.0, 0, 16, "4 heads / 2 kv of 16, shuffled blocks of 16");
    gqa_case(8, 1, 32, 500000.0, 0, 7, "8 heads / 1 kv of 32 (MQA), shuffled blocks of 7");
    gqa_case(2, 2, 128, 50000.0, 0, 64, "2 heads of 128 (MHA), shuffled blocks of 64");
    gqa_case(4, 2, 16, 10000.0, 70, 5, "4 heads / 2 kv of 16, sliding window 70, shuffled blocks of 5");
    /* the kernel's tile shrinks with G * HD to stay in 48 KB of shared memory (64, 32, 16,
     * then 8 positions and an opt-in); an odd HD / 2 keeps the word loop honest */
    gqa_case(6, 3, 18, 10000.0, 0, 9, "6 heads / 3 kv of 18 (9 words a row), shuffled blocks of 9");
    CHECKF(egk_gqa_smem_bytes(16, 2, 256) <= 48 * 1024, "gqa 16 / 2 of 256: %zu bytes of shared memory",
           egk_gqa_smem_bytes(16, 2, 256));
    gqa_case(16, 2, 256, 1000000.0, 0, 32, "16 heads / 2 kv of 256 (tiles of 16), shuffled blocks of 32");
    CHECKF(egk_gqa_smem_bytes(32, 1, 256) > 48 * 1024, "gqa 32 / 1 of 256: %zu bytes of shared memory",
           egk_gqa_smem_bytes(32, 1, 256));
    gqa_case(32, 1, 256, 1000000.0, 40, 16, "32 heads / 1 kv of 256 (opt-in above 48 KB, tiles of 8), window 40");
}

static void test_copy_rows(void) {
    seed(91);
    eg_config c = small_cfg();
    pair p;
    if (!pair_make(&c, 8, &p)) return;
    enum { R = 5, W = 37, DS = 80, SS = 41 };
    float *src = randv(R * SS, 1.0f), *dst = randv(R * DS, 1.0f);
    buf2 bs = b2(&p, src, sizeof(float) * R * SS), bd = b2(&p, dst, sizeof(float) * R * DS);
    eg_error err = {0};
    /* into columns [40, 77) of [R][80], from columns [3, 40) of [R][41] */
    CHECK_OK(p.cpu->ops->copy_rows(p.cpu, (float *)bd.c + 40, DS, (const float *)bs.c + 3, SS, R, W, &err), &err);
    CHECK_OK(p.gpu->ops->copy_rows(p.gpu, (float *)bd.g + 40, DS, (const float *)bs.g + 3, SS, R, W, &err), &err);
    float *h = fetch(&p, &bd);
    int ok = !memcmp(h, bd.c, bd.n), placed = 1;
    for (int r = 0; r < R; r++)
        for (int x = 0; x < DS; x++) {
            float want = x >= 40 && x < 40 + W ? src[r * SS + 3 + x - 40] : dst[r * DS + x];
            placed &= ((float *)bd.c)[r * DS + x] == want;
        }
    CHECKF(ok && placed, "copy_rows: %s", ok ? "CPU result misplaced" : "CUDA differs from CPU");
    CHECK(p.gpu->ops->copy_rows(p.gpu, (float *)bd.g, 10, (const float *)bs.g, SS, 2, 20, &err) == EG_ERR_INVALID);
    printf("    copy_rows: %d rows of %d into a column block: identical\n", R, W);
    free(h), free(src), free(dst);
    b2_free(&p, &bs), b2_free(&p, &bd);
    pair_free(&p);
}

/* The EAGLE-3 drafter through the CUDA backend (eg_eagle3_opts.backend "cuda", its paged
 * cache in blocks of 3, extends in passes of 4 rows) against the drafter's own CPU code
 * (one block of 16 per slot), on a random drafter for the
 * tiny-a fixture and on the same with speculators' options and a sliding window: the
 * draft-vocabulary logits of every proposal step (rel, bound as for BF16 GEMMs), the
 * greedy drafts, and q of sampled drafts. */
/* One drafter directory through both paths (the comparison above). */
static void drafter_case(const char *ddir, eg_model *m, const char *what) {
    eg_error err = {0};
    eg_drafter *dc = NULL, *dg = NULL;
    /* the CUDA drafter's cache in blocks of 3 (slots spanning several, taken in turn) */
    eg_eagle3_opts oc = {.threads = 2}, og = {.threads = 2, .backend = "cuda", .max_rows = 4, .block_size = 3};
    CHECK_OK(eg_drafter_eagle3_load_opts(ddir, m, 2, 32, &oc, &dc, &err), &err);
    CHECK_OK(eg_drafter_eagle3_load_opts(ddir, m, 2, 32, &og, &dg, &err), &err);
    if (!dc || !dg) {
        eg_drafter_free(dc), eg_drafter_free(dg);
        return;
    }
    CHECK(!strcmp(eg_drafter_eagle3_backend(dg), "cuda") &&
          dc->info.cache_bytes_per_token == dg->info.cache_bytes_per_token && dg->info.block_size == 3 &&
          dg->info.pool_blocks == 2 * ((32 + 2) / 3));
    const int H = dc->info.hidden, V = dc->info.target_vocab, Vd = eg_drafter_eagle3_draft_vocab(dc);
    enum { N = 7, K = 3 };
    seed(123);
    float *aux = randv((int64_t)N * 3 * H, 1.0f);
    int32_t next[N], seq[64] = {0}, da[K], db[K];
    for (int t = 0; t < N; t++) next[t] = (int32_t)(next64() % (uint64_t)V);
    const eg_sample_params greedy = {0.0f, 1.0f, 0}, sp = {0.9f, 0.95f, 0};
    double worst = 0, worst_q = 0;
    uint64_t ra = 5, rb = 5;
    int drafts_same = 1;
    /* slot 1: positions 0..5 in one call (passes of 4 + 2), then greedy chains of 3 */
    CHECK_OK(eg_drafter_extend(dc, 1, 0, 6, aux, next, &err), &err);
    CHECK_OK(eg_drafter_extend(dg, 1, 0, 6, aux, next, &err), &err);
    for (int k = 1; k <= K; k++) {
        CHECK_OK(eg_drafter_propose(dc, 1, seq, 7, k, &greedy, &ra, da, NULL, &err), &err);
        CHECK_OK(eg_drafter_propose(dg, 1, seq, 7, k, &greedy, &rb, db, NULL, &err), &err);
        double r = rel_err(eg_drafter_eagle3_last_logits(dg), eg_drafter_eagle3_last_logits(dc), Vd);
        printf("    drafter%s via cuda: 6-row extend, draft %d: logits rel %.2e\n", what, k, r);
        if (r > worst) worst = r;
        drafts_same &= !memcmp(da, db, sizeof(int32_t) * (size_t)k);
        eg_drafter_truncate(dc, 1, 6);
        eg_drafter_truncate(dg, 1, 6);
    }
    /* slot 0: one position at a time, sampled drafts with q each step */
    double *qa = malloc(sizeof(double) * (size_t)K * V), *qb = malloc(sizeof(double) * (size_t)K * V);
    eg_spec_q sqa = tq_alloc(K, V), sqb = tq_alloc(K, V);
    for (int t = 0; t < N; t++) {
        CHECK_OK(eg_drafter_extend(dc, 0, t, 1, aux + (int64_t)t * 3 * H, next + t, &err), &err);
        CHECK_OK(eg_drafter_extend(dg, 0, t, 1, aux + (int64_t)t * 3 * H, next + t, &err), &err);
        CHECK_OK(eg_drafter_propose(dc, 0, seq, t + 2, 2, &sp, &ra, da, &sqa, &err), &err);
        CHECK_OK(eg_drafter_propose(dg, 0, seq, t + 2, 2, &sp, &rb, db, &sqb, &err), &err);
        tq_dense(&sqa, 2, V, qa);
        tq_dense(&sqb, 2, V, qb);
        double r = rel_err(eg_drafter_eagle3_last_logits(dg), eg_drafter_eagle3_last_logits(dc), Vd);
        if (r > worst) worst = r;
        double num = 0, den = 0;
        for (int64_t i = 0; i < 2 * (int64_t)V; i++) num += (qa[i] - qb[i]) * (qa[i] - qb[i]), den += qa[i] * qa[i];
        if (sqrt(num / den) > worst_q) worst_q = sqrt(num / den);
        drafts_same &= da[0] == db[0] && da[1] == db[1];
        eg_drafter_truncate(dc, 0, t + 1);
        eg_drafter_truncate(dg, 0, t + 1);
    }
    /* the engine's batched calls on CUDA: both slots extended in one pass (3 rows, slot 1
       then slot 0), then one propose of a sampled chain of 3 (slot 0, q) and a greedy one of
       2 (slot 1), against the own code's per-slot calls */
    {
        eg_draft_extend xs[2] = {{1, 6, 1, aux, next}, {0, N, 2, aux + 3 * (int64_t)H, next + 1}};
        CHECK_OK(eg_drafter_extend(dc, 1, 6, 1, aux, next, &err), &err);
        CHECK_OK(eg_drafter_extend(dc, 0, N, 2, aux + 3 * (int64_t)H, next + 1, &err), &err);
        CHECK_OK(eg_drafter_extend_many(dg, 2, xs, &err), &err);
        double *q3a = malloc(sizeof(double) * 3 * (size_t)V), *q3b = malloc(sizeof(double) * 3 * (size_t)V);
        int32_t d0a[3], d0b[3], d1a[2], d1b[2];
        uint64_t r1a = 77, r1b = 77;
        eg_draft_propose ps[2] = {{1, seq, 8, 2, &greedy, &r1b, d1b, NULL}, {0, seq, N + 3, 3, &sp, &rb, d0b, &sqb}};
        CHECK_OK(eg_drafter_propose(dc, 1, seq, 8, 2, &greedy, &r1a, d1a, NULL, &err), &err);
        CHECK_OK(eg_drafter_propose(dc, 0, seq, N + 3, 3, &sp, &ra, d0a, &sqa, &err), &err);
        CHECK_OK(eg_drafter_propose_many(dg, 2, ps, &err), &err);
        tq_dense(&sqa, 3, V, q3a);
        tq_dense(&sqb, 3, V, q3b);
        double num = 0, den = 0;
        for (int64_t i = 0; i < 3 * (int64_t)V; i++) num += (q3a[i] - q3b[i]) * (q3a[i] - q3b[i]), den += q3a[i] * q3a[i];
        if (sqrt(num / den) > worst_q) worst_q = sqrt(num / den);
        drafts_same &= !memcmp(d0a, d0b, sizeof d0a) && !memcmp(d1a, d1b, sizeof d1a) && r1a == r1b;
        printf("    drafter%s via cuda, batched (extend_many of 2 slots in one pass, propose_many of chains 3 + 2): "
               "drafts %s, q rel %.2e\n", what, drafts_same ? "identical" : "DIFFERENT", sqrt(num / den));
        free(q3a), free(q3b);
    }
    printf("    drafter%s via cuda vs own CPU code: logits rel <= %.2e over %d steps, q rel <= %.2e, drafts %s\n", what,
           worst, K + N, worst_q, drafts_same ? "identical" : "DIFFERENT");
    CHECKF(worst < bf16_bound(), "drafter%s logits rel %.3g", what, worst);
    CHECKF(worst_q < bf16_bound(), "drafter%s q rel %.3g", what, worst_q);
    CHECK(drafts_same && ra == rb);
    /* the draws' rows reduced on the device (backend_draws 0 on CUDA): greedy rows by its
       argmax, sampled ones from kept sets unless over the cap or unsettled */
    const int64_t kept = dg->draws.kept, am = dg->draws.argmax, host = dg->draws.host_rows;
    printf("    drafter%s via cuda: %lld drafts from the device's kept sets, %lld by its argmax, %lld rows to the host\n",
           what, (long long)kept, (long long)am, (long long)host);
    CHECK(am == K * (K + 1) / 2 + 2 && kept + host == 2 * N + 3); /* greedy chains 1..K and one of 2 */
    tq_free(&sqa);
    tq_free(&sqb);
    free(qa), free(qb), free(aux);
    eg_drafter_free(dc);
    eg_drafter_free(dg);
}

/* ddir's drafter with speculators' options on (norm_before_residual, norm_before_fc with
 * an input_norm.weight over the 3 aux rows, norm_output, a sliding window of 4) into vdir. */
static void drafter_variant(const char *ddir, const char *vdir) {
    char p[1300];
    mkdir(vdir, 0755);
    snprintf(p, sizeof p, "%s/config.json", ddir);
    json_t *c = json_load_file(p, 0, NULL);
    EG_ASSERT(c);
    json_object_set_new(c, "norm_before_residual", json_true());
    json_object_set_new(c, "norm_before_fc", json_true());
    json_object_set_new(c, "norm_output", json_true());
    json_object_set_new(c, "fc_norm", json_true());
    json_object_set_new(c, "use_sliding_window", json_true());
    json_object_set_new(c, "sliding_window", json_integer(4));
    snprintf(p, sizeof p, "%s/config.json", vdir);
    EG_ASSERT(json_dump_file(c, p, JSON_INDENT(1)) == 0);
    json_decref(c);
    eg_error e = {0};
    eg_st_file *f = NULL;
    eg_st_writer *w = NULL;
    snprintf(p, sizeof p, "%s/model.safetensors", ddir);
    EG_ASSERT(eg_st_open(p, &f, &e) == EG_OK && eg_st_writer_new(&w, &e) == EG_OK);
    for (int i = 0; i < eg_st_count(f); i++) {
        const eg_st_tensor *t = eg_st_at(f, i);
        EG_ASSERT(eg_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &e) == EG_OK);
    }
    const eg_st_tensor *fc = eg_st_find(f, "fc.weight");
    EG_ASSERT(fc);
    int64_t n = fc->shape[1];
    float *g = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) g[i] = 0.5f + (float)(next64() % 1000) / 1000.0f;
    EG_ASSERT(eg_st_writer_add(w, "input_norm.weight", EG_ST_F32, 1, &n, g, &e) == EG_OK);
    int64_t ht = n / 3; /* fc_norm: one weight per aux row (the test's 3) */
    float *fcn = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) fcn[i] = 0.7f + (float)(next64() % 600) / 1000.0f;
    char nm[3][32];
    for (int i = 0; i < 3; i++) {
        snprintf(nm[i], sizeof nm[i], "fc_norm.%d.weight", i);
        EG_ASSERT(eg_st_writer_add(w, nm[i], EG_ST_F32, 1, &ht, fcn + i * ht, &e) == EG_OK);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", vdir);
    EG_ASSERT(eg_st_writer_write(w, p, &e) == EG_OK);
    eg_st_writer_free(w);
    eg_st_close(f);
    free(g);
    free(fcn);
}

static void test_drafter(void) {
    const char *fx = getenv("FIXTURES") ? getenv("FIXTURES") : "../shared/fixtures";
    char tdir[512], ddir[512], vdir[600];
    snprintf(tdir, sizeof tdir, "%s/models/tiny-a", fx);
    struct stat sb;
    CHECKF(stat(tdir, &sb) == 0, "no target model %s (set FIXTURES)", tdir);
    if (stat(tdir, &sb)) return;
    snprintf(ddir, sizeof ddir, "/tmp/eg_cuda_ops_drafter_%d", (int)getpid());
    snprintf(vdir, sizeof vdir, "%s_variant", ddir);
    eg_error err = {0};
    static const int aux_l[3] = {0, 2, 4};
    eg_mkdrafter_opts mo = {.target_dir = tdir, .out_dir = ddir, .seed = 7, .draft_vocab = 200, .n_aux = 3,
                            .aux_layers = aux_l};
    CHECK_OK(eg_mkmodel_drafter(&mo, &err), &err);
    eg_model m;
    memset(&m, 0, sizeof m);
    CHECK_OK(eg_model_load(tdir, &m, &err), &err);
    drafter_case(ddir, &m, "");
    drafter_variant(ddir, vdir);
    drafter_case(vdir, &m, " (norm_before_residual, norm_before_fc, fc_norm, norm_output, window 4)");
    /* vLLM's MLA drafter: the CUDA backend's mla_attention over its paged latent cache
       against the CPU backend's (the MLA drafter's "own" path) */
    char mdir[600];
    snprintf(mdir, sizeof mdir, "%s_mla", ddir);
    eg_mkdrafter_opts mm = mo;
    mm.out_dir = mdir;
    mm.mla = 1;
    CHECK_OK(eg_mkmodel_drafter(&mm, &err), &err);
    drafter_case(mdir, &m, " (MLA)");
    eg_model_free(&m);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s %s", ddir, vdir, mdir);
    if (system(cmd) != 0) fprintf(stderr, "    could not remove %s\n", ddir);
}

static const eg_test tests[] = {
    {"errors_and_plan", test_errors_and_plan},
    {"profiled_transport", test_profiled_transport},
    {"embed_norm_add_gather", test_embed_norm_add_gather},
    {"linear_small", test_linear_small},
    {"linear_kimi", test_linear_kimi},
    {"swiglu", test_swiglu},
    {"mla_small", test_mla_small},
    {"mla_small_long", test_mla_small_long},
    {"mla_paths", test_mla_paths},
    {"mla_kimi", test_mla_kimi},
    {"mla_long", test_mla_long},
    {"mla_graph", test_mla_graph},
    {"router", test_router},
    {"moe_small", test_moe_small},
    {"moe_fold", test_moe_fold},
    {"moe_kimi", test_moe_kimi},
    {"moe_kimi_range", test_moe_kimi_range},
    {"sample_small", test_sample_small},
    {"token_probs", test_token_probs},
    {"kept_probs", test_kept_probs},
    {"random_weights", test_random_weights},
    {"sample_kimi", test_sample_kimi},
    {"graphs", test_graphs},
    {"ep_group", test_ep_group},
    {"ep_vocab", test_ep_vocab},
    {"gqa_attention", test_gqa_attention},
    {"copy_rows", test_copy_rows},
    {"drafter", test_drafter},
    {"big_embed_lmhead", test_big_embed_lmhead},
    {"big_mla_cache", test_big_mla_cache},
};

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    eg_config c = small_cfg();
    eg_backend_opts o = {.name = "cuda", .max_tokens = 1, .max_seq_len = 16, .device = 0};
    eg_backend *b = NULL;
    eg_error err = {0};
    eg_status st = eg_backend_cuda_create(&c, &o, &b, &err);
    if (st == EG_ERR_UNSUPPORTED) {
        printf("test_cuda_ops: %s\n", err.msg);
        no_gpu = 1;
        return 2;
    }
    eg_backend_free(b);
    (void)eg_test_seed();
    return eg_test_main("cuda_ops", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
