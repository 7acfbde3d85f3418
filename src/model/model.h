/* model/model.h - the serial DeepSeek-V4 reference model: forward, backward
 * and update of one training step (MODEL.md, all sections; templated: see
 * kernels/real.h).
 *
 * A model holds the config, the parameter table (model/params.h), ONE flat
 * parameter buffer, ONE flat gradient buffer and the optimizer state (same
 * offsets), the int32 tid2eid tables, two RoPE tables (plain, YaRN), the attention
 * sizes, and an arena (tag ACT) for a step's activations.
 *
 * The step is decomposed so that a parallel driver can call the same pieces
 * on slices (the serial reference is "world size 1 of the same code"):
 *   par_model_embed_forward/_backward     tokens -> X0 [T,n,d] (every stream = h)
 *   par_block_forward/_backward           one block on a token range of whole samples
 *   par_mtp_input_forward/_backward       X_L, mtp inputs -> the MTP block's input
 *   par_head_forward/_backward            hc_head, norm, logits, CE (main or MTP head)
 *     each backward also in two passes, _input (B: the input gradient, the
 *     weight pass's inputs kept) and _weights (W: the weight gradients),
 *     bitwise the one pass (a zero-bubble pipeline runs W later); one
 *     implementation serves the three
 *   par_stats_*                           every cross-sample statistic (target counts,
 *                                         per-sample CE sums, loads, aux statistics,
 *                                         grad sum of squares) as partial sums with
 *                                         ONE combine step, where a parallel layout
 *                                         sums them (src/parallel/reduce/reduce.h)
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
#include "core/racc.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/real.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/data.h"
#include "model/mbctx.h"
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
    int64_t *cnt;        /* [n_rows, Ns, E] (score-routed blocks)    */
    par_real *psum;      /* [n_rows, Ns, E]                          */
    int64_t *ntok;       /* [n_rows, Ns]                             */
    par_real *aux;       /* [n_blocks, Ns] per-sample aux-loss terms (par_stats_aux_terms) */
    double grad_sumsq;   /* sum of squared gradients                 */
    par_racc *ce_acc;    /* the bitwise mode: [2] order-free sums behind ce_main, ce_mtp
                          * (par_stats_exact; NULL: plain sums)     */
    par_racc *psum_acc;  /* the bitwise mode: psum's terms, [n_rows, Ns, E] (not registered:
                          * par_stats_psum_terms deposits, par_reduce_mb_stats merges over CP,
                          * the aux terms settle it into psum first); NULL: plain */
    /* The per-sample arrays cover a window of the global batch's samples:
     * window sample q is global sample q0 + q.  The serial step's window is
     * the whole batch (q0 = 0, Ns = Ns_global); a data-parallel rank's is
     * the samples of its rows (src/parallel/step/exec_setup.c).  Ns_global is the
     * number of samples of the global batch (the aux-loss mean's
     * denominator). */
    int64_t q0, Ns_global;
    /* The blocks this holder computes (a pipeline rank: its stages'): block
     * b's rows of cnt, psum and ntok are row[b] (-1: none here); NULL: row
     * b, every block (n_rows = n_blocks). */
    int64_t n_rows;
    int32_t *row;        /* [n_blocks] or NULL */
} PAR_FN(par_stats);

/* Block b's row in cnt / psum / ntok, -1 when this holder has none. */
static inline int64_t PAR_FN(par_stats_row)(const PAR_FN(par_stats) *st, int64_t b)
{
    return b < 0 || b >= st->n_blocks ? -1 : st->row ? st->row[b] : b;
}

/* A window of Ns samples with q0 = 0, Ns_global = Ns (set them after for
 * another window), with rows for every block. */
par_status PAR_FN(par_stats_alloc)(PAR_FN(par_stats) *st, int64_t n_blocks, int64_t E, int64_t Ns);
/* The same with rows only for the blocks with held[b] != 0 (NULL: every
 * block): a pipeline rank's statistics are sized by its stages' blocks. */
par_status PAR_FN(par_stats_alloc_held)(PAR_FN(par_stats) *st, int64_t n_blocks, const uint8_t *held, int64_t E,
                                        int64_t Ns);
/* The window's per-sample terms only (ce_main, ce_mtp, loads, aux, the row
 * map): cnt, psum and ntok are NULL.  A pipeline executor keeps those per
 * microbatch in its (microbatch, stage) states (par_stats_view), for the microbatches in flight
 * instead of every sample of the step. */
par_status PAR_FN(par_stats_alloc_terms)(PAR_FN(par_stats) *st, int64_t n_blocks, const uint8_t *held, int64_t E,
                                         int64_t Ns);
/* *v = samples [q, q + nq) of win's window (window samples: the view's
 * sample 0 is win's q): cnt, psum and ntok zeroed in ar (the view's rows are
 * win's), loads and the row map win's own (shared, not copied), no
 * per-sample CE or aux arrays.  A view is never par_stats_free'd: ar owns
 * its arrays, win the rest. */
par_status PAR_FN(par_stats_view)(PAR_FN(par_stats) *v, const PAR_FN(par_stats) *win, par_arena *ar, int64_t q,
                                  int64_t nq);
void PAR_FN(par_stats_zero)(PAR_FN(par_stats) *st);
void PAR_FN(par_stats_free)(PAR_FN(par_stats) *st);
/* dst += src, field by field, for two partial statistics of the same window
 * (a layout whose ranks hold different windows combines in
 * src/parallel/reduce/reduce.c instead).  PAR_EMISMATCH if the sizes or windows
 * differ. */
par_status PAR_FN(par_stats_combine)(PAR_FN(par_stats) *dst, const PAR_FN(par_stats) *src);
/* st->aux[b*Ns + q] = the aux-loss term of window sample q in score-routed
 * block b: par_moe_aux_loss of that sample alone (0 for hash blocks, blocks
 * without rows here and empty samples).  The layer's loss is (sum over global samples ascending of
 * its terms) / Ns_global, bit for bit par_moe_aux_loss over all samples. */
void PAR_FN(par_stats_aux_terms)(PAR_FN(par_stats) *st, const par_param_table *tab, int K);
/* The same for the samples of view v (par_stats_view of win) in the listed
 * blocks: win->aux's terms of v's samples, bit for bit what
 * par_stats_aux_terms computes from whole-window statistics with the same
 * counts (entries < 0 of blocks skipped); the other blocks' terms are left
 * as they are. */
void PAR_FN(par_stats_aux_view)(PAR_FN(par_stats) *win, const PAR_FN(par_stats) *v, const int *blocks, int n,
                                const par_param_table *tab, int K);

/* The scalars of a step (GOLDEN.md out.*), in double. */
typedef struct {
    double loss, loss_main, loss_mtp, loss_aux;
    double grad_norm; /* before clipping */
} par_step_scalars;

/* ------------------------------------------------------------ activations -- */

/* What a block's input-gradient pass (B) leaves for its weight-gradient
 * pass (W): the gradients at the outputs of the ops that have weights, in
 * the arena of the B call (the weight GEMMs and norms of W read them with
 * the forward's saved activations; model/block.c). */
typedef struct {
    int pending;                /* 1 after B, until W                      */
    const int32_t *pos;         /* [T] not owned                           */
    par_real *dyf;              /* [T, d] MoE output (routed + shared)     */
    par_real *dw;               /* [T, K] routing weights (the gate)       */
    par_real *ds;               /* [T, E] aux-loss score gradient or NULL  */
    par_real *dxfn, *dxf;       /* [T, d] ffn_norm output, hc_ffn pre output */
    par_real *dpf, *dCf;        /* [T, n] [T, n, n] hc_ffn post, comb      */
    par_real *dya, *dxan, *dxa; /* [T, d] attention output, attn_norm output, hc_attn pre output */
    par_real *dpa, *dCa;        /* [T, n] [T, n, n]                        */
    PAR_FN(par_attn_keep) ak;   /* the serial attention's (a hook keeps its own) */
} PAR_FN(par_block_wkeep);

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
    par_real *gw, *glog, *gs;         /* [T,K] [T,E] [T,E]; glog, gs only during the forward (heap) */
    par_moe_saved ms;
    PAR_FN(par_block_wkeep) wk;       /* B -> W */
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
    /* B -> W (par_head_backward_input): the loss scale, the gradients of
     * the norm's output and of the hc_head combine's output */
    int pending;
    double scale;
    par_real *dxn, *dx;      /* [T,d] [T,d] */
} PAR_FN(par_head_act);

/* The MTP input (MODEL.md 5). */
typedef struct {
    int64_t T;
    const par_real *XL;     /* [T, n, d] main last residual, not owned */
    const int32_t *ids;     /* [T] mtp inputs, not owned */
    par_real *emb, *en, *en_rstd, *ep; /* [T,d] [T,d] [T] [T,d] */
    par_real *hn, *hn_rstd;            /* [T*n, d] [T*n] */
    par_real *X0;                      /* [T, n, d] the MTP block's input */
    /* B -> W (par_mtp_input_backward_input) */
    int pending;
    const par_real *dX0;               /* [T, n, d] the caller's, kept until W */
    par_real *dhn, *dep, *den, *demb;  /* [T*n, d] [T,d] [T,d] [T,d] */
} PAR_FN(par_mtp_act);

/* ------------------------------------------------------------------ model -- */

/* How a model holds an entry cut over a tensor-parallel group: block `rank`
 * of `P` of its rows (cut 1) or columns (cut 2), packed [rows/P, cols] or
 * [rows, cols/P] (parallel/layout/tp_split.h's PAR_TP_ROWS / PAR_TP_COLS). */
typedef struct {
    int16_t cut, rank, P;
} par_model_cut;

typedef struct PAR_FN(par_model_s) PAR_FN(par_model);


/* The routed-expert executor of the MoE sub-layer.  NULL functions = the
 * serial kernel path (par_moe_forward / par_moe_backward on every expert,
 * which must all be held).  A parallel layout (src/parallel/moe/ep.c) installs
 * its own once: fwd computes y = the MoE layer (routed experts in the
 * contract's per-token order, then the shared expert) of block b for the T
 * local tokens from the gate's idx and w; bwd (B) accumulates dx and dw (the
 * routing weights' gradient); wgt (W, after bwd of the same slot and block)
 * accumulates the held experts' and the shared expert's weight gradients
 * into M->grads.  x names the microbatch (the key of its state).  All collective
 * over whatever group ctx uses. */
typedef struct {
    par_status (*fwd)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b,
                      par_real *y,            /* [T, d] out */
                      const par_real *xin,    /* [T, d] normed input */
                      const int32_t *idx,     /* [T, K] ascending */
                      const par_real *w,      /* [T, K] */
                      const int32_t *tokens,  /* [T] the block's input ids */
                      int64_t T);
    par_status (*bwd)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b,
                      par_real *dx,           /* [T, d] += */
                      par_real *dw,           /* [T, K] += */
                      const par_real *dy,     /* [T, d] */
                      const par_real *xin,    /* [T, d] */
                      const par_real *w,      /* [T, K] */
                      int64_t T);
    par_status (*wgt)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b,
                      const par_real *dy,     /* [T, d] as given to bwd */
                      const par_real *xin,    /* [T, d] */
                      int64_t T);
    void *ctx;
} PAR_FN(par_moe_exec);

/* The attention executor of block b (the V4 attention layer, MODEL.md 3).
 * NULL functions = the serial kernels (par_attn_forward / _backward_input /
 * _backward_weights on the T local tokens).  A context-parallel layout
 * (src/parallel/cp/cp_hook.c) installs its own once: the local tokens are
 * slices of rows whose other parts live on other ranks (x->pos_rows); the
 * executor keeps its own saved state per (microbatch, block).  fwd: y =
 * Attention(xin) on the local tokens, sel (m == 4 layers, may be NULL) the
 * indexer picks as par_attn_forward's `selected`.  bwd (B): dx += and
 * dsink += as par_attn_backward_input; wgt (W): dW += every other
 * non-indexer weight.  All collective over whatever group ctx uses. */
typedef struct {
    par_status (*fwd)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b,
                      par_real *y,            /* [T, d] out */
                      int32_t *sel,           /* [T, topk] out, or NULL */
                      const par_real *xin,    /* [T, d] normed input */
                      const PAR_FN(par_attn_weights) *W, int64_t T);
    par_status (*bwd)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b,
                      par_real *dx,           /* [T, d] += */
                      par_real *dsink,        /* [H] += or NULL */
                      const par_real *dy,     /* [T, d] */
                      const PAR_FN(par_attn_weights) *W, int64_t T);
    par_status (*wgt)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b,
                      PAR_FN(par_attn_weights) *dW,
                      const par_real *dy,     /* [T, d] as given to bwd */
                      const PAR_FN(par_attn_weights) *W, int64_t T);
    void *ctx;
} PAR_FN(par_attn_exec);

/* The vocabulary executor: the embedding lookups (the main input and the
 * MTP input's) and the output heads' logits + cross-entropy (MODEL.md 2, 5,
 * 6).  NULL functions = the serial kernels.  A tensor-parallel layout
 * (src/parallel/tp/tp_vocab_hook.c) installs its own once: vocab-parallel,
 * without gathered logits.  embed: h = embed.weight[ids[t]]; embed_bwd (the
 * weight pass): embed.weight's gradient += dh by ids.  head: ce and lse of
 * the logits xn head.weight^T (x and which, 0 main / 1 MTP, key the call's
 * saved state, as the other executors' (microbatch, block)); logits is filled only when the executor keeps them for a
 * dump (`logits` = 1: the model then allocates them, else passes NULL and
 * holds no [T, V] buffer), else left as it is.  head_bwd: dxn += d/dxn of scale * sum_t CE_t
 * (NULL: not wanted) and, with weights, head.weight's gradient +=.  All
 * collective over whatever group ctx uses. */
typedef struct {
    par_status (*embed)(void *ctx, PAR_FN(par_model) *M,
                        par_real *h,            /* [T, d] out */
                        const int32_t *ids,     /* [T] */
                        int64_t T);
    par_status (*embed_bwd)(void *ctx, PAR_FN(par_model) *M,
                            const par_real *dh, /* [T, d] */
                            const int32_t *ids, /* [T] */
                            int64_t T);
    par_status (*head)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int which,
                       par_real *ce,            /* [T] out */
                       par_real *lse,           /* [T] out */
                       par_real *logits,        /* [T, V] out (dumps only) */
                       const par_real *xn,      /* [T, d] */
                       const int32_t *target,   /* [T] */
                       int64_t T);
    par_status (*head_bwd)(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int which,
                           par_real *dxn,       /* [T, d] += or NULL */
                           int weights, double scale);
    void *ctx;
    int logits; /* 1: head() fills logits (a dump keeps them); 0: logits is NULL */
} PAR_FN(par_vocab_exec);

struct PAR_FN(par_model_s) {
    par_config cfg;
    par_param_table tab;
    int tab_borrowed;         /* 1: tab is par_model_hold.tab's (not freed here) */
    uint64_t seed;
    int64_t n, d, V, E, K, I; /* hc_mult, dim, vocab, experts, active, inter */
    int n_blocks;             /* n_layers + n_mtp_layers */
    /* Ownership: the model holds the dense parameters and the routed experts
     * [e0, e1) of every block (the serial model: [0, E)).  Held float
     * entries are packed in table order into LOCAL flat buffers of n_local
     * elements; par_model_loc(M, idx) is entry idx's offset there (-1 when
     * not held; for the int32 entries, the offset into i32, which always
     * holds all).  Owning everything, it is tab.p[idx].offset.  Stored for
     * the table's dense entries (every entry but the routed experts', in
     * table order) and the HELD experts' only: loc_exp is [n_blocks, El, 3]
     * (El = e1 - e0), not [tab.n] per rank. */
    int64_t e0, e1;
    int64_t *loc;             /* [n_dense] dense entries, then loc_exp (one block) */
    int64_t *loc_exp;         /* [n_blocks, El, 3] held experts' w1, w2, w3 */
    int n_dense;              /* tab.n - n_blocks * 3 * E */
    int64_t n_local;
    par_real *params;         /* [n_local - n_shared] the model's own weights (par_model_ptr) */
    /* Replicated dense state held once per process (parallel/dp/replicas.h):
     * with a hold's share hook the held dense float entries come first in
     * the local order (offsets [0, n_shared)) and their weights live in shw,
     * the process's copy (not owned); the rest at params[loc - n_shared].
     * Without: shw NULL, n_shared 0, params [n_local].  Reach a weight with
     * par_model_ptr(M, M->params, idx), never params + loc. */
    par_real *shw;            /* [n_shared] or NULL */
    int64_t n_shared;
    /* entries held as tensor-parallel shards: cut[idx].cut != 0 (NULL: none;
     * par_model_numel is then the table's numel of every held entry) */
    par_model_cut *cut;       /* [tab.n] or NULL */
    par_real *grads;          /* [n_local] */
    /* The bitwise mode (cfg.bitwise): grads is registered with core/racc.h
     * and every contribution lands in racc instead (kernels deposit, the
     * reduction module merges); par_model_grads_settle rounds racc into
     * grads once the step's contributions are in.  Else racc.n == 0. */
    par_racc racc;
    par_real *opt_m, *opt_v;  /* [n_local] optimizer state (model/optim.h) */
    int32_t *i32;             /* [n_i32] tid2eid tables */
    PAR_FN(par_moe_exec) moe; /* routed-expert executor (zeroed: serial), installed once */
    PAR_FN(par_attn_exec) attn; /* attention executor (zeroed: serial), installed once */
    PAR_FN(par_vocab_exec) vocab; /* embedding / head executor (zeroed: serial), installed once */
    par_rope *rope;           /* [2]: m == 0 blocks' table, m > 0 blocks' (YaRN); adims[b].rope points at one */
    par_attn_dims *adims;     /* [n_blocks] */
    /* the held experts' weights w1, w2, w3 and their gradients, by held
     * expert l = e - e0 (El = e1 - e0 of them; NULL: a block not held):
     * read them through par_model_ew_row / par_model_egw_row */
    const par_real **ew;      /* [n_blocks, 3, El] */
    par_real **egw;           /* [n_blocks, 3, El] */
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
};

/* Where entry idx's offset is stored (par_model_loc), NULL for a routed
 * expert outside [e0, e1).  Internal: the build writes through it. */
static inline int64_t *PAR_FN(par__model_loc_at)(const PAR_FN(par_model) *M, int idx)
{
    const par_param *p = &M->tab.p[idx];
    if (p->expert >= 0) {
        if (p->expert < M->e0 || p->expert >= M->e1)
            return NULL;
        const int64_t k = idx - M->tab.blocks[p->layer].expert0 - 3 * (int64_t)p->expert;
        return M->loc_exp + ((int64_t)p->layer * (M->e1 - M->e0) + (p->expert - M->e0)) * 3 + k;
    }
    int64_t before = 0; /* routed-expert entries ahead of idx in the table */
    for (int b = 0; b < M->n_blocks; b++)
        before += M->tab.blocks[b].expert0 < idx ? 3 * M->E : 0;
    return M->loc + (idx - before);
}
/* Entry idx's offset in the local buffers (int32 entries: in i32), -1 when
 * not held (idx must be inside the table). */
static inline int64_t PAR_FN(par_model_loc)(const PAR_FN(par_model) *M, int idx)
{
    const int64_t *at = PAR_FN(par__model_loc_at)(M, idx);
    return at ? *at : -1;
}

/* Block b's held-expert pointers of kind k (0 w1, 1 w2, 2 w3): [El], entry
 * l is expert e0 + l's tensor (NULL: block b not held).  A model holding
 * every expert (e0 = 0, e1 = E) indexes them by expert. */
static inline const par_real **PAR_FN(par_model_ew_row)(const PAR_FN(par_model) *M, int b, int k)
{
    return M->ew + ((size_t)b * 3 + (size_t)k) * (size_t)(M->e1 - M->e0);
}
static inline par_real **PAR_FN(par_model_egw_row)(const PAR_FN(par_model) *M, int b, int k)
{
    return M->egw + ((size_t)b * 3 + (size_t)k) * (size_t)(M->e1 - M->e0);
}

/* Builds the table of a validated config (refuses n_mtp_layers > 1),
 * allocates and initialises the parameters from `seed` (model/init.h).
 * Gradients and optimizer state start at zero.  Owns every expert. */
par_status PAR_FN(par_model_init)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed);
/* The same holding only the routed experts [e0, e1) of every block (0 <= e0
 * < e1 <= E, else PAR_EINVAL); each held tensor has the serial model's
 * values (slice init). */
par_status PAR_FN(par_model_init_owned)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed,
                                        int64_t e0, int64_t e1);
/* Which dense parts a pipeline rank holds (parallel/step/exec.h): the tensors of
 * the blocks with blocks[b] != 0 (NULL: every block), embed.weight, head.weight
 * and the main head's norm.weight + hc_head_* ("final").  NULL hold = all. */
typedef struct {
    const uint8_t *blocks; /* [n_blocks] */
    int embed, head, final;
    /* a parameter table of the same config to borrow instead of building one
     * (read-only, shared by the ranks of a process; must outlive the model);
     * NULL, or a table of another config: the model builds its own */
    const par_param_table *tab;
    /* the held dense weights from storage shared with other ranks of the
     * process (parallel/dp/replicas.h), or NULL: the model's own.  Called once
     * by the build after the ownership map (dense entries first, M->n_shared
     * their floats) with the model (a PAR_FN(par_model) *): it sets M->shw to
     * the process's copy, filled by the first model through
     * par_model_fill_shared, or leaves it NULL (then the model holds its own
     * copy); a failure stops the build */
    par_status (*share)(void *ctx, void *model);
    void *share_ctx;
    /* tensor-parallel storage (parallel/layout/tp_split.h), or NULL: every entry
     * whole.  Called once per float entry by the build: returns how the
     * model holds it (0 whole; 1 rows, 2 cols: block *rank of *P equal
     * blocks of that dimension, the values par_tp_slice of the serial init) */
    int (*cut_of)(void *ctx, const char *name, int *rank, int *P);
    void *cut_ctx;
    /* under a recipe (kernels/recipe.h), for cut entries: the element-wise
     * max of n tile amaxes over the group that cuts `name` (NULL: none) */
    par_status (*tile_max)(void *ctx, const char *name, double *amax, int64_t n);
    void *tile_ctx;
} par_model_hold;

/* par_model_init_owned holding only what `hold` names (routed experts
 * [e0, e1) of the held blocks); unheld entries have loc = -1. */
par_status PAR_FN(par_model_init_held)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed,
                                       int64_t e0, int64_t e1, const par_model_hold *hold);
void PAR_FN(par_model_free)(PAR_FN(par_model) *M); /* zeroes *M; safe on a zeroed one */
/* The initial values of M's shared entries (local offsets [0, n_shared))
 * into w [n_shared]: what a share hook fills a new copy with. */
par_status PAR_FN(par_model_fill_shared)(const PAR_FN(par_model) *M, par_real *w /* [n_shared] */);

/* Pointer to entry idx in one of M's local flat buffers (params, grads,
 * opt_m, opt_v), NULL for idx < 0 or an entry M does not hold.  flat ==
 * M->params means the weights: a shared entry's are in M->shw. */
par_real *PAR_FN(par_model_ptr)(const PAR_FN(par_model) *M, par_real *flat, int idx);
/* 1 when M holds entry idx (float entries; int32 entries are always held). */
int PAR_FN(par_model_holds)(const PAR_FN(par_model) *M, int idx);
/* Elements of entry idx M holds: its shard's when held cut (M->cut), the
 * table's numel when whole, 0 when not held. */
int64_t PAR_FN(par_model_numel)(const PAR_FN(par_model) *M, int idx);
/* The cut M holds entry idx with, or NULL when it holds it whole (or not). */
const par_model_cut *PAR_FN(par_model_cut_of)(const PAR_FN(par_model) *M, int idx);
/* Sum of squares of the held gradients (par_grad_sumsq over held entries,
 * table order).  If per_entry is not NULL, per_entry[idx] = entry idx's sum
 * (0 where not held or without gradient). */
double PAR_FN(par_model_grad_sumsq)(const PAR_FN(par_model) *M, double *per_entry /* [tab.n] */);

/* Sum of squares of x[0..n): par_sumsq's element-order sum, or in the
 * bitwise mode the order-free sum (core/racc.h) of the squares, whose bits
 * do not depend on how an entry is cut between ranks. */
/* The bitwise mode: ce_main and ce_mtp become order-free sums (core/racc.h,
 * registered behind the buffers: the heads deposit a term per token, the
 * reduction module merges them over CP); par_stats_settle rounds them into
 * the buffers before the losses read them.  Idempotent. */
par_status PAR_FN(par_stats_exact)(PAR_FN(par_stats) *st);
void PAR_FN(par_stats_settle)(PAR_FN(par_stats) *st);
/* The bitwise mode's psum: token t's terms s_te / sum_e s_te into psum_acc
 * (row r of the statistics), as par_moe_aux_stats adds them to psum. */
void PAR_FN(par_stats_psum_terms)(PAR_FN(par_stats) *st, int64_t r, const par_real *s, const int32_t *sample_of,
                                  int64_t T);

double PAR_FN(par_model_sumsq)(const PAR_FN(par_model) *M, const par_real *x, int64_t n);

/* Every gradient zeroed (grads, and in the bitwise mode the accumulator). */
void PAR_FN(par_model_grads_zero)(PAR_FN(par_model) *M);

/* The bitwise mode: rounds the accumulator into grads, after checking that
 * no contribution bypassed it (grads still all zero: PAR_EINTERNAL naming
 * the first entry written directly).  Called once per step, after the last
 * contribution and before anything reads grads (the serial backward's end,
 * the parallel step's par_finalize_grads).  A no-op outside the mode. */
par_status PAR_FN(par_model_grads_settle)(PAR_FN(par_model) *M);

/* ---- pieces (T tokens of whole samples; arrays [T] are token-indexed) ---- */

/* X0[t][i] = embed.weight[tokens[t]] for every stream i (through M->vocab
 * when set: its status, else PAR_OK). */
par_status PAR_FN(par_model_embed_forward)(PAR_FN(par_model) *M, par_real *X0, /* [T, n, d] */
                                     const int32_t *tokens, /* [T] */ int64_t T);
/* dembed[tokens[t]] += sum_i dX0[t][i] (streams ascending; tokens ascending). */
par_status PAR_FN(par_model_embed_backward)(PAR_FN(par_model) *M, par_arena *ar,
                                            const par_real *dX0, /* [T, n, d] */
                                            const int32_t *tokens, /* [T] */ int64_t T);

/* One block b on T tokens: Xout = block(Xin).  `tokens` are the block's
 * input ids (hash routing), `sample` the sample index of each token in st's
 * window (global sample st->q0 + sample[t]; aux statistics into st; loads
 * into st->loads).  The routed experts and the attention run through M->moe
 * / M->attn when set, with x (the microbatch; NULL: microbatch 0, no row
 * context).  Memory from `ar`. */
par_status PAR_FN(par_block_forward)(PAR_FN(par_model) *M, const par_mbctx *x, int b, PAR_FN(par_block_act) *a,
                                     par_arena *ar, const par_real *Xin, /* [T, n, d] */
                                     const int32_t *tokens, /* [T] */
                                     const int32_t *pos,    /* [T] */
                                     const int32_t *sample, /* [T] */
                                     PAR_FN(par_stats) *st, int64_t T);
/* The backward of a block in two passes, as a zero-bubble pipeline runs it
 * (B, then W later).  B: dXin += d(loss)/dXin given dXout; the aux-loss
 * gradient of a score-routed block uses st's (combined) cnt/ntok and
 * aux_scale (= aux_alpha; 0 skips it); the gradients W needs stay in a->wk
 * (arena memory from `ar`, kept: the caller's arena holds them until W);
 * attn_sink's gradient (a by-product of the softmax backward) accumulates
 * here.  W: every other weight gradient of the block into M->grads, from
 * a->wk and the forward's activations (scratch from `ar`, rewound).  The
 * split moves no bit: each weight gradient is the same GEMM or sum on the
 * same inputs as in one pass. */
par_status PAR_FN(par_block_backward_input)(PAR_FN(par_model) *M, const par_mbctx *x, int b,
                                            PAR_FN(par_block_act) *a, par_arena *ar,
                                            par_real *dXin,          /* [T, n, d] += */
                                            const par_real *dXout,   /* [T, n, d] */
                                            const int32_t *pos,      /* [T] */
                                            const int32_t *sample,   /* [T] */
                                            const PAR_FN(par_stats) *st, double aux_scale, int64_t T);
par_status PAR_FN(par_block_backward_weights)(PAR_FN(par_model) *M, const par_mbctx *x, int b,
                                              PAR_FN(par_block_act) *a, par_arena *ar);
/* The one-pass backward (B and W at once, the same bits); all scratch
 * rewound. */
par_status PAR_FN(par_block_backward)(PAR_FN(par_model) *M, const par_mbctx *x, int b, PAR_FN(par_block_act) *a,
                                      par_arena *ar, par_real *dXin, /* [T, n, d] += */
                                      const par_real *dXout,         /* [T, n, d] */
                                      const int32_t *pos,            /* [T] */
                                      const int32_t *sample,         /* [T] */
                                      const PAR_FN(par_stats) *st, double aux_scale, int64_t T);
/* Frees what a block act holds outside the arena. */
void PAR_FN(par_block_act_release)(PAR_FN(par_block_act) *a);

/* Head `which` (0 main, 1 MTP) of microbatch x (as par_block_forward's; NULL:
 * microbatch 0): logits and per-token CE; CE sums per sample into
 * ce_sum[sample[t]] (st->ce_main or st->ce_mtp) for tokens with a target. */
par_status PAR_FN(par_head_forward)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                    par_arena *ar, const par_real *X, /* [T, n, d] */
                                    const int32_t *target,            /* [T] */
                                    const int32_t *sample,            /* [T] */
                                    double *ce_sum,                   /* [Ns] += */
                                    int64_t T);
/* dX += d/dX of scale * sum_t CE_t (scale = 1/N_main or mtp_lambda/N_mtp).
 * _input (B) keeps what _weights (W: head.weight, the norm, hc_head_*)
 * needs in h (arena memory from `ar`); par_head_backward is one pass. */
par_status PAR_FN(par_head_backward_input)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                           par_arena *ar, par_real *dX, /* [T, n, d] += */
                                           double scale);
par_status PAR_FN(par_head_backward_weights)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                             par_arena *ar);
par_status PAR_FN(par_head_backward)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                     par_arena *ar, par_real *dX, /* [T, n, d] += */
                                     double scale);

/* MTP input: X0 = e e_proj^T + hnorm(XL_j) h_proj^T. */
par_status PAR_FN(par_mtp_input_forward)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a,
                                         par_arena *ar, const par_real *XL, /* [T, n, d] */
                                         const int32_t *ids,               /* [T] */
                                         int64_t T);
/* dXL += ; _input (B) keeps dX0 (the caller's memory must live until W) and
 * the inner gradients; _weights (W): h_proj, hnorm, e_proj, enorm and the
 * embedding rows of the MTP inputs. */
par_status PAR_FN(par_mtp_input_backward_input)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a,
                                                par_arena *ar, par_real *dXL, /* [T, n, d] += */
                                                const par_real *dX0);         /* [T, n, d] */
par_status PAR_FN(par_mtp_input_backward_weights)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a);
par_status PAR_FN(par_mtp_input_backward)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a,
                                          par_arena *ar, par_real *dXL, /* [T, n, d] += */
                                          const par_real *dX0);         /* [T, n, d] */

/* Scalars from combined statistics of the whole batch (one window; fills
 * st->aux; grad_norm from st->grad_sumsq). */
void PAR_FN(par_model_losses)(const PAR_FN(par_model) *M, PAR_FN(par_stats) *st,
                              par_step_scalars *out);
/* The same from per-sample terms of all Ns samples of the global batch in
 * order: ce sums [Ns], aux terms [n_blocks, Ns] (par_stats_aux_terms).
 * grad_norm is left 0. */
void PAR_FN(par_model_losses_from)(const PAR_FN(par_model) *M, int64_t n_main, int64_t n_mtp,
                                   const double *ce_main, /* [Ns] */
                                   const double *ce_mtp,  /* [Ns] */
                                   const par_real *aux,   /* [n_blocks, Ns] */
                                   int64_t Ns, par_step_scalars *out);

/* ---- the serial step ---- */

/* Forward of the whole model on `batch` (kept by pointer until the next
 * forward): fills M->X, M->blk, the heads, M->stats and M->last's losses. */
par_status PAR_FN(par_model_forward)(PAR_FN(par_model) *M, const par_batch *batch);
/* Zeroes M->grads and back-propagates the loss of the last forward (scales
 * from M->stats' n_main / n_mtp / Ns_global: a parallel layout combines the
 * statistics between forward and backward);
 * M->last.grad_norm = the norm of the held gradients (before clipping). */
par_status PAR_FN(par_model_backward)(PAR_FN(par_model) *M);
/* What a row-blocked step keeps of its forward for a golden set, each in
 * the global batch's token order (NULL pointers: not kept). */
typedef struct {
    par_real *logits, *mtp_logits; /* [T, V] */
    par_real **act;                /* [n_blocks] pointers, each [T, n, d] (block outputs) */
    int32_t **idx;                 /* [n_blocks] pointers, each [T, K] */
    int32_t **sel;                 /* [n_blocks] pointers, each [T, index_topk] (ratio-4 blocks, else NULL) */
} PAR_FN(par_model_keep);
/* Forward + backward of `batch` over row blocks of `rows` rows (the last
 * may be shorter), gradients accumulated block after block: the serial
 * golden of a batch whose one-shot activations do not fit.  The statistics
 * window is the whole batch (global sample numbers, the batch's counts as
 * the loss scales); each block's forward, then its backward into M->grads
 * (+=), then its rows copied into keep; its activations are released before
 * the next.  A weight gradient is ((g_0 + g_1) + g_2) + ... over the blocks
 * in row order, each g_j in its kernel's order over the block's tokens.
 * After it, as after par_model_forward + par_model_backward: M->stats,
 * M->last (losses, grad_norm) and M->grads ready for par_model_update; no
 * activations are held (write the step from keep). */
par_status PAR_FN(par_model_forward_backward_rows)(PAR_FN(par_model) *M, const par_batch *batch, int64_t rows,
                                                   const PAR_FN(par_model_keep) *keep);
/* Clip (from M->stats.grad_sumsq) + Muon/AdamW on every held entry +
 * balance (from M->stats.loads, n_tokens); one update, M->step += 1. */
par_status PAR_FN(par_model_update)(PAR_FN(par_model) *M);
/* forward + backward + update; *out (if not NULL) = M->last. */
par_status PAR_FN(par_model_step)(PAR_FN(par_model) *M, const par_batch *batch, par_step_scalars *out);

#endif
