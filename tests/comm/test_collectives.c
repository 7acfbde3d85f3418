/* Collectives against serial references computed in the test, on every world
 * of comm_test.h: all-reduce (every type, sum and max), reduce-scatter,
 * all-gather(v), all-to-all(v), broadcast, barrier; odd and empty sizes,
 * in-place use, bitwise repeatability and the rank order of sums. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "comm_test.h"

static const size_t COUNTS[] = {0, 1, 7, 13, 100};
#define NCOUNTS (sizeof COUNTS / sizeof COUNTS[0])

/* Element i of rank r's input, as f64; other types convert it. */
static double val(int r, size_t i)
{
    return (double)((r * 131 + (int)i * 71) % 97) / 7.0 - 5.5 + 1e-9 * r;
}

static void fill(void *buf, par_ctype t, int r, size_t n, size_t off)
{
    for (size_t i = 0; i < n; i++) {
        double v = val(r, i + off);
        switch (t) {
        case PAR_C_F64: ((double *)buf)[i] = v; break;
        case PAR_C_F32: ((float *)buf)[i] = (float)v; break;
        case PAR_C_I32: ((int32_t *)buf)[i] = (int32_t)((uint32_t)(int32_t)(v * 1000) * 300007u); break;
        case PAR_C_I64: ((int64_t *)buf)[i] = (int64_t)(v * 1000) * 3000000007LL; break;
        default: ((uint8_t *)buf)[i] = (uint8_t)(int)(v * 37); break;
        }
    }
}

/* Serial reference: op over ranks 0..p-1 in order, as the spec says. */
static void reference(void *out, par_ctype t, par_redop op, int p, size_t n, size_t off)
{
    size_t es = par_ctype_size(t);
    char *tmp = malloc(n * es + 1);
    fill(out, t, 0, n, off);
    for (int r = 1; r < p; r++) {
        fill(tmp, t, r, n, off);
        for (size_t i = 0; i < n; i++) {
            switch (t) {
            case PAR_C_F64: {
                double *o = out, v = ((double *)tmp)[i];
                o[i] = op == PAR_OP_SUM ? o[i] + v : (v > o[i] ? v : o[i]);
                break;
            }
            case PAR_C_F32: {
                float *o = out, v = ((float *)tmp)[i];
                o[i] = op == PAR_OP_SUM ? o[i] + v : (v > o[i] ? v : o[i]);
                break;
            }
            case PAR_C_I32: {
                int32_t *o = out, v = ((int32_t *)tmp)[i];
                o[i] = op == PAR_OP_SUM ? (int32_t)((uint32_t)o[i] + (uint32_t)v)
                                        : (v > o[i] ? v : o[i]);
                break;
            }
            case PAR_C_I64: {
                int64_t *o = out, v = ((int64_t *)tmp)[i];
                o[i] = op == PAR_OP_SUM ? (int64_t)((uint64_t)o[i] + (uint64_t)v)
                                        : (v > o[i] ? v : o[i]);
                break;
            }
            default: {
                uint8_t *o = out, v = ((uint8_t *)tmp)[i];
                o[i] = op == PAR_OP_SUM ? (uint8_t)(o[i] + v) : (v > o[i] ? v : o[i]);
                break;
            }
            }
        }
    }
    free(tmp);
}

/* ---- all-reduce and reduce-scatter -------------------------------------- */

static par_status allreduce_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    for (int t = 0; t < PAR_C_COUNT; t++) {
        size_t es = par_ctype_size((par_ctype)t);
        for (int op = 0; op < PAR_OP_COUNT; op++) {
            for (size_t k = 0; k < NCOUNTS; k++) {
                size_t n = COUNTS[k];
                char *in = malloc(n * es + 1), *out = malloc(n * es + 1), *ref = malloc(n * es + 1);
                fill(in, (par_ctype)t, r, n, 0);
                reference(ref, (par_ctype)t, (par_redop)op, p, n, 0);
                TRY(par_allreduce(c, in, out, n, (par_ctype)t, (par_redop)op));
                CHECK(!memcmp(out, ref, n * es), "%s %s n=%zu p=%d", par_ctype_name(t),
                      par_redop_name(op), n, p);
                /* input untouched */
                fill(out, (par_ctype)t, r, n, 0);
                CHECK(!memcmp(in, out, n * es), "allreduce changed its input");
                /* in place */
                TRY(par_allreduce(c, in, in, n, (par_ctype)t, (par_redop)op));
                CHECK(!memcmp(in, ref, n * es), "in place %s %s n=%zu", par_ctype_name(t),
                      par_redop_name(op), n);
                free(in), free(out), free(ref);
            }
        }
    }
    return PAR_OK;
}

Test(collectives, allreduce_all_types_sizes_against_serial)
{
    RUN_ALL_WORLDS(allreduce_fn, NULL);
}

/* Counts whose received rows pass collectives.c's PAR__ROWS_CAP (16 KiB per
 * rank): on a group over 64 ranks the reduce-scatter goes in chunks of
 * every block (the 1,024-rank world below), and the bits must still be the
 * serial rank-order ones, in place or not; smaller groups take the whole
 * block at once. */
static par_status allreduce_chunks_fn(par_comm *c, void *arg)
{
    (void)arg;
    static const size_t big[] = {4099, 20011};
    size_t nbig = par_comm_size(c) > 64 ? 1 : 2;
    static const par_ctype types[] = {PAR_C_F64, PAR_C_BYTE};
    int r = par_comm_rank(c), p = par_comm_size(c);
    for (size_t ti = 0; ti < 2; ti++) {
        par_ctype t = types[ti];
        size_t es = par_ctype_size(t);
        for (size_t k = 0; k < nbig; k++) {
            size_t n = big[k];
            char *in = malloc(n * es), *out = malloc(n * es), *ref = malloc(n * es);
            fill(in, t, r, n, 0);
            reference(ref, t, PAR_OP_SUM, p, n, 0);
            TRY(par_allreduce(c, in, out, n, t, PAR_OP_SUM));
            CHECK(!memcmp(out, ref, n * es), "%s n=%zu p=%d", par_ctype_name(t), n, p);
            TRY(par_allreduce(c, in, in, n, t, PAR_OP_SUM));
            CHECK(!memcmp(in, ref, n * es), "in place %s n=%zu p=%d", par_ctype_name(t), n, p);
            free(in), free(out), free(ref);
        }
    }
    return PAR_OK;
}

Test(collectives, allreduce_in_chunks_against_serial)
{
    RUN_ALL_WORLDS(allreduce_chunks_fn, NULL);
    /* 128 ranks: 4,099 f64 go in chunks of 16 elements of every block */
    par_status st = run_world("fiber", 128, allreduce_chunks_fn, NULL, 120.0);
    cr_assert_eq(st, PAR_OK, "fiber x 128: %s (%s)", par_status_str(st), par_last_error());
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "comm memory leaked");
}

/* The chunk boundaries of that reduce-scatter (issue 35): on groups just
 * over 64 ranks and of 128, counts whose blocks are and are not multiples
 * of the chunk (w elements of every block: PAR__ROWS_CAP / (p * es)) and
 * that are and are not multiples of the group, in f64, f32 and bytes, in
 * place and not, against the serial rank-order sums (computed once here,
 * not on every rank). */
#define NBOUND 10
typedef struct {
    int p;
    par_ctype t;
    size_t counts[NBOUND];
    char *ref[NBOUND];
} chunk_case;

static void chunk_counts(chunk_case *cc)
{
    size_t p = (size_t)cc->p, w = (16u << 10) / (p * par_ctype_size(cc->t));
    const size_t c[NBOUND] = {
        p * w * 2,       /* group and chunk: every block two whole chunks */
        p * w,           /* group and chunk: one whole chunk */
        p * (2 * w + 1), /* group, not chunk: a tail of one element */
        p * (w + 3),     /* group, not chunk: a tail of three */
        w * (2 * p + 1), /* chunk, not group: blocks of 2w+1 and 2w */
        w * (p + 1),     /* chunk, not group */
        p * 2 * w + 1,   /* neither: one block a tail of one */
        p * 3 * w - 5,   /* neither: five blocks a chunk short of one element */
        p * w + p - 1,   /* neither: every block but one w+1 */
        p - 3,           /* fewer elements than ranks: blocks of 1 and 0 */
    };
    memcpy(cc->counts, c, sizeof c);
}

static par_status chunk_bounds_fn(par_comm *c, void *arg)
{
    const chunk_case *cc = arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    size_t es = par_ctype_size(cc->t), w = (16u << 10) / ((size_t)p * es);
    for (int k = 0; k < NBOUND; k++) {
        size_t n = cc->counts[k], big = n / (size_t)p + (n % (size_t)p != 0);
        CHECK(par_allreduce_rows(n, p, es) == (size_t)p * (big < w ? big : w), "rows of n=%zu p=%d", n, p);
        char *in = malloc(n * es + 1), *out = malloc(n * es + 1);
        fill(in, cc->t, r, n, 0);
        TRY(par_allreduce(c, in, out, n, cc->t, PAR_OP_SUM));
        CHECK(!memcmp(out, cc->ref[k], n * es), "%s n=%zu p=%d chunk %zu", par_ctype_name(cc->t), n, p, w);
        TRY(par_allreduce(c, in, in, n, cc->t, PAR_OP_SUM));
        CHECK(!memcmp(in, cc->ref[k], n * es), "in place %s n=%zu p=%d chunk %zu", par_ctype_name(cc->t), n, p, w);
        free(in), free(out);
    }
    return PAR_OK;
}

Test(collectives, allreduce_chunk_boundaries, .timeout = 300)
{
    static const int ps[] = {65, 128};
    static const par_ctype ts[] = {PAR_C_F64, PAR_C_F32, PAR_C_BYTE};
    for (size_t pi = 0; pi < 2; pi++) {
        for (size_t ti = 0; ti < 3; ti++) {
            chunk_case cc = {.p = ps[pi], .t = ts[ti]};
            chunk_counts(&cc);
            size_t es = par_ctype_size(cc.t);
            for (int k = 0; k < NBOUND; k++) {
                cc.ref[k] = malloc(cc.counts[k] * es + 1);
                reference(cc.ref[k], cc.t, PAR_OP_SUM, cc.p, cc.counts[k], 0);
            }
            par_status st = run_world("fiber", cc.p, chunk_bounds_fn, &cc, 120.0);
            cr_assert_eq(st, PAR_OK, "fiber x %d, %s: %s (%s)", cc.p, par_ctype_name(cc.t), par_status_str(st),
                         par_last_error());
            cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "comm memory leaked");
            for (int k = 0; k < NBOUND; k++)
                free(cc.ref[k]);
        }
    }
}

static par_status reduce_scatter_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    par_ctype types[] = {PAR_C_F64, PAR_C_F32, PAR_C_I64};
    for (size_t ti = 0; ti < 3; ti++) {
        par_ctype t = types[ti];
        size_t es = par_ctype_size(t);
        for (size_t k = 0; k < NCOUNTS; k++) {
            size_t n = COUNTS[k], tot = n * (size_t)p;
            char *in = malloc(tot * es + 1), *out = malloc(n * es + 1), *ref = malloc(n * es + 1);
            fill(in, t, r, tot, 0);
            reference(ref, t, PAR_OP_SUM, p, n, (size_t)r * n);
            TRY(par_reduce_scatter(c, in, out, n, t, PAR_OP_SUM));
            CHECK(!memcmp(out, ref, n * es), "%s n=%zu", par_ctype_name(t), n);
            TRY(par_reduce_scatter(c, in, in, n, t, PAR_OP_SUM)); /* in place */
            CHECK(!memcmp(in, ref, n * es), "in place %s n=%zu", par_ctype_name(t), n);
            free(in), free(out), free(ref);
        }
    }
    return PAR_OK;
}

Test(collectives, reduce_scatter_against_serial)
{
    RUN_ALL_WORLDS(reduce_scatter_fn, NULL);
}

/* ---- determinism -------------------------------------------------------- */

/* Rank 0 holds 1e16, rank 1 holds 1, rank 2 holds -1e16: in rank order
 * (1e16 + 1) - 1e16 = 0 (1 is lost to rounding); any order that adds
 * rank 2 before rank 1 gives 1. */
static par_status order_fn(par_comm *c, void *arg)
{
    double *res = arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    double x[5];
    for (int i = 0; i < 5; i++)
        x[i] = r == 0 ? 1e16 : r == 1 ? 1.0 : r == 2 ? -1e16 : 0.0;
    double y[5];
    TRY(par_allreduce(c, x, y, 5, PAR_C_F64, PAR_OP_SUM));
    for (int i = 0; i < 5; i++)
        CHECK(y[i] == (p >= 3 ? 0.0 : p == 2 ? 1e16 + 1.0 : 1e16), "element %d is %.17g", i,
              y[i]);
    /* many values: the result must be bitwise what a serial loop gives */
    enum { N = 257 };
    double a[N], b[N];
    for (int i = 0; i < N; i++)
        a[i] = sin(1.0 + r * 0.731 + i * 0.173) * pow(10.0, (r * 7 + i) % 9);
    TRY(par_allreduce(c, a, b, N, PAR_C_F64, PAR_OP_SUM));
    if (r == 0)
        memcpy(res, b, sizeof b);
    return PAR_OK;
}

Test(collectives, sums_in_rank_order_and_bitwise_repeatable)
{
    enum { N = 257 };
    for (size_t wi = 0; wi < NWORLDS; wi++) {
        double first[N], second[N], ref[N] = {0};
        int p = WORLDS[wi].n;
        for (int i = 0; i < N; i++)
            for (int r = 0; r < p; r++)
                ref[i] = (r ? ref[i] : 0.0) + sin(1.0 + r * 0.731 + i * 0.173) *
                                                 pow(10.0, (r * 7 + i) % 9);
        cr_assert_eq(run_world(WORLDS[wi].backend, p, order_fn, first, 20), PAR_OK, "%s",
                     par_last_error());
        cr_assert_eq(run_world(WORLDS[wi].backend, p, order_fn, second, 20), PAR_OK, "%s",
                     par_last_error());
        cr_assert(!memcmp(first, second, sizeof first), "%s x %d: two runs differ",
                  WORLDS[wi].backend, p);
        cr_assert(!memcmp(first, ref, sizeof ref), "%s x %d: not the serial rank-order sum",
                  WORLDS[wi].backend, p);
    }
}

/* ---- gathers ------------------------------------------------------------ */

static par_status allgather_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    for (size_t k = 0; k < NCOUNTS; k++) {
        size_t n = COUNTS[k], tot = n * (size_t)p;
        double *in = malloc(n * 8 + 8), *out = malloc(tot * 8 + 8), *ref = malloc(tot * 8 + 8);
        fill(in, PAR_C_F64, r, n, 0);
        for (int q = 0; q < p; q++)
            fill(ref + (size_t)q * n, PAR_C_F64, q, n, 0);
        TRY(par_allgather(c, in, out, n, PAR_C_F64));
        CHECK(!memcmp(out, ref, tot * 8), "n=%zu", n);
        /* in place: my block already sits in out */
        memset(out, 0, tot * 8);
        fill(out + (size_t)r * n, PAR_C_F64, r, n, 0);
        TRY(par_allgather(c, out + (size_t)r * n, out, n, PAR_C_F64));
        CHECK(!memcmp(out, ref, tot * 8), "in place n=%zu", n);
        /* overlapping elsewhere: input at the start of out */
        memset(out, 0, tot * 8);
        fill(out, PAR_C_F64, r, n, 0);
        TRY(par_allgather(c, out, out, n, PAR_C_F64));
        CHECK(!memcmp(out, ref, tot * 8), "overlapping n=%zu", n);
        free(in), free(out), free(ref);
    }
    return PAR_OK;
}

Test(collectives, allgather_against_serial)
{
    RUN_ALL_WORLDS(allgather_fn, NULL);
}

/* counts[q] = (q * 3) % 4: zero for some ranks; with and without displs. */
static par_status allgatherv_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    size_t *counts = malloc((size_t)p * sizeof *counts), *displs = malloc((size_t)p * sizeof *displs);
    size_t packed = 0, spread = 0;
    for (int q = 0; q < p; q++) {
        counts[q] = (size_t)(q * 3 + 1) % 4;
        displs[q] = spread + 2; /* gaps of two elements */
        spread = displs[q] + counts[q];
        packed += counts[q];
    }
    int32_t *in = malloc(counts[r] * 4 + 4), *out = malloc(spread * 4 + 4),
            *ref = malloc(spread * 4 + 4);
    fill(in, PAR_C_I32, r, counts[r], 0);
    /* packed */
    size_t at = 0;
    for (int q = 0; q < p; q++) {
        fill(ref + at, PAR_C_I32, q, counts[q], 0);
        at += counts[q];
    }
    TRY(par_allgatherv(c, in, counts[r], out, counts, NULL, PAR_C_I32));
    CHECK(!memcmp(out, ref, packed * 4), "packed p=%d", p);
    /* with displs: gaps keep their values */
    for (size_t i = 0; i < spread; i++)
        out[i] = ref[i] = -7;
    for (int q = 0; q < p; q++)
        fill(ref + displs[q], PAR_C_I32, q, counts[q], 0);
    TRY(par_allgatherv(c, in, counts[r], out, counts, displs, PAR_C_I32));
    CHECK(!memcmp(out, ref, spread * 4), "displs p=%d", p);
    /* all counts zero */
    for (int q = 0; q < p; q++)
        counts[q] = 0;
    TRY(par_allgatherv(c, NULL, 0, NULL, counts, NULL, PAR_C_I32));
    free(counts), free(displs), free(in), free(out), free(ref);
    return PAR_OK;
}

Test(collectives, allgatherv_zero_counts_and_displs)
{
    RUN_ALL_WORLDS(allgatherv_fn, NULL);
}

/* ---- all-to-all --------------------------------------------------------- */

static par_status alltoall_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    for (size_t k = 0; k < NCOUNTS; k++) {
        size_t n = COUNTS[k], tot = n * (size_t)p;
        int64_t *in = malloc(tot * 8 + 8), *out = malloc(tot * 8 + 8), *ref = malloc(tot * 8 + 8);
        /* element i of block j from rank q: q * 1e6 + j * 1e3 + i */
        for (int j = 0; j < p; j++)
            for (size_t i = 0; i < n; i++) {
                in[(size_t)j * n + i] = (int64_t)r * 1000000 + j * 1000 + (int64_t)i;
                ref[(size_t)j * n + i] = (int64_t)j * 1000000 + r * 1000 + (int64_t)i;
            }
        TRY(par_alltoall(c, in, out, n, PAR_C_I64));
        CHECK(!memcmp(out, ref, tot * 8), "n=%zu", n);
        TRY(par_alltoall(c, in, in, n, PAR_C_I64)); /* in place */
        CHECK(!memcmp(in, ref, tot * 8), "in place n=%zu", n);
        free(in), free(out), free(ref);
    }
    return PAR_OK;
}

Test(collectives, alltoall_against_serial)
{
    RUN_ALL_WORLDS(alltoall_fn, NULL);
}

/* Rank q sends (q + j) % 3 elements to rank j (zero for some pairs). */
static size_t a2av_count(int q, int j) { return (size_t)(q + j) % 3; }

static par_status alltoallv_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    size_t *sc = malloc((size_t)p * 8), *sd = malloc((size_t)p * 8), *rc = malloc((size_t)p * 8),
           *rd = malloc((size_t)p * 8);
    size_t stot = 0, rtot = 0;
    for (int j = 0; j < p; j++) {
        sc[j] = a2av_count(r, j);
        rc[j] = a2av_count(j, r);
        stot += sc[j];
        rtot += rc[j];
    }
    /* send blocks in reverse rank order with gaps; receive packed */
    size_t at = 1;
    for (int j = p - 1; j >= 0; j--) {
        sd[j] = at;
        at += sc[j] + 1;
    }
    float *in = malloc(at * 4 + 4), *out = malloc(rtot * 4 + 4), *ref = malloc(rtot * 4 + 4);
    for (int j = 0; j < p; j++)
        for (size_t i = 0; i < sc[j]; i++)
            in[sd[j] + i] = (float)(r * 100 + j * 10 + (int)i);
    size_t o = 0;
    for (int j = 0; j < p; j++)
        for (size_t i = 0; i < rc[j]; i++)
            ref[o++] = (float)(j * 100 + r * 10 + (int)i);
    TRY(par_alltoallv(c, in, sc, sd, out, rc, NULL, PAR_C_F32));
    CHECK(!memcmp(out, ref, rtot * 4), "p=%d", p);
    /* all zero */
    for (int j = 0; j < p; j++)
        sc[j] = rc[j] = 0;
    TRY(par_alltoallv(c, NULL, sc, NULL, NULL, rc, NULL, PAR_C_F32));
    free(sc), free(sd), free(rc), free(rd), free(in), free(out), free(ref);
    (void)stot;
    return PAR_OK;
}

Test(collectives, alltoallv_zero_counts_and_displs)
{
    RUN_ALL_WORLDS(alltoallv_fn, NULL);
}

/* ---- broadcast and barrier ---------------------------------------------- */

static par_status bcast_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    for (int root = 0; root < p; root += (p > 8 ? 7 : 1)) {
        for (size_t k = 0; k < NCOUNTS; k++) {
            size_t n = COUNTS[k];
            uint8_t *buf = malloc(n + 1), *ref = malloc(n + 1);
            fill(ref, PAR_C_BYTE, root, n, 0);
            if (r == root)
                memcpy(buf, ref, n);
            else
                memset(buf, 0xAB, n);
            TRY(par_bcast(c, buf, n, PAR_C_BYTE, root));
            CHECK(!memcmp(buf, ref, n), "root %d n=%zu", root, n);
            free(buf), free(ref);
        }
    }
    TRY(par_barrier(c));
    return PAR_OK;
}

Test(collectives, bcast_from_every_root)
{
    RUN_ALL_WORLDS(bcast_fn, NULL);
}

/* A barrier orders: each rank writes its slot before, reads all after. */
static par_status barrier_fn(par_comm *c, void *arg)
{
    _Atomic int *slots = arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    for (int round = 1; round <= 20; round++) {
        atomic_store(&slots[r], round);
        TRY(par_barrier(c));
        for (int q = 0; q < p; q++)
            CHECK(atomic_load(&slots[q]) >= round, "round %d: rank %d not there", round, q);
        TRY(par_barrier(c));
    }
    return PAR_OK;
}

Test(collectives, barrier_orders_ranks)
{
    static _Atomic int slots[256];
    for (int i = 0; i < 256; i++)
        atomic_store(&slots[i], 0);
    RUN_ALL_WORLDS(barrier_fn, (void *)slots);
}

/* ---- 1024 ranks --------------------------------------------------------- */

static par_status big_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    TRY(par_barrier(c));
    int64_t x[3] = {r, 1, (int64_t)r * r}, y[3];
    TRY(par_allreduce(c, x, y, 3, PAR_C_I64, PAR_OP_SUM));
    CHECK(y[0] == (int64_t)p * (p - 1) / 2 && y[1] == p, "sums %lld %lld", (long long)y[0],
          (long long)y[1]);
    TRY(par_barrier(c));
    return PAR_OK;
}

Test(collectives, world_of_1024_ranks, .timeout = 120)
{
    const char *backends[] = {"threads", "fiber"};
    for (int i = 0; i < 2; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        par_status st = run_world(backends[i], 1024, big_fn, NULL, 60);
        clock_gettime(CLOCK_MONOTONIC, &b);
        cr_assert_eq(st, PAR_OK, "%s: %s", backends[i], par_last_error());
        cr_log_info("1024 ranks on %s: barrier + allreduce + barrier in %.3f s", backends[i],
                    (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec));
        cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0);
    }
}
