/* args.h — option and number parsing for the subcommands' flags, with one message style:
 * "eaglegen CMD: --flag expects ..., got 'TEXT'". Each returns 1 on success and 0
 * (after printing the message) on bad input. Thread safety: reentrant. */
#ifndef EG_GEN_ARGS_H
#define EG_GEN_ARGS_H

#include <stdint.h>

int gen_arg_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out);
int gen_arg_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);
/* A byte size: a number with an optional K, M, G or T (decimal, a trailing B allowed):
 * "2G" = 2000000000. At least lo. */
int gen_arg_size(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t *out);
/* A 64-bit integer in [lo, hi]. */
int gen_arg_int64(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);
/* The positional DIR and required flags of a command, checked in one place: prints
 * "eaglegen CMD: missing A, B (usage: eaglegen CMD USAGE)" for the names[i] whose have[i] is 0,
 * or "eaglegen CMD: unexpected argument 'X' (usage: ...)" for a second positional (n_pos > 1: argv
 * from optind), and returns 0; 1 when all is there. */
int gen_arg_required(const char *cmd, const char *usage, int n_pos, char **pos, int n, const char *const *names,
                     const int *have);
/* Comma-separated integers >= lo, at most max of them, at least one. */
int gen_arg_int_list(const char *cmd, const char *flag, const char *v, long lo, int *out, int max, int *n);

/* getopt_long that reports a bad option in one line on stderr and returns '?': an unknown
 * option with the closest known one ("unknown option '--tempreature'; did you mean
 * --temperature?"), an ambiguous abbreviation with its candidates, a missing value
 * ("--model needs a value"). Same contract as getopt_long otherwise (optind, optarg). */
struct option;
int gen_getopt(int argc, char **argv, const char *cmd, const char *shortopts, const struct option *opts);
/* Host memory available to this process now (MemAvailable from /proc/meminfo, else
 * free pages), in bytes; 0 when unknown. */
int64_t gen_mem_available_bytes(void);

#endif
