/* Fuzz target: the Kimi chat template and its loss mask (prompts/chat.c through
 * corpus_parse in capture mode). Property: for every accepted conversation the tokens
 * under the mask, decoded, are exactly the assistant spans of the rendered text (in
 * order), and the whole render decodes back to the rendered text. */
#include "prompts/corpus.h"
#include "tests/fuzz/tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (n < 1) return 0;
    const tok_tokenizer *t = fuzz_tok();
    corpus_opts o;
    corpus_opts_default(&o);
    o.mode = d[0] & 1 ? CORPUS_CAPTURE : CORPUS_RENDER;
    o.thinking = (d[0] >> 1) & 1;
    o.add_generation_prompt = (d[0] >> 2) & 1;
    char *line = fuzz_cstr(d + 1, n - 1);
    corpus_record rec = {0};
    rec.file = "fuzz.jsonl";
    rec.line = 1;
    eg_error err = {0};
    FUZZ_CHECK(corpus_parse(t, &o, line, n - 1, &rec, &err) == EG_OK);
    if (rec.ok && rec.render.n_spans > 0 && rec.loss_mask) {
        /* masked tokens == spans */
        size_t want_len = 0, got_len = 0;
        for (size_t k = 0; k < rec.render.n_spans; k++) {
            FUZZ_CHECK(rec.render.spans[k].begin <= rec.render.spans[k].end && rec.render.spans[k].end <= rec.render.len);
            want_len += rec.render.spans[k].end - rec.render.spans[k].begin;
        }
        char *want = malloc(want_len + 1), *got = malloc(want_len + 1);
        FUZZ_CHECK(want && got);
        size_t w = 0;
        for (size_t k = 0; k < rec.render.n_spans; k++) {
            size_t b = rec.render.spans[k].begin, e = rec.render.spans[k].end;
            memcpy(want + w, rec.render.text + b, e - b);
            w += e - b;
        }
        for (size_t i = 0; i < rec.ids.n; i++) {
            FUZZ_CHECK(rec.loss_mask[i] <= 1);
            if (!rec.loss_mask[i]) continue;
            size_t tl;
            const char *tb = tok_token_bytes(t, rec.ids.ids[i], &tl);
            FUZZ_CHECK(tb && got_len + tl <= want_len);
            memcpy(got + got_len, tb, tl);
            got_len += tl;
        }
        FUZZ_CHECK(got_len == want_len && !memcmp(got, want, want_len));
        free(want);
        free(got);
    }
    if (rec.ok && rec.render.len > 0 && rec.format != CORPUS_FMT_INPUT_IDS) {
        char *back = NULL;
        size_t blen = 0;
        FUZZ_CHECK(tok_decode(t, rec.ids.ids, rec.ids.n, &back, &blen, &err) == EG_OK);
        FUZZ_CHECK(blen == rec.render.len && !memcmp(back, rec.render.text, blen));
        free(back);
    }
    corpus_record_free(&rec);
    free(line);
    return 0;
}
