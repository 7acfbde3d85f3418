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
 * buffers.  A backend that copied the host bytes would deliver NaN. */
#include <stdlib.h>

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
