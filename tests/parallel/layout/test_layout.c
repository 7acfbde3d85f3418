/* parallel: layout defaults and validation (folding, experts, CP, batch,
 * VPP and schedules), each error checked through par_last_error(). */
#include <criterion/criterion.h>
#include <string.h>

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"
#include "parallel/plan/plan.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(layout, .init = quiet);

/* v4-tiny-like: 8 layers + 1 MTP, E 8, S 64, B 8, window 8, ratios up to 16. */
static const int64_t ratios[9] = {0, 4, 16, 0, 4, 16, 4, 16, 0};

static par_layout_model model(void)
{
    par_layout_model m = {.n_layers = 8,
                          .n_mtp_layers = 1,
                          .n_routed_experts = 8,
                          .seq_length = 64,
                          .global_batch_size = 8,
                          .window_size = 8,
                          .n_ratios = 9,
                          .compress_ratios = ratios};
    return m;
}

static par_layout lay(int64_t pp, int64_t cp, int64_t ep, int64_t world)
{
    par_layout l;
    par_layout_init(&l);
    l.pp = pp;
    l.cp = cp;
    l.ep = ep;
    l.world = world;
    return l;
}

/* Resolves and asserts failure with code `code` and every `needle` in the
 * message. */
static void expect_fail(par_layout *l, const par_layout_model *m, par_status code, const char *n1,
                        const char *n2)
{
    par_clear_error();
    par_status st = par_layout_resolve(l, m);
    cr_assert_eq(st, code, "status %s (%s)", par_status_str(st), par_last_error());
    cr_expect_eq(l->resolved, 0);
    const char *e = par_last_error();
    cr_expect(strstr(e, n1) != NULL, "message '%s' lacks '%s'", e, n1);
    if (n2)
        cr_expect(strstr(e, n2) != NULL, "message '%s' lacks '%s'", e, n2);
}

Test(layout, default_world_is_pp_times_lcm)
{
    cr_expect_eq(par_layout_default_world(1, 1, 1, 1, 1), 1);
    cr_expect_eq(par_layout_default_world(1, 2, 2, 4, 1), 8);   /* 2 * lcm(2, 4)  */
    cr_expect_eq(par_layout_default_world(1, 1, 3, 2, 1), 6);   /* lcm(3, 2)      */
    cr_expect_eq(par_layout_default_world(1, 3, 4, 6, 1), 36);  /* 3 * lcm(4, 6)  */
    cr_expect_eq(par_layout_default_world(2, 1, 1, 1, 3), 6);   /* lcm(2, 3)      */
    cr_expect_eq(par_layout_default_world(0, 1, 1, 1, 1), 0);
    cr_expect_eq(par_layout_default_world(1, 1 << 20, 1 << 20, 1, 1), 0); /* overflow guard */

    par_layout_model m = model();
    par_layout l = lay(2, 2, 4, 0);
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.world, 8);
    cr_expect_eq(l.da, 2);
    cr_expect_eq(l.de, 1);
    cr_expect_eq(l.micro_batch, 1);
    cr_expect_eq(l.global_batch, 8);
    cr_expect_eq(l.n_micro, 4);
    cr_expect_eq(l.vpp, 1);
    cr_expect_str_eq(l.schedule, "1f1b");
    cr_expect_eq(l.resolved, 1);
}

Test(layout, folding_arithmetic_valid)
{
    par_layout_model m = model();
    m.global_batch_size = 32;
    /* N/PP = TP*CP*Da = ETP*EP*De: 16/2 = 1*2*4 = 1*4*2. */
    par_layout l = lay(2, 2, 4, 16);
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.da, 4);
    cr_expect_eq(l.de, 2);
    cr_expect_eq(l.n_micro, 8); /* 32 / (1 * 4) */
    cr_expect_eq(l.pp * l.tp * l.cp * l.da, l.world);
    cr_expect_eq(l.pp * l.etp * l.ep * l.de, l.world);
    /* The reference note's 1024-rank example: PP8 EP64 gives Da 128, De 2. */
    par_layout_model big = m;
    big.n_layers = 64;
    big.n_routed_experts = 384;
    big.global_batch_size = 4096;
    big.seq_length = 8192;
    par_layout b = lay(8, 1, 64, 1024);
    cr_assert_eq(par_layout_resolve(&b, &big), PAR_OK, "%s", par_last_error());
    cr_expect_eq(b.da, 128);
    cr_expect_eq(b.de, 2);
    cr_expect_eq(b.n_micro, 32);
    /* and its config C: 8192 ranks, CP4: Da 256, De 16, m 16. */
    par_layout c = lay(8, 4, 64, 8192);
    cr_assert_eq(par_layout_resolve(&c, &big), PAR_OK, "%s", par_last_error());
    cr_expect_eq(c.da, 256);
    cr_expect_eq(c.de, 16);
    cr_expect_eq(c.n_micro, 16);
}

Test(layout, folding_arithmetic_invalid)
{
    par_layout_model m = model();
    par_layout l = lay(2, 4, 1, 12);
    expect_fail(&l, &m, PAR_EINVAL, "world size 12 is not divisible by PP*TP*CP = 2*1*4 = 8", NULL);
    cr_expect_eq(l.world, 12); /* given fields kept */
    l = lay(2, 1, 4, 12);
    expect_fail(&l, &m, PAR_EINVAL, "world size 12 is not divisible by PP*ETP*EP = 2*1*4 = 8", NULL);
    l = lay(2, 1, 8, 8);
    expect_fail(&l, &m, PAR_EINVAL, "expert-model-parallel-size 8 is larger than",
                "N/PP = 8/2 = 4");
    l = lay(3, 1, 1, 8);
    expect_fail(&l, &m, PAR_EINVAL, "world size 8 is not divisible by PP*TP*CP = 3*1*1 = 3", NULL);
}

Test(layout, sizes_and_unsupported_tp)
{
    par_layout_model m = model();
    par_layout l = lay(0, 1, 1, 0);
    expect_fail(&l, &m, PAR_EINVAL, "pipeline-model-parallel-size must be at least 1, got 0", NULL);
    l = lay(1, 1, 1, -4);
    expect_fail(&l, &m, PAR_EINVAL, "world size must be at least 0, got -4", NULL);
    l = lay(1, 1, 1, 0); /* TP folds like any size (parity run's own rules: executor.h, tp_split.h) */
    l.tp = 2;
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_assert_eq(l.world, 2);
    cr_assert_eq(l.da, 1);
    l = lay(1, 1, 1, 0);
    l.etp = 2;
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_assert_eq(l.de, 1);
    l = lay(1, 1, 1, 1 << 21);
    expect_fail(&l, &m, PAR_EINVAL, "world size 2097152 exceeds", NULL);
}

Test(layout, experts_and_context_parallel)
{
    par_layout_model m = model();
    par_layout l = lay(1, 1, 5, 0);
    expect_fail(&l, &m, PAR_EINVAL, "expert-model-parallel-size 5 does not divide n_routed_experts 8", NULL);
    l = lay(1, 3, 1, 0);
    expect_fail(&l, &m, PAR_EINVAL, "context-parallel-size 3 does not divide seq_length 64", NULL);
    /* D_window = max(8, d_comp(16) = 16, d_comp(4) = 8) = 16. */
    cr_expect_eq(par_layout_d_window(&m), 16);
    l = lay(1, 8, 1, 0); /* 64/8 = 8 local rows < 16 */
    expect_fail(&l, &m, PAR_EINVAL, "local rows S/CP = 64/8 = 8 are fewer than D_window = 16",
                "d_comp 16 of block 2 with compress ratio 16");
    l = lay(1, 4, 1, 0); /* 64/4 = 16 rows: exactly enough */
    par_layout_model m2 = m;
    m2.global_batch_size = 8;
    cr_expect_eq(par_layout_resolve(&l, &m2), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.d_window, 16);

    /* d_comp(4) = 8 (overlapping compression), window dominates otherwise. */
    const int64_t r4[2] = {4, 0};
    par_layout_model m3 = m;
    m3.compress_ratios = r4;
    m3.n_ratios = 2;
    m3.window_size = 4;
    cr_expect_eq(par_layout_d_window(&m3), 8);
    m3.window_size = 12;
    cr_expect_eq(par_layout_d_window(&m3), 12);
    m3.window_size = 16;
    m3.seq_length = 64;
    l = lay(1, 8, 1, 0);
    expect_fail(&l, &m3, PAR_EINVAL, "D_window = 16 = max(window_size 16", NULL);
    /* CP 1: no boundary exchange, no D_window rule. */
    m3.seq_length = 8;
    l = lay(1, 1, 1, 0);
    cr_expect_eq(par_layout_resolve(&l, &m3), PAR_OK, "%s", par_last_error());
}

Test(layout, global_batch_and_microbatches)
{
    par_layout_model m = model();
    par_layout l = lay(1, 1, 1, 4); /* Da 4 */
    l.micro_batch = 3;
    expect_fail(&l, &m, PAR_EINVAL, "global batch size 8 is not divisible by micro-batch-size * Da = 3 * 4 = 12",
                NULL);
    l = lay(1, 1, 1, 4);
    l.micro_batch = 2;
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.n_micro, 1);
    l = lay(1, 1, 1, 2);
    l.global_batch = 6; /* the flag overrides the model's B */
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.n_micro, 3);
    cr_expect_eq(l.global_batch, 6);
    par_layout_model m0 = m;
    m0.global_batch_size = 0;
    l = lay(1, 1, 1, 1);
    expect_fail(&l, &m0, PAR_EINVAL, "global batch size is 0", NULL);
}

Test(layout, vpp_and_interleaved_schedule)
{
    par_layout_model m = model();
    par_layout l = lay(2, 1, 1, 2); /* Da 1: m = 8 */
    l.vpp = 2;
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_str_eq(l.schedule, "interleaved");
    cr_expect_eq(l.mb_group, 2);
    cr_expect_eq(l.pipe.n_segments, 4);
    cr_expect_eq(par_pplayout_count(&l.pipe, 3, PAR_BLK_MTP), 1);

    l = lay(1, 1, 1, 1);
    l.vpp = 2;
    expect_fail(&l, &m, PAR_EINVAL, "virtual-pipeline-model-parallel-size 2 needs pipeline-model-parallel-size > 1",
                NULL);
    /* 8 layers into PP*VPP = 2*3 = 6 segments without a layout string. */
    l = lay(2, 1, 1, 2);
    l.vpp = 3;
    expect_fail(&l, &m, PAR_EINVAL, "n_layers 8 is not divisible by PP * VPP = 2 * 3 = 6", NULL);

    /* PP <= microbatch group <= m: PP 4, Da 4 gives m = 2. */
    par_layout_model m16 = m;
    m16.n_layers = 16;
    l = lay(4, 1, 1, 16);
    l.vpp = 2;
    expect_fail(&l, &m16, PAR_EINVAL, "microbatch group size 4", "[PP, m] = [4, 2]");
    l = lay(4, 1, 1, 8); /* Da 2: m = 4 = PP */
    l.vpp = 2;
    cr_expect_eq(par_layout_resolve(&l, &m16), PAR_OK, "%s", par_last_error());

    /* The last group must be empty or hold >= PP microbatches. */
    l = lay(2, 1, 1, 2);
    l.vpp = 2;
    l.global_batch = 10;
    l.mb_group = 3; /* 10 % 3 = 1 < 2 */
    expect_fail(&l, &m, PAR_EINVAL, "m % g = 10 % 3 = 1", "fewer than PP = 2");
    l.mb_group = 4; /* 10 % 4 = 2 */
    cr_expect_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    l = lay(2, 1, 1, 2);
    l.vpp = 2;
    l.mb_group = 9; /* > m = 8 */
    expect_fail(&l, &m, PAR_EINVAL, "microbatch group size 9", "[2, 8]");
}

Test(layout, schedules)
{
    par_layout_model m = model();
    par_layout l = lay(2, 1, 1, 2);
    l.vpp = 2;
    par_layout_set_schedule(&l, "1f1b");
    expect_fail(&l, &m, PAR_EINVAL, "pipeline schedule '1f1b' runs one chunk per rank", "is 2");
    l = lay(2, 1, 1, 2);
    par_layout_set_schedule(&l, "interleaved");
    expect_fail(&l, &m, PAR_EINVAL, "'interleaved' needs virtual-pipeline-model-parallel-size >= 2, got 1", NULL);
    l = lay(2, 1, 1, 2);
    par_layout_set_schedule(&l, "pipedream");
    expect_fail(&l, &m, PAR_EINVAL, "unknown pipeline schedule 'pipedream'", "dualpipev");
    cr_expect_eq(par_layout_set_schedule(&l, "a-name-much-too-long"), PAR_EINVAL);

    /* dualpipev: VPP 2 by default, V-shaped segment placement. */
    l = lay(2, 1, 1, 2);
    par_layout_set_schedule(&l, "dualpipev");
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.vpp, 2);
    int want_rank[4] = {0, 1, 1, 0};
    for (int s = 0; s < 4; s++) {
        cr_expect_eq(par_layout_segment_rank(&l, s), want_rank[s], "segment %d", s);
        cr_expect_eq(par_layout_segment_chunk(&l, s), s / 2);
        cr_expect_eq(par_layout_segment_of(&l, want_rank[s], s / 2), s);
    }
    cr_expect(par_layout_stage_has(&l, 0, PAR_BLK_LOSS)); /* V: the last segment is on rank 0 */
    cr_expect(!par_layout_stage_has(&l, 1, PAR_BLK_LOSS));
    l = lay(2, 1, 1, 2);
    l.vpp = 3;
    par_layout_set_schedule(&l, "dualpipev");
    expect_fail(&l, &m, PAR_EINVAL, "'dualpipev' runs 2 chunks per rank", "got 3");

    for (const char *const *n = par_layout_schedule_names(); *n; n++) {
        if (!strcmp(*n, "interleaved") || !strcmp(*n, "dualpipev"))
            continue;
        l = lay(2, 1, 1, 2);
        par_layout_set_schedule(&l, *n);
        cr_expect_eq(par_layout_resolve(&l, &m), PAR_OK, "%s: %s", *n, par_last_error());
    }
}

Test(layout, with_a_layout_string)
{
    par_layout_model m = model();
    par_layout l = lay(3, 1, 1, 0);
    cr_assert_eq(par_layout_set_pp_layout(&l, "Et*3|t*2|t*3mL"), PAR_OK);
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.world, 3);
    cr_expect_eq(l.vpp, 1);
    cr_expect_eq(l.pipe.from_string, 1);
    cr_expect_eq(par_pplayout_count(&l.pipe, 1, PAR_BLK_LAYER), 2);

    /* VPP from the string, as Megatron-LM derives it. */
    l = lay(2, 1, 1, 2);
    par_layout_set_pp_layout(&l, "Et*2|t*2|t*2|t*2mL");
    cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.vpp, 2);
    cr_expect_str_eq(l.schedule, "interleaved");
    l = lay(2, 1, 1, 2);
    l.vpp = 1;
    par_layout_set_pp_layout(&l, "Et*2|t*2|t*2|t*2mL");
    expect_fail(&l, &m, PAR_EINVAL, "virtual-pipeline-model-parallel-size 1 conflicts", "4 segments");
    l = lay(2, 1, 1, 2);
    par_layout_set_pp_layout(&l, "Et*2|t*3|t*3mL");
    expect_fail(&l, &m, PAR_EINVAL, "3 segments", "not a multiple of pipeline-model-parallel-size 2");
    l = lay(2, 1, 1, 2);
    par_layout_set_pp_layout(&l, "Et*2|t*2mL");
    expect_fail(&l, &m, PAR_EINVAL, "has 4 't' blocks but n_layers is 8", NULL);

    char longstr[PAR_LAYOUT_STR_MAX + 8];
    memset(longstr, 't', sizeof longstr - 1);
    longstr[sizeof longstr - 1] = '\0';
    cr_expect_eq(par_layout_set_pp_layout(&l, longstr), PAR_EINVAL);
    cr_expect_eq(par_layout_set_pp_layout(&l, NULL), PAR_OK);
    cr_expect_eq(l.pp_layout[0], '\0');
}

Test(layout, uneven_default_suggests_a_valid_layout)
{
    par_layout_model m = model();
    m.n_layers = 61;
    m.n_routed_experts = 384;
    m.n_ratios = 0;
    par_layout l = lay(8, 1, 1, 8);
    l.global_batch = 8;
    expect_fail(&l, &m, PAR_EINVAL, "n_layers 61 is not divisible by PP * VPP = 8 * 1 = 8", "e.g. '");
    /* The suggestion parses and validates. */
    const char *e = par_last_error();
    const char *a = strstr(e, "e.g. '") + 6;
    const char *b = strchr(a, '\'');
    cr_assert(b);
    char sug[256];
    snprintf(sug, sizeof sug, "%.*s", (int)(b - a), a);
    cr_expect_str_eq(sug, "Et*7|t*8|t*8|t*8|t*8|t*8|t*7|t*7mL");
    par_layout_set_pp_layout(&l, sug);
    cr_expect_eq(par_layout_resolve(&l, &m), PAR_OK, "%s: %s", sug, par_last_error());
}

Test(layout, presets_plan)
{
    const char *names[] = {"v4-tiny", "v4-mini", "v4-pro", "v4-flash"};
    for (int i = 0; i < 4; i++) {
        par_config cfg;
        cr_assert_eq(par_config_preset(&cfg, names[i]), PAR_OK);
        par_layout l;
        par_layout_init(&l);
        cr_expect_eq(par_plan_resolve(&l, &cfg), PAR_OK, "%s: %s", names[i], par_last_error());
        cr_expect_eq(l.world, 1);
        cr_expect_eq(l.n_micro, cfg.global_batch_size);
    }
    /* v4-pro at 1024 ranks with the uneven 61-layer split. */
    par_config pro;
    par_config_preset(&pro, "v4-pro");
    par_layout l;
    par_layout_init(&l);
    l.pp = 8;
    l.ep = 64;
    l.world = 1024;
    par_layout_set_pp_layout(&l, "Et*7|t*8|t*8|t*8|t*8|t*8|t*7|t*7mL");
    cr_expect_eq(par_plan_resolve(&l, &pro), PAR_OK, "%s", par_last_error());
    cr_expect_eq(l.da, 128);
    cr_expect_eq(l.de, 2);
    cr_expect_eq(l.n_micro, 32);
}
