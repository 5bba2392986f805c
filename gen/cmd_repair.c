/* eaglegen repair — set damaged shards of a dataset aside so a rerun regenerates them.
 *
 * For every manifest of DIR (manifest.json and each manifest.w{I}of{N}.json), each listed
 * shard is checked as a resume checks it (dataset/shardcheck.h: present, size, SHA-256,
 * index), always hashing (no stamps). A damaged shard is renamed into DIR/quarantine/ (never deleted), taken out of
 * the manifest (its samples, tokens and bytes leave the totals, its samples leave the
 * "generated" count, and the loss-token histogram is recounted from the shards that
 * remain), and logged with its sample ids (when its index is still readable) in
 * DIR/quarantine/repair.jsonl (each line before its shard moves, so a kill in between
 * leaves the shard in place for the next repair). A sample is done when a committed shard holds its id, so
 * rerunning the job's generate command then makes exactly the samples of the shards set
 * aside; seeds depend only on (--seed, id), so they come out as they were. A repaired
 * job's state becomes "repaired" (not complete), so `merge` refuses it until that rerun. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/eg_thread.h"
#include "dataset/idset.h"
#include "dataset/manifest.h"
#include "dataset/reader.h"
#include "dataset/shardcheck.h"
#include "gen/args.h"
#include "gen/commands.h"

#define QUARANTINE "quarantine"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen repair DIR [--dry-run] [--threads N]\n"
            "\n"
            "Checks every shard each manifest of DIR lists (present, size, SHA-256, index), as a\n"
            "resume does, but hashing every shard (a resume skips those unchanged since they were\n"
            "hashed). Damaged shards are moved into DIR/" QUARANTINE "/ (never deleted) and taken\n"
            "out of their manifest (totals, generated count, loss-token histogram recounted from the\n"
            "shards that remain); DIR/" QUARANTINE "/repair.jsonl lists them with their sample ids.\n"
            "Rerun the job's `eaglegen generate` command afterwards: it makes exactly the samples\n"
            "that were set aside, identical to the lost ones (until then the job's state is\n"
            "\"repaired\", which merge refuses). Exit 0 when nothing was damaged or\n"
            "everything damaged was set aside, 1 on an error.\n"
            "\n"
            "options:\n"
            "  --dry-run     report what would be set aside; change nothing\n"
            "  --threads N   shards checked at once (default: all cores)\n"
            "  -h, --help    this text\n");
}

typedef struct {
    const char *dir;
    const eg_ds_info *info;
    const eg_ds_shard_check *ck;
    pthread_mutex_t mu;
    uint64_t *hist;
    int64_t hist_len;
    eg_status st;
    char msg[sizeof ((eg_error *)0)->msg];
} hist_ctx;

/* Recount one good shard's loss-masked token ids into the shared histogram. */
static void hist_range(void *vc, int64_t b, int64_t e, int tid) {
    (void)tid;
    hist_ctx *c = vc;
    for (int64_t i = b; i < e; i++) {
        if (c->ck[i].state != EG_DS_SHARD_OK) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", c->dir, c->info->shards[i].file);
        eg_error err = {0};
        eg_ds_reader *r = NULL;
        eg_status st = dataset_open(p, &r, &err);
        uint64_t *h = NULL;
        int64_t hl = 0;
        for (int64_t k = 0; !st && k < (r ? dataset_num_samples(r) : 0); k++) {
            eg_ds_sample s = {0};
            if ((st = dataset_read(r, k, 0, &s, &err))) break;
            for (int64_t t = 0; t < s.T && !st; t++) {
                if (!s.loss_mask[t]) continue;
                int64_t id = s.input_ids[t];
                if (id >= hl) {
                    int64_t nl = id + 1 > 2 * hl ? id + 1 : 2 * hl;
                    uint64_t *q = realloc(h, sizeof *q * (size_t)nl);
                    if (!q) { st = eg_fail(&err, EG_ERR_NOMEM, "out of memory (histogram)"); break; }
                    memset(q + hl, 0, sizeof *q * (size_t)(nl - hl));
                    h = q;
                    hl = nl;
                }
                h[id]++;
            }
            eg_ds_sample_clear(&s);
        }
        dataset_close(r);
        pthread_mutex_lock(&c->mu);
        if (st && !c->st) {
            c->st = st;
            snprintf(c->msg, sizeof c->msg, "%s", err.msg);
        }
        if (!st && !c->st) {
            eg_error e2 = {0};
            if (eg_ds_hist_add(&c->hist, &c->hist_len, h, hl, &e2)) {
                c->st = EG_ERR_NOMEM;
                snprintf(c->msg, sizeof c->msg, "%s", e2.msg);
            }
        }
        pthread_mutex_unlock(&c->mu);
        free(h);
    }
}

/* Where FILE goes: DIR/quarantine/FILE, or FILE.1, FILE.2, ... when taken (the directory
 * is made). */
static eg_status aside_name(const char *dir, const char *file, char *dst, size_t cap, eg_error *err) {
    char q[4096];
    snprintf(q, sizeof q, "%s/" QUARANTINE, dir);
    if (mkdir(q, 0755) && errno != EEXIST) return eg_fail(err, EG_ERR_IO, "mkdir %s: %s", q, strerror(errno));
    for (int k = 0; k < 1000000; k++) {
        int n = k ? snprintf(dst, cap, "%.2000s/%.2000s.%d", q, file, k) : snprintf(dst, cap, "%.2000s/%.2000s", q, file);
        if (n < 0 || (size_t)n >= cap) return eg_fail(err, EG_ERR_IO, "%s/%s: path too long", q, file);
        if (access(dst, F_OK)) return EG_OK;
    }
    return eg_fail(err, EG_ERR_IO, "%s: no free name", q);
}

/* Rename DIR/FILE to dst (from aside_name) and make the move durable. */
static eg_status set_aside(const char *dir, const char *file, const char *dst, eg_error *err) {
    char src[4096], q[4096];
    snprintf(src, sizeof src, "%s/%s", dir, file);
    if (rename(src, dst)) return eg_fail(err, EG_ERR_IO, "rename %s -> %s: %s", src, dst, strerror(errno));
    snprintf(q, sizeof q, "%s/" QUARANTINE, dir);
    eg_status st = eg_ds_fsync_dir(q, err);
    return st ? st : eg_ds_fsync_dir(dir, err);
}

/* Set "state" to "repaired" in job and, for a merged manifest's job, in every job its
 * "merged_from" lists, down to the generate jobs (merge checks those: it refuses any not
 * "complete"; a merged job has no state of its own, so a repaired merge passed as whole).
 * *marked counts the states set; -1 when out of memory. */
static int mark_repaired(json_t *job, int depth, int *marked) {
    if (!json_is_object(job) || depth > 64) return 0;
    if (json_is_string(json_object_get(job, "state"))) {
        if (json_object_set_new(job, "state", json_string("repaired"))) return -1;
        (*marked)++;
    }
    json_t *from = json_object_get(job, "merged_from"), *e;
    size_t i;
    json_array_foreach(from, i, e) {
        if (mark_repaired(json_object_get(e, "job"), depth + 1, marked)) return -1;
    }
    return 0;
}

static eg_status log_line(const char *dir, json_t *line, eg_error *err) {
    char p[4096];
    snprintf(p, sizeof p, "%s/" QUARANTINE, dir); /* a missing shard moves nothing: no aside_name made it */
    if (mkdir(p, 0755) && errno != EEXIST) return eg_fail(err, EG_ERR_IO, "mkdir %s: %s", p, strerror(errno));
    snprintf(p, sizeof p, "%s/" QUARANTINE "/repair.jsonl", dir);
    char *s = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    if (!s) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    FILE *f = fopen(p, "a");
    int bad = !f || fprintf(f, "%s\n", s) < 0 || fflush(f) || fsync(fileno(f));
    if (f && fclose(f)) bad = 1;
    free(s);
    return bad ? eg_fail(err, EG_ERR_IO, "%s: %s", p, strerror(errno)) : EG_OK;
}

/* Repair one manifest. *n_damaged = shards set aside (or that would be, dry run), not
 * counting those already in seen (a merged manifest.json lists the workers' shards too);
 * seen gains the damaged ones. */
static eg_status repair_manifest(const char *dir, const char *name, int dry, int threads, eg_ds_idset *seen,
                                 int *n_damaged, int64_t *n_samples, eg_error *err) {
    char p[4096];
    snprintf(p, sizeof p, "%s/.lock.%s", dir, name);
    int lock = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", p, strerror(errno));
    if (flock(lock, LOCK_EX | LOCK_NB)) {
        close(lock);
        return eg_fail(err, EG_ERR_IO, "%s: a writer is using %s now (stop it first)", dir, name);
    }
    eg_ds_info info = {0};
    eg_ds_shard_check *ck = NULL;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    eg_status st = eg_ds_info_load(p, &info, err);
    int n_bad = 0;
    if (!st && info.n_shards > 0 && !(ck = eg_calloc((size_t)info.n_shards, sizeof *ck, err))) st = EG_ERR_NOMEM;
    if (!st) st = eg_ds_check_shards(dir, &info, threads, NULL, ck, &n_bad, err); /* always hash */
    *n_damaged = 0;
    *n_samples = 0;
    for (int i = 0; !st && i < info.n_shards; i++) {
        if (ck[i].state == EG_DS_SHARD_OK) continue;
        if (eg_ds_idset_get(seen, info.shards[i].file, NULL)) {
            /* set aside (or found) through an earlier manifest: drop it here too, quietly */
            ck[i].state = EG_DS_SHARD_MISSING;
            snprintf(ck[i].why, sizeof ck[i].why, "listed by another manifest, already handled");
            printf("%s: %s: the same shard (%s)\n", name, info.shards[i].file,
                   dry ? "would be dropped from this manifest too" : "dropped from this manifest too");
            continue;
        }
        (*n_damaged)++;
        *n_samples += info.shards[i].samples;
        printf("%s: %s: %s (%s)%s\n", name, info.shards[i].file, eg_ds_shard_state_name(ck[i].state), ck[i].why,
               dry ? "" : ck[i].state == EG_DS_SHARD_MISSING ? "; dropped from the manifest" : "; set aside");
        if (!st) st = eg_ds_idset_put(seen, info.shards[i].file, 0, err);
    }
    if (st || !n_bad || dry) goto done;
    /* the histogram of what remains, before anything moves */
    hist_ctx hc = {.dir = dir, .info = &info, .ck = ck};
    pthread_mutex_init(&hc.mu, NULL);
    {
        int nt = threads > 0 ? threads : eg_num_threads();
        if (nt > info.n_shards) nt = info.n_shards;
        eg_pool *pool = NULL;
        if (nt > 1 && (st = eg_pool_create(nt, &pool, err))) goto hist_done;
        eg_pool_for(pool, info.n_shards, 1, hist_range, &hc);
        eg_pool_free(pool);
        if (hc.st) st = eg_fail(err, hc.st, "recounting the histogram: %s", hc.msg);
    }
hist_done:
    pthread_mutex_destroy(&hc.mu);
    if (st) { free(hc.hist); goto done; }
    /* move the damaged shards aside, logging each, then the manifest without them */
    time_t now = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    int kept = 0;
    for (int i = 0; i < info.n_shards && !st; i++) {
        eg_ds_shard_info *s = &info.shards[i];
        if (ck[i].state == EG_DS_SHARD_OK) {
            if (kept != i) {
                info.shards[kept] = *s;
                memset(s, 0, sizeof *s);
            }
            kept++;
            continue;
        }
        if (!strcmp(ck[i].why, "listed by another manifest, already handled")) {
            info.counts[EG_DS_COUNT_GENERATED] -= s->samples;
            if (info.counts[EG_DS_COUNT_GENERATED] < 0) info.counts[EG_DS_COUNT_GENERATED] = 0;
            free(s->file);
            memset(s, 0, sizeof *s);
            continue;
        }
        json_t *ids = json_null();
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/%s", dir, s->file);
        eg_ds_trailer tr;
        eg_ds_index ix;
        uint64_t size;
        eg_error e2 = {0};
        if (ck[i].state != EG_DS_SHARD_MISSING && !eg_ds_shard_load_index(sp, &tr, &ix, &size, &e2)) {
            ids = json_array();
            for (uint64_t k = 0; k < ix.n; k++) json_array_append_new(ids, json_string(ix.e[k].id));
            eg_ds_index_clear(&ix);
        }
        /* the line (with the ids, read from the shard in place) is written before the shard
           moves: killed between the two, the next repair finds the shard still damaged where it
           was and logs it again; the other order left a shard in quarantine whose ids only the
           lost line knew (the rerun saw it missing: ids null) */
        char dst[4096] = "";
        if (ck[i].state != EG_DS_SHARD_MISSING) st = aside_name(dir, s->file, dst, sizeof dst, err);
        json_t *line = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s?, s:I, s:o}", "time", ts, "manifest", name, "shard",
                                 s->file, "state", eg_ds_shard_state_name(ck[i].state), "why", ck[i].why,
                                 "moved_to", dst[0] ? dst : NULL, "samples", (json_int_t)s->samples, "ids", ids);
        if (!line && !st) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        if (!st) st = log_line(dir, line, err);
        json_decref(line);
        if (!st && dst[0]) st = set_aside(dir, s->file, dst, err);
        info.counts[EG_DS_COUNT_GENERATED] -= s->samples;
        if (info.counts[EG_DS_COUNT_GENERATED] < 0) info.counts[EG_DS_COUNT_GENERATED] = 0;
        free(s->file);
        memset(s, 0, sizeof *s);
    }
    if (!st && info.job_json) {
        /* a job that said "complete" no longer is: merge refuses it until a rerun has made
         * the samples set aside again (and set its state anew) */
        json_t *job = json_loads(info.job_json, 0, NULL);
        int marked = 0;
        if (mark_repaired(job, 0, &marked)) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
        else if (marked) {
            char *t = json_dumps(job, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (!t) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
            else {
                free(info.job_json);
                info.job_json = t;
            }
        }
        json_decref(job);
    }
    if (!st) {
        /* shards not moved (an error above) stay listed: compact what is left */
        info.n_shards = kept;
        free(info.hist);
        info.hist = hc.hist;
        info.hist_len = hc.hist_len;
        st = eg_ds_info_save(&info, dir, name, err);
    } else free(hc.hist);
done:
    free(ck);
    eg_ds_info_clear(&info);
    close(lock);
    return st;
}

int cmd_repair(int argc, char **argv) {
    int dry = 0, threads = 0;
    static const struct option opts[] = {
        {"dry-run", 0, 0, 'n'}, {"threads", 1, 0, 't'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    optind = 1;
    int ch;
    while ((ch = gen_getopt(argc, argv, "repair", "h", opts)) != -1) {
        switch (ch) {
        case 'n': dry = 1; break;
        case 't': if (!gen_arg_int("repair", "--threads", optarg, 1, 4096, &threads)) return 2; break;
        case 'h': usage(stdout); return 0;
        default: return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "eaglegen repair: %s (usage: eaglegen repair DIR [--dry-run] [--threads N])\n",
                optind >= argc ? "missing the dataset DIR" : "one DIR at a time");
        return 2;
    }
    const char *dir = argv[optind];
    eg_error err = {0};
    /* every manifest: a merged manifest.json and the workers' own */
    char **a = NULL, **b = NULL;
    int na = 0, nb = 0;
    if (eg_ds_find_manifests(dir, 0, &a, &na, &err)) {
        fprintf(stderr, "eaglegen repair: %s\n", err.msg);
        return 1;
    }
    if (eg_ds_find_manifests(dir, 1, &b, &nb, &err)) nb = 0;
    int rc = 0, total = 0;
    int64_t samples = 0;
    eg_ds_idset seen = {0};
    for (int pass = 0; pass < 2 && !rc; pass++) {
        char **names = pass ? b : a;
        int n = pass ? nb : na;
        for (int i = 0; i < n && !rc; i++) {
            int dup = 0;
            for (int k = 0; pass && k < na; k++) dup |= !strcmp(a[k], names[i]);
            if (dup) continue;
            int nd = 0;
            int64_t ns = 0;
            if (repair_manifest(dir, names[i], dry, threads, &seen, &nd, &ns, &err)) {
                fprintf(stderr, "eaglegen repair: %s\n", err.msg);
                rc = 1;
            }
            total += nd;
            samples += ns;
        }
    }
    eg_ds_free_names(a, na);
    eg_ds_free_names(b, nb);
    eg_ds_idset_clear(&seen);
    if (!rc) {
        if (!total) printf("repair: every shard of %s is intact; nothing to do\n", dir);
        else if (dry) printf("repair: %d damaged shard%s (%lld samples) would be set aside (--dry-run: nothing changed)\n",
                             total, total == 1 ? "" : "s", (long long)samples);
        else printf("repair: %d damaged shard%s set aside in %s/" QUARANTINE "/ (%lld samples); rerun the job's "
                    "generate command to make them again\n", total, total == 1 ? "" : "s", dir, (long long)samples);
    }
    return rc;
}
