/* parallel/cp_hook.c - the context-parallel attention hook (see
 * parallel/cp_hook.h, docs/parallel.md). */
#include "parallel/cp_hook.h"

#include <string.h>

#include "core/alloc.h"

struct PAR_FN(par_cp_hook_s) {
    par_comm *c;
    int64_t cp;
    int nb, n_slots;
    PAR_FN(par_cp_attn_saved) *sv; /* [n_slots, nb] the last forward of each (slot, block) */
    par_cp_traffic tr;
};

/* The saved state of (x->slot, b), or NULL when the call does not fit. */
static PAR_FN(par_cp_attn_saved) *saved_of(PAR_FN(par_cp_hook) *h, const par_mbctx *x, int b, int64_t T)
{
    if (!x || x->slot < 0 || x->slot >= h->n_slots || b < 0 || b >= h->nb || !x->pos_rows || x->S % h->cp != 0 ||
        T != x->rows * (x->S / h->cp))
        return NULL;
    return &h->sv[(size_t)x->slot * (size_t)h->nb + (size_t)b];
}

static par_status attn_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) *sv = saved_of(h, x, b, T);
    if (!sv)
        return par_err(PAR_EINVAL, "cp attention: block %d on %lld tokens does not fit the hook (%d blocks, %d slots, "
                       "CP %lld)", b, (long long)T, h->nb, h->n_slots, (long long)h->cp);
    PAR_FN(par_cp_attn_saved_free)(sv);
    return PAR_FN(par_cp_attn_forward)(y, sv, sel, xin, x->pos_rows, W, &M->adims[b], x->rows, x->S / h->cp, h->c,
                                       &h->tr);
}

static par_status attn_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx,
                           par_real *dsink, const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) *sv = saved_of(h, x, b, T);
    (void)M;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "cp attention backward: block %d has no forward on %lld tokens", b, (long long)T);
    return PAR_FN(par_cp_attn_backward_input)(dx, dsink, dy, sv, W, h->c, &h->tr);
}

static par_status attn_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) *sv = saved_of(h, x, b, T);
    (void)M;
    if (!sv)
        return par_err(PAR_EINVAL, "cp attention weights: block %d has no forward on %lld tokens", b, (long long)T);
    par_status s = PAR_FN(par_cp_attn_backward_weights)(dW, dy, sv, W);
    PAR_FN(par_cp_attn_saved_free)(sv); /* the microbatch's backward is done: freed now, not at the next forward */
    return s;
}

par_status PAR_FN(par_cp_hook_create)(PAR_FN(par_cp_hook) **out, par_comm *cp, const PAR_FN(par_model) *M,
                                      int n_slots)
{
    *out = NULL;
    if (!cp || n_slots < 1)
        return par_err(PAR_EINVAL, "context parallelism: a hook needs a CP group and at least one slot (got %d)",
                       n_slots);
    PAR_FN(par_cp_hook) *h = par_calloc(1, sizeof *h, PAR_TAG_MODEL);
    if (!h)
        return par_err(PAR_ENOMEM, "context parallelism: out of memory");
    h->c = cp;
    h->cp = par_comm_size(cp);
    h->nb = M->n_blocks;
    h->n_slots = n_slots;
    h->sv = par_calloc((size_t)n_slots * (size_t)(h->nb > 0 ? h->nb : 1), sizeof *h->sv, PAR_TAG_ACT);
    if (!h->sv) {
        par_free(h);
        return par_err(PAR_ENOMEM, "context parallelism: out of memory for %d x %d saved states", n_slots, h->nb);
    }
    *out = h;
    return PAR_OK;
}

void PAR_FN(par_cp_hook_install)(PAR_FN(par_cp_hook) *h, PAR_FN(par_model) *M)
{
    M->attn.fwd = attn_fwd;
    M->attn.bwd = attn_bwd;
    M->attn.wgt = attn_wgt;
    M->attn.ctx = h;
}

void PAR_FN(par_cp_hook_traffic)(const PAR_FN(par_cp_hook) *h, par_cp_traffic *out)
{
    if (h)
        *out = h->tr;
    else
        memset(out, 0, sizeof *out);
}

void PAR_FN(par_cp_hook_free)(PAR_FN(par_cp_hook) *h)
{
    if (!h)
        return;
    for (int i = 0; h->sv && i < h->n_slots * h->nb; i++)
        PAR_FN(par_cp_attn_saved_free)(&h->sv[i]);
    par_free(h->sv);
    par_free(h);
}
