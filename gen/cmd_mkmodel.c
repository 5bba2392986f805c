/* eaglegen mkmodel: write a random-weights model in the Hugging Face layout (see
 * engine/mkmodel.h for what is written and how the weights are drawn). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/mkmodel.h"
#include "gen/commands.h"

static void mk_usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen mkmodel --preset NAME --out DIR [options]\n"
            "       eaglegen mkmodel --preset NAME --dry-run [options]\n"
            "\n"
            "Write a random-weights model in Kimi-K2.5's checkpoint layout: nested\n"
            "config.json, model.safetensors.index.json + shards (tensors prefixed\n"
            "language_model.), a byte-level tiktoken.model and tokenizer_config.json with\n"
            "Kimi's special tokens. The same preset, seed and options always give the same\n"
            "bytes.\n"
            "\n"
            "presets:\n"
            "  tiny           64 hidden, 5 layers (layer 0 dense), 16 experts top-4, group\n"
            "                 routing, YaRN, vocab 512 (256 bytes + 256 specials); ~1 MB\n"
            "  moonlight-16b  Moonlight-16B-A3B: 27 layers, hidden 2048, 64 experts top-6,\n"
            "                 2 shared, no q LoRA, vocab 163840 (use --layers; 2 layers\n"
            "                 ~1.9 GB with INT4 experts)\n"
            "  kimi-k2.5      Kimi-K2.5's real text dimensions: 61 layers, hidden 7168,\n"
            "                 384 experts top-8, vocab 163840 (~595 GB in full: use\n"
            "                 --layers; each MoE layer is ~9.8 GB with INT4 experts)\n"
            "\n"
            "options:\n"
            "  --preset NAME       tiny, moonlight-16b or kimi-k2.5 (required)\n"
            "  --out DIR           output directory (created if missing)\n"
            "  --seed S            RNG seed (default 0)\n"
            "  --layers N          num_hidden_layers (default: the preset's)\n"
            "  --experts int4|bf16 routed expert format (default int4: compressed-tensors\n"
            "                      pack-quantized, group 32, as Kimi-K2.5 ships)\n"
            "  --shard-mb N        start a new shard above N MB (default 4096)\n"
            "  --threads N         worker threads (default: $EG_THREADS or all CPUs)\n"
            "  --no-weights        write config.json and the tokenizer files only\n"
            "  --sparse            all-zero weights stored as file holes: the full layout\n"
            "                      (e.g. all 595 GB of kimi-k2.5) at no disk cost, to test\n"
            "                      loading; the model computes nothing useful\n"
            "  --dry-run           print the tensor plan (name dtype [shape] bytes shard)\n"
            "                      and totals; write nothing\n"
            "  --print-config      print the config.json the preset would write\n"
            "  --help              this text\n");
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < 0) return -1;
    *out = v;
    return 0;
}

int cmd_mkmodel(int argc, char **argv) {
    eg_mkmodel_opts o = {0};
    int dry = 0, print_cfg = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            mk_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dry-run")) {
            dry = 1;
        } else if (!strcmp(a, "--sparse")) {
            o.sparse = 1;
        } else if (!strcmp(a, "--no-weights")) {
            o.no_weights = 1;
        } else if (!strcmp(a, "--print-config")) {
            print_cfg = 1;
        } else if (!v) {
            static const char *const valued[] = {"--preset", "--out", "--seed", "--layers", "--experts", "--shard-mb",
                                                 "--threads"};
            int known = 0;
            for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
            if (known) fprintf(stderr, "eaglegen mkmodel: %s needs a value (see --help)\n", a);
            else fprintf(stderr, "eaglegen mkmodel: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (!strcmp(a, "--preset")) {
            o.preset = v, i++;
        } else if (!strcmp(a, "--out")) {
            o.out_dir = v, i++;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o.seed = strtoull(v, &end, 0);
            if (errno || *end || end == v || !(*v >= '0' && *v <= '9')) { /* strtoull takes "-1" and wraps */
                fprintf(stderr, "eaglegen mkmodel: bad --seed '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--layers")) {
            if (parse_i64(v, &x) || x < 1 || x > 100000) {
                fprintf(stderr, "eaglegen mkmodel: bad --layers '%s'\n", v);
                return 2;
            }
            o.layers = (int)x, i++;
        } else if (!strcmp(a, "--experts")) {
            if (!strcmp(v, "int4")) o.experts = EG_MK_EXPERTS_INT4;
            else if (!strcmp(v, "bf16")) o.experts = EG_MK_EXPERTS_BF16;
            else {
                fprintf(stderr, "eaglegen mkmodel: --experts must be int4 or bf16\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--shard-mb")) {
            if (parse_i64(v, &x) || x < 1 || x > ((int64_t)1 << 30)) {
                fprintf(stderr, "eaglegen mkmodel: bad --shard-mb '%s'\n", v);
                return 2;
            }
            o.shard_bytes = x * 1000 * 1000, i++;
        } else if (!strcmp(a, "--threads")) {
            if (parse_i64(v, &x) || x < 1 || x > 4096) {
                fprintf(stderr, "eaglegen mkmodel: bad --threads '%s'\n", v);
                return 2;
            }
            o.threads = (int)x, i++;
        } else {
            fprintf(stderr, "eaglegen mkmodel: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o.preset) {
        fprintf(stderr, "eaglegen mkmodel: --preset is required (see --help)\n");
        return 2;
    }
    eg_error err = {0};
    if (print_cfg) {
        char *js;
        if (eg_mkmodel_config_json(&o, &js, &err)) {
            fprintf(stderr, "eaglegen mkmodel: %s\n", err.msg);
            return err.code == EG_ERR_INVALID ? 2 : 1;
        }
        printf("%s\n", js);
        free(js);
        return 0;
    }
    if (dry) {
        eg_mkmodel_plan_info info;
        if (eg_mkmodel_plan(&o, &info, stdout, &err)) {
            fprintf(stderr, "eaglegen mkmodel: %s\n", err.msg);
            return err.code == EG_ERR_INVALID ? 2 : 1;
        }
        return 0;
    }
    if (!o.out_dir) {
        fprintf(stderr, "eaglegen mkmodel: --out is required (or --dry-run; see --help)\n");
        return 2;
    }
    o.log = stderr;
    eg_mkmodel_plan_info info;
    double t0 = eg_now();
    if (eg_mkmodel_run(&o, &info, &err)) {
        fprintf(stderr, "eaglegen mkmodel: %s\n", err.msg);
        return err.code == EG_ERR_INVALID ? 2 : 1;
    }
    if (o.no_weights) {
        fprintf(stderr, "mkmodel: %s: preset %s, config.json and tokenizer only (vocab %d)\n",
                o.out_dir, o.preset, info.vocab);
        return 0;
    }
    fprintf(stderr,
            "mkmodel: %s: preset %s, %d layers, vocab %d, %" PRId64 " tensors, %.1f MB in %d "
            "shard(s), %.1f s\n",
            o.out_dir, o.preset, info.n_layers, info.vocab, info.n_tensors,
            (double)info.total_bytes / 1e6, info.n_shards, eg_now() - t0);
    return 0;
}
