/* parallel/train/run_summary.h - a training run's metrics as JSON: what
 * `parity run --summary FILE.json` writes and `parity matrix` reads (the
 * printed report of `parity run` is for people; scripts read this).
 * docs/matrix.md, "Run summary", lists every key:
 *
 *   {"format": "parity-run-summary", "version": 1, "preset", "precision",
 *    "backend", "steps", "start_step", "layout": {...sizes, schedule, layout
 *    string}, "losses": [{"step", "loss", "loss_main", "loss_mtp",
 *    "loss_aux", "grad_norm", "wall_s"}], "emulated": null | {"step_time_s",
 *    "exposed_comm_s", "ranks": [{"rank", "total_s", "compute_s", "comm_s",
 *    "idle_s", "bytes": {"nvlink", "ib"}}]}, "cost_as": null | {...}, "pipeline": null | {...},
 *    "expert_parallel": null | {...}, "context_parallel": null | {...},
 *    "loads": {...}, "memory": [{"rank", "weights", ...}], "n_params",
 *    "max_rank_floats", "saves", "wall_s"}
 *
 * Under MPI the emulated clocks of a process are those of the ranks it
 * hosted: "emulated.ranks" lists the ranks with a clock, and the maxima are
 * over them.
 *
 * Untemplated.
 */
#ifndef PAR_PARALLEL_TRAIN_RUN_SUMMARY_H
#define PAR_PARALLEL_TRAIN_RUN_SUMMARY_H

#include <cjson/cJSON.h>

#include "core/status.h"
#include "parallel/train/run.h"

/* The summary document of a finished run (NULL: out of memory). */
cJSON *par_run_summary_json(const par_run_summary *sum, const char *preset, int precision);

/* The matrix's metrics of a summary document: emulated step time and
 * exposed communication per step (the largest over ranks), the pipeline's
 * emulated bubble; NAN where the document has none. */
void par_run_summary_metrics(const cJSON *doc, double *step_time_s, double *bubble, double *exposed_comm_s);

#endif
