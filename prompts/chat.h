/* chat.h — Kimi-K2.5's chat template, rendered in C, plus the loss mask of the
 * capture (teacher-forced) mode.
 *
 * Rendering (the truth is ../shared/fixtures/tokenizer/chat.jsonl; docs/PROMPTS.md):
 *   each message: <|im_user|> | <|im_assistant|> | <|im_system|> (system, tool)
 *                 + (name if non-empty, else role) + <|im_middle|> + body + <|im_end|>
 *   no BOS, no newlines between turns, no injected system prompt.
 *   assistant body: messages up to and including the last assistant message without
 *     tool calls ("history") get <think></think> + content; later ones ("suffix") get
 *     <think> + reasoning + </think> + content (thinking off: <think></think> + content);
 *     then tool calls, if any:
 *     <|tool_calls_section_begin|> (<|tool_call_begin|> id <|tool_call_argument_begin|>
 *     arguments <|tool_call_end|>)* <|tool_calls_section_end|>
 *   tool body: "## Return of " + tool_call_id + "\n" + content.
 *   generation prompt: <|im_assistant|>assistant<|im_middle|> + <think> (thinking on)
 *     or <think></think> (off).
 * The renderer does not read JSON: prompts/corpus.c turns records into chat_msg.
 *
 * Ownership: chat_render buffers belong to the caller (chat_render_free). chat_msg
 * strings are borrowed. Thread safety: no global state; all functions reentrant. */
#ifndef EG_PROMPTS_CHAT_H
#define EG_PROMPTS_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/eg_common.h"
#include "prompts/tokenizer.h"

/* Recorded by datasets next to the tokenizer fingerprint. Bump on any rendering change. */
#define CHAT_TEMPLATE_VERSION "kimi-k2.5/1"

/* A borrowed byte string (may contain NUL); s == NULL means "absent". */
typedef struct chat_str {
    const char *s;
    size_t n;
} chat_str;

typedef enum chat_role {
    CHAT_SYSTEM = 0,
    CHAT_USER,
    CHAT_ASSISTANT,
    CHAT_TOOL
} chat_role;

typedef struct chat_tool_call {
    chat_str id;        /* rendered verbatim, e.g. "functions.get_weather:0" */
    chat_str arguments; /* JSON text, rendered verbatim */
} chat_tool_call;

typedef struct chat_msg {
    chat_role role;
    chat_str name;         /* header name; absent or empty: the role ("user", ...) */
    chat_str content;      /* text (list-of-parts content already concatenated); absent: empty */
    chat_str reasoning;    /* assistant reasoning_content; absent: empty */
    chat_str tool_call_id; /* tool messages */
    const chat_tool_call *tool_calls; /* [n_tool_calls], assistant only */
    size_t n_tool_calls;
} chat_msg;

typedef struct chat_opts {
    int thinking;              /* 1 (Kimi's default): "<think>" generation prompt */
    int add_generation_prompt; /* append "<|im_assistant|>assistant<|im_middle|><think>..." */
} chat_opts;

/* One assistant message's loss span, as byte offsets into the rendered text: from right
 * after "<|im_assistant|>{name}<|im_middle|>" up to and including its "<|im_end|>". */
typedef struct chat_span {
    size_t begin, end;
} chat_span;

typedef struct chat_render {
    char *text;        /* [len] rendered conversation, NUL terminated */
    size_t len, cap;
    chat_span *spans;  /* [n_spans] assistant spans in message order */
    size_t n_spans, spans_cap;
} chat_render;

const char *chat_role_name(chat_role r); /* "system", "user", "assistant", "tool" */

/* Render msgs[0..n) into *out (replacing its previous content; buffers reused). */
eg_status chat_render_msgs(const chat_msg *msgs, size_t n, const chat_opts *opts, chat_render *out,
                           eg_error *err);
void chat_render_free(chat_render *r); /* NULL ok */

/* Number of messages the regenerate-mode prompt keeps: everything up to and including
 * the last user message (0 when there is none; the caller rejects such records). */
size_t chat_prompt_len(const chat_msg *msgs, size_t n);

/* Tokenise a render exactly as the serving stack tokenises the whole string (special
 * tokens recognised), REPLACING ids' content. With mask != NULL, *mask is realloc'd to
 * ids->n bytes: 1 for tokens inside a span, else 0. Fails (EG_ERR_FORMAT) if a span
 * boundary falls inside a token, which only a special-token string cut by Kimi's 25,000
 * code-point run splitting can cause; the record is then rejected, never mis-masked. */
eg_status chat_tokenize(const tok_tokenizer *t, const chat_render *r, tok_seq *ids, uint8_t **mask,
                        eg_error *err);

/* Loss mask straight from token ids, for inputs with no template ({"text"},
 * {"input_ids"}) in capture mode: after each <|im_assistant|> token skip to the next
 * <|im_middle|>, then 1 from the token after it through the next <|im_end|> inclusive.
 * *mask is realloc'd to n bytes. Equals the span rule when content holds no
 * special-token text. */
eg_status chat_mask_from_ids(const tok_tokenizer *t, const int32_t *ids, size_t n, uint8_t **mask,
                             eg_error *err);

#endif
