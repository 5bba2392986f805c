/* collective.h — the expert-parallel group: routed experts of every MoE layer split
 * over ep ranks, attention data-parallel (each rank runs its own sequences and cache).
 *
 * Per MoE layer every rank calls eg_ep_moe with its own tokens' normed rows, router ids
 * and weights. Rank r owns experts [r*E/ep, (r+1)*E/ep). Each (token, k) pair is computed
 * by the rank owning its expert, as w * expert(x) in FP32, and the contribution comes back
 * to the token's owner, which adds the K contributions in ascending expert id into y
 * (eg_moe_order: exactly the order of the unsplit moe op, so the bits match the unsplit
 * run). Bytes moved per
 * token and MoE layer: H*4 out to each remote owning rank, H*4 back per remote (t,k).
 * A layer split between two stages (opts.layer_cuts[l] = c > 0: forward.h tail_cut and
 * head_cut) runs as two routed calls of its own ids: l over experts [0, c) and n_layers + l
 * (eg_ep_head_id) over [c, E); each call's range is split evenly over the ranks
 * (eg_ep_range), so every rank holds its share of both halves, and the token's owner adds
 * the call's contributions in ascending expert id to y, which holds the fold so far: the
 * two calls are one left fold, the bits of the unsplit sum.
 * A rank whose engine finished calls eg_ep_leave: it keeps serving its experts for the
 * others until every rank has left. Calls pair up in order (the i-th call of every rank
 * is the same layer), which holds when every rank runs the same layers per step.
 *
 * Implementations, chosen by the ranks' backends:
 *   local  ranks are threads of one process, every backend a CPU backend (rows are read
 *          from the peers' host memory; two barriers per call).
 *   nccl   every backend a CUDA backend on its own GPU, ranks on threads of one process
 *          (collective_nccl.c): per call the pairs are grouped by owner on the device
 *          (kernels/ep.cu), counts per peer travel first (one grouped ncclSend/ncclRecv,
 *          then the one host wait of the call, for the sizes), then each token's FP32 row
 *          once to every rank owning one of its experts with the pairs' ids and weights,
 *          and the FP32 contributions back, all on the rank's stream; device buffers sized
 *          at create for the worst case (every pair of the group on one rank), nothing
 *          allocated per call. Needs a build with NCCL (EG_HAVE_NCCL).
 * A rank's own experts for a leaving rank's service come from eg_ep_register (each
 * rank's forwards register their MoE layers' expert arrays at creation).
 *
 * With ffn_split (generate --ep-split ffn; every implementation) the shared expert
 * of every MoE layer and the dense MLP of every dense layer is owned whole by one rank,
 * layer l by rank l mod ep, and only that rank holds its weights (registered with
 * eg_ep_register_ffn). Per layer every rank calls eg_ep_ffn with its tokens' normed rows:
 * the owner runs the backend's swiglu_mlp over each rank's rows (accumulate 0, rank by
 * rank, each rank's rows as one call of their own count), and each rank writes (dense:
 * y = out) or adds (MoE: y += out with the add op, after the routed sum, as forward.c's
 * unsplit path adds the finished shared-expert rows) its rows' outputs: the bits of the
 * unsplit op (on CPU its rows do not depend on the call's other rows; on CUDA the call
 * has the unsplit call's row count, so cuBLAS picks the same algorithm). The nccl and
 * cuda-local exchanges send the rows to the owner and back through their buffers
 * (collective_cuda.c). Bytes moved
 * per token and layer: H*4 to the owner and H*4 back, for a token not on the owner.
 * With vocab_split (generate --ep-split all; every implementation) rank r holds rows
 * [r*V/R, (r+1)*V/R) of the embedding and of lm_head (eg_ep_vocab_range; registered with
 * eg_ep_register_vocab). eg_ep_embed: every rank posts its token ids and the owner of each
 * id writes the embedding row (the backend's embed op on its slice: a copy, exact) into
 * the token's rank's rows. eg_ep_logits: every rank posts its gathered final rows, each
 * rank runs the backend's linear over every rank's rows with its lm_head slice (one call
 * per rank's rows, that rank's row count: the unsplit call's) and writes those columns of
 * the rank's [n][V] logits; each logit is the same dot product as unsplit, so the bits
 * match. Bytes moved per token: the embedding row (H*4) when another rank owns its id;
 * per logit row H*4 out to each other rank and its V/R logits (4 bytes each) back. The
 * nccl and cuda-local exchanges (collective_cuda.c) move the same: ids to their owners and
 * rows back, rows to every rank and each slice's logits back; on CUDA the lm_head GEMM has
 * V/R rows, so cuBLAS may reduce it in another order than the unsplit V-row GEMM.
 * Ownership: the group owns its scratch and borrows the backends; eg_ep_group_free
 * accepts NULL.
 * Thread safety: rank r's calls come only from rank r's thread; eg_ep_fail from any. */
#ifndef EG_COLLECTIVE_H
#define EG_COLLECTIVE_H

#include "engine/backend.h"

typedef struct eg_ep_group eg_ep_group;

typedef struct eg_ep_opts {
    int n_ranks;     /* ep >= 1, divides n_experts */
    int n_experts;   /* E */
    int topk;        /* K */
    int hidden;      /* H */
    int max_tokens;  /* T bound of any rank's call (and of each rank backend's ops) */
    int n_layers;    /* L: layers are numbered 0..L-1 in eg_ep_moe and eg_ep_register (the
                        second halves of split layers L..2L-1: eg_ep_head_id) */
    const int *layer_cuts; /* [n_layers] or NULL: > 0 splits that MoE layer's routed experts
                              at the cut, 0 < cut < E (copied at create) */
    int ffn_split;   /* 1: shared expert / dense MLP of layer l owned by rank l mod n_ranks
                        (eg_ep_ffn); 0: replicated, eg_ep_ffn unused */
    int vocab_split; /* 1: embedding and lm_head split over the ranks by vocab rows
                        (eg_ep_embed, eg_ep_logits) */
    int vocab;       /* V, with vocab_split */
    eg_backend *const *backends; /* [n_ranks] each rank's backend (borrowed): all CPU =
                                    local, all CUDA on distinct GPUs = nccl */
} eg_ep_opts;

eg_status eg_ep_group_create(const eg_ep_opts *o, eg_ep_group **out, eg_error *err);
void eg_ep_group_free(eg_ep_group *g);
/* The routed experts [*lo, *hi) call id `id` runs (0 <= id < 2 n_layers): a whole layer's
 * [0, E), a split layer's [0, cut) for id l and [cut, E) for its head id. */
void eg_ep_call_range(const eg_ep_opts *o, int id, int *lo, int *hi);
/* The experts [*e0, *e1) rank owns of call id `id`: its even share of the call's range
 * (lo + floor(rank n / R) up to lo + floor((rank + 1) n / R), n = hi - lo; may be empty).
 * eg_ep_share: the same from the group's options. */
void eg_ep_range(const eg_ep_group *g, int rank, int id, int *e0, int *e1);
void eg_ep_share(const eg_ep_opts *o, int rank, int id, int *e0, int *e1);
/* The call id of split layer `layer`'s second half (experts [cut, E)): n_layers + layer. */
int eg_ep_head_id(const eg_ep_group *g, int layer);
/* The expert layer `layer` is split at (layer_cuts), 0 for a whole layer. */
int eg_ep_layer_cut(const eg_ep_group *g, int layer);
/* Rank's thread: a->y += the routed experts' contributions over the group for call id
 * `layer` (a layer, or eg_ep_head_id for a split layer's second half), those of the call's
 * range only (a->e0/e1 ignored), one by one in ascending expert id onto what y holds. be
 * is the rank's backend; a's arrays are in its memory. */
eg_status eg_ep_moe(eg_ep_group *g, int rank, int layer, eg_backend *be, const eg_moe_args *a, eg_error *err);
/* Rank's own expert array of call id `layer` ([E], only [e0, e1) of eg_ep_range used;
 * borrowed, must outlive the group's calls). Before the first eg_ep_moe. */
void eg_ep_register(eg_ep_group *g, int rank, int layer, const eg_expert_w *experts);
/* ffn_split: the rank owning layer `layer`'s shared expert / dense MLP; -1 without it
 * (every rank holds its own copy). */
int eg_ep_ffn_owner(const eg_ep_group *g, int layer);
/* The owner's weights of layer `layer`'s shared expert (MoE) or dense MLP (borrowed,
 * must outlive the group's calls). Before the first eg_ep_ffn. */
void eg_ep_register_ffn(eg_ep_group *g, int rank, int layer, const eg_weight *gate, const eg_weight *up,
                        const eg_weight *down);
/* Rank's thread, ffn_split: y [T][H] = (accumulate 0) or += (accumulate 1) the SwiGLU MLP
 * of layer `layer` on x [T][H] (T >= 1), computed by the layer's owner. Every rank calls
 * it for every layer, in the same order (interleaved with eg_ep_moe as the layers run);
 * accumulate must agree between the ranks. be is the rank's backend. */
eg_status eg_ep_ffn(eg_ep_group *g, int rank, int layer, eg_backend *be, const float *x, int T, float *y,
                    int accumulate, eg_error *err);
/* 1 when the group splits the embedding and lm_head by vocab rows (NULL: 0). */
int eg_ep_vocab_split(const eg_ep_group *g);
/* vocab_split: the vocab rows [*v0, *v1) rank holds of the embedding and lm_head. */
void eg_ep_vocab_range(const eg_ep_group *g, int rank, int64_t *v0, int64_t *v1);
/* vocab_split: rank's slices ([v1-v0][H], eg_ep_vocab_range; either may be NULL on a rank
 * whose stages hold no embedding / no lm_head). Borrowed, must outlive the group's calls.
 * Before the first eg_ep_embed / eg_ep_logits. */
void eg_ep_register_vocab(eg_ep_group *g, int rank, const eg_weight *embed, const eg_weight *lm_head);
/* Rank's thread, vocab_split: x [T][H] = the embedding rows of tokens [T] (ids in [0, V),
 * checked by the caller; T >= 1). Every rank calls it at the same point of its step. */
eg_status eg_ep_embed(eg_ep_group *g, int rank, eg_backend *be, const int32_t *tokens, int T, float *x,
                      eg_error *err);
/* Rank's thread, vocab_split: logits [n][V] = rows [n][H] times lm_head^T, every column
 * computed by its owner. n may be 0 (the rank has no logit rows this step); every rank
 * calls it at the same point of its step. */
eg_status eg_ep_logits(eg_ep_group *g, int rank, eg_backend *be, const float *rows, int n, float *logits,
                       eg_error *err);
/* Tokens embedded by another rank, and logit rows other ranks computed columns of, so far. */
void eg_ep_vocab_rows(const eg_ep_group *g, int64_t *embed_rows, int64_t *logit_rows);
/* Rows (tokens) whose shared expert / dense MLP ran on another rank so far. */
int64_t eg_ep_ffn_rows(const eg_ep_group *g);
/* "local" or "nccl". */
const char *eg_ep_kind(const eg_ep_group *g);
/* Device bytes one rank's backend gives the CUDA exchange's buffers (in either build): for
 * the memory plan. */
int64_t eg_ep_device_bytes(const eg_ep_opts *o);
/* Rank's thread, after its last eg_ep_moe: serve the other ranks until all have left. */
eg_status eg_ep_leave(eg_ep_group *g, int rank, eg_backend *be, eg_error *err);
/* A rank failed: every waiting and later call returns EG_ERR_INTERRUPTED-like failure. */
void eg_ep_fail(eg_ep_group *g);
/* Rows (T*K pairs) that crossed ranks so far, and bytes moved (both directions; with
 * ffn_split the shared-expert / dense-MLP rows too). */
void eg_ep_traffic(const eg_ep_group *g, int64_t *remote_pairs, int64_t *bytes);

#endif
