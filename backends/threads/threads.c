/* backends/threads/threads.c - every rank an OpenMP thread of this process.
 *
 * A group's shared state is one array of slots (one per member, each on its
 * own cache lines) and one 64-bit word holding (generation << 24 | arrived).
 * An exchange is
 *   1. publish: write my call metadata and my transfer description (the
 *      pointers of par__xfer) into my slot;
 *   2. arrive: add me to the word; the last arrival starts the next
 *      generation; the others wait for it (spin, then yield, then sleep);
 *   3. check: every member compares all metadata (the same verdict on every
 *      rank) and the sizes of the pairs it receives;
 *   4. copy: each rank copies what it receives straight from the senders'
 *      buffers (no intermediate copy);
 *   5. arrive again, so no sender's buffer is reused while a peer reads it.
 * A barrier is steps 1-3.  Metadata is double-buffered by the parity of the
 * generation so a barrier needs one arrival only.  A rank that stops waiting
 * (timeout, failed world) withdraws its arrival with a compare-and-swap on
 * the same word, so a late rank never completes a round with a peer that
 * already left.  The rendezvous (slots, word, arrive) lives in tsync.h, which
 * the MPI backend shares for the ranks of one process.
 */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "backends/host/tsync.h"
#include "comm/backend.h"
#include "core/alloc.h"
#include "core/device.h"
#include "core/hostlim.h"

/* One rank's handle: the shared group and the generation it has reached. */
typedef struct {
    tgroup *g;
    uint64_t gen;
} tcomm;

static par_status arrive(par_comm *c, tcomm *tc, int ignore_abort, const par__callmeta *m)
{
    return tsync_arrive(c, tc->g, c->rank, &tc->gen, ignore_abort, m, NULL, NULL);
}

static par_status t_exchange(par_comm *c, const par__callmeta *m, const par__xfer *x)
{
    tcomm *tc = c->bgroup;
    tgroup *g = tc->g;
    int me = c->rank, p = c->size;
    tslot *s = &g->slots[me];
    uint64_t target = tc->gen + 1;
    s->meta[target & 1] = *m;
    s->x = x;
    par_status st = arrive(c, tc, 0, m);
    if (st != PAR_OK)
        return st;
    st = par__check_metas(c, &g->slots[0].meta[target & 1], sizeof(tslot));
    if (st != PAR_OK)
        return st; /* every member saw the same metas: nobody copies */
    if (par__xfer_empty(x))
        return PAR_OK; /* no data anywhere (the metas agree on that) */

    /* Pairs first: what each peer sends me against what I expect. */
    for (int j = 0; j < p && st == PAR_OK && !x->fixed; j++) {
        size_t sent = par__col_at(&g->slots[j].x->sbytes, me);
        size_t want = par__col_at(&x->rbytes, j);
        if (sent != want)
            st = par__pair_mismatch(c, m, j, me, sent, want);
    }
    if (st == PAR_OK && x->rbytes.kind != PAR__COL_ZERO) {
        for (int k = 0; k < p; k++) {
            int j = (me + k) % p; /* spread the readers over the senders */
            size_t rb = par__col_at(&x->rbytes, j);
            if (!rb)
                continue;
            const par__xfer *xj = g->slots[j].x;
            const char *src = xj->sbase + par__col_at(&xj->soff, me);
            char *dst = x->rbase + par__col_at(&x->roff, j);
            if (src != dst)
                par_dev_comm_copy(dst, src, rb); /* memcpy, or device to device (core/device.h) */
        }
    }
    /* Nobody leaves before all copies are done, even if the world failed. */
    par_status st2 = arrive(c, tc, 1, m);
    return st != PAR_OK ? st : st2;
}

static par_status t_split(par_comm *parent, const par__splitplan *plan, void **bgroup)
{
    tcomm *tc = parent->bgroup;
    tgroup *g = tc->g;
    tgroup *ng = NULL;
    tcomm *nt = NULL;
    int member = plan->color >= 0;
    if (member && plan->leader == parent->rank)
        ng = tsync_group_new(plan->size, plan->size, 0); /* NULL: members see it and fail */
    if (member)
        nt = par_calloc(1, sizeof *nt, PAR_TAG_COMM);
    g->slots[parent->rank].split = ng;
    par__callmeta m = {.group_id = parent->id, .seq = parent->seq, .op = PAR__OP_SPLIT,
                       .dtype = PAR_C_I32, .count = 2, .redop = -1, .root = -1, .phase = 1,
                       .rank = parent->rank};
    par_status st = arrive(parent, tc, 0, &m);
    if (st != PAR_OK) { /* the round did not complete: nobody read ng */
        tsync_group_destroy(ng);
        par_free(nt);
        return st;
    }
    if (!member) {
        *bgroup = NULL;
        return PAR_OK;
    }
    /* The leader's slot is rewritten only at its next split, after a round
     * that needs this rank's arrival, so it is stable until we return. */
    tgroup *shared = g->slots[plan->leader].split;
    if (!shared || !nt) {
        if (shared)
            tsync_group_unref(shared);
        par_free(nt);
        return par_err(PAR_ENOMEM, "threads: no memory for group of %d ranks split from %s",
                       plan->size, par_comm_name(parent));
    }
    nt->g = shared;
    *bgroup = nt;
    return PAR_OK;
}

static void t_group_free(par_comm *c, void *bgroup)
{
    (void)c;
    tcomm *tc = bgroup;
    if (!tc)
        return;
    tsync_group_unref(tc->g);
    par_free(tc);
}

static par_status t_world_init(par__world *w, void **bworld)
{
    int n = par__world_size(w);
    if (n >= (int)TSYNC_CNT_MASK)
        return par_err(PAR_EINVAL, "threads: %d ranks exceed the limit of %d", n,
                       (int)TSYNC_CNT_MASK);
    tgroup *g = tsync_group_new(n, 1, 0); /* the world holds one reference until finalize */
    if (!g)
        return par_err(PAR_ENOMEM, "threads: no memory for a world of %d ranks", n);
    *bworld = g;
    return PAR_OK;
}

static void t_world_finalize(par__world *w, void *bworld)
{
    (void)w;
    tsync_group_unref(bworld);
}

static par_status t_group_world(par__world *w, void *bworld, int rank, void **bgroup)
{
    (void)w, (void)rank;
    tcomm *tc = par_calloc(1, sizeof *tc, PAR_TAG_COMM);
    if (!tc)
        return par_err(PAR_ENOMEM, "threads: no memory for rank %d's world handle", rank);
    tc->g = bworld;
    atomic_fetch_add(&tc->g->refs, 1);
    *bgroup = tc;
    return PAR_OK;
}

/* Ranks are the threads of one OpenMP parallel region (the caller's thread
 * is rank 0).  Dynamic adjustment is switched off for the region so OpenMP
 * gives exactly n threads or the launch fails. */
static par_status t_launch(par__world *w, void *bworld, par__rank_main main_fn)
{
    (void)bworld;
    int n = par__world_size(w);
    if (omp_get_thread_limit() < n)
        return par_err(PAR_EUNSUPPORTED,
                       "threads: %d ranks exceed OpenMP's thread limit %d (OMP_THREAD_LIMIT)", n,
                       omp_get_thread_limit());
    /* under ulimit -v: a thread, stack or BLAS buffer that cannot be mapped
     * would hang OpenBLAS or kill the process in libgomp; refuse first */
    par_status st = par_hostlim_threads_fit("threads", n, par_hostlim_thread_stack(1), 0);
    if (st)
        return st;
    int dyn = omp_get_dynamic();
    omp_set_dynamic(0);
    int got = 0;
#pragma omp parallel num_threads(n) shared(got)
    {
#pragma omp single
        got = omp_get_num_threads();
        /* implicit barrier of single: every thread sees got */
        if (got == n)
            main_fn(w, omp_get_thread_num());
    }
    omp_set_dynamic(dyn);
    if (got != n)
        return par_err(PAR_EUNSUPPORTED,
                       "threads: OpenMP gave %d threads for %d ranks (nested parallel region?)",
                       got, n);
    return PAR_OK;
}

const par_backend par_backend_threads = {
    .name = "threads",
    .summary = "every rank an OpenMP thread of this process (shared-memory exchanges)",
    .max_ranks = 0,
    .world_init = t_world_init,
    .world_finalize = t_world_finalize,
    .launch = t_launch,
    .group_world = t_group_world,
    .group_split = t_split,
    .group_free = t_group_free,
    .exchange = t_exchange,
    .dev_copies = 1,
};
