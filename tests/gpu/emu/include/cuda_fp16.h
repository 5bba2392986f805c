/* Emulation stand-in: IEEE half as a struct, converted on the host. */
#ifndef EMU_CUDA_FP16_H
#define EMU_CUDA_FP16_H
#include <stdint.h>
#include <math.h>
struct __half { uint16_t x; };
static inline float __half2float(__half h) {
    int s = h.x >> 15, e = (h.x >> 10) & 31, m = h.x & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}
#endif
