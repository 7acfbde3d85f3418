/* kernels/mhc.c - mHC residual-stream kernels (see kernels/mhc.h). */
#include "kernels/mhc.h"

#include "kernels/gsum.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/pmath.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

PAR_DECLARE_TARGET /* called inside the host-or-device loop of hc_pre_backward */
static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
PAR_END_DECLARE_TARGET

#define MAXNN (PAR_HC_MAX_N * PAR_HC_MAX_N)
/* Loops with fewer multiply-adds than this run on one thread (the result is
 * the same either way: every output element has one owner). */
#define PAR_HC_OMP_MIN_WORK 65536
#define OMP_IF(work) if ((work) >= PAR_HC_OMP_MIN_WORK)

/* ---- saved-state carving ---- */

static size_t piece(int64_t count)
{
    size_t b = (size_t)count * sizeof(par_real);
    return (b + 63) & ~(size_t)63;
}

static par_real *carve(char **cur, int64_t count)
{
    par_real *p = (par_real *)(void *)*cur;
    *cur += piece(count);
    return p;
}

size_t PAR_FN(par_hc_saved_bytes)(int64_t T, int64_t n, int64_t iters)
{
    (void)iters; /* the Sinkhorn iterates are recomputed by the backward */
    int64_t P = (2 + n) * n;
    return 3 * piece(T * P) + piece(T) + 2 * piece(T * n) + piece(T * n * n);
}

void PAR_FN(par_hc_saved_init)(PAR_FN(par_hc_saved) *s, void *buf, int64_t T, int64_t n,
                               int64_t iters)
{
    int64_t P = (2 + n) * n;
    char *cur = buf;
    s->T = T;
    s->n = n;
    s->iters = iters;
    s->proj = carve(&cur, T * P);
    s->rsq = carve(&cur, T);
    s->mixes = carve(&cur, T * P);
    s->pre = carve(&cur, T * n);
    s->post = carve(&cur, T * n);
    s->C = carve(&cur, T * n * n);
    s->work = carve(&cur, T * P);
}

size_t PAR_FN(par_hc_head_saved_bytes)(int64_t T, int64_t n)
{
    return 4 * piece(T * n) + piece(T);
}

void PAR_FN(par_hc_head_saved_init)(PAR_FN(par_hc_head_saved) *s, void *buf, int64_t T,
                                    int64_t n)
{
    char *cur = buf;
    s->T = T;
    s->n = n;
    s->proj = carve(&cur, T * n);
    s->rsq = carve(&cur, T);
    s->mixes = carve(&cur, T * n);
    s->pre = carve(&cur, T * n);
    s->work = carve(&cur, T * n);
}

/* ---- scalar helpers ---- */

PAR_DECLARE_TARGET /* through combine_backward_token: device-callable */
static par_real sigm(par_real z)
{
    return (par_real)(1.0 / (1.0 + par_pmath_exp(-(double)z)));
}
PAR_END_DECLARE_TARGET

static par_status check_dims(const char *who, int64_t T, int64_t n, int64_t d, int64_t iters)
{
    if (n < 1 || n > PAR_HC_MAX_N)
        return par_err(PAR_EINVAL, "%s: hc_mult n = %lld must be in [1, %d]", who, (long long)n,
                       PAR_HC_MAX_N);
    if (iters < 1)
        return par_err(PAR_EINVAL, "%s: hc_sinkhorn_iters = %lld must be >= 1", who,
                       (long long)iters);
    if (T < 0 || d < 1)
        return par_err(PAR_EINVAL, "%s: need T >= 0 and d >= 1, got T = %lld, d = %lld", who,
                       (long long)T, (long long)d);
    return PAR_OK;
}

/* ---- Sinkhorn ---- */

PAR_DECLARE_TARGET /* Sinkhorn and the per-token pieces run inside device loops */

/* out = in / (sum over the normalised axis + eps); col: divide each column k
 * by sum_j in[j][k]; row: each row j by sum_k in[j][k]. */
static void normalise(par_real *out, const par_real *in, int64_t n, int col, par_real eps)
{
    for (int64_t a = 0; a < n; a++) {
        par_real s = 0;
        for (int64_t b = 0; b < n; b++)
            s += col ? in[b * n + a] : in[a * n + b];
        par_real den = s + eps;
        for (int64_t b = 0; b < n; b++) {
            int64_t idx = col ? b * n + a : a * n + b;
            out[idx] = in[idx] / den;
        }
    }
}

/* gin = d/d in of <g, normalise(in)> (overwrites gin). */
static void normalise_backward(par_real *gin, const par_real *g, const par_real *in, int64_t n,
                               int col, par_real eps)
{
    for (int64_t a = 0; a < n; a++) {
        par_real s = 0, dot = 0;
        for (int64_t b = 0; b < n; b++) {
            int64_t idx = col ? b * n + a : a * n + b;
            s += in[idx];
            dot += g[idx] * in[idx];
        }
        par_real den = s + eps;
        par_real corr = dot / (den * den);
        for (int64_t b = 0; b < n; b++) {
            int64_t idx = col ? b * n + a : a * n + b;
            gin[idx] = g[idx] / den - corr;
        }
    }
}

/* S = the row softmax of L [n, n]. */
static void row_softmax(par_real *S, const par_real *L, int64_t n)
{
    for (int64_t j = 0; j < n; j++) {
        const par_real *l = L + j * n;
        par_real mx = l[0];
        for (int64_t k = 1; k < n; k++)
            mx = l[k] > mx ? l[k] : mx;
        par_real sum = 0;
        for (int64_t k = 0; k < n; k++) {
            S[j * n + k] = (par_real)par_pmath_exp((double)(l[k] - mx));
            sum += S[j * n + k];
        }
        for (int64_t k = 0; k < n; k++)
            S[j * n + k] /= sum;
    }
}

void PAR_FN(par_sinkhorn_forward)(par_real *C,       /* [n, n] out */
                                  par_real *sk,      /* [2*iters, n, n] saved */
                                  const par_real *L, /* [n, n] logits */
                                  int64_t n, int64_t iters, double hc_eps)
{
    const int64_t nn = n * n;
    const par_real eps = (par_real)hc_eps;
    par_real *S = sk;
    row_softmax(S, L, n);
    par_real *A = sk + nn;
    for (int64_t e = 0; e < nn; e++)
        A[e] = S[e] + eps;
    const int64_t steps = 2 * iters - 1;
    for (int64_t s = 0; s < steps; s++) {
        const par_real *in = sk + (s + 1) * nn;
        par_real *out = s == steps - 1 ? C : sk + (s + 2) * nn;
        normalise(out, in, n, (s % 2) == 0, eps);
    }
}

/* par_sinkhorn_forward's C without keeping the iterates (the same
 * operations in the same order, two [n, n] buffers in turn). */
static void sinkhorn_token(par_real *C, const par_real *L, int64_t n, int64_t iters, double hc_eps)
{
    const int64_t nn = n * n, steps = 2 * iters - 1;
    const par_real eps = (par_real)hc_eps;
    par_real a[MAXNN], b[MAXNN];
    row_softmax(a, L, n);
    for (int64_t e = 0; e < nn; e++)
        b[e] = a[e] + eps;
    par_real *in = b, *out = a;
    for (int64_t s = 0; s < steps; s++) {
        par_real *o = s == steps - 1 ? C : out;
        normalise(o, in, n, (s % 2) == 0, eps);
        out = in;
        in = o;
    }
}

void PAR_FN(par_sinkhorn_backward)(par_real *dL,       /* [n, n] += */
                                   const par_real *dC, /* [n, n] */
                                   const par_real *sk, /* [2*iters, n, n] */
                                   int64_t n, int64_t iters, double hc_eps)
{
    const int64_t nn = n * n;
    const par_real eps = (par_real)hc_eps;
    par_real ga[MAXNN], gb[MAXNN];
    par_real *g = ga, *gnext = gb;
    memcpy(g, dC, (size_t)nn * sizeof(par_real));
    for (int64_t s = 2 * iters - 2; s >= 0; s--) {
        normalise_backward(gnext, g, sk + (s + 1) * nn, n, (s % 2) == 0, eps);
        par_real *tmp = g;
        g = gnext;
        gnext = tmp;
    }
    /* g = gradient of S + eps = gradient of the row softmax S */
    const par_real *S = sk;
    for (int64_t j = 0; j < n; j++) {
        par_real dot = 0;
        for (int64_t k = 0; k < n; k++)
            dot += g[j * n + k] * S[j * n + k];
        for (int64_t k = 0; k < n; k++)
            dL[j * n + k] += S[j * n + k] * (g[j * n + k] - dot);
    }
}

/* ---- shared pieces of hc_pre and hc_head ---- */

/* One token's Sinkhorn logits L [n, n] from its mixes m [P]: the forward's
 * and the backward's recomputation's one expression (same bits). */
static void sinkhorn_logits(par_real *L, const par_real *m, const par_real *base, const par_real *scale, int64_t n)
{
    for (int64_t e = 0; e < n * n; e++)
        L[e] = m[2 * n + e] * scale[2] + base[2 * n + e];
}

/* One token: proj = fn v, rsq, mixes = proj * rsq. */
static void project_token(par_real *proj, par_real *rsq, par_real *mixes, const par_real *v,
                          const par_real *fn, int64_t P, int64_t nd, double norm_eps)
{
    par_real ss = 0;
    for (int64_t c = 0; c < nd; c++)
        ss += v[c] * v[c];
    par_real r = (par_real)(1.0 / sqrt((double)(ss / (par_real)nd) + norm_eps));
    *rsq = r;
    for (int64_t p = 0; p < P; p++) {
        const par_real *w = fn + p * nd;
        par_real acc = 0;
        for (int64_t c = 0; c < nd; c++)
            acc += w[c] * v[c];
        proj[p] = acc;
        mixes[p] = acc * r;
    }
}

/* x = sum_i pre_i X_i for one token. */
static void combine_token(par_real *x, const par_real *pre, const par_real *Xt, int64_t n,
                          int64_t d)
{
    for (int64_t c = 0; c < d; c++) {
        par_real acc = 0;
        for (int64_t i = 0; i < n; i++)
            acc += pre[i] * Xt[i * d + c];
        x[c] = acc;
    }
}

/* Which scale a mix uses: 0 pre, 1 post, 2 C (head: always 0). */
static int64_t group_of(int64_t p, int64_t n)
{
    return p < n ? 0 : p < 2 * n ? 1 : 2;
}

PAR_END_DECLARE_TARGET

/* dbase and dscale on the host, tokens in order; in the bitwise mode each
 * token's term deposited instead (kernels/gsum.h). */
static void base_scale_backward(par_real *dbase, par_real *dscale, const par_real *work, const par_real *mixes,
                                int64_t T, int64_t n, int64_t P)
{
    const par_racc_view vb = par_gsum_of(dbase, P), vs = par_gsum_of(dscale, P == n ? 1 : 3);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t p = 0; p < P; p++) {
            par_real dz = work[t * P + p];
            if (vb.acc)
                par_gsum_put(vb, p, (double)dz);
            else if (dbase)
                dbase[p] += dz;
            if (vs.acc)
                par_gsum_put(vs, group_of(p, n), (double)(dz * mixes[t * P + p]));
            else if (dscale)
                dscale[group_of(p, n)] += dz * mixes[t * P + p];
        }
    }
}

/* From work[t][p] = dLoss/dz_p (z = mixes * scale[g] + base): reduce dbase and
 * dscale over tokens in order, then back through mixes = proj * rsq and
 * proj = fn v into dX and dfn.  Overwrites work with dLoss/dproj.  Every
 * pointer may be a device address (the callers translated them). */
static void project_backward(par_real *dX, par_real *dfn, par_real *dbase, par_real *dscale,
                             par_real *work, const par_real *proj, const par_real *rsq,
                             const par_real *mixes, const par_real *X, const par_real *fn,
                             const par_real *scale, int64_t T, int64_t n, int64_t nd, int64_t P)
{
    PAR_DEV_BEGIN();
    if ((dbase || dscale) && PAR_ON_DEVICE()) {
        /* one device thread per sum, each over t (and p) in the host's order */
        const int64_t ng = P == n ? 1 : 3;
        PAR_KLOOP(is_device_ptr(dbase, dscale, work, mixes))
        for (int64_t q = 0; q < P + ng; q++) {
            if (q < P) {
                if (dbase)
                    for (int64_t t = 0; t < T; t++)
                        dbase[q] += work[t * P + q];
            } else if (dscale) {
                for (int64_t t = 0; t < T; t++)
                    for (int64_t p = 0; p < P; p++)
                        if (group_of(p, n) == q - P)
                            dscale[q - P] += work[t * P + p] * mixes[t * P + p];
            }
        }
    } else if (dbase || dscale) {
        base_scale_backward(dbase, dscale, work, mixes, T, n, P);
    }
    if (!dX && !dfn)
        return;
    PAR_KLOOP_PAR(T * P * nd >= PAR_HC_OMP_MIN_WORK,
                  is_device_ptr(dX, work, proj, rsq, X, fn, scale))
    for (int64_t t = 0; t < T; t++) {
        par_real *w = work + t * P;
        const par_real *pr = proj + t * P;
        const par_real r = rsq[t];
        par_real drsq = 0;
        for (int64_t p = 0; p < P; p++) {
            par_real dm = w[p] * scale[group_of(p, n)];
            drsq += dm * pr[p];
            w[p] = dm * r;
        }
        if (dX) {
            const par_real *v = X + t * nd;
            par_real *dv = dX + t * nd;
            /* d rsq / d v_c = -rsq^3 v_c / nd */
            par_real coef = -drsq * r * r * r / (par_real)nd;
            /* acc[c] = coef v_c + sum_p w_p fn[p][c], p ascending, in column
             * blocks so the inner loop runs along rows of fn. */
            par_real acc[256];
            for (int64_t c0 = 0; c0 < nd; c0 += 256) {
                const int64_t cn = nd - c0 < 256 ? nd - c0 : 256;
                for (int64_t c = 0; c < cn; c++)
                    acc[c] = coef * v[c0 + c];
                for (int64_t p = 0; p < P; p++) {
                    const par_real wp = w[p], *fr = fn + p * nd + c0;
                    for (int64_t c = 0; c < cn; c++)
                        acc[c] += wp * fr[c];
                }
                for (int64_t c = 0; c < cn; c++)
                    dv[c0 + c] += acc[c];
            }
        }
    }
    if (dfn && PAR_ON_DEVICE()) {
        /* one device thread per element, t ascending: the host's order */
        PAR_KLOOP(collapse(2) is_device_ptr(dfn, work, X))
        for (int64_t p = 0; p < P; p++)
            for (int64_t c = 0; c < nd; c++)
                for (int64_t t = 0; t < T; t++)
                    dfn[p * nd + c] += work[t * P + p] * X[t * nd + c];
    } else if (dfn && par_gsum_of(dfn, P * nd).acc) {
        PAR_FN(par_gsum_outer)(par_gsum_of(dfn, P * nd), work, P, X, nd, T, P, nd, nd);
    } else if (dfn) {
        /* Columns of dfn in blocks, each block owned by one thread; every
         * element sums over t in ascending order. */
        const int64_t CB = 256, nblk = (nd + CB - 1) / CB;
#pragma omp parallel for schedule(static) OMP_IF(T * P * nd)
        for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t c0 = blk * CB, c1 = c0 + CB < nd ? c0 + CB : nd;
            for (int64_t t = 0; t < T; t++) {
                const par_real *v = X + t * nd;
                for (int64_t p = 0; p < P; p++) {
                    par_real g = work[t * P + p];
                    par_real *dw = dfn + p * nd;
                    for (int64_t c = c0; c < c1; c++)
                        dw[c] += g * v[c];
                }
            }
        }
    }
}

PAR_DECLARE_TARGET
/* One token of the x = sum pre_i X_i backward: dX_i += pre_i dx, and the
 * gradient of the pre logits into dz[0..n). */
static void combine_backward_token(par_real *dXt, par_real *dz, const par_real *dxt,
                                   const par_real *Xt, const par_real *pre,
                                   const par_real *mixes, const par_real *base, par_real s0,
                                   int64_t n, int64_t d)
{
    for (int64_t i = 0; i < n; i++) {
        if (!dxt) {
            dz[i] = 0;
            continue;
        }
        const par_real *Xi = Xt + i * d;
        par_real dpre = 0;
        for (int64_t c = 0; c < d; c++)
            dpre += dxt[c] * Xi[c];
        par_real sg = sigm(mixes[i] * s0 + base[i]);
        dz[i] = dpre * sg * (1 - sg);
        if (dXt) {
            par_real *dXi = dXt + i * d;
            for (int64_t c = 0; c < d; c++)
                dXi[c] += pre[i] * dxt[c];
        }
    }
}

PAR_END_DECLARE_TARGET

/* ---- hc_pre ---- */

par_status PAR_FN(par_hc_pre_forward)(par_real *x,                     /* [T, d] out */
                                      const PAR_FN(par_hc_saved) *saved, /* filled */
                                      const par_real *X,                 /* [T, n, d] */
                                      const par_real *fn,                /* [P, n*d] */
                                      const par_real *base,              /* [P] */
                                      const par_real *scale,             /* [3] */
                                      int64_t T, int64_t n, int64_t d, int64_t iters,
                                      double hc_eps, double norm_eps)
{
    par_status st = check_dims("hc_pre_forward", T, n, d, iters);
    if (st)
        return st;
    if (saved->T != T || saved->n != n || saved->iters != iters)
        return par_err(PAR_EINVAL,
                       "hc_pre_forward: saved state is for T=%lld n=%lld iters=%lld, call has "
                       "T=%lld n=%lld iters=%lld",
                       (long long)saved->T, (long long)saved->n, (long long)saved->iters,
                       (long long)T, (long long)n, (long long)iters);
    const int64_t P = (2 + n) * n, nd = n * d, nn = n * n;
    const par_real eps = (par_real)hc_eps;
    PAR_DEV_BEGIN();
    PAR_DIN(X, T * nd);
    PAR_DIN(fn, P * nd);
    PAR_DIN(base, P);
    PAR_DIN(scale, 3);
    PAR_DOUT(x, T * d);
    par_real *proj = PAR_DOUT_AS(saved->proj, T * P), *rsq = PAR_DOUT_AS(saved->rsq, T);
    par_real *mixes = PAR_DOUT_AS(saved->mixes, T * P), *pre_ = PAR_DOUT_AS(saved->pre, T * n);
    par_real *post_ = PAR_DOUT_AS(saved->post, T * n), *C = PAR_DOUT_AS(saved->C, T * nn);
    PAR_KLOOP_PAR(T * (P + 1) * nd >= PAR_HC_OMP_MIN_WORK,
                  is_device_ptr(x, X, fn, base, scale, proj, rsq, mixes, pre_, post_, C))
    for (int64_t t = 0; t < T; t++) {
        const par_real *Xt = X + t * nd;
        par_real *m = mixes + t * P;
        project_token(proj + t * P, rsq + t, m, Xt, fn, P, nd, norm_eps);
        par_real *pre = pre_ + t * n, *post = post_ + t * n;
        for (int64_t i = 0; i < n; i++)
            pre[i] = sigm(m[i] * scale[0] + base[i]) + eps;
        for (int64_t j = 0; j < n; j++)
            post[j] = 2 * sigm(m[n + j] * scale[1] + base[n + j]);
        par_real L[MAXNN];
        sinkhorn_logits(L, m, base, scale, n);
        sinkhorn_token(C + t * nn, L, n, iters, hc_eps);
        combine_token(x + t * d, pre, Xt, n, d);
    }
    return PAR_OK;
}

par_status PAR_FN(par_hc_pre_backward)(par_real *dX,          /* [T, n, d] += or NULL */
                                       par_real *dfn,         /* [P, n*d] += or NULL */
                                       par_real *dbase,       /* [P] += or NULL */
                                       par_real *dscale,      /* [3] += or NULL */
                                       const par_real *dx,    /* [T, d] or NULL */
                                       const par_real *dpost, /* [T, n] or NULL */
                                       const par_real *dC,    /* [T, n, n] or NULL */
                                       const PAR_FN(par_hc_saved) *saved,
                                       const par_real *X,     /* [T, n, d] */
                                       const par_real *fn,    /* [P, n*d] */
                                       const par_real *base,  /* [P] */
                                       const par_real *scale, /* [3] */
                                       int64_t T, int64_t n, int64_t d, int64_t iters,
                                       double hc_eps, double norm_eps)
{
    (void)norm_eps; /* rsq was saved */
    par_status st = check_dims("hc_pre_backward", T, n, d, iters);
    if (st)
        return st;
    if (saved->T != T || saved->n != n || saved->iters != iters)
        return par_err(PAR_EINVAL,
                       "hc_pre_backward: saved state is for T=%lld n=%lld iters=%lld, call has "
                       "T=%lld n=%lld iters=%lld",
                       (long long)saved->T, (long long)saved->n, (long long)saved->iters,
                       (long long)T, (long long)n, (long long)iters);
    const int64_t P = (2 + n) * n, nd = n * d, nn = n * n, skn = 2 * iters * nn;
    PAR_DEV_BEGIN();
    /* the Sinkhorn iterates of one token, recomputed from the saved mixes
     * (the forward's operations: the same bits): one buffer per host thread
     * in the default build, one per token in an offload build (PAR_SLOTS),
     * device or host: there the loop is a target region whose host fallback
     * libgomp runs as a fresh initial thread, with the process's default
     * team size, not this thread's max_threads() (a fiber worker's 1) */
    const int64_t nsk = (int64_t)PAR_SLOTS(max_threads(), T);
    par_real *skb = dC ? par_malloc((size_t)nsk * (size_t)skn * sizeof *skb, PAR_TAG_ACT) : NULL;
    if (dC && !skb)
        return par_err(PAR_ENOMEM, "hc_pre_backward: Sinkhorn scratch of %lld x %lld", (long long)nsk,
                       (long long)skn);
    PAR_DIN(dx, T * d);
    PAR_DIN(dpost, T * n);
    PAR_DIN(dC, T * nn);
    PAR_DIN(X, T * nd);
    PAR_DIN(fn, P * nd);
    PAR_DIN(base, P);
    PAR_DIN(scale, 3);
    PAR_DINOUT(dX, T * nd);
    PAR_DINOUT(dfn, P * nd);
    PAR_DINOUT(dbase, P);
    PAR_DINOUT(dscale, 3);
    const par_real *proj = PAR_DIN_AS(saved->proj, T * P), *rsq = PAR_DIN_AS(saved->rsq, T);
    const par_real *mixes = PAR_DIN_AS(saved->mixes, T * P), *pre = PAR_DIN_AS(saved->pre, T * n);
    par_real *skd = skb ? PAR_DOUT_AS(skb, nsk * skn) : NULL;
    par_real *work = PAR_DOUT_AS(saved->work, T * P);
    PAR_KLOOP_PAR(T * (P + 1) * nd >= PAR_HC_OMP_MIN_WORK,
                  is_device_ptr(dX, dx, dpost, dC, X, base, scale, mixes, pre, skd, work))
    for (int64_t t = 0; t < T; t++) {
        const par_real *m = mixes + t * P;
        par_real *dz = work + t * P;
        combine_backward_token(dX ? dX + t * nd : NULL, dz, dx ? dx + t * d : NULL, X + t * nd,
                               pre + t * n, m, base, scale[0], n, d);
        for (int64_t j = 0; j < n; j++) {
            if (!dpost) {
                dz[n + j] = 0;
                continue;
            }
            par_real sg = sigm(m[n + j] * scale[1] + base[n + j]);
            dz[n + j] = dpost[t * n + j] * 2 * sg * (1 - sg);
        }
        for (int64_t e = 0; e < nn; e++)
            dz[2 * n + e] = 0;
        if (dC) {
            par_real *sk = skd + (int64_t)PAR_SLOT(thread_id(), t) * skn, L[MAXNN], C[MAXNN];
            sinkhorn_logits(L, m, base, scale, n);
            PAR_FN(par_sinkhorn_forward)(C, sk, L, n, iters, hc_eps);
            PAR_FN(par_sinkhorn_backward)(dz + 2 * n, dC + t * nn, sk, n, iters, hc_eps);
        }
    }
    par_free(skb);
    project_backward(dX, dfn, dbase, dscale, work, proj, rsq, mixes, X, fn, scale, T, n, nd, P);
    return PAR_OK;
}

/* ---- hc_post ---- */

void PAR_FN(par_hc_post_forward)(par_real *Xout,       /* [T, n, d] out */
                                 const par_real *f,    /* [T, d] */
                                 const par_real *X,    /* [T, n, d] */
                                 const par_real *post, /* [T, n] */
                                 const par_real *C,    /* [T, n, n] */
                                 int64_t T, int64_t n, int64_t d)
{
    const int64_t nd = n * d, nn = n * n;
    PAR_DEV_BEGIN();
    PAR_DIN(f, T * d);
    PAR_DIN(X, T * nd);
    PAR_DIN(post, T * n);
    PAR_DIN(C, T * nn);
    PAR_DOUT(Xout, T * nd);
    PAR_KLOOP_PAR(T * (n + 1) * nd >= PAR_HC_OMP_MIN_WORK, is_device_ptr(Xout, f, X, post, C))
    for (int64_t t = 0; t < T; t++) {
        const par_real *ft = f + t * d, *Xt = X + t * nd, *Ct = C + t * nn, *pt = post + t * n;
        for (int64_t k = 0; k < n; k++) {
            par_real *o = Xout + t * nd + k * d;
            for (int64_t c = 0; c < d; c++) {
                par_real acc = pt[k] * ft[c];
                for (int64_t j = 0; j < n; j++)
                    acc += Ct[j * n + k] * Xt[j * d + c];
                o[c] = acc;
            }
        }
    }
}

void PAR_FN(par_hc_post_backward)(par_real *df,          /* [T, d] += or NULL */
                                  par_real *dX,          /* [T, n, d] += or NULL */
                                  par_real *dpost,       /* [T, n] += or NULL */
                                  par_real *dC,          /* [T, n, n] += or NULL */
                                  const par_real *dXout, /* [T, n, d] */
                                  const par_real *f,     /* [T, d] */
                                  const par_real *X,     /* [T, n, d] */
                                  const par_real *post,  /* [T, n] */
                                  const par_real *C,     /* [T, n, n] */
                                  int64_t T, int64_t n, int64_t d)
{
    const int64_t nd = n * d, nn = n * n;
    PAR_DEV_BEGIN();
    PAR_DIN(dXout, T * nd);
    PAR_DIN(f, T * d);
    PAR_DIN(X, T * nd);
    PAR_DIN(post, T * n);
    PAR_DIN(C, T * nn);
    PAR_DINOUT(df, T * d);
    PAR_DINOUT(dX, T * nd);
    PAR_DINOUT(dpost, T * n);
    PAR_DINOUT(dC, T * nn);
    PAR_KLOOP_PAR(T * (2 * n + 2) * nd >= PAR_HC_OMP_MIN_WORK,
                  is_device_ptr(df, dX, dpost, dC, dXout, f, X, post, C))
    for (int64_t t = 0; t < T; t++) {
        const par_real *g = dXout + t * nd, *ft = f + t * d, *Xt = X + t * nd;
        const par_real *Ct = C + t * nn, *pt = post + t * n;
        if (df) {
            for (int64_t c = 0; c < d; c++) {
                par_real acc = 0;
                for (int64_t k = 0; k < n; k++)
                    acc += pt[k] * g[k * d + c];
                df[t * d + c] += acc;
            }
        }
        if (dpost) {
            for (int64_t k = 0; k < n; k++) {
                par_real acc = 0;
                for (int64_t c = 0; c < d; c++)
                    acc += g[k * d + c] * ft[c];
                dpost[t * n + k] += acc;
            }
        }
        if (dC) {
            for (int64_t j = 0; j < n; j++)
                for (int64_t k = 0; k < n; k++) {
                    par_real acc = 0;
                    for (int64_t c = 0; c < d; c++)
                        acc += g[k * d + c] * Xt[j * d + c];
                    dC[t * nn + j * n + k] += acc;
                }
        }
        if (dX) {
            for (int64_t j = 0; j < n; j++)
                for (int64_t c = 0; c < d; c++) {
                    par_real acc = 0;
                    for (int64_t k = 0; k < n; k++)
                        acc += Ct[j * n + k] * g[k * d + c];
                    dX[t * nd + j * d + c] += acc;
                }
        }
    }
}

/* ---- hc_head ---- */

par_status PAR_FN(par_hc_head_forward)(par_real *x,                          /* [T, d] out */
                                       const PAR_FN(par_hc_head_saved) *saved, /* filled */
                                       const par_real *X,                      /* [T, n, d] */
                                       const par_real *fn,                     /* [n, n*d] */
                                       const par_real *base,                   /* [n] */
                                       const par_real *scale,                  /* [1] */
                                       int64_t T, int64_t n, int64_t d, double hc_eps,
                                       double norm_eps)
{
    par_status st = check_dims("hc_head_forward", T, n, d, 1);
    if (st)
        return st;
    if (saved->T != T || saved->n != n)
        return par_err(PAR_EINVAL,
                       "hc_head_forward: saved state is for T=%lld n=%lld, call has T=%lld "
                       "n=%lld",
                       (long long)saved->T, (long long)saved->n, (long long)T, (long long)n);
    const int64_t nd = n * d;
    const par_real eps = (par_real)hc_eps;
    PAR_DEV_BEGIN();
    PAR_DIN(X, T * nd);
    PAR_DIN(fn, n * nd);
    PAR_DIN(base, n);
    PAR_DIN(scale, 1);
    PAR_DOUT(x, T * d);
    par_real *proj = PAR_DOUT_AS(saved->proj, T * n), *rsq = PAR_DOUT_AS(saved->rsq, T);
    par_real *mixes = PAR_DOUT_AS(saved->mixes, T * n), *pre_ = PAR_DOUT_AS(saved->pre, T * n);
    PAR_KLOOP_PAR(T * (n + 1) * nd >= PAR_HC_OMP_MIN_WORK,
                  is_device_ptr(x, X, fn, base, scale, proj, rsq, mixes, pre_))
    for (int64_t t = 0; t < T; t++) {
        const par_real *Xt = X + t * nd;
        par_real *m = mixes + t * n, *pre = pre_ + t * n;
        project_token(proj + t * n, rsq + t, m, Xt, fn, n, nd, norm_eps);
        for (int64_t i = 0; i < n; i++)
            pre[i] = sigm(m[i] * scale[0] + base[i]) + eps;
        combine_token(x + t * d, pre, Xt, n, d);
    }
    return PAR_OK;
}

par_status PAR_FN(par_hc_head_backward)(par_real *dX,          /* [T, n, d] += or NULL */
                                        par_real *dfn,         /* [n, n*d] += or NULL */
                                        par_real *dbase,       /* [n] += or NULL */
                                        par_real *dscale,      /* [1] += or NULL */
                                        const par_real *dx,    /* [T, d] */
                                        const PAR_FN(par_hc_head_saved) *saved,
                                        const par_real *X,     /* [T, n, d] */
                                        const par_real *fn,    /* [n, n*d] */
                                        const par_real *base,  /* [n] */
                                        const par_real *scale, /* [1] */
                                        int64_t T, int64_t n, int64_t d, double hc_eps,
                                        double norm_eps)
{
    (void)hc_eps;
    (void)norm_eps;
    par_status st = check_dims("hc_head_backward", T, n, d, 1);
    if (st)
        return st;
    if (saved->T != T || saved->n != n)
        return par_err(PAR_EINVAL,
                       "hc_head_backward: saved state is for T=%lld n=%lld, call has T=%lld "
                       "n=%lld",
                       (long long)saved->T, (long long)saved->n, (long long)T, (long long)n);
    const int64_t nd = n * d;
    PAR_DEV_BEGIN();
    PAR_DIN(dx, T * d);
    PAR_DIN(X, T * nd);
    PAR_DIN(fn, n * nd);
    PAR_DIN(base, n);
    PAR_DIN(scale, 1);
    PAR_DINOUT(dX, T * nd);
    PAR_DINOUT(dfn, n * nd);
    PAR_DINOUT(dbase, n);
    PAR_DINOUT(dscale, 1);
    const par_real *proj = PAR_DIN_AS(saved->proj, T * n), *rsq = PAR_DIN_AS(saved->rsq, T);
    const par_real *mixes = PAR_DIN_AS(saved->mixes, T * n), *pre = PAR_DIN_AS(saved->pre, T * n);
    par_real *work = PAR_DOUT_AS(saved->work, T * n);
    PAR_KLOOP_PAR(T * (n + 1) * nd >= PAR_HC_OMP_MIN_WORK,
                  is_device_ptr(dX, dx, X, base, scale, mixes, pre, work))
    for (int64_t t = 0; t < T; t++)
        combine_backward_token(dX ? dX + t * nd : NULL, work + t * n, dx ? dx + t * d : NULL,
                               X + t * nd, pre + t * n, mixes + t * n, base, scale[0], n, d);
    /* group_of(p, n) is 0 for every p < n: the head's one scale. */
    project_backward(dX, dfn, dbase, dscale, work, proj, rsq, mixes, X, fn, scale, T, n, nd, n);
    return PAR_OK;
}
