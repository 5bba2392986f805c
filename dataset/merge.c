/* dataset_merge: combine worker manifests into one manifest.json; see manifest.h.
 *
 * All or nothing: every input manifest, shard index and sample id is checked before
 * anything is created in the output directory; then the shards are linked (or copied),
 * and manifest.json is written last, atomically. On any failure the files this call
 * created are removed again (and the output directory, when this call made it). A shard
 * already present under its output name is accepted when it is the same file (the hard
 * link of an earlier merge) or byte-identical; a different file of that name is a
 * conflict. Shards of worker manifests keep their names (shard-w{I}of{N}-*.tar is unique
 * within a job); shards of a plain or merged manifest.json from another directory are
 * named in{D}-NAME (D: the input's position), as plain datasets all start at
 * shard-000000.tar; a name still taken gets in{D}.{K}-NAME. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/eg_hash.h"
#include "dataset/idset.h"
#include "dataset/manifest.h"
#include "dataset/reader.h"

static eg_status copy_file(const char *src, const char *dst, eg_error *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", src, strerror(errno));
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        close(in);
        return eg_fail(err, EG_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    static char buf[1 << 16];
    eg_status st = EG_OK;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { st = eg_fail(err, EG_ERR_IO, "%s: %s", src, strerror(errno)); break; }
        if (r == 0) break;
        for (ssize_t o = 0; o < r;) {
            ssize_t w = write(out, buf + o, (size_t)(r - o));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) { st = eg_fail(err, EG_ERR_IO, "%s: %s", tmp, strerror(w < 0 ? errno : ENOSPC)); break; }
            o += w;
        }
        if (st) break;
    }
    if (!st && fsync(out)) st = eg_fail(err, EG_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    close(in);
    if (close(out) && !st) st = eg_fail(err, EG_ERR_IO, "close %s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, dst)) st = eg_fail(err, EG_ERR_IO, "rename %s: %s", dst, strerror(errno));
    if (st) unlink(tmp);
    return st;
}

/* 1 when a and b are the same file or have the same bytes, 0 when not, -1 on error
 * (reported in *err). */
static int same_content(const char *a, const char *b, eg_error *err) {
    struct stat sa, sb;
    if (stat(a, &sa)) { eg_fail(err, EG_ERR_IO, "%s: %s", a, strerror(errno)); return -1; }
    if (stat(b, &sb)) { eg_fail(err, EG_ERR_IO, "%s: %s", b, strerror(errno)); return -1; }
    if (sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino) return 1;
    if (!S_ISREG(sa.st_mode) || !S_ISREG(sb.st_mode) || sa.st_size != sb.st_size) return 0;
    int fa = open(a, O_RDONLY | O_CLOEXEC), fb = open(b, O_RDONLY | O_CLOEXEC);
    char *ba = malloc(1 << 16), *bb = malloc(1 << 16);
    int res = 1;
    if (fa < 0 || fb < 0 || !ba || !bb) {
        res = -1;
        if (!ba || !bb) eg_fail(err, EG_ERR_NOMEM, "out of memory");
        else eg_fail(err, EG_ERR_IO, "%s: %s", fa < 0 ? a : b, strerror(errno));
    }
    while (res == 1) {
        ssize_t ra = read(fa, ba, 1 << 16);
        if (ra < 0 && errno == EINTR) continue;
        if (ra < 0) { res = -1; eg_fail(err, EG_ERR_IO, "%s: %s", a, strerror(errno)); break; }
        if (ra == 0) {
            char c;
            if (read(fb, &c, 1) != 0) res = 0;
            break;
        }
        ssize_t got = 0;
        while (got < ra) {
            ssize_t rb = read(fb, bb + got, (size_t)(ra - got));
            if (rb < 0 && errno == EINTR) continue;
            if (rb < 0) { res = -1; eg_fail(err, EG_ERR_IO, "%s: %s", b, strerror(errno)); break; }
            if (rb == 0) { res = 0; break; }
            got += rb;
        }
        if (res == 1 && memcmp(ba, bb, (size_t)ra)) res = 0;
    }
    if (fa >= 0) close(fa);
    if (fb >= 0) close(fb);
    free(ba);
    free(bb);
    return res;
}

/* Whether directory d is among dirs[n] (compared as real paths). */
static int dir_among(const char *d, const char *const *dirs, size_t n) {
    char a[PATH_MAX], b[PATH_MAX];
    if (!d || !realpath(d, a)) return 0;
    for (size_t k = 0; k < n; k++)
        if (realpath(dirs[k], b) && !strcmp(a, b)) return 1;
    return 0;
}

/* Whether an earlier merge's job ("merged_from": [{"dir"}...]) came from the same set of
 * directories as dirs. */
static int same_inputs(const char *job_json, const char *const *dirs, int n_dirs) {
    json_error_t je;
    json_t *job = job_json ? json_loads(job_json, 0, &je) : NULL;
    json_t *from = json_object_get(job, "merged_from");
    size_t n = json_array_size(from);
    const char **old = calloc(n + 1, sizeof *old);
    int ok = old && n > 0;
    for (size_t i = 0; ok && i < n; i++) old[i] = json_string_value(json_object_get(json_array_get(from, i), "dir"));
    for (size_t i = 0; ok && i < n; i++) ok = dir_among(old[i], dirs, (size_t)n_dirs);  /* each old dir is new */
    for (int k = 0; ok && k < n_dirs; k++) ok = dir_among(dirs[k], old, n);             /* and each new one old */
    free(old);
    json_decref(job);
    return ok;
}

/* One shard of the merge: where it comes from, and whether it stays where it is. */
typedef struct merge_item {
    char *src;  /* dirs[input]/file */
    int input;  /* index into dirs */
    int in_out; /* the input is out_dir itself: the shard is not linked */
    int worker; /* listed by a worker manifest */
} merge_item;

static int name_taken(const eg_ds_idset *names, const char *name) { return eg_ds_idset_get(names, name, NULL); }

/* A directory with workers' manifests is merged from those (eg_ds_find_manifests); a
 * manifest.json beside them (an earlier merge into it) must not list a shard none of them
 * lists: its samples would be left out without a word (say, `merge DIR OTHER --out DIR`
 * followed by a merge of DIR). */
static eg_status workers_cover(const char *dir, char **names, int nn, eg_error *err) {
    char mp[4096];
    snprintf(mp, sizeof mp, "%s/" EG_DS_MANIFEST, dir);
    if (nn < 1 || !strcmp(names[0], EG_DS_MANIFEST) || access(mp, F_OK)) return EG_OK;
    eg_ds_info top;
    eg_error e2 = {0};
    if (eg_ds_info_load(mp, &top, &e2)) return EG_OK; /* unreadable: not what is merged */
    eg_status st = EG_OK;
    eg_ds_idset listed = {0}; /* every shard the workers' manifests list, each manifest read once */
    for (int k = 0; k < nn && !st; k++) {
        char wp[4096];
        snprintf(wp, sizeof wp, "%s/%s", dir, names[k]);
        eg_ds_info w;
        if (eg_ds_info_load(wp, &w, &e2)) continue;
        for (int i = 0; i < w.n_shards && !st; i++) st = eg_ds_idset_put(&listed, w.shards[i].file, 0, err);
        eg_ds_info_clear(&w);
    }
    for (int s = 0; s < top.n_shards && !st; s++) {
        if (!eg_ds_idset_get(&listed, top.shards[s].file, NULL))
            st = eg_fail(err, EG_ERR_CONFIG,
                         "%s lists %s, which no worker manifest of %s lists: merge reads that directory's worker "
                         "manifests, so its samples would be left out (merge the inputs that manifest.json was "
                         "made from instead, or move it and its extra shards to a directory of their own)",
                         mp, top.shards[s].file, dir);
    }
    eg_ds_idset_clear(&listed);
    eg_ds_info_clear(&top);
    return st;
}

eg_status dataset_merge(const char *const *dirs, int n_dirs, const char *out_dir, eg_error *err) {
    return dataset_merge_note(dirs, n_dirs, out_dir, NULL, err);
}

eg_status dataset_merge_note(const char *const *dirs, int n_dirs, const char *out_dir, const char *note_json,
                             eg_error *err) {
    if (n_dirs < 1) return eg_fail(err, EG_ERR_INVALID, "no input directories");
    int made_out = 0;
    if (!mkdir(out_dir, 0755)) made_out = 1;
    else if (errno != EEXIST) return eg_fail(err, EG_ERR_IO, "mkdir %s: %s", out_dir, strerror(errno));
    char out_real[PATH_MAX];
    if (!realpath(out_dir, out_real)) {
        eg_status st = eg_fail(err, EG_ERR_IO, "%s: %s", out_dir, strerror(errno));
        if (made_out) rmdir(out_dir);
        return st;
    }
    eg_ds_info merged = {0};
    eg_ds_idset ids = {0}, files = {0};
    merge_item *items = NULL; /* [merged.n_shards] */
    char **created = NULL;    /* output files this call made */
    int n_created = 0;
    json_t *from = json_array();
    eg_status st = EG_OK;
    int have = 0;

    /* 1. read and check everything; nothing is created yet */
    for (int d = 0; d < n_dirs && !st; d++) {
        char **names = NULL;
        int nn = 0;
        char dreal[PATH_MAX];
        if (!realpath(dirs[d], dreal)) { st = eg_fail(err, EG_ERR_IO, "%s: %s", dirs[d], strerror(errno)); break; }
        if ((st = eg_ds_find_manifests(dirs[d], 1, &names, &nn, err))) break;
        if ((st = workers_cover(dirs[d], names, nn, err))) { eg_ds_free_names(names, nn); break; }
        int same = !strcmp(dreal, out_real);
        for (int k = 0; k < nn && !st; k++) {
            char mp[4096];
            snprintf(mp, sizeof mp, "%s/%s", dirs[d], names[k]);
            eg_ds_info m;
            if ((st = eg_ds_info_load(mp, &m, err))) break;
            if (!have) {
                if ((st = eg_ds_info_copy_desc(&merged, &m, err))) { eg_ds_info_clear(&m); break; }
                merged.worker_count = 0;
                merged.worker_index = 0;
                have = 1;
            } else if ((st = eg_ds_info_compatible(&merged, &m, err))) {
                eg_wrap(err, "merging %s", mp);
                eg_ds_info_clear(&m);
                break;
            }
            if (!merged.target_vocab_size) merged.target_vocab_size = m.target_vocab_size;
            if ((st = eg_ds_precision_add(&merged.precision_json, m.precision_json, err))) { eg_ds_info_clear(&m); break; }
            json_error_t je;
            json_array_append_new(from, json_pack("{s:s,s:s,s:o}", "dir", dirs[d], "manifest", names[k], "job",
                                                  json_loads(m.job_json, 0, &je) ?: json_object()));
            for (int s = 0; s < m.n_shards && !st; s++) {
                eg_ds_shard_info *si = &m.shards[s];
                char src[4096];
                snprintf(src, sizeof src, "%s/%s", dirs[d], si->file);
                eg_ds_trailer tr;
                eg_ds_index ix;
                uint64_t size;
                if ((st = eg_ds_shard_load_index(src, &tr, &ix, &size, err))) break;
                if ((int64_t)size != si->bytes || (int64_t)ix.n != si->samples) {
                    eg_ds_index_clear(&ix);
                    st = eg_fail(err, EG_ERR_FORMAT, "shard %s: size or sample count differs from %s", src, mp);
                    break;
                }
                int me = merged.n_shards;
                for (uint64_t i = 0; i < ix.n && !st; i++) {
                    int64_t first;
                    if (eg_ds_idset_get(&ids, ix.e[i].id, &first)) {
                        const merge_item *o = first < me ? &items[first] : NULL;
                        if (!o)
                            st = eg_fail(err, EG_ERR_FORMAT, "sample id %s appears twice in shard %s", ix.e[i].id, src);
                        else if (o->input == d)
                            st = eg_fail(err, EG_ERR_FORMAT, "sample id %s appears twice in input %s (%s and %s)",
                                         ix.e[i].id, dirs[d], o->src, src);
                        else
                            st = eg_fail(err, EG_ERR_FORMAT,
                                         "sample id %s is in two inputs: %s (%s) and %s (%s)", ix.e[i].id,
                                         dirs[o->input], o->src, dirs[d], src);
                    } else {
                        st = eg_ds_idset_put(&ids, ix.e[i].id, me, err);
                    }
                }
                eg_ds_index_clear(&ix);
                if (st) break;
                eg_ds_shard_info *q = realloc(merged.shards, sizeof *q * (size_t)(me + 1));
                if (!q) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
                merged.shards = q;
                merge_item *it = realloc(items, sizeof *it * (size_t)(me + 1));
                if (!it) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
                items = it;
                q[me] = *si;
                q[me].file = NULL; /* named in step 2 */
                items[me] = (merge_item){strdup(src), d, same, m.worker_count > 1};
                merged.n_shards++;
                if (!items[me].src) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
            }
            if (!st) {
                for (int c = 0; c < EG_DS_NCOUNTS; c++) merged.counts[c] += m.counts[c];
                st = eg_ds_hist_add(&merged.hist, &merged.hist_len, m.hist, m.hist_len, err);
            }
            eg_ds_info_clear(&m);
        }
        eg_ds_free_names(names, nn);
    }

    /* What out_dir's manifest.json lists must survive the merge: a single writer's own
       manifest (generate's, not a merge) is never replaced (its job's resume would then
       delete the shards it does not know), and an earlier merge only by a merge of the
       same DIRs (after workers resumed or were repaired) or by one that keeps every shard
       it lists (by content), so a merge of other inputs is not unlisted. */
    if (!st) {
        char mp[PATH_MAX + 32];
        snprintf(mp, sizeof mp, "%s/%s", out_dir, EG_DS_MANIFEST);
        struct stat sb;
        if (!stat(mp, &sb)) {
            eg_ds_info old;
            if ((st = eg_ds_info_load(mp, &old, err))) {
                eg_wrap(err, "--out %s holds a manifest.json merge cannot read (it would replace it)", out_dir);
            } else {
                if (old.worker_count != 0)
                    st = eg_fail(err, EG_ERR_CONFIG,
                                 "--out %s holds the dataset generate writes there (%s, worker %d/%d, not a merge): "
                                 "merging would replace its manifest, and a resume of that job would then delete "
                                 "the shards it does not list; merge into another directory",
                                 out_dir, mp, old.worker_index, old.worker_count);
                int same_dirs = !st && same_inputs(old.job_json, dirs, n_dirs);
                for (int k = 0; k < old.n_shards && !st && !same_dirs; k++) {
                    int kept = 0;
                    for (int i = 0; i < merged.n_shards && !kept; i++)
                        kept = !strcmp(merged.shards[i].sha256, old.shards[k].sha256);
                    if (!kept) { /* a shard whose bytes in out_dir are gone or damaged (set aside
                                    by repair in its worker's directory) loses nothing */
                        char sp[PATH_MAX + 512], hex[65];
                        eg_error ignored = {0};
                        snprintf(sp, sizeof sp, "%s/%s", out_dir, old.shards[k].file);
                        kept = eg_sha256_file(sp, hex, &ignored) || strcmp(hex, old.shards[k].sha256);
                    }
                    if (!kept)
                        st = eg_fail(err, EG_ERR_CONFIG,
                                     "--out %s holds an earlier merge (%s) listing shard %s, which this merge of other "
                                     "inputs would drop: merge into another directory, or give %s as an input too",
                                     out_dir, mp, old.shards[k].file, out_dir);
                }
                eg_ds_info_clear(&old);
            }
        }
    }

    /* 2. output names: shards already in out_dir keep theirs, then the linked ones */
    for (int pass = 0; pass < 2 && !st; pass++) {
        for (int i = 0; i < merged.n_shards && !st; i++) {
            merge_item *it = &items[i];
            if (it->in_out != !pass) continue;
            const char *file = strrchr(it->src, '/') + 1;
            char name[4096];
            if (it->in_out) {
                if (name_taken(&files, file)) {
                    st = eg_fail(err, EG_ERR_CONFIG, "shard %s is listed twice", it->src);
                    break;
                }
                snprintf(name, sizeof name, "%s", file);
            } else {
                if (it->worker) snprintf(name, sizeof name, "%s", file);
                else snprintf(name, sizeof name, "in%d-%s", it->input, file);
                for (int k = 2; name_taken(&files, name); k++) snprintf(name, sizeof name, "in%d.%d-%s", it->input, k, file);
            }
            if ((st = eg_ds_idset_put(&files, name, i, err))) break;
            if (!(merged.shards[i].file = strdup(name))) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        }
    }

    /* 3. link (or copy) the shards living elsewhere */
    if (!st) {
        created = calloc((size_t)merged.n_shards + 1, sizeof *created);
        if (!created) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < merged.n_shards && !st; i++) {
        if (items[i].in_out) continue;
        char dst[4096];
        snprintf(dst, sizeof dst, "%s/%s", out_dir, merged.shards[i].file);
        struct stat sb;
        if (!lstat(dst, &sb)) {
            eg_error e2 = {0};
            int same = same_content(items[i].src, dst, &e2);
            if (same < 0) { st = eg_fail(err, e2.code, "%s", e2.msg); break; }
            if (!same) {
                st = eg_fail(err, EG_ERR_CONFIG, "%s already exists and is not %s (a different file of that name)",
                             dst, items[i].src);
                break;
            }
            continue; /* the link of an earlier merge, or an identical copy */
        }
        if (errno != ENOENT) { st = eg_fail(err, EG_ERR_IO, "%s: %s", dst, strerror(errno)); break; }
        if (link(items[i].src, dst) && (st = copy_file(items[i].src, dst, err))) break;
        if (!(created[n_created] = strdup(dst))) {
            unlink(dst);
            st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
            break;
        }
        n_created++;
    }

    /* 4. the manifest, last */
    if (!st) st = eg_ds_fsync_dir(out_dir, err);
    if (!st) {
        json_t *job = json_pack("{s:o}", "merged_from", json_incref(from));
        json_error_t je;
        json_t *note = note_json ? json_loads(note_json, 0, &je) : NULL;
        if (json_is_object(note)) json_object_update(job, note);
        json_decref(note);
        free(merged.job_json);
        merged.job_json = json_dumps(job, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(job);
        if (!merged.job_json) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    if (!st) st = eg_ds_info_save(&merged, out_dir, EG_DS_MANIFEST, err);
    if (st) {
        for (int i = 0; i < n_created; i++) unlink(created[i]);
        if (n_created) eg_ds_fsync_dir(out_dir, NULL);
        if (made_out) rmdir(out_dir);
    }
    for (int i = 0; i < n_created; i++) free(created[i]);
    free(created);
    for (int i = 0; i < merged.n_shards; i++) free(items[i].src);
    free(items);
    json_decref(from);
    eg_ds_info_clear(&merged);
    eg_ds_idset_clear(&ids);
    eg_ds_idset_clear(&files);
    return st;
}
