/* parallel/moe/ep_dispatch.c - the expert-parallel transport: counts, the flat
 * and the hierarchical (node-aware) dispatch, the dy dispatch and the
 * combine direction (see parallel/moe/ep.h, parallel/moe/ep-impl.h). */
#include <string.h>

#include "comm/clock.h"
#include "core/alloc.h"
#include "parallel/moe/ep-impl.h"
#include "parallel/reduce/reduce.h"

enum { PH_DISPATCH = 0, PH_COMBINE = 1 };

void PAR_FN(par__ep_blk_free)(blk_state *S)
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
    PAR_FN(par_tp_mlp_saved_free)(&S->shs);
    PAR_FN(par_tp_mlp_shard_free)(&S->shw);
    par_free(S->h1cnt);
    par_free(S->h1back);
    par_free(S->h1t);
    par_free(S->h1slot);
    par_free(S->r1cnt);
    par_free(S->r1back);
    par_free(S->s2rec);
    par_free(S->s2pos);
    par_free(S->dyg);
    par_free(S->esw);
    par_free(S->esg);
    par_free(S->ew2);
    PAR_FN(par_etp_rows_saved_free)(&S->ers);
    par_free(S->wdup);
    memset(S, 0, sizeof *S);
}

void PAR_FN(par__ep_blk_drop)(blk_state **sp)
{
    if (*sp)
        PAR_FN(par__ep_blk_free)(*sp);
    par_free(*sp);
    *sp = NULL;
}

void PAR_FN(par__ep_blk_drop_all)(ep_t *x)
{
    for (int i = 0; x->blk && i < x->n_slots * x->n_rows; i++)
        PAR_FN(par__ep_blk_drop)(&x->blk[i]);
}

/* Counts the bytes this rank sends to OTHER ranks, by tier: counts[j] units
 * of `unit` bytes to EP rank j. */
static void count_bytes(ep_t *x, const size_t *counts, double unit, int phase)
{
    for (int j = 0; j < x->EP; j++) {
        if (j == x->me || !counts[j])
            continue;
        int64_t b = (int64_t)((double)counts[j] * unit + 0.5);
        int ib = x->node[j] != x->node[x->me];
        if (phase == PH_DISPATCH)
            *(ib ? &x->cnt.dispatch_ib : &x->cnt.dispatch_nvlink) += b;
        else
            *(ib ? &x->cnt.combine_ib : &x->cnt.combine_nvlink) += b;
    }
}

/* --cost-as: the next all-to-all of rows costs the target's: scnt[j] /
 * rcnt[j] rows of `unit` bytes, the block's blk_mul times over (unit 0:
 * the ids and counts, noise at the target's width, cost nothing). */
static par_status cost_rows(ep_t *x, const size_t *scnt, const size_t *rcnt, double unit)
{
    int EP = x->EP;
    size_t *b = par_malloc((size_t)EP * 2 * sizeof *b, PAR_TAG_COMM);
    if (!b)
        return par_err(PAR_ENOMEM, "ep: out of memory for %d counts", EP);
    for (int j = 0; j < EP; j++) {
        b[j] = scnt ? (size_t)((double)scnt[j] * unit + 0.5) : 0;
        b[EP + j] = rcnt ? (size_t)((double)rcnt[j] * unit + 0.5) : 0;
    }
    par_status s = par_comm_cost_next(x->c, b, b + EP, x->ca->blk_mul[x->cur_b]);
    par_free(b);
    return s;
}

/* all-to-all(v) of rows: send scnt[j] rows of `per` elements to rank j,
 * receive rcnt[j] rows from rank j (packed in rank order); counted (with
 * --cost-as: charged and counted as the target's rows). */
static par_status a2a_rows(ep_t *x, const void *in, const size_t *scnt, void *out,
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
    double unit = (double)(per * par_ctype_size(t));
    par_status s = PAR_OK;
    if (x->ca) {
        unit = t == PAR_C_REAL ? x->ca->row_mul * x->ca->row_bytes : 0;
        s = cost_rows(x, scnt, rcnt, unit);
        unit *= x->ca->blk_mul[x->cur_b];
    }
    if (!s)
        s = par_alltoallv(x->c, in, sc, NULL, out, rc, NULL, t);
    x->cnt.calls++;
    count_bytes(x, scnt, unit, phase);
    par_free(sc);
    return s;
}

/* Counts exchange: send[j] to rank j where to[j], recv[j] from rank j where
 * from[j] (NULL: every pair); the others are 0. */
static par_status a2a_counts(ep_t *x, const size_t *send, const uint8_t *to, size_t *recv,
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
    if (x->ca && (s = par_comm_cost_next(x->c, NULL, NULL, 0)))
        goto done;
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
 * the owners (ep-impl.h). */
par_status PAR_FN(par__ep_flat_dispatch)(ep_t *x, blk_state *S, const par_real *x_in, const int32_t *idx,
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

/* ------------------------------------------------------ hierarchical -- */

/* The temporaries of one hierarchical dispatch. */
typedef struct {
    const int *rel;                 /* [EP] my relay on the node of each EP rank */
    uint8_t *to1, *from1, *same;    /* [EP] j is my relay / I am j's relay / j on my node */
    size_t *b1s, *b1r;              /* [EP] stage-1 bytes to / from each rank */
    int64_t *stamp, *off;           /* [EP], [EP+1] */
    unsigned char *sb1, *rb1, *sb2, *rb2;
} hier_tmp;

static void hier_tmp_free(hier_tmp *h)
{
    par_free(h->to1);
    par_free(h->b1s);
    par_free(h->stamp);
    par_free(h->off);
    par_free(h->sb1);
    par_free(h->rb1);
    par_free(h->sb2);
    par_free(h->rb2);
}

static par_status hier_alloc(ep_t *x, blk_state *S, hier_tmp *h, int64_t NS)
{
    const int EP = x->EP, me = x->me;
    memset(h, 0, sizeof *h);
    h->rel = x->rel;
    S->h1cnt = xcalloc((size_t)EP, sizeof *S->h1cnt);
    S->h1back = xcalloc((size_t)EP, sizeof *S->h1back);
    S->h1slot = xalloc((size_t)NS, sizeof *S->h1slot);
    S->r1cnt = xcalloc((size_t)EP, sizeof *S->r1cnt);
    S->r1back = xcalloc((size_t)EP, sizeof *S->r1back);
    S->scnt = xcalloc((size_t)EP, sizeof *S->scnt);
    S->rcnt = xcalloc((size_t)EP, sizeof *S->rcnt);
    h->stamp = xalloc((size_t)EP, sizeof *h->stamp);
    h->off = xalloc((size_t)EP + 1, sizeof *h->off);
    h->b1s = xcalloc((size_t)EP * 2, sizeof *h->b1s);
    h->to1 = xcalloc((size_t)EP * 3, 1);
    if (!S->h1cnt || !S->h1back || !S->h1slot || !S->r1cnt || !S->r1back || !S->scnt || !S->rcnt || !h->stamp ||
        !h->off || !h->b1s || !h->to1)
        return par_err(PAR_ENOMEM, "ep: hierarchical dispatch: out of memory (%lld slots)", (long long)NS);
    h->b1r = h->b1s + EP;
    h->from1 = h->to1 + EP;
    h->same = h->to1 + 2 * EP;
    for (int j = 0; j < EP; j++) {
        h->to1[j] = h->rel[j] == j;                                  /* j is my relay on its node */
        h->from1[j] = x->rel[EP + j] == me;                         /* I am j's relay here */
        h->same[j] = x->node[j] == x->node[me];
    }
    return PAR_OK;
}

/* Stage-1 routes: one record per (token, relay), relay ascending, then t
 * ascending (S->h1cnt, h1t); the return order of the (token, expert) rows
 * (h1slot, h1back) and each relay's record bytes (h->b1s). */
static par_status hier_routes(ep_t *x, blk_state *S, hier_tmp *h, const int32_t *idx, int64_t T, int K, int64_t d)
{
    const int EP = x->EP;
    const int64_t El = x->El;
    int64_t n1 = 0, q = 0, ns = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int j = 0; j < EP; j++)
            h->stamp[j] = -1;
        for (int64_t t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                int r = h->rel[idx[t * K + k] / El];
                if (h->stamp[r] == t)
                    continue;
                h->stamp[r] = t;
                if (pass == 0) {
                    S->h1cnt[r]++;
                    n1++;
                } else {
                    S->h1t[h->off[r]++] = (int32_t)t;
                }
            }
        if (pass == 0) {
            S->n1s = n1;
            if (!(S->h1t = xalloc((size_t)n1, sizeof *S->h1t)))
                return par_err(PAR_ENOMEM, "ep: hierarchical dispatch: out of memory for %lld records", (long long)n1);
            h->off[0] = 0;
            for (int j = 0; j < EP; j++)
                h->off[j + 1] = h->off[j] + (int64_t)S->h1cnt[j];
        }
    }
    for (int r = 0; r < EP; r++)
        for (size_t u = 0; u < S->h1cnt[r]; u++, q++) {
            int64_t t = S->h1t[q], m = 0;
            for (int k = 0; k < K; k++)
                if (h->rel[idx[t * K + k] / El] == r) {
                    S->h1slot[ns++] = (int32_t)(t * K + k);
                    m++;
                }
            S->h1back[r] += (size_t)m;
            h->b1s[r] += rec1_bytes(m, d);
        }
    if (ns != T * K)
        return par_err(PAR_EINTERNAL, "ep: hierarchical dispatch covers %lld of %lld slots", (long long)ns,
                       (long long)(T * K));
    return PAR_OK;
}

/* The stage-1 records in route order. */
static par_status hier_pack1(ep_t *x, const blk_state *S, hier_tmp *h, const par_real *x_in, const int32_t *idx,
                             const par_real *w, int K, int64_t d)
{
    const size_t R = sizeof(par_real);
    size_t tot = 0;
    for (int r = 0; r < x->EP; r++)
        tot += h->b1s[r];
    if (!(h->sb1 = xalloc(tot, 1)))
        return par_err(PAR_ENOMEM, "ep: hierarchical dispatch: out of memory for %zu record bytes", tot);
    unsigned char *p = h->sb1;
    for (int r = 0, q = 0; r < x->EP; r++)
        for (size_t u = 0; u < S->h1cnt[r]; u++, q++) {
            int32_t t = S->h1t[q], m = 0, ex[64];
            par_real wk[64];
            for (int k = 0; k < K; k++)
                if (h->rel[idx[t * K + k] / x->El] == r) {
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
    return PAR_OK;
}

/* Stage 1: the records to the relays (inter-node once per (token, node)). */
static par_status hier_stage1(ep_t *x, hier_tmp *h)
{
    par_status s = a2a_counts(x, h->b1s, h->to1, h->b1r, h->from1);
    if (s)
        return s;
    size_t tot = 0;
    for (int j = 0; j < x->EP; j++)
        tot += h->b1r[j];
    if (!(h->rb1 = xalloc(tot, 1)))
        return par_err(PAR_ENOMEM, "ep: hierarchical dispatch: out of memory for %zu received bytes", tot);
    return a2a_rows(x, h->sb1, h->b1s, h->rb1, h->b1r, 1, PAR_C_BYTE, PH_DISPATCH);
}

/* Relay: parse the received records, count the stage-2 rows per owner (all
 * on this node). */
static par_status hier_relay_count(ep_t *x, blk_state *S, const hier_tmp *h, int64_t d)
{
    int64_t n1r = 0, n2 = 0;
    const unsigned char *p = h->rb1;
    for (int j = 0; j < x->EP; j++) {
        const unsigned char *e = p + h->b1r[j];
        while (p < e) {
            int32_t m;
            memcpy(&m, p + 4, 4);
            for (int32_t a = 0; a < m; a++) {
                int32_t ex;
                memcpy(&ex, p + 8 + 4 * (size_t)a, 4);
                int o = ex / (int)x->El;
                if (ex < 0 || ex >= x->E || !h->same[o])
                    return par_err(PAR_EINTERNAL, "ep: relay %d got expert %d from rank %d: its owner is not on node %d",
                                   x->me, (int)ex, j, x->node[x->me]);
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
    return PAR_OK;
}

/* Relay: one stage-2 row per (token, expert), owner ascending (S->s2rec,
 * s2pos: the record and return position of each). */
static par_status hier_relay_pack(ep_t *x, blk_state *S, hier_tmp *h, int64_t d)
{
    const size_t R = sizeof(par_real), r2 = rec2_bytes(d);
    S->s2rec = xalloc((size_t)S->n2s, sizeof *S->s2rec);
    S->s2pos = xalloc((size_t)S->n2s, sizeof *S->s2pos);
    h->sb2 = xalloc((size_t)S->n2s * r2, 1);
    if (!S->s2rec || !S->s2pos || !h->sb2)
        return par_err(PAR_ENOMEM, "ep: hierarchical dispatch: out of memory for %lld relayed rows", (long long)S->n2s);
    h->off[0] = 0;
    for (int j = 0; j < x->EP; j++)
        h->off[j + 1] = h->off[j] + (int64_t)S->scnt[j];
    const unsigned char *p = h->rb1;
    int64_t rec = 0, pos = 0;
    for (int j = 0; j < x->EP; j++) {
        const unsigned char *e = p + h->b1r[j];
        while (p < e) {
            int32_t t, m;
            memcpy(&t, p, 4);
            memcpy(&m, p + 4, 4);
            const unsigned char *wp = p + 8 + 4 * (size_t)m, *xp = wp + R * (size_t)m;
            for (int32_t a = 0; a < m; a++, pos++) {
                int32_t ex, src = j;
                memcpy(&ex, p + 8 + 4 * (size_t)a, 4);
                int64_t o2 = h->off[ex / x->El]++;
                S->s2rec[o2] = (int32_t)rec;
                S->s2pos[o2] = (int32_t)pos;
                unsigned char *dst = h->sb2 + (size_t)o2 * r2;
                memcpy(dst, &src, 4);
                memcpy(dst + 4, &t, 4);
                memcpy(dst + 8, &ex, 4);
                memcpy(dst + 12, wp + R * (size_t)a, R);
                memcpy(dst + 12 + R, xp, R * (size_t)d);
            }
            rec++;
            p = xp + R * (size_t)d;
        }
    }
    return PAR_OK;
}

/* Stage 2: (token, expert) rows to the owners, inside the node; unpacked to
 * rbuf [NR, d+1] and rids (expert, source EP rank, t). */
static par_status hier_stage2(ep_t *x, blk_state *S, hier_tmp *h, int64_t d, par_real **rbuf, int32_t **rids)
{
    const size_t R = sizeof(par_real), r2 = rec2_bytes(d);
    par_status s = a2a_counts(x, S->scnt, h->same, S->rcnt, h->same);
    if (s)
        return s;
    int64_t NR = 0;
    for (int j = 0; j < x->EP; j++)
        NR += (int64_t)S->rcnt[j];
    S->nrecv = NR;
    h->rb2 = xalloc((size_t)NR * r2, 1);
    *rbuf = xalloc((size_t)(NR * (d + 1)), sizeof **rbuf);
    *rids = xalloc((size_t)(NR * 3), sizeof **rids);
    if (!h->rb2 || !*rbuf || !*rids)
        return par_err(PAR_ENOMEM, "ep: hierarchical dispatch: out of memory for %lld received rows", (long long)NR);
    if ((s = a2a_rows(x, h->sb2, S->scnt, h->rb2, S->rcnt, r2, PAR_C_BYTE, PH_DISPATCH)))
        return s;
    for (int64_t r = 0; r < NR; r++) {
        const unsigned char *src = h->rb2 + (size_t)r * r2;
        int32_t v[3];
        memcpy(v, src, 12);
        (*rids)[3 * r] = v[2];     /* expert */
        (*rids)[3 * r + 1] = v[0]; /* source EP rank */
        (*rids)[3 * r + 2] = v[1]; /* t */
        memcpy(*rbuf + r * (d + 1), src + 12 + R, R * (size_t)d);
        memcpy(*rbuf + r * (d + 1) + d, src + 12, R);
    }
    return PAR_OK;
}

par_status PAR_FN(par__ep_hier_dispatch)(ep_t *x, blk_state *S, const par_real *x_in, const int32_t *idx,
                                         const par_real *w, int64_t T, int K, int64_t d, par_real **rbuf,
                                         int32_t **rids)
{
    hier_tmp h;
    par_status s = hier_alloc(x, S, &h, T * K);
    if (!s && !(s = hier_routes(x, S, &h, idx, T, K, d)) && !(s = hier_pack1(x, S, &h, x_in, idx, w, K, d)) &&
        !(s = hier_stage1(x, &h)) && !(s = hier_relay_count(x, S, &h, d)) && !(s = hier_relay_pack(x, S, &h, d)))
        s = hier_stage2(x, S, &h, d, rbuf, rids);
    hier_tmp_free(&h);
    return s;
}

par_status PAR_FN(par__ep_dispatch_dy)(ep_t *x, blk_state *S, const par_real *dy, int K, int64_t d,
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

par_status PAR_FN(par__ep_return_rows)(ep_t *x, blk_state *S, const par_real *rows, int64_t per,
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

