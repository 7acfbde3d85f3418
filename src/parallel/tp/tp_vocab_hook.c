/* parallel/tp/tp_vocab_hook.c - the vocab-parallel embedding / head hook (see
 * parallel/tp/tp_vocab_hook.h, docs/parallel.md). */
#include "parallel/tp/tp_vocab_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/tp/tp_reduce.h"
#include "parallel/tp/tp_vocab.h"

/* One head act's saved forward. */
typedef struct {
    const void *key;
    PAR_FN(par_tp_head_saved) sv;
} head_slot;

struct PAR_FN(par_tp_vocab_hook_s) {
    par_tp tp;
    int rank, P, n_keys, keep;
    int64_t V, Vl, d;
    head_slot *hs; /* [n_keys] */
    par_tp_traffic tr;
};

typedef PAR_FN(par_tp_vocab_hook) vhook;

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

/* The saved state of `key` (a new one when it has none yet). */
static head_slot *slot_of(vhook *h, const void *key, int create)
{
    for (int i = 0; i < h->n_keys; i++)
        if (h->hs[i].key == key)
            return &h->hs[i];
    for (int i = 0; create && i < h->n_keys; i++)
        if (!h->hs[i].key) {
            h->hs[i].key = key;
            return &h->hs[i];
        }
    return NULL;
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

static par_status head_fwd(void *ctx, PAR_FN(par_model) *M, const void *key, par_real *ce, par_real *lse,
                           par_real *logits, const par_real *xn, const int32_t *target, int64_t Tx)
{
    vhook *h = ctx;
    head_slot *q = slot_of(h, key, 1);
    if (!q)
        return par_err(PAR_EINTERNAL, "vocab-parallel head: more than %d heads in flight", h->n_keys);
    const int32_t *g;
    int32_t *all;
    par_status s = group_ids(h, target, Tx, &g, &all);
    if (!s)
        s = PAR_FN(par_tp_head_forward)(ce, lse, &q->sv, xn, rows_of(h, M, M->params, M->tab.top.head), g, h->V,
                                        h->d, h->tp.sp ? Tx * h->P : Tx, &h->tp);
    par_free(all);
    if (!s && h->keep && logits)
        s = gather_logits(h, logits, &q->sv);
    return s;
}

static par_status head_bwd(void *ctx, PAR_FN(par_model) *M, const void *key, par_real *dxn, int weights,
                           double scale)
{
    vhook *h = ctx;
    head_slot *q = slot_of(h, key, 0);
    if (!q || !q->sv.buf)
        return par_err(PAR_EINVAL, "vocab-parallel head backward: no saved forward");
    return PAR_FN(par_tp_head_backward)(dxn, weights ? rows_of(h, M, M->grads, M->tab.top.head) : NULL, &q->sv,
                                        rows_of(h, M, M->params, M->tab.top.head), scale, &h->tp);
}

par_status PAR_FN(par_tp_vocab_hook_create)(PAR_FN(par_tp_vocab_hook) **out, par_comm *tp,
                                            const PAR_FN(par_model) *M, int n_keys, int sp, unsigned faults,
                                            int keep_logits)
{
    *out = NULL;
    const int P = tp ? par_comm_size(tp) : 1;
    if (!tp || n_keys < 1)
        return par_err(PAR_EINVAL, "vocab-parallel: a hook needs a TP group and at least one head (got %d)", n_keys);
    par_tp g = {.comm = tp, .sp = 0};
    par_status s = PAR_FN(par_tp_vocab_check)(M->V, 0, &g);
    if (s)
        return s;
    vhook *h = par_calloc(1, sizeof *h, PAR_TAG_MODEL);
    if (!h || !(h->hs = par_calloc((size_t)n_keys, sizeof *h->hs, PAR_TAG_ACT))) {
        par_free(h);
        return par_err(PAR_ENOMEM, "vocab-parallel: out of memory for %d heads", n_keys);
    }
    h->tp = (par_tp){.comm = tp, .sp = sp, .faults = faults, .traffic = &h->tr};
    h->rank = par_comm_rank(tp), h->P = P, h->n_keys = n_keys, h->keep = keep_logits;
    h->V = M->V, h->Vl = M->V / P, h->d = M->d;
    *out = h;
    return PAR_OK;
}

void PAR_FN(par_tp_vocab_hook_keep)(PAR_FN(par_tp_vocab_hook) *h, int keep_logits)
{
    if (h)
        h->keep = keep_logits;
}

void PAR_FN(par_tp_vocab_hook_install)(PAR_FN(par_tp_vocab_hook) *h, PAR_FN(par_model) *M)
{
    M->vocab = (PAR_FN(par_vocab_exec)){
        .embed = embed_fwd, .embed_bwd = embed_bwd, .head = head_fwd, .head_bwd = head_bwd, .ctx = h};
}

void PAR_FN(par_tp_vocab_hook_traffic)(const PAR_FN(par_tp_vocab_hook) *h, par_tp_traffic *out)
{
    if (h)
        *out = h->tr;
    else
        memset(out, 0, sizeof *out);
}

void PAR_FN(par_tp_vocab_hook_free)(PAR_FN(par_tp_vocab_hook) *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n_keys; i++)
        PAR_FN(par_tp_head_saved_free)(&h->hs[i].sv);
    par_free(h->hs);
    par_free(h);
}
