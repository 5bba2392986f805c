/* Flag parsing helpers; see args.h. */
#include "gen/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int gen_arg_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out) {
    char *e;
    errno = 0;
    long x = strtol(v, &e, 10);
    if (errno || e == v || *e || x < lo || x > hi) {
        fprintf(stderr, "eaglegen %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo, hi, v);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int gen_arg_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
    char *e;
    errno = 0;
    double x = strtod(v, &e);
    if (errno || e == v || *e || !(x >= lo && x <= hi)) {
        fprintf(stderr, "eaglegen %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int gen_arg_int_list(const char *cmd, const char *flag, const char *v, long lo, int *out, int max, int *n) {
    const char *s = v;
    *n = 0;
    while (*s) {
        char *e;
        errno = 0;
        long x = strtol(s, &e, 10);
        if (errno || e == s || x < lo || x > 1L << 30 || *n >= max || (*e && *e != ',') || (*e == ',' && !e[1])) {
            fprintf(stderr, "eaglegen %s: %s expects up to %d comma-separated integers >= %ld, got '%s'\n", cmd, flag,
                    max, lo, v);
            return 0;
        }
        out[(*n)++] = (int)x;
        s = *e ? e + 1 : e;
    }
    if (!*n) {
        fprintf(stderr, "eaglegen %s: %s expects at least one integer\n", cmd, flag);
        return 0;
    }
    return 1;
}

/* MemAvailable from /proc/meminfo (free pages where it is missing), in bytes. */
int64_t gen_mem_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb >= 0) return (int64_t)kb * 1024;
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (int64_t)pages * size : 0;
}
