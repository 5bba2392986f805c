/* shardcheck.h — is every committed shard of a manifest still what was committed?
 *
 * For each shard the manifest lists: the file exists, its size equals shards[].bytes,
 * its SHA-256 equals shards[].sha256 (the hash the writer computed while writing it,
 * before the commit), and its trailer and index read back with the manifest's sample
 * count. Hashing reads every byte (about 240 MB/s per core here), so the writer keeps
 * stamps (DIR/.stamps.MANIFEST): for each shard, the file system's view of the file
 * (size, inode, mtime and ctime in ns) when its hash was last known good — when it wrote
 * the shard, or when a resume hashed it. A shard whose stamp is unchanged has not been
 * written through the file system since (any write, truncation, copy or rename over it
 * changes ctime, which cannot be set back), and is not hashed again; every other shard
 * is. `eaglegen repair` and `inspect --verify` always hash. The stamps file is a cache:
 * missing or unreadable, everything is hashed. Shards are checked in parallel.
 * Used by the shard writer's resume (which refuses a damaged shard) and by `eaglegen
 * repair` (which sets damaged ones aside).
 *
 * Ownership: results and stamps are the caller's (eg_ds_stamps_clear). Thread safety:
 * reentrant; eg_ds_check_shards starts and joins its own threads. */
#ifndef EG_DS_SHARDCHECK_H
#define EG_DS_SHARDCHECK_H

#include "common/eg_common.h"
#include "dataset/idset.h"
#include "dataset/manifest.h"

typedef struct eg_ds_stamp {
    int64_t size, ino, mtime_ns, ctime_ns;
} eg_ds_stamp;
/* The stamp of path now; 0 when it cannot be stat'ed. */
int eg_ds_stamp_of(const char *path, eg_ds_stamp *out);

typedef struct eg_ds_stamps {
    eg_ds_idset index; /* file -> position in st */
    eg_ds_stamp *st;   /* [n] */
    int64_t n, cap;
} eg_ds_stamps;
void eg_ds_stamps_clear(eg_ds_stamps *s); /* NULL ok */
/* Load DIR/.stamps.MANIFEST; a missing or malformed file loads as empty (EG_OK). */
eg_status eg_ds_stamps_load(const char *dir, const char *manifest, eg_ds_stamps *out, eg_error *err);
eg_status eg_ds_stamps_set(eg_ds_stamps *s, const char *file, const eg_ds_stamp *st, eg_error *err);
const eg_ds_stamp *eg_ds_stamps_get(const eg_ds_stamps *s, const char *file); /* NULL: none */
/* Write the stamps of the shards info lists (others are dropped), atomically. */
eg_status eg_ds_stamps_save(const char *dir, const char *manifest, const eg_ds_stamps *s, const eg_ds_info *info,
                            eg_error *err);

typedef enum eg_ds_shard_state {
    EG_DS_SHARD_OK = 0,
    EG_DS_SHARD_MISSING,  /* no such file (or not readable) */
    EG_DS_SHARD_SIZE,     /* size differs from the manifest (truncated, appended) */
    EG_DS_SHARD_CHECKSUM, /* same size, different SHA-256 (a changed byte) */
    EG_DS_SHARD_INDEX     /* trailer or index unreadable, or its sample count differs */
} eg_ds_shard_state;

typedef struct eg_ds_shard_check {
    eg_ds_shard_state state;
    int hashed;        /* its SHA-256 was computed (0: the stamp showed it unchanged) */
    eg_ds_stamp stamp; /* the file's stamp when checked (state OK) */
    char why[sizeof ((eg_error *)0)->msg]; /* "" when OK; else what was found, e.g. "size 1234, manifest says 2048" */
} eg_ds_shard_check;

/* Check shards[0..info->n_shards) of the manifest of dir into out[n_shards]. threads <= 0:
 * eg_num_threads(). stamps: skip the hash of shards whose stamp is unchanged (NULL: hash
 * every shard). *n_bad = how many are not OK. Fails only on out of memory. */
eg_status eg_ds_check_shards(const char *dir, const eg_ds_info *info, int threads, const eg_ds_stamps *stamps,
                             eg_ds_shard_check *out, int *n_bad, eg_error *err);

const char *eg_ds_shard_state_name(eg_ds_shard_state s); /* "ok", "missing", ... */

#endif
