/* tests/common/golden_check.h - a dump against the serial golden set. */
#ifndef PAR_TESTS_GOLDEN_CHECK_H
#define PAR_TESTS_GOLDEN_CHECK_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "model/compare.h"

/* GOLDEN.md's policy (f64 or f32 from the manifests).  With forward_bitwise,
 * step 0's forward (inputs, logits, activations, routing, losses) must also
 * be equal bit for bit: only gradients and the norm are sums in another
 * order. */
static inline void check_golden(const char *g, const char *d, int forward_bitwise)
{
    par_compare_opts co;
    par_compare_opts_init(&co);
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "%d failing entries", par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 100);
    par_compare_report_free(r);
    if (!forward_bitwise)
        return;
    co.policy = PAR_POLICY_BITWISE;
    cr_assert_eq(par_compare_paths(g, d, &co, &r), 0, "%s", par_last_error());
    int checked = 0;
    for (int i = 0; i < par_compare_report_count(r); i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (strcmp(e->file, "step.0.safetensors") || !strncmp(e->tensor, "grad.", 5) ||
            !strcmp(e->tensor, "out.grad_norm"))
            continue;
        checked++;
        cr_expect(e->pass, "step 0 forward tensor %s differs: %s", e->tensor, e->reason);
    }
    cr_expect_gt(checked, 10);
    par_compare_report_free(r);
}

#endif
