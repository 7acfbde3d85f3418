/* parallel/moe/etp.h - expert tensor parallelism (ETP): every routed expert's
 * moe_inter_dim split over the expert-TP group, with the token all-gather /
 * reduce-scatter inside the group as Megatron-LM's MoE parallel folding
 * does (templated: see kernels/real.h).  docs/parallel.md, "Tensor
 * parallelism".
 *
 * Rank r of an ETP group of P holds, for every expert it holds, rows
 * [r*I/P, (r+1)*I/P) of w1 and w3 and the same columns of w2 (packed
 * [d, I/P]): parallel/layout/tp_split.h's cuts over the ETP group.
 *
 * The rows layer (par_etp_rows_*) is the expert computation that sits
 * between an EP dispatch and combine: a rank's rows (x, routing weight,
 * local expert index), sorted by expert.  With etp->sp (the ranks hold
 * disjoint rows, as MoE parallel folding gives them: the ETP group's ranks
 * have different attention-side coordinates, or TP ranks after the SP
 * split) the rows are all-gathered over the group in rank order, each rank
 * runs its I/P slice of every expert on all of them (rows of one expert
 * stably sorted: source rank, then the rank's order -- global token order
 * when rank r holds the r-th token slice), and the partial outputs are
 * reduce-scattered back to the rows' owners (rank order).  Without sp the
 * ranks hold the same rows: no gather, the partial outputs are all-reduced.
 * Backward mirrors it: dy rows gathered, each slice's weight gradients
 * (complete for the group's rows), partial (dx, d rw) rows reduce-scattered
 * (all-reduced).
 *
 * par_etp_moe_* is the whole MoE layer with all E experts held (EP = 1):
 * the serial layer's gathered rows (experts ascending, tokens ascending)
 * through the rows layer, the shared expert through the TP group
 * (parallel/tp/tp_mlp.h; tp NULL: on the rank's tokens), and the contract's
 * per-token combine (kernels/moe.h par_moe_combine).  Against the serial
 * par_moe_forward / _backward on the same tokens (f64): the experts' g, u,
 * h and the slices' weight gradients are bitwise (one ETP group over all
 * tokens, rank r holding the r-th slice); y, dx and the routing weights'
 * gradient within the f64 policy (the sum over I is split by rank).
 */
#ifndef PAR_PARALLEL_MOE_ETP_H
#define PAR_PARALLEL_MOE_ETP_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "parallel/tp/tp.h"
#include "parallel/tp/tp_mlp.h"

/* ---- the rows layer ---------------------------------------------------- */

typedef struct {
    int64_t n, N;          /* this rank's rows; rows the rank computes (all of the group's) */
    int64_t d, Il;         /* dim, hidden units of a slice */
    int nE, rank, P, sp;
    double L;
    int64_t *counts;       /* [P] rows of every rank                         */
    int64_t *off;          /* [nE+1] first sorted row of expert e            */
    int64_t *order;        /* [N] the gathered row at each sorted position   */
    par_real *xs, *rws;    /* [N, d], [N] the rows, sorted by expert         */
    par_real *g, *u, *h;   /* [N, Il] sorted                                 */
    void *buf;
} PAR_FN(par_etp_rows_saved);

void PAR_FN(par_etp_rows_saved_free)(PAR_FN(par_etp_rows_saved) *sv); /* zeroed/freed: fine */

/* y[i] = (rw_i silu(min(x_i w1_e^T, L)) clamp(x_i w3_e^T)) w2_e^T for each of
 * the rank's rows i (e = expert[i] in [0, nE)), complete: summed over the
 * slices of the group.  w1/w2/w3: nE pointers to the rank's slices
 * ([I/P, d], [d, I/P], [I/P, d]).  Collective over etp->comm.  `saved`
 * zeroed or freed; allocated on success. */
par_status PAR_FN(par_etp_rows_forward)(par_real *y,              /* [n, d] */
                                        PAR_FN(par_etp_rows_saved) *saved,
                                        const par_real *x,        /* [n, d] */
                                        const par_real *rw,       /* [n] */
                                        const int32_t *expert,    /* [n] */
                                        int64_t n, const par_real *const *w1,
                                        const par_real *const *w2, const par_real *const *w3,
                                        int nE, int64_t d, int64_t I, double L,
                                        const par_tp *etp);
/* dx += , drw += (complete; each may be NULL on every rank alike);
 * dw1[e], dw2[e], dw3[e] += the slices' gradients over the group's rows
 * (arrays or entries may be NULL). */
par_status PAR_FN(par_etp_rows_backward)(par_real *dx,            /* [n, d] or NULL */
                                         par_real *drw,           /* [n] or NULL */
                                         par_real *const *dw1, par_real *const *dw2,
                                         par_real *const *dw3,
                                         const par_real *dy,      /* [n, d] */
                                         const PAR_FN(par_etp_rows_saved) *saved,
                                         const par_real *const *w1, const par_real *const *w2,
                                         const par_real *const *w3, const par_tp *etp);

/* ---- the MoE layer with every expert held (EP = 1) --------------------- */

/* Shards of one MoE layer: the routed experts' ETP slices (E pointers each)
 * and the shared expert's TP shard. */
typedef struct {
    const par_real *const *w1, *const *w2, *const *w3; /* [E] */
    const par_real *sw1, *sw2, *sw3;
} PAR_FN(par_etp_weights);

typedef struct {
    par_real *const *w1, *const *w2, *const *w3;       /* [E] or NULL */
    par_real *sw1, *sw2, *sw3;                         /* or NULL */
} PAR_FN(par_etp_grads);

typedef struct {
    int64_t T, d;
    int E, K;
    int32_t *tok, *slot, *expert; /* [T*K] the rank's rows (experts ascending, t ascending) */
    par_real *rw;                 /* [T*K] */
    PAR_FN(par_etp_rows_saved) rows;
    PAR_FN(par_tp_mlp_saved) shared;
    void *buf;
} PAR_FN(par_etp_moe_saved);

void PAR_FN(par_etp_moe_saved_free)(PAR_FN(par_etp_moe_saved) *sv); /* zeroed/freed: fine */

/* y = MoE(x) on the rank's T tokens (idx ascending per token, w the routing
 * weights, as par_moe_forward).  etp: the routed experts' group; tp: the
 * shared expert's (NULL: computed whole on the rank's tokens).  Collective
 * over both. */
par_status PAR_FN(par_etp_moe_forward)(par_real *y,               /* [T, d] */
                                       PAR_FN(par_etp_moe_saved) *saved,
                                       const par_real *x,         /* [T, d] */
                                       const int32_t *idx,        /* [T, K] */
                                       const par_real *w,         /* [T, K] */
                                       const PAR_FN(par_etp_weights) *W,
                                       int64_t T, int64_t d, int E, int K, int64_t I, double L,
                                       const par_tp *etp, const par_tp *tp);
/* dx += , dw += (the routing weights' gradient), dW += the shards'. */
par_status PAR_FN(par_etp_moe_backward)(par_real *dx,             /* [T, d] or NULL */
                                        par_real *dw,             /* [T, K] or NULL */
                                        const PAR_FN(par_etp_grads) *dW,
                                        const par_real *dy,       /* [T, d] */
                                        const PAR_FN(par_etp_moe_saved) *saved,
                                        const PAR_FN(par_etp_weights) *W,
                                        const par_tp *etp, const par_tp *tp);

#endif
