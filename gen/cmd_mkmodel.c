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
            "       eaglegen mkmodel --drafter-for MODEL_DIR --out DIR [drafter options]\n"
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
            "  --shard-mb N        start a new shard above N MiB (N x 2^20 bytes; default 4096)\n"
            "  --threads N         worker threads (default: $EG_THREADS or all CPUs)\n"
            "  --no-weights        write config.json and the tokenizer files only\n"
            "                      (a model already in --out is replaced: its index goes first)\n"
            "  --sparse            all-zero weights stored as file holes: the full layout\n"
            "                      (e.g. all 595 GB of kimi-k2.5) at no disk cost, to test\n"
            "                      loading; the model computes nothing useful\n"
            "  --dry-run           print the tensor plan (name dtype [shape] bytes shard)\n"
            "                      and totals; write nothing\n"
            "  --print-config      print the config.json the preset would write\n"
            "  --help              this text\n"
            "\n"
            "EAGLE-3 drafter (--drafter-for): a random drafter for MODEL_DIR in SpecForge's\n"
            "LlamaForCausalLMEagle3 layout (config.json + model.safetensors, BF16; docs/ENGINE.md\n"
            "\"Drafter (EAGLE-3)\"), hidden size and vocabulary matching the model's:\n"
            "  --drafter-for DIR   the target model directory\n"
            "  --out DIR           output directory (created if missing; required)\n"
            "  --seed S            RNG seed (default 0)\n"
            "  --draft-vocab N     draft vocabulary size (default min(V, 32000)): the lowest N\n"
            "                      ids unless --vocab is given\n"
            "  --vocab DIR         take d2t from DIR/d2t.npy (what `eaglegen vocab` writes); its\n"
            "                      length is the draft vocabulary\n"
            "  --aux-layers LIST   comma-separated aux layers (output-of-layer ids, ascending;\n"
            "                      default the model's default [1, L/2-1, L-4])\n"
            "  --no-embed          leave out embed_tokens.weight (the drafter then uses the\n"
            "                      target's embedding, as trainers that freeze it may ship)\n"
            "  --mla               vLLM's Eagle3DeepseekV2ForCausalLM layout instead: the layer's\n"
            "                      attention is MLA with the model's q_lora / kv_lora / head dims\n"
            "                      and RoPE (as lightseekorg/kimi-k2.5-eagle3-mla); its cache is\n"
            "                      the latent, (kv_lora + rope) BF16 values per position\n"
            "  --fc-norm           with vLLM's fc_norm: an RMSNorm per aux row before fc\n"
            "                      (fc_norm.{i}.weight, \"fc_norm\": true)\n");
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < 0) return -1;
    *out = v;
    return 0;
}

/* d2t.npy as `eaglegen vocab` writes it: NPY 1.0/2.0, '<i8', C order, shape (N,).
 * *out malloc'd. */
static int read_d2t_npy(const char *dir, int64_t **out, int *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/d2t.npy", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "eaglegen mkmodel: %s: %s\n", path, strerror(errno));
        return 1;
    }
    unsigned char pre[12];
    size_t hl = 0, off = 0;
    int ok = fread(pre, 1, 10, f) == 10 && !memcmp(pre, "\x93NUMPY", 6);
    if (ok && pre[6] == 1) hl = (size_t)pre[8] | (size_t)pre[9] << 8, off = 10;
    else if (ok && pre[6] >= 2 && fread(pre + 10, 1, 2, f) == 2)
        hl = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24, off = 12;
    else ok = 0;
    char *h = ok && hl < 65536 ? calloc(1, hl + 1) : NULL;
    long long N = -1;
    if (h && fread(h, 1, hl, f) == hl) {
        const char *sp = strstr(h, "'shape':");
        ok = strstr(h, "'descr': '<i8'") && strstr(h, "'fortran_order': False") && sp &&
             sscanf(sp, "'shape': (%lld,)", &N) == 1 && N > 0 && N < (1 << 30);
    } else ok = 0;
    free(h);
    int64_t *d = ok ? malloc(sizeof *d * (size_t)N) : NULL;
    if (d && fread(d, sizeof *d, (size_t)N, f) == (size_t)N && fgetc(f) == EOF) {
        *out = d, *n = (int)N;
        fclose(f);
        return 0;
    }
    free(d);
    fclose(f);
    fprintf(stderr, "eaglegen mkmodel: %s: not an int64 [N] .npy file (as `eaglegen vocab` writes; %zu-byte preamble)\n",
            path, off);
    return 1;
}

static int mk_drafter(int argc, char **argv) {
    eg_mkdrafter_opts o = {0};
    const char *vocab = NULL;
    int aux[256], n_aux = 0, rc = 2;
    int64_t *d2t = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x;
        if (!strcmp(a, "--no-embed")) {
            o.no_embed = 1;
            continue;
        }
        if (!strcmp(a, "--mla")) {
            o.mla = 1;
            continue;
        }
        if (!strcmp(a, "--fc-norm")) {
            o.fc_norm = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            mk_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--drafter-for") && strcmp(a, "--out") && strcmp(a, "--seed") && strcmp(a, "--draft-vocab") &&
            strcmp(a, "--vocab") && strcmp(a, "--aux-layers")) {
            fprintf(stderr, "eaglegen mkmodel: '%s' is not a --drafter-for option (see --help)\n", a);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "eaglegen mkmodel: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--drafter-for")) o.target_dir = v;
        else if (!strcmp(a, "--out")) o.out_dir = v;
        else if (!strcmp(a, "--vocab")) vocab = v;
        else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o.seed = strtoull(v, &end, 10); /* decimal, as generate --seed: "010" is ten */
            if (errno || *end || end == v || !(*v >= '0' && *v <= '9')) {
                fprintf(stderr, "eaglegen mkmodel: bad --seed '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--draft-vocab")) {
            if (parse_i64(v, &x) || x < 1 || x > (1 << 30)) {
                fprintf(stderr, "eaglegen mkmodel: bad --draft-vocab '%s'\n", v);
                return 2;
            }
            o.draft_vocab = (int)x;
        } else { /* --aux-layers */
            n_aux = 0;
            const char *p = v;
            for (;;) {
                char *end;
                errno = 0;
                long l = strtol(p, &end, 10);
                if (errno || end == p || l < 0 || l > 1000000 || (*end && *end != ',') ||
                    n_aux == (int)(sizeof aux / sizeof aux[0]) || (n_aux && l <= aux[n_aux - 1])) {
                    fprintf(stderr, "eaglegen mkmodel: bad --aux-layers '%s' (ascending distinct layer ids, e.g. 1,29,57)\n", v);
                    return 2;
                }
                aux[n_aux++] = (int)l;
                if (!*end) break;
                p = end + 1;
            }
        }
    }
    if (!o.out_dir) {
        fprintf(stderr, "eaglegen mkmodel: --drafter-for needs --out DIR (see --help)\n");
        return 2;
    }
    if (vocab && o.draft_vocab) {
        fprintf(stderr, "eaglegen mkmodel: --vocab sets the draft vocabulary; drop --draft-vocab\n");
        return 2;
    }
    if (vocab) {
        if (read_d2t_npy(vocab, &d2t, &o.draft_vocab)) return 1;
        o.d2t = d2t;
    }
    o.n_aux = n_aux;
    o.aux_layers = aux;
    eg_error err = {0};
    double t0 = eg_now();
    if (eg_mkmodel_drafter(&o, &err)) {
        fprintf(stderr, "eaglegen mkmodel: %s\n", err.msg);
        rc = err.code == EG_ERR_INVALID ? 2 : 1;
    } else {
        fprintf(stderr, "mkmodel: %s: EAGLE-3 drafter for %s, %.1f s\n", o.out_dir, o.target_dir, eg_now() - t0);
        rc = 0;
    }
    free(d2t);
    return rc;
}

int cmd_mkmodel(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--drafter-for")) return mk_drafter(argc, argv);
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
            o.seed = strtoull(v, &end, 10); /* decimal, as generate --seed: "010" is ten */
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
            o.shard_bytes = x << 20, i++; /* MiB: the default (0) is 4 GiB */
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
