/* parallel/ep.c - expert-parallel dispatch / combine (see parallel/ep.h). */
#include "parallel/ep.h"

#include <string.h>

#include "core/alloc.h"
#include "kernels/moe.h"
#include "parallel/reduce.h"

/* What one block keeps between its forward and backward. */
typedef struct {
    int64_t T, nsend, nrecv;
    size_t *scnt, *rcnt;   /* [EP] rows to / from each EP rank */
    int32_t *stk;          /* [nsend] source slot t*K+k of each sent row (send order) */
    int32_t *rpos;         /* [nrecv] expert-major position of each received row */
    int64_t *eoff;         /* [El+1] first expert-major row of local expert l */
    par_real *xg, *rwg;    /* [nrecv, d], [nrecv] expert-major */
    par_real *g, *u, *h;   /* [nrecv, I] saved by the routed experts */
    par_real *sg, *su, *sh; /* [T, I] saved by the shared expert */
} blk_state;

struct PAR_FN(par_ep_s) {
    par_comm *c;
    int EP, me;
    int64_t E, El, e0;
    int n_blocks;
    int n_slots, slot;     /* sets of per-block state (pipeline microbatches), the current one */
    blk_state *blk;        /* [n_slots, n_blocks] */
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

/* Bytes of an all-to-all(v) this rank sends to OTHER ranks. */
static int64_t bytes_out(const struct PAR_FN(par_ep_s) *x, const size_t *counts, size_t per_row, size_t esz)
{
    int64_t b = 0;
    for (int j = 0; j < x->EP; j++)
        if (j != x->me)
            b += (int64_t)(counts[j] * per_row * esz);
    return b;
}

/* all-to-all(v) of rows: send scnt[j] rows of `per` elements to rank j,
 * receive rcnt[j] rows from rank j (packed in rank order). */
static par_status a2a_rows(struct PAR_FN(par_ep_s) *x, const void *in, const size_t *scnt, void *out,
                           const size_t *rcnt, size_t per, par_ctype t)
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
    par_free(sc);
    return s;
}

static par_status ep_fwd(void *ctx, PAR_FN(par_model) *M, int b, par_real *y, const par_real *x_in,
                         const int32_t *idx, const par_real *w, const int32_t *tokens, int64_t T)
{
    struct PAR_FN(par_ep_s) *x = ctx;
    blk_state *S = &x->blk[(size_t)x->slot * (size_t)x->n_blocks + (size_t)b];
    const int EP = x->EP, K = (int)M->K;
    const int64_t El = x->El, d = M->d, I = M->I, NS = T * K;
    const double L = M->cfg.swiglu_limit;
    const par_block_params *bp = &M->tab.blocks[b];
    par_status s = PAR_OK;
    par_real *sbuf = NULL, *rbuf = NULL, *yg = NULL, *slots = NULL, *ysh = NULL;
    int32_t *sids = NULL, *rids = NULL;
    int64_t *cur = NULL, *c64 = NULL;

    blk_free(S);
    S->T = T;
    S->nsend = NS;
    S->scnt = xcalloc((size_t)EP, sizeof *S->scnt);
    S->rcnt = xcalloc((size_t)EP, sizeof *S->rcnt);
    S->stk = xalloc((size_t)NS, sizeof *S->stk);
    cur = xalloc((size_t)(EP > El ? EP : El) + 1, sizeof *cur);
    c64 = xalloc((size_t)EP * 2, sizeof *c64);
    if (!S->scnt || !S->rcnt || !S->stk || !cur || !c64)
        goto fail_oom;

    /* send order: owner ascending, then (t, k) ascending */
    for (int64_t i = 0; i < NS; i++)
        S->scnt[idx[i] / El]++;
    cur[0] = 0;
    for (int j = 0; j < EP; j++)
        cur[j + 1] = cur[j] + (int64_t)S->scnt[j];
    for (int64_t i = 0; i < NS; i++)
        S->stk[cur[idx[i] / El]++] = (int32_t)i;

    /* how many rows each rank receives */
    for (int j = 0; j < EP; j++)
        c64[j] = (int64_t)S->scnt[j];
    if ((s = par_alltoall(x->c, c64, c64 + EP, 1, PAR_C_I64)))
        goto done;
    x->cnt.calls++;
    int64_t NR = 0;
    for (int j = 0; j < EP; j++) {
        S->rcnt[j] = (size_t)c64[EP + j];
        NR += c64[EP + j];
    }
    S->nrecv = NR;

    /* pack: reals (x row, routing weight), ints (expert, token id, source slot) */
    sbuf = xalloc((size_t)(NS * (d + 1)), sizeof *sbuf);
    sids = xalloc((size_t)(NS * 3), sizeof *sids);
    rbuf = xalloc((size_t)(NR * (d + 1)), sizeof *rbuf);
    rids = xalloc((size_t)(NR * 3), sizeof *rids);
    if (!sbuf || !sids || !rbuf || !rids)
        goto fail_oom;
    for (int64_t j = 0; j < NS; j++) {
        int64_t i = S->stk[j], t = i / K;
        memcpy(sbuf + j * (d + 1), x_in + t * d, (size_t)d * sizeof *sbuf);
        sbuf[j * (d + 1) + d] = w[i];
        sids[3 * j] = idx[i];
        sids[3 * j + 1] = tokens ? tokens[t] : -1;
        sids[3 * j + 2] = (int32_t)i;
    }
    if ((s = a2a_rows(x, sbuf, S->scnt, rbuf, S->rcnt, (size_t)(d + 1), PAR_C_REAL)) ||
        (s = a2a_rows(x, sids, S->scnt, rids, S->rcnt, 3, PAR_C_I32)))
        goto done;
    x->cnt.rows_sent += NS;
    x->cnt.rows_recv += NR;
    x->cnt.dispatch_bytes += bytes_out(x, S->scnt, (size_t)(d + 1), sizeof(par_real)) +
                             bytes_out(x, S->scnt, 3, sizeof(int32_t));

    /* expert-major order of the received rows (stable: source rank, then t) */
    S->eoff = xcalloc((size_t)El + 1, sizeof *S->eoff);
    S->rpos = xalloc((size_t)NR, sizeof *S->rpos);
    S->xg = xalloc((size_t)(NR * d), sizeof *S->xg);
    S->rwg = xalloc((size_t)NR, sizeof *S->rwg);
    S->g = xalloc((size_t)(NR * I), sizeof *S->g);
    S->u = xalloc((size_t)(NR * I), sizeof *S->u);
    S->h = xalloc((size_t)(NR * I), sizeof *S->h);
    yg = xalloc((size_t)(NR * d), sizeof *yg);
    if (!S->eoff || !S->rpos || !S->xg || !S->rwg || !S->g || !S->u || !S->h || !yg)
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
    for (int64_t r = 0; r < NR; r++) {
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

    /* outputs back in the order received (reuse rbuf as [NR, d]) */
    for (int64_t r = 0; r < NR; r++)
        memcpy(rbuf + r * d, yg + (int64_t)S->rpos[r] * d, (size_t)d * sizeof *rbuf);
    if ((s = a2a_rows(x, rbuf, S->rcnt, sbuf, S->scnt, (size_t)d, PAR_C_REAL)))
        goto done;
    x->cnt.combine_bytes += bytes_out(x, S->rcnt, (size_t)d, sizeof(par_real));

    /* slots, the shared expert, the contract's per-token sum */
    slots = xalloc((size_t)(NS * d), sizeof *slots);
    ysh = xalloc((size_t)(T * d), sizeof *ysh);
    if (!slots || !ysh)
        goto fail_oom;
    for (int64_t j = 0; j < NS; j++)
        memcpy(slots + (int64_t)S->stk[j] * d, sbuf + j * d, (size_t)d * sizeof *slots);
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
    par_free(sbuf);
    par_free(rbuf);
    par_free(sids);
    par_free(rids);
    par_free(yg);
    par_free(slots);
    par_free(ysh);
    par_free(cur);
    par_free(c64);
    return s;
}

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
    par_real *sbuf = NULL, *rbuf = NULL, *dyg = NULL, *dxg = NULL, *slots = NULL, *dxs = NULL;
    (void)w;

    if (S->T != T)
        return par_err(PAR_EINVAL, "ep: block %d backward for T=%lld tokens, its forward had %lld", b,
                       (long long)T, (long long)S->T);
    sbuf = xalloc((size_t)(NS * (d + 1)), sizeof *sbuf);
    rbuf = xalloc((size_t)(NR * (d + 1)), sizeof *rbuf);
    dyg = xalloc((size_t)(NR * d), sizeof *dyg);
    dxg = xcalloc((size_t)(NR * (d + 1)), sizeof *dxg);
    if (!sbuf || !rbuf || !dyg || !dxg)
        goto fail_oom;
    par_real *drwg = dxg + NR * d;

    /* dy rows to the owners (the slot output's gradient is dy[t]) */
    for (int64_t j = 0; j < NS; j++)
        memcpy(sbuf + j * d, dy + (int64_t)(S->stk[j] / K) * d, (size_t)d * sizeof *sbuf);
    if ((s = a2a_rows(x, sbuf, S->scnt, rbuf, S->rcnt, (size_t)d, PAR_C_REAL)))
        goto done;
    x->cnt.dispatch_bytes += bytes_out(x, S->scnt, (size_t)d, sizeof(par_real));
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

    /* (dx, d rw) rows back in the order received */
    for (int64_t r = 0; r < NR; r++) {
        int64_t p = S->rpos[r];
        memcpy(rbuf + r * (d + 1), dxg + p * d, (size_t)d * sizeof *rbuf);
        rbuf[r * (d + 1) + d] = drwg[p];
    }
    if ((s = a2a_rows(x, rbuf, S->rcnt, sbuf, S->scnt, (size_t)(d + 1), PAR_C_REAL)))
        goto done;
    x->cnt.combine_bytes += bytes_out(x, S->rcnt, (size_t)(d + 1), sizeof(par_real));

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
    for (int64_t j = 0; j < NS; j++) {
        int64_t i = S->stk[j];
        memcpy(slots + i * d, sbuf + j * (d + 1), (size_t)d * sizeof *slots);
    }
    if (dx)
        PAR_FN(par_moe_combine)(dx, slots, shared ? dxs : NULL, T, K, d, 1);
    if (dw)
        for (int64_t j = 0; j < NS; j++)
            dw[S->stk[j]] += sbuf[j * (d + 1) + d];
    s = PAR_OK;
    goto done;

fail_oom:
    s = par_err(PAR_ENOMEM, "ep: block %d backward: out of memory (T=%lld, %lld rows received)", b,
                (long long)T, (long long)NR);
done:
    par_free(sbuf);
    par_free(rbuf);
    par_free(dyg);
    par_free(dxg);
    par_free(slots);
    par_free(dxs);
    return s;
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
    x->blk = par_calloc((size_t)M->n_blocks, sizeof *x->blk, PAR_TAG_MODEL);
    if (!x->blk) {
        par_free(x);
        return par_err(PAR_ENOMEM, "ep: out of memory");
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
    if (x)
        *out = x->cnt;
    else
        memset(out, 0, sizeof *out);
}

void PAR_FN(par_ep_free)(PAR_FN(par_ep) *x)
{
    if (!x)
        return;
    for (int b = 0; b < x->n_slots * x->n_blocks; b++)
        blk_free(&x->blk[b]);
    par_free(x->blk);
    par_free(x);
}
