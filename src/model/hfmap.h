/* model/hfmap.h - parity's parameter table <-> the Hugging Face checkpoint
 * layout of the DeepSeek-V4 release (untemplated).  docs/gpu-rollout.md
 * "The HF mapping" cites the release files this is read from.
 *
 * What the release's inference/convert.py does to a checkpoint, and what
 * follows for parity:
 *   - names: the V4 checkpoint already uses the inference code's names
 *     (`layers.3.attn.wq_a.weight`, `hc_head_fn`, `mtp.0.e_proj.weight`), which
 *     are parity's names, so export keeps every name.  convert.py also accepts
 *     V3-style names (a `model.` prefix, `self_attn`, `mlp`, `embed_tokens`,
 *     `q_a_proj`, `gate_proj`, ..., `e_score_correction_bias`); import
 *     applies the same renames (par_hf_normalize_name);
 *   - no tensor is transposed: both store Linear weights [out, in];
 *   - nothing is split or fused at model-parallel size 1 (convert.py splits
 *     only to shard for mp > 1, and fuses each FP8 weight with its 128x128
 *     block `.scale` when it dequantizes `wo_a` to bf16);
 *   - `mtp.N.*emb*` and `mtp.N.head.weight` are skipped (the MTP block shares
 *     embed and head);
 *   - dtypes: `gate.tid2eid` is int64 in the checkpoint (int32 in the code and
 *     in parity); hc_*, attn_sink, *.ape and gate.bias are float32 even in
 *     the bf16/fp8 release; the other weights are bf16, FP8 (+ `.scale`) or,
 *     for routed experts, FP4 (+ `.scale`).  Import reads that storage and
 *     dequantizes it exactly; an export is unquantized unless asked for the
 *     release's storage (model/hfquant.h, docs/precisions.md).
 */
#ifndef PAR_MODEL_HFMAP_H
#define PAR_MODEL_HFMAP_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/params.h"

/* How the release stores a tensor (the V4 checkpoint listing). */
typedef enum {
    PAR_HF_STORE_BF16 = 0, /* bf16                                 */
    PAR_HF_STORE_F32 = 1,  /* float32 (hc_*, attn_sink, ape, bias) */
    PAR_HF_STORE_FP8 = 2,  /* float8_e4m3 + a 128x128 block .scale  */
    PAR_HF_STORE_FP4 = 3,  /* packed e2m1 (int8) + a 1x32 .scale    */
    PAR_HF_STORE_I64 = 4,  /* int64 (gate.tid2eid)                  */
} par_hf_store;

/* The float dtype an export is asked for. */
typedef enum {
    PAR_HF_BF16 = 0, /* the release's split: F32 where it keeps float32, BF16 elsewhere */
    PAR_HF_FP32 = 1, /* every float tensor F32 */
    PAR_HF_FP64 = 2, /* every float tensor F64 (bitwise round trip) */
} par_hf_dtype;

/* "bf16" | "fp32" | "fp64" (also "f32", "f64", "bfloat16", "float32",
 * "float64"); PAR_EINVAL naming the value. */
par_status par_hf_dtype_parse(const char *s, par_hf_dtype *out);
/* config.json's "torch_dtype" for it ("bfloat16", "float32", "float64"). */
const char *par_hf_torch_dtype(par_hf_dtype d);

/* The release's storage of table entry p. */
par_hf_store par_hf_store_of(const par_param *p);
const char *par_hf_store_name(par_hf_store s); /* "BF16", "F32", "FP8", "FP4", "I64" */
/* The dtype entry p gets in an export of float dtype d. */
par_dtype par_hf_export_dtype(const par_param *p, par_hf_dtype d);

/* The HF name of table entry i: the same name (see above).  Returns buf. */
const char *par_hf_name(const par_param_table *t, int i, char *buf, size_t n);

/* What a checkpoint tensor name means after convert.py's renames. */
typedef enum {
    PAR_HF_NAME_PARAM = 0, /* *out holds the parity name                     */
    PAR_HF_NAME_SKIP = 1,  /* mtp.N.*emb* / mtp.N.head.weight: shared, skipped */
    PAR_HF_NAME_SCALE = 2, /* a quantization .scale (parity has none)         */
} par_hf_name_kind;

/* Applies convert.py's renames to a checkpoint name (strip `model.`,
 * self_attn -> attn, mlp -> ffn, e_score_correction_bias -> bias,
 * weight_scale_inv -> scale, the V3 component names) into out[n].
 * PAR_ERANGE when the name does not fit. */
par_status par_hf_normalize_name(const char *hf, char *out, size_t n, par_hf_name_kind *kind);

/* config.json of an export: the release's HF key names (hidden_size,
 * num_hidden_layers, rope_scaling, ...), plus a "parity" object holding
 * what HF has no key for (the training and batch keys, the preset) and the
 * provenance `parity` (may be NULL; it is added under "parity"."source").
 * NULL when out of memory. */
cJSON *par_hf_config_json(const par_config *cfg, par_hf_dtype d, cJSON *source);

/* Adds the release's quantization_config (fp8, e4m3, ue8m0, [128,128]) to
 * an export's config.json; 0 when out of memory. */
int par_hf_quant_config_add(cJSON *j);

/* The reverse: every model key from the HF keys (all required; the fixed
 * ones checked: num_key_value_heads 1, scoring_func sqrtsoftplus,
 * rope_scaling.type yarn, tie_word_embeddings false, a
 * quantization_config only the release's), the training and batch keys from "parity" when
 * present, else v4-tiny's.  `label` names the file in messages.  *cfg set
 * only on success (validated). */
par_status par_hf_config_from_json(par_config *cfg, const cJSON *j, const char *label);

#endif
