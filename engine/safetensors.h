/* safetensors.h — read and write the safetensors format (8-byte little-endian header
 * length N, N bytes of JSON, then the tensor data).
 *
 * Reader: eg_st_open mmaps a file read-only and parses the header with jansson. Every
 * entry is validated strictly before it is exposed: known dtype, non-negative shape
 * with no overflow, data_offsets inside the file, byte size == elements * dtype size,
 * no two tensors overlapping, `__metadata__` a string->string object. A corrupt,
 * truncated or hostile file gives an eg_error naming the file (and tensor), never a
 * crash. Lookup by name is a hash (O(1)), so a 200k-tensor checkpoint loads fast.
 * Tensor data pointers point into the mapping; they are NOT guaranteed aligned unless
 * the writer aligned them (ours and Hugging Face's do): read with memcpy or check
 * eg_st_aligned().
 *
 * Writer: collect named tensors (borrowed pointer, copied buffer, or a fill callback
 * that streams the bytes in chunks, so a multi-GB shard never sits in RAM), plus
 * string metadata, then eg_st_writer_write lays them out like the reference library
 * (sorted by dtype size, largest first, so every tensor is aligned to its element
 * size; contiguous offsets; header padded with spaces to 8 bytes) and writes
 * PATH.tmp.<pid>, fsyncs, renames over PATH and fsyncs the directory.
 *
 * Ownership: eg_st_file owns its mapping and parsed names; pointers returned by the
 * reader stay valid until eg_st_close (NULL ok). eg_st_writer copies names/metadata;
 * borrowed data must stay alive until eg_st_writer_write returns.
 * Thread safety: a parsed eg_st_file is read-only, any number of threads may read it.
 * A writer is used by one thread. */
#ifndef EG_SAFETENSORS_H
#define EG_SAFETENSORS_H

#include "common/eg_common.h"

typedef enum eg_st_dtype {
    EG_ST_F64 = 0,
    EG_ST_F32,
    EG_ST_F16,
    EG_ST_BF16,
    EG_ST_I64,
    EG_ST_I32,
    EG_ST_I16,
    EG_ST_I8,
    EG_ST_U8,
    EG_ST_BOOL,
    EG_ST_F8_E4M3,
    EG_ST_NDTYPES
} eg_st_dtype;

#define EG_ST_MAX_DIMS 8

typedef struct eg_st_tensor {
    const char *name;               /* full name as stored (NUL-terminated) */
    eg_st_dtype dtype;
    int ndim;
    int64_t shape[EG_ST_MAX_DIMS];  /* [ndim] */
    int64_t nelem;                  /* product of shape (1 for a scalar) */
    uint64_t offset;                /* absolute byte offset of the data in the file */
    uint64_t nbytes;
    const void *data;               /* into the mapping (may be unaligned, see above) */
} eg_st_tensor;

typedef struct eg_st_file eg_st_file;

/* dtype names as the format spells them ("BF16", "F8_E4M3", ...). */
const char *eg_st_dtype_name(eg_st_dtype t);
size_t eg_st_dtype_size(eg_st_dtype t);
/* EG_OK and *out set, or EG_ERR_UNSUPPORTED naming the dtype. */
eg_status eg_st_dtype_parse(const char *name, eg_st_dtype *out, eg_error *err);

/* mmap and parse PATH. */
eg_status eg_st_open(const char *path, eg_st_file **out, eg_error *err);
/* Parse a file image already in memory (tests, fuzzing). buf is borrowed and must
 * outlive the handle; `what` names it in error messages. */
eg_status eg_st_open_memory(const void *buf, size_t len, const char *what, eg_st_file **out,
                            eg_error *err);
void eg_st_close(eg_st_file *f);

const char *eg_st_path(const eg_st_file *f);  /* path or `what` given at open */
uint64_t eg_st_file_size(const eg_st_file *f);
int eg_st_count(const eg_st_file *f);
/* Tensors in header order. i in [0, count). */
const eg_st_tensor *eg_st_at(const eg_st_file *f, int i);
/* NULL when absent. */
const eg_st_tensor *eg_st_find(const eg_st_file *f, const char *name);
/* `__metadata__` value for key, NULL when absent. */
const char *eg_st_meta(const eg_st_file *f, const char *key);
int eg_st_meta_count(const eg_st_file *f);
void eg_st_meta_at(const eg_st_file *f, int i, const char **key, const char **value);
/* madvise() the whole mapping (MADV_RANDOM, MADV_NORMAL, MADV_WILLNEED, ...); no-op for
 * memory images. eg_st_open leaves MADV_NORMAL. */
void eg_st_advise(const eg_st_file *f, int advice);
/* 1 when t->data is aligned to its element size. */
int eg_st_aligned(const eg_st_tensor *t);

/* Look up `name` and check dtype and shape in one go (shape NULL: any). Messages name
 * the tensor and the file. */
eg_status eg_st_get(const eg_st_file *f, const char *name, eg_st_dtype dtype, int ndim,
                    const int64_t *shape, const eg_st_tensor **out, eg_error *err);

/* ---- writer ---- */

/* Produce `n` bytes of a tensor starting at byte `offset` of that tensor into buf.
 * Called in order, offset 0 first, with chunks of at most 16 MiB; offset and n are
 * whole elements (the layout keeps every tensor aligned to its element size). */
typedef eg_status (*eg_st_fill_fn)(void *ctx, uint64_t offset, void *buf, size_t n, eg_error *err);

typedef struct eg_st_writer eg_st_writer;

eg_status eg_st_writer_new(eg_st_writer **out, eg_error *err);
void eg_st_writer_free(eg_st_writer *w);
/* Borrow `data` (nelem * dtype size bytes); it must stay valid until write returns. */
eg_status eg_st_writer_add(eg_st_writer *w, const char *name, eg_st_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, eg_error *err);
/* Same, but the bytes are copied now. */
eg_status eg_st_writer_add_copy(eg_st_writer *w, const char *name, eg_st_dtype dtype, int ndim,
                                const int64_t *shape, const void *data, eg_error *err);
/* Stream the bytes at write time through fill(ctx, ...). fill == NULL: the tensor is
 * all zero bytes, written as a hole (sparse file) where the filesystem allows. */
eg_status eg_st_writer_add_fill(eg_st_writer *w, const char *name, eg_st_dtype dtype, int ndim,
                                const int64_t *shape, eg_st_fill_fn fill, void *ctx,
                                eg_error *err);
/* String metadata (`__metadata__`); a repeated key replaces the value. */
eg_status eg_st_writer_meta(eg_st_writer *w, const char *key, const char *value, eg_error *err);
/* Bytes the file will take (header + data). */
uint64_t eg_st_writer_size(const eg_st_writer *w);
/* Write atomically to path (tmp + fsync + rename + fsync dir). */
eg_status eg_st_writer_write(eg_st_writer *w, const char *path, eg_error *err);

#endif
