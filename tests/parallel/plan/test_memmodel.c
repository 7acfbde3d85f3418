/* tests/parallel/plan/test_memmodel.c - the per-rank memory model (parallel/
 * memmodel.h) against the allocator's per-rank truth (core/alloc.h scopes,
 * par_run_summary.alloc_peak) of real `parity run`s, every rank and every
 * tag (param, grad, optim, act, comm) within 10 %; its pieces against the
 * code they mirror: the ZeRO-1 geometry (parallel/plan/memmodel_zero.h) against
 * par_zero_plan_build, the activation table against the kernels' own
 * saved-size functions.  v4-tiny, f64, threads backend, one step; the
 * v4-mini layouts run with -Dslow_tests=true (MEMMODEL_MINI=1). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "kernels/attention.h"
#include "kernels/mhc.h"
#include "model/config.h"
#include "model/model.h"
#include "model/params.h"
#include "parallel/plan/memmodel_act.h"
#include "parallel/train/run.h"
#include "parallel/plan/memcheck.h"
#include "parallel/plan/memmodel.h"
#include "parallel/plan/memmodel_zero.h"
#include "parallel/dp/zero.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(memmodel, .init = quiet);

/* ---- the ZeRO-1 geometry is zero.c's ---------------------------------- */

static void geometry_matches(const char *preset, int experts)
{
    par_config cfg;
    par_param_table t;
    cr_assert_eq(par_config_preset(&cfg, preset), PAR_OK);
    cr_assert_eq(par_param_table_build(&t, &cfg), PAR_OK, "%s", par_last_error());
    int *idx = malloc((size_t)t.n * sizeof *idx);
    int n = 0;
    for (int i = 0; i < t.n; i++)
        if ((t.p[i].expert >= 0) == experts && t.p[i].dtype == PAR_PDT_REAL)
            idx[n++] = i;
    static const int dps[] = {1, 2, 3, 4, 8, 16};
    for (size_t k = 0; k < sizeof dps / sizeof dps[0]; k++) {
        int dp = dps[k];
        par_memmodel_zero g;
        cr_assert_eq(par_memmodel_zero_build(&g, &t, idx, n, dp), PAR_OK, "%s", par_last_error());
        PAR_FN(par_zero_plan) pl;
        cr_assert_eq(PAR_FN(par_zero_plan_build)(&pl, &t, idx, n, dp, 0, PAR_DP_ZERO1), PAR_OK, "%s",
                     par_last_error());
        cr_expect_eq(g.shard, pl.shard, "%s dp %d: shard", preset, dp);
        cr_expect_eq(g.n_adamw, pl.n_adamw, "%s dp %d: AdamW elements", preset, dp);
        cr_expect_eq(g.n_muon, pl.n_muon, "%s dp %d: Muon elements", preset, dp);
        cr_expect_eq(g.seg, pl.seg, "%s dp %d: seg", preset, dp);
        for (int q = 0; q < dp; q++)
            cr_expect_eq(g.load[q], pl.load[q], "%s dp %d: Muon load of rank %d", preset, dp, q);
        PAR_FN(par_zero_plan_free)(&pl);
        par_memmodel_zero_free(&g);
    }
    free(idx);
    par_param_table_free(&t);
}

Test(memmodel, zero_geometry_is_the_plans)
{
    geometry_matches("v4-tiny", 0);
    geometry_matches("v4-tiny", 1);
    geometry_matches("v4-mini", 0);
    geometry_matches("v4-mini", 1);
}

/* ---- the activation table is the kernels' ----------------------------- */

Test(memmodel, act_table_is_the_kernels_saved_sizes)
{
    static const char *const presets[] = {"v4-tiny", "v4-mini", "v4-pro"};
    for (int k = 0; k < 3; k++) {
        par_config cfg;
        cr_assert_eq(par_config_preset(&cfg, presets[k]), PAR_OK);
        par_memmodel_act_ctx c = {.cfg = &cfg, .es = sizeof(par_real), .ep = 1, .recv_factor = 1, .cp = 1, .rows = 1};
        par_rope rope;
        memset(&rope, 0, sizeof rope);
        for (int64_t T = 1; T <= 4096; T = T * 3 + 1) {
            cr_expect_eq(par_memmodel_act_hc_saved(&c, T),
                         (double)PAR_FN(par_hc_saved_bytes)(T, cfg.hc_mult, cfg.hc_sinkhorn_iters), "%s T %lld",
                         presets[k], (long long)T);
            for (int b = 0; b < cfg.n_layers + cfg.n_mtp_layers; b++) {
                par_attn_dims dm = {.d = cfg.dim, .H = cfg.n_heads, .hd = cfg.head_dim, .rd = cfg.rope_head_dim,
                                    .q_lora = cfg.q_lora_rank, .o_groups = cfg.o_groups,
                                    .o_lora = cfg.o_lora_rank, .window = cfg.window_size,
                                    .m = cfg.compress_ratios[b], .iH = cfg.index_n_heads,
                                    .ihd = cfg.index_head_dim, .topk = cfg.index_topk, .rope = &rope};
                cr_expect_eq(par_memmodel_act_attn_saved(&c, b, T), (double)PAR_FN(par_attn_saved_bytes)(&dm, T),
                             "%s block %d T %lld", presets[k], b, (long long)T);
            }
        }
    }
}

Test(memmodel, moe_saved_is_what_the_kernel_allocates)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), PAR_OK);
    int64_t T = 37;
    int64_t before = par_alloc_live(PAR_TAG_ACT);
    par_moe_saved sv;
    cr_assert_eq(PAR_FN(par_moe_saved_alloc)(&sv, T, cfg.dim, (int)cfg.n_routed_experts,
                                             (int)cfg.n_activated_experts, cfg.moe_inter_dim),
                 PAR_OK);
    double got = (double)(par_alloc_live(PAR_TAG_ACT) - before);
    PAR_FN(par_moe_saved_free)(&sv);
    par_memmodel_act_ctx c = {.cfg = &cfg, .es = sizeof(par_real), .ep = 1, .recv_factor = 1, .cp = 1, .rows = 1};
    /* the block's saved bytes minus everything but the MoE state */
    par_memmodel_act_ctx none = c;
    double blk = par_memmodel_act_block_saved(&c, 1, T);
    none.ep = 2; /* the EP state replaces the kernel's: the difference isolates both */
    double es = sizeof(par_real), K = (double)cfg.n_activated_experts, I = (double)cfg.moe_inter_dim;
    double ep_state = 2 * 8 * 2 + 4 * T * K + 4 * T * K + 8 * ((double)cfg.n_routed_experts / 2 + 1) +
                      es * (T * K * cfg.dim + T * K + 3 * T * K * I) + 3 * es * T * I;
    cr_expect_eq(blk - par_memmodel_act_block_saved(&none, 1, T) + ep_state, got);
}

/* ---- predicted vs measured, every rank and tag ------------------------- */

typedef struct {
    const char *name, *preset;
    int64_t world, pp, cp, ep, zero, mbs;
    const char *schedule, *layout;
    int f32;
    int64_t tp, etp; /* 0: 1 */
    int sp, all;     /* --sequence-parallel, --tp-all-layers */
} lay;

#define NTAGS 5
static const par_tag TAGS[NTAGS] = {PAR_TAG_PARAM, PAR_TAG_GRAD, PAR_TAG_OPTIM, PAR_TAG_ACT, PAR_TAG_COMM};

/* Runs one step of layout L, predicts every rank with the PARITY runtime
 * (the run's EP receive rows as the measured loads) and returns the worst
 * relative error per tag in worst[]. */
static void predict_vs_measure(const lay *L, double worst[NTAGS])
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, L->preset), PAR_OK);
    o.backend = par_backend_find("threads");
    cr_assert(o.backend);
    o.precision = L->f32 ? 32 : 64;
    o.layout.world = L->world;
    o.layout.pp = L->pp ? L->pp : 1;
    o.layout.cp = L->cp ? L->cp : 1;
    o.layout.ep = L->ep ? L->ep : 1;
    o.layout.tp = L->tp ? L->tp : 1;
    o.layout.etp = L->etp ? L->etp : 1;
    o.layout.sequence_parallel = L->sp;
    o.layout.tp_all_layers = L->all || L->sp;
    o.layout.distributed_optimizer = (int)L->zero;
    o.layout.micro_batch = L->mbs;
    if (L->schedule)
        cr_assert_eq(par_layout_set_schedule(&o.layout, L->schedule), PAR_OK);
    if (L->layout)
        cr_assert_eq(par_layout_set_pp_layout(&o.layout, L->layout), PAR_OK);
    par_run_summary s;
    cr_assert_eq(par_run(&o, &s), PAR_OK, "%s: %s", L->name, par_last_error());
    cr_assert_not_null(s.alloc_peak);
    par_memmodel_opts mo;
    par_memmodel_opts_init(&mo);
    mo.rt = PAR_MM_PARITY;
    mo.real_bytes = L->f32 ? 4 : 8;
    mo.recv_rows = s.ep_recv; /* one step: the forward's rows per rank */
    mo.samples = s.samples0;  /* the batch's samples (statistics windows) */
    mo.shared_replicas = 1;   /* the run's dense copy is the process's, in no rank's peaks (replicas.h) */
    par_memmodel *mm = NULL;
    cr_assert_eq(par_memmodel_create(&mm, &o.cfg, &s.layout, &mo), PAR_OK, "%s: %s", L->name, par_last_error());
    for (int k = 0; k < NTAGS; k++)
        worst[k] = 0;
    for (int64_t r = 0; r < s.layout.world; r++) {
        par_memmodel_rank pr;
        cr_assert_eq(par_memmodel_rank_of(mm, (int)r, &pr), PAR_OK, "%s", par_last_error());
        for (int k = 0; k < NTAGS; k++) {
            double m = (double)s.alloc_peak[r * PAR_TAG_COUNT + TAGS[k]], p = par_memmodel_tag(&pr, TAGS[k]);
            cr_assert_gt(m, 0, "%s rank %lld: nothing measured for tag %s", L->name, (long long)r,
                         par_tag_name(TAGS[k]));
            double e = (p - m) / m;
            if (fabs(e) > fabs(worst[k]))
                worst[k] = e;
            cr_expect_leq(fabs(e), 0.10, "%s rank %lld tag %s: predicted %.0f, measured %.0f bytes (%+.1f %%)",
                          L->name, (long long)r, par_tag_name(TAGS[k]), p, m, 100 * e);
        }
    }
    par_memmodel_free(mm);
    /* the refusal estimate of `parity run` (memcheck.h, the same model with balanced routing) is the
     * measured sum of the ranks' peaks (the five tags and `model`) within 10 % */
    par_memest est;
    cr_assert_eq(par_memcheck_run(&o.cfg, &o.layout, o.precision, 1, 0, 0, &est), PAR_OK, "%s", par_last_error());
    double measured = 0;
    for (int64_t r = 0; r < s.layout.world; r++) {
        for (int k = 0; k < NTAGS; k++)
            measured += (double)s.alloc_peak[r * PAR_TAG_COUNT + TAGS[k]];
        measured += (double)s.alloc_peak[r * PAR_TAG_COUNT + PAR_TAG_MODEL]; /* the estimate's model term */
    }
    cr_expect_leq(fabs(est.ranks - measured) / measured, 0.10, "%s: memcheck %.0f vs measured %.0f bytes", L->name,
                  est.ranks, measured);
    cr_expect_gt(est.shared, 0);
    par_run_summary_free(&s);
}

static void run_set(const lay *set, int n)
{
    fprintf(stderr, "memory model vs allocator, worst relative error over the ranks:\n%-34s", "layout");
    for (int k = 0; k < NTAGS; k++)
        fprintf(stderr, " %8s", par_tag_name(TAGS[k]));
    fprintf(stderr, "\n");
    for (int i = 0; i < n; i++) {
        double w[NTAGS];
        predict_vs_measure(&set[i], w);
        fprintf(stderr, "%-34s", set[i].name);
        for (int k = 0; k < NTAGS; k++)
            fprintf(stderr, " %+7.2f%%", 100 * w[k]);
        fprintf(stderr, "\n");
    }
}

Test(memmodel, predicts_the_allocator_per_rank_v4_tiny, .timeout = 600)
{
    static const lay set[] = {
        {"serial", "v4-tiny", 1, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"DP2", "v4-tiny", 2, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"DP2 ZeRO-1", "v4-tiny", 2, 0, 0, 0, 1, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"EP2 De2 ZeRO-1 (N4)", "v4-tiny", 4, 0, 0, 2, 1, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"CP2", "v4-tiny", 2, 0, 2, 0, 0, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"CP2 EP2 (N4)", "v4-tiny", 4, 0, 2, 2, 0, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"PP2 1f1b", "v4-tiny", 2, 2, 0, 0, 0, 1, "1f1b", "Et*2|tmL", 0, 0, 0, 0, 0},
        {"PP2 interleaved VPP2", "v4-tiny", 2, 2, 0, 0, 0, 1, "interleaved", "Et|t|t|mL", 0, 0, 0, 0, 0},
        {"PP2 zb-h1 DP2 ZeRO-1 (N4)", "v4-tiny", 4, 2, 0, 0, 1, 1, "zb-h1", "Et*2|tmL", 0, 0, 0, 0, 0},
        {"PP2 dualpipev EP2 (N4)", "v4-tiny", 4, 2, 0, 2, 0, 1, "dualpipev", "Et|t|t|mL", 0, 0, 0, 0, 0},
        {"PP2 1f1b CP2 (N4)", "v4-tiny", 4, 2, 2, 0, 0, 1, "1f1b", "Et*2|tmL", 0, 0, 0, 0, 0},
        {"f32 PP2 1f1b EP2 ZeRO-1 (N4)", "v4-tiny", 4, 2, 0, 2, 1, 1, "1f1b", "Et*2|tmL", 1, 0, 0, 0, 0},
        {"f32 CP2", "v4-tiny", 2, 0, 2, 0, 0, 0, NULL, NULL, 1, 0, 0, 0, 0},
        {"TP2", "v4-tiny", 2, 0, 0, 0, 0, 0, NULL, NULL, 0, 2, 0, 0, 0},
        {"TP2 DP2 ZeRO-1 (N4)", "v4-tiny", 4, 0, 0, 0, 1, 0, NULL, NULL, 0, 2, 0, 0, 0},
        {"TP2 PP2 1f1b (N4)", "v4-tiny", 4, 2, 0, 0, 0, 1, "1f1b", "Et*2|tmL", 0, 2, 0, 0, 0},
        {"TP2 EP4 (N8)", "v4-tiny", 8, 0, 0, 4, 0, 0, NULL, NULL, 0, 2, 0, 0, 0},
        {"TP2 CP2 (N4)", "v4-tiny", 4, 0, 2, 0, 0, 0, NULL, NULL, 0, 2, 0, 0, 0},
        {"TP2 CP2 EP4 ZeRO-1 (N8)", "v4-tiny", 8, 0, 2, 4, 1, 0, NULL, NULL, 0, 2, 0, 0, 0},
        {"ETP2 (N2)", "v4-tiny", 2, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 2, 0, 0},
        {"ETP2 De2 ZeRO-1 (N4)", "v4-tiny", 4, 0, 0, 0, 1, 0, NULL, NULL, 0, 0, 2, 0, 0},
        {"ETP2 EP4 De2 CP2 ZeRO-1 (N16)", "v4-tiny", 16, 0, 2, 4, 1, 0, NULL, NULL, 0, 0, 2, 0, 0},
    };
    run_set(set, (int)(sizeof set / sizeof set[0]));
}

/* Sequence parallelism and every TP layer (tpcomp15): the vocab-parallel
 * head / CE and the TP shared expert at 1/TP, the tokens between TP regions
 * at 1/TP under SP. */
Test(memmodel, predicts_the_allocator_per_rank_tp_all_layers_and_sp, .timeout = 600)
{
    static const lay set[] = {
        {"TP2 all-layers", "v4-tiny", 2, 0, 0, 0, 0, 0, NULL, NULL, 0, 2, 0, 0, 1},
        {"TP2 all-layers DP2 ZeRO-1 (N4)", "v4-tiny", 4, 0, 0, 0, 1, 0, NULL, NULL, 0, 2, 0, 0, 1},
        {"TP2 all-layers PP2 1f1b (N4)", "v4-tiny", 4, 2, 0, 0, 0, 1, "1f1b", "Et*2|tmL", 0, 2, 0, 0, 1},
        {"TP2 SP", "v4-tiny", 2, 0, 0, 0, 0, 0, NULL, NULL, 0, 2, 0, 1, 1},
        {"TP2 SP DP2 ZeRO-1 (N4)", "v4-tiny", 4, 0, 0, 0, 1, 0, NULL, NULL, 0, 2, 0, 1, 1},
        {"TP2 SP PP2 1f1b (N4)", "v4-tiny", 4, 2, 0, 0, 0, 1, "1f1b", "Et*2|tmL", 0, 2, 0, 1, 1},
        {"TP2 SP CP2 (N4)", "v4-tiny", 4, 0, 2, 0, 0, 0, NULL, NULL, 0, 2, 0, 1, 1},
        {"TP2 SP EP4 (N8)", "v4-tiny", 8, 0, 0, 4, 0, 0, NULL, NULL, 0, 2, 0, 1, 1},
        {"TP2 SP ETP2 EP2 (N4)", "v4-tiny", 4, 0, 0, 2, 0, 0, NULL, NULL, 0, 2, 2, 1, 1},
        {"TP2 SP CP2 EP2 (N8)", "v4-tiny", 8, 0, 2, 2, 0, 0, NULL, NULL, 0, 2, 0, 1, 1},
        {"TP2 SP ETP2 (N4)", "v4-tiny", 4, 0, 0, 0, 0, 0, NULL, NULL, 0, 2, 2, 1, 1},
        {"TP2 ETP2 (N2)", "v4-tiny", 2, 0, 0, 0, 0, 0, NULL, NULL, 0, 2, 2, 0, 0},
        {"TP2 ETP2 EP2 (N4)", "v4-tiny", 4, 0, 0, 2, 0, 0, NULL, NULL, 0, 2, 2, 0, 0},
    };
    run_set(set, (int)(sizeof set / sizeof set[0]));
}

/* v4-mini (seconds and ~2.5 GB each): with -Dslow_tests=true. */
Test(memmodel, predicts_the_allocator_per_rank_v4_mini, .timeout = 1800)
{
    if (!getenv("MEMMODEL_MINI"))
        cr_skip_test("v4-mini layouts run with -Dslow_tests=true (MEMMODEL_MINI=1)");
    static const lay set[] = {
        {"EP4 De2 ZeRO-1 (N8)", "v4-mini", 8, 0, 0, 4, 1, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"CP2 EP2 (N4)", "v4-mini", 4, 0, 2, 2, 0, 0, NULL, NULL, 0, 0, 0, 0, 0},
        {"PP2 1f1b EP2 (N4)", "v4-mini", 4, 2, 0, 2, 0, 1, "1f1b", "Et*4|t*4mL", 0, 0, 0, 0, 0},
        {"PP2 interleaved VPP2 (N4)", "v4-mini", 4, 2, 0, 0, 0, 1, "interleaved", "Et*2|t*2|t*2|t*2mL", 0, 0, 0, 0, 0},
        {"PP2 dualpipev (N4)", "v4-mini", 4, 2, 0, 0, 0, 1, "dualpipev", "Et*2|t*2|t*2|t*2mL", 0, 0, 0, 0, 0},
    };
    run_set(set, (int)(sizeof set / sizeof set[0]));
}

/* The model-structure term (tag `model`) against the allocator, every rank
 * of a 64-rank world of config-c's shape (PP 8 x CP 4 x Da 2, EP 8 over the
 * 8 ranks of a stage, v4-mini's 384 experts, narrow widths, 8 microbatches):
 * the estimate is within a factor 1.5 of each rank's measured `model` peak
 * (measured: 0.994 .. 0.995), and the rank's structure is O(its share):
 * under 160 KiB (measured 91 KiB; before mem18 ~480 KiB, of which each of
 * the [tab.n] int64 map and the [n_blocks, 3, E] pointer tables was 81 KiB:
 * any one of them back fails this). */
Test(memmodel, model_structure_is_the_allocators_model_tag, .timeout = 600)
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-mini"), PAR_OK);
    o.cfg.seq_length = 64, o.cfg.dim = 16, o.cfg.moe_inter_dim = 4, o.cfg.q_lora_rank = 16;
    o.cfg.head_dim = 16, o.cfg.o_lora_rank = 8, o.cfg.index_head_dim = 8;
    o.backend = par_backend_find("fiber");
    cr_assert(o.backend);
    o.layout.world = 64;
    o.layout.pp = 8;
    o.layout.cp = 4;
    o.layout.ep = 8;
    o.layout.micro_batch = 1;
    o.layout.global_batch = 16;
    cr_assert_eq(par_layout_set_schedule(&o.layout, "1f1b"), PAR_OK);
    cr_assert_eq(par_layout_set_pp_layout(&o.layout, "Et|t|t|t|t|t|t|tmL"), PAR_OK);
    par_run_summary s;
    cr_assert_eq(par_run(&o, &s), PAR_OK, "%s", par_last_error());
    cr_assert_not_null(s.alloc_peak);
    par_memmodel_opts mo;
    par_memmodel_opts_init(&mo);
    mo.rt = PAR_MM_PARITY;
    mo.recv_rows = s.ep_recv;
    mo.samples = s.samples0;
    mo.shared_replicas = 1;
    par_memmodel *mm = NULL;
    cr_assert_eq(par_memmodel_create(&mm, &o.cfg, &s.layout, &mo), PAR_OK, "%s", par_last_error());
    double lo = 1e30, hi = 0, mmax = 0;
    for (int64_t r = 0; r < s.layout.world; r++) {
        par_memmodel_rank pr;
        cr_assert_eq(par_memmodel_rank_of(mm, (int)r, &pr), PAR_OK, "%s", par_last_error());
        const double m = (double)s.alloc_peak[r * PAR_TAG_COUNT + PAR_TAG_MODEL], p = par_memmodel_tag(&pr, PAR_TAG_MODEL);
        cr_assert_gt(m, 0, "rank %lld: no model tag measured", (long long)r);
        cr_expect_gt(pr.total, pr.weights + pr.grads + pr.optim + pr.act + pr.comm + pr.workspace,
                     "the total counts the model structure");
        lo = p / m < lo ? p / m : lo;
        hi = p / m > hi ? p / m : hi;
        mmax = m > mmax ? m : mmax;
        cr_expect(p >= m / 1.5 && p <= m * 1.5, "rank %lld: model structure predicted %.0f, measured %.0f bytes",
                  (long long)r, p, m);
    }
    fprintf(stderr, "model structure, 64 ranks: predicted / measured %.3f .. %.3f, largest measured %.1f KiB\n", lo,
            hi, mmax / 1024);
    cr_expect_lt(mmax, 160.0 * 1024, "a rank's model structure is %.0f bytes", mmax);
    par_memmodel_free(mm);
    par_run_summary_free(&s);
}
