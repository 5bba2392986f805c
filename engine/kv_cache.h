/* kv_cache.h — the paged BF16 MLA latent cache and its block manager.
 *
 * Storage: for each local layer, [n_blocks][BS][C+DR] bf16 in backend memory (one
 * allocation). Each sequence slot has a block table [MB] mapping logical block i
 * (positions i*BS .. i*BS+BS-1) to a physical block. The manager is host-side and
 * backend-neutral, so the CPU and CUDA backends (and every pipeline stage) share it.
 * The cache is always BF16 in `generate`: there is no FP8 option, by design
 * (docs/ENGINE.md). eg_kv_set_dtype swaps in a measurement cache (FP32, FP8) for
 * `eaglegen fidelity` only (backend.h's eg_kv_dtype; docs/FIDELITY.md).
 * Ownership: eg_kv_create returns a cache the caller frees with eg_kv_free (NULL ok);
 * it borrows the backend, which must outlive it.
 * Thread safety: reserve, release and sync_table take the cache's lock, so a
 * scheduler thread may map blocks for one slot while a stage thread runs a step over
 * other slots; everything else is one thread at a time. */
#ifndef EG_KV_CACHE_H
#define EG_KV_CACHE_H

#include <pthread.h>

#include "engine/backend.h"

typedef struct eg_kv_cache {
    eg_backend *be;
    int n_layers;        /* local layers */
    int width;           /* C + DR */
    int block_size;      /* BS tokens per block */
    int64_t n_blocks;    /* physical blocks per layer */
    int n_slots;         /* S */
    int max_blocks;      /* MB per slot */
    int32_t *table;      /* [S][MB] host; -1 = unmapped */
    int32_t *n_mapped;   /* [S] blocks mapped per slot */
    int32_t *free_list;  /* [n_blocks] stack of free physical blocks */
    int64_t n_free;
    eg_kv_layer *layers; /* [n_layers] views into storage */
    uint16_t *storage;   /* [n_layers][n_blocks][BS][width] bf16, backend memory
                            (measurement dtypes: [n_layers][n_blocks][BS] rows of row_bytes) */
    eg_kv_dtype dtype;   /* EG_KV_BF16 unless eg_kv_set_dtype changed it */
    int row_bytes;       /* bytes per token per layer: 2 * width for BF16 */
    int32_t *table_dev;  /* [S][MB] backend copy */
    int table_dirty;
    pthread_mutex_t lock; /* guards table, n_mapped, free_list, n_free, table_dirty */
} eg_kv_cache;

eg_status eg_kv_create(eg_backend *be, int n_layers, int width, int block_size, int64_t n_blocks, int n_slots,
                       int max_seq_len, eg_kv_cache **out, eg_error *err);
void eg_kv_free(eg_kv_cache *kv);
/* Blocks needed to hold n tokens. */
int64_t eg_kv_blocks_for(const eg_kv_cache *kv, int64_t n_tokens);
/* Map blocks so the slot holds positions [0, n_tokens). Fails (EG_ERR_NOMEM, nothing
 * changed) when not enough blocks are free. */
eg_status eg_kv_reserve(eg_kv_cache *kv, int slot, int64_t n_tokens, eg_error *err);
/* Return all of a slot's blocks to the free list. */
void eg_kv_release(eg_kv_cache *kv, int slot);
/* Upload the block table if it changed. */
eg_status eg_kv_sync_table(eg_kv_cache *kv, eg_error *err);
/* Replace the storage by one of element type dtype (backend.h), for `eaglegen fidelity`
 * only; latent_width is C (the rest of width is k_pe). Call before any step: the cache's
 * contents are not kept. Blocks and tables are unchanged. */
eg_status eg_kv_set_dtype(eg_kv_cache *kv, eg_kv_dtype dtype, int latent_width, eg_error *err);
/* Bytes of one cached row of that dtype for a latent of C values and k_pe of DR. */
int eg_kv_row_bytes(eg_kv_dtype dtype, int C, int DR);
/* Bytes per cached token (all local layers). */
int64_t eg_kv_bytes_per_token(const eg_kv_cache *kv);

#endif
