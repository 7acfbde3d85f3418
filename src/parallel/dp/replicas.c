/* parallel/dp/replicas.c - the replicated dense state a process holds once
 * (see parallel/dp/replicas.h, docs/parallel.md "Replicated state"). */
#include "parallel/dp/replicas.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/alloc.h"
#include "core/device.h"

struct PAR_FN(par_replica_s) {
    int64_t group;            /* the key: dp-cp group (world rank of its rank 0), */
    int tp;                   /*          TP shard,                               */
    int64_t n;                /*          shared floats,                          */
    uint64_t sig;             /*          hash of the shared entries' layout      */
    par_real *w;              /* [n] the weights                                  */
    par_real *m, *v, *mom;    /* the replicated optimizer state (NULL until asked) */
    size_t n_ad, n_mo;        /* their sizes: m, v [n_ad], mom [n_mo]              */
    const void *writer;       /* the ticket of the writer (its creator)            */
    int members;
    int low;                  /* lowest group rank that joined: the update's writer */
    _Atomic int64_t gen;      /* write phases the writer has finished              */
    par_counts work;          /* the counted work of the last phase                */
    struct PAR_FN(par_replica_s) *next;
};

struct PAR_FN(par_replicas_s) {
    pthread_mutex_t mu;
    PAR_FN(par_replica) *head;
};

typedef PAR_FN(par_replica) rep_t;
typedef PAR_FN(par_replica_ticket) ticket_t;

par_status PAR_FN(par_replicas_create)(PAR_FN(par_replicas) **out)
{
    PAR_FN(par_replicas) *r = par_calloc(1, sizeof *r, PAR_TAG_MODEL);
    if (!r)
        return par_err(PAR_ENOMEM, "replicas: out of memory for the registry");
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return PAR_OK;
}

void PAR_FN(par_replicas_free)(PAR_FN(par_replicas) *r)
{
    if (!r)
        return;
    for (rep_t *x = r->head, *nx; x; x = nx) {
        nx = x->next;
        par_free(x->w);
        par_free(x->m);
        par_free(x->v);
        par_free(x->mom);
        par_free(x);
    }
    pthread_mutex_destroy(&r->mu);
    par_free(r);
}

int PAR_FN(par_replicas_count)(const PAR_FN(par_replicas) *r)
{
    int n = 0;
    for (const rep_t *x = r ? r->head : NULL; x; x = x->next)
        n++;
    return n;
}

/* FNV-1a over (entry, local offset, size) of every shared entry. */
static uint64_t layout_sig(const PAR_FN(par_model) *M)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < M->tab.n; i++) {
        if (M->tab.p[i].dtype != PAR_PDT_REAL || PAR_FN(par_model_loc)(M, i) < 0 || PAR_FN(par_model_loc)(M, i) >= M->n_shared)
            continue;
        const int64_t v[3] = {i, PAR_FN(par_model_loc)(M, i), PAR_FN(par_model_numel)(M, i)};
        const unsigned char *b = (const unsigned char *)v;
        for (size_t k = 0; k < sizeof v; k++)
            h = (h ^ b[k]) * 1099511628211ull;
    }
    return h;
}

/* A zeroed block outside every rank's allocator scope: the process holds
 * it once, no rank's peak depends on which rank came first. */
static void *unscoped_calloc(size_t n, size_t es, par_tag tag)
{
    int prev = par_alloc_scope_enter(0);
    void *p = par_calloc(n > 0 ? n : 1, es, tag);
    par_alloc_scope_enter(prev);
    return p;
}

/* A new copy for the model (the registry's lock held): weights from the seed. */
static par_status rep_new(PAR_FN(par_replicas) *r, const ticket_t *t, const PAR_FN(par_model) *M, uint64_t sig,
                          rep_t **out)
{
    rep_t *x = unscoped_calloc(1, sizeof *x, PAR_TAG_MODEL);
    par_real *w = unscoped_calloc((size_t)M->n_shared, sizeof *w, PAR_TAG_PARAM);
    if (!x || !w) {
        par_free(x);
        par_free(w);
        return par_err(PAR_ENOMEM, "replicas: out of memory for a shared copy of %lld floats",
                       (long long)M->n_shared);
    }
    par_status s = PAR_FN(par_model_fill_shared)(M, w);
    if (s) {
        par_free(x);
        par_free(w);
        return s;
    }
    x->group = t->group;
    x->tp = t->tp;
    x->n = M->n_shared;
    x->sig = sig;
    x->w = w;
    x->writer = t;
    x->low = t->grank;
    atomic_init(&x->gen, 0);
    x->next = r->head;
    r->head = x;
    *out = x;
    return PAR_OK;
}

par_status PAR_FN(par_replica_share_hook)(void *ticket, void *model)
{
    ticket_t *t = ticket;
    PAR_FN(par_model) *M = model;
    if (!t || !t->reg || M->n_shared <= 0)
        return PAR_OK; /* nothing to share: the model keeps its own */
    const uint64_t sig = layout_sig(M);
    PAR_FN(par_replicas) *r = t->reg;
    par_status s = PAR_OK;
    pthread_mutex_lock(&r->mu);
    rep_t *x = r->head;
    while (x && !(x->group == t->group && x->tp == t->tp && x->n == M->n_shared && x->sig == sig))
        x = x->next;
    if (!x)
        s = rep_new(r, t, M, sig, &x);
    if (!s) {
        x->members++;
        if (t->grank < x->low)
            x->low = t->grank;
    }
    pthread_mutex_unlock(&r->mu);
    if (s)
        return s;
    t->rep = x;
    t->writer = x->writer == t;
    t->gen = 0;
    M->shw = x->w;
    return PAR_OK;
}

par_status PAR_FN(par_replica_state)(void *ticket, size_t n_ad, size_t n_mo, PAR_FN(par_zero_state) *out)
{
    ticket_t *t = ticket;
    rep_t *x = t ? t->rep : NULL;
    if (!x)
        return par_err(PAR_EINTERNAL, "replicas: optimizer state asked for a rank with no shared copy");
    par_status s = PAR_OK;
    pthread_mutex_lock(&t->reg->mu);
    if (!x->m) {
        x->m = unscoped_calloc(n_ad, sizeof *x->m, PAR_TAG_OPTIM);
        x->v = unscoped_calloc(n_ad, sizeof *x->v, PAR_TAG_OPTIM);
        x->mom = unscoped_calloc(n_mo, sizeof *x->mom, PAR_TAG_OPTIM);
        x->n_ad = n_ad;
        x->n_mo = n_mo;
        if (!x->m || !x->v || !x->mom)
            s = par_err(PAR_ENOMEM, "replicas: out of memory for %zu + %zu optimizer floats", 2 * n_ad, n_mo);
    } else if (x->n_ad != n_ad || x->n_mo != n_mo) {
        s = par_err(PAR_EINTERNAL, "replicas: a member asks for %zu + %zu optimizer floats, the copy has %zu + %zu "
                    "(the members' plans disagree)", n_ad, n_mo, x->n_ad, x->n_mo);
    }
    if (!s) {
        out->m = x->m;
        out->v = x->v;
        out->mom = x->mom;
    }
    pthread_mutex_unlock(&t->reg->mu);
    return s;
}

/* Write phases published in this process (tests: one per copy and phase). */
static _Atomic int64_t phases;

int64_t PAR_FN(par_replicas_phases)(void)
{
    return atomic_load(&phases);
}

void PAR_FN(par_replica_publish)(ticket_t *t, par_counts work)
{
    atomic_fetch_add(&phases, 1);
    /* GPU mode: the writer wrote the weights on the host (host mode); the
     * members' kernels read them on the device: their twin is stale now */
    par_dev_host_write(t->rep->w, (size_t)t->rep->n * sizeof *t->rep->w);
    t->rep->work = work;
    par_comm_store_local(&t->rep->gen, ++t->gen);
}

par_status PAR_FN(par_replica_wait)(ticket_t *t, par_comm *c, const char *what)
{
    par_status s = par_comm_wait_local(c, &t->rep->gen, ++t->gen, what);
    if (s)
        return s;
    par_count_flops(t->rep->work.flops);
    par_count_bytes(t->rep->work.bytes);
    return PAR_OK;
}

int PAR_FN(par_replica_updater)(const ticket_t *t)
{
    pthread_mutex_lock(&t->reg->mu);
    int low = t->rep->low;
    pthread_mutex_unlock(&t->reg->mu);
    return low == t->grank;
}
