/* parallel/cp/cp_hook.c - the context-parallel attention hook (see
 * parallel/cp/cp_hook.h, docs/parallel.md). */
#include "parallel/cp/cp_hook.h"

#include <string.h>

#include "core/alloc.h"

/* The saved forwards are allocated by the forward and freed by the weight
 * pass: a rank holds the states of the microbatches in flight through its
 * blocks, and the table itself is one pointer per (slot, held block). */
struct PAR_FN(par_cp_hook_s) {
    par_comm *c;
    int64_t cp;
    int nb, n_rows, n_slots;
    int *row;                       /* [nb] block b's row of sv, -1: not held here */
    PAR_FN(par_cp_attn_saved) **sv; /* [n_slots, n_rows] the forward of (slot, block) in flight, or NULL */
    par_cp_traffic tr;
};

/* The slot of the saved state of (x->slot, b), or NULL when the call does
 * not fit. */
static PAR_FN(par_cp_attn_saved) **saved_of(PAR_FN(par_cp_hook) *h, const par_mbctx *x, int b, int64_t T)
{
    if (!x || x->slot < 0 || x->slot >= h->n_slots || b < 0 || b >= h->nb || h->row[b] < 0 || !x->pos_rows ||
        x->S % h->cp != 0 || T != x->rows * (x->S / h->cp))
        return NULL;
    return &h->sv[(size_t)x->slot * (size_t)h->n_rows + (size_t)h->row[b]];
}

static void saved_drop(PAR_FN(par_cp_attn_saved) **sv)
{
    PAR_FN(par_cp_attn_saved_free)(*sv);
    par_free(*sv);
    *sv = NULL;
}

static par_status attn_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y, int32_t *sel,
                           const par_real *xin, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) **sv = saved_of(h, x, b, T);
    if (!sv)
        return par_err(PAR_EINVAL, "cp attention: block %d on %lld tokens does not fit the hook (%d blocks, %d held, "
                       "%d slots, CP %lld)", b, (long long)T, h->nb, h->n_rows, h->n_slots, (long long)h->cp);
    if (*sv) /* a forward again without its weight pass (a failed step): the old state goes */
        saved_drop(sv);
    if (!(*sv = par_calloc(1, sizeof **sv, PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "cp attention: block %d: out of memory for its saved state", b);
    par_status s = PAR_FN(par_cp_attn_forward)(y, *sv, sel, xin, x->pos_rows, W, &M->adims[b], x->rows,
                                               x->S / h->cp, h->c, &h->tr);
    if (s)
        saved_drop(sv);
    return s;
}

static par_status attn_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx,
                           par_real *dsink, const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) **sv = saved_of(h, x, b, T);
    (void)M;
    if (!sv || !*sv || !(*sv)->buf)
        return par_err(PAR_EINVAL, "cp attention backward: block %d has no forward on %lld tokens", b, (long long)T);
    return PAR_FN(par_cp_attn_backward_input)(dx, dsink, dy, *sv, W, h->c, &h->tr);
}

static par_status attn_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, PAR_FN(par_attn_weights) *dW,
                           const par_real *dy, const PAR_FN(par_attn_weights) *W, int64_t T)
{
    PAR_FN(par_cp_hook) *h = ctx;
    PAR_FN(par_cp_attn_saved) **sv = saved_of(h, x, b, T);
    (void)M;
    if (!sv || !*sv)
        return par_err(PAR_EINVAL, "cp attention weights: block %d has no forward on %lld tokens", b, (long long)T);
    par_status s = PAR_FN(par_cp_attn_backward_weights)(dW, dy, *sv, W);
    saved_drop(sv); /* the microbatch's backward is done: freed now, not at the next forward */
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
    h->row = par_malloc((size_t)(h->nb > 0 ? h->nb : 1) * sizeof *h->row, PAR_TAG_MODEL);
    for (int b = 0; h->row && b < h->nb; b++) /* rows for the blocks whose attention is held only */
        h->row[b] = PAR_FN(par_model_holds)(M, M->tab.blocks[b].wkv) ? h->n_rows++ : -1;
    h->sv = h->row ? par_calloc((size_t)n_slots * (size_t)(h->n_rows > 0 ? h->n_rows : 1), sizeof *h->sv,
                                PAR_TAG_MODEL)
                   : NULL;
    if (!h->sv) {
        par_status s = par_err(PAR_ENOMEM, "context parallelism: out of memory for %d x %d saved states", n_slots,
                               h->nb);
        PAR_FN(par_cp_hook_free)(h);
        return s;
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
    for (int i = 0; h->sv && i < h->n_slots * h->n_rows; i++)
        saved_drop(&h->sv[i]);
    par_free(h->sv);
    par_free(h->row);
    par_free(h);
}
