/* kernels/indexer.c - phase (3) of the attention layer (m == 4): indexer
 * scores and top-k selection of compressed entries (MODEL.md section 3,
 * Indexer).  No backward: no gradient flows into the indexer.
 */
#include "kernels/attention.h"

#include <stdlib.h>

#include "core/alloc.h"
#include "kernels/offload.h"

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

PAR_END_DECLARE_TARGET

par_status PAR_FN(par_indexer_select)(int32_t *sel,           /* [T, topk] */
                                      const par_real *iq,     /* [T, iH*ihd] */
                                      const par_real *iw,     /* [T, iH] */
                                      const par_real *icmp,   /* [T, ihd] */
                                      const int32_t *pos,     /* [T] */
                                      const par_attn_dims *dm, int64_t t0, int64_t t1)
{
    const int64_t iH = dm->iH, ihd = dm->ihd, K = dm->topk, m = 4;
    int64_t maxvis = 0;
    PAR_HOST_READ(pos + t0, t1 - t0);
    for (int64_t t = t0; t < t1; t++)
        if ((pos[t] + 1) / m > maxvis)
            maxvis = (pos[t] + 1) / m;
    int nth = 1;
#ifdef _OPENMP
    nth = omp_get_max_threads();
#endif
    const size_t ns = PAR_SLOTS(nth, t1 - t0), per = (size_t)(maxvis > 0 ? maxvis : 1);
    scored *buf = par_malloc(ns * per * sizeof(scored), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "indexer_select: scratch of %d x %lld entries", nth,
                       (long long)maxvis);
    PAR_DEV_BEGIN();
    void *buf_host = buf;
    PAR_DIN(iq, t1 * iH * ihd);
    PAR_DIN(iw, t1 * iH);
    PAR_DIN(icmp, t1 * ihd);
    PAR_DIN(pos, t1);
    PAR_DINOUT(sel, t1 * K);
    PAR_DOUT(buf, ns * per);
    PAR_KLOOP_PAR((t1 - t0) * (maxvis + 1) * iH * ihd >= PAR_ATTN_OMP_MIN_WORK,
                  is_device_ptr(sel, iq, iw, icmp, pos, buf))
    for (int64_t t = t0; t < t1; t++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        scored *sc = buf + PAR_SLOT(tid, t - t0) * per;
        int64_t s0 = t - pos[t];
        int64_t nvis = (pos[t] + 1) / m;
        const par_real *qt = iq + t * iH * ihd;
        for (int64_t i = 0; i < nvis; i++) {
            const par_real *k = icmp + (s0 + (i + 1) * m - 1) * ihd;
            par_real acc = 0;
            for (int64_t h = 0; h < iH; h++) {
                par_real dot = 0;
                for (int64_t e = 0; e < ihd; e++)
                    dot += qt[h * ihd + e] * k[e];
                if (dot > 0)
                    acc += iw[t * iH + h] * dot;
            }
            sc[i].score = (double)acc;
            sc[i].i = (int32_t)i;
        }
        int64_t nk = nvis < K ? nvis : K;
        if (nvis > K)
            qsort(sc, (size_t)nvis, sizeof(scored), by_score_desc);
        int32_t *out = sel + t * K;
        for (int64_t k = 0; k < nk; k++)
            out[k] = sc[k].i;
        if (nvis > K)
            qsort(out, (size_t)nk, sizeof(int32_t), by_index_asc);
        for (int64_t k = nk; k < K; k++)
            out[k] = -1;
    }
    par_free(buf_host);
    return PAR_OK;
}
