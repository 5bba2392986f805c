/* export_speculators.c — an eaglegen dataset as speculators (vLLM's trainer, 0.9.x) reads
 * offline EAGLE-3 data (export.h; layout in docs/FORMAT.md "Export: speculators").
 *
 * OUT/ is speculators' --data-path, laid out as its own scripts leave it:
 *   data-NNNNN-of-NNNNN.arrow, dataset_info.json, state.json
 *       the Hugging Face `datasets` folder `speculators prepare-data` saves (save_to_disk):
 *       columns input_ids list<int64>, loss_mask list<int64>, seq_len int64, torch format;
 *       rows without a supervised token are left out, as prepare-data leaves them out
 *   hidden_states/hs_{i}.safetensors
 *       what `speculators generate-offline-data` saves for row i: token_ids int64 [T],
 *       hidden_states bf16 [T, n_aux + 1, H] = the aux layers' outputs, then the final
 *       decoder layer's output BEFORE the final norm (speculators applies the verifier's
 *       norm to that plane itself)
 *   d2t-N.npy (int64 [N]), t2d-N.npy (bool [V])
 *       the names `speculators train --draft-vocab-size N` looks for in --data-path,
 *       built by its rule (most frequent supervised ids of the exported rows, ties to the
 *       lower id, padded with the lowest unused ids: eaglegen's EG_VOCAB_TIE_LOW_ID)
 *   eaglegen_export.json
 *       provenance: source, counts, the aux ids in both conventions, the command.
 * Every file is written under NAME.tmp, fsynced and renamed; the Arrow shards get their
 * final names only after the last row, so an interrupted export has no loadable dataset. */
#include "dataset/export.h"

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/eg_hash.h"
#include "dataset/arrow_ipc.h"
#include "dataset/manifest.h"
#include "dataset/safetensors_write.h"

/* `datasets` save_to_disk: shards of at most config.MAX_SHARD_SIZE ("500MB"); its
 * ArrowWriter's default writer_batch_size (1000 rows per RecordBatch). Environment
 * EG_EXPORT_SHARD_BYTES / EG_EXPORT_BATCH_ROWS override them (docs/FORMAT.md). */
#define SPEC_SHARD_BYTES (500LL * 1000 * 1000)
#define SPEC_BATCH_ROWS 1000
#define SPEC_BATCH_VALUES (1LL << 22) /* also close a batch at 4 Mi tokens (int32 offsets, bounded memory) */
#define SPEC_DEFAULT_SEQ_LEN 8192     /* speculators train --total-seq-len default */
#define SPEC_VERSION "0.9.0"

static const char *features_json(void) {
    return "{\"input_ids\": {\"feature\": {\"dtype\": \"int64\", \"_type\": \"Value\"}, \"_type\": \"List\"}, "
           "\"loss_mask\": {\"feature\": {\"dtype\": \"int64\", \"_type\": \"Value\"}, \"_type\": \"List\"}, "
           "\"seq_len\": {\"dtype\": \"int64\", \"_type\": \"Value\"}}";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A file written under NAME.tmp and renamed into place by out_commit. */
typedef struct {
    FILE *f;
    char tmp[4096], fin[4096];
    int64_t bytes;
} out_file;

static eg_status out_open(out_file *o, const char *dir, const char *name, eg_error *err) {
    memset(o, 0, sizeof *o);
    if ((size_t)snprintf(o->fin, sizeof o->fin, "%s/%s", dir, name) >= sizeof o->fin ||
        (size_t)snprintf(o->tmp, sizeof o->tmp, "%s/%s.tmp", dir, name) >= sizeof o->tmp)
        return eg_fail(err, EG_ERR_INVALID, "path too long: %s/%s", dir, name);
    o->f = fopen(o->tmp, "wbx");
    if (!o->f) return eg_fail(err, EG_ERR_IO, "%s: %s", o->tmp, strerror(errno));
    setvbuf(o->f, NULL, _IOFBF, 1 << 20);
    return EG_OK;
}

static eg_status out_write(out_file *o, const void *p, size_t n, eg_error *err) {
    if (n && fwrite(p, 1, n, o->f) != n) return eg_fail(err, EG_ERR_IO, "writing %s: %s", o->tmp, strerror(errno));
    o->bytes += (int64_t)n;
    return EG_OK;
}

static void out_abort(out_file *o) {
    if (!o->f) return;
    fclose(o->f);
    o->f = NULL;
    unlink(o->tmp);
}

/* fflush + fsync + close; rename to final_name (NULL: the name given to out_open). */
static eg_status out_commit(out_file *o, const char *final_path, eg_error *err) {
    if (fflush(o->f) || fsync(fileno(o->f))) {
        int e = errno;
        out_abort(o);
        return eg_fail(err, EG_ERR_IO, "flushing %s: %s", o->tmp, strerror(e));
    }
    if (fclose(o->f)) {
        o->f = NULL;
        unlink(o->tmp);
        return eg_fail(err, EG_ERR_IO, "closing %s: %s", o->tmp, strerror(errno));
    }
    o->f = NULL;
    const char *to = final_path ? final_path : o->fin;
    if (rename(o->tmp, to)) return eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", o->tmp, to, strerror(errno));
    return EG_OK;
}

/* out_dir: created if missing; refused unless empty. */
static eg_status prepare_dir(const char *dir, int *created, eg_error *err) {
    *created = 0;
    if (mkdir(dir, 0755) == 0) {
        *created = 1;
        return EG_OK;
    }
    if (errno != EEXIST) return eg_fail(err, EG_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    DIR *d = opendir(dir);
    if (!d) return eg_fail(err, EG_ERR_IO, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    const char *found = NULL;
    char name[256] = "";
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(name, sizeof name, "%s", e->d_name);
            found = name;
            break;
        }
    closedir(d);
    if (found)
        return eg_fail(err, EG_ERR_INVALID, "%s is not empty (holds %s): export writes into an empty or new directory, never over files",
                       dir, found);
    return EG_OK;
}

/* The dataset must hold the pre-norm final state and say how many layers the model has. */
static eg_status check_source(const eg_ds_reader *r, eg_error *err) {
    const eg_ds_info *m = dataset_info(r);
    if (!dataset_has_manifest(r))
        return eg_fail(err, EG_ERR_INVALID,
                       "speculators export needs the dataset's manifest (layer count, final-state source, vocabulary): give "
                       "the dataset directory, not one shard");
    if (m->format_version < 2 || m->n_layers <= 0)
        return eg_fail(err, EG_ERR_INVALID,
                       "dataset format version %d does not record the model's layer count, and version 1 stores one final "
                       "state only; speculators needs the pre-norm final state and ids counted from the layer count: "
                       "regenerate with this eaglegen (format 2 stores both final states by default)",
                       m->format_version);
    if (m->final_source == EG_DS_FINAL_POST_NORM)
        return eg_fail(err, EG_ERR_INVALID,
                       "the dataset stores only the post-norm final state (--final-hidden post-norm); speculators applies the "
                       "verifier's final norm to the last hidden state itself, so post-norm data would be normed twice and "
                       "train silently on wrong targets: regenerate with --final-hidden both (the default) or pre-norm");
    if (m->target_vocab_size <= 0)
        return eg_fail(err, EG_ERR_INVALID, "the manifest does not record the target vocabulary size (tokenizer.vocab_size)");
    for (int l = 0; l < m->n_aux; l++) {
        if (m->aux_layers[l] < 0 || m->aux_layers[l] + 1 > m->n_layers)
            return eg_fail(err, EG_ERR_FORMAT, "aux layer %d is outside the model's %d layers", m->aux_layers[l], m->n_layers);
        if (l && m->aux_layers[l] <= m->aux_layers[l - 1])
            return eg_fail(err, EG_ERR_FORMAT, "aux layers must be ascending and distinct (manifest lists %d after %d)",
                           m->aux_layers[l], m->aux_layers[l - 1]);
    }
    if (m->n_aux < 1) return eg_fail(err, EG_ERR_INVALID, "the dataset stores no aux layer");
    return EG_OK;
}

typedef struct {
    const char *dir;
    int64_t shard_bytes, batch_rows;
    int n;            /* shards committed */
    int cap;
    char **tmp_names; /* [n] committed under data-NNNNN.arrow.tmp.done, renamed at the end */
    out_file cur;
    eg_arrow_writer *w;
    int64_t est;      /* bytes of the current shard, rows counted as they are appended */
    int64_t bytes;    /* bytes of the committed shards */
    char *meta;       /* schema metadata value */
} shards;

static eg_status shard_open(shards *s, eg_error *err) {
    char name[64];
    snprintf(name, sizeof name, "data-%05d.arrow", s->n);
    eg_status st = out_open(&s->cur, s->dir, name, err);
    if (st) return st;
    static const eg_arrow_column cols[] = {
        {"input_ids", EG_ARROW_LIST_INT64}, {"loss_mask", EG_ARROW_LIST_INT64}, {"seq_len", EG_ARROW_INT64}};
    eg_arrow_opts ao = {s->batch_rows, SPEC_BATCH_VALUES, "huggingface", s->meta};
    if ((st = eg_arrow_open(s->cur.f, cols, 3, &ao, &s->w, err))) out_abort(&s->cur);
    s->est = 0;
    return st;
}

/* Finish the current shard: end of stream, fsync, keep it as .part until all are done. */
static eg_status shard_close(shards *s, eg_error *err) {
    eg_status st = eg_arrow_finish(s->w, err);
    s->bytes += eg_arrow_bytes(s->w);
    eg_arrow_free(s->w);
    s->w = NULL;
    if (st) {
        out_abort(&s->cur);
        return st;
    }
    if (s->n == s->cap) {
        int nc = s->cap ? 2 * s->cap : 8;
        char **q = realloc(s->tmp_names, sizeof *q * (size_t)nc);
        if (!q) {
            out_abort(&s->cur);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        }
        s->tmp_names = q;
        s->cap = nc;
    }
    char part[4200];
    snprintf(part, sizeof part, "%s.part", s->cur.fin);
    if ((st = out_commit(&s->cur, part, err))) return st;
    s->tmp_names[s->n] = strdup(part);
    if (!s->tmp_names[s->n]) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    s->n++;
    return EG_OK;
}

static void shards_free(shards *s) {
    if (s->w) eg_arrow_free(s->w);
    out_abort(&s->cur);
    for (int i = 0; i < s->n; i++) free(s->tmp_names[i]);
    free(s->tmp_names);
    free(s->meta);
}

/* hidden_states/hs_{idx}.safetensors of one sample cut to T tokens. */
static eg_status write_hs(const char *hs_dir, int64_t idx, const eg_ds_sample *s, int64_t T, const uint16_t *pre,
                          int64_t **ids64, int64_t *ids_cap, int64_t *bytes, eg_error *err) {
    int64_t na = s->n_aux, H = s->H;
    int64_t sh_ids[1] = {T}, sh_hs[3] = {T, na + 1, H};
    eg_st_desc d[2] = {{"token_ids", "I64", 1, sh_ids, 8}, {"hidden_states", "BF16", 3, sh_hs, 2}};
    uint8_t *hdr;
    size_t hlen;
    uint64_t data_bytes;
    eg_status st = eg_st_header(d, 2, &hdr, &hlen, &data_bytes, err);
    if (st) return st;
    if (T > *ids_cap) {
        int64_t *q = realloc(*ids64, sizeof *q * (size_t)T);
        if (!q) {
            free(hdr);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory (%" PRId64 " token ids)", T);
        }
        *ids64 = q;
        *ids_cap = T;
    }
    for (int64_t t = 0; t < T; t++) (*ids64)[t] = s->input_ids[t];
    char name[64];
    snprintf(name, sizeof name, "hs_%" PRId64 ".safetensors", idx);
    out_file o;
    if ((st = out_open(&o, hs_dir, name, err))) {
        free(hdr);
        return st;
    }
    st = out_write(&o, hdr, hlen, err);
    free(hdr);
    if (!st) st = out_write(&o, *ids64, 8 * (size_t)T, err);
    const uint16_t *aux = s->aux_hidden;
    for (int64_t t = 0; !st && t < T; t++) {
        st = out_write(&o, aux + (size_t)(t * na * H), 2 * (size_t)(na * H), err);
        if (!st) st = out_write(&o, pre + (size_t)(t * H), 2 * (size_t)H, err);
    }
    if (!st && (uint64_t)o.bytes != hlen + data_bytes)
        st = eg_fail(err, EG_ERR_IO, "%s: wrote %" PRId64 " bytes, header says %zu", o.tmp, o.bytes, hlen + (size_t)data_bytes);
    if (st) {
        out_abort(&o);
        return st;
    }
    *bytes += o.bytes;
    return out_commit(&o, NULL, err);
}

static eg_status save_json(const char *dir, const char *name, json_t *o, int64_t *bytes, eg_error *err) {
    if (!o) return eg_fail(err, EG_ERR_NOMEM, "out of memory building %s", name);
    char *txt = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!txt) return eg_fail(err, EG_ERR_NOMEM, "out of memory writing %s", name);
    size_t n = strlen(txt);
    eg_status st = eg_ds_write_atomic(dir, name, txt, n, err);
    free(txt);
    *bytes += (int64_t)n;
    return st;
}

/* A positive integer from the environment, or def when unset. */
static eg_status env_count(const char *name, int64_t def, int64_t *out, eg_error *err) {
    const char *v = getenv(name);
    *out = def;
    if (!v) return EG_OK;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 1)
        return eg_fail(err, EG_ERR_INVALID, "%s='%s': a positive count (default %" PRId64 ")", name, v, def);
    *out = x;
    return EG_OK;
}

static int append(char *buf, size_t cap, size_t *k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int append(char *buf, size_t cap, size_t *k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *k, *k < cap ? cap - *k : 0, fmt, ap);
    va_end(ap);
    if (n < 0 || *k + (size_t)n >= cap) return -1;
    *k += (size_t)n;
    return 0;
}

eg_status eg_export_speculators(eg_ds_reader *r, const eg_export_opts *o, eg_export_report *rep, eg_error *err) {
    memset(rep, 0, sizeof *rep);
    if (!o->out_dir || !*o->out_dir) return eg_fail(err, EG_ERR_INVALID, "speculators export: no output directory");
    if (o->max_len < 0 || o->draft_vocab < 0)
        return eg_fail(err, EG_ERR_INVALID, "speculators export: negative --max-len or --draft-vocab");
    int64_t shard_bytes, batch_rows;
    eg_status st = env_count("EG_EXPORT_SHARD_BYTES", SPEC_SHARD_BYTES, &shard_bytes, err);
    if (!st) st = env_count("EG_EXPORT_BATCH_ROWS", SPEC_BATCH_ROWS, &batch_rows, err);
    if (!st) st = check_source(r, err);
    if (st) return st;
    const eg_ds_info *m = dataset_info(r);
    const int64_t V = m->target_vocab_size, H = m->hidden_size;
    const int na = m->n_aux, L = m->n_layers;
    int64_t N = o->draft_vocab ? o->draft_vocab : (V < 32000 ? V : 32000);
    if (N > V)
        return eg_fail(err, EG_ERR_INVALID, "draft vocabulary %" PRId64 " is larger than the target vocabulary %" PRId64, N, V);
    int created;
    if ((st = prepare_dir(o->out_dir, &created, err))) return st;
    char hs_dir[4096];
    if ((size_t)snprintf(hs_dir, sizeof hs_dir, "%s/hidden_states", o->out_dir) >= sizeof hs_dir)
        return eg_fail(err, EG_ERR_INVALID, "path too long: %s", o->out_dir);
    if (mkdir(hs_dir, 0755)) return eg_fail(err, EG_ERR_IO, "cannot create %s: %s", hs_dir, strerror(errno));

    shards sh = {0};
    sh.dir = o->out_dir;
    sh.shard_bytes = shard_bytes;
    sh.batch_rows = batch_rows;
    size_t ml = strlen(features_json()) + 32;
    sh.meta = malloc(ml);
    if (!sh.meta) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    snprintf(sh.meta, ml, "{\"info\": {\"features\": %s}}", features_json());
    uint64_t *hist = calloc((size_t)V, sizeof *hist);
    int64_t *ids64 = NULL, ids_cap = 0;
    eg_draft_vocab dv = {0};
    if (!hist) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory (histogram of %" PRId64 " ids)", V);
        goto done;
    }

    const int64_t total = dataset_num_samples(r);
    int64_t rows = 0, tokens = 0, loss_tokens = 0, unsupervised = 0, cut = 0, longest = 0;
    double last = 0;
    for (int64_t i = 0; i < total; i++) {
        eg_ds_sample s;
        if ((st = dataset_read(r, i, 0, &s, err))) goto done;
        int64_t T = o->max_len && s.T > o->max_len ? o->max_len : s.T;
        const uint16_t *pre = m->final_source == EG_DS_FINAL_BOTH ? s.final_pre_hidden : s.final_hidden;
        if (s.n_aux != na || s.H != H || !pre) {
            st = eg_fail(err, EG_ERR_FORMAT, "sample %" PRId64 " (%s): n_aux %d, hidden %" PRId64 "%s, manifest says %d, %" PRId64,
                         i, s.id, s.n_aux, s.H, pre ? "" : ", no pre-norm final state", na, H);
            eg_ds_sample_clear(&s);
            goto done;
        }
        int64_t lt = 0;
        for (int64_t t = 0; t < T; t++) {
            if (s.input_ids[t] < 0 || s.input_ids[t] >= V) {
                st = eg_fail(err, EG_ERR_FORMAT, "sample %" PRId64 " (%s): token id %d at %" PRId64 " outside the vocabulary of %" PRId64,
                             i, s.id, s.input_ids[t], t, V);
                eg_ds_sample_clear(&s);
                goto done;
            }
            lt += s.loss_mask[t] != 0;
        }
        if (!lt) { /* prepare-data drops rows without a supervised token */
            unsupervised++;
            eg_ds_sample_clear(&s);
            continue;
        }
        cut += T < s.T;
        st = write_hs(hs_dir, rows, &s, T, pre, &ids64, &ids_cap, &rep->bytes_written, err);
        if (!st && !sh.w) st = shard_open(&sh, err); /* the next shard opens with its first row */
        if (!st) st = eg_arrow_put_list_i32(sh.w, 0, s.input_ids, T, err);
        if (!st) st = eg_arrow_put_list_u8(sh.w, 1, s.loss_mask, T, err);
        if (!st) st = eg_arrow_put_i64(sh.w, 2, T, err);
        if (!st) st = eg_arrow_end_row(sh.w, err);
        for (int64_t t = 0; !st && t < T; t++)
            if (s.loss_mask[t]) hist[s.input_ids[t]]++;
        eg_ds_sample_clear(&s);
        if (st) goto done;
        rows++;
        tokens += T;
        loss_tokens += lt;
        if (T > longest) longest = T;
        sh.est += 16 * T + 8;
        if (sh.est >= sh.shard_bytes && (st = shard_close(&sh, err))) goto done;
        double t = now_s();
        if (o->progress && t - last >= 0.25) {
            last = t;
            o->progress(o->progress_ctx, i + 1, total, rep->bytes_written + sh.bytes + (sh.w ? eg_arrow_bytes(sh.w) : 0));
        }
    }
    if (!rows) { /* nothing was written but the empty folders: remove them */
        rmdir(hs_dir);
        if (created) rmdir(o->out_dir);
        st = eg_fail(err, EG_ERR_INVALID,
                     "no sample has a supervised (loss-masked) token%s: speculators would train on nothing",
                     o->max_len ? " within --max-len" : "");
        goto done;
    }
    if (sh.w && (st = shard_close(&sh, err))) goto done;
    rep->bytes_written += sh.bytes;

    /* every row is in: the shards get their final names, then the folder's json */
    json_t *files = json_array();
    for (int k = 0; k < sh.n; k++) {
        char name[64], fin[4200];
        snprintf(name, sizeof name, "data-%05d-of-%05d.arrow", k, sh.n);
        snprintf(fin, sizeof fin, "%s/%s", o->out_dir, name);
        if (rename(sh.tmp_names[k], fin)) {
            json_decref(files);
            st = eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", sh.tmp_names[k], fin, strerror(errno));
            goto done;
        }
        json_array_append_new(files, json_pack("{s:s}", "filename", name));
    }
    json_error_t je;
    json_t *feat = json_loads(features_json(), 0, &je);
    if ((st = save_json(o->out_dir, "dataset_info.json",
                        json_pack("{s:s,s:s,s:o,s:s,s:s}", "citation", "", "description", "", "features", feat, "homepage",
                                  "", "license", ""),
                        &rep->bytes_written, err))) {
        json_decref(files);
        goto done;
    }
    /* a fingerprint like datasets' own: 16 hex digits, here of the source and the options */
    char fp_src[512], fp[65];
    snprintf(fp_src, sizeof fp_src, "eaglegen-speculators|%s|%" PRId64 "|%" PRId64 "|%" PRId64, m->model_config_sha256 ? m->model_config_sha256 : "",
             total, tokens, o->max_len);
    eg_sha256_hex(fp_src, strlen(fp_src), fp);
    fp[16] = 0;
    if ((st = save_json(o->out_dir, "state.json",
                        json_pack("{s:o,s:s,s:n,s:{},s:s,s:b,s:n}", "_data_files", files, "_fingerprint", fp,
                                  "_format_columns", "_format_kwargs", "_format_type", "torch", "_output_all_columns", 0,
                                  "_split"),
                        &rep->bytes_written, err)))
        goto done;

    /* the draft vocabulary over exactly the exported tokens, by speculators' rule */
    if ((st = eg_draft_vocab_from_hist(hist, V, N, V, o->tie, &dv, err))) goto done;
    char d2t_name[64], t2d_name[64];
    snprintf(d2t_name, sizeof d2t_name, "d2t-%" PRId64 ".npy", N);
    snprintf(t2d_name, sizeof t2d_name, "t2d-%" PRId64 ".npy", N);
    if ((st = eg_npy_write(o->out_dir, d2t_name, "<i8", N, dv.d2t, 8, err)) ||
        (st = eg_npy_write(o->out_dir, t2d_name, "|b1", V, dv.t2d, 1, err)))
        goto done;
    rep->bytes_written += 8 * N + V + 256;

    /* the command, every id converted: target-layer-ids are vLLM hidden_states indices k + 1 */
    size_t k = 0;
    char ids[1024] = "";
    size_t ik = 0;
    for (int l = 0; l < na; l++)
        if (append(ids, sizeof ids, &ik, "%s%d", l ? " " : "", m->aux_layers[l] + 1)) {
            st = eg_fail(err, EG_ERR_INVALID, "too many aux layers for the command line");
            goto done;
        }
    /* paths as shell words: the line is printed to be pasted (a space in --out broke it) */
    char *qv = eg_shell_quote(o->verifier && *o->verifier ? o->verifier : "VERIFIER_DIR");
    char *qo = eg_shell_quote(o->out_dir);
    int bad = !qv || !qo;
    if (bad) {
        free(qv);
        free(qo);
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto done;
    }
    bad = append(rep->trainer_command, sizeof rep->trainer_command, &k,
                 "speculators train --speculator-type eagle3 --verifier-name-or-path %s --data-path %s "
                 "--target-layer-ids %s --draft-vocab-size %" PRId64 " --on-missing raise",
                 qv, qo, ids, N);
    free(qv);
    free(qo);
    if (!bad && longest > SPEC_DEFAULT_SEQ_LEN)
        bad = append(rep->trainer_command, sizeof rep->trainer_command, &k, " --total-seq-len %" PRId64, longest);
    if (bad) {
        st = eg_fail(err, EG_ERR_INVALID, "output path too long for the command line");
        goto done;
    }
    json_t *eg_ids = json_array(), *sp_ids = json_array();
    for (int l = 0; l < na; l++) {
        json_array_append_new(eg_ids, json_integer(m->aux_layers[l]));
        json_array_append_new(sp_ids, json_integer(m->aux_layers[l] + 1));
    }
    json_t *prov = json_pack(
        "{s:s,s:s,s:s?,s:s?,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:{s:o,s:s,s:o,s:i,s:s},s:{s:s,s:s,s:s},s:{s:I,s:I,s:s,s:I,s:I},s:s}",
        "exporter", "eaglegen export --to speculators", "speculators_version", SPEC_VERSION, "model",
        m->model_name, "model_config_sha256", m->model_config_sha256, "source_samples", (json_int_t)total, "rows",
        (json_int_t)rows, "tokens", (json_int_t)tokens, "loss_tokens", (json_int_t)loss_tokens, "left_out_unsupervised",
        (json_int_t)unsupervised, "cut_to_max_len", (json_int_t)cut, "max_len", (json_int_t)o->max_len, "aux_layers", "eaglegen_ids", eg_ids,
        "eaglegen_convention", "output of decoder layer k, 0-based", "target_layer_ids", sp_ids, "final_id", L,
        "speculators_convention", "vLLM hidden_states index: k + 1 (0 = embeddings); the final state is num_layers",
        "hidden_states", "layout", "[T, n_aux + 1, hidden_size] bf16", "planes",
        "the aux layers' outputs in target_layer_ids order, then the final decoder layer's output",
        "last_plane", "pre_norm (the residual stream before the final RMSNorm; speculators applies the verifier norm)",
        "draft_vocab", "size", (json_int_t)N, "target_vocab", (json_int_t)V, "rule",
        "most frequent supervised ids of the exported rows, equal counts to the lower id, padded with the lowest unused ids",
        "distinct", (json_int_t)dv.distinct, "padding", (json_int_t)dv.padding, "command", rep->trainer_command);
    if ((st = save_json(o->out_dir, "eaglegen_export.json", prov, &rep->bytes_written, err))) goto done;
    if ((st = eg_ds_fsync_dir(hs_dir, err)) || (st = eg_ds_fsync_dir(o->out_dir, err))) goto done;

    rep->samples = rows;
    rep->tokens = tokens;
    rep->draft_vocab = N;
    size_t sk = 0;
    append(rep->summary, sizeof rep->summary, &sk,
           "speculators %s data in %s: %" PRId64 " rows (%" PRId64 " tokens, %" PRId64 " supervised) in %d Arrow shard%s + "
           "hidden_states/hs_0..%" PRId64 ".safetensors (bf16 [T, %d, %" PRId64 "]: aux layers %s as hidden_states indices, "
           "last plane the pre-norm final state), d2t-%" PRId64 ".npy / t2d-%" PRId64 ".npy (%" PRId64 " distinct ids, %" PRId64
           " padding); %.1f MB",
           SPEC_VERSION, o->out_dir, rows, tokens, loss_tokens, sh.n, sh.n == 1 ? "" : "s", rows - 1, na + 1, H, ids, N, N,
           dv.distinct, dv.padding, (double)rep->bytes_written / 1e6);
    if (unsupervised)
        append(rep->summary, sizeof rep->summary, &sk, "; %" PRId64 " sample%s without a supervised token left out, as prepare-data does",
               unsupervised, unsupervised == 1 ? "" : "s");
    if (cut) append(rep->summary, sizeof rep->summary, &sk, "; %" PRId64 " cut to --max-len %" PRId64, cut, o->max_len);
    if (!o->verifier || !*o->verifier)
        append(rep->summary, sizeof rep->summary, &sk,
               "\nVERIFIER_DIR: a directory with a config.json that transformers' AutoConfig reads (num_hidden_layers %d, "
               "hidden_size %" PRId64 ", vocab_size %" PRId64 ") and the embedding, lm_head and final norm weights",
               L, H, V);
    if (o->progress) o->progress(o->progress_ctx, total, total, rep->bytes_written);
done:
    shards_free(&sh);
    free(hist);
    free(ids64);
    eg_draft_vocab_clear(&dv);
    return st;
}
