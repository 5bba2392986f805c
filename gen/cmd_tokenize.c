/* eaglegen tokenize — JSONL in, token ids out, through the same corpus reader, chat
 * template and tokenizer that `generate` uses (prompts/corpus.h), so what it prints is
 * exactly what the model would be fed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/commands.h"
#include "prompts/corpus.h"
#include "prompts/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen tokenize --tokenizer DIR [options] [FILE...]\n"
            "\n"
            "Reads JSONL records (from FILEs, plain or .gz/.zst/.xz/.bz2, or stdin when none or\n"
            "\"-\" is given) and writes one JSON line per record to stdout, in input order:\n"
            "  {\"text\": ...}                          -> {\"ids\": [...]}  (encoded as is, no template)\n"
            "  {\"messages\"|\"conversations\": [...]}  -> {\"rendered\": \"...\", \"ids\": [...]}\n"
            "  {\"prompt\": ...}                        -> {\"rendered\": \"...\", \"ids\": [...]}  (one user turn)\n"
            "  {\"input_ids\": [...]}                   -> {\"rendered\": decoded text, \"ids\": [...]}\n"
            "Conversations are rendered whole with the Kimi-K2.5 chat template (docs/PROMPTS.md);\n"
            "special-token text (\"<|im_end|>\") is always recognised. Blank lines are skipped.\n"
            "\n"
            "options:\n"
            "  --tokenizer DIR          directory with tiktoken.model and tokenizer_config.json (required)\n"
            "  --chat                   render {\"text\"} records as one user turn as well\n"
            "  --thinking on|off        thinking mode (default on): generation prompt \"<think>\",\n"
            "                           or \"<think></think>\" and reasoning hidden when off\n"
            "  --no-generation-prompt   do not append \"<|im_assistant|>assistant<|im_middle|><think>\"\n"
            "  --loss-mask              add \"loss_mask\": [0/1 per id], 1 on assistant spans (capture rule)\n"
            "  --allow-media            drop image/video content parts instead of failing\n"
            "  -h, --help               this help\n"
            "\n"
            "A bad record stops the run with \"FILE:LINE: reason\" on stderr and exit status 1.\n"
            "Exit status: 0 ok, 1 bad input or I/O failure, 2 usage error.\n");
}

static void put_ids(FILE *o, const int32_t *ids, size_t n) {
    fputc('[', o);
    for (size_t i = 0; i < n; i++) fprintf(o, i ? ", %d" : "%d", ids[i]);
    fputc(']', o);
}

int cmd_tokenize(int argc, char **argv) {
    const char *tokdir = NULL;
    corpus_opts o;
    corpus_opts_default(&o);
    o.mode = CORPUS_RENDER;
    int want_mask = 0;
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    size_t n_files = 0;
    if (!files) { fprintf(stderr, "eaglegen tokenize: out of memory\n"); return 1; }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(files);
            return 0;
        } else if (!strcmp(a, "--tokenizer") || !strncmp(a, "--tokenizer=", 12)) {
            if (a[11] == '=') tokdir = a + 12;
            else if (i + 1 < argc) tokdir = argv[++i];
            else { fprintf(stderr, "eaglegen tokenize: --tokenizer needs a directory\n"); free(files); return 2; }
        } else if (!strcmp(a, "--thinking") || !strncmp(a, "--thinking=", 11)) {
            const char *v = a[10] == '=' ? a + 11 : (i + 1 < argc ? argv[++i] : "");
            if (!strcmp(v, "on")) o.thinking = 1;
            else if (!strcmp(v, "off")) o.thinking = 0;
            else { fprintf(stderr, "eaglegen tokenize: --thinking takes on or off, not '%s'\n", v); free(files); return 2; }
        } else if (!strcmp(a, "--chat")) {
            o.text_as_user = 1;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            o.add_generation_prompt = 0;
        } else if (!strcmp(a, "--loss-mask")) {
            want_mask = 1;
        } else if (!strcmp(a, "--allow-media")) {
            o.text_only = 0;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "eaglegen tokenize: unknown option '%s' (see --help)\n", a);
            free(files);
            return 2;
        } else {
            files[n_files++] = a;
        }
    }
    if (!tokdir) {
        fprintf(stderr, "eaglegen tokenize: --tokenizer DIR is required (see --help)\n");
        free(files);
        return 2;
    }
    if (!n_files) files[n_files++] = "-";

    eg_error err = {0};
    tok_tokenizer *tok = NULL;
    corpus_reader *r = NULL;
    corpus_record rec = {0};
    int rc = 0;
    if (tok_load(tokdir, &tok, &err) || corpus_open(files, n_files, tok, &o, &r, &err)) {
        fprintf(stderr, "eaglegen tokenize: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    static char obuf[1 << 16];
    setvbuf(stdout, obuf, _IOFBF, sizeof obuf);
    bool got;
    eg_status st;
    while (!(st = corpus_next(r, &rec, &got, &err)) && got) {
        if (!rec.ok) {
            fprintf(stderr, "eaglegen tokenize: %s:%llu: %s\n", strcmp(rec.file, "-") ? rec.file : "stdin",
                    (unsigned long long)rec.line, rec.reason);
            rc = 1;
            goto done;
        }
        fputc('{', stdout);
        if (rec.format == CORPUS_FMT_INPUT_IDS) {
            char *txt;
            size_t n;
            if (tok_decode(tok, rec.ids.ids, rec.ids.n, &txt, &n, &err)) {
                fprintf(stderr, "eaglegen tokenize: %s:%llu: %s\n", rec.file, (unsigned long long)rec.line, err.msg);
                rc = 1;
                goto done;
            }
            fputs("\"rendered\": ", stdout);
            corpus_put_json_string(stdout, txt, n);
            fputs(", ", stdout);
            free(txt);
        } else if (!(rec.format == CORPUS_FMT_TEXT && !o.text_as_user)) {
            fputs("\"rendered\": ", stdout);
            corpus_put_json_string(stdout, rec.render.text, rec.render.len);
            fputs(", ", stdout);
        }
        fputs("\"ids\": ", stdout);
        put_ids(stdout, rec.ids.ids, rec.ids.n);
        if (want_mask) {
            fputs(", \"loss_mask\": [", stdout);
            for (size_t i = 0; i < rec.ids.n; i++) fputs(i ? (rec.loss_mask[i] ? ", 1" : ", 0") : (rec.loss_mask[i] ? "1" : "0"), stdout);
            fputc(']', stdout);
        }
        fputs("}\n", stdout);
    }
    if (st) {
        fprintf(stderr, "eaglegen tokenize: %s\n", err.msg);
        rc = 1;
    }
done:
    if (fflush(stdout) || ferror(stdout)) {
        fprintf(stderr, "eaglegen tokenize: error writing to stdout\n");
        rc = 1;
    }
    corpus_record_free(&rec);
    corpus_close(r);
    tok_free(tok);
    free(files);
    return rc;
}
