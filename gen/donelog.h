/* donelog.h — done.jsonl (done.w{I}of{N}.jsonl): for each sample a job made, its id and a
 * 64-bit hash of the record's token ids, so a resumed run whose inputs changed can tell
 * a record that still has a done id but different content (the old sample is kept, the
 * change is reported) from one that is merely done.
 *
 * One JSON line per sample, appended (and flushed) when the sample is handed to the
 * writer; a torn last line (a crash mid-write) is ignored and cut off. An id with no line
 * (jobs made before this file existed, or a power loss between the line and its shard's
 * commit) is simply not checked. An id with several lines (a sample made again after
 * `eaglegen repair` set its shard aside) is checked against its last. Ownership:
 * gen_donelog_close frees (NULL ok).
 * Thread safety: one thread. */
#ifndef EG_GEN_DONELOG_H
#define EG_GEN_DONELOG_H

#include <stddef.h>
#include <stdint.h>

#include "common/eg_common.h"

typedef struct gen_donelog gen_donelog;

/* Hash of a record's token ids [n]. */
uint64_t gen_record_hash(const int32_t *ids, size_t n);

eg_status gen_donelog_open(const char *dir, const char *name, gen_donelog **out, eg_error *err);
void gen_donelog_close(gen_donelog *d);
/* 1 and *hash when the id has a line. */
int gen_donelog_get(const gen_donelog *d, const char *id, uint64_t *hash);
eg_status gen_donelog_add(gen_donelog *d, const char *id, uint64_t hash, eg_error *err);
eg_status gen_donelog_sync(gen_donelog *d, eg_error *err);

#endif
