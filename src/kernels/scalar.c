/* kernels/scalar.c - untemplated scalar helpers of kernels/ops.h, compiled
 * once (parity_kernels_common) and shared by both precisions. */
#include <math.h>

#include "core/pmath.h"
#include "kernels/scalar.h"

PAR_DECLARE_TARGET
double par_sigmoid(double x)
{
    if (x >= 0)
        return 1.0 / (1.0 + par_pmath_exp(-x));
    double e = par_pmath_exp(x);
    return e / (1.0 + e);
}

/* log(1 + e^x) = max(x, 0) + log1p(e^-|x|) */
double par_softplus(double x) { return (x > 0 ? x : 0.0) + par_pmath_log1p(par_pmath_exp(-fabs(x))); }

double par_softplus_sigmoid(double x, double *sg)
{
    const double e = par_pmath_exp(-fabs(x));
    *sg = x >= 0 ? 1.0 / (1.0 + e) : x < 0 ? e / (1.0 + e) : par_sigmoid(x); /* NaN: its own sign */
    return (x > 0 ? x : 0.0) + par_pmath_log1p(e);
}

double par_silu(double x) { return x * par_sigmoid(x); }
PAR_END_DECLARE_TARGET
