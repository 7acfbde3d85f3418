/* model/config.c - keys, parsing, JSON, validation of par_config. */
#include "model/config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "kernels/recipe.h"
#include "model/params.h"

typedef enum { KT_INT, KT_REAL, KT_RATIOS } key_type;

typedef struct {
    const char *name;
    key_type type;
    size_t off;
    par_config_section section;
} key_def;

#define KI(f) {#f, KT_INT, offsetof(par_config, f), PAR_CFG_MODEL}
#define KR(f) {#f, KT_REAL, offsetof(par_config, f), PAR_CFG_MODEL}
#define KB(f) {#f, KT_INT, offsetof(par_config, f), PAR_CFG_BATCH}
#define KT(f) {#f, KT_REAL, offsetof(par_config, f), PAR_CFG_TRAIN}

static const key_def keys[] = {
    KI(vocab_size), KI(dim), KI(n_layers), KI(n_hash_layers), KI(n_mtp_layers), KI(n_heads),
    KI(head_dim), KI(rope_head_dim), KI(q_lora_rank), KI(o_groups), KI(o_lora_rank),
    KI(window_size),
    {"compress_ratios", KT_RATIOS, offsetof(par_config, compress_ratios), PAR_CFG_MODEL},
    KI(index_n_heads), KI(index_head_dim), KI(index_topk), KI(n_routed_experts),
    KI(n_activated_experts), KI(moe_inter_dim), KI(n_shared_experts), KR(route_scale),
    KR(swiglu_limit), KI(hc_mult), KI(hc_sinkhorn_iters), KR(hc_eps), KR(norm_eps), KR(rope_theta),
    KR(compress_rope_theta), KR(rope_factor), KI(original_seq_len), KR(beta_fast), KR(beta_slow),
    KB(global_batch_size), KB(seq_length),
    KT(mtp_lambda), KT(aux_alpha), KT(bias_update_rate), KT(lr), KT(wd), KT(clip_grad), KT(mu),
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

const char *par_config_key_name(int i) { return (i >= 0 && i < N_KEYS) ? keys[i].name : NULL; }
par_config_section par_config_key_section(int i)
{
    return (i >= 0 && i < N_KEYS) ? keys[i].section : PAR_CFG_MODEL;
}

static const key_def *find_key(const char *name)
{
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

static int64_t *ifield(par_config *c, const key_def *k) { return (int64_t *)((char *)c + k->off); }
static double *rfield(par_config *c, const key_def *k) { return (double *)((char *)c + k->off); }
static const int64_t *cifield(const par_config *c, const key_def *k)
{
    return (const int64_t *)((const char *)c + k->off);
}
static const double *crfield(const par_config *c, const key_def *k)
{
    return (const double *)((const char *)c + k->off);
}

static int parse_i64(const char *s, int64_t *out)
{
    while (*s == ' ' || *s == '\t')
        s++;
    if (!*s)
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s)
        return -1;
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

static int parse_real(const char *s, double *out)
{
    while (*s == ' ' || *s == '\t')
        s++;
    if (!*s)
        return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v))
        return -1;
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

par_status par_config_set(par_config *cfg, const char *key, const char *value)
{
    if (!key || !value)
        return par_err(PAR_EINVAL, "config: set with a NULL key or value");
    const key_def *k = find_key(key);
    if (!k)
        return par_err(PAR_ENOTFOUND, "config key '%s': unknown key", key);
    switch (k->type) {
    case KT_INT: {
        int64_t v;
        if (parse_i64(value, &v))
            return par_err(PAR_EINVAL, "config key '%s': '%s' is not an integer", key, value);
        *ifield(cfg, k) = v;
        return PAR_OK;
    }
    case KT_REAL: {
        double v;
        if (parse_real(value, &v))
            return par_err(PAR_EINVAL, "config key '%s': '%s' is not a finite number", key, value);
        *rfield(cfg, k) = v;
        return PAR_OK;
    }
    case KT_RATIOS: {
        int64_t tmp[PAR_MAX_BLOCKS];
        int64_t n = 0;
        const char *p = value;
        char buf[64];
        for (;;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            if (len >= sizeof buf)
                return par_err(PAR_EINVAL, "config key '%s': entry %lld of '%s' is too long", key,
                               (long long)n, value);
            memcpy(buf, p, len);
            buf[len] = '\0';
            if (n >= PAR_MAX_BLOCKS)
                return par_err(PAR_EINVAL, "config key '%s': more than %d entries", key, PAR_MAX_BLOCKS);
            if (parse_i64(buf, &tmp[n]))
                return par_err(PAR_EINVAL, "config key '%s': entry %lld ('%s') of '%s' is not an integer",
                               key, (long long)n, buf, value);
            n++;
            if (!comma)
                break;
            p = comma + 1;
        }
        cfg->n_compress_ratios = n;
        memcpy(cfg->compress_ratios, tmp, (size_t)n * sizeof tmp[0]);
        return PAR_OK;
    }
    }
    return par_err(PAR_EINTERNAL, "config key '%s': bad key type", key);
}

par_status par_config_set_arg(par_config *cfg, const char *arg)
{
    const char *eq = arg ? strchr(arg, '=') : NULL;
    if (!eq || eq == arg)
        return par_err(PAR_EINVAL, "config: '%s' is not of the form key=value", arg ? arg : "(null)");
    char key[64];
    size_t len = (size_t)(eq - arg);
    if (len >= sizeof key)
        return par_err(PAR_ENOTFOUND, "config key '%.*s': unknown key", (int)len, arg);
    memcpy(key, arg, len);
    key[len] = '\0';
    return par_config_set(cfg, key, eq + 1);
}

par_status par_config_get(const par_config *cfg, const char *key, char *buf, int n)
{
    const key_def *k = find_key(key);
    if (!k)
        return par_err(PAR_ENOTFOUND, "config key '%s': unknown key", key);
    if (n <= 0)
        return par_err(PAR_EINVAL, "config key '%s': no room for the value", key);
    switch (k->type) {
    case KT_INT: snprintf(buf, (size_t)n, "%lld", (long long)*cifield(cfg, k)); break;
    case KT_REAL: snprintf(buf, (size_t)n, "%.17g", *crfield(cfg, k)); break;
    case KT_RATIOS: {
        int used = 0;
        buf[0] = '\0';
        for (int64_t i = 0; i < cfg->n_compress_ratios && used < n; i++)
            used += snprintf(buf + used, (size_t)(n - used), "%s%lld", i ? "," : "",
                             (long long)cfg->compress_ratios[i]);
        if (used >= n)
            return par_err(PAR_ERANGE, "config key '%s': value longer than %d characters", key, n - 1);
        break;
    }
    }
    return PAR_OK;
}

/* ---- JSON ---- */

static par_status apply_json_key(par_config *cfg, const cJSON *item)
{
    const char *key = item->string;
    if (!strcmp(key, PAR_CONFIG_NUMERICS_KEY)) { /* a manifest's mode record, not a model key */
        if (!cJSON_IsString(item) || (strcmp(item->valuestring, "bitwise") && strcmp(item->valuestring, "tolerance")))
            return par_err(PAR_EINVAL, "config key '%s': expected \"bitwise\" or \"tolerance\"", key);
        cfg->bitwise = !strcmp(item->valuestring, "bitwise");
        return PAR_OK;
    }
    if (!strcmp(key, PAR_CONFIG_RECIPE_KEY)) { /* a manifest's recipe record */
        par_recipe r;
        if (!cJSON_IsString(item) || par_recipe_parse(item->valuestring, &r))
            return par_err(PAR_EINVAL, "config key '%s': expected one of \"none\", \"bf16\", \"fp8\", \"v4\"", key);
        cfg->recipe = r;
        return PAR_OK;
    }
    const key_def *k = find_key(key);
    if (!k)
        return par_err(PAR_ENOTFOUND, "config key '%s': unknown key", key);
    switch (k->type) {
    case KT_INT: {
        if (!cJSON_IsNumber(item))
            return par_err(PAR_EINVAL, "config key '%s': expected an integer", key);
        double d = item->valuedouble;
        if (d != floor(d) || fabs(d) > 9.0e15)
            return par_err(PAR_EINVAL, "config key '%s': %.17g is not an integer", key, d);
        *ifield(cfg, k) = (int64_t)d;
        return PAR_OK;
    }
    case KT_REAL:
        if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
            return par_err(PAR_EINVAL, "config key '%s': expected a finite number", key);
        *rfield(cfg, k) = item->valuedouble;
        return PAR_OK;
    case KT_RATIOS: {
        if (cJSON_IsString(item))
            return par_config_set(cfg, key, item->valuestring);
        if (!cJSON_IsArray(item))
            return par_err(PAR_EINVAL, "config key '%s': expected an array of integers", key);
        int n = cJSON_GetArraySize(item);
        if (n > PAR_MAX_BLOCKS)
            return par_err(PAR_EINVAL, "config key '%s': %d entries, at most %d", key, n, PAR_MAX_BLOCKS);
        int64_t tmp[PAR_MAX_BLOCKS];
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, item)
        {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || fabs(e->valuedouble) > 9.0e15)
                return par_err(PAR_EINVAL, "config key '%s': entry %d is not an integer", key, i);
            tmp[i++] = (int64_t)e->valuedouble;
        }
        cfg->n_compress_ratios = n;
        memcpy(cfg->compress_ratios, tmp, (size_t)n * sizeof tmp[0]);
        return PAR_OK;
    }
    }
    return par_err(PAR_EINTERNAL, "config key '%s': bad key type", key);
}

par_status par_config_from_json(par_config *cfg, const cJSON *obj)
{
    if (!cJSON_IsObject(obj))
        return par_err(PAR_EINVAL, "config: JSON value is not an object");
    par_config c = *cfg;
    par_status st;
    const cJSON *preset = cJSON_GetObjectItemCaseSensitive(obj, "preset");
    if (preset) {
        if (!cJSON_IsString(preset))
            return par_err(PAR_EINVAL, "config key 'preset': expected a string");
        if ((st = par_config_preset(&c, preset->valuestring)))
            return st;
    }
    const cJSON *item;
    cJSON_ArrayForEach(item, obj)
    {
        if (!item->string)
            continue;
        if (!strcmp(item->string, "preset"))
            continue;
        if (!strcmp(item->string, "model") || !strcmp(item->string, "train") ||
            !strcmp(item->string, "batch")) {
            if (!cJSON_IsObject(item))
                return par_err(PAR_EINVAL, "config key '%s': expected an object", item->string);
            const cJSON *sub;
            cJSON_ArrayForEach(sub, item)
            {
                if ((st = apply_json_key(&c, sub)))
                    return st;
            }
            continue;
        }
        if ((st = apply_json_key(&c, item)))
            return st;
    }
    *cfg = c;
    return PAR_OK;
}

par_status par_config_load_file(par_config *cfg, const char *path)
{
    void *data;
    size_t n;
    par_status st = par_file_read(path, PAR_TAG_IO, &data, &n); /* regular files only (a FIFO never blocks) */
    if (st)
        return st;
    char *text = data;
    cJSON *root = cJSON_ParseWithLength(text, n);
    if (!root) {
        st = par_err(PAR_EFORMAT, "%s: not valid JSON (near byte %ld)", path,
                     cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - text) : -1L);
        goto fail_free_text;
    }
    st = par_config_from_json(cfg, root);
    if (st) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", par_last_error());
        par_err(st, "%s: %s", path, msg);
    }
    cJSON_Delete(root);
fail_free_text:
    par_free(text);
    return st;
}

static int add_key_json(cJSON *o, const par_config *cfg, const key_def *k)
{
    cJSON *v = NULL;
    switch (k->type) {
    case KT_INT: v = cJSON_CreateNumber((double)*cifield(cfg, k)); break;
    case KT_REAL: v = cJSON_CreateNumber(*crfield(cfg, k)); break;
    case KT_RATIOS:
        v = cJSON_CreateArray();
        for (int64_t i = 0; v && i < cfg->n_compress_ratios; i++) {
            cJSON *e = cJSON_CreateNumber((double)cfg->compress_ratios[i]);
            if (!e || !cJSON_AddItemToArray(v, e)) {
                cJSON_Delete(e);
                cJSON_Delete(v);
                return -1;
            }
        }
        break;
    }
    if (!v)
        return -1;
    if (!cJSON_AddItemToObject(o, k->name, v)) {
        cJSON_Delete(v);
        return -1;
    }
    return 0;
}

cJSON *par_config_section_to_json(const par_config *cfg, par_config_section section)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    for (int i = 0; i < N_KEYS; i++)
        if (keys[i].section == section && add_key_json(o, cfg, &keys[i])) {
            cJSON_Delete(o);
            return NULL;
        }
    /* the bitwise mode is recorded (the tolerance mode's manifests stay as they were) */
    if (section == PAR_CFG_TRAIN && cfg->bitwise && !cJSON_AddStringToObject(o, PAR_CONFIG_NUMERICS_KEY, "bitwise")) {
        cJSON_Delete(o);
        return NULL;
    }
    /* so is a recipe (a set without one stays as it was) */
    if (section == PAR_CFG_TRAIN && cfg->recipe != PAR_RECIPE_NONE &&
        !cJSON_AddStringToObject(o, PAR_CONFIG_RECIPE_KEY, par_recipe_name((par_recipe)cfg->recipe))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *par_config_to_json(const par_config *cfg)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (!cJSON_AddStringToObject(o, "preset", cfg->preset[0] ? cfg->preset : "custom"))
        goto fail_delete;
    for (int i = 0; i < N_KEYS; i++)
        if (add_key_json(o, cfg, &keys[i]))
            goto fail_delete;
    return o;
fail_delete:
    cJSON_Delete(o);
    return NULL;
}

/* ---- validation ---- */

#define BAD(...) return par_err(PAR_EINVAL, __VA_ARGS__)

/* Range of every integer key.  The upper bounds leave v4-pro (the largest
 * preset) a wide margin and keep every size product of the parameter table
 * and the activations inside int64 (and every GEMM dimension inside the
 * int32 of BLAS): docs/model.md ("Validation"). */
typedef struct {
    const char *name;
    int64_t lo, hi;
} int_range;

static const int_range int_ranges[] = {
    {"vocab_size", 1, (int64_t)1 << 24},      {"dim", 1, (int64_t)1 << 16},
    {"n_layers", 1, PAR_MAX_BLOCKS - 1},      {"n_heads", 1, 4096},
    {"head_dim", 1, (int64_t)1 << 14},        {"rope_head_dim", 1, (int64_t)1 << 14},
    {"q_lora_rank", 1, (int64_t)1 << 16},     {"o_groups", 1, 4096},
    {"o_lora_rank", 1, (int64_t)1 << 16},     {"window_size", 1, (int64_t)1 << 24},
    {"index_n_heads", 1, 4096},               {"index_head_dim", 1, (int64_t)1 << 14},
    {"index_topk", 1, (int64_t)1 << 24},      {"n_routed_experts", 1, (int64_t)1 << 16},
    {"n_activated_experts", 1, 1024},         {"moe_inter_dim", 1, (int64_t)1 << 16},
    {"hc_mult", 1, 64},                       {"hc_sinkhorn_iters", 1, 1000},
    {"original_seq_len", 1, INT32_MAX},       {"global_batch_size", 1, (int64_t)1 << 24},
    {"seq_length", 1, (int64_t)1 << 24},      {NULL, 0, 0},
};

/* Largest compress ratio and tokens per step (B * S, the rows of every GEMM). */
#define MAX_RATIO ((int64_t)1 << 24)
#define MAX_TOKENS_PER_STEP ((int64_t)INT32_MAX)

par_status par_config_validate(const par_config *c)
{
    for (int i = 0; int_ranges[i].name; i++) {
        int64_t v = *cifield(c, find_key(int_ranges[i].name));
        if (v < int_ranges[i].lo)
            BAD("config: %s must be >= %lld, got %lld", int_ranges[i].name, (long long)int_ranges[i].lo,
                (long long)v);
        if (v > int_ranges[i].hi)
            BAD("config: %s must be <= %lld, got %lld (the range is [%lld, %lld])", int_ranges[i].name,
                (long long)int_ranges[i].hi, (long long)v, (long long)int_ranges[i].lo,
                (long long)int_ranges[i].hi);
    }
    if (c->global_batch_size * c->seq_length > MAX_TOKENS_PER_STEP) /* both <= 2^24: no overflow */
        BAD("config: global_batch_size * seq_length = %lld * %lld = %lld tokens per step, at most %lld",
            (long long)c->global_batch_size, (long long)c->seq_length,
            (long long)(c->global_batch_size * c->seq_length), (long long)MAX_TOKENS_PER_STEP);
    if (c->n_hash_layers < 0 || c->n_hash_layers > c->n_layers)
        BAD("config: n_hash_layers must be in [0, n_layers = %lld], got %lld", (long long)c->n_layers,
            (long long)c->n_hash_layers);
    if (c->n_mtp_layers != 0 && c->n_mtp_layers != 1)
        BAD("config: n_mtp_layers must be 0 or 1, got %lld", (long long)c->n_mtp_layers);
    if (c->n_shared_experts != 1)
        BAD("config: n_shared_experts must be 1 (as the reference asserts), got %lld",
            (long long)c->n_shared_experts);
    int64_t nb = c->n_layers + c->n_mtp_layers;
    if (nb > PAR_MAX_BLOCKS)
        BAD("config: n_layers + n_mtp_layers = %lld exceeds the supported %d", (long long)nb,
            PAR_MAX_BLOCKS);
    if (c->n_compress_ratios != nb)
        BAD("config: compress_ratios has %lld entries, must have n_layers + n_mtp_layers = %lld + %lld = %lld",
            (long long)c->n_compress_ratios, (long long)c->n_layers, (long long)c->n_mtp_layers,
            (long long)nb);
    for (int64_t b = 0; b < nb; b++) {
        int64_t m = c->compress_ratios[b];
        if (!(m == 0 || m == 4 || m > 4) || m > MAX_RATIO)
            BAD("config: compress_ratios[%lld] = %lld must be 0, 4 or > 4 (and <= %lld)", (long long)b,
                (long long)m, (long long)MAX_RATIO);
    }
    if (c->n_activated_experts < 1 || c->n_activated_experts > c->n_routed_experts)
        BAD("config: n_activated_experts must be in [1, n_routed_experts = %lld], got %lld",
            (long long)c->n_routed_experts, (long long)c->n_activated_experts);
    if (c->rope_head_dim % 2)
        BAD("config: rope_head_dim must be even (complex pairs), got %lld", (long long)c->rope_head_dim);
    if (c->rope_head_dim > c->head_dim)
        BAD("config: rope_head_dim = %lld must be <= head_dim = %lld", (long long)c->rope_head_dim,
            (long long)c->head_dim);
    if (c->rope_head_dim > c->index_head_dim)
        BAD("config: rope_head_dim = %lld must be <= index_head_dim = %lld", (long long)c->rope_head_dim,
            (long long)c->index_head_dim);
    if (c->n_heads % c->o_groups)
        BAD("config: n_heads = %lld must be divisible by o_groups = %lld", (long long)c->n_heads,
            (long long)c->o_groups);
    if (!(c->norm_eps > 0))
        BAD("config: norm_eps must be > 0, got %g", c->norm_eps);
    if (!(c->hc_eps >= 0))
        BAD("config: hc_eps must be >= 0, got %g", c->hc_eps);
    if (!(c->route_scale > 0))
        BAD("config: route_scale must be > 0, got %g", c->route_scale);
    if (!(c->swiglu_limit >= 0))
        BAD("config: swiglu_limit must be >= 0 (0 disables the clamp), got %g", c->swiglu_limit);
    if (!(c->rope_theta > 1))
        BAD("config: rope_theta must be > 1, got %g", c->rope_theta);
    if (!(c->compress_rope_theta > 1))
        BAD("config: compress_rope_theta must be > 1, got %g", c->compress_rope_theta);
    if (!(c->rope_factor > 0))
        BAD("config: rope_factor must be > 0, got %g", c->rope_factor);
    if (!(c->beta_slow > 0) || !(c->beta_fast > c->beta_slow))
        BAD("config: need beta_fast > beta_slow > 0, got beta_fast = %g, beta_slow = %g", c->beta_fast,
            c->beta_slow);
    if (!(c->mtp_lambda >= 0))
        BAD("config: mtp_lambda must be >= 0, got %g", c->mtp_lambda);
    if (!(c->aux_alpha >= 0))
        BAD("config: aux_alpha must be >= 0, got %g", c->aux_alpha);
    if (!(c->bias_update_rate >= 0))
        BAD("config: bias_update_rate must be >= 0, got %g", c->bias_update_rate);
    if (!(c->lr >= 0))
        BAD("config: lr must be >= 0, got %g", c->lr);
    if (!(c->wd >= 0))
        BAD("config: wd must be >= 0, got %g", c->wd);
    if (!(c->clip_grad > 0))
        BAD("config: clip_grad must be > 0, got %g", c->clip_grad);
    if (!(c->mu >= 0 && c->mu < 1))
        BAD("config: mu must be in [0, 1), got %g", c->mu);
    return PAR_OK;
}

static void human(double v, char *buf, size_t n)
{
    const char *u[] = {"", "K", "M", "G", "T", "P"};
    int i = 0;
    while (v >= 1000.0 && i < 5) {
        v /= 1000.0;
        i++;
    }
    snprintf(buf, n, "%.3g%s", v, u[i]);
}

par_status par_config_check_runnable(const par_config *cfg)
{
    if (cfg->runnable)
        return PAR_OK;
    int64_t nt = 0, nf = 0, ni = 0;
    par_status st = par_config_validate(cfg);
    if (!st)
        st = par_param_count(cfg, &nt, &nf, &ni);
    if (st) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", par_last_error());
        return par_err(PAR_EUNSUPPORTED, "config '%s' is for planning only (and does not validate: %s)",
                       cfg->preset, msg);
    }
    char p[32], b32[32], b64[32], tr[32];
    human((double)nf, p, sizeof p);
    human((double)nf * 4.0, b32, sizeof b32);
    human((double)nf * 8.0, b64, sizeof b64);
    /* params + grads + Muon/Adam state (2 slots), f32 */
    human((double)nf * 4.0 * 4.0, tr, sizeof tr);
    return par_err(PAR_EUNSUPPORTED,
                   "config '%s' is for planning only: %s parameters in %lld tensors (%sB of weights in f32, "
                   "%sB in f64; about %sB for weights+grads+optimizer state in f32 on one rank); "
                   "use v4-tiny or v4-mini to run",
                   cfg->preset, p, (long long)nt, b32, b64, tr);
}
