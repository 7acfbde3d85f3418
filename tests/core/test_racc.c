/* core/racc.h: the same bits for any order, grouping and merge tree of the
 * same terms; the value within the stated bound of the exact sum (a 113-bit
 * __float128 reference); rising exponents, NaN, flushes; the registry. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/racc.h"

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint64_t nx(void)
{
    uint64_t x = rs;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return rs = x;
}
static double unif(void) { return (double)(nx() >> 11) * 0x1p-53; }

/* a term of random sign and magnitude 2^[lo, hi) */
static double term(int lo, int hi)
{
    double m = 1.0 + unif();
    int e = lo + (int)(nx() % (uint64_t)(hi - lo));
    return (nx() & 1 ? -1 : 1) * ldexp(m, e);
}

static uint64_t bits(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* the terms x[0..n) summed in order perm into acc element 0, split into
 * `parts` partial accumulators merged in a random order */
static double sum_split(const double *x, int n, const int *perm, int parts)
{
    par_racc p[8], tot;
    cr_assert_eq(par_racc_init(&tot, 1), PAR_OK);
    for (int k = 0; k < parts; k++)
        cr_assert_eq(par_racc_init(&p[k], 1), PAR_OK);
    for (int i = 0; i < n; i++)
        par_racc_put(&p[nx() % (uint64_t)parts], 0, x[perm[i]]);
    int order[8];
    for (int k = 0; k < parts; k++)
        order[k] = k;
    for (int k = parts - 1; k > 0; k--) {
        int j = (int)(nx() % (uint64_t)(k + 1)), t = order[k];
        order[k] = order[j], order[j] = t;
    }
    for (int k = 0; k < parts; k++)
        par_racc_merge(&tot, &p[order[k]], 0, 1);
    double v = par_racc_value(&tot, 0);
    for (int k = 0; k < parts; k++)
        par_racc_free(&p[k]);
    par_racc_free(&tot);
    return v;
}

static void shuffle(int *perm, int n)
{
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(nx() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
}

Test(racc, order_grouping_and_merges_do_not_move_a_bit)
{
    enum { N = 3000 };
    static double x[N];
    static int perm[N];
    const int ranges[][2] = {{-3, 3}, {-60, 40}, {-900, -850}, {-1070, -1000}, {900, 1000}, {-20, 20}};
    for (size_t r = 0; r < sizeof ranges / sizeof *ranges; r++) {
        for (int i = 0; i < N; i++)
            x[i] = term(ranges[r][0], ranges[r][1]);
        shuffle(perm, N);
        const double ref = sum_split(x, N, perm, 1);
        __float128 exact = 0; /* the terms' exact sum is within 2^-113 relative here for the narrow ranges */
        double big = 0;
        for (int i = 0; i < N; i++)
            exact += (__float128)x[i], big = fmax(big, fabs(x[i]));
        for (int trial = 0; trial < 40; trial++) {
            shuffle(perm, N);
            double v = sum_split(x, N, perm, 1 + trial % 8);
            cr_assert_eq(bits(v), bits(ref), "range %zu trial %d: %a vs %a", r, trial, v, ref);
        }
        if (isfinite(ref) && ranges[r][0] > -1000 && ranges[r][1] < 1000) /* bound: n terms, each cut at 2^-71 of the top */
            cr_assert_leq(fabs((double)((__float128)ref - exact)), fabs((double)exact) * 0x1p-52 + big * N * 0x1p-70,
                          "range %zu: %a vs exact %a", r, ref, (double)exact);
    }
}

Test(racc, a_larger_term_later_gives_the_same_bits_as_first)
{
    /* the exponent rises by one and by several grid steps, in both orders */
    const double small[] = {0x1.3p-40, -0x1.7p-45, 0x1.fffffp-3, 0x1p-70};
    const double bigs[] = {0x1.5p+20, 0x1.5p+40, 0x1.5p+100};
    for (size_t b = 0; b < 3; b++) {
        par_racc a, c;
        cr_assert_eq(par_racc_init(&a, 1), PAR_OK);
        cr_assert_eq(par_racc_init(&c, 1), PAR_OK);
        for (size_t i = 0; i < 4; i++)
            par_racc_put(&a, 0, small[i]);
        par_racc_put(&a, 0, bigs[b]);
        par_racc_put(&c, 0, bigs[b]);
        for (size_t i = 0; i < 4; i++)
            par_racc_put(&c, 0, small[i]);
        cr_assert_eq(a.e[0], c.e[0]);
        cr_assert_eq(a.s0[0], c.s0[0]);
        cr_assert_eq(a.s1[0], c.s1[0]);
        cr_assert_eq(bits(par_racc_value(&a, 0)), bits(par_racc_value(&c, 0)));
        par_racc_free(&a);
        par_racc_free(&c);
    }
}

Test(racc, exact_when_the_terms_fit_and_special_values)
{
    par_racc a;
    cr_assert_eq(par_racc_init(&a, 4), PAR_OK);
    par_racc_put(&a, 0, 1.0);
    par_racc_put(&a, 0, 0x1p-30);
    par_racc_put(&a, 0, -1.0);
    cr_assert_eq(par_racc_value(&a, 0), 0x1p-30);
    cr_assert_eq(bits(par_racc_value(&a, 1)), bits(0.0), "an empty element is +0");
    par_racc_put(&a, 2, 1.0);
    par_racc_put(&a, 2, INFINITY);
    par_racc_put(&a, 2, 1.0);
    cr_assert(isnan(par_racc_value(&a, 2)), "a non-finite term makes the element NaN");
    par_racc_put(&a, 3, 0.1);
    par_racc_put(&a, 3, 0.2);
    cr_assert_eq(par_racc_value(&a, 3), 0.30000000000000004 /* the exact sum rounded once */);
    par_racc_zero(&a, 0, 4);
    cr_assert_eq(par_racc_value(&a, 2), 0.0);
    par_racc_free(&a);
}

Test(racc, registry_finds_interior_pointers_only)
{
    double buf[64], other[8];
    par_racc a;
    cr_assert_eq(par_racc_init(&a, 64), PAR_OK);
    cr_assert_eq(par_racc_lookup(buf, 1).acc, NULL);
    cr_assert_eq(par_racc_register(buf, 64, sizeof *buf, &a), PAR_OK);
    cr_assert_neq(par_racc_register(buf + 10, 4, sizeof *buf, &a), PAR_OK, "overlap refused");
    par_racc_view v = par_racc_lookup(buf + 10, 54);
    cr_assert_eq(v.acc, &a);
    cr_assert_eq(v.at, 10);
    cr_assert_eq(par_racc_lookup(buf + 10, 55).acc, NULL, "a range past the end is not taken");
    cr_assert_eq(par_racc_lookup(other, 1).acc, NULL);
    par_racc_unregister(buf);
    cr_assert_eq(par_racc_lookup(buf, 1).acc, NULL);
    cr_assert_eq(par_racc_registered(), 0);
    par_racc_free(&a);
}

Test(racc, registry_grows_past_its_first_table)
{
    /* a world of 8,192 fiber ranks registers three buffers per rank: the
     * table must grow (it held 8,192 entries at first, and config-b failed) */
    enum { NB = 300 };
    static double bufs[NB][4];
    static par_racc acc[NB];
    for (int i = 0; i < NB; i++) {
        cr_assert_eq(par_racc_init(&acc[i], 4), PAR_OK);
        cr_assert_eq(par_racc_register(bufs[i], 4, sizeof(double), &acc[i]), PAR_OK, "buffer %d", i);
    }
    cr_assert_eq(par_racc_registered(), NB);
    for (int i = 0; i < NB; i++) {
        par_racc_view v = par_racc_lookup(bufs[i] + 3, 1);
        cr_assert_eq(v.acc, &acc[i], "buffer %d", i);
        cr_assert_eq(v.at, 3);
    }
    for (int i = NB - 1; i >= 0; i--) {
        par_racc_unregister(bufs[i]);
        par_racc_free(&acc[i]);
    }
    cr_assert_eq(par_racc_registered(), 0);
}
