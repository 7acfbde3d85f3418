/* Kernels: basic ops (gemm, linear, rmsnorm, embedding, swiglu, xent, scalars), f64. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "fd.h"
#include "kernels/ops.h"

#define FD_H 1e-6
#define FD_TOL 1e-7

static void fill_normal(double *x, int64_t n, const char *name, double scale)
{
    par_philox_key key = par_rng_key(1234, name);
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * par_rng_normal(key, (uint64_t)i, 0);
}

static double *dalloc(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    cr_assert(p);
    return p;
}

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ------------------------------------------------------------------ gemm */

/* Naive op(A) op(B) in row-major with leading dimensions. */
static double ref_gemm_elem(int ta, int tb, int64_t i, int64_t j, int64_t K, const double *A,
                            int64_t lda, const double *B, int64_t ldb)
{
    double s = 0;
    for (int64_t k = 0; k < K; k++) {
        double a = ta ? A[k * lda + i] : A[i * lda + k];
        double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
    }
    return s;
}

/* A row's bits must not depend on how many rows it is batched with nor where
 * it sits: every row of a sub-batch of M rows starting at row `off` (and the
 * row alone) must equal, bitwise, the same row of one 48-row GEMM. */
Test(ops, gemm_row_alone_equals_row_in_batch)
{
    const int64_t MB = 48;
    const int64_t Ks[] = {3, 17, 300, 1100};
    const int64_t Ns[] = {1, 2, 7, 130};
    const int64_t Ms[] = {1, 2, 3, 5, 7, 15, 16, 17, 31, 33};
    const double betas[] = {0.0, 0.75};
    int checked = 0;
    for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++)
        for (size_t in = 0; in < sizeof Ns / sizeof *Ns; in++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int ib = 0; ib < 2; ib++) {
                        int64_t K = Ks[ik], N = Ns[in], ldc = N + 3;
                        double beta = betas[ib], alpha = 1.25;
                        int64_t lda = ta ? MB : K + 1, ldb = tb ? K : N;
                        double *A = dalloc(ta ? K * lda : MB * lda), *B = dalloc(ta ? K * N : K * N);
                        double *C0 = dalloc(MB * ldc), *Cb = dalloc(MB * ldc), *Cm = dalloc(MB * ldc);
                        fill_normal(A, ta ? K * lda : MB * lda, "gemm.A", 1);
                        fill_normal(B, K * N, "gemm.B", 1);
                        fill_normal(C0, MB * ldc, "gemm.C", 1);
                        memcpy(Cb, C0, (size_t)(MB * ldc) * sizeof(double));
                        par_gemm_f64(ta, tb, MB, N, K, alpha, A, lda, B, ldb, beta, Cb, ldc);
                        for (int64_t r = 0; r < MB; r++)
                            for (int64_t j = 0; j < N; j++) {
                                double want = alpha * ref_gemm_elem(ta, tb, r, j, K, A, lda, B, ldb) +
                                              beta * C0[r * ldc + j];
                                cr_assert(fabs(Cb[r * ldc + j] - want) <=
                                              1e-13 * (1 + fabs(want)) * sqrt((double)K),
                                          "gemm value K=%lld N=%lld ta=%d tb=%d: %g vs %g",
                                          (long long)K, (long long)N, ta, tb, Cb[r * ldc + j], want);
                            }
                        for (size_t im = 0; im < sizeof Ms / sizeof *Ms; im++) {
                            int64_t M = Ms[im], off = (int64_t)(im * 3) % (MB - M + 1);
                            memcpy(Cm, C0, (size_t)(MB * ldc) * sizeof(double));
                            const double *Ao = ta ? A + off : A + off * lda;
                            par_gemm_f64(ta, tb, M, N, K, alpha, Ao, lda, B, ldb, beta, Cm + off * ldc, ldc);
                            for (int64_t r = off; r < off + M; r++) {
                                cr_assert(memcmp(Cm + r * ldc, Cb + r * ldc, (size_t)N * sizeof(double)) == 0,
                                          "row %lld of a %lld-row batch at %lld differs from the same "
                                          "row of the 48-row GEMM (K=%lld N=%lld ta=%d tb=%d beta=%g)",
                                          (long long)(r - off), (long long)M, (long long)off,
                                          (long long)K, (long long)N, ta, tb, beta);
                                checked++;
                            }
                            /* rows outside the sub-batch and the ldc gap untouched */
                            for (int64_t r = 0; r < MB; r++)
                                for (int64_t j = (r >= off && r < off + M) ? N : 0; j < ldc; j++)
                                    cr_assert(Cm[r * ldc + j] == C0[r * ldc + j]);
                        }
                        free(A);
                        free(B);
                        free(C0);
                        free(Cb);
                        free(Cm);
                    }
    cr_assert_eq(checked, 4 * 4 * 2 * 2 * 2 * (1 + 2 + 3 + 5 + 7 + 15 + 16 + 17 + 31 + 33));
}

/* A column's bits must not depend on how many columns it is batched with
 * (a TP shard of a layer's outputs against the whole layer): every column of
 * a sub-GEMM of N columns from column `off` equals, bitwise, the same column
 * of one 48-column GEMM.  (OpenBLAS's SkylakeX-family cores take another
 * kernel for small M N K: this failed there before par_gemm tiled columns.) */
Test(ops, gemm_col_alone_equals_col_in_batch)
{
    const int64_t NB = 48, Ms[] = {1, 5, 16, 130}, Ks[] = {3, 64, 300};
    const int64_t Ns[] = {1, 2, 3, 7, 15, 16, 17, 33};
    int checked = 0;
    for (size_t im = 0; im < sizeof Ms / sizeof *Ms; im++)
        for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    int64_t M = Ms[im], K = Ks[ik], ldc = NB + 1;
                    int64_t lda = ta ? M : K, ldb = tb ? K + 2 : NB;
                    double *A = dalloc(M * K), *B = dalloc(tb ? NB * ldb : K * ldb);
                    double *Cb = dalloc(M * ldc), *Cn = dalloc(M * ldc);
                    fill_normal(A, M * K, "gemm.A", 2);
                    fill_normal(B, tb ? NB * ldb : K * ldb, "gemm.B", 2);
                    par_gemm_f64(ta, tb, M, NB, K, 1.0, A, lda, B, ldb, 0.0, Cb, ldc);
                    for (size_t in = 0; in < sizeof Ns / sizeof *Ns; in++) {
                        int64_t N = Ns[in], off = (int64_t)(in * 5) % (NB - N + 1);
                        const double *Bo = tb ? B + off * ldb : B + off;
                        par_gemm_f64(ta, tb, M, N, K, 1.0, A, lda, Bo, ldb, 0.0, Cn, ldc);
                        for (int64_t i = 0; i < M; i++)
                            for (int64_t j = 0; j < N; j++, checked++)
                                cr_assert(!memcmp(&Cn[i * ldc + j], &Cb[i * ldc + off + j], sizeof(double)),
                                          "column %lld of a %lld-column GEMM at %lld differs from the same "
                                          "column of the 48-column one (M=%lld K=%lld ta=%d tb=%d)",
                                          (long long)j, (long long)N, (long long)off, (long long)M,
                                          (long long)K, ta, tb);
                    }
                    free(A);
                    free(B);
                    free(Cb);
                    free(Cn);
                }
    cr_assert_eq(checked, (1 + 5 + 16 + 130) * 3 * 4 * (1 + 2 + 3 + 7 + 15 + 16 + 17 + 33));
}

Test(ops, gemm_beta_zero_ignores_nan_in_c)
{
    double A[2 * 3], B[3 * 4], C[2 * 4];
    fill_normal(A, 6, "g0.A", 1);
    fill_normal(B, 12, "g0.B", 1);
    for (int i = 0; i < 8; i++)
        C[i] = NAN;
    par_gemm_f64(0, 0, 1, 4, 3, 1, A, 3, B, 4, 0, C, 4);
    par_gemm_f64(0, 0, 2, 4, 3, 1, A, 3, B, 4, 0, C, 4);
    for (int i = 0; i < 8; i++)
        cr_assert(isfinite(C[i]), "C[%d] = %g", i, C[i]);
    /* K == 0: C = beta C */
    double Z[2] = {3, 4};
    par_gemm_f64(0, 0, 1, 2, 0, 1, A, 1, B, 2, 0.5, Z, 2);
    cr_assert(Z[0] == 1.5 && Z[1] == 2.0);
}

/* ---------------------------------------------------------------- linear */

typedef struct {
    int64_t T, K, N;
    double *in, *w, *G, *out;
} lin_ctx;

static double lin_obj(void *p)
{
    lin_ctx *c = p;
    par_linear_forward_f64(c->out, c->in, c->w, c->T, c->K, c->N);
    return dot(c->out, c->G, c->T * c->N);
}

Test(ops, linear_forward_and_fd)
{
    lin_ctx c = {.T = 6, .K = 5, .N = 7};
    c.in = dalloc(c.T * c.K);
    c.w = dalloc(c.N * c.K);
    c.G = dalloc(c.T * c.N);
    c.out = dalloc(c.T * c.N);
    fill_normal(c.in, c.T * c.K, "lin.in", 1);
    fill_normal(c.w, c.N * c.K, "lin.w", 1);
    fill_normal(c.G, c.T * c.N, "lin.G", 1);
    par_linear_forward_f64(c.out, c.in, c.w, c.T, c.K, c.N);
    for (int64_t t = 0; t < c.T; t++)
        for (int64_t n = 0; n < c.N; n++)
            cr_assert(fabs(c.out[t * c.N + n] - dot(c.in + t * c.K, c.w + n * c.K, c.K)) < 1e-13);

    double *din = dalloc(c.T * c.K), *dw = dalloc(c.N * c.K);
    par_linear_backward_f64(din, dw, c.G, c.in, c.w, c.T, c.K, c.N);
    cr_assert(fd_check("linear.din", c.in, (size_t)(c.T * c.K), din, lin_obj, &c, FD_H, 0) < FD_TOL);
    cr_assert(fd_check("linear.dw", c.w, (size_t)(c.N * c.K), dw, lin_obj, &c, FD_H, 0) < FD_TOL);

    /* accumulation: a second call adds the same amount; NULL outputs are skipped */
    double *din2 = dalloc(c.T * c.K), *dw2 = dalloc(c.N * c.K);
    memcpy(din2, din, (size_t)(c.T * c.K) * sizeof(double));
    memcpy(dw2, dw, (size_t)(c.N * c.K) * sizeof(double));
    par_linear_backward_f64(din2, NULL, c.G, c.in, c.w, c.T, c.K, c.N);
    par_linear_backward_f64(NULL, dw2, c.G, c.in, c.w, c.T, c.K, c.N);
    for (int64_t i = 0; i < c.T * c.K; i++)
        cr_assert(fabs(din2[i] - 2 * din[i]) < 1e-13);
    for (int64_t i = 0; i < c.N * c.K; i++)
        cr_assert(fabs(dw2[i] - 2 * dw[i]) < 1e-13);
    free(c.in), free(c.w), free(c.G), free(c.out), free(din), free(dw), free(din2), free(dw2);
}

/* --------------------------------------------------------------- rmsnorm */

typedef struct {
    int64_t T, D;
    double eps;
    double *in, *w, *G, *out, *rstd;
} rms_ctx;

static double rms_obj(void *p)
{
    rms_ctx *c = p;
    par_rmsnorm_forward_f64(c->out, c->rstd, c->in, c->w, c->T, c->D, c->eps);
    return dot(c->out, c->G, c->T * c->D);
}

static void rms_case(int with_weight)
{
    rms_ctx c = {.T = 5, .D = 9, .eps = 1e-6};
    c.in = dalloc(c.T * c.D);
    c.w = with_weight ? dalloc(c.D) : NULL;
    c.G = dalloc(c.T * c.D);
    c.out = dalloc(c.T * c.D);
    c.rstd = dalloc(c.T);
    fill_normal(c.in, c.T * c.D, "rms.in", 1);
    if (c.w)
        fill_normal(c.w, c.D, "rms.w", 1);
    fill_normal(c.G, c.T * c.D, "rms.G", 1);
    rms_obj(&c);
    for (int64_t t = 0; t < c.T; t++) {
        double ms = dot(c.in + t * c.D, c.in + t * c.D, c.D) / (double)c.D;
        double r = 1 / sqrt(ms + c.eps);
        cr_assert(fabs(c.rstd[t] - r) < 1e-14 * r);
        for (int64_t j = 0; j < c.D; j++) {
            double want = (c.w ? c.w[j] : 1.0) * c.in[t * c.D + j] * r;
            cr_assert(fabs(c.out[t * c.D + j] - want) < 1e-13);
        }
    }
    /* in place gives the same bits */
    double *copy = dalloc(c.T * c.D), *rs2 = dalloc(c.T);
    memcpy(copy, c.in, (size_t)(c.T * c.D) * sizeof(double));
    par_rmsnorm_forward_f64(copy, rs2, copy, c.w, c.T, c.D, c.eps);
    cr_assert(memcmp(copy, c.out, (size_t)(c.T * c.D) * sizeof(double)) == 0);

    double *din = dalloc(c.T * c.D), *dw = c.w ? dalloc(c.D) : NULL;
    par_rmsnorm_backward_f64(din, dw, c.G, c.in, c.w, c.rstd, c.T, c.D);
    cr_assert(fd_check("rms.din", c.in, (size_t)(c.T * c.D), din, rms_obj, &c, FD_H, 0) < FD_TOL);
    if (c.w)
        cr_assert(fd_check("rms.dw", c.w, (size_t)c.D, dw, rms_obj, &c, FD_H, 0) < FD_TOL);
    free(c.in), free(c.w), free(c.G), free(c.out), free(c.rstd), free(copy), free(rs2), free(din),
        free(dw);
}

Test(ops, rmsnorm_weighted_fd) { rms_case(1); }
Test(ops, rmsnorm_unweighted_fd) { rms_case(0); }

Test(ops, rmsnorm_dw_accumulates_over_many_columns)
{
    /* D larger than the internal column chunk: dw must still be complete. */
    const int64_t T = 3, D = 600;
    double *in = dalloc(T * D), *w = dalloc(D), *out = dalloc(T * D), *rstd = dalloc(T);
    double *G = dalloc(T * D), *dw = dalloc(D);
    fill_normal(in, T * D, "rmsb.in", 1);
    fill_normal(w, D, "rmsb.w", 1);
    fill_normal(G, T * D, "rmsb.G", 1);
    par_rmsnorm_forward_f64(out, rstd, in, w, T, D, 1e-6);
    for (int64_t j = 0; j < D; j++)
        dw[j] = 1.0;
    par_rmsnorm_backward_f64(NULL, dw, G, in, w, rstd, T, D);
    for (int64_t j = 0; j < D; j++) {
        double want = 1.0;
        for (int64_t t = 0; t < T; t++)
            want += G[t * D + j] * in[t * D + j] * rstd[t];
        cr_assert(fabs(dw[j] - want) < 1e-13, "dw[%lld] %g vs %g", (long long)j, dw[j], want);
    }
    free(in), free(w), free(out), free(rstd), free(G), free(dw);
}

/* ------------------------------------------------------------- embedding */

typedef struct {
    int64_t T, D;
    const int32_t *ids;
    double *table, *G, *out;
} emb_ctx;

static double emb_obj(void *p)
{
    emb_ctx *c = p;
    par_embedding_forward_f64(c->out, c->ids, c->table, c->T, c->D);
    return dot(c->out, c->G, c->T * c->D);
}

Test(ops, embedding_forward_and_fd)
{
    const int32_t ids[6] = {3, 0, 3, 5, 1, 3}; /* repeats and an unused row (2, 4) */
    const int64_t V = 6;
    emb_ctx c = {.T = 6, .D = 4, .ids = ids};
    c.table = dalloc(V * c.D);
    c.G = dalloc(c.T * c.D);
    c.out = dalloc(c.T * c.D);
    fill_normal(c.table, V * c.D, "emb.table", 1);
    fill_normal(c.G, c.T * c.D, "emb.G", 1);
    emb_obj(&c);
    for (int64_t t = 0; t < c.T; t++)
        cr_assert(memcmp(c.out + t * c.D, c.table + ids[t] * c.D, (size_t)c.D * sizeof(double)) == 0);
    double *dt = dalloc(V * c.D);
    par_embedding_backward_f64(dt, c.G, ids, c.T, c.D);
    cr_assert(fd_check("emb.dtable", c.table, (size_t)(V * c.D), dt, emb_obj, &c, FD_H, 0) < FD_TOL);
    for (int64_t j = 0; j < c.D; j++) {
        cr_assert(dt[2 * c.D + j] == 0 && dt[4 * c.D + j] == 0);
        /* ascending t: ((G0 + G2) + G5) exactly */
        cr_assert(dt[3 * c.D + j] == (c.G[0 * c.D + j] + c.G[2 * c.D + j]) + c.G[5 * c.D + j]);
    }
    free(c.table), free(c.G), free(c.out), free(dt);
}

/* ---------------------------------------------------------------- swiglu */

typedef struct {
    int64_t T, I;
    double L;
    double *g, *u, *rw, *G, *h;
} sw_ctx;

static double sw_obj(void *p)
{
    sw_ctx *c = p;
    par_swiglu_forward_f64(c->h, c->g, c->u, c->rw, c->T, c->I, c->L);
    return dot(c->h, c->G, c->T * c->I);
}

/* Moves values at least `gap` away from the kinks at +-L. */
static void away_from_kinks(double *x, int64_t n, double L, double gap)
{
    for (int64_t i = 0; i < n; i++) {
        if (fabs(x[i] - L) < gap)
            x[i] = x[i] < L ? L - gap : L + gap;
        if (fabs(x[i] + L) < gap)
            x[i] = x[i] < -L ? -L - gap : -L + gap;
    }
}

static void sw_fd_case(double L, int with_rw)
{
    sw_ctx c = {.T = 6, .I = 7, .L = L};
    int64_t n = c.T * c.I;
    c.g = dalloc(n), c.u = dalloc(n), c.G = dalloc(n), c.h = dalloc(n);
    c.rw = with_rw ? dalloc(c.T) : NULL;
    fill_normal(c.g, n, "sw.g", 2);
    fill_normal(c.u, n, "sw.u", 2);
    fill_normal(c.G, n, "sw.G", 1);
    if (c.rw)
        fill_normal(c.rw, c.T, "sw.rw", 1);
    int clamped = 0;
    if (L > 0) {
        away_from_kinks(c.g, n, L, 0.05);
        away_from_kinks(c.u, n, L, 0.05);
        for (int64_t i = 0; i < n; i++)
            clamped += (c.g[i] > L) + (fabs(c.u[i]) > L);
        cr_assert(clamped > 0, "the case must exercise the clamps");
    }
    sw_obj(&c);
    for (int64_t t = 0; t < c.T; t++)
        for (int64_t i = 0; i < c.I; i++) {
            double gv = c.g[t * c.I + i], uv = c.u[t * c.I + i];
            if (L > 0) {
                gv = fmin(gv, L);
                uv = fmax(-L, fmin(uv, L));
            }
            double want = (c.rw ? c.rw[t] : 1.0) * gv / (1 + exp(-gv)) * uv;
            cr_assert(fabs(c.h[t * c.I + i] - want) < 1e-13 * (1 + fabs(want)));
        }
    double *dg = dalloc(n), *du = dalloc(n), *drw = dalloc(c.T);
    par_swiglu_backward_f64(dg, du, with_rw ? drw : NULL, c.G, c.g, c.u, c.rw, c.T, c.I, c.L);
    cr_assert(fd_check("swiglu.dg", c.g, (size_t)n, dg, sw_obj, &c, FD_H, 0) < FD_TOL);
    cr_assert(fd_check("swiglu.du", c.u, (size_t)n, du, sw_obj, &c, FD_H, 0) < FD_TOL);
    if (with_rw)
        cr_assert(fd_check("swiglu.drw", c.rw, (size_t)c.T, drw, sw_obj, &c, FD_H, 0) < FD_TOL);
    free(c.g), free(c.u), free(c.G), free(c.h), free(c.rw), free(dg), free(du), free(drw);
}

Test(ops, swiglu_fd_clamped_with_routing_weight) { sw_fd_case(1.5, 1); }
Test(ops, swiglu_fd_clamped_no_routing_weight) { sw_fd_case(1.5, 0); }
Test(ops, swiglu_fd_unclamped) { sw_fd_case(0, 1); }

Test(ops, swiglu_clamped_entries_get_zero_gradient)
{
    const double L = 10;
    /* one row: g above L, g at L (inside), u above L, u below -L, u at -L (inside), plain */
    double g[6] = {12.0, 10.0, 1.0, 1.0, 1.0, 0.5};
    double u[6] = {1.0, 1.0, 11.0, -30.0, -10.0, -0.7};
    double rw[1] = {0.8}, dh[6] = {1, 1, 1, 1, 1, 1}, h[6];
    double dg[6] = {0}, du[6] = {0}, drw[1] = {0};
    par_swiglu_forward_f64(h, g, u, rw, 1, 6, L);
    par_swiglu_backward_f64(dg, du, drw, dh, g, u, rw, 1, 6, L);
    cr_assert(dg[0] == 0, "g > L passes no gradient to g: %g", dg[0]);
    cr_assert(du[0] != 0, "u inside still gets gradient when g is clamped");
    cr_assert(dg[1] != 0, "g == L is inside");
    cr_assert(du[2] == 0 && du[3] == 0, "clamped u: %g %g", du[2], du[3]);
    cr_assert(dg[2] != 0 && dg[3] != 0, "g still gets gradient through the clamped u");
    cr_assert(du[4] != 0, "u == -L is inside");
    cr_assert(dg[5] != 0 && du[5] != 0);
    /* the forward uses the clamped values */
    cr_assert(fabs(h[0] - 0.8 * L / (1 + exp(-L)) * 1.0) < 1e-12);
    cr_assert(fabs(h[3] - 0.8 * 1.0 / (1 + exp(-1.0)) * -L) < 1e-12);
    double racc = 0;
    for (int i = 0; i < 6; i++)
        racc += h[i] / 0.8;
    cr_assert(fabs(drw[0] - racc) < 1e-12);
}

/* ------------------------------------------------------------------ xent */

typedef struct {
    int64_t T, V;
    const int32_t *target;
    double *logits, *ce, *lse;
} xe_ctx;

static double xe_obj(void *p)
{
    xe_ctx *c = p;
    par_xent_forward_f64(c->ce, c->lse, c->logits, c->target, c->T, c->V);
    double s = 0;
    for (int64_t t = 0; t < c->T; t++)
        s += c->ce[t];
    return 0.7 * s;
}

Test(ops, xent_forward_and_fd)
{
    const int32_t target[5] = {2, -1, 0, 6, 3};
    xe_ctx c = {.T = 5, .V = 7, .target = target};
    c.logits = dalloc(c.T * c.V);
    c.ce = dalloc(c.T);
    c.lse = dalloc(c.T);
    fill_normal(c.logits, c.T * c.V, "xe.logits", 2);
    xe_obj(&c);
    for (int64_t t = 0; t < c.T; t++) {
        double s = 0;
        for (int64_t v = 0; v < c.V; v++)
            s += exp(c.logits[t * c.V + v]);
        double want = target[t] < 0 ? 0 : log(s) - c.logits[t * c.V + target[t]];
        cr_assert(fabs(c.ce[t] - want) < 1e-13, "ce[%lld] %g vs %g", (long long)t, c.ce[t], want);
    }
    double *dl = dalloc(c.T * c.V);
    par_xent_backward_f64(dl, c.logits, c.lse, target, 0.7, c.T, c.V);
    for (int64_t v = 0; v < c.V; v++)
        cr_assert(dl[1 * c.V + v] == 0, "unlabelled row gets no gradient");
    cr_assert(fd_check("xent.dlogits", c.logits, (size_t)(c.T * c.V), dl, xe_obj, &c, FD_H, 0) <
              FD_TOL);
    free(c.logits), free(c.ce), free(c.lse), free(dl);
}

Test(ops, xent_stable_for_large_logits)
{
    double logits[2 * 3] = {1000, 999, -1000, -1e4, -1e4 + 1, -1e4 - 2};
    int32_t target[2] = {1, 0};
    double ce[2], lse[2], dl[6] = {0};
    par_xent_forward_f64(ce, lse, logits, target, 2, 3);
    double want0 = log1p(exp(-1.0) + exp(-2000.0)) + 1.0;
    cr_assert(fabs(ce[0] - want0) < 1e-12, "ce0 %g vs %g", ce[0], want0);
    double want1 = 1.0 + log(exp(-1.0) + 1 + exp(-3.0));
    cr_assert(fabs(ce[1] - want1) < 1e-12, "ce1 %g vs %g", ce[1], want1);
    par_xent_backward_f64(dl, logits, lse, target, 1.0, 2, 3);
    for (int i = 0; i < 6; i++)
        cr_assert(isfinite(dl[i]));
    /* lse ~ 1000 carries an absolute rounding of ~1e-13 into every probability */
    cr_assert(fabs(dl[0] + dl[1] + dl[2]) < 1e-12, "softmax - onehot sums to 0: %g", dl[0] + dl[1] + dl[2]);
}

/* ---------------------------------------------------------------- scalars */

Test(ops, scalar_helpers_stable)
{
    cr_assert(par_sigmoid(1000) == 1.0);
    cr_assert(par_sigmoid(-1000) == 0.0);
    cr_assert(fabs(par_sigmoid(-700) / exp(-700) - 1) < 1e-12, "tiny sigmoid keeps relative accuracy");
    cr_assert(fabs(par_sigmoid(0.3) - 1 / (1 + exp(-0.3))) < 1e-16);
    cr_assert(par_softplus(1000) == 1000.0);
    cr_assert(fabs(par_softplus(-40) / exp(-40) - 1) < 1e-12);
    cr_assert(par_softplus(-1000) >= 0 && par_softplus(-1000) < 1e-300);
    cr_assert(fabs(par_softplus(0) - log(2.0)) < 1e-16);
    cr_assert(fabs(par_softplus(2.5) - log1p(exp(2.5))) < 1e-15);
    cr_assert(par_silu(1000) == 1000.0);
    cr_assert(par_silu(-1000) == 0.0);
    cr_assert(isfinite(par_silu(-800)));
    cr_assert(fabs(par_silu(1.5) - 1.5 / (1 + exp(-1.5))) < 1e-15);
}
