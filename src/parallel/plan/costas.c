/* parallel/plan/costas.c - the cost plan of `parity run --cost-as` (see
 * parallel/plan/costas.h; formulas and sources in docs/planning.md). */
#include "parallel/plan/costas.h"

#include <string.h>

#include "core/alloc.h"
#include "model/params.h"
#include "parallel/plan/plan.h"
#include "parallel/plan/steptime.h"

/* The target's layout: the run's sizes with the target's pipeline layout. */
static par_status target_layout(const par_config *tg, const par_layout *l, const char *layout, par_layout *tl)
{
    par_layout_init(tl);
    tl->tp = l->tp, tl->pp = l->pp, tl->vpp = l->vpp, tl->cp = l->cp, tl->ep = l->ep, tl->etp = l->etp;
    tl->world = l->world, tl->micro_batch = l->micro_batch, tl->global_batch = l->global_batch;
    tl->mb_group = l->mb_group, tl->distributed_optimizer = l->distributed_optimizer;
    par_status s = par_layout_set_schedule(tl, l->schedule);
    int64_t segs = l->pp * (l->vpp > 0 ? l->vpp : 1);
    char buf[PAR_LAYOUT_STR_MAX] = "";
    if (!s && layout && layout[0])
        snprintf(buf, sizeof buf, "%s", layout);
    else if (!s && l->pp > 1 && tg->n_layers % segs != 0)
        par_pplayout_suggest(buf, (int)sizeof buf, segs, tg->n_layers, tg->n_mtp_layers);
    if (!s && buf[0])
        s = par_layout_set_pp_layout(tl, buf);
    if (s || (s = par_plan_resolve(tl, tg)))
        return par_err(s, "--cost-as %s: the target's layout (the run's sizes%s%s): %s", tg->preset,
                       buf[0] ? ", pipeline layout " : "", buf, par_last_error());
    if (tl->pipe.n_segments != l->pipe.n_segments)
        return par_err(PAR_EINVAL, "--cost-as %s: the target's pipeline layout has %d segments, the run's %d",
                       tg->preset, tl->pipe.n_segments, l->pipe.n_segments);
    return PAR_OK;
}

/* Per stage: the target's forward FLOPs of one action; per run block: the
 * target MoE blocks it stands for. */
static par_status stage_costs(par_costas *c, const par_config *cfg, const par_layout *l)
{
    const par_config *tg = &c->target;
    double Ts = (double)(l->micro_batch > 0 ? l->micro_batch : 1) * (double)cfg->seq_length / (double)l->cp;
    double routed = 2 * c->tokens * (double)tg->n_activated_experts * 3 * (double)tg->dim * (double)tg->moe_inter_dim;
    for (int s = 0; s < c->n_stages; s++) {
        int mt = 0, ms = 0, cmp = 0;
        double f = par_steptime_segment_flops(tg, &c->tl, s, c->tokens, &mt, &cmp);
        (void)par_steptime_segment_flops(cfg, l, s, Ts, &ms, &cmp);
        if (c->routed_apart && mt > 0 && ms == 0)
            return par_err(PAR_EINVAL, "--cost-as %s: stage %d of the target holds %d MoE blocks, the run's stage "
                                       "none to stand for them (give the run a block on every stage)",
                           tg->preset, s, mt);
        c->f_dense[s] = (f - (c->routed_apart ? mt * routed : 0)) * c->mb_mul;
        const par_pplayout *pl = &l->pipe;
        int t = par_pplayout_offset(pl, s, PAR_BLK_LAYER), q = par_pplayout_offset(pl, s, PAR_BLK_MTP);
        for (int i = pl->seg_off[s]; i < pl->seg_off[s + 1]; i++) {
            char it = pl->items[i];
            int b = it == PAR_BLK_LAYER ? t++ : it == PAR_BLK_MTP ? (int)cfg->n_layers + q++ : -1;
            if (b >= 0 && b < c->n_blocks)
                c->blk_mul[b] = ms > 0 ? (double)mt / (double)ms : 0;
        }
    }
    return PAR_OK;
}

/* Byte scales of the PP, CP and DP messages (run bytes -> target bytes). */
static par_status byte_scales(par_costas *c, const par_config *cfg, const par_layout *l, int precision)
{
    const par_config *tg = &c->target;
    double es = precision / 8.0, St = (double)tg->seq_length, Ss = (double)cfg->seq_length;
    c->pp_scale = (St * (double)(tg->hc_mult * tg->dim) * 2) / (Ss * (double)(cfg->hc_mult * cfg->dim) * es);
    c->cp_scale = (St * (double)tg->head_dim * 2) / (Ss * (double)cfg->head_dim * es);
    int64_t nt = 0, ns = 0;
    par_status s = par_param_count(tg, NULL, &nt, NULL);
    if (s || (s = par_param_count(cfg, NULL, &ns, NULL)))
        return s;
    double rt = (double)par_param_count_routed_expert_floats(tg), rs = (double)par_param_count_routed_expert_floats(cfg);
    double per = l->distributed_optimizer ? 3.0 : 4.0; /* ZeRO-1: fp32 RS + bf16 AG; else an fp32 all-reduce */
    c->dense_scale = ((double)nt - rt) / ((double)ns - rs) * per / es;
    c->expert_scale = rs > 0 ? rt / rs * per / es : 1;
    return PAR_OK;
}

par_status par_costas_build(const par_config *cfg, const par_layout *l, int precision, const char *target,
                            const char *layout, par_costas *out)
{
    if (!l->resolved)
        return par_err(PAR_EINVAL, "--cost-as: the run's layout is not resolved");
    par_costas c;
    memset(&c, 0, sizeof c);
    par_status s = par_config_preset(&c.target, target);
    if (s)
        return par_err(s, "--cost-as %s: %s", target, par_last_error());
    if ((s = target_layout(&c.target, l, layout, &c.tl)))
        return s;
    const par_config *tg = &c.target;
    double b = (double)(l->micro_batch > 0 ? l->micro_batch : 1);
    c.tokens = b * (double)tg->seq_length / (double)l->cp;
    c.mb_mul = l->pp > 1 ? 1.0 : (double)(l->global_batch / l->da) / b;
    c.row_mul = ((double)tg->seq_length * (double)tg->n_activated_experts) /
                ((double)cfg->seq_length * (double)cfg->n_activated_experts);
    c.row_bytes = 2.0 * (double)tg->dim;
    c.expert_flops = 6.0 * (double)tg->dim * (double)tg->moe_inter_dim;
    c.routed_apart = l->ep > 1;
    c.n_stages = l->pipe.n_segments;
    c.n_blocks = (int)par_config_n_blocks(cfg);
    c.f_dense = par_calloc((size_t)c.n_stages, sizeof *c.f_dense, PAR_TAG_MISC);
    c.blk_mul = par_calloc((size_t)c.n_blocks, sizeof *c.blk_mul, PAR_TAG_MISC);
    if (!c.f_dense || !c.blk_mul)
        s = par_err(PAR_ENOMEM, "--cost-as: out of memory for %d stages", c.n_stages);
    if (!s && !(s = stage_costs(&c, cfg, l)) && !(s = byte_scales(&c, cfg, l, precision))) {
        *out = c;
        return PAR_OK;
    }
    par_costas_free(&c);
    return s;
}

void par_costas_free(par_costas *c)
{
    if (!c)
        return;
    par_free(c->f_dense);
    par_free(c->blk_mul);
    memset(c, 0, sizeof *c);
}
