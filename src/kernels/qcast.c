/* kernels/qcast.c - a recipe's casts on a kernel's operands (kernels/qcast.h). */
#include "kernels/qcast.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/quant.h"
#include "kernels/recipe.h"

#if PAR_REAL_BITS == 64
#define quant_sim par_quant_sim_f64
#else
#define quant_sim par_quant_sim_f32
#endif

/* x [rows, cols] in place: the cast of one operand. */
static void cast_inplace(par_real *x, int64_t rows, int64_t cols, par_cast_kind kind, const par_qspec *spec,
                         int bf16_first)
{
    const int64_t n = rows * cols;
    if (kind == PAR_CAST_BF16 || (kind == PAR_CAST_QUANT && bf16_first))
        for (int64_t i = 0; i < n; i++)
            x[i] = (par_real)par_bf16_round((double)x[i]);
    if (kind == PAR_CAST_QUANT && quant_sim(spec, x, rows, cols))
        par_recipe_note_failure();
}

/* x [rows, cols], the block at (r0, c0) of a tensor [rows_g, cols_g] whose
 * other blocks other ranks hold: each element quantized with the scale of its
 * tile of the whole tensor, the tiles' amaxes maxed over the group
 * (sh->tile_max).  Out of memory or a failed exchange: counted, x uncast. */
static void cast_block(par_real *x, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int64_t rows_g,
                       int64_t cols_g, const par_qspec *s, const par_recipe_shard *sh)
{
    const int64_t nr = par_qspec_scale_rows(s, rows_g), nc = par_qspec_scale_cols(s, cols_g);
    double *amax = par_calloc((size_t)(nr * nc), sizeof(double), PAR_TAG_ACT);
    if (!amax) {
        par_recipe_note_failure();
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double *m = &amax[((r0 + r) / s->tile_rows) * nc + (c0 + c) / s->tile_cols];
            double a = fabs((double)x[r * cols + c]);
            *m = (a > *m || isnan(a)) && !isnan(*m) ? a : *m; /* core/quant.c's rule: NaN wins */
        }
    if (!sh->tile_max || sh->tile_max(sh->ctx, sh->name, amax, nr * nc)) {
        par_recipe_note_failure();
        par_free(amax);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const int64_t t = ((r0 + r) / s->tile_rows) * nc + (c0 + c) / s->tile_cols;
            x[r * cols + c] = (par_real)par_quant_sim_value(s, (double)x[r * cols + c], par_qscale_of_amax(s, amax[t]));
        }
    par_free(amax);
}

/* The operands of a GEMM whose weight W [N, K] is a TP/ETP block: the whole
 * tensor's tiles.  Rows cut (column-parallel): x is whole, W's row tiles
 * span the group.  Columns cut (row-parallel): x [T, K] is the block of the
 * whole x at column rank*K, and both its 1xB tiles and W's span the group. */
static void cast_cut(par_real *qx, par_real *qw, int64_t T, int64_t K, int64_t N, const par_recipe_cast *c,
                     const par_recipe_shard *sh)
{
    const int cols = sh->cut == 2;
    const int64_t n0 = cols ? 0 : sh->rank * N, k0 = cols ? sh->rank * K : 0;
    const int64_t Ng = cols ? N : N * sh->P, Kg = cols ? K * sh->P : K;
    if (c->act == PAR_CAST_QUANT) {
        for (int64_t i = 0; i < T * K; i++)
            qx[i] = (par_real)par_bf16_round((double)qx[i]);
        if (cols)
            cast_block(qx, T, K, 0, k0, T, Kg, &c->act_spec, sh);
        else
            cast_inplace(qx, T, K, c->act, &c->act_spec, 1);
    } else {
        cast_inplace(qx, T, K, c->act, &c->act_spec, 1);
    }
    if (c->wt == PAR_CAST_QUANT)
        cast_block(qw, N, K, n0, k0, Ng, Kg, &c->wt_spec, sh);
    else
        cast_inplace(qw, N, K, c->wt, &c->wt_spec, 0);
}

int PAR_FN(par_qcast_operands)(const par_real **in, /* [T, K] */
                               const par_real **w,  /* [N, K] */
                               par_real **tmp, int64_t T, int64_t K, int64_t N)
{
    par_recipe_shard sh;
    const par_recipe_cast *c = par_recipe_lookup(*w, &sh);
    if (!c)
        return 0;
    par_real *buf = par_malloc((size_t)(T * K + N * K + 1) * sizeof(par_real), PAR_TAG_ACT);
    if (!buf) {
        par_recipe_note_failure();
        return 0;
    }
    par_real *qx = buf, *qw = buf + T * K;
    memcpy(qx, *in, (size_t)(T * K) * sizeof(par_real));
    memcpy(qw, *w, (size_t)(N * K) * sizeof(par_real));
    if (sh.cut) { /* a TP/ETP block: the whole tensor's tiles */
        cast_cut(qx, qw, T, K, N, c, &sh);
    } else {
        cast_inplace(qx, T, K, c->act, &c->act_spec, 1); /* activations are BF16 tensors in the reference */
        cast_inplace(qw, N, K, c->wt, &c->wt_spec, 0);   /* weights: FP32/FP64 master -> the format   */
    }
    *in = qx, *w = qw, *tmp = buf;
    return 1;
}

/* The fast Walsh-Hadamard transform of v [n] (n a power of two), times n^-1/2,
 * in double, butterflies in a fixed order. */
static void hadamard(double *v, int64_t n)
{
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                double a = v[j], b = v[j + h];
                v[j] = a + b, v[j + h] = a - b;
            }
    const double s = 1.0 / sqrt((double)n);
    for (int64_t i = 0; i < n; i++)
        v[i] *= s;
}

par_status PAR_FN(par_qcast_fp4_rows)(par_real *out,      /* [rows, n] */
                                      const par_real *in, /* [rows, n] */
                                      int64_t rows, int64_t n)
{
    if (n < 1 || (n & (n - 1)) || n > 4096)
        return par_err(PAR_EINVAL, "recipe: the indexer's Hadamard rotation needs a power-of-two head dim "
                       "<= 4096, got %lld", (long long)n);
    double v[4096];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++)
            v[i] = par_bf16_round((double)in[r * n + i]); /* rotate_activation asserts a bf16 input */
        hadamard(v, n);
        for (int64_t i = 0; i < n; i++)
            out[r * n + i] = (par_real)par_bf16_round(v[i]); /* hadamard_transform's bf16 output */
    }
    static const par_qspec fp4 = PAR_QSPEC_MXFP4;
    return quant_sim(&fp4, out, rows, n);
}
