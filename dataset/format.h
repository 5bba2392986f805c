/* format.h — the eaglegen dataset format, version 2; readers also read version 1 (docs/FORMAT.md is the byte-level
 * specification; this header holds its constants and the codec for one shard's pieces:
 * sample records, the index member and the trailer).
 *
 * A dataset is a directory of shard files plus manifest.json. A shard is a tar archive
 * whose members are sample records ("%08d.egs"), then "index.egi", then "trailer.egt"
 * (64 bytes, always the last member, so it sits at file_size - 1536). The trailer gives
 * the index's offset; the index gives every record's offset and size, so any sample is
 * read with two small reads and one pread of its record.
 *
 * Ownership: encode functions return malloc'd buffers the caller frees; decode fills an
 * eg_ds_sample whose buffers the caller releases with eg_ds_sample_clear.
 * Thread safety: all functions are reentrant; a codec context (eg_ds_codec) belongs to
 * one thread at a time. */
#ifndef EG_DS_FORMAT_H
#define EG_DS_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/eg_common.h"

#define EG_DS_FORMAT_VERSION 2     /* written; readers accept EG_DS_FORMAT_VERSION_MIN.. this */
#define EG_DS_FORMAT_VERSION_MIN 1
#define EG_DS_RECORD_MAGIC "EGS1"      /* 4 bytes, start of every sample record */
#define EG_DS_INDEX_MAGIC "EGIX"       /* 4 bytes, start of the decompressed index */
#define EG_DS_TRAILER_MAGIC "EGTRAIL1" /* 8 bytes, start of the trailer */
#define EG_DS_RECORD_HEADER_SIZE 128
#define EG_DS_TRAILER_SIZE 64
#define EG_DS_INDEX_HEADER_SIZE 32
#define EG_DS_INDEX_ENTRY_SIZE 32 /* fixed part; the id's bytes follow each entry */
/* The trailer's data starts this many bytes before the end of a shard: its 512-byte
 * data block, then the tar end-of-archive marker (two 512-byte zero blocks). */
#define EG_DS_TRAILER_FROM_END 1536
#define EG_DS_INDEX_MEMBER "index.egi"
#define EG_DS_TRAILER_MEMBER "trailer.egt"

/* Record and trailer flags. */
#define EG_DS_MAX_AUX 1024           /* most aux layers a record or index may declare */
#define EG_DS_MAX_HIDDEN (1 << 20)   /* largest hidden size a record or index may declare */
#define EG_DS_MAX_HIST_ID (1 << 24)  /* histogram id bound when the vocab size is unknown */
#define EG_DS_FLAG_BF16_SPLIT 1u /* BF16 tensors stored as [high bytes][low bytes] */
#define EG_DS_FLAG_FINAL_BOTH 2u /* version >= 2: in a record, the final_hidden section holds
                                  * [2][T][H]: post-norm, then pre-norm; in the index and trailer,
                                  * every record of the shard does */

/* Sections of a sample record, in storage order. */
enum { EG_DS_SEC_META, EG_DS_SEC_IDS, EG_DS_SEC_MASK, EG_DS_SEC_AUX, EG_DS_SEC_FINAL, EG_DS_NSEC };

typedef enum eg_ds_dtype { EG_DS_F32 = 0, EG_DS_BF16 = 1 } eg_ds_dtype;
typedef enum eg_ds_finish { EG_DS_FINISH_STOP = 0, EG_DS_FINISH_LENGTH = 1 } eg_ds_finish;

/* One sample. For writing, the caller fills it with borrowed pointers (hidden states in
 * F32 or BF16, see hidden_dtype and aux_layer_major); the writer copies what it needs
 * before shard_writer_add returns. Read functions fill it with owned buffers (hidden
 * states always BF16, aux token-major) released by eg_ds_sample_clear. */
typedef struct eg_ds_sample {
    char *id;            /* unique within a dataset, UTF-8, no NUL */
    char *source_file;   /* prompt file the sample came from ("" if none) */
    int64_t source_line; /* 1-based line in source_file (0 if none) */
    int64_t prompt_len;  /* tokens of prompt (loss mask 0) */
    int64_t gen_len;     /* tokens the target model generated */
    eg_ds_finish finish;
    double temperature, top_p;
    int64_t top_k; /* 0 = off */
    uint64_t seed;
    int64_t T;     /* tokens */
    int n_aux;     /* aux layers */
    int64_t H;     /* hidden size */
    int32_t *input_ids;    /* [T] */
    uint8_t *loss_mask;    /* [T] 0/1 */
    eg_ds_dtype hidden_dtype; /* writing: dtype of the two hidden buffers */
    int aux_layer_major;   /* writing: aux_hidden is [n_aux][T][H] instead of [T][n_aux][H] */
    void *aux_hidden;      /* [T][n_aux][H] bf16 (read) | f32/bf16 (write) */
    void *final_hidden;    /* [T][H] bf16 (read) | f32/bf16 (write): post-norm, or pre-norm in a
                            * dataset whose final source is pre-norm only */
    void *final_pre_hidden;/* [T][H] bf16 (read) | f32/bf16 (write): the pre-norm final state
                            * when the record stores both (final source "both"), else NULL */
} eg_ds_sample;

void eg_ds_sample_clear(eg_ds_sample *s); /* frees owned buffers (read side); NULL ok */
const char *eg_ds_finish_name(eg_ds_finish f);

/* Per-thread compression state. */
typedef struct eg_ds_codec eg_ds_codec;
eg_status eg_ds_codec_new(int level, int bf16_split, eg_ds_codec **out, eg_error *err);
void eg_ds_codec_free(eg_ds_codec *c);

/* Encode a sample into a complete record (header + five zstd frames); with
 * final_pre_hidden set the record stores both final states (EG_DS_FLAG_FINAL_BOTH). *raw_bytes gets
 * the uncompressed size of the four tensors (for compression ratios). */
eg_status eg_ds_record_encode(eg_ds_codec *c, const eg_ds_sample *s, uint8_t **out,
                              size_t *out_len, uint64_t *raw_bytes, eg_error *err);
/* Decode and verify (header CRC, frame checksums, sizes, shapes) a record. With
 * meta_only, only the metadata and shape fields are filled. */
eg_status eg_ds_record_decode(const uint8_t *buf, size_t len, int meta_only, eg_ds_sample *out,
                              eg_error *err);

/* One index entry (per sample in a shard). */
typedef struct eg_ds_index_entry {
    uint64_t offset; /* byte offset of the record in the shard file */
    uint64_t size;   /* record bytes */
    uint32_t T, n_loss;
    eg_ds_finish finish;
    char *id;
} eg_ds_index_entry;

typedef struct eg_ds_index {
    uint32_t n_aux, flags;
    uint64_t H;
    uint64_t n;
    eg_ds_index_entry *e; /* [n] */
} eg_ds_index;
void eg_ds_index_clear(eg_ds_index *ix);

/* Index payload: built raw, then stored as one zstd frame (checksum on). */
eg_status eg_ds_index_encode(const eg_ds_index *ix, int level, uint8_t **out, size_t *out_len,
                             uint64_t *raw_len, eg_error *err);
eg_status eg_ds_index_decode(const uint8_t *buf, size_t len, uint64_t raw_len, eg_ds_index *out,
                             eg_error *err);

typedef struct eg_ds_trailer {
    uint32_t version, flags;
    uint64_t index_offset, index_size, index_raw_size, n_samples, n_tokens;
} eg_ds_trailer;
void eg_ds_trailer_encode(const eg_ds_trailer *t, uint8_t out[EG_DS_TRAILER_SIZE]);
eg_status eg_ds_trailer_decode(const uint8_t in[EG_DS_TRAILER_SIZE], eg_ds_trailer *t,
                               eg_error *err);

/* CRC-32 (IEEE 802.3, as zlib.crc32). */
uint32_t eg_ds_crc32(const void *data, size_t n);

/* Byte-plane split of n BF16 values: dst = [n high bytes][n low bytes], and inverse. */
void eg_ds_bf16_split(const uint16_t *src, size_t n, uint8_t *dst);
void eg_ds_bf16_join(const uint8_t *src, size_t n, uint16_t *dst);

/* Compress one buffer to a single zstd frame (checksum on) — for measurements. */
eg_status eg_ds_zstd(const void *src, size_t n, int level, uint8_t **out, size_t *out_len,
                     eg_error *err);

#endif
