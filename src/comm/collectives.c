/* comm/collectives.c - every collective as one or two exchanges of bytes.
 *
 * All-reduce is a reduce-scatter followed by an all-gather: the count
 * elements are cut into p near-equal blocks, rank r receives block r of every
 * rank's input (one exchange), reduces the p rows in rank order 0..p-1 and
 * sends its reduced block to everyone (a second exchange).  The order of the
 * additions is fixed by the rank numbers alone, so the bits do not depend on
 * the backend or on timing.
 */
#include <string.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/device.h"

/* The most bytes of received rows an all-reduce holds at once (per rank):
 * its reduce-scatter goes in chunks past that. */
#define PAR__ROWS_CAP ((size_t)16 << 10)
#define PAR__ROWS_CHUNK_MIN 64

/* ---- the rank-order reduction ------------------------------------------- */

#if PAR_FAULT_COMM_REVERSE_SUM
/* Deliberate fault (meson -Dfault=comm_reverse_sum; docs/bitwise.md): rows summed in rank order
 * p-1..0, a valid but different order: the tolerance mode's sums move bits (the f64 policy still
 * passes), the bitwise mode's integer folds do not. */
#define ROW_AT(rows, j, p, n) ((rows) + ((p) - 1 - (j)) * (n))
#else
#define ROW_AT(rows, j, p, n) ((rows) + (j) * (n))
#endif

#define REDUCE_FLOAT(T)                                                                      \
    static void reduce_##T(T *out, const T *rows, size_t p, size_t n, par_redop op)         \
    {                                                                                        \
        memcpy(out, ROW_AT(rows, 0, p, n), n * sizeof(T));                                  \
        for (size_t j = 1; j < p; j++) {                                                     \
            const T *row = ROW_AT(rows, j, p, n);                                            \
            if (op == PAR_OP_SUM) {                                                          \
                for (size_t e = 0; e < n; e++)                                               \
                    out[e] = out[e] + row[e];                                                \
            } else {                                                                         \
                for (size_t e = 0; e < n; e++)                                               \
                    if (row[e] > out[e] || row[e] != row[e])                                 \
                        out[e] = row[e];                                                     \
            }                                                                                \
        }                                                                                    \
    }

/* Integer sums wrap: added as unsigned of the same width. */
#define REDUCE_INT(T, U)                                                                     \
    static void reduce_##T(T *out, const T *rows, size_t p, size_t n, par_redop op)         \
    {                                                                                        \
        memcpy(out, ROW_AT(rows, 0, p, n), n * sizeof(T));                                  \
        for (size_t j = 1; j < p; j++) {                                                     \
            const T *row = ROW_AT(rows, j, p, n);                                            \
            if (op == PAR_OP_SUM) {                                                          \
                for (size_t e = 0; e < n; e++)                                               \
                    out[e] = (T)((U)out[e] + (U)row[e]);                                     \
            } else {                                                                         \
                for (size_t e = 0; e < n; e++)                                               \
                    if (row[e] > out[e])                                                     \
                        out[e] = row[e];                                                     \
            }                                                                                \
        }                                                                                    \
    }

REDUCE_FLOAT(double)
REDUCE_FLOAT(float)
REDUCE_INT(int32_t, uint32_t)
REDUCE_INT(int64_t, uint64_t)
REDUCE_INT(uint8_t, uint8_t)

_Static_assert((int)PAR_C_F64 == (int)PAR_DEV_F64 && (int)PAR_C_F32 == (int)PAR_DEV_F32 &&
                   (int)PAR_C_I32 == (int)PAR_DEV_I32 && (int)PAR_C_I64 == (int)PAR_DEV_I64 &&
                   (int)PAR_C_BYTE == (int)PAR_DEV_U8,
               "par_ctype and the device's row kinds (core/device.h) agree");

/* out[e] = op over rows j = 0..p-1 of rows[j*n + e], in rank order: on the
 * device when the rows are there and out is a kept buffer (GPU mode,
 * core/device.h par_dev_reduce_rows: the same operations in the same order),
 * else here. */
static void reduce_rows(void *out, const void *rows, size_t p, size_t n, par_ctype t,
                        par_redop op)
{
    if (n == 0)
        return;
#if PAR_FAULT_COMM_REVERSE_SUM /* the fault's order is the host loop's alone */
    par_dev_host_read(rows, p * n * par_ctype_size(t));
    par_dev_host_set(out, n * par_ctype_size(t));
#else
    if (par_dev_reduce_rows(out, rows, p, n, (int)t, op == PAR_OP_MAX))
        return;
#endif
    switch (t) {
    case PAR_C_F64: reduce_double(out, rows, p, n, op); break;
    case PAR_C_F32: reduce_float(out, rows, p, n, op); break;
    case PAR_C_I32: reduce_int32_t(out, rows, p, n, op); break;
    case PAR_C_I64: reduce_int64_t(out, rows, p, n, op); break;
    default: reduce_uint8_t(out, rows, p, n, op); break;
    }
}

/* ---- common steps ------------------------------------------------------- */

static uint64_t hash_sizes(uint64_t h, const size_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (uint64_t)v[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Checks shared by all collectives; fills the meta and marks the call. */
static par_status begin(par_comm *c, par__op op, par_ctype t, uint64_t count, int redop, int root,
                        uint64_t shape, par__callmeta *m)
{
    const char *name = par__op_name(op);
    if (!c)
        return par_err(PAR_EINVAL, "%s: comm is NULL", name);
    par_status st = par__check_world(c, name);
    if (st != PAR_OK)
        return st;
    if (par_ctype_size(t) == 0)
        return par_err(PAR_EINVAL, "%s in group %s: invalid element type %d", name, c->name,
                       (int)t);
    if (redop >= PAR_OP_COUNT)
        return par_err(PAR_EINVAL, "%s in group %s: invalid reduction %d", name, c->name, redop);
    *m = (par__callmeta){.group_id = c->id, .seq = ++c->seq, .count = count, .shape = shape,
                         .op = op, .dtype = t, .redop = redop, .root = root, .rank = c->rank};
    par__call_enter(c, m, -1);
    return PAR_OK;
}

static par_status xchg(par_comm *c, par__callmeta *m, int phase, const par__xfer *x)
{
    static const par__xfer none; /* zeroed columns: no bytes */
    m->phase = phase;
    par__comm_account(c, m, x);
    par_status st = c->world->be->exchange(c, m, x ? x : &none);
    par__comm_settle(c, m, st);
    return st;
}

/* A further step of a phase the clock already charged (an all-reduce's
 * later chunks): the exchange alone, no clock event. */
static par_status xchg_more(par_comm *c, par__callmeta *m, int phase, const par__xfer *x)
{
    m->phase = phase;
    m->vclock = 0;
    m->vcost = 0;
    return c->world->be->exchange(c, m, x);
}

static par_status end(par_comm *c, par_status st)
{
    par__call_leave(c);
    return st;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    const char *x = a, *y = b;
    return na && nb && x < y + nb && y < x + na;
}

/* GPU mode: the rows a rank receives for its rank-order sum stay on the
 * device when its input is there and the backend copies through the
 * residency table (par_comm_dev_copies), so the exchange copies device to
 * device and the sum runs there (docs/gpu.md "Collectives on one device"). */
static void rows_keep(par_comm *c, void *rows, const void *in, size_t in_bytes)
{
#if !PAR_FAULT_COMM_REVERSE_SUM
    if (par_dev_gpu() && rows && c->world->be->dev_copies && par_dev_resident(in, in_bytes))
        par_dev_keep(rows);
#else
    (void)c, (void)rows, (void)in, (void)in_bytes;
#endif
}

/* Block r of count elements cut into p parts: the first count % p get one more. */
static size_t blk_count(size_t count, int p, int r)
{
    return count / (size_t)p + ((size_t)r < count % (size_t)p);
}

static size_t blk_off(size_t count, int p, int r)
{
    size_t q = count / (size_t)p, rem = count % (size_t)p;
    return (size_t)r * q + ((size_t)r < rem ? (size_t)r : rem);
}

/* The packed displacements of counts (running sums, elements): the one
 * per-peer table a v-collective allocates, and only when the caller gave
 * no displacements of its own (it holds the group-sized counts anyway). */
static par_status packed_displs(par_comm *c, const par__callmeta *m, const size_t *counts,
                                size_t **out)
{
    size_t *d = par_malloc((size_t)c->size * sizeof *d, PAR_TAG_COMM), run = 0;
    if (!d)
        return par_err(PAR_ENOMEM, "%s in group %s: no memory for %d displacements",
                       par__op_name((par__op)m->op), c->name, c->size);
    for (int j = 0; j < c->size; j++) {
        d[j] = run;
        run += counts[j];
    }
    *out = d;
    return PAR_OK;
}

#define NEED(ptr, n, what)                                                                   \
    do {                                                                                     \
        if (!(ptr) && (n) != 0)                                                              \
            return end(c, par_err(PAR_EINVAL, "%s in group %s: %s is NULL with %zu elements", \
                                  par__op_name((par__op)m.op), c->name, what, (size_t)(n)));  \
    } while (0)

/* ---- collectives -------------------------------------------------------- */

par_status par_barrier(par_comm *c)
{
    par__callmeta m;
    par_status st = begin(c, PAR__OP_BARRIER, PAR_C_BYTE, 0, -1, -1, 0, &m);
    if (st != PAR_OK)
        return st;
    return end(c, xchg(c, &m, 0, NULL));
}

/* Elements of each block per chunk of an all-reduce's reduce-scatter: the
 * whole block on groups of up to PAR__ROWS_CHUNK_MIN ranks (TP, CP, EP,
 * ETP: their rows are the rank's own count), else what fits the cap. */
static size_t rows_chunk(size_t count, int p, size_t es)
{
    size_t big = count / (size_t)p + (count % (size_t)p != 0);
    if (p <= PAR__ROWS_CHUNK_MIN)
        return big;
    size_t w = PAR__ROWS_CAP / ((size_t)p * es);
    return w < 1 ? 1 : w > big ? big : w;
}

size_t par_allreduce_rows(size_t count, int p, size_t es)
{
    return p < 1 || es == 0 ? 0 : (size_t)p * rows_chunk(count, p, es);
}

par_status par_allreduce(par_comm *c, const void *in, void *out, size_t count, par_ctype t,
                         par_redop op)
{
    par__callmeta m;
    par_status st = begin(c, PAR__OP_ALLREDUCE, t, count, op, -1, 0, &m);
    if (st != PAR_OK)
        return st;
    NEED(in, count, "in");
    NEED(out, count, "out");
    int p = c->size, me = c->rank;
    size_t es = par_ctype_size(t);
    size_t bc = blk_count(count, p, me), bo = blk_off(count, p, me);
    /* The reduce-scatter in chunks of w elements of every block, so that
     * the rows held at once stay near PAR__ROWS_CAP bytes whatever the count
     * (one chunk when they fit: the rows of the whole block). */
    size_t big = count / (size_t)p + (count % (size_t)p != 0), w = rows_chunk(count, p, es);
    size_t nw = big ? (big + w - 1) / w : 1, mine = bc < w ? bc : w;
#if PAR_FAULT_COMM_CHUNK_FLOOR
    /* Deliberate fault (meson -Dfault=comm_chunk_floor; tools/cells-fault-demo.sh): the chunk count
     * rounded down, so a block's partial last chunk is never reduced (groups over 64 ranks). */
    nw = big ? (big / w ? big / w : 1) : 1;
#endif
    char *rows = NULL;
    if (mine) {
        rows = par_malloc((size_t)p * mine * es, PAR_TAG_COMM);
        if (!rows)
            return end(c, par_err(PAR_ENOMEM, "allreduce in group %s: no memory for %d x %zu",
                                  c->name, p, mine));
    }
    rows_keep(c, rows, in, count * es);
    /* block j of the input to rank j; my block of every rank, in rank order */
    par__col boff = {.kind = PAR__COL_BLKOFF, .k = p, .a = count, .b = es};
    par__col blen = {.kind = PAR__COL_BLKLEN, .k = p, .a = count, .b = es};
    for (size_t k = 0; k < nw && st == PAR_OK; k++) {
        size_t d = k * w, n = bc > d ? (bc - d < w ? bc - d : w) : 0;
        par__col soff = boff, sbytes = blen;
        soff.d = sbytes.d = d;
        sbytes.w = w;
        par__xfer x1 = {in, soff, sbytes, rows, PAR__COL_S(n * es), PAR__COL_C(n * es), 1};
        /* the first chunk is the step the clock charges for the whole phase */
        st = k == 0 ? xchg(c, &m, 0, &x1) : xchg_more(c, &m, (int)(1 + k), &x1);
        if (st == PAR_OK)
            reduce_rows((char *)out + (bo + d) * es, rows, (size_t)p, n, t, op);
    }
    if (st == PAR_OK) {
        /* my reduced block to everyone, everyone's block in place */
        par__xfer x2 = {(char *)out + bo * es, {0}, PAR__COL_C(bc * es), out, boff, blen, 1};
        st = xchg(c, &m, 1, &x2);
    }
    par_free(rows);
    return end(c, st);
}

par_status par_reduce_scatter(par_comm *c, const void *in, void *out, size_t count, par_ctype t,
                              par_redop op)
{
    par__callmeta m;
    par_status st = begin(c, PAR__OP_REDUCE_SCATTER, t, count, op, -1, 0, &m);
    if (st != PAR_OK)
        return st;
    int p = c->size;
    NEED(in, count * (size_t)p, "in");
    NEED(out, count, "out");
    size_t es = par_ctype_size(t), bytes = count * es;
    char *rows = NULL;
    if (count) {
        rows = par_malloc((size_t)p * bytes, PAR_TAG_COMM);
        if (!rows)
            return end(c, par_err(PAR_ENOMEM, "reduce_scatter in group %s: no memory", c->name));
    }
    rows_keep(c, rows, in, count * (size_t)p * es);
    par__xfer x = {in, PAR__COL_S(bytes), PAR__COL_C(bytes), rows, PAR__COL_S(bytes),
                   PAR__COL_C(bytes), 1};
    st = xchg(c, &m, 0, &x);
    if (st == PAR_OK)
        reduce_rows(out, rows, (size_t)p, count, t, op);
    par_free(rows);
    return end(c, st);
}

/* Sends `in` (bytes) to every rank, rank j's landing at out + roff[j]; the
 * input is staged when it overlaps out anywhere but at this rank's own
 * landing place. */
static par_status gather_common(par_comm *c, par__callmeta *m, const void *in, size_t bytes,
                                void *out, par__col roff, par__col rbytes, size_t out_bytes)
{
    int me = c->rank;
    const char *src = in;
    char *staged = NULL;
    if (bytes && src != (char *)out + par__col_at(&roff, me) &&
        overlaps(in, bytes, out, out_bytes)) {
        staged = par_malloc(bytes, PAR_TAG_COMM);
        if (!staged)
            return par_err(PAR_ENOMEM, "%s in group %s: no memory to stage %zu bytes",
                           par__op_name((par__op)m->op), c->name, bytes);
        memcpy(staged, in, bytes);
        src = staged;
    }
    par__xfer x = {src, {0}, PAR__COL_C(bytes), out, roff, rbytes,
                   rbytes.kind != PAR__COL_ARRAY};
    par_status st = xchg(c, m, 0, &x);
    par_free(staged);
    return st;
}

par_status par_allgather(par_comm *c, const void *in, void *out, size_t count, par_ctype t)
{
    par__callmeta m;
    par_status st = begin(c, PAR__OP_ALLGATHER, t, count, -1, -1, 0, &m);
    if (st != PAR_OK)
        return st;
    int p = c->size;
    NEED(in, count, "in");
    NEED(out, count * (size_t)p, "out");
    size_t bytes = count * par_ctype_size(t);
    return end(c, gather_common(c, &m, in, bytes, out, PAR__COL_S(bytes), PAR__COL_C(bytes),
                                bytes * (size_t)p));
}

par_status par_allgatherv(par_comm *c, const void *in, size_t count, void *out,
                          const size_t *counts, const size_t *displs, par_ctype t)
{
    if (!c || !counts)
        return par_err(PAR_EINVAL, "allgatherv: comm and counts are required");
    int p = c->size;
    size_t total = 0, extent = 0;
    for (int j = 0; j < p; j++) {
        size_t d = displs ? displs[j] : total;
        total += counts[j];
        if (counts[j] && d + counts[j] > extent)
            extent = d + counts[j];
    }
    uint64_t shape = hash_sizes(0xcbf29ce484222325ull, counts, (size_t)p);
    par__callmeta m;
    par_status st = begin(c, PAR__OP_ALLGATHERV, t, total, -1, -1, shape, &m);
    if (st != PAR_OK)
        return st;
    if (count != counts[c->rank])
        return end(c, par_err(PAR_EINVAL, "allgatherv in group %s: rank %d sends %zu elements "
                                          "but counts[%d] = %zu",
                              c->name, c->rank, count, c->rank, counts[c->rank]));
    NEED(in, count, "in");
    NEED(out, extent, "out");
    size_t es = par_ctype_size(t), *packed = NULL;
    if (!displs && (st = packed_displs(c, &m, counts, &packed)) != PAR_OK)
        return end(c, st);
    par__col roff = {.kind = PAR__COL_ARRAY, .b = es, .v = displs ? displs : packed};
    par__col rbytes = {.kind = PAR__COL_ARRAY, .b = es, .v = counts};
    st = gather_common(c, &m, in, count * es, out, roff, rbytes, extent * es);
    par_free(packed);
    return end(c, st);
}

/* Extent in bytes of ranges displs[j], cnt[j] (NULL displs: packed). */
static size_t extent_of(const size_t *cnt, const size_t *displs, int p, size_t es)
{
    size_t run = 0, ext = 0;
    for (int j = 0; j < p; j++) {
        size_t off = (displs ? displs[j] : run) * es;
        run += cnt[j];
        if (cnt[j] && off + cnt[j] * es > ext)
            ext = off + cnt[j] * es;
    }
    return ext;
}

static par_status alltoall_common(par_comm *c, par__callmeta *m, const void *in, size_t in_ext,
                                  void *out, size_t out_ext, par__col soff, par__col sbytes,
                                  par__col roff, par__col rbytes)
{
    char *staged = NULL;
    const char *src = in;
    if (overlaps(in, in_ext, out, out_ext)) {
        staged = par_malloc(in_ext, PAR_TAG_COMM);
        if (!staged)
            return par_err(PAR_ENOMEM, "%s in group %s: no memory to stage %zu bytes",
                           par__op_name((par__op)m->op), c->name, in_ext);
        memcpy(staged, in, in_ext);
        src = staged;
    }
    par__xfer x = {src, soff, sbytes, out, roff, rbytes,
                   sbytes.kind != PAR__COL_ARRAY && rbytes.kind != PAR__COL_ARRAY};
    par_status st = xchg(c, m, 0, &x);
    par_free(staged);
    return st;
}

par_status par_alltoall(par_comm *c, const void *in, void *out, size_t count, par_ctype t)
{
    par__callmeta m;
    par_status st = begin(c, PAR__OP_ALLTOALL, t, count, -1, -1, 0, &m);
    if (st != PAR_OK)
        return st;
    int p = c->size;
    NEED(in, count * (size_t)p, "in");
    NEED(out, count * (size_t)p, "out");
    size_t bytes = count * par_ctype_size(t);
    par__col off = PAR__COL_S(bytes), n = PAR__COL_C(bytes);
    return end(c, alltoall_common(c, &m, in, bytes * (size_t)p, out, bytes * (size_t)p, off, n,
                                  off, n));
}

par_status par_alltoallv(par_comm *c, const void *in, const size_t *sendcounts,
                         const size_t *sdispls, void *out, const size_t *recvcounts,
                         const size_t *rdispls, par_ctype t)
{
    if (!c || !sendcounts || !recvcounts)
        return par_err(PAR_EINVAL, "alltoallv: comm, sendcounts and recvcounts are required");
    par__callmeta m;
    par_status st = begin(c, PAR__OP_ALLTOALLV, t, 0, -1, -1, 0, &m);
    if (st != PAR_OK)
        return st;
    int p = c->size;
    size_t es = par_ctype_size(t);
    size_t sext = extent_of(sendcounts, sdispls, p, es);
    size_t rext = extent_of(recvcounts, rdispls, p, es);
    NEED(in, sext, "in");
    NEED(out, rext, "out");
    size_t *spack = NULL, *rpack = NULL;
    if ((!sdispls && (st = packed_displs(c, &m, sendcounts, &spack)) != PAR_OK) ||
        (!rdispls && (st = packed_displs(c, &m, recvcounts, &rpack)) != PAR_OK)) {
        par_free(spack);
        return end(c, st);
    }
    par__col soff = {.kind = PAR__COL_ARRAY, .b = es, .v = sdispls ? sdispls : spack};
    par__col roff = {.kind = PAR__COL_ARRAY, .b = es, .v = rdispls ? rdispls : rpack};
    par__col sbytes = {.kind = PAR__COL_ARRAY, .b = es, .v = sendcounts};
    par__col rbytes = {.kind = PAR__COL_ARRAY, .b = es, .v = recvcounts};
    st = alltoall_common(c, &m, in, sext, out, rext, soff, sbytes, roff, rbytes);
    par_free(spack);
    par_free(rpack);
    return end(c, st);
}

par_status par_bcast(par_comm *c, void *buf, size_t count, par_ctype t, int root)
{
    par__callmeta m;
    par_status st = begin(c, PAR__OP_BCAST, t, count, -1, root, 0, &m);
    if (st != PAR_OK)
        return st;
    int p = c->size, me = c->rank;
    if (root < 0 || root >= p)
        return end(c, par_err(PAR_EINVAL, "bcast in group %s: root %d is not a rank of %d",
                              c->name, root, p));
    NEED(buf, count, "buf");
    size_t bytes = count * par_ctype_size(t);
    /* the root sends to every other rank; the others receive from the root */
    par__col sb = {0}, rb = {0};
    if (me == root)
        sb = (par__col){.kind = PAR__COL_BUT, .k = root, .a = bytes};
    else
        rb = PAR__COL_AT1(root, bytes);
    par__xfer x = {buf, {0}, sb, buf, {0}, rb, 1};
    return end(c, xchg(c, &m, 0, &x));
}
