/* safetensors reader and writer: round trip of every dtype with metadata, streaming
 * fill of tensors larger than the write buffer, atomic write (no file on failure),
 * strict header validation (each rule has a case), every truncation of a file, a
 * seeded fuzz loop over header bytes, and reading the fixtures' goldens. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/safetensors.h"
#include "tests/check.h"

static char tmpdir[64];

static void mk_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/eg_st_XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static void rm_tmp(void) { eg_test_rm_dir(tmpdir); }

static void test_roundtrip_dtypes(void) {
    mk_tmp();
    eg_st_writer *w;
    eg_error e = {0};
    CHECK_OK(eg_st_writer_new(&w, &e), &e);
    static uint8_t data[EG_ST_NDTYPES][3 * 5 * 8];
    for (int t = 0; t < EG_ST_NDTYPES; t++) {
        for (size_t i = 0; i < sizeof data[t]; i++) data[t][i] = (uint8_t)(t * 31 + i * 7);
        int64_t sh[2] = {3, 5};
        char name[32];
        snprintf(name, sizeof name, "t.%s", eg_st_dtype_name((eg_st_dtype)t));
        if (t % 2) CHECK_OK(eg_st_writer_add(w, name, (eg_st_dtype)t, 2, sh, data[t], &e), &e);
        else CHECK_OK(eg_st_writer_add_copy(w, name, (eg_st_dtype)t, 2, sh, data[t], &e), &e);
    }
    int64_t zero[2] = {0, 4};
    CHECK_OK(eg_st_writer_add(w, "empty", EG_ST_F32, 2, zero, NULL, &e), &e);
    float sc = 3.5f;
    CHECK_OK(eg_st_writer_add(w, "scalar", EG_ST_F32, 0, NULL, &sc, &e), &e);
    CHECK_OK(eg_st_writer_meta(w, "prompt_lens", "[1, 5]", &e), &e);
    CHECK_OK(eg_st_writer_meta(w, "k", "old", &e), &e);
    CHECK_OK(eg_st_writer_meta(w, "k", "new \"quoted\" \xc3\xa9", &e), &e);
    char path[256];
    snprintf(path, sizeof path, "%s/x.safetensors", tmpdir);
    uint64_t planned = eg_st_writer_size(w);
    CHECK_OK(eg_st_writer_write(w, path, &e), &e);
    eg_st_writer_free(w);
    eg_st_writer_free(NULL);
    CHECK(count_files(tmpdir) == 1); /* no temp file left */

    eg_st_file *f;
    CHECK_OK(eg_st_open(path, &f, &e), &e);
    if (e.code) return;
    CHECK(eg_st_file_size(f) == planned);
    CHECK(eg_st_count(f) == EG_ST_NDTYPES + 2);
    CHECK(!strcmp(eg_st_meta(f, "prompt_lens"), "[1, 5]"));
    CHECK(!strcmp(eg_st_meta(f, "k"), "new \"quoted\" \xc3\xa9") && eg_st_meta_count(f) == 2);
    CHECK(eg_st_meta(f, "nope") == NULL);
    for (int t = 0; t < EG_ST_NDTYPES; t++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", eg_st_dtype_name((eg_st_dtype)t));
        const eg_st_tensor *x = eg_st_find(f, name);
        CHECKF(x != NULL, "%s", name);
        if (!x) continue;
        size_t es = eg_st_dtype_size((eg_st_dtype)t);
        CHECK(x->dtype == (eg_st_dtype)t && x->ndim == 2 && x->shape[0] == 3 && x->shape[1] == 5);
        CHECK(x->nelem == 15 && x->nbytes == 15 * es);
        CHECK(memcmp(x->data, data[t], x->nbytes) == 0);
        CHECKF(eg_st_aligned(x), "%s not aligned", name);
        CHECK(x->offset % 8 == 0 || es < 8);
    }
    const eg_st_tensor *s = eg_st_find(f, "scalar");
    CHECK(s && s->ndim == 0 && s->nelem == 1 && *(const float *)s->data == 3.5f);
    const eg_st_tensor *z = eg_st_find(f, "empty");
    CHECK(z && z->nelem == 0 && z->nbytes == 0);
    /* eg_st_get checks */
    const eg_st_tensor *g;
    int64_t want[2] = {3, 5}, wrong[2] = {5, 3};
    CHECK_OK(eg_st_get(f, "t.BF16", EG_ST_BF16, 2, want, &g, &e), &e);
    CHECK(eg_st_get(f, "t.BF16", EG_ST_F32, 2, want, &g, &e) == EG_ERR_FORMAT && strstr(e.msg, "dtype BF16"));
    CHECK(eg_st_get(f, "t.BF16", EG_ST_BF16, 2, wrong, &g, &e) == EG_ERR_FORMAT &&
          strstr(e.msg, "shape [3, 5], expected [5, 3]") && strstr(e.msg, "x.safetensors"));
    CHECK(eg_st_get(f, "nope", EG_ST_BF16, 0, NULL, &g, &e) == EG_ERR_FORMAT && strstr(e.msg, "nope") && !g);
    eg_st_close(f);
    eg_st_close(NULL);
    rm_tmp();
}

/* Fill callback that checks the contract: in order, element-aligned, <= 16 MiB. */
typedef struct fill_ctx {
    uint64_t next;
    int calls, bad;
    size_t es;
    int fail_at;
} fill_ctx;

static eg_status fill_pattern(void *ctx, uint64_t off, void *buf, size_t n, eg_error *err) {
    fill_ctx *c = ctx;
    c->calls++;
    if (off != c->next || off % c->es || n % c->es || n > (16u << 20)) c->bad++;
    if (c->fail_at && c->calls == c->fail_at) return eg_fail(err, EG_ERR_IO, "synthetic failure");
    for (size_t i = 0; i < n; i++) ((uint8_t *)buf)[i] = (uint8_t)((off + i) * 2654435761u >> 13);
    c->next = off + n;
    return EG_OK;
}

static void test_streaming_fill(void) {
    mk_tmp();
    eg_st_writer *w;
    eg_error e = {0};
    CHECK_OK(eg_st_writer_new(&w, &e), &e);
    fill_ctx a = {.es = 4}, b = {.es = 2}, c = {.es = 1};
    int64_t sa[1] = {5 * 1000 * 1000}, sb[2] = {3000, 3001}, sc[1] = {7};
    CHECK_OK(eg_st_writer_add_fill(w, "big32", EG_ST_F32, 1, sa, fill_pattern, &a, &e), &e);
    CHECK_OK(eg_st_writer_add_fill(w, "bf", EG_ST_BF16, 2, sb, fill_pattern, &b, &e), &e);
    CHECK_OK(eg_st_writer_add_fill(w, "u8", EG_ST_U8, 1, sc, fill_pattern, &c, &e), &e);
    char path[256];
    snprintf(path, sizeof path, "%s/big.safetensors", tmpdir);
    double t0 = eg_now();
    CHECK_OK(eg_st_writer_write(w, path, &e), &e);
    double dt = eg_now() - t0;
    eg_st_writer_free(w);
    CHECK(a.bad == 0 && b.bad == 0 && c.bad == 0);
    CHECK(a.calls >= 2 && a.next == 20000000 && b.next == 3000 * 3001 * 2 && c.next == 7);
    eg_st_file *f;
    CHECK_OK(eg_st_open(path, &f, &e), &e);
    if (!e.code) {
        const char *names[3] = {"big32", "bf", "u8"};
        int bad = 0;
        for (int k = 0; k < 3; k++) {
            const eg_st_tensor *t = eg_st_find(f, names[k]);
            for (uint64_t i = 0; t && i < t->nbytes; i++)
                bad += ((const uint8_t *)t->data)[i] != (uint8_t)(i * 2654435761u >> 13);
            CHECK(t && eg_st_aligned(t));
        }
        CHECK(bad == 0);
        fprintf(stderr, "  (streamed %.1f MB in %.2f s: %.0f MB/s incl. fsync)\n",
                eg_st_file_size(f) / 1e6, dt, eg_st_file_size(f) / 1e6 / dt);
        eg_st_close(f);
    }
    /* a failing fill leaves neither the file nor a temp file */
    unlink(path);
    CHECK_OK(eg_st_writer_new(&w, &e), &e);
    fill_ctx d = {.es = 4, .fail_at = 2};
    CHECK_OK(eg_st_writer_add_fill(w, "big32", EG_ST_F32, 1, sa, fill_pattern, &d, &e), &e);
    CHECK(eg_st_writer_write(w, path, &e) == EG_ERR_IO && strstr(e.msg, "synthetic failure") && strstr(e.msg, "big32"));
    CHECK(count_files(tmpdir) == 0);
    /* duplicate names, bad names, unwritable directory */
    int64_t s1[1] = {1};
    float v = 1;
    CHECK_OK(eg_st_writer_add(w, "dup", EG_ST_F32, 1, s1, &v, &e), &e);
    CHECK_OK(eg_st_writer_add(w, "dup", EG_ST_F32, 1, s1, &v, &e), &e);
    CHECK(eg_st_writer_write(w, path, &e) == EG_ERR_INVALID && strstr(e.msg, "dup"));
    CHECK(eg_st_writer_add(w, "", EG_ST_F32, 1, s1, &v, &e) == EG_ERR_INVALID);
    CHECK(eg_st_writer_add(w, "__metadata__", EG_ST_F32, 1, s1, &v, &e) == EG_ERR_INVALID);
    int64_t neg[1] = {-1};
    CHECK(eg_st_writer_add(w, "neg", EG_ST_F32, 1, neg, &v, &e) == EG_ERR_INVALID);
    eg_st_writer_free(w);
    CHECK_OK(eg_st_writer_new(&w, &e), &e);
    CHECK(eg_st_writer_write(w, "/nonexistent-dir/x.safetensors", &e) == EG_ERR_IO && strstr(e.msg, "/nonexistent-dir"));
    eg_st_writer_free(w);
    CHECK(count_files(tmpdir) == 0);
    rm_tmp();
}

/* A file image from a header string and `dlen` data bytes (exact-size allocation so
 * ASan sees any over-read). */
static uint8_t *image(const char *hdr, size_t dlen, size_t *n) {
    size_t hl = strlen(hdr);
    *n = 8 + hl + dlen;
    uint8_t *b = malloc(*n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    memset(b + 8 + hl, 0x3c, dlen);
    return b;
}

static void expect_bad(const char *hdr, size_t dlen, const char *needle) {
    size_t n;
    uint8_t *b = image(hdr, dlen, &n);
    eg_st_file *f = (eg_st_file *)1;
    eg_error e = {0};
    eg_status st = eg_st_open_memory(b, n, "case.safetensors", &f, &e);
    CHECKF(st != EG_OK, "accepted: %s", hdr);
    CHECK(f == NULL);
    if (st && needle) CHECKF(strstr(e.msg, needle) != NULL, "'%s' not in: %s", needle, e.msg);
    if (st) CHECK(strstr(e.msg, "case.safetensors") != NULL);
    if (!st) eg_st_close(f);
    free(b);
}

static void expect_ok(const char *hdr, size_t dlen, int count) {
    size_t n;
    uint8_t *b = image(hdr, dlen, &n);
    eg_st_file *f = NULL;
    eg_error e = {0};
    CHECK_OK(eg_st_open_memory(b, n, "ok.safetensors", &f, &e), &e);
    if (f) CHECK(eg_st_count(f) == count);
    eg_st_close(f);
    free(b);
}

static void test_header_validation(void) {
    expect_ok("{}", 0, 0);
    expect_ok("{\"__metadata__\":{\"a\":\"b\"}}  ", 0, 0);
    expect_ok("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 1);
    expect_ok("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]}}", 12, 2);
    expect_bad("{\"a\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "F8_E5M2");
    expect_bad("{\"a\":{\"dtype\":\"U32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "U32");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "span 4 bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8, "truncated");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "data_offsets");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}", 8, "overflow");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dimensions");
    expect_bad("{\"a\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    expect_bad("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    expect_bad("{\"a\":[1,2]}", 0, "not an object");
    expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name");
    expect_bad("{\"__metadata__\":{\"a\":1}}", 0, "__metadata__.a");
    expect_bad("{\"__metadata__\":[]}", 0, "__metadata__");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "corrupt header JSON");
    expect_bad("[]", 0, "'{'");
    expect_bad("{\"a\":", 0, "corrupt header JSON");
    expect_bad("{\"a\":\"\\u0000\"}", 0, "corrupt header JSON");
    /* the length prefix itself */
    uint8_t b[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    eg_st_file *f;
    eg_error e = {0};
    CHECK(eg_st_open_memory(b, 10, "len", &f, &e) == EG_ERR_FORMAT && strstr(e.msg, "header length"));
    CHECK(eg_st_open_memory(b, 5, "len", &f, &e) == EG_ERR_FORMAT && strstr(e.msg, "truncated"));
    /* dtype names */
    eg_st_dtype dt;
    CHECK(eg_st_dtype_parse("BF16", &dt, &e) == EG_OK && dt == EG_ST_BF16 && eg_st_dtype_size(dt) == 2);
    CHECK(eg_st_dtype_parse("F8_E4M3", &dt, &e) == EG_OK && eg_st_dtype_size(dt) == 1);
    CHECK(eg_st_dtype_parse("C64", &dt, &e) == EG_ERR_UNSUPPORTED && strstr(e.msg, "C64"));
    /* a directory and a missing file */
    CHECK(eg_st_open("/tmp", &f, &e) == EG_ERR_IO);
    CHECK(eg_st_open("/nonexistent.safetensors", &f, &e) == EG_ERR_IO && strstr(e.msg, "/nonexistent.safetensors"));
}

/* A valid small file written by our writer. */
static uint8_t *small_file(size_t *n) {
    mk_tmp();
    eg_st_writer *w;
    eg_error e = {0};
    eg_st_writer_new(&w, &e);
    static float a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    static uint16_t h[5] = {1, 2, 3, 4, 5};
    static int32_t t[3] = {7, 8, 9};
    int64_t s2[2] = {3, 4}, s1[1] = {5}, s3[1] = {3};
    eg_st_writer_add(w, "p0.hidden", EG_ST_F32, 2, s2, a, &e);
    eg_st_writer_add(w, "p0.h16", EG_ST_BF16, 1, s1, h, &e);
    eg_st_writer_add(w, "p0.tokens", EG_ST_I32, 1, s3, t, &e);
    eg_st_writer_meta(w, "prompt_lens", "[3]", &e);
    char p[256];
    snprintf(p, sizeof p, "%s/s.safetensors", tmpdir);
    CHECK_OK(eg_st_writer_write(w, p, &e), &e);
    eg_st_writer_free(w);
    uint8_t *b = (uint8_t *)eg_test_read_file(p, n);
    rm_tmp();
    return b;
}

static void test_every_truncation(void) {
    size_t n;
    uint8_t *full = small_file(&n);
    if (!full) return;
    int rejected = 0;
    for (size_t cut = 0; cut < n; cut++) {
        uint8_t *b = malloc(cut ? cut : 1);
        memcpy(b, full, cut);
        eg_st_file *f;
        eg_error e = {0};
        eg_status st = eg_st_open_memory(b, cut, "cut", &f, &e);
        rejected += st != EG_OK;
        if (!st) eg_st_close(f);
        free(b);
    }
    CHECKF(rejected == (int)n, "%d of %zu truncations rejected", rejected, n);
    free(full);
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_fuzz_headers(void) {
    uint64_t seed = eg_test_seed(), s = seed;
    size_t n;
    uint8_t *full = small_file(&n);
    if (!full) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | full[i];
    static const char tokens[] = "{}[]\":,0123456789-.eE \\u";
    int accepted = 0, iters = 4000, oob = 0;
    for (int it = 0; it < iters; it++) {
        size_t m = n;
        uint8_t *b = malloc(n + 16);
        memcpy(b, full, n);
        int k = 1 + (int)(rng_next(&s) % 4);
        for (int j = 0; j < k; j++) {
            uint64_t r = rng_next(&s);
            size_t pos = 8 + (size_t)(r % hl);
            switch ((r >> 32) % 5) {
            case 0: b[pos] = (uint8_t)(r >> 40); break;                          /* random byte */
            case 1: b[pos] = (uint8_t)tokens[(r >> 40) % (sizeof tokens - 1)]; break; /* JSON-ish */
            case 2: b[pos] ^= (uint8_t)(1u << ((r >> 40) % 8)); break;           /* bit flip */
            case 3: b[(r >> 40) % 8] = (uint8_t)(r >> 48); break;                /* length */
            case 4: m = 8 + (size_t)((r >> 40) % (n - 8)); break;                /* truncate */
            }
        }
        uint8_t *x = malloc(m ? m : 1); /* exact size for ASan */
        memcpy(x, b, m);
        free(b);
        eg_st_file *f;
        eg_error e = {0};
        if (eg_st_open_memory(x, m, "fuzz", &f, &e) == EG_OK) {
            accepted++;
            for (int i = 0; i < eg_st_count(f); i++) {
                const eg_st_tensor *t = eg_st_at(f, i);
                if (t->offset + t->nbytes > m) oob++;
                volatile uint8_t sink = 0;
                for (uint64_t q = 0; q < t->nbytes; q++) sink ^= ((const uint8_t *)t->data)[q];
                (void)sink;
                CHECK(eg_st_find(f, t->name) == t);
            }
            eg_st_close(f);
        } else {
            CHECK(e.msg[0] != 0 && strstr(e.msg, "fuzz"));
        }
        free(x);
    }
    CHECK(oob == 0);
    fprintf(stderr, "  (fuzz seed %llu: %d of %d mutated files accepted, all in bounds)\n",
            (unsigned long long)seed, accepted, iters);
    free(full);
}

static void test_read_goldens(void) {
    eg_st_file *f;
    eg_error e = {0};
    CHECK_OK(eg_st_open("../shared/fixtures/models/golden-a-bf16kv.safetensors", &f, &e), &e);
    if (e.code) return;
    CHECK(!strcmp(eg_st_meta(f, "prompt_lens"), "[1, 5, 17, 33, 64, 100]"));
    const eg_st_tensor *t;
    int64_t hs[3] = {6, 17, 64}, ts[1] = {17};
    CHECK_OK(eg_st_get(f, "p0.hidden", EG_ST_F32, 3, hs, &t, &e), &e);
    CHECK_OK(eg_st_get(f, "p0.tokens", EG_ST_I32, 1, ts, &t, &e), &e);
    CHECK(eg_st_count(f) == 30);
    eg_st_close(f);
}

static const eg_test tests[] = {
    {"roundtrip_dtypes", test_roundtrip_dtypes},
    {"streaming_fill", test_streaming_fill},
    {"header_validation", test_header_validation},
    {"every_truncation", test_every_truncation},
    {"fuzz_headers", test_fuzz_headers},
    {"read_goldens", test_read_goldens},
};
EG_TEST_MAIN("engine_load_st", tests)
