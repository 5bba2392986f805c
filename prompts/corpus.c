/* Streaming JSONL corpus; see corpus.h. */
#include "prompts/corpus.h"

#include <archive.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#define DEFAULT_MAX_LINE ((size_t)256 << 20)
#define READ_BLOCK ((size_t)1 << 20)

void corpus_opts_default(corpus_opts *o) {
    memset(o, 0, sizeof *o);
    o->mode = CORPUS_REGENERATE;
    o->thinking = 1;
    o->add_generation_prompt = 1;
    o->text_only = 1;
    o->max_line_bytes = DEFAULT_MAX_LINE;
}

const char *corpus_format_name(corpus_format f) {
    switch (f) {
    case CORPUS_FMT_NONE: return "none";
    case CORPUS_FMT_MESSAGES: return "messages";
    case CORPUS_FMT_CONVERSATIONS: return "conversations";
    case CORPUS_FMT_PROMPT: return "prompt";
    case CORPUS_FMT_TEXT: return "text";
    case CORPUS_FMT_INPUT_IDS: return "input_ids";
    }
    return "?";
}

/* ------------------------------------------------------------ record scratch */

struct corpus_scratch {
    chat_msg *msgs;
    size_t msgs_cap;
    chat_tool_call *calls;
    size_t calls_cap;
    char **owned; /* strings made for this record (joined parts, dumped arguments) */
    size_t n_owned, owned_cap;
};

static void scratch_reset(corpus_scratch *s) {
    for (size_t i = 0; i < s->n_owned; i++) free(s->owned[i]);
    s->n_owned = 0;
}

void corpus_record_free(corpus_record *rec) {
    if (!rec) return;
    free(rec->id);
    tok_seq_free(&rec->ids);
    free(rec->loss_mask);
    chat_render_free(&rec->render);
    free(rec->raw);
    if (rec->scratch_) {
        scratch_reset(rec->scratch_);
        free(rec->scratch_->msgs);
        free(rec->scratch_->calls);
        free(rec->scratch_->owned);
        free(rec->scratch_);
    }
    memset(rec, 0, sizeof *rec);
}

static char *own(corpus_scratch *s, char *p) {
    if (!p) return NULL;
    if (s->n_owned == s->owned_cap) {
        size_t cap = s->owned_cap ? 2 * s->owned_cap : 16;
        char **o = realloc(s->owned, cap * sizeof *o);
        if (!o) { free(p); return NULL; }
        s->owned = o;
        s->owned_cap = cap;
    }
    s->owned[s->n_owned++] = p;
    return p;
}

/* A rejection: returns 0 so parsers can `return reject(...)`. */
static int reject(corpus_record *rec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int reject(corpus_record *rec, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rec->reason, sizeof rec->reason, fmt, ap);
    va_end(ap);
    rec->ok = 0;
    return 0;
}

/* ------------------------------------------------------------ JSON -> chat_msg */

typedef struct parse_ctx {
    const tok_tokenizer *tok;
    const corpus_opts *o;
    corpus_record *rec;
    corpus_scratch *s;
    int nomem;
} parse_ctx;

static int is_media_type(const char *t) {
    return !strcmp(t, "image") || !strcmp(t, "image_url") || !strcmp(t, "input_image") ||
           !strcmp(t, "video") || !strcmp(t, "video_url") || !strcmp(t, "input_video");
}

/* content: string | null | [parts]. *out absent for null/missing. Returns 1 ok. */
static int get_content(parse_ctx *c, json_t *v, size_t mi, const char *key, chat_str *out) {
    out->s = NULL;
    out->n = 0;
    if (!v || json_is_null(v)) return 1;
    if (json_is_string(v)) {
        out->s = json_string_value(v);
        out->n = json_string_length(v);
        return 1;
    }
    if (!json_is_array(v))
        return reject(c->rec, "message %zu: \"%s\" must be a string or a list of parts", mi, key);
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(v, k, part) {
        if (!json_is_object(part))
            return reject(c->rec, "message %zu: content part %zu is not an object", mi, k);
        json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        const char *type = json_is_string(ty) ? json_string_value(ty) : NULL;
        if (ty && !type) return reject(c->rec, "message %zu: content part %zu: \"type\" is not a string", mi, k);
        if (type && is_media_type(type)) {
            if (c->o->text_only)
                return reject(c->rec, "message %zu: content part %zu is %s, not allowed in a text-only run", mi, k, type);
            c->rec->n_media_dropped++;
            continue;
        }
        if (type && strcmp(type, "text"))
            return reject(c->rec, "message %zu: content part %zu has unsupported type \"%s\"", mi, k, type);
        if (!json_is_string(tx))
            return reject(c->rec, "message %zu: content part %zu has no \"text\" string", mi, k);
        total += json_string_length(tx);
    }
    char *buf = own(c->s, malloc(total + 1));
    if (!buf) { c->nomem = 1; return 0; }
    size_t at = 0;
    json_array_foreach(v, k, part) {
        json_t *tx = json_object_get(part, "text"), *ty = json_object_get(part, "type");
        if (ty && is_media_type(json_string_value(ty))) continue;
        memcpy(buf + at, json_string_value(tx), json_string_length(tx));
        at += json_string_length(tx);
    }
    buf[at] = 0;
    out->s = buf;
    out->n = at;
    return 1;
}

static int opt_string(parse_ctx *c, json_t *m, const char *key, size_t mi, chat_str *out) {
    json_t *v = json_object_get(m, key);
    out->s = NULL;
    out->n = 0;
    if (!v || json_is_null(v)) return 1;
    if (!json_is_string(v)) return reject(c->rec, "message %zu: \"%s\" must be a string", mi, key);
    out->s = json_string_value(v);
    out->n = json_string_length(v);
    return 1;
}

static int role_of(const char *r, int sharegpt, chat_role *out) {
    static const struct { const char *name; chat_role role; int sharegpt_only; } roles[] = {
        {"system", CHAT_SYSTEM, 0}, {"user", CHAT_USER, 0}, {"assistant", CHAT_ASSISTANT, 0},
        {"tool", CHAT_TOOL, 0}, {"human", CHAT_USER, 1}, {"gpt", CHAT_ASSISTANT, 1},
    };
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(r, roles[i].name) && (sharegpt || !roles[i].sharegpt_only) &&
            !(sharegpt && roles[i].role == CHAT_TOOL)) {
            *out = roles[i].role;
            return 1;
        }
    return 0;
}

static int parse_message(parse_ctx *c, json_t *m, size_t mi, chat_msg *out, chat_tool_call **calls) {
    memset(out, 0, sizeof *out);
    if (!json_is_object(m)) return reject(c->rec, "message %zu is not an object", mi);
    json_t *from = json_object_get(m, "from"), *role = json_object_get(m, "role");
    int sharegpt = from != NULL && role == NULL;
    json_t *r = sharegpt ? from : role;
    if (!r) return reject(c->rec, "message %zu has no \"role\" (or ShareGPT \"from\")", mi);
    if (!json_is_string(r)) return reject(c->rec, "message %zu: \"%s\" is not a string", mi, sharegpt ? "from" : "role");
    if (!role_of(json_string_value(r), sharegpt, &out->role))
        return reject(c->rec, "message %zu has unknown role \"%.100s\"", mi, json_string_value(r));
    const char *ckey = sharegpt ? "value" : "content";
    json_t *content = json_object_get(m, ckey);
    if (!get_content(c, content, mi, ckey, &out->content)) return 0;
    if (!opt_string(c, m, "name", mi, &out->name)) return 0;
    json_t *fc = json_object_get(m, "function_call");
    if (fc && !json_is_null(fc)) /* the template renders only tool_calls: never drop a call silently */
        return reject(c->rec, "message %zu: \"function_call\" (the deprecated OpenAI form) is not rendered by "
                              "Kimi-K2.5's template; give it as \"tool_calls\"", mi);
    json_t *tcs = json_object_get(m, "tool_calls");
    if (out->role != CHAT_ASSISTANT && tcs && !json_is_null(tcs) && !(json_is_array(tcs) && !json_array_size(tcs)))
        return reject(c->rec, "message %zu (%s) has \"tool_calls\": Kimi-K2.5's template renders tool calls only "
                              "on assistant messages", mi, chat_role_name(out->role));
    if (out->role == CHAT_ASSISTANT) {
        if (!opt_string(c, m, "reasoning_content", mi, &out->reasoning)) return 0;
        json_t *tc = json_object_get(m, "tool_calls");
        if (tc && !json_is_null(tc)) {
            if (!json_is_array(tc)) return reject(c->rec, "message %zu: \"tool_calls\" is not a list", mi);
            size_t k;
            json_t *call;
            out->tool_calls = *calls;
            json_array_foreach(tc, k, call) {
                json_t *id = json_object_get(call, "id");
                json_t *fn = json_object_get(call, "function");
                json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
                if (!json_is_object(call) || !json_is_string(id) || !args)
                    return reject(c->rec, "message %zu: tool call %zu needs \"id\" and \"function\": {\"arguments\"}", mi, k);
                chat_tool_call *tcall = &(*calls)[k];
                tcall->id.s = json_string_value(id);
                tcall->id.n = json_string_length(id);
                if (json_is_string(args)) {
                    tcall->arguments.s = json_string_value(args);
                    tcall->arguments.n = json_string_length(args);
                } else {
                    /* the template's `arguments | tojson`: Python json.dumps defaults
                     * (", " and ": " separators, non-ASCII kept) */
                    char *d = own(c->s, json_dumps(args, JSON_ENCODE_ANY));
                    if (!d) { c->nomem = 1; return 0; }
                    tcall->arguments.s = d;
                    tcall->arguments.n = strlen(d);
                }
            }
            out->n_tool_calls = json_array_size(tc);
            *calls += out->n_tool_calls;
        }
    }
    if (out->role == CHAT_TOOL) {
        json_t *id = json_object_get(m, "tool_call_id");
        if (!json_is_string(id)) return reject(c->rec, "message %zu: tool message needs a \"tool_call_id\" string", mi);
        out->tool_call_id.s = json_string_value(id);
        out->tool_call_id.n = json_string_length(id);
    }
    if (!out->content.s && !(out->role == CHAT_ASSISTANT && out->n_tool_calls))
        return reject(c->rec, "message %zu (%s) has no \"%s\"", mi, chat_role_name(out->role), ckey);
    return 1;
}

static int reserve_msgs(parse_ctx *c, size_t n_msgs, size_t n_calls) {
    corpus_scratch *s = c->s;
    if (n_msgs > s->msgs_cap) {
        chat_msg *m = realloc(s->msgs, n_msgs * sizeof *m);
        if (!m) { c->nomem = 1; return 0; }
        s->msgs = m;
        s->msgs_cap = n_msgs;
    }
    if (n_calls > s->calls_cap) {
        chat_tool_call *t = realloc(s->calls, n_calls * sizeof *t);
        if (!t) { c->nomem = 1; return 0; }
        s->calls = t;
        s->calls_cap = n_calls;
    }
    return 1;
}

static int parse_conversation(parse_ctx *c, json_t *arr, const char *key, size_t *n_out) {
    if (!json_is_array(arr)) return reject(c->rec, "\"%s\" is not a list", key);
    size_t n = json_array_size(arr), n_calls = 0, i;
    if (n == 0) return reject(c->rec, "empty conversation");
    json_t *m;
    json_array_foreach(arr, i, m) {
        json_t *tc = json_object_get(m, "tool_calls");
        if (json_is_array(tc)) n_calls += json_array_size(tc);
    }
    if (!reserve_msgs(c, n, n_calls)) return 0;
    chat_tool_call *calls = c->s->calls;
    json_array_foreach(arr, i, m) if (!parse_message(c, m, i, &c->s->msgs[i], &calls)) return 0;
    *n_out = n;
    return 1;
}

/* ------------------------------------------------------------ corpus_parse */

static eg_status set_id(corpus_record *rec, json_t *id, eg_error *err) {
    free(rec->id);
    rec->id = NULL;
    char buf[64];
    const char *s = NULL;
    if (json_is_string(id)) {
        /* an empty id, or one with a NUL (strdup would cut it), names no sample: the
         * record is bad and keeps its FILE:LINE id for the report */
        size_t n = json_string_length(id);
        s = json_string_value(id);
        if (n == 0 || strlen(s) != n) {
            reject(rec, n ? "\"id\" contains a NUL character (\\u0000)" : "\"id\" is empty");
            s = NULL;
        }
    } else if (json_is_integer(id)) {
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(id));
        s = buf;
    }
    rec->id_given = s != NULL;
    if (s) rec->id = strdup(s);
    else {
        const char *f = !rec->file || !strcmp(rec->file, "-") ? "stdin" : rec->file;
        size_t n = strlen(f) + 32;
        rec->id = malloc(n);
        if (rec->id) snprintf(rec->id, n, "%s:%" PRIu64, f, rec->line);
    }
    return rec->id ? EG_OK : eg_fail(err, EG_ERR_NOMEM, "out of memory");
}

static eg_status tokenize_render(parse_ctx *c, int want_mask, eg_error *err) {
    corpus_record *rec = c->rec;
    eg_error e2 = {0};
    eg_status st = chat_tokenize(c->tok, &rec->render, &rec->ids, want_mask ? &rec->loss_mask : NULL, &e2);
    if (st == EG_ERR_NOMEM) return eg_fail(err, st, "%s", e2.msg);
    if (st) reject(rec, "%s", e2.msg);
    return EG_OK;
}

eg_status corpus_parse(const tok_tokenizer *tok, const corpus_opts *o, const char *line, size_t len,
                       corpus_record *rec, eg_error *err) {
    if (!rec->scratch_ && !(rec->scratch_ = calloc(1, sizeof *rec->scratch_)))
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    scratch_reset(rec->scratch_);
    parse_ctx c = {tok, o, rec, rec->scratch_, 0};
    rec->ok = 1;
    rec->reason[0] = 0;
    rec->format = CORPUS_FMT_NONE;
    rec->n_media_dropped = 0;
    rec->n_messages = 0;
    tok_seq_clear(&rec->ids);
    rec->render.len = 0;
    rec->render.n_spans = 0;
    if (rec->render.text) rec->render.text[0] = 0;
    json_t *root = NULL;
    eg_status st = EG_OK;
    int capture = o->mode != CORPUS_REGENERATE;

    size_t bad = tok_utf8_check(line, len);
    if (bad != len) {
        reject(rec, "invalid UTF-8 at byte %zu", bad);
        st = set_id(rec, NULL, err);
        return st;
    }
    json_error_t je;
    root = json_loadb(line, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        reject(rec, "invalid JSON at column %d: %s", je.column, je.text);
        return set_id(rec, NULL, err);
    }
    if ((st = set_id(rec, json_is_object(root) ? json_object_get(root, "id") : NULL, err))) goto out;
    if (!rec->ok) goto out; /* a bad id */
    if (!json_is_object(root)) { reject(rec, "record is not a JSON object"); goto out; }
    json_t *id = json_object_get(root, "id");
    if (id && !json_is_string(id) && !json_is_integer(id)) { reject(rec, "\"id\" must be a string or an integer"); goto out; }

    static const struct { const char *key; corpus_format fmt; } styles[] = {
        {"messages", CORPUS_FMT_MESSAGES}, {"conversations", CORPUS_FMT_CONVERSATIONS},
        {"prompt", CORPUS_FMT_PROMPT}, {"text", CORPUS_FMT_TEXT}, {"input_ids", CORPUS_FMT_INPUT_IDS},
    };
    json_t *body = NULL;
    const char *key = NULL;
    for (size_t i = 0; i < sizeof styles / sizeof styles[0]; i++) {
        json_t *v = json_object_get(root, styles[i].key);
        if (!v) continue;
        if (body) {
            reject(rec, "record has both \"%s\" and \"%s\"; give exactly one", key, styles[i].key);
            goto out;
        }
        body = v;
        key = styles[i].key;
        rec->format = styles[i].fmt;
    }
    if (!body) {
        reject(rec, "record has none of \"messages\", \"conversations\", \"prompt\", \"text\", \"input_ids\"");
        goto out;
    }
    {
        /* Kimi-K2.5 declares tools in a <|im_system|>tool_declare<|im_middle|> turn whose
         * text is made by its tokenizer's Python code (tool_declaration_ts.py, TypeScript-
         * like), not by the Jinja template; that is not reproduced here, and rendering the
         * conversation without its declarations would be a silent loss */
        json_t *tools = json_object_get(root, "tools");
        if (tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0)) {
            reject(rec, "\"tools\" declarations are not supported: Kimi-K2.5 renders them in a tool_declare turn "
                        "as TypeScript-like text made by its tokenizer's Python code (tool_declaration_ts.py), which "
                        "eaglegen does not reproduce; drop \"tools\" or give the rendered conversation as {\"text\"}");
            goto out;
        }
    }

    chat_opts co = {o->thinking, 0};
    size_t n_msgs = 0;
    chat_msg one;
    const chat_msg *msgs = NULL;
    switch (rec->format) {
    case CORPUS_FMT_MESSAGES:
    case CORPUS_FMT_CONVERSATIONS:
        if (!parse_conversation(&c, body, key, &n_msgs)) goto out;
        msgs = c.s->msgs;
        break;
    case CORPUS_FMT_PROMPT:
    case CORPUS_FMT_TEXT:
        if (!json_is_string(body)) { reject(rec, "\"%s\" is not a string", key); goto out; }
        if (rec->format == CORPUS_FMT_TEXT && !o->text_as_user) {
            if (json_string_length(body) == 0 && o->mode != CORPUS_RENDER) { reject(rec, "empty \"text\""); goto out; }
            /* a {"text"} record is the rendered text itself */
            chat_render *r = &rec->render;
            size_t n = json_string_length(body);
            char *t = realloc(r->text, n + 1);
            if (!t) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); goto out; }
            memcpy(t, json_string_value(body), n);
            t[n] = 0;
            r->text = t;
            r->len = n;
            r->cap = n + 1;
            if ((st = tokenize_render(&c, 0, err)) || !rec->ok) goto out;
            if (capture && (st = chat_mask_from_ids(tok, rec->ids.ids, rec->ids.n, &rec->loss_mask, err))) goto out;
            goto check;
        }
        memset(&one, 0, sizeof one);
        one.role = CHAT_USER;
        one.content.s = json_string_value(body);
        one.content.n = json_string_length(body);
        msgs = &one;
        n_msgs = 1;
        break;
    case CORPUS_FMT_INPUT_IDS: {
        if (!json_is_array(body) || json_array_size(body) == 0) {
            reject(rec, "\"input_ids\" must be a non-empty list of token ids");
            goto out;
        }
        size_t k;
        json_t *v;
        json_array_foreach(body, k, v) {
            json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
            if (x < 0 || x >= tok_n_vocab(tok)) {
                reject(rec, "input_ids[%zu] is not a token id in [0, %d)", k, tok_n_vocab(tok));
                goto out;
            }
            if ((st = tok_seq_push(&rec->ids, (int32_t)x, 0, err))) goto out;
        }
        if (capture && (st = chat_mask_from_ids(tok, rec->ids.ids, rec->ids.n, &rec->loss_mask, err))) goto out;
        goto check;
    }
    case CORPUS_FMT_NONE: break;
    }

    /* a conversation */
    if (o->mode == CORPUS_REGENERATE) {
        size_t keep = chat_prompt_len(msgs, n_msgs);
        if (keep == 0) { reject(rec, "conversation has no user message to answer"); goto out; }
        n_msgs = keep;
        co.add_generation_prompt = 1;
    } else if (o->mode == CORPUS_CAPTURE) {
        co.add_generation_prompt = 0;
    } else {
        co.add_generation_prompt = o->add_generation_prompt;
    }
    rec->n_messages = n_msgs;
    if ((st = chat_render_msgs(msgs, n_msgs, &co, &rec->render, err))) goto out;
    if ((st = tokenize_render(&c, capture, err)) || !rec->ok) goto out;

check:
    if (o->mode == CORPUS_CAPTURE) {
        int any = 0;
        for (size_t i = 0; i < rec->ids.n && !any; i++) any = rec->loss_mask[i];
        if (!any) { reject(rec, "no assistant message to learn from (capture mode)"); goto out; }
    }
    if (o->max_prompt_tokens && rec->ids.n > o->max_prompt_tokens)
        reject(rec, "%s has %zu tokens, over the limit of %zu", o->mode == CORPUS_REGENERATE ? "prompt" : "conversation",
               rec->ids.n, o->max_prompt_tokens);
out:
    if (c.nomem && !st) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    json_decref(root);
    scratch_reset(rec->scratch_); /* borrowed strings died with root */
    return st;
}

/* ------------------------------------------------------------ reader */

#define PIPE_BLOCK (1 << 16)

struct corpus_reader {
    const tok_tokenizer *tok;
    corpus_opts o;
    char **files;         /* [n_files] paths as given, to open */
    char **names;         /* [n_files] name for ids and rec->file: the path escaped where not UTF-8,
                           * or what corpus_name_file set */
    size_t n_files, cur;  /* cur: index of the open (or next) file */
    struct archive *a;    /* the current file through libarchive, or NULL */
    int fd;               /* the current file when it is a pipe (stdin or a FIFO), read by us: -1 */
    int direct;           /* that pipe is plain text: r->buf filled by read(), no libarchive
                             (whose format sniffing reads ahead and would hold the first lines) */
    int at_eof;           /* current file exhausted */
    uint8_t *buf;         /* [READ_BLOCK] decompressed (or plain) bytes */
    uint8_t *pipe_buf;    /* [PIPE_BLOCK] raw bytes read from a compressed pipe */
    size_t pipe_pre;      /* bytes of pipe_buf read to tell plain from compressed, libarchive's first */
    int64_t pipe_bytes;   /* bytes read from a direct pipe */
    size_t blen, bpos;
    char *line;
    size_t llen, lcap;
    uint64_t lineno;      /* in the current file */
    uint64_t index;       /* next record index */
    int64_t bytes_total;  /* sum of the input files' sizes (as stored: compressed); -1 with stdin */
    int64_t bytes_before; /* bytes consumed of the files before cur (read completely) */
    int64_t *sizes;       /* [n_files] each file's size, -1 for stdin */
};

static int has_corpus_suffix(const char *name) {
    static const char *comp[] = {"", ".gz", ".zst", ".zstd", ".xz", ".bz2"};
    static const char *base[] = {".jsonl", ".json", ".ndjson"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof comp / sizeof comp[0]; i++)
        for (size_t j = 0; j < sizeof base / sizeof base[0]; j++) {
            size_t L = strlen(comp[i]) + strlen(base[j]);
            if (n > L && !strncmp(name + n - L, base[j], strlen(base[j])) &&
                !strcmp(name + n - strlen(comp[i]), comp[i]))
                return 1;
        }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static eg_status add_file(corpus_reader *r, size_t *cap, const char *path, eg_error *err) {
    if (r->n_files == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        char **f = realloc(r->files, *cap * sizeof *f);
        if (!f) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        r->files = f;
        char **g = realloc(r->names, *cap * sizeof *g);
        if (!g) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        r->names = g;
    }
    if (!(r->files[r->n_files] = strdup(path))) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    /* a file name that is not UTF-8 reaches ids, rejects files and sample metadata (all
     * JSON) escaped */
    if (!(r->names[r->n_files] = eg_utf8_escape(path))) {
        free(r->files[r->n_files]);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    r->n_files++;
    return EG_OK;
}

/* An eaglegen job directory: generate's --out (same file), or any directory holding
 * job.json. Its done/rejects ledgers, job.json and manifest end in .jsonl / .json but are
 * no prompts: read back, their lines claimed the ids of the real records (a rerun then
 * wrote nothing) or stopped the run as bad records. */
static int is_job_dir(const corpus_reader *r, const char *dir) {
    struct stat a, b;
    if (r->o.job_dir && !stat(r->o.job_dir, &a) && !stat(dir, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return 1;
    size_t L = strlen(dir) + sizeof "/job.json";
    char *p = malloc(L);
    if (!p) return 0;
    snprintf(p, L, "%s/job.json", dir);
    int yes = !access(p, F_OK);
    free(p);
    return yes;
}

static eg_status add_dir(corpus_reader *r, size_t *cap, const char *dir, int depth, eg_error *err) {
    if (depth > 64) return eg_fail(err, EG_ERR_INVALID, "%s: directories nested too deep", dir);
    DIR *d = opendir(dir);
    if (!d) return eg_fail(err, EG_ERR_IO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, ncap = 0;
    eg_status st = EG_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* hidden files, . and .. */
        if (n == ncap) {
            ncap = ncap ? 2 * ncap : 64;
            char **nn = realloc(names, ncap * sizeof *nn);
            if (!nn) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
        n++;
    }
    closedir(d);
    if (!st && n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !st; i++) {
        size_t L = strlen(dir) + strlen(names[i]) + 2;
        char *p = malloc(L);
        if (!p) { st = eg_fail(err, EG_ERR_NOMEM, "out of memory"); break; }
        /* "corp/" and "corp" name their files alike (ids FILE:LINE; a resumed job keeps the
           names it recorded whatever the spelling: gen_resume_apply_names) */
        snprintf(p, L, "%s%s%s", dir, dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/", names[i]);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            if (!is_job_dir(r, p)) st = add_dir(r, cap, p, depth + 1, err);
        }
        else if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && has_corpus_suffix(names[i]))
            st = add_file(r, cap, p, err);
        free(p);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

/* bytes the current file's bottom filter (the file itself) has read: compressed bytes */
static int64_t current_bytes(const corpus_reader *r) {
    if (r->a) return (int64_t)archive_filter_bytes(r->a, -1);
    return r->direct ? r->pipe_bytes : 0;
}

void corpus_input_bytes(const corpus_reader *r, int64_t *done, int64_t *total) {
    *total = r->bytes_total;
    *done = r->bytes_before;
    if (r->cur < r->n_files) *done += current_bytes(r);
    if (*total >= 0 && *done > *total) *done = *total;
}

size_t corpus_n_files(const corpus_reader *r) { return r->n_files; }
const char *corpus_file(const corpus_reader *r, size_t i) { return i < r->n_files ? r->files[i] : NULL; }
bool corpus_is_pipe(const corpus_reader *r, size_t i) { return i < r->n_files && r->sizes[i] < 0; }

eg_status corpus_name_file(corpus_reader *r, size_t i, const char *name, eg_error *err) {
    if (i >= r->n_files) return eg_fail(err, EG_ERR_INVALID, "corpus_name_file: no input %zu", i);
    if (!r->names && !(r->names = calloc(r->n_files, sizeof *r->names)))
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    char *c = eg_utf8_escape(name);
    if (!c) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    free(r->names[i]);
    r->names[i] = c;
    return EG_OK;
}

static void close_archive(corpus_reader *r) {
    if (r->a) archive_read_free(r->a);
    r->a = NULL;
    if (r->fd > 0) close(r->fd); /* stdin stays open */
    r->fd = -1;
    r->direct = 0;
    r->pipe_pre = 0;
    r->pipe_bytes = 0;
}

void corpus_close(corpus_reader *r) {
    if (!r) return;
    close_archive(r);
    for (size_t i = 0; i < r->n_files; i++) {
        free(r->files[i]);
        free(r->names[i]);
    }
    free(r->files);
    free(r->names);
    free(r->sizes);
    free(r->buf);
    free(r->pipe_buf);
    free(r->line);
    free(r);
}

eg_status corpus_open(const char *const *paths, size_t n_paths, const tok_tokenizer *tok,
                      const corpus_opts *opts, corpus_reader **out, eg_error *err) {
    *out = NULL;
    if (n_paths == 0) return eg_fail(err, EG_ERR_INVALID, "no input files");
    if (opts->n_workers > 1 && opts->worker >= opts->n_workers)
        return eg_fail(err, EG_ERR_INVALID, "worker %" PRIu64 " of %" PRIu64 " is out of range", opts->worker,
                       opts->n_workers);
    corpus_reader *r = calloc(1, sizeof *r);
    if (!r) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    r->tok = tok;
    r->fd = -1;
    r->o = *opts;
    if (!r->o.max_line_bytes) r->o.max_line_bytes = DEFAULT_MAX_LINE;
    size_t cap = 0, stdin_seen = 0;
    eg_status st = EG_OK;
    for (size_t i = 0; i < n_paths && !st; i++) {
        struct stat sb;
        if (!strcmp(paths[i], "-")) {
            if (stdin_seen++) st = eg_fail(err, EG_ERR_INVALID, "stdin (\"-\") given twice");
            else st = add_file(r, &cap, "-", err);
        } else if (stat(paths[i], &sb) != 0) {
            st = eg_fail(err, EG_ERR_IO, "%s: %s", paths[i], strerror(errno));
        } else if (S_ISDIR(sb.st_mode) && is_job_dir(r, paths[i])) {
            st = eg_fail(err, EG_ERR_INVALID, "%s: an eaglegen job directory (this run's --out, or it holds "
                         "job.json): its ledgers and manifest are no prompts; give the prompt files, or keep the "
                         "prompts in a directory of their own", paths[i]);
        } else if (S_ISDIR(sb.st_mode)) {
            size_t before = r->n_files;
            st = add_dir(r, &cap, paths[i], 0, err);
            if (!st && r->n_files == before)
                st = eg_fail(err, EG_ERR_IO, "%s: directory holds no *.jsonl/*.json/*.ndjson files (optionally .gz/.zst/.xz/.bz2)", paths[i]);
        } else {
            st = add_file(r, &cap, paths[i], err);
        }
    }
    if (!st && !(r->buf = malloc(READ_BLOCK))) st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    if (!st && !(r->sizes = calloc(r->n_files ? r->n_files : 1, sizeof *r->sizes)))
        st = eg_fail(err, EG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < r->n_files; i++) {
        struct stat sb;
        r->sizes[i] = strcmp(r->files[i], "-") && !stat(r->files[i], &sb) && S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1;
        if (r->sizes[i] < 0) r->bytes_total = -1;
        else if (r->bytes_total >= 0) r->bytes_total += r->sizes[i];
    }
    if (st) {
        corpus_close(r);
        return st;
    }
    *out = r;
    return EG_OK;
}

/* A read from the current pipe. An interrupted read is retried unless the run is
 * stopping (libarchive's fd reader retries every one, so an interrupted run would wait
 * for the producer's next line): then -1 with errno EINTR. A descriptor a parent left
 * non-blocking is waited on. */
static ssize_t pipe_read(corpus_reader *r, void *buf, size_t n) {
    for (;;) {
        ssize_t k = read(r->fd, buf, n);
        if (k >= 0) return k;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd p = {.fd = r->fd, .events = POLLIN};
            if (poll(&p, 1, -1) >= 0) continue;
            if (errno != EINTR) return -1;
        } else if (errno != EINTR) {
            return -1;
        }
        if (r->o.stop && *r->o.stop) {
            errno = EINTR;
            return -1;
        }
    }
}

static la_ssize_t pipe_callback(struct archive *a, void *ud, const void **out) {
    corpus_reader *r = ud;
    *out = r->pipe_buf;
    if (r->pipe_pre) { /* the bytes read to sniff the format come first */
        la_ssize_t n = (la_ssize_t)r->pipe_pre;
        r->pipe_pre = 0;
        return n;
    }
    ssize_t n = pipe_read(r, r->pipe_buf, PIPE_BLOCK);
    if (n < 0) archive_set_error(a, errno, errno == EINTR ? "interrupted" : "read: %s", strerror(errno));
    return n;
}

/* A JSON text line starts with one of these (or a byte-order mark); no compressed format's
 * magic does. Anything else goes to libarchive, which tells compressed from raw. */
static int plain_start(uint8_t c) {
    return c == '{' || c == '[' || c == '"' || c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == 0xEF;
}

static eg_status open_current(corpus_reader *r, eg_error *err) {
    const char *path = r->files[r->cur];
    r->bpos = r->blen = 0;
    r->at_eof = 0;
    int pipe = r->sizes[r->cur] < 0; /* stdin, a FIFO or another file that is not regular */
    if (pipe) {
        r->fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : 0;
        if (r->fd < 0) return eg_fail(err, EG_ERR_IO, "%s: %s", path, strerror(errno));
        if (!r->pipe_buf && !(r->pipe_buf = malloc(PIPE_BLOCK))) {
            close_archive(r);
            return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        }
        ssize_t n = pipe_read(r, r->pipe_buf, PIPE_BLOCK);
        if (n < 0) {
            eg_status st = eg_fail(err, EG_ERR_IO, "%s: %s", path, errno == EINTR ? "interrupted" : strerror(errno));
            close_archive(r);
            return st;
        }
        if (n == 0 || plain_start(r->pipe_buf[0])) {
            r->direct = 1;
            r->at_eof = n == 0;
            memcpy(r->buf, r->pipe_buf, (size_t)n);
            r->blen = (size_t)n;
            r->pipe_bytes = n;
            return EG_OK;
        }
        r->pipe_pre = (size_t)n;
    }
    struct archive *a = archive_read_new();
    if (!a) {
        close_archive(r);
        return eg_fail(err, EG_ERR_NOMEM, "out of memory");
    }
    archive_read_support_filter_all(a);
    archive_read_support_format_raw(a);
    archive_read_support_format_empty(a);
    int rc = pipe ? archive_read_open(a, r, NULL, pipe_callback, NULL) : archive_read_open_filename(a, path, 1 << 16);
    struct archive_entry *entry;
    if (rc == ARCHIVE_OK) rc = archive_read_next_header(a, &entry);
    if (rc == ARCHIVE_EOF) { /* empty file */
        r->a = a;
        r->at_eof = 1;
        return EG_OK;
    }
    if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) {
        eg_status st = eg_fail(err, EG_ERR_IO, "%s: %s", path, archive_error_string(a) ? archive_error_string(a) : "cannot open");
        archive_read_free(a);
        close_archive(r);
        return st;
    }
    r->a = a;
    return EG_OK;
}

/* Whether next_line can return without waiting on a pipe: a whole line (or the end) is
 * in the buffer after reading what the pipe holds now. Plain pipes only; a compressed
 * pipe, a file and a line longer than the buffer are taken as ready (they may wait). */
static int line_ready(corpus_reader *r) {
    if (!r->a && !r->direct) { /* between files: stdin's first bytes */
        if (r->cur >= r->n_files || strcmp(r->files[r->cur], "-")) return 1;
        struct pollfd p = {.fd = 0, .events = POLLIN};
        return poll(&p, 1, 0) == 1;
    }
    if (!r->direct || r->at_eof) return 1;
    for (;;) {
        if (memchr(r->buf + r->bpos, '\n', r->blen - r->bpos)) return 1;
        if (r->bpos) {
            memmove(r->buf, r->buf + r->bpos, r->blen - r->bpos);
            r->blen -= r->bpos;
            r->bpos = 0;
        }
        if (r->blen == READ_BLOCK) return 1;
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        if (poll(&p, 1, 0) != 1) return 0; /* nothing yet (or a signal: ask again later) */
        ssize_t n = read(r->fd, r->buf + r->blen, READ_BLOCK - r->blen);
        if (n < 0) return errno == EINTR || errno == EAGAIN ? 0 : 1; /* next_line reports it */
        if (n == 0) {
            r->at_eof = 1;
            return 1;
        }
        r->blen += (size_t)n;
        r->pipe_bytes += n;
    }
}

static eg_status line_append(corpus_reader *r, const uint8_t *p, size_t n, eg_error *err) {
    if (r->llen + n + 1 > r->lcap) {
        size_t cap = r->lcap ? r->lcap : 4096;
        while (cap < r->llen + n + 1) cap *= 2;
        char *l = realloc(r->line, cap);
        if (!l) return eg_fail(err, EG_ERR_NOMEM, "out of memory (line of %zu bytes)", r->llen + n);
        r->line = l;
        r->lcap = cap;
    }
    memcpy(r->line + r->llen, p, n);
    r->llen += n;
    return EG_OK;
}

/* Next physical line of the current-or-later file. *got = 0 at the end of all input.
 * *too_long: the line exceeded max_line_bytes and was discarded (llen = 0). */
static eg_status next_line(corpus_reader *r, int *got, int *too_long, eg_error *err) {
    r->llen = 0;
    *too_long = 0;
    *got = 0;
    int have_any = 0;
    for (;;) {
        if (!r->a && !r->direct) {
            if (r->cur >= r->n_files) return EG_OK;
            eg_status st = open_current(r, err);
            if (st) return st;
            r->lineno = 0;
        }
        if (r->bpos < r->blen) {
            const uint8_t *p = r->buf + r->bpos;
            size_t avail = r->blen - r->bpos;
            const uint8_t *nl = memchr(p, '\n', avail);
            size_t take = nl ? (size_t)(nl - p) : avail;
            have_any = 1;
            if (!*too_long) {
                if (r->llen + take > r->o.max_line_bytes) {
                    *too_long = 1;
                    r->llen = 0;
                } else {
                    eg_status st = line_append(r, p, take, err);
                    if (st) return st;
                }
            }
            r->bpos += take + (nl ? 1 : 0);
            if (nl) break;
            continue;
        }
        if (!r->at_eof) {
            la_ssize_t n;
            if (r->direct) {
                n = pipe_read(r, r->buf, READ_BLOCK);
                if (n < 0)
                    return eg_fail(err, EG_ERR_IO, "%s:%" PRIu64 ": read error: %s", r->files[r->cur], r->lineno + 1,
                                   errno == EINTR ? "interrupted" : strerror(errno));
                r->pipe_bytes += n;
            } else if ((n = archive_read_data(r->a, r->buf, READ_BLOCK)) < 0) {
                return eg_fail(err, EG_ERR_IO, "%s:%" PRIu64 ": read error: %s", r->files[r->cur], r->lineno + 1,
                               archive_error_string(r->a) ? archive_error_string(r->a) : "?");
            }
            if (n == 0) r->at_eof = 1;
            r->blen = (size_t)n;
            r->bpos = 0;
            continue;
        }
        if (have_any) break; /* last line without '\n' */
        r->bytes_before += current_bytes(r);
        close_archive(r);
        r->cur++;
    }
    r->lineno++;
    /* a UTF-8 byte-order mark (Windows editors write one) is not part of line 1 */
    if (r->lineno == 1 && r->llen >= 3 && !memcmp(r->line, "\xEF\xBB\xBF", 3)) {
        memmove(r->line, r->line + 3, r->llen - 3);
        r->llen -= 3;
    }
    if (r->llen && r->line[r->llen - 1] == '\r') r->llen--;
    if (line_append(r, (const uint8_t *)"", 0, err)) return err->code;
    r->line[r->llen] = 0;
    *got = 1;
    return EG_OK;
}

/* The id another worker's record names, as corpus_parse would take it (set_id: valid
 * UTF-8, JSON parsed with the same flags, an object whose "id" is a non-empty string
 * without NUL or an integer), or NULL: then it is FILE:LINE, nobody else's. A line
 * without "id" in it is not parsed. 1: *out holds a malloc'd id; 0: none; -1: no memory. */
static int other_id(const char *line, size_t len, char **out) {
    *out = NULL;
    if (!memmem(line, len, "\"id\"", 4) || tok_utf8_check(line, len) != len) return 0;
    json_error_t je;
    json_t *root = json_loadb(line, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    json_t *id = json_is_object(root) ? json_object_get(root, "id") : NULL;
    char buf[64];
    const char *s = NULL;
    if (json_is_string(id) && json_string_length(id) && strlen(json_string_value(id)) == json_string_length(id))
        s = json_string_value(id);
    else if (json_is_integer(id)) {
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(id));
        s = buf;
    }
    int r = 0;
    if (s) r = (*out = strdup(s)) ? 1 : -1;
    json_decref(root);
    return r;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

static eg_status next_record(corpus_reader *r, corpus_record *rec, bool *got, bool *later, eg_error *err) {
    *got = false;
    if (later) *later = false;
    for (;;) {
        if (later && !line_ready(r)) {
            *later = true;
            return EG_OK;
        }
        int have, too_long;
        eg_status st = next_line(r, &have, &too_long, err);
        if (st) return st;
        if (!have) return EG_OK;
        if (!too_long && is_blank(r->line, r->llen)) continue;
        uint64_t index = r->index++;
        if (index < r->o.start_index) continue;
        if (r->o.n_workers > 1 && index % r->o.n_workers != r->o.worker) {
            char *id = NULL;
            int k = r->o.on_other_id && !too_long ? other_id(r->line, r->llen, &id) : 0;
            if (k < 0) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
            const char *f = r->names && r->names[r->cur] ? r->names[r->cur] : r->files[r->cur];
            st = k ? r->o.on_other_id(r->o.on_other_ctx, id, f, r->lineno, err) : EG_OK;
            free(id);
            if (st) return st;
            continue;
        }
        rec->file = r->names && r->names[r->cur] ? r->names[r->cur] : r->files[r->cur];
        rec->line = r->lineno;
        rec->index = index;
        free(rec->raw);
        rec->raw = malloc(r->llen + 1);
        if (!rec->raw) return eg_fail(err, EG_ERR_NOMEM, "out of memory");
        memcpy(rec->raw, r->line, r->llen + 1);
        rec->raw_len = r->llen;
        if (too_long) {
            if ((st = corpus_parse(r->tok, &r->o, "", 0, rec, err))) return st; /* resets fields, sets id */
            rec->format = CORPUS_FMT_NONE;
            reject(rec, "line is longer than %zu bytes", r->o.max_line_bytes);
        } else if ((st = corpus_parse(r->tok, &r->o, r->line, r->llen, rec, err))) {
            return st;
        }
        *got = true;
        return EG_OK;
    }
}

eg_status corpus_next(corpus_reader *r, corpus_record *rec, bool *got, eg_error *err) {
    return next_record(r, rec, got, NULL, err);
}

eg_status corpus_next_nowait(corpus_reader *r, corpus_record *rec, bool *got, bool *later, eg_error *err) {
    return next_record(r, rec, got, later, err);
}

/* ------------------------------------------------------------ rejects */

void corpus_put_json_string(FILE *o, const char *s, size_t n) {
    fputc('"', o);
    size_t i = 0;
    while (i < n) {
        size_t ok = tok_utf8_check(s + i, n - i) + i; /* valid up to here */
        for (; i < ok; i++) {
            unsigned char c = (unsigned char)s[i];
            switch (c) {
            case '"': fputs("\\\"", o); break;
            case '\\': fputs("\\\\", o); break;
            case '\n': fputs("\\n", o); break;
            case '\r': fputs("\\r", o); break;
            case '\t': fputs("\\t", o); break;
            case '\b': fputs("\\b", o); break;
            case '\f': fputs("\\f", o); break;
            default:
                if (c < 0x20 || c == 0x7f) fprintf(o, "\\u%04x", c);
                else fputc(c, o);
            }
        }
        if (i < n) {
            fputs("\\ufffd", o);
            i++;
        }
    }
    fputc('"', o);
}

eg_status corpus_write_reject(FILE *f, const corpus_record *rec, eg_error *err) {
    const char *file = rec->file ? rec->file : "-";
    fputs("{\"file\": ", f);
    corpus_put_json_string(f, file, strlen(file));
    fprintf(f, ", \"line\": %" PRIu64 ", \"index\": %" PRIu64 ", \"id\": ", rec->line, rec->index);
    corpus_put_json_string(f, rec->id ? rec->id : "", rec->id ? strlen(rec->id) : 0);
    fputs(", \"reason\": ", f);
    corpus_put_json_string(f, rec->reason, strlen(rec->reason));
    fputs(", \"record\": ", f);
    corpus_put_json_string(f, rec->raw ? rec->raw : "", rec->raw ? rec->raw_len : 0);
    fputs("}\n", f);
    if (ferror(f)) return eg_fail(err, EG_ERR_IO, "writing a rejected record: write error");
    return EG_OK;
}
