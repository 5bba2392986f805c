/* Fuzz target: the tokenizer (prompts/tokenizer.c). Byte 0 picks the flags; the rest is
 * text. Property: valid UTF-8 encodes, and decode(encode(text)) == text, with and without
 * special-token recognition; offsets increase and stay inside the text. */
#include "tests/fuzz/tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (n < 1) return 0;
    const tok_tokenizer *t = fuzz_tok();
    int flags = (d[0] & 1 ? TOK_ALLOW_SPECIAL : 0) | TOK_OFFSETS;
    const char *text = (const char *)d + 1;
    size_t len = n - 1;
    tok_seq s = {0};
    eg_error err = {0};
    eg_status st = tok_encode(t, text, len, flags, &s, &err);
    int valid = tok_utf8_check(text, len) == len;
    FUZZ_CHECK(valid ? st == EG_OK : st == EG_ERR_FORMAT);
    if (st == EG_OK) {
        for (size_t i = 0; i < s.n; i++) {
            FUZZ_CHECK(s.ids[i] >= 0 && s.ids[i] < tok_n_vocab(t));
            FUZZ_CHECK(s.offsets[i] <= len && (i == 0 || s.offsets[i] >= s.offsets[i - 1]));
            if (!(flags & TOK_ALLOW_SPECIAL)) FUZZ_CHECK(!tok_is_special(t, s.ids[i]));
        }
        char *back = NULL;
        size_t blen = 0;
        FUZZ_CHECK(tok_decode(t, s.ids, s.n, &back, &blen, &err) == EG_OK);
        FUZZ_CHECK(blen == len && !memcmp(back, text, len));
        free(back);
    }
    tok_seq_free(&s);
    return 0;
}
