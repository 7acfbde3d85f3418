/* model/model.c - model construction, statistics, losses (see model/model.h). */
#include "model/model.h"

#include <math.h>
#include <string.h>

#include "core/log.h"
#include "model/init.h"

par_real *PAR_FN(par_model_ptr)(par_real *flat, const par_param_table *t, int idx)
{
    if (idx < 0 || !flat)
        return NULL;
    return flat + t->p[idx].offset;
}

/* ------------------------------------------------------------ statistics -- */

par_status PAR_FN(par_stats_alloc)(PAR_FN(par_stats) *st, int64_t n_blocks, int64_t E, int64_t Ns)
{
    memset(st, 0, sizeof *st);
    if (n_blocks < 0 || E < 1 || Ns < 0)
        return par_err(PAR_EINVAL, "stats: bad sizes n_blocks=%lld E=%lld Ns=%lld",
                       (long long)n_blocks, (long long)E, (long long)Ns);
    st->n_blocks = n_blocks;
    st->E = E;
    st->Ns = Ns;
    size_t ns = (size_t)(Ns > 0 ? Ns : 1);
    size_t nb = (size_t)(n_blocks > 0 ? n_blocks : 1);
    st->ce_main = par_calloc(ns, sizeof(double), PAR_TAG_ACT);
    st->ce_mtp = par_calloc(ns, sizeof(double), PAR_TAG_ACT);
    st->loads = par_calloc(nb * (size_t)E, sizeof(int64_t), PAR_TAG_ACT);
    st->cnt = par_calloc(nb * ns * (size_t)E, sizeof(int64_t), PAR_TAG_ACT);
    st->psum = par_calloc(nb * ns * (size_t)E, sizeof(par_real), PAR_TAG_ACT);
    st->ntok = par_calloc(nb * ns, sizeof(int64_t), PAR_TAG_ACT);
    if (!st->ce_main || !st->ce_mtp || !st->loads || !st->cnt || !st->psum || !st->ntok) {
        PAR_FN(par_stats_free)(st);
        return par_err(PAR_ENOMEM, "stats: out of memory (n_blocks=%lld E=%lld Ns=%lld)",
                       (long long)n_blocks, (long long)E, (long long)Ns);
    }
    return PAR_OK;
}

void PAR_FN(par_stats_zero)(PAR_FN(par_stats) *st)
{
    size_t ns = (size_t)(st->Ns > 0 ? st->Ns : 1);
    size_t nb = (size_t)(st->n_blocks > 0 ? st->n_blocks : 1);
    size_t E = (size_t)st->E;
    st->n_main = st->n_mtp = st->n_tokens = 0;
    st->grad_sumsq = 0;
    memset(st->ce_main, 0, ns * sizeof(double));
    memset(st->ce_mtp, 0, ns * sizeof(double));
    memset(st->loads, 0, nb * E * sizeof(int64_t));
    memset(st->cnt, 0, nb * ns * E * sizeof(int64_t));
    memset(st->psum, 0, nb * ns * E * sizeof(par_real));
    memset(st->ntok, 0, nb * ns * sizeof(int64_t));
}

void PAR_FN(par_stats_free)(PAR_FN(par_stats) *st)
{
    par_free(st->ce_main);
    par_free(st->ce_mtp);
    par_free(st->loads);
    par_free(st->cnt);
    par_free(st->psum);
    par_free(st->ntok);
    memset(st, 0, sizeof *st);
}

par_status PAR_FN(par_stats_combine)(PAR_FN(par_stats) *dst, const PAR_FN(par_stats) *src)
{
    if (dst->n_blocks != src->n_blocks || dst->E != src->E || dst->Ns != src->Ns)
        return par_err(PAR_EMISMATCH,
                       "stats combine: sizes differ (n_blocks %lld vs %lld, E %lld vs %lld, Ns %lld vs %lld)",
                       (long long)dst->n_blocks, (long long)src->n_blocks, (long long)dst->E,
                       (long long)src->E, (long long)dst->Ns, (long long)src->Ns);
    int64_t ns = dst->Ns, nb = dst->n_blocks, E = dst->E;
    dst->n_main += src->n_main;
    dst->n_mtp += src->n_mtp;
    dst->n_tokens += src->n_tokens;
    dst->grad_sumsq += src->grad_sumsq;
    for (int64_t q = 0; q < ns; q++) {
        dst->ce_main[q] += src->ce_main[q];
        dst->ce_mtp[q] += src->ce_mtp[q];
    }
    for (int64_t i = 0; i < nb * E; i++)
        dst->loads[i] += src->loads[i];
    for (int64_t i = 0; i < nb * ns * E; i++) {
        dst->cnt[i] += src->cnt[i];
        dst->psum[i] += src->psum[i];
    }
    for (int64_t i = 0; i < nb * ns; i++)
        dst->ntok[i] += src->ntok[i];
    return PAR_OK;
}

void PAR_FN(par_model_losses)(const PAR_FN(par_model) *M, const PAR_FN(par_stats) *st,
                              par_step_scalars *out)
{
    const par_config *c = &M->cfg;
    double lm = 0, lt = 0, la = 0;
    if (st->n_main > 0) {
        double s = 0;
        for (int64_t q = 0; q < st->Ns; q++)
            s += st->ce_main[q];
        lm = s / (double)st->n_main;
    }
    if (c->n_mtp_layers > 0 && st->n_mtp > 0) {
        double s = 0;
        for (int64_t q = 0; q < st->Ns; q++)
            s += st->ce_mtp[q];
        lt = s / (double)st->n_mtp;
    }
    for (int b = 0; b < M->n_blocks; b++) {
        if (M->tab.blocks[b].gate_bias < 0)
            continue; /* hash-routed: no aux loss */
        la += (double)PAR_FN(par_moe_aux_loss)(st->cnt + (int64_t)b * st->Ns * st->E,
                                               st->psum + (int64_t)b * st->Ns * st->E,
                                               st->ntok + (int64_t)b * st->Ns, st->Ns, st->Ns,
                                               (int)st->E, (int)M->K);
    }
    out->loss_main = lm;
    out->loss_mtp = lt;
    out->loss_aux = la;
    out->loss = lm + (st->n_mtp > 0 ? c->mtp_lambda * lt : 0.0) + c->aux_alpha * la;
    out->grad_norm = sqrt(st->grad_sumsq);
}

/* ------------------------------------------------------------------ model -- */

void PAR_FN(par_model_free)(PAR_FN(par_model) *M)
{
    if (M->blk) {
        for (int b = 0; b < M->n_blocks; b++)
            PAR_FN(par_block_act_release)(&M->blk[b]);
    }
    par_free(M->blk);
    par_free(M->X);
    par_arena_destroy(&M->arena);
    PAR_FN(par_stats_free)(&M->stats);
    par_free(M->params);
    par_free(M->grads);
    par_free(M->opt_m);
    par_free(M->opt_v);
    par_free(M->i32);
    par_free(M->rope);
    par_free(M->adims);
    par_free((void *)M->ew);
    par_free(M->egw);
    if (M->tab.p)
        par_param_table_free(&M->tab);
    memset(M, 0, sizeof *M);
}

par_status PAR_FN(par_model_init)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed)
{
    memset(M, 0, sizeof *M);
    par_status st = par_config_validate(cfg);
    if (st)
        return st;
    if (cfg->n_mtp_layers > 1)
        return par_err(PAR_EUNSUPPORTED, "model: n_mtp_layers = %lld, the reference supports 0 or 1",
                       (long long)cfg->n_mtp_layers);
    if (cfg->hc_mult > PAR_HC_MAX_N)
        return par_err(PAR_EUNSUPPORTED, "model: hc_mult = %lld exceeds the kernels' limit %d",
                       (long long)cfg->hc_mult, PAR_HC_MAX_N);
    M->cfg = *cfg;
    M->seed = seed;
    st = par_param_table_build(&M->tab, cfg);
    if (st) {
        memset(&M->tab, 0, sizeof M->tab);
        return st;
    }
    M->n = cfg->hc_mult;
    M->d = cfg->dim;
    M->V = cfg->vocab_size;
    M->E = cfg->n_routed_experts;
    M->K = cfg->n_activated_experts;
    M->I = cfg->moe_inter_dim;
    M->n_blocks = (int)par_config_n_blocks(cfg);
    int64_t nf = M->tab.n_float;
    M->params = par_calloc((size_t)nf, sizeof(par_real), PAR_TAG_PARAM);
    M->grads = par_calloc((size_t)nf, sizeof(par_real), PAR_TAG_GRAD);
    M->opt_m = par_calloc((size_t)nf, sizeof(par_real), PAR_TAG_OPTIM);
    M->opt_v = par_calloc((size_t)nf, sizeof(par_real), PAR_TAG_OPTIM);
    M->i32 = par_calloc((size_t)(M->tab.n_i32 > 0 ? M->tab.n_i32 : 1), sizeof(int32_t), PAR_TAG_PARAM);
    M->rope = par_calloc((size_t)M->n_blocks, sizeof(par_rope), PAR_TAG_MODEL);
    M->adims = par_calloc((size_t)M->n_blocks, sizeof(par_attn_dims), PAR_TAG_MODEL);
    M->ew = par_calloc((size_t)M->n_blocks * 3 * (size_t)M->E, sizeof(par_real *), PAR_TAG_MODEL);
    M->egw = par_calloc((size_t)M->n_blocks * 3 * (size_t)M->E, sizeof(par_real *), PAR_TAG_MODEL);
    M->blk = par_calloc((size_t)M->n_blocks, sizeof(PAR_FN(par_block_act)), PAR_TAG_MODEL);
    M->X = par_calloc((size_t)cfg->n_layers + 1, sizeof(par_real *), PAR_TAG_MODEL);
    if (!M->params || !M->grads || !M->opt_m || !M->opt_v || !M->i32 || !M->rope || !M->adims ||
        !M->ew || !M->egw || !M->blk || !M->X) {
        PAR_FN(par_model_free)(M);
        return par_err(PAR_ENOMEM, "model: out of memory for %lld parameters", (long long)nf);
    }
    PAR_FN(par_init_params)(M->params, M->i32, &M->tab, seed);

    for (int b = 0; b < M->n_blocks; b++) {
        int64_t m = par_config_ratio(cfg, b);
        if (m > 0)
            par_rope_init(&M->rope[b], (int)cfg->rope_head_dim, cfg->compress_rope_theta, 1,
                          cfg->rope_factor, cfg->original_seq_len, cfg->beta_fast, cfg->beta_slow);
        else
            par_rope_init(&M->rope[b], (int)cfg->rope_head_dim, cfg->rope_theta, 0, cfg->rope_factor,
                          0, cfg->beta_fast, cfg->beta_slow);
        par_attn_dims *dm = &M->adims[b];
        dm->d = cfg->dim;
        dm->H = cfg->n_heads;
        dm->hd = cfg->head_dim;
        dm->rd = cfg->rope_head_dim;
        dm->q_lora = cfg->q_lora_rank;
        dm->o_groups = cfg->o_groups;
        dm->o_lora = cfg->o_lora_rank;
        dm->window = cfg->window_size;
        dm->m = m;
        dm->iH = cfg->index_n_heads;
        dm->ihd = cfg->index_head_dim;
        dm->topk = cfg->index_topk;
        dm->norm_eps = cfg->norm_eps;
        dm->rope = &M->rope[b];
        st = PAR_FN(par_attn_check_dims)(dm);
        if (st) {
            PAR_FN(par_model_free)(M);
            return st;
        }
        const par_block_params *bp = &M->tab.blocks[b];
        for (int64_t e = 0; e < M->E; e++) {
            for (int k = 0; k < 3; k++) {
                int idx = bp->expert0 + 3 * (int)e + k;
                size_t slot = ((size_t)b * 3 + (size_t)k) * (size_t)M->E + (size_t)e;
                M->ew[slot] = PAR_FN(par_model_ptr)(M->params, &M->tab, idx);
                M->egw[slot] = PAR_FN(par_model_ptr)(M->grads, &M->tab, idx);
            }
        }
    }
    par_arena_init(&M->arena, (size_t)8 << 20, PAR_TAG_ACT);
    return PAR_OK;
}
