/* parallel/ep.h - expert parallelism: the MoE executor that dispatches
 * tokens to the ranks owning their experts and combines the results
 * (templated: see kernels/real.h).  docs/parallel.md, "Expert parallelism".
 *
 * EP rank j of an EP group holds experts [j*E/EP, (j+1)*E/EP) of every
 * block (the model is built with par_model_init_owned).  The gate runs where
 * the token lives (block.c); par_ep_install points M->moe at this executor:
 *
 *   forward   rows (token's normed x, routing weight | expert id, token id,
 *             source slot t*K+k) go to the owner of each selected expert by
 *             one all-to-all(v) inside the EP group, sent in (owner, t, k)
 *             order; the owner runs its experts in ascending e over the rows
 *             it received (rows of one expert in (source rank, t) order =
 *             global token order), returns each output row by the reverse
 *             all-to-all(v); the token's rank puts row (t,k) into slot k and
 *             combines with par_moe_combine (slots ascending e, then the
 *             shared expert, computed locally): the contract's order.
 *   backward  dy rows to the owners, expert backward (weight gradients
 *             accumulate into the owner's local gradients), (dx, d rw) rows
 *             back; slot combine exactly as the serial backward.
 */
#ifndef PAR_PARALLEL_EP_H
#define PAR_PARALLEL_EP_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"

typedef struct PAR_FN(par_ep_s) PAR_FN(par_ep);

/* Counters of one rank, accumulated over every block and step. */
typedef struct {
    int64_t rows_sent;       /* token-slot rows dispatched (forward)            */
    int64_t rows_recv;       /* token-slot rows received for the held experts   */
    int64_t dispatch_bytes;  /* bytes sent to other ranks: forward x + ids, backward dy  */
    int64_t combine_bytes;   /* bytes sent to other ranks: forward y, backward dx, d rw  */
    int64_t calls;           /* all-to-all(v) calls (counts exchanges included)  */
} par_ep_counters;

/* An executor for M over the EP group `ep` (this rank's handle; its size
 * must divide E and M must hold exactly the rank's experts
 * [r*E/EP, (r+1)*E/EP), else PAR_EINVAL naming the numbers). */
par_status PAR_FN(par_ep_create)(PAR_FN(par_ep) **out, par_comm *ep, PAR_FN(par_model) *M);
/* M->moe = this executor. */
void PAR_FN(par_ep_install)(PAR_FN(par_ep) *x, PAR_FN(par_model) *M);
/* Keeps n independent sets of per-block forward state (slot 0 .. n-1; 1 by
 * default): a pipeline (parallel/pp.h) has several microbatches of one block
 * between forward and backward and selects the microbatch's slot before each
 * forward / backward.  Frees the state kept so far. */
par_status PAR_FN(par_ep_set_slots)(PAR_FN(par_ep) *x, int n);
void PAR_FN(par_ep_select_slot)(PAR_FN(par_ep) *x, int slot); /* NULL x, bad slot: no-op */
void PAR_FN(par_ep_counters_get)(const PAR_FN(par_ep) *x, par_ep_counters *out);
void PAR_FN(par_ep_free)(PAR_FN(par_ep) *x); /* NULL is fine */

#endif
