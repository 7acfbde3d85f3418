/* tests/parallel/test_dp.c - data parallelism (replicated experts, EP = 1) on
 * the threads backend against the serial golden of the same data and seed;
 * the model's ownership variant (parallel/driver.h, model/model.h). */
#include <criterion/criterion.h>

#include "golden_check.h"
#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "model/model.h"
#include "parallel/driver.h"

static void tiny(par_config *c)
{
    cr_assert_eq(par_config_preset(c, "v4-tiny"), 0);
}

static void golden(const char *out, int precision)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    tiny(&o.cfg);
    o.steps = 2;
    o.seed = 1234;
    o.precision = precision;
    o.out_dir = out;
    cr_assert_eq(par_golden_run(&o, NULL), 0, "%s", par_last_error());
}

static par_status run(const char *dump, const char *backend, int precision, int64_t world, int64_t ep,
                      par_run_summary *sum)
{
    par_run_opts o;
    par_run_opts_init(&o);
    tiny(&o.cfg);
    o.precision = precision;
    o.steps = 2;
    o.seed = 1234;
    o.backend = par_backend_find(backend);
    cr_assert(o.backend);
    o.layout.world = world;
    o.layout.ep = ep;
    o.dump_dir = dump;
    return par_run(&o, sum);
}


Test(dp, dp2_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "dp2");
    golden(g, 64);
    par_run_summary sum;
    cr_assert_eq(run(d, "threads", 64, 2, 1, &sum), 0, "%s", par_last_error());
    cr_expect_eq(sum.layout.da, 2);
    cr_expect_eq(sum.layout.de, 2);
    cr_expect_eq(sum.steps, 2);
    cr_expect_eq(sum.max_rank_floats, sum.n_params, "EP = 1: every rank holds everything");
    par_run_summary_free(&sum);
    check_golden(g, d, 1);
    rmtree(t);
    free(t), free(g), free(d);
}

Test(dp, dp4_replicated_experts_match)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "dp4");
    golden(g, 64);
    cr_assert_eq(run(d, "threads", 64, 4, 1, NULL), 0, "%s", par_last_error());
    check_golden(g, d, 1);
    rmtree(t);
    free(t), free(g), free(d);
}

/* A world of one rank runs every reduction on one contributor: the whole
 * set (parameters, optimizer state, gradients, every step) is the serial
 * reference bit for bit. */
Test(dp, world_of_one_is_bitwise_serial)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "n1");
    golden(g, 64);
    cr_assert_eq(run(d, "self", 64, 1, 1, NULL), 0, "%s", par_last_error());
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_BITWISE;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "%d entries differ", par_compare_report_failed(r));
    par_compare_report_free(r);
    rmtree(t);
    free(t), free(g), free(d);
}

Test(dp, f32_dp2_within_the_f32_policy)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "dp2");
    golden(g, 32);
    cr_assert_eq(run(d, "threads", 32, 2, 1, NULL), 0, "%s", par_last_error());
    check_golden(g, d, 0); /* auto policy: f32 from the manifests */
    rmtree(t);
    free(t), free(g), free(d);
}

Test(dp, nothing_left_allocated)
{
    int64_t before = par_alloc_live_total();
    cr_assert_eq(run(NULL, "threads", 64, 2, 1, NULL), 0, "%s", par_last_error());
    cr_expect_eq(par_alloc_live_total(), before, "live bytes %lld -> %lld", (long long)before,
                 (long long)par_alloc_live_total());
}

Test(dp, batch_not_divisible_by_da)
{
    par_err_set_quiet(1);
    cr_expect_eq(run(NULL, "threads", 64, 3, 1, NULL), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "global batch size 8") && strstr(par_last_error(), "Da = 1 * 3"), "%s",
              par_last_error());
}

/* ---- ownership: a model holding experts [e0, e1) ---- */

Test(dp, owned_model_holds_the_serial_values)
{
    par_config c;
    tiny(&c);
    par_model_f64 A, O;
    cr_assert_eq(par_model_init_f64(&A, &c, 77), 0);
    cr_assert_eq(par_model_init_owned_f64(&O, &c, 77, 2, 4), 0, "%s", par_last_error());
    cr_expect_lt(O.n_local, A.n_local);
    cr_expect_eq(A.n_local, A.tab.n_float, "owning everything, the local layout is the table's");
    int held = 0, missing = 0;
    for (int i = 0; i < A.tab.n; i++) {
        const par_param *p = &A.tab.p[i];
        if (p->dtype != PAR_PDT_REAL)
            continue;
        cr_expect_eq(par_model_loc_f64(&A, i), p->offset);
        double *a = par_model_ptr_f64(&A, A.params, i), *o = par_model_ptr_f64(&O, O.params, i);
        if (p->expert >= 0 && (p->expert < 2 || p->expert >= 4)) {
            cr_expect_null(o, "%s must not be held", p->name);
            cr_expect_eq(par_model_holds_f64(&O, i), 0);
            missing++;
            continue;
        }
        cr_assert_not_null(o, "%s must be held", p->name);
        cr_expect_eq(memcmp(a, o, (size_t)p->numel * sizeof *a), 0, "%s differs", p->name);
        held++;
    }
    cr_expect_gt(held, 0);
    cr_expect_gt(missing, 0);
    par_model_free_f64(&A);
    par_model_free_f64(&O);
}

Test(dp, owned_range_is_checked)
{
    par_err_set_quiet(1);
    par_config c;
    tiny(&c);
    par_model_f64 O;
    cr_expect_eq(par_model_init_owned_f64(&O, &c, 1, 4, 4), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "[4, 4)"), "%s", par_last_error());
    cr_expect_eq(par_model_init_owned_f64(&O, &c, 1, 0, 9), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "E=8"), "%s", par_last_error());
}
