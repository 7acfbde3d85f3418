/* bench_gemm - GFLOP/s of the MoE expert GEMMs.
 *
 * For each shape of an expert's forward/backward at a preset's sizes it times
 * (a) parity's par_gemm (the path the kernels take: row-invariant padding)
 * and (b) a raw cblas GEMM of the same shape, and prints both next to the
 * machine's large-square GEMM rate (OpenBLAS's practical peak here).
 * One BLAS thread (what each rank uses).  Not a test: numbers only.
 *
 *   bench_gemm [rows_per_expert d inter]     (default: v4-mini, 64 64 16)
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/alloc.h"

#define PAR_REAL_BITS 64
#include "kernels/ops.h"
#undef PAR_REAL_BITS

void openblas_set_num_threads(int);
char *openblas_get_corename(void);

/* par_gemm_f32 is declared here by hand: ops.h is included once per unit. */
void par_gemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const char *what;
    int ta, tb;
    int64_t M, N, K;
} shape;

/* time `reps` calls, best of 5 batches; returns GFLOP/s */
static double run(int prec, int raw, const shape *s, void *A, void *B, void *C)
{
    double flops = 2.0 * (double)s->M * (double)s->N * (double)s->K;
    int reps = (int)(2e8 / flops) + 1;
    double best = 1e30;
    int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    for (int b = 0; b < 5; b++) {
        double t0 = now();
        for (int r = 0; r < reps; r++) {
            if (prec == 64) {
                if (raw)
                    cblas_dgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                                (int)s->M, (int)s->N, (int)s->K, 1.0, A, (int)lda, B, (int)ldb, 0.0, C, (int)s->N);
                else
                    par_gemm_f64(s->ta, s->tb, s->M, s->N, s->K, 1.0, A, lda, B, ldb, 0.0, C, s->N);
            } else {
                if (raw)
                    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                                (int)s->M, (int)s->N, (int)s->K, 1.0f, A, (int)lda, B, (int)ldb, 0.0f, C, (int)s->N);
                else
                    par_gemm_f32(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
            }
        }
        double t = (now() - t0) / reps;
        if (t < best)
            best = t;
    }
    return flops / best * 1e-9;
}

int main(int argc, char **argv)
{
    int64_t n = 64, d = 64, inter = 16;
    if (argc == 4) {
        n = atoll(argv[1]);
        d = atoll(argv[2]);
        inter = atoll(argv[3]);
    }
    openblas_set_num_threads(1);
    const shape shapes[] = {
        {"fwd g,u = x w1^T  [n,d]x[I,d]^T", 0, 1, n, inter, d},
        {"fwd y = h w2^T    [n,I]x[d,I]^T", 0, 1, n, d, inter},
        {"bwd dh = dy w2    [n,d]x[d,I]", 0, 0, n, inter, d},
        {"bwd dx = dg w1    [n,I]x[I,d]", 0, 0, n, d, inter},
        {"bwd dw1 = dg^T x  [n,I]^Tx[n,d]", 1, 0, inter, d, n},
        {"bwd dw2 = dy^T h  [n,d]^Tx[n,I]", 1, 0, d, inter, n},
        {"peak: 1024^3", 0, 0, 1024, 1024, 1024},
    };
    size_t cap = 1024 * 1024;
    double *A = par_malloc(cap * 8, PAR_TAG_MISC), *B = par_malloc(cap * 8, PAR_TAG_MISC),
           *C = par_malloc(cap * 8, PAR_TAG_MISC);
    for (size_t i = 0; i < cap; i++) {
        A[i] = (double)(i % 17) * 0.01;
        B[i] = (double)(i % 13) * 0.02;
    }
    float *Af = par_malloc(cap * 4, PAR_TAG_MISC), *Bf = par_malloc(cap * 4, PAR_TAG_MISC),
          *Cf = par_malloc(cap * 4, PAR_TAG_MISC);
    for (size_t i = 0; i < cap; i++) {
        Af[i] = (float)A[i];
        Bf[i] = (float)B[i];
    }
    printf("expert GEMMs: %lld rows per expert, d=%lld, moe_inter_dim=%lld; OpenBLAS core %s, 1 thread\n\n",
           (long long)n, (long long)d, (long long)inter, openblas_get_corename());
    printf("%-34s %12s %12s %12s %12s\n", "shape", "f64 parity", "f64 cblas", "f32 parity", "f32 cblas");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        printf("%-34s %9.2f GF %9.2f GF %9.2f GF %9.2f GF\n", s->what, run(64, 0, s, A, B, C),
               run(64, 1, s, A, B, C), run(32, 0, s, Af, Bf, Cf), run(32, 1, s, Af, Bf, Cf));
    }
    par_free(A);
    par_free(B);
    par_free(C);
    par_free(Af);
    par_free(Bf);
    par_free(Cf);
    return 0;
}
