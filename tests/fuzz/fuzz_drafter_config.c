/* Fuzz target: an EAGLE-3 drafter's config.json (engine/drafter_eagle3.c) against a
 * Kimi-K2.5-sized target (hidden 7168, vocabulary 163840, 61 layers), under each aux-layer
 * convention. What it accepts must describe a drafter the loader can size: positive
 * dimensions that divide, a draft vocabulary inside the target's, aux layers ascending
 * inside the target, the cache per position its layout implies (MLA: the latent), and the
 * same answer twice. */
#include "engine/drafter_eagle3.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    eg_config t;
    memset(&t, 0, sizeof t);
    t.hidden = 7168;
    t.vocab = 163840;
    t.n_layers = 61;
    for (int conv = EG_AUX_CONV_AUTO; conv <= EG_AUX_CONV_HF_INDEX; conv++) {
        eg_eagle3_opts o = {.aux_convention = (eg_aux_convention)conv};
        eg_eagle3_config c, c2;
        eg_error err = {0};
        eg_status st = eg_drafter_eagle3_parse_config((const char *)d, n, "fuzz", &t, &o, &c, &err);
        eg_status st2 = eg_drafter_eagle3_parse_config((const char *)d, n, "fuzz", &t, &o, &c2, &err);
        FUZZ_CHECK(st == st2);
        if (st != EG_OK) {
            FUZZ_CHECK(err.msg[0] != 0);
            continue;
        }
        FUZZ_CHECK(c.hidden > 0 && c.heads > 0 && c.kv_heads > 0 && c.heads % c.kv_heads == 0);
        FUZZ_CHECK(c.head_dim >= 2 && c.head_dim % 2 == 0 && c.inter > 0);
        FUZZ_CHECK(c.vocab == t.vocab && c.draft_vocab >= 1 && c.draft_vocab <= c.vocab);
        FUZZ_CHECK(c.target_hidden == t.hidden && c.eps > 0 && c.rope_theta > 1 && c.aux_source);
        FUZZ_CHECK(c.n_aux >= 1 && c.aux_layers);
        for (int i = 0; i < c.n_aux; i++) {
            FUZZ_CHECK(c.aux_layers[i] >= 0 && c.aux_layers[i] < t.n_layers);
            FUZZ_CHECK(i == 0 || c.aux_layers[i] > c.aux_layers[i - 1]);
            FUZZ_CHECK(c.aux_layers[i] == c2.aux_layers[i]);
        }
        FUZZ_CHECK(c.n_aux == c2.n_aux && c.hidden == c2.hidden && c.draft_vocab == c2.draft_vocab);
        /* the paged cache per position: K and V of the kv heads, or an MLA layer's latent */
        FUZZ_CHECK(c.cache_bytes_per_token == (c.mla ? 2 * ((int64_t)c.kv_lora + c.qk_rope)
                                                     : 4 * (int64_t)c.kv_heads * c.head_dim));
        FUZZ_CHECK(!c.mla || (c.kv_lora > 0 && c.qk_rope >= 2 && c.qk_rope % 2 == 0));
        eg_eagle3_config_free(&c);
        eg_eagle3_config_free(&c2);
    }
    return 0;
}
