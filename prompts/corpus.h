/* corpus.h — streaming JSONL prompt corpus: files (plain, .gz, .zst, .xz, .bz2 — any
 * compression libarchive recognises, detected from the content), directories (their
 * *.jsonl / *.json / *.ndjson files, optionally compressed, recursively, in sorted path
 * order) and stdin ("-"), read in constant memory (one line at a time), turned into
 * token ids with the Kimi chat template. A pipe (stdin, a FIFO) is read as it arrives:
 * plain text straight from read(), so each line is handed on as soon as it is whole
 * (corpus_next_nowait: without waiting for it); a compressed pipe goes through libarchive.
 *
 * Record styles (one JSON object per line; docs/PROMPTS.md has the details):
 *   {"messages": [{"role","content",...}...]}          OpenAI
 *   {"conversations": [{"role","content"}...]}         SpecForge
 *   {"conversations": [{"from": "human"|"gpt"|"system", "value"}...]}   ShareGPT
 *   {"prompt": "..."}      one user turn
 *   {"text": "..."}        already rendered: encoded as is, no template
 *   {"input_ids": [...]}   already tokenized
 * An "id" (string or integer) is kept; otherwise the id is "FILE:LINE" ("stdin:LINE").
 *
 * Records are numbered 0, 1, 2... over all non-blank lines of all inputs in order (the
 * record index), whether or not they turn out valid, so `--worker I/N` sharding and
 * resuming by index are stable. Blank lines are not records.
 *
 * Bad records are not errors: corpus_next returns them with rec->ok = 0 and a reason
 * (the caller decides: stop naming file:line, or write to a rejects file). Only I/O
 * failures (unreadable file, corrupt compression) and out-of-memory are eg_status errors.
 *
 * Usage (the generate command):
 *     corpus_opts o; corpus_opts_default(&o); o.mode = CORPUS_REGENERATE; ...
 *     corpus_reader *r; corpus_open(paths, n_paths, tok, &o, &r, &err);
 *     corpus_record rec = {0};
 *     bool got;
 *     while (!(st = corpus_next(r, &rec, &got, &err)) && got) {
 *         if (!rec.ok) {   // --on-bad-record: error -> print rec.file:rec.line: rec.reason
 *             corpus_write_reject(rejects, &rec, &err); n_rejected++; continue;   // skip
 *         }
 *         use(rec.index, rec.id, rec.ids.ids, rec.ids.n, rec.loss_mask);
 *     }
 *     corpus_record_free(&rec); corpus_close(r);
 *
 * Ownership: the reader owns file names (rec.file stays valid until corpus_close); the
 * caller owns each corpus_record and frees it with corpus_record_free; corpus_next
 * reuses a record's buffers, so keep several records to hold several at once.
 * Thread safety: one reader is used by one thread at a time. corpus_parse is reentrant
 * (different records, one shared tokenizer). */
#ifndef EG_PROMPTS_CORPUS_H
#define EG_PROMPTS_CORPUS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "common/eg_common.h"
#include "prompts/chat.h"
#include "prompts/tokenizer.h"

typedef enum corpus_mode {
    /* prompt = conversation up to and including its last user message + generation
     * prompt (a trailing assistant answer is dropped, to be regenerated). ids = prompt. */
    CORPUS_REGENERATE = 0,
    /* teacher-forced: the whole conversation, no generation prompt; ids = all tokens and
     * loss_mask = 1 on each assistant span (chat.h). */
    CORPUS_CAPTURE,
    /* the whole conversation + the generation prompt when opts.add_generation_prompt
     * (what `eaglegen tokenize` prints); loss_mask as in CAPTURE. */
    CORPUS_RENDER
} corpus_mode;

typedef enum corpus_format {
    CORPUS_FMT_NONE = 0, /* rejected before the style was known */
    CORPUS_FMT_MESSAGES,      /* {"messages": [...]} */
    CORPUS_FMT_CONVERSATIONS, /* {"conversations": [...]}, SpecForge or ShareGPT */
    CORPUS_FMT_PROMPT,        /* {"prompt": "..."} */
    CORPUS_FMT_TEXT,          /* {"text": "..."} */
    CORPUS_FMT_INPUT_IDS      /* {"input_ids": [...]} */
} corpus_format;

typedef struct corpus_opts {
    corpus_mode mode;
    int thinking;              /* 1 (default): Kimi's thinking mode, "<think>" prefill */
    int add_generation_prompt; /* CORPUS_RENDER only (REGENERATE: always, CAPTURE: never) */
    int text_only;             /* 1 (default): image/video content parts reject the record;
                                  0: they are dropped and counted in rec.n_media_dropped */
    int text_as_user;          /* {"text"} records become one user turn (tokenize --chat) */
    size_t max_prompt_tokens;  /* 0: no limit. Checked on rec.ids.n */
    uint64_t worker, n_workers; /* keep only index % n_workers == worker (n_workers <= 1: all) */
    uint64_t start_index;      /* skip records with index < start_index (resume) */
    size_t max_line_bytes;     /* longer lines are rejected unread; default 256 MiB */
    /* stdin ("-"): a read interrupted by a signal while *stop is set fails instead of
     * waiting on for a slow producer (a Ctrl-C must not hang on an idle pipe); NULL: retry */
    volatile sig_atomic_t *stop;
    /* n_workers > 1: called, in record order, for each other worker's record that names an
     * id of its own (rec.id_given's rule: valid UTF-8 and JSON, a non-empty string or an
     * integer "id"), so a worker meets every record's id as one run over all records
     * would (generate's duplicates). Only those lines are parsed, and not tokenized; an
     * error stops corpus_next with it. NULL: other workers' lines are not looked at. */
    eg_status (*on_other_id)(void *ctx, const char *id, const char *file, uint64_t line, eg_error *err);
    void *on_other_ctx;
    /* generate's --out (NULL: none). Its ledgers and manifest are JSON files too: a
     * directory input that is this directory is refused, and one inside an input
     * directory is skipped, as is any directory holding job.json (another job's). */
    const char *job_dir;
} corpus_opts;

void corpus_opts_default(corpus_opts *o);

typedef struct corpus_scratch corpus_scratch; /* internal, reused between records */

typedef struct corpus_record {
    /* where: */
    const char *file; /* input path as given ("-" for stdin), escaped as eg_utf8_escape
                         does when it is not valid UTF-8; owned by the reader */
    uint64_t line;    /* 1-based line in that file */
    uint64_t index;   /* 0-based record index over all inputs */
    char *id;         /* the record's "id", or "FILE:LINE" */
    int id_given;     /* 1: id is the record's own "id" (it claims that id, good or bad) */
    /* what: */
    int ok;              /* 1: ids (and loss_mask) are valid; 0: rejected, see reason */
    char reason[512];    /* why it was rejected (no file/line prefix) */
    corpus_format format;
    tok_seq ids;         /* [ids.n] token ids: the prompt (REGENERATE) or everything */
    uint8_t *loss_mask;  /* [ids.n] 0/1; CAPTURE and RENDER only, else NULL-or-stale */
    chat_render render;  /* rendered text when a template was applied ({"text"}: the text;
                            {"input_ids"}: empty) — for logs and `tokenize` */
    size_t n_media_dropped; /* image/video parts dropped (text_only = 0) */
    size_t n_messages;   /* messages rendered (after the REGENERATE cut) */
    char *raw;           /* the line as read, NUL terminated (for rejects files); empty
                            for a line over max_line_bytes, which is never held */
    size_t raw_len;
    corpus_scratch *scratch_;
} corpus_record;

void corpus_record_free(corpus_record *rec); /* frees buffers, zeroes; NULL ok */

typedef struct corpus_reader corpus_reader;

/* paths: files, directories or "-" (stdin, at most once). Directories are expanded
 * here, so a missing or empty input fails now. tok and opts are kept (tok borrowed,
 * opts copied). */
eg_status corpus_open(const char *const *paths, size_t n_paths, const tok_tokenizer *tok,
                      const corpus_opts *opts, corpus_reader **out, eg_error *err);
void corpus_close(corpus_reader *r); /* NULL ok */

/* Next record of this worker's shard at or after start_index. *got = false at the end.
 * Fails only on I/O errors / corrupt compressed data (message: "FILE:LINE: ...") and
 * out of memory; bad records come back with rec->ok = 0. */
eg_status corpus_next(corpus_reader *r, corpus_record *rec, bool *got, eg_error *err);

/* As corpus_next, but never waits on a pipe (stdin or a FIFO) read as plain text: when
 * the pipe holds no whole line yet it returns at once, *got = false and *later = true,
 * having consumed nothing, so a caller with other work (sequences in flight) asks again
 * later. A compressed pipe, a regular file and a line longer than 1 MiB still in transit
 * may wait, as in corpus_next. *later = false whenever *got is meaningful. */
eg_status corpus_next_nowait(corpus_reader *r, corpus_record *rec, bool *got, bool *later, eg_error *err);

/* Input read so far, in bytes of the files as stored (compressed bytes for .gz/.zst/.xz/
 * .bz2: what libarchive has consumed), and the sum of the files' sizes; total = -1 when
 * an input is stdin or not a regular file. For progress on inputs whose record count is
 * not known in advance. */
void corpus_input_bytes(const corpus_reader *r, int64_t *done, int64_t *total);

/* Files the reader will read, in order (after directory expansion). */
size_t corpus_n_files(const corpus_reader *r);
const char *corpus_file(const corpus_reader *r, size_t i);
/* Whether input i is a pipe (stdin, a FIFO, <(...): not a regular file when opened), read
 * once and only by this reader: nobody else may read its bytes first. */
bool corpus_is_pipe(const corpus_reader *r, size_t i);
/* Name input i (before the first corpus_next) for its records' default ids and
 * rec->file, while it is still read from its path: a resumed job whose input is now
 * reached by another path keeps the ids of the first run. */
eg_status corpus_name_file(corpus_reader *r, size_t i, const char *name, eg_error *err);

/* Parse and tokenise one JSON line into rec (what corpus_next does per line). Uses
 * rec->file and rec->line for the default id; sets everything else. Returns EG_OK for
 * rejected records too (rec->ok = 0); fails only on out of memory. */
eg_status corpus_parse(const tok_tokenizer *tok, const corpus_opts *opts, const char *line,
                       size_t len, corpus_record *rec, eg_error *err);

const char *corpus_format_name(corpus_format f);

/* Write s[0..n) as a JSON string (quotes included): UTF-8 passed through, control
 * characters escaped, bytes that are not valid UTF-8 written as U+FFFD. */
void corpus_put_json_string(FILE *f, const char *s, size_t n);

/* One rejects-file line for a rejected record:
 *   {"file": ..., "line": N, "index": N, "id": ..., "reason": ..., "record": <raw line as a string>}
 * Returns EG_ERR_IO if the write failed. */
eg_status corpus_write_reject(FILE *f, const corpus_record *rec, eg_error *err);

#endif
