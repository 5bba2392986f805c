/* Fuzz target: manifest.json (dataset/manifest.c). Property: what loads saves, and the
 * saved manifest loads back to the same description, shards, counts and histogram
 * (decode(encode(x)) == x). */
#include "dataset/manifest.h"
#include "tests/fuzz/fuzz.h"

static int same_info(const eg_ds_info *a, const eg_ds_info *b) {
    if (eg_ds_info_compatible(a, b, NULL) || a->worker_index != b->worker_index || a->worker_count != b->worker_count ||
        a->n_shards != b->n_shards || a->hist_len != b->hist_len || a->zstd_level != b->zstd_level ||
        a->bf16_split != b->bf16_split || a->target_vocab_size != b->target_vocab_size || strcmp(a->job_json, b->job_json))
        return 0;
    for (int i = 0; i < EG_DS_NCOUNTS; i++)
        if (a->counts[i] != b->counts[i]) return 0;
    for (int i = 0; i < a->n_shards; i++) {
        const eg_ds_shard_info *x = &a->shards[i], *y = &b->shards[i];
        if (strcmp(x->file, y->file) || strcmp(x->sha256, y->sha256) || x->samples != y->samples ||
            x->tokens != y->tokens || x->loss_tokens != y->loss_tokens || x->n_stop != y->n_stop ||
            x->n_length != y->n_length || x->bytes != y->bytes || x->raw_bytes != y->raw_bytes)
            return 0;
    }
    return a->hist_len == 0 || !memcmp(a->hist, b->hist, sizeof(uint64_t) * (size_t)a->hist_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    const char *path = fuzz_file(EG_DS_MANIFEST, d, n);
    eg_ds_info a, b;
    eg_error err = {0};
    if (eg_ds_info_load(path, &a, &err) == EG_OK) {
        char dir2[256];
        snprintf(dir2, sizeof dir2, "%s/b", fuzz_dir());
        eg_status st = eg_ds_info_save(&a, dir2, EG_DS_MANIFEST, &err);
        if (st) fprintf(stderr, "saving a manifest that loaded failed: %s\n", err.msg);
        FUZZ_CHECK(st == EG_OK);
        char p2[300];
        snprintf(p2, sizeof p2, "%s/%s", dir2, EG_DS_MANIFEST);
        st = eg_ds_info_load(p2, &b, &err);
        if (st) fprintf(stderr, "loading a saved manifest failed: %s\n", err.msg);
        FUZZ_CHECK(st == EG_OK);
        FUZZ_CHECK(same_info(&a, &b));
        eg_ds_info_clear(&b);
        eg_ds_info_clear(&a);
    }
    char **names = NULL;
    int nn = 0;
    if (eg_ds_find_manifests(fuzz_dir(), 0, &names, &nn, &err) == EG_OK) eg_ds_free_names(names, nn);
    return 0;
}
