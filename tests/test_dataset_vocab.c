/* test_dataset_vocab — SpecForge's draft-vocab padding (CPython set order) and the torch.save
 * writer's refusals. `test_dataset_vocab --pyset` reads "N need id id ..." (the seen ids) on
 * stdin and prints the padding ids, so tests/t_export_specforge.sh compares them with the
 * running CPython's own set(range(N)) - seen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/torchsave.h"
#include "dataset/vocab.h"
#include "tests/check.h"

static uint64_t rng_state;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Few seen ids (N >> 2 > distinct): CPython copies range(N)'s table, so the lowest missing ids. */
static void test_pyset_sparse_is_ascending(void) {
    int64_t N = 1000;
    uint8_t *present = calloc((size_t)N, 1);
    int64_t seen[] = {0, 3, 4, 999, 500};
    for (size_t i = 0; i < sizeof seen / sizeof seen[0]; i++) present[seen[i]] = 1;
    int64_t out[10];
    eg_error err = {0};
    CHECK_OK(eg_vocab_pyset_missing(N, present, 5 + 7 /* 7 seen ids >= N */, 10, out, &err), &err);
    int64_t want[10] = {1, 2, 5, 6, 7, 8, 9, 10, 11, 12};
    CHECK(!memcmp(out, want, sizeof want));
    free(present);
}

/* Any case: need distinct ids, each < N and not seen. */
static void test_pyset_properties(void) {
    rng_state = eg_test_seed() | 1;
    eg_error err = {0};
    for (int it = 0; it < 200; it++) {
        int64_t N = 8 + (int64_t)(rnd() % 5000);
        uint8_t *present = calloc((size_t)N, 1);
        int64_t a = 0;
        for (int64_t k = 0; k < N; k++)
            if (rnd() % 100 < (uint64_t)(it % 100)) { present[k] = 1; a++; }
        int64_t b = (int64_t)(rnd() % 50), distinct = a + b;
        if (distinct >= N) { free(present); continue; }
        int64_t need = N - distinct, *out = malloc(sizeof *out * (size_t)need);
        uint8_t *used = calloc((size_t)N, 1);
        CHECK_OK(eg_vocab_pyset_missing(N, present, distinct, need, out, &err), &err);
        int ok = 1;
        for (int64_t i = 0; i < need; i++) {
            if (out[i] < 0 || out[i] >= N || present[out[i]] || used[out[i]]) ok = 0;
            else used[out[i]] = 1;
        }
        CHECK(ok);
        free(out);
        free(used);
        free(present);
    }
}

static void test_torchsave_refuses(void) {
    eg_error err = {0};
    int64_t x = 1;
    eg_pt_tensor t = {"x", EG_PT_I64, 1, {-1}, &x};
    CHECK(eg_torch_save("/tmp", "eg-never.pt", &t, 1, NULL, &err) == EG_ERR_INVALID);
    CHECK(strstr(err.msg, "negative dimension") != NULL);
    t.shape[0] = 1;
    t.ndim = EG_PT_MAX_DIMS + 1;
    CHECK(eg_torch_save("/tmp", "eg-never.pt", &t, 1, NULL, &err) == EG_ERR_INVALID);
    t.ndim = 1;
    CHECK(eg_torch_save("/nonexistent-dir-eg", "x.pt", &t, 1, NULL, &err) == EG_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent-dir-eg/x.pt.tmp") != NULL);
}

static const eg_test tests[] = {
    {"pyset_sparse_is_ascending", test_pyset_sparse_is_ascending},
    {"pyset_properties", test_pyset_properties},
    {"torchsave_refuses", test_torchsave_refuses},
};

static int pyset_main(void) {
    long long N, need, v;
    if (scanf("%lld %lld", &N, &need) != 2 || N < 1 || need < 0) return 2;
    uint8_t *present = calloc((size_t)N, 1);
    int64_t distinct = 0, *out = malloc(sizeof *out * (size_t)(need + 1));
    while (scanf("%lld", &v) == 1) {
        distinct++;
        if (v >= 0 && v < N) present[v] = 1;
    }
    eg_error err = {0};
    if (eg_vocab_pyset_missing(N, present, distinct, need, out, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    for (long long i = 0; i < need; i++) printf("%s%lld", i ? " " : "", (long long)out[i]);
    printf("\n");
    free(present);
    free(out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--pyset")) return pyset_main();
    return eg_test_main("dataset_vocab", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
