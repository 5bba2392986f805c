/* safetensors reader (mmap + strict header validation) and atomic streaming writer;
 * see safetensors.h. */
#include "engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; a real shard's header is
 * well under 1 MB, so this only stops a hostile length from allocating gigabytes. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

static const struct {
    const char *name;
    size_t size;
} st_dtypes[EG_ST_NDTYPES] = {
    [EG_ST_F64] = {"F64", 8},   [EG_ST_F32] = {"F32", 4},   [EG_ST_F16] = {"F16", 2},
    [EG_ST_BF16] = {"BF16", 2}, [EG_ST_I64] = {"I64", 8},   [EG_ST_I32] = {"I32", 4},
    [EG_ST_I16] = {"I16", 2},   [EG_ST_I8] = {"I8", 1},     [EG_ST_U8] = {"U8", 1},
    [EG_ST_BOOL] = {"BOOL", 1}, [EG_ST_F8_E4M3] = {"F8_E4M3", 1},
};

const char *eg_st_dtype_name(eg_st_dtype t) {
    return (unsigned)t < EG_ST_NDTYPES ? st_dtypes[t].name : "?";
}

size_t eg_st_dtype_size(eg_st_dtype t) { return (unsigned)t < EG_ST_NDTYPES ? st_dtypes[t].size : 0; }

eg_status eg_st_dtype_parse(const char *name, eg_st_dtype *out, eg_error *err) {
    for (int i = 0; i < EG_ST_NDTYPES; i++)
        if (!strcmp(name, st_dtypes[i].name)) {
            *out = (eg_st_dtype)i;
            return EG_OK;
        }
    return eg_fail(err, EG_ERR_UNSUPPORTED,
                   "unsupported dtype \"%.40s\" (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 "
                   "BOOL F8_E4M3)",
                   name);
}

/* ---------------------------------------------------------------- reader */

struct eg_st_file {
    char *path;
    const uint8_t *map; /* whole file */
    uint64_t size;
    int mapped;         /* 1: munmap on close */
    int n;
    eg_st_tensor *t;    /* [n] */
    int *slots;         /* [cap] index+1 into t, 0 empty */
    uint64_t cap;
    char *names;        /* arena of tensor names and metadata strings */
    int n_meta;
    const char **meta;  /* [2*n_meta] key, value */
};

static uint64_t st_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void eg_st_close(eg_st_file *f) {
    if (!f) return;
    if (f->mapped && f->map) munmap((void *)f->map, f->size);
    free(f->path);
    free(f->t);
    free(f->slots);
    free(f->names);
    free(f->meta);
    free(f);
}

const char *eg_st_path(const eg_st_file *f) { return f->path; }
uint64_t eg_st_file_size(const eg_st_file *f) { return f->size; }
int eg_st_count(const eg_st_file *f) { return f->n; }
const eg_st_tensor *eg_st_at(const eg_st_file *f, int i) {
    return (i >= 0 && i < f->n) ? &f->t[i] : NULL;
}

const eg_st_tensor *eg_st_find(const eg_st_file *f, const char *name) {
    if (!f->cap) return NULL;
    uint64_t i = st_hash(name) & (f->cap - 1);
    while (f->slots[i]) {
        const eg_st_tensor *t = &f->t[f->slots[i] - 1];
        if (!strcmp(t->name, name)) return t;
        i = (i + 1) & (f->cap - 1);
    }
    return NULL;
}

const char *eg_st_meta(const eg_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}
int eg_st_meta_count(const eg_st_file *f) { return f->n_meta; }
void eg_st_meta_at(const eg_st_file *f, int i, const char **key, const char **value) {
    *key = f->meta[2 * i];
    *value = f->meta[2 * i + 1];
}

void eg_st_advise(const eg_st_file *f, int advice) {
    if (f->mapped && f->map) madvise((void *)f->map, f->size, advice);
}

int eg_st_aligned(const eg_st_tensor *t) {
    size_t a = eg_st_dtype_size(t->dtype);
    return a <= 1 || ((uintptr_t)t->data % a) == 0;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

eg_status eg_st_get(const eg_st_file *f, const char *name, eg_st_dtype dtype, int ndim,
                    const int64_t *shape, const eg_st_tensor **out, eg_error *err) {
    const eg_st_tensor *t = eg_st_find(f, name);
    *out = NULL;
    if (!t) return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s missing", f->path, name);
    if (t->dtype != dtype)
        return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s has dtype %s, expected %s", f->path, name,
                       eg_st_dtype_name(t->dtype), eg_st_dtype_name(dtype));
    if (shape) {
        int ok = t->ndim == ndim;
        for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
        if (!ok) {
            char a[256], b[256];
            shape_str(a, sizeof a, t->ndim, t->shape);
            shape_str(b, sizeof b, ndim, shape);
            return eg_fail(err, EG_ERR_FORMAT, "%s: tensor %s has shape %s, expected %s", f->path,
                           name, a, b);
        }
    }
    *out = t;
    return EG_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const eg_st_tensor *x = *(const eg_st_tensor *const *)a, *y = *(const eg_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Parse f->map[0..size). */
static eg_status st_parse(eg_st_file *f, eg_error *err) {
    const char *P = f->path;
    if (f->size < 8)
        return eg_fail(err, EG_ERR_FORMAT, "%s: truncated: %llu bytes, no safetensors header", P,
                       (unsigned long long)f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i];
    if (hlen > f->size - 8)
        return eg_fail(err, EG_ERR_FORMAT,
                       "%s: truncated or corrupt: header length %llu exceeds file size %llu", P,
                       (unsigned long long)hlen, (unsigned long long)f->size);
    if (hlen > ST_MAX_HEADER)
        return eg_fail(err, EG_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", P,
                       (unsigned long long)hlen);
    if (hlen < 2 || f->map[8] != '{')
        return eg_fail(err, EG_ERR_FORMAT, "%s: corrupt header (does not start with '{')", P);
    const uint64_t data0 = 8 + hlen, dlen = f->size - data0;

    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return eg_fail(err, EG_ERR_FORMAT, "%s: corrupt header JSON at byte %d: %s", P,
                       je.position, je.text);
    eg_status st = EG_OK;
    if (!json_is_object(root)) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: header is not a JSON object", P);
        goto out;
    }
    size_t nkeys = json_object_size(root), arena = 1;
    const char *key;
    json_t *val;
    json_t *meta = json_object_get(root, "__metadata__");
    if (meta) {
        if (!json_is_object(meta)) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: __metadata__ is not an object", P);
            goto out;
        }
        json_object_foreach(meta, key, val) {
            if (!json_is_string(val)) {
                st = eg_fail(err, EG_ERR_FORMAT, "%s: __metadata__.%.200s is not a string", P, key);
                goto out;
            }
            arena += strlen(key) + json_string_length(val) + 2;
        }
        nkeys--;
    }
    json_object_foreach(root, key, val) arena += strlen(key) + 1;
    if (nkeys > (size_t)INT_MAX / 2) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: too many tensors", P);
        goto out;
    }
    f->t = calloc(nkeys ? nkeys : 1, sizeof *f->t);
    f->names = malloc(arena);
    f->meta = calloc(meta ? 2 * json_object_size(meta) + 1 : 1, sizeof *f->meta);
    f->cap = 16;
    while (f->cap < 2 * (uint64_t)nkeys) f->cap <<= 1;
    f->slots = calloc(f->cap, sizeof *f->slots);
    if (!f->t || !f->names || !f->meta || !f->slots) {
        st = eg_fail(err, EG_ERR_NOMEM, "%s: out of memory parsing header", P);
        goto out;
    }
    char *ap = f->names;
    if (meta) {
        json_object_foreach(meta, key, val) {
            size_t kl = strlen(key), vl = json_string_length(val);
            memcpy(ap, key, kl + 1);
            f->meta[2 * f->n_meta] = ap;
            ap += kl + 1;
            memcpy(ap, json_string_value(val), vl);
            ap[vl] = 0;
            f->meta[2 * f->n_meta + 1] = ap;
            ap += vl + 1;
            f->n_meta++;
        }
    }
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        eg_st_tensor *t = &f->t[f->n];
        if (!*key) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: a tensor has an empty name", P);
            goto out;
        }
        if (!json_is_object(val)) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: tensor %.200s: entry is not an object", P, key);
            goto out;
        }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
            json_array_size(jo) != 2) {
            st = eg_fail(err, EG_ERR_FORMAT,
                         "%s: tensor %.200s: needs string dtype, array shape, 2-element data_offsets",
                         P, key);
            goto out;
        }
        if (eg_st_dtype_parse(json_string_value(jd), &t->dtype, err)) {
            st = eg_wrap(err, "%s: tensor %.200s", P, key);
            goto out;
        }
        size_t nd = json_array_size(js);
        if (nd > EG_ST_MAX_DIMS) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: tensor %.200s: %zu dimensions (max %d)", P, key,
                         nd, EG_ST_MAX_DIMS);
            goto out;
        }
        t->ndim = (int)nd;
        int64_t ne = 1;
        int overflow = 0;
        for (size_t i = 0; i < nd; i++) {
            json_t *d = json_array_get(js, i);
            if (!json_is_integer(d) || json_integer_value(d) < 0) {
                st = eg_fail(err, EG_ERR_FORMAT, "%s: tensor %.200s: shape[%zu] is not a "
                             "non-negative integer", P, key, i);
                goto out;
            }
            int64_t v = (int64_t)json_integer_value(d);
            t->shape[i] = v;
            if (v && ne > INT64_MAX / v) overflow = 1;
            else ne *= v;
        }
        size_t es = eg_st_dtype_size(t->dtype);
        if (!overflow && ne > (int64_t)(UINT64_MAX / 2 / es)) overflow = 1;
        if (overflow) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: tensor %.200s: shape overflows", P, key);
            goto out;
        }
        t->nelem = ne;
        t->nbytes = (uint64_t)ne * es;
        json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
        if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
            json_integer_value(e) < json_integer_value(b)) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: tensor %.200s: bad data_offsets", P, key);
            goto out;
        }
        uint64_t ob = (uint64_t)json_integer_value(b), oe = (uint64_t)json_integer_value(e);
        if (oe > dlen) {
            st = eg_fail(err, EG_ERR_FORMAT,
                         "%s: truncated: tensor %.200s ends at data byte %llu but the file has "
                         "only %llu data bytes", P, key, (unsigned long long)oe,
                         (unsigned long long)dlen);
            goto out;
        }
        if (oe - ob != t->nbytes) {
            st = eg_fail(err, EG_ERR_FORMAT,
                         "%s: tensor %.200s: data_offsets span %llu bytes but %s shape needs %llu",
                         P, key, (unsigned long long)(oe - ob), eg_st_dtype_name(t->dtype),
                         (unsigned long long)t->nbytes);
            goto out;
        }
        t->offset = data0 + ob;
        t->data = f->map + t->offset;
        size_t kl = strlen(key);
        memcpy(ap, key, kl + 1);
        t->name = ap;
        ap += kl + 1;
        uint64_t h = st_hash(t->name) & (f->cap - 1);
        while (f->slots[h]) h = (h + 1) & (f->cap - 1); /* names are unique (JSON_REJECT_DUPLICATES) */
        f->slots[h] = f->n + 1;
        f->n++;
    }
    /* No two non-empty tensors may share bytes. */
    if (f->n > 1) {
        const eg_st_tensor **ord = malloc((size_t)f->n * sizeof *ord);
        if (!ord) {
            st = eg_fail(err, EG_ERR_NOMEM, "%s: out of memory", P);
            goto out;
        }
        int m = 0;
        for (int i = 0; i < f->n; i++)
            if (f->t[i].nbytes) ord[m++] = &f->t[i];
        qsort(ord, (size_t)m, sizeof *ord, cmp_begin);
        for (int i = 1; i < m; i++)
            if (ord[i]->offset < ord[i - 1]->offset + ord[i - 1]->nbytes) {
                st = eg_fail(err, EG_ERR_FORMAT, "%s: tensors %.200s and %.200s overlap", P,
                             ord[i - 1]->name, ord[i]->name);
                break;
            }
        free(ord);
    }
out:
    json_decref(root);
    return st;
}

static eg_status st_new(const char *path, eg_st_file **out, eg_error *err) {
    eg_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path ? path : "(memory)"))) {
        free(f);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    *out = f;
    return EG_OK;
}

eg_status eg_st_open_memory(const void *buf, size_t len, const char *what, eg_st_file **out,
                            eg_error *err) {
    *out = NULL;
    eg_st_file *f;
    eg_status st = st_new(what, &f, err);
    if (st) return st;
    f->map = buf;
    f->size = len;
    if ((st = st_parse(f, err))) {
        eg_st_close(f);
        return st;
    }
    *out = f;
    return EG_OK;
}

eg_status eg_st_open(const char *path, eg_st_file **out, eg_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        eg_status s = eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return eg_fail(err, EG_ERR_IO, "%s: not a regular file", path);
    }
    eg_st_file *f;
    eg_status st = st_new(path, &f, err);
    if (st) {
        close(fd);
        return st;
    }
    f->size = (uint64_t)sb.st_size;
    if (f->size >= 8) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            st = eg_fail(err, EG_ERR_IO, "%s: mmap: %s", path, strerror(errno));
            close(fd);
            eg_st_close(f);
            return st;
        }
        f->map = m;
        f->mapped = 1;
    }
    close(fd);
    if ((st = st_parse(f, err))) {
        eg_st_close(f);
        return st;
    }
    *out = f;
    return EG_OK;
}

/* ---------------------------------------------------------------- writer */

enum { W_BORROW, W_COPY, W_FILL };

typedef struct st_wt {
    char *name;
    eg_st_dtype dtype;
    int ndim;
    int64_t shape[EG_ST_MAX_DIMS];
    uint64_t nbytes;
    int kind;
    const void *data;
    void *owned;
    eg_st_fill_fn fill;
    void *ctx;
    int seq;
} st_wt;

struct eg_st_writer {
    st_wt *t;
    int n, cap;
    char **meta; /* [2*n_meta] */
    int n_meta, meta_cap;
};

eg_status eg_st_writer_new(eg_st_writer **out, eg_error *err) {
    *out = calloc(1, sizeof **out);
    return *out ? EG_OK : eg_fail(err, EG_ERR_NOMEM, "out of memory");
}

void eg_st_writer_free(eg_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].owned);
    }
    for (int i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->meta);
    free(w->t);
    free(w);
}

static eg_status w_push(eg_st_writer *w, const char *name, eg_st_dtype dtype, int ndim,
                        const int64_t *shape, st_wt **out, eg_error *err) {
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return eg_fail(err, EG_ERR_INVALID, "safetensors writer: invalid tensor name");
    if ((unsigned)dtype >= EG_ST_NDTYPES || ndim < 0 || ndim > EG_ST_MAX_DIMS)
        return eg_fail(err, EG_ERR_INVALID, "safetensors writer: %s: bad dtype or ndim", name);
    uint64_t ne = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] && ne > (UINT64_MAX / 16) / (uint64_t)shape[i]))
            return eg_fail(err, EG_ERR_INVALID, "safetensors writer: %s: bad shape", name);
        ne *= (uint64_t)shape[i];
    }
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 64;
        st_wt *nt = realloc(w->t, (size_t)nc * sizeof *nt);
        if (!nt) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        w->t = nt;
        w->cap = nc;
    }
    st_wt *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = ne * eg_st_dtype_size(dtype);
    t->seq = w->n;
    w->n++;
    *out = t;
    return EG_OK;
}

eg_status eg_st_writer_add(eg_st_writer *w, const char *name, eg_st_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, eg_error *err) {
    st_wt *t;
    eg_status st = w_push(w, name, dtype, ndim, shape, &t, err);
    if (st) return st;
    t->kind = W_BORROW;
    t->data = data;
    return EG_OK;
}

eg_status eg_st_writer_add_copy(eg_st_writer *w, const char *name, eg_st_dtype dtype, int ndim,
                                const int64_t *shape, const void *data, eg_error *err) {
    st_wt *t;
    eg_status st = w_push(w, name, dtype, ndim, shape, &t, err);
    if (st) return st;
    t->kind = W_COPY;
    t->owned = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->owned) return eg_fail(err, EG_ERR_NOMEM, "out of memory copying tensor %s", name);
    if (t->nbytes) memcpy(t->owned, data, t->nbytes);
    t->data = t->owned;
    return EG_OK;
}

eg_status eg_st_writer_add_fill(eg_st_writer *w, const char *name, eg_st_dtype dtype, int ndim,
                                const int64_t *shape, eg_st_fill_fn fill, void *ctx,
                                eg_error *err) {
    st_wt *t;
    eg_status st = w_push(w, name, dtype, ndim, shape, &t, err);
    if (st) return st;
    t->kind = W_FILL;
    t->fill = fill;
    t->ctx = ctx;
    return EG_OK;
}

eg_status eg_st_writer_meta(eg_st_writer *w, const char *key, const char *value, eg_error *err) {
    for (int i = 0; i < w->n_meta; i++)
        if (!strcmp(w->meta[2 * i], key)) {
            char *v = strdup(value);
            if (!v) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return EG_OK;
        }
    if (w->n_meta == w->meta_cap) {
        int nc = w->meta_cap ? 2 * w->meta_cap : 8;
        char **nm = realloc(w->meta, (size_t)nc * 2 * sizeof *nm);
        if (!nm) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        w->meta = nm;
        w->meta_cap = nc;
    }
    w->meta[2 * w->n_meta] = strdup(key);
    w->meta[2 * w->n_meta + 1] = strdup(value);
    w->n_meta++;
    if (!w->meta[2 * w->n_meta - 2] || !w->meta[2 * w->n_meta - 1])
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    return EG_OK;
}

/* Largest element first (what the reference library does), then insertion order, so
 * contiguous data keeps every tensor aligned to its element size. */
static int cmp_layout(const void *a, const void *b) {
    const st_wt *x = *(const st_wt *const *)a, *y = *(const st_wt *const *)b;
    size_t sx = eg_st_dtype_size(x->dtype), sy = eg_st_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return x->seq - y->seq;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_wt *const *)a)->name, (*(const st_wt *const *)b)->name);
}

/* Build the padded header. Returns malloc'd bytes (8-byte length prefix included). */
static eg_status w_header(eg_st_writer *w, st_wt **ord, char **out, size_t *outlen,
                          eg_error *err) {
    json_t *root = json_object();
    eg_status st = EG_OK;
    if (!root) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    if (w->n_meta) {
        json_t *m = json_object();
        for (int i = 0; i < w->n_meta; i++)
            json_object_set_new(m, w->meta[2 * i], json_string(w->meta[2 * i + 1]));
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        st_wt *t = ord[i];
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(sh, json_integer(t->shape[d]));
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + t->nbytes)));
        off += t->nbytes;
        json_object_set_new(e, "dtype", json_string(eg_st_dtype_name(t->dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        if (json_object_set_new(root, t->name, e)) {
            st = eg_fail(err, EG_ERR_NOMEM, "out of memory building header");
            break;
        }
    }
    char *js = st ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (st) return st;
    if (!js) return eg_fail(err, EG_ERR_NOMEM, "out of memory dumping header");
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
    char *buf = malloc(8 + padded);
    if (!buf) {
        free(js);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < 8; i++) buf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
    memcpy(buf + 8, js, jl);
    memset(buf + 8 + jl, ' ', padded - jl);
    free(js);
    *out = buf;
    *outlen = 8 + padded;
    return EG_OK;
}

uint64_t eg_st_writer_size(const eg_st_writer *w) {
    /* Exact: builds the header once. Only used for planning, so the cost is fine. */
    st_wt **ord = malloc((size_t)(w->n ? w->n : 1) * sizeof *ord);
    if (!ord) return 0;
    for (int i = 0; i < w->n; i++) ord[i] = &w->t[i];
    qsort(ord, (size_t)w->n, sizeof *ord, cmp_layout);
    char *h;
    size_t hl;
    eg_error e;
    uint64_t total = 0;
    if (!w_header((eg_st_writer *)w, ord, &h, &hl, &e)) {
        total = hl;
        for (int i = 0; i < w->n; i++) total += w->t[i].nbytes;
        free(h);
    }
    free(ord);
    return total;
}

static eg_status write_all(int fd, const void *p, size_t n, const char *path, eg_error *err) {
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return eg_fail(err, EG_ERR_IO, "%s: write: %s", path, strerror(errno));
        }
        c += k;
        n -= (size_t)k;
    }
    return EG_OK;
}

#define W_BUF ((size_t)16 << 20)

eg_status eg_st_writer_write(eg_st_writer *w, const char *path, eg_error *err) {
    eg_status st = EG_OK;
    st_wt **ord = malloc((size_t)(w->n ? w->n : 1) * sizeof *ord);
    char *hdr = NULL, *buf = NULL, *tmp = NULL;
    int fd = -1;
    if (!ord) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    for (int i = 0; i < w->n; i++) ord[i] = &w->t[i];
    qsort(ord, (size_t)w->n, sizeof *ord, cmp_name);
    for (int i = 1; i < w->n; i++)
        if (!strcmp(ord[i]->name, ord[i - 1]->name)) {
            st = eg_fail(err, EG_ERR_INVALID, "%s: tensor %s added twice", path, ord[i]->name);
            goto out;
        }
    qsort(ord, (size_t)w->n, sizeof *ord, cmp_layout);
    size_t hl;
    if ((st = w_header(w, ord, &hdr, &hl, err))) goto out;
    size_t pl = strlen(path) + 32;
    tmp = malloc(pl);
    buf = malloc(W_BUF);
    if (!tmp || !buf) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto out;
    }
    snprintf(tmp, pl, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = eg_fail(err, EG_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    if ((st = write_all(fd, hdr, hl, tmp, err))) goto out;
    size_t bl = 0;
    for (int i = 0; i < w->n; i++) {
        st_wt *t = ord[i];
        uint64_t done = 0;
        if (t->kind == W_FILL && !t->fill && t->nbytes) {
            /* zeros: flush, then leave a hole; ftruncate below fixes the size */
            if (bl && (st = write_all(fd, buf, bl, tmp, err))) goto out;
            bl = 0;
            if (lseek(fd, (off_t)t->nbytes, SEEK_CUR) < 0) {
                st = eg_fail(err, EG_ERR_IO, "%s: lseek: %s", tmp, strerror(errno));
                goto out;
            }
            continue;
        }
        while (done < t->nbytes) {
            if (bl == W_BUF) {
                if ((st = write_all(fd, buf, bl, tmp, err))) goto out;
                bl = 0;
            }
            size_t n = W_BUF - bl;
            if (n > t->nbytes - done) n = (size_t)(t->nbytes - done);
            if (t->kind == W_FILL) {
                if ((st = t->fill(t->ctx, done, buf + bl, n, err))) {
                    eg_wrap(err, "%s: filling tensor %s", path, t->name);
                    goto out;
                }
            } else {
                memcpy(buf + bl, (const char *)t->data + done, n);
            }
            bl += n;
            done += n;
        }
    }
    if (bl && (st = write_all(fd, buf, bl, tmp, err))) goto out;
    {
        off_t end = lseek(fd, 0, SEEK_CUR);
        if (end < 0 || ftruncate(fd, end) != 0) {
            st = eg_fail(err, EG_ERR_IO, "%s: ftruncate: %s", tmp, strerror(errno));
            goto out;
        }
    }
    if (fsync(fd) != 0) {
        st = eg_fail(err, EG_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto out;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = eg_fail(err, EG_ERR_IO, "%s: close: %s", tmp, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        st = eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
        goto out;
    }
    /* fsync the directory so the rename itself survives a crash. */
    {
        char *dir = strdup(path);
        if (dir) {
            char *sl = strrchr(dir, '/');
            const char *d = ".";
            if (sl == dir) d = "/";
            else if (sl) {
                *sl = 0;
                d = dir;
            }
            int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                fsync(dfd);
                close(dfd);
            }
            free(dir);
        }
    }
out:
    if (fd >= 0) close(fd);
    if (st && tmp) unlink(tmp);
    free(tmp);
    free(buf);
    free(hdr);
    free(ord);
    return st;
}
