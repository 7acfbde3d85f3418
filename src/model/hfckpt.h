/* model/hfckpt.h - Hugging Face-style DeepSeek-V4 checkpoint directories
 * (untemplated): export of a parity parameter file, import back.
 *
 * An export directory holds
 *   config.json                    the release's key names (model/hfmap.h)
 *                                  plus a "parity" object (training keys,
 *                                  provenance)
 *   model.safetensors.index.json   {"metadata": {"total_size"},
 *                                   "weight_map": {tensor: shard}}
 *   model-0000i-of-0000N.safetensors  the parameters by the release's names,
 *                                  in table order, metadata {"format": "pt"}
 *   parity_optimizer.safetensors   only when the source holds optimizer state
 *                                  (opt.<name>.<slot>; not part of the index)
 * It is built in a temporary directory and renamed over the target.
 */
#ifndef PAR_MODEL_HFCKPT_H
#define PAR_MODEL_HFCKPT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/safetensors.h"
#include "core/status.h"
#include "model/config.h"
#include "model/hfmap.h"

#define PAR_HF_INDEX_NAME "model.safetensors.index.json"
#define PAR_HF_CONFIG_NAME "config.json"
#define PAR_HF_OPTIM_NAME "parity_optimizer.safetensors"
/* The metadata "generator" of an import's output file. */
#define PAR_HF_IMPORT_GENERATOR "parity import hf"

typedef struct {
    par_hf_dtype dtype;      /* float dtype of the parameters                      */
    int64_t max_shard_bytes; /* a shard is closed before it passes this; <= 0: one */
    int quantize;            /* the release's storage: FP8 weights (128x128 F8_E8M0
                                scales) and FP4 routed experts (packed I8, 1x32
                                scales) with their NAME.scale, and config.json's
                                quantization_config (model/hfquant.h)             */
    const char *scales_from; /* with quantize, may be NULL: a checkpoint directory in
                                that storage whose .scale tensors are reused where
                                they represent a tile exactly (the round trip
                                storage -> import -> export is then bitwise)      */
    cJSON *source;           /* provenance under config.json "parity"."source"
                                (consumed by par_hf_export, may be NULL)           */
} par_hf_export_opts;

typedef struct {
    int n_tensors, n_shards, n_opt; /* parameters written, shards, optimizer tensors */
    int64_t total_bytes;             /* index metadata total_size                     */
    int n_quantized;                 /* weights written quantized (each + a .scale)   */
    int64_t n_rescaled;              /* tiles whose reused scale was not exact        */
} par_hf_export_info;

/* Writes the parameters of `params` (every entry of cfg's table, checked by
 * name, shape and dtype kind; opt.<name>.<slot> tensors go to the optimizer
 * file; any other tensor is an error) as an export directory `out_dir`.
 * `label` names the source in messages.  *info (may be NULL) on success. */
par_status par_hf_export(const par_config *cfg, const par_st_file *params, const char *label,
                         const char *out_dir, par_hf_export_opts *o, par_hf_export_info *info);

typedef struct {
    par_config cfg;      /* the model read from config.json          */
    int n_tensors, n_opt; /* parameters and optimizer tensors written */
    int n_skipped;       /* tensors convert.py skips (mtp.N embed/head) */
    int n_quantized;     /* weights read from FP8 / FP4 storage and dequantized */
} par_hf_import_info;

/* Reads export directory `dir` (or any checkpoint with the release's names
 * and config keys; one model.safetensors without an index works too) and
 * writes every parameter of its config's table, in precision `bits` (64 or
 * 32), to the safetensors `out_file` (atomic), with the optimizer state of
 * parity_optimizer.safetensors when the directory has one.  Names go
 * through par_hf_normalize_name; the release's FP8 / FP4 storage (a weight
 * with its .scale) is dequantized exactly (model/hfquant.h); an unknown or
 * repeated name, a wrong shape, a missing parameter, a scale without its
 * weight or bad quantized storage is an error naming it.
 * *info (may be NULL) on success. */
par_status par_hf_import(const char *dir, int bits, const char *out_file, par_hf_import_info *info);

/* Converts t into a new tensor of dtype dt (owning its data, tag IO): floats
 * through double (exact widening; narrowing rounds once), integers exactly
 * (PAR_ERANGE naming `what` when a value does not fit), float <-> integer
 * refused (PAR_EMISMATCH). */
par_status par_hf_tensor_convert(const par_tensor *t, par_dtype dt, const char *what, par_tensor *out);

#endif
