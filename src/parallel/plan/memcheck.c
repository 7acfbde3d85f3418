/* parallel/plan/memcheck.c - refuse a run that cannot fit (see parallel/plan/memcheck.h). */
#include "parallel/plan/memcheck.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/params.h"
#include "parallel/plan/memmodel_act.h"
#include "parallel/layout/groups.h"
#include "parallel/plan/memmodel.h"
#include "parallel/plan/plan.h"

/* driver.c par_run: tok, seg [steps, B, S] int32, nsamp [steps, B] int64,
 * the full batch (model/data.c: six int32 [B, S]). */
static double shared_bytes(const par_config *cfg, int64_t steps, int64_t B)
{
    double BS = (double)B * (double)cfg->seq_length;
    return (double)steps * (BS * 8.0 + (double)B * 8.0) + 24.0 * BS;
}

/* Every parameter at least once as weight, gradient and one optimizer
 * slot, no table built: the routed experts alone first (closed form), then
 * par_param_count's walk when those fit. */
static par_status bound(const par_config *cfg, int es, double limit, double *out)
{
    double routed = 3.0 * (double)cfg->n_routed_experts * 3.0 * (double)cfg->dim * (double)cfg->moe_inter_dim *
                    (double)(cfg->n_layers + cfg->n_mtp_layers) * es;
    if (limit > 0 && routed > limit) {
        *out = routed;
        return PAR_OK;
    }
    int64_t nf = 0, ni = 0;
    par_status s = par_param_count(cfg, NULL, &nf, &ni);
    if (!s)
        *out = 3.0 * (double)nf * es + 4.0 * (double)ni;
    return s;
}

/* The model's ranks [0, local) of a resolved layout (the heaviest local
 * rank times the count when a process runs part of the world). */
static par_status model_ranks(const par_config *cfg, const par_layout *l, int es, int64_t local, par_memest *e)
{
    par_memmodel_opts mo;
    par_memmodel_opts_init(&mo);
    mo.rt = PAR_MM_PARITY;
    mo.real_bytes = es;
    mo.skew = 1.0; /* balanced routing: a run is refused for what it must hold */
    mo.shared_replicas = 1; /* parity run: one dense copy per process (replicas.h) */
    mo.ranks_per_process = local < l->world ? local : 0;
    par_memmodel *mm = NULL;
    par_status s = par_memmodel_create(&mm, cfg, l, &mo);
    if (s)
        return s;
    double sh = 0;
    if ((s = par_memmodel_shared_of(mm, 0, &sh))) {
        par_memmodel_free(mm);
        return s;
    }
    e->shared += sh; /* the process's copies, once */
    e->rank_max = 0;
    e->ranks = 0;
    for (int64_t r = 0; r < l->world && !s; r++) {
        par_memmodel_rank x;
        if ((s = par_memmodel_rank_of(mm, (int)r, &x)))
            break;
        e->ranks += x.total;
        if (x.total > e->rank_max)
            e->rank_max = x.total, e->rank_at = (int)r;
    }
    par_memmodel_free(mm);
    if (!s && local < l->world) /* a process of an MPI world: its share, the heaviest ranks' worth */
        e->ranks = e->rank_max * (double)local;
    return s;
}

par_status par_memcheck_run(const par_config *cfg, const par_layout *given, int precision, int64_t steps,
                            int64_t local, double limit, par_memest *out)
{
    par_memest e;
    memset(&e, 0, sizeof e);
    const int es = precision == 32 ? 4 : 8;
    par_layout l = *given;
    par_config c = *cfg;
    if (l.global_batch > 0)
        c.global_batch_size = l.global_batch;
    par_status s = par_plan_resolve(&l, &c);
    if (s)
        return s;
    e.nranks = local > 0 && local < l.world ? local : l.world;
    e.shared = shared_bytes(&c, steps, l.global_batch);
    double b = 0;
    if ((s = bound(&c, es, limit, &b)))
        return s;
    e.ranks = b * (double)e.nranks / (double)l.world; /* this process's share of the bound */
    e.rank_max = b / (double)l.world;
    e.total = e.ranks + e.shared;
    if (limit > 0 && e.total > limit) {
        e.bound_only = 1;
        *out = e;
        return PAR_OK;
    }
    if ((s = model_ranks(&c, &l, es, e.nranks, &e)))
        return s;
    e.total = e.ranks + e.shared;
    *out = e;
    return PAR_OK;
}

par_status par_memcheck_golden(const par_config *cfg, int precision, int64_t steps, double limit, par_memest *out)
{
    par_layout l;
    par_layout_init(&l);
    l.world = 1;
    return par_memcheck_run(cfg, &l, precision, steps, 1, limit, out);
}

double par_memcheck_machine(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && psz > 0)
        return (double)pages * (double)psz;
    FILE *f = fopen("/proc/meminfo", "r");
    double kb = 0;
    if (f) {
        char line[128];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemTotal: %lf kB", &kb) == 1)
                break;
        fclose(f);
    }
    return kb * 1024.0;
}

par_status par_memcheck_fits(const par_memest *e, double limit, const char *what)
{
    if (limit <= 0 || e->total <= limit)
        return PAR_OK;
    if (e->bound_only)
        return par_err(PAR_EINVAL,
                       "memory: this run needs at least %.0f bytes (%.3g GB: weights, gradients and one optimizer "
                       "slot of every parameter %.0f bytes over %lld ranks, shared batches %.0f bytes), more than "
                       "%s (%.0f bytes); nothing was allocated",
                       e->total, e->total / 1e9, e->ranks, (long long)e->nranks, e->shared, what, limit);
    return par_err(PAR_EINVAL,
                   "memory: this run needs an estimated %.0f bytes (%.3g GB: %lld ranks %.0f bytes, the heaviest "
                   "rank %d %.0f bytes, shared batches %.0f bytes), more than %s (%.0f bytes); nothing was "
                   "allocated (docs/planning.md: parity plan --runtime parity shows the breakdown)",
                   e->total, e->total / 1e9, (long long)e->nranks, e->ranks, e->rank_at, e->rank_max, e->shared,
                   what, limit);
}

/* ---- the row-blocked golden (issue 18) -------------------------------- */

/* What a row-blocked golden holds beyond the one-shot golden of R rows:
 * the step file's tensors of all B rows (model/golden.c keep_alloc: both
 * heads' logits, every block's output, routing and selections) and the
 * statistics window of B rows instead of R (one sample per row, as the
 * memory model counts them). */
static double blocked_extra(const par_config *cfg, int es, int64_t B, int64_t R)
{
    const double T = (double)B * (double)cfg->seq_length, nb = (double)par_config_n_blocks(cfg);
    double sel = 0;
    for (int64_t b = 0; b < (int64_t)nb; b++)
        sel += par_config_ratio(cfg, b) == 4 ? (double)cfg->index_topk : 0;
    double keep = T * (es * ((cfg->n_mtp_layers > 0 ? 2.0 : 1.0) * (double)cfg->vocab_size +
                             nb * (double)(cfg->hc_mult * cfg->dim)) +
                       4.0 * (nb * (double)cfg->n_activated_experts + sel));
    par_memmodel_act_ctx c;
    memset(&c, 0, sizeof c);
    c.cfg = cfg;
    c.es = es;
    return keep + par_memmodel_act_stats(&c, B, -1) - par_memmodel_act_stats(&c, R, -1);
}

par_status par_memcheck_golden_blocked(const par_config *cfg, int precision, int64_t steps, int64_t rows,
                                       par_memest *out)
{
    const int64_t B = cfg->global_batch_size;
    if (rows <= 0 || rows >= B)
        return par_memcheck_golden(cfg, precision, steps, 0, out);
    par_config c = *cfg;
    c.global_batch_size = rows;
    par_memest e;
    par_status s = par_memcheck_golden(&c, precision, steps, 0, &e);
    if (s)
        return s;
    e.shared = shared_bytes(cfg, steps, B);
    e.ranks += blocked_extra(cfg, precision == 32 ? 4 : 8, B, rows);
    e.rank_max = e.ranks;
    e.total = e.ranks + e.shared;
    *out = e;
    return PAR_OK;
}

par_status par_memcheck_golden_rows(const par_config *cfg, int precision, int64_t steps, double limit,
                                    int64_t *rows, par_memest *out)
{
    const int64_t B = cfg->global_batch_size;
    par_memest e;
    par_status s = par_memcheck_golden(cfg, precision, steps, limit, &e);
    if (s)
        return s;
    /* one shot only with a fifth of the limit to spare: config C's one-shot estimate of 23.9 GB
     * against this machine's 25.3 GB reached 22.2 GB of RSS and ran the machine out of memory */
    if (limit <= 0 || e.total <= 0.8 * limit || B <= 1) {
        *rows = 0;
        *out = e;
        return PAR_OK;
    }
    /* halvings of the batch: the first whose estimate is at most half the limit (the estimate's
     * margin: blocks cost little time), else the largest that fits at all, else 1 row */
    int64_t fit = 0, R = B;
    par_memest efit = e;
    do {
        R = (R + 1) / 2;
        if ((s = par_memcheck_golden_blocked(cfg, precision, steps, R, &e)))
            return s;
        if (!fit && e.total <= limit)
            fit = R, efit = e;
    } while (e.total > limit / 2 && R > 1);
    if (e.total > limit / 2 && fit)
        R = fit, e = efit;
    *rows = R;
    *out = e;
    return PAR_OK;
}
