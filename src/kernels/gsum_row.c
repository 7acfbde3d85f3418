/* kernels/gsum_row.c - a row of one token's weight-gradient terms into an
 * accumulator (kernels/gsum_row.h), on the portable path or four elements
 * per AVX2 vector or eight per AVX-512 vector, with the same operations per
 * element. */
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
#define ROW_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) /* an immediate: a macro for clang */

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
    const __m256d q0 = _mm256_round_pd(_mm256_mul_pd(t, pow2_lanes(_mm256_sub_epi64(_mm256_setzero_si256(), e))), ROW_RNE);
    const __m256d r0 = _mm256_sub_pd(t, _mm256_mul_pd(q0, pow2_lanes(e)));
    const __m256d q1 = _mm256_round_pd(_mm256_mul_pd(r0, pow2_lanes(_mm256_sub_epi64(w, e))), ROW_RNE);
    const __m256d r1 = _mm256_sub_pd(r0, _mm256_mul_pd(q1, pow2_lanes(_mm256_sub_epi64(e, w))));
    const __m256d q2 = _mm256_round_pd(_mm256_mul_pd(r1, pow2_lanes(_mm256_sub_epi64(_mm256_add_epi64(w, w), e))), ROW_RNE);
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

/* ---- AVX-512F: eight elements per vector, put4's operations */
#define ROW512_ATTR __attribute__((target("avx512f")))

ROW512_ATTR static inline __m512d pow2_lanes8(__m512i k)
{
    return _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(k, _mm512_set1_epi64(1023)), 52));
}

ROW512_ATTR static inline __m512i to_i64_8(__m512d q)
{
    const __m512d m = _mm512_set1_pd(6755399441055744.0); /* 2^52 + 2^51 */
    return _mm512_sub_epi64(_mm512_castpd_si512(_mm512_add_pd(q, m)), _mm512_castpd_si512(m));
}

ROW512_ATTR static inline void add_i64_8(int64_t *s, __m512i v)
{
    _mm512_storeu_si512(s, _mm512_add_epi64(_mm512_loadu_si512(s), v));
}

ROW512_ATTR static inline __m512d round8(__m512d x)
{
    return _mm512_roundscale_pd(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* put4 for elements i..i+7 */
ROW512_ATTR static inline int put8(par_racc *a, size_t i, __m512d t)
{
    const __m256i e32 = _mm256_loadu_si256((const __m256i *)(a->e + i));
    const __m512i e = _mm512_cvtepi32_epi64(e32), w = _mm512_set1_epi64(PAR_RACC_W);
    const __mmask8 set = _mm512_cmpgt_epi64_mask(e, _mm512_set1_epi64(PAR_RACC_EMIN - 1)) &
                         _mm512_cmplt_epi64_mask(e, _mm512_set1_epi64(PAR_RACC_EMAX + 1));
    if (set != 0xff)
        return 0;
    const __m512d mag = _mm512_abs_pd(t);
    const __m512d bound = pow2_lanes8(_mm512_add_epi64(e, _mm512_set1_epi64(PAR_RACC_W - 1)));
    if (_mm512_cmp_pd_mask(mag, bound, _CMP_LT_OQ) != 0xff)
        return 0;
    const __m512d q0 = round8(_mm512_mul_pd(t, pow2_lanes8(_mm512_sub_epi64(_mm512_setzero_si512(), e))));
    const __m512d r0 = _mm512_sub_pd(t, _mm512_mul_pd(q0, pow2_lanes8(e)));
    const __m512d q1 = round8(_mm512_mul_pd(r0, pow2_lanes8(_mm512_sub_epi64(w, e))));
    const __m512d r1 = _mm512_sub_pd(r0, _mm512_mul_pd(q1, pow2_lanes8(_mm512_sub_epi64(e, w))));
    const __m512d q2 = round8(_mm512_mul_pd(r1, pow2_lanes8(_mm512_sub_epi64(_mm512_add_epi64(w, w), e))));
    add_i64_8(a->s0 + i, to_i64_8(q0));
    add_i64_8(a->s1 + i, to_i64_8(q1));
    add_i64_8(a->s2 + i, to_i64_8(q2));
    return 1;
}

ROW512_ATTR static void row_avx512_f64(par_racc *a, size_t i0, double g, const double *x, size_t n)
{
    const __m512d vg = _mm512_set1_pd(g);
    size_t k = 0;
    for (; k + 8 <= n; k += 8)
        if (!put8(a, i0 + k, _mm512_mul_pd(vg, _mm512_loadu_pd(x + k))))
            row_c_f64(a, i0 + k, g, x + k, 8);
    row_avx2_f64(a, i0 + k, g, x + k, n - k);
}

ROW512_ATTR static void row_avx512_f32(par_racc *a, size_t i0, double g, const float *x, size_t n)
{
    const __m512d vg = _mm512_set1_pd(g);
    size_t k = 0;
    for (; k + 8 <= n; k += 8)
        if (!put8(a, i0 + k, _mm512_mul_pd(vg, _mm512_cvtps_pd(_mm256_loadu_ps(x + k)))))
            row_c_f32(a, i0 + k, g, x + k, 8);
    row_avx2_f32(a, i0 + k, g, x + k, n - k);
}
#else
static void row_avx2_f64(par_racc *a, size_t i0, double g, const double *x, size_t n) { row_c_f64(a, i0, g, x, n); }
static void row_avx2_f32(par_racc *a, size_t i0, double g, const float *x, size_t n) { row_c_f32(a, i0, g, x, n); }
#define row_avx512_f64 row_avx2_f64
#define row_avx512_f32 row_avx2_f32
#endif

/* the rows of each GEMM path (the paths a CPU cannot run are never chosen) */
typedef void (*row_f64_fn)(par_racc *, size_t, double, const double *, size_t);
typedef void (*row_f32_fn)(par_racc *, size_t, double, const float *, size_t);
static const row_f64_fn rows_f64[PAR_GEMM_PATH_COUNT] = {
    [PAR_GEMM_PATH_C] = row_c_f64, [PAR_GEMM_PATH_AVX2] = row_avx2_f64, [PAR_GEMM_PATH_AVX512] = row_avx512_f64};
static const row_f32_fn rows_f32[PAR_GEMM_PATH_COUNT] = {
    [PAR_GEMM_PATH_C] = row_c_f32, [PAR_GEMM_PATH_AVX2] = row_avx2_f32, [PAR_GEMM_PATH_AVX512] = row_avx512_f32};

void par_gsum_row_put_f64(par_racc *a, size_t i0, double g, const double *x, size_t n)
{
    rows_f64[par_gemm_path()](a, i0, g, x, n);
}

void par_gsum_row_put_f32(par_racc *a, size_t i0, double g, const float *x, size_t n)
{
    rows_f32[par_gemm_path()](a, i0, g, x, n);
}
