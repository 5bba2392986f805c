/* export_specforge.c — an eaglegen dataset in SpecForge 0.2's offline EAGLE-3 layout
 * (export.h), as its scripts/prepare_hidden_states.py writes it and its
 * OfflineEagle3Dataset / train_eagle3.py read it:
 *
 *   OUT/hidden_states/rows_{a}-{a+2000}/data_{i}.ckpt   torch.save of the dict
 *       input_ids [T] int64, loss_mask [T] int64, hidden_state [1, T, H] bf16 (the
 *       post-norm final state: SpecForge's TargetHead applies lm_head to it),
 *       aux_hidden_state [1, T, n_aux*H] bf16 (aux layers concatenated in ascending
 *       layer order, as SGLang's capture concatenates them)
 *       (keys in that order: the script's DataPoint dataclass; groups of 2000 files: its
 *       --file-group-size default)
 *   OUT/vocab_mapping.pt   torch.save of {"d2t": int64 [N], "t2d": bool [V]}
 *   OUT/draft_config.json  LlamaForCausalLMEagle3 config with eagle_config's
 *                          eagle_aux_hidden_state_layer_ids in SpecForge's convention
 *   OUT/.eaglegen-export.json   what was exported; "state" running / complete (resume)
 * The target directory (lm_head + embedding) is written by gen/ through engine/. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset/export.h"
#include "dataset/manifest.h"
#include "dataset/torchsave.h"

#define SF_GROUP 2000 /* prepare_hidden_states.py --file-group-size default */
#define MARKER ".eaglegen-export.json"

static eg_status mkdir_one(const char *p, eg_error *err) {
    if (mkdir(p, 0755) && errno != EEXIST) return eg_fail(err, EG_ERR_IO, "mkdir %s: %s", p, strerror(errno));
    return EG_OK;
}

/* The marker's parameters; a rerun resumes only an export with the same ones, of the
 * same dataset: its shards by content (the manifest's SHA-256 of each: export needs the
 * manifest), since two datasets of one corpus share ids, counts and shapes (another
 * seed) and a resume would have mixed their samples. */
static char *marker_json(eg_ds_reader *r, const eg_export_opts *o, int64_t N, const char *state) {
    const eg_ds_info *m = dataset_info(r);
    json_t *sums = json_array();
    for (int i = 0; sums && i < m->n_shards; i++) json_array_append_new(sums, json_string(m->shards[i].sha256));
    if (!sums) return NULL;
    json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:I}", "exporter", "eaglegen export",
                          "to", "specforge", "samples", (json_int_t)dataset_num_samples(r), "hidden_size",
                          (json_int_t)m->hidden_size, "draft_vocab", (json_int_t)N, "max_len", (json_int_t)o->max_len,
                          "tie_order", eg_vocab_tie_name(o->tie), "n_aux", (json_int_t)m->n_aux);
    if (!j) {
        json_decref(sums);
        return NULL;
    }
    json_object_set_new(j, "shard_sha256", sums);
    if (state) json_object_set_new(j, "state", json_string(state));
    json_t *ids = json_array();
    for (int i = 0; i < dataset_num_shards(r); i++) {
        const eg_ds_index *ix = dataset_shard_index(r, i);
        json_array_append_new(ids, json_integer((json_int_t)ix->n));
    }
    json_object_set_new(j, "shard_samples", ids);
    char *s = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(j);
    return s;
}

/* OUT must be absent, empty, or an unfinished export of the same dataset and options
 * (resumed: its whole .ckpt files are kept, its *.tmp removed). */
static eg_status prepare_out(eg_ds_reader *r, const eg_export_opts *o, int64_t N, int *resumed, eg_error *err) {
    *resumed = 0;
    DIR *d = opendir(o->out_dir);
    if (!d) {
        if (errno != ENOENT) return eg_fail(err, EG_ERR_IO, "--out %s: %s", o->out_dir, strerror(errno));
        return mkdir_one(o->out_dir, err);
    }
    int n = 0;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        /* A kill between mkdir and the marker's rename leaves only the marker's own .tmp:
         * that is our unfinished start, not a foreign file. */
        if (!strcmp(e->d_name, MARKER ".tmp")) {
            snprintf(p, sizeof p, "%s/%s", o->out_dir, e->d_name);
            if (unlink(p) && errno != ENOENT) {
                closedir(d);
                return eg_fail(err, EG_ERR_IO, "%s: %s", p, strerror(errno));
            }
            continue;
        }
        n++;
    }
    closedir(d);
    if (!n) return EG_OK;
    snprintf(p, sizeof p, "%s/" MARKER, o->out_dir);
    json_error_t je;
    json_t *mk = json_load_file(p, 0, &je);
    if (!mk)
        return eg_fail(err, EG_ERR_INVALID,
                       "--out %s holds %d files and is not an unfinished eaglegen export (no %s): refusing to write "
                       "into it; give an empty or new directory",
                       o->out_dir, n, MARKER);
    const char *state = json_string_value(json_object_get(mk, "state"));
    int complete = state && !strcmp(state, "complete"); /* before the key (and its string) goes */
    json_object_del(mk, "state");
    char *have = json_dumps(mk, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(mk);
    char *want = marker_json(r, o, N, NULL);
    int same = have && want && !strcmp(have, want);
    eg_status st = EG_OK;
    if (complete)
        st = eg_fail(err, EG_ERR_INVALID, "--out %s already holds a complete export (%s): remove it to export again",
                     o->out_dir, p);
    else if (!same)
        st = eg_fail(err, EG_ERR_INVALID,
                     "--out %s holds an unfinished export of another dataset or with other options (%s: %s; this run: "
                     "%s): remove it, or rerun with the same options to resume",
                     o->out_dir, p, have ? have : "?", want ? want : "?");
    free(have);
    free(want);
    if (!st) *resumed = 1;
    return st;
}

static void remove_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[8192];
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".tmp")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    closedir(d);
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Draft model config: SpecForge's LlamaForCausalLMEagle3 (one decoder layer, fc from
 * 3*H), shaped like its configs/deepseek-v3-671b-eagle3.json (head_dim 128, 8 KV heads,
 * intermediate 40960/7168*H) so the defaults fit Kimi-K2.5; vocab, draft vocab and aux
 * ids from the dataset. */
static eg_status write_draft_config(const eg_export_opts *o, const eg_ds_info *m, int64_t V, int64_t N,
                                    int64_t max_T, eg_error *err) {
    int64_t H = m->hidden_size;
    int64_t hd = H % 128 == 0 ? 128 : H % 64 == 0 ? 64 : H;
    int64_t nh = H / hd, nkv = nh % 8 == 0 ? 8 : nh;
    int64_t inter = (H * 40960 / 7168 + 63) / 64 * 64;
    int64_t mpe = 2048;
    while (mpe < max_T) mpe *= 2;
    json_t *ids = json_array();
    for (int i = 0; i < m->n_aux; i++) json_array_append_new(ids, json_integer(m->aux_layers[i]));
    json_t *j = json_pack(
        "{s:[s], s:{s:o, s:b}, s:s, s:I, s:f, s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:b, s:s, s:b, s:I, s:I, "
        "s:{s:s, s:I, s:s}}",
        "architectures", "LlamaForCausalLMEagle3", "eagle_config", "eagle_aux_hidden_state_layer_ids", ids,
        "use_aux_hidden_state", 1, "hidden_act", "silu", "hidden_size", (json_int_t)H, "initializer_range", 0.02,
        "intermediate_size", (json_int_t)inter, "max_position_embeddings", (json_int_t)mpe, "model_type", "llama",
        "num_attention_heads", (json_int_t)nh, "num_key_value_heads", (json_int_t)nkv, "head_dim", (json_int_t)hd,
        "num_hidden_layers", (json_int_t)1, "pad_token_id", (json_int_t)0, "rms_norm_eps", 1e-5,
        "tie_word_embeddings", 0, "torch_dtype", "bfloat16", "use_cache", 1, "vocab_size", (json_int_t)V,
        "draft_vocab_size", (json_int_t)N, "eaglegen", "aux_layer_convention",
        "output of decoder layer k, 0-based (SpecForge/SGLang's eagle_aux_hidden_state_layer_ids)", "num_layers",
        (json_int_t)m->n_layers, "note",
        "draft shape (heads, intermediate, max_position_embeddings) chosen by eaglegen export; edit to taste");
    if (!j) return eg_fail(err, EG_ERR_NOMEM, "draft config: out of memory");
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(j);
    if (!s) return eg_fail(err, EG_ERR_NOMEM, "draft config: out of memory");
    size_t l = strlen(s);
    s[l] = '\0';
    char *s2 = realloc(s, l + 2);
    if (!s2) { free(s); return eg_fail(err, EG_ERR_NOMEM, "draft config: out of memory"); }
    s2[l] = '\n';
    s2[l + 1] = 0;
    eg_status st = eg_ds_write_atomic(o->out_dir, "draft_config.json", s2, l + 1, err);
    free(s2);
    return st;
}

eg_status eg_export_specforge(eg_ds_reader *r, const eg_export_opts *o, eg_export_report *rep, eg_error *err) {
    memset(rep, 0, sizeof *rep);
    const eg_ds_info *m = dataset_info(r);
    if (!o->out_dir || !*o->out_dir) return eg_fail(err, EG_ERR_INVALID, "export: no output directory");
    if (o->max_len < 0) return eg_fail(err, EG_ERR_INVALID, "export: max_len %" PRId64 " < 0", o->max_len);
    if (dataset_has_manifest(r) && m->final_source == EG_DS_FINAL_PRE_NORM)
        return eg_fail(err, EG_ERR_INVALID,
                       "the dataset holds only the pre-norm final state; SpecForge's target is the post-norm one "
                       "(lm_head's input): generate with --final-hidden both (the default) or post-norm");
    if (m->n_aux != 3)
        return eg_fail(err, EG_ERR_INVALID,
                       "the dataset stores %d aux layers; SpecForge's LlamaForCausalLMEagle3 takes exactly 3 "
                       "(fc = Linear(3*hidden, hidden)): generate with --aux-layers a,b,c",
                       m->n_aux);
    /* SpecForge concatenates its three aux states low to high (FORMAT.md §11); a version-1
       dataset may list another order, which its hidden states then follow */
    for (int l = 1; dataset_has_manifest(r) && l < m->n_aux; l++)
        if (m->aux_layers[l] <= m->aux_layers[l - 1])
            return eg_fail(err, EG_ERR_INVALID, "aux layers must be ascending and distinct for SpecForge (the manifest "
                           "lists %d after %d)", m->aux_layers[l], m->aux_layers[l - 1]);
    int64_t V = m->target_vocab_size;
    if (!V)
        return eg_fail(err, EG_ERR_INVALID,
                       "the dataset does not record the target vocabulary size (a shard opened alone, or a manifest "
                       "without tokenizer.vocab_size): export the dataset directory");
    int64_t N = o->draft_vocab ? o->draft_vocab : (V < 32000 ? V : 32000);
    if (N < 1 || N > V)
        return eg_fail(err, EG_ERR_INVALID, "--draft-vocab %" PRId64 " must be 1..%" PRId64 " (the target vocabulary)", N,
                       V);
    int resumed;
    eg_status st = prepare_out(r, o, N, &resumed, err);
    if (st) return st;
    char *mk = marker_json(r, o, N, "running");
    if (!mk) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    st = eg_ds_write_atomic(o->out_dir, MARKER, mk, strlen(mk), err);
    free(mk);
    if (st) return st;

    char hs[4096], grp[4200], name[64];
    snprintf(hs, sizeof hs, "%s/hidden_states", o->out_dir);
    if ((st = mkdir_one(hs, err))) return st;
    int64_t n = dataset_num_samples(r), max_T = 0, skipped = 0;
    int64_t *ids64 = NULL, *mask64 = NULL, cap = 0, cur_group = -1;
    for (int64_t i = 0; i < n && !st; i++) {
        int64_t g = i / SF_GROUP * SF_GROUP;
        if (g != cur_group) {
            if (cur_group >= 0 && (st = eg_ds_fsync_dir(grp, err))) break;
            snprintf(grp, sizeof grp, "%s/rows_%" PRId64 "-%" PRId64, hs, g, g + SF_GROUP);
            if ((st = mkdir_one(grp, err))) break;
            if (resumed) remove_tmp(grp);
            cur_group = g;
        }
        snprintf(name, sizeof name, "data_%" PRId64 ".ckpt", i);
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", grp, name);
        const eg_ds_index_entry *ent = dataset_entry(r, i, NULL, NULL);
        int64_t T = ent ? (int64_t)ent->T : 0;
        if (o->max_len && T > o->max_len) T = o->max_len;
        if (T > max_T) max_T = T;
        if (resumed && file_exists(path)) {
            struct stat sb;
            if (!stat(path, &sb)) rep->bytes_written += sb.st_size;
            rep->tokens += T;
            rep->samples++;
            skipped++;
            continue;
        }
        eg_ds_sample s;
        if ((st = dataset_read(r, i, 0, &s, err))) break;
        T = s.T;
        if (o->max_len && T > o->max_len) T = o->max_len;
        if (T > cap) {
            free(ids64);
            free(mask64);
            ids64 = malloc(sizeof *ids64 * (size_t)T);
            mask64 = malloc(sizeof *mask64 * (size_t)T);
            cap = T;
            if (!ids64 || !mask64) {
                eg_ds_sample_clear(&s);
                st = eg_fail(err, EG_ERR_NOMEM, "sample %s: out of memory for %" PRId64 " tokens", s.id, T);
                break;
            }
        }
        for (int64_t t = 0; t < T; t++) {
            ids64[t] = s.input_ids[t];
            mask64[t] = s.loss_mask[t];
        }
        int64_t H = s.H, A = s.n_aux;
        /* aux is [T][n_aux][H] token-major: its first T rows are [T, n_aux*H] as is */
        eg_pt_tensor pt[4] = {
            {"input_ids", EG_PT_I64, 1, {T}, ids64},
            {"loss_mask", EG_PT_I64, 1, {T}, mask64},
            {"hidden_state", EG_PT_BF16, 3, {1, T, H}, s.final_hidden},
            {"aux_hidden_state", EG_PT_BF16, 3, {1, T, A * H}, s.aux_hidden},
        };
        uint64_t b = 0;
        st = eg_torch_save(grp, name, pt, 4, &b, err);
        if (st) eg_wrap(err, "sample %" PRId64 " (id %s)", i, s.id);
        eg_ds_sample_clear(&s);
        rep->bytes_written += (int64_t)b;
        rep->tokens += T;
        rep->samples++;
        if (o->progress) o->progress(o->progress_ctx, i + 1, n, rep->bytes_written);
    }
    free(ids64);
    free(mask64);
    if (!st && cur_group >= 0) st = eg_ds_fsync_dir(grp, err);
    if (!st) st = eg_ds_fsync_dir(hs, err);
    if (st) return st;

    /* vocabulary mapping and draft config */
    eg_draft_vocab dv;
    if ((st = eg_draft_vocab_build_cut(r, N, V, o->tie, o->max_len, &dv, err))) return eg_wrap(err, "draft vocabulary");
    uint8_t *t2d = dv.t2d; /* bool: one byte 0/1 */
    eg_pt_tensor vm[2] = {{"d2t", EG_PT_I64, 1, {N}, dv.d2t}, {"t2d", EG_PT_BOOL, 1, {V}, t2d}};
    uint64_t b = 0;
    st = eg_torch_save(o->out_dir, "vocab_mapping.pt", vm, 2, &b, err);
    rep->bytes_written += (int64_t)b;
    rep->draft_vocab = N;
    double cover = dv.total ? (double)dv.covered / (double)dv.total : 0;
    int64_t pad = dv.padding;
    eg_draft_vocab_clear(&dv);
    if (!st) st = write_draft_config(o, m, V, N, max_T, err);
    if (st) return st;
    mk = marker_json(r, o, N, "complete");
    if (!mk) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    st = eg_ds_write_atomic(o->out_dir, MARKER, mk, strlen(mk), err);
    free(mk);
    if (st) return st;

    char aux[256] = "";
    for (int i = 0, p = 0; i < m->n_aux; i++)
        p += snprintf(aux + p, sizeof aux - (size_t)p, "%s%d", i ? "," : "", m->aux_layers[i]);
    snprintf(rep->summary, sizeof rep->summary,
             "specforge: %" PRId64 " samples (%" PRId64 " already there), %" PRId64 " tokens, %.1f MB in %s/hidden_states "
             "(rows_*/data_*.ckpt)\n"
             "  vocab mapping %s/vocab_mapping.pt: %" PRId64 " of %" PRId64 " ids (tie order %s, %" PRId64
             " padding), covering %.2f%% of loss tokens\n"
             "  draft config %s/draft_config.json: eagle_aux_hidden_state_layer_ids [%s] (SpecForge = eaglegen: output "
             "of layer k), hidden %" PRId64 ", vocab %" PRId64 ", draft vocab %" PRId64,
             rep->samples, skipped, rep->tokens, (double)rep->bytes_written / 1e6, o->out_dir, o->out_dir, N, V,
             eg_vocab_tie_name(o->tie), pad, 100.0 * cover, o->out_dir, aux, m->hidden_size, V, N);
    int64_t L = o->max_len ? o->max_len : max_T;
    /* paths as shell words: the line is printed to be pasted (a space in --out broke it) */
    static const char *const sub[5] = {"target", "draft_config.json", "hidden_states", "cache", "draft-out"};
    char *q[5] = {0};
    int ok = 1;
    for (int i = 0; i < 5 && ok; i++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", o->out_dir, sub[i]);
        ok = (q[i] = eg_shell_quote(p)) != NULL;
    }
    if (ok)
        snprintf(rep->trainer_command, sizeof rep->trainer_command,
                 "torchrun --standalone --nproc_per_node 1 scripts/train_eagle3.py --target-model-path %s "
                 "--draft-model-config %s --train-hidden-states-path %s "
                 "--train-data-path CONVERSATIONS.jsonl --chat-template TEMPLATE --max-length %" PRId64
                 " --cache-dir %s --output-dir %s --embedding-key model.embed_tokens.weight "
                 "--lm-head-key lm_head.weight",
                 q[0], q[1], q[2], L, q[3], q[4]);
    for (int i = 0; i < 5; i++) free(q[i]);
    return ok ? EG_OK : eg_fail(err, EG_ERR_NOMEM, "out of memory");
}
