/* backends/host/fopts.c - the options of a fiber world from par_world_opts
 * and the environment (sched.h fsched_opts_from): the fiber backend's and
 * the MPI backend's fiber-hosted ranks read them the same way. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "backends/host/sched.h"
#include "core/hostlim.h"
#include "core/log.h"

#define DEFAULT_STACK (256u << 10)
#define DEFAULT_GUARD (64u << 10)
/* The least PARITY_FIBER_STACK: a training rank's deepest use measured on
 * v4-tiny and v4-mini layouts is 48 KiB (`parity --log info run --backend
 * fiber` prints it), plus a margin for BLAS kernels running on the stack. */
#define MIN_STACK ((size_t)64 << 10)
/* The most address space all stacks may take: half the 47-bit user space. */
#define MAX_STACKS ((uint64_t)1 << 46)
#define MAX_WORKERS 4096

/* "262144", "256K", "1M", "1G": bytes; 0 when malformed or too large. */
static size_t parse_size(const char *s)
{
    char *end;
    if (*s < '0' || *s > '9')
        return 0;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return 0;
    int sh = 0;
    if (*end == 'k' || *end == 'K')
        sh = 10, end++;
    else if (*end == 'm' || *end == 'M')
        sh = 20, end++;
    else if (*end == 'g' || *end == 'G')
        sh = 30, end++;
    if (*end || v > (SIZE_MAX >> sh))
        return 0;
    return (size_t)(v << sh);
}

/* PARITY_FIBER_STACK: at least what a rank needs, at most what this machine
 * can map for n ranks. */
static par_status env_stack(const char *e, int n, size_t *out)
{
    size_t v = parse_size(e);
    if (!v)
        return par_err(PAR_EINVAL, "PARITY_FIBER_STACK=%s is not a stack size (bytes, or a number with K, M or "
                                   "G, e.g. 256K)", e);
    if (v < MIN_STACK)
        return par_err(PAR_EINVAL, "PARITY_FIBER_STACK=%s (%zu KiB) is below the %zu KiB a rank needs (its deepest "
                                   "measured use is 48 KiB; the default is %u KiB)", e, v >> 10, MIN_STACK >> 10,
                       DEFAULT_STACK >> 10);
    uint64_t phys = par_hostlim_phys();
    if (phys && v > phys)
        return par_err(PAR_EINVAL, "PARITY_FIBER_STACK=%s (%.0f MiB) is more than this machine's memory (%.0f MiB): "
                                   "a stack that large can never be used", e, (double)v / 1048576.0,
                       (double)phys / 1048576.0);
    if ((double)n * (double)(v + DEFAULT_GUARD) > (double)MAX_STACKS)
        return par_err(PAR_EINVAL, "PARITY_FIBER_STACK=%s: %d ranks x (%.0f MiB + %u KiB guard) = %.0f GiB is more "
                                   "address space than this machine maps for stacks (%.0f GiB)", e, n,
                       (double)v / 1048576.0, DEFAULT_GUARD >> 10,
                       (double)n * (double)(v + DEFAULT_GUARD) / 1073741824.0, (double)MAX_STACKS / 1073741824.0);
    *out = v;
    return PAR_OK;
}

static par_status stack_bytes(const par_world_opts *o, int n, size_t *out)
{
    const char *e = getenv("PARITY_FIBER_STACK");
    *out = DEFAULT_STACK;
    if (o && o->stack_bytes)
        *out = o->stack_bytes;
    else if (e && *e)
        return env_stack(e, n, out);
    return PAR_OK;
}

/* The most worker threads: 4096, OpenBLAS's MAX_THREADS (more threads
 * calling it corrupt its tables), the user's process limit (ulimit -u). */
static int max_workers(char *why, size_t n)
{
    int k = MAX_WORKERS, b = par_hostlim_blas_max_threads();
    snprintf(why, n, "parity's limit");
    if (b > 0 && b < k)
        k = b, snprintf(why, n, "OpenBLAS's compiled thread limit (MAX_THREADS=%d of openblas_get_config)", b);
    struct rlimit r;
    if (getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY && r.rlim_cur < (rlim_t)k)
        k = (int)r.rlim_cur, snprintf(why, n, "the process limit (ulimit -u %d)", k);
    return k < 1 ? 1 : k;
}

static par_status worker_count(const par_world_opts *o, int n, int procs, int *out)
{
    char why[96];
    int k = o ? o->workers : 0, hi = max_workers(why, sizeof why);
    const char *e = getenv("PARITY_FIBER_WORKERS");
    if (k <= 0 && e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (end == e || *end || v < 1 || v > hi)
            return par_err(PAR_EINVAL, "PARITY_FIBER_WORKERS=%s: expected a number of worker threads in 1..%d "
                                       "(the upper bound is %s)", e, hi, why);
        k = (int)v;
    }
    if (k > hi)
        return par_err(PAR_EINVAL, "fiber: %d worker threads exceed %s: at most %d", k, why, hi);
    if (k <= 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        k = ncpu > 0 ? (int)ncpu : 1;
        k = procs > 1 ? k / procs : k;
        k = k < 1 ? 1 : k > hi ? hi : k;
    }
    *out = k < n ? k : n;
    return PAR_OK;
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
    fsched_opts so = {.guard = DEFAULT_GUARD};
    par_status st;
    if ((st = worker_count(wo, n, procs, &so.workers)) || (st = stack_bytes(wo, n, &so.stack)) ||
        (st = switch_kind(&so.kind)))
        return st;
    /* under ulimit -v: the workers' threads, BLAS buffers and every stack */
    st = par_hostlim_threads_fit("fiber", so.workers, par_hostlim_thread_stack(1),
                                 (size_t)n * (so.stack + so.guard));
    if (st == PAR_OK)
        *out = so;
    return st;
}
