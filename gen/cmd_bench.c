/* eaglegen bench — prefill and decode throughput of a backend on a model. Performance
 * is measured here (and in `make bench`), never asserted in tests. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/mkmodel.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen bench (--model DIR | --preset NAME [--layers N]) [options]\n"
            "\n"
            "Prefill: BATCH sequences of PROMPT tokens in chunks of CHUNK rows. Decode: the same\n"
            "sequences then take STEPS steps of one token each (greedy, sampled on the backend).\n"
            "Prints tokens/s for each phase.\n"
            "\n"
            "options:\n"
            "  --model DIR        checkpoint directory\n"
            "  --preset NAME      instead of --model: draw a random model of this mkmodel preset (tiny,\n"
            "                     moonlight-16b, kimi-k2.5) into --scratch, run, and delete it\n"
            "  --layers N         with --preset: layer count (e.g. kimi-k2.5 --layers 4: real layer shapes)\n"
            "  --experts int4|bf16  with --preset: expert format (default int4)\n"
            "  --scratch DIR      with --preset: where the model is drawn (default /dev/shm, a RAM\n"
            "                     disk, when present; else /tmp)\n"
            "  --backend NAME     cpu or cuda (default cpu)\n"
            "  --batch LIST       comma-separated batch sizes (default 1,8)\n"
            "  --prompt-len N     prompt tokens per sequence (default 128)\n"
            "  --decode-steps N   decode steps (default 16)\n"
            "  --chunk N          prefill rows per step (default 256)\n"
            "  --threads N        CPU threads (default: all cores, or $EG_THREADS)\n"
            "  -h, --help         this text\n");
}

static eg_status bench_one(const eg_model *m, const char *backend, int threads, int batch, int plen, int steps,
                           int chunk, eg_error *err) {
    const eg_config *c = &m->cfg;
    int max_tokens = chunk > batch ? chunk : batch, seq = plen + steps + 1;
    eg_backend *be = NULL;
    eg_forward *f = NULL;
    eg_backend_opts bo = {.name = backend, .max_tokens = max_tokens, .max_seq_len = seq, .nthreads = threads};
    eg_status st = eg_backend_create(c, &bo, &be, err);
    int32_t *tok = NULL, *pos = NULL, *slot = NULL, *rows = NULL, *sampled = NULL;
    eg_sample_params *sp = NULL;
    uint64_t *rng = NULL;
    if (st) goto out;
    eg_forward_opts fo = {.max_tokens = max_tokens, .n_slots = batch, .max_seq_len = seq, .block_size = 64};
    if ((st = eg_forward_create(m, be, &fo, &f, err))) goto out;
    for (int s = 0; s < batch; s++)
        if ((st = eg_kv_reserve(eg_forward_kv(f), s, seq, err))) goto out;
    tok = malloc(4 * (size_t)max_tokens); pos = malloc(4 * (size_t)max_tokens); slot = malloc(4 * (size_t)max_tokens);
    rows = malloc(4 * (size_t)max_tokens); sampled = malloc(4 * (size_t)max_tokens);
    sp = calloc((size_t)max_tokens, sizeof *sp); rng = calloc((size_t)max_tokens, 8);
    if (!tok || !pos || !slot || !rows || !sampled || !sp || !rng) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto out; }
    /* prefill: all sequences' prompts, packed into chunks */
    double t0 = eg_now();
    int64_t total = (int64_t)batch * plen, done = 0;
    while (done < total) {
        int T = 0;
        while (T < chunk && done < total) {
            int s = (int)(done / plen), p = (int)(done % plen);
            tok[T] = (int32_t)((s * 7919 + p * 104729) % c->vocab);
            pos[T] = p;
            slot[T] = s;
            T++;
            done++;
        }
        eg_step step = {.T = T, .tokens = tok, .pos = pos, .slot = slot};
        if ((st = eg_forward_step(f, &step, err))) goto out;
    }
    double t_pre = eg_now() - t0;
    /* decode: one token per sequence per step, greedy on the backend */
    for (int s = 0; s < batch; s++) { tok[s] = (int32_t)(s % c->vocab); slot[s] = s; rows[s] = s; }
    t0 = eg_now();
    for (int k = 0; k < steps; k++) {
        for (int s = 0; s < batch; s++) pos[s] = plen + k;
        eg_step step = {.T = batch, .tokens = tok, .pos = pos, .slot = slot, .n_logits = batch, .logit_rows = rows,
                        .sampled = sampled, .sp = sp, .rng = rng};
        if ((st = eg_forward_step(f, &step, err))) goto out;
        memcpy(tok, sampled, 4 * (size_t)batch);
    }
    double t_dec = eg_now() - t0;
    printf("%-8s %6d %8d %12.1f %12.1f %10.2f\n", backend, batch, plen, (double)total / t_pre,
           (double)batch * steps / t_dec, 1e3 * t_dec / steps);
    fflush(stdout);
out:
    free(tok); free(pos); free(slot); free(rows); free(sampled); free(sp); free(rng);
    eg_forward_free(f);
    eg_backend_free(be);
    return st;
}

/* Delete the drawn model: a flat directory of files. */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4200];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

int cmd_bench(int argc, char **argv) {
    const char *model_dir = NULL, *backend = "cpu", *batches = "1,8", *preset = NULL, *scratch = NULL;
    int plen = 128, steps = 16, chunk = 256, threads = 0, layers = 0, experts = EG_MK_EXPERTS_INT4;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"backend", required_argument, 0, 'b'},
        {"batch", required_argument, 0, 'B'},      {"prompt-len", required_argument, 0, 'p'},
        {"decode-steps", required_argument, 0, 's'}, {"chunk", required_argument, 0, 'c'},
        {"threads", required_argument, 0, 't'},    {"help", no_argument, 0, 'h'},
        {"preset", required_argument, 0, 'P'},     {"layers", required_argument, 0, 'L'},
        {"experts", required_argument, 0, 'E'},    {"scratch", required_argument, 0, 'S'},
        {0, 0, 0, 0}};
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': model_dir = optarg; break;
        case 'b': backend = optarg; break;
        case 'B': batches = optarg; break;
        case 'p': if (!gen_arg_int("bench", "--prompt-len", optarg, 1, 1 << 24, &plen)) return 2; break;
        case 's': if (!gen_arg_int("bench", "--decode-steps", optarg, 1, 1 << 24, &steps)) return 2; break;
        case 'c': if (!gen_arg_int("bench", "--chunk", optarg, 1, 1 << 20, &chunk)) return 2; break;
        case 't': if (!gen_arg_int("bench", "--threads", optarg, 1, 4096, &threads)) return 2; break;
        case 'P': preset = optarg; break;
        case 'L': if (!gen_arg_int("bench", "--layers", optarg, 1, 1 << 20, &layers)) return 2; break;
        case 'S': scratch = optarg; break;
        case 'E':
            if (!strcmp(optarg, "int4")) experts = EG_MK_EXPERTS_INT4;
            else if (!strcmp(optarg, "bf16")) experts = EG_MK_EXPERTS_BF16;
            else { fprintf(stderr, "eaglegen bench: --experts expects int4 or bf16\n"); return 2; }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!model_dir == !preset) {
        fprintf(stderr, "eaglegen bench: give one of --model or --preset\n");
        usage(stderr);
        return 2;
    }
    eg_error err = {0};
    eg_model m;
    memset(&m, 0, sizeof m);
    char drawn[4096] = "";
    if (preset) {
        struct stat sb;
        if (!scratch) scratch = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
        snprintf(drawn, sizeof drawn, "%s/eaglegen-bench-XXXXXX", scratch);
        if (!mkdtemp(drawn)) { fprintf(stderr, "eaglegen bench: cannot create a directory in %s\n", scratch); return 1; }
        eg_mkmodel_opts mo = {.preset = preset, .out_dir = drawn, .seed = 1, .layers = layers, .experts = experts,
                              .threads = threads};
        eg_mkmodel_plan_info info;
        double t0 = eg_now();
        if (eg_mkmodel_run(&mo, &info, &err)) {
            fprintf(stderr, "eaglegen bench: drawing the %s model: %s\n", preset, err.msg);
            remove_tree(drawn);
            return 1;
        }
        printf("drew preset %s (%d layers, %.1f GB) in %.1f s into %s\n", preset, info.n_layers,
               (double)info.total_bytes / 1e9, eg_now() - t0, drawn);
        model_dir = drawn;
    }
    if (eg_model_load(model_dir, &m, &err)) {
        fprintf(stderr, "eaglegen bench: %s\n", err.msg);
        if (*drawn) remove_tree(drawn);
        return 1;
    }
    printf("model %s: %d layers, hidden %d, %d experts top-%d, weights %.1f MB\n", model_dir, m.cfg.n_layers,
           m.cfg.hidden, m.cfg.n_experts, m.cfg.topk, (double)m.weight_bytes / 1e6);
    printf("%-8s %6s %8s %12s %12s %10s\n", "backend", "batch", "prompt", "prefill t/s", "decode t/s", "ms/step");
    int rc = 0, list[64], n_list = 0;
    if (!gen_arg_int_list("bench", "--batch", batches, 1, list, 64, &n_list)) rc = 2;
    for (int i = 0; i < n_list && !rc; i++)
        if (bench_one(&m, backend, threads, list[i], plen, steps, chunk, &err)) {
            fprintf(stderr, "eaglegen bench: %s\n", err.msg);
            rc = 1;
        }
    eg_model_free(&m);
    if (*drawn) remove_tree(drawn);
    return rc;
}
