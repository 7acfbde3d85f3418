/* comm/local.c - ranks of one process waiting on a word of this process
 * (par_comm_wait_local) and the store that wakes them
 * (par_comm_store_local).
 *
 * A waiter that finds the word short registers in the bucket of the word's
 * address (a list under the bucket's mutex), checks the word again, and
 * waits the way it waits in a collective: a fiber parks (the backend's
 * rank_wait) until rank_wake or its deadline; a thread spins, yields, then
 * blocks on its own futex.  The store writes the word, then, under the
 * bucket's mutex, wakes every waiter registered on that word (rank_wake for
 * a fiber, the futex for a thread).  Registration and the store's scan take
 * the same mutex, so a waiter either is on the list when the store scans it
 * or registers after the store and then sees the new value: no wake is
 * lost, and nothing looks at the word on a timer.  A failed world still
 * ends the wait: fibers through the scheduler's sweep, threads through the
 * 10 ms slices of comm's blocking waits.
 */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "comm/comm-impl.h"

typedef struct lwaiter {
    const _Atomic int64_t *word;
    par__world *w;
    int wrank;
    _Atomic uint32_t flag;        /* 1: stored since the waiter last looked */
    struct lwaiter *next, *prev;
} lwaiter;

#define NBUCKETS 64
static struct {
    pthread_mutex_t mu;
    lwaiter *head;
} buckets[NBUCKETS];
static pthread_once_t buckets_once = PTHREAD_ONCE_INIT;

static void buckets_init(void)
{
    for (int b = 0; b < NBUCKETS; b++)
        pthread_mutex_init(&buckets[b].mu, NULL);
}

static unsigned bucket_of(const void *word)
{
    pthread_once(&buckets_once, buckets_init);
    return (unsigned)(((uintptr_t)word >> 3) % NBUCKETS);
}

static void enlist(lwaiter *lw)
{
    unsigned b = bucket_of(lw->word);
    pthread_mutex_lock(&buckets[b].mu);
    lw->prev = NULL;
    lw->next = buckets[b].head;
    if (lw->next)
        lw->next->prev = lw;
    buckets[b].head = lw;
    pthread_mutex_unlock(&buckets[b].mu);
}

static void delist(lwaiter *lw)
{
    unsigned b = bucket_of(lw->word);
    pthread_mutex_lock(&buckets[b].mu);
    if (lw->prev)
        lw->prev->next = lw->next;
    else
        buckets[b].head = lw->next;
    if (lw->next)
        lw->next->prev = lw->prev;
    pthread_mutex_unlock(&buckets[b].mu);
}

static void futex_wake(_Atomic uint32_t *f)
{
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)f, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)f;
#endif
}

/* comm's blocking step for a thread waiter: its futex, at most max_s. */
static void block_on_flag(void *ctx, double max_s)
{
    lwaiter *lw = ctx;
#ifdef __linux__
    struct timespec ts = {(time_t)max_s, (long)((max_s - (double)(time_t)max_s) * 1e9)};
    if (atomic_load(&lw->flag) == 0)
        syscall(SYS_futex, (uint32_t *)&lw->flag, FUTEX_WAIT_PRIVATE, 0, &ts, NULL, 0);
#else
    (void)lw;
    (void)max_s;
    struct timespec nap = {0, 100000};
    nanosleep(&nap, NULL);
#endif
}

void par_comm_store_local(_Atomic int64_t *word, int64_t value)
{
    atomic_store_explicit(word, value, memory_order_seq_cst);
    unsigned b = bucket_of(word);
    pthread_mutex_lock(&buckets[b].mu);
    for (lwaiter *lw = buckets[b].head; lw; lw = lw->next) {
        if (lw->word != word)
            continue;
        atomic_store(&lw->flag, 1);
        if (lw->w->be->rank_wake)
            lw->w->be->rank_wake(lw->w, lw->w->bworld, lw->wrank);
        futex_wake(&lw->flag);
    }
    pthread_mutex_unlock(&buckets[b].mu);
}

par_status par_comm_wait_local(par_comm *c, const _Atomic int64_t *word, int64_t want, const char *what)
{
    if (!c || !word)
        return par_err(PAR_EINVAL, "wait local: needs a comm and a word");
    if (atomic_load_explicit(word, memory_order_acquire) >= want)
        return PAR_OK;
    par__world *w = c->world;
    lwaiter lw = {.word = word, .w = w, .wrank = c->wrank};
    atomic_init(&lw.flag, 0);
    enlist(&lw);
    par__waiter wt;
    par__wait_start(&wt, w, 0);
    wt.block = block_on_flag;
    wt.block_ctx = &lw;
    par_status st = PAR_OK;
    for (;;) {
        atomic_store(&lw.flag, 0);
        if (atomic_load_explicit(word, memory_order_seq_cst) >= want)
            break;
        if ((st = par__wait_poll(&wt, w)) != PAR_OK)
            break;
    }
    delist(&lw);
    return st == PAR_OK ? PAR_OK : par__wait_failed(c, st, what, NULL, 0);
}
