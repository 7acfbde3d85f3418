/* model/goldentol.c - the f32 golden's written-reason tolerances for AdamW
 * entries whose update amplifies gradient rounding (see model/golden.h,
 * docs/golden.md "AdamW's eps regime in f32"). */
#include "model/golden.h"

#include <math.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/device.h"
#include "core/pmath.h"
#include "model/compare.h"
#include "model/optim.h"

/* B_t: by Cauchy-Schwarz over m_t = (1-b1) sum_j b1^j g_{t-j} and
 * v_t = (1-b2) sum_j b2^j g_{t-j}^2, |m^_t| / sqrt(v^_t) <= B_t for any
 * gradients (B_1 = 1, B_2 = 1.0004); eps only makes the ratio smaller. */
static double adamw_ratio_bound(int64_t t)
{
    const double b1 = PAR_ADAM_BETA1, b2 = PAR_ADAM_BETA2;
    double s = 0.0;
    for (int64_t j = 0; j < t; j++)
        s += (1.0 - b1) * (1.0 - b1) * par_pmath_pow(b1, 2.0 * (double)j) / ((1.0 - b2) * par_pmath_pow(b2, (double)j));
    return sqrt(1.0 - par_pmath_pow(b2, (double)t)) / (1.0 - par_pmath_pow(b1, (double)t)) * sqrt(s);
}

par_status PAR_FN(par_golden_amp_init)(PAR_FN(par_golden_amp) *a, const PAR_FN(par_model) *M)
{
    PAR_FN(par_golden_amp) n = {PAR_REAL_BITS == 32, NULL, NULL};
    if (n.on) {
        n.mask = par_calloc((size_t)M->tab.n_float, 1, PAR_TAG_MISC);
        n.max_g = par_calloc((size_t)M->tab.n, sizeof *n.max_g, PAR_TAG_MISC);
        if (!n.mask || !n.max_g) {
            PAR_FN(par_golden_amp_free)(&n);
            return par_err(PAR_ENOMEM, "golden: out of memory for the AdamW entry marks");
        }
    }
    *a = n;
    return PAR_OK;
}

void PAR_FN(par_golden_amp_free)(PAR_FN(par_golden_amp) *a)
{
    par_free(a->mask);
    par_free(a->max_g);
    a->mask = NULL;
    a->max_g = NULL;
}

/* An entry is in AdamW's eps regime when 0 < |f g| < eps: its update is
 * about lr f g / eps, a gain of lr / eps on the gradient; it is marked when
 * that update exceeds the f32 policy's absolute floor (smaller ones, such as
 * the 1e-17 residues of exactly cancelling sums, stay within the policy). */
void PAR_FN(par_golden_amp_mark)(PAR_FN(par_golden_amp) *a, const PAR_FN(par_model) *M)
{
    if (!a->on)
        return;
    double rtol, atol;
    par_policy_tolerance(PAR_POLICY_F32, &rtol, &atol);
    const double f = par_clip_factor(sqrt(M->stats.grad_sumsq), M->cfg.clip_grad);
    const double floor_g = atol * PAR_ADAM_EPS / M->cfg.lr;
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype != PAR_PDT_REAL || p->opt != PAR_OPT_ADAMW)
            continue;
        const par_real *g = M->grads + p->offset;
        par_dev_host_read(g, (size_t)p->numel * sizeof *g);
        for (int64_t j = 0; j < p->numel; j++) {
            double x = fabs(f * (double)g[j]);
            if (!(x > floor_g && x < PAR_ADAM_EPS))
                continue;
            a->mask[p->offset + j] = 1;
            if (x > a->max_g[i])
                a->max_g[i] = x;
        }
    }
}

/* The override of entry i with k marked entries after `steps` updates: two
 * runs' updates of a marked entry differ by at most 2 lr B_t at update t
 * (|m^|/sqrt(v^) <= B_t, adamw_ratio_bound), weight decay only shrinks
 * a difference, so the parameter differs there by at most
 * D = 2 lr sqrt(k) sum_t B_t (L2 over the k entries); the policy's bound
 * plus D. */
static par_status add_one(par_manifest *man, const par_param *p, int64_t k, double max_g, double lr,
                          int64_t steps)
{
    double rtol, atol, bsum = 0.0;
    par_policy_tolerance(PAR_POLICY_F32, &rtol, &atol);
    for (int64_t t = 1; t <= steps; t++)
        bsum += adamw_ratio_bound(t);
    const double D = 2.0 * lr * sqrt((double)k) * bsum;
    char why[512];
    snprintf(why, sizeof why,
             "AdamW eps regime in f32: %lld of %lld entries had 0 < |grad| < eps = %g (largest %.3g) in some "
             "step, where the update is about lr*grad/eps (gain lr/eps = %.3g on the gradient's f32 rounding); "
             "tolerance = the f32 policy + %.3g = 2*lr*sqrt(%lld)*sum_t B_t over %lld updates "
             "(|m^/sqrt(v^)| <= B_t); the gradient itself is held to the f32 policy (docs/golden.md)",
             (long long)k, (long long)p->numel, PAR_ADAM_EPS, max_g, lr / PAR_ADAM_EPS, D, (long long)k,
             (long long)steps);
    return par_manifest_add_tolerance(man, p->name, rtol, atol + D / sqrt((double)p->numel), why);
}

par_status PAR_FN(par_golden_amp_overrides)(const PAR_FN(par_golden_amp) *a, const PAR_FN(par_model) *M,
                                            int64_t steps, par_manifest *man)
{
    if (!a->on)
        return PAR_OK;
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype != PAR_PDT_REAL || p->opt != PAR_OPT_ADAMW)
            continue;
        int64_t k = 0;
        for (int64_t j = 0; j < p->numel; j++)
            k += a->mask[p->offset + j];
        if (!k)
            continue;
        par_status s = add_one(man, p, k, a->max_g[i], M->cfg.lr, steps);
        if (s)
            return s;
    }
    return PAR_OK;
}
