/* The done log; see donelog.h. */
#include "gen/donelog.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/eg_hash.h"
#include "dataset/idset.h"

struct gen_donelog {
    FILE *f;
    char path[4096];
    eg_ds_idset ids; /* id -> hash (as int64) */
};

uint64_t gen_record_hash(const int32_t *ids, size_t n) {
    eg_sha256 c;
    eg_sha256_init(&c);
    for (size_t i = 0; i < n; i++) {
        uint8_t b[4] = {(uint8_t)ids[i], (uint8_t)(ids[i] >> 8), (uint8_t)(ids[i] >> 16), (uint8_t)(ids[i] >> 24)};
        eg_sha256_update(&c, b, 4);
    }
    uint8_t d[32];
    eg_sha256_final(&c, d);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h = h << 8 | d[i];
    return h;
}

eg_status gen_donelog_open(const char *dir, const char *name, gen_donelog **out, eg_error *err) {
    *out = NULL;
    gen_donelog *d = eg_calloc(1, sizeof *d, err);
    if (!d) return EG_ERR_NOMEM;
    snprintf(d->path, sizeof d->path, "%s/%s", dir, name);
    eg_status st = EG_OK;
    FILE *r = fopen(d->path, "r");
    if (r) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        off_t good = 0;
        uint64_t lineno = 0;
        while (!st && (len = getline(&line, &cap, r)) > 0) {
            lineno++;
            if (line[len - 1] != '\n') break; /* torn by a crash */
            json_t *j = json_loadb(line, (size_t)len, 0, NULL);
            const char *id = json_string_value(json_object_get(j, "id"));
            const char *hx = json_string_value(json_object_get(j, "tokens_hash"));
            char *e = NULL;
            uint64_t h = hx ? strtoull(hx, &e, 16) : 0;
            if (!id || !hx || *e || strlen(hx) != 16)
                st = eg_fail(err, EG_ERR_FORMAT,
                             "%s:%" PRIu64 ": damaged line (want {\"id\": ..., \"tokens_hash\": 16 hex digits}); "
                             "fix or remove the line",
                             d->path, lineno);
            else st = eg_ds_idset_set(&d->ids, id, (int64_t)h, err); /* a sample made again: its last line */
            json_decref(j);
            good += len;
        }
        free(line);
        fclose(r);
        if (!st && truncate(d->path, good)) st = eg_fail(err, EG_ERR_IO, "%s: %s", d->path, strerror(errno));
    }
    if (!st && !(d->f = fopen(d->path, "a"))) st = eg_fail(err, EG_ERR_IO, "%s: %s", d->path, strerror(errno));
    if (st) { gen_donelog_close(d); return st; }
    *out = d;
    return EG_OK;
}

void gen_donelog_close(gen_donelog *d) {
    if (!d) return;
    if (d->f) { fflush(d->f); fsync(fileno(d->f)); fclose(d->f); }
    eg_ds_idset_clear(&d->ids);
    free(d);
}

int gen_donelog_get(const gen_donelog *d, const char *id, uint64_t *hash) {
    int64_t v;
    if (!eg_ds_idset_get(&d->ids, id, &v)) return 0;
    *hash = (uint64_t)v;
    return 1;
}

eg_status gen_donelog_add(gen_donelog *d, const char *id, uint64_t hash, eg_error *err) {
    json_t *j = json_pack("{s:s, s:s}", "id", id, "tokens_hash", "");
    char hx[17];
    snprintf(hx, sizeof hx, "%016" PRIx64, hash);
    if (!j || json_object_set_new(j, "tokens_hash", json_string(hx))) {
        json_decref(j);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    int bad = fprintf(d->f, "%s\n", s) < 0 || fflush(d->f);
    free(s);
    if (bad) return eg_fail(err, EG_ERR_IO, "%s: %s", d->path, strerror(errno));
    return eg_ds_idset_set(&d->ids, id, (int64_t)hash, err);
}

eg_status gen_donelog_sync(gen_donelog *d, eg_error *err) {
    if (fflush(d->f) || fsync(fileno(d->f))) return eg_fail(err, EG_ERR_IO, "%s: %s", d->path, strerror(errno));
    return EG_OK;
}
