/* parallel/plan/steptime.c - the analytical step time (see parallel/plan/steptime.h).
 * The FLOP table names the GEMMs of block.c / attention.c / moe.c / head.c
 * (2 M N K each, kernels/ops.c's count). */
#include "parallel/plan/steptime.h"

#include <string.h>

#include "core/alloc.h"
#include "model/params.h"
#include "parallel/layout/groups.h"
#include "parallel/plan/memmodel.h"
#include "parallel/schedule/schedule.h"

/* ---- FLOPs --------------------------------------------------------------------- */

double par_steptime_block_flops(const par_config *g, int b, double T)
{
    double d = (double)g->dim, n = (double)g->hc_mult, H = (double)g->n_heads, hd = (double)g->head_dim;
    double ql = (double)g->q_lora_rank, HD = H * hd, GL = (double)(g->o_groups * g->o_lora_rank);
    double m = b < g->n_compress_ratios ? (double)g->compress_ratios[b] : 0, P = (2 + n) * n;
    double f = 2 * 2 * T * n * d * P;                            /* mHC: hc_attn_fn, hc_ffn_fn */
    f += 2 * T * (d * ql + ql * HD + d * hd + HD / (double)g->o_groups * GL + GL * d); /* wq_a wq_b wkv wo_a wo_b */
    double keys = (double)g->window_size < T ? (double)g->window_size : T;
    if (m > 0) {
        double coff = m == 4 ? 2 : 1;
        f += 2 * 2 * T * d * coff * hd; /* compressor wkv, wgate */
        keys += m == 4 ? (double)g->index_topk : T / (2 * m);
    }
    if (m == 4) { /* indexer: wq_b, weights_proj, its compressor, scores over the causal entries */
        double iH = (double)g->index_n_heads, ihd = (double)g->index_head_dim;
        f += 2 * T * (ql * iH * ihd + d * iH + 2 * d * 2 * ihd) + 2 * T * (T / (2 * m)) * iH * ihd;
    }
    f += 2 * 2 * T * keys * HD; /* scores and values */
    double E = (double)g->n_routed_experts, K = (double)g->n_activated_experts, I = (double)g->moe_inter_dim;
    f += 2 * T * d * E + 2 * T * K * 3 * d * I + 2 * T * 3 * d * I; /* gate, routed, shared */
    return f;
}

double par_steptime_head_flops(const par_config *g, double T) { return 2 * T * (double)g->dim * (double)g->vocab_size; }

double par_steptime_mtp_input_flops(const par_config *g, double T)
{
    double d = (double)g->dim;
    return 2 * T * d * d + 2 * T * (double)g->hc_mult * d * d; /* e_proj, h_proj */
}

/* Forward FLOPs of segment s on T tokens, and its MoE / compressed layers. */
double par_steptime_segment_flops(const par_config *g, const par_layout *l, int s, double T, int *moe, int *cmp)
{
    const par_pplayout *pl = &l->pipe;
    int t = par_pplayout_offset(pl, s, PAR_BLK_LAYER), L = (int)g->n_layers;
    double f = 0;
    *moe = *cmp = 0;
    for (int i = pl->seg_off[s]; i < pl->seg_off[s + 1]; i++) {
        char it = pl->items[i];
        int b = it == PAR_BLK_LAYER ? t++ : L;
        if (it == PAR_BLK_LAYER || it == PAR_BLK_MTP) {
            f += par_steptime_block_flops(g, b, T);
            (*moe)++;
            *cmp += b < g->n_compress_ratios && g->compress_ratios[b] > 0;
        }
        if (it == PAR_BLK_MTP)
            f += par_steptime_mtp_input_flops(g, T) + par_steptime_head_flops(g, T);
        if (it == PAR_BLK_LOSS)
            f += par_steptime_head_flops(g, T);
    }
    return f;
}

/* ---- communication ------------------------------------------------------------ */

/* World ranks of group k of rank r into a par_malloc'd array. */
static int *members(const par_layout *l, par_group_kind k, int r, int *n)
{
    int *m = par_malloc((size_t)l->world * sizeof *m, PAR_TAG_MODEL);
    if (m && par_group_members(l, k, r, m, (int)l->world, n) != PAR_OK) {
        par_free(m);
        return NULL;
    }
    return m;
}

/* One all-to-all of the EP group of rank r: k*T/EP rows of d bf16 values to
 * every peer, `skew` times that from every peer (the heaviest receiver). */
static double ep_a2a(const par_netmodel *net, const par_layout *l, int r, double rows, double d, double skew,
                     double bytes[PAR_TIER_COUNT])
{
    int n = 0, me = 0;
    int *w = members(l, PAR_GROUP_EP, r, &n);
    size_t *to = par_calloc((size_t)(n > 0 ? n : 1) * 2, sizeof *to, PAR_TAG_MODEL);
    if (!w || !to || n < 2) {
        par_free(w);
        par_free(to);
        return 0;
    }
    for (int j = 0; j < n; j++) {
        me = w[j] == r ? j : me;
        to[j] = (size_t)(rows / n * d * 2.0);
        to[n + j] = (size_t)(rows / n * skew * d * 2.0);
    }
    to[me] = to[n + me] = 0;
    par_netcost c = par_net_alltoall(net, w, n, me, to, to + n);
    for (int t = 0; t < PAR_TIER_COUNT; t++)
        bytes[t] += (double)c.bytes[t];
    par_free(w);
    par_free(to);
    return c.time;
}

/* A ring over group k of rank r: `steps` steps of `step_bytes`. */
static double ring(const par_netmodel *net, const par_layout *l, par_group_kind k, int r, int phases, double bytes)
{
    int n = 0, me = 0;
    int *w = members(l, k, r, &n);
    if (!w || n < 2) {
        par_free(w);
        return 0;
    }
    for (int j = 0; j < n; j++)
        me = w[j] == r ? j : me;
    par_netcost c = par_net_ring(net, w, n, me, n - 1, (size_t)(bytes / n));
    par_free(w);
    return phases * c.time;
}

/* CP: per compressed layer, a ring all-gather of the local tokens' entries
 * (T/m of head_dim bf16 values). */
static double cp_gather(const par_config *g, const par_netmodel *net, const par_layout *l, int r, int s, double T)
{
    if (l->cp < 2)
        return 0;
    const par_pplayout *pl = &l->pipe;
    int t = par_pplayout_offset(pl, s, PAR_BLK_LAYER);
    double sum = 0;
    for (int i = pl->seg_off[s]; i < pl->seg_off[s + 1]; i++) {
        int b = pl->items[i] == PAR_BLK_LAYER ? t++ : pl->items[i] == PAR_BLK_MTP ? (int)g->n_layers : -1;
        int64_t m = b >= 0 && b < g->n_compress_ratios ? g->compress_ratios[b] : 0;
        if (m > 0)
            sum += ring(net, l, PAR_GROUP_CP, r, 1, (double)l->cp * T / (double)m * (double)g->head_dim * 2.0);
    }
    return sum;
}

/* ---- the estimate ---------------------------------------------------------------- */

/* DP once per step over dp-cp (dense) and edp (experts) of rank r: ZeRO-1
 * reduce-scatter fp32 gradients + all-gather bf16 parameters; replicated an
 * all-reduce of fp32 gradients.  Floats per rank from par_param_count. */
static double dp_time(const par_config *g, const par_netmodel *net, const par_layout *l, int r)
{
    int64_t nf = 0;
    if (par_param_count(g, NULL, &nf, NULL) != PAR_OK)
        return 0;
    double routed = (double)par_param_count_routed_expert_floats(g), dense = ((double)nf - routed) / (double)l->pp;
    double expert = routed / (double)(l->pp * l->ep * l->etp);
    if (l->distributed_optimizer)
        return ring(net, l, PAR_GROUP_DP_CP, r, 1, 4 * dense) + ring(net, l, PAR_GROUP_DP_CP, r, 1, 2 * dense) +
               ring(net, l, PAR_GROUP_EDP, r, 1, 4 * expert) + ring(net, l, PAR_GROUP_EDP, r, 1, 2 * expert);
    return ring(net, l, PAR_GROUP_DP_CP, r, 2, 4 * dense) + ring(net, l, PAR_GROUP_EDP, r, 2, 4 * expert);
}

/* Per-segment F / B / W costs (seconds) of one microbatch of T tokens. */
static void seg_costs(const par_config *g, const par_netmodel *net, const par_layout *l, double T,
                      const par_steptime_opts *o, double *f, double *b, double *w, double *fl, par_steptime *st)
{
    const double eff = o && o->efficiency > 0 ? o->efficiency : 1.0;
    const double skew = o && o->skew > 0 ? o->skew : PAR_MM_DEFAULT_SKEW, rc = o && o->recompute ? 1 : 0;
    int per = (int)(l->world / l->pp);
    for (int s = 0; s < l->pipe.n_segments; s++) {
        int r = par_layout_segment_rank(l, s) * per, moe = 0, cmp = 0;
        fl[s] = par_steptime_segment_flops(g, l, s, T, &moe, &cmp);
        double sk = skew, hot = 0; /* measured: the hottest rank's extra routed FLOPs */
        if (o && o->n_stage_skew > 0 && l->ep > 1) {
            sk = o->stage_skew[par_layout_segment_rank(l, s)];
            hot = (sk - 1) * moe * 2 * T * (double)g->n_activated_experts * 3 * (double)g->dim * (double)g->moe_inter_dim;
        }
        double comp = (fl[s] + hot) / (net->peak_flops * eff), ep = 0, by[PAR_TIER_COUNT] = {0};
        /* with SP the MoE's tokens are split over the TP group: each rank dispatches its T / TP
         * (without SP every TP rank sends its copy: the run's counts, matrix_plan.c) */
        double sp = l->sequence_parallel && l->tp > 1 ? (double)l->tp : 1;
        if (moe > 0 && l->ep > 1)
            ep = moe * ep_a2a(net, l, r, T * (double)g->n_activated_experts / sp, (double)g->dim, sk, by);
        double cp = cp_gather(g, net, l, r, s, T);
        for (int t = 0; t < PAR_TIER_COUNT; t++) /* every rank of the stage, per microbatch */
            st->ep_bytes_world[t] += (4 + 2 * rc) * moe * by[t] * (double)per;
        /* a stage without blocks (E or L alone) still takes a moment: the dry run wants F, B > 0 */
        const double tiny = 1e-9;
        f[s] = comp + 2 * ep + cp + tiny;
        w[s] = comp;
        b[s] = (2 + rc) * comp + (2 + 2 * rc) * ep + (2 + rc) * cp + 2 * tiny; /* recomputation: F again */
        if (par_layout_segment_rank(l, s) == 0) { /* pipeline rank 0's share, per microbatch */
            st->compute_s += (3 + rc) * comp;
            st->ep_s += (4 + 2 * rc) * ep;
            st->cp_s += (3 + rc) * cp;
            for (int t = 0; t < PAR_TIER_COUNT; t++)
                st->ep_bytes[t] += (4 + 2 * rc) * moe * by[t];
        }
    }
}

static par_status pipeline(const par_layout *l, const double *f, const double *b, const double *w, double lat,
                           par_steptime *st)
{
    par_schedule_params sp;
    par_schedule_params_init(&sp);
    par_status s = par_schedule_kind_parse(l->schedule[0] ? l->schedule : "1f1b", &sp.kind);
    if (s)
        return s;
    sp.pp = (int)l->pp, sp.vpp = (int)l->vpp, sp.n_micro = (int)l->n_micro, sp.mb_group = (int)l->mb_group;
    par_schedule sch;
    if ((s = par_schedule_build(&sp, &sch)))
        return s;
    par_sched_costs c;
    par_sched_costs_init(&c);
    c.f_stage = f, c.b_stage = b, c.w_stage = w, c.latency = lat;
    par_sched_sim sim;
    if (!(s = par_schedule_simulate(&sch, &c, &sim))) {
        st->makespan_s = sim.makespan;
        st->bubble = sim.bubble;
        par_sched_sim_free(&sim);
    }
    par_schedule_free(&sch);
    return s;
}

par_status par_steptime_estimate(const par_config *g, const par_layout *l, const par_netmodel *net,
                                 const par_steptime_opts *o, par_steptime *out)
{
    if (!l->resolved)
        return par_err(PAR_EINVAL, "step time: the layout is not resolved");
    if (o && o->n_stage_skew > 0 && o->n_stage_skew != l->pp)
        return par_err(PAR_EINVAL, "step time: %d measured stage skews for PP = %lld (--measured-loads: a run of the "
                                   "same PP)", o->n_stage_skew, (long long)l->pp);
    int S = l->pipe.n_segments;
    double T = (double)(l->micro_batch > 0 ? l->micro_batch : 1) * (double)g->seq_length / (double)l->cp;
    double *v = par_calloc((size_t)S * 4, sizeof *v, PAR_TAG_MODEL);
    if (!v)
        return par_err(PAR_ENOMEM, "step time: out of memory for %d stages", S);
    par_steptime st;
    memset(&st, 0, sizeof st);
    seg_costs(g, net, l, T, o, v, v + S, v + 2 * S, v + 3 * S, &st);
    double m = (double)l->n_micro;
    for (int s = 0; s < S; s++)
        st.flops += 3 * v[3 * S + s] * m * (double)(l->da * l->cp);
    st.compute_s *= m, st.ep_s *= m, st.cp_s *= m;
    for (int t = 0; t < PAR_TIER_COUNT; t++) {
        st.ep_bytes[t] *= m;
        st.ep_bytes_world[t] *= m;
    }
    par_status s = PAR_OK;
    int per = (int)(l->world / l->pp);
    if (l->pp > 1) {
        size_t msg = (size_t)(T * (double)(g->hc_mult * g->dim) * 2.0);
        st.pp_p2p_s = par_net_p2p(net, 0, per, msg).time;
        s = pipeline(l, v, v + S, v + 2 * S, st.pp_p2p_s, &st);
    } else {
        st.makespan_s = m * (v[0] + v[S]);
    }
    par_free(v);
    if (s)
        return s;
    st.dp_s = dp_time(g, net, l, 0);
    st.step_s = st.makespan_s + st.dp_s;
    *out = st;
    return PAR_OK;
}
