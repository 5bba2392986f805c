/* writer.h — the crash-safe shard writer.
 *
 * shard_writer_add hands a sample to a bounded queue and returns; a pool of threads
 * compresses records (zstd, BF16 byte planes) and one I/O thread appends them, in the
 * order added, to the current shard (a tar written under a temporary name). After
 * shard_samples samples (or shard_bytes bytes) the shard is finished (index, trailer), fsynced, renamed to its
 * final name, the directory fsynced, and only then entered in the manifest, which is
 * itself replaced atomically (write .tmp, fsync, rename, fsync dir). A kill -9 or a full
 * disk at any moment therefore leaves only complete shards and a valid manifest on disk;
 * shard_writer_open with resume first checks every committed shard (dataset/shardcheck.h:
 * size, index, and SHA-256 unless its stamp shows it unchanged since it was hashed) and
 * refuses a damaged one by name; it continues from the manifest, deletes *.tmp leftovers and
 * shards the manifest does not list (they were never committed), and reports the ids
 * already committed so the producer can skip them.
 *
 * Several workers may write into one directory: worker I of N (worker_count > 1) names
 * its shards shard-w{I}of{N}-{seq}.tar and its manifest manifest.w{I}of{N}.json;
 * dataset_merge (manifest.h) combines them into manifest.json. A single writer
 * (worker_count 0 or 1) writes shard-{seq}.tar and manifest.json directly.
 *
 * Ownership: the writer copies every sample before shard_writer_add returns.
 * Thread safety: shard_writer_add, _flush, _close and _free from one producer thread;
 * shard_writer_has_id, _count, _set_job and _stats may be called from any thread. */
#ifndef EG_DS_WRITER_H
#define EG_DS_WRITER_H

#include <stdint.h>

#include "common/eg_common.h"
#include "dataset/format.h"
#include "dataset/manifest.h"

typedef struct eg_shard_writer_opts {
    /* Dataset description, recorded in the manifest; on resume it must equal the
     * existing one (model config and weights, tokenizer, template, aux layers, hidden
     * size, final source; eg_ds_info_compatible). */
    const char *model_name;
    const char *model_config_sha256; /* hex */
    const char *model_weights_sha256; /* hex, of the weights' fingerprints; NULL or "": unknown */
    const char *tokenizer_sha256;    /* hex */
    const char *chat_template;       /* template name */
    int thinking;                    /* thinking mode on */
    int n_aux;
    const int *aux_layers;  /* [n_aux] 0-based decoder layer whose output is stored; ascending and
                             * distinct (refused otherwise), -1 = the embedding output */
    int64_t hidden_size;
    int64_t target_vocab_size;       /* 0 = unknown; else input ids are checked against it */
    eg_ds_final_source final_source; /* default post-norm; EG_DS_FINAL_BOTH: every sample carries
                                      * final_pre_hidden too */
    int n_layers;                    /* decoder layers of the model (recorded; 0 = unknown) */
    const char *job_json;            /* free-form JSON object for the manifest (replacing a resumed
                                      * one from the manifest written at open); NULL = {} */
    const char *precision_json;      /* this run's precision object (JSON), added to the manifest's
                                        "precision" list (kept across resumes); NULL = none */

    /* Behaviour. Zero selects the default. */
    int64_t shard_samples; /* samples per shard (1000; < 0: no sample limit) */
    int64_t shard_bytes;   /* > 0: a shard also ends once it holds this many bytes (at the
                            * sample that takes it past); 0: no byte limit */
    int zstd_level;        /* 3 */
    int no_bf16_split;     /* 1 = store BF16 tensors as they are (for measurements) */
    int threads;           /* compression threads (eg_num_threads()) */
    int queue_depth;       /* samples in flight before add blocks (2 * threads + 2) */
    int worker_index, worker_count; /* 0, 0/1 = single writer */
    int resume;            /* 0: fail if this worker's manifest exists; 1: continue it */
    /* lock_given: the caller holds this writer's lock on lock_fd (shard_writer_lock); the
     * writer uses it and leaves it open, for the caller to close after shard_writer_free
     * (so a start that fails is undone while the lock is still held). */
    int lock_given, lock_fd;
} eg_shard_writer_opts;

typedef struct eg_shard_writer eg_shard_writer;

/* Take the lock a writer of opts holds in dir (an flock on DIR/.lock.MANIFEST; dir must
 * exist), before the caller writes anything of its own for the job: two processes
 * starting one worker at once then cannot undo each other's files. EG_ERR_IO "another
 * writer is using this dataset" when it is held. *fd: to pass as opts.lock_fd, closed by
 * the caller. */
eg_status shard_writer_lock(const char *dir, const eg_shard_writer_opts *opts, int *fd, eg_error *err);
/* The file that lock is on: DIR/.lock.MANIFEST. */
void shard_writer_lock_path(const char *dir, const eg_shard_writer_opts *opts, char *out, size_t n);

/* Open (create or, with resume, continue) the dataset directory dir. */
eg_status shard_writer_open(const char *dir, const eg_shard_writer_opts *opts,
                            eg_shard_writer **out, eg_error *err);

/* Queue one sample (copied). Checks shape against the manifest (n_aux, H), loss mask
 * 0/1, ids >= 0 (and < target_vocab_size when known), and that the id is new. Blocks
 * only while queue_depth samples are in flight. A failure of the background threads
 * (disk full, I/O error) is sticky: it is returned here and by every later call. */
eg_status shard_writer_add(eg_shard_writer *w, const eg_ds_sample *s, eg_error *err);

/* 1 if the id was committed before open or has been added since. */
int shard_writer_has_id(eg_shard_writer *w, const char *id);

/* Bookkeeping counts (EG_DS_COUNT_*), persisted in the manifest at each commit and
 * restored on resume; delta may be negative. */
void shard_writer_count(eg_shard_writer *w, int which, int64_t delta);
int64_t shard_writer_get_count(eg_shard_writer *w, int which);

/* Replace the manifest's free-form "job" object (JSON text; must be an object). */
eg_status shard_writer_set_job(eg_shard_writer *w, const char *job_json, eg_error *err);

typedef struct eg_shard_writer_stats {
    int64_t committed_samples, committed_tokens, committed_shards;
    int64_t committed_bytes, committed_raw_bytes;
    int64_t added;   /* samples accepted by add since open */
    int64_t pending; /* added but not yet committed */
    int64_t resume_checked, resume_hashed; /* committed shards checked at open (resume), and of
                                              those hashed (the others' stamps were unchanged) */
} eg_shard_writer_stats;
void shard_writer_stats(eg_shard_writer *w, eg_shard_writer_stats *out);

/* Commit everything added so far: finish the current shard (even if short) and
 * update the manifest. */
eg_status shard_writer_flush(eg_shard_writer *w, eg_error *err);

/* Flush, stop the threads, write the final manifest. The writer must still be freed. */
eg_status shard_writer_close(eg_shard_writer *w, eg_error *err);

/* Free. Without a close, samples not yet committed are discarded (the unfinished shard
 * is deleted), exactly as a crash would lose them. NULL ok. */
void shard_writer_free(eg_shard_writer *w);

#endif
