/* kernels/indexer.c - phase (3) of the attention layer (m == 4): indexer
 * scores and top-k selection of compressed entries (MODEL.md section 3,
 * Indexer).  No backward: no gradient flows into the indexer.
 */
#include "kernels/attention.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/quant.h"
#include "kernels/offload.h"
#include "kernels/qcast.h"
#include "kernels/recipe.h"

#ifdef _OPENMP
#include <omp.h>
#endif

PAR_DECLARE_TARGET /* qsort's comparators run on the device too */
typedef struct {
    double score;
    int32_t i;
} scored;

/* higher score first; ties: lower entry index first */
static int by_score_desc(const void *pa, const void *pb)
{
    const scored *a = pa, *b = pb;
    if (a->score > b->score)
        return -1;
    if (a->score < b->score)
        return 1;
    return (a->i > b->i) - (a->i < b->i);
}

static int by_index_asc(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* acc[i] += sum over heads h ascending of iw[t,h] relu(iq[t,h] . icmp[e_i])
 * for the visible entries i of query t, each sum continuing from acc[i] (the
 * serial layer starts at 0; a tensor-parallel shard continues the previous
 * shard's heads: the same additions in the same order). */
static void score_row(par_real *acc, int64_t t, const par_real *iq, const par_real *iw,
                      const par_real *icmp, const int32_t *pos, int64_t iH, int64_t ihd, int bf16)
{
    const int64_t m = 4;
    const int64_t s0 = t - pos[t], nvis = (pos[t] + 1) / m;
    const par_real *qt = iq + t * iH * ihd;
    for (int64_t i = 0; i < nvis; i++) {
        const par_real *k = icmp + (s0 + (i + 1) * m - 1) * ihd;
        par_real a = acc[i];
        for (int64_t h = 0; h < iH; h++) {
            par_real dot = 0;
            for (int64_t e = 0; e < ihd; e++)
                dot += qt[h * ihd + e] * k[e];
            if (bf16) /* a recipe's FP4 path: the einsum's scores are BF16 */
                dot = (par_real)par_bf16_round((double)dot);
            if (dot > 0)
                a += iw[t * iH + h] * dot;
        }
        acc[i] = a;
    }
}

/* The top K of query t's nvis scores (ties -> lower i), ascending, -1
 * padding; sc is scratch of nvis entries. */
static void topk_row(int32_t *out, scored *sc, const par_real *acc, int64_t nvis, int64_t K, int bf16)
{
    for (int64_t i = 0; i < nvis; i++) {
        sc[i].score = bf16 ? par_bf16_round((double)acc[i]) : (double)acc[i];
        sc[i].i = (int32_t)i;
    }
    int64_t nk = nvis < K ? nvis : K;
    if (nvis > K)
        qsort(sc, (size_t)nvis, sizeof(scored), by_score_desc);
    for (int64_t k = 0; k < nk; k++)
        out[k] = sc[k].i;
    if (nvis > K)
        qsort(out, (size_t)nk, sizeof(int32_t), by_index_asc);
    for (int64_t k = nk; k < K; k++)
        out[k] = -1;
}

PAR_END_DECLARE_TARGET

/* The indexer's inputs under a recipe's FP4 path (dm->fp4_index; model.py
 * Indexer.forward: rotate_activation then fp4_act_quant on q and on the
 * compressed k): q rows [t0, t1) and the k rows they read (from the
 * earliest row start t - pos[t], before 0 in a CP window) cast (kernels/qcast.h)
 * into *buf, *iq and *icmp pointed there; otherwise nothing changes.  The
 * casts are row-local (1x32 tiles inside one head's ihd), so the rows a
 * layout holds cast as the serial model's do. */
static par_status fp4_inputs(const par_real **iq, const par_real **icmp, par_real **buf, const par_attn_dims *dm,
                             const int32_t *pos, int64_t t0, int64_t t1)
{
    if (!dm->fp4_index || t1 <= t0)
        return PAR_OK;
    int64_t lo = 0; /* the first k row read: a row's start t - pos[t] (before 0 in a CP window) */
    for (int64_t t = t0; t < t1; t++)
        lo = t - pos[t] < lo ? t - pos[t] : lo;
    const int64_t qn = t1 * dm->iH * dm->ihd, kn = (t1 - lo) * dm->ihd;
    par_real *b = par_calloc((size_t)(qn + kn), sizeof(par_real), PAR_TAG_ACT);
    if (!b)
        return par_err(PAR_ENOMEM, "indexer: the FP4 copies of q and k (%lld values)", (long long)(qn + kn));
    const int64_t q0 = t0 * dm->iH * dm->ihd;
    par_status st = PAR_FN(par_qcast_fp4_rows)(b + q0, *iq + q0, (t1 - t0) * dm->iH, dm->ihd);
    if (!st)
        st = PAR_FN(par_qcast_fp4_rows)(b + qn, *icmp + lo * dm->ihd, t1 - lo, dm->ihd);
    if (st) {
        par_free(b);
        return st;
    }
    *iq = b, *icmp = b + qn - lo * dm->ihd, *buf = b;
    return PAR_OK;
}

int64_t PAR_FN(par_indexer_max_visible)(const int32_t *pos, int64_t t0, int64_t t1)
{
    int64_t maxvis = 0;
    for (int64_t t = t0; t < t1; t++)
        if ((pos[t] + 1) / 4 > maxvis)
            maxvis = (pos[t] + 1) / 4;
    return maxvis;
}

static int n_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_num(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

par_status PAR_FN(par_indexer_select)(int32_t *sel,           /* [T, topk] */
                                      const par_real *iq,     /* [T, iH*ihd] */
                                      const par_real *iw,     /* [T, iH] */
                                      const par_real *icmp,   /* [T, ihd] */
                                      const int32_t *pos,     /* [T] */
                                      const par_attn_dims *dm, int64_t t0, int64_t t1)
{
    const int64_t iH = dm->iH, ihd = dm->ihd, K = dm->topk;
    const int bf16 = dm->fp4_index; /* dm is host memory: nothing in the loop may read it */
    PAR_HOST_READ(pos + t0, t1 - t0);
    par_real *qbuf = NULL;
    par_status qst = fp4_inputs(&iq, &icmp, &qbuf, dm, pos, t0, t1);
    if (qst)
        return qst;
    const int64_t maxvis = PAR_FN(par_indexer_max_visible)(pos, t0, t1);
    const int nth = n_threads();
    const size_t ns = PAR_SLOTS(nth, t1 - t0), per = (size_t)(maxvis > 0 ? maxvis : 1);
    scored *buf = par_malloc(ns * per * sizeof(scored), PAR_TAG_ACT);
    par_real *abuf = par_malloc(ns * per * sizeof(par_real), PAR_TAG_ACT);
    if (!buf || !abuf) {
        par_free(buf);
        par_free(abuf);
        par_free(qbuf);
        return par_err(PAR_ENOMEM, "indexer_select: scratch of %d x %lld entries", nth,
                       (long long)maxvis);
    }
    PAR_DEV_BEGIN();
    void *buf_host = buf, *abuf_host = abuf;
    PAR_DIN(iq, t1 * iH * ihd);
    PAR_DIN(iw, t1 * iH);
    PAR_DIN(icmp, t1 * ihd);
    PAR_DIN(pos, t1);
    PAR_DINOUT(sel, t1 * K);
    PAR_DOUT(buf, ns * per);
    PAR_DOUT(abuf, ns * per);
    PAR_KLOOP_PAR((t1 - t0) * (maxvis + 1) * iH * ihd >= PAR_ATTN_OMP_MIN_WORK,
                  is_device_ptr(sel, iq, iw, icmp, pos, buf, abuf))
    for (int64_t t = t0; t < t1; t++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num(); /* device-callable, unlike thread_num() */
#endif
        const size_t slot = PAR_SLOT(tid, t - t0);
        scored *sc = buf + slot * per;
        par_real *acc = abuf + slot * per;
        const int64_t nvis = (pos[t] + 1) / 4;
        for (int64_t i = 0; i < nvis; i++)
            acc[i] = 0;
        score_row(acc, t, iq, iw, icmp, pos, iH, ihd, bf16);
        topk_row(sel + t * K, sc, acc, nvis, K, bf16);
    }
    par_free(buf_host);
    par_free(abuf_host);
    par_free(qbuf);
    return PAR_OK;
}

void PAR_FN(par_indexer_scores)(par_real *acc,          /* [t1-t0, nv] */
                                int64_t nv,
                                const par_real *iq,     /* [T, iH*ihd] */
                                const par_real *iw,     /* [T, iH] */
                                const par_real *icmp,   /* [T, ihd] */
                                const int32_t *pos,     /* [T] */
                                const par_attn_dims *dm, int64_t t0, int64_t t1)
{
    par_real *qbuf = NULL;
    if (fp4_inputs(&iq, &icmp, &qbuf, dm, pos, t0, t1)) {
        par_recipe_note_failure(); /* no status to return: the step fails on the count */
        return;
    }
#pragma omp parallel for schedule(static) \
    if ((t1 - t0) * (nv + 1) * dm->iH * dm->ihd >= PAR_ATTN_OMP_MIN_WORK)
    for (int64_t t = t0; t < t1; t++)
        score_row(acc + (t - t0) * nv, t, iq, iw, icmp, pos, dm->iH, dm->ihd, dm->fp4_index);
    par_free(qbuf);
}

par_status PAR_FN(par_indexer_topk)(int32_t *sel,          /* [T, topk] */
                                    const par_real *acc,   /* [t1-t0, nv] */
                                    int64_t nv,
                                    const int32_t *pos,    /* [T] */
                                    const par_attn_dims *dm, int64_t t0, int64_t t1)
{
    const int64_t K = dm->topk;
    const size_t row = (size_t)(nv > 0 ? nv : 1);
    const int nth = n_threads();
    scored *buf = par_malloc((size_t)nth * row * sizeof(scored), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "indexer_topk: scratch of %d x %lld entries", nth,
                       (long long)nv);
#pragma omp parallel for schedule(static) if ((t1 - t0) * (nv + 1) * 8 >= PAR_ATTN_OMP_MIN_WORK)
    for (int64_t t = t0; t < t1; t++) {
        scored *sc = buf + (size_t)thread_num() * row;
        topk_row(sel + t * K, sc, acc + (t - t0) * nv, (pos[t] + 1) / 4, K, dm->fp4_index);
    }
    par_free(buf);
    return PAR_OK;
}

/* The exact ties at query t's top-k boundary: with nvis > K visible entries
 * scored as par_indexer_select scores them (score_row from 0), when the
 * K-th and (K+1)-th largest scores are equal, tie[i] = 1 for every entry i
 * whose score equals them (the picks among them are the lower indices only
 * by MODEL.md's rule); 0 elsewhere.  Returns 1 when the row has such a tie.
 * sc, acc: scratch of nvis. */
static int tie_row(int32_t *tie, int64_t ne, scored *sc, par_real *acc, int64_t t, const par_real *iq,
                   const par_real *iw, const par_real *icmp, const int32_t *pos, const par_attn_dims *dm)
{
    const int64_t nvis = (pos[t] + 1) / 4, K = dm->topk;
    for (int64_t i = 0; i < ne; i++)
        tie[i] = 0;
    if (nvis <= K)
        return 0;
    for (int64_t i = 0; i < nvis; i++)
        acc[i] = 0;
    score_row(acc, t, iq, iw, icmp, pos, dm->iH, dm->ihd, dm->fp4_index);
    for (int64_t i = 0; i < nvis; i++) {
        if (dm->fp4_index)
            acc[i] = (par_real)par_bf16_round((double)acc[i]);
        sc[i].score = (double)acc[i];
        sc[i].i = (int32_t)i;
    }
    qsort(sc, (size_t)nvis, sizeof(scored), by_score_desc);
    const double kth = sc[K - 1].score;
    if (sc[K].score != kth)
        return 0;
    for (int64_t i = 0; i < nvis; i++)
        tie[i] = (double)acc[i] == kth;
    return 1;
}

par_status PAR_FN(par_indexer_ties)(int32_t *tie,          /* [T, ne] */
                                    int64_t ne,
                                    int64_t counts[2],
                                    const par_real *iq,     /* [T, iH*ihd] */
                                    const par_real *iw,     /* [T, iH] */
                                    const par_real *icmp,   /* [T, ihd] */
                                    const int32_t *pos,     /* [T] */
                                    const par_attn_dims *dm, int64_t T)
{
    const int64_t maxvis = PAR_FN(par_indexer_max_visible)(pos, 0, T);
    if (maxvis > ne)
        return par_err(PAR_EINVAL, "indexer_ties: a query sees %lld entries, more than the %lld columns",
                       (long long)maxvis, (long long)ne);
    const size_t per = (size_t)(maxvis > 0 ? maxvis : 1);
    par_real *qbuf = NULL;
    par_status qst = fp4_inputs(&iq, &icmp, &qbuf, dm, pos, 0, T);
    if (qst)
        return qst;
    scored *sc = par_malloc(per * sizeof(scored), PAR_TAG_ACT);
    par_real *acc = par_malloc(per * sizeof(par_real), PAR_TAG_ACT);
    if (!sc || !acc) {
        par_free(sc);
        par_free(acc);
        par_free(qbuf);
        return par_err(PAR_ENOMEM, "indexer_ties: scratch of %lld entries", (long long)maxvis);
    }
    int64_t choose = 0, tied = 0;
    for (int64_t t = 0; t < T; t++) {
        choose += (pos[t] + 1) / 4 > dm->topk;
        tied += tie_row(tie + t * ne, ne, sc, acc, t, iq, iw, icmp, pos, dm);
    }
    par_free(sc);
    par_free(acc);
    par_free(qbuf);
    counts[0] = choose;
    counts[1] = tied;
    return PAR_OK;
}
