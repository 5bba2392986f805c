/* Fuzz target: the safetensors header parser (engine/safetensors.c) over a file image
 * in memory; every tensor it accepts must lie inside the image. */
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    eg_st_file *f = NULL;
    eg_error err = {0};
    if (eg_st_open_memory(d, n, "fuzz", &f, &err) == EG_OK) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < eg_st_count(f); i++) {
            const eg_st_tensor *t = eg_st_at(f, i);
            FUZZ_CHECK(t && t->name && t->ndim >= 0 && t->ndim <= EG_ST_MAX_DIMS);
            FUZZ_CHECK(t->offset <= n && t->nbytes <= n - t->offset);
            FUZZ_CHECK(eg_st_find(f, t->name) != NULL);
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        }
        for (int i = 0; i < eg_st_meta_count(f); i++) {
            const char *k, *v;
            eg_st_meta_at(f, i, &k, &v);
            FUZZ_CHECK(k && v && eg_st_meta(f, k) != NULL);
        }
        (void)sink;
        eg_st_close(f);
    }
    return 0;
}
