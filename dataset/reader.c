/* Dataset reader; see reader.h. */
#include "dataset/reader.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/eg_hash.h"
#include "dataset/idset.h"

struct eg_ds_reader {
    int has_manifest;
    eg_ds_info info;
    int n;
    char **paths;     /* [n] */
    eg_ds_index *ix;  /* [n] */
    int64_t *first;   /* [n + 1] global index of each shard's first sample */
    eg_ds_idset ids;  /* id -> global index */
};

static eg_status pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path, eg_error *err) {
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
        if (r == 0) return eg_fail(err, EG_ERR_FORMAT, "%s: unexpected end of file at %" PRIu64, path, off);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return EG_OK;
}

eg_status eg_ds_shard_load_index(const char *path, eg_ds_trailer *tr, eg_ds_index *ix,
                                 uint64_t *file_size, eg_error *err) {
    memset(ix, 0, sizeof *ix);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return eg_fail(err, EG_ERR_IO, "shard %s: %s", path, strerror(errno));
    struct stat sb;
    eg_status st = EG_OK;
    uint8_t *ib = NULL;
    uint8_t tail[EG_DS_TRAILER_FROM_END];
    if (fstat(fd, &sb)) { st = eg_fail(err, EG_ERR_IO, "shard %s: %s", path, strerror(errno)); goto done; }
    uint64_t size = (uint64_t)sb.st_size;
    *file_size = size;
    if (size < 3 * 512 + EG_DS_TRAILER_FROM_END || size % 512) {
        st = eg_fail(err, EG_ERR_FORMAT, "shard %s: %" PRIu64 " bytes: truncated or not an eaglegen shard", path, size);
        goto done;
    }
    if ((st = pread_all(fd, tail, sizeof tail, size - EG_DS_TRAILER_FROM_END, path, err))) goto done;
    for (size_t i = 512; i < sizeof tail; i++)
        if (tail[i]) {
            st = eg_fail(err, EG_ERR_FORMAT, "shard %s: no tar end marker: truncated or not an eaglegen shard", path);
            goto done;
        }
    if ((st = eg_ds_trailer_decode(tail, tr, err))) goto done;
    uint64_t limit = size - EG_DS_TRAILER_FROM_END - 512; /* index data ends before the trailer header */
    if (tr->index_offset > limit || tr->index_size > limit - tr->index_offset || tr->index_size == 0) {
        st = eg_fail(err, EG_ERR_FORMAT, "trailer: index at %" PRIu64 "+%" PRIu64 " outside the file",
                     tr->index_offset, tr->index_size);
        goto done;
    }
    ib = malloc(tr->index_size);
    if (!ib) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    if ((st = pread_all(fd, ib, tr->index_size, tr->index_offset, path, err))) goto done;
    if ((st = eg_ds_index_decode(ib, tr->index_size, tr->index_raw_size, ix, err))) goto done;
    if (ix->n != tr->n_samples) {
        st = eg_fail(err, EG_ERR_FORMAT, "index holds %" PRIu64 " samples, trailer says %" PRIu64, ix->n, tr->n_samples);
        goto done;
    }
    if (ix->flags != tr->flags) {
        st = eg_fail(err, EG_ERR_FORMAT, "index flags 0x%x, trailer says 0x%x", (unsigned)ix->flags, (unsigned)tr->flags);
        goto done;
    }
    uint32_t known = EG_DS_FLAG_BF16_SPLIT | (tr->version >= 2 ? EG_DS_FLAG_FINAL_BOTH : 0);
    if (tr->flags & ~known) { /* FORMAT.md §5: other bits 0 (the Python loader refuses them too) */
        st = eg_fail(err, EG_ERR_FORMAT, "trailer: unknown flags 0x%x (version %u)", (unsigned)tr->flags, tr->version);
        goto done;
    }
    uint64_t prev_end = 0, tokens = 0;
    for (uint64_t i = 0; i < ix->n; i++) {
        const eg_ds_index_entry *e = &ix->e[i];
        if (e->offset < prev_end + 512 || e->size > tr->index_offset || e->offset > tr->index_offset - e->size ||
            e->size < EG_DS_RECORD_HEADER_SIZE || e->n_loss > e->T) {
            st = eg_fail(err, EG_ERR_FORMAT, "index entry %" PRIu64 " (id %s): bad offset/size", i, e->id);
            goto done;
        }
        prev_end = e->offset + e->size;
        tokens += e->T;
    }
    if (tokens != tr->n_tokens) st = eg_fail(err, EG_ERR_FORMAT, "index tokens %" PRIu64 " != trailer %" PRIu64, tokens, tr->n_tokens);
done:
    free(ib);
    close(fd);
    if (st) {
        eg_ds_index_clear(ix);
        if (err && !strstr(err->msg, path)) eg_wrap(err, "shard %s", path);
    }
    return st;
}

void dataset_close(eg_ds_reader *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        free(r->paths[i]);
        eg_ds_index_clear(&r->ix[i]);
    }
    free(r->paths);
    free(r->ix);
    free(r->first);
    eg_ds_info_clear(&r->info);
    eg_ds_idset_clear(&r->ids);
    free(r);
}

/* Combine worker manifests (unmerged dataset) into one info. */
static eg_status load_manifests(const char *dir, eg_ds_info *info, eg_error *err) {
    char **names;
    int nn;
    eg_status st = eg_ds_find_manifests(dir, 0, &names, &nn, err);
    if (st) return st;
    for (int k = 0; k < nn && !st; k++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, names[k]);
        eg_ds_info m;
        if ((st = eg_ds_info_load(p, &m, err))) break;
        if (k == 0) {
            *info = m;
            continue;
        }
        if ((st = eg_ds_info_compatible(info, &m, err))) {
            eg_wrap(err, "%s", p);
        } else {
            eg_ds_shard_info *q = realloc(info->shards, sizeof *q * (size_t)(info->n_shards + m.n_shards + 1));
            if (!q) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
            else {
                info->shards = q;
                memcpy(q + info->n_shards, m.shards, sizeof *q * (size_t)m.n_shards);
                info->n_shards += m.n_shards;
                m.n_shards = 0; /* file names moved */
                for (int c = 0; c < EG_DS_NCOUNTS; c++) info->counts[c] += m.counts[c];
                st = eg_ds_hist_add(&info->hist, &info->hist_len, m.hist, m.hist_len, err);
                if (!info->target_vocab_size) info->target_vocab_size = m.target_vocab_size;
            }
        }
        eg_ds_info_clear(&m);
    }
    if (st && nn > 0) eg_ds_info_clear(info);
    if (nn > 1) info->worker_count = 0;
    eg_ds_free_names(names, nn);
    return st;
}

eg_status dataset_open(const char *path, eg_ds_reader **out, eg_error *err) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb)) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
    eg_ds_reader *r = eg_calloc(1, sizeof *r, err);
    if (!r) return EG_ERR_NOMEM;
    eg_status st = EG_OK;
    int single = !S_ISDIR(sb.st_mode);
    if (single) {
        r->n = 1;
    } else {
        if ((st = load_manifests(path, &r->info, err))) goto fail;
        r->has_manifest = 1;
        r->n = r->info.n_shards;
    }
    r->paths = calloc((size_t)r->n + 1, sizeof *r->paths);
    r->ix = calloc((size_t)r->n + 1, sizeof *r->ix);
    r->first = calloc((size_t)r->n + 1, sizeof *r->first);
    if (!r->paths || !r->ix || !r->first) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < r->n; i++) {
        char p[4096];
        if (single) snprintf(p, sizeof p, "%s", path);
        else snprintf(p, sizeof p, "%s/%s", path, r->info.shards[i].file);
        r->paths[i] = strdup(p);
        if (!r->paths[i]) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto fail; }
        eg_ds_trailer tr;
        uint64_t size;
        if ((st = eg_ds_shard_load_index(p, &tr, &r->ix[i], &size, err))) goto fail;
        if (single) {
            r->info.n_aux = (int)r->ix[i].n_aux;
            r->info.hidden_size = (int64_t)r->ix[i].H;
            r->info.bf16_split = !!(tr.flags & EG_DS_FLAG_BF16_SPLIT);
            if (tr.flags & EG_DS_FLAG_FINAL_BOTH) r->info.final_source = EG_DS_FINAL_BOTH;
            r->info.format_version = (int)tr.version;
            r->info.n_shards = 1;
            r->info.shards = calloc(1, sizeof *r->info.shards);
            if (!r->info.shards || !(r->info.shards[0].file = strdup(path))) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto fail; }
            eg_ds_shard_info *s = &r->info.shards[0];
            s->samples = (int64_t)r->ix[i].n;
            s->bytes = (int64_t)size;
            for (uint64_t k = 0; k < r->ix[i].n; k++) {
                s->tokens += r->ix[i].e[k].T;
                s->loss_tokens += r->ix[i].e[k].n_loss;
                /* uncompressed tensors: ids, mask, aux and final hidden states (BF16) */
                s->raw_bytes += (int64_t)r->ix[i].e[k].T *
                                (5 + 2 * (int64_t)r->ix[i].H * ((int64_t)r->ix[i].n_aux + (tr.flags & EG_DS_FLAG_FINAL_BOTH ? 2 : 1)));
                if (r->ix[i].e[k].finish == EG_DS_FINISH_LENGTH) s->n_length++;
                else s->n_stop++;
            }
        } else {
            const eg_ds_shard_info *s = &r->info.shards[i];
            if ((int64_t)size != s->bytes) {
                st = eg_fail(err, EG_ERR_FORMAT, "shard %s: %" PRIu64 " bytes, manifest says %" PRId64 " (truncated or modified)", p, size, s->bytes);
                goto fail;
            }
            if ((int64_t)r->ix[i].n != s->samples || r->ix[i].n_aux != (uint32_t)r->info.n_aux ||
                r->ix[i].H != (uint64_t)r->info.hidden_size) {
                st = eg_fail(err, EG_ERR_FORMAT, "shard %s: index (%" PRIu64 " samples, n_aux %u, H %" PRIu64
                             ") disagrees with the manifest (%" PRId64 ", %d, %" PRId64 ")", p, r->ix[i].n,
                             r->ix[i].n_aux, r->ix[i].H, s->samples, r->info.n_aux, r->info.hidden_size);
                goto fail;
            }
        }
        r->first[i + 1] = r->first[i] + (int64_t)r->ix[i].n;
        for (uint64_t k = 0; k < r->ix[i].n; k++) {
            int64_t prev;
            if (eg_ds_idset_get(&r->ids, r->ix[i].e[k].id, &prev)) {
                st = eg_fail(err, EG_ERR_FORMAT, "shard %s, sample %" PRIu64 ": duplicate id %s (also sample %" PRId64 ")",
                             p, k, r->ix[i].e[k].id, prev);
                goto fail;
            }
            if ((st = eg_ds_idset_put(&r->ids, r->ix[i].e[k].id, r->first[i] + (int64_t)k, err))) goto fail;
        }
    }
    *out = r;
    return EG_OK;
fail:
    dataset_close(r);
    return st;
}

int64_t dataset_num_samples(const eg_ds_reader *r) { return r->first[r->n]; }
int dataset_num_shards(const eg_ds_reader *r) { return r->n; }
const eg_ds_info *dataset_info(const eg_ds_reader *r) { return &r->info; }
int dataset_has_manifest(const eg_ds_reader *r) { return r->has_manifest; }
const char *dataset_shard_path(const eg_ds_reader *r, int i) { return r->paths[i]; }
const eg_ds_index *dataset_shard_index(const eg_ds_reader *r, int i) { return &r->ix[i]; }
int64_t dataset_shard_first(const eg_ds_reader *r, int i) { return r->first[i]; }

const eg_ds_index_entry *dataset_entry(const eg_ds_reader *r, int64_t i, int *shard, int64_t *pos) {
    if (i < 0 || i >= r->first[r->n]) return NULL;
    int lo = 0, hi = r->n - 1;
    while (lo < hi) { /* last shard with first <= i */
        int mid = (lo + hi + 1) / 2;
        if (r->first[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    while (r->first[lo + 1] <= i) lo++; /* skip empty shards */
    if (shard) *shard = lo;
    if (pos) *pos = i - r->first[lo];
    return &r->ix[lo].e[i - r->first[lo]];
}

int64_t dataset_find(const eg_ds_reader *r, const char *id) {
    int64_t v;
    return eg_ds_idset_get(&r->ids, id, &v) ? v : -1;
}

eg_status dataset_read(const eg_ds_reader *r, int64_t i, int meta_only, eg_ds_sample *out, eg_error *err) {
    memset(out, 0, sizeof *out);
    int sh;
    int64_t k;
    const eg_ds_index_entry *e = dataset_entry(r, i, &sh, &k);
    if (!e) return eg_fail(err, EG_ERR_INVALID, "sample %" PRId64 " out of range (dataset has %" PRId64 ")", i, dataset_num_samples(r));
    const char *path = r->paths[sh];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return eg_fail(err, EG_ERR_IO, "shard %s: %s", path, strerror(errno));
    uint8_t *buf = malloc(e->size);
    eg_status st;
    if (!buf) st = eg_fail(err, EG_ERR_NOMEM, "out of memory (%" PRIu64 " bytes)", e->size);
    else if ((st = pread_all(fd, buf, e->size, e->offset, path, err)) == EG_OK &&
             (st = eg_ds_record_decode(buf, e->size, meta_only, out, err)) == EG_OK) {
        uint32_t n_loss = 0;
        if (!meta_only)
            for (int64_t t = 0; t < out->T; t++) n_loss += out->loss_mask[t];
        if (strcmp(out->id, e->id) || (uint64_t)out->T != e->T || out->finish != e->finish ||
            (!meta_only && n_loss != e->n_loss))
            st = eg_fail(err, EG_ERR_FORMAT, "record (id %s, %" PRId64 " tokens) disagrees with the index", out->id, out->T);
        else if ((uint64_t)out->n_aux != r->ix[sh].n_aux || (uint64_t)out->H != r->ix[sh].H)
            st = eg_fail(err, EG_ERR_FORMAT, "record shape n_aux %d H %" PRId64 " differs from the shard's", out->n_aux, out->H);
        else if (!meta_only && r->has_manifest && !out->final_pre_hidden != (r->info.final_source != EG_DS_FINAL_BOTH))
            st = eg_fail(err, EG_ERR_FORMAT, "record %s a pre-norm final state, the manifest says the dataset stores %s",
                         out->final_pre_hidden ? "holds" : "lacks", eg_ds_final_source_name(r->info.final_source));
        if (st) eg_ds_sample_clear(out);
    }
    free(buf);
    close(fd);
    if (st) eg_wrap(err, "shard %s, sample %" PRId64 " (#%" PRId64 " in shard, id %s)", path, i, k, e->id);
    return st;
}

eg_status dataset_verify_shard(const eg_ds_reader *r, int sh, eg_error *err) {
    const char *path = r->paths[sh];
    const eg_ds_index *ix = &r->ix[sh];
    eg_status st = EG_OK;
    if (r->has_manifest) {
        char hex[65];
        if ((st = eg_sha256_file(path, hex, err))) return eg_wrap(err, "shard %s", path);
        if (strcmp(hex, r->info.shards[sh].sha256))
            return eg_fail(err, EG_ERR_CHECKSUM, "shard %s: sha256 %s, manifest says %s", path, hex, r->info.shards[sh].sha256);
    }
    struct archive *a = archive_read_new();
    if (!a) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, path, 65536) != ARCHIVE_OK) {
        st = eg_fail(err, EG_ERR_FORMAT, "shard %s: tar: %s", path, archive_error_string(a));
        archive_read_free(a);
        return st;
    }
    struct archive_entry *ent;
    uint64_t k = 0;
    for (;; k++) {
        int rc = archive_read_next_header(a, &ent);
        if (rc == ARCHIVE_EOF) break;
        if (rc != ARCHIVE_OK) {
            st = eg_fail(err, EG_ERR_FORMAT, "shard %s: tar member %" PRIu64 ": %s", path, k, archive_error_string(a));
            break;
        }
        char want[32];
        uint64_t size = (uint64_t)archive_entry_size(ent);
        if (k < ix->n) snprintf(want, sizeof want, "%08" PRIu64 ".egs", k);
        else snprintf(want, sizeof want, "%s", k == ix->n ? EG_DS_INDEX_MEMBER : EG_DS_TRAILER_MEMBER);
        const char *name = archive_entry_pathname(ent);
        if (k > ix->n + 1 || !name || strcmp(name, want)) {
            st = eg_fail(err, EG_ERR_FORMAT, "shard %s: tar member %" PRIu64 " is '%s', expected '%s'%s", path, k,
                         name ? name : "?", k > ix->n + 1 ? "(end)" : want,
                         k < ix->n ? " (sample member missing or reordered)" : "");
            break;
        }
        if (k < ix->n) {
            uint64_t hdr = (uint64_t)archive_read_header_position(a);
            if (size != ix->e[k].size || hdr + 512 != ix->e[k].offset) {
                st = eg_fail(err, EG_ERR_FORMAT, "shard %s, sample #%" PRIu64 " (id %s): tar member at %" PRIu64
                             "+%" PRIu64 ", index says %" PRIu64 "+%" PRIu64, path, k, ix->e[k].id, hdr + 512,
                             size, ix->e[k].offset, ix->e[k].size);
                break;
            }
        } else if (k == ix->n + 1 && size != EG_DS_TRAILER_SIZE) {
            st = eg_fail(err, EG_ERR_FORMAT, "shard %s: trailer member has %" PRIu64 " bytes", path, size);
            break;
        }
    }
    if (!st && k != ix->n + 2)
        st = eg_fail(err, EG_ERR_FORMAT, "shard %s: %" PRIu64 " tar members, expected %" PRIu64, path, k, ix->n + 2);
    archive_read_free(a);
    return st;
}
