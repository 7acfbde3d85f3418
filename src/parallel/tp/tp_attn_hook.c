/* parallel/tp/tp_attn_hook.c - the tensor-parallel attention hook (see
 * parallel/tp/tp_attn_hook.h, docs/parallel.md). */
#include "parallel/tp/tp_attn_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/hook/mbstate.h"
#include "parallel/tp/tp_attn.h"
#include "parallel/tp/tp_reduce.h"

/* 1 when M holds block b's attention cuts (the row cuts, wo_b's columns) as this rank's shards
 * (parallel/layout/tp_split.h par_tp_storage_cut): the hook reads them in place. */
static int held_cuts(const PAR_FN(par_model) *M, int b)
{
    return PAR_FN(par_model_cut_of)(M, M->tab.blocks[b].wq_b) != NULL;
}

/* What (microbatch, block) keeps from its forward to its W pass. */
typedef struct {
    PAR_FN(par_tp_attn_saved) sv;
    PAR_FN(par_tp_attn_local) lo; /* the shard of the weights and its gradients */
} tp_state;

typedef struct {
    par_mbstate st;  /* tp_state of (microbatch, block); first (par_mbstate_hook_new) */
    par_tp tp, tsp;  /* the group without / with sequence parallelism */
    int sp;          /* the ranks hold column slices of the rows (SP) */
    int rank, P;
    par_tp_traffic tr;
} tp_hook;

static void state_drop(void *p)
{
    tp_state *q = p;
    PAR_FN(par_tp_attn_saved_free)(&q->sv);
    PAR_FN(par_tp_attn_local_free)(&q->lo);
}

/* 1 when the call's tokens fit the hook. */
static int fits(const tp_hook *h, const par_mbctx *x, int64_t T)
{
    return x && x->pos_rows && T * (h->sp ? h->P : 1) == x->rows * x->S;
}

/* SP, several rows: the layer on the whole rows (x gathered, y all-reduced),
 * the rank's slice of y and of the picks taken. */
static par_status sp_rows_forward(tp_hook *h, tp_state *q, const par_mbctx *x, const par_attn_dims *dm,
                                  par_real *y, int32_t *sel, const par_real *xin)
{
    PAR_FN(par_tp_attn_sp) g;
    par_status s = PAR_FN(par_tp_attn_sp_gather)(&g, &h->tsp, h->P, xin, x->rows, x->S, dm->d, dm->topk, sel != NULL,
                                                 "tp attention");
    if (!s)
        s = PAR_FN(par_tp_attn_forward)(g.y, &q->sv, g.sel, g.x, x->pos_rows, &q->lo.Wl, dm, x->rows * x->S, &h->tp);
    if (!s)
        PAR_FN(par_tp_attn_sp_take)(&g, y, sel, h->rank, h->P);
    PAR_FN(par_tp_attn_sp_free)(&g);
    return s;
}

static par_status attn_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    tp_hook *h = ctx;
    tp_state *q;
    if (!fits(h, x, T))
        return par_err(PAR_EINVAL, "tp attention: block %d on %lld tokens does not fit the hook", b, (long long)T);
    const par_attn_dims *dm = &M->adims[b];
    par_status s = par_mbstate_new(&h->st, x, b, (void **)&q);
    if (s || (s = PAR_FN(par_tp_attn_local_make)(&q->lo, W, dm, h->rank, h->P, held_cuts(M, b), "tp attention")))
        return s;
    if (h->sp && x->rows > 1)
        return sp_rows_forward(h, q, x, dm, y, sel, xin);
    if (h->sp) /* one row: the rank's columns are its contiguous tokens, the layer's own SP */
        return PAR_FN(par_tp_attn_forward)(y, &q->sv, sel, xin, x->pos_rows, &q->lo.Wl, dm, T * h->P, &h->tsp);
    return PAR_FN(par_tp_attn_forward)(y, &q->sv, sel, xin, x->pos_rows, &q->lo.Wl, dm, T, &h->tp);
}

/* SP, several rows: dy gathered into whole rows, dx of the whole rows
 * (all-reduced in the layer), the rank's slice added. */
static par_status sp_rows_backward(tp_hook *h, tp_state *q, const par_mbctx *x, int64_t d, par_real *dx,
                                   const par_real *dy)
{
    const int64_t S = x->S, rows = x->rows, T = rows * S, Tl = T / h->P;
    par_real *b = par_calloc((size_t)(2 * T * d + Tl * d + 1), sizeof *b, PAR_TAG_ACT);
    if (!b)
        return par_err(PAR_ENOMEM, "tp attention backward (sp): out of memory for %lld tokens", (long long)T);
    par_real *dxf = b + T * d;
    par_status s = PAR_FN(par_tp_reduce_gather_cols)(&h->tsp, h->P, b, dy, rows, S, d, "tp attention");
    if (!s)
        s = PAR_FN(par_tp_attn_backward)(dx ? dxf : NULL, &q->lo.dWl, b, &q->sv, &q->lo.Wl, &h->tp);
    if (!s && dx)
        PAR_FN(par_tp_attn_sp_add_dx)(dx, dxf + T * d, dxf, rows, S, d, h->rank, h->P);
    par_free(b);
    return s;
}

/* B: dx (summed over the group in the layer), dsink of the rank's heads;
 * the other shard gradients wait in the state for W. */
static par_status attn_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx,
                           par_real *dsink, const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    tp_hook *h = ctx;
    tp_state *q = fits(h, x, T) ? par_mbstate_get(&h->st, x, b) : NULL;
    if (!q || !q->sv.buf)
        return par_err(PAR_EINVAL, "tp attention backward: block %d has no forward on %lld tokens", b, (long long)T);
    PAR_FN(par_tp_attn_local_zero)(&q->lo, W, &M->adims[b]);
    par_status s = h->sp && x->rows > 1 ? sp_rows_backward(h, q, x, M->d, dx, dy)
                   : PAR_FN(par_tp_attn_backward)(dx, &q->lo.dWl, dy, &q->sv, &q->lo.Wl, h->sp ? &h->tsp : &h->tp);
    if (!s)
        PAR_FN(par_tp_attn_local_add_sink)(&q->lo, dsink, &M->adims[b]);
    return s;
}

/* W: the rank's block of every split weight, its share of the replicated
 * ones (summed over the group once per step: par_reduce_tp_grads); the
 * microbatch's state of the block goes. */
static par_status attn_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    tp_hook *h = ctx;
    tp_state *q = fits(h, x, T) ? par_mbstate_get(&h->st, x, b) : NULL;
    (void)dy, (void)W;
    if (!q || !q->lo.buf)
        return par_err(PAR_EINVAL, "tp attention weights: block %d has no backward on %lld tokens", b, (long long)T);
    PAR_FN(par_tp_attn_local_add)(&q->lo, dW, &q->lo.dWl, &M->adims[b]);
    par_mbstate_drop(&h->st, x, b);
    return PAR_OK;
}

/* ----------------------------------------------------------- the entry -- */

static int applies(const par_layout *l)
{
    return l->tp > 1 && l->cp <= 1; /* TP x CP: parallel/cp/cptp_hook.c */
}

/* PAR_EINVAL naming the numbers when the group's size does not divide a
 * block's heads, groups or index heads. */
static par_status create(void **out, const par_hook_env *e, PAR_FN(par_model) *M)
{
    par_comm *tp = e->P->g.g[PAR_GROUP_TP];
    par_attn_dims dl;
    par_status s = PAR_OK;
    for (int b = 0; b < M->n_blocks && !s; b++)
        s = PAR_FN(par_tp_attn_dims)(&dl, &M->adims[b], par_comm_size(tp));
    tp_hook *h;
    if (s || (s = par_mbstate_hook_new((void **)&h, sizeof *h, "tp attention", e->n_mb, M->n_blocks, NULL,
                                       sizeof(tp_state), state_drop)))
        return s;
    h->tp = (par_tp){.comm = tp, .sp = 0, .faults = 0, .traffic = &h->tr};
    h->tsp = (par_tp){.comm = tp, .sp = 1, .faults = 0, .traffic = &h->tr};
    h->sp = e->P->lay->sequence_parallel != 0;
    h->rank = par_comm_rank(tp);
    h->P = par_comm_size(tp);
    M->attn = (PAR_FN(par_attn_exec)){.fwd = attn_fwd, .bwd = attn_bwd, .wgt = attn_wgt, .ctx = h};
    *out = h;
    return PAR_OK;
}

const PAR_FN(par_hookset) PAR_FN(par_tp_attn_hookset) = {
    .name = "tp attention", .applies = applies, .create = create, .free = par_mbstate_hook_free};
