/* tests/model/test_rootcause.c - the dataflow order of golden-set tensors
 * (model/rootcause.h) and the root cause of a comparison of two hand-edited
 * step files: a small gradient change in layer 1 is named before a large
 * one in layer 0 (the backward runs from the last layer), before the
 * routing mismatches it causes, and before every later file. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "model/compare.h"
#include "model/rootcause.h"

static int before(const char *fa, const char *ta, par_dtype da, const char *fb, const char *tb, par_dtype db)
{
    return par_dataflow_cmp(fa, ta, da, fb, tb, db) < 0 && par_dataflow_cmp(fb, tb, db, fa, ta, da) > 0;
}

#define F PAR_F64
#define I PAR_I32
#define S0 "step.0.safetensors"
#define S1 "step.1.safetensors"
#define P1 "params.1.safetensors"

Test(rootcause, files_in_step_order)
{
    cr_expect(before("params.0.safetensors", "embed.weight", F, S0, "input.tokens", I));
    cr_expect(before(S0, "grad.embed.weight", F, P1, "embed.weight", F));
    cr_expect(before(P1, "layers.2.ffn.gate.weight", F, S1, "act.layers.0", F));
    cr_expect(before("step.9.safetensors", "out.loss", F, "params.10.safetensors", "embed.weight", F),
                     "numeric, not by name");
    cr_expect(before("dir/step.0.safetensors", "act.layers.0", F, "dir/step.1.safetensors", "act.layers.0", F));
}

Test(rootcause, forward_block_by_block)
{
    cr_expect(before(S0, "input.tokens", I, S0, "act.layers.0", F));
    cr_expect(before(S0, "act.layers.0", F, S0, "router.layers.0.idx", I), "a block's float output first");
    cr_expect(before(S0, "router.layers.0.idx", I, S0, "router.layers.0.load", PAR_I64));
    cr_expect(before(S0, "router.layers.0.load", PAR_I64, S0, "act.layers.1", F));
    cr_expect(before(S0, "act.layers.1", F, S0, "attn.layers.1.selected", I));
    cr_expect(before(S0, "attn.layers.1.selected", I, S0, "act.layers.2", F));
    cr_expect(before(S0, "act.layers.2", F, S0, "act.layers.10", F), "layers by number");
    cr_expect(before(S0, "act.layers.10", F, S0, "out.logits", F));
    cr_expect(before(S0, "out.logits", F, S0, "act.mtp.0", F));
    cr_expect(before(S0, "router.mtp.0.idx", I, S0, "out.mtp_logits", F));
    cr_expect(before(S0, "out.mtp_logits", F, S0, "out.loss_main", F));
    cr_expect(before(S0, "out.loss_aux", F, S0, "out.loss", F));
}

Test(rootcause, backward_from_the_last_block)
{
    cr_expect(before(S0, "out.loss", F, S0, "grad.mtp.0.ffn.gate.weight", F));
    cr_expect(before(S0, "grad.mtp.0.attn_norm.weight", F, S0, "grad.head.weight", F), "MTP before the head");
    cr_expect(before(S0, "grad.head.weight", F, S0, "grad.layers.2.ffn.experts.0.w1.weight", F));
    cr_expect(before(S0, "grad.layers.2.ffn.experts.0.w1.weight", F, S0, "grad.layers.2.attn.wq_a.weight", F),
              "in a layer the FFN before the attention");
    cr_expect(before(S0, "grad.layers.2.attn.wq_a.weight", F, S0, "grad.layers.2.attn_norm.weight", F));
    cr_expect(before(S0, "grad.layers.2.hc_attn_fn", F, S0, "grad.layers.1.ffn.gate.weight", F));
    cr_expect(before(S0, "grad.layers.10.hc_attn_fn", F, S0, "grad.layers.9.ffn.gate.weight", F));
    cr_expect(before(S0, "grad.layers.0.hc_attn_base", F, S0, "grad.embed.weight", F));
    cr_expect(before(S0, "grad.embed.weight", F, S0, "out.grad_norm", F));
}

Test(rootcause, optimizer_state_before_its_parameter)
{
    cr_expect(before(P1, "opt.layers.0.attn.wq_a.weight.momentum", F, P1, "layers.0.attn.wq_a.weight", F));
    cr_expect(before(P1, "embed.weight", F, P1, "layers.0.hc_attn_fn", F));
    cr_expect(before(P1, "layers.0.ffn.gate.bias", F, P1, "layers.1.hc_attn_fn", F));
}

/* A step file of two layers whose tensors the tests edit. */
static par_st_file *step_file(double g1, double g0, int32_t route, double act1)
{
    static double gw1[4], gw0[4], a0[2], a1[2];
    static int32_t idx[2];
    double src1[4] = {1, 2, 3, 4}, src0[4] = {5, 6, 7, 8};
    for (int i = 0; i < 4; i++)
        gw1[i] = src1[i], gw0[i] = src0[i];
    gw1[2] += g1;
    gw0[1] += g0;
    a0[0] = 1, a0[1] = 2, a1[0] = 3 + act1, a1[1] = 4;
    idx[0] = 1, idx[1] = route;
    int64_t s4[1] = {4}, s2[2] = {1, 2};
    par_tensor t[5] = {par_tensor_view(PAR_F64, 1, s4, gw1), par_tensor_view(PAR_F64, 1, s4, gw0),
                       par_tensor_view(PAR_F64, 2, s2, a0), par_tensor_view(PAR_F64, 2, s2, a1),
                       par_tensor_view(PAR_I32, 2, s2, idx)};
    static const char *names[5] = {"grad.layers.1.attn.wkv.weight", "grad.layers.0.attn.wkv.weight", "act.layers.0",
                                   "act.layers.1", "router.layers.1.idx"};
    par_st_writer *w = NULL;
    cr_assert_eq(par_st_writer_new(&w), 0);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(par_st_writer_add(w, names[i], &t[i]), 0);
    void *buf = NULL;
    size_t len = 0;
    cr_assert_eq(par_st_writer_to_mem(w, &buf, &len), 0, "%s", par_last_error());
    par_st_writer_free(w);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read_mem(buf, len, "step.0.safetensors", &f), 0, "%s", par_last_error());
    par_free(buf);
    return f;
}

static const char *root_tensor(double g1, double g0, int32_t route, double act1, int *n_cons)
{
    par_st_file *a = step_file(0, 0, 3, 0), *b = step_file(g1, g0, route, act1);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_st(a, b, "step.0.safetensors", NULL, &r), 0, "%s", par_last_error());
    par_root_cause rc;
    par_compare_root_cause(r, &rc);
    static char name[128];
    name[0] = 0;
    if (rc.root >= 0)
        snprintf(name, sizeof name, "%s", par_compare_report_entry(r, rc.root)->tensor);
    *n_cons = rc.n_consequences;
    par_compare_report_free(r);
    par_st_close(a);
    par_st_close(b);
    return name;
}

Test(rootcause, first_divergence_not_the_largest)
{
    int nc = -1;
    /* a 1e-6 change of layer 1's gradient, a 1.0 change of layer 0's: layer 1 comes first backward */
    cr_expect_str_eq(root_tensor(1e-6, 1.0, 3, 0, &nc), "grad.layers.1.attn.wkv.weight");
    cr_expect_eq(nc, 0);
    /* a routing mismatch of layer 1 with its block output changed: the float is the cause */
    cr_expect_str_eq(root_tensor(1e-6, 0, 5, 1e-3, &nc), "act.layers.1");
    cr_expect_eq(nc, 1, "the routing mismatch is a consequence (%d)", nc);
    /* a routing flip alone (floats within tolerance): the routing is the root */
    cr_expect_str_eq(root_tensor(0, 0, 5, 0, &nc), "router.layers.1.idx");
    cr_expect_eq(nc, 0);
    /* nothing differs: no root */
    cr_expect_str_eq(root_tensor(0, 0, 3, 0, &nc), "");
}
