/* Committed-shard check; see shardcheck.h. */
#include "dataset/shardcheck.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/eg_hash.h"
#include "common/eg_thread.h"
#include "dataset/reader.h"

const char *eg_ds_shard_state_name(eg_ds_shard_state s) {
    switch (s) {
    case EG_DS_SHARD_OK: return "ok";
    case EG_DS_SHARD_MISSING: return "missing";
    case EG_DS_SHARD_SIZE: return "wrong size";
    case EG_DS_SHARD_CHECKSUM: return "checksum differs";
    case EG_DS_SHARD_INDEX: return "index unreadable";
    }
    return "?";
}

typedef struct {
    const char *dir;
    const eg_ds_info *info;
    eg_ds_shard_check *out;
} check_ctx;

static void check_one(const check_ctx *c, int i) {
    const eg_ds_shard_info *s = &c->info->shards[i];
    eg_ds_shard_check *o = &c->out[i];
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", c->dir, s->file);
    o->state = EG_DS_SHARD_OK;
    o->why[0] = 0;
    struct stat sb;
    if (stat(p, &sb)) {
        o->state = EG_DS_SHARD_MISSING;
        snprintf(o->why, sizeof o->why, "%s", strerror(errno));
        return;
    }
    if ((int64_t)sb.st_size != s->bytes) {
        o->state = EG_DS_SHARD_SIZE;
        snprintf(o->why, sizeof o->why, "size %lld bytes, the manifest says %lld", (long long)sb.st_size,
                 (long long)s->bytes);
        return;
    }
    eg_error e = {0};
    if (s->sha256[0]) {
        char hx[65];
        if (eg_sha256_file(p, hx, &e)) {
            o->state = EG_DS_SHARD_MISSING;
            snprintf(o->why, sizeof o->why, "%s", e.msg);
            return;
        }
        if (strcmp(hx, s->sha256)) {
            o->state = EG_DS_SHARD_CHECKSUM;
            snprintf(o->why, sizeof o->why, "sha256 %.16s..., the manifest says %.16s...", hx, s->sha256);
            return;
        }
    }
    eg_ds_trailer tr;
    eg_ds_index ix;
    uint64_t size;
    if (eg_ds_shard_load_index(p, &tr, &ix, &size, &e)) {
        o->state = EG_DS_SHARD_INDEX;
        snprintf(o->why, sizeof o->why, "%s", e.msg);
        return;
    }
    if ((int64_t)ix.n != s->samples) {
        o->state = EG_DS_SHARD_INDEX;
        snprintf(o->why, sizeof o->why, "index lists %" PRIu64 " samples, the manifest says %lld", ix.n,
                 (long long)s->samples);
    }
    eg_ds_index_clear(&ix);
}

static void check_range(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    for (int64_t i = b; i < e; i++) check_one(ctx, (int)i);
}

eg_status eg_ds_check_shards(const char *dir, const eg_ds_info *info, int threads, eg_ds_shard_check *out,
                             int *n_bad, eg_error *err) {
    *n_bad = 0;
    if (info->n_shards <= 0) return EG_OK;
    int nt = threads > 0 ? threads : eg_num_threads();
    if (nt > info->n_shards) nt = info->n_shards;
    eg_pool *pool = NULL;
    if (nt > 1) {
        eg_status st = eg_pool_create(nt, &pool, err);
        if (st) return st;
    }
    check_ctx c = {dir, info, out};
    eg_pool_for(pool, info->n_shards, 1, check_range, &c);
    eg_pool_free(pool);
    for (int i = 0; i < info->n_shards; i++) *n_bad += out[i].state != EG_DS_SHARD_OK;
    return EG_OK;
}
