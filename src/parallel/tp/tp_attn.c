/* parallel/tp/tp_attn.c - tensor-parallel V4 attention (see parallel/tp/tp_attn.h
 * and docs/parallel.md, "Tensor parallelism").
 *
 * The kernels' phase functions run unchanged on a rank's shard with the
 * shard's dims (dl: H/P heads, G/P groups, iH/P index heads); the layer adds
 * the three places where heads meet: the indexer's score sum (a chain in
 * head order), the row-parallel output sum and the input gradient sum.
 */
#include "parallel/tp/tp_attn.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/racc.h"
#include "kernels/ops.h"
#include "parallel/tp/tp_reduce.h"
#include "parallel/layout/tp_split.h"

#define LL(x) ((long long)(x))

/* ------------------------------------------------------------------------ */
/* the 18 weight fields: names (for the cut, parallel/layout/tp_split.h), shapes     */

enum { NFIELD = 18, FIRST_INDEXER_FIELD = 12 };

static const char *const field_name[NFIELD] = {
    "attn.wq_a.weight",         "attn.q_norm.weight",
    "attn.wq_b.weight",         "attn.wkv.weight",
    "attn.kv_norm.weight",      "attn.wo_a.weight",
    "attn.wo_b.weight",         "attn.attn_sink",
    "attn.compressor.wkv.weight", "attn.compressor.wgate.weight",
    "attn.compressor.ape",      "attn.compressor.norm.weight",
    "attn.indexer.wq_b.weight", "attn.indexer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight", "attn.indexer.compressor.wgate.weight",
    "attn.indexer.compressor.ape", "attn.indexer.compressor.norm.weight"};

static par_real **field(PAR_FN(par_attn_weights) *W, int k)
{
    par_real **f[NFIELD] = {&W->wq_a,      &W->q_norm,    &W->wq_b,      &W->wkv,
                           &W->kv_norm,   &W->wo_a,      &W->wo_b,      &W->attn_sink,
                           &W->cmp_wkv,   &W->cmp_wgate, &W->cmp_ape,   &W->cmp_norm,
                           &W->idx_wq_b,  &W->idx_weights_proj, &W->idx_cmp_wkv,
                           &W->idx_cmp_wgate, &W->idx_cmp_ape, &W->idx_cmp_norm};
    return f[k];
}

static par_real *field_get(const PAR_FN(par_attn_weights) *W, int k)
{
    return *field((PAR_FN(par_attn_weights) *)(uintptr_t)W, k);
}

/* [rows, cols] of field k in the full layer (rows = 0: the layer has none). */
static void field_shape(const par_attn_dims *dm, int k, int64_t *rows, int64_t *cols)
{
    const int64_t coff = dm->m == 4 ? 2 : 1, HD = dm->H * dm->hd, GL = dm->o_groups * dm->o_lora;
    const int cm = dm->m > 0, ix = dm->m == 4;
    int64_t r = 0, c = 1;
    switch (k) {
    case 0: r = dm->q_lora, c = dm->d; break;
    case 1: r = dm->q_lora; break;
    case 2: r = HD, c = dm->q_lora; break;
    case 3: r = dm->hd, c = dm->d; break;
    case 4: r = dm->hd; break;
    case 5: r = GL, c = HD / dm->o_groups; break;
    case 6: r = dm->d, c = GL; break;
    case 7: r = dm->H; break;
    case 8: case 9: r = cm ? coff * dm->hd : 0, c = dm->d; break;
    case 10: r = cm ? dm->m : 0, c = coff * dm->hd; break;
    case 11: r = cm ? dm->hd : 0; break;
    case 12: r = ix ? dm->iH * dm->ihd : 0, c = dm->q_lora; break;
    case 13: r = ix ? dm->iH : 0, c = dm->d; break;
    case 14: case 15: r = ix ? 2 * dm->ihd : 0, c = dm->d; break;
    case 16: r = ix ? 4 : 0, c = 2 * dm->ihd; break;
    case 17: r = ix ? dm->ihd : 0; break;
    }
    *rows = r;
    *cols = c;
}

static par_tp_cut field_cut(int k)
{
    return par_tp_split_of(field_name[k]).cut;
}

/* reals of field k's shard */
static int64_t shard_numel(const par_attn_dims *dm, int k, int64_t P)
{
    int64_t r, c;
    field_shape(dm, k, &r, &c);
    return r * c / (field_cut(k) == PAR_TP_REPLICATED ? 1 : P);
}

/* ------------------------------------------------------------------------ */
/* dims and shards                                                           */

par_status PAR_FN(par_tp_attn_dims)(par_attn_dims *local, const par_attn_dims *dm, int64_t P)
{
    static const char fl[] = "tensor-model-parallel-size";
    if (P < 1)
        return par_err(PAR_EINVAL, "tensor parallel attention: %s %lld must be >= 1", fl, LL(P));
    if (dm->H % P != 0)
        return par_err(PAR_EINVAL, "tensor parallel attention: %s %lld does not divide n_heads %lld "
                                   "(TP splits the query heads)", fl, LL(P), LL(dm->H));
    if (dm->o_groups % P != 0)
        return par_err(PAR_EINVAL,
                       "tensor parallel attention: %s %lld does not divide o_groups %lld (each TP "
                       "rank owns whole output groups of wo_a)", fl, LL(P), LL(dm->o_groups));
    if (dm->m == 4 && dm->iH % P != 0)
        return par_err(PAR_EINVAL,
                       "tensor parallel attention: %s %lld does not divide index_n_heads %lld (TP "
                       "splits the indexer heads)", fl, LL(P), LL(dm->iH));
    *local = *dm;
    local->H = dm->H / P;
    local->o_groups = dm->o_groups / P;
    local->iH = dm->m == 4 ? dm->iH / P : dm->iH;
    return PAR_OK;
}

int64_t PAR_FN(par_tp_attn_shard_count)(const par_attn_dims *dm, int64_t P)
{
    int64_t n = 0;
    for (int k = 0; k < NFIELD; k++)
        n += shard_numel(dm, k, P);
    return n;
}

void PAR_FN(par_tp_attn_shard)(PAR_FN(par_attn_weights) *Wl, par_real *buf,
                               const PAR_FN(par_attn_weights) *W, const par_attn_dims *dm,
                               int rank, int P)
{
    PAR_FN(par_tp_attn_shard_held)(Wl, buf, W, dm, rank, P, 0);
}

void PAR_FN(par_tp_attn_shard_held)(PAR_FN(par_attn_weights) *Wl, par_real *buf,
                                    const PAR_FN(par_attn_weights) *W, const par_attn_dims *dm,
                                    int rank, int P, int held)
{
    memset(Wl, 0, sizeof *Wl);
    int64_t off = 0;
    for (int k = 0; k < NFIELD; k++) {
        int64_t r, c;
        field_shape(dm, k, &r, &c);
        const par_real *src = field_get(W, k);
        if (r == 0 || !src)
            continue;
        if (held) { /* the held shard (rows or wo_b's columns), or a replicated weight: W's own */
            *field(Wl, k) = (par_real *)(uintptr_t)src;
            continue;
        }
        *field(Wl, k) = buf + off;
        par_tp_slice(buf + off, src, r, c, field_cut(k), rank, P, sizeof(par_real));
        off += shard_numel(dm, k, P);
    }
}

void PAR_FN(par_tp_attn_unshard)(PAR_FN(par_attn_weights) *W, const PAR_FN(par_attn_weights) *Wl,
                                 const par_attn_dims *dm, int rank, int P)
{
    for (int k = 0; k < NFIELD; k++) {
        int64_t r, c;
        field_shape(dm, k, &r, &c);
        par_real *dst = field_get(W, k);
        const par_real *src = field_get(Wl, k);
        if (r > 0 && dst && src)
            par_tp_unslice(dst, src, r, c, field_cut(k), rank, P, sizeof(par_real));
    }
}

void PAR_FN(par_tp_attn_grads_add)(PAR_FN(par_attn_weights) *dW, const PAR_FN(par_attn_weights) *dWl,
                                   const par_attn_dims *dm, int rank, int P, par_real *scratch)
{
    PAR_FN(par_tp_attn_grads_add_held)(dW, dWl, dm, rank, P, scratch, 0);
}

void PAR_FN(par_tp_attn_grads_add_held)(PAR_FN(par_attn_weights) *dW, const PAR_FN(par_attn_weights) *dWl,
                                        const par_attn_dims *dm, int rank, int P, par_real *scratch, int held)
{
    for (int k = 0; k < NFIELD; k++) {
        int64_t r, c;
        field_shape(dm, k, &r, &c);
        par_real *dst = field_get(dW, k);
        const par_real *src = field_get(dWl, k);
        if (r == 0 || !dst || !src)
            continue;
        const int64_t n = shard_numel(dm, k, P);
        if (held) { /* dst is the held shard (or whole): the same adds in place */
            for (int64_t e = 0; e < n; e++)
                dst[e] += src[e];
            continue;
        }
        par_tp_slice(scratch, dst, r, c, field_cut(k), rank, P, sizeof(par_real));
        for (int64_t e = 0; e < n; e++)
            scratch[e] += src[e];
        par_tp_unslice(dst, scratch, r, c, field_cut(k), rank, P, sizeof(par_real));
    }
}

void PAR_FN(par_tp_attn_saved_free)(PAR_FN(par_tp_attn_saved) *sv)
{
    if (!sv)
        return;
    par_free(sv->buf);
    par_free(sv->x);
    par_free(sv->pos);
    memset(sv, 0, sizeof *sv);
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */

static par_status check_pos(const int32_t *pos, int64_t T)
{
    for (int64_t t = 0; t < T; t++) {
        int32_t want = t > 0 ? pos[t - 1] + 1 : 0;
        if (pos[t] != 0 && pos[t] != want)
            return par_err(PAR_EINVAL,
                           "tensor parallel attention: pos[%lld] = %d must be 0 (sample start) or "
                           "pos[t-1]+1 = %d", LL(t), pos[t], want);
    }
    return PAR_OK;
}

/* Checks, local dims, allocation of the saved state (x and pos copied or
 * gathered in by the caller). */
static par_status setup(PAR_FN(par_tp_attn_saved) *sv, const par_attn_dims *dm, int64_t T,
                        const int32_t *pos, const par_tp *tp)
{
    const int P = par_tp_size(tp), sp = tp ? tp->sp : 0;
    par_status st = PAR_FN(par_attn_check_dims)(dm);
    if (st || (st = PAR_FN(par_tp_attn_dims)(&sv->dl, dm, P)) || (st = check_pos(pos, T)))
        return st;
    if (sp && T % P != 0)
        return par_err(PAR_EINVAL,
                       "tensor parallel attention: sequence parallelism splits the %lld tokens "
                       "over %d ranks, which does not divide them", LL(T), P);
    sv->dm = *dm, sv->T = T, sv->Tx = sp ? T / P : T;
    sv->rank = par_tp_rank(tp), sv->P = P, sv->sp = sp;
    size_t sb = PAR_FN(par_attn_saved_bytes)(&sv->dl, T);
    sv->buf = par_calloc(1, sb ? sb : 1, PAR_TAG_ACT);
    sv->x = par_malloc((size_t)(T * dm->d + 1) * sizeof(par_real), PAR_TAG_ACT);
    sv->pos = par_malloc((size_t)(T + 1) * sizeof(int32_t), PAR_TAG_ACT);
    if (!sv->buf || !sv->x || !sv->pos)
        return par_err(PAR_ENOMEM, "tensor parallel attention: saved state of %zu bytes", sb);
    PAR_FN(par_attn_saved_carve)(&sv->s, sv->buf, &sv->dl, T);
    memcpy(sv->pos, pos, (size_t)T * sizeof(int32_t));
    return PAR_OK;
}

/* Phases 1 and 2 on all T tokens with the rank's heads; the indexer head
 * weights are recomputed with the layer's scale index_n_heads^-0.5 (the
 * kernel scales by the shard's head count). */
static void project(PAR_FN(par_tp_attn_saved) *sv, const PAR_FN(par_attn_weights) *W)
{
    const par_attn_dims *dm = &sv->dm, *dl = &sv->dl;
    PAR_FN(par_attn_saved) *s = &sv->s;
    const int64_t T = sv->T;
    PAR_FN(par_attn_proj_forward)(s, sv->x, sv->pos, W, dl, T);
    if (dm->m == 4) {
        PAR_FN(par_linear_forward)(s->iw, sv->x, W->idx_weights_proj, T, dm->d, dl->iH);
        const par_real sc = (par_real)(1.0 / sqrt((double)dm->ihd) / sqrt((double)dm->iH));
        for (int64_t e = 0; e < T * dl->iH; e++)
            s->iw[e] *= sc;
    }
    if (dm->m > 0)
        PAR_FN(par_compress_forward)(s->cmp, s->cmp_raw, s->cmp_rstd, s->ca, s->cz, sv->pos,
                                     W->cmp_norm, dm->rope, 0, T, dm->hd, dm->m, dm->norm_eps);
    if (dm->m == 4)
        PAR_FN(par_compress_forward)(s->icmp, s->icmp_raw, s->icmp_rstd, s->ica, s->icz, sv->pos,
                                     W->idx_cmp_norm, dm->rope, 0, T, dm->ihd, 4, dm->norm_eps);
}

typedef struct {
    const PAR_FN(par_tp_attn_saved) *sv;
    int64_t nv;
} chain_ctx;

static void add_my_heads(void *ctx, par_real *acc)
{
    const chain_ctx *c = ctx;
    const PAR_FN(par_tp_attn_saved) *sv = c->sv;
    PAR_FN(par_indexer_scores)(acc, c->nv, sv->s.iq, sv->s.iw, sv->s.icmp, sv->pos, &sv->dl, 0,
                               sv->T);
}

/* The indexer: scores of all heads chained in head order (bitwise the
 * serial sums), top-k on the last rank, picks broadcast. */
static par_status select_entries(PAR_FN(par_tp_attn_saved) *sv, const par_tp *tp)
{
    const int64_t T = sv->T, nv = PAR_FN(par_indexer_max_visible)(sv->pos, 0, T);
    const size_t n = (size_t)(T * nv);
    par_real *acc = par_calloc(n + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!acc)
        return par_err(PAR_ENOMEM, "tensor parallel attention: %zu indexer scores", n);
    chain_ctx c = {sv, nv};
    par_status st = PAR_FN(par_tp_reduce_chain)(tp, acc, n, add_my_heads, &c);
    if (!st && sv->rank == sv->P - 1)
        st = PAR_FN(par_indexer_topk)(sv->s.sel, acc, nv, sv->pos, &sv->dm, 0, T);
    if (!st)
        st = PAR_FN(par_tp_reduce_bcast_i32)(tp, sv->s.sel, (size_t)(T * sv->dm.topk), sv->P - 1);
    par_free(acc);
    return st;
}

/* The bitwise mode's row-parallel output (docs/bitwise.md): y [T, d] on
 * every rank = r wo_b^T as the serial GEMM's one chain over the groups,
 * continued rank after rank. */
static par_status out_chain(par_real *y, PAR_FN(par_tp_attn_saved) *sv, const PAR_FN(par_attn_weights) *Wl,
                            const par_tp *tp)
{
    const par_attn_dims *dl = &sv->dl;
    const int64_t T = sv->T, d = dl->d, K = dl->o_groups * dl->o_lora;
    PAR_FN(par_attn_out_groups)(sv->s.r, sv->s.o, Wl->wo_a, dl, T);
    return PAR_FN(par_tp_reduce_linear_forward)(tp, y, sv->s.r, Wl->wo_b, T, K, d);
}

par_status PAR_FN(par_tp_attn_forward)(par_real *y,                 /* [Tx, d] */
                                       PAR_FN(par_tp_attn_saved) *saved,
                                       int32_t *selected,           /* [Tx, topk] or NULL */
                                       const par_real *x,           /* [Tx, d] */
                                       const int32_t *pos,          /* [T] */
                                       const PAR_FN(par_attn_weights) *Wl,
                                       const par_attn_dims *dm, int64_t T, const par_tp *tp)
{
    PAR_FN(par_tp_attn_saved) sv;
    memset(&sv, 0, sizeof sv);
    par_real *yp = NULL;
    par_status st = setup(&sv, dm, T, pos, tp);
    if (st)
        goto fail_free_saved;
    const int64_t d = dm->d, Tx = sv.Tx;
    if (sv.sp)
        st = PAR_FN(par_tp_reduce_gather_tokens)(tp, sv.x, x, Tx, d);
    else
        memcpy(sv.x, x, (size_t)(T * d) * sizeof(par_real));
    if (st)
        goto fail_free_saved;
    project(&sv, Wl);
    if (dm->m == 4 && (st = select_entries(&sv, tp)))
        goto fail_free_saved;
    if ((st = PAR_FN(par_attn_core_forward)(sv.s.o, sv.s.lse, sv.s.q, sv.s.kv, sv.s.cmp, sv.s.sel,
                                            sv.pos, Wl->attn_sink, &sv.dl, 0, T)))
        goto fail_free_saved;
    /* row-parallel output: the rank's groups, then the group sum */
    yp = sv.sp ? par_malloc((size_t)(T * d) * sizeof(par_real), PAR_TAG_ACT) : y;
    if (!yp) {
        st = par_err(PAR_ENOMEM, "tensor parallel attention: partial output of %lld reals",
                     LL(T * d));
        goto fail_free_saved;
    }
    if (dm->bitwise) {
        st = out_chain(yp, &sv, Wl, tp);
        if (!st && sv.sp)
            memcpy(y, yp + (int64_t)sv.rank * Tx * d, (size_t)(Tx * d) * sizeof(par_real));
    } else {
        PAR_FN(par_attn_out_forward)(yp, sv.s.r, sv.s.o, Wl->wo_a, Wl->wo_b, &sv.dl, T);
        st = sv.sp ? PAR_FN(par_tp_reduce_scatter_tokens)(tp, y, yp, Tx, d)
                   : PAR_FN(par_tp_reduce_sum)(tp, y, (size_t)(T * d));
    }
    if (st)
        goto fail_free_saved;
    if (selected && dm->m == 4)
        memcpy(selected, sv.s.sel + (sv.sp ? sv.rank * Tx : 0) * dm->topk,
               (size_t)(Tx * dm->topk) * sizeof(int32_t));
    if (yp != y)
        par_free(yp);
    PAR_FN(par_tp_attn_saved_free)(saved);
    *saved = sv;
    return PAR_OK;

fail_free_saved:
    if (yp != y)
        par_free(yp);
    PAR_FN(par_tp_attn_saved_free)(&sv);
    return st;
}

/* ------------------------------------------------------------------------ */
/* backward                                                                  */

/* Scratch of one backward, in dl's sizes over all T tokens. */
typedef struct {
    par_real *dO, *dop, *dq, *Dd, *dkv, *dcmp, *dca, *dcz, *dxs, *dyf;
    void *buf;
} bwd_scratch;

static par_status scratch_alloc(bwd_scratch *b, const PAR_FN(par_tp_attn_saved) *sv)
{
    const par_attn_dims *dl = &sv->dl;
    const int64_t T = sv->T, HD = dl->H * dl->hd, hd = dl->hd, d = dl->d;
    const int64_t nc = dl->m > 0 ? (dl->m == 4 ? 2 : 1) * hd : 0;
    const int64_t dyn = sv->sp ? T * d : 0;
    size_t n = (size_t)(3 * T * HD + T * dl->H + 2 * T * hd + 2 * T * nc + T * d + dyn);
    memset(b, 0, sizeof *b);
    b->buf = par_calloc(n + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!b->buf)
        return par_err(PAR_ENOMEM, "tensor parallel attention backward: scratch of %zu reals", n);
    b->dO = b->buf;
    b->dop = b->dO + T * HD;
    b->dq = b->dop + T * HD;
    b->Dd = b->dq + T * HD;
    b->dkv = b->Dd + T * dl->H;
    b->dcmp = b->dkv + T * hd;
    b->dca = b->dcmp + T * hd;
    b->dcz = b->dca + T * nc;
    b->dxs = b->dcz + T * nc;
    b->dyf = sv->sp ? b->dxs + T * d : NULL;
    return PAR_OK;
}

/* The serial backward's phases on the shard: sharded weights complete,
 * replicated ones and dxs this rank's share. */
static par_status shard_backward(bwd_scratch *b, PAR_FN(par_attn_weights) *dW, const par_real *dy,
                                 const PAR_FN(par_tp_attn_saved) *sv,
                                 const PAR_FN(par_attn_weights) *W)
{
    const par_attn_dims *dl = &sv->dl;
    const PAR_FN(par_attn_saved) *s = &sv->s;
    const int64_t T = sv->T, m = dl->m;
    par_status st;
    if ((st = PAR_FN(par_attn_out_backward)(b->dO, dW->wo_a, dW->wo_b, dy, s->r, s->o, W->wo_a,
                                            W->wo_b, dl, T)))
        return st;
    if ((st = PAR_FN(par_attn_core_backward_q)(b->dq, dW->attn_sink, b->dop, b->Dd, b->dO, s->lse,
                                               s->q, s->kv, s->cmp, s->sel, sv->pos, W->attn_sink,
                                               dl, 0, T)))
        return st;
    PAR_FN(par_attn_core_backward_kv)(b->dkv, m > 0 ? b->dcmp : NULL, b->dop, b->Dd, s->lse, s->q,
                                      s->kv, s->cmp, s->sel, sv->pos, dl, 0, T, T);
    if (m > 0 && (st = PAR_FN(par_compress_backward)(b->dca, b->dcz, dW->cmp_norm, b->dcmp,
                                                     s->cmp_raw, s->cmp_rstd, s->ca, s->cz,
                                                     sv->pos, W->cmp_norm, dl->rope, 0, T, dl->hd,
                                                     m)))
        return st;
    return PAR_FN(par_attn_proj_backward)(b->dxs, dW, b->dq, b->dkv, m > 0 ? b->dca : NULL,
                                          m > 0 ? b->dcz : NULL, s, sv->x, sv->pos, W, dl, T);
}

/* ---- the bitwise mode (docs/bitwise.md "Tensor parallelism") ----------- */

/* The entries' gradient as (query, head) terms of the rank's heads, merged
 * over the group exactly (the reduction module merges accumulators): dcmp
 * complete on every rank. */
static par_status entries_merged(bwd_scratch *b, const PAR_FN(par_tp_attn_saved) *sv, const par_tp *tp)
{
    const PAR_FN(par_attn_saved) *s = &sv->s;
    const size_t n = (size_t)(sv->T * sv->dl.hd);
    par_racc acc = {0};
    par_status st = par_racc_init(&acc, n);
    if (st)
        return st;
    if ((st = par_racc_register(b->dcmp, n, sizeof(par_real), &acc))) {
        par_racc_free(&acc);
        return st;
    }
    PAR_FN(par_attn_core_backward_kv)(NULL, b->dcmp, b->dop, b->Dd, s->lse, s->q, s->kv, s->cmp, s->sel, sv->pos,
                                      &sv->dl, 0, sv->T, sv->T);
    st = PAR_FN(par_tp_reduce_sum)(tp, b->dcmp, n); /* merged and rounded into dcmp */
    par_racc_unregister(b->dcmp);
    for (size_t i = 0; !st && par_tp_size(tp) == 1 && i < n; i++)
        b->dcmp[i] = (par_real)par_racc_value(&acc, i);
    par_racc_free(&acc);
    return st;
}

typedef struct {
    bwd_scratch *b;
    const PAR_FN(par_tp_attn_saved) *sv;
} keys_link;

static void keys_add(void *ctx, par_real *dkv)
{
    const keys_link *k = ctx;
    const PAR_FN(par_attn_saved) *s = &k->sv->s;
    PAR_FN(par_attn_core_backward_kv)(dkv, NULL, k->b->dop, k->b->Dd, s->lse, s->q, s->kv, s->cmp, s->sel,
                                      k->sv->pos, &k->sv->dl, 0, k->sv->T, k->sv->T);
}

/* The window keys' gradient: the kernel's head-outer order (the bitwise
 * mode's) continued over the ranks' heads in rank order, then broadcast. */
static par_status keys_chained(bwd_scratch *b, const PAR_FN(par_tp_attn_saved) *sv, const par_tp *tp)
{
    keys_link k = {b, sv};
    const size_t n = (size_t)(sv->T * sv->dl.hd);
    return PAR_FN(par_tp_reduce_chain_bcast)(tp, b->dkv, n, keys_add, &k);
}

/* dqr = dqb wq_b over all heads: the serial GEMM's chain continued over the
 * ranks' heads (wq_b's gradient: the rank's rows, as terms). */
static par_status dqr_chained(par_real *dqr, bwd_scratch *b, PAR_FN(par_attn_weights) *dW,
                              const PAR_FN(par_tp_attn_saved) *sv, const PAR_FN(par_attn_weights) *W,
                              const par_tp *tp)
{
    const par_attn_dims *dl = &sv->dl;
    const int64_t T = sv->T, ql = dl->q_lora, K = dl->H * dl->hd;
    par_real *dqb = b->dO;
    memset(dqb, 0, (size_t)(T * K) * sizeof *dqb); /* dO is spent */
    PAR_FN(par_attn_proj_backward_dqb)(dqb, b->dq, &sv->s, sv->pos, dl, T);
    PAR_FN(par_linear_backward)(NULL, dW->wq_b, dqb, sv->s.qr, W->wq_b, T, ql, K);
    return PAR_FN(par_tp_reduce_linear_din)(tp, dqr, dqb, sv->s.qr, W->wq_b, T, ql, K);
}

/* The layer's backward in the bitwise mode: every sum over heads is the
 * serial one (a chain in rank order, or order-free terms), so dx and the
 * replicated weights' gradients are complete and the same on every rank
 * (dxf [T, d]: += them; the TP gradient sum leaves the replicated ones
 * alone, parallel/reduce/reduce.c). */
static par_status backward_bitwise(bwd_scratch *b, par_real *dxf, PAR_FN(par_attn_weights) *dW, const par_real *dy,
                                   const PAR_FN(par_tp_attn_saved) *sv, const PAR_FN(par_attn_weights) *W,
                                   const par_tp *tp)
{
    const par_attn_dims *dl = &sv->dl;
    const PAR_FN(par_attn_saved) *s = &sv->s;
    const int64_t T = sv->T, m = dl->m;
    par_real *dqr = NULL;
    par_status st;
    if ((st = PAR_FN(par_attn_out_backward)(b->dO, dW->wo_a, dW->wo_b, dy, s->r, s->o, W->wo_a, W->wo_b, dl, T)) ||
        (st = PAR_FN(par_attn_core_backward_q)(b->dq, dW->attn_sink, b->dop, b->Dd, b->dO, s->lse, s->q, s->kv,
                                               s->cmp, s->sel, sv->pos, W->attn_sink, dl, 0, T)) ||
        (m > 0 && (st = entries_merged(b, sv, tp))) || (st = keys_chained(b, sv, tp)))
        return st;
    if (m > 0 && (st = PAR_FN(par_compress_backward)(b->dca, b->dcz, dW->cmp_norm, b->dcmp, s->cmp_raw, s->cmp_rstd,
                                                     s->ca, s->cz, sv->pos, W->cmp_norm, dl->rope, 0, T, dl->hd, m)))
        return st;
    if (!(dqr = par_calloc((size_t)(T * dl->q_lora + 1), sizeof *dqr, PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "tensor parallel attention backward: %lld query gradients", LL(T * dl->q_lora));
    if (!(st = dqr_chained(dqr, b, dW, sv, W, tp)))
        st = PAR_FN(par_attn_proj_backward_rest)(dxf, dW, dqr, b->dkv, m > 0 ? b->dca : NULL, m > 0 ? b->dcz : NULL,
                                                 s, sv->x, sv->pos, W, dl, T);
    par_free(dqr);
    return st;
}

par_status PAR_FN(par_tp_attn_backward)(par_real *dx,                /* [Tx, d] or NULL */
                                        PAR_FN(par_attn_weights) *dWl, /* or NULL */
                                        const par_real *dy,          /* [Tx, d] */
                                        const PAR_FN(par_tp_attn_saved) *saved,
                                        const PAR_FN(par_attn_weights) *Wl, const par_tp *tp)
{
    const PAR_FN(par_tp_attn_saved) *sv = saved;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "tensor parallel attention backward: no saved forward");
    if (par_tp_size(tp) != sv->P || par_tp_rank(tp) != sv->rank)
        return par_err(PAR_EMISMATCH,
                       "tensor parallel attention backward: group has rank %d of %d, the forward "
                       "ran as rank %d of %d", par_tp_rank(tp), par_tp_size(tp), sv->rank, sv->P);
    PAR_FN(par_attn_weights) none;
    memset(&none, 0, sizeof none);
    PAR_FN(par_attn_weights) *dW = dWl ? dWl : &none;
    const int64_t T = sv->T, Tx = sv->Tx, d = sv->dm.d;
    bwd_scratch b;
    par_status st = scratch_alloc(&b, sv);
    if (st)
        return st;
    const par_real *dyf = dy;
    if (sv->sp) {
        if ((st = PAR_FN(par_tp_reduce_gather_tokens)(tp, b.dyf, dy, Tx, d)))
            goto free_scratch;
        dyf = b.dyf;
    }
    if (sv->dm.bitwise) {
        if (!dWl) {
            st = par_err(PAR_EINVAL, "tensor parallel attention backward (bitwise mode): no gradients");
            goto free_scratch;
        }
        par_real *dxf = sv->sp ? b.dxs : dx; /* b.dxs: zeroed */
        if ((st = backward_bitwise(&b, dx ? dxf : NULL, dW, dyf, sv, Wl, tp)) || !dx || !sv->sp)
            goto free_scratch;
        for (int64_t e = 0; e < Tx * d; e++)
            dx[e] += b.dxs[(int64_t)sv->rank * Tx * d + e];
        goto free_scratch;
    }
    if ((st = shard_backward(&b, dW, dyf, sv, Wl)) || !dx)
        goto free_scratch;
    /* the input gradient over the group: own share of every head's path */
    if (sv->sp) {
        par_real *mine = b.dyf; /* dy no longer needed: reuse for the scattered rows */
        if ((st = PAR_FN(par_tp_reduce_scatter_tokens)(tp, mine, b.dxs, Tx, d)))
            goto free_scratch;
        for (int64_t e = 0; e < Tx * d; e++)
            dx[e] += mine[e];
    } else {
        if ((st = PAR_FN(par_tp_reduce_sum)(tp, b.dxs, (size_t)(T * d))))
            goto free_scratch;
        for (int64_t e = 0; e < T * d; e++)
            dx[e] += b.dxs[e];
    }
free_scratch:
    par_free(b.buf);
    return st;
}

/* Replicated fields with a gradient: every one outside the indexer (wkv
 * skipped under the deliberate fault). */
static int reduced_field(int k, const par_tp *tp)
{
    if (k == 3 && (tp->faults & PAR_TP_FAULT_WKV_NO_REDUCE))
        return 0;
    return k < FIRST_INDEXER_FIELD && field_cut(k) == PAR_TP_REPLICATED;
}

/* Copies the reduced fields between dW and the packed buf (to_buf selects
 * the direction); returns the reals packed. */
static int64_t pack_replicated(par_real *buf, PAR_FN(par_attn_weights) *dW,
                               const par_attn_dims *dm, const par_tp *tp, int to_buf)
{
    int64_t off = 0;
    for (int k = 0; k < NFIELD; k++) {
        par_real *g = field_get(dW, k);
        if (!reduced_field(k, tp) || !g)
            continue;
        const int64_t c = shard_numel(dm, k, 1);
        if (buf)
            memcpy(to_buf ? buf + off : g, to_buf ? g : buf + off, (size_t)c * sizeof(par_real));
        off += c;
    }
    return off;
}

par_status PAR_FN(par_tp_attn_reduce_grads)(PAR_FN(par_attn_weights) *dWl,
                                            const par_attn_dims *dm, const par_tp *tp)
{
    if (!dWl || par_tp_size(tp) == 1)
        return PAR_OK;
    const int64_t n = pack_replicated(NULL, dWl, dm, tp, 1);
    par_real *buf = par_malloc((size_t)(n + 1) * sizeof(par_real), PAR_TAG_COMM);
    if (!buf)
        return par_err(PAR_ENOMEM, "tensor parallel attention: %lld replicated gradients", LL(n));
    pack_replicated(buf, dWl, dm, tp, 1);
    par_status st = PAR_FN(par_tp_reduce_sum)(tp, buf, (size_t)n);
    if (!st)
        pack_replicated(buf, dWl, dm, tp, 0);
    par_free(buf);
    return st;
}

/* ------------------------------------------------- a hook's local shard -- */

/* The gradient shard (after Wl's copy unless held) and the add's scratch
 * (NULL when held: par_tp_attn_grads_add_held adds in place). */
static par_real *local_dwl(const PAR_FN(par_tp_attn_local) *L)
{
    return L->buf + (L->held ? 0 : L->shard);
}

static par_real *local_scratch(const PAR_FN(par_tp_attn_local) *L)
{
    return L->held ? NULL : L->buf + 2 * L->shard;
}

par_status PAR_FN(par_tp_attn_local_make)(PAR_FN(par_tp_attn_local) *L, const PAR_FN(par_attn_weights) *W,
                                          const par_attn_dims *dm, int rank, int P, int held, const char *who)
{
    memset(L, 0, sizeof *L);
    L->shard = PAR_FN(par_tp_attn_shard_count)(dm, P);
    L->rank = rank, L->P = P, L->held = held; /* held: the weights read in place, the gradients added in place */
    if (!(L->buf = par_malloc((size_t)((held ? 1 : 3) * L->shard + 1) * sizeof(par_real), PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "%s: out of memory for a shard of %lld reals", who, (long long)L->shard);
    PAR_FN(par_tp_attn_shard_held)(&L->Wl, L->buf, W, dm, rank, P, held);
    if (!dm->bitwise)
        return PAR_OK;
    par_status st = held ? par_racc_init(&L->acc, (size_t)L->shard)
                         : par_err(PAR_EUNSUPPORTED, "%s: the bitwise mode needs the model to hold its TP shards", who);
    if (!st && (st = par_racc_register(local_dwl(L), (size_t)L->shard, sizeof(par_real), &L->acc)))
        par_racc_free(&L->acc);
    if (st)
        PAR_FN(par_tp_attn_local_free)(L);
    return st;
}

/* The bitwise mode: the accumulator of each field of g (the gradient shard)
 * merged into the model's behind the same field of dW (held: the same
 * shape), exactly; returns 0 when the mode is off. */
static int local_merge(const PAR_FN(par_attn_weights) *dW, const PAR_FN(par_attn_weights) *g, const par_attn_dims *dm,
                       int P)
{
    if (!dm->bitwise)
        return 0;
    for (int k = 0; k < NFIELD; k++) {
        const par_real *dst = field_get(dW, k), *src = field_get(g, k);
        const int64_t n = shard_numel(dm, k, P);
        if (n == 0 || !dst || !src)
            continue;
        const par_racc_view vd = par_racc_lookup(dst, (size_t)n), vs = par_racc_lookup(src, (size_t)n);
        if (vd.acc && vs.acc)
            par_racc_merge_at(vd.acc, vd.at, vs.acc, vs.at, (size_t)n);
    }
    return 1;
}

void PAR_FN(par_tp_attn_local_zero)(PAR_FN(par_tp_attn_local) *L, const PAR_FN(par_attn_weights) *W,
                                    const par_attn_dims *dm)
{
    PAR_FN(par_tp_attn_shard)(&L->dWl, local_dwl(L), W, dm, L->rank, L->P);
    memset(local_dwl(L), 0, (size_t)L->shard * sizeof(par_real));
    if (L->acc.e)
        par_racc_zero(&L->acc, 0, (size_t)L->shard);
}

void PAR_FN(par_tp_attn_local_add_sink)(PAR_FN(par_tp_attn_local) *L, par_real *dsink, const par_attn_dims *dm)
{
    if (!dsink)
        return;
    PAR_FN(par_attn_weights) sink, only = {.attn_sink = L->dWl.attn_sink};
    memset(&sink, 0, sizeof sink);
    sink.attn_sink = dsink;
    if (!local_merge(&sink, &only, dm, L->P))
        PAR_FN(par_tp_attn_grads_add_held)(&sink, &only, dm, L->rank, L->P, local_scratch(L), L->held);
}

void PAR_FN(par_tp_attn_local_add)(PAR_FN(par_tp_attn_local) *L, const PAR_FN(par_attn_weights) *dW,
                                   const PAR_FN(par_attn_weights) *g, const par_attn_dims *dm)
{
    PAR_FN(par_attn_weights) d = *dW;
    d.attn_sink = NULL; /* the input pass's */
    if (!local_merge(&d, g, dm, L->P))
        PAR_FN(par_tp_attn_grads_add_held)(&d, g, dm, L->rank, L->P, local_scratch(L), L->held);
}

void PAR_FN(par_tp_attn_local_free)(PAR_FN(par_tp_attn_local) *L)
{
    if (L->acc.e) {
        par_racc_unregister(local_dwl(L));
        par_racc_free(&L->acc);
    }
    par_free(L->buf);
    memset(L, 0, sizeof *L);
}

/* ------------------------------------------- SP over several rows (hooks) -- */

par_status PAR_FN(par_tp_attn_sp_gather)(PAR_FN(par_tp_attn_sp) *g, const par_tp *tsp, int P, const par_real *xin,
                                         int64_t rows, int64_t W, int64_t d, int64_t k, int want_sel,
                                         const char *who)
{
    const int64_t T = rows * W;
    *g = (PAR_FN(par_tp_attn_sp)){.rows = rows, .W = W, .d = d, .k = k};
    g->x = par_malloc((size_t)(2 * T * d + 1) * sizeof *g->x, PAR_TAG_ACT);
    g->sel = want_sel ? par_malloc((size_t)(T * k + 1) * sizeof *g->sel, PAR_TAG_ACT) : NULL;
    if (!g->x || (want_sel && !g->sel))
        return par_err(PAR_ENOMEM, "%s (sp): out of memory for %lld tokens", who, (long long)T);
    g->y = g->x + T * d;
    return PAR_FN(par_tp_reduce_gather_cols)(tsp, P, g->x, xin, rows, W, d, who);
}

void PAR_FN(par_tp_attn_sp_take)(const PAR_FN(par_tp_attn_sp) *g, par_real *y, int32_t *sel, int r, int P)
{
    PAR_FN(par_tp_reduce_take_cols)(y, g->y, g->rows, g->W, g->d, sizeof *g->y, r, P);
    if (sel)
        PAR_FN(par_tp_reduce_take_cols)(sel, g->sel, g->rows, g->W, g->k, sizeof *g->sel, r, P);
}

void PAR_FN(par_tp_attn_sp_free)(PAR_FN(par_tp_attn_sp) *g)
{
    par_free(g->x);
    par_free(g->sel);
    memset(g, 0, sizeof *g);
}

void PAR_FN(par_tp_attn_sp_add_dx)(par_real *dx, par_real *mine, const par_real *dxf, int64_t rows, int64_t W,
                                   int64_t d, int r, int P)
{
    PAR_FN(par_tp_reduce_take_cols)(mine, dxf, rows, W, d, sizeof *mine, r, P);
    for (int64_t e = 0; e < rows * W / P * d; e++)
        dx[e] += mine[e];
}
