/* tests/matrix/test_cells.c - the built-in cell table and the cells-file
 * reader (matrix/cells.h): every row of the table checks (config and
 * layouts resolve), rows are unique, the quick tier is v4-tiny; the
 * checked-in example file reads; a layout's flags come back as the
 * `parity run` arguments a launcher passes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "matrix/cells.h"

Test(cells, builtin_rows_check)
{
    int n = 0;
    const par_cell_spec *rows = par_cells_builtin(&n);
    cr_assert_gt(n, 40);
    int quick = 0, scale = 0;
    for (int i = 0; i < n; i++) {
        const par_cell_spec *r = &rows[i];
        cr_expect_eq(par_cell_check(r), 0, "row %d (%s, %s): %s", i, r->name, r->preset, par_last_error());
        if (r->tier == PAR_CELL_TIER_QUICK) {
            cr_expect_str_eq(r->preset, "v4-tiny", "%s: the quick tier is v4-tiny", r->name);
            quick++;
        }
        scale += r->tier == PAR_CELL_TIER_SCALE;
        for (int j = 0; j < i; j++)
            cr_expect(strcmp(rows[j].name, r->name) || strcmp(rows[j].preset, r->preset) ||
                          strcmp(rows[j].data, r->data) || rows[j].seed != r->seed,
                      "rows %d and %d are the same cell %s", j, i, r->name);
    }
    cr_expect_geq(quick, 30);
    cr_expect_geq(scale, 20, "the acceptance cells of the slow suite and tools/*-accept.sh");
}

static void collect(const char *flag, const char *value, void *ud)
{
    char *buf = ud;
    size_t o = strlen(buf);
    snprintf(buf + o, 512 - o, "%s--%s%s%s", o ? " " : "", flag, value ? " " : "", value ? value : "");
}

Test(cells, layout_flags_as_arguments)
{
    par_cell_layout l = {.world_size = 8, .pipeline_model_parallel_size = 2, .expert_model_parallel_size = 2,
                         .use_distributed_optimizer = 1, .pipeline_model_parallel_layout = "Et*1|t*2mL",
                         .moe_dispatch = "hierarchical"};
    char buf[512] = "";
    par_cell_layout_args(&l, collect, buf);
    cr_expect_str_eq(buf, "--world-size 8 --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout "
                          "Et*1|t*2mL --expert-model-parallel-size 2 --use-distributed-optimizer --moe-dispatch "
                          "hierarchical");
    par_cell_layout none;
    memset(&none, 0, sizeof none);
    cr_expect(par_cell_layout_empty(&none));
    cr_expect(!par_cell_layout_empty(&l));
}

Test(cells, example_file_reads)
{
    const char *root = getenv("PARITY_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/examples/cells.json", root ? root : ".");
    par_cell_spec *rows = NULL;
    int n = 0;
    cr_assert_eq(par_cells_read(path, &rows, &n), 0, "%s", par_last_error());
    cr_expect_geq(n, 5);
    int kinds[PAR_KIND_COUNT] = {0};
    for (int i = 0; i < n; i++)
        kinds[rows[i].kind]++;
    cr_expect(kinds[PAR_KIND_LAYOUT] > 0 && kinds[PAR_KIND_RESUME] > 0 && kinds[PAR_KIND_GOLDEN] > 0);
    cr_expect_eq(rows[0].tier, PAR_CELL_TIER_DEFAULT, "a file's rows default to tier default");
    par_free(rows);
}

/* The TP flags go to `parity run` as flags; a chain belongs to resume cells
 * with two steps after the split, and its layout is checked like the others. */
Test(cells, tp_flags_and_chains)
{
    par_cell_layout l = {.world_size = 2, .tensor_model_parallel_size = 2, .sequence_parallel = 1,
                         .tp_all_layers = 1};
    char buf[512] = "";
    par_cell_layout_args(&l, collect, buf);
    cr_expect_str_eq(buf, "--world-size 2 --tensor-model-parallel-size 2 --sequence-parallel --tp-all-layers");
    par_cell_spec c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "chain");
    snprintf(c.preset, sizeof c.preset, "v4-tiny");
    c.kind = PAR_KIND_RESUME;
    c.steps = 3;
    c.split = 1;
    c.layout = (par_cell_layout){.world_size = 2, .tensor_model_parallel_size = 2};
    c.load_layout = (par_cell_layout){.world_size = 1};
    c.chain_layout = (par_cell_layout){.world_size = 2, .context_parallel_size = 2};
    cr_expect_eq(par_cell_check(&c), 0, "%s", par_last_error());
    c.split = 2; /* one step after the split: no room for the third leg */
    cr_expect_eq(par_cell_check(&c), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "a chain needs two steps after \"split\" (2 of \"steps\" 3)"), "%s",
              par_last_error());
    c.split = 1;
    c.chain_layout.context_parallel_size = 3; /* does not divide S = 64 */
    cr_expect_neq(par_cell_check(&c), 0);
    cr_expect(strstr(par_last_error(), "\"chain-layout\""), "%s", par_last_error());
    c.chain_layout = (par_cell_layout){.world_size = 2};
    c.kind = PAR_KIND_LAYOUT;
    memset(&c.load_layout, 0, sizeof c.load_layout);
    cr_expect_eq(par_cell_check(&c), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "\"chain-layout\" belongs to resume cells"), "%s", par_last_error());
}

/* The default tier covers EP 32, 64 and 128 (issue 18), and no row of the
 * tiers up to default runs more than 64 OS threads: a bigger world names
 * the fiber backend. */
Test(cells, default_tier_ep_sizes_and_backends)
{
    int n = 0, ep[3] = {0};
    const par_cell_spec *rows = par_cells_builtin(&n);
    for (int i = 0; i < n; i++) {
        const par_cell_spec *r = &rows[i];
        if (r->tier > PAR_CELL_TIER_DEFAULT || r->kind != PAR_KIND_LAYOUT)
            continue;
        par_config cfg;
        par_layout l;
        cr_assert_eq(par_cell_config(r, &cfg), 0, "%s: %s", r->name, par_last_error());
        cr_assert_eq(par_cell_layout_resolve(&r->layout, &cfg, &l), 0, "%s: %s", r->name, par_last_error());
        for (int k = 0; k < 3; k++)
            ep[k] += !strcmp(r->preset, "v4-mini") && l.ep == (32 << k);
        if (l.world > 64)
            cr_expect_str_eq(r->backend, "fiber", "%s: world %lld runs on fiber, not one OS thread per rank",
                             r->name, (long long)l.world);
    }
    cr_expect(ep[0] && ep[1] && ep[2], "default tier: EP32 %d, EP64 %d, EP128 %d cells", ep[0], ep[1], ep[2]);
}

/* Issue 15's list of TP / ETP / SP cells runs on v4-mini in the default tier
 * (quick has them on v4-tiny), the reshard chain in full (its cost, against
 * issue 18's 5 minutes): each name present with the layout it claims. */
Test(cells, default_tier_tp_cells)
{
    static const struct {
        const char *name;
        int64_t tp, etp, cp, ep, pp;
        int sp, zero;
        par_cell_kind kind;
    } want[] = {
        {"tp2", 2, 1, 1, 1, 1, 0, 0, PAR_KIND_LAYOUT},          {"tp2-sp", 2, 1, 1, 1, 1, 1, 0, PAR_KIND_LAYOUT},
        {"tp4", 4, 1, 1, 1, 1, 0, 0, PAR_KIND_LAYOUT},          {"etp2", 1, 2, 1, 1, 1, 0, 0, PAR_KIND_LAYOUT},
        {"tp2-cp2-ep4", 2, 1, 2, 4, 1, 0, 0, PAR_KIND_LAYOUT},  {"tp2-pp2-1f1b", 2, 1, 1, 1, 2, 0, 0, PAR_KIND_LAYOUT},
        {"tp2-pp2-interleaved", 2, 1, 1, 1, 2, 0, 0, PAR_KIND_LAYOUT},
        {"tp2-zero1", 2, 1, 1, 1, 1, 0, 1, PAR_KIND_LAYOUT},    {"etp2-ep4-de2", 1, 2, 1, 4, 1, 0, 0, PAR_KIND_LAYOUT},
        {"tp2-to-tp1-to-tp4", 2, 1, 1, 1, 1, 0, 0, PAR_KIND_RESUME},
    };
    int n = 0;
    const par_cell_spec *rows = par_cells_builtin(&n);
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
        const par_cell_spec *r = NULL;
        for (int i = 0; i < n && !r; i++)
            if (!strcmp(rows[i].name, want[w].name) && !strcmp(rows[i].preset, "v4-mini") &&
                rows[i].tier <= (want[w].kind == PAR_KIND_RESUME ? PAR_CELL_TIER_FULL : PAR_CELL_TIER_DEFAULT))
                r = &rows[i];
        cr_assert(r, "%s: no v4-mini row in the default tier", want[w].name);
        cr_expect_eq(r->kind, want[w].kind, "%s: kind", r->name);
        par_config cfg;
        par_layout l;
        cr_assert_eq(par_cell_config(r, &cfg), 0, "%s: %s", r->name, par_last_error());
        cr_assert_eq(par_cell_layout_resolve(&r->layout, &cfg, &l), 0, "%s: %s", r->name, par_last_error());
        cr_expect(l.tp == want[w].tp && l.etp == want[w].etp && l.cp == want[w].cp && l.ep == want[w].ep &&
                      l.pp == want[w].pp && !!l.sequence_parallel == want[w].sp &&
                      !!l.distributed_optimizer == want[w].zero,
                  "%s: TP %lld ETP %lld CP %lld EP %lld PP %lld SP %d ZeRO %d", r->name, (long long)l.tp,
                  (long long)l.etp, (long long)l.cp, (long long)l.ep, (long long)l.pp, l.sequence_parallel,
                  l.distributed_optimizer);
        if (want[w].kind == PAR_KIND_RESUME)
            cr_expect(r->load_layout.world_size == 1 && r->chain_layout.tensor_model_parallel_size == 4,
                      "%s: the chain is TP 2 -> serial -> TP 4", r->name);
    }
}

/* config-a, -b, -c: the tuning guide's table (../shared/reference/001_*):
 * world, CP, and the Da, De and microbatches per replica m that follow. */
Test(cells, guide_configs)
{
    static const struct {
        const char *name;
        int64_t world, cp, da, de, m;
    } want[3] = {{"config-a", 1024, 1, 128, 2, 32}, {"config-b", 8192, 1, 1024, 16, 4},
                 {"config-c", 8192, 4, 256, 16, 16}};
    int n = 0;
    const par_cell_spec *rows = par_cells_builtin(&n);
    for (int w = 0; w < 3; w++) {
        const par_cell_spec *r = NULL;
        for (int i = 0; i < n && !r; i++)
            if (!strcmp(rows[i].name, want[w].name))
                r = &rows[i];
        cr_assert(r, "no row %s", want[w].name);
        cr_expect_eq(r->tier, PAR_CELL_TIER_SCALE);
        cr_expect_str_eq(r->backend, "fiber");
        cr_expect_str_eq(r->preset, "v4-mini");
        par_config cfg;
        par_layout l;
        cr_assert_eq(par_cell_config(r, &cfg), 0, "%s: %s", r->name, par_last_error());
        cr_assert_eq(par_cell_layout_resolve(&r->layout, &cfg, &l), 0, "%s: %s", r->name, par_last_error());
        cr_expect_eq(cfg.n_routed_experts, 384);
        cr_expect_eq(cfg.n_activated_experts, 6);
        cr_expect_geq(cfg.seq_length, l.cp * cfg.window_size, "%s: S >= CP x window", r->name);
        cr_expect_eq(l.world, want[w].world, "%s", r->name);
        cr_expect(l.pp == 8 && l.ep == 64 && l.tp == 1 && l.etp == 1 && l.cp == want[w].cp, "%s", r->name);
        cr_expect(l.da == want[w].da && l.de == want[w].de, "%s: Da %lld De %lld", r->name, (long long)l.da,
                  (long long)l.de);
        cr_expect_eq(l.global_batch, 4096);
        cr_expect_eq(l.global_batch / (l.micro_batch * l.da), want[w].m, "%s: microbatches per replica",
                     r->name);
    }
}

static par_status read_text(const char *text, par_cell_spec **rows, int *n)
{
    char path[] = "/tmp/parity-test-cells-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    par_status s = par_cells_read(path, rows, n);
    remove(path);
    return s;
}

Test(cells, backend_key)
{
    par_cell_spec *rows = NULL;
    int n = 0;
    cr_assert_eq(read_text("{\"format\": \"parity-cells\", \"version\": 1, \"cells\": [{\"name\": \"a\", \"preset\": "
                           "\"v4-tiny\", \"backend\": \"fiber\", \"layout\": {\"world-size\": 2}}]}",
                           &rows, &n),
                 0, "%s", par_last_error());
    cr_expect_str_eq(rows[0].backend, "fiber");
    par_free(rows);
    rows = NULL;
    cr_expect_neq(read_text("{\"format\": \"parity-cells\", \"version\": 1, \"cells\": [{\"name\": \"a\", \"preset\": "
                            "\"v4-tiny\", \"backend\": \"gpu\", \"layout\": {\"world-size\": 2}}]}",
                            &rows, &n),
                  0);
    cr_expect(strstr(par_last_error(), "not threads or fiber"), "%s", par_last_error());
    cr_expect_neq(read_text("{\"format\": \"parity-cells\", \"version\": 1, \"cells\": [{\"name\": \"a\", \"preset\": "
                            "\"v4-tiny\", \"kind\": \"golden\", \"backend\": \"fiber\"}]}",
                            &rows, &n),
                  0);
    cr_expect(strstr(par_last_error(), "runs serially"), "%s", par_last_error());
    cr_expect_null(rows);
}
