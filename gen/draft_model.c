/* The drafter behind `generate --draft-model`; see draft_model.h. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/eg_hash.h"
#include "gen/draft_model.h"
#include "gen/job.h"

eg_status gen_draft_identity(const char *dir, json_t **out, eg_error *err) {
    *out = NULL;
    char path[4096], sha[65];
    snprintf(path, sizeof path, "%s/config.json", dir);
    eg_status st = eg_sha256_file(path, sha, err);
    if (st) return eg_wrap(err, "--draft-model %s", dir);
    json_t *weights = NULL;
    if ((st = gen_weights_fingerprint(dir, &weights, err))) return eg_wrap(err, "--draft-model %s", dir);
    *out = json_pack("{s:s, s:o}", "config_sha256", sha, "weights", weights);
    return *out ? EG_OK : eg_fail(err, EG_ERR_NOMEM, "out of memory");
}

void gen_draft_report(FILE *human, FILE *json, const eg_engine_stats *es, int worker, int n_workers) {
    double vs = es->verify_steps > 0 ? (double)es->verify_steps : 1;
    double acc = es->accepted / vs, tok = es->spec_tokens / vs;
    double spec = es->draft_seconds + es->verify_seconds > 0 ? es->draft_seconds + es->verify_seconds : 1;
    fprintf(human,
            "eaglegen generate: speculative: %lld verify steps, %lld drafted, %lld accepted (%.1f%%): %.2f accepted "
            "drafts and %.2f tokens per verify step; drafting %.1f s (%.1f%%), verify steps %.1f s (%.1f%%)\n",
            (long long)es->verify_steps, (long long)es->drafted, (long long)es->accepted,
            es->drafted ? 100.0 * es->accepted / es->drafted : 0.0, acc, tok, es->draft_seconds,
            100 * es->draft_seconds / spec, es->verify_seconds, 100 * es->verify_seconds / spec);
    /* where the rows went: on a GPU most should stay there (docs/ENGINE.md "Cost notes") */
    fprintf(human,
            "eaglegen generate: host traffic of the draws: %lld target logits rows taken; on the backend %lld drafts' p, "
            "%lld tokens, %lld residuals from kept sets",
            (long long)es->logit_rows, (long long)es->backend_probs, (long long)es->backend_draws,
            (long long)es->backend_residuals);
    if (es->draft_kept + es->draft_argmax + es->draft_host_rows > 0) /* a drafter on a backend */
        fprintf(human, "; the drafter's draws: %lld from its backend's kept sets, %lld by its argmax, %lld from rows on "
                "the host", (long long)es->draft_kept, (long long)es->draft_argmax, (long long)es->draft_host_rows);
    fprintf(human, "\n");
    if (es->draft_no_q > 0) /* the data stay exact (spec.h eg_spec_no_q); the drafter is broken */
        fprintf(human,
                "eaglegen generate: warning: %lld drafts had no probability under the drafter's own distribution "
                "(its logits were not finite: NaN or infinity in the checkpoint or its inputs); they were tested as "
                "deterministic proposals, so the samples are still exact, but that drafter is not working\n",
                (long long)es->draft_no_q);
    if (!json) return;
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(json,
            "{\"time\":\"%s\",\"worker\":\"%d/%d\",\"phase\":\"speculative\",\"verify_steps\":%lld,\"drafted\":%lld,"
            "\"accepted\":%lld,\"mean_accepted_per_verify\":%.4f,\"tokens_per_verify\":%.4f,\"draft_seconds\":%.3f,"
            "\"verify_seconds\":%.3f,\"engine_seconds\":%.3f,\"draft_share\":%.4f,\"verify_share\":%.4f,"
            "\"logit_rows\":%lld,\"backend_probs\":%lld,\"backend_draws\":%lld,\"backend_residuals\":%lld,"
            "\"draft_kept\":%lld,\"draft_argmax\":%lld,\"draft_host_rows\":%lld,\"draft_no_q\":%lld}\n",
            ts, worker, n_workers, (long long)es->verify_steps, (long long)es->drafted, (long long)es->accepted, acc, tok,
            es->draft_seconds, es->verify_seconds, es->seconds, es->draft_seconds / spec, es->verify_seconds / spec,
            (long long)es->logit_rows, (long long)es->backend_probs, (long long)es->backend_draws,
            (long long)es->backend_residuals, (long long)es->draft_kept, (long long)es->draft_argmax,
            (long long)es->draft_host_rows, (long long)es->draft_no_q);
    fflush(json);
}
