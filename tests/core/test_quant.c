/* core/quant.h: hand-worked cases of the casts (the bulk check against an
 * independent numpy reading of DeepSeek's code is tests/core/quant_check.py). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/quant.h"

Test(quant, e4m3_known_codes)
{
    cr_expect_eq(par_e4m3_from_f64(448), 0x7e);
    cr_expect_eq(par_e4m3_from_f64(1), 0x38);
    cr_expect_eq(par_e4m3_from_f64(-2), 0xc0);
    cr_expect_eq(par_e4m3_from_f64(0x1p-9), 0x01);     /* smallest subnormal */
    cr_expect_eq(par_e4m3_from_f64(0x1p-10), 0x00);    /* tie: to even (0)   */
    cr_expect_eq(par_e4m3_from_f64(0x3p-10), 0x02);    /* tie 1.5 steps -> 2 */
    cr_expect_eq(par_e4m3_from_f64(0x1p-6), 0x08);     /* smallest normal    */
    cr_expect_eq(par_e4m3_from_f64(1.0625), 0x38);     /* tie 1 | 1.125 -> 1 */
    cr_expect_eq(par_e4m3_from_f64(1.1875), 0x3a);     /* tie 1.125 | 1.25   */
    cr_expect_eq(par_e4m3_from_f64(-0.0), 0x80);
    /* satfinite: past the largest finite value, infinities too */
    cr_expect_eq(par_e4m3_from_f64(464), 0x7e);
    cr_expect_eq(par_e4m3_from_f64(1e30), 0x7e);
    cr_expect_eq(par_e4m3_from_f64(-INFINITY), 0xfe);
    cr_expect_eq(par_e4m3_from_f64(NAN), 0x7f);
    cr_expect(isnan(par_e4m3_to_f64(0xff)));
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f)
            cr_expect_eq(par_e4m3_from_f64(par_e4m3_to_f64((uint8_t)b)), b, "code %02x does not round-trip", b);
}

Test(quant, e2m1_known_codes)
{
    static const double v[] = {0, .5, 1, 1.5, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        cr_expect_eq(par_e2m1_to_f64((uint8_t)c), (c & 8) ? -v[c & 7] : v[c & 7]);
        cr_expect_eq(par_e2m1_from_f64(par_e2m1_to_f64((uint8_t)c)), c);
    }
    cr_expect_eq(par_e2m1_from_f64(0.25), 0x0); /* ties to the even code */
    cr_expect_eq(par_e2m1_from_f64(0.75), 0x2);
    cr_expect_eq(par_e2m1_from_f64(2.5), 0x4);
    cr_expect_eq(par_e2m1_from_f64(5), 0x6);
    cr_expect_eq(par_e2m1_from_f64(-7), 0xf);   /* saturates */
}

Test(quant, e8m0)
{
    uint8_t b = 0;
    cr_expect_eq(par_e8m0_from_f64(1.0, &b), 0);
    cr_expect_eq(b, 127);
    cr_expect_eq(par_e8m0_from_f64(0x1p-127, &b), 0);
    cr_expect_eq(b, 0);
    cr_expect_eq(par_e8m0_from_f64(0x1p127, &b), 0);
    cr_expect_eq(b, 254);
    b = 7;
    cr_expect_eq(par_e8m0_from_f64(3.0, &b), -1);
    cr_expect_eq(par_e8m0_from_f64(0.0, &b), -1);
    cr_expect_eq(par_e8m0_from_f64(0x1p-128, &b), -1);
    cr_expect_eq(b, 7, "untouched on failure");
    cr_expect_eq(par_e8m0_from_f64(NAN, &b), 0);
    cr_expect_eq(b, 0xff);
    cr_expect(isnan(par_e8m0_to_f64(0xff)));
    cr_expect_eq(par_e8m0_to_f64(130), 8.0);
}

Test(quant, act_scales_and_tiles)
{
    par_qspec s = PAR_QSPEC_ACT_FP8;
    cr_expect_eq(par_qscale_of_amax(&s, 448), 1.0f);      /* exactly 448 * 2^0 */
    cr_expect_eq(par_qscale_of_amax(&s, 449), 2.0f);
    cr_expect_eq(par_qscale_of_amax(&s, 0), 0x1p-22f);    /* the 1e-4 floor    */
    cr_expect(isnan(par_qscale_of_amax(&s, INFINITY)));
    par_qspec f4 = PAR_QSPEC_MXFP4;
    cr_expect_eq(par_qscale_of_amax(&f4, 6), 1.0f);
    cr_expect_eq(par_qscale_of_amax(&f4, 0), 0x1p-126f);  /* 6 * 2^-126 floor  */
    /* a 3x5 tensor in 2x2 tiles: partial tiles at the edges */
    par_qspec w = {PAR_QFMT_E4M3, PAR_QSCALE_UE8M0, 2, 2};
    double x[15], y[15];
    for (int i = 0; i < 15; i++)
        x[i] = (i + 1) * 100.0;
    uint8_t c[15];
    float sc[6];
    cr_assert_eq(par_quantize_f64(&w, x, 3, 5, c, sc), 0);
    cr_expect_eq(sc[0], 2.0f);  /* amax 700: 2^ceil(log2(700/448)) */
    cr_expect_eq(sc[5], 4.0f);  /* the lone corner 1500 */
    cr_assert_eq(par_dequantize_f64(&w, c, sc, 3, 5, y), 0);
    cr_expect_eq(y[14], 1536.0); /* 1500/4 = 375 -> 384 (step 32 at 2^8) */
    memcpy(y, x, sizeof x);
    cr_assert_eq(par_quant_sim_f64(&w, y, 3, 5), 0);
    cr_expect_eq(y[14], 1536.0);
    par_qspec bad = {PAR_QFMT_E4M3, PAR_QSCALE_UE8M0, 0, 2};
    cr_expect_eq(par_quantize_f64(&bad, x, 3, 5, c, sc), PAR_EINVAL);
}

Test(quant, nan_tile_dequantizes_to_nan)
{
    par_qspec s = {PAR_QFMT_E2M1, PAR_QSCALE_UE8M0, 1, 2};
    double x[4] = {1, NAN, 1, 2}, y[4];
    uint8_t c[4];
    float sc[2];
    cr_assert_eq(par_quantize_f64(&s, x, 1, 4, c, sc), 0);
    cr_assert_eq(par_dequantize_f64(&s, c, sc, 1, 4, y), 0);
    cr_expect(isnan(y[0]) && isnan(y[1]));
    cr_expect_eq(y[2], 1.0);
    cr_expect_eq(y[3], 2.0);
}

Test(quant, fp4_pack_low_nibble_first)
{
    uint8_t codes[4] = {0x1, 0xf, 0x7, 0x8}, packed[2], back[4];
    par_e2m1_pack(codes, 4, packed);
    cr_expect_eq(packed[0], 0xf1);
    cr_expect_eq(packed[1], 0x87);
    par_e2m1_unpack(packed, 4, back);
    cr_expect_eq(memcmp(back, codes, 4), 0);
}
