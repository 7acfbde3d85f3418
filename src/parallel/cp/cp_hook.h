/* parallel/cp/cp_hook.h - the context-parallel attention hook: the model's
 * attention executor (model/model.h par_attn_exec) on a CP group
 * (templated: see kernels/real.h).  docs/parallel.md, "Context parallelism
 * in the step".
 *
 * A rank of a CP layout holds, of each of its attention-DP rows, the column
 * slice [cp*L, (cp+1)*L), L = S/CP (the step executor slices the batch,
 * parallel/step/exec_setup.c).  The attention layer of every block runs here:
 * par_cp_attn_forward / _backward_input / _backward_weights (parallel/cp/cp.h)
 * over the CP group, with the positions of the microbatch's WHOLE rows from
 * the call's context (par_mbctx.pos_rows); the halo exchange, the entry
 * all-gather and the entry-gradient reduce-scatter go through src/comm, so
 * an attached emulated network charges them per tier.  The hook keeps one
 * saved forward per (microbatch, held block) from its forward to its weight
 * pass (parallel/hook/mbstate.h); the microbatch is the call's argument,
 * never state of the model.
 */
#ifndef PAR_PARALLEL_CP_CP_HOOK_H
#define PAR_PARALLEL_CP_CP_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/cp/cp.h"
#include "parallel/hook/hookset.h"

typedef struct PAR_FN(par_cp_hook_s) PAR_FN(par_cp_hook);

/* A hook for M's blocks over the CP group `cp` (not owned) with state for
 * n_mb microbatches. */
par_status PAR_FN(par_cp_hook_create)(PAR_FN(par_cp_hook) **out, par_comm *cp, const PAR_FN(par_model) *M,
                                      int n_mb);
void PAR_FN(par_cp_hook_free)(PAR_FN(par_cp_hook) *h); /* NULL is fine */

/* The executor's entry (parallel/hook/hookset.h): CP > 1 without TP,
 * installed as M->attn; reports its traffic (par_hook_report.cp). */
extern const PAR_FN(par_hookset) PAR_FN(par_cp_hookset);

#endif
