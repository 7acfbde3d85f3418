/* parallel: tensor (and sequence) parallel V4 attention (parallel/tp/tp_attn.h)
 * against the serial model's own layer, f64, threads backend, real
 * Megatron-order groups (parallel/layout/groups.c on a hand-resolved layout).
 *
 * Each case takes block b of a v4-tiny model (widened heads through config
 * overrides where TP must divide them), one random packing of 8 x 64, random
 * x and dy, runs par_attn_forward/backward on all 512 tokens (the serial
 * layer) and the TP layer on TP ranks (each holding its shard), and checks:
 * - selected bitwise (the indexer's score chain in head order);
 * - y and dx within the f64 policy (row-parallel and input-gradient sums are
 *   split over ranks), largest relative L2 error logged;
 * - the gradients of wq_b, wo_a, wo_b, attn_sink (sharded) bitwise, of the
 *   replicated weights within the f64 policy and identical on every rank
 *   after par_tp_attn_reduce_grads, indexer slots untouched;
 * - SP == TP without SP, bit for bit (y, selected, dx, dW);
 * - a group of one rank (NULL comm) is the serial layer bit for bit;
 * - TP x DP: the TP groups of a 4-rank world, each DP group its own rows;
 * - the fault "no TP all-reduce of wkv's gradient" fails the comparison;
 * - n_heads / o_groups / index_n_heads not divisible by TP is refused.
 */
#include <criterion/criterion.h>

#include "attn_weights.h"
#include "tp_world.h"

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/layout/groups.h"
#include "parallel/tp/tp_attn.h"

typedef par_attn_weights_f64 wts;
enum { NW = PAR_TEST_ATTN_NW, MAXW = 8 };

/* one layer of the model, the serial results */
typedef struct {
    par_config cfg;
    par_model_f64 M;
    int b;
    par_attn_dims dm;
    int64_t T, nw;
    int32_t *pos, *sel;
    double *x, *dy, *y, *dx;
    wts W;           /* into M.params */
    double *gbuf;    /* serial dW, [nw] */
    wts dW;
    double *zbuf;    /* zeros, [nw]: a full-size template for shards */
    wts Z;
} acase;

static void point(wts *W, double *buf, const par_attn_dims *dm)
{
    memset(W, 0, sizeof *W);
    int64_t off = 0;
    for (int k = 0; k < NW; k++) {
        int64_t n = wcount(dm, k, NULL);
        if (n) {
            *wslot(W, k) = buf + off;
            off += n;
        }
    }
}

static void model_weights(acase *A)
{
    const par_block_params *bp = &A->M.tab.blocks[A->b];
    const int idx[NW] = {bp->wq_a,      bp->q_norm,    bp->wq_b,      bp->wkv,
                         bp->kv_norm,   bp->wo_a,      bp->wo_b,      bp->attn_sink,
                         bp->cmp_wkv,   bp->cmp_wgate, bp->cmp_ape,   bp->cmp_norm,
                         bp->idx_wq_b,  bp->idx_weights_proj, bp->idx_cmp_wkv,
                         bp->idx_cmp_wgate, bp->idx_cmp_ape, bp->idx_cmp_norm};
    memset(&A->W, 0, sizeof A->W);
    for (int k = 0; k < NW; k++)
        *wslot(&A->W, k) = par_model_ptr_f64(&A->M, A->M.params, idx[k]);
}

static void case_init(acase *A, const char *const *sets, int b, uint64_t seed)
{
    openblas_set_num_threads(1);
    memset(A, 0, sizeof *A);
    A->cfg = tpw_config(sets);
    cr_assert_eq(par_model_init_f64(&A->M, &A->cfg, seed), PAR_OK, "%s", par_last_error());
    A->b = b;
    A->dm = A->M.adims[b];
    A->T = A->cfg.global_batch_size * A->cfg.seq_length;
    A->pos = tpw_positions(A->cfg.global_batch_size, A->cfg.seq_length, seed, A->cfg.vocab_size,
                           NULL);
    const int64_t T = A->T, d = A->dm.d;
    A->x = tpw_random(T * d, seed, "x", 0);
    A->dy = tpw_random(T * d, seed, "dy", 1);
    A->y = malloc((size_t)(T * d) * sizeof(double));
    A->dx = calloc((size_t)(T * d), sizeof(double));
    A->sel = calloc((size_t)(T * A->dm.topk), sizeof(int32_t));
    for (int k = 0; k < NW; k++)
        A->nw += wcount(&A->dm, k, NULL);
    A->gbuf = calloc((size_t)A->nw, sizeof(double));
    A->zbuf = calloc((size_t)A->nw, sizeof(double));
    point(&A->dW, A->gbuf, &A->dm);
    point(&A->Z, A->zbuf, &A->dm);
    model_weights(A);
    /* the serial layer */
    par_attn_saved_f64 s;
    void *buf = par_malloc(par_attn_saved_bytes_f64(&A->dm, T), PAR_TAG_ACT);
    par_attn_saved_carve_f64(&s, buf, &A->dm, T);
    cr_assert_eq(par_attn_forward_f64(A->y, &s, A->sel, A->x, A->pos, &A->W, &A->dm, T), PAR_OK,
                 "%s", par_last_error());
    wts dWs = A->dW;
    for (int k = 12; k < NW; k++)
        *wslot(&dWs, k) = NULL; /* as block.c: no gradient into the indexer */
    cr_assert_eq(par_attn_backward_f64(A->dx, &dWs, A->dy, &s, A->x, A->pos, &A->W, &A->dm, T),
                 PAR_OK, "%s", par_last_error());
    par_free(buf);
}

static void case_free(acase *A)
{
    par_model_free_f64(&A->M);
    free(A->pos);
    free(A->sel);
    free(A->x);
    free(A->dy);
    free(A->y);
    free(A->dx);
    free(A->gbuf);
    free(A->zbuf);
}

/* ---------------------------------------------------------------- world */

typedef struct {
    const acase *A;
    int tp, dp, sp, null_comm;
    unsigned faults;
    double *y, *dx;       /* [T, d]: written by the tp = 0 rank of the tokens' DP group (sp: owners) */
    int32_t *sel;         /* [T, topk] */
    double *dw;           /* [world, nw]: each rank's shard gradients, unsharded */
    par_tp_traffic tr[MAXW];
} run_ctx;

#define RCHECK(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond))                                                                         \
            return par_err(PAR_ECHECK, __VA_ARGS__);                                         \
    } while (0)

/* The layer on one rank: its DP group's rows, its shard, its tokens. */
static par_status rank_layer(run_ctx *c, int wr, par_comm *tpc, int dp)
{
    const acase *A = c->A;
    const par_attn_dims *dm = &A->dm;
    const int P = c->tp, r = tpc ? par_comm_rank(tpc) : 0;
    const int64_t Tg = A->T / c->dp, t0 = dp * Tg, d = dm->d, K = dm->topk;
    const int64_t Tx = c->sp ? Tg / P : Tg, x0 = t0 + (c->sp ? r * Tx : 0);
    par_tp tp = {.comm = c->null_comm ? NULL : tpc, .sp = c->sp, .faults = c->faults,
                 .traffic = &c->tr[wr]};
    const int64_t ns = par_tp_attn_shard_count_f64(dm, P);
    double *wb = malloc((size_t)ns * sizeof(double)), *gb = malloc((size_t)ns * sizeof(double));
    double *y = malloc((size_t)(Tx * d) * sizeof(double)), *dx = calloc((size_t)(Tx * d), 8);
    int32_t *sel = malloc((size_t)(Tx * K + 1) * sizeof(int32_t));
    RCHECK(wb && gb && y && dx && sel, "rank %d: buffers", wr);
    wts Wl, dWl;
    par_tp_attn_shard_f64(&Wl, wb, &A->W, dm, r, P);
    par_tp_attn_shard_f64(&dWl, gb, &A->Z, dm, r, P);
    par_tp_attn_saved_f64 sv;
    memset(&sv, 0, sizeof sv);
    par_status st = par_tp_attn_forward_f64(y, &sv, sel, A->x + x0 * d, A->pos + t0, &Wl, dm, Tg, &tp);
    if (!st)
        st = par_tp_attn_backward_f64(dx, &dWl, A->dy + x0 * d, &sv, &Wl, &tp);
    if (!st)
        st = par_tp_attn_reduce_grads_f64(&dWl, dm, &tp);
    if (!st && (c->sp || r == 0)) {
        memcpy(c->y + x0 * d, y, (size_t)(Tx * d) * sizeof(double));
        memcpy(c->dx + x0 * d, dx, (size_t)(Tx * d) * sizeof(double));
        if (dm->m == 4)
            memcpy(c->sel + x0 * K, sel, (size_t)(Tx * K) * sizeof(int32_t));
    }
    if (!st) {
        wts full;
        point(&full, c->dw + (size_t)wr * (size_t)A->nw, dm);
        par_tp_attn_unshard_f64(&full, &dWl, dm, r, P);
    }
    par_tp_attn_saved_free_f64(&sv);
    free(wb);
    free(gb);
    free(y);
    free(dx);
    free(sel);
    return st;
}

static par_status rank_fn(par_comm *world, void *arg)
{
    run_ctx *c = arg;
    const int N = c->tp * c->dp;
    par_layout l = tpw_layout(c->tp, 1, 1, 1, N);
    par_groups g;
    par_status st = par_groups_build(world, &l, &g);
    if (st)
        return st;
    par_rank_coords rc;
    if (!(st = par_rank_coords_of(&l, par_comm_rank(world), &rc)))
        st = rank_layer(c, par_comm_rank(world), g.g[PAR_GROUP_TP], rc.dp);
    par_groups_free(&g);
    return st;
}

static void run(run_ctx *c)
{
    const acase *A = c->A;
    const int N = c->tp * c->dp;
    c->y = calloc((size_t)(A->T * A->dm.d), sizeof(double));
    c->dx = calloc((size_t)(A->T * A->dm.d), sizeof(double));
    c->sel = calloc((size_t)(A->T * A->dm.topk), sizeof(int32_t));
    c->dw = calloc((size_t)N * (size_t)A->nw, sizeof(double));
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    par_world_opts o = {.timeout_s = 60.0, .rank_init = tpw_rank_init};
    par_status st = par_world_run(be, N, rank_fn, c, &o);
    cr_assert_eq(st, PAR_OK, "TP world failed: %s", par_last_error());
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "comm memory left");
}

static void run_free(run_ctx *c)
{
    free(c->y);
    free(c->dx);
    free(c->sel);
    free(c->dw);
}

/* How the issue cuts each slot (independent of parallel/layout/tp_split.c): 1 =
 * split over TP, 0 = replicated. */
static const int split_slot[NW] = {0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0};

/* The logical gradient: per DP group the ranks' shards (disjoint blocks of
 * the split slots; replicated slots from tp = 0, checked equal on every tp
 * rank), summed over DP groups in dp order. */
static double *gathered_grads(const run_ctx *c, int check_replicas)
{
    const acase *A = c->A;
    double *tot = calloc((size_t)A->nw, sizeof(double));
    for (int dp = 0; dp < c->dp; dp++) {
        const double *w0 = c->dw + (size_t)(dp * c->tp) * (size_t)A->nw;
        int64_t off = 0;
        for (int k = 0; k < NW; k++) {
            const int64_t n = wcount(&A->dm, k, NULL);
            for (int r = 0; r < c->tp && n; r++) {
                const double *w = c->dw + (size_t)(dp * c->tp + r) * (size_t)A->nw;
                if (!split_slot[k] && r > 0 && check_replicas)
                    cr_assert(tpw_bitwise(w0 + off, w + off, n),
                              "replicated d%s differs between tp ranks 0 and %d after the reduce",
                              wname[k], r);
                if (!split_slot[k] && r > 0)
                    continue;
                for (int64_t i = 0; i < n; i++)
                    tot[off + i] += w[off + i]; /* split: other ranks' blocks are 0 there */
            }
            off += n;
        }
    }
    return tot;
}

/* --------------------------------------------------------------- checks */

typedef struct {
    double y, dx, dw_rep; /* largest relative L2 errors against the serial layer */
} errs;

/* Everything against the serial layer; with bitwise_split the split slots'
 * gradients must be the serial bits (DP = 1). */
static errs check_against_serial(const run_ctx *c, const char *what, int bitwise_split)
{
    const acase *A = c->A;
    const int64_t T = A->T, d = A->dm.d, K = A->dm.topk;
    errs e = {0, 0, 0};
    if (A->dm.m == 4)
        for (int64_t t = 0; t < T; t++)
            cr_assert(!memcmp(c->sel + t * K, A->sel + t * K, (size_t)K * sizeof(int32_t)),
                      "%s: selected of token %lld differs from the serial layer", what, (long long)t);
    cr_assert(tpw_policy_f64(A->y, c->y, T * d, &e.y), "%s: y outside the f64 policy (rel %.3g)",
              what, e.y);
    cr_assert(tpw_policy_f64(A->dx, c->dx, T * d, &e.dx), "%s: dx outside the f64 policy (rel %.3g)",
              what, e.dx);
    double *g = gathered_grads(c, 1);
    int64_t off = 0;
    for (int k = 0; k < NW; k++) {
        const int64_t n = wcount(&A->dm, k, NULL);
        if (!n)
            continue;
        if (k >= 12) {
            for (int64_t i = 0; i < n; i++)
                cr_assert_eq(g[off + i], 0.0, "%s: indexer gradient %s touched", what, wname[k]);
        } else if (split_slot[k] && bitwise_split) {
            cr_assert(tpw_bitwise(A->gbuf + off, g + off, n),
                      "%s: d%s (split over TP) is not the serial layer's bits", what, wname[k]);
        } else {
            double r;
            cr_assert(tpw_policy_f64(A->gbuf + off, g + off, n, &r),
                      "%s: d%s outside the f64 policy (rel %.3g)", what, wname[k], r);
            e.dw_rep = fmax(e.dw_rep, r);
        }
        off += n;
    }
    free(g);
    cr_log_info("%s: rel L2 y %.3g, dx %.3g, worst dW %.3g", what, e.y, e.dx, e.dw_rep);
    return e;
}

/* Two TP runs bitwise equal (SP against no SP). */
static void check_same(const run_ctx *a, const run_ctx *b, const char *what)
{
    const acase *A = a->A;
    const int64_t T = A->T, d = A->dm.d;
    cr_assert(tpw_bitwise(a->y, b->y, T * d), "%s: y differs", what);
    cr_assert(tpw_bitwise(a->dx, b->dx, T * d), "%s: dx differs", what);
    cr_assert(!memcmp(a->sel, b->sel, (size_t)(T * A->dm.topk) * sizeof(int32_t)),
              "%s: selected differs", what);
    double *ga = gathered_grads(a, 1), *gb = gathered_grads(b, 1);
    cr_assert(tpw_bitwise(ga, gb, A->nw), "%s: dW differs", what);
    free(ga);
    free(gb);
}

/* One layer at one TP size: TP, TP + SP (bitwise the same), against the
 * serial layer. */
static void check_layer(const char *const *sets, int b, int tp, const char *what)
{
    acase A;
    case_init(&A, sets, b, 4242 + (uint64_t)(b * 7 + tp));
    run_ctx c = {.A = &A, .tp = tp, .dp = 1};
    run(&c);
    char w[160];
    snprintf(w, sizeof w, "%s, block %d (m=%lld), TP%d", what, b, (long long)A.dm.m, tp);
    check_against_serial(&c, w, 1);
    run_ctx s = {.A = &A, .tp = tp, .dp = 1, .sp = 1};
    run(&s);
    snprintf(w, sizeof w, "%s, block %d (m=%lld), TP%d + SP vs TP%d", what, b, (long long)A.dm.m, tp,
             tp);
    check_same(&c, &s, w);
    /* traffic: SP gathers x and dy, scatters y and dx (2 x 2 x T d reals over
     * a P-rank group); TP all-reduces y and dx */
    const int64_t Td8 = A.T * A.dm.d * 8;
    for (int r = 0; r < tp && tp > 1; r++) {
        cr_assert_eq(s.tr[r].allgather, 2 * Td8 / tp, "%s: rank %d SP all-gather bytes", w, r);
        cr_assert_eq(s.tr[r].reduce_scatter, 2 * Td8, "%s: rank %d SP reduce-scatter bytes", w, r);
        cr_assert(c.tr[r].allreduce >= 2 * Td8, "%s: rank %d TP all-reduce bytes", w, r);
        const int64_t nv = A.dm.m == 4 ? par_indexer_max_visible_f64(A.pos, 0, A.T) : 0;
        cr_assert_eq(c.tr[r].chain, r + 1 < tp ? A.T * nv * 8 : 0, "%s: rank %d chain bytes", w, r);
        cr_assert_eq(c.tr[r].bcast, A.dm.m == 4 && r == tp - 1 ? A.T * A.dm.topk * 4 : 0,
                     "%s: rank %d broadcast bytes", w, r);
    }
    run_free(&c);
    run_free(&s);
    case_free(&A);
    cr_assert_eq(par_alloc_live(PAR_TAG_ACT), 0, "%s: activation memory left", what);
}

static const char *const plain[] = {NULL};
/* 2 query heads and 2 index heads per rank at TP2, 1 group per rank */
static const char *const wide4[] = {"n_heads=4", "o_groups=2", "index_n_heads=4", NULL};
/* 1 of each per rank at TP4 */
static const char *const wide4g4[] = {"n_heads=4", "o_groups=4", "index_n_heads=4", NULL};
/* 2 heads, 1 group, 2 index heads per rank at TP4 */
static const char *const wide8[] = {"n_heads=8", "o_groups=4", "index_n_heads=8", NULL};

Test(tp_attn, tp2_v4_tiny)
{
    for (int b = 0; b < 4; b++) /* m = 0, 4, 16 and the MTP block (m = 0) */
        check_layer(plain, b, 2, "v4-tiny");
}

Test(tp_attn, tp2_two_heads_per_rank)
{
    check_layer(wide4, 1, 2, "n_heads 4, o_groups 2, index_n_heads 4");
    check_layer(wide4, 2, 2, "n_heads 4, o_groups 2, index_n_heads 4");
}

Test(tp_attn, tp4)
{
    check_layer(wide4g4, 1, 4, "n_heads 4, o_groups 4, index_n_heads 4");
    check_layer(wide8, 1, 4, "n_heads 8, o_groups 4, index_n_heads 8");
    check_layer(wide8, 2, 4, "n_heads 8, o_groups 4, index_n_heads 8");
}

Test(tp_attn, one_rank_is_the_serial_layer)
{
    acase A;
    case_init(&A, plain, 1, 99);
    run_ctx c = {.A = &A, .tp = 1, .dp = 1, .null_comm = 1};
    run(&c);
    const int64_t n = A.T * A.dm.d;
    cr_assert(tpw_bitwise(A.y, c.y, n) && tpw_bitwise(A.dx, c.dx, n), "TP1 y/dx not bitwise");
    double *g = gathered_grads(&c, 1);
    cr_assert(tpw_bitwise(A.gbuf, g, A.nw), "TP1 dW not bitwise");
    free(g);
    run_free(&c);
    case_free(&A);
}

Test(tp_attn, tp2_by_dp2_groups)
{
    /* world 4 = TP2 x DP2 (tp fastest): TP groups {0,1}, {2,3}; each DP group
     * its own 4 rows; gradients summed over DP */
    acase A;
    case_init(&A, wide4, 1, 77);
    run_ctx c = {.A = &A, .tp = 2, .dp = 2};
    run(&c);
    check_against_serial(&c, "TP2 x DP2, block 1 (m=4)", 0);
    run_free(&c);
    case_free(&A);
}

Test(tp_attn, missing_wkv_reduce_is_caught)
{
    acase A;
    case_init(&A, plain, 1, 5);
    run_ctx c = {.A = &A, .tp = 2, .dp = 1, .faults = PAR_TP_FAULT_WKV_NO_REDUCE};
    run(&c);
    double *g = gathered_grads(&c, 0);
    int64_t off = 0;
    for (int k = 0; k < 3; k++)
        off += wcount(&A.dm, k, NULL);
    const int64_t n = wcount(&A.dm, 3, NULL);
    double rel;
    int ok = tpw_policy_f64(A.gbuf + off, g + off, n, &rel);
    cr_assert(!ok, "the fault 'no TP all-reduce of wkv's gradient' passed the f64 policy");
    cr_assert(rel > 1e-3, "dwkv off by only %.3g (relative): one rank's heads should be missing", rel);
    cr_log_info("fault wkv_no_reduce: dwkv rel L2 error %.3g (caught)", rel);
    free(g);
    run_free(&c);
    case_free(&A);
}

Test(tp_attn, heads_not_divisible_refused)
{
    par_attn_dims dm = {.d = 32, .H = 2, .hd = 16, .rd = 8, .q_lora = 16, .o_groups = 2,
                        .o_lora = 8, .window = 8, .m = 4, .iH = 4, .ihd = 16, .topk = 4};
    par_attn_dims l;
    par_err_set_quiet(1);
    cr_assert_eq(par_tp_attn_dims_f64(&l, &dm, 4), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "tensor-model-parallel-size 4 does not divide n_heads 2"),
              "%s", par_last_error());
    dm.H = 4;
    cr_assert_eq(par_tp_attn_dims_f64(&l, &dm, 4), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "does not divide o_groups 2"), "%s", par_last_error());
    dm.o_groups = 4, dm.iH = 2;
    cr_assert_eq(par_tp_attn_dims_f64(&l, &dm, 4), PAR_EINVAL);
    cr_assert(strstr(par_last_error(), "does not divide index_n_heads 2"), "%s", par_last_error());
    dm.m = 16; /* no indexer: its heads do not matter */
    cr_assert_eq(par_tp_attn_dims_f64(&l, &dm, 4), PAR_OK);
    cr_assert_eq(l.H, 1);
    cr_assert_eq(l.o_groups, 1);
    par_err_set_quiet(0);
}

/* The premise of the bitwise claims: a column slice of a product (a shard's
 * output features, or its input-feature slice of a row-parallel weight's
 * gradient) has the bits of the same columns of the full product (dgemm,
 * one thread; measured on OpenBLAS 0.3.21).  If this fails on another BLAS,
 * the split slots are within the f64 policy instead of bitwise. */
Test(tp_attn, premise_gemm_column_slices_are_bitwise)
{
    openblas_set_num_threads(1);
    const int64_t M = 512, K = 32, N = 64;
    double *A = tpw_random(M * K, 1, "A", 0), *B = tpw_random(N * K, 1, "B", 0);
    double *C = malloc((size_t)(M * N) * sizeof(double)), *Cl = malloc((size_t)(M * N) * 8);
    for (int P = 2; P <= 4; P *= 2) {
        const int64_t Nl = N / P;
        par_linear_forward_f64(C, A, B, M, K, N); /* C = A B^T */
        for (int r = 0; r < P; r++) {
            par_linear_forward_f64(Cl, A, B + r * Nl * K, M, K, Nl);
            for (int64_t i = 0; i < M; i++)
                cr_assert(tpw_bitwise(C + i * N + r * Nl, Cl + i * Nl, Nl),
                          "x W^T: columns [%lld, %lld) of row %lld differ from the full product",
                          (long long)(r * Nl), (long long)((r + 1) * Nl), (long long)i);
        }
        /* dW = dY^T X, a slice of X's columns (dY [M, N], X = A [M, K]) */
        par_gemm_f64(1, 0, N, K, M, 1, C, N, A, K, 0, Cl, K);
        double *X = malloc((size_t)(M * K / P) * 8), *D = malloc((size_t)(N * K / P) * 8);
        for (int r = 0; r < P; r++) {
            for (int64_t i = 0; i < M; i++)
                memcpy(X + i * K / P, A + i * K + r * K / P, (size_t)(K / P) * 8);
            par_gemm_f64(1, 0, N, K / P, M, 1, C, N, X, K / P, 0, D, K / P);
            for (int64_t i = 0; i < N; i++)
                cr_assert(tpw_bitwise(Cl + i * K + r * K / P, D + i * K / P, K / P),
                          "dY^T X: a column slice differs from the full product");
        }
        free(X);
        free(D);
    }
    free(A);
    free(B);
    free(C);
    free(Cl);
}

static par_status sp_refuse_fn(par_comm *world, void *arg)
{
    int *ok = arg;
    par_attn_dims dm = {.d = 8, .H = 2, .hd = 8, .rd = 4, .q_lora = 6, .o_groups = 2,
                        .o_lora = 3, .window = 3, .m = 0, .iH = 2, .ihd = 8, .topk = 2,
                        .norm_eps = 1e-6};
    par_rope rope;
    par_rope_init(&rope, 4, 10000.0, 0, 16.0, 0, 32.0, 1.0);
    dm.rope = &rope;
    const int32_t pos[3] = {0, 1, 2};
    double x[3 * 8] = {0}, y[3 * 8];
    wts W;
    memset(&W, 0, sizeof W);
    par_tp tp = {.comm = world, .sp = 1};
    par_tp_attn_saved_f64 sv;
    memset(&sv, 0, sizeof sv);
    par_status st = par_tp_attn_forward_f64(y, &sv, NULL, x, pos, &W, &dm, 3, &tp);
    ok[par_comm_rank(world)] = st == PAR_EINVAL && sv.buf == NULL &&
                               strstr(par_last_error(), "splits the 3 tokens over 2 ranks");
    return PAR_OK;
}

Test(tp_attn, sp_tokens_not_divisible_refused)
{
    int ok[2] = {0, 0};
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    par_err_set_quiet(1);
    cr_assert_eq(par_world_run(be, 2, sp_refuse_fn, ok, NULL), PAR_OK);
    par_err_set_quiet(0);
    cr_assert(ok[0] && ok[1], "SP with 3 tokens over 2 ranks was not refused");
    cr_assert_eq(par_alloc_live(PAR_TAG_ACT), 0, "a refused forward left memory");
}
