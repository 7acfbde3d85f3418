/* parallel/step/exec_hooks.c - the executor's hooks, chosen from a table
 * (parallel/hook/hookset.h): every hook set whose applies() says yes for
 * the layout is created and installed into the model, in the table's
 * order, and freed with the executor.  docs/parallel.md, "Hooks". */
#include <string.h>

#include "core/device.h"

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

/* GPU mode (docs/gpu.md "The parallel layer on the device path"): a hook is
 * the parallel layer's host code (packing, transports, halos) around its
 * kernels, so it runs in host mode: M's executors are wrappers that switch
 * the rank to host mode around the installed hook (ex->dev_*). */
#define HOSTED(call)                                                                      \
    do {                                                                                  \
        int mode_ = par_dev_mode_set(PAR_DEV_MODE_HOST);                                  \
        par_status s_ = (call);                                                           \
        par_dev_mode_set(mode_);                                                          \
        return s_;                                                                        \
    } while (0)

static par_status attn_fwd(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_attn.fwd(ex->dev_attn.ctx, x, M, b, y, sel, xin, W, T));
}

static par_status attn_bwd(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx, par_real *dsink,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_attn.bwd(ex->dev_attn.ctx, x, M, b, dx, dsink, dy, W, T));
}

static par_status attn_wgt(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_attn.wgt(ex->dev_attn.ctx, x, M, b, dW, dy, W, T));
}

static par_status moe_fwd(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, const par_real *xin,
                          const int32_t *idx, const par_real *w, const int32_t *tokens, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_moe.fwd(ex->dev_moe.ctx, x, M, b, y, xin, idx, w, tokens, T));
}

static par_status moe_bwd(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx, par_real *dw,
                          const par_real *dy, const par_real *xin, const par_real *w, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_moe.bwd(ex->dev_moe.ctx, x, M, b, dx, dw, dy, xin, w, T));
}

static par_status moe_wgt(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int b, const par_real *dy,
                          const par_real *xin, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_moe.wgt(ex->dev_moe.ctx, x, M, b, dy, xin, T));
}

static par_status vocab_embed(void *c, PAR_FN(par_model) *M, par_real *h, const int32_t *ids, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_vocab.embed(ex->dev_vocab.ctx, M, h, ids, T));
}

static par_status vocab_embed_bwd(void *c, PAR_FN(par_model) *M, const par_real *dh, const int32_t *ids, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_vocab.embed_bwd(ex->dev_vocab.ctx, M, dh, ids, T));
}

static par_status vocab_head(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int which, par_real *ce,
                             par_real *lse, par_real *logits, const par_real *xn, const int32_t *target, int64_t T)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_vocab.head(ex->dev_vocab.ctx, x, M, which, ce, lse, logits, xn, target, T));
}

static par_status vocab_head_bwd(void *c, const par_mbctx *x, PAR_FN(par_model) *M, int which, par_real *dxn,
                                 int weights, double scale)
{
    const exec_t *ex = c;
    HOSTED(ex->dev_vocab.head_bwd(ex->dev_vocab.ctx, x, M, which, dxn, weights, scale));
}

/* Each installed executor behind its host-mode wrapper (GPU mode only). */
static void wrap_hosted(exec_t *ex, PAR_FN(par_model) *M)
{
    if (M->attn.fwd) {
        ex->dev_attn = M->attn;
        M->attn = (PAR_FN(par_attn_exec)){.fwd = attn_fwd, .bwd = attn_bwd, .wgt = attn_wgt, .ctx = ex};
    }
    if (M->moe.fwd) {
        ex->dev_moe = M->moe;
        M->moe = (PAR_FN(par_moe_exec)){.fwd = moe_fwd, .bwd = moe_bwd, .wgt = moe_wgt, .ctx = ex};
    }
    if (M->vocab.embed || M->vocab.head) {
        ex->dev_vocab = M->vocab;
        M->vocab.embed = ex->dev_vocab.embed ? vocab_embed : NULL;
        M->vocab.embed_bwd = ex->dev_vocab.embed_bwd ? vocab_embed_bwd : NULL;
        M->vocab.head = ex->dev_vocab.head ? vocab_head : NULL;
        M->vocab.head_bwd = ex->dev_vocab.head_bwd ? vocab_head_bwd : NULL;
        M->vocab.ctx = ex;
    }
}

par_status PAR_FN(par__exec_hooks_create)(exec_t *ex, const par_hook_env *e, PAR_FN(par_model) *M)
{
    for (int i = 0; i < N_HOOKSETS; i++) {
        if (!hooksets[i]->applies(e->P->lay))
            continue;
        par_status s = hooksets[i]->create(&ex->hooks[i], e, M);
        if (s)
            return s;
    }
    if (par_dev_gpu())
        wrap_hosted(ex, M);
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
