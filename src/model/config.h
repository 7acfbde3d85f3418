/* model/config.h - the model, batch and training configuration (untemplated).
 *
 * Every key keeps its MODEL.md / reference `ModelArgs` name, in config files,
 * manifests and `--set key=value`.  Two batch keys are our reading
 * (Megatron-style names): `global_batch_size` = rows B of a step's global
 * batch, `seq_length` = tokens S per row.
 *
 * Integer keys are int64_t, real keys double.  A config is a plain value:
 * copy it freely (compress_ratios is an inline array).
 *
 * Usage:
 *   par_config cfg;
 *   par_config_preset(&cfg, "v4-tiny");            // or par_config_load_file
 *   par_config_set(&cfg, "compress_ratios", "0,4,16,0");
 *   par_config_validate(&cfg);                      // rule + numbers on failure
 *   par_config_check_runnable(&cfg);                // refuses planning presets
 */
#ifndef PAR_MODEL_CONFIG_H
#define PAR_MODEL_CONFIG_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"

/* Most entries compress_ratios may hold (n_layers + n_mtp_layers). */
#define PAR_MAX_BLOCKS 256

typedef struct {
    char preset[32]; /* preset it started from ("custom" if none)          */
    int runnable;    /* 0: planning-only preset (v4-pro, v4-flash)         */
    int bitwise;     /* 1: the bitwise mode (docs/bitwise.md): every gradient
                      * sum order-free (core/racc.h); not a config key, set by
                      * --bitwise and recorded in the manifest's "numerics"  */
    int64_t recipe;  /* par_recipe (kernels/recipe.h): the casts of a GPU
                      * training recipe (docs/recipes.md); not a config key,
                      * set by --recipe and recorded as train.recipe       */

    /* ---- model (ModelArgs names) ---- */
    int64_t vocab_size;
    int64_t dim;
    int64_t n_layers;
    int64_t n_hash_layers;
    int64_t n_mtp_layers;
    int64_t n_heads;
    int64_t head_dim;
    int64_t rope_head_dim;
    int64_t q_lora_rank;
    int64_t o_groups;
    int64_t o_lora_rank;
    int64_t window_size;
    int64_t n_compress_ratios;                /* must equal n_layers + n_mtp_layers */
    int64_t compress_ratios[PAR_MAX_BLOCKS];  /* block b (mtp.i is n_layers+i)      */
    int64_t index_n_heads;
    int64_t index_head_dim;
    int64_t index_topk;
    int64_t n_routed_experts;
    int64_t n_activated_experts;
    int64_t moe_inter_dim;
    int64_t n_shared_experts; /* must be 1 */
    double route_scale;
    double swiglu_limit;
    int64_t hc_mult;
    int64_t hc_sinkhorn_iters;
    double hc_eps;
    double norm_eps;
    double rope_theta;
    double compress_rope_theta;
    double rope_factor;
    int64_t original_seq_len;
    double beta_fast;
    double beta_slow;

    /* ---- batch (our reading, Megatron names) ---- */
    int64_t global_batch_size; /* B rows per global batch */
    int64_t seq_length;        /* S tokens per row        */

    /* ---- training ---- */
    double mtp_lambda;
    double aux_alpha;
    double bias_update_rate;
    double lr;
    double wd;
    double clip_grad;
    double mu;
} par_config;

/* The manifest's record of the bitwise mode: "train": {"numerics":
 * "bitwise"} (absent: the tolerance mode).  Read back by
 * par_config_from_json; compare reports a difference as a note. */
#define PAR_CONFIG_NUMERICS_KEY "numerics"
/* The manifest's record of a recipe: "train": {"recipe": "v4"} (absent:
 * none).  Read back by par_config_from_json; compare notes a difference. */
#define PAR_CONFIG_RECIPE_KEY "recipe"

/* Which section of a manifest a key belongs to. */
typedef enum {
    PAR_CFG_MODEL = 0, /* MODEL.md model keys */
    PAR_CFG_BATCH = 1, /* global_batch_size, seq_length */
    PAR_CFG_TRAIN = 2, /* mtp_lambda .. mu */
} par_config_section;

/* Presets: "v4-tiny", "v4-mini" (runnable), "v4-pro", "v4-flash" (planning
 * only).  Unknown name: PAR_ENOTFOUND naming the known ones. */
par_status par_config_preset(par_config *cfg, const char *name);
/* NULL-terminated list of preset names. */
const char *const *par_config_preset_names(void);

/* Sets one key from its text form: integers, reals ("1e-3"), and
 * compress_ratios as "0,4,16,0" (also sets n_compress_ratios).  Unknown key:
 * PAR_ENOTFOUND; unparsable value: PAR_EINVAL; both name the key.  Does not
 * validate the whole config (call par_config_validate after all sets). */
par_status par_config_set(par_config *cfg, const char *key, const char *value);
/* "key=value" (the argument of --set). */
par_status par_config_set_arg(par_config *cfg, const char *key_eq_value);

/* Applies the keys of a JSON object over *cfg.  Accepts the flat form
 * {"dim": 32, "compress_ratios": [0,4,16,0], ...}; nested "model", "train",
 * "batch" objects (manifest form) are applied too; a "preset" string is
 * applied first (then the other keys override it).  Unknown keys and values
 * of the wrong type are errors naming the key. */
par_status par_config_from_json(par_config *cfg, const cJSON *obj);
/* Reads a JSON config file and applies it as par_config_from_json.  Start
 * *cfg from a preset first if the file is partial. */
par_status par_config_load_file(par_config *cfg, const char *path);

/* New cJSON object with the keys of one section (cJSON_Delete it).  NULL on
 * out-of-memory. */
cJSON *par_config_section_to_json(const par_config *cfg, par_config_section section);
/* Flat object with "preset" and every key of every section. */
cJSON *par_config_to_json(const par_config *cfg);

/* Checks every rule; the first broken one is reported with PAR_EINVAL and a
 * message naming the rule and the numbers. */
par_status par_config_validate(const par_config *cfg);

/* PAR_EUNSUPPORTED for a planning-only config, with a message giving its
 * size (parameters, bytes in f32) and saying it is for planning. */
par_status par_config_check_runnable(const par_config *cfg);

/* Key introspection: name of key i (NULL past the end), its section. */
const char *par_config_key_name(int i);
par_config_section par_config_key_section(int i);
/* Text form of a key's value into buf ("%.17g" for reals). */
par_status par_config_get(const par_config *cfg, const char *key, char *buf, int n);

/* Small helpers. */
static inline int64_t par_config_n_blocks(const par_config *c) { return c->n_layers + c->n_mtp_layers; }
/* Ratio of block b (0 <= b < n_layers + n_mtp_layers). */
static inline int64_t par_config_ratio(const par_config *c, int64_t b) { return c->compress_ratios[b]; }
/* Hash-routed block (tid2eid) vs score-routed (gate.bias). */
static inline int par_config_is_hash_layer(const par_config *c, int64_t b) { return b < c->n_hash_layers; }

#endif
