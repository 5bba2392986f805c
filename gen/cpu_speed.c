/* Expected CPU backend speed; see cpu_speed.h. */
#include "gen/cpu_speed.h"

#include <stdio.h>

double gen_cpu_step_seconds(const eg_step_cost *c, int threads) {
    double read = c->weight_bytes / GEN_CPU_READ_BYTES_PER_S;
    double compute = c->flops / (GEN_CPU_FLOPS_PER_THREAD * (threads > 0 ? threads : 1));
    return read > compute ? read : compute;
}

int gen_cpu_speed_warning(const eg_step_cost *c, int B, int threads, int64_t weight_bytes, int64_t mem_available,
                          char *out, size_t cap) {
    if (cap) out[0] = 0;
    double s = gen_cpu_step_seconds(c, threads);
    double tps = s > 0 ? B / s : 0;
    int no_fit = mem_available > 0 && weight_bytes > mem_available;
    if (!(s > 0) || (tps >= GEN_CPU_SLOW_TOKENS_PER_S && !no_fit)) return 0;
    int n = snprintf(out, cap,
                     "warning: the CPU backend is the FP32 reference, far too slow for this model: expect about "
                     "%.3g decode tokens/s at --batch %d on %d thread%s (a step reads %.1f GB of weights and does "
                     "%.3g GFLOP; assumed %.0f GB/s and %.0f GFLOP/s per thread), i.e. %.0f s per 1,000 tokens",
                     tps, B, threads, threads == 1 ? "" : "s", c->weight_bytes / 1e9, c->flops / 1e9,
                     GEN_CPU_READ_BYTES_PER_S / 1e9, GEN_CPU_FLOPS_PER_THREAD / 1e9, tps > 0 ? 1000.0 / tps : 0);
    if (no_fit && n >= 0 && (size_t)n < cap)
        n += snprintf(out + n, cap - (size_t)n, "; and its %.1f GB of weights exceed the %.1f GB of memory available, "
                      "so they are read from disk at every step (slower still)", weight_bytes / 1e9, mem_available / 1e9);
    if (n >= 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, ". Use --backend cuda for real runs.");
    return 1;
}
