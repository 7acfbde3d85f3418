/* model/hfmap.c - the HF checkpoint layout of the DeepSeek-V4 release (see
 * model/hfmap.h; docs/gpu-rollout.md "The HF mapping"). */
#include "model/hfmap.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"

par_status par_hf_dtype_parse(const char *s, par_hf_dtype *out)
{
    static const struct {
        const char *name;
        par_hf_dtype d;
    } names[] = {{"bf16", PAR_HF_BF16}, {"bfloat16", PAR_HF_BF16}, {"fp32", PAR_HF_FP32},
                 {"f32", PAR_HF_FP32},  {"float32", PAR_HF_FP32},  {"fp64", PAR_HF_FP64},
                 {"f64", PAR_HF_FP64},  {"float64", PAR_HF_FP64}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].d;
            return PAR_OK;
        }
    return par_err(PAR_EINVAL, "dtype must be bf16, fp32 or fp64 (got '%s')", s ? s : "(null)");
}

const char *par_hf_torch_dtype(par_hf_dtype d)
{
    return d == PAR_HF_FP64 ? "float64" : d == PAR_HF_FP32 ? "float32" : "bfloat16";
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

par_hf_store par_hf_store_of(const par_param *p)
{
    const char *n = p->name;
    if (p->dtype == PAR_PDT_I32)
        return PAR_HF_STORE_I64;
    if (strstr(n, "hc_") || ends_with(n, "attn_sink") || ends_with(n, ".ape") || ends_with(n, "gate.bias"))
        return PAR_HF_STORE_F32;
    if (p->expert >= 0)
        return PAR_HF_STORE_FP4;
    static const char *const fp8[] = {".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight",
                                      ".attn.wo_a.weight", ".attn.wo_b.weight", ".indexer.wq_b.weight",
                                      ".shared_experts.w1.weight", ".shared_experts.w2.weight",
                                      ".shared_experts.w3.weight", ".e_proj.weight", ".h_proj.weight"};
    for (size_t i = 0; i < sizeof fp8 / sizeof fp8[0]; i++)
        if (ends_with(n, fp8[i]))
            return PAR_HF_STORE_FP8;
    return PAR_HF_STORE_BF16;
}

const char *par_hf_store_name(par_hf_store s)
{
    static const char *const names[] = {"BF16", "F32", "FP8", "FP4", "I64"};
    return (unsigned)s < 5 ? names[s] : "?";
}

par_dtype par_hf_export_dtype(const par_param *p, par_hf_dtype d)
{
    if (p->dtype == PAR_PDT_I32)
        return PAR_I64;
    if (d == PAR_HF_FP64)
        return PAR_F64;
    if (d == PAR_HF_FP32 || par_hf_store_of(p) == PAR_HF_STORE_F32)
        return PAR_F32;
    return PAR_BF16;
}

const char *par_hf_name(const par_param_table *t, int i, char *buf, size_t n)
{
    snprintf(buf, n, "%s", t->p[i].name);
    return buf;
}

/* convert.py's renames, applied to one dot-separated component: the V3-style
 * names it maps onto the inference code's (components with no V4
 * counterpart, such as q_proj or kv_b_proj, stay and are unknown names). */
static const char *rename_component(const char *c)
{
    static const char *const map[][2] = {
        {"self_attn", "attn"},          {"mlp", "ffn"},
        {"embed_tokens", "embed"},      {"input_layernorm", "attn_norm"},
        {"post_attention_layernorm", "ffn_norm"}, {"q_a_proj", "wq_a"},
        {"q_a_layernorm", "q_norm"},    {"q_b_proj", "wq_b"},
        {"kv_a_layernorm", "kv_norm"},  {"gate_proj", "w1"},
        {"down_proj", "w2"},            {"up_proj", "w3"},
        {"lm_head", "head"},            {"e_score_correction_bias", "bias"},
        {"weight_scale_inv", "scale"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(c, map[i][0]))
            return map[i][1];
    return c;
}

par_status par_hf_normalize_name(const char *hf, char *out, size_t n, par_hf_name_kind *kind)
{
    const char *s = strncmp(hf, "model.", 6) ? hf : hf + 6;
    size_t len = 0;
    char comp[256];
    while (*s) {
        size_t k = strcspn(s, ".");
        if (k >= sizeof comp)
            return par_err(PAR_ERANGE, "tensor name '%s': component longer than %zu", hf, sizeof comp - 1);
        memcpy(comp, s, k);
        comp[k] = 0;
        const char *r = rename_component(comp);
        int w = snprintf(out + len, n - len, "%s%s", len ? "." : "", r);
        if (w < 0 || (size_t)w >= n - len)
            return par_err(PAR_ERANGE, "tensor name '%s' longer than %zu", hf, n - 1);
        len += (size_t)w;
        s += k;
        if (*s == '.')
            s++;
    }
    par_hf_name_kind kd = PAR_HF_NAME_PARAM;
    if (!strncmp(out, "mtp.", 4) && (strstr(out, "emb") || ends_with(out, "head.weight")))
        kd = PAR_HF_NAME_SKIP;
    else if (ends_with(out, ".scale") && !strstr(out, "hc_"))
        kd = PAR_HF_NAME_SCALE;
    *kind = kd;
    return PAR_OK;
}

/* ---------------------------------------------------------------- config -- */

/* Integer model keys whose HF name differs or is the same (HF name first). */
typedef struct {
    const char *hf;
    const char *ours;
} key_pair;

static const key_pair int_keys[] = {
    {"vocab_size", "vocab_size"},
    {"hidden_size", "dim"},
    {"num_hidden_layers", "n_layers"},
    {"num_hash_layers", "n_hash_layers"},
    {"num_nextn_predict_layers", "n_mtp_layers"},
    {"num_attention_heads", "n_heads"},
    {"head_dim", "head_dim"},
    {"qk_rope_head_dim", "rope_head_dim"},
    {"q_lora_rank", "q_lora_rank"},
    {"o_groups", "o_groups"},
    {"o_lora_rank", "o_lora_rank"},
    {"sliding_window", "window_size"},
    {"index_n_heads", "index_n_heads"},
    {"index_head_dim", "index_head_dim"},
    {"index_topk", "index_topk"},
    {"n_routed_experts", "n_routed_experts"},
    {"num_experts_per_tok", "n_activated_experts"},
    {"moe_intermediate_size", "moe_inter_dim"},
    {"n_shared_experts", "n_shared_experts"},
    {"hc_mult", "hc_mult"},
    {"hc_sinkhorn_iters", "hc_sinkhorn_iters"},
};

static const key_pair real_keys[] = {
    {"routed_scaling_factor", "route_scale"},
    {"swiglu_limit", "swiglu_limit"},
    {"hc_eps", "hc_eps"},
    {"rms_norm_eps", "norm_eps"},
    {"rope_theta", "rope_theta"},
    {"compress_rope_theta", "compress_rope_theta"},
};

/* rope_scaling members (YaRN). */
static const key_pair rope_keys[] = {
    {"factor", "rope_factor"},
    {"original_max_position_embeddings", "original_seq_len"},
    {"beta_fast", "beta_fast"},
    {"beta_slow", "beta_slow"},
};

static int add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v) != NULL; }

static int add_keys(cJSON *o, const par_config *cfg, const key_pair *keys, size_t n)
{
    char buf[64];
    for (size_t i = 0; i < n; i++) {
        if (par_config_get(cfg, keys[i].ours, buf, sizeof buf) != PAR_OK)
            return 0;
        if (!add_num(o, keys[i].hf, strtod(buf, NULL)))
            return 0;
    }
    return 1;
}

/* The fixed members of the release's config.json that describe this
 * architecture (values of the V4 release). */
static int add_fixed(cJSON *j)
{
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    return arch && cJSON_AddItemToArray(arch, cJSON_CreateString("DeepseekV4ForCausalLM")) &&
           cJSON_AddStringToObject(j, "model_type", "deepseek_v4") && add_num(j, "num_key_value_heads", 1) &&
           cJSON_AddStringToObject(j, "hidden_act", "silu") &&
           cJSON_AddStringToObject(j, "scoring_func", "sqrtsoftplus") &&
           cJSON_AddStringToObject(j, "topk_method", "noaux_tc") && cJSON_AddTrueToObject(j, "norm_topk_prob") &&
           cJSON_AddFalseToObject(j, "attention_bias") && add_num(j, "attention_dropout", 0.0) &&
           cJSON_AddFalseToObject(j, "tie_word_embeddings");
}

/* Adds item under key; on failure deletes it.  Returns 1 on success. */
static int add_owned(cJSON *o, const char *key, cJSON *item)
{
    if (o && item && cJSON_AddItemToObject(o, key, item))
        return 1;
    cJSON_Delete(item);
    return 0;
}

/* The "parity" object; consumes source. */
static cJSON *parity_block(const par_config *cfg, cJSON *source)
{
    cJSON *p = cJSON_CreateObject();
    int ok = p && cJSON_AddStringToObject(p, "format", "parity-hf-export") && add_num(p, "version", 1) &&
             cJSON_AddStringToObject(p, "preset", cfg->preset[0] ? cfg->preset : "custom");
    ok = add_owned(ok ? p : NULL, "model", par_config_section_to_json(cfg, PAR_CFG_MODEL)) && ok;
    ok = add_owned(ok ? p : NULL, "train", par_config_section_to_json(cfg, PAR_CFG_TRAIN)) && ok;
    ok = add_owned(ok ? p : NULL, "batch", par_config_section_to_json(cfg, PAR_CFG_BATCH)) && ok;
    if (source)
        ok = add_owned(ok ? p : NULL, "source", source) && ok;
    if (!ok) {
        cJSON_Delete(p);
        return NULL;
    }
    return p;
}

cJSON *par_hf_config_json(const par_config *cfg, par_hf_dtype d, cJSON *source)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *rope = cJSON_CreateObject();
    cJSON *ratios = cJSON_CreateArray();
    int ok = j && add_fixed(j) && add_keys(j, cfg, int_keys, sizeof int_keys / sizeof int_keys[0]) &&
             add_keys(j, cfg, real_keys, sizeof real_keys / sizeof real_keys[0]) &&
             add_num(j, "max_position_embeddings", (double)cfg->original_seq_len * cfg->rope_factor);
    ok = ok && rope && cJSON_AddStringToObject(rope, "type", "yarn") &&
         add_keys(rope, cfg, rope_keys, sizeof rope_keys / sizeof rope_keys[0]);
    for (int64_t b = 0; ok && ratios && b < cfg->n_compress_ratios; b++)
        ok = cJSON_AddItemToArray(ratios, cJSON_CreateNumber((double)cfg->compress_ratios[b]));
    ok = add_owned(ok ? j : NULL, "rope_scaling", rope) && ok;
    ok = add_owned(ok ? j : NULL, "compress_ratios", ratios) && ok;
    ok = ok && cJSON_AddStringToObject(j, "torch_dtype", par_hf_torch_dtype(d));
    cJSON *p = NULL;
    if (ok) {
        p = parity_block(cfg, source); /* consumes source */
        source = NULL;
        ok = p != NULL;
    }
    ok = add_owned(ok ? j : NULL, "parity", p) && ok;
    if (!ok) {
        cJSON_Delete(source);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static par_status set_int(par_config *c, const cJSON *j, const key_pair *k, const char *label)
{
    int64_t v;
    if (!par_json_int(j, k->hf, &v))
        return par_err(PAR_EFORMAT, "%s: needs the integer key '%s' (parity's %s)", label, k->hf, k->ours);
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    return par_config_set(c, k->ours, buf);
}

static par_status set_real(par_config *c, const cJSON *j, const key_pair *k, const char *label)
{
    double v;
    if (!par_json_num(j, k->hf, &v))
        return par_err(PAR_EFORMAT, "%s: needs the number key '%s' (parity's %s)", label, k->hf, k->ours);
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    return par_config_set(c, k->ours, buf);
}

int par_hf_quant_config_add(cJSON *j)
{
    cJSON *q = cJSON_AddObjectToObject(j, "quantization_config");
    int ok = q && cJSON_AddStringToObject(q, "activation_scheme", "dynamic") && cJSON_AddStringToObject(q, "fmt", "e4m3")
             && cJSON_AddStringToObject(q, "quant_method", "fp8") && cJSON_AddStringToObject(q, "scale_fmt", "ue8m0");
    const int bs[2] = {128, 128};
    cJSON *b = ok ? cJSON_CreateIntArray(bs, 2) : NULL;
    return b && cJSON_AddItemToObject(q, "weight_block_size", b);
}

/* quantization_config: the release's (fp8, e4m3, 128x128 blocks; scale_fmt
 * ue8m0 or absent, as V3's) or refused: the storage it describes is the
 * only one import reads (model/hfquant.h). */
static par_status check_quant_config(const cJSON *q, const char *label)
{
    const char *m = par_json_str(q, "quant_method"), *f = par_json_str(q, "fmt"), *sf = par_json_str(q, "scale_fmt");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
    int64_t b0 = 0, b1 = 0;
    int ok = cJSON_IsObject(q) && m && !strcmp(m, "fp8") && (!f || !strcmp(f, "e4m3")) && (!sf || !strcmp(sf, "ue8m0"))
             && cJSON_IsArray(b) && cJSON_GetArraySize(b) == 2 && par_json_as_int(cJSON_GetArrayItem(b, 0), &b0)
             && par_json_as_int(cJSON_GetArrayItem(b, 1), &b1) && b0 == 128 && b1 == 128;
    if (!ok)
        return par_err(PAR_EUNSUPPORTED, "%s: quantization_config is not the release's (quant_method \"fp8\", fmt "
                       "\"e4m3\", scale_fmt \"ue8m0\", weight_block_size [128,128]); parity reads only that storage "
                       "(docs/precisions.md)", label);
    return PAR_OK;
}

/* The members with one possible value (the architecture parity models). */
static par_status check_fixed(const cJSON *j, const char *label)
{
    int64_t kv;
    const char *s;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    par_status qs = qc ? check_quant_config(qc, label) : PAR_OK;
    if (qs)
        return qs;
    if (par_json_int(j, "num_key_value_heads", &kv) && kv != 1)
        return par_err(PAR_EINVAL, "%s: num_key_value_heads must be 1 (one shared KV head), got %lld", label,
                       (long long)kv);
    if ((s = par_json_str(j, "scoring_func")) && strcmp(s, "sqrtsoftplus"))
        return par_err(PAR_EINVAL, "%s: scoring_func must be \"sqrtsoftplus\" (MODEL.md 4), got \"%s\"", label, s);
    if (tie && !cJSON_IsFalse(tie))
        return par_err(PAR_EINVAL, "%s: tie_word_embeddings must be false (embed and head are separate)", label);
    return PAR_OK;
}

static par_status set_ratios(par_config *c, const cJSON *j, const char *label)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "compress_ratios");
    if (!cJSON_IsArray(r))
        return par_err(PAR_EFORMAT, "%s: needs the integer list 'compress_ratios'", label);
    char buf[PAR_MAX_BLOCKS * 12];
    size_t len = 0;
    int i = 0;
    buf[0] = 0;
    for (const cJSON *e = r->child; e; e = e->next, i++) {
        int64_t v;
        if (!par_json_as_int(e, &v) || i >= PAR_MAX_BLOCKS)
            return par_err(PAR_EFORMAT, "%s: compress_ratios[%d] is not an integer (or more than %d entries)",
                           label, i, PAR_MAX_BLOCKS);
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%lld", i ? "," : "", (long long)v);
    }
    return par_config_set(c, "compress_ratios", buf);
}

par_status par_hf_config_from_json(par_config *cfg, const cJSON *j, const char *label)
{
    par_config c;
    par_status s = par_config_preset(&c, "v4-tiny"); /* training/batch defaults */
    if (s)
        return s;
    snprintf(c.preset, sizeof c.preset, "custom");
    if (!cJSON_IsObject(j))
        return par_err(PAR_EFORMAT, "%s: config is not a JSON object", label);
    if ((s = check_fixed(j, label)))
        return s;
    for (size_t i = 0; !s && i < sizeof int_keys / sizeof int_keys[0]; i++)
        s = set_int(&c, j, &int_keys[i], label);
    for (size_t i = 0; !s && i < sizeof real_keys / sizeof real_keys[0]; i++)
        s = set_real(&c, j, &real_keys[i], label);
    const cJSON *rope = par_json_obj(j, "rope_scaling");
    const char *type = rope ? par_json_str(rope, "type") : NULL;
    if (!s && (!type || strcmp(type, "yarn")))
        s = par_err(PAR_EFORMAT, "%s: needs rope_scaling {\"type\": \"yarn\", factor, "
                    "original_max_position_embeddings, beta_fast, beta_slow}", label);
    for (size_t i = 0; !s && i < sizeof rope_keys / sizeof rope_keys[0]; i++)
        s = (i == 1) ? set_int(&c, rope, &rope_keys[i], label) : set_real(&c, rope, &rope_keys[i], label);
    if (!s)
        s = set_ratios(&c, j, label);
    const cJSON *p = par_json_obj(j, "parity");
    if (!s && p) {
        const char *preset = par_json_str(p, "preset");
        if (preset)
            snprintf(c.preset, sizeof c.preset, "%s", preset);
        if (par_json_obj(p, "train"))
            s = par_config_from_json(&c, par_json_obj(p, "train"));
        if (!s && par_json_obj(p, "batch"))
            s = par_config_from_json(&c, par_json_obj(p, "batch"));
    }
    if (!s)
        s = par_config_validate(&c);
    if (s)
        return s;
    *cfg = c;
    return PAR_OK;
}
