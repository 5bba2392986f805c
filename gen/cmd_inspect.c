/* eaglegen inspect: summarise, list, show or verify a dataset (directory) or one shard. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/eg_common.h"
#include "dataset/reader.h"
#include "gen/args.h"
#include "gen/commands.h"
#include "prompts/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen inspect PATH [options]\n"
            "\n"
            "PATH is a dataset directory (manifest.json, or the manifest.w*of*.json of unmerged\n"
            "workers) or a single shard file (its own numbers; the description from the manifest\n"
            "beside it when one lists it). Without options: a summary (model, layers, dtypes,\n"
            "samples, tokens, loss-masked tokens, bytes on disk, compression ratio, finish reasons,\n"
            "bookkeeping counts, shards, and hidden-state statistics over a few samples).\n"
            "\n"
            "options:\n"
            "  --verify           check every shard checksum (sha256), the tar structure against the\n"
            "                     index, every sample (header CRC, zstd frame checksums, shapes,\n"
            "                     metadata), per-shard counts, raw bytes and the histogram against\n"
            "                     the manifest, each manifest's totals and finish reasons against its\n"
            "                     shard list, and scan hidden states for NaN/Inf; exits 1 naming\n"
            "                     manifest, shard and sample\n"
            "                     on any problem (`eaglegen repair DIR` sets damaged shards aside)\n"
            "  --json             machine-readable output (one JSON object on stdout)\n"
            "  --list             list every sample: index, id, tokens, loss tokens, finish, shard\n"
            "  --sample ID|INDEX  show one sample (repeatable): metadata, token ids with the loss mask,\n"
            "                     text (the tokenizer the job recorded, or --tokenizer), per-layer\n"
            "                     statistics and a few values\n"
            "  --show N           show the first N samples as --sample does\n"
            "  --tokenizer DIR    decode token ids to text with DIR (tiktoken.model +\n"
            "                     tokenizer_config.json) instead of the one the manifest records\n"
            "  --stats-samples N  samples used for the summary's hidden-state statistics (default 8;\n"
            "                     --verify always uses all)\n"
            "  -h, --help         this help\n"
            "\n"
            "exit status: 0 ok, 1 damaged or unreadable data (or a --sample the dataset does not hold),\n"
            "2 usage error\n");
}

typedef struct stat_acc {
    double sum, sq, mn, mx;
    int64_t n, nan, inf;
} stat_acc;

static void acc_init(stat_acc *a) {
    memset(a, 0, sizeof *a);
    a->mn = INFINITY;
    a->mx = -INFINITY;
}

static void acc_bf16(stat_acc *a, const uint16_t *v, size_t n, size_t stride, size_t len) {
    /* n runs of len values, stride apart */
    for (size_t r = 0; r < n; r++)
        for (size_t i = 0; i < len; i++) {
            float x = eg_bf16_to_f32(v[r * stride + i]);
            if (isnan(x)) { a->nan++; continue; }
            if (isinf(x)) { a->inf++; continue; }
            a->sum += x;
            a->sq += (double)x * x;
            if (x < a->mn) a->mn = x;
            if (x > a->mx) a->mx = x;
            a->n++;
        }
}

static json_t *acc_json(const stat_acc *a, const char *name) {
    double mean = a->n ? a->sum / (double)a->n : 0, var = a->n ? a->sq / (double)a->n - mean * mean : 0;
    return json_pack("{s:s,s:I,s:f,s:f,s:f,s:f,s:I,s:I}", "layer", name, "values", (json_int_t)a->n, "mean", mean,
                     "std", var > 0 ? sqrt(var) : 0.0, "min", a->n ? a->mn : 0.0, "max", a->n ? a->mx : 0.0,
                     "nan", (json_int_t)a->nan, "inf", (json_int_t)a->inf);
}

static void acc_print(const stat_acc *a, const char *name) {
    double mean = a->n ? a->sum / (double)a->n : 0, var = a->n ? a->sq / (double)a->n - mean * mean : 0;
    printf("    %-14s mean %+.4e  std %.4e  min %+.4e  max %+.4e  nan %" PRId64 "  inf %" PRId64 "\n", name, mean,
           var > 0 ? sqrt(var) : 0.0, a->n ? a->mn : 0.0, a->n ? a->mx : 0.0, a->nan, a->inf);
}

/* Per-plane accumulators, N_PLANES(n_aux) of them: [0, n_aux) aux layers, n_aux final,
 * n_aux + 1 the pre-norm final state of a record that holds both (--final-hidden both). */
#define N_PLANES(n_aux) ((n_aux) + 2)
static void acc_sample(stat_acc *acc, const eg_ds_sample *s) {
    size_t T = (size_t)s->T, H = (size_t)s->H, na = (size_t)s->n_aux;
    for (size_t l = 0; l < na; l++) acc_bf16(&acc[l], (const uint16_t *)s->aux_hidden + l * H, T, na * H, H);
    acc_bf16(&acc[na], s->final_hidden, T, H, H);
    if (s->final_pre_hidden) acc_bf16(&acc[na + 1], s->final_pre_hidden, T, H, H);
}

/* The planes to show: the pre-norm one only where some record held it. */
static int planes_seen(const stat_acc *acc, int n_aux) {
    const stat_acc *p = &acc[n_aux + 1];
    return n_aux + 1 + (p->n + p->nan + p->inf > 0);
}

static void layer_name(const eg_ds_info *m, int l, char *buf, size_t n) {
    if (l < m->n_aux && m->aux_layers) snprintf(buf, n, "aux[%d] L%d", l, m->aux_layers[l]);
    else if (l < m->n_aux) snprintf(buf, n, "aux[%d]", l);
    else if (l == m->n_aux) snprintf(buf, n, "final");
    else snprintf(buf, n, "final pre-norm");
}

/* Token 0's row of plane l (N_PLANES). */
static const uint16_t *plane_row0(const eg_ds_sample *s, int l) {
    if (l < s->n_aux) return (const uint16_t *)s->aux_hidden + (size_t)l * (size_t)s->H;
    return l == s->n_aux ? (const uint16_t *)s->final_hidden : (const uint16_t *)s->final_pre_hidden;
}

/* ---------------------------------------------------------------- one sample */
static int show_sample(const eg_ds_reader *r, int64_t i, const tok_tokenizer *tok, json_t *jout) {
    eg_error err = {0};
    eg_ds_sample s;
    if (dataset_read(r, i, 0, &s, &err)) {
        fprintf(stderr, "eaglegen inspect: %s\n", err.msg);
        return 1;
    }
    const eg_ds_info *m = dataset_info(r);
    int shard;
    int64_t pos;
    dataset_entry(r, i, &shard, &pos);
    int nl = N_PLANES(s.n_aux);
    stat_acc *acc = calloc((size_t)nl, sizeof *acc);
    if (!acc) {
        fprintf(stderr, "eaglegen inspect: out of memory\n");
        eg_ds_sample_clear(&s);
        return 1;
    }
    for (int l = 0; l < nl; l++) acc_init(&acc[l]);
    acc_sample(acc, &s);
    nl = planes_seen(acc, s.n_aux);
    int64_t n_loss = 0;
    for (int64_t t = 0; t < s.T; t++) n_loss += s.loss_mask[t];
    char *text = NULL, *gen_text = NULL;
    if (tok) {
        size_t len;
        if (tok_decode(tok, s.input_ids, (size_t)s.T, &text, &len, &err)) fprintf(stderr, "eaglegen inspect: decode: %s\n", err.msg);
        int32_t *gi = malloc(sizeof(int32_t) * (size_t)(s.T ? s.T : 1));
        size_t ng = 0;
        for (int64_t t = 0; t < s.T; t++)
            if (s.loss_mask[t]) gi[ng++] = s.input_ids[t];
        if (tok_decode(tok, gi, ng, &gen_text, &len, &err)) gen_text = NULL;
        free(gi);
    }
    if (jout) {
        json_t *o = json_pack("{s:I,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:s,s:f,s:f,s:I}", "index", (json_int_t)i, "id",
                              s.id, "shard", dataset_shard_path(r, shard), "source_file", s.source_file,
                              "source_line", (json_int_t)s.source_line, "tokens", (json_int_t)s.T, "prompt_len",
                              (json_int_t)s.prompt_len, "gen_len", (json_int_t)s.gen_len, "loss_tokens",
                              (json_int_t)n_loss, "finish", eg_ds_finish_name(s.finish), "temperature",
                              s.temperature, "top_p", s.top_p, "top_k", (json_int_t)s.top_k);
        char seed[32];
        snprintf(seed, sizeof seed, "%" PRIu64, s.seed);
        json_object_set_new(o, "seed", json_string(seed));
        json_t *ids = json_array(), *mask = json_array();
        for (int64_t t = 0; t < s.T; t++) {
            json_array_append_new(ids, json_integer(s.input_ids[t]));
            json_array_append_new(mask, json_integer(s.loss_mask[t]));
        }
        json_object_set_new(o, "input_ids", ids);
        json_object_set_new(o, "loss_mask", mask);
        json_t *jt;
        if (text && (jt = json_string(text))) json_object_set_new(o, "text", jt);
        if (gen_text && (jt = json_string(gen_text))) json_object_set_new(o, "generated_text", jt);
        json_t *st = json_array(), *vals = json_array();
        for (int l = 0; l < nl; l++) {
            char nm[64];
            layer_name(m, l, nm, sizeof nm);
            json_array_append_new(st, acc_json(&acc[l], nm));
            json_t *v = json_array();
            const uint16_t *row = plane_row0(&s, l);
            for (int64_t h = 0; h < s.H && h < 8; h++) json_array_append_new(v, json_real(eg_bf16_to_f32(row[h])));
            json_array_append_new(vals, json_pack("{s:s,s:o}", "layer", nm, "token0_first_values", v));
        }
        json_object_set_new(o, "hidden_stats", st);
        json_object_set_new(o, "hidden_values", vals);
        json_array_append_new(jout, o);
    } else {
        printf("sample %" PRId64 "  id %s  (shard %s, #%" PRId64 ")\n", i, s.id, dataset_shard_path(r, shard), pos);
        printf("  source %s:%" PRId64 "  tokens %" PRId64 " (prompt %" PRId64 ", generated %" PRId64 ", loss-masked %" PRId64
               ")  finish %s\n",
               s.source_file, s.source_line, s.T, s.prompt_len, s.gen_len, n_loss, eg_ds_finish_name(s.finish));
        printf("  sampling: temperature %g  top_p %g  top_k %" PRId64 "  seed %" PRIu64 "\n", s.temperature, s.top_p,
               s.top_k, s.seed);
        printf("  tokens (* = loss mask 1):\n   ");
        for (int64_t t = 0; t < s.T; t++) {
            printf(" %d%s", s.input_ids[t], s.loss_mask[t] ? "*" : "");
            if (t % 16 == 15 && t + 1 < s.T) printf("\n   ");
        }
        printf("\n");
        if (text) printf("  text:\n%s\n  generated (masked) text:\n%s\n", text, gen_text ? gen_text : "");
        printf("  hidden states (BF16, [T=%" PRId64 "][%d][H=%" PRId64 "] + final [T][H]%s):\n", s.T, s.n_aux, s.H,
               s.final_pre_hidden ? " + final pre-norm [T][H]" : "");
        for (int l = 0; l < nl; l++) {
            char nm[64];
            layer_name(m, l, nm, sizeof nm);
            acc_print(&acc[l], nm);
        }
        for (int l = 0; l < nl; l++) {
            char nm[64];
            layer_name(m, l, nm, sizeof nm);
            const uint16_t *row = plane_row0(&s, l);
            printf("    %-14s token 0:", nm);
            for (int64_t h = 0; h < s.H && h < 8; h++) printf(" %+.4g", eg_bf16_to_f32(row[h]));
            printf("%s\n", s.H > 8 ? " ..." : "");
        }
    }
    free(text);
    free(gen_text);
    free(acc);
    eg_ds_sample_clear(&s);
    return 0;
}

/* ---------------------------------------------------------------- verify */
typedef struct verify_state {
    int64_t problems;
    int64_t damaged; /* of them: a shard's bytes (what `repair` sets aside); not values written so */
    json_t *errors; /* array of strings */
    int json;
} verify_state;

static void problem(verify_state *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(verify_state *v, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    v->problems++;
    if (v->problems <= 1000) {
        fprintf(stderr, "error: %s\n", buf);
        json_array_append_new(v->errors, json_string(buf));
    }
}

/* Each manifest of dir states its totals and finish reasons; they must be the sums over
 * its shard entries (which the shards themselves are checked against). */
static void verify_totals(const char *dir, verify_state *v) {
    char **names = NULL;
    int nn = 0;
    eg_error err = {0};
    if (eg_ds_find_manifests(dir, 0, &names, &nn, &err)) {
        problem(v, "%s", err.msg);
        return;
    }
    for (int k = 0; k < nn; k++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, names[k]);
        eg_ds_info m;
        if (eg_ds_info_load(p, &m, &err)) {
            problem(v, "%s", err.msg);
            continue;
        }
        eg_ds_totals t = eg_ds_info_totals(&m), q = m.stated;
        if (!m.stated_ok)
            problem(v, "%s: totals or finish_reasons missing or mistyped", p);
        else if (q.samples != t.samples || q.tokens != t.tokens || q.loss_tokens != t.loss_tokens ||
                 q.bytes != t.bytes || q.raw_bytes != t.raw_bytes || q.n_stop != t.n_stop || q.n_length != t.n_length)
            problem(v, "%s: totals say %" PRId64 " samples, %" PRId64 " tokens, %" PRId64 " loss tokens, %" PRId64
                    " bytes, %" PRId64 " raw bytes, %" PRId64 "/%" PRId64 " stop/length; its shards sum to %" PRId64
                    ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "/%" PRId64, p, q.samples, q.tokens,
                    q.loss_tokens, q.bytes, q.raw_bytes, q.n_stop, q.n_length, t.samples, t.tokens, t.loss_tokens, t.bytes,
                    t.raw_bytes, t.n_stop, t.n_length);
        eg_ds_info_clear(&m);
    }
    eg_ds_free_names(names, nn);
}

static void verify(const char *dir, const eg_ds_reader *r, verify_state *v, stat_acc *acc) {
    const eg_ds_info *m = dataset_info(r);
    eg_error err = {0};
    uint64_t *hist = NULL;
    int64_t hist_len = 0;
    if (dataset_has_manifest(r)) verify_totals(dir, v);
    for (int sh = 0; sh < dataset_num_shards(r); sh++) {
        const char *path = dataset_shard_path(r, sh);
        if (dataset_verify_shard(r, sh, &err)) problem(v, "%s", err.msg), v->damaged++;
        const eg_ds_index *ix = dataset_shard_index(r, sh);
        int64_t first = dataset_shard_first(r, sh), tokens = 0, loss = 0, n_stop = 0, n_len = 0, raw = 0;
        for (uint64_t k = 0; k < ix->n; k++) {
            int64_t i = first + (int64_t)k;
            eg_ds_sample s;
            if (dataset_read(r, i, 0, &s, &err)) {
                problem(v, "%s", err.msg);
                v->damaged++;
                continue;
            }
            char where[1400];
            snprintf(where, sizeof where, "shard %s, sample %" PRId64 " (#%" PRIu64 " in shard, id %s)", path, i, k, s.id);
            tokens += s.T;
            /* what the writer counts (eg_ds_record_encode): ids, mask and hidden states */
            raw += s.T * (5 + 2 * s.H * (s.n_aux + (s.final_pre_hidden ? 2 : 1)));
            if (s.finish == EG_DS_FINISH_LENGTH) n_len++;
            else n_stop++;
            int32_t maxid = -1;
            for (int64_t t = 0; t < s.T; t++) {
                int32_t id = s.input_ids[t];
                if (id < 0 || (m->target_vocab_size && id >= m->target_vocab_size)) {
                    problem(v, "%s: input_ids[%" PRId64 "] = %d outside the vocabulary", where, t, id);
                    break;
                }
                if (s.loss_mask[t] && id > maxid) maxid = id;
            }
            if (maxid >= hist_len) {
                uint64_t *q = realloc(hist, sizeof(uint64_t) * (size_t)(maxid + 1));
                if (q) {
                    memset(q + hist_len, 0, sizeof(uint64_t) * (size_t)(maxid + 1 - hist_len));
                    hist = q;
                    hist_len = maxid + 1;
                }
            }
            for (int64_t t = 0; t < s.T; t++)
                if (s.loss_mask[t] && s.input_ids[t] >= 0 && s.input_ids[t] < hist_len) {
                    hist[s.input_ids[t]]++;
                    loss++;
                }
            int nl = N_PLANES(s.n_aux);
            stat_acc *one = calloc((size_t)nl, sizeof *one);
            if (!one) {
                problem(v, "%s: out of memory", where);
                eg_ds_sample_clear(&s);
                continue;
            }
            for (int l = 0; l < nl; l++) acc_init(&one[l]);
            acc_sample(one, &s);
            for (int l = 0; l < nl; l++) {
                if (one[l].nan || one[l].inf) {
                    char nm[64];
                    layer_name(m, l, nm, sizeof nm);
                    problem(v, "%s: %s has %" PRId64 " NaN and %" PRId64 " Inf values", where, nm, one[l].nan, one[l].inf);
                }
                acc[l].sum += one[l].sum;
                acc[l].sq += one[l].sq;
                acc[l].n += one[l].n;
                acc[l].nan += one[l].nan;
                acc[l].inf += one[l].inf;
                if (one[l].mn < acc[l].mn) acc[l].mn = one[l].mn;
                if (one[l].mx > acc[l].mx) acc[l].mx = one[l].mx;
            }
            free(one);
            eg_ds_sample_clear(&s);
        }
        if (dataset_has_manifest(r)) {
            const eg_ds_shard_info *si = &m->shards[sh];
            if (si->tokens != tokens || si->loss_tokens != loss || si->n_stop != n_stop || si->n_length != n_len ||
                si->raw_bytes != raw)
                problem(v, "shard %s: manifest says %" PRId64 " tokens, %" PRId64 " loss tokens, %" PRId64 "/%" PRId64
                        " stop/length, %" PRId64 " raw bytes; the samples hold %" PRId64 ", %" PRId64 ", %" PRId64
                        "/%" PRId64 ", %" PRId64, path, si->tokens, si->loss_tokens, si->n_stop, si->n_length,
                        si->raw_bytes, tokens, loss, n_stop, n_len, raw);
        }
    }
    if (dataset_has_manifest(r)) {
        int64_t n = hist_len > m->hist_len ? hist_len : m->hist_len;
        for (int64_t id = 0; id < n; id++) {
            uint64_t a = id < hist_len ? hist[id] : 0, b = id < m->hist_len ? m->hist[id] : 0;
            if (a != b) {
                problem(v, "manifest histogram: token %" PRId64 " counted %" PRIu64 " times, the samples hold %" PRIu64, id, b, a);
                break;
            }
        }
    }
    free(hist);
}

/* Distinct loss-masked token ids over every sample of r (for a shard without a manifest). */
static eg_status count_distinct(const eg_ds_reader *r, int64_t *distinct, eg_error *err) {
    uint8_t *seen = NULL;
    int64_t seen_len = 0, d = 0;
    eg_status st = EG_OK;
    for (int64_t i = 0; i < dataset_num_samples(r) && !st; i++) {
        eg_ds_sample s;
        if ((st = dataset_read(r, i, 0, &s, err))) break;
        for (int64_t t = 0; t < s.T; t++) {
            if (!s.loss_mask[t] || s.input_ids[t] < 0) continue;
            int64_t id = s.input_ids[t];
            if (id >= seen_len) {
                int64_t nl = id + 1 > 2 * seen_len ? id + 1 : 2 * seen_len;
                uint8_t *q = realloc(seen, (size_t)nl);
                if (!q) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory counting token ids"); break; }
                memset(q + seen_len, 0, (size_t)(nl - seen_len));
                seen = q;
                seen_len = nl;
            }
            if (!seen[id]) { seen[id] = 1; d++; }
        }
        eg_ds_sample_clear(&s);
    }
    free(seen);
    *distinct = d;
    return st;
}

/* ---------------------------------------------------------------- main */
static const char *str_of(json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

/* The manifest's precision list, one run configuration per line. */
static void print_precision(const char *list) {
    json_error_t je;
    json_t *p = list ? json_loads(list, 0, &je) : NULL, *x;
    if (!json_is_array(p) || !json_array_size(p)) {
        printf("  precision: not recorded (made before eaglegen recorded it)\n");
        json_decref(p);
        return;
    }
    size_t i;
    json_array_foreach(p, i, x) {
        json_t *k = json_object_get(x, "kernels");
        char *ks = k ? json_dumps(k, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        printf("  precision%s: KV cache %s, activations %s, backend %s on %s, kernels %s\n",
               json_array_size(p) > 1 ? " (one of several runs)" : "", str_of(x, "kv_cache"), str_of(x, "activations"),
               str_of(x, "backend"), str_of(x, "device"), ks ? ks : "{}");
        free(ks);
    }
    json_decref(p);
}

/* The manifest next to a lone shard file that lists it (by file name): 1 and *out loaded,
 * name = its path. */
static int sibling_manifest(const char *shard, eg_ds_info *out, char *name, size_t cap) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", shard);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : shard;
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    char **names = NULL;
    int n = 0, found = 0;
    eg_error e = {0};
    if (eg_ds_find_manifests(dir, 0, &names, &n, &e)) return 0;
    for (int i = 0; i < n && !found; i++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        eg_ds_info info = {0};
        if (eg_ds_info_load(p, &info, &e)) continue;
        for (int k = 0; k < info.n_shards && !found; k++) found = !strcmp(info.shards[k].file, base);
        if (found) {
            *out = info;
            snprintf(name, cap, "%s", p);
        } else eg_ds_info_clear(&info);
    }
    eg_ds_free_names(names, n);
    return found;
}

/* The tokenizer directory the manifest's job records (paths.tokenizer), if any. */
static int recorded_tokenizer(const eg_ds_info *m, char *out, size_t cap) {
    if (!m->job_json) return 0;
    json_t *j = json_loads(m->job_json, 0, NULL);
    const char *t = json_string_value(json_object_get(json_object_get(j, "paths"), "tokenizer"));
    /* a merged manifest: the jobs it was merged from (they share the tokenizer) */
    json_t *from = json_object_get(j, "merged_from"), *e;
    size_t k;
    json_array_foreach(from, k, e) {
        if (t) break;
        t = json_string_value(json_object_get(json_object_get(json_object_get(e, "job"), "paths"), "tokenizer"));
    }
    if (t) snprintf(out, cap, "%s", t);
    json_decref(j);
    return t != NULL;
}

int cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {
        {"verify", no_argument, 0, 'v'},       {"json", no_argument, 0, 'j'},
        {"list", no_argument, 0, 'l'},         {"sample", required_argument, 0, 's'},
        {"show", required_argument, 0, 'n'},   {"tokenizer", required_argument, 0, 't'},
        {"stats-samples", required_argument, 0, 'S'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int do_verify = 0, do_json = 0, do_list = 0;
    long show = 0, stats_n = 8;
    const char *tokdir = NULL;
    const char *samples[64];
    int n_samples = 0;
    optind = 1;
    int c;
    while ((c = gen_getopt(argc, argv, "inspect", "h", opts)) != -1) {
        char *end;
        switch (c) {
        case 'v': do_verify = 1; break;
        case 'j': do_json = 1; break;
        case 'l': do_list = 1; break;
        case 's':
            if (n_samples == 64) { fprintf(stderr, "eaglegen inspect: at most 64 --sample options\n"); return 2; }
            samples[n_samples++] = optarg;
            break;
        case 'n':
            errno = 0;
            show = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || show < 0) { fprintf(stderr, "eaglegen inspect: bad --show '%s'\n", optarg); return 2; }
            break;
        case 'S':
            errno = 0;
            stats_n = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || stats_n < 0) { fprintf(stderr, "eaglegen inspect: bad --stats-samples '%s'\n", optarg); return 2; }
            break;
        case 't': tokdir = optarg; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    static const char *const need[] = {"PATH (a dataset directory or a shard file)"};
    if (!gen_arg_required("inspect", "PATH [options]", argc - optind, argv + optind, 1, need,
                          (int[]){optind < argc}))
        return 2;
    const char *path = argv[optind];
    eg_error err = {0};
    eg_ds_reader *r;
    if (dataset_open(path, &r, &err)) {
        /* repair mends a dataset whose shards are damaged: only where a manifest is there
           and the failure is a shard's (it cannot mend a manifest it cannot read) */
        int has_manifest = 0;
        DIR *dd = opendir(path);
        for (struct dirent *de; dd && (de = readdir(dd));) {
            size_t nl = strlen(de->d_name);
            has_manifest |= !strncmp(de->d_name, "manifest", 8) && nl > 5 && !strcmp(de->d_name + nl - 5, ".json");
        }
        if (dd) closedir(dd);
        has_manifest &= strstr(err.msg, ".tar") != NULL;
        fprintf(stderr, "eaglegen inspect: %s%s%s%s\n", err.msg, has_manifest ? " (`eaglegen repair " : "",
                has_manifest ? path : "", has_manifest ? "` sets damaged shards aside)" : "");
        if (do_json) {
            json_t *o = json_pack("{s:s,s:b,s:[s]}", "path", path, "ok", 0, "errors", err.msg);
            json_dumpf(o, stdout, JSON_INDENT(1));
            printf("\n");
            json_decref(o);
        }
        return 1;
    }
    /* a shard given alone: its directory's manifest, when it lists the shard, describes it */
    eg_ds_info side = {0};
    const char *side_name = NULL;
    char side_buf[8192];
    if (!dataset_has_manifest(r) && sibling_manifest(path, &side, side_buf, sizeof side_buf)) side_name = side_buf;
    const eg_ds_info *desc = side_name ? &side : dataset_info(r);
    tok_tokenizer *tok = NULL;
    char tok_auto[4096] = "";
    if (!tokdir && (n_samples || show) && recorded_tokenizer(desc, tok_auto, sizeof tok_auto)) {
        /* the tokenizer the job used, as its manifest records it */
        struct stat tsb;
        if (stat(tok_auto, &tsb)) {
            fprintf(stderr, "eaglegen inspect: the tokenizer recorded in the manifest, %s, is not there (%s); "
                            "it was moved or deleted: pass --tokenizer DIR to decode the text\n", tok_auto, strerror(errno));
            eg_ds_info_clear(&side);
            dataset_close(r);
            return 1;
        }
        tokdir = tok_auto;
    }
    if (tokdir && tok_load(tokdir, &tok, &err)) {
        fprintf(stderr, "eaglegen inspect: tokenizer%s %s: %s\n", tok_auto[0] ? " recorded in the manifest," : "", tokdir, err.msg);
        eg_ds_info_clear(&side);
        dataset_close(r);
        return 1;
    }
    if (tok && tok_auto[0] && desc->tokenizer_sha256 && strcmp(tok_fingerprint(tok), desc->tokenizer_sha256)) {
        fprintf(stderr, "eaglegen inspect: the tokenizer recorded in the manifest, %s, has changed since the dataset was "
                        "made (sha256 %.16s..., the manifest says %.16s...); pass --tokenizer DIR\n", tokdir,
                tok_fingerprint(tok), desc->tokenizer_sha256);
        tok_free(tok);
        eg_ds_info_clear(&side);
        dataset_close(r);
        return 1;
    }
    const eg_ds_info *m = dataset_info(r);
    int64_t n = dataset_num_samples(r);
    int rc = 0;
    json_t *root = json_object();
    int nl = N_PLANES(m->n_aux);
    stat_acc *acc = nl > 0 ? calloc((size_t)nl, sizeof *acc) : NULL;
    if (!acc) {
        fprintf(stderr, "eaglegen inspect: %s: cannot hold statistics for %d aux layers\n", path, m->n_aux);
        json_decref(root);
        tok_free(tok);
        dataset_close(r);
        return 1;
    }
    for (int l = 0; l < nl; l++) acc_init(&acc[l]);
    verify_state vs = {0, 0, json_array(), do_json};
    int64_t stats_used = 0;
    int want_summary = do_json || do_verify || (!n_samples && !show && !do_list);
    if (!want_summary) stats_n = 0;
    if (do_verify) {
        verify(path, r, &vs, acc);
        stats_used = n;
        if (vs.problems) rc = 1;
    } else {
        int64_t k = stats_n < n ? stats_n : n;
        for (int64_t j = 0; j < k; j++) {
            int64_t i = k > 1 ? j * (n - 1) / (k - 1) : 0;
            eg_ds_sample s;
            if (dataset_read(r, i, 0, &s, &err)) {
                fprintf(stderr, "eaglegen inspect: %s\n", err.msg);
                rc = 1;
                continue;
            }
            acc_sample(acc, &s);
            stats_used++;
            eg_ds_sample_clear(&s);
        }
    }

    nl = planes_seen(acc, m->n_aux);
    /* summary */
    eg_ds_totals t = eg_ds_info_totals(m);
    int64_t distinct = 0;
    if (dataset_has_manifest(r)) {
        for (int64_t i = 0; i < m->hist_len; i++) distinct += m->hist[i] != 0;
    } else if (want_summary) {
        /* a single shard has no manifest histogram: count the loss-masked ids of its samples */
        if (count_distinct(r, &distinct, &err)) {
            fprintf(stderr, "eaglegen inspect: %s\n", err.msg);
            rc = 1;
        }
    }
    double ratio = t.bytes ? (double)t.raw_bytes / (double)t.bytes : 0;
    if (do_json) {
        json_object_set_new(root, "path", json_string(path));
        json_object_set_new(root, "format_version", json_integer(m->format_version));
        json_object_set_new(root, "has_manifest", json_boolean(dataset_has_manifest(r)));
        if (side_name) json_object_set_new(root, "described_by", json_string(side_name));
        if (dataset_has_manifest(r) || side_name) {
            json_object_set_new(root, "model", json_pack("{s:s,s:s}", "name", desc->model_name, "config_sha256", desc->model_config_sha256));
            json_object_set_new(root, "tokenizer", json_pack("{s:s,s:I}", "sha256", desc->tokenizer_sha256, "vocab_size", (json_int_t)desc->target_vocab_size));
            json_object_set_new(root, "chat_template", json_pack("{s:s,s:b}", "name", desc->chat_template, "thinking", desc->thinking));
            json_object_set_new(root, "final_hidden", json_string(eg_ds_final_source_name(desc->final_source)));
        }
        if (dataset_has_manifest(r)) {
            json_t *c = json_object();
            for (int i = 0; i < EG_DS_NCOUNTS; i++) json_object_set_new(c, eg_ds_count_names[i], json_integer(m->counts[i]));
            json_object_set_new(root, "counts", c);
            json_error_t je;
            json_t *job = json_loads(m->job_json, 0, &je);
            json_object_set_new(root, "job", job ? job : json_object());
            json_t *prec = m->precision_json ? json_loads(m->precision_json, 0, &je) : NULL;
            json_object_set_new(root, "precision", prec ? prec : json_null());
        }
        /* a lone shard does not record which layers its aux states are: null, not [] */
        json_t *al = desc->aux_layers || !desc->n_aux ? json_array() : json_null();
        for (int i = 0; i < desc->n_aux && desc->aux_layers; i++) json_array_append_new(al, json_integer(desc->aux_layers[i]));
        json_object_set_new(root, "aux_layers", al);
        json_object_set_new(root, "n_aux", json_integer(m->n_aux));
        json_object_set_new(root, "hidden_size", json_integer(m->hidden_size));
        json_object_set_new(root, "samples", json_integer(n));
        json_object_set_new(root, "tokens", json_integer(t.tokens));
        json_object_set_new(root, "loss_tokens", json_integer(t.loss_tokens));
        json_object_set_new(root, "bytes", json_integer(t.bytes));
        json_object_set_new(root, "raw_bytes", json_integer(t.raw_bytes));
        json_object_set_new(root, "compression_ratio", json_real(ratio));
        json_object_set_new(root, "finish_reasons", json_pack("{s:I,s:I}", "stop", (json_int_t)t.n_stop, "length", (json_int_t)t.n_length));
        json_object_set_new(root, "distinct_loss_tokens", json_integer(distinct));
        json_t *sh = json_array();
        for (int i = 0; i < m->n_shards; i++)
            json_array_append_new(sh, json_pack("{s:s,s:I,s:I,s:I,s:I}", "file", m->shards[i].file, "samples",
                                                (json_int_t)m->shards[i].samples, "tokens", (json_int_t)m->shards[i].tokens,
                                                "loss_tokens", (json_int_t)m->shards[i].loss_tokens, "bytes",
                                                (json_int_t)m->shards[i].bytes));
        json_object_set_new(root, "shards", sh);
        json_t *st = json_array();
        for (int l = 0; l < nl; l++) {
            char nm[64];
            layer_name(desc, l, nm, sizeof nm);
            json_array_append_new(st, acc_json(&acc[l], nm));
        }
        json_object_set_new(root, "hidden_stats", st);
        json_object_set_new(root, "hidden_stats_samples", json_integer(stats_used));
        if (do_verify)
            json_object_set_new(root, "verify", json_pack("{s:b,s:I,s:O}", "ok", vs.problems == 0, "problems",
                                                          (json_int_t)vs.problems, "errors", vs.errors));
    } else if (want_summary) {
        if (side_name) printf("shard %s (described by %s)\n", path, side_name);
        else printf("dataset %s%s\n", path, dataset_has_manifest(r) ? "" : " (single shard, no manifest beside it)");
        printf("  format version %d\n", m->format_version);
        if (dataset_has_manifest(r) || side_name) {
            printf("  model %s (config sha256 %s)\n", desc->model_name, desc->model_config_sha256);
            printf("  tokenizer sha256 %s, vocab %" PRId64 "\n", desc->tokenizer_sha256, desc->target_vocab_size);
            printf("  chat template %s, thinking %s\n", desc->chat_template, desc->thinking ? "on" : "off");
            printf("  final hidden: %s\n",
                   desc->final_source == EG_DS_FINAL_BOTH ? "both: post-norm (final RMSNorm output, lm_head input) and "
                                                            "pre-norm (residual after the last layer)"
                   : desc->final_source == EG_DS_FINAL_PRE_NORM ? "pre-norm (residual after the last layer)"
                                                                : "post-norm (final RMSNorm output, lm_head input)");
        }
        printf("  aux layers (output of decoder layer k, 0-based):");
        if (desc->aux_layers)
            for (int i = 0; i < desc->n_aux; i++) printf(" %d", desc->aux_layers[i]);
        else printf(" %d of them (which layers only the manifest records)", m->n_aux);
        printf("\n  hidden size %" PRId64 "; dtypes input_ids int32, loss_mask uint8, hidden bfloat16\n", m->hidden_size);
        printf("  samples %" PRId64 ", tokens %" PRId64 ", loss-masked tokens %" PRId64 " (%" PRId64 " distinct ids)\n", n,
               t.tokens, t.loss_tokens, distinct);
        printf("  finish: stop %" PRId64 ", length %" PRId64 "\n", t.n_stop, t.n_length);
        if (dataset_has_manifest(r)) {
            printf("  counts:");
            for (int i = 0; i < EG_DS_NCOUNTS; i++) printf(" %s %" PRId64, eg_ds_count_names[i], m->counts[i]);
            printf("\n  job %s\n", m->job_json);
            print_precision(m->precision_json);
        }
        if (desc->zstd_level > 0)
            printf("  bytes on disk %" PRId64 ", uncompressed tensors %" PRId64 ", ratio x%.3f (zstd level %d, bf16 byte split %s)\n",
                   t.bytes, t.raw_bytes, ratio, desc->zstd_level, m->bf16_split ? "on" : "off");
        else
            printf("  bytes on disk %" PRId64 ", uncompressed tensors %" PRId64 ", ratio x%.3f (bf16 byte split %s)\n",
                   t.bytes, t.raw_bytes, ratio, m->bf16_split ? "on" : "off");
        printf("  shards %d:\n", m->n_shards);
        for (int i = 0; i < m->n_shards; i++)
            printf("    %-32s %8" PRId64 " samples %10" PRId64 " tokens %12" PRId64 " bytes\n", m->shards[i].file,
                   m->shards[i].samples, m->shards[i].tokens, m->shards[i].bytes);
        printf("  hidden-state statistics over %" PRId64 " sample(s):\n", stats_used);
        for (int l = 0; l < nl; l++) {
            char nm[64];
            layer_name(desc, l, nm, sizeof nm);
            acc_print(&acc[l], nm);
        }
    }
    if (do_list) {
        json_t *lst = do_json ? json_array() : NULL;
        if (!do_json) printf("  %-8s %-32s %8s %8s %-6s %s\n", "index", "id", "tokens", "loss", "finish", "shard");
        for (int64_t i = 0; i < n; i++) {
            int sh;
            const eg_ds_index_entry *e = dataset_entry(r, i, &sh, NULL);
            if (lst)
                json_array_append_new(lst, json_pack("{s:I,s:s,s:I,s:I,s:s,s:s}", "index", (json_int_t)i, "id", e->id, "tokens",
                                                     (json_int_t)e->T, "loss_tokens", (json_int_t)e->n_loss, "finish",
                                                     eg_ds_finish_name(e->finish), "shard", dataset_shard_path(r, sh)));
            else
                printf("  %-8" PRId64 " %-32s %8u %8u %-6s %s\n", i, e->id, e->T, e->n_loss, eg_ds_finish_name(e->finish),
                       dataset_shard_path(r, sh));
        }
        if (lst) json_object_set_new(root, "list", lst);
    }
    if (n_samples || show) {
        json_t *arr = do_json ? json_array() : NULL;
        for (int k = 0; k < n_samples; k++) {
            int64_t i = dataset_find(r, samples[k]);
            if (i < 0) {
                char *end;
                long long v = strtoll(samples[k], &end, 10);
                if (!*end && *samples[k] && v >= 0 && v < n) i = v;
            }
            if (i < 0) {
                fprintf(stderr, "eaglegen inspect: no sample with id or index '%s'\n", samples[k]);
                rc = 1;
                continue;
            }
            if (show_sample(r, i, tok, arr)) rc = 1;
        }
        for (int64_t i = 0; i < show && i < n; i++)
            if (show_sample(r, i, tok, arr)) rc = 1;
        if (arr) json_object_set_new(root, "samples_shown", arr);
    }
    if (do_json) {
        json_object_set_new(root, "ok", json_boolean(rc == 0));
        json_dumpf(root, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        printf("\n");
    } else if (do_verify) {
        int hint = dataset_has_manifest(r) && vs.damaged;
        if (vs.problems)
            printf("verify: %" PRId64 " problem(s) found%s%s%s\n", vs.problems, hint ? "; `eaglegen repair " : "",
                   hint ? path : "", hint ? "` sets damaged shards aside so a rerun of the job regenerates them" : "");
        else printf("verify: ok (%" PRId64 " samples, %d shards)\n", n, dataset_num_shards(r));
    }
    json_decref(root);
    json_decref(vs.errors);
    free(acc);
    tok_free(tok);
    eg_ds_info_clear(&side);
    dataset_close(r);
    return rc;
}
