/* quant_dump MODE ROWS COLS IN OUT: runs one cast of core/quant.h on raw
 * little-endian input and writes raw output, for tests/core/quant_check.py
 * (which compares it with an independent numpy reading of DeepSeek's code).
 *
 *   IN                          OUT
 *   e4m3, e2m1, bf16: f64[n]    codes u8[n] (bf16: u16[n])
 *   act128 kv64 w128 mxfp4 act128f32 w128f32: f64[rows*cols] (f32 input when the
 *       mode ends in "_in32": f32[rows*cols])
 *                               codes u8[rows*cols], scales f32[...],
 *                               simulated values f64[rows*cols]
 *   fp4to8: codes u8[rows*cols], scales f32[rows*cols/32]
 *                               codes u8[rows*cols], scales f32[rows*cols/16384]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant.h"
#include "core/tensor.h"

static void *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static int elementwise(const char *mode, const double *x, size_t n, FILE *out)
{
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(mode, "bf16")) {
            uint16_t b = par_bf16_from_f64(x[i]);
            fwrite(&b, 2, 1, out);
        } else {
            uint8_t c = !strcmp(mode, "e4m3") ? par_e4m3_from_f64(x[i]) : par_e2m1_from_f64(x[i]);
            fwrite(&c, 1, 1, out);
        }
    }
    return 0;
}

static int blocks(const char *mode, const void *in, int64_t rows, int64_t cols, FILE *out)
{
    static const struct {
        const char *name;
        par_qspec spec;
    } specs[] = {{"act128", PAR_QSPEC_ACT_FP8}, {"kv64", PAR_QSPEC_KV_FP8}, {"w128", PAR_QSPEC_WEIGHT_FP8},
                 {"mxfp4", PAR_QSPEC_MXFP4}, {"act128f32", {PAR_QFMT_E4M3, PAR_QSCALE_F32, 1, 128}},
                 {"w128f32", {PAR_QFMT_E4M3, PAR_QSCALE_F32, 128, 128}}};
    size_t len = strcspn(mode, "_");
    int in32 = !strcmp(mode + len, "_in32");
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        if (strlen(specs[k].name) != len || strncmp(mode, specs[k].name, len))
            continue;
        const par_qspec *s = &specs[k].spec;
        int64_t n = rows * cols, ns = par_qspec_scale_rows(s, rows) * par_qspec_scale_cols(s, cols);
        uint8_t *codes = malloc((size_t)n + 1);
        float *scales = malloc((size_t)ns * 4 + 4);
        double *sim = malloc((size_t)n * 8 + 8);
        float *sim32 = malloc((size_t)n * 4 + 4);
        par_status st;
        if (in32) {
            st = par_quantize_f32(s, in, rows, cols, codes, scales);
            memcpy(sim32, in, (size_t)n * 4);
            if (!st)
                st = par_quant_sim_f32(s, sim32, rows, cols);
            for (int64_t i = 0; i < n; i++)
                sim[i] = sim32[i];
        } else {
            st = par_quantize_f64(s, in, rows, cols, codes, scales);
            memcpy(sim, in, (size_t)n * 8);
            if (!st)
                st = par_quant_sim_f64(s, sim, rows, cols);
        }
        fwrite(codes, 1, (size_t)n, out);
        fwrite(scales, 4, (size_t)ns, out);
        fwrite(sim, 8, (size_t)n, out);
        free(codes), free(scales), free(sim), free(sim32);
        return st ? 1 : 0;
    }
    return 2;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: quant_dump MODE ROWS COLS IN OUT\n");
        return 2;
    }
    const char *mode = argv[1];
    int64_t rows = atoll(argv[2]), cols = atoll(argv[3]);
    size_t nin;
    void *in = slurp(argv[4], &nin);
    FILE *out = fopen(argv[5], "wb");
    if (!in || !out)
        return 2;
    int rc;
    if (!strcmp(mode, "e4m3") || !strcmp(mode, "e2m1") || !strcmp(mode, "bf16")) {
        rc = elementwise(mode, in, nin / 8, out);
    } else if (!strcmp(mode, "fp4to8")) {
        int64_t n = rows * cols, ns = n / 16384;
        uint8_t *c8 = malloc((size_t)n + 1);
        float *s8 = malloc((size_t)ns * 4 + 4);
        int64_t inexact = 0;
        rc = par_e2m1_to_e4m3_blocks(in, (const float *)((const uint8_t *)in + n), rows, cols, c8, s8, &inexact) ? 1 : 0;
        fwrite(c8, 1, (size_t)n, out);
        fwrite(s8, 4, (size_t)ns, out);
        fprintf(stderr, "inexact %lld\n", (long long)inexact);
        free(c8), free(s8);
    } else {
        rc = blocks(mode, in, rows, cols, out);
    }
    fclose(out);
    free(in);
    return rc;
}
