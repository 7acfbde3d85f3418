/* parallel/dp/dpw.h - the data-parallel optimizer step of a training step:
 * ZeRO-1 / replicated DP (parallel/dp/zero.h) on a rank's model (templated:
 * see kernels/real.h; its identifiers keep the prefix par_dpw_, "DP wired
 * onto the model").  docs/parallel.md, "The optimizer step of a rank".
 *
 * A rank's model keeps its held entries packed in LOCAL flat buffers
 * (par_model_loc, model/model.h).  zero.h's plans work on flat buffers addressed by
 * a table's offsets, so the wiring builds a LOCAL TABLE: a copy of the
 * parameter entries whose offsets are par_model_loc (held entries only listed in
 * the plans), and hands the model's params / grads to the plans directly.
 *
 * Two plans per rank:
 *   dense  : every held dense float entry, over the attention DP x CP group
 *            ("dp-cp", group rank cp + CP*dp) of the rank's stage;
 *   expert : the held routed experts, over the expert-DP group ("edp").
 * Entries without an optimizer (gate.bias) are listed and ignored by the
 * plans; the balance update of gate.bias runs on every replica from the
 * globally reduced loads (identical everywhere).
 *
 * One step after the step executor's backward (parallel/step/exec.h),
 * par_dpw_step = zero.h's par_dp_step protocol with a per-entry norm:
 *   1. par_dp_reduce_grads per plan: each gradient reduced exactly once over
 *      the ranks that replicate it (rank-order sums; replicated: in place
 *      in M->grads, which holds the reduced gradients afterwards);
 *   2. the norm: each rank's squared sums of the reduced elements of ITS
 *      segments, PER ENTRY (a vector over the table), one all-reduce of the
 *      vector over the world (parallel/reduce/reduce_sum.h), then summed in table order (par_grad_sumsq's
 *      order): every element counted once (the plans' segments partition
 *      the model), an entry inside one segment is exact, so one rank is the
 *      serial norm bit for bit and both modes give the same bits;
 *   3. clip factor, par_dp_apply per plan (ZeRO-1: AdamW on its shard, Muon
 *      on its matrices, all-gather of the updated segments; replicated:
 *      everything everywhere);
 *   4. the balance update; M->step += 1, M->last.grad_norm,
 *      M->stats.grad_sumsq.
 * The model's own optimizer buffers (M->opt_m, M->opt_v) are released by
 * par_dpw_init: the state lives in the plans (sharded under ZeRO-1).
 */
#ifndef PAR_PARALLEL_DP_DPW_H
#define PAR_PARALLEL_DP_DPW_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/reduce/reduce.h"
#include "parallel/dp/replicas.h"
#include "parallel/dp/zero.h"

#define PAR_DPW_DENSE 0
#define PAR_DPW_EXPERT 1

/* Bytes one rank holds, by kind (the per-rank memory accounting). */
typedef struct {
    int64_t weights;    /* the held parameters (float + int32 tables)            */
    int64_t grads;      /* the gradient buffer                                   */
    int64_t optim;      /* optimizer state this rank holds (plans)               */
    int64_t optim_full; /* the unsharded state of the tensors this rank replicates */
    int64_t act;        /* saved activations, peak over the step's slots (set by the caller) */
    int64_t comm;       /* the plans' packed gradient / gather workspace          */
} par_dpw_memory;
#define PAR_DPW_MEM_FIELDS 6

typedef struct {
    int n_tab;                /* entries of M->tab (the plans map them to par_model_loc: par_zero_entry.off) */
    par_dp_mode mode;
    PAR_FN(par_zero_plan) plan[2]; /* PAR_DPW_DENSE, PAR_DPW_EXPERT */
    par_comm *comm[2];
    unsigned char *norm_skip; /* [tab.n / 8 + 1] bits, entry i's bit 1: held but counted in the norm by another stage (PP); NULL: none */
    /* The dense plan's weights (and replicated state) in the process's shared
     * copy (parallel/dp/replicas.h), NULL: the rank's own.  The plans address
     * flat buffers from base[k]: a plan entry's off is par_model_loc - base[k] (the
     * expert plan with a shared copy: base n_shared, its weights in M->params,
     * its gradients at M->grads + n_shared). */
    PAR_FN(par_replica_ticket) *rt;
    int64_t base[2];
    /* Entries the model holds as tensor-parallel shards (M->cut): the norm
     * chains their squared sums over their group in rank order (rank r
     * continues rank r-1's sums), so an entry inside one segment is summed
     * in the serial element order; Muon meets on it.  chain[k]: plan k's
     * group (dense: TP, experts: ETP); NULL: no shards. */
    par_comm *chain[2];
} PAR_FN(par_dpw);

/* Builds the local table and both plans (mode from P->lay->distributed_optimizer)
 * and releases M->opt_m / M->opt_v.  Not collective. */
par_status PAR_FN(par_dpw_init)(PAR_FN(par_dpw) *w, const par_pctx *P, PAR_FN(par_model) *M);
/* The same for a model whose dense weights are the process's shared copy
 * (rt->rep, M->shw; rt NULL or without a copy: par_dpw_init).  The dense
 * plan's replicated state is the copy's too; rt's writer alone writes them
 * (par_dpw_step), the others wait for it. */
par_status PAR_FN(par_dpw_init_shared)(PAR_FN(par_dpw) *w, const par_pctx *P, PAR_FN(par_model) *M,
                                       PAR_FN(par_replica_ticket) *rt);
void PAR_FN(par_dpw_free)(PAR_FN(par_dpw) *w);

/* Marks table entry idx as not counted in this rank's norm share (a tensor
 * replicated over pipeline stages is counted on one stage only).  PAR_EINVAL
 * for an index outside the table. */
par_status PAR_FN(par_dpw_set_norm_skip)(PAR_FN(par_dpw) *w, int idx);

/* The deliberate bug of a TP shard fed to Muon (PAR_TP_FAULT_MUON_SHARD,
 * tests and fault cells only): the dense plan updates every TP-split Muon
 * matrix per shard of tp ranks (parallel/tp/tp_muon.h par_tp_muon_shard_fault). */
void PAR_FN(par_dpw_set_tp_muon_shard_fault)(PAR_FN(par_dpw) *w, int tp);

/* The optimizer step described above.  Collective over the world. */
par_status PAR_FN(par_dpw_step)(PAR_FN(par_dpw) *w, const par_pctx *P, PAR_FN(par_model) *M);

/* After par_dpw_step, for a dump: writes the REDUCED gradients of every
 * plan entry into M->grads (replicated: already there, reduced in place;
 * ZeRO-1: one all-gather(v) of the reduced segments, collective over each
 * group). */
par_status PAR_FN(par_dpw_reduced_grads)(PAR_FN(par_dpw) *w, PAR_FN(par_model) *M);

/* Gathers the optimizer state of both plans to their group rank 0 into
 * LOCAL flat buffers m, v [M->n_local] (layout of par_optim_step's m / v,
 * at local offsets); other ranks' buffers are left as they were.
 * Collective over both groups. */
par_status PAR_FN(par_dpw_state_gather)(PAR_FN(par_dpw) *w, const PAR_FN(par_model) *M,
                                        par_real *m /* [n_local] */, par_real *v /* [n_local] */);

/* Pointer to elements [begin, ...) of the optimizer state of table entry
 * idx held by this rank: slot 0 = momentum (Muon) / exp_avg (AdamW), slot 1
 * = exp_avg_sq (AdamW).  *avail (may be NULL) = elements available from
 * begin contiguously.  NULL when this rank does not hold element begin. */
par_real *PAR_FN(par_dpw_state_ptr)(PAR_FN(par_dpw) *w, int idx, int slot, int64_t begin, int64_t *avail);

/* This rank's memory accounting (see par_dpw_memory; act is left 0: the
 * step executor knows the activations). */
void PAR_FN(par_dpw_memory_of)(const PAR_FN(par_dpw) *w, const PAR_FN(par_model) *M, par_dpw_memory *out);

#endif
