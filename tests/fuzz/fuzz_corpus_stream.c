/* Fuzz target: the streaming corpus reader (prompts/corpus.c corpus_open/corpus_next)
 * over a whole file: plain, gz/zst/xz/bz2 (detected from the content), CRLF, a BOM,
 * long lines (a 4 KiB line limit here, so the too-long path is reached). Property:
 * record indices count up from 0 and lines increase within the file; I/O errors (corrupt
 * compression) are errors, never crashes; the same bytes read as stdin (a pipe: plain text
 * by read(), the rest through libarchive) give the same records and the same error. */
#include <fcntl.h>
#include <unistd.h>

#include "prompts/corpus.h"
#include "tests/fuzz/tok_common.h"

/* One pass over path: the records' (index, line, raw line) hashed, their count, and
 * whether the pass ended in an error. */
typedef struct pass_sum {
    uint64_t n, h;
    int failed;
} pass_sum;

static pass_sum one_pass(const char *path, const tok_tokenizer *t, const corpus_opts *o) {
    pass_sum ps = {0, 1469598103934665603ull, 0};
    corpus_reader *r = NULL;
    eg_error err = {0};
    const char *paths[1] = {path};
    if (corpus_open(paths, 1, t, o, &r, &err) != EG_OK) {
        ps.failed = 1;
        return ps;
    }
    corpus_record rec = {0};
    bool got = false;
    uint64_t last_line = 0;
    eg_status st;
    while ((st = corpus_next(r, &rec, &got, &err)) == EG_OK && got) {
        FUZZ_CHECK(rec.index == ps.n);
        FUZZ_CHECK(rec.line > last_line);
        FUZZ_CHECK(rec.id && rec.raw);
        last_line = rec.line;
        uint64_t v[2] = {rec.index, rec.line};
        for (size_t i = 0; i < sizeof v; i++) ps.h = (ps.h ^ ((const uint8_t *)v)[i]) * 1099511628211ull;
        for (size_t i = 0; i < rec.raw_len; i++) ps.h = (ps.h ^ (uint8_t)rec.raw[i]) * 1099511628211ull;
        if (++ps.n > 100000) break;
    }
    ps.failed = st != EG_OK;
    corpus_record_free(&rec);
    corpus_close(r);
    return ps;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    const tok_tokenizer *t = fuzz_tok();
    const char *path = fuzz_file("in.jsonl", d, n);
    corpus_opts o;
    corpus_opts_default(&o);
    o.mode = n & 1 ? CORPUS_CAPTURE : CORPUS_REGENERATE;
    o.max_line_bytes = 4096;
    o.max_prompt_tokens = 2048;
    pass_sum file = one_pass(path, t, &o);
    /* The same bytes as stdin ("-"), which is read as a pipe: plain text by read() itself,
       anything else through libarchive after the sniffed bytes. Property: the same records,
       and an error exactly where the file gave one. */
    int saved = dup(0), fd = open(path, O_RDONLY);
    if (saved < 0 || fd < 0 || dup2(fd, 0) < 0) abort();
    close(fd);
    pass_sum in = one_pass("-", t, &o);
    if (dup2(saved, 0) < 0) abort();
    close(saved);
    FUZZ_CHECK(in.n == file.n && in.h == file.h && in.failed == file.failed);
    return 0;
}
