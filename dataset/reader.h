/* reader.h — random access to an eaglegen dataset (a directory with manifest.json or
 * worker manifests) or to a single shard file.
 *
 * Opening reads the manifest(s) and each shard's trailer and index (two small reads per
 * shard), so every sample is addressable by global index or by id; reading a sample is
 * one pread of its record followed by full verification (header CRC, zstd frame
 * checksums, sizes, shapes). Every error names the shard and the sample.
 *
 * Ownership: the reader owns its manifest info and indexes; samples returned by
 * dataset_read are owned by the caller (eg_ds_sample_clear).
 * Thread safety: after dataset_open, dataset_read/find/entry may be called from several
 * threads at once (each read opens its own descriptor). */
#ifndef EG_DS_READER_H
#define EG_DS_READER_H

#include <stdint.h>

#include "common/eg_common.h"
#include "dataset/format.h"
#include "dataset/manifest.h"

typedef struct eg_ds_reader eg_ds_reader;

eg_status dataset_open(const char *path, eg_ds_reader **out, eg_error *err);
void dataset_close(eg_ds_reader *r); /* NULL ok */

int64_t dataset_num_samples(const eg_ds_reader *r);
int dataset_num_shards(const eg_ds_reader *r);
/* Manifest info. For a single shard opened directly, only n_aux, hidden_size and one
 * shard entry (without sha256) are known. */
const eg_ds_info *dataset_info(const eg_ds_reader *r);
int dataset_has_manifest(const eg_ds_reader *r);
/* Path of shard i, its index and the global index of its first sample. */
const char *dataset_shard_path(const eg_ds_reader *r, int shard);
const eg_ds_index *dataset_shard_index(const eg_ds_reader *r, int shard);
int64_t dataset_shard_first(const eg_ds_reader *r, int shard);

/* Locate sample i: shard and position inside it; NULL entry when out of range. */
const eg_ds_index_entry *dataset_entry(const eg_ds_reader *r, int64_t i, int *shard, int64_t *pos);
/* Global index of an id, or -1. */
int64_t dataset_find(const eg_ds_reader *r, const char *id);

/* Read and fully verify sample i. meta_only skips the tensors. */
eg_status dataset_read(const eg_ds_reader *r, int64_t i, int meta_only, eg_ds_sample *out,
                       eg_error *err);

/* Structural check of one shard beyond what open does: sha256 and size against the
 * manifest, the tar walked with libarchive (member names, order, sizes and offsets
 * against the index). Samples themselves are checked by dataset_read. */
eg_status dataset_verify_shard(const eg_ds_reader *r, int shard, eg_error *err);

/* Read a shard's trailer and index (used by open, the writer's resume and merge). */
eg_status eg_ds_shard_load_index(const char *path, eg_ds_trailer *tr, eg_ds_index *ix,
                                 uint64_t *file_size, eg_error *err);

#endif
