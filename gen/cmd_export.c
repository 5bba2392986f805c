/* eaglegen export: a dataset in a trainer's own on-disk layout (dataset/export.h). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/eg_common.h"
#include "dataset/export.h"
#include "dataset/reader.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen export DATASET --to specforge|speculators --out DIR [options]\n"
            "\n"
            "Writes DATASET (a directory or one shard .tar) in the trainer's own on-disk layout, as\n"
            "its own data-generation script writes it, with the draft vocabulary mapping and the\n"
            "draft model config in its format, every aux layer id converted to its convention, and\n"
            "prints the trainer's command line. Streams sample by sample (bounded memory); every\n"
            "file is written under a temporary name and renamed.\n"
            "\n"
            "options:\n"
            "  --to T             specforge or speculators (required)\n"
            "  --out DIR          output directory (created; must be empty or absent; required)\n"
            "  --draft-vocab N    draft vocabulary size (default 32000, or the target vocabulary\n"
            "                     when smaller)\n"
            "  --max-len N        cut samples to their first N tokens (default: whole samples)\n"
            "  -h, --help         this help\n"
            "\n"
            "exit status: 0 ok, 1 failure, 2 usage error\n");
}

typedef struct {
    double t0, last;
} progress_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_progress(void *vc, int64_t done, int64_t total, int64_t bytes) {
    progress_ctx *p = vc;
    double t = now_s();
    if (done < total && t - p->last < 1.0) return;
    p->last = t;
    double el = t - p->t0, eta = done > 0 ? el * (double)(total - done) / (double)done : 0;
    fprintf(stderr, "\reaglegen export: %" PRId64 "/%" PRId64 " samples, %.1f MB written, %.0f s elapsed, ETA %.0f s%s",
            done, total, (double)bytes / 1e6, el, eta, done == total ? "\n" : "");
}

int cmd_export(int argc, char **argv) {
    static const struct option opts[] = {{"to", required_argument, 0, 't'},
                                         {"out", required_argument, 0, 'o'},
                                         {"draft-vocab", required_argument, 0, 'n'},
                                         {"max-len", required_argument, 0, 'm'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *to = NULL;
    eg_export_opts o = {0};
    optind = 1;
    int c;
    while ((c = gen_getopt(argc, argv, "export", "h", opts)) != -1) {
        char *end;
        long long v;
        switch (c) {
        case 't': to = optarg; break;
        case 'o': o.out_dir = optarg; break;
        case 'n':
            v = strtoll(optarg, &end, 10);
            if (*end || v < 1) { fprintf(stderr, "eaglegen export: bad --draft-vocab '%s' (a positive count)\n", optarg); return 2; }
            o.draft_vocab = v;
            break;
        case 'm':
            v = strtoll(optarg, &end, 10);
            if (*end || v < 1) { fprintf(stderr, "eaglegen export: bad --max-len '%s' (a positive count)\n", optarg); return 2; }
            o.max_len = v;
            break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    if (optind != argc - 1 || !to || !o.out_dir) {
        usage(stderr);
        return 2;
    }
    eg_status (*fn)(eg_ds_reader *, const eg_export_opts *, eg_export_report *, eg_error *);
    if (!strcmp(to, "specforge")) fn = eg_export_specforge;
    else if (!strcmp(to, "speculators")) fn = eg_export_speculators;
    else {
        fprintf(stderr, "eaglegen export: --to '%s': the trainers are specforge and speculators\n", to);
        return 2;
    }
    eg_error err = {0};
    eg_ds_reader *r;
    if (dataset_open(argv[optind], &r, &err)) {
        fprintf(stderr, "eaglegen export: %s\n", err.msg);
        return 1;
    }
    progress_ctx pc = {now_s(), 0};
    o.progress = on_progress;
    o.progress_ctx = &pc;
    eg_export_report rep;
    memset(&rep, 0, sizeof rep);
    eg_status st = fn(r, &o, &rep, &err);
    dataset_close(r);
    if (st) {
        fprintf(stderr, "eaglegen export: %s\n", err.msg);
        return st == EG_ERR_INVALID ? 2 : 1;
    }
    printf("%s\n", rep.summary);
    if (rep.trainer_command[0]) printf("train with:\n  %s\n", rep.trainer_command);
    return 0;
}
