/* Core: status, logging, tagged allocation, arenas, Philox RNG, bf16. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"

/* Published Random123 known-answer vectors for Philox4x32-10
 * (counter[4], key[2] -> output[4]). */
static const uint32_t kat[3][10] = {
    {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
    {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e,
     0xa20bc7c6, 0x6d5451fd},
    {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
     0x5001e420, 0x24126ea1},
};

Test(rng, philox_known_answers)
{
    for (int v = 0; v < 3; v++) {
        par_philox_key key = {{kat[v][4], kat[v][5]}};
        uint32_t out[4];
        par_philox4x32_10(kat[v], key, out);
        for (int j = 0; j < 4; j++)
            cr_expect_eq(out[j], kat[v][6 + j], "vector %d word %d: got %08x want %08x", v, j, out[j],
                         kat[v][6 + j]);
    }
}

Test(rng, name_hash_is_fnv1a64)
{
    /* FNV-1a 64 of "" and "a" are published constants. */
    cr_expect_eq(par_name_hash64(""), 0xcbf29ce484222325ull);
    cr_expect_eq(par_name_hash64("a"), 0xaf63dc4c8601ec8cull);
    cr_expect_neq(par_name_hash64("layers.0.attn.wq_a.weight"), par_name_hash64("layers.1.attn.wq_a.weight"));
}

Test(rng, streams_are_pure_functions)
{
    par_philox_key k1 = par_rng_key(42, "embed.weight");
    par_philox_key k2 = par_rng_key(42, "embed.weight");
    par_philox_key k3 = par_rng_key(43, "embed.weight");
    cr_expect(k1.k[0] == k2.k[0] && k1.k[1] == k2.k[1]);
    cr_expect(k1.k[0] != k3.k[0] || k1.k[1] != k3.k[1]);
    /* element i is the same whatever order elements are drawn in */
    double a = par_rng_normal(k1, 1000, 0);
    for (uint64_t i = 0; i < 10; i++)
        (void)par_rng_normal(k1, i, 0);
    cr_expect_eq(a, par_rng_normal(k1, 1000, 0));
}

Test(rng, normal_moments)
{
    par_philox_key k = par_rng_key(7, "moments");
    const int n = 200000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double x = par_rng_normal(k, (uint64_t)i, 0);
        s += x;
        s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    cr_expect(fabs(mean) < 0.01, "mean %g", mean);
    cr_expect(fabs(var - 1.0) < 0.02, "var %g", var);
    for (int i = 0; i < 1000; i++) {
        double u = par_rng_uniform(k, (uint64_t)i, 1);
        cr_assert(u > 0.0 && u < 1.0);
        cr_assert(par_rng_below(k, (uint64_t)i, 2, 7) < 7);
    }
}

static uint16_t bf(float f) { return par_bf16_from_f32(f); }

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

Test(bf16, rounding_edges)
{
    cr_expect_eq(bf(1.0f), 0x3f80);
    cr_expect_eq(bf(-2.0f), 0xc000);
    /* exactly halfway: ties to even */
    cr_expect_eq(bf(from_bits(0x3f808000u)), 0x3f80); /* 1 + 2^-8: even stays */
    cr_expect_eq(bf(from_bits(0x3f818000u)), 0x3f82); /* odd rounds up       */
    cr_expect_eq(bf(from_bits(0x3f808001u)), 0x3f81); /* above half rounds up */
    cr_expect_eq(bf(from_bits(0x3f807fffu)), 0x3f80); /* below half down     */
    /* overflow to infinity, infinities and NaN preserved */
    cr_expect_eq(bf(from_bits(0x7f7fffffu)), 0x7f80);
    cr_expect_eq(bf(INFINITY), 0x7f80);
    cr_expect_eq(bf(-INFINITY), 0xff80);
    uint16_t n = bf(NAN);
    cr_expect((n & 0x7f80) == 0x7f80 && (n & 0x7f), "NaN stays NaN: %04x", n);
    uint16_t n2 = bf(from_bits(0x7f800001u)); /* signalling NaN with low payload only */
    cr_expect((n2 & 0x7f80) == 0x7f80 && (n2 & 0x7f), "sNaN must not become inf: %04x", n2);
    /* subnormals and signed zero */
    cr_expect_eq(bf(-0.0f), 0x8000);
    cr_expect_eq(bf(from_bits(0x00010000u)), 0x0001);
    cr_expect_eq(par_bf16_to_f32(0x3f80), 1.0f);
}

Test(bf16, from_f64_rounds_once)
{
    /* 1 + 2^-8 + 2^-40: a double just above the bf16 halfway point, which a
     * double->float->bf16 path with round-to-nearest would round down. */
    double d = 1.0 + ldexp(1.0, -8) + ldexp(1.0, -40);
    cr_expect_eq(par_bf16_from_f64(d), 0x3f81);
    cr_expect_eq(par_bf16_from_f64(1.0 + ldexp(1.0, -8)), 0x3f80);
    cr_expect_eq(par_bf16_from_f64(1.0), 0x3f80);
    cr_expect_eq(par_bf16_from_f64(1e300), 0x7f80);
    cr_expect_eq(par_bf16_from_f64(-1e-300), 0x8000);
}

Test(alloc, tags_count_live_and_peak)
{
    int64_t before = par_alloc_live(PAR_TAG_GRAD);
    void *p = par_malloc(1000, PAR_TAG_GRAD);
    cr_assert_not_null(p);
    cr_expect_eq((uintptr_t)p % 64, 0);
    cr_expect_eq(par_alloc_live(PAR_TAG_GRAD), before + 1000);
    p = par_realloc(p, 5000, PAR_TAG_MISC);
    cr_expect_eq(par_alloc_live(PAR_TAG_GRAD), before + 5000, "realloc keeps the block's tag");
    cr_expect_geq(par_alloc_peak(PAR_TAG_GRAD), before + 5000);
    par_free(p);
    cr_expect_eq(par_alloc_live(PAR_TAG_GRAD), before);
    cr_expect_null(par_calloc(SIZE_MAX / 2, 4, PAR_TAG_MISC), "overflowing calloc refused");
}

/* The VmFlags of the mapping that holds p, from /proc/self/smaps ("" when
 * not found); 1 when it was found. */
static int vma_flags(const void *p, char *flags, size_t cap)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0, found = 0;
    flags[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's first line */
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in && !strncmp(line, "VmFlags:", 8)) {
            snprintf(flags, cap, "%s", line + 8);
            found = 1;
            break;
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* core/alloc.h: a block of PAR_ALLOC_THP_MIN or more gets its own mapping
 * advised for huge pages ("hg" in its VmFlags); PARITY_THP=0 turns it off;
 * a smaller block is never advised.  (Each Criterion test is its own
 * process, so the policy set here stays here.) */
static void check_thp(int on)
{
    char fl[512];
    par_alloc_process_init();
    cr_assert_eq(par_alloc_thp(), on);
    char *big = par_malloc(3 * (size_t)PAR_ALLOC_THP_MIN, PAR_TAG_ACT);
    char *small = par_malloc(PAR_ALLOC_THP_MIN / 4, PAR_TAG_ACT);
    cr_assert(big && small);
    big[0] = small[0] = 1;
    cr_assert(vma_flags(big + PAR_ALLOC_THP_MIN, fl, sizeof fl), "no mapping holds the block");
    cr_expect_eq(strstr(fl, " hg") != NULL, on, "big block: VmFlags%s", fl);
    cr_assert(vma_flags(small, fl, sizeof fl));
    cr_expect_null(strstr(fl, " hg"), "small block advised: VmFlags%s", fl);
    par_free(big);
    par_free(small);
}

Test(alloc, big_blocks_advised_for_huge_pages)
{
    unsetenv("PARITY_THP");
    check_thp(1);
}

Test(alloc, parity_thp_0_turns_the_advice_off)
{
    setenv("PARITY_THP", "0", 1);
    check_thp(0);
}

Test(alloc, arena_alloc_rewind_destroy)
{
    par_arena a;
    par_arena_init(&a, 256, PAR_TAG_ACT);
    char *x = par_arena_alloc(&a, 100, 64);
    cr_assert_not_null(x);
    cr_expect_eq((uintptr_t)x % 64, 0);
    par_arena_mark m = par_arena_get_mark(&a);
    for (int i = 0; i < 10; i++)
        cr_assert_not_null(par_arena_alloc(&a, 200, 8)); /* forces new chunks */
    void *big = par_arena_calloc(&a, 10000, 16);
    cr_assert_not_null(big);
    cr_expect_eq(((char *)big)[9999], 0);
    par_arena_rewind(&a, m);
    cr_expect_eq(a.used, 100);
    par_arena_reset(&a);
    cr_expect_eq(a.used, 0);
    par_arena_destroy(&a);
    cr_expect_eq(par_alloc_live(PAR_TAG_ACT), 0);
}

/* A block made in one scope and freed by another thread still uncharges
 * its own scope (threads backend: receivers free senders' buffers). */
static void *free_elsewhere(void *p)
{
    par_free(p);
    return NULL;
}

Test(alloc, scopes_charge_their_thread_and_views)
{
    int id = par_alloc_scope_open();
    cr_assert_gt(id, 0);
    void *g = par_malloc(1000, PAR_TAG_GRAD);
    par_arena a;
    par_arena_init(&a, 4096, PAR_TAG_ACT);
    cr_assert_not_null(par_arena_alloc(&a, 100, 64));
    par_arena_mark m = par_arena_get_mark(&a);
    cr_assert_not_null(par_arena_alloc(&a, 300, 64));
    par_alloc_stats st;
    par_alloc_scope_stats(id, &st);
    cr_expect_eq(st.live[PAR_TAG_GRAD], 1000);
    cr_expect_eq(st.live[PAR_TAG_ACT], 400, "allocated view: the handouts");
    cr_expect_gt(st.res_live[PAR_TAG_ACT], 4096, "reserved view: the whole chunk");
    par_arena_rewind(&a, m);
    par_alloc_scope_stats(id, &st);
    cr_expect_eq(st.live[PAR_TAG_ACT], 100);
    cr_expect_eq(st.peak[PAR_TAG_ACT], 400);
    par_alloc_scope_reset_peaks(id);
    par_alloc_scope_stats(id, &st);
    cr_expect_eq(st.peak[PAR_TAG_ACT], 100, "a reset starts a new window");

    /* outside the scope nothing is charged to it */
    cr_expect_eq(par_alloc_scope_enter(0), id);
    void *o = par_malloc(50, PAR_TAG_GRAD);
    par_alloc_scope_enter(id);
    par_alloc_scope_stats(id, &st);
    cr_expect_eq(st.live[PAR_TAG_GRAD], 1000);
    par_free(o);

    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, free_elsewhere, g), 0);
    pthread_join(th, NULL);
    par_alloc_scope_stats(id, &st);
    cr_expect_eq(st.live[PAR_TAG_GRAD], 0, "freed by another thread, uncharged from its scope");
    cr_expect_eq(st.peak[PAR_TAG_GRAD], 1000);
    par_arena_destroy(&a);
    par_alloc_scope_stats(id, &st);
    cr_expect_eq(st.live[PAR_TAG_ACT], 0);
    cr_expect_eq(st.res_live[PAR_TAG_ACT], 0);

    /* a block outliving its scope is ignored by the slot's next user */
    void *late = par_malloc(64, PAR_TAG_COMM);
    par_alloc_scope_close(id);
    int id2 = par_alloc_scope_open();
    cr_assert_gt(id2, 0);
    par_free(late);
    par_alloc_scope_stats(id2, &st);
    cr_expect_eq(st.live[PAR_TAG_COMM], 0);
    par_alloc_scope_close(id2);
    par_alloc_scope_stats(id2, &st);
    cr_expect_eq(st.peak[PAR_TAG_COMM], 0, "a closed scope reads as zeros");
}

static char sink_buf[256];
static void sink(par_log_level l, const char *msg, void *ud)
{
    (void)ud;
    snprintf(sink_buf, sizeof sink_buf, "%d:%s", (int)l, msg);
}

Test(status, err_records_and_logs_once)
{
    par_log_set_sink(sink, NULL);
    sink_buf[0] = 0;
    par_status s = par_err(PAR_EFORMAT, "file %s: bad %d", "x.st", 3);
    cr_expect_eq(s, PAR_EFORMAT);
    cr_expect_str_eq(par_last_error(), "file x.st: bad 3");
    cr_expect_str_eq(sink_buf, "0:file x.st: bad 3");
    /* a message may wrap the last one (re-coding or prefixing a lower layer's) */
    par_err(PAR_EINVAL, "%s", par_last_error());
    cr_expect_str_eq(par_last_error(), "file x.st: bad 3");
    par_err(PAR_EFORMAT, "%s: %s", "outer", par_last_error());
    cr_expect_str_eq(par_last_error(), "outer: file x.st: bad 3");
    par_log_set_sink(NULL, NULL);
    cr_expect_str_eq(par_status_str(PAR_OK), "ok");
    cr_expect_str_eq(par_status_str(PAR_EFORMAT), "malformed input");
    cr_expect_str_eq(par_status_str(-999), "unknown status");
    par_log_level lv;
    cr_expect_eq(par_log_parse_level("debug", &lv), 0);
    cr_expect_eq(lv, PAR_LOG_DEBUG);
    cr_expect_eq(par_log_parse_level("loud", &lv), -1);
}

Test(tensor, alloc_shape_and_overflow)
{
    par_tensor t;
    int64_t shape[3] = {2, 3, 4};
    cr_assert_eq(par_tensor_alloc(&t, PAR_BF16, 3, shape, PAR_TAG_TENSOR), PAR_OK);
    cr_expect_eq(par_tensor_numel(&t), 24);
    cr_expect_eq(par_tensor_nbytes(&t), 48);
    char buf[64];
    cr_expect_str_eq(par_shape_str(3, shape, buf, sizeof buf), "[2,3,4]");
    par_tensor_free(&t);
    int64_t huge[2] = {INT64_C(1) << 62, 4};
    cr_expect_eq(par_shape_numel(2, huge, 1), -1);
    cr_expect_eq(par_shape_numel(1, huge, 8), -1);
    int64_t neg[1] = {-1};
    cr_expect_eq(par_shape_numel(1, neg, 1), -1);
    cr_expect_eq(par_alloc_live(PAR_TAG_TENSOR), 0);
}
