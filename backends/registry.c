/* backends/registry.c - the only file that knows which backends are built.
 *
 * Optional backends (MPI, built when meson finds MPICH) are compiled in
 * under their HAVE_* switch from parity_config.h. */
#include "backends/registry.h"

#include <stdio.h>
#include <string.h>

#include "comm/backend.h"
#include "parity_config.h"

extern const par_backend par_backend_self;
extern const par_backend par_backend_threads;
extern const par_backend par_backend_fiber;
#if HAVE_MPI
extern const par_backend par_backend_mpi;
#endif

static const par_backend *const candidates[] = {
    &par_backend_self,
    &par_backend_threads,
    &par_backend_fiber,
#if HAVE_MPI
    &par_backend_mpi,
#endif
};

#define NCAND ((int)(sizeof candidates / sizeof candidates[0]))

int par_backend_count(void)
{
    int n = 0;
    for (int i = 0; i < NCAND; i++)
        n += candidates[i] != NULL;
    return n;
}

const par_backend *par_backend_at(int i)
{
    for (int k = 0; k < NCAND; k++)
        if (candidates[k] && i-- == 0)
            return candidates[k];
    return NULL;
}

const par_backend *par_backend_find(const char *name)
{
    for (int k = 0; name && k < NCAND; k++)
        if (candidates[k] && !strcmp(candidates[k]->name, name))
            return candidates[k];
    return NULL;
}

void par_backend_list(char *buf, size_t n)
{
    size_t used = 0;
    if (n)
        buf[0] = '\0';
    for (int k = 0; k < NCAND && used < n; k++) {
        if (!candidates[k])
            continue;
        int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "", candidates[k]->name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

par_status par_backend_get(const char *name, const par_backend **out)
{
    const par_backend *b = par_backend_find(name);
    if (!b) {
        char list[128];
        par_backend_list(list, sizeof list);
        return par_err(PAR_ENOTFOUND, "no backend '%s' in this build (available: %s)",
                       name ? name : "(null)", list);
    }
    *out = b;
    return PAR_OK;
}
