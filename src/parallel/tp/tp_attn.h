/* parallel/tp/tp_attn.h - tensor (and sequence) parallelism for the V4 hybrid
 * attention layer (templated: see kernels/real.h).  docs/parallel.md,
 * "Tensor parallelism".
 *
 * Rank r of a TP group of P holds (par_tp_attn_shard; the cuts are
 * parallel/layout/tp_split.h's):
 *   query heads [r*H/P, (r+1)*H/P): their rows of wq_b and attn_sink;
 *   output groups [r*G/P, (r+1)*G/P) (whole groups, so a rank's heads feed
 *   only its groups): their rows of wo_a, their columns of wo_b (packed
 *   [d, G/P*o_lora]: row-parallel);
 *   index heads [r*iH/P, ...): their rows of indexer.wq_b and
 *   indexer.weights_proj;
 *   the rest whole: wq_a, q_norm (the low-rank query input), the single KV
 *   head (wkv, kv_norm), the attention compressor and the indexer's
 *   compressor (one key per entry for all heads).
 * n_heads, o_groups and index_n_heads (m == 4 layers) must be divisible by
 * P (par_tp_attn_dims refuses with the numbers).
 *
 * Forward (every rank; x replicated, or with sp its T/P tokens all-gathered
 * first): the replicated projections (qa, qr, kv, compressor a/z) and
 * entries on all T tokens -- the same bits on every rank; its heads' q, iq,
 * iw; the indexer: the score sum over ALL index heads is chained through the
 * ranks in head order (rank r continues rank r-1's partial sums with its
 * heads, tp_reduce.h par_tp_reduce_chain), the last rank takes the top-k and
 * broadcasts `selected`, so the picks are the serial layer's bit for bit;
 * core attention of its heads with their sinks; its groups' wo_a, then its
 * wo_b columns: a partial y, summed over the group (all-reduce, or with sp a
 * reduce-scatter to the rank's tokens).
 * Backward: dy (all-gathered with sp) through the rank's groups and heads;
 * dkv and the entries' gradient are partial (this rank's heads), so are the
 * gradients of the replicated weights and the input gradient: dx is summed
 * over the group in the layer (all-reduce, sp: reduce-scatter); the
 * replicated weights' gradients stay this rank's share until
 * par_tp_attn_reduce_grads (once per step, after all microbatches).
 *
 * Against the serial layer (kernels/attention.h) on the same x, dy, f64,
 * one BLAS thread: `selected`, q, kv, entries, o, r, the rank's dW of wq_b,
 * wo_a, wo_b and attn_sink are bitwise (they need dgemm's column slices to
 * be bitwise the full product's columns: measured so on OpenBLAS 0.3.21, a
 * test checks the premise); y, dx and the replicated weights' gradients
 * are within the f64 policy (the row-parallel sum, the head sums of dkv and
 * of the entries' gradient, and the q_lora input gradient are split over
 * ranks).  sp == 1 is bitwise the sp == 0 layer on the same tokens.
 */
#ifndef PAR_PARALLEL_TP_TP_ATTN_H
#define PAR_PARALLEL_TP_TP_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "core/racc.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/real.h"
#include "parallel/tp/tp.h"

/* local = dm with H/P heads, o_groups/P groups, iH/P index heads (the
 * kernels' dims of a rank's shard).  PAR_EINVAL naming the numbers when P
 * does not divide them (index_n_heads only for m == 4 layers). */
par_status PAR_FN(par_tp_attn_dims)(par_attn_dims *local, const par_attn_dims *dm, int64_t P);

/* Reals of one rank's shard of the 18 weights (the same on every rank). */
int64_t PAR_FN(par_tp_attn_shard_count)(const par_attn_dims *dm, int64_t P);
/* Copies rank r's shard of the full weights W into buf (shard_count reals)
 * and points Wl's fields into it (NULL where W has none).  dm must pass
 * par_tp_attn_dims. */
void PAR_FN(par_tp_attn_shard)(PAR_FN(par_attn_weights) *Wl, par_real *buf,
                               const PAR_FN(par_attn_weights) *W, const par_attn_dims *dm,
                               int rank, int P);
/* The inverse: writes rank r's block of every non-NULL field of Wl into the
 * full W (replicated fields whole). */
/* The same when the model holds the cuts as the rank's shards (held != 0,
 * parallel/layout/tp_split.h par_tp_storage_cut: the row cuts and wo_b's
 * columns): every field points into W itself (the shards and the replicated
 * weights), buf is not touched.  held 0: par_tp_attn_shard. */
void PAR_FN(par_tp_attn_shard_held)(PAR_FN(par_attn_weights) *Wl, par_real *buf,
                                    const PAR_FN(par_attn_weights) *W, const par_attn_dims *dm,
                                    int rank, int P, int held);
/* par_tp_attn_grads_add when dW's cuts are the rank's held shards (held !=
 * 0): every field added in place, the bits of the whole-storage add. */
void PAR_FN(par_tp_attn_grads_add_held)(PAR_FN(par_attn_weights) *dW, const PAR_FN(par_attn_weights) *dWl,
                                        const par_attn_dims *dm, int rank, int P, par_real *scratch, int held);
void PAR_FN(par_tp_attn_unshard)(PAR_FN(par_attn_weights) *W, const PAR_FN(par_attn_weights) *Wl,
                                 const par_attn_dims *dm, int rank, int P);

/* dW (full) += rank r's shard gradients dWl: each non-NULL field of both
 * at rank r's block (replicated fields whole); the other ranks' blocks are
 * left as they are.  scratch: shard_count reals. */
void PAR_FN(par_tp_attn_grads_add)(PAR_FN(par_attn_weights) *dW, const PAR_FN(par_attn_weights) *dWl,
                                   const par_attn_dims *dm, int rank, int P, par_real *scratch);
/* A hook's shard of one block for one microbatch (tp/tp_attn_hook.c,
 * cp/cptp_hook.c): rank r's weights Wl (cut from the whole ones, or the
 * held shards in place) and their gradients dWl, until the weight pass
 * adds them into the model's. */
typedef struct {
    PAR_FN(par_attn_weights) Wl, dWl;
    par_real *buf;  /* [3 * shard]: Wl, dWl, scratch; held: [shard], dWl alone */
    int64_t shard;
    int rank, P, held; /* held: the model holds the cuts as the rank's shards (par_tp_attn_shard_held) */
    par_racc acc;      /* the bitwise mode: dWl's accumulator (registered), merged into the model's */
} PAR_FN(par_tp_attn_local);

/* The forward's: buf for the shard, Wl = rank r's shard of W.  In the
 * bitwise mode (dm->bitwise; held cuts only) the gradient shard is backed by
 * an accumulator that the weight pass merges into the model's.
 * PAR_ENOMEM naming who. */
par_status PAR_FN(par_tp_attn_local_make)(PAR_FN(par_tp_attn_local) *L, const PAR_FN(par_attn_weights) *W,
                                          const par_attn_dims *dm, int rank, int P, int held, const char *who);
/* The input pass's start: dWl points at the gradient shard, zeroed. */
void PAR_FN(par_tp_attn_local_zero)(PAR_FN(par_tp_attn_local) *L, const PAR_FN(par_attn_weights) *W,
                                    const par_attn_dims *dm);
/* dsink (the whole sinks' gradient) += the shard's (NULL: nothing). */
void PAR_FN(par_tp_attn_local_add_sink)(PAR_FN(par_tp_attn_local) *L, par_real *dsink, const par_attn_dims *dm);
/* The weight pass: dW (the model's) += g (dWl or its copy) but the sinks
 * (the input pass's). */
void PAR_FN(par_tp_attn_local_add)(PAR_FN(par_tp_attn_local) *L, const PAR_FN(par_attn_weights) *dW,
                                   const PAR_FN(par_attn_weights) *g, const par_attn_dims *dm);
void PAR_FN(par_tp_attn_local_free)(PAR_FN(par_tp_attn_local) *L); /* zeroed: fine */

/* Sequence parallelism over several rows (tp_attn_hook.c, cptp_hook.c):
 * the ranks hold column slices [rows, W/P, d] of the rows; the layer runs on
 * the slices gathered over the group into whole [rows, W, d] (x), its
 * whole output (y, and the picks sel) cut back to the rank's columns. */
typedef struct {
    par_real *x, *y; /* [T, d] each, T = rows * W (one buffer) */
    int32_t *sel;    /* [T, k] the whole picks, or NULL */
    int64_t rows, W, d, k;
} PAR_FN(par_tp_attn_sp);

/* x = xin gathered over tsp (P ranks); sel's room when want_sel.  PAR_ENOMEM
 * naming who, or the gather's status.  Free with par_tp_attn_sp_free. */
par_status PAR_FN(par_tp_attn_sp_gather)(PAR_FN(par_tp_attn_sp) *g, const par_tp *tsp, int P, const par_real *xin,
                                         int64_t rows, int64_t W, int64_t d, int64_t k, int want_sel,
                                         const char *who);
/* y [rows, W/P, d] (and sel when not NULL) = rank r's columns of g's y (sel). */
void PAR_FN(par_tp_attn_sp_take)(const PAR_FN(par_tp_attn_sp) *g, par_real *y, int32_t *sel, int r, int P);
void PAR_FN(par_tp_attn_sp_free)(PAR_FN(par_tp_attn_sp) *g);
/* The input pass: dx [rows, W/P, d] += rank r's columns of the whole dxf
 * [rows, W, d] (mine: [rows, W/P, d] scratch). */
void PAR_FN(par_tp_attn_sp_add_dx)(par_real *dx, par_real *mine, const par_real *dxf, int64_t rows, int64_t W,
                                   int64_t d, int r, int P);

/* What the forward keeps for the backward (all T tokens, this rank's
 * heads). */
typedef struct {
    par_attn_dims dm, dl;      /* the layer's dims; this rank's (dl.rope = dm.rope) */
    int64_t T, Tx;             /* tokens of the layer; tokens this rank holds (sp: T/P) */
    int rank, P, sp;
    PAR_FN(par_attn_saved) s;  /* [T] in dl's sizes */
    par_real *x;               /* [T, d] the (gathered) input */
    int32_t *pos;              /* [T] */
    void *buf;                 /* owns s's arrays */
} PAR_FN(par_tp_attn_saved);

void PAR_FN(par_tp_attn_saved_free)(PAR_FN(par_tp_attn_saved) *sv); /* zeroed/freed: fine */

/* y = this rank's tokens of Attention(x) over the T tokens.  Collective over
 * tp->comm.  x, y are [Tx, d] with Tx = T (tp->sp == 0) or T/P (sp: rank
 * r's tokens [r*T/P, (r+1)*T/P); T % P == 0).  pos [T] covers all T tokens
 * (every rank passes the same).  Wl: this rank's shard.  selected (m == 4,
 * may be NULL): the picks of the rank's Tx tokens.  `saved` must be zeroed
 * or freed; it is allocated on success. */
par_status PAR_FN(par_tp_attn_forward)(par_real *y,                 /* [Tx, d] */
                                       PAR_FN(par_tp_attn_saved) *saved,
                                       int32_t *selected,           /* [Tx, topk] or NULL */
                                       const par_real *x,           /* [Tx, d] */
                                       const int32_t *pos,          /* [T] */
                                       const PAR_FN(par_attn_weights) *Wl,
                                       const par_attn_dims *dm, int64_t T, const par_tp *tp);

/* dx += the rank's tokens of d(sum y dy)/dx (complete: summed over the
 * group here; NULL on every rank or on none); dWl += the shard's gradients:
 * wq_b, wo_a, wo_b, attn_sink complete, the replicated fields (wq_a, q_norm,
 * wkv, kv_norm, compressor) this rank's share.  No gradient into the
 * indexer.  Collective over tp->comm. */
par_status PAR_FN(par_tp_attn_backward)(par_real *dx,                /* [Tx, d] or NULL */
                                        PAR_FN(par_attn_weights) *dWl, /* or NULL */
                                        const par_real *dy,          /* [Tx, d] */
                                        const PAR_FN(par_tp_attn_saved) *saved,
                                        const PAR_FN(par_attn_weights) *Wl, const par_tp *tp);

/* Sums the replicated fields of dWl over the group (one all-reduce of all of
 * them packed, rank order): afterwards every rank holds the full gradient of
 * wq_a, q_norm, wkv, kv_norm and the compressor.  Call once per step after
 * every backward of the layer (the shares are linear in dy, so microbatches
 * may accumulate first).  NULL fields are skipped (every rank alike). */
par_status PAR_FN(par_tp_attn_reduce_grads)(PAR_FN(par_attn_weights) *dWl,
                                            const par_attn_dims *dm, const par_tp *tp);

#endif
