/* dataset_merge: combine worker manifests into one manifest.json; see manifest.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

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

eg_status dataset_merge(const char *const *dirs, int n_dirs, const char *out_dir, eg_error *err) {
    if (n_dirs < 1) return eg_fail(err, EG_ERR_INVALID, "merge: no input directories");
    if (mkdir(out_dir, 0755) && errno != EEXIST) return eg_fail(err, EG_ERR_IO, "mkdir %s: %s", out_dir, strerror(errno));
    char out_real[PATH_MAX];
    if (!realpath(out_dir, out_real)) return eg_fail(err, EG_ERR_IO, "%s: %s", out_dir, strerror(errno));
    eg_ds_info merged = {0};
    eg_ds_idset ids = {0}, files = {0};
    json_t *from = json_array();
    eg_status st = EG_OK;
    int have = 0;
    for (int d = 0; d < n_dirs && !st; d++) {
        char **names = NULL;
        int nn = 0;
        char dreal[PATH_MAX];
        if (!realpath(dirs[d], dreal)) { st = eg_fail(err, EG_ERR_IO, "%s: %s", dirs[d], strerror(errno)); break; }
        if ((st = eg_ds_find_manifests(dirs[d], 1, &names, &nn, err))) break;
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
            json_error_t je;
            json_array_append_new(from, json_pack("{s:s,s:s,s:o}", "dir", dirs[d], "manifest", names[k], "job",
                                                  json_loads(m.job_json, 0, &je) ?: json_object()));
            for (int s = 0; s < m.n_shards && !st; s++) {
                eg_ds_shard_info *si = &m.shards[s];
                char src[4096], dst[4096];
                snprintf(src, sizeof src, "%s/%s", dirs[d], si->file);
                snprintf(dst, sizeof dst, "%s/%s", out_dir, si->file);
                if (eg_ds_idset_get(&files, si->file, NULL)) {
                    st = eg_fail(err, EG_ERR_CONFIG, "merge: two inputs have a shard named %s (%s)", si->file, src);
                    break;
                }
                if ((st = eg_ds_idset_put(&files, si->file, 0, err))) break;
                eg_ds_trailer tr;
                eg_ds_index ix;
                uint64_t size;
                if ((st = eg_ds_shard_load_index(src, &tr, &ix, &size, err))) break;
                if ((int64_t)size != si->bytes || (int64_t)ix.n != si->samples) {
                    eg_ds_index_clear(&ix);
                    st = eg_fail(err, EG_ERR_FORMAT, "shard %s: size or sample count differs from %s", src, mp);
                    break;
                }
                for (uint64_t i = 0; i < ix.n && !st; i++) {
                    if (eg_ds_idset_get(&ids, ix.e[i].id, NULL))
                        st = eg_fail(err, EG_ERR_FORMAT, "merge: sample id %s appears twice (again in shard %s)", ix.e[i].id, src);
                    else
                        st = eg_ds_idset_put(&ids, ix.e[i].id, 0, err);
                }
                eg_ds_index_clear(&ix);
                if (st) break;
                if (!same) {
                    if (!access(dst, F_OK)) {
                        st = eg_fail(err, EG_ERR_CONFIG, "merge: %s already exists", dst);
                        break;
                    }
                    if (link(src, dst) && (st = copy_file(src, dst, err))) break;
                }
                eg_ds_shard_info *q = realloc(merged.shards, sizeof *q * (size_t)(merged.n_shards + 1));
                if (!q) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
                merged.shards = q;
                q[merged.n_shards] = *si;
                q[merged.n_shards].file = strdup(si->file);
                if (!q[merged.n_shards].file) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
                merged.n_shards++;
            }
            if (!st) {
                for (int c = 0; c < EG_DS_NCOUNTS; c++) merged.counts[c] += m.counts[c];
                st = eg_ds_hist_add(&merged.hist, &merged.hist_len, m.hist, m.hist_len, err);
            }
            eg_ds_info_clear(&m);
        }
        eg_ds_free_names(names, nn);
    }
    if (!st) st = eg_ds_fsync_dir(out_dir, err);
    if (!st) {
        json_t *job = json_pack("{s:o}", "merged_from", json_incref(from));
        free(merged.job_json);
        merged.job_json = json_dumps(job, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(job);
        if (!merged.job_json) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    if (!st) st = eg_ds_info_save(&merged, out_dir, EG_DS_MANIFEST, err);
    json_decref(from);
    eg_ds_info_clear(&merged);
    eg_ds_idset_clear(&ids);
    eg_ds_idset_clear(&files);
    return st;
}
