/* parity matrix [--quick | --preset v4-tiny|v4-mini] [--tier quick|default|full|scale | --full | --scale]
 *               [--cells FILE.json] [--cell NAME]... [--fixture NAME]... [--backend auto|threads|fiber|mpi]
 *               [--report FILE.md|.json|.xml] [--baseline OLD/report.json [--baseline-margin PCT]]
 *               [--out DIR] [--steps K] [--seed N] [--keep] [--list]
 * The conformance matrix (docs/matrix.md): the cells of the built-in table
 * (matrix/cells.h) or of a user's file, each compared with its reference
 * by the comparator of `parity compare`.
 * Exit: 0 every cell passed, 1 a cell failed, 2 bad usage or unreadable input. */
#include <stdio.h>
#include <string.h>

#include "backends/registry.h"
#include "cli/autobackend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/devargs.h"
#include "cli/matrix_mpi.h"
#include "cli/memlimit.h"
#include "kernels/recipe.h"
#include "core/alloc.h"
#include "core/outdir.h"
#include "core/status.h"
#include "matrix/matrix.h"
#include "parity_config.h"

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* What the command line gave. */
typedef struct {
    const char *preset, *backend, *report, *out, *fixtures_dir, *golden, *cells_file, *tier, *device, *max_memory;
    const char *baseline;
    double baseline_margin;
    int64_t steps, seed, mpi_procs, rows_per_block;
    int quick, keep, list, quiet, full, scale, overwrite, bitwise;
    const char *recipe;
    par_strlist cells, fixtures;
    double mem_limit;   /* --max-memory or this machine's memory (par_memlimit_limit) */
    char mem_what[96];  /* its words */
} matrix_cli;

static int parse_cli(int argc, char **argv, matrix_cli *c)
{
    memset(c, 0, sizeof *c);
    c->backend = "auto";
    c->seed = 1234;
    c->mpi_procs = 8;
    c->baseline_margin = 5;
    const par_opt opts[] = {
        {"quick", PAR_OPT_FLAG, &c->quick, NULL, "v4-tiny, tier quick: a minute at most (what CI runs)"},
        {"preset", PAR_OPT_STR, &c->preset, "NAME", "v4-tiny or v4-mini (default v4-mini; --quick: v4-tiny)"},
        {"tier", PAR_OPT_STR, &c->tier, "TIER", "quick|default|full|scale: the cells of this tier and below"},
        {"full", PAR_OPT_FLAG, &c->full, NULL, "tier full: also the heaviest v4-mini cells (EP64, EP128, PP4, ...)"},
        {"scale", PAR_OPT_FLAG, &c->scale, NULL, "tier scale: also the acceptance cells, minutes each (config-a, "
                                                 "config-b, config-c: the tuning guide's worlds; pick with --cell)"},
        {"cells", PAR_OPT_STR, &c->cells_file, "FILE.json", "run the cells of this file instead of the built-in "
                                                           "table (docs/matrix.md, \"Your own cells\")"},
        {"cell", PAR_OPT_LIST, &c->cells, "NAME", "run only cells of this name, whatever their tier (repeatable)"},
        {"fixture", PAR_OPT_LIST, &c->fixtures, "NAME", "use only this fixture (repeatable; default all)"},
        {"backend", PAR_OPT_STR, &c->backend, "auto|threads|fiber|mpi",
         "backend of the layout cells (default auto: per cell by its world, threads up to 4 ranks per core, fiber "
         "beyond, as parity run; a cell's own \"backend\" wins)"},
        {"mpi-procs", PAR_OPT_INT, &c->mpi_procs, "P",
         "--backend mpi: at most P mpiexec processes per cell (default 8; each hosts N/P thread ranks)"},
        {"report", PAR_OPT_STR, &c->report, "FILE",
         "also write the summary as Markdown (.md), JSON (.json) or JUnit XML (.xml: a testcase per cell)"},
        {"baseline", PAR_OPT_STR, &c->baseline, "OLD/report.json",
         "compare with an earlier run's report: cells that changed verdict, comparison figures, and emulated "
         "step / bubble / exposed comm / rank memory beyond --baseline-margin"},
        {"baseline-margin", PAR_OPT_DOUBLE, &c->baseline_margin, "PCT",
         "--baseline: the relative move of a figure that is reported (default 5)", PAR_CHK_NONNEG_REAL, 1e6},
        {"out", PAR_OPT_STR, &c->out, "DIR", "results directory (default out/matrix-<time>); an earlier matrix's is "
                                            "replaced"},
        {"steps", PAR_OPT_INT, &c->steps, "K", "training steps of cells without their own (default: v4-tiny 3, "
                                              "v4-mini 1)"},
        {"seed", PAR_OPT_INT, &c->seed, "N", "seed of cells without their own (default 1234)"},
        {"fixtures-dir", PAR_OPT_STR, &c->fixtures_dir, "DIR", "where fixtures live (default: fixtures/)"},
        {"golden", PAR_OPT_STR, &c->golden, "DIR", "checked-in golden sets (default: golden/)"},
        {"rows-per-block", PAR_OPT_INT, &c->rows_per_block, "R", "serial goldens accumulate gradients over blocks "
                                                                "of R rows (default: one shot unless it would not fit)",
         PAR_CHK_POS},
        {"keep", PAR_OPT_FLAG, &c->keep, NULL, "keep every golden set (default: only failing cells')"},
        {"bitwise", PAR_OPT_FLAG, &c->bitwise, NULL, "layout and resume cells and their serial references in the "
         "bitwise mode, compared with --policy bitwise (docs/bitwise.md)"},
        {"recipe", PAR_OPT_STR, &c->recipe, "NAME", "layout and resume cells and their serial references under a "
         "recipe's casts: bf16, fp8, v4 (docs/recipes.md)"},
        {"list", PAR_OPT_FLAG, &c->list, NULL, "list the cells and exit"},
        {"max-memory", PAR_OPT_STR, &c->max_memory, "SIZE", "a cell whose run the memory model says needs more than "
         "SIZE is ERROR before it allocates (e.g. 16GB; default: this machine's memory)"},
        {"quiet", PAR_OPT_FLAG, &c->quiet, NULL, "no progress lines"},
        {"overwrite", PAR_OPT_FLAG, &c->overwrite, NULL, PAR_OVERWRITE_HELP " (--report)"},
        {"device", PAR_OPT_STR, &c->device, "cpu|gpu", PAR_DEVICE_HELP "; the references run there too"},
    };
    const char *synopsis =
        "[--quick | --preset v4-tiny|v4-mini] [--tier quick|default|full|scale | --full | --scale]\n"
        "       [--cells FILE.json] [--cell NAME]... [--fixture NAME]... [--backend auto|threads|fiber|mpi [--mpi-procs P]]\n"
        "       [--report FILE.md|.json|.xml] [--baseline OLD/report.json [--baseline-margin PCT]]\n"
        "       [--out DIR] [--steps K] [--seed N] [--rows-per-block R] [--keep] [--list] [--bitwise] [--recipe NAME]\n"
        "       [--max-memory SIZE]\n"
        "       [--device cpu|gpu]\n\n"
        "Runs the conformance matrix: every cell of the built-in table (or of --cells FILE) that the\n"
        "preset and tier select, each compared with its reference by the code of `parity compare`.\n"
        "A progress line per cell on stderr, a summary table on stdout; a failing cell names the\n"
        "first divergent tensor in dataflow order and the rank that owned it.  Exit 0: every cell\n"
        "passed; 1: a cell failed; 2: bad usage or unreadable input.  docs/matrix.md lists the cells.";
    par_positional pos;
    int rc = par_args_parse("matrix", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc)
        return rc == 1 ? -1 : 2;
    if (pos.count) {
        fprintf(stderr, "parity matrix: unexpected argument '%s' (see 'parity matrix --help')\n", pos.argv[0]);
        return 2;
    }
    return 0;
}

/* Usage rules that need no file; 0 fine, 2 with a message. */
static int check_cli(const matrix_cli *c)
{
    const char *why = NULL;
    if (strcmp(c->backend, "threads") && strcmp(c->backend, "fiber") && strcmp(c->backend, "mpi") &&
        strcmp(c->backend, "self") && strcmp(c->backend, "auto"))
        why = "--backend expects auto, threads, fiber or mpi";
    else if (!strcmp(c->backend, "mpi") && !HAVE_MPI)
        why = "--backend mpi: this build has no MPI (install MPICH and rebuild)";
    else if (c->steps < 0 || c->seed < 0)
        why = "--steps and --seed must be >= 0";
    else if (c->mpi_procs < 1 || c->mpi_procs > 1024)
        why = "--mpi-procs must be in [1, 1024]";
    else if (c->report && !has_suffix(c->report, ".md") && !has_suffix(c->report, ".json") &&
             !has_suffix(c->report, ".xml"))
        why = "--report: the name must end in .md (Markdown), .json or .xml (JUnit)";
    else if ((c->tier != NULL) + c->full + c->scale > 1)
        why = "give one of --tier, --full and --scale";
    if (!why) {
        const par_cli_output outs[] = {{"--report", c->report, PAR_OUT_FILE, c->overwrite}};
        return c->list ? 0 : par_cli_check_outputs("matrix", outs, 1);
    }
    fprintf(stderr, "parity matrix: %s (got --backend %s, --steps %lld, --seed %lld, --mpi-procs %lld%s%s)\n", why,
            c->backend, (long long)c->steps, (long long)c->seed, (long long)c->mpi_procs, c->report ? ", --report " : "",
            c->report ? c->report : "");
    return 2;
}

static par_status fill_opts(const matrix_cli *c, par_matrix_opts *o, par_mpi_runner *mpi)
{
    par_matrix_opts_init(o);
    o->preset = c->preset ? c->preset : c->quick ? "v4-tiny" : c->cells_file ? NULL : "v4-mini";
    o->tier = c->scale ? PAR_CELL_TIER_SCALE : c->full ? PAR_CELL_TIER_FULL : c->quick ? PAR_CELL_TIER_QUICK : c->cells_file ? PAR_CELL_TIER_SCALE : PAR_CELL_TIER_DEFAULT;
    par_status s = c->tier ? par_cell_tier_parse(c->tier, &o->tier) : PAR_OK;
    o->quick = c->quick;
    o->backend = c->backend;
    if (!strcmp(c->backend, "mpi")) { /* each layout run is its own mpiexec job */
        *mpi = (par_mpi_runner){.mpi_procs = (int)c->mpi_procs};
        o->runner = par_mpi_run_layout;
        o->runner_ud = mpi;
    } else {
        o->backend_impl = strcmp(c->backend, "auto") ? par_backend_find(c->backend) : NULL;
        o->find_backend = par_backend_find; /* cells of their own backend ("backend": "fiber") */
        o->pick_backend = par_autobackend_find; /* auto: each cell by its world (cli/autobackend.h) */
    }
    o->steps = c->steps;
    o->seed = (uint64_t)c->seed;
    o->out_dir = c->out;
    o->fixtures_dir = c->fixtures_dir;
    o->golden_root = c->golden;
    o->only_cells = c->cells.items;
    o->n_only_cells = c->cells.count;
    o->only_fixtures = c->fixtures.items;
    o->n_only_fixtures = c->fixtures.count;
    o->keep = c->keep;
    o->bitwise = c->bitwise;
    par_config rc; /* --recipe, checked in par_cmd_matrix */
    memset(&rc, 0, sizeof rc);
    if (c->recipe && !par_cli_recipe("matrix", c->recipe, c->device, &rc))
        o->recipe = (int)rc.recipe;
    o->rows_per_block = c->rows_per_block;
    o->max_memory = c->mem_limit;
    o->max_memory_what = c->mem_what;
    o->no_out = c->list;
    o->progress = c->quiet ? NULL : stderr;
    return s;
}

/* The matrix with its cells (exit 2 on bad input: *m NULL). */
static int build(const matrix_cli *c, const par_matrix_opts *o, par_matrix **m)
{
    par_cell_spec *rows = NULL;
    int nrows = 0;
    par_status s = c->cells_file ? par_cells_read(c->cells_file, &rows, &nrows) : PAR_OK;
    if (!s)
        s = par_matrix_new(o, m);
    if (!s)
        s = rows ? par_matrix_add_rows(*m, rows, nrows) : par_matrix_add_builtin_cells(*m);
    par_free(rows);
    if (!s && par_matrix_count(*m) == 0)
        s = par_err(PAR_EINVAL, "no cell matches the preset, tier and --cell/--fixture selection");
    int baseline_err = 0;
    if (!s && c->baseline) /* read and checked before anything runs */
        baseline_err = (s = par_matrix_set_baseline(*m, c->baseline, c->baseline_margin)) != PAR_OK;
    if (s) {
        /* a row of the file that names no data: the file too (read errors name it already) */
        int name_file = c->cells_file && *m && !baseline_err && !strstr(par_last_error(), c->cells_file);
        fprintf(stderr, "parity matrix: %s%s%s\n", name_file ? c->cells_file : "", name_file ? ": " : "",
                par_last_error());
        par_matrix_free(*m);
        *m = NULL;
        return 2;
    }
    return 0;
}

/* Runs, prints the table, writes the reports; the exit status. */
static int run_and_report(par_matrix *m, const matrix_cli *c, const par_matrix_opts *o)
{
    if (o->progress)
        fprintf(stderr, "parity matrix: %d cells, preset %s, backend %s; results in %s\n", par_matrix_count(m),
                o->preset ? o->preset : "any", c->backend, par_matrix_out_dir(m));
    int nfail = 0;
    if (par_matrix_run(m, &nfail) != PAR_OK || par_matrix_compare_baseline(m) != PAR_OK) {
        fprintf(stderr, "parity matrix: %s\n", par_last_error());
        return 2;
    }
    par_matrix_print_table(m, stdout);
    fflush(stdout);
    int code = nfail ? 1 : 0;
    char own[1200];
    snprintf(own, sizeof own, "%s/report.json", par_matrix_out_dir(m));
    if (par_matrix_write_report(m, own) != PAR_OK)
        fprintf(stderr, "parity matrix: %s\n", par_last_error());
    if (c->report && par_matrix_write_report(m, c->report) != PAR_OK) {
        fprintf(stderr, "parity matrix: %s\n", par_last_error());
        code = 2;
    }
    return code;
}

int par_cmd_matrix(int argc, char **argv)
{
    matrix_cli c;
    int rc = parse_cli(argc, argv, &c);
    if (rc)
        return rc < 0 ? 0 : rc;
    if ((rc = check_cli(&c)))
        return rc;
    if ((c.mem_limit = par_memlimit_limit("matrix", c.max_memory, c.mem_what, sizeof c.mem_what)) < 0)
        return 2;
    if (c.device && !strcmp(c.device, "gpu") && !strcmp(c.backend, "mpi")) {
        fprintf(stderr, "parity matrix: --device gpu runs the cells in this process; --backend mpi would "
                        "launch them elsewhere (use --backend threads)\n");
        return 2;
    }
    par_config rcheck;
    if (c.recipe && par_cli_recipe("matrix", c.recipe, c.device, &rcheck))
        return 2;
    if (!c.list && (par_cli_bitwise_device("matrix", c.bitwise, c.device) || par_cli_device("matrix", c.device)))
        return 2;
    par_matrix_opts o;
    par_mpi_runner mpi;
    par_err_set_quiet(1);
    par_matrix *m = NULL;
    if (fill_opts(&c, &o, &mpi) != PAR_OK) {
        fprintf(stderr, "parity matrix: --tier: %s\n", par_last_error());
        rc = 2;
    } else if (!(rc = build(&c, &o, &m))) {
        if (c.list)
            par_matrix_print_cells(m, stdout);
        else
            rc = run_and_report(m, &c, &o);
        if (!c.list && !c.quiet)
            par_cli_device_report(stdout); /* GPU mode: the process's transfers, every cell's */
    }
    par_err_set_quiet(0);
    par_matrix_free(m);
    return rc;
}
