/* safetensors_write.c — safetensors header (safetensors_write.h). */
#include "dataset/safetensors_write.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

eg_status eg_st_header(const eg_st_desc *d, int n, uint8_t **out, size_t *len, uint64_t *data_bytes, eg_error *err) {
    *out = NULL;
    size_t cap = 64;
    for (int i = 0; i < n; i++) cap += strlen(d[i].name) + strlen(d[i].dtype) + 96 + 24 * (size_t)d[i].ndim;
    char *j = eg_malloc(cap + 8, err);
    if (!j) return EG_ERR_NOMEM;
    size_t k = 0;
    uint64_t off = 0;
    j[k++] = '{';
    for (int i = 0; i < n; i++) {
        if (strpbrk(d[i].name, "\"\\")) {
            free(j);
            return eg_fail(err, EG_ERR_INVALID, "safetensors: tensor name '%s' needs escaping", d[i].name);
        }
        uint64_t cnt = 1;
        k += (size_t)snprintf(j + k, cap - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", d[i].name, d[i].dtype);
        for (int a = 0; a < d[i].ndim; a++) {
            if (d[i].shape[a] < 0) {
                free(j);
                return eg_fail(err, EG_ERR_INVALID, "safetensors: tensor '%s' dim %d is %" PRId64, d[i].name, a, d[i].shape[a]);
            }
            cnt *= (uint64_t)d[i].shape[a];
            k += (size_t)snprintf(j + k, cap - k, "%s%" PRId64, a ? "," : "", d[i].shape[a]);
        }
        uint64_t end = off + cnt * d[i].elem;
        k += (size_t)snprintf(j + k, cap - k, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, end);
        off = end;
    }
    j[k++] = '}';
    while (k % 8) j[k++] = ' ';
    uint8_t *b = eg_malloc(8 + k, err);
    if (!b) {
        free(j);
        return EG_ERR_NOMEM;
    }
    uint64_t hl = k;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
    memcpy(b + 8, j, k);
    free(j);
    *out = b;
    *len = 8 + k;
    *data_bytes = off;
    return EG_OK;
}
