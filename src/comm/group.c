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

void par__split_tables(par__world *w)
{
    size_t n = (size_t)w->n, *bytes = w->split_x, *roff = bytes + n, *soff = roff + n;
    for (size_t j = 0; j < n; j++) {
        bytes[j] = PAR__SPLIT_REC;
        roff[j] = j * PAR__SPLIT_REC;
        soff[j] = 0;
    }
}

/* Every member's (color, key) into all[2 * j], all[2 * j + 1]: one
 * exchange, every peer getting the same 8 bytes from offset 0.  The ranges
 * are the world's shared tables (no per-rank arrays of the group's size but
 * `all` itself). */
static par_status split_gather(par_comm *c, par__callmeta *m, const int32_t mine[2], int32_t *all)
{
    size_t n = (size_t)c->world->n;
    const size_t *bytes = c->world->split_x, *roff = bytes + n, *soff = roff + n;
    par__xfer x = {.sbase = (const char *)mine, .soff = soff, .sbytes = bytes,
                   .rbase = (char *)all, .roff = roff, .rbytes = bytes};
    par__comm_account(c, m, &x);
    par__call_enter(c, m, -1);
    par_status st = c->world->be->exchange(c, m, &x);
    par__call_leave(c);
    par__comm_settle(c, m, st);
    return st;
}

/* The plan of this rank's color from every member's (color, key): members
 * ordered by key, ties by parent rank; parent_ranks / wranks are allocated
 * with the group's size (*parent_ranks NULL for no color).  Frees nothing
 * of its outputs on failure: the caller does. */
static par_status split_plan(par_comm *c, const int32_t *all, par__splitplan *plan,
                             int **parent_ranks, int **wranks)
{
    int p = c->size, nm = 0;
    if (plan->color < 0)
        return PAR_OK;
    for (int j = 0; j < p; j++)
        nm += all[2 * j] == plan->color;
    keyrank *members = par_malloc((size_t)nm * sizeof *members, PAR_TAG_COMM);
    *parent_ranks = par_malloc((size_t)nm * sizeof **parent_ranks, PAR_TAG_COMM);
    *wranks = par_malloc((size_t)nm * sizeof **wranks, PAR_TAG_COMM);
    if (!members || !*parent_ranks || !*wranks) {
        par_free(members);
        return par_err(PAR_ENOMEM, "par_comm_split: no memory for a group of %d of %d ranks",
                       nm, p);
    }
    for (int j = 0, k = 0; j < p; j++)
        if (all[2 * j] == plan->color)
            members[k++] = (keyrank){all[2 * j + 1], j};
    qsort(members, (size_t)nm, sizeof *members, cmp_keyrank);
    plan->leader = p;
    for (int i = 0; i < nm; i++) {
        (*parent_ranks)[i] = members[i].rank;
        (*wranks)[i] = c->world_ranks[members[i].rank];
        if (members[i].rank == c->rank)
            plan->rank = i;
        if (members[i].rank < plan->leader)
            plan->leader = members[i].rank;
    }
    plan->size = nm;
    plan->parent_ranks = *parent_ranks;
    par_free(members);
    return PAR_OK;
}

/* The new handle of a member; its id and name derive from the parent's. */
static par_status split_handle(par_comm *c, const par__splitplan *plan, const int *wranks,
                               void *bg, par_comm **out)
{
    char name[64];
    snprintf(name, sizeof name, "%.40s/s%lluc%d", c->name, (unsigned long long)c->nsplit,
             plan->color);
    uint64_t id = mix(c->id ^ mix(c->nsplit * 0x100000001ull + (uint64_t)(uint32_t)plan->color));
    if (id == 0x77u)
        id++;
    par_status st = par__comm_new(c->world, c->wrank, plan->rank, plan->size, wranks, id, name,
                                  bg, out);
    if (st != PAR_OK)
        c->world->be->group_free(NULL, bg);
    return st;
}

/* Per rank: 8 bytes per parent member (the gathered colors and keys, freed
 * before the group is made) and O(new group) for the plan; the exchange's
 * ranges are the world's shared tables (docs/comm.md "Groups"). */
par_status par_comm_split(par_comm *c, int color, int key, par_comm **out)
{
    if (!c || !out)
        return par_err(PAR_EINVAL, "par_comm_split: comm and out are required");
    par_status st = par__check_world(c, "split");
    if (st != PAR_OK)
        return st;
    if (color < 0)
        color = PAR_UNDEFINED;
    par__callmeta m = {.group_id = c->id, .seq = ++c->seq, .count = 2, .op = PAR__OP_SPLIT,
                       .dtype = PAR_C_I32, .redop = -1, .root = -1, .rank = c->rank};
    c->nsplit++;

    int32_t mine[2] = {color, key};
    int *parent_ranks = NULL, *wranks = NULL;
    par__splitplan plan = {.color = color, .key = key};
    int32_t *all = par_malloc((size_t)c->size * sizeof mine, PAR_TAG_COMM);
    if (!all) {
        st = par_err(PAR_ENOMEM, "par_comm_split: no memory for %d ranks", c->size);
        goto fail_free;
    }
    if ((st = split_gather(c, &m, mine, all)) != PAR_OK)
        goto fail_free;
    st = split_plan(c, all, &plan, &parent_ranks, &wranks);
    par_free(all);
    all = NULL;
    if (st != PAR_OK)
        goto fail_free;
    void *bg = NULL;
    par__call_enter(c, &m, -1);
    st = c->world->be->group_split(c, &plan, &bg);
    par__call_leave(c);
    if (st != PAR_OK)
        goto fail_free;
    par_comm *nc = NULL;
    if (color >= 0 && (st = split_handle(c, &plan, wranks, bg, &nc)) != PAR_OK)
        goto fail_free;
    *out = nc;

fail_free:
    par_free(all);
    par_free(parent_ranks);
    par_free(wranks);
    return st;
}
