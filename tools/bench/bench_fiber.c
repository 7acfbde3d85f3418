/* bench_fiber - the fiber backend beside the threads backend: rank wake-ups
 * (context switches) per second, a barrier and an all-to-all of 1,024 and
 * 8,192 ranks, and what a rank costs in memory.  Not a test: numbers only.
 *
 *   bench_fiber [max_ranks [threads_max]]   (default 8192 8192; 1024 skips the big
 *                                            worlds; threads_max caps the threads runs)
 *
 * 1. ping-pong: two ranks send 8 bytes back and forth (par_send/par_recv);
 *    on one fiber worker every message is one wake-up of the other rank and
 *    two switches (rank -> worker -> rank); asm and ucontext switches,
 *    two workers, and threads.
 * 2. barrier rounds of 1,024 ranks on one worker: p - 1 wake-ups each.
 * 3. for p = 1,024 and 8,192: the mean of a barrier, the best of an
 *    all-to-all of one f64 per pair (+ a barrier), the best all-reduce of
 *    3 f64 (the driver's statistics are such), the RSS a rank adds and
 *    the comm heap (src/comm's handles and the backend's groups) per rank,
 *    fiber and threads side by side.  The fiber backend's own line (stacks
 *    committed, backend heap, switches) follows each fiber world.
 * Give it the heavy lock: 8,192 thread ranks are 8,192 OS threads (measured:
 * 19 minutes and a load average of ~7000 on the 2-core box; `bench_fiber 8192
 * 1024` leaves them out), and src/comm's world handle costs 36 p bytes per
 * rank (p^2 in all).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/log.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            v = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

typedef struct {
    int reps;
    double t;        /* rank 0: seconds (mean or best, per bench)  */
    long rss;        /* rank 0: VmRSS (KiB) inside the world        */
    int64_t comm;    /* rank 0: live PAR_TAG_COMM bytes in the world */
} args;

/* The fiber backend's info line, echoed after the world. */
static char fiber_line[600];
static void sink(par_log_level l, const char *msg, void *ud)
{
    (void)ud;
    if (l == PAR_LOG_INFO && !strncmp(msg, "fiber:", 6))
        snprintf(fiber_line, sizeof fiber_line, "%s", msg);
    else if (l <= PAR_LOG_WARN)
        fprintf(stderr, "%s\n", msg);
}

static par_status run(const char *backend, int n, int workers, par_world_fn fn, args *a)
{
    par_world_opts o = {.timeout_s = 600, .workers = workers};
    fiber_line[0] = '\0';
    par_status st = par_world_run(par_backend_find(backend), n, fn, a, &o);
    if (st != PAR_OK)
        fprintf(stderr, "bench_fiber: %s x %d: %s\n", backend, n, par_last_error());
    return st;
}

/* ---- 1. ping-pong ------------------------------------------------------------ */

static par_status pingpong(par_comm *c, void *arg)
{
    args *a = arg;
    double x = 0;
    int me = par_comm_rank(c);
    par_status st = par_barrier(c);
    double t0 = now();
    for (int i = 0; i < a->reps && st == PAR_OK; i++) {
        if (me == 0) {
            st = par_send(c, &x, 1, PAR_C_F64, 1, 0);
            if (st == PAR_OK)
                st = par_recv(c, &x, 1, PAR_C_F64, 1, 0);
        } else {
            st = par_recv(c, &x, 1, PAR_C_F64, 0, 0);
            x += 1;
            if (st == PAR_OK)
                st = par_send(c, &x, 1, PAR_C_F64, 0, 0);
        }
    }
    if (me == 0)
        a->t = (now() - t0) / a->reps;
    return st;
}

static void bench_pingpong(void)
{
    struct {
        const char *label, *backend, *sw;
        int workers;
    } cases[] = {
        {"fiber, 1 worker, asm switch", "fiber", "asm", 1},
        {"fiber, 1 worker, ucontext", "fiber", "ucontext", 1},
        {"fiber, 2 workers, asm switch", "fiber", "asm", 2},
        {"threads (2 OS threads)", "threads", NULL, 0},
    };
    printf("\n1. ping-pong of 8 bytes between 2 ranks (par_send / par_recv)\n");
    printf("%-32s %14s %18s\n", "", "us/round trip", "rank wake-ups/s");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].sw)
            setenv("PARITY_FIBER_SWITCH", cases[i].sw, 1);
        args a = {.reps = 200000};
        par_status st = run(cases[i].backend, 2, cases[i].workers, pingpong, &a);
        unsetenv("PARITY_FIBER_SWITCH");
        if (st != PAR_OK)
            continue;
        /* a round trip wakes each rank once */
        printf("%-32s %14.3f %18.3g\n", cases[i].label, a.t * 1e6, 2.0 / a.t);
    }
}

/* ---- 2, 3. barriers and all-to-all -------------------------------------------- */

static par_status barriers(par_comm *c, void *arg)
{
    args *a = arg;
    par_status st = par_barrier(c);
    if (par_comm_rank(c) == 0) { /* every rank started, the others wait */
        a->rss = rss_kib();
        a->comm = par_alloc_live(PAR_TAG_COMM);
    }
    if (st == PAR_OK)
        st = par_barrier(c);
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
    double *in = par_malloc((size_t)p * sizeof *in, PAR_TAG_ACT);
    double *out = par_malloc((size_t)p * sizeof *out, PAR_TAG_ACT);
    par_status st = in && out ? par_barrier(c) : par_err(PAR_ENOMEM, "bench: no memory");
    for (int j = 0; in && j < p; j++)
        in[j] = par_comm_rank(c) * 1e4 + j;
    for (int r = 0; r < a->reps && st == PAR_OK; r++) {
        double t0 = now();
        st = par_alltoall(c, in, out, 1, PAR_C_F64);
        if (st == PAR_OK)
            st = par_barrier(c);
        double dt = now() - t0;
        if (par_comm_rank(c) == 0 && (a->t == 0 || dt < a->t))
            a->t = dt;
    }
    par_free(in);
    par_free(out);
    return st;
}

/* A small all-reduce (3 f64, like the driver's statistics) over the world. */
static par_status allreduce(par_comm *c, void *arg)
{
    args *a = arg;
    double v[3] = {par_comm_rank(c), 1, 2};
    par_status st = par_barrier(c);
    for (int r = 0; r < a->reps && st == PAR_OK; r++) {
        double t0 = now();
        st = par_allreduce(c, v, v, 3, PAR_C_F64, PAR_OP_SUM);
        double dt = now() - t0;
        if (par_comm_rank(c) == 0 && (a->t == 0 || dt < a->t))
            a->t = dt;
    }
    return st;
}

static void bench_wakeups(void)
{
    args a = {.reps = 50};
    printf("\n2. barrier rounds of 1024 ranks on 1 fiber worker (asm switch)\n");
    if (run("fiber", 1024, 1, barriers, &a) == PAR_OK)
        printf("%.3f ms per barrier: %.3g rank wake-ups/s (1023 per barrier)\n", a.t * 1e3,
               1023.0 / a.t);
    if (fiber_line[0])
        printf("   %s\n", fiber_line);
}

static void bench_world(int p, int threads_max)
{
    const char *backends[] = {"fiber", "threads"};
    printf("\n3. %d ranks\n", p);
    printf("%-8s %12s %12s %14s %14s %14s %12s\n", "backend", "barrier ms", "a2a ms",
           "allreduce ms", "RSS KiB/rank", "comm B/rank", "launch+run s");
    for (int b = 0; b < 2; b++) {
        if (b == 1 && p > threads_max) {
            printf("threads  (skipped: more than %d ranks)\n", threads_max);
            continue;
        }
        long before = rss_kib();
        args ba = {.reps = p > 2048 ? 5 : 20};
        double t0 = now();
        if (run(backends[b], p, 0, barriers, &ba) != PAR_OK)
            continue;
        double wall = now() - t0;
        char line[600];
        snprintf(line, sizeof line, "%s", fiber_line);
        args aa = {.reps = 3}, ar = {.reps = 3};
        if (run(backends[b], p, 0, alltoall, &aa) != PAR_OK ||
            run(backends[b], p, 0, allreduce, &ar) != PAR_OK)
            continue;
        printf("%-8s %12.3f %12.3f %14.3f %14.1f %14.0f %12.2f\n", backends[b], ba.t * 1e3,
               aa.t * 1e3, ar.t * 1e3, (double)(ba.rss - before) / p, (double)ba.comm / p, wall);
        if (line[0])
            printf("   barrier world: %s\n", line);
        if (fiber_line[0])
            printf("   all-to-all world: %s\n", fiber_line);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    int max = argc > 1 ? atoi(argv[1]) : 8192;
    int threads_max = argc > 2 ? atoi(argv[2]) : max;
    if (max < 2 || threads_max < 0) {
        fprintf(stderr, "usage: bench_fiber [max_ranks [threads_max_ranks]]\n");
        return 2;
    }
    par_log_set_sink(sink, NULL);
    par_log_set_level(PAR_LOG_INFO);
    printf("bench_fiber: fiber vs threads backends (comm timeout 600 s)\n");
    bench_pingpong();
    bench_wakeups();
    for (int p = 1024; p <= max; p *= 8)
        bench_world(p, threads_max);
    return 0;
}
