/* drafter_replay.c — the replay proposer of drafter_replay.h. */
#include "engine/drafter_replay.h"

#include <stdlib.h>
#include <string.h>

typedef struct replay_ref {
    int32_t *tokens; /* [n] prompt + continuation */
    int n, n_prompt;
} replay_ref;

typedef struct replay {
    eg_drafter d;
    double rate;
    int V;
    replay_ref *refs;   /* [n_refs] */
    int n_refs, cap_refs;
    int *len;           /* [n_slots] positions committed per slot */
    int *ref_of;        /* [n_slots] reference the slot's sequence matched; -1 = not looked up */
    int64_t right, proposed;
} replay;

static int ref_matches(const replay_ref *r, const int32_t *seq, int n_seq) {
    return n_seq >= r->n_prompt && !memcmp(r->tokens, seq, sizeof(int32_t) * (size_t)r->n_prompt);
}

static eg_status rp_extend(eg_drafter *d, int slot, int pos0, int n, const float *aux, const int32_t *next,
                           eg_error *err) {
    (void)aux;
    (void)next;
    replay *p = d->impl;
    if (slot < 0 || slot >= d->info.n_slots || pos0 != p->len[slot] || n < 1 || pos0 + n > d->info.max_seq_len)
        return eg_fail(err, EG_ERR_INVALID, "replay proposer: extend of slot %d at %d by %d (it holds %d of %d)", slot,
                       pos0, n, slot >= 0 && slot < d->info.n_slots ? p->len[slot] : -1, d->info.max_seq_len);
    p->len[slot] += n;
    return EG_OK;
}

static eg_status rp_propose(eg_drafter *d, int slot, const int32_t *seq, int n_seq, int k, const eg_sample_params *sp,
                            uint64_t *rng, int32_t *draft, eg_spec_q *q, eg_error *err) {
    (void)sp;
    (void)rng;
    replay *p = d->impl;
    if (slot < 0 || slot >= d->info.n_slots || p->len[slot] != n_seq - 1 || k < 1)
        return eg_fail(err, EG_ERR_INVALID, "replay proposer: slot %d holds %d positions, asked for %d after %d tokens",
                       slot, slot >= 0 && slot < d->info.n_slots ? p->len[slot] : -1, k, n_seq);
    int r = p->ref_of[slot];
    if (r < 0 || !ref_matches(&p->refs[r], seq, n_seq)) {
        for (r = 0; r < p->n_refs && !ref_matches(&p->refs[r], seq, n_seq); r++) {}
        if (r == p->n_refs)
            return eg_fail(err, EG_ERR_INVALID, "replay proposer: slot %d holds a sequence (%d tokens) whose prompt "
                           "matches none of its %d references", slot, n_seq, p->n_refs);
        p->ref_of[slot] = r;
    }
    const replay_ref *ref = &p->refs[r];
    for (int i = 0; i < k; i++) {
        int at = n_seq + i;
        int32_t want = at < ref->n ? ref->tokens[at] : 0;
        uint64_t h = eg_rng_seed(0x7e91a7ull + (uint64_t)r, (uint64_t)at);
        int hit = at < ref->n && eg_rng_uniform(&h) < p->rate;
        draft[i] = hit ? want : (int32_t)((want + 1) % p->V);
        p->right += hit;
        p->proposed++;
        if (q) { /* one-hot: the replayed token */
            q->n[i] = 1;
            q->id[(int64_t)i * q->cap] = draft[i];
            q->p[(int64_t)i * q->cap] = 1.0;
        }
    }
    return EG_OK;
}

static void rp_truncate(eg_drafter *d, int slot, int len) {
    replay *p = d->impl;
    EG_ASSERT(slot >= 0 && slot < d->info.n_slots && len >= 0 && len <= p->len[slot]);
    p->len[slot] = len;
    if (len == 0) p->ref_of[slot] = -1; /* a new sequence may take the slot */
}

static void rp_destroy(eg_drafter *d) {
    replay *p = d->impl;
    for (int r = 0; r < p->n_refs; r++) free(p->refs[r].tokens);
    free(p->refs);
    free(p->len);
    free(p->ref_of);
    free(p);
}

static const eg_drafter_vtbl rp_vtbl = {rp_extend, rp_propose, rp_truncate, rp_destroy, NULL, NULL};

eg_status eg_drafter_replay_create(const eg_config *target, int n_slots, int max_seq_len, double rate,
                                   eg_drafter **out, eg_error *err) {
    *out = NULL;
    if (!(rate >= 0 && rate <= 1) || n_slots < 1 || max_seq_len < 1)
        return eg_fail(err, EG_ERR_INVALID, "replay proposer: rate %g must be in [0, 1], slots %d and length %d >= 1",
                       rate, n_slots, max_seq_len);
    replay *p = eg_calloc(1, sizeof *p, err);
    if (!p) return EG_ERR_NOMEM;
    p->rate = rate;
    p->V = target->vocab;
    p->len = eg_calloc((size_t)n_slots, sizeof *p->len, err);
    p->ref_of = eg_malloc(sizeof *p->ref_of * (size_t)n_slots, err);
    if (!p->len || !p->ref_of) {
        free(p->len);
        free(p->ref_of);
        free(p);
        return EG_ERR_NOMEM;
    }
    for (int s = 0; s < n_slots; s++) p->ref_of[s] = -1;
    p->d = (eg_drafter){.vt = &rp_vtbl, .impl = p,
                        .info = {.kind = "replay proposer", .n_aux = 0, .aux_layers = NULL, .hidden = target->hidden,
                                 .target_vocab = target->vocab, .q_cap = 1, .n_slots = n_slots, .max_seq_len = max_seq_len,
                                 .state_bytes = 0}};
    *out = &p->d;
    return EG_OK;
}

eg_status eg_drafter_replay_add(eg_drafter *d, const int32_t *tokens, int n_prompt, int n_tokens, eg_error *err) {
    EG_ASSERT(d->vt == &rp_vtbl);
    replay *p = d->impl;
    if (n_prompt < 1 || n_tokens < n_prompt)
        return eg_fail(err, EG_ERR_INVALID, "replay proposer: a reference of %d tokens with a %d-token prompt", n_tokens,
                       n_prompt);
    if (p->n_refs == p->cap_refs) {
        int cap = p->cap_refs ? 2 * p->cap_refs : 16;
        replay_ref *nr = realloc(p->refs, sizeof *nr * (size_t)cap);
        if (!nr) return eg_fail(err, EG_ERR_NOMEM, "replay proposer: out of memory for %d references", cap);
        p->refs = nr;
        p->cap_refs = cap;
    }
    replay_ref *r = &p->refs[p->n_refs];
    if (!(r->tokens = eg_malloc(sizeof(int32_t) * (size_t)n_tokens, err))) return EG_ERR_NOMEM;
    memcpy(r->tokens, tokens, sizeof(int32_t) * (size_t)n_tokens);
    r->n = n_tokens;
    r->n_prompt = n_prompt;
    p->n_refs++;
    return EG_OK;
}

void eg_drafter_replay_counts(const eg_drafter *d, int64_t *right, int64_t *proposed) {
    const replay *p = d->impl;
    *right = p->right;
    *proposed = p->proposed;
}
