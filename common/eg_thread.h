/* eg_thread.h — a fixed pool of worker threads with a parallel-for, used by the CPU
 * backend and the shard writer's compressors.
 * Ownership: eg_pool_create returns a pool the caller frees with eg_pool_free (NULL ok).
 * Thread safety: eg_pool_for may be called from one thread at a time per pool; the
 * body runs concurrently on disjoint index ranges and must not touch shared state
 * without its own locking. */
#ifndef EG_THREAD_H
#define EG_THREAD_H

#include <pthread.h>

#include "common/eg_common.h"

/* pthread_create with every signal blocked in the new thread: SIGINT/SIGTERM handlers
 * (gen/) then always run on the main thread, which owns the state they touch.
 * Every thread the library starts goes through it. Returns pthread_create's result. */
int eg_thread_start(pthread_t *th, void *(*fn)(void *), void *arg);

typedef struct eg_pool eg_pool;

/* Body: process indices [begin, end). tid is 0..nthreads-1. */
typedef void (*eg_for_fn)(void *ctx, int64_t begin, int64_t end, int tid);

eg_status eg_pool_create(int nthreads, eg_pool **out, eg_error *err);
void eg_pool_free(eg_pool *p);
int eg_pool_size(const eg_pool *p);
/* Split [0, n) into chunks of at least `grain` and run fn over them; returns when all
 * are done. p may be NULL (runs inline). */
void eg_pool_for(eg_pool *p, int64_t n, int64_t grain, eg_for_fn fn, void *ctx);

#endif
