/* model/block.c - one V4 block (mHC-wrapped attention, then mHC-wrapped MoE),
 * forward and backward (see model/model.h, MODEL.md sections 2-4 and 6). */
#include "model/model.h"

#include <string.h>

#include "core/device.h"
#include "kernels/ops.h"

#include "model/model-impl.h"

static void attn_weights(const PAR_FN(par_model) *M, int b, par_real *flat,
                         PAR_FN(par_attn_weights) *W, int with_indexer)
{
    const par_block_params *bp = &M->tab.blocks[b];
    memset(W, 0, sizeof *W);
    W->wq_a = PAR_FN(par_model_ptr)(M, flat, bp->wq_a);
    W->q_norm = PAR_FN(par_model_ptr)(M, flat, bp->q_norm);
    W->wq_b = PAR_FN(par_model_ptr)(M, flat, bp->wq_b);
    W->wkv = PAR_FN(par_model_ptr)(M, flat, bp->wkv);
    W->kv_norm = PAR_FN(par_model_ptr)(M, flat, bp->kv_norm);
    W->wo_a = PAR_FN(par_model_ptr)(M, flat, bp->wo_a);
    W->wo_b = PAR_FN(par_model_ptr)(M, flat, bp->wo_b);
    W->attn_sink = PAR_FN(par_model_ptr)(M, flat, bp->attn_sink);
    W->cmp_wkv = PAR_FN(par_model_ptr)(M, flat, bp->cmp_wkv);
    W->cmp_wgate = PAR_FN(par_model_ptr)(M, flat, bp->cmp_wgate);
    W->cmp_ape = PAR_FN(par_model_ptr)(M, flat, bp->cmp_ape);
    W->cmp_norm = PAR_FN(par_model_ptr)(M, flat, bp->cmp_norm);
    if (with_indexer) {
        W->idx_wq_b = PAR_FN(par_model_ptr)(M, flat, bp->idx_wq_b);
        W->idx_weights_proj = PAR_FN(par_model_ptr)(M, flat, bp->idx_weights_proj);
        W->idx_cmp_wkv = PAR_FN(par_model_ptr)(M, flat, bp->idx_cmp_wkv);
        W->idx_cmp_wgate = PAR_FN(par_model_ptr)(M, flat, bp->idx_cmp_wgate);
        W->idx_cmp_ape = PAR_FN(par_model_ptr)(M, flat, bp->idx_cmp_ape);
        W->idx_cmp_norm = PAR_FN(par_model_ptr)(M, flat, bp->idx_cmp_norm);
    }
}

static void moe_weights(const PAR_FN(par_model) *M, int b, par_moe_weights *W, par_moe_grads *dW)
{
    const par_block_params *bp = &M->tab.blocks[b];
    /* the serial kernels index experts globally: every expert held here */
    W->w1 = PAR_FN(par_model_ew_row)(M, b, 0);
    W->w2 = PAR_FN(par_model_ew_row)(M, b, 1);
    W->w3 = PAR_FN(par_model_ew_row)(M, b, 2);
    W->sw1 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1);
    W->sw2 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2);
    W->sw3 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3);
    if (dW) {
        dW->w1 = PAR_FN(par_model_egw_row)(M, b, 0);
        dW->w2 = PAR_FN(par_model_egw_row)(M, b, 1);
        dW->w3 = PAR_FN(par_model_egw_row)(M, b, 2);
        dW->sw1 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w1);
        dW->sw2 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w2);
        dW->sw3 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w3);
    }
}

void PAR_FN(par_block_act_release)(PAR_FN(par_block_act) *a)
{
    PAR_FN(par_moe_saved_free)(&a->ms);
    par_free(a->gs);
    par_free(a->glog);
    a->gs = a->glog = NULL;
}

/* The attention sub-layer of block b: Xmid = hc_post(Attention(norm(hc_pre(Xin)))). */
static par_status attn_forward(PAR_FN(par_model) *M, const par_mbctx *x, int b, PAR_FN(par_block_act) *a,
                               par_arena *ar, const par_real *Xin, const int32_t *pos, int64_t T)
{
    const par_config *c = &M->cfg;
    const par_block_params *bp = &M->tab.blocks[b];
    const par_attn_dims *dm = &M->adims[b];
    int64_t n = M->n, d = M->d, iters = c->hc_sinkhorn_iters;
    size_t hb = PAR_FN(par_hc_saved_bytes)(T, n, iters);
    void *buf = aalloc(ar, hb, 0);
    if (!buf)
        goto fail_oom;
    PAR_FN(par_hc_saved_init)(&a->hca, buf, T, n, iters);
    AREAL(a->xa, T * d, 0);
    AREAL(a->xan, T * d, 0);
    AREAL(a->rstda, T, 0);
    AREAL(a->ya, T * d, 0);
    AREAL(a->Xmid, T * n * d, 0);
    par_status s = PAR_FN(par_hc_pre_forward)(a->xa, &a->hca, Xin, P(bp->hc_attn_fn), P(bp->hc_attn_base),
                                              P(bp->hc_attn_scale), T, n, d, iters, c->hc_eps, c->norm_eps);
    if (s)
        return s;
    PAR_FN(par_rmsnorm_forward)(a->xan, a->rstda, a->xa, P(bp->attn_norm), T, d, c->norm_eps);
    PAR_FN(par_attn_weights) AW;
    attn_weights(M, b, M->params, &AW, 1);
    if (M->attn.fwd) { /* the executor keeps its own saved state; sel for the dump */
        if (dm->m == 4 && !(a->as.sel = aalloc(ar, (size_t)(T * dm->topk) * sizeof(int32_t), 0)))
            goto fail_oom;
        s = M->attn.fwd(M->attn.ctx, x, M, b, a->ya, a->as.sel, a->xan, &AW, T);
    } else {
        if (!(buf = aalloc(ar, PAR_FN(par_attn_saved_bytes)(dm, T), 1)))
            goto fail_oom;
        PAR_FN(par_attn_saved_carve)(&a->as, buf, dm, T);
        s = PAR_FN(par_attn_forward)(a->ya, &a->as, NULL, a->xan, pos, &AW, dm, T);
    }
    if (s)
        return s;
    PAR_FN(par_hc_post_forward)(a->Xmid, a->ya, Xin, a->hca.post, a->hca.C, T, n, d);
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "block %d forward: out of activation memory (T=%lld)", b, (long long)T);
}

/* The MoE sub-layer: Xout = hc_post(MoE(norm(hc_pre(Xmid)))). */
static par_status moe_forward(PAR_FN(par_model) *M, const par_mbctx *x, int b, PAR_FN(par_block_act) *a,
                              par_arena *ar, const int32_t *tokens, int64_t T)
{
    const par_config *c = &M->cfg;
    const par_block_params *bp = &M->tab.blocks[b];
    int64_t n = M->n, d = M->d, E = M->E, K = M->K, iters = c->hc_sinkhorn_iters;
    void *buf = aalloc(ar, PAR_FN(par_hc_saved_bytes)(T, n, iters), 0);
    if (!buf)
        goto fail_oom;
    PAR_FN(par_hc_saved_init)(&a->hcf, buf, T, n, iters);
    AREAL(a->xf, T * d, 0);
    AREAL(a->xfn, T * d, 0);
    AREAL(a->rstdf, T, 0);
    AREAL(a->yf, T * d, 0);
    AREAL(a->Xout, T * n * d, 0);
    AREAL(a->gw, T * K, 0);
    /* the logits and scores only live through the forward (routing,
     * statistics): the backward recomputes both from xfn (gate_recompute) */
    if (!(a->glog = par_malloc((size_t)(T * E > 0 ? T * E : 1) * sizeof *a->glog, PAR_TAG_ACT)) ||
        !(a->gs = par_malloc((size_t)(T * E > 0 ? T * E : 1) * sizeof *a->gs, PAR_TAG_ACT)))
        goto fail_oom;
    if (!(a->idx = aalloc(ar, (size_t)(T * K) * sizeof(int32_t), 0)))
        goto fail_oom;
    par_status s = PAR_FN(par_hc_pre_forward)(a->xf, &a->hcf, a->Xmid, P(bp->hc_ffn_fn), P(bp->hc_ffn_base),
                                              P(bp->hc_ffn_scale), T, n, d, iters, c->hc_eps, c->norm_eps);
    if (s)
        return s;
    PAR_FN(par_rmsnorm_forward)(a->xfn, a->rstdf, a->xf, P(bp->ffn_norm), T, d, c->norm_eps);
    const int32_t *tid2eid = a->hash ? M->i32 + M->tab.p[bp->gate_tid2eid].offset : NULL;
    const par_real *bias = a->hash ? NULL : P(bp->gate_bias);
    if ((s = PAR_FN(par_moe_gate_forward)(a->idx, a->gw, a->glog, a->gs, a->xfn, P(bp->gate_weight), bias, tid2eid,
                                          tokens, M->V, T, d, (int)E, (int)K, c->route_scale)))
        return s;
    if (M->moe.fwd) {
        s = M->moe.fwd(M->moe.ctx, x, M, b, a->yf, a->xfn, a->idx, a->gw, tokens, T);
    } else if (!(s = PAR_FN(par_moe_saved_alloc)(&a->ms, T, d, (int)E, (int)K, M->I))) {
        par_moe_weights MW;
        moe_weights(M, b, &MW, NULL);
        s = PAR_FN(par_moe_forward)(a->yf, &a->ms, a->xfn, a->idx, a->gw, &MW, T, d, (int)E, (int)K, M->I,
                                    c->swiglu_limit);
    }
    if (s)
        return s;
    PAR_FN(par_hc_post_forward)(a->Xout, a->yf, a->Xmid, a->hcf.post, a->hcf.C, T, n, d);
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "block %d forward: out of activation memory (T=%lld)", b, (long long)T);
}

static par_status no_stats_row(int b)
{
    return par_err(PAR_EINTERNAL, "block %d: the statistics of this rank have no rows for it (not one of its stages' "
                   "blocks)", b);
}

par_status PAR_FN(par_block_forward)(PAR_FN(par_model) *M, const par_mbctx *x, int b, PAR_FN(par_block_act) *a,
                                     par_arena *ar, const par_real *Xin, const int32_t *tokens,
                                     const int32_t *pos, const int32_t *sample,
                                     PAR_FN(par_stats) *st, int64_t T)
{
    const par_block_params *bp = &M->tab.blocks[b];
    int64_t E = M->E, K = M->K;
    par_status s;
    PAR_FN(par_block_act_release)(a);
    memset(a, 0, sizeof *a);
    a->b = b;
    a->T = T;
    a->hash = bp->gate_tid2eid >= 0;
    a->Xin = Xin;
    if ((s = attn_forward(M, x, b, a, ar, Xin, pos, T)) || (s = moe_forward(M, x, b, a, ar, tokens, T)))
        return s;
    /* statistics */
    if (st) {
        int64_t r = PAR_FN(par_stats_row)(st, b);
        PAR_FN(par_moe_count_loads)(st->loads + (int64_t)b * E, a->idx, T, (int)E, (int)K);
        if (!a->hash && r < 0)
            s = no_stats_row(b);
        else if (!a->hash)
            s = PAR_FN(par_moe_aux_stats)(st->cnt + r * st->Ns * E, st->psum + r * st->Ns * E, st->ntok + r * st->Ns,
                                          a->gs, a->idx, sample, T, (int)E, (int)K, st->Ns);
        if (!s && !a->hash)
            PAR_FN(par_stats_psum_terms)(st, r, a->gs, sample, T); /* the bitwise mode (a no-op outside) */
    }
    par_free(a->gs);
    par_free(a->glog);
    a->gs = a->glog = NULL;
    return s;
}

/* ---------------------------------------------------------------- backward -- */

/* The arrays of a->wk (arena memory the caller keeps until W). */
static par_status wkeep_alloc(PAR_FN(par_model) *M, PAR_FN(par_block_act) *a, par_arena *ar, int aux, int64_t T)
{
    PAR_FN(par_block_wkeep) *k = &a->wk;
    const par_attn_dims *dm = &M->adims[a->b];
    int64_t n = M->n, d = M->d;
    memset(k, 0, sizeof *k);
    AREAL(k->dyf, T * d, 1);
    AREAL(k->dw, T * M->K, 1);
    if (aux)
        AREAL(k->ds, T * M->E, 1);
    AREAL(k->dxfn, T * d, 1);
    AREAL(k->dxf, T * d, 1);
    AREAL(k->dpf, T * n, 1);
    AREAL(k->dCf, T * n * n, 1);
    AREAL(k->dya, T * d, 1);
    AREAL(k->dxan, T * d, 1);
    AREAL(k->dxa, T * d, 1);
    AREAL(k->dpa, T * n, 1);
    AREAL(k->dCa, T * n * n, 1);
    if (!M->attn.bwd) {
        void *buf = aalloc(ar, PAR_FN(par_attn_keep_bytes)(dm, T), 0);
        if (!buf)
            goto fail_oom;
        PAR_FN(par_attn_keep_carve)(&k->ak, buf, dm, T);
    }
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "block %d backward: out of memory for the weight pass's inputs (T=%lld)", a->b,
                   (long long)T);
}

/* The passes of a backward: B (input gradients, the weight pass's inputs
 * kept), W (weight gradients from them), BW (both in one pass: each kernel
 * call gets its input and weight gradient outputs at once).  IN / WT pass a
 * gradient output only to the passes that compute it. */
enum { PASS_B = 1, PASS_W = 2, PASS_BW = 3 };
#define IN(p) ((pass & PASS_B) ? (p) : NULL)
#define WT(p) ((pass & PASS_W) ? (p) : NULL)

/* The gate's logits and scores [T, E] again, from the saved normed input
 * and the same weights through the forward's own calls (the same bits):
 * a block saves [T, d] instead of [T, E] for them (heap, the caller frees). */
static par_status gate_recompute(const PAR_FN(par_model) *M, int b, const PAR_FN(par_block_act) *a, par_real **gl,
                                 par_real **gs)
{
    const int64_t T = a->T, E = M->E;
    size_t n = (size_t)(T * E > 0 ? T * E : 1);
    *gl = par_malloc(n * sizeof **gl, PAR_TAG_ACT);
    *gs = par_malloc(n * sizeof **gs, PAR_TAG_ACT);
    if (!*gl || !*gs)
        return par_err(PAR_ENOMEM, "block %d backward: out of memory for the gate's scores (T=%lld)", b, (long long)T);
    PAR_FN(par_moe_gate_logits)(*gl, a->xfn, P(M->tab.blocks[b].gate_weight), T, M->d, (int)E);
    PAR_FN(par_moe_gate_scores)(*gs, *gl, T * E);
    return PAR_OK;
}

/* The MoE sub-layer: dXmid from dXout (B), its weights (W). */
static par_status moe_backward_pass(PAR_FN(par_model) *M, const par_mbctx *x, PAR_FN(par_block_act) *a, int pass,
                                    par_real *dXmid, const par_real *dXout, const int32_t *sample,
                                    const PAR_FN(par_stats) *st, double aux_scale)
{
    const par_config *c = &M->cfg;
    const int b = a->b;
    const par_block_params *bp = &M->tab.blocks[b];
    int64_t n = M->n, d = M->d, E = M->E, K = M->K, T = a->T, iters = c->hc_sinkhorn_iters;
    PAR_FN(par_block_wkeep) *k = &a->wk;
    par_status s = PAR_OK;
    if (pass & PASS_B)
        PAR_FN(par_hc_post_backward)(k->dyf, dXmid, k->dpf, k->dCf, dXout, a->yf, a->Xmid, a->hcf.post, a->hcf.C,
                                     T, n, d);
    if (M->moe.bwd) {
        if (pass & PASS_B)
            s = M->moe.bwd(M->moe.ctx, x, M, b, k->dxfn, k->dw, k->dyf, a->xfn, a->gw, T);
        if (!s && (pass & PASS_W))
            s = M->moe.wgt(M->moe.ctx, x, M, b, k->dyf, a->xfn, T);
    } else {
        par_moe_weights MW;
        par_moe_grads MG;
        moe_weights(M, b, &MW, &MG);
        s = PAR_FN(par_moe_backward)(IN(k->dxfn), WT(&MG), IN(k->dw), k->dyf, a->xfn, a->gw, &MW, &a->ms,
                                     c->swiglu_limit);
    }
    par_real *gl = NULL, *gs = NULL;
    if (!s)
        s = gate_recompute(M, b, a, &gl, &gs);
    int64_t r = k->ds && (pass & PASS_B) ? PAR_FN(par_stats_row)(st, b) : 0;
    if (!s && r < 0)
        s = no_stats_row(b);
    if (!s && k->ds && (pass & PASS_B))
        s = PAR_FN(par_moe_aux_backward)(k->ds, st->cnt + r * st->Ns * E, st->ntok + r * st->Ns, gs, sample, T,
                                         (int)E, (int)K, st->Ns, st->Ns_global, aux_scale);
    if (!s)
        s = PAR_FN(par_moe_gate_backward)(IN(k->dxfn), WT(G(bp->gate_weight)), k->dw, k->ds, a->xfn,
                                          P(bp->gate_weight), gl, gs, a->idx, a->gw, T, d, (int)E, (int)K,
                                          c->route_scale);
    par_free(gl);
    par_free(gs);
    if (s)
        return s;
    PAR_FN(par_rmsnorm_backward)(IN(k->dxf), WT(G(bp->ffn_norm)), k->dxfn, a->xf, P(bp->ffn_norm), a->rstdf, T, d);
    return PAR_FN(par_hc_pre_backward)(IN(dXmid), WT(G(bp->hc_ffn_fn)), WT(G(bp->hc_ffn_base)),
                                       WT(G(bp->hc_ffn_scale)), k->dxf, k->dpf, k->dCf, &a->hcf, a->Xmid,
                                       P(bp->hc_ffn_fn), P(bp->hc_ffn_base), P(bp->hc_ffn_scale), T, n, d, iters,
                                       c->hc_eps, c->norm_eps);
}

/* The attention's own backward: B (dx, dsink), W (every other weight, no
 * gradient into the indexer: MODEL.md 3), BW (one pass). */
static par_status attention_pass(PAR_FN(par_model) *M, const par_mbctx *x, PAR_FN(par_block_act) *a, int pass)
{
    const int b = a->b;
    PAR_FN(par_block_wkeep) *k = &a->wk;
    PAR_FN(par_attn_weights) AW, AG;
    attn_weights(M, b, M->params, &AW, 1);
    attn_weights(M, b, M->grads, &AG, 0);
    par_real *dsink = AG.attn_sink; /* B's by-product (kernels/attention.h) */
    AG.attn_sink = NULL;
    par_status s = PAR_OK;
    if (M->attn.bwd) {
        if (pass & PASS_B)
            s = M->attn.bwd(M->attn.ctx, x, M, b, k->dxan, dsink, k->dya, &AW, a->T);
        if (!s && (pass & PASS_W))
            s = M->attn.wgt(M->attn.ctx, x, M, b, &AG, k->dya, &AW, a->T);
        return s;
    }
    if (pass == PASS_BW) {
        AG.attn_sink = dsink;
        return PAR_FN(par_attn_backward)(k->dxan, &AG, k->dya, &a->as, a->xan, k->pos, &AW, &M->adims[b], a->T);
    }
    if (pass == PASS_B)
        return PAR_FN(par_attn_backward_input)(k->dxan, dsink, &k->ak, k->dya, &a->as, a->xan, k->pos, &AW,
                                               &M->adims[b], a->T);
    return PAR_FN(par_attn_backward_weights)(&AG, &k->ak, k->dya, &a->as, a->xan, k->pos, &AW, &M->adims[b], a->T);
}

/* The attention sub-layer: dXin from dXmid (B), its weights (W). */
static par_status attn_backward_pass(PAR_FN(par_model) *M, const par_mbctx *x, PAR_FN(par_block_act) *a, int pass,
                                     par_real *dXin, const par_real *dXmid)
{
    const par_config *c = &M->cfg;
    const par_block_params *bp = &M->tab.blocks[a->b];
    int64_t n = M->n, d = M->d, T = a->T, iters = c->hc_sinkhorn_iters;
    PAR_FN(par_block_wkeep) *k = &a->wk;
    if (pass & PASS_B)
        PAR_FN(par_hc_post_backward)(k->dya, dXin, k->dpa, k->dCa, dXmid, a->ya, a->Xin, a->hca.post, a->hca.C, T, n,
                                     d);
    par_status s = attention_pass(M, x, a, pass);
    if (s)
        return s;
    PAR_FN(par_rmsnorm_backward)(IN(k->dxa), WT(G(bp->attn_norm)), k->dxan, a->xa, P(bp->attn_norm), a->rstda, T, d);
    return PAR_FN(par_hc_pre_backward)(IN(dXin), WT(G(bp->hc_attn_fn)), WT(G(bp->hc_attn_base)),
                                       WT(G(bp->hc_attn_scale)), k->dxa, k->dpa, k->dCa, &a->hca, a->Xin,
                                       P(bp->hc_attn_fn), P(bp->hc_attn_base), P(bp->hc_attn_scale), T, n, d, iters,
                                       c->hc_eps, c->norm_eps);
}

/* B or BW: the kept gradients allocated (BW: scratch the caller rewinds),
 * both sub-layers' passes. */
static par_status block_input_pass(PAR_FN(par_model) *M, const par_mbctx *x, int b, PAR_FN(par_block_act) *a,
                                   par_arena *ar, int pass, par_real *dXin, const par_real *dXout, const int32_t *pos,
                                   const int32_t *sample, const PAR_FN(par_stats) *st, double aux_scale, int64_t T)
{
    if (a->b != b || a->T != T || a->wk.pending)
        return par_err(PAR_EINVAL, "block %d backward: the activations are of block %d on %lld tokens%s", b, a->b,
                       (long long)a->T, a->wk.pending ? ", and its weight pass is still due" : "");
    par_status s = wkeep_alloc(M, a, ar, !a->hash && aux_scale != 0.0 && st, T);
    if (s)
        return s;
    a->wk.pos = pos;
    par_arena_mark mark = par_arena_get_mark(ar);
    par_real *dXmid = aalloc(ar, (size_t)(T * M->n * M->d) * sizeof(par_real), 1);
    if (!dXmid)
        return par_err(PAR_ENOMEM, "block %d backward: out of scratch memory (T=%lld)", b, (long long)T);
    if (!(s = moe_backward_pass(M, x, a, pass, dXmid, dXout, sample, st, aux_scale)))
        s = attn_backward_pass(M, x, a, pass, dXin, dXmid);
    par_arena_rewind(ar, mark);
    a->wk.pending = !s && pass == PASS_B;
    return s;
}

par_status PAR_FN(par_block_backward_input)(PAR_FN(par_model) *M, const par_mbctx *x, int b,
                                            PAR_FN(par_block_act) *a, par_arena *ar, par_real *dXin,
                                            const par_real *dXout, const int32_t *pos, const int32_t *sample,
                                            const PAR_FN(par_stats) *st, double aux_scale, int64_t T)
{
    return block_input_pass(M, x, b, a, ar, PASS_B, dXin, dXout, pos, sample, st, aux_scale, T);
}

par_status PAR_FN(par_block_backward_weights)(PAR_FN(par_model) *M, const par_mbctx *x, int b,
                                              PAR_FN(par_block_act) *a, par_arena *ar)
{
    (void)ar;
    if (a->b != b || !a->wk.pending)
        return par_err(PAR_EINVAL, "block %d: weight pass without its input pass", b);
    a->wk.pending = 0;
    par_status s = moe_backward_pass(M, x, a, PASS_W, NULL, NULL, NULL, NULL, 0.0);
    return s ? s : attn_backward_pass(M, x, a, PASS_W, NULL, NULL);
}

par_status PAR_FN(par_block_backward)(PAR_FN(par_model) *M, const par_mbctx *x, int b, PAR_FN(par_block_act) *a,
                                      par_arena *ar, par_real *dXin, const par_real *dXout, const int32_t *pos,
                                      const int32_t *sample, const PAR_FN(par_stats) *st, double aux_scale, int64_t T)
{
    par_arena_mark mark = par_arena_get_mark(ar);
    par_status s = block_input_pass(M, x, b, a, ar, PASS_BW, dXin, dXout, pos, sample, st, aux_scale, T);
    par_arena_rewind(ar, mark);
    return s;
}
