/* parallel/cp/cptp_hook.h - the context x tensor parallel attention hook: the
 * model's attention executor (model/model.h par_attn_exec) on a CP group
 * whose ranks each hold one TP rank's shard of the heads (templated: see
 * kernels/real.h).  docs/parallel.md, "TP x CP".
 *
 * The TP ranks of one (cp, dp) coordinate hold the same tokens (no sequence
 * parallelism).  Rank (tp r, cp c) cuts its shard from the whole weights at
 * each forward (parallel/tp/tp_attn.h par_tp_attn_shard, as tp_hook.c does) and
 * runs parallel/cp/cp.h's par_cp_attn_forward_tp on the CP slice: the halo and
 * the entries' all-gather over CP as always (entries are replicated over
 * TP), the indexer's head sums chained over TP for the local queries, the
 * row-parallel output summed over TP.  B: the CP input pass on the shard
 * (dx summed over TP, the shard's sinks into dsink); W: the CP weight pass
 * on the shard, added into rank r's block of M->grads (par_tp_attn_grads_add;
 * replicated weights' shares whole), summed over TP once per step by
 * par_reduce_tp_grads.  One state per (microbatch slot, block).
 *
 * With sp (--sequence-parallel x CP) the TP ranks hold column slices of the
 * CP slice (rank (tp r, cp c): columns [(c*TP + r)*L, ...) of every row, L
 * = S/(CP*TP)): the forward all-gathers them over TP into the CP slice,
 * runs the same CP x TP layer (its output summed over TP) and keeps the
 * rank's columns of y and of the picks; B gathers dy the same way, keeps
 * the gathered dy for W, and adds the rank's columns of the (TP-summed) dx.
 */
#ifndef PAR_PARALLEL_CP_CPTP_HOOK_H
#define PAR_PARALLEL_CP_CPTP_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"

typedef struct PAR_FN(par_cptp_hook_s) PAR_FN(par_cptp_hook);

/* A hook for M's blocks over the CP group `cp` and the TP group `tp` (not
 * owned) with n_slots microbatch slots, sp as above; PAR_EINVAL naming the
 * numbers when TP does not divide a block's heads, groups or index heads. */
par_status PAR_FN(par_cptp_hook_create)(PAR_FN(par_cptp_hook) **out, par_comm *cp, par_comm *tp,
                                        const PAR_FN(par_model) *M, int n_slots, int sp);
void PAR_FN(par_cptp_hook_install)(PAR_FN(par_cptp_hook) *h, PAR_FN(par_model) *M);
void PAR_FN(par_cptp_hook_free)(PAR_FN(par_cptp_hook) *h); /* NULL is fine */

#endif
