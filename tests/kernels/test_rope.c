/* Kernels: RoPE with YaRN frequencies, f64. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "fd.h"
#include "kernels/rope.h"

static void fill_normal(double *x, int64_t n, const char *name)
{
    par_philox_key key = par_rng_key(99, name);
    for (int64_t i = 0; i < n; i++)
        x[i] = par_rng_normal(key, (uint64_t)i, 0);
}

Test(rope, yarn_worked_example_rd8)
{
    /* docs/model-reading.md: rd=8, base=160000, L=65536 -> low=1, high=4,
     * smooth = [1, 1, 2/3, 1/3]. */
    par_rope r;
    par_rope_init(&r, 8, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    cr_assert_eq(r.rd, 8);
    const double smooth[4] = {1, 1, 2.0 / 3.0, 1.0 / 3.0};
    for (int i = 0; i < 4; i++) {
        double f = pow(160000.0, -2.0 * i / 8.0);
        double want = f / 16.0 * (1 - smooth[i]) + f * smooth[i];
        cr_assert(fabs(r.freq[i] - want) <= 1e-15 * want, "f[%d] = %.17g want %.17g", i, r.freq[i],
                  want);
    }
}

Test(rope, yarn_ramp_rd64)
{
    /* rd=64: low=15, high=25; f unscaled up to 15, divided by the factor from 25 on. */
    par_rope r;
    par_rope_init(&r, 64, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    for (int i = 0; i < 32; i++) {
        double f = pow(160000.0, -2.0 * i / 64.0);
        double ramp = fmin(1.0, fmax(0.0, (i - 15) / 10.0));
        double want = f / 16.0 * ramp + f * (1 - ramp);
        cr_assert(fabs(r.freq[i] - want) <= 1e-14 * want, "f[%d] = %.17g want %.17g", i, r.freq[i],
                  want);
    }
}

Test(rope, plain_frequencies_without_yarn)
{
    par_rope r, r0;
    par_rope_init(&r, 8, 10000.0, 0, 16.0, 65536, 32.0, 1.0);
    par_rope_init(&r0, 8, 10000.0, 1, 16.0, 0, 32.0, 1.0); /* original_seq_len 0: no YaRN */
    for (int i = 0; i < 4; i++) {
        double want = pow(10000.0, -2.0 * i / 8.0);
        cr_assert(fabs(r.freq[i] - want) <= 1e-15 * want);
        cr_assert(r0.freq[i] == r.freq[i]);
    }
}

Test(rope, rotation_matches_complex_formula)
{
    par_rope r;
    par_rope_init(&r, 8, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    const int64_t T = 3, nvec = 2, D = 12;
    int32_t pos[3] = {0, 7, 1234};
    double x[3 * 2 * 12], x0[3 * 2 * 12];
    fill_normal(x0, T * nvec * D, "rope.x");
    memcpy(x, x0, sizeof x);
    par_rope_apply_f64(x, pos, &r, T, nvec, D, 1);
    for (int64_t t = 0; t < T; t++)
        for (int64_t v = 0; v < nvec; v++) {
            const double *a = x0 + (t * nvec + v) * D, *b = x + (t * nvec + v) * D;
            cr_assert(memcmp(a, b, (size_t)(D - 8) * sizeof(double)) == 0, "non-rope dims untouched");
            for (int i = 0; i < 4; i++) {
                double th = pos[t] * r.freq[i];
                double re = a[D - 8 + 2 * i], im = a[D - 8 + 2 * i + 1];
                cr_assert(fabs(b[D - 8 + 2 * i] - (re * cos(th) - im * sin(th))) < 1e-14);
                cr_assert(fabs(b[D - 8 + 2 * i + 1] - (re * sin(th) + im * cos(th))) < 1e-14);
                if (pos[t] == 0)
                    cr_assert(b[D - 8 + 2 * i] == re && b[D - 8 + 2 * i + 1] == im);
            }
        }
}

Test(rope, inverse_undoes_forward)
{
    par_rope r;
    par_rope_init(&r, 8, 10000.0, 0, 1.0, 0, 32.0, 1.0);
    const int64_t T = 6, nvec = 3, D = 10;
    int32_t pos[6] = {0, 1, 2, 5, 63, 40000};
    double *x = malloc(sizeof(double) * T * nvec * D), *x0 = malloc(sizeof(double) * T * nvec * D);
    fill_normal(x0, T * nvec * D, "rope.inv");
    memcpy(x, x0, sizeof(double) * T * nvec * D);
    par_rope_apply_f64(x, pos, &r, T, nvec, D, 1);
    double moved = 0;
    for (int64_t i = 0; i < T * nvec * D; i++)
        moved = fmax(moved, fabs(x[i] - x0[i]));
    cr_assert(moved > 0.1, "the forward rotation must change the vector");
    par_rope_apply_f64(x, pos, &r, T, nvec, D, -1);
    for (int64_t i = 0; i < T * nvec * D; i++)
        cr_assert(fabs(x[i] - x0[i]) < 1e-14, "x[%lld] %.17g vs %.17g", (long long)i, x[i], x0[i]);
    free(x);
    free(x0);
}

typedef struct {
    par_rope r;
    int64_t T, nvec, D;
    const int32_t *pos;
    int sign;
    double *x, *G, *work;
} rope_ctx;

static double rope_obj(void *p)
{
    rope_ctx *c = p;
    int64_t n = c->T * c->nvec * c->D;
    memcpy(c->work, c->x, sizeof(double) * (size_t)n);
    par_rope_apply_f64(c->work, c->pos, &c->r, c->T, c->nvec, c->D, c->sign);
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += c->work[i] * c->G[i];
    return s;
}

static void rope_fd_case(int sign)
{
    rope_ctx c = {.T = 5, .nvec = 2, .D = 9 + 3, .sign = sign};
    int32_t pos[5] = {0, 3, 4, 17, 250};
    c.pos = pos;
    par_rope_init(&c.r, 8, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    int64_t n = c.T * c.nvec * c.D;
    c.x = malloc(sizeof(double) * n);
    c.G = malloc(sizeof(double) * n);
    c.work = malloc(sizeof(double) * n);
    fill_normal(c.x, n, "ropefd.x");
    fill_normal(c.G, n, "ropefd.G");
    /* backward of rotation by sign = rotation of the gradient by -sign */
    double *dx = malloc(sizeof(double) * n);
    memcpy(dx, c.G, sizeof(double) * n);
    par_rope_apply_f64(dx, pos, &c.r, c.T, c.nvec, c.D, -sign);
    cr_assert(fd_check(sign > 0 ? "rope.dx" : "rope_inv.dx", c.x, (size_t)n, dx, rope_obj, &c, 1e-6,
                       0) < 1e-8);
    free(c.x), free(c.G), free(c.work), free(dx);
}

Test(rope, backward_is_inverse_rotation_fd) { rope_fd_case(1); }
Test(rope, backward_of_inverse_is_forward_fd) { rope_fd_case(-1); }
