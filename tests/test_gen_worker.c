/* gen/worker_env: every launcher layout maps to a worker I/N covering 0..N-1 exactly once,
 * and every inconsistent layout is refused naming the variables. */
#include <string.h>

#include "gen/worker_env.h"
#include "tests/check.h"

/* A fake environment: "NAME=VALUE" strings, NULL-terminated. */
static const char *lookup(const char *name, void *ctx) {
    const char *const *env = ctx;
    size_t n = strlen(name);
    for (; *env; env++)
        if (!strncmp(*env, name, n) && (*env)[n] == '=') return *env + n + 1;
    return NULL;
}

static int map(const char *const *env, int *i, int *n, char *msg) {
    char how[256];
    *i = *n = -7;
    return gen_worker_from_env(lookup, (void *)env, i, n, how, sizeof how, msg, 512);
}

/* Every task of an array MIN..MAX:STEP maps to a distinct index in [0, COUNT). */
static void check_array(long mn, long mx, long step) {
    long count = (mx - mn) / step + 1;
    char *seen = calloc((size_t)count, 1);
    for (long id = mn; id <= mx; id += step) {
        char v[5][64];
        snprintf(v[0], 64, "SLURM_ARRAY_TASK_ID=%ld", id);
        snprintf(v[1], 64, "SLURM_ARRAY_TASK_MIN=%ld", mn);
        snprintf(v[2], 64, "SLURM_ARRAY_TASK_MAX=%ld", mx);
        snprintf(v[3], 64, "SLURM_ARRAY_TASK_STEP=%ld", step);
        snprintf(v[4], 64, "SLURM_ARRAY_TASK_COUNT=%ld", count);
        const char *env[] = {v[0], v[1], v[2], v[3], v[4], NULL};
        int i, n;
        char msg[512] = "";
        int r = map(env, &i, &n, msg);
        CHECKF(r == 1, "array %ld-%ld:%ld id %ld: %d %s", mn, mx, step, id, r, msg);
        if (r != 1) continue;
        CHECKF(n == count && i >= 0 && i < n && !seen[i], "array %ld-%ld:%ld id %ld -> %d/%d", mn, mx, step, id, i, n);
        if (i >= 0 && i < count) seen[i] = 1;
    }
    for (long k = 0; k < count; k++) CHECKF(seen[k], "array %ld-%ld:%ld: index %ld not covered", mn, mx, step, k);
    free(seen);
}

static void test_arrays(void) {
    check_array(0, 15, 1);
    check_array(16, 31, 1); /* an offset: ids >= count */
    check_array(0, 30, 2);  /* a step */
    check_array(5, 47, 7);  /* both */
    check_array(3, 3, 1);   /* one task */
}

static void test_tasks(void) {
    int i, n;
    char msg[512];
    const char *torch[] = {"RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=3", NULL};
    CHECK(map(torch, &i, &n, msg) == 1 && i == 3 && n == 8);
    const char *srun[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", NULL};
    CHECK(map(srun, &i, &n, msg) == 1 && i == 2 && n == 4);
    const char *mpi[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", NULL};
    CHECK(map(mpi, &i, &n, msg) == 1 && i == 1 && n == 2);
    /* torchrun under srun: torchrun's ranks already count every process */
    const char *both[] = {"RANK=9", "WORLD_SIZE=16", "SLURM_PROCID=1", "SLURM_NTASKS=2", NULL};
    CHECK(map(both, &i, &n, msg) == 1 && i == 9 && n == 16);
    /* srun with 2 tasks inside array task 5 of 16..31: 2 * (21 - 16) + 1 of 32 */
    const char *arr[] = {"SLURM_ARRAY_TASK_ID=21", "SLURM_ARRAY_TASK_MIN=16", "SLURM_ARRAY_TASK_MAX=31",
                         "SLURM_ARRAY_TASK_STEP=1", "SLURM_ARRAY_TASK_COUNT=16", "SLURM_PROCID=1", "SLURM_NTASKS=2", NULL};
    CHECK(map(arr, &i, &n, msg) == 1 && i == 11 && n == 32);
    const char *none[] = {"HOME=/root", NULL};
    CHECK(map(none, &i, &n, msg) == 0 && i == -7 && n == -7);
}

/* Refused, with a message naming the variable(s) */
static void expect_bad(const char *const *env, const char *want) {
    int i, n;
    char msg[512] = "";
    int r = map(env, &i, &n, msg);
    CHECKF(r == -1 && strstr(msg, want), "want -1 naming %s, got %d: %s", want, r, msg);
}

static void test_inconsistent(void) {
    const char *a[] = {"SLURM_ARRAY_TASK_ID=3", NULL};
    expect_bad(a, "SLURM_ARRAY_TASK_COUNT");
    const char *b[] = {"SLURM_ARRAY_TASK_ID=7", "SLURM_ARRAY_TASK_MIN=1", "SLURM_ARRAY_TASK_MAX=7",
                       "SLURM_ARRAY_TASK_STEP=1", "SLURM_ARRAY_TASK_COUNT=3", NULL}; /* --array=1,2,7 */
    expect_bad(b, "--worker");
    const char *c[] = {"SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_MIN=0", "SLURM_ARRAY_TASK_STEP=2",
                       "SLURM_ARRAY_TASK_COUNT=4", NULL}; /* 3 is not on the step */
    expect_bad(c, "SLURM_ARRAY_TASK_STEP");
    const char *d[] = {"SLURM_PROCID=4", "SLURM_NTASKS=4", NULL};
    expect_bad(d, "SLURM_NTASKS=4");
    const char *e[] = {"RANK=1", NULL};
    expect_bad(e, "WORLD_SIZE");
    const char *f[] = {"SLURM_ARRAY_TASK_ID=x1", "SLURM_ARRAY_TASK_COUNT=2", NULL};
    expect_bad(f, "SLURM_ARRAY_TASK_ID='x1'");
    const char *g[] = {"SLURM_ARRAY_TASK_COUNT=2", NULL};
    expect_bad(g, "SLURM_ARRAY_TASK_ID");
    const char *h[] = {"SLURM_ARRAY_TASK_ID=40", "SLURM_ARRAY_TASK_MIN=16", "SLURM_ARRAY_TASK_MAX=31",
                       "SLURM_ARRAY_TASK_COUNT=16", NULL};
    expect_bad(h, "SLURM_ARRAY_TASK_ID=40");
}

static const eg_test tests[] = {
    {"arrays", test_arrays},
    {"tasks", test_tasks},
    {"inconsistent", test_inconsistent},
};

int main(int argc, char **argv) {
    return eg_test_main("gen_worker", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
