/* model: the parameter table. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "model/params.h"

static par_param_table T;

static void setup_tiny(void)
{
    par_err_set_quiet(1);
    par_config c;
    par_config_preset(&c, "v4-tiny");
    cr_assert_eq(par_param_table_build(&T, &c), PAR_OK, "%s", par_last_error());
}
static void teardown(void) { par_param_table_free(&T); }

TestSuite(params, .init = setup_tiny, .fini = teardown);

static const par_param *get(const char *name)
{
    const par_param *p = par_param_lookup(&T, name);
    cr_assert(p, "missing %s", name);
    return p;
}

static void expect_shape(const char *name, int64_t s0, int64_t s1)
{
    const par_param *p = get(name);
    cr_expect_eq(p->shape[0], s0, "%s dim 0: %lld", name, (long long)p->shape[0]);
    cr_expect_eq(p->shape[1], s1, "%s dim 1: %lld", name, (long long)p->shape[1]);
    cr_expect_eq(p->numel, s0 * s1, "%s", name);
}

Test(params, names_and_shapes_of_v4_tiny)
{
    /* d=32 n=4 H=2 hd=16 q_lora=16 G=2 o_lora=8 E=8 K=2 I=16 ihd=16 iH=2 V=128; ratios 0,4,16,0 */
    expect_shape("embed.weight", 128, 32);
    expect_shape("head.weight", 128, 32);
    expect_shape("norm.weight", 32, 1);
    expect_shape("hc_head_fn", 4, 128);
    expect_shape("hc_head_base", 4, 1);
    expect_shape("hc_head_scale", 1, 1);
    expect_shape("layers.0.hc_attn_fn", 24, 128);
    expect_shape("layers.0.hc_ffn_base", 24, 1);
    expect_shape("layers.0.hc_attn_scale", 3, 1);
    expect_shape("layers.0.attn.attn_sink", 2, 1);
    expect_shape("layers.0.attn.wq_a.weight", 16, 32);
    expect_shape("layers.0.attn.wq_b.weight", 32, 16);
    expect_shape("layers.0.attn.wkv.weight", 16, 32);
    expect_shape("layers.0.attn.kv_norm.weight", 16, 1);
    expect_shape("layers.0.attn.wo_a.weight", 16, 16);
    expect_shape("layers.0.attn.wo_b.weight", 32, 16);
    expect_shape("layers.1.attn.compressor.wkv.weight", 32, 32);
    expect_shape("layers.1.attn.compressor.ape", 4, 32);
    expect_shape("layers.1.attn.compressor.norm.weight", 16, 1);
    expect_shape("layers.1.attn.indexer.wq_b.weight", 32, 16);
    expect_shape("layers.1.attn.indexer.weights_proj.weight", 2, 32);
    expect_shape("layers.1.attn.indexer.compressor.wgate.weight", 32, 32);
    expect_shape("layers.1.attn.indexer.compressor.ape", 4, 32);
    expect_shape("layers.1.attn.indexer.compressor.norm.weight", 16, 1);
    expect_shape("layers.2.attn.compressor.ape", 16, 16);
    expect_shape("layers.2.attn.compressor.wgate.weight", 16, 32);
    expect_shape("layers.0.ffn.gate.weight", 8, 32);
    expect_shape("layers.0.ffn.gate.tid2eid", 128, 2);
    expect_shape("layers.1.ffn.gate.bias", 8, 1);
    expect_shape("layers.2.ffn.experts.7.w1.weight", 16, 32);
    expect_shape("layers.2.ffn.experts.7.w2.weight", 32, 16);
    expect_shape("layers.2.ffn.shared_experts.w3.weight", 16, 32);
    expect_shape("mtp.0.e_proj.weight", 32, 32);
    expect_shape("mtp.0.h_proj.weight", 32, 32);
    expect_shape("mtp.0.enorm.weight", 32, 1);
    expect_shape("mtp.0.hc_head_fn", 4, 128);
    expect_shape("mtp.0.hc_head_scale", 1, 1);
    expect_shape("mtp.0.ffn.gate.bias", 8, 1);
    expect_shape("mtp.0.attn.wkv.weight", 16, 32);
    /* absent */
    const char *absent[] = {"layers.0.attn.compressor.ape", "layers.2.attn.indexer.wq_b.weight",
                            "layers.0.ffn.gate.bias", "layers.1.ffn.gate.tid2eid", "mtp.0.embed.weight",
                            "mtp.0.head.weight", "mtp.0.attn.compressor.wkv.weight", "mtp.0.ffn.gate.tid2eid",
                            "layers.3.attn.wq_a.weight", "layers.0.ffn.experts.8.w1.weight", NULL};
    for (int i = 0; absent[i]; i++)
        cr_expect_eq(par_param_find(&T, absent[i]), -1, "%s should not exist", absent[i]);
    const par_param *out;
    cr_expect_eq(par_param_get(&T, "nope.weight", &out), PAR_ENOTFOUND);
    cr_expect(strstr(par_last_error(), "nope.weight"));
}

Test(params, order_offsets_and_totals)
{
    cr_expect_str_eq(T.p[0].name, "embed.weight");
    cr_expect_str_eq(T.p[1].name, "layers.0.hc_attn_fn");
    cr_expect_str_eq(T.p[2].name, "layers.0.hc_attn_base");
    cr_expect_str_eq(T.p[4].name, "layers.0.attn_norm.weight");
    cr_expect_str_eq(T.p[5].name, "layers.0.attn.attn_sink");
    int mtp0 = par_param_find(&T, "mtp.0.enorm.weight");
    cr_expect_str_eq(T.p[mtp0 - 1].name, "hc_head_scale");
    cr_expect_str_eq(T.p[T.n - 1].name, "mtp.0.hc_head_scale");
    int64_t f = 0, i32 = 0;
    int last_layer = -1;
    for (int i = 0; i < T.n; i++) {
        const par_param *p = &T.p[i];
        if (p->dtype == PAR_PDT_REAL) {
            cr_expect_eq(p->offset, f, "%s offset", p->name);
            f += p->numel;
        } else {
            cr_expect_eq(p->offset, i32, "%s offset", p->name);
            i32 += p->numel;
        }
        if (p->layer >= 0) {
            cr_expect(p->layer >= last_layer, "%s: layers in order", p->name);
            last_layer = p->layer;
        }
    }
    cr_expect_eq(f, T.n_float);
    cr_expect_eq(i32, T.n_i32);
    cr_expect_eq(T.n_i32, 128 * 2);
    int64_t nt, nf, ni;
    cr_assert_eq(par_param_count(&T.cfg, &nt, &nf, &ni), PAR_OK);
    cr_expect_eq(nt, T.n);
    cr_expect_eq(nf, T.n_float);
    cr_expect_eq(ni, T.n_i32);
    fprintf(stderr, "v4-tiny: %d tensors, %lld floats\n", T.n, (long long)T.n_float);
}

Test(params, optimizer_kinds_and_flags)
{
    struct {
        const char *name;
        par_opt_kind opt;
        int wd, grad, zero;
    } want[] = {
        {"embed.weight", PAR_OPT_ADAMW, 1, 1, 0},
        {"head.weight", PAR_OPT_ADAMW, 1, 1, 0},
        {"norm.weight", PAR_OPT_ADAMW, 0, 1, 0},
        {"hc_head_fn", PAR_OPT_MUON, 1, 1, 0},
        {"hc_head_base", PAR_OPT_ADAMW, 0, 1, 0},
        {"layers.0.hc_attn_fn", PAR_OPT_MUON, 1, 1, 0},
        {"layers.0.hc_attn_scale", PAR_OPT_ADAMW, 0, 1, 0},
        {"layers.0.attn.attn_sink", PAR_OPT_ADAMW, 0, 1, 0},
        {"layers.0.attn.wq_a.weight", PAR_OPT_MUON, 1, 1, 0},
        {"layers.1.attn.compressor.ape", PAR_OPT_ADAMW, 0, 1, 0},
        {"layers.1.attn.compressor.wkv.weight", PAR_OPT_MUON, 1, 1, 0},
        {"layers.1.attn.indexer.wq_b.weight", PAR_OPT_MUON, 1, 1, 1},
        {"layers.1.attn.indexer.compressor.ape", PAR_OPT_ADAMW, 0, 1, 1},
        {"layers.1.attn.indexer.compressor.norm.weight", PAR_OPT_ADAMW, 0, 1, 1},
        {"layers.0.ffn.gate.weight", PAR_OPT_MUON, 1, 1, 0},
        {"layers.1.ffn.gate.bias", PAR_OPT_NONE, 0, 0, 0},
        {"layers.0.ffn.gate.tid2eid", PAR_OPT_NONE, 0, 0, 0},
        {"layers.2.ffn.experts.3.w2.weight", PAR_OPT_MUON, 1, 1, 0},
        {"mtp.0.e_proj.weight", PAR_OPT_MUON, 1, 1, 0},
        {"mtp.0.hnorm.weight", PAR_OPT_ADAMW, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const par_param *p = get(want[i].name);
        cr_expect_eq(p->opt, want[i].opt, "%s opt %s", p->name, par_opt_kind_name(p->opt));
        cr_expect_eq(p->weight_decay, want[i].wd, "%s wd", p->name);
        cr_expect_eq(p->has_grad, want[i].grad, "%s grad", p->name);
        cr_expect_eq(p->zero_grad, want[i].zero, "%s zero_grad", p->name);
    }
    cr_expect_eq(get("layers.0.ffn.gate.tid2eid")->dtype, PAR_PDT_I32);
    /* every 2-D float except embed, head and *.ape is Muon */
    for (int i = 0; i < T.n; i++) {
        const par_param *p = &T.p[i];
        if (p->dtype != PAR_PDT_REAL || !strcmp(p->name + strlen(p->name) - 9, "gate.bias"))
            continue;
        int is_ape = strlen(p->name) > 4 && !strcmp(p->name + strlen(p->name) - 4, ".ape");
        int adam2d = !strcmp(p->name, "embed.weight") || !strcmp(p->name, "head.weight") || is_ape;
        par_opt_kind want_k = (p->ndim == 2 && !adam2d) ? PAR_OPT_MUON : PAR_OPT_ADAMW;
        cr_expect_eq(p->opt, want_k, "%s", p->name);
    }
}

Test(params, layers_experts_and_block_indices)
{
    const par_param *p = get("layers.2.ffn.experts.5.w3.weight");
    cr_expect_eq(p->layer, 2);
    cr_expect_eq(p->expert, 5);
    cr_expect_eq(p->shared, 0);
    p = get("layers.2.ffn.shared_experts.w1.weight");
    cr_expect_eq(p->expert, -1);
    cr_expect_eq(p->shared, 1);
    cr_expect_eq(get("embed.weight")->layer, -1);
    cr_expect_eq(get("mtp.0.attn.wq_a.weight")->layer, 3);
    cr_expect_eq(T.n_blocks, 4);
    char nm[96];
    for (int b = 0; b < T.n_blocks; b++) {
        const par_block_params *bp = &T.blocks[b];
        const char *pre = b < 3 ? "layers." : "mtp.";
        int li = b < 3 ? b : b - 3;
        for (int e = 0; e < 8; e++)
            for (int w = 0; w < 3; w++) {
                snprintf(nm, sizeof nm, "%s%d.ffn.experts.%d.w%d.weight", pre, li, e, w + 1);
                cr_expect_str_eq(T.p[bp->expert0 + 3 * e + w].name, nm);
            }
        snprintf(nm, sizeof nm, "%s%d.attn.wo_b.weight", pre, li);
        cr_expect_str_eq(T.p[bp->wo_b].name, nm);
        cr_expect_eq(bp->cmp_ape >= 0, T.cfg.compress_ratios[b] > 0, "block %d", b);
        cr_expect_eq(bp->idx_wq_b >= 0, T.cfg.compress_ratios[b] == 4, "block %d", b);
        cr_expect_eq(bp->gate_tid2eid >= 0, b < 1, "block %d", b);
        cr_expect_eq(bp->gate_bias >= 0, b >= 1, "block %d", b);
        cr_expect_eq(bp->e_proj >= 0, b == 3, "block %d", b);
    }
    cr_expect_str_eq(T.p[T.top.hc_head_fn].name, "hc_head_fn");
    cr_expect_str_eq(T.p[T.blocks[3].hc_head_fn].name, "mtp.0.hc_head_fn");
}

Test(params, planning_counts)
{
    par_config c;
    int64_t nt, nf, ni;
    par_config_preset(&c, "v4-pro");
    cr_assert_eq(par_param_count(&c, &nt, &nf, &ni), PAR_OK);
    fprintf(stderr, "v4-pro: %lld tensors, %lld float params (%.4g T), %lld int32; routed experts %.4g T\n",
            (long long)nt, (long long)nf, nf / 1e12, (long long)ni, par_param_count_routed_expert_floats(&c) / 1e12);
    cr_expect(nf > 1.5e12 && nf < 1.7e12, "v4-pro should be ~1.6T, got %lld", (long long)nf);
    par_config_preset(&c, "v4-flash");
    cr_assert_eq(par_param_count(&c, &nt, &nf, &ni), PAR_OK);
    fprintf(stderr, "v4-flash: %lld tensors, %lld float params (%.4g B), %lld int32\n", (long long)nt,
            (long long)nf, nf / 1e9, (long long)ni);
    cr_expect(nf > 2.7e11 && nf < 3.0e11, "v4-flash should be ~284B, got %lld", (long long)nf);
    /* the tensor count of the Flash checkpoint: 69187 incl. 'scale' tensors and int tid2eid */
    par_config_preset(&c, "v4-mini");
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &c), PAR_OK);
    cr_assert_eq(par_param_count(&c, &nt, &nf, &ni), PAR_OK);
    cr_expect_eq(nt, t.n);
    cr_expect_eq(nf, t.n_float);
    fprintf(stderr, "v4-mini: %d tensors, %lld floats\n", t.n, (long long)t.n_float);
    for (int i = 0; i < t.n; i += 97)
        cr_expect_eq(par_param_find(&t, t.p[i].name), i);
    int64_t live = par_alloc_live(PAR_TAG_MODEL);
    par_param_table_free(&t);
    cr_expect_lt(par_alloc_live(PAR_TAG_MODEL), live, "freeing a table releases its memory");
}

Test(params, invalid_config_is_refused)
{
    par_config c;
    par_config_preset(&c, "v4-tiny");
    c.n_activated_experts = 9;
    par_param_table t;
    cr_expect_eq(par_param_table_build(&t, &c), PAR_EINVAL);
    cr_expect_eq(par_param_count(&c, NULL, NULL, NULL), PAR_EINVAL);
}
