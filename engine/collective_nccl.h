/* collective_nccl.h — the nccl implementation of the expert-parallel group, used by
 * collective.c only (collective.h describes the exchange). One communicator per rank
 * (ncclCommInitAll over the ranks' GPUs), every pair connected at create; per call all
 * work is enqueued on the rank backend's stream, with one host wait (the counts).
 * Ownership: owns its communicators and device buffers (cudaMalloc'd on each rank's GPU,
 * sized at create); borrows the backends' streams, so it is freed before the backends.
 * eg_ep_nccl_free accepts NULL.
 * Thread safety: rank r's calls only from rank r's thread (its GPU current);
 * eg_ep_nccl_fail from any thread. */
#ifndef EG_COLLECTIVE_NCCL_H
#define EG_COLLECTIVE_NCCL_H

#include "engine/collective.h"

typedef struct eg_ep_nccl eg_ep_nccl;

/* o->backends: CUDA backends on distinct GPUs. EG_ERR_UNSUPPORTED without NCCL. */
eg_status eg_ep_nccl_create(const eg_ep_opts *o, eg_ep_nccl **out, eg_error *err);
void eg_ep_nccl_free(eg_ep_nccl *n);
/* layers: [n_layers] the rank's registered expert arrays. */
eg_status eg_ep_nccl_moe(eg_ep_nccl *n, int rank, int layer, const eg_expert_w *const *layers, eg_backend *be,
                         const eg_moe_args *a, eg_error *err);
eg_status eg_ep_nccl_leave(eg_ep_nccl *n, int rank, const eg_expert_w *const *layers, eg_backend *be, eg_error *err);
/* Abandon every transfer (ncclCommAbort): waiting ranks return EG_ERR_INTERRUPTED. */
void eg_ep_nccl_fail(eg_ep_nccl *n);
void eg_ep_nccl_traffic(const eg_ep_nccl *n, int64_t *remote_pairs, int64_t *bytes);
/* Device bytes per rank for o's buffers (0 without NCCL). */
int64_t eg_ep_nccl_bytes(const eg_ep_opts *o);

#endif
