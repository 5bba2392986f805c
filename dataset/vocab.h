/* vocab.h — the EAGLE-3 draft vocabulary (d2t, t2d) from a dataset's loss-masked token
 * counts, and the NumPy .npy writer its files use.
 *
 * The draft vocabulary is the N most frequent loss-masked target ids; the tie rule (and
 * how a vocabulary with fewer than N distinct ids is padded) is eg_vocab_tie. d2t maps a
 * draft index to its target id as an offset (target = d + d2t[d]) with the ids sorted
 * ascending, as SpecForge and speculators store it; t2d marks the target ids kept.
 * Ownership: eg_draft_vocab owns its arrays (eg_draft_vocab_clear).
 * Thread safety: no shared state. */
#ifndef EG_DS_VOCAB_H
#define EG_DS_VOCAB_H

#include <stdint.h>

#include "common/eg_common.h"
#include "dataset/reader.h"

typedef enum eg_vocab_tie {
    EG_VOCAB_TIE_LOW_ID = 0,   /* eaglegen's rule: equal counts go to the lower id; padded with
                                  the lowest unused ids */
    EG_VOCAB_TIE_SPECFORGE = 1 /* SpecForge 0.2's generate_vocab_mapping_file: a Counter filled
                                  sample by sample (each sample's ids ascending), most_common(N):
                                  equal counts in first-occurrence order; fewer than N distinct
                                  ids padded with ids of range(N) in the iteration order of
                                  CPython's set(range(N)) - seen (docs/FORMAT.md "Exporting").
                                  Counts by reading every sample (the order is not in the
                                  manifest) */
} eg_vocab_tie;

/* The eg_vocab_tie named s ("eaglegen", "specforge"; "speculators" is eaglegen's rule:
 * speculators 0.9 breaks ties to the lower id and pads with the lowest unused ids), or -1. */
int eg_vocab_tie_parse(const char *s);
const char *eg_vocab_tie_name(eg_vocab_tie t);

typedef struct eg_draft_vocab {
    int64_t N, V;
    int64_t *d2t;       /* [N] target = d + d2t[d], ids ascending */
    uint8_t *t2d;       /* [V] 1 for the target ids in the draft vocabulary */
    int64_t distinct;   /* distinct loss-masked ids seen */
    int64_t padding;    /* ids added because fewer than N occur */
    uint64_t covered;   /* loss-masked tokens whose id is kept */
    uint64_t total;     /* loss-masked tokens */
} eg_draft_vocab;

/* Build from r's histogram (the manifest's; a single shard is counted from its samples).
 * V = 0 takes the manifest's tokenizer vocab size; a given V must agree with it. */
eg_status eg_draft_vocab_build(eg_ds_reader *r, int64_t N, int64_t V, eg_vocab_tie tie, eg_draft_vocab *out,
                               eg_error *err);
/* Same over the samples cut to their first max_len tokens (0 = whole samples), counted
 * from the samples themselves, as a trainer counts the data it is given. */
eg_status eg_draft_vocab_build_cut(eg_ds_reader *r, int64_t N, int64_t V, eg_vocab_tie tie, int64_t max_len,
                                   eg_draft_vocab *out, eg_error *err);
/* The same from a histogram (hist[id] = loss-masked occurrences of id, [hist_len]), e.g.
 * counted over exactly the tokens an exporter writes; V is required. Tie rule eaglegen
 * only (specforge's needs the sample order: eg_draft_vocab_build). */
eg_status eg_draft_vocab_from_hist(const uint64_t *hist, int64_t hist_len, int64_t N, int64_t V, eg_vocab_tie tie,
                                   eg_draft_vocab *out, eg_error *err);
void eg_draft_vocab_clear(eg_draft_vocab *v); /* NULL ok */

/* SpecForge's padding: the first `need` ids of CPython's `set(range(N)) - seen` in that
 * set's iteration order, into out[need]; present[k] (k < N) marks the seen ids below N and
 * distinct counts every seen id (those >= N too: it picks CPython's algorithm). Exposed
 * for tests (tests/t_export_specforge.sh compares it with the running CPython). */
eg_status eg_vocab_pyset_missing(int64_t N, const uint8_t *present, int64_t distinct, int64_t need, int64_t *out,
                                 eg_error *err);

/* DIR/NAME as a NumPy v1.0 .npy of one dimension (descr e.g. "<i8", "|b1"), written
 * atomically (eg_ds_write_atomic). */
eg_status eg_npy_write(const char *dir, const char *name, const char *descr, int64_t n, const void *data, size_t elem,
                       eg_error *err);

#endif
