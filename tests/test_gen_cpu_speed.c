/* gen/cpu_speed: the expected CPU decode speed follows the plan's step cost (bytes read or
 * FLOPs, whichever bounds), and the warning appears exactly for a model far too large. */
#include <string.h>

#include "gen/cpu_speed.h"
#include "tests/check.h"

static void test_step_seconds(void) {
    /* memory bound: 60 GB read at 6 GB/s = 10 s; 1e12 FLOP on 4 threads at 5 GFLOP/s = 50 s */
    eg_step_cost c = {.weight_bytes = 60e9, .flops = 1e9};
    CHECKF(gen_cpu_step_seconds(&c, 4) > 9.99 && gen_cpu_step_seconds(&c, 4) < 10.01, "%g", gen_cpu_step_seconds(&c, 4));
    c.flops = 1e12;
    CHECKF(gen_cpu_step_seconds(&c, 4) > 49.9 && gen_cpu_step_seconds(&c, 4) < 50.1, "%g", gen_cpu_step_seconds(&c, 4));
}

static void test_warning(void) {
    char w[1024];
    /* a tiny model: 1 MB, 1 MFLOP per step: thousands of tokens/s, no warning */
    eg_step_cost small = {.weight_bytes = 1e6, .flops = 1e6};
    CHECK(!gen_cpu_speed_warning(&small, 16, 2, 1000000, 8000000000LL, w, sizeof w) && !w[0]);
    /* Kimi-like: 100 GB read per step at batch 16: 16 / 16.7 s = ~0.96 tok/s, weights 595 GB > 128 GB */
    eg_step_cost big = {.weight_bytes = 100e9, .flops = 1e12}; /* 16.7 s read > 12.5 s compute */
    CHECK(gen_cpu_speed_warning(&big, 16, 16, 595000000000LL, 128000000000LL, w, sizeof w));
    CHECKF(strstr(w, "expect about 0.96 decode tokens/s at --batch 16 on 16 threads") && strstr(w, "100.0 GB") &&
               strstr(w, "exceed the 128.0 GB") && strstr(w, "--backend cuda"), "%s", w);
    /* fits in memory, still slow: warned, without the memory clause */
    CHECK(gen_cpu_speed_warning(&big, 16, 16, 595000000000LL, 0, w, sizeof w) && !strstr(w, "exceed"));
    /* fast enough but does not fit: warned for the memory */
    CHECK(gen_cpu_speed_warning(&small, 16, 2, 2000000000LL, 1000000000LL, w, sizeof w) && strstr(w, "exceed"));
}

static const eg_test tests[] = {
    {"step_seconds", test_step_seconds},
    {"warning", test_warning},
};

int main(int argc, char **argv) {
    return eg_test_main("gen_cpu_speed", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
