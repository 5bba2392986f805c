/* draft_model.h — `generate --draft-model DIR --draft-tokens K`: loading the EAGLE-3
 * drafter for speculative decoding (engine/drafter.h, docs/ENGINE.md "Speculative
 * decoding"), its identity in job.json, and its end-of-run report.
 *
 * The drafter itself is loaded by the runtime (engine/runtime.h, opts.draft_model) once
 * the slot count is decided.
 * Ownership: the identity is a new JSON reference the caller owns.
 * Thread safety: one thread. */
#ifndef EG_GEN_DRAFT_MODEL_H
#define EG_GEN_DRAFT_MODEL_H

#include <jansson.h>
#include <stdio.h>

#include "engine/engine.h"

/* {"config_sha256": SHA-256 of DIR/config.json, "weights": [fingerprint of each
 * .safetensors file in DIR, by name]}: what makes the drafted samples (a drafter that
 * changes makes other sampled tokens, so a resume with it is refused; job.json holds K
 * beside it, as params.draft_tokens). */
eg_status gen_draft_identity(const char *dir, json_t **out, eg_error *err);
/* The end report: mean accepted drafts and tokens per verify step, time drafting and in
 * verify steps (shares of their sum); one "speculative" JSON line to json (NULL = none). */
void gen_draft_report(FILE *human, FILE *json, const eg_engine_stats *es, int worker, int n_workers);

#endif
