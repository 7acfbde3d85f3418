/* parallel/ckpt/ckpt_model.h - a rank's model and optimizer state to and from a
 * distributed checkpoint (templated: see kernels/real.h).  The training
 * driver's --save / --load; docs/checkpoints.md, "With the driver".
 *
 * Saving writes what the ownership rule par_ckpt_owner_driver
 * (parallel/ckpt/ckpt_owner.h) gives this rank, read from its parameters and its
 * plans' optimizer state (parallel/dp/dpw.h).
 *
 * Loading reads, for every rank, EVERYTHING it holds (all its parameters;
 * its shard / owned matrices of the state, or the whole state when
 * replicated) from whatever shards cover it: that is the reshard to the
 * current layout (any PP / VPP / schedule, DP, CP, EP, ZeRO on/off).
 */
#ifndef PAR_PARALLEL_CKPT_CKPT_MODEL_H
#define PAR_PARALLEL_CKPT_CKPT_MODEL_H

#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/dp/dpw.h"
#include "parallel/reduce/reduce.h"

/* Collective over the world: writes checkpoint `dir` (atomic) with this
 * rank's owned slices; st = the training state (step, cursor, seed,
 * precision). */
par_status PAR_FN(par_ckpt_model_save)(const par_pctx *P, const PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                       const char *dir, const par_ckpt_state *st);

/* Fills this rank's parameters and optimizer state from an open checkpoint
 * (par_ckpt_model_check first) and sets M->step to the saved step.  Not
 * collective (reads the shared handle). */
par_status PAR_FN(par_ckpt_model_load)(const par_pctx *P, PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                       const par_ckpt *ck);

/* The checkpoint holds exactly the tensors of the model of `cfg` at this
 * precision, with the same dtypes, shapes and roles (PAR_EINVAL naming the
 * first tensor that differs and both dtypes and shapes; PAR_EINVAL for
 * another precision). */
par_status PAR_FN(par_ckpt_model_check)(const par_ckpt *ck, const par_config *cfg);

#endif
