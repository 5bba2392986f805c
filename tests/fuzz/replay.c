/* replay.c — runs a fuzz harness (tests/fuzz/fuzz_*.c) over stored inputs without
 * libFuzzer: `replay_NAME FILE|DIR...` calls LLVMFuzzerTestOneInput once per file (a
 * directory: each regular file in it, sorted) and prints "fuzz_NAME: N passed, 0 failed".
 * A broken property aborts, which fails the test. `make test` runs it over
 * tests/fuzz/corpus/NAME/ (tests/t_fuzz_replay.sh). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return 0; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "%s: read failed\n", path);
        fclose(f);
        free(buf);
        return 0;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 1;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    long done = 0, bad = 0;
    const char *name = strstr(argv[0], "replay_") ? strstr(argv[0], "replay_") + 7 : argv[0];
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb)) { perror(argv[i]); bad++; continue; }
        if (!S_ISDIR(sb.st_mode)) { if (run_file(argv[i])) done++; else bad++; continue; }
        DIR *d = opendir(argv[i]);
        if (!d) { perror(argv[i]); bad++; continue; }
        char **names = NULL;
        size_t nn = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            names = realloc(names, (nn + 1) * sizeof *names);
            if (!names || !(names[nn] = strdup(e->d_name))) { fprintf(stderr, "out of memory\n"); return 1; }
            nn++;
        }
        closedir(d);
        if (nn) qsort(names, nn, sizeof *names, cmp);
        for (size_t k = 0; k < nn; k++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], names[k]);
            if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
                if (run_file(p)) done++;
                else bad++;
            }
            free(names[k]);
        }
        free(names);
    }
    printf("fuzz_%s: %ld passed, %ld failed\n", name, done, bad);
    return bad != 0 || done == 0;
}
