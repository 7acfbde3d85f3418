/* parallel/tp/tp_vocab_hook.h - the vocab-parallel embedding / head hook: the
 * model's vocabulary executor (model/model.h par_vocab_exec) on a TP group
 * (templated: see kernels/real.h).  docs/parallel.md, "Tensor parallelism
 * in the step".
 *
 * Rank r runs parallel/tp/tp_vocab.h's layers on its vocabulary rows [r*V/P,
 * (r+1)*V/P) of embed.weight and head.weight, read in place from the whole
 * parameters (rows of a row-major table are one block): the embedding's
 * rows summed over the group (one rank contributes each token), the head's
 * logits of its rows only and the vocab-parallel cross-entropy (group max,
 * exp sums and the target's logit in double; no gathered logits).  The
 * gradients go into rank r's rows of M->grads (zeros elsewhere):
 * par_reduce_tp_grads (parallel/reduce/reduce.h, PAR_TPG_VOCAB) sums them over the
 * group once per step.  With `keep_logits` (a dump) the head also gathers
 * the whole logits for the dump, never for the loss.  One saved head
 * forward per head act (the call's key: the executor's slots and heads).
 */
#ifndef PAR_PARALLEL_TP_TP_VOCAB_HOOK_H
#define PAR_PARALLEL_TP_TP_VOCAB_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/tp/tp.h"

typedef struct PAR_FN(par_tp_vocab_hook_s) PAR_FN(par_tp_vocab_hook);

/* A hook over the TP group `tp` (not owned) with room for n_keys head acts;
 * sp: the ranks hold disjoint token slices (parallel/tp/tp.h); faults: the
 * PAR_TP_FAULT_* bits (0 in real runs).  PAR_EINVAL naming the numbers when
 * the group's size does not divide vocab_size. */
par_status PAR_FN(par_tp_vocab_hook_create)(PAR_FN(par_tp_vocab_hook) **out, par_comm *tp,
                                            const PAR_FN(par_model) *M, int n_keys, int sp, unsigned faults,
                                            int keep_logits);
/* Whether this step's heads gather the whole logits for a dump (NULL h: nothing). */
void PAR_FN(par_tp_vocab_hook_keep)(PAR_FN(par_tp_vocab_hook) *h, int keep_logits);
/* M->vocab = this hook (once, before the first step). */
void PAR_FN(par_tp_vocab_hook_install)(PAR_FN(par_tp_vocab_hook) *h, PAR_FN(par_model) *M);
/* Bytes this rank handed to src/comm since creation (zeros for NULL). */
void PAR_FN(par_tp_vocab_hook_traffic)(const PAR_FN(par_tp_vocab_hook) *h, par_tp_traffic *out);
void PAR_FN(par_tp_vocab_hook_free)(PAR_FN(par_tp_vocab_hook) *h); /* NULL is fine */

#endif
