/* kernels/moe.c - the V4 mixture of experts (see kernels/moe.h). */
#include "kernels/moe.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/pmath.h"
#include "core/status.h"
#include "kernels/offload.h"
#include "kernels/ops.h"
#include "kernels/recipe.h"

static par_status check_dims(const char *fn, int64_t T, int64_t d, int E, int K)
{
    if (T < 0 || d < 1 || E < 1 || K < 1 || K > E)
        return par_err(PAR_EINVAL,
                       "%s: need T >= 0, d >= 1 and 1 <= K <= E (T=%lld d=%lld E=%d K=%d)", fn,
                       (long long)T, (long long)d, E, K);
    return PAR_OK;
}

/* idx[t] must be ascending (hence distinct) and in [0, E). */
static par_status check_idx(const char *fn, const int32_t *idx, int64_t T, int E, int K)
{
    for (int64_t t = 0; t < T; t++) {
        const int32_t *r = idx + t * K;
        for (int k = 0; k < K; k++) {
            if (r[k] < 0 || r[k] >= E)
                return par_err(PAR_ERANGE, "%s: idx[%lld][%d] = %d outside [0, E=%d)", fn,
                               (long long)t, k, (int)r[k], E);
            if (k > 0 && r[k] <= r[k - 1])
                return par_err(PAR_EINVAL,
                               "%s: idx[%lld] must be strictly ascending, but entry %d is %d "
                               "after %d",
                               fn, (long long)t, k, (int)r[k], (int)r[k - 1]);
        }
    }
    return PAR_OK;
}

/* ---------------------------------------------------------------- gate -- */

par_status PAR_FN(par_moe_tid2eid)(int32_t *table, /* [V, K] */
                                   int64_t V, int E, int K)
{
    if (V < 0 || E < 1 || K < 1 || K > E)
        return par_err(PAR_EINVAL, "moe tid2eid: need V >= 0 and 1 <= K <= E (V=%lld E=%d K=%d)",
                       (long long)V, E, K);
    int64_t stride = E / K;
    for (int64_t t = 0; t < V; t++)
        for (int j = 0; j < K; j++)
            table[t * K + j] = (int32_t)(((t % E) + j * stride) % E);
    return PAR_OK;
}

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#define GATE_HOST_PARTS 0
#else
#define GATE_HOST_PARTS 1
#endif

#if !GATE_HOST_PARTS
PAR_DECLARE_TARGET /* the gate's per-row pieces run inside device loops */
/* d sqrt(softplus(l)) / dl = sigmoid(l) / (2 sqrt(softplus(l))), in double.
 * When softplus underflows to 0 (l below about -745) the ratio tends to
 * exp(l/2)/2 (softplus(l) ~ sigmoid(l) ~ e^l there). */
static double dsqrtsoftplus(double l)
{
    double sg;
    const double sp = par_softplus_sigmoid(l, &sg); /* one e^-|l| for both (kernels/scalar.h) */
    if (sp > 0.0)
        return sg / (2.0 * sqrt(sp));
    return 0.5 * par_pmath_exp(0.5 * l);
}
PAR_END_DECLARE_TARGET
#endif

/* The host build computes the gate's softplus GATE_BLK logits at a time
 * through par_pmath_softplus_parts (four lanes where the CPU has AVX2 + FMA,
 * the same bits as par_softplus / par_sigmoid: tests/core/test_pmath.c); the
 * offload build keeps the per-element calls inside its device loops. */
#if GATE_HOST_PARTS
#define GATE_BLK 64

/* Block [b, b + m) of x (m = min(GATE_BLK, n - b), returned) into l, and
 * its e^-|l| and log1p(e^-|l|) (core/pmath.h par_pmath_softplus_parts). */
static int64_t gate_parts(double *l, double *e, double *lp, const par_real *x, int64_t b, int64_t n)
{
    const int64_t m = n - b < GATE_BLK ? n - b : GATE_BLK;
    for (int64_t i = 0; i < m; i++)
        l[i] = (double)x[b + i];
    par_pmath_softplus_parts(l, e, lp, m);
    return m;
}

/* r[i] *= d sqrt(softplus(l[i])) / dl for i < n: dsqrtsoftplus's operations
 * (the offload build's, above) per element, rounded as that loop */
static void gate_dlogit_row(par_real *r, const par_real *logit, int64_t n)
{
    for (int64_t b = 0; b < n; b += GATE_BLK) {
        double l[GATE_BLK], e[GATE_BLK], lp[GATE_BLK];
        const int64_t m = gate_parts(l, e, lp, logit, b, n);
        for (int64_t i = 0; i < m; i++) {
            const double x = l[i], sp = (x > 0 ? x : 0.0) + lp[i]; /* par_softplus_sigmoid */
            double d;
            if (sp > 0.0) {
                const double sg = x >= 0 ? 1.0 / (1.0 + e[i]) : x < 0 ? e[i] / (1.0 + e[i]) : par_sigmoid(x);
                d = sg / (2.0 * sqrt(sp));
            } else {
                d = 0.5 * par_pmath_exp(0.5 * x);
            }
            r[b + i] = (par_real)((double)r[b + i] * d);
        }
    }
}
#endif

PAR_DECLARE_TARGET /* sort_small, gate_row: inside the gate's device loops */
static void sort_small(int32_t *a, int n)
{
    for (int i = 1; i < n; i++) {
        int32_t v = a[i];
        int j = i - 1;
        while (j >= 0 && a[j] > v) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = v;
    }
}

/* The selection and weights of row t (st_ = s[t]): 0, or why the row is
 * refused: 1 its token is outside [0, V); 2 its tid2eid row is not K
 * distinct experts in [0, E) (*det = the sorted entry); 3 score *det is not
 * finite; 4 the selected scores do not sum to > 0.  `taken` is [E] scratch. */
static int gate_row(int32_t *it, par_real *wt, unsigned char *taken, const par_real *st_,
                    const par_real *bias, const int32_t *tid2eid, const int32_t *tokens,
                    int64_t t, int64_t V, int E, int K, double route_scale, int *det)
{
    if (tid2eid) {
        int32_t tok = tokens[t];
        if (tok < 0 || tok >= V)
            return 1;
        memcpy(it, tid2eid + (int64_t)tok * K, (size_t)K * sizeof *it);
        sort_small(it, K);
        for (int k = 0; k < K; k++) {
            if (it[k] < 0 || it[k] >= E || (k > 0 && it[k] == it[k - 1])) {
                *det = k;
                return 2;
            }
        }
    } else {
        for (int e = 0; e < E; e++) {
            if (!isfinite(st_[e])) {
                *det = e;
                return 3;
            }
        }
        memset(taken, 0, (size_t)E);
        for (int k = 0; k < K; k++) {
            int best = -1;
            par_real bv = 0;
            for (int e = 0; e < E; e++) {
                if (taken[e])
                    continue;
                par_real v = bias ? st_[e] + bias[e] : st_[e];
                if (best < 0 || v > bv) { /* strict: ties keep the lower e */
                    best = e;
                    bv = v;
                }
            }
            taken[best] = 1;
            it[k] = best;
        }
        sort_small(it, K);
    }
    par_real S = 0;
    for (int k = 0; k < K; k++)
        S += st_[it[k]];
    if (!(S > 0))
        return 4;
    for (int k = 0; k < K; k++)
        wt[k] = st_[it[k]] / S * (par_real)route_scale;
    return 0;
}
PAR_END_DECLARE_TARGET

/* The message of gate_row's refusal `code` of row t (host copies). */
static par_status gate_refusal(int code, int det, int64_t t, const int32_t *idx, const par_real *s,
                               const int32_t *tokens, int64_t V, int E, int K)
{
    static const char fn[] = "moe gate forward";
    const par_real *st_ = s + t * E;
    const int32_t *it = idx + t * K;
    switch (code) {
    case 1:
        return par_err(PAR_ERANGE, "%s: token %d of row %lld outside the hash table [0, V=%lld)", fn,
                       (int)tokens[t], (long long)t, (long long)V);
    case 2:
        return par_err(PAR_EINVAL,
                       "%s: tid2eid[%d] must hold %d distinct experts in [0, E=%d); "
                       "sorted entry %d is %d",
                       fn, (int)tokens[t], K, E, det, (int)it[det]);
    case 3:
        return par_err(PAR_ERANGE, "%s: score s[%lld][%d] = %g is not finite", fn, (long long)t,
                       det, (double)st_[det]);
    default: {
        par_real S = 0;
        for (int k = 0; k < K; k++)
            S += st_[it[k]];
        return par_err(PAR_ERANGE,
                       "%s: row %lld: the selected scores sum to %g (must be > 0 to normalise "
                       "the route weights)",
                       fn, (long long)t, (double)S);
    }
    }
}

/* The row's biased scores v (the gate's own sum), the K-th largest of them
 * (*bK) and whether the (K+1)-th equals it: the K+1 largest kept in top
 * [K+1] (descending, by insertion: O(E K)). */
static int tie_at_boundary(par_real *v, par_real *top, par_real *bK, const par_real *st_, const par_real *bias, int E,
                           int K)
{
    int n = 0;
    for (int e = 0; e < E; e++) {
        par_real x = v[e] = bias ? st_[e] + bias[e] : st_[e];
        if (n == K + 1 && !(x > top[K]))
            continue;
        int j = n < K + 1 ? n++ : K;
        while (j > 0 && top[j - 1] < x) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = x;
    }
    *bK = top[K - 1];
    return K < E && top[K] == top[K - 1]; /* more tied at the K-th value than places left */
}

par_status PAR_FN(par_moe_gate_ties)(int32_t *tie,         /* [T, E] out */
                                     int64_t counts[2],
                                     const par_real *s,    /* [T, E] */
                                     const par_real *bias, /* [E] or NULL */
                                     int64_t T, int E, int K)
{
    par_status st = check_dims("moe gate ties", T, 1, E, K);
    if (st)
        return st;
    par_real *v = par_malloc((size_t)(E + K + 1) * sizeof *v, PAR_TAG_ACT);
    if (!v)
        return par_err(PAR_ENOMEM, "moe gate ties: %d scores of scratch", E + K + 1);
    int64_t tied = 0;
    for (int64_t t = 0; t < T; t++) {
        par_real bK;
        int32_t *row = tie + t * E;
        int at = tie_at_boundary(v, v + E, &bK, s + t * E, bias, E, K);
        for (int e = 0; e < E; e++)
            row[e] = at && v[e] == bK;
        tied += at;
    }
    par_free(v);
    counts[0] = K < E ? T : 0;
    counts[1] = tied;
    return PAR_OK;
}

/* s = sqrt(softplus(logits)), the gate's scores (the forward's and the
 * backward's recompute: the same bits). */
void PAR_FN(par_moe_gate_scores)(par_real *s,            /* [n] out */
                                 const par_real *logits, /* [n] */
                                 int64_t n)
{
#if GATE_HOST_PARTS
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < n; b += GATE_BLK) {
        double l[GATE_BLK], e[GATE_BLK], lp[GATE_BLK];
        const int64_t m = gate_parts(l, e, lp, logits, b, n);
        for (int64_t i = 0; i < m; i++) /* par_softplus: max(l, 0) + log1p(e^-|l|) */
            s[b + i] = (par_real)sqrt((l[i] > 0 ? l[i] : 0.0) + lp[i]);
    }
#else
    PAR_DEV_BEGIN();
    const par_real *l_d = PAR_DIN_AS(logits, n);
    par_real *s_d = PAR_DOUT_AS(s, n);
    PAR_KLOOP_PAR(n > 65536, is_device_ptr(l_d, s_d))
    for (int64_t i = 0; i < n; i++)
        s_d[i] = (par_real)sqrt(par_softplus((double)l_d[i]));
#endif
}

void PAR_FN(par_moe_gate_logits)(par_real *logits,   /* [T, E] out */
                                 const par_real *x,  /* [T, d] */
                                 const par_real *wg, /* [E, d] */
                                 int64_t T, int64_t d, int E)
{
    PAR_FN(par_linear_forward)(logits, x, wg, T, d, E);
}

par_status PAR_FN(par_moe_gate_forward)(int32_t *idx,            /* [T, K] out, ascending */
                                        par_real *w,             /* [T, K] out */
                                        par_real *logits,        /* [T, E] saved */
                                        par_real *s,             /* [T, E] saved */
                                        const par_real *x,       /* [T, d] */
                                        const par_real *wg,      /* [E, d] */
                                        const par_real *bias,    /* [E] or NULL */
                                        const int32_t *tid2eid,  /* [V, K] or NULL */
                                        const int32_t *tokens,   /* [T] (hash layers) */
                                        int64_t V, int64_t T, int64_t d, int E, int K,
                                        double route_scale)
{
    static const char fn[] = "moe gate forward";
    par_status st = check_dims(fn, T, d, E, K);
    if (st)
        return st;
    if (tid2eid && !tokens)
        return par_err(PAR_EINVAL, "%s: a hash layer (tid2eid given) needs the token ids", fn);
    if (T == 0)
        return PAR_OK;

    PAR_FN(par_moe_gate_logits)(logits, x, wg, T, d, E);
    PAR_DEV_BEGIN();
    PAR_FN(par_moe_gate_scores)(s, logits, T * E);
    const par_real *s_d = PAR_DIN_AS(s, T * E);

    /* one row of scratch (the host: rows in order, stopping at the first
     * refused one); on a device a row each, refusals gathered after */
    const int dev = PAR_ON_DEVICE();
    const int64_t nrow = dev ? T : 1;
    unsigned char *taken = par_calloc((size_t)(nrow * E), 1, PAR_TAG_ACT);
    int32_t *why = dev ? par_calloc((size_t)(2 * T), sizeof *why, PAR_TAG_ACT) : NULL;
    if (!taken || (dev && !why)) {
        par_free(taken);
        par_free(why);
        return par_err(PAR_ENOMEM, "%s: %d bytes of selection workspace", fn, E);
    }
    if (!dev) {
        for (int64_t t = 0; t < T; t++) {
            int det = 0;
            int code = gate_row(idx + t * K, w + t * K, taken, s + t * E, bias, tid2eid, tokens, t,
                                V, E, K, route_scale, &det);
            if (code) {
                st = gate_refusal(code, det, t, idx, s, tokens, V, E, K);
                break;
            }
        }
    } else {
        int32_t *idx_d = PAR_DOUT_AS(idx, T * K), *why_d = PAR_DOUT_AS(why, 2 * T);
        par_real *w_d = PAR_DOUT_AS(w, T * K);
        unsigned char *tk_d = PAR_DOUT_AS(taken, T * E);
        const par_real *b_d = PAR_DIN_AS(bias, E);
        const int32_t *tab_d = PAR_DIN_AS(tid2eid, V * K), *tok_d = PAR_DIN_AS(tokens, T);
        PAR_KLOOP(is_device_ptr(idx_d, why_d, w_d, tk_d, s_d, b_d, tab_d, tok_d))
        for (int64_t t = 0; t < T; t++) {
            int det = 0;
            why_d[2 * t] = gate_row(idx_d + t * K, w_d + t * K, tk_d + t * E, s_d + t * E, b_d,
                                    tab_d, tok_d, t, V, E, K, route_scale, &det);
            why_d[2 * t + 1] = det;
        }
        PAR_HOST_READ(why, 2 * T);
        for (int64_t t = 0; t < T; t++) {
            if (why[2 * t]) {
                PAR_HOST_READ(idx, T * K);
                PAR_HOST_READ(s, T * E);
                PAR_HOST_READ(tokens, T);
                st = gate_refusal(why[2 * t], why[2 * t + 1], t, idx, s, tokens, V, E, K);
                break;
            }
        }
    }
    par_free(why);
    par_free(taken);
    return st;
}

par_status PAR_FN(par_moe_gate_backward)(par_real *dx,             /* [T, d] or NULL */
                                         par_real *dwg,            /* [E, d] or NULL */
                                         const par_real *dw,       /* [T, K] or NULL */
                                         const par_real *ds_extra, /* [T, E] or NULL */
                                         const par_real *x,        /* [T, d] */
                                         const par_real *wg,       /* [E, d] */
                                         const par_real *logits,   /* [T, E] */
                                         const par_real *s,        /* [T, E] */
                                         const int32_t *idx,       /* [T, K] */
                                         const par_real *w,        /* [T, K] */
                                         int64_t T, int64_t d, int E, int K,
                                         double route_scale)
{
    static const char fn[] = "moe gate backward";
    par_status st = check_dims(fn, T, d, E, K);
    if (st)
        return st;
    if (T == 0 || (!dx && !dwg) || (!dw && !ds_extra))
        return PAR_OK;

    par_real *dl = par_calloc((size_t)(T * E), sizeof *dl, PAR_TAG_ACT);
    if (!dl)
        return par_err(PAR_ENOMEM, "%s: workspace of %lld x %d", fn, (long long)T, E);

    PAR_DEV_BEGIN();
    par_real *dl_host = dl;
    PAR_DIN(ds_extra, T * E);
    PAR_DIN(dw, T * K);
    PAR_DIN(idx, T * K);
    PAR_DIN(w, T * K);
    PAR_DIN(s, T * E);
    PAR_DIN(logits, T * E);
    PAR_DINOUT(dl, T * E); /* zeros from the calloc */
    PAR_KLOOP_PAR(T * E > 65536, is_device_ptr(dl, ds_extra, dw, idx, w, s, logits))
    for (int64_t t = 0; t < T; t++) { /* row t owned by one thread */
        par_real *r = dl + t * E;     /* first ds, then dlogit */
        if (ds_extra)
            for (int e = 0; e < E; e++)
                r[e] = ds_extra[t * E + e];
        if (dw) {
            const int32_t *it = idx + t * K;
            const par_real *dwt = dw + t * K, *wt = w + t * K;
            par_real S = 0, dot = 0;
            for (int k = 0; k < K; k++) {
                S += s[t * E + it[k]];
                dot += dwt[k] * wt[k];
            }
            for (int k = 0; k < K; k++)
                r[it[k]] += ((par_real)route_scale * dwt[k] - dot) / S;
        }
#if GATE_HOST_PARTS
        gate_dlogit_row(r, logits + t * E, E);
#else
        for (int e = 0; e < E; e++)
            r[e] = (par_real)((double)r[e] * dsqrtsoftplus((double)logits[t * E + e]));
#endif
    }
    PAR_FN(par_linear_backward)(dx, dwg, dl, x, wg, T, d, E);
    par_free(dl_host);
    return PAR_OK;
}

/* -------------------------------------------------------------- expert -- */

void PAR_FN(par_moe_expert_forward)(par_real *y,        /* [n, d] */
                                    par_real *g,        /* [n, I] saved */
                                    par_real *u,        /* [n, I] saved */
                                    par_real *h,        /* [n, I] saved */
                                    const par_real *x,  /* [n, d] */
                                    const par_real *rw, /* [n] or NULL */
                                    const par_real *w1, /* [I, d] */
                                    const par_real *w2, /* [d, I] */
                                    const par_real *w3, /* [I, d] */
                                    int64_t n, int64_t d, int64_t I, double L)
{
    if (n <= 0)
        return;
    PAR_FN(par_moe_expert_hidden)(g, u, h, x, rw, w1, w3, n, d, I, L);
    PAR_FN(par_linear_forward)(y, h, w2, n, I, d);
}

void PAR_FN(par_moe_expert_hidden)(par_real *g,        /* [n, I] */
                                   par_real *u,        /* [n, I] */
                                   par_real *h,        /* [n, I] */
                                   const par_real *x,  /* [n, d] */
                                   const par_real *rw, /* [n] or NULL */
                                   const par_real *w1, /* [I, d] */
                                   const par_real *w3, /* [I, d] */
                                   int64_t n, int64_t d, int64_t I, double L)
{
    if (n <= 0)
        return;
    PAR_FN(par_linear_forward)(g, x, w1, n, d, I);
    PAR_FN(par_linear_forward)(u, x, w3, n, d, I);
    PAR_FN(par_swiglu_forward)(h, g, u, rw, n, I, L);
}

par_status PAR_FN(par_moe_expert_backward)(par_real *dx,        /* [n, d] or NULL */
                                           par_real *dw1,       /* [I, d] or NULL */
                                           par_real *dw2,       /* [d, I] or NULL */
                                           par_real *dw3,       /* [I, d] or NULL */
                                           par_real *drw,       /* [n] or NULL */
                                           const par_real *dy,  /* [n, d] */
                                           const par_real *x,   /* [n, d] */
                                           const par_real *rw,  /* [n] or NULL */
                                           const par_real *w1,  /* [I, d] */
                                           const par_real *w2,  /* [d, I] */
                                           const par_real *w3,  /* [I, d] */
                                           const par_real *g,   /* [n, I] */
                                           const par_real *u,   /* [n, I] */
                                           const par_real *h,   /* [n, I] */
                                           int64_t n, int64_t d, int64_t I, double L)
{
    if (n <= 0)
        return PAR_OK;
    if (dw2)
        PAR_FN(par_linear_backward)(NULL, dw2, dy, h, w2, n, I, d);
    if (!dx && !dw1 && !dw3 && !drw)
        return PAR_OK;
    par_real *dh = par_calloc((size_t)(3 * n * I), sizeof *dh, PAR_TAG_ACT);
    if (!dh)
        return par_err(PAR_ENOMEM, "moe expert backward: workspace of 3 x %lld x %lld",
                       (long long)n, (long long)I);
    par_real *dg = dh + n * I, *du = dg + n * I;
    PAR_FN(par_linear_backward)(dh, NULL, dy, h, w2, n, I, d);
    PAR_FN(par_swiglu_backward)(dg, du, drw, dh, g, u, rw, n, I, L);
    if (dx || dw1)
        PAR_FN(par_linear_backward)(dx, dw1, dg, x, w1, n, d, I);
    if (dx || dw3)
        PAR_FN(par_linear_backward)(dx, dw3, du, x, w3, n, d, I);
    par_free(dh);
    return PAR_OK;
}

/* --------------------------------------------------------------- layer -- */

par_status PAR_FN(par_moe_saved_alloc)(par_moe_saved *sv, int64_t T, int64_t d, int E, int K,
                                       int64_t I)
{
    static const char fn[] = "moe saved alloc";
    memset(sv, 0, sizeof *sv);
    par_status st = check_dims(fn, T, d, E, K);
    if (st)
        return st;
    if (I < 1)
        return par_err(PAR_EINVAL, "%s: moe_inter_dim must be >= 1 (got %lld)", fn, (long long)I);
    if (T * K > INT32_MAX)
        return par_err(PAR_ERANGE, "%s: T*K = %lld gathered rows exceed int32", fn,
                       (long long)(T * K));
    size_t rows = (size_t)(T * K) + 1; /* +1: no zero-size blocks */
    sv->T = T;
    sv->d = d;
    sv->I = I;
    sv->E = E;
    sv->K = K;
    sv->off = par_calloc((size_t)E + 1, sizeof *sv->off, PAR_TAG_ACT);
    sv->tok = par_calloc(rows, sizeof *sv->tok, PAR_TAG_ACT);
    sv->slot = par_calloc(rows, sizeof *sv->slot, PAR_TAG_ACT);
    sv->g = par_calloc(rows * (size_t)I, sizeof *sv->g, PAR_TAG_ACT);
    sv->u = par_calloc(rows * (size_t)I, sizeof *sv->u, PAR_TAG_ACT);
    sv->h = par_calloc(rows * (size_t)I, sizeof *sv->h, PAR_TAG_ACT);
    sv->sg = par_calloc((size_t)(T + 1) * (size_t)I, sizeof *sv->sg, PAR_TAG_ACT);
    sv->su = par_calloc((size_t)(T + 1) * (size_t)I, sizeof *sv->su, PAR_TAG_ACT);
    sv->sh = par_calloc((size_t)(T + 1) * (size_t)I, sizeof *sv->sh, PAR_TAG_ACT);
    if (!sv->off || !sv->tok || !sv->slot || !sv->g || !sv->u || !sv->h || !sv->sg || !sv->su ||
        !sv->sh) {
        PAR_FN(par_moe_saved_free)(sv);
        return par_err(PAR_ENOMEM, "%s: saved activations for T=%lld K=%d I=%lld", fn,
                       (long long)T, K, (long long)I);
    }
    return PAR_OK;
}

void PAR_FN(par_moe_saved_free)(par_moe_saved *sv)
{
    par_free(sv->off);
    par_free(sv->tok);
    par_free(sv->slot);
    par_free(sv->g);
    par_free(sv->u);
    par_free(sv->h);
    par_free(sv->sg);
    par_free(sv->su);
    par_free(sv->sh);
    memset(sv, 0, sizeof *sv);
}

void PAR_FN(par_moe_combine)(par_real *y,             /* [T, d] */
                             const par_real *slots,   /* [T, K, d] */
                             const par_real *shared,  /* [T, d] or NULL */
                             int64_t T, int K, int64_t d, int accumulate)
{
    PAR_DEV_BEGIN();
    PAR_DIN(slots, T * K * d);
    PAR_DIN(shared, T * d);
    if (accumulate)
        PAR_DINOUT(y, T * d);
    else
        PAR_DOUT(y, T * d);
    PAR_KLOOP_PAR(T * d > 65536, is_device_ptr(y, slots, shared))
    for (int64_t t = 0; t < T; t++) {
        const par_real *sl = slots + t * K * d;
        par_real *yt = y + t * d;
        for (int64_t j = 0; j < d; j++) {
            par_real v = sl[j];
            for (int k = 1; k < K; k++)
                v += sl[k * d + j];
            if (shared)
                v += shared[t * d + j];
            yt[j] = accumulate ? yt[j] + v : v;
        }
    }
}

static int has_shared(const par_moe_weights *W)
{
    return W->sw1 && W->sw2 && W->sw3;
}

static par_status check_layer(const char *fn, const par_moe_saved *sv, const par_moe_weights *W,
                              int64_t T, int64_t d, int E, int K, int64_t I)
{
    if (sv->T != T || sv->d != d || sv->E != E || sv->K != K || sv->I != I)
        return par_err(PAR_EINVAL,
                       "%s: saved buffers are for T=%lld d=%lld E=%d K=%d I=%lld, called with "
                       "T=%lld d=%lld E=%d K=%d I=%lld",
                       fn, (long long)sv->T, (long long)sv->d, sv->E, sv->K, (long long)sv->I,
                       (long long)T, (long long)d, E, K, (long long)I);
    if (!W->w1 || !W->w2 || !W->w3)
        return par_err(PAR_EINVAL, "%s: expert weight pointer arrays must be given", fn);
    if ((W->sw1 || W->sw2 || W->sw3) && !has_shared(W))
        return par_err(PAR_EINVAL, "%s: the shared expert needs all of w1, w2, w3 (or none)", fn);
    return PAR_OK;
}

/* Gathered rows: xg[p] = x[tok[p]] (and rwg[p] = w[tok[p], slot[p]] when rwg;
 * with dy, dyg[p] = dy[tok[p]] too). */
static void gather_rows(par_real *xg, par_real *dyg, par_real *rwg, const par_real *x,
                        const par_real *dy, const par_real *w, const int32_t *tok,
                        const int32_t *slot, int64_t NR, int64_t T, int K, int64_t d)
{
    PAR_DEV_BEGIN();
    PAR_DIN(x, T * d);
    PAR_DIN(dy, T * d);
    PAR_DIN(w, T * K);
    PAR_DIN(tok, NR);
    PAR_DIN(slot, NR);
    PAR_DOUT(xg, NR * d);
    PAR_DOUT(dyg, NR * d);
    PAR_DOUT(rwg, NR);
    PAR_KLOOP(is_device_ptr(xg, dyg, rwg, x, dy, w, tok, slot)) /* serial on the host, as before */
    for (int64_t p = 0; p < NR; p++) {
        int64_t t = tok[p];
        if (rwg)
            rwg[p] = w[t * K + slot[p]];
        memcpy(xg + p * d, x + t * d, (size_t)d * sizeof *xg);
        if (dyg)
            memcpy(dyg + p * d, dy + t * d, (size_t)d * sizeof *xg);
    }
}

/* slots[tok[p], slot[p]] = rows[p]: every slot of [T, K] gets one row. */
static void scatter_rows(par_real *slots, const par_real *rows, const int32_t *tok,
                         const int32_t *slot, int64_t NR, int K, int64_t d)
{
    PAR_DEV_BEGIN();
    PAR_DIN(rows, NR * d);
    PAR_DIN(tok, NR);
    PAR_DIN(slot, NR);
    PAR_DOUT(slots, NR * d); /* NR = T * K */
    PAR_KLOOP(is_device_ptr(slots, rows, tok, slot)) /* serial on the host, as before */
    for (int64_t p = 0; p < NR; p++)
        memcpy(slots + ((int64_t)tok[p] * K + slot[p]) * d, rows + p * d, (size_t)d * sizeof *slots);
}

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
/* The experts' GEMMs of a layer as grouped launches when kernels use device memory
 * (kernels/gemm_device.c; the device path has no recipe casts and no bitwise mode): one
 * launch a product over every expert with rows, each expert's product the bits of its own
 * par_moe_expert_forward / _backward call, so the layer's bits do not move. */
typedef struct {
    int E;
    const int64_t *off;          /* [E + 1] the experts' rows in the gathered arrays */
    int64_t *M, *N, *K;          /* [E] each */
    const par_real **A, **B;     /* [E] each */
    par_real **C;                /* [E] */
} xgroup;

/* an operand: rows of a gathered array (base + off[e] * stride) or the expert's own (own[e]) */
typedef struct {
    const par_real *base;
    int64_t stride;
    const par_real *const *own;
} xop;

static const par_real *xop_of(const xop *o, const int64_t *off, int e)
{
    return o->own ? o->own[e] : o->base + off[e] * o->stride;
}

static int xgroup_open(xgroup *x, const int64_t *off, int E)
{
    if (!par_dev_device_mode() || par_recipe_registered() > 0)
        return 0;
    x->E = E, x->off = off;
    x->M = par_malloc((size_t)E * (3 * sizeof(int64_t) + 3 * sizeof(void *)), PAR_TAG_ACT);
    if (!x->M)
        return 0; /* no memory for the table: the experts one by one */
    x->N = x->M + E, x->K = x->N + E;
    x->A = (const par_real **)(void *)(x->K + E), x->B = x->A + E, x->C = (par_real **)(void *)(x->B + E);
    return 1;
}

/* C_e = alpha op(A_e) op(B_e) + beta C_e for every expert e with rows (m, n, k < 0: its row count) */
static void xgemm(const xgroup *x, int ta, int tb, int64_t m, int64_t n, int64_t k, xop a, int64_t lda, xop b,
                  int64_t ldb, par_real beta, xop c, int64_t ldc)
{
    for (int e = 0; e < x->E; e++) {
        const int64_t ne = x->off[e + 1] - x->off[e];
        x->M[e] = m < 0 ? ne : m, x->N[e] = n < 0 ? ne : n, x->K[e] = k < 0 ? ne : k;
        x->A[e] = xop_of(&a, x->off, e), x->B[e] = xop_of(&b, x->off, e);
        x->C[e] = ne > 0 ? (par_real *)(void *)xop_of(&c, x->off, e) : NULL; /* no rows: no call */
    }
    PAR_FN(par__gemm_device_group)(ta, tb, x->E, x->M, x->N, x->K, 1, (const par_real *const *)x->A, lda,
                                   (const par_real *const *)x->B, ldb, beta, (par_real *const *)x->C, ldc);
}

/* par_moe_expert_forward of every expert: g, u = x W1^T, x W3^T; h = swiglu; y = h W2^T */
static void experts_forward(const xgroup *x, par_real *yg, const par_moe_saved *sv, const par_real *xg,
                            const par_real *rwg, const par_moe_weights *W, int64_t NR, int64_t d, int64_t I,
                            double L)
{
    const xop rows_x = {xg, d, NULL};
    xgemm(x, 0, 1, -1, I, d, rows_x, d, (xop){NULL, 0, W->w1}, d, 0,
          (xop){sv->g, I, NULL}, I);
    xgemm(x, 0, 1, -1, I, d, rows_x, d, (xop){NULL, 0, W->w3}, d, 0,
          (xop){sv->u, I, NULL}, I);
    PAR_FN(par_swiglu_forward)(sv->h, sv->g, sv->u, rwg, NR, I, L);
    xgemm(x, 0, 1, -1, d, I, (xop){sv->h, I, NULL}, I, (xop){NULL, 0, W->w2}, I, 0,
          (xop){yg, d, NULL}, d);
}

/* par_moe_expert_backward of every expert, each product over all experts in one launch
 * (per expert the same order: dW2, dh, swiglu, dx += dg W1, dW1, dx += du W3, dW3) */
static par_status experts_backward(const xgroup *x, par_real *dxg, const par_moe_grads *dW, par_real *drwg,
                                   const par_real *dyg, const par_real *xg, const par_real *rwg,
                                   const par_moe_weights *W, const par_moe_saved *sv, int64_t NR, int64_t d,
                                   int64_t I, double L)
{
    const xop rows_dy = {dyg, d, NULL}, rows_h = {sv->h, I, NULL}, rows_x = {xg, d, NULL};
    if (dW && dW->w2)
        xgemm(x, 1, 0, d, I, -1, rows_dy, d, rows_h, I, 1, (xop){NULL, 0, (const par_real *const *)dW->w2}, I);
    const int dw1 = dW && dW->w1, dw3 = dW && dW->w3;
    if (!dxg && !dw1 && !dw3 && !drwg)
        return PAR_OK;
    par_real *dh = par_calloc((size_t)(3 * NR * I), sizeof *dh, PAR_TAG_ACT);
    if (!dh)
        return par_err(PAR_ENOMEM, "moe expert backward: workspace of 3 x %lld x %lld", (long long)NR, (long long)I);
    par_real *dg = dh + NR * I, *du = dg + NR * I;
    xgemm(x, 0, 0, -1, I, d, rows_dy, d, (xop){NULL, 0, W->w2}, I, 1, (xop){dh, I, NULL}, I);
    PAR_FN(par_swiglu_backward)(dg, du, drwg, dh, sv->g, sv->u, rwg, NR, I, L);
    const par_real *dgs[2] = {dg, du};
    const par_real *const *ws[2] = {W->w1, W->w3};
    par_real *const *dws[2] = {dw1 ? dW->w1 : NULL, dw3 ? dW->w3 : NULL};
    for (int j = 0; j < 2; j++) { /* w1 then w3, as par_moe_expert_backward */
        if (dxg)
            xgemm(x, 0, 0, -1, d, I, (xop){dgs[j], I, NULL}, I, (xop){NULL, 0, ws[j]}, d, 1, (xop){dxg, d, NULL}, d);
        if (dws[j])
            xgemm(x, 1, 0, I, d, -1, (xop){dgs[j], I, NULL}, I, rows_x, d, 1,
                  (xop){NULL, 0, (const par_real *const *)dws[j]}, d);
    }
    par_free(dh);
    return PAR_OK;
}
#endif

par_status PAR_FN(par_moe_forward)(par_real *y,                /* [T, d] */
                                   par_moe_saved *sv,          /* from par_moe_saved_alloc(T,d,E,K,I) */
                                   const par_real *x,          /* [T, d] */
                                   const int32_t *idx,         /* [T, K] ascending */
                                   const par_real *w,          /* [T, K] */
                                   const par_moe_weights *W,
                                   int64_t T, int64_t d, int E, int K, int64_t I, double L)
{
    static const char fn[] = "moe forward";
    par_status st = check_dims(fn, T, d, E, K);
    if (!st)
        st = check_layer(fn, sv, W, T, d, E, K, I);
    if (!st)
        PAR_HOST_READ(idx, T * K); /* the row plan is made on the host */
    if (!st)
        st = check_idx(fn, idx, T, E, K);
    if (st)
        return st;
    if (T == 0)
        return PAR_OK;

    /* Gathered rows, expert-major, ascending t inside an expert (the row
     * plan on the host, the rows moved by gather_rows). */
    PAR_HOST_SET(sv->off, E + 1);
    PAR_HOST_SET(sv->tok, T * K);
    PAR_HOST_SET(sv->slot, T * K);
    int64_t *off = sv->off;
    memset(off, 0, ((size_t)E + 1) * sizeof *off);
    for (int64_t i = 0; i < T * K; i++)
        off[idx[i] + 1]++;
    for (int e = 0; e < E; e++)
        off[e + 1] += off[e];

    int64_t NR = T * K;
    size_t nws = (size_t)(NR * d) * 2 + (size_t)NR + (size_t)(T * d);
    par_real *xg = par_malloc(nws * sizeof *xg, PAR_TAG_ACT);
    int64_t *cur = par_malloc((size_t)E * sizeof *cur, PAR_TAG_ACT);
    if (!xg || !cur) {
        st = par_err(PAR_ENOMEM, "%s: workspace for T=%lld K=%d d=%lld", fn, (long long)T, K,
                     (long long)d);
        goto fail_free_ws;
    }
    par_real *yg = xg + NR * d;    /* [NR, d] expert outputs, gathered order */
    par_real *rwg = yg + NR * d;   /* [NR] */
    par_real *ysh = rwg + NR;      /* [T, d] shared expert output */
    memcpy(cur, off, (size_t)E * sizeof *cur);
    for (int64_t t = 0; t < T; t++) {
        for (int k = 0; k < K; k++) {
            int64_t p = cur[idx[t * K + k]]++;
            sv->tok[p] = (int32_t)t;
            sv->slot[p] = k;
        }
    }
    gather_rows(xg, NULL, rwg, x, NULL, w, sv->tok, sv->slot, NR, T, K, d);
    int grouped = 0;
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
    xgroup xgp;
    if ((grouped = xgroup_open(&xgp, off, E))) {
        experts_forward(&xgp, yg, sv, xg, rwg, W, NR, d, I, L);
        par_free(xgp.M);
    }
#endif
    for (int e = 0; !grouped && e < E; e++) {
        int64_t o = off[e], n = off[e + 1] - off[e];
        PAR_FN(par_moe_expert_forward)(yg + o * d, sv->g + o * I, sv->u + o * I, sv->h + o * I,
                                       xg + o * d, rwg + o, W->w1[e], W->w2[e], W->w3[e], n, d,
                                       I, L);
    }
    /* Slots: reuse xg as [T, K, d]. */
    par_real *slots = xg;
    scatter_rows(slots, yg, sv->tok, sv->slot, NR, K, d);
    if (has_shared(W))
        PAR_FN(par_moe_expert_forward)(ysh, sv->sg, sv->su, sv->sh, x, NULL, W->sw1, W->sw2,
                                       W->sw3, T, d, I, L);
    PAR_FN(par_moe_combine)(y, slots, has_shared(W) ? ysh : NULL, T, K, d, 0);
    st = PAR_OK;

fail_free_ws:
    par_free(cur);
    par_free(xg);
    return st;
}

par_status PAR_FN(par_moe_backward)(par_real *dx,               /* [T, d] or NULL */
                                    const par_moe_grads *dW,    /* or NULL */
                                    par_real *dw,               /* [T, K] or NULL */
                                    const par_real *dy,         /* [T, d] */
                                    const par_real *x,          /* [T, d] */
                                    const par_real *w,          /* [T, K] */
                                    const par_moe_weights *W,
                                    const par_moe_saved *sv,
                                    double L)
{
    static const char fn[] = "moe backward";
    int64_t T = sv->T, d = sv->d, I = sv->I;
    int E = sv->E, K = sv->K;
    par_status st = check_layer(fn, sv, W, T, d, E, K, I);
    if (st)
        return st;
    if (T == 0)
        return PAR_OK;

    int64_t NR = T * K;
    size_t nws = (size_t)(NR * d) * 3 + (size_t)NR * 2 + (size_t)(T * d);
    par_real *xg = par_calloc(nws, sizeof *xg, PAR_TAG_ACT);
    if (!xg)
        return par_err(PAR_ENOMEM, "%s: workspace for T=%lld K=%d d=%lld", fn, (long long)T, K,
                       (long long)d);
    par_real *dyg = xg + NR * d;  /* [NR, d] */
    par_real *dxg = dyg + NR * d; /* [NR, d], zero */
    par_real *rwg = dxg + NR * d; /* [NR] */
    par_real *drwg = rwg + NR;    /* [NR], zero */
    par_real *dxs = drwg + NR;    /* [T, d], zero */
    gather_rows(xg, dyg, rwg, x, dy, w, sv->tok, sv->slot, NR, T, K, d);
    int grouped = 0;
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
    xgroup xgp;
    if ((grouped = xgroup_open(&xgp, sv->off, E))) {
        st = experts_backward(&xgp, dx ? dxg : NULL, dW, dw ? drwg : NULL, dyg, xg, rwg, W, sv, NR, d, I, L);
        par_free(xgp.M);
        if (st)
            goto fail_free_ws;
    }
#endif
    for (int e = 0; !grouped && e < E; e++) {
        int64_t o = sv->off[e], n = sv->off[e + 1] - sv->off[e];
        par_real *g1 = dW && dW->w1 ? dW->w1[e] : NULL;
        par_real *g2 = dW && dW->w2 ? dW->w2[e] : NULL;
        par_real *g3 = dW && dW->w3 ? dW->w3[e] : NULL;
        st = PAR_FN(par_moe_expert_backward)(dx ? dxg + o * d : NULL, g1, g2, g3,
                                             dw ? drwg + o : NULL, dyg + o * d, xg + o * d,
                                             rwg + o, W->w1[e], W->w2[e], W->w3[e], sv->g + o * I,
                                             sv->u + o * I, sv->h + o * I, n, d, I, L);
        if (st)
            goto fail_free_ws;
    }
    if (has_shared(W)) {
        st = PAR_FN(par_moe_expert_backward)(dx ? dxs : NULL, dW ? dW->sw1 : NULL,
                                             dW ? dW->sw2 : NULL, dW ? dW->sw3 : NULL, NULL, dy, x,
                                             NULL, W->sw1, W->sw2, W->sw3, sv->sg, sv->su, sv->sh,
                                             T, d, I, L);
        if (st)
            goto fail_free_ws;
    }
    if (dx) {
        par_real *slots = xg; /* [T, K, d] */
        scatter_rows(slots, dxg, sv->tok, sv->slot, NR, K, d);
        PAR_FN(par_moe_combine)(dx, slots, has_shared(W) ? dxs : NULL, T, K, d, 1);
    }
    if (dw) {
        /* every (t, k) slot is one gathered row: no two rows meet */
        PAR_DEV_BEGIN();
        const int32_t *tok = PAR_DIN_AS(sv->tok, NR), *slot = PAR_DIN_AS(sv->slot, NR);
        const par_real *dr = PAR_DIN_AS(drwg, NR);
        par_real *dw_d = PAR_DINOUT_AS(dw, NR);
        PAR_KLOOP(is_device_ptr(tok, slot, dr, dw_d))
        for (int64_t p = 0; p < NR; p++)
            dw_d[(int64_t)tok[p] * K + slot[p]] += dr[p];
    }
    st = PAR_OK;

fail_free_ws:
    par_free(xg);
    return st;
}

/* ------------------------------------------------------------- balance -- */

void PAR_FN(par_moe_count_loads)(int64_t *loads,      /* [E] */
                                 const int32_t *idx,  /* [T, K] */
                                 int64_t T, int E, int K)
{
    PAR_HOST_READ(idx, T * K);
    PAR_HOST_WRITE(loads, E);
    for (int64_t i = 0; i < T * K; i++)
        if (idx[i] >= 0 && idx[i] < E)
            loads[idx[i]]++;
}

static par_status check_sample(const char *fn, const int32_t *sample_of, int64_t t, int64_t Ns)
{
    if (sample_of[t] < 0 || sample_of[t] >= Ns)
        return par_err(PAR_ERANGE, "%s: sample_of[%lld] = %d outside [0, Ns=%lld)", fn,
                       (long long)t, (int)sample_of[t], (long long)Ns);
    return PAR_OK;
}

par_status PAR_FN(par_moe_aux_stats)(int64_t *cnt,             /* [Ns, E] */
                                     par_real *psum,           /* [Ns, E] */
                                     int64_t *ntok,            /* [Ns] */
                                     const par_real *s,        /* [T, E] */
                                     const int32_t *idx,       /* [T, K] */
                                     const int32_t *sample_of, /* [T] */
                                     int64_t T, int E, int K, int64_t Ns)
{
    static const char fn[] = "moe aux stats";
    PAR_HOST_READ(s, T * E); /* statistics are summed on the host */
    PAR_HOST_READ(idx, T * K);
    PAR_HOST_READ(sample_of, T);
    PAR_HOST_WRITE(cnt, Ns * E);
    PAR_HOST_WRITE(psum, Ns * E);
    PAR_HOST_WRITE(ntok, Ns);
    for (int64_t t = 0; t < T; t++) {
        par_status st = check_sample(fn, sample_of, t, Ns);
        if (st)
            return st;
        int64_t q = sample_of[t];
        const par_real *st_ = s + t * E;
        par_real S = 0;
        for (int e = 0; e < E; e++)
            S += st_[e];
        if (!(S > 0))
            return par_err(PAR_ERANGE, "%s: row %lld: the scores sum to %g (must be > 0)", fn,
                           (long long)t, (double)S);
        for (int e = 0; e < E; e++)
            psum[q * E + e] += st_[e] / S;
        for (int k = 0; k < K; k++) {
            int32_t e = idx[t * K + k];
            if (e < 0 || e >= E)
                return par_err(PAR_ERANGE, "%s: idx[%lld][%d] = %d outside [0, E=%d)", fn,
                               (long long)t, k, (int)e, E);
            cnt[q * E + e]++;
        }
        ntok[q]++;
    }
    return PAR_OK;
}

par_real PAR_FN(par_moe_aux_loss)(const int64_t *cnt,   /* [Ns, E] */
                                  const par_real *psum, /* [Ns, E] */
                                  const int64_t *ntok,  /* [Ns] */
                                  int64_t Ns, int64_t Ns_global, int E, int K)
{
    par_real total = 0;
    for (int64_t q = 0; q < Ns; q++) {
        if (ntok[q] <= 0)
            continue;
        par_real Tq = (par_real)ntok[q];
        par_real fs = (par_real)E / ((par_real)K * Tq); /* f_e = fs * cnt */
        par_real inner = 0;
        for (int e = 0; e < E; e++)
            inner += fs * (par_real)cnt[q * E + e] * (psum[q * E + e] / Tq);
        total += inner;
    }
    return Ns_global > 0 ? total / (par_real)Ns_global : 0;
}

PAR_DECLARE_TARGET
/* Row t of the aux-loss backward: 0, or 1 its sample is outside [0, Ns),
 * 2 its sample has no tokens, 3 its scores do not sum to > 0. */
static int aux_row(par_real *dst, const int64_t *cnt, const int64_t *ntok, const par_real *st_,
                   const int32_t *sample_of, int64_t t, int E, int K, int64_t Ns,
                   int64_t Ns_global, double scale)
{
    if (sample_of[t] < 0 || sample_of[t] >= Ns)
        return 1;
    int64_t q = sample_of[t];
    if (ntok[q] <= 0)
        return 2;
    double Tq = (double)ntok[q];
    par_real coef = (par_real)(scale * E / ((double)Ns_global * K * Tq * Tq));
    const int64_t *cq = cnt + q * E;
    par_real S = 0, dot = 0;
    for (int e = 0; e < E; e++)
        S += st_[e];
    if (!(S > 0))
        return 3;
    for (int e = 0; e < E; e++)
        dot += coef * (par_real)cq[e] * (st_[e] / S);
    for (int e = 0; e < E; e++)
        dst[e] += (coef * (par_real)cq[e] - dot) / S;
    return 0;
}
PAR_END_DECLARE_TARGET

par_status PAR_FN(par_moe_aux_backward)(par_real *ds_extra,       /* [T, E] */
                                        const int64_t *cnt,       /* [Ns, E] */
                                        const int64_t *ntok,      /* [Ns] */
                                        const par_real *s,        /* [T, E] */
                                        const int32_t *sample_of, /* [T] */
                                        int64_t T, int E, int K, int64_t Ns,
                                        int64_t Ns_global, double scale)
{
    static const char fn[] = "moe aux backward";
    if (Ns_global <= 0)
        return par_err(PAR_EINVAL, "%s: Ns_global must be > 0 (got %lld)", fn,
                       (long long)Ns_global);
    if (T <= 0)
        return PAR_OK;
    int32_t *why = par_malloc((size_t)T * sizeof *why, PAR_TAG_ACT);
    if (!why)
        return par_err(PAR_ENOMEM, "%s: %lld row codes", fn, (long long)T);
    PAR_DEV_BEGIN();
    const int64_t *cnt_d = PAR_DIN_AS(cnt, Ns * E), *ntok_d = PAR_DIN_AS(ntok, Ns);
    const par_real *s_d = PAR_DIN_AS(s, T * E);
    const int32_t *smp_d = PAR_DIN_AS(sample_of, T);
    par_real *ds_d = PAR_DINOUT_AS(ds_extra, T * E);
    int32_t *why_d = PAR_DOUT_AS(why, T);
    PAR_KLOOP(is_device_ptr(cnt_d, ntok_d, s_d, smp_d, ds_d, why_d))
    for (int64_t t = 0; t < T; t++)
        why_d[t] = aux_row(ds_d + t * E, cnt_d, ntok_d, s_d + t * E, smp_d, t, E, K, Ns,
                           Ns_global, scale);
    PAR_HOST_READ(why, T);
    par_status st = PAR_OK;
    for (int64_t t = 0; t < T && !st; t++) {
        if (!why[t])
            continue;
        PAR_HOST_READ(sample_of, T);
        if (why[t] == 1) {
            st = check_sample(fn, sample_of, t, Ns);
        } else if (why[t] == 2) {
            PAR_HOST_READ(ntok, Ns);
            int64_t q = sample_of[t];
            st = par_err(PAR_EINVAL, "%s: token %lld is in sample %lld whose count is %lld", fn,
                         (long long)t, (long long)q, (long long)ntok[q]);
        } else {
            PAR_HOST_READ(s, T * E);
            par_real S = 0;
            for (int e = 0; e < E; e++)
                S += s[t * E + e];
            st = par_err(PAR_ERANGE, "%s: row %lld: the scores sum to %g (must be > 0)", fn,
                         (long long)t, (double)S);
        }
    }
    par_free(why);
    return st;
}
