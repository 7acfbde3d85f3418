/* bench_gemm - GFLOP/s of parity's GEMM against OpenBLAS, side by side.
 *
 * For each shape of an MoE expert's forward/backward at v4-mini's and
 * V4-Pro's widths, and the 1024^3 square, it times in one run:
 *   own    par_gemm (kernels/gemm.c, the path it dispatches to here)
 *   tiled  the GEMM par_gemm was until issue 29: OpenBLAS called on one
 *          [16, 16, K] tile at a time (zero-padded tails), copied here
 *   cblas  a raw cblas_dgemm / cblas_sgemm of the same shape
 * and the ratios own/tiled and own/cblas.  One thread (OpenBLAS's set to 1).
 * Not a test: numbers only.
 *
 *   bench_gemm [rows_per_expert_mini rows_per_expert_pro]   (default 64 128;
 *                                                            0: skip the V4-Pro shapes)
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "kernels/gemm_path.h"

void openblas_set_num_threads(int);
char *openblas_get_corename(void);

/* both builds of kernels/gemm.h (a templated header is included once per unit) */
void par_gemm_f64(int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const double *A, int64_t lda,
                  const double *B, int64_t ldb, double beta, double *C, int64_t ldc);
void par_gemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------- the tiled OpenBLAS path (before) */

#define TB 16
#define DEFINE_TILED(T, SUF, GEMM)                                                                    \
    static void raw_##SUF(int ta, int tb, int64_t M, int64_t N, int64_t K, T alpha, const T *A,          \
                          int64_t lda, const T *B, int64_t ldb, T beta, T *C, int64_t ldc)               \
    {                                                                                                \
        GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M,    \
             (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);                      \
    }                                                                                                \
    /* the tail n < 16 of tile indices from i, zero-padded: [16, K] or, contig, [K, 16] */            \
    static const T *pad_##SUF(const T *p, int64_t ld, int contig, int64_t i, int64_t n, int64_t K,     \
                              T *pad, int64_t *ldo)                                                  \
    {                                                                                                \
        memset(pad, 0, sizeof(T) * (size_t)(TB * K));                                                \
        if (!contig) {                                                                               \
            for (int64_t r = 0; r < n; r++)                                                          \
                memcpy(pad + r * K, p + (i + r) * ld, sizeof(T) * (size_t)K);                        \
            *ldo = K;                                                                                \
        } else {                                                                                     \
            for (int64_t k = 0; k < K; k++)                                                          \
                for (int64_t r = 0; r < n; r++)                                                      \
                    pad[k * TB + r] = p[k * ld + i + r];                                             \
            *ldo = TB;                                                                               \
        }                                                                                            \
        return pad;                                                                                  \
    }                                                                                                \
    static void tiled_##SUF(int ta, int tb, int64_t M, int64_t N, int64_t K, T alpha, const T *A,        \
                            int64_t lda, const T *B, int64_t ldb, T beta, T *C, int64_t ldc)             \
    {                                                                                                \
        int64_t mt = M % TB, nt = N % TB, ldap = lda, ldbp = ldb;                                    \
        T *buf = malloc(sizeof(T) * (size_t)(2 * TB * K + TB * TB)), *c2 = buf;                      \
        const T *Ap = mt ? pad_##SUF(A, lda, ta, M - mt, mt, K, buf + TB * TB, &ldap) : NULL;          \
        const T *Bp = nt ? pad_##SUF(B, ldb, !tb, N - nt, nt, K, buf + TB * TB + TB * K, &ldbp) : NULL; \
        for (int64_t i = 0; i < M; i += TB) {                                                        \
            int64_t rows = M - i < TB ? M - i : TB;                                                  \
            const T *a = rows == TB ? (ta ? A + i : A + i * lda) : Ap;                               \
            for (int64_t j = 0; j < N; j += TB) {                                                    \
                int64_t cols = N - j < TB ? N - j : TB;                                              \
                const T *b = cols == TB ? (tb ? B + j * ldb : B + j) : Bp;                           \
                int64_t la = rows == TB ? lda : ldap, lb = cols == TB ? ldb : ldbp;                  \
                if (rows == TB && cols == TB) {                                                      \
                    raw_##SUF(ta, tb, TB, TB, K, alpha, a, la, b, lb, beta, C + i * ldc + j, ldc);   \
                    continue;                                                                        \
                }                                                                                    \
                memset(c2, 0, sizeof(T) * TB * TB);                                                  \
                for (int64_t r = 0; r < rows; r++)                                                   \
                    memcpy(c2 + r * TB, C + (i + r) * ldc + j, sizeof(T) * (size_t)cols);            \
                raw_##SUF(ta, tb, TB, TB, K, alpha, a, la, b, lb, beta, c2, TB);                     \
                for (int64_t r = 0; r < rows; r++)                                                   \
                    memcpy(C + (i + r) * ldc + j, c2 + r * TB, sizeof(T) * (size_t)cols);            \
            }                                                                                        \
        }                                                                                            \
        free(buf);                                                                                   \
    }
DEFINE_TILED(double, f64, cblas_dgemm)
DEFINE_TILED(float, f32, cblas_sgemm)

/* ---------------------------------------------------------------- timing */

typedef struct {
    const char *what;
    int ta, tb;
    int64_t M, N, K;
} shape;

enum { OWN, TILED, CBLAS, NIMPL };

static void call(int prec, int impl, const shape *s, void *A, void *B, void *C)
{
    int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    if (prec == 64) {
        void (*f)(int, int, int64_t, int64_t, int64_t, double, const double *, int64_t, const double *, int64_t,
                  double, double *, int64_t) = impl == OWN ? par_gemm_f64 : impl == TILED ? tiled_f64 : raw_f64;
        f(s->ta, s->tb, s->M, s->N, s->K, 1.0, A, lda, B, ldb, 0.0, C, s->N);
    } else {
        void (*f)(int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                  float, float *, int64_t) = impl == OWN ? par_gemm_f32 : impl == TILED ? tiled_f32 : raw_f32;
        f(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
    }
}

/* best of 5 batches of calls filling ~0.1 s (at least one call); GFLOP/s.  The
 * implementations take turns batch by batch, so load on the machine hits them alike. */
static void rates(int prec, const shape *s, void *A, void *B, void *C, double gf[NIMPL])
{
    double flops = 2.0 * (double)s->M * (double)s->N * (double)s->K;
    int reps = (int)(1e9 / flops) + 1;
    double best[NIMPL] = {1e30, 1e30, 1e30};
    for (int b = 0; b < 5; b++)
        for (int impl = 0; impl < NIMPL; impl++) {
            double t0 = now();
            for (int r = 0; r < reps; r++)
                call(prec, impl, s, A, B, C);
            double t = (now() - t0) / reps;
            best[impl] = t < best[impl] ? t : best[impl];
        }
    for (int impl = 0; impl < NIMPL; impl++)
        gf[impl] = flops / best[impl] * 1e-9;
}

static void expert_shapes(shape out[6], int64_t n, int64_t d, int64_t inter)
{
    const shape s[6] = {
        {"fwd g,u = x w1^T  [n,d]x[I,d]^T", 0, 1, n, inter, d}, {"fwd y = h w2^T    [n,I]x[d,I]^T", 0, 1, n, d, inter},
        {"bwd dh = dy w2    [n,d]x[d,I]", 0, 0, n, inter, d},   {"bwd dx = dg w1    [n,I]x[I,d]", 0, 0, n, d, inter},
        {"bwd dw1 = dg^T x  [n,I]^Tx[n,d]", 1, 0, inter, d, n}, {"bwd dw2 = dy^T h  [n,d]^Tx[n,I]", 1, 0, d, inter, n},
    };
    memcpy(out, s, sizeof s);
}

static void *buf(size_t n)
{
    void *p = par_malloc(n, PAR_TAG_MISC);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    int64_t n_mini = argc > 1 ? atoll(argv[1]) : 64, n_pro = argc > 2 ? atoll(argv[2]) : 128;
    openblas_set_num_threads(1);
    shape shapes[13];
    expert_shapes(shapes, n_mini, 64, 16);      /* v4-mini: dim 64, moe_inter_dim 16 */
    expert_shapes(shapes + 6, n_pro, 7168, 3072); /* V4-Pro: dim 7168, moe_inter_dim 3072 */
    shapes[12] = (shape){"square 1024^3", 0, 0, 1024, 1024, 1024};
    size_t cap = 1024 * 1024;
    for (int i = 0; i < 13; i++) {
        if (i >= 6 && i < 12 && n_pro <= 0)
            continue;
        size_t m = (size_t)(shapes[i].M > shapes[i].N ? shapes[i].M : shapes[i].N);
        cap = m * (size_t)shapes[i].K > cap ? m * (size_t)shapes[i].K : cap;
    }
    double *A = buf(cap * 8), *B = buf(cap * 8), *C = buf(cap * 8);
    float *Af = buf(cap * 4), *Bf = buf(cap * 4), *Cf = buf(cap * 4);
    for (size_t i = 0; i < cap; i++) {
        Af[i] = (float)(A[i] = (double)(i % 17) * 0.01);
        Bf[i] = (float)(B[i] = (double)(i % 13) * 0.02);
    }
    printf("own GEMM path %s; OpenBLAS core %s; 1 thread; rows per expert %lld (v4-mini), %lld (V4-Pro)\n\n",
           par_gemm_path_name(par_gemm_path()), openblas_get_corename(), (long long)n_mini, (long long)n_pro);
    printf("%-8s %-32s | %-28s %-13s | %-28s %-13s\n", "", "", "f64 GF/s own tiled cblas", "own/tiled cblas",
           "f32 GF/s own tiled cblas", "own/tiled cblas");
    for (int i = 0; i < 13; i++) {
        const shape *s = &shapes[i];
        if (i >= 6 && i < 12 && n_pro <= 0)
            continue;
        double g64[NIMPL], g32[NIMPL];
        rates(64, s, A, B, C, g64);
        rates(32, s, Af, Bf, Cf, g32);
        printf("%-8s %-32s | %8.2f %8.2f %8.2f   %5.0f%% %5.0f%% | %8.2f %8.2f %8.2f   %5.0f%% %5.0f%%\n",
               i < 6 ? "v4-mini" : i < 12 ? "V4-Pro" : "", s->what, g64[OWN], g64[TILED], g64[CBLAS],
               100 * g64[OWN] / g64[TILED], 100 * g64[OWN] / g64[CBLAS], g32[OWN], g32[TILED], g32[CBLAS],
               100 * g32[OWN] / g32[TILED], 100 * g32[OWN] / g32[CBLAS]);
        fflush(stdout);
    }
    par_free(A), par_free(B), par_free(C), par_free(Af), par_free(Bf), par_free(Cf);
    return 0;
}
