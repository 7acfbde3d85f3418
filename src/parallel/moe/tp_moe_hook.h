/* parallel/moe/tp_moe_hook.h - the tensor-parallel shared expert in the MoE
 * sub-layer: the model's routed-expert executor (model/model.h
 * par_moe_exec) for TP > 1 with EP = ETP = 1 (templated: see
 * kernels/real.h; with EP > 1 the EP executor, parallel/moe/ep.h
 * par_ep_set_shared_tp, and with ETP > 1 parallel/moe/etp_hook.h run the same
 * TP shared expert).  docs/parallel.md, "Tensor parallelism in the step".
 *
 * The routed experts run whole on the rank's tokens (every expert held, as
 * the serial model; parallel/moe/etp.h's rows layer over a group of one), the
 * shared expert column / row parallel over the TP group
 * (parallel/tp/tp_mlp.h): rank r's rows [r*I/P, (r+1)*I/P) of w1 / w3 read in
 * place, the same columns of w2 copied; its partial output summed over TP
 * (sp: reduce-scattered).  The shard's gradients go into rank r's block of
 * M->grads (zeros elsewhere): par_reduce_tp_grads (PAR_TPG_SHARED) sums
 * them over the group once per step.  One saved forward per (microbatch
 * slot, block).
 */
#ifndef PAR_PARALLEL_MOE_TP_MOE_HOOK_H
#define PAR_PARALLEL_MOE_TP_MOE_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/tp/tp.h"

typedef struct PAR_FN(par_tp_moe_hook_s) PAR_FN(par_tp_moe_hook);

/* A hook over the TP group `tp` (not owned) with n_slots microbatch slots;
 * sp as parallel/tp/tp.h, faults its PAR_TP_FAULT_* bits (0 in real runs).
 * PAR_EINVAL naming the numbers when the group's size does not divide
 * moe_inter_dim. */
par_status PAR_FN(par_tp_moe_hook_create)(PAR_FN(par_tp_moe_hook) **out, par_comm *tp, const PAR_FN(par_model) *M,
                                          int n_slots, int sp, unsigned faults);
/* M->moe = this hook (once, before the first step). */
void PAR_FN(par_tp_moe_hook_install)(PAR_FN(par_tp_moe_hook) *h, PAR_FN(par_model) *M);
void PAR_FN(par_tp_moe_hook_traffic)(const PAR_FN(par_tp_moe_hook) *h, par_tp_traffic *out);
/* The shared expert's work on this rank so far (parallel/tp/tp.h). */
void PAR_FN(par_tp_moe_hook_shared_stats)(const PAR_FN(par_tp_moe_hook) *h, par_tp_shared_stats *out);
void PAR_FN(par_tp_moe_hook_free)(PAR_FN(par_tp_moe_hook) *h); /* NULL is fine */

#endif
