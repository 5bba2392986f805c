/* torchsave.h — write a dict of tensors as torch.save writes it (PyTorch's zip format),
 * without torch, so trainers load eaglegen's export with an unmodified torch.load,
 * weights_only=True included.
 *
 * The file is a zip archive of stored (uncompressed) members under the prefix
 * "archive/": data.pkl (pickle protocol 2 of a dict name -> tensor, each tensor
 * torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()) with
 * its storage a persistent id ("storage", torch.<Type>Storage, "<k>", "cpu", numel)),
 * byteorder ("little"), data/<k> (the raw little-endian elements of tensor k, each
 * member's data aligned to 64 bytes as torch aligns it), version ("3\n"). The dict keeps
 * the order given. No zip64: a file of 4 GiB or more (or a member that large) is refused.
 * The file is written as DIR/NAME.tmp, fsynced and renamed, so a crash leaves no partial
 * NAME (the directory itself is fsynced by the caller, once per batch of files).
 * Ownership: tensor data is borrowed for the duration of the call.
 * Thread safety: no shared state. */
#ifndef EG_DS_TORCHSAVE_H
#define EG_DS_TORCHSAVE_H

#include <stddef.h>
#include <stdint.h>

#include "common/eg_common.h"

typedef enum eg_pt_dtype { EG_PT_I64 = 0, EG_PT_I32, EG_PT_U8, EG_PT_BOOL, EG_PT_BF16, EG_PT_F32 } eg_pt_dtype;

#define EG_PT_MAX_DIMS 8

typedef struct eg_pt_tensor {
    const char *name;              /* dict key (UTF-8) */
    eg_pt_dtype dtype;
    int ndim;                      /* 0..EG_PT_MAX_DIMS */
    int64_t shape[EG_PT_MAX_DIMS]; /* [ndim] */
    const void *data;              /* prod(shape) elements, row-major, little-endian (bool: one byte 0/1) */
} eg_pt_tensor;

size_t eg_pt_dtype_size(eg_pt_dtype t);
const char *eg_pt_storage_name(eg_pt_dtype t); /* "LongStorage", "BFloat16Storage", ... */

/* Write DIR/NAME (via DIR/NAME.tmp). *bytes (may be NULL) gets the file size. */
eg_status eg_torch_save(const char *dir, const char *name, const eg_pt_tensor *t, int n, uint64_t *bytes,
                        eg_error *err);

#endif
