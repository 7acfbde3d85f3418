/* core/quant.c - BF16, E4M3, E2M1, UE8M0 casts and block scales (core/quant.h;
 * sources per cast in docs/precisions.md). */
#include "core/quant.h"

#include <math.h>
#include <string.h>

#include "core/tensor.h"

/* A small binary float format: mbits mantissa bits, emin the exponent of
 * the smallest normal, maxval the largest finite value. */
typedef struct {
    int mbits, emin;
    double maxval;
} minifloat;

static const minifloat e4m3 = {3, -6, 448.0};
static const minifloat e2m1 = {1, 0, 6.0};

/* |x| (finite, >= 0) rounded to nearest even in format f, saturating at
 * maxval; returns the magnitude code (exponent field << mbits | mantissa). */
static unsigned mini_encode(const minifloat *f, double a)
{
    if (!(a <= f->maxval))
        a = f->maxval; /* past the largest finite value (and inf): satfinite */
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    e -= 1;       /* a = (1.f) 2^e */
    if (a == 0 || e < f->emin)
        e = f->emin; /* subnormal: fixed step 2^(emin - mbits) */
    double q = nearbyint(ldexp(a, f->mbits - e)); /* exact scaling, one rounding (ties to even) */
    unsigned mant = (unsigned)q;
    unsigned one = 1u << f->mbits;
    if (mant >= 2 * one) { /* rounded up to the next binade */
        mant >>= 1;
        e++;
    }
    if (mant < one) /* subnormal (or zero): exponent field 0 */
        return mant;
    return ((unsigned)(e - f->emin + 1) << f->mbits) | (mant - one);
}

static double mini_decode(const minifloat *f, unsigned mag)
{
    unsigned ef = mag >> f->mbits, mf = mag & ((1u << f->mbits) - 1);
    if (ef == 0)
        return ldexp((double)mf, f->emin - f->mbits);
    return ldexp((double)(mf | (1u << f->mbits)), (int)ef - 1 + f->emin - f->mbits);
}

uint8_t par_e4m3_from_f64(double x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return sign | 0x7f;
    return sign | (uint8_t)mini_encode(&e4m3, fabs(x));
}

double par_e4m3_to_f64(uint8_t b)
{
    double v = (b & 0x7f) == 0x7f ? NAN : mini_decode(&e4m3, b & 0x7f);
    return (b & 0x80) ? -v : v;
}

uint8_t par_e2m1_from_f64(double x)
{
    uint8_t sign = signbit(x) ? 0x8 : 0;
    if (isnan(x))
        return sign | 0x7;
    return sign | (uint8_t)mini_encode(&e2m1, fabs(x));
}

double par_e2m1_to_f64(uint8_t code)
{
    double v = mini_decode(&e2m1, code & 0x7);
    return (code & 0x8) ? -v : v;
}

int par_e8m0_from_f64(double s, uint8_t *out)
{
    if (isnan(s)) {
        *out = PAR_E8M0_NAN;
        return 0;
    }
    int e;
    double m = frexp(s, &e);
    if (!(s > 0) || isinf(s) || m != 0.5 || e - 1 < -127 || e - 1 > 127)
        return -1;
    *out = (uint8_t)(e - 1 + 127);
    return 0;
}

double par_e8m0_to_f64(uint8_t b) { return b == PAR_E8M0_NAN ? NAN : ldexp(1.0, (int)b - 127); }

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp declare target
#endif
double par_bf16_round(double x) { return par_bf16_to_f32(par_bf16_from_f64(x)); }
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp end declare target
#endif

/* ------------------------------------------------------------ scales -- */

static int spec_ok(const par_qspec *s)
{
    return s && (s->fmt == PAR_QFMT_E4M3 || s->fmt == PAR_QFMT_E2M1) &&
           (s->scale == PAR_QSCALE_UE8M0 || s->scale == PAR_QSCALE_F32) && s->tile_rows >= 1 && s->tile_cols >= 1;
}

int64_t par_qspec_scale_rows(const par_qspec *s, int64_t rows) { return (rows + s->tile_rows - 1) / s->tile_rows; }
int64_t par_qspec_scale_cols(const par_qspec *s, int64_t cols) { return (cols + s->tile_cols - 1) / s->tile_cols; }

static double fmt_max(const par_qspec *s) { return s->fmt == PAR_QFMT_E4M3 ? PAR_E4M3_MAX : PAR_E2M1_MAX; }

/* ceil(log2 y) of a positive normal float from its bits (the kernels'
 * fast_log2_ceil), and 2^e (fast_pow2). */
static float pow2_ceil_f32(float y)
{
    uint32_t u;
    memcpy(&u, &y, 4);
    int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0);
    return ldexpf(1.0f, e);
}

float par_qscale_of_amax(const par_qspec *s, double amax)
{
    if (!isfinite(amax))
        return NAN;
    float floor_ = s->fmt == PAR_QFMT_E4M3 ? 1e-4f : ldexpf(6.0f, -126);
    float a = (float)amax; /* the kernels reduce in float32 */
    if (!(a >= floor_))
        a = floor_;
    float inv = (float)(1.0 / fmt_max(s));
    float y = a * inv;
    return s->scale == PAR_QSCALE_UE8M0 ? pow2_ceil_f32(y) : y;
}

/* -------------------------------------------------------- quantizing -- */

/* One element, given its tile's scale. */
static uint8_t quant_one(const par_qspec *s, double x, float scale)
{
    double mx = fmt_max(s), q;
    if (isnan(scale))
        q = NAN;
    else if (s->scale == PAR_QSCALE_UE8M0)
        q = x / scale; /* a power of two: exact */
    else
        q = (float)((float)x / scale); /* float32 division, as the kernels */
    if (q > mx)
        q = mx;
    else if (q < -mx)
        q = -mx;
    return s->fmt == PAR_QFMT_E4M3 ? par_e4m3_from_f64(q) : par_e2m1_from_f64(q);
}

/* Exact for power-of-two scales; with F32 scales the kernels' float32
 * product (one rounding of the exact product). */
static double dequant_one(const par_qspec *s, uint8_t c, float scale)
{
    double v = s->fmt == PAR_QFMT_E4M3 ? par_e4m3_to_f64(c) : par_e2m1_to_f64(c);
    return s->scale == PAR_QSCALE_F32 ? (double)(float)(v * (double)scale) : v * (double)scale;
}

double par_quant_sim_value(const par_qspec *s, double x, float scale)
{
    return dequant_one(s, quant_one(s, x, scale), scale);
}

/* The loops are written once over a value getter: X(i) reads element i. */
#define QUANTIZE_BODY(X)                                                                   \
    do {                                                                                   \
        int64_t sc = par_qspec_scale_cols(s, cols);                                        \
        for (int64_t r0 = 0; r0 < rows; r0 += s->tile_rows)                                \
            for (int64_t c0 = 0; c0 < cols; c0 += s->tile_cols) {                          \
                int64_t r1 = r0 + s->tile_rows < rows ? r0 + s->tile_rows : rows;          \
                int64_t c1 = c0 + s->tile_cols < cols ? c0 + s->tile_cols : cols;          \
                double amax = 0;                                                           \
                for (int64_t r = r0; r < r1; r++)                                          \
                    for (int64_t c = c0; c < c1; c++) {                                    \
                        double a = fabs((double)X(r * cols + c));                          \
                        amax = (a > amax || isnan(a)) && !isnan(amax) ? a : amax;          \
                    }                                                                      \
                float scale = par_qscale_of_amax(s, amax);                                 \
                scales[(r0 / s->tile_rows) * sc + c0 / s->tile_cols] = scale;              \
                for (int64_t r = r0; r < r1; r++)                                          \
                    for (int64_t c = c0; c < c1; c++)                                      \
                        codes[r * cols + c] = quant_one(s, (double)X(r * cols + c), scale); \
            }                                                                              \
    } while (0)

par_status par_quantize_f64(const par_qspec *s, const double *x, int64_t rows, int64_t cols, uint8_t *codes,
                            float *scales)
{
    if (!spec_ok(s) || rows < 0 || cols < 0)
        return par_err(PAR_EINVAL, "quantize: bad tile spec or size [%lld,%lld]", (long long)rows, (long long)cols);
#define XF64(i) x[i]
    QUANTIZE_BODY(XF64);
#undef XF64
    return PAR_OK;
}

par_status par_quantize_f32(const par_qspec *s, const float *x, int64_t rows, int64_t cols, uint8_t *codes,
                            float *scales)
{
    if (!spec_ok(s) || rows < 0 || cols < 0)
        return par_err(PAR_EINVAL, "quantize: bad tile spec or size [%lld,%lld]", (long long)rows, (long long)cols);
#define XF32(i) x[i]
    QUANTIZE_BODY(XF32);
#undef XF32
    return PAR_OK;
}

#define DEQUANT_BODY(T)                                                                    \
    do {                                                                                   \
        int64_t sc = par_qspec_scale_cols(s, cols);                                        \
        for (int64_t r = 0; r < rows; r++)                                                 \
            for (int64_t c = 0; c < cols; c++)                                             \
                y[r * cols + c] =                                                          \
                    (T)dequant_one(s, codes[r * cols + c], scales[(r / s->tile_rows) * sc + c / s->tile_cols]); \
    } while (0)

par_status par_dequantize_f64(const par_qspec *s, const uint8_t *codes, const float *scales, int64_t rows,
                              int64_t cols, double *y)
{
    if (!spec_ok(s) || rows < 0 || cols < 0)
        return par_err(PAR_EINVAL, "dequantize: bad tile spec or size");
    DEQUANT_BODY(double);
    return PAR_OK;
}

par_status par_dequantize_f32(const par_qspec *s, const uint8_t *codes, const float *scales, int64_t rows,
                              int64_t cols, float *y)
{
    if (!spec_ok(s) || rows < 0 || cols < 0)
        return par_err(PAR_EINVAL, "dequantize: bad tile spec or size");
    DEQUANT_BODY(float);
    return PAR_OK;
}

/* Simulation tile by tile (no scratch for the whole tensor). */
#define SIM_BODY(T)                                                                        \
    do {                                                                                   \
        for (int64_t r0 = 0; r0 < rows; r0 += s->tile_rows)                                \
            for (int64_t c0 = 0; c0 < cols; c0 += s->tile_cols) {                          \
                int64_t r1 = r0 + s->tile_rows < rows ? r0 + s->tile_rows : rows;          \
                int64_t c1 = c0 + s->tile_cols < cols ? c0 + s->tile_cols : cols;          \
                double amax = 0;                                                           \
                for (int64_t r = r0; r < r1; r++)                                          \
                    for (int64_t c = c0; c < c1; c++) {                                    \
                        double a = fabs((double)x[r * cols + c]);                          \
                        amax = (a > amax || isnan(a)) && !isnan(amax) ? a : amax;          \
                    }                                                                      \
                float scale = par_qscale_of_amax(s, amax);                                 \
                for (int64_t r = r0; r < r1; r++)                                          \
                    for (int64_t c = c0; c < c1; c++)                                      \
                        x[r * cols + c] = (T)dequant_one(s, quant_one(s, (double)x[r * cols + c], scale), scale); \
            }                                                                              \
    } while (0)

par_status par_quant_sim_f64(const par_qspec *s, double *x, int64_t rows, int64_t cols)
{
    if (!spec_ok(s) || rows < 0 || cols < 0)
        return par_err(PAR_EINVAL, "quantize: bad tile spec or size");
    SIM_BODY(double);
    return PAR_OK;
}

par_status par_quant_sim_f32(const par_qspec *s, float *x, int64_t rows, int64_t cols)
{
    if (!spec_ok(s) || rows < 0 || cols < 0)
        return par_err(PAR_EINVAL, "quantize: bad tile spec or size");
    SIM_BODY(float);
    return PAR_OK;
}

/* ----------------------------------------------------------- storage -- */

void par_e2m1_pack(const uint8_t *codes, int64_t n, uint8_t *packed)
{
    for (int64_t j = 0; 2 * j + 1 < n; j++)
        packed[j] = (uint8_t)((codes[2 * j] & 0xf) | ((codes[2 * j + 1] & 0xf) << 4));
}

void par_e2m1_unpack(const uint8_t *packed, int64_t n, uint8_t *codes)
{
    for (int64_t j = 0; 2 * j + 1 < n; j++) {
        codes[2 * j] = packed[j] & 0xf;
        codes[2 * j + 1] = (uint8_t)(packed[j] >> 4);
    }
}

/* One 128x128 block of par_e2m1_to_e4m3_blocks. */
static int64_t fp4_block_to_fp8(const uint8_t *codes4, const float *scales4, int64_t cols, int64_t br, int64_t bc,
                                uint8_t *codes8, float *scale8)
{
    int64_t sc4 = cols / 32, inexact = 0;
    float smax = 0;
    for (int64_t r = br * 128; r < br * 128 + 128; r++)
        for (int64_t k = bc * 4; k < bc * 4 + 4; k++)
            smax = scales4[r * sc4 + k] > smax || isnan(scales4[r * sc4 + k]) ? scales4[r * sc4 + k] : smax;
    double base = (double)smax / 64;
    uint8_t dummy;
    if (par_e8m0_from_f64(base, &dummy))
        inexact += 128 * 128; /* the block's scale has no E8M0 code */
    *scale8 = (float)base;
    for (int64_t r = br * 128; r < br * 128 + 128; r++)
        for (int64_t c = bc * 128; c < bc * 128 + 128; c++) {
            /* convert.py's FP4_TABLE holds +0.0 for code 8 (-0): the FP8 code is 0x00 */
            uint8_t c4 = codes4[r * cols + c];
            double x4 = (c4 & 7) ? par_e2m1_to_f64(c4) : 0.0;
            double v = x4 * ((double)scales4[r * sc4 + c / 32] / base);
            codes8[r * cols + c] = par_e4m3_from_f64(v);
            inexact += !(par_e4m3_to_f64(codes8[r * cols + c]) == v) && !isnan(v);
        }
    return inexact;
}

par_status par_e2m1_to_e4m3_blocks(const uint8_t *codes4, const float *scales4, int64_t rows, int64_t cols,
                                   uint8_t *codes8, float *scales8, int64_t *inexact)
{
    if (rows < 0 || cols < 0 || rows % 128 || cols % 128)
        return par_err(PAR_EINVAL, "FP4 -> FP8: [%lld,%lld] is not a whole number of 128x128 blocks",
                       (long long)rows, (long long)cols);
    int64_t bad = 0, nbc = cols / 128;
    for (int64_t br = 0; br < rows / 128; br++)
        for (int64_t bc = 0; bc < nbc; bc++)
            bad += fp4_block_to_fp8(codes4, scales4, cols, br, bc, codes8, &scales8[br * nbc + bc]);
    if (inexact)
        *inexact = bad;
    return PAR_OK;
}
