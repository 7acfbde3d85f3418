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

int par_comm_dev_copies(const par_comm *c) { return c && c->world->be->dev_copies; }

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
    par_free(c);
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

/* A member's entry at the leader of the split: (color, key, parent rank). */
typedef struct {
    int32_t color, key, rank;
} split_ent;

static int cmp_ent(const void *a, const void *b)
{
    const split_ent *x = a, *y = b;
    if (x->color != y->color)
        return x->color < y->color ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* What parent rank 0 tells each member of its new group. */
typedef struct {
    int32_t size, rank, leader, pad;
} split_head;

/* Parent rank 0's tables: heads [p], and the parent ranks of every new
 * group packed by color (list [p]), member j's at list + at[j], n[j] long. */
typedef struct {
    split_head *heads;
    int *list;
    size_t *at, *n;
} split_tables;

static void split_tables_free(split_tables *t)
{
    par_free(t->heads);
    par_free(t->list);
    par_free(t->at);
    par_free(t->n);
}

/* On parent rank 0 only, from every member's (color, key) in all[2 j],
 * all[2 j + 1]: members of a color ordered by key, ties by parent rank (one
 * sort of p entries instead of a scan of p on every member). */
static par_status split_solve(int p, const int32_t *all, split_tables *t)
{
    split_ent *e = par_malloc((size_t)p * sizeof *e, PAR_TAG_COMM);
    t->heads = par_calloc((size_t)p, sizeof *t->heads, PAR_TAG_COMM);
    t->list = par_malloc((size_t)p * sizeof *t->list, PAR_TAG_COMM);
    t->at = par_calloc((size_t)p, sizeof *t->at, PAR_TAG_COMM);
    t->n = par_calloc((size_t)p, sizeof *t->n, PAR_TAG_COMM);
    if (!e || !t->heads || !t->list || !t->at || !t->n) {
        par_free(e);
        return par_err(PAR_ENOMEM, "par_comm_split: no memory for the plan of %d ranks", p);
    }
    int ne = 0;
    for (int j = 0; j < p; j++)
        if (all[2 * j] >= 0)
            e[ne++] = (split_ent){all[2 * j], all[2 * j + 1], j};
    qsort(e, (size_t)ne, sizeof *e, cmp_ent);
    for (int i = 0; i < ne;) {
        int k = i, leader = e[i].rank;
        while (k < ne && e[k].color == e[i].color) {
            leader = e[k].rank < leader ? e[k].rank : leader;
            t->list[k] = e[k].rank;
            k++;
        }
        for (int q = i; q < k; q++) {
            int j = e[q].rank;
            t->heads[j] = (split_head){k - i, q - i, leader, 0};
            t->at[j] = (size_t)i;
            t->n[j] = (size_t)(k - i);
        }
        i = k;
    }
    par_free(e);
    return PAR_OK;
}

/* One step of the split's exchange.  Only step 0 is charged on the virtual
 * clock (the split is modeled as the all-gather of (color, key) it stands
 * for, clock.c); steps 1 and 2 move the plan without a clock event. */
static par_status split_step(par_comm *c, par__callmeta *m, int phase, const par__xfer *x)
{
    m->phase = phase;
    if (phase == 0) {
        par__comm_account(c, m, x);
    } else {
        m->vclock = 0;
        m->vcost = 0;
    }
    par__call_enter(c, m, -1);
    par_status st = c->world->be->exchange(c, m, x);
    par__call_leave(c);
    if (phase == 0)
        par__comm_settle(c, m, st);
    return st;
}

/* The plan of this rank's color: every member sends (color, key) to parent
 * rank 0, which sorts them and sends each member its place (size, rank,
 * leader) and then the parent ranks of its group.  Per rank O(new group)
 * (parent rank 0: O(parent) for one split); *parent_ranks and *wranks are
 * allocated with the group's size (NULL for no color).  Frees nothing of
 * its outputs on failure: the caller does. */
static par_status split_plan(par_comm *c, par__callmeta *m, par__splitplan *plan,
                             int **parent_ranks, int **wranks)
{
    int p = c->size, root = c->rank == 0;
    int32_t mine[2] = {plan->color, plan->key}, *all = NULL;
    split_tables t = {0};
    split_head head = {0};
    par_status st = PAR_OK;
    if (root && !(all = par_malloc((size_t)p * sizeof mine, PAR_TAG_COMM)))
        return par_err(PAR_ENOMEM, "par_comm_split: no memory for %d ranks", p);
    par__xfer x0 = {(const char *)mine, {0}, PAR__COL_AT1(0, sizeof mine), (char *)all,
                    PAR__COL_S(sizeof mine), root ? PAR__COL_C(sizeof mine) : (par__col){0}, 1};
    if ((st = split_step(c, m, 0, &x0)) == PAR_OK && root && (st = split_solve(p, all, &t)) != PAR_OK)
        par__world_fail(c->world, c->wrank, st, par_last_error()); /* the members wait in step 1 */
    par_free(all);
    par__xfer x1 = {(const char *)t.heads, PAR__COL_S(sizeof head),
                    root ? PAR__COL_C(sizeof head) : (par__col){0}, (char *)&head, {0},
                    PAR__COL_AT1(0, sizeof head), 1};
    if (st == PAR_OK && (st = split_step(c, m, 1, &x1)) == PAR_OK && plan->color >= 0) {
        *parent_ranks = par_malloc((size_t)head.size * sizeof **parent_ranks, PAR_TAG_COMM);
        *wranks = par_malloc((size_t)head.size * sizeof **wranks, PAR_TAG_COMM);
        if (!*parent_ranks || !*wranks) {
            st = par_err(PAR_ENOMEM, "par_comm_split: no memory for a group of %d of %d ranks",
                         (int)head.size, p);
            par__world_fail(c->world, c->wrank, st, par_last_error()); /* rank 0 waits in step 2 */
        }
    }
    par__xfer x2 = {.rbase = (char *)*parent_ranks,
                    .rbytes = PAR__COL_AT1(0, (size_t)head.size * sizeof(int))};
    if (root) {
        x2.sbase = (const char *)t.list;
        x2.soff = (par__col){.kind = PAR__COL_ARRAY, .b = sizeof(int), .v = t.at};
        x2.sbytes = (par__col){.kind = PAR__COL_ARRAY, .b = sizeof(int), .v = t.n};
    }
    if (st == PAR_OK)
        st = split_step(c, m, 2, &x2);
    split_tables_free(&t);
    if (st != PAR_OK || plan->color < 0)
        return st;
    for (int i = 0; i < head.size; i++)
        (*wranks)[i] = c->world_ranks[(*parent_ranks)[i]];
    plan->size = head.size;
    plan->rank = head.rank;
    plan->leader = head.leader;
    plan->parent_ranks = *parent_ranks;
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

/* Per rank O(new group): the plan comes from parent rank 0, which alone
 * holds O(parent) for the call (docs/comm.md "Groups"). */
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

    int *parent_ranks = NULL, *wranks = NULL;
    par__splitplan plan = {.color = color, .key = key};
    if ((st = split_plan(c, &m, &plan, &parent_ranks, &wranks)) != PAR_OK)
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
    par_free(parent_ranks);
    par_free(wranks);
    return st;
}
