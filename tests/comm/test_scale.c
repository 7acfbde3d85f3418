/* Per-rank comm memory that must not grow with the world: a world of
 * SCALE_N fiber ranks runs a trivial collective program on the world and on
 * groups split from it (all-reduce of three scalars, all-gather and
 * all-to-all of one element each, broadcast, barrier, a split into groups of
 * 64 and an all-reduce over them).  Rank 0 measures the comm tag's
 * high-water over the program between barriers (core/alloc accounting,
 * above what was live before) and it must stay under SCALE_BOUND bytes per
 * rank.  The collectives describe their per-peer byte ranges by rules
 * (backend.h, par__col), and a split's plan comes from parent rank 0, so
 * nothing here is sized by the world on every rank.  The code before
 * (32 p bytes of v-arrays per rank per world collective, 8 p bytes of
 * gathered colors per rank per split) held about 160 KiB per rank here;
 * measured with this code: see docs/comm.md "Memory per rank". */
#include "comm_test.h"

#define SCALE_N 4096
#define SCALE_GROUP 64
#define SCALE_BOUND 2048

typedef struct {
    int64_t base, peak;
} scale_mem;

static par_status world_program(par_comm *c, int64_t *ones, int64_t *all)
{
    int r = par_comm_rank(c), p = par_comm_size(c);
    double v[3] = {r, 1.0, -r}, s[3];
    TRY(par_allreduce(c, v, s, 3, PAR_C_F64, PAR_OP_SUM));
    CHECK(s[1] == p && s[0] == -s[2], "all-reduce of three: %g %g %g", s[0], s[1], s[2]);
    int64_t me = r;
    TRY(par_allgather(c, &me, all, 1, PAR_C_I64));
    CHECK(all[p - 1] == p - 1 && all[r] == r, "all-gather");
    for (int j = 0; j < p; j++)
        ones[j] = (int64_t)r * p + j;
    TRY(par_alltoall(c, ones, all, 1, PAR_C_I64));
    CHECK(all[0] == r && all[p - 1] == (int64_t)(p - 1) * p + r, "all-to-all");
    int64_t b = r == 7 ? 42 : 0;
    TRY(par_bcast(c, &b, 1, PAR_C_I64, 7));
    CHECK(b == 42, "broadcast from 7: %lld", (long long)b);
    return par_barrier(c);
}

static par_status scale_fn(par_comm *c, void *arg)
{
    scale_mem *sm = arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    /* the caller's own buffers (one element per peer) are not comm's */
    int64_t *ones = par_malloc((size_t)p * sizeof *ones, PAR_TAG_MISC);
    int64_t *all = par_malloc((size_t)p * sizeof *all, PAR_TAG_MISC);
    par_comm *g = NULL;
    par_status st = ones && all ? par_barrier(c) : PAR_ENOMEM;
    if (st == PAR_OK && r == 0) {
        par_alloc_reset_peaks();
        sm->base = par_alloc_live(PAR_TAG_COMM);
    }
    if (st == PAR_OK)
        st = par_barrier(c);
    if (st == PAR_OK)
        st = world_program(c, ones, all);
    if (st == PAR_OK)
        st = par_comm_split(c, r / SCALE_GROUP, r, &g);
    double one = 1.0, n = 0;
    if (st == PAR_OK)
        st = par_allreduce(g, &one, &n, 1, PAR_C_F64, PAR_OP_SUM);
    if (st == PAR_OK && n != SCALE_GROUP)
        st = par_err(PAR_EINTERNAL, "rank %d: group sum %g, want %d", r, n, SCALE_GROUP);
    if (st == PAR_OK)
        st = par_barrier(c);
    if (st == PAR_OK && r == 0)
        sm->peak = par_alloc_peak(PAR_TAG_COMM);
    par_comm_free(g);
    par_free(ones);
    par_free(all);
    return st;
}

Test(scale, comm_memory_per_rank_does_not_grow_with_the_world)
{
    scale_mem sm = {0, 0};
    par_status st = run_world("fiber", SCALE_N, scale_fn, &sm, 120.0);
    cr_assert_eq(st, PAR_OK, "fiber x %d: %s (%s)", SCALE_N, par_status_str(st), par_last_error());
    int64_t high = sm.peak - sm.base, per = high / SCALE_N;
    cr_log_info("comm high-water %lld B over %d ranks: %lld B per rank", (long long)high, SCALE_N,
                (long long)per);
    cr_assert_gt(high, 0, "the comm high-water was not measured");
    cr_assert_lt(per, SCALE_BOUND, "a world of %d ranks held %lld B of comm memory per rank at "
                                   "once (bound %d B): something per rank grows with the world",
                 SCALE_N, (long long)per, SCALE_BOUND);
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "comm memory leaked");
}
