/* kernels/attention.c - the V4 hybrid attention layer: phases (1), (4), (5)
 * and the whole-layer forward/backward (see kernels/attention.h).
 * Phase (2) is in compressor.c, phase (3) in indexer.c.
 */
#include "kernels/attention.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/pmath.h"
#include "kernels/gsum.h"
#include "kernels/offload.h"
#include "kernels/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int64_t coff_of(const par_attn_dims *dm)
{
    return dm->m == 4 ? 2 : 1;
}

/* ------------------------------------------------------------------------ */
/* dims, saved layout                                                        */

par_status PAR_FN(par_attn_check_dims)(const par_attn_dims *dm)
{
    if (!dm)
        return par_err(PAR_EINVAL, "attention: dims is NULL");
    if (dm->d <= 0 || dm->H <= 0 || dm->hd <= 0 || dm->q_lora <= 0 || dm->o_groups <= 0 ||
        dm->o_lora <= 0)
        return par_err(PAR_EINVAL,
                       "attention: sizes must be positive (d %lld, H %lld, hd %lld, q_lora %lld, "
                       "o_groups %lld, o_lora %lld)",
                       (long long)dm->d, (long long)dm->H, (long long)dm->hd,
                       (long long)dm->q_lora, (long long)dm->o_groups, (long long)dm->o_lora);
    if (dm->H % dm->o_groups != 0)
        return par_err(PAR_EINVAL, "attention: n_heads %lld is not a multiple of o_groups %lld",
                       (long long)dm->H, (long long)dm->o_groups);
    if (dm->window < 1)
        return par_err(PAR_EINVAL, "attention: window_size %lld must be >= 1",
                       (long long)dm->window);
    if (!dm->rope || dm->rope->rd != dm->rd)
        return par_err(PAR_EINVAL, "attention: rope table missing or its rd (%d) != rd %lld",
                       dm->rope ? dm->rope->rd : -1, (long long)dm->rd);
    if (dm->rd < 0 || dm->rd % 2 != 0 || dm->rd > dm->hd)
        return par_err(PAR_EINVAL, "attention: rope_head_dim %lld must be even and <= head_dim %lld",
                       (long long)dm->rd, (long long)dm->hd);
    if (dm->m < 0 || (dm->m > 0 && dm->m < 4))
        return par_err(PAR_EINVAL, "attention: compress ratio %lld must be 0, 4 or > 4",
                       (long long)dm->m);
    if (dm->m == 4) {
        if (dm->iH <= 0 || dm->ihd <= 0 || dm->topk <= 0)
            return par_err(PAR_EINVAL,
                           "attention: m = 4 needs index_n_heads %lld, index_head_dim %lld, "
                           "index_topk %lld > 0",
                           (long long)dm->iH, (long long)dm->ihd, (long long)dm->topk);
        if (dm->ihd < dm->rd)
            return par_err(PAR_EINVAL, "attention: index_head_dim %lld < rope_head_dim %lld",
                           (long long)dm->ihd, (long long)dm->rd);
        if (dm->topk > INT32_MAX)
            return par_err(PAR_EINVAL, "attention: index_topk %lld too large",
                           (long long)dm->topk);
    }
    return PAR_OK;
}

static par_status check_pos(const int32_t *pos, int64_t T)
{
    for (int64_t t = 0; t < T; t++) {
        int32_t want = t > 0 ? pos[t - 1] + 1 : 0;
        if (pos[t] != 0 && pos[t] != want)
            return par_err(PAR_EINVAL,
                           "attention: pos[%lld] = %d must be 0 (sample start) or pos[t-1]+1 = %d",
                           (long long)t, pos[t], want);
    }
    return PAR_OK;
}

/* One walk over the saved arrays: with buf == NULL it only counts bytes. */
static size_t saved_layout(PAR_FN(par_attn_saved) *s, char *buf, const par_attn_dims *dm,
                           int64_t T)
{
    PAR_ATTN_SAVED_DIMS(dm);
    size_t off = 0;
    if (buf)
        memset(s, 0, sizeof *s);
#define CARVE(field, type, width, present, tok)                                   \
    if (present) {                                                                \
        if (buf)                                                                  \
            s->field = (type *)(void *)(buf + off);                               \
        off += ((size_t)(T * (int64_t)(width)) * sizeof(type) + 63) & ~(size_t)63; \
    }
    PAR_ATTN_SAVED_FIELDS(CARVE)
#undef CARVE
    return off;
}

size_t PAR_FN(par_attn_saved_bytes)(const par_attn_dims *dm, int64_t T)
{
    return saved_layout(NULL, NULL, dm, T);
}

void PAR_FN(par_attn_saved_carve)(PAR_FN(par_attn_saved) *s, void *buf,
                                  const par_attn_dims *dm, int64_t T)
{
    saved_layout(s, buf, dm, T);
}

/* ------------------------------------------------------------------------ */
/* (1) projections                                                           */

/* z[t] += ape[pos[t] mod m] */
static void add_ape(par_real *z, const par_real *ape, const int32_t *pos, int64_t T, int64_t m,
                    int64_t n)
{
    PAR_DEV_BEGIN();
    PAR_DIN(ape, m * n);
    PAR_DIN(pos, T);
    PAR_DINOUT(z, T * n);
    PAR_KLOOP(is_device_ptr(z, ape, pos))
    for (int64_t t = 0; t < T; t++) {
        const par_real *ap = ape + (pos[t] % m) * n;
        for (int64_t e = 0; e < n; e++)
            z[t * n + e] += ap[e];
    }
}

/* dape[pos[t] mod m] += dz[t], rows t ascending (per element: the host's
 * order; on the device one thread per column). */
static void ape_backward(par_real *dape, const par_real *dz, const int32_t *pos, int64_t T,
                         int64_t m, int64_t nc)
{
    PAR_DEV_BEGIN();
    if (PAR_ON_DEVICE()) {
        PAR_DIN(dz, T * nc);
        PAR_DIN(pos, T);
        PAR_DINOUT(dape, m * nc);
        PAR_KLOOP(is_device_ptr(dape, dz, pos))
        for (int64_t e = 0; e < nc; e++)
            for (int64_t t = 0; t < T; t++)
                dape[(pos[t] % m) * nc + e] += dz[t * nc + e];
        return;
    }
    const par_racc_view v = par_gsum_of(dape, m * nc);
    for (int64_t t = 0; t < T; t++) {
        par_real *ap = dape + (pos[t] % m) * nc;
        for (int64_t e = 0; e < nc; e++)
            if (v.acc)
                par_gsum_put(v, (pos[t] % m) * nc + e, (double)dz[t * nc + e]);
            else
                ap[e] += dz[t * nc + e];
    }
}

void PAR_FN(par_attn_proj_forward)(PAR_FN(par_attn_saved) *s,
                                   const par_real *x,   /* [T, d] */
                                   const int32_t *pos,  /* [T] */
                                   const PAR_FN(par_attn_weights) *W,
                                   const par_attn_dims *dm, int64_t T)
{
    const int64_t d = dm->d, H = dm->H, hd = dm->hd, ql = dm->q_lora, m = dm->m;
    const double eps = dm->norm_eps;
    PAR_FN(par_linear_forward)(s->qa, x, W->wq_a, T, d, ql);
    PAR_FN(par_rmsnorm_forward)(s->qr, s->qa_rstd, s->qa, W->q_norm, T, ql, eps);
    PAR_FN(par_linear_forward)(s->qb, s->qr, W->wq_b, T, ql, H * hd);
    PAR_FN(par_rmsnorm_forward)(s->q, s->q_rstd, s->qb, NULL, T * H, hd, eps);
    PAR_FN(par_rope_apply)(s->q, pos, dm->rope, T, H, hd, +1);

    PAR_FN(par_linear_forward)(s->kva, x, W->wkv, T, d, hd);
    PAR_FN(par_rmsnorm_forward)(s->kv, s->kv_rstd, s->kva, W->kv_norm, T, hd, eps);
    PAR_FN(par_rope_apply)(s->kv, pos, dm->rope, T, 1, hd, +1);

    if (m > 0) {
        const int64_t n = coff_of(dm) * hd;
        PAR_FN(par_linear_forward)(s->ca, x, W->cmp_wkv, T, d, n);
        PAR_FN(par_linear_forward)(s->cz, x, W->cmp_wgate, T, d, n);
        add_ape(s->cz, W->cmp_ape, pos, T, m, n);
    }
    if (m == 4) {
        const int64_t iH = dm->iH, ihd = dm->ihd;
        PAR_FN(par_linear_forward)(s->iq, s->qr, W->idx_wq_b, T, ql, iH * ihd);
        PAR_FN(par_rope_apply)(s->iq, pos, dm->rope, T, iH, ihd, +1);
        PAR_FN(par_linear_forward)(s->iw, x, W->idx_weights_proj, T, d, iH);
        const par_real sc = (par_real)(1.0 / sqrt((double)ihd) / sqrt((double)iH));
        PAR_DEV_BEGIN();
        par_real *iw = PAR_DINOUT_AS(s->iw, T * iH);
        PAR_KLOOP(is_device_ptr(iw))
        for (int64_t e = 0; e < T * iH; e++)
            iw[e] *= sc;
        PAR_FN(par_linear_forward)(s->ica, x, W->idx_cmp_wkv, T, d, 2 * ihd);
        PAR_FN(par_linear_forward)(s->icz, x, W->idx_cmp_wgate, T, d, 2 * ihd);
        add_ape(s->icz, W->idx_cmp_ape, pos, T, 4, 2 * ihd);
    }
}

void PAR_FN(par_attn_proj_backward_dqb)(par_real *dqb,        /* [T, H*hd] */
                                        par_real *dq,         /* [T, H*hd] scratch */
                                        const PAR_FN(par_attn_saved) *s, const int32_t *pos, /* [T] */
                                        const par_attn_dims *dm, int64_t T)
{
    PAR_FN(par_rope_apply)(dq, pos, dm->rope, T, dm->H, dm->hd, -1);
    PAR_FN(par_rmsnorm_backward)(dqb, NULL, dq, s->qb, NULL, s->q_rstd, T * dm->H, dm->hd);
}

par_status PAR_FN(par_attn_proj_backward_rest)(par_real *dx,          /* [T, d] or NULL */
                                               PAR_FN(par_attn_weights) *dW,
                                               const par_real *dqr,   /* [T, q_lora] */
                                               par_real *dkv,         /* [T, hd] scratch */
                                               const par_real *dca,   /* [T, coff*hd] or NULL */
                                               const par_real *dcz,   /* [T, coff*hd] or NULL */
                                               const PAR_FN(par_attn_saved) *s,
                                               const par_real *x,     /* [T, d] */
                                               const int32_t *pos,    /* [T] */
                                               const PAR_FN(par_attn_weights) *W,
                                               const par_attn_dims *dm, int64_t T)
{
    const int64_t d = dm->d, hd = dm->hd, ql = dm->q_lora, m = dm->m;
    size_t n = (size_t)(T * ql + T * hd);
    par_real *buf = par_calloc(n, sizeof(par_real), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "attention proj_backward: scratch of %zu reals", n);
    par_real *dqa = buf, *dkva = dqa + T * ql;
    /* query path from the low-rank input */
    PAR_FN(par_rmsnorm_backward)(dqa, dW->q_norm, dqr, s->qa, W->q_norm, s->qa_rstd, T, ql);
    PAR_FN(par_linear_backward)(dx, dW->wq_a, dqa, x, W->wq_a, T, d, ql);
    /* kv path */
    PAR_FN(par_rope_apply)(dkv, pos, dm->rope, T, 1, hd, -1);
    PAR_FN(par_rmsnorm_backward)(dkva, dW->kv_norm, dkv, s->kva, W->kv_norm, s->kv_rstd, T, hd);
    PAR_FN(par_linear_backward)(dx, dW->wkv, dkva, x, W->wkv, T, d, hd);
    /* compressor a/z */
    if (m > 0) {
        const int64_t nc = coff_of(dm) * hd;
        if (dca)
            PAR_FN(par_linear_backward)(dx, dW->cmp_wkv, dca, x, W->cmp_wkv, T, d, nc);
        if (dcz) {
            PAR_FN(par_linear_backward)(dx, dW->cmp_wgate, dcz, x, W->cmp_wgate, T, d, nc);
            if (dW->cmp_ape)
                ape_backward(dW->cmp_ape, dcz, pos, T, m, nc);
        }
    }
    par_free(buf);
    return PAR_OK;
}

par_status PAR_FN(par_attn_proj_backward)(par_real *dx,          /* [T, d] or NULL */
                                          PAR_FN(par_attn_weights) *dW,
                                          par_real *dq,          /* [T, H*hd] scratch */
                                          par_real *dkv,         /* [T, hd] scratch */
                                          const par_real *dca,   /* [T, coff*hd] or NULL */
                                          const par_real *dcz,   /* [T, coff*hd] or NULL */
                                          const PAR_FN(par_attn_saved) *s,
                                          const par_real *x,     /* [T, d] */
                                          const int32_t *pos,    /* [T] */
                                          const PAR_FN(par_attn_weights) *W,
                                          const par_attn_dims *dm, int64_t T)
{
    const int64_t H = dm->H, hd = dm->hd, ql = dm->q_lora;
    PAR_FN(par_attn_weights) none;
    memset(&none, 0, sizeof none);
    if (!dW)
        dW = &none;
    size_t n = (size_t)(T * H * hd + T * ql);
    par_real *buf = par_calloc(n, sizeof(par_real), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "attention proj_backward: scratch of %zu reals", n);
    par_real *dqb = buf, *dqr = dqb + T * H * hd;
    PAR_FN(par_attn_proj_backward_dqb)(dqb, dq, s, pos, dm, T);
    PAR_FN(par_linear_backward)(dqr, dW->wq_b, dqb, s->qr, W->wq_b, T, ql, H * hd);
    par_status st = PAR_FN(par_attn_proj_backward_rest)(dx, dW, dqr, dkv, dca, dcz, s, x, pos, W, dm, T);
    par_free(buf);
    return st;
}

/* ------------------------------------------------------------------------ */
/* (4) core attention                                                        */

PAR_DECLARE_TARGET /* the per-query pieces of (4) run inside device loops */
/* The key set of query t: nwin window rows from w0, then ne entries. */
typedef struct {
    int64_t s0, w0, nwin, ne;
} key_set;

static key_set keys_of(int64_t t, const int32_t *pos, const int32_t *sel,
                       const par_attn_dims *dm)
{
    key_set k;
    k.s0 = t - pos[t];
    k.w0 = t - dm->window + 1;
    if (k.w0 < k.s0)
        k.w0 = k.s0;
    k.nwin = t - k.w0 + 1;
    k.ne = 0;
    if (dm->m == 4) {
        const int32_t *st = sel + t * dm->topk;
        while (k.ne < dm->topk && st[k.ne] >= 0)
            k.ne++;
    } else if (dm->m > 0) {
        k.ne = (pos[t] + 1) / dm->m;
    }
    return k;
}

/* Fills kp[0 .. nwin+ne) with the key vectors of query t. */
static int64_t key_ptrs(const par_real **kp, const key_set *k, int64_t t, const par_real *kv,
                        const par_real *cmp, const int32_t *sel, const par_attn_dims *dm)
{
    const int64_t hd = dm->hd, m = dm->m;
    int64_t n = 0;
    for (int64_t j = k->w0; j <= t; j++)
        kp[n++] = kv + j * hd;
    for (int64_t e = 0; e < k->ne; e++) {
        int64_t i = m == 4 ? sel[t * dm->topk + e] : e;
        kp[n++] = cmp + (k->s0 + (i + 1) * m - 1) * hd;
    }
    return n;
}

PAR_END_DECLARE_TARGET

static int64_t max_keys(const int32_t *pos, const par_attn_dims *dm, int64_t q0, int64_t q1)
{
    int64_t ne = 0;
    if (dm->m == 4)
        ne = dm->topk;
    else if (dm->m > 0)
        for (int64_t t = q0; t < q1; t++)
            if ((pos[t] + 1) / dm->m > ne)
                ne = (pos[t] + 1) / dm->m;
    return dm->window + ne;
}

PAR_DECLARE_TARGET
static inline par_real dot(const par_real *a, const par_real *b, int64_t n)
{
    par_real s = 0;
    for (int64_t e = 0; e < n; e++)
        s += a[e] * b[e];
    return s;
}

PAR_END_DECLARE_TARGET

/* The dims as device code reads them: a copy whose rope points at the
 * table's device address. */
static par_attn_dims dims_on_device(const par_attn_dims *dm)
{
    par_attn_dims d = *dm;
    PAR_DIN(d.rope, 1);
    return d;
}

par_status PAR_FN(par_attn_core_forward)(par_real *o,           /* [T, H*hd] */
                                         par_real *lse,         /* [T, H] */
                                         const par_real *q,     /* [T, H*hd] */
                                         const par_real *kv,    /* [T, hd] */
                                         const par_real *cmp,   /* [T, hd] or NULL (m == 0) */
                                         const int32_t *sel,    /* [T, topk] or NULL (m != 4) */
                                         const int32_t *pos,    /* [T] */
                                         const par_real *sink,  /* [H] */
                                         const par_attn_dims *dm, int64_t q0, int64_t q1)
{
    const int64_t H = dm->H, hd = dm->hd;
    const par_real scale = (par_real)(1.0 / sqrt((double)hd));
    PAR_HOST_READ(pos + q0, q1 - q0);
    const int64_t mk = max_keys(pos, dm, q0, q1);
    const int nth = max_threads();
    const size_t ns = PAR_SLOTS(nth, q1 - q0);
    par_real *zb = par_malloc(ns * (size_t)mk * sizeof(par_real), PAR_TAG_ACT);
    const par_real **kb = par_malloc(ns * (size_t)mk * sizeof(*kb), PAR_TAG_ACT);
    if (!zb || !kb) {
        par_free(zb);
        par_free(kb);
        return par_err(PAR_ENOMEM, "attention core_forward: scratch of %d x %lld keys", nth,
                       (long long)mk);
    }
    PAR_DEV_BEGIN();
    void *zb_host = zb, *kb_host = (void *)kb;
    const int64_t T = q1; /* rows [0, q1) may be read: keys of earlier rows */
    PAR_DIN(q, T * H * hd);
    PAR_DIN(kv, T * hd);
    PAR_DIN(cmp, T * hd);
    PAR_DIN(sel, T * dm->topk);
    PAR_DIN(pos, T);
    PAR_DIN(sink, H);
    PAR_DOUT(zb, ns * (size_t)mk);
    PAR_DOUT(kb, ns * (size_t)mk);
    par_real *o_ = PAR_DINOUT_AS(o, T * H * hd), *lse_ = PAR_DINOUT_AS(lse, T * H);
    const par_attn_dims dd = dims_on_device(dm);
    PAR_KLOOP_PAR((q1 - q0) * mk * H * hd >= PAR_ATTN_OMP_MIN_WORK,
                  is_device_ptr(o_, lse_, q, kv, cmp, sel, pos, sink, zb, kb) map(to: dd))
    for (int64_t t = q0; t < q1; t++) {
        par_real *z = zb + PAR_SLOT(thread_id(), t - q0) * (size_t)mk;
        const par_real **kp = kb + PAR_SLOT(thread_id(), t - q0) * (size_t)mk;
        key_set ks = keys_of(t, pos, sel, &dd);
        int64_t nk = key_ptrs(kp, &ks, t, kv, cmp, sel, &dd);
        for (int64_t h = 0; h < H; h++) {
            const par_real *qh = q + (t * H + h) * hd;
            par_real mx = sink[h];
            for (int64_t k = 0; k < nk; k++) {
                z[k] = dot(qh, kp[k], hd) * scale;
                if (z[k] > mx)
                    mx = z[k];
            }
            par_real sum = (par_real)par_pmath_exp((double)(sink[h] - mx));
            for (int64_t k = 0; k < nk; k++) {
                z[k] = (par_real)par_pmath_exp((double)(z[k] - mx));
                sum += z[k];
            }
            par_real *oh = o_ + (t * H + h) * hd;
            memset(oh, 0, (size_t)hd * sizeof(par_real));
            for (int64_t k = 0; k < nk; k++) {
                par_real p = z[k] / sum;
                for (int64_t e = 0; e < hd; e++)
                    oh[e] += p * kp[k][e];
            }
            lse_[t * H + h] = mx + (par_real)par_pmath_log((double)sum);
        }
        PAR_FN(par_rope_row)(o_ + t * H * hd, (double)pos[t], dd.rope, H, hd, -1.0);
    }
    par_free(zb_host);
    par_free(kb_host);
    return PAR_OK;
}

par_status PAR_FN(par_attn_core_backward_q)(par_real *dq,          /* [T, H*hd] or NULL */
                                            par_real *dsink,       /* [H] or NULL */
                                            par_real *dop,         /* [T, H*hd] out */
                                            par_real *Dd,          /* [T, H] out */
                                            const par_real *dout,  /* [T, H*hd] d(o) */
                                            const par_real *lse,   /* [T, H] */
                                            const par_real *q,     /* [T, H*hd] */
                                            const par_real *kv,    /* [T, hd] */
                                            const par_real *cmp,   /* [T, hd] or NULL */
                                            const int32_t *sel,    /* [T, topk] or NULL */
                                            const int32_t *pos,    /* [T] */
                                            const par_real *sink,  /* [H] */
                                            const par_attn_dims *dm, int64_t q0, int64_t q1)
{
    const int64_t H = dm->H, hd = dm->hd;
    const par_real scale = (par_real)(1.0 / sqrt((double)hd));
    PAR_HOST_READ(pos + q0, q1 - q0);
    const int64_t mk = max_keys(pos, dm, q0, q1);
    const int nth = max_threads();
    const size_t ns = PAR_SLOTS(nth, q1 - q0);
    par_real *pb = par_malloc(ns * (size_t)mk * 2 * sizeof(par_real), PAR_TAG_ACT);
    const par_real **kb = par_malloc(ns * (size_t)mk * sizeof(*kb), PAR_TAG_ACT);
    par_real *ds = par_malloc((size_t)((q1 - q0) * H + 1) * sizeof(par_real), PAR_TAG_ACT);
    if (!pb || !kb || !ds) {
        par_free(pb);
        par_free(kb);
        par_free(ds);
        return par_err(PAR_ENOMEM, "attention core_backward_q: scratch of %d x %lld keys", nth,
                       (long long)mk);
    }
    PAR_DEV_BEGIN();
    void *pb_host = pb, *kb_host = (void *)kb, *ds_host = ds;
    const int64_t T = q1;
    PAR_DIN(dout, T * H * hd);
    PAR_DIN(lse, T * H);
    PAR_DIN(q, T * H * hd);
    PAR_DIN(kv, T * hd);
    PAR_DIN(cmp, T * hd);
    PAR_DIN(sel, T * dm->topk);
    PAR_DIN(pos, T);
    PAR_DIN(sink, H);
    PAR_DINOUT(dq, T * H * hd);
    PAR_DINOUT(dsink, H);
    PAR_DINOUT(dop, T * H * hd);
    PAR_DINOUT(Dd, T * H);
    PAR_DOUT(pb, ns * (size_t)mk * 2);
    PAR_DOUT(kb, ns * (size_t)mk);
    PAR_DOUT(ds, (q1 - q0) * H + 1);
    const par_attn_dims dd = dims_on_device(dm);
    PAR_KLOOP_PAR((q1 - q0) * mk * H * hd >= PAR_ATTN_OMP_MIN_WORK,
                  is_device_ptr(dq, dop, Dd, dout, lse, q, kv, cmp, sel, pos, sink, pb, kb, ds)
                  map(to: dd))
    for (int64_t t = q0; t < q1; t++) {
        par_real *P = pb + PAR_SLOT(thread_id(), t - q0) * (size_t)mk * 2, *dP = P + mk;
        const par_real **kp = kb + PAR_SLOT(thread_id(), t - q0) * (size_t)mk;
        key_set ks = keys_of(t, pos, sel, &dd);
        int64_t nk = key_ptrs(kp, &ks, t, kv, cmp, sel, &dd);
        memcpy(dop + t * H * hd, dout + t * H * hd, (size_t)(H * hd) * sizeof(par_real));
        PAR_FN(par_rope_row)(dop + t * H * hd, (double)pos[t], dd.rope, H, hd, 1.0);
        for (int64_t h = 0; h < H; h++) {
            const par_real *qh = q + (t * H + h) * hd, *gh = dop + (t * H + h) * hd;
            const par_real L = lse[t * H + h];
            par_real D = 0;
            for (int64_t k = 0; k < nk; k++) {
                P[k] = (par_real)par_pmath_exp((double)(dot(qh, kp[k], hd) * scale - L));
                dP[k] = dot(gh, kp[k], hd);
                D += P[k] * dP[k];
            }
            Dd[t * H + h] = D;
            if (dq) {
                par_real *dqh = dq + (t * H + h) * hd;
                for (int64_t k = 0; k < nk; k++) {
                    par_real dz = P[k] * (dP[k] - D) * scale;
                    for (int64_t e = 0; e < hd; e++)
                        dqh[e] += dz * kp[k][e];
                }
            }
            ds[(t - q0) * H + h] = -(par_real)par_pmath_exp((double)(sink[h] - L)) * D;
        }
    }
    const par_racc_view vs = PAR_ON_DEVICE() ? (par_racc_view){NULL, 0} : par_gsum_of(dsink, H);
    for (int64_t t = q0; vs.acc && t < q1; t++) /* the bitwise mode: a term per query */
        for (int64_t h = 0; h < H; h++)
            par_gsum_put(vs, h, (double)ds[(t - q0) * H + h]);
    if (dsink && !vs.acc) {
        /* per head, t ascending (the order of the host's t-major loop) */
        PAR_KLOOP(is_device_ptr(dsink, ds))
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = q0; t < q1; t++)
                dsink[h] += ds[(t - q0) * H + h];
    }
    par_free(pb_host);
    par_free(kb_host);
    par_free(ds_host);
    return PAR_OK;
}

PAR_DECLARE_TARGET
/* Query t's head h against key vector k: the probability *p and the scaled
 * score gradient *dz (qh, gh: the head's q and dO W rows). */
static void key_coefs(par_real *p, par_real *dz, const par_real *qh, const par_real *gh, const par_real *k,
                      par_real lse, par_real D, int64_t hd, par_real scale)
{
    *p = (par_real)par_pmath_exp((double)(dot(qh, k, hd) * scale - lse));
    par_real dp = dot(gh, k, hd);
    *dz = *p * (dp - D) * scale;
}

/* dk += sum over (t, h) of dz scale q + p dop for one key vector k seen by
 * query t. */
static void key_grad(par_real *dk, const par_real *k, int64_t t, const par_real *dop,
                     const par_real *Dd, const par_real *lse, const par_real *q,
                     const par_attn_dims *dm, par_real scale)
{
    const int64_t H = dm->H, hd = dm->hd;
    for (int64_t h = 0; h < H; h++) {
        const par_real *qh = q + (t * H + h) * hd, *gh = dop + (t * H + h) * hd;
        par_real p, dz;
        key_coefs(&p, &dz, qh, gh, k, lse[t * H + h], Dd[t * H + h], hd, scale);
        for (int64_t e = 0; e < hd; e++)
            dk[e] += dz * qh[e] + p * gh[e];
    }
}

/* The bitwise mode's order for a window key j: heads outer, then the
 * queries t in [j, t1), so that a tensor-parallel group (heads split in rank
 * order) continues one chain rank after rank (docs/bitwise.md). */
static void key_grad_by_head(par_real *dk, const par_real *k, int64_t j, int64_t t1, const par_real *dop,
                             const par_real *Dd, const par_real *lse, const par_real *q,
                             const par_attn_dims *dm, par_real scale)
{
    const int64_t H = dm->H, hd = dm->hd;
    for (int64_t h = 0; h < H; h++)
        for (int64_t t = j; t < t1; t++) {
            const par_real *qh = q + (t * H + h) * hd, *gh = dop + (t * H + h) * hd;
            par_real p, dz;
            key_coefs(&p, &dz, qh, gh, k, lse[t * H + h], Dd[t * H + h], hd, scale);
            for (int64_t e = 0; e < hd; e++)
                dk[e] += dz * qh[e] + p * gh[e];
        }
}

static int selected_has(const int32_t *st, int64_t K, int64_t i)
{
    for (int64_t k = 0; k < K && st[k] >= 0; k++)
        if (st[k] == i)
            return 1;
    return 0;
}
PAR_END_DECLARE_TARGET

/* The bitwise mode (host): query t's contribution to key k's gradient, one
 * term per (head, element) into v at element j*hd (key_grad's terms). */
static void key_terms(par_racc_view v, int64_t j, const par_real *k, int64_t t, const par_real *dop,
                      const par_real *Dd, const par_real *lse, const par_real *q, const par_attn_dims *dm,
                      par_real scale)
{
    const int64_t H = dm->H, hd = dm->hd;
    for (int64_t h = 0; h < H; h++) {
        const par_real *qh = q + (t * H + h) * hd, *gh = dop + (t * H + h) * hd;
        par_real p, dz;
        key_coefs(&p, &dz, qh, gh, k, lse[t * H + h], Dd[t * H + h], hd, scale);
        for (int64_t e = 0; e < hd; e++)
            par_gsum_put(v, j * hd + e, (double)(dz * qh[e] + p * gh[e]));
    }
}

/* The entries' key side in the bitwise mode: every (query, head) term
 * deposited into the accumulator behind dcmp (any order: the layouts split
 * an entry's queries between ranks). */
static void entry_terms(par_racc_view v, const par_real *dop, const par_real *Dd, const par_real *lse,
                        const par_real *q, const par_real *cmp, const int32_t *sel, const int32_t *pos,
                        const par_attn_dims *dm, int64_t k0, int64_t k1, int64_t nq)
{
    const int64_t hd = dm->hd, m = dm->m;
    const par_real scale = (par_real)(1.0 / sqrt((double)hd));
    for (int64_t j = k0; j < k1; j++) {
        const int64_t pj = pos[j];
        if ((pj + 1) % m != 0)
            continue;
        const int64_t i = (pj + 1) / m - 1;
        for (int64_t t = j; t < nq && pos[t] == pj + (t - j); t++)
            if (m != 4 || selected_has(sel + t * dm->topk, dm->topk, i))
                key_terms(v, j, cmp + j * hd, t, dop, Dd, lse, q, dm, scale);
    }
}

void PAR_FN(par_attn_core_backward_kv)(par_real *dkv,         /* [T, hd] or NULL */
                                       par_real *dcmp,        /* [T, hd] or NULL */
                                       const par_real *dop,   /* [T, H*hd] */
                                       const par_real *Dd,    /* [T, H] */
                                       const par_real *lse,   /* [T, H] */
                                       const par_real *q,     /* [T, H*hd] */
                                       const par_real *kv,    /* [T, hd] */
                                       const par_real *cmp,   /* [T, hd] or NULL */
                                       const int32_t *sel,    /* [T, topk] or NULL */
                                       const int32_t *pos,    /* [T] */
                                       const par_attn_dims *dm, int64_t k0, int64_t k1,
                                       int64_t nq)
{
    const int64_t hd = dm->hd, m = dm->m, H = dm->H;
    const par_real scale = (par_real)(1.0 / sqrt((double)hd));
    const par_racc_view ve = dcmp && m > 0 && !par_dev_gpu() ? par_gsum_of(dcmp, k1 * hd) : (par_racc_view){NULL, 0};
    if (ve.acc) { /* the bitwise mode: the entries as terms, then only dkv below */
        entry_terms(ve, dop, Dd, lse, q, cmp, sel, pos, dm, k0, k1, nq);
        dcmp = NULL;
        if (!dkv)
            return;
    }
    PAR_DEV_BEGIN();
    const int64_t T = nq > k1 ? nq : k1; /* rows read: keys [k0, k1), queries [0, nq) */
    PAR_DIN(dop, nq * H * hd);
    PAR_DIN(Dd, nq * H);
    PAR_DIN(lse, nq * H);
    PAR_DIN(q, nq * H * hd);
    PAR_DIN(kv, k1 * hd);
    PAR_DIN(cmp, k1 * hd);
    PAR_DIN(sel, nq * dm->topk);
    PAR_DIN(pos, T);
    PAR_DINOUT(dkv, k1 * hd);
    PAR_DINOUT(dcmp, k1 * hd);
    const par_attn_dims dd = dims_on_device(dm);
    /* (the parallel clause is evaluated on the device: dd, not the host's dm) */
    PAR_KLOOP_PAR((k1 - k0) * dd.window * dd.H * hd >= PAR_ATTN_OMP_MIN_WORK,
                  is_device_ptr(dkv, dcmp, dop, Dd, lse, q, kv, cmp, sel, pos) map(to: dd))
    for (int64_t j = k0; j < k1; j++) {
        const int64_t pj = pos[j];
        /* window: queries t = j .. j + window - 1 of the same sample */
        if (dkv && dd.bitwise) {
            int64_t t1 = j;
            while (t1 < nq && t1 < j + dd.window && pos[t1] == pj + (t1 - j))
                t1++;
            key_grad_by_head(dkv + j * hd, kv + j * hd, j, t1, dop, Dd, lse, q, &dd, scale);
        } else if (dkv)
            for (int64_t t = j; t < nq && t < j + dd.window && pos[t] == pj + (t - j); t++)
                key_grad(dkv + j * hd, kv + j * hd, t, dop, Dd, lse, q, &dd, scale);
        /* entry i at its block's last row: every later query of the sample */
        if (dcmp && m > 0 && (pj + 1) % m == 0) {
            const int64_t i = (pj + 1) / m - 1;
            for (int64_t t = j; t < nq && pos[t] == pj + (t - j); t++) {
                if (m == 4 && !selected_has(sel + t * dd.topk, dd.topk, i))
                    continue;
                key_grad(dcmp + j * hd, cmp + j * hd, t, dop, Dd, lse, q, &dd, scale);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* (5) grouped output projection                                             */

void PAR_FN(par_attn_out_forward)(par_real *y,           /* [T, d] */
                                  par_real *r,           /* [T, o_groups*o_lora] */
                                  const par_real *o,     /* [T, H*hd] */
                                  const par_real *wo_a,  /* [o_groups*o_lora, H*hd/o_groups] */
                                  const par_real *wo_b,  /* [d, o_groups*o_lora] */
                                  const par_attn_dims *dm, int64_t T)
{
    PAR_FN(par_attn_out_groups)(r, o, wo_a, dm, T);
    PAR_FN(par_linear_forward)(y, r, wo_b, T, dm->o_groups * dm->o_lora, dm->d);
}

void PAR_FN(par_attn_out_groups)(par_real *r,          /* [T, o_groups*o_lora] */
                                 const par_real *o,    /* [T, H*hd] */
                                 const par_real *wo_a, /* [o_groups*o_lora, H*hd/o_groups] */
                                 const par_attn_dims *dm, int64_t T)
{
    const int64_t G = dm->o_groups, ol = dm->o_lora, HD = dm->H * dm->hd, Dg = HD / G;
    for (int64_t g = 0; g < G; g++)
        PAR_FN(par_gemm)(0, 1, T, ol, Dg, 1, o + g * Dg, HD, wo_a + g * ol * Dg, Dg, 0,
                         r + g * ol, G * ol);
}

par_status PAR_FN(par_attn_out_backward)(par_real *dout,       /* [T, H*hd] or NULL: d(o) += */
                                         par_real *dwo_a,      /* or NULL */
                                         par_real *dwo_b,      /* or NULL */
                                         const par_real *dy,   /* [T, d] */
                                         const par_real *r,    /* [T, o_groups*o_lora] */
                                         const par_real *o,    /* [T, H*hd] */
                                         const par_real *wo_a, /* [o_groups*o_lora, H*hd/o_groups] */
                                         const par_real *wo_b, /* [d, o_groups*o_lora] */
                                         const par_attn_dims *dm, int64_t T)
{
    const int64_t G = dm->o_groups, ol = dm->o_lora, HD = dm->H * dm->hd, Dg = HD / G;
    par_real *dr = par_calloc((size_t)(T * G * ol), sizeof(par_real), PAR_TAG_ACT);
    if (!dr)
        return par_err(PAR_ENOMEM, "attention out_backward: scratch of %lld reals",
                       (long long)(T * G * ol));
    PAR_FN(par_linear_backward)(dr, dwo_b, dy, r, wo_b, T, G * ol, dm->d);
    for (int64_t g = 0; g < G; g++) {
        if (dout)
            PAR_FN(par_gemm)(0, 0, T, Dg, ol, 1, dr + g * ol, G * ol, wo_a + g * ol * Dg, Dg, 1,
                             dout + g * Dg, HD);
        const par_racc_view v = par_gsum_of(dwo_a ? dwo_a + g * ol * Dg : NULL, ol * Dg);
        if (v.acc)
            PAR_FN(par_gsum_outer)(v, dr + g * ol, G * ol, o + g * Dg, HD, T, ol, Dg, Dg);
        else if (dwo_a)
            PAR_FN(par_gemm)(1, 0, ol, Dg, T, 1, dr + g * ol, G * ol, o + g * Dg, HD, 1,
                             dwo_a + g * ol * Dg, Dg);
    }
    par_free(dr);
    return PAR_OK;
}

/* ------------------------------------------------------------------------ */
/* whole layer                                                               */

par_status PAR_FN(par_attn_forward)(par_real *y,                      /* [T, d] */
                                    PAR_FN(par_attn_saved) *saved,
                                    int32_t *selected,                /* [T, topk] or NULL */
                                    const par_real *x,                /* [T, d] */
                                    const int32_t *pos,               /* [T] */
                                    const PAR_FN(par_attn_weights) *W,
                                    const par_attn_dims *dm, int64_t T)
{
    par_status st = PAR_FN(par_attn_check_dims)(dm);
    if (st)
        return st;
    PAR_HOST_READ(pos, T);
    if ((st = check_pos(pos, T)))
        return st;
    PAR_FN(par_attn_saved) *s = saved;
    PAR_FN(par_attn_proj_forward)(s, x, pos, W, dm, T);
    if (dm->m > 0)
        PAR_FN(par_compress_forward)(s->cmp, s->cmp_raw, s->cmp_rstd, s->ca, s->cz, pos,
                                     W->cmp_norm, dm->rope, 0, T, dm->hd, dm->m, dm->norm_eps);
    if (dm->m == 4) {
        PAR_FN(par_compress_forward)(s->icmp, s->icmp_raw, s->icmp_rstd, s->ica, s->icz, pos,
                                     W->idx_cmp_norm, dm->rope, 0, T, dm->ihd, 4, dm->norm_eps);
        if ((st = PAR_FN(par_indexer_select)(s->sel, s->iq, s->iw, s->icmp, pos, dm, 0, T)))
            return st;
        if (selected)
            par_dev_copy(selected, s->sel, (size_t)(T * dm->topk) * sizeof(int32_t));
    }
    if ((st = PAR_FN(par_attn_core_forward)(s->o, s->lse, s->q, s->kv, s->cmp, s->sel, pos,
                                            W->attn_sink, dm, 0, T)))
        return st;
    PAR_FN(par_attn_out_forward)(y, s->r, s->o, W->wo_a, W->wo_b, dm, T);
    return PAR_OK;
}

/* ---- the backward, split into its input half (B) and weight half (W) ---- */

size_t PAR_FN(par_attn_keep_bytes)(const par_attn_dims *dm, int64_t T)
{
    const int64_t hd = dm->hd, nc = dm->m > 0 ? coff_of(dm) * hd : 0;
    const int64_t cm = dm->m > 0 ? hd : 0;
    return (size_t)(T * (dm->H * hd + hd + cm + 2 * nc)) * sizeof(par_real);
}

void PAR_FN(par_attn_keep_carve)(PAR_FN(par_attn_keep) *k, void *buf, const par_attn_dims *dm, int64_t T)
{
    const int64_t hd = dm->hd, nc = dm->m > 0 ? coff_of(dm) * hd : 0;
    par_real *p = buf;
    memset(k, 0, sizeof *k);
    par_dev_zero(buf, PAR_FN(par_attn_keep_bytes)(dm, T)); /* memset (core/device.h) */
    k->dq = p;
    k->dkv = p + T * dm->H * hd;
    if (dm->m > 0) {
        k->dcmp = k->dkv + T * hd;
        k->dca = k->dcmp + T * hd;
        k->dcz = k->dca + T * nc;
    }
}

/* par_attn_core_backward_kv over the whole batch into keep; in the bitwise
 * mode (host) keep->dcmp is backed by an order-free accumulator for the
 * call, then rounded into it (the serial form of what context parallelism
 * merges over ranks). */
static par_status entries_kv_backward(PAR_FN(par_attn_keep) *keep, const par_real *dop, const par_real *Dd,
                                      const PAR_FN(par_attn_saved) *s, const int32_t *pos, const par_attn_dims *dm,
                                      int64_t T)
{
    const int64_t m = dm->m, n = T * dm->hd;
    par_racc acc = {0};
    const int exact = m > 0 && dm->bitwise && n > 0 && !par_dev_gpu();
    par_status st = exact ? par_racc_init(&acc, (size_t)n) : PAR_OK;
    if (!st && exact && (st = par_racc_register(keep->dcmp, (size_t)n, sizeof(par_real), &acc)))
        par_racc_free(&acc);
    if (st)
        return st;
    PAR_FN(par_attn_core_backward_kv)(keep->dkv, m > 0 ? keep->dcmp : NULL, dop, Dd, s->lse, s->q, s->kv, s->cmp,
                                      s->sel, pos, dm, 0, T, T);
    if (exact) {
        par_racc_unregister(keep->dcmp);
        for (int64_t i = 0; i < n; i++)
            keep->dcmp[i] = (par_real)par_racc_value(&acc, (size_t)i);
        par_racc_free(&acc);
    }
    return PAR_OK;
}

par_status PAR_FN(par_attn_backward_input)(par_real *dx, par_real *dsink, PAR_FN(par_attn_keep) *keep,
                                           const par_real *dy, const PAR_FN(par_attn_saved) *saved,
                                           const par_real *x, const int32_t *pos,
                                           const PAR_FN(par_attn_weights) *W, const par_attn_dims *dm,
                                           int64_t T)
{
    par_status st = PAR_FN(par_attn_check_dims)(dm);
    if (st)
        return st;
    PAR_HOST_READ(pos, T);
    if ((st = check_pos(pos, T)))
        return st;
    const PAR_FN(par_attn_saved) *s = saved;
    const int64_t H = dm->H, hd = dm->hd, m = dm->m;
    /* scratch: dO, dop [T,H*hd]; Dd [T,H]; the copies of dq, dkv that the
     * projections' backward consumes */
    size_t n = (size_t)(3 * T * H * hd + T * H + T * hd);
    par_real *buf = par_calloc(n, sizeof(par_real), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "attention backward: scratch of %zu reals", n);
    par_real *dO = buf, *dop = dO + T * H * hd, *Dd = dop + T * H * hd, *dq = Dd + T * H, *dkv = dq + T * H * hd;

    if ((st = PAR_FN(par_attn_out_backward)(dO, NULL, NULL, dy, s->r, s->o, W->wo_a, W->wo_b, dm, T)))
        goto fail_free_scratch;
    if ((st = PAR_FN(par_attn_core_backward_q)(keep->dq, dsink, dop, Dd, dO, s->lse, s->q, s->kv, s->cmp,
                                               s->sel, pos, W->attn_sink, dm, 0, T)))
        goto fail_free_scratch;
    if ((st = entries_kv_backward(keep, dop, Dd, s, pos, dm, T)))
        goto fail_free_scratch;
    if (m > 0 && (st = PAR_FN(par_compress_backward)(keep->dca, keep->dcz, NULL, keep->dcmp, s->cmp_raw,
                                                     s->cmp_rstd, s->ca, s->cz, pos, W->cmp_norm, dm->rope, 0,
                                                     T, hd, m)))
        goto fail_free_scratch;
    if (dx) {
        par_dev_copy(dq, keep->dq, (size_t)(T * H * hd) * sizeof *dq); /* memcpy (core/device.h) */
        par_dev_copy(dkv, keep->dkv, (size_t)(T * hd) * sizeof *dkv);
        st = PAR_FN(par_attn_proj_backward)(dx, NULL, dq, dkv, keep->dca, keep->dcz, s, x, pos, W, dm, T);
    }
fail_free_scratch:
    par_free(buf);
    return st;
}

par_status PAR_FN(par_attn_backward_weights)(PAR_FN(par_attn_weights) *dW, PAR_FN(par_attn_keep) *keep,
                                             const par_real *dy, const PAR_FN(par_attn_saved) *saved,
                                             const par_real *x, const int32_t *pos,
                                             const PAR_FN(par_attn_weights) *W, const par_attn_dims *dm,
                                             int64_t T)
{
    const PAR_FN(par_attn_saved) *s = saved;
    par_status st;
    if (!dW)
        return PAR_OK;
    PAR_FN(par_attn_weights) g = *dW;
    g.attn_sink = NULL; /* the input half's */
    if ((st = PAR_FN(par_attn_out_backward)(NULL, g.wo_a, g.wo_b, dy, s->r, s->o, W->wo_a, W->wo_b, dm, T)))
        return st;
    if (dm->m > 0 && g.cmp_norm &&
        (st = PAR_FN(par_compress_backward)(NULL, NULL, g.cmp_norm, keep->dcmp, s->cmp_raw, s->cmp_rstd, s->ca,
                                            s->cz, pos, W->cmp_norm, dm->rope, 0, T, dm->hd, dm->m)))
        return st;
    return PAR_FN(par_attn_proj_backward)(NULL, &g, keep->dq, keep->dkv, keep->dca, keep->dcz, s, x, pos, W, dm, T);
}

par_status PAR_FN(par_attn_backward)(par_real *dx,                    /* [T, d] or NULL */
                                     PAR_FN(par_attn_weights) *dW,    /* or NULL */
                                     const par_real *dy,              /* [T, d] */
                                     const PAR_FN(par_attn_saved) *saved,
                                     const par_real *x,               /* [T, d] */
                                     const int32_t *pos,              /* [T] */
                                     const PAR_FN(par_attn_weights) *W,
                                     const par_attn_dims *dm, int64_t T)
{
    par_status st = PAR_FN(par_attn_check_dims)(dm);
    if (st)
        return st;
    void *kb = par_malloc(PAR_FN(par_attn_keep_bytes)(dm, T) + 64, PAR_TAG_ACT);
    if (!kb)
        return par_err(PAR_ENOMEM, "attention backward: scratch for %lld tokens", (long long)T);
    PAR_FN(par_attn_keep) keep;
    PAR_FN(par_attn_keep_carve)(&keep, kb, dm, T);
    st = PAR_FN(par_attn_backward_input)(dx, dW ? dW->attn_sink : NULL, &keep, dy, saved, x, pos, W, dm, T);
    if (!st)
        st = PAR_FN(par_attn_backward_weights)(dW, &keep, dy, saved, x, pos, W, dm, T);
    par_free(kb);
    return st;
}
