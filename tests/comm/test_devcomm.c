/* tests/comm/test_devcomm.c - collectives and messages between ranks that
 * share one (emulated) device move device memory (core/device.h
 * par_dev_comm_copy; docs/gpu.md "Collectives on one device").  Offload
 * builds only (meson.build); PARITY_GPU_EMULATE=1 is set here.
 *
 * Each rank fills a kept send buffer on the device (par_dev_out: its host copy
 * is then poison, NaN), then an allgather into a kept buffer (device to
 * device: the values arrive on the device, the host copy stays poison until
 * read through par_dev_host_read), an allgather into plain host memory (on the
 * host: the source pulled) and a ring of point-to-point messages between kept
 * buffers.  A backend that copied the host bytes would deliver NaN.
 *
 * The rank-order sums (comm/collectives.c, core/device.h par_dev_reduce_rows):
 * an all-reduce in place in a kept buffer, a reduce-scatter between kept
 * buffers (f64 values whose sum depends on the order, wrapping int64, a max
 * with a NaN) run on the device: every byte between the ranks moves device
 * to device, the host copy of the result stays poison until read, and the
 * values are bitwise the host loop's (rank order 0..p-1).  An all-reduce
 * into host memory sums on the host after pulling the rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm_test.h"
#include "core/device.h"

#define N 96 /* doubles per rank */

static double val(int r, int i) { return 1000.0 * r + i + 0.25; }

/* A kept buffer of n doubles (its own par_malloc block). */
static double *kept(size_t n)
{
    double *p = par_malloc(n * sizeof *p, PAR_TAG_COMM);
    if (p)
        par_dev_keep(p);
    return p;
}

static par_status check_rows(const double *got, int p, const char *what)
{
    for (int r = 0; r < p; r++)
        for (int i = 0; i < N; i++)
            CHECK(got[r * N + i] == val(r, i), "%s: row %d element %d is %g, not %g", what, r, i,
                  got[r * N + i], val(r, i));
    return PAR_OK;
}

static par_status body(par_comm *w, void *arg)
{
    (void)arg;
    int me = par_comm_rank(w), p = par_comm_size(w);
    double *snd = kept(N), *rcv = kept((size_t)p * N), *host = malloc((size_t)p * N * sizeof *host);
    double *ring = kept(N);
    CHECK(snd && rcv && host && ring, "no memory");
    double *d = par_dev_out(snd, N * sizeof *snd); /* "a kernel" writes it on the device */
    for (int i = 0; i < N; i++)
        d[i] = val(me, i);
    CHECK(snd[0] != snd[0], "the host copy of a device-written buffer is poison (NaN)");
    TRY(par_allgather(w, snd, rcv, N, PAR_C_F64));
    CHECK(rcv[0] != rcv[0], "an allgather between kept buffers left the host copy alone");
    par_dev_host_read(rcv, (size_t)p * N * sizeof *rcv);
    TRY(check_rows(rcv, p, "allgather, device to device"));
    TRY(par_allgather(w, snd, host, N, PAR_C_F64));
    TRY(check_rows(host, p, "allgather into host memory"));
    par_request *rq[2] = {NULL, NULL};
    TRY(par_irecv(w, ring, N, PAR_C_F64, (me + p - 1) % p, 7, &rq[0]));
    TRY(par_isend(w, snd, N, PAR_C_F64, (me + 1) % p, 7, &rq[1]));
    TRY(par_waitall(2, rq));
    par_dev_host_read(ring, N * sizeof *ring);
    for (int i = 0; i < N; i++)
        CHECK(ring[i] == val((me + p - 1) % p, i), "message element %d is %g", i, ring[i]);
    par_free(snd);
    par_free(rcv);
    par_free(ring);
    free(host);
    return PAR_OK;
}

#define M 24 /* elements per rank of the sums (p | M) */

/* Rank r's element i: the f64 terms' sum depends on their order (1e16 absorbs
 * the small ones unless the large ones cancel first). */
static double fval(int r, int i)
{
    static const double big[4] = {1e16, 1.0, -1e16, 0.5};
    return big[r % 4] * (1.0 + i / 64.0) + (r == 1 ? i * 0.375 : 0.0);
}
static int64_t ival(int r, int i) { return INT64_MAX - 3 * (int64_t)i + r; }

/* The host loop's order: row 0, then + row 1, ... (integers wrap). */
static double fsum(int p, int i)
{
    double s = fval(0, i);
    for (int r = 1; r < p; r++)
        s = s + fval(r, i);
    return s;
}
static int64_t isum(int p, int i)
{
    uint64_t s = (uint64_t)ival(0, i);
    for (int r = 1; r < p; r++)
        s += (uint64_t)ival(r, i);
    return (int64_t)s;
}

/* n elements of f at p written "by a kernel" (its host copy poison). */
static void dev_fill(void *p, const void *f, size_t bytes) { memcpy(par_dev_out(p, bytes), f, bytes); }

static par_status check_f64(const double *got, int p, int i0, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        CHECK(memcmp(&got[i], &(double){fsum(p, i0 + i)}, sizeof(double)) == 0, "%s: element %d is %.17g, not %.17g",
              what, i0 + i, got[i], fsum(p, i0 + i));
    return PAR_OK;
}

/* Rank me's reduce-scatter: block r of its input is fval(me, r * M + i);
 * block me of the sums arrives, summed in rank order. */
static par_status scatter_check(par_comm *w, double *rs, double *blk)
{
    int me = par_comm_rank(w), p = par_comm_size(w);
    double in[4 * M];
    for (int i = 0; i < p * M; i++)
        in[i] = fval(me, i);
    dev_fill(rs, in, (size_t)p * M * sizeof *in);
    TRY(par_reduce_scatter(w, rs, blk, M, PAR_C_F64, PAR_OP_SUM));
    CHECK(blk[0] != blk[0], "a reduce-scatter into a kept buffer left its result on the device");
    par_dev_host_read(blk, M * sizeof *blk);
    for (int i = 0; i < M; i++) {
        double s = fval(0, me * M + i);
        for (int r = 1; r < p; r++)
            s = s + fval(r, me * M + i);
        CHECK(memcmp(&blk[i], &s, sizeof s) == 0, "reduce-scatter: element %d is %.17g, not %.17g", i, blk[i], s);
    }
    return PAR_OK;
}

static par_status sums(par_comm *w, void *arg)
{
    (void)arg;
    int me = par_comm_rank(w), p = par_comm_size(w);
    double *f = kept(M), *rs = kept((size_t)p * M), *blk = kept(M), host[M], mine[M];
    int64_t *iv = par_malloc(M * sizeof *iv, PAR_TAG_COMM), imine[M];
    CHECK(f && rs && blk && iv && p <= 4, "no memory");
    par_dev_keep(iv);
    for (int i = 0; i < M; i++)
        mine[i] = fval(me, i), imine[i] = ival(me, i);
    dev_fill(f, mine, sizeof mine);
    dev_fill(iv, imine, sizeof imine);
    TRY(par_allreduce(w, f, f, M, PAR_C_F64, PAR_OP_SUM));
    CHECK(f[0] != f[0], "an all-reduce in a kept buffer left its result on the device");
    par_dev_host_read(f, sizeof mine);
    TRY(check_f64(f, p, 0, M, "all-reduce f64, on the device"));
    TRY(par_allreduce(w, iv, iv, M, PAR_C_I64, PAR_OP_SUM));
    par_dev_host_read(iv, sizeof imine);
    for (int i = 0; i < M; i++)
        CHECK(iv[i] == isum(p, i), "all-reduce i64: element %d is %lld", i, (long long)iv[i]);
    mine[5] = me == 2 ? (double)NAN : mine[5]; /* max: a NaN wins */
    dev_fill(f, mine, sizeof mine);
    TRY(par_allreduce(w, f, f, M, PAR_C_F64, PAR_OP_MAX));
    par_dev_host_read(f, sizeof mine);
    CHECK(f[5] != f[5] && f[0] == 1e16, "all-reduce max: %g %g", f[5], f[0]);
    TRY(scatter_check(w, rs, blk));
    mine[5] = fval(me, 5);
    dev_fill(f, mine, sizeof mine);
    TRY(par_allreduce(w, f, host, M, PAR_C_F64, PAR_OP_SUM)); /* into host memory: summed on the host */
    TRY(check_f64(host, p, 0, M, "all-reduce f64 into host memory"));
    par_free(f);
    par_free(rs);
    par_free(blk);
    par_free(iv);
    return PAR_OK;
}

Test(devcomm, rank_order_sums_run_on_the_device)
{
    setenv("PARITY_GPU_EMULATE", "1", 1);
    cr_assert_eq(par_dev_init(PAR_DEV_GPU, 0), PAR_OK, "%s", par_last_error());
    const char *backends[] = {"threads", "fiber"};
    for (int k = 0; k < 2; k++) {
        const int p = 4;
        const int64_t es = (int64_t)sizeof(double), row = M / p * es;
        par_dev_stats a, b;
        par_dev_get_stats(&a);
        par_status st = run_world(backends[k], p, sums, NULL, 20.0);
        cr_assert_eq(st, PAR_OK, "%s x %d: %s", backends[k], p, par_last_error());
        par_dev_get_stats(&b);
        /* four all-reduces of M elements: p x p blocks in, p x (p - 1) blocks out (a rank's own
         * block is in place); the reduce-scatter's p x p rows of M; the last all-reduce's rows
         * (its output is host memory: its blocks out go on the host) */
        int64_t want = 3 * (int64_t)(p * p + p * (p - 1)) * row + (int64_t)(p * p) * M * es + (int64_t)(p * p) * row;
        cr_assert_eq(b.comm_d2d_bytes - a.comm_d2d_bytes, want, "%s: %lld bytes device to device, want %lld",
                     backends[k], (long long)(b.comm_d2d_bytes - a.comm_d2d_bytes), (long long)want);
        cr_assert_eq(b.comm_host_bytes - a.comm_host_bytes, (int64_t)(p * (p - 1)) * row,
                     "%s: %lld bytes on the host, want only the host-memory all-reduce's blocks out", backends[k],
                     (long long)(b.comm_host_bytes - a.comm_host_bytes));
    }
}

Test(devcomm, ranks_on_one_device_move_device_memory)
{
    setenv("PARITY_GPU_EMULATE", "1", 1);
    cr_assert_eq(par_dev_init(PAR_DEV_GPU, 0), PAR_OK, "%s", par_last_error());
    const char *backends[] = {"threads", "fiber"};
    for (int k = 0; k < 2; k++) {
        const int p = 4;
        par_dev_stats a, b;
        par_dev_get_stats(&a);
        par_status st = run_world(backends[k], p, body, NULL, 20.0);
        cr_assert_eq(st, PAR_OK, "%s x %d: %s", backends[k], p, par_last_error());
        par_dev_get_stats(&b);
        /* the kept allgather (p x p rows, own row included) and the ring's p messages */
        int64_t want = (int64_t)(p * p + p) * N * (int64_t)sizeof(double);
        cr_assert_eq(b.comm_d2d_bytes - a.comm_d2d_bytes, want, "%s: %lld bytes device to device, want %lld",
                     backends[k], (long long)(b.comm_d2d_bytes - a.comm_d2d_bytes), (long long)want);
        /* the allgather into host memory: p x p rows on the host */
        cr_assert_geq(b.comm_host_bytes - a.comm_host_bytes, (int64_t)(p * p) * N * (int64_t)sizeof(double),
                      "%s: host copies", backends[k]);
    }
}
