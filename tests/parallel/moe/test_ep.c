/* tests/parallel/moe/test_ep.c - expert parallelism with MoE parallel folding on
 * the threads backend against the serial golden (v4-tiny: E = 8): EP2, EP4,
 * EP8 at De = 1, EP4 with De = 2; invalid layouts; the EP report. */
#include <criterion/criterion.h>

#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "parallel/train/run.h"

static void golden(const char *out)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = 2;
    o.seed = 1234;
    o.out_dir = out;
    cr_assert_eq(par_golden_run(&o, NULL), 0, "%s", par_last_error());
}

typedef struct {
    int64_t world, ep, cp, pp;
} lay;

static par_status run(const char *dump, lay l, par_run_summary *sum)
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = 2;
    o.seed = 1234;
    o.backend = par_backend_find("threads");
    o.layout.world = l.world;
    o.layout.ep = l.ep;
    o.layout.cp = l.cp ? l.cp : 1;
    o.layout.pp = l.pp ? l.pp : 1;
    o.dump_dir = dump;
    return par_run(&o, sum);
}

/* f64 policy everywhere; step 0's forward bitwise; with De = 1 the routed
 * experts' weight gradients too (each expert's rows arrive in global token
 * order: the same GEMM as the serial layer). */
static void check(const char *g, const char *d, int de)
{
    par_compare_opts co;
    par_compare_opts_init(&co);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "%d failing entries", par_compare_report_failed(r));
    par_compare_report_free(r);
    co.policy = PAR_POLICY_BITWISE;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    int fwd = 0, egrad = 0;
    for (int i = 0; i < par_compare_report_count(r); i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (strcmp(e->file, "step.0.safetensors"))
            continue;
        if (!strncmp(e->tensor, "grad.", 5)) {
            if (de == 1 && strstr(e->tensor, ".ffn.experts.")) {
                egrad++;
                cr_expect(e->pass, "De = 1: %s differs: %s", e->tensor, e->reason);
            }
            continue;
        }
        if (!strcmp(e->tensor, "out.grad_norm"))
            continue;
        fwd++;
        cr_expect(e->pass, "step 0 forward tensor %s differs: %s", e->tensor, e->reason);
    }
    cr_expect_gt(fwd, 10);
    if (de == 1)
        cr_expect_eq(egrad, 4 * 8 * 3, "every routed expert gradient checked");
    par_compare_report_free(r);
}

static void cell(lay l, int64_t de)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "run");
    golden(g);
    par_run_summary sum;
    cr_assert_eq(run(d, l, &sum), 0, "%s", par_last_error());
    cr_expect_eq(sum.layout.ep, l.ep);
    cr_expect_eq(sum.layout.de, de);
    cr_expect_eq(sum.layout.world, l.world ? l.world : l.ep);
    /* every token-slot row is received exactly once per block and step:
     * B*S*K rows x 4 blocks x 2 steps over the ranks */
    double rows = 8.0 * 64 * 2 * 4 * 2;
    cr_expect(sum.recv_mean * (double)sum.layout.world == rows, "rows received %g, expected %g",
              sum.recv_mean * (double)sum.layout.world, rows);
    cr_expect_leq(sum.recv_min, sum.recv_max);
    cr_expect_gt(sum.dispatch_bytes, 0);
    cr_expect_gt(sum.combine_bytes, 0);
    cr_expect_lt(sum.max_rank_floats, sum.n_params, "a rank holds only its experts");
    cr_expect_eq(sum.load_mean, 8.0 * 64 * 2 * 2 / 8, "mean tokens per expert per block over 2 steps");
    cr_expect_geq(sum.load_hot_tokens, (int64_t)sum.load_mean);
    int64_t h = 0;
    for (int i = 0; i < PAR_RUN_HIST; i++)
        h += sum.hist[i];
    cr_expect_eq(h, 4 * 8, "histogram counts every (block, expert)");
    par_run_summary_free(&sum);
    check(g, d, (int)de);
    rmtree(t);
    free(t), free(g), free(d);
}

Test(ep, ep2) { cell((lay){.ep = 2}, 1); }
Test(ep, ep4) { cell((lay){.ep = 4}, 1); }
Test(ep, ep8) { cell((lay){.ep = 8}, 1); }
Test(ep, ep4_de2) { cell((lay){.ep = 4, .world = 8}, 2); }

static void refused(lay l, par_status want, const char *const *needles)
{
    par_status s = run(NULL, l, NULL);
    cr_expect_eq(s, want, "status %d, message: %s", (int)s, par_last_error());
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(par_last_error(), needles[i]), "'%s' not in: %s", needles[i], par_last_error());
}

Test(ep, invalid_layouts_name_the_numbers)
{
    par_err_set_quiet(1);
    refused((lay){.ep = 3}, PAR_EINVAL,
            (const char *const[]){"expert-model-parallel-size 3", "n_routed_experts 8", NULL});
    refused((lay){.ep = 4, .world = 2}, PAR_EINVAL,
            (const char *const[]){"expert-model-parallel-size 4", "N/PP = 2/1 = 2", NULL});
    refused((lay){.ep = 4, .world = 6}, PAR_EINVAL,
            (const char *const[]){"world size 6", "PP*ETP*EP = 1*1*4 = 4", "N/PP = ETP*EP*De", NULL});
    /* CP is supported (test_cp_run.c); its S/CP >= D_window rule still applies */
    refused((lay){.ep = 2, .world = 8, .cp = 8}, PAR_EINVAL,
            (const char *const[]){"context-parallel-size 8", "S/CP = 64/8 = 8", "D_window = 16", NULL});
}
