/* parallel/moe/etp.c - expert tensor parallelism (see parallel/moe/etp.h). */
#include "parallel/moe/etp.h"

#include <string.h>

#include "core/alloc.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "kernels/qcast.h"
#include "kernels/moe.h"
#include "parallel/tp/tp_reduce.h"

#define LL(x) ((long long)(x))

/* ------------------------------------------------------------------------ */
/* the rows layer                                                            */

void PAR_FN(par_etp_rows_saved_free)(PAR_FN(par_etp_rows_saved) *sv)
{
    if (!sv)
        return;
    par_free(sv->buf);
    memset(sv, 0, sizeof *sv);
}

/* Sizes, the group's row counts (sp; else this rank's only), the saved
 * arrays. */
static par_status rows_setup(PAR_FN(par_etp_rows_saved) *sv, int64_t n, int nE, int64_t d,
                             int64_t I, double L, const par_tp *etp)
{
    const int P = par_tp_size(etp), sp = etp && etp->sp;
    if (n < 0 || nE < 1 || d < 1 || I < 1 || I % P != 0)
        return par_err(PAR_EINVAL,
                       "expert tensor parallel: expert-tensor-parallel-size %d must divide "
                       "moe_inter_dim %lld (rows %lld, experts %d, d %lld)", P, LL(I), LL(n), nE,
                       LL(d));
    sv->n = n, sv->d = d, sv->Il = I / P, sv->nE = nE, sv->L = L;
    sv->rank = par_tp_rank(etp), sv->P = P, sv->sp = sp;
    int64_t *counts = par_calloc((size_t)P, sizeof(int64_t), PAR_TAG_ACT);
    if (!counts)
        return par_err(PAR_ENOMEM, "expert tensor parallel: %d counts", P);
    counts[0] = n;
    par_status st = sp ? PAR_FN(par_tp_reduce_row_counts)(etp, n, counts) : PAR_OK;
    sv->N = 0;
    for (int q = 0; q < (sp ? P : 1); q++)
        sv->N += counts[q];
    const int64_t N = sv->N, Il = sv->Il;
    const size_t ni = (size_t)(P + nE + 1 + N), nr = (size_t)(N * d + N + 3 * N * Il);
    if (!st && !(sv->buf = par_malloc(ni * sizeof(int64_t) + (nr + 1) * sizeof(par_real),
                                      PAR_TAG_ACT)))
        st = par_err(PAR_ENOMEM, "expert tensor parallel: saved state for %lld rows", LL(N));
    if (!st) {
        sv->counts = sv->buf; /* int64 arrays first, then the reals */
        sv->off = sv->counts + P;
        sv->order = sv->off + nE + 1;
        sv->xs = (par_real *)(void *)(sv->order + N);
        sv->rws = sv->xs + N * d;
        sv->g = sv->rws + N;
        sv->u = sv->g + N * Il;
        sv->h = sv->u + N * Il;
        memcpy(sv->counts, counts, (size_t)P * sizeof(int64_t));
    }
    par_free(counts);
    return st;
}

/* Counting sort of the N gathered rows [N, d+1] (x | rw) by expert eg,
 * stable: off, order, xs, rws. */
static par_status sort_rows(PAR_FN(par_etp_rows_saved) *sv, const par_real *rows,
                            const int32_t *eg)
{
    const int64_t N = sv->N, d = sv->d, w = d + 1;
    memset(sv->off, 0, (size_t)(sv->nE + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++) {
        if (eg[i] < 0 || eg[i] >= sv->nE)
            return par_err(PAR_ERANGE, "expert tensor parallel: row %lld names expert %d of %d",
                           LL(i), eg[i], sv->nE);
        sv->off[eg[i] + 1]++;
    }
    for (int e = 0; e < sv->nE; e++)
        sv->off[e + 1] += sv->off[e];
    int64_t *next = par_malloc((size_t)(sv->nE + 1) * sizeof(int64_t), PAR_TAG_ACT);
    if (!next)
        return par_err(PAR_ENOMEM, "expert tensor parallel: %d counters", sv->nE);
    memcpy(next, sv->off, (size_t)sv->nE * sizeof(int64_t));
    for (int64_t i = 0; i < N; i++) {
        const int64_t p = next[eg[i]]++;
        sv->order[p] = i;
        memcpy(sv->xs + p * d, rows + i * w, (size_t)d * sizeof(par_real));
        sv->rws[p] = rows[i * w + d];
    }
    par_free(next);
    return PAR_OK;
}

/* The group's rows (x | rw) and experts in rank order (sp; else the rank's
 * own), sorted by expert. */
static par_status gather_sort(PAR_FN(par_etp_rows_saved) *sv, const par_real *x,
                              const par_real *rw, const int32_t *expert, const par_tp *etp)
{
    const int64_t n = sv->n, N = sv->N, d = sv->d, w = d + 1;
    par_real *rows = par_malloc((size_t)((n + N) * w + 1) * sizeof(par_real), PAR_TAG_ACT);
    int32_t *eg = par_malloc((size_t)(N + 1) * sizeof(int32_t), PAR_TAG_ACT);
    par_status st = PAR_OK;
    if (!rows || !eg) {
        st = par_err(PAR_ENOMEM, "expert tensor parallel: %lld gathered rows", LL(N));
        goto free_tmp;
    }
    par_real *mine = rows + N * w;
    for (int64_t i = 0; i < n; i++) {
        memcpy(mine + i * w, x + i * d, (size_t)d * sizeof(par_real));
        mine[i * w + d] = rw[i];
    }
    if (sv->sp)
        st = PAR_FN(par_tp_reduce_gather_rows)(etp, rows, eg, mine, expert, sv->counts, w);
    else {
        memcpy(rows, mine, (size_t)(n * w) * sizeof(par_real));
        memcpy(eg, expert, (size_t)n * sizeof(int32_t));
    }
    if (!st)
        st = sort_rows(sv, rows, eg);
free_tmp:
    par_free(rows);
    par_free(eg);
    return st;
}

/* Rows of the rank in gathered order [N, w] -> this rank's complete rows
 * [n, w]: the group sum (sp: reduce-scatter to the owners; else
 * all-reduce, in place). */
static par_status return_rows(const PAR_FN(par_etp_rows_saved) *sv, par_real *mine, par_real *full,
                              int64_t w, const par_tp *etp)
{
    if (sv->sp)
        return PAR_FN(par_tp_reduce_scatter_rows)(etp, mine, full, sv->counts, w);
    par_status st = PAR_FN(par_tp_reduce_sum)(etp, full, (size_t)(sv->N * w));
    if (!st && mine != full)
        memcpy(mine, full, (size_t)(sv->n * w) * sizeof(par_real));
    return st;
}

/* ---- the bitwise mode (docs/bitwise.md "Tensor parallelism") ----------- */

static int chained(const par_tp *etp)
{
    return etp && etp->bitwise && par_tp_size(etp) > 1;
}

/* The first gathered row that is this rank's own (sp: after the ranks
 * before it; else every row is). */
static int64_t own_first(const PAR_FN(par_etp_rows_saved) *sv)
{
    int64_t f = 0;
    for (int q = 0; sv->sp && q < sv->rank; q++)
        f += sv->counts[q];
    return f;
}

/* One chain link of a split GEMM per expert: P rows of expert e (sorted)
 * continued with the rank's slice: op = 0: y = h w2^T (K = the hidden
 * units); 1: dx = dg w1; 2: dx = du w3. */
/* One expert's operands of a chained GEMM (a recipe's casts in tmp). */
typedef struct {
    const par_real *a, *w; /* its rows of h, dg or du; its w2, w1 or w3 slice */
    par_real *tmp;
} etp_op;

typedef struct {
    const PAR_FN(par_etp_rows_saved) *sv;
    etp_op *ops; /* [nE] */
    int op, load;
} etp_link;

static void link_add(void *ctx, par_real *P)
{
    const etp_link *k = ctx;
    const PAR_FN(par_etp_rows_saved) *sv = k->sv;
    const int64_t d = sv->d, Il = sv->Il;
    for (int e = 0; e < sv->nE; e++) {
        const int64_t o = sv->off[e], ne = sv->off[e + 1] - o;
        if (ne > 0)
            PAR_FN(par_gemm_part)(0, k->op == 0, ne, d, Il, k->ops[e].a, Il, k->ops[e].w, k->op == 0 ? Il : d,
                                  k->load, P + o * d, d);
    }
}

/* Every expert's operands as par_linear_forward (op 0: h, w2) or
 * par_linear_backward (dx: the slice w1 / w3, the rows' x) cast them under a
 * recipe, before the chain (the casts' tile exchanges are collective). */
static void link_operands(etp_link *k, const par_real *a, const par_real *const *w)
{
    const PAR_FN(par_etp_rows_saved) *sv = k->sv;
    const int64_t d = sv->d, Il = sv->Il;
    for (int e = 0; e < sv->nE; e++) {
        const int64_t o = sv->off[e], ne = sv->off[e + 1] - o;
        etp_op *q = &k->ops[e];
        const par_real *x = sv->xs + o * d;
        q->a = a + o * Il, q->w = w[e];
        PAR_FN(par_qcast_operands)(k->op == 0 ? &q->a : &x, &q->w, &q->tmp, ne, k->op == 0 ? Il : d,
                                   k->op == 0 ? d : Il);
    }
}

/* P [N, d] = the link's sums over all hidden units, the same on every rank:
 * the serial expert's GEMM chain continued over the ranks' slices. */
static par_status rows_chain(par_real *P, const PAR_FN(par_etp_rows_saved) *sv, const par_real *a,
                             const par_real *const *w, int op, const par_tp *etp)
{
    etp_link k = {sv, par_calloc((size_t)sv->nE + 1, sizeof(etp_op), PAR_TAG_ACT), op,
                  !PAR_FN(par_tp_chain_first)(etp)};
    if (!k.ops)
        return par_err(PAR_ENOMEM, "expert tensor parallel: %d experts' operands", sv->nE);
    link_operands(&k, a, w);
    par_status st = PAR_FN(par_tp_reduce_chain_bcast)(etp, P, (size_t)(sv->N * sv->d), link_add, &k);
    for (int e = 0; e < sv->nE; e++)
        par_qcast_release(k.ops[e].tmp);
    par_free(k.ops);
    return st;
}

typedef struct {
    const PAR_FN(par_etp_rows_saved) *sv;
    const par_real *dh;
} drw_link;

static void drw_add(void *ctx, double *acc)
{
    const drw_link *k = ctx;
    PAR_FN(par_swiglu_drw_part)(acc, k->dh, k->sv->g, k->sv->u, k->sv->N, k->sv->Il, k->sv->L);
}

/* The bitwise mode's forward after the sort: every expert's hidden units,
 * then y of all the group's rows (gathered order yg [N, d], complete). */
static par_status rows_forward_chained(PAR_FN(par_etp_rows_saved) *sv, par_real *ys, par_real *yg,
                                       const par_real *const *w1, const par_real *const *w2,
                                       const par_real *const *w3, const par_tp *etp)
{
    const int64_t N = sv->N, d = sv->d, Il = sv->Il;
    for (int e = 0; e < sv->nE; e++) {
        const int64_t o = sv->off[e], ne = sv->off[e + 1] - o;
        PAR_FN(par_moe_expert_hidden)(sv->g + o * Il, sv->u + o * Il, sv->h + o * Il, sv->xs + o * d, sv->rws + o,
                                      w1[e], w3[e], ne, d, Il, sv->L);
    }
    par_status st = rows_chain(ys, sv, sv->h, w2, 0, etp);
    if (st)
        return st;
    PAR_FN(par_gemm_finish)(N, d, 1, ys, d, 0, ys, d);
    for (int64_t p = 0; p < N; p++)
        memcpy(yg + sv->order[p] * d, ys + p * d, (size_t)d * sizeof(par_real));
    return PAR_OK;
}

/* One expert's local steps of par_moe_expert_backward on its sorted rows:
 * w2's terms, dh, dg and du, w1's and w3's terms (the input sums wait). */
static void expert_local_backward(const PAR_FN(par_etp_rows_saved) *sv, int e, par_real *dh, par_real *dg,
                                  par_real *du, par_real *dw1, par_real *dw2, par_real *dw3, const par_real *dys,
                                  const par_real *w1, const par_real *w2, const par_real *w3)
{
    const int64_t o = sv->off[e], ne = sv->off[e + 1] - o, d = sv->d, Il = sv->Il;
    if (ne <= 0)
        return;
    const par_real *h = sv->h + o * Il, *x = sv->xs + o * d, *dy = dys + o * d;
    if (dw2)
        PAR_FN(par_linear_backward)(NULL, dw2, dy, h, w2, ne, Il, d);
    PAR_FN(par_linear_backward)(dh + o * Il, NULL, dy, h, w2, ne, Il, d);
    PAR_FN(par_swiglu_backward)(dg + o * Il, du + o * Il, NULL, dh + o * Il, sv->g + o * Il, sv->u + o * Il,
                                sv->rws + o, ne, Il, sv->L);
    PAR_FN(par_linear_backward)(NULL, dw1, dg + o * Il, x, w1, ne, d, Il); /* w: a recipe's cast of x */
    PAR_FN(par_linear_backward)(NULL, dw3, du + o * Il, x, w3, ne, d, Il);
}

/* The bitwise mode's backward on the sorted rows: weight terms of the
 * rank's slices; dxs [N, d] (zeroed) and drs [N] (zeroed) complete on every
 * rank: dx's two GEMMs and drw's sum continued over the ranks' slices. */
static par_status rows_backward_chained(const PAR_FN(par_etp_rows_saved) *sv, par_real *dxs, par_real *drs,
                                        par_real *const *dw1, par_real *const *dw2, par_real *const *dw3,
                                        const par_real *dys, const par_real *const *w1,
                                        const par_real *const *w2, const par_real *const *w3, const par_tp *etp)
{
    const int64_t N = sv->N, d = sv->d, Il = sv->Il;
    const size_t nb = (size_t)(3 * N * Il + N * d) * sizeof(par_real) + (size_t)N * sizeof(double);
    par_real *dh = par_calloc(nb + 1, 1, PAR_TAG_ACT);
    if (!dh)
        return par_err(PAR_ENOMEM, "expert tensor parallel backward: scratch of %zu bytes", nb);
    par_real *dg = dh + N * Il, *du = dg + N * Il, *P = du + N * Il;
    double *acc = (double *)(void *)(P + N * d);
    for (int e = 0; e < sv->nE; e++)
        expert_local_backward(sv, e, dh, dg, du, dw1 ? dw1[e] : NULL, dw2 ? dw2[e] : NULL, dw3 ? dw3[e] : NULL, dys,
                              w1[e], w2[e], w3[e]);
    par_status st = rows_chain(P, sv, dg, w1, 1, etp);
    if (!st) {
        PAR_FN(par_gemm_finish)(N, d, 1, P, d, 1, dxs, d);
        st = rows_chain(P, sv, du, w3, 2, etp);
    }
    if (!st)
        PAR_FN(par_gemm_finish)(N, d, 1, P, d, 1, dxs, d);
    drw_link k = {sv, dh};
    if (!st && !(st = PAR_FN(par_tp_reduce_chain_f64)(etp, acc, (size_t)N, drw_add, &k)))
        for (int64_t p = 0; p < N; p++)
            drs[p] += (par_real)acc[p];
    par_free(dh);
    return st;
}

par_status PAR_FN(par_etp_rows_forward)(par_real *y,              /* [n, d] */
                                        PAR_FN(par_etp_rows_saved) *saved,
                                        const par_real *x,        /* [n, d] */
                                        const par_real *rw,       /* [n] */
                                        const int32_t *expert,    /* [n] */
                                        int64_t n, const par_real *const *w1,
                                        const par_real *const *w2, const par_real *const *w3,
                                        int nE, int64_t d, int64_t I, double L,
                                        const par_tp *etp)
{
    PAR_FN(par_etp_rows_saved) sv;
    memset(&sv, 0, sizeof sv);
    par_real *ys = NULL;
    par_status st = rows_setup(&sv, n, nE, d, I, L, etp);
    if (st || (st = gather_sort(&sv, x, rw, expert, etp)))
        goto fail_free_saved;
    const int64_t N = sv.N, Il = sv.Il;
    if (!(ys = par_malloc((size_t)(2 * N * d + 1) * sizeof(par_real), PAR_TAG_ACT))) {
        st = par_err(PAR_ENOMEM, "expert tensor parallel: %lld output rows", LL(N));
        goto fail_free_saved;
    }
    par_real *yg = ys + N * d;
    if (chained(etp)) {
        if ((st = rows_forward_chained(&sv, ys, yg, w1, w2, w3, etp)))
            goto fail_free_saved;
        memcpy(y, yg + own_first(&sv) * d, (size_t)(n * d) * sizeof(par_real));
        par_free(ys);
        PAR_FN(par_etp_rows_saved_free)(saved);
        *saved = sv;
        return PAR_OK;
    }
    for (int e = 0; e < nE; e++) {
        const int64_t o = sv.off[e], ne = sv.off[e + 1] - o;
        PAR_FN(par_moe_expert_forward)(ys + o * d, sv.g + o * Il, sv.u + o * Il, sv.h + o * Il,
                                       sv.xs + o * d, sv.rws + o, w1[e], w2[e], w3[e], ne, d, Il,
                                       L);
    }
    for (int64_t p = 0; p < N; p++)
        memcpy(yg + sv.order[p] * d, ys + p * d, (size_t)d * sizeof(par_real));
    if ((st = return_rows(&sv, y, yg, d, etp)))
        goto fail_free_saved;
    par_free(ys);
    PAR_FN(par_etp_rows_saved_free)(saved);
    *saved = sv;
    return PAR_OK;

fail_free_saved:
    par_free(ys);
    PAR_FN(par_etp_rows_saved_free)(&sv);
    return st;
}

par_status PAR_FN(par_etp_rows_backward)(par_real *dx,            /* [n, d] or NULL */
                                         par_real *drw,           /* [n] or NULL */
                                         par_real *const *dw1, par_real *const *dw2,
                                         par_real *const *dw3,
                                         const par_real *dy,      /* [n, d] */
                                         const PAR_FN(par_etp_rows_saved) *saved,
                                         const par_real *const *w1, const par_real *const *w2,
                                         const par_real *const *w3, const par_tp *etp)
{
    const PAR_FN(par_etp_rows_saved) *sv = saved;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "expert tensor parallel backward: no saved forward");
    const int64_t n = sv->n, N = sv->N, d = sv->d, Il = sv->Il, w = d + 1;
    /* dyg [N, d] gathered, dys [N, d] sorted, dxs [N, d] + drs [N] sorted,
     * out [N, w] gathered order, mine [n, w] */
    const size_t nr = (size_t)(3 * N * d + N + N * w + n * w);
    par_real *buf = par_calloc(nr + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "expert tensor parallel backward: scratch of %zu reals", nr);
    par_real *dyg = buf, *dys = dyg + N * d, *dxs = dys + N * d, *drs = dxs + N * d;
    par_real *out = drs + N, *mine = out + N * w;
    par_status st = sv->sp ? PAR_FN(par_tp_reduce_gather_rows)(etp, dyg, NULL, dy, NULL, sv->counts, d)
                           : PAR_OK;
    if (!sv->sp)
        memcpy(dyg, dy, (size_t)(n * d) * sizeof(par_real));
    for (int64_t p = 0; p < N && !st; p++)
        memcpy(dys + p * d, dyg + sv->order[p] * d, (size_t)d * sizeof(par_real));
    if (!st && chained(etp)) {
        if ((st = rows_backward_chained(sv, dxs, drs, dw1, dw2, dw3, dys, w1, w2, w3, etp)))
            goto free_scratch;
    }
    for (int e = 0; e < sv->nE && !st && !chained(etp); e++) {
        const int64_t o = sv->off[e], ne = sv->off[e + 1] - o;
        st = PAR_FN(par_moe_expert_backward)(
            dx ? dxs + o * d : NULL, dw1 ? dw1[e] : NULL, dw2 ? dw2[e] : NULL, dw3 ? dw3[e] : NULL,
            drw ? drs + o : NULL, dys + o * d, sv->xs + o * d, sv->rws + o, w1[e], w2[e], w3[e],
            sv->g + o * Il, sv->u + o * Il, sv->h + o * Il, ne, d, Il, sv->L);
    }
    if (st || (!dx && !drw))
        goto free_scratch;
    for (int64_t p = 0; p < N; p++) {
        par_real *r = out + sv->order[p] * w;
        memcpy(r, dxs + p * d, (size_t)d * sizeof(par_real));
        r[d] = drs[p];
    }
    if (chained(etp)) /* complete on every rank: this rank's own rows */
        memcpy(mine, out + own_first(sv) * w, (size_t)(n * w) * sizeof(par_real));
    else if ((st = return_rows(sv, mine, out, w, etp)))
        goto free_scratch;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t c = 0; c < d && dx; c++)
            dx[i * d + c] += mine[i * w + c];
        if (drw)
            drw[i] += mine[i * w + d];
    }
free_scratch:
    par_free(buf);
    return st;
}

/* ------------------------------------------------------------------------ */
/* the MoE layer, every expert held                                          */

void PAR_FN(par_etp_moe_saved_free)(PAR_FN(par_etp_moe_saved) *sv)
{
    if (!sv)
        return;
    PAR_FN(par_etp_rows_saved_free)(&sv->rows);
    PAR_FN(par_tp_mlp_saved_free)(&sv->shared);
    par_free(sv->buf);
    memset(sv, 0, sizeof *sv);
}

/* The serial layer's gathered rows: experts ascending, tokens ascending
 * (kernels/moe.c), with their token, slot and routing weight. */
static par_status build_rows(PAR_FN(par_etp_moe_saved) *sv, const int32_t *idx,
                             const par_real *w, int64_t T, int E, int K)
{
    const int64_t NR = T * K;
    sv->buf = par_malloc((size_t)(E + 1) * sizeof(int64_t) + (size_t)(NR + 1) * sizeof(par_real) +
                             (size_t)(3 * NR + 1) * sizeof(int32_t), PAR_TAG_ACT);
    if (!sv->buf)
        return par_err(PAR_ENOMEM, "expert tensor parallel MoE: %lld rows", LL(NR));
    int64_t *next = sv->buf; /* int64 first, then reals, then int32: each aligned */
    sv->rw = (par_real *)(void *)(next + E + 1);
    sv->tok = (int32_t *)(void *)(sv->rw + NR + 1);
    sv->slot = sv->tok + NR;
    sv->expert = sv->slot + NR;
    memset(next, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < NR; i++) {
        if (idx[i] < 0 || idx[i] >= E)
            return par_err(PAR_ERANGE, "expert tensor parallel MoE: idx[%lld][%lld] = %d outside "
                           "[0, %d)", LL(i / K), LL(i % K), idx[i], E);
        next[idx[i] + 1]++;
    }
    for (int e = 0; e < E; e++)
        next[e + 1] += next[e];
    for (int64_t t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            const int64_t p = next[idx[t * K + k]]++;
            sv->tok[p] = (int32_t)t, sv->slot[p] = k, sv->expert[p] = idx[t * K + k];
            sv->rw[p] = w[t * K + k];
        }
    return PAR_OK;
}

/* tokens of the shared expert's TP layer (all of the group's with sp) */
static int64_t shared_tokens(int64_t T, const par_tp *tp)
{
    return tp && tp->sp ? T * par_tp_size(tp) : T;
}

par_status PAR_FN(par_etp_moe_forward)(par_real *y,               /* [T, d] */
                                       PAR_FN(par_etp_moe_saved) *saved,
                                       const par_real *x,         /* [T, d] */
                                       const int32_t *idx,        /* [T, K] */
                                       const par_real *w,         /* [T, K] */
                                       const PAR_FN(par_etp_weights) *W,
                                       int64_t T, int64_t d, int E, int K, int64_t I, double L,
                                       const par_tp *etp, const par_tp *tp)
{
    PAR_FN(par_etp_moe_saved) sv;
    memset(&sv, 0, sizeof sv);
    sv.T = T, sv.d = d, sv.E = E, sv.K = K;
    const int64_t NR = T * K;
    par_real *tmp = NULL;
    par_status st = build_rows(&sv, idx, w, T, E, K);
    if (st)
        goto fail_free_saved;
    /* xr [NR, d] rows, yr [NR, d] their outputs, slots [T, K, d], ysh [T, d] */
    if (!(tmp = par_malloc((size_t)((3 * NR + T) * d + 1) * sizeof(par_real), PAR_TAG_ACT))) {
        st = par_err(PAR_ENOMEM, "expert tensor parallel MoE: %lld rows", LL(NR));
        goto fail_free_saved;
    }
    par_real *xr = tmp, *yr = xr + NR * d, *slots = yr + NR * d, *ysh = slots + NR * d;
    for (int64_t p = 0; p < NR; p++)
        memcpy(xr + p * d, x + (int64_t)sv.tok[p] * d, (size_t)d * sizeof(par_real));
    if ((st = PAR_FN(par_etp_rows_forward)(yr, &sv.rows, xr, sv.rw, sv.expert, NR, W->w1, W->w2,
                                           W->w3, E, d, I, L, etp)) ||
        (st = PAR_FN(par_tp_mlp_forward)(ysh, &sv.shared, x, W->sw1, W->sw2, W->sw3,
                                         shared_tokens(T, tp), d, I, L, tp)))
        goto fail_free_saved;
    for (int64_t p = 0; p < NR; p++)
        memcpy(slots + ((int64_t)sv.tok[p] * K + sv.slot[p]) * d, yr + p * d,
               (size_t)d * sizeof(par_real));
    PAR_FN(par_moe_combine)(y, slots, ysh, T, K, d, 0);
    par_free(tmp);
    PAR_FN(par_etp_moe_saved_free)(saved);
    *saved = sv;
    return PAR_OK;

fail_free_saved:
    par_free(tmp);
    PAR_FN(par_etp_moe_saved_free)(&sv);
    return st;
}

par_status PAR_FN(par_etp_moe_backward)(par_real *dx,             /* [T, d] or NULL */
                                        par_real *dw,             /* [T, K] or NULL */
                                        const PAR_FN(par_etp_grads) *dW,
                                        const par_real *dy,       /* [T, d] */
                                        const PAR_FN(par_etp_moe_saved) *saved,
                                        const PAR_FN(par_etp_weights) *W,
                                        const par_tp *etp, const par_tp *tp)
{
    const PAR_FN(par_etp_moe_saved) *sv = saved;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "expert tensor parallel MoE backward: no saved forward");
    const int64_t T = sv->T, d = sv->d, K = sv->K, NR = T * K;
    /* dyr, dxr [NR, d], drw [NR], slots [T, K, d], dxs [T, d] */
    const size_t n = (size_t)(3 * NR * d + NR + T * d);
    par_real *buf = par_calloc(n + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!buf)
        return par_err(PAR_ENOMEM, "expert tensor parallel MoE backward: %zu reals", n);
    par_real *dyr = buf, *dxr = dyr + NR * d, *drw = dxr + NR * d, *slots = drw + NR;
    par_real *dxs = slots + NR * d;
    for (int64_t p = 0; p < NR; p++)
        memcpy(dyr + p * d, dy + (int64_t)sv->tok[p] * d, (size_t)d * sizeof(par_real));
    par_status st = PAR_FN(par_etp_rows_backward)(dx ? dxr : NULL, dw ? drw : NULL,
                                                  dW ? dW->w1 : NULL, dW ? dW->w2 : NULL,
                                                  dW ? dW->w3 : NULL, dyr, &sv->rows, W->w1, W->w2,
                                                  W->w3, etp);
    if (!st)
        st = PAR_FN(par_tp_mlp_backward)(dx ? dxs : NULL, dW ? dW->sw1 : NULL, dW ? dW->sw2 : NULL,
                                         dW ? dW->sw3 : NULL, dy, &sv->shared, W->sw1, W->sw2,
                                         W->sw3, tp);
    if (!st && dx) {
        for (int64_t p = 0; p < NR; p++)
            memcpy(slots + ((int64_t)sv->tok[p] * K + sv->slot[p]) * d, dxr + p * d,
                   (size_t)d * sizeof(par_real));
        PAR_FN(par_moe_combine)(dx, slots, dxs, T, (int)K, d, 1);
    }
    if (!st && dw)
        for (int64_t p = 0; p < NR; p++)
            dw[(int64_t)sv->tok[p] * K + sv->slot[p]] += drw[p];
    par_free(buf);
    return st;
}
