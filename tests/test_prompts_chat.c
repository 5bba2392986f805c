/* Chat template: every record of ../shared/fixtures/tokenizer/chat.jsonl rendered and
 * tokenised exactly (through corpus_parse, the path `generate` uses), loss masks in
 * capture mode, the regenerate-mode cut, and the template rules the fixture lacks. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/eg_common.h"
#include "prompts/chat.h"
#include "prompts/corpus.h"
#include "prompts/tokenizer.h"
#include "tests/check.h"
#include "tests/tok_fixture.h"



static void test_chat_fixtures(void) {
    FILE *f = fopen(TOKDIR "/chat.jsonl", "r");
    CHECK(f != NULL);
    if (!f) return;
    char *line = NULL;
    size_t cap = 0, n_rec = 0, n_text = 0, n_ids = 0;
    ssize_t n;
    eg_error err = {0};
    corpus_record rec = {0};
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *r = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        CHECK(r != NULL);
        if (!r) continue;
        n_rec++;
        const char *name = json_string_value(json_object_get(r, "name"));
        json_t *want_ids = json_object_get(r, "ids");
        json_t *want = json_object_get(r, "rendered");
        /* feed the record as a corpus line {"messages": ...} in RENDER mode */
        json_t *in = json_object();
        json_object_set(in, "messages", json_object_get(r, "messages"));
        char *js = json_dumps(in, JSON_COMPACT);
        corpus_opts o;
        corpus_opts_default(&o);
        o.mode = CORPUS_RENDER;
        o.thinking = json_is_true(json_object_get(r, "thinking"));
        o.add_generation_prompt = json_is_true(json_object_get(r, "add_generation_prompt"));
        rec.file = "chat.jsonl";
        rec.line = n_rec;
        CHECK_OK(corpus_parse(tok(), &o, js, strlen(js), &rec, &err), &err);
        CHECKF(rec.ok, "%s: rejected: %s", name, rec.reason);
        if (rec.ok) {
            int same = rec.render.len == json_string_length(want) &&
                       !memcmp(rec.render.text, json_string_value(want), rec.render.len);
            CHECKF(same, "%s: rendered\n      %s\n    want\n      %s", name, rec.render.text, json_string_value(want));
            n_text += same;
            int ids_same = rec.ids.n == json_array_size(want_ids);
            for (size_t i = 0; ids_same && i < rec.ids.n; i++)
                ids_same = rec.ids.ids[i] == json_integer_value(json_array_get(want_ids, i));
            CHECKF(ids_same, "%s: ids differ (%zu vs %zu)", name, rec.ids.n, json_array_size(want_ids));
            n_ids += ids_same;
            /* the ids are the tokenizer's encoding of the rendered string */
            tok_seq s = {0};
            CHECK_OK(tok_encode(tok(), json_string_value(want), json_string_length(want), TOK_ALLOW_SPECIAL, &s, &err), &err);
            CHECK(s.n == rec.ids.n && !memcmp(s.ids, rec.ids.ids, s.n * sizeof *s.ids));
            tok_seq_free(&s);
        }
        free(js);
        json_decref(in);
        json_decref(r);
    }
    free(line);
    fclose(f);
    corpus_record_free(&rec);
    CHECK(n_rec >= 13);
    CHECK(n_text == n_rec && n_ids == n_rec);
    printf("    chat.jsonl: %zu/%zu rendered strings and %zu/%zu id lists match exactly\n", n_text, n_rec, n_ids, n_rec);
}

/* Parse one corpus line in a mode; returns the record (caller frees). */
static corpus_record parse(const char *line, corpus_mode mode, int thinking) {
    corpus_record rec = {0};
    corpus_opts o;
    corpus_opts_default(&o);
    o.mode = mode;
    o.thinking = thinking;
    eg_error err = {0};
    rec.file = "t.jsonl";
    rec.line = 7;
    CHECK_OK(corpus_parse(tok(), &o, line, strlen(line), &rec, &err), &err);
    return rec;
}

/* The masked tokens decode to exactly the concatenated assistant spans. */
static void expect_mask(const char *line, const char *want_masked) {
    corpus_record rec = parse(line, CORPUS_CAPTURE, 1);
    CHECKF(rec.ok, "rejected: %s", rec.reason);
    if (rec.ok) {
        size_t cap = 0;
        int32_t *m = malloc(rec.ids.n * sizeof *m + 4);
        for (size_t i = 0; i < rec.ids.n; i++)
            if (rec.loss_mask[i]) m[cap++] = rec.ids.ids[i];
        char *out;
        size_t n;
        eg_error err = {0};
        CHECK_OK(tok_decode(tok(), m, cap, &out, &n, &err), &err);
        CHECKF(n == strlen(want_masked) && !memcmp(out, want_masked, n), "masked text\n      %s\n    want\n      %s", out,
               want_masked);
        /* mask agrees with the id-scan rule when content has no special text */
        uint8_t *m2 = NULL;
        CHECK_OK(chat_mask_from_ids(tok(), rec.ids.ids, rec.ids.n, &m2, &err), &err);
        CHECK(!memcmp(m2, rec.loss_mask, rec.ids.n));
        free(m2);
        free(out);
        free(m);
    }
    corpus_record_free(&rec);
}

static void test_loss_mask(void) {
    expect_mask("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello there.\"}]}",
                "<think></think>Hello there.<|im_end|>");
    expect_mask("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Q1\"},"
                "{\"role\":\"assistant\",\"content\":\"A1\"},{\"role\":\"user\",\"content\":\"Q2\"},"
                "{\"role\":\"assistant\",\"content\":\"A2\",\"reasoning_content\":\"r2\"}]}",
                "<think></think>A1<|im_end|><think></think>A2<|im_end|>");
    /* named assistant: the name is in the (unmasked) header */
    expect_mask("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"name\":\"bot\",\"content\":\" y\"}]}",
                "<think></think> y<|im_end|>");
    /* tool flow: the tool-calling turn is in the suffix (reasoning shown); tool output unmasked */
    expect_mask("{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":\"\","
                "\"reasoning_content\":\"need tool\",\"tool_calls\":[{\"id\":\"functions.w:0\",\"type\":\"function\","
                "\"function\":{\"name\":\"w\",\"arguments\":{\"city\":\"Paris\"}}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"functions.w:0\",\"content\":\"18C\"}]}",
                "<think>need tool</think><|tool_calls_section_begin|><|tool_call_begin|>functions.w:0"
                "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>");
    /* special-token text inside an answer stays inside the span (offset-based mask) */
    corpus_record rec = parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"a<|im_end|>b\"}]}",
                              CORPUS_CAPTURE, 1);
    CHECK(rec.ok);
    size_t ones = 0;
    for (size_t i = 0; i < rec.ids.n; i++) ones += rec.loss_mask[i];
    /* <think> </think> a <|im_end|> b <|im_end|> */
    CHECKF(ones == 6, "masked %zu tokens, want 6", ones);
    CHECK(rec.loss_mask[rec.ids.n - 1] == 1 && rec.loss_mask[0] == 0);
    corpus_record_free(&rec);
}

static void expect_render(const char *line, corpus_mode mode, int thinking, const char *want) {
    corpus_record rec = parse(line, mode, thinking);
    CHECKF(rec.ok, "rejected: %s", rec.reason);
    if (rec.ok)
        CHECKF(rec.render.len == strlen(want) && !memcmp(rec.render.text, want, rec.render.len),
               "rendered\n      %s\n    want\n      %s", rec.render.text, want);
    corpus_record_free(&rec);
}

static void test_template_rules(void) {
    const char *conv = "{\"messages\":[{\"role\":\"user\",\"content\":\"Q1\"},{\"role\":\"assistant\",\"content\":\"A1\"},"
                       "{\"role\":\"user\",\"content\":\"Q2\"},{\"role\":\"assistant\",\"content\":\"A2\"}]}";
    /* regenerate: cut after the last user message, generation prompt appended */
    expect_render(conv, CORPUS_REGENERATE, 1,
                  "<|im_user|>user<|im_middle|>Q1<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
                  "<|im_user|>user<|im_middle|>Q2<|im_end|><|im_assistant|>assistant<|im_middle|><think>");
    expect_render(conv, CORPUS_REGENERATE, 0,
                  "<|im_user|>user<|im_middle|>Q1<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
                  "<|im_user|>user<|im_middle|>Q2<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>");
    /* suffix assistant (after the last plain assistant) shows its reasoning; thinking off hides it */
    const char *suffix = "{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"c\","
                         "\"reasoning_content\":\"R\",\"tool_calls\":[{\"id\":\"t:0\",\"function\":{\"arguments\":\"{}\"}}]},"
                         "{\"role\":\"tool\",\"tool_call_id\":\"t:0\",\"name\":\"fn\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}]}";
    expect_render(suffix, CORPUS_CAPTURE, 1,
                  "<|im_user|>user<|im_middle|>Q<|im_end|><|im_assistant|>assistant<|im_middle|><think>R</think>c"
                  "<|tool_calls_section_begin|><|tool_call_begin|>t:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
                  "<|tool_calls_section_end|><|im_end|><|im_system|>fn<|im_middle|>## Return of t:0\nok<|im_end|>");
    expect_render(suffix, CORPUS_CAPTURE, 0,
                  "<|im_user|>user<|im_middle|>Q<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>c"
                  "<|tool_calls_section_begin|><|tool_call_begin|>t:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
                  "<|tool_calls_section_end|><|im_end|><|im_system|>fn<|im_middle|>## Return of t:0\nok<|im_end|>");
    /* ShareGPT and {"prompt"} */
    expect_render("{\"conversations\":[{\"from\":\"system\",\"value\":\"S\"},{\"from\":\"human\",\"value\":\"H\"},{\"from\":\"gpt\",\"value\":\"G\"}]}",
                  CORPUS_REGENERATE, 1,
                  "<|im_system|>system<|im_middle|>S<|im_end|><|im_user|>user<|im_middle|>H<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|><think>");
    expect_render("{\"prompt\":\"P\"}", CORPUS_REGENERATE, 1,
                  "<|im_user|>user<|im_middle|>P<|im_end|><|im_assistant|>assistant<|im_middle|><think>");
    /* empty name falls back to the role (Jinja `name or role`) */
    expect_render("{\"messages\":[{\"role\":\"user\",\"name\":\"\",\"content\":\"x\"}]}", CORPUS_REGENERATE, 1,
                  "<|im_user|>user<|im_middle|>x<|im_end|><|im_assistant|>assistant<|im_middle|><think>");
}

static const eg_test tests[] = {
    {"chat_fixtures", test_chat_fixtures},
    {"loss_mask", test_loss_mask},
    {"template_rules", test_template_rules},
};

int main(int argc, char **argv) {
    int rc = eg_test_main("prompts_chat", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    tok_free(g_tok);
    return rc;
}
