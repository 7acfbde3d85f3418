/* parallel/tp/tp_attn_hook.c - the tensor-parallel attention hook (see
 * parallel/tp/tp_attn_hook.h, docs/parallel.md). */
#include "parallel/tp/tp_attn_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/tp/tp_attn.h"
#include "parallel/tp/tp_reduce.h"

/* 1 when M holds block b's attention cuts (the row cuts, wo_b's columns) as this rank's shards
 * (parallel/layout/tp_split.h par_tp_storage_cut): the hook reads them in place. */
static int held_cuts(const PAR_FN(par_model) *M, int b)
{
    return PAR_FN(par_model_cut_of)(M, M->tab.blocks[b].wq_b) != NULL;
}

/* What (slot, block) keeps from its forward to its W pass. */
typedef struct {
    PAR_FN(par_tp_attn_saved) sv;
    PAR_FN(par_attn_weights) Wl, dWl; /* the shard of the weights and its gradients */
    par_real *buf;                    /* [3 * shard]: Wl, dWl, scratch; held: [shard], dWl alone */
    int64_t shard;
    int held;                         /* the model holds the block's cuts as shards (held_cuts) */
} tp_slot;

/* The slot's gradient shard (after Wl's copy unless held) and the add's
 * scratch (NULL when held: par_tp_attn_grads_add_held adds in place). */
static par_real *dwl_buf(const tp_slot *q)
{
    return q->buf + (q->held ? 0 : q->shard);
}

static par_real *scratch_of(const tp_slot *q)
{
    return q->held ? NULL : q->buf + 2 * q->shard;
}

struct PAR_FN(par_tp_attn_hook_s) {
    par_tp tp, tsp;  /* the group without / with sequence parallelism */
    int sp;          /* the ranks hold column slices of the rows (SP) */
    int nb, n_slots, rank, P;
    tp_slot *sl; /* [n_slots, nb] */
    par_tp_traffic tr;
};

static void slot_free(tp_slot *q)
{
    PAR_FN(par_tp_attn_saved_free)(&q->sv);
    par_free(q->buf);
    memset(q, 0, sizeof *q);
}

/* The state of (x->slot, b), or NULL when the call does not fit. */
static tp_slot *slot_of(PAR_FN(par_tp_attn_hook) *h, const par_mbctx *x, int b, int64_t T)
{
    if (!x || x->slot < 0 || x->slot >= h->n_slots || b < 0 || b >= h->nb || !x->pos_rows ||
        T * (h->sp ? h->P : 1) != x->rows * x->S)
        return NULL;
    return &h->sl[(size_t)x->slot * (size_t)h->nb + (size_t)b];
}

/* SP, several rows: the layer on the whole rows (x gathered, y all-reduced),
 * the rank's slice of y and of the picks taken. */
static par_status sp_rows_forward(PAR_FN(par_tp_attn_hook) *h, tp_slot *q, const par_mbctx *x, const par_attn_dims *dm,
                                  par_real *y, int32_t *sel, const par_real *xin)
{
    const int64_t S = x->S, rows = x->rows, T = rows * S, d = dm->d, k = dm->topk;
    par_real *b = par_malloc((size_t)(2 * T * d + 1) * sizeof *b, PAR_TAG_ACT);
    int32_t *sf = sel ? par_malloc((size_t)(T * k + 1) * sizeof *sf, PAR_TAG_ACT) : NULL;
    par_status s = !b || (sel && !sf) ? par_err(PAR_ENOMEM, "tp attention (sp): out of memory for %lld tokens",
                                                (long long)T)
                                      : PAR_FN(par_tp_reduce_gather_cols)(&h->tsp, h->P, b, xin, rows, S, d, "tp attention");
    if (!s)
        s = PAR_FN(par_tp_attn_forward)(b + T * d, &q->sv, sf, b, x->pos_rows, &q->Wl, dm, T, &h->tp);
    if (!s) {
        PAR_FN(par_tp_reduce_take_cols)(y, b + T * d, rows, S, d, sizeof *b, h->rank, h->P);
        if (sel)
            PAR_FN(par_tp_reduce_take_cols)(sel, sf, rows, S, k, sizeof *sf, h->rank, h->P);
    }
    par_free(b);
    par_free(sf);
    return s;
}

static par_status attn_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_tp_attn_hook) *h = ctx;
    tp_slot *q = slot_of(h, x, b, T);
    if (!q)
        return par_err(PAR_EINVAL, "tp attention: block %d on %lld tokens does not fit the hook (%d blocks, %d slots)",
                       b, (long long)T, h->nb, h->n_slots);
    slot_free(q);
    const par_attn_dims *dm = &M->adims[b];
    q->shard = PAR_FN(par_tp_attn_shard_count)(dm, h->P);
    q->held = held_cuts(M, b); /* the weights read in place, the gradients added in place: dWl alone */
    if (!(q->buf = par_malloc((size_t)((q->held ? 1 : 3) * q->shard + 1) * sizeof(par_real), PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "tp attention: out of memory for a shard of %lld reals", (long long)q->shard);
    PAR_FN(par_tp_attn_shard_held)(&q->Wl, q->buf, W, dm, h->rank, h->P, q->held);
    if (h->sp && x->rows > 1)
        return sp_rows_forward(h, q, x, dm, y, sel, xin);
    if (h->sp) /* one row: the rank's columns are its contiguous tokens, the layer's own SP */
        return PAR_FN(par_tp_attn_forward)(y, &q->sv, sel, xin, x->pos_rows, &q->Wl, dm, T * h->P, &h->tsp);
    return PAR_FN(par_tp_attn_forward)(y, &q->sv, sel, xin, x->pos_rows, &q->Wl, dm, T, &h->tp);
}

/* SP, several rows: dy gathered into whole rows, dx of the whole rows
 * (all-reduced in the layer), the rank's slice added. */
static par_status sp_rows_backward(PAR_FN(par_tp_attn_hook) *h, tp_slot *q, const par_mbctx *x, int64_t d, par_real *dx,
                                   const par_real *dy)
{
    const int64_t S = x->S, rows = x->rows, T = rows * S, Tl = T / h->P;
    par_real *b = par_calloc((size_t)(2 * T * d + Tl * d + 1), sizeof *b, PAR_TAG_ACT);
    if (!b)
        return par_err(PAR_ENOMEM, "tp attention backward (sp): out of memory for %lld tokens", (long long)T);
    par_real *dxf = b + T * d, *mine = dxf + T * d;
    par_status s = PAR_FN(par_tp_reduce_gather_cols)(&h->tsp, h->P, b, dy, rows, S, d, "tp attention");
    if (!s)
        s = PAR_FN(par_tp_attn_backward)(dx ? dxf : NULL, &q->dWl, b, &q->sv, &q->Wl, &h->tp);
    if (!s && dx) {
        PAR_FN(par_tp_reduce_take_cols)(mine, dxf, rows, S, d, sizeof *b, h->rank, h->P);
        for (int64_t e = 0; e < Tl * d; e++)
            dx[e] += mine[e];
    }
    par_free(b);
    return s;
}

/* B: dx (summed over the group in the layer), dsink of the rank's heads;
 * the other shard gradients wait in the slot for W. */
static par_status attn_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx,
                           par_real *dsink, const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_tp_attn_hook) *h = ctx;
    tp_slot *q = slot_of(h, x, b, T);
    if (!q || !q->sv.buf)
        return par_err(PAR_EINVAL, "tp attention backward: block %d has no forward on %lld tokens", b, (long long)T);
    PAR_FN(par_tp_attn_shard)(&q->dWl, dwl_buf(q), W, &M->adims[b], h->rank, h->P);
    memset(dwl_buf(q), 0, (size_t)q->shard * sizeof(par_real));
    par_status s = h->sp && x->rows > 1 ? sp_rows_backward(h, q, x, M->d, dx, dy)
                   : PAR_FN(par_tp_attn_backward)(dx, &q->dWl, dy, &q->sv, &q->Wl, h->sp ? &h->tsp : &h->tp);
    if (s)
        return s;
    if (dsink) {
        PAR_FN(par_attn_weights) sink;
        memset(&sink, 0, sizeof sink);
        sink.attn_sink = dsink;
        PAR_FN(par_attn_weights) only = {.attn_sink = q->dWl.attn_sink};
        PAR_FN(par_tp_attn_grads_add_held)(&sink, &only, &M->adims[b], h->rank, h->P, scratch_of(q), q->held);
    }
    return PAR_OK;
}

/* W: the rank's block of every split weight, its share of the replicated
 * ones (summed over the group once per step: par_reduce_tp_grads). */
static par_status attn_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_tp_attn_hook) *h = ctx;
    tp_slot *q = slot_of(h, x, b, T);
    (void)dy, (void)W;
    if (!q || !q->buf)
        return par_err(PAR_EINVAL, "tp attention weights: block %d has no backward on %lld tokens", b, (long long)T);
    PAR_FN(par_attn_weights) g = *dW;
    g.attn_sink = NULL; /* B's */
    PAR_FN(par_tp_attn_grads_add_held)(&g, &q->dWl, &M->adims[b], h->rank, h->P, scratch_of(q), q->held);
    return PAR_OK;
}

par_status PAR_FN(par_tp_attn_hook_create)(PAR_FN(par_tp_attn_hook) **out, par_comm *tp, const PAR_FN(par_model) *M,
                                      int n_slots)
{
    *out = NULL;
    if (!tp || n_slots < 1)
        return par_err(PAR_EINVAL, "tensor parallelism: a hook needs a TP group and at least one slot (got %d)",
                       n_slots);
    par_attn_dims dl;
    for (int b = 0; b < M->n_blocks; b++) {
        par_status s = PAR_FN(par_tp_attn_dims)(&dl, &M->adims[b], par_comm_size(tp));
        if (s)
            return s;
    }
    PAR_FN(par_tp_attn_hook) *h = par_calloc(1, sizeof *h, PAR_TAG_MODEL);
    if (!h)
        return par_err(PAR_ENOMEM, "tensor parallelism: out of memory");
    h->tp = (par_tp){.comm = tp, .sp = 0, .faults = 0, .traffic = &h->tr};
    h->tsp = (par_tp){.comm = tp, .sp = 1, .faults = 0, .traffic = &h->tr};
    h->nb = M->n_blocks;
    h->n_slots = n_slots;
    h->rank = par_comm_rank(tp);
    h->P = par_comm_size(tp);
    h->sl = par_calloc((size_t)n_slots * (size_t)(h->nb > 0 ? h->nb : 1), sizeof *h->sl, PAR_TAG_ACT);
    if (!h->sl) {
        par_free(h);
        return par_err(PAR_ENOMEM, "tensor parallelism: out of memory for %d x %d saved states", n_slots, h->nb);
    }
    *out = h;
    return PAR_OK;
}

void PAR_FN(par_tp_attn_hook_set_sp)(PAR_FN(par_tp_attn_hook) *h, int sp)
{
    h->sp = sp != 0;
}

void PAR_FN(par_tp_attn_hook_install)(PAR_FN(par_tp_attn_hook) *h, PAR_FN(par_model) *M)
{
    M->attn.fwd = attn_fwd;
    M->attn.bwd = attn_bwd;
    M->attn.wgt = attn_wgt;
    M->attn.ctx = h;
}

void PAR_FN(par_tp_attn_hook_traffic)(const PAR_FN(par_tp_attn_hook) *h, par_tp_traffic *out)
{
    if (h)
        *out = h->tr;
    else
        memset(out, 0, sizeof *out);
}

void PAR_FN(par_tp_attn_hook_free)(PAR_FN(par_tp_attn_hook) *h)
{
    if (!h)
        return;
    for (int i = 0; h->sl && i < h->n_slots * h->nb; i++)
        slot_free(&h->sl[i]);
    par_free(h->sl);
    par_free(h);
}
