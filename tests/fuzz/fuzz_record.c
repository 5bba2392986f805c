/* Fuzz target: the sample record codec (dataset/format.c). Byte 0 picks the mode:
 *  even: decode the rest as a record (full and meta_only); what decodes must re-encode
 *        and decode to the same sample;
 *  odd:  build a sample from the rest (id and source_file bytes as given, sampling
 *        parameters as raw doubles, small shapes) and encode it; what encode accepts
 *        must decode to the same sample (decode(encode(x)) == x), and encode must refuse
 *        exactly what decode would (issue 22: non-UTF-8 ids, NaN temperatures). */
#include <math.h>

#include "dataset/format.h"
#include "tests/fuzz/fuzz.h"

static int same(const eg_ds_sample *a, const eg_ds_sample *b) {
    size_t T = (size_t)a->T, H = (size_t)a->H, na = (size_t)a->n_aux;
    return !strcmp(a->id, b->id) && !strcmp(a->source_file, b->source_file) && a->source_line == b->source_line &&
           a->prompt_len == b->prompt_len && a->gen_len == b->gen_len && a->finish == b->finish &&
           !memcmp(&a->temperature, &b->temperature, sizeof(double)) && !memcmp(&a->top_p, &b->top_p, sizeof(double)) &&
           a->top_k == b->top_k && a->seed == b->seed && a->T == b->T && a->H == b->H && a->n_aux == b->n_aux &&
           !memcmp(a->input_ids, b->input_ids, T * 4) && !memcmp(a->loss_mask, b->loss_mask, T) &&
           !memcmp(a->aux_hidden, b->aux_hidden, T * na * H * 2) && !memcmp(a->final_hidden, b->final_hidden, T * H * 2);
}

static eg_ds_codec *codec(int split) {
    static eg_ds_codec *c[2];
    eg_error err = {0};
    if (!c[split] && eg_ds_codec_new(1, split, &c[split], &err)) abort();
    return c[split];
}

static void roundtrip(const eg_ds_sample *s, int split, int must_encode) {
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t raw = 0;
    eg_error err = {0};
    eg_status st = eg_ds_record_encode(codec(split), s, &buf, &len, &raw, &err);
    if (must_encode) FUZZ_CHECK(st == EG_OK);
    if (st == EG_OK) {
        eg_ds_sample r;
        st = eg_ds_record_decode(buf, len, 0, &r, &err);
        if (st) fprintf(stderr, "decode of an encoded record failed: %s\n", err.msg);
        FUZZ_CHECK(st == EG_OK);
        FUZZ_CHECK(same(s, &r));
        eg_ds_sample_clear(&r);
    } else {
        FUZZ_CHECK(st == EG_ERR_INVALID);
    }
    free(buf);
}

/* pull k bytes (zero-padded past the end) */
static void take(const uint8_t **p, const uint8_t *end, void *out, size_t k) {
    size_t have = (size_t)(end - *p) < k ? (size_t)(end - *p) : k;
    memset(out, 0, k);
    memcpy(out, *p, have);
    *p += have;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (n < 1) return 0;
    eg_error err = {0};
    if (!(d[0] & 1)) {
        eg_ds_sample s;
        if (eg_ds_record_decode(d + 1, n - 1, 1, &s, &err) == EG_OK) eg_ds_sample_clear(&s);
        if (eg_ds_record_decode(d + 1, n - 1, 0, &s, &err) == EG_OK) {
            FUZZ_CHECK(s.id && s.source_file);
            roundtrip(&s, (d[0] >> 1) & 1, 1);
            eg_ds_sample_clear(&s);
        }
        return 0;
    }
    const uint8_t *p = d + 1, *end = d + n;
    uint8_t hdr[4];
    take(&p, end, hdr, 4);
    int T = hdr[0] % 9, na = hdr[1] % 4, H = 1 + hdr[2] % 8, split = hdr[3] & 1;
    eg_ds_sample s;
    memset(&s, 0, sizeof s);
    uint8_t lens[2];
    take(&p, end, lens, 2);
    char *id = calloc(1, (size_t)lens[0] % 24 + 1), *src = calloc(1, (size_t)lens[1] % 24 + 1);
    FUZZ_CHECK(id && src);
    take(&p, end, id, (size_t)lens[0] % 24);
    take(&p, end, src, (size_t)lens[1] % 24);
    s.id = id; /* stops at an embedded NUL, as a C string does */
    s.source_file = src;
    take(&p, end, &s.source_line, 8);
    take(&p, end, &s.prompt_len, 8);
    take(&p, end, &s.gen_len, 8);
    take(&p, end, &s.temperature, 8);
    take(&p, end, &s.top_p, 8);
    take(&p, end, &s.top_k, 8);
    take(&p, end, &s.seed, 8);
    s.finish = hdr[3] & 2 ? EG_DS_FINISH_LENGTH : EG_DS_FINISH_STOP;
    s.T = T;
    s.n_aux = na;
    s.H = H;
    s.hidden_dtype = EG_DS_BF16;
    s.input_ids = calloc((size_t)T + 1, 4);
    s.loss_mask = calloc((size_t)T + 1, 1);
    s.aux_hidden = calloc((size_t)(T * na * H) + 1, 2);
    s.final_hidden = calloc((size_t)(T * H) + 1, 2);
    FUZZ_CHECK(s.input_ids && s.loss_mask && s.aux_hidden && s.final_hidden);
    take(&p, end, s.input_ids, (size_t)T * 4);
    take(&p, end, s.loss_mask, (size_t)T);
    for (int i = 0; i < T; i++) s.loss_mask[i] &= 1;
    take(&p, end, s.aux_hidden, (size_t)(T * na * H) * 2);
    take(&p, end, s.final_hidden, (size_t)(T * H) * 2);
    int encodable = eg_utf8_valid_prefix(id, strlen(id)) == strlen(id) &&
                    eg_utf8_valid_prefix(src, strlen(src)) == strlen(src) && isfinite(s.temperature) &&
                    isfinite(s.top_p);
    roundtrip(&s, split, encodable);
    eg_ds_sample_clear(&s);
    return 0;
}
