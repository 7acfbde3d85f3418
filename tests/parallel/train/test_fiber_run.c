/* tests/parallel/train/test_fiber_run.c - the training driver on the fiber
 * backend with every rank on ONE worker thread: each rank's allocator
 * peaks (par_run_summary.alloc_peak / alloc_res_peak, core/alloc.h scopes)
 * equal the threads backend's for the same layout, tag by tag (comm up to
 * the backends' own group records), and so do the losses and gradient
 * norms, bitwise.  On one worker the ranks share a
 * thread, so this holds only if the fiber scheduler carries each rank's
 * allocation scope (a thread-local) across its switches
 * (backends/host/sched.c tls_save / tls_load).  v4-tiny, f64, one step.
 * And a rank's stack under par_gemm: the padded tiles' scratch is not a
 * large array below every rank's frames (the fiber report's deepest use of
 * a rank doing tail GEMMs against one calling the BLAS directly). */
#include <cblas.h>
#include <criterion/criterion.h>

#include "log_capture.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/status.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "parallel/train/run.h"

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

/* ---- a rank's stack under par_gemm ---- */

enum { GK = 100, GMN = 20 };

/* C [20, 20] = A [20, K] B [20, K]^T for K = 16 (the tails' scratch on the
 * stack) and K = 100 (on the heap) through par_gemm, or (direct) the one
 * [16, 16, K] tile par_gemm hands the BLAS, called directly. */
static void gemms(int direct)
{
    double *A = malloc(sizeof(double) * GMN * GK), *B = malloc(sizeof(double) * GMN * GK);
    double *C = calloc(GMN * GMN, sizeof(double));
    cr_assert(A && B && C);
    for (int i = 0; i < GMN * GK; i++)
        A[i] = 1.0 / (i + 1), B[i] = 1.0 / (i + 2);
    for (int K = 16; K <= GK; K += GK - 16)
        if (direct)
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 16, 16, K, 1.0, A, K, B, K, 0.0, C, GMN);
        else
            par_gemm_f64(0, 1, GMN, GMN, K, 1.0, A, K, B, K, 0.0, C, GMN);
    free(A);
    free(B);
    free(C);
}

static par_status gemm_fn(par_comm *c, void *arg)
{
    gemms(*(const int *)arg);
    return par_barrier(c);
}

/* The deepest stack use of 2 fiber ranks doing gemms(direct), in KiB. */
static int deepest_kib(int direct)
{
    logcap_start();
    par_log_level lv = par_log_get_level();
    par_log_set_level(PAR_LOG_INFO);
    par_world_opts o = {.timeout_s = 20, .workers = 1, .stack_bytes = 256 << 10};
    par_status st = par_world_run(par_backend_find("fiber"), 2, gemm_fn, &direct, &o);
    par_log_set_level(lv);
    logcap_stop();
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    const char *d = strstr(logcap, "deepest use ");
    cr_assert_not_null(d, "no fiber report:\n%s", logcap);
    return atoi(d + strlen("deepest use "));
}

/* par_gemm's tiling over the BLAS call it makes: a few KiB of frames, not
 * the 32 KiB scratch array it had (every rank of config-c's 8,192 paid it:
 * the BLAS kernel's own ~32 KiB frame lies below whatever par_gemm holds). */
Test(fiber_run, par_gemm_adds_little_stack_over_the_blas)
{
    gemms(0); /* the lazy bindings of both paths, resolved off the fibers */
    gemms(1);
    int direct = deepest_kib(1), tiled = deepest_kib(0);
    cr_expect_gt(direct, 4, "the BLAS call alone: %d KiB", direct);
    cr_expect_leq(tiled, direct + 12, "par_gemm %d KiB deep, the BLAS call alone %d KiB", tiled, direct);
}
