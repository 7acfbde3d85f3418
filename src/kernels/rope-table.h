/* kernels/rope-table.h - the untemplated part of kernels/rope.h: the
 * frequency table type and its construction. */
#ifndef PAR_KERNELS_ROPE_TABLE_H
#define PAR_KERNELS_ROPE_TABLE_H

#include <stdint.h>

#define PAR_ROPE_MAX_HALF 512 /* rd/2 limit */

typedef struct {
    int rd;                          /* rope dims (even)  */
    double freq[PAR_ROPE_MAX_HALF];  /* f_i, i < rd/2     */
} par_rope;

/* f_i = base^(-2i/rd); with yarn (original_seq_len > 0) the YaRN ramp of
 * precompute_freqs_cis (docs/model-reading.md): low/high from
 * find_correction_range(beta_fast, beta_slow, rd, base, original_seq_len),
 * high clamped at rd - 1, high += 0.001 when equal. */
void par_rope_init(par_rope *r, int rd, double base, int yarn, double rope_factor,
                   int64_t original_seq_len, double beta_fast, double beta_slow);

#endif
