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
#include "dataset/vocab.h"
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
            "samples). V is the manifest's tokenizer.vocab_size; --target-vocab gives it where the\n"
            "manifest has none (a value that differs from the manifest's is refused).\n"
            "\n"
            "options:\n"
            "  --draft-vocab N    draft vocabulary size (required)\n"
            "  --out DIR          output directory (created if missing, in a directory that exists;\n"
            "                     required)\n"
            "  --target-vocab V   target vocabulary size (required when the manifest has none; else it\n"
            "                     must equal the manifest's)\n"
            "  -h, --help         this help\n"
            "\n"
            "exit status: 0 ok, 1 failure, 2 usage error\n");
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
        switch (c) {
        case 'n': {
            int64_t x;
            if (!gen_arg_int64("vocab", "--draft-vocab", optarg, 1, INT32_MAX, &x)) return 2;
            N = x;
            break;
        }
        case 'V': {
            int64_t x;
            if (!gen_arg_int64("vocab", "--target-vocab", optarg, 1, INT32_MAX, &x)) return 2;
            V = x;
            break;
        }
        case 'o': out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    static const char *const need[] = {"DATASET", "--draft-vocab", "--out"};
    if (!gen_arg_required("vocab", "DATASET --draft-vocab N --out DIR [--target-vocab V]", argc - optind, argv + optind, 3, need,
                          (int[]){optind < argc, N >= 1, !!out}))
        return 2;
    const char *path = argv[optind];
    eg_error err = {0};
    eg_ds_reader *r;
    if (dataset_open(path, &r, &err)) {
        fprintf(stderr, "eaglegen vocab: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    eg_draft_vocab dv;
    if (eg_draft_vocab_build(r, N, V, EG_VOCAB_TIE_LOW_ID, &dv, &err)) {
        fprintf(stderr, "eaglegen vocab: %s\n", err.msg);
        rc = err.code == EG_ERR_INVALID ? 2 : 1;
        goto done;
    }
    if (!dv.distinct) { /* ids 0..N-1 with nothing behind them is no vocabulary */
        fprintf(stderr, "eaglegen vocab: the dataset holds no loss-masked tokens (no samples, or none with generated "
                        "tokens): nothing to choose a draft vocabulary from\n");
        goto done_v;
    }
    if (mkdir(out, 0755) && errno != EEXIST) {
        fprintf(stderr, "eaglegen vocab: mkdir %s: %s\n", out, strerror(errno));
        goto done_v;
    }
    if (eg_npy_write(out, "d2t.npy", "<i8", dv.N, dv.d2t, 8, &err) || eg_npy_write(out, "t2d.npy", "|b1", dv.V, dv.t2d, 1, &err)) {
        fprintf(stderr, "eaglegen vocab: %s\n", err.msg);
        goto done_v;
    }
    printf("draft vocab %" PRId64 " of %" PRId64 " target ids: %" PRId64 " distinct loss-masked ids seen, %" PRId64
           " padding ids; covers %.4f%% of %" PRIu64 " loss-masked tokens\n",
           dv.N, dv.V, dv.distinct, dv.padding, dv.total ? 100.0 * (double)dv.covered / (double)dv.total : 0.0, dv.total);
    printf("wrote %s/d2t.npy (int64 [%" PRId64 "]) and %s/t2d.npy (bool [%" PRId64 "])\n", out, dv.N, out, dv.V);
    rc = 0;
done_v:
    eg_draft_vocab_clear(&dv);
done:
    dataset_close(r);
    return rc;
}
