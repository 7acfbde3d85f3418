/* kernels/mhc: Sinkhorn, hc_pre, hc_post, hc_head (f64).  Forwards against a
 * naive transcription of MODEL.md section 2; every backward against central
 * finite differences (tests/common/fd.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"
#include "core/status.h"
#include "fd.h"
#include "kernels/mhc.h"

#define HC_EPS 1e-6
#define NORM_EPS 1e-6
#define FD_H 1e-6
#define FD_TOL 1e-6
#define FD_LOG(what, e) fprintf(stderr, "fd %-24s worst err %.2e\n", what, e)

static double *rnd(const char *name, size_t count, double sd)
{
    double *p = par_malloc(count * sizeof(double), PAR_TAG_MISC);
    par_philox_key k = par_rng_key(1234, name);
    for (size_t i = 0; i < count; i++)
        p[i] = sd * par_rng_normal(k, i, 0);
    return p;
}

static double *zeros(size_t count)
{
    return par_calloc(count, sizeof(double), PAR_TAG_MISC);
}

static double dot(const double *a, const double *b, size_t count)
{
    double s = 0;
    for (size_t i = 0; i < count; i++)
        s += a[i] * b[i];
    return s;
}

static double sig(double z)
{
    return 1.0 / (1.0 + exp(-z));
}

/* ---------------- Sinkhorn ---------------- */

static void naive_sinkhorn(double *C, const double *L, int n, int iters, double eps)
{
    for (int j = 0; j < n; j++) {
        double mx = -INFINITY, s = 0;
        for (int k = 0; k < n; k++)
            mx = fmax(mx, L[j * n + k]);
        for (int k = 0; k < n; k++)
            s += exp(L[j * n + k] - mx);
        for (int k = 0; k < n; k++)
            C[j * n + k] = exp(L[j * n + k] - mx) / s + eps;
    }
    for (int r = 0; r < iters; r++) {
        if (r > 0) {
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int k = 0; k < n; k++)
                    s += C[j * n + k];
                for (int k = 0; k < n; k++)
                    C[j * n + k] /= s + eps;
            }
        }
        for (int k = 0; k < n; k++) {
            double s = 0;
            for (int j = 0; j < n; j++)
                s += C[j * n + k];
            for (int j = 0; j < n; j++)
                C[j * n + k] /= s + eps;
        }
    }
}

/* Each step divides by (sum + hc_eps), so a sum reaches at best
 * s / (s + hc_eps) ~ 1 - hc_eps: with hc_eps = 1e-6 the sums sit ~1.0e-6
 * below 1 by construction.  So: within 1e-6 of 1 - hc_eps (i.e. within
 * 2e-6 of 1) with hc_eps = 1e-6, and within 1e-6 of 1 with hc_eps = 0. */
Test(mhc, sinkhorn_doubly_stochastic)
{
    const int n = 4, iters = 20;
    double *L = rnd("sk.L", 16, 2.0);
    const double epss[2] = {HC_EPS, 0.0};
    for (int q = 0; q < 2; q++) {
        double C[16], sk[2 * 20 * 16], worst = 0;
        par_sinkhorn_forward_f64(C, sk, L, n, iters, epss[q]);
        for (int a = 0; a < n; a++) {
            double rs = 0, cs = 0;
            for (int b = 0; b < n; b++) {
                rs += C[a * n + b];
                cs += C[b * n + a];
                cr_expect(C[a * n + b] > 0);
            }
            worst = fmax(worst, fmax(fabs(rs - (1 - epss[q])), fabs(cs - (1 - epss[q]))));
            cr_expect(fabs(rs - (1 - epss[q])) < 1e-6, "eps %g row %d sum %.12g", epss[q], a, rs);
            cr_expect(fabs(cs - (1 - epss[q])) < 1e-6, "eps %g col %d sum %.12g", epss[q], a, cs);
            cr_expect(fabs(rs - 1) < 1e-6 + 1.01 * epss[q], "eps %g row %d sum %.12g", epss[q],
                      a, rs);
            cr_expect(fabs(cs - 1) < 1e-6 + 1.01 * epss[q], "eps %g col %d sum %.12g", epss[q],
                      a, cs);
        }
        fprintf(stderr, "sinkhorn iters 20 hc_eps %g: worst |sum - (1 - eps)| %.3g\n", epss[q],
                worst);
    }
    par_free(L);
}

Test(mhc, sinkhorn_matches_naive)
{
    const int n = 4;
    double *L = rnd("sk.L2", 16, 1.5);
    int its[3] = {1, 2, 20};
    for (int q = 0; q < 3; q++) {
        double C[16], ref[16], sk[2 * 20 * 16];
        par_sinkhorn_forward_f64(C, sk, L, n, its[q], HC_EPS);
        naive_sinkhorn(ref, L, n, its[q], HC_EPS);
        for (int e = 0; e < 16; e++)
            cr_expect(fabs(C[e] - ref[e]) < 1e-14, "iters %d C[%d] %.17g vs %.17g", its[q], e,
                      C[e], ref[e]);
    }
    par_free(L);
}

typedef struct {
    double *L, *G;
    int n, iters;
} sk_ctx;

static double sk_obj(void *vctx)
{
    sk_ctx *c = vctx;
    double C[256], sk[2 * 20 * 256];
    par_sinkhorn_forward_f64(C, sk, c->L, c->n, c->iters, HC_EPS);
    return dot(C, c->G, (size_t)c->n * c->n);
}

Test(mhc, sinkhorn_backward_fd)
{
    const int n = 4;
    int its[3] = {1, 2, 20};
    for (int q = 0; q < 3; q++) {
        sk_ctx c = {rnd("sk.L3", 16, 1.0), rnd("sk.G", 16, 1.0), n, its[q]};
        double C[16], sk[2 * 20 * 16], dL[16] = {0};
        par_sinkhorn_forward_f64(C, sk, c.L, n, c.iters, HC_EPS);
        par_sinkhorn_backward_f64(dL, c.G, sk, n, c.iters, HC_EPS);
        double err = fd_check("sinkhorn.L", c.L, 16, dL, sk_obj, &c, FD_H, 0);
        FD_LOG("sinkhorn.L", err);
        cr_expect(err < FD_TOL, "iters %d: fd error %g", c.iters, err);
        /* the gradient is not trivially zero */
        cr_expect(dot(dL, dL, 16) > 1e-12, "iters %d: zero gradient", c.iters);
        par_free(c.L);
        par_free(c.G);
    }
}

/* ---------------- hc_pre ---------------- */

typedef struct {
    int64_t T, n, d, iters, P;
    double *X, *fn, *base, *scale; /* inputs */
    double *Gx, *Gp, *GC;          /* objective weights */
    void *buf;
    par_hc_saved_f64 s;
    double *x;
} pre_ctx;

static void pre_setup(pre_ctx *c, int64_t T, int64_t n, int64_t d, int64_t iters)
{
    c->T = T, c->n = n, c->d = d, c->iters = iters, c->P = (2 + n) * n;
    size_t nd = (size_t)(n * d), P = (size_t)c->P;
    c->X = rnd("pre.X", T * nd, 1.0);
    c->fn = rnd("pre.fn", P * nd, 0.3);
    c->base = rnd("pre.base", P, 0.5);
    c->scale = rnd("pre.scale", 3, 0.7);
    c->Gx = rnd("pre.Gx", T * d, 1.0);
    c->Gp = rnd("pre.Gp", T * n, 1.0);
    c->GC = rnd("pre.GC", T * n * n, 1.0);
    c->buf = par_malloc(par_hc_saved_bytes_f64(T, n, iters), PAR_TAG_ACT);
    par_hc_saved_init_f64(&c->s, c->buf, T, n, iters);
    c->x = zeros(T * d);
}

static void pre_teardown(pre_ctx *c)
{
    double *ps[] = {c->X, c->fn, c->base, c->scale, c->Gx, c->Gp, c->GC, c->x};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        par_free(ps[i]);
    par_free(c->buf);
}

static double pre_obj(void *vctx)
{
    pre_ctx *c = vctx;
    par_status st = par_hc_pre_forward_f64(c->x, &c->s, c->X, c->fn, c->base, c->scale, c->T,
                                           c->n, c->d, c->iters, HC_EPS, NORM_EPS);
    cr_assert_eq(st, PAR_OK);
    return dot(c->x, c->Gx, c->T * c->d) + dot(c->s.post, c->Gp, c->T * c->n) +
           dot(c->s.C, c->GC, c->T * c->n * c->n);
}

Test(mhc, pre_forward_matches_naive)
{
    pre_ctx c;
    pre_setup(&c, 3, 4, 5, 20);
    pre_obj(&c);
    const int64_t n = c.n, d = c.d, nd = n * d;
    for (int64_t t = 0; t < c.T; t++) {
        const double *v = c.X + t * nd;
        double ms = 0;
        for (int64_t e = 0; e < nd; e++)
            ms += v[e] * v[e];
        ms /= (double)nd;
        double mix[24];
        for (int64_t p = 0; p < c.P; p++) {
            double a = 0;
            for (int64_t e = 0; e < nd; e++)
                a += c.fn[p * nd + e] * v[e];
            mix[p] = a / sqrt(ms + NORM_EPS);
        }
        double pre[4], L[16], C[16];
        for (int i = 0; i < n; i++) {
            pre[i] = sig(mix[i] * c.scale[0] + c.base[i]) + HC_EPS;
            double post = 2 * sig(mix[n + i] * c.scale[1] + c.base[n + i]);
            cr_expect(fabs(post - c.s.post[t * n + i]) < 1e-14, "post[%ld][%d]", (long)t, i);
        }
        for (int e = 0; e < 16; e++)
            L[e] = mix[2 * n + e] * c.scale[2] + c.base[2 * n + e];
        naive_sinkhorn(C, L, 4, 20, HC_EPS);
        for (int e = 0; e < 16; e++)
            cr_expect(fabs(C[e] - c.s.C[t * 16 + e]) < 1e-13, "C[%ld][%d]", (long)t, e);
        for (int64_t ch = 0; ch < d; ch++) {
            double x = 0;
            for (int i = 0; i < n; i++)
                x += pre[i] * v[i * d + ch];
            cr_expect(fabs(x - c.x[t * d + ch]) < 1e-13, "x[%ld][%ld] %.17g vs %.17g", (long)t,
                      (long)ch, c.x[t * d + ch], x);
        }
    }
    pre_teardown(&c);
}

static void pre_fd_case(int64_t iters)
{
    pre_ctx c;
    pre_setup(&c, 3, 4, 3, iters);
    const int64_t T = c.T, n = c.n, d = c.d, nd = n * d, P = c.P;
    pre_obj(&c);
    double *dX = zeros(T * nd), *dfn = zeros(P * nd), *dbase = zeros(P), *dscale = zeros(3);
    par_status st = par_hc_pre_backward_f64(dX, dfn, dbase, dscale, c.Gx, c.Gp, c.GC, &c.s, c.X,
                                            c.fn, c.base, c.scale, T, n, d, iters, HC_EPS,
                                            NORM_EPS);
    cr_assert_eq(st, PAR_OK);
    double e;
    e = fd_check("pre.X", c.X, T * nd, dX, pre_obj, &c, FD_H, 0);
    FD_LOG("pre.X", e);
    cr_expect(e < FD_TOL, "iters %ld dX fd error %g", (long)iters, e);
    e = fd_check("pre.fn", c.fn, P * nd, dfn, pre_obj, &c, FD_H, 0);
    FD_LOG("pre.fn", e);
    cr_expect(e < FD_TOL, "iters %ld dfn fd error %g", (long)iters, e);
    e = fd_check("pre.base", c.base, P, dbase, pre_obj, &c, FD_H, 0);
    FD_LOG("pre.base", e);
    cr_expect(e < FD_TOL, "iters %ld dbase fd error %g", (long)iters, e);
    e = fd_check("pre.scale", c.scale, 3, dscale, pre_obj, &c, FD_H, 0);
    FD_LOG("pre.scale", e);
    cr_expect(e < FD_TOL, "iters %ld dscale fd error %g", (long)iters, e);
    /* every group of mixes receives gradient */
    for (int g = 0; g < 3; g++)
        cr_expect(fabs(dscale[g]) > 1e-8, "dscale[%d] = %g", g, dscale[g]);
    par_free(dX);
    par_free(dfn);
    par_free(dbase);
    par_free(dscale);
    pre_teardown(&c);
}

Test(mhc, pre_backward_fd_iters20) { pre_fd_case(20); }
Test(mhc, pre_backward_fd_iters1) { pre_fd_case(1); }
Test(mhc, pre_backward_fd_iters2) { pre_fd_case(2); }

/* Each output's gradient separately (the others NULL), so a NULL path that
 * dropped or doubled a term would show; also checks accumulation (+=). */
Test(mhc, pre_backward_null_and_accumulate)
{
    pre_ctx c;
    pre_setup(&c, 3, 4, 4, 2);
    const int64_t T = c.T, n = c.n, d = c.d, nd = n * d, P = c.P;
    pre_obj(&c);
    double *full = zeros(T * nd), *parts = zeros(T * nd), *dfn = zeros(P * nd);
    double *dfn2 = zeros(P * nd);
    cr_assert_eq(par_hc_pre_backward_f64(full, dfn, NULL, NULL, c.Gx, c.Gp, c.GC, &c.s, c.X, c.fn,
                                         c.base, c.scale, T, n, d, 2, HC_EPS, NORM_EPS),
                 PAR_OK);
    cr_assert_eq(par_hc_pre_backward_f64(parts, NULL, NULL, NULL, c.Gx, NULL, NULL, &c.s, c.X,
                                         c.fn, c.base, c.scale, T, n, d, 2, HC_EPS, NORM_EPS),
                 PAR_OK);
    cr_assert_eq(par_hc_pre_backward_f64(parts, NULL, NULL, NULL, NULL, c.Gp, NULL, &c.s, c.X,
                                         c.fn, c.base, c.scale, T, n, d, 2, HC_EPS, NORM_EPS),
                 PAR_OK);
    cr_assert_eq(par_hc_pre_backward_f64(parts, NULL, NULL, NULL, NULL, NULL, c.GC, &c.s, c.X,
                                         c.fn, c.base, c.scale, T, n, d, 2, HC_EPS, NORM_EPS),
                 PAR_OK);
    for (int64_t e = 0; e < T * nd; e++)
        cr_expect(fabs(full[e] - parts[e]) < 1e-12, "dX[%ld] %g vs %g", (long)e, full[e],
                  parts[e]);
    /* accumulate: a second call doubles dfn */
    cr_assert_eq(par_hc_pre_backward_f64(NULL, dfn2, NULL, NULL, c.Gx, c.Gp, c.GC, &c.s, c.X,
                                         c.fn, c.base, c.scale, T, n, d, 2, HC_EPS, NORM_EPS),
                 PAR_OK);
    cr_assert_eq(par_hc_pre_backward_f64(NULL, dfn2, NULL, NULL, c.Gx, c.Gp, c.GC, &c.s, c.X,
                                         c.fn, c.base, c.scale, T, n, d, 2, HC_EPS, NORM_EPS),
                 PAR_OK);
    for (int64_t e = 0; e < P * nd; e++)
        cr_expect(fabs(dfn2[e] - 2 * dfn[e]) < 1e-12, "dfn[%ld]", (long)e);
    par_free(full);
    par_free(parts);
    par_free(dfn);
    par_free(dfn2);
    pre_teardown(&c);
}

/* A token's results do not depend on the other tokens of the call. */
Test(mhc, pre_tokens_independent)
{
    pre_ctx c;
    pre_setup(&c, 3, 4, 5, 20);
    pre_obj(&c);
    const int64_t n = c.n, d = c.d, nd = n * d;
    pre_ctx one;
    void *buf = par_malloc(par_hc_saved_bytes_f64(1, n, 20), PAR_TAG_ACT);
    par_hc_saved_init_f64(&one.s, buf, 1, n, 20);
    double x1[5];
    for (int64_t t = 0; t < c.T; t++) {
        cr_assert_eq(par_hc_pre_forward_f64(x1, &one.s, c.X + t * nd, c.fn, c.base, c.scale, 1,
                                            n, d, 20, HC_EPS, NORM_EPS),
                     PAR_OK);
        cr_expect(memcmp(x1, c.x + t * d, sizeof x1) == 0, "token %ld x differs", (long)t);
        cr_expect(memcmp(one.s.C, c.s.C + t * n * n, 16 * sizeof(double)) == 0);
        cr_expect(memcmp(one.s.post, c.s.post + t * n, 4 * sizeof(double)) == 0);
    }
    par_free(buf);
    pre_teardown(&c);
}

/* Large enough for the OpenMP loops to engage: 1 and 3 threads agree
 * bitwise on every output and gradient. */
static void pre_run_all(pre_ctx *c, double *out, int threads)
{
    omp_set_num_threads(threads);
    const int64_t T = c->T, n = c->n, d = c->d, nd = n * d, P = c->P;
    size_t off = 0;
    cr_assert_eq(par_hc_pre_forward_f64(c->x, &c->s, c->X, c->fn, c->base, c->scale, T, n, d,
                                        c->iters, HC_EPS, NORM_EPS),
                 PAR_OK);
    memcpy(out + off, c->x, T * d * sizeof(double)), off += T * d;
    memcpy(out + off, c->s.C, T * n * n * sizeof(double)), off += T * n * n;
    double *g = out + off;
    memset(g, 0, (T * nd + P * nd + P + 3) * sizeof(double));
    cr_assert_eq(par_hc_pre_backward_f64(g, g + T * nd, g + T * nd + P * nd,
                                         g + T * nd + P * nd + P, c->Gx, c->Gp, c->GC, &c->s,
                                         c->X, c->fn, c->base, c->scale, T, n, d, c->iters,
                                         HC_EPS, NORM_EPS),
                 PAR_OK);
    g += T * nd + P * nd + P + 3;
    memset(g, 0, (T * d + T * nd) * sizeof(double));
    double *Xo = zeros(T * nd);
    par_hc_post_forward_f64(Xo, c->x, c->X, c->s.post, c->s.C, T, n, d);
    par_hc_post_backward_f64(g, g + T * d, NULL, NULL, Xo, c->x, c->X, c->s.post, c->s.C, T, n,
                             d);
    memcpy(g + T * d + T * nd, Xo, T * nd * sizeof(double));
    par_free(Xo);
    omp_set_num_threads(1);
}

Test(mhc, threads_bitwise_equal)
{
    pre_ctx c;
    pre_setup(&c, 64, 4, 64, 20);
    const int64_t T = c.T, n = c.n, d = c.d, nd = n * d, P = c.P;
    size_t total = T * d + T * n * n + T * nd + P * nd + P + 3 + T * d + 2 * T * nd;
    double *a = zeros(total), *b = zeros(total);
    pre_run_all(&c, a, 1);
    pre_run_all(&c, b, 3);
    size_t diff = 0;
    for (size_t i = 0; i < total; i++)
        diff += memcmp(&a[i], &b[i], sizeof(double)) != 0;
    cr_expect_eq(diff, 0, "%zu of %zu values differ between 1 and 3 threads", diff, total);
    par_free(a);
    par_free(b);
    pre_teardown(&c);
}

Test(mhc, pre_rejects_bad_dims)
{
    par_err_set_quiet(1);
    pre_ctx c;
    pre_setup(&c, 2, 4, 3, 2);
    cr_expect_eq(par_hc_pre_forward_f64(c.x, &c.s, c.X, c.fn, c.base, c.scale, 2, 4, 3, 3,
                                        HC_EPS, NORM_EPS),
                 PAR_EINVAL, "saved iters mismatch accepted");
    cr_expect_eq(par_hc_pre_forward_f64(c.x, &c.s, c.X, c.fn, c.base, c.scale, 3, 4, 3, 2,
                                        HC_EPS, NORM_EPS),
                 PAR_EINVAL, "saved T mismatch accepted");
    cr_expect_eq(par_hc_pre_forward_f64(c.x, &c.s, c.X, c.fn, c.base, c.scale, 2, 4, 3, 0,
                                        HC_EPS, NORM_EPS),
                 PAR_EINVAL, "iters 0 accepted");
    cr_expect_eq(par_hc_pre_forward_f64(c.x, &c.s, c.X, c.fn, c.base, c.scale, 2, 17, 3, 2,
                                        HC_EPS, NORM_EPS),
                 PAR_EINVAL, "n 17 accepted");
    cr_expect_eq(par_hc_pre_backward_f64(NULL, NULL, NULL, NULL, c.Gx, NULL, NULL, &c.s, c.X,
                                         c.fn, c.base, c.scale, 2, 4, 3, 1, HC_EPS, NORM_EPS),
                 PAR_EINVAL, "backward saved mismatch accepted");
    cr_expect(strstr(par_last_error(), "iters") != NULL, "message: %s", par_last_error());
    par_err_set_quiet(0);
    pre_teardown(&c);
}

/* ---------------- hc_post ---------------- */

typedef struct {
    int64_t T, n, d;
    double *f, *X, *post, *C, *G, *out;
} post_ctx;

static double post_obj(void *vctx)
{
    post_ctx *c = vctx;
    par_hc_post_forward_f64(c->out, c->f, c->X, c->post, c->C, c->T, c->n, c->d);
    return dot(c->out, c->G, c->T * c->n * c->d);
}

Test(mhc, post_forward_and_backward_fd)
{
    const int64_t T = 3, n = 4, d = 5, nd = n * d;
    post_ctx c = {T, n, d, rnd("post.f", T * d, 1), rnd("post.X", T * nd, 1),
                  rnd("post.p", T * n, 1), rnd("post.C", T * n * n, 1),
                  rnd("post.G", T * nd, 1), zeros(T * nd)};
    post_obj(&c);
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < n; k++)
            for (int64_t ch = 0; ch < d; ch++) {
                double want = c.post[t * n + k] * c.f[t * d + ch];
                for (int64_t j = 0; j < n; j++)
                    want += c.C[t * 16 + j * n + k] * c.X[t * nd + j * d + ch];
                cr_expect(fabs(want - c.out[t * nd + k * d + ch]) < 1e-13);
            }
    double *df = zeros(T * d), *dX = zeros(T * nd), *dp = zeros(T * n), *dC = zeros(T * n * n);
    par_hc_post_backward_f64(df, dX, dp, dC, c.G, c.f, c.X, c.post, c.C, T, n, d);
    double e;
    e = fd_check("post.f", c.f, T * d, df, post_obj, &c, FD_H, 0);
    FD_LOG("post.f", e);
    cr_expect(e < FD_TOL, "df fd error %g", e);
    e = fd_check("post.X", c.X, T * nd, dX, post_obj, &c, FD_H, 0);
    FD_LOG("post.X", e);
    cr_expect(e < FD_TOL, "dX fd error %g", e);
    e = fd_check("post.post", c.post, T * n, dp, post_obj, &c, FD_H, 0);
    FD_LOG("post.post", e);
    cr_expect(e < FD_TOL, "dpost fd error %g", e);
    e = fd_check("post.C", c.C, T * n * n, dC, post_obj, &c, FD_H, 0);
    FD_LOG("post.C", e);
    cr_expect(e < FD_TOL, "dC fd error %g", e);
    double *ps[] = {c.f, c.X, c.post, c.C, c.G, c.out, df, dX, dp, dC};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        par_free(ps[i]);
}

/* ---------------- hc_head ---------------- */

typedef struct {
    int64_t T, n, d;
    double *X, *fn, *base, *scale, *G, *x;
    par_hc_head_saved_f64 s;
} head_ctx;

static double head_obj(void *vctx)
{
    head_ctx *c = vctx;
    cr_assert_eq(par_hc_head_forward_f64(c->x, &c->s, c->X, c->fn, c->base, c->scale, c->T, c->n,
                                         c->d, HC_EPS, NORM_EPS),
                 PAR_OK);
    return dot(c->x, c->G, c->T * c->d);
}

Test(mhc, head_forward_and_backward_fd)
{
    const int64_t T = 3, n = 4, d = 4, nd = n * d;
    head_ctx c = {T, n, d, rnd("head.X", T * nd, 1), rnd("head.fn", n * nd, 0.3),
                  rnd("head.base", n, 0.5), rnd("head.scale", 1, 0.7), rnd("head.G", T * d, 1),
                  zeros(T * d), {0}};
    void *buf = par_malloc(par_hc_head_saved_bytes_f64(T, n), PAR_TAG_ACT);
    par_hc_head_saved_init_f64(&c.s, buf, T, n);
    head_obj(&c);
    for (int64_t t = 0; t < T; t++) {
        const double *v = c.X + t * nd;
        double ms = dot(v, v, nd) / (double)nd, pre[4];
        for (int i = 0; i < n; i++)
            pre[i] = sig(dot(c.fn + i * nd, v, nd) / sqrt(ms + NORM_EPS) * c.scale[0] +
                         c.base[i]) + HC_EPS;
        for (int64_t ch = 0; ch < d; ch++) {
            double want = 0;
            for (int i = 0; i < n; i++)
                want += pre[i] * v[i * d + ch];
            cr_expect(fabs(want - c.x[t * d + ch]) < 1e-13);
        }
    }
    double *dX = zeros(T * nd), *dfn = zeros(n * nd), *db = zeros(n), *ds = zeros(1);
    cr_assert_eq(par_hc_head_backward_f64(dX, dfn, db, ds, c.G, &c.s, c.X, c.fn, c.base, c.scale,
                                          T, n, d, HC_EPS, NORM_EPS),
                 PAR_OK);
    double e;
    e = fd_check("head.X", c.X, T * nd, dX, head_obj, &c, FD_H, 0);
    FD_LOG("head.X", e);
    cr_expect(e < FD_TOL, "dX fd error %g", e);
    e = fd_check("head.fn", c.fn, n * nd, dfn, head_obj, &c, FD_H, 0);
    FD_LOG("head.fn", e);
    cr_expect(e < FD_TOL, "dfn fd error %g", e);
    e = fd_check("head.base", c.base, n, db, head_obj, &c, FD_H, 0);
    FD_LOG("head.base", e);
    cr_expect(e < FD_TOL, "dbase fd error %g", e);
    e = fd_check("head.scale", c.scale, 1, ds, head_obj, &c, FD_H, 0);
    FD_LOG("head.scale", e);
    cr_expect(e < FD_TOL, "dscale fd error %g", e);
    cr_expect(fabs(ds[0]) > 1e-8);
    double *ps[] = {c.X, c.fn, c.base, c.scale, c.G, c.x, dX, dfn, db, ds};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        par_free(ps[i]);
    par_free(buf);
}

/* Nothing leaks (runs last alphabetically within the suite is not
 * guaranteed, so each test frees its own; this one checks a round trip). */
Test(mhc, saved_bytes_cover_pieces)
{
    const int64_t T = 5, n = 4, iters = 3, P = 24;
    /* no Sinkhorn iterates: the backward recomputes them */
    size_t need = (size_t)(3 * T * P + T + 2 * T * n + T * n * n) * sizeof(double);
    size_t have = par_hc_saved_bytes_f64(T, n, iters);
    cr_expect(have >= need && have < need + 8 * 64, "bytes %zu need %zu", have, need);
    char *buf = par_malloc(have, PAR_TAG_ACT);
    par_hc_saved_f64 s;
    par_hc_saved_init_f64(&s, buf, T, n, iters);
    cr_expect((char *)(s.work + T * P) <= buf + have, "work runs past the buffer");
    cr_expect((uintptr_t)s.C % 64 == 0 && (uintptr_t)s.work % 64 == 0);
    par_free(buf);
    cr_expect(par_hc_head_saved_bytes_f64(T, n) >= (size_t)(4 * T * n + T) * sizeof(double));
}
