/* parallel/step/exec_hooks.c - the executor's hooks, chosen from a table
 * (parallel/hook/hookset.h): every hook set whose applies() says yes for
 * the layout is created and installed into the model, in the table's
 * order, and freed with the executor.  docs/parallel.md, "Hooks". */
#include <string.h>

#include "parallel/cp/cp_hook.h"
#include "parallel/cp/cptp_hook.h"
#include "parallel/moe/ep.h"
#include "parallel/moe/etp_hook.h"
#include "parallel/step/exec-impl.h"
#include "parallel/tp/tp_attn_hook.h"
#include "parallel/tp/tp_vocab_hook.h"

/* The MoE executors (EP; ETP, or the TP shared expert alone), the attention
 * executors (CP; TP x CP; TP), the vocabulary executor (TP).  At most one
 * of each model executor applies to a layout. */
static const PAR_FN(par_hookset) *const hooksets[] = {
    &PAR_FN(par_ep_hookset),      &PAR_FN(par_cp_hookset),       &PAR_FN(par_cptp_hookset),
    &PAR_FN(par_tp_attn_hookset), &PAR_FN(par_tp_vocab_hookset), &PAR_FN(par_etp_hookset)};
enum { N_HOOKSETS = sizeof hooksets / sizeof hooksets[0] };
_Static_assert(N_HOOKSETS <= PAR__EXEC_MAX_HOOKS, "exec-impl.h PAR__EXEC_MAX_HOOKS holds the table");

par_status PAR_FN(par__exec_hooks_create)(exec_t *ex, const par_hook_env *e, PAR_FN(par_model) *M)
{
    for (int i = 0; i < N_HOOKSETS; i++) {
        if (!hooksets[i]->applies(e->P->lay))
            continue;
        par_status s = hooksets[i]->create(&ex->hooks[i], e, M);
        if (s)
            return s;
    }
    return PAR_OK;
}

void PAR_FN(par__exec_hooks_step)(exec_t *ex, PAR_FN(par_model) *M, int keep)
{
    for (int i = 0; i < N_HOOKSETS; i++)
        if (ex->hooks[i] && hooksets[i]->step)
            hooksets[i]->step(ex->hooks[i], M, keep);
}

void PAR_FN(par__exec_hooks_report)(const exec_t *ex, const par_hook_report *r)
{
    for (int i = 0; ex && i < N_HOOKSETS; i++)
        if (ex->hooks[i] && hooksets[i]->report)
            hooksets[i]->report(ex->hooks[i], r);
}

void PAR_FN(par__exec_hooks_free)(exec_t *ex)
{
    for (int i = 0; i < N_HOOKSETS; i++) {
        if (ex->hooks[i])
            hooksets[i]->free(ex->hooks[i]);
        ex->hooks[i] = NULL;
    }
}
