/* arrow_ipc.h — a minimal Apache Arrow IPC *streaming format* writer (what Hugging Face
 * `datasets` saves as data-NNNNN-of-NNNNN.arrow), for tables whose columns are int64 or
 * list<int64>, no nulls. Written from the Arrow columnar spec: a Schema message, then
 * RecordBatch messages (flatbuffer metadata built by hand, 8-byte aligned bodies), then
 * the end-of-stream marker; each message is framed by the 0xFFFFFFFF continuation marker
 * and its metadata length.
 *
 * Rows are appended column by column (eg_arrow_put_*), closed with eg_arrow_end_row, and
 * buffered until a batch is full (rows or list values per batch, from the options), so
 * memory is bounded by one batch. The writer writes to a caller-owned FILE*; the caller
 * decides the file name (temporary name + rename). After an error the stream is incomplete:
 * only eg_arrow_free is meaningful.
 * Ownership: the writer owns its batch buffers; eg_arrow_free accepts NULL.
 * Thread safety: one writer per thread. */
#ifndef EG_DS_ARROW_IPC_H
#define EG_DS_ARROW_IPC_H

#include <stdint.h>
#include <stdio.h>

#include "common/eg_common.h"

typedef enum eg_arrow_kind {
    EG_ARROW_INT64 = 0,     /* int64 */
    EG_ARROW_LIST_INT64 = 1 /* list<item: int64> */
} eg_arrow_kind;

typedef struct eg_arrow_column {
    const char *name;
    eg_arrow_kind kind;
} eg_arrow_column;

typedef struct eg_arrow_opts {
    int64_t batch_rows;       /* rows per RecordBatch (>= 1) */
    int64_t batch_list_values; /* a batch is also closed once a list column holds this many values (>= 1) */
    const char *meta_key;     /* schema custom_metadata key/value (NULL: none), e.g. "huggingface" */
    const char *meta_value;
} eg_arrow_opts;

typedef struct eg_arrow_writer eg_arrow_writer;

/* Writes the Schema message to f. */
eg_status eg_arrow_open(FILE *f, const eg_arrow_column *cols, int n_cols, const eg_arrow_opts *o,
                        eg_arrow_writer **out, eg_error *err);
/* One value of column col for the current row (each column exactly once per row). */
eg_status eg_arrow_put_i64(eg_arrow_writer *w, int col, int64_t v, eg_error *err);
eg_status eg_arrow_put_list_i32(eg_arrow_writer *w, int col, const int32_t *v, int64_t n, eg_error *err);
eg_status eg_arrow_put_list_u8(eg_arrow_writer *w, int col, const uint8_t *v, int64_t n, eg_error *err);
eg_status eg_arrow_end_row(eg_arrow_writer *w, eg_error *err);
/* Writes the last batch and the end-of-stream marker (does not close f). */
eg_status eg_arrow_finish(eg_arrow_writer *w, eg_error *err);
int64_t eg_arrow_rows(const eg_arrow_writer *w);
int64_t eg_arrow_bytes(const eg_arrow_writer *w); /* bytes written to f so far */
void eg_arrow_free(eg_arrow_writer *w);           /* NULL ok */

#endif
