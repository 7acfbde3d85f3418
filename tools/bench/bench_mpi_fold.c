/* tools/bench/bench_mpi_fold.c - the MPI backend's fiber-hosted ranks
 * (--rank-host fiber): rank wake-ups and context switches per second, beside
 * the same worlds with the ranks of each process as OS threads.  Not a test:
 * numbers only.
 *
 *   meson compile -C build bench_mpi_fold
 *   flock /work/heavy.lock mpiexec -n 2 build/tools/bench/bench_mpi_fold [R [reps]]
 *                              (R ranks per process, default 128; reps default 200)
 *
 * Worlds of P x R ranks (P = mpiexec's processes):
 *   1. ping-pong of 8 bytes between world ranks 0 and R (two processes; the
 *      other ranks return at once): one wake-up per process per round trip;
 *   2. barriers of the ranks of each process (par_comm_split by process):
 *      R - 1 wake-ups per barrier, no MPI;
 *   3. barriers of the world: the members here meet, their leader swaps one
 *      metadata message with each other process, R - 1 wake-ups;
 *   4. an all-to-all of one f64 per pair over the world;
 *   5. idle: world rank R sleeps IDLE_S, then sends 8 bytes to rank 0, which
 *      waits in par_recv meanwhile (the other ranks return at once): the CPU
 *      time (getrusage, all threads) process 0 spends per second of that
 *      wait, its idle workers' polls and naps.
 * For each: µs per round (process 0's rank 0, best of 3 worlds for 1, mean
 * over reps for 2-4), and from the fiber host's counters (its info line at
 * the end of each world: switches into ranks, wake-ups, parks, polls, naps)
 * process 0's switches and wake-ups per round (the world's, its start and
 * end included, over the rounds) and per second (that over the time of a
 * round).  The threads rows give the same worlds with R OS threads per
 * process (skipped above 64: the brief's limit on OS-thread ranks).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "backends/mpi/procs.h"
#include "backends/registry.h"
#include "comm/comm.h"
#include "core/log.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    int R, reps;
    double t;   /* rank 0: seconds per round */
} args;

/* The fiber host's line at the end of a world ("... N switches into ranks,
 * N wake-ups, N parks, N yields, N polls, N naps"). */
static unsigned long long g_sw, g_wk, g_pk, g_po, g_na;
static int g_have;
static void sink(par_log_level l, const char *msg, void *ud)
{
    (void)ud;
    const char *p = strstr(msg, "MiB; ");
    unsigned long long y;
    if (l == PAR_LOG_INFO && !strncmp(msg, "mpi: process", 12) && p &&
        sscanf(p, "MiB; %llu switches into ranks, %llu wake-ups, %llu parks, %llu yields, "
                  "%llu polls, %llu naps", &g_sw, &g_wk, &g_pk, &y, &g_po, &g_na) == 6)
        g_have = 1;
    else if (l <= PAR_LOG_WARN)
        fprintf(stderr, "%s\n", msg);
}

static par_status pingpong(par_comm *c, void *arg)
{
    args *a = arg;
    int me = par_comm_rank(c), R = a->R;
    if (me != 0 && me != R)
        return PAR_OK;
    double x = 0, t0 = now();
    par_status st = PAR_OK;
    for (int i = 0; i < a->reps * 10 && st == PAR_OK; i++) {
        if (me == 0) {
            st = par_send(c, &x, 1, PAR_C_F64, R, 0);
            if (st == PAR_OK)
                st = par_recv(c, &x, 1, PAR_C_F64, R, 0);
        } else {
            st = par_recv(c, &x, 1, PAR_C_F64, 0, 0);
            x += 1;
            if (st == PAR_OK)
                st = par_send(c, &x, 1, PAR_C_F64, 0, 0);
        }
    }
    if (me == 0)
        a->t = (now() - t0) / (a->reps * 10);
    return st;
}

#define IDLE_S 1.0

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
           (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

static par_status idle_wait(par_comm *c, void *arg)
{
    args *a = arg;
    int me = par_comm_rank(c), R = a->R;
    double x = 0;
    if (me == R) {
        struct timespec ts = {(time_t)IDLE_S, (long)((IDLE_S - (double)(time_t)IDLE_S) * 1e9)};
        nanosleep(&ts, NULL);
        return par_send(c, &x, 1, PAR_C_F64, 0, 1);
    }
    if (me != 0)
        return PAR_OK;
    double c0 = cpu_s(), t0 = now();
    par_status st = par_recv(c, &x, 1, PAR_C_F64, R, 1);
    a->t = (cpu_s() - c0) / (now() - t0);
    return st;
}

static par_status local_barriers(par_comm *c, void *arg)
{
    args *a = arg;
    par_comm *mine = NULL;
    par_status st = par_comm_split(c, par_comm_rank(c) / a->R, 0, &mine);
    if (st == PAR_OK)
        st = par_barrier(mine);
    double t0 = now();
    for (int i = 0; i < a->reps && st == PAR_OK; i++)
        st = par_barrier(mine);
    if (par_comm_rank(c) == 0)
        a->t = (now() - t0) / a->reps;
    par_comm_free(mine);
    return st;
}

static par_status world_barriers(par_comm *c, void *arg)
{
    args *a = arg;
    par_status st = par_barrier(c);
    double t0 = now();
    for (int i = 0; i < a->reps && st == PAR_OK; i++)
        st = par_barrier(c);
    if (par_comm_rank(c) == 0)
        a->t = (now() - t0) / a->reps;
    return st;
}

static par_status alltoall(par_comm *c, void *arg)
{
    args *a = arg;
    int p = par_comm_size(c);
    double *in = malloc((size_t)p * sizeof *in), *out = malloc((size_t)p * sizeof *out);
    par_status st = in && out ? par_barrier(c) : PAR_ENOMEM;
    for (int j = 0; in && j < p; j++)
        in[j] = par_comm_rank(c) * 1e4 + j;
    int reps = a->reps / 10 > 0 ? a->reps / 10 : 1;
    double t0 = now();
    for (int i = 0; i < reps && st == PAR_OK; i++)
        st = par_alltoall(c, in, out, 1, PAR_C_F64);
    if (par_comm_rank(c) == 0)
        a->t = (now() - t0) / reps;
    free(in);
    free(out);
    return st;
}

static void row(const char *what, int host, int R, int rounds, par_world_fn fn, int proc, int P)
{
    args a = {.R = R, .reps = rounds};
    par_world_opts o = {.timeout_s = 300, .rank_host = host};
    g_have = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    par_status st = par_world_run(par_backend_find("mpi"), P * R, fn, &a, &o);
    double wall = now() - t0;
    if (proc != 0)
        return;
    int n = fn == pingpong ? rounds * 10 : fn == alltoall ? (rounds / 10 > 0 ? rounds / 10 : 1) : rounds;
    if (st != PAR_OK) {
        printf("%-34s %-7s failed: %s\n", what, host == PAR_RANK_HOST_FIBER ? "fiber" : "threads",
               par_last_error());
        return;
    }
    if (fn == idle_wait) { /* a.t: CPU seconds per second */
        printf("%-34s %-7s %9.1f%% %9.2f  (process 0's CPU per wall second of the wait)\n", what,
               host == PAR_RANK_HOST_FIBER ? "fiber" : "threads", a.t * 100, wall);
        fflush(stdout);
        return;
    }
    printf("%-34s %-7s %10.1f %9.2f", what, host == PAR_RANK_HOST_FIBER ? "fiber" : "threads",
           a.t * 1e6, wall);
    if (g_have)
        printf(" %10.1f %10.1f %12.3g %12.3g %9llu %8llu", (double)g_sw / n, (double)g_wk / n,
               (double)g_sw / n / a.t, (double)g_wk / n / a.t, g_po, g_na);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int R = argc > 1 ? atoi(argv[1]) : 128, reps = argc > 2 ? atoi(argv[2]) : 200;
    int P = 1, proc = 0;
    if (R < 2 || reps < 1 || par_mpi_procs(&P, &proc) != PAR_OK || P < 2) {
        fprintf(stderr, "usage: mpiexec -n P bench_mpi_fold [R >= 2 [reps]]  (P >= 2)\n");
        return 2;
    }
    par_log_set_sink(sink, NULL);
    par_log_set_level(PAR_LOG_INFO);
    if (proc == 0)
        printf("bench_mpi_fold: %d processes x %d ranks (process 0's counters; per round = per "
               "round trip / barrier / all-to-all)\n%-34s %-7s %10s %9s %10s %10s %12s %12s %9s "
               "%8s\n", P, R, "", "host", "us/round", "world s", "switch/rnd", "wake/rnd",
               "switches/s", "wake-ups/s", "polls", "naps");
    for (int host = PAR_RANK_HOST_FIBER; host >= PAR_RANK_HOST_THREADS; host--) {
        if (host == PAR_RANK_HOST_THREADS && R > 64) {
            if (proc == 0)
                printf("threads (skipped: %d OS threads per process exceed 64)\n", R);
            break;
        }
        row("1. ping-pong across processes", host, R, reps, pingpong, proc, P);
        row("2. barrier of a process's ranks", host, R, reps, local_barriers, proc, P);
        row("3. barrier of the world", host, R, reps, world_barriers, proc, P);
        row("4. all-to-all, 1 f64 per pair", host, R, reps, alltoall, proc, P);
        row("5. idle 1 s, CPU of process 0", host, R, 1, idle_wait, proc, P);
    }
    return 0;
}
