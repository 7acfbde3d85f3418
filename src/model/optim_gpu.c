/* model/optim_gpu.c - Muon and the gradient norm on a device, batched
 * (docs/gpu.md "Launches"; templated; offload builds only).
 *
 * On a GPU every kernel loop is a launch, and Muon launches about 40 per
 * matrix (ten Newton-Schulz steps of three GEMMs and two scalings, the norm,
 * the update): 620,140 launches in a v4-mini step, 95 % of them the
 * optimizer's, for matrices of a few thousand elements (the experts).  Here
 * the Muon matrices of one shape (a layer's experts, w1 and w3 together) go
 * through each launch together, and the gradient norm's per-parameter sums
 * through one launch.  Every element's operations are those of model/optim.c
 * (par_muon_update, par_muon_orthogonalize, par_sumsq, the device GEMM), so
 * each matrix gets the bits of its own unbatched run.  Used when kernels use
 * device memory (par_dev_device_mode(): a real or the emulated device, outside
 * host mode); the CPU build and host mode keep model/optim.c's loops.
 */
#include "model/optim.h"

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/device.h"
#include "kernels/offload.h"
#include "model/optim-impl.h"

/* the workspace of one batch at most (a group larger than this goes in parts) */
#define BATCH_MAX_BYTES ((size_t)256 << 20)

/* A batch: nb Muon matrices [rows, cols] at element offsets off[] of the
 * parameter / momentum / gradient buffers, relative to lo; r <= c their
 * orientation (transposed when rows > cols). */
typedef struct {
    int64_t rows, cols, r, c, n, nn, nb, lo, span;
    int tr;
    int64_t *off;                  /* [nb] */
    double *s;                     /* [nb]: sums of squares, then 1 / (norm + eps) */
    par_real *U, *X, *Y, *A, *B;   /* nb x [n], [n], [n], [nn], [nn] */
} batch;

/* U = mu m + g (m updated), per matrix as par_muon_update */
static void momentum(const batch *bt, par_real *m, const par_real *g, double gscale, double mu)
{
    PAR_DEV_BEGIN();
    const int64_t nb = bt->nb, n = bt->n;
    const int64_t *off = PAR_DIN_AS(bt->off, nb);
    const par_real *gd = PAR_DIN_AS(g + bt->lo, bt->span);
    par_real *md = PAR_DINOUT_AS(m + bt->lo, bt->span), *Ud = PAR_DOUT_AS(bt->U, nb * n);
    PAR_KLOOP(collapse(2) is_device_ptr(off, gd, md, Ud))
    for (int64_t q = 0; q < nb; q++)
        for (int64_t i = 0; i < n; i++) {
            const int64_t k = off[q] + i;
            double G = (double)scaled(gd[k], gscale);
            md[k] = (par_real)(mu * (double)md[k] + G);
            Ud[q * n + i] = (par_real)(mu * (double)md[k] + G);
        }
}

/* X = U / (||U||_F + eps), transposed when rows > cols; ||U|| in index order
 * on one device thread per matrix (par_sumsq's order) */
static void normalize(const batch *bt)
{
    PAR_DEV_BEGIN();
    const int64_t nb = bt->nb, n = bt->n, rows = bt->rows, cols = bt->cols, c = bt->c;
    {
        const par_real *Ud = PAR_DIN_AS(bt->U, nb * n);
        double *sd = PAR_DOUT_AS(bt->s, nb);
        PAR_KLOOP(is_device_ptr(Ud, sd))
        for (int64_t q = 0; q < nb; q++) {
            double a = 0.0;
            for (int64_t i = 0; i < n; i++)
                a += (double)Ud[q * n + i] * (double)Ud[q * n + i];
            sd[q] = a;
        }
    }
    PAR_HOST_READ(bt->s, nb);
    PAR_HOST_WRITE(bt->s, nb);
    for (int64_t q = 0; q < nb; q++) /* par_muon_orthogonalize's expression, on the host */
        bt->s[q] = 1.0 / (sqrt(bt->s[q]) + PAR_MUON_NORM_EPS);
    const double *inv = PAR_DIN_AS(bt->s, nb);
    const par_real *Ud = PAR_DIN_AS(bt->U, nb * n);
    par_real *Xd = PAR_DOUT_AS(bt->X, nb * n);
    if (bt->tr) {
        PAR_KLOOP(collapse(3) is_device_ptr(inv, Ud, Xd))
        for (int64_t q = 0; q < nb; q++)
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++)
                    Xd[q * n + j * c + i] = (par_real)((double)Ud[q * n + i * cols + j] * inv[q]);
    } else {
        PAR_KLOOP(collapse(2) is_device_ptr(inv, Ud, Xd))
        for (int64_t q = 0; q < nb; q++)
            for (int64_t i = 0; i < n; i++)
                Xd[q * n + i] = (par_real)((double)Ud[q * n + i] * inv[q]);
    }
}

/* dst[i] = k * src[i], i < count (ns_step's scalings) */
static void scale_into(par_real *dst, const par_real *src, int64_t count, double k)
{
    PAR_DEV_BEGIN();
    const par_real *sd = PAR_DIN_AS(src, count);
    par_real *dd = PAR_DOUT_AS(dst, count);
    PAR_KLOOP(is_device_ptr(sd, dd))
    for (int64_t i = 0; i < count; i++)
        dd[i] = (par_real)(k * (double)sd[i]);
}

/* one Newton-Schulz step of every matrix: model/optim.c ns_step, batched */
static void ns_step(const batch *bt, const double k[3])
{
    const int64_t r = bt->r, c = bt->c, n = bt->n, nn = bt->nn, nb = bt->nb;
    PAR_FN(par__gemm_device_batch)(0, 1, r, r, c, (par_real)1, bt->X, c, n, bt->X, c, n, (par_real)0,
                                   bt->A, r, nn, nb);
    scale_into(bt->B, bt->A, nb * nn, k[1]);
    PAR_FN(par__gemm_device_batch)(0, 0, r, r, r, (par_real)k[2], bt->A, r, nn, bt->A, r, nn, (par_real)1,
                                   bt->B, r, nn, nb);
    scale_into(bt->Y, bt->X, nb * n, k[0]);
    PAR_FN(par__gemm_device_batch)(0, 0, r, c, r, (par_real)1, bt->B, r, nn, bt->X, c, n, (par_real)1,
                                   bt->Y, c, n, nb);
    par_dev_copy(bt->X, bt->Y, (size_t)(nb * n) * sizeof *bt->X);
}

/* w = w decay - step O, O the orthogonalized X (transposed back) */
static void apply(const batch *bt, par_real *w, double decay, double step)
{
    PAR_DEV_BEGIN();
    const int64_t nb = bt->nb, n = bt->n, rows = bt->rows, cols = bt->cols, c = bt->c;
    const int64_t *off = PAR_DIN_AS(bt->off, nb);
    const par_real *Xd = PAR_DIN_AS(bt->X, nb * n);
    par_real *wd = PAR_DINOUT_AS(w + bt->lo, bt->span);
    if (bt->tr) {
        PAR_KLOOP(collapse(3) is_device_ptr(off, Xd, wd))
        for (int64_t q = 0; q < nb; q++)
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++) {
                    const int64_t k = off[q] + i * cols + j;
                    wd[k] = (par_real)((double)wd[k] * decay - step * (double)Xd[q * n + j * c + i]);
                }
    } else {
        PAR_KLOOP(collapse(2) is_device_ptr(off, Xd, wd))
        for (int64_t q = 0; q < nb; q++)
            for (int64_t i = 0; i < n; i++) {
                const int64_t k = off[q] + i;
                wd[k] = (par_real)((double)wd[k] * decay - step * (double)Xd[q * n + i]);
            }
    }
}

/* The batch of the nb matrices idx[0..nb) (one shape) of table t: offsets and workspace */
static par_status batch_open(batch *bt, const par_param_table *t, const int64_t *loc, const int *idx, int64_t nb)
{
    const par_param *p0 = &t->p[idx[0]];
    memset(bt, 0, sizeof *bt);
    bt->rows = p0->shape[0], bt->cols = p0->shape[1], bt->nb = nb;
    if (bt->rows < 1 || bt->cols < 1)
        return par_err(PAR_EINVAL, "muon: matrix shape [%lld, %lld] must be positive", (long long)bt->rows,
                       (long long)bt->cols);
    bt->tr = bt->rows > bt->cols;
    bt->r = bt->tr ? bt->cols : bt->rows, bt->c = bt->tr ? bt->rows : bt->cols;
    bt->n = bt->r * bt->c, bt->nn = bt->r * bt->r;
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t q = 0; q < nb; q++) {
        const int64_t o = loc[idx[q]];
        lo = o < lo ? o : lo;
        hi = o + bt->n > hi ? o + bt->n : hi;
    }
    bt->lo = lo, bt->span = hi - lo;
    bt->off = par_malloc((size_t)nb * sizeof *bt->off, PAR_TAG_OPTIM);
    bt->s = par_malloc((size_t)nb * sizeof *bt->s, PAR_TAG_OPTIM);
    bt->U = par_malloc((size_t)(nb * (3 * bt->n + 2 * bt->nn)) * sizeof *bt->U, PAR_TAG_OPTIM);
    if (!bt->off || !bt->s || !bt->U) {
        par_free(bt->off), par_free(bt->s), par_free(bt->U);
        return par_err(PAR_ENOMEM, "muon: no memory for a batch of %lld [%lld, %lld] matrices", (long long)nb,
                       (long long)bt->rows, (long long)bt->cols);
    }
    bt->X = bt->U + nb * bt->n, bt->Y = bt->X + nb * bt->n, bt->A = bt->Y + nb * bt->n;
    bt->B = bt->A + nb * bt->nn;
    for (int64_t q = 0; q < nb; q++)
        bt->off[q] = loc[idx[q]] - lo;
    return PAR_OK;
}

static void batch_close(batch *bt)
{
    par_free(bt->off), par_free(bt->s), par_free(bt->U);
}

/* Muon on the matrices idx[0..nb) of one shape and one weight-decay flag:
 * par_muon_update's steps, each launch over all of them */
static par_status muon_batch(par_real *params, par_real *m, const par_real *grads, const par_param_table *t,
                             const int64_t *loc, const int *idx, int64_t nb, const par_config *cfg, double gscale)
{
    batch bt;
    par_status st = batch_open(&bt, t, loc, idx, nb);
    if (st)
        return st;
    momentum(&bt, m, grads, gscale, cfg->mu);
    normalize(&bt);
    for (int s = 0; s < NS_MAIN_STEPS; s++)
        ns_step(&bt, ns_main);
    for (int s = 0; s < NS_TAIL_STEPS; s++)
        ns_step(&bt, ns_tail);
    const double lr = cfg->lr, wd = t->p[idx[0]].weight_decay ? cfg->wd : 0.0;
    const double step = lr * PAR_MUON_SCALE * sqrt((double)(bt.rows > bt.cols ? bt.rows : bt.cols));
    apply(&bt, params, 1.0 - lr * wd, step);
    batch_close(&bt);
    return PAR_OK;
}

/* 1 when parameter j is a Muon matrix batched with i (same shape, same decay) */
static int same_batch(const par_param *a, const par_param *b)
{
    return b->dtype == PAR_PDT_REAL && b->opt == PAR_OPT_MUON && b->shape[0] == a->shape[0] &&
           b->shape[1] == a->shape[1] && !b->weight_decay == !a->weight_decay;
}

/* Muon's matrices in batches (first appearance order, at most BATCH_MAX_BYTES of workspace each) */
static par_status muon_all(par_real *params, par_real *m, const par_real *grads, const par_param_table *t,
                           const int64_t *loc, const par_config *cfg, double gscale)
{
    int *idx = par_malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *idx, PAR_TAG_OPTIM);
    char *done = par_calloc((size_t)(t->n > 0 ? t->n : 1), 1, PAR_TAG_OPTIM);
    par_status st = idx && done ? PAR_OK : par_err(PAR_ENOMEM, "muon: no memory for %d batch indices", t->n);
    for (int i = 0; !st && i < t->n; i++) {
        const par_param *p = &t->p[i];
        if (done[i] || loc[i] < 0 || p->dtype != PAR_PDT_REAL || p->opt != PAR_OPT_MUON)
            continue;
        const size_t one = (size_t)(5 * p->numel) * sizeof(par_real) + 16;
        const int64_t cap = BATCH_MAX_BYTES / one > 0 ? (int64_t)(BATCH_MAX_BYTES / one) : 1;
        int64_t nb = 0;
        for (int j = i; j < t->n && nb < cap; j++)
            if (!done[j] && loc[j] >= 0 && same_batch(p, &t->p[j]))
                idx[nb++] = j, done[j] = 1;
        st = muon_batch(params, m, grads, t, loc, idx, nb, cfg, gscale); /* the rest of a full one: later */
    }
    par_free(done);
    par_free(idx);
    return st;
}

par_status PAR_FN(par_optim_gpu_apply)(par_real *params, par_real *m, par_real *v, const par_real *grads,
                                       const par_param_table *t, const int64_t *loc, const par_config *cfg,
                                       int64_t step, double gscale)
{
    for (int i = 0; i < t->n; i++) { /* AdamW (one launch a tensor already), unknown kinds' errors */
        const par_param *p = &t->p[i];
        if (loc[i] < 0 || p->dtype != PAR_PDT_REAL || p->opt == PAR_OPT_MUON)
            continue;
        const int64_t o = loc[i];
        par_status st = PAR_FN(par_optim_apply_param)(params + o, m + o, v + o, grads + o, t, i, cfg, step, gscale);
        if (st)
            return st;
    }
    return muon_all(params, m, grads, t, loc, cfg, gscale);
}

int PAR_FN(par_optim_gpu_sumsq)(double *sums, const par_real *x, const int64_t *loc, const int64_t *len, int n)
{
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < n; i++)
        if (loc[i] >= 0 && len[i] > 0) {
            lo = loc[i] < lo ? loc[i] : lo;
            hi = loc[i] + len[i] > hi ? loc[i] + len[i] : hi;
        }
    int64_t *sp = par_malloc((size_t)(2 * (n > 0 ? n : 1)) * sizeof *sp, PAR_TAG_OPTIM);
    if (!sp) /* no memory for the index: not batched */
        return 0;
    for (int i = 0; i < n; i++) {
        const int on = loc[i] >= 0 && len[i] > 0;
        sp[2 * i] = on ? loc[i] - lo : 0, sp[2 * i + 1] = on ? len[i] : 0;
    }
    if (hi <= lo)
        lo = hi = 0;
    PAR_DEV_BEGIN();
    const int64_t *spd = PAR_DIN_AS(sp, 2 * n);
    const par_real *xd = PAR_DIN_AS(x + lo, hi - lo);
    double *sd = PAR_DOUT_AS(sums, n);
    PAR_KLOOP(is_device_ptr(spd, xd, sd)) /* one thread a tensor: par_sumsq's index order */
    for (int q = 0; q < n; q++) {
        double a = 0.0;
        for (int64_t i = 0; i < spd[2 * q + 1]; i++)
            a += (double)xd[spd[2 * q] + i] * (double)xd[spd[2 * q] + i];
        sd[q] = a;
    }
    PAR_HOST_READ(sums, n);
    par_free(sp);
    return 1;
}

#else
typedef int par__optim_gpu_none; /* the CPU build: model/optim.c's loops only */
#endif
