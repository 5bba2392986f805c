/* export_target.c — lm_head + embedding target directory (export_target.h). */
#define _POSIX_C_SOURCE 200809L
#include "engine/export_target.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/safetensors.h"

/* The file of the index's weight map holding `name` under either prefix; the name found
 * goes to found[256]. */
static const char *lookup(json_t *wm, const char *name, char found[256]) {
    static const char *pre[] = {"", "language_model."};
    for (int i = 0; i < 2; i++) {
        snprintf(found, 256, "%s%s", pre[i], name);
        const char *f = json_string_value(json_object_get(wm, found));
        if (f) return f;
    }
    return NULL;
}

static eg_status write_text(const char *dir, const char *name, const char *s, eg_error *err) {
    char p[4096], t[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    snprintf(t, sizeof t, "%s.tmp", p);
    FILE *f = fopen(t, "wb");
    if (!f) return eg_fail(err, EG_ERR_IO, "%s: %s", t, strerror(errno));
    size_t n = strlen(s);
    int bad = fwrite(s, 1, n, f) != n || fflush(f) || fsync(fileno(f));
    bad |= fclose(f) != 0;
    if (bad || rename(t, p)) {
        unlink(t);
        return eg_fail(err, EG_ERR_IO, "writing %s: %s", p, strerror(errno));
    }
    return EG_OK;
}

static eg_status copy_file(const char *src, const char *dir, const char *name, int64_t *bytes, eg_error *err) {
    FILE *f = fopen(src, "rb");
    if (!f) return eg_fail(err, EG_ERR_IO, "%s: %s", src, strerror(errno));
    char p[4096], t[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    snprintf(t, sizeof t, "%s.tmp", p);
    FILE *o = fopen(t, "wb");
    if (!o) {
        fclose(f);
        return eg_fail(err, EG_ERR_IO, "%s: %s", t, strerror(errno));
    }
    char b[65536];
    size_t n;
    int bad = 0;
    while ((n = fread(b, 1, sizeof b, f)) > 0) {
        if (fwrite(b, 1, n, o) != n) bad = 1;
        *bytes += (int64_t)n;
    }
    bad |= ferror(f) || fflush(o) || fsync(fileno(o));
    fclose(f);
    bad |= fclose(o) != 0;
    if (bad || rename(t, p)) {
        unlink(t);
        return eg_fail(err, EG_ERR_IO, "copying %s to %s: %s", src, p, strerror(errno));
    }
    return EG_OK;
}

static int is_tokenizer_file(const char *n) {
    return !strncmp(n, "tokenizer", 9) || !strcmp(n, "tiktoken.model") || !strcmp(n, "special_tokens_map.json") ||
           (strlen(n) > 9 && !strcmp(n + strlen(n) - 9, ".tiktoken"));
}

eg_status eg_export_target(const char *model_dir, const char *out_dir, eg_target_info *info, eg_error *err) {
    memset(info, 0, sizeof *info);
    eg_config cfg;
    eg_status st = eg_config_load(model_dir, &cfg, err);
    if (st) return st;
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", model_dir);
    json_error_t je;
    json_t *ix = json_load_file(p, 0, &je), *wm = json_object_get(ix, "weight_map");
    eg_st_file *fe = NULL, *fl = NULL;
    eg_st_writer *w = NULL;
    json_t *cj = NULL;
    char *cs = NULL;
    if (!ix || !json_is_object(wm)) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: %s", p, ix ? "no weight_map object" : je.text);
        goto done;
    }
    char ename[256], lname[256];
    const char *ef = lookup(wm, "model.embed_tokens.weight", ename), *lf = lookup(wm, "lm_head.weight", lname);
    if (!ef) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: no model.embed_tokens.weight (nor language_model.-prefixed)", p);
        goto done;
    }
    if (!lf && !cfg.tie_embeddings) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: no lm_head.weight and the config does not tie embeddings", p);
        goto done;
    }
    snprintf(p, sizeof p, "%s/%s", model_dir, ef);
    if ((st = eg_st_open(p, &fe, err))) goto done;
    const eg_st_tensor *te = eg_st_find(fe, ename), *tl = te;
    if (lf) {
        snprintf(p, sizeof p, "%s/%s", model_dir, lf);
        if (strcmp(lf, ef) && (st = eg_st_open(p, &fl, err))) goto done;
        tl = eg_st_find(fl ? fl : fe, lname);
    }
    if (!te || !tl) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: the index names %s but the file lacks it", p, !te ? ename : lname);
        goto done;
    }
    for (int k = 0; k < 2; k++) {
        const eg_st_tensor *t = k ? tl : te;
        if (t->ndim != 2 || t->shape[0] != cfg.vocab || t->shape[1] != cfg.hidden) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: %s is [%" PRId64 ", %" PRId64 "], the config says [%d, %d]", p, t->name,
                         t->shape[0], t->ndim > 1 ? t->shape[1] : 0, cfg.vocab, cfg.hidden);
            goto done;
        }
    }
    if (mkdir(out_dir, 0755) && errno != EEXIST) {
        st = eg_fail(err, EG_ERR_IO, "mkdir %s: %s", out_dir, strerror(errno));
        goto done;
    }
    if ((st = eg_st_writer_new(&w, err))) goto done;
    if ((st = eg_st_writer_add(w, "lm_head.weight", tl->dtype, 2, tl->shape, tl->data, err))) goto done;
    if ((st = eg_st_writer_add(w, "model.embed_tokens.weight", te->dtype, 2, te->shape, te->data, err))) goto done;
    if ((st = eg_st_writer_meta(w, "format", "pt", err))) goto done;
    snprintf(p, sizeof p, "%s/model.safetensors", out_dir);
    info->bytes += (int64_t)eg_st_writer_size(w);
    if ((st = eg_st_writer_write(w, p, err))) goto done;
    cj = json_pack("{s:{s:I}, s:{s:s, s:s}}", "metadata", "total_size", (json_int_t)eg_st_writer_size(w), "weight_map",
                   "lm_head.weight", "model.safetensors", "model.embed_tokens.weight", "model.safetensors");
    cs = json_dumps(cj, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!cs || (st = write_text(out_dir, "model.safetensors.index.json", cs, err))) {
        if (!st) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto done;
    }
    free(cs);
    json_decref(cj);
    json_t *eos = cfg.n_eos ? json_integer(cfg.eos_ids[0]) : json_null();
    cj = json_pack("{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:o, s:b, s:s, s:s}", "architectures",
                   "LlamaForCausalLM", "model_type", "llama", "hidden_size", (json_int_t)cfg.hidden, "vocab_size",
                   (json_int_t)cfg.vocab, "num_hidden_layers", (json_int_t)cfg.n_layers, "num_attention_heads",
                   (json_int_t)cfg.n_heads, "intermediate_size", (json_int_t)cfg.inter, "max_position_embeddings",
                   (json_int_t)cfg.max_pos, "rms_norm_eps", (double)cfg.rms_eps, "bos_token_id", (json_int_t)cfg.bos_id,
                   "eos_token_id", eos, "tie_word_embeddings", 0, "torch_dtype", "bfloat16", "eaglegen_note",
                   "lm_head and token embedding only (eaglegen export), for a drafter trainer's target head; "
                   "not a runnable model");
    cs = cj ? json_dumps(cj, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    if (!cs || (st = write_text(out_dir, "config.json", cs, err))) {
        if (!st) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto done;
    }
    DIR *d = opendir(model_dir);
    struct dirent *e;
    while (d && (e = readdir(d)) && !st) {
        if (!is_tokenizer_file(e->d_name)) continue;
        char src[4096];
        snprintf(src, sizeof src, "%s/%s", model_dir, e->d_name);
        struct stat sb;
        if (stat(src, &sb) || !S_ISREG(sb.st_mode)) continue;
        if (!(st = copy_file(src, out_dir, e->d_name, &info->bytes, err))) info->tokenizer_files++;
    }
    if (d) closedir(d);
    info->hidden = cfg.hidden;
    info->vocab = cfg.vocab;
done:
    free(cs);
    json_decref(cj);
    json_decref(ix);
    eg_st_writer_free(w);
    eg_st_close(fe);
    eg_st_close(fl);
    eg_config_free(&cfg);
    return st;
}
