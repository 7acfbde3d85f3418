/* parallel: rank coordinates and process groups in Megatron-LM's order
 * (RankGenerator "tp-cp-ep-dp-pp"), pure lists and par_comm handles built on
 * the threads backend. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "parallel/layout/groups.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(groups, .init = quiet);

static const int64_t no_ratios[1] = {0};

static par_layout resolved(int64_t pp, int64_t cp, int64_t ep, int64_t world, const char *pp_layout,
                           int64_t n_layers, int64_t n_mtp)
{
    par_layout_model m = {.n_layers = n_layers,
                          .n_mtp_layers = n_mtp,
                          .n_routed_experts = 64,
                          .seq_length = 256,
                          .global_batch_size = 256,
                          .window_size = 8,
                          .n_ratios = 1,
                          .compress_ratios = no_ratios};
    par_layout l;
    par_layout_init(&l);
    l.pp = pp;
    l.cp = cp;
    l.ep = ep;
    l.world = world;
    par_layout_set_pp_layout(&l, pp_layout);
    par_status st = par_layout_resolve(&l, &m);
    cr_assert_eq(st, PAR_OK, "PP %lld CP %lld EP %lld N %lld: %s", (long long)pp, (long long)cp, (long long)ep,
                 (long long)world, par_last_error());
    return l;
}

static void expect_members(const par_layout *l, par_group_kind k, int rank, const int *want, int nwant)
{
    int got[128], n = -1;
    cr_assert_eq(par_group_members(l, k, rank, got, 128, &n), PAR_OK, "%s", par_last_error());
    cr_assert_eq(n, nwant, "%s group of rank %d: %d members, want %d", par_group_name(k), rank, n, nwant);
    for (int i = 0; i < n; i++)
        cr_expect_eq(got[i], want[i], "%s group of rank %d: member %d is %d, want %d", par_group_name(k), rank, i,
                     got[i], want[i]);
    cr_expect_eq(par_group_size(l, k, rank), nwant);
}

#define MEMBERS(l, k, r, ...)                                                                      \
    do {                                                                                           \
        const int w_[] = {__VA_ARGS__};                                                            \
        expect_members(l, k, r, w_, (int)(sizeof w_ / sizeof w_[0]));                              \
    } while (0)

/* docs/layouts.md's worked example: N 16, PP 2, CP 2, EP 4 (Da 4, De 2). */
Test(groups, worked_example_n16_pp2_cp2_ep4)
{
    par_layout l = resolved(2, 2, 4, 16, NULL, 8, 1);
    cr_assert_eq(l.da, 4);
    cr_assert_eq(l.de, 2);
    par_rank_coords c;
    cr_assert_eq(par_rank_coords_of(&l, 13, &c), PAR_OK);
    cr_expect_eq(c.tp, 0);
    cr_expect_eq(c.cp, 1);
    cr_expect_eq(c.dp, 2);
    cr_expect_eq(c.pp, 1);
    cr_expect_eq(c.etp, 0);
    cr_expect_eq(c.ep, 1);
    cr_expect_eq(c.edp, 1);
    MEMBERS(&l, PAR_GROUP_TP, 13, 13);
    MEMBERS(&l, PAR_GROUP_CP, 13, 12, 13);
    MEMBERS(&l, PAR_GROUP_DP, 13, 9, 11, 13, 15);
    MEMBERS(&l, PAR_GROUP_TP_CP, 13, 12, 13);
    MEMBERS(&l, PAR_GROUP_DP_CP, 13, 8, 9, 10, 11, 12, 13, 14, 15);
    MEMBERS(&l, PAR_GROUP_PP, 13, 5, 13);
    MEMBERS(&l, PAR_GROUP_EP, 13, 12, 13, 14, 15);
    MEMBERS(&l, PAR_GROUP_ETP, 13, 13);
    MEMBERS(&l, PAR_GROUP_EDP, 13, 9, 13);
    MEMBERS(&l, PAR_GROUP_EMBED, 13, 5, 13); /* E on stage 0, m on stage 1 */
    MEMBERS(&l, PAR_GROUP_MTP, 13, 13);      /* m and L both on stage 1 */
    MEMBERS(&l, PAR_GROUP_DP, 0, 0, 2, 4, 6);
    MEMBERS(&l, PAR_GROUP_EDP, 2, 2, 6);
    MEMBERS(&l, PAR_GROUP_EP, 6, 4, 5, 6, 7);
    int n = -1, mem[4];
    cr_expect_eq(par_group_members(&l, PAR_GROUP_MTP, 3, mem, 4, &n), PAR_OK);
    cr_expect_eq(n, 0, "stage 0 holds neither L nor m");
    cr_expect_eq(par_group_size(&l, PAR_GROUP_MTP, 3), 0);
    /* errors */
    cr_expect_eq(par_group_members(&l, PAR_GROUP_DP_CP, 13, mem, 4, &n), PAR_ERANGE);
    cr_expect_eq(n, 8);
    cr_expect_eq(par_group_members(&l, PAR_GROUP_DP, 16, mem, 4, &n), PAR_ERANGE);
    cr_expect_eq(par_group_members(&l, PAR_GROUP_COUNT, 1, mem, 4, &n), PAR_EINVAL);
    cr_expect_eq(par_rank_coords_of(&l, -1, &c), PAR_ERANGE);
    cr_expect_str_eq(par_group_name(PAR_GROUP_DP_CP), "dp-cp");
    cr_expect_null(par_group_name(PAR_GROUP_COUNT));
    par_layout un;
    par_layout_init(&un);
    cr_expect_eq(par_rank_coords_of(&un, 0, &c), PAR_EINVAL);
    cr_expect_eq(par_rank_of_attn(&un, 0, 0, 0, 0), -1);
}

/* Hand-computed from Megatron-LM's generate_masked_orthogonal_rank_groups:
 * N 8, PP 2, CP 1, EP 2 gives Da 4, De 2. */
Test(groups, second_hand_example_n8_pp2_ep2)
{
    par_layout l = resolved(2, 1, 2, 8, NULL, 8, 1);
    MEMBERS(&l, PAR_GROUP_DP, 5, 4, 5, 6, 7);
    MEMBERS(&l, PAR_GROUP_DP_CP, 5, 4, 5, 6, 7);
    MEMBERS(&l, PAR_GROUP_CP, 5, 5);
    MEMBERS(&l, PAR_GROUP_EP, 5, 4, 5);
    MEMBERS(&l, PAR_GROUP_EDP, 5, 5, 7);
    MEMBERS(&l, PAR_GROUP_PP, 5, 1, 5);
    MEMBERS(&l, PAR_GROUP_EDP, 0, 0, 2);
    /* N 64, PP 4, CP 2, EP 8 (Da 8, De 2): rank 45 = 32 + 13 */
    par_layout b = resolved(4, 2, 8, 64, NULL, 8, 1);
    par_rank_coords c;
    par_rank_coords_of(&b, 45, &c);
    cr_expect(c.pp == 2 && c.cp == 1 && c.dp == 6 && c.ep == 5 && c.edp == 1, "pp %d cp %d dp %d ep %d edp %d", c.pp,
              c.cp, c.dp, c.ep, c.edp);
    MEMBERS(&b, PAR_GROUP_CP, 45, 44, 45);
    MEMBERS(&b, PAR_GROUP_DP, 45, 33, 35, 37, 39, 41, 43, 45, 47);
    MEMBERS(&b, PAR_GROUP_EP, 45, 40, 41, 42, 43, 44, 45, 46, 47);
    MEMBERS(&b, PAR_GROUP_EDP, 45, 37, 45);
    MEMBERS(&b, PAR_GROUP_PP, 45, 13, 29, 45, 61);
    MEMBERS(&b, PAR_GROUP_EMBED, 45); /* stage 2 holds no E and no m: empty */
    MEMBERS(&b, PAR_GROUP_EMBED, 61, 13, 61);
}

Test(groups, coordinates_round_trip)
{
    par_layout l = resolved(4, 2, 8, 64, NULL, 8, 1);
    for (int r = 0; r < 64; r++) {
        par_rank_coords c;
        cr_assert_eq(par_rank_coords_of(&l, r, &c), PAR_OK);
        cr_expect_eq(par_rank_of_attn(&l, c.tp, c.cp, c.dp, c.pp), r);
        cr_expect_eq(par_rank_of_expert(&l, c.etp, c.ep, c.edp, c.pp), r);
        cr_expect_eq(r, c.tp + (int)l.tp * (c.cp + (int)l.cp * (c.dp + (int)l.da * c.pp)));
        cr_expect_eq(r, c.etp + (int)l.etp * (c.ep + (int)l.ep * (c.edp + (int)l.de * c.pp)));
    }
    cr_expect_eq(par_rank_of_attn(&l, 0, 2, 0, 0), -1);
    cr_expect_eq(par_rank_of_expert(&l, 0, 0, 0, 4), -1);
}

Test(groups, embedding_and_mtp_groups_follow_the_layout)
{
    /* MTP on its own stage: E on 0, m on 2, L on 3. */
    par_layout l = resolved(4, 1, 1, 4, "Et*4|t*4|m|L", 8, 1);
    MEMBERS(&l, PAR_GROUP_EMBED, 0, 0, 2);
    MEMBERS(&l, PAR_GROUP_EMBED, 2, 0, 2);
    MEMBERS(&l, PAR_GROUP_EMBED, 1);
    MEMBERS(&l, PAR_GROUP_EMBED, 3);
    MEMBERS(&l, PAR_GROUP_MTP, 2, 2, 3);
    MEMBERS(&l, PAR_GROUP_MTP, 3, 2, 3);
    MEMBERS(&l, PAR_GROUP_MTP, 0);
    /* No MTP: the embedding group is stage 0 alone, the MTP group the L stage. */
    par_layout n = resolved(2, 1, 1, 2, NULL, 8, 0);
    MEMBERS(&n, PAR_GROUP_EMBED, 0, 0);
    MEMBERS(&n, PAR_GROUP_EMBED, 1);
    MEMBERS(&n, PAR_GROUP_MTP, 1, 1);
    /* PP 1: everything on the one stage */
    par_layout one = resolved(1, 2, 2, 4, NULL, 8, 1);
    MEMBERS(&one, PAR_GROUP_EMBED, 3, 3);
    MEMBERS(&one, PAR_GROUP_MTP, 3, 3);
    MEMBERS(&one, PAR_GROUP_PP, 3, 3);
}

/* Every member of a group computes the same list (pure functions). */
Test(groups, members_agree_across_the_group)
{
    par_layout l = resolved(4, 2, 8, 64, "Et*2|t*2|t*2|t*2mL", 8, 1);
    int a[64], b[64];
    for (int k = 0; k < PAR_GROUP_COUNT; k++)
        for (int r = 0; r < 64; r++) {
            int na, nb;
            cr_assert_eq(par_group_members(&l, (par_group_kind)k, r, a, 64, &na), PAR_OK);
            int self = 0;
            for (int i = 0; i < na; i++) {
                self += a[i] == r;
                if (i > 0)
                    cr_expect_gt(a[i], a[i - 1], "%s group not ascending", par_group_name((par_group_kind)k));
                cr_assert_eq(par_group_members(&l, (par_group_kind)k, a[i], b, 64, &nb), PAR_OK);
                cr_assert_eq(nb, na);
                cr_expect_eq(memcmp(a, b, (size_t)na * sizeof a[0]), 0, "%s group of %d vs %d",
                             par_group_name((par_group_kind)k), r, a[i]);
            }
            cr_expect_eq(self, na > 0 ? 1 : 0);
        }
}

/* ---- handles on the threads backend ----------------------------------- */

typedef struct {
    const par_layout *l;
} build_arg;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char m_[300];                                                                          \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                  \
            st = par_err(PAR_ECHECK, "%s:%d: %s: %s", __FILE__, __LINE__, #cond, m_);              \
            goto fail_free_groups;                                                                 \
        }                                                                                          \
    } while (0)

static par_status build_and_check(par_comm *world, void *argp)
{
    const build_arg *arg = argp;
    const par_layout *l = arg->l;
    int rank = par_comm_rank(world);
    par_groups g;
    par_status st = par_groups_build(world, l, &g);
    if (st != PAR_OK)
        return st;
    int mem[64];
    for (int k = 0; k < PAR_GROUP_COUNT; k++) {
        int n = 0;
        st = par_group_members(l, (par_group_kind)k, rank, mem, 64, &n);
        if (st != PAR_OK)
            goto fail_free_groups;
        par_comm *c = g.g[k];
        if (n == 0) {
            CHECK(c == NULL, "rank %d has a %s handle but is in no group", rank, par_group_name((par_group_kind)k));
            continue;
        }
        CHECK(c != NULL, "rank %d lacks its %s handle", rank, par_group_name((par_group_kind)k));
        CHECK(par_comm_size(c) == n, "%s: size %d, want %d", par_group_name((par_group_kind)k), par_comm_size(c), n);
        for (int i = 0; i < n; i++) {
            CHECK(par_comm_world_rank(c, i) == mem[i], "%s member %d: %d, want %d", par_group_name((par_group_kind)k),
                  i, par_comm_world_rank(c, i), mem[i]);
            if (mem[i] == rank)
                CHECK(par_comm_rank(c) == i, "%s: my group rank %d, want %d", par_group_name((par_group_kind)k),
                      par_comm_rank(c), i);
        }
        /* The handle talks to exactly those ranks: gather world ranks. */
        int64_t mine = rank, got[64];
        st = par_allgather(c, &mine, got, 1, PAR_C_I64);
        if (st != PAR_OK)
            goto fail_free_groups;
        for (int i = 0; i < n; i++)
            CHECK(got[i] == mem[i], "%s allgather slot %d: %lld, want %d", par_group_name((par_group_kind)k), i,
                  (long long)got[i], mem[i]);
        char want_name[48];
        snprintf(want_name, sizeof want_name, "%s:%d", par_group_name((par_group_kind)k), mem[0]);
        CHECK(!strcmp(par_comm_name(c), want_name), "name '%s', want '%s'", par_comm_name(c), want_name);
    }
    par_groups_free(&g);
    return PAR_OK;
fail_free_groups:
    par_groups_free(&g);
    return st;
}

Test(groups, handles_match_pure_lists_on_threads)
{
    const par_backend *be = par_backend_find("threads");
    cr_assert_not_null(be);
    struct {
        int64_t pp, cp, ep, world;
        const char *str;
    } cases[] = {
        {1, 1, 1, 1, NULL},
        {2, 2, 4, 16, NULL},
        {2, 1, 2, 8, "Et*3|t*5mL"},
        {4, 1, 4, 16, "Et*2|t*2|t|t*3|(|)*2m|L"},
        {1, 4, 2, 8, NULL},
        {3, 2, 3, 18, "Et*2|t*3|t*3mL"},
        {4, 2, 8, 64, NULL},
        {2, 4, 16, 64, "Et*2|t*2|t*2|t*2mL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        par_layout_model m = {.n_layers = 8,
                              .n_mtp_layers = 1,
                              .n_routed_experts = 48,
                              .seq_length = 256,
                              .global_batch_size = 192,
                              .window_size = 8,
                              .n_ratios = 1,
                              .compress_ratios = no_ratios};
        par_layout l;
        par_layout_init(&l);
        l.pp = cases[i].pp;
        l.cp = cases[i].cp;
        l.ep = cases[i].ep;
        l.world = cases[i].world;
        par_layout_set_pp_layout(&l, cases[i].str);
        cr_assert_eq(par_layout_resolve(&l, &m), PAR_OK, "case %zu: %s", i, par_last_error());
        build_arg arg = {&l};
        par_world_opts o = {.timeout_s = 30.0};
        par_status st = par_world_run(be, (int)l.world, build_and_check, &arg, &o);
        cr_expect_eq(st, PAR_OK, "case %zu (PP %lld CP %lld EP %lld N %lld): %s", i, (long long)l.pp,
                     (long long)l.cp, (long long)l.ep, (long long)l.world, par_last_error());
        cr_expect_eq(par_alloc_live(PAR_TAG_COMM), 0, "case %zu leaks comm memory", i);
    }
}

static par_status build_wrong_world(par_comm *world, void *argp)
{
    const par_layout *l = argp;
    par_groups g;
    par_status st = par_groups_build(world, l, &g);
    if (st == PAR_OK) {
        par_groups_free(&g);
        return par_err(PAR_ECHECK, "built groups for the wrong world");
    }
    return st == PAR_EMISMATCH ? PAR_OK : st;
}

Test(groups, wrong_world_size_is_refused)
{
    par_layout l = resolved(2, 1, 1, 2, NULL, 8, 1);
    par_world_opts o = {.timeout_s = 10.0};
    cr_expect_eq(par_world_run(par_backend_find("threads"), 4, build_wrong_world, &l, &o), PAR_OK, "%s",
                 par_last_error());
    par_layout un;
    par_layout_init(&un);
    cr_expect_eq(par_world_run(par_backend_find("self"), 1, build_wrong_world, &un, &o), PAR_EINVAL, "%s",
                 par_last_error());
    cr_expect(strstr(par_last_error(), "not resolved"), "%s", par_last_error());
}
