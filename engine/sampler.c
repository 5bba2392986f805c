/* Host-side sampling shared by backends (see backend.h). Deterministic: the same
 * logits, parameters and RNG state give the same token; ties are broken by lower id. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t eg_rng_seed(uint64_t seed, uint64_t id) {
    uint64_t s = seed ^ 0x5851f42d4c957f2dull;
    uint64_t a = splitmix64(&s);
    s = a ^ (id * 0xd1b54a32d192ed03ull);
    return splitmix64(&s);
}

double eg_rng_uniform(uint64_t *state) { return (double)(splitmix64(state) >> 11) * 0x1.0p-53; }

size_t eg_sample_scratch_floats(int V) { return 4 * (size_t)(V > 0 ? V : 1); }

/* Ascending in the sampler's order: a higher logit gives a smaller key. The orderable
 * bits of a float (sign flipped for positives, all bits for negatives) grow with it;
 * -0 is taken as +0 so the two tie, as they compare equal. */
static uint32_t order_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* Stable passes from the id order: equal keys stay in ascending id, so the result is the
 * comparison order (higher logit, then lower id) exactly. An even number of passes ends
 * in out. */
void eg_sample_order(const float *logits, int V, eg_sample_cand *out, eg_sample_cand *tmp) {
    size_t hist[4][256];
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < V; i++) {
        uint32_t k = order_key(logits[i]);
        for (int p = 0; p < 4; p++) hist[p][(k >> (8 * p)) & 255]++;
    }
    for (int p = 0; p < 4; p++) {
        size_t at = 0;
        for (int d = 0; d < 256; d++) {
            size_t n = hist[p][d];
            hist[p][d] = at;
            at += n;
        }
    }
    for (int i = 0; i < V; i++) { /* pass 0 reads the logits in id order */
        eg_sample_cand c = {logits[i], i};
        tmp[hist[0][order_key(c.v) & 255]++] = c;
    }
    eg_sample_cand *src = tmp, *dst = out;
    for (int p = 1; p < 4; p++) {
        for (int i = 0; i < V; i++) dst[hist[p][(order_key(src[i].v) >> (8 * p)) & 255]++] = src[i];
        eg_sample_cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != out) memcpy(out, src, sizeof *out * (size_t)V); /* not reached: 4 passes end in out */
}

/* Greedy: the lowest id among equal maxima (a NaN is never taken past id 0). */
static int32_t argmax(const float *logits, int V) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int eg_sample_kept(const float *logits, int V, const eg_sample_params *p, float *scratch, double *total) {
    /* scratch: the sorted candidates [V], then the sort's second buffer [V], which holds
     * the kept candidates' exps (V doubles) once the sort is done */
    eg_sample_cand *c = (eg_sample_cand *)scratch;
    eg_sample_order(logits, V, c, c + V);
    double *ex = (double *)(c + V);
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    /* softmax over the kept candidates at temperature, in double for a stable sum */
    double mx = c[0].v, sum = 0;
    for (int i = 0; i < n; i++) {
        ex[i] = exp(((double)c[i].v - mx) / p->temperature);
        sum += ex[i];
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double cum = 0, lim = p->top_p * sum;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += ex[i];
            if (cum >= lim) { keep = i + 1; break; }
        }
        n = keep;
        sum = cum;
    }
    *total = sum;
    return n;
}

int32_t eg_sample_row(const float *logits, int V, const eg_sample_params *p, uint64_t *rng, float *scratch,
                      int32_t *iscratch) {
    (void)iscratch;
    if (!(p->temperature > 0.0f)) return argmax(logits, V);
    double total;
    int n = eg_sample_kept(logits, V, p, scratch, &total);
    const eg_sample_cand *c = (const eg_sample_cand *)scratch;
    const double *ex = (const double *)(c + V);
    double u = eg_rng_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += ex[i];
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

double eg_sample_prob(const float *logits, int V, const eg_sample_params *p, int32_t x, float *scratch) {
    if (!(p->temperature > 0.0f)) return x == argmax(logits, V) ? 1.0 : 0.0;
    double total;
    int n = eg_sample_kept(logits, V, p, scratch, &total);
    const eg_sample_cand *c = (const eg_sample_cand *)scratch;
    const double *ex = (const double *)(c + V);
    for (int i = 0; i < n; i++)
        if (c[i].id == x) return ex[i] / total;
    return 0.0;
}
