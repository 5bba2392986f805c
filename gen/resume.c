/* What a resumed job may change, and --restart; see resume.h. */
#include "gen/resume.h"
#include "gen/job.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dataset/manifest.h"
#include "prompts/corpus.h"

int gen_job_param_is_sample(const char *key) {
    static const char *const free_keys[] = {"limit", "shard_samples", "shard_bytes", "on_bad_record", "worker",
                                               "n_workers"};
    for (size_t i = 0; i < sizeof free_keys / sizeof free_keys[0]; i++)
        if (!strcmp(key, free_keys[i])) return 0;
    return 1; /* unknown keys change samples: the safe side */
}

char *gen_json_text(const json_t *v) {
    if (json_is_real(v)) {
        double x = json_real_value(v);
        char buf[40];
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, x);
            if (strtod(buf, NULL) == x) break;
        }
        return strdup(buf);
    }
    return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS);
}

static void add_line(char *out, size_t cap, const char *key, const json_t *a, const json_t *b) {
    char *sa = a ? gen_json_text(a) : NULL, *sb = b ? gen_json_text(b) : NULL;
    size_t len = strlen(out);
    if (len < cap)
        snprintf(out + len, cap - len, "\n  %s: %.200s -> %.200s", key, sa ? sa : "(absent)", sb ? sb : "(absent)");
    free(sa);
    free(sb);
}

/* Differences of one object's members (both may be NULL); keep(key) selects them. */
static int diff_members(const char *prefix, const json_t *a, const json_t *b, int (*keep)(const char *), char *out,
                        size_t cap) {
    int n = 0;
    const char *k;
    json_t *v;
    char key[256];
    json_object_foreach((json_t *)a, k, v) {
        if (!keep(k)) continue;
        json_t *w = json_object_get(b, k);
        if (w && json_equal(v, w)) continue;
        snprintf(key, sizeof key, "%s%s", prefix, k);
        add_line(out, cap, key, v, w);
        n++;
    }
    json_object_foreach((json_t *)b, k, v) {
        if (!keep(k) || json_object_get(a, k)) continue;
        snprintf(key, sizeof key, "%s%s", prefix, k);
        add_line(out, cap, key, NULL, v);
        n++;
    }
    return n;
}

static int fp_is_sample(const char *key) { return strcmp(key, "inputs") != 0; }
/* a job written before the weights were fingerprinted (model_weights) resumes as it did:
   by config hash and stored bytes only */
static int fp_is_sample_old(const char *key) { return fp_is_sample(key) && strcmp(key, "model_weights") != 0; }
static int param_is_free(const char *key) { return !gen_job_param_is_sample(key); }
/* In capture mode nothing is generated: the sampling parameters and --drop-truncated
 * leave every sample as it is (its metadata records temperature 0, top-p 1, top-k 0;
 * generate says so when they are given), so a resume or a merge may differ in them. */
static int capture_free(const char *key) {
    static const char *const k[] = {"max_new_tokens", "temperature", "top_p", "top_k", "drop_truncated"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(key, k[i])) return 1;
    return 0;
}
static int param_is_sample_capture(const char *key) { return gen_job_param_is_sample(key) && !capture_free(key); }
static int param_is_free_capture(const char *key) { return !param_is_sample_capture(key); }
static int both_capture(const json_t *have, const json_t *want) {
    const char *a = json_string_value(json_object_get(json_object_get(have, "params"), "mode"));
    const char *b = json_string_value(json_object_get(json_object_get(want, "params"), "mode"));
    return a && b && !strcmp(a, "capture") && !strcmp(b, "capture");
}

int gen_job_sample_diff(const json_t *have, const json_t *want, char *out, size_t cap) {
    int n = 0;
    json_t *hv = json_object_get(have, "version"), *wv = json_object_get(want, "version");
    if (!json_equal(hv, wv) && (hv || wv)) { add_line(out, cap, "version", hv, wv); n++; }
    n += diff_members("", json_object_get(have, "params"), json_object_get(want, "params"),
                      both_capture(have, want) ? param_is_sample_capture : gen_job_param_is_sample, out, cap);
    json_t *hf = json_object_get(have, "fingerprints");
    n += diff_members("fingerprints.", hf, json_object_get(want, "fingerprints"),
                      hf && !json_object_get(hf, "model_weights") ? fp_is_sample_old : fp_is_sample, out, cap);
    return n;
}

static const json_t *inputs_of(const json_t *job) {
    return json_object_get(json_object_get(job, "fingerprints"), "inputs");
}

/* Same file by content. A pipe (stdin, a FIFO, <(...)) has none to compare: it matches
 * a pipe, and the ledger's line hashes tell whether its records are the ones logged. */
static int is_pipe(const json_t *in, const char *path) {
    return (path && !strcmp(path, "-")) || json_is_true(json_object_get(in, "pipe"));
}

static int same_input(const json_t *a, const json_t *b) {
    const char *pa = json_string_value(json_object_get(a, "path")), *pb = json_string_value(json_object_get(b, "path"));
    int sa = is_pipe(a, pa), sb = is_pipe(b, pb);
    if (sa || sb) return sa && sb;
    return json_equal(json_object_get(a, "size"), json_object_get(b, "size")) &&
           json_equal(json_object_get(a, "sha256_head_tail"), json_object_get(b, "sha256_head_tail"));
}

int gen_job_inputs_share(const json_t *a, const json_t *b) {
    const json_t *ia = inputs_of(a), *ib = inputs_of(b);
    for (size_t i = 0; i < json_array_size(ia); i++) {
        const json_t *x = json_array_get(ia, i);
        if (is_pipe(x, json_string_value(json_object_get(x, "path")))) continue; /* no content to compare */
        for (size_t j = 0; j < json_array_size(ib); j++)
            if (same_input(x, json_array_get(ib, j))) return 1;
    }
    return 0;
}

gen_inputs_relation gen_job_inputs_relation(const json_t *have, const json_t *want) {
    const json_t *h = inputs_of(have), *w = inputs_of(want);
    size_t nh = json_array_size(h), nw = json_array_size(w);
    if (nh > nw) return GEN_INPUTS_CHANGED;
    for (size_t i = 0; i < nh; i++)
        if (!same_input(json_array_get(h, i), json_array_get(w, i))) return GEN_INPUTS_CHANGED;
    return nh == nw ? GEN_INPUTS_SAME : GEN_INPUTS_APPENDED;
}

/* "\n  inputs: ..." describing how the inputs changed. */
static void describe_inputs(const json_t *have, const json_t *want, gen_inputs_relation rel, char *out, size_t cap) {
    const json_t *h = inputs_of(have), *w = inputs_of(want);
    size_t nh = json_array_size(h), nw = json_array_size(w), len = strlen(out);
    if (len >= cap) return;
    if (rel == GEN_INPUTS_SAME) {
        int renamed = 0;
        for (size_t i = 0; i < nh; i++)
            renamed |= !json_equal(json_object_get(json_array_get(h, i), "path"),
                                   json_object_get(json_array_get(w, i), "path"));
        if (renamed)
            snprintf(out + len, cap - len, "\n  inputs: the same files by content, reached by another path (ids "
                                           "without an \"id\" field keep the first name)");
        return;
    }
    if (rel == GEN_INPUTS_APPENDED) {
        snprintf(out + len, cap - len, "\n  inputs: %zu file%s added at the end (first: %.300s)", nw - nh,
                 nw - nh > 1 ? "s" : "", json_string_value(json_object_get(json_array_get(w, nh), "path")));
        return;
    }
    size_t i = 0;
    while (i < nh && i < nw && same_input(json_array_get(h, i), json_array_get(w, i))) i++;
    const char *ph = i < nh ? json_string_value(json_object_get(json_array_get(h, i), "path")) : NULL;
    const char *pw = i < nw ? json_string_value(json_object_get(json_array_get(w, i), "path")) : NULL;
    snprintf(out + len, cap - len, "\n  inputs: %zu file%s -> %zu; input %zu: %.300s -> %.300s", nh, nh == 1 ? "" : "s",
             nw, i + 1, ph ? ph : "(none)", pw ? pw : "(none)");
}

static const char *input_name(const json_t *in) {
    const char *n = json_string_value(json_object_get(in, "name"));
    return n ? n : json_string_value(json_object_get(in, "path"));
}

/* Each of want's inputs keeps the name its records' ids were made with: that of the
 * same file by content at the same position, else of the old input that resolves to
 * the same file. */
static void carry_names(const json_t *have, json_t *want) {
    const json_t *h = inputs_of(have), *w = inputs_of(want);
    for (size_t i = 0; i < json_array_size(w); i++) {
        json_t *wi = json_array_get(w, i);
        const char *path = json_string_value(json_object_get(wi, "path")), *name = NULL;
        if (!path || !strcmp(path, "-")) continue;
        if (i < json_array_size(h) && same_input(json_array_get(h, i), wi)) name = input_name(json_array_get(h, i));
        char *rw = name ? NULL : realpath(path, NULL);
        for (size_t j = 0; rw && !name && j < json_array_size(h); j++) {
            const char *hp = json_string_value(json_object_get(json_array_get(h, j), "path"));
            char *rh = hp ? realpath(hp, NULL) : NULL;
            if (rh && !strcmp(rh, rw)) name = input_name(json_array_get(h, j));
            free(rh);
        }
        free(rw);
        if (name && strcmp(name, path)) json_object_set_new(wi, "name", json_string(name));
    }
}

eg_status gen_resume_apply_names(const json_t *want, corpus_reader *r, eg_error *err) {
    const json_t *w = inputs_of(want);
    for (size_t i = 0; i < json_array_size(w) && i < corpus_n_files(r); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(w, i), "name"));
        if (name && corpus_name_file(r, i, name, err)) return err->code;
    }
    return EG_OK;
}

/* want.eaglegen_versions = have's list, then want's own (last) entry when new. */
static void merge_versions(const json_t *have, json_t *want) {
    json_t *hl = json_object_get(have, "eaglegen_versions"), *wl = json_object_get(want, "eaglegen_versions");
    if (!json_is_array(hl) || !json_is_array(wl) || !json_array_size(wl)) return;
    json_t *cur = json_array_get(wl, json_array_size(wl) - 1);
    json_t *list = json_deep_copy(hl);
    if (!list) return;
    size_t n = json_array_size(list);
    if (!n || !json_equal(json_array_get(list, n - 1), cur)) json_array_append(list, cur);
    json_object_set_new(want, "eaglegen_versions", list);
}

eg_status gen_resume_check(const char *dir, const char *name, json_t *want, int n_workers, gen_resume *r,
                           eg_error *err) {
    memset(r, 0, sizeof *r);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    json_t *have;
    eg_status rs = gen_job_read(dir, name, &have, err);
    if (rs || !have) return rs;
    r->existed = 1;
    char msg[800] = "";
    int count = gen_job_sample_diff(have, want, msg, sizeof msg);
    if (count) {
        json_decref(have);
        return eg_fail(err, EG_ERR_CONFIG,
                       "%s was made with parameters that change samples; refusing to resume (%d difference%s, "
                       "old -> new):%s\n%s",
                       path, count, count > 1 ? "s" : "", msg,
                       n_workers > 1 ? "Use the original values, or another --out (a worker's --restart keeps the "
                                       "other workers' parameters: to start the whole set over with new ones, remove "
                                       "the directory)."
                                     : "Use the original values, another --out, or --restart to delete this job's "
                                       "samples and start over.");
    }
    r->inputs = gen_job_inputs_relation(have, want);
    carry_names(have, want);
    describe_inputs(have, want, r->inputs, r->changes, sizeof r->changes);
    if (r->inputs == GEN_INPUTS_CHANGED && n_workers > 1) {
        json_decref(have);
        return eg_fail(err, EG_ERR_CONFIG,
                       "%s: the inputs changed in a way that renumbers the records:%s\nWith %d workers records would "
                       "move between workers (made twice, or never). Restore the inputs (files may be added at the "
                       "end), or --restart every worker.",
                       path, r->changes, n_workers);
    }
    diff_members("", json_object_get(have, "params"), json_object_get(want, "params"),
                 both_capture(have, want) ? param_is_free_capture : param_is_free, r->changes,
                 sizeof r->changes);
    merge_versions(have, want);
    r->rewrite = !json_equal(have, want);
    json_decref(have);
    return EG_OK;
}

static eg_status unlink_in(const char *dir, const char *name, int *gone, eg_error *err) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!unlink(p)) { if (gone) (*gone)++; return EG_OK; }
    if (errno == ENOENT) return EG_OK;
    return eg_fail(err, EG_ERR_IO, "--restart: removing %s: %s", p, strerror(errno));
}

eg_status gen_job_restart(const char *dir, const char *manifest, const char *job, const char *rejects,
                          const char *done, int64_t *removed, eg_error *err) {
    *removed = 0;
    if (access(dir, F_OK)) return EG_OK; /* nothing to start over from */
    char p[4096];
    eg_status st = EG_OK;
    snprintf(p, sizeof p, "%s/%s", dir, manifest);
    if (!access(p, F_OK)) {
        eg_ds_info m = {0};
        if ((st = eg_ds_info_load(p, &m, err))) {
            eg_wrap(err, "--restart: reading the manifest to remove its shards");
        } else if (m.worker_count == 0) {
            st = eg_fail(err, EG_ERR_CONFIG, "--restart: %s is a merged manifest (it lists other workers' shards); "
                                             "remove it by hand if this job is to start over", p);
        } else {
            /* a merged manifest.json in the same directory (merge DIR --out DIR) may list
               these shards: deleting them, and writing new ones under the same names,
               would leave that visible manifest naming bytes it never hashed */
            char mp[4200];
            snprintf(mp, sizeof mp, "%s/manifest.json", dir);
            eg_ds_info mm = {0};
            eg_error e2 = {0};
            if (strcmp(manifest, "manifest.json") && !access(mp, F_OK) && !eg_ds_info_load(mp, &mm, &e2))
                for (int i = 0; i < m.n_shards && !st; i++)
                    for (int j = 0; j < mm.n_shards && !st; j++)
                        if (!strcmp(m.shards[i].file, mm.shards[j].file))
                            st = eg_fail(err, EG_ERR_CONFIG,
                                         "--restart: the merged %s lists this job's shard %s; remove it (or merge "
                                         "into another directory) before starting this worker over",
                                         mp, m.shards[i].file);
            eg_ds_info_clear(&mm);
            int gone = 0;
            for (int i = 0; i < m.n_shards && !st; i++) st = unlink_in(dir, m.shards[i].file, &gone, err);
            *removed = gone;
        }
        eg_ds_info_clear(&m);
    }
    const char *names[] = {manifest, job, rejects, done};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !st; i++) st = unlink_in(dir, names[i], NULL, err);
    if (!st) st = eg_ds_fsync_dir(dir, err);
    return st;
}

eg_status gen_set_aside(const char *dir, const char *name, char *new_name, size_t cap, int *moved, eg_error *err) {
    *moved = 0;
    char from[4096], to[4200];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    if (access(from, F_OK)) return EG_OK;
    for (int k = 1;; k++) {
        snprintf(new_name, cap, "%s.%d", name, k);
        snprintf(to, sizeof to, "%s/%s", dir, new_name);
        if (access(to, F_OK)) break;
    }
    if (rename(from, to)) return eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", from, to, strerror(errno));
    *moved = 1;
    return eg_ds_fsync_dir(dir, err);
}

char *gen_job_state_text(const json_t *ident, const char *state) {
    json_t *j = json_deep_copy(ident);
    if (!j || json_object_set_new(j, "state", json_string(state))) { json_decref(j); return NULL; }
    char *t = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return t;
}
