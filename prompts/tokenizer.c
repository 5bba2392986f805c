/* Kimi tiktoken tokenizer; see tokenizer.h.
 *
 * Encoding follows tokenization_kimi.py + tiktoken's Rust core step by step:
 *   1. cut the text into pieces of at most 400,000 code points;
 *   2. cut each piece where a run of whitespace / non-whitespace (str.isspace) exceeds
 *      25,000 code points;
 *   3. in each resulting substring, split at special-token text (when allowed), run
 *      the pre-tokenizer regex over the text between specials, and BPE each match.
 * Every step must be reproduced, not just the regex: a special token cut by step 1/2
 * is encoded as plain text, and the regex sees each substring's end as end of text. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "prompts/tokenizer.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/eg_hash.h"

#define RANK_NONE UINT32_MAX
#define MAX_CHUNK_CPS 400000  /* TIKTOKEN_MAX_ENCODE_CHARS */
#define MAX_RUN_CPS 25000     /* MAX_NO_WHITESPACES_CHARS */
#define SMALL_PIECE 128       /* below this, tiktoken's quadratic merge is fastest */

/* Kimi's pre-tokenizer. Differences in spelling, not meaning, from the Python source:
 *  - `&&[^\p{Han}]` (class intersection) is written `(?:(?!\p{sc:Han})[...])`;
 *  - \p{Han} is `\p{sc:Han}`: Rust's regex means the Script property, while PCRE2's bare
 *    script name means Script_Extensions (which would pull in 、。「」 and friends);
 *  - \s / \S are spelled out as Unicode White_Space, which is what Rust's \s matches
 *    (PCRE2's UCP \s lacks U+0085). */
#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define UPPERISH "(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define LOWERISH "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
static const char KIMI_PATTERN[] =
    "\\p{sc:Han}+"
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "*" LOWERISH "+" CONTR
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPERISH "+" LOWERISH "*" CONTR
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

typedef struct tok_entry {
    uint32_t off, len; /* into bytes arena */
} tok_entry;

/* 16-byte slots with short keys inline: a lookup touches one cache line instead of
 * slot + token table + arena (the tables are far bigger than L2). */
typedef struct tok_slot {
    uint32_t id1; /* id + 1; 0 = empty */
    uint16_t len; /* key length */
    uint16_t h16; /* more hash bits, to skip most compares */
    union {
        uint8_t b[8]; /* len <= 8: the bytes */
        uint32_t off; /* len > 8: offset in the arena */
    } k;
} tok_slot;

typedef struct tok_map {
    tok_slot *slots;
    size_t mask;
} tok_map;

struct tok_tokenizer {
    int32_t n_base;
    tok_entry *tokens;   /* [n_base + 256]: base tokens then specials */
    uint8_t *arena;      /* token bytes */
    size_t arena_len;
    tok_map base_map;    /* bytes -> rank */
    tok_map special_map; /* name -> special id */
    size_t max_len;      /* longest base token */
    uint32_t byte_rank[256];
    uint8_t special_first[256]; /* first bytes of special names */
    size_t special_lens[TOK_N_SPECIAL];
    int n_special_lens;   /* distinct lengths, descending */
    pcre2_code *re;
    int re_jit;
    char fingerprint[65];
};

/* ---------------------------------------------------------------- tok_seq */

void tok_seq_free(tok_seq *s) {
    if (!s) return;
    free(s->ids);
    free(s->offsets);
    memset(s, 0, sizeof *s);
}

void tok_seq_clear(tok_seq *s) { s->n = 0; }

static eg_status seq_reserve(tok_seq *s, size_t need, int offsets, eg_error *err) {
    if (need <= s->cap && (!offsets || s->offsets)) return EG_OK;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need) cap *= 2;
    int32_t *ids = realloc(s->ids, cap * sizeof *ids);
    if (!ids) return eg_fail(err, EG_ERR_NOMEM, "out of memory (%zu token ids)", cap);
    s->ids = ids;
    if (offsets || s->offsets) {
        size_t *o = realloc(s->offsets, cap * sizeof *o);
        if (!o) return eg_fail(err, EG_ERR_NOMEM, "out of memory (%zu token offsets)", cap);
        if (!s->offsets) memset(o, 0, s->n * sizeof *o); /* earlier tokens had none */
        s->offsets = o;
    }
    s->cap = cap;
    return EG_OK;
}

eg_status tok_seq_push(tok_seq *s, int32_t id, size_t offset, eg_error *err) {
    if (s->n == s->cap) {
        eg_status st = seq_reserve(s, s->n + 1, 0, err);
        if (st) return st;
    }
    s->ids[s->n] = id;
    if (s->offsets) s->offsets[s->n] = offset;
    s->n++;
    return EG_OK;
}

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static eg_status map_init(tok_map *m, size_t n, eg_error *err) {
    size_t cap = 16;
    while (cap < n + n / 2) cap *= 2;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return eg_fail(err, EG_ERR_NOMEM, "out of memory (token map)");
    m->mask = cap - 1;
    return EG_OK;
}

static uint32_t map_find(const tok_tokenizer *t, const tok_map *m, const uint8_t *p, size_t n) {
    if (n > 0xFFFF) return RANK_NONE;
    uint64_t h = hash_bytes(p, n);
    uint16_t h16 = (uint16_t)(h >> 48);
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        const tok_slot *s = &m->slots[i];
        if (!s->id1) return RANK_NONE;
        if (s->len != n || s->h16 != h16) continue;
        if (n <= 8 ? !memcmp(s->k.b, p, n) : !memcmp(t->arena + s->k.off, p, n)) return s->id1 - 1;
    }
}

/* Insert id; returns the id already holding the same bytes, or RANK_NONE. */
static uint32_t map_insert(tok_tokenizer *t, tok_map *m, uint32_t id) {
    const tok_entry *e = &t->tokens[id];
    const uint8_t *p = t->arena + e->off;
    uint32_t old = map_find(t, m, p, e->len);
    if (old != RANK_NONE) return old;
    uint64_t h = hash_bytes(p, e->len);
    size_t i = (size_t)h & m->mask;
    while (m->slots[i].id1) i = (i + 1) & m->mask;
    tok_slot *s = &m->slots[i];
    s->id1 = id + 1;
    s->len = (uint16_t)e->len;
    s->h16 = (uint16_t)(h >> 48);
    if (e->len <= 8) memcpy(s->k.b, p, e->len);
    else s->k.off = e->off;
    return RANK_NONE;
}

static inline uint32_t rank_of(const tok_tokenizer *t, const uint8_t *p, size_t n) {
    if (n == 1) return t->byte_rank[p[0]];
    if (n > t->max_len) return RANK_NONE;
    return map_find(t, &t->base_map, p, n);
}

/* ---------------------------------------------------------------- UTF-8 */

/* The one UTF-8 validator (common/eg_common.c): overlongs, surrogates and code points past
 * U+10FFFF are invalid. */
size_t tok_utf8_check(const char *s, size_t len) { return eg_utf8_valid_prefix(s, len); }

/* Decode one code point of valid UTF-8; advances *i. */
static inline uint32_t utf8_next(const uint8_t *s, size_t *i) {
    uint8_t c = s[*i];
    if (c < 0x80) { (*i)++; return c; }
    if (c < 0xE0) { uint32_t cp = ((c & 0x1Fu) << 6) | (s[*i + 1] & 0x3Fu); *i += 2; return cp; }
    if (c < 0xF0) {
        uint32_t cp = ((c & 0x0Fu) << 12) | ((s[*i + 1] & 0x3Fu) << 6) | (s[*i + 2] & 0x3Fu);
        *i += 3;
        return cp;
    }
    uint32_t cp = ((c & 0x07u) << 18) | ((s[*i + 1] & 0x3Fu) << 12) | ((s[*i + 2] & 0x3Fu) << 6) |
                  (s[*i + 3] & 0x3Fu);
    *i += 4;
    return cp;
}

/* Python's str.isspace (Unicode 15): White_Space plus the bidi B/S controls 0x1C-0x1F. */
static inline int py_isspace(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---------------------------------------------------------------- BPE */

typedef struct heap_ent {
    uint32_t rank, start, end;
} heap_ent;

static inline int heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->start < b->start);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n) {
    heap_ent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Lowest-rank-first merging, ties to the leftmost pair: tiktoken's _byte_pair_merge.
 * O(n^2) on its array for short pieces, O(n log n) with a heap + linked list for long
 * ones; both pick exactly the same merges. */
static eg_status bpe_piece(const tok_tokenizer *t, const uint8_t *p, size_t n, size_t off,
                           tok_seq *out, eg_error *err) {
    uint32_t whole = rank_of(t, p, n);
    if (whole != RANK_NONE) return tok_seq_push(out, (int32_t)whole, off, err);
    if (n < SMALL_PIECE) {
        /* pos: part starts; rk: rank of part i merged with part i+1; tr: part i's own rank */
        uint32_t pos[SMALL_PIECE + 1], rk[SMALL_PIECE + 1], tr[SMALL_PIECE + 1];
        size_t cnt = n + 1;
        for (size_t i = 0; i + 1 < n; i++) {
            pos[i] = (uint32_t)i;
            rk[i] = rank_of(t, p + i, 2);
        }
        for (size_t i = 0; i < n; i++) tr[i] = t->byte_rank[p[i]];
        pos[n - 1] = (uint32_t)(n - 1);
        rk[n - 1] = RANK_NONE;
        pos[n] = (uint32_t)n;
        rk[n] = RANK_NONE;
        for (;;) {
            uint32_t minr = RANK_NONE;
            size_t mi = 0;
            for (size_t i = 0; i + 1 < cnt; i++)
                if (rk[i] < minr) { minr = rk[i]; mi = i; }
            if (minr == RANK_NONE) break;
#define GET_RANK(i) ((i) + 3 < cnt ? rank_of(t, p + pos[i], pos[(i) + 3] - pos[i]) : RANK_NONE)
            if (mi > 0) rk[mi - 1] = GET_RANK(mi - 1);
            rk[mi] = GET_RANK(mi);
#undef GET_RANK
            memmove(&pos[mi + 1], &pos[mi + 2], (cnt - mi - 2) * sizeof pos[0]);
            memmove(&rk[mi + 1], &rk[mi + 2], (cnt - mi - 2) * sizeof rk[0]);
            tr[mi] = minr;
            memmove(&tr[mi + 1], &tr[mi + 2], (cnt - mi - 2) * sizeof tr[0]);
            cnt--;
        }
        for (size_t i = 0; i + 1 < cnt; i++) {
            eg_status st = tok_seq_push(out, (int32_t)tr[i], off + pos[i], err);
            if (st) return st;
        }
        return EG_OK;
    }
    if (n >= UINT32_MAX) return eg_fail(err, EG_ERR_INVALID, "pre-token of %zu bytes is too long", n);
    /* nxt[i]/prv[i]: neighbours of the part starting at byte i (n = none). */
    /* tr[i]: rank of the part starting at byte i */
    uint32_t *nxt = malloc((n + 1) * sizeof *nxt), *prv = malloc((n + 1) * sizeof *prv);
    uint32_t *tr = malloc(n * sizeof *tr);
    heap_ent *heap = malloc(3 * n * sizeof *heap);
    if (!nxt || !prv || !tr || !heap) {
        free(nxt); free(prv); free(tr); free(heap);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory (BPE of %zu bytes)", n);
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = (uint32_t)(i + 1);
        prv[i] = i ? (uint32_t)(i - 1) : (uint32_t)n;
        tr[i] = t->byte_rank[p[i]];
    }
    nxt[n] = (uint32_t)n;
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = rank_of(t, p + i, 2);
        if (r != RANK_NONE) heap_push(heap, &hn, (heap_ent){r, (uint32_t)i, (uint32_t)(i + 2)});
    }
    /* a part is alive iff prv/nxt still link to it: track with a dead marker in prv */
    const uint32_t DEAD = UINT32_MAX;
    while (hn) {
        heap_ent e = heap_pop(heap, &hn);
        uint32_t i = e.start;
        if (prv[i] == DEAD) continue;
        uint32_t j = nxt[i];
        if (j >= n || nxt[j] != e.end) continue; /* stale */
        /* merge j into i */
        nxt[i] = nxt[j];
        if (nxt[j] < n) prv[nxt[j]] = i;
        prv[j] = DEAD;
        tr[i] = e.rank;
        if (prv[i] != n) {
            uint32_t a = prv[i];
            uint32_t r = rank_of(t, p + a, nxt[i] - a);
            if (r != RANK_NONE) heap_push(heap, &hn, (heap_ent){r, a, nxt[i]});
        }
        if (nxt[i] < n) {
            uint32_t e2 = nxt[nxt[i]];
            uint32_t r = rank_of(t, p + i, e2 - i);
            if (r != RANK_NONE) heap_push(heap, &hn, (heap_ent){r, i, e2});
        }
    }
    eg_status st = EG_OK;
    for (uint32_t i = 0; i < n && !st; i = nxt[i]) st = tok_seq_push(out, (int32_t)tr[i], off + i, err);
    free(nxt);
    free(tr);
    free(prv);
    free(heap);
    return st;
}

/* ---------------------------------------------------------------- encode */

typedef struct enc_ctx {
    const tok_tokenizer *t;
    const uint8_t *text; /* whole input; offsets are relative to it */
    int flags;
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* with a big JIT stack, made on first need */
    pcre2_jit_stack *jstack;
    tok_seq *out;
    eg_error *err;
} enc_ctx;

/* Regex + BPE over text[a, b) (no special tokens inside). */
static eg_status encode_ordinary(enc_ctx *c, size_t a, size_t b) {
    const uint8_t *seg = c->text + a;
    size_t n = b - a, off = 0;
    while (off < n) {
        int rc = pcre2_match(c->t->re, seg, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {
            /* a 25,000-letter word needs more than the default 32 KiB JIT stack */
            c->mctx = pcre2_match_context_create(NULL);
            c->jstack = pcre2_jit_stack_create(1 << 16, 64 << 20, NULL);
            if (c->mctx && c->jstack) {
                pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
                rc = pcre2_match(c->t->re, seg, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
            }
        }
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* still: the interpreter's heap frames */
            rc = pcre2_match(c->t->re, seg, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return eg_fail(c->err, EG_ERR_INVALID, "pre-tokenizer failed at byte %zu: %s", a + off,
                           (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* cannot happen with this pattern; step one code point to be safe */
            size_t i = off;
            utf8_next(seg, &i);
            off = i;
            continue;
        }
        eg_status st = bpe_piece(c->t, seg + s, e - s, a + s, c->out, c->err);
        if (st) return st;
        off = e;
    }
    return EG_OK;
}

/* Leftmost (then longest) special-token text in text[a, b); returns its id or -1. */
static int32_t find_special(const tok_tokenizer *t, const uint8_t *s, size_t a, size_t b, size_t *at,
                            size_t *len) {
    for (size_t i = a; i < b; i++) {
        if (!t->special_first[s[i]]) continue;
        for (int k = 0; k < t->n_special_lens; k++) {
            size_t L = t->special_lens[k];
            if (i + L > b) continue;
            uint32_t id = map_find(t, &t->special_map, s + i, L);
            if (id != RANK_NONE) {
                *at = i;
                *len = L;
                return (int32_t)id;
            }
        }
    }
    return -1;
}

/* tiktoken's encode(substr, allowed_special="all" | disallowed_special=()). */
static eg_status encode_substr(enc_ctx *c, size_t a, size_t b) {
    size_t pos = a;
    for (;;) {
        size_t at = b, len = 0;
        int32_t sid = (c->flags & TOK_ALLOW_SPECIAL) ? find_special(c->t, c->text, pos, b, &at, &len) : -1;
        if (sid < 0) at = b;
        eg_status st = encode_ordinary(c, pos, at);
        if (st) return st;
        if (sid < 0) return EG_OK;
        st = tok_seq_push(c->out, sid, at, c->err);
        if (st) return st;
        pos = at + len;
    }
}

/* Kimi's _split_whitespaces_or_nonwhitespaces over one <= 400k code point chunk. */
static eg_status encode_chunk(enc_ctx *c, size_t a, size_t b) {
    const uint8_t *s = c->text;
    size_t i = a, slice_start = a;
    int cur_space = 0;
    size_t run = 0;
    if (a < b) {
        size_t j = a;
        cur_space = py_isspace(utf8_next(s, &j));
    }
    while (i < b) {
        size_t here = i;
        int sp = py_isspace(utf8_next(s, &i));
        if (cur_space ^ sp) {
            run = 1;
            cur_space = sp;
        } else if (++run > MAX_RUN_CPS) {
            eg_status st = encode_substr(c, slice_start, here);
            if (st) return st;
            slice_start = here;
            run = 1;
        }
    }
    return encode_substr(c, slice_start, b);
}

eg_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, int flags, tok_seq *out,
                     eg_error *err) {
    size_t bad = tok_utf8_check(text, len);
    if (bad != len) return eg_fail(err, EG_ERR_FORMAT, "invalid UTF-8 at byte %zu", bad);
    size_t n0 = out->n;
    eg_status st = seq_reserve(out, out->n + len / 4 + 16, flags & TOK_OFFSETS, err);
    if (st) return st;
    enc_ctx c = {t, (const uint8_t *)text, flags, pcre2_match_data_create(1, NULL), NULL, NULL, out, err};
    if (!c.md) return eg_fail(err, EG_ERR_NOMEM, "out of memory (regex match data)");
    size_t i = 0;
    while (i < len && !st) { /* 400,000 code points per chunk */
        size_t a = i;
        for (size_t k = 0; k < MAX_CHUNK_CPS && i < len; k++) utf8_next(c.text, &i);
        st = encode_chunk(&c, a, i);
    }
    pcre2_match_data_free(c.md);
    if (c.mctx) pcre2_match_context_free(c.mctx);
    if (c.jstack) pcre2_jit_stack_free(c.jstack);
    if (st) out->n = n0;
    return st;
}

/* ---------------------------------------------------------------- decode */

const char *tok_token_bytes(const tok_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_base + TOK_N_SPECIAL) return NULL;
    *len = t->tokens[id].len;
    return (const char *)t->arena + t->tokens[id].off;
}

eg_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, char **out,
                     size_t *out_len, eg_error *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_base + TOK_N_SPECIAL)
            return eg_fail(err, EG_ERR_INVALID, "token id %" PRId32 " at position %zu is outside [0, %d)",
                           ids[i], i, t->n_base + TOK_N_SPECIAL);
        total += t->tokens[ids[i]].len;
    }
    char *buf = malloc(total + 1);
    if (!buf) return eg_fail(err, EG_ERR_NOMEM, "out of memory (decode %zu bytes)", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + k, t->arena + t->tokens[ids[i]].off, t->tokens[ids[i]].len);
        k += t->tokens[ids[i]].len;
    }
    buf[k] = 0;
    *out = buf;
    *out_len = k;
    return EG_OK;
}

int32_t tok_special_id(const tok_tokenizer *t, const char *name) {
    uint32_t id = map_find(t, &t->special_map, (const uint8_t *)name, strlen(name));
    return id == RANK_NONE ? -1 : (int32_t)id;
}

int32_t tok_token_id(const tok_tokenizer *t, const char *s, size_t n) {
    uint32_t id = map_find(t, &t->special_map, (const uint8_t *)s, n);
    if (id == RANK_NONE && n) id = rank_of(t, (const uint8_t *)s, n);
    return id == RANK_NONE ? -1 : (int32_t)id;
}

int32_t tok_n_vocab(const tok_tokenizer *t) { return t->n_base + TOK_N_SPECIAL; }
int32_t tok_n_base(const tok_tokenizer *t) { return t->n_base; }
int tok_is_special(const tok_tokenizer *t, int32_t id) {
    return id >= t->n_base && id < t->n_base + TOK_N_SPECIAL;
}
const char *tok_fingerprint(const tok_tokenizer *t) { return t->fingerprint; }

/* ---------------------------------------------------------------- load */

void tok_free(tok_tokenizer *t) {
    if (!t) return;
    free(t->tokens);
    free(t->arena);
    free(t->base_map.slots);
    free(t->special_map.slots);
    if (t->re) pcre2_code_free(t->re);
    free(t);
}

static eg_status read_file(const char *path, uint8_t **buf, size_t *len, eg_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap + 1);
    for (;;) {
        if (!b) { fclose(f); return eg_fail(err, EG_ERR_NOMEM, "%s: out of memory", path); }
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        uint8_t *nb = realloc(b, cap + 1);
        if (!nb) free(b);
        b = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(b); return eg_fail(err, EG_ERR_IO, "%s: read error", path); }
    b[n] = 0;
    *buf = b;
    *len = n;
    return EG_OK;
}

static int b64val(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict base64 (padding required when the length is not a multiple of 4). */
static int b64_decode(const uint8_t *s, size_t n, uint8_t *out, size_t *out_len) {
    if (n == 0 || n % 4) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int j = 0; j < 4; j++) {
            if (s[i + j] == '=' && i + 4 == n && j >= 2) { v[j] = 0; pad++; continue; }
            if (pad) return -1;
            v[j] = b64val(s[i + j]);
            if (v[j] < 0) return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[k++] = (uint8_t)(w >> 16);
        if (pad < 2) out[k++] = (uint8_t)(w >> 8);
        if (pad < 1) out[k++] = (uint8_t)w;
    }
    *out_len = k;
    return 0;
}

static eg_status load_model(tok_tokenizer *t, const char *path, const uint8_t *buf, size_t len,
                            eg_error *err) {
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    lines++;
    size_t cap = lines + TOK_N_SPECIAL;
    t->tokens = calloc(cap, sizeof *t->tokens);
    uint8_t *seen = calloc(lines, 1);
    /* decoded bytes are at most 3/4 of the text; specials are added later */
    t->arena = malloc(len + 1);
    if (!t->tokens || !seen || !t->arena) {
        free(seen);
        return eg_fail(err, EG_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t arena = 0, count = 0, lineno = 0, i = 0;
    while (i < len) {
        size_t e = i;
        while (e < len && buf[e] != '\n') e++;
        lineno++;
        size_t a = i, b = e;
        i = e + 1;
        if (b > a && buf[b - 1] == '\r') b--;
        while (a < b && (buf[a] == ' ' || buf[a] == '\t')) a++;
        if (a == b) continue; /* blank lines are skipped, as tiktoken does */
        size_t f1 = a;
        while (f1 < b && buf[f1] != ' ' && buf[f1] != '\t') f1++;
        size_t f2 = f1;
        while (f2 < b && (buf[f2] == ' ' || buf[f2] == '\t')) f2++;
        size_t f3 = f2;
        while (f3 < b && buf[f3] >= '0' && buf[f3] <= '9') f3++;
        size_t f4 = f3;
        while (f4 < b && (buf[f4] == ' ' || buf[f4] == '\t')) f4++;
        if (f2 == f1 || f3 == f2 || f4 != b || f3 - f2 > 9) {
            free(seen);
            return eg_fail(err, EG_ERR_FORMAT, "%s:%zu: expected 'base64 rank'", path, lineno);
        }
        uint64_t rank = 0;
        for (size_t k = f2; k < f3; k++) rank = rank * 10 + (uint64_t)(buf[k] - '0');
        size_t blen;
        if (b64_decode(buf + a, f1 - a, t->arena + arena, &blen)) {
            free(seen);
            return eg_fail(err, EG_ERR_FORMAT, "%s:%zu: invalid base64 token", path, lineno);
        }
        if (rank >= lines || seen[rank]) {
            free(seen);
            return eg_fail(err, EG_ERR_FORMAT, "%s:%zu: rank %" PRIu64 " is %s", path, lineno, rank,
                           rank >= lines ? "out of range (ranks must be 0..n-1)" : "duplicated");
        }
        if (blen > 0xFFFF) {
            free(seen);
            return eg_fail(err, EG_ERR_FORMAT, "%s:%zu: token of %zu bytes is too long", path, lineno, blen);
        }
        seen[rank] = 1;
        if (blen > t->max_len) t->max_len = blen;
        t->tokens[rank] = (tok_entry){(uint32_t)arena, (uint32_t)blen};
        arena += blen;
        count++;
    }
    for (size_t r = 0; r < count; r++)
        if (!seen[r]) {
            free(seen);
            return eg_fail(err, EG_ERR_FORMAT, "%s: rank %zu is missing (ranks must be 0..%zu)", path, r,
                           count ? count - 1 : 0);
        }
    free(seen);
    if (count == 0) return eg_fail(err, EG_ERR_FORMAT, "%s: no tokens", path);
    if (count > (size_t)INT32_MAX - TOK_N_SPECIAL)
        return eg_fail(err, EG_ERR_FORMAT, "%s: too many tokens (%zu)", path, count);
    t->n_base = (int32_t)count;
    t->arena_len = arena;
    eg_status st = map_init(&t->base_map, count, err);
    if (st) return st;
    for (size_t r = 0; r < count; r++) {
        uint32_t dup = map_insert(t, &t->base_map, (uint32_t)r);
        if (dup != RANK_NONE)
            return eg_fail(err, EG_ERR_FORMAT, "%s: ranks %u and %zu have the same bytes", path, dup, r);
    }
    for (int c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        t->byte_rank[c] = map_find(t, &t->base_map, &b, 1);
        if (t->byte_rank[c] == RANK_NONE)
            return eg_fail(err, EG_ERR_FORMAT, "%s: no token for the single byte 0x%02x", path, c);
    }
    return EG_OK;
}

static eg_status load_config(tok_tokenizer *t, const char *path, const uint8_t *buf, size_t len,
                             eg_error *err) {
    json_error_t je;
    /* model_max_length is ~1e30: without INT_AS_REAL jansson rejects the file */
    json_t *root = json_loadb((const char *)buf, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je);
    if (!root) return eg_fail(err, EG_ERR_FORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    json_t *added = json_object_get(root, "added_tokens_decoder");
    const char *names[TOK_N_SPECIAL] = {0};
    size_t name_lens[TOK_N_SPECIAL] = {0};
    eg_status st = EG_OK;
    if (!json_is_object(root) || !json_is_object(added)) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: no \"added_tokens_decoder\" object", path);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(added, key, val) {
        char *end;
        errno = 0;
        long long id = strtoll(key, &end, 10);
        json_t *content = json_object_get(val, "content");
        if (!*key || *end || errno || !json_is_string(content) || json_string_length(content) == 0 ||
            json_string_length(content) > 0xFFFF) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: added_tokens_decoder[\"%s\"]: need a decimal id and a non-empty \"content\" string",
                         path, key);
            goto done;
        }
        if (id < t->n_base || id >= (long long)t->n_base + TOK_N_SPECIAL) {
            st = eg_fail(err, EG_ERR_CONFIG, "%s: added token id %lld is outside the special range [%d, %d)",
                         path, id, t->n_base, t->n_base + TOK_N_SPECIAL);
            goto done;
        }
        names[id - t->n_base] = json_string_value(content);
        name_lens[id - t->n_base] = json_string_length(content);
    }
    size_t need = 0;
    char tmp[64];
    for (int k = 0; k < TOK_N_SPECIAL; k++)
        need += names[k] ? name_lens[k] : (size_t)snprintf(tmp, sizeof tmp, "<|reserved_token_%d|>", t->n_base + k);
    uint8_t *na = realloc(t->arena, t->arena_len + need + 1);
    if (!na) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    t->arena = na;
    if ((st = map_init(&t->special_map, TOK_N_SPECIAL, err))) goto done;
    int nl = 0;
    for (int k = 0; k < TOK_N_SPECIAL; k++) {
        size_t L;
        if (names[k]) {
            L = name_lens[k];
            memcpy(t->arena + t->arena_len, names[k], L);
        } else {
            L = (size_t)snprintf(tmp, sizeof tmp, "<|reserved_token_%d|>", t->n_base + k);
            memcpy(t->arena + t->arena_len, tmp, L);
        }
        int32_t id = t->n_base + k;
        t->tokens[id] = (tok_entry){(uint32_t)t->arena_len, (uint32_t)L};
        t->arena_len += L;
        uint32_t dup = map_insert(t, &t->special_map, (uint32_t)id);
        if (dup != RANK_NONE) {
            st = eg_fail(err, EG_ERR_CONFIG, "%s: special tokens %u and %d have the same text", path, dup, id);
            goto done;
        }
        t->special_first[t->arena[t->tokens[id].off]] = 1;
        int have = 0;
        for (int j = 0; j < nl; j++) have |= t->special_lens[j] == L;
        if (!have) t->special_lens[nl++] = L;
    }
    /* longest first, so the leftmost match is also the longest */
    for (int a = 0; a < nl; a++)
        for (int b = a + 1; b < nl; b++)
            if (t->special_lens[b] > t->special_lens[a]) {
                size_t x = t->special_lens[a];
                t->special_lens[a] = t->special_lens[b];
                t->special_lens[b] = x;
            }
    t->n_special_lens = nl;
done:
    json_decref(root);
    return st;
}

eg_status tok_load(const char *dir, tok_tokenizer **out, eg_error *err) {
    *out = NULL;
    char mpath[4096], cpath[4096];
    snprintf(mpath, sizeof mpath, "%s/tiktoken.model", dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    uint8_t *mb = NULL, *cb = NULL;
    size_t ml = 0, cl = 0;
    eg_status st = read_file(mpath, &mb, &ml, err);
    if (!st) st = read_file(cpath, &cb, &cl, err);
    if (!st) {
        eg_sha256 h;
        uint8_t dg[32];
        eg_sha256_init(&h);
        eg_sha256_update(&h, "tiktoken.model", 15);
        eg_sha256_update(&h, mb, ml);
        eg_sha256_update(&h, "tokenizer_config.json", 22);
        eg_sha256_update(&h, cb, cl);
        eg_sha256_final(&h, dg);
        eg_sha256_to_hex(dg, t->fingerprint);
    }
    if (!st) st = load_model(t, mpath, mb, ml, err);
    if (!st) st = load_config(t, cpath, cb, cl, err);
    free(mb);
    free(cb);
    if (!st) {
        int ec;
        PCRE2_SIZE eo;
        t->re = pcre2_compile((PCRE2_SPTR)KIMI_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                              &ec, &eo, NULL);
        if (!t->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            st = eg_fail(err, EG_ERR_CONFIG, "pre-tokenizer pattern at %zu: %s", (size_t)eo, (const char *)msg);
        } else {
            t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0; /* else interpreted */
        }
    }
    if (st) {
        tok_free(t);
        return st;
    }
    *out = t;
    return EG_OK;
}
