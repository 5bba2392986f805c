/* Fuzz target: one corpus record (prompts/corpus.c corpus_parse), regenerate mode, all
 * record styles. Property: a record is either rejected with a reason or carries valid
 * ids within the prompt limit, and the default id names file and line. */
#include "prompts/corpus.h"
#include "tests/fuzz/tok_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    const tok_tokenizer *t = fuzz_tok();
    corpus_opts o;
    corpus_opts_default(&o);
    o.mode = CORPUS_REGENERATE;
    o.max_prompt_tokens = 4096;
    o.text_only = n & 1;
    char *line = fuzz_cstr(d, n);
    corpus_record rec = {0};
    rec.file = "fuzz.jsonl";
    rec.line = 7;
    eg_error err = {0};
    FUZZ_CHECK(corpus_parse(t, &o, line, n, &rec, &err) == EG_OK);
    FUZZ_CHECK(rec.id && *rec.id);
    if (rec.ok) {
        FUZZ_CHECK(rec.ids.n > 0 && rec.ids.n <= o.max_prompt_tokens);
        for (size_t i = 0; i < rec.ids.n; i++) FUZZ_CHECK(rec.ids.ids[i] >= 0 && rec.ids.ids[i] < tok_n_vocab(t));
    } else {
        FUZZ_CHECK(rec.reason[0] != 0);
    }
    corpus_record_free(&rec);
    free(line);
    return 0;
}
