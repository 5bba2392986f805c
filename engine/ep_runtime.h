/* ep_runtime.h — assembly of an expert-parallel group of engines (collective.h): ep
 * ranks, each an engine over its own share of the slots and KV blocks (data-parallel
 * attention, no cache copy). A rank's pipeline stages run either on the rank's thread and
 * one backend, all stages' calls in one group, or (stage_groups) as stage groups: rank r's
 * stage k on a thread and backend of its own (CUDA: GPU first + k*ep + r, so P*ep GPUs),
 * micro-batches in flight through the stages as in a plain pipeline (engine.h), the
 * hidden rows handed from stage to stage inside the rank by its transport, and the
 * routed exchange of stage k's layers in group k among the ranks' stage-k backends.
 * Per group the calls pair up in order: every rank's stage k runs the same layers per
 * micro-batch, in the order the rank launched them;
 * a rank that launches fewer micro-batches (fewer sequences than micro-batches) paces
 * its group. The routed experts of every MoE layer split E/ep per rank; CPU ranks
 * exchange rows through host memory, CUDA ranks (without stage groups rank r on GPU
 * (bo->device + r) mod the GPU count) over NCCL when each has its own GPU, else by device
 * copies (collective_cuda.h). With o->ep_split EG_EP_SPLIT_FFN (CPU and CUDA ranks)
 * layer l's shared expert (MoE layers) or dense MLP (dense layers) sits on rank l mod ep
 * alone and runs there for every rank's tokens (collective.h, eg_ep_ffn); with
 * EG_EP_SPLIT_ALL the embedding and lm_head are split by vocab rows too; with
 * EG_EP_SPLIT_NONE all of them are replicated on every rank.
 * Requests are pulled under one lock, least-loaded first: a rank with a free slot takes
 * the next request only when no other rank that could take it (not finished, a slot
 * free) holds fewer tokens (prompt + max_new of its open requests); otherwise its engine
 * hears "later" (EG_NEXT_LATER) and asks again next step. done() is called under the
 * same lock. Ranks step in lockstep through the MoE exchange; a rank
 * out of work keeps serving its experts until all are done (with stage groups every
 * stage thread serves its own group: eg_engine_ep_leave). A rank's own failure is
 * reported as "expert-parallel rank R: ..." (on CUDA the rank says which GPU); a failing
 * next() or done() comes back with the caller's message unchanged.
 * Ownership: the runtime owns the ranks' backends, engines and groups; the model is
 * borrowed. eg_ep_runtime_free accepts NULL.
 * Thread safety: one thread calls create/run/free; ranks run on threads of their own. */
#ifndef EG_EP_RUNTIME_H
#define EG_EP_RUNTIME_H

#include "engine/engine.h"

typedef struct eg_ep_runtime eg_ep_runtime;

/* o: the engine options of the whole group (n_slots, kv_blocks and host_kv_bytes are
 * split over the ranks; stage_backends, ep_stages and drafter must be NULL). bo: the
 * backend of one rank (nthreads split over every backend built). stage_groups: with
 * o->n_stages > 1, stage groups (above; CUDA needs n_stages * ep GPUs); 0: every rank's
 * stages on its one thread and backend. drafters: NULL, or [ep] one drafter per rank (borrowed, freed after the
 * runtime): rank r's engine drives drafters[r] on its own thread for its own slots
 * (eg_ep_runtime_rank_slots of them), with o->draft_tokens; verify rows go through the
 * exchange as ordinary rows, so the ranks' calls still pair up layer by layer. */
eg_status eg_ep_runtime_create(const eg_model *m, const eg_backend_opts *bo, const eg_engine_opts *o, int ep,
                               int stage_groups, eg_drafter *const *drafters, eg_ep_runtime **out, eg_error *err);
/* What any expert-parallel group of ep ranks needs of the model and the group's n_slots
 * (ep divides the routed experts, every rank gets a slot): eg_ep_runtime_create checks it,
 * and callers that build per-rank parts first (drafters, a dry run) check it before. */
eg_status eg_ep_runtime_check(const eg_config *c, int ep, int n_slots, eg_error *err);
/* The CUDA device of rank `rank`'s stage `stage` (stage groups: first + stage*ep + rank,
 * mod the GPU count; otherwise the rank's one GPU, eg_ep_runtime_rank_device). */
int eg_ep_runtime_stage_device(int first, int ep, int stage_groups, int rank, int stage);
/* Stage groups built (1: the ranks' stages share one group and thread each). */
int eg_ep_runtime_stages(const eg_ep_runtime *rt);
/* The slots rank `rank` of ep gets of n_slots (the remainder to the first ranks). */
int eg_ep_runtime_rank_slots(int n_slots, int ep, int rank);
void eg_ep_runtime_free(eg_ep_runtime *rt);
eg_engine *eg_ep_runtime_engine(eg_ep_runtime *rt, int rank);
int eg_ep_runtime_ranks(const eg_ep_runtime *rt);
/* Device bytes one CUDA rank gives the exchange's buffers (for the memory plan; 0 in a
 * build without CUDA); vocab_split: with the vocab split's two logit buffers (about
 * 2 * min(max_tokens, 128) * V floats: collective_cuda.c's rounds). */
int64_t eg_ep_runtime_device_bytes(const eg_config *c, int ep, int max_tokens, int vocab_split);
/* Bytes of layer l's weights on the heaviest rank of an ep group (a rank holds its own
 * routed experts only): for the memory plan. ffn_rank >= 0 (--ep-split ffn): on that rank,
 * which holds the layer's shared expert / dense MLP only when it owns the layer (l mod
 * ep); -1: replicated on every rank. cut > 0: one side of the layer split at that expert
 * (plan.h eg_plan_split_layer_bytes' sides: 0 the attention, router and experts [0, cut),
 * 1 the experts [cut, E) and the shared expert), each range shared out evenly over the
 * ranks (collective.h eg_ep_range); cut 0: the whole layer (side ignored). */
int64_t eg_ep_runtime_layer_bytes(const eg_model *m, int layer, int ep, int ffn_rank, int cut, int side);
/* CUDA ranks per GPU when ep ranks go to GPU r mod the GPU count (1 without CUDA). */
int eg_ep_runtime_ranks_per_gpu(int ep);
/* The CUDA device rank `rank` runs on: one GPU per rank where there are enough (nccl),
 * else ranks share them round-robin (cuda-local); `first` is the first device. */
int eg_ep_runtime_rank_device(int first, int rank);
/* The groups' exchange: "local", "nccl" or "cuda-local". */
const char *eg_ep_runtime_exchange(const eg_ep_runtime *rt);
eg_status eg_ep_runtime_run(eg_ep_runtime *rt, eg_next_fn next, eg_done_fn done, void *ctx, eg_error *err);
/* Asks every rank's engine to stop (eg_engine_request_stop: a relaxed store each, safe
 * from a signal handler). Every rank, not the first: a rank that has run out of work
 * only serves the others' exchanges, and a stop left with it would reach nobody. */
void eg_ep_runtime_request_stop(eg_ep_runtime *rt);
/* Stats of the group: counts summed over the ranks; steps, backlog_steps, seconds and
 * max_in_flight the largest of any rank (they step in lockstep), so the means per step
 * are the group's; peak_concurrency and host_kv_peak summed (an upper bound: each rank's
 * peak may fall in another step); the drafter's and verify seconds summed (rank-seconds). */
void eg_ep_runtime_stats(const eg_ep_runtime *rt, eg_engine_stats *s);
/* Rank's own stats (steps it ran with tokens of its own, ...). */
void eg_ep_runtime_rank_stats(const eg_ep_runtime *rt, int rank, eg_engine_stats *s);
/* Bytes of weights rank `rank` holds (its engine's stages): what the split frees shows here. */
int64_t eg_ep_runtime_rank_weight_bytes(const eg_ep_runtime *rt, int rank);
/* ep_split all: tokens embedded by another rank, and logit rows whose columns other
 * ranks computed, so far. */
void eg_ep_runtime_vocab_rows(const eg_ep_runtime *rt, int64_t *embed_rows, int64_t *logit_rows);
/* Tokens whose shared expert / dense MLP ran on another rank so far (ep_split ffn). */
int64_t eg_ep_runtime_ffn_rows(const eg_ep_runtime *rt);
/* Bytes of rows exchanged between ranks so far, and the (token, k) pairs that crossed. */
void eg_ep_runtime_traffic(const eg_ep_runtime *rt, int64_t *pairs, int64_t *bytes);

#endif
