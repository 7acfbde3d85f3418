/* model: deterministic initialization. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "model/init.h"
#include "model/params.h"

static par_param_table T;
static double *W;
static int32_t *I;

static void setup(void)
{
    par_err_set_quiet(1);
    par_config c;
    par_config_preset(&c, "v4-tiny");
    cr_assert_eq(par_param_table_build(&T, &c), PAR_OK);
    W = par_malloc((size_t)T.n_float * sizeof *W, PAR_TAG_PARAM);
    I = par_malloc((size_t)T.n_i32 * sizeof *I, PAR_TAG_PARAM);
    cr_assert(W && I);
    par_init_params_f64(W, I, &T, 1234);
}
static void teardown(void)
{
    par_free(W);
    par_free(I);
    par_param_table_free(&T);
}

TestSuite(init, .init = setup, .fini = teardown);

static const par_param *get(const char *name)
{
    const par_param *p = par_param_lookup(&T, name);
    cr_assert(p, "missing %s", name);
    return p;
}

static void moments(const par_param *p, double *mean, double *std)
{
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < p->numel; i++) {
        s += W[p->offset + i];
        s2 += W[p->offset + i] * W[p->offset + i];
    }
    *mean = s / p->numel;
    *std = sqrt(s2 / p->numel - *mean * *mean);
}

Test(init, pure_function_of_seed_name_index)
{
    double *W2 = par_malloc((size_t)T.n_float * sizeof *W2, PAR_TAG_PARAM);
    par_init_params_f64(W2, NULL, &T, 1234);
    cr_expect_eq(memcmp(W, W2, (size_t)T.n_float * sizeof *W), 0, "same seed, same bits");
    par_init_params_f64(W2, NULL, &T, 1235);
    const par_param *p = get("layers.0.attn.wq_a.weight");
    int64_t diff = 0;
    for (int64_t i = 0; i < p->numel; i++)
        diff += W2[p->offset + i] != W[p->offset + i];
    cr_expect_gt(diff, p->numel / 2, "another seed, other values");
    par_free(W2);
    /* each element equals the double-valued pure function (f32 would round it once) */
    for (int idx = 0; idx < T.n; idx += 7) {
        const par_param *q = &T.p[idx];
        if (q->dtype != PAR_PDT_REAL)
            continue;
        for (int64_t i = 0; i < q->numel; i += 13)
            cr_expect_eq(W[q->offset + i], par_param_init_value(&T, idx, 1234, i), "%s[%lld]", q->name, (long long)i);
    }
    /* another name, another stream */
    const par_param *a = get("layers.2.attn.wq_a.weight");
    cr_expect_neq(W[a->offset], W[p->offset]);
}

Test(init, slices_match_the_whole_in_any_order)
{
    int idx = par_param_find(&T, "layers.2.ffn.experts.3.w2.weight");
    const par_param *p = &T.p[idx];
    double buf[600];
    cr_assert_lt(p->numel, 600);
    /* fill back to front in three uneven slices */
    int64_t cut1 = 101, cut2 = 333;
    cr_assert_eq(par_init_param_slice_f64(buf + cut2, &T, idx, 1234, cut2, p->numel), PAR_OK);
    cr_assert_eq(par_init_param_slice_f64(buf + cut1, &T, idx, 1234, cut1, cut2), PAR_OK);
    cr_assert_eq(par_init_param_slice_f64(buf, &T, idx, 1234, 0, cut1), PAR_OK);
    cr_expect_eq(memcmp(buf, W + p->offset, (size_t)p->numel * sizeof *buf), 0);
    cr_expect_eq(par_init_param_slice_f64(buf, &T, idx, 1234, 5, p->numel + 1), PAR_ERANGE);
    cr_expect_eq(par_init_param_slice_f64(buf, &T, idx, 1234, 5, 4), PAR_ERANGE);
    int ti = par_param_find(&T, "layers.0.ffn.gate.tid2eid");
    cr_expect_eq(par_init_param_slice_f64(buf, &T, ti, 1234, 0, 1), PAR_EINVAL);
    int32_t ib[8];
    cr_assert_eq(par_init_param_slice_i32_f64(ib, &T, ti, 10, 18), PAR_OK);
    cr_expect_eq(memcmp(ib, I + T.p[ti].offset + 10, sizeof ib), 0);
}

Test(init, distributions)
{
    double m, s;
    moments(get("embed.weight"), &m, &s);
    cr_expect(fabs(m) < 0.05 && fabs(s - 1.0) < 0.05, "embed mean %g std %g", m, s);
    moments(get("layers.0.hc_attn_fn"), &m, &s);
    cr_expect(fabs(s - 1.0 / sqrt(128.0)) < 0.01, "hc fn std %g", s);
    moments(get("head.weight"), &m, &s);
    cr_expect(fabs(s - 1.0 / sqrt(32.0)) < 0.01, "head std %g", s);
    /* all routed experts together: w2 [32,16] std 1/4 */
    double acc = 0;
    int64_t cnt = 0;
    for (int e = 0; e < 8; e++) {
        char nm[64];
        snprintf(nm, sizeof nm, "layers.1.ffn.experts.%d.w2.weight", e);
        const par_param *p = get(nm);
        for (int64_t i = 0; i < p->numel; i++, cnt++)
            acc += W[p->offset + i] * W[p->offset + i];
    }
    cr_expect(fabs(sqrt(acc / cnt) - 0.25) < 0.01, "w2 std %g", sqrt(acc / cnt));
    const char *ones[] = {"norm.weight", "layers.0.attn_norm.weight", "layers.1.attn.q_norm.weight",
                          "layers.1.attn.compressor.norm.weight", "mtp.0.enorm.weight", NULL};
    for (int k = 0; ones[k]; k++) {
        const par_param *p = get(ones[k]);
        for (int64_t i = 0; i < p->numel; i++)
            cr_expect_eq(W[p->offset + i], 1.0, "%s", ones[k]);
    }
    const char *zeros[] = {"layers.0.attn.attn_sink", "layers.1.ffn.gate.bias", "mtp.0.ffn.gate.bias", NULL};
    for (int k = 0; zeros[k]; k++) {
        const par_param *p = get(zeros[k]);
        for (int64_t i = 0; i < p->numel; i++)
            cr_expect_eq(W[p->offset + i], 0.0, "%s", zeros[k]);
    }
    const par_param *sc = get("layers.0.hc_ffn_scale");
    for (int i = 0; i < 3; i++)
        cr_expect_eq(W[sc->offset + i], 0.5);
    /* hc base: pre/post near 0, comb diagonal near 1 */
    const par_param *b = get("layers.2.hc_attn_base");
    for (int i = 0; i < 24; i++) {
        double want = (i >= 8 && (i - 8) / 4 == (i - 8) % 4) ? 1.0 : 0.0;
        cr_expect(fabs(W[b->offset + i] - want) < 0.5, "base[%d] = %g", i, W[b->offset + i]);
    }
}

Test(init, tid2eid_closed_form)
{
    const par_param *p = get("layers.0.ffn.gate.tid2eid");
    const int E = 8, K = 2;
    for (int t = 0; t < 128; t++) {
        for (int j = 0; j < K; j++)
            cr_expect_eq(I[p->offset + t * K + j], ((t % E) + j * (E / K)) % E, "t %d j %d", t, j);
        cr_expect_neq(I[p->offset + t * K], I[p->offset + t * K + 1], "distinct experts for token %d", t);
    }
}

/* The initial mHC mixing is well conditioned: Sinkhorn of the initial
 * comb logits (mixes at their typical size) converges to a doubly
 * stochastic matrix with entries well away from 0 and 1. */
Test(init, hc_mixing_is_well_conditioned)
{
    const par_param *b = get("layers.1.hc_ffn_base"), *s = get("layers.1.hc_ffn_scale");
    double C[4][4];
    for (int j = 0; j < 4; j++) {
        double mx = -1e300, z = 0;
        for (int k = 0; k < 4; k++) {
            C[j][k] = 1.0 * W[s->offset + 2] + W[b->offset + 8 + j * 4 + k]; /* mixes ~ 1 */
            mx = fmax(mx, C[j][k]);
        }
        for (int k = 0; k < 4; k++)
            z += C[j][k] = exp(C[j][k] - mx);
        for (int k = 0; k < 4; k++)
            C[j][k] = C[j][k] / z + 1e-6;
    }
    for (int it = 0; it < 20; it++) {
        for (int k = 0; k < 4; k++) {
            double cs = 0;
            for (int j = 0; j < 4; j++)
                cs += C[j][k];
            for (int j = 0; j < 4; j++)
                C[j][k] /= cs + 1e-6;
        }
        for (int j = 0; j < 4; j++) {
            double rs = 0;
            for (int k = 0; k < 4; k++)
                rs += C[j][k];
            for (int k = 0; k < 4; k++)
                C[j][k] /= rs + 1e-6;
        }
    }
    for (int j = 0; j < 4; j++)
        for (int k = 0; k < 4; k++)
            cr_expect(C[j][k] > 0.05 && C[j][k] < 0.9, "C[%d][%d] = %g", j, k, C[j][k]);
}
