/* spec.h — the speculative-sampling acceptance rule (Leviathan et al. 2023, Chen et al.
 * 2023) over the target's sampling distribution, exactly as eg_sample_row samples.
 *
 * p = the target's distribution at a row after temperature, top-k and top-p (the same
 * candidate order and cut as eg_sample_row); q = the proposer's distribution of a
 * drafted token, processed with the same parameters. A draft x ~ q is accepted with
 * probability min(1, p(x)/q(x)); on the first rejection the token is drawn from
 * norm(max(0, p - q)); when every draft is accepted one more token is drawn from p at
 * the last row. The emitted tokens are then distributed exactly as sampling from p one
 * token at a time. Greedy (temperature 0): accept iff x is the target's argmax (lowest
 * id among ties), else emit that argmax: the very tokens of plain greedy decoding.
 * Ownership: eg_spec_scratch is owned by the caller (eg_spec_scratch_free, NULL ok).
 * Thread safety: a scratch is used by one thread at a time. */
#ifndef EG_SPEC_H
#define EG_SPEC_H

#include "engine/backend.h"

typedef enum eg_spec_rule {
    EG_SPEC_EXACT = 0,    /* the rule above */
    EG_SPEC_BROKEN_ACCEPT /* tests only: accept every draft (a deliberately wrong rule that
                             the distribution test must catch) */
} eg_spec_rule;

typedef struct eg_spec_scratch {
    int V;        /* target vocabulary */
    double *p;    /* [V] */
    double *q;    /* [V] */
    float *sort;  /* [eg_sample_scratch_floats(V)] eg_sample_row's scratch */
    int32_t *ids; /* [V] eg_spec_sort_kept's ids, ascending (their p in p) */
} eg_spec_scratch;

/* A proposer's distributions at a chain's k draft positions over the TARGET vocabulary,
 * sparse: row i holds n[i] target ids, ascending, with their probabilities; every other
 * id's q is 0. A row costs what the proposer keeps (its kept set, at most its own
 * vocabulary), not the target's V. The storage is the caller's. */
typedef struct eg_spec_q {
    int cap;      /* row stride: the most ids a row holds */
    int32_t *n;   /* [k] ids in row i */
    int32_t *id;  /* [k][cap] ascending target ids */
    double *p;    /* [k][cap] their probabilities */
} eg_spec_q;

/* k rows of cap ids each into q (owned by the caller: eg_spec_q_free, which takes an
 * unallocated or zeroed q too); on failure q is left zeroed. */
eg_status eg_spec_q_alloc(eg_spec_q *q, int k, int cap, eg_error *err);
void eg_spec_q_free(eg_spec_q *q);

/* q(x) at row i: its probability there, 0 when the row does not hold x. O(log n). */
double eg_spec_q_at(const eg_spec_q *q, int i, int32_t x);

eg_status eg_spec_scratch_create(int V, eg_spec_scratch **out, eg_error *err);
void eg_spec_scratch_free(eg_spec_scratch *s);

/* probs[0..V) = the distribution eg_sample_row samples from for these logits and
 * parameters (one-hot at the argmax when greedy). Uses sc->sort. */
void eg_spec_probs(eg_spec_scratch *sc, const float *logits, int V, const eg_sample_params *sp, double *probs);

/* Draw an id from a dense distribution (sum > 0) with one uniform from rng. */
int32_t eg_spec_draw(const double *probs, int V, uint64_t *rng);
/* The same draw over a sparse one: w [n] the weights of ids [n] (ascending), every other
 * id's 0: the id and RNG state eg_spec_draw gives on the dense array. */
int32_t eg_spec_draw_sparse(const double *w, const int32_t *ids, int n, uint64_t *rng);

/* eg_spec_verify's greedy rule from the rows' argmaxes alone ([k + 1], the lowest id
 * among equal maxima, e.g. a backend's greedy sample): the same n_accepted and next. */
void eg_spec_verify_argmax(const int32_t *argmax, const int32_t *draft, int k, eg_spec_rule rule, int *n_accepted,
                           int32_t *next);

/* One verify step of a sequence. logits: [k+1][V] target rows (row i follows the i-th
 * proposed position: row 0 predicts draft[0]); draft: [k] proposed target ids; q: the
 * proposer's distributions at the k positions (NULL = deterministic proposals, q one-hot
 * at the draft; so is a draft q gives no probability, eg_spec_no_q); pd: [k] p(draft[i]) at row i as a backend's
 * token_probs gave them (NaN = not given), or NULL: a row with one is not sorted here
 * unless its draft is rejected (the residual needs the whole p). Writes the accepted
 * drafts' count to *n_accepted and the token that follows them (correction or bonus)
 * to *next. rng advanced. */
void eg_spec_verify(eg_spec_scratch *sc, const float *logits, int V, const eg_sample_params *sp, const int32_t *draft,
                    const eg_spec_q *q, const double *pd, int k, eg_spec_rule rule, uint64_t *rng, int *n_accepted,
                    int32_t *next);

/* Draft x at position i has no probability under q (not NULL): a drafter whose logits
 * row was not finite drew it without them. Every rule here tests such a draft as a
 * deterministic proposal (one-hot at x), which is exact; the engine counts them
 * (eg_engine_stats.draft_no_q). */
int eg_spec_no_q(const eg_spec_q *q, int i, int32_t x);

/* eg_spec_verify in two halves, for a sampled chunk whose rows stay on the backend until
 * the rule knows which one it needs. eg_spec_accept: the acceptance tests alone from
 * pd[0..k) (every one a number: a backend's token_probs), the RNG advanced exactly as
 * eg_spec_verify advances it up to there; returns the drafts accepted, n, and sets
 * *rejected (draft n was rejected) or not (all k accepted). eg_spec_finish: then the
 * token eg_spec_verify gives from row n's logits [V] alone: the residual draw at a
 * rejection, else the bonus token. Together the same n_accepted, next and RNG state as
 * eg_spec_verify with those pd. */
int eg_spec_accept(const double *pd, const eg_spec_q *q, const int32_t *draft, int k, eg_spec_rule rule,
                   uint64_t *rng, int *rejected);
int32_t eg_spec_finish(eg_spec_scratch *sc, const float *row, int V, const eg_sample_params *sp, const int32_t *draft,
                       const eg_spec_q *q, int n, int rejected, uint64_t *rng);
/* A kept set (ids / probs [n], any order, distinct ids) in id order: its entries with
 * p > 0 into sc->ids and sc->p [m]; returns m. Their sums in this order are the dense
 * row's (every other id is 0). n must not exceed the scratch's V. Uses sc->sort. */
int eg_spec_sort_kept(eg_spec_scratch *sc, const int32_t *ids, const double *probs, int n);
/* eg_spec_finish's residual draw at a rejection (draft[n] rejected), from row n's kept
 * set instead of the row: ids / probs [n_kept] its candidates and their p (a backend's
 * kept_probs; any order, distinct ids), every other id's p being 0. With eg_spec_probs'
 * numbers for them, the same token and RNG state as eg_spec_finish (the sums run over
 * ascending ids, as the dense draw's); O(n_kept log n_kept), not O(V). n_kept must not
 * exceed what sc->sort holds (V). */
int32_t eg_spec_finish_kept(eg_spec_scratch *sc, const int32_t *ids, const double *probs, int n_kept,
                            const int32_t *draft, const eg_spec_q *q, int n, uint64_t *rng);

#endif
