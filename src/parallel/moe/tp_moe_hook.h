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
 * them over the group once per step.  One state per (microbatch, block)
 * from its forward to its input pass (parallel/hook/mbstate.h).
 */
#ifndef PAR_PARALLEL_MOE_TP_MOE_HOOK_H
#define PAR_PARALLEL_MOE_TP_MOE_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/hook/hookset.h"
#include "parallel/tp/tp.h"

/* The executor's entry (parallel/hook/hookset.h): TP > 1 splitting the
 * shared expert with EP = ETP = 1, installed as M->moe (sp and the
 * PAR_TP_FAULT_* bits from the layout and the executor); PAR_EINVAL naming
 * the numbers when TP does not divide moe_inter_dim; reports the shared
 * expert's work (par_hook_report.shared). */
extern const PAR_FN(par_hookset) PAR_FN(par_tp_moe_hookset);

#endif
