/* parallel/moe/etp_hook.h - the expert-tensor-parallel MoE hook: the model's
 * routed-expert executor (model/model.h par_moe_exec) on an ETP group with
 * every expert held (EP = 1; templated: see kernels/real.h).
 * docs/parallel.md, "Tensor parallelism in the step".
 *
 * Under MoE parallel folding the ranks of an ETP group have different
 * attention-side coordinates (dp or cp), so they hold disjoint tokens.  Rank
 * r runs par_etp_moe_forward / _backward (parallel/moe/etp.h, sp = 1) with the
 * I/ETP slice r of every routed expert (w1 / w3 rows, w2 columns), cut from
 * the whole weights it holds: the rows all-gathered over the group, every
 * slice on all of them, the partial outputs reduce-scattered back; the
 * shared expert on the rank's tokens, whole (TP = 1) or TP-split
 * (par_etp_hook_set_shared_tp).  The slices' gradients (complete
 * for the group's rows) go into rank r's block of the experts' gradients,
 * zeros elsewhere; par_reduce_etp_grads (parallel/reduce/reduce.h) sums them over
 * the group once per step.  Every ETP rank holds and updates the whole
 * experts (the split is of the compute, not yet of the storage).
 */
#ifndef PAR_PARALLEL_MOE_ETP_HOOK_H
#define PAR_PARALLEL_MOE_ETP_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/tp/tp.h"

typedef struct PAR_FN(par_etp_hook_s) PAR_FN(par_etp_hook);

/* A hook for M's blocks over the ETP group `etp` (not owned) with n_slots
 * microbatch slots; M must hold every expert.  sp = 1: the group's ranks
 * hold disjoint tokens (rows gathered, outputs reduce-scattered); sp = 0:
 * the same tokens (TP = ETP without sequence parallelism: the ETP group is
 * the TP group; outputs all-reduced). */
par_status PAR_FN(par_etp_hook_create)(PAR_FN(par_etp_hook) **out, par_comm *etp, const PAR_FN(par_model) *M,
                                       int n_slots, int sp);
/* The TP shared expert (TP > 1; parallel/layout/tp_split.h par_tp_shared_expert_split):
 * the shared expert column / row parallel over the TP group `tp` (not owned;
 * parallel/tp/tp_mlp.h) on the rank's tokens (sp: all-gathered over TP, the
 * output reduce-scattered; else the output all-reduced), the shard's
 * gradients into this TP rank's block of the whole ones (par_reduce_tp_grads,
 * PAR_TPG_SHARED).  A group of one (or NULL) runs it whole (the default).
 * faults: parallel/tp/tp.h's bits.  Frees the kept state. */
void PAR_FN(par_etp_hook_set_shared_tp)(PAR_FN(par_etp_hook) *h, par_comm *tp, int sp, unsigned faults);
void PAR_FN(par_etp_hook_shared_stats)(const PAR_FN(par_etp_hook) *h, par_tp_shared_stats *out);
void PAR_FN(par_etp_hook_install)(PAR_FN(par_etp_hook) *h, PAR_FN(par_model) *M);
void PAR_FN(par_etp_hook_free)(PAR_FN(par_etp_hook) *h); /* NULL is fine */

#endif
