/* safetensors_write.h — the header of a .safetensors file (8-byte little-endian header
 * length, then the JSON header {"NAME": {"dtype", "shape", "data_offsets"}...}, padded
 * with spaces to a multiple of 8 so the data starts aligned), for writers that stream the
 * tensor bytes themselves right after it, in the order given.
 * Ownership: the returned buffer is the caller's (free).
 * Thread safety: no shared state. */
#ifndef EG_DS_SAFETENSORS_WRITE_H
#define EG_DS_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "common/eg_common.h"

typedef struct eg_st_desc {
    const char *name;  /* plain ASCII, no quote or backslash */
    const char *dtype; /* safetensors dtype: "I64", "BF16", "F32", ... */
    int ndim;
    const int64_t *shape; /* [ndim] */
    size_t elem;          /* bytes per element, consistent with dtype */
} eg_st_desc;

/* Header bytes (length prefix included) for tensors stored back to back in order d[0..n);
 * *data_bytes receives the total data size that must follow. */
eg_status eg_st_header(const eg_st_desc *d, int n, uint8_t **out, size_t *len, uint64_t *data_bytes, eg_error *err);

#endif
