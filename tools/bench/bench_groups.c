/* tools/bench/bench_groups.c - what making a layout's process groups costs
 * a world of N fiber ranks (par_groups_build: one world split per group
 * kind, eleven in all).  Not a test: numbers only.
 *
 *   meson compile -C build bench_groups
 *   flock /work/heavy.lock nice -n 19 build/tools/bench/bench_groups [N [PP [EP]]]
 *                                         (default 8192 8 64: config B's shape)
 *
 * The layout is the tuning guide's (PP stages 'Et|t|...|tmL' over v4-mini's
 * 8 layers + MTP, 384 experts, micro-batch 1, one microbatch per replica).
 * Prints the wall time of the builds, the comm tag's high-water over them
 * (core/alloc accounting, measured by rank 0 between barriers, above what
 * was live before) and the process's peak RSS (getrusage: stacks of the
 * ranks included).  Then the same high-water, per rank, of a few world
 * collectives of a handful of elements on the built world (all-reduce of 3
 * f64, all-gather of 1 i64, broadcast of 1 i64, barrier): what a rank pays
 * for a collective over the whole world, which must not grow with it
 * (docs/comm.md "Memory per rank").  Run each N in its own process: the RSS
 * is a lifetime maximum.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "parallel/layout/groups.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    par_layout l;
    int64_t base, peak;
    int64_t cbase, cpeak; /* the world collectives' */
    double wall, cwall;
} bench;

/* The world collectives of a handful of elements (see the top). */
static par_status world_collectives(par_comm *c, bench *b)
{
    int r = par_comm_rank(c), p = par_comm_size(c);
    int64_t *all = malloc((size_t)p * sizeof *all), me = r, x = r == 0 ? 7 : 0;
    double v[3] = {1, r, -r}, s[3];
    par_status st = all ? par_barrier(c) : PAR_ENOMEM;
    if (st == PAR_OK && r == 0) {
        par_alloc_reset_peaks();
        b->cbase = par_alloc_live(PAR_TAG_COMM);
        b->cwall = now();
    }
    if (st == PAR_OK)
        st = par_barrier(c);
    if (st == PAR_OK)
        st = par_allreduce(c, v, s, 3, PAR_C_F64, PAR_OP_SUM);
    if (st == PAR_OK)
        st = par_allgather(c, &me, all, 1, PAR_C_I64);
    if (st == PAR_OK)
        st = par_bcast(c, &x, 1, PAR_C_I64, 0);
    if (st == PAR_OK)
        st = par_barrier(c);
    if (st == PAR_OK && r == 0) {
        b->cpeak = par_alloc_peak(PAR_TAG_COMM);
        b->cwall = now() - b->cwall;
    }
    free(all);
    return st;
}

static par_status build_fn(par_comm *c, void *arg)
{
    bench *b = arg;
    int r = par_comm_rank(c);
    par_status st = par_barrier(c);
    if (st == PAR_OK && r == 0) {
        par_alloc_reset_peaks();
        b->base = par_alloc_live(PAR_TAG_COMM);
        b->wall = now();
    }
    par_groups g;
    if (st == PAR_OK)
        st = par_barrier(c);
    if (st == PAR_OK)
        st = par_groups_build(c, &b->l, &g);
    if (st == PAR_OK)
        st = par_barrier(c);
    if (st == PAR_OK && r == 0) {
        b->peak = par_alloc_peak(PAR_TAG_COMM);
        b->wall = now() - b->wall;
    }
    if (st == PAR_OK) {
        st = world_collectives(c, b);
        par_groups_free(&g);
    }
    return st;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 8192, pp = argc > 2 ? atoi(argv[2]) : 8;
    int ep = argc > 3 ? atoi(argv[3]) : 64;
    static const int64_t ratios[1] = {0};
    par_layout_model m = {.n_layers = 8, .n_mtp_layers = 1, .n_routed_experts = 384,
                          .seq_length = 16, .global_batch_size = n / (pp > 0 ? pp : 1),
                          .window_size = 8, .n_ratios = 1, .compress_ratios = ratios};
    bench b;
    memset(&b, 0, sizeof b);
    par_layout_init(&b.l);
    b.l.pp = pp;
    b.l.ep = ep;
    b.l.world = n;
    b.l.micro_batch = 1;
    if (pp == 8 && par_layout_set_pp_layout(&b.l, "Et|t|t|t|t|t|t|tmL") != PAR_OK)
        return fprintf(stderr, "bench_groups: %s\n", par_last_error()), 2;
    if (par_layout_resolve(&b.l, &m) != PAR_OK)
        return fprintf(stderr, "bench_groups: %s\n", par_last_error()), 2;
    par_world_opts o = {.timeout_s = 3600};
    double t0 = now();
    par_status st = par_world_run(par_backend_find("fiber"), n, build_fn, &b, &o);
    double world = now() - t0;
    if (st != PAR_OK)
        return fprintf(stderr, "bench_groups: %s\n", par_last_error()), 1;
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    printf("bench_groups: N %d = PP %d x EP %d x De %lld (Da %lld): groups built in %.2f s (world "
           "%.2f s); comm high-water %.1f MiB (%.0f B per rank); peak RSS %.1f MiB\n",
           n, pp, ep, (long long)b.l.de, (long long)b.l.da, b.wall, world,
           (double)(b.peak - b.base) / 1048576.0, (double)(b.peak - b.base) / n,
           (double)u.ru_maxrss / 1024.0);
    printf("bench_groups: N %d: world all-reduce (3 f64) + all-gather (1 i64) + bcast + 2 barriers "
           "in %.2f s; comm high-water %.1f KiB (%.0f B per rank)\n", n, b.cwall,
           (double)(b.cpeak - b.cbase) / 1024.0, (double)(b.cpeak - b.cbase) / n);
    return 0;
}
