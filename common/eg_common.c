/* Error values and small helpers; see eg_common.h. */
#include "common/eg_common.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

eg_status eg_fail(eg_error *err, eg_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

eg_status eg_wrap(eg_error *err, const char *fmt, ...) {
    if (!err) return EG_ERR_INVALID;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
    return err->code;
}

const char *eg_status_name(eg_status s) {
    switch (s) {
    case EG_OK: return "ok";
    case EG_ERR_IO: return "I/O error";
    case EG_ERR_FORMAT: return "format error";
    case EG_ERR_CONFIG: return "configuration error";
    case EG_ERR_NOMEM: return "out of memory";
    case EG_ERR_INVALID: return "invalid argument";
    case EG_ERR_UNSUPPORTED: return "unsupported";
    case EG_ERR_DEVICE: return "device error";
    case EG_ERR_INTERRUPTED: return "interrupted";
    case EG_ERR_CHECKSUM: return "checksum mismatch";
    }
    return "unknown error";
}

void eg_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "eaglegen: internal assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

float eg_f16_to_f32(uint16_t h) {
    int s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

float eg_fp8e4m3_to_f32(uint8_t x) {
    int s = x >> 7, e = (x >> 3) & 15, m = x & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m, -9); /* subnormal: m/8 * 2^-6 */
    else v = ldexpf((float)(8 + m), e - 10);
    return s ? -v : v;
}

uint8_t eg_f32_to_fp8e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t s = signbit(f) ? 0x80 : 0;
    double a = fabs((double)f);
    if (isinf(f)) return (uint8_t)(s | 0x7e);
    if (a < 0x1p-6) return (uint8_t)(s | (uint8_t)nearbyint(a * 512.0)); /* subnormal (8 = 2^-6) */
    int e2;
    frexp(a, &e2); /* a = m * 2^e2, m in [0.5, 1) */
    int e = e2 - 1;
    int q = (int)nearbyint((ldexp(a, -e) - 1.0) * 8.0); /* 0..8, ties to even */
    if (q == 8) { q = 0; e++; }
    if (e + 7 > 15 || (e + 7 == 15 && q == 7)) return (uint8_t)(s | 0x7e); /* saturate at 448 */
    return (uint8_t)(s | ((e + 7) << 3) | q);
}

void *eg_malloc(size_t n, eg_error *err) {
    void *p = malloc(n ? n : 1);
    if (!p) eg_fail(err, EG_ERR_NOMEM, "out of memory allocating %zu bytes", n);
    return p;
}

void *eg_calloc(size_t n, size_t size, eg_error *err) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) eg_fail(err, EG_ERR_NOMEM, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

double eg_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int eg_num_threads(void) {
    /* a number in 1..4096 (the --threads range); anything else is ignored with a
     * warning rather than read half-way (atoi("8x") = 8) */
    const char *s = getenv("EG_THREADS");
    if (s && *s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (!errno && !*end && v >= 1 && v <= 4096) return (int)v;
        static int warned; /* asked once per backend and pool: said once */
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "eaglegen: ignoring EG_THREADS=\"%s\" (expected 1..4096)\n", s);
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void eg_rm_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4200];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

size_t eg_utf8_valid_prefix(const char *s_, size_t len) {
    const unsigned char *s = (const unsigned char *)s_;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t n;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
        else return i;
        if (n > len - i) return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += n;
    }
    return len;
}

char *eg_utf8_escape(const char *raw) {
    size_t n = strlen(raw);
    char *o = malloc(4 * n + 1);
    if (!o) return NULL;
    size_t j = 0;
    const unsigned char *s = (const unsigned char *)raw;
    for (size_t i = 0; i < n;) {
        size_t k = eg_utf8_valid_prefix(raw + i, n - i);
        memcpy(o + j, s + i, k);
        j += k;
        i += k;
        if (i < n) j += (size_t)snprintf(o + j, 5, "\\x%02X", s[i++]);
    }
    o[j] = 0;
    return o;
}

char *eg_shell_quote(const char *s) {
    size_t n = 0, quotes = 0;
    int plain = *s != 0;
    for (const char *p = s; *p; p++, n++) {
        if (*p == '\'') quotes++;
        if (!isalnum((unsigned char)*p) && !strchr("_@%+=:,./-", *p)) plain = 0;
    }
    char *out = malloc(plain ? n + 1 : n + 3 * quotes + 3);
    if (!out) return NULL;
    if (plain) return memcpy(out, s, n + 1);
    char *q = out;
    *q++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') { memcpy(q, "'\\''", 4); q += 4; }
        else *q++ = *p;
    }
    *q++ = '\'';
    *q = 0;
    return out;
}
