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
 * shared expert on the rank's tokens, whole (TP = 1) or TP-split.  The slices' gradients (complete
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
#include "parallel/hook/hookset.h"
#include "parallel/tp/tp.h"

/* The executor's entry (parallel/hook/hookset.h): ETP > 1 with EP = 1 (M
 * holds every expert), and the TP shared expert with EP = ETP = 1 (an ETP
 * group of one: the routed experts whole, read and accumulated in place,
 * as the serial model; once the TP shared expert's own hook,
 * tp_moe_hook.c), installed as M->moe, with the TP shared expert when
 * TP splits it (parallel/layout/tp_split.h par_tp_shared_expert_split: the
 * shared expert column / row parallel over the TP group, parallel/tp/tp_mlp.h,
 * its shard's gradients into this TP rank's block, PAR_TPG_SHARED);
 * reports the shared expert's work (par_hook_report.shared). */
extern const PAR_FN(par_hookset) PAR_FN(par_etp_hookset);

#endif
