/* model: clip, Muon, AdamW, balance (MODEL.md 7), checked against
 * independent naive computations. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "model/init.h"
#include "model/optim.h"
#include "model/params.h"

TestSuite(optim, .init = NULL);

/* ---- naive Newton-Schulz in double, [r, c] with r <= c ---- */
static void naive_ns(double *X, int r, int c)
{
    static const double co[10][3] = {
        {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {2, -1.5, 0.5},
        {2, -1.5, 0.5}};
    double A[16][16], AA[16][16], Bm[16][16], Y[16][16];
    for (int s = 0; s < 10; s++) {
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                A[i][j] = 0;
                for (int k = 0; k < c; k++)
                    A[i][j] += X[i * c + k] * X[j * c + k];
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < r; j++) {
                AA[i][j] = 0;
                for (int k = 0; k < r; k++)
                    AA[i][j] += A[i][k] * A[k][j];
                Bm[i][j] = co[s][1] * A[i][j] + co[s][2] * AA[i][j];
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) {
                Y[i][j] = co[s][0] * X[i * c + j];
                for (int k = 0; k < r; k++)
                    Y[i][j] += Bm[i][k] * X[k * c + j];
            }
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++)
                X[i * c + j] = Y[i][j];
    }
}

/* naive orth of a [rows, cols] U */
static void naive_orth(double *out, const double *U, int rows, int cols)
{
    double fro = 0;
    for (int i = 0; i < rows * cols; i++)
        fro += U[i] * U[i];
    fro = sqrt(fro) + 1e-7;
    double X[256];
    int tr = rows > cols, r = tr ? cols : rows, c = tr ? rows : cols;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            if (tr)
                X[j * c + i] = U[i * cols + j] / fro;
            else
                X[i * c + j] = U[i * cols + j] / fro;
        }
    naive_ns(X, r, c);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            out[i * cols + j] = tr ? X[j * c + i] : X[i * c + j];
}

Test(optim, clip_factor)
{
    cr_expect_eq(par_clip_factor(0.5, 1.0), 1.0);
    cr_expect_eq(par_clip_factor(0.0, 1.0), 1.0);
    cr_expect_eq(par_clip_factor(4.0, 1.0), 1.0 / (4.0 + 1e-6));
    cr_expect_eq(par_clip_factor(1.0, 1.0), 1.0 / (1.0 + 1e-6));
    cr_expect_eq(par_clip_factor(3.0, 2.0), 2.0 / (3.0 + 1e-6));
}

Test(optim, adamw_hand_computed_two_steps)
{
    double w[3] = {1.0, -2.0, 0.5}, m[3] = {0}, v[3] = {0};
    const double g1[3] = {0.1, -0.2, 0.0}, g2[3] = {0.3, 0.1, -0.4};
    const double lr = 0.01, wd = 0.1;
    double we[3] = {1.0, -2.0, 0.5}, me[3] = {0}, ve[3] = {0};
    for (int t = 1; t <= 2; t++) {
        const double *g = t == 1 ? g1 : g2;
        par_adamw_update_f64(w, m, v, g, 3, 1.0, lr, wd, t);
        for (int i = 0; i < 3; i++) {
            me[i] = 0.9 * me[i] + 0.1 * g[i];
            ve[i] = 0.95 * ve[i] + 0.05 * g[i] * g[i];
            double mh = me[i] / (1 - pow(0.9, t)), vh = ve[i] / (1 - pow(0.95, t));
            we[i] = we[i] * (1 - lr * wd) - lr * mh / (sqrt(vh) + 1e-8);
        }
        for (int i = 0; i < 3; i++) {
            cr_expect(fabs(w[i] - we[i]) < 1e-15, "t %d w[%d] %.17g vs %.17g", t, i, w[i], we[i]);
            cr_expect(fabs(m[i] - me[i]) < 1e-15 && fabs(v[i] - ve[i]) < 1e-15);
        }
    }
    /* step 1 with sign-like update: |dw| ~ lr for nonzero g */
    cr_expect(fabs((1.0 * (1 - lr * wd) - 0.01) - 0.989) < 1e-12);
}

Test(optim, muon_orthogonalize_matches_naive_2x3_and_3x2)
{
    const double U[6] = {0.3, -1.2, 0.5, 2.0, 0.1, -0.7};
    double got[6], want[6];
    cr_assert_eq(par_muon_orthogonalize_f64(got, U, 2, 3), PAR_OK);
    naive_orth(want, U, 2, 3);
    for (int i = 0; i < 6; i++)
        cr_expect(fabs(got[i] - want[i]) < 1e-12, "2x3 [%d] %.17g vs %.17g", i, got[i], want[i]);
    /* the result is close to orthogonal rows: X X^T ~ I */
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            double d = 0;
            for (int k = 0; k < 3; k++)
                d += got[i * 3 + k] * got[j * 3 + k];
            cr_expect(fabs(d - (i == j)) < 0.1, "XX^T[%d][%d] = %g", i, j, d);
        }
    cr_assert_eq(par_muon_orthogonalize_f64(got, U, 3, 2), PAR_OK);
    naive_orth(want, U, 3, 2);
    for (int i = 0; i < 6; i++)
        cr_expect(fabs(got[i] - want[i]) < 1e-12, "3x2 [%d] %.17g vs %.17g", i, got[i], want[i]);
    /* 3x2 goes through the transpose: equals the transpose of orth(U^T) */
    double Ut[6], ot[6];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            Ut[j * 3 + i] = U[i * 2 + j];
    par_muon_orthogonalize_f64(ot, Ut, 2, 3);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            cr_expect(fabs(got[i * 2 + j] - ot[j * 3 + i]) < 1e-15);
    /* zero in, zero out */
    const double Z[6] = {0};
    par_muon_orthogonalize_f64(got, Z, 2, 3);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(got[i], 0.0);
}

Test(optim, muon_update_hand_computed)
{
    double w[6] = {0.1, 0.2, -0.3, 0.4, -0.5, 0.6}, mom[6] = {0.01, 0, -0.02, 0, 0.03, 0};
    const double g[6] = {0.3, -1.2, 0.5, 2.0, 0.1, -0.7};
    const double lr = 0.02, wd = 0.1, mu = 0.95, gs = 0.5;
    double we[6], me[6], U[6], X[6];
    for (int i = 0; i < 6; i++) {
        double G = gs * g[i];
        me[i] = mu * mom[i] + G;
        U[i] = mu * me[i] + G;
    }
    naive_orth(X, U, 2, 3);
    for (int i = 0; i < 6; i++)
        we[i] = w[i] * (1 - lr * wd) - lr * 0.18 * sqrt(3.0) * X[i];
    cr_assert_eq(par_muon_update_f64(w, mom, g, 2, 3, gs, lr, wd, mu), PAR_OK);
    for (int i = 0; i < 6; i++) {
        cr_expect(fabs(mom[i] - me[i]) < 1e-15, "mom[%d]", i);
        cr_expect(fabs(w[i] - we[i]) < 1e-13, "w[%d] %.17g vs %.17g", i, w[i], we[i]);
    }
}

Test(optim, balance_sign_rule)
{
    /* E=4, K=2, T=6: target K*T/E = 3 */
    double bias[4] = {0.5, 0.5, 0.5, 0.5};
    const int64_t load[4] = {3, 5, 1, 3};
    par_balance_update_f64(bias, load, 4, 2, 6, 0.25);
    cr_expect_eq(bias[0], 0.5, "load == target: sign(0) = 0");
    cr_expect_eq(bias[1], 0.25, "overloaded: bias down");
    cr_expect_eq(bias[2], 0.75, "underloaded: bias up");
    cr_expect_eq(bias[3], 0.5);
    /* non-integer target: E=3, K=1, T=4 -> 4/3 */
    double b3[3] = {0, 0, 0};
    const int64_t l3[3] = {1, 2, 1};
    par_balance_update_f64(b3, l3, 3, 1, 4, 1.0);
    cr_expect(b3[0] == 1.0 && b3[1] == -1.0 && b3[2] == 1.0);
}

/* Whole-table behaviour on v4-tiny. */
static par_param_table T;
static par_config C;

static void tab_setup(void)
{
    par_err_set_quiet(1);
    par_config_preset(&C, "v4-tiny");
    cr_assert_eq(par_param_table_build(&T, &C), PAR_OK);
}
static void tab_teardown(void) { par_param_table_free(&T); }

static double *alloc0(int64_t n) { return par_calloc((size_t)n, sizeof(double), PAR_TAG_OPTIM); }

Test(optim, grad_sumsq_counts_each_gradient_once, .init = tab_setup, .fini = tab_teardown)
{
    double *g = alloc0(T.n_float);
    for (int64_t i = 0; i < T.n_float; i++)
        g[i] = 0.001 * (double)(i % 7);
    /* gate.bias takes no gradient: whatever sits there is not counted */
    const par_param *gb = par_param_lookup(&T, "layers.1.ffn.gate.bias");
    double want = 0;
    for (int i = 0; i < T.n; i++) {
        const par_param *p = &T.p[i];
        if (p->dtype != PAR_PDT_REAL || p == gb || strstr(p->name, "gate.bias"))
            continue;
        for (int64_t k = 0; k < p->numel; k++)
            want += g[p->offset + k] * g[p->offset + k];
    }
    double got = par_grad_sumsq_f64(g, &T);
    cr_expect(fabs(got - want) <= 1e-12 * want, "%.17g vs %.17g", got, want);
    for (int64_t k = 0; k < gb->numel; k++)
        g[gb->offset + k] = 100.0;
    cr_expect(fabs(par_grad_sumsq_f64(g, &T) - want) <= 1e-12 * want);
    par_free(g);
}

Test(optim, each_expert_is_its_own_matrix, .init = tab_setup, .fini = tab_teardown)
{
    double *w = alloc0(T.n_float), *m = alloc0(T.n_float), *v = alloc0(T.n_float), *g = alloc0(T.n_float);
    par_init_params_f64(w, NULL, &T, 7);
    int i0 = par_param_find(&T, "layers.2.ffn.experts.0.w1.weight");
    int i1 = par_param_find(&T, "layers.2.ffn.experts.1.w1.weight");
    const par_param *p0 = &T.p[i0], *p1 = &T.p[i1];
    for (int64_t k = 0; k < p0->numel; k++) {
        g[p0->offset + k] = sin(0.1 * k);
        g[p1->offset + k] = 100.0 * cos(0.37 * k); /* far larger: a joint normalisation would shrink expert 0 */
    }
    double *w0 = alloc0(p0->numel), *m0 = alloc0(p0->numel);
    memcpy(w0, w + p0->offset, (size_t)p0->numel * sizeof *w0);
    cr_assert_eq(par_optim_apply_f64(w, m, v, g, &T, &C, 1, 1.0), PAR_OK);
    cr_assert_eq(par_muon_update_f64(w0, m0, g + p0->offset, p0->shape[0], p0->shape[1], 1.0, C.lr, C.wd, C.mu), PAR_OK);
    cr_expect_eq(memcmp(w0, w + p0->offset, (size_t)p0->numel * sizeof *w0), 0, "expert 0 updated on its own");
    par_free(w0);
    par_free(m0);
    par_free(w);
    par_free(m);
    par_free(v);
    par_free(g);
}

Test(optim, full_step, .init = tab_setup, .fini = tab_teardown)
{
    double *w = alloc0(T.n_float), *w1 = alloc0(T.n_float), *m = alloc0(T.n_float), *v = alloc0(T.n_float),
           *g = alloc0(T.n_float);
    par_init_params_f64(w, NULL, &T, 3);
    memcpy(w1, w, (size_t)T.n_float * sizeof *w);
    for (int i = 0; i < T.n; i++) {
        const par_param *p = &T.p[i];
        if (p->dtype != PAR_PDT_REAL || !p->has_grad || p->zero_grad)
            continue;
        for (int64_t k = 0; k < p->numel; k++)
            g[p->offset + k] = 0.05 * sin(1.0 + 0.01 * (double)(p->offset + k));
    }
    int64_t loads[4 * 8];
    for (int b = 0; b < 4; b++)
        for (int e = 0; e < 8; e++)
            loads[b * 8 + e] = (e == 0) ? 128 : 128; /* target = 2*512/8 = 128 */
    loads[1 * 8 + 3] = 200;
    loads[3 * 8 + 5] = 10;
    double norm = -1;
    cr_assert_eq(par_optim_step_f64(w1, g, m, v, &T, &C, 1, loads, 512, &norm), PAR_OK);
    double want = sqrt(par_grad_sumsq_f64(g, &T));
    cr_expect_eq(norm, want);
    cr_expect_gt(norm, 1.0, "this case clips (norm %g)", norm);

    /* indexer: zero gradient, so Muon/AdamW only decay (Adam: no wd -> unchanged) */
    const par_param *iq = par_param_lookup(&T, "layers.1.attn.indexer.wq_b.weight");
    for (int64_t k = 0; k < iq->numel; k++)
        cr_expect_eq(w1[iq->offset + k], w[iq->offset + k] * (1 - C.lr * C.wd));
    const par_param *ia = par_param_lookup(&T, "layers.1.attn.indexer.compressor.ape");
    for (int64_t k = 0; k < ia->numel; k++)
        cr_expect_eq(w1[ia->offset + k], w[ia->offset + k]);
    /* balance: block 1 expert 3 overloaded, mtp (block 3) expert 5 underloaded, others on target */
    const par_param *b1 = par_param_lookup(&T, "layers.1.ffn.gate.bias");
    const par_param *b3 = par_param_lookup(&T, "mtp.0.ffn.gate.bias");
    cr_expect_eq(w1[b1->offset + 3], -C.bias_update_rate);
    cr_expect_eq(w1[b1->offset + 2], 0.0);
    cr_expect_eq(w1[b3->offset + 5], C.bias_update_rate);
    /* AdamW on a norm weight at t=1 moves each element by ~lr (sign of g) */
    const par_param *nw = par_param_lookup(&T, "norm.weight");
    for (int64_t k = 0; k < nw->numel; k++) {
        double d = w1[nw->offset + k] - w[nw->offset + k];
        double gk = g[nw->offset + k];
        cr_expect(fabs(fabs(d) - C.lr) < 1e-6 && d * gk < 0, "norm.weight[%lld] moved %g", (long long)k, d);
    }
    /* clipping on the fly == scaling first (same bits) */
    double *w2 = alloc0(T.n_float), *m2 = alloc0(T.n_float), *v2 = alloc0(T.n_float);
    memcpy(w2, w, (size_t)T.n_float * sizeof *w);
    par_grad_scale_f64(g, &T, par_clip_factor(norm, C.clip_grad));
    cr_assert_eq(par_optim_apply_f64(w2, m2, v2, g, &T, &C, 1, 1.0), PAR_OK);
    par_balance_apply_f64(w2, loads, &T, &C, 512);
    cr_expect_eq(memcmp(w1, w2, (size_t)T.n_float * sizeof *w), 0);
    cr_expect_eq(memcmp(m, m2, (size_t)T.n_float * sizeof *w), 0);
    cr_expect_eq(memcmp(v, v2, (size_t)T.n_float * sizeof *w), 0);
    cr_expect_eq(par_optim_apply_f64(w2, m2, v2, g, &T, &C, 0, 1.0), PAR_EINVAL, "AdamW step is 1-based");
    par_free(w2);
    par_free(m2);
    par_free(v2);
    par_free(w);
    par_free(w1);
    par_free(m);
    par_free(v);
    par_free(g);
}
