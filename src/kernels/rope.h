/* kernels/rope.h - rotary position embedding with YaRN (MODEL.md section 3).
 *
 * RoPE acts on the LAST rd dims of a vector of size D, as interleaved complex
 * pairs (2i, 2i+1) with angle p * f_i:  a' = a cos - b sin,  b' = a sin + b cos.
 * The inverse (sign = -1) rotates by -p f_i; it is also the backward of the
 * forward rotation (the rotation is orthogonal), and vice versa.
 * Frequencies and angles are computed in double, then cos/sin are rounded to
 * the working precision.
 */
#ifndef PAR_KERNELS_ROPE_H
#define PAR_KERNELS_ROPE_H

#include <math.h>
#include <stdint.h>

#include "core/pmath.h"
#include "kernels/real.h"

#include "kernels/rope-table.h"

/* Rotate in place the last rd dims of each of `nvec` vectors per token:
 * x[t][v][D - rd .. D) by angle sign * pos[t] * f_i.  Vectors of one token
 * are `D` apart (x is [T, nvec, D]). */
void PAR_FN(par_rope_apply)(par_real *x,          /* [T, nvec, D] in place */
                            const int32_t *pos,   /* [T] */
                            const par_rope *r, int64_t T, int64_t nvec, int64_t D, int sign);

#include "kernels/offload.h"

PAR_DECLARE_TARGET
/* One token of par_rope_apply (device-callable, kernels/offload.h): x points
 * at the token's [nvec, D], p is its position, sg = +1 or -1. */
static inline void PAR_FN(par_rope_row)(par_real *x,      /* [nvec, D] in place */
                                        double p, const par_rope *r, int64_t nvec, int64_t D,
                                        double sg)
{
    int half = r->rd / 2;
    par_real *xt = x + (D - r->rd);
    for (int i = 0; i < half; i++) {
        double ang = sg * (p * r->freq[i]);
        double cd, sd;
        par_pmath_sincos(ang, &sd, &cd);
        par_real c = (par_real)cd, s = (par_real)sd;
        for (int64_t v = 0; v < nvec; v++) {
            par_real *e = xt + v * D + 2 * i;
            par_real a = e[0], b = e[1];
            e[0] = a * c - b * s;
            e[1] = a * s + b * c;
        }
    }
}
PAR_END_DECLARE_TARGET

#endif
