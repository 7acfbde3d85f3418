/* model/model.h - the serial DeepSeek-V4 reference model: forward, backward
 * and update of one training step (MODEL.md, all sections; templated: see
 * kernels/real.h).
 *
 * A model holds the config, the parameter table (model/params.h), ONE flat
 * parameter buffer, ONE flat gradient buffer and the optimizer state (same
 * offsets), the int32 tid2eid tables, per-block RoPE tables and attention
 * sizes, and an arena (tag ACT) for a step's activations.
 *
 * The step is decomposed so that a parallel driver can call the same pieces
 * on slices (the serial reference is "world size 1 of the same code"):
 *   par_model_embed_forward/_backward     tokens -> X0 [T,n,d] (every stream = h)
 *   par_block_forward/_backward           one block on a token range of whole samples
 *   par_mtp_input_forward/_backward       X_L, mtp inputs -> the MTP block's input
 *   par_head_forward/_backward            hc_head, norm, logits, CE (main or MTP head)
 *   par_stats_*                           every cross-sample statistic (target counts,
 *                                         per-sample CE sums, loads, aux statistics,
 *                                         grad sum of squares) as partial sums with
 *                                         ONE combine step, where a parallel layout
 *                                         all-reduces them
 *   par_model_losses                      scalars from combined statistics
 *   par_model_update                      clip + Muon/AdamW + balance (model/optim.h)
 * par_model_step runs all of it serially on one global batch.
 *
 * Gradient order (fixed): main head, MTP head, MTP block, MTP input (its
 * embed rows), blocks n_layers-1 .. 0, embedding.
 */
#ifndef PAR_MODEL_MODEL_H
#define PAR_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/real.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/data.h"
#include "model/params.h"

/* ------------------------------------------------------------ statistics -- */

/* Everything of a step that sums over the global batch.  Each field is a sum
 * of per-token contributions, so partial statistics of disjoint token sets
 * add up (par_stats_combine) to the statistics of their union.  Samples are
 * numbered globally (0 .. Ns-1, rows in order, samples of a row in order);
 * per-sample arrays are touched only by the tokens of that sample, so with
 * whole samples per contributor the combine is exact. */
typedef struct {
    int64_t n_blocks, E, Ns;
    int64_t n_main;      /* tokens with a main target                */
    int64_t n_mtp;       /* tokens with an MTP target                */
    int64_t n_tokens;    /* tokens                                   */
    double *ce_main;     /* [Ns] per-sample sums of CE (double)      */
    double *ce_mtp;      /* [Ns]                                     */
    int64_t *loads;      /* [n_blocks, E] tokens routed to e         */
    int64_t *cnt;        /* [n_blocks, Ns, E] (score-routed blocks)  */
    par_real *psum;      /* [n_blocks, Ns, E]                        */
    int64_t *ntok;       /* [n_blocks, Ns]                           */
    double grad_sumsq;   /* sum of squared gradients                 */
} PAR_FN(par_stats);

par_status PAR_FN(par_stats_alloc)(PAR_FN(par_stats) *st, int64_t n_blocks, int64_t E, int64_t Ns);
void PAR_FN(par_stats_zero)(PAR_FN(par_stats) *st);
void PAR_FN(par_stats_free)(PAR_FN(par_stats) *st);
/* dst += src, field by field (the one reduction point).  PAR_EMISMATCH if
 * the sizes differ. */
par_status PAR_FN(par_stats_combine)(PAR_FN(par_stats) *dst, const PAR_FN(par_stats) *src);

/* The scalars of a step (GOLDEN.md out.*), in double. */
typedef struct {
    double loss, loss_main, loss_mtp, loss_aux;
    double grad_norm; /* before clipping */
} par_step_scalars;

/* ------------------------------------------------------------ activations -- */

/* What one block keeps between forward and backward (arena memory, except
 * the MoE layer's saved struct which par_block_act_release frees). */
typedef struct {
    int b;          /* block index (n_layers + i for mtp.i) */
    int64_t T;
    int hash;       /* hash-routed MoE */
    const par_real *Xin; /* [T, n, d] not owned */
    par_real *Xmid;      /* [T, n, d] after the attention sub-layer */
    par_real *Xout;      /* [T, n, d] after the MoE sub-layer       */
    PAR_FN(par_hc_saved) hca, hcf;
    par_real *xa, *xan, *rstda, *ya;  /* [T,d] [T,d] [T] [T,d] */
    PAR_FN(par_attn_saved) as;
    par_real *xf, *xfn, *rstdf, *yf;  /* [T,d] [T,d] [T] [T,d] */
    int32_t *idx;                     /* [T, K] */
    par_real *gw, *glog, *gs;         /* [T,K] [T,E] [T,E] */
    par_moe_saved ms;
} PAR_FN(par_block_act);

/* A head (main: top-level hc_head_* and norm; MTP: mtp.0's). */
typedef struct {
    int64_t T;
    const par_real *X;   /* [T, n, d] input, not owned */
    const int32_t *target; /* [T] -1 = none, not owned */
    PAR_FN(par_hc_head_saved) hs;
    par_real *x, *xn, *rstd; /* [T,d] [T,d] [T] */
    par_real *logits;        /* [T, V] */
    par_real *lse, *ce;      /* [T] [T] */
} PAR_FN(par_head_act);

/* The MTP input (MODEL.md 5). */
typedef struct {
    int64_t T;
    const par_real *XL;     /* [T, n, d] main last residual, not owned */
    const int32_t *ids;     /* [T] mtp inputs, not owned */
    par_real *emb, *en, *en_rstd, *ep; /* [T,d] [T,d] [T] [T,d] */
    par_real *hn, *hn_rstd;            /* [T*n, d] [T*n] */
    par_real *X0;                      /* [T, n, d] the MTP block's input */
} PAR_FN(par_mtp_act);

/* ------------------------------------------------------------------ model -- */

typedef struct {
    par_config cfg;
    par_param_table tab;
    uint64_t seed;
    int64_t n, d, V, E, K, I; /* hc_mult, dim, vocab, experts, active, inter */
    int n_blocks;             /* n_layers + n_mtp_layers */
    par_real *params;         /* [n_float] */
    par_real *grads;          /* [n_float] */
    par_real *opt_m, *opt_v;  /* [n_float] optimizer state (model/optim.h) */
    int32_t *i32;             /* [n_i32] tid2eid tables */
    par_rope *rope;           /* [n_blocks] */
    par_attn_dims *adims;     /* [n_blocks] */
    const par_real **ew;      /* [n_blocks, 3, E] expert weights w1,w2,w3 */
    par_real **egw;           /* [n_blocks, 3, E] their gradients */
    int64_t step;             /* updates applied so far */

    /* the current step (valid after par_model_forward until the next one) */
    par_arena arena;
    const par_batch *batch;
    int64_t T;
    int32_t *sample;          /* [T] global sample index of each token */
    par_real **X;             /* [n_layers + 1] residuals: X[0] embed, X[b+1] after block b */
    PAR_FN(par_block_act) *blk; /* [n_blocks] */
    PAR_FN(par_head_act) head, mtp_head;
    PAR_FN(par_mtp_act) mtp;
    PAR_FN(par_stats) stats;
    par_step_scalars last;
    int have_fwd;
} PAR_FN(par_model);

/* Builds the table of a validated config (refuses n_mtp_layers > 1),
 * allocates and initialises the parameters from `seed` (model/init.h).
 * Gradients and optimizer state start at zero. */
par_status PAR_FN(par_model_init)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed);
void PAR_FN(par_model_free)(PAR_FN(par_model) *M); /* zeroes *M; safe on a zeroed one */

/* Pointer to entry idx of the parameter table in `flat` (params or grads),
 * NULL for idx < 0. */
par_real *PAR_FN(par_model_ptr)(par_real *flat, const par_param_table *t, int idx);

/* ---- pieces (T tokens of whole samples; arrays [T] are token-indexed) ---- */

/* X0[t][i] = embed.weight[tokens[t]] for every stream i. */
void PAR_FN(par_model_embed_forward)(PAR_FN(par_model) *M, par_real *X0, /* [T, n, d] */
                                     const int32_t *tokens, /* [T] */ int64_t T);
/* dembed[tokens[t]] += sum_i dX0[t][i] (streams ascending; tokens ascending). */
par_status PAR_FN(par_model_embed_backward)(PAR_FN(par_model) *M, par_arena *ar,
                                            const par_real *dX0, /* [T, n, d] */
                                            const int32_t *tokens, /* [T] */ int64_t T);

/* One block b on T tokens: Xout = block(Xin).  `tokens` are the block's
 * input ids (hash routing), `sample` the global sample index of each token
 * (aux statistics into st; loads into st->loads).  Memory from `ar`. */
par_status PAR_FN(par_block_forward)(PAR_FN(par_model) *M, int b, PAR_FN(par_block_act) *a,
                                     par_arena *ar, const par_real *Xin, /* [T, n, d] */
                                     const int32_t *tokens, /* [T] */
                                     const int32_t *pos,    /* [T] */
                                     const int32_t *sample, /* [T] */
                                     PAR_FN(par_stats) *st, int64_t T);
/* dXin += d(loss)/dXin given dXout; parameter gradients into M->grads.  The
 * aux-loss gradient of a score-routed block uses st's (combined) cnt/ntok
 * and aux_scale (= aux_alpha; 0 skips it).  Scratch from `ar` (rewound). */
par_status PAR_FN(par_block_backward)(PAR_FN(par_model) *M, int b, PAR_FN(par_block_act) *a,
                                      par_arena *ar, par_real *dXin, /* [T, n, d] += */
                                      const par_real *dXout,         /* [T, n, d] */
                                      const int32_t *pos,            /* [T] */
                                      const int32_t *sample,         /* [T] */
                                      const PAR_FN(par_stats) *st, double aux_scale, int64_t T);
/* Frees what a block act holds outside the arena. */
void PAR_FN(par_block_act_release)(PAR_FN(par_block_act) *a);

/* Head `which` (0 main, 1 MTP): logits and per-token CE; CE sums per sample
 * into ce_sum[sample[t]] (st->ce_main or st->ce_mtp) for tokens with a target. */
par_status PAR_FN(par_head_forward)(PAR_FN(par_model) *M, int which, PAR_FN(par_head_act) *h,
                                    par_arena *ar, const par_real *X, /* [T, n, d] */
                                    const int32_t *target,            /* [T] */
                                    const int32_t *sample,            /* [T] */
                                    double *ce_sum,                   /* [Ns] += */
                                    int64_t T);
/* dX += d/dX of scale * sum_t CE_t (scale = 1/N_main or mtp_lambda/N_mtp). */
par_status PAR_FN(par_head_backward)(PAR_FN(par_model) *M, int which, PAR_FN(par_head_act) *h,
                                     par_arena *ar, par_real *dX, /* [T, n, d] += */
                                     double scale);

/* MTP input: X0 = e e_proj^T + hnorm(XL_j) h_proj^T. */
par_status PAR_FN(par_mtp_input_forward)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a,
                                         par_arena *ar, const par_real *XL, /* [T, n, d] */
                                         const int32_t *ids,               /* [T] */
                                         int64_t T);
par_status PAR_FN(par_mtp_input_backward)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a,
                                          par_arena *ar, par_real *dXL, /* [T, n, d] += */
                                          const par_real *dX0);         /* [T, n, d] */

/* Scalars from combined statistics (grad_norm from st->grad_sumsq). */
void PAR_FN(par_model_losses)(const PAR_FN(par_model) *M, const PAR_FN(par_stats) *st,
                              par_step_scalars *out);

/* ---- the serial step ---- */

/* Forward of the whole model on `batch` (kept by pointer until the next
 * forward): fills M->X, M->blk, the heads, M->stats and M->last's losses. */
par_status PAR_FN(par_model_forward)(PAR_FN(par_model) *M, const par_batch *batch);
/* Zeroes M->grads and back-propagates the loss of the last forward;
 * M->last.grad_norm = the global norm (before clipping). */
par_status PAR_FN(par_model_backward)(PAR_FN(par_model) *M);
/* Clip + Muon/AdamW + balance (one update, M->step += 1). */
par_status PAR_FN(par_model_update)(PAR_FN(par_model) *M);
/* forward + backward + update; *out (if not NULL) = M->last. */
par_status PAR_FN(par_model_step)(PAR_FN(par_model) *M, const par_batch *batch, par_step_scalars *out);

#endif
