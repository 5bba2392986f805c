/* export_target.h — a minimal "target model" directory for a drafter trainer that needs
 * only the target's lm_head and token embedding (SpecForge 0.2's offline TargetHead and
 * its draft model's load_embedding), cut out of a full checkpoint.
 *
 * Writes OUT_DIR/model.safetensors (lm_head.weight [V, H] and model.embed_tokens.weight
 * [V, H], the checkpoint's own bytes and dtype; a tied checkpoint gives the embedding
 * twice), OUT_DIR/model.safetensors.index.json (the weight map TargetHead looks up),
 * OUT_DIR/config.json (flat, model_type "llama": hidden_size, vocab_size and the few
 * fields transformers' AutoConfig needs; Kimi-K2.5's nested kimi_k25 config is not
 * loadable there) and copies the tokenizer files found in the model directory
 * (tokenizer*, tiktoken.model, special_tokens_map.json). The names are found under the
 * plain and the "language_model." prefixes. Each file is written atomically.
 * Ownership: nothing retained. Thread safety: no shared state. */
#ifndef EG_EXPORT_TARGET_H
#define EG_EXPORT_TARGET_H

#include <stdint.h>

#include "common/eg_common.h"

typedef struct eg_target_info {
    int64_t hidden, vocab; /* H, V of the checkpoint */
    int64_t bytes;         /* bytes written */
    int tokenizer_files;   /* tokenizer files copied */
} eg_target_info;

eg_status eg_export_target(const char *model_dir, const char *out_dir, eg_target_info *info, eg_error *err);

#endif
