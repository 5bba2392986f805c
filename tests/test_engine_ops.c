/* Op tests: every CPU backend op against straightforward scalar code (double
 * precision, written independently) on seeded random inputs. The MLA test checks the
 * absorbed attention against the expanded form (per-head keys and values rebuilt from
 * the cached latent), across a shuffled paged block table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/plan.h"
#include "engine/spec.h"
#include "tests/check.h"

static uint64_t rs;
static double urand(void) {
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) * 0x1.0p-53;
}
static float nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static eg_config small_cfg(void) {
    eg_config c;
    memset(&c, 0, sizeof c);
    c.hidden = 48; c.n_layers = 2; c.n_heads = 3; c.q_lora_rank = 0; c.kv_lora_rank = 24;
    c.qk_nope = 8; c.qk_rope = 6; c.v_head = 10; c.inter = 40; c.moe_inter = 16; c.n_experts = 8;
    c.n_shared = 1; c.topk = 3; c.n_group = 4; c.topk_group = 2; c.routed_scale = 2.5f; c.norm_topk = 1;
    c.rms_eps = 1e-6f; c.vocab = 50; c.rope_theta = 10000;
    return c;
}

/* Weight storage made by the test, in the formats of weights.h. */
typedef struct { eg_weight w; void *data, *scale; } owned_w;

static owned_w make_w(eg_wfmt fmt, int64_t rows, int64_t cols, float sd) {
    owned_w o;
    memset(&o, 0, sizeof o);
    o.w.fmt = fmt; o.w.rows = rows; o.w.cols = cols; o.w.name = "test";
    int64_t n = rows * cols;
    if (fmt == EG_W_F32) {
        float *d = malloc(4 * (size_t)n);
        for (int64_t i = 0; i < n; i++) d[i] = nrand() * sd;
        o.data = d;
    } else if (fmt == EG_W_BF16) {
        uint16_t *d = malloc(2 * (size_t)n);
        for (int64_t i = 0; i < n; i++) d[i] = eg_f32_to_bf16(nrand() * sd);
        o.data = d;
    } else if (fmt == EG_W_INT4) {
        int g = 32;
        int32_t *d = calloc((size_t)(rows * cols / 8), 4);
        uint16_t *s = malloc(2 * (size_t)(rows * cols / g));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                uint32_t nib = (uint32_t)(urand() * 16) & 15;
                d[r * (cols / 8) + c / 8] |= (int32_t)(nib << (4 * (c % 8)));
            }
        for (int64_t i = 0; i < rows * cols / g; i++) s[i] = eg_f32_to_bf16(sd * (0.05f + (float)urand() * 0.2f));
        o.w.group = g;
        o.data = d; o.scale = s;
    } else if (fmt == EG_W_FP8) {
        uint8_t *d = malloc((size_t)n);
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        float *s = malloc(4 * (size_t)(sr * sc));
        for (int64_t i = 0; i < n; i++) {
            uint8_t v = (uint8_t)(urand() * 256);
            if ((v & 0x7f) == 0x7f) v = 0x10; /* no NaN */
            d[i] = v;
        }
        for (int64_t i = 0; i < sr * sc; i++) s[i] = sd * 0.01f * (1 + (float)urand());
        o.data = d; o.scale = s;
    }
    o.w.data = o.data; o.w.scale = o.scale;
    return o;
}
static void free_w(owned_w *o) { free(o->data); free(o->scale); }

static double relerr(const float *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { num += (a[i] - b[i]) * (a[i] - b[i]); den += b[i] * b[i]; }
    return sqrt(num / (den > 0 ? den : 1));
}

static eg_backend *mk_backend(const eg_config *c, int max_tokens) {
    eg_backend *b = NULL;
    eg_error err = {0};
    eg_backend_opts o = {.name = "cpu", .max_tokens = max_tokens, .max_seq_len = 64, .nthreads = 2};
    CHECK_OK(eg_backend_create(c, &o, &b, &err), &err);
    return b;
}

static void test_int4_layout(void) {
    /* column 8j+i sits in bits 4i..4i+3 of word j, value = nibble - 8, times its group's scale */
    int32_t words[8] = {0};
    uint16_t scales[2] = {eg_f32_to_bf16(0.5f), eg_f32_to_bf16(2.0f)};
    for (int c = 0; c < 64; c++) words[c / 8] |= (int32_t)((uint32_t)(c % 16) << (4 * (c % 8)));
    eg_weight w = {.fmt = EG_W_INT4, .rows = 1, .cols = 64, .data = words, .scale = scales, .group = 32};
    for (int c = 0; c < 64; c++) {
        float want = (float)((c % 16) - 8) * (c < 32 ? 0.5f : 2.0f);
        CHECKF(eg_weight_get(&w, 0, c) == want, "col %d: %g != %g", c, eg_weight_get(&w, 0, c), want);
    }
    float row[64];
    eg_weight_row(&w, 0, row);
    for (int c = 0; c < 64; c++) CHECK(row[c] == eg_weight_get(&w, 0, c));
}

static void test_fp8_block(void) {
    /* e4m3: 0x38 = 1.0, 0x40 = 2.0, 0xb8 = -1.0, 0x01 = 2^-9; scale per 128x128 block */
    uint8_t d[2 * 130];
    float s[2] = {0.5f, 4.0f};
    memset(d, 0x38, sizeof d);
    d[129] = 0x40; d[130] = 0xb8; d[0] = 0x01;
    eg_weight w = {.fmt = EG_W_FP8, .rows = 2, .cols = 130, .data = d, .scale = s};
    CHECK(eg_weight_get(&w, 0, 0) == ldexpf(1, -9) * 0.5f);
    CHECK(eg_weight_get(&w, 0, 5) == 0.5f);
    CHECK(eg_weight_get(&w, 0, 129) == 2.0f * 4.0f);
    CHECK(eg_weight_get(&w, 1, 0) == -0.5f);
}

static void test_linear_formats(void) {
    rs = eg_test_seed();
    eg_config c = small_cfg();
    c.hidden = 96; /* cols multiple of 32 for INT4 */
    eg_backend *b = mk_backend(&c, 16);
    if (!b) return;
    eg_wfmt fmts[] = {EG_W_F32, EG_W_BF16, EG_W_INT4, EG_W_FP8};
    for (int f = 0; f < 4; f++) {
        int T = 5, rows = 37, cols = 96;
        owned_w w = make_w(fmts[f], rows, cols, 0.3f);
        float *x = malloc(4 * (size_t)(T * cols)), *y = malloc(4 * (size_t)(T * rows));
        double *ref = malloc(8 * (size_t)(T * rows));
        for (int i = 0; i < T * cols; i++) x[i] = nrand();
        for (int t = 0; t < T; t++)
            for (int r = 0; r < rows; r++) {
                double s = 0;
                for (int k = 0; k < cols; k++) s += (double)x[t * cols + k] * eg_weight_get(&w.w, r, k);
                ref[t * rows + r] = s;
            }
        eg_error err = {0};
        CHECK_OK(b->ops->linear(b, x, T, &w.w, y, &err), &err);
        double e = relerr(y, ref, T * rows);
        CHECKF(e < 1e-6, "format %d: rel err %.3e", f, e);
        free(x); free(y); free(ref); free_w(&w);
    }
    eg_backend_free(b);
}

static void test_rmsnorm_swiglu(void) {
    rs = eg_test_seed() + 1;
    eg_config c = small_cfg();
    eg_backend *b = mk_backend(&c, 8);
    if (!b) return;
    int T = 4, H = c.hidden, I = c.inter;
    owned_w nw = make_w(EG_W_BF16, 1, H, 1.0f), g = make_w(EG_W_BF16, I, H, 0.2f), u = make_w(EG_W_BF16, I, H, 0.2f),
            d = make_w(EG_W_BF16, H, I, 0.2f);
    float x[4 * 48], y[4 * 48];
    double ref[4 * 48];
    for (int i = 0; i < T * H; i++) x[i] = nrand() * 3;
    eg_error err = {0};
    CHECK_OK(b->ops->rmsnorm(b, x, &nw.w, T, H, 1e-6f, y, &err), &err);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)x[t * H + i] * x[t * H + i];
        for (int i = 0; i < H; i++) ref[t * H + i] = x[t * H + i] / sqrt(ss / H + 1e-6) * eg_weight_get(&nw.w, 0, i);
    }
    CHECKF(relerr(y, ref, T * H) < 1e-6, "rmsnorm rel err %.3e", relerr(y, ref, T * H));
    CHECK_OK(b->ops->swiglu_mlp(b, x, T, &g.w, &u.w, &d.w, y, 0, &err), &err);
    for (int t = 0; t < T; t++) {
        double act[40];
        for (int i = 0; i < I; i++) {
            double gg = 0, uu = 0;
            for (int k = 0; k < H; k++) {
                gg += (double)x[t * H + k] * eg_weight_get(&g.w, i, k);
                uu += (double)x[t * H + k] * eg_weight_get(&u.w, i, k);
            }
            act[i] = gg / (1 + exp(-gg)) * uu;
        }
        for (int h = 0; h < H; h++) {
            double s = 0;
            for (int i = 0; i < I; i++) s += act[i] * eg_weight_get(&d.w, h, i);
            ref[t * H + h] = s;
        }
    }
    CHECKF(relerr(y, ref, T * H) < 1e-5, "swiglu rel err %.3e", relerr(y, ref, T * H));
    free_w(&nw); free_w(&g); free_w(&u); free_w(&d);
    eg_backend_free(b);
}

/* The premise of splitting the shared expert / dense MLP over an EP group (issue 17):
 * the layer's owner computes the rows of every rank's tokens (accumulate 0, another batch
 * composition and row order) and each token's owner adds the returned row into its y. That
 * must give the bits of the unsplit accumulate-1 call, or a split run would not write the
 * unsplit run's samples. */
static void test_swiglu_split_exact(void) {
    rs = eg_test_seed() + 7;
    eg_config c = small_cfg();
    eg_backend *b = mk_backend(&c, 8);
    if (!b) return;
    enum { T = 8 };
    int H = c.hidden, I = c.inter;
    owned_w g = make_w(EG_W_BF16, I, H, 0.2f), u = make_w(EG_W_BF16, I, H, 0.2f), d = make_w(EG_W_BF16, H, I, 0.2f);
    float *x = malloc(sizeof(float) * T * H), *y0 = malloc(sizeof(float) * T * H), *ref = malloc(sizeof(float) * T * H),
          *got = malloc(sizeof(float) * T * H), *xs = malloc(sizeof(float) * T * H), *tmp = malloc(sizeof(float) * T * H);
    /* y0: two routed contributions r1 + r2 added in k order, as the moe op leaves y */
    float *r1 = malloc(sizeof(float) * T * H), *r2 = malloc(sizeof(float) * T * H);
    for (int i = 0; i < T * H; i++) x[i] = nrand() * 3, r1[i] = nrand(), r2[i] = nrand(), y0[i] = r1[i], y0[i] += r2[i];
    eg_error err = {0};
    memcpy(ref, y0, sizeof(float) * T * H);
    CHECK_OK(b->ops->swiglu_mlp(b, x, T, &g.w, &u.w, &d.w, ref, 1, &err), &err);
    /* two "ranks": rank 0 holds rows {5,1,7}, rank 1 {0,2,3,4,6}; the owner sees them in
     * the order rank 1's then rank 0's (another batch than the unsplit call) */
    const int order[T] = {0, 2, 3, 4, 6, 5, 1, 7};
    for (int k = 0; k < T; k++) memcpy(xs + (size_t)k * H, x + (size_t)order[k] * H, sizeof(float) * H);
    CHECK_OK(b->ops->swiglu_mlp(b, xs, 5, &g.w, &u.w, &d.w, tmp, 0, &err), &err);
    CHECK_OK(b->ops->swiglu_mlp(b, xs + (size_t)5 * H, 3, &g.w, &u.w, &d.w, tmp + (size_t)5 * H, 0, &err), &err);
    memcpy(got, y0, sizeof(float) * T * H);
    for (int k = 0; k < T; k++)
        for (int h = 0; h < H; h++) got[(size_t)order[k] * H + h] += tmp[(size_t)k * H + h];
    int diff = 0;
    for (int i = 0; i < T * H; i++) diff += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
    CHECKF(diff == 0, "split shared expert: %d of %d elements differ from the unsplit call", diff, T * H);
    /* the check sees the order: the shared row added before the routed ones (shared + r1,
     * then + r2) must change some bits, or this test could not catch a misordered owner */
    int moved = 0;
    for (int k = 0; k < T; k++)
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)order[k] * H + h;
            float w = tmp[(size_t)k * H + h] + r1[i];
            w += r2[i];
            moved += memcmp(&w, &ref[i], sizeof(float)) != 0;
        }
    CHECKF(moved > 0, "adding the shared row first changed no bits (%d elements): the test cannot see the order", T * H);
    /* a split of the weights that is exact too: gate/up by their output rows (I/2 per
     * rank, each act element is its own dot product), the act rows gathered whole, down by
     * its output rows (H/2 per rank, each over the whole act); then added after the routed
     * rows. Each rank then holds and reads half the MLP. */
    float *gi = malloc(sizeof(float) * T * I), *ui = malloc(sizeof(float) * T * I), *act = malloc(sizeof(float) * T * I),
          *part = malloc(sizeof(float) * T * H);
    for (int e = 0; e < 2; e++) {
        int64_t i0 = (int64_t)I * e / 2, i1 = (int64_t)I * (e + 1) / 2;
        eg_weight gs = g.w, us = u.w;
        gs.rows = us.rows = i1 - i0;
        gs.data = (const uint16_t *)g.w.data + i0 * H;
        us.data = (const uint16_t *)u.w.data + i0 * H;
        CHECK_OK(b->ops->linear(b, x, T, &gs, gi, &err), &err);
        CHECK_OK(b->ops->linear(b, x, T, &us, ui, &err), &err);
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < i1 - i0; i++) {
                float gv = gi[t * (i1 - i0) + i];
                act[(int64_t)t * I + i0 + i] = gv / (1.0f + expf(-gv)) * ui[t * (i1 - i0) + i];
            }
    }
    memcpy(got, y0, sizeof(float) * T * H);
    for (int e = 0; e < 2; e++) {
        int64_t h0 = (int64_t)H * e / 2, h1 = (int64_t)H * (e + 1) / 2;
        eg_weight ds = d.w;
        ds.rows = h1 - h0;
        ds.data = (const uint16_t *)d.w.data + h0 * I;
        CHECK_OK(b->ops->linear(b, act, T, &ds, part, &err), &err);
        for (int t = 0; t < T; t++)
            for (int64_t h = 0; h < h1 - h0; h++) got[(int64_t)t * H + h0 + h] += part[t * (h1 - h0) + h];
    }
    diff = 0;
    for (int i = 0; i < T * H; i++) diff += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
    CHECKF(diff == 0, "row-split shared expert: %d of %d elements differ from the unsplit call", diff, T * H);
    free(gi); free(ui); free(act); free(part);
    free(x); free(y0); free(r1); free(r2); free(ref); free(got); free(xs); free(tmp);
    free_w(&g); free_w(&u); free_w(&d);
    eg_backend_free(b);
}

/* Expanded-form MLA for token t, head h, from the BF16 cache contents. */
static void mla_expanded(const eg_config *c, const eg_mla_args *a, const uint16_t *cache, int t, int h, double *out) {
    int C = c->kv_lora_rank, DN = c->qk_nope, DR = c->qk_rope, DV = c->v_head, NH = c->n_heads, W = C + DR;
    const float *q = a->q + ((int64_t)t * NH + h) * (DN + DR);
    double qpe[16];
    for (int i = 0; i < DR / 2; i++) {
        double ang = a->pos[t] * (double)a->rope_inv_freq[i];
        double cs = cos(ang) * a->rope_attn_factor, sn = sin(ang) * a->rope_attn_factor;
        qpe[2 * i] = q[DN + 2 * i] * cs - q[DN + 2 * i + 1] * sn;
        qpe[2 * i + 1] = q[DN + 2 * i] * sn + q[DN + 2 * i + 1] * cs;
    }
    int n = a->pos[t] + 1;
    double *sc = malloc(sizeof(double) * (size_t)n), mx = -1e300, sum = 0;
    for (int j = 0; j < n; j++) {
        int blk = a->block_table[a->slot[t] * a->max_blocks + j / a->block_size];
        const uint16_t *row = cache + ((int64_t)blk * a->block_size + j % a->block_size) * W;
        double s = 0;
        for (int d = 0; d < DN; d++) {
            double k = 0;
            for (int cc = 0; cc < C; cc++) k += eg_weight_get(a->kv_b, h * (DN + DV) + d, cc) * eg_bf16_to_f32(row[cc]);
            s += q[d] * k;
        }
        for (int d = 0; d < DR; d++) s += qpe[d] * eg_bf16_to_f32(row[C + d]);
        sc[j] = s * a->softmax_scale;
        if (sc[j] > mx) mx = sc[j];
    }
    for (int j = 0; j < n; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
    for (int d = 0; d < DV; d++) out[d] = 0;
    for (int j = 0; j < n; j++) {
        int blk = a->block_table[a->slot[t] * a->max_blocks + j / a->block_size];
        const uint16_t *row = cache + ((int64_t)blk * a->block_size + j % a->block_size) * W;
        for (int d = 0; d < DV; d++) {
            double v = 0;
            for (int cc = 0; cc < C; cc++) v += eg_weight_get(a->kv_b, h * (DN + DV) + DN + d, cc) * eg_bf16_to_f32(row[cc]);
            out[d] += sc[j] / sum * v;
        }
    }
    free(sc);
}

static void test_mla_paged(void) {
    rs = eg_test_seed() + 2;
    eg_config c = small_cfg();
    int C = c.kv_lora_rank, DN = c.qk_nope, DR = c.qk_rope, DV = c.v_head, NH = c.n_heads, W = C + DR;
    eg_backend *b = mk_backend(&c, 32);
    if (!b) return;
    eg_error err = {0};
    eg_kv_cache *kv = NULL;
    CHECK_OK(eg_kv_create(b, 1, W, 4, 16, 3, 40, &kv, &err), &err);
    if (!kv) { eg_backend_free(b); return; }
    /* shuffle the free list so blocks are not contiguous */
    for (int i = 15; i > 0; i--) {
        int j = (int)(urand() * (i + 1));
        int32_t t = kv->free_list[i]; kv->free_list[i] = kv->free_list[j]; kv->free_list[j] = t;
    }
    owned_w kvb = make_w(EG_W_BF16, NH * (DN + DV), C, 0.3f), nw = make_w(EG_W_BF16, 1, C, 1.0f);
    float inv[3] = {1.0f, 0.1f, 0.01f};
    /* two steps: a 9-token prefill of slot 1 and 5 tokens of slot 2; then slot 1 decode
     * + 3 more of slot 2, so attention spans earlier steps and block boundaries. */
    int steps = 2, Ts[2] = {14, 4};
    int32_t slots[2][14], poss[2][14];
    for (int t = 0; t < 9; t++) { slots[0][t] = 1; poss[0][t] = t; }
    for (int t = 0; t < 5; t++) { slots[0][9 + t] = 2; poss[0][9 + t] = t; }
    slots[1][0] = 1; poss[1][0] = 9;
    for (int t = 0; t < 3; t++) { slots[1][1 + t] = 2; poss[1][1 + t] = 5 + t; }
    CHECK_OK(eg_kv_reserve(kv, 1, 10, &err), &err);
    CHECK_OK(eg_kv_reserve(kv, 2, 8, &err), &err);
    for (int s = 0; s < steps; s++) {
        int T = Ts[s];
        float *q = malloc(4 * (size_t)(T * NH * (DN + DR))), *kvin = malloc(4 * (size_t)(T * W));
        float *out = malloc(4 * (size_t)(T * NH * DV));
        for (int i = 0; i < T * NH * (DN + DR); i++) q[i] = nrand();
        for (int i = 0; i < T * W; i++) kvin[i] = nrand();
        eg_mla_args a = {.T = T, .pos = poss[s], .slot = slots[s], .block_table = kv->table, .max_blocks = kv->max_blocks,
                         .block_size = 4, .max_pos = 10, .q = q, .kv = kvin, .kv_a_norm = &nw.w, .kv_b = &kvb.w,
                         .cache = kv->layers[0], .rope_inv_freq = inv, .rope_attn_factor = 1.3f,
                         .softmax_scale = 0.25f, .eps = 1e-6f, .h0 = 0, .h1 = NH, .out = out};
        CHECK_OK(b->ops->mla_attention(b, &a, &err), &err);
        /* cache rows hold the BF16 normalised latent and rotated k_pe */
        for (int t = 0; t < T; t++) {
            int blk = kv->table[slots[s][t] * kv->max_blocks + poss[s][t] / 4];
            const uint16_t *row = kv->layers[0].data + ((int64_t)blk * 4 + poss[s][t] % 4) * W;
            double ss = 0;
            for (int i = 0; i < C; i++) ss += (double)kvin[t * W + i] * kvin[t * W + i];
            for (int i = 0; i < C; i++) {
                float want = eg_bf16_round((float)(kvin[t * W + i] / sqrt(ss / C + 1e-6) * eg_weight_get(&nw.w, 0, i)));
                CHECKF(fabsf(eg_bf16_to_f32(row[i]) - want) <= 1e-6f * fabsf(want) + 1e-30f || row[i] == eg_f32_to_bf16(want),
                       "latent t=%d i=%d", t, i);
            }
        }
        double *ref = malloc(8 * (size_t)(T * NH * DV));
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) mla_expanded(&c, &a, kv->layers[0].data, t, h, ref + ((int64_t)t * NH + h) * DV);
        double e = relerr(out, ref, T * NH * DV);
        CHECKF(e < 1e-5, "step %d: absorbed vs expanded rel err %.3e", s, e);
        free(q); free(kvin); free(out); free(ref);
    }
    eg_kv_free(kv);
    free_w(&kvb); free_w(&nw);
    eg_backend_free(b);
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_router_moe(void) {
    rs = eg_test_seed() + 3;
    eg_config c = small_cfg();
    eg_backend *b = mk_backend(&c, 8);
    if (!b) return;
    int T = 6, H = c.hidden, E = c.n_experts, K = c.topk, F = c.moe_inter, G = c.n_group, per = E / G;
    owned_w gate = make_w(EG_W_F32, E, H, 0.3f), bias = make_w(EG_W_F32, 1, E, 0.2f);
    owned_w ex[8][3];
    eg_expert_w experts[8];
    for (int e = 0; e < E; e++) {
        ex[e][0] = make_w(EG_W_BF16, F, H, 0.2f); ex[e][1] = make_w(EG_W_BF16, F, H, 0.2f);
        ex[e][2] = make_w(EG_W_BF16, H, F, 0.2f);
        experts[e].gate = ex[e][0].w; experts[e].up = ex[e][1].w; experts[e].down = ex[e][2].w;
    }
    float x[6 * 48], wts[6 * 3], y[6 * 48];
    int32_t ids[6 * 3];
    for (int i = 0; i < T * H; i++) x[i] = nrand();
    eg_error err = {0};
    eg_router_args r = {.T = T, .x = x, .gate = &gate.w, .bias = &bias.w, .n_group = G, .topk_group = c.topk_group,
                        .topk = K, .norm_topk = 1, .routed_scale = c.routed_scale, .ids = ids, .weights = wts};
    CHECK_OK(b->ops->router(b, &r, &err), &err);
    for (int t = 0; t < T; t++) {
        double sc[8], bi[8], gs[4], tmp[8];
        for (int e = 0; e < E; e++) {
            double l = 0;
            for (int k = 0; k < H; k++) l += (double)x[t * H + k] * eg_weight_get(&gate.w, e, k);
            sc[e] = 1 / (1 + exp(-l));
            bi[e] = sc[e] + eg_weight_get(&bias.w, 0, e);
        }
        for (int g = 0; g < G; g++) {
            memcpy(tmp, bi + g * per, sizeof(double) * (size_t)per);
            qsort(tmp, (size_t)per, sizeof(double), cmp_desc);
            gs[g] = tmp[0] + tmp[1];
        }
        memcpy(tmp, gs, sizeof(double) * (size_t)G);
        qsort(tmp, (size_t)G, sizeof(double), cmp_desc);
        double gcut = tmp[c.topk_group - 1];
        double cand[8];
        int nc = 0;
        for (int e = 0; e < E; e++) if (gs[e / per] >= gcut) cand[nc++] = bi[e];
        qsort(cand, (size_t)nc, sizeof(double), cmp_desc);
        double cut = cand[K - 1], sum = 0;
        int chosen = 0;
        for (int e = 0; e < E; e++) if (gs[e / per] >= gcut && bi[e] >= cut) { chosen++; sum += sc[e]; }
        CHECK(chosen == K);
        for (int k = 0; k < K; k++) {
            int e = ids[t * K + k];
            CHECKF(e >= 0 && e < E && gs[e / per] >= gcut && bi[e] >= cut, "token %d: expert %d not in the reference top-k", t, e);
            if (e >= 0 && e < E)
                CHECKF(fabs(wts[t * K + k] - sc[e] / sum * c.routed_scale) < 1e-5, "token %d weight", t);
        }
    }
    /* MoE: y = sum_k w_k * expert(x), experts [2, 7) only */
    memset(y, 0, sizeof y);
    eg_moe_args m = {.T = T, .x = x, .ids = ids, .weights = wts, .topk = K, .experts = experts, .e0 = 2, .e1 = 7, .y = y};
    CHECK_OK(b->ops->moe(b, &m, &err), &err);
    double ref[6 * 48] = {0};
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = ids[t * K + k];
            if (e < 2 || e >= 7) continue;
            double act[16];
            for (int f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int i = 0; i < H; i++) {
                    g += (double)x[t * H + i] * eg_weight_get(&experts[e].gate, f, i);
                    u += (double)x[t * H + i] * eg_weight_get(&experts[e].up, f, i);
                }
                act[f] = g / (1 + exp(-g)) * u;
            }
            for (int h = 0; h < H; h++) {
                double s = 0;
                for (int f = 0; f < F; f++) s += act[f] * eg_weight_get(&experts[e].down, h, f);
                ref[t * H + h] += wts[t * K + k] * s;
            }
        }
    CHECKF(relerr(y, ref, T * H) < 1e-5, "moe rel err %.3e", relerr(y, ref, T * H));
    for (int e = 0; e < E; e++) for (int i = 0; i < 3; i++) free_w(&ex[e][i]);
    free_w(&gate); free_w(&bias);
    eg_backend_free(b);
}

/* The routed combine's order (engine/backend.h eg_moe_order): each token's contributions
 * are added in ascending expert id, whatever the order of its router slots, so a sum over
 * experts [0, x) continued over [x, E) on the same y is bit-identical to the full call
 * (what a split of one layer's experts over two pipeline stages relies on). The pairs'
 * contributions come from the op itself at top-1 (0 + w * expert(x), the bits it adds
 * inside the full call: what the expert-parallel exchange relies on); the ids are given
 * in descending and mixed order, and the weights span six decades so the order shows. */
static void test_moe_order_fold(void) {
    rs = eg_test_seed() + 11;
    eg_config c = small_cfg();
    enum { T = 6, K = 3, E = 8 };
    c.topk = K;
    eg_backend *b = mk_backend(&c, T * K);
    if (!b) return;
    int H = c.hidden, F = c.moe_inter;
    owned_w ex[E][3];
    eg_expert_w experts[E];
    for (int e = 0; e < E; e++) {
        ex[e][0] = make_w(EG_W_BF16, F, H, 0.2f); ex[e][1] = make_w(EG_W_BF16, F, H, 0.2f);
        ex[e][2] = make_w(EG_W_BF16, H, F, 0.2f);
        experts[e].gate = ex[e][0].w; experts[e].up = ex[e][1].w; experts[e].down = ex[e][2].w;
    }
    static const int32_t ids[T * K] = {7, 4, 1, 6, 0, 3, 5, 2, 7, 1, 0, 6, 3, 7, 5, 2, 6, 4};
    float x[T * 48], wts[T * K], y[T * 48], got[T * 48], want[T * 48], kord[T * 48], pair[T * K * 48], w1[T * K];
    int32_t id1[T * K];
    static const float mag[3] = {1e3f, 1.0f, 1e-3f};
    for (int i = 0; i < T * H; i++) x[i] = nrand();
    for (int i = 0; i < T * K; i++) wts[i] = mag[(i + i / K) % 3] * (float)(0.5 + urand());
    eg_error err = {0};
    memset(y, 0, sizeof y);
    eg_moe_args m = {.T = T, .x = x, .ids = ids, .weights = wts, .topk = K, .experts = experts, .e0 = 0, .e1 = E, .y = y};
    CHECK_OK(b->ops->moe(b, &m, &err), &err);
    /* each pair alone: its row, its expert, its weight, top-1 */
    float xs[T * K * 48];
    for (int i = 0; i < T * K; i++) {
        memcpy(xs + (size_t)i * H, x + (size_t)(i / K) * H, sizeof(float) * (size_t)H);
        id1[i] = ids[i];
        w1[i] = wts[i];
    }
    memset(pair, 0, sizeof pair);
    eg_moe_args p1 = {.T = T * K, .x = xs, .ids = id1, .weights = w1, .topk = 1, .experts = experts, .e0 = 0, .e1 = E,
                      .y = pair};
    CHECK_OK(b->ops->moe(b, &p1, &err), &err);
    memset(want, 0, sizeof want);
    memset(kord, 0, sizeof kord);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) /* ascending expert id, by hand */
            for (int k = 0; k < K; k++)
                if (ids[t * K + k] == e)
                    for (int h = 0; h < H; h++) want[t * H + h] += pair[(size_t)(t * K + k) * H + h];
        for (int k = 0; k < K; k++)
            for (int h = 0; h < H; h++) kord[t * H + h] += pair[(size_t)(t * K + k) * H + h];
    }
    int diff = 0, seen = 0;
    for (int i = 0; i < T * H; i++) {
        diff += memcmp(&y[i], &want[i], sizeof(float)) != 0;
        seen += memcmp(&kord[i], &want[i], sizeof(float)) != 0;
    }
    CHECKF(diff == 0, "moe combine: %d of %d elements differ from the ascending-id fold", diff, T * H);
    CHECKF(seen > 0, "the k-order fold equals the ascending one everywhere: the test cannot see the order");
    for (int cut = 1; cut < E; cut++) {
        memset(got, 0, sizeof got);
        eg_moe_args lo = m, hi = m;
        lo.e1 = cut; lo.y = got;
        hi.e0 = cut; hi.y = got;
        CHECK_OK(b->ops->moe(b, &lo, &err), &err);
        CHECK_OK(b->ops->moe(b, &hi, &err), &err);
        diff = 0;
        for (int i = 0; i < T * H; i++) diff += memcmp(&got[i], &y[i], sizeof(float)) != 0;
        CHECKF(diff == 0, "experts [0,%d) then [%d,%d): %d of %d elements differ from the full call", cut, cut, E, diff,
               T * H);
    }
    for (int e = 0; e < E; e++) for (int i = 0; i < 3; i++) free_w(&ex[e][i]);
    eg_backend_free(b);
}

static void test_sampler(void) {
    rs = eg_test_seed() + 4;
    int V = 6;
    float logits[6] = {1.0f, 3.0f, 3.0f, 0.5f, -1.0f, 2.0f};
    double scratch_d[12]; /* eg_sample_scratch_floats(6) floats, aligned as a double */
    float *scratch = (float *)scratch_d;
    CHECK(eg_sample_scratch_floats(V) * sizeof(float) <= sizeof scratch_d);
    eg_sample_params greedy = {0, 1, 0}, k1 = {1.0f, 1.0f, 1}, p0 = {1.0f, 1e-6f, 0}, t1 = {1.0f, 1.0f, 0};
    uint64_t st = eg_rng_seed(7, 1);
    CHECK(eg_sample_row(logits, V, &greedy, &st, scratch, NULL) == 1); /* lowest id among equal maxima */
    CHECK(eg_sample_row(logits, V, &k1, &st, scratch, NULL) == 1);
    CHECK(eg_sample_row(logits, V, &p0, &st, scratch, NULL) == 1);
    /* same state, same draw */
    uint64_t a = eg_rng_seed(1, 2), b2 = eg_rng_seed(1, 2), c3 = eg_rng_seed(1, 3);
    CHECK(a == b2 && a != c3);
    for (int i = 0; i < 50; i++)
        CHECK(eg_sample_row(logits, V, &t1, &a, scratch, NULL) == eg_sample_row(logits, V, &t1, &b2, scratch, NULL));
    /* frequencies follow the softmax at temperature 1 */
    int counts[6] = {0}, N = 40000;
    uint64_t s = eg_rng_seed(99, 0);
    for (int i = 0; i < N; i++) counts[eg_sample_row(logits, V, &t1, &s, scratch, NULL)]++;
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(logits[i]);
    for (int i = 0; i < V; i++) {
        double p = exp(logits[i]) / z, f = (double)counts[i] / N;
        CHECKF(fabs(f - p) < 4 * sqrt(p * (1 - p) / N) + 1e-3, "id %d: freq %.4f vs p %.4f", i, f, p);
    }
    /* top-k 2 never yields anything but the two best (ids 1, 2) */
    eg_sample_params k2 = {1.0f, 1.0f, 2};
    for (int i = 0; i < 200; i++) {
        int tok = eg_sample_row(logits, V, &k2, &s, scratch, NULL);
        CHECK(tok == 1 || tok == 2);
    }
    /* probabilities: ids 1,2 .384 each, id 5 .141, id 0 .052, id 3 .032, id 4 .007.
     * top-p 0.8: the mass reaches .8 at id 5 (.909), so {1,2,5}; top-p 0.92 adds id 0. */
    eg_sample_params pp = {1.0f, 0.8f, 0}, pq = {1.0f, 0.92f, 0};
    int seen[6] = {0}, seen2[6] = {0};
    for (int i = 0; i < 4000; i++) seen[eg_sample_row(logits, V, &pp, &s, scratch, NULL)] = 1;
    CHECK(seen[1] && seen[2] && seen[5] && !seen[0] && !seen[3] && !seen[4]);
    for (int i = 0; i < 4000; i++) seen2[eg_sample_row(logits, V, &pq, &s, scratch, NULL)] = 1;
    CHECK(seen2[1] && seen2[2] && seen2[5] && seen2[0] && !seen2[3] && !seen2[4]);
}

/* The sampler's definition, written as it was before the radix sort: qsort with the
 * comparison, each exp recomputed where it is used. The fast code must give the same
 * order, the same tokens and RNG states, and the same probabilities bit for bit. */
typedef struct { float v; int32_t id; } ref_cand;
static int ref_cmp(const void *a, const void *b) {
    const ref_cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}
static int ref_prefix(ref_cand *c, const float *logits, int V, const eg_sample_params *p, double *mx, double *total) {
    for (int i = 0; i < V; i++) { c[i].v = logits[i]; c[i].id = i; }
    qsort(c, (size_t)V, sizeof *c, ref_cmp);
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    *mx = c[0].v;
    *total = 0;
    for (int i = 0; i < n; i++) *total += exp(((double)c[i].v - *mx) / p->temperature);
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double cum = 0, lim = p->top_p * *total;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += exp(((double)c[i].v - *mx) / p->temperature);
            if (cum >= lim) { keep = i + 1; break; }
        }
        n = keep;
        *total = cum;
    }
    return n;
}
static int32_t ref_sample_row(ref_cand *c, const float *logits, int V, const eg_sample_params *p, uint64_t *rng) {
    double mx, total;
    int n = ref_prefix(c, logits, V, p, &mx, &total);
    double u = eg_rng_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp(((double)c[i].v - mx) / p->temperature);
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

static void test_sampler_exact(void) {
    rs = eg_test_seed() + 41;
    const int Vs[] = {1, 2, 7, 300, 5000, 12000};
    const float temps[] = {0.3f, 1.0f, 1.7f};
    const float tops[] = {0.0f, 0.3f, 0.9f, 0.999f, 1.0f};
    int nV = (int)(sizeof Vs / sizeof *Vs), orders = 0, rows = 0, same_tok = 0, same_rng = 0, same_p = 0, total_rows = 0;
    for (int vi = 0; vi < nV; vi++) {
        int V = Vs[vi];
        float *lg = malloc(sizeof(float) * (size_t)V), *scratch = malloc(sizeof(float) * eg_sample_scratch_floats(V));
        ref_cand *rc = malloc(sizeof *rc * (size_t)V);
        eg_sample_cand *oc = malloc(sizeof *oc * (size_t)V), *ot = malloc(sizeof *ot * (size_t)V);
        double *pr = malloc(sizeof(double) * (size_t)V), *pf = malloc(sizeof(double) * (size_t)V);
        eg_spec_scratch *sc = NULL;
        eg_error err = {0};
        CHECK_OK(eg_spec_scratch_create(V, &sc, &err), &err);
        if (!lg || !scratch || !rc || !oc || !ot || !pr || !pf || !sc) { CHECK(0); goto next; }
        for (int mode = 0; mode < 4; mode++) {
            /* 0: spread normals; 1: a few values (ties everywhere); 2: zeros of both signs,
             * -inf (masked ids), huge and tiny magnitudes; 3: a peaked row */
            for (int i = 0; i < V; i++) {
                double u = urand();
                float x = mode == 0 ? 4 * nrand()
                        : mode == 1 ? (float)((int)(u * 5) - 2)
                        : mode == 2 ? (u < 0.2 ? 0.0f : u < 0.4 ? -0.0f : u < 0.5 ? -INFINITY : u < 0.6 ? 1e-40f
                                       : u < 0.7 ? -3e38f : (float)(nrand() * 1e3))
                                    : (i == V / 3 ? 30.0f : nrand());
                lg[i] = x;
            }
            /* the order */
            for (int i = 0; i < V; i++) { rc[i].v = lg[i]; rc[i].id = i; }
            qsort(rc, (size_t)V, sizeof *rc, ref_cmp);
            eg_sample_order(lg, V, oc, ot);
            int same = 1;
            for (int i = 0; i < V; i++)
                same &= rc[i].id == oc[i].id && memcmp(&rc[i].v, &oc[i].v, sizeof(float)) == 0;
            CHECKF(same, "V %d mode %d: the radix order differs from qsort's", V, mode);
            orders += same;
            for (int ti = 0; ti < 3; ti++)
                for (int pi = 0; pi < 5; pi++) {
                    const int ks[] = {0, 1, 3, V - 1, V, V + 5};
                    for (int ki = 0; ki < 6; ki++) {
                        eg_sample_params sp = {temps[ti], tops[pi], ks[ki]};
                        uint64_t a = eg_rng_seed(5, (uint64_t)(rows * 7 + 1)), b = a;
                        int tok_same = 1;
                        for (int d = 0; d < 3; d++)
                            tok_same &= eg_sample_row(lg, V, &sp, &a, scratch, NULL) == ref_sample_row(rc, lg, V, &sp, &b);
                        same_tok += tok_same;
                        same_rng += a == b;
                        /* the distribution: eg_spec_probs against the definition's numbers */
                        double mx, total;
                        int n = ref_prefix(rc, lg, V, &sp, &mx, &total);
                        for (int i = 0; i < V; i++) pr[i] = 0;
                        for (int i = 0; i < n; i++) pr[rc[i].id] = exp(((double)rc[i].v - mx) / sp.temperature) / total;
                        eg_spec_probs(sc, lg, V, &sp, pf);
                        /* one token's probability (a backend's token_probs on the host):
                         * the top candidate, the last kept, the first cut, any */
                        const int32_t xs[4] = {rc[0].id, rc[n - 1].id, rc[n < V ? n : V - 1].id,
                                               (int32_t)(urand() * V) % V};
                        int one_same = 1;
                        for (int xi = 0; xi < 4; xi++) {
                            double px = eg_sample_prob(lg, V, &sp, xs[xi], scratch);
                            one_same &= memcmp(&px, &pr[xs[xi]], sizeof px) == 0;
                        }
                        same_p += memcmp(pr, pf, sizeof(double) * (size_t)V) == 0 && one_same;
                        rows++;
                        total_rows++;
                    }
                }
        }
    next:
        free(lg); free(scratch); free(rc); free(oc); free(ot); free(pr); free(pf);
        eg_spec_scratch_free(sc);
    }
    CHECKF(orders == 4 * nV, "%d of %d orders equal qsort's", orders, 4 * nV);
    CHECKF(same_tok == total_rows && same_rng == total_rows && same_p == total_rows,
           "of %d parameter sets: %d give the same tokens, %d the same RNG state, %d the same probabilities", total_rows,
           same_tok, same_rng, same_p);
    /* what it buys, at Kimi's vocabulary (a measurement, not a check) */
    int V = 163840;
    float *lg = malloc(sizeof(float) * (size_t)V), *scratch = malloc(sizeof(float) * eg_sample_scratch_floats(V));
    ref_cand *rc = malloc(sizeof *rc * (size_t)V);
    if (lg && scratch && rc) {
        for (int i = 0; i < V; i++) lg[i] = 4 * nrand();
        eg_sample_params sp = {1.0f, 0.95f, 0};
        uint64_t a = 1, b = 1;
        double t0 = eg_now();
        for (int i = 0; i < 5; i++) eg_sample_row(lg, V, &sp, &a, scratch, NULL);
        double t1 = eg_now();
        for (int i = 0; i < 5; i++) ref_sample_row(rc, lg, V, &sp, &b);
        double t2 = eg_now();
        CHECK(a == b);
        fprintf(stderr, "  sampler at V %d (temperature 1, top-p 0.95): %.2f ms a row, the qsort definition %.2f ms\n", V,
                (t1 - t0) / 5 * 1e3, (t2 - t1) / 5 * 1e3);
    }
    free(lg); free(scratch); free(rc);
}

static void test_kv_manager(void) {
    eg_config c = small_cfg();
    eg_backend *b = mk_backend(&c, 4);
    if (!b) return;
    eg_error err = {0};
    eg_kv_cache *kv = NULL;
    CHECK_OK(eg_kv_create(b, 2, 8, 4, 5, 2, 16, &kv, &err), &err);
    if (!kv) { eg_backend_free(b); return; }
    CHECK_OK(eg_kv_reserve(kv, 0, 9, &err), &err); /* 3 blocks */
    CHECK(kv->n_free == 2);
    CHECK(eg_kv_reserve(kv, 1, 12, &err) == EG_ERR_NOMEM); /* needs 3, 2 free */
    CHECK(kv->n_free == 2 && kv->n_mapped[1] == 0);
    CHECK(eg_kv_reserve(kv, 1, 17, &err) == EG_ERR_INVALID); /* beyond max_seq_len */
    CHECK_OK(eg_kv_reserve(kv, 1, 8, &err), &err);
    CHECK(kv->n_free == 0);
    eg_kv_release(kv, 0);
    CHECK(kv->n_free == 3 && kv->table[0] == -1);
    /* all mapped blocks distinct */
    CHECK(kv->table[kv->max_blocks] != kv->table[kv->max_blocks + 1]);
    eg_kv_free(kv);
    eg_kv_free(NULL);
    eg_backend_free(b);
    eg_backend_free(NULL);
}

static void test_plan_split(void) {
    eg_error err = {0};
    double c1[5] = {1, 1, 1, 1, 10};
    int ends[8];
    CHECK_OK(eg_plan_split(c1, 5, 0, 0, 2, ends, &err), &err);
    CHECK(ends[0] == 4 && ends[1] == 5);
    /* the head and tail weights count: a heavy embedding pushes layers off stage 0 */
    double c2[6] = {1, 1, 1, 1, 1, 1};
    CHECK_OK(eg_plan_split(c2, 6, 3, 0, 3, ends, &err), &err);
    /* optimum: the largest stage costs 4 (stage 0 takes one layer: 3 + 1) */
    double worst = 0;
    for (int k = 0, b = 0; k < 3; b = ends[k++]) {
        double cst = (k == 0 ? 3 : 0) + (ends[k] - b);
        if (cst > worst) worst = cst;
    }
    CHECK(ends[0] == 1 && ends[2] == 6 && worst == 4);
    CHECK_OK(eg_plan_split(c2, 6, 0, 0, 6, ends, &err), &err);
    for (int i = 0; i < 6; i++) CHECK(ends[i] == i + 1);
    CHECK(eg_plan_split(c2, 6, 0, 0, 7, ends, &err) == EG_ERR_INVALID);
    /* memory: capacity = free / (layers * bytes per token and layer) */
    eg_config c = small_cfg();
    int64_t lb[2] = {1000, 1000};
    int e2[2] = {1, 2};
    eg_stage_mem sm[2];
    eg_plan_memory(&c, lb, 500, 300, e2, 2, 10000, 0.5, 100, sm);
    CHECK(sm[0].weight_bytes == 1500 && sm[1].weight_bytes == 1300);
    CHECK(sm[0].free_bytes == 3400 && sm[0].kv_tokens == 3400 / (2 * (c.kv_lora_rank + c.qk_rope)));
}

/* All valid splits of n stages (ends ascending, a cut c in 1..E-1 inside a MoE layer that
 * is not the last, the stage after a cut reaching past the next layer's start), the best X
 * by eg_plan_split_kv_tokens: the brute force the greedy search must match. */
static int64_t brute_kv(const eg_plan_layer_parts *p, int L, const int64_t *budget, int n, int64_t kvb, int64_t extra,
                        int k, int *ends, int *cuts, int allow_cuts) {
    if (k == n - 1) {
        ends[k] = L;
        cuts[k] = 0;
        if (k && ends[k] <= ends[k - 1]) return -1;
        return eg_plan_split_kv_tokens(p, L, budget, n, kvb, extra, ends, cuts);
    }
    int64_t best = -1;
    int lo = k ? ends[k - 1] + 1 : 1;
    for (int e = lo; e < L; e++)
        for (int c = 0; c < (allow_cuts && p[e - 1].n_experts > 0 && e < L ? p[e - 1].n_experts : 1); c++) {
            ends[k] = e;
            cuts[k] = c;
            int64_t x = brute_kv(p, L, budget, n, kvb, extra, k + 1, ends, cuts, allow_cuts);
            if (x > best) best = x;
        }
    return best;
}

/* The same search with FFNs on owners, by its definition over units: the units in layer
 * order (attention; each routed expert; the shared expert or an owned dense MLP), stage k
 * the units [b_k, b_k+1), a stage beginning at an attention unit, or at expert c >= 1 of a
 * MoE layer l < L - 1 and then holding layer l + 1's attention; each rank r holds the
 * common units and those it owns, the stage's bytes its heaviest rank's. */
enum { BU_MAX = 64 };
typedef struct { int layer, kind, owner; int64_t bytes; } bu_unit;
static int bu_units(const eg_plan_layer_parts *p, int L, bu_unit *u, int *attn_at) {
    int U = 0;
    for (int l = 0; l < L; l++) {
        attn_at[l] = U;
        u[U++] = (bu_unit){l, 0, 0, p[l].attn};
        for (int e = 0; e < p[l].n_experts; e++) u[U++] = (bu_unit){l, 1 + e, 0, p[l].expert};
        if (p[l].n_experts || p[l].shared) u[U++] = (bu_unit){l, -1, p[l].owner, p[l].shared};
    }
    attn_at[L] = U;
    return U;
}
static int64_t bu_stage_x(const bu_unit *u, int b0, int b1, int64_t budget, int64_t kvb, int64_t extra, int R) {
    int64_t most = -1, attn = 0;
    for (int r = 1; r <= (R ? R : 1); r++) {
        int64_t w = 0;
        for (int j = b0; j < b1; j++)
            if (!u[j].owner || u[j].owner == r) w += u[j].bytes;
        if (w > most) most = w;
    }
    for (int j = b0; j < b1; j++) attn += u[j].kind == 0;
    int64_t per = kvb * attn + extra;
    return budget < most ? -1 : per > 0 ? (budget - most) / per : INT64_MAX;
}
static int64_t brute_units(const bu_unit *u, int U, const int *attn_at, int L, const int64_t *budget, int n,
                           int64_t kvb, int64_t extra, int R, int k, int b0) {
    if (k == n - 1) return bu_stage_x(u, b0, U, budget[k], kvb, extra, R);
    int64_t best = -1;
    for (int b = b0 + 1; b < U; b++) {
        int at_attn = u[b].kind == 0, at_cut = u[b].kind >= 2 && u[b].layer + 1 < L;
        if (!at_attn && !at_cut) continue;
        if (u[b0].kind != 0 && b0 && b <= attn_at[u[b0].layer + 1]) continue; /* after a cut: past l + 1's attention */
        int64_t x = bu_stage_x(u, b0, b, budget[k], kvb, 0, R);
        if (x < 0) continue;
        int64_t y = brute_units(u, U, attn_at, L, budget, n, kvb, extra, R, k + 1, b);
        if (y < 0) continue;
        if (y < x) x = y;
        if (x > best) best = x;
    }
    return best;
}

/* A random small split case: L layers (layer 0 dense at 70%), E experts each, budgets for
 * n stages, bytes per token and the last stage's extra. owners 0: shared experts only,
 * every rank's; owners R > 0: each layer's FFN (a dense layer's MLP too) on a rank of R,
 * or on every rank. */
static void random_split_case(eg_plan_layer_parts *p, int L, int E, int owners, int64_t *budget, int n, int64_t *kvb,
                              int64_t *extra) {
    int64_t wsum = 0;
    for (int l = 0; l < L; l++) {
        int moe = l > 0 || urand() < 0.3;
        p[l] = (eg_plan_layer_parts){.n_experts = moe ? E : 0};
        p[l].attn = 50 + (int64_t)(urand() * 100);
        p[l].expert = moe ? 20 + (int64_t)(urand() * 60) : 0;
        if (owners) {
            p[l].owner = (int)(urand() * (owners + 1));
            p[l].shared = moe || p[l].owner ? 10 + (int64_t)(urand() * 150) : 0;
        } else {
            p[l].shared = moe ? (int64_t)(urand() * 40) : 0;
        }
        wsum += p[l].attn + (int64_t)p[l].n_experts * p[l].expert + p[l].shared;
    }
    for (int k = 0; k < n; k++) budget[k] = wsum / n + (int64_t)(urand() * (double)wsum);
    *kvb = 1 + (int64_t)(urand() * 5);
    *extra = urand() < 0.5 ? 0 : (int64_t)(urand() * 4);
}

static void test_plan_split_kv(void) {
    rs = eg_test_seed() + 13;
    eg_error err = {0};
    /* small random cases against the brute force, with and without cuts */
    for (int trial = 0; trial < 300; trial++) {
        int L = 2 + (int)(urand() * 4), n = 1 + (int)(urand() * (L < 4 ? L : 4)), E = 2 + (int)(urand() * 4);
        eg_plan_layer_parts p[6];
        int64_t budget[4], kvb, extra;
        random_split_case(p, L, E, 0, budget, n, &kvb, &extra);
        for (int cutsok = 0; cutsok < 2; cutsok++) {
            int ends[4], cuts[4], be[4], bc[4];
            int64_t want = brute_kv(p, L, budget, n, kvb, extra, 0, be, bc, cutsok), got = -1;
            eg_status st = eg_plan_split_kv(p, L, budget, n, kvb, extra, cutsok, ends, cuts, &got, &err);
            if (want < 0) {
                CHECKF(st != EG_OK, "trial %d (cuts %d): no split fits, yet the search found X %lld", trial, cutsok,
                       (long long)got);
                continue;
            }
            CHECKF(st == EG_OK, "trial %d (cuts %d): %s (the brute force fits X %lld)", trial, cutsok, err.msg,
                   (long long)want);
            if (st) continue;
            int64_t again = eg_plan_split_kv_tokens(p, L, budget, n, kvb, extra, ends, cuts);
            CHECKF(got == want && again == got, "trial %d (L %d, n %d, E %d, cuts %d): X %lld, its split holds %lld, "
                   "the brute force %lld", trial, L, n, E, cutsok, (long long)got, (long long)again, (long long)want);
            for (int k = 0; k < n; k++) CHECK(cutsok || cuts[k] == 0);
        }
    }
    /* FFNs on owners (a group's dense split): small random cases against the definition */
    int owned_trials = 0;
    for (int trial = 0; trial < 300; trial++) {
        int L = 2 + (int)(urand() * 4), n = 1 + (int)(urand() * (L < 3 ? L : 3)), E = 2 + (int)(urand() * 3);
        int R = 1 + (int)(urand() * 3);
        eg_plan_layer_parts p[6];
        int64_t budget[3], kvb, extra;
        random_split_case(p, L, E, R, budget, n, &kvb, &extra);
        bu_unit u[BU_MAX];
        int attn_at[7], maxo = 0;
        for (int l = 0; l < L; l++) maxo = p[l].owner > maxo ? p[l].owner : maxo;
        int U = bu_units(p, L, u, attn_at);
        int64_t want = brute_units(u, U, attn_at, L, budget, n, kvb, extra, maxo, 0, 0), got = -1;
        int ends[3], cuts[3];
        eg_status st = eg_plan_split_kv(p, L, budget, n, kvb, extra, 1, ends, cuts, &got, &err);
        if (want < 0) {
            CHECKF(st != EG_OK, "owned trial %d: no split fits, yet the search found X %lld", trial, (long long)got);
            continue;
        }
        owned_trials++;
        CHECKF(st == EG_OK, "owned trial %d: %s (the definition fits X %lld)", trial, err.msg, (long long)want);
        if (st) continue;
        int64_t again = eg_plan_split_kv_tokens(p, L, budget, n, kvb, extra, ends, cuts);
        CHECKF(got == want && again == got, "owned trial %d (L %d, n %d, E %d, R %d): X %lld, its split holds %lld, "
               "by definition %lld", trial, L, n, E, R, (long long)got, (long long)again, (long long)want);
    }
    CHECKF(owned_trials > 100, "only %d owned trials fit", owned_trials);
    /* Kimi-K2.5's shape in 2 stages of a 4-rank group with its FFNs split (rank l mod 4 + 1
       holds layer l's; layer 0's dense MLP, 0.79 GB, sits on rank 0 of stage 0): the search
       equals every split by hand, and beats by > 3% the split that balances the average
       rank (a quarter of each FFN everywhere), counted as the heaviest rank holds it */
    {
        enum { QL = 61, QE = 4 };
        eg_plan_layer_parts q[QL], avg[QL];
        int64_t qb[2] = {86000000000ll - 587202560ll, 86000000000ll - 587202560ll - 2 * 7168};
        for (int l = 0; l < QL; l++) {
            int moe = l >= 1;
            int64_t ffn = moe ? 88080384 : 792723456;
            q[l] = (eg_plan_layer_parts){.attn = 202000000, .n_experts = moe ? 384 : 0,
                                         .expert = moe ? (22118400 + 2764800 + QE - 1) / QE : 0, .shared = ffn,
                                         .owner = l % QE + 1};
            avg[l] = q[l];
            avg[l].owner = 0;
            avg[l].shared = (ffn + QE - 1) / QE;
        }
        int qe[2], qc[2], ae[2], ac[2];
        int64_t xq = 0, xa = 0, kvb = 1152, best = -1;
        CHECK_OK(eg_plan_split_kv(q, QL, qb, 2, kvb, 0, 1, qe, qc, &xq, &err), &err);
        CHECK_OK(eg_plan_split_kv(avg, QL, qb, 2, kvb, 0, 1, ae, ac, &xa, &err), &err);
        int64_t xa_held = eg_plan_split_kv_tokens(q, QL, qb, 2, kvb, 0, ae, ac);
        for (int e = 1; e < QL; e++)
            for (int c = 0; c < (q[e - 1].n_experts ? q[e - 1].n_experts : 1); c++) {
                int te[2] = {e, QL}, tc[2] = {c, 0};
                int64_t x = eg_plan_split_kv_tokens(q, QL, qb, 2, kvb, 0, te, tc);
                if (x > best) best = x;
            }
        printf("    kimi-k2.5 shape, 2 stages x ep 4 with the FFNs on owners: %lld tokens per rank (--stages %d:%d); "
               "the average-rank split %d:%d holds %lld; the best by hand %lld\n", (long long)xq, qe[0], qc[0], ae[0],
               ac[0], (long long)xa_held, (long long)best);
        CHECKF(xq == best, "the search holds %lld, a split by hand %lld", (long long)xq, (long long)best);
        CHECKF((double)xq > 1.03 * (double)xa_held, "owners gain too little: %lld against %lld", (long long)xq,
               (long long)xa_held);
    }
    /* Kimi-K2.5's shape on 8 stages of 86 GB each (head / tail taken off stages 0 and 7):
       with cuts the pool comes within 3% of the free bytes pooled (what is left is the
       granularity of a layer's attention with its cache, ~2.7 GB, which a stage takes whole)
       and 20% above whole layers */
    enum { KL = 61, KN = 8 };
    eg_plan_layer_parts kp[KL];
    int64_t kb[KN], total = 0;
    for (int l = 0; l < KL; l++) {
        int moe = l >= 1;
        kp[l] = (eg_plan_layer_parts){.attn = 380000000, .n_experts = moe ? 384 : 0, .expert = moe ? 22118400 : 0,
                                      .shared = moe ? 88080384 : 0};
        if (!moe) kp[l].attn += 396361728; /* the dense MLP */
        total += kp[l].attn + (int64_t)kp[l].n_experts * kp[l].expert + kp[l].shared;
    }
    for (int k = 0; k < KN; k++) kb[k] = 86000000000ll - (k == 0 ? 2348810240ll : 0) - (k == KN - 1 ? 2348810240ll : 0);
    int ends[KN], cuts[KN];
    int64_t xc = 0, xw = 0, kvb = 1152, sum = 0;
    CHECK_OK(eg_plan_split_kv(kp, KL, kb, KN, kvb, 0, 1, ends, cuts, &xc, &err), &err);
    CHECK_OK(eg_plan_split_kv(kp, KL, kb, KN, kvb, 0, 0, ends, cuts, &xw, &err), &err);
    for (int k = 0; k < KN; k++) sum += kb[k];
    double pooled = (double)(sum - total) / (double)(kvb * KL);
    printf("    kimi-k2.5 shape, 8 x 86 GB: %lld tokens with cuts, %lld with whole layers, %.0f pooled\n", (long long)xc,
           (long long)xw, pooled);
    CHECKF(xc >= 0.97 * pooled && xc > 1.2 * (double)xw, "with cuts %lld, whole layers %lld, pooled %.0f", (long long)xc,
           (long long)xw, pooled);
    /* nothing fits: refused with a reason */
    int64_t tiny[KN] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(eg_plan_split_kv(kp, KL, tiny, KN, kvb, 0, 1, ends, cuts, &xc, &err) == EG_ERR_NOMEM &&
          strstr(err.msg, "do not fit"));
}

static const eg_test tests[] = {
    {"plan_split", test_plan_split},
    {"plan_split_kv", test_plan_split_kv},
    {"int4_layout", test_int4_layout},     {"fp8_block", test_fp8_block},
    {"linear_formats", test_linear_formats}, {"rmsnorm_swiglu", test_rmsnorm_swiglu},
    {"swiglu_split_exact", test_swiglu_split_exact},
    {"mla_paged", test_mla_paged},         {"router_moe", test_router_moe},
    {"moe_order_fold", test_moe_order_fold},
    {"sampler", test_sampler},             {"sampler_exact", test_sampler_exact},             {"kv_manager", test_kv_manager},
};
EG_TEST_MAIN("engine_ops", tests)
