/* parallel/reduce/reduce.h - the one reduction module: every sum across ranks of
 * a parallel step goes through par_reduce_fields (parallel/reduce/reduce_sum.h,
 * its untemplated core).  docs/parallel.md "The
 * reduction module" lists each caller; docs/architecture.md "The one
 * reduction point".
 *
 * A reduction names its data as FIELDS (pointer, count, element type).
 * par_fields_pack is the one pack/unpack helper (fields of one type into one
 * contiguous buffer, in order, and back); par_reduce_fields is the one
 * "reduce these fields over this group" call: it packs every element type
 * present into one buffer, sums it with one collective of src/comm (which
 * sums in rank order 0..p-1 for every element, whatever the backend or the
 * packing: comm/comm.h), and unpacks.  This seam is what a bitwise mode will
 * replace; everything above it only describes fields.
 *
 * Templated on top (kernels/real.h): the step's statistics (par_stats over
 * the pipeline, context-parallel and data-parallel groups, then the losses),
 * the aux-loss counts one microbatch's backward needs under CP, and the
 * gradients of weights held on several pipeline stages.  The DP gradient
 * reduction of the optimizer (parallel/dp/zero.c par_dp_reduce_grads) and the
 * norm shares (parallel/dp/dpw.c) call par_reduce_fields on the ZeRO plan's
 * packed buffer; the CP attention layer (parallel/cp/cp.c) its entry-gradient
 * reduce-scatter.
 */
#ifndef PAR_PARALLEL_REDUCE_REDUCE_H
#define PAR_PARALLEL_REDUCE_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/layout/groups.h"
#include "parallel/layout/layout.h"
#include "parallel/reduce/reduce_sum.h"

#if PAR_REAL_BITS == 64
#define PAR_C_REAL PAR_C_F64
#else
#define PAR_C_REAL PAR_C_F32
#endif

/* ------------------------------------------------ templated: the step -- */

/* Combines M->stats of this rank (its window of samples: st->q0,
 * st->Ns_global and the GLOBAL counts n_main, n_mtp, n_tokens set by the
 * executor; the aux terms of its blocks' samples already computed, per
 * microbatch, from counts summed over CP / SP: par_reduce_mb_stats) into the
 * step's statistics and sets M->last's losses:
 *   1. over the CP group, and the TP group under sequence parallelism (the
 *      ranks of a DP group share one window): loads and CE sums summed in
 *      rank order;
 *   2. over the pipeline (P->g PP): every per-sample and per-block entry was
 *      produced on one stage, zeros elsewhere: exact;
 *   3. over attention DP (the DP group): loads summed; the per-sample CE sums
 *      and aux terms gathered in global sample order and summed exactly as
 *      the serial reference does (bitwise equal).
 * PAR_EMISMATCH if the windows do not tile [0, Ns_global).  Collective over
 * the world (through those groups). */
par_status PAR_FN(par_reduce_stats)(const par_pctx *P, PAR_FN(par_model) *M);

/* Context (and sequence) parallelism: a sample's aux-loss term and the
 * aux backward of its tokens need its counts over the WHOLE row, whose
 * slices live on the ranks of c.  Sums, in place, the view v's cnt, ntok
 * and psum (par_stats_view: one microbatch's samples) of the n_blocks
 * blocks listed in blocks (entries < 0 skipped: a stage's item list) over
 * c.  Collective over c. */
par_status PAR_FN(par_reduce_mb_stats)(par_comm *c, PAR_FN(par_stats) *v, const int *blocks, int n_blocks);

/* Gradients of weights held by several pipeline ranks, summed over group c
 * so every holder updates identically: which 0 embed.weight, 1 head.weight,
 * 2 every held entry (DualPipe's pair of copies).  Collective over c. */
par_status PAR_FN(par_reduce_shared_grads)(PAR_FN(par_model) *M, par_comm *c, int which);

/* Tensor parallelism (parallel/tp/tp_attn_hook.h): every attention gradient of the
 * model (layers.N.attn.*, mtp.N.attn.*) summed over the TP group once per
 * step.  Rank r holds its block of each split weight (zeros elsewhere: the
 * sum is exact) and its share of each replicated one (wq_a, q_norm, wkv,
 * kv_norm, the compressor), so afterwards every TP rank holds the complete
 * gradients.  The other entries are identical on the TP ranks (each saw
 * every token and the complete dy) and are not summed; the routed experts'
 * gradients, whose expert-DP group (EDP) spans the TP ranks, are zeroed on
 * TP ranks > 0 so that the EDP sum counts them once (x + 0: exact).  `what`
 * (PAR_TPG_* bits; 0: the attention's only): SKIP_WKV leaves
 * attn.wkv.weight out (the deliberate fault of a missing wkv all-reduce);
 * VOCAB adds embed.weight and head.weight (the vocab-parallel rows,
 * parallel/tp/tp_vocab_hook.h), SHARED the shared experts' (tp_moe_hook.h):
 * blocks meet zeros, exact; ALL (sequence parallelism: every rank saw its
 * own tokens) sums every dense entry, and the routed experts are left whole
 * for the EDP sum, which then adds the TP ranks' token shares.  Collective
 * over tp.  KEEP_EXPERTS (ETP = TP without SP: the ETP group is the TP group,
 * the experts' blocks are summed over it by par_reduce_etp_grads and their
 * EDP group does not span TP) leaves the routed experts as they are. */
enum { PAR_TPG_SKIP_WKV = 1u << 0, PAR_TPG_VOCAB = 1u << 1, PAR_TPG_SHARED = 1u << 2, PAR_TPG_ALL = 1u << 3,
       PAR_TPG_KEEP_EXPERTS = 1u << 4 };
par_status PAR_FN(par_reduce_tp_grads)(PAR_FN(par_model) *M, par_comm *tp, unsigned what);

/* Expert tensor parallelism (parallel/moe/etp_hook.h): every routed expert's
 * gradient summed over the ETP group once per step (rank r holds the
 * complete gradient of its I/ETP slice for the group's rows, zeros
 * elsewhere: exact), so every ETP rank holds the complete gradients of its
 * expert-DP replica.  Collective over etp. */
par_status PAR_FN(par_reduce_etp_grads)(PAR_FN(par_model) *M, par_comm *etp);

#endif
