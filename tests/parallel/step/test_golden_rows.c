/* tests/parallel/step/test_golden_rows.c - the row-blocked serial golden (issue
 * 18 item 2): gradients accumulated over row blocks agree with the one-shot
 * golden within the f64 policy (v4-tiny, blocks of 3 rows of 8: an uneven
 * last block); one block of every row is the one-shot step bit for bit; the
 * automatic rule of parallel/plan/memcheck.h picks blocks only when the one-shot
 * estimate exceeds the limit, and then ones that fit. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/golden.h"
#include "model/model.h"
#include "parallel/plan/memcheck.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(golden_rows, .init = quiet);

static char *tmp_dir(void)
{
    char tmpl[] = "/tmp/parity-golden-rows-XXXXXX";
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp failed");
    return par_strdup(d, PAR_TAG_MISC);
}

static void tiny_opts(par_golden_opts *o, const char *out, int64_t rows)
{
    par_golden_opts_init(o);
    cr_assert_eq(par_config_preset(&o->cfg, "v4-tiny"), PAR_OK);
    o->steps = 2;
    o->out_dir = out;
    o->fixture = "tiny-boundary-mix";
    o->rows_per_block = rows;
}

static int64_t manifest_micro_batch(const char *dir)
{
    char *p = par_path_join(dir, "manifest.json");
    cJSON *man = NULL;
    cr_assert_eq(par_json_read_file(p, &man), PAR_OK, "%s", par_last_error());
    par_free(p);
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(man, "layout"),
                                                       "micro_batch_size");
    cr_assert(cJSON_IsNumber(mb));
    int64_t v = (int64_t)mb->valuedouble;
    cJSON_Delete(man);
    return v;
}

/* 1 when the two files have the same bytes. */
static int same_file(const char *a, const char *b)
{
    void *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    cr_assert_eq(par_file_read(a, PAR_TAG_MISC, &x, &nx), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_file_read(b, PAR_TAG_MISC, &y, &ny), PAR_OK, "%s", par_last_error());
    int same = nx == ny && !memcmp(x, y, nx);
    par_free(x);
    par_free(y);
    return same;
}

Test(golden_rows, blocked_agrees_with_one_shot_within_f64)
{
    char *root = tmp_dir();
    char one[PATH_MAX], blk[PATH_MAX];
    snprintf(one, sizeof one, "%s/one", root);
    snprintf(blk, sizeof blk, "%s/rows3", root);
    par_golden_opts o;
    tiny_opts(&o, one, 0);
    cr_assert_eq(par_golden_run(&o, NULL), PAR_OK, "%s", par_last_error());
    tiny_opts(&o, blk, 3);
    cr_assert_eq(par_golden_run(&o, NULL), PAR_OK, "%s", par_last_error());
    cr_expect_eq(manifest_micro_batch(one), 8);
    cr_expect_eq(manifest_micro_batch(blk), 3, "the blocked set records its row blocks");

    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_F64;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(one, blk, &co, &r), PAR_OK, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "blocked golden outside the f64 policy (%d failing entries)",
              par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 1000);
    par_compare_report_free(r);
    /* the step's gradients were summed in another order: the files are not the same bytes */
    char a[PATH_MAX + 32], b[PATH_MAX + 32];
    snprintf(a, sizeof a, "%s/step.0.safetensors", one);
    snprintf(b, sizeof b, "%s/step.0.safetensors", blk);
    cr_expect(!same_file(a, b), "blocks of 3 rows gave the one-shot bytes: no blocking happened");
    /* params.0 is the init: the same bytes */
    snprintf(a, sizeof a, "%s/params.0.safetensors", one);
    snprintf(b, sizeof b, "%s/params.0.safetensors", blk);
    cr_expect(same_file(a, b));
    par_remove_tree(root);
    par_free(root);
}

/* The model's step over one block of all rows: the one-shot pieces in the
 * same order, so the same bits (gradients, statistics, losses). */
Test(golden_rows, one_block_is_the_one_shot_step_bitwise)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), PAR_OK);
    cr_assert_eq(par_config_validate(&cfg), PAR_OK);
    par_model_f64 A, B;
    cr_assert_eq(par_model_init_f64(&A, &cfg, 7), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_model_init_f64(&B, &cfg, 7), PAR_OK, "%s", par_last_error());
    par_batch batch;
    par_pack_plan plan;
    cr_assert_eq(par_batch_alloc(&batch, cfg.global_batch_size, cfg.seq_length), PAR_OK);
    cr_assert_eq(par_pack_plan_random(&plan, cfg.global_batch_size, cfg.seq_length, 7, 0), PAR_OK);
    cr_assert_eq(par_batch_fill(&batch, &plan, 7, 0, cfg.vocab_size, NULL), PAR_OK);
    cr_assert_eq(par_model_forward_f64(&A, &batch), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_model_backward_f64(&A), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_model_forward_backward_rows_f64(&B, &batch, cfg.global_batch_size, NULL), PAR_OK, "%s",
                 par_last_error());
    cr_expect(!memcmp(A.grads, B.grads, (size_t)A.n_local * sizeof(double)), "gradients differ");
    cr_expect(!memcmp(&A.last, &B.last, sizeof A.last), "losses differ: %.17g vs %.17g", A.last.loss, B.last.loss);
    cr_expect(!memcmp(A.stats.loads, B.stats.loads, (size_t)(A.n_blocks * A.E) * sizeof(int64_t)));
    cr_expect_eq(A.stats.grad_sumsq, B.stats.grad_sumsq);
    /* blocks of one row: the integer statistics are exact, the losses close */
    cr_assert_eq(par_model_forward_backward_rows_f64(&B, &batch, 1, NULL), PAR_OK, "%s", par_last_error());
    cr_expect(!memcmp(A.stats.loads, B.stats.loads, (size_t)(A.n_blocks * A.E) * sizeof(int64_t)));
    cr_expect_lt(fabs(A.last.loss - B.last.loss), 1e-12 * fabs(A.last.loss));
    cr_expect_lt(fabs(A.last.grad_norm - B.last.grad_norm), 1e-10 * A.last.grad_norm);
    cr_expect_eq(par_model_forward_backward_rows_f64(&B, &batch, 0, NULL), PAR_EINVAL);
    par_pack_plan_free(&plan);
    par_batch_free(&batch);
    par_model_free_f64(&A);
    par_model_free_f64(&B);
}

/* The automatic rule: one shot while it fits with a fifth to spare; else the largest halving
 * whose estimate fits, and that estimate below the limit. */
Test(golden_rows, automatic_rule_blocks_only_what_does_not_fit)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-mini"), PAR_OK);
    cfg.global_batch_size = 1024;
    cr_assert_eq(par_config_validate(&cfg), PAR_OK);
    par_memest one, e;
    int64_t rows = -1;
    cr_assert_eq(par_memcheck_golden(&cfg, 64, 1, 0, &one), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_memcheck_golden_rows(&cfg, 64, 1, 2 * one.total, &rows, &e), PAR_OK);
    cr_expect_eq(rows, 0, "one shot fits: no blocks");
    cr_assert_eq(par_memcheck_golden_rows(&cfg, 64, 1, 1.1 * one.total, &rows, &e), PAR_OK);
    cr_expect(rows > 0, "one shot at 91 %% of the limit leaves no margin: blocks expected");
    cr_assert_eq(par_memcheck_golden_rows(&cfg, 64, 1, one.total / 4, &rows, &e), PAR_OK);
    cr_expect(rows > 0 && rows < 1024, "rows %lld", (long long)rows);
    cr_expect_leq(e.total, one.total / 4);
    par_memest twice;
    cr_assert_eq(par_memcheck_golden_blocked(&cfg, 64, 1, 2 * rows, &twice), PAR_OK);
    cr_expect_gt(twice.total, one.total / 4, "blocks of %lld rows would have fit too", (long long)(2 * rows));
    cr_expect_lt(e.total, twice.total);
}
