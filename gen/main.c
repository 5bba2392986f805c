/* eaglegen — generates EAGLE-3 drafter training data from Kimi-K2.5 / DeepSeek-V3
 * models. This file only dispatches to the subcommands (gen/commands.h). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "gen/commands.h"
#include "gen/version.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"generate", cmd_generate, "run the target model over a prompt corpus and write a dataset"},
    {"merge", cmd_merge, "merge the datasets of several workers into one"},
    {"repair", cmd_repair, "set damaged shards aside so a rerun regenerates exactly their samples"},
    {"inspect", cmd_inspect, "summarise or verify a dataset (--verify, --json)"},
    {"vocab", cmd_vocab, "build an EAGLE-3 draft vocabulary (d2t/t2d) from a dataset"},
    {"export", cmd_export, "write a dataset in SpecForge's or speculators' own layout"},
    {"tokenize", cmd_tokenize, "tokenize JSONL text or conversations with the Kimi chat template"},
    {"forward", cmd_forward, "teacher-forced hidden states and logits for token prompts"},
    {"fidelity", cmd_fidelity, "measure a precision choice against the reference; audit a dataset"},
    {"mkmodel", cmd_mkmodel, "write a random-weights model (or EAGLE-3 drafter) in the Hugging Face layout"},
    {"bench", cmd_bench, "measure prefill and decode tokens/s"},
    {"plan", cmd_plan, "pipeline stage split and per-GPU memory plan (KV capacity)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: eaglegen COMMAND [options]   (eaglegen COMMAND --help for its options;\n"
               "       eaglegen --version)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    /* generate turns SIGINT/SIGTERM into "commit and exit 130"; until its handler is
     * installed (cmd_generate's first lines) they stay pending instead of killing the
     * process with 143. Every other command gets the default action back at once. */
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGINT);
    sigaddset(&ss, SIGTERM);
    sigprocmask(SIG_BLOCK, &ss, NULL);
    if (argc < 2 || strcmp(argv[1], "generate")) sigprocmask(SIG_UNBLOCK, &ss, NULL);
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("eaglegen %s\n", gen_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].fn(argc - 1, argv + 1);
            /* what a command printed to stdout (a table, JSON, a --help) must have reached
               it: a full disk or a closed pipe behind > out.json is a failure, not exit 0 */
            if ((fflush(stdout) || ferror(stdout)) && rc == 0) {
                fprintf(stderr, "eaglegen %s: error writing to stdout: %s\n", argv[1], strerror(errno));
                rc = 1;
            }
            return rc;
        }
    fprintf(stderr, "eaglegen: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
