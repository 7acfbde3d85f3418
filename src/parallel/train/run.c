/* parallel/train/run.c - the parallel training driver: the data, the world,
 * each rank's loop of steps (the step executor, the optimizer step, dumps,
 * checkpoints) and the run's summary (see parallel/train/run.h,
 * docs/parallel.md). */
#include "parallel/train/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/device.h"
#include "core/fileio.h"
#include "core/log.h"
#include "model/golden.h"
#include "model/model.h"
#include "parallel/ckpt/ckpt_model.h"
#include "parallel/dp/dpw.h"
#include "parallel/step/exec.h"
#include "parallel/step/finalize.h"
#include "parallel/layout/groups.h"
#include "parallel/tp/tp.h"
#include "parallel/layout/tp_split.h"

/* OpenBLAS (cblas.h is not included: with <complex.h> it defines I, a
 * dimension name in the kernels' headers). */
void openblas_set_num_threads(int num_threads);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What every rank reads (and rank 0 writes results into). */
typedef struct {
    const par_run_opts *o;
    par_config cfg;
    par_layout lay;
    int64_t B, S, Bl;
    int32_t *tok, *seg;       /* [steps, B, S] the global batches */
    char *tmp;                /* the dump's temporary directory, or NULL */
    int hosts_rank0;          /* this process ran world rank 0 (it alone commits the dump) */
    par_run_step_info *info;  /* [steps] */
    int64_t *load_acc;        /* [n_blocks, E] global loads summed over steps */
    int64_t *rank_ctr;        /* [N, 6] ep counters + local floats of each rank */
    int64_t *cp_ctr;          /* [N, 4] cp attention bytes of each rank (par_cp_traffic) */
    int64_t sh_ctr[2];        /* the shared expert's units and TP bytes, summed over ranks */
    int64_t *ep_tier;         /* [N, 4] ep bytes: dispatch nvlink, ib, combine nvlink, ib */
    double *ep_time;          /* [N, 2] ep emulated dispatch, combine seconds */
    int64_t *mem;             /* [N, PAR_RUN_MEM] per-rank memory accounting (dpw.h) */
    int64_t *apeak;           /* [N, 2 * PAR_TAG_COUNT] per-rank allocator peaks (allocated, reserved) */
    par_exec_info exi;        /* world rank 0's pipeline (exec.h) */
    int64_t step0;            /* updates already applied (the loaded checkpoint's step) */
    int64_t n;                /* steps this run does: step0 .. o->steps-1 (--steps is the total) */
    uint64_t seed;            /* the data's seed (the checkpoint's with --load) */
    int64_t *cursor;          /* [steps] data cursor after each step's batch */
    int64_t saves;            /* checkpoints written (rank 0) */
    int64_t n_float;
    par_param_table tab;      /* the parameter table every rank's model borrows (built once) */
    par_costas ca;            /* --cost-as (parallel/plan/costas.h; has_ca 0: off) */
    int has_ca;
    PAR_FN(par_replicas) *reps; /* the dense state the process's ranks hold once (NULL: each its own) */
} shared;

/* One rank's state. */
typedef struct {
    par_pctx P;
    PAR_FN(par_model) M;
    PAR_FN(par_exec) *ex;     /* the step executor (it builds M and owns the EP / CP hooks) */
    PAR_FN(par_dpw) dpw;      /* the optimizer step (dpw.h) */
    par_real *params, *m, *v, *grads; /* [n_float] dump buffers on rank 0 */
    PAR_FN(par_replica_ticket) rt; /* this rank's share of the process's dense copy (replicas.h) */
    int ascope;               /* this rank's allocator scope (core/alloc.h): its memory truth */
} rank_state;

/* ---------------------------------------------------------------- dumps -- */

/* The optimizer state into rank 0's m, v: each rank's local part in two
 * buffers of its n_local floats for the time of the gather only (they used
 * to live for the run: config-c's 8,192 ranks held 2.5 GB of them through
 * every step's pipeline). */
static par_status dump_state(rank_state *S)
{
    PAR_FN(par_model) *M = &S->M;
    size_t nl = (size_t)(M->n_local > 0 ? M->n_local : 1);
    par_real *lm = par_calloc(nl, sizeof *lm, PAR_TAG_IO), *lv = par_calloc(nl, sizeof *lv, PAR_TAG_IO);
    par_status s = !lm || !lv ? par_err(PAR_ENOMEM, "dump: out of memory for %zu-float state buffers", nl) : PAR_OK;
    if (!s && !(s = PAR_FN(par_dpw_state_gather)(&S->dpw, M, lm, lv)) &&
        !(s = PAR_FN(par_exec_gather_full)(S->ex, &S->P, M, lm, S->m)))
        s = PAR_FN(par_exec_gather_full)(S->ex, &S->P, M, lv, S->v);
    par_free(lm);
    par_free(lv);
    return s;
}

static par_status dump_params(const shared *R, rank_state *S, int64_t k)
{
    par_status s;
    const par_pctx *P = &S->P;
    PAR_FN(par_model) *M = &S->M;
    if ((s = PAR_FN(par_exec_gather_full)(S->ex, P, M, M->params, S->params)))
        return s;
    if (k > 0 && (s = dump_state(S)))
        return s;
    if (P->rank != 0)
        return PAR_OK;
    return PAR_FN(par_golden_write_params_buf)(&M->tab, S->params, k > 0 ? S->m : NULL, S->v, M->i32, R->tmp, k);
}

static par_status dump_alloc(const shared *R, rank_state *S)
{
    size_t nf = (size_t)R->n_float;
    if (S->P.rank != 0)
        return PAR_OK;
    S->params = par_malloc(nf * sizeof(par_real), PAR_TAG_IO);
    S->m = par_calloc(nf, sizeof(par_real), PAR_TAG_IO);
    S->v = par_calloc(nf, sizeof(par_real), PAR_TAG_IO);
    S->grads = par_calloc(nf, sizeof(par_real), PAR_TAG_IO);
    if (!S->params || !S->m || !S->v || !S->grads)
        return par_err(PAR_ENOMEM, "dump: out of memory for %zu-float buffers", nf);
    return PAR_OK;
}

/* ------------------------------------------------------------------ rank -- */

static void rank_free(rank_state *S)
{
    par_free(S->params);
    par_free(S->m);
    par_free(S->v);
    par_free(S->grads);
    PAR_FN(par_dpw_free)(&S->dpw);
    PAR_FN(par_exec_free)(S->ex);
    PAR_FN(par_model_free)(&S->M);
    par_groups_free(&S->P.g);
}

/* Groups, the executor (and with it the model), the optimizer, a loaded
 * checkpoint, the dump buffers and step 0's parameters. */
static par_status rank_setup(shared *R, par_comm *world, rank_state *S)
{
    const par_run_opts *o = R->o;
    par_pctx *P = &S->P;
    P->lay = &R->lay;
    P->world = world;
    P->rank = par_comm_rank(world);
    P->N = par_comm_size(world);
    if (P->rank == 0)
        R->hosts_rank0 = 1; /* under MPI only one process does */
    par_status s;
    if ((s = par_rank_coords_of(P->lay, P->rank, &P->rc)) || (s = par_groups_build(world, P->lay, &P->g)))
        return s;
    par_exec_opts eo = {.seed = o->seed, .moe_dispatch = o->moe_dispatch, .net = o->netmodel,
                        .gpus_per_node = o->netmodel ? o->netmodel->gpus_per_node : 8,
                        .ca = R->has_ca ? &R->ca : NULL, .tp_faults = o->tp_faults,
                        .tab = &R->tab};
    if (R->reps) { /* the dense replicas of this process share one copy (replicas.h) */
        par_comm *g = P->g.g[PAR_GROUP_DP_CP];
        S->rt.reg = R->reps;
        S->rt.group = par_comm_world_rank(g, 0);
        S->rt.grank = par_comm_rank(g);
        S->rt.tp = P->rc.tp;
        eo.share = PAR_FN(par_replica_share_hook);
        eo.share_ctx = &S->rt;
    }
    if ((s = PAR_FN(par_exec_create)(&S->ex, P, &S->M, &R->cfg, &eo)))
        return s;
    /* the optimizer: dense and expert plans, replicated or ZeRO-1 (dpw.h) */
    if ((s = PAR_FN(par_dpw_init_shared)(&S->dpw, P, &S->M, R->reps ? &S->rt : NULL)))
        return s;
    if ((o->tp_faults | PAR_TP_BUILD_FAULTS) & PAR_TP_FAULT_MUON_SHARD)
        PAR_FN(par_dpw_set_tp_muon_shard_fault)(&S->dpw, (int)R->lay.tp);
    if (o->load && (s = PAR_FN(par_ckpt_model_load)(P, &S->M, &S->dpw, o->load)))
        return s;
    if (R->tmp && ((s = dump_alloc(R, S)) || (s = dump_params(R, S, R->step0)))) /* global step numbers */
        return s;
    return PAR_OK;
}

/* Step k's line of the run's table (rank 0; k counts from this run's
 * first step, the line names the global step). */
static void step_info(shared *R, const rank_state *S, int64_t k, double wall_s)
{
    const PAR_FN(par_model) *M = &S->M;
    par_run_step_info *si = &R->info[k];
    si->loss = M->last.loss;
    si->loss_main = M->last.loss_main;
    si->loss_mtp = M->last.loss_mtp;
    si->loss_aux = M->last.loss_aux;
    si->grad_norm = M->last.grad_norm;
    si->wall_s = wall_s;
    for (int64_t i = 0; i < (int64_t)M->n_blocks * M->E; i++)
        R->load_acc[i] += M->stats.loads[i];
    if (R->o->progress)
        fprintf(stderr, "run: step %lld/%lld  loss %.10g  (main %.10g  mtp %.10g  aux %.6g)  grad_norm %.6g  %.3f s\n",
                (long long)(R->step0 + k + 1), (long long)R->o->steps, si->loss, si->loss_main, si->loss_mtp, si->loss_aux,
                si->grad_norm, si->wall_s);
}

/* Step k of this run (global step step0 + k): the executor's forward and
 * backward, the step's gradients finished (parallel/step/finalize.h:
 * statistics, TP / ETP / shared sums, DP reduction, global norm, clip), the
 * update and balance, a dump (it wants the reduced gradients back), a
 * checkpoint. */
static par_status rank_step(shared *R, rank_state *S, int64_t k)
{
    const par_run_opts *o = R->o;
    const size_t BS = (size_t)(R->B * R->S);
    const int32_t *tk = R->tok + (size_t)k * BS, *sg = R->seg + (size_t)k * BS;
    double t0 = now_s();
    par_status s;
    par_finalize_norm fin;
    if ((s = PAR_FN(par_exec_step)(S->ex, &S->P, &S->M, tk, sg, R->tmp != NULL)) ||
        (s = PAR_FN(par_finalize_grads)(S->ex, &S->dpw, &S->P, &S->M, &fin)) ||
        (s = PAR_FN(par_dpw_update)(&S->dpw, &S->P, &S->M, fin.clip)) ||
        (R->tmp && (s = PAR_FN(par_dpw_reduced_grads)(&S->dpw, &S->M))))
        return s;
    double t1 = now_s();
    int64_t gstep = R->step0 + k + 1; /* the updates applied after this step */
    if (R->tmp && (s = PAR_FN(par_exec_dump_step)(S->ex, &S->P, &S->M, tk, sg, S->grads, R->tmp, gstep - 1)))
        return s;
    if (S->P.rank == 0)
        step_info(R, S, k, t1 - t0);
    if (R->tmp && (s = dump_params(R, S, gstep)))
        return s;
    if (o->save_dir && ((o->save_interval > 0 && gstep % o->save_interval == 0) || k == R->n - 1)) {
        par_ckpt_state cs = {.step = gstep, .cursor = R->cursor[k], .seed = R->seed};
        snprintf(cs.precision, sizeof cs.precision, "%s", PAR_REAL_BITS == 64 ? "f64" : "f32");
        if ((s = PAR_FN(par_ckpt_model_save)(&S->P, &S->M, &S->dpw, o->save_dir, &cs)))
            return s;
        if (S->P.rank == 0)
            R->saves++;
    }
    return PAR_OK;
}

/* One rank's report record: the counters, memory and allocator peaks of
 * rank_report, as 64-bit words (the two timings are doubles). */
#define REPORT_WORDS (6 + 4 + 2 + 4 + PAR_RUN_MEM + 2 * PAR_TAG_COUNT + 2)
#define REPORT_TAG 7401

/* Rank 0 unpacks world rank r's record into the shared tables. */
static void report_put(shared *R, int r, const int64_t *w)
{
    memcpy(R->rank_ctr + (size_t)r * 6, w, 6 * sizeof *w);
    memcpy(R->ep_tier + (size_t)r * 4, w + 6, 4 * sizeof *w);
    memcpy(R->ep_time + (size_t)r * 2, w + 10, 2 * sizeof *w);
    memcpy(R->cp_ctr + (size_t)r * 4, w + 12, 4 * sizeof *w);
    memcpy(R->mem + (size_t)r * PAR_RUN_MEM, w + 16, PAR_RUN_MEM * sizeof *w);
    memcpy(R->apeak + (size_t)r * 2 * PAR_TAG_COUNT, w + 16 + PAR_RUN_MEM, 2 * PAR_TAG_COUNT * sizeof *w);
    R->sh_ctr[0] += w[REPORT_WORDS - 2];
    R->sh_ctr[1] += w[REPORT_WORDS - 1];
}

/* Every rank's record to rank 0, point to point: rank 0 receives them in
 * rank order into its tables.  Not an all-gather: that held N records on
 * every rank at once (O(N^2) bytes at the end of a run: 10.7 GB at 8,192
 * ranks). */
static par_status records_to_rank0(shared *R, par_comm *world, const int64_t *mine)
{
    int N = par_comm_size(world), me = par_comm_rank(world);
    if (me != 0)
        return par_send(world, mine, REPORT_WORDS, PAR_C_I64, 0, REPORT_TAG);
    report_put(R, 0, mine);
    int64_t w[REPORT_WORDS];
    par_status s = PAR_OK;
    for (int r = 1; r < N && !s; r++)
        if (!(s = par_recv(world, w, REPORT_WORDS, PAR_C_I64, r, REPORT_TAG)))
            report_put(R, r, w);
    return s;
}

/* Per-rank counters and memory to rank 0's tables. */
static par_status rank_report(shared *R, rank_state *S)
{
    par_exec_info xi;
    PAR_FN(par_exec_info_get)(S->ex, &xi);
    if (S->P.rank == 0)
        R->exi = xi;
    par_ep_counters ec;
    par_cp_traffic ct;
    PAR_FN(par_exec_counters)(S->ex, &ec, &ct);
    par_dpw_memory mm;
    PAR_FN(par_dpw_memory_of)(&S->dpw, &S->M, &mm);
    mm.act = xi.act_peak;
    int64_t w[REPORT_WORDS] = {ec.rows_sent, ec.rows_recv, ec.dispatch_bytes, ec.combine_bytes, ec.calls,
                               S->M.n_local, ec.dispatch_nvlink, ec.dispatch_ib, ec.combine_nvlink, ec.combine_ib};
    double eps[2] = {ec.dispatch_s, ec.combine_s};
    memcpy(w + 10, eps, sizeof eps);
    int64_t tail[4 + PAR_RUN_MEM] = {ct.halo_fwd, ct.gather_fwd, ct.rs_bwd, ct.halo_bwd, mm.weights, mm.grads,
                                     mm.optim, mm.optim_full, mm.act, mm.comm};
    memcpy(w + 12, tail, sizeof tail);
    par_alloc_stats ast;
    par_alloc_scope_stats(S->ascope, &ast);
    memcpy(w + 16 + PAR_RUN_MEM, ast.peak, sizeof ast.peak);
    memcpy(w + 16 + PAR_RUN_MEM + PAR_TAG_COUNT, ast.res_peak, sizeof ast.res_peak);
    par_tp_shared_stats sh;
    PAR_FN(par_exec_shared_stats)(S->ex, &sh);
    w[REPORT_WORDS - 2] = sh.units;
    w[REPORT_WORDS - 1] = sh.bytes;
    return records_to_rank0(R, S->P.world, w);
}

static par_status rank_main(par_comm *world, void *arg)
{
    shared *R = arg;
    rank_state S;
    memset(&S, 0, sizeof S);
    S.ascope = par_alloc_scope_open(); /* this rank's allocator truth (alloc.h) */
    par_dev_mode_set(PAR_DEV_MODE_HOST); /* GPU mode: the parallel layer's host code (docs/gpu.md) */
    par_status s = rank_setup(R, world, &S);
    par_alloc_scope_reset_peaks(S.ascope); /* the window: the steps */
    for (int64_t k = 0; k < R->n && !s; k++)
        s = rank_step(R, &S, k);
    if (!s)
        s = rank_report(R, &S);
    rank_free(&S);
    par_dev_mode_set(PAR_DEV_MODE_DEVICE); /* the scope's next owner starts as any code does */
    par_alloc_scope_close(S.ascope);
    return s;
}

/* ------------------------------------------------------------------- run -- */

/* Tokens per expert over every block and step: range, mean, the hottest
 * (block, expert), the histogram by load / mean. */
static void summarize_loads(const shared *R, par_run_summary *sum, int n_blocks)
{
    int64_t E = R->cfg.n_routed_experts, n = (int64_t)n_blocks * E, tot = 0;
    sum->load_min = INT64_MAX;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = R->load_acc[i];
        tot += v;
        if (v < sum->load_min)
            sum->load_min = v;
        if (v > sum->load_max || i == 0) {
            sum->load_max = v;
            sum->load_hot_block = (int)(i / E);
            sum->load_hot_expert = i % E;
            sum->load_hot_tokens = v;
        }
    }
    sum->load_mean = n > 0 ? (double)tot / (double)n : 0;
    static const double edges[PAR_RUN_HIST - 1] = {0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0};
    for (int64_t i = 0; i < n; i++) {
        double rr = sum->load_mean > 0 ? (double)R->load_acc[i] / sum->load_mean : 0;
        int h = 0;
        while (h < PAR_RUN_HIST - 1 && rr >= edges[h])
            h++;
        sum->hist[h]++;
    }
}

/* The ranks' EP and CP counters. */
static void summarize_comm(const shared *R, par_run_summary *sum, int N)
{
    sum->recv_min = INT64_MAX;
    int64_t rt = 0;
    for (int r = 0; r < N; r++) {
        const int64_t *c = R->rank_ctr + 6 * r, *p = R->cp_ctr + 4 * r;
        rt += c[1];
        sum->recv_min = c[1] < sum->recv_min ? c[1] : sum->recv_min;
        sum->recv_max = c[1] > sum->recv_max ? c[1] : sum->recv_max;
        sum->dispatch_bytes += c[2];
        sum->combine_bytes += c[3];
        sum->max_rank_floats = c[5] > sum->max_rank_floats ? c[5] : sum->max_rank_floats;
        sum->cp_halo_bytes += p[0] + p[3];
        sum->cp_gather_bytes += p[1];
        sum->cp_rs_bytes += p[2];
        for (int k = 0; k < 4; k++)
            sum->ep_bytes[k / 2][k % 2] += R->ep_tier[4 * r + k];
        for (int k = 0; k < 2; k++) {
            double v = R->ep_time[2 * r + k];
            sum->ep_time_mean[k] += N > 0 ? v / N : 0;
            sum->ep_time_max[k] = v > sum->ep_time_max[k] ? v : sum->ep_time_max[k];
        }
    }
    sum->a2a_calls = R->rank_ctr[4];
    sum->shared_units = R->sh_ctr[0];
    sum->shared_tp_bytes = R->sh_ctr[1];
    sum->recv_mean = N > 0 ? (double)rt / N : 0;
    sum->moe_dispatch = R->o->moe_dispatch;
    sum->ep_gpn = R->o->netmodel ? R->o->netmodel->gpus_per_node : 8;
    sum->ep_recv = par_malloc((size_t)(N > 0 ? N : 1) * sizeof *sum->ep_recv, PAR_TAG_MISC);
    for (int r = 0; sum->ep_recv && r < N; r++)
        sum->ep_recv[r] = R->rank_ctr[6 * r + 1];
}

/* The data (it may fix seq_length): the golden set's source, resumed at
 * the checkpoint's step, cursor and seed; the steps to run (--steps K is
 * the total, as Megatron's --train-iters: a run loaded at step s does
 * s..K-1). */
static par_status open_data(shared *R, par_golden_opts *go, par_golden_data *ds)
{
    const par_run_opts *o = R->o;
    par_golden_opts_init(go);
    go->cfg = R->cfg;
    go->steps = o->steps;
    go->seed = o->seed;
    R->seed = o->seed;
    if (o->load) {
        const par_ckpt_state *cs = par_ckpt_state_of(o->load);
        R->step0 = cs->step;
        R->seed = go->seed = cs->seed;
    }
    R->n = o->steps - R->step0; /* < 1: nothing to do (par_run) */
    go->data_path = o->data_path;
    go->fixture = o->fixture;
    go->fixtures_dir = o->fixtures_dir;
    if (o->layout.global_batch > 0)
        R->cfg.global_batch_size = o->layout.global_batch;
    par_status s = PAR_FN(par_golden_data_open)(ds, go, &R->cfg);
    if (!s && o->load)
        ds->cursor = ds->cursor0 = par_ckpt_state_of(o->load)->cursor;
    return s;
}

/* The layout against the model and the data; the schedule's own rules. */
/* The bitwise mode covers every dimension (docs/bitwise.md); nothing to
 * refuse here any more (--device gpu is refused by the CLI). */
static par_status bitwise_ready(const shared *R)
{
    (void)R;
    return PAR_OK;
}

static par_status resolve_layout(shared *R, par_golden_opts *go)
{
    R->lay = R->o->layout;
    par_layout_model lm = {
        .n_layers = R->cfg.n_layers, .n_mtp_layers = R->cfg.n_mtp_layers,
        .n_routed_experts = R->cfg.n_routed_experts, .seq_length = R->cfg.seq_length,
        .global_batch_size = R->cfg.global_batch_size, .window_size = R->cfg.window_size,
        .n_ratios = R->cfg.n_compress_ratios, .compress_ratios = R->cfg.compress_ratios,
    };
    par_status s;
    if ((s = par_layout_resolve(&R->lay, &lm)) || (s = PAR_FN(par_exec_check)(&R->lay)) ||
        (s = par_tp_check_config(&R->cfg, R->lay.tp, R->lay.etp)))
        return s;
    R->cfg.global_batch_size = R->lay.global_batch;
    go->cfg = R->cfg;
    R->B = R->cfg.global_batch_size;
    R->S = R->cfg.seq_length;
    R->Bl = R->B / R->lay.da;
    if (R->B % R->lay.da != 0)
        return par_err(PAR_EINVAL, "global batch size %lld is not divisible by the data-parallel size Da = %lld",
                       (long long)R->B, (long long)R->lay.da);
    return PAR_OK;
}

static void shared_free(shared *R)
{
    par_free(R->tok);
    par_free(R->seg);
    par_free(R->info);
    par_free(R->load_acc);
    par_free(R->rank_ctr);
    par_free(R->cp_ctr);
    par_free(R->ep_tier);
    par_free(R->ep_time);
    par_free(R->mem);
    par_free(R->apeak);
    par_free(R->cursor);
    par_param_table_free(&R->tab);
    par_costas_free(&R->ca);
    PAR_FN(par_replicas_free)(R->reps);
}

/* --cost-as: the target's cost plan on the resolved layout. */
static par_status cost_as(shared *R)
{
    const par_run_opts *o = R->o;
    if (!o->cost_as)
        return PAR_OK;
    if (!o->netmodel)
        return par_err(PAR_EINVAL, "--cost-as %s charges the emulated network's clock: give a network", o->cost_as);
    if (o->moe_dispatch)
        return par_err(PAR_EUNSUPPORTED, "--cost-as %s: the hierarchical EP dispatch is not costed yet (use "
                                         "--moe-dispatch flat)", o->cost_as);
    par_status s = par_costas_build(&R->cfg, &R->lay, o->precision, o->cost_as, o->cost_as_layout, &R->ca);
    R->has_ca = s == PAR_OK;
    return s;
}

/* The tables the ranks fill and every step's global batch, read-only by the
 * ranks; the parameter count. */
static par_status prebuild(shared *R, par_golden_opts *go, par_golden_data *ds)
{
    const int64_t steps = R->n, N = R->lay.world;
    const size_t BS = (size_t)(R->B * R->S);
    R->tok = par_malloc((size_t)steps * BS * sizeof *R->tok, PAR_TAG_ACT);
    R->seg = par_malloc((size_t)steps * BS * sizeof *R->seg, PAR_TAG_ACT);
    R->info = par_calloc((size_t)steps, sizeof *R->info, PAR_TAG_MISC);
    R->load_acc = par_calloc((size_t)par_config_n_blocks(&R->cfg) * (size_t)R->cfg.n_routed_experts,
                             sizeof *R->load_acc, PAR_TAG_MISC);
    R->rank_ctr = par_calloc((size_t)N * 6, sizeof *R->rank_ctr, PAR_TAG_MISC);
    R->cp_ctr = par_calloc((size_t)N * 4, sizeof *R->cp_ctr, PAR_TAG_MISC);
    R->ep_tier = par_calloc((size_t)N * 4, sizeof *R->ep_tier, PAR_TAG_MISC);
    R->ep_time = par_calloc((size_t)N * 2, sizeof *R->ep_time, PAR_TAG_MISC);
    R->mem = par_calloc((size_t)N * PAR_RUN_MEM, sizeof *R->mem, PAR_TAG_MISC);
    R->apeak = par_calloc((size_t)N * 2 * PAR_TAG_COUNT, sizeof *R->apeak, PAR_TAG_MISC);
    R->cursor = par_calloc((size_t)steps, sizeof *R->cursor, PAR_TAG_MISC);
    if (!R->tok || !R->seg || !R->info || !R->load_acc || !R->rank_ctr || !R->cp_ctr || !R->ep_tier || !R->ep_time ||
        !R->mem || !R->apeak || !R->cursor)
        return par_err(PAR_ENOMEM, "run: out of memory for %lld steps of %lld x %lld tokens", (long long)steps,
                       (long long)R->B, (long long)R->S);
    par_batch full;
    par_status s = par_batch_alloc(&full, R->B, R->S);
    for (int64_t k = 0; k < steps && !s; k++) {
        if ((s = PAR_FN(par_golden_data_next)(ds, go, &R->cfg, R->step0 + k, &full)))
            break;
        R->cursor[k] = ds->kind == 2 ? (R->step0 + k + 1) * R->B : ds->cursor; /* file: the next row */
        memcpy(R->tok + (size_t)k * BS, full.tokens, BS * sizeof *R->tok);
        memcpy(R->seg + (size_t)k * BS, full.segments, BS * sizeof *R->seg);
    }
    par_batch_free(&full);
    if (!s && !(s = par_param_table_build(&R->tab, &R->cfg)))
        R->n_float = R->tab.n_float;
    if (!s && !R->o->private_replicas && N > 1)
        s = PAR_FN(par_replicas_create)(&R->reps);
    return s;
}

/* The dump's manifest and the atomic commit (by the process hosting rank 0;
 * another MPI process's temporary directory stayed empty). */
static par_status commit_dump(shared *R, par_golden_opts *go, par_golden_data *ds)
{
    if (!R->hosts_rank0) {
        par_adir_abort(R->tmp);
        R->tmp = NULL;
        return PAR_OK;
    }
    char pp_str[PAR_LAYOUT_STR_MAX];
    par_layout_record gl;
    par_layout_to_record(&R->lay, pp_str, (int)sizeof pp_str, &gl);
    gl.backend = par_backend_name(R->o->backend);
    gl.blas_core = PAR_FN(par_golden_blas_core)();
    par_status s = PAR_FN(par_golden_write_manifest)(R->tmp, &R->cfg, R->o->steps, R->step0,
                                                     par_layout_record_json(&gl),
                                                     PAR_FN(par_golden_data_json)(ds, go, &R->cfg));
    if (s)
        return s;
    s = par_adir_commit(R->tmp, R->o->dump_dir);
    R->tmp = NULL;
    return s;
}

/* The summary (it takes over R's step table and memory table). */
static void fill_summary(shared *R, par_run_summary *sum, par_netrun *net, double t_start)
{
    const int N = (int)R->lay.world;
    memset(sum, 0, sizeof *sum);
    sum->steps = R->n;
    sum->seq_length = R->S;
    sum->step = R->info;
    R->info = NULL;
    sum->layout = R->lay;
    snprintf(sum->backend, sizeof sum->backend, "%s", par_backend_name(R->o->backend));
    sum->n_params = R->n_float;
    summarize_loads(R, sum, (int)par_config_n_blocks(&R->cfg));
    summarize_comm(R, sum, N);
    sum->mem = R->mem;
    R->mem = NULL;
    sum->alloc_peak = par_malloc((size_t)N * PAR_TAG_COUNT * sizeof *sum->alloc_peak, PAR_TAG_MISC);
    sum->alloc_res_peak = par_malloc((size_t)N * PAR_TAG_COUNT * sizeof *sum->alloc_res_peak, PAR_TAG_MISC);
    for (int r = 0; r < N && sum->alloc_peak && sum->alloc_res_peak; r++)
        for (int t = 0; t < PAR_TAG_COUNT; t++) {
            sum->alloc_peak[r * PAR_TAG_COUNT + t] = R->apeak[(2 * r) * PAR_TAG_COUNT + t];
            sum->alloc_res_peak[r * PAR_TAG_COUNT + t] = R->apeak[(2 * r + 1) * PAR_TAG_COUNT + t];
        }
    for (int64_t r = 0; r < R->B; r++) /* samples of the first step's batch: per row, its last segment + 1 */
        sum->samples0 += (int64_t)R->seg[(r + 1) * R->S - 1] + 1;
    sum->start_step = R->step0;
    sum->saves = R->saves;
    sum->hosts_rank0 = R->hosts_rank0;
    sum->wall_s = now_s() - t_start;
    sum->net = net;
    sum->pp_net_bubble = -1;
    sum->pp_dry_bubble_measured = -1;
    if (R->has_ca) {
        snprintf(sum->cost_as, sizeof sum->cost_as, "%s", R->ca.target.preset);
        snprintf(sum->cost_as_layout, sizeof sum->cost_as_layout, "%s", R->ca.tl.pp_layout);
        sum->cost_as_tokens = R->ca.tokens;
    }
    if (R->lay.pp > 1) {
        const par_exec_info *x = &R->exi;
        snprintf(sum->pp_schedule, sizeof sum->pp_schedule, "%s", x->schedule ? x->schedule : "");
        sum->pp_micro = x->n_micro;
        sum->pp_dry_bubble = x->dry_bubble;
        if (x->net_steps > 0) {
            sum->pp_net_bubble = x->net_bubble;
            sum->pp_net_makespan_s = x->net_makespan_s;
            sum->pp_dry_bubble_measured = x->dry_bubble_measured;
            sum->pp_cost_f_s = x->cost_f_s;
            sum->pp_cost_b_s = x->cost_b_s;
            sum->pp_cost_w_s = x->cost_w_s;
            sum->pp_latency_s = x->latency_s;
        }
    }
}

/* The summary of a run with no step left: steps 0, the checkpoint's step. */
static void nothing_to_do(const shared *R, par_run_summary *sum, double t_start)
{
    memset(sum, 0, sizeof *sum);
    sum->seq_length = R->S;
    sum->layout = R->lay;
    snprintf(sum->backend, sizeof sum->backend, "%s", par_backend_name(R->o->backend));
    sum->start_step = R->step0;
    sum->hosts_rank0 = 1; /* no world ran: every process says so */
    sum->pp_net_bubble = sum->pp_dry_bubble_measured = -1;
    sum->wall_s = now_s() - t_start;
}

par_status PAR_FN(par_run)(const par_run_opts *o, par_run_summary *sum)
{
    double t_start = now_s();
    if (o->steps < 1)
        return par_err(PAR_EINVAL, "run: --steps must be >= 1 (got %lld)", (long long)o->steps);
    if (!o->backend)
        return par_err(PAR_EINVAL, "run: no backend");
    shared R;
    memset(&R, 0, sizeof R);
    R.o = o;
    R.cfg = o->cfg;
    par_status s;
    if ((s = par_config_validate(&R.cfg)) || (s = par_config_check_runnable(&R.cfg)))
        return s;
    par_golden_opts go;
    par_golden_data ds;
    if ((s = open_data(&R, &go, &ds)))
        return s;
    par_netrun *net = NULL; /* with o->netmodel: the emulated clocks (to sum->net) */
    if ((s = resolve_layout(&R, &go)) || (s = bitwise_ready(&R)) || (s = cost_as(&R)) ||
        (o->load && (s = PAR_FN(par_ckpt_model_check)(o->load, &R.cfg))))
        goto fail_data;
    if (R.n < 1) { /* loaded at or past --steps (Megatron's --train-iters): checked, nothing runs or is written */
        if (sum)
            nothing_to_do(&R, sum, t_start);
        goto fail_data;
    }
    if ((s = prebuild(&R, &go, &ds)) || (o->dump_dir && (s = par_adir_begin(o->dump_dir, &R.tmp))))
        goto fail_data;
    openblas_set_num_threads(1); /* one BLAS thread per rank */
    par_world_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.timeout_s = o->timeout_s;
    wo.fingerprint = o->fingerprint; /* MPI: every process runs the same configuration */
    wo.rank_host = o->rank_host;
    if ((o->netmodel && (s = par_netrun_create(o->netmodel, (int)R.lay.world, o->net_spans, &net))))
        goto fail_tmp;
    wo.net = net;
    if ((s = par_world_run(o->backend, (int)R.lay.world, rank_main, &R, &wo)) ||
        (R.tmp && (s = commit_dump(&R, &go, &ds))))
        goto fail_tmp;
    if (sum) {
        fill_summary(&R, sum, net, t_start);
        net = NULL;
    }
fail_tmp:
    if (R.tmp)
        par_adir_abort(R.tmp);
fail_data:
    if (net)
        par_netrun_free(net);
    PAR_FN(par_golden_data_close)(&ds);
    shared_free(&R);
    return s;
}
