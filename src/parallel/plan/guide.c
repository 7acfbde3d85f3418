/* parallel/plan/guide.c - the tuning guide's arithmetic (see parallel/plan/guide.h). */
#include "parallel/plan/guide.h"

#include <stdio.h>
#include <string.h>

#include "parallel/plan/plan.h"
#include "parallel/schedule/schedule.h"

/* MoE layers ('t' and 'm' blocks) of the fullest pipeline rank (its
 * segments of every virtual chunk; DualPipeV's V shape included). */
static int64_t fullest_stage(const par_layout *l)
{
    int64_t best = 0;
    for (int r = 0; r < (int)l->pp; r++) {
        int64_t n = 0;
        for (int s = 0; s < l->pipe.n_segments; s++)
            if (par_layout_segment_rank(l, s) == r)
                n += par_pplayout_count(&l->pipe, s, PAR_BLK_LAYER) + par_pplayout_count(&l->pipe, s, PAR_BLK_MTP);
        if (n > best)
            best = n;
    }
    return best;
}

/* Megatron's interleaved check (the schedule's): VPP 2, group = PP. */
static void vpp_check(const par_layout *l, par_guide_row *g)
{
    g->vpp_legal = 0;
    g->vpp_why[0] = '\0';
    if (l->pp < 2) {
        snprintf(g->vpp_why, sizeof g->vpp_why, "no pipeline (PP 1)");
        return;
    }
    par_schedule_params sp, ok;
    par_schedule_params_init(&sp);
    sp.kind = PAR_SCHED_INTERLEAVED;
    sp.pp = (int)l->pp;
    sp.vpp = l->vpp > 1 ? (int)l->vpp : 2;
    sp.n_micro = (int)l->n_micro;
    sp.mb_group = (int)l->mb_group;
    if (par_schedule_params_check(&sp, &ok) == PAR_OK) /* a refusal is recorded, not returned */
        g->vpp_legal = 1;
    else
        snprintf(g->vpp_why, sizeof g->vpp_why, "%s", par_last_error());
}

par_status par_guide_row_of(const par_config *cfg, const par_layout *l, par_guide_row *out)
{
    if (!l->resolved)
        return par_err(PAR_EINVAL, "guide: the layout is not resolved");
    par_guide_row g;
    memset(&g, 0, sizeof g);
    g.world = l->world, g.pp = l->pp, g.vpp = l->vpp, g.tp = l->tp, g.cp = l->cp;
    g.ep = l->ep, g.etp = l->etp, g.da = l->da, g.de = l->de;
    g.b = l->micro_batch > 0 ? l->micro_batch : 1;
    g.B = l->global_batch;
    g.S = cfg->seq_length;
    g.m = l->n_micro;
    g.bubble = l->pp > 1 ? (double)(l->pp - 1) / (double)(g.m + l->pp - 1) : 0.0;
    vpp_check(l, &g);
    g.t_group = l->ep * g.b * g.S / l->cp;
    g.e_t_expert = (double)cfg->n_activated_experts * (double)g.t_group / (double)cfg->n_routed_experts;
    g.local_rows = g.S / l->cp;
    g.d_window = l->d_window;
    g.d_window_ok = l->cp == 1 || g.local_rows >= g.d_window;
    g.expert_params = 3 * cfg->dim * cfg->moe_inter_dim;
    g.moe_layers = fullest_stage(l);
    *out = g;
    return PAR_OK;
}

int par_guide_ep_table(const par_config *cfg, const par_layout *l, par_guide_ep_row rows[3])
{
    const int64_t per = l->world / l->pp, E = cfg->n_routed_experts, layers = fullest_stage(l);
    const int64_t cand[3] = {l->ep / 2, l->ep, l->ep * 2};
    int n = 0;
    for (int i = 0; i < 3; i++) {
        int64_t ep = cand[i];
        if (ep < 1 || E % ep != 0 || per % (ep * l->etp) != 0)
            continue;
        rows[n].ep = ep;
        rows[n].experts_per_rank = E / ep;
        rows[n].de = per / (ep * l->etp);
        rows[n].moe_layers = layers;
        rows[n].bytes = (double)layers * (double)(E / ep) * 3.0 * (double)cfg->dim * (double)cfg->moe_inter_dim * 2.0;
        n++;
    }
    return n;
}

void par_guide_config_layout(const par_config *cfg, int i, par_layout *l)
{
    static const int64_t gpus[3] = {1024, 8192, 8192}, cps[3] = {1, 1, 4};
    par_layout_init(l);
    l->pp = 8;
    l->ep = 64;
    l->cp = cps[i];
    l->world = gpus[i];
    l->micro_batch = 1;
    l->global_batch = 4096;
    if (cfg->n_layers % 8 != 0) {
        char s[PAR_LAYOUT_STR_MAX];
        par_pplayout_suggest(s, (int)sizeof s, 8, cfg->n_layers, cfg->n_mtp_layers);
        (void)par_layout_set_pp_layout(l, s);
    }
}

par_status par_guide_configs(const par_config *cfg, par_guide_row rows[3])
{
    for (int i = 0; i < 3; i++) {
        par_layout l;
        par_guide_config_layout(cfg, i, &l);
        par_status s = par_plan_resolve(&l, cfg);
        if (s)
            return s;
        if ((s = par_guide_row_of(cfg, &l, &rows[i])))
            return s;
    }
    return PAR_OK;
}
