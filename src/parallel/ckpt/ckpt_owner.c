/* parallel/ckpt/ckpt_owner.c - checkpoint ownership rules (see
 * parallel/ckpt/ckpt_owner.h, docs/checkpoints.md "Ownership"; untemplated). */
#include "parallel/ckpt/ckpt_owner.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "model/params.h"
#include "parallel/layout/groups.h"
#include "parallel/layout/pplayout.h"
#include "parallel/layout/tp_split.h"
#include "parallel/layout/zero_geom.h"

static int64_t numel_of(const par_ckpt_tensor *x)
{
    return par_shape_numel(x->ndim, x->shape, 0);
}

/* ---- the simple rule ----------------------------------------------------- */

par_status par_ckpt_owner_simple(const par_layout *layout, int nranks, int rank, const par_ckpt_tensor *tensors,
                                 int ntensors, par_ckpt_slice **out, int *nout, void *ud)
{
    (void)ud;
    int64_t ep = layout && layout->ep > 0 ? layout->ep : 1, E = 0;
    for (int i = 0; i < ntensors; i++)
        if (tensors[i].expert + 1 > E)
            E = tensors[i].expert + 1;
    if (E > 0 && E % ep != 0)
        return par_err(PAR_EINVAL, "checkpoint owner (simple): %lld routed experts do not split evenly over EP %lld",
                       (long long)E, (long long)ep);
    if (ep > nranks)
        return par_err(PAR_EINVAL, "checkpoint owner (simple): EP %lld exceeds the world size %d", (long long)ep,
                       nranks);
    const int64_t per = E > 0 ? E / ep : 1;
    par_ckpt_slice *s = par_calloc(ntensors > 0 ? (size_t)ntensors : 1, sizeof *s, PAR_TAG_IO);
    if (!s)
        return par_err(PAR_ENOMEM, "checkpoint owner (simple): out of memory for %d tensors", ntensors);
    int k = 0;
    for (int i = 0; i < ntensors; i++) {
        const int e = tensors[i].expert;
        if ((e >= 0 ? (int)(e / per) : 0) != rank)
            continue;
        snprintf(s[k].name, sizeof s[k].name, "%s", tensors[i].name);
        s[k].begin = 0;
        s[k].end = numel_of(&tensors[i]);
        k++;
    }
    *out = s;
    *nout = k;
    return PAR_OK;
}

/* ---- the training driver's rule: this rank's view ---------------------------- */

/* Pipeline parts (what a stage holds): blocks 0..nb-1 (main layers, then
 * the MTP blocks), then these three. */
#define PART_EMBED(nb) (nb)
#define PART_HEAD(nb) ((nb) + 1)
#define PART_FINAL(nb) ((nb) + 2) /* norm.weight, hc_head_*: with L */

/* One rank's view of the model and the layout, as the rule needs them. */
typedef struct {
    par_layout l;         /* the sizes folded for the world (owner_layout)                  */
    par_rank_coords rc;   /* this rank's coordinates                                        */
    par_param_table t;    /* synthetic: the list's parameters in list order (= table order) */
    int *entry;           /* [ntensors]: t's entry of each tensor (state: its parameter's)  */
    int *part;            /* [t.n]: pipeline part of each entry                             */
    int64_t *full;        /* [2 t.n]: logical [rows, cols] of each entry (its shard: t.p's)  */
    uint8_t *cut;         /* [t.n]: how the layout holds the entry (par_tp_cut: 0 whole)    */
    int16_t *crank, *cP;  /* [t.n]: this rank's block of cP (TP / ETP shards)               */
    int n_layers, n_mtp;  /* blocks of the list                                             */
    int64_t e0, e1;       /* routed experts of this rank's EP slot: [e0, e1)               */
    int *low;             /* [nb + 3]: lowest pipeline rank holding each part (-1: none)    */
    uint8_t *held;        /* [nb + 3]: 1 when this rank's stages hold the part              */
    par_dp_mode mode;
    par_zero_geom g[2];   /* this rank's dense (dp-cp group) and expert (edp group) plans    */
} owner_view;

static void view_free(owner_view *v)
{
    par_zero_geom_free(&v->g[0]);
    par_zero_geom_free(&v->g[1]);
    par_free(v->t.p);
    par_free(v->entry);
    par_free(v->part);
    par_free(v->full);
    par_free(v->cut);
    par_free(v->crank);
    par_free(v->cP);
    par_free(v->low);
    par_free(v->held);
    memset(v, 0, sizeof *v);
}

/* The layout's sizes for a world of nranks, as a grid usable by the rank
 * functions of groups.h (only the sizes are read). */
static par_status owner_layout(const par_layout *in, int nranks, par_layout *l)
{
    *l = *in;
    if (l->tp < 1)
        l->tp = 1;
    if (l->pp < 1)
        l->pp = 1;
    if (l->cp < 1)
        l->cp = 1;
    if (l->ep < 1)
        l->ep = 1;
    if (l->etp < 1)
        l->etp = 1;
    l->world = nranks;
    /* TP and ETP ranks hold whole tensors but the shards of par_tp_storage_cut: tp = 0 / etp = 0 write them */
    int64_t a = l->pp * l->tp * l->cp, e = l->pp * l->etp * l->ep;
    if (nranks % a || nranks % e)
        return par_err(PAR_EINVAL, "checkpoint ownership: world %d does not fold: N/PP = TP*CP*Da = ETP*EP*De needs "
                       "N divisible by PP*TP*CP = %lld and PP*ETP*EP = %lld", nranks, (long long)a, (long long)e);
    l->da = nranks / a;
    l->de = nranks / e;
    l->resolved = 1;
    return PAR_OK;
}

/* The pipeline part of parameter x: its block, or embed / head (the
 * contract's two names a pipeline places specially), or the final part. */
static int part_of(const par_ckpt_tensor *x, int n_layers, int nb)
{
    if (x->layer >= 0)
        return x->layer;
    if (x->mtp >= 0)
        return n_layers + x->mtp;
    if (!strcmp(x->name, "embed.weight"))
        return PART_EMBED(nb);
    if (!strcmp(x->name, "head.weight"))
        return PART_HEAD(nb);
    return PART_FINAL(nb);
}

/* The synthetic table: one entry per parameter of the list, in list order,
 * with dtype, size, expert, block and pipeline part (optimizer kinds:
 * synth_state). */
static par_status synth_params(owner_view *v, const par_ckpt_tensor *x, int n)
{
    for (int i = 0; i < n; i++)
        if (x[i].slot == PAR_CKPT_PARAM) {
            v->n_layers = x[i].layer + 1 > v->n_layers ? x[i].layer + 1 : v->n_layers;
            v->n_mtp = x[i].mtp + 1 > v->n_mtp ? x[i].mtp + 1 : v->n_mtp;
        }
    const int nb = v->n_layers + v->n_mtp;
    for (int i = 0; i < n; i++) {
        if (x[i].slot != PAR_CKPT_PARAM)
            continue;
        par_param *p = &v->t.p[v->t.n];
        p->dtype = x[i].dtype == PAR_I32 ? PAR_PDT_I32 : PAR_PDT_REAL;
        p->ndim = x[i].ndim;
        p->shape[0] = x[i].ndim > 0 ? x[i].shape[0] : 1;
        p->shape[1] = x[i].ndim > 1 ? x[i].shape[1] : 1;
        p->numel = numel_of(&x[i]);
        int64_t np = 1;
        const par_tp_cut c = par_tp_storage_cut(&v->l, x[i].name, &np);
        v->full[2 * v->t.n] = p->numel; /* whole: one run */
        v->full[2 * v->t.n + 1] = 1;
        if (c != PAR_TP_REPLICATED) { /* the plan's sizes are the shards' (dp_step.c); rank r writes block r */
            const int r = par_tp_split_of(x[i].name).group == PAR_TP_GROUP_ETP ? v->rc.etp : v->rc.tp;
            int64_t sr, sc;
            par_status st = par_tp_shard_shape(x[i].name, p->shape[0], p->shape[1], c, np, &sr, &sc);
            if (st)
                return st;
            v->full[2 * v->t.n] = p->shape[0];
            v->full[2 * v->t.n + 1] = p->shape[1];
            p->numel = sr * sc;
            v->cut[v->t.n] = (uint8_t)c;
            v->crank[v->t.n] = (int16_t)r;
            v->cP[v->t.n] = (int16_t)np;
        }
        p->expert = x[i].expert;
        p->layer = x[i].layer >= 0 ? x[i].layer : x[i].mtp >= 0 ? v->n_layers + x[i].mtp : -1;
        p->opt = PAR_OPT_NONE;
        v->part[v->t.n] = part_of(&x[i], v->n_layers, nb);
        v->entry[i] = v->t.n++;
    }
    return PAR_OK;
}

/* The optimizer kind of every parameter, from its state tensors (momentum:
 * Muon; exp_avg, exp_avg_sq: AdamW), and each state tensor's entry. */
static par_status synth_state(owner_view *v, const par_ckpt_tensor *x, int n)
{
    for (int i = 0; i < n; i++) {
        if (x[i].slot == PAR_CKPT_PARAM)
            continue;
        const int j = x[i].param;
        const par_opt_kind k = x[i].slot == PAR_CKPT_MOMENTUM ? PAR_OPT_MUON : PAR_OPT_ADAMW;
        par_param *p = j >= 0 && j < n && x[j].slot == PAR_CKPT_PARAM ? &v->t.p[v->entry[j]] : NULL;
        if (!p || p->dtype != PAR_PDT_REAL || (p->opt != PAR_OPT_NONE && p->opt != k))
            return par_err(PAR_EINVAL, "checkpoint ownership: '%s' is not the %s of a float parameter with one "
                           "optimizer (its parameter: %s)", x[i].name, par_ckpt_slot_name(x[i].slot),
                           p ? x[j].name : "none");
        p->opt = k;
        v->entry[i] = v->entry[j];
    }
    return PAR_OK;
}

/* The pipeline segments of l: its resolved ones, else from its layout
 * string or Megatron's default split (schedule default: 1f1b, interleaved
 * with VPP > 1). */
static par_status pipe_segments(const par_layout *l, int n_layers, int n_mtp, par_layout *lr)
{
    *lr = *l;
    if (!lr->schedule[0])
        snprintf(lr->schedule, sizeof lr->schedule, "%s", lr->vpp > 1 ? "interleaved" : "1f1b");
    if (lr->pipe.n_segments > 0)
        return PAR_OK;
    if (!lr->pp_layout[0]) {
        const int64_t vpp = lr->vpp > 0 ? lr->vpp : !strcmp(lr->schedule, "dualpipev") ? 2 : 1;
        return par_pplayout_default(&lr->pipe, lr->pp, vpp, n_layers, n_mtp);
    }
    par_status s = par_pplayout_parse(lr->pp_layout, &lr->pipe);
    return s ? s : par_pplayout_check(&lr->pipe, lr->pp, lr->pipe.n_segments / lr->pp, n_layers, n_mtp);
}

/* The parts one item of a segment places (-1: none), as parallel/step/exec_hold.c
 * builds a stage: a layer its block, E the embedding, m its MTP block plus
 * the MTP input embeds and the MTP head, L the head and the final part.
 * *layer / *mtp: the block ids of the segment's next t / m. */
static void item_parts(char item, int n_layers, int nb, int *layer, int *mtp, int parts[3])
{
    parts[0] = parts[1] = parts[2] = -1;
    switch (item) {
    case PAR_BLK_EMBED:
        parts[0] = PART_EMBED(nb);
        break;
    case PAR_BLK_LAYER:
        parts[0] = (*layer)++;
        break;
    case PAR_BLK_MTP:
        parts[0] = n_layers + (*mtp)++;
        parts[1] = PART_EMBED(nb);
        parts[2] = PART_HEAD(nb);
        break;
    case PAR_BLK_LOSS:
        parts[0] = PART_HEAD(nb);
        parts[1] = PART_FINAL(nb);
        break;
    }
}

/* Which pipeline ranks hold which parts, exactly as parallel/step/exec_hold.c builds a
 * stage's model (the schedule's segment -> rank map; DualPipe: both
 * directions): v->low[part] = the lowest pipeline rank holding it (the one
 * that writes it), v->held[part] = 1 when this rank's stages hold it. */
static par_status pipe_holders(owner_view *v)
{
    const int nb = v->n_layers + v->n_mtp, np = nb + 3, p = (int)v->l.pp, me = v->rc.pp;
    for (int i = 0; i < np; i++) {
        v->low[i] = p <= 1 ? 0 : -1;
        v->held[i] = p <= 1;
    }
    if (p <= 1)
        return PAR_OK;
    par_layout lr;
    par_status s = pipe_segments(&v->l, v->n_layers, v->n_mtp, &lr);
    if (s)
        return s;
    const par_pplayout *pl = &lr.pipe;
    const int dual = !strcmp(lr.schedule, "dualpipe");
    for (int sg = 0; sg < pl->n_segments; sg++) {
        const int ranks[2] = {par_layout_segment_rank(&lr, sg), dual ? p - 1 - sg : -1};
        int layer = par_pplayout_offset(pl, sg, PAR_BLK_LAYER), mtp = par_pplayout_offset(pl, sg, PAR_BLK_MTP);
        for (int i = pl->seg_off[sg]; i < pl->seg_off[sg + 1]; i++) {
            int parts[3];
            item_parts(pl->items[i], v->n_layers, nb, &layer, &mtp, parts);
            for (int k = 0; k < 3; k++)
                for (int j = 0; j < 2 && parts[k] >= 0 && parts[k] < np; j++) {
                    const int r = ranks[j];
                    if (r < 0)
                        continue;
                    if (v->low[parts[k]] < 0 || r < v->low[parts[k]])
                        v->low[parts[k]] = r;
                    v->held[parts[k]] |= r == me;
                }
        }
    }
    return PAR_OK;
}

/* Every parameter is held by some stage; this rank's EP slot of experts. */
static par_status check_parts_and_experts(owner_view *v, const par_ckpt_tensor *x, int n)
{
    int64_t E = 0;
    for (int i = 0; i < n; i++) {
        if (x[i].slot != PAR_CKPT_PARAM)
            continue;
        if (v->low[v->part[v->entry[i]]] < 0)
            return par_err(PAR_EINVAL, "checkpoint ownership: no pipeline stage of the layout holds '%s' (the layout "
                           "has %d segments for %d layers + %d MTP blocks)", x[i].name, v->l.pipe.n_segments,
                           v->n_layers, v->n_mtp);
        E = x[i].expert + 1 > E ? x[i].expert + 1 : E;
    }
    if (E > 0 && E % v->l.ep)
        return par_err(PAR_EINVAL, "checkpoint ownership: %lld routed experts do not split over EP %lld",
                       (long long)E, (long long)v->l.ep);
    const int64_t per = E > 0 ? E / v->l.ep : 0;
    v->e0 = (int64_t)v->rc.ep * per;
    v->e1 = v->e0 + per;
    return PAR_OK;
}

/* 1 when this rank's stages hold entry i and, for a routed expert, its EP
 * slot does. */
static int entry_held(const owner_view *v, int i)
{
    const par_param *p = &v->t.p[i];
    return v->held[v->part[i]] && (p->expert < 0 || (p->expert >= v->e0 && p->expert < v->e1));
}

/* The geometries of this rank's two groups, exactly as the run builds its
 * plans (parallel/dp/dpw.c): the held float entries, dense over the dp-cp
 * group (rank cp + CP*dp), experts of the slot over the edp group. */
static par_status rank_geoms(owner_view *v)
{
    int *lists = par_malloc((size_t)(v->t.n > 0 ? v->t.n : 1) * 2 * sizeof *lists, PAR_TAG_IO);
    if (!lists)
        return par_err(PAR_ENOMEM, "checkpoint ownership: out of memory for %d parameters", v->t.n);
    int nl[2] = {0, 0};
    for (int i = 0; i < v->t.n; i++)
        if (v->t.p[i].dtype == PAR_PDT_REAL && entry_held(v, i)) {
            const int k = v->t.p[i].expert >= 0;
            lists[k * v->t.n + nl[k]++] = i;
        }
    const int gsize[2] = {(int)(v->l.da * v->l.cp), (int)v->l.de};
    const int grank[2] = {v->rc.cp + (int)v->l.cp * v->rc.dp, v->rc.edp};
    par_status s = PAR_OK;
    for (int k = 0; k < 2 && !s; k++)
        s = par_zero_geom_build(&v->g[k], &v->t, lists + k * v->t.n, nl[k], gsize[k], grank[k]);
    par_free(lists);
    return s;
}

static par_status view_build(owner_view *v, const par_layout *layout, int nranks, int rank,
                             const par_ckpt_tensor *x, int n)
{
    memset(v, 0, sizeof *v);
    par_status s;
    if ((s = owner_layout(layout, nranks, &v->l)) || (s = par_rank_coords_of(&v->l, rank, &v->rc)))
        return s;
    v->mode = v->l.distributed_optimizer ? PAR_DP_ZERO1 : PAR_DP_REPLICATED;
    const size_t cap = (size_t)(n > 0 ? n : 1);
    v->t.p = par_calloc(cap, sizeof *v->t.p, PAR_TAG_IO);
    v->entry = par_calloc(cap, sizeof *v->entry, PAR_TAG_IO);
    v->part = par_calloc(cap, sizeof *v->part, PAR_TAG_IO);
    v->full = par_calloc(2 * cap, sizeof *v->full, PAR_TAG_IO);
    v->cut = par_calloc(cap, sizeof *v->cut, PAR_TAG_IO);
    v->crank = par_calloc(cap, sizeof *v->crank, PAR_TAG_IO);
    v->cP = par_calloc(cap, sizeof *v->cP, PAR_TAG_IO);
    if (!v->t.p || !v->entry || !v->part || !v->full || !v->cut || !v->crank || !v->cP)
        return par_err(PAR_ENOMEM, "checkpoint ownership: out of memory for %d tensors", n);
    if ((s = synth_params(v, x, n)) || (s = synth_state(v, x, n)))
        return s;
    const int np = v->n_layers + v->n_mtp + 3;
    v->low = par_malloc((size_t)np * sizeof *v->low, PAR_TAG_IO);
    v->held = par_malloc((size_t)np, PAR_TAG_IO);
    if (!v->low || !v->held)
        return par_err(PAR_ENOMEM, "checkpoint ownership: out of memory for %d pipeline parts", np);
    if ((s = pipe_holders(v)) || (s = check_parts_and_experts(v, x, n)))
        return s;
    return rank_geoms(v);
}

/* ---- the training driver's rule: what this rank writes ---------------------- */

/* The range [*a, *b) of tensor i this rank writes, in the offsets of the
 * block it holds (a TP / ETP shard's packed offsets); 0 when none. */
static int owned_range(const owner_view *v, const par_ckpt_tensor *x, int i, int64_t *a, int64_t *b)
{
    const int e = v->entry[i];
    const par_param *p = &v->t.p[e];
    *a = 0;
    *b = p->numel;
    if (!entry_held(v, e) || v->low[v->part[e]] != v->rc.pp) /* the lowest stage holding it writes it */
        return 0;
    const int cut = v->cut[e] != 0; /* a shard: every TP (ETP) rank writes its block */
    if (x[i].slot != PAR_CKPT_PARAM && v->mode == PAR_DP_ZERO1) { /* its plan's piece on this rank */
        if (!cut && ((p->expert < 0 && v->rc.tp != 0) || (p->expert >= 0 && v->rc.etp != 0)))
            return 0; /* the TP (ETP) ranks of a dp-cp (edp) rank hold the same piece */
        const par_zero_geom *g = &v->g[p->expert >= 0];
        return par_zero_geom_piece(g, e, g->rank, a, b);
    }
    const int designated = p->expert < 0 ? (v->rc.tp == 0 || cut) && v->rc.cp == 0 && v->rc.dp == 0
                                         : (v->rc.etp == 0 || cut) && v->rc.edp == 0;
    return designated && *b > *a;
}

/* Appends the logical slices of block range [a, b) of tensor i to *sl: one
 * slice (whole or a row shard: at the block's offset), or one per row of a
 * column shard (each row's slice of the rank's columns;
 * parallel/layout/tp_split.h par_tp_shard_run). */
static par_status add_slices(const owner_view *v, const par_ckpt_tensor *x, int i, int64_t a, int64_t b,
                             par_ckpt_slice **sl, int *n, int *cap)
{
    const int e = v->entry[i];
    while (a < b) {
        int64_t run;
        const int64_t g = par_tp_shard_run(v->full[2 * e], v->full[2 * e + 1], (par_tp_cut)v->cut[e], v->crank[e],
                                           v->cP[e] > 0 ? v->cP[e] : 1, a, &run);
        const int64_t len = run < b - a ? run : b - a;
        if (*n == *cap) {
            const int nc = *cap * 2;
            par_ckpt_slice *t = par_realloc(*sl, (size_t)nc * sizeof *t, PAR_TAG_IO);
            if (!t)
                return par_err(PAR_ENOMEM, "checkpoint ownership: out of memory for %d slices", nc);
            *sl = t;
            *cap = nc;
        }
        par_ckpt_slice *o = &(*sl)[(*n)++];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", x[i].name);
        o->begin = g;
        o->end = g + len;
        a += len;
    }
    return PAR_OK;
}

par_status par_ckpt_owner_driver(const par_layout *layout, int nranks, int rank, const par_ckpt_tensor *tensors,
                                 int ntensors, par_ckpt_slice **out, int *nout, void *ud)
{
    (void)ud;
    if (!layout || nranks < 1 || rank < 0 || rank >= nranks || ntensors < 0 || (ntensors > 0 && !tensors))
        return par_err(PAR_EINVAL, "checkpoint ownership: needs a layout, a rank in [0, %d) and tensors", nranks);
    owner_view v;
    par_status s = view_build(&v, layout, nranks, rank, tensors, ntensors);
    int n = 0, cap = ntensors > 0 ? ntensors : 1;
    par_ckpt_slice *sl = NULL;
    if (!s && !(sl = par_calloc((size_t)cap, sizeof *sl, PAR_TAG_IO)))
        s = par_err(PAR_ENOMEM, "checkpoint ownership: out of memory for %d slices", ntensors);
    for (int i = 0; !s && i < ntensors; i++) {
        int64_t a, b;
        if (owned_range(&v, tensors, i, &a, &b))
            s = add_slices(&v, tensors, i, a, b, &sl, &n, &cap);
    }
    view_free(&v);
    if (s) {
        par_free(sl);
        return s;
    }
    *out = sl;
    *nout = n;
    return PAR_OK;
}
