/* parallel/tp/tp_vocab.c - vocab-parallel embedding, head and cross-entropy
 * (see parallel/tp/tp_vocab.h). */
#include "parallel/tp/tp_vocab.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/pmath.h"
#include "kernels/gsum.h"
#include "kernels/ops.h"
#include "parallel/tp/tp_reduce.h"

#define LL(x) ((long long)(x))

par_status PAR_FN(par_tp_vocab_check)(int64_t V, int64_t T, const par_tp *tp)
{
    const int P = par_tp_size(tp);
    if (V < 1 || V % P != 0)
        return par_err(PAR_EINVAL,
                       "vocab-parallel embedding/head: tensor-model-parallel-size %d does not "
                       "divide vocab_size %lld", P, LL(V));
    if (tp && tp->sp && T % P != 0)
        return par_err(PAR_EINVAL,
                       "vocab-parallel embedding/head: sequence parallelism splits the %lld tokens "
                       "over %d ranks, which does not divide them", LL(T), P);
    return PAR_OK;
}

static par_status check_ids(const int32_t *ids, int64_t T, int64_t V, const char *what)
{
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V)
            return par_err(PAR_ERANGE, "vocab-parallel %s: token %lld is %d, outside [0, %lld)",
                           what, LL(t), ids[t], LL(V));
    return PAR_OK;
}

/* ------------------------------------------------------------- embedding -- */

par_status PAR_FN(par_tp_embed_forward)(par_real *h,               /* [Tx, d] */
                                        const int32_t *ids,        /* [T] */
                                        const par_real *emb,       /* [V/P, d] the shard */
                                        int64_t V, int64_t d, int64_t T, const par_tp *tp)
{
    par_status st = PAR_FN(par_tp_vocab_check)(V, T, tp);
    if (st || (st = check_ids(ids, T, V, "embedding")))
        return st;
    const int P = par_tp_size(tp), sp = tp && tp->sp;
    const int64_t Vl = V / P, v0 = par_tp_rank(tp) * Vl, Tx = sp ? T / P : T;
    par_real *hp = sp ? par_malloc((size_t)(T * d + 1) * sizeof(par_real), PAR_TAG_ACT) : h;
    if (!hp)
        return par_err(PAR_ENOMEM, "vocab-parallel embedding: %lld rows", LL(T));
    for (int64_t t = 0; t < T; t++) {
        const int64_t v = ids[t] - v0;
        if (v >= 0 && v < Vl)
            memcpy(hp + t * d, emb + v * d, (size_t)d * sizeof(par_real));
        else
            memset(hp + t * d, 0, (size_t)d * sizeof(par_real));
    }
    st = sp ? PAR_FN(par_tp_reduce_scatter_tokens)(tp, h, hp, Tx, d)
            : PAR_FN(par_tp_reduce_sum)(tp, h, (size_t)(T * d));
    if (hp != h)
        par_free(hp);
    return st;
}

par_status PAR_FN(par_tp_embed_backward)(par_real *demb,           /* [V/P, d] */
                                         const par_real *dh,       /* [Tx, d] */
                                         const int32_t *ids,       /* [T] */
                                         int64_t V, int64_t d, int64_t T, const par_tp *tp)
{
    par_status st = PAR_FN(par_tp_vocab_check)(V, T, tp);
    if (st || (st = check_ids(ids, T, V, "embedding backward")))
        return st;
    const int P = par_tp_size(tp), sp = tp && tp->sp;
    const int64_t Vl = V / P, v0 = par_tp_rank(tp) * Vl;
    par_real *full = NULL;
    if (sp) {
        if (!(full = par_malloc((size_t)(T * d + 1) * sizeof(par_real), PAR_TAG_ACT)))
            return par_err(PAR_ENOMEM, "vocab-parallel embedding backward: %lld rows", LL(T));
        if ((st = PAR_FN(par_tp_reduce_gather_tokens)(tp, full, dh, T / P, d))) {
            par_free(full);
            return st;
        }
        dh = full;
    }
    const par_racc_view acc = par_gsum_of(demb, Vl * d); /* the bitwise mode: a term per token */
    for (int64_t t = 0; t < T; t++) {
        const int64_t v = ids[t] - v0;
        if (v < 0 || v >= Vl)
            continue;
        par_real *o = demb + v * d;
        const par_real *g = dh + t * d;
        for (int64_t c = 0; acc.acc && c < d; c++)
            par_gsum_put(acc, v * d + c, (double)g[c]);
        for (int64_t c = 0; !acc.acc && c < d; c++)
            o[c] += g[c];
    }
    par_free(full);
    return PAR_OK;
}

/* ------------------------------------------------------------------ head -- */

void PAR_FN(par_tp_head_saved_free)(PAR_FN(par_tp_head_saved) *sv)
{
    if (!sv)
        return;
    par_free(sv->buf);
    memset(sv, 0, sizeof *sv);
}

static par_status head_setup(PAR_FN(par_tp_head_saved) *sv, const int32_t *target, int64_t V,
                             int64_t d, int64_t T, const par_tp *tp)
{
    par_status st = PAR_FN(par_tp_vocab_check)(V, T, tp);
    if (st)
        return st;
    const int P = par_tp_size(tp);
    sv->T = T, sv->V = V, sv->Vl = V / P, sv->d = d, sv->P = P, sv->rank = par_tp_rank(tp);
    sv->v0 = sv->rank * sv->Vl, sv->sp = tp && tp->sp, sv->Tx = sv->sp ? T / P : T;
    const size_t nr = (size_t)(T * d + T * sv->Vl + T), bytes = (nr + 1) * sizeof(par_real);
    sv->buf = par_malloc(bytes + (size_t)(T + 1) * sizeof(int32_t), PAR_TAG_ACT);
    if (!sv->buf)
        return par_err(PAR_ENOMEM, "vocab-parallel head: saved state of %zu reals", nr);
    sv->xn = sv->buf;
    sv->logits = sv->xn + T * d;
    sv->lse = sv->logits + T * sv->Vl;
    sv->target = (int32_t *)(void *)((char *)sv->buf + bytes);
    memcpy(sv->target, target, (size_t)T * sizeof(int32_t));
    return PAR_OK;
}

static int chained(const par_tp *tp)
{
    return tp && tp->bitwise && par_tp_size(tp) > 1;
}

typedef struct {
    const PAR_FN(par_tp_head_saved) *sv;
    const double *mx;
} exp_link;

/* sum[t] continued over the rank's vocabulary in order (the serial CE's one
 * sequential sum, rank after rank: the bitwise mode). */
static void exp_add(void *ctx, double *sum)
{
    const exp_link *c = ctx;
    const int64_t Vl = c->sv->Vl;
    for (int64_t t = 0; t < c->sv->T; t++) {
        const par_real *z = c->sv->logits + t * Vl;
        double s = sum[t];
        for (int64_t v = 0; v < Vl; v++)
            s += par_pmath_exp((double)z[v] - c->mx[t]);
        sum[t] = s;
    }
}

/* The exp sums of every token over the group: the bitwise mode's chain
 * (sum [T] zeroed), or each rank's own sums, all-reduced. */
static par_status exp_sums(double *sum, const PAR_FN(par_tp_head_saved) *sv, const double *mx, const par_tp *tp)
{
    exp_link c = {sv, mx};
    if (chained(tp))
        return PAR_FN(par_tp_reduce_chain_f64)(tp, sum, (size_t)sv->T, exp_add, &c);
    exp_add(&c, sum);
    return PAR_OK;
}

/* lse and ce of every token from the rank's logits: max over the group,
 * then the exp sum and the target's logit summed over the group (double). */
static par_status vocab_ce(PAR_FN(par_tp_head_saved) *sv, par_real *ce, const par_tp *tp)
{
    const int64_t T = sv->T, Vl = sv->Vl, v0 = sv->v0;
    double *mx = par_malloc((size_t)(3 * T + 1) * sizeof(double), PAR_TAG_ACT);
    if (!mx)
        return par_err(PAR_ENOMEM, "vocab-parallel CE: %lld sums", LL(T));
    double *sum = mx + T, *zy = sum + T;
    for (int64_t t = 0; t < T; t++) {
        const par_real *z = sv->logits + t * Vl;
        double m = -INFINITY;
        for (int64_t v = 0; v < Vl; v++)
            if ((double)z[v] > m)
                m = z[v];
        mx[t] = m;
    }
    par_status st = PAR_FN(par_tp_reduce_max_f64)(tp, mx, (size_t)T);
    for (int64_t t = 0; t < T && !st; t++) {
        const int64_t y = sv->target[t] - v0;
        sum[t] = 0;
        zy[t] = y >= 0 && y < Vl ? (double)sv->logits[t * Vl + y] : 0.0;
    }
    if (!st)
        st = exp_sums(sum, sv, mx, tp);
    if (!st) /* the bitwise mode: the target's logit alone (one rank's, the others' 0: exact) */
        st = chained(tp) ? PAR_FN(par_tp_reduce_sum_f64)(tp, zy, (size_t)T)
                         : PAR_FN(par_tp_reduce_sum_f64)(tp, sum, (size_t)(2 * T));
    if (!st && tp && (tp->faults & PAR_TP_FAULT_CE_LOG_TP)) /* the bug: reduced twice */
        st = PAR_FN(par_tp_reduce_sum_f64)(tp, sum, (size_t)T);
    for (int64_t t = 0; t < T && !st; t++) {
        const double l = mx[t] + par_pmath_log(sum[t]);
        const int32_t y = sv->target[t];
        sv->lse[t] = (par_real)l;
        ce[t] = y < 0 ? (par_real)0 : y >= sv->V ? (par_real)NAN : (par_real)(l - zy[t]);
    }
    par_free(mx);
    return st;
}

par_status PAR_FN(par_tp_head_forward)(par_real *ce,               /* [Tx] */
                                       par_real *lse_out,          /* [Tx] or NULL */
                                       PAR_FN(par_tp_head_saved) *saved,
                                       const par_real *xn,         /* [Tx, d] */
                                       const par_real *head,       /* [V/P, d] the shard */
                                       const int32_t *target,      /* [T], -1 = none */
                                       int64_t V, int64_t d, int64_t T, const par_tp *tp)
{
    PAR_FN(par_tp_head_saved) sv;
    memset(&sv, 0, sizeof sv);
    par_real *ce_all = NULL;
    par_status st = head_setup(&sv, target, V, d, T, tp);
    if (st)
        goto fail_free_saved;
    if (sv.sp)
        st = PAR_FN(par_tp_reduce_gather_tokens)(tp, sv.xn, xn, sv.Tx, d);
    else
        memcpy(sv.xn, xn, (size_t)(T * d) * sizeof(par_real));
    if (st)
        goto fail_free_saved;
    PAR_FN(par_linear_forward)(sv.logits, sv.xn, head, T, d, sv.Vl);
    if (!(ce_all = par_malloc((size_t)(T + 1) * sizeof(par_real), PAR_TAG_ACT))) {
        st = par_err(PAR_ENOMEM, "vocab-parallel head: %lld losses", LL(T));
        goto fail_free_saved;
    }
    if ((st = vocab_ce(&sv, ce_all, tp)))
        goto fail_free_saved;
    const int64_t x0 = sv.sp ? sv.rank * sv.Tx : 0;
    memcpy(ce, ce_all + x0, (size_t)sv.Tx * sizeof(par_real));
    if (lse_out)
        memcpy(lse_out, sv.lse + x0, (size_t)sv.Tx * sizeof(par_real));
    par_free(ce_all);
    PAR_FN(par_tp_head_saved_free)(saved);
    *saved = sv;
    return PAR_OK;

fail_free_saved:
    par_free(ce_all);
    PAR_FN(par_tp_head_saved_free)(&sv);
    return st;
}

/* dz += scale (softmax - onehot) on the rank's columns (par_xent_backward's
 * formula; the onehot only on the target's owner). */
static void xent_backward_cols(par_real *dz, const PAR_FN(par_tp_head_saved) *sv, double scale)
{
    const int64_t Vl = sv->Vl;
    for (int64_t t = 0; t < sv->T; t++) {
        const int32_t y = sv->target[t];
        if (y < 0 || y >= sv->V)
            continue;
        const par_real *z = sv->logits + t * Vl;
        par_real *g = dz + t * Vl;
        const double l = sv->lse[t];
        for (int64_t v = 0; v < Vl; v++) {
            double p = par_pmath_exp((double)z[v] - l);
            g[v] += (par_real)(scale * (sv->v0 + v == y ? p - 1.0 : p));
        }
    }
}

par_status PAR_FN(par_tp_head_backward)(par_real *dxn,             /* [Tx, d] or NULL */
                                        par_real *dhead,           /* [V/P, d] or NULL */
                                        const PAR_FN(par_tp_head_saved) *saved,
                                        const par_real *head,      /* [V/P, d] */
                                        double scale, const par_tp *tp)
{
    const PAR_FN(par_tp_head_saved) *sv = saved;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "vocab-parallel head backward: no saved forward");
    const int64_t T = sv->T, d = sv->d, Tx = sv->Tx;
    const size_t n = (size_t)(T * sv->Vl + T * d + Tx * d);
    par_real *buf = par_calloc(n + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "vocab-parallel head backward: scratch of %zu reals", n);
    par_real *dz = buf, *dxs = dz + T * sv->Vl, *mine = dxs + T * d;
    xent_backward_cols(dz, sv, scale);
    par_status st = PAR_OK;
    if (chained(tp)) { /* dx = dz head over the whole vocabulary: one chain over the ranks' rows */
        PAR_FN(par_linear_backward)(NULL, dhead, dz, sv->xn, head, T, d, sv->Vl);
        if (dxn && !(st = PAR_FN(par_tp_reduce_linear_din)(tp, dxs, dz, sv->xn, head, T, d, sv->Vl))) {
            const par_real *src = dxs + (sv->sp ? (int64_t)sv->rank * Tx * d : 0);
            for (int64_t e = 0; e < Tx * d; e++)
                dxn[e] += src[e];
        }
        par_free(buf);
        return st;
    }
    PAR_FN(par_linear_backward)(dxn ? dxs : NULL, dhead, dz, sv->xn, head, T, d, sv->Vl);
    if (dxn) {
        st = sv->sp ? PAR_FN(par_tp_reduce_scatter_tokens)(tp, mine, dxs, Tx, d)
                    : PAR_FN(par_tp_reduce_sum)(tp, dxs, (size_t)(T * d));
        const par_real *src = sv->sp ? mine : dxs;
        for (int64_t e = 0; e < Tx * d && !st; e++)
            dxn[e] += src[e];
    }
    par_free(buf);
    return st;
}
