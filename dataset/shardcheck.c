/* Committed-shard check; see shardcheck.h. */
#include "dataset/shardcheck.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---------------------------------------------------------------- stamps */
int eg_ds_stamp_of(const char *path, eg_ds_stamp *out) {
    struct stat sb;
    if (stat(path, &sb)) return 0;
    out->size = (int64_t)sb.st_size;
    out->ino = (int64_t)sb.st_ino;
    out->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
    out->ctime_ns = (int64_t)sb.st_ctim.tv_sec * 1000000000 + sb.st_ctim.tv_nsec;
    return 1;
}

static int stamp_eq(const eg_ds_stamp *a, const eg_ds_stamp *b) {
    return a->size == b->size && a->ino == b->ino && a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

void eg_ds_stamps_clear(eg_ds_stamps *s) {
    if (!s) return;
    eg_ds_idset_clear(&s->index);
    free(s->st);
    memset(s, 0, sizeof *s);
}

const eg_ds_stamp *eg_ds_stamps_get(const eg_ds_stamps *s, const char *file) {
    int64_t k;
    return s && eg_ds_idset_get(&s->index, file, &k) ? &s->st[k] : NULL;
}

eg_status eg_ds_stamps_set(eg_ds_stamps *s, const char *file, const eg_ds_stamp *st, eg_error *err) {
    int64_t k;
    if (eg_ds_idset_get(&s->index, file, &k)) {
        s->st[k] = *st;
        return EG_OK;
    }
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        eg_ds_stamp *q = realloc(s->st, sizeof *q * (size_t)cap);
        if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (shard stamps)");
        s->st = q;
        s->cap = cap;
    }
    eg_status e = eg_ds_idset_put(&s->index, file, s->n, err);
    if (e) return e;
    s->st[s->n++] = *st;
    return EG_OK;
}

static void stamps_path(char *p, size_t n, const char *dir, const char *manifest) {
    snprintf(p, n, "%s/.stamps.%s", dir, manifest);
}

eg_status eg_ds_stamps_load(const char *dir, const char *manifest, eg_ds_stamps *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    char p[4096];
    stamps_path(p, sizeof p, dir, manifest);
    json_t *j = json_load_file(p, 0, NULL);
    json_t *sh = json_object_get(j, "shards");
    const char *file;
    json_t *v;
    eg_status st = EG_OK;
    json_object_foreach(sh, file, v) {
        if (!json_is_array(v) || json_array_size(v) != 4) continue;
        eg_ds_stamp s = {json_integer_value(json_array_get(v, 0)), json_integer_value(json_array_get(v, 1)),
                         json_integer_value(json_array_get(v, 2)), json_integer_value(json_array_get(v, 3))};
        if ((st = eg_ds_stamps_set(out, file, &s, err))) break;
    }
    json_decref(j);
    if (st) eg_ds_stamps_clear(out);
    return st;
}

eg_status eg_ds_stamps_save(const char *dir, const char *manifest, const eg_ds_stamps *s, const eg_ds_info *info,
                            eg_error *err) {
    json_t *sh = json_object(), *root = json_pack("{s:i, s:o}", "version", 1, "shards", sh);
    if (!root) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    for (int i = 0; i < info->n_shards; i++) {
        const eg_ds_stamp *x = eg_ds_stamps_get(s, info->shards[i].file);
        if (x && json_object_set_new(sh, info->shards[i].file,
                                     json_pack("[I, I, I, I]", (json_int_t)x->size, (json_int_t)x->ino,
                                               (json_int_t)x->mtime_ns, (json_int_t)x->ctime_ns))) {
            json_decref(root);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        }
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    char name[512];
    snprintf(name, sizeof name, ".stamps.%s", manifest);
    eg_status st = eg_ds_write_atomic(dir, name, text, strlen(text), err);
    free(text);
    return st;
}

/* ---------------------------------------------------------------- checks */
typedef struct {
    const char *dir;
    const eg_ds_info *info;
    const eg_ds_stamps *stamps;
    eg_ds_shard_check *out;
} check_ctx;

static void check_one(const check_ctx *c, int i) {
    const eg_ds_shard_info *s = &c->info->shards[i];
    eg_ds_shard_check *o = &c->out[i];
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", c->dir, s->file);
    o->state = EG_DS_SHARD_OK;
    o->why[0] = 0;
    o->hashed = 0;
    if (!eg_ds_stamp_of(p, &o->stamp)) {
        o->state = EG_DS_SHARD_MISSING;
        snprintf(o->why, sizeof o->why, "%s", strerror(errno));
        return;
    }
    if (o->stamp.size != s->bytes) {
        o->state = EG_DS_SHARD_SIZE;
        snprintf(o->why, sizeof o->why, "size %lld bytes, the manifest says %lld", (long long)o->stamp.size,
                 (long long)s->bytes);
        return;
    }
    eg_error e = {0};
    const eg_ds_stamp *known = eg_ds_stamps_get(c->stamps, s->file);
    if (s->sha256[0] && !(known && stamp_eq(known, &o->stamp))) {
        o->hashed = 1;
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

eg_status eg_ds_check_shards(const char *dir, const eg_ds_info *info, int threads, const eg_ds_stamps *stamps,
                             eg_ds_shard_check *out, int *n_bad, eg_error *err) {
    *n_bad = 0;
    if (info->n_shards <= 0) return EG_OK;
    int nt = threads > 0 ? threads : eg_num_threads();
    if (nt > info->n_shards) nt = info->n_shards;
    eg_pool *pool = NULL;
    if (nt > 1) {
        eg_status st = eg_pool_create(nt, &pool, err);
        if (st) return st;
    }
    check_ctx c = {dir, info, stamps, out};
    eg_pool_for(pool, info->n_shards, 1, check_range, &c);
    eg_pool_free(pool);
    for (int i = 0; i < info->n_shards; i++) *n_bad += out[i].state != EG_DS_SHARD_OK;
    return EG_OK;
}
