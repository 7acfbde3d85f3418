/* matrix/cells.h - the cells of the conformance matrix as data
 * (docs/matrix.md, "Cells").
 *
 * A cell is one row: what it runs (kind), on which preset and data, for how
 * many steps, in which precision, under which layout (the flags of
 * `parity run`, by Megatron-LM's names), what it is compared with and how
 * (policy, files), and the tier that runs it (quick: v4-tiny, what CI
 * runs; default and full: v4-mini; scale: the acceptance cells of many
 * ranks and big batches, minutes each).  The built-in catalogue is one
 * static table (par_cells_builtin); a user's own list (`parity matrix
 * --cells FILE.json`) has rows of the same format, read strictly by
 * par_cells_read.  matrix/matrix.h runs them.
 *
 * Untemplated.
 */
#ifndef PAR_MATRIX_CELLS_H
#define PAR_MATRIX_CELLS_H

#include <stdint.h>

#include "core/status.h"
#include "model/compare.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

typedef enum {
    PAR_CELL_TIER_QUICK = 0, /* "quick": v4-tiny, seconds (CI, `--quick`) */
    PAR_CELL_TIER_DEFAULT,   /* "default": v4-mini, the cells that matter most */
    PAR_CELL_TIER_FULL,      /* "full": v4-mini, the heaviest cells (`--full`) */
    PAR_CELL_TIER_SCALE,     /* "scale": acceptance cells, minutes each (`--tier scale`, `--cell NAME`) */
    PAR_CELL_TIER_COUNT
} par_cell_tier;

typedef enum {
    PAR_KIND_GOLDEN = 0, /* "golden": the serial f64 reference itself, against the checked-in set of
                          * (preset, fixture) where there is one (its steps and seed), else its own checks */
    PAR_KIND_REPEAT,     /* "repeat": the serial run again (bitwise) */
    PAR_KIND_SERIAL,     /* "serial": the serial run in `precision` against the f64 reference (f32 widened
                          * exactly to F64) */
    PAR_KIND_DATA_FILE,  /* "data-file": the reference's batches written to a file, run through --data */
    PAR_KIND_LAYOUT,     /* "layout": `parity run` under `layout`, dumped, against the serial run of the
                          * same precision, config and data */
    PAR_KIND_RESUME,     /* "resume": `split` steps under `layout` saved to a checkpoint, the rest loaded
                          * under `load-layout` (resharded when it differs), against the serial run */
    PAR_KIND_CKPT_RESHARD, /* "ckpt-reshard": `steps` under `layout` saved, the checkpoint resharded to
                          * `load-layout` (`parity ckpt reshard`): both hold the same state and tensors,
                          * bitwise (`parity ckpt diff`) */
    PAR_KIND_COUNT
} par_cell_kind;

typedef enum {
    PAR_FILES_ALL = 0,       /* "all" */
    PAR_FILES_STEPS_AND_INIT,/* "steps-and-init": step.* and params.0 */
    PAR_FILES_UPDATED,       /* "updated-params": params.1..K */
    PAR_FILES_COUNT
} par_cell_files;

/* A cell's layout: `parity run`'s flags by Megatron-LM's names (0 / "":
 * not given, the run's default). */
typedef struct {
    int64_t world_size;                           /* --world-size */
    int64_t tensor_model_parallel_size;           /* --tensor-model-parallel-size (1) */
    int64_t pipeline_model_parallel_size;         /* --pipeline-model-parallel-size */
    int64_t virtual_pipeline_model_parallel_size; /* --virtual-pipeline-model-parallel-size */
    int64_t context_parallel_size;                /* --context-parallel-size */
    int64_t expert_model_parallel_size;           /* --expert-model-parallel-size */
    int64_t expert_tensor_parallel_size;          /* --expert-tensor-parallel-size (1) */
    int64_t micro_batch_size;                     /* --micro-batch-size */
    int64_t global_batch_size;                    /* --global-batch-size (also the reference's) */
    int use_distributed_optimizer;                /* --use-distributed-optimizer */
    char pipeline_schedule[16];                   /* --pipeline-schedule */
    char pipeline_model_parallel_layout[128];     /* --pipeline-model-parallel-layout */
    char moe_dispatch[16];                        /* --moe-dispatch flat|hierarchical */
    int64_t gpus_per_node;                        /* --gpus-per-node of the emulated network */
    int sequence_parallel;                        /* --sequence-parallel */
    int tp_all_layers;                            /* --tp-all-layers */
} par_cell_layout;

#define PAR_CELL_MAX_SETS 8

typedef struct {
    char name[48];          /* the kind of check; (name, data) names a cell */
    char preset[16];        /* "v4-tiny", "v4-mini" */
    char data[512];         /* "" or "primary": <p>-boundary-mix (else the first fixture); "*": every
                             * fixture of the preset; "generator": synthetic packing from the seed; a
                             * fixture name; or a .safetensors file (`parity run --data`) */
    par_cell_kind kind;
    par_cell_tier tier;
    int64_t steps;          /* 0: the matrix's (--steps; v4-tiny 3, v4-mini 1) */
    int64_t seed;           /* with has_seed; else the matrix's --seed */
    int has_seed;
    int precision;          /* 64 (0 = 64) or 32 */
    par_policy policy;      /* AUTO: by kind (golden: by BLAS core; repeat, data-file: bitwise; else the
                             * precision's) */
    par_cell_files files;   /* which files are compared */
    int informational;      /* a failed comparison is WARN, not FAIL */
    char backend[16];       /* "": the matrix's --backend; "threads" or "fiber": the backend of this cell's
                             * layout runs whenever the matrix runs them in its own process (--backend
                             * threads or fiber; --backend mpi launches every cell its own way) -- "fiber"
                             * for worlds too big for one OS thread per rank */
    par_cell_layout layout; /* layout and resume */
    par_cell_layout load_layout; /* resume: the layout that loads the checkpoint; ckpt-reshard: the target */
    int64_t split;          /* resume: steps before the checkpoint (0: steps / 2) */
    par_cell_layout chain_layout; /* resume, optional: the run under load-layout stops at
                             * split2 = split + (steps - split) / 2 and saves again; chain-layout loads
                             * that checkpoint for the rest (a reshard chain A -> B -> C) */
    char sets[PAR_CELL_MAX_SETS][64]; /* config overrides `key=value` (MODEL.md keys), "" = none */
    char note[240];         /* why this reference and policy */
} par_cell_spec;

const char *par_cell_tier_name(par_cell_tier t);          /* "quick", "default", "full", "scale" */
par_status par_cell_tier_parse(const char *s, par_cell_tier *out);
const char *par_cell_kind_name(par_cell_kind k); /* "golden", "repeat", ... */

/* The built-in catalogue: *n rows, in the order the matrix runs them. */
const par_cell_spec *par_cells_builtin(int *n);

/* The cell's config: the preset, its `set`s, its layout's global batch
 * size; validated.  Errors name the cell and the field. */
par_status par_cell_config(const par_cell_spec *c, par_config *out);
/* c's layout (or load layout) as the driver's given fields. */
par_status par_cell_layout_to(const par_cell_layout *cl, par_layout *out);
/* c's layout resolved against a config (par_layout_resolve). */
par_status par_cell_layout_resolve(const par_cell_layout *cl, const par_config *cfg, par_layout *out);
/* 1 when the cell layout gives no flag at all. */
int par_cell_layout_empty(const par_cell_layout *cl);
/* Checks a row: kind-specific fields, the config and both layouts
 * resolved against it.  Errors name the cell and the field. */
par_status par_cell_check(const par_cell_spec *c);

/* The flags of a cell layout as `parity run` arguments ("--name", value;
 * a flag without value for --use-distributed-optimizer): calls add for
 * each given flag, in a fixed order. */
void par_cell_layout_args(const par_cell_layout *cl, void (*add)(const char *flag, const char *value, void *ud),
                          void *ud);

/* Reads a cells file (docs/matrix.md, "Your own cells"):
 *   {"format": "parity-cells", "version": 1, "cells": [{...}, ...]}
 * strictly: an unknown key, a wrong type or value, a cell that does not
 * check is PAR_EINVAL / PAR_EFORMAT with one message naming the file, the
 * cell and the field.  Data files are relative to the file's directory.
 * *out (par_free) and *n set only on success. */
par_status par_cells_read(const char *path, par_cell_spec **out, int *n);

#endif
