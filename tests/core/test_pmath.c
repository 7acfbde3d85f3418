/* core/pmath.h against a 113-bit reference (__float128, libquadmath): the
 * largest error in ulps of each function on random and edge points, next to
 * glibc's on the same points (information); special values as C's. */
#include <criterion/criterion.h>
#include <math.h>
#include <quadmath.h>
#include <stdint.h>
#include <string.h>

#include "core/pmath.h"
#include "core/rng.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void)
{
    uint64_t x = rng_state;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return rng_state = x;
}

/* uniform in [a, b) */
static double unif(double a, double b) { return a + (b - a) * (double)(next_u64() >> 11) * 0x1p-53; }

/* |got - ref| in units of the last place of the double nearest ref */
static double ulps(double got, __float128 ref)
{
    if (isnan(got) || isinfq(ref) || ref == 0)
        return got == (double)ref ? 0 : 1e9;
    int e = ilogbq(ref);
    if (e < -1022)
        e = -1022;
    __float128 d = (__float128)got - ref;
    return (double)(fabsq(d) / ldexpq(1.0Q, e - 52));
}

typedef struct {
    double worst, worst_x, worst_y, libm;
    long n;
} tally;

static void add(tally *t, double got, double libm_got, __float128 ref, double x, double y)
{
    double u = ulps(got, ref), ul = ulps(libm_got, ref);
    if (u > t->worst)
        t->worst = u, t->worst_x = x, t->worst_y = y;
    if (ul > t->libm)
        t->libm = ul;
    t->n++;
}

static void report(const char *name, const tally *t, double bound)
{
    cr_log_info("%-6s %7ld points: max %.3f ulp (at x = %a, y = %a); glibc %.3f ulp", name, t->n, t->worst,
                t->worst_x, t->worst_y, t->libm);
    cr_expect(t->worst <= bound, "%s: %.3f ulp at x = %a (y = %a), over the stated %g", name, t->worst, t->worst_x,
              t->worst_y, bound);
}

#define N 200000

Test(pmath, exp_within_one_ulp)
{
    tally t = {0};
    for (int i = 0; i < N; i++) {
        double x = i % 4 == 0 ? unif(-745.1, 709.78) : i % 4 == 1 ? unif(-1, 1)
                 : i % 4 == 2 ? unif(-40, 40) : ldexp(unif(-1, 1), -(int)(next_u64() % 60));
        add(&t, par_pmath_exp(x), exp(x), expq((__float128)x), x, 0);
    }
    report("exp", &t, 1.0);
    cr_expect(par_pmath_exp(-INFINITY) == 0 && par_pmath_exp(INFINITY) == INFINITY && isnan(par_pmath_exp(NAN)));
    cr_expect(par_pmath_exp(710) == INFINITY && par_pmath_exp(-746) == 0 && par_pmath_exp(0) == 1);
}

Test(pmath, log_and_log1p_within_one_ulp)
{
    tally t = {0}, t1 = {0};
    for (int i = 0; i < N; i++) {
        double x = i % 3 == 0 ? ldexp(unif(1, 2), (int)(next_u64() % 2098) - 1074)
                 : i % 3 == 1 ? unif(0.5, 2) : 1 + ldexp(unif(-1, 1), -(int)(next_u64() % 50));
        add(&t, par_pmath_log(x), log(x), logq((__float128)x), x, 0);
        double y = i % 3 == 0 ? ldexp(unif(-1, 1), -(int)(next_u64() % 70))
                 : i % 3 == 1 ? -1 + ldexp(unif(0, 1), -(int)(next_u64() % 50)) : ldexp(unif(0, 1), (int)(next_u64() % 1000));
        add(&t1, par_pmath_log1p(y), log1p(y), log1pq((__float128)y), y, 0);
    }
    report("log", &t, 1.0);
    report("log1p", &t1, 1.0);
    cr_expect(par_pmath_log(0) == -INFINITY && isnan(par_pmath_log(-1)) && par_pmath_log(1) == 0);
    cr_expect(par_pmath_log(INFINITY) == INFINITY && par_pmath_log(0x1p-1074) == -0x1.74385446d71c3p+9);
    cr_expect(par_pmath_log1p(-1) == -INFINITY && isnan(par_pmath_log1p(-2)) && par_pmath_log1p(-0.0) == 0);
}

Test(pmath, sin_cos_within_one_ulp)
{
    tally ts = {0}, tc = {0};
    for (int i = 0; i < N; i++) {
        double x = i % 4 == 0 ? unif(-4, 4) : i % 4 == 1 ? unif(-8192, 8192) : i % 4 == 2 ? unif(-0x1p20, 0x1p20)
                 : (double)(int64_t)(next_u64() % 200000) * 0x1.921fb54442d18p+0 + unif(-1e-6, 1e-6);
        double s, c;
        par_pmath_sincos(x, &s, &c);
        cr_assert(s == par_pmath_sin(x) && c == par_pmath_cos(x));
        add(&ts, s, sin(x), sinq((__float128)x), x, 0);
        add(&tc, c, cos(x), cosq((__float128)x), x, 0);
    }
    report("sin", &ts, 1.0);
    report("cos", &tc, 1.0);
    cr_expect(isnan(par_pmath_sin(INFINITY)) && isnan(par_pmath_cos(NAN)) && par_pmath_cos(0) == 1);
}

Test(pmath, pow_within_one_ulp)
{
    tally t = {0};
    for (int i = 0; i < N; i++) {
        double x, y;
        if (i % 3 == 0) /* YaRN / RoPE: base^(2i/rd) */
            x = unif(1, 1e6), y = unif(-1, 1);
        else if (i % 3 == 1) /* Adam's bias corrections: beta^t */
            x = unif(0.5, 1), y = (double)(next_u64() % 100000);
        else
            x = exp(unif(-20, 20)), y = unif(-30, 30);
        add(&t, par_pmath_pow(x, y), pow(x, y), powq((__float128)x, (__float128)y), x, y);
    }
    report("pow", &t, 1.0);
    cr_expect(par_pmath_pow(-2, 3) == -8 && par_pmath_pow(-2, 2) == 4 && isnan(par_pmath_pow(-2, 0.5)));
    cr_expect(par_pmath_pow(0, -1) == INFINITY && par_pmath_pow(0, 2) == 0 && par_pmath_pow(NAN, 0) == 1);
    cr_expect(par_pmath_pow(2, 1024) == INFINITY && par_pmath_pow(2, -1080) == 0 && par_pmath_pow(10, 2) == 100);
}

/* par_pmath_softplus_parts (four lanes with AVX2 + FMA) gives the bits of
 * the scalar calls: wide random arguments, the edges of its vector domain
 * (|x| = 2^-54, 700, the log1p cut near 37.4, e = 1), specials, and every
 * length 0..9 (the scalar tail). */
Test(pmath, softplus_parts_bitwise_scalar)
{
    enum { NP = 1 << 16 };
    static double x[NP], e[NP], lp[NP];
    static const double edge[] = {0.0, -0.0, 0x1p-54, -0x1p-54, 0x1.fffffffffffffp-55, 0x1p-53, 0x1p-60, 1e-300,
                                  700.0, -700.0, 0x1.5e00000000001p+9, 701.0, 745.0, 746.0, 1e300, 37.0, 37.4,
                                  37.5, 38.0, 0.3465, 0.881373587, 1.0, -1.0, INFINITY, -INFINITY, NAN, -NAN};
    const int ne = (int)(sizeof edge / sizeof edge[0]);
    uint64_t st = 0x243f6a8885a308d3ull;
    for (int round = 0; round < 40; round++) {
        for (int i = 0; i < NP; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(st >> 11) * 0x1p-53;
            const double mag = round % 4 == 0 ? 1.0 : round % 4 == 1 ? 10.0 : round % 4 == 2 ? 50.0 : 800.0;
            x[i] = i % 97 < ne && round == 0 ? edge[i % 97] : (2.0 * u - 1.0) * mag;
        }
        par_pmath_softplus_parts(x, e, lp, NP);
        for (int i = 0; i < NP; i++) {
            const double e0 = par_pmath_exp(-fabs(x[i])), l0 = par_pmath_log1p(e0);
            cr_assert(!memcmp(&e0, &e[i], 8) && !memcmp(&l0, &lp[i], 8), "x = %a: parts (%a, %a), scalar (%a, %a)",
                      x[i], e[i], lp[i], e0, l0);
        }
    }
    for (int n = 0; n < 10; n++) { /* the tails; nothing written past n */
        for (int i = 0; i < 12; i++)
            x[i] = 0.37 * (i + 1), e[i] = lp[i] = -1.0;
        par_pmath_softplus_parts(x, e, lp, n);
        for (int i = 0; i < 12; i++)
            cr_assert(i < n ? e[i] == par_pmath_exp(-x[i]) && lp[i] == par_pmath_log1p(e[i])
                            : e[i] == -1.0 && lp[i] == -1.0, "n %d i %d", n, i);
    }
}

/* par_pmath_box_muller (four lanes with AVX2 + FMA) gives the bits of the
 * scalar expression of rng.c's par_rng_normal: random u in (0, 1), the edges
 * of its vector domain (u1 = 2^-1022, 1, the smallest draws; 2 pi u2 around
 * 2^-27, near each multiple of pi/2, at 2 pi), specials, every length 0..9. */
Test(pmath, box_muller_bitwise_scalar)
{
    enum { NP = 1 << 16 };
    static double u1[NP], u2[NP], o[NP];
    static const double edge[] = {0x1p-1022, 0x1p-1023, 0x1p-54, 0x1p-53, 0.5, 1.0, 0x1.fffffffffffffp-1,
                                  0x1p-30, 0x1.45f306dc9c882p-30, 0x1.45f306dc9c884p-30, 0.25, 0.5, 0.75,
                                  0x1.fffffffffffffp-3, 0x1.0000000000001p-2, 0x1.fffffffffffffp-2, 0.0, -0.5,
                                  1.0000000000000002, NAN, INFINITY};
    const int ne = (int)(sizeof edge / sizeof edge[0]);
    for (int round = 0; round < 24; round++) {
        for (int i = 0; i < NP; i++) {
            const double a = (double)(next_u64() >> 11) * 0x1p-53 + 0x1p-54;
            const double b = (double)(next_u64() >> 11) * 0x1p-53 + 0x1p-54;
            u1[i] = round == 0 && i % 89 < ne ? edge[i % 89] : round % 3 == 1 ? a * 0x1p-40 : a;
            u2[i] = round == 0 && i % 83 < ne ? edge[i % 83] : round % 3 == 2 ? b * 0x1p-30 : b;
        }
        par_pmath_box_muller(u1, u2, o, NP);
        for (int i = 0; i < NP; i++) {
            const double r = sqrt(-2.0 * par_pmath_log(u1[i])) * par_pmath_cos(6.283185307179586476925 * u2[i]);
            cr_assert(!memcmp(&r, &o[i], 8) || (r != r && o[i] != o[i]), "u1 %a u2 %a: lanes %a, scalar %a", u1[i],
                      u2[i], o[i], r);
        }
    }
    for (int n = 0; n < 10; n++) { /* the tails; nothing written past n */
        for (int i = 0; i < 12; i++)
            u1[i] = 0.07 * (i + 1), u2[i] = 0.083 * (i + 1), o[i] = -7.0;
        par_pmath_box_muller(u1, u2, o, n);
        for (int i = 0; i < 12; i++)
            cr_assert(i < n ? o[i] == sqrt(-2.0 * par_pmath_log(u1[i])) * par_pmath_cos(6.283185307179586476925 * u2[i])
                            : o[i] == -7.0, "n %d i %d", n, i);
    }
}

/* par_rng_normal_n: par_rng_normal's bits for consecutive counters, across
 * the counter's 32-bit carry, for several keys, words and lengths. */
Test(pmath, rng_normal_n_bitwise)
{
    static double o[5003];
    const uint64_t starts[] = {0, 1, 0xffffffffull - 1500, 0x123456789abull};
    for (int k = 0; k < 3; k++) {
        par_philox_key key = par_rng_key(1234 + 977 * (uint64_t)k, k == 2 ? "layers.0.ffn.experts.3.w1" : "embed.weight");
        for (int s = 0; s < 4; s++)
            for (int n = 0; n <= 5003; n += n < 12 ? 1 : 1249) {
                par_rng_normal_n(key, starts[s], (uint32_t)k, o, n);
                for (int j = 0; j < n; j++) {
                    const double r = par_rng_normal(key, starts[s] + (uint64_t)j, (uint32_t)k);
                    cr_assert(!memcmp(&r, &o[j], 8), "key %d start %d n %d j %d: %a vs %a", k, s, n, j, o[j], r);
                }
            }
    }
}
