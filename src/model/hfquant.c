/* model/hfquant.c - the release's FP8 / FP4 storage of a weight (model/hfquant.h). */
#include "model/hfquant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/quant.h"

int par_hfquant_is_codes(par_dtype dt) { return dt == PAR_F8_E4M3 || dt == PAR_I8 || dt == PAR_U8; }

/* ------------------------------------------------------------- export -- */

/* The scales of a quantized tile grid as E8M0 bytes (every one a power of
 * two in range: the tile scales of finite values are). */
static par_status scales_to_e8m0(const char *name, const float *s, int64_t n, uint8_t *out)
{
    for (int64_t k = 0; k < n; k++)
        if (par_e8m0_from_f64(s[k], &out[k]))
            return par_err(PAR_EINTERNAL, "%s: tile scale %g has no E8M0 code", name, (double)s[k]);
    return PAR_OK;
}

/* Tile (tr, tc) of x again with the hint's scale h, kept only when every
 * value is exactly code * h (so a weight read from that storage gets its
 * own codes and scale back); returns 1 when kept. */
static int try_hint(const par_qspec *q, const double *x, int64_t rows, int64_t cols, int64_t tr, int64_t tc, double h,
                    uint8_t *c)
{
    int fp4 = q->fmt == PAR_QFMT_E2M1;
    int64_t r1 = (tr + 1) * q->tile_rows < rows ? (tr + 1) * q->tile_rows : rows;
    int64_t c1 = (tc + 1) * q->tile_cols < cols ? (tc + 1) * q->tile_cols : cols;
    uint8_t e8;
    if (!(h > 0) || par_e8m0_from_f64(h, &e8))
        return 0;
    for (int pass = 0; pass < 2; pass++) /* check every value, then write */
        for (int64_t r = tr * q->tile_rows; r < r1; r++)
            for (int64_t k = tc * q->tile_cols; k < c1; k++) {
                double v = x[r * cols + k] / h;
                uint8_t code = fp4 ? par_e2m1_from_f64(v) : par_e4m3_from_f64(v);
                if (!pass && (fp4 ? par_e2m1_to_f64(code) : par_e4m3_to_f64(code)) != v)
                    return 0;
                if (pass)
                    c[r * cols + k] = code;
            }
    return 1;
}

/* Where hint (a .scale of the same tile grid) represents a tile exactly, its
 * scale and codes replace the computed ones; *rescaled counts the others. */
static par_status apply_hint(const char *name, const par_qspec *q, const double *x, int64_t rows, int64_t cols,
                             const par_tensor *hint, uint8_t *c, float *s, int64_t *rescaled)
{
    int64_t sr = par_qspec_scale_rows(q, rows), sc = par_qspec_scale_cols(q, cols);
    if (hint->ndim != 2 || hint->shape[0] != sr || hint->shape[1] != sc ||
        (hint->dtype != PAR_F8_E8M0 && hint->dtype != PAR_F32))
        return par_err(PAR_EMISMATCH, "%s: the scale to reuse is %s %s; this weight's tiles need F8_E8M0 [%lld,%lld]",
                       name, par_dtype_name(hint->dtype), hint->ndim == 2 ? "of another shape" : "not 2-D",
                       (long long)sr, (long long)sc);
    for (int64_t t = 0; t < sr * sc; t++) {
        double h = hint->dtype == PAR_F32 ? ((const float *)hint->data)[t]
                                          : par_e8m0_to_f64(((const uint8_t *)hint->data)[t]);
        if (try_hint(q, x, rows, cols, t / sc, t % sc, h, c))
            s[t] = (float)h;
        else
            (*rescaled)++;
    }
    return PAR_OK;
}

par_status par_hfquant_quantize(const char *name, par_hf_store st, const par_tensor *v, const par_tensor *hint,
                                par_tensor *codes, par_tensor *scale, int64_t *rescaled)
{
    if (v->ndim != 2 || (st != PAR_HF_STORE_FP8 && st != PAR_HF_STORE_FP4))
        return par_err(PAR_EINVAL, "%s: only 2-D FP8 / FP4 weights are quantized", name);
    int64_t out = v->shape[0], in = v->shape[1], n = out * in;
    int fp4 = st == PAR_HF_STORE_FP4;
    if (fp4 && in % 32)
        return par_err(PAR_EINVAL, "%s: FP4 (MXFP4) storage needs in_features divisible by the 1x32 tile; "
                       "[%lld,%lld] has %lld = 32 * %lld + %lld", name, (long long)out, (long long)in,
                       (long long)in, (long long)(in / 32), (long long)(in % 32));
    par_qspec q = fp4 ? PAR_QSPEC_MXFP4 : PAR_QSPEC_WEIGHT_FP8;
    int64_t sshape[2] = {par_qspec_scale_rows(&q, out), par_qspec_scale_cols(&q, in)};
    int64_t cshape[2] = {out, fp4 ? in / 2 : in};
    double *x = par_malloc((size_t)(n ? n : 1) * sizeof *x, PAR_TAG_IO);
    uint8_t *c = par_malloc((size_t)(n ? n : 1), PAR_TAG_IO);
    float *s = par_malloc((size_t)(sshape[0] * sshape[1] + 1) * sizeof *s, PAR_TAG_IO);
    par_tensor tc = {0}, ts = {0};
    par_status r = (x && c && s) ? PAR_OK : par_err(PAR_ENOMEM, "%s: out of memory", name);
    for (int64_t k = 0; !r && k < n; k++)
        if (!isfinite(x[k] = par_tensor_get_f64(v, k)))
            r = par_err(PAR_EINVAL, "%s: element %lld is %g: a non-finite weight cannot be quantized", name,
                        (long long)k, x[k]);
    if (!r)
        r = par_quantize_f64(&q, x, out, in, c, s);
    if (!r && hint)
        r = apply_hint(name, &q, x, out, in, hint, c, s, rescaled);
    if (!r)
        r = par_tensor_alloc(&tc, fp4 ? PAR_I8 : PAR_F8_E4M3, 2, cshape, PAR_TAG_IO);
    if (!r)
        r = par_tensor_alloc(&ts, PAR_F8_E8M0, 2, sshape, PAR_TAG_IO);
    if (!r && fp4)
        par_e2m1_pack(c, n, tc.data);
    else if (!r)
        memcpy(tc.data, c, (size_t)n);
    if (!r)
        r = scales_to_e8m0(name, s, sshape[0] * sshape[1], ts.data);
    par_free(x);
    par_free(c);
    par_free(s);
    if (r) {
        par_tensor_free(&tc);
        par_tensor_free(&ts);
        return r;
    }
    *codes = tc;
    *scale = ts;
    return PAR_OK;
}

/* ------------------------------------------------------------- import -- */

static int shape_is(const par_tensor *t, int64_t a, int64_t b)
{
    return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b;
}

/* The storage's shapes against the table's [out, in]: the spec, or an error. */
static par_status check_storage(const char *where, const char *name, const int64_t shape[2], const par_tensor *codes,
                                const par_tensor *scale, par_qspec *q)
{
    int64_t out = shape[0], in = shape[1];
    int fp4 = codes->dtype != PAR_F8_E4M3;
    char a[64], b[64];
    if (fp4 && in % 32)
        return par_err(PAR_EFORMAT, "%s: '%s' is packed FP4, which needs in_features divisible by the 1x32 tile; "
                       "the config's table has [%lld,%lld]", where, name, (long long)out, (long long)in);
    *q = fp4 ? PAR_QSPEC_MXFP4 : PAR_QSPEC_WEIGHT_FP8;
    int64_t cw = fp4 ? in / 2 : in, sr = par_qspec_scale_rows(q, out), sc = par_qspec_scale_cols(q, in);
    if (!shape_is(codes, out, cw))
        return par_err(PAR_EFORMAT, "%s: '%s' (%s) has shape %s; the config's table [%lld,%lld] stores as [%lld,%lld]",
                       where, name, par_dtype_name(codes->dtype), par_shape_str(codes->ndim, codes->shape, a, sizeof a),
                       (long long)out, (long long)in, (long long)out, (long long)cw);
    if (scale->dtype != PAR_F8_E8M0 && scale->dtype != PAR_F32)
        return par_err(PAR_EFORMAT, "%s: the scale of '%s' is %s; expected F8_E8M0 (or F32)", where, name,
                       par_dtype_name(scale->dtype));
    if (!shape_is(scale, sr, sc))
        return par_err(PAR_EFORMAT, "%s: the scale of '%s' has shape %s; %s [%lld,%lld] needs %s tiles: [%lld,%lld]",
                       where, name, par_shape_str(scale->ndim, scale->shape, b, sizeof b), fp4 ? "FP4" : "FP8",
                       (long long)out, (long long)in, fp4 ? "1x32" : "128x128", (long long)sr, (long long)sc);
    return PAR_OK;
}

/* The scale tensor as floats: every one a positive finite number. */
static par_status read_scales(const char *where, const char *name, const par_tensor *scale, float *s)
{
    int64_t n = par_tensor_numel(scale);
    for (int64_t k = 0; k < n; k++) {
        double v = scale->dtype == PAR_F32 ? ((const float *)scale->data)[k]
                                           : par_e8m0_to_f64(((const uint8_t *)scale->data)[k]);
        if (!(v > 0) || isinf(v))
            return par_err(PAR_EFORMAT, "%s: the scale of '%s': element %lld (tile row %lld, col %lld) is %g; a "
                           "scale must be a positive finite number", where, name, (long long)k,
                           (long long)(k / scale->shape[1]), (long long)(k % scale->shape[1]), v);
        s[k] = (float)v;
    }
    return PAR_OK;
}

/* Codes as one byte per element, NaN codes refused. */
static par_status read_codes(const char *where, const char *name, const par_tensor *codes, int64_t n, uint8_t *c)
{
    if (codes->dtype != PAR_F8_E4M3) {
        par_e2m1_unpack(codes->data, n, c);
        return PAR_OK;
    }
    memcpy(c, codes->data, (size_t)n);
    for (int64_t k = 0; k < n; k++)
        if ((c[k] & 0x7f) == 0x7f)
            return par_err(PAR_EFORMAT, "%s: '%s' element %lld is an E4M3 NaN (0x%02x)", where, name, (long long)k,
                           c[k]);
    return PAR_OK;
}

par_status par_hfquant_dequant(const char *where, const char *name, const int64_t shape[2], const par_tensor *codes,
                               const par_tensor *scale, par_dtype dt, par_tensor *out)
{
    par_qspec q;
    par_status r = check_storage(where, name, shape, codes, scale, &q);
    if (r)
        return r;
    int64_t n = shape[0] * shape[1], ns = par_tensor_numel(scale);
    uint8_t *c = par_malloc((size_t)(n ? n : 1), PAR_TAG_IO);
    float *s = par_malloc((size_t)(ns ? ns : 1) * sizeof *s, PAR_TAG_IO);
    par_tensor t = {0};
    r = (c && s) ? PAR_OK : par_err(PAR_ENOMEM, "%s: out of memory", name);
    if (!r)
        r = read_scales(where, name, scale, s);
    if (!r)
        r = read_codes(where, name, codes, n, c);
    if (!r)
        r = par_tensor_alloc(&t, dt, 2, shape, PAR_TAG_IO);
    /* products of a code and a power of two (UE8M0 semantics: no float32
     * rounding) are exact in f64; F32 output rounds once */
    q.scale = PAR_QSCALE_UE8M0;
    if (!r && dt == PAR_F64)
        r = par_dequantize_f64(&q, c, s, shape[0], shape[1], t.data);
    else if (!r)
        r = par_dequantize_f32(&q, c, s, shape[0], shape[1], t.data);
    par_free(c);
    par_free(s);
    if (r) {
        par_tensor_free(&t);
        return r;
    }
    *out = t;
    return PAR_OK;
}
