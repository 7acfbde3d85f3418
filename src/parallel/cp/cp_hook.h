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
 * saved forward per (microbatch slot, block); the slot is the call's
 * argument, never state of the model.
 */
#ifndef PAR_PARALLEL_CP_CP_HOOK_H
#define PAR_PARALLEL_CP_CP_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/cp/cp.h"

typedef struct PAR_FN(par_cp_hook_s) PAR_FN(par_cp_hook);

/* A hook for M's blocks over the CP group `cp` (not owned) with n_slots
 * microbatch slots. */
par_status PAR_FN(par_cp_hook_create)(PAR_FN(par_cp_hook) **out, par_comm *cp, const PAR_FN(par_model) *M,
                                      int n_slots);
/* M->attn = this hook (once, before the first step). */
void PAR_FN(par_cp_hook_install)(PAR_FN(par_cp_hook) *h, PAR_FN(par_model) *M);
/* Bytes this rank handed to src/comm for CP attention since creation
 * (zeros for NULL). */
void PAR_FN(par_cp_hook_traffic)(const PAR_FN(par_cp_hook) *h, par_cp_traffic *out);
void PAR_FN(par_cp_hook_free)(PAR_FN(par_cp_hook) *h); /* NULL is fine */

#endif
