/* parallel/pp.h - pipeline parallelism: the executor that runs any schedule
 * of parallel/schedule.h with the model's pieces (templated: see
 * kernels/real.h).  docs/parallel.md "Pipeline parallelism",
 * docs/schedules.md "The executor".
 *
 * Stage s of the schedule runs segment s of the layout (docs/layouts.md):
 * its E / t / m / L items in order.  A rank holds the blocks of its stages
 * (DualPipe: stage r and p-1-r, the two directions' copies), embed.weight on
 * stages with E or m (the MTP input embeds), head.weight on stages with L or
 * m (the MTP head), norm.weight + hc_head_* on the L stage
 * (par_model_init_held).
 *
 * Per step the rank's attention-DP rows are cut into m = Bl / micro_batch
 * microbatches of whole rows.  Every rank holds the global batch, so a stage
 * derives token ids, positions, labels, MTP inputs and sample numbers of a
 * microbatch itself; a stage boundary carries only the n-stream residual
 * [T, n, d] forward and its gradient backward.  Forward of (mb, s): the
 * segment's items on the received residual (E: embed; t: one block; m: MTP
 * input on X_L, the MTP block, the MTP head (CE into the MTP sums); L: the
 * main head (CE into the main sums)).  Backward: the items in reverse with
 * the loss scales of the GLOBAL counts (1/N_main, lambda/N_mtp, aux_alpha,
 * Ns_global: all known from the data before the forward).  The aux-loss
 * gradient of a token needs only the counts (cnt, ntok) of its own sample,
 * and a sample lies in one row, so in one microbatch: they are complete
 * when that microbatch's forward of the block is (with CP, after the CP sum
 * of the microbatch's counts), whatever the schedule does with the others.
 *
 * B and W: the model's block backward computes input and weight gradients
 * together, so a split schedule's B runs the whole backward and its W is a
 * no-op (the numerics are exact; the dry run's bubbles are the schedule's,
 * not what this executor's timeline shows).  An overlapped F&B pair runs as
 * F then B.
 *
 * After the last action: statistics combined over the pipeline (every
 * per-sample and per-block entry comes from one stage: exact) and then
 * over data parallelism (parallel/reduce.h); embed/head gradients summed
 * over the embd / mtp groups (DualPipe: every gradient over the pair of
 * ranks holding the two copies); gradients reduced over DP; the norm
 * counts every entry on its lowest pipeline holder.
 */
#ifndef PAR_PARALLEL_PP_H
#define PAR_PARALLEL_PP_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/ep.h"
#include "parallel/layout.h"
#include "parallel/reduce.h"

typedef struct PAR_FN(par_pp_s) PAR_FN(par_pp);

/* The pipeline rules of a resolved layout that par_layout_resolve leaves to
 * the schedule (DualPipe: PP even, m even, m >= 2 PP; ...): builds the
 * schedule and runs its dry run.  PAR_OK for PP = 1.  PAR_EINVAL names the
 * rule and the numbers. */
par_status PAR_FN(par_pp_check)(const par_layout *l);

/* Collective over the world (every rank calls it): the schedule of P->lay,
 * this rank's stages, and M built with par_model_init_held (experts
 * [e0, e1) of the held blocks).  *out is set only on success. */
par_status PAR_FN(par_pp_create)(PAR_FN(par_pp) **out, const par_pctx *P, PAR_FN(par_model) *M,
                                 const par_config *cfg, uint64_t seed, int64_t e0, int64_t e1);
/* With EP > 1: gives the EP executor one state slot per microbatch. */
par_status PAR_FN(par_pp_set_ep)(PAR_FN(par_pp) *pp, PAR_FN(par_ep) *ep);

/* One training step of this rank up to the optimizer: forward and backward
 * of its microbatches of the global batch `tokens`, `segments` ([B, S], B =
 * the layout's global batch) in the schedule's order; then M->stats and
 * M->last's losses combined as par_reduce_stats leaves them for a PP = 1
 * step, and M->grads with the pipeline's shared gradients summed (embed /
 * head over the embd / mtp groups, DualPipe's copies over their pair): what
 * par_model_backward leaves, ready for the DP reduction and update
 * (parallel/dpwire.h, with the entries of par_pp_norm_skip marked).  keep:
 * 1 keeps the step's activations, routing and logits for par_pp_dump_step.
 * Collective over the world. */
par_status PAR_FN(par_pp_step)(PAR_FN(par_pp) *pp, const par_pctx *P, PAR_FN(par_model) *M,
                               const int32_t *tokens,   /* [B, S] */
                               const int32_t *segments, /* [B, S] */
                               int keep);

/* [tab.n]: 1 for the entries this rank holds but a lower pipeline rank
 * counts in the global norm (embed / head on several stages, DualPipe's
 * copies). */
const uint8_t *PAR_FN(par_pp_norm_skip)(const PAR_FN(par_pp) *pp);

/* Rank 0 assembles the table-layout buffer full [n_float] from every rank's
 * local buffer loc (M->params, grads, opt_m or opt_v): each entry from its
 * lowest pipeline holder with dp = cp = 0 (experts: edp = 0).  Collective. */
par_status PAR_FN(par_pp_gather_full)(PAR_FN(par_pp) *pp, const par_pctx *P, const PAR_FN(par_model) *M,
                                      const par_real *loc, par_real *full /* [n_float], rank 0 */);

/* After par_pp_step(keep = 1) and before the update: rank 0 writes step k's
 * golden-format file (model/golden.h) into dir; grads_full [n_float] is
 * rank 0's scratch for the gathered gradients.  Collective. */
par_status PAR_FN(par_pp_dump_step)(PAR_FN(par_pp) *pp, const par_pctx *P, PAR_FN(par_model) *M,
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
    double net_busy_s;     /* compute inside F/B actions, all PP ranks      */
} par_pp_info;

void PAR_FN(par_pp_info_get)(const PAR_FN(par_pp) *pp, par_pp_info *out);
void PAR_FN(par_pp_free)(PAR_FN(par_pp) *pp); /* NULL is fine */

#endif
