/* Kernels: parity's own GEMM (kernels/gemm.h), f64 and f32.
 *
 * Every dispatch path this CPU runs (kernels/gemm_path.h: c, avx2, avx512)
 * must give, bit for bit, the definition's fused multiply-add chain
 * (par_gemm_reference): on every tail of M, N and K from 1 to 40, on large
 * shapes that cross the K, M and N blocks, with alpha, beta, both transposes
 * and strided operands; and a row or column computed alone must equal the
 * same one inside a batch. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/gemm_path.h"

/* both builds of kernels/gemm.h (a templated header is included once) */
void par_gemm_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const double *A, int64_t lda,
                  const double *B, int64_t ldb, double beta, double *C, int64_t ldc);
void par_gemm_reference_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const double *A,
                            int64_t lda, const double *B, int64_t ldb, double beta, double *C, int64_t ldc);
void par_gemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void par_gemm_reference_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                            int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
int par_gemm_tile_f64(int64_t M, int64_t N, int *mr, int *nr);
int par_gemm_tile_f32(int64_t M, int64_t N, int *mr, int *nr);
int par_gemm_tiles_f64(void);
int par_gemm_tiles_f32(void);

/* values over many binades (so that any other summation order or rounding
 * shows in the last bits) */
static double value(const char *name, uint64_t i)
{
    par_philox_key key = par_rng_key(99, name);
    double u = par_rng_normal(key, i, 0);
    int e = (int)par_rng_below(key, i, 1, 13) - 6;
    return ldexp(u, e);
}

/* One GEMM shape, its operands and the reference output. */
typedef struct {
    int ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    double alpha, beta;
} shape;

#define DEFINE_CHECK(T, SUF)                                                                          \
    /* count of elements of par_gemm that differ from the reference (0 = bitwise equal) */             \
    static int64_t check_##SUF(const shape *s, uint64_t seed)                                          \
    {                                                                                                  \
        int64_t na = (s->ta ? s->K : s->M) * s->lda, nb = (s->tb ? s->N : s->K) * s->ldb,             \
                nc = s->M * s->ldc;                                                                    \
        T *A = malloc(sizeof(T) * (size_t)na), *B = malloc(sizeof(T) * (size_t)nb);                    \
        T *C = malloc(sizeof(T) * (size_t)nc), *R = malloc(sizeof(T) * (size_t)nc);                    \
        cr_assert(A && B && C && R);                                                                   \
        for (int64_t i = 0; i < na; i++)                                                               \
            A[i] = (T)value("A", seed + (uint64_t)i);                                                  \
        for (int64_t i = 0; i < nb; i++)                                                               \
            B[i] = (T)value("B", seed + (uint64_t)i);                                                  \
        for (int64_t i = 0; i < nc; i++)                                                               \
            C[i] = R[i] = (T)value("C", seed + (uint64_t)i);                                           \
        par_gemm_##SUF(s->ta, s->tb, s->M, s->N, s->K, (T)s->alpha, A, s->lda, B, s->ldb, (T)s->beta, C, \
                       s->ldc);                                                                        \
        par_gemm_reference_##SUF(s->ta, s->tb, s->M, s->N, s->K, (T)s->alpha, A, s->lda, B, s->ldb,    \
                                 (T)s->beta, R, s->ldc);                                               \
        int64_t bad = 0;                                                                               \
        for (int64_t i = 0; i < nc; i++)                                                               \
            bad += memcmp(&C[i], &R[i], sizeof(T)) != 0;                                               \
        free(A), free(B), free(C), free(R);                                                            \
        return bad;                                                                                    \
    }
DEFINE_CHECK(double, f64)
DEFINE_CHECK(float, f32)

static shape mk(int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t pad, double alpha, double beta)
{
    shape s = {ta, tb, M, N, K, (ta ? M : K) + pad, (tb ? K : N) + pad, N + pad, alpha, beta};
    return s;
}

/* every path this CPU runs, forced in turn; returns how many */
static int paths(par_gemm_path_id out[PAR_GEMM_PATH_COUNT])
{
    int n = 0;
    for (int p = 0; p < PAR_GEMM_PATH_COUNT; p++)
        if (par_gemm_path_available((par_gemm_path_id)p))
            out[n++] = (par_gemm_path_id)p;
    return n;
}

static void expect_equal(const shape *s, uint64_t seed, par_gemm_path_id p, int64_t *checked)
{
    int64_t b64 = check_f64(s, seed), b32 = check_f32(s, seed);
    cr_expect(b64 == 0 && b32 == 0,
              "path %s, ta %d tb %d, M %lld N %lld K %lld, alpha %g beta %g: %lld f64 / %lld f32 elements differ "
              "from the fma chain",
              par_gemm_path_name(p), s->ta, s->tb, (long long)s->M, (long long)s->N, (long long)s->K, s->alpha,
              s->beta, (long long)b64, (long long)b32);
    ++*checked;
}

Test(gemm, every_tail_every_path_equals_the_fma_chain)
{
    par_gemm_path_id ps[PAR_GEMM_PATH_COUNT];
    int np = paths(ps);
    int64_t checked = 0;
    for (int ip = 0; ip < np; ip++) {
        cr_assert_eq(par_gemm_path_set(ps[ip]), PAR_OK);
        int used64[8] = {0}, used32[8] = {0}, mr, nr;
        for (int64_t M = 1; M <= 40; M++)
            for (int64_t N = 1; N <= 40; N++) {
                used64[par_gemm_tile_f64(M, N, &mr, &nr)] = 1;
                used32[par_gemm_tile_f32(M, N, &mr, &nr)] = 1;
                int64_t K = (M * 7 + N * 13) % 40 + 1; /* every K 1..40 over the (M, N) grid */
                int t = (int)((M + 3 * N) % 4);
                shape s = mk(t & 1, t >> 1, M, N, K, (M + N) % 3, (M + N) % 5 ? 1.0 : -1.25, (M * N) % 3 ? 0.0 : 0.75);
                expect_equal(&s, (uint64_t)(M * 1000 + N), ps[ip], &checked);
            }
        /* every micro-tile of the path took part in the grid above */
        for (int i = 0; i < par_gemm_tiles_f64(); i++)
            cr_expect(used64[i], "path %s: f64 tile %d never picked on the 40 x 40 grid", par_gemm_path_name(ps[ip]), i);
        for (int i = 0; i < par_gemm_tiles_f32(); i++)
            cr_expect(used32[i], "path %s: f32 tile %d never picked on the 40 x 40 grid", par_gemm_path_name(ps[ip]), i);
        for (int64_t K = 1; K <= 40; K++)
            for (int t = 0; t < 4; t++) {
                shape s = mk(t & 1, t >> 1, 13, 17, K, 1, 0.5, 1.0);
                expect_equal(&s, (uint64_t)K, ps[ip], &checked);
            }
    }
    cr_log_info("%d paths (this CPU), %lld shapes each in f64 and f32: all bitwise the fma chain", np,
                (long long)checked / (np ? np : 1));
}

Test(gemm, large_shapes_cross_every_block)
{
    /* K > KC with beta != 0 (the scratch path), M > MC, N > NC (2048), M = 1 */
    const shape ss[] = {
        mk(0, 1, 130, 257, 1100, 3, 1.0, 0.75), mk(1, 0, 61, 300, 777, 0, -1.5, 1.0),
        mk(0, 0, 250, 2100, 70, 1, 1.0, 0.0),   mk(1, 1, 1, 3000, 513, 0, 2.0, 0.0),
        mk(0, 1, 300, 5, 2049, 2, 1.0, 1.0),    mk(1, 1, 129, 33, 600, 5, 1.0, 0.0),
    };
    par_gemm_path_id ps[PAR_GEMM_PATH_COUNT];
    int np = paths(ps);
    int64_t checked = 0;
    for (int ip = 0; ip < np; ip++) {
        cr_assert_eq(par_gemm_path_set(ps[ip]), PAR_OK);
        for (size_t i = 0; i < sizeof ss / sizeof *ss; i++)
            expect_equal(&ss[i], 7 + i, ps[ip], &checked);
    }
}

void par_gemm_part_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, const double *A, int64_t lda,
                       const double *B, int64_t ldb, int load, double *P, int64_t ldp);
void par_gemm_finish_f64(int64_t M, int64_t N, double alpha, const double *P, int64_t ldp, double beta, double *C,
                         int64_t ldc);
void par_gemm_part_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                       const float *B, int64_t ldb, int load, float *P, int64_t ldp);
void par_gemm_finish_f32(int64_t M, int64_t N, float alpha, const float *P, int64_t ldp, float beta, float *C,
                         int64_t ldc);

/* par_gemm_part over K cut into np pieces (cuts[0..np]), continued piece after
 * piece, then par_gemm_finish: elements that differ from par_gemm. */
#define DEFINE_CHAIN(T, SUF)                                                                              \
    static int64_t chain_##SUF(const shape *s, const int64_t *cuts, int np, uint64_t seed)                 \
    {                                                                                                      \
        int64_t na = (s->ta ? s->K : s->M) * s->lda, nb = (s->tb ? s->N : s->K) * s->ldb,                 \
                nc = s->M * s->ldc;                                                                        \
        T *A = malloc(sizeof(T) * (size_t)na), *B = malloc(sizeof(T) * (size_t)nb);                        \
        T *C = malloc(sizeof(T) * (size_t)nc), *R = malloc(sizeof(T) * (size_t)nc);                        \
        T *P = malloc(sizeof(T) * (size_t)(s->M * s->N));                                                  \
        cr_assert(A && B && C && R && P);                                                                  \
        for (int64_t i = 0; i < na; i++)                                                                   \
            A[i] = (T)value("A", seed + (uint64_t)i);                                                      \
        for (int64_t i = 0; i < nb; i++)                                                                   \
            B[i] = (T)value("B", seed + (uint64_t)i);                                                      \
        for (int64_t i = 0; i < nc; i++)                                                                   \
            C[i] = R[i] = (T)value("C", seed + (uint64_t)i);                                               \
        for (int p = 0; p < np; p++) {                                                                     \
            const int64_t k0 = cuts[p], kn = cuts[p + 1] - k0;                                             \
            const T *Ak = s->ta ? A + k0 * s->lda : A + k0, *Bk = s->tb ? B + k0 : B + k0 * s->ldb;      \
            par_gemm_part_##SUF(s->ta, s->tb, s->M, s->N, kn, Ak, s->lda, Bk, s->ldb, p > 0, P, s->N);     \
        }                                                                                                  \
        par_gemm_finish_##SUF(s->M, s->N, (T)s->alpha, P, s->N, (T)s->beta, C, s->ldc);                    \
        par_gemm_##SUF(s->ta, s->tb, s->M, s->N, s->K, (T)s->alpha, A, s->lda, B, s->ldb, (T)s->beta, R,   \
                       s->ldc);                                                                            \
        int64_t bad = 0;                                                                                   \
        for (int64_t i = 0; i < nc; i++)                                                                   \
            bad += memcmp(&C[i], &R[i], sizeof(T)) != 0;                                                   \
        free(A), free(B), free(C), free(R), free(P);                                                       \
        return bad;                                                                                        \
    }
DEFINE_CHAIN(double, f64)
DEFINE_CHAIN(float, f32)

Test(gemm, a_sum_split_over_k_and_continued_equals_the_whole)
{
    /* K cut as a tensor-parallel group would (equal shards) and unevenly,
     * pieces of one k, pieces crossing KC; every path, both transposes */
    const shape ss[] = {mk(0, 1, 37, 29, 96, 1, 1.0, 0.0), mk(0, 0, 33, 41, 96, 0, 1.0, 1.0),
                        mk(1, 0, 17, 70, 1300, 2, -0.75, 0.5), mk(1, 1, 5, 9, 7, 0, 2.0, 1.0)};
    const int64_t cuts[][6] = {{0, 48, 96}, {0, 24, 48, 72, 96}, {0, 1, 700, 1299, 1300}, {0, 1, 2, 7}};
    const int npieces[] = {2, 4, 4, 3};
    par_gemm_path_id ps[PAR_GEMM_PATH_COUNT];
    int np = paths(ps);
    int64_t checked = 0;
    for (int ip = 0; ip < np; ip++) {
        cr_assert_eq(par_gemm_path_set(ps[ip]), PAR_OK);
        for (size_t i = 0; i < sizeof ss / sizeof *ss; i++) {
            int64_t b64 = chain_f64(&ss[i], cuts[i], npieces[i], 11 + i), b32 = chain_f32(&ss[i], cuts[i], npieces[i], 11 + i);
            cr_expect(b64 == 0 && b32 == 0, "path %s, shape %zu: %lld f64 / %lld f32 elements of the chained sum differ",
                      par_gemm_path_name(ps[ip]), i, (long long)b64, (long long)b32);
            checked++;
        }
    }
    cr_assert_gt(checked, 0);
}
