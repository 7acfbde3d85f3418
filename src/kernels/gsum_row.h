/* kernels/gsum_row.h - one token's terms of a weight-gradient row deposited
 * at once: elements [i0, i0 + n) of an accumulator (core/racc.h) each take
 * the term g * x[k].  The bitwise mode's hottest loop (par_gsum_outer:
 * dW = dout^T in, one term per token and element).
 *
 * The elements are distinct, so the order in which a row's terms go in
 * cannot matter, and every path performs, per element, exactly the
 * operations of par_racc_put (the term's product, its three cuts, the
 * integer adds): the portable C path, the AVX2 path (four elements per
 * vector) and the AVX-512F path (eight) leave the same state bit for bit; a
 * group with a first term, a larger one or a non-finite one takes
 * par_racc_put.  The path is the one par_gemm uses (kernels/gemm_path.h:
 * PARITY_GEMM_PATH=c|avx2|avx512 forces one). */
#ifndef PAR_KERNELS_GSUM_ROW_H
#define PAR_KERNELS_GSUM_ROW_H

#include <stddef.h>

#include "core/racc.h"

/* a's elements i0 + k += g * x[k] for k < n (double terms) */
void par_gsum_row_put_f64(par_racc *a, size_t i0, double g, const double *x, /* [n] */ size_t n);
/* the same with x in float: each term is g * (double)x[k] */
void par_gsum_row_put_f32(par_racc *a, size_t i0, double g, const float *x, /* [n] */ size_t n);

#endif
