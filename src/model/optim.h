/* model/optim.h - the update of MODEL.md section 7 (templated).
 *
 * Buffers are flat, indexed by the parameter table's offsets (model/params.h):
 *   params, grads : [n_float]
 *   state.m       : [n_float]  Muon momentum (Muon entries) / AdamW exp_avg (AdamW entries)
 *   state.v       : [n_float]  AdamW exp_avg_sq (AdamW entries; unused elsewhere)
 * Both state buffers start at zero.  Dump names: opt.<name>.momentum = m of
 * a Muon entry; opt.<name>.exp_avg / exp_avg_sq = m / v of an AdamW entry.
 *
 * A step: norm = sqrt(par_grad_sumsq(...)) (a parallel layout reduces the
 * local sums between), f = par_clip_factor(norm, clip_grad), then
 * par_optim_apply (Muon + AdamW with gradients f*g, computed on the fly;
 * grads are not modified) and par_balance_apply.  par_optim_step does all of
 * it serially.
 */
#ifndef PAR_MODEL_OPTIM_H
#define PAR_MODEL_OPTIM_H

#include <stdint.h>

#include "kernels/real.h"
#include "model/config.h"
#include "model/params.h"

#define PAR_ADAM_BETA1 0.9
#define PAR_ADAM_BETA2 0.95
#define PAR_ADAM_EPS 1e-8
#define PAR_MUON_SCALE 0.18
#define PAR_MUON_NORM_EPS 1e-7
#define PAR_CLIP_EPS 1e-6

/* min(1, clip / (norm + 1e-6)). */
static inline double par_clip_factor(double norm, double clip)
{
    double f = clip / (norm + PAR_CLIP_EPS);
    return f < 1.0 ? f : 1.0;
}

/* Sum of squares of x[0..n) in double, in index order. */
double PAR_FN(par_sumsq)(const par_real *x, int64_t n);

/* Local sum of squares of the gradients: every entry with has_grad, each
 * counted once, entries in table order, elements in order, in double.
 * The global norm is sqrt of the (reduced) sum. */
double PAR_FN(par_grad_sumsq)(const par_real *grads, /* [n_float] */
                              const par_param_table *t);

/* grads *= factor (each rounded to the working precision), every entry with
 * has_grad.  par_optim_apply applies the same rounding on the fly, so
 * scaling first and then applying with factor 1 gives the same bits. */
void PAR_FN(par_grad_scale)(par_real *grads, const par_param_table *t, double factor);

/* Muon orthogonalization of one [rows, cols] matrix:
 * X = U / (||U||_F + 1e-7); transposed when rows > cols; 8 steps of
 * X = a X + (b A + c A A) X, A = X X^T, (a,b,c) = (3.4445, -4.7750, 2.0315),
 * then 2 steps with (2, -1.5, 0.5); transposed back.  out may equal U.
 * PAR_ENOMEM if its workspace cannot be allocated. */
par_status PAR_FN(par_muon_orthogonalize)(par_real *out,     /* [rows, cols] */
                                          const par_real *U, /* [rows, cols] */
                                          int64_t rows, int64_t cols);

/* One Muon update of one matrix with the (already clip-scaled by `gscale`)
 * gradient: G = gscale*g;  M = mu M + G;  U = mu M + G;  X = orth(U);
 * W = W (1 - lr wd) - lr * 0.18 * sqrt(max(rows, cols)) * X. */
par_status PAR_FN(par_muon_update)(par_real *w,       /* [rows, cols] */
                                   par_real *mom,     /* [rows, cols] */
                                   const par_real *g, /* [rows, cols] */
                                   int64_t rows, int64_t cols, double gscale, double lr,
                                   double wd, double mu);

/* AdamW on n elements, t the 1-based step:
 * G = gscale*g; m = b1 m + (1-b1) G; v = b2 v + (1-b2) G^2;
 * W = W (1 - lr wd) - lr (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps). */
void PAR_FN(par_adamw_update)(par_real *w,       /* [n] */
                              par_real *m,       /* [n] */
                              par_real *v,       /* [n] */
                              const par_real *g, /* [n] */
                              int64_t n, double gscale, double lr, double wd, int64_t t);

/* The update of one entry idx (Muon per matrix, AdamW with wd only for
 * embed/head, nothing for NONE).  Pointers are to the start of that entry's
 * data (flat + offset).  step is the 1-based update number. */
par_status PAR_FN(par_optim_apply_param)(par_real *w, par_real *m, par_real *v, const par_real *g,
                                         const par_param_table *t, int idx, const par_config *cfg,
                                         int64_t step, double gscale);

/* par_optim_apply_param for every entry, in table order. */
par_status PAR_FN(par_optim_apply)(par_real *params,      /* [n_float] */
                                   par_real *m,           /* [n_float] */
                                   par_real *v,           /* [n_float] */
                                   const par_real *grads, /* [n_float] */
                                   const par_param_table *t, const par_config *cfg, int64_t step,
                                   double gscale);

/* model/optim_gpu.c (offload builds), when kernels use device memory:
 * par_optim_gpu_apply is par_optim_apply_param over every entry i with
 * loc[i] >= 0 (its offset in the buffers), Muon's matrices of one shape batched
 * into each launch; par_optim_gpu_sumsq sets sums[i] to par_sumsq of
 * x[loc[i], loc[i] + len[i]) (0 where loc[i] < 0) in one launch, returning 1,
 * or 0 with nothing set (no memory for its index).  The same bits per matrix
 * and per sum as the unbatched calls. */
par_status PAR_FN(par_optim_gpu_apply)(par_real *params, par_real *m, par_real *v, /* [n_float] each */
                                       const par_real *grads,                      /* [n_float] */
                                       const par_param_table *t,
                                       const int64_t *loc,                         /* [t->n] */
                                       const par_config *cfg, int64_t step, double gscale);
int PAR_FN(par_optim_gpu_sumsq)(double *sums,       /* [n] */
                                const par_real *x,  /* [n_float] */
                                const int64_t *loc, /* [n] */
                                const int64_t *len, /* [n] */
                                int n);

/* bias[e] += rate * sign(K*T_total/E - load[e]), sign(0) = 0. */
void PAR_FN(par_balance_update)(par_real *bias,       /* [E] */
                                const int64_t *load,  /* [E] */
                                int64_t E, int64_t K, int64_t T_total, double rate);

/* Balance update of every score-routed block (gate.bias present):
 * loads[b*E + e] = tokens of the global batch block b routed to e
 * (rows of hash blocks are ignored); T_total tokens per block. */
void PAR_FN(par_balance_apply)(par_real *params,      /* [n_float] */
                               const int64_t *loads,  /* [n_blocks, E] */
                               const par_param_table *t, const par_config *cfg, int64_t T_total);

/* The whole serial update: global grad norm (returned in *grad_norm if not
 * NULL, before clipping), clip factor, Muon + AdamW, balance.  step is the
 * 1-based update number.  Gradients are left unchanged. */
par_status PAR_FN(par_optim_step)(par_real *params,      /* [n_float] */
                                  const par_real *grads, /* [n_float] */
                                  par_real *m,           /* [n_float], zero at start */
                                  par_real *v,           /* [n_float], zero at start */
                                  const par_param_table *t, const par_config *cfg, int64_t step,
                                  const int64_t *loads,  /* [n_blocks, E] */
                                  int64_t T_total, double *grad_norm);

#endif
