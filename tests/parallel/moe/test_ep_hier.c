/* tests/parallel/moe/test_ep_hier.c - hierarchical (node-aware) expert-parallel
 * dispatch against the flat one (v4-tiny: E = 8, K = 2; threads backend;
 * emulated network with small nodes): the dumps are bitwise equal, the
 * inter-node bytes strictly fewer, the report has bytes per tier and the
 * emulated dispatch / combine time. */
#include <criterion/criterion.h>

#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/registry.h"
#include "comm/clock.h"
#include "comm/netmodel.h"
#include "core/status.h"
#include "model/compare.h"
#include "parallel/train/run.h"

typedef struct {
    int64_t world, ep;
    int gpn; /* GPUs per node of the emulated network */
} lay;

static par_status run(const char *dump, lay l, int hier, par_run_summary *sum)
{
    static par_netmodel m;
    cr_assert_eq(par_netmodel_preset("reference", &m), 0);
    m.gpus_per_node = l.gpn;
    m.nics_per_node = l.gpn;
    par_run_opts o;
    par_run_opts_init(&o);
    cr_assert_eq(par_config_preset(&o.cfg, "v4-tiny"), 0);
    o.steps = 2;
    o.seed = 1234;
    o.backend = par_backend_find("threads");
    o.layout.world = l.world;
    o.layout.ep = l.ep;
    o.dump_dir = dump;
    o.netmodel = &m;
    o.moe_dispatch = hier;
    return par_run(&o, sum);
}

static uint64_t tier_bytes(const par_run_summary *s, par_tier t)
{
    uint64_t b = 0;
    for (int r = 0; r < par_netrun_nranks(s->net); r++)
        b += par_netrun_stats(s->net, r)->bytes[t];
    return b;
}

static void cell(lay l)
{
    char *t = mktmp(), *df = sub(t, "flat"), *dh = sub(t, "hier");
    par_run_summary f, h;
    cr_assert_eq(run(df, l, 0, &f), 0, "%s", par_last_error());
    cr_assert_eq(run(dh, l, 1, &h), 0, "%s", par_last_error());
    int N = (int)f.layout.world;
    cr_assert_eq(h.layout.world, N);
    cr_expect_eq(f.moe_dispatch, 0);
    cr_expect_eq(h.moe_dispatch, 1);
    cr_expect_eq(h.ep_gpn, l.gpn);

    /* numerics: every tensor of every step bitwise */
    for (int64_t k = 0; k < f.steps; k++)
        cr_expect(f.step[k].loss == h.step[k].loss && f.step[k].grad_norm == h.step[k].grad_norm,
                  "step %lld: loss %.17g vs %.17g", (long long)k, f.step[k].loss, h.step[k].loss);
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = PAR_POLICY_BITWISE;
    par_compare_report *r = NULL;
    cr_assert_eq(par_compare_paths(df, dh, &co, &r), 0, "%s", par_last_error());
    if (!par_compare_report_ok(r))
        par_compare_report_print(r, stderr, 0);
    cr_expect(par_compare_report_ok(r), "hierarchical dump differs from flat: %d failing entries",
              par_compare_report_failed(r));
    cr_expect_gt(par_compare_report_count(r), 100);
    par_compare_report_free(r);

    /* the same rows reach the same owners */
    cr_assert(f.ep_recv && h.ep_recv);
    for (int i = 0; i < N; i++)
        cr_expect_eq(f.ep_recv[i], h.ep_recv[i], "rank %d: %lld vs %lld rows", i, (long long)f.ep_recv[i],
                     (long long)h.ep_recv[i]);

    /* inter-node bytes: the EP counters and the emulated network's totals */
    cr_expect_lt(h.ep_bytes[0][1], f.ep_bytes[0][1], "dispatch ib %lld vs flat %lld", (long long)h.ep_bytes[0][1],
                 (long long)f.ep_bytes[0][1]);
    cr_expect_eq(h.ep_bytes[1][1], f.ep_bytes[1][1], "combine ib (unsummed rows): %lld vs flat %lld",
                 (long long)h.ep_bytes[1][1], (long long)f.ep_bytes[1][1]);
    cr_expect_gt(h.ep_bytes[0][0], f.ep_bytes[0][0], "the fan-out runs over NVLink");
    cr_expect_eq(f.dispatch_bytes, f.ep_bytes[0][0] + f.ep_bytes[0][1]);
    cr_expect_eq(h.combine_bytes, h.ep_bytes[1][0] + h.ep_bytes[1][1]);
    uint64_t fib = tier_bytes(&f, PAR_TIER_IB), hib = tier_bytes(&h, PAR_TIER_IB);
    cr_expect_lt(hib, fib, "netrun inter-node bytes: hierarchical %llu, flat %llu", (unsigned long long)hib,
                 (unsigned long long)fib);
    /* the EP share of the difference is exactly the counters' (the count
     * exchanges of the hierarchical path also go to fewer off-node peers) */
    cr_expect_geq(fib - hib, (uint64_t)(f.ep_bytes[0][1] - h.ep_bytes[0][1]));

    /* emulated times are measured */
    for (int k = 0; k < 2; k++) {
        cr_expect_gt(f.ep_time_max[k], 0);
        cr_expect_gt(h.ep_time_max[k], 0);
        cr_expect_leq(h.ep_time_mean[k], h.ep_time_max[k] * (1 + 1e-12));
    }
    par_run_summary_free(&f);
    par_run_summary_free(&h);
    rmtree(t);
    free(t), free(df), free(dh);
}

Test(ep_hier, ep4_two_per_node) { cell((lay){.ep = 4, .gpn = 2}); }
Test(ep_hier, ep8_two_per_node) { cell((lay){.ep = 8, .gpn = 2}); }
/* uneven nodes (3, 3, 2): relays by local index modulo the node's ranks */
Test(ep_hier, ep8_three_per_node) { cell((lay){.ep = 8, .gpn = 3}); }
/* expert data parallelism: two EP groups of 4 */
Test(ep_hier, ep4_de2) { cell((lay){.ep = 4, .world = 8, .gpn = 2}); }

/* One node holding the whole EP group: nothing crosses IB either way, the
 * results are still the flat ones. */
Test(ep_hier, one_node)
{
    par_run_summary f, h;
    lay l = {.ep = 4, .gpn = 8};
    cr_assert_eq(run(NULL, l, 0, &f), 0, "%s", par_last_error());
    cr_assert_eq(run(NULL, l, 1, &h), 0, "%s", par_last_error());
    cr_expect(f.step[1].loss == h.step[1].loss);
    cr_expect_eq(f.ep_bytes[0][1] + f.ep_bytes[1][1] + h.ep_bytes[0][1] + h.ep_bytes[1][1], 0);
    /* stage 1 is a self-copy, a stage-2 row is as long as a flat row */
    cr_expect_eq(f.ep_bytes[0][0], h.ep_bytes[0][0]);
    cr_expect_eq(f.ep_bytes[1][0], h.ep_bytes[1][0]);
    cr_expect_gt(f.ep_bytes[0][0], 0);
    par_run_summary_free(&f);
    par_run_summary_free(&h);
}

/* BUILD/tests/parallel/test_parallel_ep_hier -> BUILD/parity */
static void parity_path(char *buf, size_t n)
{
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert(k > 0, "readlink /proc/self/exe");
    self[k] = 0;
    for (int up = 0; up < 3; up++) {
        char *s = strrchr(self, '/');
        cr_assert(s);
        *s = 0;
    }
    snprintf(buf, n, "%s/parity", self);
    cr_assert(access(buf, X_OK) == 0, "no parity binary at %s", buf);
}

Test(ep_hier, report_prints_tiers_and_times)
{
    char exe[4200], cmd[4600], line[1024];
    parity_path(exe, sizeof exe);
    snprintf(cmd, sizeof cmd,
             "'%s' run --preset v4-tiny --steps 1 --quiet --expert-model-parallel-size 4 --gpus-per-node 2 "
             "--moe-dispatch hierarchical 2>&1",
             exe);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    int tiers = 0, times = 0, hist = 0, recv = 0;
    while (fgets(line, sizeof line, p)) {
        tiers += strstr(line, "hierarchical dispatch, nodes of 2 ranks") && strstr(line, "dispatch nvlink") &&
                 strstr(line, " ib ");
        times += strstr(line, "emulated time per rank") && strstr(line, "dispatch mean") &&
                 strstr(line, "combine mean");
        hist += strstr(line, "histogram of load/mean") != NULL;
        recv += strstr(line, "rows received per rank: r0") != NULL;
    }
    cr_expect_eq(pclose(p), 0, "parity run failed");
    cr_expect_eq(tiers, 1, "bytes per tier line");
    cr_expect_eq(times, 1, "emulated time line");
    cr_expect_eq(hist, 1, "tokens per expert histogram");
    cr_expect_eq(recv, 1, "rows received per rank");

    snprintf(cmd, sizeof cmd, "'%s' run --preset v4-tiny --quiet --moe-dispatch sideways >/dev/null 2>&1", exe);
    int rc = system(cmd);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "a bad --moe-dispatch is a usage error");
}
