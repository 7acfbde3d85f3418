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
    size_t E = (size_t)M->E, base = (size_t)b * 3 * E;
    W->w1 = M->ew + base;
    W->w2 = M->ew + base + E;
    W->w3 = M->ew + base + 2 * E;
    W->sw1 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1);
    W->sw2 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2);
    W->sw3 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3);
    if (dW) {
        dW->w1 = M->egw + base;
        dW->w2 = M->egw + base + E;
        dW->w3 = M->egw + base + 2 * E;
        dW->sw1 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w1);
        dW->sw2 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w2);
        dW->sw3 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w3);
    }
}

void PAR_FN(par_block_act_release)(PAR_FN(par_block_act) *a)
{
    PAR_FN(par_moe_saved_free)(&a->ms);
}

par_status PAR_FN(par_block_forward)(PAR_FN(par_model) *M, int b, PAR_FN(par_block_act) *a,
                                     par_arena *ar, const par_real *Xin, const int32_t *tokens,
                                     const int32_t *pos, const int32_t *sample,
                                     PAR_FN(par_stats) *st, int64_t T)
{
    const par_config *c = &M->cfg;
    const par_block_params *bp = &M->tab.blocks[b];
    const par_attn_dims *dm = &M->adims[b];
    int64_t n = M->n, d = M->d, E = M->E, K = M->K, iters = c->hc_sinkhorn_iters;
    par_status s;

    PAR_FN(par_block_act_release)(a);
    memset(a, 0, sizeof *a);
    a->b = b;
    a->T = T;
    a->hash = bp->gate_tid2eid >= 0;
    a->Xin = Xin;

    /* ---- attention sub-layer ---- */
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
    s = PAR_FN(par_hc_pre_forward)(a->xa, &a->hca, Xin, P(bp->hc_attn_fn), P(bp->hc_attn_base),
                                   P(bp->hc_attn_scale), T, n, d, iters, c->hc_eps, c->norm_eps);
    if (s)
        return s;
    PAR_FN(par_rmsnorm_forward)(a->xan, a->rstda, a->xa, P(bp->attn_norm), T, d, c->norm_eps);
    PAR_FN(par_attn_weights) AW;
    attn_weights(M, b, M->params, &AW, 1);
    if (M->attn.fwd) { /* the executor keeps its own saved state; sel for the dump */
        if (dm->m == 4) {
            a->as.sel = aalloc(ar, (size_t)(T * dm->topk) * sizeof(int32_t), 0);
            if (!a->as.sel)
                goto fail_oom;
        }
        s = M->attn.fwd(M->attn.ctx, M, b, a->ya, a->as.sel, a->xan, &AW, T);
    } else {
        size_t ab = PAR_FN(par_attn_saved_bytes)(dm, T);
        buf = aalloc(ar, ab, 1);
        if (!buf)
            goto fail_oom;
        PAR_FN(par_attn_saved_carve)(&a->as, buf, dm, T);
        s = PAR_FN(par_attn_forward)(a->ya, &a->as, NULL, a->xan, pos, &AW, dm, T);
    }
    if (s)
        return s;
    PAR_FN(par_hc_post_forward)(a->Xmid, a->ya, Xin, a->hca.post, a->hca.C, T, n, d);

    /* ---- MoE sub-layer ---- */
    buf = aalloc(ar, hb, 0);
    if (!buf)
        goto fail_oom;
    PAR_FN(par_hc_saved_init)(&a->hcf, buf, T, n, iters);
    AREAL(a->xf, T * d, 0);
    AREAL(a->xfn, T * d, 0);
    AREAL(a->rstdf, T, 0);
    AREAL(a->yf, T * d, 0);
    AREAL(a->Xout, T * n * d, 0);
    AREAL(a->gw, T * K, 0);
    AREAL(a->glog, T * E, 0);
    AREAL(a->gs, T * E, 0);
    a->idx = aalloc(ar, (size_t)(T * K) * sizeof(int32_t), 0);
    if (!a->idx)
        goto fail_oom;
    s = PAR_FN(par_hc_pre_forward)(a->xf, &a->hcf, a->Xmid, P(bp->hc_ffn_fn), P(bp->hc_ffn_base),
                                   P(bp->hc_ffn_scale), T, n, d, iters, c->hc_eps, c->norm_eps);
    if (s)
        return s;
    PAR_FN(par_rmsnorm_forward)(a->xfn, a->rstdf, a->xf, P(bp->ffn_norm), T, d, c->norm_eps);
    const int32_t *tid2eid = a->hash ? M->i32 + M->tab.p[bp->gate_tid2eid].offset : NULL;
    const par_real *bias = a->hash ? NULL : P(bp->gate_bias);
    s = PAR_FN(par_moe_gate_forward)(a->idx, a->gw, a->glog, a->gs, a->xfn, P(bp->gate_weight), bias,
                                     tid2eid, tokens, M->V, T, d, (int)E, (int)K, c->route_scale);
    if (s)
        return s;
    if (M->moe.fwd) {
        s = M->moe.fwd(M->moe.ctx, M, b, a->yf, a->xfn, a->idx, a->gw, tokens, T);
    } else {
        s = PAR_FN(par_moe_saved_alloc)(&a->ms, T, d, (int)E, (int)K, M->I);
        if (s)
            return s;
        par_moe_weights MW;
        moe_weights(M, b, &MW, NULL);
        s = PAR_FN(par_moe_forward)(a->yf, &a->ms, a->xfn, a->idx, a->gw, &MW, T, d, (int)E, (int)K,
                                    M->I, c->swiglu_limit);
    }
    if (s)
        return s;
    PAR_FN(par_hc_post_forward)(a->Xout, a->yf, a->Xmid, a->hcf.post, a->hcf.C, T, n, d);

    /* ---- statistics ---- */
    if (st) {
        PAR_FN(par_moe_count_loads)(st->loads + (int64_t)b * E, a->idx, T, (int)E, (int)K);
        if (!a->hash) {
            s = PAR_FN(par_moe_aux_stats)(st->cnt + (int64_t)b * st->Ns * E,
                                          st->psum + (int64_t)b * st->Ns * E,
                                          st->ntok + (int64_t)b * st->Ns, a->gs, a->idx, sample, T,
                                          (int)E, (int)K, st->Ns);
            if (s)
                return s;
        }
    }
    return PAR_OK;

fail_oom:
    return par_err(PAR_ENOMEM, "block %d forward: out of activation memory (T=%lld)", b, (long long)T);
}

par_status PAR_FN(par_block_backward)(PAR_FN(par_model) *M, int b, PAR_FN(par_block_act) *a,
                                      par_arena *ar, par_real *dXin, const par_real *dXout,
                                      const int32_t *pos, const int32_t *sample,
                                      const PAR_FN(par_stats) *st, double aux_scale, int64_t T)
{
    const par_config *c = &M->cfg;
    const par_block_params *bp = &M->tab.blocks[b];
    const par_attn_dims *dm = &M->adims[b];
    int64_t n = M->n, d = M->d, E = M->E, K = M->K, iters = c->hc_sinkhorn_iters;
    par_status s = PAR_OK;
    par_arena_mark mark = par_arena_get_mark(ar);
    par_real *dXmid, *dyf, *dpost, *dC, *dxfn, *dw, *dxf, *dya, *dxan, *dxa, *ds = NULL;

    /* ---- MoE sub-layer ---- */
    AREAL(dXmid, T * n * d, 1);
    AREAL(dyf, T * d, 1);
    AREAL(dpost, T * n, 1);
    AREAL(dC, T * n * n, 1);
    PAR_FN(par_hc_post_backward)(dyf, dXmid, dpost, dC, dXout, a->yf, a->Xmid, a->hcf.post, a->hcf.C,
                                 T, n, d);
    AREAL(dxfn, T * d, 1);
    AREAL(dw, T * K, 1);
    if (M->moe.bwd) {
        s = M->moe.bwd(M->moe.ctx, M, b, dxfn, dw, dyf, a->xfn, a->gw, T);
    } else {
        par_moe_weights MW;
        par_moe_grads MG;
        moe_weights(M, b, &MW, &MG);
        s = PAR_FN(par_moe_backward)(dxfn, &MG, dw, dyf, a->xfn, a->gw, &MW, &a->ms, c->swiglu_limit);
    }
    if (s)
        goto done;
    if (!a->hash && aux_scale != 0.0 && st) {
        AREAL(ds, T * E, 1);
        s = PAR_FN(par_moe_aux_backward)(ds, st->cnt + (int64_t)b * st->Ns * E,
                                         st->ntok + (int64_t)b * st->Ns, a->gs, sample, T, (int)E,
                                         (int)K, st->Ns, st->Ns_global, aux_scale);
        if (s)
            goto done;
    }
    s = PAR_FN(par_moe_gate_backward)(dxfn, G(bp->gate_weight), dw, ds, a->xfn, P(bp->gate_weight),
                                      a->glog, a->gs, a->idx, a->gw, T, d, (int)E, (int)K,
                                      c->route_scale);
    if (s)
        goto done;
    AREAL(dxf, T * d, 1);
    PAR_FN(par_rmsnorm_backward)(dxf, G(bp->ffn_norm), dxfn, a->xf, P(bp->ffn_norm), a->rstdf, T, d);
    s = PAR_FN(par_hc_pre_backward)(dXmid, G(bp->hc_ffn_fn), G(bp->hc_ffn_base), G(bp->hc_ffn_scale),
                                    dxf, dpost, dC, &a->hcf, a->Xmid, P(bp->hc_ffn_fn),
                                    P(bp->hc_ffn_base), P(bp->hc_ffn_scale), T, n, d, iters,
                                    c->hc_eps, c->norm_eps);
    if (s)
        goto done;

    /* ---- attention sub-layer ---- */
    AREAL(dya, T * d, 1);
    par_dev_zero(dpost, (size_t)(T * n) * sizeof(par_real)); /* memset (core/device.h) */
    par_dev_zero(dC, (size_t)(T * n * n) * sizeof(par_real));
    PAR_FN(par_hc_post_backward)(dya, dXin, dpost, dC, dXmid, a->ya, a->Xin, a->hca.post, a->hca.C,
                                 T, n, d);
    AREAL(dxan, T * d, 1);
    PAR_FN(par_attn_weights) AW, AG;
    attn_weights(M, b, M->params, &AW, 1);
    attn_weights(M, b, M->grads, &AG, 0); /* no gradient into the indexer (MODEL.md 3) */
    if (M->attn.bwd)
        s = M->attn.bwd(M->attn.ctx, M, b, dxan, &AG, dya, &AW, T);
    else
        s = PAR_FN(par_attn_backward)(dxan, &AG, dya, &a->as, a->xan, pos, &AW, dm, T);
    if (s)
        goto done;
    AREAL(dxa, T * d, 1);
    PAR_FN(par_rmsnorm_backward)(dxa, G(bp->attn_norm), dxan, a->xa, P(bp->attn_norm), a->rstda, T, d);
    s = PAR_FN(par_hc_pre_backward)(dXin, G(bp->hc_attn_fn), G(bp->hc_attn_base),
                                    G(bp->hc_attn_scale), dxa, dpost, dC, &a->hca, a->Xin,
                                    P(bp->hc_attn_fn), P(bp->hc_attn_base), P(bp->hc_attn_scale), T,
                                    n, d, iters, c->hc_eps, c->norm_eps);
done:
    par_arena_rewind(ar, mark);
    return s;

fail_oom:
    par_arena_rewind(ar, mark);
    return par_err(PAR_ENOMEM, "block %d backward: out of scratch memory (T=%lld)", b, (long long)T);
}
