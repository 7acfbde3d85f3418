/* parallel/moe/ep-impl.h - the expert-parallel executor's state and its
 * transport (parallel/moe/ep.c, parallel/moe/ep_dispatch.c); not part of its
 * interface (parallel/moe/ep.h). */
#ifndef PAR_PARALLEL_MOE_EP_IMPL_H
#define PAR_PARALLEL_MOE_EP_IMPL_H

#include <stdint.h>

#include "core/alloc.h"
#include "parallel/moe/ep.h"
#include "parallel/moe/etp.h"
#include "parallel/tp/tp.h"

/* What one block keeps between its forward and backward.
 *
 * Flat: one exchange, sender -> owner (scnt / stk on the sender, rcnt on
 * the owner).  Hierarchical: stage 1 sender -> relay (records, one per
 * (token, relay)), stage 2 relay -> owner (one row per (token, expert));
 * rcnt / nrecv / rpos are the owner's side of stage 2 in both modes. */
typedef struct {
    int64_t T, nsend, nrecv;
    size_t *scnt, *rcnt;   /* [EP] rows to / from each EP rank (hier: stage 2) */
    int32_t *stk;          /* [nsend] flat: source slot t*K+k of each sent row (send order) */
    int32_t *rpos;         /* [nrecv] expert-major position of each received row */
    int64_t *eoff;         /* [El+1] first expert-major row of local expert l */
    par_real *xg, *rwg;    /* [nrecv, d], [nrecv] expert-major */
    par_real *g, *u, *h;   /* [nrecv, I] saved by the routed experts */
    par_real *sg, *su, *sh; /* [T, I] saved by the shared expert (run whole) */
    PAR_FN(par_tp_mlp_saved) shs; /* the shared expert TP-split (par_ep_set_shared_tp): its saved forward */
    PAR_FN(par_tp_mlp_shard) shw; /* and this TP rank's shard of it */
    /* hierarchical, sender side */
    int64_t n1s;           /* stage-1 records sent */
    size_t *h1cnt;         /* [EP] records to each relay */
    size_t *h1back;        /* [EP] (token, expert) rows each relay returns */
    int32_t *h1t;          /* [n1s] token index t of each record (send order) */
    int32_t *h1slot;       /* [nsend] slot t*K+k of each returned row (return order) */
    /* hierarchical, relay side */
    int64_t n1r, n2s;      /* records received, stage-2 rows sent */
    size_t *r1cnt, *r1back; /* [EP] records from / rows returned to each sender */
    int32_t *s2rec;        /* [n2s] received record of each stage-2 row (send order) */
    int32_t *s2pos;        /* [n2s] its position in the rows returned to the senders */
    /* the input pass (B) -> the weight pass (W) */
    par_real *dyg;         /* [nrecv, d] expert-major dy rows of the held experts */
    /* ETP inside EP (ep_etp.c): the held experts' slices and the rows layer */
    const par_real **esw;  /* [3, El] w1 / w2 / w3 slices */
    par_real **esg;        /* [2, El] w1 / w3 slices' gradients (into M->egw) */
    par_real *ew2;         /* [2, El, d, I/ETP] w2 slices, then their gradients */
    PAR_FN(par_etp_rows_saved) ers;
    uint8_t *wdup;         /* [nrecv] expert-major: the row is a TP copy (ep_tp.c; NULL: none) */
} blk_state;

struct PAR_FN(par_ep_s) {
    par_comm *c;
    int EP, me;
    int64_t E, El, e0;
    int n_blocks;
    int n_rows;            /* the blocks whose experts the model holds (a pipeline rank: its stages') */
    int *row;              /* [n_blocks] block b's row of blk, -1: not held here */
    int n_slots;           /* sets of per-block state: one per microbatch slot (par_mbctx.slot) */
    blk_state **blk;       /* [n_slots, n_rows]: held blocks only; a state exists from its forward to its
                            * weight pass (the microbatches in flight), NULL otherwise */
    par_ep_dispatch mode;
    int gpn;               /* ranks per node */
    int *node;             /* [EP] node of each EP rank (world rank / gpn) */
    int *rel;              /* [2 EP]: rel[j] = my relay on the node of rank j (me itself on my node);
                            * rel[EP + j] = j's relay on my node (rel(s, j) of ep.c's build_nodes) */
    par_ep_counters cnt;
    const par_costas *ca;  /* --cost-as (NULL: off) */
    int cur_b;             /* the block being exchanged (its blk_mul)  */
    par_tp etp;            /* ETP inside EP (comm NULL: off; par_ep_set_etp) */
    par_tp_traffic etr;
    uint8_t *tpdup;        /* [EP] EP rank j has tp > 0: its rows are TP copies (NULL: none; par_ep_set_tp) */
    par_tp shtp;           /* the shared expert's TP group (comm NULL: whole; par_ep_set_shared_tp) */
    par_tp_traffic shtr;
    int64_t sh_units;      /* the shared expert's forward tokens x hidden units (par_tp_shared_stats) */
};


typedef struct PAR_FN(par_ep_s) ep_t;

static inline void *xalloc(size_t n, size_t sz)
{
    return par_malloc((n ? n : 1) * sz, PAR_TAG_ACT);
}

static inline void *xcalloc(size_t n, size_t sz)
{
    return par_calloc(n ? n : 1, sz, PAR_TAG_ACT);
}

void PAR_FN(par__ep_blk_free)(blk_state *S);
/* A slot's state freed and the slot emptied (NULL: nothing). */
void PAR_FN(par__ep_blk_drop)(blk_state **sp);
/* Every slot's state freed (a mode change drops the states in flight). */
void PAR_FN(par__ep_blk_drop_all)(ep_t *x);

/* Forward dispatch of the T tokens' (x row, routing weight) to the owners
 * of their K experts; out: *rbuf [NR, d+1], *rids [NR, 3] in received
 * order; flat: ids (expert, token id, source slot), hierarchical: (expert,
 * source EP rank, t).  S records the routes for the way back. */
par_status PAR_FN(par__ep_flat_dispatch)(ep_t *x, blk_state *S, const par_real *x_in, const int32_t *idx,
                                         const par_real *w, const int32_t *tokens, int64_t T, int K, int64_t d,
                                         par_real **rbuf, int32_t **rids);
par_status PAR_FN(par__ep_hier_dispatch)(ep_t *x, blk_state *S, const par_real *x_in, const int32_t *idx,
                                         const par_real *w, int64_t T, int K, int64_t d, par_real **rbuf,
                                         int32_t **rids);
/* Backward dispatch: dy[t] of every (token, expert) row to its owner; rows
 * [nrecv, d] in the owner's received order. */
par_status PAR_FN(par__ep_dispatch_dy)(ep_t *x, blk_state *S, const par_real *dy, int K, int64_t d, par_real *rows);
/* Combine direction: rows [nrecv, per] in the owner's received order back
 * to the token's rank, out[i * per] for slot i = t*K+k ([nsend, per]). */
par_status PAR_FN(par__ep_return_rows)(ep_t *x, blk_state *S, const par_real *rows, int64_t per, par_real *out);

/* ETP inside EP (ep_etp.c): the held experts' slices on the expert-major
 * rows over the ETP group (rows all-gathered, outputs reduce-scattered):
 * complete outputs yg [nrecv, d]; backward: dxg [nrecv, d] and drwg [nrecv]
 * (+=, expert-major) from S->dyg, and the slices' weight gradients into
 * this ETP rank's block of M->egw. */
par_status PAR_FN(par__ep_etp_forward)(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b, par_real *yg);
par_status PAR_FN(par__ep_etp_backward)(ep_t *x, blk_state *S, PAR_FN(par_model) *M, int b, par_real *dxg,
                                        par_real *drwg);

/* TP copies (ep_tp.c): mark the expert-major rows that came from TP ranks
 * > 0 (rids as the dispatch returned them, S->rpos set); zero their dy rows
 * in S->dyg before the weight pass. */
par_status PAR_FN(par__ep_tp_mark)(ep_t *x, blk_state *S, const int32_t *rids);
/* The TP shared expert (ep_tp.c, par_ep_set_shared_tp): ysh [T, d] for the
 * rank's T tokens (x_in [T, d]); backward dxs [T, d] += its input gradient
 * and the shard's weight gradients into this TP rank's block of M->grads. */
par_status PAR_FN(par__ep_shared_forward)(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b, par_real *ysh,
                                          const par_real *x_in, int64_t T);
par_status PAR_FN(par__ep_shared_backward)(ep_t *x, blk_state *S, PAR_FN(par_model) *M, int b, par_real *dxs,
                                           const par_real *dy);
void PAR_FN(par__ep_tp_mask_dy)(blk_state *S, int64_t d);

#endif
