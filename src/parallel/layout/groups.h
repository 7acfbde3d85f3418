/* parallel/layout/groups.h - rank coordinates and process groups of a layout, in
 * Megatron-LM's rank order (RankGenerator, order "tp-cp-ep-dp-pp").
 *
 * Attention (dense) side, fastest first:  tp, cp, dp, pp
 *   rank = tp + TP*(cp + CP*(dp + Da*pp))
 * Expert side, fastest first:             etp, ep, edp, pp
 *   rank = etp + ETP*(ep + EP*(edp + De*pp))
 * Both sides agree on pp (N/PP ranks per stage, stage pp holds ranks
 * [pp*N/PP, (pp+1)*N/PP)).  docs/layouts.md has a worked example.
 *
 * Member lists are pure functions of (layout, world rank); the group's ranks
 * are listed with the fastest coordinate varying fastest (ascending world
 * ranks), and every member of a group gets the same list.
 * par_groups_build makes this rank's par_comm handles from the world.
 */
#ifndef PAR_PARALLEL_LAYOUT_GROUPS_H
#define PAR_PARALLEL_LAYOUT_GROUPS_H

#include "comm/comm.h"
#include "core/status.h"
#include "parallel/layout/layout.h"

typedef struct {
    int tp, cp, dp, pp; /* attention coordinates (dp: index in Da)  */
    int etp, ep, edp;   /* expert coordinates (edp: index in De)    */
} par_rank_coords;

typedef enum {
    PAR_GROUP_TP = 0, /* tensor parallel (size TP)                                */
    PAR_GROUP_CP,     /* context parallel (CP)                                    */
    PAR_GROUP_DP,     /* attention data parallel (Da)                             */
    PAR_GROUP_TP_CP,  /* TP x CP                                                  */
    PAR_GROUP_DP_CP,  /* Da x CP: the dense-gradient group ("attention DP x CP")  */
    PAR_GROUP_PP,     /* pipeline (PP)                                            */
    PAR_GROUP_EP,     /* expert parallel (EP)                                     */
    PAR_GROUP_ETP,    /* expert tensor parallel (ETP)                             */
    PAR_GROUP_EDP,    /* expert data parallel (De): the expert-gradient group     */
    PAR_GROUP_EMBED,  /* stages holding E or m of this rank's PP group (embed.weight) */
    PAR_GROUP_MTP,    /* stages holding L or m of this rank's PP group (head.weight)  */
    PAR_GROUP_COUNT
} par_group_kind;

/* "tp", "cp", "dp", "tp-cp", "dp-cp", "pp", "ep", "etp", "edp", "embd",
 * "mtp"; NULL for an invalid kind. */
const char *par_group_name(par_group_kind k);

/* Coordinates of world rank r of a resolved layout (PAR_ERANGE for a rank
 * outside [0, N), PAR_EINVAL for an unresolved layout). */
par_status par_rank_coords_of(const par_layout *l, int rank, par_rank_coords *out);
/* World rank from attention coordinates (tp, cp, dp, pp) or from expert
 * coordinates (etp, ep, edp, pp); -1 when a coordinate is out of range. */
int par_rank_of_attn(const par_layout *l, int tp, int cp, int dp, int pp);
int par_rank_of_expert(const par_layout *l, int etp, int ep, int edp, int pp);

/* Members (world ranks, in group order) of rank's group of kind k into
 * members[cap]; *n their count.  For EMBED and MTP, a rank outside the group
 * gets *n = 0.  PAR_ERANGE when cap is too small (*n then holds the size). */
par_status par_group_members(const par_layout *l, par_group_kind k, int rank, int *members, int cap,
                             int *n);
/* Size of kind k's groups (EMBED/MTP: of the group rank belongs to, 0 if
 * none). */
int par_group_size(const par_layout *l, par_group_kind k, int rank);

/* One rank's handles; NULL where the rank is in no group of that kind. */
typedef struct {
    par_comm *g[PAR_GROUP_COUNT];
} par_groups;

/* Collective over `world` (every rank calls it): splits the world into every
 * group kind with colors from the member lists (color: the group's first
 * member, key: the rank's position in it) and names each handle
 * "<kind>:<first member>".  The world's size must equal the layout's N.
 * On failure no handle is left open. */
par_status par_groups_build(par_comm *world, const par_layout *l, par_groups *out);
void par_groups_free(par_groups *g);

/* One rank's view of the layout: the resolved layout, the world, its
 * coordinates and group handles. */
typedef struct {
    const par_layout *lay; /* resolved */
    par_comm *world;
    par_groups g;          /* this rank's handles (par_groups_build) */
    par_rank_coords rc;
    int rank, N;
} par_pctx;

#endif
