/* parallel/plan/plan.h - a layout checked against a model config, and the
 * readable summary `parity plan` prints.  Untemplated. */
#ifndef PAR_PARALLEL_PLAN_PLAN_H
#define PAR_PARALLEL_PLAN_PLAN_H

#include <stdio.h>

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

/* par_layout_resolve against cfg (planning-only presets are fine). */
par_status par_plan_resolve(par_layout *l, const par_config *cfg);

/* Prints the summary of a resolved layout: world, Da/De, microbatches,
 * per-segment blocks, and rank coordinates with group members: for `rank`
 * alone when rank >= 0, else for a few ranks (the first two and the last
 * of every pipeline stage, at most 12). */
void par_plan_print(FILE *f, const par_layout *l, const par_config *cfg, int rank);

#endif
