/* backends/host/sched: a parked fiber is not scheduled until it is woken
 * (the scheduler's counters say how often fibers ran, parked and yielded),
 * and the poll hook wakes fibers that wait for something outside the
 * scheduler (the MPI backend's fiber-hosted ranks), on an idle worker and
 * on a busy one. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "backends/host/sched.h"

#define N 33      /* fibers: rank 0 and 32 that park */
#define K 2000    /* yields of rank 0                 */

typedef struct {
    fsched *s;
    _Atomic int flag;
    _Atomic int polls;      /* poll hook calls        */
    int poll_wakes_at;      /* the hook sets flag and wakes rank 1 at this call (0: never) */
    int yields;             /* rank 0's yields        */
    int runs[N];            /* times each rank found itself woken */
} ctx;

static fsched *make(ctx *c, int n, int (*poll)(void *))
{
    fsched_opts o;
    cr_assert_eq(fsched_opts_from(NULL, n, 1, &o), PAR_OK);
    o.workers = 1;
    o.user = c;
    o.poll = poll;
    fsched *s = NULL;
    cr_assert_eq(fsched_new(n, &o, &s), PAR_OK);
    c->s = s;
    return s;
}

/* Rank 0 yields K times, then sets the flag and wakes the others, which
 * park until the flag is set. */
static void yield_then_wake(void *ud, int r)
{
    ctx *c = ud;
    if (r == 0) {
        for (int i = 0; i < K; i++)
            fsched_yield(c->s);
        atomic_store(&c->flag, 1);
        for (int j = 1; j < N; j++)
            fsched_wake(c->s, j);
        return;
    }
    while (!atomic_load(&c->flag)) {
        fsched_park(c->s, 0);
        c->runs[r]++;
    }
}

Test(sched, parked_fibers_are_not_scheduled)
{
    static ctx c;
    fsched *s = make(&c, N, NULL);
    cr_assert_eq(fsched_run(s, yield_then_wake, &c), PAR_OK);
    fsched_stats st;
    fsched_get_stats(s, &st);
    /* rank 0: 1 + K switches; each other rank: one to park, one after its wake.
     * Runnable waiters would have cost about K x (N - 1) more. */
    cr_expect_eq(st.switches, (uint64_t)(1 + K + 2 * (N - 1)), "%llu switches",
                 (unsigned long long)st.switches);
    cr_expect_eq(st.parks, (uint64_t)(N - 1), "%llu parks", (unsigned long long)st.parks);
    cr_expect_eq(st.wakes, (uint64_t)(N - 1), "%llu wake-ups", (unsigned long long)st.wakes);
    cr_expect_eq(st.yields, (uint64_t)K, "%llu yields", (unsigned long long)st.yields);
    for (int r = 1; r < N; r++)
        cr_expect_eq(c.runs[r], 1, "rank %d ran %d times after parking", r, c.runs[r]);
    fsched_free(s);
}

/* The hook: at call poll_wakes_at it "completes" rank 1's wait. */
static int poll_hook(void *ud)
{
    ctx *c = ud;
    int k = atomic_fetch_add(&c->polls, 1) + 1;
    if (k == c->poll_wakes_at) {
        atomic_store(&c->flag, 1);
        fsched_wake(c->s, 1);
        return 1;
    }
    return 0;
}

/* Rank 0 returns at once: the worker is idle while rank 1 parks until the
 * hook wakes it. */
static void wait_for_hook(void *ud, int r)
{
    ctx *c = ud;
    if (r == 0)
        return;
    while (!atomic_load(&c->flag)) {
        fsched_park(c->s, 0);
        c->runs[r]++;
    }
}

Test(sched, poll_hook_wakes_a_parked_fiber_on_an_idle_worker)
{
    static ctx c = {.poll_wakes_at = 50};
    fsched *s = make(&c, 2, poll_hook);
    cr_assert_eq(fsched_run(s, wait_for_hook, &c), PAR_OK);
    fsched_stats st;
    fsched_get_stats(s, &st);
    cr_expect(atomic_load(&c.flag), "the hook never ran %d times", c.poll_wakes_at);
    cr_expect_eq(c.runs[1], 1, "rank 1 ran %d times after parking", c.runs[1]);
    cr_expect_eq(st.switches, 3, "%llu switches (rank 0 once, rank 1 twice)",
                 (unsigned long long)st.switches);
    cr_expect_geq(st.polls, 50, "%llu polls", (unsigned long long)st.polls);
    fsched_free(s);
}

/* Rank 0 never parks: the worker is never idle, and polls between fibers. */
static void busy_then_wake(void *ud, int r)
{
    ctx *c = ud;
    if (r == 0) {
        while (!atomic_load(&c->flag) && c->yields++ < 1000000)
            fsched_yield(c->s);
        return;
    }
    while (!atomic_load(&c->flag)) {
        fsched_park(c->s, 0);
        c->runs[r]++;
    }
}

Test(sched, poll_hook_runs_on_a_busy_worker)
{
    static ctx c = {.poll_wakes_at = 10};
    fsched *s = make(&c, 2, poll_hook);
    cr_assert_eq(fsched_run(s, busy_then_wake, &c), PAR_OK);
    fsched_stats st;
    fsched_get_stats(s, &st);
    cr_expect(atomic_load(&c.flag), "the busy worker never polled 10 times (%d yields)", c.yields);
    cr_expect_eq(c.runs[1], 1, "rank 1 ran %d times after parking", c.runs[1]);
    cr_expect_leq(c.yields, 1000, "%d yields before the 10th poll", c.yields);
    cr_expect_eq(st.naps, 0, "%llu naps on a worker that always had a fiber to run",
                 (unsigned long long)st.naps);
    fsched_free(s);
}
