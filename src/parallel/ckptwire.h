/* parallel/ckptwire.h - distributed checkpoints of the training driver
 * (templated: see kernels/real.h): save what each rank holds under the
 * driver's ownership, load (reshard) into any current layout.
 * docs/checkpoints.md, "With the driver".
 *
 * The ownership rule (par_ckpt_owner_driver, declared in parallel/driver.h
 * because the CLI registers it): which elements of which tensor each world
 * rank WRITES.  Every tensor is written by the pipeline stage that holds it
 * (pipeline parts as parallel/pp.c builds them: a block on the stage of its
 * segment, embed.weight on the stages with E or m, head.weight on the stages
 * with L or m, norm.weight + hc_head_* with L); a part held by several
 * pipeline ranks (embed / head under PP with MTP, DualPipe's two copies) is
 * written by the LOWEST pipeline rank holding it, the rank
 * par_pp_gather_full takes it from.  On that pipeline rank: dense
 * parameters (gate.bias and tid2eid included): the replica at attention
 * coordinates tp = cp = dp = 0; routed experts: their EP owner at etp =
 * edp = 0; optimizer state: under ZeRO-1 the shard owners' element ranges
 * of that stage's plans (AdamW: the pieces of the flat buffer each dp-cp /
 * edp group rank owns, padding never written; Muon: the owning rank, whole
 * matrix), replicated: the same designated replica as the parameter.
 * Computed from the checkpoint's tensor list alone (table order, optimizer
 * kinds from the opt.* names, experts and blocks from the names) and the
 * layout (its resolved segments, or its layout string / the default split),
 * with the same plan builder as the run (parallel/zero.h), so it needs no
 * model.
 *
 * Loading reads, for every rank, EVERYTHING it holds (all its parameters;
 * its shard / owned matrices of the state, or the whole state when
 * replicated) from whatever shards cover it: that is the reshard to the
 * current layout (any PP / VPP / schedule, DP, CP, EP, ZeRO on/off).
 */
#ifndef PAR_PARALLEL_CKPTWIRE_H
#define PAR_PARALLEL_CKPTWIRE_H

#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/ckpt.h"
#include "parallel/dp_step.h"
#include "parallel/reduce.h"

/* Collective over the world: writes checkpoint `dir` (atomic) with this
 * rank's owned slices; st = the training state (step, cursor, seed,
 * precision). */
par_status PAR_FN(par_ckptw_save)(const par_pctx *P, const PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                  const char *dir, const par_ckpt_state *st);

/* Fills this rank's parameters and optimizer state from an open checkpoint
 * (par_ckptw_check first) and sets M->step to the saved step.  Not
 * collective (reads the shared handle). */
par_status PAR_FN(par_ckptw_load)(const par_pctx *P, PAR_FN(par_model) *M, PAR_FN(par_dpw) *w,
                                  const par_ckpt *ck);

/* The checkpoint holds every tensor of the model of `cfg` at this
 * precision with the same shapes and dtypes (PAR_EINVAL naming the first
 * difference, PAR_EINVAL for another precision). */
par_status PAR_FN(par_ckptw_check)(const par_ckpt *ck, const par_config *cfg);

#endif
