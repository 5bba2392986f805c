/* idset.h — a set of strings (sample ids) with optional int64 values; used by
 * dataset/ and by gen/ (ids met in a run). Open addressing, FNV-1a, grows at 50% load.
 * Ownership: the set copies every key. Thread safety: none (callers lock). */
#ifndef EG_DS_IDSET_H
#define EG_DS_IDSET_H

#include <stdint.h>

#include "common/eg_common.h"

typedef struct eg_ds_idset {
    char **keys;    /* [cap] NULL = empty */
    int64_t *vals;  /* [cap] */
    size_t cap, n;
} eg_ds_idset;

void eg_ds_idset_clear(eg_ds_idset *s);
/* Returns 1 and sets *val (if non-NULL) when present. */
int eg_ds_idset_get(const eg_ds_idset *s, const char *key, int64_t *val);
/* Insert (no-op if present, returns EG_OK). */
eg_status eg_ds_idset_put(eg_ds_idset *s, const char *key, int64_t val, eg_error *err);
/* Insert key with val, or give a key already there the new val (the last one wins). */
eg_status eg_ds_idset_set(eg_ds_idset *s, const char *key, int64_t val, eg_error *err);

#endif
