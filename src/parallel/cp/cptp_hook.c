/* parallel/cp/cptp_hook.c - the context x tensor parallel attention hook (see
 * parallel/cp/cptp_hook.h, docs/parallel.md). */
#include "parallel/cp/cptp_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/cp/cp.h"
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
    PAR_FN(par_cp_attn_saved) sv;
    par_attn_dims dl;             /* the shard's dims */
    PAR_FN(par_tp_attn_local) lo; /* the shard of the weights and its gradients */
    par_real *dyf;                /* SP: B's gathered dy [rows, S/CP, d], for W */
} cptp_state;

typedef struct {
    par_mbstate st; /* cptp_state of (microbatch, block); first (par_mbstate_hook_new) */
    par_comm *cp;
    par_tp tp, tsp; /* the TP group without / with sequence parallelism (gathers) */
    int sp;         /* the TP ranks hold column slices of the CP slice */
    int64_t ncp;
    int rank, P;
    par_cp_traffic ctr;
    par_tp_traffic ttr;
} cptp_hook;

static void state_drop(void *p)
{
    cptp_state *q = p;
    PAR_FN(par_cp_attn_saved_free)(&q->sv);
    PAR_FN(par_tp_attn_local_free)(&q->lo);
    par_free(q->dyf);
}

/* 1 when the call's tokens fit the hook. */
static int fits(const cptp_hook *h, const par_mbctx *x, int64_t T)
{
    return x && x->pos_rows && x->S % (h->ncp * (h->sp ? h->P : 1)) == 0 &&
           T * (h->sp ? h->P : 1) == x->rows * (x->S / h->ncp);
}

/* SP forward: x gathered into the CP slice, the CP x TP layer on it (y
 * summed over TP), the rank's columns of y and of the picks kept. */
static par_status sp_forward(cptp_hook *h, cptp_state *q, const par_mbctx *x, const par_attn_dims *dm,
                             par_real *y, int32_t *sel, const par_real *xin)
{
    const int64_t W = x->S / h->ncp;
    PAR_FN(par_tp_attn_sp) g;
    par_status s = PAR_FN(par_tp_attn_sp_gather)(&g, &h->tsp, h->P, xin, x->rows, W, dm->d, dm->topk, sel != NULL,
                                                 "cp x tp attention");
    if (!s)
        s = PAR_FN(par_cp_attn_forward_tp)(g.y, &q->sv, g.sel, g.x, x->pos_rows, &q->lo.Wl, &q->dl, dm->iH, x->rows,
                                           W, h->cp, &h->tp, &h->ctr);
    if (!s)
        PAR_FN(par_tp_attn_sp_take)(&g, y, sel, h->rank, h->P);
    PAR_FN(par_tp_attn_sp_free)(&g);
    return s;
}

/* SP input pass: dy gathered into the CP slice (kept in the state for W),
 * the CP input pass on it (dx summed over TP), the rank's columns added. */
static par_status sp_backward(cptp_hook *h, cptp_state *q, const par_mbctx *x, int64_t d, par_real *dx,
                              const par_real *dy)
{
    const int64_t W = x->S / h->ncp, rows = x->rows, T = rows * W, Tl = T / h->P;
    par_free(q->dyf);
    q->dyf = par_malloc((size_t)(T * d + 1) * sizeof *q->dyf, PAR_TAG_ACT);
    par_real *b = dx ? par_calloc((size_t)(T * d + Tl * d + 1), sizeof *b, PAR_TAG_ACT) : NULL;
    par_status s = !q->dyf || (dx && !b) ? par_err(PAR_ENOMEM, "cp x tp attention backward (sp): out of memory "
                                                   "for %lld tokens", (long long)T)
                                         : PAR_FN(par_tp_reduce_gather_cols)(&h->tsp, h->P, q->dyf, dy, rows, W,
                                                                             d, "cp x tp attention");
    if (!s)
        s = PAR_FN(par_cp_attn_backward_input)(dx ? b : NULL, q->lo.dWl.attn_sink, q->dyf, &q->sv, &q->lo.Wl, h->cp,
                                               &h->ctr);
    if (!s && dx)
        PAR_FN(par_tp_attn_sp_add_dx)(dx, b + T * d, b, rows, W, d, h->rank, h->P);
    par_free(b);
    return s;
}

static par_status attn_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    cptp_hook *h = ctx;
    cptp_state *q;
    if (!fits(h, x, T))
        return par_err(PAR_EINVAL, "cp x tp attention: block %d on %lld tokens does not fit the hook (CP %lld)", b,
                       (long long)T, (long long)h->ncp);
    const par_attn_dims *dm = &M->adims[b];
    par_status s = par_mbstate_new(&h->st, x, b, (void **)&q);
    if (s || (s = PAR_FN(par_tp_attn_dims)(&q->dl, dm, h->P)) ||
        (s = PAR_FN(par_tp_attn_local_make)(&q->lo, W, dm, h->rank, h->P, held_cuts(M, b), "cp x tp attention")))
        return s;
    if (h->sp)
        return sp_forward(h, q, x, dm, y, sel, xin);
    return PAR_FN(par_cp_attn_forward_tp)(y, &q->sv, sel, xin, x->pos_rows, &q->lo.Wl, &q->dl, dm->iH, x->rows,
                                          x->S / h->ncp, h->cp, &h->tp, &h->ctr);
}

/* B: dx (summed over TP inside cp.c), the shard's sinks into dsink. */
static par_status attn_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx,
                           par_real *dsink, const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    cptp_hook *h = ctx;
    cptp_state *q = fits(h, x, T) ? par_mbstate_get(&h->st, x, b) : NULL;
    if (!q || !q->sv.buf)
        return par_err(PAR_EINVAL, "cp x tp attention backward: block %d has no forward on %lld tokens", b,
                       (long long)T);
    PAR_FN(par_tp_attn_local_zero)(&q->lo, W, &M->adims[b]);
    par_status s = h->sp ? sp_backward(h, q, x, M->d, dx, dy)
                         : PAR_FN(par_cp_attn_backward_input)(dx, q->lo.dWl.attn_sink, dy, &q->sv, &q->lo.Wl, h->cp,
                                                              &h->ctr);
    if (!s)
        PAR_FN(par_tp_attn_local_add_sink)(&q->lo, dsink, &M->adims[b]);
    return s;
}

/* W: the shard's weight gradients (sinks were B's), into rank r's blocks;
 * the microbatch's state of the block goes. */
static par_status attn_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    cptp_hook *h = ctx;
    cptp_state *q = fits(h, x, T) ? par_mbstate_get(&h->st, x, b) : NULL;
    (void)W;
    if (!q || !q->lo.buf)
        return par_err(PAR_EINVAL, "cp x tp attention weights: block %d has no backward on %lld tokens", b,
                       (long long)T);
    PAR_FN(par_attn_weights) gl = q->lo.dWl;
    gl.attn_sink = NULL;
    if (h->sp && !q->dyf)
        return par_err(PAR_EINVAL, "cp x tp attention weights (sp): block %d has no gathered dy", b);
    par_status s = PAR_FN(par_cp_attn_backward_weights)(&gl, h->sp ? q->dyf : dy, &q->sv, &q->lo.Wl);
    if (!s)
        PAR_FN(par_tp_attn_local_add)(&q->lo, dW, &gl, &M->adims[b]);
    par_mbstate_drop(&h->st, x, b);
    return s;
}

/* ----------------------------------------------------------- the entry -- */

static int applies(const par_layout *l)
{
    return l->cp > 1 && l->tp > 1;
}

/* PAR_EINVAL naming the numbers when TP does not divide a block's heads,
 * groups or index heads. */
static par_status create(void **out, const par_hook_env *e, PAR_FN(par_model) *M)
{
    par_comm *tp = e->P->g.g[PAR_GROUP_TP];
    par_attn_dims dl;
    par_status s = PAR_OK;
    for (int b = 0; b < M->n_blocks && !s; b++)
        s = PAR_FN(par_tp_attn_dims)(&dl, &M->adims[b], par_comm_size(tp));
    cptp_hook *h;
    if (s || (s = par_mbstate_hook_new((void **)&h, sizeof *h, "cp x tp attention", e->n_mb, M->n_blocks, NULL,
                                       sizeof(cptp_state), state_drop)))
        return s;
    h->cp = e->P->g.g[PAR_GROUP_CP];
    h->ncp = par_comm_size(h->cp);
    h->tp = (par_tp){.comm = tp, .sp = 0, .faults = 0, .traffic = &h->ttr};
    h->tsp = (par_tp){.comm = tp, .sp = 1, .faults = 0, .traffic = &h->ttr};
    h->sp = e->P->lay->sequence_parallel != 0;
    h->rank = par_comm_rank(tp), h->P = par_comm_size(tp);
    M->attn = (PAR_FN(par_attn_exec)){.fwd = attn_fwd, .bwd = attn_bwd, .wgt = attn_wgt, .ctx = h};
    *out = h;
    return PAR_OK;
}

const PAR_FN(par_hookset) PAR_FN(par_cptp_hookset) = {
    .name = "cp x tp attention", .applies = applies, .create = create, .free = par_mbstate_hook_free};
