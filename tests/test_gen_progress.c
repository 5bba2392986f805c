/* gen/progress: the progress line never exceeds the terminal (no wrapping at any width,
 * whatever the numbers), keeps the most important parts when narrow, has a bar when there
 * is room, and takes rate and ETA from this run's own work (skipped records are not speed). */
#include <string.h>

#include "gen/progress.h"
#include "tests/check.h"

static gen_progress_state big(void) {
    gen_progress_state s = {.records_done = 123456789, .records_skipped = 1000, .records_total = 987654321,
                            .samples = 123450000, .rejected = 987654, .prefill_tokens = 9000000000LL,
                            .decode_tokens = 8000000000LL, .engine_seconds = 3.5, .shards = 123456,
                            .compression = 1.18};
    return s;
}

static void test_fits(void) {
    gen_progress_state s = big();
    char line[1024];
    for (int cols = 1; cols <= 300; cols++) {
        for (int bar = 0; bar < 2; bar++) {
            size_t n = gen_progress_format(line, sizeof line, &s, 12345.0, cols, bar);
            CHECKF(n == strlen(line) && (int)n <= (cols > 1 ? cols - 1 : 0), "cols %d: %zu chars: %s", cols, n, line);
        }
    }
    /* unknown total: no bar, "?" */
    s.records_total = -1;
    gen_progress_format(line, sizeof line, &s, 10, 80, 1);
    CHECKF(strstr(line, "/? rec") && !strchr(line, '['), "%s", line);
}

static void test_narrow_keeps_records(void) {
    gen_progress_state s = big();
    char line[256];
    gen_progress_format(line, sizeof line, &s, 100, 40, 1);
    CHECKF(!strncmp(line, "123.5M/987.7M rec", 17) && strstr(line, "ETA"), "%s", line);
    gen_progress_format(line, sizeof line, &s, 100, 200, 1);
    CHECKF(line[0] == '[' && strstr(line, "%") && strstr(line, "rej 987654") && strstr(line, "tok/s"), "%s", line);
}

static void test_eta_from_own_work(void) {
    /* 900 of 1000 records were done before; this run did 50 in 50 s: 50 left = 50 s */
    gen_progress_state s = {.records_done = 950, .records_skipped = 900, .records_total = 1000, .samples = 50};
    char line[256];
    gen_progress_format(line, sizeof line, &s, 50, 200, 0);
    CHECKF(strstr(line, "ETA 0m50s"), "%s", line);
    /* nothing of its own yet: unknown, not "done in 0 s" */
    s.records_done = 900;
    gen_progress_format(line, sizeof line, &s, 50, 200, 0);
    CHECKF(strstr(line, "ETA ?"), "%s", line);
}

static void test_compressed_by_bytes(void) {
    /* record count unknown (compressed input): 400 of 1000 input bytes consumed, 200 records
     * handled, 100 of them done by an earlier run: this run's own 200 bytes took 100 s, so
     * the 600 bytes left take 300 s; the bar shows 40% */
    gen_progress_state s = {.records_done = 200, .records_skipped = 100, .records_total = -1, .samples = 100,
                            .input_bytes_done = 400, .input_bytes_total = 1000};
    char line[256];
    gen_progress_format(line, sizeof line, &s, 100, 200, 1);
    CHECKF(strstr(line, "ETA 5m00s") && strstr(line, "200 rec (40% of input)") && strstr(line, "]  40%"), "%s", line);
    /* the same run with nothing skipped: 400 bytes in 100 s, 600 left = 150 s */
    s.records_skipped = 0;
    gen_progress_format(line, sizeof line, &s, 100, 200, 0);
    CHECKF(strstr(line, "ETA 2m30s") && !strchr(line, '['), "%s", line);
    /* only skipped records so far: no rate yet */
    s.records_skipped = 200;
    gen_progress_format(line, sizeof line, &s, 100, 200, 0);
    CHECKF(strstr(line, "ETA ?"), "%s", line);
    /* stdin: neither count nor size known */
    s.input_bytes_total = -1;
    gen_progress_format(line, sizeof line, &s, 100, 200, 1);
    CHECKF(strstr(line, "200/? rec") && !strchr(line, '['), "%s", line);
}

static const eg_test tests[] = {
    {"compressed_by_bytes", test_compressed_by_bytes},
    {"fits", test_fits},
    {"narrow_keeps_records", test_narrow_keeps_records},
    {"eta_from_own_work", test_eta_from_own_work},
};

int main(int argc, char **argv) {
    return eg_test_main("gen_progress", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
