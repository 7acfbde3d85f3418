/* kernels/moe.h - the V4 mixture of experts (MODEL.md sections 4 and 6).
 *
 * Templated (see kernels/real.h): every function is spelled PAR_FN(name).
 * Dimensions: T tokens, d = dim, E = n_routed_experts, K = n_activated_experts,
 * I = moe_inter_dim, L = swiglu_limit (L <= 0 disables the clamps).
 * Weights are [out, in], Linear_W(x) = x W^T.  Forward functions overwrite
 * their outputs; backward functions ACCUMULATE (+=) into every gradient
 * output, and any gradient output may be NULL when not wanted.
 *
 * Pieces:
 *   gate      logits = x Wg^T, s = sqrt(softplus(logits)), idx [T,K] ascending,
 *             w [T,K] = route_scale * s_idx / sum_{idx} s        (in idx order)
 *   expert    y = (rw * silu(min(x w1^T, L)) * clamp(x w3^T, -L, L)) w2^T
 *   layer     y[t] = sum over k (idx ascending) of E_{idx[t][k]}(x_t, w[t][k])
 *                    + E_shared(x_t, 1)
 *   balance   loads, per-sample aux-loss statistics, the aux loss and its
 *             backward into ds_extra (the gradient wrt s).
 *
 * THE PER-TOKEN SUM ORDER (the contract the expert-parallel layout reproduces
 * bitwise; see par_moe_combine):
 *   v = out[t][0]; v += out[t][1]; ...; v += out[t][K-1]; v += shared[t]
 * where out[t][k] is the output of expert idx[t][k] (idx ascending), already
 * scaled by its routing weight.  It does not depend on how tokens are batched
 * per expert.  Backward: dx[t] += (the same sum of the per-slot input
 * gradients, then the shared expert's); see par_moe_backward.
 */
#ifndef PAR_KERNELS_MOE_H
#define PAR_KERNELS_MOE_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"

/* ---------------------------------------------------------------- gate -- */

/* The closed-form hash table of MODEL.md section 4:
 *   table[t][j] = ((t mod E) + j * floor(E/K)) mod E,   t < V, j < K.
 * Its K entries per row are distinct (not sorted).  Needs 1 <= K <= E. */
par_status PAR_FN(par_moe_tid2eid)(int32_t *table, /* [V, K] */
                                   int64_t V, int E, int K);

/* Gate forward.
 *   logits = x wg^T (saved), s = sqrt(softplus(logits)) (saved; evaluated in
 *   double, rounded to par_real).
 * Selection:
 *   tid2eid != NULL (hash layer): idx[t] = tid2eid[tokens[t]] sorted ascending
 *     (entries must be distinct and in [0,E); tokens in [0,V)); bias ignored.
 *   tid2eid == NULL (score layer): the top K of s_e + bias_e (bias may be NULL
 *     = 0; the sum is taken in par_real; ties go to the lower e), stored
 *     ascending.
 * Weights: w[t][k] = (s[t][idx[t][k]] / S_t) * route_scale  (in that order),
 *   S_t = sum over k ascending of s[t][idx[t][k]] (par_real), unbiased scores,
 *   hash layers too.  PAR_ERANGE if some S_t == 0 (all selected scores
 *   underflowed). */
par_status PAR_FN(par_moe_gate_forward)(int32_t *idx,            /* [T, K] out, ascending */
                                        par_real *w,             /* [T, K] out */
                                        par_real *logits,        /* [T, E] out */
                                        par_real *s,             /* [T, E] out */
                                        const par_real *x,       /* [T, d] */
                                        const par_real *wg,      /* [E, d] */
                                        const par_real *bias,    /* [E] or NULL */
                                        const int32_t *tid2eid,  /* [V, K] or NULL */
                                        const int32_t *tokens,   /* [T] (hash layers) */
                                        int64_t V, int64_t T, int64_t d, int E, int K,
                                        double route_scale);

/* The exact ties of a score layer's selection (the router's part of a
 * golden's ties.K, docs/golden.md "ties.K"): for each row t, with
 * v_e = s[t][e] + bias[e] summed in par_real exactly as the gate forward
 * does (bias NULL = 0), let b_K be the K-th largest v.  When the (K+1)-th
 * largest equals b_K (K < E; an exact tie at the top-K boundary, which the
 * lower-index rule decides), tie[t][e] = 1 for every e with v_e == b_K
 * (the experts another tie order may pick instead), else the row is all 0.
 * counts[0] = rows that make a choice (T when K < E, else 0), counts[1] =
 * rows with such a tie.  Scores must be finite (the forward refuses
 * others); PAR_EINVAL for bad dimensions. */
par_status PAR_FN(par_moe_gate_ties)(int32_t *tie,          /* [T, E] out */
                                     int64_t counts[2],
                                     const par_real *s,     /* [T, E] */
                                     const par_real *bias,  /* [E] or NULL */
                                     int64_t T, int E, int K);

/* The gate's logits = x Wg^T: what par_moe_gate_forward computes first, so
 * a caller that keeps only x gets the same bits back in its backward. */
void PAR_FN(par_moe_gate_logits)(par_real *logits,   /* [T, E] out */
                                 const par_real *x,  /* [T, d] */
                                 const par_real *wg, /* [E, d] */
                                 int64_t T, int64_t d, int E);

/* The scores s = sqrt(softplus(logits)) of n logits (in double, rounded to
 * par_real): what the gate forward saves as s, so a caller that keeps only
 * the logits gets the same bits back. */
void PAR_FN(par_moe_gate_scores)(par_real *s,            /* [n] out */
                                 const par_real *logits, /* [n] */
                                 int64_t n);

/* Gate backward.  dw = dLoss/dw [T,K] (may be NULL), ds_extra = an extra
 * dLoss/ds [T,E] (the aux loss; may be NULL).  Chain:
 *   ds[t][idx_k] += (route_scale * dw_k - sum_j dw_j w_j) / S_t
 *   dlogit = ds * sigmoid(l) / (2 sqrt(softplus(l)))     (in double; for
 *            softplus(l) underflowing to 0 the limit exp(l/2)/2)
 *   dx += dlogit wg ; dwg += dlogit^T x.
 * Selection (idx) and bias carry no gradient.  PAR_ENOMEM on workspace
 * allocation failure. */
par_status PAR_FN(par_moe_gate_backward)(par_real *dx,             /* [T, d] or NULL */
                                         par_real *dwg,            /* [E, d] or NULL */
                                         const par_real *dw,       /* [T, K] or NULL */
                                         const par_real *ds_extra, /* [T, E] or NULL */
                                         const par_real *x,        /* [T, d] */
                                         const par_real *wg,       /* [E, d] */
                                         const par_real *logits,   /* [T, E] */
                                         const par_real *s,        /* [T, E] */
                                         const int32_t *idx,       /* [T, K] */
                                         const par_real *w,        /* [T, K] */
                                         int64_t T, int64_t d, int E, int K,
                                         double route_scale);

/* -------------------------------------------------------------- expert -- */

/* The hidden units of par_moe_expert_forward (g, u, h), without y. */
void PAR_FN(par_moe_expert_hidden)(par_real *g,        /* [n, I] */
                                   par_real *u,        /* [n, I] */
                                   par_real *h,        /* [n, I] */
                                   const par_real *x,  /* [n, d] */
                                   const par_real *rw, /* [n] or NULL */
                                   const par_real *w1, /* [I, d] */
                                   const par_real *w3, /* [I, d] */
                                   int64_t n, int64_t d, int64_t I, double L);

/* One expert on n gathered rows:
 *   g = x w1^T, u = x w3^T, h = swiglu(g, u, rw, L) (rw applied BEFORE w2,
 *   par_swiglu_forward), y = h w2^T.  g, u, h are saved.  rw NULL = 1. */
void PAR_FN(par_moe_expert_forward)(par_real *y,        /* [n, d] */
                                    par_real *g,        /* [n, I] saved */
                                    par_real *u,        /* [n, I] saved */
                                    par_real *h,        /* [n, I] saved */
                                    const par_real *x,  /* [n, d] */
                                    const par_real *rw, /* [n] or NULL */
                                    const par_real *w1, /* [I, d] */
                                    const par_real *w2, /* [d, I] */
                                    const par_real *w3, /* [I, d] */
                                    int64_t n, int64_t d, int64_t I, double L);

/* Expert backward: dh = dy w2, dw2 += dy^T h, (dg, du, drw) from swiglu,
 * dx += dg w1 then += du w3, dw1 += dg^T x, dw3 += du^T x.
 * Weight gradients sum over the n rows in the given row order (one GEMM).
 * PAR_ENOMEM on workspace allocation failure. */
par_status PAR_FN(par_moe_expert_backward)(par_real *dx,        /* [n, d] or NULL */
                                           par_real *dw1,       /* [I, d] or NULL */
                                           par_real *dw2,       /* [d, I] or NULL */
                                           par_real *dw3,       /* [I, d] or NULL */
                                           par_real *drw,       /* [n] or NULL */
                                           const par_real *dy,  /* [n, d] */
                                           const par_real *x,   /* [n, d] */
                                           const par_real *rw,  /* [n] or NULL */
                                           const par_real *w1,  /* [I, d] */
                                           const par_real *w2,  /* [d, I] */
                                           const par_real *w3,  /* [I, d] */
                                           const par_real *g,   /* [n, I] */
                                           const par_real *u,   /* [n, I] */
                                           const par_real *h,   /* [n, I] */
                                           int64_t n, int64_t d, int64_t I, double L);

/* --------------------------------------------------------------- layer -- */

/* Experts' weights as arrays of E pointers, so a caller can point into its
 * flat parameter buffer.  The shared expert's pointers may all be NULL (no
 * shared expert). */
typedef struct {
    const par_real *const *w1; /* [E] pointers, each [I, d] */
    const par_real *const *w2; /* [E] pointers, each [d, I] */
    const par_real *const *w3; /* [E] pointers, each [I, d] */
    const par_real *sw1;       /* [I, d] shared, or NULL */
    const par_real *sw2;       /* [d, I] shared, or NULL */
    const par_real *sw3;       /* [I, d] shared, or NULL */
} par_moe_weights;

/* Gradients, same layout; any array pointer, any element of one, or any
 * shared pointer may be NULL (not wanted).  Accumulated (+=). */
typedef struct {
    par_real *const *w1; /* [E] pointers, each [I, d], or NULL */
    par_real *const *w2; /* [E] pointers, each [d, I], or NULL */
    par_real *const *w3; /* [E] pointers, each [I, d], or NULL */
    par_real *sw1;       /* [I, d] or NULL */
    par_real *sw2;       /* [d, I] or NULL */
    par_real *sw3;       /* [I, d] or NULL */
} par_moe_grads;

/* What the serial layer saves for its backward (allocated with tag ACT). */
typedef struct {
    int64_t T, d, I;
    int E, K;
    int64_t *off;   /* [E+1] first gathered row of expert e; off[E] = T*K */
    int32_t *tok;   /* [T*K] token of each gathered row (expert-major, ascending t) */
    int32_t *slot;  /* [T*K] k with idx[tok][k] == e */
    par_real *g;    /* [T*K, I] routed experts, gathered-row order */
    par_real *u;    /* [T*K, I] */
    par_real *h;    /* [T*K, I] */
    par_real *sg;   /* [T, I] shared expert */
    par_real *su;   /* [T, I] */
    par_real *sh;   /* [T, I] */
} par_moe_saved;

par_status PAR_FN(par_moe_saved_alloc)(par_moe_saved *sv, int64_t T, int64_t d, int E, int K,
                                       int64_t I);
void PAR_FN(par_moe_saved_free)(par_moe_saved *sv); /* zeroes *sv; safe on a zeroed one */

/* The contract's per-token sum (see the top of this file):
 *   v = slots[t][0]; v += slots[t][k] for k = 1..K-1; v += shared[t] (if not NULL)
 *   y[t] = v            (accumulate == 0)
 *   y[t] += v           (accumulate != 0)
 * Element-wise over d; one thread owns each row. */
void PAR_FN(par_moe_combine)(par_real *y,             /* [T, d] */
                             const par_real *slots,   /* [T, K, d] */
                             const par_real *shared,  /* [T, d] or NULL */
                             int64_t T, int K, int64_t d, int accumulate);

/* The serial MoE layer.  For each expert e ascending: gather its tokens
 * (ascending t) with their routing weights, run par_moe_expert_forward, put
 * each output row into its token's slot k; then the shared expert on all T
 * rows (rw = 1); then y = par_moe_combine(slots, shared).  idx must be
 * ascending per token and distinct (PAR_EINVAL otherwise). */
par_status PAR_FN(par_moe_forward)(par_real *y,                /* [T, d] */
                                   par_moe_saved *sv,          /* from par_moe_saved_alloc(T,d,E,K,I) */
                                   const par_real *x,          /* [T, d] */
                                   const int32_t *idx,         /* [T, K] ascending */
                                   const par_real *w,          /* [T, K] */
                                   const par_moe_weights *W,
                                   int64_t T, int64_t d, int E, int K, int64_t I, double L);

/* Backward of par_moe_forward: per expert ascending, the gathered rows'
 * input gradients go to per-token slots; then
 *   dx[t] += par_moe_combine(slot dx, shared dx)  (same order as forward);
 * weight gradients per expert (rows ascending t); dw[t][k] += drw of the
 * slot.  PAR_ENOMEM on workspace allocation failure. */
par_status PAR_FN(par_moe_backward)(par_real *dx,               /* [T, d] or NULL */
                                    const par_moe_grads *dW,    /* or NULL */
                                    par_real *dw,               /* [T, K] or NULL */
                                    const par_real *dy,         /* [T, d] */
                                    const par_real *x,          /* [T, d] */
                                    const par_real *w,          /* [T, K] */
                                    const par_moe_weights *W,
                                    const par_moe_saved *sv,
                                    double L);

/* ------------------------------------------------------------- balance -- */

/* loads[e] += #{t : e in idx[t]}  (zero it first for a fresh count). */
void PAR_FN(par_moe_count_loads)(int64_t *loads,      /* [E] */
                                 const int32_t *idx,  /* [T, K] */
                                 int64_t T, int E, int K);

/* Per-sample aux statistics, ACCUMULATED (+=) so partial token sets can be
 * added (zero them first for a fresh count):
 *   cnt[q][e]  += #{t : sample_of[t] == q, e in idx[t]}
 *   psum[q][e] += sum over those t (ascending) of s[t][e] / sum_e' s[t][e']
 *                 (the denominator summed over e' ascending, par_real)
 *   ntok[q]    += #{t : sample_of[t] == q}
 * sample_of[t] in [0, Ns) (PAR_ERANGE otherwise). */
par_status PAR_FN(par_moe_aux_stats)(int64_t *cnt,             /* [Ns, E] */
                                     par_real *psum,           /* [Ns, E] */
                                     int64_t *ntok,            /* [Ns] */
                                     const par_real *s,        /* [T, E] */
                                     const int32_t *idx,       /* [T, K] */
                                     const int32_t *sample_of, /* [T] */
                                     int64_t T, int E, int K, int64_t Ns);

/* The layer's aux loss from (all-reduced) statistics:
 *   L = (1/Ns_global) * sum_q sum_e (E/(K*T_q)) * cnt[q][e] * (psum[q][e]/T_q)
 * T_q = ntok[q]; samples with T_q == 0 are skipped.  Summed q ascending, e
 * ascending, in par_real.  Ns_global = the number of samples in the global
 * batch (the mean's denominator). */
par_real PAR_FN(par_moe_aux_loss)(const int64_t *cnt,   /* [Ns, E] */
                                  const par_real *psum, /* [Ns, E] */
                                  const int64_t *ntok,  /* [Ns] */
                                  int64_t Ns, int64_t Ns_global, int E, int K);

/* Backward of par_moe_aux_loss times `scale` (= dLoss/dL) into ds_extra:
 * f_e is constant; with c_e = scale * E * cnt[q][e] / (Ns_global * K * T_q^2),
 * p_e = s_e / S_t and S_t = sum_e s[t][e]:
 *   ds_extra[t][e] += (c_e - sum_e' c_e' p_e') / S_t.
 * cnt and ntok are the global (all-reduced) statistics; s and sample_of are
 * this caller's tokens. */
par_status PAR_FN(par_moe_aux_backward)(par_real *ds_extra,       /* [T, E] */
                                        const int64_t *cnt,       /* [Ns, E] */
                                        const int64_t *ntok,      /* [Ns] */
                                        const par_real *s,        /* [T, E] */
                                        const int32_t *sample_of, /* [T] */
                                        int64_t T, int E, int K, int64_t Ns,
                                        int64_t Ns_global, double scale);

#endif
