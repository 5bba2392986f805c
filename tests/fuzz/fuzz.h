/* fuzz.h — shared helpers of the libFuzzer harnesses (tests/fuzz/fuzz_*.c).
 *
 * Each harness defines LLVMFuzzerTestOneInput over one parser and checks properties
 * that must hold for every input (round trips, masks equal to spans); a broken property
 * calls abort(), which libFuzzer reports like a crash. The same file is linked two ways:
 *  - `make fuzz`: with clang -fsanitize=fuzzer,address,undefined (the campaign);
 *  - `make test`: with cc and tests/fuzz/replay.c, which feeds it every stored input of
 *    tests/fuzz/corpus/NAME/ (seeds and the inputs a campaign found), no clang needed.
 * Scratch files live in one directory per process, removed at exit.
 * Thread safety: one thread (as libFuzzer and the replay driver call it). */
#ifndef EG_FUZZ_H
#define EG_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/eg_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                                      \
    do {                                                                                   \
        if (!(c)) {                                                                        \
            fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", #c, __FILE__, __LINE__); \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* The fixtures directory: $FIXTURES, else ../shared/fixtures (run from the checkout). */
static inline const char *fuzz_fixtures(void) {
    const char *f = getenv("FIXTURES");
    return f && *f ? f : "../shared/fixtures";
}

static char fuzz_dir_buf[64];
static void fuzz_dir_remove(void) {
    char sub[128];
    snprintf(sub, sizeof sub, "%s/b", fuzz_dir_buf);
    eg_rm_flat_dir(sub);
    eg_rm_flat_dir(fuzz_dir_buf);
}
/* This process's scratch directory (with a subdirectory "b" for second copies). */
static inline const char *fuzz_dir(void) {
    if (!fuzz_dir_buf[0]) {
        snprintf(fuzz_dir_buf, sizeof fuzz_dir_buf, "/tmp/egfuzz.XXXXXX");
        if (!mkdtemp(fuzz_dir_buf)) { perror("mkdtemp"); abort(); }
        char sub[128];
        snprintf(sub, sizeof sub, "%s/b", fuzz_dir_buf);
        if (mkdir(sub, 0755)) { perror("mkdir"); abort(); }
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_buf;
}

/* Write data to fuzz_dir()/name (replacing it); returns the path (static buffer). */
static inline const char *fuzz_file(const char *name, const uint8_t *d, size_t n) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(d, 1, n, f) != n) || fclose(f)) { perror(path); abort(); }
    return path;
}

/* A NUL-terminated copy of the input (caller frees). */
static inline char *fuzz_cstr(const uint8_t *d, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, d, n);
    s[n] = 0;
    return s;
}

#endif
