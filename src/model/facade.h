/* model/facade.h - untemplated entry points of the serial reference for the
 * CLI: each dispatches to the _f64 or _f32 build of the templated code
 * (kernels/real.h).  Include this (never model/model.h) from untemplated
 * code.
 */
#ifndef PAR_MODEL_FACADE_H
#define PAR_MODEL_FACADE_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"

/* Where a golden run's batches come from (at most one of data_path and
 * fixture; neither = the synthetic generator with a random packing plan
 * drawn from the seed). */
typedef struct {
    par_config cfg;           /* validated; global_batch_size and seq_length set */
    int precision;            /* 64 or 32 */
    int64_t steps;            /* >= 1 */
    uint64_t seed;            /* parameter init, packing plan and synthetic tokens */
    const char *out_dir;      /* the golden set directory (replaced atomically) */
    const char *data_path;    /* safetensors with input.tokens/input.segments, or NULL */
    const char *fixture;      /* fixture name (fixtures/NAME.json), or NULL */
    const char *fixtures_dir; /* where fixtures live; NULL = default search (model/data.h) */
    int progress;             /* 1: one line per step on stderr */
    int64_t rows_per_block;   /* > 0 and < the batch: gradients accumulated over row blocks of
                               * this many rows (model.h par_model_forward_backward_rows);
                               * 0: one shot, the whole batch at once (the default) */
    int router_scores;        /* 1: also scores.K.safetensors, the router's selection values (one shot only;
                               * docs/recipes.md "Derived bounds") */
} par_golden_opts;

void par_golden_opts_init(par_golden_opts *o); /* precision 64, steps 1, seed 1234 */

/* Per-step results of a golden run. */
typedef struct {
    double loss, loss_main, loss_mtp, loss_aux, grad_norm;
    double wall_s;            /* forward + backward + update */
    int64_t index_rows[2];    /* the indexer's query rows with a choice (more visible entries than index_topk)
                                 and those with an exact tie at the top-k boundary, over the ratio-4 blocks
                                 (ties.K.safetensors; 0, 0 without one: no ratio-4 block, or row blocks) */
    int64_t router_rows[2];   /* the score-routed gates' rows with a choice (K < E) and those with an exact tie
                                 at the top-K boundary, over those blocks (0, 0 with row blocks) */
} par_golden_step_info;

typedef struct {
    int64_t steps;
    int64_t seq_length;         /* S of the run (a --data file's, not the preset's) */
    par_golden_step_info *step; /* [steps] (par_malloc'd; par_golden_summary_free) */
    double wall_s;              /* the whole run, writing included */
    int64_t n_params;           /* float parameters */
    char blas_core[64];         /* openblas_get_corename() */
} par_golden_summary;

void par_golden_summary_free(par_golden_summary *s);

/* The manifest's "layout" record (GOLDEN.md): model/layout_record.h. */

/* Runs the serial reference (world size 1) for o->steps steps and writes the
 * golden set of GOLDEN.md into o->out_dir (built in a temporary directory
 * and renamed: nothing half-written on failure).  *sum (if not NULL) is set
 * on success. */
par_status par_golden_run(const par_golden_opts *o, par_golden_summary *sum);

/* The OpenBLAS core name of this machine's kernels ("Haswell", ...). */
const char *par_blas_core_name(void);

#endif
