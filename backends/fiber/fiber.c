/* backends/fiber/fiber.c - every rank a fiber: thousands of ranks on a few
 * worker threads of this process.
 *
 * The idea is SimGrid's SMPI (user-level contexts switched at each
 * communication, see docs/comm.md "The fiber backend"): a rank runs on its
 * own small stack until it has to wait, then it parks and its worker thread
 * runs the next rank that can go on.  Scheduling and stacks live in
 * sched.c / fctx.c; this file is the comm interface:
 *   - groups and exchanges are the threads backend's rendezvous (one slot
 *     per member, one word generation << 24 | arrived, metadata checked by
 *     every member before any byte moves, receivers copy from the senders'
 *     buffers, a second arrival before anyone leaves), except that a rank
 *     that must wait parks instead of spinning or sleeping on a futex, and
 *     the last arrival of a round wakes the members;
 *   - point-to-point uses src/comm's mailboxes: a post that matches a
 *     waiting peer wakes it;
 *   - comm's own waits (par_wait, par_test loops) park or yield through
 *     rank_wait.
 * Collectives, reductions, metadata checks and the virtual clock are
 * src/comm's, unchanged: the bits are those of every other backend.
 */
#include <stdio.h>
#include <string.h>

#include "backends/host/sched.h"
#include "comm/backend.h"
#include "core/alloc.h"
#include "core/device.h"
#include "core/log.h"

#define CNT_BITS 24
#define CNT_MASK ((UINT64_C(1) << CNT_BITS) - 1)

typedef struct {
    _Alignas(64) par__callmeta meta[2]; /* by the parity of the generation      */
    const par__xfer *x;
    void *split;                        /* a new group, published by its leader */
    _Atomic uint64_t arrived;           /* last generation this rank arrived at */
} fslot;

typedef struct {
    _Alignas(64) _Atomic uint64_t word; /* generation << 24 | arrived            */
    _Alignas(64) _Atomic int refs;
    int p;
    fslot *slots;                       /* [p]                                   */
    int *wranks;                        /* [p] world rank of each member (NULL: the world) */
} fgroup;

typedef struct {
    fsched *s;
    par__world *w;
    fgroup *world;
    par__rank_main main;
    size_t stack;
    _Atomic size_t heap;     /* bytes of groups and handles allocated */
} fworld;

/* One rank's handle: the shared group and the generation it reached. */
typedef struct {
    fgroup *g;
    fworld *fw;
    uint64_t gen;
} fcomm;

/* ---- groups ----------------------------------------------------------------- */

static fgroup *group_new(fworld *fw, int p, int refs, int with_wranks)
{
    atomic_fetch_add_explicit(&fw->heap, sizeof(fgroup) + (size_t)p * sizeof(fslot) +
                              (with_wranks ? (size_t)p * sizeof(int) : 0), memory_order_relaxed);
    fgroup *g = par_calloc(1, sizeof *g, PAR_TAG_COMM);
    if (!g)
        return NULL;
    g->slots = par_calloc((size_t)p, sizeof *g->slots, PAR_TAG_COMM);
    if (with_wranks)
        g->wranks = par_malloc((size_t)p * sizeof *g->wranks, PAR_TAG_COMM);
    if (!g->slots || (with_wranks && !g->wranks)) {
        par_free(g->slots);
        par_free(g->wranks);
        par_free(g);
        return NULL;
    }
    g->p = p;
    atomic_init(&g->refs, refs);
    atomic_init(&g->word, 0);
    return g;
}

static void group_destroy(fgroup *g)
{
    if (g) {
        par_free(g->slots);
        par_free(g->wranks);
        par_free(g);
    }
}

static void group_unref(fgroup *g)
{
    if (g && atomic_fetch_sub(&g->refs, 1) == 1)
        group_destroy(g);
}

/* ---- the rendezvous ------------------------------------------------------------ */

/* The last arrival of a round wakes the others (parked or about to be). */
static void wake_members(fcomm *fc, int me)
{
    fgroup *g = fc->g;
    for (int j = 0; j < g->p; j++)
        if (j != me)
            fsched_wake(fc->fw->s, g->wranks ? g->wranks[j] : j);
}

/* The caller withdrew from round `target` (timeout, failed world): the
 * error, naming the members that never came. */
static par_status arrive_failed(par_comm *c, fgroup *g, uint64_t target, par_status st,
                                const par__callmeta *m)
{
    int *missing = par_malloc((size_t)g->p * sizeof *missing, PAR_TAG_COMM), nmissing = 0;
    for (int j = 0; j < g->p && missing; j++)
        if (j != c->rank &&
            atomic_load_explicit(&g->slots[j].arrived, memory_order_relaxed) < target)
            missing[nmissing++] = j;
    char what[240];
    par__meta_describe(m, par_comm_name(c), what, sizeof what);
    size_t k = strlen(what);
    snprintf(what + k, sizeof what - k, ", %d of %d ranks arrived", g->p - nmissing, g->p);
    st = par__wait_failed(c, st, what, missing, nmissing);
    par_free(missing);
    return st;
}

/* Group rank c->rank arrives at round fc->gen + 1 and waits for all. */
static par_status arrive(par_comm *c, fcomm *fc, int ignore_abort, const par__callmeta *m)
{
    fgroup *g = fc->g;
    uint64_t target = fc->gen + 1;
    /* read only by the reports of a failed wait */
    atomic_store_explicit(&g->slots[c->rank].arrived, target, memory_order_relaxed);
    uint64_t w = atomic_load(&g->word), nw;
    do {
        nw = (w & CNT_MASK) + 1 == (uint64_t)g->p ? target << CNT_BITS : w + 1;
    } while (!atomic_compare_exchange_weak(&g->word, &w, nw));
    fc->gen = target;
    if ((nw >> CNT_BITS) == target) {
        wake_members(fc, c->rank);
        return PAR_OK;
    }
    par__waiter wt;
    par__wait_start(&wt, c->world, ignore_abort);
    for (;;) {
        if ((atomic_load_explicit(&g->word, memory_order_acquire) >> CNT_BITS) >= target)
            return PAR_OK;
        par_status st = par__wait_poll(&wt, c->world); /* parks (rank_wait) */
        if (st == PAR_OK)
            continue;
        w = atomic_load(&g->word);
        do {
            if ((w >> CNT_BITS) >= target)
                return PAR_OK; /* completed meanwhile */
        } while (!atomic_compare_exchange_weak(&g->word, &w, w - 1));
        fc->gen = target - 1;
        return arrive_failed(c, g, target, st, m);
    }
}

/* ---- exchange and split (the threads backend's steps) ------------------------- */

/* Copies what this rank receives straight from the senders' buffers after
 * checking every pair it receives. */
static par_status receive(par_comm *c, fgroup *g, const par__callmeta *m, const par__xfer *x)
{
    int me = c->rank, p = c->size;
    par_status st = PAR_OK;
    for (int j = 0; j < p && st == PAR_OK && !x->fixed; j++) {
        size_t sent = par__col_at(&g->slots[j].x->sbytes, me);
        size_t want = par__col_at(&x->rbytes, j);
        if (sent != want)
            st = par__pair_mismatch(c, m, j, me, sent, want);
    }
    int lo, hi;
    par__col_span(&x->rbytes, p, &lo, &hi);
    for (int j = lo; st == PAR_OK && j < hi; j++) {
        size_t rb = par__col_at(&x->rbytes, j);
        if (!rb)
            continue;
        const par__xfer *xj = g->slots[j].x;
        const char *src = xj->sbase + par__col_at(&xj->soff, me);
        char *dst = x->rbase + par__col_at(&x->roff, j);
#if PAR_FAULT_FIBER_SHORT_COPY
        /* Deliberate fault (meson -Dfault=fiber_short_copy; tools/cells-fault-demo.sh): an f64
         * exchange on a group of more than 2 ranks copies the last sender's last element short. */
        if (m->dtype == PAR_C_F64 && j == hi - 1 && p > 2 && rb >= 16)
            rb -= 8;
#endif
        if (src != dst)
            par_dev_comm_copy(dst, src, rb); /* memcpy, or device to device (core/device.h) */
    }
    return st;
}

static par_status f_exchange(par_comm *c, const par__callmeta *m, const par__xfer *x)
{
    fcomm *fc = c->bgroup;
    fgroup *g = fc->g;
    fslot *s = &g->slots[c->rank];
    uint64_t target = fc->gen + 1;
    s->meta[target & 1] = *m;
    s->x = x;
    par_status st = arrive(c, fc, 0, m);
    if (st != PAR_OK)
        return st;
    st = par__check_metas(c, &g->slots[0].meta[target & 1], sizeof(fslot));
    if (st != PAR_OK)
        return st; /* every member saw the same metas: nobody copies */
    if (par__xfer_empty(x))
        return PAR_OK; /* no data anywhere (the metas agree on that) */
    st = receive(c, g, m, x);
    /* Nobody leaves before all copies are done, even if the world failed. */
    par_status st2 = arrive(c, fc, 1, m);
    return st != PAR_OK ? st : st2;
}

/* The leader (lowest parent rank of a color) makes the new group; one
 * arrival later its members take it from the leader's slot. */
static par_status f_split(par_comm *parent, const par__splitplan *plan, void **bgroup)
{
    fcomm *fc = parent->bgroup;
    fgroup *ng = NULL;
    fcomm *nc = NULL;
    int member = plan->color >= 0;
    if (member && plan->leader == parent->rank) {
        ng = group_new(fc->fw, plan->size, plan->size, 1); /* NULL: members see it and fail */
        for (int i = 0; ng && i < plan->size; i++)
            ng->wranks[i] = parent->world_ranks[plan->parent_ranks[i]];
    }
    if (member) {
        nc = par_calloc(1, sizeof *nc, PAR_TAG_COMM);
        atomic_fetch_add_explicit(&fc->fw->heap, sizeof *nc, memory_order_relaxed);
    }
    fc->g->slots[parent->rank].split = ng;
    par__callmeta m = {.group_id = parent->id, .seq = parent->seq, .op = PAR__OP_SPLIT,
                       .dtype = PAR_C_I32, .count = 2, .redop = -1, .root = -1, .phase = 1,
                       .rank = parent->rank};
    par_status st = arrive(parent, fc, 0, &m);
    if (st != PAR_OK) { /* the round did not complete: nobody read ng */
        group_destroy(ng);
        par_free(nc);
        return st;
    }
    if (!member) {
        *bgroup = NULL;
        return PAR_OK;
    }
    /* stable until this rank's next arrival in the parent */
    fgroup *shared = fc->g->slots[plan->leader].split;
    if (!shared || !nc) {
        group_unref(shared);
        par_free(nc);
        return par_err(PAR_ENOMEM, "fiber: no memory for group of %d ranks split from %s",
                       plan->size, par_comm_name(parent));
    }
    nc->g = shared;
    nc->fw = fc->fw;
    *bgroup = nc;
    return PAR_OK;
}

static void f_group_free(par_comm *c, void *bgroup)
{
    (void)c;
    fcomm *fc = bgroup;
    if (!fc)
        return;
    group_unref(fc->g);
    par_free(fc);
}

static par_status f_group_world(par__world *w, void *bworld, int rank, void **bgroup)
{
    (void)w;
    fworld *fw = bworld;
    fcomm *fc = par_calloc(1, sizeof *fc, PAR_TAG_COMM);
    if (!fc)
        return par_err(PAR_ENOMEM, "fiber: no memory for rank %d's world handle", rank);
    atomic_fetch_add_explicit(&fw->heap, sizeof *fc, memory_order_relaxed);
    fc->g = fw->world;
    fc->fw = fw;
    atomic_fetch_add(&fc->g->refs, 1);
    *bgroup = fc;
    return PAR_OK;
}

/* ---- point to point and comm's waits ------------------------------------------ */

/* comm's mailboxes; a post that matched wakes the other side, which may be
 * parked in par_wait. */
static void f_p2p_post(par_request *r)
{
    par__p2p_post(r);
    if (atomic_load_explicit(&r->done, memory_order_acquire))
        fsched_wake(((fcomm *)r->comm->bgroup)->fw->s, r->peer_wrank);
}

/* On the waiting rank's fiber: its scheduler is this thread's. */
static int f_rank_wait(par__world *w, double deadline)
{
    (void)w;
    fsched *s = fsched_current();
    if (!s)
        return 0;
    if (deadline > 0)
        fsched_park(s, deadline);
    else
        fsched_yield(s);
    return 1;
}

/* par_comm_store_local's wake: every rank of this world is a fiber here. */
static void f_rank_wake(par__world *w, void *bworld, int wrank)
{
    (void)w;
    fsched_wake(((fworld *)bworld)->s, wrank);
}

/* ---- the world ---------------------------------------------------------------- */

static int world_failed(void *ud) { return par__world_failed(ud) != 0; }

static par_status f_world_init(par__world *w, void **bworld)
{
    int n = par__world_size(w);
    if (n >= (int)CNT_MASK)
        return par_err(PAR_EINVAL, "fiber: %d ranks exceed the limit of %d", n, (int)CNT_MASK);
    fsched_opts so;
    par_status st = fsched_opts_from(par__world_opts(w), n, 1, &so);
    if (st != PAR_OK)
        return st;
    so.stop = world_failed;
    so.stop_ud = w;
    fworld *fw = par_calloc(1, sizeof *fw, PAR_TAG_COMM);
    if (!fw)
        return par_err(PAR_ENOMEM, "fiber: no memory for a world of %d ranks", n);
    fw->w = w;
    fw->stack = so.stack;
    fw->world = group_new(fw, n, 1, 0); /* the world holds one reference until finalize */
    if (!fw->world) {
        par_free(fw);
        return par_err(PAR_ENOMEM, "fiber: no memory for a world of %d ranks", n);
    }
    if ((st = fsched_new(n, &so, &fw->s)) != PAR_OK) {
        group_destroy(fw->world);
        par_free(fw);
        return st;
    }
    *bworld = fw;
    return PAR_OK;
}

/* One line at info level: stacks, the backend's own memory, switches. */
static void report(fworld *fw)
{
    fsched_stats ss;
    fsched_get_stats(fw->s, &ss);
    int n = par__world_size(fw->w);
    size_t kib = fw->stack >> 10, used = (ss.stack_max + 1023) >> 10;
    size_t heap = ss.heap + atomic_load(&fw->heap) + sizeof *fw;
    PAR_LOG_I("fiber: %d ranks on %d workers, %zu KiB stacks: deepest use %zu KiB (rank %d); "
              "stacks committed %.1f MiB (%.1f KiB per rank; high-water marks %.1f KiB per rank), "
              "backend heap %.1f MiB (%.0f B per rank); %llu switches into ranks, %llu wake-ups", n,
              ss.workers, kib, used, ss.stack_max_rank, (double)ss.stack_res / 1048576.0,
              (double)ss.stack_res / 1024.0 / n, (double)ss.stack_sum / 1024.0 / n,
              (double)heap / 1048576.0, (double)heap / n, (unsigned long long)ss.switches,
              (unsigned long long)ss.wakes);
    if (ss.stack_max > fw->stack / 4 * 3)
        PAR_LOG_W("fiber: rank %d used %zu of its %zu KiB stack; give the ranks more "
                  "(PARITY_FIBER_STACK=%zuK) before it overflows", ss.stack_max_rank, used, kib,
                  kib * 2);
}

static void f_world_finalize(par__world *w, void *bworld)
{
    (void)w;
    fworld *fw = bworld;
    report(fw);
    fsched_free(fw->s);
    group_unref(fw->world);
    par_free(fw);
}

static void run_rank(void *ud, int r)
{
    fworld *fw = ud;
    fw->main(fw->w, r);
}

static par_status f_launch(par__world *w, void *bworld, par__rank_main main_fn)
{
    (void)w;
    fworld *fw = bworld;
    fw->main = main_fn;
    return fsched_run(fw->s, run_rank, fw);
}

const par_backend par_backend_fiber = {
    .name = "fiber",
    .summary = "every rank a fiber (own small stack) on a few worker threads: thousands of ranks",
    .max_ranks = 0,
    .world_init = f_world_init,
    .world_finalize = f_world_finalize,
    .launch = f_launch,
    .group_world = f_group_world,
    .group_split = f_split,
    .group_free = f_group_free,
    .exchange = f_exchange,
    .dev_copies = 1,
    .p2p_post = f_p2p_post,
    .rank_wait = f_rank_wait,
    .rank_wake = f_rank_wake,
};
