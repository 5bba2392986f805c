/* vocab.c — draft vocabulary from loss-masked counts (vocab.h). */
#include "dataset/vocab.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NPY v1.0: magic, version, little-endian u16 header length, a Python dict literal
 * padded with spaces and ended by '\n' so the data starts at a multiple of 64. */
eg_status eg_npy_write(const char *dir, const char *name, const char *descr, int64_t n, const void *data, size_t elem,
                       eg_error *err) {
    char dict[256];
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRId64 ",), }", descr, n);
    size_t hl = (size_t)dl + 1, total = 10 + hl;
    size_t pad = (64 - total % 64) % 64;
    hl += pad;
    size_t bytes = 10 + hl + (size_t)n * elem;
    uint8_t *b = eg_malloc(bytes, err);
    if (!b) return EG_ERR_NOMEM;
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (uint8_t)(hl & 0xff);
    b[9] = (uint8_t)(hl >> 8);
    memcpy(b + 10, dict, (size_t)dl);
    memset(b + 10 + dl, ' ', pad);
    b[10 + hl - 1] = '\n';
    memcpy(b + 10 + hl, data, (size_t)n * elem);
    eg_status st = eg_ds_write_atomic(dir, name, b, bytes, err);
    free(b);
    return st;
}

typedef struct {
    int64_t id;
    uint64_t count;
} idc;

static int by_count(const void *a, const void *b) {
    const idc *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

void eg_draft_vocab_clear(eg_draft_vocab *v) {
    if (!v) return;
    free(v->d2t);
    free(v->t2d);
    memset(v, 0, sizeof *v);
}

/* A single shard has no manifest histogram: count its loss-masked ids. */
static eg_status count_samples(eg_ds_reader *r, uint64_t **hist, int64_t *hist_len, eg_error *err) {
    for (int64_t i = 0; i < dataset_num_samples(r); i++) {
        eg_ds_sample s;
        eg_status st = dataset_read(r, i, 0, &s, err);
        if (st) return st;
        for (int64_t t = 0; t < s.T; t++) {
            if (!s.loss_mask[t]) continue;
            int64_t id = s.input_ids[t];
            if (id >= *hist_len) {
                int64_t nl = id + 1;
                uint64_t *q = realloc(*hist, sizeof(uint64_t) * (size_t)nl);
                if (!q) {
                    eg_ds_sample_clear(&s);
                    return eg_fail(err, EG_ERR_NOMEM, "out of memory counting token ids");
                }
                memset(q + *hist_len, 0, sizeof(uint64_t) * (size_t)(nl - *hist_len));
                *hist = q;
                *hist_len = nl;
            }
            (*hist)[id]++;
        }
        eg_ds_sample_clear(&s);
    }
    return EG_OK;
}

eg_status eg_draft_vocab_build(eg_ds_reader *r, int64_t N, int64_t V, eg_vocab_tie tie, eg_draft_vocab *out,
                               eg_error *err) {
    memset(out, 0, sizeof *out);
    const eg_ds_info *m = dataset_info(r);
    if (tie != EG_VOCAB_TIE_LOW_ID) return eg_fail(err, EG_ERR_INVALID, "draft vocab: unknown tie rule %d", (int)tie);
    if (!V) V = m->target_vocab_size;
    else if (m->target_vocab_size && m->target_vocab_size != V)
        return eg_fail(err, EG_ERR_INVALID, "target vocabulary %" PRId64 " differs from the manifest's vocab_size %" PRId64,
                       V, m->target_vocab_size);
    if (!V)
        return eg_fail(err, EG_ERR_INVALID,
                       "the dataset does not record the target vocabulary size; give it (--target-vocab)");
    if (N < 1 || N > V)
        return eg_fail(err, EG_ERR_INVALID, "draft vocabulary %" PRId64 " must be 1..%" PRId64 " (the target vocabulary)", N, V);
    if (dataset_has_manifest(r)) return eg_draft_vocab_from_hist(m->hist, m->hist_len, N, V, tie, out, err);
    uint64_t *hist = NULL;
    int64_t hist_len = 0;
    eg_status st = count_samples(r, &hist, &hist_len, err);
    if (!st) st = eg_draft_vocab_from_hist(hist, hist_len, N, V, tie, out, err);
    free(hist);
    return st;
}

eg_status eg_draft_vocab_from_hist(const uint64_t *hist, int64_t hist_len, int64_t N, int64_t V, eg_vocab_tie tie,
                                   eg_draft_vocab *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    if (tie != EG_VOCAB_TIE_LOW_ID) return eg_fail(err, EG_ERR_INVALID, "draft vocab: unknown tie rule %d", (int)tie);
    if (N < 1 || N > V)
        return eg_fail(err, EG_ERR_INVALID, "draft vocabulary %" PRId64 " must be 1..%" PRId64 " (the target vocabulary)", N, V);
    eg_status st = EG_OK;
    idc *occ = NULL;
    int64_t *sel = NULL;
    int64_t distinct = 0;
    uint64_t total = 0;
    for (int64_t id = 0; id < hist_len; id++)
        if (hist[id]) {
            if (id >= V) {
                st = eg_fail(err, EG_ERR_FORMAT, "token id %" PRId64 " occurs but the target vocabulary has %" PRId64 " ids",
                             id, V);
                goto done;
            }
            distinct++;
            total += hist[id];
        }
    occ = malloc(sizeof *occ * (size_t)(distinct + 1));
    sel = malloc(sizeof *sel * (size_t)N);
    out->d2t = malloc(sizeof *out->d2t * (size_t)N);
    out->t2d = calloc((size_t)V, 1);
    if (!occ || !sel || !out->d2t || !out->t2d) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory building a draft vocabulary of %" PRId64 " over %" PRId64, N, V);
        goto done;
    }
    int64_t k = 0;
    for (int64_t id = 0; id < hist_len; id++)
        if (hist[id]) occ[k++] = (idc){id, hist[id]};
    qsort(occ, (size_t)distinct, sizeof *occ, by_count);
    int64_t n_sel = distinct < N ? distinct : N;
    uint64_t covered = 0;
    for (int64_t i = 0; i < n_sel; i++) {
        sel[i] = occ[i].id;
        out->t2d[occ[i].id] = 1;
        covered += occ[i].count;
    }
    out->padding = N - n_sel;
    for (int64_t id = 0; n_sel < N && id < V; id++) /* pad with the lowest unused ids */
        if (!out->t2d[id]) {
            out->t2d[id] = 1;
            sel[n_sel++] = id;
        }
    qsort(sel, (size_t)N, sizeof *sel, cmp_i64);
    for (int64_t i = 0; i < N; i++) out->d2t[i] = sel[i] - i;
    out->N = N;
    out->V = V;
    out->distinct = distinct;
    out->covered = covered;
    out->total = total;
done:
    free(occ);
    free(sel);
    if (st) eg_draft_vocab_clear(out);
    return st;
}
