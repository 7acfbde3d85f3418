/* tests/model/test_split.c - the backward in two passes (model/model.h):
 * the input pass (B) of two microbatches, then their weight passes (W), as a
 * zero-bubble pipeline runs them, give the same bits as the one-pass
 * backward of each in turn: every weight gradient is the same GEMM or sum on
 * the same inputs, and W reads only what its own B kept. */
#include <criterion/criterion.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"
#include "model/data.h"
#include "model/model.h"

#define B_ 2
#define S_ 32

typedef struct {
    par_model_f64 M;
    par_batch batch;
    int64_t T;
    double *X[2], *G[2]; /* [T, n, d]: two block inputs, two output gradients */
} fixture;

static void fill(double *x, int64_t n, uint64_t seed)
{
    par_philox_key key = par_rng_key(seed, "test_split");
    for (int64_t i = 0; i < n; i++)
        x[i] = par_rng_uniform(key, (uint64_t)i, 0) - 0.5;
}

static void setup(fixture *f)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    cfg.global_batch_size = B_;
    cfg.seq_length = S_;
    cr_assert_eq(par_config_validate(&cfg), 0, "%s", par_last_error());
    cr_assert_eq(par_model_init_f64(&f->M, &cfg, 7), 0, "%s", par_last_error());
    const int64_t r0[] = {20, 12}, r1[] = {32};
    const int64_t *rows[] = {r0, r1};
    const int64_t counts[] = {2, 1};
    par_pack_plan plan;
    cr_assert_eq(par_pack_plan_from_rows(&plan, B_, S_, rows, counts), 0, "%s", par_last_error());
    cr_assert_eq(par_batch_alloc(&f->batch, B_, S_), 0);
    cr_assert_eq(par_batch_fill(&f->batch, &plan, 3, 0, cfg.vocab_size, NULL), 0, "%s", par_last_error());
    par_pack_plan_free(&plan);
    /* the model's forward gives the statistics the aux backward reads */
    cr_assert_eq(par_model_forward_f64(&f->M, &f->batch), 0, "%s", par_last_error());
    f->T = (int64_t)B_ * S_;
    int64_t nx = f->T * f->M.n * f->M.d;
    for (int k = 0; k < 2; k++) {
        f->X[k] = par_malloc((size_t)nx * sizeof(double), PAR_TAG_MISC);
        f->G[k] = par_malloc((size_t)nx * sizeof(double), PAR_TAG_MISC);
        cr_assert(f->X[k] && f->G[k]);
        fill(f->X[k], nx, 11 + (uint64_t)k);
        fill(f->G[k], nx, 21 + (uint64_t)k);
    }
}

static void teardown(fixture *f)
{
    for (int k = 0; k < 2; k++) {
        par_free(f->X[k]);
        par_free(f->G[k]);
    }
    par_model_free_f64(&f->M);
    par_batch_free(&f->batch);
    cr_assert_eq(par_alloc_live_total(), 0, "memory still live: %lld bytes", (long long)par_alloc_live_total());
}

/* Block b on both inputs, then the backward: split 0 one pass each, split
 * 1 B, B, W, W.  The gradients (into M.grads) and both dX into out. */
static void run_block(fixture *f, int b, int split, double *dx_out[2])
{
    par_model_f64 *M = &f->M;
    par_arena ar[2];
    par_block_act_f64 a[2];
    memset(a, 0, sizeof a);
    memset(M->grads, 0, (size_t)M->n_local * sizeof *M->grads);
    int64_t nx = f->T * M->n * M->d;
    for (int k = 0; k < 2; k++) {
        par_arena_init(&ar[k], (size_t)1 << 20, PAR_TAG_ACT);
        cr_assert_eq(par_block_forward_f64(M, NULL, b, &a[k], &ar[k], f->X[k], f->batch.tokens, f->batch.pos,
                                           M->sample, NULL, f->T),
                     0, "%s", par_last_error());
        memset(dx_out[k], 0, (size_t)nx * sizeof(double));
    }
    const double aux = M->cfg.aux_alpha;
    for (int k = 0; k < 2; k++)
        cr_assert_eq(split ? par_block_backward_input_f64(M, NULL, b, &a[k], &ar[k], dx_out[k], f->G[k],
                                                          f->batch.pos, M->sample, &M->stats, aux, f->T)
                           : par_block_backward_f64(M, NULL, b, &a[k], &ar[k], dx_out[k], f->G[k], f->batch.pos,
                                                    M->sample, &M->stats, aux, f->T),
                     0, "%s", par_last_error());
    for (int k = 0; split && k < 2; k++)
        cr_assert_eq(par_block_backward_weights_f64(M, NULL, b, &a[k], &ar[k]), 0, "%s", par_last_error());
    for (int k = 0; k < 2; k++) {
        par_block_act_release_f64(&a[k]);
        par_arena_destroy(&ar[k]);
    }
}

Test(split, block_b_b_w_w_is_two_one_pass_backwards_bit_for_bit)
{
    fixture f;
    setup(&f);
    par_model_f64 *M = &f.M;
    int64_t nx = f.T * M->n * M->d;
    double *dx[2][2], *g[2];
    for (int s = 0; s < 2; s++) {
        g[s] = par_malloc((size_t)M->n_local * sizeof(double), PAR_TAG_MISC);
        for (int k = 0; k < 2; k++)
            dx[s][k] = par_malloc((size_t)nx * sizeof(double), PAR_TAG_MISC);
    }
    for (int b = 0; b < M->n_blocks; b++) {
        for (int s = 0; s < 2; s++) {
            run_block(&f, b, s, dx[s]);
            memcpy(g[s], M->grads, (size_t)M->n_local * sizeof(double));
        }
        cr_expect_eq(memcmp(g[0], g[1], (size_t)M->n_local * sizeof(double)), 0, "block %d: weight gradients differ",
                     b);
        for (int k = 0; k < 2; k++)
            cr_expect_eq(memcmp(dx[0][k], dx[1][k], (size_t)nx * sizeof(double)), 0, "block %d: dX %d differs", b, k);
        double nz = 0;
        for (int64_t i = 0; i < M->n_local; i++)
            nz += g[1][i] != 0;
        cr_expect_gt(nz, 100, "block %d: W wrote weight gradients", b);
    }
    for (int s = 0; s < 2; s++) {
        par_free(g[s]);
        for (int k = 0; k < 2; k++)
            par_free(dx[s][k]);
    }
    teardown(&f);
}

/* B without its W is refused a second B; W without B is an error. */
Test(split, passes_out_of_order_are_refused)
{
    fixture f;
    setup(&f);
    par_model_f64 *M = &f.M;
    int64_t nx = f.T * M->n * M->d;
    double *dx = par_calloc((size_t)nx, sizeof(double), PAR_TAG_MISC);
    par_arena ar;
    par_arena_init(&ar, (size_t)1 << 20, PAR_TAG_ACT);
    par_block_act_f64 a;
    memset(&a, 0, sizeof a);
    cr_assert_eq(par_block_forward_f64(M, NULL, 0, &a, &ar, f.X[0], f.batch.tokens, f.batch.pos, M->sample, NULL, f.T),
                 0);
    par_err_set_quiet(1);
    cr_expect_eq(par_block_backward_weights_f64(M, NULL, 0, &a, &ar), PAR_EINVAL, "W before B");
    cr_expect_eq(par_block_backward_input_f64(M, NULL, 0, &a, &ar, dx, f.G[0], f.batch.pos, M->sample, &M->stats,
                                              0.0, f.T),
                 0);
    cr_expect_eq(par_block_backward_input_f64(M, NULL, 0, &a, &ar, dx, f.G[0], f.batch.pos, M->sample, &M->stats,
                                              0.0, f.T),
                 PAR_EINVAL, "a second B before W");
    par_err_set_quiet(0);
    cr_expect_eq(par_block_backward_weights_f64(M, NULL, 0, &a, &ar), 0, "%s", par_last_error());
    par_block_act_release_f64(&a);
    par_arena_destroy(&ar);
    par_free(dx);
    teardown(&f);
}
