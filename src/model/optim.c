/* model/optim.c - clip, Muon, AdamW, balance update (MODEL.md 7; templated).
 *
 * Element updates are computed in double from the stored values and rounded
 * once to the working precision when stored.  Reductions (sums of squares,
 * Frobenius norms) are in double, in index order.
 */
#include "model/optim.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/device.h"
#include "core/pmath.h"
#include "kernels/offload.h"
#include "model/optim-impl.h"
#include "kernels/ops.h"


double PAR_FN(par_sumsq)(const par_real *x, int64_t n)
{
    double s = 0.0;
    PAR_DEV_BEGIN();
    PAR_DIN(x, n);
    /* index order: one device thread (the order sets the bits) */
    PAR_KSERIAL(is_device_ptr(x) map(tofrom: s))
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

double PAR_FN(par_grad_sumsq)(const par_real *grads, const par_param_table *t)
{
    double s = 0.0;
    for (int i = 0; i < t->n; i++) {
        const par_param *p = &t->p[i];
        if (p->dtype == PAR_PDT_REAL && p->has_grad)
            s += PAR_FN(par_sumsq)(grads + p->offset, p->numel);
    }
    return s;
}

void PAR_FN(par_grad_scale)(par_real *grads, const par_param_table *t, double factor)
{
    if (factor == 1.0)
        return;
    for (int i = 0; i < t->n; i++) {
        const par_param *p = &t->p[i];
        if (p->dtype != PAR_PDT_REAL || !p->has_grad)
            continue;
        PAR_DEV_BEGIN();
        const int64_t n = p->numel; /* p is host memory: the loop's bound is evaluated on the device */
        par_real *g = PAR_DINOUT_AS(grads + p->offset, n);
        PAR_KLOOP(is_device_ptr(g))
        for (int64_t k = 0; k < n; k++)
            g[k] = scaled(g[k], factor);
    }
}

/* X [r, c] with r <= c, in place: one NS step with coefficients (a, b, cc).
 * A, B: [r, r]; Y: [r, c] workspace. */
static void ns_step(par_real *X, par_real *A, par_real *B, par_real *Y, int64_t r, int64_t c, const double k[3])
{
    /* A = X X^T */
    PAR_FN(par_gemm)(0, 1, r, r, c, (par_real)1, X, c, X, c, (par_real)0, A, r);
    /* B = b A + c A A */
    PAR_DEV_BEGIN();
    const double k0 = k[0], k1 = k[1];
    {
        const par_real *Ad = PAR_DIN_AS(A, r * r);
        par_real *Bd = PAR_DOUT_AS(B, r * r);
        PAR_KLOOP(is_device_ptr(Ad, Bd))
        for (int64_t i = 0; i < r * r; i++)
            Bd[i] = (par_real)(k1 * (double)Ad[i]);
    }
    PAR_FN(par_gemm)(0, 0, r, r, r, (par_real)k[2], A, r, A, r, (par_real)1, B, r);
    /* Y = a X + B X */
    {
        const par_real *Xd = PAR_DIN_AS(X, r * c);
        par_real *Yd = PAR_DOUT_AS(Y, r * c);
        PAR_KLOOP(is_device_ptr(Xd, Yd))
        for (int64_t i = 0; i < r * c; i++)
            Yd[i] = (par_real)(k0 * (double)Xd[i]);
    }
    PAR_FN(par_gemm)(0, 0, r, c, r, (par_real)1, B, r, X, c, (par_real)1, Y, c);
    par_dev_copy(X, Y, (size_t)(r * c) * sizeof *X);
}

par_status PAR_FN(par_muon_orthogonalize)(par_real *out, const par_real *U, int64_t rows, int64_t cols)
{
    if (rows < 1 || cols < 1)
        return par_err(PAR_EINVAL, "muon: matrix shape [%lld, %lld] must be positive", (long long)rows,
                       (long long)cols);
    const int tr = rows > cols;
    const int64_t r = tr ? cols : rows, c = tr ? rows : cols;
    const size_t n = (size_t)(r * c), nn = (size_t)(r * r);
    par_real *X = par_malloc((2 * n + 2 * nn) * sizeof *X, PAR_TAG_OPTIM);
    if (!X)
        return par_err(PAR_ENOMEM, "muon: no memory for the workspace of a [%lld, %lld] matrix",
                       (long long)rows, (long long)cols);
    par_real *Y = X + n, *A = Y + n, *B = A + nn;

    double fro = sqrt(PAR_FN(par_sumsq)(U, (int64_t)n));
    double inv = 1.0 / (fro + PAR_MUON_NORM_EPS);
    PAR_DEV_BEGIN();
    {
        const par_real *Ud = PAR_DIN_AS(U, n);
        par_real *Xd = PAR_DOUT_AS(X, n);
        if (tr) {
            PAR_KLOOP(collapse(2) is_device_ptr(Ud, Xd))
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++)
                    Xd[j * c + i] = (par_real)((double)Ud[i * cols + j] * inv);
        } else {
            PAR_KLOOP(is_device_ptr(Ud, Xd))
            for (size_t i = 0; i < n; i++)
                Xd[i] = (par_real)((double)Ud[i] * inv);
        }
    }
    for (int s = 0; s < NS_MAIN_STEPS; s++)
        ns_step(X, A, B, Y, r, c, ns_main);
    for (int s = 0; s < NS_TAIL_STEPS; s++)
        ns_step(X, A, B, Y, r, c, ns_tail);
    if (tr) {
        const par_real *Xd = PAR_DIN_AS(X, n);
        par_real *od = PAR_DINOUT_AS(out, n); /* out may be U (in place) */
        PAR_KLOOP(collapse(2) is_device_ptr(Xd, od))
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                od[i * cols + j] = Xd[j * c + i];
    } else {
        par_dev_copy(out, X, n * sizeof *X);
    }
    par_free(X);
    return PAR_OK;
}

par_status PAR_FN(par_muon_update)(par_real *w, par_real *mom, const par_real *g, int64_t rows, int64_t cols,
                                   double gscale, double lr, double wd, double mu)
{
    const int64_t n = rows * cols;
    par_real *U = par_malloc((size_t)n * sizeof *U, PAR_TAG_OPTIM);
    if (!U)
        return par_err(PAR_ENOMEM, "muon: no memory for a [%lld, %lld] update", (long long)rows,
                       (long long)cols);
    PAR_DEV_BEGIN();
    {
        const par_real *gd = PAR_DIN_AS(g, n);
        par_real *md = PAR_DINOUT_AS(mom, n), *Ud = PAR_DOUT_AS(U, n);
        PAR_KLOOP(is_device_ptr(gd, md, Ud))
        for (int64_t i = 0; i < n; i++) {
            double G = (double)scaled(gd[i], gscale);
            md[i] = (par_real)(mu * (double)md[i] + G);
            Ud[i] = (par_real)(mu * (double)md[i] + G);
        }
    }
    par_status st = PAR_FN(par_muon_orthogonalize)(U, U, rows, cols);
    if (st)
        goto fail_free_u;
    const double decay = 1.0 - lr * wd;
    const double step = lr * PAR_MUON_SCALE * sqrt((double)(rows > cols ? rows : cols));
    {
        const par_real *Ud = PAR_DIN_AS(U, n);
        par_real *wd_ = PAR_DINOUT_AS(w, n);
        PAR_KLOOP(is_device_ptr(Ud, wd_))
        for (int64_t i = 0; i < n; i++)
            wd_[i] = (par_real)((double)wd_[i] * decay - step * (double)Ud[i]);
    }
fail_free_u:
    par_free(U);
    return st;
}

void PAR_FN(par_adamw_update)(par_real *w, par_real *m, par_real *v, const par_real *g, int64_t n,
                              double gscale, double lr, double wd, int64_t t)
{
    const double b1 = PAR_ADAM_BETA1, b2 = PAR_ADAM_BETA2;
    const double bc1 = 1.0 - par_pmath_pow(b1, (double)t), bc2 = 1.0 - par_pmath_pow(b2, (double)t);
    const double decay = 1.0 - lr * wd;
    PAR_DEV_BEGIN();
    PAR_DIN(g, n);
    PAR_DINOUT(w, n);
    PAR_DINOUT(m, n);
    PAR_DINOUT(v, n);
    PAR_KLOOP(is_device_ptr(w, m, v, g))
    for (int64_t i = 0; i < n; i++) {
        double G = (double)scaled(g[i], gscale);
        par_real mi = (par_real)(b1 * (double)m[i] + (1.0 - b1) * G);
        par_real vi = (par_real)(b2 * (double)v[i] + (1.0 - b2) * G * G);
        m[i] = mi;
        v[i] = vi;
        double mhat = (double)mi / bc1, vhat = (double)vi / bc2;
        w[i] = (par_real)((double)w[i] * decay - lr * mhat / (sqrt(vhat) + PAR_ADAM_EPS));
    }
}

par_status PAR_FN(par_optim_apply_param)(par_real *w, par_real *m, par_real *v, const par_real *g,
                                         const par_param_table *t, int idx, const par_config *cfg,
                                         int64_t step, double gscale)
{
    if (idx < 0 || idx >= t->n)
        return par_err(PAR_ERANGE, "optimizer: parameter index %d outside [0, %d)", idx, t->n);
    const par_param *p = &t->p[idx];
    if (p->dtype != PAR_PDT_REAL)
        return PAR_OK;
    switch (p->opt) {
    case PAR_OPT_NONE: return PAR_OK;
    case PAR_OPT_MUON:
        return PAR_FN(par_muon_update)(w, m, g, p->shape[0], p->shape[1], gscale, cfg->lr,
                                       p->weight_decay ? cfg->wd : 0.0, cfg->mu);
    case PAR_OPT_ADAMW:
        if (step < 1)
            return par_err(PAR_EINVAL, "optimizer: AdamW step must be >= 1 (1-based), got %lld", (long long)step);
        PAR_FN(par_adamw_update)(w, m, v, g, p->numel, gscale, cfg->lr, p->weight_decay ? cfg->wd : 0.0, step);
        return PAR_OK;
    }
    return par_err(PAR_EINTERNAL, "optimizer: '%s' has an unknown kind %d", p->name, (int)p->opt);
}

par_status PAR_FN(par_optim_apply)(par_real *params, par_real *m, par_real *v, const par_real *grads,
                                   const par_param_table *t, const par_config *cfg, int64_t step, double gscale)
{
    for (int i = 0; i < t->n; i++) {
        const par_param *p = &t->p[i];
        if (p->dtype != PAR_PDT_REAL)
            continue;
        par_status st = PAR_FN(par_optim_apply_param)(params + p->offset, m + p->offset, v + p->offset,
                                                      grads + p->offset, t, i, cfg, step, gscale);
        if (st)
            return st;
    }
    return PAR_OK;
}

void PAR_FN(par_balance_update)(par_real *bias, const int64_t *load, int64_t E, int64_t K, int64_t T_total,
                                double rate)
{
    const double target = (double)K * (double)T_total / (double)E;
    par_dev_host_write(bias, (size_t)E * sizeof *bias); /* E values: on the host */
    par_dev_host_read(load, (size_t)E * sizeof *load);
    for (int64_t e = 0; e < E; e++) {
        double diff = target - (double)load[e];
        double s = diff > 0 ? 1.0 : diff < 0 ? -1.0 : 0.0;
        bias[e] = (par_real)((double)bias[e] + rate * s);
    }
}

void PAR_FN(par_balance_apply)(par_real *params, const int64_t *loads, const par_param_table *t,
                               const par_config *cfg, int64_t T_total)
{
    const int64_t E = cfg->n_routed_experts;
    for (int b = 0; b < t->n_blocks; b++) {
        int gi = t->blocks[b].gate_bias;
        if (gi < 0)
            continue;
        PAR_FN(par_balance_update)(params + t->p[gi].offset, loads + (int64_t)b * E, E, cfg->n_activated_experts,
                                   T_total, cfg->bias_update_rate);
    }
}

par_status PAR_FN(par_optim_step)(par_real *params, const par_real *grads, par_real *m, par_real *v,
                                  const par_param_table *t, const par_config *cfg, int64_t step,
                                  const int64_t *loads, int64_t T_total, double *grad_norm)
{
    double norm = sqrt(PAR_FN(par_grad_sumsq)(grads, t));
    double f = par_clip_factor(norm, cfg->clip_grad);
    par_status st = PAR_FN(par_optim_apply)(params, m, v, grads, t, cfg, step, f);
    if (st)
        return st;
    if (loads)
        PAR_FN(par_balance_apply)(params, loads, t, cfg, T_total);
    if (grad_norm)
        *grad_norm = norm;
    return PAR_OK;
}
