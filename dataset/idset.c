/* String set; see idset.h. */
#include "dataset/idset.h"

#include <stdlib.h>

static uint64_t fnv(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void eg_ds_idset_clear(eg_ds_idset *s) {
    if (!s) return;
    for (size_t i = 0; i < s->cap; i++) free(s->keys[i]);
    free(s->keys);
    free(s->vals);
    memset(s, 0, sizeof *s);
}

int eg_ds_idset_get(const eg_ds_idset *s, const char *key, int64_t *val) {
    if (!s->cap) return 0;
    for (size_t i = fnv(key) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (!s->keys[i]) return 0;
        if (!strcmp(s->keys[i], key)) {
            if (val) *val = s->vals[i];
            return 1;
        }
    }
}

static void place(char **keys, int64_t *vals, size_t cap, char *k, int64_t v) {
    size_t i = fnv(k) & (cap - 1);
    while (keys[i]) i = (i + 1) & (cap - 1);
    keys[i] = k;
    vals[i] = v;
}

eg_status eg_ds_idset_put(eg_ds_idset *s, const char *key, int64_t val, eg_error *err) {
    if (eg_ds_idset_get(s, key, NULL)) return EG_OK;
    if ((s->n + 1) * 2 > s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        char **nk = calloc(nc, sizeof *nk);
        int64_t *nv = calloc(nc, sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory (id set)");
        }
        for (size_t i = 0; i < s->cap; i++)
            if (s->keys[i]) place(nk, nv, nc, s->keys[i], s->vals[i]);
        free(s->keys);
        free(s->vals);
        s->keys = nk;
        s->vals = nv;
        s->cap = nc;
    }
    char *k = strdup(key);
    if (!k) return eg_fail(err, EG_ERR_NOMEM, "out of memory (id set)");
    place(s->keys, s->vals, s->cap, k, val);
    s->n++;
    return EG_OK;
}

eg_status eg_ds_idset_set(eg_ds_idset *s, const char *key, int64_t val, eg_error *err) {
    for (size_t i = s->cap ? fnv(key) & (s->cap - 1) : 0; s->cap && s->keys[i]; i = (i + 1) & (s->cap - 1))
        if (!strcmp(s->keys[i], key)) {
            s->vals[i] = val;
            return EG_OK;
        }
    return eg_ds_idset_put(s, key, val, err);
}
