/* parallel/moe/ep.h - expert parallelism: the MoE executor that dispatches
 * tokens to the ranks owning their experts and combines the results
 * (templated: see kernels/real.h).  docs/parallel.md, "Expert parallelism".
 *
 * EP rank j of an EP group holds experts [j*E/EP, (j+1)*E/EP) of every
 * block (the model is built with par_model_init_owned).  The gate runs where
 * the token lives (block.c); par_ep_install points M->moe at this executor
 * (once; the microbatch is each call's argument, par_mbctx.mb):
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
 *   backward  the input pass (B): dy rows to the owners (kept there), the
 *             experts' input gradients, (dx, d rw) rows back; slot combine
 *             exactly as the serial backward.  The weight pass (W, later
 *             for a zero-bubble schedule): the held experts' weight
 *             gradients from the kept dy rows into the owner's local
 *             gradients, and the shared expert's: no communication.
 *
 * Hierarchical (node-aware) dispatch (par_ep_set_dispatch, PAR_EP_HIER):
 * ranks sit on nodes of `gpus_per_node` world ranks (comm/netmodel.h).  A
 * token's row crosses to another node ONCE per destination node: stage 1
 * sends one record (x row, and the token's experts on that node with their
 * routing weights) to the token's relay on that node -- the EP rank of that
 * node with the sender's local index (its position among the EP ranks of
 * its own node) modulo the node's EP ranks, the same "rail" when nodes are
 * alike; on the sender's own node the relay is the sender itself -- and
 * stage 2 fans each (token, expert) row out to the expert's owner over
 * NVLink (an all-to-all(v) of the EP group with data only between ranks of
 * one node).  The owner sorts the rows by expert, then (source EP rank, t):
 * the flat path's order, so every GEMM and every sum is the flat path's and
 * the results are bitwise equal.  Outputs go back the same way, UNSUMMED
 * (one row per (token, expert): a partial sum on the relay would change the
 * contract's per-token summation order), so only the dispatch directions
 * (forward x, backward dy) save inter-node bytes; the combine directions
 * send the flat path's inter-node bytes plus NVLink hops.
 */
#ifndef PAR_PARALLEL_MOE_EP_H
#define PAR_PARALLEL_MOE_EP_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/hook/hookset.h"
#include "parallel/plan/costas.h"
#include "parallel/tp/tp.h"

typedef struct PAR_FN(par_ep_s) PAR_FN(par_ep);

/* Counters of one rank, accumulated over every block and step. */
typedef enum {
    PAR_EP_FLAT = 0,  /* one all-to-all(v): every (token, expert) row straight to its owner */
    PAR_EP_HIER = 1,  /* node-aware: once per (token, destination node) over IB, then NVLink */
} par_ep_dispatch;

/* Counters of one rank, accumulated over every block and step.  Bytes are
 * the data rows' (counts exchanges excluded: 8 bytes per peer pair), sent
 * to OTHER ranks, split by the tier of the pair: nodes of gpus_per_node
 * consecutive world ranks (par_ep_set_dispatch; the emulated network's
 * rule).  Times are this rank's virtual clock (comm/clock.h; 0 without an
 * emulated network): dispatch = from before the counts exchange until the
 * rows are at the owners; combine = from after the experts ran until the
 * rows are back on the token's rank (idle waits for other ranks included);
 * forward and backward summed. */
typedef struct par_ep_counters_s {
    int64_t rows_sent;       /* token-slot rows dispatched (forward)            */
    int64_t rows_recv;       /* token-slot rows received for the held experts   */
    int64_t dispatch_bytes;  /* bytes sent to other ranks: forward x + ids, backward dy  */
    int64_t combine_bytes;   /* bytes sent to other ranks: forward y, backward dx, d rw  */
    int64_t calls;           /* all-to-all(v) calls (counts exchanges included)  */
    int64_t dispatch_nvlink, dispatch_ib; /* dispatch_bytes by tier */
    int64_t combine_nvlink, combine_ib;   /* combine_bytes by tier  */
    double dispatch_s, combine_s;         /* emulated seconds        */
} par_ep_counters;

/* An executor for M over the EP group `ep` (this rank's handle; its size
 * must divide E and M must hold exactly the rank's experts
 * [r*E/EP, (r+1)*E/EP), else PAR_EINVAL naming the numbers). */
par_status PAR_FN(par_ep_create)(PAR_FN(par_ep) **out, par_comm *ep, PAR_FN(par_model) *M);
/* M->moe = this executor. */
void PAR_FN(par_ep_install)(PAR_FN(par_ep) *x, PAR_FN(par_model) *M);
/* Dispatch mode and the node size (ranks per node, >= 1) the tiers and the
 * hierarchical relays use; the default is flat with 8 GPUs per node (the
 * reference preset).  Every rank of the EP group must pass the same values
 * (else the collectives report a mismatch).  Frees the per-block state. */
par_status PAR_FN(par_ep_set_dispatch)(PAR_FN(par_ep) *x, par_ep_dispatch mode, int gpus_per_node);
/* Keeps state for n_mb microbatches (0 .. n_mb-1; 1 by default): a
 * pipeline (parallel/step/exec.h) has several microbatches of one block
 * between forward and backward; each call names its microbatch
 * (par_mbctx.mb; parallel/hook/mbstate.h).  Frees the state kept so far. */
par_status PAR_FN(par_ep_set_microbatches)(PAR_FN(par_ep) *x, int n_mb);
void PAR_FN(par_ep_counters_get)(const PAR_FN(par_ep) *x, par_ep_counters *out);
/* --cost-as (parallel/plan/costas.h, not owned; NULL: off): the routed experts
 * charge the target's FLOPs on the rows received, the all-to-alls cost
 * (and count) the target's row bytes; the numerics do not change. */
void PAR_FN(par_ep_set_cost)(PAR_FN(par_ep) *x, const par_costas *ca);
/* ETP inside EP (Megatron-LM's MoE parallel folding; parallel/moe/ep_etp.c):
 * the held experts run as this rank's I/ETP slice over the ETP group `etp`
 * (not owned; its ranks share this rank's ep coordinate, so they hold the
 * same experts, and hold disjoint tokens): the rows each received by the
 * EP dispatch are all-gathered over ETP, every slice runs on all of them
 * (parallel/moe/etp.h's rows layer, sp = 1), the partial outputs are
 * reduce-scattered back before the EP combine; the backward mirrors it and
 * writes the slices' weight gradients (complete for the ETP group's rows)
 * into this rank's block of the whole experts' gradients in the input pass
 * (B), zeros elsewhere: par_reduce_etp_grads sums them over ETP.  A group
 * of one (or NULL) turns it off.  PAR_EINVAL when its size does not divide
 * moe_inter_dim I.  Frees the per-block state.  sp = 0 (TP = ETP without
 * sequence parallelism: the ETP group is the TP group, whose ranks received
 * the same rows): no gather, the partial outputs all-reduced (etp.h). */
par_status PAR_FN(par_ep_set_etp)(PAR_FN(par_ep) *x, par_comm *etp, int64_t I, int sp);
/* TP copies (parallel/moe/ep_tp.c): this rank's tensor-parallel rank (every
 * rank of the EP group calls it; collective).  Without sequence
 * parallelism the TP ranks of one (cp, dp) coordinate hold the same tokens;
 * an EP group spanning them receives every such token once per TP rank.
 * All copies run forward and input pass (each sender gets its outputs); the
 * weight pass leaves the rows of TP ranks > 0 out (dy zeroed), so the held
 * experts' gradients count every token once. */
par_status PAR_FN(par_ep_set_tp)(PAR_FN(par_ep) *x, int tp_rank);
/* The TP shared expert (parallel/moe/ep_tp.c; Megatron-LM's shared expert is a
 * TP MLP whatever EP is): the shared expert of every block runs column /
 * row parallel over the TP group `tp` (not owned; parallel/tp/tp_mlp.h) on
 * this rank's tokens: without sp the TP ranks hold the same tokens and the
 * partial output is all-reduced, with sp (--sequence-parallel) the rank's
 * tokens are all-gathered over TP first and the output reduce-scattered.
 * Its input pass (B) also writes the shard's weight gradients into this TP
 * rank's block of the whole gradients (zeros elsewhere; the weight pass
 * leaves it alone): par_reduce_tp_grads (PAR_TPG_SHARED) sums them over
 * TP.  faults: parallel/tp/tp.h's bits (PAR_TP_FAULT_SHARED_NO_REDUCE).  A
 * group of one (or NULL) runs it whole.  Frees the per-block state. */
par_status PAR_FN(par_ep_set_shared_tp)(PAR_FN(par_ep) *x, par_comm *tp, int sp, unsigned faults);
/* The shared expert's work on this rank so far (parallel/tp/tp.h). */
void PAR_FN(par_ep_shared_stats)(const PAR_FN(par_ep) *x, par_tp_shared_stats *out);
void PAR_FN(par_ep_free)(PAR_FN(par_ep) *x); /* NULL is fine */

/* The executor's entry (parallel/hook/hookset.h): EP > 1, created and
 * configured for the layout (dispatch, microbatches, TP copies, the TP
 * shared expert, ETP inside EP, --cost-as), installed as M->moe; reports
 * its counters (par_hook_report.ep) and the shared expert's work. */
extern const PAR_FN(par_hookset) PAR_FN(par_ep_hookset);

#endif
