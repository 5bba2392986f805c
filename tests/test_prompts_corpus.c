/* Corpus reader: every record style of prompts/samples/sample.jsonl, compressed copies
 * (gzip/zstd/xz CLIs at test time), directories, stdin, sharding and resume, the
 * bad-record reasons of prompts/samples/bad.jsonl, odd line endings, and fuzzed /
 * truncated input (must never crash; run under `make asan`). */
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/eg_common.h"
#include "common/eg_hash.h"
#include "prompts/corpus.h"
#include "prompts/tokenizer.h"
#include "tests/check.h"
#include "tests/tok_fixture.h"

#define SAMPLE "prompts/samples/sample.jsonl"
#define BAD "prompts/samples/bad.jsonl"
#define N_SAMPLE 37

static char g_tmp[64];

static const char *tmpdir(void) {
    if (!g_tmp[0]) {
        snprintf(g_tmp, sizeof g_tmp, "/tmp/eg_corpus_XXXXXX");
        if (!mkdtemp(g_tmp)) { perror("mkdtemp"); exit(1); }
    }
    return g_tmp;
}

typedef struct summary {
    size_t n, n_ok;
    uint64_t first_index, last_index;
    char digest[65]; /* over (index, id, ids) of every record */
    int formats[8];
    char ids[64][64];
    char reasons[64][512];
} summary;

static eg_status read_all(const char *const *paths, size_t n_paths, const corpus_opts *o, summary *s, eg_error *err) {
    memset(s, 0, sizeof *s);
    corpus_reader *r;
    eg_status st = corpus_open(paths, n_paths, tok(), o, &r, err);
    if (st) return st;
    corpus_record rec = {0};
    bool got;
    eg_sha256 h;
    eg_sha256_init(&h);
    while (!(st = corpus_next(r, &rec, &got, err)) && got) {
        if (s->n == 0) s->first_index = rec.index;
        s->last_index = rec.index;
        if (s->n < 64) {
            snprintf(s->ids[s->n], sizeof s->ids[0], "%s", rec.id);
            snprintf(s->reasons[s->n], sizeof s->reasons[0], "%s", rec.ok ? "" : rec.reason);
        }
        s->n++;
        s->n_ok += rec.ok;
        s->formats[rec.format]++;
        eg_sha256_update(&h, &rec.index, sizeof rec.index);
        eg_sha256_update(&h, rec.id, strlen(rec.id) + 1);
        if (rec.ok) eg_sha256_update(&h, rec.ids.ids, rec.ids.n * sizeof *rec.ids.ids);
        if (rec.ok && rec.loss_mask && o->mode != CORPUS_REGENERATE) eg_sha256_update(&h, rec.loss_mask, rec.ids.n);
    }
    uint8_t d[32];
    eg_sha256_final(&h, d);
    eg_sha256_to_hex(d, s->digest);
    corpus_record_free(&rec);
    corpus_close(r);
    return st;
}

static void test_sample_styles(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    summary s;
    eg_error err = {0};
    const char *p[] = {SAMPLE};
    CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
    CHECKF(s.n == N_SAMPLE && s.n_ok == N_SAMPLE, "%zu records, %zu ok", s.n, s.n_ok);
    for (size_t i = 0; i < s.n && i < 64; i++) CHECKF(!s.reasons[i][0], "record %zu: %s", i, s.reasons[i]);
    CHECK(s.first_index == 0 && s.last_index == N_SAMPLE - 1);
    for (int f = CORPUS_FMT_MESSAGES; f <= CORPUS_FMT_INPUT_IDS; f++)
        CHECKF(s.formats[f] > 0, "no %s record in the sample", corpus_format_name((corpus_format)f));
    CHECK(!strcmp(s.ids[0], "code-001"));
    int have_default = 0, have_int = 0;
    for (size_t i = 0; i < s.n; i++) {
        have_default |= !strcmp(s.ids[i], SAMPLE ":32");
        have_int |= !strcmp(s.ids[i], "42");
    }
    CHECK(have_default && have_int);
    /* capture mode: records without an assistant answer are rejected, others masked */
    o.mode = CORPUS_CAPTURE;
    summary c;
    CHECK_OK(read_all(p, 1, &o, &c, &err), &err);
    CHECK(c.n == N_SAMPLE && c.n_ok > 15 && c.n_ok < N_SAMPLE);
    for (size_t i = 0; i < c.n; i++)
        if (c.reasons[i][0]) CHECKF(strstr(c.reasons[i], "no assistant"), "capture reject: %s", c.reasons[i]);
}

static int run(const char *cmd) { return system(cmd); }

static int have_cli(const char *name) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return run(cmd) == 0;
}

static void test_compressed_and_dirs(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    eg_error err = {0};
    summary plain, s;
    const char *p[] = {SAMPLE};
    CHECK_OK(read_all(p, 1, &o, &plain, &err), &err);
    const char *d = tmpdir();
    char cmd[1024], path[512];
    static const struct { const char *cli, *ext, *args; } comp[] = {
        {"gzip", "gz", "-c"}, {"zstd", "zst", "-q -c"}, {"xz", "xz", "-c"}, {"bzip2", "bz2", "-c"}};
    int tested = 0;
    for (size_t i = 0; i < 4; i++) {
        if (!have_cli(comp[i].cli)) { printf("    (no %s CLI: .%s not tested)\n", comp[i].cli, comp[i].ext); continue; }
        snprintf(path, sizeof path, "%s/sample.jsonl.%s", d, comp[i].ext);
        snprintf(cmd, sizeof cmd, "%s %s %s > %s", comp[i].cli, comp[i].args, SAMPLE, path);
        CHECK(run(cmd) == 0);
        const char *pp[] = {path};
        CHECK_OK(read_all(pp, 1, &o, &s, &err), &err);
        CHECKF(s.n == plain.n && s.n_ok == plain.n_ok, ".%s: %zu records", comp[i].ext, s.n);
        /* same ids and tokens; only the default ids (file:line) differ */
        for (size_t k = 0; k < s.n && k < 64; k++)
            if (strchr(plain.ids[k], ':') == NULL) CHECK(!strcmp(plain.ids[k], s.ids[k]));
        tested++;
        /* truncated compressed file: an error naming the file, never a crash */
        char tpath[600];
        CHECK(strlen(path) < 400);
        snprintf(tpath, sizeof tpath, "%s/trunc.jsonl.%s", d, comp[i].ext);
        snprintf(cmd, sizeof cmd, "head -c 700 %.400s > %.400s", path, tpath);
        CHECK(run(cmd) == 0);
        const char *tp[] = {tpath};
        eg_error e2 = {0};
        eg_status st = read_all(tp, 1, &o, &s, &e2);
        CHECKF(st != EG_OK && strstr(e2.msg, "trunc.jsonl"), ".%s truncated: status %d, %s", comp[i].ext, st, e2.msg);
        unlink(tpath);
    }
    printf("    compressed copies read identically: %d formats\n", tested);
    /* a directory: sorted, recursive, only corpus suffixes, hidden files skipped */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/dir/sub && head -n 10 %s > %s/dir/b.jsonl && tail -n +11 %s | head -n 10 | gzip -c > %s/dir/a.jsonl.gz"
             " && tail -n +21 %s | zstd -q -c > %s/dir/sub/c.jsonl.zst && echo junk > %s/dir/README.md"
             " && cp %s %s/dir/.hidden.jsonl && : > %s/dir/empty.jsonl",
             d, SAMPLE, d, SAMPLE, d, SAMPLE, d, d, SAMPLE, d, d);
    CHECK(run(cmd) == 0);
    snprintf(path, sizeof path, "%s/dir", d);
    const char *dp[] = {path};
    corpus_reader *r;
    CHECK_OK(corpus_open(dp, 1, tok(), &o, &r, &err), &err);
    if (r) {
        CHECKF(corpus_n_files(r) == 4, "%zu files", corpus_n_files(r));
        const char *want[] = {"/dir/a.jsonl.gz", "/dir/b.jsonl", "/dir/empty.jsonl", "/dir/sub/c.jsonl.zst"};
        for (size_t i = 0; i < 4 && i < corpus_n_files(r); i++)
            CHECKF(strstr(corpus_file(r, i), want[i]), "file %zu is %s", i, corpus_file(r, i));
        corpus_close(r);
    }
    CHECK_OK(read_all(dp, 1, &o, &s, &err), &err);
    CHECK(s.n == N_SAMPLE && s.n_ok == N_SAMPLE && s.last_index == N_SAMPLE - 1);
    CHECKF(!strcmp(s.ids[0], "math-005"), "first id %s", s.ids[0]); /* a.jsonl.gz holds lines 11..20 */
    /* several inputs in the given order; the record index runs on across files */
    const char *two[] = {SAMPLE, SAMPLE};
    CHECK_OK(read_all(two, 2, &o, &s, &err), &err);
    CHECK(s.n == 2 * N_SAMPLE && s.last_index == 2 * N_SAMPLE - 1);
    /* missing input / empty dir */
    const char *missing[] = {"/nonexistent.jsonl"};
    CHECK(corpus_open(missing, 1, tok(), &o, &r, &err) == EG_ERR_IO && strstr(err.msg, "nonexistent"));
    snprintf(cmd, sizeof cmd, "mkdir -p %s/emptydir", d);
    CHECK(run(cmd) == 0);
    snprintf(path, sizeof path, "%s/emptydir", d);
    const char *ed[] = {path};
    CHECK(corpus_open(ed, 1, tok(), &o, &r, &err) == EG_ERR_IO);
}

static void test_stdin(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    eg_error err = {0};
    summary s;
    int saved = dup(0);
    char cmd[512], path[256];
    snprintf(path, sizeof path, "%s/stdin.jsonl.zst", tmpdir());
    snprintf(cmd, sizeof cmd, "zstd -q -c %s > %s", SAMPLE, path);
    if (!have_cli("zstd") || run(cmd)) snprintf(path, sizeof path, "%s", SAMPLE);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    dup2(fd, 0);
    close(fd);
    const char *p[] = {"-"};
    CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
    dup2(saved, 0);
    close(saved);
    CHECK(s.n == N_SAMPLE && s.n_ok == N_SAMPLE);
    CHECKF(!strcmp(s.ids[31], "stdin:32"), "default id on stdin: %s", s.ids[31]);
    const char *twice[] = {"-", "-"};
    corpus_reader *r;
    CHECK(corpus_open(twice, 2, tok(), &o, &r, &err) == EG_ERR_INVALID);
}

static void put(int fd, const char *s) { CHECK(write(fd, s, strlen(s)) == (ssize_t)strlen(s)); }

/* A FIFO read as it arrives: corpus_next_nowait hands on each whole line at once and says
 * "later" (consuming nothing) while the pipe holds none; corpus_next then waits; the end
 * comes when the writer closes. A pipe whose first byte no JSON line starts with goes
 * through libarchive (the bytes read to tell are not lost), and a zstd one is decoded. */
static void test_pipes(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    eg_error err = {0};
    char path[256];
    snprintf(path, sizeof path, "%s/p.fifo", tmpdir());
    unlink(path);
    CHECK(mkfifo(path, 0600) == 0);
    int w = open(path, O_RDWR); /* a writer held open, so the reader's open does not wait */
    CHECK(w >= 0);
    const char *p[] = {path};
    corpus_reader *r = NULL;
    CHECK_OK(corpus_open(p, 1, tok(), &o, &r, &err), &err);
    if (!r || w < 0) return;
    corpus_record rec = {0};
    bool got = true, later = false;
    put(w, "{\"id\": \"one\", \"prompt\": \"hello\"}\n{\"id\": \"two\", \"pro");
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err);
    CHECKF(got && !later && rec.ok && !strcmp(rec.id, "one") && rec.line == 1, "got %d later %d id %s", got, later,
           got ? rec.id : "");
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err);
    CHECKF(!got && later, "half a line: got %d later %d", got, later);
    put(w, "mpt\": \"there\"}\n\n   \n");
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err);
    CHECKF(got && !later && rec.ok && !strcmp(rec.id, "two") && rec.line == 2, "second: got %d id %s", got,
           got ? rec.id : "");
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err); /* blank lines only so far */
    CHECKF(!got && later, "blank lines: got %d later %d", got, later);
    put(w, "{\"prompt\": \"three\"}");
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err);
    CHECKF(!got && later, "a last line without its newline waits for the end: got %d later %d", got, later);
    int64_t done = 0, total = 0;
    corpus_input_bytes(r, &done, &total);
    CHECKF(total == -1 && done > 60, "input bytes %lld of %lld", (long long)done, (long long)total);
    close(w);
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err);
    CHECKF(got && !later && rec.ok && rec.line == 5 && strstr(rec.id, "p.fifo:5"), "third: got %d id %s", got,
           got ? rec.id : "");
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err);
    CHECK(!got && !later);
    corpus_close(r);

    /* not plain at its first byte: libarchive reads it raw, from the first byte on */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "printf '%%s\\n' junk '{\"id\": \"after\", \"prompt\": \"x\"}' > %s &", path);
    CHECK(run(cmd) == 0);
    CHECK_OK(corpus_open(p, 1, tok(), &o, &r, &err), &err);
    CHECK_OK(corpus_next(r, &rec, &got, &err), &err);
    CHECKF(got && !rec.ok && rec.line == 1, "junk line: got %d ok %d", got, rec.ok);
    CHECK_OK(corpus_next_nowait(r, &rec, &got, &later, &err), &err); /* libarchive: taken as ready */
    CHECKF(got && !later && rec.ok && !strcmp(rec.id, "after"), "after junk: got %d id %s", got, got ? rec.id : "");
    CHECK_OK(corpus_next(r, &rec, &got, &err), &err);
    CHECK(!got);
    corpus_close(r);

    /* zstd through the FIFO equals the file */
    if (have_cli("zstd")) {
        summary plain, s;
        const char *sp[] = {SAMPLE};
        CHECK_OK(read_all(sp, 1, &o, &plain, &err), &err);
        snprintf(cmd, sizeof cmd, "zstd -q -c %s > %s &", SAMPLE, path);
        CHECK(run(cmd) == 0);
        CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
        CHECKF(s.n == plain.n && s.n_ok == plain.n_ok, "zstd FIFO: %zu records", s.n);
        for (size_t k = 0; k < s.n && k < 64; k++)
            if (!strchr(plain.ids[k], ':')) CHECK(!strcmp(plain.ids[k], s.ids[k]));
    }
    corpus_record_free(&rec);
    unlink(path);
}

static void test_shard_resume(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    eg_error err = {0};
    const char *p[] = {SAMPLE};
    summary all, s;
    CHECK_OK(read_all(p, 1, &o, &all, &err), &err);
    size_t total = 0;
    for (uint64_t w = 0; w < 3; w++) {
        o.worker = w;
        o.n_workers = 3;
        corpus_reader *r;
        CHECK_OK(corpus_open(p, 1, tok(), &o, &r, &err), &err);
        corpus_record rec = {0};
        bool got;
        while (!corpus_next(r, &rec, &got, &err) && got) {
            CHECK(rec.index % 3 == w);
            CHECK(!strcmp(rec.id, all.ids[rec.index]));
            total++;
        }
        corpus_record_free(&rec);
        corpus_close(r);
    }
    CHECK(total == N_SAMPLE);
    o.worker = 4;
    corpus_reader *r;
    CHECK(corpus_open(p, 1, tok(), &o, &r, &err) == EG_ERR_INVALID);
    o.worker = 0;
    o.n_workers = 0;
    o.start_index = 30;
    CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
    CHECK(s.n == N_SAMPLE - 30 && s.first_index == 30 && !strcmp(s.ids[0], all.ids[30]));
}

/* on_other_id reports, for every other worker's record, exactly the id a full parse
 * gives it when the record names its own (id_given), and nothing otherwise: string and
 * integer ids, escapes, an empty id, one with NUL, other types, a nested "id", bad JSON,
 * duplicate keys, invalid UTF-8, not an object, a byte-order mark, CRLF, no id. */
typedef struct { char *id[32]; uint64_t line[32]; int n; } other_log;
static eg_status log_other(void *ctx, const char *id, const char *file, uint64_t line, eg_error *err) {
    (void)file;
    (void)err;
    other_log *l = ctx;
    if (l->n < 32) { l->id[l->n] = strdup(id); l->line[l->n++] = line; }
    return EG_OK;
}
static void test_other_ids(void) {
    static const char *const lines[] = {
        "\xEF\xBB\xBF{\"id\": \"bom\", \"prompt\": \"a\"}", "{\"id\": 42, \"prompt\": \"b\"}",
        "{\"id\": \"caf\\u00e9\", \"prompt\": \"c\"}\r", "{\"id\": \"\", \"prompt\": \"d\"}",
        "{\"id\": \"a\\u0000b\", \"prompt\": \"e\"}", "{\"id\": 1.5, \"prompt\": \"f\"}",
        "{\"id\": [\"x\"], \"prompt\": \"g\"}", "{\"x\": {\"id\": \"nested\"}, \"prompt\": \"h\"}",
        "{\"id\": \"broken\", \"prompt\": ", "{\"id\": \"k1\", \"id\": \"k2\", \"prompt\": \"i\"}",
        "{\"id\": \"bad\xff\", \"prompt\": \"j\"}", "[\"id\", 1]", "{\"prompt\": \"no id\"}",
        "{\"id\": \"bad but named\"}", "{\"id\": -7, \"prompt\": \"k\"}", "{\"id\": \"last\", \"prompt\": \"l\"}"};
    const size_t n = sizeof lines / sizeof lines[0];
    char path[] = "/tmp/eg_other_ids_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    for (size_t i = 0; i < n; i++) fprintf(f, "%s\n", lines[i]);
    fclose(f);
    corpus_opts o;
    corpus_opts_default(&o);
    eg_error err = {0};
    const char *p[] = {path};
    corpus_reader *r;
    corpus_record rec = {0};
    bool got;
    char *want[32] = {0};
    int given = 0;
    CHECK_OK(corpus_open(p, 1, tok(), &o, &r, &err), &err);
    for (size_t i = 0; i < n && !corpus_next(r, &rec, &got, &err) && got; i++) {
        if (rec.id_given) { want[rec.index] = strdup(rec.id); given++; }
    }
    corpus_close(r);
    /* bom, 42, café, "bad but named" (a bad record that names its id), -7, last */
    CHECKF(given == 6 && want[0] && !strcmp(want[0], "bom") && want[1] && !strcmp(want[1], "42") && want[13] &&
               !strcmp(want[13], "bad but named"),
           "%d records name their own id", given);
    for (uint64_t w = 0; w < 2; w++) {
        other_log l = {0};
        o.worker = w;
        o.n_workers = 2;
        o.on_other_id = log_other;
        o.on_other_ctx = &l;
        CHECK_OK(corpus_open(p, 1, tok(), &o, &r, &err), &err);
        while (!corpus_next(r, &rec, &got, &err) && got) CHECK(rec.index % 2 == w);
        corpus_close(r);
        int k = 0;
        for (size_t i = 0; i < n; i++) {
            if (i % 2 == w || !want[i]) continue;
            CHECKF(k < l.n && l.line[k] == i + 1 && !strcmp(l.id[k], want[i]), "worker %d: line %zu: %s, want %s",
                   (int)w, i + 1, k < l.n ? l.id[k] : "(none)", want[i]);
            k++;
        }
        CHECKF(k == l.n, "worker %d: %d ids reported, %d expected", (int)w, l.n, k);
        for (int i = 0; i < l.n; i++) free(l.id[i]);
    }
    for (size_t i = 0; i < 32; i++) free(want[i]);
    corpus_record_free(&rec);
    unlink(path);
}

/* Tool declarations are refused with the reason, never silently dropped; an empty list
 * (which the template renders as nothing) is fine; tool calls and tool results render. */
static void test_tools_refused(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    o.mode = CORPUS_RENDER;
    eg_error err = {0};
    corpus_record rec = {0};
    rec.file = "t.jsonl";
    rec.line = 1;
    const char *decl = "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": [{\"type\": "
                       "\"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {}}}]}";
    CHECK_OK(corpus_parse(tok(), &o, decl, strlen(decl), &rec, &err), &err);
    CHECKF(!rec.ok && strstr(rec.reason, "\"tools\" declarations are not supported") &&
               strstr(rec.reason, "tool_declare"), "%s", rec.reason);
    const char *empty = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"tools\": []}";
    CHECK_OK(corpus_parse(tok(), &o, empty, strlen(empty), &rec, &err), &err);
    CHECKF(rec.ok && rec.render.len && !strstr(rec.render.text, "tool_declare"), "%s", rec.reason);
    const char *fc = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
                     "\"content\": null, \"function_call\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}";
    CHECK_OK(corpus_parse(tok(), &o, fc, strlen(fc), &rec, &err), &err);
    CHECKF(!rec.ok && strstr(rec.reason, "function_call"), "%s", rec.reason);
    const char *user_tc = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\", \"tool_calls\": [{\"id\": \"a\", "
                          "\"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}]}";
    CHECK_OK(corpus_parse(tok(), &o, user_tc, strlen(user_tc), &rec, &err), &err);
    CHECKF(!rec.ok && strstr(rec.reason, "only on assistant messages"), "%s", rec.reason);
    const char *flow = "{\"messages\": [{\"role\": \"user\", \"content\": \"W?\"}, {\"role\": \"assistant\", "
                       "\"content\": \"\", \"tool_calls\": [{\"id\": \"functions.w:0\", \"type\": \"function\", "
                       "\"function\": {\"name\": \"w\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", "
                       "\"tool_call_id\": \"functions.w:0\", \"content\": \"18C\"}]}";
    CHECK_OK(corpus_parse(tok(), &o, flow, strlen(flow), &rec, &err), &err);
    CHECKF(rec.ok && strstr(rec.render.text, "<|tool_call_begin|>functions.w:0<|tool_call_argument_begin|>{}") &&
               strstr(rec.render.text, "<|im_system|>tool<|im_middle|>## Return of functions.w:0\n18C<|im_end|>"),
           "%s", rec.render.text ? rec.render.text : rec.reason);
    rec.file = NULL;
    corpus_record_free(&rec);
}

static void test_bad_records(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    o.max_prompt_tokens = 100;
    eg_error err = {0};
    summary s;
    const char *p[] = {BAD};
    CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
    static const char *want[] = {
        "invalid JSON",          "empty conversation",  "unknown role \"wizard\"",
        "has no \"content\"",    "must be a string or a list", "image_url, not allowed in a text-only run",
        "no user message",       "has none of",         "not a JSON object",
        "\"prompt\" is not a string", "input_ids[1]",   "both \"prompt\" and \"text\"",
        "\"id\" must be",        "tool_call_id",        "invalid UTF-8",
        "over the limit of 100",
    };
    size_t nw = sizeof want / sizeof want[0];
    CHECKF(s.n == nw && s.n_ok == 0, "%zu records, %zu ok", s.n, s.n_ok);
    for (size_t i = 0; i < s.n && i < nw; i++)
        CHECKF(strstr(s.reasons[i], want[i]), "line %zu: reason \"%s\", want \"%s\"", i + 1, s.reasons[i], want[i]);
    /* every rejected record still has its file:line id */
    CHECK(!strcmp(s.ids[0], BAD ":1"));
    /* rejects-file lines are valid JSON carrying file, line, index, id, reason and the raw line */
    {
        char path[256];
        snprintf(path, sizeof path, "%s/rejects.jsonl", tmpdir());
        FILE *rf = fopen(path, "w");
        corpus_reader *r;
        CHECK_OK(corpus_open(p, 1, tok(), &o, &r, &err), &err);
        corpus_record rr = {0};
        bool got;
        size_t n = 0;
        while (!corpus_next(r, &rr, &got, &err) && got) {
            CHECK_OK(corpus_write_reject(rf, &rr, &err), &err);
            n++;
        }
        corpus_record_free(&rr);
        corpus_close(r);
        fclose(rf);
        rf = fopen(path, "r");
        char *ln = NULL;
        size_t cap = 0, k = 0;
        while (getline(&ln, &cap, rf) > 0) {
            json_error_t je;
            json_t *j = json_loads(ln, JSON_ALLOW_NUL, &je);
            CHECKF(j != NULL, "reject line %zu is not JSON: %s", k + 1, je.text);
            if (j) {
                CHECK(json_integer_value(json_object_get(j, "line")) == (json_int_t)(k + 1));
                CHECK(json_integer_value(json_object_get(j, "index")) == (json_int_t)k);
                CHECK(!strcmp(json_string_value(json_object_get(j, "file")), BAD));
                CHECK(strstr(json_string_value(json_object_get(j, "reason")), want[k]) != NULL);
                CHECK(json_is_string(json_object_get(j, "record")) && json_is_string(json_object_get(j, "id")));
                json_decref(j);
            }
            k++;
        }
        free(ln);
        fclose(rf);
        CHECK(k == n && n == nw);
    }
    /* media parts dropped (counted) when not text-only */
    corpus_record rec = {0};
    o.text_only = 0;
    o.max_prompt_tokens = 0;
    const char *img = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"u\"}},"
                      " {\"type\": \"text\", \"text\": \"what?\"}]}]}";
    rec.file = "x";
    CHECK_OK(corpus_parse(tok(), &o, img, strlen(img), &rec, &err), &err);
    CHECK(rec.ok && rec.n_media_dropped == 1 && strstr(rec.render.text, "<|im_middle|>what?<|im_end|>"));
    corpus_record_free(&rec);
}

static void write_str(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

static void test_line_endings(void) {
    corpus_opts o;
    corpus_opts_default(&o);
    eg_error err = {0};
    summary s;
    char path[256];
    snprintf(path, sizeof path, "%s/crlf.jsonl", tmpdir());
    const char data[] = "\r\n{\"prompt\": \"a\"}\r\n\n   \n{\"id\": \"x\", \"prompt\": \"b\"}\r\n{\"prompt\": \"c\"}";
    write_str(path, data, sizeof data - 1);
    const char *p[] = {path};
    CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
    CHECK(s.n == 3 && s.n_ok == 3);
    char want[300];
    snprintf(want, sizeof want, "%s:2", path);
    CHECKF(!strcmp(s.ids[0], want), "id %s", s.ids[0]);
    CHECK(!strcmp(s.ids[1], "x"));
    snprintf(want, sizeof want, "%s:6", path);
    CHECKF(!strcmp(s.ids[2], want), "id %s", s.ids[2]);
    /* empty file */
    write_str(path, "", 0);
    CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
    CHECK(s.n == 0);
    /* over-long line: rejected, the next line still read */
    size_t n = 5000;
    char *big = malloc(n + 64);
    memset(big, 'a', n);
    memcpy(big, "{\"prompt\": \"", 12);
    memcpy(big + n, "\"}\n{\"prompt\": \"ok\"}\n", 20);
    write_str(path, big, n + 20);
    o.max_line_bytes = 1000;
    CHECK_OK(read_all(p, 1, &o, &s, &err), &err);
    CHECK(s.n == 2 && s.n_ok == 1 && strstr(s.reasons[0], "longer than 1000"));
    free(big);
    unlink(path);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random byte edits, truncations and splices of real lines: parse must never crash and
 * every record must be either ok or carry a reason. Also a mutated whole file. */
static void test_fuzz(void) {
    uint64_t s = eg_test_seed() * 31 + 7;
    FILE *f = fopen(SAMPLE, "rb");
    CHECK(f != NULL);
    if (!f) return;
    char *lines[64];
    size_t lens[64], nl = 0, cap = 0;
    char *ln = NULL;
    ssize_t n;
    while ((n = getline(&ln, &cap, f)) > 0 && nl < 64) {
        lines[nl] = malloc((size_t)n + 1);
        memcpy(lines[nl], ln, (size_t)n + 1);
        lens[nl++] = (size_t)n;
    }
    free(ln);
    fclose(f);
    corpus_opts o;
    corpus_opts_default(&o);
    corpus_record rec = {0};
    eg_error err = {0};
    size_t ok = 0, rejected = 0;
    static const char junk[] = "{}[]\":,\\u0000\\ud800 \xff\xc3\x80\n\t0-1e999";
    char *buf = malloc(1 << 16);
    for (int it = 0; it < 3000; it++) {
        size_t k = rng_next(&s) % nl, len = lens[k];
        memcpy(buf, lines[k], len);
        int edits = 1 + (int)(rng_next(&s) % 4);
        for (int e = 0; e < edits; e++) {
            switch (rng_next(&s) % 4) {
            case 0: len = rng_next(&s) % (len + 1); break;
            case 1: if (len) buf[rng_next(&s) % len] = (char)rng_next(&s); break;
            case 2: if (len) buf[rng_next(&s) % len] = junk[rng_next(&s) % (sizeof junk - 1)]; break;
            default: { /* splice another line's tail */
                size_t j = rng_next(&s) % nl, from = rng_next(&s) % (lens[j] + 1), at = len ? rng_next(&s) % len : 0;
                size_t add = lens[j] - from;
                if (at + add < (1 << 16)) { memcpy(buf + at, lines[j] + from, add); len = at + add; }
            }
            }
        }
        o.mode = (corpus_mode)(it % 3);
        rec.file = "fuzz";
        rec.line = (uint64_t)it;
        CHECK_OK(corpus_parse(tok(), &o, buf, len, &rec, &err), &err);
        if (rec.ok) ok++;
        else { rejected++; CHECK(rec.reason[0] != 0); }
        CHECK(rec.id != NULL);
    }
    printf("    fuzzed lines: %zu accepted, %zu rejected with a reason\n", ok, rejected);
    /* a mutated whole file through the reader (plain and gzip) */
    char path[256], cmd[600];
    snprintf(path, sizeof path, "%s/fuzz.jsonl", tmpdir());
    FILE *w = fopen(path, "wb");
    for (int it = 0; it < 200; it++) {
        size_t k = rng_next(&s) % nl;
        char tmp[4096];
        size_t len = lens[k] < sizeof tmp ? lens[k] : sizeof tmp;
        memcpy(tmp, lines[k], len);
        if (len) tmp[rng_next(&s) % len] = (char)rng_next(&s);
        fwrite(tmp, 1, len, w);
    }
    fclose(w);
    const char *p[] = {path};
    summary sm;
    o.mode = CORPUS_REGENERATE;
    CHECK_OK(read_all(p, 1, &o, &sm, &err), &err);
    CHECK(sm.n > 150);
    snprintf(cmd, sizeof cmd, "gzip -c %s > %s.gz", path, path);
    if (have_cli("gzip") && run(cmd) == 0) {
        char gz[300];
        snprintf(gz, sizeof gz, "%s.gz", path);
        const char *pg[] = {gz};
        summary sg;
        CHECK_OK(read_all(pg, 1, &o, &sg, &err), &err);
        CHECK(sg.n == sm.n && sg.n_ok == sm.n_ok);
        /* corrupt the gzip body: an error naming the file, never a crash */
        FILE *g = fopen(gz, "r+b");
        fseek(g, 200, SEEK_SET);
        fputs("garbage-garbage-garbage", g);
        fclose(g);
        eg_error e2 = {0};
        eg_status st = read_all(pg, 1, &o, &sg, &e2);
        CHECKF(st != EG_OK && strstr(e2.msg, "fuzz.jsonl.gz"), "corrupt gzip: %d %s", st, e2.msg);
        unlink(gz);
    }
    unlink(path);
    corpus_record_free(&rec);
    free(buf);
    for (size_t i = 0; i < nl; i++) free(lines[i]);
}

static const eg_test tests[] = {
    {"sample_styles", test_sample_styles},
    {"compressed_and_dirs", test_compressed_and_dirs},
    {"stdin", test_stdin},
    {"pipes", test_pipes},
    {"shard_resume", test_shard_resume},
    {"other_ids", test_other_ids},
    {"bad_records", test_bad_records},
    {"tools_refused", test_tools_refused},
    {"line_endings", test_line_endings},
    {"fuzz", test_fuzz},
};

int main(int argc, char **argv) {
    int rc = eg_test_main("prompts_corpus", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tok_free(g_tok);
    if (g_tmp[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
        if (system(cmd)) rc = 1;
    }
    return rc;
}
