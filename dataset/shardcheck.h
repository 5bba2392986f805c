/* shardcheck.h — is every committed shard of a manifest still what was committed?
 *
 * For each shard the manifest lists: the file exists, its size equals shards[].bytes,
 * its SHA-256 equals shards[].sha256 (the hash the writer computed while writing it,
 * before the commit), and its trailer and index read back with the manifest's sample
 * count. The hash reads every byte once (about 240 MB/s per core here); shards are
 * checked in parallel on `threads` threads. Used by the shard writer's resume (which
 * refuses a damaged shard) and by `eaglegen repair` (which sets damaged ones aside).
 *
 * Ownership: results are the caller's arrays. Thread safety: reentrant; starts and
 * joins its own threads. */
#ifndef EG_DS_SHARDCHECK_H
#define EG_DS_SHARDCHECK_H

#include "common/eg_common.h"
#include "dataset/manifest.h"

typedef enum eg_ds_shard_state {
    EG_DS_SHARD_OK = 0,
    EG_DS_SHARD_MISSING,  /* no such file (or not readable) */
    EG_DS_SHARD_SIZE,     /* size differs from the manifest (truncated, appended) */
    EG_DS_SHARD_CHECKSUM, /* same size, different SHA-256 (a changed byte) */
    EG_DS_SHARD_INDEX     /* trailer or index unreadable, or its sample count differs */
} eg_ds_shard_state;

typedef struct eg_ds_shard_check {
    eg_ds_shard_state state;
    char why[sizeof ((eg_error *)0)->msg]; /* "" when OK; else what was found, e.g. "size 1234, manifest says 2048" */
} eg_ds_shard_check;

/* Check shards[0..info->n_shards) of the manifest of dir into out[n_shards]. threads <= 0:
 * eg_num_threads(). *n_bad = how many are not OK. Fails only on out of memory. */
eg_status eg_ds_check_shards(const char *dir, const eg_ds_info *info, int threads, eg_ds_shard_check *out,
                             int *n_bad, eg_error *err);

const char *eg_ds_shard_state_name(eg_ds_shard_state s); /* "ok", "missing", ... */

#endif
