/* kernels/gsum.h - the bitwise mode's side of the kernels: a weight
 * gradient whose buffer is backed by an order-free accumulator (core/racc.h:
 * the model registers its gradient buffer in the bitwise mode) receives
 * every token's contribution as its own term instead of a sum the kernel
 * formed.  The canonical unit is one token: a term's bits depend on that
 * token's inputs alone, so no layout can cut a sum differently.  Host code
 * only (the device path refuses the mode: docs/bitwise.md). */
#ifndef PAR_KERNELS_GSUM_H
#define PAR_KERNELS_GSUM_H

#include <stdint.h>

#include "core/racc.h"
#include "kernels/gsum_row.h"
#include "kernels/real.h"

/* The accumulator behind gradient g[0..n), or {NULL}: the kernel's own sum. */
static inline par_racc_view par_gsum_of(const par_real *g, int64_t n)
{
    return g ? par_racc_lookup(g, (size_t)n) : (par_racc_view){NULL, 0};
}

/* g[j] += x, as one term. */
static inline void par_gsum_put(par_racc_view v, int64_t j, double x) { par_racc_put(v.acc, v.at + (size_t)j, x); }

/* dw[n, k] += sum_t a[t, n] b[t, k] as T terms per element (a [T, N] with
 * row stride lda, b [T, K] with row stride ldb, dw [N, K] with stride ldw). */
void PAR_FN(par_gsum_outer)(par_racc_view v, const par_real *a, int64_t lda, const par_real *b, int64_t ldb,
                            int64_t T, int64_t N, int64_t K, int64_t ldw);

#endif
