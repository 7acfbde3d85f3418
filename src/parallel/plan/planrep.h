/* parallel/plan/planrep.h - what `parity plan` adds to the layout summary
 * (parallel/plan/plan.h): the tuning guide's numbers (parallel/plan/guide.h), the
 * memory of the heaviest rank of every stage (parallel/plan/memmodel.h) and the
 * analytical step time (parallel/plan/steptime.h), as text and as JSON.
 * Untemplated. */
#ifndef PAR_PARALLEL_PLAN_PLANREP_H
#define PAR_PARALLEL_PLAN_PLANREP_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "comm/netmodel.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"
#include "parallel/plan/memmodel.h"
#include "parallel/plan/steptime.h"

typedef struct {
    const par_config *cfg;
    const par_layout *l;        /* resolved */
    par_memmodel_opts mm;             /* the memory model's options (runtime, precision, skew) */
    const par_netmodel *net;    /* the network of the step time */
    par_steptime_opts st;
    int guide;                  /* also the guide's configs A, B, C */
} par_planrep_opts;

/* Text sections: guide (expert parameters, routed weights per EP, batch and
 * bubble, VPP, dispatch tokens, D_window), memory per stage, step time,
 * and with o->guide the configs table. */
par_status par_planrep_print(FILE *f, const par_planrep_opts *o);

/* The same as one JSON object (cJSON_Delete it): "layout", "guide",
 * "memory" (per stage, bytes), "step_time", and "guide_configs" with
 * o->guide. */
par_status par_planrep_json(const par_planrep_opts *o, cJSON **out);

#endif
