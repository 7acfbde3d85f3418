/* model/init.h - deterministic parameter initialization (templated).
 *
 * Every element is a pure function of (seed, parameter name, element index)
 * (par_param_init_value in model/params.h, computed in double and rounded
 * once to the working precision), so f64 and f32 runs start from the same
 * values up to that rounding, and a shard initializes exactly its slice in
 * any order.  Distributions: docs/model.md ("Initialization").
 */
#ifndef PAR_MODEL_INIT_H
#define PAR_MODEL_INIT_H

#include <stdint.h>

#include "kernels/real.h"
#include "model/params.h"

/* Fills every float parameter of the flat buffer and (if i32 != NULL) every
 * int32 parameter (gate.tid2eid). */
void PAR_FN(par_init_params)(par_real *flat, /* [t->n_float] */
                             int32_t *i32,   /* [t->n_i32] or NULL */
                             const par_param_table *t, uint64_t seed);

/* Elements [begin, end) of REAL entry idx into out[0 .. end-begin).
 * PAR_ERANGE if the slice is outside the tensor, PAR_EINVAL for an I32 entry. */
par_status PAR_FN(par_init_param_slice)(par_real *out, /* [end - begin] */
                                        const par_param_table *t, int idx, uint64_t seed,
                                        int64_t begin, int64_t end);

/* Elements [begin, end) of I32 entry idx (tid2eid) into out. */
par_status PAR_FN(par_init_param_slice_i32)(int32_t *out, /* [end - begin] */
                                            const par_param_table *t, int idx, int64_t begin,
                                            int64_t end);

#endif
