/* parallel/moe/ep_etp.c - expert tensor parallelism inside expert parallelism
 * (Megatron-LM's MoE parallel folding): the held experts of an EP rank run
 * as their I/ETP slices over the ETP group, between the EP dispatch and
 * combine (see parallel/moe/ep.h "ETP inside EP", docs/parallel.md). */
#include <string.h>

#include "core/alloc.h"
#include "parallel/moe/ep-impl.h"
#include "parallel/moe/etp.h"
#include "parallel/layout/tp_split.h"

par_status PAR_FN(par_ep_set_etp)(PAR_FN(par_ep) *x, par_comm *etp, int64_t I, int sp)
{
    const int P = etp ? par_comm_size(etp) : 1;
    if (P < 1 || I % P != 0)
        return par_err(PAR_EINVAL, "ep: expert-tensor-parallel-size %d must divide moe_inter_dim %lld", P,
                       (long long)I);
    memset(&x->etr, 0, sizeof x->etr);
    x->etp = (par_tp){.comm = P > 1 ? etp : NULL, .sp = sp != 0, .faults = 0, .traffic = &x->etr};
    par_mbstate_drop_all(&x->st);
    return PAR_OK;
}

/* 1 when M holds block b's routed experts as this rank's ETP shards (w1 /
 * w3 rows, w2 columns: parallel/layout/tp_split.h par_tp_storage_cut): the slices
 * are the storage itself. */
static int held_shards(const ep_t *x, const PAR_FN(par_model) *M, int b)
{
    return PAR_FN(par_model_cut_of)(M, M->tab.blocks[b].expert0 + 3 * (int)x->e0) != NULL;
}

/* Block b's held experts as this ETP rank's slices: the held shards in
 * place, or w1 / w3 rows pointing into whole weights (and their gradients)
 * and w2's columns copied (S->esw [3, El] the slices, S->esg [2, El] the w1
 * / w3 gradients' rows; S->ew2 [El, d, Il] the w2 slices (whole storage
 * only), then [El, d, Il] their gradients: w2_grads). */
static par_status slices(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b)
{
    const int64_t El = x->El, d = M->d, I = M->I, P = par_tp_size(&x->etp), Il = I / P;
    const int r = par_tp_rank(&x->etp), held = held_shards(x, M, b);
    const int64_t off = held ? 0 : (int64_t)r * Il * d;
    S->esw = xcalloc((size_t)(3 * El), sizeof *S->esw);
    S->esg = xcalloc((size_t)(2 * El), sizeof *S->esg);
    S->ew2 = xalloc((size_t)((held ? 1 : 2) * El * d * Il), sizeof *S->ew2);
    if (!S->esw || !S->esg || !S->ew2)
        return par_err(PAR_ENOMEM, "ep: block %d: out of memory for the ETP slices of %lld experts", b,
                       (long long)El);
    for (int64_t l = 0; l < El; l++) {
        const par_real *w2 = PAR_FN(par_model_ew_row)(M, b, 1)[l];
        if (!held) {
            par_real *c = S->ew2 + l * d * Il;
            par_tp_slice(c, PAR_FN(par_model_ew_row)(M, b, 1)[l], d, I, PAR_TP_COLS, r, (int)P, sizeof(par_real));
            w2 = c;
        }
        S->esw[l] = PAR_FN(par_model_ew_row)(M, b, 0)[l] + off;
        S->esw[El + l] = w2;
        S->esw[2 * El + l] = PAR_FN(par_model_ew_row)(M, b, 2)[l] + off;
        S->esg[l] = PAR_FN(par_model_egw_row)(M, b, 0)[l] + off;
        S->esg[El + l] = PAR_FN(par_model_egw_row)(M, b, 2)[l] + off;
    }
    return PAR_OK;
}

/* The local expert of every expert-major row (from S->eoff). */
static int32_t *local_experts(const ep_t *x, const blk_state *S)
{
    int32_t *le = xalloc((size_t)S->nrecv, sizeof *le);
    for (int64_t l = 0; le && l < x->El; l++)
        for (int64_t p = S->eoff[l]; p < S->eoff[l + 1]; p++)
            le[p] = (int32_t)l;
    return le;
}

par_status PAR_FN(par__ep_etp_forward)(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b, par_real *yg)
{
    par_status s = slices(x, S, M, b);
    if (s)
        return s;
    int32_t *le = local_experts(x, S);
    if (!le)
        return par_err(PAR_ENOMEM, "ep: block %d: out of memory for %lld ETP rows", b, (long long)S->nrecv);
    const int64_t El = x->El;
    const par_real *const *w = S->esw;
    x->etp.bitwise = M->cfg.bitwise;
    s = PAR_FN(par_etp_rows_forward)(yg, &S->ers, S->xg, S->rwg, le, S->nrecv, w, w + El, w + 2 * El, (int)El,
                                     M->d, M->I, M->cfg.swiglu_limit, &x->etp);
    par_free(le);
    return s;
}

/* The w2 slices' gradients [El, d, Il] in S->ew2 (after the slices' copies
 * unless held). */
static par_real *w2_grads(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b)
{
    return S->ew2 + (held_shards(x, M, b) ? 0 : x->El * M->d * (M->I / par_tp_size(&x->etp)));
}

/* The w2 slices' gradients into the held shards, or this rank's columns
 * of whole ones (the same adds). */
static void add_w2_grads(ep_t *x, blk_state *S, PAR_FN(par_model) *M, int b)
{
    const int64_t El = x->El, d = M->d, I = M->I, P = par_tp_size(&x->etp), n = d * (I / P);
    const int r = par_tp_rank(&x->etp), held = held_shards(x, M, b);
    par_real *tmp = S->ew2, *g = w2_grads(x, S, M, b); /* the w2 slices are no longer needed */
    for (int64_t l = 0; l < El; l++) {
        par_real *full = PAR_FN(par_model_egw_row)(M, b, 1)[l], *t = held ? full : tmp + l * n;
        if (!held)
            par_tp_slice(t, full, d, I, PAR_TP_COLS, r, (int)P, sizeof(par_real));
        for (int64_t i = 0; i < n; i++)
            t[i] += g[l * n + i];
        if (!held)
            par_tp_unslice(full, t, d, I, PAR_TP_COLS, r, (int)P, sizeof(par_real));
    }
}

par_status PAR_FN(par__ep_etp_backward)(ep_t *x, blk_state *S, PAR_FN(par_model) *M, int b, par_real *dxg,
                                        par_real *drwg)
{
    if (!S->esw || !S->ers.buf)
        return par_err(PAR_EINVAL, "ep: block %d ETP backward without its forward", b);
    const int64_t El = x->El, n = M->d * (M->I / par_tp_size(&x->etp));
    par_real *dw2 = w2_grads(x, S, M, b);
    par_real **dw2p = xalloc((size_t)El, sizeof *dw2p);
    if (!dw2p)
        return par_err(PAR_ENOMEM, "ep: block %d: out of memory for %lld slice gradients", b, (long long)El);
    memset(dw2, 0, (size_t)(El * n) * sizeof *dw2);
    const int direct = x->etp.bitwise && held_shards(x, M, b); /* the bitwise mode: w2's terms into the held shard */
    if (x->etp.bitwise && !direct) {
        par_free(dw2p);
        return par_err(PAR_EUNSUPPORTED, "ep: block %d: the bitwise mode needs the model to hold its ETP shards", b);
    }
    for (int64_t l = 0; l < El; l++)
        dw2p[l] = direct ? PAR_FN(par_model_egw_row)(M, b, 1)[l] : dw2 + l * n;
    const par_real *const *w = S->esw;
    par_status s = PAR_FN(par_etp_rows_backward)(dxg, drwg, S->esg, dw2p, S->esg + El, S->dyg,
                                                 &S->ers, w, w + El, w + 2 * El, &x->etp);
    if (!s && !direct)
        add_w2_grads(x, S, M, b);
    par_free(dw2p);
    return s;
}
