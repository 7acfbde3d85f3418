/* comm/clock.c - per-rank virtual clocks on the emulated network.
 *
 * Each rank's clock is touched only by that rank's thread (par__clock_sync
 * runs inside the rank's own exchange call), so no locks.  Every advance of
 * a clock is classified once: compute, exposed communication or idle, so
 * total = compute + comm + idle exactly (up to rounding of the sums).
 */
#include "comm/clock.h"

#include <stdio.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/counters.h"

typedef struct {
    double now;
    par_counts last;        /* counters at the last event                     */
    /* the exchange step in progress */
    double arrive;          /* this rank's clock when it arrived              */
    double start;           /* latest arrival of the members                  */
    double cost;            /* largest member cost                            */
    par_netcost mine;       /* this rank's part (bytes, tier)                 */
    par_rankstats st;
    par_span *spans;
    size_t nspans, cap, lost;
    int running;
} rankclock;

struct par_netrun {
    par_netmodel m;
    int n;
    int record;
    rankclock *rc;          /* [n] */
};

par_status par_netrun_create(const par_netmodel *m, int nranks, int record_spans,
                             par_netrun **out)
{
    if (!m || !out || nranks < 1)
        return par_err(PAR_EINVAL, "par_netrun_create: a model and at least one rank are "
                                   "required (got %d ranks)", nranks);
    par_status st = par_netmodel_validate(m);
    if (st != PAR_OK)
        return st;
    par_netrun *r = par_calloc(1, sizeof *r, PAR_TAG_MISC);
    if (!r)
        return par_err(PAR_ENOMEM, "par_netrun_create: no memory");
    r->rc = par_calloc((size_t)nranks, sizeof *r->rc, PAR_TAG_MISC);
    if (!r->rc) {
        par_free(r);
        return par_err(PAR_ENOMEM, "par_netrun_create: no memory for %d clocks", nranks);
    }
    r->m = *m;
    r->n = nranks;
    r->record = record_spans != 0;
    *out = r;
    return PAR_OK;
}

void par_netrun_free(par_netrun *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++)
        par_free(r->rc[i].spans);
    par_free(r->rc);
    par_free(r);
}

int par_netrun_nranks(const par_netrun *r) { return r ? r->n : 0; }
const par_netmodel *par_netrun_model(const par_netrun *r) { return &r->m; }

const par_rankstats *par_netrun_stats(const par_netrun *r, int rank)
{
    return r && rank >= 0 && rank < r->n ? &r->rc[rank].st : NULL;
}

const par_span *par_netrun_spans(const par_netrun *r, int rank, size_t *n, size_t *lost)
{
    if (!r || rank < 0 || rank >= r->n) {
        *n = 0;
        if (lost)
            *lost = 0;
        return NULL;
    }
    *n = r->rc[rank].nspans;
    if (lost)
        *lost = r->rc[rank].lost;
    return r->rc[rank].spans;
}

/* ---- per-rank bookkeeping ------------------------------------------------- */

static par_netrun *run_of(par__world *w) { return w->opts.net; }

static rankclock *clock_of(par_comm *c)
{
    return c ? par__rank_clock(c) : NULL;
}

static void span(par_netrun *run, rankclock *rc, par_spankind kind, const char *op, double t0,
                 double t1, uint64_t bytes, par_tier tier, int phase, const char *group)
{
    if (!run->record || !(t1 > t0))
        return;
    if (rc->nspans == rc->cap) {
        size_t cap = rc->cap ? 2 * rc->cap : 256;
        par_span *ns = par_realloc(rc->spans, cap * sizeof *ns, PAR_TAG_MISC);
        if (!ns) {
            rc->lost++;
            return;
        }
        rc->spans = ns;
        rc->cap = cap;
    }
    par_span *s = &rc->spans[rc->nspans++];
    memset(s, 0, sizeof *s);
    s->t0 = t0;
    s->t1 = t1;
    s->bytes = bytes;
    s->op = op;
    s->kind = kind;
    s->tier = tier;
    s->phase = phase;
    if (group)
        snprintf(s->group, sizeof s->group, "%s", group);
}

/* Charges the work counted on this thread since the last event. */
static void charge(par_netrun *run, rankclock *rc)
{
    par_counts now = par_counts_get();
    uint64_t df = now.flops - rc->last.flops, db = now.bytes - rc->last.bytes;
    rc->last = now;
    if (!df && !db)
        return;
    double dt = par_net_compute_time(&run->m, df, db);
    size_t before = rc->nspans;
    span(run, rc, PAR_SPAN_COMPUTE, "compute", rc->now, rc->now + dt, db, PAR_TIER_SELF, 0, NULL);
    if (rc->nspans > before)
        rc->spans[before].flops = df;
    rc->now += dt;
    rc->st.compute_s += dt;
    rc->st.flops += df;
    rc->st.hbm_bytes += db;
}

static void add_cost(rankclock *rc, const par_netcost *k)
{
    for (int t = 0; t < PAR_TIER_COUNT; t++) {
        rc->st.bytes[t] += k->bytes[t];
        rc->st.msgs[t] += k->msgs[t];
    }
}

static uint64_t sent_bytes(const par_netcost *k)
{
    return k->bytes[PAR_TIER_NVLINK] + k->bytes[PAR_TIER_IB];
}

void par__net_rank_begin(par__world *w, int r)
{
    par_netrun *run = run_of(w);
    if (!run)
        return;
    rankclock *rc = &run->rc[r];
    rc->now = 0;
    rc->nspans = 0;
    rc->lost = 0;
    memset(&rc->st, 0, sizeof rc->st);
    rc->last = par_counts_get();
    rc->running = 1;
    w->ranks[r].clock = rc;
}

void par__net_rank_end(par__world *w, int r)
{
    par_netrun *run = run_of(w);
    if (!run)
        return;
    rankclock *rc = &run->rc[r];
    charge(run, rc);
    rc->st.total_s = rc->now;
    rc->running = 0;
    w->ranks[r].clock = NULL;
}

double par_comm_vclock(par_comm *c)
{
    rankclock *rc = clock_of(c);
    if (!rc)
        return 0;
    charge(run_of(c->world), rc);
    return rc->now;
}

/* ---- collectives ---------------------------------------------------------- */

static size_t max_of(const size_t *v, int p)
{
    size_t m = 0;
    for (int j = 0; v && j < p; j++)
        if (v[j] > m)
            m = v[j];
    return m;
}

/* This rank's part of one exchange step under the algorithm charged for it. */
static par_netcost step_cost(const par_netmodel *nm, par_comm *c, const par__callmeta *m,
                             const par__xfer *x)
{
    int p = c->size, me = c->rank;
    const int *wr = c->world_ranks;
    size_t es = par_ctype_size((par_ctype)m->dtype);
    size_t count = (size_t)m->count;
    switch ((par__op)m->op) {
    case PAR__OP_ALLREDUCE: /* two ring phases of p-1 steps of the largest block */
        return par_net_ring(nm, wr, p, me, p - 1,
                            (count / (size_t)p + (count % (size_t)p != 0)) * es);
    case PAR__OP_REDUCE_SCATTER:
    case PAR__OP_ALLGATHER:
        return par_net_ring(nm, wr, p, me, p - 1, count * es);
    case PAR__OP_ALLGATHERV:
        return par_net_ring(nm, wr, p, me, p - 1, x ? max_of(x->rbytes, p) : 0);
    case PAR__OP_SPLIT: /* an all-gather of (color, key) */
        return par_net_ring(nm, wr, p, me, p - 1, 2 * sizeof(int32_t));
    case PAR__OP_ALLTOALL:
    case PAR__OP_ALLTOALLV:
        return par_net_alltoall(nm, wr, p, me, x ? x->sbytes : NULL, x ? x->rbytes : NULL);
    case PAR__OP_BCAST:
        return par_net_chain(nm, wr, p, me, m->root, count * es);
    case PAR__OP_BARRIER:
    default:
        return par_net_barrier(nm, wr, p);
    }
}

void par__comm_account(par_comm *c, par__callmeta *m, const par__xfer *x)
{
    m->vclock = 0;
    m->vcost = 0;
    rankclock *rc = clock_of(c);
    if (!rc)
        return;
    par_netrun *run = run_of(c->world);
    charge(run, rc);
    rc->mine = step_cost(&run->m, c, m, x);
    rc->arrive = rc->now;
    /* defaults for a backend that does not sync (one rank: nothing to wait for) */
    rc->start = rc->now;
    rc->cost = rc->mine.time;
    m->vclock = rc->now;
    m->vcost = rc->mine.time;
}

#define META(r) ((const par__callmeta *)((const char *)metas + (size_t)(r) * stride))

void par__clock_sync(par_comm *c, const par__callmeta *metas, size_t stride)
{
    rankclock *rc = clock_of(c);
    if (!rc)
        return;
    double start = 0, cost = 0;
    for (int r = 0; r < c->size; r++) {
        if (META(r)->vclock > start)
            start = META(r)->vclock;
        if (META(r)->vcost > cost)
            cost = META(r)->vcost;
    }
    rc->start = start;
    rc->cost = cost;
}

void par__comm_settle(par_comm *c, const par__callmeta *m, par_status st)
{
    rankclock *rc = clock_of(c);
    if (!rc || st != PAR_OK)
        return;
    par_netrun *run = run_of(c->world);
    const char *op = par__op_name((par__op)m->op);
    double start = rc->start > rc->arrive ? rc->start : rc->arrive;
    span(run, rc, PAR_SPAN_IDLE, op, rc->arrive, start, 0, rc->mine.tier, m->phase, c->name);
    span(run, rc, PAR_SPAN_COMM, op, start, start + rc->cost, sent_bytes(&rc->mine),
         rc->mine.tier, m->phase, c->name);
    rc->st.idle_s += start - rc->arrive;
    rc->st.comm_s += rc->cost;
    rc->now = start + rc->cost;
    rc->st.steps++;
    add_cost(rc, &rc->mine);
}

/* ---- point to point ------------------------------------------------------- */

void par__net_p2p_post(par_request *r)
{
    r->vpost = 0;
    r->vpeer = 0;
    rankclock *rc = clock_of(r->comm);
    if (!rc)
        return;
    charge(run_of(r->comm->world), rc);
    r->vpost = rc->now;
}

void par__net_p2p_done(par_request *r)
{
    rankclock *rc = clock_of(r->comm);
    if (!rc)
        return;
    par_netrun *run = run_of(r->comm->world);
    charge(run, rc);
    int send = r->kind == PAR__REQ_SEND;
    size_t bytes = r->count * par_ctype_size(r->dtype);
    par_netcost k = send ? par_net_p2p(&run->m, r->wrank, r->peer_wrank, bytes)
                         : par_net_p2p(&run->m, r->peer_wrank, r->wrank, bytes);
    double xs = send ? r->vpost : r->vpeer; /* the transfer leaves with the send */
    double xe = xs + k.time;
    double done = send ? xe : (r->vpost > xe ? r->vpost : xe);
    double t = rc->now;
    const char *op = send ? "send" : "recv";
    span(run, rc, PAR_SPAN_XFER, op, xs, xe, bytes, k.tier, 0, r->comm->name);
    if (done > t) {
        /* a receive blocked before the send was posted is idle; the rest is exposed */
        double idle = 0;
        if (!send && r->vpeer > t)
            idle = (r->vpeer < done ? r->vpeer : done) - t;
        span(run, rc, PAR_SPAN_IDLE, op, t, t + idle, 0, k.tier, 0, r->comm->name);
        span(run, rc, PAR_SPAN_COMM, op, t + idle, done, bytes, k.tier, 0, r->comm->name);
        rc->st.idle_s += idle;
        rc->st.comm_s += done - t - idle;
        rc->now = done;
    }
    rc->st.p2p++;
    if (send)
        add_cost(rc, &k);
}
