/* parallel/matrix.h - the conformance matrix (`parity matrix`, docs/matrix.md).
 *
 * A matrix is a list of cells run one after the other.  A cell is
 *   - a name (the kind of check: "serial-f64", "cp2", ...), a one-line layout
 *     description, the world size, the data (a boundary fixture or the
 *     synthetic generator), steps and seed;
 *   - a producer that writes the cell's golden set (GOLDEN.md) into a
 *     directory: today in-process calls of par_golden_run with other
 *     options, later the parallel driver (`parity run --dump`);
 *   - the reference it is compared against (the matrix's own serial f64 run
 *     of the same data, steps and seed; a fixed directory such as a
 *     checked-in golden set; or nothing, when the cell's check decides) and
 *     the policy of the comparison (model/compare.h: the same code as
 *     `parity compare`);
 *   - optionally a check of the produced set (e.g. every value finite).
 *
 * Serial f64 references are produced on demand, once per (fixture, steps,
 * seed), under OUT/ref/, and removed when no later cell needs them (kept
 * when a cell that used them failed, or with keep).  Each cell works in
 * OUT/cells/NN-name-data/; a passing cell's directory is removed (unless
 * keep), a failing one keeps its set and its compare report (compare.json,
 * compare.txt).
 *
 * Untemplated: reaches the model through model/facade.h.
 */
#ifndef PAR_PARALLEL_MATRIX_H
#define PAR_PARALLEL_MATRIX_H

#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/config.h"

typedef enum {
    PAR_CELL_PENDING = 0, /* not run (yet) */
    PAR_CELL_PASS,        /* compared equal within its policy, checks passed */
    PAR_CELL_FAIL,        /* the comparison or a check failed */
    PAR_CELL_ERROR,       /* the cell could not produce or read its sets */
    PAR_CELL_WARN,        /* an informational cell's comparison failed: reported, not a failure */
} par_cell_verdict;

const char *par_cell_verdict_name(par_cell_verdict v); /* "PASS", "FAIL", "ERROR", "WARN", "-" */

typedef enum {
    PAR_REF_SERIAL = 0, /* the matrix's serial f64 run of the cell's (fixture, steps, seed) */
    PAR_REF_DIR,        /* a fixed golden-set directory (cell.ref_dir) */
    PAR_REF_NONE,       /* no comparison: the cell's check decides */
} par_ref_kind;

/* What a producer measured besides the set; NAN = not applicable. */
typedef struct {
    double step_time_s;    /* emulated step time (virtual clock) */
    double bubble;         /* pipeline bubble fraction of the step */
    double exposed_comm_s; /* communication not hidden behind compute, per step */
} par_cell_metrics;

typedef struct par_matrix par_matrix;
typedef struct par_matrix_cell par_matrix_cell;

/* Writes the cell's golden set into set_dir (which does not exist; its
 * parent, work_dir, does and may hold other files of the cell).  A producer
 * may instead point *cand at another existing set (the serial cell hands
 * over the reference it produced).  met starts as all NAN. */
typedef par_status (*par_cell_produce_fn)(par_matrix *m, const par_matrix_cell *cell, const char *work_dir,
                                          const char *set_dir, const char **cand, par_cell_metrics *met);

/* Checks the produced set; PAR_OK when fine, PAR_ECHECK (or another error)
 * with a message that names what is wrong. */
typedef par_status (*par_cell_check_fn)(par_matrix *m, const par_matrix_cell *cell, const char *cand_dir);

/* Which files of the two sets a cell compares (1 = compare); NULL = all.
 * Both sides are restricted alike (hard-linked into the cell's directory
 * with their own manifests), so a file missing from one side still fails. */
typedef int (*par_cell_select_fn)(const char *file_name);

/* The parallel layout a layout cell runs (sizes 0 = 1; world 0 = the
 * smallest the folding allows).  sched: a par_sched_kind with pp > 1, or -1;
 * segs: segments of the PP layout string the cell builds (0: pp). */
typedef struct {
    int64_t world, cp, ep, pp;
    int zero;             /* --use-distributed-optimizer (ZeRO-1) */
    int sched, segs;
} par_cell_layout;

struct par_matrix_cell {
    char name[48];        /* kind of check: "serial-f64", "repeat-bitwise", "cp2", ... */
    char layout[128];     /* one line: "serial f64 (world 1)", "CP=2 EP=1 PP=1 DP=1", ... */
    char fixture[64];     /* fixture the data comes from; "" = the synthetic generator */
    int64_t ranks;        /* world size */
    int64_t steps;
    uint64_t seed;
    par_ref_kind ref;
    char ref_dir[512];    /* PAR_REF_DIR: the reference set */
    par_policy policy;    /* of the comparison (AUTO: from the manifests) */
    char note[200];       /* why this reference and policy (in the report) */
    par_cell_produce_fn produce;
    par_cell_check_fn check; /* may be NULL */
    par_cell_select_fn select; /* files compared; NULL = every file */
    int informational;    /* a failed comparison is WARN (reported, exit status unaffected) */
    int64_t arg;          /* free for the producer (e.g. a precision, a CP size) */
    par_cell_layout lay;  /* layout cells: the layout run (and saved, for a pair) */
    par_cell_layout lay2; /* resume/reshard pairs: the layout that loads the checkpoint */
    int64_t split;        /* pairs: steps run before the checkpoint (the rest after loading) */
};

/* Outcome of one cell. */
typedef struct {
    par_cell_verdict verdict;
    char policy[16];          /* resolved policy name, "checks" for PAR_REF_NONE */
    int n_entries, n_failed;  /* of the comparison */
    /* The worst entry: failing before passing, then the largest fraction of
     * its tolerance used (norm policies) or the most differing elements
     * (bitwise, integers). */
    char worst_file[64];
    char worst_tensor[192];
    char worst_mode[16];
    double worst_rel_l2, worst_max_abs;
    double worst_frac;        /* ||B-A|| / bound; NAN when not a norm policy */
    int64_t worst_ndiff;      /* differing elements */
    char diagnosis[768];      /* one line: why it failed ("" when it passed) */
    par_cell_metrics met;
    double wall_s;
    char dir[512];            /* the cell's work directory ("" once removed) */
    char report_json[600];    /* compare report of a failing cell ("" otherwise) */
} par_cell_result;

typedef struct {
    const char *preset;       /* "v4-tiny" or "v4-mini" */
    int quick;                /* recorded in the report */
    const char *backend;      /* recorded; parallel cells run on it */
    const par_backend *backend_impl; /* the parallel cells' backend (the CLI looks it up by
                                      * name, backends/registry.h); NULL: they are ERROR */
    int64_t steps;            /* steps of the built-in cells; 0 = the preset's default (tiny 3, mini 1) */
    uint64_t seed;
    const char *out_dir;      /* results directory: created; must be empty or an earlier matrix's */
    const char *fixtures_dir; /* NULL: $PARITY_FIXTURES_DIR, $PARITY_SOURCE_ROOT/fixtures, ./fixtures */
    const char *golden_root;  /* NULL: $PARITY_SOURCE_ROOT/golden, ./golden (missing: no checked-in sets) */
    const char *const *only_cells;    /* run only cells of these names (NULL/0: all) */
    int n_only_cells;
    const char *const *only_fixtures; /* use only these fixtures (NULL/0: every fixture of the preset) */
    int n_only_fixtures;
    int full;                 /* also the heaviest cells (v4-mini EP64/EP128; docs/matrix.md) */
    int mpi_procs;            /* --backend mpi: at most this many processes per cell (0: 8) */
    const char *mpiexec;      /* --backend mpi: the launcher (NULL: "mpiexec") */
    const char *self_exe;     /* --backend mpi: the parity binary (NULL: /proc/self/exe) */
    int keep;                 /* keep every set (passing cells' and references) */
    int no_out;               /* create no results directory (listing the cells only) */
    FILE *progress;           /* progress lines (NULL: none) */
} par_matrix_opts;

void par_matrix_opts_init(par_matrix_opts *o); /* v4-tiny, threads, seed 1234, progress stderr */

/* Validates the options, builds the config, lists the fixtures and the
 * checked-in golden sets, creates the results directory.  No cells yet. */
par_status par_matrix_new(const par_matrix_opts *o, par_matrix **out);
void par_matrix_free(par_matrix *m); /* NULL is fine */

/* Appends a cell (copied); a cell excluded by only_cells/only_fixtures is
 * skipped (still PAR_OK). */
par_status par_matrix_add(par_matrix *m, const par_matrix_cell *c);
/* Appends the cells available today (docs/matrix.md): serial-f64 on every
 * fixture, then repeat-bitwise, f32-vs-f64 and data-file on the primary
 * fixture (<p>-boundary-mix, else the first one selected). */
par_status par_matrix_add_builtin_cells(par_matrix *m);
/* A cell with the matrix's defaults filled in (ranks 1, steps, seed,
 * reference serial, policy AUTO) on `fixture`. */
void par_matrix_cell_init(const par_matrix *m, par_matrix_cell *c, const char *name, const char *fixture);

/* Runs every cell in order; *n_failed = cells FAIL or ERROR. */
par_status par_matrix_run(par_matrix *m, int *n_failed);

/* The serial f64 reference of (fixture, steps, seed), produced once under
 * OUT/ref/ (fixture "" = the synthetic generator).  *dir stays valid until
 * par_matrix_free. */
par_status par_matrix_reference(par_matrix *m, const char *fixture, int64_t steps, uint64_t seed,
                                const char **dir);
/* The serial run of (precision, fixture, steps, seed), produced once under
 * OUT/ref/ like the reference; precision 32 sets are stored widened to F64
 * (exactly) so that they compare with f64 sets. */
par_status par_matrix_serial(par_matrix *m, int precision, const char *fixture, int64_t steps, uint64_t seed,
                             const char **dir);
/* Runs the serial reference (par_golden_run) of the matrix's config into
 * out_dir with the given precision (64/32), data and steps.  Producers use it. */
par_status par_matrix_golden(par_matrix *m, int precision, const char *fixture, const char *data_path,
                             int64_t steps, uint64_t seed, const char *out_dir);

/* Accessors. */
int par_matrix_count(const par_matrix *m);
const par_matrix_cell *par_matrix_cell_at(const par_matrix *m, int i);
const par_cell_result *par_matrix_result(const par_matrix *m, int i);
const par_config *par_matrix_config(const par_matrix *m);
const char *par_matrix_out_dir(const par_matrix *m);
int par_matrix_fixture_count(const par_matrix *m);
const char *par_matrix_fixture(const par_matrix *m, int i);
const char *par_matrix_primary_fixture(const par_matrix *m);
int64_t par_matrix_steps(const par_matrix *m);
uint64_t par_matrix_seed(const par_matrix *m);

/* Output: the summary table (text), the cells without running them, and
 * the report as Markdown (".md") or JSON (".json"), by the extension. */
void par_matrix_print_table(const par_matrix *m, FILE *out);
void par_matrix_print_cells(const par_matrix *m, FILE *out);
par_status par_matrix_write_report(const par_matrix *m, const char *path);

#endif
