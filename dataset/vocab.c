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
    int64_t key; /* order among equal counts: the id (eaglegen) or the first occurrence (specforge) */
} idc;

static int by_count(const void *a, const void *b) {
    const idc *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->key < y->key ? -1 : x->key > y->key;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int eg_vocab_tie_parse(const char *s) {
    if (!strcmp(s, "eaglegen") || !strcmp(s, "speculators")) return EG_VOCAB_TIE_LOW_ID; /* its rule is ours */
    if (!strcmp(s, "specforge")) return EG_VOCAB_TIE_SPECFORGE;
    return -1;
}

const char *eg_vocab_tie_name(eg_vocab_tie t) {
    switch (t) {
    case EG_VOCAB_TIE_LOW_ID: return "eaglegen";
    case EG_VOCAB_TIE_SPECFORGE: return "specforge";
    }
    return "?";
}

/* The first `need` ids of CPython's `set(range(N)) - seen` in its iteration order, where
 * seen holds `distinct` ids (present[id] != 0 for id < N). CPython's set_difference
 * copies range(N)'s table and deletes (ascending order) when N >> 2 > len(seen); else it
 * adds the survivors, ascending, to a new set whose table order this simulates
 * (Objects/setobject.c: hash(k) = k for these ints, slot k & mask, 9 linear probes, then
 * i = 5i + 1 + (perturb >>= 5); grow to the smallest power of 2 > used*4 (used*2 past
 * 50000) once fill*5 >= mask*3, reinserting in slot order). */
eg_status eg_vocab_pyset_missing(int64_t N, const uint8_t *present, int64_t distinct, int64_t need, int64_t *outv,
                               eg_error *err) {
    int64_t got = 0;
    if ((N >> 2) > distinct) {
        for (int64_t k = 0; k < N && got < need; k++)
            if (!present[k]) outv[got++] = k;
        return EG_OK;
    }
    size_t mask = 7, fill = 0;
    int64_t *tab = malloc(sizeof *tab * (mask + 1));
    if (!tab) return eg_fail(err, EG_ERR_NOMEM, "out of memory padding the draft vocabulary");
    for (size_t i = 0; i <= mask; i++) tab[i] = -1;
    for (int64_t k = 0; k < N; k++) {
        if (present[k]) continue;
        size_t i = (size_t)k & mask, perturb = (size_t)k;
        for (;;) {
            size_t j = i;
            int probes = i + 9 <= mask ? 9 : 0, placed = 0;
            do {
                if (tab[j] < 0) { tab[j] = k; placed = 1; break; }
                j++;
            } while (probes--);
            if (placed) break;
            perturb >>= 5;
            i = (i * 5 + 1 + perturb) & mask;
        }
        fill++;
        if (fill * 5 < mask * 3) continue;
        size_t minused = fill > 50000 ? fill * 2 : fill * 4, ns = 8;
        while (ns <= minused) ns <<= 1;
        int64_t *nt = malloc(sizeof *nt * ns);
        if (!nt) {
            free(tab);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory padding the draft vocabulary");
        }
        for (size_t q = 0; q < ns; q++) nt[q] = -1;
        size_t nm = ns - 1;
        for (size_t q = 0; q <= mask; q++) { /* set_insert_clean, old slot order */
            if (tab[q] < 0) continue;
            size_t a = (size_t)tab[q] & nm, pt = (size_t)tab[q];
            for (;;) {
                if (nt[a] < 0) break;
                size_t b = a;
                int found = 0;
                if (a + 9 <= nm)
                    for (int s = 0; s < 9; s++)
                        if (nt[++b] < 0) { found = 1; break; }
                if (found) { a = b; break; }
                pt >>= 5;
                a = (a * 5 + 1 + pt) & nm;
            }
            nt[a] = tab[q];
        }
        free(tab);
        tab = nt;
        mask = nm;
    }
    for (size_t q = 0; q <= mask && got < need; q++)
        if (tab[q] >= 0) outv[got++] = tab[q];
    free(tab);
    return EG_OK;
}

void eg_draft_vocab_clear(eg_draft_vocab *v) {
    if (!v) return;
    free(v->d2t);
    free(v->t2d);
    memset(v, 0, sizeof *v);
}

/* Count the loss-masked ids sample by sample (a single shard has no manifest histogram;
 * SpecForge's tie rule needs the order). With rank, (*rank)[id] is the id's first
 * occurrence: ids new in a sample are ranked in ascending id order, as SpecForge's
 * Counter.update(zip(*unique(ids))) inserts them. */
static eg_status count_samples(eg_ds_reader *r, int64_t max_len, uint64_t **hist, int64_t **rank, int64_t *hist_len,
                               eg_error *err) {
    int64_t next = 0, *fresh = NULL, fresh_cap = 0;
    eg_status st = EG_OK;
    for (int64_t i = 0; i < dataset_num_samples(r) && !st; i++) {
        eg_ds_sample s;
        if ((st = dataset_read(r, i, 0, &s, err))) break;
        int64_t nf = 0, T = max_len && s.T > max_len ? max_len : s.T;
        for (int64_t t = 0; t < T && !st; t++) {
            if (!s.loss_mask[t]) continue;
            int64_t id = s.input_ids[t];
            if (id < 0) {
                st = eg_fail(err, EG_ERR_FORMAT, "sample %s: negative token id %" PRId64, s.id, id);
                break;
            }
            if (id >= *hist_len) {
                int64_t nl = id + 1 > 2 * *hist_len ? id + 1 : 2 * *hist_len;
                uint64_t *q = realloc(*hist, sizeof(uint64_t) * (size_t)nl);
                if (q) *hist = q;
                int64_t *qr = rank ? realloc(*rank, sizeof(int64_t) * (size_t)nl) : NULL;
                if (qr) *rank = qr;
                if (!q || (rank && !qr)) {
                    st = eg_fail(err, EG_ERR_NOMEM, "out of memory counting token ids");
                    break;
                }
                memset(q + *hist_len, 0, sizeof(uint64_t) * (size_t)(nl - *hist_len));
                if (rank)
                    for (int64_t k = *hist_len; k < nl; k++) (*rank)[k] = -1;
                *hist_len = nl;
            }
            if (rank && (*rank)[id] == -1) { /* new in this sample: ranked after it */
                if (nf == fresh_cap) {
                    fresh_cap = fresh_cap ? 2 * fresh_cap : 1024;
                    int64_t *q = realloc(fresh, sizeof *q * (size_t)fresh_cap);
                    if (!q) {
                        st = eg_fail(err, EG_ERR_NOMEM, "out of memory counting token ids");
                        break;
                    }
                    fresh = q;
                }
                fresh[nf++] = id;
                (*rank)[id] = -2;
            }
            (*hist)[id]++;
        }
        if (!st && nf) {
            qsort(fresh, (size_t)nf, sizeof *fresh, cmp_i64);
            for (int64_t k = 0; k < nf; k++) (*rank)[fresh[k]] = next++;
        }
        eg_ds_sample_clear(&s);
    }
    free(fresh);
    return st;
}

eg_status eg_draft_vocab_build(eg_ds_reader *r, int64_t N, int64_t V, eg_vocab_tie tie, eg_draft_vocab *out,
                               eg_error *err) {
    return eg_draft_vocab_build_cut(r, N, V, tie, 0, out, err);
}

/* The selection itself, from a histogram and (specforge rule) each id's first occurrence. */
static eg_status select_ids(const uint64_t *hist, const int64_t *rank, int64_t hist_len, int64_t N, int64_t V,
                            eg_vocab_tie tie, eg_draft_vocab *out, eg_error *err) {
    memset(out, 0, sizeof *out);
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
        if (hist[id]) occ[k++] = (idc){id, hist[id], rank ? rank[id] : id};
    qsort(occ, (size_t)distinct, sizeof *occ, by_count);
    int64_t n_sel = distinct < N ? distinct : N;
    uint64_t covered = 0;
    for (int64_t i = 0; i < n_sel; i++) {
        sel[i] = occ[i].id;
        out->t2d[occ[i].id] = 1;
        covered += occ[i].count;
    }
    out->padding = N - n_sel;
    if (tie == EG_VOCAB_TIE_SPECFORGE && n_sel < N) { /* every seen id is kept (n_sel = distinct) */
        if ((st = eg_vocab_pyset_missing(N, out->t2d, distinct, N - n_sel, sel + n_sel, err))) goto done;
        for (int64_t i = n_sel; i < N; i++) out->t2d[sel[i]] = 1;
        n_sel = N;
    }
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

eg_status eg_draft_vocab_from_hist(const uint64_t *hist, int64_t hist_len, int64_t N, int64_t V, eg_vocab_tie tie,
                                   eg_draft_vocab *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    if (tie != EG_VOCAB_TIE_LOW_ID)
        return eg_fail(err, EG_ERR_INVALID,
                       "draft vocab: the %s tie rule needs the samples' order, not a histogram (eg_draft_vocab_build)",
                       eg_vocab_tie_name(tie));
    return select_ids(hist, NULL, hist_len, N, V, tie, out, err);
}

eg_status eg_draft_vocab_build_cut(eg_ds_reader *r, int64_t N, int64_t V, eg_vocab_tie tie, int64_t max_len,
                                   eg_draft_vocab *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    const eg_ds_info *m = dataset_info(r);
    if (tie != EG_VOCAB_TIE_LOW_ID && tie != EG_VOCAB_TIE_SPECFORGE)
        return eg_fail(err, EG_ERR_INVALID, "draft vocab: unknown tie rule %d", (int)tie);
    if (!V) V = m->target_vocab_size;
    else if (m->target_vocab_size && m->target_vocab_size != V)
        return eg_fail(err, EG_ERR_INVALID, "target vocabulary %" PRId64 " differs from the manifest's vocab_size %" PRId64,
                       V, m->target_vocab_size);
    if (!V)
        return eg_fail(err, EG_ERR_INVALID,
                       "the dataset does not record the target vocabulary size; give it (--target-vocab)");
    if (N < 1 || N > V)
        return eg_fail(err, EG_ERR_INVALID, "draft vocabulary %" PRId64 " must be 1..%" PRId64 " (the target vocabulary)", N, V);
    if (dataset_has_manifest(r) && tie == EG_VOCAB_TIE_LOW_ID && max_len <= 0)
        return select_ids(m->hist, NULL, m->hist_len, N, V, tie, out, err);
    uint64_t *hist = NULL;
    int64_t hist_len = 0, *rank = NULL;
    eg_status st = count_samples(r, max_len, &hist, tie == EG_VOCAB_TIE_SPECFORGE ? &rank : NULL, &hist_len, err);
    if (!st) st = select_ids(hist, rank, hist_len, N, V, tie, out, err);
    free(hist);
    free(rank);
    return st;
}
