/* comm/group.c - group handles and par_comm_split. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"

int par_comm_rank(const par_comm *c) { return c ? c->rank : -1; }
int par_comm_size(const par_comm *c) { return c ? c->size : 0; }

int par_comm_world_rank(const par_comm *c, int r)
{
    return c && r >= 0 && r < c->size ? c->world_ranks[r] : -1;
}

const char *par_comm_name(const par_comm *c) { return c ? c->name : "(null)"; }

void par_comm_set_name(par_comm *c, const char *name)
{
    if (c && name)
        snprintf(c->name, sizeof c->name, "%s", name);
}

par_status par__comm_new(par__world *w, int wrank, int rank, int size, const int *world_ranks,
                         uint64_t id, const char *name, void *bgroup, par_comm **out)
{
    par_comm *c = par_calloc(1, sizeof *c, PAR_TAG_COMM);
    if (!c)
        goto fail_nomem;
    if (world_ranks) {
        c->world_ranks = par_malloc((size_t)size * sizeof *c->world_ranks, PAR_TAG_COMM);
        if (!c->world_ranks)
            goto fail_free_comm;
        memcpy(c->world_ranks, world_ranks, (size_t)size * sizeof *c->world_ranks);
    } else {
        c->world_ranks = w->ident;
    }
    if (size <= PAR__SCRATCH_KEEP && !(c->scratch = par_malloc((size_t)size * 4 * sizeof *c->scratch, PAR_TAG_COMM)))
        goto fail_free_comm;
    c->world = w;
    c->rank = rank;
    c->size = size;
    c->wrank = wrank;
    c->id = id;
    c->bgroup = bgroup;
    snprintf(c->name, sizeof c->name, "%s", name);
    par__rankstate *rs = &w->ranks[wrank];
    c->live_next = rs->comms;
    if (rs->comms)
        rs->comms->live_prev = c;
    rs->comms = c;
    *out = c;
    return PAR_OK;

fail_free_comm:
    if (c->world_ranks != w->ident)
        par_free(c->world_ranks);
    par_free(c->scratch);
    par_free(c);
fail_nomem:
    return par_err(PAR_ENOMEM, "comm: no memory for a handle on group %s of %d ranks", name, size);
}

void par__comm_destroy(par_comm *c)
{
    par__rankstate *rs = &c->world->ranks[c->wrank];
    if (c->live_prev)
        c->live_prev->live_next = c->live_next;
    else
        rs->comms = c->live_next;
    if (c->live_next)
        c->live_next->live_prev = c->live_prev;
    c->world->be->group_free(c, c->bgroup);
    if (c->world_ranks != c->world->ident)
        par_free(c->world_ranks);
    par_free(c->scratch);
    par_free(c);
}

par_status par__scratch_take(par_comm *c)
{
    if (c->scratch)
        return PAR_OK;
    c->scratch = par_malloc((size_t)c->size * 4 * sizeof *c->scratch, PAR_TAG_COMM);
    if (!c->scratch)
        return par_err(PAR_ENOMEM, "comm: no memory for the count arrays of group %s (%d ranks)", c->name,
                       c->size);
    c->scratch_call = 1;
    return PAR_OK;
}

void par__scratch_drop(par_comm *c)
{
    if (!c->scratch_call)
        return;
    par_free(c->scratch);
    c->scratch = NULL;
    c->scratch_call = 0;
}

void par_comm_free(par_comm *c)
{
    if (!c || c->id == 0x77u)  /* the world belongs to par_world_run */
        return;
    par__comm_destroy(c);
}

/* splitmix64 */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct {
    int32_t key;
    int32_t rank;
} keyrank;

static int cmp_keyrank(const void *a, const void *b)
{
    const keyrank *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

par_status par_comm_split(par_comm *c, int color, int key, par_comm **out)
{
    if (!c || !out)
        return par_err(PAR_EINVAL, "par_comm_split: comm and out are required");
    par_status st = par__check_world(c, "split");
    if (st != PAR_OK)
        return st;
    if (color < 0)
        color = PAR_UNDEFINED;
    int p = c->size, me = c->rank;
    par__callmeta m = {.group_id = c->id, .seq = ++c->seq, .count = 2, .op = PAR__OP_SPLIT,
                       .dtype = PAR_C_I32, .redop = -1, .root = -1, .rank = me};
    c->nsplit++;

    int32_t mine[2] = {color, key};
    if ((st = par__scratch_take(c)) != PAR_OK)
        return st;
    int32_t *all = par_malloc((size_t)p * sizeof mine, PAR_TAG_COMM);
    keyrank *members = par_malloc((size_t)p * sizeof *members, PAR_TAG_COMM);
    int *parent_ranks = par_malloc((size_t)p * sizeof *parent_ranks, PAR_TAG_COMM);
    int *wranks = par_malloc((size_t)p * sizeof *wranks, PAR_TAG_COMM);
    if (!all || !members || !parent_ranks || !wranks) {
        st = par_err(PAR_ENOMEM, "par_comm_split: no memory for %d ranks", p);
        goto fail_free;
    }
    size_t *sbytes = c->scratch, *roff = c->scratch + p, *rbytes = c->scratch + 2 * (size_t)p;
    for (int j = 0; j < p; j++) {
        sbytes[j] = sizeof mine;
        roff[j] = (size_t)j * sizeof mine;
        rbytes[j] = sizeof mine;
    }
    par__xfer x = {.sbase = (const char *)mine, .soff = NULL, .sbytes = sbytes,
                   .rbase = (char *)all, .roff = roff, .rbytes = rbytes};
    /* soff NULL: every peer gets the same 8 bytes at offset 0 */
    size_t *soff = c->scratch + 3 * (size_t)p;
    memset(soff, 0, (size_t)p * sizeof *soff);
    x.soff = soff;
    par__comm_account(c, &m, &x);
    par__call_enter(c, &m, -1);
    st = c->world->be->exchange(c, &m, &x);
    par__call_leave(c);
    par__comm_settle(c, &m, st);
    if (st != PAR_OK)
        goto fail_free;

    par__splitplan plan = {.color = color, .key = key, .parent_ranks = parent_ranks};
    int nm = 0;
    if (color >= 0) {
        for (int j = 0; j < p; j++)
            if (all[2 * j] == color)
                members[nm++] = (keyrank){all[2 * j + 1], j};
        qsort(members, (size_t)nm, sizeof *members, cmp_keyrank);
        plan.leader = p;
        for (int i = 0; i < nm; i++) {
            parent_ranks[i] = members[i].rank;
            wranks[i] = c->world_ranks[members[i].rank];
            if (members[i].rank == me)
                plan.rank = i;
            if (members[i].rank < plan.leader)
                plan.leader = members[i].rank;
        }
        plan.size = nm;
    }
    void *bg = NULL;
    par__call_enter(c, &m, -1);
    st = c->world->be->group_split(c, &plan, &bg);
    par__call_leave(c);
    if (st != PAR_OK)
        goto fail_free;
    par_comm *nc = NULL;
    if (color >= 0) {
        char name[64];
        snprintf(name, sizeof name, "%.40s/s%lluc%d", c->name, (unsigned long long)c->nsplit,
                 color);
        uint64_t id = mix(c->id ^ mix(c->nsplit * 0x100000001ull + (uint64_t)(uint32_t)color));
        if (id == 0x77u)
            id++;
        st = par__comm_new(c->world, c->wrank, plan.rank, nm, wranks, id, name, bg, &nc);
        if (st != PAR_OK) {
            c->world->be->group_free(NULL, bg);
            goto fail_free;
        }
    }
    *out = nc;

fail_free:
    par__scratch_drop(c);
    par_free(all);
    par_free(members);
    par_free(parent_ranks);
    par_free(wranks);
    return st;
}
