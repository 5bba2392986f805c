/* cuda_plan.h — device memory planning for the CUDA backend, and pinned host buffers.
 *
 * The planner splits a GPU's memory: weights, activations for the largest step, the
 * CUDA backend's own scratch, then a KV pool sized from what is left under a
 * `--gpu-mem-fraction` style budget. Call it before creating the backend and uploading
 * weights (weight_bytes/act_bytes are bytes still to be allocated).
 * Pinned host memory makes to_host truly asynchronous (capture copies overlap compute);
 * eg_cuda_host_alloc falls back to plain memory without CUDA, so callers need no #ifdef.
 * Implemented in engine/backend_cuda.c (stubs when built without CUDA).
 * Ownership: eg_cuda_host_alloc's memory is freed with eg_cuda_host_free (NULL ok).
 * Thread safety: all functions are reentrant. */
#ifndef EG_CUDA_PLAN_H
#define EG_CUDA_PLAN_H

#include "engine/backend.h"

typedef struct eg_cuda_mem_plan {
    int64_t total_bytes, free_bytes; /* the device's, when planned */
    double fraction;                 /* of total the process may hold */
    int64_t budget_bytes;            /* total * fraction - (total - free) - headroom */
    int64_t weight_bytes;            /* as passed in */
    int64_t act_bytes;               /* as passed in (the forward pass's own buffers) */
    int64_t scratch_bytes;           /* the CUDA backend's scratch for these options */
    int64_t headroom_bytes;          /* kept back for cuBLAS workspaces and fragmentation */
    int64_t kv_bytes_per_token;      /* n_layers * (C + DR) * 2, plus extra_per_token (a
                                        drafter's paged cache held beside these layers) */
    int64_t extra_per_token;         /* as passed in */
    int64_t kv_blocks;               /* of block_size tokens */
    int64_t kv_tokens;               /* kv_blocks * block_size: the KV capacity */
} eg_cuda_mem_plan;

/* Free and total memory of a device. EG_ERR_UNSUPPORTED without CUDA or a GPU. */
eg_status eg_cuda_mem_info(int device, int64_t *free_bytes, int64_t *total_bytes, eg_error *err);

/* Device bytes eg_backend_cuda_create allocates for its scratch (no device needed,
 * except that the sampler's sort workspace is queried from CUB when one is present). */
int64_t eg_cuda_scratch_bytes(const eg_config *cfg, const eg_backend_opts *o);

/* 0 when EG_CUDA_GRAPHS=0 switches recorded replays off (then the forward pass holds
 * no staging buffer for captured rows; see eg_forward_act_bytes). */
int eg_cuda_graphs_enabled(void);

/* Plan: n_layers = layers held on this device; extra_per_token = bytes per cached token
 * besides those layers' (a drafter's paged cache on this device, which grows with the
 * target's; 0 for none); block_size = cache block tokens.
 * Fails with EG_ERR_NOMEM (message giving the numbers) when not even one block fits. */
eg_status eg_cuda_plan(const eg_config *cfg, const eg_backend_opts *o, double fraction, int64_t weight_bytes,
                       int64_t act_bytes, int n_layers, int64_t extra_per_token, int block_size,
                       eg_cuda_mem_plan *out, eg_error *err);

/* The same plan from given figures of a device's memory (total_bytes, free_bytes) instead of
 * asking the device: eg_cuda_plan is eg_cuda_mem_info + this. Both builds (no GPU needed). */
eg_status eg_cuda_plan_mem(const eg_config *cfg, const eg_backend_opts *o, double fraction, int64_t total_bytes,
                           int64_t free_bytes, int64_t weight_bytes, int64_t act_bytes, int n_layers,
                           int64_t extra_per_token, int block_size, eg_cuda_mem_plan *out, eg_error *err);

/* One line: "GPU 0: 139.8 GiB total, ... KV capacity 1234567 tokens (19290 blocks of 64)". */
void eg_cuda_plan_format(const eg_cuda_mem_plan *p, int device, char *buf, size_t n);

/* The GPU index and cudaStream_t (as void *; either out may be NULL) of a CUDA
 * backend. EG_ERR_UNSUPPORTED when b is not one (e.g. the CPU backend). */
eg_status eg_backend_cuda_device(eg_backend *b, int *device, void **stream);
/* Checks for the backend's host waits (sample, sync, ...): with any added they poll the
 * stream and call every check(ctx, err) about every millisecond while it is busy; a
 * non-zero status ends the wait with that error. For each party whose work on the stream
 * may never finish (a failed link): the NCCL pipeline transport's hand-overs, an
 * expert-parallel group's exchange; a stage of a stage group carries both. The caller
 * owns the hook (check and ctx set, next the backend's) and keeps it until it removes
 * it; remove accepts a hook that was never added. Add and remove while no op runs on the
 * backend; checks run on the thread that waits. EG_ERR_UNSUPPORTED when b is not a CUDA
 * backend (remove: nothing). */
typedef eg_status (*eg_cuda_wait_check)(void *ctx, eg_error *err);
typedef struct eg_cuda_wait_hook {
    eg_cuda_wait_check check;
    void *ctx;
    struct eg_cuda_wait_hook *next; /* the backend's list */
} eg_cuda_wait_hook;
eg_status eg_backend_cuda_add_wait_check(eg_backend *b, eg_cuda_wait_hook *h);
void eg_backend_cuda_remove_wait_check(eg_backend *b, eg_cuda_wait_hook *h);
/* Sampled rows the top-M path could not settle, sorted over the vocabulary (tests, tuning). */
int64_t eg_cuda_sample_sorted_rows(eg_backend *b);

/* Measure a device's roofline (benchmarks, never tests): copy bandwidth of a
 * device-to-device copy of 1 GiB, counted as bytes read + written per second, and the
 * BF16 GEMM rate of cuBLAS (8192^3, FP32 accumulation) in FLOP/s. Takes ~1 s. */
eg_status eg_cuda_measure(int device, double *copy_bytes_per_s, double *bf16_flops_per_s, eg_error *err);

/* The expert-parallel exchange's index kernels (kernels/ep.cu, engine/collective_cuda.c)
 * on a CUDA backend's stream: group the T*K pairs of ids/weights by destination rank
 * (the owner of each expert in the call's range [lo, lo + ne), R ranks) into
 * counts/sendtok/meta/tk2pair as egk_ep_pack documents, and
 * y[t] += back[tk2pair[t*K+k]] in ascending expert id (ids [T][K]; pairs with tk2pair -1 skipped). EG_ERR_UNSUPPORTED on another backend. */
eg_status eg_cuda_ep_pack(eg_backend *b, const int32_t *ids, const float *weights, int T, int K, int R, int lo,
                          int ne, int rank, int layer, int left, int32_t *counts, int32_t *sendtok, int32_t *meta,
                          int32_t *tk2pair, eg_error *err);
eg_status eg_cuda_ep_combine(eg_backend *b, const float *back, const int32_t *tk2pair, const int32_t *ids, int T,
                             int K, int H, float *y,
                             eg_error *err);
/* out[i] = x[idx[i]] (rows of D floats) for indices that came over a link: x holds n_src
 * rows, and a row whose index is outside them is zeros. After a failed link an aborted
 * receive leaves its buffer as it was, and the kernels queued behind it still run: a
 * trusted gather would read wherever those bytes point. EG_ERR_UNSUPPORTED on another
 * backend. */
eg_status eg_cuda_gather_received(eg_backend *b, const float *x, int64_t n_src, const int32_t *idx, int n, int D,
                                  float *out, eg_error *err);

/* Page-locked host memory (plain memory when CUDA is absent or pinning fails). */
void *eg_cuda_host_alloc(size_t bytes, eg_error *err);
void eg_cuda_host_free(void *p);

#endif
