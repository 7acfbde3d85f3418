/* parallel/reduce.h - the cross-rank reduction of a parallel step's
 * statistics (templated: see kernels/real.h): losses, target counts, loads
 * and aux-loss terms, combined over CP and then the world.  Gradient
 * reductions and the global gradient norm go through the optimizer's one
 * reduction point, par_dp_reduce_grads (parallel/zero.h, driven by
 * parallel/dpwire.h).  docs/parallel.md explains what is bitwise and what is
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

#endif
