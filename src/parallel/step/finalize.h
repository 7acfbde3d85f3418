/* parallel/step/finalize.h - the one owner of finishing a step's gradients
 * (templated), as Megatron-LM's finalize_model_grads is one place: after the
 * step executor's forward and backward (parallel/step/exec.h par_exec_step)
 * and before the optimizer's update (parallel/dp/dpw.h par_dpw_update).
 * docs/parallel.md, "Finishing the step's gradients".
 *
 * par_finalize_grads does, in this order (the order of the sums is the
 * order of the bits; every call collective):
 *   1. the statistics and losses: par_reduce_stats (over PP, CP, DP);
 *   2. the TP sum of what the executor's TP layers split (the executor's
 *      PAR_TPG_* bits) and the ETP sum of the routed experts:
 *      par_reduce_tp_grads, par_reduce_etp_grads;
 *   3. gradients of weights on several pipeline ranks: DualPipe's pair of
 *      copies (every held entry), else embed.weight over the EMBED group and
 *      head.weight over the MTP group: par_reduce_shared_grads; then
 *      M->have_fwd = 1;
 *   4. the DP / ZeRO-1 reduction, dense over DP x CP, experts over EDP:
 *      par_dpw_reduce;
 *   5. the global norm, each element counted once (the executor's
 *      norm-skip mask: the lowest pipeline holder; an entry whole on every
 *      TP / ETP rank on rank 0 only):
 *      par_dpw_norm; its square root and the clip factor
 *      (par_clip_factor, clip_grad); M->stats.grad_sumsq, M->last.grad_norm.
 * The update (par_dpw_update) takes the clip factor.  A dump asks the plans
 * for the reduced gradients afterwards (par_dpw_reduced_grads). */
#ifndef PAR_PARALLEL_STEP_FINALIZE_H
#define PAR_PARALLEL_STEP_FINALIZE_H

#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/dp/dpw.h"
#include "parallel/reduce/reduce.h"
#include "parallel/step/exec.h"

/* What the finalization hands the update. */
typedef struct {
    double sumsq; /* the global sum of squared gradients (table order) */
    double norm;  /* its square root, before clipping                  */
    double clip;  /* par_clip_factor(norm, clip_grad): the update's gradient scale */
} par_finalize_norm;

/* 1. to 5. above for the step par_exec_step just ran on this rank; *out is
 * set on success.  Collective over the world. */
par_status PAR_FN(par_finalize_grads)(PAR_FN(par_exec) *ex, PAR_FN(par_dpw) *w, const par_pctx *P,
                                      PAR_FN(par_model) *M, par_finalize_norm *out);

#endif
