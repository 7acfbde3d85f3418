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
 * the logical matrix).  One state per (microbatch, block) from its forward
 * to its weight pass (parallel/hook/mbstate.h).
 */
#ifndef PAR_PARALLEL_TP_TP_ATTN_HOOK_H
#define PAR_PARALLEL_TP_TP_ATTN_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/hook/hookset.h"
#include "parallel/tp/tp.h"

/* The executor's entry (parallel/hook/hookset.h): TP > 1 without CP,
 * installed as M->attn; PAR_EINVAL naming the numbers when the group's
 * size does not divide a block's heads, groups or index heads.  Sequence
 * parallelism: the ranks hold column slices [tp*S/P, (tp+1)*S/P) of every
 * row of a microbatch (the executor's slicing, as CP's).  One row: the
 * layer's own SP (all-gather before, reduce-scatter after); several rows:
 * the slices gathered into whole rows, the layer without SP (its output
 * all-reduced), the rank's slices taken (the same sums in rank order, P
 * times the bytes back). */
extern const PAR_FN(par_hookset) PAR_FN(par_tp_attn_hookset);

#endif
