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

int PAR_FN(par_qcast_operands)(const par_real **in, /* [T, K] */
                               const par_real **w,  /* [N, K] */
                               par_real **tmp, int64_t T, int64_t K, int64_t N)
{
    const par_recipe_cast *c = par_recipe_lookup(*w);
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
    cast_inplace(qx, T, K, c->act, &c->act_spec, 1); /* activations are BF16 tensors in the reference */
    cast_inplace(qw, N, K, c->wt, &c->wt_spec, 0);   /* weights: FP32/FP64 master -> the format   */
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
