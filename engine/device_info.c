/* The name of the device a backend runs on (backend.h: eg_device_name), recorded in a
 * dataset's precision so an audit knows what made the data. */
#include <stdio.h>
#include <string.h>

#include "engine/backend.h"

#ifdef EG_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static void cpu_name(char *out, size_t n) {
    snprintf(out, n, "unknown cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = 0;
        snprintf(out, n, "%s", v);
        break;
    }
    fclose(f);
}

void eg_device_name(const char *backend, int device, char *out, size_t n) {
    if (!backend || strcmp(backend, "cuda")) { cpu_name(out, n); return; }
#ifdef EG_HAVE_CUDA
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) == cudaSuccess) {
        snprintf(out, n, "%s (cuda device %d, sm_%d%d)", p.name, device, p.major, p.minor);
        return;
    }
#endif
    snprintf(out, n, "unknown cuda device %d", device);
}
