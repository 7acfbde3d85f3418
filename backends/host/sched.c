/* backends/host/sched.c - workers, run queues, park and wake (sched.h). */
#include "backends/host/sched.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "comm/backend.h"
#include "core/alloc.h"
#include "core/counters.h"
#include "core/log.h"

enum { FIB_READY = 0, FIB_RUNNING, FIB_PARKED, FIB_DONE };

#define ERR_CAP 1024       /* par_last_error's buffer                      */
#define SWEEP_S 0.01       /* deadlines and failures are looked at this often */
#define ALTSTACK (256u << 10) /* the fault handler's stack, per worker       */
#define IDLE_SPIN 1000     /* polls of an idle worker before it yields      */
#define IDLE_YIELD_S 200e-6 /* then sched_yield this long before it sleeps  */
/* With a poll hook (sched.h): an idle worker polls POLL_SPIN times back to
 * back, then with a sched_yield between polls until POLL_YIELD_S has passed
 * since it went idle or a poll last moved anything, then naps
 * IDLE_NAP_STEP_US longer at every poll that found nothing, up to
 * IDLE_NAP_MAX_US; a busy worker polls every POLL_EVERY fibers it ran.
 * The yield window is what a reply from another process usually takes (a
 * ping-pong's round trip is tens of us): MPI cannot wake a napping worker,
 * so a nap there would set the latency (docs/comm.md "Fiber-hosted ranks");
 * a worker idle for longer naps as before. */
#define POLL_SPIN 4
#define POLL_YIELD_S 1e-3
#define IDLE_NAP_STEP_US 20
#define IDLE_NAP_MAX_US 500
#define POLL_EVERY 16u

typedef struct fworker fworker;

typedef struct fib {
    fctx ctx;
    fworker *wk;
    int rank;
    _Atomic int state;
    _Atomic int permit;
    double wake_at;          /* parked: deadline (0: none)                  */
    struct fib *next;        /* run queue                                    */
    /* the rank's thread-local state of src/core while it is off its thread */
    par_counts counts;
    int alloc_scope;         /* core/alloc.h's accounting scope (0: none)    */
    char tag[48];
    char *err;               /* last error ([ERR_CAP], allocated when used)  */
    size_t used;             /* stack high-water, measured when it returned  */
    size_t resident;         /* stack pages resident then (bytes)            */
} fib;

struct fworker {
    _Alignas(64) pthread_mutex_t mu;
    pthread_cond_t cv;
    fib *head, *tail;        /* run queue (under mu)                         */
    int sleeping;            /* waiting on cv (under mu)                     */
    _Atomic unsigned pushes; /* bumped by every push: an idle worker polls it */
    _Alignas(64) fctx home;  /* the worker thread's own context              */
    fsched *s;
    fib *cur;                /* the fiber running now                        */
    int id, live;            /* fibers not returned yet                      */
    double next_sweep;
    unsigned picks;
    uint64_t switches, parks, yields, polls, naps; /* this worker's, for fsched_get_stats */
    _Atomic uint64_t wakes;  /* counted by the wakers                      */
};

struct fsched {
    int n, nw;               /* fibers; workers in use                       */
    fsched_opts o;
    fib *fibs;               /* [n]                                          */
    fworker *wk;             /* [o.workers]                                  */
    char *alt;               /* [o.workers * ALTSTACK] signal stacks         */
    void (*body)(void *ud, int r);
    void *ud;
};

static _Thread_local fworker *tl_wk; /* the worker this thread runs, if any */

/* ---- run queues ------------------------------------------------------------- */

static void push(fworker *wk, fib *f)
{
    pthread_mutex_lock(&wk->mu);
    f->next = NULL;
    if (wk->tail)
        wk->tail->next = f;
    else
        wk->head = f;
    wk->tail = f;
    atomic_fetch_add_explicit(&wk->pushes, 1, memory_order_release);
    if (wk->sleeping)
        pthread_cond_signal(&wk->cv);
    pthread_mutex_unlock(&wk->mu);
}

static fib *pop(fworker *wk)
{
    pthread_mutex_lock(&wk->mu);
    fib *f = wk->head;
    if (f) {
        wk->head = f->next;
        if (!wk->head)
            wk->tail = NULL;
    }
    pthread_mutex_unlock(&wk->mu);
    return f;
}

/* ---- the rank's thread-local state ------------------------------------------ */

/* Called at every switch: copies only what differs (tags and messages
 * rarely change between two switches). */
static void tls_load(const fib *f)
{
    par_alloc_scope_enter(f->alloc_scope);
    par_counts_set(f->counts);
    if (strcmp(par_log_thread_tag(), f->tag))
        par_log_set_thread_tag(f->tag);
    if (f->err && f->err[0])
        par_set_last_error(f->err);
    else if (par_last_error()[0])
        par_clear_error();
}

/* The scope is left first, so the message buffer below is the backend's
 * memory, charged to no rank (a threads rank has no such buffer). */
static void tls_save(fib *f)
{
    f->alloc_scope = par_alloc_scope_enter(0);
    f->counts = par_counts_get();
    const char *tag = par_log_thread_tag();
    if (strcmp(f->tag, tag))
        snprintf(f->tag, sizeof f->tag, "%s", tag);
    const char *e = par_last_error();
    if (e[0] && !f->err)
        f->err = par_malloc(ERR_CAP, PAR_TAG_COMM);
    if (f->err && strcmp(f->err, e))
        snprintf(f->err, ERR_CAP, "%s", e); /* without memory: the message is lost */
}

/* ---- waking and parking ---------------------------------------------------- */

static int wake_fib(fib *f)
{
    atomic_store(&f->permit, 1);
    int parked = FIB_PARKED;
    if (!atomic_compare_exchange_strong(&f->state, &parked, FIB_READY))
        return 0; /* running or queued: it will see the permit */
    push(f->wk, f);
    return 1;
}

void fsched_wake(fsched *s, int r)
{
    if (r >= 0 && r < s->n && wake_fib(&s->fibs[r]))
        atomic_fetch_add_explicit(&s->fibs[r].wk->wakes, 1, memory_order_relaxed);
}

static void to_home(fsched *s, fib *f)
{
    fctx_switch(s->o.kind, &f->ctx, &f->wk->home, 0);
}

void *fsched_user(const fsched *s) { return s->o.user; }

int fsched_self(const fsched *s)
{
    fworker *wk = tl_wk;
    return wk && wk->s == s && wk->cur ? wk->cur->rank : -1;
}

fsched *fsched_current(void)
{
    fworker *wk = tl_wk;
    return wk && wk->cur ? wk->s : NULL;
}

void fsched_yield(fsched *s)
{
    fworker *wk = tl_wk;
    fib *f = wk ? wk->cur : NULL;
    if (!f || wk->s != s)
        return;
    wk->yields++;
    atomic_store(&f->state, FIB_READY);
    push(wk, f);
    to_home(s, f);
}

void fsched_park(fsched *s, double until)
{
    fworker *wk = tl_wk;
    fib *f = wk ? wk->cur : NULL;
    if (!f || wk->s != s)
        return;
    if (atomic_exchange(&f->permit, 0))
        return;
    if (s->o.stop && s->o.stop(s->o.stop_ud)) {
        fsched_yield(s);
        return;
    }
    f->wake_at = until;
    atomic_store(&f->state, FIB_PARKED);
    /* a wake between the exchange above and the store would be lost */
    if (atomic_load(&f->permit)) {
        int parked = FIB_PARKED;
        if (atomic_compare_exchange_strong(&f->state, &parked, FIB_RUNNING)) {
            atomic_store(&f->permit, 0);
            return;
        } /* else a waker queued it already: leave and come back from the queue */
    }
    wk->parks++;
    to_home(s, f);
    atomic_store(&f->permit, 0);
}

/* Wakes this worker's fibers that are past their deadline, or all parked
 * ones once the world failed. */
static void sweep(fworker *wk, double now)
{
    fsched *s = wk->s;
    wk->next_sweep = now + SWEEP_S;
    int stop = s->o.stop && s->o.stop(s->o.stop_ud);
    for (int r = wk->id; r < s->n; r += s->nw) {
        fib *f = &s->fibs[r];
        if (atomic_load_explicit(&f->state, memory_order_relaxed) != FIB_PARKED)
            continue;
        if (stop || (f->wake_at > 0 && now >= f->wake_at))
            wake_fib(f);
    }
}

/* ---- the fibers' life ------------------------------------------------------- */

static void fib_entry(void)
{
    fworker *wk = tl_wk;
    fib *f = wk->cur;
    fctx_started(&wk->home);
    wk->s->body(wk->s->ud, f->rank);
    atomic_store(&f->state, FIB_DONE);
    fctx_switch(wk->s->o.kind, &f->ctx, &wk->home, 1);
    __builtin_unreachable();
}

static void run_fib(fworker *wk, fib *f)
{
    tls_load(f);
    wk->cur = f;
    atomic_store(&f->state, FIB_RUNNING);
    wk->switches++;
    fctx_switch(wk->s->o.kind, &wk->home, &f->ctx, 0);
    wk->cur = NULL;
    tls_save(f);
    if (atomic_load(&f->state) == FIB_DONE) {
        f->used = fctx_used(&f->ctx);
        f->resident = fctx_resident(&f->ctx);
        fctx_free(&f->ctx); /* a returned rank gives its stack back at once */
        wk->live--;
    }
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Nothing to run: poll for a push (a wake from another worker) a little,
 * then yield the core for up to IDLE_YIELD_S, then sleep on the cv until
 * the next sweep.  The polling keeps a wake from another worker at a few
 * microseconds instead of a futex wake-up's tens. */
static void idle(fworker *wk)
{
    unsigned seen = atomic_load_explicit(&wk->pushes, memory_order_acquire);
    double now = par__now();
    if (now >= wk->next_sweep)
        sweep(wk, now);
    for (int i = 0; i < IDLE_SPIN; i++) {
        if (atomic_load_explicit(&wk->pushes, memory_order_acquire) != seen)
            return;
        cpu_relax();
    }
    double yield_until = now + IDLE_YIELD_S;
    while ((now = par__now()) < yield_until && now < wk->next_sweep) {
        if (atomic_load_explicit(&wk->pushes, memory_order_acquire) != seen)
            return;
        sched_yield();
    }
    pthread_mutex_lock(&wk->mu);
    if (!wk->head) {
        double until = wk->next_sweep;
        struct timespec ts = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
        wk->sleeping = 1;
        pthread_cond_timedwait(&wk->cv, &wk->mu, &ts); /* the cv runs on CLOCK_MONOTONIC */
        wk->sleeping = 0;
    }
    pthread_mutex_unlock(&wk->mu);
}

/* Nothing to run and a poll hook: poll until a fiber of this worker is
 * queued (by the hook, a sweep or another worker), backing off as the
 * constants at the top say while the polls find nothing.  A poll that moved
 * anything starts the back-off again. */
static void idle_poll(fworker *wk)
{
    fsched *s = wk->s;
    unsigned seen = atomic_load_explicit(&wk->pushes, memory_order_acquire);
    double moved = par__now();
    for (unsigned k = 0, naps = 0;; k++) {
        double now = par__now();
        if (now >= wk->next_sweep)
            sweep(wk, now);
        wk->polls++;
        if (s->o.poll(s->o.user)) {
            k = naps = 0;
            moved = now;
        }
        if (atomic_load_explicit(&wk->pushes, memory_order_acquire) != seen)
            return;
        if (k < POLL_SPIN) {
            cpu_relax();
        } else if (now - moved < POLL_YIELD_S) {
            sched_yield();
        } else {
            long us = (long)++naps * IDLE_NAP_STEP_US;
            struct timespec ts = {0, (us < IDLE_NAP_MAX_US ? us : IDLE_NAP_MAX_US) * 1000L};
            wk->naps++;
            nanosleep(&ts, NULL);
        }
    }
}

static void worker_loop(fworker *wk)
{
    wk->next_sweep = par__now() + SWEEP_S;
    fsched *s = wk->s;
    while (wk->live > 0) {
        fib *f = pop(wk);
        if (!f) {
            if (s->o.poll)
                idle_poll(wk);
            else
                idle(wk);
            continue;
        }
        run_fib(wk, f);
        if (s->o.poll && wk->live > 0 && wk->picks % POLL_EVERY == POLL_EVERY - 1) {
            wk->polls++;
            s->o.poll(s->o.user);
        }
        if ((++wk->picks & 31u) == 0) {
            double now = par__now();
            if (now >= wk->next_sweep)
                sweep(wk, now);
        }
    }
}

/* ---- stack overflow: a fault in a guard names the rank ---------------------- */

static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static int fault_users;
static struct sigaction old_segv, old_bus;

static size_t put(char *buf, size_t at, size_t cap, const char *s)
{
    while (*s && at + 1 < cap)
        buf[at++] = *s++;
    return at;
}

static size_t put_num(char *buf, size_t at, size_t cap, unsigned long long v)
{
    char d[24];
    int k = 0;
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k && at + 1 < cap)
        buf[at++] = d[--k];
    return at;
}

/* Async-signal-safe: formats by hand, write(2), then dies with the signal. */
static void on_fault(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    fworker *wk = tl_wk;
    fib *f = wk ? wk->cur : NULL;
    if (f && fctx_in_guard(&f->ctx, si->si_addr)) {
        char m[320];
        size_t k = put(m, 0, sizeof m, "parity: error: fiber backend: rank ");
        k = put_num(m, k, sizeof m, (unsigned long long)f->rank);
        k = put(m, k, sizeof m, " overflowed its stack of ");
        k = put_num(m, k, sizeof m, (unsigned long long)((f->ctx.hi - f->ctx.lo) >> 10));
        k = put(m, k, sizeof m, " KiB (it ran into the guard pages below it); give the ranks "
                                "bigger stacks: PARITY_FIBER_STACK=1M (or "
                                "par_world_opts.stack_bytes)\n");
        ssize_t wr = write(STDERR_FILENO, m, k);
        (void)wr;
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    /* not ours: put the previous handler back; the fault repeats under it */
    sigaction(sig, sig == SIGBUS ? &old_bus : &old_segv, NULL);
}

static void fault_install(void)
{
    pthread_mutex_lock(&fault_mu);
    if (fault_users++ == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &old_segv);
        sigaction(SIGBUS, &sa, &old_bus);
    }
    pthread_mutex_unlock(&fault_mu);
}

static void fault_remove(void)
{
    pthread_mutex_lock(&fault_mu);
    if (--fault_users == 0) {
        sigaction(SIGSEGV, &old_segv, NULL);
        sigaction(SIGBUS, &old_bus, NULL);
    }
    pthread_mutex_unlock(&fault_mu);
}

/* ---- workers ---------------------------------------------------------------- */

/* On worker thread `id` (an OpenMP thread; the caller's thread is 0).
 * Kernels' OpenMP regions inside a rank run on this thread alone: nested
 * regions are inactive under the workers' region, and nthreads-var 1 makes
 * that hold with a single worker too. */
static void worker_thread(fsched *s, int id)
{
    fworker *wk = &s->wk[id];
    fib mine; /* this thread's own thread-local state, put back at the end */
    memset(&mine, 0, sizeof mine);
    tls_save(&mine);
    stack_t ss = {.ss_sp = s->alt + (size_t)id * ALTSTACK, .ss_size = ALTSTACK}, old_ss;
    int alt = sigaltstack(&ss, &old_ss) == 0;
    omp_set_num_threads(1);
    fworker *outer = tl_wk; /* a world started from a rank of another fiber world */
    tl_wk = wk;
    worker_loop(wk);
    tl_wk = outer;
    if (alt)
        sigaltstack(&old_ss, NULL);
    tls_load(&mine);
    par_free(mine.err);
}

/* Fiber r goes to worker r % nw; the queues start in rank order. */
static void assign(fsched *s, int nw)
{
    s->nw = nw;
    for (int w = 0; w < nw; w++)
        s->wk[w].live = 0;
    for (int r = 0; r < s->n; r++) {
        fib *f = &s->fibs[r];
        f->wk = &s->wk[r % nw];
        f->wk->live++;
        atomic_store(&f->state, FIB_READY);
        push(f->wk, f);
    }
}

par_status fsched_run(fsched *s, void (*body)(void *ud, int r), void *ud)
{
    int want = s->o.workers < s->n ? s->o.workers : s->n;
    if (omp_get_thread_limit() < want)
        want = omp_get_thread_limit();
    s->body = body;
    s->ud = ud;
    fault_install();
    int dyn = omp_get_dynamic();
    omp_set_dynamic(0);
#pragma omp parallel num_threads(want)
    {
        /* inside another parallel region OpenMP may give fewer threads:
         * the fibers are shared over the ones it gave */
#pragma omp single
        assign(s, omp_get_num_threads());
        /* implicit barrier: every queue is filled */
        worker_thread(s, omp_get_thread_num());
    }
    omp_set_dynamic(dyn);
    fault_remove();
    return PAR_OK;
}

/* ---- creation --------------------------------------------------------------- */

void fsched_free(fsched *s)
{
    if (!s)
        return;
    for (int r = 0; s->fibs && r < s->n; r++) {
        fctx_free(&s->fibs[r].ctx);
        par_free(s->fibs[r].err);
    }
    for (int w = 0; s->wk && w < s->o.workers; w++) {
        fctx_free(&s->wk[w].home);
        pthread_mutex_destroy(&s->wk[w].mu);
        pthread_cond_destroy(&s->wk[w].cv);
    }
    par_free(s->alt);
    par_free(s->fibs);
    par_free(s->wk);
    par_free(s);
}

static par_status workers_new(fsched *s)
{
    int nw = s->o.workers;
    s->wk = par_calloc((size_t)nw, sizeof *s->wk, PAR_TAG_COMM);
    s->alt = par_malloc((size_t)nw * ALTSTACK, PAR_TAG_COMM);
    if (!s->wk || !s->alt) {
        s->o.workers = 0; /* nothing to destroy */
        return par_err(PAR_ENOMEM, "fiber: no memory for %d workers", nw);
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    par_status st = PAR_OK;
    for (int w = 0; w < nw; w++) {
        fworker *wk = &s->wk[w];
        pthread_mutex_init(&wk->mu, NULL);
        pthread_cond_init(&wk->cv, &ca);
        wk->s = s;
        wk->id = w;
        if (st == PAR_OK)
            st = fctx_thread(&wk->home, s->o.kind);
    }
    pthread_condattr_destroy(&ca);
    return st;
}

par_status fsched_new(int n, const fsched_opts *o, fsched **out)
{
    fsched *s = par_calloc(1, sizeof *s, PAR_TAG_COMM);
    if (!s)
        return par_err(PAR_ENOMEM, "fiber: no memory for a world of %d ranks", n);
    s->n = n;
    s->o = *o;
    if (s->o.workers < 1)
        s->o.workers = 1;
    par_status st = workers_new(s);
    if (st == PAR_OK && !(s->fibs = par_calloc((size_t)n, sizeof *s->fibs, PAR_TAG_COMM)))
        st = par_err(PAR_ENOMEM, "fiber: no memory for %d ranks", n);
    for (int r = 0; st == PAR_OK && r < n; r++) {
        s->fibs[r].rank = r;
        st = fctx_make(&s->fibs[r].ctx, s->o.kind, s->o.stack, s->o.guard, fib_entry);
    }
    if (st != PAR_OK) {
        fsched_free(s);
        return st;
    }
    *out = s;
    return PAR_OK;
}

void fsched_get_stats(const fsched *s, fsched_stats *out)
{
    memset(out, 0, sizeof *out);
    out->workers = s->nw;
    out->stack_max_rank = -1;
    for (int w = 0; w < s->nw; w++) {
        out->switches += s->wk[w].switches;
        out->wakes += atomic_load(&s->wk[w].wakes);
        out->parks += s->wk[w].parks;
        out->yields += s->wk[w].yields;
        out->polls += s->wk[w].polls;
        out->naps += s->wk[w].naps;
    }
    out->heap = sizeof *s + (size_t)s->n * sizeof *s->fibs +
                (size_t)s->o.workers * (sizeof *s->wk + ALTSTACK);
    for (int r = 0; r < s->n; r++) {
        out->stack_sum += s->fibs[r].used;
        out->stack_res += s->fibs[r].resident;
        if (s->fibs[r].err)
            out->heap += ERR_CAP;
        if (s->o.kind == FCTX_UCONTEXT)
            out->heap += sizeof(ucontext_t);
        if (s->fibs[r].used > out->stack_max || out->stack_max_rank < 0) {
            out->stack_max = s->fibs[r].used;
            out->stack_max_rank = r;
        }
    }
}
