/* tests/parallel/plan/test_guide.c - `parity plan` reproduces the tuning guide's
 * tables for v4-pro (../shared/reference/001_*): every number issue 14
 * lists, from the guide arithmetic (parallel/plan/guide.h) and from the JSON
 * report `parity plan --json` writes (parallel/plan/planrep.h); the search
 * (parallel/plan/plan_search.h) keeps only what fits and ranks by step time. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "comm/netmodel.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/plan/guide.h"
#include "parallel/plan/plan.h"
#include "parallel/plan/planrep.h"
#include "parallel/plan/plan_search.h"
#include "parallel/schedule/schedule.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(guide, .init = quiet);

static par_config pro(void)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-pro"), PAR_OK);
    cr_assert_eq(c.dim, 7168);
    cr_assert_eq(c.moe_inter_dim, 3072);
    cr_assert_eq(c.n_routed_experts, 384);
    cr_assert_eq(c.n_activated_experts, 6);
    cr_assert_eq(c.n_layers, 61);
    return c;
}

/* 12.68 GB: the guide's decimal GB with two decimals. */
static double gb2(double bytes) { return round(bytes / 1e9 * 100.0) / 100.0; }
static double pct1(double f) { return round(f * 1000.0) / 10.0; }

Test(guide, routed_expert_weights_table)
{
    par_config cfg = pro();
    par_layout l;
    par_guide_config_layout(&cfg, 0, &l); /* config A: 1024 GPUs, PP 8, EP 64 */
    cr_assert_eq(par_plan_resolve(&l, &cfg), PAR_OK, "%s", par_last_error());
    par_guide_row g;
    cr_assert_eq(par_guide_row_of(&cfg, &l, &g), PAR_OK);
    cr_expect_eq(g.expert_params, 66060288);
    cr_expect_eq(g.moe_layers, 8, "8 MoE layers on the fullest stage of 61 + 1 over PP 8");
    par_guide_ep_row r[3];
    cr_assert_eq(par_guide_ep_table(&cfg, &l, r), 3);
    const int64_t ep[3] = {32, 64, 128}, per[3] = {12, 6, 3}, de[3] = {4, 2, 1};
    const double gb[3] = {12.68, 6.34, 3.17};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(r[i].ep, ep[i]);
        cr_expect_eq(r[i].experts_per_rank, per[i], "EP%lld", (long long)ep[i]);
        cr_expect_eq(r[i].de, de[i], "EP%lld", (long long)ep[i]);
        cr_expect_eq(gb2(r[i].bytes), gb[i], "EP%lld: %.4f GB", (long long)ep[i], r[i].bytes / 1e9);
    }
}

Test(guide, configs_a_b_c)
{
    par_config cfg = pro();
    par_guide_row g[3];
    cr_assert_eq(par_guide_configs(&cfg, g), PAR_OK, "%s", par_last_error());
    const int64_t gpus[3] = {1024, 8192, 8192}, cp[3] = {1, 1, 4}, da[3] = {128, 1024, 256}, de[3] = {2, 16, 16};
    const int64_t m[3] = {32, 4, 16}, tg[3] = {524288, 524288, 131072};
    const double bub[3] = {17.9, 63.6, 30.4}, et[3] = {8192, 8192, 2048};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(g[i].world, gpus[i]);
        cr_expect_eq(g[i].cp, cp[i]);
        cr_expect_eq(g[i].da, da[i], "config %c Da", "ABC"[i]);
        cr_expect_eq(g[i].de, de[i], "config %c De", "ABC"[i]);
        cr_expect_eq(g[i].m, m[i], "config %c m", "ABC"[i]);
        cr_expect_eq(pct1(g[i].bubble), bub[i], "config %c bubble %.4f", "ABC"[i], g[i].bubble);
        cr_expect_eq(g[i].t_group, tg[i], "config %c T_group", "ABC"[i]);
        cr_expect_eq(g[i].e_t_expert, et[i], "config %c E[T_expert]", "ABC"[i]);
        cr_expect_eq(g[i].vpp_legal, i != 1, "config %c interleaved VPP", "ABC"[i]);
    }
    cr_expect(strstr(g[1].vpp_why, "PP=8") && strstr(g[1].vpp_why, "M=4"), "B's refusal names m and PP: %s",
              g[1].vpp_why);
    /* the D_window check: 8K sequence, CP 4: 2048 local rows */
    cr_expect_eq(g[2].local_rows, 2048);
    cr_expect(g[2].d_window_ok);
    cr_expect_leq(g[2].d_window, 2048);
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsNumber(v), "JSON key %s", k);
    return v->valuedouble;
}

/* `parity plan --guide --json` with config A's flags: the same numbers. */
Test(guide, json_report_of_config_a)
{
    par_config cfg = pro();
    par_layout l;
    par_guide_config_layout(&cfg, 0, &l);
    l.distributed_optimizer = 1;
    cr_assert_eq(par_plan_resolve(&l, &cfg), PAR_OK, "%s", par_last_error());
    par_netmodel net;
    cr_assert_eq(par_netmodel_preset("h800", &net), PAR_OK);
    par_planrep_opts o;
    memset(&o, 0, sizeof o);
    par_memmodel_opts_init(&o.mm);
    o.cfg = &cfg, o.l = &l, o.net = &net, o.guide = 1;
    cJSON *root = NULL;
    cr_assert_eq(par_planrep_json(&o, &root), PAR_OK, "%s", par_last_error());
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "guide");
    cr_expect_eq(num(g, "expert_params"), 66060288);
    cr_expect_eq(num(g, "da"), 128);
    cr_expect_eq(num(g, "de"), 2);
    cr_expect_eq(num(g, "n_micro"), 32);
    cr_expect_eq(pct1(num(g, "bubble_1f1b")), 17.9);
    cr_expect_eq(num(g, "t_group"), 524288);
    cr_expect_eq(num(g, "e_t_expert"), 8192);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(g, "routed_weights");
    cr_assert_eq(cJSON_GetArraySize(w), 3);
    cr_expect_eq(gb2(num(cJSON_GetArrayItem(w, 0), "bytes")), 12.68);
    cr_expect_eq(gb2(num(cJSON_GetArrayItem(w, 1), "bytes")), 6.34);
    cr_expect_eq(gb2(num(cJSON_GetArrayItem(w, 2), "bytes")), 3.17);
    const cJSON *cf = cJSON_GetObjectItemCaseSensitive(root, "guide_configs");
    cr_assert_eq(cJSON_GetArraySize(cf), 3);
    cr_expect_eq(pct1(num(cJSON_GetArrayItem(cf, 1), "bubble_1f1b")), 63.6);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cf, 1), "interleaved_vpp_legal")));
    cr_expect_eq(num(cJSON_GetArrayItem(cf, 2), "t_group"), 131072);
    cr_expect_eq(num(cJSON_GetArrayItem(cf, 2), "local_rows"), 2048);
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(root, "memory");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(mem, "stages");
    cr_assert_eq(cJSON_GetArraySize(st), 8, "one heaviest rank per stage");
    /* the routed weights of stage 1 (8 MoE layers, EP64) are inside its bf16 weights */
    cr_expect_gt(num(cJSON_GetArrayItem(st, 1), "weights"), 6.34e9);
    cr_expect_gt(num(cJSON_GetObjectItemCaseSensitive(root, "step_time"), "step_s"), 0);
    cJSON_Delete(root);
}

Test(guide, search_keeps_what_fits_ranked_by_step_time)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-mini"), PAR_OK);
    par_netmodel net;
    cr_assert_eq(par_netmodel_preset("reference", &net), PAR_OK);
    par_search_opts o;
    memset(&o, 0, sizeof o);
    par_memmodel_opts_init(&o.mm);
    o.world = 16, o.global_batch = 32, o.net = &net, o.distributed_optimizer = 1;
    /* first without a budget: the smallest peak, then a budget just above it */
    par_search_cand *c = NULL;
    int n = 0;
    cr_assert_eq(par_plan_search(&cfg, &o, &c, &n), PAR_OK, "%s", par_last_error());
    double lo = 1e300, hi = 0;
    int kept = 0, etp_ep = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].status == PAR_CAND_KEPT) {
            lo = c[i].mem_peak < lo ? c[i].mem_peak : lo;
            hi = c[i].mem_peak > hi ? c[i].mem_peak : hi;
            kept++;
        }
        if (c[i].etp > 1 && c[i].ep > 1) { /* parity runs ETP inside EP (parallel/moe/ep_etp.c) */
            cr_expect(c[i].status != PAR_CAND_UNSUPPORTED, "ETP %lld x EP %lld is runnable", (long long)c[i].etp,
                      (long long)c[i].ep);
            etp_ep += c[i].status == PAR_CAND_KEPT;
        }
    }
    cr_assert_gt(kept, 10);
    cr_expect_gt(etp_ep, 0);
    cr_assert_lt(lo, hi);
    par_free(c);
    o.memory = (lo + hi) / 2;
    cr_assert_eq(par_plan_search(&cfg, &o, &c, &n), PAR_OK, "%s", par_last_error());
    int k2 = 0, mem = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].status == PAR_CAND_KEPT) {
            cr_expect_leq(c[i].mem_peak, o.memory);
            cr_expect_gt(c[i].t.step_s, 0);
            if (k2 > 0)
                cr_expect_geq(c[i].t.step_s, c[i - 1].t.step_s, "ranked by step time");
            cr_expect_eq(i, k2, "kept candidates come first");
            k2++;
        }
        if (c[i].status == PAR_CAND_MEMORY) {
            cr_expect_gt(c[i].mem_peak, o.memory);
            cr_expect(strstr(c[i].reason, "bytes"), "%s", c[i].reason);
            mem++;
        }
    }
    cr_expect_gt(k2, 0);
    cr_expect_gt(mem, 0);
    cr_expect_lt(k2, kept);
    par_free(c);
}

/* Issue 34 item 5: the weights floor is below every candidate's peak (so a
 * budget under it may say "nothing fits" at once), a candidate over its own
 * floor is dropped without its memory model, and max_seconds bounds the
 * search (the rest "skipped"). */
Test(guide, search_is_bounded)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-mini"), PAR_OK);
    par_netmodel net;
    cr_assert_eq(par_netmodel_preset("reference", &net), PAR_OK);
    par_search_opts o;
    memset(&o, 0, sizeof o);
    par_memmodel_opts_init(&o.mm);
    o.world = 16, o.global_batch = 32, o.net = &net, o.distributed_optimizer = 1;
    par_search_cand *c = NULL;
    int n = 0;
    cr_assert_eq(par_plan_search(&cfg, &o, &c, &n), PAR_OK, "%s", par_last_error());
    double floor = par_plan_search_floor(&cfg, o.world), lo = 1e300;
    cr_assert_gt(floor, 0);
    for (int i = 0; i < n; i++)
        if (c[i].status == PAR_CAND_KEPT)
            lo = c[i].mem_peak < lo ? c[i].mem_peak : lo;
    cr_expect_leq(floor, lo, "the floor %.0f is a lower bound of the smallest peak %.0f", floor, lo);
    par_free(c);
    /* a budget just under the smallest peak: whatever the floor drops, the model would have */
    o.memory = lo * 0.999;
    cr_assert_eq(par_plan_search(&cfg, &o, &c, &n), PAR_OK, "%s", par_last_error());
    int floored = 0;
    for (int i = 0; i < n; i++) {
        cr_expect_neq(c[i].status, PAR_CAND_KEPT);
        floored += c[i].status == PAR_CAND_MEMORY && strstr(c[i].reason, "lower bound") != NULL;
    }
    cr_expect_gt(floored, 0, "some candidates dropped by their weights alone");
    par_free(c);
    o.memory = 0;
    o.max_seconds = 1e-9;
    cr_assert_eq(par_plan_search(&cfg, &o, &c, &n), PAR_OK, "%s", par_last_error());
    int skipped = 0;
    for (int i = 0; i < n; i++)
        skipped += c[i].status == PAR_CAND_SKIPPED;
    cr_expect_geq(skipped, n - 1, "%d of %d skipped", skipped, n);
    cr_expect_gt(n, 1);
    par_free(c);
}

/* The memory model's microbatches in flight are the dry run's peak_live
 * (release at B) and, with a split backward, peak_held (release at W: a GPU
 * job and parity alike, which runs real W actions): the same schedule, two
 * readings (parallel/schedule/schedule.h). */
Test(guide, in_flight_is_the_dry_runs_peak)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-mini"), PAR_OK);
    static const struct {
        const char *sched, *layout;
        int vpp, m;
    } cases[] = {{"1f1b", "Et*2|t*2|t*2|t*2mL", 1, 8},       {"gpipe", "Et*2|t*2|t*2|t*2mL", 1, 8},
                 {"zb-h1", "Et*2|t*2|t*2|t*2mL", 1, 8},      {"interleaved", "Et|t|t|t|t|t|t|tmL", 2, 8},
                 {"dualpipe", "Et*2|t*2|t*2|t*2mL", 1, 8},   {"dualpipev", "Et|t|t|t|t|t|t|tmL", 2, 8}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        for (int rt = 0; rt < 2; rt++) {
            par_layout l;
            par_layout_init(&l);
            l.pp = 4, l.world = 4, l.micro_batch = 1, l.global_batch = cases[k].m;
            cr_assert_eq(par_layout_set_schedule(&l, cases[k].sched), PAR_OK);
            cr_assert_eq(par_layout_set_pp_layout(&l, cases[k].layout), PAR_OK);
            cr_assert_eq(par_plan_resolve(&l, &cfg), PAR_OK, "%s: %s", cases[k].sched, par_last_error());
            par_schedule_params sp;
            par_schedule_params_init(&sp);
            cr_assert_eq(par_schedule_kind_parse(cases[k].sched, &sp.kind), PAR_OK);
            sp.pp = 4, sp.vpp = (int)l.vpp, sp.n_micro = (int)l.n_micro;
            par_schedule s;
            cr_assert_eq(par_schedule_build(&sp, &s), PAR_OK, "%s", par_last_error());
            par_sched_costs c;
            par_sched_costs_init(&c);
            par_sched_sim sim;
            cr_assert_eq(par_schedule_simulate(&s, &c, &sim), PAR_OK);
            par_memmodel_opts o;
            par_memmodel_opts_init(&o);
            o.rt = rt ? PAR_MM_PARITY : PAR_MM_MEGATRON;
            par_memmodel *mm = NULL;
            cr_assert_eq(par_memmodel_create(&mm, &cfg, &l, &o), PAR_OK, "%s", par_last_error());
            for (int r = 0; r < 4; r++) {
                par_memmodel_rank x;
                cr_assert_eq(par_memmodel_rank_of(mm, r, &x), PAR_OK);
                int want = !s.split_bw ? sim.peak_live[r] : sim.peak_held[r];
                cr_expect_eq(x.inflight, want, "%s %s rank %d: in flight %d, dry run %d", cases[k].sched,
                             rt ? "parity" : "megatron", r, x.inflight, want);
            }
            par_memmodel_free(mm);
            par_sched_sim_free(&sim);
            par_schedule_free(&s);
        }
    }
}
