/* dry_run.h — `eaglegen generate --dry-run`: what a run would do, before any weights
 * are loaded (config.json, the tokenizer and the corpus only).
 *
 * Reads this worker's share of the corpus as the run would (template, tokenizer, length
 * limit, duplicate ids, capture mode's assistant turns, --limit) and prints: records
 * accepted and rejected by reason (digits folded, one example each), prompt token
 * statistics, the output tokens under a stated assumption (every response runs to
 * --max-new-tokens, capped by --max-seq-len: an upper bound), the bytes the samples would
 * take for the model's H and aux layer count (BF16 hidden rows + int32 id + uint8 mask
 * per token, before compression) and how that falls into shards; with an existing job in
 * --out, how many samples it already holds and whether the run would resume it (the
 * run's own check of job.json against the parameters, the config, tokenizer and inputs;
 * the weights' bytes are not compared, none being loaded), refuse it (the same message,
 * exit 1), or delete it (--restart); the layout (stages, and with --ep each rank's
 * routed experts and share of the slots, as the run splits them). Writes nothing.
 * Thread safety: one thread. */
#ifndef EG_GEN_DRY_RUN_H
#define EG_GEN_DRY_RUN_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

typedef struct gen_dry_run_opts {
    const char *model, *tokenizer, *out; /* out may be NULL */
    const char *const *prompts;
    int n_prompts;
    int capture, thinking;
    int max_new, max_seq_len;
    const int *aux;
    int n_aux;           /* 0 = the config's default */
    int64_t limit;       /* -1 = all */
    int worker, n_workers;
    int64_t shard_samples; /* 0 = no sample limit */
    int64_t shard_bytes;   /* 0 = no byte limit */
    const char *backend;   /* "cpu" or "cuda" */
    const char *stages;    /* --stages text or NULL; checked against the layer count */
    int n_final;           /* final states stored per token: 1, or 2 (--final-hidden both); 0 = 1 */
    int ep;                /* --ep ranks (0 or 1 = none): checked against the routed experts and
                              --batch as the run checks them, and each rank's share printed */
    int batch;             /* --batch (0 = auto) */
    int ep_split;          /* --ep-split: eg_ep_split. ffn: each layer's shared expert / dense MLP
                              on rank l mod ep, printed per rank; all: also the vocab rows of
                              each rank, refused on cuda as the run refuses it */
    const json_t *params;  /* the job's "params" as the run writes them (borrowed): checked
                              against an existing job in out; NULL: not checked */
    int restart;           /* --restart: the run deletes an existing job */
} gen_dry_run_opts;

/* Prints the report to out; returns the exit status (0, or 1 after an error message on
 * stderr). */
int gen_dry_run(const gen_dry_run_opts *o, FILE *out);

#endif
