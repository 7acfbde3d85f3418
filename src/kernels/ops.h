/* kernels/ops.h - basic forward/backward pairs (templated: see kernels/real.h).
 *
 * Conventions: row-major; T = number of tokens (rows); weights are stored
 * [out_features, in_features] so Linear_W(x) = x W^T.  Forward functions
 * overwrite their outputs; backward functions ACCUMULATE (+=) into every
 * gradient output, and any gradient output may be NULL when not wanted.
 */
#ifndef PAR_KERNELS_OPS_H
#define PAR_KERNELS_OPS_H

#include <stdint.h>

#include "kernels/gemm.h" /* par_gemm */
#include "kernels/real.h"

/* out = in W^T */
void PAR_FN(par_linear_forward)(par_real *out,      /* [T, N] */
                                const par_real *in, /* [T, K] */
                                const par_real *w,  /* [N, K] */
                                int64_t T, int64_t K, int64_t N);
/* din += dout W ; dw += dout^T in */
void PAR_FN(par_linear_backward)(par_real *din,       /* [T, K] or NULL */
                                 par_real *dw,        /* [N, K] or NULL */
                                 const par_real *dout, /* [T, N] */
                                 const par_real *in,  /* [T, K] */
                                 const par_real *w,   /* [N, K] */
                                 int64_t T, int64_t K, int64_t N);

/* out = w * in / sqrt(mean(in^2) + eps) over rows of D; w may be NULL (no
 * weight: per-head q normalisation).  `rstd` saves 1/sqrt(mean+eps) per row.
 * In-place (out == in) is allowed in forward. */
void PAR_FN(par_rmsnorm_forward)(par_real *out,      /* [T, D] */
                                 par_real *rstd,     /* [T] saved */
                                 const par_real *in, /* [T, D] */
                                 const par_real *w,  /* [D] or NULL */
                                 int64_t T, int64_t D, double eps);
void PAR_FN(par_rmsnorm_backward)(par_real *din,        /* [T, D] or NULL */
                                  par_real *dw,         /* [D] or NULL */
                                  const par_real *dout, /* [T, D] */
                                  const par_real *in,   /* [T, D] the forward input */
                                  const par_real *w,    /* [D] or NULL */
                                  const par_real *rstd, /* [T] */
                                  int64_t T, int64_t D);

/* out[t] = table[ids[t]] */
void PAR_FN(par_embedding_forward)(par_real *out,         /* [T, D] */
                                   const int32_t *ids,    /* [T] */
                                   const par_real *table, /* [V, D] */
                                   int64_t T, int64_t D);
/* dtable[ids[t]] += dout[t], rows in ascending t (deterministic). */
void PAR_FN(par_embedding_backward)(par_real *dtable,     /* [V, D] */
                                    const par_real *dout, /* [T, D] */
                                    const int32_t *ids,   /* [T] */
                                    int64_t T, int64_t D);

/* Clamped SwiGLU of an expert's hidden layer (MODEL.md section 4):
 *   h = rw * silu(min(g, L)) * clamp(u, -L, L)
 * g = x w1^T, u = x w3^T; rw the per-row routing weight (NULL = 1).
 * L <= 0 disables both clamps. */
void PAR_FN(par_swiglu_forward)(par_real *h,        /* [T, nI] */
                                const par_real *g,  /* [T, nI] */
                                const par_real *u,  /* [T, nI] */
                                const par_real *rw, /* [T] or NULL */
                                int64_t T, int64_t nI, double L);
/* dg += dh * d h/d g ; du += ... ; drw[t] += sum_i dh * silu(..)*clamp(..).
 * Clamped regions pass no gradient (derivative of min/clamp taken as 0
 * outside, 1 inside; at the boundary itself the inside value). */
void PAR_FN(par_swiglu_backward)(par_real *dg,        /* [T, nI] or NULL */
                                 par_real *du,        /* [T, nI] or NULL */
                                 par_real *drw,       /* [T] or NULL */
                                 const par_real *dh,  /* [T, nI] */
                                 const par_real *g,   /* [T, nI] */
                                 const par_real *u,   /* [T, nI] */
                                 const par_real *rw,  /* [T] or NULL */
                                 int64_t T, int64_t nI, double L);

/* The routing weight's gradient of par_swiglu_backward as a sum continued
 * over split hidden units (the bitwise mode's expert tensor parallelism):
 * acc[t] += dh s(g) u over i in order, in double, with the same clamps and
 * the same products; par_swiglu_backward's drw[t] += (real)acc[t] once the
 * last slice has run.  Host only. */
void PAR_FN(par_swiglu_drw_part)(double *acc,         /* [T] */
                                 const par_real *dh,  /* [T, nI] */
                                 const par_real *g,   /* [T, nI] */
                                 const par_real *u,   /* [T, nI] */
                                 int64_t T, int64_t nI, double L);

/* Softmax cross-entropy per row.  For rows with target[t] >= 0:
 *   ce[t] = logsumexp(logits[t]) - logits[t][target[t]],  lse[t] saved;
 * rows with target < 0 get ce = 0 (no label). */
void PAR_FN(par_xent_forward)(par_real *ce,           /* [T] */
                              par_real *lse,          /* [T] saved */
                              const par_real *logits, /* [T, V] */
                              const int32_t *target,  /* [T], -1 = none */
                              int64_t T, int64_t V);
/* dlogits[t] += scale * (softmax(logits[t]) - onehot(target[t])) for rows
 * with a target (scale = dLoss/dce, the same for every row). */
void PAR_FN(par_xent_backward)(par_real *dlogits,       /* [T, V] */
                               const par_real *logits,  /* [T, V] */
                               const par_real *lse,     /* [T] */
                               const int32_t *target,   /* [T] */
                               double scale, int64_t T, int64_t V);

/* Scalar helpers (par_sigmoid, par_softplus, par_silu) live in kernels/scalar.h. */
#include "kernels/scalar.h"

#include <math.h>

#include "kernels/offload.h"

PAR_DECLARE_TARGET
/* One row of par_rmsnorm_forward / _backward (device-callable; the kernels
 * above run them per row, kernels/compressor.c inside its device loops). */
static inline void PAR_FN(par_rmsnorm_row)(par_real *y,       /* [D] */
                                           par_real *rstd,    /* [1] */
                                           const par_real *x, /* [D] */
                                           const par_real *w, /* [D] or NULL */
                                           int64_t D, double eps)
{
    double ss = 0;
    for (int64_t j = 0; j < D; j++)
        ss += (double)x[j] * (double)x[j];
    par_real r = (par_real)(1.0 / sqrt(ss / (double)D + eps));
    *rstd = r;
    if (w) {
        for (int64_t j = 0; j < D; j++)
            y[j] = w[j] * (x[j] * r);
    } else {
        for (int64_t j = 0; j < D; j++)
            y[j] = x[j] * r;
    }
}

/* dx += (one row of par_rmsnorm_backward's din); dw (or NULL) += the row's
 * dw contribution (as par_rmsnorm_backward with T = 1). */
static inline void PAR_FN(par_rmsnorm_row_backward)(par_real *dx,      /* [D] or NULL */
                                                    par_real *dw,      /* [D] or NULL */
                                                    const par_real *g, /* [D] */
                                                    const par_real *x, /* [D] */
                                                    const par_real *w, /* [D] or NULL */
                                                    par_real rstd, int64_t D)
{
    double r = rstd;
    if (dx) {
        double dot = 0;
        for (int64_t j = 0; j < D; j++)
            dot += (double)g[j] * (w ? (double)w[j] : 1.0) * (double)x[j];
        double coef = r * r * r * dot / (double)D;
        for (int64_t j = 0; j < D; j++) {
            double wg = (double)g[j] * (w ? (double)w[j] : 1.0);
            dx[j] += (par_real)(r * wg - (double)x[j] * coef);
        }
    }
    if (dw)
        for (int64_t j = 0; j < D; j++) {
            double a = 0;
            a += (double)g[j] * (double)x[j] * r;
            dw[j] += (par_real)a;
        }
}
PAR_END_DECLARE_TARGET

#endif
