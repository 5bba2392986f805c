/* Fuzz target: config.json (engine/config.c), nested Kimi text_config or flat
 * DeepSeek-V3; what it accepts must give usable derived values. */
#include <math.h>

#include "engine/config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    eg_config c;
    eg_error err = {0};
    memset(&c, 0, sizeof c);
    if (eg_config_parse((const char *)d, n, "fuzz", &c, &err) == EG_OK) {
        int aux[3];
        int na = eg_config_default_aux_layers(&c, aux);
        FUZZ_CHECK(na >= 0 && na <= 3);
        for (int i = 0; i < na; i++) FUZZ_CHECK(aux[i] >= 0 && aux[i] < c.n_layers);
        (void)eg_config_softmax_scale(&c);
        (void)eg_config_rope_attn_factor(&c);
        double *inv = malloc(sizeof(double) * (size_t)(c.qk_rope / 2 + 1));
        FUZZ_CHECK(inv != NULL);
        eg_config_rope_inv_freq(&c, inv);
        free(inv);
        eg_config_free(&c);
    }
    return 0;
}
