/* eaglegen generate — the pipeline users run: prompts -> chat template + tokenizer ->
 * batch engine (prefill + sampled decode, or teacher-forced capture) -> shards.
 *
 * The run is a job in --out: parameters and fingerprints in job.json, samples in
 * crash-safe shards, records that give no sample in rejects.jsonl. Rerunning the same
 * command resumes; each sample's RNG is seeded from (--seed, sample id), so a sample's
 * tokens do not depend on batch order or interruptions. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/eg_hash.h"
#include "dataset/idset.h"
#include "dataset/writer.h"
#include "engine/collective.h"
#include "engine/ep_runtime.h"
#include "engine/plan.h"
#include "engine/layout.h"
#include "engine/runtime.h"
#include "gen/args.h"
#include "gen/commands.h"
#include "gen/cpu_speed.h"
#include "gen/job.h"
#include "gen/donelog.h"
#include "gen/draft_model.h"
#include "gen/dry_run.h"
#include "gen/merge_check.h"
#include "gen/progress.h"
#include "gen/resume.h"
#include "gen/version.h"
#include "gen/worker_env.h"
#include "prompts/corpus.h"

typedef struct gen_args {
    const char *model, *out, *tokenizer, *backend, *log_json;
    const char **prompts;
    int n_prompts;
    int capture;              /* --mode capture */
    int max_new, max_seq_len;
    double temperature, top_p;
    int top_k;
    uint64_t seed;
    int thinking;
    int aux[64], n_aux;       /* n_aux 0 = config default */
    int final_mode;           /* 0 post-norm, 1 pre-norm, 2 both (default) */
    int batch, chunk, shard_samples, threads; /* batch 0 = auto */
    int kv_reserve;           /* --kv-policy reserve */
    int64_t kv_tokens;        /* --kv-tokens: pool cap, 0 = none */
    double host_kv_gb;        /* --host-kv-gb; < 0 = from free RAM */
    int worker, n_workers;
    int drop_truncated;
    const char *sampling_flag; /* the last sampling flag given (capture mode warns it is unused) */
    int64_t limit;            /* -1 = all */
    int skip_bad;
    const char *stages;       /* --stages: "N" (balanced) or "e0,e1,...,L" */
    int micro_batches;
    int whole_layers;         /* --whole-layers: --stages N on cuda keeps whole layers per stage */
    double mean_len;          /* --mean-len: what --layout auto plans for (0: not given) */
    int ep;                   /* --ep: expert-parallel ranks (0 = off) */
    int ep_split;             /* --ep-split: eg_ep_split (none, ffn, all) */
    int ep_split_given;       /* --ep-split was on the command line (--layout sets it too) */
    const char *layout;       /* --layout: ppP, epE, ppPxepE or auto (sets stages and ep) */
    const char *box;          /* --box: the box --layout auto plans for */
    char layout_stages[16];   /* --stages text a layout chose */
    double gpu_mem_fraction;  /* cuda: share of each GPU's memory the process may hold */
    int gpus;                 /* cuda: stage k runs on GPU k % gpus (0 = one GPU per stage) */
    const char *transport;    /* --transport: local, nccl or auto (NULL) */
    int restart;              /* --restart: delete this worker's job first */
    int dry_run;              /* --dry-run: report, load no weights, write nothing */
    int64_t shard_bytes;      /* --shard-size; 0 = no byte limit */
    const char *draft_model;  /* --draft-model: an EAGLE-3 drafter (speculative decoding) */
    int draft_tokens;         /* --draft-tokens K (0 = not given: 3) */
} gen_args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen generate --model DIR --prompts PATH [PATH...] --out DIR [options]\n"
            "\n"
            "Runs the target model over a JSONL prompt corpus and writes an EAGLE-3 training dataset\n"
            "(docs/FORMAT.md) into the job directory --out. Rerunning the same command resumes it.\n"
            "\n"
            "inputs and outputs:\n"
            "  --model DIR             Hugging Face checkpoint directory (required)\n"
            "  --prompts PATH...       JSONL files (.gz/.zst/.xz too), directories or - for stdin;\n"
            "                          further non-option arguments are more prompt paths (required);\n"
            "                          a pipe (-, a FIFO, <(zcat ...)) is worked on as lines arrive;\n"
            "                          job directories inside a prompts directory are skipped\n"
            "  --out DIR               job directory (required); created if missing\n"
            "  --tokenizer DIR         tiktoken.model + tokenizer_config.json (default: --model)\n"
            "  --backend cpu|cuda      compute backend (default cpu)\n"
            "what to generate:\n"
            "  --mode regenerate|capture\n"
            "                          regenerate (default): the model answers each prompt;\n"
            "                          capture: teacher-force the existing assistant turns\n"
            "  --max-new-tokens N      generated tokens per sample at most (default 2048)\n"
            "  --max-seq-len N         prompt + response tokens at most (default 4096); longer\n"
            "                          prompts are bad records\n"
            "  --temperature F         sampling temperature, 0 = greedy (default 1.0)\n"
            "  --top-p F               nucleus sampling mass (default 0.95)\n"
            "  --top-k N               top-k, 0 = off (default 0)\n"
            "  --seed N                job seed; sample seeds derive from it and the sample id (default 0)\n"
            "  --thinking on|off       Kimi thinking mode in the template (default on)\n"
            "  --aux-layers a,b,c      decoder layers (0-based, output of layer k) whose residual\n"
            "                          stream is stored, ascending and distinct (default: 1, L/2-1,\n"
            "                          L-4 from the config, repeats dropped)\n"
            "  --final-hidden both|post-norm|pre-norm\n"
            "                          final hidden state(s) stored: both (default; SpecForge uses the\n"
            "                          post-norm one, speculators the pre-norm one), the final-norm\n"
            "                          output, or the residual before it\n"
            "  --drop-truncated        leave out samples that hit --max-new-tokens (counted)\n"
            "  --limit N               process at most N records (of this worker)\n"
            "  --on-bad-record error|skip\n"
            "                          error (default): stop at the first bad record naming file,\n"
            "                          line and reason; skip: log it to rejects.jsonl and go on\n"
            "throughput and layout:\n"
            "  --batch N|auto          concurrent sequences at most (default 16); auto: as many as\n"
            "                          the KV pool holds at 256 tokens each, at most --chunk and what\n"
            "                          half the free RAM holds in captured rows at --max-seq-len\n"
            "                          (the start banner prints the choice, and on cuda notes a --batch N\n"
            "                          far below what the cache holds)\n"
            "  --kv-policy on-demand|reserve\n"
            "                          on-demand (default): a sequence takes cache blocks as it grows;\n"
            "                          admission needs its prompt plus a 1%% watermark; a full cache\n"
            "                          preempts the youngest sequence (to host memory, or recomputed\n"
            "                          later), which resumes exactly. reserve: admit only when prompt +\n"
            "                          --max-new-tokens fit; never preempts\n"
            "  --kv-tokens N           cap the KV pool at N tokens (default: cpu --batch x --max-seq-len,\n"
            "                          cuda what --gpu-mem-fraction leaves); must hold one --max-seq-len\n"
            "  --host-kv-gb F          host memory for preempted sequences' caches; past it they are\n"
            "                          recomputed from their tokens (default: a quarter of free RAM;\n"
            "                          with --ep the group's, split over the ranks)\n"
            "  --chunk N               rows per forward step / prefill chunk (default 512)\n"
            "  --shard-size SIZE       a shard ends at the sample that takes it past SIZE bytes (K/M/G;\n"
            "                          default 2G, off when only --shard-samples is given)\n"
            "  --shard-samples N       a shard ends after N samples (default: no sample limit)\n"
            "  --threads N             CPU threads (default: all cores, or $EG_THREADS)\n"
            "  --stages N|e0,e1,...    pipeline: split the layers into N stages balanced by bytes (on\n"
            "                          cuda a --draft-model's weights count on the last stage; with a\n"
            "                          memory plan and one GPU per stage, or per rank and stage with\n"
            "                          --ep, by the KV pool, which may split layers: --whole-layers), or\n"
            "                          stages ending at the given layers; an end END:CUT splits layer\n"
            "                          END-1: its attention and routed experts 0..CUT-1 on that stage,\n"
            "                          the rest on the next (exact, with --ep too: each half's experts\n"
            "                          shared out over the ranks); stage k runs on GPU k (cuda) or its\n"
            "                          own thread (cpu) (default: one stage)\n"
            "  --whole-layers          --stages N on cuda: whole layers per stage (by default a layer's\n"
            "                          experts may be split between two stages where that gives every\n"
            "                          stage a larger KV pool; the samples are the same either way);\n"
            "                          --layout auto then ranks the layouts at whole layers\n"
            "  --micro-batches M       micro-batches in flight with --stages (default: the stage count)\n"
            "  --ep E                  expert parallelism: E ranks (cpu: threads; cuda: rank r on GPU r,\n"
            "                          rows over NCCL; EG_EP_EXCHANGE=cuda-local: plain copies between\n"
            "                          host barriers instead, where NCCL cannot start), each with its own\n"
            "                          share of the sequences and their KV cache and E-th of the routed\n"
            "                          experts; rows are exchanged per MoE layer (FP32). Shared expert,\n"
            "                          dense MLP, embedding and lm_head are replicated on every rank\n"
            "                          unless --ep-split says otherwise.\n"
            "                          With --stages P: stage groups, each rank's stage k on a thread\n"
            "                          of its own (cuda: GPU k*E + r, so P*E GPUs; with fewer, a rank\n"
            "                          runs its stages on its one GPU), stage k's rows exchanged among\n"
            "                          the ranks' stage k.\n"
            "                          E must divide the routed expert count\n"
            "                          (default 1: no split)\n"
            "  --ep-split S            with --ep: none (default), ffn or all. ffn: layer l's shared expert\n"
            "                          (MoE layers) or dense MLP (dense layers) sits on rank l mod E only\n"
            "                          and runs there for every rank's tokens (rows there and back in\n"
            "                          FP32); cpu and cuda ranks. all: ffn, and rank r holds only vocab\n"
            "                          rows [r*V/E, (r+1)*V/E) of the embedding and lm_head, embeds the\n"
            "                          tokens whose ids it holds and computes those logit columns for\n"
            "                          every rank; cpu and cuda ranks, a checkpoint (not random weights).\n"
            "                          Samples are identical to --ep-split none either way\n"
            "  --layout L              ppP (--stages P), epE (--ep E), ppPxepE, epE+ffn / ppPxepE+ffn\n"
            "                          (--ep-split ffn: each layer's shared expert / dense MLP on one rank),\n"
            "                          epE+split / ppPxepE+split (--ep-split all),\n"
            "                          or auto: the layout `eaglegen plan --box` recommends for this model\n"
            "                          and --box among those --backend runs (decode, or prefill with --mode\n"
            "                          capture), planned as this run goes: --mean-len, --chunk rows per\n"
            "                          step and at most --batch sequences (plan --prefill-chunk and\n"
            "                          --batch take the same values); no drafter modelled. It sets\n"
            "                          --stages, --ep and --ep-split: not with them\n"
            "  --box NAME              with --layout auto: rtx-pro-6000x8 or h200x8\n"
            "  --mean-len N            with --layout auto: expected tokens per sequence, prompt +\n"
            "                          response (default 4096 as plan's, at most --max-seq-len)\n"
            "  --gpus N                cuda: stage k runs on GPU k mod N (default: one GPU per stage;\n"
            "                          --gpus 1 runs every stage on one GPU, for testing)\n"
            "  --transport NAME        how stages hand rows on: nccl (GPU to GPU on the stages' streams),\n"
            "                          local (through pinned host memory; any backends) or auto\n"
            "                          (default: nccl when every stage has its own GPU and NCCL is\n"
            "                          built in, else local)\n"
            "  --gpu-mem-fraction F    cuda: share of each GPU's memory to use; the KV cache gets what\n"
            "                          weights and activations leave (default 0.9)\n"
            "  --worker I/N            this is worker I (0-based) of N; default from the launcher:\n"
            "                          a Slurm array (SLURM_ARRAY_TASK_ID/MIN/MAX/STEP/COUNT), the\n"
            "                          ranks of one launch (the first set of torchrun's RANK/WORLD_SIZE,\n"
            "                          srun's SLURM_PROCID/NTASKS, mpirun's OMPI_COMM_WORLD_RANK/SIZE), or\n"
            "                          both (array x ranks); half a pair, or a rank not below its size,\n"
            "                          is refused; else 0/1. A worker whose sampling parameters or\n"
            "                          model differ from another worker's job file in --out, or that\n"
            "                          splits an input file they share over another N, is refused at\n"
            "                          start (with --restart too)\n"
            "  --log-json FILE         append progress as JSON lines (UTC time, worker, phase, counts) to FILE\n"
            "speculative decoding (regenerate mode; docs/ENGINE.md):\n"
            "  --draft-model DIR       an EAGLE-3 drafter (as SpecForge or speculators save it, or in\n"
            "                          vLLM's MLA layout, Eagle3DeepseekV2ForCausalLM) proposes\n"
            "                          tokens that the model verifies K + 1 at a time; accepted by\n"
            "                          rejection sampling, so every token is distributed exactly as\n"
            "                          without it (greedy: the same tokens) and the captured rows are\n"
            "                          the model's own. Its aux layers\n"
            "                          (its config's; the default set if it pins none) must be among\n"
            "                          --aux-layers. With --ep every rank has its own\n"
            "                          drafter for its slots; with --stages it runs as each\n"
            "                          micro-batch leaves the last stage\n"
            "  --draft-tokens K        tokens drafted per verify step (default 3; --chunk or --batch\n"
            "                          >= K + 1: a step holds the larger of the two in rows)\n"
            "job:\n"
            "  --dry-run               report what the run would do and exit, without loading weights\n"
            "                          (config.json, tokenizer and corpus only): records accepted and\n"
            "                          rejected by reason, prompt token statistics, output tokens at\n"
            "                          most, disk and shard sizes for the model's H and aux layers, the\n"
            "                          layout (with --ep each rank's routed experts and slots, checked\n"
            "                          as the run checks them); with an existing job in --out whether\n"
            "                          the run would resume it, refuse it (the run's message, exit 1:\n"
            "                          job.json against the parameters, config, tokenizer and inputs;\n"
            "                          the weights' bytes only the run compares) or delete it\n"
            "                          (--restart); --out is optional and nothing is written\n"
            "  --restart               delete this worker's job in --out (its shards, manifest, job\n"
            "                          file, ledgers) and start over; without it a rerun resumes, and\n"
            "                          a parameter that changes samples is refused (see Resuming in\n"
            "                          README.md)\n"
            "  -h, --help              this text\n"
            "\n"
            "Exit status: 0 done, 1 failure (also a value the model or the box cannot take once\n"
            "they are read: --aux-layers past the last layer, --stages or --ep that do not fit it, a\n"
            "--kv-tokens pool below one sequence), 2 usage error (the options as written), 130\n"
            "interrupted (SIGINT/SIGTERM: what is complete is committed; rerun to resume).\n");
}

/* ---- argument parsing ------------------------------------------------------ */

static int bad_arg(const char *flag, const char *v, const char *want) {
    fprintf(stderr, "eaglegen generate: %s: expected %s, got '%s'\n", flag, want, v);
    return 0;
}
static int p_worker(const char *v, int *i, int *n) {
    char *e;
    long a = strtol(v, &e, 10);
    if (e == v || *e != '/') return 0;
    char *e2;
    long b = strtol(e + 1, &e2, 10);
    if (e2 == e + 1 || *e2 || b < 1 || a < 0 || a >= b || b > 1 << 20) return 0;
    *i = (int)a;
    *n = (int)b;
    return 1;
}

/* --layout: an explicit ppP / epE / ppPxepE, or auto: the layout engine/layout.h recommends
 * for --box, for decode (regenerate) or prefill (capture), at --mean-len (default plan's
 * 4096, at most --max-seq-len), --chunk and --batch. Sets a->stages and a->ep; 0 or 2 (usage). */
static int resolve_layout(gen_args *a) {
    eg_error err = {0};
    if (a->stages || a->ep || a->ep_split_given) {
        fprintf(stderr, "eaglegen generate: --layout sets --stages, --ep and --ep-split: give one or the other\n");
        return 2;
    }
    char why[1024];
    int stages = 1, ep = 1, ep_split = EG_SPLIT_NONE;
    double mean_len = a->mean_len > 0                         ? a->mean_len
                      : a->max_seq_len < EG_LAYOUT_MEAN_LEN ? a->max_seq_len
                                                            : EG_LAYOUT_MEAN_LEN;
    if (eg_runtime_layout(a->layout, a->box, a->model, a->backend, a->capture, a->whole_layers, mean_len, a->chunk,
                          a->batch, &stages, &ep, &ep_split, why, sizeof why, &err)) {
        fprintf(stderr, "eaglegen generate: %s\n", err.msg);
        return 2;
    }
    if (why[0]) fprintf(stderr, "eaglegen generate: %s\n", why);
    if (why[0] && a->draft_model)
        fprintf(stderr, "eaglegen generate: --layout auto did not model the drafter (its acceptance is known after "
                        "the run, which reports it): `eaglegen plan --box %s --draft-model %s --draft-tokens %d --accept "
                        "A` ranks the layouts with it\n", a->box, a->draft_model, a->draft_tokens ? a->draft_tokens : 3);
    /* a "+ffn" layout: each layer's shared expert / dense MLP on rank l mod ep; "+split":
       that and the vocab split of the embedding and lm_head */
    if (ep_split == EG_SPLIT_FFN) a->ep_split = EG_EP_SPLIT_FFN;
    if (ep_split == EG_SPLIT_ALL) a->ep_split = EG_EP_SPLIT_ALL;
    if (stages > 1) {
        snprintf(a->layout_stages, sizeof a->layout_stages, "%d", stages);
        a->stages = a->layout_stages;
    }
    if (ep > 1) a->ep = ep;
    return 0;
}

static int parse_args(int argc, char **argv, gen_args *a) {
    memset(a, 0, sizeof *a);
    a->backend = "cpu";
    a->max_new = 2048;
    a->max_seq_len = 4096;
    a->temperature = 1.0;
    a->top_p = 0.95;
    a->thinking = 1;
    a->final_mode = 2;
    a->batch = 16;
    a->chunk = 512;
    a->shard_samples = 0; /* shards by bytes (--shard-size) unless --shard-samples */
    int shard_size_set = 0;
    a->limit = -1;
    a->n_workers = 0;
    a->gpu_mem_fraction = 0.9;
    a->host_kv_gb = -1;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'},          {"prompts", 1, 0, 'p'},        {"out", 1, 0, 'o'},
        {"tokenizer", 1, 0, 'T'},      {"backend", 1, 0, 'b'},        {"mode", 1, 0, 'M'},
        {"max-new-tokens", 1, 0, 'n'}, {"max-seq-len", 1, 0, 'L'},    {"temperature", 1, 0, 't'},
        {"top-p", 1, 0, 'P'},          {"top-k", 1, 0, 'k'},          {"seed", 1, 0, 's'},
        {"thinking", 1, 0, 'H'},       {"aux-layers", 1, 0, 'a'},     {"final-hidden", 1, 0, 'f'},
        {"batch", 1, 0, 'B'},          {"chunk", 1, 0, 'c'},          {"shard-samples", 1, 0, 'S'},
        {"threads", 1, 0, 'j'},        {"worker", 1, 0, 'w'},         {"drop-truncated", 0, 0, 'd'},
        {"limit", 1, 0, 'l'},          {"on-bad-record", 1, 0, 'r'},  {"log-json", 1, 0, 'J'},
        {"stages", 1, 0, 'G'},         {"micro-batches", 1, 0, 'U'},  {"gpu-mem-fraction", 1, 0, 'F'},
        {"gpus", 1, 0, 'Q'},
        {"transport", 1, 0, 'X'},      {"restart", 0, 0, 'R'},        {"dry-run", 0, 0, 'D'},
        {"shard-size", 1, 0, 'Z'},     {"kv-policy", 1, 0, 'K'},      {"kv-tokens", 1, 0, 'V'},
        {"host-kv-gb", 1, 0, 'W'},     {"ep", 1, 0, 'E'},             {"layout", 1, 0, 0x100},
        {"box", 1, 0, 0x101},          {"draft-model", 1, 0, 0x102},  {"draft-tokens", 1, 0, 0x103},
        {"ep-split", 1, 0, 0x104},     {"whole-layers", 0, 0, 0x105}, {"mean-len", 1, 0, 0x106},
        {"help", 0, 0, 'h'},           {0, 0, 0, 0}};
    /* every argument could be a prompt path: argc entries is enough, no cap */
    const char **plist = malloc(sizeof *plist * ((size_t)argc + 1));
    if (!plist) { fprintf(stderr, "eaglegen generate: out of memory\n"); return 1; }
    a->prompts = plist;
    optind = 1;
    int ch, lim;
    while ((ch = gen_getopt(argc, argv, "generate", "h", opts)) != -1) {
        switch (ch) {
        case 'm': a->model = optarg; break;
        case 'p': plist[a->n_prompts++] = optarg; break;
        case 'o': a->out = optarg; break;
        case 'T': a->tokenizer = optarg; break;
        case 'b':
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) return bad_arg("--backend", optarg, "cpu or cuda"), 2;
            a->backend = optarg;
            break;
        case 'M':
            if (!strcmp(optarg, "regenerate")) a->capture = 0;
            else if (!strcmp(optarg, "capture")) a->capture = 1;
            else return bad_arg("--mode", optarg, "regenerate or capture"), 2;
            break;
        case 'n': a->sampling_flag = "--max-new-tokens";
            if (!gen_arg_int("generate", "--max-new-tokens", optarg, 1, 1 << 24, &a->max_new)) return 2;
            break;
        case 'L': if (!gen_arg_int("generate", "--max-seq-len", optarg, 2, 1 << 24, &a->max_seq_len)) return 2; break;
        case 't': a->sampling_flag = "--temperature";
            if (!gen_arg_double("generate", "--temperature", optarg, 0, 100, &a->temperature)) return 2;
            break;
        case 'P': a->sampling_flag = "--top-p";
            if (!gen_arg_double("generate", "--top-p", optarg, 1e-9, 1, &a->top_p)) return 2;
            break;
        case 'k': a->sampling_flag = "--top-k";
            if (!gen_arg_int("generate", "--top-k", optarg, 0, 1 << 24, &a->top_k)) return 2;
            break;
        case 's': {
            char *e;
            errno = 0;
            /* digits only (strtoull would accept " -5" and wrap it); stored in job.json as a
             * JSON integer, so at most INT64_MAX */
            unsigned long long v = optarg[0] >= '0' && optarg[0] <= '9' ? strtoull(optarg, &e, 10) : 0;
            if (optarg[0] < '0' || optarg[0] > '9' || errno || *e || v > (unsigned long long)INT64_MAX)
                return bad_arg("--seed", optarg, "an integer in [0, 9223372036854775807]"), 2;
            a->seed = v;
            break;
        }
        case 'H':
            if (!strcmp(optarg, "on")) a->thinking = 1;
            else if (!strcmp(optarg, "off")) a->thinking = 0;
            else return bad_arg("--thinking", optarg, "on or off"), 2;
            break;
        case 'a':
            if (!gen_arg_int_list("generate", "--aux-layers", optarg, 0, a->aux, 64, &a->n_aux)) return 2;
            /* Serving engines emit aux states in ascending layer order, and trainers map them
             * by position: a list in another order would be stored, and trained, misread. */
            for (int i = 1; i < a->n_aux; i++)
                if (a->aux[i] <= a->aux[i - 1]) {
                    fprintf(stderr,
                            "eaglegen generate: --aux-layers %s: layers must be ascending and distinct (%s %d after "
                            "%d): serving engines emit aux states in ascending order and trainers read them by "
                            "position, so any other order would be misread; write them sorted\n",
                            optarg, a->aux[i] == a->aux[i - 1] ? "repeated" : "out of order:", a->aux[i],
                            a->aux[i - 1]);
                    return 2;
                }
            break;
        case 'f':
            if (!strcmp(optarg, "post-norm")) a->final_mode = 0;
            else if (!strcmp(optarg, "pre-norm")) a->final_mode = 1;
            else if (!strcmp(optarg, "both")) a->final_mode = 2;
            else return bad_arg("--final-hidden", optarg, "both, post-norm or pre-norm"), 2;
            break;
        case 'B':
            if (!strcmp(optarg, "auto")) a->batch = 0;
            else if (!gen_arg_int("generate", "--batch", optarg, 1, 1 << 16, &a->batch)) return 2;
            break;
        case 'K':
            if (!strcmp(optarg, "on-demand")) a->kv_reserve = 0;
            else if (!strcmp(optarg, "reserve")) a->kv_reserve = 1;
            else return bad_arg("--kv-policy", optarg, "on-demand or reserve"), 2;
            break;
        case 'V': {
            int v;
            if (!gen_arg_int("generate", "--kv-tokens", optarg, 1, 2000000000, &v)) return 2;
            a->kv_tokens = v;
            break;
        }
        case 'W': if (!gen_arg_double("generate", "--host-kv-gb", optarg, 0, 1e9, &a->host_kv_gb)) return 2; break;
        case 'c': if (!gen_arg_int("generate", "--chunk", optarg, 1, 1 << 20, &a->chunk)) return 2; break;
        case 'S': if (!gen_arg_int("generate", "--shard-samples", optarg, 1, 1 << 30, &a->shard_samples)) return 2; break;
        case 'j': if (!gen_arg_int("generate", "--threads", optarg, 1, 4096, &a->threads)) return 2; break;
        case 'w': if (!p_worker(optarg, &a->worker, &a->n_workers)) return bad_arg("--worker", optarg, "I/N with 0 <= I < N"), 2; break;
        case 'd': a->drop_truncated = 1; a->sampling_flag = "--drop-truncated"; break;
        case 'l': if (!gen_arg_int("generate", "--limit", optarg, 0, 2000000000, &lim)) return 2; a->limit = lim; break;
        case 'r':
            if (!strcmp(optarg, "error")) a->skip_bad = 0;
            else if (!strcmp(optarg, "skip")) a->skip_bad = 1;
            else return bad_arg("--on-bad-record", optarg, "error or skip"), 2;
            break;
        case 'J': a->log_json = optarg; break;
        case 'G': a->stages = optarg; break;
        case 'Q': if (!gen_arg_int("generate", "--gpus", optarg, 1, 4096, &a->gpus)) return 2; break;
        case 'X':
            if (strcmp(optarg, "local") && strcmp(optarg, "nccl") && strcmp(optarg, "auto"))
                return bad_arg("--transport", optarg, "local, nccl or auto"), 2;
            a->transport = optarg;
            break;
        case 'F': if (!gen_arg_double("generate", "--gpu-mem-fraction", optarg, 0.05, 1, &a->gpu_mem_fraction)) return 2; break;
        case 'E': if (!gen_arg_int("generate", "--ep", optarg, 1, 4096, &a->ep)) return 2; break;
        case 0x100: a->layout = optarg; break;
        case 0x101: a->box = optarg; break;
        case 0x102: a->draft_model = optarg; break;
        case 0x103: if (!gen_arg_int("generate", "--draft-tokens", optarg, 1, 64, &a->draft_tokens)) return 2; break;
        case 0x104:
            a->ep_split_given = 1;
            if (!strcmp(optarg, "none")) a->ep_split = EG_EP_SPLIT_NONE;
            else if (!strcmp(optarg, "ffn")) a->ep_split = EG_EP_SPLIT_FFN;
            else if (!strcmp(optarg, "all")) a->ep_split = EG_EP_SPLIT_ALL;
            else {
                fprintf(stderr, "eaglegen generate: --ep-split: expected none, ffn or all, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'U': if (!gen_arg_int("generate", "--micro-batches", optarg, 1, 4096, &a->micro_batches)) return 2; break;
        case 0x105: a->whole_layers = 1; break;
        case 0x106: if (!gen_arg_double("generate", "--mean-len", optarg, 1, 1 << 24, &a->mean_len)) return 2; break;
        case 'R': a->restart = 1; break;
        case 'D': a->dry_run = 1; break;
        case 'Z': if (!gen_arg_size("generate", "--shard-size", optarg, 1, &a->shard_bytes)) return 2; shard_size_set = 1; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    while (optind < argc) plist[a->n_prompts++] = argv[optind++];
    if (!shard_size_set) a->shard_bytes = a->shard_samples ? 0 : 2000000000; /* 2 GB by default */
    if (!a->model || (!a->out && !a->dry_run) || !a->n_prompts) {
        fprintf(stderr, "eaglegen generate: missing %s%s%s%s%s (required: --model DIR, --prompts PATH..., --out DIR)\n",
                !a->model ? "--model" : "", !a->model && (!a->n_prompts || (!a->out && !a->dry_run)) ? ", " : "",
                !a->n_prompts ? "--prompts" : "", !a->n_prompts && !a->out && !a->dry_run ? ", " : "",
                !a->out && !a->dry_run ? "--out" : "");
        return 2;
    }
    if ((a->box || a->mean_len > 0) && (!a->layout || strcmp(a->layout, "auto"))) {
        fprintf(stderr, "eaglegen generate: --%s applies to --layout auto\n", a->box ? "box" : "mean-len");
        return 2;
    }
    if (a->mean_len > a->max_seq_len) {
        fprintf(stderr, "eaglegen generate: --mean-len %.0f is more than --max-seq-len %d\n", a->mean_len, a->max_seq_len);
        return 2;
    }
    /* --stages' syntax here (a usage error); its layers against the model in the runtime */
    if (a->stages) {
        int ok = eg_runtime_stages_syntax(a->stages, NULL, NULL, INT_MAX) >= 0;
        if (!ok) {
            fprintf(stderr, "eaglegen generate: --stages expects N or ascending end layers e0,e1,...,L (an end as "
                            "END:CUT splits layer END-1's experts at CUT), got '%s'\n",
                    a->stages);
            return 2;
        }
    }
    if (a->layout && resolve_layout(a)) return 2;
    if (a->ep_split != EG_EP_SPLIT_NONE && a->ep < 2) {
        fprintf(stderr, "eaglegen generate: --ep-split %s splits within an expert-parallel group: it needs --ep E "
                        "with E > 1 (got %d)\n", a->ep_split == EG_EP_SPLIT_ALL ? "all" : "ffn", a->ep > 0 ? a->ep : 1);
        return 2;
    }
    if (!a->stages && (a->micro_batches || a->gpus || a->whole_layers || (a->transport && strcmp(a->transport, "auto")))) {
        fprintf(stderr, "eaglegen generate: --micro-batches, --gpus, --whole-layers and --transport apply to pipeline "
                        "stages; add --stages (see --help)\n");
        return 2;
    }
    if (a->draft_tokens && !a->draft_model) {
        fprintf(stderr, "eaglegen generate: --draft-tokens needs --draft-model DIR\n");
        return 2;
    }
    if (a->draft_model) {
        const char *why = a->capture ? "--mode capture generates nothing" : NULL;
        if (why) {
            fprintf(stderr, "eaglegen generate: --draft-model: %s\n", why);
            return 2;
        }
        if (!a->draft_tokens) a->draft_tokens = 3;
        if ((a->batch > a->chunk ? a->batch : a->chunk) < a->draft_tokens + 1) { /* the engine's rows per step */
            if (a->batch > 0)
                fprintf(stderr, "eaglegen generate: a step of max(--chunk %d, --batch %d) rows cannot hold a verify step "
                        "of --draft-tokens %d + 1 rows\n", a->chunk, a->batch, a->draft_tokens);
            else
                fprintf(stderr, "eaglegen generate: a step of --chunk %d rows cannot hold a verify step of "
                        "--draft-tokens %d + 1 rows\n", a->chunk, a->draft_tokens);
            return 2;
        }
    }
    if (a->capture && a->sampling_flag)
        fprintf(stderr, "eaglegen generate: note: %s has no effect in capture mode (nothing is generated)\n",
                a->sampling_flag);
    if (!a->n_workers) {
        char how[256], msg[512];
        int r = gen_worker_from_env(gen_env_getenv, NULL, &a->worker, &a->n_workers, how, sizeof how, msg, sizeof msg);
        if (r < 0) {
            fprintf(stderr, "eaglegen generate: cannot tell which worker this is: %s\n", msg);
            return 2;
        }
        if (r == 0) { a->worker = 0; a->n_workers = 1; }
        else fprintf(stderr, "eaglegen generate: worker %d/%d from %s\n", a->worker, a->n_workers, how);
    }
    if (!a->tokenizer) a->tokenizer = a->model;
    return -1; /* continue */
}

/* ---- the run ------------------------------------------------------------------ */


typedef struct gen_meta {
    char *id;
    const char *file;
    uint64_t line, index;
    uint8_t *mask;  /* capture mode: [T] */
    uint64_t seed;
    uint64_t hash;  /* gen_record_hash of the record's token ids */
    uint64_t line_hash; /* gen_line_hash of its line, for a ledger entry made at its end */
    struct gen_meta *prev, *next;
} gen_meta;

/* The ids this run has met, with where it first met each: an id counts as already done
 * only when it was committed before this run began and is met the first time; any
 * later occurrence is a duplicate id. The id set maps each id to its slot in where[]. */
typedef struct seen_entry {
    const char *file; /* the corpus reader's, alive for the run */
    uint64_t line;
} seen_entry;

typedef struct seen_set {
    eg_ds_idset ids;
    seen_entry *where; /* [n] */
    size_t n, cap;
} seen_set;

/* Where id was first met, or NULL after recording it (at file:line). */
static const seen_entry *seen_find_or_add(seen_set *t, const char *id, const char *file, uint64_t line,
                                          eg_error *err, eg_status *st) {
    int64_t slot;
    *st = EG_OK;
    if (eg_ds_idset_get(&t->ids, id, &slot)) return &t->where[slot];
    if (t->n == t->cap) {
        size_t nc = t->cap ? 2 * t->cap : 1024;
        seen_entry *nw = realloc(t->where, nc * sizeof *nw);
        if (!nw) { *st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); return NULL; }
        t->where = nw;
        t->cap = nc;
    }
    if ((*st = eg_ds_idset_put(&t->ids, id, (int64_t)t->n, err))) return NULL;
    t->where[t->n++] = (seen_entry){file, line};
    return NULL;
}

/* corpus_opts.on_other_id: another worker's record claims its id here too, so a later
 * record of this worker with that id is a duplicate as in one run over all records (the
 * merge refused such a pair only after every worker had run). */
static eg_status seen_other(void *ctx, const char *id, const char *file, uint64_t line, eg_error *err) {
    eg_status st;
    seen_find_or_add(ctx, id, file, line, err, &st);
    return st;
}

static void seen_free(seen_set *t) {
    eg_ds_idset_clear(&t->ids);
    free(t->where);
    memset(t, 0, sizeof *t);
}

typedef struct gen_run {
    gen_args *a;
    eg_model *model;
    tok_tokenizer *tok;
    corpus_reader *corpus;
    eg_shard_writer *w;
    gen_ledger *ledger;
    eg_runtime *rt;         /* backends, stages, ranks and engine(s) (engine/runtime.h) */
    corpus_record rec;
    int32_t *stop;
    int n_stop;
    int64_t records_read;   /* records of this worker seen */
    int64_t resumed;        /* committed by an earlier run, passed over */
    seen_set seen;          /* ids met in this run */
    int64_t written;        /* samples added this run */
    gen_meta live;          /* list head of in-flight requests */
    gen_progress prog;
    int64_t records_total;
    gen_donelog *donelog;   /* ids made with their records' hashes */
    int64_t changed;        /* done ids whose record has changed since */
    int64_t relogged;       /* ledger entries cleared: their record's line changed */
    int corpus_ended;       /* the reader reached the end of the inputs */
    int limit_peeked;       /* --limit reached: looked once whether any record is left */
    int64_t ledger_at_open; /* records in the ledger before this run */
    uint8_t *mask_buf;
    size_t mask_cap;
} gen_run;

static volatile sig_atomic_t g_interrupted;
static eg_runtime *volatile g_rt;

static void on_signal(int sig) {
    (void)sig;
    g_interrupted = 1;
    if (g_rt) eg_runtime_request_stop(g_rt);
}

static uint64_t id_seed(uint64_t seed, const char *id) {
    uint8_t d[32];
    eg_sha256 c;
    eg_sha256_init(&c);
    eg_sha256_update(&c, id, strlen(id));
    eg_sha256_final(&c, d);
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h = h << 8 | d[i];
    return eg_rng_seed(seed, h);
}

static void meta_free(gen_meta *m) {
    if (!m) return;
    if (m->prev) m->prev->next = m->next;
    if (m->next) m->next->prev = m->prev;
    free(m->id);
    free(m->mask);
    free(m);
}

static gen_progress_state progress_state(gen_run *g) {
    eg_engine_stats es;
    eg_runtime_stats(g->rt, &es);
    eg_shard_writer_stats ws = {0};
    shard_writer_stats(g->w, &ws);
    int64_t rej = gen_ledger_count(g->ledger, GEN_OUT_REJECTED) + gen_ledger_count(g->ledger, GEN_OUT_DROPPED) +
                  gen_ledger_count(g->ledger, GEN_OUT_DUPLICATE);
    gen_progress_state s = {
        .records_done = g->resumed + g->written + rej, .records_skipped = g->resumed + g->ledger_at_open,
        .rejected = rej, .records_total = g->records_total, .samples = g->written, .prefill_tokens = es.prefill_tokens,
        .decode_tokens = es.decode_tokens, .engine_seconds = es.seconds, .shards = ws.committed_shards,
        .compression = ws.committed_bytes > 0 ? (double)ws.committed_raw_bytes / (double)ws.committed_bytes : 0};
    if (g->corpus) corpus_input_bytes(g->corpus, &s.input_bytes_done, &s.input_bytes_total);
    return s;
}

static void progress(gen_run *g, int force) {
    gen_progress_state s = progress_state(g);
    gen_progress_update(&g->prog, &s, force);
}

/* A done id met again: its record should be the one its sample was made from. */
static void report_changed(gen_run *g, const corpus_record *r) {
    uint64_t h;
    if (!gen_donelog_get(g->donelog, r->id, &h) || h == gen_record_hash(r->ids.ids, r->ids.n)) return;
    if (g->changed++ < 10)
        fprintf(stderr, "eaglegen generate: %s:%llu: record \"%.200s\" differs from the one its sample was made from; "
                        "the old sample is kept (--restart, or a new id, to make it again)\n",
                r->file, (unsigned long long)r->line, r->id);
}

static int next_request(void *vc, eg_request *req, eg_error *err) {
    gen_run *g = vc;
    gen_args *a = g->a;
    for (;;) {
        if (g_interrupted) return 0;
        if (a->limit >= 0 && g->records_read >= a->limit) {
            /* a --limit that covers the rest of the share: the share is complete (merge
               checks it). Only regular files are looked at: a pipe could block. */
            int64_t done, total;
            corpus_input_bytes(g->corpus, &done, &total);
            if (!g->limit_peeked && total >= 0) {
                bool more = true;
                eg_error ignored; /* a damaged line past the limit is not this run's */
                if (!corpus_next(g->corpus, &g->rec, &more, &ignored) && !more) g->corpus_ended = 1;
            }
            g->limit_peeked = 1;
            return 0;
        }
        bool got = false, later = false;
        /* with sequences in flight a pipe's next line is not waited for: they step on */
        if (g->live.next ? corpus_next_nowait(g->corpus, &g->rec, &got, &later, err)
                         : corpus_next(g->corpus, &g->rec, &got, err)) {
            if (g_interrupted) return 0; /* a read Ctrl-C cut short: finish what is in flight */
            return -1;
        }
        if (later) return EG_NEXT_LATER;
        if (!got) { g->corpus_ended = 1; return 0; }
        g->records_read++;
        corpus_record *r = &g->rec;
        progress(g, 0);
        eg_status sst = EG_OK;
        uint64_t lh = gen_line_hash(r->raw, r->raw_len);
        int lc = gen_ledger_check(g->ledger, r->index, lh);
        if (lc == GEN_LEDGER_SAME) { /* handled by an earlier run */
            /* a dropped sample's id still counts as met, as in an uninterrupted run, and
               so does a bad record's own id */
            if ((r->ok || r->id_given) && r->id) seen_find_or_add(&g->seen, r->id, r->file, r->line, err, &sst);
            if (sst) return -1;
            continue;
        }
        if (lc == GEN_LEDGER_CHANGED) { /* edited since it was logged: its entry no longer holds */
            if (gen_ledger_clear(g->ledger, r->index, r->file, r->line, r->id, lh, err)) return -1;
            if (g->relogged++ < 10)
                fprintf(stderr, "eaglegen generate: %s:%llu: record \"%.200s\" changed since the ledger logged it; "
                                "reading it again\n", r->file, (unsigned long long)r->line, r->id);
        }
        if (!r->ok) {
            /* a record that names an id claims it, good or bad: another worker (which
               only parses the id of this worker's records) counts it so, and fixing this
               line later makes its sample, not a later record's */
            if (r->id_given && (seen_find_or_add(&g->seen, r->id, r->file, r->line, err, &sst), sst)) return -1;
            if (!a->skip_bad) {
                eg_fail(err, EG_ERR_FORMAT, "%s:%llu: bad record: %s (use --on-bad-record=skip to log and continue)",
                        r->file, (unsigned long long)r->line, r->reason);
                return -1;
            }
            if (gen_ledger_add(g->ledger, r->index, r->file, r->line, r->id, GEN_OUT_REJECTED, r->reason, lh, r->raw, err))
                return -1;
            continue;
        }
        const seen_entry *first = seen_find_or_add(&g->seen, r->id, r->file, r->line, err, &sst);
        if (sst) return -1;
        if (first) {
            char why[1024];
            snprintf(why, sizeof why, "duplicate id \"%.200s\" (first at %.600s:%llu)", r->id, first->file,
                     (unsigned long long)first->line);
            if (!a->skip_bad) {
                eg_fail(err, EG_ERR_FORMAT, "%s:%llu: bad record: %s (use --on-bad-record=skip to log and continue)",
                        r->file, (unsigned long long)r->line, why);
                return -1;
            }
            if (gen_ledger_add(g->ledger, r->index, r->file, r->line, r->id, GEN_OUT_DUPLICATE, why, lh, r->raw, err))
                return -1;
            continue;
        }
        /* met for the first time in this run: committed means committed by an earlier run */
        if (shard_writer_has_id(g->w, r->id)) {
            g->resumed++;
            report_changed(g, r);
            continue;
        }
        int n = (int)r->ids.n;
        if (a->capture) {
            int any = 0;
            for (int i = 0; i < n; i++) any |= r->loss_mask[i];
            if (!any) {
                if (!a->skip_bad) {
                    eg_fail(err, EG_ERR_FORMAT, "%s:%llu: bad record: no assistant turn to capture", r->file,
                            (unsigned long long)r->line);
                    return -1;
                }
                if (gen_ledger_add(g->ledger, r->index, r->file, r->line, r->id, GEN_OUT_REJECTED,
                                   "no assistant turn to capture", lh, r->raw, err))
                    return -1;
                continue;
            }
        }
        gen_meta *m = calloc(1, sizeof *m);
        if (!m || !(m->id = strdup(r->id))) { free(m); return eg_fail(err, EG_ERR_NOMEM, "out of memory"), -1; }
        m->file = r->file;
        m->line = r->line;
        m->index = r->index;
        m->seed = id_seed(a->seed, r->id);
        m->hash = gen_record_hash(r->ids.ids, r->ids.n);
        m->line_hash = lh;
        if (a->capture) {
            m->mask = malloc((size_t)n);
            if (!m->mask) { meta_free(m); return eg_fail(err, EG_ERR_NOMEM, "out of memory"), -1; }
            memcpy(m->mask, r->loss_mask, (size_t)n);
        }
        m->next = g->live.next;
        m->prev = &g->live;
        if (g->live.next) g->live.next->prev = m;
        g->live.next = m;
        memset(req, 0, sizeof *req);
        req->id = r->index;
        req->user = m;
        req->tokens = r->ids.ids;
        req->n_tokens = n;
        req->max_new = a->capture ? 0 : (a->max_new < a->max_seq_len - n ? a->max_new : a->max_seq_len - n);
        req->sp.temperature = (float)a->temperature;
        req->sp.top_p = (float)a->top_p;
        req->sp.top_k = a->top_k;
        req->rng = m->seed;
        req->stop_ids = g->stop;
        req->n_stop = g->n_stop;
        return 1;
    }
}

static eg_status on_done(void *vc, const eg_result *res, eg_error *err) {
    gen_run *g = vc;
    gen_args *a = g->a;
    gen_meta *m = res->user;
    eg_status st = EG_OK;
    if (!a->capture && a->drop_truncated && res->finish == EG_FINISH_LENGTH) {
        st = gen_ledger_add(g->ledger, m->index, m->file, m->line, m->id, GEN_OUT_DROPPED,
                            "reached --max-new-tokens (--drop-truncated)", m->line_hash, NULL, err);
        meta_free(m);
        return st;
    }
    if (shard_writer_has_id(g->w, m->id)) { /* a repeated id in flight at the same time */
        st = gen_ledger_add(g->ledger, m->index, m->file, m->line, m->id, GEN_OUT_DUPLICATE, "id already in the dataset",
                            m->line_hash, NULL, err);
        meta_free(m);
        return st;
    }
    int T = res->n_tokens;
    if ((size_t)T > g->mask_cap) {
        uint8_t *p = realloc(g->mask_buf, (size_t)T);
        if (!p) { meta_free(m); return eg_fail(err, EG_ERR_NOMEM, "out of memory"); }
        g->mask_buf = p;
        g->mask_cap = (size_t)T;
    }
    int64_t prompt_len, gen_len;
    if (a->capture) {
        memcpy(g->mask_buf, m->mask, (size_t)T);
        prompt_len = 0;
        while (prompt_len < T && !g->mask_buf[prompt_len]) prompt_len++;
        gen_len = 0;
        for (int i = 0; i < T; i++) gen_len += g->mask_buf[i];
    } else {
        for (int i = 0; i < T; i++) g->mask_buf[i] = i >= res->prompt_len;
        prompt_len = res->prompt_len;
        gen_len = res->n_generated;
    }
    eg_ds_sample s = {
        .id = m->id, .source_file = (char *)m->file, .source_line = (int64_t)m->line, .prompt_len = prompt_len,
        .gen_len = gen_len, .finish = res->finish == EG_FINISH_LENGTH ? EG_DS_FINISH_LENGTH : EG_DS_FINISH_STOP,
        .temperature = a->capture ? 0 : a->temperature, .top_p = a->capture ? 1 : a->top_p,
        .top_k = a->capture ? 0 : a->top_k, .seed = m->seed, .T = T, .n_aux = res->n_aux,
        .H = g->model->cfg.hidden, .input_ids = (int32_t *)res->tokens, .loss_mask = g->mask_buf,
        .hidden_dtype = EG_DS_BF16, .aux_hidden = (void *)res->aux_bf16, .final_hidden = (void *)res->final_bf16,
        .final_pre_hidden = (void *)res->final_pre_bf16};
    st = gen_donelog_add(g->donelog, m->id, m->hash, err);
    if (!st) st = shard_writer_add(g->w, &s, err);
    if (!st) g->written++;
    meta_free(m);
    progress(g, 0);
    return st;
}

/* Records in the inputs when they are all plain (uncompressed) files: non-blank lines. */
static int64_t count_records(corpus_reader *r) {
    int64_t total = 0;
    for (size_t i = 0; i < corpus_n_files(r); i++) {
        const char *p = corpus_file(r, i);
        if (corpus_is_pipe(r, i)) return -1; /* read once, by the corpus */
        FILE *f = fopen(p, "rb");
        if (!f) return -1;
        unsigned char buf[1 << 16];
        size_t n = fread(buf, 1, 4, f);
        if (n >= 2 && ((buf[0] == 0x1f && buf[1] == 0x8b) || (buf[0] == 0x28 && buf[1] == 0xb5) ||
                       (buf[0] == 0xfd && buf[1] == '7') || (buf[0] == 'B' && buf[1] == 'Z'))) {
            fclose(f);
            return -1;
        }
        int content = 0;
        do {
            for (size_t k = 0; k < n; k++) {
                if (buf[k] == '\n') { total += content; content = 0; }
                else if (buf[k] != ' ' && buf[k] != '\t' && buf[k] != '\r') content = 1;
            }
        } while ((n = fread(buf, 1, sizeof buf, f)) > 0);
        total += content;
        fclose(f);
    }
    return total;
}

/* The precision this run computes with, for the manifest's "precision" list
 * (docs/FORMAT.md): always the BF16 cache (eg_engine_opts has no other); FP32 arithmetic
 * on the CPU; on CUDA BF16 GEMM inputs as hi + lo pairs unless EG_CUDA_GEMM=bf16, and
 * the kernel switches as the backend reads them. Malloc'd JSON text, NULL on no memory. */
static char *precision_text(const gen_args *a, int n_stages) {
    int cuda = !strcmp(a->backend, "cuda");
    const char *gm = getenv("EG_CUDA_GEMM");
    json_t *k = json_object();
    if (cuda) {
        static const char *const sw[][2] = {{"EG_CUDA_GEMM", "hilo"}, {"EG_CUDA_FUSE", "1"},  {"EG_CUDA_MOE", "auto"},
                                            {"EG_CUDA_MLA", "auto"},  {"EG_CUDA_GRAPHS", "1"}, {"EG_CUDA_SAMPLE", "auto"}};
        for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
            const char *v = getenv(sw[i][0]);
            json_object_set_new(k, sw[i][0], json_string(v && *v ? v : sw[i][1]));
        }
    } else {
        json_object_set_new(k, "cpu", json_string("reference ops: FP32, fixed reduction order per row"));
    }
    char dev[1024] = "", one[256];
    for (int s = 0; s < (cuda ? n_stages : 1); s++) {
        eg_device_name(a->backend, cuda && a->gpus > 0 ? s % a->gpus : s, one, sizeof one);
        if (!strstr(dev, one))
            snprintf(dev + strlen(dev), sizeof dev - strlen(dev), "%s%s", dev[0] ? "; " : "", one);
    }
    json_t *p = json_pack("{s:s,s:s,s:s,s:o,s:s}", "kv_cache", "bf16", "activations",
                          !cuda ? "fp32" : gm && !strcmp(gm, "bf16") ? "bf16" : "bf16-hilo", "backend", a->backend,
                          "kernels", k, "device", dev);
    char *t = p ? json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(p);
    return t;
}

/* The job's "params" (job.json): what the run was asked for, the drafter by content. a's
 * aux layers as given, or n_aux aux (the config's default set). */
static json_t *job_params(const gen_args *a, const int *aux_l, int n_aux, eg_error *err) {
    json_t *aux = json_array();
    for (int i = 0; i < n_aux; i++) json_array_append_new(aux, json_integer(aux_l[i]));
    json_t *params = json_pack(
        "{s:s, s:s, s:i, s:i, s:f, s:f, s:i, s:I, s:b, s:o, s:s, s:b, s:I, s:i, s:s, s:s, s:i}", "backend",
        a->backend, "mode", a->capture ? "capture" : "regenerate", "max_new_tokens", a->max_new, "max_seq_len",
        a->max_seq_len, "temperature", a->temperature, "top_p", a->top_p, "top_k", a->top_k, "seed",
        (json_int_t)a->seed, "thinking", a->thinking, "aux_layers", aux, "final_hidden",
        a->final_mode == 2 ? "both" : a->final_mode ? "pre-norm" : "post-norm", "drop_truncated", a->drop_truncated, "limit", (json_int_t)a->limit,
        "shard_samples", a->shard_samples, "on_bad_record", a->skip_bad ? "skip" : "error", "worker",
        "", "n_workers", a->n_workers);
    char w[32];
    snprintf(w, sizeof w, "%d/%d", a->worker, a->n_workers);
    json_object_set_new(params, "worker", json_string(w));
    json_object_set_new(params, "shard_bytes", json_integer(a->shard_bytes));
    if (a->draft_model) { /* present only with a drafter: jobs without one resume as before */
        json_t *dm = NULL;
        if (gen_draft_identity(a->draft_model, &dm, err)) {
            json_decref(params); /* holds aux */
            return NULL;
        }
        json_object_set_new(params, "draft_model", dm);
        json_object_set_new(params, "draft_tokens", json_integer(a->draft_tokens));
    }
    return params;
}

static json_t *job_identity(gen_run *g, eg_error *err) {
    gen_args *a = g->a;
    json_t *inputs = NULL;
    if (gen_job_inputs(g->corpus, &inputs, err)) return NULL;
    json_t *params = job_params(a, a->aux, a->n_aux, err);
    if (!params) { json_decref(inputs); return NULL; }
    /* the model by content (config hash, stored weight bytes, each weight file's size and
     * first and last MiB), not by path, so a moved checkpoint still resumes and another
     * checkpoint of the same config and size (a fine-tune, a requantisation) does not */
    json_t *weights = NULL;
    if (gen_weights_fingerprint(a->model, &weights, err)) {
        eg_wrap(err, "--model %s", a->model);
        json_decref(inputs);
        json_decref(params);
        return NULL;
    }
    json_t *fps = json_pack("{s:s, s:I, s:o, s:s, s:o}", "model_config_sha256", g->model->cfg.hash,
                            "model_weight_bytes", (json_int_t)g->model->weight_bytes, "model_weights", weights,
                            "tokenizer_sha256", tok_fingerprint(g->tok), "inputs", inputs);
    /* where model and tokenizer were (absolute; bookkeeping, not identity): `inspect
     * --sample` finds the tokenizer here */
    char mp[PATH_MAX], tp[PATH_MAX];
    char *me = eg_utf8_escape(realpath(a->model, mp) ? mp : a->model); /* JSON holds only UTF-8 */
    char *te = eg_utf8_escape(realpath(a->tokenizer, tp) ? tp : a->tokenizer);
    json_t *paths = me && te ? json_pack("{s:s, s:s}", "model", me, "tokenizer", te) : NULL;
    free(me);
    free(te);
    if (paths && a->draft_model) {
        char *de = eg_utf8_escape(realpath(a->draft_model, mp) ? mp : a->draft_model);
        if (de) json_object_set_new(paths, "draft_model", json_string(de));
        free(de);
    }
    if (!paths) {
        json_decref(params);
        json_decref(fps);
        eg_fail(err, EG_ERR_NOMEM, "out of memory");
        return NULL;
    }
    return json_pack("{s:i, s:o, s:o, s:[s], s:o}", "version", GEN_JOB_VERSION, "params", params, "fingerprints", fps,
                     "eaglegen_versions", gen_version(), "paths", paths);
}

/* --log-json FILE, checked before anything is made (it is opened once the writer has
 * made --out, so the log may live in the job directory): its directory must exist and
 * take a file, or be --out itself, and an existing FILE must be writable. A bad path
 * used to fail after job.json and the manifest were written, and the corrected rerun
 * was then compared with that empty job. */
static eg_status check_log_path(const char *log, const char *out, eg_error *err) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", log);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    struct stat sb;
    if (stat(dir, &sb)) {
        char a[PATH_MAX], b[PATH_MAX];
        snprintf(a, sizeof a, "%s", dir);
        snprintf(b, sizeof b, "%s", out);
        for (size_t n = strlen(a); n > 1 && a[n - 1] == '/'; n--) a[n - 1] = 0;
        for (size_t n = strlen(b); n > 1 && b[n - 1] == '/'; n--) b[n - 1] = 0;
        if (!strcmp(a, b)) return EG_OK; /* in --out, which the run makes */
        return eg_fail(err, EG_ERR_IO, "--log-json %s: %s: %s", log, dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) return eg_fail(err, EG_ERR_IO, "--log-json %s: %s is not a directory", log, dir);
    if (access(log, F_OK) == 0 ? access(log, W_OK) : access(dir, W_OK | X_OK))
        return eg_fail(err, EG_ERR_IO, "--log-json %s: %s", log, strerror(errno));
    return EG_OK;
}

/* A line the runtime decided (each GPU's memory plan), printed as it is made. */
static void print_note(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "  %s\n", line);
}

int cmd_generate(int argc, char **argv) {
    /* the flag-setting handler from the start (main.c blocks SIGINT/SIGTERM until here):
     * a signal during the model load, seconds on a real checkpoint, ends in 130 too */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGINT);
    sigaddset(&ss, SIGTERM);
    pthread_sigmask(SIG_UNBLOCK, &ss, NULL);
    gen_args a;
    /* this worker's writer lock, taken before its job files are read or written, and what
       this start made (to take back, under the lock, if it fails before the writer opens) */
    int lock_fd = -1, made_out = 0;
    char undo_job[4200] = "", undo_lock[4200] = "";
    int rc = parse_args(argc, argv, &a);
    if (rc < 0 && a.dry_run) {
        /* the params the run would write, for the check against an existing job (the
           default aux layers from the config, as the run takes them; a config that does
           not load is the dry run's own error to report) */
        int aux[64], n_aux = a.n_aux;
        memcpy(aux, a.aux, sizeof aux);
        eg_config dc;
        eg_error pe = {0};
        if (!n_aux && !eg_config_load(a.model, &dc, &pe)) {
            n_aux = eg_config_default_aux_layers(&dc, aux);
            eg_config_free(&dc);
        }
        json_t *params = a.out && n_aux ? job_params(&a, aux, n_aux, &pe) : NULL;
        if (a.out && n_aux && !params) {
            fprintf(stderr, "eaglegen generate --dry-run: %s\n", pe.msg);
            free((void *)a.prompts);
            return 1;
        }
        gen_dry_run_opts dro = {
            .model = a.model, .tokenizer = a.tokenizer, .out = a.out, .prompts = a.prompts, .n_prompts = a.n_prompts,
            .capture = a.capture, .thinking = a.thinking, .max_new = a.max_new, .max_seq_len = a.max_seq_len,
            .aux = a.aux, .n_aux = a.n_aux, .limit = a.limit, .worker = a.worker, .n_workers = a.n_workers,
            .shard_samples = a.shard_samples, .shard_bytes = a.shard_bytes, .backend = a.backend, .stages = a.stages,
            .n_final = a.final_mode == 2 ? 2 : 1, .ep = a.ep, .batch = a.batch, .ep_split = a.ep_split,
            .params = params, .restart = a.restart};
        rc = gen_dry_run(&dro, stdout);
        json_decref(params);
    }
    if (rc >= 0) { free((void *)a.prompts); return g_interrupted ? 130 : rc; }
    rc = 1;
    eg_error err = {0};
    gen_run g;
    memset(&g, 0, sizeof g);
    g.a = &a;
    g.records_total = -1;
    eg_model model;
    memset(&model, 0, sizeof model);
    json_t *ident = NULL;
    FILE *jlog = NULL;
    char *job_text = NULL, *prec_text = NULL;
    g.model = &model;

    if (eg_model_load(a.model, &model, &err)) goto done;
    const eg_config *c = &model.cfg;
    if (tok_load(a.tokenizer, &g.tok, &err)) { eg_wrap(&err, "tokenizer %s", a.tokenizer); goto done; }
    if (tok_n_vocab(g.tok) > c->vocab) {
        eg_fail(&err, EG_ERR_CONFIG, "tokenizer %s has %d ids but the model's vocab_size is %d", a.tokenizer,
                tok_n_vocab(g.tok), c->vocab);
        goto done;
    }
    if (!a.n_aux) a.n_aux = eg_config_default_aux_layers(c, a.aux);
    for (int i = 0; i < a.n_aux; i++)
        if (a.aux[i] >= c->n_layers) {
            eg_fail(&err, EG_ERR_INVALID, "--aux-layers: layer %d does not exist (the model has %d layers, 0..%d)",
                    a.aux[i], c->n_layers, c->n_layers - 1);
            goto done;
        }
    /* stop at <|im_end|> and at the config's eos ids */
    g.stop = malloc(sizeof(int32_t) * (size_t)(c->n_eos + 1));
    if (!g.stop) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto done; }
    int32_t im_end = tok_special_id(g.tok, "<|im_end|>");
    if (im_end >= 0) g.stop[g.n_stop++] = im_end;
    for (int i = 0; i < c->n_eos; i++) g.stop[g.n_stop++] = c->eos_ids[i];

    corpus_opts co;
    corpus_opts_default(&co);
    co.mode = a.capture ? CORPUS_CAPTURE : CORPUS_REGENERATE;
    co.thinking = a.thinking;
    co.max_prompt_tokens = (size_t)(a.capture ? a.max_seq_len : a.max_seq_len - 1);
    co.worker = (uint64_t)a.worker;
    co.stop = &g_interrupted; /* a Ctrl-C is not held up by a read from an idle stdin */
    co.on_other_id = seen_other;
    co.on_other_ctx = &g.seen;
    co.n_workers = (uint64_t)a.n_workers;
    co.job_dir = a.out;
    if (corpus_open(a.prompts, (size_t)a.n_prompts, g.tok, &co, &g.corpus, &err)) goto done;
    if (!(ident = job_identity(&g, &err))) goto done;
    char job_name[128], rej_name[128], man_name[128], done_name[128];
    gen_job_filename(job_name, sizeof job_name, "job", "json", a.worker, a.n_workers);
    gen_job_filename(rej_name, sizeof rej_name, "rejects", "jsonl", a.worker, a.n_workers);
    gen_job_filename(man_name, sizeof man_name, "manifest", "json", a.worker, a.n_workers);
    gen_job_filename(done_name, sizeof done_name, "done", "jsonl", a.worker, a.n_workers);
    /* this worker's lock first: the job's state read below cannot change under this run,
       and of two processes starting one worker at once the second stops here, touching
       nothing (it used to remove the job file, or the whole directory it had made, from
       under the first) */
    if (mkdir(a.out, 0755)) {
        if (errno != EEXIST) { eg_fail(&err, EG_ERR_IO, "mkdir %s: %s", a.out, strerror(errno)); goto done; }
    } else {
        made_out = 1;
    }
    {
        eg_shard_writer_opts names = {.worker_index = a.worker, .worker_count = a.n_workers};
        if (shard_writer_lock(a.out, &names, &lock_fd, &err)) {
            if (made_out) rmdir(a.out); /* only while empty */
            goto done;
        }
        shard_writer_lock_path(a.out, &names, undo_lock, sizeof undo_lock);
    }
    /* only checked here; job.json is written once every check passed, so a refused start
     * leaves nothing a later run could mistake for its job */
    gen_resume rs = {0};
    if (!a.restart && gen_resume_check(a.out, job_name, ident, a.n_workers, &rs, &err)) goto done;
    if (gen_worker_join_check(a.out, a.worker, a.n_workers, ident, 0, &err)) goto done;
    int existed = rs.existed;
    if (existed && gen_resume_apply_names(ident, g.corpus, &err)) goto done;
    if (existed && rs.changes[0])
        fprintf(stderr, "eaglegen generate: resuming with changes that leave samples as they are:%s\n", rs.changes);
    if (!(job_text = gen_job_state_text(ident, "running"))) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto done; }

    char model_name[256];
    {
        /* the last path component, trailing slashes ignored: dir, dir/ and a/dir// agree */
        size_t end = strlen(a.model);
        while (end > 1 && a.model[end - 1] == '/') end--;
        size_t beg = end;
        while (beg > 0 && a.model[beg - 1] != '/') beg--;
        if (beg == end) beg = 0; /* "/" */
        snprintf(model_name, sizeof model_name, "%.*s", (int)(end - beg), a.model + beg);
    }
    /* the weights by content, as job.json fingerprints them: what the manifests of one
       dataset (workers, a merge, a resume) must agree on, while the name may differ */
    char weights_sha[65] = "";
    {
        json_t *fp = json_object_get(ident, "fingerprints");
        json_t *wv = json_pack("{s:O?, s:O?}", "model_weight_bytes", json_object_get(fp, "model_weight_bytes"),
                               "model_weights", json_object_get(fp, "model_weights"));
        char *t = wv ? json_dumps(wv, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(wv);
        if (!t) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto done; }
        eg_sha256_hex(t, strlen(t), weights_sha);
        free(t);
    }

    g.records_total = count_records(g.corpus);
    if (g.records_total >= 0 && a.n_workers > 1)
        g.records_total = (g.records_total - a.worker + a.n_workers - 1) / a.n_workers;
    if (a.limit >= 0 && (g.records_total < 0 || a.limit < g.records_total)) g.records_total = a.limit;

    int max_tokens = a.batch > a.chunk ? a.batch : a.chunk; /* auto (0) stays within --chunk */
    int64_t mem_avail = gen_mem_available_bytes();
    /* backends, stages or ranks, the memory plan (printed per GPU as it is made), the KV
     * pool, the slot count and the host budget: engine/runtime.h */
    eg_runtime_opts ro = {
        .model = &model, .backend = a.backend, .threads = a.threads, .gpus = a.gpus,
        .gpu_mem_fraction = a.gpu_mem_fraction, .stages = a.stages, .stage_threads = 1,
        .micro_batches = a.micro_batches, .transport = a.transport, .ep = a.ep, .ep_split = a.ep_split,
        .whole_layers = a.whole_layers,
        .n_slots = a.batch, .max_seq_len = a.max_seq_len, .max_tokens = max_tokens,
        .kv_policy = a.kv_reserve ? EG_KV_RESERVE : EG_KV_ON_DEMAND, .kv_tokens = a.kv_tokens,
        .host_kv_bytes = a.host_kv_gb >= 0 ? (int64_t)(a.host_kv_gb * 1e9) : -1, .ram_bytes = mem_avail,
        .aux_layers = a.aux, .n_aux = a.n_aux, .final_pre_norm = a.final_mode == 1, .final_both = a.final_mode == 2,
        .capture_bf16 = 1, .draft_model = a.draft_model, .draft_tokens = a.draft_tokens, .note = print_note};
    if (eg_runtime_create(&ro, &g.rt, &err)) goto done;
    const eg_runtime_info *ri = eg_runtime_describe(g.rt);
    const int n_stages = ri->n_stages, *stage_ends = ri->stage_ends;
    const int64_t block = ri->block_size, host_kv = ri->host_kv_bytes, seq_host = ri->seq_host_bytes;
    int auto_batch = ri->auto_slots;
    a.batch = ri->n_slots;
    if (!strcmp(a.backend, "cpu")) { /* a model far too large for the reference path says so */
        eg_step_cost sc;
        eg_plan_decode_cost(&model, 0, c->n_layers, a.batch, a.max_seq_len / 2, &sc);
        char wmsg[1024];
        if (gen_cpu_speed_warning(&sc, a.batch, a.threads > 0 ? a.threads : eg_num_threads(), model.weight_bytes,
                                  mem_avail, wmsg, sizeof wmsg))
            fprintf(stderr, "eaglegen generate: %s\n", wmsg);
    }
    if (!(prec_text = precision_text(&a, n_stages))) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto done; }
    eg_shard_writer_opts wo = {
        .model_name = model_name, .model_config_sha256 = c->hash, .model_weights_sha256 = weights_sha,
        .tokenizer_sha256 = tok_fingerprint(g.tok),
        .chat_template = "kimi-k2.5", .thinking = a.thinking, .n_aux = a.n_aux, .aux_layers = a.aux,
        .hidden_size = c->hidden, .target_vocab_size = c->vocab,
        .final_source = a.final_mode == 2 ? EG_DS_FINAL_BOTH : a.final_mode ? EG_DS_FINAL_PRE_NORM : EG_DS_FINAL_POST_NORM,
        .n_layers = c->n_layers, .job_json = job_text,
        .shard_samples = a.shard_samples ? a.shard_samples : -1, .shard_bytes = a.shard_bytes, .threads = a.threads, .worker_index = a.worker,
        .worker_count = a.n_workers, .resume = existed, .precision_json = prec_text};
    /* Every check has passed: the job file goes first, so a run killed between it and the
     * writer's first manifest resumes (the writer starts fresh on a job without one);
     * a writer that cannot open takes back what this run made. */
    if (a.log_json && check_log_path(a.log_json, a.out, &err)) goto done;
    if (a.restart) {
        int64_t removed = 0;
        if (gen_job_restart(a.out, man_name, job_name, rej_name, done_name, &removed, &err)) goto done;
        if (removed) fprintf(stderr, "eaglegen generate: --restart: removed %lld shard%s of the earlier run\n",
                             (long long)removed, removed == 1 ? "" : "s");
    }
    wo.lock_given = 1;
    wo.lock_fd = lock_fd;
    if (!existed) {
        snprintf(undo_job, sizeof undo_job, "%s/%s", a.out, job_name);
        if (gen_job_write(a.out, job_name, ident, &err)) goto done;
    }
    if (shard_writer_open(a.out, &wo, &g.w, &err)) goto done; /* undone at done: */
    if (rs.inputs == GEN_INPUTS_CHANGED) {
        /* the ledger names records by index, which the new inputs renumber: rebuilt. Before
         * job.json takes the new inputs: that rewrite is what a later run compares with, so
         * a run killed between the two would keep the stale ledger and skip good records */
        char aside[160];
        int moved;
        if (gen_set_aside(a.out, rej_name, aside, sizeof aside, &moved, &err)) goto done;
        if (moved) fprintf(stderr, "eaglegen generate: the inputs changed: %s set aside as %s; bad records are "
                                   "checked again\n", rej_name, aside);
    }
    if (rs.rewrite && gen_job_write(a.out, job_name, ident, &err)) goto done;
    {
        eg_shard_writer_stats rws;
        shard_writer_stats(g.w, &rws);
        if (rws.resume_checked)
            fprintf(stderr, "eaglegen generate: resuming: %lld committed shard%s intact (%lld hashed, the others "
                            "unchanged since they were hashed)\n", (long long)rws.resume_checked,
                    rws.resume_checked == 1 ? "" : "s", (long long)rws.resume_hashed);
    }
    if (gen_ledger_open(a.out, rej_name, &g.ledger, &err)) goto done;
    if (gen_donelog_open(a.out, done_name, &g.donelog, &err)) goto done;
    /* after the writer made --out, so the log may live in the job directory */
    if (a.log_json && !(jlog = fopen(a.log_json, "a"))) {
        eg_fail(&err, EG_ERR_IO, "--log-json %s: %s", a.log_json, strerror(errno));
        goto done;
    }
    fprintf(stderr, "eaglegen generate: %s, %s backend, worker %d/%d, %d slots, KV cache %lld tokens, aux layers",
            existed ? "resuming" : "starting", a.backend, a.worker, a.n_workers, a.batch,
            (long long)(ri->ep > 1 ? ri->kv_capacity_all : ri->kv_capacity)); /* the group's, beside its slots */
    for (int i = 0; i < a.n_aux; i++) fprintf(stderr, "%s%d", i ? "," : " ", a.aux[i]);
    fprintf(stderr, "\n");
    {
        int64_t cap = ri->kv_capacity;
        fprintf(stderr, "  KV cache: %s, %lld tokens (%lld blocks of %lld)", a.kv_reserve ? "reserve" : "on-demand",
                (long long)cap, (long long)(cap / block), (long long)block);
        if (!a.kv_reserve)
            fprintf(stderr, ", admission watermark %lld blocks, preempted caches to host up to %.2f GB, then recomputed",
                    (long long)ri->kv_watermark, (double)host_kv / 1e9);
        fprintf(stderr, "; %d slots%s\n", a.batch, auto_batch ? " (--batch auto)" : "");
        /* a GPU pool far larger than the slots: each decode step reads the routed experts
           whatever the batch, so the run goes at a fraction of what the cache allows */
        int64_t pool = ri->ep > 1 ? ri->kv_capacity_all : cap, half = a.max_seq_len / 2 > 0 ? a.max_seq_len / 2 : 1;
        if (!auto_batch && !strcmp(a.backend, "cuda") && pool / half > 4 * (int64_t)a.batch)
            fprintf(stderr, "  note: the KV cache holds about %lld sequences of half --max-seq-len and --batch %d runs "
                            "%d at a time; --batch auto fills it (a decode step reads the experts whatever the "
                            "batch)\n", (long long)(pool / half), a.batch, a.batch);
        if (c->max_pos > 0 && a.max_seq_len > c->max_pos) /* the data would hold positions the model never saw */
            fprintf(stderr, "  note: --max-seq-len %d is past the model's max_position_embeddings %d: a sequence that "
                            "grows beyond it is computed at positions outside what the model was trained for\n",
                    a.max_seq_len, c->max_pos);
        fprintf(stderr, "  host memory per in-flight sequence: up to %.1f MB (captured rows in BF16 and tokens at "
                        "--max-seq-len %d)\n", (double)seq_host / 1e6, a.max_seq_len);
        if (ri->n_drafters)
            fprintf(stderr,
                    "  drafter: %d (one per %s), weights %.1f MB each, paged cache %lld bytes per token held in the "
                    "KV pool's blocks, %.1f MB in all with the slots' rows%s\n",
                    ri->n_drafters, ri->n_drafters > 1 ? "rank" : "engine", (double)ri->draft_weight_bytes / 1e6,
                    (long long)ri->draft_token_bytes, (double)ri->draft_state_bytes / 1e6,
                    ri->draft_device_bytes ? "; the GPU plan counted it (see the plan line)" : "");
        if (ri->n_drafters) {
            fprintf(stderr, "  drafter aux layers");
            for (int i = 0; i < ri->n_draft_aux; i++) fprintf(stderr, "%s%d", i ? "," : " ", ri->draft_aux[i]);
            fprintf(stderr, " (%s)\n", ri->draft_aux_source);
        }
    }
    for (int k = 0, b0 = 0; n_stages > 1 && k < n_stages; b0 = stage_ends[k++]) {
        /* a split layer: its attention and experts [0, cut) end one stage, the rest opens the next */
        char head[96] = "", tail[96] = "";
        int hc = k ? ri->stage_cuts[k - 1] : 0, tc = k < n_stages - 1 ? ri->stage_cuts[k] : 0;
        if (hc) snprintf(head, sizeof head, "layer %d's experts %d-%d, then ", b0 - 1, hc, c->n_experts - 1);
        if (tc) snprintf(tail, sizeof tail, " (layer %d: attention and experts 0-%d)", stage_ends[k] - 1, tc - 1);
        fprintf(stderr, "  stage %d: %slayers %d-%d%s, %.3f GB of weights, %s %d\n", k, head, b0, stage_ends[k] - 1, tail,
                (double)ri->stage_weight_bytes[k] / 1e9, strcmp(a.backend, "cuda") ? "thread" : "GPU",
                ri->stage_device[k]);
    }
    if (n_stages > 1)
        fprintf(stderr, "  transport between stages: %s, %d micro-batches\n", ri->transport, ri->micro_batches);

    g.ledger_at_open = gen_ledger_count(g.ledger, GEN_OUT_REJECTED) + gen_ledger_count(g.ledger, GEN_OUT_DROPPED) +
                       gen_ledger_count(g.ledger, GEN_OUT_DUPLICATE);
    eg_shard_writer_stats ws0;
    shard_writer_stats(g.w, &ws0);
    gen_progress_init(&g.prog, jlog, a.worker, a.n_workers);
    g_rt = g.rt;
    if (ri->ep > 1) {
        int e0 = 0, per = ri->experts_per_rank, ffn = ri->ep_split != EG_EP_SPLIT_NONE,
            vocab = ri->ep_split == EG_EP_SPLIT_ALL;
        fprintf(stderr, "  expert parallel: %d ranks, %d routed experts each (rank 0: %d..%d), %d slots and %lld KV "
                        "tokens over the ranks (rank 0: %lld), %s, exchange %s\n", ri->ep, per, e0,
                per - 1, a.batch, (long long)ri->kv_capacity_all, (long long)ri->kv_capacity,
                vocab ? "shared expert / dense MLP of layer l on rank l mod ranks, embedding and lm_head vocab rows "
                        "r*V/ranks.. on rank r (+split)"
                : ffn ? "shared expert / dense MLP of layer l on rank l mod ranks (+ffn), embedding and lm_head replicated"
                      : "dense parts replicated",
                eg_ep_runtime_exchange(eg_runtime_ep_ranks(g.rt)));
        fprintf(stderr, "  expert parallel: weights per rank (MB):");
        for (int r = 0; r < ri->ep; r++)
            fprintf(stderr, " %.3f", (double)eg_ep_runtime_rank_weight_bytes(eg_runtime_ep_ranks(g.rt), r) / 1e6);
        fprintf(stderr, " (split: %s)\n", vocab ? "all" : ffn ? "ffn" : "none");
        int gpu = !strcmp(ri->backend, "cuda");
        if (ri->ep_groups) {
            fprintf(stderr, "  expert parallel: %d stage groups of %d ranks: each rank's stage k on a %s of its own, "
                            "stage k's routed exchange among the ranks' stage-k %s",
                    ri->n_stages, ri->ep, gpu ? "GPU" : "thread", gpu ? "GPUs" : "threads");
            if (gpu)
                for (int k = 0; k < ri->n_stages; k++)
                    fprintf(stderr, "%s%d..%d", k ? ", " : " (GPUs ", ri->stage_device[k], ri->stage_device[k] + ri->ep - 1);
            fprintf(stderr, "%s\n", gpu ? ")" : "");
        } else if (ri->n_stages > 1) {
            fprintf(stderr, "  expert parallel: each rank runs its %d stages one after another on its one %s\n",
                    ri->n_stages, gpu ? "GPU" : "thread");
        }
        for (int k = 0; k + 1 < ri->n_stages; k++) /* each half a routed call of its own (collective.h) */
            if (ri->stage_cuts[k] > 0) {
                int l = ri->stage_ends[k] - 1, c = ri->stage_cuts[k], E = per * ri->ep, a0, a1, b0, b1;
                eg_ep_opts go = {.n_ranks = ri->ep, .n_experts = E, .n_layers = 1, .layer_cuts = &c};
                eg_ep_share(&go, 0, 0, &a0, &a1); /* rank 0's share of each half */
                eg_ep_share(&go, 0, 1, &b0, &b1);
                char r0[48] = "none", r1[48] = "none";
                if (a1 > a0) snprintf(r0, sizeof r0, "%d..%d", a0, a1 - 1);
                if (b1 > b0) snprintf(r1, sizeof r1, "%d..%d", b0, b1 - 1);
                fprintf(stderr, "  expert parallel: layer %d split between stages %d and %d: its experts 0..%d shared out "
                                "over the ranks (rank 0: %s), then %d..%d (rank 0: %s)\n",
                        l, k, k + 1, c - 1, r0, c, E - 1, r1);
            }
    }
    eg_status run_st = eg_runtime_run(g.rt, next_request, on_done, &g, &err);
    g_rt = NULL;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (g_interrupted && (run_st == EG_OK || run_st == EG_ERR_INTERRUPTED)) run_st = EG_ERR_INTERRUPTED;
    /* commit what is complete, whatever happened */
    eg_error cerr = {0};
    shard_writer_count(g.w, EG_DS_COUNT_GENERATED, 0);
    int64_t want[EG_DS_NCOUNTS] = {0};
    want[EG_DS_COUNT_REJECTED] = gen_ledger_count(g.ledger, GEN_OUT_REJECTED);
    want[EG_DS_COUNT_DROPPED] = gen_ledger_count(g.ledger, GEN_OUT_DROPPED);
    want[EG_DS_COUNT_SKIPPED] = gen_ledger_count(g.ledger, GEN_OUT_DUPLICATE);
    eg_status sync_st = gen_ledger_sync(g.ledger, &cerr);
    eg_status close_st = sync_st ? sync_st : shard_writer_flush(g.w, &cerr);
    if (!close_st) {
        eg_shard_writer_stats ws;
        shard_writer_stats(g.w, &ws);
        want[EG_DS_COUNT_GENERATED] = ws.committed_samples;
        for (int k = 0; k < EG_DS_NCOUNTS; k++)
            shard_writer_count(g.w, k, want[k] - shard_writer_get_count(g.w, k));
        /* the manifest says whether this worker's share is all there (merge checks it) */
        char *fin = gen_job_state_text(ident, run_st == EG_ERR_INTERRUPTED ? "interrupted" : run_st ? "error"
                                              : g.corpus_ended ? "complete" : "limit");
        close_st = fin ? shard_writer_set_job(g.w, fin, &cerr) : eg_fail(&cerr, EG_ERR_NOMEM, "out of memory");
        free(fin);
        if (!close_st) close_st = gen_donelog_sync(g.donelog, &cerr);
        if (!close_st) close_st = shard_writer_close(g.w, &cerr);
    }
    progress(&g, 1);
    gen_progress_state fin_s = progress_state(&g);
    gen_progress_finish(&g.prog, &fin_s, run_st == EG_ERR_INTERRUPTED ? "interrupted" : run_st || close_st ? "error" : "done");
    eg_shard_writer_stats ws;
    shard_writer_stats(g.w, &ws);
    eg_engine_stats es;
    eg_runtime_stats(g.rt, &es);
    if (ri->ep > 1) {
        int64_t pairs, xbytes;
        eg_runtime_traffic(g.rt, &pairs, &xbytes);
        fprintf(stderr, "  expert exchange: %lld (token, expert) pairs crossed ranks", (long long)pairs);
        if (ri->ep_split != EG_EP_SPLIT_NONE)
            fprintf(stderr, ", %lld token rows to another rank's shared expert / dense MLP",
                    (long long)eg_ep_runtime_ffn_rows(eg_runtime_ep_ranks(g.rt)));
        if (ri->ep_split == EG_EP_SPLIT_ALL) {
            int64_t er, lr;
            eg_ep_runtime_vocab_rows(eg_runtime_ep_ranks(g.rt), &er, &lr);
            fprintf(stderr, ", %lld tokens embedded by another rank, %lld logit rows with columns from other ranks",
                    (long long)er, (long long)lr);
        }
        fprintf(stderr, ", %.3f MB moved; steps per rank:", (double)xbytes / 1e6);
        for (int r = 0; r < ri->ep; r++) {
            eg_engine_stats rs;
            eg_ep_runtime_rank_stats(eg_runtime_ep_ranks(g.rt), r, &rs);
            fprintf(stderr, " %lld", (long long)rs.steps);
        }
        fprintf(stderr, "\n");
    }
    fprintf(stderr,
            "eaglegen generate: %s. this run: %lld samples written, %lld already done; dataset: %lld samples in %lld "
            "shards; rejected %lld, dropped %lld, duplicate ids %lld (see %s/%s). %.1f prefill + %.1f decode tok/s.\n",
            run_st == EG_ERR_INTERRUPTED ? "interrupted; rerun the same command to resume" : run_st ? "stopped by an error" : "done",
            (long long)g.written, (long long)g.resumed, (long long)ws.committed_samples, (long long)ws.committed_shards,
            (long long)want[EG_DS_COUNT_REJECTED], (long long)want[EG_DS_COUNT_DROPPED],
            (long long)want[EG_DS_COUNT_SKIPPED], a.out, rej_name,
            es.seconds > 0 ? es.prefill_tokens / es.seconds : 0.0, es.seconds > 0 ? es.decode_tokens / es.seconds : 0.0);
    if (es.steps > 0)
        fprintf(stderr, "eaglegen generate: KV: %.1f sequences in flight on average (peak %d), %.0f%% of the cache "
                        "holding tokens; %lld preemptions (%lld swapped to host, %.1f MB; %lld rows recomputed)\n",
                es.sum_concurrency / (double)es.steps, es.peak_concurrency, 100.0 * es.sum_kv_live / (double)es.steps,
                (long long)es.preemptions, (long long)es.swap_outs, (double)es.swap_bytes / 1e6,
                (long long)es.recomputed_tokens);
    fprintf(stderr, "eaglegen generate: summary: %.1f s wall, %lld samples, %lld tokens (%lld prefill + %lld decode), "
                    "%.3f GB written, %lld rejected/dropped/duplicate, %.2f samples/s\n",
            eg_now() - g.prog.start, (long long)g.written, (long long)(es.prefill_tokens + es.decode_tokens),
            (long long)es.prefill_tokens, (long long)es.decode_tokens,
            (double)(ws.committed_bytes - ws0.committed_bytes) / 1e9,
            (long long)(want[EG_DS_COUNT_REJECTED] + want[EG_DS_COUNT_DROPPED] + want[EG_DS_COUNT_SKIPPED]),
            eg_now() - g.prog.start > 0 ? (double)g.written / (eg_now() - g.prog.start) : 0.0);
    if (a.draft_model) gen_draft_report(stderr, jlog, &es, a.worker, a.n_workers);
    if (g.changed)
        fprintf(stderr, "eaglegen generate: %lld record%s with a done id changed since the sample was made (old samples "
                        "kept)\n", (long long)g.changed, g.changed == 1 ? "" : "s");
    if (g.relogged)
        fprintf(stderr, "eaglegen generate: %lld record%s logged in %s changed since and %s read again\n",
                (long long)g.relogged, g.relogged == 1 ? "" : "s", rej_name, g.relogged == 1 ? "was" : "were");
    eg_forward_graph_stats gs;
    eg_runtime_graph_stats(g.rt, &gs);
    if (gs.recorded || gs.failed)
        fprintf(stderr, "eaglegen generate: graphs: %lld step shapes recorded, %lld replays, %lld recordings fell back to "
                        "op-by-op%s%s\n", (long long)gs.recorded, (long long)gs.replays, (long long)gs.failed,
                gs.failed ? "; first: " : "", gs.first_failure);
    if (close_st) { err = cerr; goto done; }
    if (run_st == EG_ERR_INTERRUPTED) { rc = 130; goto done_quiet; }
    if (run_st) goto done;
    rc = 0;
done:
    if (rc == 1 && g_interrupted) { /* the signal cut setup short (an interrupted read, say) */
        fprintf(stderr, "eaglegen generate: interrupted (%s); rerun the same command to resume\n", err.msg);
        rc = 130;
    } else if (rc == 1) {
        fprintf(stderr, "eaglegen generate: %s\n", err.msg);
    }
done_quiet:
    if (lock_fd >= 0 && !g.w) {
        /* a start that failed before its writer opened takes back what it made, and only
           that, the lock still held: its new job file, and --out when this run made it
           (other workers' files stay: the directory is then not empty) */
        if (undo_job[0]) unlink(undo_job);
        if (made_out) {
            unlink(undo_lock);
            rmdir(a.out);
        }
    }
    while (g.live.next) meta_free(g.live.next);
    eg_runtime_free(g.rt);
    shard_writer_free(g.w);
    if (lock_fd >= 0) close(lock_fd);
    gen_ledger_close(g.ledger);
    gen_donelog_close(g.donelog);
    corpus_record_free(&g.rec);
    seen_free(&g.seen);
    corpus_close(g.corpus);
    tok_free(g.tok);
    eg_model_free(&model);
    json_decref(ident);
    free(job_text);
    free(prec_text);
    free(g.stop);
    free(g.mask_buf);
    free((void *)a.prompts);
    if (jlog) fclose(jlog);
    return rc;
}
