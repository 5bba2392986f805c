/* Worker index from launcher variables; see worker_env.h. */
#include "gen/worker_env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

const char *gen_env_getenv(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

/* 1: parsed a whole decimal integer in [0, 2^30]; 0: not set; -1: set but not one. */
static int num(gen_env_lookup get, void *ctx, const char *name, long *out, char *msg, size_t cap) {
    const char *v = get(name, ctx);
    if (!v) return 0;
    char *e;
    errno = 0;
    long x = strtol(v, &e, 10);
    if (errno || e == v || *e || x < 0 || x > 1L << 30) {
        snprintf(msg, cap, "%s='%s' is not a non-negative integer", name, v);
        return -1;
    }
    *out = x;
    return 1;
}

/* The task layout inside one launch: torchrun, srun, mpirun, first that is set. */
static int task_layout(gen_env_lookup get, void *ctx, long *rank, long *size, const char **rname, char *msg,
                       size_t cap) {
    static const char *const pairs[][2] = {
        {"RANK", "WORLD_SIZE"}, {"SLURM_PROCID", "SLURM_NTASKS"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        int a = num(get, ctx, pairs[p][0], rank, msg, cap);
        if (a < 0) return -1;
        int b = num(get, ctx, pairs[p][1], size, msg, cap);
        if (b < 0) return -1;
        if (!a && !b) continue;
        if (!a || !b) {
            snprintf(msg, cap, "%s is set but %s is not", a ? pairs[p][0] : pairs[p][1], a ? pairs[p][1] : pairs[p][0]);
            return -1;
        }
        if (*size < 1 || *rank >= *size) {
            snprintf(msg, cap, "%s=%ld is not below %s=%ld", pairs[p][0], *rank, pairs[p][1], *size);
            return -1;
        }
        *rname = pairs[p][0];
        return 1;
    }
    return 0;
}

int gen_worker_from_env(gen_env_lookup get, void *ctx, int *worker, int *n_workers, char *how, size_t how_cap,
                        char *msg, size_t msg_cap) {
    long id = 0, mn = 0, mx = 0, step = 1, count = 0, rank = 0, size = 1;
    const char *rname = NULL;
    int has_id = num(get, ctx, "SLURM_ARRAY_TASK_ID", &id, msg, msg_cap);
    if (has_id < 0) return -1;
    int has_min = num(get, ctx, "SLURM_ARRAY_TASK_MIN", &mn, msg, msg_cap);
    int has_max = has_min < 0 ? -1 : num(get, ctx, "SLURM_ARRAY_TASK_MAX", &mx, msg, msg_cap);
    int has_step = has_max < 0 ? -1 : num(get, ctx, "SLURM_ARRAY_TASK_STEP", &step, msg, msg_cap);
    int has_count = has_step < 0 ? -1 : num(get, ctx, "SLURM_ARRAY_TASK_COUNT", &count, msg, msg_cap);
    if (has_count < 0) return -1;
    long index = 0;
    if (has_id) {
        if (!has_count) {
            snprintf(msg, msg_cap, "SLURM_ARRAY_TASK_ID=%ld is set but SLURM_ARRAY_TASK_COUNT is not", id);
            return -1;
        }
        if (!has_min) mn = 0;
        if (!has_step) step = 1;
        if (count < 1 || step < 1) {
            snprintf(msg, msg_cap, "SLURM_ARRAY_TASK_COUNT=%ld, SLURM_ARRAY_TASK_STEP=%ld: expected both >= 1", count, step);
            return -1;
        }
        if (!has_max) mx = mn + (count - 1) * step;
        if (id < mn || id > mx || (id - mn) % step || (mx - mn) % step || (mx - mn) / step + 1 != count) {
            snprintf(msg, msg_cap,
                     "SLURM_ARRAY_TASK_ID=%ld with SLURM_ARRAY_TASK_MIN=%ld, SLURM_ARRAY_TASK_MAX=%ld, "
                     "SLURM_ARRAY_TASK_STEP=%ld, SLURM_ARRAY_TASK_COUNT=%ld: not one evenly spaced range "
                     "(e.g. --array=1,2,7); give each task --worker I/N instead",
                     id, mn, mx, step, count);
            return -1;
        }
        index = (id - mn) / step;
    } else if (has_count || has_min || has_max || has_step) {
        snprintf(msg, msg_cap, "SLURM_ARRAY_TASK_%s is set but SLURM_ARRAY_TASK_ID is not",
                 has_count ? "COUNT" : has_min ? "MIN" : has_max ? "MAX" : "STEP");
        return -1;
    }
    int tasks = task_layout(get, ctx, &rank, &size, &rname, msg, msg_cap);
    if (tasks < 0) return -1;
    if (!has_id && !tasks) return 0;
    long n = (has_id ? count : 1) * size, i = (has_id ? index : 0) * size + rank;
    if (n > 1L << 20) {
        snprintf(msg, msg_cap, "%ld workers (array tasks x ranks) is more than 1048576", n);
        return -1;
    }
    *worker = (int)i;
    *n_workers = (int)n;
    if (has_id && tasks)
        snprintf(how, how_cap, "SLURM_ARRAY_TASK_ID %ld (task %ld of %ld) x %s %ld of %ld", id, index, count, rname,
                 rank, size);
    else if (has_id)
        snprintf(how, how_cap, "SLURM_ARRAY_TASK_ID %ld (task %ld of %ld)", id, index, count);
    else
        snprintf(how, how_cap, "%s %ld of %ld", rname, rank, size);
    return 1;
}
