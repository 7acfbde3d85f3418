/* comm/comm.c - worlds: the launcher, the failure state, waits, activity. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/clock.h"
#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/log.h"

/* ---- types -------------------------------------------------------------- */

static const char *const ctype_names[PAR_C_COUNT] = {"f64", "f32", "i32", "i64", "bytes"};
static const size_t ctype_sizes[PAR_C_COUNT] = {8, 4, 4, 8, 1};

size_t par_ctype_size(par_ctype t)
{
    return (unsigned)t < PAR_C_COUNT ? ctype_sizes[t] : 0;
}

const char *par_ctype_name(par_ctype t)
{
    return (unsigned)t < PAR_C_COUNT ? ctype_names[t] : "invalid-type";
}

const char *par_redop_name(par_redop op)
{
    switch (op) {
    case PAR_OP_SUM: return "sum";
    case PAR_OP_MAX: return "max";
    default: return "invalid-op";
    }
}

par_status par_ctype_of(par_dtype dt, par_ctype *out)
{
    switch (dt) {
    case PAR_F64: *out = PAR_C_F64; return PAR_OK;
    case PAR_F32: *out = PAR_C_F32; return PAR_OK;
    case PAR_I32: *out = PAR_C_I32; return PAR_OK;
    case PAR_I64: *out = PAR_C_I64; return PAR_OK;
    default:
        return par_err(PAR_EUNSUPPORTED, "comm: dtype %s has no comm type (send it as bytes)",
                       par_dtype_name(dt));
    }
}

const char *par_backend_name(const par_backend *b)
{
    return b ? b->name : "(none)";
}

/* ---- time and waiting --------------------------------------------------- */

double par__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int par__world_size(const par__world *w) { return w->n; }
double par__world_timeout(const par__world *w) { return w->timeout_s; }
const par_world_opts *par__world_opts(const par__world *w) { return &w->opts; }

void par__wait_start(par__waiter *wt, const par__world *w, int ignore_abort)
{
    wt->start = par__now();
    wt->deadline = wt->start + w->timeout_s;
    wt->yield_until = wt->start + w->yield_s;
    wt->iter = 0;
    wt->spin = w->spin;
    wt->ignore_abort = ignore_abort;
    wt->block = NULL;
    wt->block_ctx = NULL;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

par_status par__wait_poll(par__waiter *wt, const par__world *w)
{
    if (!wt->ignore_abort && atomic_load_explicit(&w->failed, memory_order_acquire))
        return PAR_ECOMM;
    if (w->be->rank_wait) { /* ranks are fibers: park until woken or the deadline */
        if (par__now() > wt->deadline)
            return PAR_ETIMEOUT;
        if (w->be->rank_wait((par__world *)w, wt->deadline))
            return PAR_OK;
    }
    if (++wt->iter <= wt->spin) {
        cpu_relax();
        return PAR_OK;
    }
    double now = par__now();
    if (now > wt->deadline)
        return PAR_ETIMEOUT;
    if (now < wt->yield_until) {
        sched_yield();
    } else if (wt->block) {
        /* short slices: failures of other ranks are noticed within 10 ms */
        double left = wt->deadline - now;
        wt->block(wt->block_ctx, left < 0.01 ? left : 0.01);
    } else {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return PAR_OK;
}

/* ---- the failure state -------------------------------------------------- */

par_status par__world_failed(const par__world *w)
{
    return atomic_load_explicit(&w->failed, memory_order_acquire);
}

void par__world_fail(par__world *w, int wrank, par_status st, const char *msg)
{
    if (st == PAR_OK)
        st = PAR_EINTERNAL;
    pthread_mutex_lock(&w->fail_mu);
    if (!atomic_load(&w->failed)) {
        w->fail_rank = wrank;
        snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg && msg[0] ? msg : par_status_str(st));
        atomic_store_explicit(&w->failed, st, memory_order_release);
    }
    pthread_mutex_unlock(&w->fail_mu);
}

void par__world_set_first_failure(par__world *w, int wrank, par_status st, const char *msg)
{
    if (st == PAR_OK)
        return;
    pthread_mutex_lock(&w->fail_mu);
    w->fail_rank = wrank;
    snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg && msg[0] ? msg : par_status_str(st));
    atomic_store_explicit(&w->failed, st, memory_order_release);
    pthread_mutex_unlock(&w->fail_mu);
}

const char *par__world_fingerprint(const par__world *w) { return w->opts.fingerprint; }

static void fail_info(par__world *w, int *rank, char *msg, size_t n)
{
    pthread_mutex_lock(&w->fail_mu);
    *rank = w->fail_rank;
    size_t len = strnlen(w->fail_msg, n - 1); /* truncation is fine here */
    memcpy(msg, w->fail_msg, len);
    msg[len] = '\0';
    pthread_mutex_unlock(&w->fail_mu);
}

void par__world_first_failure(par__world *w, int *wrank, char *msg, size_t n) { fail_info(w, wrank, msg, n); }

par_status par__check_world(par_comm *c, const char *what)
{
    par_status f = par__world_failed(c->world);
    if (!f)
        return PAR_OK;
    int fr;
    char fm[256];
    fail_info(c->world, &fr, fm, sizeof fm);
    return par_err(f == PAR_ETIMEOUT ? PAR_ETIMEOUT : PAR_ECOMM,
                   "%s in group %s: the world already failed (rank %d: %s: %s)", what, c->name,
                   fr, par_status_str(f), fm);
}

/* ---- activity ----------------------------------------------------------- */

void par__call_enter(par_comm *c, const par__callmeta *m, int peer_wrank)
{
    par__rankstate *rs = &c->world->ranks[c->wrank];
    pthread_mutex_lock(&rs->mu);
    rs->in_call = 1;
    rs->call = *m;
    rs->peer_wrank = peer_wrank;
    snprintf(rs->group, sizeof rs->group, "%s", c->name);
    pthread_mutex_unlock(&rs->mu);
}

void par__call_leave(par_comm *c)
{
    par__rankstate *rs = &c->world->ranks[c->wrank];
    pthread_mutex_lock(&rs->mu);
    rs->in_call = 0;
    pthread_mutex_unlock(&rs->mu);
}

void par__rank_describe(par__world *w, int wrank, char *buf, size_t n)
{
    if (wrank < 0 || wrank >= w->n) {
        snprintf(buf, n, "not a rank of this process");
        return;
    }
    par__rankstate *rs = &w->ranks[wrank];
    pthread_mutex_lock(&rs->mu);
    switch (rs->state) {
    case PAR__RANK_IDLE: snprintf(buf, n, "not started"); break;
    case PAR__RANK_RETURNED:
        snprintf(buf, n, "returned from its rank function (%s)", par_status_str(rs->ret));
        break;
    case PAR__RANK_RUNNING:
        if (!rs->in_call) {
            snprintf(buf, n, "running, in no comm call");
        } else if (rs->call.op == PAR__OP_SEND || rs->call.op == PAR__OP_RECV) {
            snprintf(buf, n, "in %s %s world rank %d, tag %d, group %s (%s x %llu)",
                     par__op_name((par__op)rs->call.op),
                     rs->call.op == PAR__OP_SEND ? "to" : "from", rs->peer_wrank, rs->call.root,
                     rs->group, par_ctype_name((par_ctype)rs->call.dtype),
                     (unsigned long long)rs->call.count);
        } else {
            char d[200];
            par__meta_describe(&rs->call, rs->group, d, sizeof d);
            snprintf(buf, n, "in %s", d);
        }
        break;
    }
    pthread_mutex_unlock(&rs->mu);
}

/* ---- the slot of the virtual clock (comm/clock.c) ----------------------- */

void *par__rank_clock(par_comm *c) { return c->world->ranks[c->wrank].clock; }
void par__rank_set_clock(par_comm *c, void *clock) { c->world->ranks[c->wrank].clock = clock; }

/* ---- the launcher ------------------------------------------------------- */

static void rank_main(par__world *w, int r)
{
    par__rankstate *rs = &w->ranks[r];
    char tag[32];
    snprintf(tag, sizeof tag, "rank %d", r);
    par_log_set_thread_tag(tag);
    pthread_mutex_lock(&rs->mu);
    rs->state = PAR__RANK_RUNNING;
    pthread_mutex_unlock(&rs->mu);
    if (w->opts.rank_init)
        w->opts.rank_init(r, w->opts.rank_init_ud);
    par__net_rank_begin(w, r);

    par_status st;
    par_comm *world = NULL;
    void *bg = NULL;
    st = w->be->group_world(w, w->bworld, r, &bg);
    if (st == PAR_OK) { /* world ranks NULL: the world's shared identity table */
        st = par__comm_new(w, r, r, w->n, NULL, 0x77u /* the world's id */, "world", bg, &world);
        if (st != PAR_OK)
            w->be->group_free(NULL, bg);
    }
    if (st == PAR_OK) {
        par_clear_error();
        st = w->fn(world, w->arg);
        if (st != PAR_OK && !par_last_error()[0])
            par_err(st, "rank %d: the rank function returned %s without a message", r,
                    par_status_str(st));
    }
    par__net_rank_end(w, r);
    if (st != PAR_OK)
        par__world_fail(w, r, st, par_last_error());
    par__p2p_release_rank(w, r);
    while (rs->comms) /* world included */
        par__comm_destroy(rs->comms);
    if (w->opts.rank_fini)
        w->opts.rank_fini(r, w->opts.rank_init_ud);
    pthread_mutex_lock(&rs->mu);
    rs->state = PAR__RANK_RETURNED;
    rs->ret = st;
    pthread_mutex_unlock(&rs->mu);
    par_log_set_thread_tag(NULL);
}

static double default_timeout(void)
{
    const char *e = getenv("PARITY_COMM_TIMEOUT");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (*end == '\0' && v > 0)
            return v;
        PAR_LOG_W("PARITY_COMM_TIMEOUT=%s is not a positive number of seconds; using %g", e,
                  PAR_COMM_DEFAULT_TIMEOUT_S);
    }
    return PAR_COMM_DEFAULT_TIMEOUT_S;
}

par_status par_world_run(const par_backend *backend, int nranks, par_world_fn fn, void *arg,
                         const par_world_opts *opts)
{
    if (!backend || !fn)
        return par_err(PAR_EINVAL, "par_world_run: backend and fn are required");
    if (nranks < 1)
        return par_err(PAR_EINVAL, "par_world_run: world size %d must be at least 1", nranks);
    if (backend->max_ranks > 0 && nranks > backend->max_ranks)
        return par_err(PAR_EINVAL, "par_world_run: backend '%s' runs at most %d ranks, asked %d",
                       backend->name, backend->max_ranks, nranks);
    if (opts && opts->net && par_netrun_nranks(opts->net) != nranks)
        return par_err(PAR_EINVAL, "par_world_run: the network collector was made for %d ranks, "
                                   "the world has %d", par_netrun_nranks(opts->net), nranks);
    if (opts && opts->timeout_s < 0)
        return par_err(PAR_EINVAL, "par_world_run: timeout %g s must be positive (0: default)",
                       opts->timeout_s);

    par_status st;
    par__world *w = par_calloc(1, sizeof *w, PAR_TAG_COMM);
    if (!w)
        return par_err(PAR_ENOMEM, "par_world_run: no memory for a world");
    w->be = backend;
    w->n = nranks;
    w->fn = fn;
    w->arg = arg;
    if (opts)
        w->opts = *opts;
    w->timeout_s = w->opts.timeout_s > 0 ? w->opts.timeout_s : default_timeout();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int crowded = nranks > (ncpu > 0 ? ncpu : 1);
    w->spin = crowded ? 8 : 4000;
    w->yield_s = crowded ? 50e-6 : 2e-3;
    pthread_mutex_init(&w->fail_mu, NULL);
    w->ranks = par_calloc((size_t)nranks, sizeof *w->ranks, PAR_TAG_COMM);
    w->mb = par_calloc((size_t)nranks, sizeof *w->mb, PAR_TAG_COMM);
    w->ident = par_malloc((size_t)nranks * sizeof *w->ident, PAR_TAG_COMM);
    if (!w->ranks || !w->mb || !w->ident) {
        st = par_err(PAR_ENOMEM, "par_world_run: no memory for %d ranks", nranks);
        goto fail_free_world;
    }
    for (int r = 0; r < nranks; r++) {
        pthread_mutex_init(&w->ranks[r].mu, NULL);
        pthread_mutex_init(&w->mb[r].mu, NULL);
        w->ident[r] = r;
    }

    st = backend->world_init(w, &w->bworld);
    if (st != PAR_OK)
        goto fail_free_world;
    st = backend->launch(w, w->bworld, rank_main);
    backend->world_finalize(w, w->bworld);
    if (st == PAR_OK && par__world_failed(w)) {
        int fr;
        char fm[768];
        fail_info(w, &fr, fm, sizeof fm);
        st = par_err(par__world_failed(w), "world of %d ranks on %s: rank %d failed first: %s",
                     nranks, backend->name, fr, fm);
    }

fail_free_world:
    if (w->ranks && w->mb) {
        for (int r = 0; r < nranks; r++) {
            pthread_mutex_destroy(&w->ranks[r].mu);
            pthread_mutex_destroy(&w->mb[r].mu);
        }
    }
    pthread_mutex_destroy(&w->fail_mu);
    par_free(w->ranks);
    par_free(w->mb);
    par_free(w->ident);
    par_free(w);
    return st;
}
