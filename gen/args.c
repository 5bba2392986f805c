/* Flag parsing helpers; see args.h. */
#include "gen/args.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int gen_arg_int64(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *e;
    errno = 0;
    long long x = strtoll(v, &e, 10);
    if (errno || e == v || *e || x < lo || x > hi) {
        fprintf(stderr, "eaglegen %s: %s expects an integer in [%lld, %lld], got '%s'\n", cmd, flag, (long long)lo,
                (long long)hi, v);
        return 0;
    }
    *out = (int64_t)x;
    return 1;
}

int gen_arg_required(const char *cmd, const char *required, int n_pos, char **pos, int n, const char *const *names,
                     const int *have) {
    if (n_pos > 1) {
        fprintf(stderr, "eaglegen %s: unexpected argument '%s' (usage: eaglegen %s %s)\n", cmd, pos[1], cmd, required);
        return 0;
    }
    int missing = 0;
    for (int i = 0; i < n; i++) missing += !have[i];
    if (!missing) return 1;
    fprintf(stderr, "eaglegen %s: missing", cmd);
    for (int i = 0, k = 0; i < n; i++)
        if (!have[i]) fprintf(stderr, "%s %s", k++ ? "," : "", names[i]);
    fprintf(stderr, " (usage: eaglegen %s %s)\n", cmd, required);
    return 0;
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

/* Edit distance between a[0..na) and b[0..nb) (two rows, no cap on the lengths). */
static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    size_t *prev = malloc(sizeof *prev * (nb + 1)), *cur = malloc(sizeof *cur * (nb + 1));
    if (!prev || !cur) { free(prev); free(cur); return (size_t)-1; }
    for (size_t j = 0; j <= nb; j++) prev[j] = j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]), del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        size_t *t = prev;
        prev = cur;
        cur = t;
    }
    size_t d = prev[nb];
    free(prev);
    free(cur);
    return d;
}

/* One line for a bad option: the closest known one, or the candidates of an ambiguous
 * abbreviation, or where the value is missing. */
static void bad_option(const char *cmd, const char *arg, int missing, int short_opt, const struct option *opts) {
    if (missing) {
        fprintf(stderr, "eaglegen %s: %s needs a value (see eaglegen %s --help)\n", cmd, arg, cmd);
        return;
    }
    if (short_opt) {
        fprintf(stderr, "eaglegen %s: unknown option '-%c' (see eaglegen %s --help)\n", cmd, short_opt, cmd);
        return;
    }
    const char *name = arg;
    while (*name == '-') name++;
    size_t n = strcspn(name, "=");
    int matches = 0;
    for (const struct option *o = opts; o->name; o++) matches += !strncmp(o->name, name, n);
    /* "--flag=value" for a flag that takes none: getopt reports it as unknown */
    const struct option *exact = NULL;
    for (const struct option *o = opts; o->name; o++)
        if (!strncmp(o->name, name, n) && (matches == 1 || strlen(o->name) == n)) exact = o;
    if (name[n] == '=' && exact && exact->has_arg == no_argument) {
        fprintf(stderr, "eaglegen %s: --%s takes no value, got '%s' (see eaglegen %s --help)\n", cmd, exact->name, arg,
                cmd);
        return;
    }
    if (n && matches > 1) {
        fprintf(stderr, "eaglegen %s: option '%.*s' is ambiguous:", cmd, (int)(n + (size_t)(name - arg)), arg);
        for (const struct option *o = opts; o->name; o++)
            if (!strncmp(o->name, name, n)) fprintf(stderr, " --%s", o->name);
        fprintf(stderr, "\n");
        return;
    }
    const char *best = NULL;
    size_t bd = (size_t)-1;
    for (const struct option *o = opts; o->name; o++) {
        size_t d = edit_distance(name, n, o->name, strlen(o->name));
        if (d < bd) { bd = d; best = o->name; }
    }
    if (best && bd <= n / 4 + 1)
        fprintf(stderr, "eaglegen %s: unknown option '%.*s'; did you mean --%s? (see eaglegen %s --help)\n", cmd,
                (int)(n + (size_t)(name - arg)), arg, best, cmd);
    else
        fprintf(stderr, "eaglegen %s: unknown option '%.*s' (see eaglegen %s --help)\n", cmd,
                (int)(n + (size_t)(name - arg)), arg, cmd);
}

int gen_getopt(int argc, char **argv, const char *cmd, const char *shortopts, const struct option *opts) {
    char so[64];
    snprintf(so, sizeof so, ":%s", shortopts);
    opterr = 0;
    int prev = optind;
    int ch = getopt_long(argc, argv, so, opts, NULL);
    if (ch != '?' && ch != ':') return ch;
    /* A long option: getopt_long has always stepped past its word. A short one may sit
       inside a cluster, and the word before optind can be a positional argument getopt
       skipped over (it permutes them to the end), so a short option is named by its
       character alone. */
    const char *word = optind > prev && optind - 1 < argc ? argv[optind - 1] : NULL;
    if (word && (!strncmp(word, "--", 2) || !optopt)) {
        bad_option(cmd, word, ch == ':', 0, opts);
    } else {
        char s[3] = {'-', (char)optopt, 0};
        bad_option(cmd, s, ch == ':', ch == ':' ? 0 : optopt, opts);
    }
    return '?';
}

int gen_arg_size(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t *out) {
    char *e;
    errno = 0;
    double x = strtod(v, &e);
    double mul = 1;
    if (e != v && *e) {
        switch (*e == 'k' ? 'K' : *e) {
        case 'K': mul = 1e3; break;
        case 'M': mul = 1e6; break;
        case 'G': mul = 1e9; break;
        case 'T': mul = 1e12; break;
        default: mul = 0;
        }
        e++;
        if (*e == 'B') e++;
    }
    if (errno || e == v || *e || mul == 0 || !(x * mul >= (double)lo && x * mul <= 9e18)) {
        fprintf(stderr, "eaglegen %s: %s expects a size of at least %lld bytes (e.g. 2G, 500M, 4096), got '%s'\n", cmd,
                flag, (long long)lo, v);
        return 0;
    }
    *out = (int64_t)(x * mul);
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
