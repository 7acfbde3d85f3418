/* parallel/tp/tp_muon.h - Muon on a matrix held as tensor-parallel shards
 * (templated: see kernels/real.h).  docs/parallel.md, "Tensor
 * parallelism".
 *
 * Muon orthogonalizes the WHOLE logical matrix (MODEL.md 7): Newton-Schulz
 * of a TP shard is a different matrix function (X X^T of a block is not a
 * block of X X^T), which a real framework shipped as a bug.  So:
 *   1. every rank: G = gscale*g, M = mu M + G, U = mu M + G on its shard
 *      (element-wise: the shard's elements of the serial update);
 *   2. the U shards go to the matrix's owner (point to point), which
 *      assembles the logical [rows, cols] U and runs par_muon_orthogonalize;
 *   3. the owner sends every rank its shard of X;
 *   4. every rank: W = W (1 - lr wd) - lr 0.18 sqrt(max(rows, cols)) X on its
 *      shard, with the LOGICAL shape's scale.
 * Bitwise equal to par_muon_update (model/optim.h) of the whole matrix.
 * The owner is the caller's choice (the driver spreads matrices over the
 * group); the optimizer step of the next round calls this per sharded
 * Muon matrix, after the DP reduction of its gradient shard.
 */
#ifndef PAR_PARALLEL_TP_TP_MUON_H
#define PAR_PARALLEL_TP_TP_MUON_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "parallel/tp/tp.h"
#include "parallel/layout/tp_split.h"

/* One Muon update of a logical [rows, cols] matrix cut `cut` over the group
 * (PAR_TP_REPLICATED: every rank holds it whole and updates it itself, as
 * the serial step).  w, mom, g: this rank's shard.  Collective over
 * tp->comm.  Under PAR_TP_FAULT_MUON_SHARD each rank orthogonalizes its own
 * shard (the bug; tests only). */
par_status PAR_FN(par_tp_muon_update)(par_real *w,         /* shard */
                                      par_real *mom,       /* shard */
                                      const par_real *g,   /* shard */
                                      int64_t rows, int64_t cols, par_tp_cut cut, int owner,
                                      double gscale, double lr, double wd, double mu,
                                      const par_tp *tp);

/* The deliberate bug of PAR_TP_FAULT_MUON_SHARD on whole storage (parity
 * run today: every TP rank holds the whole matrix): each of the P TP shards
 * of the [rows, cols] matrix `name` (parallel/layout/tp_split.h's cut) updated by
 * par_muon_update of the shard alone, which is what every rank of split
 * storage computes with the bug; the ranks stay identical.  A replicated
 * matrix (or P == 1) gets the correct par_muon_update.  Tests and fault
 * cells only. */
par_status PAR_FN(par_tp_muon_shard_fault)(par_real *w,       /* [rows, cols] */
                                           par_real *mom,     /* [rows, cols] */
                                           const par_real *g, /* [rows, cols] */
                                           const char *name, int64_t rows, int64_t cols, int P,
                                           double gscale, double lr, double wd, double mu);

#endif
