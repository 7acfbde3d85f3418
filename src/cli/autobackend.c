/* cli/autobackend.c - the default backend from the world size and the
 * machine (see cli/autobackend.h). */
#define _GNU_SOURCE
#include "cli/autobackend.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "backends/registry.h"

int par_autobackend_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The rule as a table: the first row whose bound the world's ranks per
 * core do not exceed. */
static const struct {
    double max_per_core;
    const char *backend;
    const char *what;
} rules[] = {
    {PAR_AUTOBACKEND_THREADS_PER_CORE, "threads", "one OS thread per rank"},
    {INFINITY, "fiber", "user-level contexts on a few threads"},
};

const char *par_autobackend_pick(int64_t world, int cores, char *why, size_t n)
{
    if (cores < 1)
        cores = 1;
    const double per_core = (double)world / cores;
    int i = 0;
    while (per_core > rules[i].max_per_core)
        i++;
    const char *b = rules[i].backend;
    const char *missing = "";
    if (!par_backend_find(b)) {
        b = "threads";
        missing = "; this build has no fiber backend";
    }
    if (why)
        snprintf(why, n, "default for %lld rank%s on %d core%s (%.3g per core, %s %g): %s%s; --backend NAME forces one",
                 (long long)world, world == 1 ? "" : "s", cores, cores == 1 ? "" : "s", per_core,
                 i == 0 ? "at most" : "more than", (double)PAR_AUTOBACKEND_THREADS_PER_CORE, rules[i].what, missing);
    return b;
}

const par_backend *par_autobackend_find(int64_t world, char *why, size_t n)
{
    return par_backend_find(par_autobackend_pick(world, par_autobackend_cores(), why, n));
}
