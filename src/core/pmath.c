/* core/pmath.c - elementary functions with a fixed operation sequence (see
 * core/pmath.h).  Only +, -, *, / and fma() of IEEE doubles, in the order
 * written; the polynomials are truncated Taylor / atanh series with more
 * terms than double precision needs (the first dropped term is below 2^-66
 * of the result); the constants are hexadecimal literals (exact). */
#include "core/pmath.h"

#include <math.h> /* fma() (exactly rounded: the same everywhere), INFINITY, NAN */
#include <stdint.h>
#include <string.h>

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp declare target
#endif

/* Without -mfma, GCC compiles fma() as a call into libm (exact, but slow:
 * the golden step spent a third of its time there).  On x86-64 each entry
 * point is therefore built twice, for CPUs with FMA and without, and the
 * loader picks one (an ifunc); the helpers are inlined into both.  fma() is
 * exactly rounded either way, so both give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !(defined(PAR_OFFLOAD) && PAR_OFFLOAD)
#define PM_ENTRY __attribute__((target_clones("fma", "default")))
#else
#define PM_ENTRY
#endif
#define PM_INLINE static inline __attribute__((always_inline))

/* ln 2 = LN2_HI + LN2_LO; LN2_HI has 42 bits, so k LN2_HI is exact for |k| < 2^11 */
#define LN2_HI 0x1.62e42fefa3800p-1
#define LN2_LO 0x1.ef35793c76730p-45
#define INV_LN2 0x1.71547652b82fep+0
#define SQRT2 0x1.6a09e667f3bcdp+0
/* 2/3 = LOG_C3_HI + LOG_C3_LO */
#define LOG_C3_HI 0x1.5555555555555p-1
#define LOG_C3_LO 0x1.5555555555555p-55
#define EXP_MAX 0x1.62e42fefa39efp+9 /* ln DBL_MAX */
#define EXP_MIN -0x1.74910d52d3052p+9 /* ln 2^-1075: below, e^x rounds to 0 */
/* pi/2 = PIO2_1 + PIO2_2 + PIO2_3 (each the double nearest what is left) */
#define PIO2_1 0x1.921fb54442d18p+0
#define PIO2_2 0x1.1a62633145c07p-54
#define PIO2_3 -0x1.f1976b7ed8fbcp-110
#define INV_PIO2 0x1.45f306dc9c883p-1
/* (x + SHIFTER) - SHIFTER rounds x to an integer (|x| < 2^51) */
#define SHIFTER 0x1.8p52

/* 1/n!, n = 15 .. 2 */
static const double exp_c[] = {0x1.ae7f3e733b81fp-41, 0x1.93974a8c07c9dp-37, 0x1.6124613a86d09p-33,
                               0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22,
                               0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-13,
                               0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,  0x1.5555555555555p-5,
                               0x1.5555555555555p-3,  0x1.0000000000000p-1};
/* 2/(2n+1), 2n+1 = 25 .. 3: ln m = 2 atanh s = 2s + 2s^3/3 + ... (the last,
 * 2/3, is used in two parts: LOG_C3_*) */
static const double log_c[] = {0x1.47ae147ae147bp-4, 0x1.642c8590b2164p-4, 0x1.8618618618618p-4,
                               0x1.af286bca1af28p-4, 0x1.e1e1e1e1e1e1ep-4, 0x1.1111111111111p-3,
                               0x1.3b13b13b13b14p-3, 0x1.745d1745d1746p-3, 0x1.c71c71c71c71cp-3,
                               0x1.2492492492492p-2, 0x1.999999999999ap-2, 0x1.5555555555555p-1};
/* (-1)^n/(2n+1)!, 2n+1 = 21 .. 3 */
static const double sin_c[] = {0x1.71b8ef6dcf572p-66, -0x1.2f49b46814157p-57, 0x1.952c77030ad4ap-49,
                               -0x1.ae7f3e733b81fp-41, 0x1.6124613a86d09p-33, -0x1.ae64567f544e4p-26,
                               0x1.71de3a556c734p-19, -0x1.a01a01a01a01ap-13, 0x1.1111111111111p-7,
                               -0x1.5555555555555p-3};
/* (-1)^n/(2n)!, 2n = 22 .. 4 */
static const double cos_c[] = {-0x1.0ce396db7f853p-70, 0x1.e542ba4020225p-62, -0x1.6827863b97d97p-53,
                               0x1.ae7f3e733b81fp-45, -0x1.93974a8c07c9dp-37, 0x1.1eed8eff8d898p-29,
                               -0x1.27e4fb7789f5cp-22, 0x1.a01a01a01a01ap-16, -0x1.6c16c16c16c17p-10,
                               0x1.5555555555555p-5};

#define NCOEF(a) ((int)(sizeof(a) / sizeof((a)[0])))

PM_INLINE uint64_t bits_of(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

PM_INLINE double of_bits(uint64_t u)
{
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* 2^k, k in [-1022, 1023] (exact) */
PM_INLINE double pow2i(int k) { return of_bits((uint64_t)(k + 1023) << 52); }

/* c[0] z^(n-1) + ... + c[n-1] by Horner's rule with fma */
PM_INLINE double horner(const double *c, int n, double z)
{
    double p = c[0];
    for (int i = 1; i < n; i++)
        p = fma(p, z, c[i]);
    return p;
}

/* s + e = a + b exactly (Knuth's TwoSum) */
PM_INLINE void two_sum(double a, double b, double *s, double *e)
{
    const double t = a + b, bb = t - a;
    *s = t;
    *e = (a - (t - bb)) + (b - bb);
}

/* ------------------------------------------------------------------ exp */

/* y 2^k without overflow before the end; one rounding into the subnormals */
PM_INLINE double scale2(double y, int k)
{
    if (k > 1023)
        return y * pow2i(1023) * pow2i(k - 1023);
    if (k < -1021)
        return y * pow2i(k + 54) * 0x1p-54;
    return y * pow2i(k);
}

/* e^(hi + lo), EXP_MIN <= hi <= EXP_MAX, |lo| <= 2^-40 |hi|: hi = k ln2 + r,
 * |r| <= 0.35, e^r = 1 + r + r^2 q(r) (Taylor to r^15/15!) with 1 + r
 * exact in two parts, the low part folded in as e^r (1 + rl). */
PM_INLINE double exp_dd(double hi, double lo)
{
    const double kd = (hi * INV_LN2 + SHIFTER) - SHIFTER;
    const double r = fma(-kd, LN2_HI, hi); /* exact (k LN2_HI exact, Sterbenz) */
    const double rl = fma(-kd, LN2_LO, lo);
    const double q = horner(exp_c, NCOEF(exp_c), r);
    double a, ae;
    two_sum(1.0, r, &a, &ae);
    const double p = fma(r * r, q, ae);      /* e^r = a + p */
    const double tail = fma(rl, a + p, p);   /* e^(r + rl) = (a + p)(1 + rl) */
    return scale2(a + tail, (int)kd);
}

PM_ENTRY double par_pmath_exp(double x)
{
    if (x != x)
        return x + x;
    if (x > EXP_MAX)
        return INFINITY;
    if (x < EXP_MIN)
        return 0.0;
    if (x < 0x1p-54 && x > -0x1p-54)
        return 1.0 + x;
    return exp_dd(x, 0.0);
}

/* ------------------------------------------------------------------ log */

/* ln x = hi + lo (|lo| <= ulp(hi) / 2, about 2^-68 relative) for finite
 * x > 0: x = 2^e m, m in [sqrt(1/2), sqrt(2)], ln m = 2 atanh(f / (2 + f))
 * with f = m - 1 exact and s = f / (2 + f) in double-double. */
PM_INLINE void log_dd(double x, double *hi, double *lo)
{
    int e = 0;
    if (x < 0x1p-1022) { /* subnormal */
        x *= 0x1p54;
        e = -54;
    }
    const uint64_t u = bits_of(x);
    e += (int)(u >> 52) - 1023;
    double m = of_bits((u & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (m > SQRT2) {
        m *= 0.5;
        e += 1;
    }
    const double f = m - 1.0;                       /* exact (Sterbenz) */
    const double d = 2.0 + f, de = f - (d - 2.0);   /* d + de = 2 + f exactly */
    const double sh = f / d;
    const double sl = (fma(-sh, d, f) - sh * de) / d; /* s = sh + sl */
    /* s^3 = c3 + c3l and (2/3) s^3 = t1 + t1l in double-double (the term
     * that sets ln's last bits); 2s^5/5 + ... = t2 in double */
    const double zh = sh * sh, zl = fma(sh, sh, -zh);
    const double c3 = sh * zh, c3l = fma(sh, zh, -c3) + (sh * zl + 3.0 * sl * zh);
    const double t1 = LOG_C3_HI * c3, t1l = fma(LOG_C3_HI, c3, -t1) + (LOG_C3_HI * c3l + LOG_C3_LO * c3);
    const double t2 = horner(log_c, NCOEF(log_c) - 1, zh) * zh * c3;
    double h, err, h2, err2;
    two_sum((double)e * LN2_HI, 2.0 * sh, &h, &err);
    two_sum(h, t1, &h2, &err2);
    const double l = (err + err2) + (2.0 * sl + t1l + t2 + (double)e * LN2_LO);
    *hi = h2 + l;
    *lo = l - (*hi - h2);
}

PM_ENTRY double par_pmath_log(double x)
{
    if (x != x || x == INFINITY)
        return x + x;
    if (x < 0)
        return NAN;
    if (x == 0)
        return -INFINITY;
    double hi, lo;
    log_dd(x, &hi, &lo);
    return hi;
}

PM_ENTRY double par_pmath_log1p(double x)
{
    if (x != x || x == INFINITY)
        return x + x;
    if (x < -1.0)
        return NAN;
    if (x == -1.0)
        return -INFINITY;
    if (x < 0x1p-54 && x > -0x1p-54)
        return x;
    const double u = 1.0 + x;
    const double err = x < 1.0 && x > -1.0 ? x - (u - 1.0) : 1.0 - (u - x); /* u + err = 1 + x */
    double hi, lo;
    log_dd(u, &hi, &lo);
    return hi + (lo + err / u); /* ln(u + err) = ln u + err/u (err/u < 2^-53) */
}

/* ------------------------------------------------------------- sin, cos */

/* x = n pi/2 + rh + rl, |rh| <= pi/4 (a hair more), q = n mod 4: Cody-Waite
 * in three parts; x - n PIO2_1 is exact, the rest in double-double. */
PM_INLINE int reduce_pio2(double x, double *rh, double *rl)
{
    const double nd = (x * INV_PIO2 + SHIFTER) - SHIFTER;
    const double r1 = fma(-nd, PIO2_1, x);
    const double p = nd * PIO2_2, pe = fma(nd, PIO2_2, -p); /* n PIO2_2 = p + pe */
    double r2, e2;
    two_sum(r1, -p, &r2, &e2);
    const double l = (e2 - pe) - nd * PIO2_3;
    *rh = r2 + l;
    *rl = l - (*rh - r2);
    return (int)((int64_t)nd & 3);
}

/* sin(h + l), |h| <= pi/4 + eps: h + h z S(z) + l (1 - z/2), z = h^2 */
PM_INLINE double sin_kernel(double h, double l)
{
    const double z = h * h;
    const double corr = fma(-0.5 * z, l, l);
    return h + fma(h * z, horner(sin_c, NCOEF(sin_c), z), corr);
}

/* cos(h + l) = 1 - z/2 + z^2 C(z) - h l; 1 - z/2 kept exact in w + its error */
PM_INLINE double cos_kernel(double h, double l)
{
    const double z = h * h, hz = 0.5 * z, w = 1.0 - hz;
    const double tail = ((1.0 - w) - hz) + fma(z * z, horner(cos_c, NCOEF(cos_c), z), -h * l);
    return w + tail;
}

PM_ENTRY void par_pmath_sincos(double x, double *s, double *c)
{
    if (x != x || x == INFINITY || x == -INFINITY) {
        *s = *c = x - x; /* NaN */
        return;
    }
    if (x < 0x1p-27 && x > -0x1p-27) { /* sin x = x, cos x = 1 to within 2^-55 */
        *s = x;
        *c = 1.0;
        return;
    }
    double h, l;
    const int q = reduce_pio2(x, &h, &l);
    const double sn = sin_kernel(h, l), cs = cos_kernel(h, l);
    switch (q) {
    case 0: *s = sn, *c = cs; break;
    case 1: *s = cs, *c = -sn; break;
    case 2: *s = -sn, *c = -cs; break;
    default: *s = -cs, *c = sn; break;
    }
}

PM_ENTRY double par_pmath_sin(double x)
{
    double s, c;
    par_pmath_sincos(x, &s, &c);
    return s;
}

PM_ENTRY double par_pmath_cos(double x)
{
    double s, c;
    par_pmath_sincos(x, &s, &c);
    return c;
}

/* ------------------------------------------------------------------ pow */

/* 0: y is no integer; 1: an odd one; 2: an even one */
PM_INLINE int int_kind(double y)
{
    if (y != y || y == INFINITY || y == -INFINITY)
        return 0;
    if (y >= 0x1p53 || y <= -0x1p53)
        return 2;
    const int64_t i = (int64_t)y;
    if ((double)i != y)
        return 0;
    return (i & 1) ? 1 : 2;
}

/* pow(x, y) for the special operands (C's pow): *r set, 1 returned */
PM_INLINE int pow_special(double x, double y, double *r)
{
    const double ax = x < 0 ? -x : x;
    if (y == 0 || x == 1)
        *r = 1.0;
    else if (x != x || y != y)
        *r = x + y;
    else if (y == INFINITY || y == -INFINITY)
        *r = ax == 1 ? 1.0 : (ax > 1) == (y > 0) ? INFINITY : 0.0;
    else if (x == 0 || ax == INFINITY) {
        const int odd = int_kind(y) == 1 && x < 0;
        const double mag = (x == 0) == (y < 0) ? INFINITY : 0.0;
        *r = odd ? -mag : mag;
    } else if (x < 0 && !int_kind(y))
        *r = NAN;
    else
        return 0;
    return 1;
}

/* x^y = e^(y ln x): ln x in double-double, the product too */
PM_ENTRY double par_pmath_pow(double x, double y)
{
    double r;
    if (pow_special(x, y, &r))
        return r;
    const double sign = x < 0 && int_kind(y) == 1 ? -1.0 : 1.0;
    double lh, ll;
    log_dd(x < 0 ? -x : x, &lh, &ll);
    const double ph = y * lh, pl = fma(y, lh, -ph) + y * ll;
    if (ph > EXP_MAX + 1.0)
        return sign * INFINITY;
    if (ph < EXP_MIN - 1.0)
        return sign * 0.0;
    const double e = exp_dd(ph, pl);
    return sign * e;
}

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp end declare target
#endif

/* ------------------------------------------------- softplus, four lanes */

#define BM_TWO_PI 6.283185307179586476925 /* the literal of rng.c's par_rng_normal */

/* par_pmath_softplus_parts (pmath.h): exp_dd(-|x|, 0) and log1p's path
 * through log_dd, written again on four lanes with the same operations in
 * the same order (an IEEE operation rounds the same in a vector lane), for
 * |x| in [2^-54, 700]: exp's scale2 is then one multiply by 2^k (k >= -1010)
 * and log1p's u = 1 + e lies in [1, 2] (no subnormal).  Other lanes: the
 * scalar calls. */
static void softplus_parts_scalar(const double *x, double *e, double *lp, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        e[i] = par_pmath_exp(-fabs(x[i]));
        lp[i] = par_pmath_log1p(e[i]);
    }
}

/* par_pmath_box_muller (pmath.h): rng.c's par_rng_normal after its draws */
static void box_muller_scalar(const double *u1, const double *u2, double *out, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = sqrt(-2.0 * par_pmath_log(u1[i])) * par_pmath_cos(BM_TWO_PI * u2[i]);
}

#if defined(__x86_64__) && defined(__GNUC__) && !(defined(PAR_OFFLOAD) && PAR_OFFLOAD)
#include <immintrin.h>
#define SP_ATTR __attribute__((target("avx2,fma")))
#define V4 __m256d
#define S4(x) _mm256_set1_pd(x)

SP_ATTR static inline V4 v_horner(const double *c, int n, V4 z)
{
    V4 p = S4(c[0]);
    for (int i = 1; i < n; i++)
        p = _mm256_fmadd_pd(p, z, S4(c[i]));
    return p;
}

SP_ATTR static inline void v_two_sum(V4 a, V4 b, V4 *s, V4 *e)
{
    const V4 t = _mm256_add_pd(a, b), bb = _mm256_sub_pd(t, a);
    *s = t;
    *e = _mm256_add_pd(_mm256_sub_pd(a, _mm256_sub_pd(t, bb)), _mm256_sub_pd(b, bb));
}

SP_ATTR static inline V4 v_neg(V4 a) { return _mm256_xor_pd(a, S4(-0.0)); }

/* exp_dd(hi, 0), hi in [-700, -2^-54] */
SP_ATTR static V4 v_exp_neg(V4 hi)
{
    const V4 t = _mm256_add_pd(_mm256_mul_pd(hi, S4(INV_LN2)), S4(SHIFTER));
    const V4 kd = _mm256_sub_pd(t, S4(SHIFTER)), nkd = v_neg(kd);
    const V4 r = _mm256_fmadd_pd(nkd, S4(LN2_HI), hi);
    const V4 rl = _mm256_fmadd_pd(nkd, S4(LN2_LO), S4(0.0));
    const V4 q = v_horner(exp_c, NCOEF(exp_c), r);
    V4 a, ae;
    v_two_sum(S4(1.0), r, &a, &ae);
    const V4 p = _mm256_fmadd_pd(_mm256_mul_pd(r, r), q, ae);
    const V4 tail = _mm256_fmadd_pd(rl, _mm256_add_pd(a, p), p);
    /* t = SHIFTER + k exactly, so its bits are SHIFTER's + k; 2^k's are (k + 1023) << 52 */
    const __m256i k = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(S4(SHIFTER)));
    const V4 p2 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(k, _mm256_set1_epi64x(1023)), 52));
    return _mm256_mul_pd(_mm256_add_pd(a, tail), p2);
}

/* log_dd's body from m (in [sqrt(1/2), sqrt(2)]) and e (as a double) on */
SP_ATTR static inline void v_log_core(V4 m, V4 ed, V4 *hi, V4 *lo)
{
    const V4 f = _mm256_sub_pd(m, S4(1.0));
    const V4 d = _mm256_add_pd(S4(2.0), f), de = _mm256_sub_pd(f, _mm256_sub_pd(d, S4(2.0)));
    const V4 sh = _mm256_div_pd(f, d);
    const V4 sl = _mm256_div_pd(_mm256_sub_pd(_mm256_fmadd_pd(v_neg(sh), d, f), _mm256_mul_pd(sh, de)), d);
    const V4 zh = _mm256_mul_pd(sh, sh), zl = _mm256_fmadd_pd(sh, sh, v_neg(zh));
    const V4 c3 = _mm256_mul_pd(sh, zh);
    const V4 c3l = _mm256_add_pd(_mm256_fmadd_pd(sh, zh, v_neg(c3)),
                                 _mm256_add_pd(_mm256_mul_pd(sh, zl),
                                               _mm256_mul_pd(_mm256_mul_pd(S4(3.0), sl), zh)));
    const V4 t1 = _mm256_mul_pd(S4(LOG_C3_HI), c3);
    const V4 t1l = _mm256_add_pd(_mm256_fmadd_pd(S4(LOG_C3_HI), c3, v_neg(t1)),
                                 _mm256_add_pd(_mm256_mul_pd(S4(LOG_C3_HI), c3l), _mm256_mul_pd(S4(LOG_C3_LO), c3)));
    const V4 t2 = _mm256_mul_pd(_mm256_mul_pd(v_horner(log_c, NCOEF(log_c) - 1, zh), zh), c3);
    V4 h, err, h2, err2;
    v_two_sum(_mm256_mul_pd(ed, S4(LN2_HI)), _mm256_mul_pd(S4(2.0), sh), &h, &err);
    v_two_sum(h, t1, &h2, &err2);
    const V4 rest = _mm256_add_pd(_mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(S4(2.0), sl), t1l), t2),
                                  _mm256_mul_pd(ed, S4(LN2_LO)));
    const V4 l = _mm256_add_pd(_mm256_add_pd(err, err2), rest);
    *hi = _mm256_add_pd(h2, l);
    *lo = _mm256_sub_pd(l, _mm256_sub_pd(*hi, h2));
}

/* x's mantissa as m in [1, 2) and where log_dd halves it (m > sqrt 2) */
SP_ATTR static inline V4 v_log_mant(V4 x, V4 *big)
{
    const __m256i mant = _mm256_and_si256(_mm256_castpd_si256(x), _mm256_set1_epi64x(0x000fffffffffffffll));
    const V4 m = _mm256_castsi256_pd(_mm256_or_si256(mant, _mm256_set1_epi64x(0x3ff0000000000000ll)));
    *big = _mm256_cmp_pd(m, S4(SQRT2), _CMP_GT_OQ);
    return _mm256_blendv_pd(m, _mm256_mul_pd(m, S4(0.5)), *big);
}

/* log_dd(u, hi, lo) for u in [1, 2] */
SP_ATTR static void v_log_dd(V4 u, V4 *hi, V4 *lo)
{
    V4 big;
    const V4 m = v_log_mant(u, &big);
    /* e: the exponent of u (0, or 1 for u = 2) plus 1 where m was halved */
    const V4 ed = _mm256_add_pd(_mm256_and_pd(_mm256_cmp_pd(u, S4(2.0), _CMP_GE_OQ), S4(1.0)),
                                _mm256_and_pd(big, S4(1.0)));
    v_log_core(m, ed, hi, lo);
}

/* log_dd(x, hi, lo) for a positive normal finite x: e = its unbiased exponent
 * (+1 where m was halved), made a double exactly from the exponent bits */
SP_ATTR static void v_log_dd_normal(V4 x, V4 *hi, V4 *lo)
{
    V4 big;
    const V4 m = v_log_mant(x, &big);
    const __m256i eb = _mm256_srli_epi64(_mm256_castpd_si256(x), 52); /* biased exponent, 1 .. 2046 */
    const V4 ebd = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(eb, _mm256_castpd_si256(S4(0x1p52)))),
                                 S4(0x1p52));
    const V4 ed = _mm256_add_pd(_mm256_sub_pd(ebd, S4(1023.0)), _mm256_and_pd(big, S4(1.0)));
    v_log_core(m, ed, hi, lo);
}

/* log1p(e), e in (0, 1] (e < 2^-54: e itself) */
SP_ATTR static V4 v_log1p_unit(V4 e)
{
    const V4 u = _mm256_add_pd(S4(1.0), e);
    const V4 err = _mm256_blendv_pd(_mm256_sub_pd(S4(1.0), _mm256_sub_pd(u, e)),
                                    _mm256_sub_pd(e, _mm256_sub_pd(u, S4(1.0))),
                                    _mm256_cmp_pd(e, S4(1.0), _CMP_LT_OQ));
    V4 hi, lo;
    v_log_dd(u, &hi, &lo);
    const V4 r = _mm256_add_pd(hi, _mm256_add_pd(lo, _mm256_div_pd(err, u)));
    return _mm256_blendv_pd(r, e, _mm256_cmp_pd(e, S4(0x1p-54), _CMP_LT_OQ));
}

SP_ATTR static void softplus_parts_avx2(const double *x, double *e, double *lp, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const V4 ax = _mm256_andnot_pd(S4(-0.0), _mm256_loadu_pd(x + i));
        const int in = _mm256_movemask_pd(_mm256_and_pd(_mm256_cmp_pd(ax, S4(0x1p-54), _CMP_GE_OQ),
                                                        _mm256_cmp_pd(ax, S4(700.0), _CMP_LE_OQ)));
        const V4 ev = v_exp_neg(v_neg(ax));
        _mm256_storeu_pd(e + i, ev);
        _mm256_storeu_pd(lp + i, v_log1p_unit(ev));
        if (in != 15)
            for (int j = 0; j < 4; j++)
                if (!(in >> j & 1))
                    softplus_parts_scalar(x + i + j, e + i + j, lp + i + j, 1);
    }
    softplus_parts_scalar(x + i, e + i, lp + i, n - i);
}

void par_pmath_softplus_parts(const double *x, double *e, double *lp, int64_t n)
{
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        softplus_parts_avx2(x, e, lp, n);
    else
        softplus_parts_scalar(x, e, lp, n);
}

/* cos(x) for x in [2^-27, 2pi]: reduce_pio2, both kernels, the quadrant's pick */
SP_ATTR static V4 v_cos_small(V4 x)
{
    const V4 t = _mm256_add_pd(_mm256_mul_pd(x, S4(INV_PIO2)), S4(SHIFTER));
    const V4 nd = _mm256_sub_pd(t, S4(SHIFTER)), nnd = v_neg(nd);
    const V4 r1 = _mm256_fmadd_pd(nnd, S4(PIO2_1), x);
    const V4 p = _mm256_mul_pd(nd, S4(PIO2_2)), pe = _mm256_fmadd_pd(nd, S4(PIO2_2), v_neg(p));
    V4 r2, e2;
    v_two_sum(r1, v_neg(p), &r2, &e2);
    const V4 l = _mm256_sub_pd(_mm256_sub_pd(e2, pe), _mm256_mul_pd(nd, S4(PIO2_3)));
    const V4 h = _mm256_add_pd(r2, l), hl = _mm256_sub_pd(l, _mm256_sub_pd(h, r2));
    const V4 z = _mm256_mul_pd(h, h);
    const V4 corr = _mm256_fmadd_pd(_mm256_mul_pd(S4(-0.5), z), hl, hl);
    const V4 sn = _mm256_add_pd(h, _mm256_fmadd_pd(_mm256_mul_pd(h, z), v_horner(sin_c, NCOEF(sin_c), z), corr));
    const V4 hz = _mm256_mul_pd(S4(0.5), z), w = _mm256_sub_pd(S4(1.0), hz);
    const V4 tail = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(S4(1.0), w), hz),
                                  _mm256_fmadd_pd(_mm256_mul_pd(z, z), v_horner(cos_c, NCOEF(cos_c), z),
                                                  _mm256_mul_pd(v_neg(h), hl)));
    const V4 cs = _mm256_add_pd(w, tail);
    /* q = n mod 4: t = SHIFTER + n exactly, so n is its bits less SHIFTER's */
    const __m256i q = _mm256_and_si256(_mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(S4(SHIFTER))),
                                       _mm256_set1_epi64x(3));
    V4 c = cs;
    c = _mm256_blendv_pd(c, v_neg(sn), _mm256_castsi256_pd(_mm256_cmpeq_epi64(q, _mm256_set1_epi64x(1))));
    c = _mm256_blendv_pd(c, v_neg(cs), _mm256_castsi256_pd(_mm256_cmpeq_epi64(q, _mm256_set1_epi64x(2))));
    return _mm256_blendv_pd(c, sn, _mm256_castsi256_pd(_mm256_cmpeq_epi64(q, _mm256_set1_epi64x(3))));
}

/* Lanes with u1 in [2^-1022, 1] and 2pi u2 in [2^-27, 2pi] (every draw of
 * rng.c's u53 but u2 < 2^-29.6); other lanes: the scalar calls. */
SP_ATTR static void box_muller_avx2(const double *u1, const double *u2, double *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const V4 a = _mm256_loadu_pd(u1 + i), x = _mm256_mul_pd(S4(BM_TWO_PI), _mm256_loadu_pd(u2 + i));
        const V4 ok = _mm256_and_pd(_mm256_and_pd(_mm256_cmp_pd(a, S4(0x1p-1022), _CMP_GE_OQ),
                                                  _mm256_cmp_pd(a, S4(1.0), _CMP_LE_OQ)),
                                    _mm256_and_pd(_mm256_cmp_pd(x, S4(0x1p-27), _CMP_GE_OQ),
                                                  _mm256_cmp_pd(x, S4(BM_TWO_PI), _CMP_LE_OQ)));
        const int in = _mm256_movemask_pd(ok);
        V4 hi, lo;
        v_log_dd_normal(a, &hi, &lo);
        _mm256_storeu_pd(out + i, _mm256_mul_pd(_mm256_sqrt_pd(_mm256_mul_pd(S4(-2.0), hi)), v_cos_small(x)));
        if (in != 15)
            for (int j = 0; j < 4; j++)
                if (!(in >> j & 1))
                    box_muller_scalar(u1 + i + j, u2 + i + j, out + i + j, 1);
    }
    box_muller_scalar(u1 + i, u2 + i, out + i, n - i);
}

void par_pmath_box_muller(const double *u1, const double *u2, double *out, int64_t n)
{
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        box_muller_avx2(u1, u2, out, n);
    else
        box_muller_scalar(u1, u2, out, n);
}
#else
void par_pmath_softplus_parts(const double *x, double *e, double *lp, int64_t n)
{
    softplus_parts_scalar(x, e, lp, n);
}

void par_pmath_box_muller(const double *u1, const double *u2, double *out, int64_t n)
{
    box_muller_scalar(u1, u2, out, n);
}
#endif
