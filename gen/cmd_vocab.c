/* eaglegen vocab: the EAGLE-3 draft vocabulary (d2t, t2d) from a dataset's histogram of
 * loss-masked token ids. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/eg_common.h"
#include "dataset/manifest.h"
#include "dataset/reader.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen vocab DATASET --draft-vocab N --out DIR [--target-vocab V]\n"
            "\n"
            "Builds the draft vocabulary EAGLE-3 trainers use: the N most frequent loss-masked\n"
            "token ids of DATASET (ties broken by the lower id; when fewer than N ids occur, padded\n"
            "with the lowest unused ids), sorted by id. Writes, as NumPy .npy (v1.0) files:\n"
            "  DIR/d2t.npy  int64 [N]: target_id = draft_index + d2t[draft_index]\n"
            "  DIR/t2d.npy  bool  [V]: true for target ids in the draft vocabulary\n"
            "The histogram comes from the manifest (a single shard without one is counted from its\n"
            "samples). V is the manifest's tokenizer.vocab_size unless --target-vocab is given.\n"
            "\n"
            "options:\n"
            "  --draft-vocab N    draft vocabulary size (required)\n"
            "  --out DIR          output directory (created if missing; required)\n"
            "  --target-vocab V   target vocabulary size (required when the manifest has none)\n"
            "  -h, --help         this help\n"
            "\n"
            "exit status: 0 ok, 1 failure, 2 usage error\n");
}

/* NPY v1.0: magic, version, little-endian u16 header length, a Python dict literal
 * padded with spaces and ended by '\n' so the data starts at a multiple of 64. */
static eg_status write_npy(const char *dir, const char *name, const char *descr, int64_t n, const void *data,
                           size_t elem, eg_error *err) {
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

int cmd_vocab(int argc, char **argv) {
    static const struct option opts[] = {{"draft-vocab", required_argument, 0, 'n'},
                                         {"out", required_argument, 0, 'o'},
                                         {"target-vocab", required_argument, 0, 'V'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    long long N = -1, V = 0;
    const char *out = NULL;
    optind = 1;
    int c;
    while ((c = gen_getopt(argc, argv, "vocab", "h", opts)) != -1) {
        char *end;
        switch (c) {
        case 'n':
            N = strtoll(optarg, &end, 10);
            if (*end || N < 1) { fprintf(stderr, "eaglegen vocab: bad --draft-vocab '%s'\n", optarg); return 2; }
            break;
        case 'V':
            V = strtoll(optarg, &end, 10);
            if (*end || V < 1 || V > INT32_MAX) { fprintf(stderr, "eaglegen vocab: bad --target-vocab '%s'\n", optarg); return 2; }
            break;
        case 'o': out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    if (optind != argc - 1 || N < 1 || !out) {
        usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    eg_error err = {0};
    eg_ds_reader *r;
    if (dataset_open(path, &r, &err)) {
        fprintf(stderr, "eaglegen vocab: %s\n", err.msg);
        return 1;
    }
    const eg_ds_info *m = dataset_info(r);
    int rc = 1;
    uint64_t *hist = NULL;
    int64_t hist_len = 0;
    int64_t *sel = NULL, *d2t = NULL;
    uint8_t *t2d = NULL;
    idc *occ = NULL;
    if (!V) V = m->target_vocab_size;
    else if (m->target_vocab_size && m->target_vocab_size != V) {
        fprintf(stderr, "eaglegen vocab: --target-vocab %lld differs from the manifest's vocab_size %" PRId64 "\n", V,
                m->target_vocab_size);
        goto done;
    }
    if (!V) {
        fprintf(stderr, "eaglegen vocab: the dataset does not record the target vocabulary size; give --target-vocab\n");
        rc = 2;
        goto done;
    }
    if (N > V) {
        fprintf(stderr, "eaglegen vocab: draft vocabulary %lld is larger than the target vocabulary %lld\n", N, V);
        rc = 2;
        goto done;
    }
    if (dataset_has_manifest(r)) {
        hist = m->hist;
        hist_len = m->hist_len;
    } else {
        /* single shard: count the loss-masked ids from its samples */
        for (int64_t i = 0; i < dataset_num_samples(r); i++) {
            eg_ds_sample s;
            if (dataset_read(r, i, 0, &s, &err)) {
                fprintf(stderr, "eaglegen vocab: %s\n", err.msg);
                goto done;
            }
            for (int64_t t = 0; t < s.T; t++) {
                if (!s.loss_mask[t]) continue;
                int64_t id = s.input_ids[t];
                if (id >= hist_len) {
                    int64_t nl = id + 1;
                    uint64_t *q = realloc(hist, sizeof(uint64_t) * (size_t)nl);
                    if (!q) { eg_ds_sample_clear(&s); fprintf(stderr, "eaglegen vocab: out of memory\n"); goto done; }
                    memset(q + hist_len, 0, sizeof(uint64_t) * (size_t)(nl - hist_len));
                    hist = q;
                    hist_len = nl;
                }
                hist[id]++;
            }
            eg_ds_sample_clear(&s);
        }
    }
    int64_t distinct = 0;
    uint64_t total = 0;
    for (int64_t id = 0; id < hist_len; id++)
        if (hist[id]) {
            if (id >= V) {
                fprintf(stderr, "eaglegen vocab: token id %" PRId64 " occurs but the target vocabulary has %lld ids\n", id, V);
                goto done;
            }
            distinct++;
            total += hist[id];
        }
    occ = malloc(sizeof *occ * (size_t)(distinct + 1));
    sel = malloc(sizeof *sel * (size_t)N);
    d2t = malloc(sizeof *d2t * (size_t)N);
    t2d = calloc((size_t)V, 1);
    if (!occ || !sel || !d2t || !t2d) { fprintf(stderr, "eaglegen vocab: out of memory\n"); goto done; }
    int64_t k = 0;
    for (int64_t id = 0; id < hist_len; id++)
        if (hist[id]) occ[k++] = (idc){id, hist[id]};
    qsort(occ, (size_t)distinct, sizeof *occ, by_count);
    int64_t n_sel = distinct < N ? distinct : N;
    uint64_t covered = 0;
    for (int64_t i = 0; i < n_sel; i++) {
        sel[i] = occ[i].id;
        t2d[occ[i].id] = 1;
        covered += occ[i].count;
    }
    for (int64_t id = 0; n_sel < N && id < V; id++) /* pad with the lowest unused ids */
        if (!t2d[id]) {
            t2d[id] = 1;
            sel[n_sel++] = id;
        }
    qsort(sel, (size_t)N, sizeof *sel, cmp_i64);
    for (int64_t i = 0; i < N; i++) d2t[i] = sel[i] - i;
    if (mkdir(out, 0755) && errno != EEXIST) {
        fprintf(stderr, "eaglegen vocab: mkdir %s: %s\n", out, strerror(errno));
        goto done;
    }
    if (write_npy(out, "d2t.npy", "<i8", N, d2t, 8, &err) || write_npy(out, "t2d.npy", "|b1", V, t2d, 1, &err)) {
        fprintf(stderr, "eaglegen vocab: %s\n", err.msg);
        goto done;
    }
    printf("draft vocab %lld of %lld target ids: %" PRId64 " distinct loss-masked ids seen, %" PRId64
           " padding ids; covers %.4f%% of %" PRIu64 " loss-masked tokens\n",
           N, V, distinct, (int64_t)(N - (distinct < N ? distinct : N)), total ? 100.0 * (double)covered / (double)total : 0.0,
           total);
    printf("wrote %s/d2t.npy (int64 [%lld]) and %s/t2d.npy (bool [%lld])\n", out, N, out, V);
    rc = 0;
done:
    if (!dataset_has_manifest(r)) free(hist);
    free(occ);
    free(sel);
    free(d2t);
    free(t2d);
    dataset_close(r);
    return rc;
}
