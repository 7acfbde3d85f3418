/* tests/parallel/dp/test_zero_run.c - the driver's optimizer step (parallel/
 * dp_step.h): replicated DP and ZeRO-1 (--use-distributed-optimizer) against
 * the serial golden (parameters AND optimizer state after every step), the
 * two modes bitwise equal, the per-rank memory accounting. v4-tiny, f64,
 * threads backend, 3 steps. */
#include <criterion/criterion.h>

#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "parallel/train/run.h"

#define STEPS 3

static void golden(const char *out)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = STEPS;
    o.out_dir = out;
    cr_assert_eq(par_golden_run(&o, NULL), 0, "%s", par_last_error());
}

typedef struct {
    int64_t world, ep, zero;
    const char *backend;
    int private_replicas; /* 1: every rank its own dense copy (parallel/dp/replicas.h) */
} lay;

static par_status run(const char *dump, lay l, par_run_summary *sum)
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = STEPS;
    o.backend = par_backend_find(l.backend ? l.backend : "threads");
    cr_assert(o.backend);
    o.layout.world = l.world;
    o.layout.ep = l.ep ? l.ep : 1;
    o.layout.distributed_optimizer = (int)l.zero;
    o.private_replicas = l.private_replicas;
    o.dump_dir = dump;
    return par_run(&o, sum);
}

/* Compares two sets under `policy`; counts the optimizer-state entries
 * checked (opt.* in params.K, K >= 1). */
static void compare(const char *a, const char *b, par_policy policy, const char *what)
{
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = policy;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(a, b, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "%s: %d failing entries", what, par_compare_report_failed(r));
    int opt = 0, files[STEPS + 1] = {0};
    for (int i = 0; i < par_compare_report_count(r); i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (strncmp(e->tensor, "opt.", 4))
            continue;
        opt++;
        int k = -1;
        if (sscanf(e->file, "params.%d.safetensors", &k) == 1 && k >= 0 && k <= STEPS)
            files[k]++;
    }
    for (int k = 1; k <= STEPS; k++)
        cr_expect_gt(files[k], 100, "%s: optimizer state of params.%d compared (%d entries)", what, k, files[k]);
    cr_expect_eq(files[0], 0);
    cr_expect_gt(opt, 300);
    par_compare_report_free(r);
}

static void cell(lay l)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "run");
    golden(g);
    cr_assert_eq(run(d, l, NULL), 0, "%s", par_last_error());
    compare(g, d, PAR_POLICY_F64, "against the serial golden");
    rmtree(t);
    free(t), free(g), free(d);
}

/* (replicated DP against the golden: tests/parallel/dp/test_dp.c; EP8 and DP8 replicated with ZeRO-1
 * on v4-mini: tools/dp-ckpt-accept.sh) */
Test(zero_run, dp8_zero1) { cell((lay){.world = 8, .zero = 1}); }
Test(zero_run, ep4_de2_zero1) { cell((lay){.world = 8, .ep = 4, .zero = 1}); }

/* Both modes reduce the same sums and partition the norm the same way:
 * the whole set (gradients, norm, parameters, state) is bitwise equal. */
Test(zero_run, zero1_equals_replicated_bitwise)
{
    char *t = mktmp(), *a = sub(t, "rep"), *b = sub(t, "zero");
    cr_assert_eq(run(a, (lay){.world = 4, .ep = 2}, NULL), 0, "%s", par_last_error());
    cr_assert_eq(run(b, (lay){.world = 4, .ep = 2, .zero = 1}, NULL), 0, "%s", par_last_error());
    compare(a, b, PAR_POLICY_BITWISE, "ZeRO-1 vs replicated");
    rmtree(t);
    free(t), free(a), free(b);
}

/* One rank: the per-entry norm is the serial par_grad_sumsq bit for bit,
 * so ZeRO-1 at N = 1 is the serial reference everywhere. */
Test(zero_run, world_of_one_zero1_is_bitwise_serial)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "n1");
    golden(g);
    cr_assert_eq(run(d, (lay){.world = 1, .zero = 1, .backend = "self"}, NULL), 0, "%s", par_last_error());
    compare(g, d, PAR_POLICY_BITWISE, "N = 1 ZeRO-1 vs serial");
    rmtree(t);
    free(t), free(g), free(d);
}

/* ZeRO-1 divides the optimizer state by the DP size (up to the AdamW
 * padding and one Muon matrix); replicated keeps it whole on every rank
 * (each rank its own copy here: the shared copy is the process's, in no
 * rank's account, tests/parallel/dp/test_replicas.c). */
Test(zero_run, memory_accounting_divides_the_state_by_dp)
{
    par_run_summary rs, zs;
    cr_assert_eq(run(NULL, (lay){.world = 8, .private_replicas = 1}, &rs), 0, "%s", par_last_error());
    cr_assert_eq(run(NULL, (lay){.world = 8, .zero = 1, .private_replicas = 1}, &zs), 0, "%s", par_last_error());
    cr_assert(rs.mem && zs.mem);
    int64_t full = rs.mem[PAR_RUN_MEM * 0 + 3], sum_z = 0;
    cr_expect_gt(full, 0);
    for (int r = 0; r < 8; r++) {
        const int64_t *R = rs.mem + PAR_RUN_MEM * r, *Z = zs.mem + PAR_RUN_MEM * r;
        cr_expect_geq(R[2], R[3], "replicated: rank %d holds the whole state", r);
        cr_expect_leq(R[2] - R[3], 2 * 8 * 8, "replicated: only the AdamW padding (< DP per slot) on top");
        cr_expect_eq(Z[3], full, "the unsharded state is the same");
        cr_expect_lt(Z[2], full / 8 + full / 20, "rank %d: ZeRO-1 state %lld, full/8 = %lld", r, (long long)Z[2],
                     (long long)(full / 8));
        cr_expect_gt(Z[2], full / 8 - full / 20);
        cr_expect_eq(R[0], Z[0], "weights are not sharded");
        cr_expect_eq(R[1], Z[1], "gradients are not sharded");
        cr_expect_gt(Z[4], 0, "activations accounted");
        cr_expect_gt(Z[5], 0, "workspace accounted");
        sum_z += Z[2];
    }
    cr_expect_geq(sum_z, full, "the shards cover the state");
    cr_expect_lt(sum_z, full + full / 10, "padding and Muon imbalance stay small");
    par_run_summary_free(&rs);
    par_run_summary_free(&zs);
}

Test(zero_run, nothing_left_allocated)
{
    int64_t before = par_alloc_live_total();
    cr_assert_eq(run(NULL, (lay){.world = 4, .ep = 2, .zero = 1}, NULL), 0, "%s", par_last_error());
    cr_expect_eq(par_alloc_live_total(), before, "live bytes %lld -> %lld", (long long)before,
                 (long long)par_alloc_live_total());
}
