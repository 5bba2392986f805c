/* worker_env.h — which worker of a multi-worker job this process is, from the launcher's
 * environment when --worker is not given.
 *
 * Layouts read (docs/DISTRIBUTED.md):
 *  - Slurm array: SLURM_ARRAY_TASK_ID with SLURM_ARRAY_TASK_MIN, _MAX, _STEP and _COUNT;
 *    task index = (ID - MIN) / STEP, of COUNT. Arrays with an offset (--array=16-31) or a
 *    step (--array=0-30:2) map to 0..COUNT-1; a list that is not one evenly spaced range
 *    (--array=1,2,7) cannot be mapped and is refused.
 *  - Tasks of one launch: torchrun's RANK / WORLD_SIZE, else Slurm's SLURM_PROCID /
 *    SLURM_NTASKS (srun), else Open MPI's OMPI_COMM_WORLD_RANK / _SIZE.
 *  - Both (srun or torchrun inside each array task): worker = index * tasks + rank, of
 *    COUNT * tasks.
 * Anything inconsistent (an ID without COUNT, a rank >= its size, a value that is not a
 * number, a step the IDs do not follow) is an error that names the variables: silently
 * running as worker 0/1 would make every task process the whole corpus.
 * Thread safety: reentrant (the lookup function is the caller's). */
#ifndef EG_GEN_WORKER_ENV_H
#define EG_GEN_WORKER_ENV_H

#include <stddef.h>

/* Looks a variable up: getenv, or a table in tests. NULL = unset. */
typedef const char *(*gen_env_lookup)(const char *name, void *ctx);

/* 1: found, *worker / *n_workers set (*how names the layout, e.g. "SLURM_ARRAY_TASK_ID 5
 * of 16"); 0: no launcher variables, nothing set; -1: inconsistent, msg says why. */
int gen_worker_from_env(gen_env_lookup get, void *ctx, int *worker, int *n_workers, char *how, size_t how_cap,
                        char *msg, size_t msg_cap);

/* The lookup for the real environment (ctx unused). */
const char *gen_env_getenv(const char *name, void *ctx);

#endif
