/* Kimi-K2.5 chat template; see chat.h. */
#include "prompts/chat.h"

#include <stdlib.h>
#include <string.h>

const char *chat_role_name(chat_role r) {
    switch (r) {
    case CHAT_SYSTEM: return "system";
    case CHAT_USER: return "user";
    case CHAT_ASSISTANT: return "assistant";
    case CHAT_TOOL: return "tool";
    }
    return "system";
}

void chat_render_free(chat_render *r) {
    if (!r) return;
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}

static eg_status put(chat_render *r, const char *s, size_t n, eg_error *err) {
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 256;
        while (cap < r->len + n + 1) cap *= 2;
        char *t = realloc(r->text, cap);
        if (!t) return eg_fail(err, EG_ERR_NOMEM, "out of memory (rendering %zu bytes)", cap);
        r->text = t;
        r->cap = cap;
    }
    if (n) memcpy(r->text + r->len, s, n);
    r->len += n;
    r->text[r->len] = 0;
    return EG_OK;
}

#define PUTS(lit) put(out, lit, sizeof(lit) - 1, err)
#define PUTSTR(cs) ((cs).s ? put(out, (cs).s, (cs).n, err) : EG_OK)
#define TRY(x) do { eg_status st_ = (x); if (st_) return st_; } while (0)

static eg_status add_span(chat_render *r, size_t b, size_t e, eg_error *err) {
    if (r->n_spans == r->spans_cap) {
        size_t cap = r->spans_cap ? 2 * r->spans_cap : 8;
        chat_span *s = realloc(r->spans, cap * sizeof *s);
        if (!s) return eg_fail(err, EG_ERR_NOMEM, "out of memory (spans)");
        r->spans = s;
        r->spans_cap = cap;
    }
    r->spans[r->n_spans++] = (chat_span){b, e};
    return EG_OK;
}

eg_status chat_render_msgs(const chat_msg *msgs, size_t n, const chat_opts *opts, chat_render *out,
                           eg_error *err) {
    out->len = 0;
    out->n_spans = 0;
    TRY(put(out, "", 0, err));
    /* the last assistant message without tool calls splits history from suffix */
    size_t hist_end = 0; /* messages [0, hist_end) are history */
    for (size_t i = n; i-- > 0;)
        if (msgs[i].role == CHAT_ASSISTANT && msgs[i].n_tool_calls == 0) {
            hist_end = i + 1;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        const chat_msg *m = &msgs[i];
        switch (m->role) {
        case CHAT_USER: TRY(PUTS("<|im_user|>")); break;
        case CHAT_ASSISTANT: TRY(PUTS("<|im_assistant|>")); break;
        default: TRY(PUTS("<|im_system|>")); break;
        }
        if (m->name.s && m->name.n) TRY(PUTSTR(m->name)); /* Jinja: name or role */
        else {
            const char *rn = chat_role_name(m->role);
            TRY(put(out, rn, strlen(rn), err));
        }
        TRY(PUTS("<|im_middle|>"));
        size_t span_begin = out->len;
        if (m->role == CHAT_ASSISTANT) {
            if (i < hist_end || !opts->thinking) TRY(PUTS("<think></think>"));
            else {
                TRY(PUTS("<think>"));
                TRY(PUTSTR(m->reasoning));
                TRY(PUTS("</think>"));
            }
            TRY(PUTSTR(m->content));
            if (m->n_tool_calls) {
                TRY(PUTS("<|tool_calls_section_begin|>"));
                for (size_t k = 0; k < m->n_tool_calls; k++) {
                    TRY(PUTS("<|tool_call_begin|>"));
                    TRY(PUTSTR(m->tool_calls[k].id));
                    TRY(PUTS("<|tool_call_argument_begin|>"));
                    TRY(PUTSTR(m->tool_calls[k].arguments));
                    TRY(PUTS("<|tool_call_end|>"));
                }
                TRY(PUTS("<|tool_calls_section_end|>"));
            }
        } else if (m->role == CHAT_TOOL) {
            TRY(PUTS("## Return of "));
            TRY(PUTSTR(m->tool_call_id));
            TRY(PUTS("\n"));
            TRY(PUTSTR(m->content));
        } else {
            TRY(PUTSTR(m->content));
        }
        TRY(PUTS("<|im_end|>"));
        if (m->role == CHAT_ASSISTANT) TRY(add_span(out, span_begin, out->len, err));
    }
    if (opts->add_generation_prompt) {
        TRY(PUTS("<|im_assistant|>assistant<|im_middle|>"));
        if (opts->thinking) TRY(PUTS("<think>"));
        else TRY(PUTS("<think></think>"));
    }
    return EG_OK;
}

size_t chat_prompt_len(const chat_msg *msgs, size_t n) {
    for (size_t i = n; i-- > 0;)
        if (msgs[i].role == CHAT_USER) return i + 1;
    return 0;
}

static eg_status mask_alloc(uint8_t **mask, size_t n, eg_error *err) {
    uint8_t *m = realloc(*mask, n ? n : 1);
    if (!m) return eg_fail(err, EG_ERR_NOMEM, "out of memory (loss mask of %zu)", n);
    memset(m, 0, n);
    *mask = m;
    return EG_OK;
}

/* index of the first token starting at or after byte b; checks it starts exactly at b */
static int token_at(const tok_seq *ids, size_t from, size_t b, size_t text_len, size_t *idx) {
    size_t i = from;
    while (i < ids->n && ids->offsets[i] < b) i++;
    *idx = i;
    if (i < ids->n) return ids->offsets[i] == b;
    return b == text_len;
}

eg_status chat_tokenize(const tok_tokenizer *t, const chat_render *r, tok_seq *ids, uint8_t **mask,
                        eg_error *err) {
    tok_seq_clear(ids);
    TRY(tok_encode(t, r->text, r->len, TOK_ALLOW_SPECIAL | (mask ? TOK_OFFSETS : 0), ids, err));
    if (!mask) return EG_OK;
    TRY(mask_alloc(mask, ids->n, err));
    size_t cur = 0;
    for (size_t s = 0; s < r->n_spans; s++) {
        size_t a, b;
        if (!token_at(ids, cur, r->spans[s].begin, r->len, &a) ||
            !token_at(ids, a, r->spans[s].end, r->len, &b))
            return eg_fail(err, EG_ERR_FORMAT,
                           "assistant message %zu: its span boundary falls inside a token "
                           "(a special token was cut by the 25,000 code-point run split)", s);
        memset(*mask + a, 1, b - a);
        cur = b;
    }
    return EG_OK;
}

eg_status chat_mask_from_ids(const tok_tokenizer *t, const int32_t *ids, size_t n, uint8_t **mask,
                             eg_error *err) {
    int32_t asst = tok_special_id(t, "<|im_assistant|>"), mid = tok_special_id(t, "<|im_middle|>"),
            end = tok_special_id(t, "<|im_end|>");
    if (asst < 0 || mid < 0 || end < 0)
        return eg_fail(err, EG_ERR_CONFIG, "tokenizer lacks <|im_assistant|>/<|im_middle|>/<|im_end|>");
    TRY(mask_alloc(mask, n, err));
    enum { OUT, HEADER, BODY } state = OUT;
    for (size_t i = 0; i < n; i++) {
        switch (state) {
        case OUT: if (ids[i] == asst) state = HEADER; break;
        case HEADER: if (ids[i] == mid) state = BODY; break;
        case BODY:
            (*mask)[i] = 1;
            if (ids[i] == end) state = OUT;
            break;
        }
    }
    return EG_OK;
}
