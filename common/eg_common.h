/* eg_common.h — the base every eaglegen module stands on: error values, BF16/FP8
 * conversion, small helpers.
 *
 * Errors are values: a function that can fail returns eg_status and, when it fails,
 * writes a message with context (file, line, tensor name) into the caller's eg_error.
 * Only gen/ decides to exit the process.
 * Ownership: eg_error is a plain caller-owned struct; nothing here allocates.
 * Thread safety: everything here is reentrant. */
#ifndef EG_COMMON_H
#define EG_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum eg_status {
    EG_OK = 0,
    EG_ERR_IO,          /* open/read/write/mmap failed */
    EG_ERR_FORMAT,      /* malformed input: bad JSON, corrupt header, wrong shape */
    EG_ERR_CONFIG,      /* unsupported or inconsistent configuration */
    EG_ERR_NOMEM,
    EG_ERR_INVALID,     /* bad argument from the caller or user */
    EG_ERR_UNSUPPORTED, /* valid, but not implemented / not available here */
    EG_ERR_DEVICE,      /* CUDA, cuBLAS, NCCL */
    EG_ERR_INTERRUPTED, /* SIGINT/SIGTERM seen */
    EG_ERR_CHECKSUM     /* data failed an integrity check */
} eg_status;

typedef struct eg_error {
    eg_status code;
    char msg[1024];
} eg_error;

/* Record an error (printf-style) and return its code, so call sites read
 * `return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));`.
 * err may be NULL. */
eg_status eg_fail(eg_error *err, eg_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix context onto an existing message: "loading X: <old message>". */
eg_status eg_wrap(eg_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *eg_status_name(eg_status s);

/* Assertions stay on in release builds. */
#define EG_ASSERT(c)                                                                     \
    do {                                                                                 \
        if (!(c)) eg_assert_fail(#c, __FILE__, __LINE__);                                \
    } while (0)
void eg_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* BF16: the upper 16 bits of an IEEE float; rounding is to nearest even, NaN kept quiet. */
static inline float eg_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t eg_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float eg_bf16_round(float f) { return eg_bf16_to_f32(eg_f32_to_bf16(f)); }

/* IEEE half -> float (safetensors F16). */
float eg_f16_to_f32(uint16_t h);
/* OCP FP8 E4M3 (fn: no infinities, 0x7f/0xff NaN) -> float. */
float eg_fp8e4m3_to_f32(uint8_t v);
/* float -> OCP FP8 E4M3, round to nearest even, finite values past +-448 saturate to
 * +-448 (CUDA's __NV_SATFINITE, what serving engines' FP8 caches use); NaN -> 0x7f. Used
 * only by `eaglegen fidelity`'s measurement caches: eaglegen never stores FP8 data. */
uint8_t eg_f32_to_fp8e4m3(float f);

/* Allocation helpers that fail with an eg_error instead of returning silently. */
void *eg_malloc(size_t n, eg_error *err);
void *eg_calloc(size_t n, size_t size, eg_error *err);

/* UTF-8 for JSON files: jansson refuses strings that are not valid UTF-8, so a path, id
 * or name taken from the outside world goes through eg_utf8_escape before it reaches one.
 * eg_utf8_valid_prefix: length of the longest valid prefix of s[0..n) (n when all of it
 * is valid; overlong forms, surrogates and code points past U+10FFFF are invalid, as in
 * jansson). eg_utf8_escape: a malloc'd copy of s, unchanged when it is valid UTF-8,
 * otherwise with each byte that is not part of a valid sequence written as the four
 * characters "\xNN" (hex, upper case); NULL only when out of memory. */
size_t eg_utf8_valid_prefix(const char *s, size_t n);
char *eg_utf8_escape(const char *s);

/* s as one POSIX shell word, for a command line printed to be pasted: unchanged when it
 * holds only [A-Za-z0-9_@%+=:,./-] (and is not empty), else in single quotes with each '
 * written '\''. A malloc'd string; NULL only when out of memory. */
char *eg_shell_quote(const char *s);

/* Monotonic seconds. */
double eg_now(void);

/* Number of worker threads for CPU work: $EG_THREADS, else online CPUs. */
int eg_num_threads(void);

/* Remove a flat directory of files (scratch that this program made; no recursion):
 * best effort, errors ignored. */
void eg_rm_flat_dir(const char *dir);

#endif
