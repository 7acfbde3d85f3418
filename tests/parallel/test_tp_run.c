/* tests/parallel/test_tp_run.c - tensor parallelism in parity run (the step
 * executor with the TP attention hook, parallel/tp_hook.h) against the
 * serial golden of the same data and seed, f64 policy (routing and indexer
 * selections exact); ETP 2 (parallel/etp_hook.h), ETP 2 inside EP 4
 * (parallel/ep_etp.c) and TP 2 x CP 2 x EP 4 the same; the deliberate
 * missing wkv all-reduce caught with its root cause; the layout rules
 * refused with the numbers. */
#include <criterion/criterion.h>

#include "golden_check.h"
#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "model/rootcause.h"
#include "parallel/driver.h"
#include "parallel/tp.h"

static void tiny(par_config *c)
{
    cr_assert_eq(par_config_preset(c, "v4-tiny"), 0);
}

static void golden(const char *out)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    tiny(&o.cfg);
    o.steps = 2;
    o.seed = 1234;
    o.precision = 64;
    o.out_dir = out;
    cr_assert_eq(par_golden_run(&o, NULL), 0, "%s", par_last_error());
}

/* {TP, ETP, EP, CP, world[, moe_inter_dim]} */
typedef struct {
    int64_t tp, etp, ep, cp, world, inter;
} lay;

static par_status run(const char *dump, lay l, unsigned faults)
{
    par_run_opts o;
    par_run_opts_init(&o);
    tiny(&o.cfg);
    if (l.inter)
        o.cfg.moe_inter_dim = l.inter;
    o.steps = 2;
    o.seed = 1234;
    o.backend = par_backend_find("threads");
    cr_assert(o.backend);
    o.layout.tp = l.tp;
    o.layout.etp = l.etp;
    o.layout.ep = l.ep;
    o.layout.cp = l.cp;
    o.layout.world = l.world;
    o.dump_dir = dump;
    o.tp_faults = faults;
    return par_run(&o, NULL);
}

Test(tp_run, tp2_x_dp2_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp2");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 1, 1, 1, 4, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* ETP 2 with Da 2 (the ETP group holds disjoint tokens): the serial golden. */
Test(tp_run, etp2_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "etp2");
    golden(g);
    cr_assert_eq(run(d, (lay){1, 2, 1, 1, 2, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* ETP 2 inside EP 4 with CP 2 x Da 8 = ETP 2 x EP 4 x De 2 (MoE parallel
 * folding: the EP-dispatched rows all-gathered over ETP): the serial golden. */
Test(tp_run, etp2_inside_ep4_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "etp2ep4");
    golden(g);
    cr_assert_eq(run(d, (lay){1, 2, 4, 2, 16, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* TP 2 x CP 2 x EP 4 (world 8: TP 2 x CP 2 x Da 2 = EP 4 x De 2): the CP
 * attention on the TP shard (parallel/cptp_hook.h), each TP copy of a token
 * dispatched with the weight pass on tp 0's (parallel/ep_tp.c). */
Test(tp_run, tp2_cp2_ep4_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp2cp2ep4");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 1, 4, 2, 8, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* Each TP rank keeps its own heads' share of wkv's gradient: the first
 * divergence in dataflow order is a wkv gradient of step 0. */
Test(tp_run, missing_wkv_all_reduce_is_caught)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp2");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 1, 1, 1, 2, 0}, PAR_TP_FAULT_WKV_NO_REDUCE), 0, "%s", par_last_error());
    par_compare_opts co;
    par_compare_opts_init(&co);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    cr_expect(!par_compare_report_ok(r), "the fault must fail the comparison");
    par_root_cause rc;
    par_compare_root_cause(r, &rc);
    cr_assert_geq(rc.root, 0);
    const par_cmp_entry *e = par_compare_report_entry(r, rc.root);
    fprintf(stderr, "tp_run/missing_wkv_all_reduce: root cause %s %s: %s\n", e->file, e->tensor, e->reason);
    cr_expect_str_eq(e->file, "step.0.safetensors");
    cr_expect(!strncmp(e->tensor, "grad.", 5) && strstr(e->tensor, ".attn.wkv.weight"), "root cause %s", e->tensor);
    par_compare_report_free(r);
    rmtree(t);
    free(t), free(g), free(d);
}

Test(tp_run, layout_rules_are_refused_with_the_numbers)
{
    cr_expect_eq(run(NULL, (lay){4, 1, 1, 1, 4, 0}, 0), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "tensor-model-parallel-size 4 does not divide n_heads 2"), "%s",
              par_last_error());
    cr_expect_eq(run(NULL, (lay){2, 2, 1, 1, 4, 0}, 0), PAR_EUNSUPPORTED);
    cr_expect(strstr(par_last_error(), "expert-tensor-parallel-size 2 with tensor-model-parallel-size 2"), "%s",
              par_last_error());
    cr_expect_eq(run(NULL, (lay){1, 2, 4, 1, 12, 0}, 0), PAR_EINVAL); /* 12 = TP*CP*Da, not ETP*EP*De */
    cr_expect(strstr(par_last_error(), "12"), "%s", par_last_error());
    cr_expect_eq(run(NULL, (lay){1, 8, 1, 1, 8, 20}, 0), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "expert-tensor-parallel-size 8") && strstr(par_last_error(), "20"), "%s",
              par_last_error());
}
