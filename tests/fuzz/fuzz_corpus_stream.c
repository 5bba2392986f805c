/* Fuzz target: the streaming corpus reader (prompts/corpus.c corpus_open/corpus_next)
 * over a whole file: plain, gz/zst/xz/bz2 (detected from the content), CRLF, a BOM,
 * long lines (a 4 KiB line limit here, so the too-long path is reached). Property:
 * record indices count up from 0 and lines increase within the file; I/O errors (corrupt
 * compression) are errors, never crashes. */
#include "prompts/corpus.h"
#include "tests/fuzz/tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    const tok_tokenizer *t = fuzz_tok();
    const char *path = fuzz_file("in.jsonl", d, n);
    corpus_opts o;
    corpus_opts_default(&o);
    o.mode = n & 1 ? CORPUS_CAPTURE : CORPUS_REGENERATE;
    o.max_line_bytes = 4096;
    o.max_prompt_tokens = 2048;
    corpus_reader *r = NULL;
    eg_error err = {0};
    const char *paths[1] = {path};
    if (corpus_open(paths, 1, t, &o, &r, &err) == EG_OK) {
        corpus_record rec = {0};
        bool got = false;
        uint64_t want_index = 0, last_line = 0;
        while (corpus_next(r, &rec, &got, &err) == EG_OK && got) {
            FUZZ_CHECK(rec.index == want_index);
            FUZZ_CHECK(rec.line > last_line);
            FUZZ_CHECK(rec.id && rec.raw);
            want_index++;
            last_line = rec.line;
            if (want_index > 100000) break;
        }
        corpus_record_free(&rec);
        corpus_close(r);
    }
    return 0;
}
