/* Kernels: the V4 hybrid attention layer, f64 (kernels/attention.h).
 *
 * - forward against a naive reference written from MODEL.md section 3 with
 *   explicit loops (m = 0, 4, 8);
 * - finite differences of sum(y * G) wrt x and every non-indexer weight
 *   (m = 0, 4, 8), indexer gradient slots untouched;
 * - m = 4 with topk >= every visible count equals attending to all visible;
 * - causality: perturbing one token changes nothing earlier in its sample
 *   and nothing in other samples (bitwise);
 * - two runs bitwise equal; bad dims / positions are refused.
 */
#include <criterion/criterion.h>

#include "attn_weights.h"
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"
#include "core/status.h"
#include "fd.h"
#include "kernels/attention.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef par_attn_weights_f64 wts;
typedef par_attn_saved_f64 svd;

enum { NW = PAR_TEST_ATTN_NW };

typedef struct {
    par_attn_dims dm;
    par_rope rope;
    int64_t T;
    int32_t *pos;
    double *x, *y, *G, *dx;
    wts W, dW;
    double *wbuf, *dwbuf;
    svd s;
    void *sbuf;
    int32_t *sel;
} layer;

/* rows of S = 20 tokens: [2, 11, 7] and [17, 3] (a sample shorter than the
 * window, lengths not multiples of m, several samples per row) */
static const int sample_len[] = {2, 11, 7, 17, 3};

/* tmpl: dims to use (NULL: the small test dims); lens: sample lengths */
static void layer_init_ex(layer *L, const par_attn_dims *tmpl, int64_t m, int64_t topk,
                          uint64_t seed, const int *lens, size_t nlens)
{
    memset(L, 0, sizeof *L);
    par_attn_dims *dm = &L->dm;
    if (tmpl) {
        *dm = *tmpl;
    } else {
        dm->d = 8, dm->H = 2, dm->hd = 8, dm->rd = 4, dm->q_lora = 6, dm->o_groups = 2;
        dm->o_lora = 3, dm->window = 3, dm->iH = 2, dm->ihd = 8;
        dm->norm_eps = 1e-6;
    }
    dm->m = m, dm->topk = topk;
    if (m > 0)
        par_rope_init(&L->rope, (int)dm->rd, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    else
        par_rope_init(&L->rope, (int)dm->rd, 10000.0, 0, 16.0, 65536, 32.0, 1.0);
    dm->rope = &L->rope;
    int64_t T = 0;
    for (size_t i = 0; i < nlens; i++)
        T += lens[i];
    L->T = T;
    L->pos = malloc((size_t)T * sizeof(int32_t));
    int64_t t = 0;
    for (size_t i = 0; i < nlens; i++)
        for (int p = 0; p < lens[i]; p++)
            L->pos[t++] = p;
    const int64_t d = dm->d;
    L->x = malloc((size_t)(T * d) * sizeof(double));
    L->y = malloc((size_t)(T * d) * sizeof(double));
    L->G = malloc((size_t)(T * d) * sizeof(double));
    L->dx = calloc((size_t)(T * d), sizeof(double));
    par_philox_key kx = par_rng_key(seed, "x"), kg = par_rng_key(seed, "G");
    for (int64_t i = 0; i < T * d; i++) {
        L->x[i] = 2 * par_rng_uniform(kx, (uint64_t)i, 0) - 1;
        L->G[i] = par_rng_normal(kg, (uint64_t)i, 0);
    }
    int64_t tot = 0;
    for (int k = 0; k < NW; k++)
        tot += wcount(dm, k, NULL);
    L->wbuf = malloc((size_t)tot * sizeof(double));
    L->dwbuf = calloc((size_t)tot, sizeof(double));
    int64_t off = 0;
    for (int k = 0; k < NW; k++) {
        int64_t fan, n = wcount(dm, k, &fan);
        if (!n)
            continue;
        *wslot(&L->W, k) = L->wbuf + off;
        *wslot(&L->dW, k) = L->dwbuf + off;
        par_philox_key kw = par_rng_key(seed, wname[k]);
        for (int64_t i = 0; i < n; i++) {
            double u = 2 * par_rng_uniform(kw, (uint64_t)i, 0) - 1;
            double v;
            if (fan)
                v = u * 1.5 / sqrt((double)fan);
            else if (strstr(wname[k], "norm"))
                v = 1 + 0.3 * u;
            else
                v = u; /* attn_sink, ape */
            L->wbuf[off + i] = v;
        }
        off += n;
    }
    L->sbuf = malloc(par_attn_saved_bytes_f64(dm, T) + 64);
    par_attn_saved_carve_f64(&L->s, (void *)(((uintptr_t)L->sbuf + 63) & ~(uintptr_t)63), dm, T);
    L->sel = m == 4 ? malloc((size_t)(T * topk) * sizeof(int32_t)) : NULL;
}

static void layer_init(layer *L, int64_t m, int64_t topk, uint64_t seed)
{
    layer_init_ex(L, NULL, m, topk, seed, sample_len, sizeof sample_len / sizeof *sample_len);
}

static void layer_free(layer *L)
{
    free(L->pos);
    free(L->x);
    free(L->y);
    free(L->G);
    free(L->dx);
    free(L->wbuf);
    free(L->dwbuf);
    free(L->sbuf);
    free(L->sel);
}

static void layer_fwd(layer *L)
{
    par_status st = par_attn_forward_f64(L->y, &L->s, L->sel, L->x, L->pos, &L->W, &L->dm, L->T);
    cr_assert_eq(st, PAR_OK, "forward: %s", par_last_error());
}

static double objective(void *ctx)
{
    layer *L = ctx;
    layer_fwd(L);
    double s = 0;
    for (int64_t i = 0; i < L->T * L->dm.d; i++)
        s += L->y[i] * L->G[i];
    return s;
}

/* ---------------------------------------------------------------- naive */

static void nrope(double *v, int64_t D, double p, const par_rope *r, double sign)
{
    for (int i = 0; i < r->rd / 2; i++) {
        double ang = sign * p * r->freq[i];
        double *e = v + D - r->rd + 2 * i;
        double a = e[0], b = e[1];
        e[0] = a * cos(ang) - b * sin(ang);
        e[1] = a * sin(ang) + b * cos(ang);
    }
}

static void nrms(double *v, int64_t n, const double *w, double eps)
{
    double ms = 0;
    for (int64_t i = 0; i < n; i++)
        ms += v[i] * v[i];
    double r = 1 / sqrt(ms / n + eps);
    for (int64_t i = 0; i < n; i++)
        v[i] = v[i] * r * (w ? w[i] : 1);
}

static void nlin(double *out, const double *in, const double *w, int64_t K, int64_t N)
{
    for (int64_t o = 0; o < N; o++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
            s += w[o * K + k] * in[k];
        out[o] = s;
    }
}

/* MODEL.md section 3 with explicit loops.  For m == 4 the key set uses
 * `sel` (the selection under test is checked separately). */
static void naive_forward(double *y, const layer *L, const int32_t *sel)
{
    const par_attn_dims *dm = &L->dm;
    const int64_t T = L->T, d = dm->d, H = dm->H, hd = dm->hd, m = dm->m, ql = dm->q_lora;
    const int64_t G = dm->o_groups, ol = dm->o_lora, Dg = H * hd / G;
    const wts *W = &L->W;
    double *q = calloc((size_t)(T * H * hd), sizeof(double));
    double *kv = calloc((size_t)(T * hd), sizeof(double));
    double *ent = calloc((size_t)(T * hd), sizeof(double)); /* at block-last rows */
    double qa[256], qb[512], o[512], r[256], z[256], a[256], zz[256];
    for (int64_t t = 0; t < T; t++) {
        const double *xt = L->x + t * d;
        nlin(qa, xt, W->wq_a, d, ql);
        nrms(qa, ql, W->q_norm, dm->norm_eps);
        nlin(qb, qa, W->wq_b, ql, H * hd);
        for (int64_t h = 0; h < H; h++) {
            nrms(qb + h * hd, hd, NULL, dm->norm_eps);
            nrope(qb + h * hd, hd, L->pos[t], dm->rope, 1);
        }
        memcpy(q + t * H * hd, qb, (size_t)(H * hd) * sizeof(double));
        nlin(kv + t * hd, xt, W->wkv, d, hd);
        nrms(kv + t * hd, hd, W->kv_norm, dm->norm_eps);
        nrope(kv + t * hd, hd, L->pos[t], dm->rope, 1);
    }
    if (m > 0) {
        const int64_t coff = m == 4 ? 2 : 1, c = hd, nc = coff * c;
        for (int64_t t = 0; t < T; t++) {
            int64_t p = L->pos[t];
            if ((p + 1) % m)
                continue;
            int64_t i = p / m, b = t - m + 1;
            double *C = ent + t * hd;
            for (int64_t ch = 0; ch < c; ch++) {
                /* slots: (a, z) values of this channel */
                int ns = 0;
                for (int64_t j = 0; j < (m == 4 && i > 0 ? m : 0); j++) {
                    int64_t tt = b - m + j;
                    nlin(a, L->x + tt * d, W->cmp_wkv, d, nc);
                    nlin(zz, L->x + tt * d, W->cmp_wgate, d, nc);
                    z[ns] = zz[ch] + W->cmp_ape[j * nc + ch];
                    z[128 + ns] = a[ch];
                    ns++;
                }
                for (int64_t j = 0; j < m; j++) {
                    int64_t tt = b + j, col = m == 4 ? c + ch : ch;
                    nlin(a, L->x + tt * d, W->cmp_wkv, d, nc);
                    nlin(zz, L->x + tt * d, W->cmp_wgate, d, nc);
                    z[ns] = zz[col] + W->cmp_ape[j * nc + col];
                    z[128 + ns] = a[col];
                    ns++;
                }
                double mx = -INFINITY, sum = 0, acc = 0;
                for (int s = 0; s < ns; s++)
                    mx = fmax(mx, z[s]);
                for (int s = 0; s < ns; s++)
                    sum += exp(z[s] - mx);
                for (int s = 0; s < ns; s++)
                    acc += exp(z[s] - mx) / sum * z[128 + s];
                C[ch] = acc;
            }
            nrms(C, hd, W->cmp_norm, dm->norm_eps);
            nrope(C, hd, (double)(i * m), dm->rope, 1);
        }
    }
    const double scale = 1 / sqrt((double)hd);
    for (int64_t t = 0; t < T; t++) {
        int64_t p = L->pos[t], s0 = t - p;
        const double *keys[256];
        int nk = 0;
        for (int64_t j = (p - dm->window + 1 > 0 ? p - dm->window + 1 : 0); j <= p; j++)
            keys[nk++] = kv + (s0 + j) * hd;
        if (m > 0)
            for (int64_t i = 0; i < (p + 1) / m; i++) {
                int take = 1;
                if (m == 4) {
                    take = 0;
                    for (int64_t k = 0; k < dm->topk; k++)
                        take |= sel[t * dm->topk + k] == i;
                }
                if (take)
                    keys[nk++] = ent + (s0 + (i + 1) * m - 1) * hd;
            }
        for (int64_t h = 0; h < H; h++) {
            double den = exp(W->attn_sink[h]);
            for (int k = 0; k < nk; k++) {
                double dt = 0;
                for (int64_t e = 0; e < hd; e++)
                    dt += q[(t * H + h) * hd + e] * keys[k][e];
                z[k] = exp(dt * scale);
                den += z[k];
            }
            for (int64_t e = 0; e < hd; e++) {
                double acc = 0;
                for (int k = 0; k < nk; k++)
                    acc += z[k] / den * keys[k][e];
                o[h * hd + e] = acc;
            }
            nrope(o + h * hd, hd, p, dm->rope, -1);
        }
        for (int64_t g = 0; g < G; g++)
            nlin(r + g * ol, o + g * Dg, W->wo_a + g * ol * Dg, Dg, ol);
        nlin(y + t * d, r, W->wo_b, G * ol, d);
    }
    free(q);
    free(kv);
    free(ent);
}

/* -------------------------------------------------------------- tests */

static void forward_vs_naive(int64_t m)
{
    layer L;
    layer_init(&L, m, 2, 11);
    layer_fwd(&L);
    double *yn = malloc((size_t)(L.T * L.dm.d) * sizeof(double));
    naive_forward(yn, &L, L.sel);
    double worst = 0;
    for (int64_t i = 0; i < L.T * L.dm.d; i++)
        worst = fmax(worst, fabs(yn[i] - L.y[i]));
    cr_assert(worst < 1e-12, "m=%lld: forward differs from the naive reference by %g",
              (long long)m, worst);
    free(yn);
    layer_free(&L);
}

Test(attention, forward_matches_naive_m0) { forward_vs_naive(0); }
Test(attention, forward_matches_naive_m4) { forward_vs_naive(4); }
Test(attention, forward_matches_naive_m8) { forward_vs_naive(8); }

static void fd_case(int64_t m)
{
    layer L;
    layer_init(&L, m, 2, 7);
    /* sentinels in the indexer gradient slots: they must stay untouched */
    for (int k = 12; k < NW; k++) {
        int64_t n = wcount(&L.dm, k, NULL);
        for (int64_t i = 0; i < n; i++)
            (*wslot(&L.dW, k))[i] = 7.25;
    }
    layer_fwd(&L);
    par_status st = par_attn_backward_f64(L.dx, &L.dW, L.G, &L.s, L.x, L.pos, &L.W, &L.dm, L.T);
    cr_assert_eq(st, PAR_OK, "backward: %s", par_last_error());
    char label[64];
    snprintf(label, sizeof label, "m%lld.x", (long long)m);
    double e = fd_check(label, L.x, (size_t)(L.T * L.dm.d), L.dx, objective, &L, 1e-5, 0);
    cr_assert(e < 1e-7, "m=%lld: dx FD error %g", (long long)m, e);
    for (int k = 0; k < 12; k++) {
        int64_t n = wcount(&L.dm, k, NULL);
        if (!n)
            continue;
        snprintf(label, sizeof label, "m%lld.%s", (long long)m, wname[k]);
        e = fd_check(label, *wslot(&L.W, k), (size_t)n, *wslot(&L.dW, k), objective, &L, 1e-5, 0);
        cr_assert(e < 1e-7, "m=%lld: d%s FD error %g", (long long)m, wname[k], e);
        double nrm = 0;
        for (int64_t i = 0; i < n; i++)
            nrm += fabs((*wslot(&L.dW, k))[i]);
        cr_assert(nrm > 0, "m=%lld: d%s is all zero", (long long)m, wname[k]);
    }
    for (int k = 12; k < NW; k++) {
        int64_t n = wcount(&L.dm, k, NULL);
        for (int64_t i = 0; i < n; i++)
            cr_assert((*wslot(&L.dW, k))[i] == 7.25, "m=%lld: indexer grad %s[%lld] touched",
                      (long long)m, wname[k], (long long)i);
    }
    layer_free(&L);
}

Test(attention, fd_m0) { fd_case(0); }
Test(attention, fd_m4) { fd_case(4); }
Test(attention, fd_m8) { fd_case(8); }

Test(attention, fd_m4_selection_matters)
{
    /* the m = 4 layer above must really drop entries: some query sees more
     * visible entries than topk = 2 */
    layer L;
    layer_init(&L, 4, 2, 7);
    layer_fwd(&L);
    int dropped = 0;
    for (int64_t t = 0; t < L.T; t++)
        dropped |= (L.pos[t] + 1) / 4 > 2;
    cr_assert(dropped);
    layer_free(&L);
}

Test(attention, m4_topk_covering_all_equals_all_visible)
{
    layer L;
    layer_init(&L, 4, 64, 5);
    layer_fwd(&L);
    /* the picks: exactly every visible entry, ascending, then -1 */
    int32_t *all = malloc((size_t)(L.T * 64) * sizeof(int32_t));
    for (int64_t t = 0; t < L.T; t++) {
        int64_t nv = (L.pos[t] + 1) / 4;
        for (int64_t k = 0; k < 64; k++) {
            all[t * 64 + k] = k < nv ? (int32_t)k : -1;
            cr_assert_eq(L.sel[t * 64 + k], all[t * 64 + k], "t %lld k %lld", (long long)t,
                         (long long)k);
        }
    }
    /* the layer equals the naive layer attending to every visible entry */
    double *yn = malloc((size_t)(L.T * L.dm.d) * sizeof(double));
    naive_forward(yn, &L, all);
    for (int64_t i = 0; i < L.T * L.dm.d; i++)
        cr_assert(fabs(yn[i] - L.y[i]) < 1e-12, "y[%lld] %g vs %g", (long long)i, L.y[i], yn[i]);
    /* and the phase-(4) core given the all-visible list directly is bitwise the same */
    double *o2 = malloc((size_t)(L.T * L.dm.H * L.dm.hd) * sizeof(double));
    double *lse2 = malloc((size_t)(L.T * L.dm.H) * sizeof(double));
    cr_assert_eq(par_attn_core_forward_f64(o2, lse2, L.s.q, L.s.kv, L.s.cmp, all, L.pos,
                                           L.W.attn_sink, &L.dm, 0, L.T),
                 PAR_OK);
    cr_assert(memcmp(o2, L.s.o, (size_t)(L.T * L.dm.H * L.dm.hd) * sizeof(double)) == 0);
    free(o2);
    free(lse2);
    free(yn);
    free(all);
    layer_free(&L);
}

static void causality_case(int64_t m)
{
    layer L;
    layer_init(&L, m, 2, 3);
    layer_fwd(&L);
    const int64_t T = L.T, d = L.dm.d;
    double *y0 = malloc((size_t)(T * d) * sizeof(double));
    memcpy(y0, L.y, (size_t)(T * d) * sizeof(double));
    for (int64_t tp = 0; tp < T; tp += 3) {
        int64_t s0 = tp - L.pos[tp], s1 = tp;
        while (s1 + 1 < T && L.pos[s1 + 1] != 0)
            s1++;
        double xsave[64];
        memcpy(xsave, L.x + tp * d, (size_t)d * sizeof(double));
        for (int64_t e = 0; e < d; e++)
            L.x[tp * d + e] += 0.37;
        layer_fwd(&L);
        int changed_self = 0;
        for (int64_t t = 0; t < T; t++) {
            int must_equal = t < s0 || t > s1 || t < tp;
            int eq = memcmp(y0 + t * d, L.y + t * d, (size_t)d * sizeof(double)) == 0;
            if (must_equal)
                cr_assert(eq, "m=%lld: perturbing token %lld changed y at %lld", (long long)m,
                          (long long)tp, (long long)t);
            if (t == tp)
                changed_self = !eq;
        }
        cr_assert(changed_self, "m=%lld: perturbing token %lld left its own y unchanged",
                  (long long)m, (long long)tp);
        memcpy(L.x + tp * d, xsave, (size_t)d * sizeof(double));
    }
    free(y0);
    layer_free(&L);
}

Test(attention, causality_m0) { causality_case(0); }
Test(attention, causality_m4) { causality_case(4); }
Test(attention, causality_m8) { causality_case(8); }

Test(attention, deterministic_twice)
{
    layer A, B;
    layer_init(&A, 4, 2, 9);
    layer_init(&B, 4, 2, 9);
    layer_fwd(&A);
    layer_fwd(&B);
    cr_assert(memcmp(A.y, B.y, (size_t)(A.T * A.dm.d) * sizeof(double)) == 0);
    cr_assert_eq(par_attn_backward_f64(A.dx, &A.dW, A.G, &A.s, A.x, A.pos, &A.W, &A.dm, A.T), 0);
    cr_assert_eq(par_attn_backward_f64(B.dx, &B.dW, B.G, &B.s, B.x, B.pos, &B.W, &B.dm, B.T), 0);
    cr_assert(memcmp(A.dx, B.dx, (size_t)(A.T * A.dm.d) * sizeof(double)) == 0);
    int64_t tot = 0;
    for (int k = 0; k < NW; k++)
        tot += wcount(&A.dm, k, NULL);
    cr_assert(memcmp(A.dwbuf, B.dwbuf, (size_t)tot * sizeof(double)) == 0);
    cr_assert_eq(par_alloc_live(PAR_TAG_ACT), 0, "scratch left allocated");
    layer_free(&A);
    layer_free(&B);
}

Test(attention, refuses_bad_dims_and_positions)
{
    par_err_set_quiet(1);
    layer L;
    layer_init(&L, 8, 2, 1);
    L.dm.o_groups = 3; /* does not divide H = 2 */
    cr_assert_eq(par_attn_forward_f64(L.y, &L.s, NULL, L.x, L.pos, &L.W, &L.dm, L.T), PAR_EINVAL);
    L.dm.o_groups = 2;
    L.dm.m = 3;
    cr_assert_eq(par_attn_forward_f64(L.y, &L.s, NULL, L.x, L.pos, &L.W, &L.dm, L.T), PAR_EINVAL);
    L.dm.m = 8;
    L.pos[5] = 7; /* neither 0 nor pos[4] + 1 */
    cr_assert_eq(par_attn_forward_f64(L.y, &L.s, NULL, L.x, L.pos, &L.W, &L.dm, L.T), PAR_EINVAL);
    par_err_set_quiet(0);
    layer_free(&L);
}

/* Phase (4) on query / key sub-ranges (reading halos before them) gives
 * bitwise the same rows as one whole-batch call. */
static void ranges_case(int64_t m)
{
    layer L;
    layer_init(&L, m, 2, 13);
    layer_fwd(&L);
    const int64_t T = L.T, HD = L.dm.H * L.dm.hd, hd = L.dm.hd, H = L.dm.H;
    const int64_t cut = 17; /* inside the 11-token sample */
    double *o = calloc((size_t)(T * HD), sizeof(double)), *lse = calloc((size_t)(T * H), 8);
    cr_assert_eq(par_attn_core_forward_f64(o, lse, L.s.q, L.s.kv, L.s.cmp, L.s.sel, L.pos,
                                           L.W.attn_sink, &L.dm, cut, T), 0);
    cr_assert_eq(par_attn_core_forward_f64(o, lse, L.s.q, L.s.kv, L.s.cmp, L.s.sel, L.pos,
                                           L.W.attn_sink, &L.dm, 0, cut), 0);
    cr_assert(memcmp(o, L.s.o, (size_t)(T * HD) * sizeof(double)) == 0);
    cr_assert(memcmp(lse, L.s.lse, (size_t)(T * H) * sizeof(double)) == 0);

    double *dO = malloc((size_t)(T * HD) * sizeof(double));
    for (int64_t i = 0; i < T * HD; i++)
        dO[i] = sin(0.7 * (double)i);
    double *buf[2][6];
    for (int w = 0; w < 2; w++) {
        buf[w][0] = calloc((size_t)(T * HD), 8); /* dq */
        buf[w][1] = calloc((size_t)H, 8);        /* dsink */
        buf[w][2] = calloc((size_t)(T * HD), 8); /* dop */
        buf[w][3] = calloc((size_t)(T * H), 8);  /* D */
        buf[w][4] = calloc((size_t)(T * hd), 8); /* dkv */
        buf[w][5] = calloc((size_t)(T * hd), 8); /* dcmp */
    }
    double *const *B0 = buf[0], *const *B1 = buf[1];
    cr_assert_eq(par_attn_core_backward_q_f64(B0[0], B0[1], B0[2], B0[3], dO, L.s.lse, L.s.q,
                                              L.s.kv, L.s.cmp, L.s.sel, L.pos, L.W.attn_sink,
                                              &L.dm, 0, T), 0);
    par_attn_core_backward_kv_f64(B0[4], m ? B0[5] : NULL, B0[2], B0[3], L.s.lse, L.s.q, L.s.kv,
                                  L.s.cmp, L.s.sel, L.pos, &L.dm, 0, T, T);
    for (int part = 0; part < 2; part++) {
        int64_t a = part ? cut : 0, b = part ? T : cut;
        cr_assert_eq(par_attn_core_backward_q_f64(B1[0], B1[1], B1[2], B1[3], dO, L.s.lse, L.s.q,
                                                  L.s.kv, L.s.cmp, L.s.sel, L.pos, L.W.attn_sink,
                                                  &L.dm, a, b), 0);
    }
    for (int part = 0; part < 2; part++) {
        int64_t a = part ? cut : 0, b = part ? T : cut;
        par_attn_core_backward_kv_f64(B1[4], m ? B1[5] : NULL, B1[2], B1[3], L.s.lse, L.s.q,
                                      L.s.kv, L.s.cmp, L.s.sel, L.pos, &L.dm, a, b, T);
    }
    const int64_t n[6] = {T * HD, H, T * HD, T * H, T * hd, T * hd};
    for (int k = 0; k < 6; k++)
        if (k != 1) /* dsink: summed per range, so only close */
            cr_assert(memcmp(B0[k], B1[k], (size_t)n[k] * sizeof(double)) == 0, "array %d", k);
    for (int64_t h = 0; h < H; h++)
        cr_assert(fabs(B0[1][h] - B1[1][h]) < 1e-13);
    double nz = 0;
    for (int64_t i = 0; i < T * hd; i++)
        nz += fabs(B0[4][i]) + fabs(B0[5][i]);
    cr_assert(nz > 0);
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < 6; k++)
            free(buf[w][k]);
    free(dO);
    free(o);
    free(lse);
    layer_free(&L);
}

Test(attention, core_ranges_m0) { ranges_case(0); }
Test(attention, core_ranges_m4) { ranges_case(4); }
Test(attention, core_ranges_m8) { ranges_case(8); }

/* Large enough for the OpenMP paths: 1 and 2 threads give the same bits. */
static void threads_case(int64_t m)
{
#ifdef _OPENMP
    static const int lens[] = {64, 40, 24, 64, 64};
    par_attn_dims big = {.d = 32, .H = 4, .hd = 32, .rd = 8, .q_lora = 16, .o_groups = 2,
                         .o_lora = 8, .window = 16, .iH = 2, .ihd = 16, .norm_eps = 1e-6};
    layer A, B;
    layer_init_ex(&A, &big, m, 8, 17, lens, 5);
    layer_init_ex(&B, &big, m, 8, 17, lens, 5);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    layer_fwd(&A);
    cr_assert_eq(par_attn_backward_f64(A.dx, &A.dW, A.G, &A.s, A.x, A.pos, &A.W, &A.dm, A.T), 0);
    omp_set_num_threads(2);
    layer_fwd(&B);
    cr_assert_eq(par_attn_backward_f64(B.dx, &B.dW, B.G, &B.s, B.x, B.pos, &B.W, &B.dm, B.T), 0);
    omp_set_num_threads(saved);
    cr_assert(memcmp(A.y, B.y, (size_t)(A.T * A.dm.d) * sizeof(double)) == 0);
    cr_assert(memcmp(A.dx, B.dx, (size_t)(A.T * A.dm.d) * sizeof(double)) == 0);
    int64_t tot = 0;
    for (int k = 0; k < NW; k++)
        tot += wcount(&A.dm, k, NULL);
    cr_assert(memcmp(A.dwbuf, B.dwbuf, (size_t)tot * sizeof(double)) == 0);
    /* and the forward still matches the naive reference at this size */
    double *yn = malloc((size_t)(A.T * A.dm.d) * sizeof(double));
    naive_forward(yn, &A, A.sel);
    for (int64_t i = 0; i < A.T * A.dm.d; i++)
        cr_assert(fabs(yn[i] - A.y[i]) < 1e-11, "y[%lld] %g vs %g", (long long)i, A.y[i], yn[i]);
    free(yn);
    layer_free(&A);
    layer_free(&B);
#else
    (void)m;
#endif
}

Test(attention, threads_bitwise_m4) { threads_case(4); }
Test(attention, threads_bitwise_m16) { threads_case(16); }
