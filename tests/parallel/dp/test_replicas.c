/* tests/parallel/dp/test_replicas.c - the dense state the ranks of one process
 * hold once (parallel/dp/replicas.h): the process's allocator shows one copy
 * per dense replica group instead of one per rank, a copy's update is
 * written once per step, and the run is bitwise the run where every rank
 * holds its own copy (dumps, losses, the emulated clock), on threads and
 * fiber, replicated and ZeRO-1, and through a checkpoint load.  v4-tiny,
 * f64, small worlds. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/clock.h"
#include "comm/netmodel.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/compare.h"
#include "model/config.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/train/run.h"
#include "parallel/dp/replicas.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(replicas, .init = quiet);

typedef struct {
    int64_t world, pp, ep, zero;
    const char *backend, *layout;
    int private_replicas;
    int64_t steps;
} lay;

static void opts_of(const lay *L, par_run_opts *o)
{
    par_run_opts_init(o);
    cr_assert_eq(par_config_preset(&o->cfg, "v4-tiny"), PAR_OK);
    o->backend = par_backend_find(L->backend ? L->backend : "threads");
    cr_assert(o->backend);
    o->steps = L->steps ? L->steps : 2;
    o->layout.world = L->world;
    o->layout.pp = L->pp ? L->pp : 1;
    o->layout.ep = L->ep ? L->ep : 1;
    o->layout.distributed_optimizer = (int)L->zero;
    if (L->layout) {
        cr_assert_eq(par_layout_set_schedule(&o->layout, "1f1b"), PAR_OK);
        cr_assert_eq(par_layout_set_pp_layout(&o->layout, L->layout), PAR_OK);
    }
    o->private_replicas = L->private_replicas;
    o->progress = 0;
}

static char *mktmp(void)
{
    char tpl[] = "/tmp/parity-replicas-XXXXXX";
    char *d = mkdtemp(tpl);
    cr_assert(d);
    return strdup(d);
}

static char *sub(const char *d, const char *n)
{
    char *p = malloc(strlen(d) + strlen(n) + 2);
    sprintf(p, "%s/%s", d, n);
    return p;
}

static void rmtree(const char *d)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0);
}

/* The dumps a and b hold the same bits, tensor by tensor. */
static void same_bits(const char *a, const char *b, const char *what)
{
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_BITWISE;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(a, b, &co, &r), 0, "%s", par_last_error());
    cr_expect(par_compare_report_ok(r), "%s: %d entries differ", what, par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 100, "%s: compared %d entries", what, par_compare_report_count(r));
    par_compare_report_free(r);
}

/* One run of L (dump into dump unless NULL, with the reference network);
 * *param_peak = the process's peak of param bytes, *phases = write phases
 * the shared copies published. */
static void run(const lay *L, const char *dump, par_run_summary *sum, int64_t *param_peak, int64_t *phases)
{
    par_run_opts o;
    opts_of(L, &o);
    o.dump_dir = dump;
    par_netmodel nm;
    cr_assert_eq(par_netmodel_preset("reference", &nm), PAR_OK);
    o.netmodel = &nm;
    par_alloc_reset_peaks();
    int64_t ph0 = PAR_FN(par_replicas_phases)();
    cr_assert_eq(par_run(&o, sum), PAR_OK, "%s", par_last_error());
    *param_peak = par_alloc_peak(PAR_TAG_PARAM);
    *phases = PAR_FN(par_replicas_phases)() - ph0;
}

/* Shared against private: the same bits and emulated clocks; the process
 * holds copies fewer copies of the dense weights; `copies` write phases
 * per step. */
static void shared_vs_private(lay L, int copies)
{
    char *t = mktmp(), *a = sub(t, "private"), *b = sub(t, "shared");
    par_run_summary ps, ss;
    int64_t pp, sp, pph, sph;
    L.private_replicas = 1;
    run(&L, a, &ps, &pp, &pph);
    L.private_replicas = 0;
    run(&L, b, &ss, &sp, &sph);
    same_bits(a, b, "shared vs private dense copies");
    cr_expect_eq(pph, 0, "private copies publish nothing");
    cr_expect_eq(sph, copies * ps.steps, "one write per copy and step: %lld phases", (long long)sph);
    /* the emulated clock is the private run's, rank by rank (the skipped update's work is charged) */
    cr_assert(ps.net && ss.net);
    for (int r = 0; r < (int)L.world; r++) {
        const par_rankstats *x = par_netrun_stats(ps.net, r), *y = par_netrun_stats(ss.net, r);
        cr_assert(x && y);
        cr_expect_eq(memcmp(x, y, sizeof *x), 0, "rank %d: emulated %.17g vs %.17g s, compute %.17g vs %.17g", r,
                     x->total_s, y->total_s, x->compute_s, y->compute_s);
    }
    /* weights: each rank gives up its dense part, the process holds `copies` of them */
    int64_t dense = 0;
    for (int r = 0; r < (int)L.world; r++) {
        int64_t d = ps.mem[PAR_RUN_MEM * r + 0] - ss.mem[PAR_RUN_MEM * r + 0];
        cr_expect_gt(d, 0, "rank %d holds no dense weights of its own", r);
        dense += d;
    }
    cr_expect_eq(pp - sp, dense - dense * copies / L.world,
                 "process param peak %lld -> %lld bytes: expected %lld less (%d copies)", (long long)pp,
                 (long long)sp, (long long)(dense - dense * copies / L.world), copies);
    par_run_summary_free(&ps);
    par_run_summary_free(&ss);
    rmtree(t);
    free(t), free(a), free(b);
}

Test(replicas, dp4_threads_one_copy) { shared_vs_private((lay){.world = 4}, 1); }
Test(replicas, ep4_fiber_one_copy) { shared_vs_private((lay){.world = 4, .ep = 4, .backend = "fiber"}, 1); }
Test(replicas, dp4_zero1_one_copy) { shared_vs_private((lay){.world = 4, .ep = 2, .zero = 1}, 1); }
Test(replicas, pp2_dp2_two_copies) { shared_vs_private((lay){.world = 4, .pp = 2, .layout = "Et*2|tmL"}, 2); }

/* A checkpoint loaded into the shared copy by its writer alone: the
 * resumed run is bitwise the private one (replicated and ZeRO-1). */
static void load_chain(int zero)
{
    char *t = mktmp(), *ck = sub(t, "ck"), *a = sub(t, "private"), *b = sub(t, "shared");
    lay L = {.world = 4, .zero = zero, .steps = 1, .private_replicas = 1};
    par_run_opts o;
    opts_of(&L, &o);
    o.save_dir = ck;
    cr_assert_eq(par_run(&o, NULL), PAR_OK, "%s", par_last_error());
    par_ckpt *c = NULL;
    cr_assert_eq(par_ckpt_open(ck, &c), PAR_OK, "%s", par_last_error());
    for (int shared = 0; shared < 2; shared++) {
        lay R = {.world = 4, .ep = 2, .zero = zero, .steps = 3, .private_replicas = !shared};
        opts_of(&R, &o);
        o.load = c;
        o.dump_dir = shared ? b : a;
        int64_t ph0 = PAR_FN(par_replicas_phases)();
        cr_assert_eq(par_run(&o, NULL), PAR_OK, "%s", par_last_error());
        cr_expect_eq(PAR_FN(par_replicas_phases)() - ph0, shared ? 1 + 2 : 0, "the load and two updates");
    }
    par_ckpt_close(c);
    same_bits(a, b, "resumed: shared vs private");
    rmtree(t);
    free(t), free(ck), free(a), free(b);
}

Test(replicas, load_replicated) { load_chain(0); }
Test(replicas, load_zero1) { load_chain(1); }
