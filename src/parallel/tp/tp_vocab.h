/* parallel/tp/tp_vocab.h - vocab-parallel embedding and output head with a
 * vocab-parallel cross-entropy (no gathered logits), as Megatron-LM's
 * VocabParallelEmbedding / VocabParallelCrossEntropy (templated: see
 * kernels/real.h).  docs/parallel.md, "Tensor parallelism".
 *
 * Rank r of P holds vocabulary rows [r*V/P, (r+1)*V/P) of embed.weight and
 * of head.weight (parallel/layout/tp_split.h).  Token ids and targets are known on
 * every rank ([T], cheap).
 *
 * Embedding: h[t] = the rank's row of ids[t] or 0, summed over the group
 * (all-reduce; sp: reduce-scatter to the rank's tokens): exactly one rank
 * contributes each token, so h is the serial lookup bit for bit.  Backward:
 * dh (all-gathered with sp) into the rank's rows, tokens ascending: the
 * serial gradient's rows bit for bit.
 *
 * Head: xn (all-gathered with sp) -> the rank's logits [T, V/P]; CE with the
 * group max (all-reduce MAX, exact), the group sum of exp(z - max) in double
 * and the target's logit from its owner (one all-reduce SUM of both, in
 * double), lse = max + log(sum), ce = lse - z_target (the serial formulas of
 * par_xent_forward).  ce [Tx] for the rank's tokens.  Backward: dlogits =
 * scale (softmax - onehot) on the rank's columns from the shared lse; the
 * rank's dhead (complete); the partial dxn summed over the group
 * (all-reduce; sp: reduce-scatter).  The logits, lse and ce are within the
 * f64 policy of the serial head (the exp sum is split by rank; the max and
 * the picked logit are exact); the dhead rows follow.
 */
#ifndef PAR_PARALLEL_TP_TP_VOCAB_H
#define PAR_PARALLEL_TP_TP_VOCAB_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "parallel/tp/tp.h"

/* PAR_EINVAL naming the numbers when P does not divide vocab_size (or, with
 * sp, the T tokens). */
par_status PAR_FN(par_tp_vocab_check)(int64_t V, int64_t T, const par_tp *tp);

/* h [Tx, d] = embed(ids) for the rank's tokens (Tx = T, sp: T/P). */
par_status PAR_FN(par_tp_embed_forward)(par_real *h,               /* [Tx, d] */
                                        const int32_t *ids,        /* [T] */
                                        const par_real *emb,       /* [V/P, d] the shard */
                                        int64_t V, int64_t d, int64_t T, const par_tp *tp);
/* demb += the rows of the rank's vocabulary (tokens ascending). */
par_status PAR_FN(par_tp_embed_backward)(par_real *demb,           /* [V/P, d] */
                                         const par_real *dh,       /* [Tx, d] */
                                         const int32_t *ids,       /* [T] */
                                         int64_t V, int64_t d, int64_t T, const par_tp *tp);

typedef struct {
    int64_t T, Tx, V, Vl, v0, d;
    int rank, P, sp;
    par_real *xn;       /* [T, d] the (gathered) head input */
    par_real *logits;   /* [T, V/P] the rank's columns */
    par_real *lse;      /* [T] shared by all ranks */
    int32_t *target;    /* [T] */
    void *buf;
} PAR_FN(par_tp_head_saved);

void PAR_FN(par_tp_head_saved_free)(PAR_FN(par_tp_head_saved) *sv); /* zeroed/freed: fine */

/* ce [Tx] (0 without a target, NaN for a target outside [0, V)) of the
 * rank's tokens; lse_out [Tx] (may be NULL).  `saved` zeroed or freed. */
par_status PAR_FN(par_tp_head_forward)(par_real *ce,               /* [Tx] */
                                       par_real *lse_out,          /* [Tx] or NULL */
                                       PAR_FN(par_tp_head_saved) *saved,
                                       const par_real *xn,         /* [Tx, d] */
                                       const par_real *head,       /* [V/P, d] the shard */
                                       const int32_t *target,      /* [T], -1 = none */
                                       int64_t V, int64_t d, int64_t T, const par_tp *tp);
/* dxn += d/dxn of scale * sum_t CE_t (complete; NULL on every rank or
 * none); dhead += the shard's gradient (may be NULL). */
par_status PAR_FN(par_tp_head_backward)(par_real *dxn,             /* [Tx, d] or NULL */
                                        par_real *dhead,           /* [V/P, d] or NULL */
                                        const PAR_FN(par_tp_head_saved) *saved,
                                        const par_real *head,      /* [V/P, d] */
                                        double scale, const par_tp *tp);

#endif
