/* Kernels: MoE gate, expert, serial layer, balance statistics and aux loss
 * (kernels/moe.h), f64, checked against finite differences and naive loops. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "fd.h"
#include "kernels/moe.h"
#include "kernels/ops.h"

#define D 5
#define E 6
#define K 2
#define I 4
#define T 9
#define V 13
#define RS 2.5
#define FDH 1e-6
#define FDTOL 1e-6

/* Deterministic uniform(-1, 1) stream (splitmix64). */
static uint64_t rs_state;
static void seed(uint64_t s) { rs_state = s; }
static double urand(void)
{
    uint64_t z = (rs_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static void fill(double *a, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        a[i] = scale * urand();
}
static double dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void check_no_leaks(void)
{
    cr_expect_eq(par_alloc_live_total(), 0, "live bytes after the test: %lld",
                 (long long)par_alloc_live_total());
}

/* ------------------------------------------------------------- tid2eid -- */

Test(moe, tid2eid_closed_form)
{
    int32_t tab[V * K];
    cr_assert_eq(par_moe_tid2eid_f64(tab, V, E, K), PAR_OK);
    for (int t = 0; t < V; t++)
        for (int j = 0; j < K; j++)
            cr_expect_eq(tab[t * K + j], ((t % E) + j * (E / K)) % E, "t=%d j=%d", t, j);
    /* K distinct experts per row for other shapes too */
    int32_t big[40 * 6];
    const int shapes[][2] = {{8, 2}, {7, 3}, {6, 6}, {9, 4}, {5, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int e = shapes[s][0], k = shapes[s][1];
        cr_assert_eq(par_moe_tid2eid_f64(big, 40, e, k), PAR_OK);
        for (int t = 0; t < 40; t++)
            for (int a = 0; a < k; a++)
                for (int b = a + 1; b < k; b++)
                    cr_expect_neq(big[t * k + a], big[t * k + b], "E=%d K=%d t=%d", e, k, t);
    }
    par_err_set_quiet(1);
    cr_expect_eq(par_moe_tid2eid_f64(tab, V, 2, 3), PAR_EINVAL);
    par_err_set_quiet(0);
}

/* ---------------------------------------------------------------- gate -- */

typedef struct {
    double x[T * D], wg[E * D], bias[E];
    int32_t tokens[T], tab[V * K];
    int hash;       /* use tab */
    int use_bias;
    double cw[T * K], cs[T * E]; /* objective: sum cw*w + sum cs*s */
    int32_t idx[T * K];
    double w[T * K], logits[T * E], s[T * E];
} gate_ctx;

static void gate_run(gate_ctx *c)
{
    par_status st = par_moe_gate_forward_f64(c->idx, c->w, c->logits, c->s, c->x, c->wg,
                                             c->use_bias ? c->bias : NULL, c->hash ? c->tab : NULL,
                                             c->tokens, V, T, D, E, K, RS);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
}

static double gate_obj(void *p)
{
    gate_ctx *c = p;
    int32_t idx0[T * K];
    memcpy(idx0, c->idx, sizeof idx0);
    gate_run(c);
    cr_assert(memcmp(idx0, c->idx, sizeof idx0) == 0, "selection changed under perturbation");
    return dot(c->cw, c->w, T * K) + dot(c->cs, c->s, T * E);
}

static void gate_init(gate_ctx *c, uint64_t sd, int hash)
{
    memset(c, 0, sizeof *c);
    seed(sd);
    fill(c->x, T * D, 1.0);
    fill(c->wg, E * D, 1.0);
    fill(c->bias, E, 0.3);
    fill(c->cw, T * K, 1.0);
    fill(c->cs, T * E, 1.0);
    for (int t = 0; t < T; t++)
        c->tokens[t] = (t * 7 + 3) % V;
    cr_assert_eq(par_moe_tid2eid_f64(c->tab, V, E, K), PAR_OK);
    c->hash = hash;
    c->use_bias = 1;
}

static void gate_fd(int hash)
{
    static gate_ctx c;
    gate_init(&c, hash ? 11 : 12, hash);
    gate_run(&c);
    double dx[T * D] = {0}, dwg[E * D] = {0};
    cr_assert_eq(par_moe_gate_backward_f64(dx, dwg, c.cw, c.cs, c.x, c.wg, c.logits, c.s, c.idx,
                                           c.w, T, D, E, K, RS),
                 PAR_OK);
    double ex = fd_check("gate dx", c.x, T * D, dx, gate_obj, &c, FDH, 0);
    double ew = fd_check("gate dwg", c.wg, E * D, dwg, gate_obj, &c, FDH, 0);
    cr_expect_lt(ex, FDTOL, "dx err %g", ex);
    cr_expect_lt(ew, FDTOL, "dwg err %g", ew);

    /* only dw (no ds_extra), and only ds_extra (no dw) add up to both */
    double dx1[T * D] = {0}, dx2[T * D] = {0};
    cr_assert_eq(par_moe_gate_backward_f64(dx1, NULL, c.cw, NULL, c.x, c.wg, c.logits, c.s, c.idx,
                                           c.w, T, D, E, K, RS),
                 PAR_OK);
    cr_assert_eq(par_moe_gate_backward_f64(dx1, NULL, NULL, c.cs, c.x, c.wg, c.logits, c.s, c.idx,
                                           c.w, T, D, E, K, RS),
                 PAR_OK);
    cr_assert_eq(par_moe_gate_backward_f64(dx2, NULL, c.cw, c.cs, c.x, c.wg, c.logits, c.s, c.idx,
                                           c.w, T, D, E, K, RS),
                 PAR_OK);
    for (int i = 0; i < T * D; i++)
        cr_expect(fabs(dx1[i] - dx2[i]) < 1e-12, "split grads differ at %d", i);
    check_no_leaks();
}

Test(moe, gate_fd_score) { gate_fd(0); }
Test(moe, gate_fd_hash) { gate_fd(1); }

Test(moe, gate_forward_values)
{
    static gate_ctx c;
    gate_init(&c, 21, 0);
    gate_run(&c);
    for (int t = 0; t < T; t++) {
        /* s = sqrt(softplus(x wg^T)) */
        for (int e = 0; e < E; e++) {
            double l = dot(c.x + t * D, c.wg + e * D, D);
            cr_expect(fabs(c.logits[t * E + e] - l) < 1e-13);
            cr_expect(fabs(c.s[t * E + e] - sqrt(log1p(exp(l)))) < 1e-13);
        }
        /* idx ascending, = the K largest of s + bias */
        double wsum = 0, ssum = 0;
        for (int k = 0; k < K; k++) {
            if (k)
                cr_expect_lt(c.idx[t * K + k - 1], c.idx[t * K + k]);
            ssum += c.s[t * E + c.idx[t * K + k]];
            wsum += c.w[t * K + k];
        }
        cr_expect(fabs(wsum - RS) < 1e-13, "weights sum %g", wsum);
        for (int k = 0; k < K; k++)
            cr_expect(fabs(c.w[t * K + k] - RS * c.s[t * E + c.idx[t * K + k]] / ssum) < 1e-13);
        for (int e = 0; e < E; e++) {
            int in = 0;
            for (int k = 0; k < K; k++)
                in |= c.idx[t * K + k] == e;
            if (in)
                continue;
            for (int k = 0; k < K; k++) {
                int f = c.idx[t * K + k];
                cr_expect_geq(c.s[t * E + f] + c.bias[f], c.s[t * E + e] + c.bias[e],
                              "t=%d: unselected %d beats selected %d", t, e, f);
            }
        }
    }
}

Test(moe, gate_bias_only_selects)
{
    static gate_ctx c;
    gate_init(&c, 31, 0);
    c.use_bias = 1;
    memset(c.bias, 0, sizeof c.bias);
    c.bias[4] = 100.0; /* expert 4 always selected, weight still from unbiased s */
    gate_run(&c);
    for (int t = 0; t < T; t++) {
        int pos = -1;
        double ssum = 0;
        for (int k = 0; k < K; k++) {
            if (c.idx[t * K + k] == 4)
                pos = k;
            ssum += c.s[t * E + c.idx[t * K + k]];
        }
        cr_assert_geq(pos, 0, "t=%d: biased expert 4 not selected", t);
        cr_expect(fabs(c.w[t * K + pos] - RS * c.s[t * E + 4] / ssum) < 1e-13);
    }
}

Test(moe, gate_hash_routing_is_sorted_tid2eid)
{
    static gate_ctx c;
    gate_init(&c, 41, 1);
    c.bias[0] = 1e6; /* ignored on hash layers */
    gate_run(&c);
    for (int t = 0; t < T; t++) {
        int32_t want[K];
        memcpy(want, c.tab + c.tokens[t] * K, sizeof want);
        if (want[0] > want[1]) {
            int32_t tmp = want[0];
            want[0] = want[1];
            want[1] = tmp;
        }
        for (int k = 0; k < K; k++)
            cr_expect_eq(c.idx[t * K + k], want[k], "t=%d k=%d", t, k);
        double ssum = c.s[t * E + want[0]] + c.s[t * E + want[1]];
        for (int k = 0; k < K; k++)
            cr_expect(fabs(c.w[t * K + k] - RS * c.s[t * E + want[k]] / ssum) < 1e-13);
    }
    /* a token id whose tid2eid row is unsorted: t = 5 -> (5, 2) -> idx (2, 5) */
    cr_expect_eq(c.tab[5 * K + 0], 5);
    cr_expect_eq(c.tab[5 * K + 1], 2);
}

Test(moe, gate_ties_go_to_lower_index)
{
    static gate_ctx c;
    gate_init(&c, 51, 0);
    c.use_bias = 0;
    /* all scores equal -> experts 0 and 1 */
    memset(c.wg, 0, sizeof c.wg);
    gate_run(&c);
    for (int t = 0; t < T; t++) {
        cr_expect_eq(c.idx[t * K + 0], 0);
        cr_expect_eq(c.idx[t * K + 1], 1);
        cr_expect(fabs(c.w[t * K] - RS / 2) < 1e-15);
    }
    /* experts 2, 3, 5 share the largest row of the gate: 2 and 3 win */
    fill(c.wg, E * D, 0.1);
    for (int j = 0; j < D; j++) {
        c.wg[2 * D + j] = 5.0;
        c.wg[3 * D + j] = 5.0;
        c.wg[5 * D + j] = 5.0;
    }
    for (int i = 0; i < T * D; i++)
        c.x[i] = fabs(c.x[i]) + 0.1; /* positive: the 5.0 rows give the top logits */
    gate_run(&c);
    for (int t = 0; t < T; t++) {
        cr_expect_eq(c.idx[t * K + 0], 2, "t=%d", t);
        cr_expect_eq(c.idx[t * K + 1], 3, "t=%d", t);
    }
    /* ties made by the bias: s + bias equal for 1 and 4 at the top */
    memset(c.wg, 0, sizeof c.wg);
    c.use_bias = 1;
    memset(c.bias, 0, sizeof c.bias);
    c.bias[4] = 0.25;
    c.bias[1] = 0.25;
    c.bias[0] = 0.125;
    gate_run(&c);
    for (int t = 0; t < T; t++) {
        cr_expect_eq(c.idx[t * K + 0], 1, "t=%d", t);
        cr_expect_eq(c.idx[t * K + 1], 4, "t=%d", t);
    }
}

/* par_moe_gate_ties: the rows whose top-K boundary is an exact tie of the
 * biased scores, and the experts tied there (what another tie order may
 * pick: torch.topk on CPU picks [6, 5] of 8 equal scores for K = 2). */
Test(moe, gate_ties_marks_the_boundary)
{
    enum { R = 5 };
    const double sc[R][E] = {
        {0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, /* all equal: every expert tied */
        {0.9, 0.5, 0.5, 0.1, 0.5, 0.2}, /* 0.9 then three 0.5 for one place */
        {0.875, 0.75, 0.5, 0.5, 0.125, 0.25}, /* the tie below the boundary: none */
        {0.9, 0.9, 0.9, 0.1, 0.2, 0.3}, /* three 0.9 for two places */
        {0.1, 0.7, 0.7, 0.2, 0.3, 0.4}, /* two 0.7 for two places: no choice among them */
    };
    const int32_t want[R][E] = {
        {1, 1, 1, 1, 1, 1}, {0, 1, 1, 0, 1, 0}, {0, 0, 0, 0, 0, 0}, {1, 1, 1, 0, 0, 0}, {0, 0, 0, 0, 0, 0},
    };
    int32_t tie[R * E];
    int64_t c[2];
    cr_assert_eq(par_moe_gate_ties_f64(tie, c, &sc[0][0], NULL, R, E, K), PAR_OK);
    for (int r = 0; r < R; r++)
        for (int e = 0; e < E; e++)
            cr_expect_eq(tie[r * E + e], want[r][e], "row %d expert %d", r, e);
    cr_expect_eq(c[0], R);
    cr_expect_eq(c[1], 3);
    /* the bias decides: row 2's 0.5 + 0.375 ties 0.875 + 0 and 0.75 + 0.125 (exact in binary) */
    const double bias[E] = {0, 0.125, 0.375, 0, 0, 0};
    cr_assert_eq(par_moe_gate_ties_f64(tie, c, &sc[2][0], bias, 1, E, K), PAR_OK);
    const int32_t want2[E] = {1, 1, 1, 0, 0, 0};
    for (int e = 0; e < E; e++)
        cr_expect_eq(tie[e], want2[e], "biased row, expert %d", e);
    cr_expect_eq(c[1], 1);
    /* a bias that swamps the scores (bias_update_rate 1e17): s + b == b, every expert of a class ties */
    const double big[E] = {1e17, -1e17, 1e17, 1e17, 0, -1e17};
    cr_assert_eq(par_moe_gate_ties_f64(tie, c, &sc[1][0], big, 1, E, K), PAR_OK);
    const int32_t want3[E] = {1, 0, 1, 1, 0, 0};
    for (int e = 0; e < E; e++)
        cr_expect_eq(tie[e], want3[e], "swamped row, expert %d", e);
    /* K == E: nothing to choose */
    cr_assert_eq(par_moe_gate_ties_f64(tie, c, &sc[0][0], NULL, 1, E, E), PAR_OK);
    cr_expect_eq(c[0], 0);
    cr_expect_eq(c[1], 0);
    /* rows of few distinct values (ties everywhere), K = 1 .. E, against a sort */
    enum { NR = 200 };
    static double rs_[NR * E];
    static int32_t rt[NR * E];
    seed(81);
    for (int i = 0; i < NR * E; i++)
        rs_[i] = 0.25 * (double)(int)(2.0 + 2.0 * urand()); /* 0, 0.25, 0.5, 0.75 */
    for (int k = 1; k <= E; k++) {
        cr_assert_eq(par_moe_gate_ties_f64(rt, c, rs_, NULL, NR, E, k), PAR_OK);
        int64_t tied = 0;
        for (int r = 0; r < NR; r++) {
            double srt[E];
            memcpy(srt, rs_ + r * E, sizeof srt);
            for (int i = 1; i < E; i++) /* descending insertion sort */
                for (int j = i; j > 0 && srt[j - 1] < srt[j]; j--) {
                    double x = srt[j];
                    srt[j] = srt[j - 1];
                    srt[j - 1] = x;
                }
            int at = k < E && srt[k] == srt[k - 1];
            tied += at;
            for (int e = 0; e < E; e++)
                cr_expect_eq(rt[r * E + e], at && rs_[r * E + e] == srt[k - 1], "K=%d row %d expert %d", k, r, e);
        }
        cr_expect_eq(c[1], tied, "K=%d", k);
        cr_expect_eq(c[0], k < E ? NR : 0, "K=%d", k);
    }
    /* the gate forward picks the lower indices of each tie */
    static gate_ctx g;
    gate_init(&g, 71, 0);
    memset(g.wg, 0, sizeof g.wg);
    g.use_bias = 1;
    memcpy(g.bias, big, sizeof big);
    gate_run(&g);
    for (int t = 0; t < T; t++) {
        cr_expect_eq(g.idx[t * K + 0], 0, "t=%d", t);
        cr_expect_eq(g.idx[t * K + 1], 2, "t=%d", t);
    }
    check_no_leaks();
}

Test(moe, gate_errors)
{
    static gate_ctx c;
    gate_init(&c, 61, 1);
    par_err_set_quiet(1);
    c.tokens[3] = V; /* out of the table */
    cr_expect_eq(par_moe_gate_forward_f64(c.idx, c.w, c.logits, c.s, c.x, c.wg, NULL, c.tab,
                                          c.tokens, V, T, D, E, K, RS),
                 PAR_ERANGE);
    c.tokens[3] = 1;
    c.tab[1 * K + 1] = c.tab[1 * K + 0]; /* duplicate expert */
    cr_expect_eq(par_moe_gate_forward_f64(c.idx, c.w, c.logits, c.s, c.x, c.wg, NULL, c.tab,
                                          c.tokens, V, T, D, E, K, RS),
                 PAR_EINVAL);
    cr_expect_eq(par_moe_gate_forward_f64(c.idx, c.w, c.logits, c.s, c.x, c.wg, NULL, NULL,
                                          c.tokens, V, T, D, E, E + 1, RS),
                 PAR_EINVAL);
    par_err_set_quiet(0);
    check_no_leaks();
}

Test(moe, gate_tiny_scores_backward_is_finite)
{
    /* logits far below zero: s ~ exp(l/2) is tiny, the derivative stays finite */
    double x[D] = {1, 0, 0, 0, 0}, wg[E * D] = {0};
    const double lv[E] = {-60, -61, -62, -800, -900, -70};
    for (int e = 0; e < E; e++)
        wg[e * D] = lv[e];
    int32_t idx[K];
    double w[K], lg[E], s[E], dx[D] = {0}, dwg[E * D] = {0};
    double dw[K] = {1.0, -0.5}, dse[E] = {1, 1, 1, 1, 1, 1};
    cr_assert_eq(par_moe_gate_forward_f64(idx, w, lg, s, x, wg, NULL, NULL, NULL, 0, 1, D, E, K, RS),
                 PAR_OK);
    cr_expect_eq(idx[0], 0);
    cr_expect_eq(idx[1], 1);
    cr_expect_eq(s[4], 0.0, "s underflows to 0 at l = -900");
    cr_assert_eq(par_moe_gate_backward_f64(dx, dwg, dw, dse, x, wg, lg, s, idx, w, 1, D, E, K, RS),
                 PAR_OK);
    for (int j = 0; j < D; j++)
        cr_expect(isfinite(dx[j]));
    for (int i = 0; i < E * D; i++)
        cr_expect(isfinite(dwg[i]));
    /* softplus underflows to 0 at l = -800 and -900 (dsqrtsoftplus's other branch): d s / d l is the limit
     * exp(l/2)/2, with ds = 1 from dse and x = e_0 (the sigmoid/(2 sqrt(softplus)) form is 0/0 there) */
    cr_expect_eq(s[3], 0.0, "s underflows to 0 at l = -800");
    cr_expect(fabs(dwg[3 * D] - 0.5 * exp(-400.0)) <= 1e-13 * 0.5 * exp(-400.0), "l = -800: %g vs %g", dwg[3 * D],
              0.5 * exp(-400.0));
    cr_expect(fabs(dwg[4 * D] - 0.5 * exp(-450.0)) <= 1e-13 * 0.5 * exp(-450.0), "l = -900: %g vs %g", dwg[4 * D],
              0.5 * exp(-450.0));
    /* d s / d l = s / 2 in the tail (softplus ~ e^l): expert 5, row x = e_0 */
    cr_expect(fabs(dwg[5 * D] - s[5] / 2) < 1e-12 * s[5] + 1e-300, "%g vs %g", dwg[5 * D],
              s[5] / 2);
}

/* -------------------------------------------------------------- expert -- */

#define NX 7
typedef struct {
    double x[NX * D], rw[NX], w1[I * D], w2[D * I], w3[I * D], cy[NX * D];
    double y[NX * D], g[NX * I], u[NX * I], h[NX * I];
    double L;
} expert_ctx;

static double expert_obj(void *p)
{
    expert_ctx *c = p;
    par_moe_expert_forward_f64(c->y, c->g, c->u, c->h, c->x, c->rw, c->w1, c->w2, c->w3, NX, D, I,
                               c->L);
    return dot(c->cy, c->y, NX * D);
}

static void expert_case(double L, int want_clamped)
{
    static expert_ctx c;
    seed(71);
    fill(c.x, NX * D, 1.5);
    fill(c.rw, NX, 1.0);
    fill(c.w1, I * D, 1.5);
    fill(c.w2, D * I, 1.0);
    fill(c.w3, I * D, 1.5);
    fill(c.cy, NX * D, 1.0);
    c.L = L;
    expert_obj(&c);
    /* naive forward */
    int nclamp_g = 0, nclamp_u = 0;
    for (int n = 0; n < NX; n++) {
        double hh[I];
        for (int i = 0; i < I; i++) {
            double g = dot(c.x + n * D, c.w1 + i * D, D), u = dot(c.x + n * D, c.w3 + i * D, D);
            if (L > 0) {
                nclamp_g += g > L;
                nclamp_u += fabs(u) > L;
                g = fmin(g, L);
                u = fmax(-L, fmin(u, L));
            }
            hh[i] = c.rw[n] * g / (1 + exp(-g)) * u;
        }
        for (int j = 0; j < D; j++) {
            double y = dot(hh, c.w2 + j * I, I);
            cr_expect(fabs(c.y[n * D + j] - y) < 1e-12, "y[%d][%d] %g vs %g", n, j, c.y[n * D + j],
                      y);
        }
    }
    if (want_clamped) {
        cr_expect_gt(nclamp_g, 0, "no clamped g: the active-clamp case tests nothing");
        cr_expect_gt(nclamp_u, 0, "no clamped u");
    }
    double dx[NX * D] = {0}, dw1[I * D] = {0}, dw2[D * I] = {0}, dw3[I * D] = {0}, drw[NX] = {0};
    cr_assert_eq(par_moe_expert_backward_f64(dx, dw1, dw2, dw3, drw, c.cy, c.x, c.rw, c.w1, c.w2,
                                             c.w3, c.g, c.u, c.h, NX, D, I, L),
                 PAR_OK);
    double e;
    e = fd_check("expert dx", c.x, NX * D, dx, expert_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dx %g", e);
    e = fd_check("expert dw1", c.w1, I * D, dw1, expert_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dw1 %g", e);
    e = fd_check("expert dw2", c.w2, D * I, dw2, expert_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dw2 %g", e);
    e = fd_check("expert dw3", c.w3, I * D, dw3, expert_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dw3 %g", e);
    e = fd_check("expert drw", c.rw, NX, drw, expert_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "drw %g", e);
    check_no_leaks();
}

Test(moe, expert_fd_clamp_active) { expert_case(1.0, 1); }
Test(moe, expert_fd_clamp_inactive) { expert_case(0.0, 0); }
Test(moe, expert_fd_clamp_wide) { expert_case(10.0, 0); }

/* --------------------------------------------------------------- layer -- */

typedef struct {
    double x[T * D], w[T * K];
    int32_t idx[T * K];
    double w1[E][I * D], w2[E][D * I], w3[E][I * D], sw1[I * D], sw2[D * I], sw3[I * D];
    const double *p1[E], *p2[E], *p3[E];
    par_moe_weights W;
    double cy[T * D], y[T * D];
    par_moe_saved sv;
    double L;
    int shared;
} layer_ctx;

static double layer_obj(void *p)
{
    layer_ctx *c = p;
    par_status st = par_moe_forward_f64(c->y, &c->sv, c->x, c->idx, c->w, &c->W, T, D, E, K, I,
                                        c->L);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    return dot(c->cy, c->y, T * D);
}

static void layer_init(layer_ctx *c, uint64_t sd, double L, int shared)
{
    memset(c, 0, sizeof *c);
    seed(sd);
    fill(c->x, T * D, 1.5);
    fill(c->w, T * K, 1.0);
    for (int e = 0; e < E; e++) {
        fill(c->w1[e], I * D, 1.5);
        fill(c->w2[e], D * I, 1.0);
        fill(c->w3[e], I * D, 1.5);
        c->p1[e] = c->w1[e];
        c->p2[e] = c->w2[e];
        c->p3[e] = c->w3[e];
    }
    fill(c->sw1, I * D, 1.5);
    fill(c->sw2, D * I, 1.0);
    fill(c->sw3, I * D, 1.5);
    fill(c->cy, T * D, 1.0);
    /* routing: expert 5 gets no token, expert 0 many */
    const int32_t routes[T][K] = {{0, 1}, {0, 3}, {2, 4}, {0, 1}, {1, 2},
                                  {0, 4}, {3, 4}, {0, 2}, {1, 3}};
    memcpy(c->idx, routes, sizeof routes);
    c->W = (par_moe_weights){c->p1, c->p2, c->p3, shared ? c->sw1 : NULL,
                             shared ? c->sw2 : NULL, shared ? c->sw3 : NULL};
    c->L = L;
    c->shared = shared;
    cr_assert_eq(par_moe_saved_alloc_f64(&c->sv, T, D, E, K, I), PAR_OK);
}

/* y of one token computed naively, expert by expert. */
static void naive_expert(double *y, const double *x, double rw, const double *w1, const double *w2,
                         const double *w3, double L)
{
    double hh[I];
    for (int i = 0; i < I; i++) {
        double g = dot(x, w1 + i * D, D), u = dot(x, w3 + i * D, D);
        if (L > 0) {
            g = fmin(g, L);
            u = fmax(-L, fmin(u, L));
        }
        hh[i] = rw * g / (1 + exp(-g)) * u;
    }
    for (int j = 0; j < D; j++)
        y[j] = dot(hh, w2 + j * I, I);
}

static void layer_case(double L, int shared)
{
    static layer_ctx c;
    layer_init(&c, 81 + (uint64_t)shared, L, shared);
    layer_obj(&c);
    for (int t = 0; t < T; t++) {
        double want[D] = {0}, ye[D];
        for (int k = 0; k < K; k++) {
            int e = c.idx[t * K + k];
            naive_expert(ye, c.x + t * D, c.w[t * K + k], c.w1[e], c.w2[e], c.w3[e], L);
            for (int j = 0; j < D; j++)
                want[j] += ye[j];
        }
        if (shared) {
            naive_expert(ye, c.x + t * D, 1.0, c.sw1, c.sw2, c.sw3, L);
            for (int j = 0; j < D; j++)
                want[j] += ye[j];
        }
        for (int j = 0; j < D; j++)
            cr_expect(fabs(c.y[t * D + j] - want[j]) < 1e-12, "y[%d][%d] %g vs %g", t, j,
                      c.y[t * D + j], want[j]);
    }

    static double dx[T * D], dw[T * K], g1[E][I * D], g2[E][D * I], g3[E][I * D], s1[I * D],
        s2[D * I], s3[I * D];
    memset(dx, 0, sizeof dx);
    memset(dw, 0, sizeof dw);
    memset(g1, 0, sizeof g1);
    memset(g2, 0, sizeof g2);
    memset(g3, 0, sizeof g3);
    memset(s1, 0, sizeof s1);
    memset(s2, 0, sizeof s2);
    memset(s3, 0, sizeof s3);
    double *q1[E], *q2[E], *q3[E];
    for (int e = 0; e < E; e++) {
        q1[e] = g1[e];
        q2[e] = g2[e];
        q3[e] = g3[e];
    }
    par_moe_grads G = {q1, q2, q3, s1, s2, s3};
    cr_assert_eq(par_moe_backward_f64(dx, &G, dw, c.cy, c.x, c.w, &c.W, &c.sv, L), PAR_OK);

    double e;
    e = fd_check("layer dx", c.x, T * D, dx, layer_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dx %g", e);
    e = fd_check("layer dw", c.w, T * K, dw, layer_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dw %g", e);
    for (int x = 0; x < E; x++) {
        e = fd_check("layer dw1", c.w1[x], I * D, g1[x], layer_obj, &c, FDH, 0);
        cr_expect_lt(e, FDTOL, "expert %d dw1 %g", x, e);
        e = fd_check("layer dw2", c.w2[x], D * I, g2[x], layer_obj, &c, FDH, 0);
        cr_expect_lt(e, FDTOL, "expert %d dw2 %g", x, e);
        e = fd_check("layer dw3", c.w3[x], I * D, g3[x], layer_obj, &c, FDH, 0);
        cr_expect_lt(e, FDTOL, "expert %d dw3 %g", x, e);
    }
    for (int i = 0; i < I * D; i++)
        cr_expect_eq(g1[5][i], 0.0, "expert 5 has no tokens");
    e = fd_check("layer dsw1", c.sw1, I * D, s1, layer_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "shared dw1 %g", e);
    e = fd_check("layer dsw2", c.sw2, D * I, s2, layer_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "shared dw2 %g", e);
    e = fd_check("layer dsw3", c.sw3, I * D, s3, layer_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "shared dw3 %g", e);
    if (!shared)
        for (int i = 0; i < I * D; i++)
            cr_expect_eq(s1[i], 0.0);

    /* NULL gradient outputs are allowed and leave the rest unchanged (the
     * FD runs left perturbed activations in the saved buffers: recompute) */
    layer_obj(&c);
    double dx2[T * D] = {0};
    par_moe_grads G2 = {NULL, q2, NULL, NULL, NULL, NULL};
    cr_assert_eq(par_moe_backward_f64(dx2, &G2, NULL, c.cy, c.x, c.w, &c.W, &c.sv, L), PAR_OK);
    cr_assert_eq(par_moe_backward_f64(NULL, NULL, NULL, c.cy, c.x, c.w, &c.W, &c.sv, L), PAR_OK);
    for (int i = 0; i < T * D; i++)
        cr_expect(dx2[i] == dx[i], "dx differs without weight grads at %d", i);

    par_moe_saved_free_f64(&c.sv);
    check_no_leaks();
}

Test(moe, layer_fd_shared_clamp_active) { layer_case(1.0, 1); }
Test(moe, layer_fd_shared_clamp_off) { layer_case(0.0, 1); }
Test(moe, layer_fd_no_shared) { layer_case(2.0, 0); }

/* The per-token sum does not depend on how tokens are batched: running the
 * layer on a subset of the tokens gives bitwise the same rows. */
Test(moe, layer_rows_independent_of_batching)
{
    static layer_ctx c;
    layer_init(&c, 91, 1.0, 1);
    layer_obj(&c);
    const int sub[] = {7, 2, 4};
    const int ns = 3;
    double xs[3 * D], ws[3 * K], ys[3 * D];
    int32_t is[3 * K];
    for (int r = 0; r < ns; r++) {
        memcpy(xs + r * D, c.x + sub[r] * D, D * sizeof(double));
        memcpy(ws + r * K, c.w + sub[r] * K, K * sizeof(double));
        memcpy(is + r * K, c.idx + sub[r] * K, K * sizeof(int32_t));
    }
    par_moe_saved sv;
    cr_assert_eq(par_moe_saved_alloc_f64(&sv, ns, D, E, K, I), PAR_OK);
    cr_assert_eq(par_moe_forward_f64(ys, &sv, xs, is, ws, &c.W, ns, D, E, K, I, 1.0), PAR_OK);
    for (int r = 0; r < ns; r++)
        for (int j = 0; j < D; j++)
            cr_expect(ys[r * D + j] == c.y[sub[r] * D + j], "row %d (token %d) col %d: %.17g vs %.17g",
                      r, sub[r], j, ys[r * D + j], c.y[sub[r] * D + j]);
    par_moe_saved_free_f64(&sv);
    /* and the combine order is the documented one */
    double slots[T * K * D], sh[T * D], y[T * D];
    fill(slots, T * K * D, 1e8);
    fill(sh, T * D, 1.0);
    par_moe_combine_f64(y, slots, sh, T, K, D, 0);
    for (int i = 0; i < T * D; i++) {
        int t = i / D, j = i % D;
        double v = slots[(t * K) * D + j];
        for (int k = 1; k < K; k++)
            v += slots[(t * K + k) * D + j];
        v += sh[i];
        cr_expect(y[i] == v);
    }
    par_moe_saved_free_f64(&c.sv);
    check_no_leaks();
}

Test(moe, layer_errors)
{
    static layer_ctx c;
    layer_init(&c, 95, 1.0, 1);
    par_err_set_quiet(1);
    c.idx[2 * K + 0] = 4;
    c.idx[2 * K + 1] = 2; /* not ascending */
    cr_expect_eq(par_moe_forward_f64(c.y, &c.sv, c.x, c.idx, c.w, &c.W, T, D, E, K, I, 1.0),
                 PAR_EINVAL);
    c.idx[2 * K + 0] = 2;
    c.idx[2 * K + 1] = E; /* out of range */
    cr_expect_eq(par_moe_forward_f64(c.y, &c.sv, c.x, c.idx, c.w, &c.W, T, D, E, K, I, 1.0),
                 PAR_ERANGE);
    c.idx[2 * K + 1] = 4;
    cr_expect_eq(par_moe_forward_f64(c.y, &c.sv, c.x, c.idx, c.w, &c.W, T - 1, D, E, K, I, 1.0),
                 PAR_EINVAL, "saved buffers of another T");
    par_err_set_quiet(0);
    par_moe_saved_free_f64(&c.sv);
    check_no_leaks();
}

/* ------------------------------------------------------------- balance -- */

Test(moe, loads_count)
{
    int32_t idx[T * K] = {0, 1, 0, 3, 2, 4, 0, 1, 1, 2, 0, 4, 3, 4, 0, 2, 1, 3};
    int64_t loads[E] = {0};
    par_moe_count_loads_f64(loads, idx, T, E, K);
    const int64_t want[E] = {5, 4, 3, 3, 3, 0};
    int64_t tot = 0;
    for (int e = 0; e < E; e++) {
        cr_expect_eq(loads[e], want[e], "e=%d", e);
        tot += loads[e];
    }
    cr_expect_eq(tot, T * K);
    par_moe_count_loads_f64(loads, idx, T, E, K); /* accumulates */
    cr_expect_eq(loads[0], 10);
}

#define NS 3
typedef struct {
    gate_ctx g;
    int32_t sample_of[T];
    int64_t cnt[NS * E], ntok[NS];
    double psum[NS * E];
    int through_gate; /* objective recomputes the gate from x; else uses g.s as is */
} aux_ctx;

static double aux_eval(aux_ctx *c)
{
    if (c->through_gate)
        gate_run(&c->g);
    memset(c->cnt, 0, sizeof c->cnt);
    memset(c->psum, 0, sizeof c->psum);
    memset(c->ntok, 0, sizeof c->ntok);
    cr_assert_eq(par_moe_aux_stats_f64(c->cnt, c->psum, c->ntok, c->g.s, c->g.idx, c->sample_of, T,
                                       E, K, NS),
                 PAR_OK);
    return par_moe_aux_loss_f64(c->cnt, c->psum, c->ntok, NS, NS, E, K);
}
static double aux_obj(void *p) { return aux_eval(p); }

static void aux_init(aux_ctx *c)
{
    memset(c, 0, sizeof *c);
    gate_init(&c->g, 101, 0);
    gate_run(&c->g);
    const int32_t so[T] = {0, 0, 0, 0, 1, 1, 2, 2, 2};
    memcpy(c->sample_of, so, sizeof so);
}

Test(moe, aux_loss_value)
{
    static aux_ctx c;
    aux_init(&c);
    double L = aux_eval(&c);
    /* naive: mean over samples of sum_e f_e P_e */
    double want = 0;
    for (int q = 0; q < NS; q++) {
        int Tq = 0;
        double f[E] = {0}, P[E] = {0};
        for (int t = 0; t < T; t++) {
            if (c.sample_of[t] != q)
                continue;
            Tq++;
            double S = 0;
            for (int e = 0; e < E; e++)
                S += c.g.s[t * E + e];
            for (int e = 0; e < E; e++)
                P[e] += c.g.s[t * E + e] / S;
            for (int k = 0; k < K; k++)
                f[c.g.idx[t * K + k]] += 1;
        }
        cr_expect_eq(c.ntok[q], Tq);
        double inner = 0;
        for (int e = 0; e < E; e++) {
            cr_expect_eq(c.cnt[q * E + e], (int64_t)f[e]);
            inner += (double)E / (K * Tq) * f[e] * P[e] / Tq;
        }
        want += inner;
    }
    want /= NS;
    cr_expect(fabs(L - want) < 1e-14, "%.17g vs %.17g", L, want);
    /* perfectly balanced scores and loads give L = 1 */
    cr_expect(L > 0);
}

Test(moe, aux_fd_wrt_s)
{
    static aux_ctx c;
    aux_init(&c);
    aux_eval(&c);
    double ds[T * E] = {0};
    const double scale = 0.7;
    cr_assert_eq(par_moe_aux_backward_f64(ds, c.cnt, c.ntok, c.g.s, c.sample_of, T, E, K, NS, NS,
                                          scale),
                 PAR_OK);
    for (int i = 0; i < T * E; i++)
        ds[i] /= scale;
    c.through_gate = 0; /* idx fixed, s perturbed directly: f is constant */
    double e = fd_check("aux ds", c.g.s, T * E, ds, aux_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "ds %g", e);
    check_no_leaks();
}

Test(moe, aux_fd_through_gate)
{
    static aux_ctx c;
    aux_init(&c);
    aux_eval(&c);
    double ds[T * E] = {0}, dx[T * D] = {0}, dwg[E * D] = {0};
    cr_assert_eq(par_moe_aux_backward_f64(ds, c.cnt, c.ntok, c.g.s, c.sample_of, T, E, K, NS, NS,
                                          1.0),
                 PAR_OK);
    cr_assert_eq(par_moe_gate_backward_f64(dx, dwg, NULL, ds, c.g.x, c.g.wg, c.g.logits, c.g.s,
                                           c.g.idx, c.g.w, T, D, E, K, RS),
                 PAR_OK);
    c.through_gate = 1;
    double e = fd_check("aux->gate dx", c.g.x, T * D, dx, aux_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dx %g", e);
    e = fd_check("aux->gate dwg", c.g.wg, E * D, dwg, aux_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dwg %g", e);
    check_no_leaks();
}

Test(moe, aux_stats_partial_sums_add_up)
{
    /* statistics of two token halves added = statistics of all tokens
     * (counts exactly; psum up to rounding) */
    static aux_ctx c;
    aux_init(&c);
    aux_eval(&c);
    int64_t cnt[NS * E] = {0}, ntok[NS] = {0};
    double psum[NS * E] = {0};
    cr_assert_eq(par_moe_aux_stats_f64(cnt, psum, ntok, c.g.s, c.g.idx, c.sample_of, 5, E, K, NS),
                 PAR_OK);
    cr_assert_eq(par_moe_aux_stats_f64(cnt, psum, ntok, c.g.s + 5 * E, c.g.idx + 5 * K,
                                       c.sample_of + 5, T - 5, E, K, NS),
                 PAR_OK);
    for (int i = 0; i < NS * E; i++) {
        cr_expect_eq(cnt[i], c.cnt[i]);
        cr_expect(fabs(psum[i] - c.psum[i]) < 1e-15);
    }
    for (int q = 0; q < NS; q++)
        cr_expect_eq(ntok[q], c.ntok[q]);
    par_err_set_quiet(1);
    int32_t bad[T];
    memcpy(bad, c.sample_of, sizeof bad);
    bad[4] = NS;
    cr_expect_eq(par_moe_aux_stats_f64(cnt, psum, ntok, c.g.s, c.g.idx, bad, T, E, K, NS),
                 PAR_ERANGE);
    par_err_set_quiet(0);
}

/* ------------------------------------------------------- whole chain -- */

/* x -> gate -> layer (same x) + aux: the full gradient into x and wg. */
typedef struct {
    aux_ctx a;
    layer_ctx l;
    double alpha;
} chain_ctx;

static double chain_obj(void *p)
{
    chain_ctx *c = p;
    double aux = aux_eval(&c->a); /* runs the gate */
    memcpy(c->l.x, c->a.g.x, sizeof c->l.x);
    memcpy(c->l.idx, c->a.g.idx, sizeof c->l.idx);
    memcpy(c->l.w, c->a.g.w, sizeof c->l.w);
    return layer_obj(&c->l) + c->alpha * aux;
}

Test(moe, chain_fd_gate_layer_aux)
{
    static chain_ctx c;
    aux_init(&c.a);
    c.a.through_gate = 1;
    layer_init(&c.l, 111, 1.0, 1);
    c.alpha = 0.3;
    chain_obj(&c);
    double dx[T * D] = {0}, dwg[E * D] = {0}, dw[T * K] = {0}, ds[T * E] = {0};
    cr_assert_eq(par_moe_backward_f64(dx, NULL, dw, c.l.cy, c.l.x, c.l.w, &c.l.W, &c.l.sv, c.l.L),
                 PAR_OK);
    cr_assert_eq(par_moe_aux_backward_f64(ds, c.a.cnt, c.a.ntok, c.a.g.s, c.a.sample_of, T, E, K,
                                          NS, NS, c.alpha),
                 PAR_OK);
    cr_assert_eq(par_moe_gate_backward_f64(dx, dwg, dw, ds, c.a.g.x, c.a.g.wg, c.a.g.logits,
                                           c.a.g.s, c.a.g.idx, c.a.g.w, T, D, E, K, RS),
                 PAR_OK);
    double e = fd_check("chain dx", c.a.g.x, T * D, dx, chain_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dx %g", e);
    e = fd_check("chain dwg", c.a.g.wg, E * D, dwg, chain_obj, &c, FDH, 0);
    cr_expect_lt(e, FDTOL, "dwg %g", e);
    par_moe_saved_free_f64(&c.l.sv);
    check_no_leaks();
}

/* The gate backward's fused softplus + sigmoid (one e^-|l|) is bitwise the
 * two separate calls, on wide and special arguments (issue 29: speed without
 * moving a bit). */
Test(moe, softplus_sigmoid_fused_is_bitwise)
{
    static const double special[] = {0.0, -0.0, 1e-300, -1e-300, 0x1p-54, -0x1p-54, 0x1p-60, 1.0, -1.0,
                                     36.0, -36.0, 700.0, -700.0, 745.5, -745.5, 800.0, -800.0, 1e308, -1e308,
                                     INFINITY, -INFINITY, NAN};
    uint64_t st = 0x9e3779b97f4a7c15ull;
    int n_special = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < 2000000 + n_special; i++) {
        double x;
        if (i < n_special) {
            x = special[i];
        } else {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(st >> 11) * 0x1p-53;          /* [0, 1) */
            double mag = i % 3 == 0 ? 40.0 : i % 3 == 1 ? 1.0 : 900.0;
            x = (2.0 * u - 1.0) * mag;
        }
        double sg, sp = par_softplus_sigmoid(x, &sg);
        double sp0 = par_softplus(x), sg0 = par_sigmoid(x);
        cr_assert(!memcmp(&sp, &sp0, sizeof sp) && !memcmp(&sg, &sg0, sizeof sg),
                  "x = %a: fused (%a, %a), separate (%a, %a)", x, sp, sg, sp0, sg0);
    }
}
