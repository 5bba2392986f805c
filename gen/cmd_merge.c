/* eaglegen merge — combine the datasets of several workers into one manifest. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/manifest.h"
#include "gen/args.h"
#include "gen/commands.h"
#include "gen/merge_check.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen merge DIR [DIR...] --out DIR [--allow-partial]\n"
            "\n"
            "Combines the manifests of worker datasets (manifest.w{I}of{N}.json files, or merged\n"
            "manifest.json files) found in each DIR into OUT/manifest.json. Descriptions (model,\n"
            "tokenizer, template, aux layers) must agree; shards living elsewhere are hard-linked or\n"
            "copied into OUT (a plain dataset's shards as in{D}-NAME, D = the DIR's position);\n"
            "duplicate sample ids are refused. OUT may be one of the DIRs (workers that wrote into\n"
            "one shared directory), or hold an earlier merge of the same DIRs (merge again after\n"
            "workers resumed) or of fewer (each of its shards is kept); an OUT holding a single\n"
            "writer's dataset, or a merge of other inputs, is refused, its manifest left as it\n"
            "was. All or nothing: on failure, nothing new is left in OUT.\n"
            "\n"
            "The inputs must be one body of data: every job's sampling, lengths, seed, model,\n"
            "tokenizer, template and aux layers agree (a mix is refused, listing the differences);\n"
            "every worker I of N of a job is there once, and each says it finished its share.\n"
            "\n"
            "options:\n"
            "  --out DIR         the merged dataset directory (required)\n"
            "  --allow-partial   merge even with workers missing or unfinished (stopped at --limit,\n"
            "                    interrupted, failed, still running); the manifest records which\n"
            "  -h, --help        this text\n");
}

int cmd_merge(int argc, char **argv) {
    const char *out = NULL;
    int allow_partial = 0;
    static const struct option opts[] = {
        {"out", 1, 0, 'o'}, {"allow-partial", 0, 0, 'P'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    optind = 1;
    int ch;
    while ((ch = gen_getopt(argc, argv, "merge", "h", opts)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 'P': allow_partial = 1; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    if (!out || optind >= argc) {
        fprintf(stderr, "eaglegen merge: missing %s%s%s (usage: eaglegen merge DIR [DIR...] --out DIR)\n",
                optind >= argc ? "the input DIRs" : "", optind >= argc && !out ? " and " : "", !out ? "--out" : "");
        return 2;
    }
    eg_error err = {0};
    const char *const *dirs = (const char *const *)(argv + optind);
    char *note = NULL;
    if (gen_merge_check(dirs, argc - optind, allow_partial, stderr, &note, &err) ||
        dataset_merge_note(dirs, argc - optind, out, note, &err)) {
        fprintf(stderr, "eaglegen merge: %s\n", err.msg);
        free(note);
        return 1;
    }
    free(note);
    fprintf(stderr, "eaglegen merge: %d input%s -> %s/manifest.json\n", argc - optind, argc - optind > 1 ? "s" : "", out);
    return 0;
}
