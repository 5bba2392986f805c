/* cpu_speed.h — what the CPU backend can be expected to do on a model, from the step cost
 * estimates of engine/plan.h, so that `generate --backend cpu` on a model far too large
 * for it says so (with the expected speed) before hours go by.
 *
 * The CPU backend is the FP32 reference: its decode step is bounded by reading the
 * weights it touches and by its FLOPs. The rates below were measured with `eaglegen bench
 * --preset kimi-k2.5 --layers 2` on the development machine (2 threads: 6.2 GB/s of
 * weights read at batch 1, 0.01 TFLOP/s at batch 8, i.e. about 5 GFLOP/s per thread);
 * they are an assumption stated in the warning, not a measurement of this machine.
 * Thread safety: pure functions. */
#ifndef EG_GEN_CPU_SPEED_H
#define EG_GEN_CPU_SPEED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/plan.h"

#define GEN_CPU_READ_BYTES_PER_S 6e9     /* weights read per second, whole process */
#define GEN_CPU_FLOPS_PER_THREAD 5e9     /* FP32 reference ops */
#define GEN_CPU_SLOW_TOKENS_PER_S 20.0   /* below this, generate warns */

/* Expected seconds of one decode step of cost c on `threads` threads (weights in RAM). */
double gen_cpu_step_seconds(const eg_step_cost *c, int threads);

/* The warning for a decode step of cost c at batch B, or "" (returns 0) when the
 * expected speed is at least GEN_CPU_SLOW_TOKENS_PER_S and the weights fit in
 * mem_available (0 = unknown). Returns 1 when out holds a warning. */
int gen_cpu_speed_warning(const eg_step_cost *c, int B, int threads, int64_t weight_bytes, int64_t mem_available,
                          char *out, size_t cap);

#endif
