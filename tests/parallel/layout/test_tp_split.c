/* parallel: the TP / ETP cut of every parameter (parallel/layout/tp_split.h) and
 * the model-wide divisibility rules. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "core/status.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/layout/tp_split.h"

/* The split, written out by name: everything else is replicated. */
static int expected(const char *name, par_tp_cut *cut, par_tp_group *group)
{
    static const struct {
        const char *end;
        par_tp_cut cut;
    } sharded[] = {{".attn.wq_b.weight", PAR_TP_ROWS},     {".attn.attn_sink", PAR_TP_ROWS},
                   {".attn.wo_a.weight", PAR_TP_ROWS},     {".attn.wo_b.weight", PAR_TP_COLS},
                   {".indexer.wq_b.weight", PAR_TP_ROWS},  {".indexer.weights_proj.weight", PAR_TP_ROWS},
                   {".shared_experts.w1.weight", PAR_TP_ROWS},
                   {".shared_experts.w3.weight", PAR_TP_ROWS},
                   {".shared_experts.w2.weight", PAR_TP_COLS}};
    size_t n = strlen(name);
    *group = PAR_TP_GROUP_TP;
    if (!strcmp(name, "embed.weight") || !strcmp(name, "head.weight")) {
        *cut = PAR_TP_ROWS;
        return 1;
    }
    if (strstr(name, ".ffn.experts.")) {
        *group = PAR_TP_GROUP_ETP;
        *cut = !strcmp(name + n - 9, "w2.weight") ? PAR_TP_COLS : PAR_TP_ROWS;
        return 1;
    }
    for (size_t i = 0; i < sizeof sharded / sizeof *sharded; i++) {
        size_t k = strlen(sharded[i].end);
        if (n > k && !strcmp(name + n - k, sharded[i].end)) {
            *cut = sharded[i].cut;
            return 1;
        }
    }
    *cut = PAR_TP_REPLICATED;
    return 0;
}

Test(tp_split, every_tensor_of_v4_tiny)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), PAR_OK);
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &c), PAR_OK);
    int n_split = 0, n_rep = 0;
    for (int i = 0; i < t.n; i++) {
        par_tp_cut want;
        par_tp_group wg;
        n_split += expected(t.p[i].name, &want, &wg);
        par_tp_split s = par_tp_split_of(t.p[i].name);
        cr_assert_eq(s.cut, want, "%s: cut %s, want %s", t.p[i].name, par_tp_cut_name(s.cut),
                     par_tp_cut_name(want));
        if (want != PAR_TP_REPLICATED)
            cr_assert_eq(s.group, wg, "%s: group", t.p[i].name);
        n_rep += want == PAR_TP_REPLICATED;
        /* every split tensor divides at TP 2 (v4-tiny) */
        int64_t r, cl;
        if (want != PAR_TP_REPLICATED)
            cr_assert_eq(par_tp_shard_shape(t.p[i].name, t.p[i].shape[0], t.p[i].shape[1], s.cut, 2,
                                            &r, &cl), PAR_OK, "%s", par_last_error());
    }
    /* 4 blocks: 4 x (6 attention, 3 shared, 3*8 experts) less the two
     * indexer tensors of the 3 blocks without an indexer, plus embed, head */
    cr_assert_eq(n_split, 4 * (6 + 3 + 24) - 3 * 2 + 2);
    cr_assert_gt(n_rep, 50);
    cr_assert_eq(par_tp_split_of("layers.0.attn.indexer.compressor.wkv.weight").cut,
                 PAR_TP_REPLICATED);
    cr_assert_eq(par_tp_split_of("mtp.0.norm.weight").cut, PAR_TP_REPLICATED);
    cr_assert_eq(par_tp_split_of("xembed.weight").cut, PAR_TP_REPLICATED);
    par_param_table_free(&t);
}

Test(tp_split, slice_and_unslice)
{
    double full[6 * 4], back[6 * 4], shard[12];
    for (int i = 0; i < 24; i++)
        full[i] = i;
    memset(back, 0, sizeof back);
    for (int r = 0; r < 2; r++) {
        par_tp_slice(shard, full, 6, 4, PAR_TP_COLS, r, 2, 8);
        cr_assert_eq(shard[0], 2 * r);
        cr_assert_eq(shard[2], 4 + 2 * r, "row 1 of the column block");
        par_tp_unslice(back, shard, 6, 4, PAR_TP_COLS, r, 2, 8);
    }
    cr_assert(!memcmp(full, back, sizeof full));
    par_tp_slice(shard, full, 6, 4, PAR_TP_ROWS, 1, 2, 8);
    cr_assert_eq(shard[0], 12, "rows 3..5");
    int64_t r, c;
    par_err_set_quiet(1);
    cr_assert_eq(par_tp_shard_shape("w", 6, 4, PAR_TP_ROWS, 4, &r, &c), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "w [6, 4]: its rows (6) are not divisible by the group size 4"),
              "%s", par_last_error());
    par_err_set_quiet(0);
    cr_assert_eq(par_tp_shard_shape("w", 6, 4, PAR_TP_COLS, 4, &r, &c), PAR_OK);
    cr_assert(r == 6 && c == 1);
}

/* The shard / logical maps of checkpoint slices: every element of rank r's
 * packed block maps to where par_tp_slice took it from, each run stays
 * contiguous in both (a column shard: to its row's end), and the inverse
 * gives back the shard offset (-1 outside the block). */
Test(tp_split, shard_runs_match_the_slice)
{
    double full[6 * 4], shard[6 * 4];
    for (int i = 0; i < 24; i++)
        full[i] = i;
    const par_tp_cut cuts[3] = {PAR_TP_REPLICATED, PAR_TP_ROWS, PAR_TP_COLS};
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < (k == 0 ? 1 : 2); r++) {
            const int P = k == 0 ? 1 : 2;
            par_tp_slice(shard, full, 6, 4, cuts[k], r, P, 8);
            const int64_t n = 24 / P;
            for (int64_t j = 0; j < n; j++) {
                int64_t run, back;
                const int64_t g = par_tp_shard_run(6, 4, cuts[k], r, P, j, &run);
                cr_assert_eq(full[g], shard[j], "cut %d rank %d element %lld", k, r, (long long)j);
                cr_assert(run >= 1 && j + run <= n && full[g + run - 1] == shard[j + run - 1]);
                cr_assert_eq(run, k == 2 ? 2 - j % 2 : n - j, "cut %d: a column run ends with its row", k);
                cr_assert_eq(par_tp_logical_run(6, 4, cuts[k], r, P, g, &back), j);
                cr_assert_eq(back, run);
            }
            int64_t run;
            if (k == 1)
                cr_assert_eq(par_tp_logical_run(6, 4, cuts[k], r, P, r ? 0 : 12, &run), -1, "another rank's rows");
            if (k == 2)
                cr_assert_eq(par_tp_logical_run(6, 4, cuts[k], r, P, r ? 4 : 6, &run), -1, "another rank's columns");
        }
}

Test(tp_split, config_rules)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), PAR_OK);
    cr_assert_eq(par_tp_check_config(&c, 2, 2), PAR_OK);
    par_err_set_quiet(1);
    cr_assert_eq(par_tp_check_config(&c, 4, 1), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "tensor-model-parallel-size 4 does not divide n_heads 2"),
              "%s", par_last_error());
    c.n_heads = 4;
    cr_assert_eq(par_tp_check_config(&c, 4, 1), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "does not divide o_groups 2"), "%s", par_last_error());
    c.o_groups = 4;
    cr_assert_eq(par_tp_check_config(&c, 4, 1), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "does not divide index_n_heads 2"), "%s", par_last_error());
    c.index_n_heads = 4;
    cr_assert_eq(par_tp_check_config(&c, 4, 1), PAR_OK);
    cr_assert_eq(par_tp_check_config(&c, 1, 32), PAR_EINVAL);
    cr_assert(strstr(par_last_error(),
                     "expert-tensor-parallel-size 32 does not divide moe_inter_dim 16"),
              "%s", par_last_error());
    c.vocab_size = 130;
    cr_assert_eq(par_tp_check_config(&c, 4, 1), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "does not divide vocab_size 130"), "%s", par_last_error());
    par_err_set_quiet(0);
}
