/* drafter.h — a proposer of draft tokens for speculative decoding (engine.h, spec.h).
 *
 * The engine drives one drafter per engine (per EP rank): it keeps, per sequence slot,
 * the drafter's own state (for an EAGLE-3 drafter its small BF16 KV cache) in step with
 * the target's committed tokens. Per verify step of a slot the engine
 *   1. feeds the positions the target just committed (extend): for each position t, the
 *      target's aux rows at t and the token at t + 1 (EAGLE's shift: the drafter at t
 *      sees h_t and the embedding of x_{t+1}, and predicts x_{t+2});
 *   2. asks for k proposals after the last committed token (propose), each with the
 *      proposer's distribution over the TARGET vocabulary after the sampling parameters
 *      (temperature, top-k, top-p) were applied the way spec.h defines; greedy: one-hot
 *      at the proposer's argmax. A proposal may grow the drafter's state by k - 1
 *      speculative positions;
 *   3. after verification, drops everything past the committed length (truncate), then
 *      extends again with the target's rows of the accepted positions (the drafter's
 *      speculative positions were computed from its own features, not the target's).
 * Positions are 0-based and contiguous: extend's pos0 equals the slot's current length.
 * A slot is reset with truncate(slot, 0) when a new sequence takes it; a preempted
 * sequence that loses its cache is re-extended from its kept aux rows.
 *
 * Ownership: the caller creates a drafter (eg_drafter_eagle3_load or a test proposer)
 * and frees it with eg_drafter_free (NULL ok); the engine borrows it.
 * Thread safety: one thread drives a drafter (the engine's driving thread). */
#ifndef EG_DRAFTER_H
#define EG_DRAFTER_H

#include "engine/backend.h"
#include "engine/spec.h"

typedef struct eg_drafter eg_drafter;

typedef struct eg_drafter_info {
    const char *kind;       /* "eagle3", or a test proposer's name */
    int n_aux;              /* target aux layers the drafter reads (0: needs none) */
    const int *aux_layers;  /* [n_aux] target layer ids, eaglegen's convention (output of
                               decoder layer k, 0-based), ascending */
    int hidden;             /* target hidden size H of each aux row */
    int target_vocab;       /* V: proposals and q are over the target vocabulary */
    int q_cap;              /* the most ids one q row holds (the proposer's own vocabulary;
                               0 = target_vocab) */
    int n_slots;            /* slots the drafter holds state for */
    int max_seq_len;        /* positions per slot */
    int64_t state_bytes;    /* memory held for all slots (its caches), for the planner */
    int64_t cache_bytes_per_token; /* of its cache per position a slot holds (0: none) */
    int block_size;         /* positions per block of a paged cache (0: not paged) */
    int64_t pool_blocks;    /* blocks in that cache's pool */
    int64_t weight_bytes;   /* its weights as stored (the planner counts them once per
                               drafter; 0 = none of its own) */
} eg_drafter_info;

/* One slot's part of a batched extend (extend_many): the arguments of extend. */
typedef struct eg_draft_extend {
    int slot, pos0, n;
    const float *aux;           /* [n][n_aux][H] (NULL when n_aux == 0) */
    const int32_t *next_tokens; /* [n] */
} eg_draft_extend;

/* One slot's part of a batched propose (propose_many): the arguments of propose. */
typedef struct eg_draft_propose {
    int slot;
    const int32_t *seq; /* [n_seq] */
    int n_seq, k;
    const eg_sample_params *sp;
    uint64_t *rng;
    int32_t *draft; /* [k] */
    eg_spec_q *q;   /* k rows, or NULL */
} eg_draft_propose;

typedef struct eg_drafter_vtbl {
    /* Commit n positions pos0 .. pos0+n-1 of slot: aux [n][n_aux][H] the target's rows at
     * those positions (FP32; NULL when n_aux == 0), next_tokens [n] the token at each
     * position + 1. pos0 must equal the slot's length; afterwards it is pos0 + n. */
    eg_status (*extend)(eg_drafter *d, int slot, int pos0, int n, const float *aux, const int32_t *next_tokens,
                        eg_error *err);
    /* Propose k tokens to follow seq [n_seq] (the committed tokens, prompt included; the
     * slot's length is n_seq - 1: the last token is not yet committed by the target).
     * Writes draft [k] target ids and, when q != NULL, its rows 0..k-1: the proposer's
     * processed distribution of each (summing to 1; q(draft[i]) > 0 at row i; at most
     * info.q_cap ids a row, q->cap >= that). Random draws only from rng. */
    eg_status (*propose)(eg_drafter *d, int slot, const int32_t *seq, int n_seq, int k, const eg_sample_params *sp,
                         uint64_t *rng, int32_t *draft, eg_spec_q *q, eg_error *err);
    /* Forget positions >= len of slot (len <= its length). */
    void (*truncate)(eg_drafter *d, int slot, int len);
    void (*destroy)(eg_drafter *d);
    /* Optional (NULL: the engine calls extend / propose slot by slot). The same as the
     * per-slot calls in item order, for n items of distinct slots, in passes over all of
     * them: a drafter whose cost is reading its weights reads them once per pass instead
     * of once per slot (the EAGLE-3 drafter on a backend: one layer pass per draft
     * position for every slot's row). */
    eg_status (*extend_many)(eg_drafter *d, int n, const eg_draft_extend *items, eg_error *err);
    eg_status (*propose_many)(eg_drafter *d, int n, const eg_draft_propose *items, eg_error *err);
} eg_drafter_vtbl;

/* How a drafter's draws were reduced from their logits rows, so far (a drafter on a
 * backend counts them; others leave zeros): from the backend's kept set, by its argmax,
 * from the row taken to the host. Read on the driving thread. */
typedef struct eg_drafter_draws {
    int64_t kept, argmax, host_rows;
} eg_drafter_draws;

struct eg_drafter {
    const eg_drafter_vtbl *vt;
    eg_drafter_info info;
    eg_drafter_draws draws;
    void *impl;
};

static inline eg_status eg_drafter_extend(eg_drafter *d, int slot, int pos0, int n, const float *aux,
                                          const int32_t *next_tokens, eg_error *err) {
    return d->vt->extend(d, slot, pos0, n, aux, next_tokens, err);
}
static inline eg_status eg_drafter_propose(eg_drafter *d, int slot, const int32_t *seq, int n_seq, int k,
                                           const eg_sample_params *sp, uint64_t *rng, int32_t *draft, eg_spec_q *q,
                                           eg_error *err) {
    return d->vt->propose(d, slot, seq, n_seq, k, sp, rng, draft, q, err);
}
static inline void eg_drafter_truncate(eg_drafter *d, int slot, int len) { d->vt->truncate(d, slot, len); }
static inline eg_status eg_drafter_extend_many(eg_drafter *d, int n, const eg_draft_extend *it, eg_error *err) {
    if (d->vt->extend_many) return d->vt->extend_many(d, n, it, err);
    for (int i = 0; i < n; i++) {
        eg_status st = d->vt->extend(d, it[i].slot, it[i].pos0, it[i].n, it[i].aux, it[i].next_tokens, err);
        if (st) return st;
    }
    return EG_OK;
}
static inline eg_status eg_drafter_propose_many(eg_drafter *d, int n, const eg_draft_propose *it, eg_error *err) {
    if (d->vt->propose_many) return d->vt->propose_many(d, n, it, err);
    for (int i = 0; i < n; i++) {
        eg_status st = d->vt->propose(d, it[i].slot, it[i].seq, it[i].n_seq, it[i].k, it[i].sp, it[i].rng, it[i].draft,
                                      it[i].q, err);
        if (st) return st;
    }
    return EG_OK;
}
static inline void eg_drafter_free(eg_drafter *d) {
    if (d) d->vt->destroy(d);
}

#endif
