/* tests/parallel/tp/test_tp_run.c - tensor parallelism in parity run (the step
 * executor with the TP attention hook, parallel/tp/tp_attn_hook.h) against the
 * serial golden of the same data and seed, f64 policy (routing and indexer
 * selections exact); ETP 2 (parallel/moe/etp_hook.h) the same; the deliberate
 * missing wkv all-reduce caught with its root cause; SP x CP x ETP x EP and
 * TP = ETP x EP; the layout rules refused with the numbers. */
#include <criterion/criterion.h>

#include "golden_check.h"
#include "tmpdir.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/clock.h"
#include "comm/netmodel.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "model/rootcause.h"
#include "parallel/train/run.h"
#include "parallel/tp/tp.h"
#include "parallel/layout/tp_split.h"

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

/* {TP, ETP, EP, CP, world[, moe_inter_dim[, --tp-all-layers (a deprecated no-op)[, --sequence-parallel]]]} */
typedef struct {
    int64_t tp, etp, ep, cp, world, inter;
    int all, sp;
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
    o.layout.tp_all_layers = l.all;
    o.layout.sequence_parallel = l.sp;
    o.dump_dir = dump;
    o.tp_faults = faults;
    return par_run(&o, NULL);
}

Test(tp_run, tp2_x_dp2_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp2");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 1, 1, 1, 4, 0, 0, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* ETP 2 with Da 2 (the ETP group holds disjoint tokens): the serial golden. */
Test(tp_run, etp2_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "etp2");
    golden(g);
    cr_assert_eq(run(d, (lay){1, 2, 1, 1, 2, 0, 0, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* --tp-all-layers is a deprecated no-op: every TP layer (vocab-parallel
 * embedding / head / CE, the TP shared expert) is the default under TP.
 * TP 2 x DP 2 with the flag matches the serial golden and is bitwise the
 * run without it. */
Test(tp_run, tp_all_layers_flag_is_a_no_op)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp2"), *d0 = sub(t, "tp2-noflag");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 1, 1, 1, 4, 0, 1, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    cr_assert_eq(run(d0, (lay){2, 1, 1, 1, 4, 0, 0, 0}, 0), 0, "%s", par_last_error());
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_BITWISE;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(d0, d, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "with and without --tp-all-layers: %d entries differ",
              par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 100);
    par_compare_report_free(r);
    rmtree(t);
    free(t), free(g), free(d), free(d0);
}

/* Sequence parallelism, TP 2 + SP x DP 2: the TP ranks hold column slices
 * of the rows (norms, mHC, router, routed experts on them); the serial
 * golden.  Were the slices not disjoint, the statistics and gradients summed
 * over TP would count tokens twice. */
Test(tp_run, tp2_sp_x_dp2_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp2sp");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 1, 1, 1, 4, 0, 1, 1}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* The run under fault bits `faults` fails the comparison; its root cause
 * (the first divergence in dataflow order) is in `file` and its tensor
 * starts with `prefix` and contains `part`. */
static void fault_caught(const char *what, lay l, unsigned faults, const char *file, const char *prefix,
                         const char *part, double want_diff)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp");
    golden(g);
    cr_assert_eq(run(d, l, faults), 0, "%s", par_last_error());
    par_compare_opts co;
    par_compare_opts_init(&co);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    cr_expect(!par_compare_report_ok(r), "%s: the fault must fail the comparison", what);
    par_root_cause rc;
    par_compare_root_cause(r, &rc);
    cr_assert_geq(rc.root, 0);
    const par_cmp_entry *e = par_compare_report_entry(r, rc.root);
    fprintf(stderr, "tp_run/%s: root cause %s %s: %s\n", what, e->file, e->tensor, e->reason);
    cr_expect_str_eq(e->file, file);
    cr_expect(!strncmp(e->tensor, prefix, strlen(prefix)) && strstr(e->tensor, part), "%s: root cause %s", what,
              e->tensor);
    double diff = -1;
    const char *at = strstr(e->reason, "||B-A|| = ");
    cr_assert(at && sscanf(at, "||B-A|| = %lf", &diff) == 1, "%s: reason %s", what, e->reason);
    if (want_diff > 0) /* the printed 4 digits */
        cr_expect(fabs(diff - want_diff) < 1e-3 * want_diff, "%s: off by %.6g, expected %.6g", what, diff, want_diff);
    par_compare_report_free(r);
    rmtree(t);
    free(t), free(g), free(d);
}

/* ETP 2 inside EP 4 with CP 2 x Da 8 = ETP 2 x EP 4 x De 2 (MoE parallel
 * folding: the EP-dispatched rows all-gathered over ETP): the serial golden. */
Test(tp_run, etp2_inside_ep4_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "etp2ep4");
    golden(g);
    cr_assert_eq(run(d, (lay){1, 2, 4, 2, 16, 0, 0, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* TP 2 x CP 2 x EP 4 (world 8: TP 2 x CP 2 x Da 2 = EP 4 x De 2): the CP
 * attention on the TP shard (parallel/cp/cptp_hook.h), each TP copy of a token
 * dispatched with the weight pass on tp 0's (parallel/moe/ep_tp.c). */
Test(tp_run, tp2_cp2_ep4_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tp2cp2ep4");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 1, 4, 2, 8, 0, 0, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    rmtree(t);
    free(t), free(g), free(d);
}

/* Each TP rank keeps its own heads' share of wkv's gradient: the first
 * divergence in dataflow order is a wkv gradient of step 0. */
/* The TP compositions (tpcomp15): TP 2 + SP x CP 2 x Da 2 = ETP 2 x EP 2 x
 * De 2 (SP's column slices inside the CP slice, the router and the EP
 * dispatch on the local tokens, the ETP rows gathered), and TP 2 = ETP 2
 * without SP inside EP 2 (the ETP group is the TP group: same rows, the
 * slices' outputs all-reduced): the serial golden. */
Test(tp_run, tp2_sp_cp2_etp2_ep2_matches_the_serial_golden)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "tpsp"), *e = sub(t, "tpetp");
    golden(g);
    cr_assert_eq(run(d, (lay){2, 2, 2, 2, 8, 0, 1, 1}, 0), 0, "%s", par_last_error());
    check_golden(g, d, 0);
    cr_assert_eq(run(e, (lay){2, 2, 2, 1, 4, 0, 0, 0}, 0), 0, "%s", par_last_error());
    check_golden(g, e, 0);
    rmtree(t);
    free(t), free(g), free(d), free(e);
}

Test(tp_run, missing_wkv_all_reduce_is_caught)
{
    fault_caught("missing_wkv_all_reduce", (lay){2, 1, 1, 1, 2, 0, 0, 0}, PAR_TP_FAULT_WKV_NO_REDUCE,
                 "step.0.safetensors", "grad.", ".attn.wkv.weight", 0);
}

/* The vocab-parallel CE's softmax denominator reduced twice: every CE gains
 * log(TP); the logits are right, so the first divergence is the main loss,
 * off by log 2.  A plain TP 2 run (no --tp-all-layers, a no-op now): the
 * vocab-parallel CE is the default under TP, as in Megatron-LM, so an
 * attention-only TP would pass and fail this test. */
Test(tp_run, log_tp_added_by_the_vocab_parallel_ce_is_caught)
{
    fault_caught("log_tp_ce", (lay){2, 1, 1, 1, 2, 0, 0, 0}, PAR_TP_FAULT_CE_LOG_TP, "step.0.safetensors", "out.",
                 "loss", log(2.0));
}

/* Each TP shard of a split Muon matrix orthogonalized by itself (the bug a
 * real framework shipped): step 0 is right, the first divergence is a split
 * matrix in the parameters after the first update. */
Test(tp_run, tp_shard_fed_to_muon_is_caught)
{
    fault_caught("muon_shard", (lay){2, 1, 1, 1, 2, 0, 0, 0}, PAR_TP_FAULT_MUON_SHARD, "params.1.safetensors", "",
                 ".attn.", 0);
}

/* One step of layout l on emulated nodes of 2 ranks with spans recorded:
 * the bytes of every communication span whose group name starts with
 * `in[k]` (then ':' and the group's index), per tier, into by[k][tier]. */
static void traffic(lay l, const char *const *in, int n_in, uint64_t by[][PAR_TIER_COUNT])
{
    par_run_opts o;
    par_run_opts_init(&o);
    tiny(&o.cfg);
    o.steps = 1;
    o.backend = par_backend_find("threads");
    o.layout.tp = l.tp, o.layout.etp = l.etp, o.layout.ep = l.ep, o.layout.cp = l.cp;
    o.layout.world = l.world;
    o.layout.tp_all_layers = l.all;
    o.layout.sequence_parallel = l.sp;
    par_netmodel net;
    cr_assert_eq(par_netmodel_preset("reference", &net), 0);
    net.gpus_per_node = 2;
    net.nics_per_node = 2;
    o.netmodel = &net;
    o.net_spans = 1;
    par_run_summary sum;
    memset(&sum, 0, sizeof sum);
    cr_assert_eq(par_run(&o, &sum), 0, "%s", par_last_error());
    cr_assert(sum.net);
    for (int r = 0; r < l.world; r++) {
        size_t n = 0, lost = 0;
        const par_span *sp = par_netrun_spans(sum.net, r, &n, &lost);
        cr_assert(sp && n > 0 && lost == 0, "rank %d: %zu spans, %zu lost", r, n, lost);
        for (size_t i = 0; i < n; i++) {
            if (!sp[i].bytes || (sp[i].kind != PAR_SPAN_COMM && sp[i].kind != PAR_SPAN_XFER))
                continue;
            for (int k = 0; k < n_in; k++) {
                size_t m = strlen(in[k]);
                if (!strncmp(sp[i].group, in[k], m) && sp[i].group[m] == ':')
                    by[k][sp[i].tier] += sp[i].bytes;
            }
        }
    }
    par_run_summary_free(&sum);
}

/* TP traffic on the emulated network: TP 2 + SP x DP 2 on nodes of 2 ranks
 * (world ranks tp fastest: every TP group inside a node).  Every
 * communication span of a "tp:N" group moves its bytes over NVLink, and the
 * DP groups (across the nodes) over InfiniBand, so the check would see TP
 * traffic leaving a node. */
Test(tp_run, tp_traffic_stays_on_nvlink)
{
    static const char *const in[] = {"tp", "dp", "dp-cp"};
    uint64_t by[3][PAR_TIER_COUNT] = {{0}};
    traffic((lay){2, 1, 1, 1, 4, 0, 1, 1}, in, 3, by);
    const uint64_t dp_ib = by[1][PAR_TIER_IB] + by[2][PAR_TIER_IB];
    fprintf(stderr, "tp_run/tp_traffic: tp bytes nvlink %llu ib %llu; dp bytes over ib %llu\n",
            (unsigned long long)by[0][PAR_TIER_NVLINK], (unsigned long long)by[0][PAR_TIER_IB],
            (unsigned long long)dp_ib);
    cr_expect_gt(by[0][PAR_TIER_NVLINK], 0);
    cr_expect_eq(by[0][PAR_TIER_IB], 0);
    cr_expect_gt(dp_ib, 0, "the DP groups cross the nodes: their bytes go over IB");
}

/* SP composed (tpcomp15): TP 2 + SP x CP 2 x Da 2 = ETP 2 x EP 2 x De 2 on
 * nodes of 2.  The TP group (SP's gathers of the CP slice, the vocab and
 * shared-expert layers) and the ETP group (= the TP ranks: the rows'
 * gather / reduce-scatter) stay on NVLink; the CP group, which crosses the
 * nodes, moves its bytes over IB. */
Test(tp_run, sp_composed_traffic_stays_on_nvlink)
{
    static const char *const in[] = {"tp", "etp", "cp"};
    uint64_t by[3][PAR_TIER_COUNT] = {{0}};
    traffic((lay){2, 2, 2, 2, 8, 0, 1, 1}, in, 3, by);
    fprintf(stderr, "tp_run/sp_composed_traffic: tp nvlink %llu ib %llu; etp nvlink %llu ib %llu; cp ib %llu\n",
            (unsigned long long)by[0][PAR_TIER_NVLINK], (unsigned long long)by[0][PAR_TIER_IB],
            (unsigned long long)by[1][PAR_TIER_NVLINK], (unsigned long long)by[1][PAR_TIER_IB],
            (unsigned long long)by[2][PAR_TIER_IB]);
    cr_expect_gt(by[0][PAR_TIER_NVLINK], 0);
    cr_expect_eq(by[0][PAR_TIER_IB], 0);
    cr_expect_gt(by[1][PAR_TIER_NVLINK], 0);
    cr_expect_eq(by[1][PAR_TIER_IB], 0);
    cr_expect_gt(by[2][PAR_TIER_IB], 0, "the CP groups cross the nodes: their bytes go over IB");
}

/* The shared expert's work summed over the ranks of a one-step run of
 * layout l (parallel/tp/tp.h par_tp_shared_stats): forward tokens x hidden
 * units, and the bytes of its TP collectives. */
static int64_t shared_work(lay l, int64_t *tp_bytes)
{
    par_run_opts o;
    par_run_opts_init(&o);
    tiny(&o.cfg);
    o.backend = par_backend_find("threads");
    o.layout.tp = l.tp, o.layout.etp = l.etp, o.layout.ep = l.ep, o.layout.cp = l.cp;
    o.layout.world = l.world;
    o.layout.sequence_parallel = l.sp;
    par_run_summary sum;
    memset(&sum, 0, sizeof sum);
    cr_assert_eq(par_run(&o, &sum), 0, "%s", par_last_error());
    int64_t u = sum.shared_units;
    *tp_bytes = sum.shared_tp_bytes;
    par_run_summary_free(&sum);
    return u;
}

/* The shared expert runs TP-split (column / row parallel over TP) under
 * TP x EP, TP x ETP and TP x ETP x EP, with and without SP and with CP: over
 * the ranks it computes each token's I hidden units once (the units of EP 2
 * without TP, where each rank runs it whole on its own tokens), and its TP
 * collectives move bytes.  Run whole on every TP rank it would count TP
 * times the units and no TP bytes. */
Test(tp_run, shared_expert_is_tp_split_under_ep_and_etp)
{
    int64_t b0 = -1, b;
    const int64_t whole = shared_work((lay){1, 1, 2, 1, 2, 0, 0, 0}, &b0);
    cr_assert_gt(whole, 0);
    cr_expect_eq(b0, 0, "EP 2 without TP: no TP bytes (got %lld)", (long long)b0);
    static const lay tps[] = {
        {2, 1, 2, 1, 4, 0, 0, 0}, /* TP 2 x EP 2 */
        {2, 1, 4, 1, 8, 0, 0, 1}, /* TP 2 + SP x EP 4 */
        {2, 1, 4, 2, 8, 0, 0, 0}, /* TP 2 x CP 2 x EP 4 */
        {2, 2, 1, 1, 2, 0, 0, 0}, /* TP 2 = ETP 2 */
        {2, 2, 2, 1, 4, 0, 0, 1}, /* TP 2 + SP x ETP 2 x EP 2 */
        {2, 1, 1, 1, 2, 0, 0, 0}, /* TP 2, EP = ETP = 1 (tp_moe_hook.c) */
    };
    for (size_t i = 0; i < sizeof tps / sizeof *tps; i++) {
        const lay l = tps[i];
        const int64_t u = shared_work(l, &b);
        fprintf(stderr, "tp_run/shared_split: TP %lld ETP %lld EP %lld CP %lld sp %d: units %lld (whole %lld), "
                "TP bytes %lld\n", (long long)l.tp, (long long)l.etp, (long long)l.ep, (long long)l.cp, l.sp,
                (long long)u, (long long)whole, (long long)b);
        cr_expect_eq(u, whole, "layout %zu: the shared expert's units %lld, split would be %lld (whole on every "
                     "TP rank: %lld)", i, (long long)u, (long long)whole, (long long)(whole * l.tp));
        cr_expect_gt(b, 0, "layout %zu: the shared expert's TP collectives moved no bytes", i);
    }
}

/* The TP shared expert's partial output not summed over TP (each rank keeps
 * its hidden units' share of y): TP 2 x EP 2 fails at the first MoE
 * output. */
Test(tp_run, shared_expert_output_not_reduced_is_caught)
{
    fault_caught("shared_no_reduce", (lay){2, 1, 2, 1, 4, 0, 0, 0}, PAR_TP_FAULT_SHARED_NO_REDUCE,
                 "step.0.safetensors", "act.layers.0", "", 0);
}

Test(tp_run, layout_rules_are_refused_with_the_numbers)
{
    cr_expect_eq(run(NULL, (lay){4, 1, 1, 1, 4, 0, 0, 0}, 0), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "tensor-model-parallel-size 4 does not divide n_heads 2"), "%s",
              par_last_error());
    /* TP x ETP without SP: the ETP group must be the TP group */
    cr_expect_eq(run(NULL, (lay){2, 4, 1, 1, 4, 0, 0, 0}, 0), PAR_EUNSUPPORTED);
    cr_expect(strstr(par_last_error(), "expert-tensor-parallel-size 4 with tensor-model-parallel-size 2 needs "
                                       "--sequence-parallel (Megatron-LM's rule") &&
                  strstr(par_last_error(), "expert-tensor-parallel-size is 1 or 2 = tensor-model-parallel-size"),
              "%s", par_last_error());
    cr_expect_eq(run(NULL, (lay){1, 2, 4, 1, 12, 0, 0, 0}, 0), PAR_EINVAL); /* 12 = TP*CP*Da, not ETP*EP*De */
    cr_expect(strstr(par_last_error(), "12"), "%s", par_last_error());
    cr_expect_eq(run(NULL, (lay){1, 1, 1, 1, 1, 0, 1, 1}, 0), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "--sequence-parallel needs tensor-model-parallel-size > 1 (got 1)"), "%s",
              par_last_error());
    cr_expect_eq(run(NULL, (lay){1, 8, 1, 1, 8, 20, 0, 0}, 0), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "expert-tensor-parallel-size 8") && strstr(par_last_error(), "20"), "%s",
              par_last_error());
}

/* Rank r's allocator peaks of its weights and gradients, and its held
 * optimizer state (the plans' accounting: the allocator's optimizer peak
 * also holds Muon's transient scratch), after one step of layout l (heads
 * widened to 4; every rank its own dense copy). */
static void held_bytes(lay l, int64_t peak[][3])
{
    static const par_tag tags[2] = {PAR_TAG_PARAM, PAR_TAG_GRAD};
    par_run_opts o;
    par_run_opts_init(&o);
    tiny(&o.cfg);
    o.cfg.n_heads = o.cfg.o_groups = o.cfg.index_n_heads = 4;
    o.steps = 1;
    o.seed = 1234;
    o.backend = par_backend_find("threads");
    o.layout.tp = l.tp;
    o.layout.etp = l.etp;
    o.layout.ep = l.ep;
    o.layout.world = l.world;
    o.private_replicas = 1;
    par_run_summary s;
    memset(&s, 0, sizeof s);
    cr_assert_eq(par_run(&o, &s), PAR_OK, "%s", par_last_error());
    cr_assert_not_null(s.alloc_peak);
    cr_assert_not_null(s.mem);
    for (int64_t r = 0; r < l.world; r++) {
        for (int k = 0; k < 2; k++)
            peak[r][k] = s.alloc_peak[r * PAR_TAG_COUNT + tags[k]];
        peak[r][2] = s.mem[r * PAR_RUN_MEM + 2];
    }
    par_run_summary_free(&s);
}

/* The entries TP / ETP holds as shards (par_tp_storage_cut: the row and
 * the column cuts, the shared expert under EP and ETP too) are held at
 * 1/P: a rank's weights, gradients and optimizer state (AdamW two slots,
 * Muon one) are TP 1's minus (1 - 1/P) of the split floats (and, with EP,
 * minus (1 - 1/EP) of the routed experts it does not hold), within a few
 * hundred bytes, on every rank, at TP 2, TP 4, ETP 2, TP 2 x EP 2 and TP 2
 * x ETP 2; the split entries are not empty (the check could fail); and the
 * sum of the three on rank 0 is the measured share of TP 1's (cols15:
 * below the row-cuts-only build's 90.5 / 85.7 / 86.0 %). */
Test(tp_run, split_entries_are_held_at_one_over_tp)
{
    par_config c;
    tiny(&c);
    c.n_heads = c.o_groups = c.index_n_heads = 4;
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &c), PAR_OK, "%s", par_last_error());
    static const struct {
        lay l;
        double share, before; /* rank 0's three sums over TP 1's: now, and with the column cuts whole */
    } runs[] = {
        {{2, 1, 1, 1, 2, 0, 0, 0}, 0.8786, 0.905}, {{4, 1, 1, 1, 4, 0, 0, 0}, 0.8179, 0.857},
        {{1, 2, 1, 1, 2, 0, 0, 0}, 0.7905, 0.860}, {{2, 1, 2, 1, 2, 0, 0, 0}, 0, 0},
        {{2, 2, 1, 1, 2, 0, 0, 0}, 0, 0},
    };
    int64_t one[1][3], many[4][3];
    held_bytes((lay){1, 1, 1, 1, 1, 0, 0, 0}, one);
    for (size_t run = 0; run < sizeof runs / sizeof runs[0]; run++) {
        const lay L = runs[run].l;
        par_layout l;
        memset(&l, 0, sizeof l);
        l.tp = L.tp;
        l.etp = L.etp;
        int64_t split[3] = {0, 0, 0}, routed[3] = {0, 0, 0}, np;
        for (int i = 0; i < t.n; i++) {
            const int64_t w = t.p[i].opt == PAR_OPT_ADAMW ? 2 : t.p[i].opt == PAR_OPT_MUON;
            const int cut = par_tp_storage_cut(&l, t.p[i].name, &np) != PAR_TP_REPLICATED;
            const int64_t n = cut ? t.p[i].numel - t.p[i].numel / np : 0; /* what the cut leaves out */
            const int64_t e = t.p[i].expert >= 0 ? (t.p[i].numel - n) - (t.p[i].numel - n) / L.ep : 0;
            cr_assert(!cut || np == (t.p[i].expert >= 0 ? L.etp : L.tp), "%s", t.p[i].name);
            split[0] += n, split[1] += n, split[2] += w * n;
            routed[0] += e, routed[1] += e, routed[2] += w * e;
        }
        cr_assert_gt(split[0], 0, "TP %lld ETP %lld holds nothing as shards", (long long)L.tp, (long long)L.etp);
        held_bytes(L, many);
        const int64_t es = (int64_t)sizeof(double);
        for (int64_t r = 0; r < L.world; r++)
            for (int k = 0; k < 3; k++) {
                const int64_t want = one[0][k] - (split[k] + routed[k]) * es, got = many[r][k];
                if (r == 0)
                    cr_log_info("TP %lld ETP %lld EP %lld rank 0 (weights, grads, optimizer: %d): %lld bytes (TP 1: "
                                "%lld)", (long long)L.tp, (long long)L.etp, (long long)L.ep, k, (long long)got,
                                (long long)one[0][k]);
                cr_expect_leq(llabs(got - want), 512,
                              "TP %lld ETP %lld EP %lld rank %lld (weights, grads, optimizer: %d): %lld bytes held, "
                              "%lld expected (TP 1's %lld less %lld cut and %lld routed floats)", (long long)L.tp,
                              (long long)L.etp, (long long)L.ep, (long long)r, k, (long long)got, (long long)want,
                              (long long)one[0][k], (long long)split[k], (long long)routed[k]);
            }
        if (runs[run].share > 0) {
            const double share = (double)(many[0][0] + many[0][1] + many[0][2]) /
                                 (double)(one[0][0] + one[0][1] + one[0][2]);
            cr_log_info("TP %lld ETP %lld: rank 0 holds %.2f %% of TP 1's bytes", (long long)L.tp, (long long)L.etp,
                        100 * share);
            cr_expect(fabs(share - runs[run].share) < 5e-4 && share < runs[run].before,
                      "TP %lld ETP %lld: rank 0 holds %.4f of TP 1's bytes, expected %.4f (below %.3f)",
                      (long long)L.tp, (long long)L.etp, share, runs[run].share, runs[run].before);
        }
    }
    par_param_table_free(&t);
}
