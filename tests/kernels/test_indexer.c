/* Kernels: indexer top-k selection (phase 3 of kernels/attention.h), f64.
 *
 * - against a brute force (scores from MODEL.md, k rounds of "take the best
 *   unpicked, lower index on ties", then sort);
 * - `selected` format: ascending, -1 padding at the end, only visible
 *   entries, all visible ones when fewer than topk;
 * - ties go to the lower entry index;
 * - the whole layer's `selected` output has the same format.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/attention.h"

enum { T = 60, IH = 2, IHD = 8, K = 3 };
/* rows of S = 30: samples [5, 25] and [30] */
static const int lens[] = {5, 25, 30};

typedef struct {
    par_attn_dims dm;
    int32_t pos[T];
    double iq[T * IH * IHD], iw[T * IH], icmp[T * IHD];
    int32_t sel[T * K];
} icase;

static void icase_init(icase *c, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->dm.m = 4, c->dm.iH = IH, c->dm.ihd = IHD, c->dm.topk = K;
    int t = 0;
    for (size_t s = 0; s < sizeof lens / sizeof *lens; s++)
        for (int p = 0; p < lens[s]; p++)
            c->pos[t++] = p;
    par_philox_key k1 = par_rng_key(seed, "iq"), k2 = par_rng_key(seed, "iw"),
                   k3 = par_rng_key(seed, "icmp");
    for (int i = 0; i < T * IH * IHD; i++)
        c->iq[i] = par_rng_normal(k1, (uint64_t)i, 0);
    for (int i = 0; i < T * IH; i++)
        c->iw[i] = par_rng_normal(k2, (uint64_t)i, 0); /* may be negative */
    for (int i = 0; i < T * IHD; i++)
        c->icmp[i] = (c->pos[i / IHD] + 1) % 4 == 0 ? par_rng_normal(k3, (uint64_t)i, 0) : 0;
}

static void brute(int32_t *out /* [K] */, const icase *c, int t)
{
    int64_t s0 = t - c->pos[t], nv = (c->pos[t] + 1) / 4;
    double sc[64];
    int taken[64] = {0};
    for (int64_t i = 0; i < nv; i++) {
        sc[i] = 0;
        for (int h = 0; h < IH; h++) {
            double dt = 0;
            for (int e = 0; e < IHD; e++)
                dt += c->iq[(t * IH + h) * IHD + e] * c->icmp[(s0 + (i + 1) * 4 - 1) * IHD + e];
            sc[i] += c->iw[t * IH + h] * fmax(dt, 0);
        }
    }
    int n = 0;
    for (int r = 0; r < K && r < nv; r++) {
        int best = -1;
        for (int64_t i = 0; i < nv; i++)
            if (!taken[i] && (best < 0 || sc[i] > sc[best]))
                best = (int)i;
        taken[best] = 1;
    }
    for (int64_t i = 0; i < nv; i++)
        if (taken[i])
            out[n++] = (int32_t)i;
    while (n < K)
        out[n++] = -1;
}

static void check_format(const int32_t *sel, const int32_t *pos, int64_t nt, int64_t k)
{
    for (int64_t t = 0; t < nt; t++) {
        int64_t nv = (pos[t] + 1) / 4, want = nv < k ? nv : k;
        const int32_t *st = sel + t * k;
        for (int64_t j = 0; j < k; j++) {
            if (j < want) {
                cr_assert(st[j] >= 0 && st[j] < nv, "t %lld: pick %d not visible (nv %lld)",
                          (long long)t, st[j], (long long)nv);
                if (j > 0)
                    cr_assert(st[j] > st[j - 1], "t %lld: not ascending", (long long)t);
            } else {
                cr_assert(st[j] == -1, "t %lld: slot %lld should be -1 padding", (long long)t,
                          (long long)j);
            }
        }
    }
}

Test(indexer, matches_brute_force_and_format)
{
    icase *c = malloc(sizeof *c);
    icase_init(c, 4);
    cr_assert_eq(par_indexer_select_f64(c->sel, c->iq, c->iw, c->icmp, c->pos, &c->dm, 0, T), 0);
    check_format(c->sel, c->pos, T, K);
    int dropped = 0;
    for (int t = 0; t < T; t++) {
        int32_t ref[K];
        brute(ref, c, t);
        for (int j = 0; j < K; j++)
            cr_assert_eq(c->sel[t * K + j], ref[j], "t %d slot %d", t, j);
        dropped |= (c->pos[t] + 1) / 4 > K;
    }
    cr_assert(dropped);
    free(c);
}

Test(indexer, ties_go_to_lower_index)
{
    icase *c = malloc(sizeof *c);
    icase_init(c, 6);
    /* every entry the same vector: equal scores everywhere */
    for (int t = 0; t < T; t++)
        if ((c->pos[t] + 1) % 4 == 0)
            for (int e = 0; e < IHD; e++)
                c->icmp[t * IHD + e] = 0.5 + e;
    cr_assert_eq(par_indexer_select_f64(c->sel, c->iq, c->iw, c->icmp, c->pos, &c->dm, 0, T), 0);
    for (int t = 0; t < T; t++) {
        int64_t nv = (c->pos[t] + 1) / 4;
        for (int j = 0; j < K; j++)
            cr_assert_eq(c->sel[t * K + j], j < nv ? j : -1, "t %d slot %d", t, j);
    }
    free(c);
}

Test(indexer, range_equals_whole)
{
    icase *c = malloc(sizeof *c);
    icase_init(c, 8);
    cr_assert_eq(par_indexer_select_f64(c->sel, c->iq, c->iw, c->icmp, c->pos, &c->dm, 0, T), 0);
    int32_t whole[T * K];
    memcpy(whole, c->sel, sizeof whole);
    memset(c->sel, 0x55, sizeof c->sel);
    cr_assert_eq(par_indexer_select_f64(c->sel, c->iq, c->iw, c->icmp, c->pos, &c->dm, 33, 50), 0);
    cr_assert(memcmp(whole + 33 * K, c->sel + 33 * K, sizeof(int32_t) * 17 * K) == 0);
    free(c);
}

Test(indexer, layer_selected_output_format)
{
    /* the whole layer's `selected`: same format, equal to saved->sel */
    par_attn_dims dm = {.d = 8, .H = 2, .hd = 8, .rd = 4, .q_lora = 6, .o_groups = 2,
                        .o_lora = 3, .window = 3, .m = 4, .iH = 2, .ihd = 8, .topk = 2,
                        .norm_eps = 1e-6};
    par_rope rope;
    par_rope_init(&rope, 4, 160000.0, 1, 16.0, 65536, 32.0, 1.0);
    dm.rope = &rope;
    int32_t pos[T];
    int t = 0;
    for (size_t s = 0; s < sizeof lens / sizeof *lens; s++)
        for (int p = 0; p < lens[s]; p++)
            pos[t++] = p;
    par_attn_weights_f64 W;
    double *wb = malloc(sizeof(double) * 4096), *x = malloc(sizeof(double) * T * 8);
    double *y = malloc(sizeof(double) * T * 8);
    par_philox_key k = par_rng_key(3, "w");
    for (int i = 0; i < 4096; i++)
        wb[i] = 0.5 * par_rng_normal(k, (uint64_t)i, 0);
    for (int i = 0; i < T * 8; i++)
        x[i] = par_rng_normal(k, (uint64_t)i, 1);
    double **f[] = {&W.wq_a,     &W.q_norm,    &W.wq_b,      &W.wkv,     &W.kv_norm,
                    &W.wo_a,     &W.wo_b,      &W.attn_sink, &W.cmp_wkv, &W.cmp_wgate,
                    &W.cmp_ape,  &W.cmp_norm,  &W.idx_wq_b,  &W.idx_weights_proj,
                    &W.idx_cmp_wkv, &W.idx_cmp_wgate, &W.idx_cmp_ape, &W.idx_cmp_norm};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        *f[i] = wb + 200 * i; /* every weight here has <= 200 elements */
    par_attn_saved_f64 s;
    void *sb = aligned_alloc(64, (par_attn_saved_bytes_f64(&dm, T) + 63) / 64 * 64);
    par_attn_saved_carve_f64(&s, sb, &dm, T);
    int32_t sel[T * 2];
    cr_assert_eq(par_attn_forward_f64(y, &s, sel, x, pos, &W, &dm, T), 0);
    check_format(sel, pos, T, 2);
    cr_assert(memcmp(sel, s.sel, sizeof sel) == 0);
    free(sb);
    free(wb);
    free(x);
    free(y);
}

/* par_indexer_scores / par_indexer_topk (the two steps a tensor-parallel
 * caller runs on shards of heads): one shard per head, chained in head
 * order on one score array, gives the all-heads sums bit for bit and
 * par_indexer_select's picks. */
Test(indexer, head_shards_chained_equal_select)
{
    icase *c = malloc(sizeof *c);
    icase_init(c, 11);
    cr_assert_eq(par_indexer_select_f64(c->sel, c->iq, c->iw, c->icmp, c->pos, &c->dm, 0, T), 0);
    const int64_t nv = par_indexer_max_visible_f64(c->pos, 0, T);
    cr_assert_eq(nv, 30 / 4);
    double *acc = calloc((size_t)(T * nv), sizeof(double));
    double *whole = calloc((size_t)(T * nv), sizeof(double));
    par_indexer_scores_f64(whole, nv, c->iq, c->iw, c->icmp, c->pos, &c->dm, 0, T);
    /* shard h: the iq / iw columns of head h alone */
    par_attn_dims one = c->dm;
    one.iH = 1;
    double *iq1 = malloc(sizeof(double) * T * IHD), *iw1 = malloc(sizeof(double) * T);
    for (int h = 0; h < IH; h++) {
        for (int t = 0; t < T; t++) {
            memcpy(iq1 + t * IHD, c->iq + (t * IH + h) * IHD, sizeof(double) * IHD);
            iw1[t] = c->iw[t * IH + h];
        }
        par_indexer_scores_f64(acc, nv, iq1, iw1, c->icmp, c->pos, &one, 0, T);
    }
    cr_assert(memcmp(acc, whole, sizeof(double) * (size_t)(T * nv)) == 0,
              "chained head shards differ from the all-heads sums");
    int32_t sel[T * K];
    cr_assert_eq(par_indexer_topk_f64(sel, acc, nv, c->pos, &c->dm, 0, T), 0);
    cr_assert(memcmp(sel, c->sel, sizeof sel) == 0, "topk of the chained scores != select");
    free(acc);
    free(whole);
    free(iq1);
    free(iw1);
    free(c);
}
