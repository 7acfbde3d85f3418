/* kernels/qcast.h - a recipe's casts applied to a kernel's operands
 * (templated; the recipe, the weight classes and the registry are
 * kernels/recipe.h's, the casts core/quant.h's; docs/recipes.md). */
#ifndef PAR_KERNELS_QCAST_H
#define PAR_KERNELS_QCAST_H

#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "kernels/real.h"

/* The operands of out = in W^T under the recipe W is registered with: when
 * one applies, *in and *w point into *tmp, holding cast copies (x [T, K] in
 * 1xK-row tiles, W [N, K] in its own tiles), and the caller frees *tmp with
 * par_qcast_release.  Returns 0 and changes nothing when none applies.  Out
 * of memory: the operands stay uncast and par_recipe_failures() counts it
 * (a recipe step checks it: kernels have no status to return). */
int PAR_FN(par_qcast_operands)(const par_real **in, /* [T, K] */
                               const par_real **w,  /* [N, K] */
                               par_real **tmp, int64_t T, int64_t K, int64_t N);
static inline void par_qcast_release(void *tmp)
{
    par_free(tmp);
}

/* V4's indexer path (model.py Indexer.forward, Compressor with rotate): each
 * row of x [rows, n] -> BF16, the Hadamard rotation (n a power of two,
 * scale n^-1/2: rotate_activation), BF16, then fp4_act_quant's MXFP4
 * simulation (1x32 tiles along n; a partial tile when n < 32).  out may be
 * in.  PAR_EINVAL when n is not a power of two. */
par_status PAR_FN(par_qcast_fp4_rows)(par_real *out,      /* [rows, n] */
                                      const par_real *in, /* [rows, n] */
                                      int64_t rows, int64_t n);

#endif
