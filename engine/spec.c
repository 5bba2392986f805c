/* The speculative-sampling acceptance rule; see spec.h. */
#include <math.h>
#include <stdlib.h>

#include "engine/spec.h"

eg_status eg_spec_scratch_create(int V, eg_spec_scratch **out, eg_error *err) {
    *out = NULL;
    eg_spec_scratch *s = eg_calloc(1, sizeof *s, err);
    if (!s) return EG_ERR_NOMEM;
    s->V = V;
    s->p = eg_malloc(sizeof(double) * (size_t)V, err);
    s->q = eg_malloc(sizeof(double) * (size_t)V, err);
    s->sort = eg_malloc(sizeof(float) * eg_sample_scratch_floats(V), err);
    s->ids = eg_malloc(sizeof(int32_t) * (size_t)V, err);
    if (!s->p || !s->q || !s->sort || !s->ids) { eg_spec_scratch_free(s); return EG_ERR_NOMEM; }
    *out = s;
    return EG_OK;
}

void eg_spec_scratch_free(eg_spec_scratch *s) {
    if (!s) return;
    free(s->p); free(s->q); free(s->sort); free(s->ids);
    free(s);
}

static int32_t argmax(const float *l, int V) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

void eg_spec_probs(eg_spec_scratch *sc, const float *logits, int V, const eg_sample_params *sp, double *probs) {
    for (int i = 0; i < V; i++) probs[i] = 0;
    if (!(sp->temperature > 0.0f)) { probs[argmax(logits, V)] = 1; return; }
    /* eg_sample_row's numbers: its order, each kept candidate's exp once, the same sums */
    double total;
    int n = eg_sample_kept(logits, V, sp, sc->sort, &total);
    const eg_sample_cand *c = (const eg_sample_cand *)sc->sort;
    const double *ex = (const double *)(c + V);
    for (int i = 0; i < n; i++) probs[c[i].id] = ex[i] / total;
}

/* The one draw rule, dense and sparse: the entries with weight > 0 (w [n]; ids [n] their
 * ids, NULL = the index is the id), u in [0, total) picks the first whose running sum
 * exceeds it; the last positive one when rounding runs past the end; id 0 when none is
 * positive. */
static int32_t draw_weighted(const double *w, const int32_t *ids, int n, uint64_t *rng) {
    double total = 0;
    int last = -1;
    for (int j = 0; j < n; j++)
        if (w[j] > 0) { total += w[j]; last = j; }
    if (last < 0) return 0;
    double u = eg_rng_uniform(rng) * total, acc = 0;
    int pick = last;
    for (int j = 0; j < n; j++) {
        if (!(w[j] > 0)) continue;
        acc += w[j];
        if (u < acc) { pick = j; break; }
    }
    return ids ? ids[pick] : pick;
}

int32_t eg_spec_draw(const double *probs, int V, uint64_t *rng) { return draw_weighted(probs, NULL, V, rng); }
int32_t eg_spec_draw_sparse(const double *w, const int32_t *ids, int n, uint64_t *rng) {
    return draw_weighted(w, ids, n, rng);
}

eg_status eg_spec_q_alloc(eg_spec_q *q, int k, int cap, eg_error *err) {
    const size_t ids = (size_t)k * (size_t)cap;
    *q = (eg_spec_q){cap, eg_calloc((size_t)k, sizeof(int32_t), err), eg_calloc(ids, sizeof(int32_t), err),
                     eg_calloc(ids, sizeof(double), err)};
    if (q->n && q->id && q->p) return EG_OK;
    eg_spec_q_free(q);
    return EG_ERR_NOMEM;
}

void eg_spec_q_free(eg_spec_q *q) {
    free(q->n);
    free(q->id);
    free(q->p);
    *q = (eg_spec_q){0};
}

double eg_spec_q_at(const eg_spec_q *q, int i, int32_t x) {
    const int32_t *id = q->id + (int64_t)i * q->cap;
    int lo = 0, hi = q->n[i];
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (id[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo < q->n[i] && id[lo] == x ? q->p[(int64_t)i * q->cap + lo] : 0.0;
}

/* The proposal draft i is tested against: q, or one-hot at the draft (NULL) where q is
 * NULL or gives the draft no probability, which a draft drawn from q cannot have: a
 * drafter whose logits row was not finite draws without it (id 0, q row empty). Such a
 * draft is a deterministic proposal, for which the one-hot rule (accept with p(x), else
 * the residual p - δx) is the exact one; testing it against q(x) = 0 would accept it
 * whenever p(x) > 0. *qx: the draft's probability under the proposal returned. */
static const eg_spec_q *proposal(const eg_spec_q *q, int i, int32_t x, double *qx) {
    double v = q ? eg_spec_q_at(q, i, x) : 1.0;
    if (!(v > 0)) {
        *qx = 1.0;
        return NULL;
    }
    *qx = v;
    return q;
}

int eg_spec_no_q(const eg_spec_q *q, int i, int32_t x) {
    double v;
    return q && !proposal(q, i, x, &v);
}

void eg_spec_verify_argmax(const int32_t *argmax, const int32_t *draft, int k, eg_spec_rule rule, int *n_accepted,
                           int32_t *next) {
    for (int i = 0; i < k; i++) {
        if (rule == EG_SPEC_BROKEN_ACCEPT || argmax[i] == draft[i]) continue;
        *n_accepted = i;
        *next = argmax[i];
        return;
    }
    *n_accepted = k;
    *next = argmax[k];
}

/* A rejected draft x at a row: a draw from norm(max(0, p - q)) (q: the proposer's
 * distribution at that row, row qi of q, NULL = one-hot at x); p from the row unless sc->p
 * holds it already (have_p). q's ascending ids are merged into the walk over v, so its
 * absent ids give exactly the dense zeros. */
static int32_t residual(eg_spec_scratch *sc, const float *row, int V, const eg_sample_params *sp, int32_t x,
                        const eg_spec_q *q, int qi, int have_p, uint64_t *rng) {
    if (!have_p) eg_spec_probs(sc, row, V, sp, sc->p);
    const int32_t *id = q ? q->id + (int64_t)qi * q->cap : NULL;
    const double *qp = q ? q->p + (int64_t)qi * q->cap : NULL;
    const int nq = q ? q->n[qi] : 0;
    double mass = 0;
    for (int v = 0, j = 0; v < V; v++) {
        double qv;
        if (!q) qv = v == x ? 1.0 : 0.0;
        else {
            while (j < nq && id[j] < v) j++;
            qv = j < nq && id[j] == v ? qp[j] : 0.0;
        }
        double r = sc->p[v] - qv;
        sc->q[v] = r > 0 ? r : 0;
        mass += sc->q[v];
    }
    return eg_spec_draw(mass > 0 ? sc->q : sc->p, V, rng);
}

void eg_spec_verify(eg_spec_scratch *sc, const float *logits, int V, const eg_sample_params *sp, const int32_t *draft,
                    const eg_spec_q *q, const double *pd, int k, eg_spec_rule rule, uint64_t *rng, int *n_accepted,
                    int32_t *next) {
    const int greedy = !(sp->temperature > 0.0f);
    for (int i = 0; i < k; i++) {
        const float *row = logits + (int64_t)i * V;
        int32_t x = draft[i];
        if (rule == EG_SPEC_BROKEN_ACCEPT) continue;
        if (greedy) {
            int32_t a = argmax(row, V);
            if (a == x) continue;
            *n_accepted = i;
            *next = a;
            return;
        }
        /* p(x) from the backend where it gave one (no sort of the row here); the whole
         * distribution only where the residual needs it */
        double px;
        int have_p = 0;
        if (pd && !isnan(pd[i])) {
            px = pd[i];
        } else {
            eg_spec_probs(sc, row, V, sp, sc->p);
            px = sc->p[x];
            have_p = 1;
        }
        double qx;
        const eg_spec_q *qi = proposal(q, i, x, &qx);
        if (eg_rng_uniform(rng) * qx < px) continue; /* accept with prob min(1, p/q) */
        *n_accepted = i;
        *next = residual(sc, row, V, sp, x, qi, i, have_p, rng);
        return;
    }
    /* every draft accepted: the bonus token from p at the last row, as the sampler draws */
    *n_accepted = k;
    *next = eg_sample_row(logits + (int64_t)k * V, V, sp, rng, sc->sort, NULL);
}

int eg_spec_accept(const double *pd, const eg_spec_q *q, const int32_t *draft, int k, eg_spec_rule rule,
                   uint64_t *rng, int *rejected) {
    for (int i = 0; i < k; i++) {
        if (rule == EG_SPEC_BROKEN_ACCEPT) continue;
        double qx;
        (void)proposal(q, i, draft[i], &qx);
        if (eg_rng_uniform(rng) * qx < pd[i]) continue;
        *rejected = 1;
        return i;
    }
    *rejected = 0;
    return k;
}

int32_t eg_spec_finish(eg_spec_scratch *sc, const float *row, int V, const eg_sample_params *sp, const int32_t *draft,
                       const eg_spec_q *q, int n, int rejected, uint64_t *rng) {
    double qx;
    if (rejected) return residual(sc, row, V, sp, draft[n], proposal(q, n, draft[n], &qx), n, 0, rng);
    return eg_sample_row(row, V, sp, rng, sc->sort, NULL);
}

/* A kept candidate, ordered by id. */
typedef struct kept_pair {
    double p;
    int32_t id;
} kept_pair;

static int kept_pair_cmp(const void *a, const void *b) {
    int32_t x = ((const kept_pair *)a)->id, y = ((const kept_pair *)b)->id;
    return (x > y) - (x < y);
}

int eg_spec_sort_kept(eg_spec_scratch *sc, const int32_t *ids, const double *probs, int n) {
    kept_pair *kp = (kept_pair *)sc->sort; /* n <= V pairs: 4 V floats, within the sort's scratch */
    int m = 0;
    for (int j = 0; j < n; j++)
        if (probs[j] > 0) kp[m++] = (kept_pair){probs[j], ids[j]};
    qsort(kp, (size_t)m, sizeof *kp, kept_pair_cmp);
    for (int j = 0; j < m; j++) {
        sc->ids[j] = kp[j].id;
        sc->p[j] = kp[j].p;
    }
    return m;
}

int32_t eg_spec_finish_kept(eg_spec_scratch *sc, const int32_t *ids, const double *probs, int n_kept,
                            const int32_t *draft, const eg_spec_q *q, int n, uint64_t *rng) {
    /* residual()'s numbers without its O(V) walks: outside the kept set p is 0, so
     * max(0, p - q) is 0 there and the dense sums add nothing; inside, the same terms in
     * the same (id) order */
    const int32_t x = draft[n];
    double qx;
    q = proposal(q, n, x, &qx);
    const int32_t *qid = q ? q->id + (int64_t)n * q->cap : NULL;
    const double *qp = q ? q->p + (int64_t)n * q->cap : NULL;
    const int nq = q ? q->n[n] : 0;
    const int m = eg_spec_sort_kept(sc, ids, probs, n_kept);
    const int32_t *id = sc->ids;
    double *w = sc->q, mass = 0;
    for (int j = 0, l = 0; j < m; j++) { /* both in id order: q merged in */
        double qv;
        if (!q) qv = id[j] == x ? 1.0 : 0.0;
        else {
            while (l < nq && qid[l] < id[j]) l++;
            qv = l < nq && qid[l] == id[j] ? qp[l] : 0.0;
        }
        double d = sc->p[j] - qv;
        w[j] = d > 0 ? d : 0;
        mass += w[j];
    }
    /* residual()'s fallback: p itself when the residual has no mass */
    return draw_weighted(mass > 0 ? w : sc->p, id, m, rng);
}
