/* tests/parallel/test_cells.c - the built-in cell table and the cells-file
 * reader (parallel/cells.h): every row of the table checks (config and
 * layouts resolve), rows are unique, the quick tier is v4-tiny; the
 * checked-in example file reads; a layout's flags come back as the
 * `parity run` arguments a launcher passes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "parallel/cells.h"

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
