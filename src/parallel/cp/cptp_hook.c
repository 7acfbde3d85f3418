/* parallel/cp/cptp_hook.c - the context x tensor parallel attention hook (see
 * parallel/cp/cptp_hook.h, docs/parallel.md). */
#include "parallel/cp/cptp_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/cp/cp.h"
#include "parallel/tp/tp_attn.h"
#include "parallel/tp/tp_reduce.h"

/* 1 when M holds block b's attention cuts (the row cuts, wo_b's columns) as this rank's shards
 * (parallel/layout/tp_split.h par_tp_storage_cut): the hook reads them in place. */
static int held_cuts(const PAR_FN(par_model) *M, int b)
{
    return PAR_FN(par_model_cut_of)(M, M->tab.blocks[b].wq_b) != NULL;
}

typedef struct {
    PAR_FN(par_cp_attn_saved) sv;
    par_attn_dims dl;                 /* the shard's dims */
    PAR_FN(par_attn_weights) Wl, dWl; /* the shard of the weights and its gradients */
    par_real *buf;                    /* [3 * shard]: Wl, dWl, scratch; held: [shard], dWl alone */
    int64_t shard;
    int held;                         /* the model holds the block's cuts as shards (held_cuts) */
    par_real *dyf;                    /* SP: B's gathered dy [rows, S/CP, d], for W */
} cptp_slot;

/* The slot's gradient shard (after Wl's copy unless held) and the add's
 * scratch (NULL when held: par_tp_attn_grads_add_held adds in place). */
static par_real *dwl_buf(const cptp_slot *q)
{
    return q->buf + (q->held ? 0 : q->shard);
}

static par_real *scratch_of(const cptp_slot *q)
{
    return q->held ? NULL : q->buf + 2 * q->shard;
}

struct PAR_FN(par_cptp_hook_s) {
    par_comm *cp;
    par_tp tp, tsp; /* the TP group without / with sequence parallelism (gathers) */
    int sp;         /* the TP ranks hold column slices of the CP slice */
    int64_t ncp;
    int nb, n_slots, rank, P;
    cptp_slot *sl; /* [n_slots, nb] */
    par_cp_traffic ctr;
    par_tp_traffic ttr;
};

static void slot_free(cptp_slot *q)
{
    PAR_FN(par_cp_attn_saved_free)(&q->sv);
    par_free(q->buf);
    par_free(q->dyf);
    memset(q, 0, sizeof *q);
}

static cptp_slot *slot_of(PAR_FN(par_cptp_hook) *h, const par_mbctx *x, int b, int64_t T)
{
    if (!x || x->slot < 0 || x->slot >= h->n_slots || b < 0 || b >= h->nb || !x->pos_rows ||
        x->S % (h->ncp * (h->sp ? h->P : 1)) != 0 || T * (h->sp ? h->P : 1) != x->rows * (x->S / h->ncp))
        return NULL;
    return &h->sl[(size_t)x->slot * (size_t)h->nb + (size_t)b];
}

/* SP forward: x gathered into the CP slice, the CP x TP layer on it (y
 * summed over TP), the rank's columns of y and of the picks kept. */
static par_status sp_forward(PAR_FN(par_cptp_hook) *h, cptp_slot *q, const par_mbctx *x, const par_attn_dims *dm,
                             par_real *y, int32_t *sel, const par_real *xin)
{
    const int64_t W = x->S / h->ncp, rows = x->rows, T = rows * W, d = dm->d, k = dm->topk;
    par_real *b = par_malloc((size_t)(2 * T * d + 1) * sizeof *b, PAR_TAG_ACT);
    int32_t *sf = sel ? par_malloc((size_t)(T * k + 1) * sizeof *sf, PAR_TAG_ACT) : NULL;
    par_status s = !b || (sel && !sf) ? par_err(PAR_ENOMEM, "cp x tp attention (sp): out of memory for %lld tokens",
                                                (long long)T)
                                      : PAR_FN(par_tp_reduce_gather_cols)(&h->tsp, h->P, b, xin, rows, W, d,
                                                                          "cp x tp attention");
    if (!s)
        s = PAR_FN(par_cp_attn_forward_tp)(b + T * d, &q->sv, sf, b, x->pos_rows, &q->Wl, &q->dl, dm->iH, rows, W,
                                           h->cp, &h->tp, &h->ctr);
    if (!s) {
        PAR_FN(par_tp_reduce_take_cols)(y, b + T * d, rows, W, d, sizeof *b, h->rank, h->P);
        if (sel)
            PAR_FN(par_tp_reduce_take_cols)(sel, sf, rows, W, k, sizeof *sf, h->rank, h->P);
    }
    par_free(b);
    par_free(sf);
    return s;
}

/* SP input pass: dy gathered into the CP slice (kept in the slot for W),
 * the CP input pass on it (dx summed over TP), the rank's columns added. */
static par_status sp_backward(PAR_FN(par_cptp_hook) *h, cptp_slot *q, const par_mbctx *x, int64_t d, par_real *dx,
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
        s = PAR_FN(par_cp_attn_backward_input)(dx ? b : NULL, q->dWl.attn_sink, q->dyf, &q->sv, &q->Wl, h->cp,
                                               &h->ctr);
    if (!s && dx) {
        par_real *mine = b + T * d;
        PAR_FN(par_tp_reduce_take_cols)(mine, b, rows, W, d, sizeof *b, h->rank, h->P);
        for (int64_t e = 0; e < Tl * d; e++)
            dx[e] += mine[e];
    }
    par_free(b);
    return s;
}

static par_status attn_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cptp_hook) *h = ctx;
    cptp_slot *q = slot_of(h, x, b, T);
    if (!q)
        return par_err(PAR_EINVAL, "cp x tp attention: block %d on %lld tokens does not fit the hook (%d blocks, "
                       "%d slots, CP %lld)", b, (long long)T, h->nb, h->n_slots, (long long)h->ncp);
    slot_free(q);
    const par_attn_dims *dm = &M->adims[b];
    par_status s = PAR_FN(par_tp_attn_dims)(&q->dl, dm, h->P);
    if (s)
        return s;
    q->shard = PAR_FN(par_tp_attn_shard_count)(dm, h->P);
    q->held = held_cuts(M, b); /* the weights read in place, the gradients added in place: dWl alone */
    if (!(q->buf = par_malloc((size_t)((q->held ? 1 : 3) * q->shard + 1) * sizeof(par_real), PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "cp x tp attention: out of memory for a shard of %lld reals", (long long)q->shard);
    PAR_FN(par_tp_attn_shard_held)(&q->Wl, q->buf, W, dm, h->rank, h->P, q->held);
    if (h->sp)
        return sp_forward(h, q, x, dm, y, sel, xin);
    return PAR_FN(par_cp_attn_forward_tp)(y, &q->sv, sel, xin, x->pos_rows, &q->Wl, &q->dl, dm->iH, x->rows,
                                          x->S / h->ncp, h->cp, &h->tp, &h->ctr);
}

/* B: dx (summed over TP inside cp.c), the shard's sinks into dsink. */
static par_status attn_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx,
                           par_real *dsink, const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cptp_hook) *h = ctx;
    cptp_slot *q = slot_of(h, x, b, T);
    if (!q || !q->sv.buf)
        return par_err(PAR_EINVAL, "cp x tp attention backward: block %d has no forward on %lld tokens", b,
                       (long long)T);
    PAR_FN(par_tp_attn_shard)(&q->dWl, dwl_buf(q), W, &M->adims[b], h->rank, h->P);
    memset(dwl_buf(q), 0, (size_t)q->shard * sizeof(par_real));
    par_status s = h->sp ? sp_backward(h, q, x, M->d, dx, dy)
                         : PAR_FN(par_cp_attn_backward_input)(dx, q->dWl.attn_sink, dy, &q->sv, &q->Wl, h->cp, &h->ctr);
    if (s || !dsink)
        return s;
    PAR_FN(par_attn_weights) sink, only = {.attn_sink = q->dWl.attn_sink};
    memset(&sink, 0, sizeof sink);
    sink.attn_sink = dsink;
    PAR_FN(par_tp_attn_grads_add_held)(&sink, &only, &M->adims[b], h->rank, h->P, scratch_of(q), q->held);
    return PAR_OK;
}

/* W: the shard's weight gradients (sinks were B's), into rank r's blocks. */
static par_status attn_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cptp_hook) *h = ctx;
    cptp_slot *q = slot_of(h, x, b, T);
    (void)W;
    if (!q || !q->buf)
        return par_err(PAR_EINVAL, "cp x tp attention weights: block %d has no backward on %lld tokens", b,
                       (long long)T);
    PAR_FN(par_attn_weights) gl = q->dWl;
    gl.attn_sink = NULL;
    if (h->sp && !q->dyf)
        return par_err(PAR_EINVAL, "cp x tp attention weights (sp): block %d has no gathered dy", b);
    par_status s = PAR_FN(par_cp_attn_backward_weights)(&gl, h->sp ? q->dyf : dy, &q->sv, &q->Wl);
    par_free(q->dyf);
    q->dyf = NULL;
    if (s)
        return s;
    PAR_FN(par_attn_weights) g = *dW;
    g.attn_sink = NULL; /* B's */
    PAR_FN(par_tp_attn_grads_add_held)(&g, &gl, &M->adims[b], h->rank, h->P, scratch_of(q), q->held);
    return PAR_OK;
}

par_status PAR_FN(par_cptp_hook_create)(PAR_FN(par_cptp_hook) **out, par_comm *cp, par_comm *tp,
                                        const PAR_FN(par_model) *M, int n_slots, int sp)
{
    *out = NULL;
    if (!cp || !tp || n_slots < 1)
        return par_err(PAR_EINVAL, "cp x tp attention: a hook needs a CP group, a TP group and at least one slot "
                       "(got %d)", n_slots);
    par_attn_dims dl;
    for (int b = 0; b < M->n_blocks; b++) {
        par_status s = PAR_FN(par_tp_attn_dims)(&dl, &M->adims[b], par_comm_size(tp));
        if (s)
            return s;
    }
    PAR_FN(par_cptp_hook) *h = par_calloc(1, sizeof *h, PAR_TAG_MODEL);
    if (!h)
        return par_err(PAR_ENOMEM, "cp x tp attention: out of memory");
    h->cp = cp;
    h->ncp = par_comm_size(cp);
    h->tp = (par_tp){.comm = tp, .sp = 0, .faults = 0, .traffic = &h->ttr};
    h->tsp = (par_tp){.comm = tp, .sp = 1, .faults = 0, .traffic = &h->ttr};
    h->sp = sp != 0;
    h->nb = M->n_blocks, h->n_slots = n_slots, h->rank = par_comm_rank(tp), h->P = par_comm_size(tp);
    h->sl = par_calloc((size_t)n_slots * (size_t)(h->nb > 0 ? h->nb : 1), sizeof *h->sl, PAR_TAG_ACT);
    if (!h->sl) {
        par_free(h);
        return par_err(PAR_ENOMEM, "cp x tp attention: out of memory for %d x %d saved states", n_slots, h->nb);
    }
    *out = h;
    return PAR_OK;
}

void PAR_FN(par_cptp_hook_install)(PAR_FN(par_cptp_hook) *h, PAR_FN(par_model) *M)
{
    M->attn.fwd = attn_fwd;
    M->attn.bwd = attn_bwd;
    M->attn.wgt = attn_wgt;
    M->attn.ctx = h;
}

void PAR_FN(par_cptp_hook_free)(PAR_FN(par_cptp_hook) *h)
{
    if (!h)
        return;
    for (int i = 0; h->sl && i < h->n_slots * h->nb; i++)
        slot_free(&h->sl[i]);
    par_free(h->sl);
    par_free(h);
}
