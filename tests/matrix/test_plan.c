/* tests/matrix/test_plan.c - the analytical plan against a layout run
 * (matrix/matrix_plan.h): a real run's "plan" object holds the planner's
 * memory per rank and tag, bubble and EP bytes next to the run's, within
 * their bounds; a figure beyond its bound (10 %) fails the cell naming the
 * figure and both numbers; one within it, or a layout the planner does not
 * model, leaves the cell as it was. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/netmodel.h"
#include "core/json.h"
#include "core/status.h"
#include "matrix/matrix_plan.h"
#include "parallel/train/run.h"
#include "parallel/train/run_summary.h"

/* One step of v4-tiny PP 2 x EP 2 (DP 2, ZeRO-1, 4 ranks) on the threads
 * backend with the reference network (sp: TP 2 with SP x EP 2 instead); its
 * summary with "plan". */
static cJSON *run_layout(int sp)
{
    par_netmodel net;
    cr_assert_eq(par_netmodel_preset("reference", &net), PAR_OK);
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), PAR_OK);
    o.backend = par_backend_find("threads");
    cr_assert(o.backend);
    o.precision = 64;
    o.layout.world = 4;
    o.layout.ep = 2;
    if (sp) {
        o.layout.tp = 2;
        o.layout.sequence_parallel = 1;
        o.layout.tp_all_layers = 1;
    } else {
        o.layout.pp = 2;
        o.layout.distributed_optimizer = 1;
        cr_assert_eq(par_layout_set_schedule(&o.layout, "1f1b"), PAR_OK);
        cr_assert_eq(par_layout_set_pp_layout(&o.layout, "Et|t*2mL"), PAR_OK);
    }
    o.netmodel = &net;
    par_run_summary s;
    cr_assert_eq(par_run(&o, &s), PAR_OK, "%s", par_last_error());
    cJSON *doc = par_run_summary_json(&s, "v4-tiny", 64);
    cr_assert_not_null(doc);
    par__matrix_plan_attach(doc, &o.cfg, 64, &s, &net);
    par_run_summary_free(&s);
    return doc;
}

static double fig(const cJSON *doc, const char *a, const char *b, const char *side)
{
    const cJSON *p = par_json_obj(doc, "plan");
    const cJSON *o = b ? par_json_obj(par_json_obj(p, a), b) : par_json_obj(p, a);
    double v = NAN;
    cr_assert(o && par_json_num(o, side, &v), "plan.%s%s%s.%s missing", a, b ? "." : "", b ? b : "", side);
    return v;
}

static par__matrix_result *passing(cJSON *doc)
{
    static par__matrix_result res;
    memset(&res, 0, sizeof res);
    res.verdict = PAR_CELL_PASS;
    res.run = doc;
    return &res;
}

Test(matrix_plan, a_run_agrees_with_its_plan, .timeout = 120)
{
    cJSON *doc = run_layout(0);
    const cJSON *p = par_json_obj(doc, "plan");
    if (getenv("PLAN_DEBUG")) {
        char *t = cJSON_Print(p);
        fprintf(stderr, "%s\n%s\n", t, cJSON_Print(par_json_obj(doc, "expert_parallel")));
    }
    cr_assert_not_null(p);
    cr_assert_null(par_json_str(p, "not_modelled"), "not modelled: %s", par_json_str(p, "not_modelled"));
    static const char *const tags[] = {"param", "grad", "optim", "act", "comm"}; /* no dump: all five hold */
    for (int k = 0; k < 5; k++) {
        double pl = fig(doc, "memory", tags[k], "plan"), run = fig(doc, "memory", tags[k], "run");
        cr_assert(run > 0 && fabs(pl - run) <= 0.10 * run, "memory.%s: plan %g vs run %g", tags[k], pl, run);
    }
    double bp = fig(doc, "bubble", NULL, "plan"), br = fig(doc, "bubble", NULL, "run"); /* recorded only */
    cr_assert(bp > 0 && br > 0, "bubble: plan %g vs run %g", bp, br);
    double ep = fig(doc, "ep_bytes", "nvlink", "plan"), er = fig(doc, "ep_bytes", "nvlink", "run");
    cr_assert(er > 0 && fabs(ep - er) <= 0.10 * er, "EP bytes: plan %g vs run %g", ep, er);
    par__matrix_result *res = passing(doc);
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_PASS, "%s", res->diagnosis);
    cJSON_Delete(doc);
}

/* With SP the MoE's tokens are split over the TP group: the plan's EP bytes
 * were the run's twice (95 % apart in the quick matrix's tp2-sp-* cells)
 * before steptime.c divided the dispatched rows by TP. */
Test(matrix_plan, sp_ep_bytes_are_the_runs, .timeout = 120)
{
    cJSON *doc = run_layout(1);
    double ep = fig(doc, "ep_bytes", "nvlink", "plan"), er = fig(doc, "ep_bytes", "nvlink", "run");
    cr_assert(er > 0 && fabs(ep - er) <= 0.10 * er, "EP bytes: plan %g vs run %g", ep, er);
    par__matrix_result *res = passing(doc);
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_PASS, "%s", res->diagnosis);
    cJSON_Delete(doc);
}

/* A summary whose only figure is plan.SECTION[.KEY] = {plan, run, bound 10 %}. */
static cJSON *one_figure(const char *section, const char *key, double plan, double run)
{
    char f[200], text[400];
    snprintf(f, sizeof f, "{\"plan\": %.17g, \"run\": %.17g, \"bound\": 0.1%s}", plan, run,
             key && !strcmp(section, "memory") ? ", \"rank\": 3" : "");
    if (key)
        snprintf(text, sizeof text, "{\"plan\": {\"%s\": {\"%s\": %s}}}", section, key, f);
    else
        snprintf(text, sizeof text, "{\"plan\": {\"%s\": %s}}", section, f);
    cJSON *doc = cJSON_Parse(text);
    cr_assert_not_null(doc, "%s", text);
    return doc;
}

Test(matrix_plan, a_figure_beyond_its_bound_fails_the_cell)
{
    cJSON *doc = one_figure("memory", "optim", 1000, 1250); /* -20 % */
    par__matrix_result *res = passing(doc);
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_FAIL);
    cr_assert(strstr(res->diagnosis, "memory.optim (world rank 3): plan 1000 vs run 1250 (-20.0 % apart, bound 10 %)"),
              "%s", res->diagnosis);
    cJSON_Delete(doc);

    doc = one_figure("bubble", NULL, 0.3, 0.27); /* +11.1 % */
    res = passing(doc);
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_FAIL);
    cr_assert(strstr(res->diagnosis, "pipeline bubble: plan 0.3 vs run 0.27 (+11.1 % apart"), "%s", res->diagnosis);
    cJSON_Delete(doc);

    doc = one_figure("ep_bytes", "ib", 5000, 0); /* the plan sends over IB, the run does not */
    res = passing(doc);
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_FAIL);
    cr_assert(strstr(res->diagnosis, "EP bytes per step over ib: plan 5000 vs run 0"), "%s", res->diagnosis);
    cJSON_Delete(doc);
}

Test(matrix_plan, within_the_bound_or_not_modelled_leaves_the_cell)
{
    cJSON *doc = one_figure("memory", "act", 1000, 1090); /* -8.3 % */
    par__matrix_result *res = passing(doc);
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_PASS, "%s", res->diagnosis);
    cJSON_Delete(doc);

    doc = cJSON_Parse("{\"plan\": {\"memory\": {\"comm\": {\"plan\": 1, \"run\": 90, \"bound\": null}}}}");
    res = passing(doc); /* recorded only */
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_PASS, "%s", res->diagnosis);
    cJSON_Delete(doc);

    doc = cJSON_Parse("{\"plan\": {\"not_modelled\": \"step time: no\"}}");
    res = passing(doc);
    par__matrix_plan_check(res);
    cr_assert_eq(res->verdict, PAR_CELL_PASS);
    cJSON_Delete(doc);

    doc = one_figure("memory", "act", 1000, 2000); /* a cell that already failed keeps its own diagnosis */
    res = passing(doc);
    res->verdict = PAR_CELL_FAIL;
    strcpy(res->diagnosis, "first divergence ...");
    par__matrix_plan_check(res);
    cr_assert_str_eq(res->diagnosis, "first divergence ...");
    cJSON_Delete(doc);
}
