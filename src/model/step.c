/* model/step.c - the serial training step: forward of the whole model, the
 * loss, backward, update (see model/model.h, MODEL.md sections 1-7). */
#include "kernels/recipe.h"
#include "model/model.h"

#include <math.h>
#include <string.h>

#include "core/device.h"
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
 * in order) into out [T]; the number of samples. */
static int64_t number_samples(int32_t *out, const par_batch *batch, int64_t T)
{
    int64_t q = -1;
    par_dev_host_set(out, (size_t)T * sizeof *out); /* arena memory reused */
    for (int64_t t = 0; t < T; t++) {
        if (t % batch->S == 0 || batch->segments[t] != batch->segments[t - 1])
            q++;
        out[t] = (int32_t)q;
    }
    return q + 1;
}

/* The model's pieces on the T tokens of `batch` (whole rows), sample
 * numbers M->sample, statistics into M->stats: embed, the blocks, the main
 * head, the MTP input, block and head. */
static par_status forward_pieces(PAR_FN(par_model) *M, const par_batch *batch, int64_t T)
{
    const par_config *c = &M->cfg;
    const int64_t L = c->n_layers;
    PAR_FN(par_stats) *st = &M->stats;
    par_arena *ar = &M->arena;
    par_status s;
    M->X[0] = par_arena_alloc(ar, (size_t)(T * M->n * M->d) * sizeof(par_real), 64);
    if (!M->X[0])
        return par_err(PAR_ENOMEM, "model forward: out of activation memory (T=%lld)", (long long)T);
    PAR_FN(par_model_embed_forward)(M, M->X[0], batch->tokens, T);
    for (int b = 0; b < L; b++) {
        s = PAR_FN(par_block_forward)(M, NULL, b, &M->blk[b], ar, M->X[b], batch->tokens, batch->pos,
                                      M->sample, st, T);
        if (s)
            return s;
        M->X[b + 1] = M->blk[b].Xout;
    }
    s = PAR_FN(par_head_forward)(M, NULL, 0, &M->head, ar, M->X[L], batch->labels, M->sample, st->ce_main, T);
    if (s || c->n_mtp_layers <= 0)
        return s;
    s = PAR_FN(par_mtp_input_forward)(M, &M->mtp, ar, M->X[L], batch->mtp_inputs, T);
    if (s)
        return s;
    s = PAR_FN(par_block_forward)(M, NULL, (int)L, &M->blk[L], ar, M->mtp.X0, batch->mtp_inputs, batch->pos,
                                  M->sample, st, T);
    if (s)
        return s;
    return PAR_FN(par_head_forward)(M, NULL, 1, &M->mtp_head, ar, M->blk[L].Xout, batch->mtp_labels, M->sample,
                                    st->ce_mtp, T);
}

/* M->stats as the window of all Ns samples of `batch`, zeroed, with the
 * batch's global counts. */
static par_status stats_setup(PAR_FN(par_model) *M, const par_batch *batch, int64_t Ns, int64_t T)
{
    if (!M->stats.ce_main || M->stats.Ns != Ns) {
        PAR_FN(par_stats_free)(&M->stats);
        par_status s = PAR_FN(par_stats_alloc)(&M->stats, M->n_blocks, M->E, Ns);
        if (s)
            return s;
    }
    PAR_FN(par_stats) *st = &M->stats;
    par_status s = M->cfg.bitwise ? PAR_FN(par_stats_exact)(st) : PAR_OK;
    if (s)
        return s;
    PAR_FN(par_stats_zero)(st);
    st->n_tokens = T;
    st->n_main = batch->n_labels;
    st->n_mtp = M->cfg.n_mtp_layers > 0 ? batch->n_mtp_labels : 0;
    return PAR_OK;
}

par_status PAR_FN(par_model_forward)(PAR_FN(par_model) *M, const par_batch *batch)
{
    par_status s;
    release_acts(M);
    int64_t T = batch->B * batch->S;
    M->batch = batch;
    M->T = T;
    M->sample = par_arena_alloc(&M->arena, (size_t)(T > 0 ? T : 1) * sizeof(int32_t), 64);
    if (!M->sample)
        return par_err(PAR_ENOMEM, "model forward: out of activation memory (T=%lld)", (long long)T);
    int64_t Ns = number_samples(M->sample, batch, T);
    if ((s = stats_setup(M, batch, Ns, T)) || (s = forward_pieces(M, batch, T)))
        return s;
    /* serial: the local statistics are the global ones (nothing to combine) */
    PAR_FN(par_model_losses)(M, &M->stats, &M->last);
    M->last.grad_norm = 0;
    M->have_fwd = 1;
    return PAR_OK;
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
        (s = PAR_FN(par_head_backward)(M, NULL, 1, &M->mtp_head, ar, dB, c->mtp_lambda / (double)st->n_mtp)))
        return s;
    par_real *d0 = par_arena_calloc(ar, xbytes ? xbytes : 64, 64);
    if (!d0)
        return par_err(PAR_ENOMEM, "model backward: out of scratch memory (T=%lld)", (long long)T);
    if ((s = PAR_FN(par_block_backward)(M, NULL, (int)L, &M->blk[L], ar, d0, dB, M->batch->pos, M->sample, st,
                                        c->aux_alpha, T)))
        return s;
    return PAR_FN(par_mtp_input_backward)(M, &M->mtp, ar, dA, d0);
}

/* Back-propagates the last forward's loss into M->grads (accumulating: +=),
 * in the fixed gradient order, with the loss scales of M->stats' counts. */
static par_status backward_pieces(PAR_FN(par_model) *M)
{
    const par_config *c = &M->cfg;
    int64_t T = M->T, L = c->n_layers, nd = M->n * M->d;
    PAR_FN(par_stats) *st = &M->stats;
    par_arena *ar = &M->arena;
    par_arena_mark mark = par_arena_get_mark(ar);
    par_status s = PAR_OK;
    size_t xbytes = (size_t)(T * nd) * sizeof(par_real);
    par_real *dA = par_arena_calloc(ar, xbytes ? xbytes : 64, 64); /* d/dX_L */
    par_real *dB = par_arena_calloc(ar, xbytes ? xbytes : 64, 64);
    if (!dA || !dB) {
        par_arena_rewind(ar, mark);
        return par_err(PAR_ENOMEM, "model backward: out of scratch memory (T=%lld)", (long long)T);
    }
    if (st->n_main > 0 && (s = PAR_FN(par_head_backward)(M, NULL, 0, &M->head, ar, dA, 1.0 / (double)st->n_main)))
        goto done;
    if (c->n_mtp_layers > 0 && (s = mtp_backward(M, dA, dB)))
        goto done;
    for (int64_t b = L - 1; b >= 0; b--) {
        par_dev_zero(dB, xbytes); /* memset (core/device.h) */
        s = PAR_FN(par_block_backward)(M, NULL, (int)b, &M->blk[b], ar, dB, dA, M->batch->pos, M->sample, st,
                                       c->aux_alpha, T);
        if (s)
            goto done;
        par_real *tmp = dA;
        dA = dB;
        dB = tmp;
    }
    s = PAR_FN(par_model_embed_backward)(M, ar, dA, M->batch->tokens, T);
done:
    par_arena_rewind(ar, mark);
    return s;
}

par_status PAR_FN(par_model_backward)(PAR_FN(par_model) *M)
{
    if (!M->have_fwd)
        return par_err(PAR_EINVAL, "model backward: no forward to differentiate");
    PAR_FN(par_model_grads_zero)(M);
    par_status s = backward_pieces(M);
    if (s || (s = PAR_FN(par_model_grads_settle)(M)))
        return s;
    M->stats.grad_sumsq = PAR_FN(par_model_grad_sumsq)(M, NULL);
    M->last.grad_norm = sqrt(M->stats.grad_sumsq);
    return PAR_OK;
}

/* --------------------------------------------------------- row blocks -- */

static void keep_copy(void *dst, const void *src, size_t bytes)
{
    if (!dst || !src)
        return;
    par_dev_host_read(src, bytes); /* GPU mode: current on the host */
    memcpy(dst, src, bytes);
}

/* The block's rows of what a golden set holds into keep, at token t0. */
static void keep_rows(const PAR_FN(par_model) *M, const PAR_FN(par_model_keep) *k, int64_t t0, int64_t Tb)
{
    const size_t V = (size_t)M->V, nd = (size_t)(M->n * M->d), K = (size_t)M->K;
    const size_t tk = (size_t)M->cfg.index_topk, at = (size_t)t0, n = (size_t)Tb;
    keep_copy(k->logits ? k->logits + at * V : NULL, M->head.logits, n * V * sizeof(par_real));
    keep_copy(k->mtp_logits ? k->mtp_logits + at * V : NULL, M->mtp_head.logits, n * V * sizeof(par_real));
    for (int b = 0; b < M->n_blocks; b++) {
        const PAR_FN(par_block_act) *a = &M->blk[b];
        keep_copy(k->act && k->act[b] ? k->act[b] + at * nd : NULL, a->Xout, n * nd * sizeof(par_real));
        keep_copy(k->idx && k->idx[b] ? k->idx[b] + at * K : NULL, a->idx, n * K * sizeof(int32_t));
        keep_copy(k->sel && k->sel[b] ? k->sel[b] + at * tk : NULL, a->as.sel, n * tk * sizeof(int32_t));
    }
}

/* Rows [r0, r0 + R) of batch as a batch of R rows (views, no copy). */
static par_batch row_view(const par_batch *batch, int64_t r0, int64_t R)
{
    const int64_t o = r0 * batch->S;
    par_batch v = *batch;
    v.B = R;
    v.tokens += o;
    v.segments += o;
    v.pos += o;
    v.labels += o;
    v.mtp_inputs += o;
    v.mtp_labels += o;
    return v;
}

par_status PAR_FN(par_model_forward_backward_rows)(PAR_FN(par_model) *M, const par_batch *batch, int64_t rows,
                                                   const PAR_FN(par_model_keep) *keep)
{
    const int64_t B = batch->B, S = batch->S, T = B * S;
    if (rows < 1)
        return par_err(PAR_EINVAL, "model step: row blocks of %lld rows (must be >= 1)", (long long)rows);
    release_acts(M);
    int32_t *sample = par_malloc((size_t)(T > 0 ? T : 1) * sizeof *sample, PAR_TAG_ACT);
    if (!sample)
        return par_err(PAR_ENOMEM, "model step: out of memory for %lld sample numbers", (long long)T);
    par_status s = stats_setup(M, batch, number_samples(sample, batch, T), T);
    PAR_FN(par_model_grads_zero)(M);
    for (int64_t r0 = 0; r0 < B && !s; r0 += rows) {
        const int64_t R = B - r0 < rows ? B - r0 : rows;
        par_batch v = row_view(batch, r0, R);
        release_acts(M);
        M->batch = &v;
        M->T = R * S;
        M->sample = sample + r0 * S; /* global sample numbers: the window is the whole batch */
#if PAR_FAULT_GOLDEN_BLOCK_ZERO
        /* Deliberate fault (meson -Dfault=golden_block_zero; tools/cells-fault-demo.sh): the
         * gradients zeroed before every block, so only the last block's are kept. */
        par_dev_zero(M->grads, (size_t)M->n_local * sizeof(par_real));
#endif
        if (!(s = forward_pieces(M, &v, R * S)) && !(s = backward_pieces(M)) && keep)
            keep_rows(M, keep, r0 * S, R * S);
    }
    release_acts(M);
    M->batch = batch;
    M->T = T;
    M->sample = NULL;
    par_free(sample);
    if (s || (s = PAR_FN(par_model_grads_settle)(M)))
        return s;
    M->stats.grad_sumsq = PAR_FN(par_model_grad_sumsq)(M, NULL);
    PAR_FN(par_model_losses)(M, &M->stats, &M->last);
    M->have_fwd = 1;
    return PAR_OK;
}

/* The optimizer when kernels use device memory (offload builds): the held
 * entries through model/optim_gpu.c (Muon batched: the same bits per entry);
 * *done 1 when it updated them, else 0 (the caller's loop does). */
static par_status optim_on_device(PAR_FN(par_model) *M, double f, int *done)
{
    *done = 0;
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
    if (M->cfg.bitwise || !par_dev_device_mode())
        return PAR_OK;
    int64_t *loc = par_malloc((size_t)(M->tab.n > 0 ? M->tab.n : 1) * sizeof *loc, PAR_TAG_OPTIM);
    if (!loc)
        return par_err(PAR_ENOMEM, "model update: no memory for %d entry offsets", M->tab.n);
    for (int i = 0; i < M->tab.n; i++)
        loc[i] = PAR_FN(par_model_loc)(M, i);
    par_status s = PAR_FN(par_optim_gpu_apply)(M->params, M->opt_m, M->opt_v, M->grads, &M->tab, loc, &M->cfg,
                                               M->step + 1, f);
    par_free(loc);
    *done = s == PAR_OK;
    return s;
#else
    (void)M, (void)f;
    return PAR_OK;
#endif
}

par_status PAR_FN(par_model_update)(PAR_FN(par_model) *M)
{
    if (!M->have_fwd)
        return par_err(PAR_EINVAL, "model update: no step to apply");
    if (M->cfg.recipe && par_recipe_failures()) /* a kernel could not cast (kernels/recipe.h) */
        return par_err(PAR_ENOMEM, "recipe %s: %lld casts could not be applied (out of memory): the step is not "
                       "the recipe's", par_recipe_name((par_recipe)M->cfg.recipe), (long long)par_recipe_failures());
    double f = par_clip_factor(sqrt(M->stats.grad_sumsq), M->cfg.clip_grad);
    int done;
    par_status s = optim_on_device(M, f, &done);
    if (s)
        return s;
    /* par_optim_apply and par_balance_apply over the held entries (the same
     * per-entry calls in table order) */
    for (int i = 0; !done && i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype != PAR_PDT_REAL || PAR_FN(par_model_loc)(M, i) < 0)
            continue;
        int64_t o = PAR_FN(par_model_loc)(M, i);
        s = PAR_FN(par_optim_apply_param)(M->params + o, M->opt_m + o, M->opt_v + o, M->grads + o, &M->tab, i,
                                          &M->cfg, M->step + 1, f);
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
