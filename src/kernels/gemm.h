/* kernels/gemm.h - parity's own GEMM (templated: see kernels/real.h).
 *
 * C[M,N] = alpha op(A) op(B) + beta C, row-major.  ta/tb: 0 = as stored,
 * 1 = transposed.  A is [M,K] (or [K,M] if ta), B is [K,N] (or [N,K] if tb).
 *
 * The bits are fixed by this definition, whatever the CPU, the dispatch path
 * (kernels/gemm_path.h), M, N or an element's place in C:
 *
 *   acc = 0;  for k = 0 .. K-1 in order:  acc = fma(a_ik, b_kj, acc)
 *   C_ij = alpha * acc                    (beta == 0: C is not read)
 *   C_ij = alpha * acc + beta * C_ij      (else; two products, one sum,
 *                                          each rounded: no fused step)
 *
 * in the working precision (f32: fmaf, an f32 accumulator).  K == 0 or
 * alpha == 0: C = beta C (beta == 0 writes zeros).  Vector lanes hold
 * different elements of C, never parts of one element's sum, and the K
 * blocking keeps each accumulator in the working precision between blocks,
 * so a row computed alone equals the same row inside any batch.
 * One thread; the emulated GPU's roofline counters are charged (2MNK flops). */
#ifndef PAR_KERNELS_GEMM_H
#define PAR_KERNELS_GEMM_H

#include <stdint.h>

#include "kernels/real.h"

void PAR_FN(par_gemm)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                      const par_real *A, int64_t lda, const par_real *B, int64_t ldb, par_real beta,
                      par_real *C, int64_t ldc);

/* The definition above as three plain loops (no packing, no vectors): the
 * fallback when the packing buffers cannot be allocated, and the reference
 * of the tests.  The same bits as par_gemm. */
void PAR_FN(par_gemm_reference)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                                const par_real *A, int64_t lda, const par_real *B, int64_t ldb,
                                par_real beta, par_real *C, int64_t ldc);

/* The micro-tile par_gemm takes for C [M, N] on the current path (never a
 * matter of bits, only of time): its rows and columns, and its index among
 * the path's par_gemm_tiles() tiles.  For tests and benchmarks. */
int PAR_FN(par_gemm_tile)(int64_t M, int64_t N, int *mr, int *nr);
int PAR_FN(par_gemm_tiles)(void);

/* The same sum split over K and continued piece after piece (the bitwise
 * mode's tensor-parallel sums: rank r continues rank r-1's accumulators with
 * its shard of K, docs/bitwise.md).  P [M, N] (ld ldp) holds raw
 * accumulators: load == 0 starts them at 0, load != 0 continues P's; each k
 * of this call is one fma in order.  Calling it over K's pieces in order gives
 * the accumulators par_gemm forms over the whole K; par_gemm_finish then makes
 * C exactly what par_gemm(.., alpha, .., beta, C) would have (alpha and beta
 * applied as its last K block does).  Host only: no device path. */
void PAR_FN(par_gemm_part)(int ta, int tb, int64_t M, int64_t N, int64_t K, const par_real *A, int64_t lda,
                           const par_real *B, int64_t ldb, int load,
                           par_real *P, int64_t ldp); /* P [M, N] raw accumulators */
void PAR_FN(par_gemm_finish)(int64_t M, int64_t N, par_real alpha,
                             const par_real *P, int64_t ldp, /* [M, N] */
                             par_real beta, par_real *C, int64_t ldc); /* C [M, N] */

#endif
