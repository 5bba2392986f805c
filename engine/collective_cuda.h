/* collective_cuda.h — the expert-parallel group for CUDA ranks, used by collective.c (and
 * by ep_runtime.c for the device count)
 * (collective.h describes the exchange). Two ways to move the rows:
 *   nccl        one communicator per rank (ncclCommInitAll over the ranks' GPUs), every
 *               pair connected at create, grouped ncclSend/ncclRecv on each rank's stream;
 *               needs NCCL and one GPU per rank.
 *   cuda-local  ranks sharing a GPU, or a build without NCCL: each rank copies its
 *               peers' segments with cudaMemcpyAsync on its own stream between two host
 *               barriers (the counts, rows and contributions each: the sender's stream
 *               synchronised before, the reader's after). Correct everywhere, slower.
 * Per call the work is enqueued on the rank backend's stream, with host waits only for
 * the counts (nccl: one per call).
 * Ownership: owns its communicators and device buffers (cudaMalloc'd on each rank's GPU,
 * sized at create); borrows the backends' streams, so it is freed before the backends.
 * eg_ep_cuda_free accepts NULL.
 * Thread safety: rank r's calls only from rank r's thread (its GPU current);
 * eg_ep_cuda_fail from any thread. */
#ifndef EG_COLLECTIVE_CUDA_H
#define EG_COLLECTIVE_CUDA_H

#include "engine/collective.h"

typedef struct eg_ep_cuda eg_ep_cuda;

/* o->backends: CUDA backends. nccl when built with NCCL and every rank has its own GPU,
 * else cuda-local. EG_ERR_UNSUPPORTED without CUDA. */
eg_status eg_ep_cuda_create(const eg_ep_opts *o, eg_ep_cuda **out, eg_error *err);
void eg_ep_cuda_free(eg_ep_cuda *n);
/* "nccl" or "cuda-local". */
const char *eg_ep_cuda_kind(const eg_ep_cuda *n);
/* layers: [2 n_layers] the rank's registered expert arrays per call id (collective.h). */
eg_status eg_ep_cuda_moe(eg_ep_cuda *n, int rank, int layer, const eg_expert_w *const *layers, eg_backend *be,
                         const eg_moe_args *a, eg_error *err);
/* ffn_split: y [T][H] = (accumulate 0) or += (1) layer `layer`'s shared expert / dense MLP
 * of x [T][H], computed by the layer's owner (layer mod ranks); ffn_w [n_layers][3] the
 * owners' registered gate, up, down (this rank's entries used when it owns the layer). */
eg_status eg_ep_cuda_ffn(eg_ep_cuda *n, int rank, int layer, const eg_weight *const *ffn_w, eg_backend *be,
                         const float *x, int T, float *y, int accumulate, eg_error *err);
/* Serve the others (routed pairs, and the shared / dense layers this rank owns) until
 * every rank has left. ffn_w as for eg_ep_cuda_ffn, or NULL without ffn_split. */
eg_status eg_ep_cuda_leave(eg_ep_cuda *n, int rank, const eg_expert_w *const *layers, const eg_weight *const *ffn_w,
                           eg_backend *be, eg_error *err);
/* vocab_split: rank's embedding and lm_head slices ([v1-v0][H], collective.h's ranges;
 * either NULL where its stages hold none). Borrowed. */
void eg_ep_cuda_register_vocab(eg_ep_cuda *n, int rank, const eg_weight *embed, const eg_weight *lm_head);
/* vocab_split: x [T][H] = the embedding rows of tokens [T] (device; T >= 1), each row
 * from its id's owner: the ids to the host (the call's first host wait), grouped by owner,
 * to the owners, the rows back. */
eg_status eg_ep_cuda_embed(eg_ep_cuda *n, int rank, eg_backend *be, const int32_t *tokens, int T, float *x,
                           eg_error *err);
/* vocab_split: logits [n_rows][V] = rows [n_rows][H] lm_head^T (n_rows may be 0), each
 * rank's columns computed by it: the rows to every rank, each slice's logits back. */
eg_status eg_ep_cuda_logits(eg_ep_cuda *n, int rank, eg_backend *be, const float *rows, int n_rows, float *logits,
                            eg_error *err);
/* Tokens embedded by another rank, and logit rows other ranks computed columns of, so far. */
void eg_ep_cuda_vocab_rows(const eg_ep_cuda *n, int64_t *embed_rows, int64_t *logit_rows);
/* Rows whose shared expert / dense MLP an owner computed for another rank so far. */
int64_t eg_ep_cuda_ffn_rows(const eg_ep_cuda *n);
/* Abandon every transfer (nccl: ncclCommAbort; both: barriers released): waiting ranks
 * return EG_ERR_INTERRUPTED. */
void eg_ep_cuda_fail(eg_ep_cuda *n);
void eg_ep_cuda_traffic(const eg_ep_cuda *n, int64_t *remote_pairs, int64_t *bytes);
/* Device bytes per rank for o's buffers (the same figure in a build without CUDA). */
int64_t eg_ep_cuda_bytes(const eg_ep_opts *o);
/* CUDA devices visible (0 without CUDA): the ep runtime puts rank r on GPU r mod this. */
int eg_ep_cuda_devices(void);

#endif
