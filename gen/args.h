/* args.h — number parsing for the subcommands' flags, with one message style:
 * "eaglegen CMD: --flag expects ..., got 'TEXT'". Each returns 1 on success and 0
 * (after printing the message) on bad input. Thread safety: reentrant. */
#ifndef EG_GEN_ARGS_H
#define EG_GEN_ARGS_H

#include <stdint.h>

int gen_arg_int(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out);
int gen_arg_double(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);
/* Comma-separated integers >= lo, at most max of them, at least one. */
int gen_arg_int_list(const char *cmd, const char *flag, const char *v, long lo, int *out, int max, int *n);

/* Host memory available to this process now (MemAvailable from /proc/meminfo, else
 * free pages), in bytes; 0 when unknown. */
int64_t gen_mem_available_bytes(void);

#endif
