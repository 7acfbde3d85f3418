/* parallel/tp/tp_reduce.h - every communication of the tensor-parallel layers,
 * named for what it moves (INTERNAL: included by tp_*.c and etp.c only;
 * templated, see kernels/real.h).
 *
 * Every SUM among them (par_tp_reduce_sum, _sum_f64, the token and row
 * reduce-scatters) and the CE's max go through the one reduction module
 * (parallel/reduce/reduce_sum.h par_reduce_fields / par_reduce_max_f64), so every
 * sum is in rank order 0..P-1 ((x_0 + x_1) + x_2 ...); what stays here is
 * what moves data without reducing it (all-gathers, the indexer chain, the
 * broadcast of the picks, Muon's point-to-point shards).  With a group of one
 * rank (tp->comm NULL or size 1) each is a copy or a no-op.  Bytes are
 * counted in tp->traffic.
 */
#ifndef PAR_PARALLEL_TP_TP_REDUCE_H
#define PAR_PARALLEL_TP_TP_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "parallel/tp/tp.h"

#if PAR_REAL_BITS == 64
#define PAR_TP_CREAL PAR_C_F64
#else
#define PAR_TP_CREAL PAR_C_F32
#endif

/* buf[0..n) = the sum over the group (all-reduce, in place): row-parallel
 * outputs (no SP), input gradients of column-parallel layers, the gradients
 * of replicated weights. */
par_status PAR_FN(par_tp_reduce_sum)(const par_tp *tp, par_real *buf, size_t n);
/* The same in double (CE partial sums, any precision). */
par_status PAR_FN(par_tp_reduce_sum_f64)(const par_tp *tp, double *buf, size_t n);
/* buf = the element-wise max over the group (CE logit max; exact). */
par_status PAR_FN(par_tp_reduce_max_f64)(const par_tp *tp, double *buf, size_t n);

/* SP entry: full[T, w] = the ranks' local[T/P, w] slices in rank order
 * (every rank passes Tl = T/P rows). */
par_status PAR_FN(par_tp_reduce_gather_tokens)(const par_tp *tp, par_real *full, const par_real *local,
                                         int64_t Tl, int64_t w);
/* SP with several rows (tp_attn_hook.c, cptp_hook.c): the P ranks' column
 * slices local [rows, W/P, w] of each row gathered (rank order) into whole
 * rows full [rows, W, w]; `what` names the layer in the out-of-memory
 * message. */
par_status PAR_FN(par_tp_reduce_gather_cols)(const par_tp *tp, int P, par_real *full, const par_real *local,
                                       int64_t rows, int64_t W, int64_t w, const char *what);
/* The inverse for rank r of P: local [rows, W/P, w] = its columns of full
 * [rows, W, w] (es-byte elements: reals or int32 picks). */
void PAR_FN(par_tp_reduce_take_cols)(void *local, const void *full, int64_t rows, int64_t W, int64_t w, size_t es, int r,
                               int P);
/* SP entry of token ids: full[P*Tl] = the ranks' local[Tl] in rank order. */
par_status PAR_FN(par_tp_reduce_gather_i32)(const par_tp *tp, int32_t *full, const int32_t *local, int64_t Tl);
/* SP exit: local[Tl, w] = block r of the group sum of full[P*Tl, w]. */
par_status PAR_FN(par_tp_reduce_scatter_tokens)(const par_tp *tp, par_real *local, const par_real *full,
                                          int64_t Tl, int64_t w);

/* A chain over the ranks in order: rank 0 calls add(ctx, buf) on buf as
 * given; rank r > 0 first receives buf[0..n) from rank r-1, then calls add;
 * every rank but the last sends its buf on to r+1.  The last rank ends with
 * the additions of all ranks, in rank order, as one sequence (the indexer's
 * per-head sums continued shard after shard: bitwise the serial sums). */
par_status PAR_FN(par_tp_reduce_chain)(const par_tp *tp, par_real *buf, size_t n,
                                 void (*add)(void *ctx, par_real *buf), void *ctx);
/* par_tp_reduce_chain on doubles, the last rank's result then broadcast to
 * every rank (the vocab-parallel CE's sums in the bitwise mode). */
par_status PAR_FN(par_tp_reduce_chain_f64)(const par_tp *tp, double *buf, size_t n,
                                           void (*add)(void *ctx, double *buf), void *ctx);
/* The bitwise mode's chain with its result on every rank: the ranks in
 * rank order (rank r receives buf from r-1, calls add, sends it on), then a
 * broadcast from the last; -Dfault=tp_chain_reverse reverses the order.
 * par_tp_chain_first: 1 on the rank that starts the chain (buf as given). */
int PAR_FN(par_tp_chain_first)(const par_tp *tp);
par_status PAR_FN(par_tp_reduce_chain_bcast)(const par_tp *tp, par_real *buf, size_t n,
                                             void (*add)(void *ctx, par_real *buf), void *ctx);
/* reals buf[0..n) from group rank root to every rank. */
par_status PAR_FN(par_tp_reduce_bcast)(const par_tp *tp, par_real *buf, size_t n, int root);
/* The bitwise mode's sums over a split K (docs/bitwise.md "Tensor
 * parallelism"): the group holds K in rank-order shards; rank r continues
 * rank r-1's raw accumulators with its shard (par_gemm_part, a chain), the
 * last rank broadcasts them, so every rank ends with the serial kernel's
 * bits, a recipe's casts applied as it applies them.
 * _forward: y [T, N] = in W^T as par_linear_forward (in [T, Kl], w [N, Kl]:
 * this rank's columns of K).  _din: din [T, K] += dout W as
 * par_linear_backward's input gradient (dout [T, Nl], w [Nl, K]: this
 * rank's rows of N; in [T, K] the layer's input, for the recipe's lookup). */
par_status PAR_FN(par_tp_reduce_linear_forward)(const par_tp *tp, par_real *y, const par_real *in, const par_real *w,
                                                int64_t T, int64_t Kl, int64_t N);
par_status PAR_FN(par_tp_reduce_linear_din)(const par_tp *tp, par_real *din, const par_real *dout, const par_real *in,
                                            const par_real *w, int64_t T, int64_t K, int64_t Nl);
/* int32 buf[0..n) from group rank root to every rank. */
par_status PAR_FN(par_tp_reduce_bcast_i32)(const par_tp *tp, int32_t *buf, size_t n, int root);

/* ETP rows.  counts[P] (out) = every rank's row count n; the ranks' rows
 * [n_r, w] (reals) and ids [n_r] (int32, may be NULL) gathered in rank order
 * into full (sum n_r rows) and full_ids. */
par_status PAR_FN(par_tp_reduce_row_counts)(const par_tp *tp, int64_t n, int64_t *counts);
par_status PAR_FN(par_tp_reduce_gather_rows)(const par_tp *tp, par_real *full, int32_t *full_ids,
                                       const par_real *rows, const int32_t *ids,
                                       const int64_t *counts, int64_t w);
/* rows[n_r, w] = the group sum of the rows of full[sum n_r, w] that came
 * from this rank (the inverse layout of par_tp_reduce_gather_rows; blocks padded
 * to the largest count for one reduce-scatter). */
par_status PAR_FN(par_tp_reduce_scatter_rows)(const par_tp *tp, par_real *rows, const par_real *full,
                                        const int64_t *counts, int64_t w);

/* Muon: shards of one matrix to its owner and back, point to point.  On
 * the owner all[P, n] receives rank q's mine[n] as block q (its own
 * copied); par_tp_reduce_from_owner sends block q of the owner's all to rank q's
 * mine.  Other ranks pass all = NULL. */
par_status PAR_FN(par_tp_reduce_to_owner)(const par_tp *tp, int owner, par_real *all,
                                    const par_real *mine, size_t n);
par_status PAR_FN(par_tp_reduce_from_owner)(const par_tp *tp, int owner, par_real *mine,
                                      const par_real *all, size_t n);


#endif
