/* backends/host/tsync.h - the shared-memory rendezvous of the threads
 * backend, reused by the MPI backend for the ranks one process hosts.
 *
 * A group's (or, under MPI, a group's local members') shared state is one
 * array of slots (one per member, each on its own cache lines) and one
 * 64-bit word holding (generation << 24 | arrived).  tsync_arrive adds the
 * caller to the word; the last arrival starts the next generation and wakes
 * the sleepers (a futex on the low 32 bits of the generation); the others
 * wait: spin, then yield, then futex waits of at most 10 ms (comm's
 * par__waiter).  A rank that stops waiting (timeout, failed world) withdraws
 * its arrival with a compare-and-swap on the same word unless the round
 * already completed, so a late rank never completes a round with a peer that
 * already left.
 *
 * Slots are indexed 0..p-1; `slot_rank` maps a slot to the group rank that
 * reports name (NULL: the slot is the group rank).  When the members are
 * fibers (`fs` set: the MPI backend's fiber-hosted ranks) a waiting member
 * parks (comm's rank_wait) and the last arrival wakes the others' fibers
 * (`slot_fiber`: each slot's fiber in fs).  `ext` is the owner's per-group
 * state, freed with the group by ext_free.  Everything here is static
 * inline: the header is included by threads.c and mpi.c.
 */
#ifndef PAR_BACKENDS_HOST_TSYNC_H
#define PAR_BACKENDS_HOST_TSYNC_H

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "backends/host/sched.h"
#include "comm/backend.h"
#include "core/alloc.h"

#define TSYNC_CNT_BITS 24
#define TSYNC_CNT_MASK ((UINT64_C(1) << TSYNC_CNT_BITS) - 1)

typedef struct {
    _Alignas(64) par__callmeta meta[2];
    const par__xfer *x;
    void *split;                 /* a new group's state, published by its leader */
    _Atomic uint64_t arrived;    /* last generation this rank arrived at         */
} tslot;

typedef struct {
    _Alignas(64) _Atomic uint64_t word;
    _Alignas(64) _Atomic uint32_t gen32;    /* low bits of the generation: futex  */
    _Atomic int sleepers;                   /* ranks blocked (or about to) on it  */
    _Alignas(64) _Atomic int refs;
    int p;
    tslot *slots;
    int *slot_rank;                         /* [p] group rank of each slot, or NULL */
    fsched *fs;                             /* members are fibers of fs (NULL: threads) */
    int *slot_fiber;                        /* [p] with fs: each slot's fiber         */
    void *ext;                              /* the owner's (NULL: none)               */
    void (*ext_free)(void *ext);
} tgroup;

/* A group of p slots holding `refs` references; with_ranks allocates
 * slot_rank and slot_fiber (filled by the caller). */
static inline tgroup *tsync_group_new(int p, int refs, int with_ranks)
{
    tgroup *g = par_calloc(1, sizeof *g, PAR_TAG_COMM);
    if (!g)
        return NULL;
    g->slots = par_calloc((size_t)p, sizeof *g->slots, PAR_TAG_COMM);
    if (with_ranks) {
        g->slot_rank = par_calloc((size_t)p, sizeof *g->slot_rank, PAR_TAG_COMM);
        g->slot_fiber = par_calloc((size_t)p, sizeof *g->slot_fiber, PAR_TAG_COMM);
    }
    if (!g->slots || (with_ranks && (!g->slot_rank || !g->slot_fiber))) {
        par_free(g->slots);
        par_free(g->slot_rank);
        par_free(g->slot_fiber);
        par_free(g);
        return NULL;
    }
    g->p = p;
    atomic_init(&g->refs, refs);
    atomic_init(&g->word, 0);
    return g;
}

static inline void tsync_group_destroy(tgroup *g)
{
    if (g) {
        if (g->ext_free)
            g->ext_free(g->ext);
        par_free(g->slots);
        par_free(g->slot_rank);
        par_free(g->slot_fiber);
        par_free(g);
    }
}

static inline void tsync_group_unref(tgroup *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1)
        tsync_group_destroy(g);
}

/* Blocking after the spin/yield phase: a futex on gen32 that the last
 * arrival of a round wakes (elsewhere: a short sleep).  `poll`, when set,
 * runs before each block (the MPI backend makes progress there). */
typedef struct {
    tgroup *g;
    uint32_t seen;
    void (*poll)(void *ctx);
    void *poll_ctx;
} tsync_block;

static inline void tsync_block_on_gen(void *ctx, double max_s)
{
    tsync_block *b = ctx;
    if (b->poll)
        b->poll(b->poll_ctx);
    struct timespec ts = {(time_t)max_s, (long)((max_s - (double)(time_t)max_s) * 1e9)};
#ifdef __linux__
    atomic_fetch_add(&b->g->sleepers, 1);
    if (atomic_load(&b->g->gen32) == b->seen)
        syscall(SYS_futex, (uint32_t *)&b->g->gen32, FUTEX_WAIT_PRIVATE, b->seen, &ts, NULL, 0);
    atomic_fetch_sub(&b->g->sleepers, 1);
#else
    (void)ts;
    struct timespec nap = {0, 100000};
    nanosleep(&nap, NULL);
#endif
}

static inline void tsync_wake_all(tgroup *g, uint64_t gen)
{
    /* monotonic even when a later round's last arrival got here first */
    uint32_t cur = atomic_load(&g->gen32), want = (uint32_t)gen;
    while ((int32_t)(want - cur) > 0 && !atomic_compare_exchange_weak(&g->gen32, &cur, want))
        ;
#ifdef __linux__
    if (atomic_load(&g->sleepers) > 0)
        syscall(SYS_futex, (uint32_t *)&g->gen32, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
}

/* The last arrival (slot `me`) wakes the other members' fibers, parked or
 * about to park (a wake is a permit: none is lost). */
static inline void tsync_wake_fibers(tgroup *g, int me)
{
    for (int j = 0; g->fs && j < g->p; j++)
        if (j != me)
            fsched_wake(g->fs, g->slot_fiber[j]);
}

/* Slot `slot` of g (the caller, rank c->rank of group c) arrives at
 * generation *gen + 1 and waits for every slot.  On a failed wait the
 * arrival is withdrawn (unless the round completed meanwhile) and the error
 * raised with the missing ranks (group ranks through g->slot_rank). */
static inline par_status tsync_arrive(par_comm *c, tgroup *g, int slot, uint64_t *gen,
                                      int ignore_abort, const par__callmeta *m,
                                      void (*poll)(void *ctx), void *poll_ctx)
{
    uint64_t target = *gen + 1;
    atomic_store_explicit(&g->slots[slot].arrived, target, memory_order_relaxed);
    uint64_t w = atomic_load(&g->word), nw;
    do {
        nw = (w & TSYNC_CNT_MASK) + 1 == (uint64_t)g->p ? target << TSYNC_CNT_BITS : w + 1;
    } while (!atomic_compare_exchange_weak(&g->word, &w, nw));
    *gen = target;
    if ((nw >> TSYNC_CNT_BITS) == target) {
        tsync_wake_all(g, target);
        tsync_wake_fibers(g, slot);
        return PAR_OK;
    }

    par__waiter wt;
    tsync_block tb = {g, (uint32_t)(target - 1), poll, poll_ctx};
    par__wait_start(&wt, c->world, ignore_abort);
    wt.block = tsync_block_on_gen;
    wt.block_ctx = &tb;
    for (;;) {
        if ((atomic_load_explicit(&g->word, memory_order_acquire) >> TSYNC_CNT_BITS) >= target)
            return PAR_OK;
        par_status st = par__wait_poll(&wt, c->world);
        if (st == PAR_OK)
            continue;
        w = atomic_load(&g->word);
        do {
            if ((w >> TSYNC_CNT_BITS) >= target)
                return PAR_OK; /* completed meanwhile */
        } while (!atomic_compare_exchange_weak(&g->word, &w, w - 1));
        *gen = target - 1;
        /* slots[me].arrived stays: reports of ranks stopping after me name
         * only the ranks that never came */

        int *missing = par_malloc((size_t)g->p * sizeof *missing, PAR_TAG_COMM), nmissing = 0;
        for (int j = 0; j < g->p && missing; j++)
            if (j != slot && atomic_load_explicit(&g->slots[j].arrived,
                                                  memory_order_relaxed) < target)
                missing[nmissing++] = g->slot_rank ? g->slot_rank[j] : j;
        char what[240];
        par__meta_describe(m, par_comm_name(c), what, sizeof what);
        size_t k = strlen(what);
        snprintf(what + k, sizeof what - k, ", %d of %d ranks arrived", g->p - nmissing, g->p);
        st = par__wait_failed(c, st, what, missing, nmissing);
        par_free(missing);
        return st;
    }
}

#endif
