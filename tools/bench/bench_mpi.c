/* tools/bench/bench_mpi.c - parity's all-to-allv on the mpi backend against
 * raw MPI_Alltoallv, one rank per process.
 *
 *   meson compile -C build bench_mpi
 *   mpiexec -n 4 build/tools/bench/bench_mpi [iterations]
 *   mpiexec -n 8 build/tools/bench/bench_mpi
 *
 * For each message size (bytes per pair) both run the same pattern (every
 * rank sends `size` bytes of f64 to every rank) after a warm-up; the time per
 * call is the median over processes of the mean over iterations, and rank 0
 * prints one line per size.  The results are compared bitwise.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/mpi/procs.h"
#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"

typedef struct {
    size_t per_pair;   /* elements to each rank */
    int iters;
    double secs;       /* this rank's mean seconds per call */
    double *out;       /* [p * per_pair] parity's result    */
} bench;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static par_status bench_fn(par_comm *c, void *arg)
{
    bench *b = arg;
    int p = par_comm_size(c), r = par_comm_rank(c);
    size_t n = b->per_pair * (size_t)p;
    size_t *counts = malloc((size_t)p * sizeof *counts);
    double *in = malloc(n * sizeof *in);
    if (!counts || !in)
        return PAR_ENOMEM;
    for (int j = 0; j < p; j++)
        counts[j] = b->per_pair;
    for (size_t i = 0; i < n; i++)
        in[i] = r * 1e6 + (double)i;
    par_status st = PAR_OK;
    for (int it = 0; it < 3 && st == PAR_OK; it++) /* warm-up */
        st = par_alltoallv(c, in, counts, NULL, b->out, counts, NULL, PAR_C_F64);
    if (st == PAR_OK)
        st = par_barrier(c);
    double t0 = now();
    for (int it = 0; it < b->iters && st == PAR_OK; it++)
        st = par_alltoallv(c, in, counts, NULL, b->out, counts, NULL, PAR_C_F64);
    b->secs = (now() - t0) / b->iters;
    free(counts);
    free(in);
    return st;
}

static double raw_mpi(size_t per_pair, int iters, double *out)
{
    int p, r;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    size_t n = per_pair * (size_t)p;
    int *counts = malloc((size_t)p * sizeof *counts), *displs = malloc((size_t)p * sizeof *displs);
    double *in = malloc(n * sizeof *in);
    for (int j = 0; j < p; j++) {
        counts[j] = (int)per_pair;
        displs[j] = (int)(per_pair * (size_t)j);
    }
    for (size_t i = 0; i < n; i++)
        in[i] = r * 1e6 + (double)i;
    for (int it = 0; it < 3; it++)
        MPI_Alltoallv(in, counts, displs, MPI_DOUBLE, out, counts, displs, MPI_DOUBLE,
                      MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    for (int it = 0; it < iters; it++)
        MPI_Alltoallv(in, counts, displs, MPI_DOUBLE, out, counts, displs, MPI_DOUBLE,
                      MPI_COMM_WORLD);
    double secs = (now() - t0) / iters;
    free(counts);
    free(displs);
    free(in);
    return secs;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over processes, on every process. */
static double median(double v)
{
    int p;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    double *all = malloc((size_t)p * sizeof *all);
    MPI_Allgather(&v, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD);
    qsort(all, (size_t)p, sizeof *all, cmp_double);
    double m = all[p / 2];
    free(all);
    return m;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 0;
    int nprocs, proc;
    if (par_mpi_procs(&nprocs, &proc) != PAR_OK)
        return 1;
    const par_backend *be = par_backend_find("mpi");
    if (!be)
        return 1;
    static const size_t sizes[] = {64, 1024, 16384, 131072}; /* bytes per pair */
    if (proc == 0)
        printf("all-to-allv, %d processes x 1 rank (bytes per pair, us per call; median over "
               "processes)\n%10s %12s %12s %8s\n",
               nprocs, "bytes", "parity", "MPI", "ratio");
    int ok = 1;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t per_pair = sizes[k] / sizeof(double);
        int it = iters > 0 ? iters : sizes[k] >= 131072 ? 50 : 300;
        size_t n = per_pair * (size_t)nprocs;
        bench b = {.per_pair = per_pair, .iters = it};
        b.out = malloc(n * sizeof *b.out);
        double *ref = malloc(n * sizeof *ref);
        par_world_opts o = {.timeout_s = 60};
        par_status st = par_world_run(be, nprocs, bench_fn, &b, &o);
        double raw = raw_mpi(per_pair, it, ref);
        int same = st == PAR_OK && !memcmp(b.out, ref, n * sizeof *ref);
        int all_same;
        MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        double tp = median(st == PAR_OK ? b.secs : -1), tm = median(raw);
        if (proc == 0)
            printf("%10zu %12.1f %12.1f %8.2f%s\n", sizes[k], tp * 1e6, tm * 1e6, tp / tm,
                   all_same ? "" : "  RESULTS DIFFER");
        ok &= all_same;
        free(b.out);
        free(ref);
    }
    return ok ? 0 : 1;
}
