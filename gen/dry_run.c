/* generate --dry-run; see dry_run.h. */
#include "gen/dry_run.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/idset.h"
#include "dataset/manifest.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "engine/ep_runtime.h"
#include "engine/runtime.h"
#include "gen/job.h"
#include "gen/merge_check.h"
#include "gen/resume.h"
#include "prompts/corpus.h"

typedef struct reason_count {
    char *key;     /* the reason with digit runs as N */
    char *example; /* FILE:LINE: the first reason as given */
    char *shown;   /* the first reason, each number that differs in a later one as VARIED */
    int64_t n;
} reason_count;

#define VARIED '\x01' /* printed as N */

typedef struct reasons {
    reason_count *r;
    size_t n, cap;
} reasons;

static void fold_digits(const char *s, char *out, size_t cap) {
    size_t j = 0;
    for (; *s && j + 2 < cap; s++) {
        if (isdigit((unsigned char)*s)) {
            if (!j || out[j - 1] != 'N') out[j++] = 'N';
        } else out[j++] = *s;
    }
    out[j] = 0;
}

/* Keeps shown's numbers that why repeats, marks the others VARIED (the same key: the same
   text between the digit runs, as many runs). */
static void merge_numbers(char *shown, const char *why) {
    char *o = shown;
    for (const char *i = shown; *i;) {
        if (*i == VARIED || isdigit((unsigned char)*i)) {
            const char *a = i;
            while (isdigit((unsigned char)*i)) i++;
            if (*i == VARIED && i == a) i++;
            const char *b = why;
            while (isdigit((unsigned char)*why)) why++;
            size_t na = (size_t)(i - a), nb = (size_t)(why - b);
            if (*a != VARIED && na == nb && !memcmp(a, b, na)) {
                memmove(o, a, na);
                o += na;
            } else *o++ = VARIED;
        } else {
            *o++ = *i++;
            if (*why) why++;
        }
    }
    *o = 0;
}

static int add_reason(reasons *rs, const char *why, const char *file, uint64_t line) {
    char key[600];
    fold_digits(why, key, sizeof key);
    for (size_t i = 0; i < rs->n; i++)
        if (!strcmp(rs->r[i].key, key)) {
            rs->r[i].n++;
            merge_numbers(rs->r[i].shown, why);
            return 0;
        }
    if (rs->n == rs->cap) {
        size_t nc = rs->cap ? 2 * rs->cap : 8;
        reason_count *p = realloc(rs->r, nc * sizeof *p);
        if (!p) return -1;
        rs->r = p;
        rs->cap = nc;
    }
    size_t en = strlen(why) + strlen(file) + 32;
    char *ex = malloc(en);
    if (!ex) return -1;
    snprintf(ex, en, "%s:%llu: %s", file, (unsigned long long)line, why);
    rs->r[rs->n] = (reason_count){strdup(key), ex, strdup(why), 1};
    if (!rs->r[rs->n].key || !rs->r[rs->n].shown) {
        free(rs->r[rs->n].key);
        free(rs->r[rs->n].shown);
        free(ex);
        return -1;
    }
    for (char *c = rs->r[rs->n].shown; *c; c++) /* the marker stays ours */
        if (*c == VARIED) *c = '?';
    rs->n++;
    return 0;
}

/* corpus_opts.on_other_id: another worker's record claims its id (as in generate) */
static eg_status other_id_seen(void *ctx, const char *id, const char *file, uint64_t line, eg_error *err) {
    (void)file;
    (void)line;
    eg_ds_idset *seen = ctx;
    return eg_ds_idset_get(seen, id, NULL) ? EG_OK : eg_ds_idset_put(seen, id, 0, err);
}

/* Another worker's job file in dir (job.wIofN.json but own): the weights are then
   fingerprinted for the check the run makes (a config-only model has none to read). */
static int other_job_files(const char *dir, const char *own) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, a, b;
    struct dirent *e;
    while (!n && (e = readdir(d))) n = gen_job_file_worker(e->d_name, &a, &b) && strcmp(e->d_name, own);
    closedir(d);
    return n;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* "1.23 GB" style, decimal units. */
static void human(char *out, size_t n, double bytes) {
    const char *u[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    int k = 0;
    while (bytes >= 1000 && k < 5) { bytes /= 1000; k++; }
    snprintf(out, n, k ? "%.2f %s" : "%.0f %s", bytes, u[k]);
}

static void count_text(char *out, size_t n, double v) {
    if (v >= 1e9) snprintf(out, n, "%.2fG", v / 1e9);
    else if (v >= 1e6) snprintf(out, n, "%.2fM", v / 1e6);
    else if (v >= 1e4) snprintf(out, n, "%.1fK", v / 1e3);
    else snprintf(out, n, "%.0f", v);
}

int gen_dry_run(const gen_dry_run_opts *o, FILE *out) {
    eg_error err = {0};
    eg_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tok_tokenizer *tok = NULL;
    corpus_reader *cr = NULL;
    corpus_record rec = {0};
    eg_ds_idset seen = {0};
    reasons rs = {0};
    int32_t *lens = NULL;
    size_t n_lens = 0, cap_lens = 0;
    int rc = 1;
    int aux[64], n_aux = o->n_aux;
    if (eg_config_load(o->model, &cfg, &err)) goto done;
    if (tok_load(o->tokenizer, &tok, &err)) { eg_wrap(&err, "tokenizer %s", o->tokenizer); goto done; }
    if (n_aux) memcpy(aux, o->aux, sizeof(int) * (size_t)n_aux);
    else n_aux = eg_config_default_aux_layers(&cfg, aux);
    for (int i = 0; i < n_aux; i++)
        if (aux[i] >= cfg.n_layers) {
            eg_fail(&err, EG_ERR_INVALID, "--aux-layers: layer %d does not exist (the model has %d layers, 0..%d)", aux[i],
                    cfg.n_layers, cfg.n_layers - 1);
            goto done;
        }
    int n_stages = 1;
    char splits[512] = ""; /* the explicit layer splits (END:CUT), for the layout line */
    if (o->stages) {
        /* "N" or increasing end layers, the last = the layer count (as generate checks) */
        /* (an end's :CUT, a layer split between two stages, is checked by the runtime) */
        int n = eg_runtime_stages_syntax(o->stages, NULL, NULL, INT_MAX), last = 0, one = -1, ok = n >= 0;
        int *ends = n > 0 ? malloc(sizeof(int) * (size_t)n) : NULL, *cuts = n > 0 ? malloc(sizeof(int) * (size_t)n) : NULL;
        if (n > 0 && (!ends || !cuts)) {
            free(ends);
            free(cuts);
            eg_fail(&err, EG_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (n > 0) {
            eg_runtime_stages_syntax(o->stages, ends, cuts, n);
            for (int i = 0; i < n; i++) ok &= ends[i] > (i ? ends[i - 1] : 0);
            one = n == 1 ? ends[0] : -1;
            last = ends[n - 1];
            for (int i = 0, at = 0; i + 1 < n && at < (int)sizeof splits - 64; i++)
                if (cuts[i] > 0)
                    at += snprintf(splits + at, sizeof splits - (size_t)at, "%slayer %d: experts 0..%d on stage %d, %d.. on %d",
                                   at ? "; " : "", ends[i] - 1, cuts[i] - 1, i, cuts[i], i + 1);
        }
        free(ends);
        free(cuts);
        if (!ok) {
            eg_fail(&err, EG_ERR_INVALID, "--stages: expected N or increasing end layers, got '%s'", o->stages);
            goto done;
        }
        n_stages = one > 0 ? one : n;
        if ((one > 0 && one > cfg.n_layers) || (one < 0 && last != cfg.n_layers)) {
            eg_fail(&err, EG_ERR_INVALID, "--stages %s: the model has %d layers", o->stages, cfg.n_layers);
            goto done;
        }
    }
    int ep = o->ep > 1 ? o->ep : 1;
    /* what the expert-parallel runtime refuses (--batch auto: its slots are chosen later) */
    if (ep > 1 && eg_ep_runtime_check(&cfg, ep, o->batch > 0 ? o->batch : ep, &err)) goto done;
    corpus_opts co;
    corpus_opts_default(&co);
    co.mode = o->capture ? CORPUS_CAPTURE : CORPUS_REGENERATE;
    co.thinking = o->thinking;
    co.max_prompt_tokens = (size_t)(o->capture ? o->max_seq_len : o->max_seq_len - 1);
    co.worker = (uint64_t)o->worker;
    co.n_workers = (uint64_t)o->n_workers;
    co.on_other_id = other_id_seen;
    co.on_other_ctx = &seen;
    co.job_dir = o->out;
    if (corpus_open(o->prompts, (size_t)o->n_prompts, tok, &co, &cr, &err)) goto done;

    int64_t read = 0, accepted = 0, rejected = 0;
    double prompt_sum = 0, out_sum = 0, stored_sum = 0;
    for (;;) {
        if (o->limit >= 0 && read >= o->limit) break;
        bool got = false;
        if (corpus_next(cr, &rec, &got, &err)) goto done;
        if (!got) break;
        read++;
        const char *why = NULL;
        char buf[700];
        int met = eg_ds_idset_get(&seen, rec.id, NULL);
        if (!rec.ok) why = rec.reason;
        else if (met) {
            snprintf(buf, sizeof buf, "duplicate id");
            why = buf;
        }
        /* as generate: a record naming its id claims it, good or bad */
        if ((rec.ok || rec.id_given) && !met && eg_ds_idset_put(&seen, rec.id, 0, &err)) goto done;
        if (why) {
            rejected++;
            if (add_reason(&rs, why, rec.file, rec.line)) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto done; }
            continue;
        }
        accepted++;
        int n = (int)rec.ids.n;
        if (n_lens == cap_lens) {
            size_t nc = cap_lens ? 2 * cap_lens : 1024;
            int32_t *p = realloc(lens, nc * sizeof *p);
            if (!p) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto done; }
            lens = p;
            cap_lens = nc;
        }
        lens[n_lens++] = n;
        int gen = o->capture ? 0 : (o->max_new < o->max_seq_len - n ? o->max_new : o->max_seq_len - n);
        prompt_sum += n;
        out_sum += gen;
        stored_sum += n + gen;
    }

    char a[32], b[32], c[32];
    fprintf(out, "eaglegen generate --dry-run: worker %d/%d, %s mode; %s: config.json only (no weights loaded): "
                 "%d layers, hidden %lld, vocab %d\n",
            o->worker, o->n_workers, o->capture ? "capture" : "regenerate", o->model, cfg.n_layers,
            (long long)cfg.hidden, cfg.vocab);
    fprintf(out, "layout:        %s backend, %d pipeline stage%s over %d layers%s\n", o->backend, n_stages,
            n_stages > 1 ? "s" : "", cfg.n_layers,
            n_stages > 1 ? (strcmp(o->backend, "cuda") ? " (stage k on thread k)" : " (stage k on GPU k)")
                         : !strcmp(o->backend, "cuda") ? " (the whole model on one GPU)" : "");
    if (splits[0])
        fprintf(out, "layer splits:  %s (the routed sum continued across the cut: the same samples)%s\n", splits,
                ep > 1 ? "; with --ep each half's experts are shared out over the ranks of its stage" : "");
    if (ep > 1) {
        int per = cfg.n_experts / ep;
        fprintf(out, "expert ranks:  --ep %d%s (%s): each rank holds %d of the %d routed experts per MoE layer (%s), "
                     "its own sequences and their cache, and runs %s %d stage%s%s\n",
                ep, o->ep_split == EG_EP_SPLIT_ALL ? "+split" : o->ep_split ? "+ffn" : "",
                strcmp(o->backend, "cuda") ? "rank r on its own thread, rows exchanged through host memory"
                : n_stages > 1             ? "rank r's stage k on GPU k*ranks + r, rows exchanged over NCCL"
                                           : "rank r on GPU r mod the GPU count, rows exchanged over NCCL",
                per, cfg.n_experts,
                o->ep_split == EG_EP_SPLIT_ALL ? "layer l's shared expert / dense MLP on rank l mod ranks only; "
                                                 "embedding and lm_head split by vocab rows"
                : o->ep_split ? "layer l's shared expert / dense MLP on rank l mod ranks only; embedding and lm_head "
                                "replicated"
                              : "dense parts replicated",
                n_stages > 1 ? "all" : "its", n_stages, n_stages > 1 ? "s" : "",
                n_stages <= 1 ? ""
                : strcmp(o->backend, "cuda")
                    ? " as stage groups (a thread per rank and stage; stage k's exchange among the ranks' stage k)"
                    : " as stage groups (a GPU per rank and stage, stage k's exchange among GPUs k*ranks.."
                      "(k+1)*ranks-1; with fewer GPUs each rank runs its stages on its one GPU)");
        for (int r = 0; r < ep; r++) {
            fprintf(out, "  rank %d: experts %d..%d", r, r * per, (r + 1) * per - 1);
            if (o->batch > 0) fprintf(out, ", %d of the %d slots", o->batch / ep + (r < o->batch % ep), o->batch);
            else fprintf(out, ", its share of the --batch auto slots");
            if (o->ep_split) {
                fprintf(out, ", the shared expert / dense MLP of layer%s", r + ep < cfg.n_layers ? "s" : "");
                for (int l = r; l < cfg.n_layers; l += ep) fprintf(out, "%s %d", l == r ? "" : ",", l);
                if (r >= cfg.n_layers) fprintf(out, "s: none");
            }
            if (o->ep_split == EG_EP_SPLIT_ALL) /* collective.c's eg_ep_vocab_range */
                fprintf(out, ", embedding / lm_head vocab rows %lld..%lld", (long long)r * cfg.vocab / ep,
                        (long long)(r + 1) * cfg.vocab / ep - 1);
            fprintf(out, "\n");
        }
    }
    fprintf(out, "records:       %lld read%s: %lld accepted, %lld rejected\n", (long long)read,
            o->limit >= 0 && read >= o->limit ? " (stopped at --limit)" : "", (long long)accepted, (long long)rejected);
    for (size_t i = 0; i < rs.n; i++) {
        for (char *c = rs.r[i].shown; *c; c++)
            if (*c == VARIED) *c = 'N';
        fprintf(out, "  rejected %lld: %s (e.g. %.300s)\n", (long long)rs.r[i].n, rs.r[i].shown, rs.r[i].example);
    }
    if (n_lens) {
        qsort(lens, n_lens, sizeof *lens, cmp_i32);
        count_text(a, sizeof a, prompt_sum);
        fprintf(out, "%s tokens: %s in all; per record min %d, median %d, p90 %d, p99 %d, max %d, mean %.0f\n",
                o->capture ? "conversation" : "prompt", a, lens[0], lens[n_lens / 2], lens[n_lens * 9 / 10],
                lens[n_lens * 99 / 100], lens[n_lens - 1], prompt_sum / (double)n_lens);
    }
    if (o->capture) {
        fprintf(out, "output tokens: none generated (capture mode teacher-forces the existing assistant turns)\n");
    } else {
        count_text(a, sizeof a, out_sum);
        fprintf(out, "output tokens: at most %s, assuming every response runs to --max-new-tokens %d (capped by "
                     "--max-seq-len %d); responses that stop earlier make fewer\n",
                a, o->max_new, o->max_seq_len);
    }
    int n_final = o->n_final > 1 ? 2 : 1;
    double per_token = (double)(n_aux + n_final) * (double)cfg.hidden * 2 + 4 + 1;
    double bytes = stored_sum * per_token;
    count_text(a, sizeof a, stored_sum);
    human(b, sizeof b, bytes);
    human(c, sizeof c, per_token);
    fprintf(out, "disk:          at most %s for %s stored tokens before compression: %s per token = (%d aux + %d final) "
                 "x H %lld x 2 bytes (BF16) + 5 (int32 id, uint8 mask); zstd usually saves 10-20%% on hidden states\n",
            b, a, c, n_aux, n_final, (long long)cfg.hidden);
    if (accepted) {
        double mean = bytes / (double)accepted;
        human(a, sizeof a, mean);
        double per_shard = bytes;
        if (o->shard_samples > 0 && mean * (double)o->shard_samples < per_shard) per_shard = mean * (double)o->shard_samples;
        if (o->shard_bytes > 0 && (double)o->shard_bytes < per_shard) per_shard = (double)o->shard_bytes;
        double n_shards = per_shard > 0 ? ceil(bytes / per_shard) : 1;
        human(b, sizeof b, per_shard);
        fprintf(out, "shards:        %.0f shard%s of ~%s (%s per sample on average; ", n_shards, n_shards > 1 ? "s" : "",
                b, a);
        if (o->shard_samples > 0) fprintf(out, "--shard-samples %lld", (long long)o->shard_samples);
        if (o->shard_samples > 0 && o->shard_bytes > 0) fprintf(out, ", ");
        if (o->shard_bytes > 0) {
            human(c, sizeof c, (double)o->shard_bytes);
            fprintf(out, "--shard-size %s", c);
        }
        fprintf(out, ")\n");
    }
    if (o->out) {
        char man[128], mp[4200];
        gen_job_filename(man, sizeof man, "manifest", "json", o->worker, o->n_workers);
        snprintf(mp, sizeof mp, "%s/%s", o->out, man);
        eg_ds_info m = {0};
        eg_error e2 = {0};
        int held = !eg_ds_info_load(mp, &m, &e2);
        long long n_held = held ? (long long)eg_ds_info_totals(&m).samples : 0;
        eg_ds_info_clear(&m);
        char jn[128];
        gen_job_filename(jn, sizeof jn, "job", "json", o->worker, o->n_workers);
        json_t *have = NULL, *want = NULL;
        if (gen_job_read(o->out, jn, &have, &err)) goto done;
        /* the job's identity for the resume check (not with --restart) and the workers' join
           check: only then are the weights' files read (a config-only model still plans) */
        if (o->params && ((have && !o->restart) || (o->n_workers > 1 && other_job_files(o->out, jn)))) {
            /* the run's own job identity, but for the weights' stored bytes, which only
               loading the model counts (taken from the job being resumed) */
            json_t *inputs = NULL, *weights = NULL;
            gen_job_inputs(cr, &inputs, &err);
            if (!err.code && gen_weights_fingerprint(o->model, &weights, &err)) eg_wrap(&err, "--model %s", o->model);
            json_t *wb = json_object_get(json_object_get(have, "fingerprints"), "model_weight_bytes");
            if (!err.code && inputs && weights)
                want = json_pack("{s:i, s:O, s:{s:s, s:O, s:O, s:s, s:O}}", "version", GEN_JOB_VERSION, "params",
                                 (json_t *)o->params,
                                 "fingerprints", "model_config_sha256", cfg.hash, "model_weight_bytes",
                                 wb ? wb : json_null(), "model_weights", weights, "tokenizer_sha256",
                                 tok_fingerprint(tok), "inputs", inputs);
            json_decref(inputs);
            json_decref(weights);
            if (!err.code && !want) eg_fail(&err, EG_ERR_NOMEM, "out of memory");
            /* the other workers' job files, as the run checks them before loading the model */
            if (!err.code && o->n_workers > 1) gen_worker_join_check(o->out, o->worker, o->n_workers, want, 1, &err);
            if (err.code) {
                json_decref(want);
                json_decref(have);
                goto done;
            }
        }
        if (o->restart && (held || have)) {
            fprintf(out, "job:           %s/%s: --restart deletes this job (%lld samples) and starts over\n", o->out, jn,
                     n_held);
        } else if (have && want) {
            gen_resume r;
            if (gen_resume_check(o->out, jn, want, o->n_workers, &r, &err)) {
                json_decref(want);
                json_decref(have);
                goto done;
            }
            fprintf(out, "job:           %s already holds %lld samples; a run resumes it and makes only the rest "
                         "(parameters, config, tokenizer and inputs checked as the run checks them; the weights' "
                         "bytes only by the run)%s\n", mp, n_held, r.changes);
        } else if (held || have) {
            fprintf(out, "job:           %s already holds %lld samples; a run resumes it and makes only the rest\n", mp,
                    n_held);
        } else fprintf(out, "job:           %s: no job yet; a run starts one\n", o->out);
        json_decref(want);
        json_decref(have);
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "eaglegen generate --dry-run: %s\n", err.msg);
    for (size_t i = 0; i < rs.n; i++) { free(rs.r[i].key); free(rs.r[i].example); free(rs.r[i].shown); }
    free(rs.r);
    free(lens);
    eg_ds_idset_clear(&seen);
    corpus_record_free(&rec);
    corpus_close(cr);
    tok_free(tok);
    eg_config_free(&cfg);
    return rc;
}
