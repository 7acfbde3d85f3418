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
 * forward per (microbatch, head) from its forward to its weight pass
 * (parallel/hook/mbstate.h).
 */
#ifndef PAR_PARALLEL_TP_TP_VOCAB_HOOK_H
#define PAR_PARALLEL_TP_TP_VOCAB_HOOK_H

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/hook/hookset.h"
#include "parallel/tp/tp.h"

/* The executor's entry (parallel/hook/hookset.h): TP > 1, installed as
 * M->vocab (sp and the PAR_TP_FAULT_* bits from the layout and the
 * executor); PAR_EINVAL naming the numbers when TP does not divide
 * vocab_size; before each step, whether its heads gather the whole logits
 * for a dump. */
extern const PAR_FN(par_hookset) PAR_FN(par_tp_vocab_hookset);

#endif
