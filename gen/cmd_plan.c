/* eaglegen plan — the pipeline split and per-GPU memory plan, for a checkpoint or a
 * preset's dimensions, next to the tensor-parallel layout that copies the latent
 * cache onto every GPU. Pure arithmetic: nothing is loaded onto a device. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/mkmodel.h"
#include "engine/plan.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen plan (--model DIR | --preset NAME) --stages N [options]\n"
            "\n"
            "Splits the layers into N pipeline stages balanced by bytes (weights, plus the BF16\n"
            "latent cache of each layer for --mean-len tokens per sequence), then prints each\n"
            "stage's weight bytes, free memory and KV capacity in tokens, the box-wide number of\n"
            "concurrent sequences, and the same for tensor parallelism over N GPUs (which keeps\n"
            "a full copy of the latent cache on every GPU). Concurrency is estimated from the\n"
            "expected sequence length (generate's default on-demand KV policy: a sequence holds\n"
            "the blocks it has filled, 1%% of the pool kept free), next to what reserving\n"
            "--prompt-len + --max-new per sequence would hold (--kv-policy reserve).\n"
            "\n"
            "options:\n"
            "  --model DIR         a checkpoint (exact stored bytes)\n"
            "  --preset NAME       tiny, moonlight-16b or kimi-k2.5 (bytes from the config)\n"
            "  --layers N          with --preset: override the layer count\n"
            "  --experts int4|bf16 with --preset: expert format (default int4)\n"
            "  --stages N          pipeline stages = GPUs (required)\n"
            "  --gpu-mem-gb F      memory per GPU in GB (default 96: RTX PRO 6000 Blackwell)\n"
            "  --mem-fraction F    share of it usable (default 0.92)\n"
            "  --act-gb F          activations and workspace per GPU in GB (default 3)\n"
            "  --mean-len N        expected sequence length, prompt + response (default 4096)\n"
            "  --workload lognormal:MEDIAN:SIGMA\n"
            "                      instead of --mean-len: responses of this distribution cut at\n"
            "                      --max-new, after --prompt-len prompt tokens\n"
            "  --prompt-len N      prompt tokens (default 1024)\n"
            "  --max-new N         generate's --max-new-tokens (default 32768)\n"
            "  -h, --help          this text\n");
}

int cmd_plan(int argc, char **argv) {
    const char *model_dir = NULL, *preset = NULL;
    int stages = 0, layers = 0;
    double gpu_gb = 96, frac = 0.92, act_gb = 3, mean_len = 4096;
    int experts = EG_MK_EXPERTS_INT4;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'},      {"preset", 1, 0, 'p'},       {"layers", 1, 0, 'l'}, {"experts", 1, 0, 'e'},
        {"stages", 1, 0, 's'},     {"gpu-mem-gb", 1, 0, 'g'},   {"mem-fraction", 1, 0, 'f'},
        {"act-gb", 1, 0, 'a'},     {"mean-len", 1, 0, 'n'},     {"help", 0, 0, 'h'},
        {"workload", 1, 0, 'w'},   {"prompt-len", 1, 0, 'P'},   {"max-new", 1, 0, 'M'}, {0, 0, 0, 0}};
    const char *workload = NULL;
    int prompt_len = 1024, max_new = 32768;
    optind = 1;
    int ch;
    while ((ch = gen_getopt(argc, argv, "plan", "h", opts)) != -1) {
        switch (ch) {
        case 'm': model_dir = optarg; break;
        case 'p': preset = optarg; break;
        case 'l': if (!gen_arg_int("plan", "--layers", optarg, 1, 1 << 20, &layers)) return 2; break;
        case 'e':
            if (!strcmp(optarg, "int4")) experts = EG_MK_EXPERTS_INT4;
            else if (!strcmp(optarg, "bf16")) experts = EG_MK_EXPERTS_BF16;
            else { fprintf(stderr, "eaglegen plan: --experts expects int4 or bf16\n"); return 2; }
            break;
        case 's': if (!gen_arg_int("plan", "--stages", optarg, 1, 4096, &stages)) return 2; break;
        case 'g': if (!gen_arg_double("plan", "--gpu-mem-gb", optarg, 0.001, 1e18, &gpu_gb)) return 2; break;
        case 'f': if (!gen_arg_double("plan", "--mem-fraction", optarg, 0.01, 1, &frac)) return 2; break;
        case 'a': if (!gen_arg_double("plan", "--act-gb", optarg, 0, 1e18, &act_gb)) return 2; break;
        case 'n': if (!gen_arg_double("plan", "--mean-len", optarg, 1, 1e18, &mean_len)) return 2; break;
        case 'w': workload = optarg; break;
        case 'P': if (!gen_arg_int("plan", "--prompt-len", optarg, 1, 1 << 30, &prompt_len)) return 2; break;
        case 'M': if (!gen_arg_int("plan", "--max-new", optarg, 1, 1 << 30, &max_new)) return 2; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    if (!!model_dir == !!preset || stages < 1) {
        fprintf(stderr, "eaglegen plan: give exactly one of --model or --preset, and --stages (see --help)\n");
        return 2;
    }
    eg_error err = {0};
    const char *len_from = "--mean-len";
    char len_buf[128];
    if (workload) {
        double med, sig;
        if (eg_plan_workload_parse(workload, &med, &sig, &err)) {
            fprintf(stderr, "eaglegen plan: --workload: %s\n", err.msg);
            return 2;
        }
        double resp = eg_plan_lognormal_mean_cut(med, sig, max_new);
        mean_len = prompt_len + resp;
        snprintf(len_buf, sizeof len_buf, "prompt %d + expected response %.0f of %s cut at %d", prompt_len, resp,
                 workload, max_new);
        len_from = len_buf;
    }
    eg_model m;
    memset(&m, 0, sizeof m);
    eg_config cfg;
    memset(&cfg, 0, sizeof cfg);
    const eg_config *c;
    int rc = 1, n = stages;
    int64_t *lb = NULL, head, tail;
    double *cost = NULL;
    int *ends = NULL;
    eg_stage_mem *sm = NULL;
    if (model_dir) {
        if (eg_model_load(model_dir, &m, &err)) goto out;
        c = &m.cfg;
    } else {
        eg_mkmodel_opts mo = {.preset = preset, .layers = layers, .experts = experts};
        char *json = NULL;
        if (eg_mkmodel_config_json(&mo, &json, &err)) goto out;
        eg_status st = eg_config_parse(json, strlen(json), preset, &cfg, &err);
        free(json);
        if (st) goto out;
        c = &cfg;
    }
    int L = c->n_layers;
    lb = malloc(sizeof *lb * (size_t)L);
    cost = malloc(sizeof *cost * (size_t)L);
    ends = malloc(sizeof *ends * (size_t)n);
    sm = malloc(sizeof *sm * (size_t)n);
    if (!lb || !cost || !ends || !sm) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto out; }
    head = model_dir ? eg_plan_head_bytes(&m, &tail) : eg_plan_head_bytes_cfg(c, &tail);
    int64_t kv_layer = eg_plan_kv_bytes_per_token_layer(c), total = head + tail;
    for (int l = 0; l < L; l++) {
        lb[l] = model_dir ? eg_plan_layer_bytes(&m, l) : eg_plan_layer_bytes_cfg(c, l);
        total += lb[l];
    }
    /* balance weights plus the cache for an even share of the box's sequences */
    double dev = gpu_gb * 1e9, tokens_guess = (dev * frac * n - (double)total - act_gb * 1e9 * n) / (double)(kv_layer * L);
    if (tokens_guess < 0) tokens_guess = 0;
    for (int l = 0; l < L; l++) cost[l] = (double)lb[l] + tokens_guess * (double)kv_layer;
    if (eg_plan_split(cost, L, (double)head, (double)tail, n, ends, &err)) goto out;
    eg_plan_memory(c, lb, head, tail, ends, n, (int64_t)dev, frac, (int64_t)(act_gb * 1e9), sm);
    printf("%s: %d layers, hidden %d, %d experts (%s), weights %.1f GB, BF16 latent cache %lld bytes/token/layer\n",
           model_dir ? model_dir : preset, L, c->hidden, c->n_experts,
           c->expert_format == EG_EXPERTS_INT4 ? "int4" : c->expert_format == EG_EXPERTS_FP8_BLOCK ? "fp8" : "bf16",
           (double)total / 1e9, (long long)kv_layer);
    printf("GPU memory %.1f GB x %.2f usable, %.1f GB activations per GPU\n\n", gpu_gb, frac, act_gb);
    printf("%-6s %-9s %12s %14s %12s %14s\n", "stage", "layers", "weights GB", "KV B/token", "free GB", "KV tokens");
    int64_t min_tokens = -1;
    for (int k = 0; k < n; k++) {
        char lay[32];
        snprintf(lay, sizeof lay, "%d-%d", sm[k].begin, sm[k].end - 1);
        printf("%-6d %-9s %12.2f %14lld %12.2f %14lld\n", k, lay, (double)sm[k].weight_bytes / 1e9,
               (long long)sm[k].kv_bytes_per_token, (double)sm[k].free_bytes / 1e9, (long long)sm[k].kv_tokens);
        if (min_tokens < 0 || sm[k].kv_tokens < min_tokens) min_tokens = sm[k].kv_tokens;
    }
    const double wm = 0.01; /* the engine's default admission watermark */
    printf("\npipeline (%d stages): %lld token slots box-wide, %.0f concurrent sequences at mean length %.0f (%s; on "
           "demand); reserving prompt %d + max_new %d each: %.0f\n",
           n, (long long)min_tokens, eg_plan_concurrency_on_demand(min_tokens, mean_len, wm), mean_len, len_from,
           prompt_len, max_new, eg_plan_concurrency_reserve(min_tokens, prompt_len, max_new));
    double tp_free = dev * frac - (double)total / n - act_gb * 1e9;
    double tp_tokens = tp_free > 0 ? tp_free / (double)(kv_layer * L) : 0;
    printf("tensor parallel (%d GPUs, latent cache on every GPU): %.0f token slots, %.0f concurrent sequences (on "
           "demand); reserving: %.0f\n",
           n, tp_tokens, eg_plan_concurrency_on_demand((int64_t)tp_tokens, mean_len, wm),
           eg_plan_concurrency_reserve((int64_t)tp_tokens, prompt_len, max_new));
    rc = 0;
    for (int k = 0; k < n && !rc; k++)
        if (sm[k].kv_tokens <= 0) { /* the table above shows by how much */
            eg_fail(&err, EG_ERR_NOMEM,
                    "stage %d does not fit: %.2f GB of weights, %.2f GB left for the KV cache on a %.1f GB GPU at "
                    "fraction %.2f (use more stages/GPUs, or larger GPUs)",
                    k, (double)sm[k].weight_bytes / 1e9, (double)sm[k].free_bytes / 1e9, gpu_gb, frac);
            rc = 1;
        }
out:
    if (rc) fprintf(stderr, "eaglegen plan: %s\n", err.msg);
    free(lb); free(cost); free(ends); free(sm);
    eg_model_free(&m);
    eg_config_free(&cfg);
    return rc;
}
