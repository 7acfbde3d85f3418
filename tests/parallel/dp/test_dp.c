/* tests/parallel/dp/test_dp.c - data parallelism (replicated experts, EP = 1) on
 * the threads backend against the serial golden of the same data and seed;
 * the model's ownership variant (parallel/train/run.h, model/model.h). */
#include <criterion/criterion.h>
#include <math.h>

#include "golden_check.h"
#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/manifest.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "model/model.h"
#include "parallel/train/run.h"

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

/* f32: the golden's manifest carries written-reason tolerances for the
 * parameters AdamW's eps regime amplifies (layers.0.hc_attn_base / _scale,
 * docs/golden.md); their gradients and optimizer state stay under the f32
 * policy, which is where a DP sum that went wrong shows. */
static void expect_modes(const char *g, const char *d)
{
    par_compare_opts co;
    par_compare_opts_init(&co);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    int over = 0, held = 0;
    for (int i = 0; i < par_compare_report_count(r); i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (!strstr(e->tensor, "layers.0.hc_attn_base") && !strstr(e->tensor, "layers.0.hc_attn_scale"))
            continue;
        int param = !strncmp(e->tensor, "layers.", 7);
        cr_expect_str_eq(e->mode, param ? "override" : "f32", "%s %s", e->file, e->tensor);
        over += param;
        held += !param && e->pass;
    }
    cr_expect_eq(over, 6, "params.0..2 x 2 tensors under the override, got %d", over);
    cr_expect_eq(held, 12, "grad (2 steps) + exp_avg / exp_avg_sq (params.1, .2), 2 tensors: got %d", held);
    par_compare_report_free(r);
}

Test(dp, f32_dp2_within_the_f32_policy)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "dp2");
    golden(g, 32);
    cr_assert_eq(run(d, "threads", 32, 2, 1, NULL), 0, "%s", par_last_error());
    check_golden(g, d, 0); /* auto policy: f32 from the manifests */
    expect_modes(g, d);
    rmtree(t);
    free(t), free(g), free(d);
}

/* The f32 golden's manifest names the AdamW parameters with entries in the
 * eps regime (docs/golden.md "AdamW's eps regime in f32"): on v4-tiny the
 * layer-0 pre-mix weights hc_attn_base[0..3] and hc_attn_scale[0] (k = 4
 * and 1 entries on every BLAS core measured), whose
 * exact gradient is 0 (x = (sum pre_i) h on n equal streams, RMSNorm removes
 * the scale), so f32 leaves ~1e-10 rounding that AdamW multiplies by lr/eps.
 * The tolerance is the f32 policy plus the bound 2 lr sqrt(k) sum_t B_t;
 * the f64 golden writes none. */
static void expect_override(const par_manifest *m, const char *name, int kmax, int numel)
{
    const par_tol_override *t = par_manifest_tolerance(m, name);
    cr_assert_not_null(t, "%s has no override", name);
    const double b1 = 0.9, b2 = 0.95, lr = 1e-3;
    /* B_1 = 1; B_2 = sqrt(1-b2^2)/(1-b1^2) sqrt((1-b1)^2/(1-b2) (1 + b1^2/b2)) */
    double B2 = sqrt(1 - b2 * b2) / (1 - b1 * b1) * sqrt((1 - b1) * (1 - b1) / (1 - b2) * (1 + b1 * b1 / b2));
    cr_expect_float_eq(t->rtol, 1e-4, 1e-18, "%s rtol %g", name, t->rtol);
    /* atol = 1e-7 + 2 lr sqrt(k) (B_1 + B_2) / sqrt(numel) for a whole k */
    double rk = (t->atol - 1e-7) * sqrt((double)numel) / (2 * lr * (1 + B2));
    int k = (int)lround(rk * rk);
    cr_expect(k >= 1 && k <= kmax && fabs(rk * rk - k) < 1e-6, "%s atol %g: k = %g", name, t->atol, rk * rk);
    char what[64];
    snprintf(what, sizeof what, "%d of %d entries", k, numel);
    cr_expect(strstr(t->reason, "AdamW eps regime in f32") && strstr(t->reason, what), "%s: %s", name, t->reason);
}

Test(dp, f32_golden_names_the_adamw_eps_entries)
{
    char *t = mktmp(), *d32 = sub(t, "f32"), *d64 = sub(t, "f64");
    golden(d32, 32);
    golden(d64, 64);
    par_manifest m;
    cr_assert_eq(par_manifest_read(d32, &m), PAR_OK, "%s", par_last_error());
    for (int i = 0; i < m.ntol; i++) /* on this machine's four BLAS cores: exactly these two */
        cr_expect(strstr(m.tol[i].reason, "AdamW eps regime"), "%s: %s", m.tol[i].tensor, m.tol[i].reason);
    expect_override(&m, "layers.0.hc_attn_base", 4, 24);
    expect_override(&m, "layers.0.hc_attn_scale", 1, 3);
    cr_expect_null(par_manifest_tolerance(&m, "grad.layers.0.hc_attn_base"), "gradients keep the policy");
    par_manifest_free(&m);
    cr_assert_eq(par_manifest_read(d64, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(m.ntol, 0, "the f64 golden has %d overrides", m.ntol);
    par_manifest_free(&m);
    rmtree(t);
    free(t), free(d32), free(d64);
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
