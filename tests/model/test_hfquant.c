/* The release's quantized storage (model/hfquant.h) through the HF export and
 * import (model/hfckpt.h): storage -> parity -> storage bit for bit, a weight
 * exported quantized imports as exactly its dequantized values, and the
 * refusals of hostile storage (a truncated scale, a shape that does not divide
 * by the tile, a NaN scale). */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/quant.h"
#include "core/safetensors.h"
#include "model/hfckpt.h"
#include "model/hfmap.h"
#include "model/params.h"
#include "tmpdir.h"

#define SHARD "model-00001-of-00001.safetensors"

static uint64_t rng_state = 88172645463325252ull;
static uint64_t next(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static double unif(void) { return (double)(next() >> 11) / 9007199254740992.0; }

/* v4-tiny with moe_inter_dim 32: every routed expert's in_features is a
 * multiple of the 1x32 FP4 tile (v4-tiny's 16 is not). */
static par_config cfg32(void)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), 0);
    cr_assert_eq(par_config_set(&c, "moe_inter_dim", "32"), 0, "%s", par_last_error());
    return c;
}

/* A parameter file of cfg's table: f64 values with per-row magnitudes from
 * 2^-30 to 2^10, exact zeros and ties to the E4M3 / E2M1 grids sprinkled in. */
static void write_params(const par_config *cfg, const char *path)
{
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, cfg), 0);
    par_st_writer *w = NULL;
    cr_assert_eq(par_st_writer_new(&w), 0);
    par_tensor *v = calloc((size_t)t.n, sizeof *v);
    for (int i = 0; i < t.n; i++) {
        const par_param *p = &t.p[i];
        int real = p->dtype == PAR_PDT_REAL;
        cr_assert_eq(par_tensor_alloc(&v[i], real ? PAR_F64 : PAR_I32, p->ndim, p->shape, PAR_TAG_IO), 0);
        for (int64_t k = 0; k < p->numel; k++) {
            double mag = ldexp(1.0, (int)((k / p->shape[p->ndim - 1]) % 41) - 30), u = unif();
            double x = u < 0.05 ? 0.0 : u < 0.1 ? 1.0625 * mag : (2 * unif() - 1) * mag;
            if (real)
                ((double *)v[i].data)[k] = x;
            else
                ((int32_t *)v[i].data)[k] = (int32_t)(k % cfg->n_routed_experts);
        }
        cr_assert_eq(par_st_writer_add(w, p->name, &v[i]), 0);
    }
    cr_assert_eq(par_st_writer_write(w, path), 0, "%s", par_last_error());
    par_st_writer_free(w);
    for (int i = 0; i < t.n; i++)
        par_tensor_free(&v[i]);
    free(v);
    par_param_table_free(&t);
}

static void export_q(const par_config *cfg, const char *params, const char *out, const char *scales_from,
                     par_hf_export_info *info)
{
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(params, &f), 0);
    par_hf_export_opts o = {.dtype = PAR_HF_BF16, .quantize = 1, .scales_from = scales_from};
    cr_assert_eq(par_hf_export(cfg, f, "params", out, &o, info), 0, "%s", par_last_error());
    par_st_close(f);
}

/* Rewrites dir's shard with every quantized weight's codes and scales drawn
 * at random (arbitrary storage, not what parity's quantizer would choose),
 * and in every FP4 weight one tile the kernels' formula would not give back. */
static int randomize_storage(const char *dir)
{
    char *sp = sub(dir, SHARD);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read_storage(sp, &f), 0, "%s", par_last_error());
    par_st_writer *w = NULL;
    cr_assert_eq(par_st_writer_new(&w), 0);
    par_tensor *own = calloc((size_t)par_st_count(f), sizeof *own);
    int n = 0;
    for (int i = 0; i < par_st_count(f); i++) {
        const par_tensor *t = par_st_tensor(f, i);
        cr_assert_eq(par_tensor_alloc(&own[i], t->dtype, t->ndim, t->shape, PAR_TAG_IO), 0);
        memcpy(own[i].data, t->data, par_tensor_nbytes(t));
        uint8_t *b = own[i].data;
        for (int64_t k = 0; k < par_tensor_numel(t); k++) {
            if (t->dtype == PAR_F8_E4M3)
                do
                    b[k] = (uint8_t)next();
                while ((b[k] & 0x7f) == 0x7f);
            else if (t->dtype == PAR_I8)
                b[k] = (uint8_t)next();
            else if (t->dtype == PAR_F8_E8M0)
                b[k] = (uint8_t)(110 + next() % 30); /* 2^-17 .. 2^12: above act_quant's amax floor */
        }
        if (t->dtype == PAR_I8) /* row 0's first 1x32 tile: every value 3 (largest code 3 < 4) */
            memset(b, 0x55, 16);
        n += t->dtype == PAR_F8_E4M3 || t->dtype == PAR_I8;
        cr_assert_eq(par_st_writer_add(w, par_st_name(f, i), &own[i]), 0);
    }
    cr_assert_eq(par_st_writer_write(w, sp), 0);
    par_st_writer_free(w);
    for (int i = 0; i < par_st_count(f); i++)
        par_tensor_free(&own[i]);
    free(own);
    par_st_close(f);
    free(sp);
    return n;
}

/* Every tensor of shard a equal to b's, bit for bit; returns how many differ. */
static int count_differing(const char *a, const char *b)
{
    par_st_file *x = NULL, *y = NULL;
    cr_assert_eq(par_st_read_storage(a, &x), 0);
    cr_assert_eq(par_st_read_storage(b, &y), 0);
    cr_assert_eq(par_st_count(x), par_st_count(y));
    int d = 0;
    for (int i = 0; i < par_st_count(x); i++) {
        const par_tensor *p = par_st_tensor(x, i), *q = par_st_find(y, par_st_name(x, i));
        cr_assert(q && p->dtype == q->dtype && par_tensor_same_shape(p, q), "%s", par_st_name(x, i));
        d += memcmp(p->data, q->data, par_tensor_nbytes(p)) != 0;
    }
    par_st_close(x);
    par_st_close(y);
    return d;
}

Test(hfquant, any_storage_round_trips_bit_for_bit)
{
    par_config cfg = cfg32();
    char *d = mktmp(), *params = sub(d, "p.safetensors"), *a = sub(d, "A"), *back = sub(d, "back.safetensors");
    char *c = sub(d, "C"), *c2 = sub(d, "C2"), *back2 = sub(d, "back2.safetensors");
    write_params(&cfg, params);
    par_hf_export_info info;
    export_q(&cfg, params, a, NULL, &info);
    cr_expect_eq(info.n_quantized, 131, "v4-tiny: 131 FP8 / FP4 weights, got %d", info.n_quantized);
    int nq = randomize_storage(a);
    cr_expect_eq(nq, 131);
    par_hf_import_info ii;
    cr_assert_eq(par_hf_import(a, 64, back, &ii), 0, "%s", par_last_error());
    cr_expect_eq(ii.n_quantized, 131);
    /* storage -> parity -> storage, the storage's scales reused: identical */
    export_q(&cfg, back, c, a, &info);
    cr_expect_eq(info.n_rescaled, 0);
    char *sa = sub(a, SHARD), *sc = sub(c, SHARD), *sc2 = sub(c2, SHARD);
    cr_expect_eq(count_differing(sa, sc), 0, "tensors differ after the round trip");
    /* without them the kernels' formula picks other scales for some tiles
     * (it is not idempotent), but the values survive exactly: its scale is
     * never coarser than the storage's while a tile's amax is above the
     * 1e-4 floor */
    export_q(&cfg, back, c2, NULL, &info);
    int diff = count_differing(sa, sc2);
    cr_expect_gt(diff, 0, "random storage requantized with the formula should differ somewhere");
    cr_assert_eq(par_hf_import(c2, 64, back2, NULL), 0, "%s", par_last_error());
    cr_expect_eq(count_differing(back, back2), 0, "values changed through a formula requantization");
    printf("storage round trip: %d quantized weights, 0 tensors differ with --scales-from, %d differ in bits "
           "(0 in values) without\n", nq, diff);
    rmtree(d);
    free(sa), free(sc), free(sc2), free(params), free(a), free(back), free(c), free(c2), free(back2), free(d);
}

Test(hfquant, exported_weight_imports_as_its_dequantized_values)
{
    par_config cfg = cfg32();
    char *d = mktmp(), *params = sub(d, "p.safetensors"), *a = sub(d, "A"), *back = sub(d, "back.safetensors");
    write_params(&cfg, params);
    export_q(&cfg, params, a, NULL, NULL);
    cr_assert_eq(par_hf_import(a, 64, back, NULL), 0, "%s", par_last_error());
    par_st_file *src = NULL, *got = NULL;
    cr_assert_eq(par_st_read(params, &src), 0);
    cr_assert_eq(par_st_read(back, &got), 0);
    par_param_table t;
    cr_assert_eq(par_param_table_build(&t, &cfg), 0);
    int64_t checked = 0;
    for (int i = 0; i < t.n; i++) {
        const par_param *p = &t.p[i];
        par_hf_store st = par_hf_store_of(p);
        if (st != PAR_HF_STORE_FP8 && st != PAR_HF_STORE_FP4)
            continue;
        par_qspec q = st == PAR_HF_STORE_FP4 ? PAR_QSPEC_MXFP4 : PAR_QSPEC_WEIGHT_FP8;
        double *want = malloc((size_t)p->numel * sizeof *want);
        memcpy(want, par_st_find(src, p->name)->data, (size_t)p->numel * sizeof *want);
        cr_assert_eq(par_quant_sim_f64(&q, want, p->shape[0], p->shape[1]), 0);
        const double *g = par_st_find(got, p->name)->data;
        for (int64_t k = 0; k < p->numel; k++, checked++)
            cr_assert(!memcmp(&g[k], &want[k], 8), "%s[%lld]: imported %a, dequantized %a", p->name, (long long)k,
                      g[k], want[k]);
        free(want);
    }
    cr_expect_gt(checked, 10000);
    printf("quantized export -> import: %lld weight elements equal their dequantized values bit for bit\n",
           (long long)checked);
    par_param_table_free(&t);
    par_st_close(src);
    par_st_close(got);
    rmtree(d);
    free(params), free(a), free(back), free(d);
}

/* Rewrites tensor `name` of dir's shard with `t` (NULL: drop it). */
static void replace_tensor(const char *dir, const char *name, const par_tensor *t)
{
    char *sp = sub(dir, SHARD);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read_storage(sp, &f), 0);
    par_st_writer *w = NULL;
    cr_assert_eq(par_st_writer_new(&w), 0);
    for (int i = 0; i < par_st_count(f); i++)
        if (strcmp(par_st_name(f, i), name))
            cr_assert_eq(par_st_writer_add(w, par_st_name(f, i), par_st_tensor(f, i)), 0);
    if (t)
        cr_assert_eq(par_st_writer_add(w, name, t), 0);
    char *tmp = sub(dir, "x.safetensors");
    cr_assert_eq(par_st_writer_write(w, tmp), 0);
    cr_assert_eq(rename(tmp, sp), 0);
    par_st_writer_free(w);
    par_st_close(f);
    free(tmp), free(sp);
}

static void expect_refused(const char *dir, const char *back, par_status want, const char *s1, const char *s2)
{
    par_err_set_quiet(1);
    cr_expect_eq(par_hf_import(dir, 64, back, NULL), want, "%s", par_last_error());
    cr_expect(strstr(par_last_error(), s1) && strstr(par_last_error(), s2), "message: %s", par_last_error());
    cr_expect(!par_path_exists(back), "a refused import writes nothing");
    par_err_set_quiet(0);
}

Test(hfquant, hostile_storage_is_refused_with_the_numbers)
{
    par_config cfg = cfg32();
    char *d = mktmp(), *params = sub(d, "p.safetensors"), *a = sub(d, "A"), *back = sub(d, "back.safetensors");
    write_params(&cfg, params);
    export_q(&cfg, params, a, NULL, NULL);
    /* a truncated scale: layers.0.attn.wq_a [16,32] has one 128x128 tile */
    int64_t sh[2] = {1, 0};
    uint8_t none[1] = {0};
    par_tensor trunc = par_tensor_view(PAR_F8_E8M0, 2, sh, none);
    replace_tensor(a, "layers.0.attn.wq_a.scale", &trunc);
    expect_refused(a, back, PAR_EFORMAT, "layers.0.attn.wq_a", "[1,0]");
    /* a NaN scale (E8M0 0xff) */
    int64_t one[2] = {1, 1};
    uint8_t nan_b[1] = {0xff};
    par_tensor nan_s = par_tensor_view(PAR_F8_E8M0, 2, one, nan_b);
    replace_tensor(a, "layers.0.attn.wq_a.scale", &nan_s);
    expect_refused(a, back, PAR_EFORMAT, "layers.0.attn.wq_a", "nan");
    /* a quantized weight with no scale */
    replace_tensor(a, "layers.0.attn.wq_a.scale", NULL);
    char *ip = sub(a, PAR_HF_INDEX_NAME), *sp = sub(a, SHARD), *one_file = sub(a, "model.safetensors");
    remove(ip); /* the index would list the dropped scale: one model.safetensors instead */
    cr_assert_eq(rename(sp, one_file), 0);
    expect_refused(a, back, PAR_ENOTFOUND, "layers.0.attn.wq_a", "no .scale");
    rmtree(d);
    free(ip), free(sp), free(one_file), free(params), free(a), free(back), free(d);
}

Test(hfquant, fp4_needs_whole_1x32_tiles)
{
    /* v4-tiny itself: moe_inter_dim 16, so w2 [32,16] has half a tile */
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), 0);
    char *d = mktmp(), *params = sub(d, "p.safetensors"), *a = sub(d, "A"), *back = sub(d, "back.safetensors");
    write_params(&cfg, params);
    par_st_file *f = NULL;
    cr_assert_eq(par_st_read(params, &f), 0);
    par_hf_export_opts o = {.dtype = PAR_HF_BF16, .quantize = 1};
    par_err_set_quiet(1);
    cr_expect_eq(par_hf_export(&cfg, f, "params", a, &o, NULL), PAR_EINVAL);
    cr_expect(strstr(par_last_error(), "w2.weight") && strstr(par_last_error(), "16 = 32 * 0 + 16"), "%s",
              par_last_error());
    cr_expect(!par_path_exists(a), "a refused export writes nothing");
    /* import: FP4 storage of that shape (packed [32,8], scale [32,1]) */
    o.quantize = 0;
    cr_assert_eq(par_hf_export(&cfg, f, "params", a, &o, NULL), 0, "%s", par_last_error());
    int64_t cs[2] = {32, 8}, ss[2] = {32, 1};
    uint8_t codes[256] = {0}, sc[32];
    memset(sc, 127, sizeof sc);
    par_tensor tc = par_tensor_view(PAR_I8, 2, cs, codes), ts = par_tensor_view(PAR_F8_E8M0, 2, ss, sc);
    replace_tensor(a, "layers.0.ffn.experts.0.w2.weight", &tc);
    replace_tensor(a, "layers.0.ffn.experts.0.w2.scale", &ts);
    char *ip = sub(a, PAR_HF_INDEX_NAME), *sp = sub(a, SHARD), *one_file = sub(a, "model.safetensors");
    remove(ip);
    cr_assert_eq(rename(sp, one_file), 0);
    expect_refused(a, back, PAR_EFORMAT, "experts.0.w2", "divisible by the 1x32 tile");
    par_err_set_quiet(0);
    par_st_close(f);
    rmtree(d);
    free(ip), free(sp), free(one_file), free(params), free(a), free(back), free(d);
}
