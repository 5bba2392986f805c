/* Pipeline transports: the factory and the local (host-staged) transport; the NCCL
 * one is in transport_nccl.c. See transport.h. */
#include "engine/transport.h"

#include <stdlib.h>

#include "engine/cuda_plan.h"

typedef struct local_impl {
    eg_backend **be;   /* [n_stages] */
    int n_stages, n_mb;
    size_t max_floats;
    float **buf;       /* [n_mb][n_stages-1] page-locked staging, max_floats each */
} local_impl;

static local_impl *local_of(eg_transport *t) { return (local_impl *)t->impl; }

static eg_status link_check(local_impl *L, int k, int mb, size_t n, eg_error *err) {
    if (k < 0 || k >= L->n_stages - 1 || mb < 0 || mb >= L->n_mb || n > L->max_floats)
        return eg_fail(err, EG_ERR_INVALID, "local transport: link %d, micro-batch %d, %zu floats out of range "
                       "(%d links, %d micro-batches, %zu floats)", k, mb, n, L->n_stages - 1, L->n_mb, L->max_floats);
    return EG_OK;
}

static eg_status local_send(eg_transport *t, int k, int mb, const float *src, size_t n, eg_error *err) {
    local_impl *L = local_of(t);
    eg_status st = link_check(L, k, mb, n, err);
    if (st) return st;
    eg_backend *b = L->be[k];
    float *dst = L->buf[(size_t)mb * (size_t)(L->n_stages - 1) + (size_t)k];
    /* the wait also completes the step's capture copies before the micro-batch moves on */
    if ((st = b->ops->to_host(b, dst, src, sizeof(float) * n, err)) || (st = b->ops->sync(b, err)))
        return eg_wrap(err, "local transport: stage %d sending", k);
    return EG_OK;
}

static eg_status local_recv(eg_transport *t, int k, int mb, float *dst, size_t n, eg_error *err) {
    local_impl *L = local_of(t);
    eg_status st = link_check(L, k, mb, n, err);
    if (st) return st;
    eg_backend *b = L->be[k + 1];
    const float *src = L->buf[(size_t)mb * (size_t)(L->n_stages - 1) + (size_t)k];
    if ((st = b->ops->to_device(b, dst, src, sizeof(float) * n, err)))
        return eg_wrap(err, "local transport: stage %d receiving", k + 1);
    return EG_OK;
}

static void local_destroy(eg_transport *t) {
    local_impl *L = local_of(t);
    if (L) {
        if (L->buf)
            for (int i = 0; i < L->n_mb * (L->n_stages - 1); i++) eg_cuda_host_free(L->buf[i]);
        free(L->buf);
        free(L->be);
        free(L);
    }
    free(t);
}

static const eg_transport_ops local_ops = {"local", local_send, local_recv, local_destroy};

static eg_status opts_check(const eg_transport_opts *o, eg_error *err) {
    if (!o->stages || o->n_stages < 2 || o->n_micro_batches < 1 || !o->max_floats)
        return eg_fail(err, EG_ERR_INVALID, "transport: need >= 2 stages, >= 1 micro-batch and a row size");
    for (int k = 0; k < o->n_stages; k++)
        if (!o->stages[k]) return eg_fail(err, EG_ERR_INVALID, "transport: stage %d has no backend", k);
    return EG_OK;
}

eg_status eg_transport_local_create(const eg_transport_opts *o, eg_transport **out, eg_error *err) {
    *out = NULL;
    eg_status st = opts_check(o, err);
    if (st) return st;
    eg_transport *t = eg_calloc(1, sizeof *t, err);
    local_impl *L = t ? eg_calloc(1, sizeof *L, err) : NULL;
    if (!L) { free(t); return EG_ERR_NOMEM; }
    t->ops = &local_ops;
    t->impl = L;
    L->n_stages = o->n_stages;
    L->n_mb = o->n_micro_batches;
    L->max_floats = o->max_floats;
    size_t n_buf = (size_t)L->n_mb * (size_t)(L->n_stages - 1);
    L->be = eg_calloc((size_t)o->n_stages, sizeof *L->be, err);
    L->buf = eg_calloc(n_buf, sizeof *L->buf, err);
    if (!L->be || !L->buf) { local_destroy(t); return EG_ERR_NOMEM; }
    for (int k = 0; k < o->n_stages; k++) L->be[k] = o->stages[k];
    for (size_t i = 0; i < n_buf; i++)
        if (!(L->buf[i] = eg_cuda_host_alloc(sizeof(float) * o->max_floats, err))) {
            local_destroy(t);
            return eg_wrap(err, "local transport: staging buffer %zu of %zu", i + 1, n_buf);
        }
    *out = t;
    return EG_OK;
}

eg_status eg_transport_create(const eg_transport_opts *o, eg_transport **out, eg_error *err) {
    *out = NULL;
    const char *name = o->name && *o->name ? o->name : "auto";
    if (!strcmp(name, "local")) return eg_transport_local_create(o, out, err);
    if (!strcmp(name, "nccl")) return eg_transport_nccl_create(o, out, err);
    if (strcmp(name, "auto"))
        return eg_fail(err, EG_ERR_INVALID, "unknown transport '%s' (expected local, nccl or auto)", name);
    eg_status st = opts_check(o, err);
    if (st) return st;
    /* auto: NCCL only where it applies; anything else is local, silently */
    int all_distinct_gpus = eg_transport_have_nccl();
    for (int k = 0; k < o->n_stages && all_distinct_gpus; k++) {
        int dk;
        if (eg_backend_cuda_device(o->stages[k], &dk, NULL)) { all_distinct_gpus = 0; break; }
        for (int j = 0; j < k; j++) {
            int dj;
            if (!eg_backend_cuda_device(o->stages[j], &dj, NULL) && dj == dk) all_distinct_gpus = 0;
        }
    }
    if (all_distinct_gpus) return eg_transport_nccl_create(o, out, err);
    return eg_transport_local_create(o, out, err);
}

void eg_transport_free(eg_transport *t) {
    if (t) t->ops->destroy(t);
}

const char *eg_transport_name(const eg_transport *t) { return t ? t->ops->name : "none"; }
