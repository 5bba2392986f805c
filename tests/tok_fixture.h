/* tok_fixture.h — the fixture tokenizer, loaded once per prompts test binary.
 * Include after check.h; call tok_fixture_free() in the last test. */
#ifndef EG_TOK_FIXTURE_H
#define EG_TOK_FIXTURE_H

#include "prompts/tokenizer.h"

#define TOKDIR "../shared/fixtures/tokenizer"

static tok_tokenizer *g_tok;

static tok_tokenizer *tok(void) {
    if (!g_tok) {
        eg_error err = {0};
        if (tok_load(TOKDIR, &g_tok, &err)) {
            fprintf(stderr, "    cannot load %s: %s\n", TOKDIR, err.msg);
            exit(1);
        }
    }
    return g_tok;
}

#endif
