/* parallel: vocab-parallel embedding, head and cross-entropy
 * (parallel/tp/tp_vocab.h) against the serial model's own embedding and main
 * head (model/head.c), f64, threads backend, the TP groups of
 * parallel/layout/groups.c.
 *
 * v4-tiny, one random packing of 8 x 64 (tokens, labels), a random residual
 * X [T, n, d]: the serial head runs hc_head, the final norm, the logits and
 * CE; the TP head starts from the same normed xn.  Checks:
 * - embedding rows and their gradient bitwise (one rank contributes each);
 * - the rank's logit columns bitwise; lse, ce, the loss, dhead and dxn
 *   within the f64 policy (the exp sum is split by rank);
 * - SP is bitwise TP without SP;
 * - the Megatron bug class "log(TP) added to the loss" (the softmax
 *   denominator reduced twice) fails the comparison by exactly log(TP).
 */
#include <criterion/criterion.h>

#include "tp_world.h"

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "parallel/layout/groups.h"
#include "parallel/tp/tp_vocab.h"

enum { MAXW = 8 };

typedef struct {
    par_config cfg;
    par_model_f64 M;
    int64_t T, d, V, n_main;
    int32_t *tokens, *labels;
    double *dh;                     /* [T, d] random gradient of the embedding output */
    double *emb_ref, *demb_ref;     /* serial h [T, d], dembed [V, d] */
    double *xn, *logits, *lse, *ce; /* serial head: [T, d], [T, V], [T], [T] */
    double *dxn, *dhead;            /* serial [T, d], [V, d] */
    double scale;
} vcase;

static void case_init(vcase *A, uint64_t seed)
{
    openblas_set_num_threads(1);
    memset(A, 0, sizeof *A);
    A->cfg = tpw_config(NULL);
    cr_assert_eq(par_model_init_f64(&A->M, &A->cfg, seed), PAR_OK, "%s", par_last_error());
    const int64_t B = A->cfg.global_batch_size, S = A->cfg.seq_length;
    A->T = B * S, A->d = A->cfg.dim, A->V = A->cfg.vocab_size;
    const int64_t T = A->T, d = A->d, V = A->V, n = A->cfg.hc_mult;
    par_pack_plan plan;
    par_batch b;
    cr_assert_eq(par_pack_plan_random(&plan, B, S, seed, 0), PAR_OK);
    cr_assert_eq(par_batch_alloc(&b, B, S), PAR_OK);
    cr_assert_eq(par_batch_fill(&b, &plan, seed, 0, V, NULL), PAR_OK);
    A->tokens = malloc((size_t)T * 4), A->labels = malloc((size_t)T * 4);
    memcpy(A->tokens, b.tokens, (size_t)T * 4);
    memcpy(A->labels, b.labels, (size_t)T * 4);
    A->n_main = b.n_labels;
    par_batch_free(&b);
    par_pack_plan_free(&plan);
    A->scale = 1.0 / (double)A->n_main;
    /* embedding */
    const double *E = par_model_ptr_f64(&A->M, A->M.params, A->M.tab.top.embed);
    A->emb_ref = malloc((size_t)(T * d) * 8);
    par_embedding_forward_f64(A->emb_ref, A->tokens, E, T, d);
    A->dh = tpw_random(T * d, seed, "dh", 1);
    A->demb_ref = calloc((size_t)(V * d), 8);
    par_embedding_backward_f64(A->demb_ref, A->dh, A->tokens, T, d);
    /* the model's main head on a random residual */
    double *X = tpw_random(T * n * d, seed, "X", 0);
    int32_t *sample = calloc((size_t)T, 4);
    double ce_sum = 0;
    par_head_act_f64 h;
    cr_assert_eq(par_head_forward_f64(&A->M, 0, &h, &A->M.arena, X, A->labels, sample, &ce_sum, T),
                 PAR_OK, "%s", par_last_error());
    A->xn = malloc((size_t)(T * d) * 8), A->logits = malloc((size_t)(T * V) * 8);
    A->lse = malloc((size_t)T * 8), A->ce = malloc((size_t)T * 8);
    memcpy(A->xn, h.xn, (size_t)(T * d) * 8);
    memcpy(A->logits, h.logits, (size_t)(T * V) * 8);
    memcpy(A->lse, h.lse, (size_t)T * 8);
    memcpy(A->ce, h.ce, (size_t)T * 8);
    double *dX = calloc((size_t)(T * n * d), 8);
    cr_assert_eq(par_head_backward_f64(&A->M, 0, &h, &A->M.arena, dX, A->scale), PAR_OK);
    A->dhead = malloc((size_t)(V * d) * 8);
    memcpy(A->dhead, par_model_ptr_f64(&A->M, A->M.grads, A->M.tab.top.head), (size_t)(V * d) * 8);
    /* dxn: the same kernel calls as head.c (not exposed by the model) */
    double *dl = calloc((size_t)(T * V), 8);
    A->dxn = calloc((size_t)(T * d), 8);
    par_xent_backward_f64(dl, A->logits, A->lse, A->labels, A->scale, T, V);
    par_linear_backward_f64(A->dxn, NULL, dl, A->xn,
                            par_model_ptr_f64(&A->M, A->M.params, A->M.tab.top.head), T, d, V);
    free(dl);
    free(dX);
    free(X);
    free(sample);
}

static void case_free(vcase *A)
{
    par_model_free_f64(&A->M);
    void *p[] = {A->tokens, A->labels, A->dh, A->emb_ref, A->demb_ref, A->xn, A->logits,
                 A->lse, A->ce, A->dxn, A->dhead};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        free(p[i]);
}

typedef struct {
    const vcase *A;
    int tp, sp;
    unsigned faults;
    double *h, *demb, *ce, *lse, *dxn, *dhead, *logits; /* full-size results */
} run_ctx;

#define RCHECK(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond))                                                                         \
            return par_err(PAR_ECHECK, __VA_ARGS__);                                         \
    } while (0)

static par_status rank_vocab(run_ctx *c, par_comm *tpc)
{
    const vcase *A = c->A;
    const int P = c->tp, r = par_comm_rank(tpc);
    const int64_t T = A->T, d = A->d, V = A->V, Vl = V / P, Tx = c->sp ? T / P : T;
    const int64_t x0 = c->sp ? r * Tx : 0;
    par_tp tp = {.comm = tpc, .sp = c->sp, .faults = c->faults};
    const double *E = par_model_ptr_f64(&A->M, A->M.params, A->M.tab.top.embed);
    const double *H = par_model_ptr_f64(&A->M, A->M.params, A->M.tab.top.head);
    double *h = malloc((size_t)(Tx * d) * 8), *demb = calloc((size_t)(Vl * d), 8);
    double *ce = malloc((size_t)Tx * 8), *lse = malloc((size_t)Tx * 8);
    double *dxn = calloc((size_t)(Tx * d), 8), *dhead = calloc((size_t)(Vl * d), 8);
    RCHECK(h && demb && ce && lse && dxn && dhead, "buffers");
    par_status st = par_tp_embed_forward_f64(h, A->tokens, E + r * Vl * d, V, d, T, &tp);
    if (!st)
        st = par_tp_embed_backward_f64(demb, A->dh + x0 * d, A->tokens, V, d, T, &tp);
    par_tp_head_saved_f64 sv;
    memset(&sv, 0, sizeof sv);
    if (!st)
        st = par_tp_head_forward_f64(ce, lse, &sv, A->xn + x0 * d, H + r * Vl * d, A->labels, V, d,
                                     T, &tp);
    if (!st)
        st = par_tp_head_backward_f64(dxn, dhead, &sv, H + r * Vl * d, A->scale, &tp);
    if (!st) {
        memcpy(c->h + x0 * d, h, (size_t)(Tx * d) * 8);
        memcpy(c->ce + x0, ce, (size_t)Tx * 8);
        memcpy(c->lse + x0, lse, (size_t)Tx * 8);
        memcpy(c->dxn + x0 * d, dxn, (size_t)(Tx * d) * 8);
        memcpy(c->demb + r * Vl * d, demb, (size_t)(Vl * d) * 8);
        memcpy(c->dhead + r * Vl * d, dhead, (size_t)(Vl * d) * 8);
        for (int64_t t = 0; t < T; t++)
            memcpy(c->logits + t * V + r * Vl, sv.logits + t * Vl, (size_t)Vl * 8);
    }
    par_tp_head_saved_free_f64(&sv);
    free(h);
    free(demb);
    free(ce);
    free(lse);
    free(dxn);
    free(dhead);
    return st;
}

static par_status rank_fn(par_comm *world, void *arg)
{
    run_ctx *c = arg;
    par_layout l = tpw_layout(c->tp, 1, 1, 1, c->tp);
    par_groups g;
    par_status st = par_groups_build(world, &l, &g);
    if (st)
        return st;
    st = rank_vocab(c, g.g[PAR_GROUP_TP]);
    par_groups_free(&g);
    return st;
}

static void run(run_ctx *c)
{
    const vcase *A = c->A;
    const int64_t T = A->T, d = A->d, V = A->V;
    c->h = calloc((size_t)(T * d), 8), c->demb = calloc((size_t)(V * d), 8);
    c->ce = calloc((size_t)T, 8), c->lse = calloc((size_t)T, 8);
    c->dxn = calloc((size_t)(T * d), 8), c->dhead = calloc((size_t)(V * d), 8);
    c->logits = calloc((size_t)(T * V), 8);
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    par_world_opts o = {.timeout_s = 60.0, .rank_init = tpw_rank_init};
    cr_assert_eq(par_world_run(be, c->tp, rank_fn, c, &o), PAR_OK, "%s", par_last_error());
}

static void run_free(run_ctx *c)
{
    void *p[] = {c->h, c->demb, c->ce, c->lse, c->dxn, c->dhead, c->logits};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++)
        free(p[i]);
}

static double mean_loss(const double *ce, const int32_t *labels, int64_t T, int64_t n)
{
    double s = 0;
    for (int64_t t = 0; t < T; t++)
        if (labels[t] >= 0)
            s += ce[t];
    return s / (double)n;
}

static void check_tp(int tp)
{
    vcase A;
    case_init(&A, 1000 + (uint64_t)tp);
    const int64_t T = A.T, d = A.d, V = A.V;
    run_ctx c = {.A = &A, .tp = tp}, s = {.A = &A, .tp = tp, .sp = 1};
    run(&c);
    run(&s);
    cr_assert(tpw_bitwise(A.emb_ref, c.h, T * d), "TP%d: embedding rows not bitwise", tp);
    cr_assert(tpw_bitwise(A.demb_ref, c.demb, V * d), "TP%d: dembed not bitwise", tp);
    cr_assert(tpw_bitwise(A.logits, c.logits, T * V), "TP%d: logit columns not bitwise", tp);
    double e[5];
    const double *ref[5] = {A.lse, A.ce, A.dxn, A.dhead, NULL};
    const double *got[5] = {c.lse, c.ce, c.dxn, c.dhead, NULL};
    const int64_t n[5] = {T, T, T * d, V * d, 0};
    const char *nm[5] = {"lse", "ce", "dxn", "dhead", NULL};
    for (int i = 0; i < 4; i++)
        cr_assert(tpw_policy_f64(ref[i], got[i], n[i], &e[i]), "TP%d: %s outside the f64 policy "
                  "(rel %.3g)", tp, nm[i], e[i]);
    const double l0 = mean_loss(A.ce, A.labels, T, A.n_main), l1 = mean_loss(c.ce, A.labels, T, A.n_main);
    cr_log_info("TP%d vocab: rel L2 lse %.3g, ce %.3g, dxn %.3g, dhead %.3g; loss %.17g vs serial "
                "%.17g (diff %.3g)", tp, e[0], e[1], e[2], e[3], l1, l0, l1 - l0);
    cr_assert(fabs(l1 - l0) <= 1e-12 * fabs(l0), "TP%d: loss differs by %.3g", tp, l1 - l0);
    /* SP: the same bits */
    cr_assert(tpw_bitwise(c.h, s.h, T * d) && tpw_bitwise(c.demb, s.demb, V * d) &&
              tpw_bitwise(c.ce, s.ce, T) && tpw_bitwise(c.dxn, s.dxn, T * d) &&
              tpw_bitwise(c.dhead, s.dhead, V * d), "TP%d + SP differs from TP%d", tp, tp);
    run_free(&c);
    run_free(&s);
    case_free(&A);
}

Test(tp_vocab, tp2) { check_tp(2); }
Test(tp_vocab, tp4) { check_tp(4); }

Test(tp_vocab, log_tp_added_to_the_loss_is_caught)
{
    for (int tp = 2; tp <= 4; tp *= 2) {
        vcase A;
        case_init(&A, 7);
        run_ctx c = {.A = &A, .tp = tp, .faults = PAR_TP_FAULT_CE_LOG_TP};
        run(&c);
        double rel;
        cr_assert(!tpw_policy_f64(A.ce, c.ce, A.T, &rel), "TP%d: the wrong CE passed the policy", tp);
        const double l0 = mean_loss(A.ce, A.labels, A.T, A.n_main);
        const double l1 = mean_loss(c.ce, A.labels, A.T, A.n_main);
        cr_assert(fabs((l1 - l0) - log((double)tp)) < 1e-9,
                  "TP%d: the wrong CE moved the loss by %.12g, not log(TP) = %.12g", tp, l1 - l0,
                  log((double)tp));
        cr_log_info("fault ce_log_tp at TP%d: loss %.12g vs serial %.12g: off by %.12g = log(%d) "
                    "(caught: ce rel L2 %.3g)", tp, l1, l0, l1 - l0, tp, rel);
        run_free(&c);
        case_free(&A);
    }
}

static par_status refuse_fn(par_comm *world, void *arg)
{
    int *refused = arg;
    par_tp tp = {.comm = world};
    par_status st = par_tp_vocab_check_f64(128, 512, &tp);
    refused[par_comm_rank(world)] =
        st == PAR_EINVAL &&
        strstr(par_last_error(), "tensor-model-parallel-size 3 does not divide vocab_size 128");
    tp.sp = 1;
    refused[3 + par_comm_rank(world)] =
        par_tp_vocab_check_f64(126, 512, &tp) == PAR_EINVAL &&
        strstr(par_last_error(), "splits the 512 tokens over 3 ranks");
    return PAR_OK;
}

Test(tp_vocab, vocab_not_divisible_refused)
{
    int refused[6] = {0};
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    par_err_set_quiet(1);
    cr_assert_eq(par_world_run(be, 3, refuse_fn, refused, NULL), PAR_OK);
    par_err_set_quiet(0);
    for (int i = 0; i < 6; i++)
        cr_assert(refused[i], "rank %d did not refuse (%s)", i % 3, i < 3 ? "vocab" : "tokens");
}
