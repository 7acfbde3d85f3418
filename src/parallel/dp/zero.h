/* parallel/dp/zero.h - data-parallel optimizer step: replicated DP and ZeRO-1
 * (--use-distributed-optimizer) with Muon ownership by whole matrices
 * (templated).  docs/parallel.md, "ZeRO-1 and Muon ownership", has the rules.
 *
 * A plan is a geometry (parallel/layout/zero_geom.h, untemplated: which rank
 * owns which optimizer state, the packed layout of the group's gradients)
 * plus what the step needs in the working precision: the optimizer state
 * this rank holds and the packed workspace.  Every rank of the group builds
 * the same geometry.
 *
 * One step (both modes), each call collective over the group's comm:
 *   1. par_dp_reduce_grads: the ONE cross-rank gradient reduction: ZeRO-1:
 *      pack the local gradients, reduce-scatter (rank r gets segment r,
 *      summed in rank order); replicated: all-reduce of the plan's tensors
 *      in place in the caller's buffer (the same rank-order sums, no packed
 *      dp x seg copy: per-rank memory stays the rank's own share).
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
#ifndef PAR_PARALLEL_DP_ZERO_H
#define PAR_PARALLEL_DP_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/layout/zero_geom.h"

typedef struct {
    union {
        par_zero_geom geom;                /* the geometry, as one object (zero_plan.h) */
        struct { PAR_ZERO_GEOM_MEMBERS };  /* the same members by name: pl->shard, ...  */
    };
    par_dp_mode mode;
    size_t *counts, *displs;  /* [dp] all-gatherv of the updated segments        */
    /* optimizer state: ZeRO-1 holds segment `rank` only, replicated all of them */
    par_real *m;              /* AdamW exp_avg:    [shard] | [dp*shard]          */
    par_real *v;              /* AdamW exp_avg_sq: [shard] | [dp*shard]          */
    par_real *mom;            /* Muon momentum:    [load[rank]] | [n_muon]       */
    /* workspace (ZeRO-1 only: replicated reduces in place) */
    par_real *buf;            /* [dp*seg] packed gradients, gathered params      */
    par_real *red;            /* [seg] ZeRO-1: the reduced gradients of my segment */
    const par_real *rg;       /* replicated: the reduced flat gradients (the caller's buffer) */
    int reduced;              /* 1 between par_dp_reduce_grads and par_dp_apply  */
    int state_ext;            /* 1: m, v, mom are the caller's (par_zero_plan_build_shared), not freed */
    int tp_muon_shard_fault;  /* P > 1: the TP-split Muon matrices updated per TP shard of P, the deliberate
                               * bug (parallel/tp/tp_muon.h par_tp_muon_shard_fault); 0 in real runs */
    /* Muon matrices the model holds as TP shards (tp_cut[idx].cut != 0; NULL:
     * none): updated by par_tp_muon_update over tpc, the logical matrix
     * orthogonalized on TP rank (idx mod TP), so the update is bitwise the
     * whole matrix's; every rank of tpc updates the same segment */
    const par_model_cut *tp_cut;
    par_comm *tpc;
} PAR_FN(par_zero_plan);

/* Builds the plan of the tensors idx[0..n_idx) for rank `rank` of a group
 * of `dp` ranks: the geometry (par_zero_geom_build, its rules and errors),
 * zeroed state (PAR_TAG_OPTIM) and the workspace (PAR_TAG_COMM).  The table
 * must outlive the plan. */
par_status PAR_FN(par_zero_plan_build)(PAR_FN(par_zero_plan) *pl, const par_param_table *t,
                                       const int *idx, int n_idx, int dp, int rank, par_dp_mode mode);
void PAR_FN(par_zero_plan_free)(PAR_FN(par_zero_plan) *pl);

/* The optimizer state a plan holds (sizes: m, v [n_adamw_state], mom [n_muon_state]). */
typedef struct {
    par_real *m, *v, *mom;
} PAR_FN(par_zero_state);
typedef par_status (*PAR_FN(par_zero_state_fn))(void *ctx, size_t n_adamw_state, size_t n_muon_state,
                                                 PAR_FN(par_zero_state) *out);
/* par_zero_plan_build whose REPLICATED state comes from get(ctx, ...)
 * instead (zeroed, the same geometry on every caller: the copy the ranks of
 * one process share, parallel/dp/replicas.h; the plan does not free it).  A
 * ZeRO-1 plan's state is its own shard (get is not called); get NULL = the
 * plan's own. */
par_status PAR_FN(par_zero_plan_build_shared)(PAR_FN(par_zero_plan) *pl, const par_param_table *t,
                                              const int *idx, int n_idx, int dp, int rank, par_dp_mode mode,
                                              PAR_FN(par_zero_state_fn) get, void *ctx);
/* The same over held sizes numel[tab.n] (NULL: the table's;
 * par_zero_geom_build_sized). */
par_status PAR_FN(par_zero_plan_build_sized)(PAR_FN(par_zero_plan) *pl, const par_param_table *t,
                                             const int64_t *numel, const int *idx, int n_idx, int dp, int rank,
                                             par_dp_mode mode, PAR_FN(par_zero_state_fn) get, void *ctx);

/* This rank's memory (par_zero_geom_memory in the plan's mode and precision).
 * Owners and pieces: par_zero_geom_owner / _piece(&pl->geom, ...). */
void PAR_FN(par_zero_memory_of)(const PAR_FN(par_zero_plan) *pl, par_zero_memory *out);

/* Step 1, the one gradient reduction point (collective over comm, whose size
 * and rank must be the plan's).  grads is the local flat buffer (table
 * offsets); only the plan's tensors are read.  ZeRO-1 leaves it as it is;
 * replicated sums the plan's tensors in it in place (they hold the reduced
 * gradients afterwards, and the plan reads them there until par_dp_apply). */
par_status PAR_FN(par_dp_reduce_grads)(PAR_FN(par_zero_plan) *pl, par_comm *comm,
                                       par_real *grads /* [n_float] */);

/* After step 1: the reduced gradients of entry e (one of pl->e) from AdamW
 * flat position a (a Muon matrix: a = e->pos) inside THIS rank's segment
 * (ZeRO-1: in pl->red; replicated: in the reduced flat buffer). */
const par_real *PAR_FN(par_zero_grad_at)(const PAR_FN(par_zero_plan) *pl, const par_zero_entry *e, int64_t a);

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

/* par_dp_apply, with write 0 for a rank whose params are another rank's to
 * write (the process's shared copy, parallel/dp/replicas.h): ZeRO-1 updates
 * its segment and takes part in the all-gather as before (the same bytes on
 * the network) but leaves params alone; replicated does nothing but end the
 * step (no communication either way).  write 1 is par_dp_apply. */
par_status PAR_FN(par_dp_apply_ext)(PAR_FN(par_zero_plan) *pl, par_comm *comm, par_real *params,
                                    const par_config *cfg, int64_t step, double gscale, int write);

/* A whole step over several plans (e.g. dense + expert): reduce each plan
 * over its comm, add the shares, all-reduce the sum over norm_comm, clip with
 * cfg->clip_grad, apply each plan.  norm_comm must contain every rank that
 * holds a segment of any tensor being updated (a world with one rank: any
 * comm of size 1).  *grad_norm (may be NULL) gets the global norm before
 * clipping.  No balance update. */
par_status PAR_FN(par_dp_step)(PAR_FN(par_zero_plan) *const *plans, par_comm *const *comms, int n_plans,
                               par_comm *norm_comm, par_real *params /* [n_float] */,
                               par_real *grads /* [n_float], replicated: reduced in place */, const par_config *cfg, int64_t step,
                               double *grad_norm);

/* One plan over one group that is the whole world: par_dp_step with
 * norm_comm = comm.  The plan's mode must be ZeRO-1 / replicated. */
par_status PAR_FN(par_zero_step)(PAR_FN(par_zero_plan) *pl, par_comm *comm, par_real *params,
                                 par_real *grads, const par_config *cfg, int64_t step,
                                 double *grad_norm);
par_status PAR_FN(par_dp_step_replicated)(PAR_FN(par_zero_plan) *pl, par_comm *comm, par_real *params,
                                          par_real *grads, const par_config *cfg, int64_t step,
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
