/* arrow_ipc.c — Arrow IPC streaming writer (arrow_ipc.h).
 *
 * Flatbuffers are built front to back: a table's vtable is written just before the table
 * (the table's first 4 bytes, a signed offset, point back to it), and every child a table
 * refers to (strings, vectors, sub-tables) is written after it, its unsigned forward
 * offset patched in once the child's position is known. Schema (Arrow format/Schema.fbs,
 * Message.fbs): Message {version: short = V5, header_type: ubyte, header: offset,
 * bodyLength: long}; Schema {endianness, fields, custom_metadata}; Field {name, nullable,
 * type_type, type, dictionary, children}; Int {bitWidth, is_signed}; List {};
 * RecordBatch {length, nodes: [FieldNode {length, null_count}], buffers: [Buffer {offset,
 * length}]}. */
#include "dataset/arrow_ipc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum { FB_META_V5 = 4, FB_HDR_SCHEMA = 1, FB_HDR_RECORD_BATCH = 3, FB_TYPE_INT = 2, FB_TYPE_LIST = 12 };

/* ---------------------------------------------------------------- flatbuffer builder */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} fb;

static size_t fb_grow(fb *b, size_t add) {
    if (b->oom) return 0;
    if (b->n + add > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + add) nc *= 2;
        uint8_t *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            return 0;
        }
        b->p = q;
        b->cap = nc;
    }
    size_t at = b->n;
    memset(b->p + at, 0, add);
    b->n += add;
    return at;
}

static size_t fb_pad(fb *b, size_t align) {
    size_t r = b->n % align;
    if (r) fb_grow(b, align - r);
    return b->n;
}

static void fb_set(fb *b, size_t at, const void *v, size_t len) {
    if (!b->oom) memcpy(b->p + at, v, len);
}

/* uoffset at position `at` pointing forward to `target` */
static void fb_patch(fb *b, size_t at, size_t target) {
    uint32_t v = (uint32_t)(target - at);
    fb_set(b, at, &v, 4);
}

typedef struct {
    int slot, size; /* size 1, 2, 4, 8 */
    uint64_t val;   /* scalar value (little-endian host assumed, checked in open) */
    size_t *fix;    /* non-NULL: an offset field; receives its position to patch later */
} fb_field;

/* Writes vtable + table; returns the table's position. */
static size_t fb_table(fb *b, int n_slots, fb_field *f, int nf) {
    uint16_t vt[2 + 16] = {0};
    int pos[16];
    size_t cur = 4;
    for (int sz = 8; sz >= 1; sz /= 2)
        for (int i = 0; i < nf; i++) {
            if (f[i].size != sz) continue;
            cur = (cur + (size_t)sz - 1) / (size_t)sz * (size_t)sz;
            pos[i] = (int)cur;
            cur += (size_t)sz;
        }
    vt[0] = (uint16_t)(4 + 2 * n_slots);
    vt[1] = (uint16_t)cur;
    for (int i = 0; i < nf; i++) vt[2 + f[i].slot] = (uint16_t)pos[i];
    size_t v = fb_pad(b, 2);
    size_t at = fb_grow(b, (size_t)vt[0]);
    fb_set(b, at, vt, (size_t)vt[0]);
    size_t t = fb_pad(b, 8);
    fb_grow(b, cur);
    int32_t so = (int32_t)(t - v);
    fb_set(b, t, &so, 4);
    for (int i = 0; i < nf; i++) {
        if (f[i].fix) *f[i].fix = t + (size_t)pos[i];
        else fb_set(b, t + (size_t)pos[i], &f[i].val, (size_t)f[i].size);
    }
    return t;
}

static size_t fb_string(fb *b, const char *s) {
    size_t len = strlen(s);
    size_t at = fb_pad(b, 4);
    fb_grow(b, 4 + len + 1);
    uint32_t n = (uint32_t)len;
    fb_set(b, at, &n, 4);
    fb_set(b, at + 4, s, len);
    return at;
}

/* Vector of n uoffsets; fix[i] receives element i's position. */
static size_t fb_vec_offsets(fb *b, int n, size_t *fix) {
    size_t at = fb_pad(b, 4);
    fb_grow(b, 4 + 4 * (size_t)n);
    uint32_t c = (uint32_t)n;
    fb_set(b, at, &c, 4);
    for (int i = 0; i < n; i++) fix[i] = at + 4 + 4 * (size_t)i;
    return at;
}

/* Vector of n structs of 16 bytes (two int64), the elements 8-byte aligned. */
static size_t fb_vec_pairs(fb *b, const int64_t *v, size_t n) {
    fb_pad(b, 4);
    if (b->n % 8 != 4) fb_grow(b, 4);
    size_t at = fb_grow(b, 4 + 16 * n);
    uint32_t c = (uint32_t)n;
    fb_set(b, at, &c, 4);
    if (n) fb_set(b, at + 4, v, 16 * n);
    return at;
}

/* ---------------------------------------------------------------- writer */
typedef struct {
    int64_t *v; /* list values or scalars */
    int64_t n, cap;
    int32_t *off; /* list: [rows + 1] offsets */
    int64_t off_cap;
    int put; /* set in the current row */
} col_buf;

struct eg_arrow_writer {
    FILE *f;
    int n_cols;
    eg_arrow_column *cols;
    col_buf *b;
    eg_arrow_opts o;
    int64_t batch_n;  /* rows in the current batch */
    int64_t rows;     /* all rows */
    int64_t bytes;
};

static eg_status out_write(eg_arrow_writer *w, const void *p, size_t n, eg_error *err) {
    if (n && fwrite(p, 1, n, w->f) != n) return eg_fail(err, EG_ERR_IO, "arrow: write failed: %s", strerror(errno));
    w->bytes += (int64_t)n;
    return EG_OK;
}

/* A message: continuation marker, metadata length (padded so the body starts 8-aligned),
 * the flatbuffer, padding. */
static eg_status write_message(eg_arrow_writer *w, fb *m, eg_error *err) {
    if (m->oom) return eg_fail(err, EG_ERR_NOMEM, "arrow: out of memory building a message");
    size_t len = (m->n + 7) / 8 * 8;
    uint32_t pre[2] = {0xFFFFFFFFu, (uint32_t)len};
    static const uint8_t zero[8] = {0};
    eg_status st = out_write(w, pre, 8, err);
    if (!st) st = out_write(w, m->p, m->n, err);
    if (!st) st = out_write(w, zero, len - m->n, err);
    return st;
}

static size_t message_header(fb *m, int hdr_type, int64_t body_len, size_t *hdr_fix) {
    size_t root = fb_grow(m, 4);
    fb_field f[] = {{0, 2, FB_META_V5, NULL}, {1, 1, (uint64_t)hdr_type, NULL}, {2, 4, 0, hdr_fix},
                    {3, 8, (uint64_t)body_len, NULL}};
    size_t t = fb_table(m, 5, f, 4);
    fb_patch(m, root, t);
    return t;
}

static size_t int64_type(fb *m) {
    fb_field f[] = {{0, 4, 64, NULL}, {1, 1, 1, NULL}};
    return fb_table(m, 2, f, 2);
}

/* Field table with its children and type; returns its position. */
static size_t field_table(fb *m, const char *name, eg_arrow_kind kind, int child) {
    size_t fix_name, fix_type, fix_children;
    fb_field f[] = {{0, 4, 0, &fix_name},
                    {1, 1, 1, NULL},
                    {2, 1, (uint64_t)(kind == EG_ARROW_LIST_INT64 && !child ? FB_TYPE_LIST : FB_TYPE_INT), NULL},
                    {3, 4, 0, &fix_type},
                    {5, 4, 0, &fix_children}};
    size_t t = fb_table(m, 7, f, 5);
    fb_patch(m, fix_name, fb_string(m, name));
    if (kind == EG_ARROW_LIST_INT64 && !child) {
        fb_patch(m, fix_type, fb_table(m, 0, NULL, 0)); /* List {} */
        size_t cfix;
        fb_patch(m, fix_children, fb_vec_offsets(m, 1, &cfix));
        fb_patch(m, cfix, field_table(m, "item", EG_ARROW_INT64, 1));
    } else {
        fb_patch(m, fix_type, int64_type(m));
        fb_patch(m, fix_children, fb_vec_offsets(m, 0, NULL));
    }
    return t;
}

static eg_status write_schema(eg_arrow_writer *w, eg_error *err) {
    fb m = {0};
    size_t hfix, fix_fields, fix_meta;
    message_header(&m, FB_HDR_SCHEMA, 0, &hfix);
    int has_meta = w->o.meta_key != NULL;
    fb_field f[] = {{0, 2, 0, NULL}, {1, 4, 0, &fix_fields}, {2, 4, 0, &fix_meta}};
    size_t s = fb_table(&m, 4, f, has_meta ? 3 : 2);
    fb_patch(&m, hfix, s);
    size_t *ff = malloc(sizeof *ff * (size_t)w->n_cols);
    if (!ff) {
        free(m.p);
        return eg_fail(err, EG_ERR_NOMEM, "arrow: out of memory");
    }
    fb_patch(&m, fix_fields, fb_vec_offsets(&m, w->n_cols, ff));
    for (int c = 0; c < w->n_cols; c++) fb_patch(&m, ff[c], field_table(&m, w->cols[c].name, w->cols[c].kind, 0));
    free(ff);
    if (has_meta) {
        size_t kvfix, kfix, vfix;
        fb_patch(&m, fix_meta, fb_vec_offsets(&m, 1, &kvfix));
        fb_field kv[] = {{0, 4, 0, &kfix}, {1, 4, 0, &vfix}};
        fb_patch(&m, kvfix, fb_table(&m, 2, kv, 2));
        fb_patch(&m, kfix, fb_string(&m, w->o.meta_key));
        fb_patch(&m, vfix, fb_string(&m, w->o.meta_value ? w->o.meta_value : ""));
    }
    eg_status st = write_message(w, &m, err);
    free(m.p);
    return st;
}

static size_t pad8(size_t n) { return (n + 7) / 8 * 8; }

/* One RecordBatch from the buffered rows: per column (pre-order) a FieldNode, and the
 * buffers validity (empty: no nulls), then offsets + child validity + child values for a
 * list, or values for int64. */
static eg_status flush_batch(eg_arrow_writer *w, eg_error *err) {
    if (!w->batch_n) return EG_OK;
    int nn = 0, nb = 0;
    for (int c = 0; c < w->n_cols; c++) {
        nn += w->cols[c].kind == EG_ARROW_LIST_INT64 ? 2 : 1;
        nb += w->cols[c].kind == EG_ARROW_LIST_INT64 ? 4 : 2;
    }
    int64_t *nodes = calloc((size_t)nn * 2, sizeof *nodes), *bufs = calloc((size_t)nb * 2, sizeof *bufs);
    const void **src = calloc((size_t)nb, sizeof *src);
    if (!nodes || !bufs || !src) {
        free(nodes), free(bufs), free(src);
        return eg_fail(err, EG_ERR_NOMEM, "arrow: out of memory");
    }
    int in = 0, ib = 0;
    size_t body = 0;
#define ADD_BUF(ptr, len)                                                                                                  \
    do {                                                                                                                   \
        bufs[2 * ib] = (int64_t)body;                                                                                      \
        bufs[2 * ib + 1] = (int64_t)(len);                                                                                 \
        src[ib++] = (ptr);                                                                                                 \
        body += pad8((size_t)(len));                                                                                       \
    } while (0)
    for (int c = 0; c < w->n_cols; c++) {
        col_buf *b = &w->b[c];
        nodes[2 * in] = w->batch_n;
        nodes[2 * in++ + 1] = 0;
        ADD_BUF(NULL, 0);
        if (w->cols[c].kind == EG_ARROW_LIST_INT64) {
            ADD_BUF(b->off, 4 * (w->batch_n + 1));
            nodes[2 * in] = b->n;
            nodes[2 * in++ + 1] = 0;
            ADD_BUF(NULL, 0);
        }
        ADD_BUF(b->v, 8 * b->n);
    }
#undef ADD_BUF
    fb m = {0};
    size_t hfix, fix_nodes, fix_bufs;
    message_header(&m, FB_HDR_RECORD_BATCH, (int64_t)body, &hfix);
    fb_field f[] = {{0, 8, (uint64_t)w->batch_n, NULL}, {1, 4, 0, &fix_nodes}, {2, 4, 0, &fix_bufs}};
    fb_patch(&m, hfix, fb_table(&m, 5, f, 3));
    fb_patch(&m, fix_nodes, fb_vec_pairs(&m, nodes, (size_t)nn));
    fb_patch(&m, fix_bufs, fb_vec_pairs(&m, bufs, (size_t)nb));
    eg_status st = write_message(w, &m, err);
    free(m.p);
    static const uint8_t zero[8] = {0};
    for (int i = 0; !st && i < nb; i++) {
        size_t len = (size_t)bufs[2 * i + 1];
        if (len) st = out_write(w, src[i], len, err);
        if (!st) st = out_write(w, zero, pad8(len) - len, err);
    }
    free(nodes), free(bufs), free(src);
    if (st) return st;
    for (int c = 0; c < w->n_cols; c++) w->b[c].n = 0;
    w->batch_n = 0;
    return EG_OK;
}

eg_status eg_arrow_open(FILE *f, const eg_arrow_column *cols, int n_cols, const eg_arrow_opts *o,
                        eg_arrow_writer **out, eg_error *err) {
    *out = NULL;
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) return eg_fail(err, EG_ERR_UNSUPPORTED, "arrow: writer needs a little-endian host");
    if (n_cols < 1 || o->batch_rows < 1 || o->batch_list_values < 1)
        return eg_fail(err, EG_ERR_INVALID, "arrow: %d columns, %" PRId64 " rows / %" PRId64 " values per batch", n_cols,
                       o->batch_rows, o->batch_list_values);
    eg_arrow_writer *w = eg_calloc(1, sizeof *w, err);
    if (!w) return EG_ERR_NOMEM;
    w->f = f;
    w->o = *o;
    w->n_cols = n_cols;
    w->cols = eg_calloc((size_t)n_cols, sizeof *w->cols, err);
    w->b = eg_calloc((size_t)n_cols, sizeof *w->b, err);
    if (!w->cols || !w->b) {
        eg_arrow_free(w);
        return EG_ERR_NOMEM;
    }
    memcpy(w->cols, cols, sizeof *cols * (size_t)n_cols);
    eg_status st = write_schema(w, err);
    if (st) {
        eg_arrow_free(w);
        return st;
    }
    *out = w;
    return EG_OK;
}

static eg_status reserve(int64_t **p, int64_t *cap, int64_t need, size_t elem, eg_error *err) {
    if (need <= *cap) return EG_OK;
    int64_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return eg_fail(err, EG_ERR_NOMEM, "arrow: out of memory buffering %" PRId64 " values", need);
    *p = q;
    *cap = nc;
    return EG_OK;
}

static eg_status check_col(eg_arrow_writer *w, int col, eg_arrow_kind kind, eg_error *err) {
    if (col < 0 || col >= w->n_cols || w->cols[col].kind != kind || w->b[col].put)
        return eg_fail(err, EG_ERR_INVALID, "arrow: column %d: wrong kind or set twice in one row", col);
    return EG_OK;
}

eg_status eg_arrow_put_i64(eg_arrow_writer *w, int col, int64_t v, eg_error *err) {
    eg_status st = check_col(w, col, EG_ARROW_INT64, err);
    col_buf *b = &w->b[col];
    if (!st) st = reserve(&b->v, &b->cap, b->n + 1, 8, err);
    if (st) return st;
    b->v[b->n++] = v;
    b->put = 1;
    return EG_OK;
}

static eg_status list_begin(eg_arrow_writer *w, int col, int64_t n, eg_error *err) {
    eg_status st = check_col(w, col, EG_ARROW_LIST_INT64, err);
    if (st) return st;
    col_buf *b = &w->b[col];
    if (n < 0 || b->n + n > INT32_MAX)
        return eg_fail(err, EG_ERR_INVALID, "arrow: a list of %" PRId64 " values overflows a batch's int32 offsets", n);
    if ((st = reserve(&b->v, &b->cap, b->n + n, 8, err))) return st;
    if (w->batch_n + 2 > b->off_cap) { /* offsets [rows + 1], int32 */
        int64_t nc = b->off_cap ? b->off_cap : 1024;
        while (nc < w->batch_n + 2) nc *= 2;
        int32_t *q = realloc(b->off, (size_t)nc * sizeof *q);
        if (!q) return eg_fail(err, EG_ERR_NOMEM, "arrow: out of memory");
        b->off = q;
        b->off_cap = nc;
    }
    if (w->batch_n == 0) b->off[0] = 0;
    b->off[w->batch_n + 1] = (int32_t)(b->n + n);
    b->put = 1;
    return EG_OK;
}

eg_status eg_arrow_put_list_i32(eg_arrow_writer *w, int col, const int32_t *v, int64_t n, eg_error *err) {
    eg_status st = list_begin(w, col, n, err);
    if (st) return st;
    col_buf *b = &w->b[col];
    for (int64_t i = 0; i < n; i++) b->v[b->n++] = v[i];
    return EG_OK;
}

eg_status eg_arrow_put_list_u8(eg_arrow_writer *w, int col, const uint8_t *v, int64_t n, eg_error *err) {
    eg_status st = list_begin(w, col, n, err);
    if (st) return st;
    col_buf *b = &w->b[col];
    for (int64_t i = 0; i < n; i++) b->v[b->n++] = v[i];
    return EG_OK;
}

eg_status eg_arrow_end_row(eg_arrow_writer *w, eg_error *err) {
    int64_t most = 0;
    for (int c = 0; c < w->n_cols; c++)
        if (!w->b[c].put) return eg_fail(err, EG_ERR_INVALID, "arrow: column '%s' not set in row %" PRId64, w->cols[c].name, w->rows);
    for (int c = 0; c < w->n_cols; c++) {
        w->b[c].put = 0;
        if (w->cols[c].kind == EG_ARROW_LIST_INT64 && w->b[c].n > most) most = w->b[c].n;
    }
    w->batch_n++;
    w->rows++;
    if (w->batch_n >= w->o.batch_rows || most >= w->o.batch_list_values) return flush_batch(w, err);
    return EG_OK;
}

eg_status eg_arrow_finish(eg_arrow_writer *w, eg_error *err) {
    for (int c = 0; c < w->n_cols; c++)
        if (w->b[c].put) return eg_fail(err, EG_ERR_INVALID, "arrow: finish inside an unfinished row");
    eg_status st = flush_batch(w, err);
    uint32_t eos[2] = {0xFFFFFFFFu, 0};
    if (!st) st = out_write(w, eos, 8, err);
    return st;
}

int64_t eg_arrow_rows(const eg_arrow_writer *w) { return w->rows; }
int64_t eg_arrow_bytes(const eg_arrow_writer *w) { return w->bytes; }

void eg_arrow_free(eg_arrow_writer *w) {
    if (!w) return;
    for (int c = 0; w->b && c < w->n_cols; c++) {
        free(w->b[c].v);
        free(w->b[c].off);
    }
    free(w->b);
    free(w->cols);
    free(w);
}
