/* Shard writer and reader: round trip, random access, resume, crash safety (disk full,
 * free without close), corrupted shards, merge.
 *
 * Extra modes used by scripts (tests/t_dataset_*.sh, dataset/python/test_*.py):
 *   --loop DIR [N]   resume DIR and add deterministic samples loop-%06d forever (or N)
 *   --check DIR      verify every visible shard and every committed sample of DIR;
 *                    prints the committed sample count
 *   --fixture DIR    write a small dataset plus DIR/expect/ (raw tensors, metadata) for
 *                    the Python loader test
 *   --vocab-fixture DIR  a dataset with a known loss-masked histogram (t_dataset_cli.sh)
 *   --bench DIR [THREADS [SPLIT]]  writer throughput at Kimi-K2.5 hidden size */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/eg_common.h"
#include "dataset/format.h"
#include "dataset/manifest.h"
#include "dataset/reader.h"
#include "dataset/writer.h"
#include "tests/check.h"

#define N_AUX 3
#define HID 48
static const int aux_ids[N_AUX] = {1, 29, 57};

/* ---------------------------------------------------------------- sample factory */
typedef struct gen_sample {
    eg_ds_sample s;
    char id[64];
    float *aux_f, *fin_f;       /* F32 source (token-major) */
    uint16_t *aux_b, *fin_b;    /* expected BF16, token-major */
} gen_sample;

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}
static float rng_normal(uint64_t *x) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)(rng_next(x) >> 40) / (float)(1 << 24);
    return (s - 2.0f) * 1.7f;
}

/* Deterministic sample number k; mode: 0 f32, 1 bf16, 2 f32 layer-major. */
static void gen_make(gen_sample *g, const char *prefix, int k, int mode) {
    memset(g, 0, sizeof *g);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
    snprintf(g->id, sizeof g->id, "%s%06d", prefix, k);
    eg_ds_sample *s = &g->s;
    s->id = g->id;
    s->source_file = "prompts/test.jsonl";
    s->source_line = k + 1;
    int64_t T = 4 + (int64_t)(rng_next(&x) % 29);
    s->T = T;
    s->prompt_len = T / 2;
    s->gen_len = T - T / 2;
    s->finish = k % 3 == 0 ? EG_DS_FINISH_LENGTH : EG_DS_FINISH_STOP;
    s->temperature = 0.7;
    s->top_p = 0.95;
    s->top_k = 40;
    s->seed = 0xfedcba9876543210ull + (uint64_t)k;
    s->n_aux = N_AUX;
    s->H = HID;
    s->input_ids = malloc(sizeof(int32_t) * (size_t)T);
    s->loss_mask = malloc((size_t)T);
    for (int64_t t = 0; t < T; t++) {
        s->input_ids[t] = (int32_t)(rng_next(&x) % 500);
        s->loss_mask[t] = t >= s->prompt_len;
    }
    size_t na = (size_t)T * N_AUX * HID, nf = (size_t)T * HID;
    g->aux_f = malloc(na * 4);
    g->fin_f = malloc(nf * 4);
    g->aux_b = malloc(na * 2);
    g->fin_b = malloc(nf * 2);
    for (size_t i = 0; i < na; i++) {
        float v = rng_normal(&x) * (float)(1 + (i / HID) % N_AUX * 4);
        if (i % 97 == 5) v *= 40.0f; /* outlier channels, as real activations have */
        g->aux_f[i] = v;
        g->aux_b[i] = eg_f32_to_bf16(v);
    }
    for (size_t i = 0; i < nf; i++) {
        g->fin_f[i] = rng_normal(&x) * 0.8f;
        g->fin_b[i] = eg_f32_to_bf16(g->fin_f[i]);
    }
    s->hidden_dtype = mode == 1 ? EG_DS_BF16 : EG_DS_F32;
    if (mode == 1) {
        s->aux_hidden = g->aux_b;
        s->final_hidden = g->fin_b;
    } else if (mode == 2) {
        float *lm = malloc(na * 4); /* [n_aux][T][H] */
        for (int64_t t = 0; t < T; t++)
            for (int l = 0; l < N_AUX; l++)
                memcpy(lm + ((size_t)l * (size_t)T + (size_t)t) * HID, g->aux_f + ((size_t)t * N_AUX + (size_t)l) * HID, HID * 4);
        free(g->aux_f);
        g->aux_f = lm;
        s->aux_layer_major = 1;
        s->aux_hidden = g->aux_f;
        s->final_hidden = g->fin_f;
    } else {
        s->aux_hidden = g->aux_f;
        s->final_hidden = g->fin_f;
    }
}

static void gen_free(gen_sample *g) {
    free(g->s.input_ids);
    free(g->s.loss_mask);
    free(g->aux_f);
    free(g->fin_f);
    free(g->aux_b);
    free(g->fin_b);
}

/* Does a read sample equal generated sample k bit for bit? */
static int same_as(const eg_ds_sample *r, const char *prefix, int k, char *why, size_t n) {
    gen_sample g;
    gen_make(&g, prefix, k, 0);
    const eg_ds_sample *s = &g.s;
    int ok = 1;
#define NOPE(...) do { snprintf(why, n, __VA_ARGS__); ok = 0; goto out; } while (0)
    if (strcmp(r->id, s->id)) NOPE("id %s != %s", r->id, s->id);
    if (strcmp(r->source_file, s->source_file) || r->source_line != s->source_line) NOPE("source");
    if (r->T != s->T || r->n_aux != N_AUX || r->H != HID) NOPE("shape");
    if (r->prompt_len != s->prompt_len || r->gen_len != s->gen_len || r->finish != s->finish) NOPE("lengths");
    if (r->temperature != s->temperature || r->top_p != s->top_p || r->top_k != s->top_k || r->seed != s->seed) NOPE("sampling");
    if (memcmp(r->input_ids, s->input_ids, (size_t)s->T * 4)) NOPE("input_ids");
    if (memcmp(r->loss_mask, s->loss_mask, (size_t)s->T)) NOPE("loss_mask");
    if (memcmp(r->aux_hidden, g.aux_b, (size_t)s->T * N_AUX * HID * 2)) NOPE("aux_hidden");
    if (memcmp(r->final_hidden, g.fin_b, (size_t)s->T * HID * 2)) NOPE("final_hidden");
#undef NOPE
out:
    gen_free(&g);
    return ok;
}

static eg_shard_writer_opts base_opts(void) {
    eg_shard_writer_opts o = {0};
    o.model_name = "tiny-test";
    o.model_config_sha256 = "00c0ffee";
    o.tokenizer_sha256 = "0badf00d";
    o.chat_template = "kimi-k2.5";
    o.thinking = 1;
    o.n_aux = N_AUX;
    o.aux_layers = aux_ids;
    o.hidden_size = HID;
    o.target_vocab_size = 512;
    o.job_json = "{\"prompts\": \"test.jsonl\"}";
    o.shard_samples = 10;
    o.threads = 2;
    o.queue_depth = 3;
    return o;
}

static char tmpdir_buf[256];
static const char *fresh_dir(const char *name) {
    static int n;
    snprintf(tmpdir_buf, sizeof tmpdir_buf, "/tmp/eg_ds_test_%d_%s_%d", (int)getpid(), name, n++);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir_buf);
    if (system(cmd)) {}
    return tmpdir_buf;
}
static void rm_dir(const char *d) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    if (system(cmd)) {}
}

/* Write samples [from, to) with the given mode pattern; returns status of close. */
static eg_status write_range(const char *dir, eg_shard_writer_opts o, const char *prefix, int from, int to,
                             eg_error *err) {
    eg_shard_writer *w;
    eg_status st = shard_writer_open(dir, &o, &w, err);
    if (st) return st;
    for (int k = from; k < to && !st; k++) {
        gen_sample g;
        gen_make(&g, prefix, k, k % 3);
        st = shard_writer_add(w, &g.s, err);
        gen_free(&g);
        shard_writer_count(w, EG_DS_COUNT_GENERATED, 1);
    }
    if (!st) st = shard_writer_close(w, err);
    shard_writer_free(w);
    return st;
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (l >= sl && !strcmp(e->d_name + l - sl, suffix)) n++;
    }
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------- tests */
static void test_roundtrip(void) {
    eg_error err = {0};
    const char *dir = fresh_dir("rt");
    CHECK_OK(write_range(dir, base_opts(), "s", 0, 25, &err), &err);
    eg_ds_reader *r;
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (!r) return;
    CHECK(dataset_num_samples(r) == 25);
    CHECK(dataset_num_shards(r) == 3);
    const eg_ds_info *m = dataset_info(r);
    CHECK(m->n_aux == N_AUX && m->hidden_size == HID && m->aux_layers[1] == 29);
    CHECK(!strcmp(m->model_name, "tiny-test") && m->thinking == 1 && m->target_vocab_size == 512);
    CHECK(m->counts[EG_DS_COUNT_GENERATED] == 25);
    CHECK(strstr(m->job_json, "test.jsonl") != NULL);
    uint64_t hist[512] = {0};
    int64_t tokens = 0, loss = 0;
    for (int64_t i = 0; i < 25; i++) {
        eg_ds_sample s;
        CHECK_OK(dataset_read(r, i, 0, &s, &err), &err);
        char why[128] = "";
        CHECKF(same_as(&s, "s", (int)i, why, sizeof why), "sample %d: %s", (int)i, why);
        tokens += s.T;
        for (int64_t t = 0; t < s.T; t++)
            if (s.loss_mask[t]) { hist[s.input_ids[t]]++; loss++; }
        eg_ds_sample_clear(&s);
    }
    eg_ds_totals t = eg_ds_info_totals(m);
    CHECK(t.samples == 25 && t.tokens == tokens && t.loss_tokens == loss);
    CHECK(m->hist_len <= 512);
    for (int64_t i = 0; i < m->hist_len; i++) CHECKF(m->hist[i] == hist[i], "hist[%d]", (int)i);
    for (int s = 0; s < dataset_num_shards(r); s++) CHECK_OK(dataset_verify_shard(r, s, &err), &err);
    CHECK(count_files(dir, ".tmp") == 0);
    dataset_close(r);
    /* a single shard opens on its own */
    char p[512];
    snprintf(p, sizeof p, "%s/shard-000001.tar", dir);
    CHECK_OK(dataset_open(p, &r, &err), &err);
    if (r) {
        CHECK(dataset_num_samples(r) == 10);
        eg_ds_sample s;
        CHECK_OK(dataset_read(r, 3, 0, &s, &err), &err);
        char why[128] = "";
        CHECKF(same_as(&s, "s", 13, why, sizeof why), "%s", why);
        eg_ds_sample_clear(&s);
        dataset_close(r);
    }
    rm_dir(dir);
}

static void test_random_access_by_id(void) {
    eg_error err = {0};
    const char *dir = fresh_dir("id");
    eg_shard_writer_opts o = base_opts();
    o.shard_samples = 4;
    CHECK_OK(write_range(dir, o, "q", 0, 30, &err), &err);
    eg_ds_reader *r;
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (!r) return;
    uint64_t x = eg_test_seed() | 1;
    for (int n = 0; n < 40; n++) {
        int k = (int)(rng_next(&x) % 30);
        char id[32];
        snprintf(id, sizeof id, "q%06d", k);
        int64_t i = dataset_find(r, id);
        CHECKF(i >= 0, "id %s not found", id);
        if (i < 0) continue;
        eg_ds_sample s;
        CHECK_OK(dataset_read(r, i, 0, &s, &err), &err);
        char why[128] = "";
        CHECKF(same_as(&s, "q", k, why, sizeof why), "%s: %s", id, why);
        eg_ds_sample_clear(&s);
    }
    CHECK(dataset_find(r, "nope") == -1);
    eg_ds_sample s;
    CHECK(dataset_read(r, 30, 0, &s, &err) == EG_ERR_INVALID);
    dataset_close(r);
    rm_dir(dir);
}

static void test_resume(void) {
    eg_error err = {0};
    const char *dir = fresh_dir("resume");
    CHECK_OK(write_range(dir, base_opts(), "r", 0, 12, &err), &err);
    eg_shard_writer_opts o = base_opts();
    eg_shard_writer *w = NULL;
    CHECK(shard_writer_open(dir, &o, &w, &err) == EG_ERR_INVALID); /* exists, no resume */
    CHECK(strstr(err.msg, "already exists") != NULL);
    o.hidden_size = HID + 1;
    o.resume = 1;
    CHECK(shard_writer_open(dir, &o, &w, &err) == EG_ERR_CONFIG);
    CHECK(strstr(err.msg, "hidden size") != NULL);
    o = base_opts();
    o.resume = 1;
    CHECK_OK(shard_writer_open(dir, &o, &w, &err), &err);
    if (!w) return;
    eg_shard_writer *w2 = NULL;
    CHECK(shard_writer_open(dir, &o, &w2, &err) == EG_ERR_IO); /* locked */
    CHECK(shard_writer_has_id(w, "r000000") && shard_writer_has_id(w, "r000011"));
    CHECK(!shard_writer_has_id(w, "r000012"));
    CHECK(shard_writer_get_count(w, EG_DS_COUNT_GENERATED) == 12);
    gen_sample g;
    gen_make(&g, "r", 3, 0);
    CHECK(shard_writer_add(w, &g.s, &err) == EG_ERR_INVALID); /* duplicate id */
    gen_free(&g);
    for (int k = 12; k < 20; k++) {
        gen_make(&g, "r", k, k % 3);
        CHECK_OK(shard_writer_add(w, &g.s, &err), &err);
        gen_free(&g);
    }
    shard_writer_count(w, EG_DS_COUNT_SKIPPED, 12);
    CHECK_OK(shard_writer_close(w, &err), &err);
    eg_shard_writer_stats stt;
    shard_writer_stats(w, &stt);
    CHECK(stt.committed_samples == 20 && stt.added == 8 && stt.pending == 0);
    shard_writer_free(w);
    eg_ds_reader *r;
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (!r) return;
    CHECK(dataset_num_samples(r) == 20);
    CHECK(dataset_info(r)->counts[EG_DS_COUNT_SKIPPED] == 12);
    for (int64_t i = 0; i < 20; i++) {
        eg_ds_sample s;
        CHECK_OK(dataset_read(r, i, 0, &s, &err), &err);
        char why[128] = "";
        CHECKF(same_as(&s, "r", (int)i, why, sizeof why), "sample %d: %s", (int)i, why);
        eg_ds_sample_clear(&s);
    }
    dataset_close(r);
    rm_dir(dir);
}

/* Free without close = what a crash loses; the unfinished shard must not appear. */
static void test_free_without_close(void) {
    eg_error err = {0};
    const char *dir = fresh_dir("abandon");
    eg_shard_writer_opts o = base_opts();
    eg_shard_writer *w;
    CHECK_OK(shard_writer_open(dir, &o, &w, &err), &err);
    if (!w) return;
    for (int k = 0; k < 14; k++) {
        gen_sample g;
        gen_make(&g, "a", k, 0);
        CHECK_OK(shard_writer_add(w, &g.s, &err), &err);
        gen_free(&g);
    }
    shard_writer_free(w);
    CHECK(count_files(dir, ".tmp") == 0);
    eg_ds_reader *r;
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (r) {
        CHECK(dataset_num_samples(r) == 10); /* the first full shard was committed */
        dataset_close(r);
    }
    rm_dir(dir);
}

/* Disk full: a child writes under RLIMIT_FSIZE until a write fails. */
static void test_disk_full(void) {
    eg_error err = {0};
    for (int limit_kb = 14; limit_kb <= 26; limit_kb += 12) {
        const char *d = fresh_dir("full");
        char dir[256];
        snprintf(dir, sizeof dir, "%s", d);
        pid_t pid = fork();
        if (pid == 0) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {(rlim_t)limit_kb * 1024, (rlim_t)limit_kb * 1024};
            setrlimit(RLIMIT_FSIZE, &rl);
            eg_shard_writer_opts o = base_opts();
            o.shard_samples = 3;
            eg_shard_writer *w;
            eg_error e = {0};
            if (shard_writer_open(dir, &o, &w, &e)) _exit(3);
            eg_status st = EG_OK;
            for (int k = 0; k < 400 && !st; k++) {
                gen_sample g;
                gen_make(&g, "f", k, 0);
                st = shard_writer_add(w, &g.s, &e);
                gen_free(&g);
            }
            if (!st) st = shard_writer_close(w, &e);
            shard_writer_free(w);
            _exit(st == EG_ERR_IO ? 0 : 4); /* must have failed with an I/O error */
        }
        int ws = 0;
        waitpid(pid, &ws, 0);
        CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child status %d", ws);
        /* everything visible is valid */
        eg_ds_reader *r;
        CHECK_OK(dataset_open(dir, &r, &err), &err);
        int64_t n0 = 0;
        if (r) {
            n0 = dataset_num_samples(r);
            CHECKF(n0 % 3 == 0, "%d samples", (int)n0);
            fprintf(stderr, "    (file size limit %d KiB: %d samples committed before the write failed)\n", limit_kb, (int)n0);
            for (int64_t i = 0; i < n0; i++) {
                eg_ds_sample s;
                CHECK_OK(dataset_read(r, i, 0, &s, &err), &err);
                char why[128] = "";
                CHECKF(same_as(&s, "f", (int)i, why, sizeof why), "%s", why);
                eg_ds_sample_clear(&s);
            }
            dataset_close(r);
        }
        /* continue with room to spare */
        eg_shard_writer_opts o = base_opts();
        o.shard_samples = 3;
        o.resume = 1;
        CHECK_OK(write_range(dir, o, "f", (int)n0, (int)n0 + 7, &err), &err);
        CHECK(count_files(dir, ".tmp") == 0);
        CHECK_OK(dataset_open(dir, &r, &err), &err);
        if (r) {
            CHECK(dataset_num_samples(r) == n0 + 7);
            dataset_close(r);
        }
        rm_dir(dir);
    }
}

/* ---------------------------------------------------------------- corruption */
static char *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    if (fread(b, 1, *n, f) != *n) { free(b); b = NULL; }
    fclose(f);
    return b;
}
static void spit(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

/* Copy a tar, leaving out member `skip`, with libarchive. */
static void tar_without(const char *src, const char *dst, const char *skip) {
    struct archive *in = archive_read_new(), *out = archive_write_new();
    archive_read_support_format_tar(in);
    archive_read_open_filename(in, src, 65536);
    archive_write_set_format_pax_restricted(out);
    archive_write_set_bytes_per_block(out, 0);
    archive_write_open_filename(out, dst);
    struct archive_entry *e;
    while (archive_read_next_header(in, &e) == ARCHIVE_OK) {
        if (!strcmp(archive_entry_pathname(e), skip)) continue;
        archive_write_header(out, e);
        char buf[8192];
        la_ssize_t n;
        while ((n = archive_read_data(in, buf, sizeof buf)) > 0) archive_write_data(out, buf, (size_t)n);
    }
    archive_read_free(in);
    archive_write_free(out);
}

/* Open + read every sample + verify; returns the first error (or EG_OK). */
static eg_status full_check(const char *dir, eg_error *err, int64_t *n_ok) {
    eg_ds_reader *r;
    *n_ok = 0;
    eg_status st = dataset_open(dir, &r, err);
    if (st) return st;
    eg_status first = EG_OK;
    for (int s = 0; s < dataset_num_shards(r) && !first; s++) first = dataset_verify_shard(r, s, err);
    eg_error e2;
    for (int64_t i = 0; i < dataset_num_samples(r); i++) {
        eg_ds_sample smp;
        st = dataset_read(r, i, 0, &smp, first ? &e2 : err);
        if (st && !first) first = st;
        if (!st) (*n_ok)++;
        eg_ds_sample_clear(&smp);
    }
    dataset_close(r);
    return first;
}

static void test_corruption(void) {
    eg_error err = {0};
    const char *d = fresh_dir("corrupt");
    char dir[256], shard[300], saved[300];
    snprintf(dir, sizeof dir, "%s", d);
    CHECK_OK(write_range(dir, base_opts(), "c", 0, 20, &err), &err);
    snprintf(shard, sizeof shard, "%s/shard-000000.tar", dir);
    snprintf(saved, sizeof saved, "%s/orig.bin", dir);
    size_t n;
    char *orig = slurp(shard, &n);
    CHECK(orig != NULL);
    if (!orig) return;
    int64_t ok;
    CHECK_OK(full_check(dir, &err, &ok), &err);
    CHECK(ok == 20);

    eg_ds_reader *r0;
    CHECK_OK(dataset_open(dir, &r0, &err), &err);
    const eg_ds_index_entry *e5 = dataset_entry(r0, 5, NULL, NULL);
    uint64_t off5 = e5->offset, size5 = e5->size;
    dataset_close(r0);

    /* 1. truncated shard */
    spit(shard, orig, n - 700);
    CHECK(full_check(dir, &err, &ok) != EG_OK);
    CHECKF(strstr(err.msg, "shard-000000.tar") != NULL, "%s", err.msg);
    /* also opened on its own (no manifest to compare sizes with) */
    eg_ds_reader *r;
    CHECK(dataset_open(shard, &r, &err) == EG_ERR_FORMAT);
    CHECKF(strstr(err.msg, "shard-000000.tar") != NULL, "%s", err.msg);

    /* 2. a flipped byte inside sample 5's aux frame */
    char *b = malloc(n);
    memcpy(b, orig, n);
    b[off5 + size5 - 200] ^= 0x10;
    spit(shard, b, n);
    CHECK(full_check(dir, &err, &ok) == EG_ERR_CHECKSUM); /* the sha256 of the shard */
    CHECKF(strstr(err.msg, "shard-000000.tar") != NULL, "%s", err.msg);
    CHECK(ok == 19); /* every other sample still reads */
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (r) {
        eg_ds_sample s;
        eg_status st = dataset_read(r, 5, 0, &s, &err);
        CHECK(st == EG_ERR_CHECKSUM || st == EG_ERR_FORMAT);
        CHECKF(strstr(err.msg, "shard-000000.tar") && strstr(err.msg, "sample 5") && strstr(err.msg, "c000005"),
               "%s", err.msg);
        CHECK(s.aux_hidden == NULL); /* never garbage */
        dataset_close(r);
    }

    /* 3. wrong record magic, then wrong version with a valid header CRC */
    memcpy(b, orig, n);
    b[off5] = 'X';
    spit(shard, b, n);
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (r) {
        eg_ds_sample s;
        CHECK(dataset_read(r, 5, 0, &s, &err) == EG_ERR_FORMAT);
        CHECKF(strstr(err.msg, "bad magic") && strstr(err.msg, "sample 5"), "%s", err.msg);
        memcpy(b, orig, n);
        uint8_t *h = (uint8_t *)b + off5;
        h[4] = 3; /* version 3: newer than this build */
        uint32_t c = eg_ds_crc32(h, 124);
        for (int i = 0; i < 4; i++) h[124 + i] = (uint8_t)(c >> (8 * i));
        spit(shard, b, n);
        CHECK(dataset_read(r, 5, 0, &s, &err) == EG_ERR_FORMAT);
        CHECKF(strstr(err.msg, "version 3") && strstr(err.msg, "sample 5"), "%s", err.msg);
        dataset_close(r);
    }
    /* trailer version */
    memcpy(b, orig, n);
    uint8_t *tr = (uint8_t *)b + n - EG_DS_TRAILER_FROM_END;
    tr[8] = 9;
    uint32_t c = eg_ds_crc32(tr, 60);
    for (int i = 0; i < 4; i++) tr[60 + i] = (uint8_t)(c >> (8 * i));
    spit(shard, b, n);
    CHECK(dataset_open(dir, &r, &err) == EG_ERR_FORMAT);
    CHECKF(strstr(err.msg, "version 9") && strstr(err.msg, "shard-000000.tar"), "%s", err.msg);

    /* 4. a member deleted with a tar tool */
    spit(saved, orig, n);
    tar_without(saved, shard, "00000004.egs");
    CHECK(full_check(dir, &err, &ok) != EG_OK);
    CHECKF(strstr(err.msg, "shard-000000.tar") != NULL, "%s", err.msg);
    /* the same shard alone (no manifest size to catch it): the index disagrees */
    CHECK(dataset_open(shard, &r, &err) != EG_OK || (full_check(shard, &err, &ok) != EG_OK));
    CHECKF(strstr(err.msg, "shard-000000.tar") != NULL, "%s", err.msg);
    if (r) dataset_close(r);

    /* 5. fuzz: random byte flips never crash, and never pass a read silently
     * unless the flipped byte is outside every checked region (tar header padding) */
    uint64_t x = eg_test_seed() * 7 + 1;
    for (int it = 0; it < 60; it++) {
        memcpy(b, orig, n);
        size_t pos = (size_t)(rng_next(&x) % n);
        b[pos] ^= (char)(1 + rng_next(&x) % 255);
        spit(shard, b, n);
        full_check(dir, &err, &ok); /* must simply not crash; sha256 catches it */
        char p2[400];
        snprintf(p2, sizeof p2, "%s", shard);
        if (dataset_open(p2, &r, &err) == EG_OK) {
            for (int64_t i = 0; i < dataset_num_samples(r); i++) {
                eg_ds_sample s;
                if (dataset_read(r, i, 0, &s, &err) == EG_OK) {
                    char why[128] = "";
                    CHECKF(same_as(&s, "c", (int)i, why, sizeof why), "flip at %zu passed as garbage: %s", pos, why);
                    eg_ds_sample_clear(&s);
                }
            }
            dataset_close(r);
        }
    }
    spit(shard, orig, n);
    unlink(saved);
    CHECK_OK(full_check(dir, &err, &ok), &err);

    /* 6. damaged manifest: truncated JSON, wrong version */
    char mp[300];
    snprintf(mp, sizeof mp, "%s/manifest.json", dir);
    size_t mn;
    char *man = slurp(mp, &mn);
    if (man) {
        spit(mp, man, mn / 2);
        CHECK(dataset_open(dir, &r, &err) == EG_ERR_FORMAT);
        CHECKF(strstr(err.msg, "manifest.json") != NULL, "%s", err.msg);
        char *v = strstr(man, "\"format_version\": 2");
        CHECK(v != NULL);
        if (v) {
            v[strlen("\"format_version\": ")] = '7';
            spit(mp, man, mn);
            CHECK(dataset_open(dir, &r, &err) == EG_ERR_FORMAT);
            CHECKF(strstr(err.msg, "version 7") && strstr(err.msg, "manifest.json"), "%s", err.msg);
        }
        free(man);
    }
    free(b);
    free(orig);
    rm_dir(dir);
}

static void test_merge(void) {
    eg_error err = {0};
    const char *d = fresh_dir("merge");
    char dir[256], out[300];
    snprintf(dir, sizeof dir, "%s", d);
    snprintf(out, sizeof out, "%s_out", dir);
    rm_dir(out);
    for (int wi = 0; wi < 2; wi++) {
        eg_shard_writer_opts o = base_opts();
        o.worker_index = wi;
        o.worker_count = 2;
        o.shard_samples = 4;
        CHECK_OK(write_range(dir, o, wi ? "m1-" : "m0-", 0, 9 + wi, &err), &err);
    }
    eg_ds_reader *r;
    CHECK_OK(dataset_open(dir, &r, &err), &err); /* unmerged: worker manifests combined */
    if (r) { CHECK(dataset_num_samples(r) == 19); dataset_close(r); }
    const char *dirs[1] = {dir};
    CHECK_OK(dataset_merge(dirs, 1, dir, &err), &err);
    char p[400];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    CHECK(access(p, F_OK) == 0);
    CHECK_OK(dataset_merge(dirs, 1, out, &err), &err);
    CHECK_OK(dataset_open(out, &r, &err), &err);
    if (r) {
        CHECK(dataset_num_samples(r) == 19);
        CHECK(dataset_info(r)->counts[EG_DS_COUNT_GENERATED] == 19);
        CHECK(strstr(dataset_info(r)->job_json, "merged_from") != NULL);
        int64_t i = dataset_find(r, "m1-000009");
        CHECK(i >= 0);
        eg_ds_sample s;
        CHECK_OK(dataset_read(r, i, 0, &s, &err), &err);
        char why[128] = "";
        CHECKF(same_as(&s, "m1-", 9, why, sizeof why), "%s", why);
        eg_ds_sample_clear(&s);
        for (int k = 0; k < dataset_num_shards(r); k++) CHECK_OK(dataset_verify_shard(r, k, &err), &err);
        dataset_close(r);
    }
    /* a worker resumes after the merge and commits more shards; merging again into the same
     * out (which holds hard links of the first shards) takes them all */
    {
        eg_shard_writer_opts o = base_opts();
        o.worker_index = 0;
        o.worker_count = 2;
        o.shard_samples = 4;
        o.resume = 1;
        CHECK_OK(write_range(dir, o, "m0-", 9, 14, &err), &err);
    }
    CHECK_OK(dataset_merge(dirs, 1, out, &err), &err);
    CHECK_OK(dataset_open(out, &r, &err), &err);
    if (r) {
        CHECK(dataset_num_samples(r) == 24);
        CHECK(dataset_find(r, "m0-000013") >= 0);
        for (int k = 0; k < dataset_num_shards(r); k++) CHECK_OK(dataset_verify_shard(r, k, &err), &err);
        dataset_close(r);
    }
    /* a different file under a shard's output name is a conflict, and nothing is left behind */
    char victim[400], other[400];
    snprintf(victim, sizeof victim, "%s/shard-w0of2-000000.tar", out);
    snprintf(other, sizeof other, "%s/shard-w1of2-000000.tar", dir);
    size_t vn;
    char *vb = slurp(other, &vn);
    CHECK(vb != NULL);
    if (vb) {
        unlink(victim);
        spit(victim, vb, vn);
        free(vb);
        int before = count_files(out, ".tar");
        CHECK(dataset_merge(dirs, 1, out, &err) == EG_ERR_CONFIG);
        CHECKF(strstr(err.msg, "shard-w0of2-000000.tar") != NULL, "%s", err.msg);
        CHECK(count_files(out, ".tar") == before);
    }
    /* duplicate ids across inputs are rejected */
    char dup[300];
    snprintf(dup, sizeof dup, "%s_dup", dir);
    rm_dir(dup);
    CHECK_OK(write_range(dup, base_opts(), "m0-", 0, 2, &err), &err);
    const char *two[2] = {dir, dup};
    char out2[320];
    snprintf(out2, sizeof out2, "%s_out2", dir);
    rm_dir(out2);
    CHECK(dataset_merge(two, 2, out2, &err) == EG_ERR_FORMAT);
    CHECKF(strstr(err.msg, "m0-000000") != NULL && strstr(err.msg, dir) && strstr(err.msg, dup), "%s", err.msg);
    CHECK(access(out2, F_OK) != 0); /* the refused merge removed the directory it made */
    rm_dir(out2);
    rm_dir(dup);
    rm_dir(out);
    rm_dir(dir);
}

static void test_bad_input(void) {
    eg_error err = {0};
    const char *dir = fresh_dir("badin");
    eg_shard_writer_opts o = base_opts();
    eg_shard_writer *w;
    CHECK_OK(shard_writer_open(dir, &o, &w, &err), &err);
    if (!w) return;
    gen_sample g;
    gen_make(&g, "b", 0, 0);
    g.s.H = HID + 1;
    CHECK(shard_writer_add(w, &g.s, &err) == EG_ERR_INVALID);
    g.s.H = HID;
    g.s.loss_mask[0] = 2;
    CHECK(shard_writer_add(w, &g.s, &err) == EG_ERR_INVALID);
    g.s.loss_mask[0] = 0;
    g.s.input_ids[0] = 512; /* >= target vocab */
    CHECK(shard_writer_add(w, &g.s, &err) == EG_ERR_INVALID);
    g.s.input_ids[0] = 1;
    CHECK_OK(shard_writer_add(w, &g.s, &err), &err);
    CHECK(shard_writer_set_job(w, "[1]", &err) == EG_ERR_INVALID);
    CHECK_OK(shard_writer_set_job(w, "{\"n\": 1}", &err), &err);
    gen_free(&g);
    CHECK_OK(shard_writer_close(w, &err), &err);
    shard_writer_free(w);
    eg_ds_reader *r;
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (r) {
        CHECK(dataset_num_samples(r) == 1);
        CHECK(strstr(dataset_info(r)->job_json, "\"n\"") != NULL);
        dataset_close(r);
    }
    CHECK(dataset_open("/nonexistent/dir", &r, &err) == EG_ERR_IO);
    rm_dir(dir);

    /* vocabulary unknown (0): ids still stop below EG_DS_MAX_HIST_ID, past which the
       manifest's histogram would be refused by every reader (the writer took them, and its
       own dataset then failed to open) */
    dir = fresh_dir("badin0");
    o.target_vocab_size = 0;
    CHECK_OK(shard_writer_open(dir, &o, &w, &err), &err);
    if (!w) return;
    gen_make(&g, "z", 0, 0);
    g.s.input_ids[g.s.T - 1] = EG_DS_MAX_HIST_ID; /* loss-masked: it goes into the histogram */
    g.s.loss_mask[g.s.T - 1] = 1;
    CHECK(shard_writer_add(w, &g.s, &err) == EG_ERR_INVALID);
    CHECKF(strstr(err.msg, "out of range (limit 16777216)") != NULL, "%s", err.msg);
    g.s.input_ids[g.s.T - 1] = EG_DS_MAX_HIST_ID - 1;
    CHECK_OK(shard_writer_add(w, &g.s, &err), &err);
    gen_free(&g);
    CHECK_OK(shard_writer_close(w, &err), &err);
    shard_writer_free(w);
    CHECK_OK(dataset_open(dir, &r, &err), &err);
    if (r) {
        CHECK(dataset_num_samples(r) == 1 && dataset_info(r)->hist_len == EG_DS_MAX_HIST_ID);
        dataset_close(r);
    }
    rm_dir(dir);
}

/* ---------------------------------------------------------------- script modes */
static int mode_loop(const char *dir, long n) {
    eg_shard_writer_opts o = base_opts();
    o.shard_samples = 3;
    o.resume = 1;
    eg_shard_writer *w;
    eg_error err = {0};
    if (shard_writer_open(dir, &o, &w, &err)) {
        fprintf(stderr, "loop: %s\n", err.msg);
        return 1;
    }
    eg_shard_writer_stats st;
    shard_writer_stats(w, &st);
    int k = (int)st.committed_samples;
    for (long i = 0; n < 0 || i < n; i++, k++) {
        char id[32];
        snprintf(id, sizeof id, "loop-%06d", k);
        if (shard_writer_has_id(w, id)) { fprintf(stderr, "loop: %s committed twice?\n", id); return 1; }
        gen_sample g;
        gen_make(&g, "loop-", k, k % 3);
        eg_status s = shard_writer_add(w, &g.s, &err);
        gen_free(&g);
        shard_writer_count(w, EG_DS_COUNT_GENERATED, 1);
        if (s) { fprintf(stderr, "loop: %s\n", err.msg); return 1; }
    }
    int rc = shard_writer_close(w, &err) ? 1 : 0;
    shard_writer_free(w);
    return rc;
}

static int mode_check(const char *dir) {
    eg_error err = {0};
    int bad = 0;
    /* every visible shard file is complete and valid (orphans included) */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 4, ".tar")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        int64_t ok;
        if (full_check(p, &err, &ok)) { fprintf(stderr, "check: %s\n", err.msg); bad = 1; }
    }
    if (d) closedir(d);
    eg_ds_reader *r;
    if (dataset_open(dir, &r, &err)) { fprintf(stderr, "check: %s\n", err.msg); return 1; }
    int64_t n = dataset_num_samples(r);
    for (int s = 0; s < dataset_num_shards(r); s++)
        if (dataset_verify_shard(r, s, &err)) { fprintf(stderr, "check: %s\n", err.msg); bad = 1; }
    for (int64_t i = 0; i < n; i++) {
        eg_ds_sample s;
        if (dataset_read(r, i, 0, &s, &err)) { fprintf(stderr, "check: %s\n", err.msg); bad = 1; continue; }
        char why[128] = "";
        if (!same_as(&s, "loop-", (int)i, why, sizeof why)) { fprintf(stderr, "check: sample %lld: %s\n", (long long)i, why); bad = 1; }
        eg_ds_sample_clear(&s);
    }
    dataset_close(r);
    printf("%lld\n", (long long)n);
    return bad;
}

static int mode_fixture(const char *dir) {
    eg_shard_writer_opts o = base_opts();
    o.shard_samples = 4;
    eg_error err = {0};
    if (write_range(dir, o, "py", 0, 11, &err)) { fprintf(stderr, "fixture: %s\n", err.msg); return 1; }
    char p[1024];
    snprintf(p, sizeof p, "%s/expect", dir);
    mkdir(p, 0755);
    for (int k = 0; k < 11; k++) {
        gen_sample g;
        gen_make(&g, "py", k, 0);
        const char *names[4] = {"ids", "mask", "aux", "final"};
        const void *data[4] = {g.s.input_ids, g.s.loss_mask, g.aux_b, g.fin_b};
        size_t sz[4] = {(size_t)g.s.T * 4, (size_t)g.s.T, (size_t)g.s.T * N_AUX * HID * 2, (size_t)g.s.T * HID * 2};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "%s/expect/%s.%s.bin", dir, g.id, names[i]);
            spit(p, data[i], sz[i]);
        }
        snprintf(p, sizeof p, "%s/expect/%s.json", dir, g.id);
        FILE *f = fopen(p, "w");
        fprintf(f, "{\"id\": \"%s\", \"T\": %lld, \"n_aux\": %d, \"H\": %d, \"source_line\": %lld, \"finish\": \"%s\", \"seed\": %llu}\n",
                g.id, (long long)g.s.T, N_AUX, HID, (long long)g.s.source_line, eg_ds_finish_name(g.s.finish),
                (unsigned long long)g.s.seed);
        fclose(f);
        gen_free(&g);
    }
    return 0;
}

/* Three samples carrying both final states (EG_DS_FINAL_BOTH), sample 1 with one NaN in
 * plane `which` ("aux", "final" or "pre"): what `inspect --verify` must name
 * (t_dataset_cli.sh). */
static int mode_nan_fixture(const char *dir, const char *which) {
    eg_shard_writer_opts o = base_opts();
    o.final_source = EG_DS_FINAL_BOTH;
    eg_shard_writer *w;
    eg_error err = {0};
    if (shard_writer_open(dir, &o, &w, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        gen_sample g;
        gen_make(&g, "nan", k, 0);
        size_t nf = (size_t)g.s.T * HID;
        float *pre = malloc(nf * 4);
        for (size_t i = 0; i < nf; i++) pre[i] = 3.0f * g.fin_f[i] + 0.25f;
        g.s.final_pre_hidden = pre;
        if (k == 1) {
            float *plane = !strcmp(which, "aux") ? g.aux_f : !strcmp(which, "final") ? g.fin_f : pre;
            plane[HID + 3] = NAN;
        }
        if (shard_writer_add(w, &g.s, &err)) { fprintf(stderr, "%s\n", err.msg); rc = 1; }
        free(pre);
        gen_free(&g);
    }
    if (shard_writer_close(w, &err)) { fprintf(stderr, "%s\n", err.msg); rc = 1; }
    shard_writer_free(w);
    return rc;
}

/* Known loss-masked histogram: 3 x5, 7 x5, 9 x4, 100 x2, 2 x1; id 50 appears 10 times
 * unmasked (must not count). Target vocab 200. */
static int mode_vocab_fixture(const char *dir) {
    eg_shard_writer_opts o = base_opts();
    o.target_vocab_size = 200;
    o.shard_samples = 2;
    eg_shard_writer *w;
    eg_error err = {0};
    if (shard_writer_open(dir, &o, &w, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    const int32_t masked[] = {3, 7, 9, 3, 7, 100, 9, 3, 7, 2, 9, 3, 7, 100, 9, 3, 7};
    int nm = (int)(sizeof masked / sizeof masked[0]);
    for (int k = 0; k < 3; k++) {
        gen_sample g;
        gen_make(&g, "v", k, 1);
        free(g.s.input_ids);
        free(g.s.loss_mask);
        int T = 10 + (k == 0 ? nm : 0);
        g.s.T = T;
        g.s.prompt_len = 10;
        g.s.gen_len = T - 10;
        g.s.input_ids = malloc(sizeof(int32_t) * (size_t)T);
        g.s.loss_mask = malloc((size_t)T);
        for (int t = 0; t < 10; t++) { g.s.input_ids[t] = 50; g.s.loss_mask[t] = 0; }
        for (int t = 10; t < T; t++) { g.s.input_ids[t] = masked[t - 10]; g.s.loss_mask[t] = 1; }
        free(g.aux_b);
        free(g.fin_b);
        g.aux_b = calloc((size_t)T * N_AUX * HID, 2);
        g.fin_b = calloc((size_t)T * HID, 2);
        g.s.aux_hidden = g.aux_b;
        g.s.final_hidden = g.fin_b;
        if (shard_writer_add(w, &g.s, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        gen_free(&g);
    }
    int rc = shard_writer_close(w, &err) ? 1 : 0;
    shard_writer_free(w);
    return rc;
}

/* Throughput at Kimi-K2.5 size: H 7168, 3 aux layers, F32 input, T 128 per sample. */
static int mode_bench(const char *dir, int threads, int split) {
    const int64_t T = 128, H = 7168, NA = 3;
    const int n = 24;
    static const int ids3[3] = {1, 30, 57};
    eg_shard_writer_opts o = base_opts();
    o.n_aux = (int)NA;
    o.aux_layers = ids3;
    o.hidden_size = H;
    o.target_vocab_size = 0;
    o.threads = threads;
    o.queue_depth = 0;
    o.shard_samples = 8;
    o.no_bf16_split = !split;
    float *aux = malloc(sizeof(float) * (size_t)(T * NA * H)), *fin = malloc(sizeof(float) * (size_t)(T * H));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)T);
    uint8_t *mask = malloc((size_t)T);
    uint64_t x = 99;
    /* per-channel scales (outlier channels) like real residual streams */
    for (int64_t i = 0; i < T * NA * H; i++) aux[i] = rng_normal(&x) * (i % H % 97 == 3 ? 30.0f : 0.5f);
    for (int64_t i = 0; i < T * H; i++) fin[i] = rng_normal(&x);
    for (int64_t t = 0; t < T; t++) { ids[t] = (int32_t)(rng_next(&x) % 163840); mask[t] = t > 40; }
    eg_shard_writer *w;
    eg_error err = {0};
    if (shard_writer_open(dir, &o, &w, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double t0 = eg_now(), t_add = 0;
    for (int k = 0; k < n; k++) {
        char id[32];
        snprintf(id, sizeof id, "b%d", k);
        eg_ds_sample s = {.id = id, .source_file = "", .top_p = 1, .T = T, .n_aux = (int)NA, .H = H, .input_ids = ids,
                          .loss_mask = mask, .hidden_dtype = EG_DS_F32, .aux_hidden = aux, .final_hidden = fin};
        double a = eg_now();
        if (shard_writer_add(w, &s, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        t_add += eg_now() - a;
    }
    int rc = shard_writer_close(w, &err) ? 1 : 0;
    double dt = eg_now() - t0;
    eg_shard_writer_stats st;
    shard_writer_stats(w, &st);
    shard_writer_free(w);
    double toks = (double)(n * T);
    printf("threads %d split %d: %d samples x %lld tokens (H %lld, 3 aux + final): %.2f s, %.0f tokens/s, "
           "%.1f MB/s of BF16 hidden states in, ratio x%.3f, producer inside add %.2f s\n",
           threads, split, n, (long long)T, (long long)H, dt, toks / dt, toks * (double)(NA + 1) * (double)H * 2 / dt / 1e6,
           (double)st.committed_raw_bytes / (double)st.committed_bytes, t_add);
    free(aux); free(fin); free(ids); free(mask);
    return rc;
}

static const eg_test tests[] = {
    {"roundtrip", test_roundtrip},
    {"random_access_by_id", test_random_access_by_id},
    {"resume", test_resume},
    {"free_without_close", test_free_without_close},
    {"disk_full", test_disk_full},
    {"corruption", test_corruption},
    {"merge", test_merge},
    {"bad_input", test_bad_input},
};

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "--loop")) return mode_loop(argv[2], argc >= 4 ? atol(argv[3]) : -1);
    if (argc >= 3 && !strcmp(argv[1], "--check")) return mode_check(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "--fixture")) return mode_fixture(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "--bench"))
        return mode_bench(argv[2], argc >= 4 ? atoi(argv[3]) : 0, argc >= 5 ? atoi(argv[4]) : 1);
    if (argc >= 3 && !strcmp(argv[1], "--vocab-fixture")) return mode_vocab_fixture(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "--nan-fixture")) return mode_nan_fixture(argv[2], argv[3]);
    return eg_test_main("dataset_writer", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
