/* spec_q.h — tests' helpers for eg_spec_q (engine/spec.h), the sparse proposer
 * distributions: eg_spec_q_alloc as a value (zeroed on failure: the tests' CHECKs see
 * NULL rows), one to expand rows to the dense [k][V] arrays the tests compare, one to pack
 * a dense [k][V] into rows (its positive entries, ascending). Ownership: tq_free
 * (eg_spec_q_free) frees what tq_alloc gave. Single-threaded, as the tests. */
#ifndef EG_TEST_SPEC_Q_H
#define EG_TEST_SPEC_Q_H

#include <stdlib.h>
#include <string.h>

#include "engine/spec.h"

static inline eg_spec_q tq_alloc(int k, int cap) {
    eg_spec_q q;
    eg_error err = {0};
    (void)eg_spec_q_alloc(&q, k, cap, &err);
    return q;
}
static inline void tq_free(eg_spec_q *q) { eg_spec_q_free(q); }
/* out [k][V] = rows 0..k-1 of q, 0 where a row holds no id. */
static inline void tq_dense(const eg_spec_q *q, int k, int V, double *out) {
    memset(out, 0, sizeof(double) * (size_t)k * (size_t)V);
    for (int i = 0; i < k; i++)
        for (int j = 0; j < q->n[i]; j++)
            out[(size_t)i * (size_t)V + (size_t)q->id[(size_t)i * (size_t)q->cap + (size_t)j]] =
                q->p[(size_t)i * (size_t)q->cap + (size_t)j];
}
/* Rows 0..k-1 of q from dense [k][V] (q->cap >= V). */
static inline void tq_pack(const double *dense, int k, int V, eg_spec_q *q) {
    for (int i = 0; i < k; i++) {
        int n = 0;
        for (int v = 0; v < V; v++)
            if (dense[(size_t)i * (size_t)V + (size_t)v] > 0) {
                q->id[(size_t)i * (size_t)q->cap + (size_t)n] = v;
                q->p[(size_t)i * (size_t)q->cap + (size_t)n++] = dense[(size_t)i * (size_t)V + (size_t)v];
            }
        q->n[i] = n;
    }
}

#endif
