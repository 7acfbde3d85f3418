/* core/racc.h - reproducible accumulation: sums of doubles whose bits do not
 * depend on the order of the terms, on how they are split between partial
 * sums, or on the order in which partial sums are merged.  It is what the
 * bitwise mode (docs/bitwise.md) builds every cross-token and cross-rank
 * gradient sum on.
 *
 * The method is binned summation in the style of Demmel and Nguyen
 * (ReproBLAS), here with exact integer bins: every element keeps an exponent
 * e (a multiple of PAR_RACC_W) and three signed 64-bit folds s0, s1, s2.  A
 * term x is cut, by a pure function of x and e, into
 *     x0 = rne(x / 2^e)                  (|x0| <  2^(W-1))
 *     x1 = rne(r0 / 2^(e-W)),   r0 = x - x0 2^e      (|x1| <= 2^(W-1))
 *     x2 = rne(r1 / 2^(e-2W)),  r1 = r0 - x1 2^(e-W)  (|x2| <= 2^(W-1))
 * (every step exact) and s_k += x_k as integers (exact).  The part of x
 * below 2^(e-2W-1) is dropped; that is the method's only rounding, and it
 * depends on x and e alone.  e is the smallest grid exponent with
 * |x| < 2^(W-1+e) for every term seen: when a larger term arrives, e rises by
 * W steps and the folds shift (s2 = s1, s1 = s0, s0 = 0), which yields
 * exactly the folds the new e would have given every earlier term (each
 * earlier x0 is then 0, its x1 the old x0, its x2 the old x1).
 * So the state, and the value it rounds to, is a function of the multiset of
 * terms: any order, any grouping, any merge tree give the same bits.
 *
 * Range and precision: W = 36; about 2^27 terms per element before a fold
 * could overflow; a result is exact to 2^(e-2W-1): at least 2^-72 of the
 * largest term's magnitude (2^-107 at best), then rounded once to double.  Non-finite terms make the element NaN.  Terms below
 * 2^(PAR_RACC_EMIN-W-1) are dropped (a deterministic flush), terms of
 * magnitude 2^(PAR_RACC_EMAX+W-1) and above count as non-finite.
 *
 * The registry maps a buffer of doubles or floats (a model's flat gradient
 * buffer) to its accumulator, so that kernels that receive a pointer into the
 * buffer deposit into the accumulator instead of adding to the buffer, and
 * the reduction module merges accumulators where it would have summed the
 * buffer (parallel/reduce/reduce_sum.c).  Lookups are by address and safe
 * from any thread or fiber. */
#ifndef PAR_CORE_RACC_H
#define PAR_CORE_RACC_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define PAR_RACC_W 36
#define PAR_RACC_EMIN (-26 * PAR_RACC_W)  /* lowest grid exponent (-936)      */
#define PAR_RACC_EMAX (27 * PAR_RACC_W)   /* highest (972): |x| >= 2^1007 is non-finite here */
#define PAR_RACC_EMPTY INT32_MIN          /* no nonzero term yet              */
#define PAR_RACC_NAN INT32_MAX            /* a non-finite term was deposited  */

typedef struct {
    size_t n;
    int32_t *e;  /* [n] grid exponent, PAR_RACC_EMPTY or PAR_RACC_NAN */
    int64_t *s0; /* [n] high fold */
    int64_t *s1; /* [n] middle fold */
    int64_t *s2; /* [n] low fold  */
} par_racc;

/* Allocates n empty elements (n may be 0).  PAR_ENOMEM names the size. */
par_status par_racc_init(par_racc *a, size_t n);
void par_racc_free(par_racc *a);
/* Empties elements [i0, i0 + n). */
void par_racc_zero(par_racc *a, size_t i0, size_t n);

/* Slow path of par_racc_put: a first term, a larger one (e rises) or a
 * non-finite one. */
void par_racc__put_slow(par_racc *a, size_t i, double x);

/* 2^k for -1022 <= k <= 1023 (built from the bits: exact). */
static inline double par_racc__pow2(int k)
{
    union {
        uint64_t u;
        double d;
    } v = {(uint64_t)(k + 1023) << 52};
    return v.d;
}

/* Element i += x (exact in the sense above). */
static inline void par_racc_put(par_racc *a, size_t i, double x)
{
    const int32_t e = a->e[i];
    if (x == 0.0 || e == PAR_RACC_NAN)
        return;
    if (e == PAR_RACC_EMPTY || !(fabs(x) < par_racc__pow2(PAR_RACC_W - 1 + e))) {
        par_racc__put_slow(a, i, x);
        return;
    }
    const double q0 = rint(x * par_racc__pow2(-e));
    const double r0 = x - q0 * par_racc__pow2(e);
    const double q1 = rint(r0 * par_racc__pow2(PAR_RACC_W - e));
    const double r1 = r0 - q1 * par_racc__pow2(e - PAR_RACC_W);
    a->s0[i] += (int64_t)q0;
    a->s1[i] += (int64_t)q1;
    a->s2[i] += (int64_t)rint(r1 * par_racc__pow2(2 * PAR_RACC_W - e));
}

/* The value of element i rounded to double: the folds carried into their
 * unique form (s1, s2 in [0, 2^W)), the integer s0 2^2W + s1 2^W + s2
 * rounded once, then scaled by 2^(e-2W). */
double par_racc_value(const par_racc *a, size_t i);

/* Moves element i to grid exponent e (>= its own; the folds shift as a
 * larger term would move them).  e must be a grid exponent. */
void par_racc_align(par_racc *a, size_t i, int32_t e);

/* dst's elements [di, di + n) = src's [si, si + n) (the state, not a value). */
void par_racc_copy(par_racc *dst, size_t di, const par_racc *src, size_t si, size_t n);

/* dst += src element-wise over [i0, i0 + n) of both (a merge: exact, order
 * free). */
void par_racc_merge(par_racc *dst, const par_racc *src, size_t i0, size_t n);
/* dst's [di, di + n) += src's [si, si + n) (the same merge at other places). */
void par_racc_merge_at(par_racc *dst, size_t di, const par_racc *src, size_t si, size_t n);

/* ---- the registry ------------------------------------------------------ */

/* Buffer [base, base + n elements of elsize bytes) is backed by a (whose n
 * must be >= n).  elsize 8 (double) or 4 (float).  PAR_EINVAL on overlap
 * with a registered buffer; PAR_ENOMEM when the table is full. */
par_status par_racc_register(void *base, size_t n, size_t elsize, par_racc *a);
/* Removes base's entry (no-op when absent). */
void par_racc_unregister(const void *base);

/* A view of a registered buffer: the accumulator and the element index of
 * the looked-up pointer. */
typedef struct {
    par_racc *acc; /* NULL: the pointer is not in a registered buffer */
    size_t at;     /* element index of the pointer within acc          */
} par_racc_view;

/* The accumulator behind [p, p + n elements), or {NULL} when no registered
 * buffer holds p (the common case outside the bitwise mode: one load).  A
 * range that starts inside a buffer but runs past its end is an internal
 * error: acc stays NULL and the caller's plain path runs. */
par_racc_view par_racc_lookup(const void *p, size_t n);
/* How many buffers are registered (0 outside the bitwise mode). */
int par_racc_registered(void);

#endif
