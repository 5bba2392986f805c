/* gen/job.c's rejects ledger: live entries, line hashes and "cleared" lines, across
 * reopens; a ledger from before line hashes (no "line_hash") is trusted as it was. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/job.h"
#include "tests/check.h"

static char dir[64];

static void write_file(const char *text) {
    char p[128];
    snprintf(p, sizeof p, "%s/r.jsonl", dir);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) { fputs(text, f); fclose(f); }
}

static gen_ledger *open_l(void) {
    gen_ledger *l = NULL;
    eg_error err = {0};
    CHECK_OK(gen_ledger_open(dir, "r.jsonl", &l, &err), &err);
    return l;
}

static int64_t total(const gen_ledger *l) {
    int64_t n = 0;
    for (int o = 0; o < GEN_NOUTCOMES; o++) n += gen_ledger_count(l, (gen_outcome)o);
    return n;
}

/* add, check by hash, clear, log again; every state read back by a reopen */
static void test_clear_roundtrip(void) {
    write_file("");
    eg_error err = {0};
    gen_ledger *l = open_l();
    if (!l) return;
    uint64_t h1 = gen_line_hash("{\"prompt\": 1", 12), h2 = gen_line_hash("{\"prompt\":\"1\"}", 14);
    CHECK(h1 != h2);
    CHECK_OK(gen_ledger_add(l, 7, "in", 8, "in:8", GEN_OUT_REJECTED, "bad", h1, "{\"prompt\": 1", &err), &err);
    CHECK_OK(gen_ledger_add(l, 9, "in", 10, "x", GEN_OUT_DUPLICATE, "dup", h2, NULL, &err), &err);
    CHECK(gen_ledger_check(l, 7, h1) == GEN_LEDGER_SAME && gen_ledger_check(l, 7, h2) == GEN_LEDGER_CHANGED);
    CHECK(gen_ledger_check(l, 8, h1) == GEN_LEDGER_NONE);
    gen_ledger_close(l);
    l = open_l();
    if (!l) return;
    CHECK(gen_ledger_check(l, 7, h1) == GEN_LEDGER_SAME && gen_ledger_check(l, 7, h2) == GEN_LEDGER_CHANGED);
    CHECK(gen_ledger_count(l, GEN_OUT_REJECTED) == 1 && gen_ledger_count(l, GEN_OUT_DUPLICATE) == 1);
    CHECK_OK(gen_ledger_clear(l, 7, "in", 8, "in:8", h2, &err), &err);
    CHECK(!gen_ledger_has(l, 7) && gen_ledger_count(l, GEN_OUT_REJECTED) == 0 && total(l) == 1);
    CHECK_OK(gen_ledger_clear(l, 8, "in", 9, "in:9", h2, &err), &err); /* nothing live: nothing written */
    gen_ledger_close(l);
    l = open_l();
    if (!l) return;
    CHECK(!gen_ledger_has(l, 7) && gen_ledger_check(l, 7, h1) == GEN_LEDGER_NONE && total(l) == 1);
    CHECK(gen_ledger_has(l, 9));
    /* broken again: logged again, live, and the old clear does not touch it on reopen */
    uint64_t h3 = gen_line_hash("{\"prompt\":\"1\"]", 14);
    CHECK_OK(gen_ledger_add(l, 7, "in", 8, "in:8", GEN_OUT_REJECTED, "bad again", h3, NULL, &err), &err);
    gen_ledger_close(l);
    l = open_l();
    if (!l) return;
    CHECK(gen_ledger_check(l, 7, h3) == GEN_LEDGER_SAME && gen_ledger_count(l, GEN_OUT_REJECTED) == 1 && total(l) == 2);
    gen_ledger_close(l);
    char p[128];
    snprintf(p, sizeof p, "%s/r.jsonl", dir);
    FILE *f = fopen(p, "r");
    int lines = 0, cleared = 0;
    char buf[4096];
    while (f && fgets(buf, sizeof buf, f)) lines++, cleared += strstr(buf, "\"outcome\":\"cleared\"") != NULL;
    if (f) fclose(f);
    CHECKF(lines == 4 && cleared == 1, "%d lines, %d cleared (want 4 and 1)", lines, cleared);
}

/* entries without "line_hash" (ledgers of earlier versions) stay SAME whatever the line */
static void test_old_entries(void) {
    write_file("{\"index\":3,\"outcome\":\"rejected\",\"file\":\"in\",\"line\":4,\"id\":\"a\",\"reason\":\"r\"}\n"
               "{\"index\":5,\"outcome\":\"dropped\",\"file\":\"in\",\"line\":6,\"id\":\"b\",\"reason\":\"r\"}\n");
    gen_ledger *l = open_l();
    if (!l) return;
    CHECK(gen_ledger_check(l, 3, 1) == GEN_LEDGER_SAME && gen_ledger_check(l, 5, 99) == GEN_LEDGER_SAME);
    CHECK(gen_ledger_count(l, GEN_OUT_REJECTED) == 1 && gen_ledger_count(l, GEN_OUT_DROPPED) == 1);
    gen_ledger_close(l);
}

/* a cleared line applies to the entry logged last before it, in a file out of index order */
static void test_clear_order(void) {
    write_file("{\"index\":9,\"outcome\":\"rejected\",\"line_hash\":\"0000000000000001\"}\n"
               "{\"index\":2,\"outcome\":\"rejected\",\"line_hash\":\"0000000000000002\"}\n"
               "{\"index\":9,\"outcome\":\"cleared\",\"line_hash\":\"0000000000000003\"}\n"
               "{\"index\":9,\"outcome\":\"dropped\",\"line_hash\":\"0000000000000004\"}\n"
               "{\"index\":2,\"outcome\":\"cleared\",\"line_hash\":\"0000000000000005\"}\n");
    gen_ledger *l = open_l();
    if (!l) return;
    CHECK(gen_ledger_check(l, 9, 4) == GEN_LEDGER_SAME && gen_ledger_check(l, 9, 1) == GEN_LEDGER_CHANGED);
    CHECK(!gen_ledger_has(l, 2));
    CHECK(gen_ledger_count(l, GEN_OUT_REJECTED) == 0 && gen_ledger_count(l, GEN_OUT_DROPPED) == 1);
    gen_ledger_close(l);
}

/* damaged lines are refused naming file and line */
static void test_damaged(void) {
    static const char *const bad[] = {
        "{\"index\":1,\"outcome\":\"rejected\",\"line_hash\":\"xyz\"}\n",
        "{\"index\":1,\"outcome\":\"rejected\",\"line_hash\":\"00000000000000001\"}\n",
        "{\"index\":1,\"outcome\":\"rejected\",\"line_hash\":7}\n",
        "{\"index\":1,\"outcome\":\"forgotten\"}\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(bad[i]);
        gen_ledger *l = NULL;
        eg_error err = {0};
        eg_status st = gen_ledger_open(dir, "r.jsonl", &l, &err);
        CHECKF(st == EG_ERR_FORMAT && strstr(err.msg, "r.jsonl:1: damaged ledger line"), "case %zu: %d %s", i, st,
               err.msg);
        gen_ledger_close(l);
    }
}

static const eg_test tests[] = {
    {"clear_roundtrip", test_clear_roundtrip},
    {"old_entries", test_old_entries},
    {"clear_order", test_clear_order},
    {"damaged", test_damaged},
};

int main(int argc, char **argv) {
    snprintf(dir, sizeof dir, "/tmp/eg_ledger_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    int rc = eg_test_main("gen_ledger", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    char p[128];
    snprintf(p, sizeof p, "%s/r.jsonl", dir);
    unlink(p);
    rmdir(dir);
    return rc;
}
