/* backends/host/fopts.c - the options of a fiber world from par_world_opts
 * and the environment (sched.h fsched_opts_from): the fiber backend's and
 * the MPI backend's fiber-hosted ranks read them the same way. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/host/sched.h"
#include "core/log.h"

#define DEFAULT_STACK (256u << 10)
#define DEFAULT_GUARD (64u << 10)

/* "262144", "256K", "1M": bytes; 0 when malformed. */
static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    if (*end == 'k' || *end == 'K')
        v <<= 10, end++;
    else if (*end == 'm' || *end == 'M')
        v <<= 20, end++;
    return *end ? 0 : (size_t)v;
}

static size_t stack_bytes(const par_world_opts *o)
{
    if (o && o->stack_bytes)
        return o->stack_bytes;
    const char *e = getenv("PARITY_FIBER_STACK");
    if (e && *e) {
        size_t v = parse_size(e);
        if (v >= (16u << 10))
            return v;
        PAR_LOG_W("PARITY_FIBER_STACK=%s is not a stack size of at least 16K (bytes, or with "
                  "K or M); using %uK", e, DEFAULT_STACK >> 10);
    }
    return DEFAULT_STACK;
}

static int worker_count(const par_world_opts *o, int n, int procs)
{
    int k = o ? o->workers : 0;
    const char *e = getenv("PARITY_FIBER_WORKERS");
    if (k <= 0 && e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end == '\0' && v >= 1 && v <= 4096)
            k = (int)v;
        else
            PAR_LOG_W("PARITY_FIBER_WORKERS=%s is not a number of threads in 1..4096; using one "
                      "per core", e);
    }
    if (k <= 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        k = ncpu > 0 ? (int)ncpu : 1;
        k = procs > 1 ? k / procs : k;
        k = k < 1 ? 1 : k;
    }
    return k < n ? k : n;
}

static par_status switch_kind(fctx_kind *out)
{
    const char *e = getenv("PARITY_FIBER_SWITCH");
    if (!e || !*e) {
        *out = fctx_asm_available() ? FCTX_ASM : FCTX_UCONTEXT;
    } else if (!strcmp(e, "ucontext")) {
        *out = FCTX_UCONTEXT;
    } else if (!strcmp(e, "asm") && fctx_asm_available()) {
        *out = FCTX_ASM;
    } else {
        return par_err(PAR_EINVAL, "PARITY_FIBER_SWITCH=%s: expected %s", e,
                       fctx_asm_available() ? "asm or ucontext" : "ucontext (no asm switch on "
                                                                 "this machine)");
    }
    return PAR_OK;
}

par_status fsched_opts_from(const par_world_opts *wo, int n, int procs, fsched_opts *out)
{
    fsched_opts so = {.workers = worker_count(wo, n, procs), .stack = stack_bytes(wo),
                      .guard = DEFAULT_GUARD};
    par_status st = switch_kind(&so.kind);
    if (st == PAR_OK)
        *out = so;
    return st;
}
