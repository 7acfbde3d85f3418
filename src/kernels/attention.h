/* kernels/attention.h - the V4 hybrid attention layer (MODEL.md section 3),
 * forward and explicit backward (templated: see kernels/real.h).
 *
 * Data layout.  Tokens are a flat array of T = B*S tokens; pos[t] is the
 * token's position within its sample (0 at each sample start), samples are
 * contiguous, so the sample of t starts at flat index t - pos[t].
 * Compressed entries (attention compressor, indexer compressor) are stored
 * token-indexed, [T, c]: entry i of a sample lives at the row of its block's
 * LAST token, s0 + (i+1)*m - 1; rows with (pos+1) % m != 0 hold zeros.
 * `selected` (m == 4 only) is int32 [T, topk]: entry indices i within the
 * sample, ascending, -1 padding at the end.
 *
 * The layer is split in phases, each with its own forward/backward, so that
 * a context-parallel caller can insert communication between them:
 *   (1) par_attn_proj_*      per-token projections (q, kv, compressor a/z,
 *                            indexer q and weights)
 *   (2) par_compress_*       complete blocks -> normed, roped entries
 *   (3) par_indexer_select   indexer scores + top-k (no backward)
 *   (4) par_attn_core_*      softmax-with-sink attention, inverse RoPE of o
 *   (5) par_attn_out_*       grouped output projection wo_a, then wo_b
 * par_attn_forward / par_attn_backward run all phases on the whole batch.
 *
 * Backward functions ACCUMULATE (+=) into gradient outputs; any gradient
 * output may be NULL when not wanted.  No gradient flows into the indexer:
 * its gradient slots are never touched.
 */
#ifndef PAR_KERNELS_ATTENTION_H
#define PAR_KERNELS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "kernels/rope.h"

/* Loops of the phases run under OpenMP (one owner per output row, so the
 * bits do not depend on the thread count) only when their work, in
 * multiply-adds, reaches this; small calls stay serial. */
#define PAR_ATTN_OMP_MIN_WORK 65536

#ifndef PAR_ATTN_DIMS_DEFINED
#define PAR_ATTN_DIMS_DEFINED
/* Sizes of one attention layer (MODEL.md names in comments). */
typedef struct {
    int64_t d;        /* dim                                            */
    int64_t H;        /* n_heads                                        */
    int64_t hd;       /* head_dim                                       */
    int64_t rd;       /* rope_head_dim (== rope->rd)                    */
    int64_t q_lora;   /* q_lora_rank                                    */
    int64_t o_groups; /* o_groups (divides H)                           */
    int64_t o_lora;   /* o_lora_rank                                    */
    int64_t window;   /* window_size (>= 1)                             */
    int64_t m;        /* compress ratio: 0 (none), 4 (indexer) or > 4   */
    int64_t iH;       /* index_n_heads    (m == 4)                      */
    int64_t ihd;      /* index_head_dim   (m == 4, >= rd)               */
    int64_t topk;     /* index_topk       (m == 4)                      */
    double norm_eps;
    const par_rope *rope; /* the layer's table (YaRN when m > 0)        */
    int bitwise;      /* the bitwise mode (docs/bitwise.md): the entries'
                       * gradients over queries as order-free terms      */
    int fp4_index;    /* a recipe's FP4 indexer (kernels/qcast.h): q and k
                       * rotated and MXFP4-simulated, scores in BF16     */
} par_attn_dims;
#endif

/* Weights of one layer (reference names).  The same type holds gradients
 * (accumulated with +=); a NULL slot in a gradient struct is skipped.
 * cmp_* only when m > 0, idx_* only when m == 4 (coff = 2 if m == 4 else 1). */
typedef struct {
    par_real *wq_a;      /* [q_lora, d]                        */
    par_real *q_norm;    /* [q_lora]                           */
    par_real *wq_b;      /* [H*hd, q_lora]                     */
    par_real *wkv;       /* [hd, d]                            */
    par_real *kv_norm;   /* [hd]                               */
    par_real *wo_a;      /* [o_groups*o_lora, H*hd/o_groups]   */
    par_real *wo_b;      /* [d, o_groups*o_lora]               */
    par_real *attn_sink; /* [H]                                */
    par_real *cmp_wkv;   /* [coff*hd, d]                       */
    par_real *cmp_wgate; /* [coff*hd, d]                       */
    par_real *cmp_ape;   /* [m, coff*hd]                       */
    par_real *cmp_norm;  /* [hd]                               */
    par_real *idx_wq_b;          /* [iH*ihd, q_lora]           */
    par_real *idx_weights_proj;  /* [iH, d]                    */
    par_real *idx_cmp_wkv;       /* [2*ihd, d]                 */
    par_real *idx_cmp_wgate;     /* [2*ihd, d]                 */
    par_real *idx_cmp_ape;       /* [4, 2*ihd]                 */
    par_real *idx_cmp_norm;      /* [ihd]                      */
} PAR_FN(par_attn_weights);

/* Saved activations of one forward (all token-indexed, [T, ...]).  Arrays
 * for a disabled part (m == 0: cmp*, m != 4: idx*, sel) are NULL. */
typedef struct {
    par_real *qa;       /* [T, q_lora]   x wq_a^T                          */
    par_real *qa_rstd;  /* [T]                                             */
    par_real *qr;       /* [T, q_lora]   q_norm(qa)                        */
    par_real *qb;       /* [T, H*hd]     qr wq_b^T (before per-head norm)  */
    par_real *q_rstd;   /* [T, H]                                          */
    par_real *q;        /* [T, H*hd]     normed, roped query heads         */
    par_real *kva;      /* [T, hd]       x wkv^T                           */
    par_real *kv_rstd;  /* [T]                                             */
    par_real *kv;       /* [T, hd]       kv_norm, roped                    */
    par_real *ca;       /* [T, coff*hd]  compressor x wkv^T                */
    par_real *cz;       /* [T, coff*hd]  compressor x wgate^T + ape        */
    par_real *cmp_raw;  /* [T, hd]       pooled block (before norm)        */
    par_real *cmp_rstd; /* [T]                                             */
    par_real *cmp;      /* [T, hd]       entries (normed, roped at i*m)    */
    par_real *iq;       /* [T, iH*ihd]   indexer q (roped)                 */
    par_real *iw;       /* [T, iH]       indexer head weights (scaled)     */
    par_real *ica;      /* [T, 2*ihd]                                      */
    par_real *icz;      /* [T, 2*ihd]                                      */
    par_real *icmp_raw; /* [T, ihd]                                        */
    par_real *icmp_rstd;/* [T]                                             */
    par_real *icmp;     /* [T, ihd]      indexer entries                   */
    int32_t *sel;       /* [T, topk]     indexer picks                     */
    par_real *o;        /* [T, H*hd]     attention output, inverse-roped   */
    par_real *lse;      /* [T, H]        log(sum exp z + exp sink)         */
    par_real *r;        /* [T, o_groups*o_lora] grouped wo_a output        */
} PAR_FN(par_attn_saved);

/* The saved struct's arrays in layout order, X(field, type, width, present,
 * tok): `width` elements per token, `present` whether the dims have the
 * array, `tok` 1 for a per-token array and 0 for the compressed entries
 * (cmp, icmp: rows at their block's last token).  The widths name the
 * constants PAR_ATTN_SAVED_DIMS(dm) declares.  saved_bytes / saved_carve
 * walk it; so does parallel/cp/cp.c for its window layout. */
#define PAR_ATTN_SAVED_FIELDS(X)                                                                    \
    X(qa, par_real, ql, 1, 1) X(qa_rstd, par_real, 1, 1, 1) X(qr, par_real, ql, 1, 1)              \
    X(qb, par_real, H * hd, 1, 1) X(q_rstd, par_real, H, 1, 1) X(q, par_real, H * hd, 1, 1)        \
    X(kva, par_real, hd, 1, 1) X(kv_rstd, par_real, 1, 1, 1) X(kv, par_real, hd, 1, 1)             \
    X(ca, par_real, coff * hd, m > 0, 1) X(cz, par_real, coff * hd, m > 0, 1)                      \
    X(cmp_raw, par_real, hd, m > 0, 1) X(cmp_rstd, par_real, 1, m > 0, 1)                          \
    X(cmp, par_real, hd, m > 0, 0) X(iq, par_real, iH * ihd, m == 4, 1)                            \
    X(iw, par_real, iH, m == 4, 1) X(ica, par_real, 2 * ihd, m == 4, 1)                            \
    X(icz, par_real, 2 * ihd, m == 4, 1) X(icmp_raw, par_real, ihd, m == 4, 1)                     \
    X(icmp_rstd, par_real, 1, m == 4, 1) X(icmp, par_real, ihd, m == 4, 0)                         \
    X(sel, int32_t, topk, m == 4, 1) X(o, par_real, H * hd, 1, 1) X(lse, par_real, H, 1, 1)        \
    X(r, par_real, GL, 1, 1)

#define PAR_ATTN_SAVED_DIMS(dm)                                                                     \
    const int64_t H = (dm)->H, hd = (dm)->hd, ql = (dm)->q_lora, m = (dm)->m, coff = m == 4 ? 2 : 1; \
    const int64_t iH = (dm)->iH, ihd = (dm)->ihd, topk = (dm)->topk, GL = (dm)->o_groups * (dm)->o_lora; \
    (void)H, (void)hd, (void)ql, (void)m, (void)coff, (void)iH, (void)ihd, (void)topk, (void)GL

/* Checks the dims (divisibility, rd <= hd, m in {0, 4, > 4}, ...). */
par_status PAR_FN(par_attn_check_dims)(const par_attn_dims *dm);
/* Bytes of a saved struct for T tokens (every array 64-byte aligned). */
size_t PAR_FN(par_attn_saved_bytes)(const par_attn_dims *dm, int64_t T);
/* Points the arrays of `s` into `buf` (at least saved_bytes, 64-aligned). */
void PAR_FN(par_attn_saved_carve)(PAR_FN(par_attn_saved) *s, void *buf,
                                  const par_attn_dims *dm, int64_t T);

/* ---- whole layer -------------------------------------------------------- */

/* y = Attention(x).  `selected` receives the indexer picks when m == 4 (may
 * be NULL; they are kept in saved->sel anyway).  pos must restart at 0 at
 * each sample start and count up by one inside a sample. */
par_status PAR_FN(par_attn_forward)(par_real *y,                      /* [T, d] */
                                    PAR_FN(par_attn_saved) *saved,
                                    int32_t *selected,                /* [T, topk] or NULL */
                                    const par_real *x,                /* [T, d] */
                                    const int32_t *pos,               /* [T] */
                                    const PAR_FN(par_attn_weights) *W,
                                    const par_attn_dims *dm, int64_t T);
/* dx += dy dy/dx ; dW += (every non-indexer weight). */
par_status PAR_FN(par_attn_backward)(par_real *dx,                    /* [T, d] or NULL */
                                     PAR_FN(par_attn_weights) *dW,    /* or NULL */
                                     const par_real *dy,              /* [T, d] */
                                     const PAR_FN(par_attn_saved) *saved,
                                     const par_real *x,               /* [T, d] */
                                     const int32_t *pos,              /* [T] */
                                     const PAR_FN(par_attn_weights) *W,
                                     const par_attn_dims *dm, int64_t T);

/* The same backward in two halves, for a pipeline that runs the weight
 * gradients later (zero-bubble schedules; model/block.c).  The input half
 * (B) accumulates dx and dsink (the sink's gradient is a by-product of the
 * softmax backward, no GEMM) and leaves in `keep` the gradients at the
 * projections' outputs; the weight half (W) accumulates every other
 * non-indexer weight from them (wo_a/wo_b recompute the output projection's
 * inner gradient, the projections' backward its q_lora gradient: the same
 * GEMMs on the same inputs, so the bits equal par_attn_backward's).  W
 * consumes keep (its dq and dkv are scratch) and ignores dW->attn_sink.
 * par_attn_backward is B then W. */
typedef struct {
    par_real *dq;        /* [T, H*hd]      gradient of the roped queries       */
    par_real *dkv;       /* [T, hd]        gradient of the roped kv            */
    par_real *dcmp;      /* [T, hd]        entry gradients (m > 0, else NULL)  */
    par_real *dca, *dcz; /* [T, coff*hd]   compressor a / z (m > 0, else NULL) */
} PAR_FN(par_attn_keep);

/* Bytes of a keep for T tokens; carve zeroes buf and points keep into it. */
size_t PAR_FN(par_attn_keep_bytes)(const par_attn_dims *dm, int64_t T);
void PAR_FN(par_attn_keep_carve)(PAR_FN(par_attn_keep) *keep, void *buf, const par_attn_dims *dm, int64_t T);
par_status PAR_FN(par_attn_backward_input)(par_real *dx,                 /* [T, d] += or NULL */
                                           par_real *dsink,              /* [H] += or NULL */
                                           PAR_FN(par_attn_keep) *keep,  /* carved: filled */
                                           const par_real *dy,           /* [T, d] */
                                           const PAR_FN(par_attn_saved) *saved,
                                           const par_real *x,            /* [T, d] */
                                           const int32_t *pos,           /* [T] */
                                           const PAR_FN(par_attn_weights) *W,
                                           const par_attn_dims *dm, int64_t T);
par_status PAR_FN(par_attn_backward_weights)(PAR_FN(par_attn_weights) *dW, /* += (attn_sink ignored) */
                                             PAR_FN(par_attn_keep) *keep,  /* from the input half: consumed */
                                             const par_real *dy,           /* [T, d] */
                                             const PAR_FN(par_attn_saved) *saved,
                                             const par_real *x,            /* [T, d] */
                                             const int32_t *pos,           /* [T] */
                                             const PAR_FN(par_attn_weights) *W,
                                             const par_attn_dims *dm, int64_t T);

/* ---- (1) per-token projections ----------------------------------------- */

/* Fills qa, qa_rstd, qr, qb, q_rstd, q, kva, kv_rstd, kv; ca, cz (m > 0);
 * iq, iw, ica, icz (m == 4).  Rows are independent. */
void PAR_FN(par_attn_proj_forward)(PAR_FN(par_attn_saved) *s,
                                   const par_real *x,   /* [T, d] */
                                   const int32_t *pos,  /* [T] */
                                   const PAR_FN(par_attn_weights) *W,
                                   const par_attn_dims *dm, int64_t T);
/* From the gradients of the roped q, the roped kv and the compressor's a/z
 * (dca/dcz NULL when m == 0) to dx and the weights.  dq and dkv are
 * consumed as scratch (overwritten). */
par_status PAR_FN(par_attn_proj_backward)(par_real *dx,          /* [T, d] or NULL */
                                          PAR_FN(par_attn_weights) *dW,
                                          par_real *dq,          /* [T, H*hd] scratch */
                                          par_real *dkv,         /* [T, hd] scratch */
                                          const par_real *dca,   /* [T, coff*hd] or NULL */
                                          const par_real *dcz,   /* [T, coff*hd] or NULL */
                                          const PAR_FN(par_attn_saved) *s,
                                          const par_real *x,     /* [T, d] */
                                          const int32_t *pos,    /* [T] */
                                          const PAR_FN(par_attn_weights) *W,
                                          const par_attn_dims *dm, int64_t T);

/* par_attn_proj_backward in its two halves around wq_b's input gradient (the
 * bitwise mode's tensor parallelism sums dqr over the heads' ranks between
 * them): dqb = the per-head norm's and rope's backward of dq (consumed);
 * then from dqr = dqb wq_b (complete) on: q_norm, wq_a, the kv path and
 * the compressor's projections. */
void PAR_FN(par_attn_proj_backward_dqb)(par_real *dqb,        /* [T, H*hd] */
                                        par_real *dq,         /* [T, H*hd] scratch */
                                        const PAR_FN(par_attn_saved) *s, const int32_t *pos, /* [T] */
                                        const par_attn_dims *dm, int64_t T);
par_status PAR_FN(par_attn_proj_backward_rest)(par_real *dx,          /* [T, d] or NULL */
                                               PAR_FN(par_attn_weights) *dW,
                                               const par_real *dqr,   /* [T, q_lora] */
                                               par_real *dkv,         /* [T, hd] scratch */
                                               const par_real *dca,   /* [T, coff*hd] or NULL */
                                               const par_real *dcz,   /* [T, coff*hd] or NULL */
                                               const PAR_FN(par_attn_saved) *s,
                                               const par_real *x,     /* [T, d] */
                                               const int32_t *pos,    /* [T] */
                                               const PAR_FN(par_attn_weights) *W,
                                               const par_attn_dims *dm, int64_t T);

/* ---- (2) compressor ----------------------------------------------------- */

/* For every row t in [t0, t1) that ends a block ((pos[t]+1) % m == 0, block
 * i = pos[t]/m): pool the block's slots (softmax over slots per channel;
 * for m == 4 also the first halves of block i-1, absent for i = 0), RMSNorm
 * with `norm`, RoPE at i*m.  Other rows of [t0, t1) get zeros.  Reads rows
 * t - coff*m + 1 .. t of a and z (a halo before t0 when t0 > 0). */
void PAR_FN(par_compress_forward)(par_real *cmp,        /* [T, c] */
                                  par_real *raw,        /* [T, c] */
                                  par_real *rstd,       /* [T] */
                                  const par_real *a,    /* [T, coff*c] */
                                  const par_real *z,    /* [T, coff*c] */
                                  const int32_t *pos,   /* [T] */
                                  const par_real *norm, /* [c] */
                                  const par_rope *rope, int64_t t0, int64_t t1,
                                  int64_t c, int64_t m, double eps);
/* da, dz += (into the halo rows too); dnorm += (rows in ascending t). */
par_status PAR_FN(par_compress_backward)(par_real *da,          /* [T, coff*c] or NULL */
                                   par_real *dz,          /* [T, coff*c] or NULL */
                                   par_real *dnorm,       /* [c] or NULL */
                                   const par_real *dcmp,  /* [T, c] */
                                   const par_real *raw,   /* [T, c] */
                                   const par_real *rstd,  /* [T] */
                                   const par_real *a,     /* [T, coff*c] */
                                   const par_real *z,     /* [T, coff*c] */
                                   const int32_t *pos,    /* [T] */
                                   const par_real *norm,  /* [c] */
                                   const par_rope *rope, int64_t t0, int64_t t1,
                                   int64_t c, int64_t m);

/* ---- (3) indexer (m == 4; no backward) ---------------------------------- */

/* For queries t in [t0, t1): I_i = sum_h iw[t,h] relu(iq[t,h] . icmp[e_i])
 * over visible entries i < (pos+1)/4, keep the top `topk` (ties -> lower i),
 * written ascending with -1 padding. */
par_status PAR_FN(par_indexer_select)(int32_t *sel,           /* [T, topk] */
                                      const par_real *iq,     /* [T, iH*ihd] */
                                      const par_real *iw,     /* [T, iH] */
                                      const par_real *icmp,   /* [T, ihd] */
                                      const int32_t *pos,     /* [T] */
                                      const par_attn_dims *dm, int64_t t0, int64_t t1);
/* par_indexer_select's two steps, for a caller that splits the indexer heads
 * (tensor parallelism, parallel/tp/tp_attn.h).  nv must be at least
 * par_indexer_max_visible(pos, t0, t1) (the most entries a query in [t0, t1)
 * sees).  par_indexer_scores ADDS, for every query t in [t0, t1) and visible
 * entry i, the terms iw[t,h] relu(iq[t,h] . icmp[e_i]) of the dm->iH heads
 * of iq/iw in ascending h to acc[t - t0][i], continuing from its value: run
 * over shards of consecutive heads in head order on one acc, it makes the
 * same additions as par_indexer_select (whose sums start at 0), bit for bit.
 * par_indexer_topk turns complete scores into `selected` exactly as
 * par_indexer_select does (ties -> lower i, ascending, -1 padding). */
int64_t PAR_FN(par_indexer_max_visible)(const int32_t *pos, int64_t t0, int64_t t1);
void PAR_FN(par_indexer_scores)(par_real *acc,          /* [t1-t0, nv] += */
                                int64_t nv,
                                const par_real *iq,     /* [T, iH*ihd] */
                                const par_real *iw,     /* [T, iH] */
                                const par_real *icmp,   /* [T, ihd] */
                                const int32_t *pos,     /* [T] */
                                const par_attn_dims *dm, int64_t t0, int64_t t1);
par_status PAR_FN(par_indexer_topk)(int32_t *sel,          /* [T, topk] */
                                    const par_real *acc,   /* [t1-t0, nv] */
                                    int64_t nv,
                                    const int32_t *pos,    /* [T] */
                                    const par_attn_dims *dm, int64_t t0, int64_t t1);

/* The exact ties at each query's top-k boundary, for a golden set's
 * ties.K file (model/golden.c): the query's scores as par_indexer_select
 * computes them (the same additions, host side); on a row with more than
 * topk visible entries whose topk-th and (topk+1)-th largest scores are
 * equal, tie[t, i] = 1 for every entry i scored exactly that (MODEL.md's
 * lower-index rule picks among them; another top-k may pick others), 0
 * elsewhere and on every other row.  ne >= the most entries a query sees.
 * counts[0] = rows with a choice (more than topk visible), counts[1] = rows
 * with such a tie.  Host memory only (not offloaded). */
par_status PAR_FN(par_indexer_ties)(int32_t *tie,          /* [T, ne] */
                                    int64_t ne,
                                    int64_t counts[2],
                                    const par_real *iq,     /* [T, iH*ihd] */
                                    const par_real *iw,     /* [T, iH] */
                                    const par_real *icmp,   /* [T, ihd] */
                                    const int32_t *pos,     /* [T] */
                                    const par_attn_dims *dm, int64_t T);

/* ---- (4) core attention -------------------------------------------------- */

/* For queries t in [q0, q1), heads h: keys = kv of the window (flat rows
 * max(t - pos[t], t - window + 1) .. t), then the entries (m > 0): all
 * visible ones (m != 4) or the ones in sel[t] (m == 4); softmax with the
 * sink; o = inverse-RoPE(sum p k, pos[t]).  kv and cmp are read at rows
 * before q0 (the halo: back to the sample start for cmp). */
par_status PAR_FN(par_attn_core_forward)(par_real *o,           /* [T, H*hd] */
                                         par_real *lse,         /* [T, H] */
                                         const par_real *q,     /* [T, H*hd] */
                                         const par_real *kv,    /* [T, hd] */
                                         const par_real *cmp,   /* [T, hd] or NULL (m == 0) */
                                         const int32_t *sel,    /* [T, topk] or NULL (m != 4) */
                                         const int32_t *pos,    /* [T] */
                                         const par_real *sink,  /* [H] */
                                         const par_attn_dims *dm, int64_t q0, int64_t q1);
/* Query side, queries [q0, q1): dop = RoPE(do) (the gradient before the
 * inverse rotation, written), D[t,h] = dop . o_pre (written),
 * dq += , dsink += (sum over t ascending). */
par_status PAR_FN(par_attn_core_backward_q)(par_real *dq,          /* [T, H*hd] or NULL */
                                            par_real *dsink,       /* [H] or NULL */
                                            par_real *dop,         /* [T, H*hd] out */
                                            par_real *Dd,          /* [T, H] out */
                                            const par_real *dout,  /* [T, H*hd] d(o) */
                                            const par_real *lse,   /* [T, H] */
                                            const par_real *q,     /* [T, H*hd] */
                                            const par_real *kv,    /* [T, hd] */
                                            const par_real *cmp,   /* [T, hd] or NULL */
                                            const int32_t *sel,    /* [T, topk] or NULL */
                                            const int32_t *pos,    /* [T] */
                                            const par_real *sink,  /* [H] */
                                            const par_attn_dims *dm, int64_t q0, int64_t q1);
/* Key side, key rows [k0, k1): dkv += , dcmp += over the queries that see
 * each key (ascending query, then head; in the bitwise mode the window keys
 * head, then query, and the entries as terms), reading queries up to nq
 * (exclusive, normally T): deterministic, one owner per key row. */
void PAR_FN(par_attn_core_backward_kv)(par_real *dkv,         /* [T, hd] or NULL */
                                       par_real *dcmp,        /* [T, hd] or NULL */
                                       const par_real *dop,   /* [T, H*hd] */
                                       const par_real *Dd,    /* [T, H] */
                                       const par_real *lse,   /* [T, H] */
                                       const par_real *q,     /* [T, H*hd] */
                                       const par_real *kv,    /* [T, hd] */
                                       const par_real *cmp,   /* [T, hd] or NULL */
                                       const int32_t *sel,    /* [T, topk] or NULL */
                                       const int32_t *pos,    /* [T] */
                                       const par_attn_dims *dm, int64_t k0, int64_t k1,
                                       int64_t nq);

/* ---- (5) grouped output projection -------------------------------------- */

/* r_g = o_g wo_a[g]^T per group of H/o_groups heads; y = r wo_b^T. */
void PAR_FN(par_attn_out_forward)(par_real *y,           /* [T, d] */
                                  par_real *r,           /* [T, o_groups*o_lora] */
                                  const par_real *o,     /* [T, H*hd] */
                                  const par_real *wo_a,  /* [o_groups*o_lora, H*hd/o_groups] */
                                  const par_real *wo_b,  /* [d, o_groups*o_lora] */
                                  const par_attn_dims *dm, int64_t T);
/* The first half: r_g = o_g wo_a[g]^T. */
void PAR_FN(par_attn_out_groups)(par_real *r,          /* [T, o_groups*o_lora] */
                                 const par_real *o,    /* [T, H*hd] */
                                 const par_real *wo_a, /* [o_groups*o_lora, H*hd/o_groups] */
                                 const par_attn_dims *dm, int64_t T);
par_status PAR_FN(par_attn_out_backward)(par_real *dout,       /* [T, H*hd] or NULL: d(o) += */
                                         par_real *dwo_a,      /* or NULL */
                                         par_real *dwo_b,      /* or NULL */
                                         const par_real *dy,   /* [T, d] */
                                         const par_real *r,    /* [T, o_groups*o_lora] */
                                         const par_real *o,    /* [T, H*hd] */
                                         const par_real *wo_a, /* [o_groups*o_lora, H*hd/o_groups] */
                                         const par_real *wo_b, /* [d, o_groups*o_lora] */
                                         const par_attn_dims *dm, int64_t T);

#endif
