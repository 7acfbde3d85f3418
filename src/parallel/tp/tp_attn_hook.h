/* parallel/tp/tp_attn_hook.h - the tensor-parallel attention hook: the model's
 * attention executor (model/model.h par_attn_exec) on a TP group
 * (templated: see kernels/real.h).  docs/parallel.md, "Tensor parallelism
 * in the step".
 *
 * Every rank of a TP group holds the same tokens (no sequence parallelism)
 * and, in this first wiring, the WHOLE parameters (the TP split is of the
 * compute, not yet of the storage).  Rank r runs par_tp_attn_forward /
 * _backward (parallel/tp/tp_attn.h) with its shard of the weights, cut from
 * the full ones at each forward: its query heads, output groups, index
 * heads and sinks; the indexer's score chain and the row-parallel output
 * sum go over the group.  The backward's shard gradients go into rank r's
 * block of M->grads (zeros elsewhere) and the replicated weights' partial
 * shares whole; par_reduce_tp_grads (parallel/reduce/reduce.h) then sums every
 * attention gradient over the group once per step, so every TP rank holds
 * the complete gradient and updates the whole matrices alike (Muon sees
 * the logical matrix).  One saved forward per (microbatch slot, block).
 */
#ifndef PAR_PARALLEL_TP_TP_ATTN_HOOK_H
#define PAR_PARALLEL_TP_TP_ATTN_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/tp/tp.h"

typedef struct PAR_FN(par_tp_attn_hook_s) PAR_FN(par_tp_attn_hook);

/* A hook for M's blocks over the TP group `tp` (not owned) with n_slots
 * microbatch slots; PAR_EINVAL naming the numbers when the group's size
 * does not divide a block's heads, groups or index heads. */
par_status PAR_FN(par_tp_attn_hook_create)(PAR_FN(par_tp_attn_hook) **out, par_comm *tp, const PAR_FN(par_model) *M,
                                      int n_slots);
/* Sequence parallelism (sp 1): the ranks hold column slices [tp*S/P,
 * (tp+1)*S/P) of every row of a microbatch (the executor's slicing, as
 * CP's).  One row: the layer's own SP (all-gather before, reduce-scatter
 * after); several rows: the slices gathered into whole rows, the layer
 * without SP (its output all-reduced), the rank's slices taken (the same
 * sums in rank order, P times the bytes back).  Before the first step. */
void PAR_FN(par_tp_attn_hook_set_sp)(PAR_FN(par_tp_attn_hook) *h, int sp);
/* M->attn = this hook (once, before the first step). */
void PAR_FN(par_tp_attn_hook_install)(PAR_FN(par_tp_attn_hook) *h, PAR_FN(par_model) *M);
/* Bytes this rank handed to src/comm for TP attention since creation
 * (zeros for NULL). */
void PAR_FN(par_tp_attn_hook_traffic)(const PAR_FN(par_tp_attn_hook) *h, par_tp_traffic *out);
void PAR_FN(par_tp_attn_hook_free)(PAR_FN(par_tp_attn_hook) *h); /* NULL is fine */

#endif
