/* eaglegen merge — combine the datasets of several workers into one manifest. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "dataset/manifest.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen merge DIR [DIR...] --out DIR\n"
            "\n"
            "Combines the manifests of worker datasets (manifest.w{I}of{N}.json files, or merged\n"
            "manifest.json files) found in each DIR into OUT/manifest.json. Descriptions (model,\n"
            "tokenizer, template, aux layers) must agree; shards living elsewhere are hard-linked or\n"
            "copied into OUT (a plain dataset's shards as in{D}-NAME, D = the DIR's position);\n"
            "duplicate sample ids are refused. OUT may be one of the DIRs (workers that wrote into\n"
            "one shared directory), or hold an earlier merge of the same DIRs (merge again after\n"
            "workers resumed). All or nothing: on failure, nothing new is left in OUT.\n"
            "\n"
            "options:\n"
            "  --out DIR      the merged dataset directory (required)\n"
            "  -h, --help     this text\n");
}

int cmd_merge(int argc, char **argv) {
    const char *out = NULL;
    static const struct option opts[] = {{"out", 1, 0, 'o'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!out || optind >= argc) {
        fprintf(stderr, "eaglegen merge: need at least one DIR and --out (see --help)\n");
        return 2;
    }
    eg_error err = {0};
    if (dataset_merge((const char *const *)(argv + optind), argc - optind, out, &err)) {
        fprintf(stderr, "eaglegen merge: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "eaglegen merge: %d input%s -> %s/manifest.json\n", argc - optind, argc - optind > 1 ? "s" : "", out);
    return 0;
}
