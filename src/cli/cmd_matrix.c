/* parity matrix [--quick] [--preset v4-tiny|v4-mini] [--backend threads|fiber|mpi] [--report FILE] [--out DIR]
 *               [--cell NAME]... [--fixture NAME]... [--steps K] [--seed N] [--keep] [--list]
 * The conformance matrix (issue 10, docs/matrix.md): the serial golden, then
 * every cell compared with it by the comparator of `parity compare`.
 * Exit: 0 every cell passed, 1 a cell failed, 2 bad usage or unreadable input. */
#include <stdio.h>
#include <string.h>

#include "backends/registry.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/status.h"
#include "parallel/matrix.h"
#include "parity_config.h"

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

int par_cmd_matrix(int argc, char **argv)
{
    const char *preset = NULL, *backend = "threads", *report = NULL, *out = NULL, *fixtures_dir = NULL,
               *golden = NULL;
    int64_t steps = 0, seed = 1234;
    int quick = 0, keep = 0, list = 0, quiet = 0, full = 0;
    int64_t mpi_procs = 8;
    par_strlist cells, fixtures;
    memset(&cells, 0, sizeof cells);
    memset(&fixtures, 0, sizeof fixtures);
    const par_opt opts[] = {
        {"quick", PAR_OPT_FLAG, &quick, NULL, "v4-tiny, a few minutes at most (what CI runs)"},
        {"preset", PAR_OPT_STR, &preset, "NAME", "v4-tiny or v4-mini (default v4-mini; --quick: v4-tiny)"},
        {"backend", PAR_OPT_STR, &backend, "threads|fiber|mpi", "backend of the parallel cells (default threads)"},
        {"full", PAR_OPT_FLAG, &full, NULL, "also the heaviest v4-mini cells (EP64, EP128, PP4, CP2 on every fixture)"},
        {"mpi-procs", PAR_OPT_INT, &mpi_procs, "P",
         "--backend mpi: at most P mpiexec processes per cell (default 8; each hosts N/P thread ranks)"},
        {"report", PAR_OPT_STR, &report, "FILE", "also write the summary as Markdown (.md) or JSON (.json)"},
        {"out", PAR_OPT_STR, &out, "DIR",
         "results directory (default out/matrix-<time>); an earlier matrix's is replaced"},
        {"cell", PAR_OPT_LIST, &cells, "NAME", "run only cells of this name (repeatable)"},
        {"fixture", PAR_OPT_LIST, &fixtures, "NAME", "use only this fixture (repeatable; default all of the preset)"},
        {"steps", PAR_OPT_INT, &steps, "K", "training steps per cell (default: v4-tiny 3, v4-mini 1)"},
        {"seed", PAR_OPT_INT, &seed, "N", "seed of init, packing and tokens (default 1234)"},
        {"fixtures-dir", PAR_OPT_STR, &fixtures_dir, "DIR", "where fixtures live (default: fixtures/)"},
        {"golden", PAR_OPT_STR, &golden, "DIR", "checked-in golden sets (default: golden/)"},
        {"keep", PAR_OPT_FLAG, &keep, NULL, "keep every golden set (default: only failing cells')"},
        {"list", PAR_OPT_FLAG, &list, NULL, "list the cells and exit"},
        {"quiet", PAR_OPT_FLAG, &quiet, NULL, "no progress lines"},
    };
    const char *synopsis =
        "[--quick] [--full] [--preset v4-tiny|v4-mini] [--backend threads|fiber|mpi [--mpi-procs P]] [--report FILE]\n"
        "       [--out DIR] [--cell NAME]... [--fixture NAME]... [--steps K] [--seed N] [--keep] [--list]\n\n"
        "Runs the conformance matrix: the serial f64 golden, then every cell, each compared with its\n"
        "reference by the code of `parity compare`.  A progress line per cell on stderr, a summary\n"
        "table on stdout.  Exit 0: every cell passed; 1: a cell failed; 2: bad usage or unreadable\n"
        "input.  docs/matrix.md lists the cells.";
    par_positional pos;
    int rc = par_args_parse("matrix", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc == 1)
        return 0;
    if (rc)
        return 2;
    if (pos.count) {
        fprintf(stderr, "parity matrix: unexpected argument '%s' (see 'parity matrix --help')\n", pos.argv[0]);
        return 2;
    }
    if (!preset)
        preset = quick ? "v4-tiny" : "v4-mini";
    if (strcmp(backend, "threads") && strcmp(backend, "fiber") && strcmp(backend, "mpi") && strcmp(backend, "self")) {
        fprintf(stderr, "parity matrix: --backend expects threads, fiber or mpi, got '%s'\n", backend);
        return 2;
    }
    if (!strcmp(backend, "mpi") && !HAVE_MPI) {
        fprintf(stderr, "parity matrix: --backend mpi: this build has no MPI (install MPICH and rebuild)\n");
        return 2;
    }
    if (steps < 0 || seed < 0) {
        fprintf(stderr, "parity matrix: --steps and --seed must be >= 0 (got %lld, %lld)\n", (long long)steps,
                (long long)seed);
        return 2;
    }
    if (mpi_procs < 1 || mpi_procs > 1024) {
        fprintf(stderr, "parity matrix: --mpi-procs must be in [1, 1024] (got %lld)\n", (long long)mpi_procs);
        return 2;
    }
    if (report && !has_suffix(report, ".md") && !has_suffix(report, ".json")) {
        fprintf(stderr, "parity matrix: --report %s: the name must end in .md (Markdown) or .json\n", report);
        return 2;
    }

    par_matrix_opts o;
    par_matrix_opts_init(&o);
    o.preset = preset;
    o.quick = quick;
    o.backend = backend;
    /* --backend mpi: each parallel cell runs under mpiexec (a child process);
     * this process never initializes MPI itself. */
    o.backend_impl = strcmp(backend, "mpi") ? par_backend_find(backend) : NULL;
    o.steps = steps;
    o.seed = (uint64_t)seed;
    o.out_dir = out;
    o.fixtures_dir = fixtures_dir;
    o.golden_root = golden;
    o.only_cells = cells.items;
    o.n_only_cells = cells.count;
    o.only_fixtures = fixtures.items;
    o.n_only_fixtures = fixtures.count;
    o.keep = keep;
    o.full = full;
    o.mpi_procs = (int)mpi_procs;
    o.no_out = list;
    o.progress = quiet ? NULL : stderr;

    par_err_set_quiet(1);
    par_matrix *m = NULL;
    par_status s = par_matrix_new(&o, &m);
    if (!s)
        s = par_matrix_add_builtin_cells(m);
    if (s) {
        fprintf(stderr, "parity matrix: %s\n", par_last_error());
        par_err_set_quiet(0);
        par_matrix_free(m);
        return 2;
    }
    if (par_matrix_count(m) == 0) {
        fprintf(stderr, "parity matrix: no cell matches the --cell/--fixture selection\n");
        par_err_set_quiet(0);
        par_matrix_free(m);
        return 2;
    }
    if (list) {
        par_matrix_print_cells(m, stdout);
        par_err_set_quiet(0);
        par_matrix_free(m);
        return 0;
    }
    if (o.progress)
        fprintf(stderr, "parity matrix: %d cells, preset %s, backend %s; results in %s\n", par_matrix_count(m),
                preset, backend, par_matrix_out_dir(m));
    int nfail = 0;
    s = par_matrix_run(m, &nfail);
    if (s) {
        fprintf(stderr, "parity matrix: %s\n", par_last_error());
        par_err_set_quiet(0);
        par_matrix_free(m);
        return 2;
    }
    par_matrix_print_table(m, stdout);
    fflush(stdout);
    int code = nfail ? 1 : 0;
    char own[1200];
    snprintf(own, sizeof own, "%s/report.json", par_matrix_out_dir(m));
    if (par_matrix_write_report(m, own) != PAR_OK)
        fprintf(stderr, "parity matrix: %s\n", par_last_error());
    if (report && par_matrix_write_report(m, report) != PAR_OK) {
        fprintf(stderr, "parity matrix: %s\n", par_last_error());
        code = 2;
    }
    par_err_set_quiet(0);
    par_matrix_free(m);
    return code;
}
