/* eaglegen forward — teacher-forced hidden states and logits for token prompts, in the
 * fixtures' golden layout. A user's tool for validating a deployment against a
 * reference, and the engine's test harness. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/runtime.h"
#include "engine/safetensors.h"
#include "gen/args.h"
#include "gen/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: eaglegen forward --model DIR --prompts P.json --out OUT.safetensors [options]\n"
            "\n"
            "Runs each prompt through the model (teacher-forced) and writes, per prompt i:\n"
            "  p{i}.tokens  I32 [T]        the prompt (plus generated tokens with --generate)\n"
            "  p{i}.hidden  F32 [L+1,T,H]  [0] embedding output, [l] output of decoder layer l-1\n"
            "  p{i}.normed  F32 [T,H]      final RMSNorm output (lm_head input)\n"
            "  p{i}.logits  F32 [T,V]      logits at every position\n"
            "P.json is {\"prompts\": [[ids...], ...]}. Metadata prompt_lens lists the prompt lengths.\n"
            "\n"
            "options:\n"
            "  --model DIR        Hugging Face checkpoint directory (required)\n"
            "  --prompts FILE     prompts JSON (required)\n"
            "  --out FILE         output safetensors (required; written atomically)\n"
            "  --generate N       first extend each prompt by N greedy tokens (default 0)\n"
            "  --backend NAME     cpu or cuda (default cpu)\n"
            "  --threads N        CPU threads (default: all cores, or $EG_THREADS)\n"
            "  --chunk N          rows per forward step, i.e. the prefill chunk (default 256)\n"
            "  --block-size N     KV cache block size in tokens (default 64)\n"
            "  --stages a,b,...   run the layers as pipeline stages ending at these layers; an\n"
            "                     end a:CUT splits layer a-1's routed experts at CUT between\n"
            "                     two stages (the same bytes either way)\n"
            "  -h, --help         this text\n"
            "\n"
            "exit status: 0 ok, 1 a failure (also options the model refuses, such as --stages past its\n"
            "layers), 2 usage error (options as written)\n");
}

typedef struct {
    json_t *prompts;
    size_t next;
    int generate;
    int L1; /* captures per token: L + 1 */
    int64_t H, V;
    eg_st_writer *w;
    int32_t *buf; /* [cap] the current prompt's ids */
    size_t cap;
} fwd_ctx;

static int next_prompt(void *vc, eg_request *r, eg_error *err) {
    fwd_ctx *c = vc;
    if (c->next >= json_array_size(c->prompts)) return 0;
    json_t *p = json_array_get(c->prompts, c->next);
    size_t n = json_array_size(p);
    if (n > c->cap) {
        int32_t *nb = realloc(c->buf, sizeof(int32_t) * n);
        if (!nb) return eg_fail(err, EG_ERR_NOMEM, "out of memory"), -1;
        c->buf = nb;
        c->cap = n;
    }
    int32_t *buf = c->buf;
    for (size_t i = 0; i < n; i++) buf[i] = (int32_t)json_integer_value(json_array_get(p, i));
    memset(r, 0, sizeof *r);
    r->id = c->next;
    r->tokens = buf;
    r->n_tokens = (int)n;
    r->max_new = c->generate;
    r->sp.temperature = 0;
    r->sp.top_p = 1;
    c->next++;
    return 1;
}

static eg_status on_done(void *vc, const eg_result *r, eg_error *err) {
    fwd_ctx *c = vc;
    int64_t T = r->n_tokens, H = c->H, V = c->V;
    float *hidden = malloc(sizeof(float) * (size_t)(c->L1 * T * H));
    if (!hidden) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->L1; l++)
        for (int64_t t = 0; t < T; t++)
            memcpy(hidden + ((int64_t)l * T + t) * H, r->aux + (t * c->L1 + l) * H, sizeof(float) * (size_t)H);
    char name[64];
    eg_status st;
    int64_t s1[1] = {T}, s3[3] = {c->L1, T, H}, s2[2] = {T, H}, sv[2] = {T, V};
    snprintf(name, sizeof name, "p%llu.tokens", (unsigned long long)r->id);
    if ((st = eg_st_writer_add_copy(c->w, name, EG_ST_I32, 1, s1, r->tokens, err))) goto out;
    snprintf(name, sizeof name, "p%llu.hidden", (unsigned long long)r->id);
    if ((st = eg_st_writer_add_copy(c->w, name, EG_ST_F32, 3, s3, hidden, err))) goto out;
    snprintf(name, sizeof name, "p%llu.normed", (unsigned long long)r->id);
    if ((st = eg_st_writer_add_copy(c->w, name, EG_ST_F32, 2, s2, r->final, err))) goto out;
    snprintf(name, sizeof name, "p%llu.logits", (unsigned long long)r->id);
    st = eg_st_writer_add_copy(c->w, name, EG_ST_F32, 2, sv, r->logits, err);
out:
    free(hidden);
    return st;
}

int cmd_forward(int argc, char **argv) {
    const char *model_dir = NULL, *prompts_path = NULL, *out_path = NULL, *backend = "cpu", *stages_arg = NULL;
    int generate = 0, threads = 0, chunk = 256, block = 64;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},   {"prompts", required_argument, 0, 'p'},
        {"out", required_argument, 0, 'o'},     {"generate", required_argument, 0, 'g'},
        {"backend", required_argument, 0, 'b'}, {"threads", required_argument, 0, 't'},
        {"chunk", required_argument, 0, 'c'},   {"block-size", required_argument, 0, 'B'},
        {"stages", required_argument, 0, 's'},  {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    optind = 1;
    int ch;
    while ((ch = gen_getopt(argc, argv, "forward", "h", opts)) != -1) {
        switch (ch) {
        case 'm': model_dir = optarg; break;
        case 'p': prompts_path = optarg; break;
        case 'o': out_path = optarg; break;
        case 'b':
            backend = optarg;
            if (strcmp(backend, "cpu") && strcmp(backend, "cuda")) {
                fprintf(stderr, "eaglegen forward: unknown backend '%s' (expected cpu or cuda)\n", backend);
                return 2;
            }
            break;
        case 's': stages_arg = optarg; break;
        case 'g': if (!gen_arg_int("forward", "--generate", optarg, 0, 1 << 24, &generate)) return 2; break;
        case 't': if (!gen_arg_int("forward", "--threads", optarg, 1, 4096, &threads)) return 2; break;
        case 'c': if (!gen_arg_int("forward", "--chunk", optarg, 1, 1 << 20, &chunk)) return 2; break;
        case 'B': if (!gen_arg_int("forward", "--block-size", optarg, 1, 1 << 16, &block)) return 2; break;
        case 'h': usage(stdout); return 0;
        default: return 2; /* gen_getopt said why */
        }
    }
    if (optind < argc) { fprintf(stderr, "eaglegen forward: unexpected argument '%s'\n", argv[optind]); return 2; }
    if (!model_dir || !prompts_path || !out_path) {
        fprintf(stderr, "eaglegen forward: --model, --prompts and --out are required\n");
        usage(stderr);
        return 2;
    }
    eg_error err = {0};
    json_error_t jerr;
    json_t *root = json_load_file(prompts_path, 0, &jerr);
    if (!root) {
        if (jerr.line > 0) fprintf(stderr, "eaglegen forward: %s:%d: %s\n", prompts_path, jerr.line, jerr.text);
        else fprintf(stderr, "eaglegen forward: %s: %s\n", prompts_path, jerr.text); /* not opened: no line */
        return 1;
    }
    json_t *prompts = json_object_get(root, "prompts");
    if (!json_is_array(prompts) || json_array_size(prompts) == 0) {
        fprintf(stderr, "eaglegen forward: %s: expected {\"prompts\": [[ids...], ...]} with at least one prompt\n", prompts_path);
        json_decref(root);
        return 1;
    }
    eg_model model;
    memset(&model, 0, sizeof model);
    eg_runtime *rt = NULL;
    eg_st_writer *w = NULL;
    int rc = 1, *aux = NULL, stage_ends[256], stage_cuts[256] = {0}, n_stages = 0, any_cut = 0;
    fwd_ctx ctx = {0};
    if (eg_model_load(model_dir, &model, &err)) goto fail;
    const eg_config *c = &model.cfg;
    int max_len = 0;
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *p = json_array_get(prompts, i);
        if (!json_is_array(p) || json_array_size(p) == 0) {
            eg_fail(&err, EG_ERR_FORMAT, "%s: prompt %zu is not a non-empty array of token ids", prompts_path, i);
            goto fail;
        }
        for (size_t k = 0; k < json_array_size(p); k++) {
            json_t *v = json_array_get(p, k);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->vocab) {
                eg_fail(&err, EG_ERR_FORMAT, "%s: prompt %zu, token %zu: not a token id in [0, %d)", prompts_path, i, k, c->vocab);
                goto fail;
            }
        }
        if ((int)json_array_size(p) > max_len) max_len = (int)json_array_size(p);
    }
    if (stages_arg) { /* END or END:CUT, comma-separated */
        n_stages = eg_runtime_stages_syntax(stages_arg, stage_ends, stage_cuts, 256);
        for (int k = 0; k < n_stages; k++) any_cut |= stage_cuts[k] > 0;
        if (n_stages < 1) {
            fprintf(stderr, "eaglegen forward: --stages expects ascending end layers a,b,... (an end as a:CUT), got "
                            "'%s'\n", stages_arg);
            rc = 2;
            goto fail;
        }
    }
    if (c->max_pos > 0 && max_len + generate > c->max_pos) /* as generate's note on --max-seq-len */
        fprintf(stderr, "eaglegen forward: note: %d positions (longest prompt %d + --generate %d) are past the "
                        "model's max_position_embeddings %d: those are computed at positions outside what the model "
                        "was trained for\n", max_len + generate, max_len, generate, c->max_pos);
    aux = malloc(sizeof(int) * (size_t)(c->n_layers + 1));
    if (!aux) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto fail; }
    for (int l = 0; l <= c->n_layers; l++) aux[l] = l - 1;
    int n_slots = (int)json_array_size(prompts) < 8 ? (int)json_array_size(prompts) : 8;
    /* one backend; --stages run one after another on it (engine/runtime.h) */
    eg_runtime_opts ro = {.model = &model, .backend = backend, .threads = threads, .n_slots = n_slots,
                          .max_seq_len = max_len + generate + 1, .max_tokens = chunk, .block_size = block,
                          .stage_ends = n_stages ? stage_ends : NULL, .stage_cuts = any_cut ? stage_cuts : NULL,
                          .n_stages = n_stages, .aux_layers = aux,
                          .n_aux = c->n_layers + 1, .want_logits = 1};
    if (eg_runtime_create(&ro, &rt, &err)) goto fail;
    if (eg_st_writer_new(&w, &err)) goto fail;
    ctx = (fwd_ctx){.prompts = prompts, .generate = generate, .L1 = c->n_layers + 1, .H = c->hidden, .V = c->vocab, .w = w};
    if (eg_runtime_run(rt, next_prompt, on_done, &ctx, &err)) goto fail;
    {
        /* as many lengths as prompts: a fixed buffer cut the list short past a few thousand */
        json_t *lens = json_array();
        for (size_t i = 0; lens && i < json_array_size(prompts); i++)
            if (json_array_append_new(lens, json_integer((json_int_t)json_array_size(json_array_get(prompts, i))))) {
                json_decref(lens);
                lens = NULL;
            }
        char *txt = lens ? json_dumps(lens, 0) /* "[1, 5]", as the goldens write it */ : NULL;
        json_decref(lens);
        if (!txt) { eg_fail(&err, EG_ERR_NOMEM, "out of memory"); goto fail; }
        eg_status st = eg_st_writer_meta(w, "prompt_lens", txt, &err);
        free(txt);
        if (st || eg_st_writer_meta(w, "generated", generate ? "greedy" : "0", &err)) goto fail;
    }
    if (eg_st_writer_write(w, out_path, &err)) goto fail;
    eg_engine_stats st;
    eg_runtime_stats(rt, &st);
    fprintf(stderr, "eaglegen forward: %zu prompts, %lld tokens in %.2f s -> %s\n", json_array_size(prompts),
            (long long)(st.prefill_tokens + st.decode_tokens), st.seconds, out_path);
    eg_forward_graph_stats gs;
    eg_runtime_graph_stats(rt, &gs);
    if (gs.recorded || gs.failed)
        fprintf(stderr, "eaglegen forward: graphs: %lld step shapes recorded, %lld replays, %lld recordings fell back%s%s\n",
                (long long)gs.recorded, (long long)gs.replays, (long long)gs.failed, gs.failed ? "; first: " : "",
                gs.first_failure);
    rc = 0;
fail:
    if (rc == 1) fprintf(stderr, "eaglegen forward: %s\n", err.msg);
    eg_st_writer_free(w);
    eg_runtime_free(rt);
    eg_model_free(&model);
    free(aux);
    free(ctx.buf);
    json_decref(root);
    return rc;
}
