/* Paged latent cache manager; see kv_cache.h. */
#include "engine/kv_cache.h"

#include <stdlib.h>

eg_status eg_kv_create(eg_backend *be, int n_layers, int width, int block_size, int64_t n_blocks, int n_slots,
                       int max_seq_len, eg_kv_cache **out, eg_error *err) {
    *out = NULL;
    if (block_size < 1 || n_slots < 1 || max_seq_len < 1 || n_blocks < 1 || width < 1)
        return eg_fail(err, EG_ERR_INVALID, "kv cache: bad geometry (block %d, slots %d, max_seq_len %d, blocks %lld)",
                       block_size, n_slots, max_seq_len, (long long)n_blocks);
    eg_kv_cache *kv = eg_calloc(1, sizeof *kv, err);
    if (!kv) return EG_ERR_NOMEM;
    kv->be = be;
    pthread_mutex_init(&kv->lock, NULL);
    kv->n_layers = n_layers;
    kv->width = width;
    kv->row_bytes = 2 * width;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->n_slots = n_slots;
    kv->max_blocks = (max_seq_len + block_size - 1) / block_size;
    size_t tab = (size_t)n_slots * (size_t)kv->max_blocks;
    kv->table = eg_malloc(sizeof(int32_t) * tab, err);
    kv->n_mapped = eg_calloc((size_t)n_slots, sizeof(int32_t), err);
    kv->free_list = eg_malloc(sizeof(int32_t) * (size_t)n_blocks, err);
    kv->layers = eg_calloc((size_t)(n_layers > 0 ? n_layers : 1), sizeof *kv->layers, err);
    kv->row_dirty = eg_malloc((size_t)n_slots, err);
    if (!kv->table || !kv->n_mapped || !kv->free_list || !kv->layers || !kv->row_dirty) {
        eg_kv_free(kv);
        return EG_ERR_NOMEM;
    }
    for (size_t i = 0; i < tab; i++) kv->table[i] = -1;
    for (int64_t i = 0; i < n_blocks; i++) kv->free_list[i] = (int32_t)(n_blocks - 1 - i);
    kv->n_free = n_blocks;
    size_t per_layer = (size_t)n_blocks * (size_t)block_size * (size_t)width;
    eg_status st;
    if (n_layers > 0) {
        st = be->ops->alloc(be, sizeof(uint16_t) * per_layer * (size_t)n_layers, (void **)&kv->storage, err);
        if (st) { eg_wrap(err, "allocating the KV cache (%lld blocks of %d tokens)", (long long)n_blocks, block_size); eg_kv_free(kv); return st; }
    }
    for (int l = 0; l < n_layers; l++)
        kv->layers[l] = (eg_kv_layer){.data = kv->storage + per_layer * (size_t)l, .row_bytes = kv->row_bytes};
    st = be->ops->alloc(be, sizeof(int32_t) * tab, (void **)&kv->table_dev, err);
    if (st) { eg_kv_free(kv); return st; }
    memset(kv->row_dirty, 1, (size_t)n_slots); /* the device copy starts as garbage */
    kv->n_dirty = n_slots;
    *out = kv;
    return EG_OK;
}

void eg_kv_free(eg_kv_cache *kv) {
    if (!kv) return;
    if (kv->storage) kv->be->ops->release(kv->be, kv->storage);
    if (kv->table_dev) kv->be->ops->release(kv->be, kv->table_dev);
    free(kv->table);
    free(kv->n_mapped);
    free(kv->free_list);
    free(kv->layers);
    free(kv->row_dirty);
    pthread_mutex_destroy(&kv->lock);
    free(kv);
}

int64_t eg_kv_blocks_for(const eg_kv_cache *kv, int64_t n) { return (n + kv->block_size - 1) / kv->block_size; }

static void mark_dirty(eg_kv_cache *kv, int slot) {
    if (!kv->row_dirty[slot]) {
        kv->row_dirty[slot] = 1;
        kv->n_dirty++;
    }
}

static eg_status reserve_locked(eg_kv_cache *kv, int slot, int64_t n_tokens, eg_error *err) {
    if (slot < 0 || slot >= kv->n_slots) return eg_fail(err, EG_ERR_INVALID, "kv cache: slot %d out of range", slot);
    int64_t need = eg_kv_blocks_for(kv, n_tokens);
    if (need > kv->max_blocks)
        return eg_fail(err, EG_ERR_INVALID, "kv cache: %lld tokens exceed the maximum sequence length %lld",
                       (long long)n_tokens, (long long)kv->max_blocks * kv->block_size);
    int64_t more = need - kv->n_mapped[slot];
    if (more <= 0) return EG_OK;
    if (more > kv->n_free)
        return eg_fail(err, EG_ERR_NOMEM, "kv cache: need %lld blocks, %lld free", (long long)more, (long long)kv->n_free);
    int32_t *row = kv->table + (int64_t)slot * kv->max_blocks;
    while (kv->n_mapped[slot] < need) row[kv->n_mapped[slot]++] = kv->free_list[--kv->n_free];
    mark_dirty(kv, slot);
    return EG_OK;
}

eg_status eg_kv_reserve(eg_kv_cache *kv, int slot, int64_t n_tokens, eg_error *err) {
    pthread_mutex_lock(&kv->lock);
    eg_status st = reserve_locked(kv, slot, n_tokens, err);
    pthread_mutex_unlock(&kv->lock);
    return st;
}

void eg_kv_release(eg_kv_cache *kv, int slot) {
    if (!kv || slot < 0 || slot >= kv->n_slots) return;
    pthread_mutex_lock(&kv->lock);
    int32_t *row = kv->table + (int64_t)slot * kv->max_blocks;
    if (kv->n_mapped[slot] > 0) mark_dirty(kv, slot);
    while (kv->n_mapped[slot] > 0) {
        int i = --kv->n_mapped[slot];
        kv->free_list[kv->n_free++] = row[i];
        row[i] = -1;
    }
    pthread_mutex_unlock(&kv->lock);
}

void eg_kv_truncate(eg_kv_cache *kv, int slot, int64_t n_tokens) {
    if (!kv || slot < 0 || slot >= kv->n_slots) return;
    pthread_mutex_lock(&kv->lock);
    int64_t keep = eg_kv_blocks_for(kv, n_tokens > 0 ? n_tokens : 0);
    int32_t *row = kv->table + (int64_t)slot * kv->max_blocks;
    if (kv->n_mapped[slot] > keep) mark_dirty(kv, slot);
    while (kv->n_mapped[slot] > keep) { /* the last mapped first: the free list gets them back in order */
        int i = --kv->n_mapped[slot];
        kv->free_list[kv->n_free++] = row[i];
        row[i] = -1;
    }
    pthread_mutex_unlock(&kv->lock);
}

int64_t eg_kv_free_blocks(eg_kv_cache *kv) {
    pthread_mutex_lock(&kv->lock);
    int64_t n = kv->n_free;
    pthread_mutex_unlock(&kv->lock);
    return n;
}

int eg_kv_slot_blocks(eg_kv_cache *kv, int slot) {
    if (slot < 0 || slot >= kv->n_slots) return 0;
    pthread_mutex_lock(&kv->lock);
    int n = kv->n_mapped[slot];
    pthread_mutex_unlock(&kv->lock);
    return n;
}

/* Upload rows [r0, r1) in pieces of at most EG_KV_UPLOAD_PIECE bytes. */
static eg_status upload_rows(eg_kv_cache *kv, int r0, int r1, eg_error *err) {
    const char *src = (const char *)(kv->table + (int64_t)r0 * kv->max_blocks);
    char *dst = (char *)(kv->table_dev + (int64_t)r0 * kv->max_blocks);
    size_t left = sizeof(int32_t) * (size_t)(r1 - r0) * (size_t)kv->max_blocks;
    while (left > 0) {
        size_t n = left < EG_KV_UPLOAD_PIECE ? left : EG_KV_UPLOAD_PIECE;
        eg_status st = kv->be->ops->to_device(kv->be, dst, src, n, err);
        if (st) return eg_wrap(err, "uploading the KV block table");
        kv->upload_bytes += (int64_t)n;
        kv->upload_calls++;
        src += n;
        dst += n;
        left -= n;
    }
    return EG_OK;
}

/* Runs of changed rows, each uploaded with its own copy; past this many runs, one copy
 * of the span from the first changed row to the last (clean rows rewritten unchanged)
 * costs less than the calls. */
#define EG_KV_MAX_RUNS 8

eg_status eg_kv_sync_table(eg_kv_cache *kv, eg_error *err) {
    eg_status st = EG_OK;
    pthread_mutex_lock(&kv->lock);
    if (kv->n_dirty > 0) {
        int first = -1, last = -1, runs = 0;
        for (int r = 0; r < kv->n_slots; r++)
            if (kv->row_dirty[r]) {
                if (first < 0) first = r;
                if (last != r - 1) runs++;
                last = r;
            }
        if (runs > EG_KV_MAX_RUNS) {
            st = upload_rows(kv, first, last + 1, err);
        } else {
            for (int r = first; r <= last && !st;) {
                if (!kv->row_dirty[r]) { r++; continue; }
                int end = r;
                while (end <= last && kv->row_dirty[end]) end++;
                st = upload_rows(kv, r, end, err);
                r = end;
            }
        }
        /* the host rows were copied out during the calls (staged), so the lock covers it */
        if (!st) {
            memset(kv->row_dirty, 0, (size_t)kv->n_slots);
            kv->n_dirty = 0;
        }
    }
    pthread_mutex_unlock(&kv->lock);
    return st;
}

int64_t eg_kv_bytes_per_token(const eg_kv_cache *kv) { return (int64_t)kv->n_layers * kv->row_bytes; }

int eg_kv_row_bytes(eg_kv_dtype dtype, int C, int DR) {
    switch (dtype) {
    case EG_KV_FP32: return 4 * (C + DR);
    case EG_KV_FP8: return (C + DR + 3) / 4 * 4;
    case EG_KV_FP8_TILE: return ((C + 3) / 4 * 4 + 4 * ((C + 127) / 128) + 2 * DR + 3) / 4 * 4;
    default: return 2 * (C + DR);
    }
}

eg_status eg_kv_set_dtype(eg_kv_cache *kv, eg_kv_dtype dtype, int latent_width, eg_error *err) {
    if (latent_width < 1 || latent_width > kv->width)
        return eg_fail(err, EG_ERR_INVALID, "kv cache: latent width %d outside 1..%d", latent_width, kv->width);
    int rb = eg_kv_row_bytes(dtype, latent_width, kv->width - latent_width);
    size_t per_layer = (size_t)kv->n_blocks * (size_t)kv->block_size * (size_t)rb; /* bytes */
    void *mem = NULL;
    if (kv->n_layers > 0) {
        /* rows of a multiple of 4 bytes, so FP32 values and scales stay aligned */
        eg_status st = kv->be->ops->alloc(kv->be, per_layer * (size_t)kv->n_layers, &mem, err);
        if (st) return eg_wrap(err, "allocating the %d-byte-row measurement KV cache", rb);
        if (kv->storage) kv->be->ops->release(kv->be, kv->storage);
    }
    kv->storage = mem;
    kv->dtype = dtype;
    kv->row_bytes = rb;
    for (int l = 0; l < kv->n_layers; l++)
        kv->layers[l] = (eg_kv_layer){.data = (uint16_t *)((char *)mem + per_layer * (size_t)l), .dtype = dtype,
                                      .row_bytes = rb};
    return EG_OK;
}

int64_t eg_kv_save_bytes(const eg_kv_cache *kv, int64_t n_blocks) {
    return (int64_t)kv->n_layers * n_blocks * kv->block_size * kv->row_bytes;
}

/* Copy n_blocks blocks of slot between cache and host, one copy per run of physically
 * consecutive blocks per layer. */
static eg_status move_blocks(eg_kv_cache *kv, int slot, int n_blocks, uint16_t *host, int save, eg_error *err) {
    if (slot < 0 || slot >= kv->n_slots || n_blocks < 0)
        return eg_fail(err, EG_ERR_INVALID, "kv cache: slot %d / %d blocks out of range", slot, n_blocks);
    pthread_mutex_lock(&kv->lock);
    int mapped = kv->n_mapped[slot];
    pthread_mutex_unlock(&kv->lock);
    if (n_blocks > mapped)
        return eg_fail(err, EG_ERR_INVALID, "kv cache: slot %d maps %d blocks, %d asked to be %s", slot, mapped,
                       n_blocks, save ? "saved" : "loaded");
    /* the row of a slot no step is running on: only this thread changes it */
    const int32_t *row = kv->table + (int64_t)slot * kv->max_blocks;
    size_t blk = (size_t)kv->block_size * (size_t)kv->row_bytes; /* bytes per block */
    for (int l = 0; l < kv->n_layers; l++) {
        char *h = (char *)host + (size_t)l * (size_t)n_blocks * blk;
        for (int j = 0; j < n_blocks;) {
            int run = 1;
            while (j + run < n_blocks && row[j + run] == row[j] + run) run++;
            char *d = (char *)kv->layers[l].data + (size_t)row[j] * blk;
            size_t bytes = blk * (size_t)run;
            eg_status st = save ? kv->be->ops->to_host(kv->be, h + (size_t)j * blk, d, bytes, err)
                                : kv->be->ops->to_device(kv->be, d, h + (size_t)j * blk, bytes, err);
            if (st) return eg_wrap(err, "%s slot %d's KV blocks (layer %d)", save ? "saving" : "loading", slot, l);
            j += run;
        }
    }
    return EG_OK;
}

eg_status eg_kv_save(eg_kv_cache *kv, int slot, int n_blocks, uint16_t *host, eg_error *err) {
    return move_blocks(kv, slot, n_blocks, host, 1, err);
}

eg_status eg_kv_load(eg_kv_cache *kv, int slot, int n_blocks, const uint16_t *host, eg_error *err) {
    return move_blocks(kv, slot, n_blocks, (uint16_t *)host, 0, err);
}
