/* matrix/matrix-impl.h - the matrix's internals shared by matrix.c
 * (construction, cells, references), matrix_run.c (the runner) and
 * matrix_report.c (table and reports).  Not a public header. */
#ifndef PAR_MATRIX_MATRIX_IMPL_H
#define PAR_MATRIX_MATRIX_IMPL_H

#include <stdarg.h>
#include <stdio.h>

#include "model/compare.h"
#include "matrix/matrix.h"

#define PAR_MX_PATH 1024
#define PAR_MX_MAX_FIXTURES 128
#define PAR_MX_MARKER ".parity-matrix"

typedef enum {
    PAR_CELL_PENDING = 0, /* not run (yet) */
    PAR_CELL_PASS,        /* compared equal within its policy, checks passed */
    PAR_CELL_FAIL,        /* the comparison or a check failed */
    PAR_CELL_ERROR,       /* the cell could not produce or read its sets */
    PAR_CELL_WARN,        /* an informational cell's comparison failed: reported, not a failure */
} par_cell_verdict;

const char *par_cell_verdict_name(par_cell_verdict v); /* "PASS", "FAIL", "ERROR", "WARN", "-" */

typedef enum {
    PAR_REF_SERIAL = 0, /* the serial run of the cell's (config, precision, data, steps, seed) */
    PAR_REF_DIR,        /* a fixed golden-set directory (ref_dir): a checked-in set */
    PAR_REF_NONE,       /* no comparison: the cell's check decides */
    PAR_REF_BACKEND,    /* the same layout run on the cell's vs-backend (cells.h), into CELL/ref-set */
} par_ref_kind;

/* A checked-in golden set found under the golden root. */
typedef struct {
    char dir[PAR_MX_PATH];
    char preset[16];      /* from the directory name ("v4-tiny", "v4-tiny-...") */
    char fixture[64];     /* "" when unreadable or not reproducible */
    int64_t steps;
    uint64_t seed;
    char blas_core[64];
    char error[400];      /* why it could not be used ("" when fine, "skip": another kind of set) */
} par__matrix_golden;

/* A serial run the matrix produced (a reference, or the f32 run). */
typedef struct {
    char cfgkey[400];     /* par__matrix_cell.cfgkey */
    par_config cfg;
    int precision;        /* 64, or 32 (dir: widened to F64; raw: as run) */
    char fixture[64];
    char data_path[512];
    int64_t steps;
    uint64_t seed;
    char dir[PAR_MX_PATH];
    char raw[PAR_MX_PATH + 8];
    par_status status;    /* of the run that produced it */
    char error[600];
    int produced;         /* 1 once attempted */
    int last_use;         /* last cell index that uses it (f64; -1: none declared) */
    int pinned;           /* a failing cell used it: keep */
    int removed;
} par__matrix_ref;

/* A cell: a row expanded on concrete data. */
typedef struct {
    par_cell_spec row;        /* the row it came from */
    char fixture[64];         /* "" for the generator and data files */
    char data_path[512];      /* a data file, or "" */
    char data_label[80];      /* the table's data column */
    int64_t steps, split;
    uint64_t seed;
    par_config cfg;           /* preset + sets + the layout's global batch */
    char cfgkey[400];         /* preset and overrides: which references it shares */
    int64_t ranks;
    par_ref_kind ref;
    char ref_dir[PAR_MX_PATH];
    par_policy policy;        /* resolved */
    char layout[200];         /* one line */
    char note[300];
    char error[400];          /* non-empty: the cell is ERROR with this message (unreadable golden set) */
} par__matrix_cell;

/* What a layout run measured (NAN: not applicable), from its summary. */
typedef struct {
    double step_time_s;       /* emulated step time (the slowest rank's virtual clock per step) */
    double bubble;            /* pipeline bubble fraction (rank 0's, virtual clock) */
    double exposed_comm_s;    /* largest per-rank exposed communication per step */
} par_cell_metrics;

/* Outcome of one cell. */
typedef struct {
    par_cell_verdict verdict;
    char policy[16];          /* resolved policy name, "checks" for PAR_REF_NONE */
    int n_entries, n_failed;  /* of the comparison */
    /* The worst entry: failing before passing, then the largest fraction of
     * its tolerance used (norm policies) or the most differing elements. */
    char worst_file[64];
    char worst_tensor[192];
    char worst_mode[16];
    double worst_rel_l2, worst_max_abs;
    double worst_frac;        /* ||B-A|| / bound; NAN when not a norm policy */
    int64_t worst_ndiff;
    /* The root cause of a failing comparison: the first failing entry in
     * dataflow order (model/rootcause.h), and how many failing entries it
     * explains as consequences (integer mismatches downstream). */
    char root_file[64];
    char root_tensor[192];
    char root_where[400];     /* its first listed element, decoded, with the owning rank */
    int n_consequences;       /* failing integer entries downstream of the root */
    char diagnosis[1024];     /* one line: why it failed ("" when it passed) */
    par_cell_metrics met;
    char backend[16];         /* the backend its (last) layout run ran on ("" when none ran in process) */
    char backend_why[240];    /* how it was chosen: --backend, the cell's own, or the default rule's reason */
    cJSON *run;               /* the layout run's summary (the last run of a pair), or NULL */
    cJSON *ref_run;           /* a vs-backend cell: the reference run's summary, or NULL */
    double wall_s;
    char dir[PAR_MX_PATH];    /* the cell's work directory ("" once removed) */
    char report_json[PAR_MX_PATH + 16]; /* compare report of a failing cell ("" otherwise) */
} par__matrix_result;

struct par_matrix {
    par_matrix_opts o;        /* pointers of the caller's strings are not kept: see below */
    char preset[16];          /* the preset filter ("" = every preset) */
    char backend[16];
    char out_dir[PAR_MX_PATH];
    char fixtures_dir[PAR_MX_PATH];
    char golden_root[PAR_MX_PATH];
    char **only_cells;
    int n_only_cells;
    int nfix;
    char fixtures[PAR_MX_MAX_FIXTURES][64]; /* the selected fixtures of every preset, sorted */
    int ngold;
    par__matrix_golden *gold;
    int n, cap;
    par__matrix_cell *cells;
    par__matrix_result *res;
    int nref, refcap;
    par__matrix_ref *refs;
    double wall_s;
    char blas_core[64];
    int ran;
    cJSON *pins;              /* the emulated-clock pins (par__matrix_pins_path), or NULL: none checked */
    char pins_path[PAR_MX_PATH];
    /* --baseline (matrix_baseline.c): the earlier report, read when set; the diff once run */
    cJSON *baseline_old, *baseline_diff;
    char baseline_path[PAR_MX_PATH];
    double baseline_margin; /* relative (0.05 = 5 %) */
};

/* ---- reports (matrix_report.c, matrix_junit.c, matrix_baseline.c) ---- */

/* The report as JSON (what --report FILE.json writes); NULL when out of memory. */
cJSON *par__matrix_report_json(const par_matrix *m);
/* --report FILE.xml: JUnit XML, one testcase per cell. */
par_status par__matrix_write_junit(const par_matrix *m, const char *path);
/* The diff of this run's report (cur) against an earlier one (old) read from path, margin relative;
 * NULL when out of memory.  Its arrays: verdict_changed, numbers_changed, figures_moved, new_cells,
 * gone_cells (matrix_baseline.c). */
cJSON *par__matrix_baseline_diff(const cJSON *old, const cJSON *cur, const char *path, double margin);
void par__matrix_baseline_print(const cJSON *diff, FILE *out);
/* One cell's changes as lines ("baseline: ...\n"; "" when none). */
void par__matrix_baseline_cell(const cJSON *diff, const char *cell, const char *data, char *buf, size_t n);

/* ---- helpers (matrix.c) ---- */
int par__matrix_fmt(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
double par__matrix_now(void);
par_status par__matrix_mkdir_p(const char *path);
int par__matrix_dir_is_empty(const char *dir);
void par__matrix_remove_quiet(const char *path);
/* Creates the results directory (replacing an earlier matrix's). */
par_status par__matrix_prepare_out_dir(par_matrix *m);
/* The last error message, one line (newlines flattened), after prefix. */
void par__matrix_last_error(char *buf, size_t n, const char *prefix);
/* The serial run of the cell's config, data, steps and seed in precision
 * 64 or 32 (raw: the f32 set as run; else widened to F64), produced once. */
par_status par__matrix_serial(par_matrix *m, const par__matrix_cell *c, int precision, int raw, const char **dir);
/* The matrix's memory check (par_matrix_opts.max_memory) of one run before
 * it allocates: the serial run of cfg (l NULL) or the layout l in this
 * process; PAR_EINVAL naming the estimate when it does not fit (an estimate
 * that cannot be made, a layout the run refuses itself, passes: the run
 * speaks). */
par_status par__matrix_mem_check(const par_matrix *m, const par_config *cfg, const par_layout *l, int precision,
                            int64_t steps);
/* Runs the serial reference (par_golden_run) of cfg into out_dir, after
 * par__matrix_mem_check. */
par_status par__matrix_golden_run(par_matrix *m, const par_config *cfg, int precision, const char *fixture,
                             const char *data_path, int64_t steps, uint64_t seed, const char *out_dir);
/* The same with the row blocks given (0: one shot), no memory check. */
par_status par__matrix_golden_run_rows(par_matrix *m, const par_config *cfg, int precision, const char *fixture,
                                       const char *data_path, int64_t steps, uint64_t seed, const char *out_dir,
                                       int64_t rows);
par__matrix_ref *par__matrix_ref_get(par_matrix *m, const par__matrix_cell *c, int precision);

/* The emulated-clock pins (docs/matrix.md "The emulated clock, pinned"):
 * GOLDEN_ROOT/emulated-clock.json, or $PARITY_EMULATED_PINS ("none": no
 * pins).  A missing file is no pins; an unreadable one is an error. */
par_status par__matrix_pins_load(par_matrix *m);

/* ---- the runner (matrix_run.c) ---- */
void par__matrix_run_cell(par_matrix *m, int idx);

#endif
