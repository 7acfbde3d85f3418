/* parallel/reduce.h - THE cross-rank reduction point of a parallel step
 * (templated: see kernels/real.h).  Every sum over ranks of a training step
 * goes through this file: the step statistics (losses, loads, aux-loss
 * terms), the gradient all-reduces (dense over the attention data-parallel
 * group, routed experts over the expert data-parallel group) and the global
 * gradient norm.  docs/parallel.md explains what is bitwise and what is
 * within the f64 policy.
 *
 * A rank's context (par_pctx) carries the resolved layout, its coordinates
 * and its group handles (parallel/groups.h).
 */
#ifndef PAR_PARALLEL_REDUCE_H
#define PAR_PARALLEL_REDUCE_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/groups.h"
#include "parallel/layout.h"

#if PAR_REAL_BITS == 64
#define PAR_C_REAL PAR_C_F64
#else
#define PAR_C_REAL PAR_C_F32
#endif

/* One rank's view of the layout (untemplated plain data). */
typedef struct {
    const par_layout *lay; /* resolved */
    par_comm *world;
    par_groups g;          /* this rank's handles (par_groups_build) */
    par_rank_coords rc;
    int rank, N;
} par_pctx;

/* Combines M->stats (this rank's window of samples, filled by
 * par_model_forward on the rank's rows; st->q0 and st->Ns_global set by the
 * caller) over the world and sets M->last's losses:
 *   - n_main, n_mtp, n_tokens and the loads [n_blocks, E]: integer sums
 *     (exact), written back into M->stats (the balance update and the
 *     backward's loss scales then see the global batch);
 *   - per-sample CE sums and aux-loss terms: gathered in global sample order
 *     and summed exactly as the serial reference does (bitwise equal).
 * The per-sample arrays stay this rank's window: the aux backward reads only
 * its own tokens' samples.  With CP > 1 the CP ranks of a data-parallel
 * group share one window (parallel/cpwire.h): their partial statistics are
 * first summed over the CP group (rank order), then cp = 0 represents the
 * group in the world step.  Collective over the world.
 * PAR_EMISMATCH if the windows do not tile [0, Ns_global). */
par_status PAR_FN(par_reduce_stats)(const par_pctx *P, PAR_FN(par_model) *M);

/* After par_model_backward on every rank: sums the dense gradients over the
 * attention data-parallel x CP group and the held experts' over the expert
 * data-parallel group (rank-order sums), then the global squared norm with
 * every entry counted once (on one replica), summed in table order:
 * M->stats.grad_sumsq and M->last.grad_norm.  Collective over the world. */
par_status PAR_FN(par_reduce_grads)(const par_pctx *P, PAR_FN(par_model) *M);

/* 1 when this rank counts entry idx in the global norm (and supplies it to
 * a dump): dense entries on attention dp = cp = 0, experts on edp = 0. */
int PAR_FN(par_reduce_counts_entry)(const par_pctx *P, const PAR_FN(par_model) *M, int idx);

#endif
