/* eaglegen fidelity — what a precision choice does to the model, and whether a dataset
 * holds what the model computes (docs/FIDELITY.md).
 *
 * Compare mode runs the same token prompts under a reference (the CPU backend, FP32
 * arithmetic, an FP32 latent cache: nothing rounded at the cache write) and under each
 * setting, and reports per decoder layer the relative error of the residual stream
 * (worst and median over tokens), the top-1 agreement of the teacher-forced logits
 * where the reference's top-1 margin exceeds 1e-2, the mean KL divergence of the
 * next-token distribution, and per prompt the first step at which a free-running greedy
 * continuation differs from the reference's.
 *
 * Settings: kv=bf16 (production), kv=fp8, kv=fp8-token on the CPU backend; act=hilo and
 * act=bf16 on the CUDA backend (EG_CUDA_GEMM). The FP8 caches and plain-BF16 activations
 * exist only inside this command (eg_forward_opts.kv_dtype, which `generate` never sets,
 * and the CUDA switch, which `generate` never sets either); this command writes no data.
 *
 * Audit mode re-runs stored samples of a dataset teacher-forced on the CPU backend and
 * reports how far the stored aux/final states (against the reference rounded to BF16, as
 * stored) and the stored tokens are from it.
 *
 * Every forward object is driven directly (engine/forward.h), one sequence in slot 0:
 * nothing here depends on the batch engine's scheduler. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dataset/reader.h"
#include "engine/forward.h"
#include "gen/args.h"
#include "gen/commands.h"
#include "prompts/corpus.h"
#include "prompts/tokenizer.h"

#define FID_MARGIN 1e-2 /* top-1 margin below which a position is a near-tie (not counted) */

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen fidelity --model DIR --prompts P.json [--compare LIST] [options]\n"
            "       eaglegen fidelity --audit DATASET --model DIR [--samples N] [options]\n"
            "\n"
            "Compare: runs the prompts under the reference kv=fp32 (CPU backend, FP32 arithmetic,\n"
            "FP32 latent cache) and under each setting of LIST, and reports per decoder layer the\n"
            "relative error of the residual stream (worst, median over tokens), top-1 agreement\n"
            "where the reference margin > 1e-2, mean KL(reference || setting) of the next-token\n"
            "distribution, and per prompt the first greedy step that differs (free-running).\n"
            "Settings (default kv=bf16,kv=fp8,kv=fp8-token):\n"
            "  kv=bf16       the BF16 latent cache `generate` uses (CPU backend)\n"
            "  kv=fp8        latent and k_pe in FP8 E4M3 at scale 1 (vLLM kv_cache_dtype fp8)\n"
            "  kv=fp8-token  per-token FP8: E4M3 latent with an FP32 scale per 128 values, k_pe\n"
            "                BF16 (the fp8_ds_mla layout of vLLM/SGLang/FlashMLA)\n"
            "  act=hilo      the CUDA backend as `generate` runs it (BF16 hi + lo GEMM inputs)\n"
            "  act=bf16      the CUDA backend with plain BF16 GEMM inputs (EG_CUDA_GEMM=bf16)\n"
            "The FP8 caches and plain-BF16 activations exist only in this command: `generate`\n"
            "always runs the BF16 cache and never offers them.\n"
            "P.json is {\"prompts\": [[ids...], ...]}; any other --prompts file is a JSONL corpus\n"
            "(the formats `generate` reads), rendered with the Kimi-K2.5 chat template and\n"
            "tokenized as `generate` would feed it (--mode regenerate: the conversation up to\n"
            "its last user turn plus the generation prompt; capture: the whole conversation).\n"
            "\n"
            "Audit: re-runs N stored samples teacher-forced on the CPU backend (BF16 cache, as\n"
            "`generate` computes; --kv fp32 for the exact cache) and reports the distance of the\n"
            "stored aux and final states from the reference rounded to BF16 as stored, and of the\n"
            "stored tokens (greedy samples: argmax where margin > 1e-2; sampled: the reference\n"
            "probability of each generated token).\n"
            "\n"
            "options:\n"
            "  --model DIR        Hugging Face checkpoint directory (required)\n"
            "  --prompts FILE     prompts JSON (compare mode)\n"
            "  --compare LIST     comma-separated settings (see above)\n"
            "  --tokenizer DIR    corpus prompts: tokenizer directory (default: --model)\n"
            "  --mode M           corpus prompts: regenerate (default) or capture\n"
            "  --thinking on|off  corpus prompts: Kimi thinking mode (default on)\n"
            "  --limit N          use the first N prompts or records (default all)\n"
            "  --steps N          greedy steps per prompt for the divergence (default 32)\n"
            "  --audit DIR        dataset directory (audit mode)\n"
            "  --samples N        samples to audit, spread over the dataset (default 16)\n"
            "  --kv bf16|fp32     audit reference cache (default bf16)\n"
            "  --fail-above X     audit: exit 1 when a stored state's worst relative error > X\n"
            "  --json[=FILE]      the numbers as one JSON object: on stdout instead of the\n"
            "                     table, or into FILE beside the table\n"
            "  --threads N        CPU threads (default: all cores, or $EG_THREADS)\n"
            "  --chunk N          rows per forward step (default 256)\n"
            "  --device N         CUDA device for act=* settings (default 0)\n"
            "  -h, --help         this text\n");
}

/* ---- growable arrays of per-token errors --------------------------------------------- */

typedef struct dvec {
    double *v;
    int64_t n, cap;
} dvec;

static eg_status dvec_push(dvec *d, double x, eg_error *err) {
    if (d->n == d->cap) {
        int64_t nc = d->cap ? 2 * d->cap : 256;
        double *nv = realloc(d->v, sizeof(double) * (size_t)nc);
        if (!nv) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        d->v = nv;
        d->cap = nc;
    }
    d->v[d->n++] = x;
    return EG_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* worst and median (sorts d in place); NaN counts as worst */
static void dvec_stats(dvec *d, double *worst, double *median) {
    *worst = 0;
    *median = 0;
    if (d->n == 0) return;
    int nan = 0;
    for (int64_t i = 0; i < d->n; i++) nan |= isnan(d->v[i]);
    qsort(d->v, (size_t)d->n, sizeof(double), cmp_double);
    *worst = nan ? NAN : d->v[d->n - 1];
    *median = d->n % 2 ? d->v[d->n / 2] : 0.5 * (d->v[d->n / 2 - 1] + d->v[d->n / 2]);
}

/* ||a - b|| / ||b|| over n values (b the reference) */
static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* argmax (lowest id among equal maxima, as the greedy sampler) and top-1 minus top-2 */
static int32_t argmax_margin(const float *x, int V, double *margin) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    float second = -INFINITY;
    for (int i = 0; i < V; i++)
        if (i != best && x[i] > second) second = x[i];
    if (margin) *margin = (double)x[best] - (double)second;
    return best;
}

/* log-softmax of x / temp into out (double) */
static void log_softmax(const float *x, int V, double temp, double *out) {
    double m = -INFINITY;
    for (int i = 0; i < V; i++) m = fmax(m, x[i] / temp);
    double s = 0;
    for (int i = 0; i < V; i++) s += exp(x[i] / temp - m);
    double lse = m + log(s);
    for (int i = 0; i < V; i++) out[i] = x[i] / temp - lse;
}

/* ---- one sequence through one forward object ------------------------------------------ */

typedef struct runner {
    eg_forward *f;
    int chunk;   /* max rows per step */
    int32_t *pos, *slot, *rows; /* [chunk] */
} runner;

static void runner_free(runner *r) {
    if (!r) return;
    eg_forward_free(r->f);
    free(r->pos);
    free(r->slot);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

static eg_status runner_create(const eg_model *m, eg_backend *be, eg_kv_dtype kv, int chunk, int max_seq,
                               const int *capture, int n_capture, int pre_norm, runner *r, eg_error *err) {
    memset(r, 0, sizeof *r);
    eg_forward_opts o = {.max_tokens = chunk, .n_slots = 1, .max_seq_len = max_seq, .capture = capture,
                         .n_capture = n_capture, .final_pre_norm = pre_norm, .kv_dtype = kv};
    eg_status st = eg_forward_create(m, be, &o, &r->f, err);
    if (st) return st;
    r->chunk = chunk;
    r->pos = eg_malloc(sizeof(int32_t) * (size_t)chunk, err);
    r->slot = eg_calloc((size_t)chunk, sizeof(int32_t), err);
    r->rows = eg_malloc(sizeof(int32_t) * (size_t)chunk, err);
    if (!r->pos || !r->slot || !r->rows) { runner_free(r); return EG_ERR_NOMEM; }
    for (int i = 0; i < chunk; i++) r->rows[i] = i;
    return EG_OK;
}

/* n (<= chunk) tokens at positions p0.. of slot 0, teacher-forced: captures
 * [n_capture][n][H], final [n][H] (NULL = skip), logits [n][V]. */
static eg_status runner_step(runner *r, const int32_t *tok, int p0, int n, float *cap, float *final, float *logits,
                             eg_error *err) {
    for (int i = 0; i < n; i++) r->pos[i] = p0 + i;
    eg_step s = {.T = n, .tokens = tok, .pos = r->pos, .slot = r->slot, .n_logits = n, .logit_rows = r->rows,
                 .logits = logits, .capture = cap, .final_hidden = final};
    return eg_forward_step(r->f, &s, err);
}

/* Greedy continuation: out[0] = first (the argmax after the prompt), out[j] the greedy
 * token after out[j-1] at position p0 + j - 1, for j < N. */
static eg_status runner_greedy(runner *r, int32_t first, int p0, int N, int32_t *out, eg_error *err) {
    if (N < 1) return EG_OK;
    out[0] = first;
    eg_sample_params sp = {.temperature = 0, .top_p = 1, .top_k = 0};
    uint64_t rng = 0;
    for (int j = 1; j < N; j++) {
        int32_t pos = p0 + j - 1, slot = 0, row = 0;
        eg_step s = {.T = 1, .tokens = &out[j - 1], .pos = &pos, .slot = &slot, .n_logits = 1, .logit_rows = &row,
                     .sampled = &out[j], .sp = &sp, .rng = &rng};
        eg_status st = eg_forward_step(r->f, &s, err);
        if (st) return st;
    }
    return EG_OK;
}

/* ---- compare mode ---------------------------------------------------------------------- */

typedef struct setting {
    const char *name;
    eg_kv_dtype kv;
    const char *gemm; /* act=*: EG_CUDA_GEMM value; NULL = a CPU setting */
    eg_backend *own_be;
    runner r;
    dvec *rel;        /* [L] per-token relative error of the output of layer k */
    int64_t top1_n, top1_agree, kl_n;
    double kl_sum;
    int *div;         /* [n_prompts] first divergent greedy step, -1 = none */
    int32_t *toks;    /* [steps] greedy tokens of the current prompt */
    int32_t last_argmax;
} setting;

static const struct {
    const char *name;
    eg_kv_dtype kv;
    const char *gemm;
} known_settings[] = {
    {"kv=bf16", EG_KV_BF16, NULL},         {"kv=fp8", EG_KV_FP8, NULL}, {"kv=fp8-token", EG_KV_FP8_TILE, NULL},
    {"act=hilo", EG_KV_BF16, "hilo"},      {"act=bf16", EG_KV_BF16, "bf16"},
};

static int parse_compare(const char *list, setting **out, int *n) {
    char *dup = strdup(list), *save = NULL;
    int cap = 0;
    *out = NULL;
    *n = 0;
    if (!dup) return 0;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = -1;
        for (size_t i = 0; i < sizeof known_settings / sizeof known_settings[0]; i++)
            if (!strcmp(t, known_settings[i].name)) k = (int)i;
        if (k < 0) {
            fprintf(stderr, "eaglegen fidelity: --compare: unknown setting '%s' (%s)\n", t,
                    !strcmp(t, "kv=fp32") ? "kv=fp32 is the reference"
                                          : "expected kv=bf16, kv=fp8, kv=fp8-token, act=hilo or act=bf16");
            goto fail;
        }
        for (int j = 0; j < *n; j++)
            if (!strcmp((*out)[j].name, known_settings[k].name)) {
                fprintf(stderr, "eaglegen fidelity: --compare: '%s' given twice\n", t);
                goto fail;
            }
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            setting *ns = realloc(*out, sizeof(setting) * (size_t)cap);
            if (!ns) goto fail;
            *out = ns;
        }
        memset(&(*out)[*n], 0, sizeof(setting));
        (*out)[*n].name = known_settings[k].name;
        (*out)[*n].kv = known_settings[k].kv;
        (*out)[*n].gemm = known_settings[k].gemm;
        (*n)++;
    }
    free(dup);
    if (*n == 0) fprintf(stderr, "eaglegen fidelity: --compare: no settings\n");
    return *n > 0;
fail:
    free(dup);
    free(*out);
    *out = NULL;
    *n = 0;
    return 0;
}

/* The CUDA backend with EG_CUDA_GEMM set for this setting only (restored afterwards). */
static eg_status cuda_backend_for(const setting *s, const eg_config *c, const eg_backend_opts *bo, eg_backend **be,
                                  eg_error *err) {
    const char *old = getenv("EG_CUDA_GEMM");
    char *saved = old ? strdup(old) : NULL;
    setenv("EG_CUDA_GEMM", s->gemm, 1);
    eg_status st = eg_backend_create(c, bo, be, err);
    if (saved) setenv("EG_CUDA_GEMM", saved, 1);
    else unsetenv("EG_CUDA_GEMM");
    free(saved);
    if (st == EG_ERR_UNSUPPORTED) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg[0] ? err->msg : "built without CUDA");
        return eg_fail(err, st, "%s needs the CUDA backend, which is not available here (%.200s); the kv=* settings "
                                "run on the CPU", s->name, why);
    }
    return st ? eg_wrap(err, "%s", s->name) : EG_OK;
}

typedef struct cmp_job {
    const eg_model *m;
    json_t *prompts;
    int steps, chunk;
    setting *set;
    int n_set;
    runner ref;
    float *ref_cap, *ref_log, *cap, *log; /* [L][chunk][H], [chunk][V] */
    double *lp_ref, *lp_set;              /* [V] */
    int32_t *ids, *ref_toks;              /* [max_len], [steps] */
    int64_t n_tokens;
} cmp_job;

static int finite_row(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* Fold one chunk of setting s against the reference's. */
static eg_status accumulate(cmp_job *j, setting *s, int n, eg_error *err) {
    const eg_config *c = &j->m->cfg;
    int L = c->n_layers, V = c->vocab;
    int64_t H = c->hidden;
    eg_status st;
    for (int l = 0; l < L; l++)
        for (int t = 0; t < n; t++) {
            const float *a = j->cap + ((int64_t)l * n + t) * H, *b = j->ref_cap + ((int64_t)l * n + t) * H;
            double r = rel_err(a, b, H);
            if (!isfinite(r)) /* a NaN table entry read back as 0 error; say it instead */
                return eg_fail(err, EG_ERR_INVALID, "%s: layer %d: a hidden state that is not finite (NaN or Inf) in %s",
                               s->name, l, finite_row(b, H) ? s->name : "the kv=fp32 reference");
            if ((st = dvec_push(&s->rel[l], r, err))) return st;
        }
    for (int t = 0; t < n; t++) {
        const float *lr = j->ref_log + (int64_t)t * V, *ls = j->log + (int64_t)t * V;
        double margin;
        int32_t top_r = argmax_margin(lr, V, &margin), top_s = argmax_margin(ls, V, NULL);
        if (margin > FID_MARGIN) {
            s->top1_n++;
            s->top1_agree += top_r == top_s;
        }
        log_softmax(lr, V, 1.0, j->lp_ref);
        log_softmax(ls, V, 1.0, j->lp_set);
        double kl = 0;
        for (int i = 0; i < V; i++) kl += exp(j->lp_ref[i]) * (j->lp_ref[i] - j->lp_set[i]);
        if (!isfinite(kl))
            return eg_fail(err, EG_ERR_INVALID, "%s: logits that are not finite (NaN or Inf) in %s", s->name,
                           finite_row(lr, V) ? s->name : "the kv=fp32 reference");
        s->kl_sum += kl > 0 ? kl : 0;
        s->kl_n++;
        s->last_argmax = top_s;
    }
    return EG_OK;
}

static eg_status compare_prompt(cmp_job *j, size_t pi, eg_error *err) {
    const eg_config *c = &j->m->cfg;
    json_t *p = json_array_get(j->prompts, pi);
    int T = (int)json_array_size(p), V = c->vocab;
    for (int i = 0; i < T; i++) j->ids[i] = (int32_t)json_integer_value(json_array_get(p, i));
    eg_status st;
    runner *all[1 + j->n_set];
    all[0] = &j->ref;
    for (int k = 0; k < j->n_set; k++) all[1 + k] = &j->set[k].r;
    for (int k = 0; k <= j->n_set; k++)
        if ((st = eg_kv_reserve(eg_forward_kv(all[k]->f), 0, (int64_t)T + j->steps, err))) return st;
    int32_t ref_last = 0;
    for (int p0 = 0; p0 < T; p0 += j->chunk) {
        int n = T - p0 < j->chunk ? T - p0 : j->chunk;
        if ((st = runner_step(&j->ref, j->ids + p0, p0, n, j->ref_cap, NULL, j->ref_log, err)))
            return eg_wrap(err, "prompt %zu, reference", pi);
        ref_last = argmax_margin(j->ref_log + (int64_t)(n - 1) * V, V, NULL);
        for (int k = 0; k < j->n_set; k++) {
            setting *s = &j->set[k];
            if ((st = runner_step(&s->r, j->ids + p0, p0, n, j->cap, NULL, j->log, err)))
                return eg_wrap(err, "prompt %zu, %s", pi, s->name);
            if ((st = accumulate(j, s, n, err))) return eg_wrap(err, "prompt %zu", pi), st;
        }
    }
    j->n_tokens += T;
    if ((st = runner_greedy(&j->ref, ref_last, T, j->steps, j->ref_toks, err)))
        return eg_wrap(err, "prompt %zu, reference greedy", pi);
    for (int k = 0; k < j->n_set; k++) {
        setting *s = &j->set[k];
        if ((st = runner_greedy(&s->r, s->last_argmax, T, j->steps, s->toks, err)))
            return eg_wrap(err, "prompt %zu, %s greedy", pi, s->name);
        s->div[pi] = -1;
        for (int t = 0; t < j->steps; t++)
            if (s->toks[t] != j->ref_toks[t]) { s->div[pi] = t; break; }
    }
    for (int k = 0; k <= j->n_set; k++) eg_kv_release(eg_forward_kv(all[k]->f), 0);
    return EG_OK;
}

static json_t *compare_json(cmp_job *j) {
    const eg_config *c = &j->m->cfg;
    json_t *sets = json_array();
    size_t np = json_array_size(j->prompts);
    for (int k = 0; k < j->n_set; k++) {
        setting *s = &j->set[k];
        json_t *layers = json_array(), *div = json_array();
        for (int l = 0; l < c->n_layers; l++) {
            double w, md;
            dvec_stats(&s->rel[l], &w, &md);
            json_array_append_new(layers, json_pack("{s:i,s:f,s:f}", "layer", l, "rel_worst", w, "rel_median", md));
        }
        for (size_t i = 0; i < np; i++) json_array_append_new(div, s->div[i] < 0 ? json_null() : json_integer(s->div[i]));
        json_array_append_new(sets, json_pack("{s:s,s:o,s:f,s:f,s:o}", "name", s->name, "layers", layers, "top1_agree",
                                              s->top1_n ? (double)s->top1_agree / (double)s->top1_n : 1.0, "kl_mean",
                                              s->kl_n ? s->kl_sum / (double)s->kl_n : 0.0, "divergence_steps", div));
    }
    return json_pack("{s:s,s:o}", "reference", "kv=fp32", "settings", sets);
}

static void compare_table(cmp_job *j, json_t *root, FILE *f) {
    const eg_config *c = &j->m->cfg;
    json_t *sets = json_object_get(root, "settings");
    size_t np = json_array_size(j->prompts);
    fprintf(f, "reference kv=fp32 (cpu backend, FP32 arithmetic, FP32 latent cache); %zu prompts, %lld teacher-forced "
               "tokens, %d greedy steps\n\n",
            np, (long long)j->n_tokens, j->steps);
    fprintf(f, "relative error of the residual stream after each decoder layer, worst / median over tokens\n");
    fprintf(f, "%-6s", "layer");
    for (int k = 0; k < j->n_set; k++) fprintf(f, "  %-21s", j->set[k].name);
    fprintf(f, "\n");
    for (int l = 0; l < c->n_layers; l++) {
        fprintf(f, "%-6d", l);
        for (int k = 0; k < j->n_set; k++) {
            json_t *e = json_array_get(json_object_get(json_array_get(sets, (size_t)k), "layers"), (size_t)l);
            fprintf(f, "  %9.2e / %-9.2e", json_real_value(json_object_get(e, "rel_worst")),
                    json_real_value(json_object_get(e, "rel_median")));
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\n%-38s", "");
    for (int k = 0; k < j->n_set; k++) fprintf(f, "  %-14s", j->set[k].name);
    fprintf(f, "\n%-38s", "top-1 agreement (ref margin > 1e-2)");
    for (int k = 0; k < j->n_set; k++)
        fprintf(f, "  %6.2f%% %-6s", 100 * json_real_value(json_object_get(json_array_get(sets, (size_t)k), "top1_agree")), "");
    fprintf(f, "\n%-38s", "positions counted");
    for (int k = 0; k < j->n_set; k++) fprintf(f, "  %-14lld", (long long)j->set[k].top1_n);
    fprintf(f, "\n%-38s", "mean KL(ref || setting), nats");
    for (int k = 0; k < j->n_set; k++)
        fprintf(f, "  %-14.3e", json_real_value(json_object_get(json_array_get(sets, (size_t)k), "kl_mean")));
    fprintf(f, "\n%-38s", "greedy paths diverged");
    for (int k = 0; k < j->n_set; k++) {
        int nd = 0;
        for (size_t i = 0; i < np; i++) nd += j->set[k].div[i] >= 0;
        char b[32];
        snprintf(b, sizeof b, "%d/%zu", nd, np);
        fprintf(f, "  %-14s", b);
    }
    fprintf(f, "\n\nfirst divergent greedy step per prompt (- = none in %d steps)\n", j->steps);
    for (int k = 0; k < j->n_set; k++) {
        fprintf(f, "%-14s", j->set[k].name);
        for (size_t i = 0; i < np; i++) {
            if (j->set[k].div[i] < 0) fprintf(f, " -");
            else fprintf(f, " %d", j->set[k].div[i]);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\nkv=fp8, kv=fp8-token and act=bf16 exist only in this command: `generate` always uses the BF16 "
               "cache (and the CUDA backend's hi + lo GEMM inputs).\n");
}

typedef struct fid_args {
    const char *model, *prompts, *compare, *audit, *json_path, *kv, *tokenizer, *mode;
    int json, steps, samples, threads, chunk, device, thinking, limit;
    double fail_above;
    int fail_set;             /* --fail-above given (0 is a bound: any error fails) */
} fid_args;

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* A JSONL corpus as {"prompts": [[ids], ...]}: rendered and tokenized through the same
 * reader generate uses; a rejected record stops with its file and line. */
static eg_status corpus_prompts(const fid_args *a, json_t **root, eg_error *err) {
    tok_tokenizer *tok = NULL;
    corpus_reader *cr = NULL;
    corpus_record rec;
    memset(&rec, 0, sizeof rec);
    eg_status st = tok_load(a->tokenizer ? a->tokenizer : a->model, &tok, err);
    if (st) return eg_wrap(err, "tokenizer %s", a->tokenizer ? a->tokenizer : a->model);
    corpus_opts co;
    corpus_opts_default(&co);
    co.mode = a->mode && !strcmp(a->mode, "capture") ? CORPUS_CAPTURE : CORPUS_REGENERATE;
    co.thinking = a->thinking;
    const char *paths[1] = {a->prompts};
    json_t *ps = json_array();
    if (!(st = corpus_open(paths, 1, tok, &co, &cr, err))) {
        bool got = true;
        while (!st && (a->limit <= 0 || (int)json_array_size(ps) < a->limit)) {
            if ((st = corpus_next(cr, &rec, &got, err)) || !got) break;
            if (!rec.ok) {
                st = eg_fail(err, EG_ERR_FORMAT, "%s:%llu: %s", rec.file, (unsigned long long)rec.line, rec.reason);
                break;
            }
            if (rec.ids.n == 0) {
                st = eg_fail(err, EG_ERR_FORMAT, "%s:%llu: no tokens", rec.file, (unsigned long long)rec.line);
                break;
            }
            json_t *one = json_array();
            for (size_t i = 0; i < rec.ids.n; i++) json_array_append_new(one, json_integer(rec.ids.ids[i]));
            json_array_append_new(ps, one);
        }
    }
    corpus_record_free(&rec);
    corpus_close(cr);
    tok_free(tok);
    if (st) { json_decref(ps); return st; }
    *root = json_pack("{s:o}", "prompts", ps);
    return EG_OK;
}

static eg_status load_prompts(const fid_args *a, const eg_config *c, json_t **root, json_t **prompts, int *max_len,
                              eg_error *err) {
    const char *path = a->prompts;
    json_error_t jerr;
    if (!ends_with(path, ".json")) {
        eg_status st = corpus_prompts(a, root, err);
        if (st) return st;
    } else {
        *root = json_load_file(path, 0, &jerr);
    }
    if (!*root)
        return jerr.line > 0 ? eg_fail(err, EG_ERR_FORMAT, "%s:%d: %s", path, jerr.line, jerr.text)
                             : eg_fail(err, EG_ERR_IO, "%s: %s", path, jerr.text);
    *prompts = json_object_get(*root, "prompts");
    if (!json_is_array(*prompts) || json_array_size(*prompts) == 0)
        return eg_fail(err, EG_ERR_FORMAT, "%s: expected {\"prompts\": [[ids...], ...]} with at least one prompt", path);
    while (a->limit > 0 && json_array_size(*prompts) > (size_t)a->limit)
        json_array_remove(*prompts, json_array_size(*prompts) - 1);
    *max_len = 0;
    for (size_t i = 0; i < json_array_size(*prompts); i++) {
        json_t *p = json_array_get(*prompts, i);
        if (!json_is_array(p) || json_array_size(p) == 0)
            return eg_fail(err, EG_ERR_FORMAT, "%s: prompt %zu is not a non-empty array of token ids", path, i);
        for (size_t k = 0; k < json_array_size(p); k++) {
            json_t *v = json_array_get(p, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->vocab)
                return eg_fail(err, EG_ERR_FORMAT, "%s: prompt %zu, token %zu: not a token id in [0, %d)", path, i, k,
                               c->vocab);
        }
        if ((int)json_array_size(p) > *max_len) *max_len = (int)json_array_size(p);
    }
    return EG_OK;
}

/* Write root as the --json output; the table goes to stdout unless JSON does. */
static int emit(const fid_args *a, json_t *root, void (*table)(void *, json_t *, FILE *), void *ctx) {
    if (a->json && !a->json_path) {
        if (json_dumpf(root, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) ||
            fputc('\n', stdout) == EOF)
            return 1;
        return 0;
    }
    table(ctx, root, stdout);
    if (a->json_path && json_dump_file(root, a->json_path, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6))) {
        fprintf(stderr, "eaglegen fidelity: cannot write %s\n", a->json_path);
        return 1;
    }
    return 0;
}

static void compare_table_cb(void *ctx, json_t *root, FILE *f) { compare_table(ctx, root, f); }

static int run_compare(const fid_args *a) {
    eg_error err = {0};
    eg_model model;
    memset(&model, 0, sizeof model);
    json_t *root = NULL, *prompts = NULL, *out = NULL;
    setting *set = NULL;
    int n_set = 0, rc = 1, max_len = 0;
    eg_backend *cpu = NULL;
    int *capture = NULL;
    cmp_job j;
    memset(&j, 0, sizeof j);
    if (!parse_compare(a->compare ? a->compare : "kv=bf16,kv=fp8,kv=fp8-token", &set, &n_set)) return 2;
    if (eg_model_load(a->model, &model, &err)) goto done;
    const eg_config *c = &model.cfg;
    if (load_prompts(a, c, &root, &prompts, &max_len, &err)) goto done;
    int L = c->n_layers, V = c->vocab, chunk = a->chunk;
    int64_t H = c->hidden;
    int max_seq = max_len + a->steps + 1;
    capture = eg_malloc(sizeof(int) * (size_t)L, &err);
    if (!capture) goto done;
    for (int l = 0; l < L; l++) capture[l] = l;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = chunk, .max_seq_len = max_seq, .nthreads = a->threads,
                          .device = a->device};
    if (eg_backend_create(c, &bo, &cpu, &err)) goto done;
    j = (cmp_job){.m = &model, .prompts = prompts, .steps = a->steps, .chunk = chunk, .set = set, .n_set = n_set};
    if (runner_create(&model, cpu, EG_KV_FP32, chunk, max_seq, capture, L, 0, &j.ref, &err)) {
        eg_wrap(&err, "reference kv=fp32");
        goto done;
    }
    size_t np = json_array_size(prompts);
    for (int k = 0; k < n_set; k++) {
        setting *s = &set[k];
        eg_backend *be = cpu;
        if (s->gemm) {
            eg_backend_opts cb = bo;
            cb.name = "cuda";
            if (cuda_backend_for(s, c, &cb, &s->own_be, &err)) goto done;
            be = s->own_be;
        }
        if (runner_create(&model, be, s->kv, chunk, max_seq, capture, L, 0, &s->r, &err)) {
            eg_wrap(&err, "%s", s->name);
            goto done;
        }
        s->rel = eg_calloc((size_t)L, sizeof(dvec), &err);
        s->div = eg_calloc(np, sizeof(int), &err);
        s->toks = eg_calloc((size_t)(a->steps > 0 ? a->steps : 1), sizeof(int32_t), &err);
        if (!s->rel || !s->div || !s->toks) goto done;
    }
    size_t capn = (size_t)L * (size_t)chunk * (size_t)H, logn = (size_t)chunk * (size_t)V;
    j.ref_cap = eg_malloc(sizeof(float) * capn, &err);
    j.cap = eg_malloc(sizeof(float) * capn, &err);
    j.ref_log = eg_malloc(sizeof(float) * logn, &err);
    j.log = eg_malloc(sizeof(float) * logn, &err);
    j.lp_ref = eg_malloc(sizeof(double) * (size_t)V, &err);
    j.lp_set = eg_malloc(sizeof(double) * (size_t)V, &err);
    j.ids = eg_malloc(sizeof(int32_t) * (size_t)max_len, &err);
    j.ref_toks = eg_calloc((size_t)(a->steps > 0 ? a->steps : 1), sizeof(int32_t), &err);
    if (!j.ref_cap || !j.cap || !j.ref_log || !j.log || !j.lp_ref || !j.lp_set || !j.ids || !j.ref_toks) goto done;
    double t0 = eg_now();
    for (size_t i = 0; i < np; i++)
        if (compare_prompt(&j, i, &err)) goto done;
    fprintf(stderr, "eaglegen fidelity: %zu prompts, %d settings + reference in %.1f s\n", np, n_set, eg_now() - t0);
    out = compare_json(&j);
    rc = emit(a, out, compare_table_cb, &j);
done:
    if (rc == 1 && err.msg[0]) fprintf(stderr, "eaglegen fidelity: %s\n", err.msg);
    for (int k = 0; k < n_set; k++) {
        setting *s = &set[k];
        runner_free(&s->r);
        eg_backend_free(s->own_be);
        if (s->rel)
            for (int l = 0; l < model.cfg.n_layers; l++) free(s->rel[l].v);
        free(s->rel);
        free(s->div);
        free(s->toks);
    }
    free(set);
    runner_free(&j.ref);
    free(j.ref_cap);
    free(j.cap);
    free(j.ref_log);
    free(j.log);
    free(j.lp_ref);
    free(j.lp_set);
    free(j.ids);
    free(j.ref_toks);
    free(capture);
    eg_backend_free(cpu);
    eg_model_free(&model);
    json_decref(out);
    json_decref(root);
    return rc;
}

/* ---- audit mode ------------------------------------------------------------------------ */

typedef struct audit_ctx {
    const char *path;
    const char *precision; /* the manifest's list, JSON text or NULL */
    const char *kv;
    int n;
    double worst;
} audit_ctx;

static void audit_table(void *vc, json_t *root, FILE *f) {
    audit_ctx *c = vc;
    json_t *samples = json_object_get(root, "samples");
    fprintf(f, "audit of %s: %d samples re-run teacher-forced on the cpu backend (FP32 arithmetic, %s latent cache)\n",
            c->path, c->n, c->kv);
    fprintf(f, "the dataset's manifest records its precision as %s\n", c->precision ? c->precision : "(not recorded)");
    fprintf(f, "stored state vs the reference rounded to BF16: relative error per token, worst / median\n\n");
    fprintf(f, "%-24s %6s", "sample", "tokens");
    json_t *s0 = json_array_get(samples, 0);
    json_t *aux0 = json_object_get(s0, "aux");
    for (size_t k = 0; k < json_array_size(aux0); k++) {
        char b[32];
        snprintf(b, sizeof b, "aux layer %lld", (long long)json_integer_value(json_object_get(json_array_get(aux0, k), "layer")));
        fprintf(f, "  %-19s", b);
    }
    fprintf(f, "  %-19s  %s\n", "final", "tokens off / checked");
    size_t i;
    json_t *s;
    json_array_foreach(samples, i, s) {
        fprintf(f, "%-24.24s %6lld", json_string_value(json_object_get(s, "id")),
                (long long)json_integer_value(json_object_get(s, "tokens")));
        json_t *aux = json_object_get(s, "aux");
        for (size_t k = 0; k < json_array_size(aux); k++) {
            json_t *e = json_array_get(aux, k);
            fprintf(f, "  %8.1e / %-8.1e", json_real_value(json_object_get(e, "rel_worst")),
                    json_real_value(json_object_get(e, "rel_median")));
        }
        json_t *fi = json_object_get(s, "final");
        fprintf(f, "  %8.1e / %-8.1e  %lld / %lld\n", json_real_value(json_object_get(fi, "rel_worst")),
                json_real_value(json_object_get(fi, "rel_median")),
                (long long)json_integer_value(json_object_get(s, "tokens_off")),
                (long long)json_integer_value(json_object_get(s, "tokens_checked")));
    }
    fprintf(f, "\nworst over all stored states: %.2e\n", c->worst);
    fprintf(f, "tokens off: greedy samples, the stored token differs from the reference argmax where its margin > "
               "1e-2; sampled samples, its reference probability (at the sample's temperature) is below 1e-6.\n");
}

static eg_status audit_sample(const eg_model *m, runner *r, const eg_ds_info *info, const eg_ds_sample *smp,
                              float *cap, float *fin, float *log, double *lp, json_t **out, double *worst,
                              eg_error *err) {
    const eg_config *c = &m->cfg;
    int A = info->n_aux, V = c->vocab, chunk = r->chunk;
    int64_t H = c->hidden, T = smp->T;
    dvec *d = eg_calloc((size_t)A + 1, sizeof(dvec), err);
    if (!d) return EG_ERR_NOMEM;
    eg_status st = eg_kv_reserve(eg_forward_kv(r->f), 0, T, err);
    int64_t checked = 0, off = 0;
    float *rowbuf = eg_malloc(sizeof(float) * (size_t)H, err), *stored = eg_malloc(sizeof(float) * (size_t)H, err);
    if (!rowbuf || !stored) st = EG_ERR_NOMEM;
    int32_t prev_pred = -1;
    double prev_margin = 0;
    for (int64_t p0 = 0; p0 < T && !st; p0 += chunk) {
        int n = (int)(T - p0 < chunk ? T - p0 : chunk);
        if ((st = runner_step(r, smp->input_ids + p0, (int)p0, n, cap, fin, log, err))) break;
        for (int t = 0; t < n && !st; t++) {
            int64_t gt = p0 + t;
            for (int k = 0; k <= A && !st; k++) {
                const float *ref = k < A ? cap + ((int64_t)k * n + t) * H : fin + (int64_t)t * H;
                const uint16_t *sb = k < A ? (const uint16_t *)smp->aux_hidden + (gt * A + k) * H
                                           : (const uint16_t *)smp->final_hidden + gt * H;
                for (int64_t h = 0; h < H; h++) {
                    rowbuf[h] = eg_bf16_round(ref[h]);
                    stored[h] = eg_bf16_to_f32(sb[h]);
                }
                st = dvec_push(&d[k], rel_err(stored, rowbuf, H), err);
            }
            /* token gt is predicted by the logits at gt - 1; only generated tokens count */
            if (gt >= smp->prompt_len && gt < smp->prompt_len + smp->gen_len && gt > 0 && prev_pred >= 0) {
                if (smp->temperature <= 0) {
                    if (prev_margin > FID_MARGIN) {
                        checked++;
                        off += prev_pred != smp->input_ids[gt];
                    }
                } else {
                    checked++;
                    off += exp(lp[smp->input_ids[gt]]) < 1e-6;
                }
            }
            const float *lr = log + (int64_t)t * V;
            prev_pred = argmax_margin(lr, V, &prev_margin);
            if (smp->temperature > 0) log_softmax(lr, V, smp->temperature, lp);
        }
    }
    eg_kv_release(eg_forward_kv(r->f), 0);
    for (int k = 0; k <= A && !st; k++) { /* NaN counts as worst: the run fails, naming it (JSON has no NaN) */
        double w, md;
        dvec_stats(&d[k], &w, &md);
        if (isnan(w) || isnan(md))
            st = eg_fail(err, EG_ERR_INVALID, "%s: a value that is not finite (NaN or Inf) in the stored state or "
                         "the reference (`eaglegen inspect --verify` scans the stored states)",
                         k < A ? "an aux layer" : "the final state");
    }
    if (!st) {
        json_t *aux = json_array();
        double w, md;
        for (int k = 0; k < A; k++) {
            dvec_stats(&d[k], &w, &md);
            *worst = isnan(w) || w > *worst ? w : *worst;
            json_array_append_new(aux, json_pack("{s:i,s:f,s:f}", "layer", info->aux_layers[k], "rel_worst", w,
                                                 "rel_median", md));
        }
        dvec_stats(&d[A], &w, &md);
        *worst = isnan(w) || w > *worst ? w : *worst;
        *out = json_pack("{s:s,s:I,s:I,s:o,s:{s:f,s:f},s:I,s:I}", "id", smp->id, "tokens", (json_int_t)T, "prompt_len",
                         (json_int_t)smp->prompt_len, "aux", aux, "final", "rel_worst", w, "rel_median", md,
                         "tokens_checked", (json_int_t)checked, "tokens_off", (json_int_t)off);
    }
    for (int k = 0; k <= A; k++) free(d[k].v);
    free(d);
    free(rowbuf);
    free(stored);
    return st;
}

static int run_audit(const fid_args *a) {
    eg_error err = {0};
    eg_model model;
    memset(&model, 0, sizeof model);
    eg_ds_reader *rd = NULL;
    eg_backend *cpu = NULL;
    runner r;
    memset(&r, 0, sizeof r);
    json_t *samples = json_array(), *out = NULL;
    float *cap = NULL, *fin = NULL, *log = NULL;
    double *lp = NULL;
    int rc = 1;
    eg_kv_dtype kv = EG_KV_BF16;
    if (a->kv && !strcmp(a->kv, "fp32")) kv = EG_KV_FP32;
    else if (a->kv && strcmp(a->kv, "bf16")) {
        fprintf(stderr, "eaglegen fidelity: --kv expects bf16 or fp32, got '%s'\n", a->kv);
        json_decref(samples);
        return 2;
    }
    if (dataset_open(a->audit, &rd, &err)) goto done;
    if (eg_model_load(a->model, &model, &err)) goto done;
    const eg_config *c = &model.cfg;
    const eg_ds_info *info = dataset_info(rd);
    if (!dataset_has_manifest(rd)) { eg_fail(&err, EG_ERR_FORMAT, "%s: no manifest (audit a dataset directory)", a->audit); goto done; }
    if (info->hidden_size != c->hidden) {
        eg_fail(&err, EG_ERR_CONFIG, "%s: hidden size %lld, but the model %s has %d", a->audit,
                (long long)info->hidden_size, a->model, c->hidden);
        goto done;
    }
    if (info->model_config_sha256 && *info->model_config_sha256 && strcmp(info->model_config_sha256, c->hash)) {
        eg_fail(&err, EG_ERR_CONFIG, "%s was made with model config sha256 %.12s..., but %s has %.12s...", a->audit,
                info->model_config_sha256, a->model, c->hash);
        goto done;
    }
    for (int k = 0; k < info->n_aux; k++)
        if (info->aux_layers[k] < -1 || info->aux_layers[k] >= c->n_layers) {
            eg_fail(&err, EG_ERR_CONFIG, "%s: aux layer %d outside the model's %d layers", a->audit, info->aux_layers[k],
                    c->n_layers);
            goto done;
        }
    int64_t total = dataset_num_samples(rd);
    if (total == 0) { eg_fail(&err, EG_ERR_INVALID, "%s holds no samples", a->audit); goto done; }
    int n = a->samples < total ? a->samples : (int)total;
    /* the longest sample among those audited bounds the cache */
    int64_t *pick = eg_malloc(sizeof(int64_t) * (size_t)n, &err);
    if (!pick) goto done;
    int64_t max_T = 1;
    for (int i = 0; i < n; i++) {
        pick[i] = (int64_t)((double)i * (double)total / (double)n);
        eg_ds_sample s;
        memset(&s, 0, sizeof s);
        if (dataset_read(rd, pick[i], 1, &s, &err)) { free(pick); goto done; }
        if (s.T > max_T) max_T = s.T;
        eg_ds_sample_clear(&s);
    }
    int chunk = a->chunk, V = c->vocab;
    int64_t H = c->hidden;
    eg_backend_opts bo = {.name = "cpu", .max_tokens = chunk, .max_seq_len = (int)max_T + 1, .nthreads = a->threads};
    if (eg_backend_create(c, &bo, &cpu, &err) ||
        runner_create(&model, cpu, kv, chunk, (int)max_T + 1, info->aux_layers, info->n_aux,
                      info->final_source == EG_DS_FINAL_PRE_NORM, &r, &err)) {
        free(pick);
        goto done;
    }
    cap = eg_malloc(sizeof(float) * (size_t)(info->n_aux > 0 ? info->n_aux : 1) * (size_t)chunk * (size_t)H, &err);
    fin = eg_malloc(sizeof(float) * (size_t)chunk * (size_t)H, &err);
    log = eg_malloc(sizeof(float) * (size_t)chunk * (size_t)V, &err);
    lp = eg_malloc(sizeof(double) * (size_t)V, &err);
    if (!cap || !fin || !log || !lp) { free(pick); goto done; }
    double worst = 0;
    for (int i = 0; i < n; i++) {
        eg_ds_sample s;
        memset(&s, 0, sizeof s);
        json_t *one = NULL;
        eg_status st = dataset_read(rd, pick[i], 0, &s, &err);
        if (!st) st = audit_sample(&model, &r, info, &s, cap, fin, log, lp, &one, &worst, &err);
        if (st) eg_wrap(&err, "%s: sample %lld (%s)", a->audit, (long long)pick[i], s.id ? s.id : "?");
        eg_ds_sample_clear(&s);
        if (st) { free(pick); goto done; }
        json_array_append_new(samples, one);
    }
    free(pick);
    out = json_pack("{s:s,s:s,s:f,s:O}", "dataset", a->audit, "reference", kv == EG_KV_FP32 ? "kv=fp32" : "kv=bf16",
                    "worst", worst, "samples", samples);
    audit_ctx ac = {.path = a->audit, .precision = info->precision_json, .kv = kv == EG_KV_FP32 ? "FP32" : "BF16", .n = n, .worst = worst};
    rc = emit(a, out, audit_table, &ac);
    if (!rc && a->fail_set && !(worst <= a->fail_above)) {
        fprintf(stderr, "eaglegen fidelity: stored states are %.2e from the reference, above --fail-above %.2e\n",
                worst, a->fail_above);
        rc = 1;
    }
done:
    if (rc == 1 && err.msg[0]) fprintf(stderr, "eaglegen fidelity: %s\n", err.msg);
    runner_free(&r);
    eg_backend_free(cpu);
    dataset_close(rd);
    eg_model_free(&model);
    free(cap);
    free(fin);
    free(log);
    free(lp);
    json_decref(samples);
    json_decref(out);
    return rc;
}

int cmd_fidelity(int argc, char **argv) {
    fid_args a = {.steps = 32, .samples = 16, .chunk = 256, .thinking = 1};
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"prompts", required_argument, 0, 'p'},
        {"compare", required_argument, 0, 'C'}, {"steps", required_argument, 0, 'n'},
        {"audit", required_argument, 0, 'a'},   {"samples", required_argument, 0, 'S'},
        {"kv", required_argument, 0, 'k'},      {"fail-above", required_argument, 0, 'F'},
        {"json", optional_argument, 0, 'j'},    {"threads", required_argument, 0, 't'},
        {"chunk", required_argument, 0, 'c'},   {"device", required_argument, 0, 'd'},
        {"tokenizer", required_argument, 0, 'T'}, {"mode", required_argument, 0, 'M'},
        {"thinking", required_argument, 0, 'H'}, {"limit", required_argument, 0, 'l'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    optind = 1;
    int ch;
    const char *compare_only = NULL, *audit_only = NULL; /* the first option of each mode given */
    while ((ch = gen_getopt(argc, argv, "fidelity", "h", opts)) != -1) {
        for (const struct option *o = opts; ch > 0 && o->name; o++)
            if (o->val == ch && strchr("CTMHnld", ch) && !compare_only) compare_only = o->name;
            else if (o->val == ch && strchr("SkF", ch) && !audit_only) audit_only = o->name;
        switch (ch) {
        case 'm': a.model = optarg; break;
        case 'p': a.prompts = optarg; break;
        case 'C': a.compare = optarg; break;
        case 'a': a.audit = optarg; break;
        case 'k': a.kv = optarg; break;
        case 'T': a.tokenizer = optarg; break;
        case 'M':
            if (strcmp(optarg, "regenerate") && strcmp(optarg, "capture")) {
                fprintf(stderr, "eaglegen fidelity: --mode expects regenerate or capture, got '%s'\n", optarg);
                return 2;
            }
            a.mode = optarg;
            break;
        case 'H':
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "eaglegen fidelity: --thinking expects on or off, got '%s'\n", optarg);
                return 2;
            }
            a.thinking = !strcmp(optarg, "on");
            break;
        case 'l': if (!gen_arg_int("fidelity", "--limit", optarg, 1, 1 << 30, &a.limit)) return 2; break;
        case 'j': a.json = 1; a.json_path = optarg; break;
        case 'n': if (!gen_arg_int("fidelity", "--steps", optarg, 0, 1 << 20, &a.steps)) return 2; break;
        case 'S': if (!gen_arg_int("fidelity", "--samples", optarg, 1, 1 << 30, &a.samples)) return 2; break;
        case 't': if (!gen_arg_int("fidelity", "--threads", optarg, 1, 4096, &a.threads)) return 2; break;
        case 'c': if (!gen_arg_int("fidelity", "--chunk", optarg, 1, 1 << 20, &a.chunk)) return 2; break;
        case 'd': if (!gen_arg_int("fidelity", "--device", optarg, 0, 1024, &a.device)) return 2; break;
        case 'F':
            if (!gen_arg_double("fidelity", "--fail-above", optarg, 0, 1e30, &a.fail_above)) return 2;
            a.fail_set = 1;
            break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    if (optind < argc) {
        /* --json's file is optional, so it only comes as --json=FILE; "--json FILE" leaves FILE here */
        int after_json = 0;
        for (int i = 1; i < optind; i++) after_json |= !strcmp(argv[i], "--json");
        fprintf(stderr, "eaglegen fidelity: unexpected argument '%s'%s\n", argv[optind],
                after_json ? " (--json writes to a file given as --json=FILE)" : "");
        return 2;
    }
    if (!a.model || (!a.prompts == !a.audit)) {
        fprintf(stderr, "eaglegen fidelity: --model and one of --prompts (compare) or --audit (audit) are required\n");
        usage(stderr);
        return 2;
    }
    if (a.audit && compare_only) {
        fprintf(stderr, "eaglegen fidelity: --%s applies to --prompts (compare), not --audit\n", compare_only);
        return 2;
    }
    if (a.prompts && audit_only) {
        fprintf(stderr, "eaglegen fidelity: --%s applies to --audit, not --prompts (compare)\n", audit_only);
        return 2;
    }
    return a.audit ? run_audit(&a) : run_compare(&a);
}
