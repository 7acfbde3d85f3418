/* parallel/zero.h - data-parallel optimizer step: replicated DP and ZeRO-1
 * (--use-distributed-optimizer) with Muon ownership by whole matrices
 * (templated).  docs/parallel.md, "ZeRO-1 and Muon ownership", has the rules.
 *
 * A plan covers the tensors ONE data-parallel group replicates (a subset of
 * the parameter table: the driver builds one plan for the dense tensors over
 * the attention DP(xCP) group and one for the routed-expert tensors over the
 * expert-DP group).  Entries without an optimizer (gate.bias, tid2eid) are
 * accepted in the list and ignored.  Every rank of the group builds the same
 * plan (a pure function of the table, the list and the group size).
 *
 * Packed layout (both modes): the group's gradients travel in one buffer of
 * dp segments of `seg` elements.  Segment q = [AdamW shard q | Muon matrices
 * owned by q | zero padding]:
 *   - AdamW tensors are concatenated in table order into a flat buffer of
 *     n_adamw elements, padded with zeros to dp * shard (shard =
 *     ceil(n_adamw / dp)); shard q is flat[q*shard, (q+1)*shard).
 *   - Muon matrices are assigned whole to owners (greedy: by numel
 *     descending, ties by table order; each to the least-loaded rank so far,
 *     ties to the lower rank).  Rank q's matrices follow its AdamW shard in
 *     table order, then zeros up to load_max.  seg = shard + load_max.
 * Padding is zero in every gradient buffer and is never read back into
 * parameters or state.
 *
 * One step (both modes), each call collective over the group's comm:
 *   1. par_dp_reduce_grads: the ONE cross-rank gradient reduction: pack the
 *      local gradients, then ZeRO-1: reduce-scatter (rank r gets segment r,
 *      summed in rank order); replicated: all-reduce of the whole packed
 *      buffer (the same rank-order sums).
 *   2. par_zero_grad_sumsq: this rank's share of the squared norm: the
 *      reduced elements of ITS segment only (AdamW shard, then owned Muon
 *      matrices), so summing the shares of every rank of every group counts
 *      each parameter exactly once.  Protocol: the caller adds the shares of
 *      all its plans, all-reduces the sum once over the whole world (every
 *      rank holds plans whose segments partition the model; a group of one
 *      rank owns everything), takes sqrt and the clip factor.  Both modes use
 *      the same partition, so they get the same norm bits.
 *   3. par_dp_apply: ZeRO-1: AdamW on the shard and Muon on the owned
 *      matrices, then one all-gather(v) of the updated segments into every
 *      replica's params; replicated: every rank updates every tensor with its
 *      full state (no communication).  Element updates are those of
 *      model/optim.h, so both modes give bitwise the same params and state.
 * The balance update (gate.bias) is not part of this: the driver applies it
 * on every replica with the global loads.
 */
#ifndef PAR_PARALLEL_ZERO_H
#define PAR_PARALLEL_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/config.h"
#include "model/params.h"

typedef enum {
    PAR_DP_REPLICATED = 0, /* every replica holds the full state, all-reduce   */
    PAR_DP_ZERO1 = 1,      /* --use-distributed-optimizer: state sharded       */
} par_dp_mode;

/* par_zero_owner answers for tensors that are not whole-matrix owned. */
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
} par_zero_entry;

/* Bytes of optimizer state and workspace of one rank. */
typedef struct {
    int64_t adamw_state;  /* exp_avg + exp_avg_sq this rank holds            */
    int64_t muon_state;   /* momentum this rank holds                        */
    int64_t full_state;   /* the group's whole state, unsharded (no padding) */
    int64_t workspace;    /* packed gradient/gather buffers (comm tag)       */
} par_zero_memory;

typedef struct {
    const par_param_table *t; /* borrowed; must outlive the plan                 */
    par_dp_mode mode;
    int dp, rank;             /* group size and this rank                        */
    int n;                    /* optimized tensors in the plan                   */
    par_zero_entry *e;        /* [n], table order                                */
    int *entry_of;            /* [t->n]: entry index, -1 if absent               */
    int *owned;               /* [n_muon_tensors] Muon entries by (owner, table order) */
    int *owned_begin;         /* [dp+1]: rank q owns owned[owned_begin[q] .. [q+1]) */
    int64_t n_adamw;          /* AdamW elements (unpadded)                       */
    int64_t shard;            /* ceil(n_adamw / dp)                              */
    int64_t n_muon;           /* Muon elements                                   */
    int64_t *load;            /* [dp] Muon elements owned by each rank           */
    int64_t *muon_base;       /* [dp+1] prefix sums of load                      */
    int64_t load_max;         /* max over ranks of load                          */
    int64_t largest;          /* numel of the largest Muon matrix                */
    int64_t seg;              /* shard + load_max                                */
    size_t *counts, *displs;  /* [dp] all-gatherv of the updated segments        */
    /* optimizer state: ZeRO-1 holds segment `rank` only, replicated all of them */
    par_real *m;              /* AdamW exp_avg:    [shard] | [dp*shard]          */
    par_real *v;              /* AdamW exp_avg_sq: [shard] | [dp*shard]          */
    par_real *mom;            /* Muon momentum:    [load[rank]] | [n_muon]       */
    /* workspace */
    par_real *buf;            /* [dp*seg] packed gradients, gathered params      */
    par_real *red;            /* [seg] ZeRO-1: the reduced gradients of my segment */
    int reduced;              /* 1 between par_dp_reduce_grads and par_dp_apply  */
} PAR_FN(par_zero_plan);

/* Builds the plan of the tensors idx[0..n_idx) (any order, no repeats,
 * entries without optimizer ignored) for rank `rank` of a group of `dp`
 * ranks.  Allocates zeroed state (PAR_TAG_OPTIM) and the workspace
 * (PAR_TAG_COMM).  The table must outlive the plan. */
par_status PAR_FN(par_zero_plan_build)(PAR_FN(par_zero_plan) *pl, const par_param_table *t,
                                       const int *idx, int n_idx, int dp, int rank, par_dp_mode mode);
void PAR_FN(par_zero_plan_free)(PAR_FN(par_zero_plan) *pl);

/* Owner of table entry idx: the rank owning a Muon matrix, PAR_ZERO_SHARDED
 * for an AdamW tensor, PAR_ZERO_ABSENT otherwise. */
int PAR_FN(par_zero_owner)(const PAR_FN(par_zero_plan) *pl, int idx);

/* This rank's memory (see par_zero_memory). */
void PAR_FN(par_zero_memory_of)(const PAR_FN(par_zero_plan) *pl, par_zero_memory *out);

/* Step 1, the one gradient reduction point (collective over comm, whose size
 * and rank must be the plan's).  grads is the local flat buffer (table
 * offsets), not modified; only the plan's tensors are read. */
par_status PAR_FN(par_dp_reduce_grads)(PAR_FN(par_zero_plan) *pl, par_comm *comm,
                                       const par_real *grads /* [n_float] */);

/* Step 2: this rank's share of the global sum of squared gradients (in
 * double, AdamW shard then owned Muon matrices, index order).  Not
 * collective.  PAR_EINVAL before par_dp_reduce_grads. */
par_status PAR_FN(par_zero_grad_sumsq)(const PAR_FN(par_zero_plan) *pl, double *out);

/* Step 3: the update with gradients gscale*g (the clip factor) and the
 * 1-based step number; writes the plan's tensors of params on every rank
 * (collective over comm in ZeRO-1 mode; call it in both modes). */
par_status PAR_FN(par_dp_apply)(PAR_FN(par_zero_plan) *pl, par_comm *comm,
                                par_real *params /* [n_float] */, const par_config *cfg,
                                int64_t step, double gscale);

/* A whole step over several plans (e.g. dense + expert): reduce each plan
 * over its comm, add the shares, all-reduce the sum over norm_comm, clip with
 * cfg->clip_grad, apply each plan.  norm_comm must contain every rank that
 * holds a segment of any tensor being updated (a world with one rank: any
 * comm of size 1).  *grad_norm (may be NULL) gets the global norm before
 * clipping.  No balance update. */
par_status PAR_FN(par_dp_step)(PAR_FN(par_zero_plan) *const *plans, par_comm *const *comms, int n_plans,
                               par_comm *norm_comm, par_real *params /* [n_float] */,
                               const par_real *grads /* [n_float] */, const par_config *cfg, int64_t step,
                               double *grad_norm);

/* One plan over one group that is the whole world: par_dp_step with
 * norm_comm = comm.  The plan's mode must be ZeRO-1 / replicated. */
par_status PAR_FN(par_zero_step)(PAR_FN(par_zero_plan) *pl, par_comm *comm, par_real *params,
                                 const par_real *grads, const par_config *cfg, int64_t step,
                                 double *grad_norm);
par_status PAR_FN(par_dp_step_replicated)(PAR_FN(par_zero_plan) *pl, par_comm *comm, par_real *params,
                                          const par_real *grads, const par_config *cfg, int64_t step,
                                          double *grad_norm);

/* Optimizer state dump: gathers the full state of the plan's tensors to
 * group rank `root` into flat table-offset buffers like par_optim_step's:
 * m_full = momentum (Muon) / exp_avg (AdamW), v_full = exp_avg_sq (AdamW).
 * Only the plan's elements are written; other ranks may pass NULL.
 * Collective over comm (point-to-point to root in ZeRO-1 mode). */
par_status PAR_FN(par_zero_state_gather)(const PAR_FN(par_zero_plan) *pl, par_comm *comm, int root,
                                         par_real *m_full /* [n_float] */, par_real *v_full /* [n_float] */);

/* The inverse for a restart: every rank takes its part of the state from
 * full table-offset buffers (no communication). */
void PAR_FN(par_zero_state_load)(PAR_FN(par_zero_plan) *pl, const par_real *m_full /* [n_float] */,
                                 const par_real *v_full /* [n_float] */);

#endif
