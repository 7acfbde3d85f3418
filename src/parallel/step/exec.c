/* parallel/step/exec.c - the step executor: create, the schedule
 * interpreter, one step, its bubble on the virtual clock (see
 * parallel/step/exec.h, docs/parallel.md "The step executor"). */
#include <stdio.h>
#include <string.h>

#include "comm/clock.h"
#include "core/device.h"
#include "parallel/step/exec-impl.h"
#include "parallel/layout/tp_split.h"

/* ------------------------------------------------------------ schedule -- */

/* The schedule of a layout: PP = 1 is 1F1B of one rank and one microbatch. */
static par_status sched_params(const par_layout *l, par_schedule_params *sp)
{
    par_schedule_params_init(sp);
    const char *kind = l->pp > 1 && l->schedule[0] ? l->schedule : "1f1b";
    par_status s = par_schedule_kind_parse(kind, &sp->kind);
    if (s)
        return s;
    sp->pp = (int)l->pp;
    sp->vpp = l->pp > 1 ? (int)l->vpp : 1;
    sp->n_micro = l->pp > 1 ? (int)l->n_micro : 1;
    sp->mb_group = l->pp > 1 ? (int)l->mb_group : 0;
    return PAR_OK;
}

par_status PAR_FN(par_exec_check)(const par_layout *l)
{
    par_status s0 = par_layout_run_rules(l);
    if (s0)
        return s0;
    if (l->pp <= 1)
        return PAR_OK;
    if (l->n_micro > 1000000)
        return par_err(PAR_EINVAL, "pipeline: %lld microbatches is more than the executor handles (10^6)",
                       (long long)l->n_micro);
    par_schedule_params sp;
    par_status s = sched_params(l, &sp);
    if (s)
        return s;
    par_schedule sch;
    if ((s = par_schedule_build(&sp, &sch)))
        return s;
    if (sch.n_stages != l->pipe.n_segments)
        s = par_err(PAR_EINVAL,
                    "pipeline: schedule '%s' has %d stages but the layout has %d segments (PP %lld x VPP %lld)",
                    par_schedule_kind_name(sp.kind), sch.n_stages, l->pipe.n_segments, (long long)l->pp,
                    (long long)l->vpp);
    par_schedule_free(&sch);
    return s;
}

/* ------------------------------------------------------------- create -- */

/* The schedule, its stages against the layout's segments, the dry run. */
static par_status build_schedule(exec_t *ex, const par_pctx *P)
{
    par_schedule_params sp;
    par_status s = sched_params(ex->lay, &sp);
    if (s || (s = par_schedule_build(&sp, &ex->sch)))
        return s;
    ex->n_stages = ex->sch.n_stages;
    if (ex->n_stages != ex->lay->pipe.n_segments)
        return par_err(PAR_EINVAL, "pipeline: schedule '%s' has %d stages but the layout has %d segments",
                       par_schedule_kind_name(sp.kind), ex->n_stages, ex->lay->pipe.n_segments);
    if (!ex->pc || par_comm_size(ex->pc) != ex->p)
        return par_err(PAR_EINTERNAL, "pipeline: no PP group of %d ranks (rank %d)", ex->p, P->rank);
    par_sched_costs c;
    par_sched_costs_init(&c);
    par_sched_sim sim;
    if ((s = par_schedule_simulate(&ex->sch, &c, &sim)))
        return s;
    ex->dry_bubble = sim.bubble;
    par_sched_sim_free(&sim);
    size_t nc = (size_t)(COST_KINDS * ex->n_stages), na = 3 * (size_t)ex->m * (size_t)ex->n_stages;
    ex->cost = par_calloc(4 * nc + na, sizeof *ex->cost, PAR_TAG_MODEL); /* cost, cost_n, cost_all (2), acost */
    if (!ex->cost)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    ex->cost_n = ex->cost + nc;
    ex->cost_all = ex->cost_n + nc;
    ex->acost = ex->cost_all + 2 * nc;
    return PAR_OK;
}

/* What the step's TP sum covers (par_reduce_tp_grads): every TP layer
 * under TP > 1, as Megatron-LM does (--tp-all-layers is a no-op): the
 * vocab-parallel embedding / head and the TP shared expert
 * (par_tp_shared_expert_split), every attention gradient under SP; TP x ETP
 * without SP: ETP = TP, the group's ranks hold the same tokens (the TP sum
 * leaves the experts alone). */
static unsigned tp_grads_of(const par_layout *l, unsigned faults)
{
    if (l->tp <= 1)
        return 0;
    unsigned g = (faults & PAR_TP_FAULT_WKV_NO_REDUCE) ? PAR_TPG_SKIP_WKV : 0;
    g |= (l->sequence_parallel ? PAR_TPG_ALL : 0) | PAR_TPG_VOCAB;
    if (par_tp_shared_expert_split(l))
        g |= PAR_TPG_SHARED; /* the shard's blocks meet zeros over TP */
    if (l->etp > 1 && !l->sequence_parallel)
        g |= PAR_TPG_KEEP_EXPERTS;
    return g;
}

/* Every TP rank updates the whole dense matrices alike: the norm counts tp
 * = 0's (a shard counts on every TP rank; dpw.c chains it; the routed
 * experts' EDP group spans TP: par_reduce_tp_grads); every ETP rank updates
 * the whole experts alike: the norm counts etp = 0's. */
static void tp_norm_skips(exec_t *ex, const par_pctx *P, const PAR_FN(par_model) *M)
{
    const int tp = ex->lay->tp > 1 && P->rc.tp != 0, etp = ex->lay->etp > 1 && P->rc.etp != 0;
    for (int i = 0; (tp || etp) && i < M->tab.n; i++) {
        const int expert = M->tab.p[i].expert >= 0;
        if (((tp && !expert) || (etp && expert)) && !PAR_FN(par_model_cut_of)(M, i))
            par__exec_skip_set(ex->norm_skip, i, PAR_FN(par_model_holds)(M, i));
    }
}

/* The groups the steps use, the hooks of the layout (exec_hooks.c's
 * table), the DualPipe pair. */
static par_status build_hooks(exec_t *ex, const par_pctx *P, PAR_FN(par_model) *M, const par_exec_opts *o)
{
    const par_layout *l = ex->lay;
    ex->CP = l->cp;
    ex->cpc = l->cp > 1 ? P->g.g[PAR_GROUP_CP] : NULL;
    ex->tpc = l->tp > 1 ? P->g.g[PAR_GROUP_TP] : NULL;
    ex->etpc = l->etp > 1 ? P->g.g[PAR_GROUP_ETP] : NULL;
    ex->tp_faults = l->tp > 1 ? o->tp_faults | PAR_TP_BUILD_FAULTS : 0;
    ex->tp_grads = tp_grads_of(l, ex->tp_faults);
    /* the group whose ranks hold column slices of the same rows: CP's; SP:
     * TP's (SP x CP: the TP ranks split the CP slice's columns) */
    ex->tokc = l->tp > 1 && l->sequence_parallel ? P->g.g[l->cp > 1 ? PAR_GROUP_TP_CP : PAR_GROUP_TP] : ex->cpc;
    tp_norm_skips(ex, P, M);
    par_hook_env e = {.P = P, .n_mb = ex->m, .tp_faults = ex->tp_faults,
                      .moe_dispatch = o->moe_dispatch, .gpus_per_node = o->gpus_per_node,
                      .ca = o->net ? o->ca : NULL};
    par_status s = PAR_FN(par__exec_hooks_create)(ex, &e, M);
    if (s)
        return s;
    if (ex->sch.n_dirs == 2) { /* DualPipe: the pair {r, p-1-r} holds the same two stages */
        int lo = ex->me < ex->p - 1 - ex->me ? ex->me : ex->p - 1 - ex->me;
        if ((s = par_comm_split(ex->pc, lo, ex->me, &ex->pair)))
            return s;
    }
    return PAR_OK;
}

/* --cost-as with a network (parallel/plan/costas.h): the clock charges the
 * target's compute (run_compute, ep.c) instead of the counted work, and the
 * target's bytes on the PP, CP and DP groups and in the EP all-to-alls. */
static par_status cost_setup(exec_t *ex, const par_pctx *P, const par_exec_opts *o)
{
    ex->ca = o->net ? o->ca : NULL;
    if (!ex->ca)
        return PAR_OK;
    par_comm_cost_explicit(ex->pc);
    par_status s = par_comm_cost_scale(ex->pc, ex->ca->pp_scale, 1);
    if (!s)
        s = par_comm_cost_scale(P->g.g[PAR_GROUP_DP_CP], 1, ex->ca->dense_scale);
    if (!s)
        s = par_comm_cost_scale(P->g.g[PAR_GROUP_EDP], 1, ex->ca->expert_scale);
    if (!s && ex->cpc)
        s = par_comm_cost_scale(ex->cpc, ex->ca->cp_scale, ex->ca->cp_scale);
    return s; /* (EP charges its own: the hook's par_hook_env.ca) */
}

/* One PP message on the network (the slowest neighbour hop). */
static void message_latency(exec_t *ex)
{
    ex->latency = 0;
    for (int r = 0; ex->net && r + 1 < ex->p; r++) {
        size_t bytes = (size_t)(ex->Tm * ex->nd) * sizeof(par_real);
        if (ex->ca)
            bytes = (size_t)((double)bytes * ex->ca->pp_scale + 0.5);
        par_netcost k = par_net_p2p(ex->net, par_comm_world_rank(ex->pc, r), par_comm_world_rank(ex->pc, r + 1), bytes);
        ex->latency = k.time > ex->latency ? k.time : ex->latency;
    }
}

par_status PAR_FN(par_exec_create)(PAR_FN(par_exec) **out, const par_pctx *P, PAR_FN(par_model) *M,
                                   const par_config *cfg, const par_exec_opts *o)
{
    *out = NULL;
    const par_layout *l = P->lay;
    exec_t *ex = par_calloc(1, sizeof *ex, PAR_TAG_MODEL);
    if (!ex)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    ex->lay = l;
    ex->cfg = *cfg;
    ex->p = (int)l->pp;
    ex->me = P->rc.pp;
    ex->tp_rank = P->rc.tp;
    ex->etp_rank = P->rc.etp;
    ex->pc = P->g.g[PAR_GROUP_PP];
    ex->net = o->net;
    ex->n_blocks = (int)par_config_n_blocks(cfg);
    ex->L = (int)cfg->n_layers;
    ex->n = cfg->hc_mult;
    ex->d = cfg->dim;
    ex->nd = ex->n * ex->d;
    ex->B = l->global_batch;
    ex->S = cfg->seq_length;
    ex->Bl = ex->B / l->da;
    ex->m = l->pp > 1 ? (int)l->n_micro : 1;             /* PP = 1: one microbatch of all the rows */
    ex->mbs = l->pp > 1 ? (l->micro_batch > 0 ? l->micro_batch : 1) : ex->Bl;
    ex->spn = l->sequence_parallel ? l->tp : 1;
    ex->col = (int64_t)P->rc.cp * ex->spn + (l->sequence_parallel ? P->rc.tp : 0);
    ex->Tm = ex->mbs * (ex->S / ((l->cp > 0 ? l->cp : 1) * ex->spn));
    int64_t El = cfg->n_routed_experts / l->ep, e0 = (int64_t)P->rc.ep * El;
    par_status s;
    if (ex->S % ((l->cp > 0 ? l->cp : 1) * ex->spn) != 0) {
        s = par_err(PAR_EINVAL, "sequence parallelism: seq_length %lld is not %lld column slices (CP %lld x TP %lld)",
                    (long long)ex->S, (long long)((l->cp > 0 ? l->cp : 1) * ex->spn), (long long)l->cp,
                    (long long)ex->spn);
        goto fail_exec;
    }
    if (ex->Bl != ex->mbs * ex->m) {
        s = par_err(PAR_EINVAL, "pipeline: %lld rows per data-parallel rank are not %d microbatches of %lld",
                    (long long)ex->Bl, ex->m, (long long)ex->mbs);
        goto fail_exec;
    }
    if ((s = build_schedule(ex, P)) || (s = PAR_FN(par__exec_hold)(ex, M, o->seed, e0, e0 + El, o)))
        goto fail_exec;
    if ((s = build_hooks(ex, P, M, o)) || (s = cost_setup(ex, P, o)))
        goto fail_model;
    message_latency(ex);
    *out = ex;
    return PAR_OK;
fail_model:
    PAR_FN(par_model_free)(M);
fail_exec:
    PAR_FN(par_exec_free)(ex);
    return s;
}

/* ------------------------------------------------------------ messages -- */

/* Frees the sends that are due (par_test_due: complete, and by the rank's
 * virtual clock now), keeping the others in order for wait_sends: a rank
 * holds the sends still in flight, not every send of the step (issue 18).
 * The clock stays as wait_sends would leave it (a due send would not move
 * it there). */
static par_status reap_sends(exec_t *ex)
{
    par_status s = PAR_OK;
    int k = 0;
    for (int i = 0; i < ex->n_sends; i++) {
        sendrec r = ex->sends[i];
        int done = 0;
        par_status t = s ? PAR_OK : par_test_due(&r.req, &done);
        if (t) { /* the request is released: its buffer goes, the error stays */
            s = t;
            done = 1;
        }
        if (done)
            par_free(r.buf);
        else
            ex->sends[k++] = r;
    }
    ex->n_sends = k;
    return s;
}

static par_status post_send(exec_t *ex, const par_action *a, int grad)
{
    int o = a->mb * ex->n_stages + a->stage;
    par_real **box = grad ? &ex->out_grad[o] : &ex->out_act[o];
    if (!*box)
        return par_err(PAR_EINTERNAL, "pipeline: rank %d sends the %s of microbatch %d stage %d before computing it",
                       ex->me, grad ? "gradient" : "activation", a->mb, a->stage);
    if (ex->n_sends == ex->cap_sends) {
        int nc = ex->cap_sends ? 2 * ex->cap_sends : 64;
        sendrec *ns = par_realloc(ex->sends, (size_t)nc * sizeof *ns, PAR_TAG_COMM);
        if (!ns)
            return par_err(PAR_ENOMEM, "pipeline: out of memory for sends");
        ex->sends = ns;
        ex->cap_sends = nc;
    }
    sendrec *r = &ex->sends[ex->n_sends++];
    r->buf = *box;
    r->req = NULL;
    *box = NULL;
    par_status s = par_isend(ex->pc, r->buf, (size_t)(ex->Tm * ex->nd), PAR_C_REAL, a->peer, a->tag, &r->req);
    return s ? s : reap_sends(ex);
}

static par_status recv_into(exec_t *ex, const par_action *a, int grad)
{
    mbstage *sl;
    par_status s = PAR_FN(par__exec_mbstage)(ex, a->mb, a->stage, &sl, NULL);
    if (s)
        return s;
    size_t n = (size_t)(ex->Tm * ex->nd);
    par_real *buf = par_arena_alloc(&sl->ar, (n ? n : 1) * sizeof *buf, 64);
    if (!buf)
        return par_err(PAR_ENOMEM, "pipeline: out of memory for a receive");
    if ((s = par_recv(ex->pc, buf, n, PAR_C_REAL, a->peer, a->tag)))
        return s;
    if (grad)
        sl->gout = buf;
    else
        sl->xin = buf;
    return reap_sends(ex); /* the peer moved on: sends to it may be done */
}

static par_status wait_sends(exec_t *ex)
{
    par_status s = PAR_OK;
    for (int i = 0; i < ex->n_sends; i++) {
        par_status w = par_wait(&ex->sends[i].req);
        if (w && !s)
            s = w;
        par_free(ex->sends[i].buf);
    }
    ex->n_sends = 0;
    return s;
}

/* --------------------------------------------------------- interpreter -- */

/* Saved activations of the live (mb, stage) states (the peak is the accounting's). */
static void note_activations(exec_t *ex)
{
    int64_t live = 0;
    for (size_t i = 0; ex->mbst.st && i < (size_t)ex->mbst.n_mb * (size_t)ex->mbst.n_held; i++)
        if (ex->mbst.st[i])
            live += (int64_t)((const mbstage *)ex->mbst.st[i])->ar.used;
    if (live > ex->act_peak)
        ex->act_peak = live;
}

/* One compute action, its virtual time into ex->cost by kind and stage. */
static par_status run_compute(exec_t *ex, PAR_FN(par_model) *M, const par_action *a)
{
    double t0 = par_comm_vclock(ex->pc);
    if (ex->ca) /* the target's stage without its routed experts (ep.c charges those) */
        par_comm_charge(ex->pc, ex->ca->f_dense[a->stage] * (a->kind == PAR_ACT_BW ? 2 : 1));
    par_status s = a->kind == PAR_ACT_F ? PAR_FN(par__exec_forward)(ex, M, a->mb, a->stage)
                                        : PAR_FN(par__exec_backward)(ex, M, a->mb, a->stage, a->kind);
    int k = a->kind == PAR_ACT_F ? COST_F : a->kind == PAR_ACT_W ? COST_W : COST_B;
    double dt = par_comm_vclock(ex->pc) - t0;
    ex->cost[k * ex->n_stages + a->stage] += dt;
    ex->cost_n[k * ex->n_stages + a->stage] += 1;
    ex->acost[((size_t)k * (size_t)ex->m + (size_t)a->mb) * (size_t)ex->n_stages + (size_t)a->stage] = dt;
    note_activations(ex);
    return s;
}

static par_status run_action(exec_t *ex, PAR_FN(par_model) *M, const par_action *a)
{
    switch (a->kind) {
    case PAR_ACT_F:
    case PAR_ACT_B:
    case PAR_ACT_W:
    case PAR_ACT_BW:
        return run_compute(ex, M, a);
    case PAR_ACT_SEND_ACT:
    case PAR_ACT_SEND_GRAD:
        return post_send(ex, a, a->kind == PAR_ACT_SEND_GRAD);
    case PAR_ACT_RECV_ACT:
    case PAR_ACT_RECV_GRAD:
        return recv_into(ex, a, a->kind == PAR_ACT_RECV_GRAD);
    }
    return par_err(PAR_EINTERNAL, "pipeline: unknown action kind %d", a->kind);
}

/* This rank's action list, in order: the one interpreter of every schedule. */
static par_status run_actions(exec_t *ex, PAR_FN(par_model) *M)
{
    int n = ex->sch.n_actions[ex->me];
    const par_action *acts = ex->sch.actions[ex->me];
    for (int i = 0; i < n; i++) {
        par_status s = run_action(ex, M, &acts[i]);
        if (s) {
            char buf[128], msg[512];
            par_action_str(&acts[i], buf, sizeof buf);
            snprintf(msg, sizeof msg, "%s", par_last_error());
            return par_err(s, "%s (pipeline rank %d, action %d: %s)", msg, ex->me, i, buf);
        }
    }
    return PAR_OK;
}

/* ----------------------------------------------------------- the bubble -- */

/* With an emulated network: the pipeline phase's makespan and busy time
 * over the PP group (its clocks started together), and the dry run of the
 * same schedule with the same per-action costs (every action's virtual
 * time, summed over the group: each ran on one rank) and the message time:
 * its makespan and busy time. */
static par_status note_bubble(exec_t *ex, double t1)
{
    const size_t nc = (size_t)(COST_KINDS * ex->n_stages), na = 3 * (size_t)ex->m * (size_t)ex->n_stages;
    double *ends = par_malloc((size_t)ex->p * sizeof *ends, PAR_TAG_COMM), busy = 0;
    if (!ends)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    for (size_t i = 0; i < nc; i++)
        busy += ex->cost[i];
    par_field f[4] = {PAR_FIELD(&busy, 1, PAR_C_F64), PAR_FIELD(ex->cost, nc, PAR_C_F64),
                      PAR_FIELD(ex->cost_n, nc, PAR_C_F64), PAR_FIELD(ex->acost, na, PAR_C_F64)};
    par_status s = par_allgather(ex->pc, &t1, ends, 1, PAR_C_F64);
    if (!s)
        s = par_reduce_fields(ex->pc, f, 4, NULL);
    double hi = ex->t_start;
    for (int r = 0; !s && r < ex->p; r++)
        hi = ends[r] > hi ? ends[r] : hi;
    par_free(ends);
    if (s)
        return s;
    ex->net_steps++;
    ex->net_makespan += hi - ex->t_start;
    ex->net_busy += busy;
    for (size_t i = 0; i < nc; i++) {
        ex->cost_all[i] += ex->cost[i];
        ex->cost_all[nc + i] += ex->cost_n[i];
    }
    par_sched_costs sc;
    par_sched_costs_init(&sc);
    sc.action = ex->acost;
    sc.latency = ex->latency;
    par_sched_sim sim;
    if ((s = par_schedule_simulate(&ex->sch, &sc, &sim)))
        return s;
    for (int r = 0; r < ex->p; r++)
        ex->dry_busy += sim.busy[r];
    ex->dry_makespan += sim.makespan;
    par_sched_sim_free(&sim);
    return PAR_OK;
}

/* The pipeline phase of one step; with a network, its clocks start
 * together (a barrier of the PP group) and its bubble is measured. */
static par_status pipeline_phase(exec_t *ex, PAR_FN(par_model) *M)
{
    int timed = ex->net && ex->p > 1;
    memset(ex->cost, 0, (size_t)(2 * COST_KINDS * ex->n_stages) * sizeof *ex->cost);
    memset(ex->acost, 0, 3 * (size_t)ex->m * (size_t)ex->n_stages * sizeof *ex->acost);
    par_status s = timed ? par_barrier(ex->pc) : PAR_OK;
    ex->t_start = timed ? par_comm_vclock(ex->pc) : 0; /* the same on every rank after the barrier */
    if (!s)
        s = run_actions(ex, M);
    par_status w = wait_sends(ex);
    if (!s)
        s = w;
    PAR_FN(par__exec_release_all)(ex);
    if (!s && timed)
        s = note_bubble(ex, par_comm_vclock(ex->pc));
    return s;
}

/* -------------------------------------------------------------- a step -- */

par_status PAR_FN(par_exec_step)(PAR_FN(par_exec) *ex, const par_pctx *P, PAR_FN(par_model) *M, const int32_t *tokens,
                                 const int32_t *segments, int keep)
{
    par_status s;
    PAR_FN(par__exec_setup_free)(ex);
    ex->keep = keep;
    PAR_FN(par__exec_hooks_step)(ex, M, keep); /* the vocabulary hook: [T, V] logits only for a dump */
    if ((s = PAR_FN(par__exec_setup)(ex, P, M, tokens, segments)) ||
        (keep && (s = PAR_FN(par__exec_keep_alloc)(ex, M))))
        return s;
    PAR_FN(par_model_grads_zero)(M); /* grads (and the bitwise mode's accumulator) */
    M->have_fwd = 0; /* the step's gradients are finished by parallel/step/finalize.h */
    return pipeline_phase(ex, M);
}

/* ---------------------------------------------------------------- info -- */

/* The mean virtual time of each kind of compute action over the steps. */
static void mean_costs(const exec_t *ex, double *mean)
{
    const int S = ex->n_stages, nc = COST_KINDS * S;
    for (int k = 0; k < COST_KINDS; k++) {
        double tot = 0, n = 0;
        for (int st = 0; st < S; st++) {
            tot += ex->cost_all[k * S + st];
            n += ex->cost_all[nc + k * S + st];
        }
        mean[k] = n > 0 ? tot / n : 0;
    }
}

void PAR_FN(par_exec_info_get)(const PAR_FN(par_exec) *ex, par_exec_info *out)
{
    memset(out, 0, sizeof *out);
    out->dry_bubble_measured = -1;
    if (!ex)
        return;
    out->schedule = par_schedule_kind_name(ex->sch.params.kind);
    out->n_micro = ex->m;
    out->n_stages = ex->n_stages;
    out->n_chunks = ex->sch.n_chunks;
    out->dry_bubble = ex->dry_bubble;
    out->net_steps = ex->net_steps;
    out->net_makespan_s = ex->net_makespan;
    out->net_busy_s = ex->net_busy;
    out->net_bubble = ex->net_makespan > 0 ? 1.0 - ex->net_busy / ((double)ex->p * ex->net_makespan) : 0.0;
    out->act_peak = ex->act_peak;
    out->latency_s = ex->latency;
    if (ex->net_steps > 0) {
        double mean[COST_KINDS];
        mean_costs(ex, mean);
        out->dry_bubble_measured =
            ex->dry_makespan > 0 ? 1.0 - ex->dry_busy / ((double)ex->p * ex->dry_makespan) : 0.0;
        out->cost_f_s = mean[COST_F];
        out->cost_b_s = mean[COST_B];
        out->cost_w_s = mean[COST_W];
    }
}

void PAR_FN(par_exec_counters)(const PAR_FN(par_exec) *ex, par_ep_counters *ep, par_cp_traffic *cp)
{
    memset(ep, 0, sizeof *ep);
    memset(cp, 0, sizeof *cp);
    PAR_FN(par__exec_hooks_report)(ex, &(par_hook_report){.ep = ep, .cp = cp});
}

void PAR_FN(par_exec_shared_stats)(const PAR_FN(par_exec) *ex, par_tp_shared_stats *out)
{
    memset(out, 0, sizeof *out);
    PAR_FN(par__exec_hooks_report)(ex, &(par_hook_report){.shared = out});
}

void PAR_FN(par_exec_free)(PAR_FN(par_exec) *ex)
{
    if (!ex)
        return;
    PAR_FN(par__exec_release_all)(ex);
    (void)wait_sends(ex);
    par_free(ex->sends);
    PAR_FN(par__exec_setup_free)(ex);
    PAR_FN(par__exec_keep_free)(ex);
    for (int i = 0; ex->out_act && i < ex->m * ex->n_stages; i++) {
        par_free(ex->out_act[i]);
        par_free(ex->out_grad[i]);
    }
    par_free(ex->out_act);
    par_free(ex->out_grad);
    par_mbstate_free(&ex->mbst);
    PAR_FN(par__exec_hold_free)(ex);
    if (ex->pair)
        par_comm_free(ex->pair);
    PAR_FN(par__exec_hooks_free)(ex);
    par_free(ex->mq0);
    par_free(ex->pos_rows);
    par_free(ex->cost);
    if (ex->sch.n_actions)
        par_schedule_free(&ex->sch);
    par_free(ex);
}
