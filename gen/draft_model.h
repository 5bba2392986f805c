/* draft_model.h — `generate --draft-model DIR --draft-tokens K`: loading the EAGLE-3
 * drafter for speculative decoding (engine/drafter.h, docs/ENGINE.md "Speculative
 * decoding"), its identity in job.json, and its end-of-run report.
 *
 * The loader is engine/drafter_eagle3.h's eg_drafter_eagle3_load; a build without that
 * module (it is compiled in when the header exists) refuses --draft-model with a clear
 * message instead.
 * Ownership: gen_draft_load's drafter is freed with eg_drafter_free; the identity is a
 * new JSON reference the caller owns.
 * Thread safety: one thread. */
#ifndef EG_GEN_DRAFT_MODEL_H
#define EG_GEN_DRAFT_MODEL_H

#include <jansson.h>
#include <stdio.h>

#include "engine/engine.h"

/* 1 when this build can load an EAGLE-3 drafter. */
int gen_draft_available(void);
/* {"config_sha256": SHA-256 of DIR/config.json, "weights": [fingerprint of each
 * .safetensors file in DIR, by name]}: what makes the drafted samples (a drafter that
 * changes makes other sampled tokens, so a resume with it is refused; job.json holds K
 * beside it, as params.draft_tokens). */
eg_status gen_draft_identity(const char *dir, json_t **out, eg_error *err);
eg_status gen_draft_load(const char *dir, const eg_model *target, int n_slots, int max_seq_len, eg_drafter **out,
                         eg_error *err);
/* The end report: mean accepted drafts and tokens per verify step, time drafting and in
 * verify steps (shares of their sum); one "speculative" JSON line to json (NULL = none). */
void gen_draft_report(FILE *human, FILE *json, const eg_engine_stats *es, int worker, int n_workers);

#endif
