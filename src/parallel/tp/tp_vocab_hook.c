/* parallel/tp/tp_vocab_hook.c - the vocab-parallel embedding / head hook (see
 * parallel/tp/tp_vocab_hook.h, docs/parallel.md). */
#include "parallel/tp/tp_vocab_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/hook/mbstate.h"
#include "parallel/tp/tp_reduce.h"
#include "parallel/tp/tp_vocab.h"

/* The saved forward (par_tp_head_saved) of (microbatch, head): "block" 0
 * the main head, 1 the MTP head (parallel/hook/mbstate.h). */
typedef struct {
    par_mbstate st; /* first (par_mbstate_hook_new) */
    par_tp tp;
    int rank, P, keep;
    int64_t V, Vl, d;
    par_tp_traffic tr;
} vhook;

static void saved_drop(void *p)
{
    PAR_FN(par_tp_head_saved_free)(p);
}

/* The rank's rows of a [V, d] table of M's flat buffer `flat`: the held
 * shard itself (the model stores the table as vocab rows,
 * parallel/layout/tp_split.h), or its block of a whole table. */
static par_real *rows_of(const vhook *h, PAR_FN(par_model) *M, par_real *flat, int idx)
{
    par_real *p = PAR_FN(par_model_ptr)(M, flat, idx);
    if (p && PAR_FN(par_model_cut_of)(M, idx))
        return p;
    return p ? p + (int64_t)h->rank * h->Vl * h->d : NULL;
}

/* ids of the group's tokens: the local ones, or (sp) all of them gathered in
 * rank order into *all (freed by the caller). */
static par_status group_ids(const vhook *h, const int32_t *ids, int64_t Tx, const int32_t **out, int32_t **all)
{
    *all = NULL;
    *out = ids;
    if (!h->tp.sp)
        return PAR_OK;
    if (!(*all = par_malloc((size_t)(Tx * h->P + 1) * sizeof(int32_t), PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "vocab-parallel: out of memory for %lld token ids", (long long)(Tx * h->P));
    *out = *all;
    return PAR_FN(par_tp_reduce_gather_i32)(&h->tp, *all, ids, Tx);
}

static par_status embed_fwd(void *ctx, PAR_FN(par_model) *M, par_real *out, const int32_t *ids, int64_t Tx)
{
    vhook *h = ctx;
    const int32_t *g;
    int32_t *all;
    par_status s = group_ids(h, ids, Tx, &g, &all);
    if (!s)
        s = PAR_FN(par_tp_embed_forward)(out, g, rows_of(h, M, M->params, M->tab.top.embed), h->V, h->d,
                                         h->tp.sp ? Tx * h->P : Tx, &h->tp);
    par_free(all);
    return s;
}

static par_status embed_bwd(void *ctx, PAR_FN(par_model) *M, const par_real *dh, const int32_t *ids, int64_t Tx)
{
    vhook *h = ctx;
    const int32_t *g;
    int32_t *all;
    par_status s = group_ids(h, ids, Tx, &g, &all);
    if (!s)
        s = PAR_FN(par_tp_embed_backward)(rows_of(h, M, M->grads, M->tab.top.embed), dh, g, h->V, h->d,
                                          h->tp.sp ? Tx * h->P : Tx, &h->tp);
    par_free(all);
    return s;
}

/* A dump's logits [Tx, V] of the rank's tokens from the ranks' column
 * blocks [T, V/P] of the group's T tokens (sp: the rank's Tx = T/P of them,
 * block r of the gathered order). */
static par_status gather_logits(vhook *h, par_real *logits, const PAR_FN(par_tp_head_saved) *sv)
{
    const int64_t T = sv->T, Vl = h->Vl, n = T * Vl, Tx = sv->Tx, t0 = h->tp.sp ? h->rank * Tx : 0;
    par_real *all = par_malloc((size_t)(n * h->P + 1) * sizeof *all, PAR_TAG_ACT);
    if (!all)
        return par_err(PAR_ENOMEM, "vocab-parallel head: out of memory for the dump's logits");
    par_tp g = h->tp;
    g.sp = 0;
    par_status s = PAR_FN(par_tp_reduce_gather_tokens)(&g, all, sv->logits, T, Vl);
    for (int r = 0; r < h->P && !s; r++)
        for (int64_t t = 0; t < Tx; t++)
            memcpy(logits + t * h->V + r * Vl, all + r * n + (t0 + t) * Vl, (size_t)Vl * sizeof *all);
    par_free(all);
    return s;
}

static par_status head_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int which, par_real *ce,
                           par_real *lse, par_real *logits, const par_real *xn, const int32_t *target, int64_t Tx)
{
    vhook *h = ctx;
    PAR_FN(par_tp_head_saved) *sv;
    const int32_t *g;
    int32_t *all = NULL;
    par_status s = par_mbstate_new(&h->st, x, which, (void **)&sv);
    if (!s)
        s = group_ids(h, target, Tx, &g, &all);
    if (!s)
        s = PAR_FN(par_tp_head_forward)(ce, lse, sv, xn, rows_of(h, M, M->params, M->tab.top.head), g, h->V,
                                        h->d, h->tp.sp ? Tx * h->P : Tx, &h->tp);
    par_free(all);
    if (!s && h->keep && logits)
        s = gather_logits(h, logits, sv);
    return s;
}

/* B (dxn) and / or W (weights: head.weight's gradient, the last pass that
 * reads the saved forward: it goes). */
static par_status head_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int which, par_real *dxn,
                           int weights, double scale)
{
    vhook *h = ctx;
    PAR_FN(par_tp_head_saved) *sv = par_mbstate_get(&h->st, x, which);
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "vocab-parallel head backward: no saved forward");
    par_status s = PAR_FN(par_tp_head_backward)(dxn, weights ? rows_of(h, M, M->grads, M->tab.top.head) : NULL, sv,
                                                rows_of(h, M, M->params, M->tab.top.head), scale, &h->tp);
    if (weights)
        par_mbstate_drop(&h->st, x, which);
    return s;
}

/* ----------------------------------------------------------- the entry -- */

static int applies(const par_layout *l)
{
    return l->tp > 1; /* every TP layer under TP > 1, as Megatron-LM does */
}

/* PAR_EINVAL naming the numbers when TP does not divide vocab_size. */
static par_status create(void **out, const par_hook_env *e, PAR_FN(par_model) *M)
{
    par_comm *tp = e->P->g.g[PAR_GROUP_TP];
    par_tp g = {.comm = tp, .sp = 0};
    vhook *h;
    par_status s = PAR_FN(par_tp_vocab_check)(M->V, 0, &g);
    if (s || (s = par_mbstate_hook_new((void **)&h, sizeof *h, "vocab-parallel head", e->n_mb, 2, NULL,
                                       sizeof(PAR_FN(par_tp_head_saved)), saved_drop)))
        return s;
    h->tp = (par_tp){.comm = tp, .sp = e->P->lay->sequence_parallel, .faults = e->tp_faults, .traffic = &h->tr,
                     .bitwise = M->cfg.bitwise};
    h->rank = par_comm_rank(tp), h->P = par_comm_size(tp);
    h->V = M->V, h->Vl = M->V / h->P, h->d = M->d;
    M->vocab = (PAR_FN(par_vocab_exec)){
        .embed = embed_fwd, .embed_bwd = embed_bwd, .head = head_fwd, .head_bwd = head_bwd, .ctx = h};
    *out = h;
    return PAR_OK;
}

/* A dumped step's heads gather the whole logits; the model allocates [T,
 * V] logits only then. */
static void step(void *p, PAR_FN(par_model) *M, int keep)
{
    vhook *h = p;
    h->keep = keep;
    M->vocab.logits = keep;
}

const PAR_FN(par_hookset) PAR_FN(par_tp_vocab_hookset) = {
    .name = "vocab-parallel", .applies = applies, .create = create, .step = step, .free = par_mbstate_hook_free};
