/* parallel/step/finalize.c - finishing a step's gradients: statistics,
 * TP / ETP and shared-weight sums, the DP / ZeRO-1 reduction, the norm and
 * the clip factor, in that order (see parallel/step/finalize.h). */
#include "parallel/step/finalize.h"

#include <math.h>

#include "model/optim.h"
#include "parallel/step/exec-impl.h"

/* 3. Gradients of weights on several pipeline ranks: DualPipe's pair holds
 * two copies of every stage (every held gradient over the pair), else
 * embed.weight over the EMBED group, head.weight over the MTP group. */
static par_status shared_sums(const exec_t *ex, const par_pctx *P, PAR_FN(par_model) *M)
{
    if (ex->pair)
        return PAR_FN(par_reduce_shared_grads)(M, ex->pair, 2);
    par_status s = PAR_FN(par_reduce_shared_grads)(M, P->g.g[PAR_GROUP_EMBED], 0);
    return s ? s : PAR_FN(par_reduce_shared_grads)(M, P->g.g[PAR_GROUP_MTP], 1);
}

/* 1. to 3.: what the executor's layouts spread over ranks, summed. */
static par_status layout_sums(const exec_t *ex, const par_pctx *P, PAR_FN(par_model) *M)
{
    par_status s;
    if ((s = PAR_FN(par_reduce_stats)(P, M)) || (s = PAR_FN(par_reduce_tp_grads)(M, ex->tpc, ex->tp_grads)) ||
        (s = PAR_FN(par_reduce_etp_grads)(M, ex->etpc)) || (s = shared_sums(ex, P, M)))
        return s;
    M->have_fwd = 1;
    return PAR_OK;
}

par_status PAR_FN(par_finalize_grads)(PAR_FN(par_exec) *ex, PAR_FN(par_dpw) *w, const par_pctx *P,
                                      PAR_FN(par_model) *M, par_finalize_norm *out)
{
    double sum = 0.0;
    par_status s;
    if ((s = PAR_FN(par_model_grads_settle)(M)) || (s = layout_sums(ex, P, M)) || (s = PAR_FN(par_dpw_reduce)(w, M)) ||
        (s = PAR_FN(par_dpw_norm)(w, P, M, ex->norm_skip, &sum)))
        return s;
    const double norm = sqrt(sum);
    M->stats.grad_sumsq = sum;
    M->last.grad_norm = norm;
    *out = (par_finalize_norm){.sumsq = sum, .norm = norm, .clip = par_clip_factor(norm, M->cfg.clip_grad)};
    return PAR_OK;
}
