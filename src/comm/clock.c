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
    /* --cost-as (clock.h): what the clock charges instead of what moves */
    int explicit_cost;      /* 1: the counted work is not charged             */
    struct {
        const par_comm *c;
        double p2p, coll;
    } scl[8];               /* per-comm byte scales                           */
    int nscl;
    size_t *ovr;            /* [2 * ovr_p] the next all-to-all's bytes        */
    int ovr_p, ovr_cap;
    const par_comm *ovr_c;  /* the comm it is for (NULL: none pending)        */
    double ovr_rep;
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
    for (int i = 0; i < r->n; i++) {
        par_free(r->rc[i].spans);
        par_free(r->rc[i].ovr);
    }
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
    if ((!df && !db) || rc->explicit_cost)
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
    rc->explicit_cost = 0;
    rc->nscl = 0;
    rc->ovr_c = NULL;
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

static size_t max_of(const par__col *v, int p)
{
    size_t m = 0;
    for (int j = 0; j < p; j++)
        if (par__col_at(v, j) > m)
            m = par__col_at(v, j);
    return m;
}

static size_t col_at(const void *ctx, int j) { return par__col_at(ctx, j); }

static size_t B(double bytes) { return (size_t)(bytes + 0.5); }

/* This rank's part of one exchange step under the algorithm charged for it
 * (step bytes times scale, par_comm_cost_scale). */
static par_netcost step_cost(const par_netmodel *nm, par_comm *c, const par__callmeta *m,
                             const par__xfer *x, double scale)
{
    int p = c->size, me = c->rank;
    const int *wr = c->world_ranks;
    const double es = (double)par_ctype_size((par_ctype)m->dtype) * scale; /* scale: --cost-as */
    size_t count = (size_t)m->count;
    switch ((par__op)m->op) {
    case PAR__OP_ALLREDUCE: /* two ring phases of p-1 steps of the largest block */
        return par_net_ring(nm, wr, p, me, p - 1,
                            B((double)(count / (size_t)p + (count % (size_t)p != 0)) * es));
    case PAR__OP_REDUCE_SCATTER:
    case PAR__OP_ALLGATHER:
        return par_net_ring(nm, wr, p, me, p - 1, B((double)count * es));
    case PAR__OP_ALLGATHERV:
        return par_net_ring(nm, wr, p, me, p - 1, x ? B((double)max_of(&x->rbytes, p) * scale) : 0);
    case PAR__OP_SPLIT: /* an all-gather of (color, key) */
        return par_net_ring(nm, wr, p, me, p - 1, 2 * sizeof(int32_t));
    case PAR__OP_ALLTOALL:
    case PAR__OP_ALLTOALLV:
        return x ? par_net_alltoall_by(nm, wr, p, me, col_at, &x->sbytes, col_at, &x->rbytes)
                 : par_net_alltoall(nm, wr, p, me, NULL, NULL);
    case PAR__OP_BCAST:
        return par_net_chain(nm, wr, p, me, m->root, B((double)count * es));
    case PAR__OP_BARRIER:
    default:
        return par_net_barrier(nm, wr, p);
    }
}

/* The byte scales of comm c on this rank (1, 1 when none was set). */
static double scale_of(const rankclock *rc, const par_comm *c, int p2p)
{
    for (int i = 0; i < rc->nscl; i++)
        if (rc->scl[i].c == c)
            return p2p ? rc->scl[i].p2p : rc->scl[i].coll;
    return 1.0;
}

/* k repeated n times (an all-to-all standing for n of the target's). */
static void cost_times(par_netcost *k, double n)
{
    k->time *= n;
    for (int t = 0; t < PAR_TIER_COUNT; t++) {
        k->bytes[t] = (uint64_t)((double)k->bytes[t] * n + 0.5);
        k->msgs[t] = (uint64_t)((double)k->msgs[t] * n + 0.5);
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
    par__op op = (par__op)m->op;
    if (rc->ovr_c == c && (op == PAR__OP_ALLTOALL || op == PAR__OP_ALLTOALLV)) {
        rc->mine = par_net_alltoall(&run->m, c->world_ranks, c->size, c->rank, rc->ovr, rc->ovr + rc->ovr_p);
        cost_times(&rc->mine, rc->ovr_rep);
        rc->ovr_c = NULL;
    } else {
        rc->mine = step_cost(&run->m, c, m, x, scale_of(rc, c, 0));
    }
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

/* One message's virtual times on this rank: the transfer [xs, xe] leaves
 * with the send; the request is complete at `done` (a receive: not before
 * it was posted). */
typedef struct {
    par_netcost k;
    size_t bytes;
    double xs, xe, done;
} p2p_times;

static void p2p_times_of(par_netrun *run, const rankclock *rc, const par_request *r, p2p_times *t)
{
    int send = r->kind == PAR__REQ_SEND;
    t->bytes = (size_t)((double)(r->count * par_ctype_size(r->dtype)) * scale_of(rc, r->comm, 1) + 0.5);
    t->k = send ? par_net_p2p(&run->m, r->wrank, r->peer_wrank, t->bytes)
                : par_net_p2p(&run->m, r->peer_wrank, r->wrank, t->bytes);
    t->xs = send ? r->vpost : r->vpeer; /* the transfer leaves with the send */
    t->xe = t->xs + t->k.time;
    t->done = send ? t->xe : (r->vpost > t->xe ? r->vpost : t->xe);
}

/* What every completed message counts, whether or not it moved the clock. */
static void p2p_count(par_netrun *run, rankclock *rc, const par_request *r, const p2p_times *t)
{
    span(run, rc, PAR_SPAN_XFER, r->kind == PAR__REQ_SEND ? "send" : "recv", t->xs, t->xe, t->bytes, t->k.tier, 0,
         r->comm->name);
    rc->st.p2p++;
    if (r->kind == PAR__REQ_SEND)
        add_cost(rc, &t->k);
}

void par__net_p2p_done(par_request *r)
{
    rankclock *rc = clock_of(r->comm);
    if (!rc)
        return;
    par_netrun *run = run_of(r->comm->world);
    charge(run, rc);
    int send = r->kind == PAR__REQ_SEND;
    p2p_times x;
    p2p_times_of(run, rc, r, &x);
    double done = x.done, t = rc->now;
    const char *op = send ? "send" : "recv";
    p2p_count(run, rc, r, &x);
    if (done > t) {
        /* a receive blocked before the send was posted is idle; the rest is exposed */
        double idle = 0;
        if (!send && r->vpeer > t)
            idle = (r->vpeer < done ? r->vpeer : done) - t;
        span(run, rc, PAR_SPAN_IDLE, op, t, t + idle, 0, x.k.tier, 0, r->comm->name);
        span(run, rc, PAR_SPAN_COMM, op, t + idle, done, x.bytes, x.k.tier, 0, r->comm->name);
        rc->st.idle_s += idle;
        rc->st.comm_s += done - t - idle;
        rc->now = done;
    }
}

/* Charges nothing: a charge here would split the compute between two
 * events into two roofline terms (max(flops, bytes) of each part), which is
 * not the one term of the wait that would otherwise come later.  The
 * uncharged clock is no later than the charged one, so `due` is never early. */
int par__net_p2p_settle(par_request *r)
{
    rankclock *rc = clock_of(r->comm);
    if (!rc)
        return 1;
    par_netrun *run = run_of(r->comm->world);
    p2p_times x;
    p2p_times_of(run, rc, r, &x);
    if (x.done > rc->now)
        return 0;
    p2p_count(run, rc, r, &x);
    return 1;
}

/* ---- charging a target's sizes (clock.h) ---------------------------------- */

void par_comm_cost_explicit(par_comm *c)
{
    rankclock *rc = clock_of(c);
    if (!rc)
        return;
    charge(run_of(c->world), rc);
    rc->explicit_cost = 1;
}

void par_comm_charge(par_comm *c, double flops)
{
    rankclock *rc = clock_of(c);
    if (!rc || !(flops > 0))
        return;
    par_netrun *run = run_of(c->world);
    charge(run, rc);
    double dt = flops / run->m.peak_flops;
    size_t before = rc->nspans;
    span(run, rc, PAR_SPAN_COMPUTE, "compute", rc->now, rc->now + dt, 0, PAR_TIER_SELF, 0, NULL);
    if (rc->nspans > before)
        rc->spans[before].flops = (uint64_t)flops;
    rc->now += dt;
    rc->st.compute_s += dt;
    rc->st.flops += (uint64_t)flops;
}

par_status par_comm_cost_scale(par_comm *c, double p2p, double coll)
{
    rankclock *rc = clock_of(c);
    if (!rc)
        return PAR_OK;
    if (!(p2p >= 0) || !(coll >= 0))
        return par_err(PAR_EINVAL, "cost scale of %s: scales must be >= 0 (got %g, %g)", c->name, p2p, coll);
    int i = 0;
    while (i < rc->nscl && rc->scl[i].c != c)
        i++;
    if (i == (int)(sizeof rc->scl / sizeof rc->scl[0]))
        return par_err(PAR_ERANGE, "cost scale of %s: at most %d comms per rank", c->name, i);
    rc->scl[i].c = c;
    rc->scl[i].p2p = p2p;
    rc->scl[i].coll = coll;
    rc->nscl += i == rc->nscl;
    return PAR_OK;
}

par_status par_comm_cost_next(par_comm *c, const size_t *bytes_to, const size_t *bytes_from, double repeat)
{
    rankclock *rc = clock_of(c);
    if (!rc)
        return PAR_OK;
    int p = c->size;
    if (p > rc->ovr_cap) {
        size_t *n = par_realloc(rc->ovr, (size_t)p * 2 * sizeof *n, PAR_TAG_MISC);
        if (!n)
            return par_err(PAR_ENOMEM, "cost of the next all-to-all of %s: no memory for %d peers", c->name, p);
        rc->ovr = n;
        rc->ovr_cap = p;
    }
    for (int j = 0; j < p; j++) {
        rc->ovr[j] = bytes_to ? bytes_to[j] : 0;
        rc->ovr[p + j] = bytes_from ? bytes_from[j] : 0;
    }
    rc->ovr_p = p;
    rc->ovr_rep = repeat >= 0 ? repeat : 0;
    rc->ovr_c = c;
    return PAR_OK;
}
