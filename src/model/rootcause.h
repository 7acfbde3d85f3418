/* model/rootcause.h - the root cause of a failing comparison: the first
 * divergent tensor in dataflow order, not the one with the largest error
 * (docs/matrix.md, "Root cause first").
 *
 * Dataflow order of a golden set, step by step:
 *   params.K                the parameters step K reads (K >= 1: the
 *                           optimizer state opt.<name>.* before <name>)
 *   step.K, forward         input.*, then block by block (layers 0..n-1,
 *                           then out.logits, then the MTP blocks, then
 *                           out.mtp_logits): in each block its float output
 *                           (act.*) before its integers (attn.*.selected,
 *                           router.*.idx, router.*.load), then the losses
 *   step.K, backward        grad.* from the last block back: MTP blocks,
 *                           the head (head, norm, hc_head_*), layers n-1..0
 *                           (in a layer the FFN before the attention), the
 *                           embedding; then out.grad_norm
 *   params.K+1              and so on.
 * A block's integers come after its float output because the float that
 * changed them (the attention or gate input) is not dumped: the first
 * observable float divergence of a block is the cause of its routing or
 * selection mismatches, not their consequence.  An integer entry fails
 * first only when no float entry failed at or before its block (a routing
 * flip within the float tolerance).
 *
 * Untemplated: depends on model/compare.h.
 */
#ifndef PAR_MODEL_ROOTCAUSE_H
#define PAR_MODEL_ROOTCAUSE_H

#include "model/compare.h"

/* Orders two (file, tensor, dtype) entries in dataflow order: < 0 when a
 * comes first.  Files that are not set files sort by name after them. */
int par_dataflow_cmp(const char *file_a, const char *tensor_a, par_dtype dtype_a, const char *file_b,
                     const char *tensor_b, par_dtype dtype_b);

/* Only entries both sides hold can diverge: an entry one side lacks (or an
 * --only pattern that matched nothing) is counted in n_missing, never named
 * as the root. */
typedef struct {
    int root;              /* entry index of the first failing entry both sides hold, in dataflow order; -1: none */
    int n_failed;          /* failing entries */
    int n_consequences;    /* failing integer entries after the root in dataflow order */
    int first_consequence; /* entry index of the first of them; -1: none */
    int n_missing;         /* failing entries one side lacks (and failing selection entries) */
    int first_missing;     /* entry index of the first of them in dataflow order; -1: none */
} par_root_cause;

void par_compare_root_cause(const par_compare_report *r, par_root_cause *out);

#endif
