/* What is particular to the fiber backend: ranks share worker threads, so a
 * rank's thread-local state must travel with it; its stack is small, sized
 * by an option and guarded; comm's waits yield to the other ranks. */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm_test.h"
#include "core/alloc.h"
#include "core/counters.h"
#include "core/log.h"
#include "log_capture.h"

static par_status run_fiber(int n, par_world_fn fn, void *arg, int workers, size_t stack)
{
    par_world_opts o = {.timeout_s = 20, .workers = workers, .stack_bytes = stack};
    return par_world_run(par_backend_find("fiber"), n, fn, arg, &o);
}

/* ---- a rank's thread-local state stays with the rank ---------------------- */

static par_status own_state_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c);
    char mine[64], tag[32];
    snprintf(mine, sizeof mine, "the message of rank %d", r);
    snprintf(tag, sizeof tag, "rank %d", r);
    par_counts before = par_counts_get();
    int scope = par_alloc_scope_open(); /* the allocator's per-rank accounting (core/alloc.h) */
    CHECK(scope > 0, "rank %d: no allocation scope", r);
    void *blk[5] = {0};
    for (int round = 0; round < 5; round++) {
        par_set_last_error(mine);
        par_count_flops((uint64_t)r + 1);
        blk[round] = par_malloc((size_t)(r + 1) * 64, PAR_TAG_MISC);
        CHECK(blk[round], "rank %d: out of memory", r);
        TRY(par_barrier(c)); /* every other rank of the worker ran meanwhile */
        int cur = par_alloc_scope_enter(scope);
        CHECK(cur == scope, "rank %d is in allocation scope %d, not its own %d", r, cur, scope);
        par_alloc_stats st;
        par_alloc_scope_stats(scope, &st);
        CHECK(st.live[PAR_TAG_MISC] == (int64_t)(round + 1) * (r + 1) * 64,
              "rank %d's scope holds %lld bytes after round %d", r, (long long)st.live[PAR_TAG_MISC], round);
        CHECK(!strcmp(par_last_error(), mine), "rank %d reads '%s'", r, par_last_error());
        CHECK(!strcmp(par_log_thread_tag(), tag), "rank %d has tag '%s'", r,
              par_log_thread_tag());
        CHECK(par_counts_get().flops == before.flops + (uint64_t)(round + 1) * (uint64_t)(r + 1),
              "rank %d counted %llu flops", r, (unsigned long long)par_counts_get().flops);
    }
    for (int round = 0; round < 5; round++)
        par_free(blk[round]);
    par_alloc_scope_close(scope);
    par_clear_error();
    return PAR_OK;
}

Test(fiber, rank_state_stays_with_the_rank)
{
    for (int workers = 1; workers <= 2; workers++) {
        par_status st = run_fiber(64, own_state_fn, NULL, workers, 0);
        cr_assert_eq(st, PAR_OK, "workers=%d: %s", workers, par_last_error());
    }
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0);
}

/* ---- stacks ------------------------------------------------------------------ */

/* Touches 100 KiB of its stack, then meets the others. */
static par_status deep_fn(par_comm *c, void *arg)
{
    (void)arg;
    volatile char buf[100 << 10];
    for (size_t i = 0; i < sizeof buf; i += 512)
        buf[i] = (char)i;
    return par_barrier(c);
}

Test(fiber, stack_size_is_an_option_and_use_is_reported)
{
    logcap_start();
    par_log_level lv = par_log_get_level();
    par_log_set_level(PAR_LOG_INFO);
    par_status st = run_fiber(8, deep_fn, NULL, 2, 128 << 10);
    par_log_set_level(lv);
    logcap_stop();
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    cr_assert(strstr(logcap, "fiber: 8 ranks on 2 workers, 128 KiB stacks: deepest use"), "%s",
              logcap);
    /* the array and the frames around it: at least 100 KiB, less than all */
    const char *d = strstr(logcap, "deepest use ");
    cr_assert_not_null(d);
    int used = atoi(d + strlen("deepest use "));
    cr_assert(used >= 100 && used < 128, "deepest use %d KiB\n%s", used, logcap);
    cr_assert(strstr(logcap, "of its 128 KiB stack; give the ranks more"),
              "more than 3/4 used warns:\n%s", logcap);
}

/* Recurses far deeper than any stack here; each frame holds 1 KiB. */
static volatile int depth_limit = 1 << 30;
static int recurse(int depth)
{
    volatile char pad[1024];
    pad[0] = (char)depth;
    return depth < depth_limit ? recurse(depth + 1) + pad[0] : 0;
}

static par_status overflow_fn(par_comm *c, void *arg)
{
    (void)arg;
    if (par_comm_rank(c) == 1)
        return recurse(0) ? PAR_OK : PAR_EINTERNAL;
    return par_barrier(c);
}

Test(fiber, stack_overflow_is_a_clear_error)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        run_fiber(4, overflow_fn, NULL, 2, 32 << 10);
        _exit(0); /* not reached: the overflow kills the process */
    }
    close(fds[1]);
    char out[4096];
    size_t k = 0;
    ssize_t got;
    while (k + 1 < sizeof out && (got = read(fds[0], out + k, sizeof out - 1 - k)) > 0)
        k += (size_t)got;
    out[k] = '\0';
    close(fds[0]);
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGSEGV, "status %#x, stderr:\n%s", ws, out);
    cr_assert(strstr(out, "rank 1 overflowed its stack of 32 KiB"), "%s", out);
    cr_assert(strstr(out, "PARITY_FIBER_STACK"), "%s", out);
}

/* ---- switches and waits ------------------------------------------------------ */

static par_status pattern_fn(par_comm *c, void *arg)
{
    double *out = arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    double v[7];
    for (int i = 0; i < 7; i++)
        v[i] = 1.0 / (r + i + 1.0);
    TRY(par_allreduce(c, v, v, 7, PAR_C_F64, PAR_OP_SUM));
    double got = 0, mine = v[r % 7];
    par_request *rq[2] = {NULL, NULL};
    TRY(par_irecv(c, &got, 1, PAR_C_F64, (r + p - 1) % p, 3, &rq[0]));
    TRY(par_isend(c, &mine, 1, PAR_C_F64, (r + 1) % p, 3, &rq[1]));
    TRY(par_waitall(2, rq));
    out[r] = got + v[0];
    return PAR_OK;
}

Test(fiber, ucontext_switch_gives_the_same_bits)
{
    static double a[256], b[256], u[256];
    cr_assert_eq(run_world("threads", 256, pattern_fn, a, 20), PAR_OK, "%s", par_last_error());
    cr_assert_eq(run_fiber(256, pattern_fn, b, 2, 0), PAR_OK, "%s", par_last_error());
    setenv("PARITY_FIBER_SWITCH", "ucontext", 1);
    par_status st = run_fiber(256, pattern_fn, u, 2, 0);
    unsetenv("PARITY_FIBER_SWITCH");
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    cr_assert_eq(memcmp(a, b, sizeof a), 0, "asm switch differs from threads");
    cr_assert_eq(memcmp(a, u, sizeof a), 0, "ucontext switch differs from threads");
}

Test(fiber, bad_switch_is_refused)
{
    setenv("PARITY_FIBER_SWITCH", "carrier-pigeon", 1);
    par_err_set_quiet(1);
    par_status st = run_fiber(2, pattern_fn, NULL, 1, 0);
    par_err_set_quiet(0);
    unsetenv("PARITY_FIBER_SWITCH");
    cr_assert_eq(st, PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "PARITY_FIBER_SWITCH=carrier-pigeon"), "%s",
              par_last_error());
}

/* PARITY_FIBER_WORKERS and PARITY_FIBER_STACK are refused before any rank
 * starts when malformed or out of range (issue 34 items 3, 4; the OpenBLAS
 * bound is checked against the parity binary: tests/hostile/r3_item34_fiber_env.sh). */
static par_status env_refused(const char *var, const char *val, const char *needle)
{
    setenv(var, val, 1);
    par_err_set_quiet(1);
    par_status st = run_fiber(4, pattern_fn, NULL, 0, 0);
    par_err_set_quiet(0);
    unsetenv(var);
    cr_expect_eq(st, PAR_EINVAL, "%s=%s: %s", var, val, par_last_error());
    cr_expect(strstr(par_last_error(), needle), "%s=%s: %s", var, val, par_last_error());
    return st;
}

Test(fiber, bad_worker_and_stack_variables_are_refused)
{
    env_refused("PARITY_FIBER_WORKERS", "0", "expected a number of worker threads in 1..");
    env_refused("PARITY_FIBER_WORKERS", "5000", "PARITY_FIBER_WORKERS=5000");
    env_refused("PARITY_FIBER_WORKERS", "12abc", "PARITY_FIBER_WORKERS=12abc");
    env_refused("PARITY_FIBER_STACK", "16K", "below the 64 KiB a rank needs");
    env_refused("PARITY_FIBER_STACK", "1048576M", "more than this machine's memory");
    env_refused("PARITY_FIBER_STACK", "lots", "is not a stack size");
    env_refused("PARITY_FIBER_STACK", "99999999999999999999", "is not a stack size");
    static double a[4];
    setenv("PARITY_FIBER_STACK", "64K", 1);
    setenv("PARITY_FIBER_WORKERS", "2", 1);
    par_status st = run_fiber(4, pattern_fn, a, 0, 0);
    unsetenv("PARITY_FIBER_STACK");
    unsetenv("PARITY_FIBER_WORKERS");
    cr_expect_eq(st, PAR_OK, "64K stacks on 2 workers: %s", par_last_error());
}

/* With one worker, a rank polling par_test must let the sender run. */
static par_status test_loop_fn(par_comm *c, void *arg)
{
    (void)arg;
    double x = 0, one = 1;
    if (par_comm_rank(c) == 1)
        return par_send(c, &one, 1, PAR_C_F64, 0, 9);
    par_request *rq = NULL;
    TRY(par_irecv(c, &x, 1, PAR_C_F64, 1, 9, &rq));
    int done = 0;
    long polls = 0;
    while (!done) {
        TRY(par_test(&rq, &done));
        polls++;
    }
    CHECK(x == 1.0, "received %g after %ld polls", x, polls);
    return PAR_OK;
}

Test(fiber, test_loops_yield)
{
    cr_assert_eq(run_fiber(2, test_loop_fn, NULL, 1, 0), PAR_OK, "%s", par_last_error());
}

/* ---- waits on a word of this process ------------------------------------------ */

/* Rank 1 stores the word after 200 ms on its own worker; rank 0 waits on it
 * in par_comm_wait_local, parked.  The store wakes it: rank 0 is switched
 * into twice (its start and the wake), so the world's switches stay at a
 * handful.  A waiter that looked again on a timer (every 2-10 ms, the old
 * wait) was switched into about 20 times or more meanwhile. */
static par_status wait_local_fn(par_comm *c, void *arg)
{
    _Atomic int64_t *word = arg;
    if (par_comm_rank(c) == 1) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        par_comm_store_local(word, 1);
        return PAR_OK;
    }
    TRY(par_comm_wait_local(c, word, 1, "the test's word"));
    CHECK(atomic_load(word) == 1, "woke with word %lld", (long long)atomic_load(word));
    return PAR_OK;
}

Test(fiber, wait_local_is_woken_by_the_store)
{
    _Atomic int64_t word;
    atomic_init(&word, 0);
    logcap_start();
    par_log_level lv = par_log_get_level();
    par_log_set_level(PAR_LOG_INFO);
    par_status st = run_fiber(2, wait_local_fn, (void *)&word, 2, 0);
    par_log_set_level(lv);
    logcap_stop();
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    const char *s = strstr(logcap, "switches into ranks");
    cr_assert_not_null(s, "%s", logcap);
    while (s > logcap && s[-1] == ' ')
        s--;
    while (s > logcap && s[-1] >= '0' && s[-1] <= '9')
        s--;
    long switches = atol(s);
    cr_assert(switches >= 3 && switches <= 6, "%ld switches into 2 ranks:\n%s", switches, logcap);
}

/* The same wait on OS threads: the store wakes the blocked thread. */
Test(fiber, wait_local_on_threads)
{
    _Atomic int64_t word;
    atomic_init(&word, 0);
    par_world_opts o = {.timeout_s = 20};
    par_status st = par_world_run(par_backend_find("threads"), 2, wait_local_fn, (void *)&word, &o);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
}
