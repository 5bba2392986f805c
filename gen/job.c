/* Job directory: parameters, fingerprints, the rejects ledger; see job.h. */
#include "gen/job.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/eg_hash.h"
#include "dataset/manifest.h"
#include "prompts/corpus.h"

void gen_job_filename(char *out, size_t n, const char *base, const char *ext, int worker, int n_workers) {
    if (n_workers > 1) snprintf(out, n, "%s.w%dof%d.%s", base, worker, n_workers, ext);
    else snprintf(out, n, "%s.%s", base, ext);
}

int gen_job_file_worker(const char *name, int *worker, int *n_workers) {
    int a, b;
    char exact[128];
    if (sscanf(name, "job.w%dof%d.json", &a, &b) != 2 || b < 2 || a < 0 || a >= b) return 0;
    gen_job_filename(exact, sizeof exact, "job", "json", a, b);
    if (strcmp(exact, name)) return 0; /* "job.w01of2.json", "job.w1of2.json~" */
    *worker = a;
    *n_workers = b;
    return 1;
}

eg_status gen_file_fingerprint(const char *path, json_t **out, eg_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb)) { fclose(f); return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno)); }
    enum { MIB = 1 << 20 };
    uint8_t *buf = malloc(MIB);
    if (!buf) { fclose(f); return eg_fail(err, EG_ERR_NOMEM, "out of memory"); }
    eg_sha256 c;
    eg_sha256_init(&c);
    size_t n = fread(buf, 1, MIB, f);
    eg_sha256_update(&c, buf, n);
    if (sb.st_size > 2 * MIB) {
        if (fseeko(f, sb.st_size - MIB, SEEK_SET) == 0) {
            n = fread(buf, 1, MIB, f);
            eg_sha256_update(&c, buf, n);
        }
    } else if (sb.st_size > MIB) {
        n = fread(buf, 1, MIB, f);
        eg_sha256_update(&c, buf, n);
    }
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return eg_fail(err, EG_ERR_IO, "%s: read error", path);
    uint8_t d[32];
    char hex[65];
    eg_sha256_final(&c, d);
    eg_sha256_to_hex(d, hex);
    /* a path that is not valid UTF-8 is stored escaped (the same escape every run, so a
     * resume still matches) */
    char *name = eg_utf8_escape(path);
    if (!name) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    *out = json_pack("{s:s, s:I, s:s}", "path", name, "size", (json_int_t)sb.st_size, "sha256_head_tail", hex);
    free(name);
    return *out ? EG_OK : eg_fail(err, EG_ERR_INVALID, "%s: cannot record the input's fingerprint as JSON", path);
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

eg_status gen_weights_fingerprint(const char *dir, json_t **out, eg_error *err) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return eg_fail(err, EG_ERR_IO, "%s: cannot list the directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    int oom = 0;
    eg_status st = EG_OK;
    while (!oom && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors")) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(names, sizeof *names * cap);
            if (!nn) { oom = 1; break; }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) oom = 1;
        else n++;
    }
    closedir(d);
    if (oom) st = eg_fail(err, EG_ERR_NOMEM, "out of memory listing %s", dir);
    if (n) qsort(names, n, sizeof *names, name_cmp);
    json_t *weights = json_array();
    if (!weights && !st) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    char path[4096];
    for (size_t i = 0; i < n && !st; i++) {
        json_t *fp = NULL;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!(st = gen_file_fingerprint(path, &fp, err))) {
            json_object_set_new(fp, "path", json_string(names[i])); /* the name, not where the directory is */
            json_array_append_new(weights, fp);
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!st && !json_array_size(weights)) st = eg_fail(err, EG_ERR_CONFIG, "%s: no .safetensors file", dir);
    if (st) {
        json_decref(weights);
        return st;
    }
    *out = weights;
    return EG_OK;
}

/* Append "key: old -> new" lines for every difference between a and b. */
static void diff(const char *prefix, json_t *a, json_t *b, char *out, size_t cap, int *count) {
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        char key[512];
        json_object_foreach(a, k, v) {
            snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", k);
            diff(key, v, json_object_get(b, k), out, cap, count);
        }
        json_object_foreach(b, k, v) {
            if (json_object_get(a, k)) continue;
            snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", k);
            diff(key, NULL, v, out, cap, count);
        }
        return;
    }
    if (a && b && json_equal(a, b)) return;
    char *sa = a ? json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    char *sb = b ? json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    size_t len = strlen(out);
    if (len < cap)
        snprintf(out + len, cap - len, "\n  %s: %.200s -> %.200s", prefix, sa ? sa : "(absent)", sb ? sb : "(absent)");
    free(sa);
    free(sb);
    (*count)++;
}

/* Copy of have with what may legitimately change between runs taken from want: the
 * --on-bad-record policy (it changes no sample) and an input's spelling when both
 * spellings name the same file. */
static json_t *normalized(json_t *have, json_t *want) {
    json_t *h = json_deep_copy(have);
    if (!h) return NULL;
    json_t *hp = json_object_get(h, "params"), *wp = json_object_get(want, "params");
    json_t *wb = json_object_get(wp, "on_bad_record");
    if (json_is_object(hp) && json_object_get(hp, "on_bad_record") && wb)
        json_object_set(hp, "on_bad_record", wb);
    json_t *hi = json_object_get(json_object_get(h, "fingerprints"), "inputs");
    json_t *wi = json_object_get(json_object_get(want, "fingerprints"), "inputs");
    if (json_is_array(hi) && json_is_array(wi) && json_array_size(hi) == json_array_size(wi)) {
        for (size_t i = 0; i < json_array_size(hi); i++) {
            json_t *hv = json_object_get(json_array_get(hi, i), "path");
            json_t *wv = json_object_get(json_array_get(wi, i), "path");
            const char *a = json_string_value(hv), *b = json_string_value(wv);
            if (!a || !b || !strcmp(a, b) || !strcmp(a, "-") || !strcmp(b, "-")) continue;
            char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
            if (ra && rb && !strcmp(ra, rb)) json_object_set(json_array_get(hi, i), "path", wv);
            free(ra);
            free(rb);
        }
    }
    return h;
}

eg_status gen_job_read(const char *dir, const char *name, json_t **have, eg_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *have = NULL;
    if (access(path, F_OK) != 0) return EG_OK;
    json_error_t je;
    FILE *f = fopen(path, "rb");
    if (!f) return eg_fail(err, EG_ERR_IO, "%s: cannot read the job file: %s", path, strerror(errno));
    *have = json_loadf(f, 0, &je);
    int read_failed = ferror(f), e = errno;
    fclose(f);
    if (!*have && read_failed) return eg_fail(err, EG_ERR_IO, "%s: cannot read the job file: %s", path, strerror(e));
    if (!*have) return eg_fail(err, EG_ERR_FORMAT, "%s:%d: %s (the job file is damaged)", path, je.line, je.text);
    return EG_OK;
}

eg_status gen_job_check(const char *dir, const char *name, json_t *want, int *existed, int *changed, eg_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *existed = 0;
    *changed = 0;
    json_t *have;
    eg_status rs = gen_job_read(dir, name, &have, err);
    if (rs || !have) return rs;
    *existed = 1;
    json_t *norm = normalized(have, want);
    if (!norm) { json_decref(have); return eg_fail(err, EG_ERR_NOMEM, "out of memory"); }
    char msg[900] = "";
    int count = 0;
    diff("", norm, want, msg, sizeof msg, &count);
    json_decref(norm);
    *changed = !json_equal(have, want);
    json_decref(have);
    if (count)
        return eg_fail(err, EG_ERR_CONFIG,
                       "%s was made with different parameters; refusing to resume (%d difference%s, old -> new):%s\n"
                       "Use the original command, or a new --out directory.",
                       path, count, count > 1 ? "s" : "", msg);
    return EG_OK;
}

eg_status gen_job_write(const char *dir, const char *name, json_t *want, eg_error *err) {
    char *text = json_dumps(want, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    size_t n = strlen(text);
    text[n] = '\n';
    eg_status st = eg_ds_write_atomic(dir, name, text, n + 1, err);
    free(text);
    return st;
}

/* ---- ledger ---------------------------------------------------------------- */

/* One ledger line that names a record (not a "cleared" line). */
typedef struct ledger_entry {
    uint64_t index;
    uint64_t hash;    /* gen_line_hash of the record's line, if has_hash */
    uint64_t seq;     /* line order in the file, then append order */
    uint8_t outcome;  /* gen_outcome */
    uint8_t has_hash; /* 0: a line from before line hashes were logged */
    uint8_t live;     /* 0: cleared by a later "cleared" line */
} ledger_entry;

struct gen_ledger {
    FILE *f;
    char path[4096];
    ledger_entry *e; /* [0, n_sorted) sorted by (index, seq) after load; then appended */
    size_t n, cap;
    size_t n_sorted;
    uint64_t seq;
    int64_t counts[GEN_NOUTCOMES];
};

static const char *const outcome_names[GEN_NOUTCOMES] = {"rejected", "dropped", "duplicate"};
static const char cleared_name[] = "cleared";

uint64_t gen_line_hash(const char *raw, size_t n) {
    uint8_t d[32];
    eg_sha256 c;
    eg_sha256_init(&c);
    eg_sha256_update(&c, raw ? raw : "", raw ? n : 0);
    eg_sha256_final(&c, d);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h = h << 8 | d[i];
    return h;
}

static int cmp_entry(const void *a, const void *b) {
    const ledger_entry *x = a, *y = b;
    if (x->index != y->index) return x->index < y->index ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static eg_status push(gen_ledger *l, ledger_entry en, eg_error *err) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 256;
        ledger_entry *p = realloc(l->e, nc * sizeof *p);
        if (!p) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        l->e = p;
        l->cap = nc;
    }
    en.seq = l->seq++;
    l->e[l->n++] = en;
    return EG_OK;
}

/* The live entry for index, or NULL. At most one is live per index: an index is logged
 * again only after its entry was cleared. */
static ledger_entry *find_live(const gen_ledger *l, uint64_t index) {
    size_t lo = 0, hi = l->n_sorted;
    while (lo < hi) { /* the first sorted entry with an index >= index */
        size_t mid = lo + (hi - lo) / 2;
        if (l->e[mid].index < index) lo = mid + 1;
        else hi = mid;
    }
    for (size_t i = lo; i < l->n_sorted && l->e[i].index == index; i++)
        if (l->e[i].live) return &l->e[i];
    for (size_t i = l->n_sorted; i < l->n; i++)
        if (l->e[i].index == index && l->e[i].live) return &l->e[i];
    return NULL;
}

static int parse_hash(const char *s, uint64_t *h) {
    if (!s || strlen(s) != 16) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int c = s[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v << 4 | (uint64_t)d;
    }
    *h = v;
    return 1;
}

eg_status gen_ledger_open(const char *dir, const char *name, gen_ledger **out, eg_error *err) {
    *out = NULL;
    gen_ledger *l = eg_calloc(1, sizeof *l, err);
    if (!l) return EG_ERR_NOMEM;
    snprintf(l->path, sizeof l->path, "%s/%s", dir, name);
    FILE *r = fopen(l->path, "r");
    off_t good = 0;
    /* "cleared" lines, applied after the sort: [n_clear] (index, seq) */
    ledger_entry *clr = NULL;
    size_t n_clr = 0, cap_clr = 0;
    if (r) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        uint64_t lineno = 0;
        while ((len = getline(&line, &cap, r)) > 0) {
            lineno++;
            if (line[len - 1] != '\n') break; /* torn by a crash: only the last line can be */
            json_t *j = json_loadb(line, (size_t)len, 0, NULL);
            json_t *ix = j ? json_object_get(j, "index") : NULL;
            const char *oc = j ? json_string_value(json_object_get(j, "outcome")) : NULL;
            json_t *hv = j ? json_object_get(j, "line_hash") : NULL;
            int o = 0;
            while (oc && o < GEN_NOUTCOMES && strcmp(oc, outcome_names[o])) o++;
            int clear = oc && o == GEN_NOUTCOMES && !strcmp(oc, cleared_name);
            ledger_entry en = {.outcome = (uint8_t)o, .live = 1};
            int bad_hash = hv && !parse_hash(json_string_value(hv), &en.hash);
            en.has_hash = hv && !bad_hash;
            if (!json_is_integer(ix) || json_integer_value(ix) < 0 || !oc || (o == GEN_NOUTCOMES && !clear) ||
                bad_hash) {
                json_decref(j);
                free(line);
                free(clr);
                fclose(r);
                eg_fail(err, EG_ERR_FORMAT,
                        "%s:%llu: damaged ledger line (want an object with an integer \"index\", an \"outcome\" "
                        "of rejected, dropped, duplicate or cleared, and a \"line_hash\" of 16 hex digits if any); "
                        "fix or remove the line",
                        l->path, (unsigned long long)lineno);
                gen_ledger_close(l);
                return EG_ERR_FORMAT;
            }
            en.index = (uint64_t)json_integer_value(ix);
            json_decref(j);
            eg_status st = EG_OK;
            if (clear) {
                if (n_clr == cap_clr) {
                    size_t nc = cap_clr ? 2 * cap_clr : 16;
                    ledger_entry *p = realloc(clr, nc * sizeof *p);
                    if (!p) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
                    else clr = p, cap_clr = nc;
                }
                if (!st) clr[n_clr++] = (ledger_entry){.index = en.index, .seq = l->seq++};
            } else {
                st = push(l, en, err);
            }
            if (st) { free(line); free(clr); fclose(r); gen_ledger_close(l); return st; }
            good += len;
        }
        free(line);
        fclose(r);
        if (truncate(l->path, good)) { /* drop a torn tail */
            eg_fail(err, EG_ERR_IO, "%s: %s", l->path, strerror(errno));
            free(clr);
            gen_ledger_close(l);
            return EG_ERR_IO;
        }
    }
    if (l->n > 0) qsort(l->e, l->n, sizeof *l->e, cmp_entry);
    l->n_sorted = l->n;
    /* a "cleared" line retires the entry of its index logged last before it */
    for (size_t c = 0; c < n_clr; c++) {
        ledger_entry *best = NULL;
        size_t lo = 0, hi = l->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (l->e[mid].index < clr[c].index) lo = mid + 1;
            else hi = mid;
        }
        for (size_t i = lo; i < l->n && l->e[i].index == clr[c].index && l->e[i].seq < clr[c].seq; i++) best = &l->e[i];
        if (best) best->live = 0;
    }
    free(clr);
    for (size_t i = 0; i < l->n; i++)
        if (l->e[i].live) l->counts[l->e[i].outcome]++;
    l->f = fopen(l->path, "a");
    if (!l->f) {
        eg_fail(err, EG_ERR_IO, "%s: %s", l->path, strerror(errno));
        gen_ledger_close(l);
        return EG_ERR_IO;
    }
    *out = l;
    return EG_OK;
}

void gen_ledger_close(gen_ledger *l) {
    if (!l) return;
    if (l->f) { fflush(l->f); fsync(fileno(l->f)); fclose(l->f); }
    free(l->e);
    free(l);
}

int gen_ledger_has(const gen_ledger *l, uint64_t index) { return find_live(l, index) != NULL; }

int gen_ledger_check(const gen_ledger *l, uint64_t index, uint64_t line_hash) {
    const ledger_entry *en = find_live(l, index);
    if (!en) return GEN_LEDGER_NONE;
    return en->has_hash && en->hash != line_hash ? GEN_LEDGER_CHANGED : GEN_LEDGER_SAME;
}

int64_t gen_ledger_count(const gen_ledger *l, gen_outcome o) { return l->counts[o]; }

/* Write one line: {index, outcome, file, line, id, reason[, line_hash][, raw]}. */
static eg_status write_line(gen_ledger *l, uint64_t index, const char *outcome, const char *file, uint64_t line,
                            const char *id, const char *reason, const uint64_t *line_hash, const char *raw,
                            eg_error *err) {
    char *sf = eg_utf8_escape(file ? file : ""), *si = eg_utf8_escape(id ? id : ""),
         *sr = eg_utf8_escape(reason ? reason : "");
    json_t *j = sf && si && sr ? json_pack("{s:I, s:s, s:s, s:I, s:s, s:s}", "index", (json_int_t)index, "outcome",
                                           outcome, "file", sf, "line", (json_int_t)line, "id", si, "reason", sr)
                               : NULL;
    free(sf);
    free(si);
    free(sr);
    if (!j) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    if (line_hash) {
        char hx[17];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)*line_hash);
        if (json_object_set_new(j, "line_hash", json_string(hx))) {
            json_decref(j);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        }
    }
    if (raw) {
        /* binary or mis-encoded lines can still be logged */
        char *safe = eg_utf8_escape(raw);
        json_t *rv = safe ? json_string(safe) : NULL;
        free(safe);
        if (!rv || json_object_set_new(j, "raw", rv)) { json_decref(j); return eg_fail(err, EG_ERR_NOMEM, "out of memory"); }
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(j);
    if (!s) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    int bad = fprintf(l->f, "%s\n", s) < 0 || fflush(l->f);
    free(s);
    if (bad) return eg_fail(err, EG_ERR_IO, "%s: %s", l->path, strerror(errno));
    return EG_OK;
}

eg_status gen_ledger_add(gen_ledger *l, uint64_t index, const char *file, uint64_t line, const char *id,
                         gen_outcome o, const char *reason, uint64_t line_hash, const char *raw, eg_error *err) {
    eg_status st = write_line(l, index, outcome_names[o], file, line, id, reason, &line_hash, raw, err);
    if (st) return st;
    l->counts[o]++;
    return push(l, (ledger_entry){.index = index, .hash = line_hash, .outcome = (uint8_t)o, .has_hash = 1, .live = 1},
                err);
}

eg_status gen_ledger_clear(gen_ledger *l, uint64_t index, const char *file, uint64_t line, const char *id,
                           uint64_t line_hash, eg_error *err) {
    ledger_entry *en = find_live(l, index);
    if (!en) return EG_OK;
    eg_status st = write_line(l, index, cleared_name, file, line, id,
                              "the record's line changed since it was logged; it is read again", &line_hash, NULL, err);
    if (st) return st;
    en->live = 0;
    l->counts[en->outcome]--;
    return EG_OK;
}

eg_status gen_ledger_sync(gen_ledger *l, eg_error *err) {
    if (fflush(l->f) || fsync(fileno(l->f))) return eg_fail(err, EG_ERR_IO, "%s: %s", l->path, strerror(errno));
    return EG_OK;
}

eg_status gen_job_inputs(const struct corpus_reader *r, json_t **out, eg_error *err) {
    json_t *inputs = json_array();
    if (!inputs) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < corpus_n_files(r); i++) {
        const char *p = corpus_file(r, i);
        json_t *fp = NULL;
        if (!strcmp(p, "-")) {
            fp = json_pack("{s:s}", "path", "-");
        } else if (corpus_is_pipe(r, i)) {
            /* a FIFO or <(zcat ...): hashing its head would eat the records the corpus
               reader is to get; it is known by its path, as stdin is */
            char *name = eg_utf8_escape(p);
            fp = name ? json_pack("{s:s, s:b}", "path", name, "pipe", 1) : NULL;
            free(name);
        } else if (gen_file_fingerprint(p, &fp, err)) {
            json_decref(inputs);
            return err->code;
        }
        if (!fp) {
            json_decref(inputs);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        }
        json_array_append_new(inputs, fp);
    }
    *out = inputs;
    return EG_OK;
}
