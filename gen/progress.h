/* progress.h — the progress of long runs: on a terminal one line redrawn in place, a bar
 * fitted to the terminal's width (never wrapping, e.g. at 80 columns); otherwise a plain
 * line every 10 s; optionally JSON lines to a file (--log-json) with a UTC timestamp, the
 * worker, the phase and the counts.
 * Rate and ETA come from this run's own work: records an earlier run already did (or
 * that this one passes over as done) are counted as done but are not speed. When the
 * record count is unknown (compressed inputs), the bar and ETA follow the input bytes
 * consumed (compressed bytes, of the files' total size), of which this run's own share
 * is taken as its share of the records handled.
 * Thread safety: one thread. */
#ifndef EG_GEN_PROGRESS_H
#define EG_GEN_PROGRESS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct gen_progress_state {
    int64_t records_done;    /* records handled (samples + rejected + dropped + skipped) */
    int64_t records_skipped; /* of those, done by an earlier run (not this run's work) */
    int64_t records_total;   /* -1 = unknown (compressed inputs, stdin) */
    int64_t samples;         /* samples written this run */
    int64_t rejected;        /* rejected + dropped + duplicate ids, all runs */
    int64_t prefill_tokens, decode_tokens;
    double engine_seconds;
    int64_t shards;
    double compression;      /* raw / stored bytes, 0 = unknown */
    int64_t input_bytes_done;  /* input consumed, as stored (compressed) */
    int64_t input_bytes_total; /* sum of the input files' sizes; <= 0 = unknown */
} gen_progress_state;

typedef struct gen_progress {
    FILE *json;
    int tty;
    double start, last;
    double interval;        /* seconds between lines */
    int drawn;
    int worker, n_workers;
} gen_progress;

void gen_progress_init(gen_progress *p, FILE *json_log, int worker, int n_workers);
/* Print when due (force = 1: now, e.g. the final line). */
void gen_progress_update(gen_progress *p, const gen_progress_state *s, int force);
/* Ends the redrawn line; the JSON log gets a last line with the run's end as its phase:
 * "done", "interrupted" or "error". */
void gen_progress_finish(gen_progress *p, const gen_progress_state *s, const char *phase);

/* The progress line for a terminal of cols columns (bar = 1: with a bar): at most
 * cols - 1 characters, whatever the numbers; what does not fit is left out, least
 * important first. elapsed: seconds of this run. Returns the length. */
size_t gen_progress_format(char *out, size_t cap, const gen_progress_state *s, double elapsed, int cols, int bar);

/* Columns of the terminal on fd (TIOCGWINSZ, else $COLUMNS, else 80). */
int gen_progress_columns(int fd);

#endif
