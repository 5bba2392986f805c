/* gen/draft_model: the drafter's identity in job.json changes when its config or its
 * weights change (and not when its directory moves), and a job made with one
 * drafter differs in a sample-changing parameter from a job with another or with none
 * (so a resume with it is refused); the loader refuses a directory it cannot use. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "engine/runtime.h"
#include "gen/draft_model.h"
#include "gen/resume.h"
#include "tests/check.h"

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static json_t *job_with(json_t *draft) {
    json_t *j = json_pack("{s:i, s:{s:f}}", "version", 1, "params", "temperature", 1.0);
    if (draft) json_object_set(json_object_get(j, "params"), "draft_model", draft);
    return j;
}

static void test_identity(void) {
    char dir[] = "/tmp/eg_draft_XXXXXX", dir2[] = "/tmp/eg_draft_XXXXXX", path[256];
    CHECK(mkdtemp(dir) && mkdtemp(dir2));
    eg_error err = {0};
    json_t *none = NULL;
    CHECK(gen_draft_identity(dir, &none, &err) != EG_OK && strstr(err.msg, "--draft-model")); /* no config.json */
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, "{\"architectures\": [\"LlamaForCausalLMEagle3\"]}");
    CHECK(gen_draft_identity(dir, &none, &err) == EG_ERR_CONFIG && strstr(err.msg, "no .safetensors"));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_file(path, "weights one");
    json_t *a = NULL, *b = NULL, *c = NULL, *d = NULL, *moved = NULL;
    CHECK_OK(gen_draft_identity(dir, &a, &err), &err);
    CHECK_OK(gen_draft_identity(dir, &b, &err), &err);
    write_file(path, "weights two");
    CHECK_OK(gen_draft_identity(dir, &c, &err), &err);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"x\": 1}");
    CHECK_OK(gen_draft_identity(dir, &d, &err), &err);
    /* the same files elsewhere */
    snprintf(path, sizeof path, "%s/config.json", dir2);
    write_file(path, "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"x\": 1}");
    snprintf(path, sizeof path, "%s/model.safetensors", dir2);
    write_file(path, "weights two");
    CHECK_OK(gen_draft_identity(dir2, &moved, &err), &err);
    if (a && b && c && d && moved) {
        CHECK(json_array_size(json_object_get(a, "weights")) == 1);
        CHECK(json_equal(a, b)); /* the same files: the same identity */
        CHECK(!json_equal(a, c) && !json_equal(c, d));
        CHECK(json_equal(d, moved));
        char out[2048] = "";
        json_t *ja = job_with(a), *jb = job_with(c), *jn = job_with(NULL), *jm = job_with(moved), *jd = job_with(d);
        CHECK(gen_job_sample_diff(ja, jb, out, sizeof out) > 0 && strstr(out, "draft_model"));
        out[0] = 0;
        CHECK(gen_job_sample_diff(ja, jn, out, sizeof out) > 0 && strstr(out, "draft_model"));
        out[0] = 0;
        CHECK(gen_job_sample_diff(jn, ja, out, sizeof out) > 0);
        CHECK(gen_job_sample_diff(jd, jm, out, sizeof out) == 0);
        json_decref(ja); json_decref(jb); json_decref(jn); json_decref(jm); json_decref(jd);
    }
    json_decref(a); json_decref(b); json_decref(c); json_decref(d); json_decref(moved);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, dir2);
    CHECK(system(cmd) == 0);
}

/* The runtime loads the drafter once the slot count is known: a directory without one
 * fails with the flag and directory named, and no runtime comes back, with --ep too. */
static void test_load_refuses(void) {
    eg_error err = {0};
    eg_model m;
    CHECK_OK(eg_model_load("../shared/fixtures/models/tiny-a", &m, &err), &err);
    if (err.code) return;
    eg_runtime_opts ro = {.model = &m, .backend = "cpu", .threads = 1, .n_slots = 2, .max_seq_len = 64,
                          .max_tokens = 8, .draft_model = "/nonexistent/drafter", .draft_tokens = 3};
    eg_runtime *rt = (eg_runtime *)1;
    CHECK(eg_runtime_create(&ro, &rt, &err) != EG_OK);
    CHECK(rt == NULL || rt == (eg_runtime *)1);
    CHECK(strstr(err.msg, "--draft-model /nonexistent/drafter") != NULL);
    ro.ep = 2; /* with --ep (a drafter per rank) the same: refused before any rank is made */
    memset(&err, 0, sizeof err);
    rt = (eg_runtime *)1;
    CHECK(eg_runtime_create(&ro, &rt, &err) != EG_OK);
    CHECK(rt == NULL || rt == (eg_runtime *)1);
    CHECK(strstr(err.msg, "--draft-model /nonexistent/drafter") != NULL);
    eg_model_free(&m);
}

static const eg_test tests[] = {
    {"identity", test_identity},
    {"load_refuses", test_load_refuses},
};
EG_TEST_MAIN("gen_draft", tests)
