/* kernels/gsum_row.c - a row of one token's weight-gradient terms into an
 * accumulator (kernels/gsum_row.h), on the portable path or four elements
 * per AVX2 vector with the same operations per element. */
#include "kernels/gsum_row.h"

#include "kernels/gemm_path.h"

static void row_c_f64(par_racc *a, size_t i0, double g, const double *x, size_t n)
{
    for (size_t k = 0; k < n; k++)
        par_racc_put(a, i0 + k, g * x[k]);
}

static void row_c_f32(par_racc *a, size_t i0, double g, const float *x, size_t n)
{
    for (size_t k = 0; k < n; k++)
        par_racc_put(a, i0 + k, g * (double)x[k]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ROW_ATTR __attribute__((target("avx2")))

/* 2^k per lane (k in [-1022, 1023]: built from the bits, exact) */
ROW_ATTR static inline __m256d pow2_lanes(__m256i k)
{
    return _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(k, _mm256_set1_epi64x(1023)), 52));
}

/* an integer-valued double with |q| < 2^51 as an int64 (exact) */
ROW_ATTR static inline __m256i to_i64(__m256d q)
{
    const __m256d m = _mm256_set1_pd(6755399441055744.0); /* 2^52 + 2^51 */
    return _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(q, m)), _mm256_castpd_si256(m));
}

ROW_ATTR static inline void add_i64(int64_t *s, __m256i v)
{
    __m256i *p = (__m256i *)s;
    _mm256_storeu_si256(p, _mm256_add_epi64(_mm256_loadu_si256(p), v));
}

/* Terms t into elements i..i+3 when every lane is on par_racc_put's fast
 * path (a grid exponent set and |t| below its bound; a zero term then adds
 * zeros).  Returns 0, changing nothing, otherwise. */
ROW_ATTR static inline int put4(par_racc *a, size_t i, __m256d t)
{
    const __m128i e32 = _mm_loadu_si128((const __m128i *)(a->e + i));
    const __m128i set = _mm_and_si128(_mm_cmpgt_epi32(e32, _mm_set1_epi32(PAR_RACC_EMIN - 1)),
                                      _mm_cmplt_epi32(e32, _mm_set1_epi32(PAR_RACC_EMAX + 1)));
    if (_mm_movemask_epi8(set) != 0xffff)
        return 0;
    const __m256i e = _mm256_cvtepi32_epi64(e32), w = _mm256_set1_epi64x(PAR_RACC_W);
    const __m256d mag = _mm256_andnot_pd(_mm256_set1_pd(-0.0), t);
    const __m256d bound = pow2_lanes(_mm256_add_epi64(e, _mm256_set1_epi64x(PAR_RACC_W - 1)));
    if (_mm256_movemask_pd(_mm256_cmp_pd(mag, bound, _CMP_LT_OQ)) != 0xf)
        return 0;
    const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256d q0 = _mm256_round_pd(_mm256_mul_pd(t, pow2_lanes(_mm256_sub_epi64(_mm256_setzero_si256(), e))), rne);
    const __m256d r0 = _mm256_sub_pd(t, _mm256_mul_pd(q0, pow2_lanes(e)));
    const __m256d q1 = _mm256_round_pd(_mm256_mul_pd(r0, pow2_lanes(_mm256_sub_epi64(w, e))), rne);
    const __m256d r1 = _mm256_sub_pd(r0, _mm256_mul_pd(q1, pow2_lanes(_mm256_sub_epi64(e, w))));
    const __m256d q2 = _mm256_round_pd(_mm256_mul_pd(r1, pow2_lanes(_mm256_sub_epi64(_mm256_add_epi64(w, w), e))), rne);
    add_i64(a->s0 + i, to_i64(q0));
    add_i64(a->s1 + i, to_i64(q1));
    add_i64(a->s2 + i, to_i64(q2));
    return 1;
}

ROW_ATTR static void row_avx2_f64(par_racc *a, size_t i0, double g, const double *x, size_t n)
{
    const __m256d vg = _mm256_set1_pd(g);
    size_t k = 0;
    for (; k + 4 <= n; k += 4)
        if (!put4(a, i0 + k, _mm256_mul_pd(vg, _mm256_loadu_pd(x + k))))
            row_c_f64(a, i0 + k, g, x + k, 4);
    row_c_f64(a, i0 + k, g, x + k, n - k);
}

ROW_ATTR static void row_avx2_f32(par_racc *a, size_t i0, double g, const float *x, size_t n)
{
    const __m256d vg = _mm256_set1_pd(g);
    size_t k = 0;
    for (; k + 4 <= n; k += 4)
        if (!put4(a, i0 + k, _mm256_mul_pd(vg, _mm256_cvtps_pd(_mm_loadu_ps(x + k)))))
            row_c_f32(a, i0 + k, g, x + k, 4);
    row_c_f32(a, i0 + k, g, x + k, n - k);
}

static int vector_path(void)
{
    return par_gemm_path() != PAR_GEMM_PATH_C;
}
#else
static void row_avx2_f64(par_racc *a, size_t i0, double g, const double *x, size_t n) { row_c_f64(a, i0, g, x, n); }
static void row_avx2_f32(par_racc *a, size_t i0, double g, const float *x, size_t n) { row_c_f32(a, i0, g, x, n); }
static int vector_path(void) { return 0; }
#endif

void par_gsum_row_put_f64(par_racc *a, size_t i0, double g, const double *x, size_t n)
{
    (vector_path() ? row_avx2_f64 : row_c_f64)(a, i0, g, x, n);
}

void par_gsum_row_put_f32(par_racc *a, size_t i0, double g, const float *x, size_t n)
{
    (vector_path() ? row_avx2_f32 : row_c_f32)(a, i0, g, x, n);
}
