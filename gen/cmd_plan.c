/* eaglegen plan — the pipeline split and per-GPU memory plan, for a checkpoint or a
 * preset's dimensions, next to the tensor-parallel layout that copies the latent
 * cache onto every GPU. Pure arithmetic: nothing is loaded onto a device. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/drafter_eagle3.h"
#include "engine/ep_runtime.h"
#include "engine/forward.h"
#include "engine/layout.h"
#include "engine/mkmodel.h"
#include "engine/plan.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen plan (--model DIR | --preset NAME) --stages N [options]\n"
            "       eaglegen plan (--model DIR | --preset NAME) (--gpus N | --box NAME) [options]\n"
            "\n"
            "With --gpus or --box: every layout the model can run on the box (P pipeline stages\n"
            "x expert-parallel groups of E GPUs with data-parallel attention, P x E = GPUs; the\n"
            "dense parts replicated in the group, \"+ffn\" (each layer's shared expert / dense\n"
            "MLP whole on rank l mod E: generate --ep-split ffn) or \"+split\" (+ffn and the\n"
            "embedding and lm_head vocab-split: generate --ep-split all); tensor parallelism for\n"
            "comparison), each with its weights and KV token slots per GPU, concurrent\n"
            "sequences at --mean-len, and modelled decode and capture-mode prefill tok/s with\n"
            "what bounds them (engine/layout.h; docs/perf_model.py is the same model), then the\n"
            "layout recommended for each mode (what `generate --layout auto` takes for the same\n"
            "--mean-len, --batch and chunk: its --chunk is --prefill-chunk here) and what the\n"
            "decode recommendation splits and why (memory freed, KV slots, exchange cost).\n"
            "\n"
            "With --stages:\n"
            "Splits the layers into N pipeline stages balanced by bytes (weights, plus each\n"
            "layer's BF16 latent cache for an even share of the box's token slots), then prints each\n"
            "stage's weight bytes, free memory and KV capacity in tokens, the box-wide number of\n"
            "concurrent sequences, and the same for tensor parallelism over N GPUs (which keeps\n"
            "a full copy of the latent cache on every GPU). Concurrency is estimated from the\n"
            "expected sequence length (generate's default on-demand KV policy: a sequence holds\n"
            "the blocks it has filled, 1%% of the pool kept free), next to what reserving\n"
            "--prompt-len + --max-new per sequence would hold (--kv-policy reserve). Then the\n"
            "split generate --stages N takes on planned GPUs when it holds more: layers cut\n"
            "between stages (--stages END:CUT,...), with its token slots.\n"
            "\n"
            "options:\n"
            "  --model DIR         a checkpoint (--stages: its exact stored bytes; the layout\n"
            "                      table reads its config.json only, as --preset does)\n"
            "  --preset NAME       tiny, moonlight-16b or kimi-k2.5 (bytes from the config)\n"
            "  --layers N          with --preset: override the layer count (1..4096)\n"
            "  --experts int4|bf16 with --preset: expert format (default int4)\n"
            "  --stages N          pipeline stages = GPUs (this mode; not with --gpus/--box)\n"
            "  --gpu-mem-gb F      memory per GPU in GB (default 96: RTX PRO 6000 Blackwell)\n"
            "  --mem-fraction F    share of it usable (default 0.92)\n"
            "  --act-gb F          activations and workspace per GPU in GB (default 3)\n"
            "  --mean-len N        expected sequence length, prompt + response (default 4096)\n"
            "  --workload lognormal:MEDIAN:SIGMA\n"
            "                      instead of --mean-len: responses of this distribution cut at\n"
            "                      --max-new, after --prompt-len prompt tokens\n"
            "  --prompt-len N      prompt tokens (default 1024)\n"
            "  --max-new N         generate's --max-new-tokens (default 32768)\n"
            "layouts (with --gpus N or --box NAME):\n"
            "  --box NAME          rtx-pro-6000x8 (96 GB, 1.8 TB/s, 500 TFLOP/s, PCIe) or h200x8\n"
            "                      (141 GB, 4.8 TB/s, 990 TFLOP/s, NVLink); options below override\n"
            "  --gpus N            GPUs in the box (default 8 with --box)\n"
            "  --hbm-tbs F         memory bandwidth per GPU, TB/s (default 1.8)\n"
            "  --tflops F          dense BF16 tensor rate per GPU, TFLOP/s (default 500)\n"
            "  --eff F             share of both the kernels reach (default 0.6)\n"
            "  --link pcie|nvlink  collectives: 25 GB/s + 30 us, or 450 GB/s + 10 us (default pcie)\n"
            "  --link-gbs F        per-GPU collective bandwidth, GB/s, each direction\n"
            "  --link-us F         latency per collective, microseconds\n"
            "  --prefill-chunk N   capture-mode prefill rows per GPU per step (default 8192;\n"
            "                      generate --chunk)\n"
            "  --batch N|auto      sequences in flight at most, box-wide, as generate --batch N runs\n"
            "                      (auto: up to --prefill-chunk per expert-parallel rank, as generate\n"
            "                      --batch auto); default: as many as the cache holds\n"
            "  --draft-tokens K    model speculative decoding: K drafted tokens per verify pass\n"
            "                      (an EAGLE-3 drafter layer beside lm_head; needs --accept)\n"
            "  --accept A          tokens committed per verify pass (accepted drafts + 1, 1..K+1;\n"
            "                      generate --draft-model reports it)\n"
            "  --draft-cache-bytes N  the drafter's cache per token (default: the modelled\n"
            "                      drafter's, 64 kv heads of 128 = 32768 on Kimi-K2.5, as the public\n"
            "                      Kimi-K2.5 EAGLE-3 drafters; 8 kv heads: 4096; an MLA drafter: 1152)\n"
            "  --draft-weight-bytes N  the drafter's weights on a GPU (default: the modelled one's)\n"
            "  --draft-model DIR   take both from a drafter's config.json (any layout generate\n"
            "                      --draft-model reads), checked against the model\n"
            "  --whole-layers      every pipeline stage holds whole layers (generate --whole-layers);\n"
            "                      by default a stage may end inside a MoE layer, the layer's routed\n"
            "                      experts split with the next stage, where that holds a larger KV\n"
            "                      pool, as generate --stages N does on planned GPUs\n"
            "  --json              the rows as JSON objects (layout, kv_tokens, concurrency,\n"
            "                      decode_tok_s, prefill_tok_s, dense_split none|ffn|all, ...)\n"
            "                      and the recommendations\n"
            "  -h, --help          this text\n");
}

static json_t *row_json(const eg_layout_row *r) {
    return json_pack("{s:s, s:i, s:i, s:s, s:b, s:b, s:f, s:I, s:f, s:f, s:f, s:s, s:s, s:f, s:f, s:f, s:f}", "layout", r->name,
                     "stages", r->lay.stages, "ep", r->lay.ep, "dense_split", eg_dense_split_name(r->lay.dense_split), "runnable",
                     r->runnable, "fits", r->fits, "weights_gb", r->weights_gb, "kv_tokens", (json_int_t)r->kv_tokens,
                     "concurrency", r->concurrency, "decode_tok_s", r->decode_tok_s, "prefill_tok_s", r->prefill_tok_s,
                     "decode_bound", r->decode_bound ? r->decode_bound : "", "prefill_bound",
                     r->prefill_bound ? r->prefill_bound : "", "decode_step_ms", r->decode_step_ms, "comm_ms",
                     r->comm_ms, "comm_bytes_token_layer", r->comm_bytes_token_layer, "draft_ms", r->draft_ms);
}

static const char *why_not(const eg_layout_row *r) {
    if (!r->fits) return "does not fit";
    if (r->lay.kind == EG_LAYOUT_TP) return "modelled only: eaglegen does not run tensor parallelism";
    if (!r->runnable) return "modelled only";
    if (r->lay.dense_split == EG_SPLIT_FFN) return "--ep-split ffn (CPU and CUDA ranks)";
    if (r->lay.dense_split == EG_SPLIT_ALL) return "--ep-split all (CPU and CUDA ranks)";
    return "";
}

/* The row of the same stages x group as r with dense split s, or NULL. */
static const eg_layout_row *sibling(const eg_layout_row *rows, int n, const eg_layout_row *r, eg_dense_split s) {
    for (int i = 0; i < n; i++)
        if (rows[i].lay.kind == r->lay.kind && rows[i].lay.stages == r->lay.stages && rows[i].lay.ep == r->lay.ep &&
            rows[i].lay.dense_split == s)
            return &rows[i];
    return NULL;
}

/* What the recommended decode layout splits of the dense parts and why: the memory the
 * split frees (heaviest GPU) and the KV slots that buys, against the exchange and step
 * time it costs, each split next to the replicated row of the same group. */
static void print_split_choice(const eg_layout_row *rows, int n, const eg_layout_row *r) {
    if (r->lay.kind != EG_LAYOUT_PP_EP || r->lay.ep < 2) {
        printf("dense parts: %s has no expert-parallel group, nothing to split\n", r->name);
        return;
    }
    const eg_layout_row *none = sibling(rows, n, r, EG_SPLIT_NONE), *ffn = sibling(rows, n, r, EG_SPLIT_FFN),
                        *all = sibling(rows, n, r, EG_SPLIT_ALL);
    const eg_layout_row *alt[2] = {ffn, all};
    const char *what[2] = {"ffn split (shared experts + dense MLPs whole on rank l mod E)",
                           "vocab split (+ embedding and lm_head over the group by vocab rows)"};
    if (!none) return;
    if (r->lay.dense_split == EG_SPLIT_FFN)
        printf("dense parts: ffn split chosen: the KV slots it frees buy more than its exchange and owner time cost\n");
    else if (r->lay.dense_split == EG_SPLIT_ALL)
        printf("dense parts: vocab split chosen: the KV slots it frees buy more than its exchange and owner time cost\n");
    else
        printf("dense parts: replicated chosen: the splits below cost more step time than their KV slots buy\n");
    for (int i = 0; i < 2; i++) {
        const eg_layout_row *x = alt[i];
        if (!x) continue;
        long long dk = (long long)x->kv_tokens - (long long)none->kv_tokens;
        printf("  %s: frees %.1f GB per GPU = %+lldK KV tokens", what[i], none->weights_gb - x->weights_gb, dk / 1000);
        if (x->fits && none->fits)
            printf(", costs %.1f ms/step exchange (step %.1f -> %.1f ms): %s %.0f tok/s against %s %.0f\n",
                   x->comm_ms - none->comm_ms, none->decode_step_ms, x->decode_step_ms, x->name, x->decode_tok_s,
                   none->name, none->decode_tok_s);
        else if (x->fits)
            printf(": %s %.0f tok/s, where %s does not fit\n", x->name, x->decode_tok_s, none->name);
        else
            printf(": %s still does not fit\n", x->name);
    }
}

/* The layout table (or its JSON) and the recommendation per mode. */
/* A drafter's paged cache per token and weights, from DIR/config.json read as generate reads it. */
static eg_status drafter_bytes(const char *dir, const eg_config *target, double *cache, double *weights,
                               eg_error *err) {
    eg_eagle3_config dc;
    eg_eagle3_opts eo = {0};
    eg_status st = eg_drafter_eagle3_read_config(dir, target, &eo, &dc, err);
    if (st) return eg_wrap(err, "--draft-model %s", dir), st;
    *cache = (double)dc.cache_bytes_per_token;
    *weights = (double)dc.weight_bytes;
    eg_eagle3_config_free(&dc);
    return EG_OK;
}

static int print_layouts(const char *what, const eg_config *c, const eg_box *box, const eg_layout_opts *lo,
                         const char *len_from, int json, eg_error *err) {
    int max_rows = eg_layout_max_rows(box->gpus);
    eg_layout_row *rows = calloc((size_t)max_rows, sizeof *rows);
    if (!rows) { eg_fail(err, EG_ERR_NOMEM, "out of memory"); return 1; }
    int n = eg_layout_enumerate(c, box, lo, rows, max_rows, err);
    if (n < 0) { free(rows); return 1; }
    int rd = eg_layout_recommend(rows, n, 0), rp = eg_layout_recommend(rows, n, 1);
    if (json) {
        json_t *arr = json_array(), *o = NULL;
        for (int i = 0; i < n && arr; i++)
            if (json_array_append_new(arr, row_json(&rows[i]))) { json_decref(arr); arr = NULL; }
        if (arr)
            o = json_pack("{s:s, s:{s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:s, s:f, s:f, s:f}, s:f, s:i, s:i, s:i, s:f, s:o, s:s?, s:s?}", "model",
                          what, "box", "name", box->name, "gpus", box->gpus, "mem_gb", box->mem_gb, "act_gb", box->act_gb, "hbm_tbs",
                          box->hbm_tbs, "tflops", box->tflops, "eff", box->eff, "link", box->link, "link_gbs",
                          box->link_gbs, "link_us", box->link_us, "frac", box->frac, "mean_len", lo->mean_len,
                          "max_seqs", lo->max_seqs, "max_seqs_per_rank", lo->max_seqs_per_rank,
                          "draft_tokens", lo->draft_tokens, "accept", lo->draft_tokens ? lo->accept : 1.0, "layouts",
                          arr, "recommended_decode", rd >= 0 ? rows[rd].name : NULL, "recommended_prefill",
                          rp >= 0 ? rows[rp].name : NULL);
        char *txt = o ? json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        if (!txt) { free(rows); eg_fail(err, EG_ERR_NOMEM, "cannot build the JSON (out of memory)"); return 1; }
        printf("%s\n", txt);
        free(txt);
        free(rows);
        return (rd < 0 && rp < 0) ? 1 : 0; /* as the table says it: nothing runnable fits */
    }
    printf("%s on %s: %d GPUs x %.4g GB (%.2f usable, %.1f GB activations), %.2f TB/s, %.0f TFLOP/s, kernel "
           "efficiency %.2f, %s %.0f GB/s + %.0f us per collective; mean length %.0f (%s)\n%s\n",
           what, box->name, box->gpus, box->mem_gb, box->frac, box->act_gb, box->hbm_tbs, box->tflops, box->eff,
           box->link, box->link_gbs, box->link_us, lo->mean_len, len_from,
           lo->whole_layers ? "pipeline rows: whole layers per stage (--whole-layers)\n"
                            : "pipeline rows: KV tokens with the layer split generate --stages N makes on planned GPUs "
                              "(a stage may end inside a MoE layer; --whole-layers: whole layers)\n");
    if (lo->max_seqs > 0) printf("sequences in flight: at most %d box-wide (--batch %d)\n\n", lo->max_seqs, lo->max_seqs);
    if (lo->max_seqs_per_rank > 0)
        printf("sequences in flight: at most %d per expert-parallel rank (--batch auto)\n\n", lo->max_seqs_per_rank);
    if (lo->draft_tokens) {
        double dkv = 0, dw = eg_layout_drafter_bytes(c, &dkv);
        if (lo->draft_cache_bytes > 0) dkv = lo->draft_cache_bytes;
        if (lo->draft_weight_bytes > 0) dw = lo->draft_weight_bytes;
        int given = lo->draft_cache_bytes > 0 || lo->draft_weight_bytes > 0;
        printf("speculative decoding: %d drafted tokens per verify pass, %.2f committed per pass; drafter %.2f GB%s "
               "on the last stage's GPUs, its cache %.0f bytes per token%s\n\n",
               lo->draft_tokens, lo->accept, dw / 1e9, given ? "" : " (modelled EAGLE-3 layer)", dkv,
               given ? " (from the options)" : "");
    }
    int nw = 13; /* "pp32xep128+split" and longer names keep the columns */
    for (int i = 0; i < n; i++)
        if ((int)strlen(rows[i].name) > nw) nw = (int)strlen(rows[i].name);
    printf("%-*s %10s %12s %8s %10s %-8s %6s %11s %-8s  %s\n", nw, "layout", "weights GB", "KV tokens", "seqs",
           "decode t/s", "bound", "ms", "prefill t/s", "bound", "");
    for (int i = 0; i < n; i++) {
        const eg_layout_row *r = &rows[i];
        if (!r->fits)
            printf("%-*s %10.1f %12lld %8s %10s %-8s %6s %11s %-8s  %s\n", nw, r->name, r->weights_gb,
                   (long long)r->kv_tokens, "-", "-", "-", "-", "-", "-", why_not(r));
        else
            printf("%-*s %10.1f %12lld %8.0f %10.0f %-8s %6.1f %11.0f %-8s  %s\n", nw, r->name, r->weights_gb,
                   (long long)r->kv_tokens, r->concurrency, r->decode_tok_s, r->decode_bound, r->decode_step_ms,
                   r->prefill_tok_s, r->prefill_bound, why_not(r));
    }
    const eg_layout_row *pp = NULL;
    for (int i = 0; i < n; i++)
        if (rows[i].lay.kind == EG_LAYOUT_PP_EP && rows[i].lay.ep == 1 && rows[i].fits) pp = &rows[i];
    printf("\n");
    if (rd >= 0) {
        printf("recommended for decode: %s, %.0f tok/s (%s-bound", rows[rd].name, rows[rd].decode_tok_s,
               rows[rd].decode_bound);
        if (pp && pp->decode_tok_s > 0 && pp != &rows[rd])
            printf("; %.2f x %s, the pipeline", rows[rd].decode_tok_s / pp->decode_tok_s, pp->name);
        printf(")\n");
        print_split_choice(rows, n, &rows[rd]);
    }
    int best = -1; /* the fastest fitting row, runnable or not: where the engine should go next */
    for (int i = 0; i < n; i++)
        if (rows[i].fits && rows[i].lay.kind != EG_LAYOUT_TP && (best < 0 || rows[i].decode_tok_s > rows[best].decode_tok_s))
            best = i;
    if (best >= 0 && best != rd)
        printf("fastest modelled for decode: %s, %.0f tok/s (%s)\n", rows[best].name, rows[best].decode_tok_s,
               why_not(&rows[best]));
    if (rp >= 0) {
        printf("recommended for capture-mode prefill: %s, %.0f tok/s (%s-bound)\n", rows[rp].name,
               rows[rp].prefill_tok_s, rows[rp].prefill_bound);
        /* the table holds --act-gb for every buffer, as a run at generate's default --chunk
           needs; the buffers grow with the rows a step takes (the runtime's own sizes) */
        const eg_layout *l = &rows[rp].lay;
        int T = lo->prefill_chunk > 0 ? lo->prefill_chunk : 8192;
        double fw = (double)eg_forward_act_bytes(c, T, 0, 0) / 1e9,
               ex = l->ep > 1 ? (double)eg_ep_runtime_device_bytes(c, l->ep, T, l->dense_split == EG_SPLIT_ALL) / 1e9
                              : 0;
        if (fw + ex > box->act_gb) {
            char exs[96] = "";
            if (l->ep > 1) snprintf(exs, sizeof exs, " and the expert exchange's %.2f GB", ex);
            printf("  memory at --prefill-chunk %d: the table holds %.1f GB a GPU for every buffer (--act-gb), as a "
                   "run at generate's default --chunk needs; at %d rows a step the forward pass's own buffers take "
                   "%.2f GB (on the last stage's GPUs %.2f MB more a sequence in flight, its logits)%s, and the CUDA "
                   "backend's scratch more: a run at that --chunk keeps less cache than the row says (its start "
                   "banner prints the plan)\n",
                   T, box->act_gb, T, fw, 4.0 * c->vocab / 1e6, exs);
        }
    }
    if (rd < 0 && rp < 0) {
        int groups = 0;
        for (int i = 0; i < n; i++) groups += rows[i].lay.kind == EG_LAYOUT_PP_EP;
        if (!groups) /* only tensor parallelism was listed: no P x E = GPUs that the model allows */
            printf("no runnable layout on %d GPUs: a pipeline of P stages x groups of E needs P x E = %d, P at most the "
                   "model's %d layers and E dividing its %d routed experts (1 without experts)\n",
                   box->gpus, box->gpus, c->n_layers, c->n_experts);
        else
            printf("no runnable layout fits this box (see the table: more or larger GPUs)\n");
    }
    free(rows);
    return (rd < 0 && rp < 0) ? 1 : 0;
}

int cmd_plan(int argc, char **argv) {
    const char *model_dir = NULL, *preset = NULL;
    int stages = 0, layers = 0;
    double gpu_gb = 96, frac = 0.92, act_gb = 3, mean_len = EG_LAYOUT_MEAN_LEN;
    int experts = EG_MK_EXPERTS_INT4;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'},      {"preset", 1, 0, 'p'},       {"layers", 1, 0, 'l'}, {"experts", 1, 0, 'e'},
        {"stages", 1, 0, 's'},     {"gpu-mem-gb", 1, 0, 'g'},   {"mem-fraction", 1, 0, 'f'},
        {"act-gb", 1, 0, 'a'},     {"mean-len", 1, 0, 'n'},     {"help", 0, 0, 'h'},
        {"workload", 1, 0, 'w'},   {"prompt-len", 1, 0, 'P'},   {"max-new", 1, 0, 'M'},
        {"box", 1, 0, 'B'},        {"gpus", 1, 0, 'G'},         {"hbm-tbs", 1, 0, 'W'}, {"tflops", 1, 0, 'T'},
        {"eff", 1, 0, 'E'},        {"link", 1, 0, 'k'},         {"link-gbs", 1, 0, 'K'}, {"link-us", 1, 0, 'U'},
        {"prefill-chunk", 1, 0, 'c'}, {"json", 0, 0, 'j'},      {"draft-tokens", 1, 0, 'D'},
        {"accept", 1, 0, 'A'},     {"draft-cache-bytes", 1, 0, 'C'}, {"draft-model", 1, 0, 'R'},
        {"draft-weight-bytes", 1, 0, 'X'}, {"whole-layers", 0, 0, 'H'}, {"batch", 1, 0, 'Y'}, {0, 0, 0, 0}};
    const char *draft_dir = NULL;
    int draft_tokens = 0;
    double accept = 0, draft_cache = 0, draft_weight = 0;
    const char *box_name = NULL, *link = NULL;
    int gpus = 0, json = 0, chunk = 8192, set_mem = 0, set_frac = 0, set_act = 0, whole_layers = 0;
    int batch = 0; /* --batch: 0 none, -1 auto */
    double hbm = 0, tflops = 0, eff = 0, link_gbs = 0, link_us = -1;
    const char *workload = NULL;
    int mean_given = 0;
    int prompt_len = 1024, max_new = 32768;
    const char *layout_only = NULL, *preset_only = NULL; /* an option of the other mode, as given */
    optind = 1;
    int ch;
    while ((ch = gen_getopt(argc, argv, "plan", "h", opts)) != -1) {
        for (const struct option *o = opts; ch > 0 && o->name; o++)
            if (o->val == ch && strchr("WTEkKUcjDACRXHY", ch) && !layout_only) layout_only = o->name;
            else if (o->val == ch && strchr("le", ch) && !preset_only) preset_only = o->name;
        switch (ch) {
        case 'm': model_dir = optarg; break;
        case 'p': preset = optarg; break;
        case 'l': if (!gen_arg_int("plan", "--layers", optarg, 1, 4096, &layers)) return 2; break;
        case 'e':
            if (!strcmp(optarg, "int4")) experts = EG_MK_EXPERTS_INT4;
            else if (!strcmp(optarg, "bf16")) experts = EG_MK_EXPERTS_BF16;
            else { fprintf(stderr, "eaglegen plan: --experts expects int4 or bf16\n"); return 2; }
            break;
        case 's': if (!gen_arg_int("plan", "--stages", optarg, 1, 4096, &stages)) return 2; break;
        case 'g': if (!gen_arg_double("plan", "--gpu-mem-gb", optarg, 0.001, 1e6, &gpu_gb)) return 2; set_mem = 1; break;
        case 'f': if (!gen_arg_double("plan", "--mem-fraction", optarg, 0.01, 1, &frac)) return 2; set_frac = 1; break;
        case 'a': if (!gen_arg_double("plan", "--act-gb", optarg, 0, 1e6, &act_gb)) return 2; set_act = 1; break;
        case 'B': box_name = optarg; break;
        case 'G': if (!gen_arg_int("plan", "--gpus", optarg, 1, 4096, &gpus)) return 2; break;
        case 'W': if (!gen_arg_double("plan", "--hbm-tbs", optarg, 1e-6, 1e6, &hbm)) return 2; break;
        case 'T': if (!gen_arg_double("plan", "--tflops", optarg, 1e-6, 1e9, &tflops)) return 2; break;
        case 'E': if (!gen_arg_double("plan", "--eff", optarg, 0.01, 1, &eff)) return 2; break;
        case 'k': link = optarg; break;
        case 'K': if (!gen_arg_double("plan", "--link-gbs", optarg, 1e-6, 1e9, &link_gbs)) return 2; break;
        case 'U': if (!gen_arg_double("plan", "--link-us", optarg, 0, 1e9, &link_us)) return 2; break;
        case 'c': if (!gen_arg_int("plan", "--prefill-chunk", optarg, 1, 1 << 24, &chunk)) return 2; break;
        case 'j': json = 1; break;
        case 'H': whole_layers = 1; break;
        case 'Y':
            if (!strcmp(optarg, "auto")) batch = -1;
            else if (!gen_arg_int("plan", "--batch", optarg, 1, 1 << 24, &batch)) return 2;
            break;
        case 'D': if (!gen_arg_int("plan", "--draft-tokens", optarg, 1, 64, &draft_tokens)) return 2; break;
        case 'A': if (!gen_arg_double("plan", "--accept", optarg, 1, 65, &accept)) return 2; break;
        case 'C': if (!gen_arg_double("plan", "--draft-cache-bytes", optarg, 1, 1e12, &draft_cache)) return 2; break;
        case 'R': draft_dir = optarg; break;
        case 'X': if (!gen_arg_double("plan", "--draft-weight-bytes", optarg, 1, 1e15, &draft_weight)) return 2; break;
        case 'n':
            if (!gen_arg_double("plan", "--mean-len", optarg, 1, 1e9, &mean_len)) return 2;
            mean_given = 1;
            break;
        case 'w': workload = optarg; break;
        case 'P': if (!gen_arg_int("plan", "--prompt-len", optarg, 1, 1 << 30, &prompt_len)) return 2; break;
        case 'M': if (!gen_arg_int("plan", "--max-new", optarg, 1, 1 << 30, &max_new)) return 2; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    if (optind < argc) { fprintf(stderr, "eaglegen plan: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (workload && mean_given) {
        fprintf(stderr, "eaglegen plan: --workload gives the lengths instead of --mean-len: give one or the other\n");
        return 2;
    }
    int layouts = gpus > 0 || box_name;
    if (!!model_dir == !!preset || (stages < 1 && !layouts)) {
        fprintf(stderr, "eaglegen plan: give exactly one of --model or --preset, and --stages or --gpus/--box (see --help)\n");
        return 2;
    }
    if (stages > 0 && layouts) {
        fprintf(stderr, "eaglegen plan: --stages plans one pipeline; --gpus/--box lists every layout: give one of them\n");
        return 2;
    }
    if (stages > 0 && layout_only) {
        fprintf(stderr, "eaglegen plan: --%s applies to the layout table (--gpus/--box), not to --stages\n", layout_only);
        return 2;
    }
    if (model_dir && preset_only) {
        fprintf(stderr, "eaglegen plan: --%s applies to --preset (a checkpoint's config says it)\n", preset_only);
        return 2;
    }
    eg_error err = {0};
    eg_box box;
    memset(&box, 0, sizeof box);
    if (layouts) { /* a preset box, then every explicit option over it */
        if (box_name) {
            if (eg_box_preset(box_name, &box, &err)) { fprintf(stderr, "eaglegen plan: --box: %s\n", err.msg); return 2; }
        } else {
            snprintf(box.name, sizeof box.name, "%d GPUs", gpus);
            box.mem_gb = 96; box.frac = 0.92; box.act_gb = 3; box.hbm_tbs = 1.8; box.tflops = 500; box.eff = 0.6;
            eg_box_link("pcie", &box, &err);
        }
        if (gpus) box.gpus = gpus;
        if (set_mem || !box_name) box.mem_gb = gpu_gb;
        if (set_frac || !box_name) box.frac = frac;
        if (set_act || !box_name) box.act_gb = act_gb;
        if (hbm > 0) box.hbm_tbs = hbm;
        if (tflops > 0) box.tflops = tflops;
        if (eff > 0) box.eff = eff;
        if (link && eg_box_link(link, &box, &err)) { fprintf(stderr, "eaglegen plan: --link: %s\n", err.msg); return 2; }
        if (link_gbs > 0) box.link_gbs = link_gbs;
        if (link_us >= 0) box.link_us = link_us;
    }
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
    int64_t *lb = NULL, head, tail, tail1;
    double *cost = NULL;
    int *ends = NULL;
    eg_stage_mem *sm = NULL;
    if (model_dir && layouts) { /* the table models bytes from the config, as for a preset */
        if (eg_config_load(model_dir, &cfg, &err)) goto out;
        c = &cfg;
    } else if (model_dir) {
        if (eg_model_load(model_dir, &m, &err)) goto out;
        c = &m.cfg;
    } else {
        eg_mkmodel_opts mo = {.preset = preset, .layers = layers, .experts = experts};
        char *json = NULL;
        if (eg_mkmodel_config_json(&mo, &json, &err)) {
            rc = err.code == EG_ERR_NOMEM ? 1 : 2; /* an unknown preset is a usage error */
            goto out;
        }
        eg_status st = eg_config_parse(json, strlen(json), preset, &cfg, &err);
        free(json);
        if (st) goto out;
        c = &cfg;
    }
    if (layouts) {
        if (!draft_tokens != !accept || (draft_tokens && accept > draft_tokens + 1)) {
            fprintf(stderr, "eaglegen plan: --draft-tokens K and --accept A go together, 1 <= A <= K + 1 (A counts the "
                            "accepted drafts plus the token every verify pass adds)\n");
            rc = 2;
            goto out;
        }
        if ((draft_cache > 0 || draft_dir) && !draft_tokens) {
            fprintf(stderr, "eaglegen plan: --draft-cache-bytes / --draft-model describe the drafter of --draft-tokens K "
                            "--accept A\n");
            rc = 2;
            goto out;
        }
        if ((draft_cache > 0 || draft_weight > 0) && draft_dir) {
            fprintf(stderr, "eaglegen plan: give --draft-cache-bytes / --draft-weight-bytes or --draft-model, not both\n");
            rc = 2;
            goto out;
        }
        if (draft_weight > 0 && !draft_tokens) {
            fprintf(stderr, "eaglegen plan: --draft-weight-bytes describes the drafter of --draft-tokens K --accept A\n");
            rc = 2;
            goto out;
        }
        if (draft_dir && drafter_bytes(draft_dir, c, &draft_cache, &draft_weight, &err)) goto out;
        eg_layout_opts lo = {.mean_len = mean_len, .prefill_chunk = chunk, .draft_tokens = draft_tokens,
                             .accept = accept, .draft_cache_bytes = draft_cache, .draft_weight_bytes = draft_weight,
                             .whole_layers = whole_layers, .max_seqs = batch > 0 ? batch : 0,
                             .max_seqs_per_rank = batch < 0 ? chunk : 0};
        rc = print_layouts(model_dir ? model_dir : preset, c, &box, &lo, len_from, json, &err);
        goto out;
    }
    int L = c->n_layers;
    lb = malloc(sizeof *lb * (size_t)L);
    cost = malloc(sizeof *cost * (size_t)L);
    ends = malloc(sizeof *ends * (size_t)n);
    sm = malloc(sizeof *sm * (size_t)n);
    if (!lb || !cost || !ends || !sm) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto out; }
    /* tail: the pipeline's last stage, which holds its own copy of a tied head; tail1: the
     * model's bytes (one GPU, or tensor parallelism's shards, share the embedding) */
    head = model_dir ? eg_plan_head_bytes(&m, n, &tail) : eg_plan_head_bytes_cfg(c, n, &tail);
    if (model_dir) eg_plan_head_bytes(&m, 1, &tail1);
    else eg_plan_head_bytes_cfg(c, 1, &tail1);
    int64_t kv_layer = eg_plan_kv_bytes_per_token_layer(c), total = head + tail1;
    for (int l = 0; l < L; l++) {
        lb[l] = model_dir ? eg_plan_layer_bytes(&m, l) : eg_plan_layer_bytes_cfg(c, l);
        total += lb[l];
    }
    /* balance weights plus the cache for an even share of the box's sequences */
    double dev = gpu_gb * 1e9,
           tokens_guess = (dev * frac * n - (double)(total + tail - tail1) - act_gb * 1e9 * n) / (double)(kv_layer * L);
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
    if (n > 1) { /* what generate --stages N does on planned GPUs (engine/runtime.c): split layers if that holds more */
        eg_plan_layer_parts *parts = malloc(sizeof *parts * (size_t)L);
        int64_t *budget = malloc(sizeof *budget * (size_t)n);
        int *ce = malloc(sizeof *ce * (size_t)n), *cc = malloc(sizeof *cc * (size_t)n);
        eg_error perr = {0};
        int64_t x = 0;
        if (parts && budget && ce && cc) {
            for (int l = 0; l < L; l++) {
                if (model_dir) eg_plan_layer_parts_of(&m, l, &parts[l]);
                else eg_plan_layer_parts_cfg(c, l, &parts[l]);
            }
            for (int k = 0; k < n; k++)
                budget[k] = (int64_t)(dev * frac) - (int64_t)(act_gb * 1e9) - (k == 0 ? head : 0) - (k == n - 1 ? tail : 0);
            if (!eg_plan_split_kv(parts, L, budget, n, kv_layer, 0, 1, ce, cc, &x, &perr) && x > min_tokens) {
                printf("\nwith layers split between stages (generate --stages %d on planned GPUs; --whole-layers keeps the "
                       "split above): --stages ", n);
                for (int k = 0; k < n; k++) printf(cc[k] ? "%s%d:%d" : "%s%d", k ? "," : "", ce[k], cc[k]);
                printf("\n  %lld token slots box-wide (%+.0f%%), %.0f concurrent sequences at mean length %.0f (on demand)\n",
                       (long long)x, 100.0 * ((double)x / (double)(min_tokens > 0 ? min_tokens : 1) - 1),
                       eg_plan_concurrency_on_demand(x, mean_len, wm), mean_len);
            }
        }
        free(parts); free(budget); free(ce); free(cc);
    }
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
    if (rc && err.msg[0]) fprintf(stderr, "eaglegen plan: %s\n", err.msg); /* else said already */
    free(lb); free(cost); free(ends); free(sm);
    eg_model_free(&m);
    eg_config_free(&cfg);
    return rc;
}
