/* tests/parallel/cp/test_cp_run.c - context parallelism in the training driver
 * (parallel/cp/cp_hook.h) on the threads backend against the serial golden of
 * the same data and seed: every v4-tiny boundary fixture at CP2 and CP4,
 * random packings with CP x DP and CP x EP (MoE parallel folding), a user
 * data file, the D_window rule, the traffic counters and the emulated
 * network. */
#include <criterion/criterion.h>

#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/clock.h"
#include "comm/netmodel.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "parallel/train/run.h"

typedef struct {
    const char *fixture, *data;
    uint64_t seed;
    int64_t B; /* global batch (0: the preset's) */
} src;

static void golden(const char *out, src d)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = 2;
    o.seed = d.seed;
    o.fixture = d.fixture;
    o.data_path = d.data;
    if (d.B)
        o.cfg.global_batch_size = d.B;
    o.out_dir = out;
    cr_assert_eq(par_golden_run(&o, NULL), 0, "%s", par_last_error());
}

static par_status run(const char *dump, src d, int64_t world, int64_t cp, int64_t ep, const par_netmodel *net,
                      par_run_summary *sum)
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = 2;
    o.seed = d.seed;
    o.fixture = d.fixture;
    o.data_path = d.data;
    o.backend = par_backend_find("threads");
    cr_assert(o.backend);
    o.layout.world = world;
    o.layout.cp = cp;
    o.layout.ep = ep;
    o.layout.global_batch = d.B;
    o.dump_dir = dump;
    o.netmodel = net;
    o.net_spans = net != NULL;
    return par_run(&o, sum);
}

/* GOLDEN.md's f64 policy on everything (integers: routing, loads and the
 * indexer's selections exactly equal); then step 0's forward bit for bit,
 * except the losses: CE and aux partial sums of a sample split across CP
 * ranks are added in rank order (docs/parallel.md). */
static void check(const char *g, const char *d, const char *what)
{
    par_compare_opts co;
    par_compare_opts_init(&co);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "%s: %d failing entries", what, par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 100);
    par_compare_report_free(r);
    co.policy = PAR_POLICY_BITWISE;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    int checked = 0, sel = 0, idx = 0;
    for (int i = 0; i < par_compare_report_count(r); i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (strstr(e->tensor, ".selected")) {
            sel++;
            cr_expect(e->pass, "%s: %s %s differs: %s", what, e->file, e->tensor, e->reason);
        }
        if (strstr(e->tensor, "router.") && strstr(e->tensor, ".idx")) {
            idx++;
            cr_expect(e->pass, "%s: %s %s differs: %s", what, e->file, e->tensor, e->reason);
        }
        if (strcmp(e->file, "step.0.safetensors") || !strncmp(e->tensor, "grad.", 5) ||
            !strncmp(e->tensor, "out.loss", 8) || !strcmp(e->tensor, "out.grad_norm"))
            continue;
        checked++;
        cr_expect(e->pass, "%s: step 0 forward tensor %s differs: %s", what, e->tensor, e->reason);
    }
    cr_expect_gt(checked, 10);
    cr_expect_gt(sel, 0, "%s: no attn.*.selected compared", what);
    cr_expect_gt(idx, 0, "%s: no router.*.idx compared", what);
    par_compare_report_free(r);
}

static void fixture_cells(const char *fx)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "run");
    src s = {.fixture = fx, .seed = 1234};
    golden(g, s);
    for (int64_t cp = 2; cp <= 4; cp *= 2) {
        char what[96];
        snprintf(what, sizeof what, "%s cp%lld", fx, (long long)cp);
        cr_assert_eq(run(d, s, 0, cp, 1, NULL, NULL), 0, "%s: %s", what, par_last_error());
        check(g, d, what);
        rmtree(d);
    }
    rmtree(t);
    free(t), free(g), free(d);
}

Test(cp_run, boundary_mix) { fixture_cells("tiny-boundary-mix"); }
Test(cp_run, full_row) { fixture_cells("tiny-full-row"); }
Test(cp_run, half_boundary) { fixture_cells("tiny-half-boundary"); }
Test(cp_run, mult16) { fixture_cells("tiny-mult16"); }
Test(cp_run, odd_lengths) { fixture_cells("tiny-odd-lengths"); }
Test(cp_run, quarter_boundary) { fixture_cells("tiny-quarter-boundary"); }
Test(cp_run, short_sample) { fixture_cells("tiny-short-sample"); }
Test(cp_run, tiny_runs) { fixture_cells("tiny-tiny-runs"); }
Test(cp_run, window_exact) { fixture_cells("tiny-window-exact"); }

/* Random packings (the generator's plan from the seed): CP x DP and CP x EP
 * with MoE parallel folding (N = CP*Da = EP*De). */
Test(cp_run, random_packings_with_dp_and_ep)
{
    static const int64_t cells[][3] = {{4, 2, 1}, {8, 2, 4}, {8, 4, 8}, {8, 4, 2}}; /* N, CP, EP */
    static const uint64_t seeds[] = {7, 2024};
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
        char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "run");
        src s = {.seed = seeds[k]};
        golden(g, s);
        for (size_t c = 0; c < sizeof cells / sizeof cells[0]; c++) {
            char what[96];
            snprintf(what, sizeof what, "seed %llu N%lld cp%lld ep%lld", (unsigned long long)seeds[k],
                     (long long)cells[c][0], (long long)cells[c][1], (long long)cells[c][2]);
            par_run_summary sum;
            cr_assert_eq(run(d, s, cells[c][0], cells[c][1], cells[c][2], NULL, &sum), 0, "%s: %s", what,
                         par_last_error());
            cr_expect_eq(sum.layout.cp, cells[c][1]);
            cr_expect_eq(sum.layout.da, cells[c][0] / cells[c][1]);
            par_run_summary_free(&sum);
            check(g, d, what);
            rmtree(d);
        }
        rmtree(t);
        free(t), free(g), free(d);
    }
}

/* --data: any packing a user brings (here the 8 rows of a fixture's golden
 * input, read back as a data file: 2 steps of 4 rows). */
Test(cp_run, user_data_file)
{
    char *t = mktmp(), *g0 = sub(t, "g0"), *g = sub(t, "golden"), *d = sub(t, "run");
    golden(g0, (src){.fixture = "tiny-odd-lengths", .seed = 5});
    char *file = sub(g0, "step.0.safetensors");
    src s = {.data = file, .seed = 99, .B = 4};
    golden(g, s);
    cr_assert_eq(run(d, s, 4, 4, 1, NULL, NULL), 0, "%s", par_last_error());
    check(g, d, "data file cp4");
    rmtree(t);
    free(t), free(g0), free(g), free(d), free(file);
}

/* S/CP < D_window: v4-tiny S = 64, D_window = 16 (compress ratio 16), so
 * CP = 8 leaves 8 local rows. */
Test(cp_run, local_rows_below_d_window_fail_with_the_message)
{
    par_err_set_quiet(1);
    par_status s = run(NULL, (src){.seed = 1234}, 0, 8, 1, NULL, NULL);
    par_err_set_quiet(0);
    cr_expect_eq(s, PAR_EINVAL);
    const char *m = par_last_error();
    cr_expect(strstr(m, "S/CP = 64/8 = 8") && strstr(m, "D_window = 16"), "message: %s", m);
}

/* Traffic: the halo of every layer is rows x D x d reals each way
 * (parallel/cp/cp.h): CP2, 8 rows, d = 32, D = 8, 8, 16 (m = 0, 4, 16) and 8
 * (the MTP block, m = 0): 8*40*32*8 bytes per direction per step.  With the
 * emulated network the CP group's traffic is charged (NVLink, one node). */
Test(cp_run, traffic_and_emulated_network)
{
    par_netmodel m;
    cr_assert_eq(par_netmodel_preset("reference", &m), 0);
    par_run_summary sum;
    cr_assert_eq(run(NULL, (src){.seed = 1234}, 2, 2, 1, &m, &sum), 0, "%s", par_last_error());
    cr_expect_eq(sum.cp_halo_bytes, 2 * 2 * 8 * 40 * 32 * 8, "halo bytes %lld", (long long)sum.cp_halo_bytes);
    cr_expect_gt(sum.cp_gather_bytes, 0);
    cr_expect_gt(sum.cp_rs_bytes, 0);
    cr_assert(sum.net);
    const par_rankstats *r0 = par_netrun_stats(sum.net, 0);
    cr_assert(r0);
    cr_expect_gt(r0->bytes[PAR_TIER_NVLINK], 0);
    cr_expect_gt(r0->comm_s, 0);
    size_t n = 0, lost = 0, cp_spans = 0;
    const par_span *sp = par_netrun_spans(sum.net, 1, &n, &lost);
    for (size_t i = 0; i < n; i++)
        cp_spans += !strncmp(sp[i].group, "cp:", 3) && sp[i].bytes > 0;
    cr_expect_gt(cp_spans, 0, "no span of the CP group on rank 1");
    par_run_summary_free(&sum);
}
