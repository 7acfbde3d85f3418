/* kernels/gemm_device.c - the device GEMM of the offload build (par_gemm in
 * GPU mode).  Compiled only with -Doffload=nvptx.
 *
 * C[M,N] = alpha op(A) op(B) + beta C, row-major, as par_gemm.  Each device
 * thread computes one GEMM_TM x GEMM_TN tile of C in registers (loads of A
 * and B are shared by the tile's products); every element is the definition
 * of kernels/gemm.h: acc = fma(a_ik, b_kj, acc) over k in ascending order in
 * the working precision, then alpha * acc (+ beta * C; beta == 0: C is not
 * read), the same operations as the CPU's par_gemm, so the same bits where
 * the device's fma is IEEE's (NVIDIA's is).  The K == 0 / alpha == 0 corner
 * keeps this loop's form.  In the emulation the same loops run on the host.
 * par__gemm_device_batch: nb independent products of one shape at strides
 * sa / sb / sc, in one launch (Muon's Newton-Schulz over a layer's experts,
 * model/optim_gpu.c); each product's bits are those of its own call.
 */
#include <math.h>

#include "core/alloc.h"
#include "core/counters.h"
#include "kernels/offload.h"
#include "kernels/ops.h"

#if PAR_REAL_BITS == 64
#define GEMM_FMA fma
#else
#define GEMM_FMA fmaf
#endif

#define GEMM_TM 4
#define GEMM_TN 4
/* host fallback (emulation): the tile loop runs in parallel from here */
#define GEMM_HOST_PAR_MIN 32768

/* elements spanned by a row-major [rows, cols] operand with leading dim ld */
static size_t extent(int64_t rows, int64_t cols, int64_t ld)
{
    return rows > 0 && cols > 0 ? (size_t)((rows - 1) * ld + cols) : 0;
}

/* par_gemm's counts of one product (core/counters.h: the emulated clock's compute), for the
 * batched and grouped calls, which do not go through par_gemm */
static void count(int64_t M, int64_t N, int64_t K, par_real beta)
{
    const uint64_t k = (uint64_t)(K > 0 ? K : 0);
    par_count_flops(2u * (uint64_t)M * (uint64_t)N * k);
    par_count_bytes(sizeof(par_real) *
                    ((uint64_t)M * k + k * (uint64_t)N + (uint64_t)M * (uint64_t)N * (beta != 0 ? 2u : 1u)));
}

/* One GEMM_TM x GEMM_TN tile of C at (i0, j0): every element acc = fma(a, b, acc)
 * over k ascending, then alpha * acc (+ beta * C). */
PAR_DECLARE_TARGET
static inline void tile(int ta, int tb, int64_t M, int64_t N, int64_t Kp, par_real alpha,
                        const par_real *A, int64_t lda, /* [M, K] or [K, M] (ta) */
                        const par_real *B, int64_t ldb, /* [K, N] or [N, K] (tb) */
                        par_real beta, par_real *C,     /* [M, N] */
                        int64_t ldc, int64_t i0, int64_t j0)
{
    const int ni = M - i0 < GEMM_TM ? (int)(M - i0) : GEMM_TM;
    const int nj = N - j0 < GEMM_TN ? (int)(N - j0) : GEMM_TN;
    par_real acc[GEMM_TM][GEMM_TN];
    for (int r = 0; r < GEMM_TM; r++)
        for (int c = 0; c < GEMM_TN; c++)
            acc[r][c] = 0;
    for (int64_t k = 0; k < Kp; k++) {
        par_real a[GEMM_TM], b[GEMM_TN];
        for (int r = 0; r < GEMM_TM; r++)
            a[r] = r < ni ? (ta ? A[k * lda + i0 + r] : A[(i0 + r) * lda + k]) : 0;
        for (int c = 0; c < GEMM_TN; c++)
            b[c] = c < nj ? (tb ? B[(j0 + c) * ldb + k] : B[k * ldb + j0 + c]) : 0;
        for (int r = 0; r < GEMM_TM; r++)
            for (int c = 0; c < GEMM_TN; c++)
                acc[r][c] = GEMM_FMA(a[r], b[c], acc[r][c]);
    }
    for (int r = 0; r < ni; r++) {
        par_real *cr = C + (i0 + r) * ldc + j0;
        for (int c = 0; c < nj; c++)
            cr[c] = beta == 0 ? alpha * acc[r][c] : alpha * acc[r][c] + beta * cr[c];
    }
}
PAR_END_DECLARE_TARGET

static void batch_run(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha, const par_real *A,
                      int64_t lda, int64_t sa, const par_real *B, int64_t ldb, int64_t sb, par_real beta,
                      par_real *C, int64_t ldc, int64_t sc, int64_t nb);

void PAR_FN(par__gemm_device)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                              const par_real *A, int64_t lda, const par_real *B, int64_t ldb,
                              par_real beta, par_real *C, int64_t ldc)
{
    batch_run(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1); /* par_gemm counted it */
}

void PAR_FN(par__gemm_device_batch)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                                    const par_real *A, int64_t lda, int64_t sa, /* nb x [M, K] */
                                    const par_real *B, int64_t ldb, int64_t sb, /* nb x [K, N] */
                                    par_real beta, par_real *C, int64_t ldc,    /* nb x [M, N] */
                                    int64_t sc, int64_t nb)
{
    for (int64_t q = 0; M > 0 && N > 0 && q < nb; q++)
        count(M, N, K, beta);
    batch_run(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, nb);
}

/* nb products at strides sa / sb / sc, one launch (not counted) */
static void batch_run(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                      const par_real *A, int64_t lda, int64_t sa, /* nb x [M, K] */
                      const par_real *B, int64_t ldb, int64_t sb, /* nb x [K, N] */
                      par_real beta, par_real *C, int64_t ldc,    /* nb x [M, N] */
                      int64_t sc, int64_t nb)
{
    PAR_DEV_BEGIN();
    if (M <= 0 || N <= 0 || nb <= 0)
        return;
    const int64_t Kp = K > 0 ? K : 0;
    const size_t ea = ta ? extent(Kp, M, lda) : extent(M, Kp, lda);
    const size_t eb = tb ? extent(N, Kp, ldb) : extent(Kp, N, ldb);
    PAR_DIN(A, (size_t)((nb - 1) * sa) + ea);
    PAR_DIN(B, (size_t)((nb - 1) * sb) + eb);
    if (beta == 0 && ldc == N && (nb == 1 || sc == M * N))
        PAR_DOUT(C, (size_t)(nb * M * N));
    else
        PAR_DINOUT(C, (size_t)((nb - 1) * sc) + extent(M, N, ldc));
    const int64_t mt = (M + GEMM_TM - 1) / GEMM_TM, nt = (N + GEMM_TN - 1) / GEMM_TN;
    PAR_KLOOP_PAR(nb * M * N * Kp >= GEMM_HOST_PAR_MIN, collapse(3) is_device_ptr(A, B, C))
    for (int64_t q = 0; q < nb; q++)
        for (int64_t bi = 0; bi < mt; bi++)
            for (int64_t bj = 0; bj < nt; bj++)
                tile(ta, tb, M, N, Kp, alpha, A + q * sa, lda, B + q * sb, ldb, beta, C + q * sc, ldc,
                     bi * GEMM_TM, bj * GEMM_TN);
}

/* A group's operands on the device (par__gemm_device_group) */
typedef struct {
    const par_real *a, *b;
    par_real *c;
    int64_t m, n, k;
} group_op;

/* The groups' device operands: g[i] for each group whose product is not empty */
static int64_t group_ops(group_op *g, int ta, int tb, int64_t G, const int64_t *M, const int64_t *N,
                         const int64_t *K, const par_real *const *A, int64_t lda, const par_real *const *B,
                         int64_t ldb, par_real beta, par_real *const *C, int64_t ldc)
{
    int64_t ng = 0;
    for (int64_t i = 0; i < G; i++) {
        if (!C[i] || M[i] <= 0 || N[i] <= 0)
            continue;
        const int64_t Kp = K[i] > 0 ? K[i] : 0;
        group_op o = {.m = M[i], .n = N[i], .k = Kp};
        o.a = PAR_DIN_AS(A[i], ta ? extent(Kp, M[i], lda) : extent(M[i], Kp, lda));
        o.b = PAR_DIN_AS(B[i], tb ? extent(N[i], Kp, ldb) : extent(Kp, N[i], ldb));
        o.c = beta == 0 && ldc == N[i] ? PAR_DOUT_AS(C[i], (size_t)(M[i] * N[i]))
                                       : PAR_DINOUT_AS(C[i], extent(M[i], N[i], ldc));
        g[ng++] = o;
        count(M[i], N[i], K[i], beta);
    }
    return ng;
}

void PAR_FN(par__gemm_device_group)(int ta, int tb, int64_t G, const int64_t *M, const int64_t *N,
                                    const int64_t *K, par_real alpha,
                                    const par_real *const *A, int64_t lda, /* G x [M, K] */
                                    const par_real *const *B, int64_t ldb, /* G x [K, N] */
                                    par_real beta, par_real *const *C,     /* G x [M, N]; NULL: none */
                                    int64_t ldc)
{
    group_op *g = G > 0 ? par_malloc((size_t)G * sizeof *g, PAR_TAG_ACT) : NULL;
    if (!g) { /* no memory for the table (or nothing to do): one call a group */
        for (int64_t i = 0; i < G; i++)
            if (C[i] && M[i] > 0 && N[i] > 0) {
                count(M[i], N[i], K[i], beta);
                batch_run(ta, tb, M[i], N[i], K[i], alpha, A[i], lda, 0, B[i], ldb, 0, beta, C[i], ldc, 0, 1);
            }
        return;
    }
    PAR_DEV_BEGIN();
    const int64_t ng = group_ops(g, ta, tb, G, M, N, K, A, lda, B, ldb, beta, C, ldc);
    int64_t mt = 0, nt = 0, work = 0;
    for (int64_t i = 0; i < ng; i++) {
        const int64_t a = (g[i].m + GEMM_TM - 1) / GEMM_TM, b = (g[i].n + GEMM_TN - 1) / GEMM_TN;
        mt = a > mt ? a : mt, nt = b > nt ? b : nt, work += g[i].m * g[i].n * g[i].k;
    }
    const group_op *gd = PAR_DIN_AS(g, ng);
    PAR_KLOOP_PAR(work >= GEMM_HOST_PAR_MIN, collapse(3) is_device_ptr(gd))
    for (int64_t q = 0; q < ng; q++)
        for (int64_t bi = 0; bi < mt; bi++)
            for (int64_t bj = 0; bj < nt; bj++)
                if (bi * GEMM_TM < gd[q].m && bj * GEMM_TN < gd[q].n)
                    tile(ta, tb, gd[q].m, gd[q].n, gd[q].k, alpha, gd[q].a, lda, gd[q].b, ldb, beta, gd[q].c,
                         ldc, bi * GEMM_TM, bj * GEMM_TN);
    par_free(g);
}
