/* torchsave.c — torch.save's zip + pickle format without torch (torchsave.h). */
#define _POSIX_C_SOURCE 200809L
#include "dataset/torchsave.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 64 /* torch's kFieldAlignment: each member's data starts at a multiple of 64 */
#define PREFIX "archive/"

size_t eg_pt_dtype_size(eg_pt_dtype t) {
    switch (t) {
    case EG_PT_I64: return 8;
    case EG_PT_I32: case EG_PT_F32: return 4;
    case EG_PT_BF16: return 2;
    case EG_PT_U8: case EG_PT_BOOL: return 1;
    }
    return 0;
}

const char *eg_pt_storage_name(eg_pt_dtype t) {
    switch (t) {
    case EG_PT_I64: return "LongStorage";
    case EG_PT_I32: return "IntStorage";
    case EG_PT_U8: return "ByteStorage";
    case EG_PT_BOOL: return "BoolStorage";
    case EG_PT_BF16: return "BFloat16Storage";
    case EG_PT_F32: return "FloatStorage";
    }
    return NULL;
}

/* ---- CRC-32 (zip's, incremental) */
static uint32_t crc_table[256];
static int crc_ready;
static uint32_t crc_update(uint32_t c, const void *data, size_t n) {
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE)) { /* benign race: same table */
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t v = i;
            for (int k = 0; k < 8; k++) v = v & 1 ? 0xedb88320u ^ (v >> 1) : v >> 1;
            crc_table[i] = v;
        }
        __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
    }
    const uint8_t *p = data;
    c = ~c;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return ~c;
}

/* ---- a growable byte buffer */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put1(buf *b, uint8_t v) { put(b, &v, 1); }
static void put2(buf *b, uint16_t v) { uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; put(b, x, 2); }
static void put4(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

/* ---- pickle protocol 2 */
static void pk_str(buf *b, const char *s) { /* BINUNICODE */
    put1(b, 'X');
    put4(b, (uint32_t)strlen(s));
    put(b, s, strlen(s));
}
static void pk_int(buf *b, int64_t v) {
    if (v >= 0 && v < 256) { put1(b, 'K'); put1(b, (uint8_t)v); }
    else if (v >= 0 && v < 65536) { put1(b, 'M'); put2(b, (uint16_t)v); }
    else if (v >= INT32_MIN && v <= INT32_MAX) { put1(b, 'J'); put4(b, (uint32_t)(int32_t)v); }
    else { /* LONG1: 8 bytes, two's complement little-endian */
        put1(b, 0x8a);
        put1(b, 8);
        for (int i = 0; i < 8; i++) put1(b, (uint8_t)((uint64_t)v >> (8 * i)));
    }
}
static void pk_global(buf *b, const char *module, const char *name) {
    put1(b, 'c');
    put(b, module, strlen(module));
    put1(b, '\n');
    put(b, name, strlen(name));
    put1(b, '\n');
}
static void pk_tuple(buf *b, const int64_t *v, int n) {
    if (!n) { put1(b, ')'); return; }
    put1(b, '(');
    for (int i = 0; i < n; i++) pk_int(b, v[i]);
    put1(b, 't');
}

static void pickle_dict(buf *b, const eg_pt_tensor *t, int n) {
    put1(b, 0x80);
    put1(b, 2); /* PROTO 2 */
    put1(b, '}');
    if (n) put1(b, '(');
    for (int i = 0; i < n; i++) {
        int64_t numel = 1, stride[EG_PT_MAX_DIMS];
        for (int d = t[i].ndim - 1; d >= 0; d--) {
            stride[d] = numel;
            numel *= t[i].shape[d];
        }
        char key[24];
        snprintf(key, sizeof key, "%d", i);
        pk_str(b, t[i].name);
        pk_global(b, "torch._utils", "_rebuild_tensor_v2");
        put1(b, '(');
        put1(b, '('); /* persistent id of the storage */
        pk_str(b, "storage");
        pk_global(b, "torch", eg_pt_storage_name(t[i].dtype));
        pk_str(b, key);
        pk_str(b, "cpu");
        pk_int(b, numel);
        put1(b, 't');
        put1(b, 'Q'); /* BINPERSID */
        pk_int(b, 0);  /* storage offset */
        pk_tuple(b, t[i].shape, t[i].ndim);
        pk_tuple(b, stride, t[i].ndim);
        put1(b, 0x89); /* NEWFALSE: requires_grad */
        pk_global(b, "collections", "OrderedDict");
        put1(b, ')');
        put1(b, 'R'); /* OrderedDict() : backward hooks */
        put1(b, 't');
        put1(b, 'R');
    }
    if (n) put1(b, 'u');
    put1(b, '.');
}

/* ---- zip (stored members) */
typedef struct {
    char *name;
    uint32_t crc;
    uint64_t size, offset;
} member;

typedef struct {
    int fd;
    const char *path;
    uint64_t off;
    member *m;
    int n, cap;
    eg_error *err;
} zipw;

static eg_status wr(zipw *z, const void *d, size_t n) {
    const uint8_t *p = d;
    while (n) {
        ssize_t w = write(z->fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return eg_fail(z->err, EG_ERR_IO, "%s: write: %s", z->path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
        z->off += (uint64_t)w;
    }
    return EG_OK;
}

/* One stored member from pieces (data may be split so a converted prefix needs no copy). */
static eg_status zip_member(zipw *z, const char *name, const void *data, uint64_t size) {
    char full[256];
    if (snprintf(full, sizeof full, PREFIX "%s", name) >= (int)sizeof full)
        return eg_fail(z->err, EG_ERR_INVALID, "%s: member name %s too long", z->path, name);
    size_t nl = strlen(full);
    if (size >= 0xffffffffu || z->off + 30 + nl + ALIGN + 4 + size >= 0xffffffffu)
        return eg_fail(z->err, EG_ERR_INVALID,
                       "%s: member %s of %" PRIu64 " bytes takes the file past 4 GiB, which needs zip64 (not written); "
                       "cut samples with --max-len",
                       z->path, full, size);
    if (z->n == z->cap) {
        int c = z->cap ? 2 * z->cap : 8;
        member *q = realloc(z->m, sizeof *q * (size_t)c);
        if (!q) return eg_fail(z->err, EG_ERR_NOMEM, "%s: out of memory", z->path);
        z->m = q;
        z->cap = c;
    }
    member *m = &z->m[z->n];
    m->name = strdup(full);
    if (!m->name) return eg_fail(z->err, EG_ERR_NOMEM, "%s: out of memory", z->path);
    z->n++;
    m->crc = crc_update(0, data, (size_t)size);
    m->size = size;
    m->offset = z->off;
    /* pad the local header's extra field ("FB" id, as torch) so the data lands on ALIGN */
    uint64_t start = z->off + 30 + nl;
    size_t pad = (size_t)((ALIGN - (start + 4) % ALIGN) % ALIGN);
    buf h = {0};
    put4(&h, 0x04034b50);
    put2(&h, 20);       /* version needed */
    put2(&h, 0);        /* flags */
    put2(&h, 0);        /* stored */
    put2(&h, 0);        /* time */
    put2(&h, 0x21);     /* date 1980-01-01 */
    put4(&h, m->crc);
    put4(&h, (uint32_t)size);
    put4(&h, (uint32_t)size);
    put2(&h, (uint16_t)nl);
    put2(&h, (uint16_t)(4 + pad));
    put(&h, full, nl);
    put2(&h, 0x4246); /* "FB" */
    put2(&h, (uint16_t)pad);
    for (size_t i = 0; i < pad; i++) put1(&h, 'Z');
    if (h.oom) return eg_fail(z->err, EG_ERR_NOMEM, "%s: out of memory", z->path);
    eg_status st = wr(z, h.p, h.n);
    free(h.p);
    if (!st && size) st = wr(z, data, (size_t)size);
    return st;
}

static eg_status zip_finish(zipw *z) {
    buf c = {0};
    uint64_t cd = z->off;
    for (int i = 0; i < z->n; i++) {
        member *m = &z->m[i];
        size_t nl = strlen(m->name);
        put4(&c, 0x02014b50);
        put2(&c, 20); /* made by */
        put2(&c, 20); /* needed */
        put2(&c, 0);
        put2(&c, 0);
        put2(&c, 0);
        put2(&c, 0x21);
        put4(&c, m->crc);
        put4(&c, (uint32_t)m->size);
        put4(&c, (uint32_t)m->size);
        put2(&c, (uint16_t)nl);
        put2(&c, 0); /* extra */
        put2(&c, 0); /* comment */
        put2(&c, 0); /* disk */
        put2(&c, 0); /* internal attributes */
        put4(&c, 0); /* external attributes */
        put4(&c, (uint32_t)m->offset);
        put(&c, m->name, nl);
    }
    uint64_t cds = c.n;
    if (cd + cds + 22 >= 0xffffffffu) {
        free(c.p);
        return eg_fail(z->err, EG_ERR_INVALID, "%s: file past 4 GiB needs zip64 (not written); cut samples with --max-len",
                       z->path);
    }
    put4(&c, 0x06054b50);
    put2(&c, 0);
    put2(&c, 0);
    put2(&c, (uint16_t)z->n);
    put2(&c, (uint16_t)z->n);
    put4(&c, (uint32_t)cds);
    put4(&c, (uint32_t)cd);
    put2(&c, 0);
    if (c.oom) return eg_fail(z->err, EG_ERR_NOMEM, "%s: out of memory", z->path);
    eg_status st = wr(z, c.p, c.n);
    free(c.p);
    return st;
}

eg_status eg_torch_save(const char *dir, const char *name, const eg_pt_tensor *t, int n, uint64_t *bytes,
                        eg_error *err) {
    if (n < 0 || n > 60000) return eg_fail(err, EG_ERR_INVALID, "torch_save %s: %d tensors", name, n);
    for (int i = 0; i < n; i++) {
        if (t[i].ndim < 0 || t[i].ndim > EG_PT_MAX_DIMS || !eg_pt_storage_name(t[i].dtype))
            return eg_fail(err, EG_ERR_INVALID, "torch_save %s: tensor %s: bad rank or dtype", name, t[i].name);
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0)
                return eg_fail(err, EG_ERR_INVALID, "torch_save %s: tensor %s: negative dimension", name, t[i].name);
    }
    char path[4096], tmp[4200];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return eg_fail(err, EG_ERR_INVALID, "path %s/%s too long", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    buf pk = {0};
    pickle_dict(&pk, t, n);
    if (pk.oom) return eg_fail(err, EG_ERR_NOMEM, "%s: out of memory", path);
    zipw z = {.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), .path = tmp, .err = err};
    eg_status st = EG_OK;
    if (z.fd < 0) {
        free(pk.p);
        return eg_fail(err, EG_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    st = zip_member(&z, "data.pkl", pk.p, pk.n);
    if (!st) st = zip_member(&z, "byteorder", "little", 6);
    for (int i = 0; !st && i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) numel *= (uint64_t)t[i].shape[d];
        char mn[32];
        snprintf(mn, sizeof mn, "data/%d", i);
        st = zip_member(&z, mn, t[i].data, numel * eg_pt_dtype_size(t[i].dtype));
    }
    if (!st) st = zip_member(&z, "version", "3\n", 2);
    if (!st) st = zip_finish(&z);
    if (!st && fsync(z.fd)) st = eg_fail(err, EG_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(z.fd) && !st) st = eg_fail(err, EG_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path)) st = eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
    else if (bytes) *bytes = z.off;
    for (int i = 0; i < z.n; i++) free(z.m[i].name);
    free(z.m);
    free(pk.p);
    return st;
}
