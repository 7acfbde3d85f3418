/* kernels/ops.c - basic forward/backward pairs (see kernels/ops.h).
 *
 * Compiled once per precision (kernels/real.h).  Reductions (row sums,
 * weight-gradient sums) run in a fixed order and accumulate in double in both
 * precisions; element-wise nonlinearities are evaluated in double and rounded
 * once to the working precision.  A backward kernel first forms its whole
 * contribution to a gradient element, then adds it once (g += contribution),
 * so the result does not depend on how that contribution was summed into g.
 */
#include "kernels/ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/counters.h"
#include "core/log.h"
#include "kernels/offload.h"

#if PAR_REAL_BITS == 64
#define PAR_GEMM cblas_dgemm
#else
#define PAR_GEMM cblas_sgemm
#endif

/* ---------------------------------------------------------------- scalars */

PAR_DECLARE_TARGET
/* d silu / dx = s (1 + x (1 - s)) */
static inline double silu_grad_d(double x)
{
    double s = par_sigmoid(x);
    return s * (1.0 + x * (1.0 - s));
}
PAR_END_DECLARE_TARGET

/* ------------------------------------------------------------------- gemm */

/* Tiles of the padded GEMM.  OpenBLAS's micro-kernels take rows in blocks
 * of GEMM_UNROLL_M (4 for double on Haswell/Zen, up to 16 on Skylake-X);
 * rows left over at the end of M go through other kernels whose sums can
 * round differently (measured here: OpenBLAS 0.3.21 on Zen, dgemm, the last
 * row of every odd M differs in the last bits from the same row in an even
 * batch).  And OpenBLAS's SkylakeX / Cooperlake / SapphireRapids cores take
 * a "small matrix" kernel when M N K is small, another path with other bits
 * (measured here, OpenBLAS 0.3.21, Cooperlake core, K = 300, N = 130: a
 * 48-row GEMM and three 16-row ones differ in 85 of 6,240 elements; so do
 * the columns of a TP-split head against the whole one).  So an element's
 * bits must not depend on M or N: every call is one [16, 16, K] tile, the
 * same shape -- the same kernel -- for every row and column of every GEMM.
 * Tail rows and columns go through a tile padded with zeros (A's rows, B's
 * columns) whose extra outputs are dropped.  On the Haswell and Zen cores an
 * element's bits were already independent of M and N for full blocks, so
 * there the tiling changes no number (docs/kernels.md). */
#define GEMM_ROW_BLOCK 16
#define GEMM_COL_BLOCK 16
_Static_assert(GEMM_ROW_BLOCK == GEMM_COL_BLOCK, "opnd_pad pads both operands to 16 K reals");
/* Scratch for the padded tails kept on the stack up to this many reals: the
 * 16 x 16 output tile and both tails up to K = 16 (6 KiB in f64); more comes
 * from the heap.  A rank's stack is small (the fiber backend runs thousands
 * of them) and the BLAS kernel below this frame takes its own ~32 KiB
 * (OpenBLAS's Haswell dgemm kernel, page-aligned), so a large array here
 * (it was 4,096 reals, 32 KiB) deepens every rank's stack by its size:
 * measured at config-c's shape, 512 fiber ranks, 76 -> 48 KiB deepest use. */
#define GEMM_PAD_STACK 768

static void gemm_raw(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                     const par_real *A, int64_t lda, const par_real *B, int64_t ldb, par_real beta,
                     par_real *C, int64_t ldc)
{
    PAR_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
             (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C,
             (blasint)ldc);
}

/* One operand's view: t is its BLAS transpose flag; the tile index (a row
 * of op(A), a column of op(B)) i starts at p + i when contig (A under ta,
 * B without tb), else at p + i * ld, its K values contiguous. */
typedef struct {
    const par_real *p;
    int64_t ld;
    int t, contig;
} gemm_opnd;

static gemm_opnd opnd_at(gemm_opnd o, int64_t i)
{
    o.p = o.contig ? o.p + i : o.p + i * o.ld;
    return o;
}

/* The tail of n < 16 tile indices from i, copied into pad (16 K reals) with
 * zeros after it: [16, K] (ld K) or, contig, [K, 16] (ld 16). */
static gemm_opnd opnd_pad(gemm_opnd o, int64_t i, int64_t n, int64_t K, par_real *pad)
{
    const int64_t RB = GEMM_ROW_BLOCK;
    const par_real *src = opnd_at(o, i).p;
    memset(pad, 0, (size_t)(RB * K) * sizeof(par_real));
    if (!o.contig) {
        for (int64_t r = 0; r < n; r++)
            memcpy(pad + r * K, src + r * o.ld, (size_t)K * sizeof(par_real));
        return (gemm_opnd){pad, K, o.t, 0};
    }
    for (int64_t k = 0; k < K; k++)
        for (int64_t r = 0; r < n; r++)
            pad[k * RB + r] = src[k * o.ld + r];
    return (gemm_opnd){pad, RB, o.t, 1};
}

/* C's tile [rows, cols] at C from tile operands a, b: in place when whole,
 * else through the scratch c2 [16, 16]. */
static void gemm_tile(gemm_opnd a, gemm_opnd b, int64_t rows, int64_t cols, int64_t K, par_real alpha,
                      par_real beta, par_real *C, int64_t ldc, par_real *c2)
{
    const int64_t RB = GEMM_ROW_BLOCK, CB = GEMM_COL_BLOCK;
    if (rows == RB && cols == CB) {
        gemm_raw(a.t, b.t, RB, CB, K, alpha, a.p, a.ld, b.p, b.ld, beta, C, ldc);
        return;
    }
    memset(c2, 0, (size_t)(RB * CB) * sizeof(par_real));
    if (beta != 0)
        for (int64_t i = 0; i < rows; i++)
            memcpy(c2 + i * CB, C + i * ldc, (size_t)cols * sizeof(par_real));
    gemm_raw(a.t, b.t, RB, CB, K, alpha, a.p, a.ld, b.p, b.ld, beta, c2, CB);
    for (int64_t i = 0; i < rows; i++)
        memcpy(C + i * ldc, c2 + i * CB, (size_t)cols * sizeof(par_real));
}

/* C = alpha op(A) op(B) + beta C tile by tile (K > 0). */
static par_status gemm_tiled(gemm_opnd A, gemm_opnd B, int64_t M, int64_t N, int64_t K, par_real alpha,
                             par_real beta, par_real *C, int64_t ldc)
{
    const int64_t RB = GEMM_ROW_BLOCK, CB = GEMM_COL_BLOCK;
    int64_t mt = M % RB, nt = N % CB;
    int64_t need = (mt ? RB * K : 0) + (nt ? CB * K : 0) + RB * CB;
    par_real stack_buf[GEMM_PAD_STACK];
    par_real *buf = need > GEMM_PAD_STACK ? par_malloc((size_t)need * sizeof(par_real), PAR_TAG_ACT) : stack_buf;
    if (!buf)
        return PAR_ENOMEM;
    par_real *c2 = buf, *next = buf + RB * CB;
    gemm_opnd Bt = B, At = A;
    if (nt) {
        Bt = opnd_pad(B, N - nt, nt, K, next);
        next += CB * K;
    }
    if (mt)
        At = opnd_pad(A, M - mt, mt, K, next);
    for (int64_t i = 0; i < M; i += RB) {
        int64_t rows = M - i < RB ? M - i : RB;
        gemm_opnd a = rows == RB ? opnd_at(A, i) : At;
        for (int64_t j = 0; j < N; j += CB) {
            int64_t cols = N - j < CB ? N - j : CB;
            gemm_opnd b = cols == CB ? opnd_at(B, j) : Bt;
            gemm_tile(a, b, rows, cols, K, alpha, beta, C + i * ldc + j, ldc, c2);
        }
    }
    if (buf != stack_buf)
        par_free(buf);
    return PAR_OK;
}

void PAR_FN(par_gemm)(int ta, int tb, int64_t M, int64_t N, int64_t K, par_real alpha,
                      const par_real *A, int64_t lda, const par_real *B, int64_t ldb, par_real beta,
                      par_real *C, int64_t ldc)
{
    if (M <= 0 || N <= 0)
        return;
    /* the emulated GPU's roofline (core/counters.h): 2MNK flops; A, B read, C written
     * (and read when beta != 0) */
    par_count_flops(2u * (uint64_t)M * (uint64_t)N * (uint64_t)(K > 0 ? K : 0));
    par_count_bytes(sizeof(par_real) * ((uint64_t)M * (uint64_t)(K > 0 ? K : 0) +
                                        (uint64_t)(K > 0 ? K : 0) * (uint64_t)N +
                                        (uint64_t)M * (uint64_t)N * (beta != 0 ? 2u : 1u)));
    if (PAR_GEMM_ON_DEVICE(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return; /* GPU mode: the offload build's device GEMM (kernels/gemm_device.c) */
    if (K <= 0) {
        /* Empty product: C = beta C (beta == 0 writes zeros, ignoring old C). */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = beta == 0 ? (par_real)0 : beta * C[i * ldc + j];
        return;
    }
    if (gemm_tiled((gemm_opnd){A, lda, ta, ta}, (gemm_opnd){B, ldb, tb, !tb}, M, N, K, alpha, beta, C, ldc)) {
        PAR_LOG_W("par_gemm: no memory for the padded tiles (K = %lld); computing it untiled "
                  "(its bits may differ from a batched row)", (long long)K);
        gemm_raw(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

/* ----------------------------------------------------------------- linear */

void PAR_FN(par_linear_forward)(par_real *out,      /* [T, N] */
                                const par_real *in, /* [T, K] */
                                const par_real *w,  /* [N, K] */
                                int64_t T, int64_t K, int64_t N)
{
    PAR_FN(par_gemm)(0, 1, T, N, K, 1, in, K, w, K, 0, out, N);
}

void PAR_FN(par_linear_backward)(par_real *din,        /* [T, K] or NULL */
                                 par_real *dw,         /* [N, K] or NULL */
                                 const par_real *dout, /* [T, N] */
                                 const par_real *in,   /* [T, K] */
                                 const par_real *w,    /* [N, K] */
                                 int64_t T, int64_t K, int64_t N)
{
    if (din)
        PAR_FN(par_gemm)(0, 0, T, K, N, 1, dout, N, w, K, 1, din, K);
    if (dw)
        PAR_FN(par_gemm)(1, 0, N, K, T, 1, dout, N, in, K, 1, dw, K);
}

/* ---------------------------------------------------------------- rmsnorm */

void PAR_FN(par_rmsnorm_forward)(par_real *out,      /* [T, D] */
                                 par_real *rstd,     /* [T] saved */
                                 const par_real *in, /* [T, D] */
                                 const par_real *w,  /* [D] or NULL */
                                 int64_t T, int64_t D, double eps)
{
    PAR_DEV_BEGIN();
    PAR_DIN(in, T * D); /* inputs first: out may be in (in place) */
    PAR_DIN(w, D);
    PAR_DOUT(out, T * D);
    PAR_DOUT(rstd, T);
    PAR_KLOOP(is_device_ptr(out, rstd, in, w))
    for (int64_t t = 0; t < T; t++)
        PAR_FN(par_rmsnorm_row)(out + t * D, rstd + t, in + t * D, w, D, eps);
}

/* Columns of dw handled per pass over the rows (a stack accumulator). */
#define RMS_DW_CHUNK 256

void PAR_FN(par_rmsnorm_backward)(par_real *din,        /* [T, D] or NULL */
                                  par_real *dw,         /* [D] or NULL */
                                  const par_real *dout, /* [T, D] */
                                  const par_real *in,   /* [T, D] the forward input */
                                  const par_real *w,    /* [D] or NULL */
                                  const par_real *rstd, /* [T] */
                                  int64_t T, int64_t D)
{
    /* y_j = w_j x_j r,  r = (mean(x^2) + eps)^-1/2,  dr/dx_k = -r^3 x_k / D:
     *   din_k = r w_k g_k - x_k r^3 mean_j(g_j w_j x_j)
     *   dw_j  = sum_t g_tj x_tj r_t */
    PAR_DEV_BEGIN();
    PAR_DIN(dout, T * D);
    PAR_DIN(in, T * D);
    PAR_DIN(w, D);
    PAR_DIN(rstd, T);
    PAR_DINOUT(din, T * D);
    PAR_DINOUT(dw, D);
    if (din) {
        PAR_KLOOP(is_device_ptr(din, dout, in, w, rstd))
        for (int64_t t = 0; t < T; t++) {
            const par_real *x = in + t * D, *g = dout + t * D;
            par_real *dx = din + t * D;
            double r = rstd[t];
            double dot = 0;
            for (int64_t j = 0; j < D; j++)
                dot += (double)g[j] * (w ? (double)w[j] : 1.0) * (double)x[j];
            double coef = r * r * r * dot / (double)D;
            for (int64_t j = 0; j < D; j++) {
                double wg = (double)g[j] * (w ? (double)w[j] : 1.0);
                dx[j] += (par_real)(r * wg - (double)x[j] * coef);
            }
        }
    }
    if (dw) {
        /* column j sums over t ascending in double: on the device one thread
         * per column (the same order); on the host in chunks of columns */
        if (PAR_ON_DEVICE()) {
            PAR_KLOOP(is_device_ptr(dw, dout, in, rstd))
            for (int64_t j = 0; j < D; j++) {
                double a = 0;
                for (int64_t t = 0; t < T; t++)
                    a += (double)dout[t * D + j] * (double)in[t * D + j] * (double)rstd[t];
                dw[j] += (par_real)a;
            }
            return;
        }
        double acc[RMS_DW_CHUNK];
        for (int64_t j0 = 0; j0 < D; j0 += RMS_DW_CHUNK) {
            int64_t nj = D - j0 < RMS_DW_CHUNK ? D - j0 : RMS_DW_CHUNK;
            for (int64_t j = 0; j < nj; j++)
                acc[j] = 0;
            for (int64_t t = 0; t < T; t++) {
                const par_real *x = in + t * D + j0, *g = dout + t * D + j0;
                double r = rstd[t];
                for (int64_t j = 0; j < nj; j++)
                    acc[j] += (double)g[j] * (double)x[j] * r;
            }
            for (int64_t j = 0; j < nj; j++)
                dw[j0 + j] += (par_real)acc[j];
        }
    }
}

/* -------------------------------------------------------------- embedding */

void PAR_FN(par_embedding_forward)(par_real *out,         /* [T, D] */
                                   const int32_t *ids,    /* [T] */
                                   const par_real *table, /* [V, D] */
                                   int64_t T, int64_t D)
{
    PAR_DEV_BEGIN();
    if (PAR_ON_DEVICE()) {
        PAR_HOST_READ(ids, T); /* the rows the table is read at */
        int64_t hi = 0;
        for (int64_t t = 0; t < T; t++)
            hi = ids[t] + 1 > hi ? ids[t] + 1 : hi;
        PAR_DIN(ids, T);
        PAR_DIN(table, hi * D);
        PAR_DOUT(out, T * D);
        PAR_KLOOP(is_device_ptr(out, ids, table) collapse(2))
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < D; j++)
                out[t * D + j] = table[(int64_t)ids[t] * D + j];
        return;
    }
    for (int64_t t = 0; t < T; t++)
        memcpy(out + t * D, table + (int64_t)ids[t] * D, (size_t)D * sizeof(par_real));
}

void PAR_FN(par_embedding_backward)(par_real *dtable,     /* [V, D] */
                                    const par_real *dout, /* [T, D] */
                                    const int32_t *ids,   /* [T] */
                                    int64_t T, int64_t D)
{
    PAR_DEV_BEGIN();
    if (PAR_ON_DEVICE()) {
        /* one thread per column, rows in ascending t: the host's order */
        PAR_HOST_READ(ids, T);
        int64_t hi = 0;
        for (int64_t t = 0; t < T; t++)
            hi = ids[t] + 1 > hi ? ids[t] + 1 : hi;
        PAR_DIN(ids, T);
        PAR_DIN(dout, T * D);
        PAR_DINOUT(dtable, hi * D);
        PAR_KLOOP(is_device_ptr(dtable, dout, ids))
        for (int64_t j = 0; j < D; j++)
            for (int64_t t = 0; t < T; t++)
                dtable[(int64_t)ids[t] * D + j] += dout[t * D + j];
        return;
    }
    for (int64_t t = 0; t < T; t++) {
        par_real *row = dtable + (int64_t)ids[t] * D;
        const par_real *g = dout + t * D;
        for (int64_t j = 0; j < D; j++)
            row[j] += g[j];
    }
}

/* ----------------------------------------------------------------- swiglu */
/* (the hidden size is spelled nI here: <cblas.h> pulls in <complex.h>, whose
 * macro I would replace a parameter named I) */

void PAR_FN(par_swiglu_forward)(par_real *h,        /* [T, nI] */
                                const par_real *g,  /* [T, nI] */
                                const par_real *u,  /* [T, nI] */
                                const par_real *rw, /* [T] or NULL */
                                int64_t T, int64_t nI, double L)
{
    PAR_DEV_BEGIN();
    PAR_DIN(g, T * nI);
    PAR_DIN(u, T * nI);
    PAR_DIN(rw, T);
    PAR_DOUT(h, T * nI);
    PAR_KLOOP(is_device_ptr(h, g, u, rw))
    for (int64_t t = 0; t < T; t++) {
        for (int64_t i = 0; i < nI; i++) {
            double gv = g[t * nI + i], uv = u[t * nI + i];
            if (L > 0) {
                gv = gv < L ? gv : L;
                uv = uv < -L ? -L : (uv > L ? L : uv);
            }
            /* the reference's order: h = silu(g) * u, then h = w * h */
            par_real v = (par_real)par_silu(gv) * (par_real)uv;
            h[t * nI + i] = rw ? rw[t] * v : v;
        }
    }
}

void PAR_FN(par_swiglu_backward)(par_real *dg,        /* [T, nI] or NULL */
                                 par_real *du,        /* [T, nI] or NULL */
                                 par_real *drw,       /* [T] or NULL */
                                 const par_real *dh,  /* [T, nI] */
                                 const par_real *g,   /* [T, nI] */
                                 const par_real *u,   /* [T, nI] */
                                 const par_real *rw,  /* [T] or NULL */
                                 int64_t T, int64_t nI, double L)
{
    PAR_DEV_BEGIN();
    PAR_DIN(dh, T * nI);
    PAR_DIN(g, T * nI);
    PAR_DIN(u, T * nI);
    PAR_DIN(rw, T);
    PAR_DINOUT(dg, T * nI);
    PAR_DINOUT(du, T * nI);
    PAR_DINOUT(drw, T);
    PAR_KLOOP(is_device_ptr(dg, du, drw, dh, g, u, rw))
    for (int64_t t = 0; t < T; t++) {
        double w = rw ? (double)rw[t] : 1.0;
        double racc = 0;
        for (int64_t i = 0; i < nI; i++) {
            int64_t k = t * nI + i;
            double gv = g[k], uv = u[k];
            int g_in = 1, u_in = 1;
            if (L > 0) {
                if (gv > L) {
                    gv = L;
                    g_in = 0;
                }
                if (uv > L) {
                    uv = L;
                    u_in = 0;
                } else if (uv < -L) {
                    uv = -L;
                    u_in = 0;
                }
            }
            double d = dh[k];
            double s = par_silu(gv);
            if (dg)
                dg[k] += g_in ? (par_real)(d * w * silu_grad_d(gv) * uv) : (par_real)0;
            if (du)
                du[k] += u_in ? (par_real)(d * w * s) : (par_real)0;
            racc += d * s * uv;
        }
        if (drw)
            drw[t] += (par_real)racc;
    }
}

/* ------------------------------------------------------------------- xent */

void PAR_FN(par_xent_forward)(par_real *ce,           /* [T] */
                              par_real *lse,          /* [T] saved */
                              const par_real *logits, /* [T, V] */
                              const int32_t *target,  /* [T], -1 = none */
                              int64_t T, int64_t V)
{
    PAR_DEV_BEGIN();
    PAR_DIN(logits, T * V);
    PAR_DIN(target, T);
    PAR_DOUT(ce, T);
    PAR_DOUT(lse, T);
    PAR_KLOOP(is_device_ptr(ce, lse, logits, target))
    for (int64_t t = 0; t < T; t++) {
        const par_real *z = logits + t * V;
        double m = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            if ((double)z[v] > m)
                m = z[v];
        double s = 0;
        for (int64_t v = 0; v < V; v++)
            s += exp((double)z[v] - m);
        double l = m + log(s);
        lse[t] = (par_real)l;
        int32_t y = target[t];
        if (y < 0)
            ce[t] = 0;
        else if (y >= V)
            ce[t] = (par_real)NAN; /* a label outside the vocabulary: poison the loss */
        else
            ce[t] = (par_real)(l - (double)z[y]);
    }
}

void PAR_FN(par_xent_backward)(par_real *dlogits,      /* [T, V] */
                               const par_real *logits, /* [T, V] */
                               const par_real *lse,    /* [T] */
                               const int32_t *target,  /* [T] */
                               double scale, int64_t T, int64_t V)
{
    PAR_DEV_BEGIN();
    PAR_DIN(logits, T * V);
    PAR_DIN(lse, T);
    PAR_DIN(target, T);
    PAR_DINOUT(dlogits, T * V);
    PAR_KLOOP(is_device_ptr(dlogits, logits, lse, target))
    for (int64_t t = 0; t < T; t++) {
        int32_t y = target[t];
        if (y < 0 || y >= V)
            continue;
        const par_real *z = logits + t * V;
        par_real *dz = dlogits + t * V;
        double l = lse[t];
        for (int64_t v = 0; v < V; v++) {
            double p = exp((double)z[v] - l);
            dz[v] += (par_real)(scale * (v == y ? p - 1.0 : p));
        }
    }
}
