/* Crash-safe shard writer; see writer.h and docs/FORMAT.md ("Crash safety").
 *
 * Threads: the producer fills ring slots (EMPTY -> PENDING), compressors turn PENDING
 * slots into records (-> DONE) in any order, and the I/O thread consumes DONE slots
 * strictly in submission order, so shards hold samples in the order they were added. */
#include "common/eg_thread.h"
#include "dataset/writer.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/eg_hash.h"
#include "dataset/idset.h"
#include "dataset/reader.h"
#include "dataset/shardcheck.h"

enum { SLOT_EMPTY, SLOT_PENDING, SLOT_BUSY, SLOT_DONE };

typedef struct slot {
    int state;
    eg_ds_sample s;   /* owned copy; hidden buffers freed after encoding */
    size_t hid_bytes;
    uint8_t *rec;
    size_t rec_len;
    uint64_t raw;
    eg_status st;
    char msg[1024];
} slot;

struct eg_shard_writer {
    char *dir;
    char prefix[64];        /* "shard-" or "shard-w{I}of{N}-" */
    char manifest_name[64];
    int lock_fd, lock_borrowed; /* borrowed: the caller's (opts.lock_given), not closed here */
    eg_ds_info info;        /* committed state (I/O thread after open) */
    int64_t shard_samples;
    int64_t shard_bytes; /* 0 = no byte limit */
    int level, split;
    int64_t next_seq;

    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_io, cv_space;
    slot *ring;
    uint64_t cap, submitted, compress_next, written;
    int quit, flush_req, threads_started, io_started;
    eg_status sticky;
    char sticky_msg[1024];
    int64_t counts[EG_DS_NCOUNTS];
    char *job_json;
    eg_ds_idset ids;
    int64_t added;

    int n_workers, n_codecs;
    int64_t c_samples, c_tokens, c_shards, c_bytes, c_raw; /* committed, under mu */
    pthread_t *workers;
    eg_ds_codec **codecs;
    pthread_t io;

    /* current shard: I/O thread only */
    int fd;
    struct archive *ar;
    char tmp_path[4096], final_name[256];
    uint64_t pos;
    eg_sha256 sha;
    eg_ds_index ix;
    uint64_t ix_cap;
    uint64_t *hist;
    int64_t hist_len;
    eg_ds_shard_info cur;
    int write_errno;

    /* stamps of the shards whose hash is known good (shardcheck.h): resume, then I/O thread */
    eg_ds_stamps stamps;
    int64_t resume_checked, resume_hashed;
};

/* ---------------------------------------------------------------- names */
/* name == prefix + >=6 digits + suffix? *seq gets the number. */
static int match_name(const char *name, const char *prefix, const char *suffix, int64_t *seq) {
    size_t pl = strlen(prefix), nl = strlen(name), sl = strlen(suffix);
    if (nl < pl + 6 + sl || strncmp(name, prefix, pl) || strcmp(name + nl - sl, suffix)) return 0;
    int64_t v = 0;
    for (size_t i = pl; i < nl - sl; i++) {
        if (name[i] < '0' || name[i] > '9') return 0;
        v = v * 10 + (name[i] - '0');
    }
    if (seq) *seq = v;
    return 1;
}

static void set_sticky(eg_shard_writer *w, eg_status st, const char *msg) {
    pthread_mutex_lock(&w->mu);
    if (!w->sticky) {
        w->sticky = st;
        snprintf(w->sticky_msg, sizeof w->sticky_msg, "%s", msg);
    }
    pthread_cond_broadcast(&w->cv_space);
    pthread_cond_broadcast(&w->cv_io);
    pthread_mutex_unlock(&w->mu);
}

/* ---------------------------------------------------------------- shard files */
static la_ssize_t write_cb(struct archive *a, void *ctx, const void *buf, size_t n) {
    eg_shard_writer *w = ctx;
    const char *p = buf;
    size_t left = n;
    while (left) {
        ssize_t r = write(w->fd, p, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            w->write_errno = r < 0 ? errno : ENOSPC;
            archive_set_error(a, w->write_errno, "%s", strerror(w->write_errno));
            return -1;
        }
        p += r;
        left -= (size_t)r;
    }
    eg_sha256_update(&w->sha, buf, n);
    w->pos += n;
    return (la_ssize_t)n;
}

static eg_status ar_fail(eg_shard_writer *w, eg_error *err, const char *what) {
    return eg_fail(err, EG_ERR_IO, "%s: %s: %s", w->tmp_path, what,
                   w->write_errno ? strerror(w->write_errno) : archive_error_string(w->ar));
}

static eg_status shard_begin(eg_shard_writer *w, eg_error *err) {
    snprintf(w->final_name, sizeof w->final_name, "%s%06" PRId64 ".tar", w->prefix, w->next_seq);
    snprintf(w->tmp_path, sizeof w->tmp_path, "%s/%s.tmp", w->dir, w->final_name);
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", w->tmp_path, strerror(errno));
    w->pos = 0;
    w->write_errno = 0;
    eg_sha256_init(&w->sha);
    memset(&w->cur, 0, sizeof w->cur);
    w->ix.n = 0;
    w->ix.n_aux = (uint32_t)w->info.n_aux;
    w->ix.H = (uint64_t)w->info.hidden_size;
    w->ix.flags = (w->split ? EG_DS_FLAG_BF16_SPLIT : 0) | (w->info.final_source == EG_DS_FINAL_BOTH ? EG_DS_FLAG_FINAL_BOTH : 0);
    if (w->hist) memset(w->hist, 0, sizeof(uint64_t) * (size_t)w->hist_len);
    w->ar = archive_write_new();
    if (!w->ar || archive_write_set_format_pax_restricted(w->ar) != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(w->ar, 0) != ARCHIVE_OK ||
        archive_write_open2(w->ar, w, NULL, write_cb, NULL, NULL) != ARCHIVE_OK)
        return ar_fail(w, err, "cannot start tar");
    return EG_OK;
}

/* Write one tar member; *data_off gets the offset of its data. */
static eg_status member(eg_shard_writer *w, const char *name, const void *data, size_t n,
                        uint64_t *data_off, eg_error *err) {
    struct archive_entry *e = archive_entry_new();
    if (!e) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    archive_entry_set_pathname(e, name);
    archive_entry_set_size(e, (la_int64_t)n);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_mtime(e, time(NULL), 0);
    int r = archive_write_header(w->ar, e);
    archive_entry_free(e);
    if (r != ARCHIVE_OK) return ar_fail(w, err, name);
    *data_off = w->pos;
    const char *p = data;
    while (n) {
        la_ssize_t k = archive_write_data(w->ar, p, n);
        if (k <= 0) return ar_fail(w, err, name);
        p += k;
        n -= (size_t)k;
    }
    if (archive_write_finish_entry(w->ar) != ARCHIVE_OK) return ar_fail(w, err, name);
    return EG_OK;
}

static eg_status shard_append(eg_shard_writer *w, slot *sl, eg_error *err) {
    eg_status st;
    if (w->fd < 0 && (st = shard_begin(w, err))) return st;
    char name[32];
    snprintf(name, sizeof name, "%08" PRIu64 ".egs", w->ix.n);
    uint64_t off;
    if ((st = member(w, name, sl->rec, sl->rec_len, &off, err))) return st;
    if (w->ix.n == w->ix_cap) {
        uint64_t nc = w->ix_cap ? w->ix_cap * 2 : 256;
        eg_ds_index_entry *q = realloc(w->ix.e, sizeof *q * nc);
        if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        w->ix.e = q;
        w->ix_cap = nc;
    }
    const eg_ds_sample *s = &sl->s;
    uint32_t n_loss = 0;
    int32_t maxid = -1;
    for (int64_t t = 0; t < s->T; t++)
        if (s->loss_mask[t]) {
            n_loss++;
            if (s->input_ids[t] > maxid) maxid = s->input_ids[t];
        }
    if (maxid >= w->hist_len) {
        int64_t nl = (int64_t)maxid + 1;
        uint64_t *q = realloc(w->hist, sizeof(uint64_t) * (size_t)nl);
        if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (histogram)");
        memset(q + w->hist_len, 0, sizeof(uint64_t) * (size_t)(nl - w->hist_len));
        w->hist = q;
        w->hist_len = nl;
    }
    for (int64_t t = 0; t < s->T; t++)
        if (s->loss_mask[t]) w->hist[s->input_ids[t]]++;
    eg_ds_index_entry *e = &w->ix.e[w->ix.n++];
    e->offset = off;
    e->size = sl->rec_len;
    e->T = (uint32_t)s->T;
    e->n_loss = n_loss;
    e->finish = s->finish;
    e->id = s->id; /* ownership moves to the index */
    sl->s.id = NULL;
    w->cur.samples++;
    w->cur.tokens += s->T;
    w->cur.loss_tokens += n_loss;
    w->cur.raw_bytes += (int64_t)sl->raw;
    if (s->finish == EG_DS_FINISH_LENGTH) w->cur.n_length++;
    else w->cur.n_stop++;
    return EG_OK;
}

/* Finish the open shard and commit it: index + trailer, fsync, rename, fsync dir, then
 * the manifest (atomic). */
static eg_status shard_commit(eg_shard_writer *w, eg_error *err) {
    eg_status st;
    uint8_t *ixb = NULL;
    size_t ixn;
    uint64_t ixraw, ixoff, troff;
    if ((st = eg_ds_index_encode(&w->ix, w->level, &ixb, &ixn, &ixraw, err))) return st;
    st = member(w, EG_DS_INDEX_MEMBER, ixb, ixn, &ixoff, err);
    free(ixb);
    if (st) return st;
    eg_ds_trailer tr = {EG_DS_FORMAT_VERSION, w->ix.flags, ixoff, ixn, ixraw, w->ix.n,
                        (uint64_t)w->cur.tokens};
    uint8_t tb[EG_DS_TRAILER_SIZE];
    eg_ds_trailer_encode(&tr, tb);
    if ((st = member(w, EG_DS_TRAILER_MEMBER, tb, sizeof tb, &troff, err))) return st;
    if (archive_write_close(w->ar) != ARCHIVE_OK) return ar_fail(w, err, "closing tar");
    archive_write_free(w->ar);
    w->ar = NULL;
    if (troff + EG_DS_TRAILER_FROM_END != w->pos)
        return eg_fail(err, EG_ERR_FORMAT, "%s: trailer at %" PRIu64 " of %" PRIu64
                       " bytes (libarchive layout changed?)", w->tmp_path, troff, w->pos);
    if (fsync(w->fd)) return eg_fail(err, EG_ERR_IO, "fsync %s: %s", w->tmp_path, strerror(errno));
    int r = close(w->fd);
    w->fd = -1;
    if (r) return eg_fail(err, EG_ERR_IO, "close %s: %s", w->tmp_path, strerror(errno));
    char fin[4096];
    snprintf(fin, sizeof fin, "%s/%s", w->dir, w->final_name);
    if (rename(w->tmp_path, fin)) return eg_fail(err, EG_ERR_IO, "rename %s: %s", fin, strerror(errno));
    if ((st = eg_ds_fsync_dir(w->dir, err))) return st;
    eg_ds_stamp stamp; /* hashed as written: known good as it is now */
    if (eg_ds_stamp_of(fin, &stamp) && (st = eg_ds_stamps_set(&w->stamps, w->final_name, &stamp, err))) return st;
    uint8_t dg[32];
    eg_sha256_final(&w->sha, dg);
    eg_sha256_to_hex(dg, w->cur.sha256);
    w->cur.bytes = (int64_t)w->pos;
    w->cur.file = strdup(w->final_name);
    eg_ds_shard_info *q = realloc(w->info.shards, sizeof *q * (size_t)(w->info.n_shards + 1));
    if (!w->cur.file || !q) {
        free(w->cur.file);
        if (q) w->info.shards = q;
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    w->info.shards = q;
    w->info.shards[w->info.n_shards++] = w->cur;
    memset(&w->cur, 0, sizeof w->cur);
    if ((st = eg_ds_hist_add(&w->info.hist, &w->info.hist_len, w->hist, w->hist_len, err))) return st;
    for (uint64_t i = 0; i < w->ix.n; i++) free(w->ix.e[i].id);
    w->ix.n = 0;
    w->next_seq++;
    pthread_mutex_lock(&w->mu);
    memcpy(w->info.counts, w->counts, sizeof w->counts);
    char *job = strdup(w->job_json);
    pthread_mutex_unlock(&w->mu);
    if (!job) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    free(w->info.job_json);
    w->info.job_json = job;
    if ((st = eg_ds_info_save(&w->info, w->dir, w->manifest_name, err))) return st;
    /* after the manifest: a crash between the two only costs a hash at the next resume */
    if ((st = eg_ds_stamps_save(w->dir, w->manifest_name, &w->stamps, &w->info, err))) return st;
    eg_ds_totals t = eg_ds_info_totals(&w->info);
    pthread_mutex_lock(&w->mu);
    w->c_samples = t.samples;
    w->c_tokens = t.tokens;
    w->c_bytes = t.bytes;
    w->c_raw = t.raw_bytes;
    w->c_shards = w->info.n_shards;
    pthread_mutex_unlock(&w->mu);
    return EG_OK;
}

/* Drop the unfinished shard (free without close). */
static void shard_abandon(eg_shard_writer *w) {
    if (w->ar) archive_write_free(w->ar); /* may try to write the end marker: harmless */
    w->ar = NULL;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp_path);
    }
    w->fd = -1;
}

/* ---------------------------------------------------------------- threads */
static void *compress_main(void *arg) {
    void **a = arg;
    eg_shard_writer *w = a[0];
    eg_ds_codec *c = a[1];
    free(a);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->quit && w->compress_next == w->submitted) pthread_cond_wait(&w->cv_work, &w->mu);
        if (w->compress_next == w->submitted) break; /* quit */
        slot *sl = &w->ring[w->compress_next++ % w->cap];
        sl->state = SLOT_BUSY;
        pthread_mutex_unlock(&w->mu);
        eg_error e = {0};
        sl->st = eg_ds_record_encode(c, &sl->s, &sl->rec, &sl->rec_len, &sl->raw, &e);
        if (sl->st) snprintf(sl->msg, sizeof sl->msg, "%s", e.msg);
        free(sl->s.aux_hidden);
        free(sl->s.final_hidden);
        free(sl->s.final_pre_hidden);
        sl->s.aux_hidden = sl->s.final_hidden = sl->s.final_pre_hidden = NULL;
        pthread_mutex_lock(&w->mu);
        sl->state = SLOT_DONE;
        pthread_cond_broadcast(&w->cv_io);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void slot_release(slot *sl) {
    eg_ds_sample_clear(&sl->s);
    free(sl->rec);
    sl->rec = NULL;
    sl->state = SLOT_EMPTY;
}

static void *io_main(void *arg) {
    eg_shard_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        slot *sl = w->written < w->submitted ? &w->ring[w->written % w->cap] : NULL;
        if (sl && sl->state == SLOT_DONE) {
            int dead = w->sticky != EG_OK;
            pthread_mutex_unlock(&w->mu);
            eg_error e = {0};
            eg_status st = EG_OK;
            if (!dead) {
                if (sl->st) st = eg_fail(&e, sl->st, "%s", sl->msg);
                else if ((st = shard_append(w, sl, &e)) == EG_OK &&
                         (w->ix.n >= (uint64_t)w->shard_samples || (w->shard_bytes > 0 && w->pos >= (uint64_t)w->shard_bytes)))
                    st = shard_commit(w, &e);
                if (st) set_sticky(w, st, e.msg);
            }
            slot_release(sl);
            pthread_mutex_lock(&w->mu);
            w->written++;
            pthread_cond_broadcast(&w->cv_space);
            continue;
        }
        if (w->flush_req && w->written == w->submitted) {
            if (w->fd >= 0 && !w->sticky) {
                pthread_mutex_unlock(&w->mu);
                eg_error e = {0};
                eg_status st = shard_commit(w, &e);
                if (st) set_sticky(w, st, e.msg);
                pthread_mutex_lock(&w->mu);
            } else if (w->fd < 0 && !w->sticky && w->flush_req == 2) {
                /* close with nothing pending still rewrites the manifest (counts, job) */
                eg_error e = {0};
                memcpy(w->info.counts, w->counts, sizeof w->counts);
                char *job = strdup(w->job_json);
                pthread_mutex_unlock(&w->mu);
                if (job) { free(w->info.job_json); w->info.job_json = job; }
                eg_status st = eg_ds_info_save(&w->info, w->dir, w->manifest_name, &e);
                if (st) set_sticky(w, st, e.msg);
                pthread_mutex_lock(&w->mu);
            }
            w->flush_req = 0;
            pthread_cond_broadcast(&w->cv_space);
            continue;
        }
        if (w->quit && w->written == w->submitted) break;
        pthread_cond_wait(&w->cv_io, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---------------------------------------------------------------- open */
/* The shard name prefix and manifest name of a writer of o. */
static void names_of(const eg_shard_writer_opts *o, char *prefix, size_t np, char *manifest, size_t nm) {
    if (o->worker_count > 1) {
        snprintf(prefix, np, "shard-w%dof%d-", o->worker_index, o->worker_count);
        snprintf(manifest, nm, "manifest.w%dof%d.json", o->worker_index, o->worker_count);
    } else {
        snprintf(prefix, np, "shard-");
        snprintf(manifest, nm, "%s", EG_DS_MANIFEST);
    }
}

void shard_writer_lock_path(const char *dir, const eg_shard_writer_opts *o, char *out, size_t n) {
    char prefix[64], man[64];
    names_of(o, prefix, sizeof prefix, man, sizeof man);
    snprintf(out, n, "%s/.lock.%s", dir, man);
}

eg_status shard_writer_lock(const char *dir, const eg_shard_writer_opts *o, int *fd, eg_error *err) {
    char prefix[64], man[64], p[4096];
    names_of(o, prefix, sizeof prefix, man, sizeof man);
    shard_writer_lock_path(dir, o, p, sizeof p);
    *fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", p, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB)) {
        close(*fd);
        *fd = -1;
        return eg_fail(err, EG_ERR_IO, "%s: another writer is using this dataset (%s)", dir, man);
    }
    return EG_OK;
}
static eg_status desc_from_opts(eg_ds_info *d, const eg_shard_writer_opts *o, eg_error *err) {
    eg_ds_info tmp = {0};
    tmp.format_version = EG_DS_FORMAT_VERSION;
    tmp.model_name = (char *)(o->model_name ? o->model_name : "");
    tmp.model_config_sha256 = (char *)(o->model_config_sha256 ? o->model_config_sha256 : "");
    tmp.model_weights_sha256 = (char *)(o->model_weights_sha256 ? o->model_weights_sha256 : "");
    tmp.tokenizer_sha256 = (char *)(o->tokenizer_sha256 ? o->tokenizer_sha256 : "");
    tmp.chat_template = (char *)(o->chat_template ? o->chat_template : "");
    tmp.thinking = !!o->thinking;
    tmp.n_aux = o->n_aux;
    tmp.aux_layers = (int *)o->aux_layers;
    tmp.hidden_size = o->hidden_size;
    tmp.target_vocab_size = o->target_vocab_size;
    tmp.final_source = o->final_source;
    tmp.n_layers = o->n_layers;
    tmp.zstd_level = o->zstd_level ? o->zstd_level : 3;
    tmp.bf16_split = !o->no_bf16_split;
    tmp.job_json = (char *)(o->job_json ? o->job_json : "{}");
    tmp.worker_index = o->worker_count > 1 ? o->worker_index : 0;
    tmp.worker_count = o->worker_count > 1 ? o->worker_count : 1;
    eg_status st = eg_ds_info_copy_desc(d, &tmp, err);
    if (!st && (st = eg_ds_precision_add(&d->precision_json, o->precision_json, err))) eg_ds_info_clear(d);
    return st;
}

/* Remove our *.tmp files and our shards the manifest does not list. */
static eg_status clean_dir(eg_shard_writer *w, eg_error *err) {
    DIR *d = opendir(w->dir);
    if (!d) return eg_fail(err, EG_ERR_IO, "%s: %s", w->dir, strerror(errno));
    struct dirent *e;
    char mtmp[80];
    snprintf(mtmp, sizeof mtmp, "%s.tmp", w->manifest_name);
    int removed = 0;
    while ((e = readdir(d))) {
        int64_t seq;
        int kill = 0;
        if (!strcmp(e->d_name, mtmp) || match_name(e->d_name, w->prefix, ".tar.tmp", &seq)) kill = 1;
        else if (match_name(e->d_name, w->prefix, ".tar", &seq)) {
            kill = 1;
            for (int i = 0; i < w->info.n_shards; i++)
                if (!strcmp(w->info.shards[i].file, e->d_name)) kill = 0;
        }
        if (kill) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", w->dir, e->d_name);
            if (unlink(p) && errno != ENOENT) {
                closedir(d);
                return eg_fail(err, EG_ERR_IO, "removing leftover %s: %s", p, strerror(errno));
            }
            removed++;
        }
    }
    closedir(d);
    return removed ? eg_ds_fsync_dir(w->dir, err) : EG_OK;
}

/* The other manifests of dir, which readers take together with (or instead of) this
 * writer's: checked now rather than by the merge or the reader that would refuse the
 * result after the run. A worker's must describe one dataset with them (another
 * checkpoint of the same config, say; workers of any count, which readers take alike);
 * a single writer's manifest.json beside workers, either way round, is refused: readers
 * take manifest.json when it is there, so the workers' samples would not be seen (or
 * this writer's). A merged manifest.json (merge DIR --out DIR) may sit beside workers.
 * Manifests that cannot be read are left to the readers. */
static eg_status check_neighbours(const eg_shard_writer *w, const char *dir, const eg_ds_info *want, eg_error *err) {
    char **names = NULL, top[4096];
    int n = 0;
    eg_error none = {0};
    snprintf(top, sizeof top, "%s/" EG_DS_MANIFEST, dir);
    eg_status st = EG_OK;
    if (want->worker_count > 1 && !access(top, F_OK)) {
        eg_ds_info m;
        eg_error e2 = {0};
        if (!eg_ds_info_load(top, &m, &e2)) {
            if (m.worker_count > 0)
                st = eg_fail(err, EG_ERR_CONFIG, "%s is a single writer's dataset: readers take it and would not see "
                             "this worker's; write the workers into a directory of their own", top);
            else if ((st = eg_ds_info_compatible(&m, want, err)))
                eg_wrap(err, "%s, a merge of this dataset's workers", top);
            eg_ds_info_clear(&m);
        }
        if (st) return st;
    }
    if (eg_ds_find_manifests(dir, 1, &names, &n, &none)) return EG_OK; /* none yet */
    for (int i = 0; i < n && !st; i++) {
        if (!strcmp(names[i], w->manifest_name) || strncmp(names[i], "manifest.w", 10)) continue;
        if (want->worker_count <= 1) {
            st = eg_fail(err, EG_ERR_CONFIG, "%s/%s: workers write this directory; a single writer's %s would hide "
                         "them from readers: write it into a directory of its own", dir, names[i], EG_DS_MANIFEST);
            break;
        }
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        eg_ds_info m;
        eg_error e2 = {0};
        if (eg_ds_info_load(p, &m, &e2)) continue;
        if ((st = eg_ds_info_compatible(&m, want, err)))
            eg_wrap(err, "%s, another worker of this dataset", p);
        eg_ds_info_clear(&m);
    }
    eg_ds_free_names(names, n);
    return st;
}

/* A merged manifest.json in dir (merge DIR --out DIR, or a merge's output) may list
 * shards under this worker's names that its own manifest does not (a merge's output,
 * which has no worker manifests; a worker started over): cleaning up and writing anew
 * would replace them under that manifest. */
static eg_status check_merged_names(const eg_shard_writer *w, eg_error *err) {
    char top[4096];
    snprintf(top, sizeof top, "%s/" EG_DS_MANIFEST, w->dir);
    eg_ds_info m;
    eg_error e2 = {0};
    if (w->info.worker_count <= 1 || access(top, F_OK) || eg_ds_info_load(top, &m, &e2)) return EG_OK;
    eg_status st = EG_OK;
    size_t np = strlen(w->prefix);
    for (int s = 0; s < m.n_shards && !st; s++) {
        if (strncmp(m.shards[s].file, w->prefix, np)) continue;
        int mine = 0;
        for (int i = 0; i < w->info.n_shards && !mine; i++) mine = !strcmp(w->info.shards[i].file, m.shards[s].file);
        if (!mine)
            st = eg_fail(err, EG_ERR_CONFIG, "%s (a merge) lists %s, which this worker's %s does not: starting the "
                         "worker here would replace it; run it in another directory, or remove %s first", top,
                         m.shards[s].file, w->manifest_name, top);
    }
    eg_ds_info_clear(&m);
    return st;
}

static eg_status load_existing(eg_shard_writer *w, const char *mpath, const eg_ds_info *want, int threads,
                               eg_error *err) {
    eg_status st = eg_ds_info_load(mpath, &w->info, err);
    if (st) return st;
    if (w->info.format_version != EG_DS_FORMAT_VERSION)
        return eg_fail(err, EG_ERR_CONFIG, "resuming %s: it holds format version %d data; this build writes version %d "
                       "(finish it with the eaglegen that started it, or start a new dataset)",
                       mpath, w->info.format_version, EG_DS_FORMAT_VERSION);
    if ((st = eg_ds_info_compatible(&w->info, want, err))) return eg_wrap(err, "resuming %s", mpath);
    if (!w->info.n_layers) w->info.n_layers = want->n_layers;
    if (!*w->info.model_weights_sha256 && *want->model_weights_sha256) { /* data made before it was recorded */
        free(w->info.model_weights_sha256);
        if (!(w->info.model_weights_sha256 = strdup(want->model_weights_sha256)))
            return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    if (!w->info.target_vocab_size) w->info.target_vocab_size = want->target_vocab_size;
    w->info.zstd_level = w->level;
    w->info.bf16_split = w->split;
    memcpy(w->counts, w->info.counts, sizeof w->counts);
    free(w->job_json);
    w->job_json = strdup(want->job_json);
    if (!w->job_json) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    if ((st = eg_ds_precision_add(&w->info.precision_json, want->precision_json, err))) return st;
    /* every committed shard must still be what was committed: size, SHA-256, index */
    if (w->info.n_shards > 0) {
        eg_ds_shard_check *ck = eg_calloc((size_t)w->info.n_shards, sizeof *ck, err);
        if (!ck) return EG_ERR_NOMEM;
        int n_bad = 0;
        if (!(st = eg_ds_stamps_load(w->dir, w->manifest_name, &w->stamps, err)))
            st = eg_ds_check_shards(w->dir, &w->info, threads, &w->stamps, ck, &n_bad, err);
        for (int i = 0; !st && !n_bad && i < w->info.n_shards; i++) {
            w->resume_checked++;
            w->resume_hashed += ck[i].hashed;
            st = eg_ds_stamps_set(&w->stamps, w->info.shards[i].file, &ck[i].stamp, err);
        }
        if (!st && !n_bad) st = eg_ds_stamps_save(w->dir, w->manifest_name, &w->stamps, &w->info, err);
        for (int i = 0; !st && i < w->info.n_shards; i++)
            if (ck[i].state != EG_DS_SHARD_OK) {
                char more[64] = "";
                if (n_bad > 1) snprintf(more, sizeof more, " (%d damaged shards in all)", n_bad);
                st = eg_fail(err, EG_ERR_FORMAT,
                             "resuming %s: committed shard %s is damaged (%s: %s)%s; `eaglegen repair %s` "
                             "sets damaged shards aside, and a rerun then regenerates exactly their samples",
                             w->dir, w->info.shards[i].file, eg_ds_shard_state_name(ck[i].state), ck[i].why,
                             more, w->dir);
                break;
            }
        free(ck);
        if (st) return st;
    }
    /* the manifest written at open already carries this run's job (e.g. its state) */
    free(w->info.job_json);
    if (!(w->info.job_json = strdup(want->job_json))) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    for (int i = 0; i < w->info.n_shards; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", w->dir, w->info.shards[i].file);
        eg_ds_trailer tr;
        eg_ds_index ix;
        uint64_t size;
        if ((st = eg_ds_shard_load_index(p, &tr, &ix, &size, err)))
            return eg_wrap(err, "resuming: committed shard damaged");
        if ((int64_t)size != w->info.shards[i].bytes || (int64_t)ix.n != w->info.shards[i].samples) {
            eg_ds_index_clear(&ix);
            return eg_fail(err, EG_ERR_FORMAT, "resuming: %s: size or sample count differs from the manifest", p);
        }
        for (uint64_t k = 0; k < ix.n && !st; k++) st = eg_ds_idset_put(&w->ids, ix.e[k].id, 0, err);
        eg_ds_index_clear(&ix);
        if (st) return st;
        int64_t seq;
        if (match_name(w->info.shards[i].file, w->prefix, ".tar", &seq) && seq >= w->next_seq)
            w->next_seq = seq + 1;
    }
    return EG_OK;
}

eg_status shard_writer_open(const char *dir, const eg_shard_writer_opts *o, eg_shard_writer **out,
                            eg_error *err) {
    *out = NULL;
    if (o->n_aux < 0 || o->hidden_size < 1 || (o->n_aux && !o->aux_layers))
        return eg_fail(err, EG_ERR_INVALID, "shard writer: bad shape (n_aux %d, hidden_size %" PRId64 ")",
                       o->n_aux, o->hidden_size);
    if (o->worker_count > 1 && (o->worker_index < 0 || o->worker_index >= o->worker_count))
        return eg_fail(err, EG_ERR_INVALID, "worker index %d of %d", o->worker_index, o->worker_count);
    if (o->zstd_level < 0 || o->zstd_level > 22) return eg_fail(err, EG_ERR_INVALID, "zstd level %d", o->zstd_level);
    if (o->final_source != EG_DS_FINAL_POST_NORM && o->final_source != EG_DS_FINAL_PRE_NORM &&
        o->final_source != EG_DS_FINAL_BOTH)
        return eg_fail(err, EG_ERR_INVALID, "shard writer: final source %d", (int)o->final_source);
    if (o->n_layers < 0) return eg_fail(err, EG_ERR_INVALID, "shard writer: %d decoder layers", o->n_layers);
    for (int i = 0; i < o->n_aux; i++) {
        /* serving engines emit aux states in ascending layer order; a drafter trained on
         * another order reads them in the wrong slots */
        if (i > 0 && o->aux_layers[i] <= o->aux_layers[i - 1])
            return eg_fail(err, EG_ERR_INVALID, "aux layers must be ascending and distinct (layer %d after %d): "
                           "serving engines hand the drafter its aux states in ascending layer order",
                           o->aux_layers[i], o->aux_layers[i - 1]);
        if (o->aux_layers[i] < -1 || (o->n_layers > 0 && o->aux_layers[i] >= o->n_layers))
            return eg_fail(err, EG_ERR_INVALID, "aux layer %d outside -1..%d", o->aux_layers[i],
                           o->n_layers > 0 ? o->n_layers - 1 : INT32_MAX);
    }
    eg_shard_writer *w = eg_calloc(1, sizeof *w, err);
    if (!w) return EG_ERR_NOMEM;
    w->fd = -1;
    w->lock_fd = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_io, NULL);
    pthread_cond_init(&w->cv_space, NULL);
    eg_status st = EG_OK;
    eg_ds_info want = {0};
    w->dir = strdup(dir);
    w->level = o->zstd_level ? o->zstd_level : 3;
    w->split = !o->no_bf16_split;
    w->shard_samples = o->shard_samples > 0 ? o->shard_samples : o->shard_samples < 0 ? INT64_MAX : 1000;
    w->shard_bytes = o->shard_bytes > 0 ? o->shard_bytes : 0;
    if (!w->dir) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto fail; }
    names_of(o, w->prefix, sizeof w->prefix, w->manifest_name, sizeof w->manifest_name);
    json_object_seed(0); /* jansson's one-time hash seeding, before our threads start */
    if ((st = desc_from_opts(&want, o, err))) goto fail;
    {
        json_error_t je;
        json_t *job = json_loads(want.job_json, 0, &je);
        int ok = job && json_is_object(job);
        json_decref(job);
        if (!ok) { st = eg_fail(err, EG_ERR_INVALID, "job description is not a JSON object"); goto fail; }
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        st = eg_fail(err, EG_ERR_IO, "mkdir %s: %s", dir, strerror(errno));
        goto fail;
    }
    char p[4096];
    if (o->lock_given) w->lock_fd = o->lock_fd, w->lock_borrowed = 1;
    else if ((st = shard_writer_lock(dir, o, &w->lock_fd, err))) goto fail;
    if ((st = check_neighbours(w, dir, &want, err))) goto fail;
    snprintf(p, sizeof p, "%s/%s", dir, w->manifest_name);
    if (!access(p, F_OK)) {
        if (!o->resume) {
            st = eg_fail(err, EG_ERR_INVALID, "%s already exists (resume it, or choose a new directory)", p);
            goto fail;
        }
        if ((st = load_existing(w, p, &want, o->threads, err))) goto fail;
    } else {
        w->info = want;
        memset(&want, 0, sizeof want);
        w->job_json = strdup(w->info.job_json);
        if (!w->job_json) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto fail; }
    }
    if ((st = check_merged_names(w, err)) || (st = clean_dir(w, err))) goto fail;
    {
        eg_ds_totals t = eg_ds_info_totals(&w->info);
        w->c_samples = t.samples;
        w->c_tokens = t.tokens;
        w->c_bytes = t.bytes;
        w->c_raw = t.raw_bytes;
        w->c_shards = w->info.n_shards;
    }
    if ((st = eg_ds_info_save(&w->info, dir, w->manifest_name, err))) goto fail;

    int nt = o->threads > 0 ? o->threads : eg_num_threads();
    w->cap = (uint64_t)(o->queue_depth > 0 ? o->queue_depth : 2 * nt + 2);
    w->ring = calloc(w->cap, sizeof *w->ring);
    w->workers = calloc((size_t)nt, sizeof *w->workers);
    w->codecs = calloc((size_t)nt, sizeof *w->codecs);
    if (!w->ring || !w->workers || !w->codecs) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < nt; i++) {
        if ((st = eg_ds_codec_new(w->level, w->split, &w->codecs[i], err))) goto fail;
        w->n_codecs = i + 1;
        void **a = malloc(2 * sizeof(void *));
        if (!a) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto fail; }
        a[0] = w;
        a[1] = w->codecs[i];
        if (eg_thread_start(&w->workers[i], compress_main, a)) {
            free(a);
            st = eg_fail(err, EG_ERR_NOMEM, "cannot start compression thread");
            goto fail;
        }
        w->n_workers = i + 1;
    }
    if (eg_thread_start(&w->io, io_main, w)) {
        st = eg_fail(err, EG_ERR_NOMEM, "cannot start I/O thread");
        goto fail;
    }
    w->io_started = 1;
    eg_ds_info_clear(&want);
    *out = w;
    return EG_OK;
fail:
    eg_ds_info_clear(&want);
    shard_writer_free(w);
    return st;
}

/* ---------------------------------------------------------------- producer side */
static eg_status sticky_err(eg_shard_writer *w, eg_error *err) {
    return eg_fail(err, w->sticky, "shard writer %s: %s", w->dir, w->sticky_msg);
}

eg_status shard_writer_add(eg_shard_writer *w, const eg_ds_sample *s, eg_error *err) {
    const char *id = s->id ? s->id : "";
    if (!*id) return eg_fail(err, EG_ERR_INVALID, "sample without id");
    if (s->n_aux != w->info.n_aux || s->H != w->info.hidden_size || s->T < 1 || s->T > UINT32_MAX)
        return eg_fail(err, EG_ERR_INVALID, "sample %s: shape T=%" PRId64 " n_aux=%d H=%" PRId64
                       ", dataset has n_aux=%d H=%" PRId64, id, s->T, s->n_aux, s->H, w->info.n_aux,
                       w->info.hidden_size);
    if (!s->input_ids || !s->loss_mask || (!s->aux_hidden && s->n_aux) || !s->final_hidden)
        return eg_fail(err, EG_ERR_INVALID, "sample %s: missing tensor", id);
    if (!s->final_pre_hidden != (w->info.final_source != EG_DS_FINAL_BOTH))
        return eg_fail(err, EG_ERR_INVALID, "sample %s: %s pre-norm final state, the dataset stores %s", id,
                       s->final_pre_hidden ? "has a" : "lacks the", eg_ds_final_source_name(w->info.final_source));
    for (int64_t t = 0; t < s->T; t++) {
        if (s->loss_mask[t] > 1) return eg_fail(err, EG_ERR_INVALID, "sample %s: loss_mask[%" PRId64 "] = %u", id, t, s->loss_mask[t]);
        /* an unknown vocabulary (0) still bounds the ids: the manifest's histogram is
           refused by its readers past EG_DS_MAX_HIST_ID */
        int64_t lim = w->info.target_vocab_size > 0 ? w->info.target_vocab_size : EG_DS_MAX_HIST_ID;
        if (s->input_ids[t] < 0 || s->input_ids[t] >= lim)
            return eg_fail(err, EG_ERR_INVALID, "sample %s: input_ids[%" PRId64 "] = %d out of range (%s %" PRId64 ")",
                           id, t, s->input_ids[t], w->info.target_vocab_size > 0 ? "vocabulary" : "limit", lim);
    }
    pthread_mutex_lock(&w->mu);
    if (eg_ds_idset_get(&w->ids, id, NULL)) {
        pthread_mutex_unlock(&w->mu);
        return eg_fail(err, EG_ERR_INVALID, "sample %s: id already in the dataset", id);
    }
    while (!w->sticky && w->submitted - w->written >= w->cap) pthread_cond_wait(&w->cv_space, &w->mu);
    if (w->sticky) {
        pthread_mutex_unlock(&w->mu);
        return sticky_err(w, err);
    }
    slot *sl = &w->ring[w->submitted % w->cap];
    pthread_mutex_unlock(&w->mu);
    /* The slot is ours until it is marked PENDING; copy outside the lock. */
    size_t T = (size_t)s->T, H = (size_t)s->H, esz = s->hidden_dtype == EG_DS_F32 ? 4 : 2;
    size_t aux_b = T * (size_t)s->n_aux * H * esz, fin_b = T * H * esz;
    sl->s = *s;
    sl->s.id = strdup(id);
    sl->s.source_file = strdup(s->source_file ? s->source_file : "");
    sl->s.input_ids = malloc(T * 4);
    sl->s.loss_mask = malloc(T);
    sl->s.aux_hidden = malloc(aux_b ? aux_b : 1);
    sl->s.final_hidden = malloc(fin_b);
    sl->s.final_pre_hidden = s->final_pre_hidden ? malloc(fin_b) : NULL;
    if (!sl->s.id || !sl->s.source_file || !sl->s.input_ids || !sl->s.loss_mask || !sl->s.aux_hidden ||
        !sl->s.final_hidden || (s->final_pre_hidden && !sl->s.final_pre_hidden)) {
        eg_ds_sample_clear(&sl->s);
        return eg_fail(err, EG_ERR_NOMEM, "sample %s: out of memory", id);
    }
    memcpy(sl->s.input_ids, s->input_ids, T * 4);
    memcpy(sl->s.loss_mask, s->loss_mask, T);
    if (aux_b) memcpy(sl->s.aux_hidden, s->aux_hidden, aux_b);
    memcpy(sl->s.final_hidden, s->final_hidden, fin_b);
    if (s->final_pre_hidden) memcpy(sl->s.final_pre_hidden, s->final_pre_hidden, fin_b);
    sl->rec = NULL;
    sl->st = EG_OK;
    pthread_mutex_lock(&w->mu);
    eg_status st = eg_ds_idset_put(&w->ids, id, 0, err);
    if (st) {
        pthread_mutex_unlock(&w->mu);
        eg_ds_sample_clear(&sl->s);
        return st;
    }
    sl->state = SLOT_PENDING;
    w->submitted++;
    w->added++;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    return EG_OK;
}

int shard_writer_has_id(eg_shard_writer *w, const char *id) {
    pthread_mutex_lock(&w->mu);
    int r = eg_ds_idset_get(&w->ids, id, NULL);
    pthread_mutex_unlock(&w->mu);
    return r;
}

void shard_writer_count(eg_shard_writer *w, int which, int64_t delta) {
    if (which < 0 || which >= EG_DS_NCOUNTS) return;
    pthread_mutex_lock(&w->mu);
    w->counts[which] += delta;
    pthread_mutex_unlock(&w->mu);
}

int64_t shard_writer_get_count(eg_shard_writer *w, int which) {
    if (which < 0 || which >= EG_DS_NCOUNTS) return 0;
    pthread_mutex_lock(&w->mu);
    int64_t v = w->counts[which];
    pthread_mutex_unlock(&w->mu);
    return v;
}

eg_status shard_writer_set_job(eg_shard_writer *w, const char *job_json, eg_error *err) {
    json_error_t je;
    json_t *j = json_loads(job_json ? job_json : "{}", 0, &je);
    int ok = j && json_is_object(j);
    json_decref(j);
    if (!ok) return eg_fail(err, EG_ERR_INVALID, "job description is not a JSON object");
    char *c = strdup(job_json ? job_json : "{}");
    if (!c) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&w->mu);
    free(w->job_json);
    w->job_json = c;
    pthread_mutex_unlock(&w->mu);
    return EG_OK;
}

void shard_writer_stats(eg_shard_writer *w, eg_shard_writer_stats *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&w->mu);
    o->committed_samples = w->c_samples;
    o->committed_tokens = w->c_tokens;
    o->committed_shards = w->c_shards;
    o->committed_bytes = w->c_bytes;
    o->committed_raw_bytes = w->c_raw;
    o->resume_checked = w->resume_checked;
    o->resume_hashed = w->resume_hashed;
    o->added = w->added;
    o->pending = (int64_t)(w->submitted - w->written);
    pthread_mutex_unlock(&w->mu);
}

static eg_status flush_mode(eg_shard_writer *w, int mode, eg_error *err) {
    if (!w->io_started) return w->sticky ? sticky_err(w, err) : EG_OK;
    pthread_mutex_lock(&w->mu);
    w->flush_req = mode;
    pthread_cond_broadcast(&w->cv_io);
    while (w->flush_req && !w->sticky) pthread_cond_wait(&w->cv_space, &w->mu);
    w->flush_req = 0;
    eg_status st = w->sticky ? sticky_err(w, err) : EG_OK;
    pthread_mutex_unlock(&w->mu);
    return st;
}

eg_status shard_writer_flush(eg_shard_writer *w, eg_error *err) { return flush_mode(w, 1, err); }

static void stop_threads(eg_shard_writer *w) {
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv_work);
    pthread_cond_broadcast(&w->cv_io);
    pthread_mutex_unlock(&w->mu);
    for (int i = 0; i < w->n_workers; i++) pthread_join(w->workers[i], NULL);
    w->n_workers = 0;
    if (w->io_started) pthread_join(w->io, NULL);
    w->io_started = 0;
}

eg_status shard_writer_close(eg_shard_writer *w, eg_error *err) {
    if (!w->io_started) return w->sticky ? sticky_err(w, err) : EG_OK;
    eg_status st = flush_mode(w, 2, err);
    stop_threads(w);
    return st;
}

void shard_writer_free(eg_shard_writer *w) {
    if (!w) return;
    if (w->io_started || w->n_workers) {
        /* Not closed: mark dead so the I/O thread discards what is queued. */
        set_sticky(w, EG_ERR_INTERRUPTED, "writer freed without close");
        stop_threads(w);
    }
    shard_abandon(w);
    if (w->ring)
        for (uint64_t i = 0; i < w->cap; i++) slot_release(&w->ring[i]);
    free(w->ring);
    for (int i = 0; i < w->n_codecs; i++) eg_ds_codec_free(w->codecs[i]);
    free(w->codecs);
    free(w->workers);
    eg_ds_index_clear(&w->ix);
    free(w->hist);
    free(w->cur.file);
    eg_ds_info_clear(&w->info);
    eg_ds_idset_clear(&w->ids);
    eg_ds_stamps_clear(&w->stamps);
    free(w->job_json);
    if (w->lock_fd >= 0 && !w->lock_borrowed) close(w->lock_fd);
    free(w->dir);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv_work);
    pthread_cond_destroy(&w->cv_io);
    pthread_cond_destroy(&w->cv_space);
    free(w);
}
