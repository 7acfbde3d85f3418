/* matrix/rankof.h - which rank of a layout computed or held an element of
 * a golden set: the diagnosis of a failing comparison names it (docs/matrix.md,
 * "Root cause first").  The rank arithmetic is parallel/layout/groups.h's.
 *
 *   a row-indexed step tensor ([B,S,...]: input.*, act.*, router.*.idx,
 *     attn.*.selected, out.*logits) at (b, s): the attention-DP rank
 *     b / (B/Da), the CP rank s / (S/CP), the microbatch of that DP rank,
 *     and the pipeline stage holding the tensor's block;
 *   an expert's tensor (experts.E in the name; router.*.load at [E]): the
 *     EP rank E / (E_total/EP) and the stage of its block, its EDP replicas;
 *   any other tensor of a block: the stage holding it (PP > 1).
 * Each as the world rank (tp = etp = 0; dp = edp = 0 for an expert) too.
 *
 * A set's manifest records its layout ("layout") and model ("model",
 * "train"); the layout string is "pipeline_model_parallel_layout" (Megatron's
 * even split when absent); a resumed pair's merged set
 * (model/goldenset.h) records the layout after the checkpoint as
 * "layout"."after_checkpoint".  Untemplated.
 */
#ifndef PAR_MATRIX_RANKOF_H
#define PAR_MATRIX_RANKOF_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "parallel/layout/layout.h"

typedef struct {
    par_layout lay[2];  /* resolved: the set's layout, and (a resumed pair's set) the one after the checkpoint */
    int n_lay;
    int64_t from_step;  /* lay[1] computed step.K for K >= from_step and params.K for K > from_step */
    int64_t B, S, E;    /* global batch, sequence length, routed experts */
} par_rankof;

/* The layout of the golden set in dir (its manifest).  PAR_EINVAL when it
 * has none that resolves; a serial set (world 1) is PAR_OK with world 1. */
par_status par_rankof_from_set(const char *dir, par_rankof *out);

/* The owning ranks of element coord of tensor (in file) into buf[n]: 1
 * when there is something to say (world > 1), else 0 and buf "". */
int par_rankof_describe(const par_rankof *x, const char *file, const char *tensor, int ndim, const int64_t *coord,
                        char *buf, size_t n);

#endif
