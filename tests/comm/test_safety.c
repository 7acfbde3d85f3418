/* Safety: mismatched collectives are reported with each rank's call, waits
 * time out with a report, a failing rank stops the world promptly, and the
 * launcher, registry and hooks behave. */
#include <stdatomic.h>
#include <time.h>

#include "comm_test.h"
#include "core/log.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The in-process backends every test here runs on. */
static const char *const INPROC[] = {"threads", "fiber"};
#define FOR_INPROC(be) for (const char *const *be##_ = INPROC, *be; \
                            be##_ < INPROC + 2 && (be = *be##_, 1); be##_++)

/* What each rank's comm calls returned. */
typedef struct {
    par_status st[64];
    double t[64];
} outcome;

/* Log lines are captured so tests can look at the reports. */
static char logbuf[1 << 16];
static size_t loglen;
static void sink(par_log_level l, const char *msg, void *ud)
{
    (void)l, (void)ud;
    size_t n = strlen(msg);
    if (loglen + n + 2 < sizeof logbuf) {
        memcpy(logbuf + loglen, msg, n);
        loglen += n;
        logbuf[loglen++] = '\n';
        logbuf[loglen] = '\0';
    }
}

static void capture(void)
{
    loglen = 0;
    logbuf[0] = '\0';
    par_log_set_sink(sink, NULL);
}

/* ---- mismatches --------------------------------------------------------- */

static par_status mixed_ops_fn(par_comm *c, void *arg)
{
    outcome *o = arg;
    int r = par_comm_rank(c);
    double x[10] = {0}, y[10];
    par_status st = r == 1 ? par_barrier(c) : par_allreduce(c, x, y, 10, PAR_C_F64, PAR_OP_SUM);
    o->st[r] = st;
    return st;
}

Test(safety, different_collectives_are_named)
{
    FOR_INPROC(be) for (int p = 2; p <= 8; p *= 2) {
        outcome o = {0};
        capture();
        par_status st = run_world(be, p, mixed_ops_fn, &o, 5);
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_EMISMATCH, "%s p=%d: %s", be, p, par_status_str(st));
        for (int r = 0; r < p; r++)
            cr_assert(o.st[r] == PAR_EMISMATCH || o.st[r] == PAR_ECOMM, "%s rank %d: %s", be, r,
                      par_status_str(o.st[r]));
        const char *e = par_last_error();
        cr_assert(strstr(e, "rank 1 called barrier #1 of group world"), "%s", e);
        cr_assert(strstr(e, "allreduce #1 of group world (f64 x 10, sum)"), "%s", e);
        cr_assert(strstr(e, p == 2 ? "rank 0 called" : "ranks 0,2"), "%s", e);
    }
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0);
}

static par_status counts_fn(par_comm *c, void *arg)
{
    outcome *o = arg;
    int r = par_comm_rank(c);
    float x[8] = {0}, y[8];
    o->st[r] = par_allreduce(c, x, y, r == 2 ? 7 : 8, PAR_C_F32, PAR_OP_MAX);
    return o->st[r];
}

Test(safety, different_counts_are_named)
{
    FOR_INPROC(be) {
        outcome o = {0};
        capture();
        par_status st = run_world(be, 5, counts_fn, &o, 5);
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_EMISMATCH, "%s", be);
        for (int r = 0; r < 5; r++)
            cr_assert_eq(o.st[r], PAR_EMISMATCH, "%s: every rank sees the mismatch (rank %d)", be,
                         r);
        const char *e = par_last_error();
        cr_assert(strstr(e, "ranks 0-1,3-4 called allreduce #1 of group world (f32 x 8, max)"),
                  "%s: %s", be, e);
        cr_assert(strstr(e, "rank 2 called allreduce #1 of group world (f32 x 7, max)"), "%s: %s",
                  be, e);
    }
}

static par_status pairs_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    size_t sc[4], rc[4];
    for (int j = 0; j < p; j++) {
        sc[j] = 2;
        rc[j] = r == 3 && j == 1 ? 3 : 2; /* rank 3 expects 3 from rank 1 */
    }
    int32_t in[8] = {0}, out[12];
    return par_alltoallv(c, in, sc, NULL, out, rc, NULL, PAR_C_I32);
}

Test(safety, alltoallv_pair_mismatch)
{
    FOR_INPROC(be) {
        capture();
        par_status st = run_world(be, 4, pairs_fn, NULL, 5);
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_EMISMATCH, "%s", be);
        cr_assert(strstr(par_last_error(),
                         "rank 1 sends 2 elements (8 bytes) to rank 3, which expects 3 elements"),
                  "%s: %s", be, par_last_error());
    }
}

/* ---- timeouts ----------------------------------------------------------- */

static par_status absent_fn(par_comm *c, void *arg)
{
    outcome *o = arg;
    int r = par_comm_rank(c);
    double t0 = now();
    if (r == 0)
        return PAR_OK; /* never arrives */
    par_status st = par_barrier(c);
    o->st[r] = st;
    o->t[r] = now() - t0;
    return st;
}

Test(safety, absent_rank_times_out)
{
    FOR_INPROC(be) for (int p = 2; p <= 16; p *= 2) {
        outcome o = {0};
        capture();
        double t0 = now();
        par_status st = run_world(be, p, absent_fn, &o, 0.5);
        double el = now() - t0;
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_ETIMEOUT, "%s p=%d: %s", be, p, par_status_str(st));
        cr_assert(el < 2.5, "%s p=%d: the run took %.2f s with a 0.5 s timeout", be, p, el);
        for (int r = 1; r < p; r++) {
            cr_assert_eq(o.st[r], PAR_ETIMEOUT, "%s p=%d rank %d: %s", be, p, r,
                         par_status_str(o.st[r]));
            cr_assert(o.t[r] < 2.0, "%s: rank %d waited %.2f s", be, r, o.t[r]);
        }
        /* every waiting rank reported, naming the missing one */
        cr_assert(strstr(logbuf, "timed out after 0.5 s waiting for barrier #1 of group world"), "%s",
                  logbuf);
        cr_assert(strstr(logbuf, "missing rank 0 (world rank 0): returned from its rank "
                                 "function (ok)"),
                  "%s", logbuf);
        size_t reports = 0; /* one per waiting rank, plus the launcher's summary */
        for (const char *s = logbuf; (s = strstr(s, "waiting for barrier #1")); s++)
            reports++;
        reports -= strstr(logbuf, "world of ") != NULL;
        cr_assert_eq(reports, (size_t)(p - 1), "%s p=%d: %zu reports\n%s", be, p, reports,
                     logbuf);
    }
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0);
}

static par_status lonely_recv_fn(par_comm *c, void *arg)
{
    (void)arg;
    if (par_comm_rank(c) == 0) { /* busy elsewhere, never sends */
        struct timespec ts = {0, 800000000};
        nanosleep(&ts, NULL);
    }
    if (par_comm_rank(c) != 1)
        return PAR_OK;
    double x;
    return par_recv(c, &x, 1, PAR_C_F64, 0, 77);
}

Test(safety, receive_without_sender_times_out)
{
    FOR_INPROC(be) {
        capture();
        double t0 = now();
        /* rank 0 sleeps in a system call, which holds a fiber's worker: one
         * worker per rank so that rank 1 still runs */
        par_world_opts o = {.timeout_s = 0.3, .workers = 3};
        par_status st = par_world_run(par_backend_find(be), 3, lonely_recv_fn, NULL, &o);
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_ETIMEOUT, "%s: %s", be, par_status_str(st));
        cr_assert(strstr(logbuf, "timed out after 0.3 s waiting for recv from rank 0 (world rank "
                                 "0), tag 77, group world (f64 x 1); missing rank 0 (world rank "
                                 "0): running, in no comm call"),
                  "%s: %s", be, logbuf);
        cr_assert(now() - t0 < 2.0, "%s", be);
        cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "%s", be);
    }
}

/* ---- a failing rank stops the world ------------------------------------- */

static par_status failing_fn(par_comm *c, void *arg)
{
    outcome *o = arg;
    int r = par_comm_rank(c);
    double t0 = now();
    if (r == 2)
        return par_err(PAR_EINVAL, "rank two gives up");
    par_status st = PAR_OK;
    double x = 1, y;
    for (int i = 0; i < 3 && st == PAR_OK; i++)
        st = r % 2 ? par_allreduce(c, &x, &y, 1, PAR_C_F64, PAR_OP_SUM) : par_barrier(c);
    if (st == PAR_OK) /* odd and even ranks disagree; never reached */
        st = PAR_EINTERNAL;
    o->st[r] = st;
    o->t[r] = now() - t0;
    return st;
}

Test(safety, failing_rank_stops_the_world)
{
    FOR_INPROC(be) for (int p = 3; p <= 64; p *= 4) {
        outcome o = {0};
        capture();
        double t0 = now();
        par_status st = run_world(be, p, failing_fn, &o, 30);
        double el = now() - t0;
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_EINVAL, "%s p=%d: %s (%s)", be, p, par_status_str(st),
                     par_last_error());
        cr_assert(strstr(par_last_error(), "rank 2 failed first: rank two gives up"), "%s: %s",
                  be, par_last_error());
        cr_assert(el < 2.0, "%s p=%d: took %.2f s (timeout 30 s)", be, p, el);
        for (int r = 0; r < p; r++)
            if (r != 2)
                cr_assert_eq(o.st[r], PAR_ECOMM, "%s p=%d rank %d: %s", be, p, r,
                             par_status_str(o.st[r]));
    }
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0);
}

/* After a failure, every comm call fails fast. */
static par_status after_fn(par_comm *c, void *arg)
{
    (void)arg;
    if (par_comm_rank(c) == 0)
        return par_err(PAR_EIO, "disk gone");
    while (par_barrier(c) == PAR_OK)
        ;
    double t0 = now();
    par_status a = par_barrier(c);
    par_comm *sub;
    par_status b = par_comm_split(c, 0, 0, &sub);
    par_request *rq;
    par_status d = par_isend(c, &t0, 1, PAR_C_F64, 0, 0, &rq);
    CHECK(a == PAR_ECOMM && b == PAR_ECOMM && d == PAR_ECOMM, "%d %d %d", a, b, d);
    CHECK(now() - t0 < 0.1, "fail fast");
    return PAR_ECOMM;
}

Test(safety, calls_after_failure_fail_fast)
{
    FOR_INPROC(be) {
        capture();
        par_status st = run_world(be, 4, after_fn, NULL, 10);
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_EIO, "%s: %s", be, par_last_error());
    }
}

/* ---- launcher, registry, hooks ------------------------------------------ */

static void init_hook(int rank, void *ud)
{
    atomic_fetch_add((_Atomic int *)ud, rank + 1);
}

static par_status leaky_fn(par_comm *c, void *arg)
{
    (void)arg;
    /* leaves a pending request and a group behind */
    static double x[64];
    par_request *rq;
    par_comm *sub;
    TRY(par_comm_split(c, 0, 0, &sub));
    int r = par_comm_rank(c);
    return par_irecv(c, &x[r], 1, PAR_C_F64, r, 1, &rq);
}

Test(safety, launcher_hook_and_cleanup)
{
    FOR_INPROC(be) {
        _Atomic int sum = 0;
        par_world_opts o = {.timeout_s = 5, .rank_init = init_hook, .rank_init_ud = (void *)&sum};
        capture();
        par_status st = par_world_run(par_backend_find(be), 16, leaky_fn, NULL, &o);
        par_log_set_sink(NULL, NULL);
        cr_assert_eq(st, PAR_OK, "%s: %s", be, par_last_error());
        cr_assert_eq(atomic_load(&sum), 16 * 17 / 2, "%s: rank_init ran on every rank", be);
        cr_assert(strstr(logbuf, "returned with 1 pending point-to-point requests"), "%s: %s", be,
                  logbuf);
        cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "%s", be);
    }
}

Test(safety, registry_and_arguments)
{
    cr_assert_geq(par_backend_count(), 2);
    cr_assert_str_eq(par_backend_name(par_backend_at(0)), "self");
    cr_assert_str_eq(par_backend_name(par_backend_find("threads")), "threads");
    cr_assert_null(par_backend_find("carrier-pigeon"));
    const par_backend *b = NULL;
    par_err_set_quiet(1);
    cr_assert_eq(par_backend_get("carrier-pigeon", &b), PAR_ENOTFOUND);
    cr_assert(strstr(par_last_error(), "available: self, threads"), "%s", par_last_error());
    cr_assert_eq(par_world_run(par_backend_find("self"), 2, mixed_ops_fn, NULL, NULL),
                 PAR_EINVAL);
    cr_assert_eq(par_world_run(par_backend_find("threads"), 0, mixed_ops_fn, NULL, NULL),
                 PAR_EINVAL);
    par_err_set_quiet(0);
    char list[64];
    par_backend_list(list, sizeof list);
    cr_assert(!strncmp(list, "self, threads, fiber", 20), "%s", list);
    cr_assert_str_eq(par_backend_name(par_backend_find("fiber")), "fiber");
}
