/* parallel/moe/tp_moe_hook.c - the tensor-parallel shared expert hook (see
 * parallel/moe/tp_moe_hook.h, docs/parallel.md). */
#include "parallel/moe/tp_moe_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/moe/etp.h"
#include "parallel/layout/tp_split.h"

typedef struct {
    PAR_FN(par_etp_moe_saved) sv;
    PAR_FN(par_tp_mlp_shard) shw; /* the shared expert's shard (w2's columns copied, their gradient) */
    int used;
} moe_slot;

struct PAR_FN(par_tp_moe_hook_s) {
    par_tp tp, one; /* the shared expert's group; the routed experts' (one rank) */
    int nb, n_slots, rank, P, E;
    int64_t d, I, Il;
    moe_slot *sl; /* [n_slots, nb] */
    par_tp_traffic tr;
    int64_t sh_units;
};

typedef PAR_FN(par_tp_moe_hook) mhook;

static void slot_free(moe_slot *q)
{
    PAR_FN(par_etp_moe_saved_free)(&q->sv);
    PAR_FN(par_tp_mlp_shard_free)(&q->shw);
    memset(q, 0, sizeof *q);
}

static moe_slot *slot_of(mhook *h, const par_mbctx *x, int b)
{
    int k = x ? x->slot : 0;
    if (k < 0 || k >= h->n_slots || b < 0 || b >= h->nb)
        return NULL;
    return &h->sl[(size_t)k * (size_t)h->nb + (size_t)b];
}

/* 1 when M holds block b's shared expert as this rank's shards (w1 / w3
 * rows, w2 columns: parallel/layout/tp_split.h par_tp_storage_cut under
 * par_tp_shared_expert_split): the hook reads and accumulates them in
 * place. */
static int held_shards(const PAR_FN(par_model) *M, int b)
{
    return PAR_FN(par_model_cut_of)(M, M->tab.blocks[b].shared_w1) != NULL;
}

/* Block b's weights: every routed expert whole, the shared expert's shard. */
static par_status weights_of(mhook *h, PAR_FN(par_model) *M, int b, const moe_slot *q, PAR_FN(par_etp_weights) *W)
{
    const size_t E = (size_t)h->E;
    if (M->e0 != 0 || M->e1 != (int64_t)E)
        return par_err(PAR_EINVAL, "tp shared expert: block %d: the model holds experts [%lld, %lld) of %zu (EP = 1)",
                       b, (long long)M->e0, (long long)M->e1, E);
    const par_real *const *ew = PAR_FN(par_model_ew_row)(M, b, 0); /* [3, E]: every expert held */
    for (size_t e = 0; e < 3 * E; e++)
        if (!ew[e])
            return par_err(PAR_EINVAL, "tp shared expert: block %d does not hold every routed expert (EP = 1)", b);
    *W = (PAR_FN(par_etp_weights)){.w1 = ew, .w2 = ew + E, .w3 = ew + 2 * E,
                                   .sw1 = q->shw.w1, .sw2 = q->shw.w2, .sw3 = q->shw.w3};
    return PAR_OK;
}

static par_status moe_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y,
                          const par_real *xin, const int32_t *idx, const par_real *w, const int32_t *tokens,
                          int64_t T)
{
    mhook *h = ctx;
    moe_slot *q = slot_of(h, x, b);
    (void)tokens;
    if (!q)
        return par_err(PAR_EINVAL, "tp shared expert: block %d does not fit the hook (%d blocks, %d slots)", b, h->nb,
                       h->n_slots);
    slot_free(q);
    const par_block_params *bp = &M->tab.blocks[b];
    par_status s = PAR_FN(par_tp_mlp_shard_make)(&q->shw, PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1),
                                                 PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2),
                                                 PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3), h->d, h->I,
                                                 &h->tp, held_shards(M, b));
    PAR_FN(par_etp_weights) W;
    if (s || (s = weights_of(h, M, b, q, &W)))
        return s;
    h->sh_units += (h->tp.sp ? T * h->P : T) * h->Il;
    q->used = 1;
    return PAR_FN(par_etp_moe_forward)(y, &q->sv, xin, idx, w, &W, T, h->d, h->E, (int)M->K, h->I,
                                       M->cfg.swiglu_limit, &h->one, &h->tp);
}

/* B: dx, dw and every weight gradient (the w2 shard's added into the held
 * shard, or rank r's columns of a whole gradient). */
static par_status moe_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx, par_real *dw,
                          const par_real *dy, const par_real *xin, const par_real *w, int64_t T)
{
    mhook *h = ctx;
    moe_slot *q = slot_of(h, x, b);
    (void)xin, (void)w, (void)T;
    if (!q || !q->used)
        return par_err(PAR_EINVAL, "tp shared expert backward: block %d has no forward", b);
    const par_block_params *bp = &M->tab.blocks[b];
    const size_t E = (size_t)h->E;
    PAR_FN(par_etp_weights) W;
    par_status s = weights_of(h, M, b, q, &W);
    if (s)
        return s;
    par_real **egw = PAR_FN(par_model_egw_row)(M, b, 0); /* [3, E] (weights_of checked) */
    PAR_FN(par_etp_grads) G = {.w1 = egw, .w2 = egw + E, .w3 = egw + 2 * E, .sw2 = q->shw.dw2};
    PAR_FN(par_tp_mlp_shard_grads)(&q->shw, PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w1),
                                   PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w3), &G.sw1, &G.sw3);
    if ((s = PAR_FN(par_etp_moe_backward)(dx, dw, &G, dy, &q->sv, &W, &h->one, &h->tp)))
        return s;
    PAR_FN(par_tp_mlp_shard_add_dw2)(&q->shw, PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w2));
    q->used = 0;
    return PAR_OK;
}

static par_status moe_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, const par_real *dy,
                          const par_real *xin, int64_t T)
{
    (void)ctx, (void)x, (void)M, (void)b, (void)dy, (void)xin, (void)T;
    return PAR_OK; /* B added every gradient */
}

par_status PAR_FN(par_tp_moe_hook_create)(PAR_FN(par_tp_moe_hook) **out, par_comm *tp, const PAR_FN(par_model) *M,
                                          int n_slots, int sp, unsigned faults)
{
    *out = NULL;
    const int P = tp ? par_comm_size(tp) : 1;
    if (!tp || n_slots < 1)
        return par_err(PAR_EINVAL, "tp shared expert: a hook needs a TP group and at least one slot (got %d)",
                       n_slots);
    if (M->I % P != 0)
        return par_err(PAR_EINVAL, "tensor-model-parallel-size %d does not divide moe_inter_dim %lld (TP splits the "
                       "shared expert's hidden units)", P, (long long)M->I);
    mhook *h = par_calloc(1, sizeof *h, PAR_TAG_MODEL);
    if (!h)
        return par_err(PAR_ENOMEM, "tp shared expert: out of memory");
    h->tp = (par_tp){.comm = tp, .sp = sp, .faults = faults, .traffic = &h->tr};
    h->one = (par_tp){.comm = NULL};
    h->nb = M->n_blocks, h->n_slots = n_slots, h->rank = par_comm_rank(tp), h->P = P, h->E = (int)M->E;
    h->d = M->d, h->I = M->I, h->Il = M->I / P;
    h->sl = par_calloc((size_t)n_slots * (size_t)(h->nb > 0 ? h->nb : 1), sizeof *h->sl, PAR_TAG_ACT);
    if (!h->sl) {
        par_free(h);
        return par_err(PAR_ENOMEM, "tp shared expert: out of memory for %d x %d states", n_slots, h->nb);
    }
    *out = h;
    return PAR_OK;
}

void PAR_FN(par_tp_moe_hook_install)(PAR_FN(par_tp_moe_hook) *h, PAR_FN(par_model) *M)
{
    M->moe.fwd = moe_fwd;
    M->moe.bwd = moe_bwd;
    M->moe.wgt = moe_wgt;
    M->moe.ctx = h;
}

void PAR_FN(par_tp_moe_hook_traffic)(const PAR_FN(par_tp_moe_hook) *h, par_tp_traffic *out)
{
    if (h)
        *out = h->tr;
    else
        memset(out, 0, sizeof *out);
}

void PAR_FN(par_tp_moe_hook_shared_stats)(const PAR_FN(par_tp_moe_hook) *h, par_tp_shared_stats *out)
{
    *out = (par_tp_shared_stats){.units = h ? h->sh_units : 0, .bytes = h ? par_tp_traffic_bytes(&h->tr) : 0};
}

void PAR_FN(par_tp_moe_hook_free)(PAR_FN(par_tp_moe_hook) *h)
{
    if (!h)
        return;
    for (int i = 0; h->sl && i < h->n_slots * h->nb; i++)
        slot_free(&h->sl[i]);
    par_free(h->sl);
    par_free(h);
}
