/* Host-side sampling shared by backends (see backend.h). Deterministic: the same
 * logits, parameters and RNG state give the same token; ties are broken by lower id. */
#include <math.h>
#include <stdlib.h>

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

/* Sort key: higher logit first, then lower id. */
typedef struct { float v; int32_t id; } cand;
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int32_t eg_sample_row(const float *logits, int V, const eg_sample_params *p, uint64_t *rng, float *scratch,
                      int32_t *iscratch) {
    (void)iscratch;
    if (!(p->temperature > 0.0f)) {
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    /* scratch holds V cand structs worth of floats: 2*V floats */
    cand *c = (cand *)scratch;
    for (int i = 0; i < V; i++) { c[i].v = logits[i]; c[i].id = i; }
    qsort(c, (size_t)V, sizeof *c, cand_cmp);
    int n = V;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    /* softmax over the kept candidates at temperature, in double for a stable sum */
    double mx = c[0].v, total = 0;
    for (int i = 0; i < n; i++) total += exp(((double)c[i].v - mx) / p->temperature);
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double cum = 0, lim = p->top_p * total;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += exp(((double)c[i].v - mx) / p->temperature);
            if (cum >= lim) { keep = i + 1; break; }
        }
        n = keep;
        total = cum;
    }
    double u = eg_rng_uniform(rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp(((double)c[i].v - mx) / p->temperature);
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}
