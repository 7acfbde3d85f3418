/* model/head.c - embedding, heads (hc_head, norm, logits, CE) and the MTP
 * input projection, forward and backward (see model/model.h, MODEL.md
 * sections 2, 5 and 6). */
#include "model/model.h"

#include <string.h>

#include "kernels/offload.h"
#include "kernels/ops.h"

#include "model/model-impl.h"

/* ------------------------------------------------------------- embedding -- */

/* The executor's lookup into [T, d] scratch, copied to every stream. */
static par_status embed_by_hook(PAR_FN(par_model) *M, par_real *X0, const int32_t *tokens, int64_t T)
{
    int64_t n = M->n, d = M->d;
    par_real *h = par_malloc((size_t)(T * d + 1) * sizeof *h, PAR_TAG_ACT);
    if (!h)
        return par_err(PAR_ENOMEM, "embedding: out of memory for %lld rows", (long long)T);
    par_status s = M->vocab.embed(M->vocab.ctx, M, h, tokens, T);
    for (int64_t t = 0; t < T && !s; t++)
        for (int64_t i = 0; i < n; i++)
            memcpy(X0 + (t * n + i) * d, h + t * d, (size_t)d * sizeof(par_real));
    par_free(h);
    return s;
}

par_status PAR_FN(par_model_embed_forward)(PAR_FN(par_model) *M, par_real *X0, const int32_t *tokens,
                                           int64_t T)
{
    if (M->vocab.embed)
        return embed_by_hook(M, X0, tokens, T);
    int64_t n = M->n, d = M->d;
    const par_real *tab = P(M->tab.top.embed);
    PAR_DEV_BEGIN();
    PAR_DIN(tab, M->V * d);
    PAR_DIN(tokens, T);
    PAR_DOUT(X0, T * n * d);
    PAR_KLOOP(is_device_ptr(tab, tokens, X0))
    for (int64_t t = 0; t < T; t++) {
        const par_real *row = tab + (int64_t)tokens[t] * d;
        for (int64_t i = 0; i < n; i++)
            memcpy(X0 + (t * n + i) * d, row, (size_t)d * sizeof(par_real));
    }
    return PAR_OK;
}

par_status PAR_FN(par_model_embed_backward)(PAR_FN(par_model) *M, par_arena *ar, const par_real *dX0,
                                            const int32_t *tokens, int64_t T)
{
    int64_t n = M->n, d = M->d;
    par_arena_mark mark = par_arena_get_mark(ar);
    par_real *dh;
    AREAL(dh, T * d, 0);
    PAR_DEV_BEGIN();
    par_real *dh_d = PAR_DOUT_AS(dh, T * d);
    PAR_DIN(dX0, T * n * d);
    PAR_KLOOP(is_device_ptr(dh_d, dX0))
    for (int64_t t = 0; t < T; t++) {
        par_real *o = dh_d + t * d;
        const par_real *g = dX0 + t * n * d;
        for (int64_t c = 0; c < d; c++)
            o[c] = g[c];
        for (int64_t i = 1; i < n; i++)
            for (int64_t c = 0; c < d; c++)
                o[c] += g[i * d + c];
    }
    par_status s = PAR_OK;
    if (M->vocab.embed_bwd)
        s = M->vocab.embed_bwd(M->vocab.ctx, M, dh, tokens, T);
    else
        PAR_FN(par_embedding_backward)(G(M->tab.top.embed), dh, tokens, T, d);
    par_arena_rewind(ar, mark);
    return s;
fail_oom:
    return par_err(PAR_ENOMEM, "embedding backward: out of scratch memory (T=%lld)", (long long)T);
}

/* ------------------------------------------------------------------ head -- */

typedef struct {
    int fn, base, scale, norm;
} head_ids;

static head_ids head_params(const PAR_FN(par_model) *M, int which)
{
    head_ids h;
    if (which == 0) {
        h.fn = M->tab.top.hc_head_fn;
        h.base = M->tab.top.hc_head_base;
        h.scale = M->tab.top.hc_head_scale;
        h.norm = M->tab.top.norm;
    } else {
        const par_block_params *bp = &M->tab.blocks[M->cfg.n_layers];
        h.fn = bp->hc_head_fn;
        h.base = bp->hc_head_base;
        h.scale = bp->hc_head_scale;
        h.norm = bp->norm;
    }
    return h;
}

par_status PAR_FN(par_head_forward)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                    par_arena *ar, const par_real *X, const int32_t *target,
                                    const int32_t *sample, double *ce_sum, int64_t T)
{
    const par_config *c = &M->cfg;
    int64_t n = M->n, d = M->d, V = M->V;
    head_ids id = head_params(M, which);
    memset(h, 0, sizeof *h);
    h->T = T;
    h->X = X;
    h->target = target;
    void *buf = aalloc(ar, PAR_FN(par_hc_head_saved_bytes)(T, n), 0);
    if (!buf)
        goto fail_oom;
    PAR_FN(par_hc_head_saved_init)(&h->hs, buf, T, n);
    AREAL(h->x, T * d, 0);
    AREAL(h->xn, T * d, 0);
    AREAL(h->rstd, T, 0);
    if (!M->vocab.head || M->vocab.logits) /* the vocabulary executor holds its own (vocab-parallel) logits */
        AREAL(h->logits, T * V, 0);
    AREAL(h->lse, T, 0);
    AREAL(h->ce, T, 0);
    par_status s = PAR_FN(par_hc_head_forward)(h->x, &h->hs, X, P(id.fn), P(id.base), P(id.scale), T, n,
                                               d, c->hc_eps, c->norm_eps);
    if (s)
        return s;
    PAR_FN(par_rmsnorm_forward)(h->xn, h->rstd, h->x, P(id.norm), T, d, c->norm_eps);
    if (M->vocab.head) {
        if ((s = M->vocab.head(M->vocab.ctx, x, M, which, h->ce, h->lse, h->logits, h->xn, target, T)))
            return s;
    } else {
        PAR_FN(par_linear_forward)(h->logits, h->xn, P(M->tab.top.head), T, d, V);
        PAR_FN(par_xent_forward)(h->ce, h->lse, h->logits, target, T, V);
    }
    if (ce_sum) {
        PAR_HOST_READ(h->ce, T); /* CE sums per sample on the host, in token order */
        PAR_HOST_READ(target, T);
        PAR_HOST_READ(sample, T);
        const par_racc_view v = par_racc_lookup(ce_sum, 1); /* the bitwise mode: a term per token */
        for (int64_t t = 0; t < T; t++)
            if (target[t] >= 0 && v.acc)
                par_racc_put(v.acc, v.at + (size_t)sample[t], (double)h->ce[t]);
            else if (target[t] >= 0)
                ce_sum[sample[t]] += (double)h->ce[t];
    }
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "%s head forward: out of activation memory (T=%lld)",
                   which ? "mtp" : "main", (long long)T);
}

/* The passes of a backward (as model/block.c): B keeps what W needs, W
 * recomputes the logits' gradient (an element-wise pass: the same bits),
 * BW is one pass. */
enum { PASS_B = 1, PASS_W = 2, PASS_BW = 3 };
#define IN(p) ((pass & PASS_B) ? (p) : NULL)
#define WT(p) ((pass & PASS_W) ? (p) : NULL)

static par_status head_pass(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h, par_arena *ar, par_real *dX,
                            double scale, int pass)
{
    const par_config *c = &M->cfg;
    int64_t n = M->n, d = M->d, V = M->V, T = h->T;
    head_ids id = head_params(M, which);
    par_real *dlogits;
    if (pass & PASS_B) { /* kept for W (BW: the caller rewinds) */
        AREAL(h->dxn, T * d, 1);
        AREAL(h->dx, T * d, 1);
        h->scale = scale;
    }
    par_arena_mark mark = par_arena_get_mark(ar);
    if (M->vocab.head_bwd) { /* the executor's logits gradient: B dxn, W head.weight */
        par_status sv = M->vocab.head_bwd(M->vocab.ctx, x, M, which, IN(h->dxn), (pass & PASS_W) != 0, h->scale);
        if (sv)
            return sv;
    } else {
        AREAL(dlogits, T * V, 1);
        PAR_FN(par_xent_backward)(dlogits, h->logits, h->lse, h->target, h->scale, T, V);
        PAR_FN(par_linear_backward)(IN(h->dxn), WT(G(M->tab.top.head)), dlogits, h->xn, P(M->tab.top.head), T, d,
                                    V);
    }
    PAR_FN(par_rmsnorm_backward)(IN(h->dx), WT(G(id.norm)), h->dxn, h->x, P(id.norm), h->rstd, T, d);
    par_status s = PAR_FN(par_hc_head_backward)(IN(dX), WT(G(id.fn)), WT(G(id.base)), WT(G(id.scale)), h->dx, &h->hs,
                                                h->X, P(id.fn), P(id.base), P(id.scale), T, n, d, c->hc_eps,
                                                c->norm_eps);
    par_arena_rewind(ar, mark);
    return s;
fail_oom:
    return par_err(PAR_ENOMEM, "%s head backward: out of scratch memory (T=%lld)", which ? "mtp" : "main",
                   (long long)T);
}

par_status PAR_FN(par_head_backward_input)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                           par_arena *ar, par_real *dX, double scale)
{
    if (h->pending)
        return par_err(PAR_EINVAL, "%s head backward: its weight pass is still due", which ? "mtp" : "main");
    par_status s = head_pass(M, x, which, h, ar, dX, scale, PASS_B);
    h->pending = !s;
    return s;
}

par_status PAR_FN(par_head_backward_weights)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                             par_arena *ar)
{
    if (!h->pending)
        return par_err(PAR_EINVAL, "%s head: weight pass without its input pass", which ? "mtp" : "main");
    h->pending = 0;
    return head_pass(M, x, which, h, ar, NULL, h->scale, PASS_W);
}

par_status PAR_FN(par_head_backward)(PAR_FN(par_model) *M, const par_mbctx *x, int which, PAR_FN(par_head_act) *h,
                                     par_arena *ar, par_real *dX, double scale)
{
    par_arena_mark mark = par_arena_get_mark(ar);
    par_status s = head_pass(M, x, which, h, ar, dX, scale, PASS_BW);
    par_arena_rewind(ar, mark);
    return s;
}

/* ------------------------------------------------------------- MTP input -- */

par_status PAR_FN(par_mtp_input_forward)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a, par_arena *ar,
                                         const par_real *XL, const int32_t *ids, int64_t T)
{
    const par_config *c = &M->cfg;
    const par_block_params *bp = &M->tab.blocks[c->n_layers];
    int64_t n = M->n, d = M->d;
    par_real *hp;
    memset(a, 0, sizeof *a);
    a->T = T;
    a->XL = XL;
    a->ids = ids;
    AREAL(a->emb, T * d, 0);
    AREAL(a->en, T * d, 0);
    AREAL(a->en_rstd, T, 0);
    AREAL(a->ep, T * d, 0);
    AREAL(a->hn, T * n * d, 0);
    AREAL(a->hn_rstd, T * n, 0);
    AREAL(a->X0, T * n * d, 0);
    if (M->vocab.embed) {
        par_status s = M->vocab.embed(M->vocab.ctx, M, a->emb, ids, T);
        if (s)
            return s;
    } else {
        PAR_FN(par_embedding_forward)(a->emb, ids, P(M->tab.top.embed), T, d);
    }
    PAR_FN(par_rmsnorm_forward)(a->en, a->en_rstd, a->emb, P(bp->enorm), T, d, c->norm_eps);
    PAR_FN(par_linear_forward)(a->ep, a->en, P(bp->e_proj), T, d, d);
    PAR_FN(par_rmsnorm_forward)(a->hn, a->hn_rstd, XL, P(bp->hnorm), T * n, d, c->norm_eps);
    hp = a->X0; /* h_proj output in place, then + e_proj(e) per stream */
    PAR_FN(par_linear_forward)(hp, a->hn, P(bp->h_proj), T * n, d, d);
    PAR_DEV_BEGIN();
    par_real *X0 = PAR_DINOUT_AS(a->X0, T * n * d);
    const par_real *ep = PAR_DIN_AS(a->ep, T * d);
    PAR_KLOOP(collapse(2) is_device_ptr(X0, ep))
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++) {
            par_real *x = X0 + (t * n + i) * d;
            const par_real *e = ep + t * d;
            for (int64_t k = 0; k < d; k++)
                x[k] = e[k] + x[k];
        }
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "mtp input forward: out of activation memory (T=%lld)", (long long)T);
}

static par_status mtp_pass(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a, par_arena *ar, par_real *dXL,
                           const par_real *dX0, int pass)
{
    const par_config *c = &M->cfg;
    const par_block_params *bp = &M->tab.blocks[c->n_layers];
    int64_t n = M->n, d = M->d, T = a->T;
    if (pass & PASS_B) { /* kept for W (BW: the caller rewinds) */
        AREAL(a->dep, T * d, 0);
        AREAL(a->den, T * d, 1);
        AREAL(a->demb, T * d, 1);
        AREAL(a->dhn, T * n * d, 1);
        a->dX0 = dX0;
        PAR_DEV_BEGIN();
        par_real *dep_d = PAR_DOUT_AS(a->dep, T * d);
        const par_real *dX0_d = PAR_DIN_AS(dX0, T * n * d);
        PAR_KLOOP(is_device_ptr(dep_d, dX0_d))
        for (int64_t t = 0; t < T; t++) {
            par_real *o = dep_d + t * d;
            const par_real *g = dX0_d + t * n * d;
            for (int64_t k = 0; k < d; k++)
                o[k] = g[k];
            for (int64_t i = 1; i < n; i++)
                for (int64_t k = 0; k < d; k++)
                    o[k] += g[i * d + k];
        }
    }
    PAR_FN(par_linear_backward)(IN(a->dhn), WT(G(bp->h_proj)), a->dX0, a->hn, P(bp->h_proj), T * n, d, d);
    PAR_FN(par_rmsnorm_backward)(IN(dXL), WT(G(bp->hnorm)), a->dhn, a->XL, P(bp->hnorm), a->hn_rstd, T * n, d);
    PAR_FN(par_linear_backward)(IN(a->den), WT(G(bp->e_proj)), a->dep, a->en, P(bp->e_proj), T, d, d);
    PAR_FN(par_rmsnorm_backward)(IN(a->demb), WT(G(bp->enorm)), a->den, a->emb, P(bp->enorm), a->en_rstd, T, d);
    if ((pass & PASS_W) && M->vocab.embed_bwd)
        return M->vocab.embed_bwd(M->vocab.ctx, M, a->demb, a->ids, T);
    if (pass & PASS_W)
        PAR_FN(par_embedding_backward)(G(M->tab.top.embed), a->demb, a->ids, T, d);
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "mtp input backward: out of scratch memory (T=%lld)", (long long)T);
}

par_status PAR_FN(par_mtp_input_backward_input)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a, par_arena *ar,
                                                par_real *dXL, const par_real *dX0)
{
    if (a->pending)
        return par_err(PAR_EINVAL, "mtp input backward: its weight pass is still due");
    par_status s = mtp_pass(M, a, ar, dXL, dX0, PASS_B);
    a->pending = !s;
    return s;
}

par_status PAR_FN(par_mtp_input_backward_weights)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a)
{
    if (!a->pending)
        return par_err(PAR_EINVAL, "mtp input: weight pass without its input pass");
    a->pending = 0;
    return mtp_pass(M, a, NULL, NULL, NULL, PASS_W);
}

par_status PAR_FN(par_mtp_input_backward)(PAR_FN(par_model) *M, PAR_FN(par_mtp_act) *a, par_arena *ar,
                                          par_real *dXL, const par_real *dX0)
{
    par_arena_mark mark = par_arena_get_mark(ar);
    par_status s = mtp_pass(M, a, ar, dXL, dX0, PASS_BW);
    par_arena_rewind(ar, mark);
    return s;
}
