/* resume.h — what a rerun of `eaglegen generate` may change in an existing job, and
 * --restart.
 *
 * A job's identity (job.json: {"version", "params", "fingerprints", ...}) splits in two:
 *  - what changes samples: every parameter except those below, and the fingerprints of
 *    model and tokenizer. A difference is refused, listing each key old -> new (floats
 *    as typed: the shortest text that reads back to the same double).
 *  - what does not: --limit, --shard-samples, --on-bad-record, the worker (its own job
 *    file anyway), the input paths and the corpus files themselves. Done ids stay done,
 *    records with new ids are new work. An input list that only grew at the end keeps
 *    every record's index (and so its worker); any other change of the inputs renumbers
 *    records, which a single worker accepts (its ledger of rejected records is set aside
 *    and rebuilt) but N > 1 workers refuse, since records would move between workers.
 *  - anything else at the top level (eaglegen_versions, state) is bookkeeping.
 * gen_job_sample_diff is shared with merge, which compares workers the same way.
 * Thread safety: one thread. */
#ifndef EG_GEN_RESUME_H
#define EG_GEN_RESUME_H

#include <jansson.h>
#include <stddef.h>

#include "common/eg_common.h"

/* 1 when the parameter params.KEY changes samples. */
int gen_job_param_is_sample(const char *key);

/* JSON value as text; reals in their shortest round-trip form (0.7, not
 * 0.69999999999999996). malloc'd; NULL on out of memory. */
char *gen_json_text(const json_t *v);

/* Appends "\n  KEY: OLD -> NEW" to out (cap bytes, truncated) for every sample-changing
 * difference between two job identities; returns how many there are. */
int gen_job_sample_diff(const json_t *have, const json_t *want, char *out, size_t cap);

typedef enum {
    GEN_INPUTS_SAME = 0,  /* same files by content, in order (paths may differ) */
    GEN_INPUTS_APPENDED,  /* the old list, unchanged, then more files */
    GEN_INPUTS_CHANGED    /* anything else */
} gen_inputs_relation;
gen_inputs_relation gen_job_inputs_relation(const json_t *have, const json_t *want);
/* 1 when a and b share an input file by content (pipes have none to compare). */
int gen_job_inputs_share(const json_t *a, const json_t *b);

typedef struct gen_resume {
    int existed;  /* the job file was there */
    int rewrite;  /* it differs from want in what may change: write want over it */
    gen_inputs_relation inputs;
    char changes[1024]; /* the accepted differences, "\n  key: old -> new" lines */
} gen_resume;

/* Check want against DIR/NAME. Fails with EG_ERR_CONFIG listing the sample-changing
 * differences, or the input change that N > 1 workers cannot take. want gains the
 * job's "eaglegen_versions" (the versions that wrote to it, this one last). */
eg_status gen_resume_check(const char *dir, const char *name, json_t *want, int n_workers, gen_resume *r,
                           eg_error *err);

/* Name the corpus's inputs as want's fingerprints.inputs[i].name says (set by
 * gen_resume_check for inputs now reached by another path). */
struct corpus_reader;
eg_status gen_resume_apply_names(const json_t *want, struct corpus_reader *r, eg_error *err);

/* --restart: remove this worker's job from DIR (its shards as its manifest lists them,
 * the manifest, job file, rejects ledger and done log; the names are the caller's), so
 * the run starts over. The caller holds the manifest's writer lock (shard_writer_lock:
 * another process writing it stops the caller there). Refused for a merged manifest
 * (which lists other workers' shards). *removed = shards deleted. */
eg_status gen_job_restart(const char *dir, const char *manifest, const char *job, const char *rejects,
                          const char *done, int64_t *removed, eg_error *err);

/* The job object a manifest records: ident with "state" set (running, complete, limit,
 * interrupted, error; complete = every record of this worker's share was handled).
 * Compact JSON, malloc'd; NULL on out of memory. */
char *gen_job_state_text(const json_t *ident, const char *state);

/* Move DIR/NAME aside to DIR/NAME.K (K = 1, 2, ...: the first free); *moved = 1 when
 * there was a file. */
eg_status gen_set_aside(const char *dir, const char *name, char *new_name, size_t cap, int *moved, eg_error *err);

#endif
