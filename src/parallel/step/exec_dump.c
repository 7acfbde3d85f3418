/* parallel/step/exec_dump.c - the golden-format dump of a parallel step: the rows
 * (activations, routing, selections, logits) every stage keeps while it
 * computes them, gathered to rank 0 in the serial layout one tensor at a
 * time and streamed into the step file (core/safetensors.h par_st_stream_*:
 * each written where the header places it, then freed), and the table
 * buffers (parameters, gradients, optimizer state) from each entry's lowest
 * pipeline holder.  Part of the step executor (parallel/step/exec-impl.h). */
#include <string.h>

#include "model/golden.h"
#include "parallel/step/exec-impl.h"
#include "parallel/layout/tp_split.h"

void PAR_FN(par__exec_keep_free)(exec_t *ex)
{
    for (int b = 0; ex->k_act && b < ex->n_blocks; b++) {
        par_free(ex->k_act[b]);
        par_free(ex->k_idx[b]);
        par_free(ex->k_sel[b]);
    }
    par_free(ex->k_act);
    par_free(ex->k_idx);
    par_free(ex->k_sel);
    par_free(ex->k_logits);
    par_free(ex->k_mtp_logits);
    ex->k_act = NULL;
    ex->k_idx = ex->k_sel = NULL;
    ex->k_logits = ex->k_mtp_logits = NULL;
}

par_status PAR_FN(par__exec_keep_alloc)(exec_t *ex, const PAR_FN(par_model) *M)
{
    if (ex->k_act)
        return PAR_OK;
    size_t R = (size_t)(ex->Bl * ex->S / ex->CP), nb = (size_t)ex->n_blocks;
    ex->k_act = par_calloc(nb, sizeof *ex->k_act, PAR_TAG_IO);
    ex->k_idx = par_calloc(nb, sizeof *ex->k_idx, PAR_TAG_IO);
    ex->k_sel = par_calloc(nb, sizeof *ex->k_sel, PAR_TAG_IO);
    if (!ex->k_act || !ex->k_idx || !ex->k_sel)
        goto fail_oom;
    for (int b = 0; b < ex->n_blocks; b++) {
        if (!ex->blocks[b])
            continue;
        ex->k_act[b] = par_calloc(R * (size_t)ex->nd, sizeof(par_real), PAR_TAG_IO);
        ex->k_idx[b] = par_calloc(R * (size_t)M->K, sizeof(int32_t), PAR_TAG_IO);
        if (!ex->k_act[b] || !ex->k_idx[b])
            goto fail_oom;
        if (par_config_ratio(&ex->cfg, b) == 4 &&
            !(ex->k_sel[b] = par_calloc(R * (size_t)ex->cfg.index_topk, sizeof(int32_t), PAR_TAG_IO)))
            goto fail_oom;
    }
    int has_l = 0, has_m = 0;
    for (int j = 0; j < ex->n_local; j++)
        for (int i = 0; i < ex->ls[j].n_items; i++) {
            has_l |= ex->ls[j].items[i] == PAR_BLK_LOSS;
            has_m |= ex->ls[j].items[i] == PAR_BLK_MTP;
        }
    if (has_l && !(ex->k_logits = par_calloc(R * (size_t)M->V, sizeof(par_real), PAR_TAG_IO)))
        goto fail_oom;
    if (has_m && !(ex->k_mtp_logits = par_calloc(R * (size_t)M->V, sizeof(par_real), PAR_TAG_IO)))
        goto fail_oom;
    return PAR_OK;
fail_oom:
    PAR_FN(par__exec_keep_free)(ex);
    return par_err(PAR_ENOMEM, "pipeline: out of memory keeping %zu rows for the dump", R);
}

#define GATHER_TAG 7402

/* Rank 0 receives n[r] elements from every rank r of c, in rank order, into
 * out (n: rank 0's, NULL elsewhere), point to point: an all-to-all-v would
 * give every rank two count arrays of the world's size at once (O(N^2) bytes
 * over a world of fibers). */
static par_status gather0(par_comm *c, const void *in, size_t n_mine, void *out, const size_t *n, par_ctype t)
{
    int N = par_comm_size(c), me = par_comm_rank(c);
    size_t es = par_ctype_size(t);
    if (me != 0)
        return n_mine ? par_send(c, in, n_mine, t, 0, GATHER_TAG) : PAR_OK;
    if (n[0] != n_mine)
        return par_err(PAR_EINTERNAL, "pipeline dump: rank 0 supplies %zu elements, %zu expected", n_mine, n[0]);
    if (n_mine)
        memcpy(out, in, n_mine * es);
    size_t at = n_mine;
    par_status s = PAR_OK;
    for (int r = 1; r < N && !s; r++) {
        if (n[r])
            s = par_recv(c, (char *)out + at * es, n[r], t, r, GATHER_TAG);
        at += n[r];
    }
    return s;
}

/* 1 when world rank r (coordinates rc) supplies entry idx to a dump. */
static int supplies(const exec_t *ex, const par_pctx *P, const PAR_FN(par_model) *M, const par_rank_coords *rc,
                    int idx)
{
    const par_param *p = &M->tab.p[idx];
    if (p->dtype != PAR_PDT_REAL || PAR_FN(par__exec_holder_pp)(ex, &M->tab, idx) != rc->pp)
        return 0;
    int64_t np;
    const int cut = par_tp_storage_cut(P->lay, p->name, &np) != PAR_TP_REPLICATED; /* a shard: each supplies its own */
    const int etp = par_tp_split_of(p->name).group == PAR_TP_GROUP_ETP;
    if (p->expert >= 0) {
        int64_t El = M->E / P->lay->ep, e0 = (int64_t)rc->ep * El;
        return rc->edp == 0 && (rc->etp == 0 || (cut && etp)) && p->expert >= e0 && p->expert < e0 + El;
    }
    return rc->dp == 0 && rc->cp == 0 && (rc->tp == 0 || cut);
}

/* Elements of entry p a rank of the layout holds (parallel/layout/tp_split.h). */
static size_t held_numel(const par_pctx *P, const par_param *p)
{
    int64_t np;
    par_tp_storage_cut(P->lay, p->name, &np);
    return (size_t)(p->numel / np);
}

/* Entry p's piece from world rank rc into the full flat buffer: whole, or
 * (a shard) unsliced into its block. */
static void place(const par_pctx *P, const par_rank_coords *rc, const par_param *p, par_real *full,
                  const par_real *src)
{
    int64_t np;
    const par_tp_cut c = par_tp_storage_cut(P->lay, p->name, &np);
    if (c == PAR_TP_REPLICATED) {
        memcpy(full + p->offset, src, (size_t)p->numel * sizeof *full);
        return;
    }
    const int r = par_tp_split_of(p->name).group == PAR_TP_GROUP_ETP ? rc->etp : rc->tp;
    par_tp_unslice(full + p->offset, src, p->shape[0], p->shape[1], c, r, (int)np, sizeof *full);
}

par_status PAR_FN(par_exec_gather_full)(exec_t *ex, const par_pctx *P, const PAR_FN(par_model) *M,
                                      const par_real *loc, par_real *full)
{
    const par_param_table *t = &M->tab;
    int N = P->N;
    par_status s = PAR_OK;
    size_t mine = 0;
    for (int i = 0; i < t->n; i++)
        if (supplies(ex, P, M, &P->rc, i))
            mine += held_numel(P, &t->p[i]);
    par_real *pack = par_malloc((mine ? mine : 1) * sizeof *pack, PAR_TAG_COMM), *recv = NULL;
    /* the world's counts and coordinates: rank 0's alone (O(N) on one rank, not on every rank) */
    size_t *cnt = P->rank == 0 ? par_calloc((size_t)N, sizeof *cnt, PAR_TAG_COMM) : NULL;
    par_rank_coords *rcs = P->rank == 0 ? par_malloc((size_t)N * sizeof *rcs, PAR_TAG_COMM) : NULL;
    if (!pack || (P->rank == 0 && (!cnt || !rcs)))
        goto fail_oom;
    size_t o = 0;
    for (int i = 0; i < t->n; i++)
        if (supplies(ex, P, M, &P->rc, i)) {
            memcpy(pack + o, PAR_FN(par_model_ptr)(M, (par_real *)loc, i), held_numel(P, &t->p[i]) * sizeof *pack);
            o += held_numel(P, &t->p[i]);
        }
    size_t total = 0;
    if (P->rank == 0) {
        for (int r = 0; r < N; r++) {
            if ((s = par_rank_coords_of(P->lay, r, &rcs[r])))
                goto done;
            for (int i = 0; i < t->n; i++)
                if (supplies(ex, P, M, &rcs[r], i))
                    cnt[r] += held_numel(P, &t->p[i]);
            total += cnt[r];
        }
        if (!(recv = par_malloc((total ? total : 1) * sizeof *recv, PAR_TAG_COMM)))
            goto fail_oom;
    }
    if ((s = gather0(P->world, pack, mine, recv, cnt, PAR_C_REAL)))
        goto done;
    if (P->rank == 0) {
        size_t at = 0;
        for (int r = 0; r < N; r++)
            for (int i = 0; i < t->n; i++)
                if (supplies(ex, P, M, &rcs[r], i)) {
                    place(P, &rcs[r], &t->p[i], full, recv + at);
                    at += held_numel(P, &t->p[i]);
                }
    }
    goto done;
fail_oom:
    s = par_err(PAR_ENOMEM, "pipeline dump: out of memory gathering %zu floats", mine);
done:
    par_free(pack);
    par_free(recv);
    par_free(cnt);
    par_free(rcs);
    return s;
}

/* Rank 0: a sender's piece [Bl, S/CP, per] (chunk bytes per row) added
 * bytewise into rows dp*Bl.. and columns cp*S/CP.. of full [B, S, per]. */
static void add_piece(unsigned char *full, const unsigned char *piece, const par_rank_coords *rc, int64_t Bl,
                      int64_t CP, size_t chunk)
{
    for (int64_t i = 0; i < Bl; i++) {
        unsigned char *d = full + ((size_t)((int64_t)rc->dp * Bl + i) * (size_t)CP + (size_t)rc->cp) * chunk;
        const unsigned char *x = piece + (size_t)i * chunk;
        for (size_t j = 0; j < chunk; j++)
            d[j] = (unsigned char)(d[j] + x[j]);
    }
}

/* Rank 0: who sends (flags[r] = 1), one byte from every rank. */
static par_status senders_to_root(const par_pctx *P, unsigned char mine, unsigned char *flags)
{
    size_t *ones = P->rank == 0 ? par_malloc((size_t)P->N * sizeof *ones, PAR_TAG_COMM) : NULL;
    if (P->rank == 0 && !ones)
        return par_err(PAR_ENOMEM, "pipeline dump: out of memory for %d ranks' flags", P->N);
    for (int r = 0; ones && r < P->N; r++)
        ones[r] = 1;
    par_status s = gather0(P->world, &mine, 1, flags, ones, PAR_C_BYTE);
    par_free(ones);
    return s;
}

/* Rank 0 receives every sender's piece in rank order and adds it into
 * place (*out, zeroed first). */
static par_status root_collect(exec_t *ex, const par_pctx *P, const unsigned char *mine, size_t n,
                               const unsigned char *flags, void **out)
{
    const size_t chunk = n / (size_t)(ex->Bl > 0 ? ex->Bl : 1);
    unsigned char *full = par_calloc(n * (size_t)(P->lay->da * ex->CP) + 1, 1, PAR_TAG_IO);
    unsigned char *piece = par_malloc(n ? n : 1, PAR_TAG_IO);
    par_status s = PAR_OK;
    if (!full || !piece)
        s = par_err(PAR_ENOMEM, "pipeline dump: out of memory for a tensor of %zu bytes",
                    n * (size_t)(P->lay->da * ex->CP));
    for (int r = 0; r < P->N && !s; r++) {
        par_rank_coords rc;
        if (!flags[r] || (s = par_rank_coords_of(P->lay, r, &rc)))
            continue;
        if (r != 0 && (s = par_recv(P->world, piece, n, PAR_C_BYTE, r, GATHER_TAG)))
            break;
        add_piece(full, r == 0 ? mine : piece, &rc, ex->Bl, ex->CP, chunk);
    }
    par_free(piece);
    if (s) {
        par_free(full);
        return s;
    }
    *out = full;
    return PAR_OK;
}

/* One kept tensor of rows [Bl*S/CP, per] (elements of esz bytes, NULL where
 * this rank computed none of it) to rank 0 as [B*S, per].  The ranks that
 * computed rows of it (the stage that holds it; DualPipe: two stages, each
 * its microbatches' rows and zero bytes elsewhere) send them, TP rank 0
 * (SP: first summed bytewise over TP, each TP rank kept its columns), and
 * rank 0 adds them bytewise into place, in rank order (exact: every byte
 * has one nonzero contributor at most).  The ranks without the tensor hold
 * nothing: they used to take part in a bytewise all-reduce over the
 * pipeline with a zeroed copy each (config-c: 8,192 ranks x 1 MiB of the
 * logits at once). */
static par_status gather_kept(exec_t *ex, const par_pctx *P, const void *kept, int64_t per, size_t esz,
                              void **out)
{
    *out = NULL;
    const size_t n = (size_t)(ex->Bl * (ex->S / ex->CP) * per) * esz;
    unsigned char *buf = NULL, *flags = NULL;
    const unsigned char *mine = kept;
    par_status s = PAR_OK;
    if (kept && ex->spn > 1) { /* SP: every TP rank of the holding stage kept its columns */
        if (!(buf = par_malloc(n ? n : 1, PAR_TAG_IO)))
            return par_err(PAR_ENOMEM, "pipeline dump: out of memory for %zu bytes", n);
        memcpy(buf, kept, n);
        par_field f = PAR_FIELD(buf, n, PAR_C_BYTE);
        if ((s = par_reduce_fields(ex->tpc, &f, 1, NULL)))
            goto done;
        mine = buf;
    }
    const int send = kept && P->rc.tp == 0;
    if (P->rank == 0 && !(flags = par_malloc((size_t)P->N, PAR_TAG_COMM))) {
        s = par_err(PAR_ENOMEM, "pipeline dump: out of memory for %d ranks' flags", P->N);
        goto done;
    }
    if ((s = senders_to_root(P, (unsigned char)send, flags)))
        goto done;
    if (P->rank == 0)
        s = root_collect(ex, P, send ? mine : NULL, n, flags, out);
    else if (send)
        s = par_send(P->world, mine, n, PAR_C_BYTE, 0, GATHER_TAG);
done:
    par_free(buf);
    par_free(flags);
    return s;
}

/* One kept tensor gathered to rank 0 and put into its stream there, then
 * freed: the dump holds one gathered tensor at a time.  *ws: rank 0's first
 * write error (the later tensors are still gathered, so that every rank
 * takes part in the same collectives). */
static par_status stream_kept(exec_t *ex, const par_pctx *P, par_st_stream *st, par_status *ws, const char *name,
                              const void *kept, int64_t per, size_t esz)
{
    void *full = NULL;
    par_status s = gather_kept(ex, P, kept, per, esz, &full);
    if (!s && P->rank == 0 && !*ws)
        *ws = par_st_stream_put(st, name, full, (size_t)(ex->B * ex->S * per) * esz);
    par_free(full);
    return s;
}

/* Every kept tensor of the step, in one order on every rank. */
static par_status stream_all_kept(exec_t *ex, const par_pctx *P, const PAR_FN(par_model) *M, par_st_stream *st,
                                  par_status *ws)
{
    const par_config *c = &ex->cfg;
    const size_t rs = sizeof(par_real);
    par_status s = stream_kept(ex, P, st, ws, "out.logits", ex->k_logits, M->V, rs);
    if (!s && c->n_mtp_layers > 0)
        s = stream_kept(ex, P, st, ws, "out.mtp_logits", ex->k_mtp_logits, M->V, rs);
    char pfx[32], name[64];
    for (int b = 0; b < ex->n_blocks && !s; b++) {
        par_golden_block_prefix(c, b, pfx, sizeof pfx);
        snprintf(name, sizeof name, "act.%s", pfx);
        s = stream_kept(ex, P, st, ws, name, ex->k_act[b], ex->nd, rs);
        snprintf(name, sizeof name, "router.%s.idx", pfx);
        if (!s)
            s = stream_kept(ex, P, st, ws, name, ex->k_idx[b], M->K, sizeof(int32_t));
        snprintf(name, sizeof name, "attn.%s.selected", pfx);
        if (!s && par_config_ratio(c, b) == 4)
            s = stream_kept(ex, P, st, ws, name, ex->k_sel[b], c->index_topk, sizeof(int32_t));
    }
    return s;
}

/* Rank 0's stream of step k: the header, the inputs, scalars, loads and
 * the gathered gradients; the kept tensors follow one by one. */
static par_status stream_open(exec_t *ex, PAR_FN(par_model) *M, const int32_t *tokens, const int32_t *segments,
                              const par_real *grads_full, const char *dir, int64_t k, par_st_writer **w,
                              par_st_stream **st)
{
    PAR_FN(par_golden_step_view) v = {
        .B = ex->B, .S = ex->S, .tokens = tokens, .segments = segments, .out = M->last,
        .loads = M->stats.loads, .grads = grads_full,
    };
    par_status s = PAR_FN(par_golden_step_writer)(&M->tab, &v, k, w);
    if (s)
        return s;
    char *path = PAR_FN(par_golden_file_path)(dir, "step", k);
    if (!path)
        return PAR_ENOMEM;
    s = par_st_stream_begin(*w, path, st);
    par_free(path);
    if (!s && (s = PAR_FN(par_golden_put_scalars)(*st, &v))) {
        par_st_stream_abort(*st);
        *st = NULL;
    }
    return s;
}

par_status PAR_FN(par_exec_dump_step)(exec_t *ex, const par_pctx *P, PAR_FN(par_model) *M,
                                    const int32_t *tokens, const int32_t *segments, par_real *grads_full,
                                    const char *dir, int64_t k)
{
    if (!ex->k_act)
        return par_err(PAR_EINVAL, "pipeline dump: the step was run without keeping its rows");
    par_status s = PAR_FN(par_exec_gather_full)(ex, P, M, M->grads, grads_full), ws = PAR_OK;
    if (s)
        return s;
    par_st_writer *w = NULL;
    par_st_stream *st = NULL;
    if (P->rank == 0)
        ws = stream_open(ex, M, tokens, segments, grads_full, dir, k, &w, &st);
    s = stream_all_kept(ex, P, M, st, &ws);
    if (P->rank == 0) {
        if (!s && !ws)
            ws = par_st_stream_commit(st);
        else
            par_st_stream_abort(st);
        par_st_writer_free(w);
    }
    return s ? s : ws;
}
