/* parallel/tp/tp_mlp.h - tensor (and sequence) parallelism for a SwiGLU MLP:
 * the V4 shared expert (and any dense MLP), Megatron's column-parallel w1 /
 * w3 and row-parallel w2 (templated: see kernels/real.h).  docs/parallel.md,
 * "Tensor parallelism".
 *
 * Rank r of P holds rows [r*I/P, (r+1)*I/P) of w1 and w3 ([I/P, d]) and the
 * same columns of w2 ([d, I/P], packed); parallel/layout/tp_split.h's cuts.
 * Forward: x (all-gathered first with sp) -> g, u, h on the rank's I/P
 * hidden units (par_moe_expert_forward on the shard) -> a partial y summed
 * over the group (all-reduce; sp: reduce-scatter).  Backward: dy
 * (all-gathered with sp) -> the shard's weight gradients, complete; the
 * partial dx summed over the group (all-reduce; sp: reduce-scatter).
 *
 * Against the serial expert (kernels/moe.h, rw = 1) on the same x, dy, f64:
 * g, u, h and the shard's dw1, dw2, dw3 are bitwise (column slices of the
 * products); y and dx within the f64 policy (sums over I split by rank).
 */
#ifndef PAR_PARALLEL_TP_TP_MLP_H
#define PAR_PARALLEL_TP_TP_MLP_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "parallel/tp/tp.h"

typedef struct {
    int64_t T, Tx, d, Il;   /* tokens of the layer, of this rank, dim, hidden units held */
    int rank, P, sp;
    double L;               /* swiglu_limit */
    par_real *x;            /* [T, d] the (gathered) input */
    par_real *g, *u, *h;    /* [T, Il] */
    void *buf;
} PAR_FN(par_tp_mlp_saved);

void PAR_FN(par_tp_mlp_saved_free)(PAR_FN(par_tp_mlp_saved) *sv); /* zeroed/freed: fine */

/* y = MLP(x) for the rank's tokens: x, y [Tx, d] (Tx = T, or T/P with sp).
 * w1, w3 [I/P, d], w2 [d, I/P]: the shard.  PAR_EINVAL when P does not
 * divide I (or, with sp, T).  Collective over tp->comm.  `saved` zeroed or
 * freed; allocated on success. */
par_status PAR_FN(par_tp_mlp_forward)(par_real *y,              /* [Tx, d] */
                                      PAR_FN(par_tp_mlp_saved) *saved,
                                      const par_real *x,        /* [Tx, d] */
                                      const par_real *w1,       /* [I/P, d] */
                                      const par_real *w2,       /* [d, I/P] */
                                      const par_real *w3,       /* [I/P, d] */
                                      int64_t T, int64_t d, int64_t I, double L, const par_tp *tp);
/* dx += (complete, summed over the group; NULL on every rank or none);
 * dw1, dw2, dw3 += the shard's gradients (any may be NULL). */
par_status PAR_FN(par_tp_mlp_backward)(par_real *dx,            /* [Tx, d] or NULL */
                                       par_real *dw1,           /* [I/P, d] or NULL */
                                       par_real *dw2,           /* [d, I/P] or NULL */
                                       par_real *dw3,           /* [I/P, d] or NULL */
                                       const par_real *dy,      /* [Tx, d] */
                                       const PAR_FN(par_tp_mlp_saved) *saved,
                                       const par_real *w1, const par_real *w2, const par_real *w3,
                                       const par_tp *tp);

/* ---- the shared expert's shard, from held shards or whole storage ---- */

/* Rank r's shard of an MLP.  held: the storage holds the rank's shards
 * themselves (parallel/layout/tp_split.h par_tp_storage_cut under
 * par_tp_shared_expert_split: w1 / w3 rows [I/P, d], w2 columns [d, I/P]),
 * read in place.  Else the storage holds the whole w1, w2, w3 ([I, d], [d,
 * I], [I, d]): w1 / w3 rows point into them, w2's columns are copied.
 * dw2 collects the w2 shard's gradient (zeroed per backward) until
 * par_tp_mlp_shard_add_dw2 adds it into the held shard (or rank r's columns
 * of the whole gradient): the same adds either way. */
typedef struct {
    const par_real *w1, *w2, *w3; /* [I/P, d], [d, I/P], [I/P, d] */
    par_real *dw2;                /* [d, I/P] */
    int64_t d, I, Il;
    int rank, P;
    int held; /* w1 / w2 / w3 (and their gradients) are the held shards themselves */
    void *buf;
} PAR_FN(par_tp_mlp_shard);

/* PAR_EINVAL when P does not divide I; PAR_ENOMEM.  `s` zeroed or freed.
 * held: w1, w2, w3 are already this rank's shards (above), read and
 * accumulated in place; else the whole tensors. */
par_status PAR_FN(par_tp_mlp_shard_make)(PAR_FN(par_tp_mlp_shard) *s, const par_real *w1, const par_real *w2,
                                         const par_real *w3, int64_t d, int64_t I, const par_tp *tp, int held);
void PAR_FN(par_tp_mlp_shard_free)(PAR_FN(par_tp_mlp_shard) *s); /* zeroed/freed: fine */

/* The shard's gradients: o1 / o3 = the held g1 / g3 rows (or rank r's rows
 * of the whole [I, d] ones; NULL stays NULL), dw2 zeroed;
 * par_tp_mlp_shard_add_dw2 then adds dw2 into g2: the held [d, I/P] shard,
 * or rank r's columns of the whole [d, I]. */
void PAR_FN(par_tp_mlp_shard_grads)(PAR_FN(par_tp_mlp_shard) *s, par_real *g1, par_real *g3, par_real **o1,
                                    par_real **o3);
void PAR_FN(par_tp_mlp_shard_add_dw2)(const PAR_FN(par_tp_mlp_shard) *s, par_real *g2 /* [d, I] or [d, I/P] */);

/* par_tp_mlp_backward on the shard, its weight gradients added into the
 * held shards (held) or rank r's blocks of the whole gradients g1 [I, d],
 * g2 [d, I], g3 [I, d] (each may be NULL; the other ranks' blocks
 * untouched, so the TP sum of parallel/reduce/reduce.h meets zeros there). */
par_status PAR_FN(par_tp_mlp_backward_whole)(par_real *dx,      /* [Tx, d] or NULL */
                                             par_real *g1,      /* [I, d] or NULL */
                                             par_real *g2,      /* [d, I] or NULL */
                                             par_real *g3,      /* [I, d] or NULL */
                                             const par_real *dy, /* [Tx, d] */
                                             const PAR_FN(par_tp_mlp_saved) *saved,
                                             PAR_FN(par_tp_mlp_shard) *s, const par_tp *tp);

/* Bytes a group's traffic counters hold in all (par_tp_traffic's sum). */
static inline int64_t par_tp_traffic_bytes(const par_tp_traffic *t)
{
    return t->allreduce + t->allgather + t->reduce_scatter + t->chain + t->bcast + t->muon;
}

#endif
