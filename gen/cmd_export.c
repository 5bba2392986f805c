/* eaglegen export: a dataset in a trainer's own on-disk layout (dataset/export.h). */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include <jansson.h>

#include "common/eg_common.h"
#include "dataset/export.h"
#include "dataset/reader.h"
#include "engine/config.h"
#include "engine/export_target.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen export DATASET --to specforge|speculators --out DIR [options]\n"
            "\n"
            "Writes DATASET (a dataset directory: a shard on its own records no target vocabulary\n"
            "and is refused) in the trainer's own on-disk layout, as\n"
            "its own data-generation script writes it, with the draft vocabulary mapping and the\n"
            "draft model config in its format, every aux layer id converted to its convention, and\n"
            "prints the trainer's command line. Streams sample by sample (bounded memory); every\n"
            "file is written under a temporary name and renamed.\n"
            "\n"
            "options:\n"
            "  --to T             specforge or speculators (required)\n"
            "  --out DIR          output directory (created; must be empty or absent, or for specforge\n"
            "                     an unfinished export of the same dataset and options: resumed; required)\n"
            "  --model DIR        the target model's checkpoint: writes OUT/target, the lm_head and\n"
            "                     embedding with a flat config.json and the tokenizer files, what\n"
            "                     SpecForge's target head and draft embedding load (specforge only)\n"
            "  --draft-vocab N    draft vocabulary size (default 32000, or the target vocabulary\n"
            "                     when smaller)\n"
            "  --tie-order R      how the N most frequent loss-masked ids are chosen among equal\n"
            "                     counts (and how fewer than N are padded): eaglegen = speculators\n"
            "                     (lower id first, lowest unused ids) or specforge\n"
            "                     (SpecForge 0.2's generate_vocab_mapping_file: first occurrence in\n"
            "                     sample order, padding in CPython's set order; reads every sample\n"
            "                     a second time). Default: specforge for --to specforge, else\n"
            "                     eaglegen. docs/FORMAT.md \"Exporting to trainers\"\n"
            "  --max-len N        cut samples to their first N tokens (default: whole samples)\n"
            "  --verifier P       speculators: the verifier (target) model path or name for the printed\n"
            "                     command's --verifier-name-or-path (default: a placeholder)\n"
            "  --log-json         progress as JSON lines on stderr and the result as one JSON\n"
            "                     object on stdout\n"
            "  -h, --help         this help\n"
            "\n"
            "exit status: 0 ok, 1 failure, 2 usage error\n");
}

typedef struct {
    double t0, last;
    int json;
    int tty; /* stderr a terminal: one line redrawn each second; else a line each 10 s (a log) */
} progress_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_progress(void *vc, int64_t done, int64_t total, int64_t bytes) {
    progress_ctx *p = vc;
    double t = now_s();
    if (done < total && t - p->last < (p->tty || p->json ? 1.0 : 10.0)) return;
    p->last = t;
    double el = t - p->t0, eta = done > 0 ? el * (double)(total - done) / (double)done : 0;
    if (p->json) {
        fprintf(stderr,
                "{\"event\":\"progress\",\"samples_done\":%" PRId64 ",\"samples_total\":%" PRId64
                ",\"bytes_written\":%" PRId64 ",\"elapsed_s\":%.1f,\"eta_s\":%.0f}\n",
                done, total, bytes, el, eta);
        return;
    }
    fprintf(stderr, "%seaglegen export: %" PRId64 "/%" PRId64 " samples, %.1f MB written, %.0f s elapsed, ETA %.0f s%s",
            p->tty ? "\r" : "", done, total, (double)bytes / 1e6, el, eta, done == total || !p->tty ? "\n" : "");
}

int cmd_export(int argc, char **argv) {
    static const struct option opts[] = {{"to", required_argument, 0, 't'},
                                         {"out", required_argument, 0, 'o'},
                                         {"draft-vocab", required_argument, 0, 'n'},
                                         {"max-len", required_argument, 0, 'm'},
                                         {"model", required_argument, 0, 'M'},
                                         {"tie-order", required_argument, 0, 'r'},
                                         {"log-json", no_argument, 0, 'j'},
                                         {"verifier", required_argument, 0, 'V'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *to = NULL, *model = NULL;
    int tie = -1, log_json = 0;
    eg_export_opts o = {0};
    optind = 1;
    int c;
    while ((c = gen_getopt(argc, argv, "export", "h", opts)) != -1) {
        int64_t v;
        switch (c) {
        case 't': to = optarg; break;
        case 'o': o.out_dir = optarg; break;
        case 'n':
            if (!gen_arg_int64("export", "--draft-vocab", optarg, 1, INT32_MAX, &v)) return 2;
            o.draft_vocab = v;
            break;
        case 'm':
            if (!gen_arg_int64("export", "--max-len", optarg, 1, INT64_MAX, &v)) return 2;
            o.max_len = v;
            break;
        case 'M': model = optarg; break;
        case 'r':
            if ((tie = eg_vocab_tie_parse(optarg)) < 0) {
                fprintf(stderr, "eaglegen export: bad --tie-order '%s' (eaglegen, specforge or speculators)\n", optarg);
                return 2;
            }
            break;
        case 'j': log_json = 1; break;
        case 'V': o.verifier = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    static const char *const need[] = {"DATASET", "--to", "--out"};
    if (!gen_arg_required("export", "DATASET --to specforge|speculators --out DIR [options]", argc - optind, argv + optind, 3, need,
                          (int[]){optind < argc, !!to, !!o.out_dir}))
        return 2;
    eg_status (*fn)(eg_ds_reader *, const eg_export_opts *, eg_export_report *, eg_error *);
    if (!strcmp(to, "specforge")) fn = eg_export_specforge;
    else if (!strcmp(to, "speculators")) fn = eg_export_speculators;
    else {
        fprintf(stderr, "eaglegen export: --to '%s': the trainers are specforge and speculators\n", to);
        return 2;
    }
    if (model && fn != eg_export_specforge) {
        fprintf(stderr, "eaglegen export: --model is for --to specforge (its target head); %s does not take it\n", to);
        return 2;
    }
    if (o.verifier && fn != eg_export_speculators) {
        fprintf(stderr, "eaglegen export: --verifier is for --to speculators (its printed command)\n");
        return 2;
    }
    o.tie = tie >= 0 ? (eg_vocab_tie)tie : fn == eg_export_specforge ? EG_VOCAB_TIE_SPECFORGE : EG_VOCAB_TIE_LOW_ID;
    eg_error err = {0};
    eg_ds_reader *r;
    if (dataset_open(argv[optind], &r, &err)) {
        fprintf(stderr, "eaglegen export: %s\n", err.msg);
        return 1;
    }
    if (model) { /* refuse a checkpoint that does not match the data before writing anything */
        eg_config cfg;
        if (eg_config_load(model, &cfg, &err)) {
            fprintf(stderr, "eaglegen export: --model %s: %s\n", model, err.msg);
            dataset_close(r);
            return 1;
        }
        const eg_ds_info *m = dataset_info(r);
        int bad = cfg.hidden != m->hidden_size || (m->target_vocab_size && cfg.vocab != m->target_vocab_size) ||
                  (m->n_layers && cfg.n_layers != m->n_layers);
        if (bad)
            fprintf(stderr,
                    "eaglegen export: --model %s (hidden %d, vocab %d, %d layers) is not the dataset's target (hidden "
                    "%" PRId64 ", vocab %" PRId64 ", %d layers)\n",
                    model, cfg.hidden, cfg.vocab, cfg.n_layers, m->hidden_size, m->target_vocab_size, m->n_layers);
        eg_config_free(&cfg);
        if (bad) {
            dataset_close(r);
            return 2;
        }
    }
    progress_ctx pc = {now_s(), 0, log_json, isatty(2)};
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
    eg_target_info ti = {0};
    char tdir[4200];
    snprintf(tdir, sizeof tdir, "%s/target", o.out_dir);
    if (model && eg_export_target(model, tdir, &ti, &err)) {
        fprintf(stderr, "eaglegen export: the samples are exported, but the target directory %s failed: %s\n", tdir,
                err.msg);
        return 1;
    }
    char note[1024] = "";
    if (fn == eg_export_specforge)
        snprintf(note, sizeof note,
                 "%s"
                 "note: SpecForge 0.2.0's train_eagle3.py needs --train-data-path (your conversations, tokenized with\n"
                 "  the target's tokenizer) even offline, and builds its vocab mapping from it unless\n"
                 "  CACHE/vocab_mapping/<md5 of \"DATA-MAXLEN-TEMPLATE-TARGET\">.pt exists: copy %s/vocab_mapping.pt\n"
                 "  there to train with this export's mapping",
                 model ? "" : "note: no --model: write the target directory with --model DIR (lm_head + embedding)\n",
                 o.out_dir);
    if (log_json) {
        json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:s, s:s?}", "event", "done", "to", to, "out",
                              o.out_dir, "samples", (json_int_t)rep.samples, "tokens", (json_int_t)rep.tokens,
                              "bytes_written", (json_int_t)(rep.bytes_written + ti.bytes), "draft_vocab",
                              (json_int_t)rep.draft_vocab, "tie_order", eg_vocab_tie_name(o.tie), "trainer_command",
                              rep.trainer_command, "target_dir", model ? tdir : NULL);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
        return 0;
    }
    printf("%s\n", rep.summary);
    if (model)
        printf("  target %s: lm_head + embedding [%" PRId64 ", %" PRId64 "], flat config.json, %d tokenizer files, %.1f MB\n",
               tdir, ti.vocab, ti.hidden, ti.tokenizer_files, (double)ti.bytes / 1e6);
    if (rep.trainer_command[0]) printf("train with:\n  %s\n", rep.trainer_command);
    if (note[0]) printf("%s\n", note);
    return 0;
}
