/* kernels/gsum_row: a row of terms deposited at once leaves the accumulator
 * in exactly the state par_racc_put term by term leaves it, on every path
 * this CPU runs (forced in turn), in both precisions of x. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/racc.h"
#include "kernels/gemm_path.h"
#include "kernels/gsum_row.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* a term of magnitude 2^[lo, hi), either sign; now and then a zero, a
 * subnormal, a huge value or a non-finite one */
static double term(int lo, int hi, int specials)
{
    const double u = uniform();
    if (specials && u < 0.02)
        return 0.0;
    if (specials && u < 0.03)
        return 4.9e-324 * (1 + (int)(uniform() * 100));
    if (specials && u < 0.035)
        return uniform() < 0.5 ? 1e300 : INFINITY;
    if (specials && u < 0.037)
        return NAN;
    const double m = ldexp(1.0 + uniform(), lo + (int)(uniform() * (hi - lo)));
    return uniform() < 0.5 ? -m : m;
}

static int same_state(const par_racc *a, const par_racc *b)
{
    return !memcmp(a->e, b->e, a->n * sizeof *a->e) && !memcmp(a->s0, b->s0, a->n * sizeof *a->s0) &&
           !memcmp(a->s1, b->s1, a->n * sizeof *a->s1) && !memcmp(a->s2, b->s2, a->n * sizeof *a->s2);
}

/* rows of every length 0..n - i0 at offsets 0..3, magnitudes rising and
 * falling so that exponents move in both directions; x in double or float */
static void check_path(par_gemm_path_id path, int lo, int hi, int specials, int single)
{
    enum { N = 37, ROWS = 400 };
    par_racc ref, got;
    cr_assert_eq(par_racc_init(&ref, N), PAR_OK);
    cr_assert_eq(par_racc_init(&got, N), PAR_OK);
    cr_assert_eq(par_gemm_path_set(path), PAR_OK);
    double xd[N];
    float xf[N];
    for (int r = 0; r < ROWS; r++) {
        const size_t i0 = (size_t)r % 4, n = (size_t)(uniform() * (double)(N - i0 + 1));
        const double g = r % 50 == 7 ? 0.0 : term(lo / 2, hi / 2, 0);
        for (size_t k = 0; k < n; k++) {
            xd[k] = term(lo / 2 - (r % 3) * 20, hi / 2 + (r % 5 == 1) * 40, specials);
            xf[k] = (float)xd[k];
        }
        for (size_t k = 0; k < n; k++)
            par_racc_put(&ref, i0 + k, g * (single ? (double)xf[k] : xd[k]));
        if (single)
            par_gsum_row_put_f32(&got, i0, g, xf, n);
        else
            par_gsum_row_put_f64(&got, i0, g, xd, n);
        cr_assert(same_state(&ref, &got), "path %s row %d (i0 %zu, n %zu): the state differs",
                  par_gemm_path_name(path), r, i0, n);
    }
    par_racc_free(&ref);
    par_racc_free(&got);
}

static void check_all_paths(int lo, int hi, int specials)
{
    for (int p = 0; p < PAR_GEMM_PATH_COUNT; p++)
        if (par_gemm_path_available((par_gemm_path_id)p))
            for (int single = 0; single < 2; single++)
                check_path((par_gemm_path_id)p, lo, hi, specials, single);
}

Test(gsum_row, equals_term_by_term_normal_range) { check_all_paths(-40, 40, 0); }
Test(gsum_row, equals_term_by_term_wide_range) { check_all_paths(-900, 900, 0); }
Test(gsum_row, equals_term_by_term_with_zeros_subnormals_nonfinite) { check_all_paths(-60, 60, 1); }
