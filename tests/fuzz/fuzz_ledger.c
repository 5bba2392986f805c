/* Fuzz target: the job directory's files (gen/job.c). Byte 0 picks:
 *  even: the rest is rejects.jsonl: gen_ledger_open must load it or refuse it; after one
 *        appended line (strings from the input, any bytes) a reopen holds one more entry
 *        with that index (the escaped strings keep the line valid JSON), checked SAME
 *        by its line hash and CHANGED by another; after a clear, a reopen holds the
 *        entries of before;
 *  odd:  the rest is job.json, checked against a fixed job description. */
#include "gen/job.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    if (n < 1) return 0;
    eg_error err = {0};
    const char *dir = fuzz_dir();
    if (!(d[0] & 1)) {
        fuzz_file("rejects.jsonl", d + 1, n - 1);
        gen_ledger *l = NULL;
        uint64_t index = (uint64_t)n * 7919u;
        if (gen_ledger_open(dir, "rejects.jsonl", &l, &err) == EG_OK && gen_ledger_has(l, index)) {
            gen_ledger_close(l); /* the input logged that index already: not this check's case */
        } else if (l) {
            int64_t before = 0;
            for (int o = 0; o < GEN_NOUTCOMES; o++) before += gen_ledger_count(l, (gen_outcome)o);
            size_t k = n - 1 < 64 ? n - 1 : 64; /* file/id/reason/raw: the input's last bytes */
            char *s = fuzz_cstr(d + n - k, k);
            FUZZ_CHECK(gen_ledger_add(l, index, s, 3, s, GEN_OUT_REJECTED, s, gen_line_hash(s, k), s, &err) == EG_OK);
            FUZZ_CHECK(gen_ledger_has(l, index));
            gen_ledger_close(l);
            l = NULL;
            eg_status st = gen_ledger_open(dir, "rejects.jsonl", &l, &err);
            if (st) fprintf(stderr, "reopening the ledger failed: %s\n", err.msg);
            FUZZ_CHECK(st == EG_OK);
            int64_t after = 0;
            for (int o = 0; o < GEN_NOUTCOMES; o++) after += gen_ledger_count(l, (gen_outcome)o);
            FUZZ_CHECK(after == before + 1 && gen_ledger_has(l, index));
            uint64_t h = gen_line_hash(s, k);
            FUZZ_CHECK(gen_ledger_check(l, index, h) == GEN_LEDGER_SAME);
            FUZZ_CHECK(gen_ledger_check(l, index, h ^ 1) == GEN_LEDGER_CHANGED);
            /* the record changed: cleared, and the clear survives a reopen */
            FUZZ_CHECK(gen_ledger_clear(l, index, s, 3, s, h ^ 1, &err) == EG_OK);
            FUZZ_CHECK(!gen_ledger_has(l, index));
            gen_ledger_close(l);
            l = NULL;
            st = gen_ledger_open(dir, "rejects.jsonl", &l, &err);
            if (st) fprintf(stderr, "reopening the cleared ledger failed: %s\n", err.msg);
            FUZZ_CHECK(st == EG_OK);
            int64_t cleared = 0;
            for (int o = 0; o < GEN_NOUTCOMES; o++) cleared += gen_ledger_count(l, (gen_outcome)o);
            FUZZ_CHECK(cleared == before && !gen_ledger_has(l, index));
            gen_ledger_close(l);
            free(s);
        }
        return 0;
    }
    fuzz_file("job.json", d + 1, n - 1);
    json_t *want = json_pack("{s:i, s:{s:s, s:i, s:s}, s:{s:s, s:[{s:s, s:I, s:s}]}}", "version", 1, "params",
                             "backend", "cpu", "max_new_tokens", 16, "on_bad_record", "error", "fingerprints",
                             "model_config_sha256", "00", "inputs", "path", "corpus.jsonl", "size", (json_int_t)12,
                             "sha256_head_tail", "ab");
    FUZZ_CHECK(want != NULL);
    int existed = 0, changed = 0;
    eg_status st = gen_job_check(dir, "job.json", want, &existed, &changed, &err);
    FUZZ_CHECK(st == EG_OK || st == EG_ERR_FORMAT || st == EG_ERR_CONFIG || st == EG_ERR_IO);
    if (st == EG_OK) FUZZ_CHECK(existed);
    json_decref(want);
    return 0;
}
