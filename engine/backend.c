/* Backend selection by name; see backend.h. */
#include <string.h>

#include "engine/backend.h"

eg_status eg_backend_create(const eg_config *cfg, const eg_backend_opts *o, eg_backend **out, eg_error *err) {
    *out = NULL;
    const char *name = o->name ? o->name : "cpu";
    if (!strcmp(name, "cpu")) return eg_backend_cpu_create(cfg, o, out, err);
    if (!strcmp(name, "cuda")) return eg_backend_cuda_create(cfg, o, out, err);
    return eg_fail(err, EG_ERR_INVALID, "unknown backend '%s' (expected cpu or cuda)", name);
}

void eg_backend_free(eg_backend *b) {
    if (b && b->ops && b->ops->destroy) b->ops->destroy(b);
}

eg_status eg_backend_bind(eg_backend *b, eg_error *err) {
    return b && b->ops->bind ? b->ops->bind(b, err) : EG_OK;
}
