/* kernels/mhc.h - mHC residual-stream kernels (MODEL.md section 2,
 * docs/model-reading.md "mHC pre", "mHC post", "Head"; templated: see
 * kernels/real.h).
 *
 * Shapes: T tokens, n = hc_mult streams, d = dim, P = (2+n)*n mixes.
 * X is [T, n, d]: for one token the n streams lie back to back, so the
 * flattened v = X[t] is stream-major (v[i*d + c] = X_i[c]).
 *
 * hc_pre (one sub-layer wrapper):
 *   rsq    = 1 / sqrt(mean(v^2) + norm_eps)          mean over all n*d values
 *   mixes  = (fn v) * rsq                            [P]
 *   pre_i  = sigmoid(mixes[i] * scale[0] + base[i]) + hc_eps
 *   post_j = 2 sigmoid(mixes[n+j] * scale[1] + base[n+j])      (no eps)
 *   C      = Sinkhorn(mixes[2n + j*n + k] * scale[2] + base[2n + j*n + k])
 *   x      = sum_i pre_i X_i                          (un-normalised X)
 * Sinkhorn (reference order): row softmax over k, + hc_eps; C /= (colsum +
 * hc_eps); then (iters - 1) times: C /= (rowsum + hc_eps), C /= (colsum +
 * hc_eps).
 * hc_post:  Xout_k = post_k f + sum_j C[j][k] X_j.
 * hc_head:  mixes = (fn v) * rsq ([n]); pre_i = sigmoid(mixes[i] * scale[0] +
 *           base[i]) + hc_eps; x = sum_i pre_i X_i.  No Sinkhorn, no post.
 *
 * Forward functions overwrite their outputs; backward functions ACCUMULATE
 * (+=) into every gradient output, any of which may be NULL when not wanted.
 * Every sum runs in a fixed order (no BLAS); the only OpenMP loops are over
 * tokens (or column blocks of dfn), each output element written by one
 * thread, so results do not depend on the thread count nor on how tokens are
 * batched.  See docs/kernels.md "Kernels: mHC".
 */
#ifndef PAR_KERNELS_MHC_H
#define PAR_KERNELS_MHC_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "kernels/offload.h"
#include "kernels/real.h"

#define PAR_HC_MAX_N 16 /* largest hc_mult the kernels accept */

/* What hc_pre's forward keeps for hc_post and for its own backward.  All
 * pointers are carved out of one caller-owned buffer of
 * par_hc_saved_bytes(T, n, iters) bytes by par_hc_saved_init (each piece
 * 64-byte aligned if the buffer is).  The Sinkhorn iterates are NOT kept
 * (2 * iters [n, n] matrices per token, the largest piece): the backward
 * recomputes one token's from the saved mixes with the forward's
 * operations, so the bits are those of a saved copy.  `work` is scratch the
 * backward overwrites. */
typedef struct {
    int64_t T, n, iters;
    par_real *proj;  /* [T, P] fn v (before the rsqrt)      */
    par_real *rsq;   /* [T] 1/sqrt(mean(v^2) + norm_eps)     */
    par_real *mixes; /* [T, P] proj * rsq                    */
    par_real *pre;   /* [T, n]                               */
    par_real *post;  /* [T, n]  -> hc_post                   */
    par_real *C;     /* [T, n, n] C[j][k] -> hc_post         */
    par_real *work;  /* [T, P] backward scratch              */
} PAR_FN(par_hc_saved);

size_t PAR_FN(par_hc_saved_bytes)(int64_t T, int64_t n, int64_t iters);
/* buf must hold par_hc_saved_bytes(T, n, iters) bytes. */
void PAR_FN(par_hc_saved_init)(PAR_FN(par_hc_saved) *s, void *buf, int64_t T, int64_t n,
                               int64_t iters);

/* Same for hc_head (P = n, no post, no Sinkhorn). */
typedef struct {
    int64_t T, n;
    par_real *proj;  /* [T, n] */
    par_real *rsq;   /* [T]    */
    par_real *mixes; /* [T, n] */
    par_real *pre;   /* [T, n] */
    par_real *work;  /* [T, n] backward scratch */
} PAR_FN(par_hc_head_saved);

size_t PAR_FN(par_hc_head_saved_bytes)(int64_t T, int64_t n);
void PAR_FN(par_hc_head_saved_init)(PAR_FN(par_hc_head_saved) *s, void *buf, int64_t T,
                                    int64_t n);

/* ---- hc_pre ---- */
/* Fails (PAR_EINVAL) when n is outside [1, PAR_HC_MAX_N], iters < 1, T < 0,
 * d < 1, or `saved` was initialised for other T/n/iters. */
par_status PAR_FN(par_hc_pre_forward)(par_real *x,                     /* [T, d] out */
                                      const PAR_FN(par_hc_saved) *saved, /* filled */
                                      const par_real *X,                 /* [T, n, d] */
                                      const par_real *fn,                /* [P, n*d] */
                                      const par_real *base,              /* [P] */
                                      const par_real *scale,             /* [3] */
                                      int64_t T, int64_t n, int64_t d, int64_t iters,
                                      double hc_eps, double norm_eps);
/* Gradients of x, post and C flow back through all Sinkhorn steps, the
 * sigmoids, the rsqrt normalisation and fn/base/scale into dX and the
 * parameters.  dx, dpost or dC NULL = zero gradient.  Uses saved->work. */
par_status PAR_FN(par_hc_pre_backward)(par_real *dX,          /* [T, n, d] += or NULL */
                                       par_real *dfn,         /* [P, n*d] += or NULL */
                                       par_real *dbase,       /* [P] += or NULL */
                                       par_real *dscale,      /* [3] += or NULL */
                                       const par_real *dx,    /* [T, d] or NULL */
                                       const par_real *dpost, /* [T, n] or NULL */
                                       const par_real *dC,    /* [T, n, n] or NULL */
                                       const PAR_FN(par_hc_saved) *saved,
                                       const par_real *X,     /* [T, n, d] */
                                       const par_real *fn,    /* [P, n*d] */
                                       const par_real *base,  /* [P] */
                                       const par_real *scale, /* [3] */
                                       int64_t T, int64_t n, int64_t d, int64_t iters,
                                       double hc_eps, double norm_eps);

/* ---- hc_post ---- */
/* Xout_k = post_k f + sum_j C[j][k] X_j.  Xout must not alias X or f. */
void PAR_FN(par_hc_post_forward)(par_real *Xout,       /* [T, n, d] out */
                                 const par_real *f,    /* [T, d] */
                                 const par_real *X,    /* [T, n, d] */
                                 const par_real *post, /* [T, n] */
                                 const par_real *C,    /* [T, n, n] */
                                 int64_t T, int64_t n, int64_t d);
void PAR_FN(par_hc_post_backward)(par_real *df,          /* [T, d] += or NULL */
                                  par_real *dX,          /* [T, n, d] += or NULL */
                                  par_real *dpost,       /* [T, n] += or NULL */
                                  par_real *dC,          /* [T, n, n] += or NULL */
                                  const par_real *dXout, /* [T, n, d] */
                                  const par_real *f,     /* [T, d] */
                                  const par_real *X,     /* [T, n, d] */
                                  const par_real *post,  /* [T, n] */
                                  const par_real *C,     /* [T, n, n] */
                                  int64_t T, int64_t n, int64_t d);

/* ---- hc_head ---- */
par_status PAR_FN(par_hc_head_forward)(par_real *x,                          /* [T, d] out */
                                       const PAR_FN(par_hc_head_saved) *saved, /* filled */
                                       const par_real *X,                      /* [T, n, d] */
                                       const par_real *fn,                     /* [n, n*d] */
                                       const par_real *base,                   /* [n] */
                                       const par_real *scale,                  /* [1] */
                                       int64_t T, int64_t n, int64_t d, double hc_eps,
                                       double norm_eps);
par_status PAR_FN(par_hc_head_backward)(par_real *dX,          /* [T, n, d] += or NULL */
                                        par_real *dfn,         /* [n, n*d] += or NULL */
                                        par_real *dbase,       /* [n] += or NULL */
                                        par_real *dscale,      /* [1] += or NULL */
                                        const par_real *dx,    /* [T, d] */
                                        const PAR_FN(par_hc_head_saved) *saved,
                                        const par_real *X,     /* [T, n, d] */
                                        const par_real *fn,    /* [n, n*d] */
                                        const par_real *base,  /* [n] */
                                        const par_real *scale, /* [1] */
                                        int64_t T, int64_t n, int64_t d, double hc_eps,
                                        double norm_eps);

/* ---- Sinkhorn on one [n, n] matrix (used by hc_pre; exposed for tests) ---- */
/* Device-callable (kernels/offload.h): hc_pre's device loops call them. */
PAR_DECLARE_TARGET
/* C = Sinkhorn(L) as above; sk [2*iters, n, n] receives the saved matrices. */
void PAR_FN(par_sinkhorn_forward)(par_real *C,       /* [n, n] out */
                                  par_real *sk,      /* [2*iters, n, n] saved */
                                  const par_real *L, /* [n, n] logits */
                                  int64_t n, int64_t iters, double hc_eps);
/* dL += the gradient of <dC, C> wrt L, back through every step.
 * n <= PAR_HC_MAX_N. */
void PAR_FN(par_sinkhorn_backward)(par_real *dL,       /* [n, n] += */
                                   const par_real *dC, /* [n, n] */
                                   const par_real *sk, /* [2*iters, n, n] */
                                   int64_t n, int64_t iters, double hc_eps);
PAR_END_DECLARE_TARGET

#endif
