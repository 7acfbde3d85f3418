/* kernels/compressor.c - phase (2) of the attention layer: pooling of
 * complete blocks into compressed entries (MODEL.md section 3, Compressor).
 *
 * Slot order of a block i (fixed, it sets the summation order): for m == 4
 * first the m slots of block i-1 (channels [0, c) of a/z), then the m slots
 * of block i (channels [c, 2c)); for m != 4 the m slots of block i.  Block 0
 * of an m == 4 layer has only its own m slots (the reference fills the
 * previous ones with a = 0, z = -inf: weight 0).
 */
#include "kernels/attention.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/pmath.h"
#include "kernels/gsum.h"
#include "kernels/offload.h"
#include "kernels/ops.h"

PAR_DECLARE_TARGET /* the per-block pieces run inside device loops */
/* The slots of one channel `ch` of the block that ends at row t (position
 * p): slot s < nprev is row b - m + s, column ch (block i-1, m == 4 only);
 * slot s >= nprev is row b + s - nprev, column ccur. */
typedef struct {
    int64_t b;     /* first row of block i            */
    int64_t nprev; /* 0 or m                          */
    int64_t ns;    /* nprev + m                       */
    int64_t ccur;  /* column of the block's own slots */
} slot_set;

static slot_set slots_of(int64_t t, int64_t p, int64_t ch, int64_t c, int64_t m)
{
    slot_set s;
    s.b = t - m + 1;
    s.nprev = (m == 4 && p + 1 >= 2 * m) ? m : 0;
    s.ns = s.nprev + m;
    s.ccur = m == 4 ? c + ch : ch;
    return s;
}

static inline int64_t slot_index(const slot_set *s, int64_t k, int64_t ch, int64_t m,
                                 int64_t ac)
{
    if (k < s->nprev)
        return (s->b - m + k) * ac + ch;
    return (s->b + k - s->nprev) * ac + s->ccur;
}

/* max and sum of exp(z - max) over the slots */
static void slot_softmax_stats(par_real *mx, par_real *sum, const slot_set *s, const par_real *z,
                               int64_t ch, int64_t m, int64_t ac)
{
    par_real mv = z[slot_index(s, 0, ch, m, ac)];
    for (int64_t k = 1; k < s->ns; k++) {
        par_real v = z[slot_index(s, k, ch, m, ac)];
        if (v > mv)
            mv = v;
    }
    par_real sm = 0;
    for (int64_t k = 0; k < s->ns; k++)
        sm += (par_real)par_pmath_exp((double)(z[slot_index(s, k, ch, m, ac)] - mv));
    *mx = mv;
    *sum = sm;
}

PAR_END_DECLARE_TARGET

void PAR_FN(par_compress_forward)(par_real *cmp,        /* [T, c] */
                                  par_real *raw,        /* [T, c] */
                                  par_real *rstd,       /* [T] */
                                  const par_real *a,    /* [T, coff*c] */
                                  const par_real *z,    /* [T, coff*c] */
                                  const int32_t *pos,   /* [T] */
                                  const par_real *norm, /* [c] */
                                  const par_rope *rope, int64_t t0, int64_t t1,
                                  int64_t c, int64_t m, double eps)
{
    const int64_t ac = (m == 4 ? 2 : 1) * c;
    PAR_DEV_BEGIN();
    PAR_DIN(a, t1 * ac); /* block rows before t0 may be read (m == 4: block i-1) */
    PAR_DIN(z, t1 * ac);
    PAR_DIN(pos, t1);
    PAR_DIN(norm, c);
    PAR_DIN(rope, 1);
    PAR_DINOUT(cmp, t1 * c);
    PAR_DINOUT(raw, t1 * c);
    PAR_DINOUT(rstd, t1);
    PAR_KLOOP_PAR((t1 - t0) * ac * m >= PAR_ATTN_OMP_MIN_WORK,
                  is_device_ptr(cmp, raw, rstd, a, z, pos, norm, rope))
    for (int64_t t = t0; t < t1; t++) {
        int64_t p = pos[t];
        if ((p + 1) % m != 0) {
            memset(raw + t * c, 0, (size_t)c * sizeof(par_real));
            memset(cmp + t * c, 0, (size_t)c * sizeof(par_real));
            rstd[t] = 0;
            continue;
        }
        for (int64_t ch = 0; ch < c; ch++) {
            slot_set s = slots_of(t, p, ch, c, m);
            par_real mx, sum;
            slot_softmax_stats(&mx, &sum, &s, z, ch, m, ac);
            par_real acc = 0;
            for (int64_t k = 0; k < s.ns; k++) {
                int64_t ix = slot_index(&s, k, ch, m, ac);
                par_real w = (par_real)par_pmath_exp((double)(z[ix] - mx)) / sum;
                acc += w * a[ix];
            }
            raw[t * c + ch] = acc;
        }
        PAR_FN(par_rmsnorm_row)(cmp + t * c, rstd + t, raw + t * c, norm, c, eps);
        int32_t pe = (int32_t)(p + 1 - m); /* i*m */
        PAR_FN(par_rope_row)(cmp + t * c, (double)pe, rope, 1, c, 1.0);
    }
}

par_status PAR_FN(par_compress_backward)(par_real *da,          /* [T, coff*c] or NULL */
                                         par_real *dz,          /* [T, coff*c] or NULL */
                                         par_real *dnorm,       /* [c] or NULL */
                                         const par_real *dcmp,  /* [T, c] */
                                         const par_real *raw,   /* [T, c] */
                                         const par_real *rstd,  /* [T] */
                                         const par_real *a,     /* [T, coff*c] */
                                         const par_real *z,     /* [T, coff*c] */
                                         const int32_t *pos,    /* [T] */
                                         const par_real *norm,  /* [c] */
                                         const par_rope *rope, int64_t t0, int64_t t1,
                                         int64_t c, int64_t m)
{
    const int64_t ac = (m == 4 ? 2 : 1) * c;
    par_real *g = par_malloc(2 * (size_t)c * sizeof(par_real), PAR_TAG_ACT);
    if (!g)
        return par_err(PAR_ENOMEM, "compress_backward: scratch of %lld reals", (long long)(2 * c));
    PAR_DEV_BEGIN();
    void *g_host = g;
    PAR_DIN(dcmp, t1 * c);
    PAR_DIN(raw, t1 * c);
    PAR_DIN(rstd, t1);
    PAR_DIN(a, t1 * ac);
    PAR_DIN(z, t1 * ac);
    PAR_DIN(pos, t1);
    PAR_DIN(norm, c);
    PAR_DIN(rope, 1);
    PAR_DINOUT(da, t1 * ac);
    PAR_DINOUT(dz, t1 * ac);
    PAR_DINOUT(dnorm, c);
    PAR_DOUT(g, 2 * c);
    par_real *draw = g + c;
    /* Serial over rows (ascending t): dnorm is summed in that order; the
     * (row, column) slots of different blocks never overlap, so da/dz too
     * get one contribution per element.  On a device: one thread. */
    /* the bitwise mode (host only): each row's dnorm term deposited */
    const par_racc_view vn = PAR_ON_DEVICE() ? (par_racc_view){NULL, 0} : par_gsum_of(dnorm, c);
    par_real *dn = vn.acc ? NULL : dnorm;
    /* ... through per-row scratch, deposited after the loop (no host call in a target region) */
    par_real *dnr = vn.acc ? par_calloc((size_t)((t1 - t0) * c + 1), sizeof *dnr, PAR_TAG_ACT) : NULL;
    if (vn.acc && !dnr) {
        par_free(g_host);
        return par_err(PAR_ENOMEM, "compressor backward: %lld rows of norm terms", (long long)(t1 - t0));
    }
    /* dnr: NULL on a device (host memory, used only by the host's run of the loop) */
    PAR_KSERIAL(is_device_ptr(g, draw, da, dz, dn, dnr, dcmp, raw, rstd, a, z, pos, norm, rope))
    for (int64_t t = t0; t < t1; t++) {
        int64_t p = pos[t];
        if ((p + 1) % m != 0)
            continue;
        memcpy(g, dcmp + t * c, (size_t)c * sizeof(par_real));
        int32_t pe = (int32_t)(p + 1 - m);
        PAR_FN(par_rope_row)(g, (double)pe, rope, 1, c, -1.0);
        memset(draw, 0, (size_t)c * sizeof(par_real));
        PAR_FN(par_rmsnorm_row_backward)(draw, dnr ? dnr + (t - t0) * c : dn, g, raw + t * c, norm, rstd[t], c);
        for (int64_t ch = 0; ch < c; ch++) {
            slot_set s = slots_of(t, p, ch, c, m);
            par_real mx, sum;
            slot_softmax_stats(&mx, &sum, &s, z, ch, m, ac);
            par_real C = raw[t * c + ch], gc = draw[ch];
            for (int64_t k = 0; k < s.ns; k++) {
                int64_t ix = slot_index(&s, k, ch, m, ac);
                par_real w = (par_real)par_pmath_exp((double)(z[ix] - mx)) / sum;
                if (da)
                    da[ix] += w * gc;
                if (dz)
                    dz[ix] += w * (a[ix] - C) * gc;
            }
        }
    }
    for (int64_t i = 0; dnr && i < (t1 - t0) * c; i++) /* a term per row (rows without an entry: zeros) */
        par_gsum_put(vn, i % c, (double)dnr[i]);
    par_free(dnr);
    par_free(g_host);
    return PAR_OK;
}
