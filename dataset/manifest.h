/* manifest.h — the dataset manifest (manifest.json, or manifest.w{I}of{N}.json per worker):
 * what a trainer needs to use the data without guessing, the committed shards with their
 * counts and checksums, and the histogram of loss-masked token ids. Schema: docs/FORMAT.md.
 *
 * Also: dataset_merge, which combines the manifests of several workers (one directory or
 * many) into one manifest.json.
 * Ownership: eg_ds_info owns all its strings and arrays (eg_ds_info_clear frees them).
 * Thread safety: none inside; callers serialise access to one eg_ds_info. */
#ifndef EG_DS_MANIFEST_H
#define EG_DS_MANIFEST_H

#include <stdint.h>

#include "common/eg_common.h"
#include "dataset/format.h"

#define EG_DS_MANIFEST "manifest.json"

typedef enum eg_ds_final_source {
    EG_DS_FINAL_POST_NORM = 0, /* output of the final RMSNorm: what lm_head sees (default) */
    EG_DS_FINAL_PRE_NORM = 1,  /* residual stream after the last decoder layer */
    EG_DS_FINAL_BOTH = 2       /* both (format version >= 2): final_hidden = post-norm,
                                * final_pre_hidden = pre-norm */
} eg_ds_final_source;
/* Manifest name of a final source: "post_norm", "pre_norm" or "both". */
const char *eg_ds_final_source_name(eg_ds_final_source f);

/* Per-record bookkeeping of the producer (gen): how many prompts it generated, skipped
 * (e.g. already committed), dropped (too long, errors) and rejected (filtered). */
enum {
    EG_DS_COUNT_GENERATED,
    EG_DS_COUNT_SKIPPED,
    EG_DS_COUNT_DROPPED,
    EG_DS_COUNT_REJECTED,
    EG_DS_NCOUNTS
};
extern const char *const eg_ds_count_names[EG_DS_NCOUNTS];

typedef struct eg_ds_shard_info {
    char *file; /* file name inside the dataset directory */
    int64_t samples, tokens, loss_tokens, n_stop, n_length;
    int64_t bytes;     /* file size */
    int64_t raw_bytes; /* uncompressed tensor bytes of its samples */
    char sha256[65];   /* of the whole file, lowercase hex */
} eg_ds_shard_info;

/* Totals over a manifest's shards ("totals" and "finish_reasons" in the file). */
typedef struct eg_ds_totals {
    int64_t samples, tokens, loss_tokens, bytes, raw_bytes, n_stop, n_length;
} eg_ds_totals;

typedef struct eg_ds_info {
    int format_version;
    char *model_name, *model_config_sha256, *tokenizer_sha256, *chat_template;
    /* the model's weights by content (generate: SHA-256 of its weight fingerprints, the
     * ones job.json resumes by); "" = not recorded (data made before it was). The name is
     * the model directory's last component, for people: no check compares it */
    char *model_weights_sha256;
    int thinking;
    int n_aux;
    int *aux_layers; /* [n_aux] 0-based decoder layer whose output is stored */
    int64_t hidden_size;
    int64_t target_vocab_size; /* 0 = unknown */
    int n_layers;              /* decoder layers of the target model (0 = unknown: v1 data) */
    eg_ds_final_source final_source;
    int zstd_level, bf16_split;
    int worker_index, worker_count; /* 0/1 for a single writer; count 0 = merged */
    int n_shards;
    eg_ds_shard_info *shards; /* [n_shards] */
    int64_t counts[EG_DS_NCOUNTS];
    /* "totals" and "finish_reasons" as the loaded file states them (stated_ok 0: missing or
       mistyped). Derived from shards[] whenever a manifest is written, so nothing reads
       them but `inspect --verify`, which holds them against eg_ds_info_totals. */
    eg_ds_totals stated;
    int stated_ok;
    uint64_t *hist; /* [hist_len] loss-masked occurrences per token id */
    int64_t hist_len;
    char *job_json; /* caller's free-form JSON object */
    char *precision_json; /* JSON array: the distinct precision objects (cache dtype, activations,
                             backend, kernels, device) of the runs that wrote this data;
                             NULL = not recorded (docs/FORMAT.md "precision") */
} eg_ds_info;

void eg_ds_info_clear(eg_ds_info *info); /* NULL ok */
eg_status eg_ds_info_load(const char *path, eg_ds_info *out, eg_error *err);
/* Write dir/name atomically: dir/name.tmp, fsync, rename, fsync dir. */
eg_status eg_ds_info_save(const eg_ds_info *info, const char *dir, const char *name, eg_error *err);
/* Same description (model config and weights, tokenizer, template, layers, hidden size,
 * final source)? Weights are compared where both record them; names are not compared. */
eg_status eg_ds_info_compatible(const eg_ds_info *a, const eg_ds_info *b, eg_error *err);
/* Deep copy of the description fields only (no shards, counts, histogram). */
eg_status eg_ds_info_copy_desc(eg_ds_info *dst, const eg_ds_info *src, eg_error *err);
/* Add the precision object(s) in items (an object or an array of objects, JSON text) to
 * the list *list (JSON array text or NULL), each unless an equal one is there already. */
eg_status eg_ds_precision_add(char **list, const char *items, eg_error *err);
/* Add a histogram into another (grows dst). */
eg_status eg_ds_hist_add(uint64_t **dst, int64_t *dst_len, const uint64_t *src, int64_t n, eg_error *err);

/* Totals over the shards. */
eg_ds_totals eg_ds_info_totals(const eg_ds_info *info);

/* Atomic small-file write and directory fsync (crash-safety building blocks). */
eg_status eg_ds_write_atomic(const char *dir, const char *name, const void *data, size_t n,
                             eg_error *err);
eg_status eg_ds_fsync_dir(const char *dir, eg_error *err);

/* Find the manifests of a directory: manifest.json if present, else every
 * manifest.w*of*.json (sorted); with prefer_workers the other way round (merge).
 * *names is a malloc'd array of malloc'd strings. */
eg_status eg_ds_find_manifests(const char *dir, int prefer_workers, char ***names, int *n,
                               eg_error *err);
void eg_ds_free_names(char **names, int n);

/* Merge the datasets of several workers. Every manifest found in dirs (a merged
 * manifest.json, or the manifest.w*of*.json of unmerged workers) is combined into
 * out_dir/manifest.json: descriptions must agree, shards are concatenated (hard-linked,
 * or copied, into out_dir when they live elsewhere), counts and histograms summed, and
 * every shard's index is read to reject duplicate sample ids. out_dir may be one of
 * dirs (the usual case: workers wrote into one directory). */
eg_status dataset_merge(const char *const *dirs, int n_dirs, const char *out_dir, eg_error *err);
/* The same, with the members of the JSON object note_json (NULL: none) added to the merged
 * manifest's job object beside "merged_from" (gen records a partial merge there). */
eg_status dataset_merge_note(const char *const *dirs, int n_dirs, const char *out_dir, const char *note_json,
                             eg_error *err);

#endif
