/* Manifest load/save and atomic file helpers; see manifest.h, docs/FORMAT.md. */
#include "dataset/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const eg_ds_count_names[EG_DS_NCOUNTS] = {"generated", "skipped", "dropped", "rejected"};

const char *eg_ds_final_source_name(eg_ds_final_source f) {
    return f == EG_DS_FINAL_BOTH ? "both" : f == EG_DS_FINAL_PRE_NORM ? "pre_norm" : "post_norm";
}

void eg_ds_info_clear(eg_ds_info *m) {
    if (!m) return;
    free(m->model_name);
    free(m->model_config_sha256);
    free(m->model_weights_sha256);
    free(m->tokenizer_sha256);
    free(m->chat_template);
    free(m->aux_layers);
    for (int i = 0; i < m->n_shards; i++) free(m->shards[i].file);
    free(m->shards);
    free(m->hist);
    free(m->job_json);
    free(m->precision_json);
    memset(m, 0, sizeof *m);
}

/* Strings reach manifest.json, whose JSON must be valid UTF-8: a name that is not (a
 * model directory named in Latin-1, say) is kept escaped (eg_utf8_escape), here where it
 * enters the description, so what is compared on resume is what the file holds. */
static char *dupnull(const char *s) { return eg_utf8_escape(s ? s : ""); }

eg_status eg_ds_info_copy_desc(eg_ds_info *d, const eg_ds_info *s, eg_error *err) {
    memset(d, 0, sizeof *d);
    d->format_version = s->format_version;
    d->model_name = dupnull(s->model_name);
    d->model_config_sha256 = dupnull(s->model_config_sha256);
    d->model_weights_sha256 = dupnull(s->model_weights_sha256);
    d->tokenizer_sha256 = dupnull(s->tokenizer_sha256);
    d->chat_template = dupnull(s->chat_template);
    d->job_json = dupnull(s->job_json && *s->job_json ? s->job_json : "{}");
    d->precision_json = s->precision_json ? strdup(s->precision_json) : NULL;
    d->thinking = s->thinking;
    d->n_aux = s->n_aux;
    d->aux_layers = malloc(sizeof(int) * (size_t)(s->n_aux ? s->n_aux : 1));
    if (d->aux_layers && s->n_aux) memcpy(d->aux_layers, s->aux_layers, sizeof(int) * (size_t)s->n_aux);
    d->hidden_size = s->hidden_size;
    d->target_vocab_size = s->target_vocab_size;
    d->final_source = s->final_source;
    d->n_layers = s->n_layers;
    d->zstd_level = s->zstd_level;
    d->bf16_split = s->bf16_split;
    d->worker_index = s->worker_index;
    d->worker_count = s->worker_count;
    if (!d->model_name || !d->model_config_sha256 || !d->model_weights_sha256 || !d->tokenizer_sha256 || !d->chat_template ||
        !d->job_json || !d->aux_layers || (s->precision_json && !d->precision_json)) {
        eg_ds_info_clear(d);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    return EG_OK;
}

eg_status eg_ds_precision_add(char **list, const char *items, eg_error *err) {
    if (!items) return EG_OK;
    json_error_t je;
    json_t *have = *list ? json_loads(*list, 0, &je) : json_array(), *add = json_loads(items, 0, &je);
    eg_status st = EG_OK;
    if (!json_is_array(have) || !(json_is_object(add) || json_is_array(add))) {
        st = eg_fail(err, EG_ERR_INVALID, "precision: expected a JSON object or array of objects");
        goto done;
    }
    json_t *one = json_is_object(add) ? json_pack("[O]", add) : json_incref(add), *x;
    size_t i;
    json_array_foreach(one, i, x) {
        int dup = 0;
        size_t k;
        json_t *y;
        json_array_foreach(have, k, y) dup |= json_equal(x, y);
        if (!dup && json_is_object(x)) json_array_append(have, x);
    }
    json_decref(one);
    char *text = json_dumps(have, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    free(*list);
    *list = text;
done:
    json_decref(have);
    json_decref(add);
    return st;
}

eg_status eg_ds_hist_add(uint64_t **dst, int64_t *dst_len, const uint64_t *src, int64_t n,
                         eg_error *err) {
    if (n > *dst_len) {
        uint64_t *q = realloc(*dst, sizeof(uint64_t) * (size_t)n);
        if (!q) return eg_fail(err, EG_ERR_NOMEM, "out of memory (histogram)");
        memset(q + *dst_len, 0, sizeof(uint64_t) * (size_t)(n - *dst_len));
        *dst = q;
        *dst_len = n;
    }
    for (int64_t i = 0; i < n; i++) (*dst)[i] += src[i];
    return EG_OK;
}

eg_ds_totals eg_ds_info_totals(const eg_ds_info *m) {
    eg_ds_totals t = {0};
    for (int i = 0; i < m->n_shards; i++) {
        const eg_ds_shard_info *s = &m->shards[i];
        t.samples += s->samples;
        t.tokens += s->tokens;
        t.loss_tokens += s->loss_tokens;
        t.bytes += s->bytes;
        t.raw_bytes += s->raw_bytes;
        t.n_stop += s->n_stop;
        t.n_length += s->n_length;
    }
    return t;
}

eg_status eg_ds_info_compatible(const eg_ds_info *a, const eg_ds_info *b, eg_error *err) {
#define DIFF(what) return eg_fail(err, EG_ERR_CONFIG, "datasets differ in %s", what)
    /* the model by content: a checkpoint moved or renamed is the same one (its name, the
       directory's, is not compared); another checkpoint of one config (a fine-tune) is not */
    if (strcmp(a->model_config_sha256, b->model_config_sha256)) DIFF("model config hash");
    const char *wa = a->model_weights_sha256, *wb = b->model_weights_sha256;
    if (wa && *wa && wb && *wb && strcmp(wa, wb)) DIFF("model weights (another checkpoint of the same config)");
    if (strcmp(a->tokenizer_sha256, b->tokenizer_sha256)) DIFF("tokenizer hash");
    if (strcmp(a->chat_template, b->chat_template)) DIFF("chat template");
    if (a->thinking != b->thinking) DIFF("thinking mode");
    if (a->n_aux != b->n_aux) DIFF("number of aux layers");
    for (int i = 0; i < a->n_aux; i++)
        if (a->aux_layers[i] != b->aux_layers[i]) DIFF("aux layer ids");
    if (a->hidden_size != b->hidden_size) DIFF("hidden size");
    if (a->final_source != b->final_source) DIFF("final hidden source (post-norm/pre-norm/both)");
    if (a->n_layers && b->n_layers && a->n_layers != b->n_layers) DIFF("number of decoder layers");
    if (a->target_vocab_size && b->target_vocab_size && a->target_vocab_size != b->target_vocab_size)
        DIFF("target vocab size");
    return EG_OK;
#undef DIFF
}

/* ---------------------------------------------------------------- save */
/* Inside to_json every set and append is checked: a value json_pack could not build
 * (NULL: a string that is not UTF-8, out of memory) fails the save and names the key,
 * instead of silently leaving the key out. */
static int set_checked(json_t *o, const char *key, json_t *v, const char **bad) {
    int r = json_object_set_new(o, key, v);
    if (r && !*bad) *bad = key;
    return r;
}
static int append_checked(json_t *a, json_t *v, const char **bad) {
    int r = json_array_append_new(a, v);
    if (r && !*bad) *bad = "array entry";
    return r;
}
#define json_object_set_new(o, key, v) set_checked(o, key, v, &bad_key)
#define json_array_append_new(a, v) append_checked(a, v, &bad_key)

static json_t *to_json(const eg_ds_info *m, eg_error *err) {
    const char *bad_key = NULL;
    json_t *o = json_object();
    if (!o) { eg_fail(err, EG_ERR_NOMEM, "out of memory"); return NULL; }
    json_object_set_new(o, "format", json_string("eaglegen-dataset"));
    json_object_set_new(o, "format_version", json_integer(EG_DS_FORMAT_VERSION));
    if (m->worker_count > 0)
        json_object_set_new(o, "worker", json_pack("{s:i,s:i}", "index", m->worker_index, "count", m->worker_count));
    json_t *mo = json_pack("{s:s,s:s}", "name", m->model_name, "config_sha256", m->model_config_sha256);
    if (mo && m->model_weights_sha256 && *m->model_weights_sha256)
        json_object_set_new(mo, "weights_sha256", json_string(m->model_weights_sha256));
    json_object_set_new(o, "model", mo);
    json_object_set_new(o, "tokenizer", json_pack("{s:s,s:I}", "sha256", m->tokenizer_sha256,
                                                  "vocab_size", (json_int_t)m->target_vocab_size));
    json_object_set_new(o, "chat_template", json_pack("{s:s,s:b}", "name", m->chat_template,
                                                      "thinking", m->thinking));
    json_t *ids = json_array(), *hf = json_array(), *sg = json_array(), *vl = json_array();
    for (int i = 0; i < m->n_aux; i++) {
        json_array_append_new(ids, json_integer(m->aux_layers[i]));
        json_array_append_new(hf, json_integer(m->aux_layers[i] + 1));
        json_array_append_new(sg, json_integer(m->aux_layers[i]));
        json_array_append_new(vl, json_integer(m->aux_layers[i] + 1));
    }
    /* the trainers' own counting (docs/FORMAT.md §6): SpecForge/SGLang name layer k by
     * its output, vLLM/speculators by the hidden_states index (k + 1; L = the final) */
    json_t *tr = json_pack("{s:{s:o,s:s},s:{s:o,s:s}}",
                           "specforge_sglang", "aux_ids", sg, "convention", "output of decoder layer k, 0-based (= ids)",
                           "vllm_speculators", "aux_ids", vl, "convention",
                           "hidden_states index: k + 1 (0 = embedding output, num_layers = last layer)");
    if (tr && m->n_layers > 0)
        json_object_set_new(json_object_get(tr, "vllm_speculators"), "final_id", json_integer(m->n_layers));
    json_object_set_new(o, "aux_layers",
                        json_pack("{s:o,s:s,s:o,s:o}", "ids", ids, "convention",
                                  "output of decoder layer k, 0-based (the residual stream after layer k)",
                                  "hf_hidden_states_index", hf, "trainer_ids", tr));
    if (m->n_layers > 0) json_object_set_new(o, "num_layers", json_integer(m->n_layers));
    const char *desc = m->final_source == EG_DS_FINAL_BOTH
                           ? "final_hidden: output of the final RMSNorm (the input of lm_head); final_pre_hidden: "
                             "residual stream after the last decoder layer, before the final RMSNorm"
                       : m->final_source == EG_DS_FINAL_PRE_NORM
                           ? "residual stream after the last decoder layer, before the final RMSNorm"
                           : "output of the final RMSNorm (the input of lm_head)";
    json_t *stored = m->final_source == EG_DS_FINAL_BOTH ? json_pack("[s,s]", "post_norm", "pre_norm")
                                                         : json_pack("[s]", eg_ds_final_source_name(m->final_source));
    json_object_set_new(o, "final_hidden",
                        json_pack("{s:s,s:o,s:s}", "source", eg_ds_final_source_name(m->final_source), "stored",
                                  stored, "description", desc));
    json_object_set_new(o, "hidden_size", json_integer(m->hidden_size));
    json_object_set_new(o, "n_aux", json_integer(m->n_aux));
    json_t *tens = json_pack("{s:{s:s,s:s},s:{s:s,s:s},s:{s:s,s:s},s:{s:s,s:s}}",
                             "input_ids", "dtype", "int32", "shape", "[T]",
                             "loss_mask", "dtype", "uint8", "shape", "[T]",
                             "aux_hidden", "dtype", "bfloat16", "shape", "[T, n_aux, hidden_size]",
                             "final_hidden", "dtype", "bfloat16", "shape", "[T, hidden_size]");
    if (tens && m->final_source == EG_DS_FINAL_BOTH)
        json_object_set_new(tens, "final_pre_hidden", json_pack("{s:s,s:s}", "dtype", "bfloat16", "shape", "[T, hidden_size]"));
    json_object_set_new(o, "tensors", tens);
    json_object_set_new(o, "compression", json_pack("{s:s,s:i,s:b,s:b}", "codec", "zstd", "level",
                                                    m->zstd_level, "bf16_byte_split", m->bf16_split,
                                                    "frame_checksum", 1));
    json_t *sh = json_array();
    for (int i = 0; i < m->n_shards; i++) {
        const eg_ds_shard_info *s = &m->shards[i];
        json_array_append_new(
            sh, json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s}", "file", s->file, "samples",
                          (json_int_t)s->samples, "tokens", (json_int_t)s->tokens, "loss_tokens",
                          (json_int_t)s->loss_tokens, "finish_stop", (json_int_t)s->n_stop,
                          "finish_length", (json_int_t)s->n_length, "bytes", (json_int_t)s->bytes,
                          "raw_bytes", (json_int_t)s->raw_bytes, "sha256", s->sha256));
    }
    json_object_set_new(o, "shards", sh);
    eg_ds_totals t = eg_ds_info_totals(m);
    json_object_set_new(o, "totals",
                        json_pack("{s:I,s:I,s:I,s:I,s:I}", "samples", (json_int_t)t.samples, "tokens",
                                  (json_int_t)t.tokens, "loss_tokens", (json_int_t)t.loss_tokens, "bytes",
                                  (json_int_t)t.bytes, "raw_bytes", (json_int_t)t.raw_bytes));
    json_object_set_new(o, "finish_reasons", json_pack("{s:I,s:I}", "stop", (json_int_t)t.n_stop,
                                                       "length", (json_int_t)t.n_length));
    json_t *c = json_object();
    for (int i = 0; i < EG_DS_NCOUNTS; i++) json_object_set_new(c, eg_ds_count_names[i], json_integer(m->counts[i]));
    json_object_set_new(o, "counts", c);
    json_t *hid = json_array(), *hc = json_array();
    for (int64_t i = 0; i < m->hist_len; i++)
        if (m->hist[i]) {
            json_array_append_new(hid, json_integer(i));
            json_array_append_new(hc, json_integer((json_int_t)m->hist[i]));
        }
    json_object_set_new(o, "loss_token_histogram", json_pack("{s:o,s:o}", "ids", hid, "counts", hc));
    json_error_t je;
    json_t *job = json_loads(m->job_json ? m->job_json : "{}", 0, &je);
    if (!job || !json_is_object(job)) {
        json_decref(job);
        json_decref(o);
        eg_fail(err, EG_ERR_INVALID, "job description is not a JSON object: %s", je.text);
        return NULL;
    }
    json_object_set_new(o, "job", job);
    if (bad_key) {
        json_decref(o);
        eg_fail(err, EG_ERR_INVALID, "manifest key \"%s\" cannot be written (a string that is not UTF-8, or out of memory)",
                bad_key);
        return NULL;
    }
    if (m->precision_json) {
        json_t *p = json_loads(m->precision_json, 0, &je);
        if (!json_is_array(p)) {
            json_decref(p);
            json_decref(o);
            eg_fail(err, EG_ERR_INVALID, "precision list is not a JSON array");
            return NULL;
        }
        json_object_set_new(o, "precision", p);
    }
    return o;
}
#undef json_object_set_new
#undef json_array_append_new

eg_status eg_ds_fsync_dir(const char *dir, eg_error *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", dir, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r && e != EINVAL) return eg_fail(err, EG_ERR_IO, "fsync %s: %s", dir, strerror(e));
    return EG_OK;
}

eg_status eg_ds_write_atomic(const char *dir, const char *name, const void *data, size_t n,
                             eg_error *err) {
    char tmp[4096], fin[4096];
    snprintf(fin, sizeof fin, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = n;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            close(fd);
            unlink(tmp);
            return eg_fail(err, EG_ERR_IO, "writing %s: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd)) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return eg_fail(err, EG_ERR_IO, "fsync %s: %s", tmp, strerror(e));
    }
    if (close(fd)) { unlink(tmp); return eg_fail(err, EG_ERR_IO, "close %s: %s", tmp, strerror(errno)); }
    if (rename(tmp, fin)) {
        int e = errno;
        unlink(tmp);
        return eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", tmp, fin, strerror(e));
    }
    return eg_ds_fsync_dir(dir, err);
}

eg_status eg_ds_info_save(const eg_ds_info *m, const char *dir, const char *name, eg_error *err) {
    json_t *o = to_json(m, err);
    if (!o) return err ? err->code : EG_ERR_INVALID;
    char *txt = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!txt) return eg_fail(err, EG_ERR_NOMEM, "cannot serialise manifest");
    size_t n = strlen(txt);
    eg_status st = eg_ds_write_atomic(dir, name, txt, n, err);
    free(txt);
    return st;
}

/* ---------------------------------------------------------------- load */
static eg_status bad(eg_error *err, const char *path, const char *what) {
    return eg_fail(err, EG_ERR_FORMAT, "%s: manifest field %s missing or mistyped", path, what);
}

static int get_int(json_t *o, const char *k, int64_t *v) {
    json_t *x = json_object_get(o, k);
    if (!json_is_integer(x)) return 0;
    *v = json_integer_value(x);
    return 1;
}

eg_status eg_ds_info_load(const char *path, eg_ds_info *m, eg_error *err) {
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        if (access(path, F_OK)) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
        if (je.line < 0) return eg_fail(err, EG_ERR_IO, "%s: cannot read: %s", path, je.text); /* open/read failed */
        return eg_fail(err, EG_ERR_FORMAT, "%s:%d: %s", path, je.line, je.text);
    }
    eg_status st = EG_OK;
    int64_t v;
    const char *fmt = json_string_value(json_object_get(o, "format"));
    if (!json_is_object(o) || !fmt || strcmp(fmt, "eaglegen-dataset")) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: not an eaglegen dataset manifest", path);
        goto done;
    }
    if (!get_int(o, "format_version", &v)) { st = bad(err, path, "format_version"); goto done; }
    if (v < EG_DS_FORMAT_VERSION_MIN || v > EG_DS_FORMAT_VERSION) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: format version %" PRId64 ", this build reads %d..%d", path, v,
                     EG_DS_FORMAT_VERSION_MIN, EG_DS_FORMAT_VERSION);
        goto done;
    }
    m->format_version = (int)v;
    json_t *w = json_object_get(o, "worker");
    m->worker_count = 0;
    if (w) {
        int64_t a, b;
        if (!get_int(w, "index", &a) || !get_int(w, "count", &b)) { st = bad(err, path, "worker"); goto done; }
        m->worker_index = (int)a;
        m->worker_count = (int)b;
    }
    json_t *model = json_object_get(o, "model"), *tok = json_object_get(o, "tokenizer"),
           *ct = json_object_get(o, "chat_template"), *aux = json_object_get(o, "aux_layers"),
           *fh = json_object_get(o, "final_hidden"), *comp = json_object_get(o, "compression");
    const char *s1 = json_string_value(json_object_get(model, "name"));
    const char *s2 = json_string_value(json_object_get(model, "config_sha256"));
    const char *s3 = json_string_value(json_object_get(tok, "sha256"));
    const char *s4 = json_string_value(json_object_get(ct, "name"));
    const char *s5 = json_string_value(json_object_get(fh, "source"));
    json_t *think = json_object_get(ct, "thinking"), *ids = json_object_get(aux, "ids");
    if (!s1 || !s2 || !s3 || !s4 || !s5 || !json_is_boolean(think) || !json_is_array(ids)) {
        st = bad(err, path, "model/tokenizer/chat_template/aux_layers/final_hidden");
        goto done;
    }
    json_t *ws = json_object_get(model, "weights_sha256");
    if (ws && (!json_is_string(ws) || strlen(json_string_value(ws)) != 64)) {
        st = bad(err, path, "model.weights_sha256");
        goto done;
    }
    m->model_name = strdup(s1);
    m->model_config_sha256 = strdup(s2);
    m->model_weights_sha256 = strdup(ws ? json_string_value(ws) : "");
    m->tokenizer_sha256 = strdup(s3);
    m->chat_template = strdup(s4);
    m->thinking = json_is_true(think);
    if (!strcmp(s5, "pre_norm")) m->final_source = EG_DS_FINAL_PRE_NORM;
    else if (!strcmp(s5, "post_norm")) m->final_source = EG_DS_FINAL_POST_NORM;
    else if (!strcmp(s5, "both") && v >= 2) m->final_source = EG_DS_FINAL_BOTH;
    else { st = bad(err, path, "final_hidden.source"); goto done; }
    m->n_aux = (int)json_array_size(ids);
    m->aux_layers = calloc((size_t)m->n_aux + 1, sizeof(int));
    if (!m->model_name || !m->model_config_sha256 || !m->model_weights_sha256 || !m->tokenizer_sha256 || !m->chat_template || !m->aux_layers) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < m->n_aux; i++) {
        json_t *x = json_array_get(ids, (size_t)i);
        if (!json_is_integer(x)) { st = bad(err, path, "aux_layers.ids"); goto done; }
        m->aux_layers[i] = (int)json_integer_value(x);
    }
    {
        /* written beside aux_layers.ids as its length; a manifest saying otherwise
           contradicts itself (the Python loader refuses it alike) */
        json_t *nx = json_object_get(o, "n_aux");
        if (nx && (!json_is_integer(nx) || json_integer_value(nx) != m->n_aux)) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: manifest field n_aux is not the number of aux_layers.ids (%d)", path,
                         m->n_aux);
            goto done;
        }
    }
    if (!get_int(o, "hidden_size", &m->hidden_size) || m->hidden_size < 1) { st = bad(err, path, "hidden_size"); goto done; }
    {
        int64_t nl = 0;
        if (json_object_get(o, "num_layers") && (!get_int(o, "num_layers", &nl) || nl < 1 || nl > (1 << 20))) {
            st = bad(err, path, "num_layers");
            goto done;
        }
        m->n_layers = (int)nl;
    }
    if (!get_int(tok, "vocab_size", &m->target_vocab_size)) m->target_vocab_size = 0;
    int64_t lvl = 0;
    get_int(comp, "level", &lvl);
    m->zstd_level = (int)lvl;
    m->bf16_split = json_is_true(json_object_get(comp, "bf16_byte_split"));
    json_t *sh = json_object_get(o, "shards");
    if (!json_is_array(sh)) { st = bad(err, path, "shards"); goto done; }
    m->n_shards = (int)json_array_size(sh);
    m->shards = calloc((size_t)m->n_shards + 1, sizeof *m->shards);
    if (!m->shards) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    for (int i = 0; i < m->n_shards; i++) {
        json_t *x = json_array_get(sh, (size_t)i);
        eg_ds_shard_info *s = &m->shards[i];
        const char *f = json_string_value(json_object_get(x, "file"));
        const char *h = json_string_value(json_object_get(x, "sha256"));
        if (!f || !h || strlen(h) != 64 || strchr(f, '/') || !get_int(x, "samples", &s->samples) ||
            !get_int(x, "tokens", &s->tokens) || !get_int(x, "loss_tokens", &s->loss_tokens) ||
            !get_int(x, "finish_stop", &s->n_stop) || !get_int(x, "finish_length", &s->n_length) ||
            !get_int(x, "bytes", &s->bytes) || !get_int(x, "raw_bytes", &s->raw_bytes)) {
            m->n_shards = i;
            st = eg_fail(err, EG_ERR_FORMAT, "%s: shard entry %d malformed", path, i);
            goto done;
        }
        s->file = strdup(f);
        memcpy(s->sha256, h, 65);
        if (!s->file) { m->n_shards = i; st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    }
    json_t *c = json_object_get(o, "counts");
    for (int i = 0; i < EG_DS_NCOUNTS; i++) get_int(c, eg_ds_count_names[i], &m->counts[i]);
    json_t *tot = json_object_get(o, "totals"), *fr = json_object_get(o, "finish_reasons");
    eg_ds_totals *q = &m->stated;
    m->stated_ok = get_int(tot, "samples", &q->samples) && get_int(tot, "tokens", &q->tokens) &&
                   get_int(tot, "loss_tokens", &q->loss_tokens) && get_int(tot, "bytes", &q->bytes) &&
                   get_int(tot, "raw_bytes", &q->raw_bytes) && get_int(fr, "stop", &q->n_stop) &&
                   get_int(fr, "length", &q->n_length);
    json_t *hg = json_object_get(o, "loss_token_histogram");
    json_t *hid = json_object_get(hg, "ids"), *hc = json_object_get(hg, "counts");
    if (!json_is_array(hid) || !json_is_array(hc) || json_array_size(hid) != json_array_size(hc)) {
        st = bad(err, path, "loss_token_histogram");
        goto done;
    }
    size_t nh = json_array_size(hid);
    int64_t maxid = -1;
    for (size_t i = 0; i < nh; i++) {
        json_t *x = json_array_get(hid, i), *y = json_array_get(hc, i);
        if (!json_is_integer(x) || !json_is_integer(y) || json_integer_value(x) < 0 ||
            json_integer_value(x) > INT32_MAX || json_integer_value(y) < 0) {
            st = bad(err, path, "loss_token_histogram");
            goto done;
        }
        /* as the writer writes it: ids ascending and distinct, counts positive (a zero count
         * or a repeated id would load to a histogram that saves differently) */
        if (json_integer_value(x) <= maxid || json_integer_value(y) == 0) {
            st = eg_fail(err, EG_ERR_FORMAT,
                         "%s: loss_token_histogram: entry %zu (id %" PRId64 ", count %" PRId64
                         "): ids must be ascending and distinct, counts positive",
                         path, i, (int64_t)json_integer_value(x), (int64_t)json_integer_value(y));
            goto done;
        }
        maxid = json_integer_value(x);
    }
    /* the histogram is dense: an id must lie inside the tokenizer's vocabulary (or, when
     * that is unknown, below EG_DS_MAX_HIST_ID) */
    int64_t id_limit = m->target_vocab_size > 0 ? m->target_vocab_size : EG_DS_MAX_HIST_ID;
    if (maxid >= id_limit) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: loss_token_histogram: token id %" PRId64 " >= %s %" PRId64, path,
                     maxid, m->target_vocab_size > 0 ? "tokenizer vocab_size" : "limit", id_limit);
        goto done;
    }
    m->hist_len = maxid + 1;
    m->hist = calloc((size_t)m->hist_len + 1, sizeof(uint64_t));
    if (!m->hist) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    for (size_t i = 0; i < nh; i++)
        m->hist[json_integer_value(json_array_get(hid, i))] += (uint64_t)json_integer_value(json_array_get(hc, i));
    json_t *job = json_object_get(o, "job");
    m->job_json = job && json_is_object(job) ? json_dumps(job, JSON_COMPACT | JSON_PRESERVE_ORDER) : strdup("{}");
    if (!m->job_json) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto done; }
    json_t *prec = json_object_get(o, "precision");
    if (prec && !json_is_array(prec)) { st = eg_fail(err, EG_ERR_FORMAT, "%s: precision: expected an array", path); goto done; }
    if (prec && !(m->precision_json = json_dumps(prec, JSON_COMPACT | JSON_PRESERVE_ORDER))) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto done;
    }
done:
    json_decref(o);
    if (st) eg_ds_info_clear(m);
    return st;
}

/* ---------------------------------------------------------------- manifests of a dir */
void eg_ds_free_names(char **names, int n) {
    if (!names) return;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static int cmpstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* manifest.w{I}of{N}.json, I and N decimal digits only (as the Python loader's pattern:
 * sscanf's %u also took "+1", " 1" and "-1", so the two readers saw other manifests) */
static int digits(const char **p) {
    const char *s = *p;
    while (**p >= '0' && **p <= '9') (*p)++;
    return *p > s;
}
static int is_worker_manifest(const char *n) {
    if (strncmp(n, "manifest.w", 10)) return 0;
    const char *p = n + 10;
    if (!digits(&p) || strncmp(p, "of", 2)) return 0;
    p += 2;
    return digits(&p) && !strcmp(p, ".json");
}

static eg_status find_manifests(const char *dir, int workers, char ***names, int *n, eg_error *err) {
    *names = NULL;
    *n = 0;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, EG_DS_MANIFEST);
    if (!workers) {
        if (access(p, F_OK)) return eg_fail(err, EG_ERR_IO, "%s: no manifest", dir);
        *names = malloc(sizeof(char *));
        if (!*names || !((*names)[0] = strdup(EG_DS_MANIFEST))) {
            free(*names);
            *names = NULL;
            return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        }
        *n = 1;
        return EG_OK;
    }
    DIR *d = opendir(dir);
    if (!d) return eg_fail(err, EG_ERR_IO, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d))) {
        if (!is_worker_manifest(e->d_name)) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            char **q = realloc(*names, sizeof(char *) * (size_t)cap);
            if (!q) break;
            *names = q;
        }
        if (!((*names)[*n] = strdup(e->d_name))) break;
        (*n)++;
    }
    closedir(d);
    if (*n == 0) return eg_fail(err, EG_ERR_IO, "%s: no manifest", dir);
    qsort(*names, (size_t)*n, sizeof(char *), cmpstr);
    return EG_OK;
}

eg_status eg_ds_find_manifests(const char *dir, int prefer_workers, char ***names, int *n,
                               eg_error *err) {
    if (find_manifests(dir, !prefer_workers ? 0 : 1, names, n, NULL) == EG_OK) return EG_OK;
    if (find_manifests(dir, !prefer_workers ? 1 : 0, names, n, NULL) == EG_OK) return EG_OK;
    struct stat sb;
    if (stat(dir, &sb)) return eg_fail(err, EG_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return eg_fail(err, EG_ERR_IO, "%s: not a directory", dir);
    /* a directory that cannot be listed or searched is not "not a dataset" */
    DIR *d = opendir(dir);
    if (!d) return eg_fail(err, EG_ERR_IO, "%s: cannot read the dataset directory: %s", dir, strerror(errno));
    closedir(d);
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, EG_DS_MANIFEST);
    if (access(p, F_OK) && errno != ENOENT)
        return eg_fail(err, EG_ERR_IO, "%s: cannot read the dataset directory: %s", dir, strerror(errno));
    return eg_fail(err, EG_ERR_IO, "%s: no manifest.json or manifest.w*of*.json (not a dataset)", dir);
}
