/* transport.h — how pipeline stages hand the residual stream to the next stage.
 *
 * A transport joins the backends of n_stages pipeline stages in a chain. Link k carries
 * one micro-batch's hidden rows ([T][H] FP32, T*H floats) from stage k's backend memory
 * to stage k+1's; it is the only traffic between stages (sampled tokens go back through
 * the host, which needs them anyway to build the next step).
 *
 *   local  staged through page-locked host memory: stage k copies out and waits for its
 *          backend, stage k+1 copies in. Works for any pair of backends (CPU, the same
 *          GPU, different GPUs without NCCL); one staging buffer per micro-batch per link.
 *   nccl   ncclSend/ncclRecv on each stage's own CUDA stream, one rank per GPU
 *          (ncclCommInitAll over the stages' devices, every link connected by one
 *          grouped send/recv at creation); the host never waits, so stage k moves on
 *          to its next micro-batch while the rows travel. Needs CUDA backends on
 *          distinct GPUs and a build with NCCL (EG_HAVE_NCCL).
 *
 * Ordering contract (what makes the nccl transport need no host synchronisation): a
 * send is enqueued after every op of stage k's step, so when the rows arrive every
 * earlier op of that step (its capture copies included) has finished; a recv is
 * enqueued before stage k+1's first op of the step. Sends and recvs on link k happen
 * in the same order (micro-batches pass every stage in FIFO order), so they pair up.
 * send returns without waiting for the peer, whatever n is: the owner may hand the
 * micro-batch to stage k+1 (which then posts the recv) after send returns. NCCL blocks
 * the host only while it connects a pair, which eg_transport_create does for every
 * link; the transfer itself is stream work that may wait on the GPU for the recv
 * (ncclSend "is blocking for the GPU"), so a stage's host waits only where it
 * synchronises its own stream, and every such wait ends once the later stages' threads
 * post their recvs, which needs nothing from the waiting stage (no cycle). A link that
 * fails would leave such a wait forever, so those waits poll (transport_nccl.c: a wait
 * check on each stage backend reads the communicator's asynchronous error and `failed`).
 * Ownership: eg_transport_create borrows the backends (they outlive the transport);
 * eg_transport_free accepts NULL.
 * Thread safety: link k's send is called only by stage k's thread and its recv only by
 * stage k+1's thread; different links may be used concurrently. */
#ifndef EG_TRANSPORT_H
#define EG_TRANSPORT_H

#include "engine/backend.h"

typedef struct eg_transport eg_transport;

typedef struct eg_transport_ops {
    const char *name;
    /* Stage k's thread: hand n floats at src (stage k's backend memory) of micro-batch
     * mb to stage k+1. On return src may be overwritten by ops enqueued later on stage
     * k's backend. */
    eg_status (*send)(eg_transport *t, int k, int mb, const float *src, size_t n, eg_error *err);
    /* Stage k+1's thread: receive micro-batch mb's n floats of link k into dst (stage
     * k+1's backend memory); ops enqueued later on stage k+1's backend see them. */
    eg_status (*recv)(eg_transport *t, int k, int mb, float *dst, size_t n, eg_error *err);
    void (*destroy)(eg_transport *t);
} eg_transport_ops;

struct eg_transport {
    const eg_transport_ops *ops;
    void *impl;
    /* Set by the owner (atomically) when a run ended in an error: the stages' host waits
     * stop (NCCL), and destroy abandons transfers still in flight (ncclCommAbort)
     * instead of waiting for them, since a peer that failed may never post its half. */
    int failed;
};

typedef struct eg_transport_opts {
    const char *name;          /* "local", "nccl", or NULL/"auto": nccl when every stage
                                  is a CUDA backend on its own GPU and NCCL is built in,
                                  else local */
    eg_backend *const *stages; /* [n_stages] the backend of each stage (may repeat) */
    int n_stages;              /* >= 2 */
    int n_micro_batches;       /* staging buffers of the local transport */
    size_t max_floats;         /* largest n of any send (max_tokens * H) */
} eg_transport_opts;

eg_status eg_transport_create(const eg_transport_opts *o, eg_transport **out, eg_error *err);
void eg_transport_free(eg_transport *t);
/* "local" or "nccl". */
const char *eg_transport_name(const eg_transport *t);

eg_status eg_transport_local_create(const eg_transport_opts *o, eg_transport **out, eg_error *err);
/* EG_ERR_UNSUPPORTED when built without NCCL, when a stage is not a CUDA backend, or
 * when two stages share a GPU (NCCL needs one rank per device). */
eg_status eg_transport_nccl_create(const eg_transport_opts *o, eg_transport **out, eg_error *err);
/* 1 when this build has the NCCL transport. */
int eg_transport_have_nccl(void);

#endif
