/* parallel/tp/tp_reduce.c - the communication of the tensor-parallel layers
 * (see parallel/tp/tp_reduce.h). */
#include "parallel/tp/tp_reduce.h"

#include <string.h>

#include "core/alloc.h"
#include "kernels/gemm.h"
#include "kernels/qcast.h"
#include "parallel/reduce/reduce_sum.h"

/* point-to-point tags of the TP group (distinct from CP's 61xx) */
enum { TAG_CHAIN = 6201, TAG_MUON_IN = 6202, TAG_MUON_OUT = 6203 };

static int multi(const par_tp *tp)
{
    return tp && tp->comm && par_comm_size(tp->comm) > 1;
}

#define TRAFFIC(tp, kind) ((tp) && (tp)->traffic ? &(tp)->traffic->kind : NULL)

static void add_bytes(int64_t *field, size_t bytes)
{
    if (field)
        *field += (int64_t)bytes;
}

par_status PAR_FN(par_tp_reduce_sum)(const par_tp *tp, par_real *buf, size_t n)
{
    if (!multi(tp) || n == 0)
        return PAR_OK;
    add_bytes(TRAFFIC(tp, allreduce), n * sizeof(par_real));
    const par_field f = PAR_FIELD(buf, n, PAR_TP_CREAL);
    return par_reduce_fields(tp->comm, &f, 1, NULL);
}

par_status PAR_FN(par_tp_reduce_sum_f64)(const par_tp *tp, double *buf, size_t n)
{
    if (!multi(tp) || n == 0)
        return PAR_OK;
    add_bytes(TRAFFIC(tp, allreduce), n * sizeof(double));
    const par_field f = PAR_FIELD(buf, n, PAR_C_F64);
    return par_reduce_fields(tp->comm, &f, 1, NULL);
}

par_status PAR_FN(par_tp_reduce_max_f64)(const par_tp *tp, double *buf, size_t n)
{
    if (!multi(tp) || n == 0)
        return PAR_OK;
    add_bytes(TRAFFIC(tp, allreduce), n * sizeof(double));
    return par_reduce_max_f64(tp->comm, buf, n);
}

par_status PAR_FN(par_tp_reduce_gather_tokens)(const par_tp *tp, par_real *full, const par_real *local,
                                         int64_t Tl, int64_t w)
{
    const size_t n = (size_t)(Tl * w);
    if (!multi(tp)) {
        if (full != local)
            memcpy(full, local, n * sizeof(par_real));
        return PAR_OK;
    }
    add_bytes(TRAFFIC(tp, allgather), n * sizeof(par_real));
    return par_allgather(tp->comm, local, full, n, PAR_TP_CREAL);
}

par_status PAR_FN(par_tp_reduce_gather_cols)(const par_tp *tp, int P, par_real *full, const par_real *local,
                                       int64_t rows, int64_t W, int64_t w, const char *what)
{
    const int64_t L = W / P, n = rows * L * w;
    par_real *all = par_malloc((size_t)(n * P + 1) * sizeof *all, PAR_TAG_ACT);
    if (!all)
        return par_err(PAR_ENOMEM, "%s (sp): out of memory for %lld rows", what, (long long)(rows * W));
    par_status s = PAR_FN(par_tp_reduce_gather_tokens)(tp, all, local, rows * L, w);
    for (int r = 0; r < P && !s; r++)
        for (int64_t i = 0; i < rows; i++)
            memcpy(full + (i * W + r * L) * w, all + r * n + i * L * w, (size_t)(L * w) * sizeof *all);
    par_free(all);
    return s;
}

void PAR_FN(par_tp_reduce_take_cols)(void *local, const void *full, int64_t rows, int64_t W, int64_t w, size_t es, int r,
                               int P)
{
    const int64_t L = W / P;
    for (int64_t i = 0; i < rows; i++)
        memcpy((char *)local + (size_t)(i * L * w) * es, (const char *)full + (size_t)((i * W + r * L) * w) * es,
               (size_t)(L * w) * es);
}

par_status PAR_FN(par_tp_reduce_gather_i32)(const par_tp *tp, int32_t *full, const int32_t *local, int64_t Tl)
{
    if (!multi(tp)) {
        if (full != local)
            memcpy(full, local, (size_t)Tl * sizeof(int32_t));
        return PAR_OK;
    }
    add_bytes(TRAFFIC(tp, allgather), (size_t)Tl * sizeof(int32_t));
    return par_allgather(tp->comm, local, full, (size_t)Tl, PAR_C_I32);
}

par_status PAR_FN(par_tp_reduce_scatter_tokens)(const par_tp *tp, par_real *local, const par_real *full,
                                          int64_t Tl, int64_t w)
{
    const size_t n = (size_t)(Tl * w);
    if (!multi(tp)) {
        if (full != local)
            memcpy(local, full, n * sizeof(par_real));
        return PAR_OK;
    }
    add_bytes(TRAFFIC(tp, reduce_scatter), n * (size_t)par_comm_size(tp->comm) * sizeof(par_real));
    const par_field f = PAR_FIELD(full, n * (size_t)par_comm_size(tp->comm), PAR_TP_CREAL);
    return par_reduce_fields(tp->comm, &f, 1, local);
}

par_status PAR_FN(par_tp_reduce_chain)(const par_tp *tp, par_real *buf, size_t n,
                                 void (*add)(void *ctx, par_real *buf), void *ctx)
{
    if (!multi(tp)) {
        add(ctx, buf);
        return PAR_OK;
    }
    const int r = par_comm_rank(tp->comm), P = par_comm_size(tp->comm);
    par_status st;
    if (r > 0 && (st = par_recv(tp->comm, buf, n, PAR_TP_CREAL, r - 1, TAG_CHAIN)))
        return st;
    add(ctx, buf);
    if (r + 1 < P) {
        add_bytes(TRAFFIC(tp, chain), n * sizeof(par_real));
        return par_send(tp->comm, buf, n, PAR_TP_CREAL, r + 1, TAG_CHAIN);
    }
    return PAR_OK;
}

par_status PAR_FN(par_tp_reduce_bcast_i32)(const par_tp *tp, int32_t *buf, size_t n, int root)
{
    if (!multi(tp) || n == 0)
        return PAR_OK;
    if (par_comm_rank(tp->comm) == root)
        add_bytes(TRAFFIC(tp, bcast), n * sizeof(int32_t));
    return par_bcast(tp->comm, buf, n, PAR_C_I32, root);
}

par_status PAR_FN(par_tp_reduce_row_counts)(const par_tp *tp, int64_t n, int64_t *counts)
{
    if (!multi(tp)) {
        counts[0] = n;
        return PAR_OK;
    }
    return par_allgather(tp->comm, &n, counts, 1, PAR_C_I64);
}

/* counts/displacements of a gather of rows of w elements */
static par_status row_layout(const par_tp *tp, const int64_t *counts, int64_t w, size_t **cnt)
{
    const int P = par_comm_size(tp->comm);
    size_t *c = par_malloc(2 * (size_t)P * sizeof(size_t), PAR_TAG_COMM);
    if (!c)
        return par_err(PAR_ENOMEM, "tensor parallel rows: %d counts", P);
    size_t run = 0;
    for (int q = 0; q < P; q++) {
        c[q] = (size_t)(counts[q] * w);
        c[P + q] = run;
        run += c[q];
    }
    *cnt = c;
    return PAR_OK;
}

par_status PAR_FN(par_tp_reduce_gather_rows)(const par_tp *tp, par_real *full, int32_t *full_ids,
                                       const par_real *rows, const int32_t *ids,
                                       const int64_t *counts, int64_t w)
{
    if (!multi(tp)) {
        memcpy(full, rows, (size_t)(counts[0] * w) * sizeof(par_real));
        if (ids)
            memcpy(full_ids, ids, (size_t)counts[0] * sizeof(int32_t));
        return PAR_OK;
    }
    const int r = par_comm_rank(tp->comm), P = par_comm_size(tp->comm);
    size_t *c = NULL;
    par_status st = row_layout(tp, counts, w, &c);
    if (st)
        return st;
    add_bytes(TRAFFIC(tp, allgather), c[r] * sizeof(par_real));
    st = par_allgatherv(tp->comm, rows, c[r], full, c, c + P, PAR_TP_CREAL);
    if (!st && ids) {
        par_free(c);
        if ((st = row_layout(tp, counts, 1, &c)))
            return st;
        add_bytes(TRAFFIC(tp, allgather), c[r] * sizeof(int32_t));
        st = par_allgatherv(tp->comm, ids, c[r], full_ids, c, c + P, PAR_C_I32);
    }
    par_free(c);
    return st;
}

par_status PAR_FN(par_tp_reduce_scatter_rows)(const par_tp *tp, par_real *rows, const par_real *full,
                                        const int64_t *counts, int64_t w)
{
    if (!multi(tp)) {
        memcpy(rows, full, (size_t)(counts[0] * w) * sizeof(par_real));
        return PAR_OK;
    }
    const int r = par_comm_rank(tp->comm), P = par_comm_size(tp->comm);
    int64_t nmax = 0, off = 0;
    for (int q = 0; q < P; q++)
        nmax = counts[q] > nmax ? counts[q] : nmax;
    const size_t blk = (size_t)(nmax * w);
    par_real *pad = par_calloc(blk * (size_t)(P + 1) + 1, sizeof(par_real), PAR_TAG_COMM);
    if (!pad)
        return par_err(PAR_ENOMEM, "tensor parallel rows: reduce-scatter of %d x %zu reals", P, blk);
    for (int q = 0; q < P; q++) {
        memcpy(pad + (size_t)q * blk, full + off * w, (size_t)(counts[q] * w) * sizeof(par_real));
        off += counts[q];
    }
    add_bytes(TRAFFIC(tp, reduce_scatter), blk * (size_t)P * sizeof(par_real));
    par_real *mine = pad + blk * (size_t)P;
    const par_field f = PAR_FIELD(pad, blk * (size_t)P, PAR_TP_CREAL);
    par_status st = blk ? par_reduce_fields(tp->comm, &f, 1, mine) : PAR_OK;
    if (!st)
        memcpy(rows, mine, (size_t)(counts[r] * w) * sizeof(par_real));
    par_free(pad);
    return st;
}

par_status PAR_FN(par_tp_reduce_to_owner)(const par_tp *tp, int owner, par_real *all,
                                    const par_real *mine, size_t n)
{
    if (!multi(tp)) {
        memcpy(all, mine, n * sizeof(par_real));
        return PAR_OK;
    }
    const int r = par_comm_rank(tp->comm), P = par_comm_size(tp->comm);
    if (r != owner) {
        add_bytes(TRAFFIC(tp, muon), n * sizeof(par_real));
        return par_send(tp->comm, mine, n, PAR_TP_CREAL, owner, TAG_MUON_IN);
    }
    memcpy(all + (size_t)r * n, mine, n * sizeof(par_real));
    for (int q = 0; q < P; q++) {
        par_status st;
        if (q != r && (st = par_recv(tp->comm, all + (size_t)q * n, n, PAR_TP_CREAL, q, TAG_MUON_IN)))
            return st;
    }
    return PAR_OK;
}

par_status PAR_FN(par_tp_reduce_from_owner)(const par_tp *tp, int owner, par_real *mine,
                                      const par_real *all, size_t n)
{
    if (!multi(tp)) {
        memcpy(mine, all, n * sizeof(par_real));
        return PAR_OK;
    }
    const int r = par_comm_rank(tp->comm), P = par_comm_size(tp->comm);
    if (r != owner)
        return par_recv(tp->comm, mine, n, PAR_TP_CREAL, owner, TAG_MUON_OUT);
    memcpy(mine, all + (size_t)r * n, n * sizeof(par_real));
    for (int q = 0; q < P; q++) {
        par_status st;
        if (q == r)
            continue;
        add_bytes(TRAFFIC(tp, muon), n * sizeof(par_real));
        if ((st = par_send(tp->comm, all + (size_t)q * n, n, PAR_TP_CREAL, q, TAG_MUON_OUT)))
            return st;
    }
    return PAR_OK;
}

/* The bitwise mode's chains: this rank's place in the chain, its
 * neighbours (-1: none). */
typedef struct {
    int pos, prev, next, last;
} chain_place;

static chain_place place_of(const par_tp *tp)
{
    const int r = par_tp_rank(tp), G = par_tp_size(tp);
#if PAR_FAULT_TP_CHAIN_REVERSE
    /* Deliberate fault (meson -Dfault=tp_chain_reverse; docs/bitwise.md): the
     * bitwise mode's split sums continued over the ranks in the order
     * P-1..0, a valid sum in another order: the bitwise policy names the
     * first tensor that moved, the f64 policy passes. */
    return (chain_place){G - 1 - r, r + 1 < G ? r + 1 : -1, r - 1, 0};
#else
    return (chain_place){r, r - 1, r + 1 < G ? r + 1 : -1, G - 1};
#endif
}

int PAR_FN(par_tp_chain_first)(const par_tp *tp)
{
    return !multi(tp) || place_of(tp).pos == 0;
}

par_status PAR_FN(par_tp_reduce_chain_bcast)(const par_tp *tp, par_real *buf, size_t n,
                                             void (*add)(void *ctx, par_real *buf), void *ctx)
{
    if (!multi(tp)) {
        add(ctx, buf);
        return PAR_OK;
    }
    const chain_place c = place_of(tp);
    par_status st;
    if (c.prev >= 0 && (st = par_recv(tp->comm, buf, n, PAR_TP_CREAL, c.prev, TAG_CHAIN)))
        return st;
    add(ctx, buf);
    if (c.next >= 0) {
        add_bytes(TRAFFIC(tp, chain), n * sizeof(par_real));
        if ((st = par_send(tp->comm, buf, n, PAR_TP_CREAL, c.next, TAG_CHAIN)))
            return st;
    }
    return PAR_FN(par_tp_reduce_bcast)(tp, buf, n, c.last);
}

par_status PAR_FN(par_tp_reduce_bcast)(const par_tp *tp, par_real *buf, size_t n, int root)
{
    if (!multi(tp) || n == 0)
        return PAR_OK;
    if (par_comm_rank(tp->comm) == root)
        add_bytes(TRAFFIC(tp, bcast), n * sizeof(par_real));
    return par_bcast(tp->comm, buf, n, PAR_TP_CREAL, root);
}

/* gemm_chain's step: this rank's K shard continues the chain. */
typedef struct {
    int ta, tb, load;
    int64_t M, N, K, lda, ldb;
    const par_real *A, *B;
} gemm_link;

static void gemm_link_add(void *ctx, par_real *P)
{
    const gemm_link *g = ctx;
    PAR_FN(par_gemm_part)(g->ta, g->tb, g->M, g->N, g->K, g->A, g->lda, g->B, g->ldb, g->load, P, g->N);
}

/* P [M, N] = the raw accumulators of op(A) op(B) over the whole K, each
 * rank continuing the chain with its K shard of Kl, the same on every rank. */
static par_status gemm_chain(const par_tp *tp, int ta, int tb, int64_t M, int64_t N, int64_t Kl, const par_real *A,
                             int64_t lda, const par_real *B, int64_t ldb, par_real *P)
{
    gemm_link g = {ta, tb, !PAR_FN(par_tp_chain_first)(tp), M, N, Kl, lda, ldb, A, B};
    return PAR_FN(par_tp_reduce_chain_bcast)(tp, P, (size_t)(M * N), gemm_link_add, &g);
}

par_status PAR_FN(par_tp_reduce_linear_forward)(const par_tp *tp, par_real *y, const par_real *in, const par_real *w,
                                                int64_t T, int64_t Kl, int64_t N)
{
    par_real *q = NULL; /* a recipe's casts, as par_linear_forward's */
    PAR_FN(par_qcast_operands)(&in, &w, &q, T, Kl, N);
    par_status st = gemm_chain(tp, 0, 1, T, N, Kl, in, Kl, w, Kl, y);
    par_qcast_release(q);
    if (!st)
        PAR_FN(par_gemm_finish)(T, N, 1, y, N, 0, y, N);
    return st;
}

par_status PAR_FN(par_tp_reduce_linear_din)(const par_tp *tp, par_real *din, const par_real *dout, const par_real *in,
                                            const par_real *w, int64_t T, int64_t K, int64_t Nl)
{
    par_real *P = par_malloc((size_t)(T * K + 1) * sizeof *P, PAR_TAG_ACT), *q = NULL;
    if (!P)
        return par_err(PAR_ENOMEM, "tensor parallel input gradient: %lld sums", (long long)(T * K));
    PAR_FN(par_qcast_operands)(&in, &w, &q, T, K, Nl); /* a recipe's casts, as par_linear_backward's */
    par_status st = gemm_chain(tp, 0, 0, T, K, Nl, dout, Nl, w, K, P);
    par_qcast_release(q);
    if (!st)
        PAR_FN(par_gemm_finish)(T, K, 1, P, K, 1, din, K);
    par_free(P);
    return st;
}

par_status PAR_FN(par_tp_reduce_chain_f64)(const par_tp *tp, double *buf, size_t n,
                                           void (*add)(void *ctx, double *buf), void *ctx)
{
    if (!multi(tp)) {
        add(ctx, buf);
        return PAR_OK;
    }
    const chain_place c = place_of(tp);
    par_status st;
    if (c.prev >= 0 && (st = par_recv(tp->comm, buf, n, PAR_C_F64, c.prev, TAG_CHAIN)))
        return st;
    add(ctx, buf);
    if (c.next >= 0) {
        add_bytes(TRAFFIC(tp, chain), n * sizeof(double));
        if ((st = par_send(tp->comm, buf, n, PAR_C_F64, c.next, TAG_CHAIN)))
            return st;
    }
    if (n && par_comm_rank(tp->comm) == c.last)
        add_bytes(TRAFFIC(tp, bcast), n * sizeof(double));
    return n ? par_bcast(tp->comm, buf, n, PAR_C_F64, c.last) : PAR_OK;
}
