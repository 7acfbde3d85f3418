/* parallel/ep.c - expert-parallel dispatch / combine, flat and hierarchical
 * (see parallel/ep.h, docs/parallel.md "The MoE executor hook"). */
#include "parallel/ep.h"

#include <stdlib.h>
#include <string.h>

#include "comm/clock.h"
#include "core/alloc.h"
#include "kernels/moe.h"
#include "parallel/reduce.h"

/* What one block keeps between its forward and backward.
 *
 * Flat: one exchange, sender -> owner (scnt / stk on the sender, rcnt on
 * the owner).  Hierarchical: stage 1 sender -> relay (records, one per
 * (token, relay)), stage 2 relay -> owner (one row per (token, expert));
 * rcnt / nrecv / rpos are the owner's side of stage 2 in both modes. */
typedef struct {
    int64_t T, nsend, nrecv;
    size_t *scnt, *rcnt;   /* [EP] rows to / from each EP rank (hier: stage 2) */
    int32_t *stk;          /* [nsend] flat: source slot t*K+k of each sent row (send order) */
    int32_t *rpos;         /* [nrecv] expert-major position of each received row */
    int64_t *eoff;         /* [El+1] first expert-major row of local expert l */
    par_real *xg, *rwg;    /* [nrecv, d], [nrecv] expert-major */
    par_real *g, *u, *h;   /* [nrecv, I] saved by the routed experts */
    par_real *sg, *su, *sh; /* [T, I] saved by the shared expert */
    /* hierarchical, sender side */
    int64_t n1s;           /* stage-1 records sent */
    size_t *h1cnt;         /* [EP] records to each relay */
    size_t *h1back;        /* [EP] (token, expert) rows each relay returns */
    int32_t *h1t;          /* [n1s] token index t of each record (send order) */
    int32_t *h1slot;       /* [nsend] slot t*K+k of each returned row (return order) */
    /* hierarchical, relay side */
    int64_t n1r, n2s;      /* records received, stage-2 rows sent */
    size_t *r1cnt, *r1back; /* [EP] records from / rows returned to each sender */
    int32_t *s2rec;        /* [n2s] received record of each stage-2 row (send order) */
    int32_t *s2pos;        /* [n2s] its position in the rows returned to the senders */
} blk_state;

struct PAR_FN(par_ep_s) {
    par_comm *c;
    int EP, me;
    int64_t E, El, e0;
    int n_blocks;
    int n_slots, slot;     /* sets of per-block state (pipeline microbatches), the current one */
    blk_state *blk;        /* [n_slots, n_blocks] */
    par_ep_dispatch mode;
    int gpn;               /* ranks per node */
    int *node;             /* [EP] node of each EP rank (world rank / gpn) */
    int *rel;              /* [EP, EP] rel[s*EP + j]: relay of sender s on the node of rank j */
    par_ep_counters cnt;
};

static void blk_free(blk_state *S)
{
    par_free(S->scnt);
    par_free(S->rcnt);
    par_free(S->stk);
    par_free(S->rpos);
    par_free(S->eoff);
    par_free(S->xg);
    par_free(S->rwg);
    par_free(S->g);
    par_free(S->u);
    par_free(S->h);
    par_free(S->sg);
    par_free(S->su);
    par_free(S->sh);
    par_free(S->h1cnt);
    par_free(S->h1back);
    par_free(S->h1t);
    par_free(S->h1slot);
    par_free(S->r1cnt);
    par_free(S->r1back);
    par_free(S->s2rec);
    par_free(S->s2pos);
    memset(S, 0, sizeof *S);
}

static void *xalloc(size_t n, size_t sz)
{
    return par_malloc((n ? n : 1) * sz, PAR_TAG_ACT);
}

static void *xcalloc(size_t n, size_t sz)
{
    return par_calloc(n ? n : 1, sz, PAR_TAG_ACT);
}

enum { PH_DISPATCH = 0, PH_COMBINE = 1 };

/* Counts the bytes this rank sends to OTHER ranks, by tier: counts[j] units
 * of `unit` bytes to EP rank j. */
static void count_bytes(struct PAR_FN(par_ep_s) *x, const size_t *counts, size_t unit, int phase)
{
    for (int j = 0; j < x->EP; j++) {
        if (j == x->me || !counts[j])
            continue;
        int64_t b = (int64_t)(counts[j] * unit);
        int ib = x->node[j] != x->node[x->me];
        if (phase == PH_DISPATCH)
            *(ib ? &x->cnt.dispatch_ib : &x->cnt.dispatch_nvlink) += b;
        else
            *(ib ? &x->cnt.combine_ib : &x->cnt.combine_nvlink) += b;
    }
}

/* all-to-all(v) of rows: send scnt[j] rows of `per` elements to rank j,
 * receive rcnt[j] rows from rank j (packed in rank order); counted. */
static par_status a2a_rows(struct PAR_FN(par_ep_s) *x, const void *in, const size_t *scnt, void *out,
                           const size_t *rcnt, size_t per, par_ctype t, int phase)
{
    int EP = x->EP;
    size_t *sc = par_malloc((size_t)EP * 2 * sizeof *sc, PAR_TAG_COMM);
    if (!sc)
        return par_err(PAR_ENOMEM, "ep: out of memory for %d counts", EP);
    size_t *rc = sc + EP;
    for (int j = 0; j < EP; j++) {
        sc[j] = scnt[j] * per;
        rc[j] = rcnt[j] * per;
    }
    par_status s = par_alltoallv(x->c, in, sc, NULL, out, rc, NULL, t);
    x->cnt.calls++;
    count_bytes(x, scnt, per * par_ctype_size(t), phase);
    par_free(sc);
    return s;
}

/* Counts exchange: send[j] to rank j where to[j], recv[j] from rank j where
 * from[j] (NULL: every pair); the others are 0. */
static par_status a2a_counts(struct PAR_FN(par_ep_s) *x, const size_t *send, const uint8_t *to, size_t *recv,
                             const uint8_t *from)
{
    int EP = x->EP;
    int64_t *buf = par_calloc((size_t)EP * 2, sizeof *buf, PAR_TAG_COMM);
    size_t *sc = par_calloc((size_t)EP * 2, sizeof *sc, PAR_TAG_COMM);
    par_status s = PAR_OK;
    if (!buf || !sc) {
        s = par_err(PAR_ENOMEM, "ep: out of memory for %d counts", EP);
        goto done;
    }
    int64_t n_to = 0;
    for (int j = 0; j < EP; j++) {
        if (!to || to[j])
            buf[n_to++] = (int64_t)send[j];
        sc[j] = !to || to[j];
        sc[EP + j] = !from || from[j];
    }
    /* every pair: the plain all-to-all (the flat path's exchange) */
    s = !to && !from ? par_alltoall(x->c, buf, buf + EP, 1, PAR_C_I64)
                     : par_alltoallv(x->c, buf, sc, NULL, buf + EP, sc + EP, NULL, PAR_C_I64);
    x->cnt.calls++;
    if (!s)
        for (int j = 0, q = 0; j < EP; j++)
            recv[j] = sc[EP + j] ? (size_t)buf[EP + q++] : 0;
done:
    par_free(buf);
    par_free(sc);
    return s;
}

/* ------------------------------------------------------------ dispatch -- */

/* Flat forward dispatch: rows (x, w) and ids (expert, token id, slot) to
 * the owners; out: *rbuf [NR, d+1], *rids [NR, 3] in received order. */
static par_status flat_dispatch(struct PAR_FN(par_ep_s) *x, blk_state *S, const par_real *x_in, const int32_t *idx,
                                const par_real *w, const int32_t *tokens, int64_t T, int K, int64_t d,
                                par_real **rbuf, int32_t **rids)
{
    const int EP = x->EP;
    const int64_t El = x->El, NS = T * K;
    par_status s = PAR_OK;
    par_real *sbuf = NULL;
    int32_t *sids = NULL;
    int64_t *cur = NULL;
    S->scnt = xcalloc((size_t)EP, sizeof *S->scnt);
    S->rcnt = xcalloc((size_t)EP, sizeof *S->rcnt);
    S->stk = xalloc((size_t)NS, sizeof *S->stk);
    cur = xalloc((size_t)EP + 1, sizeof *cur);
    if (!S->scnt || !S->rcnt || !S->stk || !cur)
        goto fail_oom;
    /* send order: owner ascending, then (t, k) ascending */
    for (int64_t i = 0; i < NS; i++)
        S->scnt[idx[i] / El]++;
    cur[0] = 0;
    for (int j = 0; j < EP; j++)
        cur[j + 1] = cur[j] + (int64_t)S->scnt[j];
    for (int64_t i = 0; i < NS; i++)
        S->stk[cur[idx[i] / El]++] = (int32_t)i;
    if ((s = a2a_counts(x, S->scnt, NULL, S->rcnt, NULL)))
        goto done;
    int64_t NR = 0;
    for (int j = 0; j < EP; j++)
        NR += (int64_t)S->rcnt[j];
    S->nrecv = NR;

    /* pack: reals (x row, routing weight), ints (expert, token id, source slot) */
    sbuf = xalloc((size_t)(NS * (d + 1)), sizeof *sbuf);
    sids = xalloc((size_t)(NS * 3), sizeof *sids);
    *rbuf = xalloc((size_t)(NR * (d + 1)), sizeof **rbuf);
    *rids = xalloc((size_t)(NR * 3), sizeof **rids);
    if (!sbuf || !sids || !*rbuf || !*rids)
        goto fail_oom;
    for (int64_t j = 0; j < NS; j++) {
        int64_t i = S->stk[j], t = i / K;
        memcpy(sbuf + j * (d + 1), x_in + t * d, (size_t)d * sizeof *sbuf);
        sbuf[j * (d + 1) + d] = w[i];
        sids[3 * j] = idx[i];
        sids[3 * j + 1] = tokens ? tokens[t] : -1;
        sids[3 * j + 2] = (int32_t)i;
    }
    if ((s = a2a_rows(x, sbuf, S->scnt, *rbuf, S->rcnt, (size_t)(d + 1), PAR_C_REAL, PH_DISPATCH)) ||
        (s = a2a_rows(x, sids, S->scnt, *rids, S->rcnt, 3, PAR_C_I32, PH_DISPATCH)))
        goto done;
    goto done;
fail_oom:
    s = par_err(PAR_ENOMEM, "ep: flat dispatch: out of memory (T=%lld)", (long long)T);
done:
    par_free(sbuf);
    par_free(sids);
    par_free(cur);
    return s;
}

/* Stage-1 record (bytes): int32 t, int32 m, int32 expert[m], real w[m],
 * real x[d]; the experts of the token that live on the relay's node, in
 * ascending k.  Stage-2 row (bytes): int32 source EP rank, int32 t, int32
 * expert, real w, real x[d]. */
static size_t rec1_bytes(int64_t m, int64_t d)
{
    return 8 + 4 * (size_t)m + sizeof(par_real) * (size_t)(m + d);
}

static size_t rec2_bytes(int64_t d)
{
    return 12 + sizeof(par_real) * (size_t)(d + 1);
}

/* Hierarchical forward dispatch; out as flat_dispatch, but *rids holds
 * (expert, source EP rank, t). */
static par_status hier_dispatch(struct PAR_FN(par_ep_s) *x, blk_state *S, const par_real *x_in, const int32_t *idx,
                                const par_real *w, int64_t T, int K, int64_t d, par_real **rbuf, int32_t **rids)
{
    const int EP = x->EP, me = x->me;
    const int64_t El = x->El, NS = T * K;
    const int *rel = x->rel + (size_t)me * (size_t)EP;
    const size_t R = sizeof(par_real), r2 = rec2_bytes(d);
    par_status s = PAR_OK;
    int64_t *stamp = NULL, *off = NULL;
    size_t *b1s = NULL, *b1r = NULL;
    uint8_t *to1 = NULL, *from1 = NULL, *same = NULL;
    unsigned char *sb1 = NULL, *rb1 = NULL, *sb2 = NULL, *rb2 = NULL;

    S->h1cnt = xcalloc((size_t)EP, sizeof *S->h1cnt);
    S->h1back = xcalloc((size_t)EP, sizeof *S->h1back);
    S->h1slot = xalloc((size_t)NS, sizeof *S->h1slot);
    S->r1cnt = xcalloc((size_t)EP, sizeof *S->r1cnt);
    S->r1back = xcalloc((size_t)EP, sizeof *S->r1back);
    S->scnt = xcalloc((size_t)EP, sizeof *S->scnt);
    S->rcnt = xcalloc((size_t)EP, sizeof *S->rcnt);
    stamp = xalloc((size_t)EP, sizeof *stamp);
    off = xalloc((size_t)EP + 1, sizeof *off);
    b1s = xcalloc((size_t)EP * 2, sizeof *b1s);
    to1 = xcalloc((size_t)EP * 3, 1);
    if (!S->h1cnt || !S->h1back || !S->h1slot || !S->r1cnt || !S->r1back || !S->scnt || !S->rcnt || !stamp ||
        !off || !b1s || !to1)
        goto fail_oom;
    b1r = b1s + EP;
    from1 = to1 + EP;
    same = to1 + 2 * EP;
    for (int j = 0; j < EP; j++) {
        to1[j] = rel[j] == j;                                  /* j is my relay on its node */
        from1[j] = x->rel[(size_t)j * (size_t)EP + (size_t)me] == me; /* I am j's relay here */
        same[j] = x->node[j] == x->node[me];
        stamp[j] = -1;
    }

    /* stage-1 records: relay ascending, then t ascending */
    int64_t n1 = 0;
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int r = rel[idx[t * K + k] / El];
            if (stamp[r] != t) {
                stamp[r] = t;
                S->h1cnt[r]++;
                n1++;
            }
        }
    S->n1s = n1;
    S->h1t = xalloc((size_t)n1, sizeof *S->h1t);
    if (!S->h1t)
        goto fail_oom;
    off[0] = 0;
    for (int j = 0; j < EP; j++) {
        off[j + 1] = off[j] + (int64_t)S->h1cnt[j];
        stamp[j] = -1;
    }
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int r = rel[idx[t * K + k] / El];
            if (stamp[r] != t) {
                stamp[r] = t;
                S->h1t[off[r]++] = (int32_t)t;
            }
        }
    /* record sizes, the return order of the (token, expert) rows */
    int64_t q = 0, ns = 0;
    size_t tot1 = 0;
    for (int r = 0; r < EP; r++)
        for (size_t u = 0; u < S->h1cnt[r]; u++, q++) {
            int64_t t = S->h1t[q], m = 0;
            for (int k = 0; k < K; k++)
                if (rel[idx[t * K + k] / El] == r) {
                    S->h1slot[ns++] = (int32_t)(t * K + k);
                    m++;
                }
            S->h1back[r] += (size_t)m;
            b1s[r] += rec1_bytes(m, d);
        }
    for (int r = 0; r < EP; r++)
        tot1 += b1s[r];
    if (ns != NS) {
        s = par_err(PAR_EINTERNAL, "ep: hierarchical dispatch covers %lld of %lld slots", (long long)ns,
                    (long long)NS);
        goto done;
    }
    sb1 = xalloc(tot1, 1);
    if (!sb1)
        goto fail_oom;
    unsigned char *p = sb1;
    q = 0;
    for (int r = 0; r < EP; r++)
        for (size_t u = 0; u < S->h1cnt[r]; u++, q++) {
            int32_t t = S->h1t[q], m = 0, ex[64];
            par_real wk[64];
            for (int k = 0; k < K; k++)
                if (rel[idx[t * K + k] / El] == r) {
                    ex[m] = idx[t * K + k];
                    wk[m++] = w[t * K + k];
                }
            memcpy(p, &t, 4);
            memcpy(p + 4, &m, 4);
            memcpy(p + 8, ex, 4 * (size_t)m);
            p += 8 + 4 * (size_t)m;
            memcpy(p, wk, R * (size_t)m);
            p += R * (size_t)m;
            memcpy(p, x_in + (int64_t)t * d, R * (size_t)d);
            p += R * (size_t)d;
        }

    /* stage 1: records to the relays (inter-node once per (token, node)) */
    if ((s = a2a_counts(x, b1s, to1, b1r, from1)))
        goto done;
    size_t tot1r = 0;
    for (int j = 0; j < EP; j++)
        tot1r += b1r[j];
    rb1 = xalloc(tot1r, 1);
    if (!rb1)
        goto fail_oom;
    if ((s = a2a_rows(x, sb1, b1s, rb1, b1r, 1, PAR_C_BYTE, PH_DISPATCH)))
        goto done;

    /* relay: parse, count the stage-2 rows per owner (all on this node) */
    int64_t n1r = 0, n2 = 0;
    p = rb1;
    for (int j = 0; j < EP; j++) {
        const unsigned char *e = p + b1r[j];
        while (p < e) {
            int32_t m;
            memcpy(&m, p + 4, 4);
            for (int32_t a = 0; a < m; a++) {
                int32_t ex;
                memcpy(&ex, p + 8 + 4 * (size_t)a, 4);
                int o = ex / (int)El;
                if (ex < 0 || ex >= x->E || !same[o]) {
                    s = par_err(PAR_EINTERNAL, "ep: relay %d got expert %d from rank %d: its owner is not on node %d",
                                me, (int)ex, j, x->node[me]);
                    goto done;
                }
                S->scnt[o]++;
            }
            S->r1cnt[j]++;
            S->r1back[j] += (size_t)m;
            n2 += m;
            n1r++;
            p += rec1_bytes(m, d);
        }
    }
    S->n1r = n1r;
    S->n2s = n2;
    S->s2rec = xalloc((size_t)n2, sizeof *S->s2rec);
    S->s2pos = xalloc((size_t)n2, sizeof *S->s2pos);
    sb2 = xalloc((size_t)n2 * r2, 1);
    if (!S->s2rec || !S->s2pos || !sb2)
        goto fail_oom;
    off[0] = 0;
    for (int j = 0; j < EP; j++)
        off[j + 1] = off[j] + (int64_t)S->scnt[j];
    p = rb1;
    int64_t rec = 0, pos = 0;
    for (int j = 0; j < EP; j++) {
        const unsigned char *e = p + b1r[j];
        while (p < e) {
            int32_t t, m;
            memcpy(&t, p, 4);
            memcpy(&m, p + 4, 4);
            const unsigned char *wp = p + 8 + 4 * (size_t)m, *xp = wp + R * (size_t)m;
            for (int32_t a = 0; a < m; a++, pos++) {
                int32_t ex, src = j;
                memcpy(&ex, p + 8 + 4 * (size_t)a, 4);
                int64_t o2 = off[ex / El]++;
                S->s2rec[o2] = (int32_t)rec;
                S->s2pos[o2] = (int32_t)pos;
                unsigned char *dst = sb2 + (size_t)o2 * r2;
                memcpy(dst, &src, 4);
                memcpy(dst + 4, &t, 4);
                memcpy(dst + 8, &ex, 4);
                memcpy(dst + 12, wp + R * (size_t)a, R);
                memcpy(dst + 12 + R, xp, R * (size_t)d);
            }
            rec++;
            p = (unsigned char *)xp + R * (size_t)d;
        }
    }

    /* stage 2: (token, expert) rows to the owners, inside the node */
    if ((s = a2a_counts(x, S->scnt, same, S->rcnt, same)))
        goto done;
    int64_t NR = 0;
    for (int j = 0; j < EP; j++)
        NR += (int64_t)S->rcnt[j];
    S->nrecv = NR;
    rb2 = xalloc((size_t)NR * r2, 1);
    *rbuf = xalloc((size_t)(NR * (d + 1)), sizeof **rbuf);
    *rids = xalloc((size_t)(NR * 3), sizeof **rids);
    if (!rb2 || !*rbuf || !*rids)
        goto fail_oom;
    if ((s = a2a_rows(x, sb2, S->scnt, rb2, S->rcnt, r2, PAR_C_BYTE, PH_DISPATCH)))
        goto done;
    for (int64_t r = 0; r < NR; r++) {
        const unsigned char *src = rb2 + (size_t)r * r2;
        int32_t v[3];
        memcpy(v, src, 12);
        (*rids)[3 * r] = v[2];     /* expert */
        (*rids)[3 * r + 1] = v[0]; /* source EP rank */
        (*rids)[3 * r + 2] = v[1]; /* t */
        memcpy(*rbuf + r * (d + 1), src + 12 + R, R * (size_t)d);
        memcpy(*rbuf + r * (d + 1) + d, src + 12, R);
    }
    goto done;

fail_oom:
    s = par_err(PAR_ENOMEM, "ep: hierarchical dispatch: out of memory (T=%lld)", (long long)T);
done:
    par_free(stamp);
    par_free(off);
    par_free(b1s);
    par_free(to1);
    par_free(sb1);
    par_free(rb1);
    par_free(sb2);
    par_free(rb2);
    return s;
}

/* Backward dispatch: dy[t] of every (token, expert) row to its owner; out
 * rows [nrecv, d] in the owner's received order. */
static par_status dispatch_dy(struct PAR_FN(par_ep_s) *x, blk_state *S, const par_real *dy, int K, int64_t d,
                              par_real *rows)
{
    par_status s;
    par_real *b1 = NULL, *b2 = NULL, *b3 = NULL;
    if (x->mode == PAR_EP_FLAT) {
        b1 = xalloc((size_t)(S->nsend * d), sizeof *b1);
        if (!b1)
            return par_err(PAR_ENOMEM, "ep: out of memory for %lld dy rows", (long long)S->nsend);
        for (int64_t j = 0; j < S->nsend; j++)
            memcpy(b1 + j * d, dy + (int64_t)(S->stk[j] / K) * d, (size_t)d * sizeof *b1);
        s = a2a_rows(x, b1, S->scnt, rows, S->rcnt, (size_t)d, PAR_C_REAL, PH_DISPATCH);
        par_free(b1);
        return s;
    }
    b1 = xalloc((size_t)(S->n1s * d), sizeof *b1);
    b2 = xalloc((size_t)(S->n1r * d), sizeof *b2);
    b3 = xalloc((size_t)(S->n2s * d), sizeof *b3);
    if (!b1 || !b2 || !b3) {
        s = par_err(PAR_ENOMEM, "ep: out of memory for %lld dy records", (long long)S->n1s);
        goto done;
    }
    for (int64_t u = 0; u < S->n1s; u++)
        memcpy(b1 + u * d, dy + (int64_t)S->h1t[u] * d, (size_t)d * sizeof *b1);
    if ((s = a2a_rows(x, b1, S->h1cnt, b2, S->r1cnt, (size_t)d, PAR_C_REAL, PH_DISPATCH)))
        goto done;
    for (int64_t j = 0; j < S->n2s; j++)
        memcpy(b3 + j * d, b2 + (int64_t)S->s2rec[j] * d, (size_t)d * sizeof *b3);
    s = a2a_rows(x, b3, S->scnt, rows, S->rcnt, (size_t)d, PAR_C_REAL, PH_DISPATCH);
done:
    par_free(b1);
    par_free(b2);
    par_free(b3);
    return s;
}

/* Combine direction: rows [nrecv, per] in the owner's received order back
 * to the token's rank, out[i * per] for slot i = t*K+k ([nsend, per]). */
static par_status return_rows(struct PAR_FN(par_ep_s) *x, blk_state *S, const par_real *rows, int64_t per,
                              par_real *out)
{
    par_status s;
    par_real *b1 = NULL, *b2 = NULL;
    int64_t NS = S->nsend;
    if (x->mode == PAR_EP_FLAT) {
        b1 = xalloc((size_t)(NS * per), sizeof *b1);
        if (!b1)
            return par_err(PAR_ENOMEM, "ep: out of memory for %lld returned rows", (long long)NS);
        if (!(s = a2a_rows(x, rows, S->rcnt, b1, S->scnt, (size_t)per, PAR_C_REAL, PH_COMBINE)))
            for (int64_t j = 0; j < NS; j++)
                memcpy(out + (int64_t)S->stk[j] * per, b1 + j * per, (size_t)per * sizeof *out);
        par_free(b1);
        return s;
    }
    b1 = xalloc((size_t)(S->n2s * per), sizeof *b1); /* back on the relay, stage-2 send order */
    b2 = xalloc((size_t)(S->n2s * per), sizeof *b2); /* the same rows in the senders' order */
    if (!b1 || !b2) {
        s = par_err(PAR_ENOMEM, "ep: out of memory for %lld returned rows", (long long)S->n2s);
        goto done;
    }
    if ((s = a2a_rows(x, rows, S->rcnt, b1, S->scnt, (size_t)per, PAR_C_REAL, PH_COMBINE)))
        goto done;
    for (int64_t j = 0; j < S->n2s; j++)
        memcpy(b2 + (int64_t)S->s2pos[j] * per, b1 + j * per, (size_t)per * sizeof *b2);
    par_free(b1);
    b1 = xalloc((size_t)(NS * per), sizeof *b1);
    if (!b1) {
        s = par_err(PAR_ENOMEM, "ep: out of memory for %lld returned rows", (long long)NS);
        goto done;
    }
    if ((s = a2a_rows(x, b2, S->r1back, b1, S->h1back, (size_t)per, PAR_C_REAL, PH_COMBINE)))
        goto done;
    for (int64_t j = 0; j < NS; j++)
        memcpy(out + (int64_t)S->h1slot[j] * per, b1 + j * per, (size_t)per * sizeof *out);
done:
    par_free(b1);
    par_free(b2);
    return s;
}

/* The owner's order of the hierarchical rows: (source EP rank, t), the flat
 * path's receive order for one expert. */
typedef struct {
    int32_t src, t, r;
} hkey;

static int hkey_cmp(const void *a, const void *b)
{
    const hkey *p = a, *q = b;
    if (p->src != q->src)
        return p->src < q->src ? -1 : 1;
    if (p->t != q->t)
        return p->t < q->t ? -1 : 1;
    return (p->r > q->r) - (p->r < q->r);
}

/* ------------------------------------------------------------- forward -- */

static par_status ep_fwd(void *ctx, PAR_FN(par_model) *M, int b, par_real *y, const par_real *x_in,
                         const int32_t *idx, const par_real *w, const int32_t *tokens, int64_t T)
{
    struct PAR_FN(par_ep_s) *x = ctx;
    blk_state *S = &x->blk[(size_t)x->slot * (size_t)x->n_blocks + (size_t)b];
    const int K = (int)M->K;
    const int64_t El = x->El, d = M->d, I = M->I, NS = T * K;
    const double L = M->cfg.swiglu_limit;
    const par_block_params *bp = &M->tab.blocks[b];
    par_status s = PAR_OK;
    par_real *rbuf = NULL, *yg = NULL, *slots = NULL, *ysh = NULL;
    int32_t *rids = NULL;
    int64_t *cur = NULL;
    hkey *ord = NULL;

    blk_free(S);
    S->T = T;
    S->nsend = NS;
    if (x->mode == PAR_EP_HIER && K > 64)
        return par_err(PAR_EUNSUPPORTED, "ep: hierarchical dispatch supports up to 64 experts per token (K = %d)", K);
    double t0 = par_comm_vclock(x->c);
    s = x->mode == PAR_EP_HIER ? hier_dispatch(x, S, x_in, idx, w, T, K, d, &rbuf, &rids)
                               : flat_dispatch(x, S, x_in, idx, w, tokens, T, K, d, &rbuf, &rids);
    if (s)
        goto done;
    x->cnt.dispatch_s += par_comm_vclock(x->c) - t0;
    const int64_t NR = S->nrecv;
    x->cnt.rows_sent += NS;
    x->cnt.rows_recv += NR;

    /* expert-major order of the received rows: per expert in (source rank,
     * t) order (flat: the received order already is) */
    cur = xalloc((size_t)El + 1, sizeof *cur);
    S->eoff = xcalloc((size_t)El + 1, sizeof *S->eoff);
    S->rpos = xalloc((size_t)NR, sizeof *S->rpos);
    S->xg = xalloc((size_t)(NR * d), sizeof *S->xg);
    S->rwg = xalloc((size_t)NR, sizeof *S->rwg);
    S->g = xalloc((size_t)(NR * I), sizeof *S->g);
    S->u = xalloc((size_t)(NR * I), sizeof *S->u);
    S->h = xalloc((size_t)(NR * I), sizeof *S->h);
    yg = xalloc((size_t)(NR * d), sizeof *yg);
    if (!cur || !S->eoff || !S->rpos || !S->xg || !S->rwg || !S->g || !S->u || !S->h || !yg)
        goto fail_oom;
    for (int64_t r = 0; r < NR; r++) {
        int64_t l = rids[3 * r] - x->e0;
        if (l < 0 || l >= El) {
            s = par_err(PAR_EINTERNAL, "ep: block %d: rank %d received a row for expert %d, it holds [%lld, %lld)",
                        b, x->me, (int)rids[3 * r], (long long)x->e0, (long long)(x->e0 + El));
            goto done;
        }
        S->eoff[l + 1]++;
    }
    for (int64_t l = 0; l < El; l++)
        S->eoff[l + 1] += S->eoff[l];
    memcpy(cur, S->eoff, (size_t)El * sizeof *cur);
    if (x->mode == PAR_EP_HIER) {
        ord = xalloc((size_t)NR, sizeof *ord);
        if (!ord)
            goto fail_oom;
        for (int64_t r = 0; r < NR; r++)
            ord[r] = (hkey){.src = rids[3 * r + 1], .t = rids[3 * r + 2], .r = (int32_t)r};
        qsort(ord, (size_t)NR, sizeof *ord, hkey_cmp);
    }
    for (int64_t q = 0; q < NR; q++) {
        int64_t r = ord ? ord[q].r : q;
        int64_t p = cur[rids[3 * r] - x->e0]++;
        S->rpos[r] = (int32_t)p;
        memcpy(S->xg + p * d, rbuf + r * (d + 1), (size_t)d * sizeof *S->xg);
        S->rwg[p] = rbuf[r * (d + 1) + d];
    }
    for (int64_t l = 0; l < El; l++) {
        int64_t o = S->eoff[l], n = S->eoff[l + 1] - o;
        size_t base = (size_t)b * 3 * (size_t)M->E + (size_t)(x->e0 + l);
        PAR_FN(par_moe_expert_forward)(yg + o * d, S->g + o * I, S->u + o * I, S->h + o * I, S->xg + o * d,
                                       S->rwg + o, M->ew[base], M->ew[base + (size_t)M->E],
                                       M->ew[base + 2 * (size_t)M->E], n, d, I, L);
    }

    /* outputs back in the order received (rbuf reused as [NR, d]), into slots */
    for (int64_t r = 0; r < NR; r++)
        memcpy(rbuf + r * d, yg + (int64_t)S->rpos[r] * d, (size_t)d * sizeof *rbuf);
    slots = xalloc((size_t)(NS * d), sizeof *slots);
    ysh = xalloc((size_t)(T * d), sizeof *ysh);
    if (!slots || !ysh)
        goto fail_oom;
    double t2 = par_comm_vclock(x->c);
    if ((s = return_rows(x, S, rbuf, d, slots)))
        goto done;
    x->cnt.combine_s += par_comm_vclock(x->c) - t2;

    /* the shared expert, the contract's per-token sum */
    const par_real *sw1 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1);
    const par_real *sw2 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2);
    const par_real *sw3 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3);
    int shared = sw1 && sw2 && sw3;
    if (shared) {
        S->sg = xalloc((size_t)(T * I), sizeof *S->sg);
        S->su = xalloc((size_t)(T * I), sizeof *S->su);
        S->sh = xalloc((size_t)(T * I), sizeof *S->sh);
        if (!S->sg || !S->su || !S->sh)
            goto fail_oom;
        PAR_FN(par_moe_expert_forward)(ysh, S->sg, S->su, S->sh, x_in, NULL, sw1, sw2, sw3, T, d, I, L);
    }
    PAR_FN(par_moe_combine)(y, slots, shared ? ysh : NULL, T, K, d, 0);
    s = PAR_OK;
    goto done;

fail_oom:
    s = par_err(PAR_ENOMEM, "ep: block %d forward: out of memory (T=%lld, %lld rows received)", b,
                (long long)T, (long long)S->nrecv);
done:
    par_free(rbuf);
    par_free(rids);
    par_free(yg);
    par_free(slots);
    par_free(ysh);
    par_free(cur);
    par_free(ord);
    return s;
}

/* ------------------------------------------------------------ backward -- */

static par_status ep_bwd(void *ctx, PAR_FN(par_model) *M, int b, par_real *dx, par_real *dw, const par_real *dy,
                         const par_real *x_in, const par_real *w, int64_t T)
{
    struct PAR_FN(par_ep_s) *x = ctx;
    blk_state *S = &x->blk[(size_t)x->slot * (size_t)x->n_blocks + (size_t)b];
    const int K = (int)M->K;
    const int64_t El = x->El, d = M->d, I = M->I, NS = S->nsend, NR = S->nrecv;
    const double L = M->cfg.swiglu_limit;
    const par_block_params *bp = &M->tab.blocks[b];
    par_status s = PAR_OK;
    par_real *rbuf = NULL, *dyg = NULL, *dxg = NULL, *back = NULL, *slots = NULL, *dxs = NULL;
    (void)w;

    if (S->T != T)
        return par_err(PAR_EINVAL, "ep: block %d backward for T=%lld tokens, its forward had %lld", b,
                       (long long)T, (long long)S->T);
    rbuf = xalloc((size_t)(NR * (d + 1)), sizeof *rbuf);
    dyg = xalloc((size_t)(NR * d), sizeof *dyg);
    dxg = xcalloc((size_t)(NR * (d + 1)), sizeof *dxg);
    back = xalloc((size_t)(NS * (d + 1)), sizeof *back);
    if (!rbuf || !dyg || !dxg || !back)
        goto fail_oom;
    par_real *drwg = dxg + NR * d;

    /* dy rows to the owners (the slot output's gradient is dy[t]) */
    double t0 = par_comm_vclock(x->c);
    if ((s = dispatch_dy(x, S, dy, K, d, rbuf)))
        goto done;
    x->cnt.dispatch_s += par_comm_vclock(x->c) - t0;
    for (int64_t r = 0; r < NR; r++)
        memcpy(dyg + (int64_t)S->rpos[r] * d, rbuf + r * d, (size_t)d * sizeof *dyg);

    /* the held experts, ascending; weight gradients into the local buffer */
    for (int64_t l = 0; l < El; l++) {
        int64_t o = S->eoff[l], n = S->eoff[l + 1] - o;
        size_t base = (size_t)b * 3 * (size_t)M->E + (size_t)(x->e0 + l), E = (size_t)M->E;
        s = PAR_FN(par_moe_expert_backward)(dxg + o * d, M->egw[base], M->egw[base + E], M->egw[base + 2 * E],
                                            drwg + o, dyg + o * d, S->xg + o * d, S->rwg + o, M->ew[base],
                                            M->ew[base + E], M->ew[base + 2 * E], S->g + o * I, S->u + o * I,
                                            S->h + o * I, n, d, I, L);
        if (s)
            goto done;
    }

    /* (dx, d rw) rows back in the order received, into slot order */
    for (int64_t r = 0; r < NR; r++) {
        int64_t p = S->rpos[r];
        memcpy(rbuf + r * (d + 1), dxg + p * d, (size_t)d * sizeof *rbuf);
        rbuf[r * (d + 1) + d] = drwg[p];
    }
    double t2 = par_comm_vclock(x->c);
    if ((s = return_rows(x, S, rbuf, d + 1, back)))
        goto done;
    x->cnt.combine_s += par_comm_vclock(x->c) - t2;

    /* the shared expert, then the serial backward's combine */
    const par_real *sw1 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1);
    const par_real *sw2 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2);
    const par_real *sw3 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3);
    int shared = sw1 && sw2 && sw3;
    slots = xalloc((size_t)(NS * d), sizeof *slots);
    dxs = xcalloc((size_t)(T * d), sizeof *dxs);
    if (!slots || !dxs)
        goto fail_oom;
    if (shared) {
        s = PAR_FN(par_moe_expert_backward)(dxs, PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w1),
                                            PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w2),
                                            PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w3), NULL, dy, x_in,
                                            NULL, sw1, sw2, sw3, S->sg, S->su, S->sh, T, d, I, L);
        if (s)
            goto done;
    }
    for (int64_t i = 0; i < NS; i++)
        memcpy(slots + i * d, back + i * (d + 1), (size_t)d * sizeof *slots);
    if (dx)
        PAR_FN(par_moe_combine)(dx, slots, shared ? dxs : NULL, T, K, d, 1);
    if (dw)
        for (int64_t i = 0; i < NS; i++)
            dw[i] += back[i * (d + 1) + d];
    s = PAR_OK;
    goto done;

fail_oom:
    s = par_err(PAR_ENOMEM, "ep: block %d backward: out of memory (T=%lld, %lld rows received)", b,
                (long long)T, (long long)NR);
done:
    par_free(rbuf);
    par_free(dyg);
    par_free(dxg);
    par_free(back);
    par_free(slots);
    par_free(dxs);
    return s;
}

/* ----------------------------------------------------------- lifecycle -- */

/* node[j] = world rank / gpn; rel[s*EP + j] = the EP rank on j's node with
 * s's local index modulo that node's EP ranks (s itself on s's node). */
static par_status build_nodes(struct PAR_FN(par_ep_s) *x, int gpn)
{
    int EP = x->EP;
    int *node = par_malloc((size_t)EP * sizeof *node, PAR_TAG_MODEL);
    int *rel = par_malloc((size_t)EP * (size_t)EP * sizeof *rel, PAR_TAG_MODEL);
    int *loc = par_malloc((size_t)EP * 2 * sizeof *loc, PAR_TAG_MODEL);
    if (!node || !rel || !loc) {
        par_free(node);
        par_free(rel);
        par_free(loc);
        return par_err(PAR_ENOMEM, "ep: out of memory for the node map of %d ranks", EP);
    }
    int *nsz = loc + EP; /* EP ranks on the node of rank j */
    for (int j = 0; j < EP; j++)
        node[j] = par_comm_world_rank(x->c, j) / gpn;
    for (int j = 0; j < EP; j++) {
        loc[j] = 0;
        nsz[j] = 0;
        for (int i = 0; i < EP; i++)
            if (node[i] == node[j]) {
                loc[j] += i < j;
                nsz[j]++;
            }
    }
    for (int s = 0; s < EP; s++)
        for (int j = 0; j < EP; j++) {
            int want = node[j] == node[s] ? -1 : loc[s] % nsz[j], r = s;
            for (int i = 0, n = 0; want >= 0 && i < EP; i++)
                if (node[i] == node[j] && n++ == want) {
                    r = i;
                    break;
                }
            rel[(size_t)s * (size_t)EP + (size_t)j] = r;
        }
    par_free(loc);
    par_free(x->node);
    par_free(x->rel);
    x->node = node;
    x->rel = rel;
    x->gpn = gpn;
    return PAR_OK;
}

par_status PAR_FN(par_ep_create)(PAR_FN(par_ep) **out, par_comm *ep, PAR_FN(par_model) *M)
{
    *out = NULL;
    int EP = par_comm_size(ep), me = par_comm_rank(ep);
    if (EP < 1 || M->E % EP != 0)
        return par_err(PAR_EINVAL, "ep: expert-model-parallel-size %d does not divide n_routed_experts %lld", EP,
                       (long long)M->E);
    int64_t El = M->E / EP;
    if (M->e0 != me * El || M->e1 != (me + 1) * El)
        return par_err(PAR_EINVAL,
                       "ep: EP rank %d of %d must hold experts [%lld, %lld), the model holds [%lld, %lld)", me, EP,
                       (long long)(me * El), (long long)((me + 1) * El), (long long)M->e0, (long long)M->e1);
    struct PAR_FN(par_ep_s) *x = par_calloc(1, sizeof *x, PAR_TAG_MODEL);
    if (!x)
        return par_err(PAR_ENOMEM, "ep: out of memory");
    x->c = ep;
    x->EP = EP;
    x->me = me;
    x->E = M->E;
    x->El = El;
    x->e0 = M->e0;
    x->n_blocks = M->n_blocks;
    x->n_slots = 1;
    x->mode = PAR_EP_FLAT;
    x->blk = par_calloc((size_t)M->n_blocks, sizeof *x->blk, PAR_TAG_MODEL);
    par_status s = x->blk ? build_nodes(x, 8) : par_err(PAR_ENOMEM, "ep: out of memory");
    if (s) {
        PAR_FN(par_ep_free)(x);
        return s;
    }
    *out = x;
    return PAR_OK;
}

void PAR_FN(par_ep_install)(PAR_FN(par_ep) *x, PAR_FN(par_model) *M)
{
    M->moe.fwd = ep_fwd;
    M->moe.bwd = ep_bwd;
    M->moe.ctx = x;
}

par_status PAR_FN(par_ep_set_dispatch)(PAR_FN(par_ep) *x, par_ep_dispatch mode, int gpus_per_node)
{
    if (mode != PAR_EP_FLAT && mode != PAR_EP_HIER)
        return par_err(PAR_EINVAL, "ep: dispatch mode must be flat (0) or hierarchical (1), got %d", (int)mode);
    if (gpus_per_node < 1)
        return par_err(PAR_EINVAL, "ep: gpus per node must be >= 1 (got %d)", gpus_per_node);
    par_status s = build_nodes(x, gpus_per_node);
    if (s)
        return s;
    for (int i = 0; i < x->n_slots * x->n_blocks; i++)
        blk_free(&x->blk[i]);
    x->mode = mode;
    return PAR_OK;
}

par_status PAR_FN(par_ep_set_slots)(PAR_FN(par_ep) *x, int n)
{
    if (n < 1)
        return par_err(PAR_EINVAL, "ep: the number of state slots must be >= 1 (got %d)", n);
    blk_state *nb = par_calloc((size_t)n * (size_t)x->n_blocks, sizeof *nb, PAR_TAG_MODEL);
    if (!nb)
        return par_err(PAR_ENOMEM, "ep: out of memory for %d state slots", n);
    for (int i = 0; i < x->n_slots * x->n_blocks; i++)
        blk_free(&x->blk[i]);
    par_free(x->blk);
    x->blk = nb;
    x->n_slots = n;
    x->slot = 0;
    return PAR_OK;
}

void PAR_FN(par_ep_select_slot)(PAR_FN(par_ep) *x, int slot)
{
    if (x && slot >= 0 && slot < x->n_slots)
        x->slot = slot;
}

void PAR_FN(par_ep_counters_get)(const PAR_FN(par_ep) *x, par_ep_counters *out)
{
    if (!x) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = x->cnt;
    out->dispatch_bytes = out->dispatch_nvlink + out->dispatch_ib;
    out->combine_bytes = out->combine_nvlink + out->combine_ib;
}

void PAR_FN(par_ep_free)(PAR_FN(par_ep) *x)
{
    if (!x)
        return;
    for (int b = 0; x->blk && b < x->n_slots * x->n_blocks; b++)
        blk_free(&x->blk[b]);
    par_free(x->blk);
    par_free(x->node);
    par_free(x->rel);
    par_free(x);
}
