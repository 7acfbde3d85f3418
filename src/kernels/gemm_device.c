/* kernels/gemm_device.c - the device GEMM of the offload build (par_gemm in
 * GPU mode).  Compiled only with -Doffload=nvptx.
 *
 * C[M,N] = alpha op(A) op(B) + beta C, row-major, as par_gemm.  Each device
 * thread computes one GEMM_TM x GEMM_TN tile of C in registers (loads of A
 * and B are shared by the tile's products); every element is the definition
 * of kernels/gemm.h: acc = fma(a_ik, b_kj, acc) over k in ascending order in
 * the working precision, then alpha * acc (+ beta * C; beta == 0: C is not
 * read), the same operations as the CPU's par_gemm, so the same bits where
 * the device's fma is IEEE's (NVIDIA's is).  Not verified on a GPU here (the
 * K == 0 / alpha == 0 corner keeps this loop's form).  In the emulation the
 * same loops run on the host.
 */
#include <math.h>

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

void PAR_FN(par__gemm_device)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                              const par_real *A, int64_t lda, const par_real *B, int64_t ldb,
                              par_real beta, par_real *C, int64_t ldc)
{
    PAR_DEV_BEGIN();
    if (M <= 0 || N <= 0)
        return;
    const int64_t Kp = K > 0 ? K : 0;
    PAR_DIN(A, ta ? extent(Kp, M, lda) : extent(M, Kp, lda));
    PAR_DIN(B, tb ? extent(N, Kp, ldb) : extent(Kp, N, ldb));
    if (beta == 0 && ldc == N)
        PAR_DOUT(C, (size_t)(M * N));
    else
        PAR_DINOUT(C, extent(M, N, ldc));
    const int64_t mt = (M + GEMM_TM - 1) / GEMM_TM, nt = (N + GEMM_TN - 1) / GEMM_TN;
    PAR_KLOOP_PAR(M * N * Kp >= GEMM_HOST_PAR_MIN, collapse(2) is_device_ptr(A, B, C))
    for (int64_t bi = 0; bi < mt; bi++) {
        for (int64_t bj = 0; bj < nt; bj++) {
            const int64_t i0 = bi * GEMM_TM, j0 = bj * GEMM_TN;
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
    }
}
