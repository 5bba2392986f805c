/* kv_cache.h — the paged BF16 MLA latent cache and its block manager.
 *
 * Storage: for each local layer, [n_blocks][BS][C+DR] bf16 in backend memory (one
 * allocation). Each sequence slot has a block table [MB] mapping logical block i
 * (positions i*BS .. i*BS+BS-1) to a physical block. The manager is host-side and
 * backend-neutral, so the CPU and CUDA backends (and every pipeline stage) share it.
 * The cache is always BF16 in `generate`: there is no FP8 option, by design
 * (docs/ENGINE.md). eg_kv_set_dtype swaps in a measurement cache (FP32, FP8) for
 * `eaglegen fidelity` only (backend.h's eg_kv_dtype; docs/FIDELITY.md).
 *
 * Blocks are mapped on demand: eg_kv_reserve grows a slot to hold n tokens (the engine
 * calls it as a sequence grows), eg_kv_release returns all of a slot's blocks,
 * eg_kv_truncate those past a length (speculative decoding's rollback). A
 * preempted sequence's blocks can be copied to host memory and back, exactly
 * (eg_kv_save / eg_kv_load, the backend's copy ops).
 *
 * The device copy of the table is refreshed by eg_kv_sync_table, which uploads only the
 * rows changed since the last upload, coalesced into at most a few copies of at most
 * EG_KV_UPLOAD_PIECE bytes each: small enough that the CUDA backend stages each one
 * through its ring of pinned, event-guarded buffers and returns without waiting for the
 * device (backend_cuda.c, "Small to_device copies"), so a table change never costs a
 * stream synchronise.
 *
 * Ownership: eg_kv_create returns a cache the caller frees with eg_kv_free (NULL ok);
 * it borrows the backend, which must outlive it.
 * Thread safety: reserve, release, truncate, free_blocks, slot_blocks and sync_table take the
 * cache's lock, so a scheduler thread may map blocks for one slot while a stage thread
 * runs a step over other slots; save and load drive the backend and run on a thread
 * allowed to drive it while no step is in flight; everything else is one thread at a
 * time. */
#ifndef EG_KV_CACHE_H
#define EG_KV_CACHE_H

#include <pthread.h>

#include "engine/backend.h"

/* Largest single table upload (bytes): under the CUDA backend's 1 MiB staging slot. */
#define EG_KV_UPLOAD_PIECE ((size_t)512 << 10)

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
    uint8_t *row_dirty;  /* [S] 1 = the row changed since the last upload */
    int n_dirty;         /* rows with row_dirty set */
    int64_t upload_bytes;  /* table bytes uploaded so far (tests, accounting) */
    int64_t upload_calls;  /* to_device calls made for them */
    pthread_mutex_t lock; /* guards table, n_mapped, free_list, n_free, row_dirty, n_dirty, upload_* */
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
/* Return the slot's blocks past those holding positions [0, n_tokens) (speculative
 * decoding rolls a sequence back past its first rejected draft); n_tokens >= the
 * mapped length changes nothing. The rows kept are untouched. */
void eg_kv_truncate(eg_kv_cache *kv, int slot, int64_t n_tokens);
/* Free blocks now. */
int64_t eg_kv_free_blocks(eg_kv_cache *kv);
/* Blocks mapped to a slot now. */
int eg_kv_slot_blocks(eg_kv_cache *kv, int slot);
/* Upload the changed rows of the block table (see the header comment). */
eg_status eg_kv_sync_table(eg_kv_cache *kv, eg_error *err);
/* Replace the storage by one of element type dtype (backend.h), for `eaglegen fidelity`
 * only; latent_width is C (the rest of width is k_pe). Call before any step: the cache's
 * contents are not kept. Blocks and tables are unchanged. */
eg_status eg_kv_set_dtype(eg_kv_cache *kv, eg_kv_dtype dtype, int latent_width, eg_error *err);
/* Bytes of one cached row of that dtype for a latent of C values and k_pe of DR. */
int eg_kv_row_bytes(eg_kv_dtype dtype, int C, int DR);
/* Bytes per cached token (all local layers). */
int64_t eg_kv_bytes_per_token(const eg_kv_cache *kv);
/* Host bytes eg_kv_save writes for n_blocks blocks: n_layers * n_blocks * BS * width * 2. */
int64_t eg_kv_save_bytes(const eg_kv_cache *kv, int64_t n_blocks);
/* Copy the slot's first n_blocks mapped blocks of every local layer to host, laid out
 * [n_layers][n_blocks][BS][width] bf16: the exact bytes. Uses to_host, so the data is
 * complete after the backend's sync (pinned host memory makes the copies asynchronous). */
eg_status eg_kv_save(eg_kv_cache *kv, int slot, int n_blocks, uint16_t *host, eg_error *err);
/* The reverse: write host (as eg_kv_save laid it out) into the slot's first n_blocks
 * mapped blocks, which the caller reserved. */
eg_status eg_kv_load(eg_kv_cache *kv, int slot, int n_blocks, const uint16_t *host, eg_error *err);

#endif
