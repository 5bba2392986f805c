/* The drafter behind `generate --draft-model`; see draft_model.h. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/eg_hash.h"
#include "gen/draft_model.h"
#include "gen/job.h"

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

eg_status gen_draft_identity(const char *dir, json_t **out, eg_error *err) {
    *out = NULL;
    char path[4096], sha[65];
    snprintf(path, sizeof path, "%s/config.json", dir);
    eg_status st = eg_sha256_file(path, sha, err);
    if (st) return eg_wrap(err, "--draft-model %s", dir);
    DIR *d = opendir(dir);
    if (!d) return eg_fail(err, EG_ERR_IO, "--draft-model %s: cannot list the directory", dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    int oom = 0;
    while (!oom && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors")) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(names, sizeof *names * cap);
            if (!nn) { oom = 1; break; }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) oom = 1;
        else n++;
    }
    closedir(d);
    if (oom) st = eg_fail(err, EG_ERR_NOMEM, "out of memory listing %s", dir);
    if (n) qsort(names, n, sizeof *names, name_cmp);
    json_t *weights = json_array();
    for (size_t i = 0; i < n && !st; i++) {
        json_t *fp = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!(st = gen_file_fingerprint(path, &fp, err))) {
            json_object_set_new(fp, "path", json_string(names[i])); /* the name, not where the directory is */
            json_array_append_new(weights, fp);
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!st && !json_array_size(weights)) st = eg_fail(err, EG_ERR_CONFIG, "--draft-model %s: no .safetensors file", dir);
    if (st) {
        json_decref(weights);
        return st;
    }
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
