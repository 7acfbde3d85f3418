/* model/step.c - the serial training step: forward of the whole model, the
 * loss, backward, update (see model/model.h, MODEL.md sections 1-7). */
#include "model/model.h"

#include <math.h>
#include <string.h>

#include "model/optim.h"

static void release_acts(PAR_FN(par_model) *M)
{
    for (int b = 0; b < M->n_blocks; b++)
        PAR_FN(par_block_act_release)(&M->blk[b]);
    memset(M->blk, 0, (size_t)M->n_blocks * sizeof *M->blk);
    memset(&M->head, 0, sizeof M->head);
    memset(&M->mtp_head, 0, sizeof M->mtp_head);
    memset(&M->mtp, 0, sizeof M->mtp);
    par_arena_reset(&M->arena);
    M->have_fwd = 0;
}

/* The global sample index of each token (rows in order, samples of a row
 * in order) into M->sample; the number of samples. */
static int64_t number_samples(PAR_FN(par_model) *M, const par_batch *batch, int64_t T)
{
    int64_t q = -1;
    for (int64_t t = 0; t < T; t++) {
        if (t % batch->S == 0 || batch->segments[t] != batch->segments[t - 1])
            q++;
        M->sample[t] = (int32_t)q;
    }
    return q + 1;
}

par_status PAR_FN(par_model_forward)(PAR_FN(par_model) *M, const par_batch *batch)
{
    const par_config *c = &M->cfg;
    par_status s;
    release_acts(M);
    int64_t T = batch->B * batch->S, L = c->n_layers;
    M->batch = batch;
    M->T = T;
    par_arena *ar = &M->arena;
    M->sample = par_arena_alloc(ar, (size_t)(T > 0 ? T : 1) * sizeof(int32_t), 64);
    if (!M->sample)
        goto fail_oom;
    int64_t Ns = number_samples(M, batch, T);
    if (!M->stats.ce_main || M->stats.Ns != Ns) {
        PAR_FN(par_stats_free)(&M->stats);
        s = PAR_FN(par_stats_alloc)(&M->stats, M->n_blocks, M->E, Ns);
        if (s)
            return s;
    }
    PAR_FN(par_stats) *st = &M->stats;
    PAR_FN(par_stats_zero)(st);
    st->n_tokens = T;
    st->n_main = batch->n_labels;
    st->n_mtp = c->n_mtp_layers > 0 ? batch->n_mtp_labels : 0;

    M->X[0] = par_arena_alloc(ar, (size_t)(T * M->n * M->d) * sizeof(par_real), 64);
    if (!M->X[0])
        goto fail_oom;
    PAR_FN(par_model_embed_forward)(M, M->X[0], batch->tokens, T);
    for (int b = 0; b < L; b++) {
        s = PAR_FN(par_block_forward)(M, NULL, b, &M->blk[b], ar, M->X[b], batch->tokens, batch->pos,
                                      M->sample, st, T);
        if (s)
            return s;
        M->X[b + 1] = M->blk[b].Xout;
    }
    s = PAR_FN(par_head_forward)(M, 0, &M->head, ar, M->X[L], batch->labels, M->sample, st->ce_main, T);
    if (s)
        return s;
    if (c->n_mtp_layers > 0) {
        s = PAR_FN(par_mtp_input_forward)(M, &M->mtp, ar, M->X[L], batch->mtp_inputs, T);
        if (s)
            return s;
        s = PAR_FN(par_block_forward)(M, NULL, (int)L, &M->blk[L], ar, M->mtp.X0, batch->mtp_inputs,
                                      batch->pos, M->sample, st, T);
        if (s)
            return s;
        s = PAR_FN(par_head_forward)(M, 1, &M->mtp_head, ar, M->blk[L].Xout, batch->mtp_labels,
                                     M->sample, st->ce_mtp, T);
        if (s)
            return s;
    }
    /* serial: the local statistics are the global ones (nothing to combine) */
    PAR_FN(par_model_losses)(M, st, &M->last);
    M->last.grad_norm = 0;
    M->have_fwd = 1;
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "model forward: out of activation memory (T=%lld)", (long long)T);
}

/* The MTP head, block and input: dA (d/dX_L) += through the MTP input; dB
 * is scratch.  The MTP block also runs with no MTP target: its aux loss
 * still has a gradient. */
static par_status mtp_backward(PAR_FN(par_model) *M, par_real *dA, par_real *dB)
{
    const par_config *c = &M->cfg;
    PAR_FN(par_stats) *st = &M->stats;
    int64_t T = M->T, L = c->n_layers;
    size_t xbytes = (size_t)(T * M->n * M->d) * sizeof(par_real);
    par_arena *ar = &M->arena;
    par_status s;
    if (st->n_mtp > 0 &&
        (s = PAR_FN(par_head_backward)(M, 1, &M->mtp_head, ar, dB, c->mtp_lambda / (double)st->n_mtp)))
        return s;
    par_real *d0 = par_arena_calloc(ar, xbytes ? xbytes : 64, 64);
    if (!d0)
        return par_err(PAR_ENOMEM, "model backward: out of scratch memory (T=%lld)", (long long)T);
    if ((s = PAR_FN(par_block_backward)(M, NULL, (int)L, &M->blk[L], ar, d0, dB, M->batch->pos, M->sample, st,
                                        c->aux_alpha, T)))
        return s;
    return PAR_FN(par_mtp_input_backward)(M, &M->mtp, ar, dA, d0);
}

par_status PAR_FN(par_model_backward)(PAR_FN(par_model) *M)
{
    const par_config *c = &M->cfg;
    if (!M->have_fwd)
        return par_err(PAR_EINVAL, "model backward: no forward to differentiate");
    int64_t T = M->T, L = c->n_layers, nd = M->n * M->d;
    PAR_FN(par_stats) *st = &M->stats;
    par_arena *ar = &M->arena;
    par_arena_mark mark = par_arena_get_mark(ar);
    par_status s = PAR_OK;
    size_t xbytes = (size_t)(T * nd) * sizeof(par_real);
    par_real *dA, *dB;

    memset(M->grads, 0, (size_t)M->n_local * sizeof(par_real));
    dA = par_arena_calloc(ar, xbytes ? xbytes : 64, 64); /* d/dX_L */
    dB = par_arena_calloc(ar, xbytes ? xbytes : 64, 64);
    if (!dA || !dB)
        goto fail_oom;
    if (st->n_main > 0) {
        s = PAR_FN(par_head_backward)(M, 0, &M->head, ar, dA, 1.0 / (double)st->n_main);
        if (s)
            goto done;
    }
    if (c->n_mtp_layers > 0 && (s = mtp_backward(M, dA, dB)))
        goto done;
    for (int64_t b = L - 1; b >= 0; b--) {
        memset(dB, 0, xbytes);
        s = PAR_FN(par_block_backward)(M, NULL, (int)b, &M->blk[b], ar, dB, dA, M->batch->pos, M->sample, st,
                                       c->aux_alpha, T);
        if (s)
            goto done;
        par_real *tmp = dA;
        dA = dB;
        dB = tmp;
    }
    s = PAR_FN(par_model_embed_backward)(M, ar, dA, M->batch->tokens, T);
    if (s)
        goto done;
    st->grad_sumsq = PAR_FN(par_model_grad_sumsq)(M, NULL);
    M->last.grad_norm = sqrt(st->grad_sumsq);
done:
    par_arena_rewind(ar, mark);
    return s;
fail_oom:
    par_arena_rewind(ar, mark);
    return par_err(PAR_ENOMEM, "model backward: out of scratch memory (T=%lld)", (long long)T);
}

par_status PAR_FN(par_model_update)(PAR_FN(par_model) *M)
{
    if (!M->have_fwd)
        return par_err(PAR_EINVAL, "model update: no step to apply");
    double f = par_clip_factor(sqrt(M->stats.grad_sumsq), M->cfg.clip_grad);
    /* par_optim_apply and par_balance_apply over the held entries (the same
     * per-entry calls in table order) */
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype != PAR_PDT_REAL || M->loc[i] < 0)
            continue;
        int64_t o = M->loc[i];
        par_status s = PAR_FN(par_optim_apply_param)(M->params + o, M->opt_m + o, M->opt_v + o, M->grads + o,
                                                     &M->tab, i, &M->cfg, M->step + 1, f);
        if (s)
            return s;
    }
    for (int b = 0; b < M->n_blocks; b++) {
        par_real *bias = PAR_FN(par_model_ptr)(M, M->params, M->tab.blocks[b].gate_bias);
        if (bias)
            PAR_FN(par_balance_update)(bias, M->stats.loads + (int64_t)b * M->E, M->E, M->K,
                                       M->stats.n_tokens, M->cfg.bias_update_rate);
    }
    M->step++;
    return PAR_OK;
}

par_status PAR_FN(par_model_step)(PAR_FN(par_model) *M, const par_batch *batch, par_step_scalars *out)
{
    par_status s = PAR_FN(par_model_forward)(M, batch);
    if (!s)
        s = PAR_FN(par_model_backward)(M);
    if (!s)
        s = PAR_FN(par_model_update)(M);
    if (!s && out)
        *out = M->last;
    return s;
}
