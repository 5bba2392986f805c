/* export.h — an eaglegen dataset in a trainer's own on-disk layout, so it loads in the
 * trainer's unmodified dataset code: SpecForge's offline EAGLE-3 data
 * (eg_export_specforge) and speculators' (eg_export_speculators).
 *
 * Each exporter streams the dataset sample by sample (bounded memory: one sample at a
 * time plus the per-file writers), writes every file under a temporary name and renames
 * it, so a crash leaves only whole files, and writes the draft vocabulary mapping and the
 * draft model config in the trainer's format with the aux layer ids converted to the
 * trainer's convention (manifest aux_layers.trainer_ids). Files that need the target
 * checkpoint (a target directory the trainer's head can load) are written by gen/ through
 * engine/, since dataset/ never reads models.
 * Ownership: the caller owns the reader; the report is filled by value.
 * Thread safety: one export per reader at a time. */
#ifndef EG_DS_EXPORT_H
#define EG_DS_EXPORT_H

#include <stdint.h>

#include "common/eg_common.h"
#include "dataset/reader.h"
#include "dataset/vocab.h"

typedef void (*eg_export_progress_fn)(void *ctx, int64_t samples_done, int64_t samples_total, int64_t bytes_written);

typedef struct eg_export_opts {
    const char *out_dir;      /* created if missing; files already there are refused, never overwritten */
    int64_t draft_vocab;      /* N draft ids (0 = 32000, or V when smaller) */
    eg_vocab_tie tie;         /* how equal counts are ordered (vocab.h) */
    int64_t max_len;          /* 0 = whole samples; else samples cut to their first max_len tokens */
    const char *verifier;     /* speculators: --verifier-name-or-path for the printed command (NULL: a
                                 placeholder, VERIFIER_DIR, explained in the summary) */
    eg_export_progress_fn progress; /* NULL = none; called at most a few times per second */
    void *progress_ctx;
} eg_export_opts;

typedef struct eg_export_report {
    int64_t samples, tokens;
    int64_t bytes_written;
    int64_t draft_vocab;
    char trainer_command[4096]; /* the trainer's command line with every id already converted */
    char summary[2048];         /* what was written where, for gen/ to print */
} eg_export_report;

eg_status eg_export_specforge(eg_ds_reader *r, const eg_export_opts *o, eg_export_report *rep, eg_error *err);
eg_status eg_export_speculators(eg_ds_reader *r, const eg_export_opts *o, eg_export_report *rep, eg_error *err);

#endif
