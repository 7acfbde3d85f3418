/* core/hostlim.c - what this host lets a process start (hostlim.h). */
#define _GNU_SOURCE
#include "core/hostlim.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* OpenBLAS, when the program links it. */
extern char *openblas_get_config(void) __attribute__((weak));

#define BLAS_BUFFER (((size_t)128 << 20) + 4096) /* BUFFER_SIZE + the page OpenBLAS adds */
/* glibc's arenas: two (M_ARENA_MAX below) of HEAP_MAX_SIZE (64 MiB), each
 * mapped at twice that for its alignment while it is made */
#define ARENA_RESERVE ((size_t)256 << 20)
#define MIB(x) ((double)(x) / 1048576.0)

size_t par_hostlim_blas_buffer(void) { return openblas_get_config ? BLAS_BUFFER : 0; }

int par_hostlim_blas_max_threads(void)
{
    const char *c = openblas_get_config ? openblas_get_config() : NULL;
    const char *m = c ? strstr(c, "MAX_THREADS=") : NULL;
    long v = m ? strtol(m + 12, NULL, 10) : 0;
    return v > 0 && v < 1 << 20 ? (int)v : 0;
}

/* Bytes this process maps now (VmSize), 0 when unknown. */
static uint64_t mapped_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    long pg = sysconf(_SC_PAGESIZE);
    return (uint64_t)pages * (uint64_t)(pg > 0 ? pg : 4096);
}

int64_t par_hostlim_as_left(int64_t *limit)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY || r.rlim_cur > (rlim_t)INT64_MAX) {
        if (limit)
            *limit = -1;
        return -1;
    }
    if (limit)
        *limit = (int64_t)r.rlim_cur;
    uint64_t now = mapped_now();
    return now >= r.rlim_cur ? 0 : (int64_t)(r.rlim_cur - now);
}

/* "8M", "512k", "1G", "65536" (OMP_STACKSIZE: a bare number is KiB). */
static size_t omp_stacksize(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int sh = *end == 'B' || *end == 'b' ? 0 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30 : 10;
    return end == s ? 0 : (size_t)(v << sh);
}

size_t par_hostlim_thread_stack(int omp)
{
    const char *e = omp ? getenv("OMP_STACKSIZE") : NULL;
    size_t s = e && *e ? omp_stacksize(e) : 0;
    pthread_attr_t a;
    if (!s && pthread_attr_init(&a) == 0) {
        if (pthread_attr_getstacksize(&a, &s) != 0)
            s = 0;
        pthread_attr_destroy(&a);
    }
    return s ? s : (size_t)8 << 20;
}

par_status par_hostlim_threads_fit(const char *who, int threads, size_t stack, size_t extra)
{
    int64_t limit;
    int64_t left = par_hostlim_as_left(&limit);
    if (left < 0)
        return PAR_OK;
    static int capped;
    if (!capped) /* under a cap: two arenas, not eight per core of 64 MiB each */
        capped = mallopt(M_ARENA_MAX, 2);
    size_t blas = par_hostlim_blas_buffer();
    /* one buffer more: OpenBLAS's pool keeps the one of its first call (a
     * world of 1 rank maps two; measured VmPeak: 1, 2, 4, 8 ranks 411, 599,
     * 720, 780 MB, of which 97 MB before the launch) */
    double need = (double)(threads + 1) * (double)(stack + blas) + (double)ARENA_RESERVE + (double)extra;
    if (need <= (double)left)
        return PAR_OK;
    char fib[64] = "";
    if (extra)
        snprintf(fib, sizeof fib, " + %.0f MiB of rank stacks", MIB(extra));
    double want = (double)(limit - left) + need;
    return par_err(PAR_ENOMEM,
                   "%s: the address-space limit (ulimit -v) is %.0f MiB and this process maps %.0f MiB already; "
                   "%d threads need about %.0f MiB more ((%d + 1) x (%.0f MiB stack + %.0f MiB OpenBLAS work buffer) + "
                   "%.0f MiB malloc arenas%s): raise the limit to at least %.0f MiB (ulimit -v %.0f) or run fewer "
                   "ranks per process; nothing was started",
                   who, MIB(limit), MIB(limit - left), threads, MIB(need), threads, MIB(stack), MIB(blas),
                   MIB(ARENA_RESERVE), fib, MIB(want) + 1, want / 1024.0 + 1024);
}

uint64_t par_hostlim_phys(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    return pages > 0 && pg > 0 ? (uint64_t)pages * (uint64_t)pg : 0;
}
