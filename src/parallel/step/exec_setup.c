/* parallel/step/exec_setup.c - the step's microbatches: this rank's rows cut
 * into microbatches of whole rows, each derived on the whole rows and (CP)
 * sliced to the rank's columns, the window sample of every token, the
 * statistics window and the backward's global loss scales.  Part of the
 * step executor (parallel/step/exec-impl.h). */
#include <string.h>

#include "parallel/step/exec-impl.h"

/* Context parallelism: local ([rows, L]) gets columns [c0, c0 + L) of every
 * per-token array of full ([rows, S], derived: par_batch_set) and its own
 * label counts, so a sample that crosses a slice border keeps its positions
 * and targets (the last token of a slice is labelled with the first token
 * of the next slice). */
static void slice_columns(par_batch *local, const par_batch *full, int64_t c0)
{
    const int64_t R = full->B, S = full->S, L = local->S;
    int32_t *const dst[6] = {local->tokens, local->segments, local->pos,
                             local->labels, local->mtp_inputs, local->mtp_labels};
    const int32_t *const src[6] = {full->tokens, full->segments, full->pos,
                                   full->labels, full->mtp_inputs, full->mtp_labels};
    int64_t nl = 0, nm = 0;
    for (int64_t r = 0; r < R; r++) {
        for (int k = 0; k < 6; k++)
            memcpy(dst[k] + r * L, src[k] + r * S + c0, (size_t)L * sizeof(int32_t));
        for (int64_t j = 0; j < L; j++) {
            nl += local->labels[r * L + j] >= 0;
            nm += local->mtp_labels[r * L + j] >= 0;
        }
    }
    local->n_labels = nl;
    local->n_mtp_labels = nm;
}

/* Microbatch k: its rows r0 + k*mbs.. as a batch (CP: derived on the whole
 * rows into `full`, then sliced; their positions into ex->pos_rows), the
 * sample of each local token in the microbatch (samples of its earlier
 * rows + the row's segment; the window's samples from *q on), and its
 * hooks' context. */
static par_status one_microbatch(exec_t *ex, int k, int64_t r0, const int32_t *tok, const int32_t *seg,
                                 par_batch *full, int64_t *q, int64_t c0)
{
    const int64_t S = ex->S, Lc = S / (ex->CP * ex->spn), rk = r0 + (int64_t)k * ex->mbs;
    const int32_t V = (int32_t)ex->cfg.vocab_size;
    par_status s = par_batch_alloc(&ex->mb[k], ex->mbs, Lc);
    if (s)
        return s;
    if (ex->tokc) {
        if ((s = par_batch_set(full, tok + rk * S, seg + rk * S, V, "pipeline microbatch")))
            return s;
        slice_columns(&ex->mb[k], full, c0);
        memcpy(ex->pos_rows + (int64_t)k * ex->mbs * S, full->pos, (size_t)(ex->mbs * S) * sizeof(int32_t));
    } else if ((s = par_batch_set(&ex->mb[k], tok + rk * S, seg + rk * S, V, "pipeline microbatch"))) {
        return s;
    }
    int32_t *sm = ex->msample[k] = par_malloc((size_t)ex->Tm * sizeof *sm, PAR_TAG_ACT);
    if (!sm)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    ex->mq0[k] = *q;
    for (int64_t r = 0; r < ex->mbs; r++) {
        const int32_t *sg = seg + (rk + r) * S;
        for (int64_t j = 0; j < Lc; j++)
            sm[r * Lc + j] = (int32_t)(*q - ex->mq0[k] + sg[c0 + j]);
        *q += (int64_t)sg[S - 1] + 1;
    }
    ex->mqn[k] = *q - ex->mq0[k];
    /* the whole rows' positions: CP / SP's, or (TP, the rows whole) the microbatch's own */
    ex->mbx[k] = (par_mbctx){.mb = k, .row0 = (int64_t)k * ex->mbs, .rows = ex->mbs, .S = S,
                             .pos_rows = ex->tokc  ? ex->pos_rows + (int64_t)k * ex->mbs * S
                                         : ex->tpc ? ex->mb[k].pos
                                                   : NULL};
    return PAR_OK;
}

/* Every microbatch of the step; *Nl = the samples of the rank's rows. */
static par_status microbatches(exec_t *ex, const par_pctx *P, const int32_t *tok, const int32_t *seg, int64_t Nl)
{
    int64_t r0 = (int64_t)P->rc.dp * ex->Bl, c0 = ex->col * (ex->S / (ex->CP * ex->spn)), q = 0;
    ex->mb = par_calloc((size_t)ex->m, sizeof *ex->mb, PAR_TAG_ACT);
    ex->mbx = par_calloc((size_t)ex->m, sizeof *ex->mbx, PAR_TAG_ACT);
    ex->msample = par_calloc((size_t)ex->m, sizeof *ex->msample, PAR_TAG_ACT);
    if (!ex->mq0)
        ex->mq0 = par_calloc((size_t)ex->m * 2, sizeof *ex->mq0, PAR_TAG_ACT);
    if (ex->tokc && !ex->pos_rows)
        ex->pos_rows = par_malloc((size_t)(ex->Bl * ex->S) * sizeof *ex->pos_rows, PAR_TAG_ACT);
    if (!ex->mb || !ex->mbx || !ex->msample || !ex->mq0 || (ex->tokc && !ex->pos_rows))
        return par_err(PAR_ENOMEM, "pipeline: out of memory for %d microbatches", ex->m);
    ex->mqn = ex->mq0 + ex->m;
    par_batch full;
    memset(&full, 0, sizeof full);
    par_status s = ex->tokc ? par_batch_alloc(&full, ex->mbs, ex->S) : PAR_OK;
    for (int k = 0; k < ex->m && !s; k++)
        s = one_microbatch(ex, k, r0, tok, seg, &full, &q, c0);
    par_batch_free(&full);
    if (!s && q != Nl)
        s = par_err(PAR_EINTERNAL, "pipeline: %lld samples in the microbatches, %lld in the rows", (long long)q,
                    (long long)Nl);
    return s;
}

/* The window of Nl samples: its per-sample terms, with the row map of the
 * blocks of this rank's stages.  The aux counts (cnt, psum, ntok) live in
 * the (mb, stage) states, per microbatch in flight (exec_stage.c; a rank used to hold
 * [its blocks, Nl, E] of each for the whole step, twice under CP). */
static par_status stats_held(const exec_t *ex, const PAR_FN(par_model) *M, PAR_FN(par_stats) *st, int64_t Nl)
{
    uint8_t *held = par_calloc((size_t)(M->n_blocks > 0 ? M->n_blocks : 1), 1, PAR_TAG_ACT);
    if (!held)
        return par_err(PAR_ENOMEM, "pipeline: out of memory for the block map");
    for (int j = 0; j < ex->n_local; j++)
        for (int i = 0; i < ex->ls[j].n_items; i++)
            if (ex->ls[j].block[i] >= 0 && ex->ls[j].block[i] < M->n_blocks)
                held[ex->ls[j].block[i]] = 1;
    PAR_FN(par_stats_free)(st);
    par_status s = PAR_FN(par_stats_alloc_terms)(st, M->n_blocks, held, M->E, Nl);
    par_free(held);
    return s;
}

/* The statistics window of the rank's rows and the GLOBAL counts the
 * backward's loss scales use (known from the data before any forward). */
static par_status stats_window(exec_t *ex, PAR_FN(par_model) *M, PAR_FN(par_stats) *st, int64_t q0, int64_t Nl,
                               int64_t Ng)
{
    par_status s;
    if ((!st->ce_main || st->Ns != Nl) && (s = stats_held(ex, M, st, Nl)))
        return s;
    if (M->cfg.bitwise && (s = PAR_FN(par_stats_exact)(st))) /* order-free CE sums (docs/bitwise.md) */
        return s;
    PAR_FN(par_stats_zero)(st);
    st->q0 = q0;
    st->Ns_global = Ng;
    st->n_main = ex->gb_labels;
    st->n_mtp = ex->cfg.n_mtp_layers > 0 ? ex->gb_mtp_labels : 0;
    st->n_tokens = ex->B * ex->S;
    return PAR_OK;
}

/* The global batch's label counts, par_batch_derive's, from the segments
 * alone (a label wherever the next token is in the same sample; the tokens
 * are checked): every rank used to hold a derived copy of the whole batch
 * (six int32 arrays of B x S) for these two numbers. */
static void global_counts(exec_t *ex, const int32_t *seg)
{
    const int64_t S = ex->S;
    int64_t nl = 0, nm = 0;
    for (int64_t r = 0; r < ex->B; r++) {
        const int32_t *sg = seg + r * S;
        for (int64_t j = 0; j + 1 < S; j++) {
            nl += sg[j + 1] == sg[j];
            nm += j + 2 < S && sg[j + 2] == sg[j];
        }
    }
    ex->gb_labels = nl;
    ex->gb_mtp_labels = nm;
}

par_status PAR_FN(par__exec_setup)(exec_t *ex, const par_pctx *P, PAR_FN(par_model) *M, const int32_t *tok,
                                   const int32_t *seg)
{
    const int64_t S = ex->S, r0 = (int64_t)P->rc.dp * ex->Bl;
    par_status s;
    if ((s = par_batch_check(tok, seg, ex->B, S, ex->cfg.vocab_size, "pipeline batch")))
        return s;
    global_counts(ex, seg);
    /* samples: before this rank's rows, in them, in the batch */
    int64_t q0 = 0, Nl = 0, Ng = 0;
    for (int64_t r = 0; r < ex->B; r++) {
        int64_t ns = (int64_t)seg[(r + 1) * S - 1] + 1;
        if (r < r0)
            q0 += ns;
        else if (r < r0 + ex->Bl)
            Nl += ns;
        Ng += ns;
    }
    if ((s = microbatches(ex, P, tok, seg, Nl)) || (s = stats_window(ex, M, &M->stats, q0, Nl, Ng)))
        return s;
    /* outboxes and (mb, stage) states */
    size_t no = (size_t)ex->m * (size_t)ex->n_stages;
    if (!ex->out_act) {
        ex->out_act = par_calloc(no, sizeof *ex->out_act, PAR_TAG_COMM);
        ex->out_grad = par_calloc(no, sizeof *ex->out_grad, PAR_TAG_COMM);
        if (!ex->out_act || !ex->out_grad)
            return par_err(PAR_ENOMEM, "pipeline: out of memory for %zu outboxes", no);
        if ((s = PAR_FN(par__exec_mbstage_init)(ex)))
            return s;
    }
    return PAR_OK;
}

void PAR_FN(par__exec_setup_free)(exec_t *ex)
{
    if (ex->mb)
        for (int k = 0; k < ex->m; k++)
            par_batch_free(&ex->mb[k]);
    par_free(ex->mb);
    ex->mb = NULL;
    if (ex->msample)
        for (int k = 0; k < ex->m; k++)
            par_free(ex->msample[k]);
    par_free(ex->msample);
    ex->msample = NULL;
    par_free(ex->mbx);
    ex->mbx = NULL;
}
