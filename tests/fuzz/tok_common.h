/* tok_common.h — the fixture tokenizer, loaded once per process, for the harnesses that
 * need one (tokenizer, corpus records and streams, chat template). */
#ifndef EG_FUZZ_TOK_COMMON_H
#define EG_FUZZ_TOK_COMMON_H

#include "prompts/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static tok_tokenizer *fuzz_tok_handle;
static void fuzz_tok_free(void) { tok_free(fuzz_tok_handle); }
static inline const tok_tokenizer *fuzz_tok(void) {
    if (!fuzz_tok_handle) {
        char dir[4096];
        eg_error err = {0};
        snprintf(dir, sizeof dir, "%s/tokenizer", fuzz_fixtures());
        if (tok_load(dir, &fuzz_tok_handle, &err)) {
            fprintf(stderr, "fuzz: cannot load the fixture tokenizer %s: %s (set FIXTURES)\n", dir, err.msg);
            abort();
        }
        atexit(fuzz_tok_free);
    }
    return fuzz_tok_handle;
}

#endif
