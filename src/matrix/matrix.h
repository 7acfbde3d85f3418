/* matrix/matrix.h - the conformance matrix (`parity matrix`, docs/matrix.md).
 *
 * A matrix runs a list of cells one after the other.  The cells are rows
 * of matrix/cells.h (the built-in catalogue or a user's file); adding a
 * row expands it into cells (one per fixture for data "*"), each with its
 * concrete data, steps, seed, config, reference and policy.  Running a
 * cell produces a golden set (GOLDEN.md) -- a serial run, or `parity run`
 * under a layout, dumped -- and compares it with its reference by the code
 * of `parity compare` (model/compare.h).  A failing cell's diagnosis names
 * the first divergent tensor in dataflow order (model/rootcause.h) and the
 * rank of the layout that owned it (matrix/rankof.h).
 *
 * References (the serial run of a (config, precision, data, steps, seed))
 * are produced once under OUT/ref/ and removed after their last cell
 * (kept when a cell that used them failed, or with keep).  Each cell works
 * in OUT/cells/NN-name-data/; a passing cell's directory is removed
 * (unless keep), a failing one keeps its set and its compare report.
 *
 * Layout runs go through a runner callback (par_layout_runner): in process
 * by default (par_matrix_run_layout_in_process), or one the caller gives
 * (the CLI's mpiexec launcher).  Either way the run's metrics come back as
 * the JSON summary of `parity run --summary` (parallel/train/run_summary.h).
 *
 * Code: matrix.c (construction, cells, references), matrix_run.c (the
 * runner), matrix_report.c (table and reports).  Untemplated: reaches the
 * model through model/facade.h.
 */
#ifndef PAR_MATRIX_MATRIX_H
#define PAR_MATRIX_MATRIX_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "core/status.h"
#include "model/config.h"
#include "matrix/cells.h"

/* One layout run a cell asks for (what `parity run` would be given). */
typedef struct {
    const char *cell;             /* the cell's name (messages) */
    const char *preset;
    const char *const *sets;      /* n_sets "key=value" config overrides */
    int n_sets;
    const par_config *cfg;        /* preset + sets + the layout's global batch, validated */
    int precision;                /* 64 or 32 */
    const char *fixture;          /* NULL or a fixture name (in fixtures_dir) */
    const char *data_path;        /* NULL or a data file */
    const char *fixtures_dir;
    int64_t steps;
    uint64_t seed;
    const par_cell_layout *layout;
    int64_t world;                /* the layout's world size (resolved) */
    const char *dump_dir;         /* --dump (NULL: none) */
    const char *save_dir;         /* --save */
    const char *load_dir;         /* --load */
    const char *work_dir;         /* the cell's directory: logs, the summary file */
    const char *tag;              /* "run", "first", "resumed": names files in work_dir */
} par_layout_job;

/* Runs a layout job with the emulated network's reference preset attached
 * (its gpus-per-node overridden by the layout's) and returns the run's
 * summary (`parity run --summary`'s document, cJSON_Delete it).  *summary
 * set only on success; a failure's par_err message becomes the cell's
 * diagnosis. */
typedef par_status (*par_layout_runner)(const par_layout_job *job, void *ud, cJSON **summary);

/* The default runner: par_run in this process on `ud` (a par_backend *). */
par_status par_matrix_run_layout_in_process(const par_layout_job *job, void *ud, cJSON **summary);

typedef struct {
    const char *preset;       /* the built-in rows of this preset; NULL: every preset (user cells) */
    par_cell_tier tier;            /* rows of this tier and below (quick < default < full < scale) */
    int quick;                /* recorded in the report */
    const char *backend;      /* recorded (report, table) */
    par_layout_runner runner; /* NULL: par_matrix_run_layout_in_process on backend_impl */
    void *runner_ud;
    const par_backend *backend_impl; /* the default runner's backend (NULL: layout cells are ERROR) */
    /* The default runner's backend of a cell that names its own ("backend": "fiber"), by name
     * (the CLI's backends/registry.h par_backend_find); NULL: such cells are ERROR. */
    const par_backend *(*find_backend)(const char *name);
    /* The default runner's backend of a cell that names none when backend_impl is NULL (the
     * matrix's --backend not given): by the world's size on this machine (the CLI's
     * cli/autobackend.h rule, the one `parity run` follows); why receives the reason. */
    const par_backend *(*pick_backend)(int64_t world, char *why, size_t n);
    int64_t steps;            /* rows with steps 0; 0 = the preset's default (tiny 3, mini 1) */
    uint64_t seed;            /* rows without a seed */
    const char *out_dir;      /* results directory: created; must be empty or an earlier matrix's */
    const char *fixtures_dir; /* NULL: $PARITY_FIXTURES_DIR, $PARITY_SOURCE_ROOT/fixtures, ./fixtures */
    const char *golden_root;  /* NULL: $PARITY_SOURCE_ROOT/golden, ./golden (missing: no checked-in sets) */
    const char *const *only_cells;    /* run only cells of these names, any tier (NULL/0: by tier) */
    int n_only_cells;
    const char *const *only_fixtures; /* use only these fixtures (NULL/0: every fixture) */
    int n_only_fixtures;
    int64_t rows_per_block;   /* the serial goldens' row blocks (--rows-per-block; model/facade.h);
                               * 0: the automatic rule (parallel/plan/memcheck.h par_memcheck_golden_rows) */
    int keep;                 /* keep every set (passing cells' and references) */
    int bitwise;              /* --bitwise: layout and resume cells and their references in the bitwise
                               * mode (docs/bitwise.md), compared with the bitwise policy */
    int recipe;               /* --recipe (par_recipe): layout and resume cells and their references
                               * under a recipe's casts (docs/recipes.md); on an MPI backend too:
                               * its launcher passes --recipe (and --bitwise) to each run */
    /* A cell's memory limit in bytes: before a serial reference, golden or in-process layout run
     * allocates anything, its estimate (parallel/plan/memcheck.h, `parity run --max-memory`'s) must fit,
     * else the cell is ERROR naming the estimate.  0: no check.  max_memory_what names the limit in
     * that message (NULL: "the matrix's memory limit"). */
    double max_memory;
    const char *max_memory_what;
    int no_out;               /* create no results directory (listing the cells only) */
    FILE *progress;           /* progress lines (NULL: none) */
} par_matrix_opts;

void par_matrix_opts_init(par_matrix_opts *o); /* v4-tiny, tier default, threads, seed 1234, progress stderr */

typedef struct par_matrix par_matrix;

/* Validates the options, lists the fixtures and the checked-in golden
 * sets, creates the results directory.  No cells yet. */
par_status par_matrix_new(const par_matrix_opts *o, par_matrix **out);
void par_matrix_free(par_matrix *m); /* NULL is fine */

/* Adds the rows (each checked: par_cell_check) that the options select --
 * by name (only_cells), else by preset and tier -- expanded into cells; a
 * cell excluded by only_fixtures is skipped.  A row that does not check,
 * or data that names no fixture, is PAR_EINVAL naming the cell and field. */
par_status par_matrix_add_rows(par_matrix *m, const par_cell_spec *rows, int n);
/* par_matrix_add_rows of the built-in catalogue (matrix/cells.h). */
par_status par_matrix_add_builtin_cells(par_matrix *m);

/* Runs every cell in order; *n_failed = cells FAIL or ERROR. */
par_status par_matrix_run(par_matrix *m, int *n_failed);

int par_matrix_count(const par_matrix *m);
const char *par_matrix_out_dir(const par_matrix *m);

/* Output: the summary table (text), the cells without running them, and
 * the report as Markdown (".md") or JSON (".json"), by the extension. */
void par_matrix_print_table(const par_matrix *m, FILE *out);
void par_matrix_print_cells(const par_matrix *m, FILE *out);
par_status par_matrix_write_report(const par_matrix *m, const char *path);

/* A run against an earlier one (issue 33 item 6): set before running reads
 * the earlier report.json now (PAR_EFORMAT / PAR_ENOTFOUND when it is not a
 * matrix report, before anything runs); margin_pct is the relative move of
 * a figure that is reported (emulated step time, bubble, exposed comm,
 * rank memory).  After par_matrix_run, compare_baseline computes the diff:
 * the table then ends with it, the JSON report holds it as "baseline" and
 * the JUnit report puts each cell's changes in its system-out. */
par_status par_matrix_set_baseline(par_matrix *m, const char *path, double margin_pct);
par_status par_matrix_compare_baseline(par_matrix *m);

#endif
