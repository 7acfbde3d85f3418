/* parallel/step/exec.h - the step executor: one training step of a rank up
 * to the optimizer, for every layout, as the interpreter of a pipeline
 * schedule (parallel/schedule/schedule.h) with the model's pieces (templated: see
 * kernels/real.h).  docs/parallel.md "The step executor", docs/schedules.md
 * "The executor".
 *
 * No pipeline is a pipeline of one stage: PP = 1 runs the schedule
 * "1f1b" of one rank and ONE microbatch holding all of the rank's rows
 * (so every GEMM sees the rows the serial reference's does; the layout's
 * micro-batch-size only cuts microbatches under PP > 1), i.e. F then BW.
 *
 * Stage s of the schedule runs segment s of the layout (docs/layouts.md):
 * its E / t / m / L items in order.  A rank holds the blocks of its stages
 * (DualPipe: stage r and p-1-r, the two directions' copies), embed.weight on
 * stages with E or m (the MTP input embeds), head.weight on stages with L or
 * m (the MTP head), norm.weight + hc_head_* on the L stage
 * (par_model_init_held).  With EP > 1 the executor owns the MoE hook
 * (parallel/moe/ep.h), with CP > 1 the attention hook (parallel/cp/cp_hook.h),
 * installed once; each call of a model piece passes the microbatch's
 * context (model/model.h par_mbctx: its state slot, its rows, their
 * positions), never state installed into the model.
 *
 * Per step the rank's attention-DP rows are cut into microbatches of whole
 * rows.  Every rank holds the global batch, so a stage derives token ids,
 * positions, labels, MTP inputs and sample numbers of a microbatch itself
 * (with CP: on the whole rows, then the rank's column slice); a stage
 * boundary carries only the n-stream residual [T, n, d] forward and its
 * gradient backward.  Forward of (mb, s): the segment's items on the
 * received residual (E: embed; t: one block; m: MTP input on X_L, the MTP
 * block, the MTP head (CE into the MTP sums); L: the main head (CE into the
 * main sums)).  Backward: the items in reverse with the loss scales of the
 * GLOBAL counts (1/N_main, lambda/N_mtp, aux_alpha, Ns_global: all known
 * from the data before the forward).  The aux-loss gradient of a token
 * needs only the counts (cnt, ntok) of its own sample, and a sample lies in
 * one row, so in one microbatch: they are complete when that microbatch's
 * forward of the block is (with CP, after the CP sum of the microbatch's
 * counts), whatever the schedule does with the others.
 *
 * B, W and BW: BW runs, item by item, the one-pass backward (model/model.h
 * par_block_backward, ...); a split schedule's B runs the input passes of
 * the stage's items (*_backward_input, keeping what W needs in the (mb,
 * stage) slot), its W later runs their weight passes (*_backward_weights)
 * in the same item order.  An overlapped F&B pair (DualPipe) runs as F then
 * B.
 *
 * After the last action: the statistics and losses (parallel/reduce/reduce.h
 * par_reduce_stats), embed/head gradients summed over the embd / mtp groups
 * (DualPipe: every gradient over the pair of ranks holding the two copies);
 * the DP reduction, the norm (each entry counted on its lowest pipeline
 * holder, par_exec_skips_norm) and the update follow (parallel/dp/dpw.h).
 */
#ifndef PAR_PARALLEL_STEP_EXEC_H
#define PAR_PARALLEL_STEP_EXEC_H

#include <stdint.h>

#include "comm/netmodel.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/plan/costas.h"
#include "parallel/cp/cp.h"
#include "parallel/moe/ep.h"
#include "parallel/layout/layout.h"
#include "parallel/reduce/reduce.h"

typedef struct PAR_FN(par_exec_s) PAR_FN(par_exec);

/* The pipeline rules of a resolved layout that par_layout_resolve leaves to
 * the schedule (DualPipe: PP even, m even, m >= 2 PP; ...): builds the
 * schedule and runs its dry run.  PAR_OK for PP = 1.  PAR_EINVAL names the
 * rule and the numbers. */
par_status PAR_FN(par_exec_check)(const par_layout *l);

typedef struct {
    uint64_t seed;            /* the parameters' init */
    int moe_dispatch;         /* EP: 0 flat, 1 hierarchical (par_ep_dispatch) */
    int gpus_per_node;        /* EP tiers and relays (>= 1) */
    const par_netmodel *net;  /* the emulated network or NULL: the message
                               * latency of the dry run with measured costs */
    const par_costas *ca;     /* --cost-as (parallel/plan/costas.h) or NULL: with a network,
                               * the clock charges the target's compute and bytes */
    unsigned tp_faults;       /* PAR_TP_FAULT_* (parallel/tp/tp.h); 0 in real runs */
    const par_param_table *tab; /* the run's parameter table for the model to borrow (one per
                                 * process instead of one per rank; NULL: the model builds one) */
    /* the model's dense weights from the process's shared copy
     * (par_model_hold.share; parallel/dp/replicas.h), NULL: the model's own */
    par_status (*share)(void *ctx, void *model);
    void *share_ctx;
} par_exec_opts;

/* Collective over the world (every rank calls it): the schedule of P->lay,
 * this rank's stages, M built with par_model_init_held (the EP rank's
 * experts of the held blocks), the EP / CP hooks installed.  *out is set
 * only on success. */
par_status PAR_FN(par_exec_create)(PAR_FN(par_exec) **out, const par_pctx *P, PAR_FN(par_model) *M,
                                   const par_config *cfg, const par_exec_opts *o);

/* One training step of this rank up to the optimizer: forward and backward
 * of its microbatches of the global batch `tokens`, `segments` ([B, S], B =
 * the layout's global batch) in the schedule's order; then M->stats and
 * M->last's losses combined (par_reduce_stats) and M->grads with the
 * pipeline's shared gradients summed: ready for the DP reduction and update
 * (parallel/dp/dpw.h, with the entries of par_exec_skips_norm marked).
 * keep: 1 keeps the step's activations, routing and logits for
 * par_exec_dump_step.  Collective over the world. */
par_status PAR_FN(par_exec_step)(PAR_FN(par_exec) *ex, const par_pctx *P, PAR_FN(par_model) *M,
                                 const int32_t *tokens,   /* [B, S] */
                                 const int32_t *segments, /* [B, S] */
                                 int keep);

/* 1 for table entry idx when this rank holds it but a lower pipeline rank
 * counts it in the global norm (embed / head on several stages, DualPipe's
 * copies; a TP / ETP copy another rank counts). */
int PAR_FN(par_exec_skips_norm)(const PAR_FN(par_exec) *ex, int idx);

/* Rank 0 assembles the table-layout buffer full [n_float] from every rank's
 * local buffer loc (M->params, grads, or a gathered optimizer state): each
 * entry from its lowest pipeline holder with dp = cp = 0 (experts: edp =
 * 0).  Collective. */
par_status PAR_FN(par_exec_gather_full)(PAR_FN(par_exec) *ex, const par_pctx *P, const PAR_FN(par_model) *M,
                                        const par_real *loc, par_real *full /* [n_float], rank 0 */);

/* After par_exec_step(keep = 1) and before the update: rank 0 writes step
 * k's golden-format file (model/golden.h) into dir, streamed: the kept
 * tensors are gathered, written and freed one at a time (parallel/step/exec_dump.c);
 * grads_full [n_float] is rank 0's scratch for the gathered gradients.
 * Collective. */
par_status PAR_FN(par_exec_dump_step)(PAR_FN(par_exec) *ex, const par_pctx *P, PAR_FN(par_model) *M,
                                      const int32_t *tokens, const int32_t *segments, par_real *grads_full,
                                      const char *dir, int64_t k);

typedef struct {
    const char *schedule;  /* the schedule's name                           */
    int n_micro, n_stages, n_chunks;
    double dry_bubble;     /* the dry run's bubble (F = 1, B = 2, W = 1)     */
    /* from the emulated network's clock (when the world has one): the
     * pipeline phase of the steps so far, PP group of this rank */
    int net_steps;         /* 0: no network                                 */
    double net_bubble;     /* 1 - sum busy / (PP * makespan), over the steps */
    double net_makespan_s; /* summed over the steps                         */
    double net_busy_s;     /* compute inside F/B/W actions, all PP ranks    */
    /* the dry run of the same schedule with the executor's own per-action
     * costs (mean virtual time of F, B (+W), W of each stage over the
     * steps) and the network's message time: its bubble, -1 without a
     * network; the mean costs over the stages (seconds) */
    double dry_bubble_measured;
    double cost_f_s, cost_b_s, cost_w_s, latency_s;
    int64_t act_peak;      /* bytes of saved activations, peak over the slots */
} par_exec_info;

void PAR_FN(par_exec_info_get)(const PAR_FN(par_exec) *ex, par_exec_info *out);
/* The hooks' counters (zeros without EP / CP). */
void PAR_FN(par_exec_counters)(const PAR_FN(par_exec) *ex, par_ep_counters *ep, par_cp_traffic *cp);
/* The shared expert's work on this rank (parallel/tp/tp.h; TP-split when
 * parallel/layout/tp_split.h par_tp_shared_expert_split; zeros without a MoE hook
 * that runs it: EP = ETP = TP = 1). */
void PAR_FN(par_exec_shared_stats)(const PAR_FN(par_exec) *ex, par_tp_shared_stats *out);
void PAR_FN(par_exec_free)(PAR_FN(par_exec) *ex); /* NULL is fine */

#endif
