/* Fuzz target: the shard reader (dataset/reader.c) on one shard file: trailer, index,
 * tar walk (dataset_verify_shard) and every sample. Nothing it reports may point outside
 * the file; every sample it reads is fully verified. */
#include "dataset/reader.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    const char *path = fuzz_file("shard-000000.tar", d, n);
    eg_ds_reader *r = NULL;
    eg_error err = {0};
    if (dataset_open(path, &r, &err) == EG_OK) {
        (void)dataset_verify_shard(r, 0, &err);
        int64_t ns = dataset_num_samples(r);
        for (int64_t i = 0; i < ns && i < 64; i++) {
            int shard;
            int64_t pos;
            const eg_ds_index_entry *e = dataset_entry(r, i, &shard, &pos);
            FUZZ_CHECK(e && e->offset <= n && e->size <= n - e->offset);
            FUZZ_CHECK(dataset_find(r, e->id) >= 0);
            eg_ds_sample s;
            if (dataset_read(r, i, (int)(i & 1), &s, &err) == EG_OK) {
                FUZZ_CHECK(s.id != NULL);
                eg_ds_sample_clear(&s);
            }
        }
        dataset_close(r);
    }
    return 0;
}
