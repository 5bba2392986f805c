/* Tokenizer: golden ids vs ../shared/fixtures/tokenizer/encode.jsonl (tiktoken's Rust
 * core with Kimi's pattern and chunking), round trips, special tokens, concurrent
 * encodes, throughput, and loaders fed truncated / mutated files. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/eg_common.h"
#include "prompts/tokenizer.h"
#include "tests/check.h"
#include "tests/tok_fixture.h"



typedef struct fixture {
    char *name;
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
} fixture;

static fixture *g_fix;
static size_t g_nfix;

static void load_fixtures(void) {
    if (g_fix) return;
    FILE *f = fopen(TOKDIR "/encode.jsonl", "r");
    if (!f) { fprintf(stderr, "    no encode.jsonl\n"); exit(1); }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *r = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        if (!r) { fprintf(stderr, "    bad fixture line: %s\n", je.text); exit(1); }
        g_fix = realloc(g_fix, (g_nfix + 1) * sizeof *g_fix);
        fixture *x = &g_fix[g_nfix++];
        json_t *t = json_object_get(r, "text"), *ids = json_object_get(r, "ids");
        x->name = strdup(json_string_value(json_object_get(r, "name")));
        x->len = json_string_length(t);
        x->text = malloc(x->len + 1);
        memcpy(x->text, json_string_value(t), x->len + 1);
        x->n = json_array_size(ids);
        x->ids = malloc((x->n + 1) * sizeof *x->ids);
        for (size_t i = 0; i < x->n; i++) x->ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        json_decref(r);
    }
    free(line);
    fclose(f);
}

static int same_ids(const tok_seq *s, const fixture *x, size_t *first_diff) {
    size_t i = 0;
    while (i < s->n && i < x->n && s->ids[i] == x->ids[i]) i++;
    *first_diff = i;
    return s->n == x->n && i == x->n;
}

static void test_encode_fixtures(void) {
    load_fixtures();
    eg_error err = {0};
    size_t ok = 0;
    for (size_t k = 0; k < g_nfix; k++) {
        fixture *x = &g_fix[k];
        tok_seq s = {0};
        CHECK_OK(tok_encode(tok(), x->text, x->len, TOK_ALLOW_SPECIAL, &s, &err), &err);
        size_t d;
        if (same_ids(&s, x, &d)) ok++;
        else
            CHECKF(0, "%s: %zu ids, want %zu; first difference at %zu (got %d, want %d)", x->name, s.n, x->n, d,
                   d < s.n ? s.ids[d] : -1, d < x->n ? x->ids[d] : -1);
        tok_seq_free(&s);
    }
    CHECK(g_nfix >= 44);
    printf("    encode.jsonl: %zu/%zu records match exactly\n", ok, g_nfix);
}

/* offsets: token bytes laid at their offsets rebuild the text exactly */
static void test_offsets_and_decode(void) {
    load_fixtures();
    eg_error err = {0};
    for (size_t k = 0; k < g_nfix; k++) {
        fixture *x = &g_fix[k];
        tok_seq s = {0};
        CHECK_OK(tok_encode(tok(), x->text, x->len, TOK_ALLOW_SPECIAL | TOK_OFFSETS, &s, &err), &err);
        size_t at = 0;
        int good = 1;
        for (size_t i = 0; i < s.n && good; i++) {
            size_t L;
            const char *b = tok_token_bytes(tok(), s.ids[i], &L);
            good = b && s.offsets[i] == at && at + L <= x->len && !memcmp(x->text + at, b, L);
            at += L;
        }
        CHECKF(good && at == x->len, "%s: offsets do not tile the text", x->name);
        char *out;
        size_t n;
        CHECK_OK(tok_decode(tok(), s.ids, s.n, &out, &n, &err), &err);
        CHECKF(n == x->len && !memcmp(out, x->text, n), "%s: decode(encode(x)) != x", x->name);
        free(out);
        tok_seq_free(&s);
    }
}

static void test_specials(void) {
    eg_error err = {0};
    tok_tokenizer *t = tok();
    CHECK(tok_n_vocab(t) == 163840);
    CHECK(tok_n_base(t) == 163584);
    CHECK(tok_special_id(t, "[BOS]") == 163584);
    CHECK(tok_special_id(t, "[EOS]") == 163585);
    CHECK(tok_special_id(t, "<|im_end|>") == 163586);
    CHECK(tok_special_id(t, "<|im_user|>") == 163587);
    CHECK(tok_special_id(t, "<|im_assistant|>") == 163588);
    CHECK(tok_special_id(t, "<|im_system|>") == 163594);
    CHECK(tok_special_id(t, "<|im_middle|>") == 163601);
    CHECK(tok_special_id(t, "<think>") == 163606);
    CHECK(tok_special_id(t, "</think>") == 163607);
    CHECK(tok_special_id(t, "<|reserved_token_163700|>") == 163700);
    CHECK(tok_special_id(t, "<|reserved_token_5|>") == -1);
    CHECK(tok_special_id(t, "hello") == -1);
    CHECK(tok_is_special(t, 163839) && !tok_is_special(t, 163583) && !tok_is_special(t, 163840));
    size_t L;
    const char *b = tok_token_bytes(t, 163586, &L);
    CHECK(b && L == 10 && !memcmp(b, "<|im_end|>", 10));
    CHECK(tok_token_bytes(t, 163840, &L) == NULL && tok_token_bytes(t, -1, &L) == NULL);
    CHECK(tok_token_id(t, "<|im_end|>", 10) == 163586);
    /* without TOK_ALLOW_SPECIAL the text is ordinary bytes */
    const char *txt = "a<|im_end|>b";
    tok_seq s = {0};
    CHECK_OK(tok_encode(t, txt, strlen(txt), 0, &s, &err), &err);
    int has = 0;
    for (size_t i = 0; i < s.n; i++) has |= tok_is_special(t, s.ids[i]);
    CHECK(!has && s.n > 3);
    tok_seq_clear(&s);
    CHECK_OK(tok_encode(t, txt, strlen(txt), TOK_ALLOW_SPECIAL, &s, &err), &err);
    CHECK(s.n == 3 && s.ids[1] == 163586);
    /* encode appends */
    size_t before = s.n;
    CHECK_OK(tok_encode(t, "x", 1, 0, &s, &err), &err);
    CHECK(s.n == before + 1);
    /* empty text */
    tok_seq_clear(&s);
    CHECK_OK(tok_encode(t, "", 0, TOK_ALLOW_SPECIAL, &s, &err), &err);
    CHECK(s.n == 0);
    /* invalid UTF-8 and bad ids fail cleanly */
    const char *bad[] = {"\xff", "a\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "ok\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n0 = s.n;
        CHECK(tok_encode(t, bad[i], strlen(bad[i]), TOK_ALLOW_SPECIAL, &s, &err) == EG_ERR_FORMAT);
        CHECK(s.n == n0);
    }
    int32_t ids[] = {1, 163840};
    char *out;
    size_t n;
    CHECK(tok_decode(t, ids, 2, &out, &n, &err) == EG_ERR_INVALID);
    CHECK(strlen(tok_fingerprint(t)) == 64);
    tok_seq_free(&s);
}

/* ---- random valid UTF-8 text (no special-token strings) ---- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t put_cp(char *o, uint32_t c) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3F)); o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static uint32_t random_cp(uint64_t *s) {
    static const uint32_t pool[] = {' ', ' ', ' ', '\n', '\t', '\r', 0xA0, 0x3000, 0x2028, 0x85, 0x1C, '\'', '.',
                                    ',', '!', '<', '|', '>', '[', ']', '0', '7', 0x661, 0xE9, 0x301, 0x4E2D,
                                    0x6587, 0x3042, 0x30AB, 0xAC00, 0x0434, 0x05D0, 0x0627, 0x0915, 0x1F600,
                                    0x1F3FD, 0x200D, 0xFE0F, 0x20000, 0x1D518, 0x00DF, 0x0130, 0x017F, 0x3005,
                                    0x3007, 0xFEFF, 0x200B, 0};
    uint64_t r = rng_next(s);
    switch (r % 8) {
    case 0: case 1: case 2: return 'a' + (uint32_t)(r >> 8) % 26;
    case 3: return 'A' + (uint32_t)(r >> 8) % 26;
    case 4: return pool[(r >> 8) % (sizeof pool / sizeof pool[0])];
    case 5: return 0x20 + (uint32_t)(r >> 8) % 95;
    case 6: { /* any scalar value, no surrogates */
        uint32_t c = (uint32_t)(r >> 8) % 0x110000;
        return (c >= 0xD800 && c <= 0xDFFF) ? 'z' : c;
    }
    default: return 0x4E00 + (uint32_t)(r >> 8) % 0x5000;
    }
}

static void test_roundtrip_random(void) {
    uint64_t seed = eg_test_seed(), s = seed * 2654435761u + 1;
    eg_error err = {0};
    char *buf = malloc(4 * 4096);
    for (int iter = 0; iter < 300; iter++) {
        size_t ncp = rng_next(&s) % 4096, len = 0;
        for (size_t i = 0; i < ncp; i++) len += put_cp(buf + len, random_cp(&s));
        tok_seq q = {0};
        CHECK_OK(tok_encode(tok(), buf, len, 0, &q, &err), &err);
        char *out;
        size_t n;
        CHECK_OK(tok_decode(tok(), q.ids, q.n, &out, &n, &err), &err);
        CHECKF(n == len && !memcmp(out, buf, n), "iteration %d (seed %llu): round trip differs", iter,
               (unsigned long long)seed);
        free(out);
        tok_seq_free(&q);
    }
    free(buf);
}

/* Texts that cross the 25,000-run and 400,000-code-point cuts still round-trip, and a
 * special token cut by the run split is encoded as plain text (Kimi's behaviour). */
static void test_long_inputs(void) {
    eg_error err = {0};
    size_t n = 900000;
    char *buf = malloc(n * 3 + 64);
    size_t len = 0;
    for (size_t i = 0; i < n; i++) buf[len++] = (i / 30000) % 2 ? ' ' : (char)('a' + i % 3);
    for (size_t i = 0; i < 1000; i++) len += put_cp(buf + len, 0x4E2D);
    tok_seq q = {0};
    CHECK_OK(tok_encode(tok(), buf, len, TOK_ALLOW_SPECIAL, &q, &err), &err);
    char *out;
    size_t m;
    CHECK_OK(tok_decode(tok(), q.ids, q.n, &out, &m, &err), &err);
    CHECK(m == len && !memcmp(out, buf, m));
    free(out);
    /* 24,995 'x' then "<|im_end|>": the run of 25,005 non-space code points is cut
     * after 25,000, inside the special token, so no special id comes out. */
    len = 0;
    for (size_t i = 0; i < 24995; i++) buf[len++] = 'x';
    memcpy(buf + len, "<|im_end|>", 10);
    len += 10;
    tok_seq_clear(&q);
    CHECK_OK(tok_encode(tok(), buf, len, TOK_ALLOW_SPECIAL, &q, &err), &err);
    int has = 0;
    for (size_t i = 0; i < q.n; i++) has |= q.ids[i] == 163586;
    CHECK(!has);
    /* ... while one space before it restarts the run and the special is found */
    buf[24990] = ' ';
    tok_seq_clear(&q);
    CHECK_OK(tok_encode(tok(), buf, len, TOK_ALLOW_SPECIAL, &q, &err), &err);
    CHECK(q.n && q.ids[q.n - 1] == 163586);
    tok_seq_free(&q);
    free(buf);
}

/* ---- concurrency ---- */

typedef struct thr_arg {
    int ok;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    for (int rep = 0; rep < 3; rep++)
        for (size_t k = 0; k < g_nfix; k++) {
            tok_seq s = {0};
            eg_error err = {0};
            size_t d;
            if (tok_encode(g_tok, g_fix[k].text, g_fix[k].len, TOK_ALLOW_SPECIAL, &s, &err) || !same_ids(&s, &g_fix[k], &d))
                a->ok = 0;
            tok_seq_free(&s);
        }
    return NULL;
}

static void test_threads(void) {
    load_fixtures();
    tok();
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, thr_main, &args[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECKF(args[i].ok, "thread %d got different ids", i);
    }
}

/* ---- throughput ---- */

static void test_throughput(void) {
    load_fixtures();
#ifdef __SANITIZE_ADDRESS__
    size_t target = 1u << 19, len = 0; /* sanitizers are ~10x slower; the number is not the point there */
#else
    size_t target = 4u << 20, len = 0;
#endif
    char *buf = malloc(target + (1u << 20));
    static const char *extra[] = {
        "The quick brown fox jumps over the lazy dog. ",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
        "日本語のテキストも含めます。東京、大阪、京都。",
        "Привет, как дела? Всё хорошо. ", "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n",
    };
    while (len < target) {
        for (size_t k = 0; k < g_nfix && len < target; k++) {
            /* ordinary text: not the 25,000-character single-run stress cases */
            if (g_fix[k].len > 20000 || memchr(g_fix[k].text, '<', g_fix[k].len)) continue;
            memcpy(buf + len, g_fix[k].text, g_fix[k].len);
            len += g_fix[k].len;
            const char *e = extra[k % 6];
            memcpy(buf + len, e, strlen(e));
            len += strlen(e);
        }
    }
    eg_error err = {0};
    tok_seq s = {0};
    /* CPU time as well as wall time: the build machine is shared and often loaded */
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    double t0 = eg_now();
    CHECK_OK(tok_encode(tok(), buf, len, TOK_ALLOW_SPECIAL, &s, &err), &err);
    double dt = eg_now() - t0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    double ct = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    printf("    throughput: %.2f MB, %zu tokens (%.2f bytes/token): %.1f MB/s per CPU second (%.2f M tokens/s), "
           "%.1f MB/s wall, 1 thread\n",
           len / 1e6, s.n, (double)len / (double)s.n, len / 1e6 / ct, s.n / 1e6 / ct, len / 1e6 / dt);
    tok_seq_free(&s);
    free(buf);
}

/* ---- loaders fed bad files ---- */

static char g_tmp[64];

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static int64_t try_load(const char *dir) {
    tok_tokenizer *t = NULL;
    eg_error err = {0};
    eg_status st = tok_load(dir, &t, &err);
    if (st) {
        CHECKF(err.msg[0] != 0, "failure without a message");
        return -1;
    }
    tok_seq s = {0};
    const char *txt = "Hello <|im_end|> wörld 123 中文 [BOS]";
    st = tok_encode(t, txt, strlen(txt), TOK_ALLOW_SPECIAL, &s, &err);
    int64_t n = st ? -2 : (int64_t)s.n;
    tok_seq_free(&s);
    tok_free(t);
    return n;
}

/* a small vocabulary: all 256 bytes plus a few merges */
static char *tiny_model(size_t *n) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc(64 * 1024);
    size_t k = 0;
    int rank = 0;
    for (int c = 0; c < 256; c++) {
        k += (size_t)sprintf(out + k, "%c%c==", b64[c >> 2], b64[(c & 3) << 4]);
        k += (size_t)sprintf(out + k, " %d\n", rank++);
    }
    const char *merges[] = {"SGU=", "bGw=", "SGVs", "bGxv", "IHc=", "MTI="}; /* He ll Hel llo " w" 12 */
    for (size_t i = 0; i < 6; i++) k += (size_t)sprintf(out + k, "%s %d\n", merges[i], rank++);
    *n = k;
    return out;
}

static const char TINY_CONFIG[] =
    "{\"added_tokens_decoder\": {\"262\": {\"content\": \"[BOS]\"}, \"264\": {\"content\": \"<|im_end|>\"}},"
    " \"model_max_length\": 1000000000000000019884624838656}";

static void test_load_errors(void) {
    uint64_t s = eg_test_seed() * 7 + 3;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/eg_tok_XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    size_t mn;
    char *model = tiny_model(&mn);
    write_file(g_tmp, "tiktoken.model", model, mn);
    write_file(g_tmp, "tokenizer_config.json", TINY_CONFIG, strlen(TINY_CONFIG));
    CHECK(try_load(g_tmp) > 0); /* the tiny tokenizer itself works */
    {
        tok_tokenizer *t;
        eg_error err = {0};
        CHECK_OK(tok_load(g_tmp, &t, &err), &err);
        CHECK(tok_n_vocab(t) == 262 + 256 && tok_special_id(t, "[BOS]") == 262);
        CHECK(tok_special_id(t, "<|reserved_token_263|>") == 263);
        tok_free(t);
    }
    /* missing files */
    CHECK(try_load("/nonexistent/dir") == -1);
    /* specific broken inputs */
    const char *bad_models[] = {"QQ== 0\nQQ== 1\n", "QQ== 1\n", "QQ==\n", "Q 0\n", "QQ== x\n", "QQ== 0 0\n",
                                "QQ== 99999999999\n", ""};
    for (size_t i = 0; i < sizeof bad_models / sizeof bad_models[0]; i++) {
        write_file(g_tmp, "tiktoken.model", bad_models[i], strlen(bad_models[i]));
        CHECKF(try_load(g_tmp) == -1, "bad model %zu loaded", i);
    }
    write_file(g_tmp, "tiktoken.model", model, mn);
    const char *bad_configs[] = {"", "{", "[]", "{}", "{\"added_tokens_decoder\": []}",
                                 "{\"added_tokens_decoder\": {\"x\": {\"content\": \"a\"}}}",
                                 "{\"added_tokens_decoder\": {\"5\": {\"content\": \"a\"}}}",
                                 "{\"added_tokens_decoder\": {\"262\": {\"content\": 3}}}",
                                 "{\"added_tokens_decoder\": {\"262\": {\"content\": \"\"}}}",
                                 "{\"added_tokens_decoder\": {\"262\": {\"content\": \"a\"}, \"263\": {\"content\": \"a\"}}}",
                                 "{\"added_tokens_decoder\": {\"9999\": {\"content\": \"a\"}}}"};
    for (size_t i = 0; i < sizeof bad_configs / sizeof bad_configs[0]; i++) {
        write_file(g_tmp, "tokenizer_config.json", bad_configs[i], strlen(bad_configs[i]));
        CHECKF(try_load(g_tmp) == -1, "bad config %zu loaded", i);
    }
    /* random truncations and byte mutations of both files: never crash */
    int loaded = 0, failed = 0;
    for (int iter = 0; iter < 300; iter++) {
        char *m = malloc(mn + 1), *c = malloc(sizeof TINY_CONFIG);
        memcpy(m, model, mn);
        memcpy(c, TINY_CONFIG, sizeof TINY_CONFIG);
        size_t ml = mn, cl = strlen(TINY_CONFIG);
        int which = iter % 2;
        char *p = which ? c : m;
        size_t *pl = which ? &cl : &ml;
        switch (rng_next(&s) % 3) {
        case 0: *pl = rng_next(&s) % (*pl + 1); break;
        case 1:
            for (int k = 0; k < 1 + (int)(rng_next(&s) % 4); k++) p[rng_next(&s) % *pl] = (char)rng_next(&s);
            break;
        default: p[rng_next(&s) % *pl] = "0 \n=\"{}:,9A"[rng_next(&s) % 11]; break;
        }
        write_file(g_tmp, "tiktoken.model", m, ml);
        write_file(g_tmp, "tokenizer_config.json", c, cl);
        if (try_load(g_tmp) >= 0) loaded++;
        else failed++;
        free(m);
        free(c);
    }
    printf("    mutated tokenizer files: %d loaded, %d rejected cleanly\n", loaded, failed);
    /* truncations of the real model file (with the real config): fail cleanly */
    size_t rn, cn;
    char *real = eg_test_read_file(TOKDIR "/tiktoken.model", &rn);
    char *cfg = eg_test_read_file(TOKDIR "/tokenizer_config.json", &cn);
    CHECK(real && cfg);
    write_file(g_tmp, "tokenizer_config.json", cfg, cn);
    size_t cuts[] = {rn / 3, rn / 2 + 7, rn - 1, rn - 5};
    for (size_t i = 0; i < 4; i++) {
        write_file(g_tmp, "tiktoken.model", real, cuts[i]);
        int64_t r = try_load(g_tmp);
        CHECKF(r == -1 || i == 2, "truncated model (%zu of %zu bytes) loaded", cuts[i], rn);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/tiktoken.model", g_tmp);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", g_tmp);
    unlink(path);
    rmdir(g_tmp);
    free(real);
    free(cfg);
    free(model);
}

static const eg_test tests[] = {
    {"encode_fixtures", test_encode_fixtures},
    {"offsets_and_decode", test_offsets_and_decode},
    {"specials", test_specials},
    {"roundtrip_random", test_roundtrip_random},
    {"long_inputs", test_long_inputs},
    {"threads", test_threads},
    {"throughput", test_throughput},
    {"load_errors", test_load_errors},
};

int main(int argc, char **argv) {
    int rc = eg_test_main("prompts_tok", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tok_free(g_tok);
    for (size_t i = 0; i < g_nfix; i++) {
        free(g_fix[i].name);
        free(g_fix[i].text);
        free(g_fix[i].ids);
    }
    free(g_fix);
    return rc;
}
