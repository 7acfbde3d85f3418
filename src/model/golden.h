/* model/golden.h - writing golden sets (GOLDEN.md; templated: see
 * kernels/real.h).  docs/golden.md lists what a set holds.
 *
 *   params.K.safetensors  every parameter (floats in the working precision,
 *                         gate.tid2eid I32) before update K (K = 0..steps);
 *                         for K >= 1 also the optimizer state
 *                         opt.<name>.momentum (Muon) and opt.<name>.exp_avg /
 *                         opt.<name>.exp_avg_sq (AdamW)
 *   step.K.safetensors    inputs, out.*, act.*, router.*, attn.*.selected and
 *                         grad.* of step K (K < steps)
 */
#ifndef PAR_MODEL_GOLDEN_H
#define PAR_MODEL_GOLDEN_H

#include <stdint.h>

#include "core/status.h"
#include "kernels/real.h"
#include "model/facade.h"
#include "model/model.h"

/* Writes dir/params.K.safetensors from the model's current parameters (and
 * optimizer state when with_opt). */
par_status PAR_FN(par_golden_write_params)(const PAR_FN(par_model) *M, const char *dir, int64_t k,
                                           int with_opt);
/* Writes dir/step.K.safetensors from the last forward + backward (before the
 * update).  Needs M->have_fwd. */
par_status PAR_FN(par_golden_write_step)(const PAR_FN(par_model) *M, const char *dir, int64_t k);

/* The whole golden run (model/facade.h's par_golden_run for this precision). */
par_status PAR_FN(par_golden_run)(const par_golden_opts *o, par_golden_summary *sum);

/* openblas_get_corename(). */
const char *PAR_FN(par_golden_blas_core)(void);

#endif
