/* tests/model/test_model.c - the model object: construction, refusals,
 * memory accounting, the update, MTP switched off. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "model/data.h"
#include "model/model.h"

static void tiny(par_config *cfg, int64_t B, int64_t S)
{
    cr_assert_eq(par_config_preset(cfg, "v4-tiny"), 0);
    cfg->global_batch_size = B;
    cfg->seq_length = S;
}

static void fill(par_batch *b, const par_config *cfg, uint64_t seed)
{
    par_pack_plan plan;
    cr_assert_eq(par_batch_alloc(b, cfg->global_batch_size, cfg->seq_length), 0);
    cr_assert_eq(par_pack_plan_random(&plan, cfg->global_batch_size, cfg->seq_length, seed, 0), 0);
    cr_assert_eq(par_batch_fill(b, &plan, seed, 0, cfg->vocab_size, NULL), 0, "%s", par_last_error());
    par_pack_plan_free(&plan);
}

Test(model, init_sizes_and_free)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-mini"), 0);
    par_model_f64 M;
    cr_assert_eq(par_model_init_f64(&M, &cfg, 1), 0, "%s", par_last_error());
    int64_t nf = 0, ni = 0;
    cr_assert_eq(par_param_count(&cfg, NULL, &nf, &ni), 0);
    cr_expect_eq(M.tab.n_float, nf);
    cr_expect_eq(M.tab.n_i32, ni);
    cr_expect_eq(par_alloc_live(PAR_TAG_PARAM), (int64_t)(nf * 8 + (ni > 0 ? ni : 1) * 4));
    cr_expect_eq(par_alloc_live(PAR_TAG_GRAD), nf * 8);
    cr_expect_eq(par_alloc_live(PAR_TAG_OPTIM), nf * 16);
    cr_expect_eq(M.n_blocks, 9);
    /* RoPE: m == 0 blocks without YaRN, m > 0 with (frequencies differ) */
    cr_expect_eq(M.adims[8].m, 0);
    cr_expect_neq(M.adims[0].rope->freq[3], M.adims[8].rope->freq[3]);
    par_model_free_f64(&M);
    cr_expect_eq(par_alloc_live_total(), 0);
}

Test(model, refusals)
{
    par_config cfg;
    tiny(&cfg, 2, 16);
    par_model_f64 M;
    par_err_set_quiet(1);
    cfg.n_mtp_layers = 2;
    cr_expect_neq(par_model_init_f64(&M, &cfg, 1), 0);
    tiny(&cfg, 2, 16);
    cr_assert_eq(par_model_init_f64(&M, &cfg, 1), 0, "%s", par_last_error());
    cr_expect_eq(par_model_backward_f64(&M), PAR_EINVAL);
    cr_expect_eq(par_model_update_f64(&M), PAR_EINVAL);
    par_err_set_quiet(0);
    par_model_free_f64(&M);
    par_model_free_f64(&M); /* twice is fine */
    cr_expect_eq(par_alloc_live_total(), 0);
}

Test(model, update_moves_params_and_bias)
{
    par_config cfg;
    tiny(&cfg, 2, 32);
    par_model_f64 M;
    cr_assert_eq(par_model_init_f64(&M, &cfg, 3), 0, "%s", par_last_error());
    par_batch b;
    fill(&b, &cfg, 5);
    size_t nf = (size_t)M.tab.n_float;
    double *p0 = par_malloc(nf * sizeof(double), PAR_TAG_MISC);
    memcpy(p0, M.params, nf * sizeof(double));
    par_step_scalars sc;
    cr_assert_eq(par_model_step_f64(&M, &b, &sc), 0, "%s", par_last_error());
    cr_expect_eq(M.step, 1);
    cr_expect(isfinite(sc.loss) && sc.loss > 0);
    cr_expect_gt(sc.grad_norm, 0);
    cr_expect(fabs(sc.loss - (sc.loss_main + cfg.mtp_lambda * sc.loss_mtp + cfg.aux_alpha * sc.loss_aux)) <
              1e-12 * sc.loss);
    /* gate.bias of a score layer moved by exactly +-rate or 0 */
    int bi = M.tab.blocks[1].gate_bias;
    cr_assert_geq(bi, 0);
    int moved = 0;
    for (int64_t e = 0; e < M.E; e++) {
        double dlt = M.params[M.tab.p[bi].offset + e] - p0[M.tab.p[bi].offset + e];
        cr_expect(fabs(dlt) == 0 || fabs(fabs(dlt) - cfg.bias_update_rate) < 1e-15, "bias moved by %g", dlt);
        moved |= dlt != 0;
    }
    cr_expect(moved);
    /* a Muon weight changed */
    int wi = M.tab.blocks[0].wq_a;
    cr_expect(memcmp(M.params + M.tab.p[wi].offset, p0 + M.tab.p[wi].offset,
                     (size_t)M.tab.p[wi].numel * sizeof(double)));
    par_free(p0);
    par_batch_free(&b);
    par_model_free_f64(&M);
    cr_expect_eq(par_alloc_live_total(), 0);
}

Test(model, no_mtp_layer)
{
    par_config cfg;
    tiny(&cfg, 2, 32);
    cr_assert_eq(par_config_set(&cfg, "n_mtp_layers", "0"), 0);
    cr_assert_eq(par_config_set(&cfg, "compress_ratios", "0,4,16"), 0);
    cr_assert_eq(par_config_validate(&cfg), 0, "%s", par_last_error());
    par_model_f64 M;
    cr_assert_eq(par_model_init_f64(&M, &cfg, 3), 0, "%s", par_last_error());
    par_batch b;
    fill(&b, &cfg, 6);
    par_step_scalars sc;
    cr_assert_eq(par_model_step_f64(&M, &b, &sc), 0, "%s", par_last_error());
    cr_expect_eq(sc.loss_mtp, 0.0);
    cr_expect(fabs(sc.loss - (sc.loss_main + cfg.aux_alpha * sc.loss_aux)) < 1e-12 * sc.loss);
    par_batch_free(&b);
    par_model_free_f64(&M);
    cr_expect_eq(par_alloc_live_total(), 0);
}

/* Rows of length 1 samples only: no main and no MTP target anywhere; the
 * terms are left out and the step still runs (aux loss only). */
Test(model, terms_with_zero_count_are_left_out)
{
    par_config cfg;
    tiny(&cfg, 1, 8);
    par_model_f64 M;
    cr_assert_eq(par_model_init_f64(&M, &cfg, 3), 0, "%s", par_last_error());
    const int64_t r0[] = {1, 1, 1, 1, 1, 1, 1, 1};
    const int64_t *rows[] = {r0};
    const int64_t counts[] = {8};
    par_pack_plan plan;
    cr_assert_eq(par_pack_plan_from_rows(&plan, 1, 8, rows, counts), 0);
    par_batch b;
    cr_assert_eq(par_batch_alloc(&b, 1, 8), 0);
    cr_assert_eq(par_batch_fill(&b, &plan, 1, 0, cfg.vocab_size, NULL), 0);
    par_pack_plan_free(&plan);
    par_step_scalars sc;
    cr_assert_eq(par_model_step_f64(&M, &b, &sc), 0, "%s", par_last_error());
    cr_expect_eq(M.stats.n_main, 0);
    cr_expect_eq(M.stats.n_mtp, 0);
    cr_expect_eq(sc.loss_main, 0.0);
    cr_expect_eq(sc.loss_mtp, 0.0);
    cr_expect(isfinite(sc.loss));
    cr_expect(fabs(sc.loss - cfg.aux_alpha * sc.loss_aux) < 1e-15);
    par_batch_free(&b);
    par_model_free_f64(&M);
    cr_expect_eq(par_alloc_live_total(), 0);
}
