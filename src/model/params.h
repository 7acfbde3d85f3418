/* model/params.h - the parameter table (untemplated).
 *
 * One entry per tensor, with the reference code's exact name and shape
 * (docs/model-reading.md section 1).  All float tensors live in ONE flat
 * buffer of the working precision, in table order: entry p occupies
 * flat[p.offset .. p.offset + p.numel).  Gradients and optimizer state use
 * the same offsets (buffers of n_float elements).  The only integer tensors
 * (gate.tid2eid of hash layers) live in a separate flat int32 buffer at
 * p.offset as well (offsets into that buffer, n_i32 elements).
 *
 * Table order: embed.weight; layers 0..n_layers-1; norm.weight, head.weight,
 * hc_head_fn, hc_head_base, hc_head_scale; then mtp.0.*.  Inside a block:
 *   hc_attn_fn, hc_attn_base, hc_attn_scale, attn_norm.weight,
 *   attn.attn_sink, attn.wq_a.weight, attn.q_norm.weight, attn.wq_b.weight,
 *   attn.wkv.weight, attn.kv_norm.weight,
 *   [m>0]  attn.compressor.{wkv.weight, wgate.weight, ape, norm.weight},
 *   [m==4] attn.indexer.{wq_b.weight, weights_proj.weight,
 *                        compressor.{wkv.weight, wgate.weight, ape, norm.weight}},
 *   attn.wo_a.weight, attn.wo_b.weight,
 *   hc_ffn_fn, hc_ffn_base, hc_ffn_scale, ffn_norm.weight,
 *   ffn.gate.weight, ffn.gate.bias (score layers) | ffn.gate.tid2eid (hash layers),
 *   ffn.experts.0.{w1,w2,w3}.weight .. ffn.experts.E-1.{w1,w2,w3}.weight,
 *   ffn.shared_experts.{w1,w2,w3}.weight
 * An MTP block mtp.i first has enorm.weight, hnorm.weight, e_proj.weight,
 * h_proj.weight, then the block's tensors above, then norm.weight,
 * hc_head_fn, hc_head_base, hc_head_scale.
 */
#ifndef PAR_MODEL_PARAMS_H
#define PAR_MODEL_PARAMS_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"

#define PAR_PARAM_NAME_MAX 80

typedef enum {
    PAR_PDT_REAL = 0, /* float, stored in the working precision (flat buffer) */
    PAR_PDT_I32 = 1,  /* int32 (gate.tid2eid), in the int32 buffer            */
} par_param_dtype;

typedef enum {
    PAR_OPT_NONE = 0,  /* no optimizer: gate.bias (balance update), tid2eid  */
    PAR_OPT_MUON = 1,  /* every 2-D float weight except embed, head, *.ape   */
    PAR_OPT_ADAMW = 2, /* the other float tensors                            */
} par_opt_kind;

typedef enum {
    PAR_INIT_ZERO = 0,    /* 0                                                */
    PAR_INIT_ONE = 1,     /* 1 (RMSNorm weights)                              */
    PAR_INIT_CONST = 2,   /* init_a                                           */
    PAR_INIT_NORMAL = 3,  /* N(0, init_a^2)                                   */
    PAR_INIT_HC_BASE = 4, /* structured mHC base + N(0, init_a^2) noise       */
    PAR_INIT_TID2EID = 5, /* ((t mod E) + j floor(E/K)) mod E                 */
} par_init_kind;

typedef struct {
    char name[PAR_PARAM_NAME_MAX]; /* e.g. "layers.3.ffn.experts.17.w1.weight" */
    par_param_dtype dtype;
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* [out, in] for weights; shape[1] = 1 when ndim == 1 */
    int64_t numel;
    int64_t offset;    /* into the flat float buffer (REAL) or int32 buffer (I32) */
    int layer;         /* block index: 0..n_layers-1, n_layers+i for mtp.i; -1 top-level */
    int expert;        /* routed expert index, -1 if none (shared expert: -1, shared = 1) */
    int shared;        /* 1 for ffn.shared_experts.*                                       */
    par_opt_kind opt;
    int weight_decay;  /* MODEL.md 7: 1 for Muon tensors and embed/head, else 0           */
    int has_grad;      /* 1: takes a gradient slot (all REAL except gate.bias)             */
    int zero_grad;     /* 1: gradient is zero by contract (indexer.*), still optimized     */
    par_init_kind init;
    double init_a;     /* std (NORMAL, HC_BASE noise) or value (CONST)                    */
} par_param;

/* Indices into the table for one block (-1 where absent). */
typedef struct {
    int hc_attn_fn, hc_attn_base, hc_attn_scale, attn_norm;
    int attn_sink, wq_a, q_norm, wq_b, wkv, kv_norm;
    int cmp_wkv, cmp_wgate, cmp_ape, cmp_norm;                         /* ratio > 0  */
    int idx_wq_b, idx_weights_proj;                                    /* ratio == 4 */
    int idx_cmp_wkv, idx_cmp_wgate, idx_cmp_ape, idx_cmp_norm;         /* ratio == 4 */
    int wo_a, wo_b;
    int hc_ffn_fn, hc_ffn_base, hc_ffn_scale, ffn_norm;
    int gate_weight, gate_bias, gate_tid2eid; /* bias on score layers, tid2eid on hash */
    int expert0;   /* experts.e.{w1,w2,w3} are entries expert0 + 3e + {0,1,2}         */
    int shared_w1, shared_w2, shared_w3;
    /* mtp.i only */
    int enorm, hnorm, e_proj, h_proj, norm, hc_head_fn, hc_head_base, hc_head_scale;
} par_block_params;

typedef struct {
    int embed, norm, head, hc_head_fn, hc_head_base, hc_head_scale;
} par_top_params;

typedef struct {
    par_config cfg;            /* copy of the config it was built from */
    int n;                     /* number of entries                    */
    par_param *p;              /* [n], table order                     */
    int64_t n_float;           /* elements of the flat float buffer    */
    int64_t n_i32;             /* elements of the int32 buffer         */
    int n_blocks;              /* n_layers + n_mtp_layers              */
    par_block_params *blocks;  /* [n_blocks]                           */
    par_top_params top;
    /* lookup hash (internal) */
    int *hash;
    int hash_cap;
} par_param_table;

/* Builds the table of a validated config (validates it first). */
par_status par_param_table_build(par_param_table *t, const par_config *cfg);
void par_param_table_free(par_param_table *t);

/* Index of the entry named `name`, or -1. */
int par_param_find(const par_param_table *t, const char *name);
/* Entry by name, or NULL. */
const par_param *par_param_lookup(const par_param_table *t, const char *name);
/* Same, but a missing name is PAR_ENOTFOUND naming it. */
par_status par_param_get(const par_param_table *t, const char *name, const par_param **out);

/* Sizes for planning without building the table (works for v4-pro):
 * number of tensors, float elements, int32 elements.  Any output may be
 * NULL.  The config must be valid. */
par_status par_param_count(const par_config *cfg, int64_t *n_tensors, int64_t *n_float, int64_t *n_i32);
/* Float elements of the routed experts only (and per MoE block), for
 * "total vs activated" planning numbers. */
int64_t par_param_count_routed_expert_floats(const par_config *cfg);

/* The deterministic initial value of element i of entry idx, in double:
 * a pure function of (seed, name, i) through core/rng.h
 * (key = par_rng_key(seed, name), element i, word2 = 0).  For I32 entries
 * (tid2eid) the closed-form integer.  Templated init (model/init.h) rounds
 * this to the working precision. */
double par_param_init_value(const par_param_table *t, int idx, uint64_t seed, int64_t i);
/* The same for elements [begin, end) into out[0 .. end-begin) (one key
 * computation; 0 <= begin <= end <= numel is the caller's duty). */
void par_param_init_values(const par_param_table *t, int idx, uint64_t seed, int64_t begin, int64_t end,
                           double *out);

/* Short names of the enums ("muon", "adamw", "none"; "normal", ...). */
const char *par_opt_kind_name(par_opt_kind k);
const char *par_init_kind_name(par_init_kind k);

#endif
