/* parallel/layout/groups.c - Megatron-LM's orthogonal rank groups (see groups.h). */
#include "parallel/layout/groups.h"

#include "core/alloc.h"

#include <stdio.h>
#include <string.h>

static const char *const group_names[PAR_GROUP_COUNT] = {
    "tp", "cp", "dp", "tp-cp", "dp-cp", "pp", "ep", "etp", "edp", "embd", "mtp",
};

const char *par_group_name(par_group_kind k)
{
    if ((int)k < 0 || k >= PAR_GROUP_COUNT)
        return NULL;
    return group_names[k];
}

/* A rank grid: four dimensions, fastest first. */
typedef struct {
    int size[4];
} grid;

static grid attn_grid(const par_layout *l)
{
    grid g = {{(int)l->tp, (int)l->cp, (int)l->da, (int)l->pp}};
    return g;
}

static grid expert_grid(const par_layout *l)
{
    grid g = {{(int)l->etp, (int)l->ep, (int)l->de, (int)l->pp}};
    return g;
}

static void decompose(const grid *g, int rank, int c[4])
{
    for (int d = 0; d < 4; d++) {
        c[d] = rank % g->size[d];
        rank /= g->size[d];
    }
}

static int compose(const grid *g, const int c[4])
{
    int r = 0;
    for (int d = 3; d >= 0; d--) {
        if (c[d] < 0 || c[d] >= g->size[d])
            return -1;
        r = r * g->size[d] + c[d];
    }
    return r;
}

/* Megatron's generate_masked_orthogonal_rank_groups for one rank: the masked
 * dimensions run (first masked fastest), the others stay at the rank's
 * coordinates.  Returns the group size. */
static int masked_members(const grid *g, unsigned mask, int rank, int *members, int cap)
{
    int c[4];
    decompose(g, rank, c);
    int size = 1;
    for (int d = 0; d < 4; d++)
        if (mask & (1u << d))
            size *= g->size[d];
    if (size > cap)
        return size;
    for (int i = 0; i < size; i++) {
        int rest = i;
        for (int d = 0; d < 4; d++)
            if (mask & (1u << d)) {
                c[d] = rest % g->size[d];
                rest /= g->size[d];
            }
        members[i] = compose(g, c);
    }
    return size;
}

par_status par_rank_coords_of(const par_layout *l, int rank, par_rank_coords *out)
{
    if (!l->resolved)
        return par_err(PAR_EINVAL, "rank coordinates: the layout is not resolved (call par_layout_resolve)");
    if (rank < 0 || rank >= l->world)
        return par_err(PAR_ERANGE, "rank coordinates: rank %d is outside the world of %lld ranks", rank,
                       (long long)l->world);
    grid a = attn_grid(l), e = expert_grid(l);
    int ca[4], ce[4];
    decompose(&a, rank, ca);
    decompose(&e, rank, ce);
    out->tp = ca[0];
    out->cp = ca[1];
    out->dp = ca[2];
    out->pp = ca[3];
    out->etp = ce[0];
    out->ep = ce[1];
    out->edp = ce[2];
    return PAR_OK;
}

int par_rank_of_attn(const par_layout *l, int tp, int cp, int dp, int pp)
{
    if (!l->resolved)
        return -1;
    grid a = attn_grid(l);
    int c[4] = {tp, cp, dp, pp};
    return compose(&a, c);
}

int par_rank_of_expert(const par_layout *l, int etp, int ep, int edp, int pp)
{
    if (!l->resolved)
        return -1;
    grid e = expert_grid(l);
    int c[4] = {etp, ep, edp, pp};
    return compose(&e, c);
}

/* Which block kinds put a pipeline stage into the EMBED / MTP group. */
static int stage_in(const par_layout *l, par_group_kind k, int pp_rank)
{
    par_block_kind first = k == PAR_GROUP_EMBED ? PAR_BLK_EMBED : PAR_BLK_LOSS;
    return par_layout_stage_has(l, pp_rank, first) || par_layout_stage_has(l, pp_rank, PAR_BLK_MTP);
}

/* Members of rank's group of kind k, written while they fit in cap; returns
 * the group size (0: rank in no such group), -1 for an unknown kind. */
static int members_of(const par_layout *l, par_group_kind k, int rank, int *members, int cap)
{
    grid a = attn_grid(l), e = expert_grid(l);
    switch (k) {
    case PAR_GROUP_TP: return masked_members(&a, 1u << 0, rank, members, cap);
    case PAR_GROUP_CP: return masked_members(&a, 1u << 1, rank, members, cap);
    case PAR_GROUP_DP: return masked_members(&a, 1u << 2, rank, members, cap);
    case PAR_GROUP_TP_CP: return masked_members(&a, 3u, rank, members, cap);
    case PAR_GROUP_DP_CP: return masked_members(&a, 6u, rank, members, cap);
    case PAR_GROUP_PP: return masked_members(&a, 1u << 3, rank, members, cap);
    case PAR_GROUP_ETP: return masked_members(&e, 1u << 0, rank, members, cap);
    case PAR_GROUP_EP: return masked_members(&e, 1u << 1, rank, members, cap);
    case PAR_GROUP_EDP: return masked_members(&e, 1u << 2, rank, members, cap);
    case PAR_GROUP_EMBED:
    case PAR_GROUP_MTP: {
        int c[4];
        decompose(&a, rank, c);
        if (!stage_in(l, k, c[3]))
            return 0;
        int size = 0;
        for (int s = 0; s < (int)l->pp; s++)
            if (stage_in(l, k, s)) {
                if (size < cap) {
                    c[3] = s;
                    members[size] = compose(&a, c);
                }
                size++;
            }
        return size;
    }
    default:
        return -1;
    }
}

par_status par_group_members(const par_layout *l, par_group_kind k, int rank, int *members, int cap,
                             int *n)
{
    if (!l->resolved)
        return par_err(PAR_EINVAL, "process groups: the layout is not resolved (call par_layout_resolve)");
    if (rank < 0 || rank >= l->world)
        return par_err(PAR_ERANGE, "process groups: rank %d is outside the world of %lld ranks", rank,
                       (long long)l->world);
    int size = members_of(l, k, rank, members, cap);
    if (size < 0)
        return par_err(PAR_EINVAL, "process groups: unknown group kind %d", (int)k);
    *n = size;
    if (size > cap)
        return par_err(PAR_ERANGE, "process groups: the %s group of rank %d has %d members, room for %d",
                       group_names[k], rank, size, cap);
    return PAR_OK;
}

int par_group_size(const par_layout *l, par_group_kind k, int rank)
{
    if (!l->resolved || rank < 0 || rank >= l->world)
        return 0;
    int size = members_of(l, k, rank, NULL, 0);
    return size < 0 ? 0 : size;
}

void par_groups_free(par_groups *g)
{
    for (int k = 0; k < PAR_GROUP_COUNT; k++) {
        par_comm_free(g->g[k]);
        g->g[k] = NULL;
    }
}

par_status par_groups_build(par_comm *world, const par_layout *l, par_groups *out)
{
    memset(out, 0, sizeof *out);
    if (!l->resolved)
        return par_err(PAR_EINVAL, "process groups: the layout is not resolved (call par_layout_resolve)");
    int rank = par_comm_rank(world);
    if (par_comm_size(world) != l->world)
        return par_err(PAR_EMISMATCH, "process groups: the world has %d ranks but the layout needs N = %lld",
                       par_comm_size(world), (long long)l->world);
    /* The member list of one group at a time, sized by that group (not by
     * the world: 4 N bytes on every rank of a world of N). */
    int stack_buf[256], *members = stack_buf, cap = (int)(sizeof stack_buf / sizeof stack_buf[0]);
    par_groups g;
    memset(&g, 0, sizeof g);
    par_status st = PAR_OK;
    for (int k = 0; k < PAR_GROUP_COUNT; k++) {
        int n = par_group_size(l, (par_group_kind)k, rank);
        if (n > cap) {
            if (members != stack_buf)
                par_free(members);
            if (!(members = par_malloc((size_t)n * sizeof *members, PAR_TAG_COMM))) {
                members = stack_buf;
                st = par_err(PAR_ENOMEM, "process groups: out of memory for a %s group of %d ranks",
                             group_names[k], n);
                break;
            }
            cap = n;
        }
        st = par_group_members(l, (par_group_kind)k, rank, members, cap, &n);
        if (st != PAR_OK)
            break;
        int color = PAR_UNDEFINED, key = 0;
        for (int i = 0; i < n; i++)
            if (members[i] == rank) {
                color = members[0];
                key = i;
            }
        if (n > 0 && color == PAR_UNDEFINED) {
            st = par_err(PAR_EINTERNAL, "process groups: rank %d is not in its own %s group", rank,
                         group_names[k]);
            break;
        }
        st = par_comm_split(world, color, key, &g.g[k]);
        if (st != PAR_OK)
            break;
        if (g.g[k]) {
            char name[48];
            snprintf(name, sizeof name, "%s:%d", group_names[k], members[0]);
            par_comm_set_name(g.g[k], name);
        }
    }
    if (members != stack_buf)
        par_free(members);
    if (st != PAR_OK) {
        par_groups_free(&g);
        return st;
    }
    *out = g;
    return PAR_OK;
}
