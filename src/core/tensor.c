#include "core/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const size_t dt_size[PAR_DTYPE_STORAGE_END] = {8, 4, 2, 4, 8, 0, 1, 1, 1, 1};
static const char *dt_name[PAR_DTYPE_STORAGE_END] = {"F64", "F32", "BF16", "I32", "I64", "?",
                                                     "F8_E4M3", "F8_E8M0", "I8", "U8"};

int par_dtype_valid(par_dtype dt) { return (unsigned)dt < PAR_DTYPE_STORAGE_END && dt != PAR_DTYPE_COUNT; }
size_t par_dtype_size(par_dtype dt) { return (unsigned)dt < PAR_DTYPE_STORAGE_END ? dt_size[dt] : 0; }
const char *par_dtype_name(par_dtype dt) { return (unsigned)dt < PAR_DTYPE_STORAGE_END ? dt_name[dt] : "?"; }
int par_dtype_is_float(par_dtype dt) { return dt == PAR_F64 || dt == PAR_F32 || dt == PAR_BF16; }

par_status par_dtype_parse(const char *s, par_dtype *out)
{
    for (int i = 0; i < PAR_DTYPE_COUNT; i++) {
        if (!strcmp(s, dt_name[i])) {
            *out = (par_dtype)i;
            return PAR_OK;
        }
    }
    return PAR_EFORMAT;
}

par_status par_dtype_parse_storage(const char *s, par_dtype *out)
{
    for (int i = 0; i < PAR_DTYPE_STORAGE_END; i++) {
        if (par_dtype_valid((par_dtype)i) && !strcmp(s, dt_name[i])) {
            *out = (par_dtype)i;
            return PAR_OK;
        }
    }
    return PAR_EFORMAT;
}

int64_t par_shape_numel(int ndim, const int64_t *shape, size_t elsize)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] && n > INT64_MAX / shape[i])
            return -1;
        n *= shape[i];
    }
    if (elsize && n > INT64_MAX / (int64_t)elsize)
        return -1;
    return n;
}

int64_t par_tensor_numel(const par_tensor *t) { return par_shape_numel(t->ndim, t->shape, 0); }
size_t par_tensor_nbytes(const par_tensor *t) { return (size_t)par_tensor_numel(t) * par_dtype_size(t->dtype); }

par_status par_tensor_alloc(par_tensor *t, par_dtype dt, int ndim, const int64_t *shape, par_tag tag)
{
    if (!par_dtype_valid(dt) || ndim < 0 || ndim > PAR_MAX_DIMS)
        return par_err(PAR_EINVAL, "tensor: dtype %d / ndim %d not supported", (int)dt, ndim);
    int64_t n = par_shape_numel(ndim, shape, par_dtype_size(dt));
    if (n < 0)
        return par_err(PAR_ERANGE, "tensor: shape has a negative dim or overflows");
    void *d = par_calloc((size_t)n ? (size_t)n : 1, par_dtype_size(dt), tag);
    if (!d)
        return par_err(PAR_ENOMEM, "tensor: cannot allocate %lld elements", (long long)n);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = d;
    t->owns = 1;
    return PAR_OK;
}

par_tensor par_tensor_view(par_dtype dt, int ndim, const int64_t *shape, void *data)
{
    par_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < PAR_MAX_DIMS; i++)
        t.shape[i] = shape[i];
    t.data = data;
    return t;
}

void par_tensor_free(par_tensor *t)
{
    if (t->owns)
        par_free(t->data);
    t->data = NULL;
    t->owns = 0;
}

int par_tensor_same_shape(const par_tensor *a, const par_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

char *par_shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, o < n ? n - o : 0, "[");
    for (int i = 0; i < ndim; i++)
        o += (size_t)snprintf(buf + o, o < n ? n - o : 0, i ? ",%lld" : "%lld", (long long)shape[i]);
    snprintf(buf + o, o < n ? n - o : 0, "]");
    return buf;
}

double par_tensor_get_f64(const par_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case PAR_F64: return ((const double *)t->data)[i];
    case PAR_F32: return ((const float *)t->data)[i];
    case PAR_BF16: return par_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case PAR_I32: return ((const int32_t *)t->data)[i];
    case PAR_I64: return (double)((const int64_t *)t->data)[i];
    default: return NAN;
    }
}

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp declare target
#endif
uint16_t par_bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb; /* round to nearest even; overflows to inf correctly */
    return (uint16_t)(u >> 16);
}

uint16_t par_bf16_from_f64(double d)
{
    if (isnan(d)) {
        return signbit(d) ? 0xffc0u : 0x7fc0u;
    }
    /* Round the double once to 8 significant bits.  Convert to float with
     * round-to-odd (sticky bit) first, which makes the second rounding exact. */
    float f = (float)d; /* nearest; fix up to round-to-odd below */
    if ((double)f != d && isfinite(f)) {
        uint32_t u;
        memcpy(&u, &f, 4);
        /* truncate toward zero then set the lowest bit (round to odd) */
        if (fabs((double)f) > fabs(d))
            u -= 1;
        u |= 1u;
        memcpy(&f, &u, 4);
    }
    return par_bf16_from_f32(f);
}

float par_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp end declare target
#endif
