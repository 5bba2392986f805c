/* Emulation stand-in for NCCL (tests/gpu/emu): ranks in one process, point-to-point
 * only (ncclSend/ncclRecv, grouped or not), implemented in emu_nccl.cpp. It blocks
 * where NCCL blocks: the first send/recv between a pair waits on the host for the
 * peer's first call (lazy connection), a transfer is stream work, and a send larger
 * than the pair's buffer waits on its stream for the matching recv. Checked: pairing
 * (count, order), the calling thread's current device, and that nothing hangs (every
 * wait times out with a message). C and C++. */
#ifndef EMU_NCCL_H
#define EMU_NCCL_H
#include <stddef.h>

#include "cuda_runtime_api.h"
#ifdef __cplusplus
extern "C" {
#endif
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
               ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt32 = 2, ncclFloat32 = 7 } ncclDataType_t; /* 4-byte elements only */
typedef struct emu_nccl_comm *ncclComm_t;
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int n, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
/* ncclSuccess, or with EMU_NCCL_ASYNC_ERROR set ncclRemoteError: a failed link, reported
   after the work was enqueued (the callers' waits must notice) */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s);
const char *ncclGetErrorString(ncclResult_t r);
/* emulation only: messages sent through the emulated NCCL so far */
long long emu_nccl_messages(void);
#ifdef __cplusplus
}
#endif
#endif
