/* parallel/moe/ep.c - the expert-parallel MoE executor: forward, the input
 * pass (B) and the weight pass (W) of the routed experts around the
 * transport of parallel/moe/ep_dispatch.c (see parallel/moe/ep.h, docs/parallel.md
 * "Expert parallelism"). */
#include "parallel/moe/ep.h"

#include <stdlib.h>
#include <string.h>

#include "comm/clock.h"
#include "core/alloc.h"
#include "kernels/moe.h"
#include "parallel/moe/ep-impl.h"

/* The owner's order of the hierarchical rows: (source EP rank, t), the flat
 * path's receive order for one expert. */
typedef struct {
    int32_t src, t, r;
} hkey;

static int hkey_cmp(const void *a, const void *b)
{
    const hkey *p = a, *q = b;
    if (p->src != q->src)
        return p->src < q->src ? -1 : 1;
    if (p->t != q->t)
        return p->t < q->t ? -1 : 1;
    return (p->r > q->r) - (p->r < q->r);
}

/* Where the state of (microbatch slot, block) lives, NULL out of range. */
static blk_state **slot_of(ep_t *x, const par_mbctx *c, int b)
{
    int slot = c ? c->slot : 0;
    if (slot < 0 || slot >= x->n_slots || b < 0 || b >= x->n_blocks || x->row[b] < 0)
        return NULL;
    return &x->blk[(size_t)slot * (size_t)x->n_rows + (size_t)x->row[b]];
}

/* The state of (slot, block) between its forward and its weight pass, NULL
 * out of range or when there is none. */
static blk_state *state_of(ep_t *x, const par_mbctx *c, int b)
{
    blk_state **sp = slot_of(x, c, b);
    return sp ? *sp : NULL;
}

static par_status no_state(const ep_t *x, const par_mbctx *c, int b)
{
    return par_err(PAR_EINVAL, "ep: block %d of slot %d: the executor has %d slots of %d held blocks (of %d)", b,
                   c ? c->slot : 0, x->n_slots, x->n_rows, x->n_blocks);
}

/* The shared expert's weights of block b (NULL when there is none). */
static int shared_of(const PAR_FN(par_model) *M, int b, const par_real **sw)
{
    const par_block_params *bp = &M->tab.blocks[b];
    sw[0] = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1);
    sw[1] = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2);
    sw[2] = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3);
    return sw[0] && sw[1] && sw[2];
}

/* --cost-as: one pass (forward, input or weight half of the backward) of
 * the held experts over the NR rows received, as the target's FLOPs. */
static void charge_experts(ep_t *x, int64_t NR)
{
    if (x->ca)
        par_comm_charge(x->c, (double)NR * x->ca->row_mul * x->ca->blk_mul[x->cur_b] * x->ca->expert_flops);
}

/* ------------------------------------------------------------- forward -- */

/* The received rows in expert-major order (per expert in (source rank, t)
 * order; flat: the received order already is): S->eoff, rpos, xg, rwg. */
static par_status expert_major(ep_t *x, blk_state *S, int b, const par_real *rbuf, const int32_t *rids, int64_t d)
{
    const int64_t El = x->El, NR = S->nrecv;
    int64_t *cur = xalloc((size_t)El + 1, sizeof *cur);
    hkey *ord = x->mode == PAR_EP_HIER ? xalloc((size_t)NR, sizeof *ord) : NULL;
    S->eoff = xcalloc((size_t)El + 1, sizeof *S->eoff);
    S->rpos = xalloc((size_t)NR, sizeof *S->rpos);
    S->xg = xalloc((size_t)(NR * d), sizeof *S->xg);
    S->rwg = xalloc((size_t)NR, sizeof *S->rwg);
    par_status s = PAR_OK;
    if (!cur || !S->eoff || !S->rpos || !S->xg || !S->rwg || (x->mode == PAR_EP_HIER && !ord)) {
        s = par_err(PAR_ENOMEM, "ep: block %d forward: out of memory for %lld received rows", b, (long long)NR);
        goto done;
    }
    for (int64_t r = 0; r < NR; r++) {
        int64_t l = rids[3 * r] - x->e0;
        if (l < 0 || l >= El) {
            s = par_err(PAR_EINTERNAL, "ep: block %d: rank %d received a row for expert %d, it holds [%lld, %lld)", b,
                        x->me, (int)rids[3 * r], (long long)x->e0, (long long)(x->e0 + El));
            goto done;
        }
        S->eoff[l + 1]++;
    }
    for (int64_t l = 0; l < El; l++)
        S->eoff[l + 1] += S->eoff[l];
    memcpy(cur, S->eoff, (size_t)El * sizeof *cur);
    for (int64_t r = 0; ord && r < NR; r++)
        ord[r] = (hkey){.src = rids[3 * r + 1], .t = rids[3 * r + 2], .r = (int32_t)r};
    if (ord)
        qsort(ord, (size_t)NR, sizeof *ord, hkey_cmp);
    for (int64_t q = 0; q < NR; q++) {
        int64_t r = ord ? ord[q].r : q;
        int64_t p = cur[rids[3 * r] - x->e0]++;
        S->rpos[r] = (int32_t)p;
        memcpy(S->xg + p * d, rbuf + r * (d + 1), (size_t)d * sizeof *S->xg);
        S->rwg[p] = rbuf[r * (d + 1) + d];
    }
done:
    par_free(cur);
    par_free(ord);
    return s;
}

/* The held experts, ascending, on their expert-major rows into yg [NR, d]. */
static par_status run_experts(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b, par_real *yg)
{
    const int64_t d = M->d, I = M->I, NR = S->nrecv;
    if (x->etp.comm) /* ETP inside EP: the slices over the ETP group */
        return PAR_FN(par__ep_etp_forward)(x, S, M, b, yg);
    S->g = xalloc((size_t)(NR * I), sizeof *S->g);
    S->u = xalloc((size_t)(NR * I), sizeof *S->u);
    S->h = xalloc((size_t)(NR * I), sizeof *S->h);
    if (!S->g || !S->u || !S->h)
        return par_err(PAR_ENOMEM, "ep: block %d forward: out of memory for %lld expert rows", b, (long long)NR);
    charge_experts(x, NR);
    for (int64_t l = 0; l < x->El; l++) {
        int64_t o = S->eoff[l], n = S->eoff[l + 1] - o;
        PAR_FN(par_moe_expert_forward)(yg + o * d, S->g + o * I, S->u + o * I, S->h + o * I, S->xg + o * d,
                                       S->rwg + o, PAR_FN(par_model_ew_row)(M, b, 0)[l],
                                       PAR_FN(par_model_ew_row)(M, b, 1)[l], PAR_FN(par_model_ew_row)(M, b, 2)[l],
                                       n, d, I, M->cfg.swiglu_limit);
    }
    return PAR_OK;
}

/* Outputs back in the order received (rbuf reused as [NR, d]) into slots,
 * the shared expert, the contract's per-token sum into y. */
static par_status combine_forward(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b, par_real *y,
                                  const par_real *x_in, par_real *rbuf, const par_real *yg, int64_t T)
{
    const int K = (int)M->K;
    const int64_t d = M->d, I = M->I;
    for (int64_t r = 0; r < S->nrecv; r++)
        memcpy(rbuf + r * d, yg + (int64_t)S->rpos[r] * d, (size_t)d * sizeof *rbuf);
    par_real *slots = xalloc((size_t)(S->nsend * d), sizeof *slots), *ysh = xalloc((size_t)(T * d), sizeof *ysh);
    par_status s = slots && ysh ? PAR_OK
                                : par_err(PAR_ENOMEM, "ep: block %d forward: out of memory (T=%lld)", b, (long long)T);
    double t2 = par_comm_vclock(x->c);
    if (!s && !(s = PAR_FN(par__ep_return_rows)(x, S, rbuf, d, slots)))
        x->cnt.combine_s += par_comm_vclock(x->c) - t2;
    const par_real *sw[3];
    int shared = shared_of(M, b, sw);
    if (!s && shared && x->shtp.comm) /* the TP shared expert (ep_tp.c) */
        s = PAR_FN(par__ep_shared_forward)(x, S, M, b, ysh, x_in, T);
    else if (!s && shared) {
        x->sh_units += T * I;
        S->sg = xalloc((size_t)(T * I), sizeof *S->sg);
        S->su = xalloc((size_t)(T * I), sizeof *S->su);
        S->sh = xalloc((size_t)(T * I), sizeof *S->sh);
        if (!S->sg || !S->su || !S->sh)
            s = par_err(PAR_ENOMEM, "ep: block %d forward: out of memory for the shared expert", b);
        else
            PAR_FN(par_moe_expert_forward)(ysh, S->sg, S->su, S->sh, x_in, NULL, sw[0], sw[1], sw[2], T, d, I,
                                           M->cfg.swiglu_limit);
    }
    if (!s)
        PAR_FN(par_moe_combine)(y, slots, shared ? ysh : NULL, T, K, d, 0);
    par_free(slots);
    par_free(ysh);
    return s;
}

static par_status ep_fwd(void *ctx, const par_mbctx *c, PAR_FN(par_model) *M, int b, par_real *y,
                         const par_real *x_in, const int32_t *idx, const par_real *w, const int32_t *tokens, int64_t T)
{
    ep_t *x = ctx;
    blk_state **sp = slot_of(x, c, b);
    if (!sp)
        return no_state(x, c, b);
    if (*sp) /* a forward again without its weight pass (a failed step): the old state goes */
        PAR_FN(par__ep_blk_free)(*sp);
    else if (!(*sp = xcalloc(1, sizeof **sp)))
        return par_err(PAR_ENOMEM, "ep: block %d forward: out of memory for its state", b);
    blk_state *S = *sp;
    const int K = (int)M->K;
    const int64_t d = M->d;
    par_real *rbuf = NULL, *yg = NULL;
    int32_t *rids = NULL;
    S->T = T;
    S->nsend = T * K;
    x->cur_b = b;
    if (x->mode == PAR_EP_HIER && K > 64)
        return par_err(PAR_EUNSUPPORTED, "ep: hierarchical dispatch supports up to 64 experts per token (K = %d)", K);
    double t0 = par_comm_vclock(x->c);
    par_status s = x->mode == PAR_EP_HIER
                       ? PAR_FN(par__ep_hier_dispatch)(x, S, x_in, idx, w, T, K, d, &rbuf, &rids)
                       : PAR_FN(par__ep_flat_dispatch)(x, S, x_in, idx, w, tokens, T, K, d, &rbuf, &rids);
    if (!s) {
        x->cnt.dispatch_s += par_comm_vclock(x->c) - t0;
        x->cnt.rows_sent += S->nsend;
        x->cnt.rows_recv += S->nrecv;
        s = expert_major(x, S, b, rbuf, rids, d);
    }
    if (!s && x->tpdup) /* TP copies: left out of the weight pass (ep_tp.c) */
        s = PAR_FN(par__ep_tp_mark)(x, S, rids);
    if (!s && !(yg = xalloc((size_t)(S->nrecv * d), sizeof *yg)))
        s = par_err(PAR_ENOMEM, "ep: block %d forward: out of memory (%lld rows received)", b, (long long)S->nrecv);
    if (!s && !(s = run_experts(x, S, M, b, yg)))
        s = combine_forward(x, S, M, b, y, x_in, rbuf, yg, T);
    par_free(rbuf);
    par_free(rids);
    par_free(yg);
    return s;
}

/* ------------------------------------------------------------ backward -- */

/* B, owner side: dy rows to the owners (kept expert-major in S->dyg for
 * W), the held experts' input gradients (dx, d rw) in received order into
 * rbuf [NR, d+1]. */
static par_status experts_input(ep_t *x, blk_state *S, PAR_FN(par_model) *M, int b, const par_real *dy,
                                par_real *rbuf)
{
    const int K = (int)M->K;
    const int64_t d = M->d, I = M->I, NR = S->nrecv;
    par_free(S->dyg);
    S->dyg = xalloc((size_t)(NR * d), sizeof *S->dyg);
    par_real *dxg = xcalloc((size_t)(NR * (d + 1)), sizeof *dxg);
    par_status s = S->dyg && dxg ? PAR_OK
                                 : par_err(PAR_ENOMEM, "ep: block %d backward: out of memory (%lld rows received)", b,
                                           (long long)NR);
    double t0 = par_comm_vclock(x->c);
    if (!s && !(s = PAR_FN(par__ep_dispatch_dy)(x, S, dy, K, d, rbuf))) {
        x->cnt.dispatch_s += par_comm_vclock(x->c) - t0;
        for (int64_t r = 0; r < NR; r++)
            memcpy(S->dyg + (int64_t)S->rpos[r] * d, rbuf + r * d, (size_t)d * sizeof *rbuf);
    }
    par_real *drwg = dxg ? dxg + NR * d : NULL;
    if (!s)
        charge_experts(x, NR);
    if (!s && x->etp.comm) /* ETP inside EP: input and weight gradients of the slices */
        s = PAR_FN(par__ep_etp_backward)(x, S, M, b, dxg, drwg);
    for (int64_t l = 0; l < x->El && !s && !x->etp.comm; l++) {
        int64_t o = S->eoff[l], n = S->eoff[l + 1] - o;
        s = PAR_FN(par_moe_expert_backward)(dxg + o * d, NULL, NULL, NULL, drwg + o, S->dyg + o * d, S->xg + o * d,
                                            S->rwg + o, PAR_FN(par_model_ew_row)(M, b, 0)[l],
                                            PAR_FN(par_model_ew_row)(M, b, 1)[l], PAR_FN(par_model_ew_row)(M, b, 2)[l],
                                            S->g + o * I, S->u + o * I, S->h + o * I, n, d, I, M->cfg.swiglu_limit);
    }
    for (int64_t r = 0; r < NR && !s; r++) {
        int64_t p = S->rpos[r];
        memcpy(rbuf + r * (d + 1), dxg + p * d, (size_t)d * sizeof *rbuf);
        rbuf[r * (d + 1) + d] = drwg[p];
    }
    par_free(dxg);
    return s;
}

/* B: the held experts' input gradients back to the token's rank in slot
 * order, then the shared expert's dx and the serial backward's combine. */
static par_status ep_bwd(void *ctx, const par_mbctx *c, PAR_FN(par_model) *M, int b, par_real *dx, par_real *dw,
                         const par_real *dy, const par_real *x_in, const par_real *w, int64_t T)
{
    ep_t *x = ctx;
    blk_state *S = state_of(x, c, b);
    (void)w;
    if (!S)
        return slot_of(x, c, b) ? par_err(PAR_EINVAL, "ep: block %d backward without its forward", b)
                                : no_state(x, c, b);
    const int K = (int)M->K;
    const int64_t d = M->d, NS = S->nsend, NR = S->nrecv;
    if (S->T != T)
        return par_err(PAR_EINVAL, "ep: block %d backward for T=%lld tokens, its forward had %lld", b, (long long)T,
                       (long long)S->T);
    x->cur_b = b;
    par_real *rbuf = xalloc((size_t)(NR * (d + 1)), sizeof *rbuf), *back = xalloc((size_t)(NS * (d + 1)), sizeof *back);
    par_real *slots = xalloc((size_t)(NS * d), sizeof *slots), *dxs = xcalloc((size_t)(T * d), sizeof *dxs);
    par_status s = rbuf && back && slots && dxs ? experts_input(x, S, M, b, dy, rbuf)
                                                : par_err(PAR_ENOMEM, "ep: block %d backward: out of memory (T=%lld)",
                                                          b, (long long)T);
    double t2 = par_comm_vclock(x->c);
    if (!s && !(s = PAR_FN(par__ep_return_rows)(x, S, rbuf, d + 1, back)))
        x->cnt.combine_s += par_comm_vclock(x->c) - t2;
    const par_real *sw[3];
    int shared = shared_of(M, b, sw);
    if (!s && shared && x->shtp.comm) /* dx and the shard's weight gradients (ep_tp.c) */
        s = PAR_FN(par__ep_shared_backward)(x, S, M, b, dxs, dy);
    else if (!s && shared)
        s = PAR_FN(par_moe_expert_backward)(dxs, NULL, NULL, NULL, NULL, dy, x_in, NULL, sw[0], sw[1], sw[2], S->sg,
                                            S->su, S->sh, T, d, M->I, M->cfg.swiglu_limit);
    if (!s) {
        for (int64_t i = 0; i < NS; i++)
            memcpy(slots + i * d, back + i * (d + 1), (size_t)d * sizeof *slots);
        if (dx)
            PAR_FN(par_moe_combine)(dx, slots, shared ? dxs : NULL, T, K, d, 1);
        for (int64_t i = 0; dw && i < NS; i++)
            dw[i] += back[i * (d + 1) + d];
    }
    par_free(rbuf);
    par_free(back);
    par_free(slots);
    par_free(dxs);
    return s;
}

/* W: the held experts' weight gradients from the kept dy rows (on this
 * rank: no communication), then the shared expert's. */
static par_status ep_wgt(void *ctx, const par_mbctx *c, PAR_FN(par_model) *M, int b, const par_real *dy,
                         const par_real *x_in, int64_t T)
{
    ep_t *x = ctx;
    blk_state **sp = slot_of(x, c, b), *S = sp ? *sp : NULL;
    if (!sp)
        return no_state(x, c, b);
    if (!S || !S->dyg || S->T != T)
        return par_err(PAR_EINVAL, "ep: block %d weight pass without its input pass", b);
    const int64_t d = M->d, I = M->I;
    const double L = M->cfg.swiglu_limit;
    par_status s = PAR_OK;
    x->cur_b = b;
    PAR_FN(par__ep_tp_mask_dy)(S, d);
    charge_experts(x, S->nrecv);
    for (int64_t l = 0; l < x->El && !s && !x->etp.comm; l++) { /* ETP: done in B */
        int64_t o = S->eoff[l], n = S->eoff[l + 1] - o;
        s = PAR_FN(par_moe_expert_backward)(NULL, PAR_FN(par_model_egw_row)(M, b, 0)[l],
                                            PAR_FN(par_model_egw_row)(M, b, 1)[l], PAR_FN(par_model_egw_row)(M, b, 2)[l],
                                            NULL, S->dyg + o * d, S->xg + o * d, S->rwg + o,
                                            PAR_FN(par_model_ew_row)(M, b, 0)[l], PAR_FN(par_model_ew_row)(M, b, 1)[l],
                                            PAR_FN(par_model_ew_row)(M, b, 2)[l], S->g + o * I, S->u + o * I,
                                            S->h + o * I, n, d, I, L);
    }
    par_free(S->dyg);
    S->dyg = NULL;
    const par_block_params *bp = &M->tab.blocks[b];
    const par_real *sw[3];
    if (!s && !x->shtp.comm && shared_of(M, b, sw)) /* the TP shared expert's: done in B */
        s = PAR_FN(par_moe_expert_backward)(NULL, PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w1),
                                            PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w2),
                                            PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w3), NULL, dy, x_in, NULL,
                                            sw[0], sw[1], sw[2], S->sg, S->su, S->sh, T, d, I, L);
    /* the microbatch's backward of this block is done: its state goes now,
     * not at the slot's next forward (a step holds at most the microbatches
     * in flight, not all of them) */
    PAR_FN(par__ep_blk_drop)(sp);
    return s;
}

/* ----------------------------------------------------------- lifecycle -- */

/* EP ranks by (node, rank), for grouping the ranks of a node. */
typedef struct {
    int node, i;
} nkey;

static int nkey_cmp(const void *a, const void *b)
{
    const nkey *p = a, *q = b;
    if (p->node != q->node)
        return p->node < q->node ? -1 : 1;
    return (p->i > q->i) - (p->i < q->i);
}

/* node[j] = world rank / gpn.  The relay of sender s on the node of rank j,
 * rel(s, j), is s itself on s's node, else the EP rank of j's node whose
 * local index (its place among that node's EP ranks, ascending) is s's
 * local index modulo the node's EP ranks.  This rank needs only rel(me, j)
 * and rel(j, me): x->rel holds those 2 EP entries, found from the ranks
 * sorted by (node, rank) in O(EP log EP) (no EP x EP table). */
static par_status build_nodes(ep_t *x, int gpn)
{
    const int EP = x->EP, me = x->me;
    int *node = par_malloc((size_t)EP * sizeof *node, PAR_TAG_MODEL);
    int *rel = par_malloc((size_t)EP * 2 * sizeof *rel, PAR_TAG_MODEL);
    int *loc = par_malloc((size_t)EP * 3 * sizeof *loc, PAR_TAG_MODEL);
    nkey *ord = par_malloc((size_t)EP * sizeof *ord, PAR_TAG_MODEL);
    if (!node || !rel || !loc || !ord) {
        par_free(node);
        par_free(rel);
        par_free(loc);
        par_free(ord);
        return par_err(PAR_ENOMEM, "ep: out of memory for the node map of %d ranks", EP);
    }
    int *nsz = loc + EP, *first = loc + 2 * EP; /* j's node: its EP ranks, where they start in ord */
    for (int j = 0; j < EP; j++) {
        node[j] = par_comm_world_rank(x->c, j) / gpn;
        ord[j] = (nkey){.node = node[j], .i = j};
    }
    qsort(ord, (size_t)EP, sizeof *ord, nkey_cmp);
    for (int g0 = 0, g1; g0 < EP; g0 = g1) {
        for (g1 = g0; g1 < EP && ord[g1].node == ord[g0].node; g1++)
            ;
        for (int k = g0; k < g1; k++) {
            loc[ord[k].i] = k - g0;
            nsz[ord[k].i] = g1 - g0;
            first[ord[k].i] = g0;
        }
    }
    for (int j = 0; j < EP; j++) {
        rel[j] = node[j] == node[me] ? me : ord[first[j] + loc[me] % nsz[j]].i;
        rel[EP + j] = node[j] == node[me] ? j : ord[first[me] + loc[j] % nsz[me]].i;
    }
    par_free(loc);
    par_free(ord);
    par_free(x->node);
    par_free(x->rel);
    x->node = node;
    x->rel = rel;
    x->gpn = gpn;
    return PAR_OK;
}

par_status PAR_FN(par_ep_create)(PAR_FN(par_ep) **out, par_comm *ep, PAR_FN(par_model) *M)
{
    *out = NULL;
    int EP = par_comm_size(ep), me = par_comm_rank(ep);
    if (EP < 1 || M->E % EP != 0)
        return par_err(PAR_EINVAL, "ep: expert-model-parallel-size %d does not divide n_routed_experts %lld", EP,
                       (long long)M->E);
    int64_t El = M->E / EP;
    if (M->e0 != me * El || M->e1 != (me + 1) * El)
        return par_err(PAR_EINVAL,
                       "ep: EP rank %d of %d must hold experts [%lld, %lld), the model holds [%lld, %lld)", me, EP,
                       (long long)(me * El), (long long)((me + 1) * El), (long long)M->e0, (long long)M->e1);
    ep_t *x = par_calloc(1, sizeof *x, PAR_TAG_MODEL);
    if (!x)
        return par_err(PAR_ENOMEM, "ep: out of memory");
    x->c = ep;
    x->EP = EP;
    x->me = me;
    x->E = M->E;
    x->El = El;
    x->e0 = M->e0;
    x->n_blocks = M->n_blocks;
    x->n_slots = 1;
    x->mode = PAR_EP_FLAT;
    x->row = par_malloc((size_t)M->n_blocks * sizeof *x->row, PAR_TAG_MODEL);
    for (int b = 0; x->row && b < M->n_blocks; b++) /* state for the blocks whose experts are held only */
        x->row[b] = PAR_FN(par_model_holds)(M, M->tab.blocks[b].expert0 + 3 * (int)M->e0) ? x->n_rows++ : -1;
    x->blk = x->row ? par_calloc((size_t)(x->n_rows > 0 ? x->n_rows : 1), sizeof *x->blk, PAR_TAG_MODEL) : NULL;
    /* (one pointer per held block and slot: the states come and go with the microbatches) */
    par_status s = x->blk ? build_nodes(x, 8) : par_err(PAR_ENOMEM, "ep: out of memory");
    if (s) {
        PAR_FN(par_ep_free)(x);
        return s;
    }
    *out = x;
    return PAR_OK;
}

void PAR_FN(par_ep_install)(PAR_FN(par_ep) *x, PAR_FN(par_model) *M)
{
    M->moe.fwd = ep_fwd;
    M->moe.bwd = ep_bwd;
    M->moe.wgt = ep_wgt;
    M->moe.ctx = x;
}

par_status PAR_FN(par_ep_set_dispatch)(PAR_FN(par_ep) *x, par_ep_dispatch mode, int gpus_per_node)
{
    if (mode != PAR_EP_FLAT && mode != PAR_EP_HIER)
        return par_err(PAR_EINVAL, "ep: dispatch mode must be flat (0) or hierarchical (1), got %d", (int)mode);
    if (gpus_per_node < 1)
        return par_err(PAR_EINVAL, "ep: gpus per node must be >= 1 (got %d)", gpus_per_node);
    par_status s = build_nodes(x, gpus_per_node);
    if (s)
        return s;
    PAR_FN(par__ep_blk_drop_all)(x);
    x->mode = mode;
    return PAR_OK;
}

par_status PAR_FN(par_ep_set_slots)(PAR_FN(par_ep) *x, int n)
{
    if (n < 1)
        return par_err(PAR_EINVAL, "ep: the number of state slots must be >= 1 (got %d)", n);
    blk_state **nb = par_calloc((size_t)n * (size_t)(x->n_rows > 0 ? x->n_rows : 1), sizeof *nb, PAR_TAG_MODEL);
    if (!nb)
        return par_err(PAR_ENOMEM, "ep: out of memory for %d state slots", n);
    PAR_FN(par__ep_blk_drop_all)(x);
    par_free(x->blk);
    x->blk = nb;
    x->n_slots = n;
    return PAR_OK;
}

void PAR_FN(par_ep_counters_get)(const PAR_FN(par_ep) *x, par_ep_counters *out)
{
    if (!x) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = x->cnt;
    out->dispatch_bytes = out->dispatch_nvlink + out->dispatch_ib;
    out->combine_bytes = out->combine_nvlink + out->combine_ib;
}

void PAR_FN(par_ep_set_cost)(PAR_FN(par_ep) *x, const par_costas *ca) { x->ca = ca; }

void PAR_FN(par_ep_free)(PAR_FN(par_ep) *x)
{
    if (!x)
        return;
    PAR_FN(par__ep_blk_drop_all)(x);
    par_free(x->blk);
    par_free(x->row);
    par_free(x->node);
    par_free(x->rel);
    par_free(x->tpdup);
    par_free(x);
}
