/* kernels/rope.c - rotary position embedding with YaRN (see kernels/rope.h).
 *
 * Frequencies and angles are double; cos/sin are rounded to the working
 * precision and the rotation itself runs in the working precision.
 */
#include "kernels/rope.h"

#include <math.h>
#include <string.h>

#include "core/log.h"

void PAR_FN(par_rope_apply)(par_real *x,        /* [T, nvec, D] in place */
                            const int32_t *pos, /* [T] */
                            const par_rope *r, int64_t T, int64_t nvec, int64_t D, int sign)
{
    int half = r->rd / 2;
    double sg = sign < 0 ? -1.0 : 1.0;
    for (int64_t t = 0; t < T; t++) {
        double p = (double)pos[t];
        par_real *xt = x + t * nvec * D + (D - r->rd);
        for (int i = 0; i < half; i++) {
            double ang = sg * (p * r->freq[i]);
            par_real c = (par_real)cos(ang), s = (par_real)sin(ang);
            for (int64_t v = 0; v < nvec; v++) {
                par_real *e = xt + v * D + 2 * i;
                par_real a = e[0], b = e[1];
                e[0] = a * c - b * s;
                e[1] = a * s + b * c;
            }
        }
    }
}
