/* eg_hash.h — SHA-256 for fingerprints (model config, tokenizer, inputs) and shard
 * checksums. Streaming: init, update any number of times, final.
 * Thread safety: a context is used by one thread at a time. */
#ifndef EG_HASH_H
#define EG_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "common/eg_common.h"

typedef struct eg_sha256 {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t nbuf;
} eg_sha256;

void eg_sha256_init(eg_sha256 *c);
void eg_sha256_update(eg_sha256 *c, const void *data, size_t n);
void eg_sha256_final(eg_sha256 *c, uint8_t out[32]);
/* out: 65 bytes, lowercase hex + NUL. */
void eg_sha256_hex(const void *data, size_t n, char out[65]);
void eg_sha256_to_hex(const uint8_t digest[32], char out[65]);
/* Hash a whole file (streamed). */
eg_status eg_sha256_file(const char *path, char out[65], eg_error *err);

#endif
