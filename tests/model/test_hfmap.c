/* tests/model/test_hfmap.c - the HF checkpoint mapping (model/hfmap.h) and
 * export/import (model/hfckpt.h): v4-flash's table against the release's
 * tensor listing (tests/model/data/hf_v4flash_listing.txt), the config keys
 * against the release's config.json values, convert.py's renames, and the
 * bitwise fp64 round trip of the checked-in golden set. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "model/hfckpt.h"
#include "model/hfmap.h"
#include "model/params.h"
#include "tmpdir.h"

static const char *src_root(void)
{
    const char *r = getenv("PARITY_SOURCE_ROOT");
    return r ? r : ".";
}

/* ---- the release listing: "name [d0,d1] STORE", {a-b} and {a-b/2} ranges ---- */

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    char store[8];
    int seen;
} listed;

typedef struct {
    listed *v;
    int n, cap;
} listing;

static void push(listing *l, const char *name, int ndim, const int64_t *sh, const char *store)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
        cr_assert(l->v);
    }
    listed *e = &l->v[l->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = ndim;
    e->shape[0] = sh[0];
    e->shape[1] = ndim == 2 ? sh[1] : 1;
    snprintf(e->store, sizeof e->store, "%s", store);
    e->seen = 0;
}

/* Expands the first {range} of pat (recursively). */
static void expand(listing *l, const char *pat, int ndim, const int64_t *sh, const char *store)
{
    const char *o = strchr(pat, '{');
    if (!o) {
        push(l, pat, ndim, sh, store);
        return;
    }
    int a, b, step = 1;
    const char *c = strchr(o, '}');
    cr_assert(c && sscanf(o, "{%d-%d", &a, &b) == 2, "bad pattern %s", pat);
    if (memchr(o, '/', (size_t)(c - o)))
        step = 2;
    for (int k = a; k <= b; k += step) {
        char buf[160];
        snprintf(buf, sizeof buf, "%.*s%d%s", (int)(o - pat), pat, k, c + 1);
        expand(l, buf, ndim, sh, store);
    }
}

static listing read_listing(void)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tests/model/data/hf_v4flash_listing.txt", src_root());
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    listing l = {0};
    char line[256], name[128], shape[64], store[16];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        cr_assert_eq(sscanf(line, "%127s %63s %15s", name, shape, store), 3, "bad line %s", line);
        int64_t sh[2] = {0, 0};
        long long d0, d1;
        int ndim = sscanf(shape, "[%lld,%lld]", &d0, &d1);
        sh[0] = d0;
        sh[1] = ndim == 2 ? d1 : 1;
        expand(&l, name, ndim, sh, store);
    }
    fclose(f);
    return l;
}

static listed *find_listed(listing *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].name, name))
            return &l->v[i];
    return NULL;
}

Test(hfmap, v4_flash_table_is_the_release_listing)
{
    listing l = read_listing();
    cr_assert_eq(l.n, 35020, "listing expands to %d tensors", l.n);
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-flash"), 0);
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &cfg), 0, "%s", par_last_error());
    cr_assert_eq(t.n, l.n, "table %d tensors, listing %d", t.n, l.n);
    int quantized = 0;
    char hf[PAR_PARAM_NAME_MAX];
    for (int i = 0; i < t.n; i++) {
        const par_param *p = &t.p[i];
        listed *e = find_listed(&l, par_hf_name(&t, i, hf, sizeof hf));
        cr_assert(e, "'%s' is not in the release listing", hf);
        cr_assert(!e->seen, "'%s' twice", hf);
        e->seen = 1;
        par_hf_store st = par_hf_store_of(p);
        cr_assert_str_eq(par_hf_store_name(st), e->store, "%s: store %s, release %s", hf, par_hf_store_name(st),
                         e->store);
        int64_t in = st == PAR_HF_STORE_FP4 ? 2 * e->shape[1] : e->shape[1]; /* two e2m1 per byte */
        cr_assert(p->ndim == e->ndim && p->shape[0] == e->shape[0] && p->shape[1] == in,
                  "%s: table [%lld,%lld], release [%lld,%lld]", hf, (long long)p->shape[0],
                  (long long)p->shape[1], (long long)e->shape[0], (long long)in);
        quantized += st == PAR_HF_STORE_FP8 || st == PAR_HF_STORE_FP4;
    }
    /* the release holds one .scale per quantized weight: 69,187 tensors in all */
    cr_assert_eq(t.n + quantized, 69187, "%d + %d scales", t.n, quantized);
    par_param_table_free(&t);
    free(l.v);
}

/* ---- config.json: the values of the V4-Flash release's config.json ---- */

static double num(const cJSON *j, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    cr_assert(cJSON_IsNumber(v), "config.json lacks number '%s'", k);
    return v->valuedouble;
}

static const char *str(const cJSON *j, const char *k)
{
    const char *s = par_json_str(j, k);
    cr_assert(s, "config.json lacks string '%s'", k);
    return s;
}

Test(hfmap, v4_flash_config_has_the_release_values)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-flash"), 0);
    cJSON *j = par_hf_config_json(&cfg, PAR_HF_BF16, NULL);
    cr_assert(j);
    static const struct {
        const char *k;
        double v;
    } want[] = {{"vocab_size", 129280},   {"hidden_size", 4096},          {"num_hidden_layers", 43},
                {"num_hash_layers", 3},    {"num_nextn_predict_layers", 1}, {"num_attention_heads", 64},
                {"num_key_value_heads", 1}, {"head_dim", 512},             {"qk_rope_head_dim", 64},
                {"q_lora_rank", 1024},     {"o_groups", 8},                {"o_lora_rank", 1024},
                {"sliding_window", 128},   {"n_routed_experts", 256},      {"num_experts_per_tok", 6},
                {"moe_intermediate_size", 2048}, {"n_shared_experts", 1},  {"routed_scaling_factor", 1.5},
                {"swiglu_limit", 10},      {"index_n_heads", 64},          {"index_head_dim", 128},
                {"index_topk", 512},       {"hc_mult", 4},                 {"hc_sinkhorn_iters", 20},
                {"hc_eps", 1e-6},          {"rms_norm_eps", 1e-6},         {"rope_theta", 10000},
                {"compress_rope_theta", 160000}, {"max_position_embeddings", 1048576}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_eq(num(j, want[i].k), want[i].v, "%s = %g, release %g", want[i].k, num(j, want[i].k), want[i].v);
    const cJSON *rope = par_json_obj(j, "rope_scaling");
    cr_assert(rope);
    cr_expect_str_eq(str(rope, "type"), "yarn");
    cr_expect_eq(num(rope, "factor"), 16);
    cr_expect_eq(num(rope, "original_max_position_embeddings"), 65536);
    cr_expect_eq(num(rope, "beta_fast"), 32);
    cr_expect_eq(num(rope, "beta_slow"), 1);
    cr_expect_str_eq(str(j, "model_type"), "deepseek_v4");
    cr_expect_str_eq(str(j, "scoring_func"), "sqrtsoftplus");
    cr_expect_str_eq(str(j, "torch_dtype"), "bfloat16");
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings")));
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "compress_ratios");
    cr_assert_eq(cJSON_GetArraySize(r), 44);
    int k = 0; /* [0, 0, (4, 128) x 20, 4, 0] */
    for (const cJSON *e = r->child; e; e = e->next, k++) {
        int expect = (k < 2 || k == 43) ? 0 : (k % 2 == 0 ? 4 : 128);
        cr_expect_eq(e->valuedouble, expect, "compress_ratios[%d]", k);
    }
    /* and back: every model key the same */
    par_config back;
    cr_assert_eq(par_hf_config_from_json(&back, j, "test"), 0, "%s", par_last_error());
    char a[2048], b[2048];
    for (int i = 0; par_config_key_name(i); i++) {
        const char *key = par_config_key_name(i);
        cr_assert_eq(par_config_get(&cfg, key, a, sizeof a), 0);
        cr_assert_eq(par_config_get(&back, key, b, sizeof b), 0);
        cr_expect_str_eq(a, b, "%s: %s -> %s", key, a, b);
    }
    cJSON_Delete(j);
}

Test(hfmap, config_refusals_name_the_key)
{
    par_config cfg, out;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    par_err_set_quiet(1);
    cJSON *j = par_hf_config_json(&cfg, PAR_HF_FP64, NULL);
    cJSON_AddItemToObject(j, "quantization_config", cJSON_CreateObject());
    cr_expect_eq(par_hf_config_from_json(&out, j, "c"), PAR_EUNSUPPORTED);
    cr_expect(strstr(par_last_error(), "quantization_config"));
    cJSON_DeleteItemFromObject(j, "quantization_config");
    cJSON_ReplaceItemInObject(j, "scoring_func", cJSON_CreateString("sigmoid"));
    cr_expect_eq(par_hf_config_from_json(&out, j, "c"), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "scoring_func"));
    cJSON_ReplaceItemInObject(j, "scoring_func", cJSON_CreateString("sqrtsoftplus"));
    cJSON_DeleteItemFromObject(j, "sliding_window");
    cr_expect_eq(par_hf_config_from_json(&out, j, "c"), PAR_EFORMAT);
    cr_expect(strstr(par_last_error(), "sliding_window") && strstr(par_last_error(), "window_size"));
    par_err_set_quiet(0);
    cJSON_Delete(j);
}

/* ---- convert.py's renames ---- */

Test(hfmap, convert_py_renames)
{
    static const struct {
        const char *in, *out;
        par_hf_name_kind kind;
    } cases[] = {
        {"layers.3.attn.wq_a.weight", "layers.3.attn.wq_a.weight", PAR_HF_NAME_PARAM},
        {"model.layers.0.self_attn.q_a_proj.weight", "layers.0.attn.wq_a.weight", PAR_HF_NAME_PARAM},
        {"model.layers.0.self_attn.q_a_layernorm.weight", "layers.0.attn.q_norm.weight", PAR_HF_NAME_PARAM},
        {"model.layers.0.self_attn.kv_a_layernorm.weight", "layers.0.attn.kv_norm.weight", PAR_HF_NAME_PARAM},
        {"model.layers.2.input_layernorm.weight", "layers.2.attn_norm.weight", PAR_HF_NAME_PARAM},
        {"model.layers.2.post_attention_layernorm.weight", "layers.2.ffn_norm.weight", PAR_HF_NAME_PARAM},
        {"model.layers.4.mlp.experts.7.gate_proj.weight", "layers.4.ffn.experts.7.w1.weight", PAR_HF_NAME_PARAM},
        {"model.layers.4.mlp.experts.7.down_proj.weight", "layers.4.ffn.experts.7.w2.weight", PAR_HF_NAME_PARAM},
        {"model.layers.4.mlp.shared_experts.up_proj.weight", "layers.4.ffn.shared_experts.w3.weight",
         PAR_HF_NAME_PARAM},
        {"model.layers.4.mlp.gate.e_score_correction_bias", "layers.4.ffn.gate.bias", PAR_HF_NAME_PARAM},
        {"model.embed_tokens.weight", "embed.weight", PAR_HF_NAME_PARAM},
        {"lm_head.weight", "head.weight", PAR_HF_NAME_PARAM},
        {"layers.1.hc_attn_scale", "layers.1.hc_attn_scale", PAR_HF_NAME_PARAM},
        {"mtp.0.embed.weight", "mtp.0.embed.weight", PAR_HF_NAME_SKIP},
        {"mtp.0.head.weight", "mtp.0.head.weight", PAR_HF_NAME_SKIP},
        {"mtp.0.hc_head_fn", "mtp.0.hc_head_fn", PAR_HF_NAME_PARAM},
        {"layers.0.attn.wq_a.scale", "layers.0.attn.wq_a.scale", PAR_HF_NAME_SCALE},
        {"model.layers.0.self_attn.q_a_proj.weight_scale_inv", "layers.0.attn.wq_a.scale", PAR_HF_NAME_SCALE},
    };
    char out[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        par_hf_name_kind k;
        cr_assert_eq(par_hf_normalize_name(cases[i].in, out, sizeof out, &k), 0);
        cr_expect_str_eq(out, cases[i].out, "%s", cases[i].in);
        cr_expect_eq(k, cases[i].kind, "%s: kind %d", cases[i].in, k);
    }
}

/* ---- export / import of the checked-in golden set ---- */

static par_config tiny_cfg(void)
{
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    return cfg;
}

static par_st_file *golden_params(int k)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/golden/v4-tiny/params.%d.safetensors", src_root(), k);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(path, &f), 0, "%s", par_last_error());
    return f;
}

static void export_to(const par_st_file *f, const char *out, par_hf_dtype d, int64_t cap, par_hf_export_info *info)
{
    par_config cfg = tiny_cfg();
    par_hf_export_opts o = {.dtype = d, .max_shard_bytes = cap, .source = NULL};
    cr_assert_eq(par_hf_export(&cfg, f, "golden", out, &o, info), 0, "%s", par_last_error());
}

/* Every tensor of a equal to the one of b, bit for bit, and the same names. */
static void expect_same_tensors(const par_st_file *a, const par_st_file *b)
{
    cr_assert_eq(par_st_count(a), par_st_count(b));
    for (int i = 0; i < par_st_count(a); i++) {
        const par_tensor *x = par_st_tensor(a, i), *y = par_st_find(b, par_st_name(a, i));
        cr_assert(y, "'%s' missing after the round trip", par_st_name(a, i));
        cr_assert(x->dtype == y->dtype && par_tensor_same_shape(x, y), "%s", par_st_name(a, i));
        cr_assert(!memcmp(x->data, y->data, par_tensor_nbytes(x)), "'%s' differs", par_st_name(a, i));
    }
}

Test(hfmap, fp64_round_trip_is_bitwise_with_optimizer_state)
{
    char *d = mktmp(), *out = sub(d, "hf"), *back = sub(d, "back.safetensors");
    par_st_file *g = golden_params(1);
    par_hf_export_info info;
    export_to(g, out, PAR_HF_FP64, 100000, &info);
    cr_expect_eq(info.n_tensors, 208);
    cr_expect_gt(info.n_shards, 1, "a 100 kB cap splits 869 kB into shards");
    cr_expect_gt(info.n_opt, 0);
    par_hf_import_info ii;
    cr_assert_eq(par_hf_import(out, 64, back, &ii), 0, "%s", par_last_error());
    cr_expect_eq(ii.n_tensors, 208);
    cr_expect_eq(ii.n_opt, info.n_opt);
    par_st_file *r = NULL;
    cr_assert_eq(par_st_read(back, &r), 0);
    expect_same_tensors(g, r);
    par_st_close(r);
    par_st_close(g);
    rmtree(d);
    free(out), free(back), free(d);
}

Test(hfmap, index_names_shapes_and_shard_cap)
{
    char *d = mktmp(), *out = sub(d, "hf");
    par_st_file *g = golden_params(0);
    par_hf_export_info info;
    export_to(g, out, PAR_HF_FP32, 150000, &info);
    char *ip = sub(out, PAR_HF_INDEX_NAME);
    cJSON *idx = NULL;
    cr_assert_eq(par_json_read_file(ip, &idx), 0);
    const cJSON *map = par_json_obj(idx, "weight_map");
    par_config cfg = tiny_cfg();
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &cfg), 0);
    cr_assert_eq(cJSON_GetArraySize(map), t.n);
    int64_t total = 0;
    for (int i = 0; i < t.n; i++) {
        const par_param *p = &t.p[i];
        const char *shard = par_json_str(map, p->name);
        cr_assert(shard, "index lacks %s", p->name);
        char *sp = sub(out, shard);
        par_st_file *f = NULL;
        cr_assert_eq(par_st_read(sp, &f), 0);
        cr_assert_str_eq(par_st_meta(f, "format"), "pt");
        const par_tensor *x = par_st_find(f, p->name);
        cr_assert(x && x->ndim == p->ndim && x->shape[0] == p->shape[0] && (p->ndim == 1 || x->shape[1] == p->shape[1]),
                  "%s: shape", p->name);
        cr_expect_eq(x->dtype, p->dtype == PAR_PDT_I32 ? PAR_I64 : PAR_F32, "%s", p->name);
        total += (int64_t)par_tensor_nbytes(x);
        par_st_close(f);
        free(sp);
    }
    double ts = 0;
    cr_assert(par_json_num(par_json_obj(idx, "metadata"), "total_size", &ts));
    cr_expect_eq((int64_t)ts, total);
    cr_expect_eq(info.total_bytes, total);
    cJSON_Delete(idx);
    par_param_table_free(&t);
    par_st_close(g);
    rmtree(d);
    free(ip), free(out), free(d);
}

Test(hfmap, bf16_keeps_the_release_float32_tensors)
{
    char *d = mktmp(), *out = sub(d, "hf"), *shard = sub(out, "model-00001-of-00001.safetensors");
    par_st_file *g = golden_params(0);
    export_to(g, out, PAR_HF_BF16, 0, NULL);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(shard, &f), 0, "%s", par_last_error());
    par_config cfg = tiny_cfg();
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &cfg), 0);
    int n_f32 = 0;
    for (int i = 0; i < t.n; i++) {
        const par_param *p = &t.p[i];
        const par_tensor *x = par_st_find(f, p->name), *s = par_st_find(g, p->name);
        par_hf_store st = par_hf_store_of(p);
        par_dtype want = st == PAR_HF_STORE_I64 ? PAR_I64 : st == PAR_HF_STORE_F32 ? PAR_F32 : PAR_BF16;
        cr_assert_eq(x->dtype, want, "%s: %s", p->name, par_dtype_name(x->dtype));
        n_f32 += want == PAR_F32;
        for (int64_t k = 0; want == PAR_BF16 && k < p->numel; k++)
            cr_assert_eq(((const uint16_t *)x->data)[k], par_bf16_from_f64(((const double *)s->data)[k]),
                         "%s[%lld]", p->name, (long long)k);
        for (int64_t k = 0; want == PAR_I64 && k < p->numel; k++)
            cr_assert_eq(((const int64_t *)x->data)[k], ((const int32_t *)s->data)[k]);
    }
    /* v4-tiny: 4 blocks x (6 hc + sink) + 3 ape + 3 bias + hc_head 3 + mtp hc_head 3 */
    cr_expect_eq(n_f32, 4 * 7 + 3 + 3 + 6, "%d F32 tensors", n_f32);
    par_param_table_free(&t);
    par_st_close(f);
    par_st_close(g);
    rmtree(d);
    free(shard), free(out), free(d);
}

Test(hfmap, refusals_name_the_tensor_and_leave_nothing)
{
    char *d = mktmp(), *out = sub(d, "hf"), *back = sub(d, "back.safetensors");
    par_st_file *g = golden_params(0);
    par_err_set_quiet(1);
    par_config mini;
    cr_assert_eq(par_config_preset(&mini, "v4-mini"), 0);
    par_hf_export_opts o = {.dtype = PAR_HF_FP64};
    cr_expect_eq(par_hf_export(&mini, g, "golden", out, &o, NULL), PAR_EMISMATCH);
    cr_expect(strstr(par_last_error(), "embed.weight") && strstr(par_last_error(), "[128,32]"));
    cr_expect(!par_path_exists(out), "a failed export leaves no OUT");
    /* a .scale tensor next to an unquantized weight */
    export_to(g, out, PAR_HF_FP64, 0, NULL);
    char *sp = sub(out, "model-00001-of-00001.safetensors"), *ip = sub(out, PAR_HF_INDEX_NAME);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(sp, &f), 0);
    par_st_writer *w = NULL;
    cr_assert_eq(par_st_writer_new(&w), 0);
    for (int i = 0; i < par_st_count(f); i++)
        cr_assert_eq(par_st_writer_add(w, par_st_name(f, i), par_st_tensor(f, i)), 0);
    int64_t one = 1;
    par_tensor sc = par_tensor_view(PAR_F32, 1, &one, &(float){1.0f});
    cr_assert_eq(par_st_writer_add(w, "layers.0.attn.wq_a.scale", &sc), 0);
    char *alt = sub(d, "model.safetensors");
    cr_assert_eq(par_st_writer_write(w, alt), 0);
    par_st_writer_free(w);
    par_st_close(f);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mv '%s' '%s' && rm '%s'", alt, out, ip);
    cr_assert_eq(system(cmd), 0);
    remove(sp); /* only config.json + model.safetensors (no index) remain */
    cr_expect_eq(par_hf_import(out, 64, back, NULL), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "wq_a") && strstr(par_last_error(), "unquantized (F64) but has a .scale"), "%s",
              par_last_error());
    cr_expect(!par_path_exists(back), "a failed import writes nothing");
    par_err_set_quiet(0);
    par_st_close(g);
    rmtree(d);
    free(alt), free(sp), free(ip), free(out), free(back), free(d);
}
