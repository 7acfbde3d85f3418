/* backends/host/sched.h - ranks as fibers on a few worker threads.
 *
 * Every rank is a fiber (fctx.h) pinned to one worker thread (rank r to
 * worker r % W): a fiber never moves, so thread-local state that the
 * compiler may cache across a switch stays right.  A worker runs the fibers
 * of its run queue in order; a fiber runs until it parks (waits), yields or
 * returns, and then the worker takes the next one.  Waking is by permit
 * (like a binary semaphore): fsched_wake(r) from any thread sets rank r's
 * permit and, if r is parked, queues it on its worker; fsched_park returns
 * at once when the permit is set.  So a waiter checks its condition, parks,
 * and checks again, and a waker sets the condition before it wakes: no wake
 * is lost, and early wakes are harmless.
 *
 * Each worker also wakes its parked fibers whose deadline passed and, once
 * stop() says the world failed, all of them (every 10 ms while it has
 * nothing to run, or every 32 switches).  A rank that computes or sleeps in
 * a system call holds its worker: the other fibers of that worker wait.
 *
 * What a fiber waits for may lie outside the process (an MPI request): then
 * the owner gives a poll() hook, which tests what the parked fibers wait for
 * and wakes exactly those whose wait can end.  A worker with nothing to run
 * calls it in a loop (spinning a few times, then sched_yield for up to 1 ms
 * after it went idle or last saw progress, then naps that
 * grow to IDLE_NAP_MAX_US: MPI cannot wake a sleeping thread), and one with
 * fibers to run calls it every POLL_EVERY fibers it ran.
 *
 * The thread-local state of src/core that belongs to a rank (work counters
 * of the virtual clock, the allocator's accounting scope, the last error
 * message, the log tag) is saved when a fiber leaves its thread and loaded
 * when it comes back.  Every _Thread_local of src/ is one of these four or
 * a scratch buffer used between two switches (pplayout.c's parser and
 * result, copied out before the function returns; no comm call inside).
 */
#ifndef PAR_BACKENDS_HOST_SCHED_H
#define PAR_BACKENDS_HOST_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "backends/host/fctx.h"
#include "comm/comm.h"
#include "core/status.h"

typedef struct fsched fsched;

typedef struct {
    int workers;          /* >= 1                                        */
    size_t stack, guard;  /* bytes per fiber                             */
    fctx_kind kind;
    int (*stop)(void *ud);/* nonzero once the world failed (may be NULL) */
    void *stop_ud;
    void *user;           /* the owner's, for fsched_user (may be NULL)  */
    /* Progress on what parked fibers wait for outside the scheduler (may be
     * NULL): called with `user` on a worker thread (never on a fiber), from
     * several workers at once when there are several; wakes the fibers whose
     * wait can end (fsched_wake) and returns nonzero when anything moved. */
    int (*poll)(void *user);
} fsched_opts;

/* The options of a world of n ranks from par_world_opts and the
 * environment, the fiber backend's rules (docs/comm.md "The fiber
 * backend"): workers = wo->workers, else PARITY_FIBER_WORKERS, else the
 * online cores shared by `procs` processes on this host (at least 1, at
 * most n); stack = wo->stack_bytes, else PARITY_FIBER_STACK, else 256 KiB;
 * guard 64 KiB; the switch from PARITY_FIBER_SWITCH (asm where available).
 * A bad PARITY_FIBER_SWITCH, PARITY_FIBER_WORKERS (not in 1..min(4096,
 * OpenBLAS's MAX_THREADS, ulimit -u)) or PARITY_FIBER_STACK (malformed,
 * below 64 KiB, above the machine's memory, n stacks above 64 TiB) is
 * PAR_EINVAL naming the numbers; workers and stacks that do not fit the
 * address-space limit are PAR_ENOMEM (core/hostlim.h).  stop / user are left
 * NULL. */
par_status fsched_opts_from(const par_world_opts *wo, int n, int procs, fsched_opts *out);

typedef struct {
    int workers;          /* threads that ran fibers                     */
    uint64_t switches;    /* switches into fibers, all workers           */
    uint64_t wakes;       /* parked fibers queued again by a wake        */
    uint64_t parks;       /* fibers that parked (left their worker asleep) */
    uint64_t yields;      /* fibers that yielded (stayed runnable)       */
    uint64_t polls;       /* calls of opts.poll                          */
    uint64_t naps;        /* idle naps of the workers (poll hook only)   */
    size_t stack_max;     /* deepest stack use of any fiber (bytes)      */
    int stack_max_rank;
    size_t stack_sum;     /* stack high-water marks, all fibers (bytes)  */
    size_t stack_res;     /* stack pages resident, all fibers (bytes)    */
    size_t heap;          /* the scheduler's own allocations (bytes)     */
} fsched_stats;

/* n fibers with their stacks (mapped now: a failure is PAR_ENOMEM here,
 * before anything runs). */
par_status fsched_new(int n, const fsched_opts *o, fsched **out);
void fsched_free(fsched *s);
/* Runs body(ud, r) on fiber r for every r on the workers (the calling
 * thread is worker 0) and returns when all returned.  Fails only when the
 * workers could not be started. */
par_status fsched_run(fsched *s, void (*body)(void *ud, int r), void *ud);
void fsched_get_stats(const fsched *s, fsched_stats *out);

/* fsched_opts.user of s. */
void *fsched_user(const fsched *s);
/* On a fiber of s: its rank; -1 on any other thread. */
int fsched_self(const fsched *s);
/* The scheduler whose fiber is running on this thread (NULL: none). */
fsched *fsched_current(void);
/* The calling fiber waits until woken or par__now() >= until (0: no
 * deadline).  Once stop() holds it only yields (waits that ignore the
 * failure must still let the other fibers finish). */
void fsched_park(fsched *s, double until);
/* The calling fiber lets the others of its worker run first. */
void fsched_yield(fsched *s);
/* Wakes rank r (from any thread, fiber or not). */
void fsched_wake(fsched *s, int r);

#endif
