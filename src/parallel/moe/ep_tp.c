/* parallel/moe/ep_tp.c - expert parallelism with tensor parallelism on the
 * attention side.
 *
 * TP copies (no sequence parallelism): the TP ranks of a (cp, dp)
 * coordinate hold the same tokens, so an EP group that spans TP receives a
 * copy of each such token from every TP rank.  Every copy runs forward and
 * input pass alike (each sender gets its outputs), the weight pass leaves
 * the copies of TP ranks > 0 out (their dy rows zeroed: + 0, exact), so the
 * EDP sum counts every token once (see parallel/moe/ep.h "TP copies").
 *
 * The TP shared expert (with or without SP): column / row parallel over the
 * TP group on the rank's tokens (parallel/tp/tp_mlp.h), see parallel/moe/ep.h
 * par_ep_set_shared_tp. */
#include <string.h>

#include "core/alloc.h"
#include "kernels/moe.h"
#include "parallel/moe/ep-impl.h"

par_status PAR_FN(par_ep_set_tp)(PAR_FN(par_ep) *x, int tp_rank)
{
    int32_t me = tp_rank, *all = xalloc((size_t)x->EP, sizeof *all);
    uint8_t *dup = xalloc((size_t)x->EP, sizeof *dup);
    par_status s = all && dup ? par_allgather(x->c, &me, all, 1, PAR_C_I32)
                              : par_err(PAR_ENOMEM, "ep: out of memory for %d TP coordinates", x->EP);
    int any = 0;
    for (int j = 0; !s && j < x->EP; j++)
        any |= dup[j] = all[j] != 0;
    par_free(all);
    if (s || !any) {
        par_free(dup);
        dup = NULL;
    }
    if (!s) {
        par_free(x->tpdup);
        x->tpdup = dup;
    }
    return s;
}

par_status PAR_FN(par__ep_tp_mark)(ep_t *x, blk_state *S, const int32_t *rids)
{
    par_free(S->wdup);
    S->wdup = xcalloc((size_t)S->nrecv, sizeof *S->wdup);
    if (!S->wdup)
        return par_err(PAR_ENOMEM, "ep: out of memory for %lld row marks", (long long)S->nrecv);
    for (int64_t r = 0, j = 0, end = 0; r < S->nrecv; r++) {
        int src;
        if (x->mode == PAR_EP_HIER)
            src = rids[3 * r + 1];
        else {
            while (r >= end) /* flat: rows arrive packed in source rank order */
                end += (int64_t)S->rcnt[j++];
            src = (int)j - 1;
        }
        if (src < 0 || src >= x->EP)
            return par_err(PAR_EINTERNAL, "ep: received row %lld names source rank %d of %d", (long long)r, src,
                           x->EP);
        S->wdup[S->rpos[r]] = x->tpdup[src];
    }
    return PAR_OK;
}

void PAR_FN(par__ep_tp_mask_dy)(blk_state *S, int64_t d)
{
    for (int64_t p = 0; S->wdup && p < S->nrecv; p++)
        if (S->wdup[p])
            memset(S->dyg + p * d, 0, (size_t)d * sizeof *S->dyg);
}

par_status PAR_FN(par_ep_set_shared_tp)(PAR_FN(par_ep) *x, par_comm *tp, int sp, unsigned faults)
{
    const int P = tp ? par_comm_size(tp) : 1;
    memset(&x->shtr, 0, sizeof x->shtr);
    x->shtp = (par_tp){.comm = P > 1 ? tp : NULL, .sp = P > 1 && sp, .faults = faults, .traffic = &x->shtr};
    par_mbstate_drop_all(&x->st);
    return PAR_OK;
}

void PAR_FN(par_ep_shared_stats)(const PAR_FN(par_ep) *x, par_tp_shared_stats *out)
{
    *out = (par_tp_shared_stats){.units = x ? x->sh_units : 0, .bytes = x ? par_tp_traffic_bytes(&x->shtr) : 0};
}

par_status PAR_FN(par__ep_shared_forward)(ep_t *x, blk_state *S, const PAR_FN(par_model) *M, int b, par_real *ysh,
                                          const par_real *x_in, int64_t T)
{
    const par_block_params *bp = &M->tab.blocks[b];
    const int64_t Tl = x->shtp.sp ? T * par_tp_size(&x->shtp) : T; /* the layer's tokens (SP: the TP group's) */
    par_status s = PAR_FN(par_tp_mlp_shard_make)(&S->shw, PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1),
                                                 PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2),
                                                 PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3), M->d, M->I,
                                                 &x->shtp, PAR_FN(par_model_cut_of)(M, bp->shared_w1) != NULL);
    if (s)
        return s;
    x->sh_units += Tl * S->shw.Il;
    x->shtp.bitwise = M->cfg.bitwise;
    return PAR_FN(par_tp_mlp_forward)(ysh, &S->shs, x_in, S->shw.w1, S->shw.w2, S->shw.w3, Tl, M->d, M->I,
                                      M->cfg.swiglu_limit, &x->shtp);
}

par_status PAR_FN(par__ep_shared_backward)(ep_t *x, blk_state *S, PAR_FN(par_model) *M, int b, par_real *dxs,
                                           const par_real *dy)
{
    const par_block_params *bp = &M->tab.blocks[b];
    return PAR_FN(par_tp_mlp_backward_whole)(dxs, PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w1),
                                             PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w2),
                                             PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w3), dy, &S->shs,
                                             &S->shw, &x->shtp);
}
