/* tests/model/test_gradcheck.c - the whole model's gradient against central
 * differences of the total loss (f64): along random directions over ALL
 * parameters with a gradient, and per parameter group. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/rng.h"
#include "model/data.h"
#include "model/model.h"

typedef struct {
    par_model_f64 M;
    par_batch batch;
} fixture;

/* v4-tiny with B = 2 rows of S = 48: row 0 one sample of 48 (all compressed
 * blocks, indexer with more entries than index_topk), row 1 samples 5, 20, 23. */
static void setup_model(fixture *f, const char *overrides[][2], int nov)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    cfg.global_batch_size = 2;
    cfg.seq_length = 48;
    for (int i = 0; i < nov; i++)
        cr_assert_eq(par_config_set(&cfg, overrides[i][0], overrides[i][1]), 0, "%s", par_last_error());
    cr_assert_eq(par_config_validate(&cfg), 0, "%s", par_last_error());
    cr_assert_eq(par_model_init_f64(&f->M, &cfg, 7), 0, "%s", par_last_error());
    const int64_t r0[] = {48}, r1[] = {5, 20, 23};
    const int64_t *rows[] = {r0, r1};
    const int64_t counts[] = {1, 3};
    par_pack_plan plan;
    cr_assert_eq(par_pack_plan_from_rows(&plan, 2, 48, rows, counts), 0, "%s", par_last_error());
    cr_assert_eq(par_batch_alloc(&f->batch, 2, 48), 0);
    cr_assert_eq(par_batch_fill(&f->batch, &plan, 11, 0, cfg.vocab_size, NULL), 0, "%s", par_last_error());
    par_pack_plan_free(&plan);
}

static void teardown_model(fixture *f)
{
    par_model_free_f64(&f->M);
    par_batch_free(&f->batch);
    cr_assert_eq(par_alloc_live_total(), 0, "memory still live: %lld bytes", (long long)par_alloc_live_total());
}

static double loss_at(fixture *f)
{
    cr_assert_eq(par_model_forward_f64(&f->M, &f->batch), 0, "%s", par_last_error());
    return f->M.last.loss;
}

/* Directional derivative along v (restricted to entries with a gradient and
 * accepted by `want`), central differences with step h. */
static double check_direction(fixture *f, uint64_t seed, int (*want)(const par_param *p), double h,
                              double *out_dd)
{
    par_model_f64 *M = &f->M;
    int64_t nf = M->tab.n_float;
    double *v = par_calloc((size_t)nf, sizeof(double), PAR_TAG_MISC);
    double *p0 = par_malloc((size_t)nf * sizeof(double), PAR_TAG_MISC);
    cr_assert(v && p0);
    memcpy(p0, M->params, (size_t)nf * sizeof(double));
    par_philox_key key = par_rng_key(seed, "gradcheck-direction");
    double nrm = 0;
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype != PAR_PDT_REAL || !p->has_grad || (want && !want(p)))
            continue;
        for (int64_t j = 0; j < p->numel; j++) {
            double x = par_rng_normal(key, (uint64_t)(p->offset + j), 0);
            v[p->offset + j] = x;
            nrm += x * x;
        }
    }
    nrm = sqrt(nrm);
    cr_assert_gt(nrm, 0);
    double analytic = 0;
    for (int64_t j = 0; j < nf; j++) {
        v[j] /= nrm;
        analytic += M->grads[j] * v[j];
    }
    for (int64_t j = 0; j < nf; j++)
        M->params[j] = p0[j] + h * v[j];
    double lp = loss_at(f);
    for (int64_t j = 0; j < nf; j++)
        M->params[j] = p0[j] - h * v[j];
    double lm = loss_at(f);
    memcpy(M->params, p0, (size_t)nf * sizeof(double));
    double numeric = (lp - lm) / (2 * h);
    par_free(v);
    par_free(p0);
    *out_dd = analytic;
    double err = fabs(numeric - analytic) / fmax(fabs(numeric), fabs(analytic));
    fprintf(stderr, "gradcheck seed %llu: analytic %.15g numeric %.15g rel err %.3g\n",
            (unsigned long long)seed, analytic, numeric, err);
    return err;
}

static void forward_backward(fixture *f)
{
    cr_assert_eq(par_model_forward_f64(&f->M, &f->batch), 0, "%s", par_last_error());
    cr_assert_eq(par_model_backward_f64(&f->M), 0, "%s", par_last_error());
}

Test(gradcheck, whole_model_random_directions)
{
    fixture f;
    setup_model(&f, NULL, 0);
    forward_backward(&f);
    cr_assert_gt(f.M.last.loss_aux, 0);
    cr_assert_gt(f.M.last.loss_mtp, 0);
    double dd;
    for (uint64_t s = 1; s <= 3; s++) {
        double err = check_direction(&f, s, NULL, 1e-5, &dd);
        cr_expect_lt(err, 1e-6, "direction %llu: relative error %.3g", (unsigned long long)s, err);
    }
    teardown_model(&f);
}

static const char *group_pat;
static int in_group(const par_param *p) { return strstr(p->name, group_pat) != NULL; }

/* Per group, so that a wrong piece is named: each group alone must agree. */
Test(gradcheck, parameter_groups)
{
    fixture f;
    setup_model(&f, NULL, 0);
    forward_backward(&f);
    static const char *groups[] = {"embed.weight", "head.weight", "hc_head", "layers.0.attn.",
                                   "layers.1.attn.", "layers.2.attn.", "layers.0.ffn.", "layers.1.ffn.",
                                   "layers.2.ffn.gate", "hc_attn", "hc_ffn", "mtp.0.e_proj",
                                   "mtp.0.h_proj", "mtp.0.enorm", "mtp.0.hnorm", "mtp.0.attn.",
                                   "mtp.0.ffn.", "norm.weight", "attn_sink"};
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        group_pat = groups[g];
        double dd;
        double err = check_direction(&f, 100 + g, in_group, 1e-5, &dd);
        /* small groups: central differences of a loss ~7 with h = 1e-5 carry a
         * rounding error ~1e-10 in absolute terms, so allow that floor */
        double abs_err = err * fabs(dd);
        cr_expect(err < 1e-6 || abs_err < 5e-10, "group %s: relative error %.3g (dd %.3g, abs %.3g)", groups[g],
                  err, dd, abs_err);
    }
    teardown_model(&f);
}

/* Terms switched on one at a time: main only, MTP only, aux only. */
Test(gradcheck, loss_terms_separately)
{
    const char *cases[3][2][2] = {
        {{"mtp_lambda", "0"}, {"aux_alpha", "0"}},
        {{"mtp_lambda", "1"}, {"aux_alpha", "0"}},
        {{"mtp_lambda", "0"}, {"aux_alpha", "1"}},
    };
    for (int c = 0; c < 3; c++) {
        fixture f;
        setup_model(&f, cases[c], 2);
        forward_backward(&f);
        double dd;
        double err = check_direction(&f, 40 + (uint64_t)c, NULL, 1e-5, &dd);
        cr_expect_lt(err, 1e-6, "case %d: relative error %.3g", c, err);
        teardown_model(&f);
    }
}
