/* Model loading: index.json / single file, mmapped shards, per-tensor validation; see
 * weights.h.
 *
 * Name resolution: every tensor name is normalised by dropping a leading
 * "language_model." and put in one hash table (name -> shard, tensor). With an index,
 * the index is authoritative: a name maps to the shard the index names, and a tensor
 * the index lists but its shard lacks is reported (only when the model needs it).
 * Unused tensors (vision_tower.*, mm_projector.*, rotary_emb.inv_freq, MTP layers at
 * index >= num_hidden_layers) are simply never looked up.
 *
 * Formats per tensor, detected from what is stored:
 *   BASE.weight BF16/F32/F16                         plain
 *   BASE.weight F8_E4M3 + BASE.weight_scale_inv F32   FP8 block (config quant_method fp8)
 *   BASE.weight_packed I32 + weight_scale BF16 + weight_shape I32/I64 [2]
 *                                                    INT4 (config compressed-tensors)
 * Routed experts must be in the format quantization_config announces (the backends
 * pick their expert kernels from cfg.expert_format); other linear layers may be plain
 * or in the announced quantised format. Embedding, norms, router and bias are plain. */
#include "engine/weights.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "common/eg_thread.h"
#include "engine/safetensors.h"

typedef struct wentry {
    const char *name;         /* normalised (no language_model.) */
    int shard;
    const eg_st_tensor *t;    /* NULL: the index lists it but the shard lacks it */
} wentry;

typedef struct wpriv {
    int n_shards;
    eg_st_file **shards;
    char **shard_names;       /* basenames, for messages */
    wentry *e;
    int n;
    uint64_t cap;
    int *slots;               /* index+1 into e */
    char *arena;              /* names */
} wpriv;

static uint64_t w_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static const char *strip_prefix(const char *n) {
    static const char pre[] = "language_model.";
    return strncmp(n, pre, sizeof pre - 1) == 0 ? n + sizeof pre - 1 : n;
}

static const wentry *w_find(const wpriv *p, const char *name) {
    uint64_t i = w_hash(name) & (p->cap - 1);
    while (p->slots[i]) {
        const wentry *e = &p->e[p->slots[i] - 1];
        if (!strcmp(e->name, name)) return e;
        i = (i + 1) & (p->cap - 1);
    }
    return NULL;
}

/* Insert; returns the existing entry on a duplicate, NULL when inserted. */
static const wentry *w_insert(wpriv *p, const char *name, int shard, const eg_st_tensor *t) {
    uint64_t i = w_hash(name) & (p->cap - 1);
    while (p->slots[i]) {
        const wentry *e = &p->e[p->slots[i] - 1];
        if (!strcmp(e->name, name)) return e;
        i = (i + 1) & (p->cap - 1);
    }
    p->e[p->n] = (wentry){name, shard, t};
    p->slots[i] = ++p->n;
    return NULL;
}

static void wpriv_free(wpriv *p) {
    if (!p) return;
    for (int i = 0; i < p->n_shards; i++) {
        eg_st_close(p->shards[i]);
        free(p->shard_names[i]);
    }
    free(p->shards);
    free(p->shard_names);
    free(p->e);
    free(p->slots);
    free(p->arena);
    free(p);
}

int eg_model_head_tied(const eg_model *m) {
    return m->cfg.tie_embeddings && m->lm_head.data == m->embed.data;
}

void eg_model_free(eg_model *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) free(m->layers[l].experts);
    free(m->layers);
    wpriv_free(m->priv);
    free(m->dir);
    eg_config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Read a whole (small) file. */
static eg_status slurp(const char *path, char **out, size_t *len, eg_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t k = fread(b + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!b) return eg_fail(err, EG_ERR_NOMEM, "%s: out of memory", path);
    if (bad) {
        free(b);
        return eg_fail(err, EG_ERR_IO, "%s: read error", path);
    }
    *out = b;
    *len = n;
    return EG_OK;
}

static eg_status open_shard(wpriv *p, const char *dir, const char *fname, eg_error *err) {
    char *path = path_join(dir, fname);
    if (!path) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    eg_status st = eg_st_open(path, &p->shards[p->n_shards], err);
    free(path);
    if (st) return st;
    if (!(p->shard_names[p->n_shards] = strdup(fname))) {
        eg_st_close(p->shards[p->n_shards]);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    p->n_shards++;
    return EG_OK;
}

static eg_status table_alloc(wpriv *p, size_t n, size_t arena, eg_error *err) {
    p->cap = 16;
    while (p->cap < 2 * (uint64_t)n) p->cap <<= 1;
    p->slots = calloc(p->cap, sizeof *p->slots);
    p->e = calloc(n ? n : 1, sizeof *p->e);
    p->arena = malloc(arena ? arena : 1);
    if (!p->slots || !p->e || !p->arena) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    return EG_OK;
}

static eg_status dup_error(const wpriv *p, const char *dir, const wentry *old, const char *name,
                           int shard, eg_error *err) {
    return eg_fail(err, EG_ERR_FORMAT,
                   "%s: tensor %s appears twice (in %s and %s, with or without the "
                   "language_model. prefix)",
                   dir, name, p->shard_names[old->shard], p->shard_names[shard]);
}

typedef struct open_job {
    wpriv *p;
    const char *dir;
    eg_status *st;
    eg_error *err;
} open_job;

static void open_range(void *ctx, int64_t b, int64_t e, int tid) {
    (void)tid;
    open_job *j = ctx;
    for (int64_t i = b; i < e; i++) {
        char *path = path_join(j->dir, j->p->shard_names[i]);
        j->st[i] = path ? eg_st_open(path, &j->p->shards[i], &j->err[i])
                        : eg_fail(&j->err[i], EG_ERR_NOMEM, "out of memory");
        free(path);
    }
}

/* Open (mmap + parse + validate the header of) every named shard, in parallel: the
 * headers of a 64-shard checkpoint are tens of MB of JSON. The first failure in shard
 * order is reported. */
static eg_status open_shards(wpriv *p, const char *dir, eg_error *err) {
    eg_status *sts = calloc((size_t)p->n_shards + 1, sizeof *sts);
    eg_error *errs = calloc((size_t)p->n_shards + 1, sizeof *errs);
    eg_pool *pool = NULL;
    eg_status st = EG_OK;
    if (!sts || !errs) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    else {
        int nt = eg_num_threads();
        if (nt > p->n_shards) nt = p->n_shards;
        if (nt > 1 && eg_pool_create(nt, &pool, err) != EG_OK) pool = NULL; /* run inline */
        open_job j = {p, dir, sts, errs};
        eg_pool_for(pool, p->n_shards, 1, open_range, &j);
        for (int i = 0; i < p->n_shards && !st; i++)
            if (sts[i]) {
                st = sts[i];
                if (err) *err = errs[i];
            }
    }
    eg_pool_free(pool);
    free(sts);
    free(errs);
    return st;
}

/* Build the name table from model.safetensors.index.json. */
static eg_status load_index(wpriv *p, const char *dir, const char *ipath, eg_error *err) {
    char *buf = NULL;
    size_t len = 0;
    eg_status st = slurp(ipath, &buf, &len, err);
    if (st) return st;
    json_error_t je;
    json_t *root = json_loadb(buf, len, 0, &je);
    free(buf);
    if (!root)
        return eg_fail(err, EG_ERR_FORMAT, "%s: bad JSON at line %d column %d: %s", ipath, je.line,
                       je.column, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    const char *k;
    json_t *v;
    size_t n = 0, arena = 0;
    if (!json_is_object(wm)) {
        st = eg_fail(err, EG_ERR_FORMAT, "%s: no \"weight_map\" object", ipath);
        goto out;
    }
    n = json_object_size(wm);
    /* Distinct shard names: small (tens), a linear set is fine. */
    p->shards = calloc(n ? n : 1, sizeof *p->shards);
    p->shard_names = calloc(n ? n : 1, sizeof *p->shard_names);
    int *sidx = calloc(n ? n : 1, sizeof *sidx);
    if (!p->shards || !p->shard_names || !sidx) {
        free(sidx);
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto out;
    }
    size_t i = 0;
    json_object_foreach(wm, k, v) {
        if (!json_is_string(v)) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: weight_map[\"%.200s\"] is not a file name",
                         ipath, k);
            break;
        }
        const char *fn = json_string_value(v);
        if (!*fn || strchr(fn, '/') || !strcmp(fn, "..") || !strcmp(fn, ".")) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: weight_map[\"%.200s\"] = \"%.200s\" is not a "
                         "file name in the model directory", ipath, k, fn);
            break;
        }
        /* entries come grouped by shard: try the previous one first */
        int s = i && !strcmp(p->shard_names[sidx[i - 1]], fn) ? sidx[i - 1] : -1;
        for (int j = p->n_shards - 1; j >= 0 && s < 0; j--)
            if (!strcmp(p->shard_names[j], fn)) s = j;
        if (s < 0) {
            if (!(p->shard_names[p->n_shards] = strdup(fn))) {
                st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
                break;
            }
            s = p->n_shards++;
        }
        sidx[i++] = s;
        arena += strlen(k) + 1;
    }
    if (!st) st = open_shards(p, dir, err);
    if (!st) st = table_alloc(p, n, arena, err);
    if (!st) {
        char *ap = p->arena;
        i = 0;
        json_object_foreach(wm, k, v) {
            int s = sidx[i++];
            const char *nn = strip_prefix(k);
            size_t l = strlen(nn);
            memcpy(ap, nn, l + 1);
            const wentry *old = w_insert(p, ap, s, eg_st_find(p->shards[s], k));
            if (old) {
                st = dup_error(p, dir, old, ap, s, err);
                break;
            }
            ap += l + 1;
        }
    }
    free(sidx);
out:
    json_decref(root);
    return st;
}

static eg_status load_single(wpriv *p, const char *dir, eg_error *err) {
    p->shards = calloc(1, sizeof *p->shards);
    p->shard_names = calloc(1, sizeof *p->shard_names);
    if (!p->shards || !p->shard_names) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    eg_status st = open_shard(p, dir, "model.safetensors", err);
    if (st) return st;
    const eg_st_file *f = p->shards[0];
    int n = eg_st_count(f);
    if ((st = table_alloc(p, (size_t)n, 0, err))) return st;
    for (int i = 0; i < n; i++) {
        const eg_st_tensor *t = eg_st_at(f, i);
        const char *nn = strip_prefix(t->name); /* lives in the shard's own name arena */
        const wentry *old = w_insert(p, nn, 0, t);
        if (old) return dup_error(p, dir, old, nn, 0, err);
    }
    return EG_OK;
}

/* ---- tensor resolution ---- */

typedef struct ld {
    eg_model *m;
    wpriv *p;
    eg_error *err;
    const char *dir;
} ld;

enum wkind {
    K_VEC,    /* 1-D [cols] norm weight, plain */
    K_BIAS,   /* 1-D [cols] e_score_correction_bias, plain */
    K_EMB,    /* 2-D plain (embedding, lm_head, router) */
    K_LIN,    /* 2-D plain or the configured quantised format */
    K_EXPERT  /* 2-D in exactly the configured expert format */
};

static const char *fmt_name(eg_expert_format f) {
    return f == EG_EXPERTS_INT4 ? "INT4 pack-quantized (weight_packed)"
           : f == EG_EXPERTS_FP8_BLOCK ? "FP8 block (F8_E4M3 + weight_scale_inv)"
                                       : "BF16/F32/F16";
}

/* Look up NAME; on failure set err naming tensor (and file when known). */
static eg_status get_t(ld *L, const char *name, const eg_st_tensor **out, int *shard) {
    const wentry *e = w_find(L->p, name);
    *out = NULL;
    if (!e)
        return eg_fail(L->err, EG_ERR_FORMAT, "%s: tensor %s missing (not in %s)", L->dir, name,
                       L->p->n_shards == 1 && !strcmp(L->p->shard_names[0], "model.safetensors")
                           ? "model.safetensors"
                           : "model.safetensors.index.json");
    if (!e->t)
        return eg_fail(L->err, EG_ERR_FORMAT,
                       "%s: tensor %s missing from %s (model.safetensors.index.json lists it there)",
                       L->dir, name, L->p->shard_names[e->shard]);
    if (!eg_st_aligned(e->t))
        return eg_fail(L->err, EG_ERR_FORMAT,
                       "%s: tensor %s in %s: data not aligned to its %zu-byte elements", L->dir,
                       name, L->p->shard_names[e->shard], eg_st_dtype_size(e->t->dtype));
    *out = e->t;
    *shard = e->shard;
    return EG_OK;
}

static eg_status bad_shape(ld *L, const char *name, int shard, const eg_st_tensor *t, int nd,
                           const int64_t *want) {
    char a[200] = "[", b[200] = "[";
    for (int i = 0; i < t->ndim; i++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    for (int i = 0; i < nd; i++)
        snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", i ? ", " : "", (long long)want[i]);
    return eg_fail(L->err, EG_ERR_FORMAT, "%s: tensor %s in %s: shape %s], expected %s]", L->dir,
                   name, L->p->shard_names[shard], a, b);
}

static int shape_is(const eg_st_tensor *t, int nd, const int64_t *s) {
    if (t->ndim != nd) return 0;
    for (int i = 0; i < nd; i++)
        if (t->shape[i] != s[i]) return 0;
    return 1;
}

static eg_wfmt plain_fmt(eg_st_dtype d) {
    return d == EG_ST_BF16 ? EG_W_BF16 : d == EG_ST_F32 ? EG_W_F32 : d == EG_ST_F16 ? EG_W_F16 : EG_W_NONE;
}

static eg_status bad_dtype(ld *L, const char *name, int shard, const eg_st_tensor *t,
                           const char *want) {
    return eg_fail(L->err, EG_ERR_FORMAT, "%s: tensor %s in %s: dtype %s, expected %s", L->dir,
                   name, L->p->shard_names[shard], eg_st_dtype_name(t->dtype), want);
}

/* Resolve weight `base` (e.g. "model.layers.3.self_attn.q_a_proj") or, for K_BIAS, the
 * full tensor name. rows/cols: expected logical shape (rows = 1 for vectors). */
static eg_status get_w(ld *L, const char *base, enum wkind kind, int64_t rows, int64_t cols,
                       eg_weight *w) {
    char name[512], aux[512];
    const eg_st_tensor *t, *s;
    int sh, sh2;
    eg_status st;
    const eg_config *c = &L->m->cfg;
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    if (kind == K_BIAS) snprintf(name, sizeof name, "%s", base);
    else snprintf(name, sizeof name, "%s.weight", base);

    const wentry *e = w_find(L->p, name);
    snprintf(aux, sizeof aux, "%s.weight_packed", base);
    int packed = kind != K_BIAS && !e && w_find(L->p, aux);
    if (kind == K_EXPERT) {
        if (c->expert_format == EG_EXPERTS_INT4 && !packed) {
            if (!e) return get_t(L, aux, &t, &sh);
            return eg_fail(L->err, EG_ERR_FORMAT,
                           "%s: tensor %s in %s: routed expert stored unquantised, but "
                           "quantization_config announces %s",
                           L->dir, name, L->p->shard_names[e->shard], fmt_name(c->expert_format));
        }
    }
    if (packed) {
        if (kind != K_LIN && kind != K_EXPERT)
            return eg_fail(L->err, EG_ERR_FORMAT, "%s: tensor %s: INT4 not allowed here", L->dir,
                           aux);
        if (c->expert_format != EG_EXPERTS_INT4)
            return eg_fail(L->err, EG_ERR_FORMAT,
                           "%s: tensor %s is INT4 pack-quantized, but config.json has no "
                           "compressed-tensors quantization_config",
                           L->dir, aux);
        const int g = c->quant_group;
        if ((st = get_t(L, aux, &t, &sh))) return st;
        if (t->dtype != EG_ST_I32) return bad_dtype(L, aux, sh, t, "I32");
        if (cols % 8 || cols % g)
            return eg_fail(L->err, EG_ERR_CONFIG,
                           "%s: tensor %s: %lld input columns not a multiple of 8 and group %d",
                           L->dir, aux, (long long)cols, g);
        int64_t want[2] = {rows, cols / 8};
        if (!shape_is(t, 2, want)) return bad_shape(L, aux, sh, t, 2, want);
        w->fmt = EG_W_INT4;
        w->data = t->data;
        w->group = g;
        w->name = w_find(L->p, aux)->name;
        snprintf(aux, sizeof aux, "%s.weight_scale", base);
        if ((st = get_t(L, aux, &s, &sh2))) return st;
        if (s->dtype != EG_ST_BF16) return bad_dtype(L, aux, sh2, s, "BF16");
        int64_t ws[2] = {rows, cols / g};
        if (!shape_is(s, 2, ws)) return bad_shape(L, aux, sh2, s, 2, ws);
        w->scale = s->data;
        snprintf(aux, sizeof aux, "%s.weight_shape", base);
        if ((st = get_t(L, aux, &s, &sh2))) return st;
        int64_t two[1] = {2};
        if (s->dtype != EG_ST_I32 && s->dtype != EG_ST_I64) return bad_dtype(L, aux, sh2, s, "I32 or I64");
        if (!shape_is(s, 1, two)) return bad_shape(L, aux, sh2, s, 1, two);
        int64_t v[2];
        for (int i = 0; i < 2; i++) {
            if (s->dtype == EG_ST_I32) {
                int32_t x;
                memcpy(&x, (const char *)s->data + 4 * i, 4);
                v[i] = x;
            } else {
                memcpy(&v[i], (const char *)s->data + 8 * i, 8);
            }
        }
        if (v[0] != rows || v[1] != cols)
            return eg_fail(L->err, EG_ERR_FORMAT,
                           "%s: tensor %s in %s: value [%lld, %lld], expected [%lld, %lld]",
                           L->dir, aux, L->p->shard_names[sh2], (long long)v[0], (long long)v[1],
                           (long long)rows, (long long)cols);
        return EG_OK;
    }
    if ((st = get_t(L, name, &t, &sh))) return st;
    w->name = w_find(L->p, name)->name;
    w->data = t->data;
    if (kind == K_VEC || kind == K_BIAS) {
        int64_t want[1] = {cols};
        if (!(w->fmt = plain_fmt(t->dtype))) return bad_dtype(L, name, sh, t, "BF16, F32 or F16");
        if (!shape_is(t, 1, want)) return bad_shape(L, name, sh, t, 1, want);
        return EG_OK;
    }
    int64_t want[2] = {rows, cols};
    if (t->dtype == EG_ST_F8_E4M3) {
        if (kind != K_LIN && kind != K_EXPERT) return bad_dtype(L, name, sh, t, "BF16, F32 or F16");
        if (c->expert_format != EG_EXPERTS_FP8_BLOCK)
            return eg_fail(L->err, EG_ERR_FORMAT,
                           "%s: tensor %s in %s is F8_E4M3, but config.json has no fp8 "
                           "quantization_config",
                           L->dir, name, L->p->shard_names[sh]);
        if (!shape_is(t, 2, want)) return bad_shape(L, name, sh, t, 2, want);
        snprintf(aux, sizeof aux, "%s.weight_scale_inv", base);
        if ((st = get_t(L, aux, &s, &sh2))) return st;
        if (s->dtype != EG_ST_F32) return bad_dtype(L, aux, sh2, s, "F32");
        int64_t ws[2] = {(rows + 127) / 128, (cols + 127) / 128};
        if (!shape_is(s, 2, ws)) return bad_shape(L, aux, sh2, s, 2, ws);
        w->fmt = EG_W_FP8;
        w->scale = s->data;
        return EG_OK;
    }
    if (!(w->fmt = plain_fmt(t->dtype)))
        return bad_dtype(L, name, sh, t,
                         kind == K_LIN || kind == K_EXPERT ? "BF16, F32, F16 or a quantised format"
                                                           : "BF16, F32 or F16");
    if (kind == K_EXPERT && c->expert_format == EG_EXPERTS_FP8_BLOCK)
        return eg_fail(L->err, EG_ERR_FORMAT,
                       "%s: tensor %s in %s: routed expert stored unquantised, but "
                       "quantization_config announces %s",
                       L->dir, name, L->p->shard_names[sh], fmt_name(c->expert_format));
    if (!shape_is(t, 2, want)) return bad_shape(L, name, sh, t, 2, want);
    return EG_OK;
}

static eg_status load_layer(ld *L, int l) {
    const eg_config *c = &L->m->cfg;
    eg_layer_w *y = &L->m->layers[l];
    char b[256], n[320];
    eg_status st;
    const int64_t H = c->hidden, NH = c->n_heads, DQ = c->qk_nope + c->qk_rope;
#define W(suffix, kind, r, cc, dst)                                                     \
    do {                                                                                \
        snprintf(n, sizeof n, "%s%s", b, suffix);                                       \
        if ((st = get_w(L, n, kind, r, cc, dst))) return st;                            \
    } while (0)
    snprintf(b, sizeof b, "model.layers.%d.", l);
    W("input_layernorm", K_VEC, 1, H, &y->attn_norm);
    W("post_attention_layernorm", K_VEC, 1, H, &y->ffn_norm);
    if (c->q_lora_rank > 0) {
        W("self_attn.q_a_proj", K_LIN, c->q_lora_rank, H, &y->q_a);
        W("self_attn.q_a_layernorm", K_VEC, 1, c->q_lora_rank, &y->q_a_norm);
        W("self_attn.q_b_proj", K_LIN, NH * DQ, c->q_lora_rank, &y->q_b);
    } else {
        W("self_attn.q_proj", K_LIN, NH * DQ, H, &y->q);
    }
    W("self_attn.kv_a_proj_with_mqa", K_LIN, c->kv_lora_rank + c->qk_rope, H, &y->kv_a);
    W("self_attn.kv_a_layernorm", K_VEC, 1, c->kv_lora_rank, &y->kv_a_norm);
    W("self_attn.kv_b_proj", K_LIN, NH * (c->qk_nope + c->v_head), c->kv_lora_rank, &y->kv_b);
    W("self_attn.o_proj", K_LIN, H, NH * c->v_head, &y->o);
    y->is_moe = eg_config_layer_is_moe(c, l);
    if (!y->is_moe) {
        W("mlp.gate_proj", K_LIN, c->inter, H, &y->mlp_gate);
        W("mlp.up_proj", K_LIN, c->inter, H, &y->mlp_up);
        W("mlp.down_proj", K_LIN, H, c->inter, &y->mlp_down);
        return EG_OK;
    }
    const int64_t E = c->n_experts, F = c->moe_inter, SF = (int64_t)c->n_shared * F;
    W("mlp.gate", K_EMB, E, H, &y->router);
    snprintf(n, sizeof n, "%smlp.gate.e_score_correction_bias", b);
    if ((st = get_w(L, n, K_BIAS, 1, E, &y->router_bias))) return st;
    y->experts = calloc((size_t)E, sizeof *y->experts);
    if (!y->experts) return eg_fail(L->err, EG_ERR_NOMEM, "out of memory");
    for (int e = 0; e < E; e++) {
        char eb[64];
        snprintf(eb, sizeof eb, "mlp.experts.%d.gate_proj", e);
        W(eb, K_EXPERT, F, H, &y->experts[e].gate);
        snprintf(eb, sizeof eb, "mlp.experts.%d.up_proj", e);
        W(eb, K_EXPERT, F, H, &y->experts[e].up);
        snprintf(eb, sizeof eb, "mlp.experts.%d.down_proj", e);
        W(eb, K_EXPERT, H, F, &y->experts[e].down);
    }
    if (SF > 0) {
        W("mlp.shared_experts.gate_proj", K_LIN, SF, H, &y->sh_gate);
        W("mlp.shared_experts.up_proj", K_LIN, SF, H, &y->sh_up);
        W("mlp.shared_experts.down_proj", K_LIN, H, SF, &y->sh_down);
    }
#undef W
    return EG_OK;
}

static int64_t layer_bytes(const eg_layer_w *y, const eg_config *c) {
    const eg_weight *ws[] = {&y->attn_norm, &y->ffn_norm, &y->q_a, &y->q_a_norm, &y->q_b,
                             &y->q, &y->kv_a, &y->kv_a_norm, &y->kv_b, &y->o, &y->mlp_gate,
                             &y->mlp_up, &y->mlp_down, &y->router, &y->router_bias, &y->sh_gate,
                             &y->sh_up, &y->sh_down};
    int64_t b = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) b += eg_weight_bytes(ws[i]);
    if (y->experts)
        for (int e = 0; e < c->n_experts; e++)
            b += eg_weight_bytes(&y->experts[e].gate) + eg_weight_bytes(&y->experts[e].up) +
                 eg_weight_bytes(&y->experts[e].down);
    return b;
}

eg_status eg_model_load(const char *dir, eg_model *m, eg_error *err) {
    memset(m, 0, sizeof *m);
    eg_status st = eg_config_load(dir, &m->cfg, err);
    if (st) return st;
    wpriv *p = calloc(1, sizeof *p);
    m->dir = strdup(dir);
    if (!p || !m->dir) {
        free(p);
        eg_model_free(m);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    m->priv = p;
    char *ipath = path_join(dir, "model.safetensors.index.json");
    char *spath = path_join(dir, "model.safetensors");
    if (!ipath || !spath) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    else if (file_exists(ipath)) st = load_index(p, dir, ipath, err);
    else if (file_exists(spath)) st = load_single(p, dir, err);
    else
        st = eg_fail(err, EG_ERR_IO, "%s: no model.safetensors.index.json or model.safetensors",
                     dir);
    free(ipath);
    free(spath);
    if (st) goto fail;

    /* Validation reads scattered small tensors (69k INT4 weight_shape values across a
     * 595 GB Kimi checkpoint); with default readahead every one of those page faults
     * pulls in 128 KB+ (measured: 55 s instead of under a second on a sparse copy). */
    for (int i = 0; i < p->n_shards; i++) eg_st_advise(p->shards[i], MADV_RANDOM);
    ld L = {m, p, err, dir};
    const eg_config *c = &m->cfg;
    if ((st = get_w(&L, "model.embed_tokens", K_EMB, c->vocab, c->hidden, &m->embed))) goto fail;
    if ((st = get_w(&L, "model.norm", K_VEC, 1, c->hidden, &m->final_norm))) goto fail;
    /* Tied, but the checkpoint carries its own lm_head (a VL wrapper whose text_config
     * keeps HF's default tie_word_embeddings=true while the model is untied): the stored
     * head is the one the model was trained with. */
    int tied = c->tie_embeddings && !w_find(p, "lm_head.weight");
    if (tied) m->lm_head = m->embed;
    else if ((st = get_w(&L, "lm_head", K_EMB, c->vocab, c->hidden, &m->lm_head))) goto fail;
    {
        /* the last layer must exist before num_hidden_layers sizes anything (a corrupt
         * count would otherwise ask for gigabytes first) */
        char last[96];
        snprintf(last, sizeof last, "model.layers.%d.input_layernorm.weight", c->n_layers - 1);
        if (!w_find(p, last)) {
            st = eg_fail(err, EG_ERR_FORMAT, "%s: config.json says num_hidden_layers = %d but the checkpoint has no %s",
                         dir, c->n_layers, last);
            goto fail;
        }
    }
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        goto fail;
    }
    m->weight_bytes = eg_weight_bytes(&m->embed) + eg_weight_bytes(&m->final_norm) +
                      (tied ? 0 : eg_weight_bytes(&m->lm_head));
    for (int l = 0; l < c->n_layers; l++) {
        if ((st = load_layer(&L, l))) goto fail;
        m->weight_bytes += layer_bytes(&m->layers[l], c);
    }
    for (int i = 0; i < p->n_shards; i++) eg_st_advise(p->shards[i], MADV_NORMAL);
    return EG_OK;
fail:
    eg_model_free(m);
    return st;
}

/* ---- element access ---- */

float eg_weight_get(const eg_weight *w, int64_t r, int64_t c) {
    const char *d = w->data;
    int64_t i = r * w->cols + c;
    switch (w->fmt) {
    case EG_W_F32: {
        float f;
        memcpy(&f, d + 4 * i, 4);
        return f;
    }
    case EG_W_BF16: {
        uint16_t h;
        memcpy(&h, d + 2 * i, 2);
        return eg_bf16_to_f32(h);
    }
    case EG_W_F16: {
        uint16_t h;
        memcpy(&h, d + 2 * i, 2);
        return eg_f16_to_f32(h);
    }
    case EG_W_INT4: {
        uint32_t word;
        memcpy(&word, d + 4 * (r * (w->cols / 8) + c / 8), 4);
        int v = (int)((word >> (4 * (c % 8))) & 15u) - 8;
        uint16_t s;
        memcpy(&s, (const char *)w->scale + 2 * (r * (w->cols / w->group) + c / w->group), 2);
        return (float)v * eg_bf16_to_f32(s);
    }
    case EG_W_FP8: {
        int64_t sc = (w->cols + 127) / 128;
        float s;
        memcpy(&s, (const char *)w->scale + 4 * ((r / 128) * sc + c / 128), 4);
        return eg_fp8e4m3_to_f32((uint8_t)d[i]) * s;
    }
    case EG_W_NONE: break;
    }
    return 0.0f;
}

void eg_weight_row(const eg_weight *w, int64_t r, float *out) {
    if (w->fmt == EG_W_INT4) {
        const int64_t nw = w->cols / 8, ng = w->cols / w->group;
        const char *row = (const char *)w->data + 4 * r * nw;
        const char *srow = (const char *)w->scale + 2 * r * ng;
        for (int64_t j = 0; j < nw; j++) {
            uint32_t word;
            memcpy(&word, row + 4 * j, 4);
            for (int i = 0; i < 8; i++) {
                int64_t c = 8 * j + i;
                uint16_t s;
                memcpy(&s, srow + 2 * (c / w->group), 2);
                out[c] = (float)((int)((word >> (4 * i)) & 15u) - 8) * eg_bf16_to_f32(s);
            }
        }
        return;
    }
    for (int64_t c = 0; c < w->cols; c++) out[c] = eg_weight_get(w, r, c);
}

eg_status eg_weight_rows(const eg_weight *w, int64_t r0, int64_t r1, eg_weight *out, eg_error *err) {
    const char *name = w->name ? w->name : "weight";
    if (r0 < 0 || r1 > w->rows || r0 >= r1)
        return eg_fail(err, EG_ERR_INVALID, "%s: rows [%lld, %lld) of %lld", name, (long long)r0, (long long)r1,
                       (long long)w->rows);
    *out = *w;
    out->rows = r1 - r0;
    out->owned = 0;
    const char *d = w->data;
    switch (w->fmt) {
    case EG_W_F32: out->data = d + 4 * r0 * w->cols; return EG_OK;
    case EG_W_BF16:
    case EG_W_F16: out->data = d + 2 * r0 * w->cols; return EG_OK;
    case EG_W_INT4:
        out->data = d + 4 * r0 * (w->cols / 8);
        out->scale = (const char *)w->scale + 2 * r0 * (w->cols / w->group);
        return EG_OK;
    case EG_W_FP8:
        if (r0 % 128 || (r1 % 128 && r1 != w->rows))
            return eg_fail(err, EG_ERR_UNSUPPORTED, "%s: FP8 rows [%lld, %lld) do not start and end on its 128-row "
                           "scale blocks", name, (long long)r0, (long long)r1);
        out->data = d + r0 * w->cols;
        out->scale = (const char *)w->scale + 4 * (r0 / 128) * ((w->cols + 127) / 128);
        return EG_OK;
    case EG_W_NONE: break;
    }
    return eg_fail(err, EG_ERR_INVALID, "%s: absent, no rows to view", name);
}

int64_t eg_weight_bytes(const eg_weight *w) {
    switch (w->fmt) {
    case EG_W_F32: return 4 * w->rows * w->cols;
    case EG_W_BF16:
    case EG_W_F16: return 2 * w->rows * w->cols;
    case EG_W_INT4: return w->rows * (w->cols / 8) * 4 + w->rows * (w->cols / w->group) * 2 + 8;
    case EG_W_FP8:
        return w->rows * w->cols + 4 * ((w->rows + 127) / 128) * ((w->cols + 127) / 128);
    case EG_W_NONE: break;
    }
    return 0;
}
