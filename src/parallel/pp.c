/* parallel/pp.c - the pipeline executor (see parallel/pp.h,
 * docs/parallel.md "Pipeline parallelism"). */
#include "parallel/pp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/clock.h"
#include "core/alloc.h"
#include "model/golden.h"
#include "parallel/cpwire.h"
#include "parallel/groups.h"
#include "parallel/schedule.h"

/* One stage of this rank: its segment's items and their block indices. */
typedef struct {
    int stage, dir, chunk;
    int n_items;
    char *items;  /* [n_items] E t m L */
    int *block;   /* [n_items] block index of t / m items, else -1 */
} lstage;

/* What (mb, stage) keeps between its forward and backward. */
typedef struct {
    int used;
    par_arena ar;
    const par_real *xin;  /* [T, n, d] the stage's input (received, or the previous local stage's output) */
    par_real *xout;       /* [T, n, d] its output (may be xin for an empty segment) */
    par_real *gout;       /* [T, n, d] gradient of xout (received / local); NULL: zero */
    int fwd_done, bwd_done;
    PAR_FN(par_block_act) *blk; /* [n_items] */
    PAR_FN(par_head_act) head, mtp_head;
    PAR_FN(par_mtp_act) mtp;
} slot;

/* A pending isend and the heap copy it sends from. */
typedef struct {
    par_request *req;
    par_real *buf;
} sendrec;

struct PAR_FN(par_pp_s) {
    const par_layout *lay;
    par_config cfg;
    par_schedule sch;
    int p, me, m, n_stages;
    par_comm *pc;             /* the PP group (peers = pipeline ranks) */
    par_comm *pair;           /* DualPipe: {r, p-1-r} of the PP group; else NULL */
    PAR_FN(par_ep) *ep;
    par_comm *cpc;            /* CP > 1: the CP group */
    int64_t CP;
    PAR_FN(par_cpw) **cpw;    /* [m] CP > 1: one attention executor per microbatch (its saved state, rows) */
    int n_local;              /* stages on this rank */
    lstage *ls;               /* [n_local] */
    int *stage_local;         /* [n_stages * n_dirs]: local index of (dir, stage) or -1 */
    int n_blocks, L;
    uint8_t *blocks;          /* [n_blocks] held */
    int *holder_pp;           /* [tab.n] lowest pipeline rank holding entry (float), -1 none */
    uint8_t *norm_skip;       /* [tab.n] */
    int64_t n, d, nd;
    /* the step */
    int64_t B, S, Bl, mbs, Tm;
    par_batch gb;             /* the global batch (counts) */
    par_batch *mb;            /* [m] */
    int32_t **msample;        /* [m][Tm] window sample of each token */
    slot *slots;              /* [m * n_local] */
    par_real **out_act, **out_grad; /* [m * n_stages] outboxes (heap copies) */
    sendrec *sends;
    int n_sends, cap_sends;
    PAR_FN(par_stats) bst;    /* CP > 1: the backward's per-sample counts, summed over CP per microbatch */
    int64_t *mq0, *mqn;       /* [m] first window sample of each microbatch, its samples */
    /* kept rows for a dump, [Bl*S*...] per held block / head (NULL: not held) */
    int keep;
    par_real **k_act;         /* [n_blocks] */
    int32_t **k_idx, **k_sel; /* [n_blocks] */
    par_real *k_logits, *k_mtp_logits;
    /* info */
    double dry_bubble;
    int net_steps;
    double net_makespan, net_busy;
};

/* ------------------------------------------------------------ schedule -- */

static par_status sched_params(const par_layout *l, par_schedule_params *sp)
{
    par_schedule_params_init(sp);
    par_status s = par_schedule_kind_parse(l->schedule[0] ? l->schedule : "1f1b", &sp->kind);
    if (s)
        return s;
    sp->pp = (int)l->pp;
    sp->vpp = (int)l->vpp;
    sp->n_micro = (int)l->n_micro;
    sp->mb_group = (int)l->mb_group;
    return PAR_OK;
}

par_status PAR_FN(par_pp_check)(const par_layout *l)
{
    if (l->pp <= 1)
        return PAR_OK;
    if (l->n_micro > 1000000)
        return par_err(PAR_EINVAL, "pipeline: %lld microbatches is more than the executor handles (10^6)",
                       (long long)l->n_micro);
    par_schedule_params sp;
    par_status s = sched_params(l, &sp);
    if (s)
        return s;
    par_schedule sch;
    if ((s = par_schedule_build(&sp, &sch)))
        return s;
    if (sch.n_stages != l->pipe.n_segments)
        s = par_err(PAR_EINVAL,
                    "pipeline: schedule '%s' has %d stages but the layout has %d segments (PP %lld x VPP %lld)",
                    par_schedule_kind_name(sp.kind), sch.n_stages, l->pipe.n_segments, (long long)l->pp,
                    (long long)l->vpp);
    par_schedule_free(&sch);
    return s;
}

/* ------------------------------------------------------------- create -- */

/* Blocks and top-level parts of segment `seg` into hold / blocks. */
static void seg_hold(const par_layout *l, const par_config *c, int seg, uint8_t *blocks, par_model_hold *h)
{
    const par_pplayout *pl = &l->pipe;
    int t = par_pplayout_offset(pl, seg, PAR_BLK_LAYER), mt = par_pplayout_offset(pl, seg, PAR_BLK_MTP);
    for (int i = pl->seg_off[seg]; i < pl->seg_off[seg + 1]; i++) {
        switch (pl->items[i]) {
        case PAR_BLK_EMBED:
            h->embed = 1;
            break;
        case PAR_BLK_LAYER:
            blocks[t++] = 1;
            break;
        case PAR_BLK_MTP:
            blocks[c->n_layers + mt++] = 1;
            h->embed = 1;
            h->head = 1;
            break;
        case PAR_BLK_LOSS:
            h->head = 1;
            h->final = 1;
            break;
        }
    }
}

/* The hold of pipeline rank r (stages of every direction). */
static void rank_hold(const PAR_FN(par_pp) *pp, int r, uint8_t *blocks, par_model_hold *h)
{
    memset(blocks, 0, (size_t)pp->n_blocks);
    memset(h, 0, sizeof *h);
    for (int dir = 0; dir < pp->sch.n_dirs; dir++)
        for (int s = 0; s < pp->n_stages; s++)
            if (par_schedule_stage_rank(&pp->sch, dir, s) == r)
                seg_hold(pp->lay, &pp->cfg, s, blocks, h);
    h->blocks = blocks;
}

static int hold_has(const par_param_table *t, const par_model_hold *h, int idx)
{
    const par_param *p = &t->p[idx];
    if (p->layer >= 0)
        return h->blocks[p->layer];
    if (idx == t->top.embed)
        return h->embed;
    if (idx == t->top.head)
        return h->head;
    return h->final;
}

static void lstage_free(lstage *s)
{
    par_free(s->items);
    par_free(s->block);
}

static par_status build_lstage(PAR_FN(par_pp) *pp, lstage *ls, int dir, int stage)
{
    const par_pplayout *pl = &pp->lay->pipe;
    ls->stage = stage;
    ls->dir = dir;
    ls->chunk = par_schedule_stage_chunk(&pp->sch, dir, stage);
    ls->n_items = pl->seg_off[stage + 1] - pl->seg_off[stage];
    ls->items = par_malloc((size_t)(ls->n_items + 1), PAR_TAG_MODEL);
    ls->block = par_malloc((size_t)(ls->n_items + 1) * sizeof *ls->block, PAR_TAG_MODEL);
    if (!ls->items || !ls->block)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    int t = par_pplayout_offset(pl, stage, PAR_BLK_LAYER), mt = par_pplayout_offset(pl, stage, PAR_BLK_MTP);
    for (int j = 0; j < ls->n_items; j++) {
        char c = pl->items[pl->seg_off[stage] + j];
        ls->items[j] = c;
        ls->block[j] = c == PAR_BLK_LAYER ? t++ : c == PAR_BLK_MTP ? (int)pp->cfg.n_layers + mt++ : -1;
    }
    return PAR_OK;
}

par_status PAR_FN(par_pp_create)(PAR_FN(par_pp) **out, const par_pctx *P, PAR_FN(par_model) *M,
                                 const par_config *cfg, uint64_t seed, int64_t e0, int64_t e1)
{
    *out = NULL;
    const par_layout *l = P->lay;
    par_status s;
    PAR_FN(par_pp) *pp = par_calloc(1, sizeof *pp, PAR_TAG_MODEL);
    if (!pp)
        return par_err(PAR_ENOMEM, "pipeline: out of memory");
    pp->lay = l;
    pp->cfg = *cfg;
    pp->p = (int)l->pp;
    pp->me = P->rc.pp;
    pp->m = (int)l->n_micro;
    pp->pc = P->g.g[PAR_GROUP_PP];
    pp->n_blocks = (int)par_config_n_blocks(cfg);
    pp->L = (int)cfg->n_layers;
    pp->n = cfg->hc_mult;
    pp->d = cfg->dim;
    pp->nd = pp->n * pp->d;
    par_schedule_params sp;
    uint8_t *rb = NULL;
    if ((s = sched_params(l, &sp)) || (s = par_schedule_build(&sp, &pp->sch)))
        goto fail_pp;
    pp->n_stages = pp->sch.n_stages;
    if (pp->n_stages != l->pipe.n_segments) {
        s = par_err(PAR_EINVAL, "pipeline: schedule '%s' has %d stages but the layout has %d segments",
                    par_schedule_kind_name(sp.kind), pp->n_stages, l->pipe.n_segments);
        goto fail_pp;
    }
    if (!pp->pc || par_comm_size(pp->pc) != pp->p) {
        s = par_err(PAR_EINTERNAL, "pipeline: no PP group of %d ranks", pp->p);
        goto fail_pp;
    }
    {
        par_sched_costs c;
        par_sched_costs_init(&c);
        par_sched_sim sim;
        if ((s = par_schedule_simulate(&pp->sch, &c, &sim)))
            goto fail_pp;
        pp->dry_bubble = sim.bubble;
        par_sched_sim_free(&sim);
    }

    /* this rank's stages */
    int nsd = pp->n_stages * pp->sch.n_dirs;
    pp->stage_local = par_malloc((size_t)nsd * sizeof *pp->stage_local, PAR_TAG_MODEL);
    pp->ls = par_calloc((size_t)nsd, sizeof *pp->ls, PAR_TAG_MODEL);
    pp->blocks = par_calloc((size_t)pp->n_blocks, 1, PAR_TAG_MODEL);
    rb = par_calloc((size_t)pp->n_blocks, 1, PAR_TAG_MODEL);
    if (!pp->stage_local || !pp->ls || !pp->blocks || !rb)
        goto fail_oom;
    for (int dir = 0; dir < pp->sch.n_dirs; dir++)
        for (int st = 0; st < pp->n_stages; st++) {
            int i = dir * pp->n_stages + st;
            pp->stage_local[i] = -1;
            if (par_schedule_stage_rank(&pp->sch, dir, st) != pp->me)
                continue;
            pp->stage_local[i] = pp->n_local;
            if ((s = build_lstage(pp, &pp->ls[pp->n_local++], dir, st)))
                goto fail_pp;
        }
    par_model_hold hold;
    rank_hold(pp, pp->me, pp->blocks, &hold);
    if ((s = PAR_FN(par_model_init_held)(M, cfg, seed, e0, e1, &hold)))
        goto fail_pp;

    /* the lowest pipeline holder of every entry: it counts it in the norm
     * and supplies it to a dump */
    int ntab = M->tab.n;
    pp->holder_pp = par_malloc((size_t)ntab * sizeof *pp->holder_pp, PAR_TAG_MODEL);
    pp->norm_skip = par_calloc((size_t)ntab, 1, PAR_TAG_MODEL);
    if (!pp->holder_pp || !pp->norm_skip)
        goto fail_model;
    for (int i = 0; i < ntab; i++)
        pp->holder_pp[i] = -1;
    for (int r = pp->p - 1; r >= 0; r--) {
        par_model_hold h;
        rank_hold(pp, r, rb, &h);
        for (int i = 0; i < ntab; i++)
            if (M->tab.p[i].dtype == PAR_PDT_REAL && hold_has(&M->tab, &h, i))
                pp->holder_pp[i] = r;
    }
    for (int i = 0; i < ntab; i++)
        pp->norm_skip[i] = PAR_FN(par_model_holds)(M, i) && pp->holder_pp[i] != pp->me;

    /* CP: one attention executor per microbatch of mbs rows */
    pp->CP = l->cp;
    if (l->cp > 1) {
        pp->cpc = P->g.g[PAR_GROUP_CP];
        pp->cpw = par_calloc((size_t)pp->m, sizeof *pp->cpw, PAR_TAG_MODEL);
        if (!pp->cpw)
            goto fail_model;
        int64_t mbs = l->micro_batch > 0 ? l->micro_batch : 1;
        for (int k = 0; k < pp->m; k++)
            if ((s = PAR_FN(par_cpw_create)(&pp->cpw[k], pp->cpc, M, mbs, cfg->seq_length)))
                goto fail_model;
    }
    /* DualPipe: the pair {r, p-1-r} holds the same two stages */
    if (pp->sch.n_dirs == 2) {
        int lo = pp->me < pp->p - 1 - pp->me ? pp->me : pp->p - 1 - pp->me;
        if ((s = par_comm_split(pp->pc, lo, pp->me, &pp->pair)))
            goto fail_model;
    }
    par_free(rb);
    *out = pp;
    return PAR_OK;

fail_oom:
    s = par_err(PAR_ENOMEM, "pipeline: out of memory");
    goto fail_pp;
fail_model:
    if (!s)
        s = par_err(PAR_ENOMEM, "pipeline: out of memory");
    PAR_FN(par_model_free)(M);
fail_pp:
    par_free(rb);
    PAR_FN(par_pp_free)(pp);
    return s;
}

par_status PAR_FN(par_pp_set_ep)(PAR_FN(par_pp) *pp, PAR_FN(par_ep) *ep)
{
    pp->ep = ep;
    return ep ? PAR_FN(par_ep_set_slots)(ep, pp->m) : PAR_OK;
}

/* --------------------------------------------------------------- slots -- */

static void slot_release(slot *sl, int n_items)
{
    if (!sl->used)
        return;
    for (int j = 0; j < n_items; j++)
        PAR_FN(par_block_act_release)(&sl->blk[j]);
    par_free(sl->blk);
    par_arena_destroy(&sl->ar);
    memset(sl, 0, sizeof *sl);
}

static void release_all(PAR_FN(par_pp) *pp)
{
    if (!pp->slots)
        return;
    for (int k = 0; k < pp->m; k++)
        for (int j = 0; j < pp->n_local; j++)
            slot_release(&pp->slots[k * pp->n_local + j], pp->ls[j].n_items);
}

static int local_of(const PAR_FN(par_pp) *pp, int mb, int stage)
{
    int dir = par_schedule_mb_dir(&pp->sch, mb);
    return pp->stage_local[dir * pp->n_stages + stage];
}

static par_status get_slot(PAR_FN(par_pp) *pp, int mb, int stage, slot **out, lstage **lso)
{
    int j = local_of(pp, mb, stage);
    if (j < 0)
        return par_err(PAR_EINTERNAL, "pipeline: rank %d runs stage %d of microbatch %d, which is not its own",
                       pp->me, stage, mb);
    slot *sl = &pp->slots[mb * pp->n_local + j];
    if (!sl->used) {
        sl->blk = par_calloc((size_t)(pp->ls[j].n_items + 1), sizeof *sl->blk, PAR_TAG_ACT);
        if (!sl->blk)
            return par_err(PAR_ENOMEM, "pipeline: out of memory");
        par_arena_init(&sl->ar, (size_t)1 << 20, PAR_TAG_ACT);
        sl->used = 1;
    }
    *out = sl;
    if (lso)
        *lso = &pp->ls[j];
    return PAR_OK;
}

/* ---------------------------------------------------------------- step -- */

static par_real *heap_copy(const par_real *x, int64_t n)
{
    par_real *c = par_malloc((size_t)(n > 0 ? n : 1) * sizeof *c, PAR_TAG_COMM);
    if (c)
        memcpy(c, x, (size_t)n * sizeof *c);
    return c;
}

static void keep_rows(void *dst, const void *src, int64_t row0, int64_t per, size_t esz, int64_t T)
{
    if (dst && src)
        memcpy((char *)dst + (size_t)(row0 * per) * esz, src, (size_t)(T * per) * esz);
}

/* The microbatch's state in the EP and CP executors. */
static void ep_select(PAR_FN(par_pp) *pp, PAR_FN(par_model) *M, int mb)
{
    if (pp->ep)
        PAR_FN(par_ep_select_slot)(pp->ep, mb);
    if (pp->cpw)
        PAR_FN(par_cpw_install)(pp->cpw[mb], M);
}

/* CP: the aux-loss backward of a token needs its sample's counts over the
 * whole row, whose slices live on the CP ranks: after the microbatch's
 * forward of a stage, sum cnt / ntok of its samples in the stage's blocks
 * over the CP group into bst (st keeps this rank's parts for the final
 * statistics, parallel/reduce.c). */
static par_status cp_counts(PAR_FN(par_pp) *pp, PAR_FN(par_model) *M, const lstage *ls, int mb)
{
    if (!pp->cpw)
        return PAR_OK;
    const PAR_FN(par_stats) *st = &M->stats;
    int64_t E = st->E, Ns = st->Ns, q0 = pp->mq0[mb], nq = pp->mqn[mb];
    int nb = 0;
    for (int j = 0; j < ls->n_items; j++)
        nb += ls->block[j] >= 0;
    size_t per = (size_t)(nq * E + nq), n = per * (size_t)nb;
    if (n == 0)
        return PAR_OK;
    int64_t *buf = par_malloc(n * sizeof *buf, PAR_TAG_COMM);
    if (!buf)
        return par_err(PAR_ENOMEM, "pipeline: out of memory for CP counts");
    for (int pass = 0; pass < 2; pass++) {
        size_t o = 0;
        for (int j = 0; j < ls->n_items; j++) {
            int b = ls->block[j];
            if (b < 0)
                continue;
            int64_t *c = (pass ? pp->bst.cnt : st->cnt) + ((int64_t)b * Ns + q0) * E;
            int64_t *t = (pass ? pp->bst.ntok : st->ntok) + (int64_t)b * Ns + q0;
            if (pass == 0) {
                memcpy(buf + o, c, (size_t)(nq * E) * sizeof *buf);
                memcpy(buf + o + nq * E, t, (size_t)nq * sizeof *buf);
            } else {
                memcpy(c, buf + o, (size_t)(nq * E) * sizeof *buf);
                memcpy(t, buf + o + nq * E, (size_t)nq * sizeof *buf);
            }
            o += per;
        }
        if (pass == 0) {
            par_status s = par_allreduce(pp->cpc, buf, buf, n, PAR_C_I64, PAR_OP_SUM);
            if (s) {
                par_free(buf);
                return s;
            }
        }
    }
    par_free(buf);
    return PAR_OK;
}

static par_status stage_forward(PAR_FN(par_pp) *pp, PAR_FN(par_model) *M, int mb, int stage)
{
    slot *sl;
    lstage *ls;
    par_status s = get_slot(pp, mb, stage, &sl, &ls);
    if (s)
        return s;
    if (sl->fwd_done)
        return par_err(PAR_EINTERNAL, "pipeline: forward of microbatch %d stage %d runs twice", mb, stage);
    const par_batch *bt = &pp->mb[mb];
    const int32_t *sample = pp->msample[mb];
    PAR_FN(par_stats) *st = &M->stats;
    int64_t T = pp->Tm, row0 = (int64_t)mb * pp->Tm;
    if (!sl->xin && stage > 0) {
        /* the previous stage on this rank (DualPipeV's turn): a local transfer */
        slot *pv = NULL;
        if (local_of(pp, mb, stage - 1) >= 0 && !get_slot(pp, mb, stage - 1, &pv, NULL) && pv->fwd_done)
            sl->xin = pv->xout;
        else
            return par_err(PAR_EINTERNAL,
                           "pipeline: forward of microbatch %d stage %d on rank %d has no input (no receive "
                           "and no local previous stage)",
                           mb, stage, pp->me);
    }
    const par_real *X = sl->xin;
    ep_select(pp, M, mb);
    for (int j = 0; j < ls->n_items; j++) {
        int b = ls->block[j];
        switch (ls->items[j]) {
        case PAR_BLK_EMBED: {
            par_real *X0 = par_arena_alloc(&sl->ar, (size_t)(T * pp->nd) * sizeof *X0, 64);
            if (!X0)
                return par_err(PAR_ENOMEM, "pipeline: out of activation memory");
            PAR_FN(par_model_embed_forward)(M, X0, bt->tokens, T);
            X = X0;
            break;
        }
        case PAR_BLK_LAYER:
            if ((s = PAR_FN(par_block_forward)(M, b, &sl->blk[j], &sl->ar, X, bt->tokens, bt->pos, sample, st, T)))
                return s;
            X = sl->blk[j].Xout;
            break;
        case PAR_BLK_MTP:
            if ((s = PAR_FN(par_mtp_input_forward)(M, &sl->mtp, &sl->ar, X, bt->mtp_inputs, T)) ||
                (s = PAR_FN(par_block_forward)(M, b, &sl->blk[j], &sl->ar, sl->mtp.X0, bt->mtp_inputs, bt->pos,
                                               sample, st, T)) ||
                (s = PAR_FN(par_head_forward)(M, 1, &sl->mtp_head, &sl->ar, sl->blk[j].Xout, bt->mtp_labels,
                                              sample, st->ce_mtp, T)))
                return s;
            if (pp->keep)
                keep_rows(pp->k_mtp_logits, sl->mtp_head.logits, row0, M->V, sizeof(par_real), T);
            break;
        case PAR_BLK_LOSS:
            if ((s = PAR_FN(par_head_forward)(M, 0, &sl->head, &sl->ar, X, bt->labels, sample, st->ce_main, T)))
                return s;
            if (pp->keep)
                keep_rows(pp->k_logits, sl->head.logits, row0, M->V, sizeof(par_real), T);
            break;
        }
        if (pp->keep && b >= 0) {
            const PAR_FN(par_block_act) *a = &sl->blk[j];
            keep_rows(pp->k_act[b], a->Xout, row0, pp->nd, sizeof(par_real), T);
            keep_rows(pp->k_idx[b], a->idx, row0, M->K, sizeof(int32_t), T);
            if (pp->k_sel[b])
                keep_rows(pp->k_sel[b], a->as.sel, row0, pp->cfg.index_topk, sizeof(int32_t), T);
        }
    }
    sl->xout = (par_real *)X;
    sl->fwd_done = 1;
    if ((s = cp_counts(pp, M, ls, mb)))
        return s;
    if (!X && stage > 0)
        return par_err(PAR_EINTERNAL, "pipeline: stage %d produced no output", stage);
    /* the output leaves: a heap copy for the send (the slot may be gone
     * before the send completes) unless the next stage is on this rank */
    if (stage < pp->n_stages - 1 && local_of(pp, mb, stage + 1) < 0) {
        int o = mb * pp->n_stages + stage;
        par_free(pp->out_act[o]);
        if (!(pp->out_act[o] = heap_copy(X, T * pp->nd)))
            return par_err(PAR_ENOMEM, "pipeline: out of memory for a send");
    }
    return PAR_OK;
}

static par_status stage_backward(PAR_FN(par_pp) *pp, PAR_FN(par_model) *M, int mb, int stage)
{
    slot *sl;
    lstage *ls;
    par_status s = get_slot(pp, mb, stage, &sl, &ls);
    if (s)
        return s;
    if (!sl->fwd_done || sl->bwd_done)
        return par_err(PAR_EINTERNAL, "pipeline: backward of microbatch %d stage %d without its forward", mb,
                       stage);
    if (!sl->gout && stage < pp->n_stages - 1)
        return par_err(PAR_EINTERNAL, "pipeline: backward of microbatch %d stage %d on rank %d has no gradient",
                       mb, stage, pp->me);
    const par_config *c = &pp->cfg;
    const par_batch *bt = &pp->mb[mb];
    const int32_t *sample = pp->msample[mb];
    const PAR_FN(par_stats) *bst = pp->cpw ? &pp->bst : &M->stats;
    const PAR_FN(par_stats) *st = &M->stats;
    int64_t T = pp->Tm;
    size_t xb = (size_t)(T * pp->nd) * sizeof(par_real);
    par_arena *ar = &sl->ar;
    par_real *dX = par_arena_calloc(ar, xb ? xb : 64, 64);
    if (!dX)
        goto fail_oom;
    if (sl->gout)
        memcpy(dX, sl->gout, xb);
    ep_select(pp, M, mb);
    for (int j = ls->n_items - 1; j >= 0; j--) {
        int b = ls->block[j];
        switch (ls->items[j]) {
        case PAR_BLK_LOSS:
            if (st->n_main > 0 && (s = PAR_FN(par_head_backward)(M, 0, &sl->head, ar, dX, 1.0 / (double)st->n_main)))
                return s;
            break;
        case PAR_BLK_MTP: {
            par_real *dB = par_arena_calloc(ar, xb ? xb : 64, 64), *d0 = par_arena_calloc(ar, xb ? xb : 64, 64);
            if (!dB || !d0)
                goto fail_oom;
            if (st->n_mtp > 0 &&
                (s = PAR_FN(par_head_backward)(M, 1, &sl->mtp_head, ar, dB, c->mtp_lambda / (double)st->n_mtp)))
                return s;
            if ((s = PAR_FN(par_block_backward)(M, b, &sl->blk[j], ar, d0, dB, bt->pos, sample, bst, c->aux_alpha,
                                                T)) ||
                (s = PAR_FN(par_mtp_input_backward)(M, &sl->mtp, ar, dX, d0)))
                return s;
            break;
        }
        case PAR_BLK_LAYER: {
            par_real *dN = par_arena_calloc(ar, xb ? xb : 64, 64);
            if (!dN)
                goto fail_oom;
            if ((s = PAR_FN(par_block_backward)(M, b, &sl->blk[j], ar, dN, dX, bt->pos, sample, bst, c->aux_alpha,
                                                T)))
                return s;
            dX = dN;
            break;
        }
        case PAR_BLK_EMBED:
            if ((s = PAR_FN(par_model_embed_backward)(M, ar, dX, bt->tokens, T)))
                return s;
            break;
        }
    }
    sl->bwd_done = 1;
    /* the input gradient leaves: to the previous stage's slot when it is on
     * this rank, else a heap copy for the send */
    if (stage > 0) {
        if (local_of(pp, mb, stage - 1) >= 0) {
            slot *pv;
            if ((s = get_slot(pp, mb, stage - 1, &pv, NULL)))
                return s;
            pv->gout = par_arena_alloc(&pv->ar, xb ? xb : 64, 64);
            if (!pv->gout)
                goto fail_oom;
            memcpy(pv->gout, dX, xb);
        } else {
            int o = mb * pp->n_stages + stage;
            par_free(pp->out_grad[o]);
            if (!(pp->out_grad[o] = heap_copy(dX, T * pp->nd)))
                goto fail_oom;
        }
    }
    /* the slot's activations are no longer needed (a local next stage read
     * xout during its forward, long done) */
    slot_release(sl, ls->n_items);
    return PAR_OK;
fail_oom:
    return par_err(PAR_ENOMEM, "pipeline: out of memory in the backward of microbatch %d stage %d", mb, stage);
}

static par_status post_send(PAR_FN(par_pp) *pp, const par_action *a, int grad)
{
    int o = a->mb * pp->n_stages + a->stage;
    par_real **box = grad ? &pp->out_grad[o] : &pp->out_act[o];
    if (!*box)
        return par_err(PAR_EINTERNAL, "pipeline: rank %d sends the %s of microbatch %d stage %d before computing it",
                       pp->me, grad ? "gradient" : "activation", a->mb, a->stage);
    if (pp->n_sends == pp->cap_sends) {
        int nc = pp->cap_sends ? 2 * pp->cap_sends : 64;
        sendrec *ns = par_realloc(pp->sends, (size_t)nc * sizeof *ns, PAR_TAG_COMM);
        if (!ns)
            return par_err(PAR_ENOMEM, "pipeline: out of memory for sends");
        pp->sends = ns;
        pp->cap_sends = nc;
    }
    sendrec *r = &pp->sends[pp->n_sends];
    r->buf = *box;
    r->req = NULL;
    *box = NULL;
    pp->n_sends++;
    return par_isend(pp->pc, r->buf, (size_t)(pp->Tm * pp->nd), PAR_C_REAL, a->peer, a->tag, &r->req);
}

static par_status recv_into(PAR_FN(par_pp) *pp, const par_action *a, int grad)
{
    slot *sl;
    par_status s = get_slot(pp, a->mb, a->stage, &sl, NULL);
    if (s)
        return s;
    size_t n = (size_t)(pp->Tm * pp->nd);
    par_real *buf = par_arena_alloc(&sl->ar, (n ? n : 1) * sizeof *buf, 64);
    if (!buf)
        return par_err(PAR_ENOMEM, "pipeline: out of memory for a receive");
    if ((s = par_recv(pp->pc, buf, n, PAR_C_REAL, a->peer, a->tag)))
        return s;
    if (grad)
        sl->gout = buf;
    else
        sl->xin = buf;
    return PAR_OK;
}

static par_status wait_sends(PAR_FN(par_pp) *pp)
{
    par_status s = PAR_OK;
    for (int i = 0; i < pp->n_sends; i++) {
        par_status w = par_wait(&pp->sends[i].req);
        if (w && !s)
            s = w;
        par_free(pp->sends[i].buf);
    }
    pp->n_sends = 0;
    return s;
}

/* Frees the step's microbatch batches and kept rows. */
static void step_free(PAR_FN(par_pp) *pp)
{
    if (pp->mb)
        for (int k = 0; k < pp->m; k++)
            par_batch_free(&pp->mb[k]);
    par_free(pp->mb);
    pp->mb = NULL;
    if (pp->msample)
        for (int k = 0; k < pp->m; k++)
            par_free(pp->msample[k]);
    par_free(pp->msample);
    pp->msample = NULL;
}

static void keep_free(PAR_FN(par_pp) *pp)
{
    for (int b = 0; pp->k_act && b < pp->n_blocks; b++) {
        par_free(pp->k_act[b]);
        par_free(pp->k_idx[b]);
        par_free(pp->k_sel[b]);
    }
    par_free(pp->k_act);
    par_free(pp->k_idx);
    par_free(pp->k_sel);
    par_free(pp->k_logits);
    par_free(pp->k_mtp_logits);
    pp->k_act = NULL;
    pp->k_idx = pp->k_sel = NULL;
    pp->k_logits = pp->k_mtp_logits = NULL;
}

static par_status keep_alloc(PAR_FN(par_pp) *pp, const PAR_FN(par_model) *M)
{
    if (pp->k_act)
        return PAR_OK;
    size_t R = (size_t)(pp->Bl * pp->S / pp->CP), nb = (size_t)pp->n_blocks;
    pp->k_act = par_calloc(nb, sizeof *pp->k_act, PAR_TAG_IO);
    pp->k_idx = par_calloc(nb, sizeof *pp->k_idx, PAR_TAG_IO);
    pp->k_sel = par_calloc(nb, sizeof *pp->k_sel, PAR_TAG_IO);
    if (!pp->k_act || !pp->k_idx || !pp->k_sel)
        goto fail_oom;
    for (int b = 0; b < pp->n_blocks; b++) {
        if (!pp->blocks[b])
            continue;
        pp->k_act[b] = par_calloc(R * (size_t)pp->nd, sizeof(par_real), PAR_TAG_IO);
        pp->k_idx[b] = par_calloc(R * (size_t)M->K, sizeof(int32_t), PAR_TAG_IO);
        if (!pp->k_act[b] || !pp->k_idx[b])
            goto fail_oom;
        if (par_config_ratio(&pp->cfg, b) == 4 &&
            !(pp->k_sel[b] = par_calloc(R * (size_t)pp->cfg.index_topk, sizeof(int32_t), PAR_TAG_IO)))
            goto fail_oom;
    }
    int has_l = 0, has_m = 0;
    for (int j = 0; j < pp->n_local; j++)
        for (int i = 0; i < pp->ls[j].n_items; i++) {
            has_l |= pp->ls[j].items[i] == PAR_BLK_LOSS;
            has_m |= pp->ls[j].items[i] == PAR_BLK_MTP;
        }
    if (has_l && !(pp->k_logits = par_calloc(R * (size_t)M->V, sizeof(par_real), PAR_TAG_IO)))
        goto fail_oom;
    if (has_m && !(pp->k_mtp_logits = par_calloc(R * (size_t)M->V, sizeof(par_real), PAR_TAG_IO)))
        goto fail_oom;
    return PAR_OK;
fail_oom:
    keep_free(pp);
    return par_err(PAR_ENOMEM, "pipeline: out of memory keeping %zu rows for the dump", R);
}

/* Prepares the step: microbatch batches, sample numbers, statistics window. */
static par_status step_setup(PAR_FN(par_pp) *pp, const par_pctx *P, PAR_FN(par_model) *M, const int32_t *tok,
                             const int32_t *seg)
{
    const par_layout *l = pp->lay;
    const par_config *c = &pp->cfg;
    par_status s;
    pp->B = l->global_batch;
    pp->S = c->seq_length;
    pp->Bl = pp->B / l->da;
    pp->mbs = l->micro_batch > 0 ? l->micro_batch : 1;
    pp->Tm = pp->mbs * (pp->S / pp->CP);
    if (pp->Bl != pp->mbs * pp->m)
        return par_err(PAR_EINVAL, "pipeline: %lld rows per data-parallel rank are not %d microbatches of %lld",
                       (long long)pp->Bl, pp->m, (long long)pp->mbs);
    int64_t S = pp->S, r0 = (int64_t)P->rc.dp * pp->Bl;
    if (!pp->gb.tokens && (s = par_batch_alloc(&pp->gb, pp->B, S)))
        return s;
    if ((s = par_batch_set(&pp->gb, tok, seg, c->vocab_size, "pipeline batch")))
        return s;
    /* samples: before this rank's rows, in them, in the batch */
    int64_t q0 = 0, Nl = 0, Ng = 0;
    for (int64_t r = 0; r < pp->B; r++) {
        int64_t ns = (int64_t)seg[(r + 1) * S - 1] + 1;
        if (r < r0)
            q0 += ns;
        else if (r < r0 + pp->Bl)
            Nl += ns;
        Ng += ns;
    }
    pp->mb = par_calloc((size_t)pp->m, sizeof *pp->mb, PAR_TAG_ACT);
    pp->msample = par_calloc((size_t)pp->m, sizeof *pp->msample, PAR_TAG_ACT);
    if (!pp->mq0)
        pp->mq0 = par_calloc((size_t)pp->m * 2, sizeof *pp->mq0, PAR_TAG_ACT);
    if (!pp->mb || !pp->msample || !pp->mq0)
        return par_err(PAR_ENOMEM, "pipeline: out of memory for %d microbatches", pp->m);
    pp->mqn = pp->mq0 + pp->m;
    /* each microbatch: its rows' batch (CP: derived on the whole rows, then
     * this rank's column slice, parallel/cpwire.h) and the window sample of
     * every local token: samples of the earlier rows + the row's segment */
    int64_t Lc = S / pp->CP, c0 = (int64_t)P->rc.cp * Lc, q = 0;
    par_batch full;
    memset(&full, 0, sizeof full);
    if (pp->cpw && (s = par_batch_alloc(&full, pp->mbs, S)))
        return s;
    for (int k = 0; k < pp->m && !s; k++) {
        int64_t rk = r0 + (int64_t)k * pp->mbs;
        if ((s = par_batch_alloc(&pp->mb[k], pp->mbs, Lc)))
            break;
        if (pp->cpw)
            s = par_batch_set(&full, tok + rk * S, seg + rk * S, c->vocab_size, "pipeline microbatch");
        if (!s)
            s = pp->cpw ? PAR_FN(par_cpw_batch)(pp->cpw[k], &pp->mb[k], &full)
                        : par_batch_set(&pp->mb[k], tok + rk * S, seg + rk * S, c->vocab_size, "pipeline microbatch");
        int32_t *sm = pp->msample[k] = par_malloc((size_t)pp->Tm * sizeof *sm, PAR_TAG_ACT);
        if (!s && !sm)
            s = par_err(PAR_ENOMEM, "pipeline: out of memory");
        if (s)
            break;
        pp->mq0[k] = q;
        for (int64_t r = 0; r < pp->mbs; r++) {
            const int32_t *sg = seg + (rk + r) * S;
            for (int64_t j = 0; j < Lc; j++)
                sm[r * Lc + j] = (int32_t)(q + sg[c0 + j]);
            q += (int64_t)sg[S - 1] + 1;
        }
        pp->mqn[k] = q - pp->mq0[k];
    }
    par_batch_free(&full);
    if (s)
        return s;
    if (q != Nl)
        return par_err(PAR_EINTERNAL, "pipeline: %lld samples in the microbatches, %lld in the rows", (long long)q,
                       (long long)Nl);
    PAR_FN(par_stats) *st = &M->stats;
    if (!st->ce_main || st->Ns != Nl) {
        PAR_FN(par_stats_free)(st);
        if ((s = PAR_FN(par_stats_alloc)(st, M->n_blocks, M->E, Nl)))
            return s;
    }
    PAR_FN(par_stats_zero)(st);
    st->q0 = q0;
    st->Ns_global = Ng;
    /* the loss scales of the backward: GLOBAL counts, known from the data */
    st->n_main = pp->gb.n_labels;
    st->n_mtp = c->n_mtp_layers > 0 ? pp->gb.n_mtp_labels : 0;
    st->n_tokens = pp->B * S;
    if (pp->cpw && (!pp->bst.cnt || pp->bst.Ns != Nl)) {
        PAR_FN(par_stats_free)(&pp->bst);
        if ((s = PAR_FN(par_stats_alloc)(&pp->bst, M->n_blocks, M->E, Nl)))
            return s;
    }
    if (pp->cpw) {
        pp->bst.q0 = q0;
        pp->bst.Ns_global = Ng;
    }
    /* outboxes and slots */
    size_t no = (size_t)pp->m * (size_t)pp->n_stages;
    if (!pp->out_act) {
        pp->out_act = par_calloc(no, sizeof *pp->out_act, PAR_TAG_COMM);
        pp->out_grad = par_calloc(no, sizeof *pp->out_grad, PAR_TAG_COMM);
        pp->slots = par_calloc((size_t)pp->m * (size_t)pp->n_local, sizeof *pp->slots, PAR_TAG_ACT);
        if (!pp->out_act || !pp->out_grad || !pp->slots)
            return par_err(PAR_ENOMEM, "pipeline: out of memory for %zu outboxes", no);
    }
    return PAR_OK;
}

/* Sums this rank's partial statistics over the pipeline: every per-sample,
 * per-block entry was produced on exactly one stage (zeros elsewhere), so
 * the sums are exact.  The global counts (n_main, n_mtp, n_tokens) are set
 * back to this rank's rows' for par_reduce_stats. */
static par_status stats_pp_combine(PAR_FN(par_pp) *pp, PAR_FN(par_model) *M)
{
    PAR_FN(par_stats) *st = &M->stats;
    int64_t nb = st->n_blocks, E = st->E, Ns = st->Ns;
    size_t ne = (size_t)(nb * E), nsE = (size_t)(nb * Ns * E), nsb = (size_t)(nb * Ns);
    size_t ni = ne + nsE + nsb;
    int64_t *iv = par_malloc((ni ? ni : 1) * sizeof *iv, PAR_TAG_COMM);
    double *dv = par_malloc((size_t)(2 * Ns + 1) * sizeof *dv, PAR_TAG_COMM);
    par_status s = PAR_OK;
    if (!iv || !dv) {
        s = par_err(PAR_ENOMEM, "pipeline: out of memory combining statistics of %lld samples", (long long)Ns);
        goto done;
    }
    memcpy(iv, st->loads, ne * sizeof *iv);
    memcpy(iv + ne, st->cnt, nsE * sizeof *iv);
    memcpy(iv + ne + nsE, st->ntok, nsb * sizeof *iv);
    if ((s = par_allreduce(pp->pc, iv, iv, ni, PAR_C_I64, PAR_OP_SUM)))
        goto done;
    memcpy(st->loads, iv, ne * sizeof *iv);
    memcpy(st->cnt, iv + ne, nsE * sizeof *iv);
    memcpy(st->ntok, iv + ne + nsE, nsb * sizeof *iv);
    memcpy(dv, st->ce_main, (size_t)Ns * sizeof *dv);
    memcpy(dv + Ns, st->ce_mtp, (size_t)Ns * sizeof *dv);
    if ((s = par_allreduce(pp->pc, dv, dv, (size_t)(2 * Ns), PAR_C_F64, PAR_OP_SUM)))
        goto done;
    memcpy(st->ce_main, dv, (size_t)Ns * sizeof *dv);
    memcpy(st->ce_mtp, dv + Ns, (size_t)Ns * sizeof *dv);
    if (nsE > 0 && (s = par_allreduce(pp->pc, st->psum, st->psum, nsE, PAR_C_REAL, PAR_OP_SUM)))
        goto done;
    /* this rank's rows' counts (par_reduce_stats sums them over DP) */
    int64_t n_main = 0, n_mtp = 0;
    for (int k = 0; k < pp->m; k++) {
        n_main += pp->mb[k].n_labels;
        n_mtp += pp->mb[k].n_mtp_labels;
    }
    st->n_main = n_main;
    st->n_mtp = pp->cfg.n_mtp_layers > 0 ? n_mtp : 0;
    st->n_tokens = pp->Bl * pp->S / pp->CP;
done:
    par_free(iv);
    par_free(dv);
    return s;
}

/* Held gradient entries of a shared kind summed over a group: which = 0
 * embed.weight, 1 head.weight, 2 every held entry (DualPipe's pair). */
static par_status reduce_shared(PAR_FN(par_model) *M, par_comm *c, int which)
{
    if (!c || par_comm_size(c) <= 1)
        return PAR_OK;
    const par_param_table *t = &M->tab;
    size_t n = 0;
    for (int i = 0; i < t->n; i++) {
        const par_param *p = &t->p[i];
        int want = which == 2 ? 1 : i == (which == 0 ? t->top.embed : t->top.head);
        if (want && p->dtype == PAR_PDT_REAL && p->has_grad && M->loc[i] >= 0)
            n += (size_t)p->numel;
    }
    if (n == 0)
        return par_err(PAR_EINTERNAL, "pipeline: a rank of a shared-weight group holds none of it");
    par_real *buf = par_malloc(n * sizeof *buf, PAR_TAG_COMM);
    if (!buf)
        return par_err(PAR_ENOMEM, "pipeline: out of memory for %zu shared gradient elements", n);
    for (int pass = 0; pass < 2; pass++) {
        size_t o = 0;
        for (int i = 0; i < t->n; i++) {
            const par_param *p = &t->p[i];
            int want = which == 2 ? 1 : i == (which == 0 ? t->top.embed : t->top.head);
            if (!(want && p->dtype == PAR_PDT_REAL && p->has_grad && M->loc[i] >= 0))
                continue;
            par_real *g = M->grads + M->loc[i];
            if (pass == 0)
                memcpy(buf + o, g, (size_t)p->numel * sizeof *buf);
            else
                memcpy(g, buf + o, (size_t)p->numel * sizeof *buf);
            o += (size_t)p->numel;
        }
        if (pass == 0) {
            par_status s = par_allreduce(c, buf, buf, n, PAR_C_REAL, PAR_OP_SUM);
            if (s) {
                par_free(buf);
                return s;
            }
        }
    }
    par_free(buf);
    return PAR_OK;
}

static par_status run_actions(PAR_FN(par_pp) *pp, PAR_FN(par_model) *M, double *busy)
{
    par_status s = PAR_OK;
    int n = pp->sch.n_actions[pp->me];
    const par_action *acts = pp->sch.actions[pp->me];
    for (int i = 0; i < n && !s; i++) {
        const par_action *a = &acts[i];
        double t0 = 0;
        switch (a->kind) {
        case PAR_ACT_F:
            t0 = par_comm_vclock(pp->pc);
            s = stage_forward(pp, M, a->mb, a->stage);
            *busy += par_comm_vclock(pp->pc) - t0;
            break;
        case PAR_ACT_B:
        case PAR_ACT_BW:
            t0 = par_comm_vclock(pp->pc);
            s = stage_backward(pp, M, a->mb, a->stage);
            *busy += par_comm_vclock(pp->pc) - t0;
            break;
        case PAR_ACT_W:
            /* the weight gradients were computed with B (pp.h) */
            break;
        case PAR_ACT_SEND_ACT:
            s = post_send(pp, a, 0);
            break;
        case PAR_ACT_SEND_GRAD:
            s = post_send(pp, a, 1);
            break;
        case PAR_ACT_RECV_ACT:
            s = recv_into(pp, a, 0);
            break;
        case PAR_ACT_RECV_GRAD:
            s = recv_into(pp, a, 1);
            break;
        default:
            s = par_err(PAR_EINTERNAL, "pipeline: unknown action kind %d", a->kind);
        }
        if (s) {
            char buf[128], msg[512];
            par_action_str(a, buf, sizeof buf);
            snprintf(msg, sizeof msg, "%s", par_last_error());
            return par_err(s, "%s (pipeline rank %d, action %d: %s)", msg, pp->me, i, buf);
        }
    }
    return s;
}

par_status PAR_FN(par_pp_step)(PAR_FN(par_pp) *pp, const par_pctx *P, PAR_FN(par_model) *M, const int32_t *tokens,
                               const int32_t *segments, int keep)
{
    par_status s;
    step_free(pp);
    pp->keep = keep;
    if ((s = step_setup(pp, P, M, tokens, segments)))
        goto done;
    if (keep && (s = keep_alloc(pp, M)))
        goto done;
    memset(M->grads, 0, (size_t)M->n_local * sizeof *M->grads);
    M->have_fwd = 0;

    double t0 = par_comm_vclock(pp->pc), busy = 0;
    s = run_actions(pp, M, &busy);
    par_status w = wait_sends(pp);
    if (!s)
        s = w;
    release_all(pp);
    if (s)
        goto done;
    double t1 = par_comm_vclock(pp->pc);
    if (t0 > 0) {
        /* the emulated network is on: the pipeline phase's makespan and
         * busy time over the PP group */
        double mine[3] = {t0, t1, busy}, *all = par_malloc((size_t)pp->p * 3 * sizeof *all, PAR_TAG_COMM);
        if (!all) {
            s = par_err(PAR_ENOMEM, "pipeline: out of memory");
            goto done;
        }
        if (!(s = par_allgather(pp->pc, mine, all, 3, PAR_C_F64))) {
            double lo = all[0], hi = all[1], sb = 0;
            for (int r = 0; r < pp->p; r++) {
                lo = all[3 * r] < lo ? all[3 * r] : lo;
                hi = all[3 * r + 1] > hi ? all[3 * r + 1] : hi;
                sb += all[3 * r + 2];
            }
            pp->net_steps++;
            pp->net_makespan += hi - lo;
            pp->net_busy += sb;
        }
        par_free(all);
        if (s)
            goto done;
    }

    /* statistics: over the pipeline, then over DP x CP (parallel/reduce.h
     * with the DP x CP group as its world: each (dp, cp) pipeline slice
     * now holds its rows' statistics once) */
    if ((s = stats_pp_combine(pp, M)))
        goto done;
    par_pctx Q = *P;
    Q.world = P->g.g[PAR_GROUP_DP_CP];
    Q.rank = par_comm_rank(Q.world);
    Q.N = par_comm_size(Q.world);
    if ((s = PAR_FN(par_reduce_stats)(&Q, M)))
        goto done;

    /* gradients: shared embed/head (or DualPipe's copies) over the pipeline;
     * the DP reduction, the norm (each entry counted on its lowest holder:
     * par_pp_norm_skip) and the update follow (parallel/dpwire.h) */
    if (pp->pair)
        s = reduce_shared(M, pp->pair, 2);
    else if (!(s = reduce_shared(M, P->g.g[PAR_GROUP_EMBED], 0)))
        s = reduce_shared(M, P->g.g[PAR_GROUP_MTP], 1);
    if (s)
        goto done;
    M->have_fwd = 1;
done:
    return s;
}

/* ---------------------------------------------------------------- dump -- */

/* Rank 0 receives n[r] elements from every rank r of c, in rank order. */
static par_status gather0(par_comm *c, const void *in, size_t n_mine, void *out, const size_t *n, par_ctype t)
{
    int N = par_comm_size(c), me = par_comm_rank(c);
    size_t *sc = par_calloc((size_t)N * 2, sizeof *sc, PAR_TAG_COMM);
    if (!sc)
        return par_err(PAR_ENOMEM, "pipeline dump: out of memory");
    size_t *rc = sc + N;
    sc[0] = n_mine;
    if (me == 0)
        for (int r = 0; r < N; r++)
            rc[r] = n[r];
    static char dummy[64];
    par_status s = par_alltoallv(c, in ? in : dummy, sc, NULL, me == 0 && out ? out : dummy, rc, NULL, t);
    par_free(sc);
    return s;
}

/* 1 when world rank r (coordinates rc) supplies entry idx to a dump. */
static int supplies(const PAR_FN(par_pp) *pp, const par_pctx *P, const PAR_FN(par_model) *M, const par_rank_coords *rc,
                    int idx)
{
    const par_param *p = &M->tab.p[idx];
    if (p->dtype != PAR_PDT_REAL || pp->holder_pp[idx] != rc->pp)
        return 0;
    if (p->expert >= 0) {
        int64_t El = M->E / P->lay->ep, e0 = (int64_t)rc->ep * El;
        return rc->edp == 0 && rc->etp == 0 && p->expert >= e0 && p->expert < e0 + El;
    }
    return rc->dp == 0 && rc->cp == 0 && rc->tp == 0;
}

par_status PAR_FN(par_pp_gather_full)(PAR_FN(par_pp) *pp, const par_pctx *P, const PAR_FN(par_model) *M,
                                      const par_real *loc, par_real *full)
{
    const par_param_table *t = &M->tab;
    int N = P->N;
    par_status s = PAR_OK;
    size_t mine = 0;
    for (int i = 0; i < t->n; i++)
        if (supplies(pp, P, M, &P->rc, i))
            mine += (size_t)t->p[i].numel;
    par_real *pack = par_malloc((mine ? mine : 1) * sizeof *pack, PAR_TAG_COMM), *recv = NULL;
    size_t *cnt = par_calloc((size_t)N, sizeof *cnt, PAR_TAG_COMM);
    par_rank_coords *rcs = par_malloc((size_t)N * sizeof *rcs, PAR_TAG_COMM);
    if (!pack || !cnt || !rcs)
        goto fail_oom;
    size_t o = 0;
    for (int i = 0; i < t->n; i++)
        if (supplies(pp, P, M, &P->rc, i)) {
            memcpy(pack + o, loc + M->loc[i], (size_t)t->p[i].numel * sizeof *pack);
            o += (size_t)t->p[i].numel;
        }
    size_t total = 0;
    if (P->rank == 0) {
        for (int r = 0; r < N; r++) {
            if ((s = par_rank_coords_of(P->lay, r, &rcs[r])))
                goto done;
            for (int i = 0; i < t->n; i++)
                if (supplies(pp, P, M, &rcs[r], i))
                    cnt[r] += (size_t)t->p[i].numel;
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
                if (supplies(pp, P, M, &rcs[r], i)) {
                    memcpy(full + t->p[i].offset, recv + at, (size_t)t->p[i].numel * sizeof *full);
                    at += (size_t)t->p[i].numel;
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

/* One kept tensor of rows [Bl*S, per] (elements of esz bytes, NULL where
 * this rank computed none of it) to rank 0 as [B*S, per]: first summed
 * bytewise over the pipeline (each row was computed on exactly one stage,
 * the others contribute zero bytes: exact), then the dp ranks' rows (pp = cp
 * = 0) gathered in order. */
static par_status gather_kept(PAR_FN(par_pp) *pp, const par_pctx *P, const void *kept, int64_t per, size_t esz,
                              void **out)
{
    *out = NULL;
    size_t n = (size_t)(pp->Bl * (pp->S / pp->CP) * per) * esz;
    par_status s;
    unsigned char *buf = par_calloc(n ? n : 1, 1, PAR_TAG_IO);
    size_t *cnt = par_calloc((size_t)P->N, sizeof *cnt, PAR_TAG_COMM);
    if (!buf || !cnt) {
        s = par_err(PAR_ENOMEM, "pipeline dump: out of memory for %zu bytes", n);
        goto done;
    }
    if (kept)
        memcpy(buf, kept, n);
    if ((s = par_allreduce(pp->pc, buf, buf, n, PAR_C_BYTE, PAR_OP_SUM)))
        goto done;
    if (P->rank == 0) {
        for (int r = 0; r < P->N; r++) {
            par_rank_coords rc;
            if ((s = par_rank_coords_of(P->lay, r, &rc)))
                goto done;
            cnt[r] = rc.pp == 0 && rc.tp == 0 ? n : 0;
        }
        if (!(*out = par_malloc(n * (size_t)(P->lay->da * pp->CP) + 1, PAR_TAG_IO))) {
            s = par_err(PAR_ENOMEM, "pipeline dump: out of memory");
            goto done;
        }
    }
    int send = P->rc.pp == 0 && P->rc.tp == 0;
    s = gather0(P->world, buf, send ? n : 0, *out, cnt, PAR_C_BYTE);
    if (!s && P->rank == 0 && pp->CP > 1) {
        /* pieces [Bl, S/CP, per] of the stage-0 ranks (the first world
         * ranks, in order) to rows dp*Bl.. and columns cp*S/CP.. */
        void *placed = par_malloc(n * (size_t)(P->lay->da * pp->CP) + 1, PAR_TAG_IO);
        if (!placed)
            s = par_err(PAR_ENOMEM, "pipeline dump: out of memory");
        else
            s = PAR_FN(par_cpw_place)(placed, *out, n / esz, esz, P->lay, pp->Bl);
        par_free(*out);
        *out = placed;
    }
done:
    par_free(buf);
    par_free(cnt);
    return s;
}

par_status PAR_FN(par_pp_dump_step)(PAR_FN(par_pp) *pp, const par_pctx *P, PAR_FN(par_model) *M,
                                    const int32_t *tokens, const int32_t *segments, par_real *grads_full,
                                    const char *dir, int64_t k)
{
    const par_config *c = &pp->cfg;
    int nb = pp->n_blocks;
    par_status s = PAR_OK;
    if (!pp->k_act)
        return par_err(PAR_EINVAL, "pipeline dump: the step was run without keeping its rows");
    void **keep = par_calloc((size_t)(3 * nb + 2), sizeof *keep, PAR_TAG_IO);
    if (!keep)
        return par_err(PAR_ENOMEM, "pipeline dump: out of memory");
    void **act = keep, **idx = keep + nb, **sel = keep + 2 * nb, **lg = keep + 3 * nb;
    if ((s = gather_kept(pp, P, pp->k_logits, M->V, sizeof(par_real), &lg[0])))
        goto done;
    if (c->n_mtp_layers > 0 && (s = gather_kept(pp, P, pp->k_mtp_logits, M->V, sizeof(par_real), &lg[1])))
        goto done;
    for (int b = 0; b < nb; b++) {
        if ((s = gather_kept(pp, P, pp->k_act[b], pp->nd, sizeof(par_real), &act[b])) ||
            (s = gather_kept(pp, P, pp->k_idx[b], M->K, sizeof(int32_t), &idx[b])))
            goto done;
        if (par_config_ratio(c, b) == 4 &&
            (s = gather_kept(pp, P, pp->k_sel[b], c->index_topk, sizeof(int32_t), &sel[b])))
            goto done;
    }
    if ((s = PAR_FN(par_pp_gather_full)(pp, P, M, M->grads, grads_full)))
        goto done;
    if (P->rank == 0) {
        PAR_FN(par_golden_step_view) v = {
            .B = pp->B, .S = pp->S, .tokens = tokens, .segments = segments, .out = M->last,
            .logits = lg[0], .mtp_logits = lg[1], .act = (const par_real *const *)act,
            .idx = (const int32_t *const *)idx, .loads = M->stats.loads, .sel = (const int32_t *const *)sel,
            .grads = grads_full,
        };
        s = PAR_FN(par_golden_write_step_view)(&M->tab, &v, dir, k);
    }
done:
    for (int i = 0; i < 3 * nb + 2; i++)
        par_free(keep[i]);
    par_free(keep);
    return s;
}

/* ---------------------------------------------------------------- info -- */

const uint8_t *PAR_FN(par_pp_norm_skip)(const PAR_FN(par_pp) *pp)
{
    return pp ? pp->norm_skip : NULL;
}

void PAR_FN(par_pp_info_get)(const PAR_FN(par_pp) *pp, par_pp_info *out)
{
    memset(out, 0, sizeof *out);
    if (!pp)
        return;
    out->schedule = par_schedule_kind_name(pp->sch.params.kind);
    out->n_micro = pp->m;
    out->n_stages = pp->n_stages;
    out->n_chunks = pp->sch.n_chunks;
    out->dry_bubble = pp->dry_bubble;
    out->net_steps = pp->net_steps;
    out->net_makespan_s = pp->net_makespan;
    out->net_busy_s = pp->net_busy;
    out->net_bubble = pp->net_makespan > 0 ? 1.0 - pp->net_busy / ((double)pp->p * pp->net_makespan) : 0.0;
}

void PAR_FN(par_pp_free)(PAR_FN(par_pp) *pp)
{
    if (!pp)
        return;
    release_all(pp);
    (void)wait_sends(pp);
    par_free(pp->sends);
    step_free(pp);
    keep_free(pp);
    if (pp->out_act)
        for (int i = 0; i < pp->m * pp->n_stages; i++) {
            par_free(pp->out_act[i]);
            par_free(pp->out_grad[i]);
        }
    par_free(pp->out_act);
    par_free(pp->out_grad);
    par_free(pp->slots);
    par_batch_free(&pp->gb);
    PAR_FN(par_stats_free)(&pp->bst);
    if (pp->ls)
        for (int j = 0; j < pp->n_local; j++)
            lstage_free(&pp->ls[j]);
    par_free(pp->ls);
    par_free(pp->stage_local);
    par_free(pp->blocks);
    par_free(pp->holder_pp);
    par_free(pp->norm_skip);
    if (pp->pair)
        par_comm_free(pp->pair);
    for (int k = 0; pp->cpw && k < pp->m; k++)
        PAR_FN(par_cpw_free)(pp->cpw[k]);
    par_free(pp->cpw);
    par_free(pp->mq0);
    if (pp->sch.n_actions)
        par_schedule_free(&pp->sch);
    par_free(pp);
}
