/* Pipeline schedules: every generator passes the dry run for many (p, m, v);
 * 1F1B's bubble is (p-1)/(m+p-1); ZB-H1 and DualPipe(V) meet their published
 * bubbles; peak activations of 1F1B and GPipe; broken schedules (a dropped
 * receive or send, a deadlock, a duplicate, a bad tag) are caught with a
 * message; invalid VPP combinations are rejected; the SVG and trace files. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/status.h"
#include "parallel/schedule/schedule.h"

static int64_t live0;

static void setup(void)
{
    par_err_set_quiet(1);
    live0 = par_alloc_live_total();
}

static void teardown(void) { cr_expect_eq(par_alloc_live_total(), live0, "allocations left live"); }

TestSuite(schedule, .init = setup, .fini = teardown);

static void build(par_sched_kind k, int p, int v, int m, int g, par_schedule *s)
{
    par_schedule_params sp;
    par_schedule_params_init(&sp);
    sp.kind = k;
    sp.pp = p;
    sp.vpp = v;
    sp.n_micro = m;
    sp.mb_group = g;
    par_status st = par_schedule_build(&sp, s);
    cr_assert_eq(st, PAR_OK, "%s p %d v %d m %d g %d: %s", par_schedule_kind_name(k), p, v, m, g, par_last_error());
}

static void simulate(const par_schedule *s, const par_sched_costs *c, par_sched_sim *sim)
{
    par_status st = par_schedule_simulate(s, c, sim);
    cr_assert_eq(st, PAR_OK, "%s p %d v %d m %d: %s", par_schedule_kind_name(s->params.kind), s->params.pp,
                 s->params.vpp, s->params.n_micro, par_last_error());
}

/* Builds, dry-runs and counts the actions: exactly m*S F, m*S backwards, and
 * one W per split B. */
static void check_one(par_sched_kind k, int p, int v, int m, int g)
{
    par_schedule s;
    build(k, p, v, m, g, &s);
    par_sched_costs c;
    par_sched_costs_init(&c);
    par_sched_sim sim;
    simulate(&s, &c, &sim);
    int nf = 0, nb = 0, nw = 0, nbw = 0;
    for (int r = 0; r < p; r++)
        for (int i = 0; i < s.n_actions[r]; i++) {
            int kind = s.actions[r][i].kind;
            nf += kind == PAR_ACT_F;
            nb += kind == PAR_ACT_B;
            nw += kind == PAR_ACT_W;
            nbw += kind == PAR_ACT_BW;
        }
    int want = m * s.n_stages;
    cr_expect_eq(nf, want, "%s p %d v %d m %d: %d F, want %d", par_schedule_kind_name(k), p, v, m, nf, want);
    cr_expect_eq(nb + nbw, want, "%s p %d m %d: %d backwards", par_schedule_kind_name(k), p, m, nb + nbw);
    cr_expect_eq(nw, nb, "%s: %d W for %d split B", par_schedule_kind_name(k), nw, nb);
    cr_expect(s.split_bw || nb == 0, "unsplit schedule with split B");
    /* each rank's busy time is its share of the work */
    for (int r = 0; r < p; r++)
        cr_expect(sim.busy[r] <= sim.makespan + 1e-9 && sim.idle[r] >= -1e-9, "rank %d busy %g > makespan %g", r,
                  sim.busy[r], sim.makespan);
    par_sched_sim_free(&sim);
    par_schedule_free(&s);
}

Test(schedule, every_generator_passes_the_dry_run)
{
    static const int ps[] = {1, 2, 3, 4, 8};
    static const int ms[] = {1, 2, 3, 4, 5, 8, 13, 32};
    par_sched_kind simple[] = {PAR_SCHED_GPIPE, PAR_SCHED_1F1B, PAR_SCHED_ZBH1};
    for (int k = 0; k < 3; k++)
        for (size_t a = 0; a < sizeof ps / sizeof *ps; a++)
            for (size_t b = 0; b < sizeof ms / sizeof *ms; b++)
                check_one(simple[k], ps[a], 0, ms[b], 0);
    int n_inter = 0;
    for (int p = 2; p <= 4; p++)
        for (int v = 2; v <= 4; v++)
            for (int m = p; m <= 3 * p + 2; m++)
                for (int g = p; g <= p + 2 && g <= m; g++) {
                    par_schedule_params sp, out;
                    par_schedule_params_init(&sp);
                    sp.kind = PAR_SCHED_INTERLEAVED;
                    sp.pp = p;
                    sp.vpp = v;
                    sp.n_micro = m;
                    sp.mb_group = g;
                    if (par_schedule_params_check(&sp, &out) != PAR_OK)
                        continue; /* remainder rule: tested below */
                    check_one(PAR_SCHED_INTERLEAVED, p, v, m, g);
                    n_inter++;
                }
    cr_expect_gt(n_inter, 60, "only %d interleaved cases ran", n_inter);
    for (int p = 2; p <= 8; p += 2)
        for (int m = 2 * p; m <= 4 * p + 2; m += 2)
            check_one(PAR_SCHED_DUALPIPE, p, 0, m, 0);
    for (int p = 2; p <= 5; p++)
        for (int m = 2 * p; m <= 4 * p + 1; m++)
            check_one(PAR_SCHED_DUALPIPEV, p, 0, m, 0);
    check_one(PAR_SCHED_DUALPIPEV, 8, 2, 20, 0);
}

static double bubble_of(par_sched_kind k, int p, int v, int m, const par_sched_costs *c, par_sched_sim *keep)
{
    par_schedule s;
    build(k, p, v, m, 0, &s);
    par_sched_sim sim;
    simulate(&s, c, &sim);
    double b = sim.bubble;
    if (keep)
        *keep = sim;
    else
        par_sched_sim_free(&sim);
    par_schedule_free(&s);
    return b;
}

Test(schedule, one_f_one_b_bubble_is_p_minus_1_over_m_plus_p_minus_1)
{
    par_sched_costs c;
    par_sched_costs_init(&c); /* F 1, B 2, free messages */
    struct {
        int m;
        double pct;
    } cases[] = {{32, 17.9}, {4, 63.6}, {16, 30.4}};
    for (int i = 0; i < 3; i++) {
        double b = bubble_of(PAR_SCHED_1F1B, 8, 0, cases[i].m, &c, NULL);
        cr_expect(fabs(b - 7.0 / (cases[i].m + 7)) < 1e-12, "PP8 m %d: bubble %.15g, want 7/%d", cases[i].m, b,
                  cases[i].m + 7);
        cr_expect(fabs(100 * b - cases[i].pct) < 0.05, "PP8 m %d: %.2f %%, want %.1f %%", cases[i].m, 100 * b,
                  cases[i].pct);
    }
    /* other sizes and costs: the formula does not depend on F and B */
    c.f = 1.5;
    c.b = 2.5;
    c.w = 0.5;
    for (int p = 1; p <= 6; p++)
        for (int m = 1; m <= 12; m += 3) {
            double b = bubble_of(PAR_SCHED_1F1B, p, 0, m, &c, NULL);
            cr_expect(fabs(b - (double)(p - 1) / (m + p - 1)) < 1e-12, "p %d m %d: %.15g", p, m, b);
        }
}

Test(schedule, peak_activations_of_1f1b_and_gpipe)
{
    par_sched_costs c;
    par_sched_costs_init(&c);
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 2 * p + 3; m += p + 3) {
            par_sched_sim sim;
            bubble_of(PAR_SCHED_1F1B, p, 0, m, &c, &sim);
            for (int r = 0; r < p; r++) {
                cr_expect_eq(sim.peak_live[r], p - r, "1f1b p %d m %d rank %d: peak %d, want %d", p, m, r,
                             sim.peak_live[r], p - r);
                cr_expect_eq(sim.peak_held[r], sim.peak_live[r], "1f1b: BW frees at once");
            }
            par_sched_sim_free(&sim);
            bubble_of(PAR_SCHED_GPIPE, p, 0, m, &c, &sim);
            for (int r = 0; r < p; r++)
                cr_expect_eq(sim.peak_live[r], m, "gpipe p %d rank %d: peak %d, want m %d", p, r, sim.peak_live[r], m);
            par_sched_sim_free(&sim);
        }
    /* fewer microbatches than stages: 1F1B holds min(p - r, m) */
    par_sched_sim sim;
    bubble_of(PAR_SCHED_1F1B, 8, 0, 3, &c, &sim);
    cr_expect_eq(sim.peak_live[0], 3);
    cr_expect_eq(sim.peak_live[7], 1);
    par_sched_sim_free(&sim);
}

/* Zero Bubble paper (Qi et al. 2023) under its assumption T_F = T_B = T_W:
 * ZB-H1's bubble is (p-1)(F + B - 2W) with B the whole backward, against
 * 1F1B's (p-1)(F + B), and its peak memory is 1F1B's (p on every rank). */
Test(schedule, zb_h1_bubble_and_memory)
{
    par_sched_costs c;
    par_sched_costs_init(&c); /* F 1, B 2 = (B 1 + W 1), W 1 */
    for (int p = 2; p <= 8; p += 2)
        for (int m = p; m <= 4 * p; m += p) {
            par_sched_sim zb, ob;
            bubble_of(PAR_SCHED_ZBH1, p, 0, m, &c, &zb);
            bubble_of(PAR_SCHED_1F1B, p, 0, m, &c, &ob);
            double want_zb = (p - 1) * (c.f + c.b - 2 * c.w), want_1f1b = (p - 1) * (c.f + c.b);
            cr_expect(fabs(zb.makespan - (m * (c.f + c.b) + want_zb)) < 1e-9, "zb-h1 p %d m %d: makespan %g", p, m,
                      zb.makespan);
            for (int r = 0; r < p; r++) {
                cr_expect(fabs(zb.idle[r] - want_zb) < 1e-9, "zb-h1 p %d m %d rank %d: idle %g, want %g", p, m, r,
                          zb.idle[r], want_zb);
                cr_expect(fabs(ob.idle[r] - want_1f1b) < 1e-9, "1f1b p %d m %d rank %d: idle %g, want %g", p, m, r,
                          ob.idle[r], want_1f1b);
                cr_expect_eq(zb.peak_held[r], p, "zb-h1 p %d rank %d holds %d until W, want p", p, r, zb.peak_held[r]);
                cr_expect_eq(zb.peak_live[r], p - r);
            }
            cr_expect(fabs(zb.bubble - want_zb / (m * 3.0 + want_zb)) < 1e-12, "zb-h1 fraction %g", zb.bubble);
            par_sched_sim_free(&zb);
            par_sched_sim_free(&ob);
        }
    /* the form holds for other costs too (checked: W = 0.5, all doubled) */
    double ws[] = {0.5, 2.0};
    for (int i = 0; i < 2; i++) {
        par_sched_costs c2 = c;
        if (i == 0) {
            c2.w = 0.5;
        } else {
            c2.f = 2;
            c2.b = 4;
            c2.w = ws[i];
        }
        par_sched_sim zb;
        bubble_of(PAR_SCHED_ZBH1, 8, 0, 20, &c2, &zb);
        for (int r = 0; r < 8; r++)
            cr_expect(fabs(zb.idle[r] - 7 * (c2.f + c2.b - 2 * c2.w)) < 1e-9, "zb-h1 costs %d rank %d: idle %g", i, r,
                      zb.idle[r]);
        par_sched_sim_free(&zb);
    }
}

/* DualPipe README / DeepSeek-V3 report: bubble (PP/2 - 1)(F&B + B - 3W) for
 * PP stages (DualPipeV: 2p stages on p ranks), B the whole backward, with
 * F = B - W = W as in the Zero Bubble paper; the largest idle of any rank
 * (the middle ranks) is that bubble.  Activations: PP + 1. */
Test(schedule, dualpipe_bubble_and_memory)
{
    par_sched_costs c;
    par_sched_costs_init(&c);
    double fbs[] = {0.0, 2.5, 2.0};
    for (int kv = 0; kv < 2; kv++)
        for (int p = kv ? 2 : 4; p <= 8; p += 2)
            for (int m = 2 * p; m <= 2 * p + 12; m += 6)
                for (int f = 0; f < 3; f++) {
                    par_sched_kind k = kv ? PAR_SCHED_DUALPIPEV : PAR_SCHED_DUALPIPE;
                    int stages = kv ? 2 * p : p;
                    int mm = kv ? m : m + (m % 2);
                    c.fb = fbs[f];
                    double fb = c.fb > 0 ? c.fb : c.f + c.b;
                    double want = (stages / 2 - 1) * (fb + c.b - 3 * c.w);
                    par_sched_sim sim;
                    bubble_of(k, p, 0, mm, &c, &sim);
                    double worst = 0;
                    int peak = 0;
                    for (int r = 0; r < p; r++) {
                        worst = sim.idle[r] > worst ? sim.idle[r] : worst;
                        peak = sim.peak_held[r] > peak ? sim.peak_held[r] : peak;
                    }
                    cr_expect(fabs(worst - want) < 1e-9, "%s p %d m %d F&B %g: worst idle %g, want %g",
                              par_schedule_kind_name(k), p, mm, fb, worst, want);
                    cr_expect_eq(peak, stages + 1, "%s p %d m %d: peak activations %d, want PP+1 = %d",
                                 par_schedule_kind_name(k), p, mm, peak, stages + 1);
                    par_sched_sim_free(&sim);
                }
}

/* Interleaved 1F1B (Narayanan et al. 2021): with chunk costs F, B the idle
 * of every rank is (p-1)(F+B), 1/v of 1F1B's with v-times larger stages. */
Test(schedule, interleaved_bubble)
{
    par_sched_costs c;
    par_sched_costs_init(&c);
    for (int p = 2; p <= 4; p++)
        for (int v = 2; v <= 3; v++)
            for (int m = p; m <= 3 * p; m += p) {
                par_sched_sim sim;
                bubble_of(PAR_SCHED_INTERLEAVED, p, v, m, &c, &sim);
                for (int r = 0; r < p; r++)
                    cr_expect(fabs(sim.idle[r] - (p - 1) * (c.f + c.b)) < 1e-9, "p %d v %d m %d rank %d: idle %g", p, v,
                              m, r, sim.idle[r]);
                /* Megatron's warmup: (p-r-1)*2 + (v-1)*p forwards, plus one */
                int want0 = 2 * (p - 1) + (v - 1) * p + 1;
                if (want0 > m * v)
                    want0 = m * v;
                cr_expect_eq(sim.peak_live[0], want0, "p %d v %d m %d: rank 0 peak %d, want %d", p, v, m,
                             sim.peak_live[0], want0);
                par_sched_sim_free(&sim);
            }
}

static void expect_broken(par_schedule *s, const char *const *needles)
{
    par_sched_costs c;
    par_sched_costs_init(&c);
    par_sched_sim sim;
    par_status st = par_schedule_simulate(s, &c, &sim);
    cr_expect_eq(st, PAR_ECHECK, "broken schedule passed (status %d)", st);
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(par_last_error(), needles[i]), "message lacks '%s': %s", needles[i], par_last_error());
    if (st == PAR_OK)
        par_sched_sim_free(&sim);
}

Test(schedule, dropped_receive_is_caught)
{
    par_schedule s;
    build(PAR_SCHED_1F1B, 4, 0, 6, 0, &s);
    int i = par_schedule_find(&s, 2, PAR_ACT_RECV_ACT, 3, 2);
    cr_assert_geq(i, 0);
    cr_assert_eq(par_schedule_remove(&s, 2, i), PAR_OK);
    expect_broken(&s, (const char *const[]){"rank 2", "F mb 3 stage 2", "input", NULL});
    par_schedule_free(&s);

    /* a dropped gradient receive */
    build(PAR_SCHED_ZBH1, 3, 0, 5, 0, &s);
    i = par_schedule_find(&s, 0, PAR_ACT_RECV_GRAD, 4, 0);
    cr_assert_geq(i, 0);
    par_schedule_remove(&s, 0, i);
    expect_broken(&s, (const char *const[]){"rank 0", "B mb 4 stage 0", "gradient", NULL});
    par_schedule_free(&s);
}

Test(schedule, dropped_send_is_caught)
{
    par_schedule s;
    build(PAR_SCHED_GPIPE, 3, 0, 4, 0, &s);
    int i = par_schedule_find(&s, 1, PAR_ACT_SEND_GRAD, 3, 1); /* rank 1's last message */
    cr_assert_geq(i, 0);
    par_schedule_remove(&s, 1, i);
    expect_broken(&s, (const char *const[]){"unmatched receive", "rank 0 waits", "recv-grad mb 3 stage 0",
                                            "rank 1 finished", NULL});
    par_schedule_free(&s);

    /* dropping an earlier send leaves rank 1 waiting while rank 0 waits for
     * rank 1's gradient: reported as the cycle it is */
    build(PAR_SCHED_GPIPE, 3, 0, 4, 0, &s);
    i = par_schedule_find(&s, 0, PAR_ACT_SEND_ACT, 3, 0);
    par_schedule_remove(&s, 0, i);
    expect_broken(&s, (const char *const[]){"deadlock", "recv-act mb 3 stage 1 from rank 0", NULL});
    par_schedule_free(&s);
}

Test(schedule, swapped_actions_deadlock_is_caught)
{
    /* rank 0 waits for the gradient of mb 0 before sending its activation:
     * rank 1 waits for that activation - a cycle. */
    par_schedule s;
    build(PAR_SCHED_1F1B, 2, 0, 4, 0, &s);
    int send = par_schedule_find(&s, 0, PAR_ACT_SEND_ACT, 0, 0);
    int recv = par_schedule_find(&s, 0, PAR_ACT_RECV_GRAD, 0, 0);
    cr_assert(send >= 0 && recv > send);
    cr_assert_eq(par_schedule_move(&s, 0, recv, send), PAR_OK);
    expect_broken(&s, (const char *const[]){"deadlock", "rank 0 waits", "rank 1 waits", "recv-grad mb 0",
                                            "recv-act mb 0", NULL});
    par_schedule_free(&s);

    /* a three-rank cycle in the interleaved schedule: rank 2 receives the
     * gradient of its first backward before it sends any activation */
    build(PAR_SCHED_INTERLEAVED, 3, 2, 3, 0, &s);
    int first_send = -1, first_rg = -1;
    for (int j = 0; j < s.n_actions[2]; j++) {
        if (first_send < 0 && s.actions[2][j].kind == PAR_ACT_SEND_ACT)
            first_send = j;
        if (first_rg < 0 && s.actions[2][j].kind == PAR_ACT_RECV_GRAD)
            first_rg = j;
    }
    cr_assert(first_send >= 0 && first_rg > first_send);
    par_schedule_move(&s, 2, first_rg, first_send);
    expect_broken(&s, (const char *const[]){"deadlock", "rank 2 waits", NULL});
    par_schedule_free(&s);
}

Test(schedule, duplicates_bad_tags_and_wrong_ranks_are_caught)
{
    par_schedule s;
    build(PAR_SCHED_1F1B, 2, 0, 3, 0, &s);
    int i = par_schedule_find(&s, 1, PAR_ACT_F, 1, 1);
    cr_assert_geq(i, 0);
    par_action dup = s.actions[1][i];
    cr_assert_eq(par_schedule_push(&s, 1, dup), PAR_OK);
    expect_broken(&s, (const char *const[]){"second F", NULL});
    par_schedule_free(&s);

    build(PAR_SCHED_1F1B, 2, 0, 3, 0, &s);
    i = par_schedule_find(&s, 0, PAR_ACT_SEND_ACT, 2, 0);
    s.actions[0][i].tag += 2;
    expect_broken(&s, (const char *const[]){"tag rule", NULL});
    par_schedule_free(&s);

    build(PAR_SCHED_1F1B, 2, 0, 3, 0, &s);
    i = par_schedule_find(&s, 0, PAR_ACT_BW, 2, 0);
    par_schedule_remove(&s, 0, i);
    expect_broken(&s, (const char *const[]){"microbatch 2 stage 0 has no backward", NULL});
    par_schedule_free(&s);

    build(PAR_SCHED_ZBH1, 2, 0, 3, 0, &s);
    i = par_schedule_find(&s, 1, PAR_ACT_W, 0, 1);
    par_schedule_remove(&s, 1, i);
    expect_broken(&s, (const char *const[]){"microbatch 0 stage 1 has no W", NULL});
    par_schedule_free(&s);

    build(PAR_SCHED_1F1B, 2, 0, 3, 0, &s);
    s.actions[1][0].stage = 0; /* a recv claiming stage 0, which is rank 0's */
    expect_broken(&s, (const char *const[]){"belongs to rank 0", NULL});
    par_schedule_free(&s);
}

static void expect_invalid(par_sched_kind k, int p, int v, int m, int g, const char *const *needles)
{
    par_schedule_params sp, out;
    par_schedule_params_init(&sp);
    sp.kind = k;
    sp.pp = p;
    sp.vpp = v;
    sp.n_micro = m;
    sp.mb_group = g;
    cr_expect_eq(par_schedule_params_check(&sp, &out), PAR_EINVAL, "%s p %d v %d m %d g %d accepted",
                 par_schedule_kind_name(k), p, v, m, g);
    for (int i = 0; needles[i]; i++)
        cr_expect(strstr(par_last_error(), needles[i]), "message lacks '%s': %s", needles[i], par_last_error());
    par_schedule s;
    cr_expect_eq(par_schedule_build(&sp, &s), PAR_EINVAL);
}

Test(schedule, invalid_combinations_are_rejected)
{
    /* Megatron-LM: PP <= microbatch group size <= M */
    expect_invalid(PAR_SCHED_INTERLEAVED, 4, 2, 3, 0, (const char *const[]){"PP=4", "M=3", NULL});
    expect_invalid(PAR_SCHED_INTERLEAVED, 4, 2, 8, 2, (const char *const[]){"group size 2", "PP=4", "M=8", NULL});
    expect_invalid(PAR_SCHED_INTERLEAVED, 4, 2, 8, 9, (const char *const[]){"group size 9", "[PP=4, M=8]", NULL});
    /* ... and the last group empty or >= PP */
    expect_invalid(PAR_SCHED_INTERLEAVED, 4, 2, 9, 0, (const char *const[]){"9 % 4 = 1", "PP=4", NULL});
    expect_invalid(PAR_SCHED_INTERLEAVED, 4, 1, 8, 0, (const char *const[]){"interleaved", ">= 2, got 1", NULL});
    expect_invalid(PAR_SCHED_INTERLEAVED, 1, 2, 8, 0, (const char *const[]){"pipeline-model-parallel-size >= 2", NULL});
    expect_invalid(PAR_SCHED_1F1B, 4, 2, 8, 0, (const char *const[]){"'1f1b'", "interleaved", NULL});
    expect_invalid(PAR_SCHED_ZBH1, 4, 3, 8, 0, (const char *const[]){"'zb-h1'", "is 3", NULL});
    expect_invalid(PAR_SCHED_1F1B, 4, 0, 8, 5, (const char *const[]){"group size (5)", "interleaved", NULL});
    expect_invalid(PAR_SCHED_DUALPIPEV, 4, 3, 8, 0, (const char *const[]){"must be 2, got 3", NULL});
    expect_invalid(PAR_SCHED_DUALPIPEV, 4, 0, 7, 0, (const char *const[]){"m >= 2*PP", "m = 7", NULL});
    expect_invalid(PAR_SCHED_DUALPIPE, 3, 0, 8, 0, (const char *const[]){"even PP", "got 3", NULL});
    expect_invalid(PAR_SCHED_DUALPIPE, 4, 0, 9, 0, (const char *const[]){"even number", "m = 9", NULL});
    expect_invalid(PAR_SCHED_DUALPIPE, 4, 2, 8, 0, (const char *const[]){"must be 1, got 2", NULL});
    expect_invalid(PAR_SCHED_GPIPE, 0, 0, 8, 0, (const char *const[]){"got 0", NULL});
    expect_invalid(PAR_SCHED_GPIPE, 2, 0, 0, 0, (const char *const[]){"microbatches", NULL});
    par_sched_kind k;
    cr_expect_eq(par_schedule_kind_parse("zb-h2", &k), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "zb-h2"));
    cr_expect_eq(par_schedule_kind_parse("dualpipev", &k), PAR_OK);
    cr_expect_eq(k, PAR_SCHED_DUALPIPEV);
    /* costs */
    par_schedule s;
    build(PAR_SCHED_1F1B, 2, 0, 2, 0, &s);
    par_sched_costs c;
    par_sched_costs_init(&c);
    c.w = 3; /* W is part of B = 2 */
    par_sched_sim sim;
    cr_expect_eq(par_schedule_simulate(&s, &c, &sim), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "W 3"), "%s", par_last_error());
    par_schedule_free(&s);
}

Test(schedule, latency_and_per_stage_costs)
{
    par_sched_costs c;
    par_sched_costs_init(&c);
    c.latency = 0.5;
    par_sched_sim sim;
    /* 1F1B with a slow link: the first forward and last backward chains
     * each pay (p-1) latencies on top of (m+p-1)(F+B) */
    bubble_of(PAR_SCHED_1F1B, 4, 0, 8, &c, &sim);
    cr_expect_gt(sim.makespan, 11 * 3.0, "latency must cost time: %g", sim.makespan);
    cr_expect_leq(sim.makespan, 11 * 3.0 + 2 * 3 * 0.5 * 8, "%g", sim.makespan);
    par_sched_sim_free(&sim);
    /* a slow last stage bounds the makespan from below by m * its cost */
    par_schedule s;
    build(PAR_SCHED_1F1B, 4, 0, 8, 0, &s);
    double fs[4] = {1, 1, 1, 3}, bs[4] = {2, 2, 2, 4};
    par_sched_costs_init(&c);
    c.f_stage = fs;
    c.b_stage = bs;
    simulate(&s, &c, &sim);
    cr_expect(fabs(sim.busy[3] - 8 * 7.0) < 1e-12 && sim.makespan >= 56, "busy %g makespan %g", sim.busy[3],
              sim.makespan);
    par_sched_sim_free(&sim);
    par_schedule_free(&s);
}

Test(schedule, svg_and_trace_files)
{
    char dir[] = "/tmp/parity-sched-XXXXXX";
    cr_assert(mkdtemp(dir));
    char svg[256], trace[256];
    snprintf(svg, sizeof svg, "%s/t.svg", dir);
    snprintf(trace, sizeof trace, "%s/t.json", dir);
    par_schedule s;
    build(PAR_SCHED_DUALPIPE, 4, 0, 8, 0, &s);
    par_sched_costs c;
    par_sched_costs_init(&c);
    par_sched_sim sim;
    simulate(&s, &c, &sim);
    cr_assert_eq(par_sched_write_svg(&s, &sim, svg), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_sched_write_trace(&s, &sim, trace), PAR_OK, "%s", par_last_error());
    int n_compute = 0;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < s.n_actions[r]; i++)
            n_compute += s.actions[r][i].kind <= PAR_ACT_BW;
    void *data;
    size_t len;
    cr_assert_eq(par_file_read(trace, PAR_TAG_IO, &data, &len), PAR_OK);
    cJSON *j = cJSON_Parse(data);
    cr_assert(j, "trace is not JSON");
    cJSON *ev = cJSON_GetObjectItem(j, "traceEvents");
    cr_expect_eq(cJSON_GetArraySize(ev), n_compute + 4, "events %d, want %d + 4 names", cJSON_GetArraySize(ev),
                 n_compute);
    int n_x = 0;
    double end = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, ev)
    {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(e, "ph"));
        if (ph && !strcmp(ph, "X")) {
            n_x++;
            cr_expect_eq(cJSON_GetObjectItem(e, "pid")->valueint, cJSON_GetObjectItem(e, "tid")->valueint);
            double t = cJSON_GetObjectItem(e, "ts")->valuedouble + cJSON_GetObjectItem(e, "dur")->valuedouble;
            end = t > end ? t : end;
        }
    }
    cr_expect_eq(n_x, n_compute);
    cr_expect(fabs(end - 1000 * sim.makespan) < 1e-6, "trace ends at %g us, makespan %g", end, sim.makespan);
    cJSON_Delete(j);
    par_free(data);
    cr_assert_eq(par_file_read(svg, PAR_TAG_IO, &data, &len), PAR_OK);
    cr_expect(strstr(data, "<svg") && strstr(data, "</svg>") && strstr(data, "rank 3"), "svg content");
    cr_expect(strstr(data, "bubble"), "svg title");
    par_free(data);
    /* the text timeline: one line per rank */
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    par_sched_timeline_text(&s, &sim, 0, 120, f);
    fclose(f);
    int lines = 0;
    for (size_t k = 0; k < blen; k++)
        lines += buf[k] == '\n';
    cr_expect_eq(lines, 5, "%s", buf);
    cr_expect(strstr(buf, "rank 0   |F"), "%s", buf);
    free(buf);
    par_sched_sim_free(&sim);
    par_schedule_free(&s);
    par_remove_tree(dir);
}
