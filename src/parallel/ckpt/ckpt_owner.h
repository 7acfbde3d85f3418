/* parallel/ckpt/ckpt_owner.h - checkpoint ownership rules (untemplated): which
 * element ranges of which tensors each world rank WRITES under a layout.
 * Each rule is a par_ckpt_owner_fn (parallel/ckpt/ckpt.h) and is always passed
 * explicitly: to par_ckpt_reshard, and by the training driver's save
 * (parallel/ckpt/ckpt_model.h).  A rule reads the tensor list's fields (roles:
 * slot, parameter, expert, block), never the names, except the two top-level
 * tensors a pipeline places specially ("embed.weight", "head.weight", the
 * contract's names).  docs/checkpoints.md, "Ownership".
 *
 * par_ckpt_owner_driver, the training driver's rule: every tensor is written
 * by the pipeline stage that holds it (pipeline parts as parallel/step/exec_hold.c
 * builds them: a block on the stage of its segment, embed.weight on the
 * stages with E or m, head.weight on the stages with L or m, the other
 * top-level tensors with L); a part held by several pipeline ranks (embed /
 * head under PP with MTP, DualPipe's two copies) by the LOWEST pipeline rank
 * holding it, the rank a dump takes it from (parallel/step/exec_dump.c).  On that pipeline
 * rank:
 *   - dense parameters (gate.bias and tid2eid included): the replica at
 *     attention coordinates tp = cp = dp = 0;
 *   - routed experts: their EP owner (ep = e / (E / EP)) at etp = edp = 0;
 *   - optimizer state under ZeRO-1: the pieces of that stage's plans
 *     (parallel/layout/zero_geom.h: par_zero_geom_piece of the dp-cp group's dense
 *     geometry and the edp group's expert geometry, listing the entries the
 *     stage holds in table order): an AdamW tensor cut at the shards of the
 *     flat buffer, a Muon momentum whole on its owner, padding never written;
 *   - optimizer state, replicated: with its parameter.
 * It needs no model: the list gives the parameters in table order, their
 * optimizer kinds (from their state slots), experts and blocks; the layout
 * gives the grid and the pipeline (its resolved segments, or for a layout
 * not resolved against a model its pp_layout string / Megatron's default
 * split with the block counts of the list).  The geometries are the run's
 * own (the same builder), so the shards are exactly what the run's plans
 * hold.  TP and ETP > 1 are PAR_EUNSUPPORTED; a world that does not fold,
 * experts that do not split over EP, a parameter no stage holds, state of a
 * non-float parameter are PAR_EINVAL.  ud is unused.
 *
 * par_ckpt_owner_simple, for tools and tests of the format: routed-expert
 * tensors (state included) whole on world rank e / (E / EP) (E = 1 + the
 * largest expert; EP must divide E and be <= the world size), everything
 * else whole on rank 0.  PP, CP, DP and ZeRO-1 are ignored: valid coverage,
 * but not where the driver keeps things.  ud is unused.
 */
#ifndef PAR_PARALLEL_CKPT_CKPT_OWNER_H
#define PAR_PARALLEL_CKPT_CKPT_OWNER_H

#include "core/status.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/layout/layout.h"

par_status par_ckpt_owner_driver(const par_layout *layout, int nranks, int rank, const par_ckpt_tensor *tensors,
                                 int ntensors, par_ckpt_slice **out, int *nout, void *ud);

par_status par_ckpt_owner_simple(const par_layout *layout, int nranks, int rank, const par_ckpt_tensor *tensors,
                                 int ntensors, par_ckpt_slice **out, int *nout, void *ud);

#endif
