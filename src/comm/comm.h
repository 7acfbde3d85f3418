/* comm/comm.h - the communicator of parity: worlds of ranks, groups,
 * collectives, point-to-point messages and their completion handles.
 *
 * A world is started with par_world_run(backend, nranks, fn, arg, opts); it
 * runs fn(world, arg) once on every rank and returns the first failing rank's
 * status.  Each rank holds its own par_comm handle per group it belongs to.
 *
 * Guarantees (every backend):
 * - Sums reduce in rank order 0..p-1 for every element:
 *   out[e] = ((in_0[e] + in_1[e]) + in_2[e]) + ...  The reduction runs in
 *   src/comm on top of the backend's byte exchange, so results are bitwise
 *   equal whatever the backend, layout of the data, or thread timing.
 * - Every collective carries (group, operation, sequence number, dtype,
 *   count, shape): ranks that disagree get PAR_EMISMATCH with a message that
 *   lists each rank's call, instead of a hang or corrupt memory.
 * - Every wait has a timeout (opts.timeout_s); past it the waiting rank
 *   reports what it waits for (and what the missing ranks are doing) and
 *   returns PAR_ETIMEOUT.  A rank whose fn returns an error stops the world:
 *   the other ranks' waits return PAR_ECOMM promptly.  After any failure the
 *   world is poisoned: every later comm call returns PAR_ECOMM (or
 *   PAR_ETIMEOUT when the first failure was a timeout).
 * - Collectives are blocking; the group's ranks must call them in the same
 *   order.  In-place use (in == out) is allowed for every collective, and any
 *   other overlap of in and out is handled too.
 * - par_send has synchronous semantics: it returns once the matching receive
 *   has taken the data (code correct here is correct under any MPI eager
 *   limit).  Messages between two ranks with one tag are not overtaken.
 *   Send and receive must agree on count and dtype (else PAR_EMISMATCH).
 */
#ifndef PAR_COMM_COMM_H
#define PAR_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

typedef struct par_comm par_comm;         /* one rank's handle on one group */
typedef struct par_request par_request;   /* a pending isend/irecv        */
typedef struct par_backend par_backend;   /* see comm/backend.h           */
typedef struct par_netrun par_netrun;     /* see comm/clock.h             */

/* Element types of messages.  Bytes reduce as unsigned 8-bit integers;
 * integer sums wrap (two's complement) instead of overflowing. */
typedef enum {
    PAR_C_F64 = 0,
    PAR_C_F32,
    PAR_C_I32,
    PAR_C_I64,
    PAR_C_BYTE,
    PAR_C_COUNT
} par_ctype;

typedef enum {
    PAR_OP_SUM = 0,
    PAR_OP_MAX,   /* NaN wins: a NaN in any rank gives NaN */
    PAR_OP_COUNT
} par_redop;

size_t par_ctype_size(par_ctype t);       /* 0 for an invalid type */
const char *par_ctype_name(par_ctype t);  /* "f64", ..., "bytes"   */
const char *par_redop_name(par_redop op); /* "sum", "max"          */
/* The comm type of a core tensor dtype; BF16 has none (send it as bytes). */
par_status par_ctype_of(par_dtype dt, par_ctype *out);

/* ---- worlds ----------------------------------------------------------- */

/* A backend's name ("self", "threads", ...); backends/registry.h finds
 * backends by name. */
const char *par_backend_name(const par_backend *b);

typedef par_status (*par_world_fn)(par_comm *world, void *arg);

typedef struct {
    /* Seconds any wait may last (0: PARITY_COMM_TIMEOUT from the
     * environment, else PAR_COMM_DEFAULT_TIMEOUT_S). */
    double timeout_s;
    /* Called on each rank's thread before fn, e.g. to call
     * openblas_set_num_threads(1) (comm does not link BLAS).  May be NULL. */
    void (*rank_init)(int rank, void *ud);
    void *rank_init_ud;
    /* Called on each rank's thread after fn returned, with rank_init_ud
     * (may be NULL). */
    void (*rank_fini)(int rank, void *ud);
    /* The emulated network (comm/clock.h): every rank gets a virtual clock
     * and its summary and spans land here.  NULL: no clocks.  Must have been
     * created for nranks ranks. */
    par_netrun *net;
    /* Backends that carry many ranks on a few threads (fiber; the others
     * ignore both): worker threads (0: PARITY_FIBER_WORKERS, else one per
     * online core, never more than the ranks) and the stack of each rank in
     * bytes (0: PARITY_FIBER_STACK, else 256 KiB; rounded up to pages). */
    int workers;
    size_t stack_bytes;
    /* Backends that host several ranks in one process (mpi, R ranks per
     * process): as OS threads or as fibers on a few worker threads (the fiber
     * backend's scheduler; workers and stack_bytes above apply, the workers
     * sharing the cores with the other processes of the host).
     * PAR_RANK_HOST_DEFAULT: PARITY_RANK_HOST=threads|fiber, else fibers above 64 ranks per
     * process, threads up to 64. */
    int rank_host;
    /* The run's whole configuration as "key=value" lines (NULL: none).
     * Backends whose ranks live in several processes (mpi) compare it at the
     * start and refuse to run when the processes disagree, naming the keys. */
    const char *fingerprint;
} par_world_opts;

enum { PAR_RANK_HOST_DEFAULT = 0, PAR_RANK_HOST_THREADS = 1, PAR_RANK_HOST_FIBER = 2 };

#define PAR_COMM_DEFAULT_TIMEOUT_S 120.0

/* Runs fn(world, arg) on every rank 0..nranks-1 of a new world on `backend`
 * and waits for all of them.  Each rank's thread carries the log tag
 * "rank R" while it runs (threads backend: the caller's thread is rank 0 and
 * has no tag afterwards).  Returns PAR_OK when every rank returned PAR_OK,
 * else the status of the first rank that failed (in time), with that rank's
 * message summarized in par_last_error().  Groups and requests a rank left
 * behind are released when it returns (pending requests are cancelled with a
 * warning).  opts may be NULL. */
par_status par_world_run(const par_backend *backend, int nranks, par_world_fn fn, void *arg,
                         const par_world_opts *opts);

/* ---- groups ----------------------------------------------------------- */

int par_comm_rank(const par_comm *c);
int par_comm_size(const par_comm *c);
/* World rank of group rank r (-1 when r is out of range). */
int par_comm_world_rank(const par_comm *c, int r);
/* The group's name for reports: "world", "world/s1c3" (split 1, color 3),
 * or what par_comm_set_name gave it (local to this rank's handle). */
const char *par_comm_name(const par_comm *c);
void par_comm_set_name(par_comm *c, const char *name);
/* 1 when c's backend copies between its ranks through the residency table
 * (core/device.h par_dev_comm_copy: threads, fiber), so that buffers kept on
 * the device stay there through a collective; 0 otherwise (and for NULL). */
int par_comm_dev_copies(const par_comm *c);

#define PAR_UNDEFINED (-1)

/* Collective over c, like MPI_Comm_split: ranks with the same color form a
 * group, ordered by key, ties broken by rank in c.  color PAR_UNDEFINED (or
 * any negative color) joins no group and gets *out = NULL. */
par_status par_comm_split(par_comm *c, int color, int key, par_comm **out);
/* Releases this rank's handle (not collective).  NULL and the world handle
 * (owned by par_world_run) are ignored. */
void par_comm_free(par_comm *c);

/* ---- collectives (blocking; every rank of the group calls them) -------- */

/* Elements of received rows the rank with the largest block holds at once
 * in par_allreduce of count elements of es bytes over p ranks: p x its
 * block, on groups over 64 ranks in chunks of the block past 16 KiB of rows
 * (for memory models). */
size_t par_allreduce_rows(size_t count, int p, size_t es);
/* out[i] = op over ranks of in[i], i < count. */
par_status par_allreduce(par_comm *c, const void *in, void *out, size_t count, par_ctype t,
                         par_redop op);
/* in holds size*count elements; rank r gets block r of the reduction. */
par_status par_reduce_scatter(par_comm *c, const void *in, void *out, size_t count, par_ctype t,
                              par_redop op);
/* out (size*count) = rank blocks in rank order. */
par_status par_allgather(par_comm *c, const void *in, void *out, size_t count, par_ctype t);
/* Rank r sends count == counts[r] elements, placed at out + displs[r]
 * elements on every rank; displs NULL means packed in rank order. */
par_status par_allgatherv(par_comm *c, const void *in, size_t count, void *out,
                          const size_t *counts, const size_t *displs, par_ctype t);
/* Block j (count elements) of in goes to rank j, arriving as block r. */
par_status par_alltoall(par_comm *c, const void *in, void *out, size_t count, par_ctype t);
/* Rank r sends sendcounts[j] elements at in + sdispls[j] to rank j, which
 * takes them as recvcounts[r] elements at out + rdispls[r]; the two counts
 * must agree.  NULL displs mean packed in rank order. */
par_status par_alltoallv(par_comm *c, const void *in, const size_t *sendcounts,
                         const size_t *sdispls, void *out, const size_t *recvcounts,
                         const size_t *rdispls, par_ctype t);
par_status par_bcast(par_comm *c, void *buf, size_t count, par_ctype t, int root);
par_status par_barrier(par_comm *c);

/* ---- point to point --------------------------------------------------- */

/* dst/src are ranks of c; tag >= 0.  Blocking send returns when the
 * receiver took the data. */
par_status par_send(par_comm *c, const void *buf, size_t count, par_ctype t, int dst, int tag);
par_status par_recv(par_comm *c, void *buf, size_t count, par_ctype t, int src, int tag);
/* The buffer stays in use until the request completes. */
par_status par_isend(par_comm *c, const void *buf, size_t count, par_ctype t, int dst, int tag,
                     par_request **req);
par_status par_irecv(par_comm *c, void *buf, size_t count, par_ctype t, int src, int tag,
                     par_request **req);
/* Waits for *req, releases it and sets *req = NULL (NULL *req: returns ok). */
par_status par_wait(par_request **req);
/* Waits for all; returns the first failure (all requests are released). */
par_status par_waitall(size_t n, par_request **reqs);
/* *done = 1 (and *req released, NULL) when complete, else 0.  A failed
 * request is released too and its status returned. */
par_status par_test(par_request **req, int *done);
/* par_test at the rank's virtual time (comm/clock.h), for releasing a send
 * early: *done = 1 (and *req released, NULL) only when complete and, on an
 * emulated network, complete by the rank's clock now: it then leaves the
 * clock as a par_wait here, or any later, would (the wait would not have
 * advanced it).  Else *done = 0 and the request stays as it was: it neither
 * waits, yields nor times out, and charges no compute to the clock.  A failed
 * request is released and its status returned, as par_test does. */
par_status par_test_due(par_request **req, int *done);

/* ---- ranks of one process --------------------------------------------- */

/* Waits until *word >= want, where word is memory of THIS process that
 * another rank hosted by the same process advances with
 * par_comm_store_local (the replicated state its ranks hold once,
 * parallel/dp/replicas.h).  The calling rank waits the way it waits in a
 * collective (a fiber rank parks and lets the others run; a thread spins,
 * yields, blocks) until that store wakes it: nothing polls the word
 * (comm/local.c).  It moves no bytes and leaves the virtual clock alone.
 * `what` names the wait in the error: PAR_ECOMM when the world failed
 * meanwhile, PAR_ETIMEOUT past the world's timeout (the world is marked
 * failed). */
par_status par_comm_wait_local(par_comm *c, const _Atomic int64_t *word, int64_t want, const char *what);
/* Stores value in *word and wakes the ranks of this process (of any world)
 * waiting on it in par_comm_wait_local. */
void par_comm_store_local(_Atomic int64_t *word, int64_t value);

#endif
