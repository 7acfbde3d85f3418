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
    PAR_DEV_BEGIN();
    double sg = sign < 0 ? -1.0 : 1.0;
    PAR_DIN(pos, T);
    PAR_DIN(r, 1);
    PAR_DINOUT(x, T * nvec * D);
    PAR_KLOOP(is_device_ptr(x, pos, r))
    for (int64_t t = 0; t < T; t++)
        PAR_FN(par_rope_row)(x + t * nvec * D, (double)pos[t], r, nvec, D, sg);
}
