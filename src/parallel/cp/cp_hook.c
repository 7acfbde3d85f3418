/* parallel/cp/cp_hook.c - the context-parallel attention hook (see
 * parallel/cp/cp_hook.h, docs/parallel.md). */
#include "parallel/cp/cp_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/hook/mbstate.h"

/* The saved forwards (par_cp_attn_saved) of (microbatch, held block), from
 * the forward to the weight pass (parallel/hook/mbstate.h). */
struct PAR_FN(par_cp_hook_s) {
    par_mbstate st; /* first (par_mbstate_hook_new) */
    par_comm *c;
    int64_t cp;
    par_cp_traffic tr;
};

static void saved_drop(void *p)
{
    PAR_FN(par_cp_attn_saved_free)(p);
}

/* 1 when the call's tokens fit the hook. */
static int fits(const PAR_FN(par_cp_hook) *h, const par_mbctx *x, int64_t T)
{
    return x && x->pos_rows && x->S % h->cp == 0 && T == x->rows * (x->S / h->cp);
}

static par_status attn_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) *sv;
    if (!fits(h, x, T))
        return par_err(PAR_EINVAL, "cp attention: block %d on %lld tokens does not fit the hook (CP %lld)", b,
                       (long long)T, (long long)h->cp);
    par_status s = par_mbstate_new(&h->st, x, b, (void **)&sv);
    if (!s)
        s = PAR_FN(par_cp_attn_forward)(y, sv, sel, xin, x->pos_rows, W, &M->adims[b], x->rows, x->S / h->cp, h->c,
                                        &h->tr);
    if (s)
        par_mbstate_drop(&h->st, x, b);
    return s;
}

static par_status attn_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx,
                           par_real *dsink, const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) *sv = fits(h, x, T) ? par_mbstate_get(&h->st, x, b) : NULL;
    (void)M;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "cp attention backward: block %d has no forward on %lld tokens", b, (long long)T);
    return PAR_FN(par_cp_attn_backward_input)(dx, dsink, dy, sv, W, h->c, &h->tr);
}

/* W: the weight gradients; the microbatch's backward of the block is done:
 * its state goes now, not at the next forward. */
static par_status attn_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) *sv = fits(h, x, T) ? par_mbstate_get(&h->st, x, b) : NULL;
    (void)M;
    if (!sv)
        return par_err(PAR_EINVAL, "cp attention weights: block %d has no forward on %lld tokens", b, (long long)T);
    par_status s = PAR_FN(par_cp_attn_backward_weights)(dW, dy, sv, W);
    par_mbstate_drop(&h->st, x, b);
    return s;
}

par_status PAR_FN(par_cp_hook_create)(PAR_FN(par_cp_hook) **out, par_comm *cp, const PAR_FN(par_model) *M, int n_mb)
{
    *out = NULL;
    if (!cp)
        return par_err(PAR_EINVAL, "context parallelism: a hook needs a CP group");
    uint8_t *held = par_malloc((size_t)(M->n_blocks > 0 ? M->n_blocks : 1), PAR_TAG_MODEL);
    for (int b = 0; held && b < M->n_blocks; b++) /* state for the blocks whose attention is held only */
        held[b] = (uint8_t)PAR_FN(par_model_holds)(M, M->tab.blocks[b].wkv);
    PAR_FN(par_cp_hook) *h;
    par_status s = held ? par_mbstate_hook_new((void **)&h, sizeof *h, "cp attention", n_mb, M->n_blocks, held,
                                               sizeof(PAR_FN(par_cp_attn_saved)), saved_drop)
                        : par_err(PAR_ENOMEM, "context parallelism: out of memory");
    par_free(held);
    if (s)
        return s;
    h->c = cp;
    h->cp = par_comm_size(cp);
    *out = h;
    return PAR_OK;
}

void PAR_FN(par_cp_hook_free)(PAR_FN(par_cp_hook) *h)
{
    par_mbstate_hook_free(h);
}

/* ----------------------------------------------------------- the entry -- */

static int applies(const par_layout *l)
{
    return l->cp > 1 && l->tp <= 1; /* TP x CP: parallel/cp/cptp_hook.c */
}

static par_status create(void **out, const par_hook_env *e, PAR_FN(par_model) *M)
{
    PAR_FN(par_cp_hook) *h;
    par_status s = PAR_FN(par_cp_hook_create)(&h, e->P->g.g[PAR_GROUP_CP], M, e->n_mb);
    if (s)
        return s;
    M->attn = (PAR_FN(par_attn_exec)){.fwd = attn_fwd, .bwd = attn_bwd, .wgt = attn_wgt, .ctx = h};
    *out = h;
    return PAR_OK;
}

static void report(const void *h, const par_hook_report *r)
{
    const PAR_FN(par_cp_hook) *c = h;
    if (r->cp)
        *r->cp = c->tr;
}

const PAR_FN(par_hookset) PAR_FN(par_cp_hookset) = {
    .name = "cp attention", .applies = applies, .create = create, .report = report, .free = par_mbstate_hook_free};
