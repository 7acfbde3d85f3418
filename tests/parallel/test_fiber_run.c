/* tests/parallel/test_fiber_run.c - the training driver on the fiber
 * backend with every rank on ONE worker thread: each rank's allocator
 * peaks (par_run_summary.alloc_peak / alloc_res_peak, core/alloc.h scopes)
 * equal the threads backend's for the same layout, tag by tag (comm up to
 * the backends' own group records), and so do the losses and gradient
 * norms, bitwise.  On one worker the ranks share a
 * thread, so this holds only if the fiber scheduler carries each rank's
 * allocation scope (a thread-local) across its switches
 * (backends/host/sched.c tls_save / tls_load).  v4-tiny, f64, one step. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/driver.h"

static void quiet(void) { par_err_set_quiet(1); }

TestSuite(fiber_run, .init = quiet);

typedef struct {
    const char *name;
    int64_t world, pp, cp, ep, zero, mbs;
    const char *schedule, *layout;
} lay;

static void run_on(const char *backend, const lay *L, par_run_summary *s)
{
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), PAR_OK);
    o.backend = par_backend_find(backend);
    cr_assert(o.backend, "no backend %s", backend);
    o.layout.world = L->world;
    o.layout.pp = L->pp ? L->pp : 1;
    o.layout.cp = L->cp ? L->cp : 1;
    o.layout.ep = L->ep ? L->ep : 1;
    o.layout.distributed_optimizer = (int)L->zero;
    o.layout.micro_batch = L->mbs;
    if (L->schedule)
        cr_assert_eq(par_layout_set_schedule(&o.layout, L->schedule), PAR_OK);
    if (L->layout)
        cr_assert_eq(par_layout_set_pp_layout(&o.layout, L->layout), PAR_OK);
    cr_assert_eq(par_run(&o, s), PAR_OK, "%s on %s: %s", L->name, backend, par_last_error());
    cr_assert_not_null(s->alloc_peak);
    cr_assert_not_null(s->alloc_res_peak);
}

/* Tag comm also holds the backend's own records of the groups a rank
 * creates (threads.c's tcomm / tsync.h's tgroup, fiber.c's fcomm / fgroup:
 * different structs), so there the two backends may differ by those few
 * hundred bytes (measured: 212..540 per rank of these layouts, fiber the
 * smaller); the message buffers and every other tag are the same code's and
 * must be equal to the byte. */
#define COMM_SLACK 4096

static void same_peaks(const lay *L)
{
    par_run_summary t, f;
    run_on("threads", L, &t);
    run_on("fiber", L, &f);
    cr_assert_eq(t.layout.world, f.layout.world);
    cr_expect_eq(memcmp(&t.step[0].loss, &f.step[0].loss, sizeof(double)), 0, "%s: loss %.17g vs %.17g", L->name,
                 t.step[0].loss, f.step[0].loss);
    cr_expect_eq(memcmp(&t.step[0].grad_norm, &f.step[0].grad_norm, sizeof(double)), 0, "%s: grad norm", L->name);
    int64_t world = t.layout.world;
    for (int64_t r = 0; r < world; r++) {
        int64_t sum = 0;
        for (int tag = 0; tag < PAR_TAG_COUNT; tag++) {
            int64_t i = r * PAR_TAG_COUNT + tag;
            sum += f.alloc_peak[i];
            if (tag == PAR_TAG_COMM) { /* holds each backend's own group records: see the note above */
                cr_expect_leq(llabs(f.alloc_peak[i] - t.alloc_peak[i]), COMM_SLACK,
                              "%s rank %lld tag comm: fiber peak %lld, threads %lld", L->name, (long long)r,
                              (long long)f.alloc_peak[i], (long long)t.alloc_peak[i]);
                cr_expect_gt(f.alloc_peak[i], 10 * COMM_SLACK, "%s rank %lld: comm peak", L->name, (long long)r);
                continue;
            }
            cr_expect_eq(f.alloc_peak[i], t.alloc_peak[i], "%s rank %lld tag %s: fiber peak %lld, threads %lld",
                         L->name, (long long)r, par_tag_name((par_tag)tag), (long long)f.alloc_peak[i],
                         (long long)t.alloc_peak[i]);
            cr_expect_eq(f.alloc_res_peak[i], t.alloc_res_peak[i],
                         "%s rank %lld tag %s: fiber reserved peak %lld, threads %lld", L->name, (long long)r,
                         par_tag_name((par_tag)tag), (long long)f.alloc_res_peak[i], (long long)t.alloc_res_peak[i]);
        }
        cr_expect_gt(sum, 0, "%s rank %lld: nothing measured", L->name, (long long)r);
    }
    par_run_summary_free(&t);
    par_run_summary_free(&f);
}

/* One worker: every rank of the world shares the test's thread. */
Test(fiber_run, per_rank_alloc_peaks_equal_threads_on_one_worker, .timeout = 300)
{
    cr_assert_eq(setenv("PARITY_FIBER_WORKERS", "1", 1), 0);
    static const lay set[] = {
        {"EP2 De2 ZeRO-1 (N4)", 4, 0, 0, 2, 1, 0, NULL, NULL},
        {"CP2 EP2 (N4)", 4, 0, 2, 2, 0, 0, NULL, NULL},
        {"PP2 1f1b DP2 ZeRO-1 (N4)", 4, 2, 0, 0, 1, 1, "1f1b", "Et*2|tmL"},
        {"PP2 dualpipev EP2 (N4)", 4, 2, 0, 2, 0, 1, "dualpipev", "Et|t|t|mL"},
    };
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        same_peaks(&set[i]);
}
