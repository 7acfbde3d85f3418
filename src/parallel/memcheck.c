/* parallel/memcheck.c - refuse a run that cannot fit (see parallel/memcheck.h). */
#include "parallel/memcheck.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/params.h"
#include "parallel/groups.h"
#include "parallel/memmodel.h"
#include "parallel/plan.h"

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
    par_mm_opts mo;
    par_mm_opts_init(&mo);
    mo.rt = PAR_MM_PARITY;
    mo.real_bytes = es;
    mo.skew = 1.0; /* balanced routing: a run is refused for what it must hold */
    mo.shared_replicas = 1; /* parity run: one dense copy per process (replicas.h) */
    mo.ranks_per_process = local < l->world ? local : 0;
    par_mm *mm = NULL;
    par_status s = par_mm_create(&mm, cfg, l, &mo);
    if (s)
        return s;
    double sh = 0;
    if ((s = par_mm_shared_of(mm, 0, &sh))) {
        par_mm_free(mm);
        return s;
    }
    e->shared += sh; /* the process's copies, once */
    e->rank_max = 0;
    e->ranks = 0;
    for (int64_t r = 0; r < l->world && !s; r++) {
        par_mm_rank x;
        if ((s = par_mm_rank_of(mm, (int)r, &x)))
            break;
        e->ranks += x.total;
        if (x.total > e->rank_max)
            e->rank_max = x.total, e->rank_at = (int)r;
    }
    par_mm_free(mm);
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
