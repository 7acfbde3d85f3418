/* core/quant.h - the low-precision casts of DeepSeek's training recipe, as the
 * official V3/V4 inference code defines them (docs/precisions.md cites, per
 * cast, the repository, file, function and commit it was read from).
 *
 * Element formats (scalar casts, exact decode):
 *   BF16      round to nearest even (core/tensor.h's par_bf16_from_f64)
 *   E4M3      "float8_e4m3fn": bias 7, no inf, 0x7f/0xff NaN, max 448,
 *             subnormals 2^-9 .. 7*2^-9.  Round to nearest even from the
 *             exact value, saturating to +-448 ("satfinite": anything
 *             past 448, infinities too); NaN stays NaN (0x7f | sign)
 *   E2M1      FP4: values 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives;
 *             round to nearest even, saturating to +-6; no NaN: NaN gives
 *             the code of 6 (the tile's scale carries the NaN, below)
 *   UE8M0     "float8_e8m0fnu": 2^(b - 127), b = 0..254; 0xff NaN
 *
 * Block scales (par_qspec): a tensor [rows, cols] is cut into tiles of
 * tile_rows x tile_cols (the last tile of a dim may be partial); per tile
 *   amax  = max(max |x|, floor)        floor = 1e-4 (E4M3), 6 * 2^-126 (E2M1)
 *   y     = fl32(fl32(amax) * fl32(1 / max))        max = 448 or 6
 *   scale = 2^ceil(log2 y)   (UE8M0: the kernels' fast_round_scale, read from
 *                             y's float32 bits)     or  y  (F32 scales)
 *   code  = cast(clamp(x / scale, -max, max))
 * x / scale is exact for a power-of-two scale (and computed in float32, as
 * the kernels do, for F32 scales).  A tile holding a NaN or an infinity gets
 * a NaN scale: every value of it dequantizes to NaN.
 *
 * The recipes of issue 32 (act_quant 1x128, the KV simulation 1x64, weights
 * 128x128, MXFP4 1x32) are par_qspec values (PAR_QSPEC_*).  Inputs are f64
 * or f32 arrays; an f32 input gives the same codes as its f64 widening.
 * The scale is computed from fl32(amax) as the float32 kernels do, so an
 * input the reference can see (bf16 or f32 values) quantizes exactly as
 * the reference quantizes it.
 */
#ifndef PAR_CORE_QUANT_H
#define PAR_CORE_QUANT_H

#include <stdint.h>

#include "core/status.h"

typedef enum {
    PAR_QFMT_E4M3 = 0, /* FP8, one code per byte            */
    PAR_QFMT_E2M1 = 1, /* FP4, one code (low nibble) per byte */
} par_qfmt;

typedef enum {
    PAR_QSCALE_UE8M0 = 0, /* power-of-two scales (scale_fmt "ue8m0") */
    PAR_QSCALE_F32 = 1,   /* scale = amax / max, float32              */
} par_qscale;

typedef struct {
    par_qfmt fmt;
    par_qscale scale;
    int tile_rows, tile_cols; /* >= 1 */
} par_qspec;

/* V4 act_quant (block 128, scale_fmt ue8m0), its KV simulation (block 64),
 * the 128x128 weight blocks, MXFP4 (fp4_act_quant / the FP4 experts). */
#define PAR_QSPEC_ACT_FP8 ((par_qspec){PAR_QFMT_E4M3, PAR_QSCALE_UE8M0, 1, 128})
#define PAR_QSPEC_KV_FP8 ((par_qspec){PAR_QFMT_E4M3, PAR_QSCALE_UE8M0, 1, 64})
#define PAR_QSPEC_WEIGHT_FP8 ((par_qspec){PAR_QFMT_E4M3, PAR_QSCALE_UE8M0, 128, 128})
#define PAR_QSPEC_MXFP4 ((par_qspec){PAR_QFMT_E2M1, PAR_QSCALE_UE8M0, 1, 32})

#define PAR_E4M3_MAX 448.0
#define PAR_E2M1_MAX 6.0
#define PAR_E8M0_NAN 0xffu

/* ---- element casts ---- */
uint8_t par_e4m3_from_f64(double x);
double par_e4m3_to_f64(uint8_t b);
uint8_t par_e2m1_from_f64(double x); /* code in the low nibble */
double par_e2m1_to_f64(uint8_t code);  /* low nibble used        */
/* A power of two 2^-127 .. 2^127 -> its byte (0 ok); NaN -> 0xff (0 ok);
 * anything else -1, *out untouched. */
int par_e8m0_from_f64(double s, uint8_t *out);
double par_e8m0_to_f64(uint8_t b);
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp declare target /* called from device loops (kernels/indexer.c, kernels/qcast.c) */
#endif
double par_bf16_round(double x); /* the bf16 value nearest x, as a double */
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp end declare target
#endif

/* ---- block quantization ---- */
/* Number of tiles along each dim (ceil), and their product. */
int64_t par_qspec_scale_rows(const par_qspec *s, int64_t rows);
int64_t par_qspec_scale_cols(const par_qspec *s, int64_t cols);

/* The scale of one tile from its amax (max |x|; NaN/inf give NaN). */
float par_qscale_of_amax(const par_qspec *s, double amax);

/* x [rows, cols] -> codes [rows, cols] (one per byte) and scales
 * [scale_rows, scale_cols] (float32 values; UE8M0 ones are powers of two).
 * PAR_EINVAL for a bad spec or negative sizes. */
par_status par_quantize_f64(const par_qspec *s, const double *x, int64_t rows, int64_t cols, uint8_t *codes,
                            float *scales);
par_status par_quantize_f32(const par_qspec *s, const float *x, int64_t rows, int64_t cols, uint8_t *codes,
                            float *scales);
/* codes [rows, cols] * scales [scale_rows, scale_cols] -> y [rows, cols]
 * (exact in f64; in f32 exact unless the product is below f32's range). */
par_status par_dequantize_f64(const par_qspec *s, const uint8_t *codes, const float *scales, int64_t rows,
                              int64_t cols, double *y);
par_status par_dequantize_f32(const par_qspec *s, const uint8_t *codes, const float *scales, int64_t rows,
                              int64_t cols, float *y);
/* Quantize then dequantize in place (the kernels' inplace=True simulation;
 * the final cast back to the input's dtype is exact). */
par_status par_quant_sim_f64(const par_qspec *s, double *x, int64_t rows, int64_t cols);
par_status par_quant_sim_f32(const par_qspec *s, float *x, int64_t rows, int64_t cols);

/* One element's quantize-then-dequantize with its tile's scale (what
 * par_quant_sim does to each element): a tile cut over several ranks is cast
 * by each with the scale of the whole tile (par_qscale_of_amax of the tile's
 * amax; NaN scale: NaN). */
double par_quant_sim_value(const par_qspec *s, double x, float scale);

/* ---- storage helpers ---- */
/* FP4 codes [n] (n even) -> bytes [n/2]: element 2j in the low nibble,
 * 2j+1 in the high one (the release's int8 layout, convert.py). */
void par_e2m1_pack(const uint8_t *codes, int64_t n, uint8_t *packed);
void par_e2m1_unpack(const uint8_t *packed, int64_t n, uint8_t *codes);

/* convert.py's cast_e2m1fn_to_e4m3fn: FP4 codes [rows, cols] with 1x32
 * scales [rows, cols/32] -> E4M3 codes with 128x128 scales [rows/128,
 * cols/128] (rows, cols multiples of 128): per block smax = (largest 1x32
 * scale) / 64, each value x * (scale / smax) cast to E4M3.  *inexact (may
 * be NULL) counts values that did not survive exactly (an FP4 scale more
 * than 2^14 below its block's largest). */
par_status par_e2m1_to_e4m3_blocks(const uint8_t *codes4, const float *scales4, int64_t rows, int64_t cols,
                                   uint8_t *codes8, float *scales8, int64_t *inexact);

#endif
