/* kernels/rope_table.c - RoPE/YaRN frequency tables (untemplated, compiled
 * once into parity_kernels_common; see kernels/rope.h). */
#include <math.h>
#include <string.h>

#include "core/log.h"
#include "core/pmath.h"
#include "kernels/rope-table.h"

/* find_correction_dim of the reference: the dim index at which a frequency
 * makes `rot` full rotations over `len` positions. */
static double correction_dim(double rot, int rd, double base, double len)
{
    return rd * par_pmath_log(len / (rot * 2.0 * M_PI)) / (2.0 * par_pmath_log(base));
}

void par_rope_init(par_rope *r, int rd, double base, int yarn,
                                         double rope_factor, int64_t original_seq_len,
                                         double beta_fast, double beta_slow)
{
    memset(r, 0, sizeof(*r));
    if (rd < 0 || rd % 2 != 0 || rd / 2 > PAR_ROPE_MAX_HALF) {
        PAR_LOG_E("par_rope_init: rope dims rd=%d must be even and in [0, %d]; using rd=0 "
                  "(no rotation)",
                  rd, 2 * PAR_ROPE_MAX_HALF);
        return;
    }
    r->rd = rd;
    int half = rd / 2;
    for (int i = 0; i < half; i++)
        r->freq[i] = 1.0 / par_pmath_pow(base, (double)(2 * i) / (double)rd);
    if (!yarn || original_seq_len <= 0)
        return;
    /* find_correction_range(beta_fast, beta_slow, rd, base, original_seq_len) */
    double L = (double)original_seq_len;
    double low = floor(correction_dim(beta_fast, rd, base, L));
    double high = ceil(correction_dim(beta_slow, rd, base, L));
    if (low < 0)
        low = 0;
    if (high > rd - 1)
        high = rd - 1;
    /* linear_ramp_factor(low, high, rd/2) */
    if (low == high)
        high += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : (ramp > 1 ? 1 : ramp);
        double smooth = 1.0 - ramp;
        double f = r->freq[i];
        r->freq[i] = f / rope_factor * (1.0 - smooth) + f * smooth;
    }
}

