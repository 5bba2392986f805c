/* job.h — the job directory of `eaglegen generate`: what makes a run resumable.
 *
 *  - job.json (job.w{I}of{N}.json for worker I of N): the parameters that determine
 *    the output and the fingerprints of model, tokenizer and inputs. A rerun finds it
 *    and resumes; gen/resume.h decides which differences are accepted and which are
 *    refused (gen_job_check below is the older all-or-nothing check, no longer used by
 *    generate).
 *  - rejects.jsonl (rejects.w{I}of{N}.jsonl): an append-only ledger of records that
 *    produced no sample — bad records skipped under --on-bad-record=skip, truncated
 *    samples left out by --drop-truncated, duplicate ids — one JSON line each with the
 *    record index, file, line, id, outcome and reason, a hash of the record's line (and
 *    the raw line for bad ones). A resumed run skips the indices listed there whose line
 *    is unchanged, so nothing is counted twice; an entry whose record's line changed is
 *    cleared (a "cleared" line) and the record read again. Samples themselves are
 *    tracked by the shard writer's committed ids.
 * Ownership: gen_ledger is freed with gen_ledger_close (NULL ok).
 * Thread safety: one thread. */
#ifndef EG_GEN_JOB_H
#define EG_GEN_JOB_H

#include <jansson.h>
#include <stdio.h>

#include "common/eg_common.h"

/* File name for base ("job", "rejects") and extension, with the worker tag when
 * n_workers > 1: "job.w0of4.json". */
void gen_job_filename(char *out, size_t n, const char *base, const char *ext, int worker, int n_workers);
/* 1 when name is exactly a worker's job file, job.wIofN.json (N > 1), giving I and N. */
int gen_job_file_worker(const char *name, int *worker, int *n_workers);

/* Input fingerprint: size plus SHA-256 of the first and last MiB (fast on big corpora;
 * catches edits, truncation and appends). */
eg_status gen_file_fingerprint(const char *path, json_t **out, eg_error *err);

/* The weights of a checkpoint directory by content: [{"path": NAME, "size",
 * "sha256_head_tail"}] of each *.safetensors file in name order (gen_file_fingerprint:
 * a fine-tune or a requantisation of the same shape changes the bytes, where the config
 * and the total size stay). *out is the caller's reference; no file is an error. */
eg_status gen_weights_fingerprint(const char *dir, json_t **out, eg_error *err);

/* job.json's "version": what a resume compares first. */
#define GEN_JOB_VERSION 1
/* job.json's fingerprints.inputs: each input file's fingerprint in order ("-", stdin,
 * as {"path": "-"}). *out is the caller's reference. */
struct corpus_reader;
eg_status gen_job_inputs(const struct corpus_reader *r, json_t **out, eg_error *err);

/* Parse DIR/NAME into *have (the caller's reference); *have = NULL when the file does not
 * exist. Unreadable or damaged files fail, naming the path (and the line). */
eg_status gen_job_read(const char *dir, const char *name, json_t **have, eg_error *err);
/* Compare `want` with DIR/NAME if it exists. *existed = 1 when it did. On a mismatch,
 * fails with EG_ERR_CONFIG and a message listing each differing key (old -> new).
 * Not compared: params.on_bad_record (it changes no sample) and the spelling of an
 * input path when both spellings resolve (realpath) to the same file. *changed = 1 when
 * the file exists, matches, but differs in those (the caller should rewrite it). */
eg_status gen_job_check(const char *dir, const char *name, json_t *want, int *existed, int *changed, eg_error *err);
/* Write want to DIR/NAME atomically. */
eg_status gen_job_write(const char *dir, const char *name, json_t *want, eg_error *err);

typedef enum { GEN_OUT_REJECTED = 0, GEN_OUT_DROPPED, GEN_OUT_DUPLICATE, GEN_NOUTCOMES } gen_outcome;

typedef struct gen_ledger gen_ledger;

/* The hash a ledger line keeps of its record: the first 64 bits of the SHA-256 of the
 * line as read (corpus_record raw, raw_len), written as 16 hex digits ("line_hash"). It
 * is what tells a resumed run that a logged record was edited, whatever the input's
 * fingerprint (size, first and last MiB) saw. */
uint64_t gen_line_hash(const char *raw, size_t n);

/* Open (creating) DIR/NAME, load the entries already there. A torn last line (crash
 * mid-write) is ignored and truncated away. */
eg_status gen_ledger_open(const char *dir, const char *name, gen_ledger **out, eg_error *err);
void gen_ledger_close(gen_ledger *l);
/* 1 when index has a live entry (logged, not cleared since). */
int gen_ledger_has(const gen_ledger *l, uint64_t index);
/* What the ledger says of record index whose line now hashes to line_hash: NONE (no live
 * entry: new work), SAME (handled by an earlier run: skip it; also an entry from before
 * line hashes were logged, which cannot be checked), CHANGED (the line differs from the
 * one logged: gen_ledger_clear it and read the record again). */
enum { GEN_LEDGER_NONE = 0, GEN_LEDGER_SAME, GEN_LEDGER_CHANGED };
int gen_ledger_check(const gen_ledger *l, uint64_t index, uint64_t line_hash);
/* Live entries per outcome. */
int64_t gen_ledger_count(const gen_ledger *l, gen_outcome o);
/* Append one line (fflush'd; fsync'd by gen_ledger_sync). raw may be NULL. */
eg_status gen_ledger_add(gen_ledger *l, uint64_t index, const char *file, uint64_t line, const char *id,
                         gen_outcome o, const char *reason, uint64_t line_hash, const char *raw, eg_error *err);
/* Retire index's live entry (its record changed): appends a "cleared" line (with the new
 * line_hash) and takes the entry out of the counts; a reopen applies the line the same
 * way. No live entry: nothing is written. */
eg_status gen_ledger_clear(gen_ledger *l, uint64_t index, const char *file, uint64_t line, const char *id,
                           uint64_t line_hash, eg_error *err);
eg_status gen_ledger_sync(gen_ledger *l, eg_error *err);

#endif
