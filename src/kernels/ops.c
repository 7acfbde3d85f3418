/* kernels/ops.c - basic forward/backward pairs (see kernels/ops.h).
 *
 * Compiled once per precision (kernels/real.h).  Reductions (row sums,
 * weight-gradient sums) run in a fixed order and accumulate in double in both
 * precisions; element-wise nonlinearities are evaluated in double and rounded
 * once to the working precision.  A backward kernel first forms its whole
 * contribution to a gradient element, then adds it once (g += contribution),
 * so the result does not depend on how that contribution was summed into g.
 */
#include "kernels/ops.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/counters.h"
#include "core/log.h"
#include "core/pmath.h"
#include "kernels/gsum.h"
#include "kernels/offload.h"
#include "kernels/qcast.h"

/* ---------------------------------------------------------------- scalars */

PAR_DECLARE_TARGET
/* d silu / dx = s (1 + x (1 - s)) */
static inline double silu_grad_d(double x)
{
    double s = par_sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
}
PAR_END_DECLARE_TARGET

/* ----------------------------------------------------------------- linear */

void PAR_FN(par_linear_forward)(par_real *out,      /* [T, N] */
                                const par_real *in, /* [T, K] */
                                const par_real *w,  /* [N, K] */
                                int64_t T, int64_t K, int64_t N)
{
    par_real *qtmp = NULL; /* a recipe's cast operands (kernels/qcast.h); none: today's bits */
    PAR_FN(par_qcast_operands)(&in, &w, &qtmp, T, K, N);
    PAR_FN(par_gemm)(0, 1, T, N, K, 1, in, K, w, K, 0, out, N);
    par_qcast_release(qtmp);
}

void PAR_FN(par_linear_backward)(par_real *din,        /* [T, K] or NULL */
                                 par_real *dw,         /* [N, K] or NULL */
                                 const par_real *dout, /* [T, N] */
                                 const par_real *in,   /* [T, K] */
                                 const par_real *w,    /* [N, K] */
                                 int64_t T, int64_t K, int64_t N)
{
    par_real *qtmp = NULL; /* a recipe: the forward's cast operands, straight-through */
    PAR_FN(par_qcast_operands)(&in, &w, &qtmp, T, K, N);
    if (din)
        PAR_FN(par_gemm)(0, 0, T, K, N, 1, dout, N, w, K, 1, din, K);
    par_racc_view v = par_gsum_of(dw, N * K);
    if (v.acc)
        PAR_FN(par_gsum_outer)(v, dout, N, in, K, T, N, K, K);
    else if (dw)
        PAR_FN(par_gemm)(1, 0, N, K, T, 1, dout, N, in, K, 1, dw, K);
    par_qcast_release(qtmp);
}

void PAR_FN(par_gsum_outer)(par_racc_view v, const par_real *a, int64_t lda, const par_real *b, int64_t ldb,
                            int64_t T, int64_t N, int64_t K, int64_t ldw)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) {
            const double g = (double)a[t * lda + n];
            if (g != 0.0)
                PAR_FN(par_gsum_row_put)(v.acc, v.at + (size_t)(n * ldw), g, b + t * ldb, (size_t)K);
        }
}

/* ---------------------------------------------------------------- rmsnorm */

void PAR_FN(par_rmsnorm_forward)(par_real *out,      /* [T, D] */
                                 par_real *rstd,     /* [T] saved */
                                 const par_real *in, /* [T, D] */
                                 const par_real *w,  /* [D] or NULL */
                                 int64_t T, int64_t D, double eps)
{
    PAR_DEV_BEGIN();
    PAR_DIN(in, T * D); /* inputs first: out may be in (in place) */
    PAR_DIN(w, D);
    PAR_DOUT(out, T * D);
    PAR_DOUT(rstd, T);
    PAR_KLOOP(is_device_ptr(out, rstd, in, w))
    for (int64_t t = 0; t < T; t++)
        PAR_FN(par_rmsnorm_row)(out + t * D, rstd + t, in + t * D, w, D, eps);
}

/* Columns of dw handled per pass over the rows (a stack accumulator). */
#define RMS_DW_CHUNK 256

void PAR_FN(par_rmsnorm_backward)(par_real *din,        /* [T, D] or NULL */
                                  par_real *dw,         /* [D] or NULL */
                                  const par_real *dout, /* [T, D] */
                                  const par_real *in,   /* [T, D] the forward input */
                                  const par_real *w,    /* [D] or NULL */
                                  const par_real *rstd, /* [T] */
                                  int64_t T, int64_t D)
{
    /* y_j = w_j x_j r,  r = (mean(x^2) + eps)^-1/2,  dr/dx_k = -r^3 x_k / D:
     *   din_k = r w_k g_k - x_k r^3 mean_j(g_j w_j x_j)
     *   dw_j  = sum_t g_tj x_tj r_t */
    PAR_DEV_BEGIN();
    PAR_DIN(dout, T * D);
    PAR_DIN(in, T * D);
    PAR_DIN(w, D);
    PAR_DIN(rstd, T);
    PAR_DINOUT(din, T * D);
    PAR_DINOUT(dw, D);
    if (din) {
        PAR_KLOOP(is_device_ptr(din, dout, in, w, rstd))
        for (int64_t t = 0; t < T; t++) {
            const par_real *x = in + t * D, *g = dout + t * D;
            par_real *dx = din + t * D;
            double r = rstd[t];
            double dot = 0;
            for (int64_t j = 0; j < D; j++)
                dot += (double)g[j] * (w ? (double)w[j] : 1.0) * (double)x[j];
            double coef = r * r * r * dot / (double)D;
            for (int64_t j = 0; j < D; j++) {
                double wg = (double)g[j] * (w ? (double)w[j] : 1.0);
                dx[j] += (par_real)(r * wg - (double)x[j] * coef);
            }
        }
    }
    par_racc_view v = par_gsum_of(dw, D);
    for (int64_t t = 0; v.acc && t < T; t++)
        for (int64_t j = 0; j < D; j++)
            par_gsum_put(v, j, (double)dout[t * D + j] * (double)in[t * D + j] * (double)rstd[t]);
    if (dw && !v.acc) {
        /* column j sums over t ascending in double: on the device one thread
         * per column (the same order); on the host in chunks of columns */
        if (PAR_ON_DEVICE()) {
            PAR_KLOOP(is_device_ptr(dw, dout, in, rstd))
            for (int64_t j = 0; j < D; j++) {
                double a = 0;
                for (int64_t t = 0; t < T; t++)
                    a += (double)dout[t * D + j] * (double)in[t * D + j] * (double)rstd[t];
                dw[j] += (par_real)a;
            }
            return;
        }
        double acc[RMS_DW_CHUNK];
        for (int64_t j0 = 0; j0 < D; j0 += RMS_DW_CHUNK) {
            int64_t nj = D - j0 < RMS_DW_CHUNK ? D - j0 : RMS_DW_CHUNK;
            for (int64_t j = 0; j < nj; j++)
                acc[j] = 0;
            for (int64_t t = 0; t < T; t++) {
                const par_real *x = in + t * D + j0, *g = dout + t * D + j0;
                double r = rstd[t];
                for (int64_t j = 0; j < nj; j++)
                    acc[j] += (double)g[j] * (double)x[j] * r;
            }
            for (int64_t j = 0; j < nj; j++)
                dw[j0 + j] += (par_real)acc[j];
        }
    }
}

/* -------------------------------------------------------------- embedding */

void PAR_FN(par_embedding_forward)(par_real *out,         /* [T, D] */
                                   const int32_t *ids,    /* [T] */
                                   const par_real *table, /* [V, D] */
                                   int64_t T, int64_t D)
{
    PAR_DEV_BEGIN();
    if (PAR_ON_DEVICE()) {
        PAR_HOST_READ(ids, T); /* the rows the table is read at */
        int64_t hi = 0;
        for (int64_t t = 0; t < T; t++)
            hi = ids[t] + 1 > hi ? ids[t] + 1 : hi;
        PAR_DIN(ids, T);
        PAR_DIN(table, hi * D);
        PAR_DOUT(out, T * D);
        PAR_KLOOP(is_device_ptr(out, ids, table) collapse(2))
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < D; j++)
                out[t * D + j] = table[(int64_t)ids[t] * D + j];
        return;
    }
    for (int64_t t = 0; t < T; t++)
        memcpy(out + t * D, table + (int64_t)ids[t] * D, (size_t)D * sizeof(par_real));
}

void PAR_FN(par_embedding_backward)(par_real *dtable,     /* [V, D] */
                                    const par_real *dout, /* [T, D] */
                                    const int32_t *ids,   /* [T] */
                                    int64_t T, int64_t D)
{
    PAR_DEV_BEGIN();
    if (PAR_ON_DEVICE()) {
        /* one thread per column, rows in ascending t: the host's order */
        PAR_HOST_READ(ids, T);
        int64_t hi = 0;
        for (int64_t t = 0; t < T; t++)
            hi = ids[t] + 1 > hi ? ids[t] + 1 : hi;
        PAR_DIN(ids, T);
        PAR_DIN(dout, T * D);
        PAR_DINOUT(dtable, hi * D);
        PAR_KLOOP(is_device_ptr(dtable, dout, ids))
        for (int64_t j = 0; j < D; j++)
            for (int64_t t = 0; t < T; t++)
                dtable[(int64_t)ids[t] * D + j] += dout[t * D + j];
        return;
    }
    par_racc_view v = par_gsum_of(dtable, D); /* the table's first row: the others follow it */
    for (int64_t t = 0; t < T; t++) {
        par_real *row = dtable + (int64_t)ids[t] * D;
        const par_real *g = dout + t * D;
        for (int64_t j = 0; j < D; j++)
            if (v.acc)
                par_gsum_put(v, (int64_t)ids[t] * D + j, (double)g[j]);
            else
                row[j] += g[j];
    }
}

/* ----------------------------------------------------------------- swiglu */
/* (the hidden size is spelled nI here: <cblas.h> pulls in <complex.h>, whose
 * macro I would replace a parameter named I) */

void PAR_FN(par_swiglu_forward)(par_real *h,        /* [T, nI] */
                                const par_real *g,  /* [T, nI] */
                                const par_real *u,  /* [T, nI] */
                                const par_real *rw, /* [T] or NULL */
                                int64_t T, int64_t nI, double L)
{
    PAR_DEV_BEGIN();
    PAR_DIN(g, T * nI);
    PAR_DIN(u, T * nI);
    PAR_DIN(rw, T);
    PAR_DOUT(h, T * nI);
    PAR_KLOOP(is_device_ptr(h, g, u, rw))
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < nI; i++) {
            double gv = g[t * nI + i], uv = u[t * nI + i];
            if (L > 0) {
                gv = gv < L ? gv : L;
                uv = uv < -L ? -L : (uv > L ? L : uv);
            }
            /* the reference's order: h = silu(g) * u, then h = w * h */
            par_real v = (par_real)par_silu(gv) * (par_real)uv;
            h[t * nI + i] = rw ? rw[t] * v : v;
        }
    }
}

void PAR_FN(par_swiglu_backward)(par_real *dg,        /* [T, nI] or NULL */
                                 par_real *du,        /* [T, nI] or NULL */
                                 par_real *drw,       /* [T] or NULL */
                                 const par_real *dh,  /* [T, nI] */
                                 const par_real *g,   /* [T, nI] */
                                 const par_real *u,   /* [T, nI] */
                                 const par_real *rw,  /* [T] or NULL */
                                 int64_t T, int64_t nI, double L)
{
    PAR_DEV_BEGIN();
    PAR_DIN(dh, T * nI);
    PAR_DIN(g, T * nI);
    PAR_DIN(u, T * nI);
    PAR_DIN(rw, T);
    PAR_DINOUT(dg, T * nI);
    PAR_DINOUT(du, T * nI);
    PAR_DINOUT(drw, T);
    PAR_KLOOP(is_device_ptr(dg, du, drw, dh, g, u, rw))
    for (int64_t t = 0; t < T; t++) {
        double w = rw ? (double)rw[t] : 1.0;
        double racc = 0;
        for (int64_t i = 0; i < nI; i++) {
            int64_t k = t * nI + i;
            double gv = g[k], uv = u[k];
            int g_in = 1, u_in = 1;
            if (L > 0) {
                if (gv > L) {
                    gv = L;
                    g_in = 0;
                }
                if (uv > L) {
                    uv = L;
                    u_in = 0;
                } else if (uv < -L) {
                    uv = -L;
                    u_in = 0;
                }
            }
            double d = dh[k];
            double s = par_silu(gv);
            if (dg)
                dg[k] += g_in ? (par_real)(d * w * silu_grad_d(gv) * uv) : (par_real)0;
            if (du)
                du[k] += u_in ? (par_real)(d * w * s) : (par_real)0;
            racc += d * s * uv;
        }
        if (drw)
            drw[t] += (par_real)racc;
    }
}

void PAR_FN(par_swiglu_drw_part)(double *acc,         /* [T] */
                                 const par_real *dh,  /* [T, nI] */
                                 const par_real *g,   /* [T, nI] */
                                 const par_real *u,   /* [T, nI] */
                                 int64_t T, int64_t nI, double L)
{
    for (int64_t t = 0; t < T; t++) {
        double racc = acc[t];
        for (int64_t i = 0; i < nI; i++) {
            const int64_t k = t * nI + i;
            double gv = g[k], uv = u[k];
            if (L > 0) {
                gv = gv > L ? L : gv;
                uv = uv > L ? L : uv < -L ? -L : uv;
            }
            double d = dh[k];
            double s = par_silu(gv);
            racc += d * s * uv;
        }
        acc[t] = racc;
    }
}

/* ------------------------------------------------------------------- xent */

void PAR_FN(par_xent_forward)(par_real *ce,           /* [T] */
                              par_real *lse,          /* [T] saved */
                              const par_real *logits, /* [T, V] */
                              const int32_t *target,  /* [T], -1 = none */
                              int64_t T, int64_t V)
{
    PAR_DEV_BEGIN();
    PAR_DIN(logits, T * V);
    PAR_DIN(target, T);
    PAR_DOUT(ce, T);
    PAR_DOUT(lse, T);
    PAR_KLOOP(is_device_ptr(ce, lse, logits, target))
    for (int64_t t = 0; t < T; t++) {
        const par_real *z = logits + t * V;
        double m = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            if ((double)z[v] > m)
                m = z[v];
        double s = 0;
        for (int64_t v = 0; v < V; v++)
            s += par_pmath_exp((double)z[v] - m);
        double l = m + par_pmath_log(s);
        lse[t] = (par_real)l;
        int32_t y = target[t];
        if (y < 0)
            ce[t] = 0;
        else if (y >= V)
            ce[t] = (par_real)NAN; /* a label outside the vocabulary: poison the loss */
        else
            ce[t] = (par_real)(l - (double)z[y]);
    }
}

void PAR_FN(par_xent_backward)(par_real *dlogits,      /* [T, V] */
                               const par_real *logits, /* [T, V] */
                               const par_real *lse,    /* [T] */
                               const int32_t *target,  /* [T] */
                               double scale, int64_t T, int64_t V)
{
    PAR_DEV_BEGIN();
    PAR_DIN(logits, T * V);
    PAR_DIN(lse, T);
    PAR_DIN(target, T);
    PAR_DINOUT(dlogits, T * V);
    PAR_KLOOP(is_device_ptr(dlogits, logits, lse, target))
    for (int64_t t = 0; t < T; t++) {
        int32_t y = target[t];
        if (y < 0 || y >= V)
            continue;
        const par_real *z = logits + t * V;
        par_real *dz = dlogits + t * V;
        double l = lse[t];
        for (int64_t v = 0; v < V; v++) {
            double p = par_pmath_exp((double)z[v] - l);
            dz[v] += (par_real)(scale * (v == y ? p - 1.0 : p));
        }
    }
}
