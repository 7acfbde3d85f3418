/* parallel: the tensor-parallel shared expert (parallel/tp/tp_mlp.h) and expert
 * tensor parallelism for the routed experts (parallel/moe/etp.h) against the
 * serial model's own MoE layer (kernels/moe.h par_moe_forward/_backward on
 * all tokens), f64, threads backend, groups of parallel/layout/groups.c on layouts
 * that fold N/PP = TP*CP*Da = ETP*EP*De.
 *
 * v4-tiny block 1 (score routing), one random 8 x 64 batch of normed inputs
 * x, the model's gate on them (idx, w), random dy.  Each rank holds its
 * attention-side tokens (its DP rows; with SP its TP slice of them).
 * Checks per layout:
 * - y, dx, the routing weights' gradient dw within the f64 policy;
 * - routed experts' slice gradients bitwise when one ETP group covers all
 *   tokens in order (De = 1), else within policy after the expert-DP sum;
 * - the shared expert's shard gradients bitwise under TP (one TP group over
 *   all tokens), within policy when DP ranks each hold part;
 * - SP is bitwise TP without SP for the shared expert alone;
 * - EP x ETP (MoE parallel folding with EP > 1): a minimal test dispatch
 *   over the EP group around par_etp_rows_* (where parallel/moe/ep.c will call
 *   it), within the f64 policy.
 */
#include <criterion/criterion.h>

#include "tp_world.h"

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "kernels/moe.h"
#include "model/model.h"
#include "parallel/moe/etp.h"
#include "parallel/layout/groups.h"
#include "parallel/tp/tp_mlp.h"
#include "parallel/layout/tp_split.h"

enum { MAXW = 8 };

typedef struct {
    par_config cfg;
    par_model_f64 M;
    int b, E, K;
    int64_t T, d, I;
    double L;
    double *x, *dy, *w;       /* [T, d], [T, d], [T, K] */
    int32_t *idx;             /* [T, K] */
    double *y, *dx, *dw;      /* serial results */
    double *eg;               /* [E, 3, I*d] serial expert gradients (w1, w2, w3) */
    double *sg;               /* [3, I*d] shared */
    double *sy, *sdx, *ssg;   /* the shared expert alone: y, dx [T, d], its gradients [3, I*d] */
    const double *ew[3][64];  /* model expert weights */
    const double *sw[3];      /* model shared weights */
} mcase;

static void case_init(mcase *A, uint64_t seed)
{
    openblas_set_num_threads(1);
    memset(A, 0, sizeof *A);
    A->cfg = tpw_config(NULL);
    cr_assert_eq(par_model_init_f64(&A->M, &A->cfg, seed), PAR_OK, "%s", par_last_error());
    A->b = 1, A->E = (int)A->cfg.n_routed_experts, A->K = (int)A->cfg.n_activated_experts;
    A->T = A->cfg.global_batch_size * A->cfg.seq_length, A->d = A->cfg.dim;
    A->I = A->cfg.moe_inter_dim, A->L = A->cfg.swiglu_limit;
    cr_assert(A->E <= 64);
    const int64_t T = A->T, d = A->d, E = A->E, K = A->K, I = A->I;
    const par_block_params *bp = &A->M.tab.blocks[A->b];
    for (int e = 0; e < E; e++)
        for (int k = 0; k < 3; k++)
            A->ew[k][e] = A->M.ew[((size_t)A->b * 3 + (size_t)k) * (size_t)E + (size_t)e];
    A->sw[0] = par_model_ptr_f64(&A->M, A->M.params, bp->shared_w1);
    A->sw[1] = par_model_ptr_f64(&A->M, A->M.params, bp->shared_w2);
    A->sw[2] = par_model_ptr_f64(&A->M, A->M.params, bp->shared_w3);
    A->x = tpw_random(T * d, seed, "x", 1);
    A->dy = tpw_random(T * d, seed, "dy", 1);
    A->idx = malloc((size_t)(T * K) * 4), A->w = malloc((size_t)(T * K) * 8);
    double *lg = malloc((size_t)(T * E) * 8), *sc = malloc((size_t)(T * E) * 8);
    cr_assert_eq(par_moe_gate_forward_f64(A->idx, A->w, lg, sc, A->x,
                                          par_model_ptr_f64(&A->M, A->M.params, bp->gate_weight),
                                          par_model_ptr_f64(&A->M, A->M.params, bp->gate_bias),
                                          NULL, NULL, A->cfg.vocab_size, T, d, (int)E, (int)K,
                                          A->cfg.route_scale), PAR_OK);
    free(lg);
    free(sc);
    /* the serial layer */
    par_moe_weights MW = {A->ew[0], A->ew[1], A->ew[2], A->sw[0], A->sw[1], A->sw[2]};
    A->eg = calloc((size_t)(E * 3 * I * d), 8), A->sg = calloc((size_t)(3 * I * d), 8);
    double *g1[64], *g2[64], *g3[64];
    for (int e = 0; e < E; e++)
        g1[e] = A->eg + (e * 3 + 0) * I * d, g2[e] = A->eg + (e * 3 + 1) * I * d,
        g3[e] = A->eg + (e * 3 + 2) * I * d;
    par_moe_grads MG = {g1, g2, g3, A->sg, A->sg + I * d, A->sg + 2 * I * d};
    par_moe_saved sv;
    cr_assert_eq(par_moe_saved_alloc_f64(&sv, T, d, (int)E, (int)K, I), PAR_OK);
    A->y = malloc((size_t)(T * d) * 8), A->dx = calloc((size_t)(T * d), 8);
    A->dw = calloc((size_t)(T * K), 8);
    cr_assert_eq(par_moe_forward_f64(A->y, &sv, A->x, A->idx, A->w, &MW, T, d, (int)E, (int)K, I,
                                     A->L), PAR_OK);
    cr_assert_eq(par_moe_backward_f64(A->dx, &MG, A->dw, A->dy, A->x, A->w, &MW, &sv, A->L),
                 PAR_OK);
    par_moe_saved_free_f64(&sv);
    /* the shared expert alone (rw = 1, all tokens) */
    double *g = malloc((size_t)(3 * T * I) * 8);
    A->sy = malloc((size_t)(T * d) * 8), A->sdx = calloc((size_t)(T * d), 8);
    A->ssg = calloc((size_t)(3 * I * d), 8);
    par_moe_expert_forward_f64(A->sy, g, g + T * I, g + 2 * T * I, A->x, NULL, A->sw[0], A->sw[1],
                               A->sw[2], T, d, I, A->L);
    cr_assert_eq(par_moe_expert_backward_f64(A->sdx, A->ssg, A->ssg + I * d, A->ssg + 2 * I * d,
                                             NULL, A->dy, A->x, NULL, A->sw[0], A->sw[1], A->sw[2],
                                             g, g + T * I, g + 2 * T * I, T, d, I, A->L), PAR_OK);
    free(g);
}

static void case_free(mcase *A)
{
    par_model_free_f64(&A->M);
    void *p[] = {A->x, A->dy, A->w, A->idx, A->y, A->dx, A->dw, A->eg, A->sg, A->sy, A->sdx, A->ssg};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        free(p[i]);
}

/* ---------------------------------------------------------------- world */

typedef struct {
    const mcase *A;
    int tp, etp, N, ep;  /* ep > 1: a test dispatch over the EP group around the ETP rows */
    int tp_sp, etp_sp;   /* tokens split over the TP group (SP); rows split over ETP */
    int shared_only;     /* run only the shared expert (par_tp_mlp) */
    double *y, *dx, *dw; /* full-size results, written by token owners */
    double *eg, *sg;     /* [N, ...] each rank's gradients, unsliced into full shapes */
} run_ctx;

#define RCHECK(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond))                                                                         \
            return par_err(PAR_ECHECK, __VA_ARGS__);                                         \
    } while (0)

/* The rank's shards: expert slices over ETP (rank re of P), shared over TP
 * (rank rt of Q); gradients zeroed. */
typedef struct {
    double *buf, *gbuf;
    const double *w[3][64];
    double *g[3][64];
    const double *s[3];
    double *sg[3];
} shards;

static void shards_make(shards *S, const mcase *A, int re, int P, int rt, int Q)
{
    const int64_t n = A->I * A->d / P, ns = A->I * A->d / Q;
    S->buf = malloc((size_t)(3 * A->E * n + 3 * ns) * 8);
    S->gbuf = calloc((size_t)(3 * A->E * n + 3 * ns), 8);
    for (int k = 0; k < 3; k++) {
        const par_tp_cut cut = k == 1 ? PAR_TP_COLS : PAR_TP_ROWS;
        const int64_t rows = k == 1 ? A->d : A->I, cols = k == 1 ? A->I : A->d;
        for (int e = 0; e < A->E; e++) {
            double *dst = S->buf + (k * A->E + e) * n;
            par_tp_slice(dst, A->ew[k][e], rows, cols, cut, re, P, 8);
            S->w[k][e] = dst;
            S->g[k][e] = S->gbuf + (k * A->E + e) * n;
        }
        double *sd = S->buf + 3 * A->E * n + k * ns;
        par_tp_slice(sd, A->sw[k], rows, cols, cut, rt, Q, 8);
        S->s[k] = sd;
        S->sg[k] = S->gbuf + 3 * A->E * n + k * ns;
    }
}

/* Writes the rank's gradient shards into full-shape buffers eg/sg. */
static void shards_unslice(const shards *S, const mcase *A, int re, int P, int rt, int Q,
                           double *eg, double *sg)
{
    const int64_t I = A->I, d = A->d;
    for (int k = 0; k < 3; k++) {
        const par_tp_cut cut = k == 1 ? PAR_TP_COLS : PAR_TP_ROWS;
        const int64_t rows = k == 1 ? d : I, cols = k == 1 ? I : d;
        for (int e = 0; e < A->E; e++)
            par_tp_unslice(eg + (e * 3 + k) * I * d, S->g[k][e], rows, cols, cut, re, P, 8);
        par_tp_unslice(sg + k * I * d, S->sg[k], rows, cols, cut, rt, Q, 8);
    }
}

static par_status rank_moe(run_ctx *c, int wr, const par_groups *g, const par_rank_coords *rc,
                           const par_layout *l)
{
    const mcase *A = c->A;
    const int64_t d = A->d, K = A->K, Td = A->T / l->da;
    const int Q = c->tp, P = c->etp;
    const int64_t Tx = c->tp_sp ? Td / Q : Td, x0 = rc->dp * Td + (c->tp_sp ? rc->tp * Tx : 0);
    par_tp tp = {.comm = g->g[PAR_GROUP_TP], .sp = c->tp_sp};
    par_tp etp = {.comm = g->g[PAR_GROUP_ETP], .sp = c->etp_sp};
    shards S;
    shards_make(&S, A, rc->etp, P, rc->tp, Q);
    double *y = malloc((size_t)(Tx * d) * 8), *dx = calloc((size_t)(Tx * d), 8);
    double *dw = calloc((size_t)(Tx * K), 8);
    RCHECK(y && dx && dw, "buffers");
    par_status st;
    if (c->shared_only) {
        par_tp_mlp_saved_f64 sv;
        memset(&sv, 0, sizeof sv);
        st = par_tp_mlp_forward_f64(y, &sv, A->x + x0 * d, S.s[0], S.s[1], S.s[2], Td, d, A->I,
                                    A->L, &tp);
        if (!st)
            st = par_tp_mlp_backward_f64(dx, S.sg[0], S.sg[1], S.sg[2], A->dy + x0 * d, &sv, S.s[0],
                                         S.s[1], S.s[2], &tp);
        par_tp_mlp_saved_free_f64(&sv);
    } else {
        par_etp_weights_f64 W = {S.w[0], S.w[1], S.w[2], S.s[0], S.s[1], S.s[2]};
        par_etp_grads_f64 G = {S.g[0], S.g[1], S.g[2], S.sg[0], S.sg[1], S.sg[2]};
        par_etp_moe_saved_f64 sv;
        memset(&sv, 0, sizeof sv);
        st = par_etp_moe_forward_f64(y, &sv, A->x + x0 * d, A->idx + x0 * K, A->w + x0 * K, &W, Tx,
                                     d, A->E, A->K, A->I, A->L, &etp, &tp);
        if (!st)
            st = par_etp_moe_backward_f64(dx, dw, &G, A->dy + x0 * d, &sv, &W, &etp, &tp);
        par_etp_moe_saved_free_f64(&sv);
    }
    if (!st && (c->tp_sp || rc->tp == 0)) {
        memcpy(c->y + x0 * d, y, (size_t)(Tx * d) * 8);
        memcpy(c->dx + x0 * d, dx, (size_t)(Tx * d) * 8);
        memcpy(c->dw + x0 * K, dw, (size_t)(Tx * K) * 8);
    }
    if (!st)
        shards_unslice(&S, A, rc->etp, P, rc->tp, Q, c->eg + (size_t)wr * (size_t)(A->E * 3 * A->I * d),
                       c->sg + (size_t)wr * (size_t)(3 * A->I * d));
    free(S.buf);
    free(S.gbuf);
    free(y);
    free(dx);
    free(dw);
    return st;
}

/* ---- EP x ETP: a minimal EP dispatch of the test around the ETP rows
 * layer (a stand-in for parallel/moe/ep.c's executor, which will call
 * par_etp_rows_* the same way between its dispatch and combine). */

typedef struct {
    int EP;
    int64_t ns, nr;          /* rows sent (the rank's slots), rows received */
    size_t *sc, *sd, *rcn, *rd; /* [EP] per-peer row counts / displacements */
    int32_t *slot;           /* [ns] t*K + k of each sent row, owner ascending then (t, k) */
    double *rx;              /* [nr, d+1] received (x | rw) */
    int32_t *re;             /* [nr] received local expert */
} disp;

static par_status alltoallv_rows(par_comm *ep, const disp *D, const void *in, void *out, int64_t w,
                                 par_ctype t, int reverse)
{
    size_t sc[64], sd[64], rc[64], rd[64];
    for (int q = 0; q < D->EP; q++) {
        sc[q] = (reverse ? D->rcn[q] : D->sc[q]) * (size_t)w, sd[q] = (reverse ? D->rd[q] : D->sd[q]) * (size_t)w;
        rc[q] = (reverse ? D->sc[q] : D->rcn[q]) * (size_t)w, rd[q] = (reverse ? D->sd[q] : D->rd[q]) * (size_t)w;
    }
    return par_alltoallv(ep, in, sc, sd, out, rc, rd, t);
}

static par_status dispatch(disp *D, par_comm *ep, const mcase *A, const double *x, const int32_t *idx,
                           const double *w, int64_t T)
{
    const int64_t d = A->d, K = A->K, per = A->E / D->EP, ns = T * K;
    D->ns = ns;
    D->sc = calloc(4 * (size_t)D->EP, sizeof(size_t));
    D->sd = D->sc + D->EP, D->rcn = D->sd + D->EP, D->rd = D->rcn + D->EP;
    D->slot = malloc((size_t)ns * 4);
    double *sx = malloc((size_t)(ns * (d + 1)) * 8);
    int32_t *se = malloc((size_t)ns * 4);
    int64_t n = 0, rcnt[64], scnt[64];
    for (int q = 0; q < D->EP; q++) {
        D->sd[q] = (size_t)n;
        for (int64_t i = 0; i < ns; i++)
            if (idx[i] / per == q) {
                D->slot[n] = (int32_t)i, se[n] = idx[i] - q * (int32_t)per;
                memcpy(sx + n * (d + 1), x + (i / K) * d, (size_t)d * 8);
                sx[n * (d + 1) + d] = w[i];
                n++;
            }
        scnt[q] = n - (int64_t)D->sd[q];
        D->sc[q] = (size_t)scnt[q];
    }
    par_status st = par_alltoall(ep, scnt, rcnt, 1, PAR_C_I64);
    D->nr = 0;
    for (int q = 0; q < D->EP && !st; q++)
        D->rcn[q] = (size_t)rcnt[q], D->rd[q] = (size_t)D->nr, D->nr += rcnt[q];
    D->rx = malloc((size_t)(D->nr * (d + 1) + 1) * 8), D->re = malloc((size_t)(D->nr + 1) * 4);
    if (!st)
        st = alltoallv_rows(ep, D, sx, D->rx, d + 1, PAR_C_F64, 0);
    if (!st)
        st = alltoallv_rows(ep, D, se, D->re, 1, PAR_C_I32, 0);
    free(sx);
    free(se);
    return st;
}

static void disp_free(disp *D)
{
    free(D->sc), free(D->slot), free(D->rx), free(D->re);
}

/* The rows a rank received, split into x and rw. */
static void split_rows(const disp *D, int64_t d, double *xr, double *rwr)
{
    for (int64_t i = 0; i < D->nr; i++) {
        memcpy(xr + i * d, D->rx + i * (d + 1), (size_t)d * 8);
        rwr[i] = D->rx[i * (d + 1) + d];
    }
}

static par_status rank_moe_ep(run_ctx *c, int wr, const par_groups *g, const par_rank_coords *rc,
                              const par_layout *l)
{
    const mcase *A = c->A;
    const int64_t d = A->d, K = A->K, T = A->T / l->da, x0 = rc->dp * T, I = A->I;
    const int per = A->E / c->ep, e0 = rc->ep * per;
    par_tp etp = {.comm = g->g[PAR_GROUP_ETP], .sp = 1};
    shards S;
    shards_make(&S, A, rc->etp, c->etp, 0, 1);
    disp D = {.EP = c->ep};
    par_status st = dispatch(&D, g->g[PAR_GROUP_EP], A, A->x + x0 * d, A->idx + x0 * K, A->w + x0 * K, T);
    const int64_t nr = D.nr, ns = D.ns;
    double *xr = malloc((size_t)(nr * d + 1) * 8), *rwr = malloc((size_t)(nr + 1) * 8);
    double *yr = malloc((size_t)(nr * (d + 1) + 1) * 8), *back = malloc((size_t)(ns * (d + 1)) * 8);
    double *slots = calloc((size_t)(T * K * d), 8), *ysh = malloc((size_t)(T * d) * 8);
    double *dxs = calloc((size_t)(T * d), 8), *dx = calloc((size_t)(T * d), 8), *dw = calloc((size_t)(T * K), 8);
    double *g3 = malloc((size_t)(3 * T * I) * 8), *y = malloc((size_t)(T * d) * 8);
    split_rows(&D, d, xr, rwr);
    par_etp_rows_saved_f64 sv;
    memset(&sv, 0, sizeof sv);
    /* forward: ETP rows on the received rows, back to the tokens, combine */
    if (!st)
        st = par_etp_rows_forward_f64(yr, &sv, xr, rwr, D.re, nr, S.w[0] + e0, S.w[1] + e0, S.w[2] + e0,
                                      per, d, I, A->L, &etp);
    if (!st)
        st = alltoallv_rows(g->g[PAR_GROUP_EP], &D, yr, back, d, PAR_C_F64, 1);
    for (int64_t i = 0; i < ns && !st; i++)
        memcpy(slots + (int64_t)D.slot[i] * d, back + i * d, (size_t)d * 8);
    par_moe_expert_forward_f64(ysh, g3, g3 + T * I, g3 + 2 * T * I, A->x + x0 * d, NULL, A->sw[0],
                               A->sw[1], A->sw[2], T, d, I, A->L);
    par_moe_combine_f64(y, slots, ysh, T, (int)K, d, 0);
    /* backward: dy rows to the owners, ETP rows backward, (dx | drw) back */
    for (int64_t i = 0; i < ns; i++)
        memcpy(back + i * d, A->dy + (x0 + D.slot[i] / K) * d, (size_t)d * 8);
    if (!st)
        st = alltoallv_rows(g->g[PAR_GROUP_EP], &D, back, xr, d, PAR_C_F64, 0); /* xr: dy rows */
    double *dxr = calloc((size_t)(nr * d + 1), 8), *drr = calloc((size_t)(nr + 1), 8);
    if (!st)
        st = par_etp_rows_backward_f64(dxr, drr, S.g[0] + e0, S.g[1] + e0, S.g[2] + e0, xr, &sv,
                                       S.w[0] + e0, S.w[1] + e0, S.w[2] + e0, &etp);
    for (int64_t i = 0; i < nr; i++) {
        memcpy(yr + i * (d + 1), dxr + i * d, (size_t)d * 8);
        yr[i * (d + 1) + d] = drr[i];
    }
    if (!st)
        st = alltoallv_rows(g->g[PAR_GROUP_EP], &D, yr, back, d + 1, PAR_C_F64, 1);
    memset(slots, 0, (size_t)(T * K * d) * 8);
    for (int64_t i = 0; i < ns && !st; i++) {
        memcpy(slots + (int64_t)D.slot[i] * d, back + i * (d + 1), (size_t)d * 8);
        dw[D.slot[i]] += back[i * (d + 1) + d];
    }
    if (!st)
        st = par_moe_expert_backward_f64(dxs, S.sg[0], S.sg[1], S.sg[2], NULL, A->dy + x0 * d,
                                         A->x + x0 * d, NULL, A->sw[0], A->sw[1], A->sw[2], g3,
                                         g3 + T * I, g3 + 2 * T * I, T, d, I, A->L);
    par_moe_combine_f64(dx, slots, dxs, T, (int)K, d, 1);
    if (!st) {
        memcpy(c->y + x0 * d, y, (size_t)(T * d) * 8);
        memcpy(c->dx + x0 * d, dx, (size_t)(T * d) * 8);
        memcpy(c->dw + x0 * K, dw, (size_t)(T * K) * 8);
        shards_unslice(&S, A, rc->etp, c->etp, 0, 1, c->eg + (size_t)wr * (size_t)(A->E * 3 * I * d),
                       c->sg + (size_t)wr * (size_t)(3 * I * d));
    }
    par_etp_rows_saved_free_f64(&sv);
    disp_free(&D);
    void *f[] = {xr, rwr, yr, back, slots, ysh, dxs, dx, dw, g3, y, dxr, drr, S.buf, S.gbuf};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        free(f[i]);
    return st;
}

static par_status rank_fn(par_comm *world, void *arg)
{
    run_ctx *c = arg;
    par_layout l = tpw_layout(c->tp, 1, c->ep > 1 ? c->ep : 1, c->etp, c->N);
    par_groups g;
    par_status st = par_groups_build(world, &l, &g);
    if (st)
        return st;
    par_rank_coords rc;
    if (!(st = par_rank_coords_of(&l, par_comm_rank(world), &rc)))
        st = c->ep > 1 ? rank_moe_ep(c, par_comm_rank(world), &g, &rc, &l)
                       : rank_moe(c, par_comm_rank(world), &g, &rc, &l);
    par_groups_free(&g);
    return st;
}

static void run(run_ctx *c)
{
    const mcase *A = c->A;
    const int64_t T = A->T, d = A->d;
    c->y = calloc((size_t)(T * d), 8), c->dx = calloc((size_t)(T * d), 8);
    c->dw = calloc((size_t)(T * A->K), 8);
    c->eg = calloc((size_t)c->N * (size_t)(A->E * 3 * A->I * d), 8);
    c->sg = calloc((size_t)c->N * (size_t)(3 * A->I * d), 8);
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    par_world_opts o = {.timeout_s = 60.0, .rank_init = tpw_rank_init};
    cr_assert_eq(par_world_run(be, c->N, rank_fn, c, &o), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "comm memory left");
}

static void run_free(run_ctx *c)
{
    free(c->y);
    free(c->dx);
    free(c->dw);
    free(c->eg);
    free(c->sg);
}

/* Sum over world ranks (ascending) of each rank's full-shape gradient: the
 * ETP (TP) ranks' slices are disjoint (zeros elsewhere), and the expert-DP
 * (attention-DP) replicas each hold their tokens' share, which the driver's
 * DP reduction adds. */
static double *sum_over(const double *per, int N, int64_t n)
{
    double *s = calloc((size_t)n, 8);
    for (int r = 0; r < N; r++)
        for (int64_t i = 0; i < n; i++)
            s[i] += per[(size_t)r * (size_t)n + (size_t)i];
    return s;
}

typedef struct {
    double y, dx, dw, eg, sg;
} errs;

static errs check_case(const run_ctx *c, const char *what, int bitwise_experts, int bitwise_shared)
{
    const mcase *A = c->A;
    const int64_t T = A->T, d = A->d, ne = A->E * 3 * A->I * d, ns = 3 * A->I * d;
    errs e = {0, 0, 0, 0, 0};
    const double *ry = c->shared_only ? A->sy : A->y, *rdx = c->shared_only ? A->sdx : A->dx;
    const double *rsg = c->shared_only ? A->ssg : A->sg;
    cr_assert(tpw_policy_f64(ry, c->y, T * d, &e.y), "%s: y outside the f64 policy (%.3g)", what,
              e.y);
    cr_assert(tpw_policy_f64(rdx, c->dx, T * d, &e.dx), "%s: dx outside the f64 policy (%.3g)",
              what, e.dx);
    if (!c->shared_only)
        cr_assert(tpw_policy_f64(A->dw, c->dw, T * A->K, &e.dw),
                  "%s: d(route weights) outside the f64 policy (%.3g)", what, e.dw);
    double *eg = sum_over(c->eg, c->N, ne), *sg = sum_over(c->sg, c->N, ns);
    if (!c->shared_only) {
        if (bitwise_experts)
            cr_assert(tpw_bitwise(A->eg, eg, ne), "%s: routed expert gradients not bitwise", what);
        cr_assert(tpw_policy_f64(A->eg, eg, ne, &e.eg), "%s: routed expert gradients (%.3g)", what,
                  e.eg);
    }
    if (bitwise_shared)
        cr_assert(tpw_bitwise(rsg, sg, ns), "%s: shared expert gradients not bitwise", what);
    cr_assert(tpw_policy_f64(rsg, sg, ns, &e.sg), "%s: shared expert gradients (%.3g)", what, e.sg);
    free(eg);
    free(sg);
    cr_log_info("%s: rel L2 y %.3g, dx %.3g, dw %.3g, experts %.3g, shared %.3g", what, e.y, e.dx,
                e.dw, e.eg, e.sg);
    return e;
}

static void one(const mcase *A, run_ctx c, const char *what, int bw_experts, int bw_shared,
                run_ctx *keep)
{
    c.A = A;
    run(&c);
    check_case(&c, what, bw_experts, bw_shared);
    if (keep)
        *keep = c;
    else
        run_free(&c);
}

Test(etp, shared_expert_tp_and_sp)
{
    mcase A;
    case_init(&A, 31);
    for (int tp = 2; tp <= 4; tp *= 2) {
        run_ctx a, b;
        char w[96];
        snprintf(w, sizeof w, "shared expert TP%d", tp);
        one(&A, (run_ctx){.tp = tp, .etp = 1, .N = tp, .shared_only = 1}, w, 0, 1, &a);
        snprintf(w, sizeof w, "shared expert TP%d + SP", tp);
        one(&A, (run_ctx){.tp = tp, .etp = 1, .N = tp, .tp_sp = 1, .shared_only = 1}, w, 0, 1, &b);
        const int64_t n = A.T * A.d;
        cr_assert(tpw_bitwise(a.y, b.y, n) && tpw_bitwise(a.dx, b.dx, n) &&
                  tpw_bitwise(a.sg, b.sg, (int64_t)tp * 3 * A.I * A.d),
                  "TP%d + SP differs from TP%d", tp, tp);
        run_free(&a);
        run_free(&b);
    }
    case_free(&A);
}

Test(etp, etp2_over_dp_ranks)
{
    /* N = 2, TP 1: Da = 2 (rank r holds rows 4r..4r+3), ETP 2, De 1: the ETP
     * group {0, 1} gathers both halves in token order */
    mcase A;
    case_init(&A, 32);
    one(&A, (run_ctx){.tp = 1, .etp = 2, .N = 2, .etp_sp = 1}, "ETP2 (N 2, Da 2, De 1)", 1, 0, NULL);
    /* N = 4: Da = 4, ETP 2, De 2: ETP groups {0,1}, {2,3}; expert-DP {0,2}, {1,3} */
    one(&A, (run_ctx){.tp = 1, .etp = 2, .N = 4, .etp_sp = 1}, "ETP2 (N 4, Da 4, De 2)", 0, 0, NULL);
    /* N = 4, ETP 4, De 1 (moe_inter_dim 16 / 4 = 4 per slice) */
    one(&A, (run_ctx){.tp = 1, .etp = 4, .N = 4, .etp_sp = 1}, "ETP4 (N 4, Da 4, De 1)", 1, 0, NULL);
    case_free(&A);
}

Test(etp, tp2_sp_with_etp2)
{
    /* N = 2: TP 2 with SP (rank r holds tokens [256r, 256r+256)), the
     * shared expert TP-parallel, the routed experts ETP 2 on the same ranks */
    mcase A;
    case_init(&A, 33);
    one(&A, (run_ctx){.tp = 2, .etp = 2, .N = 2, .tp_sp = 1, .etp_sp = 1}, "TP2 + SP, ETP2 (N 2)", 1,
        1, NULL);
    /* without SP the TP ranks hold the same tokens: ETP rows are not split
     * (all-reduce instead of gather / reduce-scatter) */
    one(&A, (run_ctx){.tp = 2, .etp = 2, .N = 2}, "TP2, ETP2 on replicated tokens (N 2)", 1, 1, NULL);
    /* N = 4: TP 2 + SP, Da 2, ETP 2, De 2 */
    one(&A, (run_ctx){.tp = 2, .etp = 2, .N = 4, .tp_sp = 1, .etp_sp = 1},
        "TP2 + SP, ETP2 (N 4, Da 2, De 2)", 0, 0, NULL);
    case_free(&A);
}

Test(etp, ep_by_etp_folding)
{
    /* MoE parallel folding with TP 1: N = Da = ETP*EP*De.  The EP groups
     * dispatch rows to the experts' owners; the owners' ETP group gathers
     * the rows it received, runs its slices, reduce-scatters; rows return */
    mcase A;
    case_init(&A, 34);
    one(&A, (run_ctx){.tp = 1, .etp = 2, .ep = 2, .N = 4}, "ETP2 x EP2 (N 4, De 1)", 0, 0, NULL);
    one(&A, (run_ctx){.tp = 1, .etp = 2, .ep = 4, .N = 8}, "ETP2 x EP4 (N 8, De 1)", 0, 0, NULL);
    one(&A, (run_ctx){.tp = 1, .etp = 2, .ep = 2, .N = 8}, "ETP2 x EP2 x De2 (N 8)", 0, 0, NULL);
    case_free(&A);
}
