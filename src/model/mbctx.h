/* model/mbctx.h - the step executor's per-microbatch context of a model
 * call (untemplated; model/model.h's hooks take it). */
#ifndef PAR_MODEL_MBCTX_H
#define PAR_MODEL_MBCTX_H

#include <stdint.h>

/* Which piece of a step a model call computes: the step executor's
 * per-microbatch context (parallel/step/exec.h).  The model hands it,
 * unchanged, to the executor hooks (model/model.h); nothing of it is kept in the
 * model.  The serial step passes microbatch 0 and all of its rows. */
typedef struct {
    int mb;                  /* the microbatch: the key of the hooks' state, >= 0 */
    int64_t row0, rows;      /* rows [row0, row0 + rows) of the rank's batch    */
    int64_t S;               /* tokens of one whole row                         */
    const int32_t *pos_rows; /* [rows, S] positions of the WHOLE rows when the
                              * rank holds parts of rows (CP), else NULL       */
} par_mbctx;

#endif
