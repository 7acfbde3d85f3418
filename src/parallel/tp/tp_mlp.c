/* parallel/tp/tp_mlp.c - the tensor-parallel SwiGLU MLP (see parallel/tp/tp_mlp.h). */
#include "parallel/tp/tp_mlp.h"

#include <string.h>

#include "core/alloc.h"
#include "kernels/ops.h"
#include "kernels/moe.h"
#include "parallel/tp/tp_reduce.h"
#include "parallel/layout/tp_split.h"

#define LL(x) ((long long)(x))

void PAR_FN(par_tp_mlp_saved_free)(PAR_FN(par_tp_mlp_saved) *sv)
{
    if (!sv)
        return;
    par_free(sv->buf);
    memset(sv, 0, sizeof *sv);
}

static par_status setup(PAR_FN(par_tp_mlp_saved) *sv, int64_t T, int64_t d, int64_t I, double L,
                        const par_tp *tp)
{
    const int P = par_tp_size(tp), sp = tp ? tp->sp : 0;
    if (T < 0 || d < 1 || I < 1 || I % P != 0)
        return par_err(PAR_EINVAL,
                       "tensor parallel MLP: the group size %d must divide moe_inter_dim %lld "
                       "(T %lld, d %lld)", P, LL(I), LL(T), LL(d));
    if (sp && T % P != 0)
        return par_err(PAR_EINVAL,
                       "tensor parallel MLP: sequence parallelism splits the %lld tokens over %d "
                       "ranks, which does not divide them", LL(T), P);
    sv->T = T, sv->Tx = sp ? T / P : T, sv->d = d, sv->Il = I / P;
    sv->rank = par_tp_rank(tp), sv->P = P, sv->sp = sp, sv->L = L;
    const size_t n = (size_t)(T * d + 3 * T * sv->Il);
    sv->buf = par_malloc((n + 1) * sizeof(par_real), PAR_TAG_ACT);
    if (!sv->buf)
        return par_err(PAR_ENOMEM, "tensor parallel MLP: saved state of %zu reals", n);
    sv->x = sv->buf;
    sv->g = sv->x + T * d;
    sv->u = sv->g + T * sv->Il;
    sv->h = sv->u + T * sv->Il;
    return PAR_OK;
}

static int chained(const par_tp *tp)
{
    return tp && tp->bitwise && par_tp_size(tp) > 1;
}

/* The bitwise mode's forward: the hidden units of the rank's columns, then
 * y [T, d] (every rank) = h w2^T as the serial GEMM's one chain over the
 * hidden units, continued rank after rank. */
static par_status forward_chained(par_real *y, PAR_FN(par_tp_mlp_saved) *sv, const par_real *w1,
                                  const par_real *w2, const par_real *w3, const par_tp *tp)
{
    const int64_t T = sv->T, d = sv->d, Il = sv->Il;
    PAR_FN(par_linear_forward)(sv->g, sv->x, w1, T, d, Il);
    PAR_FN(par_linear_forward)(sv->u, sv->x, w3, T, d, Il);
    PAR_FN(par_swiglu_forward)(sv->h, sv->g, sv->u, NULL, T, Il, sv->L);
    return PAR_FN(par_tp_reduce_linear_forward)(tp, y, sv->h, w2, T, Il, d);
}

par_status PAR_FN(par_tp_mlp_forward)(par_real *y,              /* [Tx, d] */
                                      PAR_FN(par_tp_mlp_saved) *saved,
                                      const par_real *x,        /* [Tx, d] */
                                      const par_real *w1,       /* [I/P, d] */
                                      const par_real *w2,       /* [d, I/P] */
                                      const par_real *w3,       /* [I/P, d] */
                                      int64_t T, int64_t d, int64_t I, double L, const par_tp *tp)
{
    PAR_FN(par_tp_mlp_saved) sv;
    memset(&sv, 0, sizeof sv);
    par_real *yp = NULL;
    par_status st = setup(&sv, T, d, I, L, tp);
    if (st)
        goto fail_free_saved;
    if (sv.sp)
        st = PAR_FN(par_tp_reduce_gather_tokens)(tp, sv.x, x, sv.Tx, d);
    else
        memcpy(sv.x, x, (size_t)(T * d) * sizeof(par_real));
    if (st)
        goto fail_free_saved;
    yp = sv.sp ? par_malloc((size_t)(T * d + 1) * sizeof(par_real), PAR_TAG_ACT) : y;
    if (!yp) {
        st = par_err(PAR_ENOMEM, "tensor parallel MLP: partial output of %lld reals", LL(T * d));
        goto fail_free_saved;
    }
    if (chained(tp)) {
        if (!(st = forward_chained(yp, &sv, w1, w2, w3, tp)) && sv.sp)
            memcpy(y, yp + (int64_t)sv.rank * sv.Tx * d, (size_t)(sv.Tx * d) * sizeof(par_real));
    } else if (PAR_FN(par_moe_expert_forward)(yp, sv.g, sv.u, sv.h, sv.x, NULL, w1, w2, w3, T, d, sv.Il, L),
               tp && (tp->faults & PAR_TP_FAULT_SHARED_NO_REDUCE)) { /* the deliberate bug: y keeps the rank's share */
        if (sv.sp)
            memcpy(y, yp + (int64_t)sv.rank * sv.Tx * d, (size_t)(sv.Tx * d) * sizeof(par_real));
    } else
        st = sv.sp ? PAR_FN(par_tp_reduce_scatter_tokens)(tp, y, yp, sv.Tx, d)
                   : PAR_FN(par_tp_reduce_sum)(tp, y, (size_t)(T * d));
    if (st)
        goto fail_free_saved;
    if (yp != y)
        par_free(yp);
    PAR_FN(par_tp_mlp_saved_free)(saved);
    *saved = sv;
    return PAR_OK;

fail_free_saved:
    if (yp != y)
        par_free(yp);
    PAR_FN(par_tp_mlp_saved_free)(&sv);
    return st;
}

/* dxs [T, d] (zeroed) = dg w1 + du w3 over all hidden units as the serial
 * expert's two GEMMs (each a chain over the ranks' columns), in its order. */
/* The bitwise mode's backward (the serial expert's steps, the input sums
 * chained): weights as terms of the rank's columns, dxs complete. */
static par_status backward_chained(par_real *dxs, par_real *dw1, par_real *dw2, par_real *dw3, const par_real *dy,
                                   const PAR_FN(par_tp_mlp_saved) *sv, const par_real *w1, const par_real *w2,
                                   const par_real *w3, const par_tp *tp)
{
    const int64_t T = sv->T, d = sv->d, Il = sv->Il;
    if (dw2)
        PAR_FN(par_linear_backward)(NULL, dw2, dy, sv->h, w2, T, Il, d);
    par_real *dh = par_calloc((size_t)(3 * T * Il + 1), sizeof *dh, PAR_TAG_ACT);
    if (!dh)
        return par_err(PAR_ENOMEM, "tensor parallel MLP backward: 3 x %lld x %lld", LL(T), LL(Il));
    par_real *dg = dh + T * Il, *du = dg + T * Il;
    PAR_FN(par_linear_backward)(dh, NULL, dy, sv->h, w2, T, Il, d);
    PAR_FN(par_swiglu_backward)(dg, du, NULL, dh, sv->g, sv->u, NULL, T, Il, sv->L);
    PAR_FN(par_linear_backward)(NULL, dw1, dg, sv->x, w1, T, d, Il);
    PAR_FN(par_linear_backward)(NULL, dw3, du, sv->x, w3, T, d, Il);
    /* dxs = dg w1 + du w3 over all hidden units, the serial expert's two GEMMs in its order */
    par_status st = dxs ? PAR_FN(par_tp_reduce_linear_din)(tp, dxs, dg, sv->x, w1, T, d, Il) : PAR_OK;
    if (!st && dxs)
        st = PAR_FN(par_tp_reduce_linear_din)(tp, dxs, du, sv->x, w3, T, d, Il);
    par_free(dh);
    return st;
}

par_status PAR_FN(par_tp_mlp_backward)(par_real *dx,            /* [Tx, d] or NULL */
                                       par_real *dw1,           /* [I/P, d] or NULL */
                                       par_real *dw2,           /* [d, I/P] or NULL */
                                       par_real *dw3,           /* [I/P, d] or NULL */
                                       const par_real *dy,      /* [Tx, d] */
                                       const PAR_FN(par_tp_mlp_saved) *saved,
                                       const par_real *w1, const par_real *w2, const par_real *w3,
                                       const par_tp *tp)
{
    const PAR_FN(par_tp_mlp_saved) *sv = saved;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "tensor parallel MLP backward: no saved forward");
    const int64_t T = sv->T, Tx = sv->Tx, d = sv->d;
    /* scratch: the gathered dy (sp), the partial dx [T, d] */
    const size_t n = (size_t)((sv->sp ? T * d : 0) + T * d);
    par_real *buf = par_calloc(n + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "tensor parallel MLP backward: scratch of %zu reals", n);
    par_real *dxs = buf, *dyf = sv->sp ? buf + T * d : (par_real *)(uintptr_t)dy;
    par_status st = PAR_OK;
    if (sv->sp && (st = PAR_FN(par_tp_reduce_gather_tokens)(tp, dyf, dy, Tx, d)))
        goto free_scratch;
    if (chained(tp)) {
        if ((st = backward_chained(dx ? dxs : NULL, dw1, dw2, dw3, dyf, sv, w1, w2, w3, tp)) || !dx)
            goto free_scratch;
        const par_real *mine = dxs + (sv->sp ? (int64_t)sv->rank * Tx * d : 0);
        for (int64_t e = 0; e < Tx * d; e++)
            dx[e] += mine[e];
        goto free_scratch;
    }
    if ((st = PAR_FN(par_moe_expert_backward)(dx ? dxs : NULL, dw1, dw2, dw3, NULL, dyf, sv->x, NULL,
                                              w1, w2, w3, sv->g, sv->u, sv->h, T, d, sv->Il,
                                              sv->L)) || !dx)
        goto free_scratch;
    if (sv->sp) {
        par_real *mine = dyf; /* dy no longer needed */
        if (!(st = PAR_FN(par_tp_reduce_scatter_tokens)(tp, mine, dxs, Tx, d)))
            for (int64_t e = 0; e < Tx * d; e++)
                dx[e] += mine[e];
    } else if (!(st = PAR_FN(par_tp_reduce_sum)(tp, dxs, (size_t)(T * d)))) {
        for (int64_t e = 0; e < T * d; e++)
            dx[e] += dxs[e];
    }
free_scratch:
    par_free(buf);
    return st;
}

void PAR_FN(par_tp_mlp_shard_free)(PAR_FN(par_tp_mlp_shard) *s)
{
    if (!s)
        return;
    par_free(s->buf);
    memset(s, 0, sizeof *s);
}

par_status PAR_FN(par_tp_mlp_shard_make)(PAR_FN(par_tp_mlp_shard) *s, const par_real *w1, const par_real *w2,
                                         const par_real *w3, int64_t d, int64_t I, const par_tp *tp, int held)
{
    const int P = par_tp_size(tp), r = par_tp_rank(tp);
    PAR_FN(par_tp_mlp_shard_free)(s);
    if (d < 1 || I < 1 || I % P != 0)
        return par_err(PAR_EINVAL, "tensor parallel MLP: the group size %d must divide moe_inter_dim %lld", P,
                       LL(I));
    const int64_t Il = I / P, n = d * Il;
    /* held: w2 is read in place, the buffer only collects its gradient */
    if (!(s->buf = par_calloc((size_t)((held ? 1 : 2) * n + 1), sizeof(par_real), PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "tensor parallel MLP: a shard of %lld reals", LL(n));
    par_real *w2s = s->buf;
    if (!held)
        par_tp_slice(w2s, w2, d, I, PAR_TP_COLS, r, P, sizeof(par_real));
    const int64_t off = held ? 0 : (int64_t)r * n;
    s->w1 = w1 + off, s->w2 = held ? w2 : w2s, s->w3 = w3 + off, s->dw2 = held ? w2s : w2s + n;
    s->d = d, s->I = I, s->Il = Il, s->rank = r, s->P = P, s->held = held;
    return PAR_OK;
}

void PAR_FN(par_tp_mlp_shard_grads)(PAR_FN(par_tp_mlp_shard) *s, par_real *g1, par_real *g3, par_real **o1,
                                    par_real **o3)
{
    const int64_t off = s->held ? 0 : (int64_t)s->rank * s->Il * s->d;
    *o1 = g1 ? g1 + off : NULL;
    *o3 = g3 ? g3 + off : NULL;
    memset(s->dw2, 0, (size_t)(s->d * s->Il) * sizeof(par_real));
}

void PAR_FN(par_tp_mlp_shard_add_dw2)(const PAR_FN(par_tp_mlp_shard) *s, par_real *g2 /* [d, I] or [d, I/P] */)
{
    const int64_t Il = s->Il, ld = s->held ? Il : s->I, c0 = s->held ? 0 : (int64_t)s->rank * Il;
    for (int64_t i = 0; g2 && i < s->d; i++) {
        par_real *o = g2 + i * ld + c0;
        const par_real *gi = s->dw2 + i * Il;
        for (int64_t j = 0; j < Il; j++)
            o[j] += gi[j];
    }
}

par_status PAR_FN(par_tp_mlp_backward_whole)(par_real *dx,      /* [Tx, d] or NULL */
                                             par_real *g1,      /* [I, d] or NULL */
                                             par_real *g2,      /* [d, I] or NULL */
                                             par_real *g3,      /* [I, d] or NULL */
                                             const par_real *dy, /* [Tx, d] */
                                             const PAR_FN(par_tp_mlp_saved) *saved,
                                             PAR_FN(par_tp_mlp_shard) *s, const par_tp *tp)
{
    if (!s || !s->buf)
        return par_err(PAR_EINVAL, "tensor parallel MLP backward: no shard");
    par_real *o1, *o3;
    PAR_FN(par_tp_mlp_shard_grads)(s, g1, g3, &o1, &o3);
    if (chained(tp) && s->held) /* the bitwise mode: the held shard's gradient takes its terms itself */
        return PAR_FN(par_tp_mlp_backward)(dx, o1, g2, o3, dy, saved, s->w1, s->w2, s->w3, tp);
    if (chained(tp))
        return par_err(PAR_EUNSUPPORTED, "tensor parallel MLP (bitwise mode): the model must hold its TP shards");
    par_status st = PAR_FN(par_tp_mlp_backward)(dx, o1, g2 ? s->dw2 : NULL, o3, dy, saved, s->w1, s->w2, s->w3, tp);
    if (!st)
        PAR_FN(par_tp_mlp_shard_add_dw2)(s, g2);
    return st;
}
