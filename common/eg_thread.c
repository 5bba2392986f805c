/* A small fork-join pool; see eg_thread.h. Workers sleep on a condition variable
 * between jobs and take chunks from an atomic counter, so uneven chunks balance. */
#include "common/eg_thread.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

struct eg_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    uint64_t gen;      /* bumped per job */
    int running;       /* workers still in the current job */
    int quit;
    eg_for_fn fn;
    void *ctx;
    int64_t total, chunk;
    atomic_llong next;
};

typedef struct { eg_pool *p; int tid; } worker_arg;

static void run_chunks(eg_pool *p, int tid) {
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->total) break;
        int64_t e = b + p->chunk < p->total ? b + p->chunk : p->total;
        p->fn(p->ctx, b, e, tid);
    }
}

static void *worker(void *a) {
    worker_arg *wa = a;
    eg_pool *p = wa->p;
    int tid = wa->tid;
    free(wa);
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->cv_job, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, tid);
        pthread_mutex_lock(&p->mu);
        if (--p->running == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

eg_status eg_pool_create(int nthreads, eg_pool **out, eg_error *err) {
    *out = NULL;
    if (nthreads < 1) nthreads = 1;
    eg_pool *p = eg_calloc(1, sizeof *p, err);
    if (!p) return EG_ERR_NOMEM;
    p->n = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_job, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->th = eg_calloc((size_t)nthreads, sizeof *p->th, err);
    if (!p->th) { free(p); return EG_ERR_NOMEM; }
    /* thread 0 is the caller; start n-1 workers */
    for (int i = 1; i < nthreads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || eg_thread_start(&p->th[i], worker, wa ? (wa->p = p, wa->tid = i, wa) : NULL)) {
            free(wa);
            p->n = i;
            eg_pool_free(p);
            return eg_fail(err, EG_ERR_NOMEM, "cannot start worker thread %d", i);
        }
    }
    *out = p;
    return EG_OK;
}

void eg_pool_free(eg_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_job);
    pthread_cond_destroy(&p->cv_done);
    free(p->th);
    free(p);
}

int eg_pool_size(const eg_pool *p) { return p ? p->n : 1; }

void eg_pool_for(eg_pool *p, int64_t n, int64_t grain, eg_for_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n == 1 || n <= grain) { fn(ctx, 0, n, 0); return; }
    int64_t chunk = (n + (int64_t)p->n * 4 - 1) / ((int64_t)p->n * 4);
    if (chunk < grain) chunk = grain;
    pthread_mutex_lock(&p->mu);
    p->fn = fn; p->ctx = ctx; p->total = n; p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->running = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->running > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int eg_thread_start(pthread_t *th, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the new thread inherits this mask */
    int rc = pthread_create(th, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
