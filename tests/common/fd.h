/* tests/common/fd.h - central finite-difference gradient checks (f64).
 *
 * objective(ctx) must recompute a scalar from the current contents of x.
 * fd_check perturbs up to max_elems elements of x (all if 0; else a spread
 * of indices), compares (f(x+h)-f(x-h))/2h with analytic[i] and returns the
 * worst  |a - n| / max(1, |a|, |n|)  error.  The caller asserts a bound.
 */
#ifndef PAR_TESTS_FD_H
#define PAR_TESTS_FD_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>

typedef double (*fd_objective)(void *ctx);

static inline double fd_check(const char *label, double *x, size_t n, const double *analytic,
                              fd_objective f, void *ctx, double h, size_t max_elems)
{
    double worst = 0.0;
    size_t step = 1;
    if (max_elems && n > max_elems)
        step = n / max_elems;
    for (size_t i = 0; i < n; i += step) {
        double saved = x[i];
        x[i] = saved + h;
        double fp = f(ctx);
        x[i] = saved - h;
        double fm = f(ctx);
        x[i] = saved;
        double num = (fp - fm) / (2 * h);
        double den = fmax(1.0, fmax(fabs(num), fabs(analytic[i])));
        double err = fabs(num - analytic[i]) / den;
        if (err > worst) {
            worst = err;
            if (err > 1e-5)
                fprintf(stderr, "fd %s[%zu]: analytic %.10g numeric %.10g err %.3g\n", label, i,
                        analytic[i], num, err);
        }
    }
    return worst;
}

#endif
