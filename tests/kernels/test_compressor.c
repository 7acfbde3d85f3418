/* Kernels: the attention compressor (phase 2 of kernels/attention.h), f64.
 *
 * - against a brute-force reference that lists the slots of each block
 *   explicitly (MODEL.md section 3: the overlapping m = 4 halves, block 0
 *   without a previous block, the tail that is never compressed);
 * - finite differences of the backward wrt a, z and the norm weight;
 * - a halo call (t0 > 0) equals the whole-range call on its rows.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "fd.h"
#include "kernels/attention.h"

/* two rows of 24 tokens: samples [3, 9, 12] and [24] */
static const int lens[] = {3, 9, 12, 24};
enum { T = 48, C = 8, RD = 4 };

typedef struct {
    int64_t m;
    par_rope rope;
    int32_t pos[T];
    double a[T * 2 * C], z[T * 2 * C], norm[C];
    double cmp[T * C], raw[T * C], rstd[T], G[T * C];
} ccase;

static void ccase_init(ccase *k, int64_t m, uint64_t seed)
{
    memset(k, 0, sizeof *k);
    k->m = m;
    par_rope_init(&k->rope, RD, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    int t = 0;
    for (size_t s = 0; s < sizeof lens / sizeof *lens; s++)
        for (int p = 0; p < lens[s]; p++)
            k->pos[t++] = p;
    par_philox_key ka = par_rng_key(seed, "a"), kz = par_rng_key(seed, "z"),
                   kn = par_rng_key(seed, "n"), kg = par_rng_key(seed, "g");
    for (int i = 0; i < T * 2 * C; i++) {
        k->a[i] = par_rng_normal(ka, (uint64_t)i, 0);
        k->z[i] = 1.5 * par_rng_normal(kz, (uint64_t)i, 0);
    }
    for (int i = 0; i < C; i++)
        k->norm[i] = 1 + 0.3 * par_rng_normal(kn, (uint64_t)i, 0);
    for (int i = 0; i < T * C; i++)
        k->G[i] = par_rng_normal(kg, (uint64_t)i, 0);
}

static void fwd(ccase *k)
{
    par_compress_forward_f64(k->cmp, k->raw, k->rstd, k->a, k->z, k->pos, k->norm, &k->rope, 0, T,
                             C, k->m, 1e-6);
}

/* Brute force: for every sample, every complete block i, build the list of
 * slots (a, z) per channel as MODEL.md writes it, softmax, sum, norm, rope. */
static void brute(double *out /* [T, C] */, const ccase *k)
{
    const int64_t m = k->m, coff = m == 4 ? 2 : 1, ac = coff * C;
    memset(out, 0, sizeof(double) * T * C);
    int64_t s0 = 0;
    for (size_t s = 0; s < sizeof lens / sizeof *lens; s++) {
        int64_t len = lens[s];
        for (int64_t i = 0; i < len / m; i++) {
            double v[C];
            for (int64_t ch = 0; ch < C; ch++) {
                double sa[64], sz[64];
                int ns = 0;
                /* block i: the tokens at positions i*m .. i*m + m - 1 */
                for (int64_t p = i * m; p < (i + 1) * m; p++) {
                    int64_t col = m == 4 ? C + ch : ch; /* second half for m == 4 */
                    sa[ns] = k->a[(s0 + p) * ac + col];
                    sz[ns] = k->z[(s0 + p) * ac + col];
                    ns++;
                }
                if (m == 4 && i > 0) /* block i-1, first half */
                    for (int64_t p = (i - 1) * m; p < i * m; p++) {
                        sa[ns] = k->a[(s0 + p) * ac + ch];
                        sz[ns] = k->z[(s0 + p) * ac + ch];
                        ns++;
                    }
                double mx = -INFINITY, den = 0, acc = 0;
                for (int q = 0; q < ns; q++)
                    mx = fmax(mx, sz[q]);
                for (int q = 0; q < ns; q++)
                    den += exp(sz[q] - mx);
                for (int q = 0; q < ns; q++)
                    acc += exp(sz[q] - mx) / den * sa[q];
                v[ch] = acc;
            }
            double ms = 0;
            for (int e = 0; e < C; e++)
                ms += v[e] * v[e];
            double r = 1 / sqrt(ms / C + 1e-6);
            for (int e = 0; e < C; e++)
                v[e] *= r * k->norm[e];
            for (int f = 0; f < RD / 2; f++) {
                double ang = (double)(i * m) * k->rope.freq[f];
                double *e = v + C - RD + 2 * f, x0 = e[0], x1 = e[1];
                e[0] = x0 * cos(ang) - x1 * sin(ang);
                e[1] = x0 * sin(ang) + x1 * cos(ang);
            }
            memcpy(out + (s0 + (i + 1) * m - 1) * C, v, sizeof v);
        }
        s0 += len;
    }
}

static void brute_case(int64_t m)
{
    ccase *k = malloc(sizeof *k);
    ccase_init(k, m, 21);
    fwd(k);
    double *ref = malloc(sizeof(double) * T * C);
    brute(ref, k);
    int entries = 0;
    for (int t = 0; t < T; t++) {
        int end = (k->pos[t] + 1) % m == 0;
        entries += end;
        for (int e = 0; e < C; e++) {
            if (!end)
                cr_assert(k->cmp[t * C + e] == 0, "m=%lld: row %d holds no entry but is nonzero",
                          (long long)m, t);
            cr_assert(fabs(k->cmp[t * C + e] - ref[t * C + e]) < 1e-13,
                      "m=%lld: row %d ch %d: %.15g vs brute %.15g", (long long)m, t, e,
                      k->cmp[t * C + e], ref[t * C + e]);
        }
    }
    cr_assert(entries > 2);
    free(ref);
    free(k);
}

Test(compressor, brute_force_m4) { brute_case(4); }
Test(compressor, brute_force_m8) { brute_case(8); }
Test(compressor, brute_force_m5) { brute_case(5); }

Test(compressor, m4_block0_ignores_the_missing_previous_block)
{
    /* changing z of block 0's first half changes no entry of block 0 but
     * changes entry 1 (where block 0's first half is the previous block) */
    ccase *k = malloc(sizeof *k);
    ccase_init(k, 4, 5);
    /* sample 4 starts at 24: block 0 = rows 24..27, entry 0 at row 27, entry 1 at 31 */
    fwd(k);
    double e0[C], e1[C];
    memcpy(e0, k->cmp + 27 * C, sizeof e0);
    memcpy(e1, k->cmp + 31 * C, sizeof e1);
    for (int r = 24; r < 28; r++)
        for (int e = 0; e < C; e++)
            k->z[r * 2 * C + e] += 1.0;
    k->z[24 * 2 * C] += 0.5; /* not uniform, so the softmax changes */
    fwd(k);
    cr_assert(memcmp(e0, k->cmp + 27 * C, sizeof e0) == 0);
    cr_assert(memcmp(e1, k->cmp + 31 * C, sizeof e1) != 0);
    free(k);
}

static double fd_obj(void *ctx)
{
    ccase *k = ctx;
    fwd(k);
    double s = 0;
    for (int i = 0; i < T * C; i++)
        s += k->cmp[i] * k->G[i];
    return s;
}

static void fd_case(int64_t m)
{
    ccase *k = malloc(sizeof *k);
    ccase_init(k, m, 8);
    fwd(k);
    double *da = calloc(T * 2 * C, sizeof(double)), *dz = calloc(T * 2 * C, sizeof(double));
    double dn[C] = {0};
    cr_assert_eq(par_compress_backward_f64(da, dz, dn, k->G, k->raw, k->rstd, k->a, k->z, k->pos,
                                           k->norm, &k->rope, 0, T, C, m),
                 0);
    int64_t n = (m == 4 ? 2 : 1) * C * T;
    double e = fd_check("a", k->a, (size_t)n, da, fd_obj, k, 1e-6, 0);
    cr_assert(e < 1e-8, "m=%lld da FD %g", (long long)m, e);
    e = fd_check("z", k->z, (size_t)n, dz, fd_obj, k, 1e-6, 0);
    cr_assert(e < 1e-8, "m=%lld dz FD %g", (long long)m, e);
    e = fd_check("norm", k->norm, C, dn, fd_obj, k, 1e-6, 0);
    cr_assert(e < 1e-8, "m=%lld dnorm FD %g", (long long)m, e);
    free(da);
    free(dz);
    free(k);
}

Test(compressor, fd_m4) { fd_case(4); }
Test(compressor, fd_m8) { fd_case(8); }

Test(compressor, halo_range_equals_whole)
{
    ccase *k = malloc(sizeof *k);
    ccase_init(k, 4, 2);
    fwd(k);
    double *whole = malloc(sizeof(double) * T * C);
    memcpy(whole, k->cmp, sizeof(double) * T * C);
    memset(k->cmp, 0, sizeof k->cmp);
    /* rows [30, 40): reads a/z back to row 30 - 7 */
    par_compress_forward_f64(k->cmp, k->raw, k->rstd, k->a, k->z, k->pos, k->norm, &k->rope, 30, 40,
                             C, 4, 1e-6);
    cr_assert(memcmp(whole + 30 * C, k->cmp + 30 * C, sizeof(double) * 10 * C) == 0);
    free(whole);
    free(k);
}
