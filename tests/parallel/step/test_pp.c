/* tests/parallel/step/test_pp.c - pipeline parallelism in the training driver
 * (parallel/step/exec.h): every schedule on v4-tiny (3 layers + MTP) against
 * the serial golden of the same data and seed, with DP, EP, CP and ZeRO-1;
 * split backwards (B, then W later) against the one-pass schedules bit for
 * bit; the executor's bubble on the virtual clock against the dry run with
 * its own costs; the layout and schedule errors `parity run` surfaces; the
 * stage ownership (par_model_init_held). */
#include <criterion/criterion.h>

#include "golden_check.h"
#include "tmpdir.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/netmodel.h"
#include "core/alloc.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "model/model.h"
#include "parallel/train/run.h"

static void golden(const char *out, int precision)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = 2;
    o.seed = 1234;
    o.precision = precision;
    o.out_dir = out;
    cr_assert_eq(par_golden_run(&o, NULL), 0, "%s", par_last_error());
}

typedef struct {
    int64_t pp, vpp, world, ep, cp, mbs, gb;
    const char *layout, *schedule;
    int zero, precision;
    const par_netmodel *net;
    int64_t experts; /* routed experts (0: the preset's) */
} lay;

static par_status run(const char *dump, lay l, par_run_summary *sum)
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    if (l.experts)
        o.cfg.n_routed_experts = l.experts;
    o.precision = l.precision ? l.precision : 64;
    o.steps = 2;
    o.seed = 1234;
    o.backend = par_backend_find("threads");
    cr_assert(o.backend);
    o.layout.pp = l.pp;
    o.layout.vpp = l.vpp;
    o.layout.world = l.world;
    o.layout.ep = l.ep ? l.ep : 1;
    o.layout.cp = l.cp ? l.cp : 1;
    o.layout.micro_batch = l.mbs;
    o.layout.global_batch = l.gb;
    o.layout.distributed_optimizer = l.zero;
    if (l.layout)
        cr_assert_eq(par_layout_set_pp_layout(&o.layout, l.layout), 0);
    if (l.schedule)
        cr_assert_eq(par_layout_set_schedule(&o.layout, l.schedule), 0);
    o.netmodel = l.net;
    o.net_spans = 0;
    o.dump_dir = dump;
    return par_run(&o, sum);
}


/* golden, one layout, compare */
static void cell(lay l, int forward_bitwise, par_run_summary *sum)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "run");
    golden(g, l.precision ? l.precision : 64);
    cr_assert_eq(run(d, l, sum), 0, "%s", par_last_error());
    check_golden(g, d, forward_bitwise);
    rmtree(t);
    free(t), free(g), free(d);
}

Test(pp, pp2_1f1b_matches_the_serial_golden)
{
    par_run_summary sum;
    cell((lay){.pp = 2, .layout = "Et*2|tmL"}, 1, &sum);
    cr_expect_eq(sum.layout.pp, 2);
    cr_expect_str_eq(sum.pp_schedule, "1f1b");
    cr_expect_eq(sum.pp_micro, 8, "m = B / (Da * mbs) = 8 / 1");
    cr_expect(fabs(sum.pp_dry_bubble - 1.0 / 9.0) < 1e-12, "1F1B bubble (p-1)/(m+p-1) = 1/9, got %g",
              sum.pp_dry_bubble);
    cr_expect_lt(sum.pp_net_bubble, 0, "no network: no emulated bubble");
    cr_expect_lt(sum.max_rank_floats, sum.n_params, "a stage holds part of the model");
    par_run_summary_free(&sum);
}

Test(pp, gpipe) { cell((lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "gpipe"}, 1, NULL); }

/* ZB-H1: B the input gradients, W the weight gradients later */
Test(pp, zb_h1) { cell((lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "zb-h1"}, 1, NULL); }

/* DualPipe: two directions, every rank holds stages r and p-1-r (the
 * copies' gradients summed over the pair) */
Test(pp, dualpipe) { cell((lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "dualpipe"}, 1, NULL); }

/* DualPipeV: 4 stages in a V on 2 ranks; the turn at rank 1 is local */
Test(pp, dualpipev) { cell((lay){.pp = 2, .layout = "Et|t|t|mL", .schedule = "dualpipev"}, 1, NULL); }

/* interleaved 1F1B with VPP 2 (from the string's 4 segments), microbatch
 * groups of PP */
Test(pp, interleaved_vpp2)
{
    par_run_summary sum;
    cell((lay){.pp = 2, .layout = "Et|t|t|mL"}, 1, &sum);
    cr_expect_eq(sum.layout.vpp, 2);
    cr_expect_str_eq(sum.pp_schedule, "interleaved");
    par_run_summary_free(&sum);
}

Test(pp, pp3_one_layer_per_stage) { cell((lay){.pp = 3, .layout = "Et|t|tmL"}, 1, NULL); }

/* the MTP block and the head on different stages; an empty stage */
Test(pp, mtp_and_loss_apart) { cell((lay){.pp = 4, .layout = "Et|t|tm|L"}, 1, NULL); }
Test(pp, empty_stage) { cell((lay){.pp = 4, .layout = "Et|t||tmL", .schedule = "gpipe"}, 1, NULL); }

/* two rows per microbatch */
Test(pp, micro_batch_2) { cell((lay){.pp = 2, .layout = "Et*2|tmL", .mbs = 2}, 1, NULL); }

Test(pp, pp2_dp2) { cell((lay){.pp = 2, .layout = "Et*2|tmL", .world = 4, .schedule = "zb-h1"}, 1, NULL); }

Test(pp, pp2_ep2_dualpipev)
{
    cell((lay){.pp = 2, .layout = "Et|t|t|mL", .ep = 2, .schedule = "dualpipev"}, 1, NULL);
}

Test(pp, pp2_zero1) { cell((lay){.pp = 2, .layout = "Et*2|tmL", .world = 4, .zero = 1}, 1, NULL); }

/* CP splits every row: the aux gradient's counts are summed over CP per
 * microbatch; CE sums combine over CP as without PP (not bitwise) */
Test(pp, pp2_cp2) { cell((lay){.pp = 2, .layout = "Et*2|tmL", .cp = 2}, 0, NULL); }

Test(pp, pp2_cp2_ep4_dp2_interleaved)
{
    cell((lay){.pp = 2, .layout = "Et|t|t|mL", .cp = 2, .ep = 4, .world = 8}, 0, NULL);
}

/* f32: every file within the f32 policy, the parameters that AdamW's eps
 * regime amplifies under the golden manifest's written-reason tolerances
 * (docs/golden.md "AdamW's eps regime in f32") */
Test(pp, f32_within_the_f32_policy)
{
    char *t = mktmp(), *g = sub(t, "golden"), *d = sub(t, "run");
    golden(g, 32);
    cr_assert_eq(run(d, (lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "dualpipe", .precision = 32}, NULL), 0,
                 "%s", par_last_error());
    par_compare_opts co;
    par_compare_opts_init(&co);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    int checked = 0;
    for (int i = 0; i < par_compare_report_count(r); i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        checked++;
        cr_expect(e->pass, "%s %s: %s", e->file, e->tensor, e->reason);
    }
    cr_expect_gt(checked, 1000);
    par_compare_report_free(r);
    rmtree(t);
    free(t), free(g), free(d);
}

/* Two runs of one layout under two schedules: every file bitwise equal. */
static void bitwise_pair(lay a, lay b)
{
    char *t = mktmp(), *da = sub(t, "a"), *db = sub(t, "b");
    cr_assert_eq(run(da, a, NULL), 0, "%s", par_last_error());
    cr_assert_eq(run(db, b, NULL), 0, "%s", par_last_error());
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_BITWISE;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(da, db, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "%s vs %s: %d entries differ", a.schedule, b.schedule,
              par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 500);
    par_compare_report_free(r);
    rmtree(t);
    free(t), free(da), free(db);
}

/* ZB-H1 runs every W after its B, in microbatch order like its B's: the
 * weight gradients add up in 1F1B's order, so the split moves no bit (the
 * CP attention hook and the EP executor keep what their W needs) */
Test(pp, zb_h1_is_1f1b_bit_for_bit)
{
    bitwise_pair((lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "1f1b"},
                 (lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "zb-h1"});
    bitwise_pair((lay){.pp = 2, .layout = "Et*2|tmL", .cp = 2, .ep = 2, .world = 4, .schedule = "1f1b"},
                 (lay){.pp = 2, .layout = "Et*2|tmL", .cp = 2, .ep = 2, .world = 4, .schedule = "zb-h1"});
}

/* With the same per-action costs (each F, B, W as the virtual clock timed
 * it) and the network's message time, the dry run's timeline is the
 * executor's: the bubbles agree; the split schedules' W actions cost time. */
Test(pp, executor_bubble_is_the_dry_run_of_its_costs)
{
    par_netmodel nm;
    cr_assert_eq(par_netmodel_preset("reference", &nm), 0);
    static const struct {
        const char *schedule, *layout;
        int split;
    } c[] = {{"1f1b", "Et*2|tmL", 0}, {"zb-h1", "Et*2|tmL", 1}, {"dualpipe", "Et*2|tmL", 1},
             {"dualpipev", "Et|t|t|mL", 1}, {"interleaved", "Et|t|t|mL", 0}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        par_run_summary sum;
        cr_assert_eq(run(NULL, (lay){.pp = 2, .layout = c[i].layout, .schedule = c[i].schedule, .net = &nm}, &sum),
                     0, "%s", par_last_error());
        cr_expect(sum.pp_net_bubble > 0 && sum.pp_net_bubble < 1, "%s: emulated bubble %g", c[i].schedule,
                  sum.pp_net_bubble);
        cr_expect(fabs(sum.pp_net_bubble - sum.pp_dry_bubble_measured) < 1e-9,
                  "%s: executor bubble %.12f, dry run with its costs %.12f", c[i].schedule, sum.pp_net_bubble,
                  sum.pp_dry_bubble_measured);
        cr_expect_eq(sum.pp_cost_w_s > 0, c[i].split, "%s: W costs %g s", c[i].schedule, sum.pp_cost_w_s);
        cr_expect_gt(sum.pp_cost_f_s, 0);
        cr_expect_gt(sum.pp_latency_s, 0);
        par_run_summary_free(&sum);
    }
}

Test(pp, emulated_bubble_with_a_network)
{
    par_netmodel nm;
    cr_assert_eq(par_netmodel_preset("h800", &nm), 0);
    par_run_summary sum;
    cr_assert_eq(run(NULL, (lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "gpipe", .net = &nm}, &sum), 0, "%s",
                 par_last_error());
    cr_expect(sum.pp_net_bubble > 0 && sum.pp_net_bubble < 1, "emulated bubble %g", sum.pp_net_bubble);
    cr_expect_gt(sum.pp_net_makespan_s, 0);
    par_run_summary_free(&sum);
}

Test(pp, nothing_left_allocated)
{
    int64_t before = par_alloc_live_total();
    cr_assert_eq(run(NULL, (lay){.pp = 2, .layout = "Et|t|t|mL", .ep = 2, .schedule = "dualpipev"}, NULL), 0, "%s",
                 par_last_error());
    cr_assert_eq(run(NULL, (lay){.pp = 2, .layout = "Et*2|tmL", .cp = 2, .schedule = "dualpipe"}, NULL), 0, "%s",
                 par_last_error());
    cr_expect_eq(par_alloc_live_total(), before, "live bytes %lld -> %lld", (long long)before,
                 (long long)par_alloc_live_total());
}

/* The aux-loss counts (cnt, psum, ntok: [blocks, samples, E] of a rank's
 * blocks) live in the slot of a microbatch in flight (parallel/step/exec_stage.c),
 * not for the whole step: the last stage of 1F1B holds one microbatch at a
 * time, so its activation peak must not grow by a microbatch's counts for
 * each microbatch more in the step (it did: the window held every sample's
 * counts, twice under CP).  E = 1024 makes one sample's counts of the
 * stage's two blocks (t, m) 2 x 1024 x 16 = 32 KiB. */
Test(pp, aux_counts_live_per_microbatch_in_flight)
{
    par_run_summary a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    cr_assert_eq(run(NULL, (lay){.pp = 2, .layout = "Et*2|tmL", .mbs = 1, .gb = 4, .experts = 1024}, &a), 0, "%s",
                 par_last_error());
    cr_assert_eq(run(NULL, (lay){.pp = 2, .layout = "Et*2|tmL", .mbs = 1, .gb = 16, .experts = 1024}, &b), 0, "%s",
                 par_last_error());
    const int64_t pa = a.alloc_peak[PAR_TAG_COUNT + PAR_TAG_ACT], pb = b.alloc_peak[PAR_TAG_COUNT + PAR_TAG_ACT];
    const int64_t one = 2 * 1024 * 16; /* one sample's counts of the two blocks; a row holds one or more samples */
    cr_expect_lt(pb - pa, 12 * one / 2, "last stage's activation peak %lld (m 4) -> %lld (m 16): +%lld bytes, "
                 "the counts of 12 microbatches are >= %lld", (long long)pa, (long long)pb, (long long)(pb - pa),
                 (long long)(12 * one));
    par_run_summary_free(&a);
    par_run_summary_free(&b);
}

/* A rank frees each send's heap copy once the send is done (executor.c
 * reap_sends, issue 18): its comm peak does not grow with the microbatches.
 * Before, every send of the step was kept to its end: 16 microbatches held
 * 12 more messages than 4 (1F1B's first stage: 12 x 64 KiB more; measured
 * 577 KiB more, interleaved 2.3 MiB).  The bound leaves the threads' timing
 * up to 3 messages: a rank frees a send at its next message (the peer may
 * not have matched it yet).  With a network, a send also waits for the
 * rank's clock to pass its virtual completion (par_test_due). */
Test(pp, sends_freed_when_done)
{
    par_netmodel nm;
    cr_assert_eq(par_netmodel_preset("reference", &nm), 0);
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    const int64_t msg = cfg.seq_length * cfg.hc_mult * cfg.dim * (int64_t)sizeof(double); /* mbs 1, f64 */
    static const struct {
        const char *schedule, *layout;
    } c[] = {{"1f1b", "Et*2|tmL"}, {"zb-h1", "Et*2|tmL"}, {"dualpipev", "Et|t|t|mL"}, {"interleaved", "Et|t|t|mL"}};
    /* Not gpipe: its phases send every microbatch back to back with no
     * receive from the peer between them, so how many sends the peer has
     * matched depends on the threads' timing alone (seen under load: rank
     * 1's gradients, 4 messages over the bound).  The schedules above
     * receive from the peer between sends, and a receive means the peer is
     * past the matching receives of the earlier sends. */
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        for (int net = 0; net < 2; net++) {
            int64_t peak[2][2];
            for (int k = 0; k < 2; k++) {
                par_run_summary sum;
                lay l = {.pp = 2, .layout = c[i].layout, .schedule = c[i].schedule, .mbs = 1, .gb = k ? 16 : 4,
                         .net = net ? &nm : NULL};
                cr_assert_eq(run(NULL, l, &sum), 0, "%s", par_last_error());
                for (int r = 0; r < 2; r++)
                    peak[k][r] = sum.alloc_peak[r * PAR_TAG_COUNT + PAR_TAG_COMM];
                par_run_summary_free(&sum);
            }
            for (int r = 0; r < 2; r++)
                cr_expect_lt(peak[1][r] - peak[0][r], 3 * msg,
                             "%s%s rank %d: comm peak %lld B with 4 microbatches, %lld B with 16 (messages of %lld B)",
                             c[i].schedule, net ? " (network)" : "", r, (long long)peak[0][r], (long long)peak[1][r],
                             (long long)msg);
        }
}

/* ---- errors parity run surfaces (the layout's and the schedule's) ---- */

static void expect_error(lay l, par_status code, const char *a, const char *b)
{
    par_err_set_quiet(1);
    par_status s = run(NULL, l, NULL);
    par_err_set_quiet(0);
    cr_expect_eq(s, code, "status %d: %s", s, par_last_error());
    cr_expect(strstr(par_last_error(), a) && (!b || strstr(par_last_error(), b)), "%s", par_last_error());
}

Test(pp, vpp_rule_for_a_one_chunk_schedule)
{
    expect_error((lay){.pp = 2, .layout = "Et|t|t|mL", .schedule = "1f1b"}, PAR_EINVAL, "1f1b",
                 "virtual-pipeline-model-parallel-size is 2");
}

Test(pp, malformed_layout_string)
{
    expect_error((lay){.pp = 2, .layout = "Et*2|(tmL"}, PAR_EINVAL, "column", NULL);
    expect_error((lay){.pp = 2, .layout = "Et*3|tmL"}, PAR_EINVAL, "n_layers", NULL);
}

Test(pp, three_layers_do_not_split_evenly)
{
    expect_error((lay){.pp = 2}, PAR_EINVAL, "divisible", NULL);
}

Test(pp, dualpipe_needs_enough_microbatches)
{
    expect_error((lay){.pp = 2, .layout = "Et*2|tmL", .schedule = "dualpipe", .world = 8}, PAR_EINVAL, "dualpipe",
                 "m = 2");
}

/* ---- ownership ---- */

Test(pp, held_model_holds_its_stage)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), 0);
    par_model_f64 A, H;
    cr_assert_eq(par_model_init_f64(&A, &c, 5), 0);
    uint8_t blocks[4] = {0, 0, 1, 1}; /* layer 2 and mtp.0 */
    par_model_hold h = {.blocks = blocks, .embed = 1, .head = 1, .final = 1};
    cr_assert_eq(par_model_init_held_f64(&H, &c, 5, 2, 6, &h), 0, "%s", par_last_error());
    int held = 0;
    for (int i = 0; i < A.tab.n; i++) {
        const par_param *p = &A.tab.p[i];
        if (p->dtype != PAR_PDT_REAL)
            continue;
        int want = p->layer >= 0 ? blocks[p->layer] && (p->expert < 0 || (p->expert >= 2 && p->expert < 6)) : 1;
        double *a = par_model_ptr_f64(&A, A.params, i), *o = par_model_ptr_f64(&H, H.params, i);
        cr_expect_eq(o != NULL, want, "%s: held %d, expected %d", p->name, o != NULL, want);
        if (o) {
            held++;
            cr_expect_eq(memcmp(a, o, (size_t)p->numel * sizeof *a), 0, "%s: not the serial values", p->name);
        }
    }
    cr_expect_gt(held, 10);
    cr_expect_lt(H.n_local, A.n_local);
    par_model_free_f64(&A);
    par_model_free_f64(&H);
}
