/* kernels/recipe.h + kernels/qcast.h: the weight classes read from V4's
 * model.py, the cast table, the registry, and the linear kernels' hook: a
 * registered weight's GEMM equals the GEMM of the cast operands computed here
 * by hand (core/quant.h), its backward is the straight-through estimator, an
 * unregistered weight moves no bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/quant.h"
#include "kernels/ops.h"
#include "kernels/qcast.h"
#include "kernels/recipe.h"

Test(recipe, names_parse_and_refuse)
{
    par_recipe r;
    for (int i = 0; i < PAR_RECIPE_COUNT; i++) {
        cr_assert_eq(par_recipe_parse(par_recipe_name((par_recipe)i), &r), PAR_OK);
        cr_expect_eq((int)r, i);
    }
    cr_expect_eq(par_recipe_parse("fp16", &r), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "none, bf16, fp8, v4") != NULL);
}

Test(recipe, weight_classes_follow_model_py)
{
    static const struct {
        const char *name;
        par_wclass c;
    } cases[] = {
        {"layers.0.attn.wq_a.weight", PAR_WCLASS_FP8},
        {"layers.0.attn.wq_b.weight", PAR_WCLASS_FP8},
        {"layers.0.attn.wkv.weight", PAR_WCLASS_FP8},
        {"layers.0.attn.wo_a.weight", PAR_WCLASS_BF16},
        {"layers.0.attn.wo_b.weight", PAR_WCLASS_FP8},
        {"layers.1.attn.indexer.wq_b.weight", PAR_WCLASS_FP8},
        {"layers.1.attn.indexer.weights_proj.weight", PAR_WCLASS_BF16},
        {"layers.1.attn.indexer.compressor.wkv.weight", PAR_WCLASS_F32},
        {"layers.1.attn.compressor.wgate.weight", PAR_WCLASS_F32},
        {"layers.2.ffn.experts.7.w2.weight", PAR_WCLASS_FP4},
        {"layers.2.ffn.shared_experts.w3.weight", PAR_WCLASS_FP8},
        {"layers.2.ffn.gate.weight", PAR_WCLASS_F32},
        {"head.weight", PAR_WCLASS_F32},
        {"mtp.0.e_proj.weight", PAR_WCLASS_FP8},
        {"mtp.0.ffn.experts.0.w1.weight", PAR_WCLASS_FP4},
        {"embed.weight", PAR_WCLASS_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(par_recipe_wclass_of(cases[i].name), cases[i].c, "%s", cases[i].name);
}

Test(recipe, cast_table)
{
    const par_recipe_cast *c = par_recipe_cast_of(PAR_RECIPE_V4, PAR_WCLASS_FP4);
    cr_expect_eq(c->act, PAR_CAST_QUANT);
    cr_expect_eq(c->act_spec.tile_cols, 128);
    cr_expect_eq(c->act_spec.scale, PAR_QSCALE_UE8M0);
    cr_expect_eq(c->wt_spec.fmt, PAR_QFMT_E2M1);
    cr_expect_eq(c->wt_spec.tile_cols, 32);
    c = par_recipe_cast_of(PAR_RECIPE_FP8, PAR_WCLASS_FP8);
    cr_expect_eq(c->wt_spec.tile_rows, 128);
    cr_expect_eq(c->wt_spec.scale, PAR_QSCALE_F32);
    for (int r = 0; r < PAR_RECIPE_COUNT; r++)
        cr_expect_eq(par_recipe_cast_of((par_recipe)r, PAR_WCLASS_F32)->wt, PAR_CAST_NONE);
    cr_expect_eq(par_recipe_cast_of(PAR_RECIPE_BF16, PAR_WCLASS_FP8)->act, PAR_CAST_BF16);
}

#define T_ 5
#define K_ 160 /* two 1x128 tiles, the second partial */
#define N_ 6

static void fill(double *x, int64_t n, double scale, unsigned seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = scale * ((double)(seed >> 8) / (double)(1u << 24) - 0.5);
    }
}

static void ref_gemm(double *out, const double *x, const double *w)
{
    for (int t = 0; t < T_; t++)
        for (int n = 0; n < N_; n++) {
            double s = 0;
            for (int k = 0; k < K_; k++)
                s += x[t * K_ + k] * w[n * K_ + k];
            out[t * N_ + n] = s;
        }
}

/* The hook against the casts done by hand; then unregistered: today's bits. */
static void check_recipe(par_recipe r, par_wclass cl)
{
    double x[T_ * K_], w[N_ * K_], qx[T_ * K_], qw[N_ * K_], out[T_ * N_], want[T_ * N_], plain[T_ * N_];
    fill(x, T_ * K_, 3.0, 1), fill(w, N_ * K_, 0.2, 2);
    memcpy(qx, x, sizeof x), memcpy(qw, w, sizeof w);
    const par_recipe_cast *c = par_recipe_cast_of(r, cl);
    for (int i = 0; i < T_ * K_; i++)
        qx[i] = par_bf16_round(qx[i]);
    if (c->act == PAR_CAST_QUANT)
        cr_assert_eq(par_quant_sim_f64(&c->act_spec, qx, T_, K_), PAR_OK);
    if (c->wt == PAR_CAST_BF16)
        for (int i = 0; i < N_ * K_; i++)
            qw[i] = par_bf16_round(qw[i]);
    else
        cr_assert_eq(par_quant_sim_f64(&c->wt_spec, qw, N_, K_), PAR_OK);
    par_linear_forward_f64(plain, x, w, T_, K_, N_);
    cr_assert_eq(par_recipe_register(w, w, (int64_t)sizeof w, r, cl, NULL), PAR_OK);
    par_linear_forward_f64(out, x, w, T_, K_, N_);
    double ref[T_ * N_];
    par_linear_forward_f64(want, qx, qw, T_, K_, N_); /* unregistered copies: no cast */
    ref_gemm(ref, qx, qw);
    int moved = 0;
    for (int i = 0; i < T_ * N_; i++) {
        cr_expect_eq(out[i], want[i], "%s/%d: out[%d] %.17g, cast by hand %.17g", par_recipe_name(r), cl, i, out[i],
                     want[i]);
        cr_expect(fabs(out[i] - ref[i]) <= 1e-12 * (1 + fabs(ref[i])));
        moved += out[i] != plain[i];
    }
    cr_expect_gt(moved, 0, "%s: the casts moved nothing", par_recipe_name(r));
    /* backward, straight-through: din = dout qW, dW = dout^T qx */
    double dout[T_ * N_], din[T_ * K_] = {0}, dw[N_ * K_] = {0}, din2[T_ * K_] = {0}, dw2[N_ * K_] = {0};
    fill(dout, T_ * N_, 1.0, 3);
    par_linear_backward_f64(din, dw, dout, x, w, T_, K_, N_);
    par_recipe_unregister(w);
    par_linear_backward_f64(din2, dw2, dout, qx, qw, T_, K_, N_);
    cr_expect_eq(memcmp(din, din2, sizeof din), 0);
    cr_expect_eq(memcmp(dw, dw2, sizeof dw), 0);
    cr_expect_eq(par_recipe_registered(), 0);
    par_linear_forward_f64(out, x, w, T_, K_, N_);
    cr_expect_eq(memcmp(out, plain, sizeof out), 0, "unregistered: not today's bits");
}

Test(recipe, bf16_fp8_v4_linear_hook)
{
    check_recipe(PAR_RECIPE_BF16, PAR_WCLASS_FP8);
    check_recipe(PAR_RECIPE_FP8, PAR_WCLASS_FP8);
    check_recipe(PAR_RECIPE_FP8, PAR_WCLASS_FP4);
    check_recipe(PAR_RECIPE_V4, PAR_WCLASS_FP8);
    check_recipe(PAR_RECIPE_V4, PAR_WCLASS_FP4);
    check_recipe(PAR_RECIPE_V4, PAR_WCLASS_BF16);
}

Test(recipe, f32_class_and_none_register_nothing)
{
    double w[4] = {0};
    cr_expect_eq(par_recipe_register(w, w, sizeof w, PAR_RECIPE_V4, PAR_WCLASS_F32, NULL), PAR_OK);
    cr_expect_eq(par_recipe_register(w, w, sizeof w, PAR_RECIPE_NONE, PAR_WCLASS_FP8, NULL), PAR_OK);
    cr_expect_eq(par_recipe_registered(), 0);
    cr_expect_null(par_recipe_lookup(w, NULL));
}

/* The indexer's rows: bf16, Hadamard (an involution up to rounding), bf16, MXFP4. */
Test(recipe, fp4_rows_rotate_then_quantize)
{
    double x[2 * 16], y[2 * 16];
    fill(x, 32, 4.0, 9);
    cr_assert_eq(par_qcast_fp4_rows_f64(y, x, 2, 16), PAR_OK);
    for (int r = 0; r < 2; r++) { /* every value an E2M1 code times one power of two per row */
        int found = 0;
        for (int e = -30; e <= 30 && !found; e++) {
            int all = 1;
            for (int i = 0; i < 16; i++) {
                double q = y[r * 16 + i] / ldexp(1.0, e);
                all &= fabs(q) <= 6.0 && par_e2m1_to_f64(par_e2m1_from_f64(q)) == q;
            }
            found = all;
        }
        cr_expect(found, "row %d is not E2M1 codes times one scale", r);
    }
    double dot_x = 0, dot_y = 0; /* a rotation keeps the dot product up to FP4's rounding */
    for (int i = 0; i < 16; i++)
        dot_x += x[i] * x[16 + i], dot_y += y[i] * y[16 + i];
    cr_expect(fabs(dot_x - dot_y) < 0.5 * (fabs(dot_x) + 4.0), "%g vs %g", dot_x, dot_y);
    cr_expect_eq(par_qcast_fp4_rows_f64(y, x, 2, 12), PAR_EINVAL);
}
