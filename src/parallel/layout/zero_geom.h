/* parallel/layout/zero_geom.h - the geometry of a data-parallel optimizer plan
 * (untemplated): which rank of a data-parallel group owns which optimizer
 * state, and how the group's gradients are packed for the reduction.
 * docs/parallel.md, "ZeRO-1 and Muon ownership".
 *
 * A geometry covers the tensors ONE data-parallel group replicates (a
 * subset of the parameter table: the driver builds one for the dense tensors
 * over the attention DP(xCP) group and one for the routed-expert tensors over
 * the expert-DP group).  Entries without an optimizer (gate.bias, tid2eid)
 * are accepted in the list and ignored.  It is a pure function of (table,
 * list, group size): every rank of the group builds the same one, and
 * anyone can build it for any rank without a model or a precision (the
 * checkpoint owner rule, parallel/ckpt/ckpt_owner.h; memory planning).  It holds
 * no optimizer state and does no communication: the executor
 * (parallel/dp/zero.h, templated) adds those.
 *
 * Packed layout (both modes): the group's gradients travel in one buffer of
 * dp segments of `seg` elements.  Segment q = [AdamW shard q | Muon matrices
 * owned by q | zero padding]:
 *   - AdamW tensors are concatenated in table order into a flat buffer of
 *     n_adamw elements, padded with zeros to dp * shard (shard =
 *     ceil(n_adamw / dp)); shard q is flat[q*shard, (q+1)*shard).  A tensor
 *     may straddle shard borders.
 *   - Muon matrices are assigned whole to owners (greedy: by numel
 *     descending, ties by table order; each to the least-loaded rank so far,
 *     ties to the lower rank).  Rank q's matrices follow its AdamW shard in
 *     table order, then zeros up to load_max.  seg = shard + load_max.
 * Under ZeRO-1 rank q holds the optimizer state of segment q only (its
 * AdamW shard, the momentum of its Muon matrices); replicated, every rank
 * holds all of it.  Padding is never state, never a parameter.
 *
 *   par_zero_geom g;
 *   par_zero_geom_build(&g, &table, idx, n_idx, dp, rank);
 *   for (int q = 0; q < dp; q++)       // what segment q holds of entry i
 *       if (par_zero_geom_piece(&g, i, q, &begin, &end)) ...;
 *   par_zero_geom_memory(&g, PAR_DP_ZERO1, sizeof(double), &mem);
 *   par_zero_geom_free(&g);
 */
#ifndef PAR_PARALLEL_LAYOUT_ZERO_GEOM_H
#define PAR_PARALLEL_LAYOUT_ZERO_GEOM_H

#include <stdint.h>

#include "core/status.h"
#include "model/params.h"

typedef enum {
    PAR_DP_REPLICATED = 0, /* every replica holds the full state, all-reduce   */
    PAR_DP_ZERO1 = 1,      /* --use-distributed-optimizer: state sharded       */
} par_dp_mode;

/* Elements per all-reduce of the replicated reduction (zero.c): it bounds a
 * rank's transient pack + staging (2 x 1 MiB in f64) whatever the plan's
 * size; v4-tiny's plans fit in one call.  The memory model reads it. */
#define PAR_ZERO_REDUCE_CHUNK ((int64_t)1 << 17)

/* par_zero_geom_owner answers for tensors that are not whole-matrix owned. */
#define PAR_ZERO_ABSENT (-1)  /* not in the plan (or no optimizer)            */
#define PAR_ZERO_SHARDED (-2) /* AdamW: sharded element-wise over every rank  */

/* One optimized tensor of the plan. */
typedef struct {
    int idx;        /* parameter table index                                   */
    par_opt_kind opt;
    int64_t numel;
    int owner;      /* Muon: owning rank; AdamW: PAR_ZERO_SHARDED              */
    int64_t pos;    /* AdamW: start in the flat AdamW buffer [0, n_adamw);
                       Muon: start in the owner's Muon block [0, load[owner])  */
    int64_t off;    /* start in the flat buffers the plan reads and writes: the
                       table's offset, unless the caller maps the tensors
                       elsewhere (dp_step.c: the model's local buffers)        */
} par_zero_entry;

/* Bytes of optimizer state and workspace of one rank. */
typedef struct {
    int64_t adamw_state;  /* exp_avg + exp_avg_sq this rank holds            */
    int64_t muon_state;   /* momentum this rank holds                        */
    int64_t full_state;   /* the group's whole state, unsharded (no padding) */
    int64_t workspace;    /* packed gradient/gather buffers (comm tag)       */
} par_zero_memory;

/* The members of a geometry.  One list for two views: par_zero_geom below,
 * and the templated executor's plan (parallel/dp/zero.h), which holds them in a
 * union with an anonymous struct of the same list, so the executor reads
 * pl->shard and passes &pl->geom to the functions here (the Linux kernel's
 * struct_group idiom). */
#define PAR_ZERO_GEOM_MEMBERS                                                                                  \
    const par_param_table *t; /* borrowed; must outlive the geometry                */                       \
    int dp, rank;             /* group size; the rank it was built for              */                       \
    int n;                    /* optimized tensors                                  */                       \
    par_zero_entry *e;        /* [n], table order                                   */                       \
    int *owned;               /* [Muon entries] by (owner, table order)             */                       \
    int *owned_begin;         /* [dp+1]: rank q owns owned[owned_begin[q] .. [q+1]) */                       \
    int64_t n_adamw;          /* AdamW elements (unpadded)                          */                       \
    int64_t shard;            /* ceil(n_adamw / dp)                                 */                       \
    int64_t n_muon;           /* Muon elements                                      */                       \
    int64_t *load;            /* [dp] Muon elements owned by each rank              */                       \
    int64_t *muon_base;       /* [dp+1] prefix sums of load                         */                       \
    int64_t load_max;         /* max over ranks of load                             */                       \
    int64_t largest;          /* numel of the largest Muon matrix                   */                       \
    int64_t seg;              /* shard + load_max: one segment of the packed buffer */

typedef struct {
    PAR_ZERO_GEOM_MEMBERS
} par_zero_geom;

/* Builds the geometry of the tensors idx[0..n_idx) (any order, no repeats,
 * entries without optimizer ignored) for rank `rank` of a group of `dp`
 * ranks (tables: PAR_TAG_MODEL).  Errors: PAR_EINVAL (no table, a tensor
 * listed twice, dp < 1), PAR_ERANGE (an index outside the table, rank
 * outside [0, dp)).  The table must outlive the geometry. */
par_status par_zero_geom_build(par_zero_geom *g, const par_param_table *t, const int *idx, int n_idx, int dp,
                               int rank);
/* The same with each entry's held size numel[idx] (a tensor-parallel
 * shard's; parallel/layout/tp_split.h) instead of the table's; numel NULL: the
 * table's.  The plan is a pure function of (table, sizes, list, dp): every
 * TP rank builds the same one over its same-shaped shards. */
par_status par_zero_geom_build_sized(par_zero_geom *g, const par_param_table *t, const int64_t *numel,
                                     const int *idx, int n_idx, int dp, int rank);
void par_zero_geom_free(par_zero_geom *g); /* zeroes *g; NULL is fine */

/* Owner of table entry idx: the rank owning a Muon matrix, PAR_ZERO_SHARDED
 * for an AdamW tensor, PAR_ZERO_ABSENT otherwise. */
int par_zero_geom_owner(const par_zero_geom *g, int idx);
/* The index in g->e of table entry idx, -1 when the plan does not optimize
 * it (a binary search of e, which is in table order: no [t->n] map per
 * rank). */
int par_zero_geom_entry(const par_zero_geom *g, int idx);

/* The elements [*begin, *end) of table entry idx (element indices of the
 * tensor) whose optimizer state segment q holds: AdamW, the part of the
 * tensor inside shard q; Muon, the whole matrix when q owns it.  Returns 1
 * when non-empty; 0 (and *begin = *end = 0) for an empty piece, an entry not
 * in the plan or q outside [0, dp). */
int par_zero_geom_piece(const par_zero_geom *g, int idx, int q, int64_t *begin, int64_t *end);

/* The memory of rank g->rank in `mode` with elements of elem_bytes bytes
 * (8 for f64, 4 for f32). */
void par_zero_geom_memory(const par_zero_geom *g, par_dp_mode mode, int64_t elem_bytes, par_zero_memory *out);

#endif
