/* parallel/step/exec_stage.c - what one (microbatch, stage) computes: the forward of
 * its items, their input-gradient passes (B), their weight-gradient passes
 * (W), and the (mb, stage) state that keeps its activations from F to B to W.  Part of
 * the step executor (parallel/step/exec-impl.h). */
#include <string.h>

#include "core/device.h"
#include "parallel/step/exec-impl.h"

/* ------------------------------------------------- (mb, stage) states -- */

static void mbstage_drop(void *p)
{
    mbstage *sl = p;
    for (int j = 0; sl->blk && j < sl->n_items; j++)
        PAR_FN(par_block_act_release)(&sl->blk[j]);
    par_free(sl->blk);
    par_arena_destroy(&sl->ar);
}

par_status PAR_FN(par__exec_mbstage_init)(exec_t *ex)
{
    const int nk = ex->n_stages * ex->sch.n_dirs;
    uint8_t *held = par_malloc((size_t)(nk > 0 ? nk : 1), PAR_TAG_MODEL);
    for (int k = 0; held && k < nk; k++)
        held[k] = ex->stage_local[k] >= 0;
    par_status s = held ? par_mbstate_init(&ex->mbst, "pipeline", ex->m, nk, held, sizeof(mbstage), mbstage_drop)
                        : par_err(PAR_ENOMEM, "pipeline: out of memory");
    par_free(held);
    return s;
}

void PAR_FN(par__exec_release_all)(exec_t *ex)
{
    par_mbstate_drop_all(&ex->mbst);
}

/* The (mb, stage) key of the states: the microbatch, its direction's stage. */
static int stage_key(const exec_t *ex, int mb, int stage)
{
    return par_schedule_mb_dir(&ex->sch, mb) * ex->n_stages + stage;
}

int PAR_FN(par__exec_local_of)(const exec_t *ex, int mb, int stage)
{
    int dir = par_schedule_mb_dir(&ex->sch, mb);
    return ex->stage_local[dir * ex->n_stages + stage];
}

par_status PAR_FN(par__exec_mbstage)(exec_t *ex, int mb, int stage, mbstage **out, lstage **lso)
{
    int j = PAR_FN(par__exec_local_of)(ex, mb, stage);
    if (j < 0)
        return par_err(PAR_EINTERNAL, "pipeline: rank %d runs stage %d of microbatch %d, which is not its own",
                       ex->me, stage, mb);
    const par_mbctx key = {.mb = mb};
    mbstage *sl = par_mbstate_get(&ex->mbst, &key, stage_key(ex, mb, stage));
    if (!sl) {
        par_status s = par_mbstate_new(&ex->mbst, &key, stage_key(ex, mb, stage), (void **)&sl);
        if (s)
            return s;
        if (!(sl->blk = par_calloc((size_t)(ex->ls[j].n_items + 1), sizeof *sl->blk, PAR_TAG_ACT))) {
            par_mbstate_drop(&ex->mbst, &key, stage_key(ex, mb, stage));
            return par_err(PAR_ENOMEM, "pipeline: out of memory");
        }
        sl->n_items = ex->ls[j].n_items;
        par_arena_init(&sl->ar, (size_t)1 << 20, PAR_TAG_ACT);
    }
    *out = sl;
    if (lso)
        *lso = &ex->ls[j];
    return PAR_OK;
}

/* A send buffer: kept on the device in GPU mode (core/device.h
 * par_dev_keep), so that when it is made inside a device window the copy
 * and the send both move device memory (docs/gpu.md "Collectives on one
 * device"); memcpy in the default build. */
static par_real *heap_copy(const par_real *x, int64_t n)
{
    par_real *c = par_malloc((size_t)(n > 0 ? n : 1) * sizeof *c, PAR_TAG_COMM);
    if (c) {
        par_dev_keep(c);
        par_dev_copy(c, x, (size_t)n * sizeof *c);
    }
    return c;
}

/* The forward's output X of microbatch mb at `stage` leaves: a heap copy for
 * the send (the state may be gone before the send completes) unless the
 * next stage is on this rank. */
static par_status act_out(exec_t *ex, int mb, int stage, const par_real *X)
{
    if (stage >= ex->n_stages - 1 || PAR_FN(par__exec_local_of)(ex, mb, stage + 1) >= 0)
        return PAR_OK;
    int o = mb * ex->n_stages + stage;
    par_free(ex->out_act[o]);
    if (!(ex->out_act[o] = heap_copy(X, ex->Tm * ex->nd)))
        return par_err(PAR_ENOMEM, "pipeline: out of memory for a send");
    return PAR_OK;
}

/* Microbatch mb's local tokens of `per` elements each into a dump's kept
 * rows [Bl, S/CP, per]: one copy of its rows, or (SP) each row's slice at
 * the rank's columns (the TP ranks' slices meet in exec_dump.c). */
static void keep_rows(const exec_t *ex, void *dst, const void *src, int mb, int64_t per, size_t esz)
{
    if (!dst || !src)
        return;
    const int64_t W = ex->S / ex->CP, L = W / ex->spn, c0 = (ex->col % ex->spn) * L;
    if (ex->spn == 1) {
        par_dev_copy((char *)dst + (size_t)((int64_t)mb * ex->Tm * per) * esz, src, (size_t)(ex->Tm * per) * esz);
        return;
    }
    for (int64_t i = 0; i < ex->mbs; i++)
        par_dev_copy((char *)dst + (size_t)((((int64_t)mb * ex->mbs + i) * W + c0) * per) * esz,
                     (const char *)src + (size_t)(i * L * per) * esz, (size_t)(L * per) * esz);
}

/* ------------------------------------------------------------- forward -- */

/* The stage's input: received, or the previous stage's output on this rank
 * (DualPipeV's turn: a local transfer). */
static par_status stage_input(exec_t *ex, mbstage *sl, int mb, int stage)
{
    if (sl->xin || stage == 0)
        return PAR_OK;
    mbstage *pv = NULL;
    if (PAR_FN(par__exec_local_of)(ex, mb, stage - 1) >= 0 && !PAR_FN(par__exec_mbstage)(ex, mb, stage - 1, &pv, NULL) &&
        pv->fwd_done) {
        sl->xin = pv->xout;
        return PAR_OK;
    }
    return par_err(PAR_EINTERNAL,
                   "pipeline: forward of microbatch %d stage %d on rank %d has no input (no receive and no local "
                   "previous stage)",
                   mb, stage, ex->me);
}

/* Item j of the stage's forward on the residual *X. */
static par_status item_forward(exec_t *ex, PAR_FN(par_model) *M, mbstage *sl, const lstage *ls, int j, int mb,
                               const par_real **X)
{
    const par_batch *bt = &ex->mb[mb];
    const par_mbctx *x = &ex->mbx[mb];
    const int32_t *sample = ex->msample[mb]; /* the microbatch's samples: 0 is the window's mq0[mb] */
    PAR_FN(par_stats) *st = &sl->st;
    double *ce_main = M->stats.ce_main + ex->mq0[mb], *ce_mtp = M->stats.ce_mtp + ex->mq0[mb];
    int64_t T = ex->Tm;
    int b = ls->block[j];
    par_status s = PAR_OK;
    switch (ls->items[j]) {
    case PAR_BLK_EMBED: {
        par_real *X0 = par_arena_alloc(&sl->ar, (size_t)(T * ex->nd) * sizeof *X0, 64);
        if (!X0)
            return par_err(PAR_ENOMEM, "pipeline: out of activation memory");
        if ((s = PAR_FN(par_model_embed_forward)(M, X0, bt->tokens, T)))
            return s;
        *X = X0;
        return PAR_OK;
    }
    case PAR_BLK_LAYER:
        if (!(s = PAR_FN(par_block_forward)(M, x, b, &sl->blk[j], &sl->ar, *X, bt->tokens, bt->pos, sample, st, T)))
            *X = sl->blk[j].Xout;
        return s;
    case PAR_BLK_MTP:
        if ((s = PAR_FN(par_mtp_input_forward)(M, &sl->mtp, &sl->ar, *X, bt->mtp_inputs, T)) ||
            (s = PAR_FN(par_block_forward)(M, x, b, &sl->blk[j], &sl->ar, sl->mtp.X0, bt->mtp_inputs, bt->pos, sample,
                                           st, T)) ||
            (s = PAR_FN(par_head_forward)(M, x, 1, &sl->mtp_head, &sl->ar, sl->blk[j].Xout, bt->mtp_labels,
                                          sample, ce_mtp, T)))
            return s;
        if (ex->keep)
            keep_rows(ex, ex->k_mtp_logits, sl->mtp_head.logits, mb, M->V, sizeof(par_real));
        return PAR_OK;
    case PAR_BLK_LOSS:
        if ((s = PAR_FN(par_head_forward)(M, x, 0, &sl->head, &sl->ar, *X, bt->labels, sample, ce_main, T)))
            return s;
        if (ex->keep)
            keep_rows(ex, ex->k_logits, sl->head.logits, mb, M->V, sizeof(par_real));
        return PAR_OK;
    }
    return par_err(PAR_EINTERNAL, "pipeline: unknown layout item '%c'", ls->items[j]);
}

/* A dump keeps the block's activations, routing and selections. */
static void keep_block(exec_t *ex, const PAR_FN(par_model) *M, const PAR_FN(par_block_act) *a, int b, int mb)
{
    keep_rows(ex, ex->k_act[b], a->Xout, mb, ex->nd, sizeof(par_real));
    keep_rows(ex, ex->k_idx[b], a->idx, mb, M->K, sizeof(int32_t));
    if (ex->k_sel[b])
        keep_rows(ex, ex->k_sel[b], a->as.sel, mb, ex->cfg.index_topk, sizeof(int32_t));
}

/* The microbatch's aux-loss terms of the stage's blocks, from its counts
 * (CP, SP: first summed over the ranks that hold its other columns, in
 * place: the backward reads the sums). */
static par_status mb_aux_terms(exec_t *ex, PAR_FN(par_model) *M, mbstage *sl, const lstage *ls)
{
    /* ls->block: the items' blocks, -1 for E and L (both calls skip those) */
    par_status s = ex->tokc ? PAR_FN(par_reduce_mb_stats)(ex->tokc, &sl->st, ls->block, ls->n_items) : PAR_OK;
    if (!s)
        PAR_FN(par_stats_aux_view)(&M->stats, &sl->st, ls->block, ls->n_items, &M->tab, (int)M->K);
    return s;
}

par_status PAR_FN(par__exec_forward)(exec_t *ex, PAR_FN(par_model) *M, int mb, int stage)
{
    mbstage *sl;
    lstage *ls;
    par_status s = PAR_FN(par__exec_mbstage)(ex, mb, stage, &sl, &ls);
    if (s)
        return s;
    if (sl->fwd_done)
        return par_err(PAR_EINTERNAL, "pipeline: forward of microbatch %d stage %d runs twice", mb, stage);
    if ((s = stage_input(ex, sl, mb, stage)) ||
        (s = PAR_FN(par_stats_view)(&sl->st, &M->stats, &sl->ar, ex->mq0[mb], ex->mqn[mb])))
        return s;
    const par_real *X = sl->xin;
    for (int j = 0; j < ls->n_items; j++) {
        int mode = par_dev_mode_set(PAR_DEV_MODE_DEVICE); /* the model's kernels (docs/gpu.md) */
        s = item_forward(ex, M, sl, ls, j, mb, &X);
        if (!s && X && j == ls->n_items - 1 && par_dev_gpu())
            s = act_out(ex, mb, stage, X); /* in the window: device to device */
        par_dev_mode_set(mode);
        if (s)
            return s;
        if (ex->keep && ls->block[j] >= 0)
            keep_block(ex, M, &sl->blk[j], ls->block[j], mb);
    }
    sl->xout = (par_real *)X;
    sl->fwd_done = 1;
    if ((s = mb_aux_terms(ex, M, sl, ls)))
        return s;
    if (!X && stage > 0)
        return par_err(PAR_EINTERNAL, "pipeline: stage %d produced no output", stage);
    return par_dev_gpu() ? PAR_OK : act_out(ex, mb, stage, X);
}

/* ------------------------------------------------------------ backward -- */

/* The gradients one item's backward writes: t: the block input's (out[0]);
 * m: the MTP head's into the MTP block (out[0]), the MTP block's input's
 * (out[1], kept until W). */
static par_status item_outs(mbstage *sl, const lstage *ls, int j, size_t xb, par_real **out)
{
    out[0] = out[1] = NULL;
    char c = ls->items[j];
    if (c == PAR_BLK_LAYER || c == PAR_BLK_MTP)
        out[0] = par_arena_calloc(&sl->ar, xb ? xb : 64, 64);
    if (c == PAR_BLK_MTP)
        out[1] = par_arena_calloc(&sl->ar, xb ? xb : 64, 64);
    if ((c == PAR_BLK_LAYER || c == PAR_BLK_MTP) && (!out[0] || (c == PAR_BLK_MTP && !out[1])))
        return par_err(PAR_ENOMEM, "pipeline: out of memory for the gradients of a backward");
    return PAR_OK;
}

/* B (or, bw, the whole backward in one pass) of item j: *dX is the
 * gradient of the item's output, replaced by that of its input. */
static par_status item_input(exec_t *ex, PAR_FN(par_model) *M, mbstage *sl, const lstage *ls, int j, int mb, int bw,
                             par_real **dX, par_real **out)
{
    const par_config *c = &ex->cfg;
    const par_batch *bt = &ex->mb[mb];
    const par_mbctx *x = &ex->mbx[mb];
    const int32_t *sample = ex->msample[mb];
    const PAR_FN(par_stats) *st = &M->stats, *bst = &sl->st; /* CP, SP: its counts summed (mb_aux_terms) */
    const double ls_main = st->n_main > 0 ? 1.0 / (double)st->n_main : 0.0;
    const double ls_mtp = st->n_mtp > 0 ? c->mtp_lambda / (double)st->n_mtp : 0.0;
    int64_t T = ex->Tm;
    int b = ls->block[j];
    par_arena *ar = &sl->ar;
    par_status s = PAR_OK;
    switch (ls->items[j]) {
    case PAR_BLK_LOSS:
        if (st->n_main <= 0)
            return PAR_OK;
        return bw ? PAR_FN(par_head_backward)(M, x, 0, &sl->head, ar, *dX, ls_main)
                  : PAR_FN(par_head_backward_input)(M, x, 0, &sl->head, ar, *dX, ls_main);
    case PAR_BLK_MTP:
        if (st->n_mtp > 0 && (s = bw ? PAR_FN(par_head_backward)(M, x, 1, &sl->mtp_head, ar, out[0], ls_mtp)
                                     : PAR_FN(par_head_backward_input)(M, x, 1, &sl->mtp_head, ar, out[0], ls_mtp)))
            return s;
        if ((s = (bw ? PAR_FN(par_block_backward) : PAR_FN(par_block_backward_input))(
                 M, x, b, &sl->blk[j], ar, out[1], out[0], bt->pos, sample, bst, c->aux_alpha, T)))
            return s;
        return bw ? PAR_FN(par_mtp_input_backward)(M, &sl->mtp, ar, *dX, out[1])
                  : PAR_FN(par_mtp_input_backward_input)(M, &sl->mtp, ar, *dX, out[1]);
    case PAR_BLK_LAYER:
        if (!(s = (bw ? PAR_FN(par_block_backward) : PAR_FN(par_block_backward_input))(
                  M, x, b, &sl->blk[j], ar, out[0], *dX, bt->pos, sample, bst, c->aux_alpha, T)))
            *dX = out[0];
        return s;
    case PAR_BLK_EMBED: /* no input gradient: everything is the weight pass */
        sl->dxe = *dX;
        return bw ? PAR_FN(par_model_embed_backward)(M, ar, *dX, bt->tokens, T) : PAR_OK;
    }
    return par_err(PAR_EINTERNAL, "pipeline: unknown layout item '%c'", ls->items[j]);
}

/* W of item j, after its B. */
static par_status item_weights(exec_t *ex, PAR_FN(par_model) *M, mbstage *sl, const lstage *ls, int j, int mb)
{
    const par_mbctx *x = &ex->mbx[mb];
    int b = ls->block[j];
    par_arena *ar = &sl->ar;
    par_status s = PAR_OK;
    switch (ls->items[j]) {
    case PAR_BLK_LOSS:
        return sl->head.pending ? PAR_FN(par_head_backward_weights)(M, x, 0, &sl->head, ar) : PAR_OK;
    case PAR_BLK_MTP:
        if ((sl->mtp_head.pending && (s = PAR_FN(par_head_backward_weights)(M, x, 1, &sl->mtp_head, ar))) ||
            (s = PAR_FN(par_block_backward_weights)(M, x, b, &sl->blk[j], ar)))
            return s;
        return PAR_FN(par_mtp_input_backward_weights)(M, &sl->mtp);
    case PAR_BLK_LAYER:
        return PAR_FN(par_block_backward_weights)(M, x, b, &sl->blk[j], ar);
    case PAR_BLK_EMBED:
        return PAR_FN(par_model_embed_backward)(M, ar, sl->dxe, ex->mb[mb].tokens, ex->Tm);
    }
    return par_err(PAR_EINTERNAL, "pipeline: unknown layout item '%c'", ls->items[j]);
}

/* The input gradient leaves: to the previous stage's state when it is on
 * this rank, else a heap copy for the send. */
static par_status grad_out(exec_t *ex, int mb, int stage, const par_real *dX, size_t xb)
{
    if (stage == 0)
        return PAR_OK;
    if (PAR_FN(par__exec_local_of)(ex, mb, stage - 1) >= 0) {
        mbstage *pv;
        par_status s = PAR_FN(par__exec_mbstage)(ex, mb, stage - 1, &pv, NULL);
        if (s)
            return s;
        if (!(pv->gout = par_arena_alloc(&pv->ar, xb ? xb : 64, 64)))
            return par_err(PAR_ENOMEM, "pipeline: out of memory for a local gradient");
        par_dev_copy(pv->gout, dX, xb);
        return PAR_OK;
    }
    int o = mb * ex->n_stages + stage;
    par_free(ex->out_grad[o]);
    if (!(ex->out_grad[o] = heap_copy(dX, ex->Tm * ex->nd)))
        return par_err(PAR_ENOMEM, "pipeline: out of memory for a send");
    return PAR_OK;
}

static par_status backward_check(exec_t *ex, const mbstage *sl, int mb, int stage, int kind)
{
    if (kind == PAR_ACT_W && (!sl->bwd_done || !sl->w_due))
        return par_err(PAR_EINTERNAL, "pipeline: W of microbatch %d stage %d without its B", mb, stage);
    if (kind != PAR_ACT_W && (!sl->fwd_done || sl->bwd_done))
        return par_err(PAR_EINTERNAL, "pipeline: backward of microbatch %d stage %d without its forward", mb, stage);
    if (kind != PAR_ACT_W && !sl->gout && stage < ex->n_stages - 1)
        return par_err(PAR_EINTERNAL, "pipeline: backward of microbatch %d stage %d on rank %d has no gradient", mb,
                       stage, ex->me);
    return PAR_OK;
}

par_status PAR_FN(par__exec_backward)(exec_t *ex, PAR_FN(par_model) *M, int mb, int stage, int kind)
{
    mbstage *sl;
    lstage *ls;
    par_status s = PAR_FN(par__exec_mbstage)(ex, mb, stage, &sl, &ls);
    if (s || (s = backward_check(ex, sl, mb, stage, kind)))
        return s;
    size_t xb = (size_t)(ex->Tm * ex->nd) * sizeof(par_real);
    par_real *dX = NULL, *out[2];
    if (kind != PAR_ACT_W) {
        if (!(dX = par_arena_calloc(&sl->ar, xb ? xb : 64, 64)))
            return par_err(PAR_ENOMEM, "pipeline: out of memory in the backward of microbatch %d stage %d", mb,
                           stage);
        if (sl->gout)
            par_dev_copy(dX, sl->gout, xb);
    }
    for (int j = ls->n_items - 1; j >= 0 && !s; j--) {
        int mode = par_dev_mode_set(PAR_DEV_MODE_DEVICE); /* the model's kernels (docs/gpu.md) */
        if (kind == PAR_ACT_W)
            s = item_weights(ex, M, sl, ls, j, mb);
        else if (!(s = item_outs(sl, ls, j, xb, out)))
            s = item_input(ex, M, sl, ls, j, mb, kind == PAR_ACT_BW, &dX, out);
        if (!s && kind != PAR_ACT_W && j == 0 && par_dev_gpu())
            s = grad_out(ex, mb, stage, dX, xb); /* in the window: device to device */
        par_dev_mode_set(mode);
    }
    if (s)
        return s;
    if (kind != PAR_ACT_W) {
        sl->bwd_done = 1;
        if (!par_dev_gpu() && (s = grad_out(ex, mb, stage, dX, xb)))
            return s;
    }
    sl->w_due = kind == PAR_ACT_B;
    /* the state's activations are no longer needed (a local next stage read
     * xout during its forward, long done) */
    if (!sl->w_due)
        par_mbstate_drop(&ex->mbst, &(par_mbctx){.mb = mb}, stage_key(ex, mb, stage));
    return PAR_OK;
}
