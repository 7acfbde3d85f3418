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

/* ---- the rank-order reduction ------------------------------------------- */

#define REDUCE_FLOAT(T)                                                                      \
    static void reduce_##T(T *out, const T *rows, size_t p, size_t n, par_redop op)         \
    {                                                                                        \
        memcpy(out, rows, n * sizeof(T));                                                   \
        for (size_t j = 1; j < p; j++) {                                                     \
            const T *row = rows + j * n;                                                     \
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
        memcpy(out, rows, n * sizeof(T));                                                   \
        for (size_t j = 1; j < p; j++) {                                                     \
            const T *row = rows + j * n;                                                     \
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

/* out[e] = op over rows j = 0..p-1 of rows[j*n + e], in rank order. */
static void reduce_rows(void *out, const void *rows, size_t p, size_t n, par_ctype t,
                        par_redop op)
{
    if (n == 0)
        return;
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
    /* a barrier moves no bytes: no count arrays (32 p bytes on every rank) */
    if (op != PAR__OP_BARRIER && (st = par__scratch_take(c)) != PAR_OK)
        return st;
    *m = (par__callmeta){.group_id = c->id, .seq = ++c->seq, .count = count, .shape = shape,
                         .op = op, .dtype = t, .redop = redop, .root = root, .rank = c->rank};
    par__call_enter(c, m, -1);
    return PAR_OK;
}

static par_status xchg(par_comm *c, par__callmeta *m, int phase, const par__xfer *x)
{
    static const par__xfer none = {0};
    m->phase = phase;
    par__comm_account(c, m, x);
    par_status st = c->world->be->exchange(c, m, x ? x : &none);
    par__comm_settle(c, m, st);
    return st;
}

static par_status end(par_comm *c, par_status st)
{
    par__call_leave(c);
    par__scratch_drop(c);
    return st;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    const char *x = a, *y = b;
    return na && nb && x < y + nb && y < x + na;
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
    char *rows = NULL;
    if (bc) {
        rows = par_malloc((size_t)p * bc * es, PAR_TAG_COMM);
        if (!rows)
            return end(c, par_err(PAR_ENOMEM, "allreduce in group %s: no memory for %d x %zu",
                                  c->name, p, bc));
    }
    size_t *s1 = c->scratch, *s2 = s1 + p, *s3 = s2 + p, *s4 = s3 + p;
    for (int j = 0; j < p; j++) {
        s1[j] = blk_off(count, p, j) * es;   /* soff   */
        s2[j] = blk_count(count, p, j) * es; /* sbytes */
        s3[j] = (size_t)j * bc * es;         /* roff   */
        s4[j] = bc * es;                     /* rbytes */
    }
    par__xfer x1 = {in, s1, s2, rows, s3, s4};
    st = xchg(c, &m, 0, &x1);
    if (st == PAR_OK) {
        reduce_rows((char *)out + bo * es, rows, (size_t)p, bc, t, op);
        for (int j = 0; j < p; j++) {
            s3[j] = s1[j]; /* roff = block offsets    */
            s4[j] = s2[j]; /* rbytes = block sizes    */
            s1[j] = 0;     /* soff: my reduced block  */
            s2[j] = bc * es;
        }
        par__xfer x2 = {(char *)out + bo * es, s1, s2, out, s3, s4};
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
    size_t *soff = c->scratch, *n = soff + p, *roff = n + p;
    for (int j = 0; j < p; j++) {
        soff[j] = (size_t)j * bytes;
        roff[j] = (size_t)j * bytes;
        n[j] = bytes;
    }
    par__xfer x = {in, soff, n, rows, roff, n};
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
                                void *out, const size_t *roff, const size_t *rbytes,
                                size_t out_bytes)
{
    int p = c->size, me = c->rank;
    const char *src = in;
    char *staged = NULL;
    if (bytes && src != (char *)out + roff[me] && overlaps(in, bytes, out, out_bytes)) {
        staged = par_malloc(bytes, PAR_TAG_COMM);
        if (!staged)
            return par_err(PAR_ENOMEM, "%s in group %s: no memory to stage %zu bytes",
                           par__op_name((par__op)m->op), c->name, bytes);
        memcpy(staged, in, bytes);
        src = staged;
    }
    size_t *soff = c->scratch + 2 * (size_t)p, *sbytes = soff + p;
    for (int j = 0; j < p; j++) {
        soff[j] = 0;
        sbytes[j] = bytes;
    }
    par__xfer x = {src, soff, sbytes, out, roff, rbytes};
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
    size_t *roff = c->scratch, *rbytes = roff + p;
    for (int j = 0; j < p; j++) {
        roff[j] = (size_t)j * bytes;
        rbytes[j] = bytes;
    }
    return end(c, gather_common(c, &m, in, bytes, out, roff, rbytes, bytes * (size_t)p));
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
    size_t es = par_ctype_size(t);
    size_t *roff = c->scratch, *rbytes = roff + p, run = 0;
    for (int j = 0; j < p; j++) {
        roff[j] = (displs ? displs[j] : run) * es;
        rbytes[j] = counts[j] * es;
        run += counts[j];
    }
    return end(c, gather_common(c, &m, in, count * es, out, roff, rbytes, extent * es));
}

/* Extent in bytes of ranges off[j], n[j] (NULL off: packed). */
static size_t extent_of(const size_t *cnt, const size_t *displs, int p, size_t es, size_t *offs)
{
    size_t run = 0, ext = 0;
    for (int j = 0; j < p; j++) {
        offs[j] = (displs ? displs[j] : run) * es;
        run += cnt[j];
        if (cnt[j] && offs[j] + cnt[j] * es > ext)
            ext = offs[j] + cnt[j] * es;
    }
    return ext;
}

static par_status alltoall_common(par_comm *c, par__callmeta *m, const void *in, size_t in_ext,
                                  void *out, size_t out_ext, const size_t *soff,
                                  const size_t *sbytes, const size_t *roff, const size_t *rbytes)
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
    par__xfer x = {src, soff, sbytes, out, roff, rbytes};
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
    size_t *off = c->scratch, *n = off + p;
    for (int j = 0; j < p; j++) {
        off[j] = (size_t)j * bytes;
        n[j] = bytes;
    }
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
    size_t *soff = c->scratch, *sbytes = soff + p, *roff = sbytes + p, *rbytes = roff + p;
    size_t sext = extent_of(sendcounts, sdispls, p, es, soff);
    size_t rext = extent_of(recvcounts, rdispls, p, es, roff);
    for (int j = 0; j < p; j++) {
        sbytes[j] = sendcounts[j] * es;
        rbytes[j] = recvcounts[j] * es;
    }
    NEED(in, sext, "in");
    NEED(out, rext, "out");
    return end(c, alltoall_common(c, &m, in, sext, out, rext, soff, sbytes, roff, rbytes));
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
    size_t *off = c->scratch, *sb = off + p, *rb = sb + p;
    for (int j = 0; j < p; j++) {
        off[j] = 0;
        sb[j] = me == root && j != root ? bytes : 0;
        rb[j] = me != root && j == root ? bytes : 0;
    }
    par__xfer x = {buf, off, sb, buf, off, rb};
    return end(c, xchg(c, &m, 0, &x));
}
