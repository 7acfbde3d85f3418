/* parallel/driver.c - the parallel training driver (see parallel/driver.h,
 * docs/parallel.md). */
#include "parallel/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fileio.h"
#include "core/log.h"
#include "model/golden.h"
#include "model/model.h"
#include "parallel/ckpt_model.h"
#include "parallel/cpwire.h"
#include "parallel/dpwire.h"
#include "parallel/ep.h"
#include "parallel/groups.h"
#include "parallel/pp.h"
#include "parallel/reduce.h"

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
    int64_t *nsamp;           /* [steps, B] samples per row */
    char *tmp;                /* the dump's temporary directory, or NULL */
    int hosts_rank0;          /* this process ran world rank 0 (it alone commits the dump) */
    par_run_step_info *info;  /* [steps] */
    int64_t *load_acc;        /* [n_blocks, E] global loads summed over steps */
    int64_t *rank_ctr;        /* [N, 6] ep counters + local floats of each rank */
    int64_t *cp_ctr;          /* [N, 4] cp attention bytes of each rank (par_cp_traffic) */
    int64_t *ep_tier;         /* [N, 4] ep bytes: dispatch nvlink, ib, combine nvlink, ib */
    double *ep_time;          /* [N, 2] ep emulated dispatch, combine seconds */
    int64_t *mem;             /* [N, PAR_RUN_MEM] per-rank memory accounting (dpwire.h) */
    par_pp_info ppi;          /* PP > 1: world rank 0's pipeline (pp.h) */
    int64_t step0;            /* updates already applied (the loaded checkpoint's step) */
    uint64_t seed;            /* the data's seed (the checkpoint's with --load) */
    int64_t *cursor;          /* [steps] data cursor after each step's batch */
    int64_t saves;            /* checkpoints written (rank 0) */
    int64_t n_float;
} shared;

/* ------------------------------------------------------------- gathers -- */

/* Gathers `n` elements of every rank of c to rank 0 of c, placed in rank
 * order at out (n * size; rank 0 only).  counts may differ: cnt[r] (NULL:
 * all n).  One all-to-all(v) where only rank 0 receives. */
static par_status gather0(par_comm *c, const void *in, size_t n, void *out, const size_t *cnt, par_ctype t)
{
    int N = par_comm_size(c), me = par_comm_rank(c);
    size_t *sc = par_calloc((size_t)N * 2, sizeof *sc, PAR_TAG_COMM);
    if (!sc)
        return par_err(PAR_ENOMEM, "gather: out of memory");
    size_t *rc = sc + N;
    sc[0] = n;
    if (me == 0)
        for (int r = 0; r < N; r++)
            rc[r] = cnt ? cnt[r] : n;
    static char dummy[64];
    par_status s = par_alltoallv(c, in ? in : dummy, sc, NULL, me == 0 && out ? out : dummy, rc, NULL, t);
    par_free(sc);
    return s;
}

/* Routed-expert floats a rank holds (the same for every EP rank). */
static size_t expert_floats(const PAR_FN(par_model) *M)
{
    size_t n = 0;
    for (int i = 0; i < M->tab.n; i++)
        if (M->tab.p[i].expert >= 0 && M->loc[i] >= 0)
            n += (size_t)M->tab.p[i].numel;
    return n;
}

/* Assembles the table-layout buffer `full` [n_float] on rank 0 from every
 * rank's local buffer `loc` (one of M's params/grads/opt_m/opt_v, given as
 * an offset from M->params' role): dense entries from rank 0's own copy,
 * routed experts from the ranks of expert-DP index 0 (each holds one EP
 * slice). */
static par_status gather_full(const par_pctx *P, const PAR_FN(par_model) *M, const par_real *loc, par_real *full)
{
    const par_layout *l = P->lay;
    int N = P->N;
    int sender = P->rc.edp == 0 && P->rc.etp == 0;
    size_t ne = expert_floats(M);
    par_real *pack = NULL, *recv = NULL;
    size_t *cnt = NULL;
    par_status s = PAR_OK;
    pack = par_malloc((ne ? ne : 1) * sizeof *pack, PAR_TAG_COMM);
    cnt = par_calloc((size_t)N, sizeof *cnt, PAR_TAG_COMM);
    if (!pack || !cnt)
        goto fail_oom;
    size_t o = 0;
    for (int i = 0; i < M->tab.n && sender; i++)
        if (M->tab.p[i].expert >= 0 && M->loc[i] >= 0) {
            memcpy(pack + o, loc + M->loc[i], (size_t)M->tab.p[i].numel * sizeof *pack);
            o += (size_t)M->tab.p[i].numel;
        }
    size_t total = 0;
    if (P->rank == 0) {
        for (int r = 0; r < N; r++) {
            par_rank_coords rc;
            if ((s = par_rank_coords_of(l, r, &rc)))
                goto done;
            cnt[r] = rc.edp == 0 && rc.etp == 0 ? ne : 0;
            total += cnt[r];
        }
        recv = par_malloc((total ? total : 1) * sizeof *recv, PAR_TAG_COMM);
        if (!recv)
            goto fail_oom;
    }
    if ((s = gather0(P->world, pack, sender ? ne : 0, recv, cnt, PAR_C_REAL)))
        goto done;
    if (P->rank == 0) {
        const par_param_table *t = &M->tab;
        for (int i = 0; i < t->n; i++)
            if (t->p[i].dtype == PAR_PDT_REAL && t->p[i].expert < 0)
                memcpy(full + t->p[i].offset, loc + M->loc[i], (size_t)t->p[i].numel * sizeof *full);
        int64_t El = M->e1 - M->e0;
        size_t at = 0;
        for (int r = 0; r < N; r++) {
            if (!cnt[r])
                continue;
            par_rank_coords rc;
            (void)par_rank_coords_of(l, r, &rc);
            int64_t e0 = (int64_t)rc.ep * El, e1 = e0 + El;
            for (int i = 0; i < t->n; i++)
                if (t->p[i].expert >= e0 && t->p[i].expert < e1) {
                    memcpy(full + t->p[i].offset, recv + at, (size_t)t->p[i].numel * sizeof *full);
                    at += (size_t)t->p[i].numel;
                }
        }
    }
    goto done;
fail_oom:
    s = par_err(PAR_ENOMEM, "dump: out of memory gathering %zu expert floats per rank", ne);
done:
    par_free(pack);
    par_free(recv);
    par_free(cnt);
    return s;
}

typedef struct {
    par_real *params, *m, *v, *grads; /* [n_float] on rank 0 */
    par_real *lm, *lv;        /* [n_local] optimizer state gathered to the group roots (dpwire.h) */
    PAR_FN(par_dpw) *w;
    PAR_FN(par_pp) *pp;       /* PP > 1: gathers through parallel/pp.h */
} dump_bufs;

/* gather_full, or the pipeline's (entries from their lowest PP holder) */
#define GATHER_FULL(P, M, loc, full)                                                                         \
    (D->pp ? PAR_FN(par_pp_gather_full)(D->pp, (P), (M), (loc), (full)) : gather_full((P), (M), (loc), (full)))

static par_status dump_params(const shared *R, const par_pctx *P, PAR_FN(par_model) *M, dump_bufs *D, int64_t k)
{
    par_status s;
    if ((s = GATHER_FULL(P, M, M->params, D->params)))
        return s;
    if (k > 0 && ((s = PAR_FN(par_dpw_state_gather)(D->w, M, D->lm, D->lv)) || (s = GATHER_FULL(P, M, D->lm, D->m)) ||
                  (s = GATHER_FULL(P, M, D->lv, D->v))))
        return s;
    if (P->rank != 0)
        return PAR_OK;
    return PAR_FN(par_golden_write_params_buf)(&M->tab, D->params, k > 0 ? D->m : NULL, D->v, M->i32, R->tmp, k);
}

/* Rows of the global batch: every rank contributes its Bl rows (world rank
 * order = attention-DP order with TP = CP = PP = 1). */
static par_status gather_rows(const par_pctx *P, const void *in, size_t n, void **out, size_t esz, par_ctype t)
{
    *out = NULL;
    if (P->rank == 0) {
        *out = par_malloc(n * (size_t)P->N * esz + 1, PAR_TAG_IO);
        if (!*out)
            return par_err(PAR_ENOMEM, "dump: out of memory for %zu x %d elements", n, P->N);
    }
    par_status s = gather0(P->world, in, n, *out, NULL, t);
    if (s || P->lay->cp == 1 || P->rank != 0)
        return s;
    /* context parallelism: rank pieces are [Bl, L, ...] slices of rows */
    void *tmp = *out;
    *out = par_malloc(n * (size_t)P->N * esz + 1, PAR_TAG_IO);
    if (!*out) {
        *out = tmp;
        return par_err(PAR_ENOMEM, "dump: out of memory for %zu x %d elements", n, P->N);
    }
    s = PAR_FN(par_cpw_place)(*out, tmp, n, esz, P->lay, P->lay->global_batch / P->lay->da);
    par_free(tmp);
    return s;
}

static par_status dump_step(const shared *R, const par_pctx *P, PAR_FN(par_model) *M, dump_bufs *D, int64_t k)
{
    const par_config *c = &R->cfg;
    int nb = M->n_blocks;
    size_t T = (size_t)(R->Bl * R->S / R->lay.cp); /* this rank's tokens */
    par_status s = PAR_OK;
    void **keep = par_calloc((size_t)(3 * nb + 2), sizeof *keep, PAR_TAG_IO);
    if (!keep)
        return par_err(PAR_ENOMEM, "dump: out of memory");
    void **act = keep, **idx = keep + nb, **sel = keep + 2 * nb, **lg = keep + 3 * nb;
    if ((s = gather_rows(P, M->head.logits, T * (size_t)M->V, &lg[0], sizeof(par_real), PAR_C_REAL)))
        goto done;
    if (c->n_mtp_layers > 0 &&
        (s = gather_rows(P, M->mtp_head.logits, T * (size_t)M->V, &lg[1], sizeof(par_real), PAR_C_REAL)))
        goto done;
    for (int b = 0; b < nb; b++) {
        if ((s = gather_rows(P, M->blk[b].Xout, T * (size_t)(M->n * M->d), &act[b], sizeof(par_real), PAR_C_REAL)) ||
            (s = gather_rows(P, M->blk[b].idx, T * (size_t)M->K, &idx[b], sizeof(int32_t), PAR_C_I32)))
            goto done;
        if (par_config_ratio(c, b) == 4 &&
            (s = gather_rows(P, M->blk[b].as.sel, T * (size_t)c->index_topk, &sel[b], sizeof(int32_t), PAR_C_I32)))
            goto done;
    }
    if ((s = gather_full(P, M, M->grads, D->grads)))
        goto done;
    if (P->rank == 0) {
        PAR_FN(par_golden_step_view) v = {
            .B = R->B, .S = R->S, .tokens = R->tok + k * R->B * R->S, .segments = R->seg + k * R->B * R->S,
            .out = M->last, .logits = lg[0], .mtp_logits = lg[1], .act = (const par_real *const *)act,
            .idx = (const int32_t *const *)idx, .loads = M->stats.loads, .sel = (const int32_t *const *)sel,
            .grads = D->grads,
        };
        s = PAR_FN(par_golden_write_step_view)(&M->tab, &v, R->tmp, k);
    }
done:
    for (int i = 0; i < 3 * nb + 2; i++)
        par_free(keep[i]);
    par_free(keep);
    return s;
}

/* ------------------------------------------------------------------ rank -- */

static par_status rank_main(par_comm *world, void *arg)
{
    shared *R = arg;
    const par_run_opts *o = R->o;
    const par_layout *l = &R->lay;
    par_pctx P;
    memset(&P, 0, sizeof P);
    P.lay = l;
    P.world = world;
    P.rank = par_comm_rank(world);
    if (P.rank == 0)
        R->hosts_rank0 = 1; /* under MPI only one process does */
    P.N = par_comm_size(world);
    PAR_FN(par_model) M;
    memset(&M, 0, sizeof M);
    PAR_FN(par_ep) *ep = NULL;
    PAR_FN(par_pp) *pp = NULL; /* PP > 1: the pipeline executor, which builds the stage's model (pp.h) */
    PAR_FN(par_cpw) *cpw = NULL;
    par_batch lb, rb; /* the local batch; with CP also the rank's whole rows */
    memset(&lb, 0, sizeof lb);
    memset(&rb, 0, sizeof rb);
    dump_bufs D;
    memset(&D, 0, sizeof D);
    PAR_FN(par_dpw) dpw;
    memset(&dpw, 0, sizeof dpw);
    D.w = &dpw;
    par_status s;

    if ((s = par_rank_coords_of(l, P.rank, &P.rc)) || (s = par_groups_build(world, l, &P.g)))
        return s;
    int64_t E = R->cfg.n_routed_experts, El = E / l->ep, e0 = (int64_t)P.rc.ep * El;
    if ((l->pp > 1 ? (s = PAR_FN(par_pp_create)(&pp, &P, &M, &R->cfg, o->seed, e0, e0 + El))
                   : (s = PAR_FN(par_model_init_owned)(&M, &R->cfg, o->seed, e0, e0 + El))))
        goto fail_groups;
    D.pp = pp;
    if (l->ep > 1) {
        if ((s = PAR_FN(par_ep_create)(&ep, P.g.g[PAR_GROUP_EP], &M)))
            goto fail_model;
        PAR_FN(par_ep_install)(ep, &M);
        if ((s = PAR_FN(par_ep_set_dispatch)(ep, o->moe_dispatch ? PAR_EP_HIER : PAR_EP_FLAT,
                                             o->netmodel ? o->netmodel->gpus_per_node : 8)))
            goto fail_model;
        if (pp && (s = PAR_FN(par_pp_set_ep)(pp, ep)))
            goto fail_model;
    }
    if (l->cp > 1 && !pp) { /* (a pipeline keeps one CP executor per microbatch) */
        if ((s = PAR_FN(par_cpw_create)(&cpw, P.g.g[PAR_GROUP_CP], &M, R->Bl, R->S)))
            goto fail_model;
        PAR_FN(par_cpw_install)(cpw, &M);
        if ((s = par_batch_alloc(&rb, R->Bl, R->S)))
            goto fail_model;
    }
    if ((s = par_batch_alloc(&lb, R->Bl, R->S / l->cp)))
        goto fail_model;
    /* the optimizer: dense and expert plans, replicated or ZeRO-1 (dpwire.h) */
    if ((s = PAR_FN(par_dpw_init)(&dpw, &P, &M)))
        goto fail_batch;
    for (int i = 0; pp && i < M.tab.n; i++)
        if (PAR_FN(par_pp_norm_skip)(pp)[i] && (s = PAR_FN(par_dpw_set_norm_skip)(&dpw, i)))
            goto fail_batch;
    if (o->load && (s = PAR_FN(par_ckpt_model_load)(&P, &M, &dpw, o->load)))
        goto fail_batch;
    if (R->tmp) {
        D.lm = par_calloc((size_t)(M.n_local > 0 ? M.n_local : 1), sizeof(par_real), PAR_TAG_IO);
        D.lv = par_calloc((size_t)(M.n_local > 0 ? M.n_local : 1), sizeof(par_real), PAR_TAG_IO);
        if (!D.lm || !D.lv) {
            s = par_err(PAR_ENOMEM, "dump: out of memory for %lld-float state buffers", (long long)M.n_local);
            goto fail_batch;
        }
    }
    if (R->tmp && P.rank == 0) {
        size_t nf = (size_t)R->n_float;
        D.params = par_malloc(nf * sizeof(par_real), PAR_TAG_IO);
        D.m = par_calloc(nf, sizeof(par_real), PAR_TAG_IO);
        D.v = par_calloc(nf, sizeof(par_real), PAR_TAG_IO);
        D.grads = par_calloc(nf, sizeof(par_real), PAR_TAG_IO);
        if (!D.params || !D.m || !D.v || !D.grads) {
            s = par_err(PAR_ENOMEM, "dump: out of memory for %zu-float buffers", nf);
            goto fail_batch;
        }
    }
    if (R->tmp && (s = dump_params(R, &P, &M, &D, 0)))
        goto fail_batch;

    int64_t r0 = (int64_t)P.rc.dp * R->Bl;
    for (int64_t k = 0; k < o->steps; k++) {
        double t0 = now_s();
        const int32_t *tk = R->tok + (k * R->B + r0) * R->S, *sg = R->seg + (k * R->B + r0) * R->S;
        if (pp) { /* the pipeline: every microbatch, statistics, shared gradients (pp.h) */
            if ((s = PAR_FN(par_pp_step)(pp, &P, &M, R->tok + k * R->B * R->S, R->seg + k * R->B * R->S,
                                         R->tmp != NULL)))
                goto fail_batch;
        } else if (cpw) { /* derive on the whole rows, then slice (cpwire.h) */
            if ((s = par_batch_set(&rb, tk, sg, R->cfg.vocab_size, "run batch")) ||
                (s = PAR_FN(par_cpw_batch)(cpw, &lb, &rb)))
                goto fail_batch;
        } else if ((s = par_batch_set(&lb, tk, sg, R->cfg.vocab_size, "run batch")))
            goto fail_batch;
        if (!pp && (s = PAR_FN(par_model_forward)(&M, &lb)))
            goto fail_batch;
        int64_t q0 = 0, nsg = 0;
        for (int64_t r = 0; r < R->B; r++) {
            if (r < r0)
                q0 += R->nsamp[k * R->B + r];
            nsg += R->nsamp[k * R->B + r];
        }
        if (!pp) {
            M.stats.q0 = q0;
            M.stats.Ns_global = nsg;
        }
        /* gradients reduced once per replica group, global norm, clip, update,
         * balance (dpwire.h); a dump then wants the reduced gradients back */
        if ((!pp && ((s = PAR_FN(par_reduce_stats)(&P, &M)) || (s = PAR_FN(par_model_backward)(&M)))) ||
            (s = PAR_FN(par_dpw_step)(&dpw, &P, &M)) || (R->tmp && (s = PAR_FN(par_dpw_reduced_grads)(&dpw, &M))))
            goto fail_batch;
        double t1 = now_s();
        if (R->tmp && (s = pp ? PAR_FN(par_pp_dump_step)(pp, &P, &M, R->tok + k * R->B * R->S,
                                                          R->seg + k * R->B * R->S, D.grads, R->tmp, k)
                              : dump_step(R, &P, &M, &D, k)))
            goto fail_batch;
        double t2 = now_s();
        double t3 = now_s();
        if (P.rank == 0) {
            par_run_step_info *si = &R->info[k];
            si->loss = M.last.loss;
            si->loss_main = M.last.loss_main;
            si->loss_mtp = M.last.loss_mtp;
            si->loss_aux = M.last.loss_aux;
            si->grad_norm = M.last.grad_norm;
            si->wall_s = (t1 - t0) + (t3 - t2);
            for (int64_t i = 0; i < (int64_t)M.n_blocks * E; i++)
                R->load_acc[i] += M.stats.loads[i];
            if (o->progress)
                fprintf(stderr,
                        "run: step %lld/%lld  loss %.10g  (main %.10g  mtp %.10g  aux %.6g)  grad_norm %.6g  "
                        "%.3f s\n",
                        (long long)(k + 1), (long long)o->steps, si->loss, si->loss_main, si->loss_mtp,
                        si->loss_aux, si->grad_norm, si->wall_s);
        }
        if (R->tmp && (s = dump_params(R, &P, &M, &D, k + 1)))
            goto fail_batch;
        int64_t gstep = R->step0 + k + 1;
        if (o->save_dir && ((o->save_interval > 0 && gstep % o->save_interval == 0) || k == o->steps - 1)) {
            par_ckpt_state cs = {.step = gstep, .cursor = R->cursor[k], .seed = R->seed};
            snprintf(cs.precision, sizeof cs.precision, "%s", PAR_REAL_BITS == 64 ? "f64" : "f32");
            if ((s = PAR_FN(par_ckpt_model_save)(&P, &M, &dpw, o->save_dir, &cs)))
                goto fail_batch;
            if (P.rank == 0)
                R->saves++;
        }
    }

    if (pp && P.rank == 0)
        PAR_FN(par_pp_info_get)(pp, &R->ppi);
    /* per-rank counters to rank 0 */
    par_ep_counters ec;
    PAR_FN(par_ep_counters_get)(ep, &ec);
    int64_t mine[6] = {ec.rows_sent, ec.rows_recv, ec.dispatch_bytes, ec.combine_bytes, ec.calls, M.n_local};
    s = gather0(world, mine, 6, R->rank_ctr, NULL, PAR_C_I64);
    int64_t ept[4] = {ec.dispatch_nvlink, ec.dispatch_ib, ec.combine_nvlink, ec.combine_ib};
    double eps[2] = {ec.dispatch_s, ec.combine_s};
    if (!s)
        s = gather0(world, ept, 4, R->ep_tier, NULL, PAR_C_I64);
    if (!s)
        s = gather0(world, eps, 2, R->ep_time, NULL, PAR_C_F64);
    par_cp_traffic ct;
    PAR_FN(par_cpw_traffic)(cpw, &ct);
    int64_t cpm[4] = {ct.halo_fwd, ct.gather_fwd, ct.rs_bwd, ct.halo_bwd};
    if (!s)
        s = gather0(world, cpm, 4, R->cp_ctr, NULL, PAR_C_I64);
    par_dpw_memory mm;
    PAR_FN(par_dpw_memory_of)(&dpw, &M, &mm);
    int64_t mem[PAR_RUN_MEM] = {mm.weights, mm.grads, mm.optim, mm.optim_full, mm.act, mm.comm};
    if (!s)
        s = gather0(world, mem, PAR_RUN_MEM, R->mem, NULL, PAR_C_I64);

fail_batch:
    par_free(D.lm);
    par_free(D.lv);
    PAR_FN(par_dpw_free)(&dpw);
    par_free(D.params);
    par_free(D.m);
    par_free(D.v);
    par_free(D.grads);
    par_batch_free(&lb);
fail_model:
    par_batch_free(&rb);
    PAR_FN(par_cpw_free)(cpw);
    PAR_FN(par_ep_free)(ep);
    PAR_FN(par_pp_free)(pp);
    PAR_FN(par_model_free)(&M);
fail_groups:
    par_groups_free(&P.g);
    return s;
}

/* ------------------------------------------------------------------- run -- */

static void summarize(const shared *R, par_run_summary *sum, int N, int n_blocks)
{
    int64_t E = R->cfg.n_routed_experts, n = (int64_t)n_blocks * E;
    sum->load_min = INT64_MAX;
    int64_t tot = 0;
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
    sum->recv_min = INT64_MAX;
    int64_t rt = 0;
    for (int r = 0; r < N; r++) {
        const int64_t *c = R->rank_ctr + 6 * r;
        rt += c[1];
        if (c[1] < sum->recv_min)
            sum->recv_min = c[1];
        if (c[1] > sum->recv_max)
            sum->recv_max = c[1];
        sum->dispatch_bytes += c[2];
        sum->combine_bytes += c[3];
        if (c[5] > sum->max_rank_floats)
            sum->max_rank_floats = c[5];
    }
    sum->a2a_calls = R->rank_ctr[4];
    for (int r = 0; r < N; r++) {
        const int64_t *c = R->cp_ctr + 4 * r;
        sum->cp_halo_bytes += c[0] + c[3];
        sum->cp_gather_bytes += c[1];
        sum->cp_rs_bytes += c[2];
    }
    sum->recv_mean = N > 0 ? (double)rt / N : 0;
    for (int r = 0; r < N; r++) {
        for (int k = 0; k < 4; k++)
            sum->ep_bytes[k / 2][k % 2] += R->ep_tier[4 * r + k];
        for (int k = 0; k < 2; k++) {
            double v = R->ep_time[2 * r + k];
            sum->ep_time_mean[k] += N > 0 ? v / N : 0;
            if (v > sum->ep_time_max[k])
                sum->ep_time_max[k] = v;
        }
    }
    sum->moe_dispatch = R->o->moe_dispatch;
    sum->ep_gpn = R->o->netmodel ? R->o->netmodel->gpus_per_node : 8;
    sum->ep_recv = par_malloc((size_t)(N > 0 ? N : 1) * sizeof *sum->ep_recv, PAR_TAG_MISC);
    for (int r = 0; sum->ep_recv && r < N; r++)
        sum->ep_recv[r] = R->rank_ctr[6 * r + 1];
}

par_status PAR_FN(par_run)(const par_run_opts *o, par_run_summary *sum)
{
    double t_start = now_s();
    par_status s;
    par_netrun *net = NULL; /* with o->netmodel: the emulated clocks (to sum->net) */
    if (o->steps < 1)
        return par_err(PAR_EINVAL, "run: --steps must be >= 1 (got %lld)", (long long)o->steps);
    if (!o->backend)
        return par_err(PAR_EINVAL, "run: no backend");
    shared R;
    memset(&R, 0, sizeof R);
    R.o = o;
    R.cfg = o->cfg;
    if ((s = par_config_validate(&R.cfg)) || (s = par_config_check_runnable(&R.cfg)))
        return s;

    /* the data first: it may fix seq_length */
    par_golden_opts go;
    par_golden_opts_init(&go);
    go.cfg = R.cfg;
    go.steps = o->steps;
    go.seed = o->seed;
    R.seed = o->seed;
    if (o->load) { /* resume: the checkpoint's step, data cursor and seed */
        const par_ckpt_state *cs = par_ckpt_state_of(o->load);
        R.step0 = cs->step;
        R.seed = go.seed = cs->seed;
        go.steps = R.step0 + o->steps;
    }
    go.data_path = o->data_path;
    go.fixture = o->fixture;
    go.fixtures_dir = o->fixtures_dir;
    if (o->layout.global_batch > 0)
        R.cfg.global_batch_size = o->layout.global_batch;
    par_golden_data ds;
    if ((s = PAR_FN(par_golden_data_open)(&ds, &go, &R.cfg)))
        return s;
    if (o->load)
        ds.cursor = ds.cursor0 = par_ckpt_state_of(o->load)->cursor;

    /* the layout */
    R.lay = o->layout;
    par_layout_model lm = {
        .n_layers = R.cfg.n_layers, .n_mtp_layers = R.cfg.n_mtp_layers,
        .n_routed_experts = R.cfg.n_routed_experts, .seq_length = R.cfg.seq_length,
        .global_batch_size = R.cfg.global_batch_size, .window_size = R.cfg.window_size,
        .n_ratios = R.cfg.n_compress_ratios, .compress_ratios = R.cfg.compress_ratios,
    };
    par_batch full;
    memset(&full, 0, sizeof full);
    if ((s = par_layout_resolve(&R.lay, &lm)))
        goto fail_data;
    if ((s = PAR_FN(par_pp_check)(&R.lay))) /* the schedule's own rules (DualPipe's), its dry run */
        goto fail_data;
    R.cfg.global_batch_size = R.lay.global_batch;
    go.cfg = R.cfg;
    int N = (int)R.lay.world;
    R.B = R.cfg.global_batch_size;
    R.S = R.cfg.seq_length;
    R.Bl = R.B / R.lay.da;
    if (R.B % R.lay.da != 0) {
        s = par_err(PAR_EINVAL, "global batch size %lld is not divisible by the data-parallel size Da = %lld",
                    (long long)R.B, (long long)R.lay.da);
        goto fail_data;
    }
    /* every step's global batch, shared read-only by the ranks */
    size_t BS = (size_t)(R.B * R.S);
    R.tok = par_malloc((size_t)o->steps * BS * sizeof *R.tok, PAR_TAG_ACT);
    R.seg = par_malloc((size_t)o->steps * BS * sizeof *R.seg, PAR_TAG_ACT);
    R.nsamp = par_malloc((size_t)(o->steps * R.B) * sizeof *R.nsamp, PAR_TAG_ACT);
    R.info = par_calloc((size_t)o->steps, sizeof *R.info, PAR_TAG_MISC);
    R.load_acc = par_calloc((size_t)par_config_n_blocks(&R.cfg) * (size_t)R.cfg.n_routed_experts,
                            sizeof *R.load_acc, PAR_TAG_MISC);
    R.rank_ctr = par_calloc((size_t)N * 6, sizeof *R.rank_ctr, PAR_TAG_MISC);
    R.cp_ctr = par_calloc((size_t)N * 4, sizeof *R.cp_ctr, PAR_TAG_MISC);
    R.ep_tier = par_calloc((size_t)N * 4, sizeof *R.ep_tier, PAR_TAG_MISC);
    R.ep_time = par_calloc((size_t)N * 2, sizeof *R.ep_time, PAR_TAG_MISC);
    R.mem = par_calloc((size_t)N * PAR_RUN_MEM, sizeof *R.mem, PAR_TAG_MISC);
    R.cursor = par_calloc((size_t)o->steps, sizeof *R.cursor, PAR_TAG_MISC);
    if (!R.tok || !R.seg || !R.nsamp || !R.info || !R.load_acc || !R.rank_ctr || !R.cp_ctr || !R.ep_tier || !R.ep_time || !R.mem ||
        !R.cursor) {
        s = par_err(PAR_ENOMEM, "run: out of memory for %lld steps of %lld x %lld tokens", (long long)o->steps,
                    (long long)R.B, (long long)R.S);
        goto fail_data;
    }
    if ((s = par_batch_alloc(&full, R.B, R.S)))
        goto fail_data;
    for (int64_t k = 0; k < o->steps; k++) {
        if ((s = PAR_FN(par_golden_data_next)(&ds, &go, &R.cfg, R.step0 + k, &full)))
            goto fail_data;
        R.cursor[k] = ds.kind == 2 ? (R.step0 + k + 1) * R.B : ds.cursor; /* file: the next row */
        memcpy(R.tok + (size_t)k * BS, full.tokens, BS * sizeof *R.tok);
        memcpy(R.seg + (size_t)k * BS, full.segments, BS * sizeof *R.seg);
        for (int64_t r = 0; r < R.B; r++)
            R.nsamp[k * R.B + r] = (int64_t)full.segments[(r + 1) * R.S - 1] + 1;
    }
    {
        par_param_table t;
        if ((s = par_param_table_build(&t, &R.cfg)))
            goto fail_data;
        R.n_float = t.n_float;
        par_param_table_free(&t);
    }
    if (o->load && (s = PAR_FN(par_ckpt_model_check)(o->load, &R.cfg)))
        goto fail_data;

    if (o->dump_dir && (s = par_adir_begin(o->dump_dir, &R.tmp)))
        goto fail_data;

    openblas_set_num_threads(1); /* one BLAS thread per rank */
    par_world_opts wo;
    memset(&wo, 0, sizeof wo);
    wo.timeout_s = o->timeout_s;
    if (o->netmodel && (s = par_netrun_create(o->netmodel, N, o->net_spans, &net)))
        goto fail_tmp;
    wo.net = net;
    s = par_world_run(o->backend, N, rank_main, &R, &wo);
    if (s)
        goto fail_tmp;

    if (R.tmp && !R.hosts_rank0) {
        /* another MPI process hosts rank 0 and commits the dump: this
         * process's temporary directory stayed empty */
        par_adir_abort(R.tmp);
        R.tmp = NULL;
    }
    if (R.tmp) {
        par_golden_layout gl = {
            .world = R.lay.world, .tp = R.lay.tp, .pp = R.lay.pp, .vpp = R.lay.vpp, .cp = R.lay.cp,
            .ep = R.lay.ep, .etp = R.lay.etp, .da = R.lay.da, .de = R.lay.de,
            .micro_batch = R.lay.micro_batch, .global_batch = R.lay.global_batch,
            .distributed_optimizer = R.lay.distributed_optimizer,
            .schedule = R.lay.pp > 1 ? R.lay.schedule : "none", .backend = par_backend_name(o->backend),
        };
        if ((s = PAR_FN(par_golden_write_manifest)(R.tmp, &R.cfg, o->steps, PAR_FN(par_golden_layout_json)(&gl),
                                                   PAR_FN(par_golden_data_json)(&ds, &go, &R.cfg))))
            goto fail_tmp;
        s = par_adir_commit(R.tmp, o->dump_dir);
        R.tmp = NULL;
        if (s)
            goto fail_data;
    }
    if (sum) {
        memset(sum, 0, sizeof *sum);
        sum->steps = o->steps;
        sum->step = R.info;
        R.info = NULL;
        sum->layout = R.lay;
        snprintf(sum->backend, sizeof sum->backend, "%s", par_backend_name(o->backend));
        sum->n_params = R.n_float;
        summarize(&R, sum, N, (int)par_config_n_blocks(&R.cfg));
        sum->mem = R.mem;
        R.mem = NULL;
        sum->start_step = R.step0;
        sum->saves = R.saves;
        sum->wall_s = now_s() - t_start;
        sum->net = net;
        sum->pp_net_bubble = -1;
        if (R.lay.pp > 1) {
            snprintf(sum->pp_schedule, sizeof sum->pp_schedule, "%s", R.ppi.schedule ? R.ppi.schedule : "");
            sum->pp_micro = R.ppi.n_micro;
            sum->pp_dry_bubble = R.ppi.dry_bubble;
            if (R.ppi.net_steps > 0) {
                sum->pp_net_bubble = R.ppi.net_bubble;
                sum->pp_net_makespan_s = R.ppi.net_makespan_s;
            }
        }
        net = NULL;
    }
    goto fail_data; /* normal cleanup */

fail_tmp:
    if (R.tmp)
        par_adir_abort(R.tmp);
fail_data:
    if (net)
        par_netrun_free(net);
    par_batch_free(&full);
    PAR_FN(par_golden_data_close)(&ds);
    par_free(R.tok);
    par_free(R.seg);
    par_free(R.nsamp);
    par_free(R.info);
    par_free(R.load_acc);
    par_free(R.rank_ctr);
    par_free(R.cp_ctr);
    par_free(R.ep_tier);
    par_free(R.ep_time);
    par_free(R.mem);
    par_free(R.cursor);
    return s;
}
