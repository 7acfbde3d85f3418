/* comm/check.c - the safety checks: call metadata, mismatches, timeouts. */
#include <stdio.h>
#include <string.h>

#include "comm/comm-impl.h"

static const char *const op_names[PAR__OP_COUNT] = {
    "none",      "barrier",  "bcast",     "allreduce", "reduce_scatter", "allgather",
    "allgatherv", "alltoall", "alltoallv", "split",     "send",           "recv",
};

const char *par__op_name(par__op op)
{
    return (unsigned)op < PAR__OP_COUNT ? op_names[op] : "invalid-op";
}

void par__meta_describe(const par__callmeta *m, const char *group, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s #%llu of group %s (", par__op_name((par__op)m->op),
                     (unsigned long long)m->seq, group);
    if (k < 0 || (size_t)k >= n)
        return;
    buf += k, n -= (size_t)k;
    switch (m->op) {
    case PAR__OP_BARRIER: k = snprintf(buf, n, "no data"); break;
    case PAR__OP_ALLTOALLV: k = snprintf(buf, n, "%s", par_ctype_name((par_ctype)m->dtype)); break;
    case PAR__OP_ALLGATHERV:
        k = snprintf(buf, n, "%s x %llu in all, counts hash %08llx",
                     par_ctype_name((par_ctype)m->dtype), (unsigned long long)m->count,
                     (unsigned long long)(m->shape & 0xffffffffu));
        break;
    default:
        k = snprintf(buf, n, "%s x %llu", par_ctype_name((par_ctype)m->dtype),
                     (unsigned long long)m->count);
    }
    if (k < 0 || (size_t)k >= n)
        return;
    buf += k, n -= (size_t)k;
    if (m->redop >= 0)
        k = snprintf(buf, n, ", %s", par_redop_name((par_redop)m->redop));
    else if (m->root >= 0)
        k = snprintf(buf, n, ", root %d", m->root);
    else
        k = 0;
    if (k < 0 || (size_t)k >= n)
        return;
    buf += k, n -= (size_t)k;
    if (m->phase)
        snprintf(buf, n, ", step %d)", m->phase);
    else
        snprintf(buf, n, ")");
}

/* Equal calls, rank aside. */
static int same_call(const par__callmeta *a, const par__callmeta *b)
{
    return a->group_id == b->group_id && a->seq == b->seq && a->op == b->op &&
           a->dtype == b->dtype && a->redop == b->redop && a->root == b->root &&
           a->phase == b->phase && a->shape == b->shape &&
           (a->count == b->count || a->op == PAR__OP_ALLTOALLV);
}

#define META(r) ((const par__callmeta *)((const char *)metas + (size_t)(r) * stride))

/* Appends "a-b," style ranges of the ranks whose call equals `ref`. */
static size_t list_ranks(char *buf, size_t n, const par__callmeta *metas, size_t stride, int p,
                         const par__callmeta *ref)
{
    size_t used = 0;
    int first = 1;
    for (int r = 0; r < p; r++) {
        if (!same_call(META(r), ref))
            continue;
        int e = r;
        while (e + 1 < p && same_call(META(e + 1), ref))
            e++;
        int k = e > r ? snprintf(buf + used, n - used, "%s%d-%d", first ? "" : ",", r, e)
                      : snprintf(buf + used, n - used, "%s%d", first ? "" : ",", r);
        if (k < 0 || used + (size_t)k >= n)
            return used;
        used += (size_t)k;
        first = 0;
        r = e;
    }
    return used;
}

par_status par__check_metas(par_comm *c, const par__callmeta *metas, size_t stride)
{
    int p = c->size;
    const par__callmeta *m0 = META(0);
    int r = 1;
    while (r < p && same_call(META(r), m0))
        r++;
    if (r == p) {
        par__clock_sync(c, metas, stride);
        return PAR_OK;
    }

    /* Group equal calls: class representatives in order of first rank. */
    char msg[1000];
    size_t used = (size_t)snprintf(msg, sizeof msg,
                                   "collective mismatch in group %s of %d ranks:", c->name, p);
    int shown = 0, classes = 0;
    for (int i = 0; i < p && used < sizeof msg - 1; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = same_call(META(j), META(i));
        if (seen)
            continue;
        classes++;
        if (shown == 6)
            continue;
        shown++;
        char d[200];
        par__meta_describe(META(i), c->name, d, sizeof d);
        int many = 0;
        for (int j = i + 1; j < p && !many; j++)
            many = same_call(META(j), META(i));
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s rank%s ",
                                 shown > 1 ? ";" : "", many ? "s" : "");
        if (used >= sizeof msg - 1)
            break;
        used += list_ranks(msg + used, sizeof msg - used, metas, stride, p, META(i));
        if (used >= sizeof msg - 1)
            break;
        used += (size_t)snprintf(msg + used, sizeof msg - used, " called %s", d);
    }
    if (classes > shown && used < sizeof msg - 1)
        snprintf(msg + used, sizeof msg - used, "; and %d more different calls", classes - shown);
    /* Every member sees this: rank 0 logs the table, the others point to it. */
    par__world_fail(c->world, c->wrank, PAR_EMISMATCH, msg);
    if (c->rank == 0)
        return par_err(PAR_EMISMATCH, "%s", msg);
    return par_err(PAR_EMISMATCH, "collective mismatch in group %s (see rank 0 of the group)",
                   c->name);
}

par_status par__pair_mismatch(par_comm *c, const par__callmeta *m, int from, int to, size_t sent,
                              size_t expected)
{
    char d[200], msg[600];
    size_t es = par_ctype_size((par_ctype)m->dtype);
    if (!es)
        es = 1;
    par__meta_describe(m, c->name, d, sizeof d);
    snprintf(msg, sizeof msg,
             "%s: rank %d sends %zu elements (%zu bytes) to rank %d, which expects %zu elements "
             "(%zu bytes) from it",
             d, from, sent / es, sent, to, expected / es, expected);
    par__world_fail(c->world, c->wrank, PAR_EMISMATCH, msg);
    return par_err(PAR_EMISMATCH, "%s", msg);
}

par_status par__wait_failed(par_comm *c, par_status st, const char *what, const int *missing,
                            int nmissing)
{
    par__world *w = c->world;
    par_status f = par__world_failed(w);
    char msg[1000];
    if (st != PAR_ETIMEOUT && f != PAR_ETIMEOUT) {
        int fr;
        pthread_mutex_lock(&w->fail_mu);
        fr = w->fail_rank;
        snprintf(msg, sizeof msg, "rank %d stopped waiting for %s: rank %d failed (%s): %s",
                 c->wrank, what, fr, par_status_str(f), w->fail_msg);
        pthread_mutex_unlock(&w->fail_mu);
        return par_err(PAR_ECOMM, "%s", msg);
    }
    size_t used;
    if (st == PAR_ETIMEOUT)
        used = (size_t)snprintf(msg, sizeof msg, "timed out after %.3g s waiting for %s",
                                par__world_timeout(w), what);
    else
        used = (size_t)snprintf(msg, sizeof msg, "stopped (the world timed out) waiting for %s",
                                what);
    for (int i = 0; i < nmissing && used < sizeof msg - 1; i++) {
        if (i == 4) {
            snprintf(msg + used, sizeof msg - used, "; and %d more missing", nmissing - i);
            break;
        }
        char d[300];
        int wr = c->world_ranks[missing[i]];
        par__rank_describe(w, wr, d, sizeof d);
        used += (size_t)snprintf(msg + used, sizeof msg - used,
                                 "; missing rank %d (world rank %d): %s", missing[i], wr, d);
    }
    if (st == PAR_ETIMEOUT)
        par__world_fail(w, c->wrank, PAR_ETIMEOUT, msg);
    return par_err(PAR_ETIMEOUT, "%s", msg);
}
