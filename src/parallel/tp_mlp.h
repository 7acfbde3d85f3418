/* parallel/tp_mlp.h - tensor (and sequence) parallelism for a SwiGLU MLP:
 * the V4 shared expert (and any dense MLP), Megatron's column-parallel w1 /
 * w3 and row-parallel w2 (templated: see kernels/real.h).  docs/parallel.md,
 * "Tensor parallelism".
 *
 * Rank r of P holds rows [r*I/P, (r+1)*I/P) of w1 and w3 ([I/P, d]) and the
 * same columns of w2 ([d, I/P], packed); parallel/tp_split.h's cuts.
 * Forward: x (all-gathered first with sp) -> g, u, h on the rank's I/P
 * hidden units (par_moe_expert_forward on the shard) -> a partial y summed
 * over the group (all-reduce; sp: reduce-scatter).  Backward: dy
 * (all-gathered with sp) -> the shard's weight gradients, complete; the
 * partial dx summed over the group (all-reduce; sp: reduce-scatter).
 *
 * Against the serial expert (kernels/moe.h, rw = 1) on the same x, dy, f64:
 * g, u, h and the shard's dw1, dw2, dw3 are bitwise (column slices of the
 * products); y and dx within the f64 policy (sums over I split by rank).
 */
#ifndef PAR_PARALLEL_TP_MLP_H
#define PAR_PARALLEL_TP_MLP_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "parallel/tp.h"

typedef struct {
    int64_t T, Tx, d, Il;   /* tokens of the layer, of this rank, dim, hidden units held */
    int rank, P, sp;
    double L;               /* swiglu_limit */
    par_real *x;            /* [T, d] the (gathered) input */
    par_real *g, *u, *h;    /* [T, Il] */
    void *buf;
} PAR_FN(par_tp_mlp_saved);

void PAR_FN(par_tp_mlp_saved_free)(PAR_FN(par_tp_mlp_saved) *sv); /* zeroed/freed: fine */

/* y = MLP(x) for the rank's tokens: x, y [Tx, d] (Tx = T, or T/P with sp).
 * w1, w3 [I/P, d], w2 [d, I/P]: the shard.  PAR_EINVAL when P does not
 * divide I (or, with sp, T).  Collective over tp->comm.  `saved` zeroed or
 * freed; allocated on success. */
par_status PAR_FN(par_tp_mlp_forward)(par_real *y,              /* [Tx, d] */
                                      PAR_FN(par_tp_mlp_saved) *saved,
                                      const par_real *x,        /* [Tx, d] */
                                      const par_real *w1,       /* [I/P, d] */
                                      const par_real *w2,       /* [d, I/P] */
                                      const par_real *w3,       /* [I/P, d] */
                                      int64_t T, int64_t d, int64_t I, double L, const par_tp *tp);
/* dx += (complete, summed over the group; NULL on every rank or none);
 * dw1, dw2, dw3 += the shard's gradients (any may be NULL). */
par_status PAR_FN(par_tp_mlp_backward)(par_real *dx,            /* [Tx, d] or NULL */
                                       par_real *dw1,           /* [I/P, d] or NULL */
                                       par_real *dw2,           /* [d, I/P] or NULL */
                                       par_real *dw3,           /* [I/P, d] or NULL */
                                       const par_real *dy,      /* [Tx, d] */
                                       const PAR_FN(par_tp_mlp_saved) *saved,
                                       const par_real *w1, const par_real *w2, const par_real *w3,
                                       const par_tp *tp);

#endif
