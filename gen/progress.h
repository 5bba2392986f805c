/* progress.h — the progress line of long runs: redrawn in place on a terminal, plain
 * periodic lines otherwise, and optionally JSON lines to a file (--log-json).
 * Thread safety: one thread. */
#ifndef EG_GEN_PROGRESS_H
#define EG_GEN_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct gen_progress_state {
    int64_t records_done;   /* records handled (samples + rejected + dropped + skipped) */
    int64_t records_total;  /* -1 = unknown */
    int64_t samples;        /* samples written this run */
    int64_t prefill_tokens, decode_tokens;
    double engine_seconds;
    int64_t shards;
    double compression;     /* raw / stored bytes, 0 = unknown */
} gen_progress_state;

typedef struct gen_progress {
    FILE *json;
    int tty;
    double start, last;
    double interval;        /* seconds between plain lines */
    int drawn;
} gen_progress;

void gen_progress_init(gen_progress *p, FILE *json_log);
/* Print when due (force = 1: now, e.g. the final line). */
void gen_progress_update(gen_progress *p, const gen_progress_state *s, int force);
void gen_progress_finish(gen_progress *p);

#endif
