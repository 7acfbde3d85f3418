/* tests/common/tp_world.h - shared pieces of the tensor-parallel layer tests
 * (f64): the v4-tiny model with widened heads, a packed batch's positions,
 * the f64 comparison policy, and a hand-resolved layout with TP / ETP > 1
 * (the layout rules still refuse them for `parity run`; the group generator
 * of parallel/layout/groups.c builds the real Megatron-order groups from it). */
#ifndef PAR_TESTS_TP_WORLD_H
#define PAR_TESTS_TP_WORLD_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/config.h"
#include "model/data.h"
#include "parallel/layout/layout.h"

void openblas_set_num_threads(int num_threads);

static inline void tpw_rank_init(int rank, void *ud)
{
    (void)rank;
    (void)ud;
    openblas_set_num_threads(1);
}

/* v4-tiny with "key=value" overrides (NULL-terminated list). */
static inline par_config tpw_config(const char *const *sets)
{
    par_config c;
    cr_assert_eq(par_config_preset(&c, "v4-tiny"), PAR_OK);
    for (int i = 0; sets && sets[i]; i++)
        cr_assert_eq(par_config_set_arg(&c, sets[i]), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_config_validate(&c), PAR_OK, "%s", par_last_error());
    return c;
}

/* The positions of one random packing of B x S (caller frees). */
static inline int32_t *tpw_positions(int64_t B, int64_t S, uint64_t seed, int64_t vocab,
                                     int32_t **tokens)
{
    par_pack_plan plan;
    par_batch b;
    cr_assert_eq(par_pack_plan_random(&plan, B, S, seed, 0), PAR_OK);
    cr_assert_eq(par_batch_alloc(&b, B, S), PAR_OK);
    cr_assert_eq(par_batch_fill(&b, &plan, seed, 0, vocab, NULL), PAR_OK);
    int32_t *pos = malloc((size_t)(B * S) * sizeof(int32_t));
    memcpy(pos, b.pos, (size_t)(B * S) * sizeof(int32_t));
    if (tokens) {
        *tokens = malloc((size_t)(B * S) * sizeof(int32_t));
        memcpy(*tokens, b.tokens, (size_t)(B * S) * sizeof(int32_t));
    }
    par_batch_free(&b);
    par_pack_plan_free(&plan);
    return pos;
}

/* n values in [-1, 1) (uniform) or N(0, 1) from (seed, name). */
static inline double *tpw_random(int64_t n, uint64_t seed, const char *name, int normal)
{
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    par_philox_key k = par_rng_key(seed, name);
    for (int64_t i = 0; i < n; i++)
        v[i] = normal ? par_rng_normal(k, (uint64_t)i, 0) : 2 * par_rng_uniform(k, (uint64_t)i, 0) - 1;
    return v;
}

/* GOLDEN.md's f64 policy of candidate b against reference a:
 * ||b - a||_2 <= 1e-10 ||a||_2 + 1e-14 sqrt(n).  *rel = ||b-a|| / ||a||
 * (0 when both are 0). */
static inline int tpw_policy_f64(const double *a, const double *b, int64_t n, double *rel)
{
    double dd = 0, aa = 0;
    for (int64_t i = 0; i < n; i++) {
        dd += (b[i] - a[i]) * (b[i] - a[i]);
        aa += a[i] * a[i];
    }
    dd = sqrt(dd), aa = sqrt(aa);
    if (rel)
        *rel = aa > 0 ? dd / aa : (dd > 0 ? INFINITY : 0);
    return dd <= 1e-10 * aa + 1e-14 * sqrt((double)n);
}

static inline int tpw_bitwise(const double *a, const double *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof(double)) == 0;
}

/* A layout with the given sizes marked resolved by hand (PP = CP = 1
 * unless given; Da and De from the folding rule N = TP*CP*Da = ETP*EP*De). */
static inline par_layout tpw_layout(int tp, int cp, int ep, int etp, int world)
{
    par_layout l;
    par_layout_init(&l);
    l.tp = tp, l.cp = cp, l.ep = ep, l.etp = etp, l.world = world;
    cr_assert(world % (tp * cp) == 0 && world % (etp * ep) == 0, "world %d does not fold", world);
    l.da = world / (tp * cp);
    l.de = world / (etp * ep);
    l.micro_batch = 1;
    l.resolved = 1;
    return l;
}

#endif
