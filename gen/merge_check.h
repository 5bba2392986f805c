/* merge_check.h — what `eaglegen merge` checks before dataset_merge touches anything:
 * that the inputs are one consistent body of data.
 *
 * Every input manifest contributes the jobs it holds (a worker's or plain manifest: its
 * own job; a merged manifest: each job it was merged from). Then:
 *  - every job's sample-changing parameters and model/tokenizer fingerprints must agree
 *    (gen_job_sample_diff, the rule resume uses): a mix is refused, listing each
 *    difference and the jobs it is between;
 *  - jobs are grouped by worker count and inputs (by content): within a group each
 *    worker I of N appears at most once; the same inputs split two ways is refused (the
 *    splits overlap);
 *  - a worker missing from its group, or a job whose manifest does not say "complete"
 *    (it stopped at --limit, was interrupted, failed or still runs), makes the merge
 *    partial: refused unless allow_partial, and then recorded as
 *    {"partial": {"missing": [...], "unfinished": [...]}} in *note_json for the merged
 *    manifest.
 * Jobs with no recorded parameters (datasets not written by `eaglegen generate`) are
 * listed and not compared. Details go to `report` (stderr), one line each.
 * Ownership: *note_json is malloc'd (NULL when the merge is not partial).
 * Thread safety: one thread. */
#ifndef EG_GEN_MERGE_CHECK_H
#define EG_GEN_MERGE_CHECK_H

#include <stdio.h>

#include <jansson.h>

#include "common/eg_common.h"

/* What a worker (WORKER of N_WORKERS > 1) starting in DIR must agree on with the other
 * workers' job files there (job.wIofN.json), checked before it writes: the same
 * sample-changing parameters and model/tokenizer fingerprints (want is this run's job
 * identity), and no other worker count over an input file they share (overlapping records).
 * Readers take every worker's samples in a directory as one dataset, so a mix would be
 * found only by merge after the compute. Job files that cannot be read are left to merge.
 * weight_bytes_unknown (the dry run, which loads no weights): each other job's
 * fingerprints.model_weight_bytes is taken as this run's. */
eg_status gen_worker_join_check(const char *dir, int worker, int n_workers, const json_t *want, int weight_bytes_unknown,
                                eg_error *err);

eg_status gen_merge_check(const char *const *dirs, int n_dirs, int allow_partial, FILE *report, char **note_json,
                          eg_error *err);

#endif
