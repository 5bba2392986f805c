/* The counter-based draw behind weight_random (backend.h). kernels/elementwise.cu
 * computes the same function on the GPU, so both backends draw identical weights. */
#include "engine/backend.h"

#define EG_GOLDEN 0x9e3779b97f4a7c15ull

static uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float unit(uint64_t h) { return (float)(h >> 40) * (1.0f / 16777216.0f); }

float eg_weight_rand_value(const eg_weight_rand *r, int64_t i) {
    float u = unit(mix(r->seed + (uint64_t)(i + 1) * EG_GOLDEN));
    return r->mean + r->std * 1.7320508f * (2.0f * u - 1.0f);
}

uint32_t eg_weight_rand_int4_word(const eg_weight_rand *r, int64_t i) {
    uint64_t h = mix((r->seed ^ 0x1234567887654321ull) + (uint64_t)(i + 1) * EG_GOLDEN);
    uint32_t w = 0;
    for (int j = 0; j < 8; j++) w |= (uint32_t)(1 + ((h >> (8 * j)) & 0xff) % 15) << (4 * j);
    return w;
}

float eg_weight_rand_scale(const eg_weight_rand *r, int64_t i) {
    return r->std * (0.8f + 0.4f * unit(mix((r->seed ^ 0x5ca1e5ca1e5ca1e5ull) + (uint64_t)(i + 1) * EG_GOLDEN)));
}
