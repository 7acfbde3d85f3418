/* parallel: one whole V4 block under TP + SP (+ ETP), composed the way the
 * driver will run it through the model's hooks, against the serial model's
 * par_block_forward / par_block_backward, f64, threads backend, groups of
 * parallel/layout/groups.c.
 *
 * Each rank holds T/P of the 512 tokens (SP): mHC (hc_pre / hc_post of both
 * sub-layers), attn_norm, ffn_norm and the router run on its tokens only;
 * attention goes through par_tp_attn (all-gather in, reduce-scatter out),
 * the MoE through par_etp_moe (routed experts ETP, shared expert TP, both
 * with the SP gather / reduce-scatter).  The replicated weights' gradients
 * (mHC, norms, gate, and the attention's replicated slots) are this rank's
 * tokens' share and are summed over the TP group afterwards, as the
 * driver's reduction will.  Checks: Xout and dXin within the f64 policy,
 * the routing (idx) equal and `selected` bitwise, every gradient of the
 * block within the f64 policy (the sharded ones gathered back to the
 * logical tensors), largest errors logged.  Without SP every TP rank runs
 * mHC, norms and the router on all tokens: the replicated weights'
 * gradients must then come out identical on every TP rank with no TP
 * reduction (summing them would count each token TP times).
 */
#include <criterion/criterion.h>

#include "tp_world.h"

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "kernels/mhc.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/moe/etp.h"
#include "parallel/layout/groups.h"
#include "parallel/tp/tp_attn.h"
#include "parallel/layout/tp_split.h"

typedef par_attn_weights_f64 wts;

typedef struct {
    par_config cfg;
    par_model_f64 M;
    int b;
    int64_t T, n, d, E, K, I;
    int32_t *tokens, *pos, *sample;
    double *Xin, *dXout;             /* [T, n, d] */
    double *Xout, *dXin;             /* serial results */
    int32_t *idx, *sel;              /* serial routing [T, K], picks [T, topk] */
} bcase;

#define PP(idx) par_model_ptr_f64(&A->M, A->M.params, (idx))

static void case_init(bcase *A, const char *const *sets, int b, uint64_t seed)
{
    openblas_set_num_threads(1);
    memset(A, 0, sizeof *A);
    A->cfg = tpw_config(sets);
    cr_assert_eq(par_model_init_f64(&A->M, &A->cfg, seed), PAR_OK, "%s", par_last_error());
    A->b = b;
    A->T = A->cfg.global_batch_size * A->cfg.seq_length, A->n = A->cfg.hc_mult;
    A->d = A->cfg.dim, A->E = A->cfg.n_routed_experts, A->K = A->cfg.n_activated_experts;
    A->I = A->cfg.moe_inter_dim;
    const int64_t T = A->T, N3 = T * A->n * A->d;
    A->pos = tpw_positions(A->cfg.global_batch_size, A->cfg.seq_length, seed, A->cfg.vocab_size,
                           &A->tokens);
    A->sample = calloc((size_t)T, 4);
    A->Xin = tpw_random(N3, seed, "Xin", 1);
    A->dXout = tpw_random(N3, seed, "dXout", 1);
    A->Xout = malloc((size_t)N3 * 8), A->dXin = calloc((size_t)N3, 8);
    par_block_act_f64 a;
    memset(&a, 0, sizeof a);
    cr_assert_eq(par_block_forward_f64(&A->M, NULL, b, &a, &A->M.arena, A->Xin, A->tokens, A->pos,
                                       A->sample, NULL, T), PAR_OK, "%s", par_last_error());
    memcpy(A->Xout, a.Xout, (size_t)N3 * 8);
    A->idx = malloc((size_t)(T * A->K) * 4);
    memcpy(A->idx, a.idx, (size_t)(T * A->K) * 4);
    const par_attn_dims *dm = &A->M.adims[b];
    A->sel = calloc((size_t)(T * dm->topk), 4);
    if (dm->m == 4)
        memcpy(A->sel, a.as.sel, (size_t)(T * dm->topk) * 4);
    memset(A->M.grads, 0, (size_t)A->M.n_local * 8);
    cr_assert_eq(par_block_backward_f64(&A->M, NULL, b, &a, &A->M.arena, A->dXin, A->dXout, A->pos,
                                        A->sample, NULL, 0.0, T), PAR_OK, "%s", par_last_error());
    par_block_act_release_f64(&a);
}

static void case_free(bcase *A)
{
    par_model_free_f64(&A->M);
    void *p[] = {A->tokens, A->pos, A->sample, A->Xin, A->dXout, A->Xout, A->dXin, A->idx, A->sel};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        free(p[i]);
}

/* ---------------------------------------------------------------- world */

typedef struct {
    const bcase *A;
    int tp, dp, sp;        /* sp 0: every TP rank holds all of its DP group's tokens */
    double *Xout, *dXin;   /* [T, n, d] by token owners */
    int32_t *idx, *sel;
    double *g;             /* [world, n_local] each rank's gradients, unsharded */
} run_ctx;

/* The attention weights of block b in a flat buffer (params or grads). */
static void attn_of(const bcase *A, double *flat, wts *W)
{
    const par_block_params *bp = &A->M.tab.blocks[A->b];
    const int ids[18] = {bp->wq_a,      bp->q_norm,    bp->wq_b,      bp->wkv,
                         bp->kv_norm,   bp->wo_a,      bp->wo_b,      bp->attn_sink,
                         bp->cmp_wkv,   bp->cmp_wgate, bp->cmp_ape,   bp->cmp_norm,
                         bp->idx_wq_b,  bp->idx_weights_proj, bp->idx_cmp_wkv,
                         bp->idx_cmp_wgate, bp->idx_cmp_ape, bp->idx_cmp_norm};
    double **f[18] = {&W->wq_a,     &W->q_norm,    &W->wq_b,      &W->wkv,     &W->kv_norm,
                      &W->wo_a,     &W->wo_b,      &W->attn_sink, &W->cmp_wkv, &W->cmp_wgate,
                      &W->cmp_ape,  &W->cmp_norm,  &W->idx_wq_b,  &W->idx_weights_proj,
                      &W->idx_cmp_wkv, &W->idx_cmp_wgate, &W->idx_cmp_ape, &W->idx_cmp_norm};
    for (int k = 0; k < 18; k++)
        *f[k] = ids[k] >= 0 ? flat + par_model_loc_f64(&A->M, ids[k]) : NULL;
}

/* The rank's expert / shared shards (slices of the model's weights) and
 * their gradient buffers. */
typedef struct {
    double *buf, *gbuf;
    const double *w[3][64];
    double *g[3][64];
    const double *s[3];
    double *sg[3];
} shards;

static int64_t wrows(const bcase *A, int k) { return k == 1 ? A->d : A->I; }
static int64_t wcols(const bcase *A, int k) { return k == 1 ? A->I : A->d; }
static par_tp_cut wcut(int k) { return k == 1 ? PAR_TP_COLS : PAR_TP_ROWS; }

static void shards_make(shards *S, const bcase *A, int re, int P, int rt, int Q)
{
    const par_block_params *bp = &A->M.tab.blocks[A->b];
    const int sidx[3] = {bp->shared_w1, bp->shared_w2, bp->shared_w3};
    const int64_t n = A->I * A->d / P, ns = A->I * A->d / Q;
    S->buf = malloc((size_t)(3 * A->E * n + 3 * ns) * 8);
    S->gbuf = calloc((size_t)(3 * A->E * n + 3 * ns), 8);
    for (int k = 0; k < 3; k++) {
        for (int e = 0; e < A->E; e++) {
            double *dst = S->buf + (k * A->E + e) * n;
            par_tp_slice(dst, A->M.ew[((size_t)A->b * 3 + (size_t)k) * (size_t)A->E + (size_t)e],
                         wrows(A, k), wcols(A, k), wcut(k), re, P, 8);
            S->w[k][e] = dst, S->g[k][e] = S->gbuf + (k * A->E + e) * n;
        }
        double *sd = S->buf + 3 * A->E * n + k * ns;
        par_tp_slice(sd, A->M.params + par_model_loc_f64(&A->M, sidx[k]), wrows(A, k), wcols(A, k), wcut(k), rt, Q,
                     8);
        S->s[k] = sd, S->sg[k] = S->gbuf + 3 * A->E * n + k * ns;
    }
}

static void shards_unslice(const shards *S, const bcase *A, int re, int P, int rt, int Q,
                           double *flat)
{
    const par_block_params *bp = &A->M.tab.blocks[A->b];
    const int sidx[3] = {bp->shared_w1, bp->shared_w2, bp->shared_w3};
    for (int k = 0; k < 3; k++) {
        for (int e = 0; e < A->E; e++)
            par_tp_unslice(flat + par_model_loc_f64(&A->M, bp->expert0 + 3 * e + k), S->g[k][e], wrows(A, k),
                           wcols(A, k), wcut(k), re, P, 8);
        par_tp_unslice(flat + par_model_loc_f64(&A->M, sidx[k]), S->sg[k], wrows(A, k), wcols(A, k), wcut(k), rt,
                       Q, 8);
    }
}

/* A rank's activations of its Tl tokens. */
typedef struct {
    par_hc_saved_f64 hca, hcf;
    void *hb, *rb;
    double *xa, *xan, *rstda, *ya, *Xmid, *xf, *xfn, *rstdf, *yf, *Xout, *gw, *glog, *gs;
    int32_t *idx, *sel;
    par_tp_attn_saved_f64 as;
    par_etp_moe_saved_f64 ms;
} acts;

static void acts_alloc(acts *a, const bcase *A, int64_t Tl)
{
    const int64_t n = A->n, d = A->d, E = A->E, K = A->K, it = A->cfg.hc_sinkhorn_iters;
    memset(a, 0, sizeof *a);
    const size_t hb = par_hc_saved_bytes_f64(Tl, n, it);
    a->hb = par_malloc(2 * hb, PAR_TAG_ACT);
    par_hc_saved_init_f64(&a->hca, a->hb, Tl, n, it);
    par_hc_saved_init_f64(&a->hcf, (char *)a->hb + hb, Tl, n, it);
    double *p = a->rb = calloc((size_t)(Tl * (8 * d + 2 + 2 * n * d + K + 2 * E)), 8);
    a->xa = p, p += Tl * d;
    a->xan = p, p += Tl * d;
    a->rstda = p, p += Tl;
    a->ya = p, p += Tl * d;
    a->Xmid = p, p += Tl * n * d;
    a->xf = p, p += Tl * d;
    a->xfn = p, p += Tl * d;
    a->rstdf = p, p += Tl;
    a->yf = p, p += Tl * d;
    a->Xout = p, p += Tl * n * d;
    a->gw = p, p += Tl * K;
    a->glog = p, p += Tl * E;
    a->gs = p;
    a->idx = calloc((size_t)(Tl * K), 4);
    a->sel = calloc((size_t)(Tl * A->M.adims[A->b].topk + 1), 4);
}

static void acts_free(acts *a)
{
    par_free(a->hb);
    free(a->rb);
    free(a->idx);
    free(a->sel);
    par_tp_attn_saved_free_f64(&a->as);
    par_etp_moe_saved_free_f64(&a->ms);
}

typedef struct {
    const bcase *A;
    const double *Xin;
    const int32_t *tok, *pos; /* the rank's Tl tokens; the DP group's Td positions */
    int64_t Tl, Td;
    const wts *Wl;
    const shards *S;
    const par_tp *tp, *etp;
} rank_in;

static par_status block_fwd(acts *a, const rank_in *in)
{
    const bcase *A = in->A;
    const par_config *c = &A->cfg;
    const par_block_params *bp = &A->M.tab.blocks[A->b];
    const int64_t Tl = in->Tl, n = A->n, d = A->d, it = c->hc_sinkhorn_iters;
    const int hash = bp->gate_tid2eid >= 0;
    par_status st = par_hc_pre_forward_f64(a->xa, &a->hca, in->Xin, PP(bp->hc_attn_fn),
                                           PP(bp->hc_attn_base), PP(bp->hc_attn_scale), Tl, n, d,
                                           it, c->hc_eps, c->norm_eps);
    if (st)
        return st;
    par_rmsnorm_forward_f64(a->xan, a->rstda, a->xa, PP(bp->attn_norm), Tl, d, c->norm_eps);
    if ((st = par_tp_attn_forward_f64(a->ya, &a->as, a->sel, a->xan, in->pos, in->Wl,
                                      &A->M.adims[A->b], in->Td, in->tp)))
        return st;
    par_hc_post_forward_f64(a->Xmid, a->ya, in->Xin, a->hca.post, a->hca.C, Tl, n, d);
    if ((st = par_hc_pre_forward_f64(a->xf, &a->hcf, a->Xmid, PP(bp->hc_ffn_fn), PP(bp->hc_ffn_base),
                                     PP(bp->hc_ffn_scale), Tl, n, d, it, c->hc_eps, c->norm_eps)))
        return st;
    par_rmsnorm_forward_f64(a->xfn, a->rstdf, a->xf, PP(bp->ffn_norm), Tl, d, c->norm_eps);
    const int32_t *t2e = hash ? A->M.i32 + A->M.tab.p[bp->gate_tid2eid].offset : NULL;
    if ((st = par_moe_gate_forward_f64(a->idx, a->gw, a->glog, a->gs, a->xfn, PP(bp->gate_weight),
                                       hash ? NULL : PP(bp->gate_bias), t2e, in->tok, A->cfg.vocab_size,
                                       Tl, d, (int)A->E, (int)A->K, c->route_scale)))
        return st;
    par_etp_weights_f64 EW = {in->S->w[0], in->S->w[1], in->S->w[2],
                              in->S->s[0], in->S->s[1], in->S->s[2]};
    if ((st = par_etp_moe_forward_f64(a->yf, &a->ms, a->xfn, a->idx, a->gw, &EW, Tl, d, (int)A->E,
                                      (int)A->K, A->I, c->swiglu_limit, in->etp, in->tp)))
        return st;
    par_hc_post_forward_f64(a->Xout, a->yf, a->Xmid, a->hcf.post, a->hcf.C, Tl, n, d);
    return PAR_OK;
}

#define GG(idx) (g + par_model_loc_f64(&A->M, (idx)))

/* block.c's backward on the rank's tokens; replicated gradients (this
 * rank's share) into g (a flat buffer laid out like M.grads). */
static par_status block_bwd(double *dXin, double *g, wts *dWl, const double *dXout, acts *a,
                            const rank_in *in)
{
    const bcase *A = in->A;
    const par_config *c = &A->cfg;
    const par_block_params *bp = &A->M.tab.blocks[A->b];
    const int64_t Tl = in->Tl, n = A->n, d = A->d, K = A->K, it = c->hc_sinkhorn_iters;
    double *s = calloc((size_t)(Tl * (n * d + 6 * d + n + n * n + K)), 8);
    double *dXmid = s, *dyf = dXmid + Tl * n * d, *dpost = dyf + Tl * d, *dC = dpost + Tl * n;
    double *dxfn = dC + Tl * n * n, *dw = dxfn + Tl * d, *dxf = dw + Tl * K, *dya = dxf + Tl * d;
    double *dxan = dya + Tl * d, *dxa = dxan + Tl * d;
    par_hc_post_backward_f64(dyf, dXmid, dpost, dC, dXout, a->yf, a->Xmid, a->hcf.post, a->hcf.C,
                             Tl, n, d);
    par_etp_weights_f64 EW = {in->S->w[0], in->S->w[1], in->S->w[2],
                              in->S->s[0], in->S->s[1], in->S->s[2]};
    par_etp_grads_f64 EG = {in->S->g[0], in->S->g[1], in->S->g[2],
                            in->S->sg[0], in->S->sg[1], in->S->sg[2]};
    par_status st = par_etp_moe_backward_f64(dxfn, dw, &EG, dyf, &a->ms, &EW, in->etp, in->tp);
    if (!st)
        st = par_moe_gate_backward_f64(dxfn, GG(bp->gate_weight), dw, NULL, a->xfn,
                                       PP(bp->gate_weight), a->glog, a->gs, a->idx, a->gw, Tl, d,
                                       (int)A->E, (int)K, c->route_scale);
    if (!st) {
        par_rmsnorm_backward_f64(dxf, GG(bp->ffn_norm), dxfn, a->xf, PP(bp->ffn_norm), a->rstdf, Tl, d);
        st = par_hc_pre_backward_f64(dXmid, GG(bp->hc_ffn_fn), GG(bp->hc_ffn_base), GG(bp->hc_ffn_scale),
                                     dxf, dpost, dC, &a->hcf, a->Xmid, PP(bp->hc_ffn_fn),
                                     PP(bp->hc_ffn_base), PP(bp->hc_ffn_scale), Tl, n, d, it,
                                     c->hc_eps, c->norm_eps);
    }
    if (!st) {
        memset(dpost, 0, (size_t)(Tl * n) * 8);
        memset(dC, 0, (size_t)(Tl * n * n) * 8);
        par_hc_post_backward_f64(dya, dXin, dpost, dC, dXmid, a->ya, in->Xin, a->hca.post, a->hca.C,
                                 Tl, n, d);
        st = par_tp_attn_backward_f64(dxan, dWl, dya, &a->as, in->Wl, in->tp);
    }
    if (!st) {
        par_rmsnorm_backward_f64(dxa, GG(bp->attn_norm), dxan, a->xa, PP(bp->attn_norm), a->rstda, Tl, d);
        st = par_hc_pre_backward_f64(dXin, GG(bp->hc_attn_fn), GG(bp->hc_attn_base),
                                     GG(bp->hc_attn_scale), dxa, dpost, dC, &a->hca, in->Xin,
                                     PP(bp->hc_attn_fn), PP(bp->hc_attn_base), PP(bp->hc_attn_scale),
                                     Tl, n, d, it, c->hc_eps, c->norm_eps);
    }
    free(s);
    return st;
}

/* Sums this rank's share of the block's replicated non-attention gradients
 * (mHC, norms, gate) over the TP group, as the driver's reduction will
 * (under SP every rank saw only its tokens). */
static par_status reduce_replicated(const bcase *A, double *g, par_comm *tpc)
{
    for (int i = 0; i < A->M.tab.n; i++) {
        const par_param *p = &A->M.tab.p[i];
        if (p->layer != A->b || !p->has_grad || strstr(p->name, ".attn.") ||
            par_tp_split_of(p->name).cut != PAR_TP_REPLICATED)
            continue;
        double *x = g + par_model_loc_f64(&A->M, i);
        par_status st = par_allreduce(tpc, x, x, (size_t)p->numel, PAR_C_F64, PAR_OP_SUM);
        if (st)
            return st;
    }
    return PAR_OK;
}

static par_status rank_block(run_ctx *c, int wr, const par_groups *gr, const par_rank_coords *rc)
{
    const bcase *A = c->A;
    const par_attn_dims *dm = &A->M.adims[A->b];
    const int Q = c->tp;
    const int64_t Td = A->T / c->dp, Tl = c->sp ? Td / Q : Td;
    const int64_t x0 = rc->dp * Td + (c->sp ? rc->tp * Tl : 0), nd = A->n * A->d, K = A->K;
    par_tp tp = {.comm = gr->g[PAR_GROUP_TP], .sp = c->sp};
    par_tp etp = {.comm = gr->g[PAR_GROUP_ETP], .sp = c->sp};
    wts W, Z, Wl, dWl;
    attn_of(A, A->M.params, &W);
    double *zero = calloc((size_t)A->M.n_local, 8), *g = c->g + (size_t)wr * (size_t)A->M.n_local;
    attn_of(A, zero, &Z);
    const int64_t ns = par_tp_attn_shard_count_f64(dm, Q);
    double *wb = malloc((size_t)ns * 8), *gb = calloc((size_t)ns, 8);
    par_tp_attn_shard_f64(&Wl, wb, &W, dm, rc->tp, Q);
    par_tp_attn_shard_f64(&dWl, gb, &Z, dm, rc->tp, Q);
    shards S;
    shards_make(&S, A, rc->etp, c->tp, rc->tp, Q); /* ETP == TP here */
    rank_in in = {A, A->Xin + x0 * nd, A->tokens + x0, A->pos + rc->dp * Td, Tl, Td, &Wl, &S,
                  &tp, &etp};
    acts a;
    acts_alloc(&a, A, Tl);
    double *dXin = calloc((size_t)(Tl * nd), 8);
    par_status st = block_fwd(&a, &in);
    if (!st)
        st = block_bwd(dXin, g, &dWl, A->dXout + x0 * nd, &a, &in);
    if (!st)
        st = par_tp_attn_reduce_grads_f64(&dWl, dm, &tp);
    if (!st) {
        wts full;
        attn_of(A, g, &full);
        par_tp_attn_unshard_f64(&full, &dWl, dm, rc->tp, Q);
        shards_unslice(&S, A, rc->etp, c->tp, rc->tp, Q, g);
        if (c->sp) /* without SP every TP rank already holds the complete copy */
            st = reduce_replicated(A, g, tp.comm);
    }
    if (!st && (c->sp || rc->tp == 0)) {
        memcpy(c->Xout + x0 * nd, a.Xout, (size_t)(Tl * nd) * 8);
        memcpy(c->dXin + x0 * nd, dXin, (size_t)(Tl * nd) * 8);
        memcpy(c->idx + x0 * K, a.idx, (size_t)(Tl * K) * 4);
        if (dm->m == 4)
            memcpy(c->sel + x0 * dm->topk, a.sel, (size_t)(Tl * dm->topk) * 4);
    }
    acts_free(&a);
    free(dXin), free(zero), free(wb), free(gb), free(S.buf), free(S.gbuf);
    return st;
}

static par_status rank_fn(par_comm *world, void *arg)
{
    run_ctx *c = arg;
    const int N = c->tp * c->dp;
    par_layout l = tpw_layout(c->tp, 1, 1, c->tp, N); /* ETP = TP: experts on the TP ranks */
    par_groups g;
    par_status st = par_groups_build(world, &l, &g);
    if (st)
        return st;
    par_rank_coords rc;
    if (!(st = par_rank_coords_of(&l, par_comm_rank(world), &rc)))
        st = rank_block(c, par_comm_rank(world), &g, &rc);
    par_groups_free(&g);
    return st;
}

static void check_block(const char *const *sets, int b, int tp, int dp, int sp, const char *what)
{
    bcase A;
    case_init(&A, sets, b, 500 + (uint64_t)(b * 10 + tp));
    const int64_t T = A.T, N3 = T * A.n * A.d, nl = A.M.n_local, N = (int64_t)tp * dp;
    const par_attn_dims *dm = &A.M.adims[b];
    run_ctx c = {.A = &A, .tp = tp, .dp = dp, .sp = sp};
    c.Xout = calloc((size_t)N3, 8), c.dXin = calloc((size_t)N3, 8);
    c.idx = calloc((size_t)(T * A.K), 4), c.sel = calloc((size_t)(T * dm->topk), 4);
    c.g = calloc((size_t)(N * nl), 8);
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    par_world_opts o = {.timeout_s = 60.0, .rank_init = tpw_rank_init};
    cr_assert_eq(par_world_run(be, (int)N, rank_fn, &c, &o), PAR_OK, "%s", par_last_error());
    double ex, edx, worst = 0;
    const char *wn = "-";
    cr_assert(!memcmp(c.idx, A.idx, (size_t)(T * A.K) * 4), "%s: routing differs", what);
    if (dm->m == 4)
        cr_assert(!memcmp(c.sel, A.sel, (size_t)(T * dm->topk) * 4), "%s: selected differs", what);
    cr_assert(tpw_policy_f64(A.Xout, c.Xout, N3, &ex), "%s: Xout outside the policy (%.3g)", what, ex);
    cr_assert(tpw_policy_f64(A.dXin, c.dXin, N3, &edx), "%s: dXin outside the policy (%.3g)", what,
              edx);
    double *tot = calloc((size_t)nl, 8);
    for (int i = 0; i < A.M.tab.n; i++) {
        const par_param *p = &A.M.tab.p[i];
        if (p->layer != b || !p->has_grad)
            continue;
        const int split = par_tp_split_of(p->name).cut != PAR_TP_REPLICATED;
        double *t = tot + par_model_loc_f64(&A.M, i);
        for (int64_t r = 0; r < N && !split; r++) /* replicas agree bit for bit */
            cr_assert(tpw_bitwise(c.g + (r - r % tp) * nl + par_model_loc_f64(&A.M, i), c.g + r * nl + par_model_loc_f64(&A.M, i),
                                  p->numel), "%s: d%s differs between TP ranks", what, p->name);
        for (int64_t r = 0; r < N; r++)
            if (split || r % tp == 0) /* replicated: one copy per DP group */
                for (int64_t e = 0; e < p->numel; e++)
                    t[e] += c.g[r * nl + par_model_loc_f64(&A.M, i) + e];
        double rel;
        cr_assert(tpw_policy_f64(A.M.grads + par_model_loc_f64(&A.M, i), t, p->numel, &rel),
                  "%s: d%s outside the f64 policy (rel %.3g)", what, p->name, rel);
        if (rel > worst)
            worst = rel, wn = p->name;
    }
    cr_log_info("%s: rel L2 Xout %.3g, dXin %.3g, worst gradient %.3g (%s); routing equal%s", what,
                ex, edx, worst, wn, dm->m == 4 ? ", selected bitwise" : "");
    free(tot), free(c.Xout), free(c.dXin), free(c.idx), free(c.sel), free(c.g);
    case_free(&A);
}

static const char *const plain[] = {NULL};
static const char *const wide8[] = {"n_heads=8", "o_groups=4", "index_n_heads=8", NULL};

Test(tp_block, tp2_sp_etp2_every_block)
{
    for (int b = 0; b < 4; b++) /* hash m=0, score m=4, score m=16, MTP m=0 */
        check_block(plain, b, 2, 1, 1, "block under TP2 + SP + ETP2 (N 2)");
}

Test(tp_block, tp2_without_sp)
{
    /* every TP rank runs mHC, norms and the router on all tokens (replicated
     * per token): the replicated weights' gradients come out identical on
     * both ranks with no TP reduction */
    check_block(plain, 1, 2, 1, 0, "block 1 under TP2 + ETP2 without SP (N 2)");
    check_block(plain, 0, 2, 1, 0, "block 0 under TP2 + ETP2 without SP (N 2)");
}

Test(tp_block, tp4_sp_etp4)
{
    check_block(wide8, 1, 4, 1, 1, "block 1 under TP4 + SP + ETP4 (n_heads 8, N 4)");
}

Test(tp_block, tp2_sp_by_dp2)
{
    check_block(plain, 1, 2, 2, 1, "block 1 under TP2 + SP + ETP2 x DP2 (N 4, De 2)");
}
