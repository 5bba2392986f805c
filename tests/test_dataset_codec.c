/* Record/index/trailer codec: bit-exact round trips, damaged input, and compression
 * ratios of BF16 byte-plane splitting on real hidden states (the golden fixtures).
 *   test_dataset_codec --ratio [FILE...]   prints the ratio table for every golden-*-bf16kv
 *   file, or for the given files in the same layout (`eaglegen forward` output)
 *   test_dataset_codec --speed [T]         the writer's encode rate on one thread at Kimi-K2.5
 *   width (H 7168, 3 aux layers + both final states, F32 in as the engine hands rows over),
 *   zstd 1 and 3, with and without byte planes (make bench; docs/PERFORMANCE.md) */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/wait.h>

#include "common/eg_common.h"
#include "dataset/format.h"
#include "tests/check.h"

#define FIX "../shared/fixtures/models/"

static void test_crc32(void) {
    CHECK(eg_ds_crc32("123456789", 9) == 0xCBF43926u);
    CHECK(eg_ds_crc32("", 0) == 0);
}

static void test_split_join(void) {
    uint16_t a[7] = {0x3f80, 0xbf80, 0x0001, 0xff00, 0x7fc0, 0x1234, 0xabcd}, b[7];
    uint8_t p[14];
    eg_ds_bf16_split(a, 7, p);
    CHECK(p[0] == 0x3f && p[7] == 0x80 && p[6] == 0xab && p[13] == 0xcd);
    eg_ds_bf16_join(p, 7, b);
    CHECK(!memcmp(a, b, sizeof a));
}

static uint64_t xs(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A small synthetic sample with BF16 hidden states (including NaN/Inf/denormal bits:
 * the codec must carry any 16-bit pattern unchanged). */
static void make(eg_ds_sample *s, int T, int na, int H, uint64_t seed) {
    memset(s, 0, sizeof *s);
    uint64_t x = seed | 1;
    s->id = strdup("sample/ü-1");
    s->source_file = strdup("a \"quoted\" file.jsonl");
    s->source_line = 77;
    s->gen_len = T < 2 ? T : 2;
    s->prompt_len = T - s->gen_len;
    s->finish = EG_DS_FINISH_LENGTH;
    s->temperature = 0.1 + 0.2;
    s->top_p = 1.0 / 3.0;
    s->top_k = 0;
    s->seed = UINT64_MAX;
    s->T = T;
    s->n_aux = na;
    s->H = H;
    s->input_ids = malloc(sizeof(int32_t) * (size_t)T);
    s->loss_mask = malloc((size_t)T);
    s->aux_hidden = malloc((size_t)T * (size_t)na * (size_t)H * 2);
    s->final_hidden = malloc((size_t)T * (size_t)H * 2);
    s->hidden_dtype = EG_DS_BF16;
    for (int t = 0; t < T; t++) {
        s->input_ids[t] = (int32_t)(xs(&x) % 163840);
        s->loss_mask[t] = t >= s->prompt_len;
    }
    uint16_t *a = s->aux_hidden, *f = s->final_hidden;
    for (int i = 0; i < T * na * H; i++) a[i] = (uint16_t)xs(&x);
    for (int i = 0; i < T * H; i++) f[i] = eg_f32_to_bf16((float)((int)(xs(&x) % 2001) - 1000) / 300.0f);
    if (T * H > 3) { f[0] = 0x7fc1; f[1] = 0xff80; f[2] = 0x0001; }
}

static int same(const eg_ds_sample *a, const eg_ds_sample *b) {
    size_t T = (size_t)a->T, H = (size_t)a->H, na = (size_t)a->n_aux;
    return !strcmp(a->id, b->id) && !strcmp(a->source_file, b->source_file) && a->source_line == b->source_line &&
           a->prompt_len == b->prompt_len && a->gen_len == b->gen_len && a->finish == b->finish &&
           a->temperature == b->temperature && a->top_p == b->top_p && a->top_k == b->top_k && a->seed == b->seed &&
           a->T == b->T && a->H == b->H && a->n_aux == b->n_aux && !memcmp(a->input_ids, b->input_ids, T * 4) &&
           !memcmp(a->loss_mask, b->loss_mask, T) && !memcmp(a->aux_hidden, b->aux_hidden, T * na * H * 2) &&
           !memcmp(a->final_hidden, b->final_hidden, T * H * 2);
}

static void test_record_roundtrip(void) {
    eg_error err = {0};
    int shapes[][3] = {{1, 0, 1}, {5, 3, 16}, {33, 2, 7}, {64, 3, 128}};
    for (int split = 0; split < 2; split++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            eg_ds_sample s, r;
            make(&s, shapes[k][0], shapes[k][1], shapes[k][2], eg_test_seed() + k);
            eg_ds_codec *c;
            CHECK_OK(eg_ds_codec_new(k == 3 ? 19 : 1, split, &c, &err), &err);
            uint8_t *buf;
            size_t n;
            uint64_t raw;
            CHECK_OK(eg_ds_record_encode(c, &s, &buf, &n, &raw, &err), &err);
            CHECK(raw == (uint64_t)s.T * (4 + 1 + 2 * (uint64_t)s.H * (uint64_t)(s.n_aux + 1)));
            CHECK_OK(eg_ds_record_decode(buf, n, 0, &r, &err), &err);
            CHECKF(same(&s, &r), "shape %zu split %d", k, split);
            eg_ds_sample_clear(&r);
            CHECK_OK(eg_ds_record_decode(buf, n, 1, &r, &err), &err);
            CHECK(r.aux_hidden == NULL && r.T == s.T && !strcmp(r.id, s.id));
            eg_ds_sample_clear(&r);
            /* every truncation fails cleanly */
            for (size_t cut = 0; cut < n; cut += 1 + n / 97) {
                CHECK(eg_ds_record_decode(buf, cut, 0, &r, &err) != EG_OK);
                CHECK(r.id == NULL && r.final_hidden == NULL);
            }
            /* every single-byte flip in a small record is detected or harmless: zstd
             * ignores a few bits (e.g. unused bits of entropy tables), and the frame
             * checksum covers the decoded content, so a decode that succeeds is exact */
            if (k == 1) {
                int harmless = 0;
                for (size_t pos = 0; pos < n; pos++) {
                    buf[pos] ^= 0x20;
                    eg_status st = eg_ds_record_decode(buf, n, 0, &r, &err);
                    if (!st) {
                        CHECKF(same(&s, &r), "flip at %zu of %zu gave different data", pos, n);
                        harmless++;
                        eg_ds_sample_clear(&r);
                    }
                    buf[pos] ^= 0x20;
                }
                CHECKF(harmless < 8, "%d of %zu flips undetected", harmless, n);
            }
            free(buf);
            eg_ds_codec_free(c);
            eg_ds_sample_clear(&s);
        }
}

static void test_f32_input(void) {
    eg_error err = {0};
    float a[2 * 2 * 3] = {1.0f, -2.5f, 3.14159f, 1e-30f, 65504.0f, -0.0f, 1.00390625f, 1.01171875f, 7, 8, 9, 10};
    float f[2 * 3] = {0.1f, 0.2f, 0.3f, 1e38f, -1e38f, 2};
    int32_t ids[2] = {1, 2};
    uint8_t m[2] = {0, 1};
    eg_ds_sample s = {.id = "f", .source_file = "", .top_p = 1, .T = 2, .n_aux = 2, .H = 3, .input_ids = ids, .loss_mask = m,
                      .hidden_dtype = EG_DS_F32, .aux_hidden = a, .final_hidden = f};
    eg_ds_codec *c;
    CHECK_OK(eg_ds_codec_new(3, 1, &c, &err), &err);
    uint8_t *buf;
    size_t n;
    uint64_t raw;
    eg_ds_sample r;
    for (int lm = 0; lm < 2; lm++) {
        s.aux_layer_major = lm;
        CHECK_OK(eg_ds_record_encode(c, &s, &buf, &n, &raw, &err), &err);
        CHECK_OK(eg_ds_record_decode(buf, n, 0, &r, &err), &err);
        const uint16_t *ra = r.aux_hidden, *rf = r.final_hidden;
        for (int t = 0; t < 2; t++)
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 3; h++) {
                    /* token-major on disk; the input is [T][n_aux][H] or [n_aux][T][H] */
                    float src = lm ? a[(l * 2 + t) * 3 + h] : a[(t * 2 + l) * 3 + h];
                    CHECK(ra[(t * 2 + l) * 3 + h] == eg_f32_to_bf16(src));
                }
        for (int i = 0; i < 6; i++) CHECK(rf[i] == eg_f32_to_bf16(f[i]));
        /* round to nearest even: 1.00390625 is a tie between 1.0 and 1.0078125 -> 1.0 */
        if (!lm) CHECK(ra[6] == 0x3f80);
        eg_ds_sample_clear(&r);
        free(buf);
    }
    eg_ds_codec_free(c);
}

static void test_index_trailer(void) {
    eg_error err = {0};
    eg_ds_index ix = {.n_aux = 3, .flags = 1, .H = 7168, .n = 3};
    eg_ds_index_entry e[3] = {{512, 1000, 17, 5, EG_DS_FINISH_STOP, "a"},
                              {2048, 77, 1, 1, EG_DS_FINISH_LENGTH, "bb/ü"},
                              {3072, 1 << 20, 32768, 0, EG_DS_FINISH_STOP, ""}};
    ix.e = e;
    uint8_t *b;
    size_t n;
    uint64_t raw;
    CHECK_OK(eg_ds_index_encode(&ix, 3, &b, &n, &raw, &err), &err);
    eg_ds_index r;
    CHECK_OK(eg_ds_index_decode(b, n, raw, &r, &err), &err);
    CHECK(r.n == 3 && r.H == 7168 && r.n_aux == 3 && r.flags == 1);
    for (int i = 0; i < 3 && r.n == 3; i++)
        CHECK(r.e[i].offset == e[i].offset && r.e[i].size == e[i].size && r.e[i].T == e[i].T &&
              r.e[i].n_loss == e[i].n_loss && r.e[i].finish == e[i].finish && !strcmp(r.e[i].id, e[i].id));
    eg_ds_index_clear(&r);
    for (size_t cut = 0; cut < n; cut++) CHECK(eg_ds_index_decode(b, cut, raw, &r, &err) != EG_OK);
    CHECK(eg_ds_index_decode(b, n, raw + 1, &r, &err) != EG_OK);
    CHECK(eg_ds_index_decode(b, n, 1ull << 40, &r, &err) != EG_OK);
    free(b);

    eg_ds_trailer t = {EG_DS_FORMAT_VERSION, 1, 123456, 789, 1011, 12, 13}, u;
    uint8_t tb[EG_DS_TRAILER_SIZE];
    eg_ds_trailer_encode(&t, tb);
    CHECK_OK(eg_ds_trailer_decode(tb, &u, &err), &err);
    CHECK(u.index_offset == 123456 && u.index_size == 789 && u.index_raw_size == 1011 && u.n_samples == 12 && u.n_tokens == 13);
    tb[20] ^= 1;
    CHECK(eg_ds_trailer_decode(tb, &u, &err) == EG_ERR_CHECKSUM);
    tb[20] ^= 1;
    tb[0] = 'X';
    CHECK(eg_ds_trailer_decode(tb, &u, &err) == EG_ERR_FORMAT);
}


/* ---------------------------------------------------------------- damaged headers */
static void put32t(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64t(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64t(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

/* A valid record of s with its metadata frame replaced by `meta` (header sizes and CRC fixed). */
static uint8_t *with_meta(const eg_ds_sample *s, const char *meta, size_t *out_len) {
    eg_error err = {0};
    eg_ds_codec *c;
    uint8_t *rec, *mf;
    size_t len, ml;
    uint64_t raw;
    if (eg_ds_codec_new(3, 1, &c, &err)) return NULL;
    if (eg_ds_record_encode(c, s, &rec, &len, &raw, &err)) { eg_ds_codec_free(c); return NULL; }
    eg_ds_codec_free(c);
    if (eg_ds_zstd(meta, strlen(meta), 3, &mf, &ml, &err)) { free(rec); return NULL; }
    uint64_t old = get64t(rec + 32);
    size_t n = len - old + ml;
    uint8_t *o = malloc(n);
    memcpy(o, rec, EG_DS_RECORD_HEADER_SIZE);
    memcpy(o + EG_DS_RECORD_HEADER_SIZE, mf, ml);
    memcpy(o + EG_DS_RECORD_HEADER_SIZE + ml, rec + EG_DS_RECORD_HEADER_SIZE + old, len - EG_DS_RECORD_HEADER_SIZE - old);
    put64t(o + 32, ml);
    put64t(o + 40, strlen(meta));
    put32t(o + 124, eg_ds_crc32(o, 124));
    free(rec);
    free(mf);
    *out_len = n;
    return o;
}

static void test_record_bad_seed(void) {
    eg_error err = {0};
    eg_ds_sample s, r;
    make(&s, 5, 1, 4, 9);
    const char *meta = "{\"finish\":\"stop\",\"gen_len\":2,\"id\":\"x\",\"prompt_len\":3,\"seed\":\"not-a-number-seed-value\","
                       "\"source_file\":\"f\",\"source_line\":1,\"temperature\":0.5,\"top_k\":0,\"top_p\":1.0}";
    size_t n;
    uint8_t *rec = with_meta(&s, meta, &n);
    CHECK(rec != NULL);
    if (rec) {
        CHECK(eg_ds_record_decode(rec, n, 0, &r, &err) == EG_ERR_FORMAT);
        /* the message quotes the seed: formatted before the JSON holding it is freed */
        CHECKF(strstr(err.msg, "bad seed 'not-a-number-seed-value'") != NULL, "%s", err.msg);
        CHECK(eg_ds_record_decode(rec, n, 1, &r, &err) == EG_ERR_FORMAT);
        CHECKF(strstr(err.msg, "bad seed 'not-a-number-seed-value'") != NULL, "%s", err.msg);
    }
    free(rec);
    /* decimal digits only, as the writer writes it and the Python loader demands (strtoull
       took a sign and leading blanks); the largest u64 still reads */
    const char *seeds[] = {"-1", " 5", "+5", "", "18446744073709551616", "18446744073709551615"};
    for (int k = 0; k < 6; k++) {
        char m2[512];
        snprintf(m2, sizeof m2,
                 "{\"finish\":\"stop\",\"gen_len\":2,\"id\":\"x\",\"prompt_len\":3,\"seed\":\"%s\","
                 "\"source_file\":\"f\",\"source_line\":1,\"temperature\":0.5,\"top_k\":0,\"top_p\":1.0}",
                 seeds[k]);
        rec = with_meta(&s, m2, &n);
        CHECK(rec != NULL);
        if (!rec) continue;
        eg_status st = eg_ds_record_decode(rec, n, 1, &r, &err);
        if (k < 5) CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "bad seed"), "seed '%s': %d %s", seeds[k], st, err.msg);
        else {
            CHECKF(st == EG_OK && r.seed == UINT64_MAX, "seed '%s': %d %s", seeds[k], st, err.msg);
            if (!st) eg_ds_sample_clear(&r);
        }
        free(rec);
    }
    eg_ds_sample_clear(&s);
}

/* Encode refuses what decode refuses (issue 22): an id or source file that is not UTF-8,
 * a temperature or top_p that is NaN or infinite. Before, such a record was written with
 * the key silently missing and its own decoder then rejected it. Everything encode does
 * accept decodes back to the same sample. */
static void test_record_encode_refuses(void) {
    eg_ds_codec *c;
    eg_error err = {0};
    CHECK(eg_ds_codec_new(3, 1, &c, &err) == EG_OK);
    for (int k = 0; k < 6; k++) {
        eg_ds_sample s, r;
        make(&s, 5, 1, 4, 30 + (uint64_t)k);
        const char *want = "";
        if (k == 0) { free(s.id); s.id = strdup("bad\xff-id"); want = "id is not valid UTF-8"; }
        if (k == 1) { free(s.source_file); s.source_file = strdup("c\xe9.jsonl"); want = "source_file is not valid UTF-8"; }
        if (k == 2) { s.temperature = NAN; want = "temperature is not a finite number"; }
        if (k == 3) { s.top_p = INFINITY; want = "top_p is not a finite number"; }
        if (k == 4) { free(s.id); s.id = strdup("\xed\xa0\x80"); want = "id is not valid UTF-8"; } /* surrogate */
        uint8_t *rec = NULL;
        size_t n = 0;
        uint64_t raw = 0;
        eg_status st = eg_ds_record_encode(c, &s, &rec, &n, &raw, &err);
        if (k < 5) {
            CHECKF(st == EG_ERR_INVALID, "case %d: encode returned %d", k, st);
            CHECKF(strstr(err.msg, want) != NULL, "case %d: %s", k, err.msg);
            if (st == EG_OK) { /* what the old encoder did: decode must then agree */
                CHECKF(eg_ds_record_decode(rec, n, 0, &r, &err) == EG_OK, "case %d: decode: %s", k, err.msg);
                eg_ds_sample_clear(&r);
            }
        } else {
            CHECK(st == EG_OK);
            CHECK(eg_ds_record_decode(rec, n, 0, &r, &err) == EG_OK);
            CHECK(same(&s, &r));
            eg_ds_sample_clear(&r);
        }
        free(rec);
        eg_ds_sample_clear(&s);
    }
    eg_ds_codec_free(c);
}

/* Header shapes the frames do not back up are rejected before anything is allocated:
 * T = 2^31, H = 2^20 would ask for 4 PiB. */
static void test_record_huge_shape(void) {
    eg_error err = {0};
    eg_ds_sample s, r;
    make(&s, 3, 0, 4, 5);
    eg_ds_codec *c;
    uint8_t *rec;
    size_t len;
    uint64_t raw;
    CHECK_OK(eg_ds_codec_new(3, 1, &c, &err), &err);
    CHECK_OK(eg_ds_record_encode(c, &s, &rec, &len, &raw, &err), &err);
    eg_ds_codec_free(c);
    uint64_t T = 1ull << 31, H = 1ull << 20;
    put32t(rec + 16, (uint32_t)T);
    put32t(rec + 20, (uint32_t)H);
    put64t(rec + 40 + 16 * 1, T * 4);
    put64t(rec + 40 + 16 * 2, T);
    put64t(rec + 40 + 16 * 3, 0);
    put64t(rec + 40 + 16 * 4, T * H * 2);
    put32t(rec + 124, eg_ds_crc32(rec, 124));
    /* refused as corrupt before anything is allocated: no frame of a few bytes expands to
       8 GiB (it used to reach malloc and say "out of memory decoding 2147483648 tokens") */
    eg_status st = eg_ds_record_decode(rec, len, 0, &r, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "claims") && strstr(err.msg, "corrupt"), "status %d: %s", st,
           err.msg);
    /* sizes a frame could hold but this one does not: its header's content size says so */
    uint8_t *small = malloc(len);
    memcpy(small, rec, len);
    T = 4;
    H = 4;
    put32t(small + 16, (uint32_t)T);
    put32t(small + 20, (uint32_t)H);
    put64t(small + 40 + 16 * 1, T * 4);
    put64t(small + 40 + 16 * 2, T);
    put64t(small + 40 + 16 * 4, T * H * 2);
    put32t(small + 124, eg_ds_crc32(small, 124));
    st = eg_ds_record_decode(small, len, 0, &r, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "frame holds"), "status %d: %s", st, err.msg);
    free(small);
    put32t(rec + 12, 5000); /* n_aux beyond EG_DS_MAX_AUX */
    put32t(rec + 124, eg_ds_crc32(rec, 124));
    st = eg_ds_record_decode(rec, len, 0, &r, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "bad shape"), "status %d: %s", st, err.msg);
    free(rec);
    eg_ds_sample_clear(&s);
}

/* An index whose raw bytes are given directly (one entry with id bytes `id`, `il` long, and
 * `res` in its first reserved byte). */
static eg_status index_raw_res(uint32_t n_aux, uint64_t H, const char *id, uint32_t il, uint8_t res, eg_ds_index *ix,
                               eg_error *err) {
    size_t n = EG_DS_INDEX_HEADER_SIZE + EG_DS_INDEX_ENTRY_SIZE + il;
    uint8_t *b = calloc(1, n), *z;
    size_t zl;
    memcpy(b, EG_DS_INDEX_MAGIC, 4);
    put32t(b + 4, EG_DS_FORMAT_VERSION);
    put32t(b + 8, n_aux);
    put64t(b + 16, H);
    put64t(b + 24, 1);
    put64t(b + 32, 512);
    put64t(b + 40, 1000);
    put32t(b + 48, 3);
    put32t(b + 56, il);
    b[32 + 29] = res;
    memcpy(b + 64, id, il);
    eg_status st = eg_ds_zstd(b, n, 3, &z, &zl, err);
    free(b);
    if (st) return st;
    st = eg_ds_index_decode(z, zl, n, ix, err);
    free(z);
    return st;
}

static eg_status index_raw(uint32_t n_aux, uint64_t H, const char *id, uint32_t il, eg_ds_index *ix, eg_error *err) {
    return index_raw_res(n_aux, H, id, il, 0, ix, err);
}

static void test_index_bad_fields(void) {
    eg_error err = {0};
    eg_ds_index ix;
    CHECK_OK(index_raw(3, 64, "ab", 2, &ix, &err), &err);
    eg_ds_index_clear(&ix);
    eg_status st = index_raw(1u << 30, 64, "ab", 2, &ix, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "n_aux=1073741824"), "status %d: %s", st, err.msg);
    st = index_raw(3, 0, "ab", 2, &ix, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "bad shape"), "status %d: %s", st, err.msg);
    st = index_raw(3, (1u << 20) + 1, "ab", 2, &ix, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "bad shape"), "status %d: %s", st, err.msg);
    st = index_raw(3, 64, "a\0b", 3, &ix, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "NUL"), "status %d: %s", st, err.msg);
}

/* Reserved bytes must be zero (FORMAT.md §3-§5), in the record header, an index entry and
 * the trailer, with the CRC fixed so only the reserved byte is wrong; and the metadata's
 * numbers must be in their ranges (§3.2). The writer refuses a sample out of range and
 * each reader refuses a record carrying one; the Python loader's test_reserved_ranges
 * holds the same cases. */
static void test_reserved_and_ranges(void) {
    eg_error err = {0};
    eg_ds_sample s, r;
    make(&s, 5, 1, 4, 11);
    eg_ds_codec *c;
    uint8_t *rec;
    size_t len;
    uint64_t raw;
    CHECK_OK(eg_ds_codec_new(3, 1, &c, &err), &err);
    CHECK_OK(eg_ds_record_encode(c, &s, &rec, &len, &raw, &err), &err);
    const int offs[] = {28, 31, 112, 123};
    for (int k = 0; k < 4; k++) {
        rec[offs[k]] = 0x40;
        put32t(rec + 124, eg_ds_crc32(rec, 124));
        eg_status st = eg_ds_record_decode(rec, len, 1, &r, &err);
        CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "reserved"), "record byte %d: %d %s", offs[k], st, err.msg);
        if (!st) eg_ds_sample_clear(&r);
        rec[offs[k]] = 0;
        put32t(rec + 124, eg_ds_crc32(rec, 124));
    }
    CHECK_OK(eg_ds_record_decode(rec, len, 0, &r, &err), &err);
    eg_ds_sample_clear(&r);
    free(rec);

    eg_ds_index ix;
    eg_status st = index_raw_res(3, 64, "ab", 2, 1, &ix, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "entry 0 malformed"), "index entry reserved: %d %s", st, err.msg);
    eg_ds_trailer t = {EG_DS_FORMAT_VERSION, 1, 512, 7, 64, 1, 5}, u;
    uint8_t tb[EG_DS_TRAILER_SIZE];
    eg_ds_trailer_encode(&t, tb);
    tb[58] = 1;
    put32t(tb + 60, eg_ds_crc32(tb, 60));
    st = eg_ds_trailer_decode(tb, &u, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "reserved"), "trailer reserved: %d %s", st, err.msg);

    /* field, value, what the message names; T = 5 */
    static const struct { const char *key, *val, *want; } bad[] = {
        {"source_line", "-1", "source_line is negative"},
        {"prompt_len", "-1", "prompt_len + gen_len"},
        {"gen_len", "-2", "prompt_len + gen_len"},
        {"prompt_len", "4", "prompt_len + gen_len"}, /* 4 + 2 > 5 */
        {"temperature", "-0.5", "temperature is negative"},
        {"top_p", "0", "top_p is not in (0, 1]"},
        {"top_p", "1.0000001", "top_p is not in (0, 1]"},
        {"top_p", "-1", "top_p is not in (0, 1]"},
        {"top_k", "-1", "top_k is negative"},
        {"prompt_len", "3", NULL}, /* the limits themselves read */
        {"temperature", "0", NULL},
        {"top_p", "1", NULL},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        json_t *o = json_pack("{s:s, s:i, s:s, s:i, s:s, s:s, s:i, s:f, s:i, s:f}", "finish", "stop", "gen_len", 2, "id",
                              "x", "prompt_len", 3, "seed", "7", "source_file", "f", "source_line", 1, "temperature",
                              0.5, "top_k", 0, "top_p", 1.0);
        json_t *v = json_loads(bad[k].val, JSON_DECODE_ANY, NULL);
        CHECK(o && v && !json_object_set_new(o, bad[k].key, v));
        char *meta = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        size_t n = 0;
        uint8_t *m = meta ? with_meta(&s, meta, &n) : NULL;
        CHECK(m != NULL);
        for (int meta_only = 0; m && meta_only < 2; meta_only++) {
            st = eg_ds_record_decode(m, n, meta_only, &r, &err);
            if (bad[k].want)
                CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "metadata: ") && strstr(err.msg, bad[k].want),
                       "%s = %s: %d %s", bad[k].key, bad[k].val, st, err.msg);
            else
                CHECKF(st == EG_OK, "%s = %s: %d %s", bad[k].key, bad[k].val, st, err.msg);
            if (!st) eg_ds_sample_clear(&r);
        }
        free(m);
        free(meta);
    }

    /* the writer refuses the same values, naming them */
    for (int k = 0; k < 6; k++) {
        eg_ds_sample w = s;
        const char *want = "";
        if (k == 0) { w.source_line = -1; want = "source_line is negative"; }
        if (k == 1) { w.gen_len = 3; want = "prompt_len + gen_len"; } /* 3 + 3 > 5 */
        if (k == 2) { w.prompt_len = -1; want = "prompt_len + gen_len"; }
        if (k == 3) { w.temperature = -1; want = "temperature is negative"; }
        if (k == 4) { w.top_p = 0; want = "top_p is not in (0, 1]"; }
        if (k == 5) { w.top_k = -5; want = "top_k is negative"; }
        st = eg_ds_record_encode(c, &w, &rec, &len, &raw, &err);
        CHECKF(st == EG_ERR_INVALID && strstr(err.msg, "cannot be stored") && strstr(err.msg, want), "encode case %d: %d %s",
               k, st, err.msg);
        if (!st) free(rec);
    }
    eg_ds_codec_free(c);
    eg_ds_sample_clear(&s);
}

/* index_raw_size from the trailer (up to 16 GiB) is checked against the frame before the
 * buffer is allocated: run under a 1 GiB address-space limit (not under ASan, whose
 * shadow memory needs more), where allocating first fails with EG_ERR_NOMEM. */
static void test_index_raw_size_first(void) {
    eg_error err = {0};
    eg_ds_index ix = {.n_aux = 3, .H = 64, .n = 1}, r;
    eg_ds_index_entry e = {512, 1000, 3, 1, EG_DS_FINISH_STOP, "a"};
    ix.e = &e;
    uint8_t *b;
    size_t n;
    uint64_t raw;
    CHECK_OK(eg_ds_index_encode(&ix, 3, &b, &n, &raw, &err), &err);
#if defined(__SANITIZE_ADDRESS__)
    eg_status st = eg_ds_index_decode(b, n, 1ull << 34, &r, &err);
    CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "frame holds"), "status %d: %s", st, err.msg);
#else
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {1ull << 30, 1ull << 30};
        setrlimit(RLIMIT_AS, &rl);
        eg_status st = eg_ds_index_decode(b, n, 1ull << 34, &r, &err);
        if (st != EG_ERR_FORMAT || !strstr(err.msg, "frame holds")) {
            fprintf(stderr, "    status %d: %s\n", st, err.msg);
            _exit(1);
        }
        _exit(0);
    }
    int ws = 0;
    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
#endif
    free(b);
}

/* ---------------------------------------------------------------- golden ratios */
typedef struct golden {
    uint8_t *file;
    size_t size;
    json_t *hdr;
    size_t data0;
} golden;

static int golden_load(const char *path, golden *g) {
    memset(g, 0, sizeof *g);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    g->size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    g->file = malloc(g->size);
    int ok = fread(g->file, 1, g->size, f) == g->size;
    fclose(f);
    if (!ok || g->size < 8) return 0;
    uint64_t hl = 0;
    memcpy(&hl, g->file, 8);
    if (hl > g->size - 8) return 0;
    g->hdr = json_loadb((const char *)g->file + 8, hl, 0, NULL);
    g->data0 = 8 + hl;
    return g->hdr != NULL;
}

/* F32 tensor by name; shape into dims. */
static const float *golden_f32(golden *g, const char *name, int64_t dims[4], int *nd) {
    json_t *t = json_object_get(g->hdr, name);
    if (!t || strcmp(json_string_value(json_object_get(t, "dtype")), "F32")) return NULL;
    json_t *sh = json_object_get(t, "shape"), *off = json_object_get(t, "data_offsets");
    *nd = (int)json_array_size(sh);
    for (int i = 0; i < *nd && i < 4; i++) dims[i] = json_integer_value(json_array_get(sh, (size_t)i));
    return (const float *)(g->file + g->data0 + json_integer_value(json_array_get(off, 0)));
}

/* Encode every prompt of a golden file as a sample: aux = outputs of decoder layers
 * {1, L/2, L-2} (clamped), final = the normed output. Returns total record bytes and
 * raw tensor bytes. */
static int golden_bytes(golden *g, int level, int split, uint64_t *stored, uint64_t *raw_total) {
    eg_error err = {0};
    eg_ds_codec *c;
    if (eg_ds_codec_new(level, split, &c, &err)) return 0;
    *stored = *raw_total = 0;
    int n = 0;
    for (int p = 0;; p++) {
        char hn[32], nn[32], tn[32];
        snprintf(hn, sizeof hn, "p%d.hidden", p);
        snprintf(nn, sizeof nn, "p%d.normed", p);
        snprintf(tn, sizeof tn, "p%d.tokens", p);
        int64_t hd[4], nd2[4];
        int nd, nnd;
        const float *hid = golden_f32(g, hn, hd, &nd), *nrm = golden_f32(g, nn, nd2, &nnd);
        if (!hid || !nrm || nd != 3) break;
        int64_t L1 = hd[0], T = hd[1], H = hd[2], L = L1 - 1;
        int layers[3] = {1, (int)(L / 2), (int)(L - 2)};
        float *aux = malloc(sizeof(float) * (size_t)(T * 3 * H));
        for (int64_t t = 0; t < T; t++)
            for (int l = 0; l < 3; l++) {
                int k = layers[l] < 0 ? 0 : layers[l] >= L ? (int)L - 1 : layers[l];
                memcpy(aux + (t * 3 + l) * H, hid + ((int64_t)(k + 1) * T + t) * H, sizeof(float) * (size_t)H);
            }
        int32_t *ids = calloc((size_t)T, 4);
        uint8_t *mask = calloc((size_t)T, 1);
        eg_ds_sample s = {.id = hn, .source_file = "", .top_p = 1, .T = T, .n_aux = 3, .H = H, .input_ids = ids,
                          .loss_mask = mask, .hidden_dtype = EG_DS_F32, .aux_hidden = aux,
                          .final_hidden = (void *)nrm};
        uint8_t *buf;
        size_t len;
        uint64_t raw;
        if (!eg_ds_record_encode(c, &s, &buf, &len, &raw, &err)) {
            /* count the hidden-state frames only: ids/mask/meta are not what we measure */
            uint64_t hs = 0;
            for (int sec = 3; sec < 5; sec++) {
                uint64_t v = 0;
                for (int b = 7; b >= 0; b--) v = (v << 8) | buf[32 + 16 * sec + b];
                hs += v;
            }
            *stored += hs;
            *raw_total += (uint64_t)T * 4 * (uint64_t)H * 2;
            free(buf);
            n++;
        }
        free(aux);
        free(ids);
        free(mask);
    }
    eg_ds_codec_free(c);
    return n;
}

static void ratio_table(const char *path, int levels_n, const int *levels, double *gain_at3) {
    golden g;
    if (!golden_load(path, &g)) {
        CHECKF(0, "cannot read fixture %s", path);
        return;
    }
    printf("    %s (hidden states as BF16: 3 aux layers + final norm)\n", strrchr(path, '/') + 1);
    for (int i = 0; i < levels_n; i++) {
        uint64_t s0, s1, raw;
        int n0 = golden_bytes(&g, levels[i], 0, &s0, &raw);
        int n1 = golden_bytes(&g, levels[i], 1, &s1, &raw);
        CHECK(n0 > 0 && n0 == n1);
        if (!n0 || !s0 || !s1) continue;
        printf("      zstd %2d: raw %8llu B  plain %8llu B (x%.3f)  byte-split %8llu B (x%.3f)  split gain x%.3f\n",
               levels[i], (unsigned long long)raw, (unsigned long long)s0, (double)raw / (double)s0,
               (unsigned long long)s1, (double)raw / (double)s1, (double)s0 / (double)s1);
        if (levels[i] == 3 && gain_at3) *gain_at3 = (double)s0 / (double)s1;
    }
    json_decref(g.hdr);
    free(g.file);
}

static void test_golden_split_gain(void) {
    int lv[2] = {1, 3};
    double gain = 0;
    ratio_table(FIX "golden-a-bf16kv.safetensors", 2, lv, &gain);
    /* Byte planes must not lose on real activations (measured ~1.1x here). */
    CHECKF(gain > 1.0, "byte split gain x%.3f", gain);
}

/* Format v2: a record with both final states (post-norm, pre-norm) round-trips; a v1
 * record (same layout, one final state) is still read; a v1 record claiming two final
 * states, and an unknown version, are refused. */
static void set_version(uint8_t *h, uint32_t v) {
    for (int i = 0; i < 4; i++) h[4 + i] = (uint8_t)(v >> (8 * i));
    uint32_t c = eg_ds_crc32(h, 124);
    for (int i = 0; i < 4; i++) h[124 + i] = (uint8_t)(c >> (8 * i));
}

static void test_record_both_finals(void) {
    eg_error err = {0};
    for (int split = 0; split < 2; split++) {
        eg_ds_sample s, r;
        make(&s, 9, 3, 16, eg_test_seed() + 40 + (uint64_t)split);
        uint16_t *pre = malloc(9 * 16 * 2);
        for (int i = 0; i < 9 * 16; i++) pre[i] = (uint16_t)(0x3f00 + 7 * i);
        s.final_pre_hidden = pre;
        eg_ds_codec *c;
        CHECK_OK(eg_ds_codec_new(3, split, &c, &err), &err);
        uint8_t *buf;
        size_t n;
        uint64_t raw;
        CHECK_OK(eg_ds_record_encode(c, &s, &buf, &n, &raw, &err), &err);
        CHECK(raw == 9 * (4 + 1 + 2 * 16 * (3 + 2)));
        CHECK(buf[4] == EG_DS_FORMAT_VERSION && (buf[8] & EG_DS_FLAG_FINAL_BOTH));
        CHECK_OK(eg_ds_record_decode(buf, n, 0, &r, &err), &err);
        CHECK(same(&s, &r));
        CHECK(r.final_pre_hidden && !memcmp(r.final_pre_hidden, pre, 9 * 16 * 2));
        eg_ds_sample_clear(&r);
        set_version(buf, 1); /* version 1 knows no second final state */
        CHECK(eg_ds_record_decode(buf, n, 0, &r, &err) == EG_ERR_FORMAT);
        CHECKF(strstr(err.msg, "unknown flags") && strstr(err.msg, "version 1"), "%s", err.msg);
        free(buf);
        s.final_pre_hidden = NULL; /* one final state: also a valid version-1 record */
        CHECK_OK(eg_ds_record_encode(c, &s, &buf, &n, &raw, &err), &err);
        CHECK(!(buf[8] & EG_DS_FLAG_FINAL_BOTH));
        set_version(buf, 1);
        CHECK_OK(eg_ds_record_decode(buf, n, 0, &r, &err), &err);
        CHECK(same(&s, &r) && r.final_pre_hidden == NULL);
        eg_ds_sample_clear(&r);
        set_version(buf, EG_DS_FORMAT_VERSION + 1);
        CHECK(eg_ds_record_decode(buf, n, 0, &r, &err) == EG_ERR_FORMAT);
        CHECKF(strstr(err.msg, "format version 3"), "%s", err.msg);
        free(buf);
        free(pre);
        eg_ds_codec_free(c);
        eg_ds_sample_clear(&s);
    }
}

/* Tokens per second one thread encodes (what sizes the writer's pool against the box's
 * generation rate); Gaussian rows, so the ratio is a random model's, not Kimi's. */
static void speed_table(int T) {
    const int H = 7168, na = 3;
    size_t n_aux = (size_t)T * na * H, n_fin = (size_t)T * H;
    float *aux = malloc(n_aux * 4), *fin = malloc(n_fin * 4), *pre = malloc(n_fin * 4);
    int32_t *ids = calloc((size_t)T, 4);
    uint8_t *mask = calloc((size_t)T, 1);
    if (!aux || !fin || !pre || !ids || !mask) { CHECKF(0, "out of memory (T %d)", T); goto done; }
    uint64_t x = 7;
    for (size_t i = 0; i < n_aux; i++) { /* Box-Muller from xorshift */
        double u = ((double)(xs(&x) >> 11) + 1.0) / 9007199254740993.0, v = (double)(xs(&x) >> 11) / 9007199254740992.0;
        aux[i] = (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
    }
    for (size_t i = 0; i < n_fin; i++) { fin[i] = 0.7f * aux[i]; pre[i] = 3.0f * aux[n_aux - 1 - i]; }
    eg_ds_sample s = {.id = "speed", .source_file = "", .top_p = 1, .T = T, .n_aux = na, .H = H, .prompt_len = 1,
                      .gen_len = T - 1, .input_ids = ids, .loss_mask = mask, .hidden_dtype = EG_DS_F32,
                      .aux_hidden = aux, .final_hidden = fin, .final_pre_hidden = pre};
    printf("    encode, one thread: T %d, H %d, %d aux + 2 final states, F32 in (%.0f MB of BF16 per record)\n", T, H,
           na, (double)(n_aux + 2 * n_fin) * 2 / 1e6);
    const int lv[2] = {1, 3};
    for (int i = 0; i < 2; i++)
        for (int split = 0; split < 2; split++) {
            eg_error err = {0};
            eg_ds_codec *c;
            if (eg_ds_codec_new(lv[i], split, &c, &err)) { CHECKF(0, "%s", err.msg); continue; }
            struct timespec t0, t1;
            uint8_t *buf = NULL;
            size_t len = 0;
            uint64_t raw = 0;
            int reps = 0;
            double dt = 0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            do { /* at least 3 records and half a second */
                free(buf);
                buf = NULL;
                if (eg_ds_record_encode(c, &s, &buf, &len, &raw, &err)) { CHECKF(0, "%s", err.msg); break; }
                reps++;
                clock_gettime(CLOCK_MONOTONIC, &t1);
                dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
            } while (reps < 3 || dt < 0.5);
            if (buf)
                printf("      zstd %d, %-11s %7.0f tok/s  %5.0f MB/s of BF16  ratio x%.3f\n", lv[i],
                       split ? "byte planes" : "plain", reps * T / dt, reps * (double)raw / dt / 1e6,
                       (double)raw / (double)len);
            free(buf);
            eg_ds_codec_free(c);
        }
done:
    free(aux);
    free(fin);
    free(pre);
    free(ids);
    free(mask);
}

static const eg_test tests[] = {
    {"crc32", test_crc32},
    {"split_join", test_split_join},
    {"record_roundtrip", test_record_roundtrip},
    {"f32_input", test_f32_input},
    {"record_both_finals", test_record_both_finals},
    {"index_trailer", test_index_trailer},
    {"record_bad_seed", test_record_bad_seed},
    {"record_encode_refuses", test_record_encode_refuses},
    {"record_huge_shape", test_record_huge_shape},
    {"index_bad_fields", test_index_bad_fields},
    {"reserved_and_ranges", test_reserved_and_ranges},
    {"index_raw_size_first", test_index_raw_size_first},
    {"golden_split_gain", test_golden_split_gain},
};

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--speed")) {
        int T = argc > 2 ? atoi(argv[2]) : 0;
        speed_table(T > 0 ? T : 512);
        return eg_check_failures ? 1 : 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--ratio")) {
        const char *files[] = {FIX "golden-a-bf16kv.safetensors", FIX "golden-a-long-bf16kv.safetensors",
                               FIX "golden-q4-bf16kv.safetensors", FIX "golden-fp8-bf16kv.safetensors"};
        int lv[5] = {1, 3, 9, 15, 19};
        if (argc > 2) { /* other files in the same layout, e.g. `eaglegen forward` output */
            for (int i = 2; i < argc; i++) ratio_table(argv[i], 5, lv, NULL);
            return eg_check_failures ? 1 : 0;
        }
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) ratio_table(files[i], 5, lv, NULL);
        return eg_check_failures ? 1 : 0;
    }
    return eg_test_main("dataset_codec", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
