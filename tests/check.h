/* check.h — the test harness: a table of test functions and a CHECK helper.
 * Each tests/test_*.c defines its functions and a table, and calls eg_test_main.
 * A test fails when any CHECK in it fails; the binary prints one line per test and a
 * closing "N passed, N failed" line, and exits non-zero on any failure.
 * EG_SEED (env) fixes the seed of seeded-random tests; the seed is always printed. */
#ifndef EG_CHECK_H
#define EG_CHECK_H

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/eg_common.h"

typedef struct eg_test {
    const char *name;
    void (*fn)(void);
} eg_test;

static int eg_check_failures;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "    CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            eg_check_failures++;                                                         \
        }                                                                                \
    } while (0)

#define CHECKF(cond, ...)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "    CHECK failed: %s (%s:%d): ", #cond, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            eg_check_failures++;                                                         \
        }                                                                                \
    } while (0)

/* Check an eg_status-returning call succeeded; print the error message if not. */
#define CHECK_OK(call, errp)                                                             \
    do {                                                                                 \
        eg_status st_ = (call);                                                          \
        if (st_ != EG_OK) {                                                              \
            fprintf(stderr, "    CHECK_OK failed: %s (%s:%d): %s\n", #call, __FILE__,    \
                    __LINE__, (errp)->msg);                                              \
            eg_check_failures++;                                                         \
        }                                                                                \
    } while (0)

static inline uint64_t eg_test_seed(void) {
    const char *s = getenv("EG_SEED");
    static uint64_t seed;
    static int printed;
    if (!printed) {
        seed = s ? strtoull(s, NULL, 0) : 12345;
        fprintf(stderr, "  (seed %" PRIu64 "; set EG_SEED to change)\n", seed);
        printed = 1;
    }
    return seed;
}

/* Whole file, NUL-terminated (n excludes the NUL); NULL if it cannot be opened. */
static inline char *eg_test_read_file(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(len > 0 ? len : 0) + 1);
    if (!b) { fclose(f); return NULL; }
    *n = fread(b, 1, (size_t)(len > 0 ? len : 0), f);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* Remove a flat directory of files that a test made (no recursion needed). */
static inline void eg_test_rm_dir(const char *dir) { eg_rm_flat_dir(dir); }

static inline int eg_test_main(const char *suite, const eg_test *t, int n, int argc, char **argv) {
    int passed = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && !strstr(t[i].name, argv[1])) continue;
        int before = eg_check_failures;
        t[i].fn();
        int ok = eg_check_failures == before;
        printf("  %s %s.%s\n", ok ? "ok  " : "FAIL", suite, t[i].name);
        fflush(stdout);
        if (ok) passed++; else failed++;
    }
    printf("%s: %d passed, %d failed\n", suite, passed, failed);
    return failed ? 1 : 0;
}

#define EG_TEST_MAIN(suite, table)                                                       \
    int main(int argc, char **argv) {                                                    \
        return eg_test_main(suite, table, (int)(sizeof table / sizeof table[0]), argc, argv); \
    }

#endif
