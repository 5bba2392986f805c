/* Consistency of a merge's inputs; see merge_check.h. */
#include "gen/merge_check.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/manifest.h"
#include "gen/job.h"
#include "gen/resume.h"

typedef struct merge_unit {
    char where[600];  /* "DIR/manifest.w1of3.json" or "DIR/manifest.json (from W/manifest)" */
    json_t *job;      /* owned */
    int worker, n_workers;
    char *inputs_key; /* the inputs by content, canonical text; owned */
    int group;
} merge_unit;

typedef struct unit_list {
    merge_unit *u;
    int n, cap;
} unit_list;

static void units_free(unit_list *l) {
    for (int i = 0; i < l->n; i++) {
        json_decref(l->u[i].job);
        free(l->u[i].inputs_key);
    }
    free(l->u);
}

static char *inputs_key(const json_t *job) {
    json_t *in = json_object_get(json_object_get(job, "fingerprints"), "inputs");
    json_t *k = json_array();
    for (size_t i = 0; i < json_array_size(in); i++) {
        json_t *e = json_array_get(in, i);
        const char *p = json_string_value(json_object_get(e, "path"));
        if (p && !strcmp(p, "-")) json_array_append_new(k, json_string("-"));
        else json_array_append_new(k, json_pack("[O?O?]", json_object_get(e, "size"), json_object_get(e, "sha256_head_tail")));
    }
    char *s = json_dumps(k, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(k);
    return s;
}

static eg_status add_unit(unit_list *l, const char *where, json_t *job, int worker, int n_workers, eg_error *err) {
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 16;
        merge_unit *p = realloc(l->u, sizeof *p * (size_t)nc);
        if (!p) { json_decref(job); return eg_fail(err, EG_ERR_NOMEM, "out of memory"); }
        l->u = p;
        l->cap = nc;
    }
    merge_unit *u = &l->u[l->n++];
    memset(u, 0, sizeof *u);
    snprintf(u->where, sizeof u->where, "%s", where);
    u->job = job;
    u->worker = worker;
    u->n_workers = n_workers;
    const char *w = json_string_value(json_object_get(json_object_get(job, "params"), "worker"));
    int a, b;
    if (w && sscanf(w, "%d/%d", &a, &b) == 2 && b >= 1 && a >= 0 && a < b) {
        u->worker = a;
        u->n_workers = b;
    }
    if (!(u->inputs_key = inputs_key(job))) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    return EG_OK;
}

/* The jobs a merged manifest's "merged_from" lists, down to the generate jobs: a merge of
 * a merge is checked as the merge of all its leaves (it used to stop one level down, at
 * entries without parameters, and mixed or partial data passed unchecked). */
static eg_status add_merged(unit_list *l, const char *where, const json_t *from, int depth, eg_error *err) {
    if (depth > 64) return eg_fail(err, EG_ERR_FORMAT, "%s: merged_from nested too deep", where);
    eg_status st = EG_OK;
    for (size_t i = 0; i < json_array_size(from) && !st; i++) {
        json_t *e = json_array_get(from, i);
        char w[1400];
        snprintf(w, sizeof w, "%.600s (merged from %.300s/%.300s)", where,
                 json_string_value(json_object_get(e, "dir")) ?: "?",
                 json_string_value(json_object_get(e, "manifest")) ?: "?");
        json_t *ej = json_object_get(e, "job"), *inner = json_object_get(ej, "merged_from");
        if (json_is_array(inner)) st = add_merged(l, w, inner, depth + 1, err);
        else st = add_unit(l, w, json_is_object(ej) ? json_incref(ej) : json_object(), 0, 1, err);
    }
    return st;
}

static eg_status collect(const char *const *dirs, int n_dirs, unit_list *l, eg_error *err) {
    eg_status st = EG_OK;
    for (int d = 0; d < n_dirs && !st; d++) {
        char **names = NULL;
        int nn = 0;
        if ((st = eg_ds_find_manifests(dirs[d], 1, &names, &nn, err))) break;
        for (int k = 0; k < nn && !st; k++) {
            char mp[4096];
            snprintf(mp, sizeof mp, "%s/%s", dirs[d], names[k]);
            eg_ds_info m = {0};
            if ((st = eg_ds_info_load(mp, &m, err))) break;
            json_error_t je;
            json_t *job = json_loads(m.job_json ? m.job_json : "{}", 0, &je);
            json_t *from = json_object_get(job, "merged_from");
            if (json_is_array(from)) {
                st = add_merged(l, mp, from, 0, err);
                json_decref(job);
            } else {
                st = add_unit(l, mp, json_is_object(job) ? job : (json_decref(job), json_object()), m.worker_index,
                              m.worker_count > 0 ? m.worker_count : 1, err);
            }
            eg_ds_info_clear(&m);
        }
        eg_ds_free_names(names, nn);
    }
    return st;
}

static int has_params(const merge_unit *u) { return json_is_object(json_object_get(u->job, "params")); }

/* First input path of a unit, for messages. */
static const char *first_input(const merge_unit *u) {
    json_t *in = json_object_get(json_object_get(u->job, "fingerprints"), "inputs");
    const char *p = json_string_value(json_object_get(json_array_get(in, 0), "path"));
    return p ? p : "?";
}

eg_status gen_merge_check(const char *const *dirs, int n_dirs, int allow_partial, FILE *report, char **note_json,
                          eg_error *err) {
    *note_json = NULL;
    unit_list l = {0};
    eg_status st = collect(dirs, n_dirs, &l, err);
    if (st) { units_free(&l); return st; }

    /* 1. sample-changing parameters against the first job that has them */
    int ref = -1, n_mixed = 0, n_dup = 0, n_split = 0;
    for (int i = 0; i < l.n; i++) {
        if (!has_params(&l.u[i])) {
            fprintf(report, "eaglegen merge: note: %s records no job parameters (not written by eaglegen generate); "
                            "not compared\n", l.u[i].where);
            continue;
        }
        if (ref < 0) { ref = i; continue; }
        char diff[2048] = "";
        int c = gen_job_sample_diff(l.u[ref].job, l.u[i].job, diff, sizeof diff);
        if (!c) continue;
        n_mixed++;
        fprintf(report, "eaglegen merge: %s and %s were made with different parameters (%d difference%s, first -> "
                        "second):%s\n", l.u[ref].where, l.u[i].where, c, c > 1 ? "s" : "", diff);
    }

    /* 2. groups: same worker count and inputs */
    int n_groups = 0;
    for (int i = 0; i < l.n; i++) {
        l.u[i].group = -1;
        if (!has_params(&l.u[i])) continue;
        for (int j = 0; j < i && l.u[i].group < 0; j++)
            if (l.u[j].group >= 0 && l.u[j].n_workers == l.u[i].n_workers && !strcmp(l.u[j].inputs_key, l.u[i].inputs_key))
                l.u[i].group = l.u[j].group;
        if (l.u[i].group < 0) {
            l.u[i].group = n_groups++;
            for (int j = 0; j < i; j++)
                if (l.u[j].group >= 0 && l.u[j].n_workers != l.u[i].n_workers && !strcmp(l.u[j].inputs_key, l.u[i].inputs_key)) {
                    n_split++;
                    fprintf(report, "eaglegen merge: %s (worker %d/%d) and %s (worker %d/%d) split the same inputs two "
                                    "ways: their records overlap\n", l.u[j].where, l.u[j].worker, l.u[j].n_workers,
                            l.u[i].where, l.u[i].worker, l.u[i].n_workers);
                    break;
                }
        }
        for (int j = 0; j < i; j++)
            if (l.u[j].group == l.u[i].group && l.u[j].worker == l.u[i].worker) {
                n_dup++;
                fprintf(report, "eaglegen merge: worker %d/%d appears twice: %s and %s\n", l.u[i].worker,
                        l.u[i].n_workers, l.u[j].where, l.u[i].where);
                break;
            }
    }

    /* 3. missing and unfinished workers */
    json_t *missing = json_array(), *unfinished = json_array();
    for (int g = 0; g < n_groups; g++) {
        int first = -1;
        for (int i = 0; i < l.n && first < 0; i++)
            if (l.u[i].group == g) first = i;
        int n = l.u[first].n_workers;
        char *seen = calloc((size_t)n, 1);
        if (!seen) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
        for (int i = 0; i < l.n; i++)
            if (l.u[i].group == g) seen[l.u[i].worker] = 1;
        for (int w = 0; w < n; w++) {
            if (seen[w]) continue;
            char name[64];
            snprintf(name, sizeof name, "%d/%d", w, n);
            json_array_append_new(missing, json_string(name));
            /* the same worker on other inputs: a corpus mix-up rather than a worker not run */
            const char *other = NULL;
            for (int i = 0; i < l.n && !other; i++)
                if (l.u[i].group >= 0 && l.u[i].group != g && l.u[i].n_workers == n && l.u[i].worker == w) other = l.u[i].where;
            if (other)
                fprintf(report, "eaglegen merge: worker %s of the job on %s is missing; a worker %s made from other "
                                "input files is in %s (every worker must be given the same inputs)\n",
                        name, first_input(&l.u[first]), name, other);
            else fprintf(report, "eaglegen merge: worker %s of the job on %s is missing\n", name, first_input(&l.u[first]));
        }
        free(seen);
    }
    for (int i = 0; i < l.n && !st; i++) {
        if (!has_params(&l.u[i])) continue;
        const char *state = json_string_value(json_object_get(l.u[i].job, "state"));
        if (state && !strcmp(state, "complete")) continue;
        char item[800];
        snprintf(item, sizeof item, "%s (%s)", l.u[i].where, state ? state : "no state recorded");
        json_array_append_new(unfinished, json_string(item));
        fprintf(report, "eaglegen merge: %s is unfinished: %s\n", l.u[i].where,
                !state ? "its manifest records no state (made by an older eaglegen?)"
                : !strcmp(state, "limit") ? "it stopped at --limit"
                : !strcmp(state, "running") ? "it is running, or was killed"
                : state);
    }
    size_t n_missing = json_array_size(missing), n_unfinished = json_array_size(unfinished);
    if (!st && (n_mixed || n_dup || n_split))
        st = eg_fail(err, EG_ERR_CONFIG, "refusing to merge: %s%s%s (listed above); nothing was written",
                     n_mixed ? "the inputs were made with different parameters" : "",
                     n_dup ? (n_mixed ? "; a worker appears twice" : "a worker appears twice") : "",
                     n_split ? (n_mixed || n_dup ? "; inputs split two ways" : "the same inputs are split two ways") : "");
    else if (!st && (n_missing || n_unfinished) && !allow_partial)
        st = eg_fail(err, EG_ERR_CONFIG,
                     "refusing a partial merge: %zu worker%s missing, %zu unfinished (listed above). Finish them, or "
                     "merge what is there with --allow-partial (the manifest records what is missing)",
                     n_missing, n_missing == 1 ? "" : "s", n_unfinished);
    else if (!st && (n_missing || n_unfinished)) {
        json_t *note = json_pack("{s:{s:O, s:O}}", "partial", "missing", missing, "unfinished", unfinished);
        if (!note || !(*note_json = json_dumps(note, JSON_COMPACT))) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        json_decref(note);
        fprintf(report, "eaglegen merge: --allow-partial: merging without %zu missing and with %zu unfinished "
                        "worker%s; recorded in the manifest (job.partial)\n",
                n_missing, n_unfinished, n_unfinished == 1 ? "" : "s");
    }
    json_decref(missing);
    json_decref(unfinished);
    units_free(&l);
    return st;
}

eg_status gen_worker_join_check(const char *dir, int worker, int n_workers, const json_t *want, int weight_bytes_unknown,
                                eg_error *err) {
    if (n_workers <= 1) return EG_OK;
    DIR *d = opendir(dir);
    if (!d) return EG_OK; /* a new directory: nobody to meet */
    eg_status st = EG_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        int a, b;
        const char *name = e->d_name;
        if (!gen_job_file_worker(name, &a, &b) || (a == worker && b == n_workers)) continue;
        json_t *have = NULL;
        eg_error e2 = {0};
        if (gen_job_read(dir, name, &have, &e2) || !json_is_object(have)) { /* left to merge to report */
            json_decref(have);
            continue;
        }
        char diff[2048] = "";
        json_t *mine = (json_t *)want, *copy = NULL;
        json_t *hb = json_object_get(json_object_get(have, "fingerprints"), "model_weight_bytes");
        if (weight_bytes_unknown && hb && (copy = json_deep_copy(want))) { /* theirs, as far as a dry run can tell */
            json_object_set(json_object_get(copy, "fingerprints"), "model_weight_bytes", hb);
            mine = copy;
        }
        int c = gen_job_sample_diff(have, mine, diff, sizeof diff);
        json_decref(copy);
        if (c)
            st = eg_fail(err, EG_ERR_CONFIG,
                         "%s/%s, another worker of this dataset, was made with parameters that change samples (%d "
                         "difference%s, that worker's -> this one's):%s\nEvery worker of a directory needs the same "
                         "values (readers take the workers' samples as one dataset): use them, or another --out.",
                         dir, name, c, c > 1 ? "s" : "", diff);
        else if (b != n_workers && gen_job_inputs_share(have, want))
            st = eg_fail(err, EG_ERR_CONFIG,
                         "%s/%s splits its inputs over %d workers, this one over %d, and they share an input file: "
                         "their records overlap, and readers would take the samples they share twice. Use --worker "
                         "I/%d (the same count), or another --out.", dir, name, b, n_workers, b);
        json_decref(have);
    }
    closedir(d);
    return st;
}
