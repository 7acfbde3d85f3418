/* matrix/matrix_plan.h - the analytical plan against a layout run
 * (matrix/matrix_plan.c; docs/matrix.md "The plan against the run"). */
#ifndef PAR_MATRIX_MATRIX_PLAN_H
#define PAR_MATRIX_MATRIX_PLAN_H

#include "comm/netmodel.h"
#include "core/json.h"
#include "model/config.h"
#include "parallel/train/run.h"
#include "matrix/matrix-impl.h"

/* Adds to a run's summary doc a "plan" object: what parallel/plan predicts
 * for the run's resolved layout (run_cfg at the run's S, `precision`, the
 * run's EP loads, the network net or NULL) next to what the run measured.
 * A layout the planner refuses is recorded as "not_modelled" (its reason);
 * out of memory: the object is incomplete.  Never fails the run. */
void par__matrix_plan_attach(cJSON *doc, const par_config *run_cfg, int precision, const par_run_summary *sum,
                             const par_netmodel *net);

/* A passing cell whose run's "plan" figures are further apart than their
 * bounds (10 % each, docs/planning.md) becomes FAIL, its diagnosis naming
 * the figure and both numbers; anything else is left as it is. */
void par__matrix_plan_check(par__matrix_result *res);
#endif
