/* parallel/moe/tp_moe_hook.c - the tensor-parallel shared expert hook (see
 * parallel/moe/tp_moe_hook.h, docs/parallel.md). */
#include "parallel/moe/tp_moe_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/hook/mbstate.h"
#include "parallel/moe/etp.h"
#include "parallel/layout/tp_split.h"

/* What (microbatch, block) keeps from its forward to its input pass (the
 * last that reads it: the input pass adds every gradient). */
typedef struct {
    PAR_FN(par_etp_moe_saved) sv;
    PAR_FN(par_tp_mlp_shard) shw; /* the shared expert's shard (w2's columns copied, their gradient) */
    int used;                     /* the forward ran */
} moe_state;

typedef struct {
    par_mbstate st; /* moe_state of (microbatch, block); first (par_mbstate_hook_new) */
    par_tp tp, one; /* the shared expert's group; the routed experts' (one rank) */
    int rank, P, E;
    int64_t d, I, Il;
    par_tp_traffic tr;
    int64_t sh_units;
} mhook;

static void state_drop(void *p)
{
    moe_state *q = p;
    PAR_FN(par_etp_moe_saved_free)(&q->sv);
    PAR_FN(par_tp_mlp_shard_free)(&q->shw);
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
static par_status weights_of(mhook *h, PAR_FN(par_model) *M, int b, const moe_state *q, PAR_FN(par_etp_weights) *W)
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
    moe_state *q;
    (void)tokens;
    const par_block_params *bp = &M->tab.blocks[b];
    par_status s = par_mbstate_new(&h->st, x, b, (void **)&q);
    if (!s)
        s = PAR_FN(par_tp_mlp_shard_make)(&q->shw, PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1),
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
    moe_state *q = par_mbstate_get(&h->st, x, b);
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
    par_mbstate_drop(&h->st, x, b); /* the microbatch's backward of the block is done */
    return PAR_OK;
}

static par_status moe_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, const par_real *dy,
                          const par_real *xin, int64_t T)
{
    (void)ctx, (void)x, (void)M, (void)b, (void)dy, (void)xin, (void)T;
    return PAR_OK; /* B added every gradient */
}

/* ----------------------------------------------------------- the entry -- */

/* TP > 1 splitting the shared expert with EP = ETP = 1 (EP > 1: the EP
 * executor runs it, parallel/moe/ep_tp.c; ETP > 1: the ETP hook). */
static int applies(const par_layout *l)
{
    return l->tp > 1 && l->ep <= 1 && l->etp <= 1 && par_tp_shared_expert_split(l);
}

/* PAR_EINVAL naming the numbers when TP does not divide moe_inter_dim. */
static par_status create(void **out, const par_hook_env *e, PAR_FN(par_model) *M)
{
    par_comm *tp = e->P->g.g[PAR_GROUP_TP];
    const int P = par_comm_size(tp);
    mhook *h;
    if (M->I % P != 0)
        return par_err(PAR_EINVAL, "tensor-model-parallel-size %d does not divide moe_inter_dim %lld (TP splits the "
                       "shared expert's hidden units)", P, (long long)M->I);
    par_status s = par_mbstate_hook_new((void **)&h, sizeof *h, "tp shared expert", e->n_mb, M->n_blocks, NULL,
                                        sizeof(moe_state), state_drop);
    if (s)
        return s;
    h->tp = (par_tp){.comm = tp, .sp = e->P->lay->sequence_parallel, .faults = e->tp_faults, .traffic = &h->tr};
    h->one = (par_tp){.comm = NULL};
    h->rank = par_comm_rank(tp), h->P = P, h->E = (int)M->E;
    h->d = M->d, h->I = M->I, h->Il = M->I / P;
    M->moe = (PAR_FN(par_moe_exec)){.fwd = moe_fwd, .bwd = moe_bwd, .wgt = moe_wgt, .ctx = h};
    *out = h;
    return PAR_OK;
}

static void report(const void *p, const par_hook_report *r)
{
    const mhook *h = p;
    if (r->shared)
        r->shared->units += h->sh_units, r->shared->bytes += par_tp_traffic_bytes(&h->tr);
}

const PAR_FN(par_hookset) PAR_FN(par_tp_moe_hookset) = {
    .name = "tp shared expert", .applies = applies, .create = create, .report = report, .free = par_mbstate_hook_free};
