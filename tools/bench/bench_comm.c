/* bench_comm - all-to-all throughput of the threads backend against memcpy,
 * and the time of a barrier of many ranks.  Not a test: numbers only.
 *
 *   bench_comm [kib_per_rank] [reps]     (default: 256 KiB sent per rank, 5 reps)
 *
 * For p = 64, 256, 1024 ranks, every rank sends kib_per_rank KiB split evenly
 * over the p peers (par_alltoall, f64); the rate is the bytes that crossed
 * between ranks (p * (p-1) blocks) per second of wall time, best of reps.
 * The reference is this machine's memcpy bandwidth (one thread and one per
 * core, 64 MiB buffers: read + write counted once, as a copy).  Alongside,
 * the emulated time of the same all-to-all on the "reference" network.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/registry.h"
#include "comm/clock.h"
#include "comm/comm.h"
#include "core/alloc.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    size_t count; /* f64 per peer */
    int reps;
    double best;  /* seconds of one all-to-all (rank 0's view, best rep) */
    int barriers;
} args;

static par_status a2a(par_comm *w, void *arg)
{
    args *a = arg;
    int p = par_comm_size(w);
    size_t n = a->count * (size_t)p;
    double *in = par_malloc(n * sizeof *in, PAR_TAG_ACT), *out = par_malloc(n * sizeof *out, PAR_TAG_ACT);
    if (!in || !out) {
        par_free(in);
        par_free(out);
        return par_err(PAR_ENOMEM, "bench: no memory");
    }
    for (size_t i = 0; i < n; i++)
        in[i] = (double)i;
    par_status st = par_barrier(w);
    for (int r = 0; r < a->reps && st == PAR_OK; r++) {
        double t0 = now();
        st = par_alltoall(w, in, out, a->count, PAR_C_F64);
        if (st == PAR_OK)
            st = par_barrier(w); /* everyone finished copying */
        double dt = now() - t0;
        if (par_comm_rank(w) == 0 && (a->best == 0 || dt < a->best))
            a->best = dt;
    }
    par_free(in);
    par_free(out);
    return st;
}

static par_status barriers(par_comm *w, void *arg)
{
    args *a = arg;
    par_status st = par_barrier(w);
    double t0 = now();
    for (int i = 0; i < a->barriers && st == PAR_OK; i++)
        st = par_barrier(w);
    if (par_comm_rank(w) == 0)
        a->best = (now() - t0) / a->barriers;
    return st;
}

static double memcpy_bw(int threads, size_t n)
{
    double best = 0;
#pragma omp parallel num_threads(threads) reduction(max : best)
    {
        char *src = malloc(n), *dst = malloc(n);
        if (src && dst) {
            memset(src, 1, n);
            memset(dst, 0, n);
            for (int r = 0; r < (n < (1u << 20) ? 200 : 5); r++) {
#pragma omp barrier
                double t0 = now();
                memcpy(dst, src, n);
                double dt = now() - t0;
                double bw = (double)n / dt;
                if (bw > best)
                    best = bw;
            }
        }
        free(src);
        free(dst);
    }
    return best * threads; /* aggregate: every thread copies its own buffer */
}

int main(int argc, char **argv)
{
    size_t kib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (kib < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_comm [kib_per_rank] [reps]\n");
        return 2;
    }
    const par_backend *be = par_backend_find("threads");
    int cores = omp_get_num_procs();
    double m1 = memcpy_bw(1, 64u << 20), mc = cores > 1 ? memcpy_bw(cores, 64u << 20) : m1;
    double c1 = memcpy_bw(1, kib * 1024), cc = cores > 1 ? memcpy_bw(cores, kib * 1024) : c1;
    printf("memcpy 64 MiB: %.2f GB/s one thread, %.2f GB/s on %d threads (the %% below)\n",
           m1 / 1e9, mc / 1e9, cores);
    printf("memcpy %zu KiB: %.2f GB/s one thread, %.2f GB/s on %d threads\n", kib, c1 / 1e9,
           cc / 1e9, cores);
    printf("%6s %10s %12s %12s %10s %10s %14s\n", "ranks", "KiB/rank", "B/peer", "ms/a2a",
           "GB/s", "of memcpy", "emulated ms");
    par_netmodel ref;
    par_netmodel_preset("reference", &ref);
    const int sizes[] = {64, 256, 1024};
    for (int i = 0; i < 3; i++) {
        int p = sizes[i];
        args a = {.count = kib * 1024 / 8 / (size_t)p, .reps = reps};
        if (a.count == 0)
            a.count = 1;
        par_world_opts o = {.timeout_s = 600};
        par_status st = par_world_run(be, p, a2a, &a, &o);
        if (st != PAR_OK) {
            fprintf(stderr, "bench_comm: %d ranks: %s\n", p, par_last_error());
            return 1;
        }
        double moved = (double)p * (double)(p - 1) * (double)a.count * 8;
        /* the same all-to-all once more on the emulated reference network */
        par_netrun *net = NULL;
        double emu = 0;
        args e = {.count = a.count, .reps = 1};
        if (par_netrun_create(&ref, p, 0, &net) == PAR_OK) {
            o.net = net;
            int *wr = malloc((size_t)p * sizeof *wr);
            for (int j = 0; wr && j < p; j++)
                wr[j] = j;
            if (wr && par_world_run(be, p, a2a, &e, &o) == PAR_OK) /* minus the 2 barriers */
                emu = par_netrun_stats(net, 0)->total_s - 2 * par_net_barrier(&ref, wr, p).time;
            free(wr);
            par_netrun_free(net);
        }
        printf("%6d %10zu %12zu %12.3f %10.2f %9.1f%% %14.4f\n", p,
               a.count * 8 * (size_t)p / 1024, a.count * 8, a.best * 1e3, moved / a.best / 1e9,
               100.0 * moved / a.best / mc, emu * 1e3);
        fflush(stdout);
    }
    args b = {.barriers = 20};
    par_world_opts o = {.timeout_s = 600};
    if (par_world_run(be, 1024, barriers, &b, &o) != PAR_OK) {
        fprintf(stderr, "bench_comm: barrier: %s\n", par_last_error());
        return 1;
    }
    printf("barrier of 1024 ranks: %.3f ms (mean of %d)\n", b.best * 1e3, b.barriers);
    return 0;
}
