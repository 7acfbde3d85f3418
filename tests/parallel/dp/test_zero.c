/* parallel: the data-parallel optimizer step (replicated DP and ZeRO-1 with
 * Muon ownership by whole matrices) on the threads backend, f64, against the
 * serial par_optim_step on the rank-order sum of every rank's gradients.
 *
 * Equalities:
 * - ZeRO-1 vs replicated: bitwise, always (same packed layout, same norm
 *   partition, same element updates).
 * - vs serial with the clip inactive (norm < clip_grad): params and state
 *   bitwise (the reduced gradients are the serial rank-order sums, the clip
 *   factor is exactly 1, the element updates are the same code); the norm
 *   within 1e-12 relative (its summation order is the partition's).
 * - vs serial with the clip active: within 1e-12 relative L2 per tensor (the
 *   clip factor can differ in its last bit through the norm's order).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/status.h"
#include "model/config.h"
#include "model/optim.h"
#include "model/params.h"
#include "parallel/dp/zero.h"

typedef PAR_FN(par_zero_plan) plan_t;

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(zero, .init = quiet);

#define MAXR 8
#define MAXSTEPS 4
static const int DPS[] = {1, 2, 3, 4, 8};
#define NDPS ((int)(sizeof DPS / sizeof DPS[0]))

/* ---- fixtures ------------------------------------------------------------ */

static par_config cfg;
static par_param_table tab;

static void setup_tiny(void)
{
    quiet();
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_config_validate(&cfg), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_param_table_build(&tab, &cfg), PAR_OK, "%s", par_last_error());
}

static void teardown_tiny(void)
{
    par_param_table_free(&tab);
    cr_assert_eq(par_alloc_live(PAR_TAG_OPTIM), 0, "optimizer state leaked");
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "comm memory leaked");
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* uniform in [-1, 1), a pure function of (a, b, c) */
static double unif(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t h = mix(mix(mix(a) + b) + c);
    return (double)(h >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static double *alloc_flat(void)
{
    double *p = par_calloc((size_t)tab.n_float, sizeof *p, PAR_TAG_PARAM);
    cr_assert_not_null(p);
    return p;
}

static void init_params(double *w)
{
    for (int i = 0; i < tab.n; i++) {
        const par_param *p = &tab.p[i];
        if (p->dtype != PAR_PDT_REAL)
            continue;
        for (int64_t k = 0; k < p->numel; k++)
            w[p->offset + k] = 0.1 * unif(7, (uint64_t)i, (uint64_t)k);
    }
}

/* Expert slot of routed expert e with `ep` slots (contiguous blocks). */
static int expert_slot(int e, int ep) { return e / (int)(cfg.n_routed_experts / ep); }

/* Does world rank r hold table entry i?  ep == 0: everything; else the
 * dense tensors and the routed experts of slot r % ep. */
static int holds(int i, int r, int ep)
{
    int e = tab.p[i].expert;
    return ep == 0 || e < 0 || expert_slot(e, ep) == r % ep;
}

/* Rank r's local gradient of step s: scale * uniform, 0 where no gradient,
 * NaN where r does not hold the tensor (must never be read). */
static void local_grads(double *g, int s, int r, double scale, int ep)
{
    for (int i = 0; i < tab.n; i++) {
        const par_param *p = &tab.p[i];
        if (p->dtype != PAR_PDT_REAL)
            continue;
        for (int64_t k = 0; k < p->numel; k++) {
            double x = !p->has_grad ? 0.0 : holds(i, r, ep) ? scale * unif((uint64_t)s * 131 + (uint64_t)r, (uint64_t)i, (uint64_t)k) : NAN;
            g[p->offset + k] = x;
        }
    }
}

/* The serial reference: steps first..first+n-1, step s summing the
 * gradients of dps[s - first] ranks in rank order (dense: all ranks;
 * expert e: the ranks of its slot, ascending). */
static void serial_run(double *w, double *m, double *v, int first, int n, const int *dps, double scale, int ep,
                       double *norms)
{
    double *G = alloc_flat(), *g = alloc_flat();
    int *have = calloc((size_t)tab.n, sizeof *have);
    for (int j = 0; j < n; j++) {
        int s = first + j;
        memset(have, 0, (size_t)tab.n * sizeof *have);
        for (int r = 0; r < dps[j]; r++) {
            local_grads(g, s, r, scale, ep);
            for (int i = 0; i < tab.n; i++) {
                const par_param *p = &tab.p[i];
                if (p->dtype != PAR_PDT_REAL || !holds(i, r, ep))
                    continue;
                for (int64_t k = 0; k < p->numel; k++)
                    G[p->offset + k] = have[i] ? G[p->offset + k] + g[p->offset + k] : g[p->offset + k];
                have[i] = 1;
            }
        }
        double nrm;
        cr_assert_eq(PAR_FN(par_optim_step)(w, G, m, v, &tab, &cfg, s, NULL, 0, &nrm), PAR_OK, "%s",
                     par_last_error());
        norms[j] = nrm;
    }
    par_free(G);
    par_free(g);
    free(have);
}

/* ---- the parallel run ---------------------------------------------------- */

typedef struct {
    int dp;               /* world size                                        */
    par_dp_mode mode;
    int ep;               /* 0: one plan of every tensor over the world; else
                             a dense plan over the world + an expert plan over
                             the ranks of each slot (r % ep)                    */
    double scale;
    int first, n;         /* steps first .. first+n-1                           */
    const double *w0;     /* [n_float] starting params                          */
    const double *m0, *v0;/* starting state (table offsets) or NULL for zero    */
    double *out_w[MAXR];  /* [dp][n_float] params after the run                 */
    double *m_full, *v_full; /* gathered state (dense: root 0; experts: slot roots) */
    double norms[MAXR][MAXSTEPS];
    par_zero_memory mem[MAXR][2];
} run_ctx;

#define TRY(call)                                                                                  \
    do {                                                                                           \
        par_status s_ = (call);                                                                    \
        if (s_ != PAR_OK) {                                                                        \
            st = s_;                                                                               \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static par_status rank_fn(par_comm *world, void *arg)
{
    run_ctx *c = arg;
    const int r = par_comm_rank(world);
    par_status st = PAR_OK;
    plan_t plans[2];
    memset(plans, 0, sizeof plans);
    par_comm *comms[2] = {world, NULL};
    int np = c->ep ? 2 : 1;
    double *w = par_malloc((size_t)tab.n_float * sizeof *w, PAR_TAG_PARAM);
    double *g = par_malloc((size_t)tab.n_float * sizeof *g, PAR_TAG_GRAD);
    int *list = par_malloc((size_t)tab.n * sizeof *list, PAR_TAG_MISC);
    if (!w || !g || !list) {
        st = par_err(PAR_ENOMEM, "test: no memory");
        goto done;
    }
    memcpy(w, c->w0, (size_t)tab.n_float * sizeof *w);
    if (c->ep) {
        TRY(par_comm_split(world, r % c->ep, r, &comms[1]));
        int n = 0;
        for (int i = 0; i < tab.n; i++)
            if (tab.p[i].expert < 0)
                list[n++] = i;
        TRY(PAR_FN(par_zero_plan_build)(&plans[0], &tab, list, n, c->dp, r, c->mode));
        n = 0;
        for (int i = 0; i < tab.n; i++)
            if (tab.p[i].expert >= 0 && holds(i, r, c->ep))
                list[n++] = i;
        TRY(PAR_FN(par_zero_plan_build)(&plans[1], &tab, list, n, par_comm_size(comms[1]),
                                        par_comm_rank(comms[1]), c->mode));
    } else {
        for (int i = 0; i < tab.n; i++)
            list[i] = i;
        TRY(PAR_FN(par_zero_plan_build)(&plans[0], &tab, list, tab.n, c->dp, r, c->mode));
    }
    for (int k = 0; k < np; k++) {
        if (c->m0)
            PAR_FN(par_zero_state_load)(&plans[k], c->m0, c->v0);
        PAR_FN(par_zero_memory_of)(&plans[k], &c->mem[r][k]);
    }
    for (int j = 0; j < c->n; j++) {
        const int s = c->first + j;
        local_grads(g, s, r, c->scale, c->ep);
        double nrm = NAN;
        if (c->ep) {
            plan_t *pp[2] = {&plans[0], &plans[1]};
            TRY(PAR_FN(par_dp_step)(pp, comms, 2, world, w, g, &cfg, s, &nrm));
        } else if (c->mode == PAR_DP_ZERO1) {
            TRY(PAR_FN(par_zero_step)(&plans[0], world, w, g, &cfg, s, &nrm));
        } else {
            TRY(PAR_FN(par_dp_step_replicated)(&plans[0], world, w, g, &cfg, s, &nrm));
        }
        c->norms[r][j] = nrm;
    }
    memcpy(c->out_w[r], w, (size_t)tab.n_float * sizeof *w);
    for (int k = 0; k < np; k++)
        TRY(PAR_FN(par_zero_state_gather)(&plans[k], comms[k], 0, par_comm_rank(comms[k]) == 0 ? c->m_full : NULL,
                                          par_comm_rank(comms[k]) == 0 ? c->v_full : NULL));
done:
    for (int k = 0; k < 2; k++)
        PAR_FN(par_zero_plan_free)(&plans[k]);
    par_comm_free(comms[1]);
    par_free(w);
    par_free(g);
    par_free(list);
    return st;
}

static void run_parallel(run_ctx *c)
{
    for (int r = 0; r < c->dp; r++)
        c->out_w[r] = alloc_flat();
    c->m_full = alloc_flat();
    c->v_full = alloc_flat();
    par_world_opts o = {.timeout_s = 60.0};
    par_status st = par_world_run(par_backend_find("threads"), c->dp, rank_fn, c, &o);
    cr_assert_eq(st, PAR_OK, "world of %d (mode %d, ep %d): %s", c->dp, (int)c->mode, c->ep, par_last_error());
}

static void free_run(run_ctx *c)
{
    for (int r = 0; r < c->dp; r++)
        par_free(c->out_w[r]);
    par_free(c->m_full);
    par_free(c->v_full);
}

/* ---- comparisons --------------------------------------------------------- */

/* Compares the optimized tensors (and, for params, all float tensors)
 * rank r holds.  tol < 0: bitwise; else relative L2 per tensor. */
static void compare_flat(const double *a, const double *b, double tol, int r, int ep, int state_only,
                         const char *what)
{
    for (int i = 0; i < tab.n; i++) {
        const par_param *p = &tab.p[i];
        if (p->dtype != PAR_PDT_REAL || !holds(i, r, ep) || (state_only && p->opt == PAR_OPT_NONE))
            continue;
        const double *x = a + p->offset, *y = b + p->offset;
        if (tol < 0) {
            cr_assert(memcmp(x, y, (size_t)p->numel * sizeof *x) == 0, "%s: rank %d: '%s' not bitwise equal", what,
                      r, p->name);
            continue;
        }
        double d2 = 0, n2 = 0;
        for (int64_t k = 0; k < p->numel; k++) {
            d2 += (x[k] - y[k]) * (x[k] - y[k]);
            n2 += y[k] * y[k];
        }
        cr_assert(sqrt(d2) <= tol * sqrt(n2), "%s: rank %d: '%s' relative L2 error %.3g > %.0e", what, r, p->name,
                  n2 > 0 ? sqrt(d2 / n2) : sqrt(d2), tol);
    }
}

/* Runs serial, replicated and ZeRO-1 for `steps` steps at every DP of DPS. */
static void check_modes(double scale, int ep_of_dp, int clip_active)
{
    for (int di = 0; di < NDPS; di++) {
        const int dp = DPS[di];
        if (ep_of_dp && dp % 2)
            continue;
        const int ep = ep_of_dp ? 2 : 0;
        const int n = 3;
        const int dps[3] = {dp, dp, dp};
        double *w0 = alloc_flat();
        init_params(w0);
        double *ws = alloc_flat(), *ms = alloc_flat(), *vs = alloc_flat();
        memcpy(ws, w0, (size_t)tab.n_float * sizeof *ws);
        double sn[3];
        serial_run(ws, ms, vs, 1, n, dps, scale, ep, sn);
        for (int j = 0; j < n; j++)
            cr_assert(clip_active ? sn[j] > cfg.clip_grad : sn[j] < 0.5 * cfg.clip_grad,
                      "the fixture's norm %.3g does not %s the clip", sn[j], clip_active ? "activate" : "avoid");

        run_ctx rep = {.dp = dp, .mode = PAR_DP_REPLICATED, .ep = ep, .scale = scale, .first = 1, .n = n, .w0 = w0};
        run_ctx zr = rep;
        zr.mode = PAR_DP_ZERO1;
        run_parallel(&rep);
        run_parallel(&zr);
        const double tol = clip_active ? 1e-12 : -1.0;
        for (int r = 0; r < dp; r++) {
            char what[80];
            snprintf(what, sizeof what, "DP %d EP %d params ZeRO-1 vs replicated", dp, ep);
            compare_flat(zr.out_w[r], rep.out_w[r], -1.0, r, ep, 0, what);
            snprintf(what, sizeof what, "DP %d EP %d params ZeRO-1 vs serial", dp, ep);
            compare_flat(zr.out_w[r], ws, tol, r, ep, 0, what);
            for (int j = 0; j < n; j++) {
                cr_assert(memcmp(&zr.norms[r][j], &rep.norms[r][j], sizeof(double)) == 0,
                          "DP %d: norms of the modes differ: %.17g vs %.17g", dp, zr.norms[r][j], rep.norms[r][j]);
                cr_assert(memcmp(&zr.norms[r][j], &zr.norms[0][j], sizeof(double)) == 0,
                          "DP %d: ranks disagree on the norm", dp);
                cr_assert(fabs(zr.norms[r][j] - sn[j]) <= 1e-12 * sn[j], "DP %d step %d: norm %.17g vs serial %.17g",
                          dp, j + 1, zr.norms[r][j], sn[j]);
            }
            if (ep) { /* tensors r does not hold were never touched */
                for (int i = 0; i < tab.n; i++)
                    if (tab.p[i].dtype == PAR_PDT_REAL && !holds(i, r, ep))
                        cr_assert(memcmp(zr.out_w[r] + tab.p[i].offset, w0 + tab.p[i].offset,
                                         (size_t)tab.p[i].numel * sizeof(double)) == 0,
                                  "rank %d changed '%s' it does not hold", r, tab.p[i].name);
            }
        }
        /* gathered state (everything: dense from root 0, experts from their slot roots) */
        char what[80];
        snprintf(what, sizeof what, "DP %d EP %d state m ZeRO-1 vs serial", dp, ep);
        compare_flat(zr.m_full, ms, tol, 0, 0, 1, what);
        snprintf(what, sizeof what, "DP %d EP %d state v ZeRO-1 vs serial", dp, ep);
        compare_flat(zr.v_full, vs, tol, 0, 0, 1, what);
        snprintf(what, sizeof what, "DP %d EP %d state m ZeRO-1 vs replicated", dp, ep);
        compare_flat(zr.m_full, rep.m_full, -1.0, 0, 0, 1, what);
        snprintf(what, sizeof what, "DP %d EP %d state v ZeRO-1 vs replicated", dp, ep);
        compare_flat(zr.v_full, rep.v_full, -1.0, 0, 0, 1, what);
        free_run(&rep);
        free_run(&zr);
        par_free(w0);
        par_free(ws);
        par_free(ms);
        par_free(vs);
    }
}

/* ---- tests --------------------------------------------------------------- */

/* Norms stay far under clip_grad = 1: bitwise equal to serial. */
Test(zero, matches_serial_unclipped, .init = setup_tiny, .fini = teardown_tiny)
{
    check_modes(1e-4, 0, 0);
}

/* Norms far over clip_grad: within 1e-12 of serial, modes bitwise equal. */
Test(zero, matches_serial_clipped, .init = setup_tiny, .fini = teardown_tiny)
{
    check_modes(0.05, 0, 1);
}

/* Two plans (dense over the world, experts over the ranks of each slot,
 * EP = 2) with one norm all-reduce over the world: every tensor reduced
 * over exactly the ranks that hold it, the norm counts each once, gradients
 * of tensors a rank does not hold (NaN) never read. */
Test(zero, dense_and_expert_groups, .init = setup_tiny, .fini = teardown_tiny)
{
    check_modes(1e-4, 1, 0);
    check_modes(0.05, 1, 1);
}

/* The rule: numel descending, ties table order, least-loaded rank, ties
 * lower rank; every rank computes the same owners; balanced within the
 * largest matrix. */
Test(zero, muon_ownership_rule_and_balance, .init = setup_tiny, .fini = teardown_tiny)
{
    int *all = malloc((size_t)tab.n * sizeof *all);
    for (int i = 0; i < tab.n; i++)
        all[i] = i;
    const int sizes[] = {1, 2, 3, 4, 5, 8, 16, 64, 1000};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int dp = sizes[si];
        plan_t pl;
        cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, all, tab.n, dp, dp - 1, PAR_DP_ZERO1), PAR_OK, "%s",
                     par_last_error());
        /* independent greedy */
        int64_t *load = calloc((size_t)dp, sizeof *load);
        int *done = calloc((size_t)tab.n, sizeof *done);
        int64_t n_muon = 0, n_adamw = 0, largest = 0;
        for (int i = 0; i < tab.n; i++) {
            const par_param *p = &tab.p[i];
            int o = par_zero_geom_owner(&pl.geom, i);
            if (p->dtype != PAR_PDT_REAL || p->opt == PAR_OPT_NONE)
                cr_assert_eq(o, PAR_ZERO_ABSENT, "'%s' has no optimizer but owner %d", p->name, o);
            else if (p->opt == PAR_OPT_ADAMW) {
                cr_assert_eq(o, PAR_ZERO_SHARDED, "'%s' (AdamW) owner %d", p->name, o);
                n_adamw += p->numel;
            } else {
                cr_assert(o >= 0 && o < dp, "'%s' (Muon) owner %d outside [0, %d)", p->name, o, dp);
                n_muon += p->numel;
                largest = p->numel > largest ? p->numel : largest;
            }
        }
        for (;;) {
            int best = -1;
            for (int i = 0; i < tab.n; i++)
                if (tab.p[i].opt == PAR_OPT_MUON && tab.p[i].dtype == PAR_PDT_REAL && !done[i] &&
                    (best < 0 || tab.p[i].numel > tab.p[best].numel))
                    best = i;
            if (best < 0)
                break;
            int q = 0;
            for (int k = 1; k < dp; k++)
                if (load[k] < load[q])
                    q = k;
            cr_assert_eq(par_zero_geom_owner(&pl.geom, best), q, "DP %d: '%s' owned by %d, the rule says %d", dp,
                         tab.p[best].name, par_zero_geom_owner(&pl.geom, best), q);
            load[q] += tab.p[best].numel;
            done[best] = 1;
        }
        int64_t mx = 0, mn = INT64_MAX, sum = 0;
        for (int q = 0; q < dp; q++) {
            cr_assert_eq(pl.load[q], load[q]);
            mx = load[q] > mx ? load[q] : mx;
            mn = load[q] < mn ? load[q] : mn;
            sum += load[q];
        }
        cr_assert_eq(sum, n_muon);
        cr_assert_eq(pl.n_muon, n_muon);
        cr_assert_eq(pl.n_adamw, n_adamw);
        cr_assert_eq(pl.largest, largest);
        cr_assert(mx - mn <= largest, "DP %d: Muon loads %lld..%lld differ by more than the largest matrix %lld", dp,
                  (long long)mn, (long long)mx, (long long)largest);
        /* every rank builds the same owners */
        for (int r = 0; r < dp && r < 8; r++) {
            plan_t o;
            cr_assert_eq(PAR_FN(par_zero_plan_build)(&o, &tab, all, tab.n, dp, r, PAR_DP_ZERO1), PAR_OK);
            for (int i = 0; i < tab.n; i++)
                cr_assert_eq(par_zero_geom_owner(&o.geom, i), par_zero_geom_owner(&pl.geom, i));
            PAR_FN(par_zero_plan_free)(&o);
        }
        free(load);
        free(done);
        PAR_FN(par_zero_plan_free)(&pl);
    }
    free(all);
}

/* Each element of the squared norm counted exactly once: rank 0 holds
 * gradient 1 everywhere, the others 0, so the reduced gradient is 1 and the
 * shares must add up to the number of gradient elements (an exact integer). */
typedef struct {
    int dp;
    par_dp_mode mode;
    double share[MAXR];
} count_ctx;

static par_status count_fn(par_comm *world, void *arg)
{
    count_ctx *c = arg;
    const int r = par_comm_rank(world);
    par_status st = PAR_OK;
    plan_t pl;
    memset(&pl, 0, sizeof pl);
    double *g = par_calloc((size_t)tab.n_float, sizeof *g, PAR_TAG_GRAD);
    int *all = par_malloc((size_t)tab.n * sizeof *all, PAR_TAG_MISC);
    if (!g || !all) {
        st = par_err(PAR_ENOMEM, "test: no memory");
        goto done;
    }
    for (int i = 0; i < tab.n; i++) {
        all[i] = i;
        if (r == 0 && tab.p[i].dtype == PAR_PDT_REAL)
            for (int64_t k = 0; k < tab.p[i].numel; k++)
                g[tab.p[i].offset + k] = 1.0;
    }
    TRY(PAR_FN(par_zero_plan_build)(&pl, &tab, all, tab.n, c->dp, r, c->mode));
    TRY(PAR_FN(par_dp_reduce_grads)(&pl, world, g));
    TRY(PAR_FN(par_zero_grad_sumsq)(&pl, &c->share[r]));
done:
    PAR_FN(par_zero_plan_free)(&pl);
    par_free(g);
    par_free(all);
    return st;
}

Test(zero, norm_counts_each_element_once, .init = setup_tiny, .fini = teardown_tiny)
{
    int64_t n_grad = 0;
    for (int i = 0; i < tab.n; i++)
        if (tab.p[i].dtype == PAR_PDT_REAL && tab.p[i].has_grad)
            n_grad += tab.p[i].numel;
    for (int di = 0; di < NDPS; di++)
        for (int mode = 0; mode < 2; mode++) {
            count_ctx c = {.dp = DPS[di], .mode = (par_dp_mode)mode};
            cr_assert_eq(par_world_run(par_backend_find("threads"), c.dp, count_fn, &c, NULL), PAR_OK, "%s",
                         par_last_error());
            double s = 0;
            for (int r = 0; r < c.dp; r++)
                s += c.share[r];
            cr_assert_eq(s, (double)n_grad, "DP %d mode %d: shares add to %.1f, %lld gradient elements", c.dp, mode,
                         s, (long long)n_grad);
        }
}

/* Per-rank memory: ZeRO-1 holds the AdamW shard (2 x ceil(n_adamw/DP)) and
 * its own Muon matrices; the live PAR_TAG_OPTIM bytes agree. */
Test(zero, memory_accounting, .init = setup_tiny, .fini = teardown_tiny)
{
    int *all = malloc((size_t)tab.n * sizeof *all);
    for (int i = 0; i < tab.n; i++)
        all[i] = i;
    printf("\nZeRO-1 optimizer state per rank, v4-tiny (f64, bytes)\n");
    printf("%4s %10s %10s %6s %12s %12s %12s %12s %8s\n", "DP", "n_adamw", "shard", "pad", "muon min", "muon max",
           "rank max", "full/DP", "max/ideal");
    for (int di = 0; di < NDPS; di++) {
        const int dp = DPS[di];
        int64_t full = 0, mx = 0, mn_mu = INT64_MAX, mx_mu = 0, total = 0, n_adamw = 0, shard = 0, largest = 0;
        for (int r = 0; r < dp; r++) {
            plan_t pl;
            int64_t before = par_alloc_live(PAR_TAG_OPTIM);
            cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, all, tab.n, dp, r, PAR_DP_ZERO1), PAR_OK);
            par_zero_memory m;
            PAR_FN(par_zero_memory_of)(&pl, &m);
            cr_assert_eq(par_alloc_live(PAR_TAG_OPTIM) - before, m.adamw_state + m.muon_state,
                         "DP %d rank %d: live optimizer bytes differ from the accounting", dp, r);
            cr_assert_eq(m.adamw_state, 2 * 8 * pl.shard);
            cr_assert_eq(m.muon_state, 8 * pl.load[r]);
            cr_assert(pl.shard * dp >= pl.n_adamw && pl.shard * dp - pl.n_adamw < dp, "padding below DP");
            full = m.full_state;
            n_adamw = pl.n_adamw;
            shard = pl.shard;
            largest = pl.largest;
            int64_t s = m.adamw_state + m.muon_state;
            total += s;
            mx = s > mx ? s : mx;
            mn_mu = m.muon_state < mn_mu ? m.muon_state : mn_mu;
            mx_mu = m.muon_state > mx_mu ? m.muon_state : mx_mu;
            /* replicated holds everything (plus the padding of the flat AdamW) */
            plan_t rp;
            cr_assert_eq(PAR_FN(par_zero_plan_build)(&rp, &tab, all, tab.n, dp, r, PAR_DP_REPLICATED), PAR_OK);
            par_zero_memory rm;
            PAR_FN(par_zero_memory_of)(&rp, &rm);
            cr_assert_eq(rm.adamw_state + rm.muon_state, full + 2 * 8 * (dp * pl.shard - pl.n_adamw));
            PAR_FN(par_zero_plan_free)(&rp);
            PAR_FN(par_zero_plan_free)(&pl);
        }
        cr_assert_eq(total, full + 2 * 8 * (dp * shard - n_adamw), "DP %d: shards do not add up to the full state", dp);
        cr_assert(mx <= (full + dp - 1) / dp + 2 * 8 + 8 * largest, "DP %d: rank max %lld over full/DP %lld + largest matrix", dp,
                  (long long)mx, (long long)(full / dp));
        printf("%4d %10lld %10lld %6lld %12lld %12lld %12lld %12lld %8.3f\n", dp, (long long)n_adamw, (long long)shard,
               (long long)(dp * shard - n_adamw), (long long)mn_mu, (long long)mx_mu, (long long)mx,
               (long long)(full / dp), (double)mx / ((double)full / dp));
    }
    fflush(stdout);
    free(all);
}

/* Checkpoint round trip with resharding: 2 steps at DP 3, gather state and
 * params, restart at DP 2 (and replicated DP 4) from them for step 3: equal
 * to 3 serial steps, bitwise. */
Test(zero, state_gather_load_reshard, .init = setup_tiny, .fini = teardown_tiny)
{
    const double scale = 1e-4;
    double *w0 = alloc_flat();
    init_params(w0);
    double *ws = alloc_flat(), *ms = alloc_flat(), *vs = alloc_flat(), sn[3];
    memcpy(ws, w0, (size_t)tab.n_float * sizeof *ws);
    const int dps[3] = {3, 3, 2};
    serial_run(ws, ms, vs, 1, 3, dps, scale, 0, sn);

    run_ctx a = {.dp = 3, .mode = PAR_DP_ZERO1, .scale = scale, .first = 1, .n = 2, .w0 = w0};
    run_parallel(&a);
    run_ctx b = {.dp = 2, .mode = PAR_DP_ZERO1, .scale = scale, .first = 3, .n = 1, .w0 = a.out_w[0],
                 .m0 = a.m_full, .v0 = a.v_full};
    run_parallel(&b);
    compare_flat(b.out_w[1], ws, -1.0, 1, 0, 0, "resharded ZeRO-1 params vs serial");
    compare_flat(b.m_full, ms, -1.0, 0, 0, 1, "resharded ZeRO-1 m vs serial");
    compare_flat(b.v_full, vs, -1.0, 0, 0, 1, "resharded ZeRO-1 v vs serial");
    free_run(&b);
    /* the same state into replicated plans of another size gives the same */
    const int dps4[3] = {3, 3, 4};
    memcpy(ws, w0, (size_t)tab.n_float * sizeof *ws);
    memset(ms, 0, (size_t)tab.n_float * sizeof *ms);
    memset(vs, 0, (size_t)tab.n_float * sizeof *vs);
    serial_run(ws, ms, vs, 1, 3, dps4, scale, 0, sn);
    run_ctx c = {.dp = 4, .mode = PAR_DP_REPLICATED, .scale = scale, .first = 3, .n = 1, .w0 = a.out_w[2],
                 .m0 = a.m_full, .v0 = a.v_full};
    run_parallel(&c);
    compare_flat(c.out_w[3], ws, -1.0, 3, 0, 0, "replicated DP 4 after ZeRO-1 DP 3 vs serial");
    compare_flat(c.m_full, ms, -1.0, 0, 0, 1, "replicated m vs serial");
    free_run(&c);
    free_run(&a);
    par_free(w0);
    par_free(ws);
    par_free(ms);
    par_free(vs);
}

/* Misuse gives the documented codes, not a hang or corrupt memory. */
typedef struct {
    par_status reduce_twice_ok, apply_early, sumsq_early, step0, bad_root, wrong_mode, wrong_size;
} err_ctx;

static par_status err_fn(par_comm *world, void *arg)
{
    err_ctx *c = arg;
    par_status st = PAR_OK;
    plan_t pl, big;
    memset(&pl, 0, sizeof pl);
    memset(&big, 0, sizeof big);
    double *w = par_calloc((size_t)tab.n_float, sizeof *w, PAR_TAG_PARAM);
    int one = tab.top.embed;
    double s;
    TRY(PAR_FN(par_zero_plan_build)(&pl, &tab, &one, 1, par_comm_size(world), par_comm_rank(world), PAR_DP_ZERO1));
    c->apply_early = PAR_FN(par_dp_apply)(&pl, world, w, &cfg, 1, 1.0);
    c->sumsq_early = PAR_FN(par_zero_grad_sumsq)(&pl, &s);
    TRY(PAR_FN(par_dp_reduce_grads)(&pl, world, w));
    c->step0 = PAR_FN(par_dp_apply)(&pl, world, w, &cfg, 0, 1.0);
    c->bad_root = PAR_FN(par_zero_state_gather)(&pl, world, 5, w, w);
    c->wrong_mode = PAR_FN(par_dp_step_replicated)(&pl, world, w, w, &cfg, 1, NULL);
    TRY(PAR_FN(par_zero_plan_build)(&big, &tab, &one, 1, par_comm_size(world) + 1, 0, PAR_DP_ZERO1));
    c->wrong_size = PAR_FN(par_dp_reduce_grads)(&big, world, w);
    c->reduce_twice_ok = PAR_FN(par_zero_step)(&pl, world, w, w, &cfg, 1, NULL);
done:
    PAR_FN(par_zero_plan_free)(&pl);
    PAR_FN(par_zero_plan_free)(&big);
    par_free(w);
    return st;
}

/* The untemplated geometry (zero_plan.h): built alone it equals the plan's;
 * the pieces of every rank tile each optimized tensor exactly once (AdamW cut
 * at the shard borders, Muon whole on its owner); memory by mode and width. */
Test(zero, geometry_pieces_tile_every_tensor, .init = setup_tiny, .fini = teardown_tiny)
{
    int *all = malloc((size_t)tab.n * sizeof *all);
    for (int i = 0; i < tab.n; i++)
        all[i] = i;
    const int sizes[] = {1, 2, 3, 7, 64};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int dp = sizes[si];
        par_zero_geom g;
        plan_t pl;
        cr_assert_eq(par_zero_geom_build(&g, &tab, all, tab.n, dp, dp - 1), PAR_OK, "%s", par_last_error());
        cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, all, tab.n, dp, dp - 1, PAR_DP_ZERO1), PAR_OK);
        cr_assert_eq(g.n, pl.n);
        cr_assert_eq(g.shard, pl.shard);
        cr_assert_eq(g.seg, pl.seg);
        for (int k = 0; k < g.n; k++)
            cr_assert(g.e[k].idx == pl.e[k].idx && g.e[k].owner == pl.e[k].owner && g.e[k].pos == pl.e[k].pos &&
                      g.e[k].numel == pl.e[k].numel, "DP %d: entry %d differs", dp, k);
        for (int i = 0; i < tab.n; i++) {
            const par_param *p = &tab.p[i];
            const int owner = par_zero_geom_owner(&g, i);
            int64_t next = 0, pieces = 0;
            for (int q = 0; q < dp; q++) {
                int64_t b, e;
                if (!par_zero_geom_piece(&g, i, q, &b, &e))
                    continue;
                cr_assert_eq(b, next, "DP %d: '%s' piece of rank %d starts at %lld, expected %lld", dp, p->name, q,
                             (long long)b, (long long)next);
                cr_assert_gt(e, b);
                if (owner >= 0)
                    cr_assert_eq(q, owner, "DP %d: Muon '%s' has a piece on rank %d, owner %d", dp, p->name, q,
                                 owner);
                next = e;
                pieces++;
            }
            if (owner == PAR_ZERO_ABSENT)
                cr_assert_eq(pieces, 0, "'%s' has no optimizer but %lld pieces", p->name, (long long)pieces);
            else
                cr_assert_eq(next, p->numel, "DP %d: the pieces of '%s' end at %lld of %lld", dp, p->name,
                             (long long)next, (long long)p->numel);
        }
        int64_t b, e;
        cr_assert_eq(par_zero_geom_piece(&g, tab.top.embed, dp, &b, &e), 0);
        cr_assert_eq(b | e, 0);
        par_zero_memory gm, pm;
        par_zero_geom_memory(&g, PAR_DP_ZERO1, (int64_t)sizeof(par_real), &gm);
        PAR_FN(par_zero_memory_of)(&pl, &pm);
        cr_assert_eq(memcmp(&gm, &pm, sizeof gm), 0, "DP %d: memory differs", dp);
        par_zero_geom_memory(&g, PAR_DP_REPLICATED, 4, &gm);
        cr_assert_eq(gm.adamw_state, 2 * 4 * (int64_t)dp * g.shard);
        cr_assert_eq(gm.muon_state, 4 * g.n_muon);
        PAR_FN(par_zero_plan_free)(&pl);
        par_zero_geom_free(&g);
        cr_assert_null(g.e);
    }
    free(all);
}

Test(zero, errors, .init = setup_tiny, .fini = teardown_tiny)
{
    plan_t pl;
    int dup[2] = {tab.top.embed, tab.top.embed};
    cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, dup, 2, 2, 0, PAR_DP_ZERO1), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "listed twice") != NULL, "%s", par_last_error());
    int bad = tab.n;
    cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, &bad, 1, 2, 0, PAR_DP_ZERO1), PAR_ERANGE);
    cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, dup, 1, 2, 2, PAR_DP_ZERO1), PAR_ERANGE);
    cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, dup, 1, 0, 0, PAR_DP_ZERO1), PAR_EINVAL);
    /* an empty plan (or only tensors without optimizer) is fine and communicates nothing */
    int none = tab.blocks[1].gate_bias >= 0 ? tab.blocks[1].gate_bias : tab.blocks[2].gate_bias;
    cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &tab, &none, 1, 3, 1, PAR_DP_ZERO1), PAR_OK);
    cr_assert_eq(pl.n, 0);
    cr_assert_eq(par_zero_geom_owner(&pl.geom, none), PAR_ZERO_ABSENT);
    PAR_FN(par_zero_plan_free)(&pl);

    err_ctx c;
    cr_assert_eq(par_world_run(par_backend_find("threads"), 2, err_fn, &c, NULL), PAR_OK, "%s", par_last_error());
    cr_assert_eq(c.apply_early, PAR_EINVAL);
    cr_assert_eq(c.sumsq_early, PAR_EINVAL);
    cr_assert_eq(c.step0, PAR_EINVAL);
    cr_assert_eq(c.bad_root, PAR_ERANGE);
    cr_assert_eq(c.wrong_mode, PAR_EINVAL);
    cr_assert_eq(c.wrong_size, PAR_EINVAL);
    cr_assert_eq(c.reduce_twice_ok, PAR_OK);
}
