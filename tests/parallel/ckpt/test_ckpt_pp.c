/* tests/parallel/ckpt/test_ckpt_pp.c - distributed checkpoints under pipeline
 * parallelism (parallel/ckpt/ckpt_model.h, parallel/ckpt/ckpt_owner.h,
 * docs/checkpoints.md "With the driver"): the ownership rule covers every element once for PP / VPP / DualPipe /
 * DualPipeV layouts with DP, CP, EP and ZeRO-1; a save under PP resharded to
 * a layout without PP (and the reverse) exports bitwise equal; a run resumed
 * under PP from a checkpoint saved without PP (and the reverse) equals the
 * serial golden (f64 policy), and resumed under the same PP layout equals the
 * uninterrupted run bit for bit.  v4-tiny (3 layers + 1 MTP, 8 experts),
 * f64, threads backend. */
#include <criterion/criterion.h>

#include "tmpdir.h"

#include "files.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/facade.h"
#include "model/params.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/ckpt/ckpt_owner.h"
#include "parallel/train/run.h"
#include "parallel/plan/plan.h"

typedef struct {
    int64_t world, pp, vpp, ep, cp, zero;
    const char *layout, *schedule;
} lay;

static par_layout layout_of(lay l)
{
    par_layout L;
    par_layout_init(&L);
    L.world = l.world;
    L.pp = l.pp ? l.pp : 1;
    L.vpp = l.vpp;
    L.ep = l.ep ? l.ep : 1;
    L.cp = l.cp ? l.cp : 1;
    L.distributed_optimizer = (int)l.zero;
    if (l.layout)
        cr_assert_eq(par_layout_set_pp_layout(&L, l.layout), 0);
    if (l.schedule)
        cr_assert_eq(par_layout_set_schedule(&L, l.schedule), 0);
    return L;
}

/* steps under l; optional dump, save, load. */
static par_status run(lay l, int64_t steps, const char *dump, const char *save, const char *load,
                      par_run_summary *sum)
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = steps;
    o.backend = par_backend_find("threads");
    o.layout = layout_of(l);
    o.dump_dir = dump;
    o.save_dir = save;
    par_ckpt *ck = NULL;
    if (load)
        cr_assert_eq(par_ckpt_open(load, &ck), 0, "%s", par_last_error());
    o.load = ck;
    par_status s = par_run(&o, sum);
    par_ckpt_close(ck);
    return s;
}


static void compare(const char *a, const char *b, const char *what)
{
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_F64;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(a, b, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "%s: %d failing entries", what, par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 400, "%s: parameters and optimizer state compared", what);
    par_compare_report_free(r);
}

/* PP layouts of v4-tiny (3 layers + MTP) with DP, CP, EP, ZeRO-1 */
static const lay PPL[] = {
    {2, 2, 0, 1, 1, 0, "Et*2|tmL", NULL},           /* PP2, replicated                     */
    {4, 2, 0, 1, 1, 1, "Et*2|tmL", NULL},           /* PP2 x DP2, ZeRO-1                   */
    {8, 2, 0, 4, 1, 1, "Et*2|tmL", NULL},           /* PP2 x EP4, ZeRO-1                   */
    {8, 2, 0, 2, 2, 1, "Et|t*2mL", NULL},           /* PP2 x CP2 x EP2, ZeRO-1             */
    {3, 3, 0, 1, 1, 1, NULL, NULL},                 /* PP3, default split                  */
    {4, 2, 2, 1, 1, 1, "Et|t|t|mL", NULL},          /* PP2 x VPP2 interleaved x DP2, ZeRO-1 */
    {4, 2, 0, 2, 1, 1, "Et*2|tmL", "dualpipe"},     /* DualPipe (copies) x EP2, ZeRO-1     */
    {2, 2, 2, 1, 1, 1, "Et|t|t|mL", "dualpipev"},   /* DualPipeV, ZeRO-1                   */
    {8, 4, 0, 1, 1, 1, "E|t|t|tmL", NULL},          /* PP4 (a stage with only E) x DP2     */
};

/* Every element of every tensor is owned by exactly one rank for each PP
 * layout, resolved against the model (as `parity run` and `parity ckpt
 * reshard` do) and unresolved (segments rebuilt from the layout string /
 * default split with the block counts of the tensor list): the same slices. */
Test(ckpt_pp, owner_covers_every_element_once)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), 0);
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &c), 0);
    par_ckpt_tensor *tens;
    int nt;
    cr_assert_eq(par_ckpt_tensors_of_params(&t, 64, &tens, &nt), 0);
    for (size_t li = 0; li < sizeof PPL / sizeof PPL[0]; li++) {
        par_layout lu = layout_of(PPL[li]), lr = lu;
        cr_assert_eq(par_plan_resolve(&lr, &c), 0, "layout %zu: %s", li, par_last_error());
        int64_t *cnt = calloc((size_t)nt, sizeof *cnt);
        int64_t total = 0, want = 0;
        for (int r = 0; r < PPL[li].world; r++) {
            par_ckpt_slice *sl, *su;
            int n, nu;
            cr_assert_eq(par_ckpt_owner_driver(&lr, (int)PPL[li].world, r, tens, nt, &sl, &n, NULL), 0,
                         "layout %zu rank %d: %s", li, r, par_last_error());
            cr_assert_eq(par_ckpt_owner_driver(&lu, (int)PPL[li].world, r, tens, nt, &su, &nu, NULL), 0,
                         "layout %zu rank %d (unresolved): %s", li, r, par_last_error());
            cr_expect_eq(n, nu, "layout %zu rank %d: resolved and unresolved slices differ", li, r);
            for (int i = 0; i < n; i++) {
                cr_assert_lt(sl[i].begin, sl[i].end);
                if (i < nu)
                    cr_expect(!strcmp(sl[i].name, su[i].name) && sl[i].begin == su[i].begin &&
                                  sl[i].end == su[i].end,
                              "layout %zu rank %d slice %d", li, r, i);
                for (int j = 0; j < nt; j++)
                    if (!strcmp(tens[j].name, sl[i].name))
                        cnt[j] += sl[i].end - sl[i].begin;
                total += sl[i].end - sl[i].begin;
            }
            par_free(sl);
            par_free(su);
        }
        for (int j = 0; j < nt; j++) {
            int64_t numel = 1;
            for (int d = 0; d < tens[j].ndim; d++)
                numel *= tens[j].shape[d];
            want += numel;
            cr_expect_eq(cnt[j], numel, "layout %zu: %s covered %lld of %lld", li, tens[j].name,
                         (long long)cnt[j], (long long)numel);
        }
        cr_expect_eq(total, want, "layout %zu: no overlap", li);
        free(cnt);
    }
    par_free(tens);
    par_param_table_free(&t);
}

/* The rule reads the tensors' roles, not their names: with every name but
 * embed.weight / head.weight replaced by "x<i>" (no ".experts.", no
 * "layers." or "opt." left), every rank of every PP layout gets the same
 * ranges of the same tensors. */
Test(ckpt_pp, owner_reads_roles_not_names)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), 0);
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &c), 0);
    par_ckpt_tensor *tens, *anon;
    int nt;
    cr_assert_eq(par_ckpt_tensors_of_params(&t, 64, &tens, &nt), 0);
    anon = malloc((size_t)nt * sizeof *anon);
    memcpy(anon, tens, (size_t)nt * sizeof *anon);
    for (int i = 0; i < nt; i++)
        if (strcmp(tens[i].name, "embed.weight") && strcmp(tens[i].name, "head.weight"))
            snprintf(anon[i].name, sizeof anon[i].name, "x%d", i);
    for (size_t li = 0; li < sizeof PPL / sizeof PPL[0]; li++) {
        par_layout l = layout_of(PPL[li]);
        for (int r = 0; r < PPL[li].world; r++) {
            par_ckpt_slice *sa, *sb;
            int na, nb;
            cr_assert_eq(par_ckpt_owner_driver(&l, (int)PPL[li].world, r, tens, nt, &sa, &na, NULL), 0, "%s",
                         par_last_error());
            cr_assert_eq(par_ckpt_owner_driver(&l, (int)PPL[li].world, r, anon, nt, &sb, &nb, NULL), 0, "%s",
                         par_last_error());
            cr_assert_eq(na, nb, "layout %zu rank %d: %d slices by name, %d by role", li, r, na, nb);
            for (int i = 0, j = 0; i < na; i++) {
                while (j < nt && strcmp(tens[j].name, sa[i].name))
                    j++;
                cr_assert_lt(j, nt);
                cr_expect(!strcmp(sb[i].name, anon[j].name) && sa[i].begin == sb[i].begin && sa[i].end == sb[i].end,
                          "layout %zu rank %d: %s [%lld, %lld) vs %s [%lld, %lld)", li, r, sa[i].name,
                          (long long)sa[i].begin, (long long)sa[i].end, sb[i].name, (long long)sb[i].begin,
                          (long long)sb[i].end);
            }
            par_free(sa);
            par_free(sb);
        }
    }
    free(anon);
    par_free(tens);
    par_param_table_free(&t);
}

/* The pipeline stage that writes a tensor is the lowest one holding it:
 * under PP2 'Et*2|tmL' embed.weight (stages 0 and 1: the MTP input embeds)
 * is written by pipeline rank 0, head.weight and the MTP block by rank 1. */
Test(ckpt_pp, lowest_pipeline_holder_writes)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), 0);
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &c), 0);
    par_ckpt_tensor *tens;
    int nt;
    cr_assert_eq(par_ckpt_tensors_of_params(&t, 64, &tens, &nt), 0);
    par_layout l = layout_of(PPL[0]);
    cr_assert_eq(par_plan_resolve(&l, &c), 0, "%s", par_last_error());
    const char *on[2][3] = {{"embed.weight", "opt.embed.weight.exp_avg", "layers.1.attn.wq_a.weight"},
                            {"head.weight", "mtp.0.norm.weight", "layers.2.ffn.experts.3.w1.weight"}};
    for (int r = 0; r < 2; r++) {
        par_ckpt_slice *sl;
        int n;
        cr_assert_eq(par_ckpt_owner_driver(&l, 2, r, tens, nt, &sl, &n, NULL), 0, "%s", par_last_error());
        for (int k = 0; k < 3; k++) {
            int found[2] = {0, 0};
            for (int q = 0; q < 2; q++)
                for (int i = 0; i < n; i++)
                    found[q] |= !strcmp(sl[i].name, on[q][k]);
            cr_expect(found[r], "rank %d writes %s", r, on[r][k]);
            cr_expect(!found[1 - r], "rank %d does not write %s", r, on[1 - r][k]);
        }
        par_free(sl);
    }
    par_free(tens);
    par_param_table_free(&t);
}

/* A save (1 step) under every PP layout succeeds (each rank finds what the
 * rule makes it write in its own buffers and plans) and its export equals
 * the export of the same step at N = 1 within the f64 policy. */
Test(ckpt_pp, save_under_every_pp_layout)
{
    char *t = mktmp(), *r = sub(t, "ref"), *er = sub(t, "ref.st");
    cr_assert_eq(run((lay){1, 1, 0, 1, 1, 0, NULL, NULL}, 1, NULL, r, NULL, NULL), 0, "%s", par_last_error());
    cr_assert_eq(par_ckpt_export(r, er), 0, "%s", par_last_error());
    for (size_t li = 0; li < sizeof PPL / sizeof PPL[0]; li++) {
        char n[16], ne[16], what[64];
        snprintf(n, sizeof n, "s%zu", li);
        snprintf(ne, sizeof ne, "s%zu.st", li);
        snprintf(what, sizeof what, "PP layout %zu vs N = 1", li);
        char *a = sub(t, n), *ea = sub(t, ne);
        cr_assert_eq(run(PPL[li], 1, NULL, a, NULL, NULL), 0, "layout %zu: %s", li, par_last_error());
        cr_assert_eq(par_ckpt_export(a, ea), 0, "%s", par_last_error());
        compare(er, ea, what);
        free(a), free(ea);
    }
    rmtree(t);
    free(t), free(r), free(er);
}

/* A save under PP (PP2 x DP2, ZeRO-1) resharded to layouts without PP and
 * with other PP layouts exports bitwise equal; and a save without PP
 * (DP4, ZeRO-1) resharded to PP layouts too. */
Test(ckpt_pp, reshard_pp_and_back_is_bitwise)
{
    char *t = mktmp();
    const lay A[] = {PPL[1], {4, 1, 0, 1, 1, 1, NULL, NULL}};
    const lay B[2][4] = {{{1, 1, 0, 1, 1, 0, NULL, NULL}, {8, 1, 0, 8, 1, 1, NULL, NULL}, PPL[5], PPL[7]},
                         {PPL[3], PPL[4], PPL[6], PPL[8]}};
    for (int ai = 0; ai < 2; ai++) {
        char na[16], nea[16];
        snprintf(na, sizeof na, "a%d", ai);
        snprintf(nea, sizeof nea, "a%d.st", ai);
        char *a = sub(t, na), *ea = sub(t, nea);
        cr_assert_eq(run(A[ai], 1, NULL, a, NULL, NULL), 0, "%s", par_last_error());
        cr_assert_eq(par_ckpt_export(a, ea), 0, "%s", par_last_error());
        for (int bi = 0; bi < 4; bi++) {
            char nb[16], neb[16];
            snprintf(nb, sizeof nb, "b%d%d", ai, bi);
            snprintf(neb, sizeof neb, "b%d%d.st", ai, bi);
            char *b = sub(t, nb), *eb = sub(t, neb);
            par_config c;
            cr_assert_eq(par_config_preset(&c, "v4-tiny"), 0);
            par_layout l = layout_of(B[ai][bi]);
            cr_assert_eq(par_plan_resolve(&l, &c), 0, "%s", par_last_error());
            cr_assert_eq(par_ckpt_reshard(a, b, &l, par_ckpt_owner_driver, NULL), 0, "A%d -> B%d: %s", ai, bi,
                         par_last_error());
            cr_assert_eq(par_ckpt_export(b, eb), 0, "%s", par_last_error());
            cr_expect(files_equal(ea, eb), "A%d -> B%d -> export differs from A%d -> export", ai, bi, ai);
            free(b), free(eb);
        }
        free(a), free(ea);
    }
    rmtree(t);
    free(t);
}

/* Resume: 2 steps under A, save, on to 4 under B (--steps 4, the total) == the serial golden's
 * params.4 (f64 policy; the dump includes the optimizer state) for
 * A = PP2 x DP2 ZeRO-1 -> B = EP2 x DP2 (no PP) and A = DP4 ZeRO-1 ->
 * B = PP2 x VPP2 interleaved; resumed under A itself == 4 uninterrupted steps
 * under A bit for bit (every rank read back exactly what it held). */
Test(ckpt_pp, resume_across_pp)
{
    char *t = mktmp(), *g = sub(t, "golden"), *gp = sub(t, "golden/params.4.safetensors");
    par_golden_opts go;
    par_golden_opts_init(&go);
    cr_assert_eq(par_config_preset(&go.cfg, "v4-tiny"), 0);
    go.steps = 4;
    go.out_dir = g;
    cr_assert_eq(par_golden_run(&go, NULL), 0, "%s", par_last_error());
    const lay A[2] = {PPL[1], {4, 1, 0, 1, 1, 1, NULL, NULL}};
    const lay B[2] = {{4, 1, 0, 2, 1, 0, NULL, NULL}, PPL[5]};
    for (int k = 0; k < 2; k++) {
        char n[5][16];
        const char *nm[5] = {"a2", "r4", "d", "a4", "s4"};
        for (int i = 0; i < 5; i++)
            snprintf(n[i], sizeof n[i], "%s_%d", nm[i], k);
        char *a2 = sub(t, n[0]), *r4 = sub(t, n[1]), *d = sub(t, n[2]), *a4 = sub(t, n[3]), *s4 = sub(t, n[4]);
        char *dp = sub(d, "params.4.safetensors"); /* global step numbers */
        par_run_summary sum;
        cr_assert_eq(run(A[k], 2, NULL, a2, NULL, NULL), 0, "%s", par_last_error());
        cr_assert_eq(run(B[k], 4, d, r4, a2, &sum), 0, "%s", par_last_error());
        cr_expect_eq(sum.start_step, 2);
        cr_expect_eq(sum.steps, 2, "steps 2 and 3 ran");
        par_run_summary_free(&sum);
        compare(gp, dp, k ? "DP4 -> PP2 x VPP2, vs the golden's params.4" : "PP2 -> EP2, vs the golden's params.4");
        if (k == 0) { /* the same PP layout: bit for bit the uninterrupted run */
            cr_assert_eq(run(A[k], 4, NULL, a4, NULL, NULL), 0, "%s", par_last_error());
            cr_assert_eq(run(A[k], 4, NULL, s4, a2, NULL), 0, "%s", par_last_error());
            par_ckpt_diff_result res;
            cr_assert_eq(par_ckpt_diff(a4, s4, NULL, &res), 0, "%s", par_last_error());
            cr_expect(res.state_equal && res.tensors_equal, "resume under PP differs: %s", res.first);
        }
        free(a2), free(r4), free(d), free(a4), free(s4), free(dp);
    }
    rmtree(t);
    free(t), free(g), free(gp);
}

Test(ckpt_pp, nothing_left_allocated)
{
    char *t = mktmp(), *a = sub(t, "a");
    int64_t before = par_alloc_live_total();
    cr_assert_eq(run(PPL[2], 1, NULL, a, NULL, NULL), 0, "%s", par_last_error());
    cr_assert_eq(run(PPL[6], 2, NULL, NULL, a, NULL), 0, "%s", par_last_error());
    cr_expect_eq(par_alloc_live_total(), before, "a PP save and a load under DualPipe: live bytes %lld -> %lld",
                 (long long)before, (long long)par_alloc_live_total());
    rmtree(t);
    free(t), free(a);
}
