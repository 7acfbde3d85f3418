/* tests/model/test_invariants.c - structural invariants of the serial model:
 * causality inside a sample, isolation between samples, hash routing through
 * tid2eid, bitwise reproducibility, and the pieces' bookkeeping. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/moe.h"
#include "model/data.h"
#include "model/model.h"

typedef struct {
    par_model_f64 M;
    par_batch batch;
} fixture;

#define B_ 3
#define S_ 48

static void setup(fixture *f, uint64_t data_seed)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    cfg.global_batch_size = B_;
    cfg.seq_length = S_;
    cr_assert_eq(par_config_validate(&cfg), 0, "%s", par_last_error());
    cr_assert_eq(par_model_init_f64(&f->M, &cfg, 99), 0, "%s", par_last_error());
    /* row 0: one sample; row 1: 5, 20, 23; row 2: 24, 24 */
    const int64_t r0[] = {48}, r1[] = {5, 20, 23}, r2[] = {24, 24};
    const int64_t *rows[] = {r0, r1, r2};
    const int64_t counts[] = {1, 3, 2};
    par_pack_plan plan;
    cr_assert_eq(par_pack_plan_from_rows(&plan, B_, S_, rows, counts), 0, "%s", par_last_error());
    cr_assert_eq(par_batch_alloc(&f->batch, B_, S_), 0);
    cr_assert_eq(par_batch_fill(&f->batch, &plan, data_seed, 0, cfg.vocab_size, NULL), 0, "%s",
                 par_last_error());
    par_pack_plan_free(&plan);
}

static void teardown(fixture *f)
{
    par_model_free_f64(&f->M);
    par_batch_free(&f->batch);
    cr_assert_eq(par_alloc_live_total(), 0, "memory still live: %lld bytes", (long long)par_alloc_live_total());
}

static double *copy_logits(fixture *f, const double *src)
{
    size_t n = (size_t)(f->M.T * f->M.V);
    double *c = par_malloc(n * sizeof(double), PAR_TAG_MISC);
    cr_assert(c);
    memcpy(c, src, n * sizeof(double));
    return c;
}

/* 1 if rows [t0, t1) of the logits are bitwise equal. */
static int rows_equal(const double *a, const double *b, int64_t V, int64_t t0, int64_t t1)
{
    return !memcmp(a + t0 * V, b + t0 * V, (size_t)((t1 - t0) * V) * sizeof(double));
}

static void set_token(fixture *f, int64_t t)
{
    f->batch.tokens[t] = (f->batch.tokens[t] + 37) % (int32_t)f->M.V;
    par_batch_derive(&f->batch);
}

Test(invariants, later_token_changes_no_earlier_logit)
{
    fixture f;
    setup(&f, 5);
    cr_assert_eq(par_model_forward_f64(&f.M, &f.batch), 0, "%s", par_last_error());
    double *ref = copy_logits(&f, f.M.head.logits);
    int64_t V = f.M.V;
    /* row 1, sample 2 starts at flat 48 + 25; change its position 10 */
    int64_t s0 = S_ + 25, tch = s0 + 10;
    set_token(&f, tch);
    cr_assert_eq(par_model_forward_f64(&f.M, &f.batch), 0, "%s", par_last_error());
    cr_expect(rows_equal(ref, f.M.head.logits, V, s0, tch), "earlier logits of the sample changed");
    cr_expect(!rows_equal(ref, f.M.head.logits, V, tch, tch + 1), "the changed token's own logits did not change");
    cr_expect(!rows_equal(ref, f.M.head.logits, V, tch + 1, s0 + 23), "later logits did not change");
    /* everything before the sample (other samples, other rows) unchanged */
    cr_expect(rows_equal(ref, f.M.head.logits, V, 0, s0), "logits of earlier samples changed");
    cr_expect(rows_equal(ref, f.M.head.logits, V, 2 * S_, 3 * S_), "logits of another row changed");
    par_free(ref);
    teardown(&f);
}

Test(invariants, other_sample_changes_nothing)
{
    fixture f;
    setup(&f, 6);
    cr_assert_eq(par_model_forward_f64(&f.M, &f.batch), 0, "%s", par_last_error());
    double *ref = copy_logits(&f, f.M.head.logits);
    double *refm = copy_logits(&f, f.M.mtp_head.logits);
    int64_t V = f.M.V;
    /* change row 1, sample 1 (flat 48+5 .. 48+24), its first token */
    set_token(&f, S_ + 5);
    cr_assert_eq(par_model_forward_f64(&f.M, &f.batch), 0, "%s", par_last_error());
    cr_expect(rows_equal(ref, f.M.head.logits, V, 0, S_ + 5), "row 0 / sample 0 of row 1 changed");
    cr_expect(rows_equal(ref, f.M.head.logits, V, S_ + 25, 3 * S_), "a later sample / row changed");
    cr_expect(rows_equal(refm, f.M.mtp_head.logits, V, 0, S_ + 5), "mtp logits before the sample changed");
    cr_expect(rows_equal(refm, f.M.mtp_head.logits, V, S_ + 25, 3 * S_), "mtp logits after the sample changed");
    cr_expect(!rows_equal(ref, f.M.head.logits, V, S_ + 5, S_ + 25), "the changed sample did not change");
    par_free(ref);
    par_free(refm);
    teardown(&f);
}

Test(invariants, hash_routing_uses_tid2eid)
{
    fixture f;
    setup(&f, 7);
    cr_assert_eq(par_model_forward_f64(&f.M, &f.batch), 0, "%s", par_last_error());
    par_model_f64 *M = &f.M;
    int64_t E = M->E, K = M->K;
    cr_assert_eq(M->cfg.n_hash_layers, 1);
    int ti = M->tab.blocks[0].gate_tid2eid;
    cr_assert_geq(ti, 0);
    cr_assert_lt(M->tab.blocks[1].gate_tid2eid, 0);
    const int32_t *tab = M->i32 + M->tab.p[ti].offset;
    int differs = 0;
    for (int64_t t = 0; t < M->T; t++) {
        int32_t tok = f.batch.tokens[t];
        int32_t want[16];
        for (int64_t j = 0; j < K; j++) {
            /* the closed form of MODEL.md 4 */
            int32_t e = (int32_t)(((tok % E) + j * (E / K)) % E);
            cr_assert_eq(tab[tok * K + j], e, "tid2eid[%d][%lld]", tok, (long long)j);
            want[j] = e;
        }
        for (int64_t i = 1; i < K; i++) /* ascending */
            for (int64_t j = i; j > 0 && want[j - 1] > want[j]; j--) {
                int32_t x = want[j];
                want[j] = want[j - 1];
                want[j - 1] = x;
            }
        for (int64_t j = 0; j < K; j++) {
            cr_assert_eq(M->blk[0].idx[t * K + j], want[j], "layer 0 token %lld slot %lld", (long long)t,
                         (long long)j);
            if (M->blk[1].idx[t * K + j] != want[j])
                differs = 1;
        }
    }
    cr_expect(differs, "score-routed layer 1 routes exactly like tid2eid (suspicious)");
    /* loads of every MoE block sum to K * T */
    for (int b = 0; b < M->n_blocks; b++) {
        int64_t s = 0;
        for (int64_t e = 0; e < E; e++)
            s += M->stats.loads[b * E + e];
        cr_expect_eq(s, K * M->T, "block %d loads sum %lld", b, (long long)s);
    }
    teardown(&f);
}

Test(invariants, two_runs_bitwise_equal)
{
    fixture a, b;
    setup(&a, 8);
    setup(&b, 8);
    for (int k = 0; k < 2; k++) {
        par_step_scalars sa, sb;
        cr_assert_eq(par_model_step_f64(&a.M, &a.batch, &sa), 0, "%s", par_last_error());
        cr_assert_eq(par_model_step_f64(&b.M, &b.batch, &sb), 0, "%s", par_last_error());
        cr_expect(!memcmp(&sa, &sb, sizeof sa), "step %d scalars differ", k);
        size_t nf = (size_t)a.M.tab.n_float;
        cr_expect(!memcmp(a.M.grads, b.M.grads, nf * sizeof(double)), "step %d grads differ", k);
        cr_expect(!memcmp(a.M.params, b.M.params, nf * sizeof(double)), "step %d params differ", k);
        cr_expect(!memcmp(a.M.opt_m, b.M.opt_m, nf * sizeof(double)), "step %d optimizer state differs", k);
        cr_expect(!memcmp(a.M.head.logits, b.M.head.logits, (size_t)(a.M.T * a.M.V) * sizeof(double)));
    }
    par_model_free_f64(&a.M);
    par_batch_free(&a.batch);
    teardown(&b);
}

/* Statistics of two halves combined equal those of the whole (the one
 * reduction point a parallel layout uses). */
Test(invariants, stats_combine_of_halves)
{
    fixture f;
    setup(&f, 9);
    par_model_f64 *M = &f.M;
    cr_assert_eq(par_model_forward_f64(M, &f.batch), 0, "%s", par_last_error());
    int64_t T = M->T, Ns = M->stats.Ns, E = M->E;
    cr_assert_eq(Ns, 6);
    par_stats_f64 h0, h1;
    cr_assert_eq(par_stats_alloc_f64(&h0, M->n_blocks, E, Ns), 0);
    cr_assert_eq(par_stats_alloc_f64(&h1, M->n_blocks, E, Ns), 0);
    /* recompute each block's statistics from its saved routing, split by rows */
    int64_t half = S_; /* row 0 | rows 1-2 */
    for (int b = 0; b < M->n_blocks; b++) {
        par_block_act_f64 *a = &M->blk[b];
        par_moe_count_loads_f64(h0.loads + b * E, a->idx, half, (int)E, (int)M->K);
        par_moe_count_loads_f64(h1.loads + b * E, a->idx + half * M->K, T - half, (int)E, (int)M->K);
        if (!a->hash) {
            /* the logits and scores are not kept past the forward: again from the normed input */
            cr_assert_null(a->gs);
            cr_assert_null(a->glog);
            double *gs = malloc((size_t)(T * E) * sizeof *gs), *lg = malloc((size_t)(T * E) * sizeof *lg);
            par_moe_gate_logits_f64(lg, a->xfn, par_model_ptr_f64(M, M->params, M->tab.blocks[b].gate_weight), T,
                                    M->d, (int)E);
            par_moe_gate_scores_f64(gs, lg, T * E);
            free(lg);
            cr_assert_eq(par_moe_aux_stats_f64(h0.cnt + b * Ns * E, h0.psum + b * Ns * E, h0.ntok + b * Ns, gs,
                                               a->idx, M->sample, half, (int)E, (int)M->K, Ns), 0);
            cr_assert_eq(par_moe_aux_stats_f64(h1.cnt + b * Ns * E, h1.psum + b * Ns * E, h1.ntok + b * Ns,
                                               gs + half * E, a->idx + half * M->K, M->sample + half,
                                               T - half, (int)E, (int)M->K, Ns), 0);
            free(gs);
        }
    }
    cr_assert_eq(par_stats_combine_f64(&h0, &h1), 0);
    size_t n3 = (size_t)(M->n_blocks * Ns * E);
    cr_expect(!memcmp(h0.loads, M->stats.loads, (size_t)(M->n_blocks * E) * sizeof(int64_t)));
    cr_expect(!memcmp(h0.cnt, M->stats.cnt, n3 * sizeof(int64_t)));
    cr_expect(!memcmp(h0.ntok, M->stats.ntok, (size_t)(M->n_blocks * Ns) * sizeof(int64_t)));
    /* per-sample sums: each sample lies in one half, so the combine is exact */
    cr_expect(!memcmp(h0.psum, M->stats.psum, n3 * sizeof(double)));
    par_stats_free_f64(&h0);
    par_stats_free_f64(&h1);
    /* a mismatched combine is refused */
    par_stats_f64 x, y;
    cr_assert_eq(par_stats_alloc_f64(&x, 2, 4, 3), 0);
    cr_assert_eq(par_stats_alloc_f64(&y, 2, 4, 5), 0);
    par_err_set_quiet(1);
    cr_expect_eq(par_stats_combine_f64(&x, &y), PAR_EMISMATCH);
    par_err_set_quiet(0);
    par_stats_free_f64(&x);
    par_stats_free_f64(&y);
    teardown(&f);
}

/* Loss bookkeeping: N_main / N_mtp are the target counts, the main loss is the
 * mean CE, and the indexer gradients stay zero. */
Test(invariants, loss_counts_and_zero_indexer_grads)
{
    fixture f;
    setup(&f, 10);
    par_model_f64 *M = &f.M;
    cr_assert_eq(par_model_forward_f64(M, &f.batch), 0, "%s", par_last_error());
    cr_assert_eq(par_model_backward_f64(M), 0, "%s", par_last_error());
    /* 6 samples: main targets T - 6, MTP targets T - 12 */
    cr_expect_eq(M->stats.n_main, M->T - 6);
    cr_expect_eq(M->stats.n_mtp, M->T - 12);
    double s = 0;
    for (int64_t t = 0; t < M->T; t++)
        if (f.batch.labels[t] >= 0)
            s += M->head.ce[t];
    cr_expect(fabs(s / (double)M->stats.n_main - M->last.loss_main) < 1e-12 * fabs(s));
    int nidx = 0;
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        if (!p->zero_grad)
            continue;
        nidx++;
        for (int64_t j = 0; j < p->numel; j++)
            cr_assert_eq(M->grads[p->offset + j], 0.0, "%s has a gradient", p->name);
    }
    cr_expect_gt(nidx, 0, "no indexer tensor in v4-tiny?");
    teardown(&f);
}
