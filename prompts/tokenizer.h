/* tokenizer.h — Kimi's tiktoken-format BPE tokenizer: loads `tiktoken.model` and
 * `tokenizer_config.json` from a directory, encodes UTF-8 text to token ids exactly as
 * Kimi's tokenization_kimi.py (tiktoken core + Kimi's pre-tokenizer pattern and
 * chunking) does, and decodes ids back to bytes.
 *
 * Ids: 0..n_base-1 are the base (byte-pair) tokens; n_base..n_base+255 are the special
 * tokens (names from added_tokens_decoder, unlisted ones `<|reserved_token_{id}|>`).
 *
 * Ownership: tok_load returns a tokenizer the caller frees with tok_free (NULL ok).
 * tok_seq buffers belong to the caller (tok_seq_free).
 * Thread safety: after tok_load the tokenizer is read-only; tok_encode, tok_decode and
 * every other function may be called concurrently from any number of threads on one
 * tokenizer (each call allocates its own scratch; PCRE2 match data is per call). */
#ifndef EG_PROMPTS_TOKENIZER_H
#define EG_PROMPTS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/eg_common.h"

typedef struct tok_tokenizer tok_tokenizer;

/* Number of special-token ids after the base vocabulary (Kimi: 256). */
#define TOK_N_SPECIAL 256

/* A growable list of token ids, optionally with the byte offset of each token's
 * first byte in the encoded text. Zero-initialise before first use. */
typedef struct tok_seq {
    int32_t *ids;     /* [n] token ids */
    size_t *offsets;  /* [n] start byte of each token in the text; only with TOK_OFFSETS */
    size_t n, cap;
} tok_seq;

void tok_seq_free(tok_seq *s); /* frees the arrays and zeroes *s; NULL ok */
void tok_seq_clear(tok_seq *s); /* n = 0, keeps the memory */
eg_status tok_seq_push(tok_seq *s, int32_t id, size_t offset, eg_error *err);

/* Load DIR/tiktoken.model and DIR/tokenizer_config.json. Errors name the file and
 * line (or JSON position). */
eg_status tok_load(const char *dir, tok_tokenizer **out, eg_error *err);
void tok_free(tok_tokenizer *t);

/* encode flags */
enum {
    TOK_ALLOW_SPECIAL = 1, /* special-token text (e.g. "<|im_end|>") becomes its id;
                              without it the text is encoded as ordinary bytes */
    TOK_OFFSETS = 2        /* also fill out->offsets */
};

/* Encode `len` bytes of UTF-8 `text` (NUL bytes allowed) and APPEND the ids to *out.
 * Offsets (with TOK_OFFSETS) are relative to `text`. Fails with EG_ERR_FORMAT on
 * invalid UTF-8 (message gives the byte offset); out is then left with its old n. */
eg_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, int flags,
                     tok_seq *out, eg_error *err);

/* Decode ids to bytes (special ids decode to their names). *out is malloc'd, NUL
 * terminated (not counted in *out_len); caller frees. Fails on an id outside
 * [0, n_vocab). Token bytes may be partial UTF-8 sequences. */
eg_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, char **out,
                     size_t *out_len, eg_error *err);

/* Bytes of one token (not NUL terminated); NULL for an id outside [0, n_vocab). */
const char *tok_token_bytes(const tok_tokenizer *t, int32_t id, size_t *len);

/* Id of a special token by its name ("<|im_end|>", "[EOS]", "<think>"...), or -1. */
int32_t tok_special_id(const tok_tokenizer *t, const char *name);
/* Id of any token whose bytes are exactly s[0..n) (base or special), or -1. */
int32_t tok_token_id(const tok_tokenizer *t, const char *s, size_t n);

int32_t tok_n_vocab(const tok_tokenizer *t); /* n_base + 256 */
int32_t tok_n_base(const tok_tokenizer *t);
int tok_is_special(const tok_tokenizer *t, int32_t id);

/* SHA-256 (hex) over both files' bytes, so datasets record which tokenizer made them. */
const char *tok_fingerprint(const tok_tokenizer *t);

/* Strict UTF-8 check (no overlongs, surrogates or > U+10FFFF). Returns the offset of
 * the first invalid byte, or len if valid. */
size_t tok_utf8_check(const char *s, size_t len);

#endif
