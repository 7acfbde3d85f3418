/* backends/registry.h - the backends of this build, by name. */
#ifndef PAR_BACKENDS_REGISTRY_H
#define PAR_BACKENDS_REGISTRY_H

#include <stddef.h>

#include "comm/comm.h"

/* Number of backends in this build and the i-th (0 <= i < count), in the
 * order self, threads, fiber, then mpi when built. */
int par_backend_count(void);
const par_backend *par_backend_at(int i);
/* The backend named `name`, or NULL. */
const par_backend *par_backend_find(const char *name);
/* Like par_backend_find, but an unknown name is PAR_ENOTFOUND with a message
 * listing the available backends (for --backend). */
par_status par_backend_get(const char *name, const par_backend **out);
/* "self, threads, fiber[, mpi]" into buf (always terminated). */
void par_backend_list(char *buf, size_t n);

#endif
