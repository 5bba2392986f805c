/* Writers behind `eaglegen export --to speculators`: the Arrow IPC stream writer's framing
 * and refusals, the safetensors header, and the draft vocabulary from a histogram by
 * speculators' rule (equal counts to the lower id, padding with the lowest unused ids).
 * The stream's content is read back by a full parser in tests/speculators_export_check.py
 * (t_export_speculators.sh) and by pyarrow in the trainer check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/eg_common.h"
#include "dataset/arrow_ipc.h"
#include "dataset/safetensors_write.h"
#include "dataset/vocab.h"
#include "tests/check.h"

static const eg_arrow_column cols[] = {{"input_ids", EG_ARROW_LIST_INT64}, {"seq_len", EG_ARROW_INT64}};

static uint32_t u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Walks the messages: continuation marker, metadata length keeping the body 8-aligned,
 * flatbuffer Message.bodyLength (read through the vtable), end-of-stream marker last.
 * Returns the number of messages, or -1. */
static int walk(const uint8_t *b, size_t n) {
    size_t p = 0;
    int msgs = 0;
    while (p + 8 <= n) {
        if (u32(b + p) != 0xFFFFFFFFu) return -1;
        uint32_t ml = u32(b + p + 4);
        if (ml == 0) return p + 8 == n ? msgs : -1;
        if ((p + 8 + ml) % 8) return -1;
        const uint8_t *fb = b + p + 8;
        uint32_t root = u32(fb);
        int32_t so = (int32_t)u32(fb + root);
        const uint8_t *vt = fb + root - so;
        uint16_t vlen = (uint16_t)(vt[0] | vt[1] << 8);
        if (vlen < 4 + 2 * 4) return -1;
        uint16_t fo = (uint16_t)(vt[4 + 2 * 3] | vt[4 + 2 * 3 + 1] << 8); /* slot 3: bodyLength */
        int64_t body = 0;
        if (fo) memcpy(&body, fb + root + fo, 8);
        if (body % 8) return -1;
        p += 8 + ml + (size_t)body;
        msgs++;
    }
    return -1;
}

/* The exporters' printed trainer commands: each path one shell word (eg_shell_quote). */
static void test_shell_quote(void) {
    static const char *const cases[][2] = {
        {"sf", "sf"}, {"out/a-b_c.d,e=f:g@h%i+j", "out/a-b_c.d,e=f:g@h%i+j"}, {"", "''"},
        {"sp ace", "'sp ace'"}, {"it's", "'it'\\''s'"}, {"$HOME;rm", "'$HOME;rm'"}, {"'", "''\\'''"},
        {"a\nb", "'a\nb'"}, {"\xc3\xa9", "'\xc3\xa9'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *q = eg_shell_quote(cases[i][0]);
        CHECKF(q && !strcmp(q, cases[i][1]), "quote(\"%s\") = %s, want %s", cases[i][0], q ? q : "NULL", cases[i][1]);
        free(q);
    }
}

static void test_arrow_stream_framing(void) {
    eg_error err = {0};
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    eg_arrow_writer *w = NULL;
    eg_arrow_opts o = {3, 1000, "huggingface", "{}"};
    CHECK_OK(eg_arrow_open(f, cols, 2, &o, &w, &err), &err);
    for (int r = 0; w && r < 7; r++) {
        int32_t ids[5] = {r, r + 1, r + 2, r + 3, r + 4};
        CHECK_OK(eg_arrow_put_list_i32(w, 0, ids, r % 5, &err), &err);
        CHECK_OK(eg_arrow_put_i64(w, 1, r % 5, &err), &err);
        CHECK_OK(eg_arrow_end_row(w, &err), &err);
    }
    if (w) {
        CHECK_OK(eg_arrow_finish(w, &err), &err);
        CHECK(eg_arrow_rows(w) == 7);
    }
    fflush(f);
    CHECK(w && (size_t)eg_arrow_bytes(w) == n);
    CHECK(n % 8 == 0);
    /* schema + ceil(7 / 3) batches */
    CHECKF(walk((const uint8_t *)buf, n) == 1 + 3, "messages %d", walk((const uint8_t *)buf, n));
    CHECK(memmem(buf, n, "input_ids", 9) && memmem(buf, n, "huggingface", 11));
    eg_arrow_free(w);
    fclose(f);
    free(buf);
}

static void test_arrow_refusals(void) {
    eg_error err = {0};
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    eg_arrow_writer *w = NULL;
    eg_arrow_opts bad = {0, 10, NULL, NULL};
    CHECK(eg_arrow_open(f, cols, 2, &bad, &w, &err) == EG_ERR_INVALID && !w);
    eg_arrow_opts o = {10, 10, NULL, NULL};
    CHECK_OK(eg_arrow_open(f, cols, 2, &o, &w, &err), &err);
    if (w) {
        int32_t v[2] = {1, 2};
        CHECK(eg_arrow_put_i64(w, 0, 1, &err) == EG_ERR_INVALID);    /* list column given a scalar */
        CHECK(eg_arrow_put_list_i32(w, 5, v, 2, &err) == EG_ERR_INVALID); /* no such column */
        CHECK_OK(eg_arrow_put_list_i32(w, 0, v, 2, &err), &err);
        CHECK(eg_arrow_put_list_i32(w, 0, v, 2, &err) == EG_ERR_INVALID); /* twice in a row */
        CHECK(eg_arrow_end_row(w, &err) == EG_ERR_INVALID && strstr(err.msg, "seq_len"));
        CHECK(eg_arrow_finish(w, &err) == EG_ERR_INVALID);
        CHECK(eg_arrow_put_list_i32(w, 0, v, -1, &err) == EG_ERR_INVALID);
    }
    eg_arrow_free(w);
    eg_arrow_free(NULL);
    fclose(f);
    free(buf);
}

static void test_safetensors_header(void) {
    eg_error err = {0};
    int64_t s1[1] = {3}, s3[3] = {3, 4, 64};
    eg_st_desc d[2] = {{"token_ids", "I64", 1, s1, 8}, {"hidden_states", "BF16", 3, s3, 2}};
    uint8_t *h = NULL;
    size_t len = 0;
    uint64_t data = 0;
    CHECK_OK(eg_st_header(d, 2, &h, &len, &data, &err), &err);
    if (!h) return;
    const char *want = "{\"token_ids\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]},"
                       "\"hidden_states\":{\"dtype\":\"BF16\",\"shape\":[3,4,64],\"data_offsets\":[24,1560]}}";
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)h[i] << (8 * i);
    CHECK(hl == len - 8 && hl % 8 == 0 && data == 24 + 2 * 3 * 4 * 64);
    CHECK(!memcmp(h + 8, want, strlen(want)));
    for (size_t i = 8 + strlen(want); i < len; i++) CHECK(h[i] == ' ');
    free(h);
    eg_st_desc q = {"a\"b", "I64", 1, s1, 8};
    CHECK(eg_st_header(&q, 1, &h, &len, &data, &err) == EG_ERR_INVALID);
}

static void test_vocab_from_hist_rule(void) {
    eg_error err = {0};
    /* ids 7 and 3 tie (5 each), 9 has 6, 1 has 1: N = 3 keeps 9, 3, 7 (not 1) */
    uint64_t hist[10] = {0, 1, 0, 5, 0, 0, 0, 5, 0, 6};
    eg_draft_vocab v;
    CHECK_OK(eg_draft_vocab_from_hist(hist, 10, 3, 12, EG_VOCAB_TIE_LOW_ID, &v, &err), &err);
    CHECK(v.N == 3 && v.V == 12 && v.distinct == 4 && v.padding == 0 && v.covered == 16 && v.total == 17);
    CHECK(v.d2t && v.d2t[0] == 3 - 0 && v.d2t[1] == 7 - 1 && v.d2t[2] == 9 - 2); /* ids 3, 7, 9 ascending */
    eg_draft_vocab_clear(&v);
    /* N = 2: 9, then of the tied 3 and 7 the lower id */
    CHECK_OK(eg_draft_vocab_from_hist(hist, 10, 2, 12, EG_VOCAB_TIE_LOW_ID, &v, &err), &err);
    CHECK(v.d2t && v.d2t[0] == 3 && v.d2t[1] == 9 - 1 && v.t2d[3] && !v.t2d[7]);
    eg_draft_vocab_clear(&v);
    /* N = 7 over 4 distinct ids: padded with the lowest unused ids 0, 2, 4 */
    CHECK_OK(eg_draft_vocab_from_hist(hist, 10, 7, 12, EG_VOCAB_TIE_LOW_ID, &v, &err), &err);
    int64_t want[7] = {0, 1, 2, 3, 4, 7, 9};
    CHECK(v.padding == 3);
    for (int i = 0; v.d2t && i < 7; i++) CHECKF(i + v.d2t[i] == want[i], "draft %d -> %" PRId64, i, i + v.d2t[i]);
    int kept = 0;
    for (int t = 0; v.t2d && t < 12; t++) kept += v.t2d[t];
    CHECK(kept == 7 && v.t2d[9] && !v.t2d[5]);
    eg_draft_vocab_clear(&v);
    CHECK(eg_draft_vocab_from_hist(hist, 10, 13, 12, EG_VOCAB_TIE_LOW_ID, &v, &err) == EG_ERR_INVALID);
    eg_draft_vocab_clear(NULL);
}

static const eg_test tests[] = {
    {"shell_quote", test_shell_quote},
    {"arrow_stream_framing", test_arrow_stream_framing},
    {"arrow_refusals", test_arrow_refusals},
    {"safetensors_header", test_safetensors_header},
    {"vocab_from_hist_rule", test_vocab_from_hist_rule},
};

int main(int argc, char **argv) {
    return eg_test_main("dataset_export_writers", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
