/* parallel/moe/etp_hook.c - the expert-tensor-parallel MoE hook (see
 * parallel/moe/etp_hook.h, docs/parallel.md). */
#include "parallel/moe/etp_hook.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/hook/mbstate.h"
#include "parallel/moe/etp.h"
#include "parallel/layout/tp_split.h"

/* What (microbatch, block) keeps from its forward to its W pass: the slices'
 * pointers (the held ETP shards; with whole storage w1 / w3 rows point into
 * the whole weights, w2's columns are copied; ETP = 1: the whole experts
 * in place) and the w2 slices' gradients until W adds them (ETP = 1: B
 * adds them in place). */
typedef struct {
    PAR_FN(par_etp_moe_saved) sv;
    const par_real **w;  /* [3, E] the slices */
    par_real **g;        /* [3, E] their gradients (w1 / w3: into M->grads; w2: dw2) */
    par_real *w2, *dw2;  /* [E, d, Il] each (w2: the copies, whole storage only; held: dw2 alone; ETP = 1: none) */
    PAR_FN(par_tp_mlp_shard) shw; /* the TP shared expert's shard (shtp set) */
    int used;                     /* the forward ran */
} etp_state;

typedef struct {
    par_mbstate st; /* etp_state of (microbatch, block); first (par_mbstate_hook_new) */
    par_tp etp;     /* the ETP group (comm NULL: ETP = 1, the routed experts whole) */
    int whole;      /* ETP = 1 (the TP shared expert's hook with EP = ETP = 1): every expert read and
                     * accumulated whole, in place */
    int rank, P, E;
    int64_t d, I, Il;
    par_tp_traffic tr;
    par_tp shtp;    /* the shared expert's TP group (comm NULL: whole) */
    par_tp_traffic shtr;
    int64_t sh_units;
} etp_hook;

static void state_drop(void *p)
{
    etp_state *q = p;
    PAR_FN(par_etp_moe_saved_free)(&q->sv);
    par_free(q->w);
    par_free(q->w2);
    PAR_FN(par_tp_mlp_shard_free)(&q->shw);
}

/* 1 when M holds block b's routed experts as this rank's ETP shards (w1 /
 * w3 rows, w2 columns: parallel/layout/tp_split.h par_tp_storage_cut): read and
 * accumulated in place. */
static int held_shards(const PAR_FN(par_model) *M, int b)
{
    return PAR_FN(par_model_cut_of)(M, M->tab.blocks[b].expert0) != NULL;
}

/* The slices of block b's experts (and the pointers of their gradients):
 * the held shards, or rank r's rows / columns of whole ones (w2 copied);
 * ETP = 1: the whole experts and their gradients. */
static par_status slices(etp_hook *h, PAR_FN(par_model) *M, int b, etp_state *q)
{
    const int E = h->E, held = h->whole || held_shards(M, b);
    const int64_t d = h->d, Il = h->Il;
    const int64_t off = held ? 0 : (int64_t)h->rank * Il * d;
    q->w = par_calloc((size_t)(6 * E), sizeof *q->w, PAR_TAG_ACT);
    q->w2 = h->whole ? NULL : par_malloc((size_t)((held ? 1 : 2) * E * d * Il + 1) * sizeof(par_real), PAR_TAG_ACT);
    if (!q->w || (!h->whole && !q->w2))
        return par_err(PAR_ENOMEM, "etp: out of memory for the slices of %d experts", E);
    q->g = (par_real **)(q->w + 3 * E);
    q->dw2 = h->whole ? NULL : held ? q->w2 : q->w2 + E * d * Il;
    if (M->e0 != 0 || M->e1 != E)
        return par_err(PAR_EINVAL, "etp: the model holds experts [%lld, %lld) of %d (ETP needs EP = 1)",
                       (long long)M->e0, (long long)M->e1, E);
    const par_real **ew = PAR_FN(par_model_ew_row)(M, b, 0); /* [3, E]: every expert held */
    par_real **egw = PAR_FN(par_model_egw_row)(M, b, 0);
    for (int e = 0; e < E; e++) {
        if (!ew[e] || !ew[E + e] || !ew[2 * E + e])
            return par_err(PAR_EINVAL, "etp: block %d does not hold expert %d (ETP needs EP = 1)", b, e);
        const par_real *w2 = ew[E + e];
        if (!held) {
            par_real *c = q->w2 + (int64_t)e * d * Il;
            par_tp_slice(c, ew[E + e], d, h->I, PAR_TP_COLS, h->rank, h->P, sizeof(par_real));
            w2 = c;
        }
        q->w[e] = ew[e] + off, q->w[E + e] = w2, q->w[2 * E + e] = ew[2 * E + e] + off;
        q->g[e] = egw[e] + off, q->g[2 * E + e] = egw[2 * E + e] + off;
        /* the bitwise mode: w2's terms straight into the held shard (its accumulator) */
        q->g[E + e] = h->whole || (h->etp.bitwise && held) ? egw[E + e] : q->dw2 + (int64_t)e * d * Il;
    }
    if (h->etp.bitwise && !held)
        return par_err(PAR_EUNSUPPORTED, "etp (bitwise mode): the model must hold its ETP shards");
    return PAR_OK;
}

/* The routed slices and the shared expert: its TP shard (q->shw) or whole. */
static void weights_of(const etp_state *q, PAR_FN(par_model) *M, int b, int E, PAR_FN(par_etp_weights) *W)
{
    const par_block_params *bp = &M->tab.blocks[b];
    *W = (PAR_FN(par_etp_weights)){.w1 = q->w, .w2 = q->w + E, .w3 = q->w + 2 * E,
                                   .sw1 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w1),
                                   .sw2 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w2),
                                   .sw3 = PAR_FN(par_model_ptr)(M, M->params, bp->shared_w3)};
    if (q->shw.buf)
        W->sw1 = q->shw.w1, W->sw2 = q->shw.w2, W->sw3 = q->shw.w3;
}

static par_status moe_fwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *y,
                          const par_real *xin, const int32_t *idx, const par_real *w, const int32_t *tokens,
                          int64_t T)
{
    etp_hook *h = ctx;
    etp_state *q;
    (void)tokens;
    par_status s = par_mbstate_new(&h->st, x, b, (void **)&q);
    if (s || (s = slices(h, M, b, q)))
        return s;
    const par_tp *shtp = h->shtp.comm ? &h->shtp : NULL;
    PAR_FN(par_etp_weights) W;
    weights_of(q, M, b, h->E, &W);
    if (shtp && (s = PAR_FN(par_tp_mlp_shard_make)(&q->shw, W.sw1, W.sw2, W.sw3, h->d, h->I, shtp,
                                                        PAR_FN(par_model_cut_of)(M, M->tab.blocks[b].shared_w1) != NULL)))
        return s;
    weights_of(q, M, b, h->E, &W);
    h->sh_units += (shtp && shtp->sp ? T * par_tp_size(shtp) : T) * (shtp ? q->shw.Il : h->I);
    q->used = 1;
    return PAR_FN(par_etp_moe_forward)(y, &q->sv, xin, idx, w, &W, T, h->d, h->E, (int)M->K, h->I,
                                       M->cfg.swiglu_limit, &h->etp, shtp);
}

/* B: dx, dw and every weight gradient in one pass (the w2 slices' wait for
 * W in the state; w1 / w3 rows and the shared expert go straight to M->grads). */
static par_status moe_bwd(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, par_real *dx, par_real *dw,
                          const par_real *dy, const par_real *xin, const par_real *w, int64_t T)
{
    etp_hook *h = ctx;
    etp_state *q = par_mbstate_get(&h->st, x, b);
    (void)xin, (void)w, (void)T;
    if (!q || !q->used)
        return par_err(PAR_EINVAL, "etp backward: block %d has no forward", b);
    const par_block_params *bp = &M->tab.blocks[b];
    const int E = h->E;
    if (!h->whole)
        memset(q->dw2, 0, (size_t)(E * h->d * h->Il) * sizeof(par_real));
    PAR_FN(par_etp_weights) W;
    weights_of(q, M, b, E, &W);
    PAR_FN(par_etp_grads) G = {.w1 = q->g, .w2 = q->g + E, .w3 = q->g + 2 * E,
                               .sw1 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w1),
                               .sw2 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w2),
                               .sw3 = PAR_FN(par_model_ptr)(M, M->grads, bp->shared_w3)};
    par_real *g2 = G.sw2;
    const par_tp *shtp = q->shw.buf ? &h->shtp : NULL;
    const int direct = shtp && shtp->bitwise && q->shw.held; /* the bitwise mode: w2's terms into the held shard */
    if (shtp) { /* the shard's gradients into this TP rank's block */
        PAR_FN(par_tp_mlp_shard_grads)(&q->shw, G.sw1, G.sw3, &G.sw1, &G.sw3);
        G.sw2 = direct ? g2 : q->shw.dw2;
    }
    par_status s = PAR_FN(par_etp_moe_backward)(dx, dw, &G, dy, &q->sv, &W, &h->etp, shtp);
    if (!s && shtp && !direct)
        PAR_FN(par_tp_mlp_shard_add_dw2)(&q->shw, g2);
    return s;
}

/* W: the w2 slices' gradients into the held shards, or rank r's columns
 * of the whole ones (the same adds). */
static par_status moe_wgt(void *ctx, const par_mbctx *x, PAR_FN(par_model) *M, int b, const par_real *dy,
                          const par_real *xin, int64_t T)
{
    etp_hook *h = ctx;
    etp_state *q = par_mbstate_get(&h->st, x, b);
    (void)dy, (void)xin, (void)T;
    if (!q || !q->used)
        return par_err(PAR_EINVAL, "etp weights: block %d has no backward", b);
    const int E = h->E, held = held_shards(M, b);
    const int64_t n = h->d * h->Il;
    par_real *tmp = q->w2; /* the forward's w2 slices are no longer needed */
    par_real **egw = PAR_FN(par_model_egw_row)(M, b, 0); /* [3, E]: every expert held (slices checked) */
    for (int e = 0; !h->whole && !h->etp.bitwise && e < E; e++) { /* ETP = 1 or the bitwise mode: B added them */
        par_real *t = held ? egw[E + e] : tmp + (int64_t)e * n;
        const par_real *g = q->dw2 + (int64_t)e * n;
        if (!held)
            par_tp_slice(t, egw[E + e], h->d, h->I, PAR_TP_COLS, h->rank, h->P, sizeof(par_real));
        for (int64_t i = 0; i < n; i++)
            t[i] += g[i];
        if (!held)
            par_tp_unslice(egw[E + e], t, h->d, h->I, PAR_TP_COLS, h->rank, h->P, sizeof(par_real));
    }
    par_mbstate_drop(&h->st, x, b); /* the microbatch's backward of the block is done */
    return PAR_OK;
}

/* The TP shared expert (TP > 1; parallel/layout/tp_split.h
 * par_tp_shared_expert_split): column / row parallel over the TP group `tp`
 * (parallel/tp/tp_mlp.h) on the rank's tokens (sp: all-gathered over TP,
 * the output reduce-scattered; else the output all-reduced), the shard's
 * gradients into this TP rank's block of the whole ones (par_reduce_tp_grads,
 * PAR_TPG_SHARED).  A group of one runs it whole. */
static void shared_tp(etp_hook *h, par_comm *tp, int sp, unsigned faults, int bitwise)
{
    const int P = tp ? par_comm_size(tp) : 1;
    h->shtp = (par_tp){.comm = P > 1 ? tp : NULL, .sp = P > 1 && sp, .faults = faults, .traffic = &h->shtr,
                       .bitwise = bitwise};
}

/* ----------------------------------------------------------- the entry -- */

/* ETP > 1 with EP = 1 (EP > 1: ETP inside EP, parallel/moe/ep_etp.c); the
 * TP shared expert with EP = ETP = 1 (the routed experts whole: an ETP
 * group of one). */
static int applies(const par_layout *l)
{
    return l->ep <= 1 && (l->etp > 1 || (l->tp > 1 && par_tp_shared_expert_split(l)));
}

/* sp = 1: the group's ranks hold disjoint tokens (rows gathered, outputs
 * reduce-scattered); sp = 0 (TP x ETP without SP: ETP = TP, the ETP group
 * is the TP group): the same tokens, outputs all-reduced.  PAR_EINVAL when
 * ETP does not divide moe_inter_dim. */
static par_status create(void **out, const par_hook_env *e, PAR_FN(par_model) *M)
{
    const par_layout *l = e->P->lay;
    par_comm *etp = l->etp > 1 ? e->P->g.g[PAR_GROUP_ETP] : NULL;
    const int P = etp ? par_comm_size(etp) : 1;
    etp_hook *h;
    if (M->I % P != 0)
        return par_err(PAR_EINVAL, "expert tensor parallelism: expert-tensor-parallel-size %d must divide "
                       "moe_inter_dim %lld", P, (long long)M->I);
    par_status s = par_mbstate_hook_new((void **)&h, sizeof *h, "etp", e->n_mb, M->n_blocks, NULL, sizeof(etp_state),
                                        state_drop);
    if (s)
        return s;
    h->etp = (par_tp){.comm = etp, .sp = etp && (l->tp <= 1 || l->sequence_parallel), .faults = 0, .traffic = &h->tr,
                      .bitwise = M->cfg.bitwise};
    h->whole = !etp;
    h->rank = etp ? par_comm_rank(etp) : 0, h->P = P, h->E = (int)M->E;
    h->d = M->d, h->I = M->I, h->Il = M->I / P;
    if (par_tp_shared_expert_split(l))
        shared_tp(h, e->P->g.g[PAR_GROUP_TP], l->sequence_parallel, e->tp_faults, M->cfg.bitwise);
    M->moe = (PAR_FN(par_moe_exec)){.fwd = moe_fwd, .bwd = moe_bwd, .wgt = moe_wgt, .ctx = h};
    *out = h;
    return PAR_OK;
}

static void report(const void *p, const par_hook_report *r)
{
    const etp_hook *h = p;
    if (r->shared)
        r->shared->units += h->sh_units, r->shared->bytes += par_tp_traffic_bytes(&h->shtr);
}

const PAR_FN(par_hookset) PAR_FN(par_etp_hookset) = {
    .name = "etp", .applies = applies, .create = create, .report = report, .free = par_mbstate_hook_free};
