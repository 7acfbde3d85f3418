/* parallel/cp/cp.c - context parallelism for the V4 hybrid attention layer
 * (see parallel/cp/cp.h and docs/parallel.md, "Context parallelism").
 *
 * Coordinates.  For row b, this rank's local rows are [l0, l1) = [r*L,
 * (r+1)*L) and its halo [h0, l0), h0 = l0 - Dh; [h0, l1) are its W_ = Dh + L
 * working rows.  Per-token saved arrays and the backward's scratch hold the
 * working rows only, in WINDOW coordinates (window row t' is row position
 * h0 + t'); q is zero on the halo (halo queries are not this rank's), o,
 * lse, r are written on the local rows, sel is -1 elsewhere.  The entries
 * (ecmp, eicmp; the backward's dcmp) are token-indexed over the whole row
 * (ROW coordinates), filled by the all-gather.  The kernels run on one row
 * at a time through row_view: window arrays at the row's window, entry
 * arrays at row position h0 of the row, so a query's entries back to its
 * sample start (window index down to -h0) lie inside the entry array.
 */
#include "parallel/cp/cp.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/racc.h"
#include "kernels/ops.h"
#include "parallel/layout/layout.h"
#include "parallel/reduce/reduce_sum.h"
#include "parallel/tp/tp_reduce.h"

#if PAR_REAL_BITS == 64
#define CP_CTYPE PAR_C_F64
#else
#define CP_CTYPE PAR_C_F32
#endif

/* p2p tags (one per direction; messages of one tag between two ranks keep
 * their order, so consecutive layers need no distinct tags) */
enum { TAG_HALO_FWD = 6101, TAG_HALO_BWD = 6102, TAG_BW_QUERIES = 6103, TAG_BW_DCZ = 6104 };

#define LL(x) ((long long)(x))

int64_t PAR_FN(par_cp_layer_halo)(const par_attn_dims *dm)
{
    int64_t ratio = dm->m;
    par_layout_model lm;
    memset(&lm, 0, sizeof lm);
    lm.window_size = dm->window;
    lm.n_ratios = 1;
    lm.compress_ratios = &ratio;
    return par_layout_d_window(&lm);
}

par_status PAR_FN(par_cp_check)(int64_t S, int64_t cp, int64_t d_window)
{
    if (cp < 1)
        return par_err(PAR_EINVAL, "context-parallel-size must be at least 1, got %lld", LL(cp));
    if (S < 1 || S % cp != 0)
        return par_err(PAR_EINVAL,
                       "context-parallel-size %lld does not divide seq_length %lld (each CP rank "
                       "holds a contiguous S/CP slice of every row)",
                       LL(cp), LL(S));
    if (cp > 1 && S / cp < d_window)
        return par_err(PAR_EINVAL,
                       "context-parallel-size %lld: each CP rank's local rows S/CP = %lld/%lld = "
                       "%lld are fewer than D_window = %lld; the CP boundary exchange needs "
                       "S/CP >= D_window",
                       LL(cp), LL(S), LL(cp), LL(S / cp), LL(d_window));
    return PAR_OK;
}

void PAR_FN(par_cp_attn_saved_free)(PAR_FN(par_cp_attn_saved) *sv)
{
    if (!sv)
        return;
    par_free(sv->buf);
    par_free(sv->ebuf);
    par_free(sv->xw);
    par_free(sv->pos);
    par_free(sv->kbuf);
    memset(sv, 0, sizeof *sv);
}

/* ------------------------------------------------------------------------ */
/* helpers                                                                   */

/* The window arrays of a saved struct for T working rows, 64-byte aligned
 * pieces as attention.c's saved_layout (cmp, icmp left NULL); with buf NULL
 * it only counts bytes. */
static size_t window_layout(PAR_FN(par_attn_saved) *s, char *buf, const par_attn_dims *dm, int64_t T)
{
    PAR_ATTN_SAVED_DIMS(dm);
    size_t off = 0;
    if (buf)
        memset(s, 0, sizeof *s);
#define CARVE(field, type, width, present, tok)                                   \
    if ((present) && (tok)) {                                                      \
        if (buf)                                                                      \
            s->field = (type *)(void *)(buf + off);                                   \
        off += ((size_t)(T * (int64_t)(width)) * sizeof(type) + 63) & ~(size_t)63;    \
    }
    PAR_ATTN_SAVED_FIELDS(CARVE)
#undef CARVE
    return off;
}

/* dst = src with every array advanced by `off` tokens. */
static void saved_shift(PAR_FN(par_attn_saved) *dst, const PAR_FN(par_attn_saved) *src,
                        int64_t off, const par_attn_dims *dm)
{
    PAR_ATTN_SAVED_DIMS(dm);
    *dst = *src;
#define SHIFT(field, type, width, present, tok)            \
    if (src->field)                                           \
        dst->field = src->field + off * (int64_t)(width);
    PAR_ATTN_SAVED_FIELDS(SHIFT)
#undef SHIFT
}

/* Row b's view for the kernels (window coordinates): the window arrays at
 * the row's working rows, the entries at row position h0 of the row (inside
 * ecmp / eicmp); returns the positions from h0. */
static const int32_t *row_view(PAR_FN(par_attn_saved) *sh, const PAR_FN(par_cp_attn_saved) *sv, int64_t b)
{
    const int64_t W_ = sv->Dh + sv->L, at = b * sv->S + sv->rank * sv->L - sv->Dh;
    saved_shift(sh, &sv->s, b * W_, &sv->dm);
    if (sv->ecmp)
        sh->cmp = sv->ecmp + at * sv->dm.hd;
    if (sv->eicmp)
        sh->icmp = sv->eicmp + at * sv->dm.ihd;
    return sv->pos + at;
}

static int is_entry(int32_t p, int64_t m)
{
    return m > 0 && (p + 1) % m == 0;
}

/* Entries of all rows whose last token lies in rank q's slice. */
static int64_t entries_of(const int32_t *pos, int64_t rows, int64_t S, int64_t L, int64_t q,
                          int64_t m)
{
    int64_t n = 0;
    for (int64_t b = 0; b < rows; b++)
        for (int64_t t = q * L; t < (q + 1) * L; t++)
            n += is_entry(pos[b * S + t], m);
    return n;
}

static par_status check_rows(const int32_t *pos, int64_t rows, int64_t S)
{
    for (int64_t b = 0; b < rows; b++)
        for (int64_t t = 0; t < S; t++) {
            int32_t p = pos[b * S + t], want = t > 0 ? pos[b * S + t - 1] + 1 : 0;
            if (p != 0 && p != want)
                return par_err(PAR_EINVAL,
                               "context parallel attention: pos of row %lld, position %lld is %d; "
                               "must be 0 (sample start) or the previous position + 1 = %d",
                               LL(b), LL(t), p, want);
        }
    return PAR_OK;
}

/* Rank r sends `n` reals to r+1 (if any) and receives `n` from r-1 (if
 * any), both under `tag`; dir < 0 reverses the direction. */
static par_status shift_exchange(par_comm *c, const par_real *sendbuf, par_real *recvbuf,
                                 size_t n, int dir, int tag)
{
    const int r = par_comm_rank(c), p = par_comm_size(c);
    const int to = r + dir, from = r - dir;
    par_request *req[2] = {NULL, NULL};
    size_t nr = 0;
    par_status st = PAR_OK;
    if (from >= 0 && from < p && (st = par_irecv(c, recvbuf, n, CP_CTYPE, from, tag, &req[nr++])))
        goto fail_wait;
    if (to >= 0 && to < p && (st = par_isend(c, sendbuf, n, CP_CTYPE, to, tag, &req[nr++])))
        goto fail_wait;
    return par_waitall(nr, req);
fail_wait:
    (void)par_waitall(nr, req);
    return st;
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */

/* The saved state of a forward over `rows` rows: the window arrays (sel -1)
 * and the rows' entries, the positions, each row's local x at its working
 * rows' offset Dh. */
static par_status saved_alloc(PAR_FN(par_cp_attn_saved) *sv, const par_real *x_local, /* [rows, L, d] */
                              const int32_t *pos_rows, /* [rows, S] */
                              const par_attn_dims *dm, int64_t rows, int64_t L, int64_t ncp, int64_t r,
                              int64_t D)
{
    const int64_t S = L * ncp, Dh = r > 0 ? D : 0, W_ = Dh + L, Tw = rows * W_, Tt = rows * S, d = dm->d;
    const int64_t ne = dm->m > 0 ? dm->hd + (dm->m == 4 ? dm->ihd : 0) : 0; /* entry reals per token */
    memset(sv, 0, sizeof *sv);
    sv->rows = rows, sv->L = L, sv->S = S, sv->cp = ncp, sv->rank = r, sv->D = D, sv->Dh = Dh;
    sv->dm = *dm;
    size_t sb = window_layout(NULL, NULL, dm, Tw);
    sv->buf = par_calloc(1, sb ? sb : 1, PAR_TAG_ACT);
    sv->ebuf = ne ? par_calloc((size_t)(Tt * ne), sizeof(par_real), PAR_TAG_ACT) : NULL;
    sv->xw = par_malloc((size_t)(Tw * d + 1) * sizeof(par_real), PAR_TAG_ACT);
    sv->pos = par_malloc((size_t)(Tt + 1) * sizeof(int32_t), PAR_TAG_ACT);
    if (!sv->buf || (ne && !sv->ebuf) || !sv->xw || !sv->pos)
        return par_err(PAR_ENOMEM, "context parallel attention: saved state of %zu + %zu bytes", sb,
                       (size_t)(Tt * ne) * sizeof(par_real));
    window_layout(&sv->s, sv->buf, dm, Tw);
    sv->ecmp = ne ? sv->ebuf : NULL;
    sv->eicmp = dm->m == 4 ? sv->ecmp + Tt * dm->hd : NULL;
    memcpy(sv->pos, pos_rows, (size_t)Tt * sizeof(int32_t));
    if (dm->m == 4)
        memset(sv->s.sel, 0xff, (size_t)(Tw * dm->topk) * sizeof(int32_t)); /* -1 */
    for (int64_t b = 0; b < rows; b++)
        memcpy(sv->xw + (b * W_ + Dh) * d, x_local + b * L * d, (size_t)(L * d) * sizeof(par_real));
    return PAR_OK;
}

/* The forward halo: my last D rows of every row to r+1, the previous
 * rank's into my working rows [0, Dh). */
static par_status halo_forward(PAR_FN(par_cp_attn_saved) *sv, const par_real *x_local, /* [rows, L, d] */
                               par_comm *cp, par_cp_traffic *traffic)
{
    const int64_t rows = sv->rows, L = sv->L, D = sv->D, Dh = sv->Dh, d = sv->dm.d, W_ = Dh + L;
    size_t nh = (size_t)(rows * D * d);
    par_real *hb = par_malloc(2 * nh * sizeof(par_real) + 1, PAR_TAG_COMM);
    if (!hb)
        return par_err(PAR_ENOMEM, "context parallel attention: halo buffers of %zu reals", 2 * nh);
    par_real *hs = hb, *hr = hb + nh;
    for (int64_t b = 0; b < rows; b++)
        memcpy(hs + b * D * d, x_local + (b * L + L - D) * d, (size_t)(D * d) * sizeof(par_real));
    par_status st = shift_exchange(cp, hs, hr, nh, +1, TAG_HALO_FWD);
#if PAR_FAULT_CP_HALO_SHORT
    /* Deliberate fault (meson -Dfault=cp_halo_short; docs/matrix.md "Fault
     * demonstration"): the halo one row short at the boundary, its last
     * row (the previous rank's last token) left zero. */
    if (!st && Dh > 0)
        for (int64_t b = 0; b < rows; b++) {
            memcpy(sv->xw + b * W_ * d, hr + b * D * d, (size_t)((D - 1) * d) * sizeof(par_real));
            memset(sv->xw + (b * W_ + D - 1) * d, 0, (size_t)d * sizeof(par_real));
        }
#else
    if (!st && Dh > 0)
        for (int64_t b = 0; b < rows; b++)
            memcpy(sv->xw + b * W_ * d, hr + b * D * d, (size_t)(D * d) * sizeof(par_real));
#endif
    par_free(hb);
    if (!st && traffic && sv->rank + 1 < sv->cp)
        traffic->halo_fwd += (int64_t)(nh * sizeof(par_real));
    return st;
}

/* (1) projections on halo + local rows; halo q rows cleared (no queries of
 * this rank: they must contribute nothing in the backward); (2) entries of
 * blocks whose last token is local. */
static void local_projections(PAR_FN(par_cp_attn_saved) *sv, const PAR_FN(par_attn_weights) *W)
{
    const par_attn_dims *dm = &sv->dm;
    const int64_t rows = sv->rows, Dh = sv->Dh, W_ = Dh + sv->L, d = dm->d, m = dm->m;
    const int64_t HD = dm->H * dm->hd, ihd = m == 4 ? dm->ihd : 0;
    for (int64_t b = 0; b < rows; b++) {
        PAR_FN(par_attn_saved) sh;
        const int32_t *pb = row_view(&sh, sv, b);
        PAR_FN(par_attn_proj_forward)(&sh, sv->xw + b * W_ * d, pb, W, dm, W_);
        memset(sh.q, 0, (size_t)(Dh * HD) * sizeof(par_real));
        if (sv->tp.comm && m == 4) { /* TP: the indexer weights with the layer's scale (tp_attn.c project) */
            PAR_FN(par_linear_forward)(sh.iw, sv->xw + b * W_ * d, W->idx_weights_proj, W_, d, dm->iH);
            const par_real sc = (par_real)(1.0 / sqrt((double)dm->ihd) / sqrt((double)sv->iH_full));
            for (int64_t e = 0; e < W_ * dm->iH; e++)
                sh.iw[e] *= sc;
        }
    }
    for (int64_t b = 0; b < rows && m > 0; b++) {
        PAR_FN(par_attn_saved) sh;
        const int32_t *pb = row_view(&sh, sv, b);
        PAR_FN(par_compress_forward)(sh.cmp, sh.cmp_raw, sh.cmp_rstd, sh.ca, sh.cz, pb, W->cmp_norm, dm->rope,
                                     Dh, W_, dm->hd, m, dm->norm_eps);
        if (m == 4)
            PAR_FN(par_compress_forward)(sh.icmp, sh.icmp_raw, sh.icmp_rstd, sh.ica, sh.icz, pb,
                                         W->idx_cmp_norm, dm->rope, Dh, W_, ihd, 4, dm->norm_eps);
    }
}

/* Rank q's entries (cmp, then icmp for m == 4, per entry row) between the
 * saved state and a packed buffer: to_buf 1 copies them out, 0 back in. */
static void entries_copy(PAR_FN(par_cp_attn_saved) *sv, par_real *buf, int64_t q, int to_buf)
{
    const int64_t hd = sv->dm.hd, m = sv->dm.m, ihd = m == 4 ? sv->dm.ihd : 0, ew = hd + ihd;
    const int64_t S = sv->S, L = sv->L;
    for (int64_t b = 0; b < sv->rows; b++)
        for (int64_t t = b * S + q * L; t < b * S + (q + 1) * L; t++) {
            if (!is_entry(sv->pos[t], m))
                continue;
            if (to_buf) {
                memcpy(buf, sv->ecmp + t * hd, (size_t)hd * sizeof(par_real));
                if (ihd)
                    memcpy(buf + hd, sv->eicmp + t * ihd, (size_t)ihd * sizeof(par_real));
            } else {
                memcpy(sv->ecmp + t * hd, buf, (size_t)hd * sizeof(par_real));
                if (ihd)
                    memcpy(sv->eicmp + t * ihd, buf + hd, (size_t)ihd * sizeof(par_real));
            }
            buf += ew;
        }
}

/* All-gather the entries: every rank's local ones into every rank's rows. */
static par_status gather_entries(PAR_FN(par_cp_attn_saved) *sv, par_comm *cp, par_cp_traffic *traffic)
{
    const int64_t ncp = sv->cp, r = sv->rank, m = sv->dm.m;
    const int64_t ew = sv->dm.hd + (m == 4 ? sv->dm.ihd : 0);
    size_t *cnt = par_malloc(2 * (size_t)ncp * sizeof(size_t), PAR_TAG_COMM);
    if (!cnt)
        return par_err(PAR_ENOMEM, "context parallel attention: %lld counts", LL(ncp));
    size_t *dsp = cnt + ncp, tot = 0;
    for (int64_t q = 0; q < ncp; q++) {
        cnt[q] = (size_t)(entries_of(sv->pos, sv->rows, sv->S, sv->L, q, m) * ew);
        dsp[q] = tot;
        tot += cnt[q];
    }
    par_status st = PAR_OK;
    par_real *eb = tot ? par_malloc(tot * sizeof(par_real), PAR_TAG_COMM) : NULL;
    if (tot && !eb)
        st = par_err(PAR_ENOMEM, "context parallel attention: entry buffer of %zu reals", tot);
    else if (tot) {
        entries_copy(sv, eb + dsp[r], r, 1);
        st = par_allgatherv(cp, eb + dsp[r], cnt[r], eb, cnt, dsp, CP_CTYPE);
        for (int64_t q = 0; q < ncp && !st; q++)
            if (q != r)
                entries_copy(sv, eb + dsp[q], q, 0);
        if (!st && traffic)
            traffic->gather_fwd += (int64_t)(cnt[r] * sizeof(par_real));
    }
    par_free(eb);
    par_free(cnt);
    return st;
}

typedef struct {
    const PAR_FN(par_attn_saved) *sh;
    const int32_t *pb;
    const par_attn_dims *dm;
    int64_t nv, l0, l1;
} tp_chain_ctx;

static void tp_add_heads(void *ctx, par_real *acc)
{
    const tp_chain_ctx *c = ctx;
    PAR_FN(par_indexer_scores)(acc, c->nv, c->sh->iq, c->sh->iw, c->sh->icmp, c->pb, c->dm, c->l0, c->l1);
}

/* TP x CP: the indexer of one row's local queries with its heads over the TP
 * group: the scores chained in head order, top-k on the last TP rank, the
 * picks broadcast (tp_attn.c select_entries on a query range). */
static par_status tp_select(const PAR_FN(par_cp_attn_saved) *sv, PAR_FN(par_attn_saved) *sh, const int32_t *pb,
                            int64_t l0, int64_t l1)
{
    const int64_t nv = PAR_FN(par_indexer_max_visible)(pb, l0, l1), P = par_tp_size(&sv->tp);
    const size_t n = (size_t)((l1 - l0) * nv);
    par_real *acc = par_calloc(n + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!acc)
        return par_err(PAR_ENOMEM, "context x tensor parallel attention: %zu indexer scores", n);
    tp_chain_ctx c = {sh, pb, &sv->dm, nv, l0, l1};
    par_status st = PAR_FN(par_tp_reduce_chain)(&sv->tp, acc, n, tp_add_heads, &c);
    if (!st && par_tp_rank(&sv->tp) == P - 1)
        st = PAR_FN(par_indexer_topk)(sh->sel, acc, nv, pb, &sv->dm, l0, l1);
    if (!st)
        st = PAR_FN(par_tp_reduce_bcast_i32)(&sv->tp, sh->sel + l0 * sv->dm.topk, (size_t)((l1 - l0) * sv->dm.topk),
                                       (int)P - 1);
    par_free(acc);
    return st;
}

/* (3) indexer, (4) core, (5) output for the local queries of every row
 * (TP: the shard's groups, then the sum over TP). */
static par_status local_queries(PAR_FN(par_cp_attn_saved) *sv, par_real *y_local, /* [rows, L, d] */
                                int32_t *selected_local,                       /* [rows, L, topk] or NULL */
                                const PAR_FN(par_attn_weights) *W)
{
    const par_attn_dims *dm = &sv->dm;
    const int64_t L = sv->L, d = dm->d, HD = dm->H * dm->hd, GL = dm->o_groups * dm->o_lora;
    const int64_t Dh = sv->Dh, W_ = Dh + L; /* the local queries: window rows [Dh, W_) */
    par_status st;
    for (int64_t b = 0; b < sv->rows; b++) {
        PAR_FN(par_attn_saved) sh;
        const int32_t *pb = row_view(&sh, sv, b);
        if (dm->m == 4) {
            if ((st = sv->tp.comm ? tp_select(sv, &sh, pb, Dh, W_)
                                  : PAR_FN(par_indexer_select)(sh.sel, sh.iq, sh.iw, sh.icmp, pb, dm, Dh, W_)))
                return st;
            if (selected_local)
                memcpy(selected_local + b * L * dm->topk, sh.sel + Dh * dm->topk,
                       (size_t)(L * dm->topk) * sizeof(int32_t));
        }
        if ((st = PAR_FN(par_attn_core_forward)(sh.o, sh.lse, sh.q, sh.kv, sh.cmp, sh.sel, pb, W->attn_sink, dm,
                                                Dh, W_)))
            return st;
        if (sv->tp.comm && dm->bitwise) { /* the serial GEMM's chain over the groups, rank after rank */
            par_real *yb = y_local + b * L * d;
            PAR_FN(par_attn_out_groups)(sh.r + Dh * GL, sh.o + Dh * HD, W->wo_a, dm, L);
            if ((st = PAR_FN(par_tp_reduce_linear_forward)(&sv->tp, yb, sh.r + Dh * GL, W->wo_b, L, GL, d)))
                return st;
            continue;
        }
        PAR_FN(par_attn_out_forward)(y_local + b * L * d, sh.r + Dh * GL, sh.o + Dh * HD, W->wo_a, W->wo_b, dm,
                                     L);
    }
    return sv->tp.comm && !dm->bitwise ? PAR_FN(par_tp_reduce_sum)(&sv->tp, y_local, (size_t)(sv->rows * L * d))
                                       : PAR_OK;
}

static par_status cp_forward(par_real *y_local, PAR_FN(par_cp_attn_saved) *saved, int32_t *selected_local,
                             const par_real *x_local, const int32_t *pos_rows, const PAR_FN(par_attn_weights) *W,
                             const par_attn_dims *dm, int64_t rows, int64_t L, par_comm *cp, const par_tp *tp,
                             int64_t iH_full, par_cp_traffic *traffic);

par_status PAR_FN(par_cp_attn_forward)(par_real *y_local,            /* [rows, L, d] */
                                       PAR_FN(par_cp_attn_saved) *saved,
                                       int32_t *selected_local,      /* [rows, L, topk] or NULL */
                                       const par_real *x_local,      /* [rows, L, d] */
                                       const int32_t *pos_rows,      /* [rows, S], S = L*CP */
                                       const PAR_FN(par_attn_weights) *W,
                                       const par_attn_dims *dm, int64_t rows, int64_t L,
                                       par_comm *cp, par_cp_traffic *traffic)
{
    return cp_forward(y_local, saved, selected_local, x_local, pos_rows, W, dm, rows, L, cp, NULL, dm->iH, traffic);
}

par_status PAR_FN(par_cp_attn_forward_tp)(par_real *y_local, PAR_FN(par_cp_attn_saved) *saved,
                                          int32_t *selected_local, const par_real *x_local,
                                          const int32_t *pos_rows, const PAR_FN(par_attn_weights) *Wl,
                                          const par_attn_dims *dl, int64_t iH_full, int64_t rows, int64_t L,
                                          par_comm *cp, const par_tp *tp, par_cp_traffic *traffic)
{
    return cp_forward(y_local, saved, selected_local, x_local, pos_rows, Wl, dl, rows, L, cp, tp, iH_full, traffic);
}

static par_status cp_forward(par_real *y_local, PAR_FN(par_cp_attn_saved) *saved, int32_t *selected_local,
                             const par_real *x_local, const int32_t *pos_rows, const PAR_FN(par_attn_weights) *W,
                             const par_attn_dims *dm, int64_t rows, int64_t L, par_comm *cp, const par_tp *tp,
                             int64_t iH_full, par_cp_traffic *traffic)
{
    par_status st = PAR_FN(par_attn_check_dims)(dm);
    if (st)
        return st;
    if (rows < 0 || L < 1)
        return par_err(PAR_EINVAL, "context parallel attention: rows %lld, local rows L %lld",
                       LL(rows), LL(L));
    const int64_t ncp = cp ? par_comm_size(cp) : 1, r = cp ? par_comm_rank(cp) : 0;
    const int64_t S = L * ncp, D = PAR_FN(par_cp_layer_halo)(dm);
    if ((st = PAR_FN(par_cp_check)(S, ncp, D)))
        return st;
    if ((st = check_rows(pos_rows, rows, S)))
        return st;

    PAR_FN(par_cp_attn_saved) sv;
    if ((st = saved_alloc(&sv, x_local, pos_rows, dm, rows, L, ncp, r, D)))
        goto fail_free_saved;
    if (tp && par_tp_size(tp) > 1)
        sv.tp = *tp;
    sv.iH_full = iH_full;
    if (cp && ncp > 1 && (st = halo_forward(&sv, x_local, cp, traffic)))
        goto fail_free_saved;
    local_projections(&sv, W);
    if (dm->m > 0 && cp && ncp > 1 && (st = gather_entries(&sv, cp, traffic)))
        goto fail_free_saved;
    if ((st = local_queries(&sv, y_local, selected_local, W)))
        goto fail_free_saved;
    PAR_FN(par_cp_attn_saved_free)(saved);
    *saved = sv;
    return PAR_OK;

fail_free_saved:
    PAR_FN(par_cp_attn_saved_free)(&sv);
    return st;
}

/* ------------------------------------------------------------------------ */
/* backward                                                                  */

/* The backward's scratch (docs/parallel.md): dO, dop, dq [rows, W_, HD];
 * Dd [rows, W_, H]; dkv [rows, W_, hd]; dca, dcz [rows, W_, nc]; dxw
 * [rows, W_, d] in window coordinates; dcmp [rows, S, hd] in row
 * coordinates (the entries of the whole row; m > 0). */
typedef struct {
    void *buf;
    par_real *dO, *dop, *dq, *Dd, *dkv, *dcmp, *dca, *dcz, *dxw;
} bwd_scratch;

/* Sizes of one saved forward (Tw = rows * W_ working rows, Tt = rows * S). */
typedef struct {
    int64_t rows, L, S, D, Dh, d, m, H, hd, HD, nc, GL, W_, l0, l1, h0, Tw, Tt, r, ncp;
} cp_geom;

static cp_geom geom_of(const PAR_FN(par_cp_attn_saved) *sv)
{
    const par_attn_dims *dm = &sv->dm;
    cp_geom g = {.rows = sv->rows, .L = sv->L, .S = sv->S, .D = sv->D, .Dh = sv->Dh, .d = dm->d, .m = dm->m,
                 .H = dm->H, .hd = dm->hd, .r = sv->rank, .ncp = sv->cp};
    g.HD = g.H * g.hd;
    g.nc = g.m > 0 ? (g.m == 4 ? 2 : 1) * g.hd : 0;
    g.GL = dm->o_groups * dm->o_lora;
    g.W_ = g.Dh + g.L;
    g.l0 = g.r * g.L;
    g.l1 = g.l0 + g.L;
    g.h0 = g.l0 - g.Dh;
    g.Tw = g.rows * g.W_;
    g.Tt = g.rows * g.S;
    return g;
}

static par_status scratch_alloc(bwd_scratch *x, const cp_geom *g)
{
    const int64_t Tw = g->Tw, Te = g->m > 0 ? g->Tt : 0;
    size_t n = (size_t)(3 * Tw * g->HD + Tw * g->H + Tw * g->hd + Te * g->hd + 2 * Tw * g->nc + Tw * g->d);
    x->buf = par_calloc(n + 1, sizeof(par_real), PAR_TAG_ACT);
    if (!x->buf)
        return par_err(PAR_ENOMEM, "context parallel attention backward: scratch of %zu reals", n);
    x->dO = x->buf;
    x->dop = x->dO + Tw * g->HD;
    x->dq = x->dop + Tw * g->HD;
    x->Dd = x->dq + Tw * g->HD;
    x->dkv = x->Dd + Tw * g->H;
    x->dcmp = x->dkv + Tw * g->hd;
    x->dca = x->dcmp + Te * g->hd;
    x->dcz = x->dca + Tw * g->nc;
    x->dxw = x->dcz + Tw * g->nc;
    return PAR_OK;
}

/* Key side of the entries of row b that lie before its working rows (rank
 * r > 0, row positions j < h0): only the local queries of j's sample see
 * them (every earlier query is zero and adds exact zeros).  The kernel runs
 * a key's queries from the key's own row on, so each such entry gets a
 * view of L + 1 rows: the entry, then the last halo row (a zero query, sel
 * -1) and the local queries, with the positions of j's sample continued
 * through the skipped rows; the additions are the serial ones in order. */
static void entries_before_window(const PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, bwd_scratch *x,
                                  const PAR_FN(par_attn_saved) *sh, int64_t b, int32_t *pv /* [L + 1] */)
{
    const par_attn_dims *dm = &sv->dm;
    const int32_t *pr = sv->pos + b * g->S;
    const int64_t z = g->Dh - 1, w = b * g->W_; /* the view's first query row: the last halo row */
    for (int64_t j = 0; j < g->h0; j++) {
        const int32_t pj = pr[j];
        if (!is_entry(pj, g->m) || pr[g->l0] != pj + (g->l0 - j)) /* no local query in j's sample */
            continue;
        pv[0] = pj;
        for (int64_t k = 1; k <= g->L; k++)
            pv[k] = (int32_t)(pr[g->l0 + k - 1] - (g->l0 - 1 - j));
        const int64_t t = b * g->S + j;
        PAR_FN(par_attn_core_backward_kv)(NULL, x->dcmp + t * g->hd, x->dop + (w + z) * g->HD,
                                          x->Dd + (w + z) * g->H, sh->lse + z * g->H, sh->q + z * g->HD,
                                          sh->kv + z * g->hd, sv->ecmp + t * g->hd,
                                          sh->sel ? sh->sel + z * dm->topk : NULL, pv, dm, 0, 1, g->L + 1);
    }
}

/* (5), (4): local queries; key gradients of the working kv rows and of the
 * entries of the row up to l1 (queries outside [l0, l1) have zero q, dop,
 * D, lse: they add exact zeros). */
static par_status query_side(const PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, bwd_scratch *x,
                             par_real *dsink, const par_real *dy_local, const PAR_FN(par_attn_weights) *W)
{
    const par_attn_dims *dm = &sv->dm;
    int32_t *pv = g->m > 0 && g->h0 > 0 ? par_malloc((size_t)(g->L + 1) * sizeof(int32_t), PAR_TAG_ACT) : NULL;
    if (g->m > 0 && g->h0 > 0 && !pv)
        return par_err(PAR_ENOMEM, "context parallel attention backward: %lld positions", LL(g->L + 1));
    par_status st = PAR_OK;
    for (int64_t b = 0; b < g->rows && !st; b++) {
        PAR_FN(par_attn_saved) sh;
        const int32_t *pb = row_view(&sh, sv, b);
        const int64_t w = b * g->W_, Dh = g->Dh, W_ = g->W_;
        if ((st = PAR_FN(par_attn_out_backward)(x->dO + (w + Dh) * g->HD, NULL, NULL, dy_local + b * g->L * g->d,
                                                sh.r + Dh * g->GL, sh.o + Dh * g->HD, W->wo_a, W->wo_b, dm, g->L)) ||
            (st = PAR_FN(par_attn_core_backward_q)(x->dq + w * g->HD, dsink, x->dop + w * g->HD, x->Dd + w * g->H,
                                                   x->dO + w * g->HD, sh.lse, sh.q, sh.kv, sh.cmp, sh.sel, pb,
                                                   W->attn_sink, dm, Dh, W_)))
            break;
        PAR_FN(par_attn_core_backward_kv)(x->dkv + w * g->hd, NULL, x->dop + w * g->HD, x->Dd + w * g->H, sh.lse,
                                          sh.q, sh.kv, sh.cmp, sh.sel, pb, dm, 0, W_, W_);
        if (g->m > 0) {
            PAR_FN(par_attn_core_backward_kv)(NULL, x->dcmp + (b * g->S + g->h0) * g->hd, x->dop + w * g->HD,
                                              x->Dd + w * g->H, sh.lse, sh.q, sh.kv, sh.cmp, sh.sel, pb, dm, 0, W_,
                                              W_);
            entries_before_window(sv, g, x, &sh, b, pv);
        }
    }
    par_free(pv);
    return st;
}

/* Entry gradients to their owners: block q of the reduce-scatter holds the
 * entries whose last token is on rank q (rows, then positions), padded to
 * the largest block; summed in rank order 0..CP-1 (parallel/reduce/reduce_sum.h). */
static par_status entries_to_owners(const PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, par_real *dcmp,
                                    par_comm *cp, par_cp_traffic *traffic)
{
    int64_t maxe = 0;
    for (int64_t q = 0; q < g->ncp; q++) {
        int64_t e = entries_of(sv->pos, g->rows, g->S, g->L, q, g->m);
        maxe = e > maxe ? e : maxe;
    }
    if (maxe == 0)
        return PAR_OK;
    const size_t blk = (size_t)(maxe * g->hd);
    par_real *rb = par_calloc(blk * (size_t)(g->ncp + 1), sizeof(par_real), PAR_TAG_COMM);
    if (!rb)
        return par_err(PAR_ENOMEM, "context parallel attention backward: entry gradients of %zu reals",
                       blk * (size_t)(g->ncp + 1));
    par_real *mine = rb + blk * (size_t)g->ncp;
    /* the bitwise mode: dcmp's order-free accumulator packed (folds, not values) behind rb */
    const par_racc_view src = par_racc_lookup(dcmp, (size_t)(g->Tt * g->hd));
    par_racc acc = {0};
    par_status st = src.acc ? par_racc_init(&acc, blk * (size_t)g->ncp) : PAR_OK;
    if (!st && src.acc && (st = par_racc_register(rb, blk * (size_t)g->ncp, sizeof(par_real), &acc)))
        par_racc_free(&acc);
    if (st) {
        par_free(rb);
        return st;
    }
    for (int64_t q = 0; q < g->ncp; q++) {
        par_real *w = rb + blk * (size_t)q;
        for (int64_t b = 0; b < g->rows; b++)
            for (int64_t t = b * g->S + q * g->L; t < b * g->S + (q + 1) * g->L; t++)
                if (is_entry(sv->pos[t], g->m)) {
                    if (src.acc)
                        par_racc_copy(&acc, (size_t)(w - rb), src.acc, src.at + (size_t)(t * g->hd), (size_t)g->hd);
                    else
                        memcpy(w, dcmp + t * g->hd, (size_t)g->hd * sizeof(par_real));
                    w += g->hd;
                }
    }
    par_field f = PAR_FIELD(rb, blk * (size_t)g->ncp, CP_CTYPE);
    st = par_reduce_fields(cp, &f, 1, mine);
    if (src.acc) {
        par_racc_unregister(rb);
        par_racc_free(&acc);
    }
    if (!st) {
        const par_real *rd = mine;
        for (int64_t b = 0; b < g->rows; b++)
            for (int64_t t = b * g->S + g->l0; t < b * g->S + g->l1; t++)
                if (is_entry(sv->pos[t], g->m)) {
                    memcpy(dcmp + t * g->hd, rd, (size_t)g->hd * sizeof(par_real));
                    rd += g->hd;
                }
        if (traffic)
            traffic->rs_bwd += (int64_t)(blk * (size_t)g->ncp * sizeof(par_real));
    }
    par_free(rb);
    return st;
}

/* Copies the working rows of every row of a (width w; rows of `stride`
 * tokens, the working rows from `first`) into k ([rows, W_, w]). */
static void keep_window(par_real *k, const par_real *a, int64_t w, int64_t stride, int64_t first, const cp_geom *g)
{
    for (int64_t b = 0; b < g->rows; b++)
        memcpy(k + b * g->W_ * w, a + (b * stride + first) * w, (size_t)(g->W_ * w) * sizeof(par_real));
}

static par_status keep_alloc(PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g)
{
    par_free(sv->kbuf);
    size_t rw = (size_t)(g->rows * g->W_);
    const size_t nq = sv->tp.comm && sv->dm.bitwise ? rw * (size_t)sv->dm.q_lora : 0; /* kdqr */
    sv->kbuf = par_malloc((rw * (size_t)(g->HD + 2 * g->hd + 2 * g->nc) + nq) * sizeof(par_real) + 1, PAR_TAG_ACT);
    if (!sv->kbuf)
        return par_err(PAR_ENOMEM, "context parallel attention backward: %zu rows kept for the weight pass", rw);
    sv->kq = sv->kbuf;
    sv->kkv = sv->kq + rw * (size_t)g->HD;
    sv->kcmp = sv->kkv + rw * (size_t)g->hd;
    sv->kca = g->nc ? sv->kcmp + rw * (size_t)g->hd : NULL;
    sv->kcz = g->nc ? sv->kca + rw * (size_t)g->nc : NULL;
    sv->kdqr = nq ? sv->kcmp + rw * (size_t)(g->hd + 2 * g->nc) : NULL;
    if (nq)
        memset(sv->kdqr, 0, nq * sizeof(par_real));
    return PAR_OK;
}

/* The compressor's gradients that reach into my halo rows (blocks of my
 * entries starting on rank r-1) go to r-1, which adds them to its last D
 * rows (one block writes each slot: x + 0, exact); mine are then zero. */
static par_status bw_dcz_halo(const cp_geom *g, bwd_scratch *x, par_comm *cp)
{
    const int64_t D = g->D, nc = g->nc, W_ = g->W_;
    const size_t nh = (size_t)(g->rows * D * 2 * nc);
    if (!cp || nc == 0 || nh == 0)
        return PAR_OK;
    par_real *hb = par_calloc(2 * nh + 1, sizeof(par_real), PAR_TAG_COMM);
    if (!hb)
        return par_err(PAR_ENOMEM, "context parallel attention backward (bitwise): %zu reals of halo", 2 * nh);
    par_real *hs = hb, *hr = hb + nh;
    for (int64_t b = 0; g->Dh > 0 && b < g->rows; b++) {
        memcpy(hs + b * D * 2 * nc, x->dca + b * W_ * nc, (size_t)(D * nc) * sizeof(par_real));
        memcpy(hs + (b * D * 2 + D) * nc, x->dcz + b * W_ * nc, (size_t)(D * nc) * sizeof(par_real));
        memset(x->dca + b * W_ * nc, 0, (size_t)(D * nc) * sizeof(par_real));
        memset(x->dcz + b * W_ * nc, 0, (size_t)(D * nc) * sizeof(par_real));
    }
    par_status st = shift_exchange(cp, hs, hr, nh, -1, TAG_BW_DCZ);
    for (int64_t b = 0; !st && g->r + 1 < g->ncp && b < g->rows; b++)
        for (int64_t i = 0; i < D * nc; i++) {
            x->dca[(b * W_ + W_ - D) * nc + i] += hr[b * D * 2 * nc + i];
            x->dcz[(b * W_ + W_ - D) * nc + i] += hr[(b * D * 2 + D) * nc + i];
        }
    par_free(hb);
    return st;
}

/* (2) backward on owned blocks (da/dz reach into the halo); in the bitwise
 * mode the halo rows' da/dz go to their owner (bw_dcz_halo); then the weight
 * pass's inputs kept. */
static par_status compress_keep(PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, bwd_scratch *x,
                                const PAR_FN(par_attn_weights) *W, par_comm *cp)
{
    const par_attn_dims *dm = &sv->dm;
    par_status st;
    for (int64_t b = 0; b < g->rows && g->m > 0; b++) {
        PAR_FN(par_attn_saved) sh;
        const int32_t *pb = row_view(&sh, sv, b);
        const int64_t w = b * g->W_;
        if ((st = PAR_FN(par_compress_backward)(x->dca + w * g->nc, x->dcz + w * g->nc, NULL,
                                                x->dcmp + (b * g->S + g->h0) * g->hd, sh.cmp_raw, sh.cmp_rstd, sh.ca,
                                                sh.cz, pb, W->cmp_norm, dm->rope, g->Dh, g->W_, g->hd, g->m)))
            return st;
    }
    if ((dm->bitwise && g->m > 0 && (st = bw_dcz_halo(g, x, cp))) || (st = keep_alloc(sv, g)))
        return st;
    keep_window(sv->kq, x->dq, g->HD, g->W_, 0, g);
    keep_window(sv->kkv, x->dkv, g->hd, g->W_, 0, g);
    if (g->m > 0) {
        keep_window(sv->kcmp, x->dcmp, g->hd, g->S, g->h0, g);
        keep_window(sv->kca, x->dca, g->nc, g->W_, 0, g);
        keep_window(sv->kcz, x->dcz, g->nc, g->W_, 0, g);
    }
    return PAR_OK;
}

/* compress_keep, then (1) for dx on rows [first, first + n) of each row's
 * working rows: halo + local (n = W_), or, in the bitwise mode, the local
 * rows only (their gradients are complete: no halo exchange of dx). */
/* The bitwise mode under TP, row b's local rows: dqr = dqb wq_b over all
 * heads (the serial GEMM's chain over the ranks' heads; kept complete for
 * the weight pass), then the rest of (1) once with complete inputs. */
static par_status bw_proj_tp(PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, bwd_scratch *x, int want_dx,
                             const PAR_FN(par_attn_weights) *W, int64_t b)
{
    const par_attn_dims *dm = &sv->dm;
    const int64_t first = g->Dh, n = g->L, ql = dm->q_lora, w = b * g->W_ + first;
    PAR_FN(par_attn_saved) sh, sl;
    const int32_t *pb = row_view(&sh, sv, b);
    saved_shift(&sl, &sh, first, dm);
    par_real *dqb = par_calloc((size_t)(n * g->HD + 1), sizeof *dqb, PAR_TAG_ACT);
    if (!dqb)
        return par_err(PAR_ENOMEM, "context x tensor parallel attention backward: %lld query rows", LL(n));
    PAR_FN(par_attn_proj_backward_dqb)(dqb, x->dq + w * g->HD, &sl, pb + first, dm, n);
    par_real *dqr = sv->kdqr + w * ql;
    par_status st = PAR_FN(par_tp_reduce_linear_din)(&sv->tp, dqr, dqb, sl.qr, W->wq_b, n, ql, g->HD);
    PAR_FN(par_attn_weights) none;
    memset(&none, 0, sizeof none);
    if (!st) {
        st = PAR_FN(par_attn_proj_backward_rest)(want_dx ? x->dxw + w * g->d : NULL, &none, dqr, x->dkv + w * g->hd,
                                                 g->m > 0 ? x->dca + w * g->nc : NULL,
                                                 g->m > 0 ? x->dcz + w * g->nc : NULL, &sl, sv->xw + w * g->d,
                                                 pb + first, W, dm, n);
    }
    par_free(dqb);
    return st;
}

static par_status proj_side(PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, bwd_scratch *x, int want_dx,
                            const PAR_FN(par_attn_weights) *W, par_comm *cp)
{
    const par_attn_dims *dm = &sv->dm;
    const int64_t first = dm->bitwise ? g->Dh : 0, n = g->W_ - first;
    par_status st = compress_keep(sv, g, x, W, cp);
    for (int64_t b = 0; !st && sv->kdqr && b < g->rows; b++)
        st = bw_proj_tp(sv, g, x, want_dx, W, b);
    for (int64_t b = 0; !st && !sv->kdqr && b < g->rows && want_dx; b++) {
        PAR_FN(par_attn_saved) sh, sl;
        const int32_t *pb = row_view(&sh, sv, b);
        const int64_t w = b * g->W_ + first;
        saved_shift(&sl, &sh, first, dm);
        st = PAR_FN(par_attn_proj_backward)(x->dxw + w * g->d, NULL, x->dq + w * g->HD, x->dkv + w * g->hd,
                                            g->m > 0 ? x->dca + w * g->nc : NULL, g->m > 0 ? x->dcz + w * g->nc : NULL,
                                            &sl, sv->xw + w * g->d, pb + first, W, dm, n);
    }
    return st;
}

/* dx: own contribution first, then the halo gradients of rank r+1 on my
 * last D rows; my halo rows' gradients go to rank r-1. */
static par_status dx_assemble(const cp_geom *g, const par_real *dxw, par_real *dx_local, par_comm *cp,
                              par_cp_traffic *traffic)
{
    const int64_t d = g->d, D = g->D, L = g->L;
    for (int64_t b = 0; b < g->rows; b++)
        for (int64_t e = 0; e < L * d; e++)
            dx_local[b * L * d + e] += dxw[(b * g->W_ + g->Dh) * d + e];
    if (!cp || g->ncp <= 1)
        return PAR_OK;
    size_t nh = (size_t)(g->rows * D * d);
    par_real *hb = par_malloc(2 * nh * sizeof(par_real) + 1, PAR_TAG_COMM);
    if (!hb)
        return par_err(PAR_ENOMEM, "context parallel attention backward: halo of %zu reals", 2 * nh);
    par_real *hs = hb, *hr = hb + nh;
    if (g->Dh > 0)
        for (int64_t b = 0; b < g->rows; b++)
            memcpy(hs + b * D * d, dxw + b * g->W_ * d, (size_t)(D * d) * sizeof(par_real));
    par_status st = shift_exchange(cp, hs, hr, nh, -1, TAG_HALO_BWD);
#if PAR_FAULT_CP_HALO_GRAD_DROP
    /* Deliberate fault (meson -Dfault=cp_halo_grad_drop; docs/matrix.md
     * "Fault demonstration"): the halo gradient of the row next to the
     * boundary (this rank's last token) is dropped.  The forward is exact;
     * the input gradients of every attention layer, and so the weight
     * gradients below it, are not. */
    const int64_t D_add = D - 1;
#else
    const int64_t D_add = D;
#endif
    if (!st && g->r + 1 < g->ncp)
        for (int64_t b = 0; b < g->rows; b++) {
            par_real *dst = dx_local + (b * L + L - D) * d;
            for (int64_t e = 0; e < D_add * d; e++)
                dst[e] += hr[b * D * d + e];
        }
    par_free(hb);
    if (!st && traffic && g->r > 0)
        traffic->halo_bwd += (int64_t)(nh * sizeof(par_real));
    return st;
}

/* ---- the bitwise mode (docs/bitwise.md, "Context parallelism") --------- */

/* Rows of window w0.. of arrays of widths HD, HD, H, H (q, dop, Dd, lse)
 * packed into / out of buf, n rows. */
static void bw_rows(par_real *buf, par_real *q, par_real *dop, par_real *Dd, par_real *lse, int64_t n,
                    const cp_geom *g, int out)
{
    const int64_t HD = g->HD, H = g->H, per = 2 * HD + 2 * H;
    for (int64_t i = 0; i < n; i++) {
        par_real *r = buf + i * per;
        par_real *dst[4] = {q + i * HD, dop + i * HD, Dd + i * H, lse + i * H};
        const int64_t wd[4] = {HD, HD, H, H};
        for (int k = 0, o = 0; k < 4; o += (int)wd[k], k++)
            memcpy(out ? dst[k] : r + o, out ? r + o : dst[k], (size_t)wd[k] * sizeof(par_real));
    }
}

/* The keys of this rank's local rows get the gradient of EVERY query that
 * sees them, in the serial kernel's order: rank r+1's first D query rows
 * (q, dop, D, lse) come here, appended to each row's window, and the key
 * side runs on the local keys over the extended queries.  The halo keys are
 * left to their owner (zero here). */
typedef struct {
    const PAR_FN(par_cp_attn_saved) *sv;
    const cp_geom *g;
    bwd_scratch *x;
    const par_real *hr; /* rank r+1's query rows, or NULL */
    par_real *e;        /* [W_ + D rows] of q, dop, D, lse: the extended window */
} keys_link;

/* Every row's local keys over its extended queries (into dkv as given: a
 * TP rank continues the previous one's sums with its heads). */
static void keys_add(void *ctx, par_real *dkv)
{
    const keys_link *k = ctx;
    const cp_geom *g = k->g;
    const int64_t D = g->D, W_ = g->W_, HD = g->HD, H = g->H, per = 2 * HD + 2 * H, nw = W_ + (k->hr ? D : 0);
    par_real *eq = k->e, *edop = eq + nw * HD, *eD = edop + nw * HD, *lse_e = eD + nw * H;
    for (int64_t b = 0; b < g->rows; b++) {
        const int64_t w = b * W_;
        memcpy(eq, k->sv->s.q + w * HD, (size_t)(W_ * HD) * sizeof(par_real));
        memcpy(edop, k->x->dop + w * HD, (size_t)(W_ * HD) * sizeof(par_real));
        memcpy(eD, k->x->Dd + w * H, (size_t)(W_ * H) * sizeof(par_real));
        memcpy(lse_e, k->sv->s.lse + w * H, (size_t)(W_ * H) * sizeof(par_real));
        if (k->hr)
            bw_rows((par_real *)(uintptr_t)(k->hr + b * D * per), eq + W_ * HD, edop + W_ * HD, eD + W_ * H,
                    lse_e + W_ * H, D, g, 1);
        PAR_FN(par_attn_core_backward_kv)(dkv + w * g->hd, NULL, edop, eD, lse_e, eq, k->sv->s.kv + w * g->hd, NULL,
                                          NULL, k->sv->pos + b * g->S + g->h0, &k->sv->dm, g->Dh, W_, nw);
    }
}

static par_status bw_keys(const PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, bwd_scratch *x, par_comm *cp)
{
    const int64_t D = g->D, W_ = g->W_, HD = g->HD, H = g->H, per = 2 * HD + 2 * H;
    const int next = cp && g->r + 1 < g->ncp;
    const int64_t ne = next ? D : 0, nw = W_ + ne;
    const size_t nh = (size_t)(g->rows * D * per);
    par_real *hb = par_calloc(2 * nh + (size_t)(nw * per) + 1, sizeof(par_real), PAR_TAG_COMM);
    if (!hb)
        return par_err(PAR_ENOMEM, "context parallel attention backward (bitwise): %zu reals of query halo", 2 * nh);
    par_real *hs = hb, *hr = hb + nh;
    for (int64_t b = 0; g->Dh > 0 && b < g->rows; b++) { /* my first D local rows, to r-1 */
        const int64_t w = b * W_ + g->Dh;
        bw_rows(hs + b * D * per, sv->s.q + w * HD, x->dop + w * HD, x->Dd + w * H, sv->s.lse + w * H, D, g, 0);
    }
    par_status st = cp ? shift_exchange(cp, hs, hr, nh, -1, TAG_BW_QUERIES) : PAR_OK;
    keys_link k = {sv, g, x, next ? hr : NULL, hr + nh};
    const size_t nk = (size_t)(g->Tw * g->hd);
    memset(x->dkv, 0, nk * sizeof(par_real));
    if (!st && !sv->tp.comm)
        keys_add(&k, x->dkv);
    else if (!st) /* the heads in rank order */
        st = PAR_FN(par_tp_reduce_chain_bcast)(&sv->tp, x->dkv, nk, keys_add, &k);
    par_free(hb);
    return st;
}

/* The bitwise mode's dcmp: backed by an order-free accumulator for the key
 * side (the kernels deposit a term per query and head), merged over CP by
 * entries_to_owners. */
static par_status bw_open(const cp_geom *g, bwd_scratch *x, par_racc *acc)
{
    const size_t n = (size_t)(g->Tt * g->hd);
    par_status st = g->m > 0 && n ? par_racc_init(acc, n) : PAR_OK;
    if (!st && g->m > 0 && n && (st = par_racc_register(x->dcmp, n, sizeof(par_real), acc)))
        par_racc_free(acc);
    return st;
}

static void bw_close(bwd_scratch *x, par_racc *acc)
{
    if (!acc->n)
        return;
    par_racc_unregister(x->dcmp);
    par_racc_free(acc);
}

/* The backward's input half in the bitwise mode (the same steps as below,
 * with bw_keys, bw_proj_side and no halo exchange of dx). */
static par_status bw_backward_input(PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, bwd_scratch *x, par_real *dxp,
                                    par_real *dsink, const par_real *dy_local, const PAR_FN(par_attn_weights) *W,
                                    par_comm *cp, par_cp_traffic *traffic)
{
    par_racc acc = {0};
    par_status st = bw_open(g, x, &acc);
    if (!st && !(st = query_side(sv, g, x, dsink, dy_local, W)) && !(st = bw_keys(sv, g, x, cp)) &&
        !(st = g->m > 0 && sv->tp.comm ? PAR_FN(par_tp_reduce_sum)(&sv->tp, x->dcmp, (size_t)(g->Tt * g->hd))
                                       : PAR_OK) && /* the entries' terms merged over TP's heads, then CP's queries */
        !(st = g->m > 0 && cp && g->ncp > 1 ? entries_to_owners(sv, g, x->dcmp, cp, traffic) : PAR_OK) &&
        !(st = proj_side(sv, g, x, dxp != NULL, W, cp)) && dxp)
        for (int64_t b = 0; b < g->rows; b++)
            for (int64_t e = 0; e < g->L * g->d; e++)
                dxp[b * g->L * g->d + e] += x->dxw[(b * g->W_ + g->Dh) * g->d + e];
    bw_close(x, &acc);
    return st;
}

par_status PAR_FN(par_cp_attn_backward_input)(par_real *dx_local, par_real *dsink, const par_real *dy_local,
                                              PAR_FN(par_cp_attn_saved) *saved, const PAR_FN(par_attn_weights) *W,
                                              par_comm *cp, par_cp_traffic *traffic)
{
    PAR_FN(par_cp_attn_saved) *sv = saved;
    if (!sv || !sv->buf)
        return par_err(PAR_EINVAL, "context parallel attention backward: no saved forward");
    const int64_t ncp = cp ? par_comm_size(cp) : 1, r = cp ? par_comm_rank(cp) : 0;
    if (ncp != sv->cp || r != sv->rank)
        return par_err(PAR_EMISMATCH,
                       "context parallel attention backward: group has rank %lld of %lld, the "
                       "forward ran as rank %lld of %lld",
                       LL(r), LL(ncp), LL(sv->rank), LL(sv->cp));
    const cp_geom g = geom_of(sv);
    bwd_scratch x;
    memset(&x, 0, sizeof x);
    par_status st = scratch_alloc(&x, &g);
    if (st)
        return st;
    /* TP: this TP rank's share of dx assembled apart, then summed over TP */
    const size_t nx = (size_t)(g.rows * g.L * g.d);
    const int tp_sum = sv->tp.comm && !sv->dm.bitwise; /* the bitwise mode's dx is complete on every TP rank */
    par_real *dxp = tp_sum && dx_local ? par_calloc(nx + 1, sizeof(par_real), PAR_TAG_ACT) : dx_local;
    if (tp_sum && dx_local && !dxp)
        st = par_err(PAR_ENOMEM, "context x tensor parallel attention backward: dx of %zu reals", nx);
    if (!st && sv->dm.bitwise)
        st = bw_backward_input(sv, &g, &x, dx_local ? dxp : NULL, dsink, dy_local, W, cp, traffic);
    else if (!st && !(st = query_side(sv, &g, &x, dsink, dy_local, W)) &&
             !(st = g.m > 0 && cp && ncp > 1 ? entries_to_owners(sv, &g, x.dcmp, cp, traffic) : PAR_OK) &&
             !(st = proj_side(sv, &g, &x, dx_local != NULL, W, cp)) && dx_local)
        st = dx_assemble(&g, x.dxw, dxp, cp, traffic);
    if (!st && dxp != dx_local && !(st = PAR_FN(par_tp_reduce_sum)(&sv->tp, dxp, nx)))
        for (size_t e = 0; e < nx; e++)
            dx_local[e] += dxp[e];
    if (dxp != dx_local)
        par_free(dxp);
    par_free(x.buf);
    return st;
}

/* The weight pass's (1) in the bitwise mode under TP: wq_b's terms from
 * the rank's heads, the rest from the input pass's complete dqr. */
static par_status bw_weights_tp(PAR_FN(par_cp_attn_saved) *sv, const cp_geom *g, PAR_FN(par_attn_weights) *gw,
                                const PAR_FN(par_attn_saved) *sh, const int32_t *pb, const PAR_FN(par_attn_weights) *W,
                                int64_t b)
{
    const par_attn_dims *dm = &sv->dm;
    const int64_t k = b * g->W_, n = g->W_, ql = dm->q_lora;
    par_real *dqb = par_calloc((size_t)(n * g->HD + 1), sizeof *dqb, PAR_TAG_ACT);
    if (!dqb)
        return par_err(PAR_ENOMEM, "context x tensor parallel attention weights: %lld query rows", LL(n));
    PAR_FN(par_attn_proj_backward_dqb)(dqb, sv->kq + k * g->HD, sh, pb, dm, n);
    PAR_FN(par_linear_backward)(NULL, gw->wq_b, dqb, sh->qr, W->wq_b, n, ql, g->HD);
    par_free(dqb);
    return PAR_FN(par_attn_proj_backward_rest)(NULL, gw, sv->kdqr + k * ql, sv->kkv + k * g->hd,
                                               g->m > 0 ? sv->kca + k * g->nc : NULL,
                                               g->m > 0 ? sv->kcz + k * g->nc : NULL, sh, sv->xw + k * g->d, pb, W,
                                               dm, n);
}

par_status PAR_FN(par_cp_attn_backward_weights)(PAR_FN(par_attn_weights) *dW, const par_real *dy_local,
                                                PAR_FN(par_cp_attn_saved) *saved, const PAR_FN(par_attn_weights) *W)
{
    PAR_FN(par_cp_attn_saved) *sv = saved;
    if (!sv || !sv->kbuf)
        return par_err(PAR_EINVAL, "context parallel attention: weight pass without its input pass");
    const par_attn_dims *dm = &sv->dm;
    const cp_geom g = geom_of(sv);
    par_status st = PAR_OK;
    PAR_FN(par_attn_weights) gw = *dW;
    gw.attn_sink = NULL; /* the input half's */
    for (int64_t b = 0; b < g.rows && !st; b++) {
        PAR_FN(par_attn_saved) sh;
        row_view(&sh, sv, b);
        st = PAR_FN(par_attn_out_backward)(NULL, gw.wo_a, gw.wo_b, dy_local + b * g.L * g.d, sh.r + g.Dh * g.GL,
                                           sh.o + g.Dh * g.HD, W->wo_a, W->wo_b, dm, g.L);
    }
    for (int64_t b = 0; b < g.rows && !st; b++) {
        PAR_FN(par_attn_saved) sh;
        const int32_t *pb = row_view(&sh, sv, b);
        const int64_t k = b * g.W_;
        if (g.m > 0 && gw.cmp_norm &&
            (st = PAR_FN(par_compress_backward)(NULL, NULL, gw.cmp_norm, sv->kcmp + k * g.hd, sh.cmp_raw, sh.cmp_rstd,
                                                sh.ca, sh.cz, pb, W->cmp_norm, dm->rope, g.Dh, g.W_, g.hd, g.m)))
            break;
        st = sv->kdqr ? bw_weights_tp(sv, &g, &gw, &sh, pb, W, b)
                      : PAR_FN(par_attn_proj_backward)(NULL, &gw, sv->kq + k * g.HD, sv->kkv + k * g.hd,
                                                       g.m > 0 ? sv->kca + k * g.nc : NULL,
                                                       g.m > 0 ? sv->kcz + k * g.nc : NULL, &sh, sv->xw + k * g.d, pb,
                                                       W, dm, g.W_);
    }
    par_free(sv->kbuf);
    sv->kbuf = NULL;
    sv->kq = sv->kkv = sv->kcmp = sv->kca = sv->kcz = sv->kdqr = NULL;
    return st;
}

par_status PAR_FN(par_cp_attn_backward)(par_real *dx_local, PAR_FN(par_attn_weights) *dW, const par_real *dy_local,
                                        PAR_FN(par_cp_attn_saved) *saved, const PAR_FN(par_attn_weights) *W,
                                        par_comm *cp, par_cp_traffic *traffic)
{
    par_status st = PAR_FN(par_cp_attn_backward_input)(dx_local, dW ? dW->attn_sink : NULL, dy_local, saved, W, cp,
                                                       traffic);
    if (!st && dW)
        st = PAR_FN(par_cp_attn_backward_weights)(dW, dy_local, saved, W);
    return st;
}
