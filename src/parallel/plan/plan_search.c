/* parallel/plan/plan_search.c - `parity plan --search` (see parallel/plan/plan_search.h). */
#include "parallel/plan/plan_search.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "parallel/plan/plan.h"
#include "parallel/schedule/schedule.h"

#define LL(x) ((long long)(x))

/* Resolves the candidate's layout; the first broken rule is its reason. */
static int candidate_layout(const par_config *cfg, const par_search_opts *o, par_search_cand *c, par_layout *l)
{
    par_layout_init(l);
    l->pp = c->pp, l->vpp = c->vpp, l->cp = c->cp, l->ep = c->ep, l->etp = c->etp;
    l->world = o->world, l->micro_batch = c->b, l->global_batch = o->global_batch;
    l->distributed_optimizer = o->distributed_optimizer;
    snprintf(c->schedule, sizeof c->schedule, "%s", c->pp == 1 ? "none" : c->vpp > 1 ? "interleaved" : "1f1b");
    if (c->pp > 1)
        (void)par_layout_set_schedule(l, c->vpp > 1 ? "interleaved" : "1f1b");
    int64_t segs = c->pp * c->vpp;
    if (cfg->n_layers % segs != 0) {
        char s[PAR_LAYOUT_STR_MAX];
        par_pplayout_suggest(s, (int)sizeof s, segs, cfg->n_layers, cfg->n_mtp_layers);
        (void)par_layout_set_pp_layout(l, s);
    }
    par_status s = par_plan_resolve(l, cfg);
    if (!s)
        s = par_layout_run_rules(l);
    if (!s && c->pp > 1) { /* the schedule's own rules (Megatron's VPP check) */
        par_schedule_params sp, ok;
        par_schedule_params_init(&sp);
        (void)par_schedule_kind_parse(l->schedule, &sp.kind);
        sp.pp = (int)l->pp, sp.vpp = (int)l->vpp, sp.n_micro = (int)l->n_micro, sp.mb_group = (int)l->mb_group;
        s = par_schedule_params_check(&sp, &ok);
    }
    if (s) {
        c->status = s == PAR_EUNSUPPORTED ? PAR_CAND_UNSUPPORTED : PAR_CAND_ILLEGAL;
        snprintf(c->reason, sizeof c->reason, "%s", par_last_error());
        return 0;
    }
    c->da = l->da, c->de = l->de, c->m = l->n_micro;
    return 1;
}

/* Memory of the heaviest rank over the stages, then the step time. */
static par_status evaluate(const par_config *cfg, const par_search_opts *o, const par_param_table *tab,
                           par_search_cand *c, const par_layout *l)
{
    par_memmodel *mm = NULL;
    par_memmodel_opts mo = o->mm;
    mo.recompute = c->recompute;
    par_status s = par_memmodel_create_shared(&mm, cfg, l, &mo, tab);
    if (s)
        return s;
    c->mem_peak = -1;
    for (int st = 0; st < (int)l->pp && !s; st++) {
        par_memmodel_rank r;
        if (!(s = par_memmodel_stage_heaviest(mm, st, &r)) && r.total > c->mem_peak)
            c->mem_peak = r.total, c->mem_stage = st;
    }
    par_memmodel_free(mm);
    if (s)
        return s;
    if (o->memory > 0 && c->mem_peak > o->memory) {
        c->status = PAR_CAND_MEMORY;
        snprintf(c->reason, sizeof c->reason, "heaviest rank (stage %d) needs %.0f bytes > %.0f per GPU (%.3g GB)",
                 c->mem_stage, c->mem_peak, o->memory, o->memory / 1e9);
        return PAR_OK;
    }
    c->status = PAR_CAND_KEPT;
    snprintf(c->reason, sizeof c->reason, "fits: %.4g GB (stage %d)", c->mem_peak / 1e9, c->mem_stage);
    par_steptime_opts so = o->st;
    so.recompute = c->recompute;
    return par_steptime_estimate(cfg, l, o->net, &so, &c->t);
}

/* Parameters outside and inside the routed experts. */
static void weight_counts(const par_param_table *t, double *dense, double *experts)
{
    *dense = *experts = 0;
    for (int i = 0; i < t->n; i++)
        *(t->p[i].expert >= 0 ? experts : dense) += (double)t->p[i].numel;
}

double par_plan_search_floor(const par_config *cfg, int64_t world)
{
    par_param_table tab;
    if (world < 1 || par_param_table_build(&tab, cfg) != PAR_OK)
        return 0;
    double d, e;
    weight_counts(&tab, &d, &e);
    par_param_table_free(&tab);
    return 2.0 * (d + e) / (double)world;
}

/* 1 (and c dropped for memory) when its weights alone exceed the budget:
 * the heaviest stage holds >= 1/PP of the dense weights and 1/(PP EP ETP)
 * of the experts', each element >= 2 bytes. */
static int over_floor(const par_search_opts *o, const double w[2], par_search_cand *c)
{
    double lb = 2.0 * (w[0] / (double)c->pp + w[1] / (double)(c->pp * c->ep * c->etp));
    if (o->memory <= 0 || lb <= o->memory)
        return 0;
    c->status = PAR_CAND_MEMORY;
    c->mem_peak = lb;
    snprintf(c->reason, sizeof c->reason, "its weights alone need at least %.0f bytes > %.0f per GPU (%.3g GB; a "
             "lower bound, the memory model not run)", lb, o->memory, o->memory / 1e9);
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A step coprime with n: visiting k * step mod n spreads a cut-short search
 * over the whole enumeration. */
static int64_t stride_of(int n)
{
    static const int64_t primes[] = {7919, 7907, 7901};
    for (int k = 0; n > 1 && k < 3; k++)
        if (n % primes[k] != 0)
            return primes[k] % n;
    return 1;
}

/* Every candidate: the weight floor, the layout rules, the memory model and
 * the step time, until o->max_seconds; the rest skipped. */
static par_status evaluate_all(const par_config *cfg, const par_search_opts *o, const par_param_table *tab,
                               par_search_cand *c, int n)
{
    double w[2], t0 = now_s(), last = t0;
    weight_counts(tab, &w[0], &w[1]);
    int64_t step = stride_of(n);
    par_status s = PAR_OK;
    for (int k = 0; k < n && !s; k++) {
        par_search_cand *ci = &c[((int64_t)k * step) % n];
        double t = now_s();
        if (o->max_seconds > 0 && t - t0 > o->max_seconds) {
            ci->status = PAR_CAND_SKIPPED;
            snprintf(ci->reason, sizeof ci->reason, "not evaluated: the search stopped after %.3g s", o->max_seconds);
            continue;
        }
        if (o->progress && t - last >= 1.0) {
            o->progress(k, n, t - t0, o->progress_ud);
            last = t;
        }
        par_layout l;
        if (!over_floor(o, w, ci) && candidate_layout(cfg, o, ci, &l))
            s = evaluate(cfg, o, tab, ci, &l);
    }
    return s;
}

static int cmp_cand(const void *a, const void *b)
{
    const par_search_cand *x = a, *y = b;
    if ((x->status == PAR_CAND_KEPT) != (y->status == PAR_CAND_KEPT))
        return x->status == PAR_CAND_KEPT ? -1 : 1;
    if (x->status == PAR_CAND_KEPT && x->t.step_s != y->t.step_s)
        return x->t.step_s < y->t.step_s ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Every (PP, VPP, CP, EP, ETP, b) of the enumeration into c (NULL: count them). */
static int enumerate(const par_config *cfg, const par_search_opts *o, par_search_cand *c)
{
    static const int64_t vpps[] = {1, 2}, cps[] = {1, 2, 4, 8}, etps[] = {1, 2}, bs[] = {1, 2, 4};
    const int nrc = o->recompute_both && o->mm.rt == PAR_MM_MEGATRON ? 2 : 1;
    int n = 0;
    int64_t maxpp = o->max_pp > 0 && o->max_pp < cfg->n_layers ? o->max_pp : cfg->n_layers;
    for (int64_t pp = 1; pp <= maxpp && pp <= o->world; pp++) {
        if (o->world % pp)
            continue;
        int64_t per = o->world / pp;
        for (int iv = 0; iv < 2; iv++)
            for (int ic = 0; ic < 4; ic++)
                for (int64_t ep = 1; ep <= per && ep <= cfg->n_routed_experts; ep++)
                    for (int it = 0; it < 2; it++)
                        for (int ib = 0; ib < 3 * nrc; ib++) {
                            if ((pp == 1 && vpps[iv] > 1) || per % cps[ic] || cfg->n_routed_experts % ep ||
                                per % (ep * etps[it]))
                                continue;
                            int rc = nrc == 2 ? ib % 2 : o->mm.recompute;
                            if (c)
                                c[n] = (par_search_cand){.seq = n, .pp = pp, .vpp = vpps[iv], .cp = cps[ic],
                                                         .ep = ep, .etp = etps[it], .b = bs[ib / nrc],
                                                         .recompute = rc};
                            n++;
                        }
    }
    return n;
}

par_status par_plan_search(const par_config *cfg, const par_search_opts *o, par_search_cand **out, int *nout)
{
    *out = NULL;
    *nout = 0;
    if (o->world < 1 || o->global_batch < 1 || !o->net)
        return par_err(PAR_EINVAL, "search: needs --world-size >= 1, --global-batch-size >= 1 and a network "
                       "(got %lld GPUs, batch %lld)", LL(o->world), LL(o->global_batch));
    int n = enumerate(cfg, o, NULL);
    par_search_cand *c = par_calloc((size_t)(n > 0 ? n : 1), sizeof *c, PAR_TAG_MODEL);
    if (!c)
        return par_err(PAR_ENOMEM, "search: out of memory for %d candidates", n);
    enumerate(cfg, o, c);
    par_param_table tab;
    par_status s = par_param_table_build(&tab, cfg);
    if (s) {
        par_free(c);
        return s;
    }
    s = evaluate_all(cfg, o, &tab, c, n);
    par_param_table_free(&tab);
    if (s) {
        par_free(c);
        return s;
    }
    qsort(c, (size_t)n, sizeof *c, cmp_cand);
    *out = c;
    *nout = n;
    return PAR_OK;
}

static const char *status_name(par_cand_status s)
{
    static const char *const names[] = {"kept", "illegal", "unsupported", "memory", "skipped"};
    return (unsigned)s < 5 ? names[s] : "?";
}

static void print_row(FILE *f, int rank, const par_search_cand *c, double unit)
{
    char step[32] = "-";
    if (c->status == PAR_CAND_KEPT)
        snprintf(step, sizeof step, "%.4g", c->t.step_s);
    fprintf(f, "  %-4d %-3lld %-3lld %-3lld %-4lld %-3lld %-2lld %-5lld %-4lld %-5lld %-11s %-4s %8.2f  %-9s %5.1f  %-9s "
               "%s\n",
            rank, LL(c->pp), LL(c->vpp), LL(c->cp), LL(c->ep), LL(c->etp), LL(c->b), LL(c->da), LL(c->de), LL(c->m),
            c->schedule, c->recompute ? "full" : "none", c->mem_peak > 0 ? c->mem_peak / unit : 0.0, step,
            c->status == PAR_CAND_KEPT ? 100 * c->t.bubble : 0.0, status_name(c->status), c->reason);
}

void par_plan_search_print(FILE *f, const par_search_cand *c, int n, int top, const par_search_opts *o)
{
    int kept = 0, by[5] = {0};
    double top_peak = 0;
    for (int i = 0; i < n; i++) {
        by[c[i].status]++;
        kept += c[i].status == PAR_CAND_KEPT;
        if (c[i].status == PAR_CAND_KEPT && c[i].mem_peak > top_peak)
            top_peak = c[i].mem_peak;
    }
    const int gb = top_peak >= 1e9 || o->memory >= 1e9;
    const double unit = gb ? 1e9 : 1e6;
    fprintf(f, "search   %lld GPUs, B %lld, budget %s; %d candidates: %d kept, %d illegal, %d unsupported, %d over "
               "memory, %d not evaluated; ranked by the analytical step time (network %s)\n",
            LL(o->world), LL(o->global_batch), o->memory > 0 ? "per GPU" : "none", n, kept, by[PAR_CAND_ILLEGAL],
            by[PAR_CAND_UNSUPPORTED], by[PAR_CAND_MEMORY], by[PAR_CAND_SKIPPED], o->net->name);
    if (by[PAR_CAND_SKIPPED])
        fprintf(f, "         stopped after %.3g s: %d of %d candidates evaluated, spread over the enumeration; the "
                   "ranking is of those (all would take about %.0f s: --search-seconds sets the bound)\n",
                o->max_seconds, n - by[PAR_CAND_SKIPPED], n,
                o->max_seconds * n / (n - by[PAR_CAND_SKIPPED] > 0 ? n - by[PAR_CAND_SKIPPED] : 1));
    if (!kept)
        fprintf(f, "         nothing fits%s\n", by[PAR_CAND_SKIPPED] ? " among those evaluated" : "");
    if (o->memory > 0)
        fprintf(f, "         memory per GPU %.0f bytes (%.4g GB)\n", o->memory, o->memory / 1e9);
    fprintf(f, "  rank PP  VPP CP  EP   ETP b  Da    De   m     schedule    rcmp peak %s   step s    bub %%  status    "
               "reason\n", gb ? "GB" : "MB");
    for (int i = 0; i < n && i < top && c[i].status == PAR_CAND_KEPT; i++)
        print_row(f, i + 1, &c[i], unit);
    for (int s = 1; s < 5; s++) { /* the first dropped candidate of each reason */
        for (int i = 0; i < n; i++)
            if (c[i].status == (par_cand_status)s) {
                print_row(f, 0, &c[i], unit);
                break;
            }
    }
    fprintf(f, "  (rank 0: the first dropped candidate of each reason; --json FILE lists every candidate)\n");
}

cJSON *par_plan_search_json(const par_search_cand *c, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        int ok = o && cJSON_AddItemToArray(a, o);
#define N(k, v) ok = ok && cJSON_AddNumberToObject(o, (k), (double)(v))
        N("pp", c[i].pp), N("vpp", c[i].vpp), N("cp", c[i].cp), N("ep", c[i].ep), N("etp", c[i].etp);
        N("micro_batch", c[i].b), N("da", c[i].da), N("de", c[i].de), N("n_micro", c[i].m);
        ok = ok && cJSON_AddStringToObject(o, "schedule", c[i].schedule);
        ok = ok && cJSON_AddStringToObject(o, "recompute_granularity", c[i].recompute ? "full" : "none");
        ok = ok && cJSON_AddStringToObject(o, "status", status_name(c[i].status));
        ok = ok && cJSON_AddStringToObject(o, "reason", c[i].reason);
        N("memory_peak", c[i].mem_peak > 0 ? c[i].mem_peak : 0), N("memory_stage", c[i].mem_stage);
        if (c[i].status == PAR_CAND_KEPT) {
            N("rank", i + 1), N("step_s", c[i].t.step_s), N("bubble", c[i].t.bubble), N("makespan_s", c[i].t.makespan_s);
            N("dp_s", c[i].t.dp_s), N("ep_s", c[i].t.ep_s), N("compute_s", c[i].t.compute_s);
        }
#undef N
        if (!ok) {
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}
