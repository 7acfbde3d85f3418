/* core/pmath.h - elementary functions with a fixed operation sequence.
 *
 * glibc's exp, log, sin, ... differ between its versions and between its FMA
 * and non-FMA variants (chosen at run time by the CPU), so a golden made with
 * them is not portable.  These are parity's own: IEEE double arithmetic and
 * fma() only, no table, no libm call, no reliance on the compiler's
 * contraction (the build passes -ffp-contract=off), so they return the same
 * bits on every machine with IEEE doubles and a correct fma().
 *
 * Accuracy, measured against __float128 (libquadmath) in tests/core/
 * test_pmath.c on random and edge points (docs/kernels.md has the figures);
 * the bound each test asserts is in brackets:
 *   par_pmath_exp    [1 ulp]  x in [-745.2, 709.8]; subnormal results may be
 *                             off by one more in their last place
 *   par_pmath_log    [1 ulp]  x > 0, subnormals included
 *   par_pmath_log1p  [1 ulp]  x > -1
 *   par_pmath_sin/cos[1 ulp]  |x| <= 2^20 (Cody-Waite reduction by pi/2 in
 *                             three parts); beyond, deterministic but less
 *                             accurate
 *   par_pmath_pow    [1 ulp]  x > 0 with |y ln x| < 709 (ln x and the
 *                             product in double-double); x <= 0 handled
 *                             for integer y as C's pow
 * Special values (NaN, +-inf, +-0) follow C's functions.  f32 callers
 * compute in double and round once. */
#ifndef PAR_CORE_PMATH_H
#define PAR_CORE_PMATH_H

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp declare target /* called from device loops (kernels/offload.h) */
#endif
double par_pmath_exp(double x);
double par_pmath_log(double x);
double par_pmath_log1p(double x);
double par_pmath_sin(double x);
double par_pmath_cos(double x);
void par_pmath_sincos(double x, double *s, double *c);
double par_pmath_pow(double x, double y);
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp end declare target
#endif

#include <stdint.h>
/* The pieces of softplus for n arguments (host only): e[i] =
 * par_pmath_exp(-fabs(x[i])) and lp[i] = par_pmath_log1p(e[i]), the same bits
 * as those calls (the same operations in the same order), four lanes at a
 * time on a CPU with AVX2 + FMA; arguments outside |x| in [2^-54, 700] (and
 * NaN) go through the scalar calls.  The MoE gate's scores (kernels/moe.c). */
void par_pmath_softplus_parts(const double *x, double *e, double *lp, int64_t n);
/* Box-Muller for n pairs (host only): out[i] = sqrt(-2 par_pmath_log(u1[i]))
 * * par_pmath_cos(6.283185307179586476925 u2[i]), the bits of those calls
 * (core/rng.c's par_rng_normal), four lanes at a time with AVX2 + FMA for
 * u1 in [2^-1022, 1] and 2 pi u2 in [2^-27, 2 pi]; other pairs (NaN too) go
 * through the scalar calls.  Parameter init (core/rng.h par_rng_normal_n). */
void par_pmath_box_muller(const double *u1, const double *u2, double *out, int64_t n);

#endif
