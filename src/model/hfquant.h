/* model/hfquant.h - the DeepSeek-V4 release's quantized storage of one weight
 * <-> its values (untemplated; the casts are core/quant.h's, sources in
 * docs/precisions.md).
 *
 * Storage, as the V4-Flash checkpoint listing shows it:
 *   FP8  NAME.weight F8_E4M3 [out, in] + NAME.scale F8_E8M0 [ceil(out/128),
 *        ceil(in/128)] (128x128 blocks; V3-style checkpoints: F32 scales,
 *        named weight_scale_inv, which par_hf_normalize_name maps to .scale)
 *   FP4  NAME.weight I8 (or U8) [out, in/2], two E2M1 codes per byte, element
 *        2j in the low nibble + NAME.scale F8_E8M0 [out, in/32] (1x32 tiles)
 * Dequantization is exact in f64 (a code times a power of two; with F32
 * scales the product of a 4-bit and a 24-bit significand).  Quantization
 * (export) computes each tile's scale as the V4 kernels do (act_quant's
 * formula on a 128x128 tile; fp4_act_quant's on a 1x32 tile): the weights
 * of DeepSeek's training-side quantizer are not published.
 */
#ifndef PAR_MODEL_HFQUANT_H
#define PAR_MODEL_HFQUANT_H

#include "core/status.h"
#include "core/tensor.h"
#include "model/hfmap.h"

/* The quantized form of `name` (a 2-D weight [out, in] of storage class
 * st, FP8 or FP4) from the values v (any float dtype): *codes (F8_E4M3
 * [out, in] or I8 [out, in/2]) and *scale (F8_E8M0), both owning (tag IO).
 * The kernels' scale formula is not idempotent (a tile whose largest code
 * rounds to 224 (FP8) or 3 (FP4) requantizes at half the scale), so the
 * values alone do not give back the storage they were read from: `hint`
 * (may be NULL), the .scale of the same weight in that storage, is used
 * for every tile it represents exactly (same codes and scale back);
 * *rescaled (with a hint) counts the tiles where it does not.  PAR_EINVAL
 * naming the tensor for a non-finite value, an FP4 `in` that is not a
 * multiple of 32, or a tensor that is not 2-D; PAR_EMISMATCH for a hint of
 * another tile grid. */
par_status par_hfquant_quantize(const char *name, par_hf_store st, const par_tensor *v, const par_tensor *hint,
                                par_tensor *codes, par_tensor *scale, int64_t *rescaled);

/* The values of quantized weight `where`/`name` of table shape [out, in]
 * (shape[2]) from its storage: codes F8_E4M3 (FP8 blocks) or I8/U8 (packed
 * FP4), scale F8_E8M0 or F32, into a new tensor of dtype dt (F64 exact; F32
 * rounds once).  PAR_EFORMAT naming the tensor and the numbers for a codes
 * or scale shape that does not fit, an `in` that is not a multiple of 32
 * (FP4), a NaN or non-positive scale, a NaN code. */
par_status par_hfquant_dequant(const char *where, const char *name, const int64_t shape[2], const par_tensor *codes,
                               const par_tensor *scale, par_dtype dt, par_tensor *out);

/* A quantized storage dtype (F8_E4M3, I8, U8)? */
int par_hfquant_is_codes(par_dtype dt);

#endif
