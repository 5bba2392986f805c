/* drafter_replay.h — a replay proposer (drafter.h) for benchmarks and tests: an oracle,
 * not a model. For a sequence it recognises by its prompt it proposes the continuation a
 * reference run of the same target produced (added with eg_drafter_replay_add), each
 * draft right with probability `rate` and otherwise a wrong id (the right one + 1 mod V).
 * Whether the draft at a position is right is a hash of the reference's index and the
 * position, so a run repeats. Under greedy decoding a speculative run emits the
 * reference's very tokens, so a draft is accepted iff it is right and every earlier draft
 * of its step was: the accept length it yields is set by `rate`, and says nothing about
 * any real drafter. It exists so `eaglegen bench` and the tests can exercise the
 * speculative path with a meaningful acceptance without training one.
 *
 * It reads no aux layers (n_aux 0) and keeps no cache (state_bytes 0); proposals come
 * with q one-hot at the draft. A sequence whose prompt matches no reference, or a
 * protocol breach (extend or propose at the wrong length), is an error naming the slot.
 * Ownership: the caller frees it with eg_drafter_free (NULL ok); added references are
 * copied. Thread safety: one thread drives it (drafter.h). */
#ifndef EG_DRAFTER_REPLAY_H
#define EG_DRAFTER_REPLAY_H

#include "engine/config.h"
#include "engine/drafter.h"

/* rate in [0, 1]; target: the model's config (vocabulary, hidden size). */
eg_status eg_drafter_replay_create(const eg_config *target, int n_slots, int max_seq_len, double rate,
                                   eg_drafter **out, eg_error *err);
/* A reference: tokens [n_tokens] = prompt [n_prompt] + its continuation (copied). */
eg_status eg_drafter_replay_add(eg_drafter *d, const int32_t *tokens, int n_prompt, int n_tokens, eg_error *err);
/* Drafts proposed that were right / in all (for tests and reports). */
void eg_drafter_replay_counts(const eg_drafter *d, int64_t *right, int64_t *proposed);

#endif
