/* parallel/dp/zero.c - replicated DP and ZeRO-1 optimizer steps with Muon
 * ownership by whole matrices (templated).  See parallel/dp/zero.h for the
 * packed layout and the step protocol, docs/parallel.md for the rules.
 */
#include "parallel/dp/zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/racc.h"
#include "model/optim.h"
#include "parallel/reduce/reduce_sum.h"
#include "parallel/tp/tp_muon.h"

#if PAR_REAL_BITS == 64
#define ZC PAR_C_F64
#else
#define ZC PAR_C_F32
#endif

typedef PAR_FN(par_zero_plan) plan_t;

/* Tag of the state-dump messages (point to point inside the plan's group). */
#define ZERO_STATE_TAG 7301

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- plan: the geometry (zero_geom.c) plus state and workspace ----------- */

void PAR_FN(par_zero_plan_free)(plan_t *pl)
{
    if (!pl)
        return;
    par_zero_geom_free(&pl->geom);
    par_free(pl->counts);
    par_free(pl->displs);
    if (!pl->state_ext) {
        par_free(pl->m);
        par_free(pl->v);
        par_free(pl->mom);
    }
    par_free(pl->buf);
    par_free(pl->red);
    memset(pl, 0, sizeof *pl);
}

par_status PAR_FN(par_zero_plan_build)(plan_t *pl, const par_param_table *t, const int *idx, int n_idx, int dp,
                                       int rank, par_dp_mode mode)
{
    return PAR_FN(par_zero_plan_build_shared)(pl, t, idx, n_idx, dp, rank, mode, NULL, NULL);
}

par_status PAR_FN(par_zero_plan_build_shared)(plan_t *pl, const par_param_table *t, const int *idx, int n_idx,
                                              int dp, int rank, par_dp_mode mode, PAR_FN(par_zero_state_fn) get,
                                              void *ctx)
{
    return PAR_FN(par_zero_plan_build_sized)(pl, t, NULL, idx, n_idx, dp, rank, mode, get, ctx);
}

par_status PAR_FN(par_zero_plan_build_sized)(plan_t *pl, const par_param_table *t, const int64_t *numel,
                                             const int *idx, int n_idx, int dp, int rank, par_dp_mode mode,
                                             PAR_FN(par_zero_state_fn) get, void *ctx)
{
    if (!pl)
        return par_err(PAR_EINVAL, "zero plan: needs a plan to build");
    if (mode != PAR_DP_REPLICATED && mode != PAR_DP_ZERO1)
        return par_err(PAR_EINVAL, "zero plan: unknown mode %d", (int)mode);
    plan_t z;
    memset(&z, 0, sizeof z);
    par_status st = par_zero_geom_build_sized(&z.geom, t, numel, idx, n_idx, dp, rank);
    if (st)
        return st;
    z.mode = mode;
    z.counts = par_calloc((size_t)dp, sizeof *z.counts, PAR_TAG_COMM);
    z.displs = par_calloc((size_t)dp, sizeof *z.displs, PAR_TAG_COMM);
    if (!z.counts || !z.displs) {
        st = par_err(PAR_ENOMEM, "zero plan: no memory for the gather counts of %d ranks", dp);
        goto fail_free_plan;
    }
    for (int q = 0; q < dp; q++) {
        z.counts[q] = (size_t)(z.shard + z.load[q]);
        z.displs[q] = (size_t)(q * z.seg);
    }
    /* state and workspace */
    const int zero1 = mode == PAR_DP_ZERO1;
#if PAR_FAULT_ZERO1_STATE_UNSHARDED
    /* the deliberate bug (-Dfault, docs/matrix.md "The plan against the run"): ZeRO-1 shards the
     * update but every rank allocates the replicated state's sizes (the whole group's AdamW m, v
     * and Muon momentum; only its shard is used) */
    const size_t nad = (size_t)((int64_t)dp * z.shard);
    const size_t nmo = (size_t)z.n_muon;
#else
    const size_t nad = (size_t)(zero1 ? z.shard : (int64_t)dp * z.shard);
    const size_t nmo = (size_t)(zero1 ? z.load[rank] : z.n_muon);
#endif
    if (get && !zero1) { /* the process's copy of the replicated state */
        PAR_FN(par_zero_state) ext = {0};
        if ((st = get(ctx, nad, nmo, &ext)))
            goto fail_free_plan;
        z.m = ext.m;
        z.v = ext.v;
        z.mom = ext.mom;
        z.state_ext = 1;
    } else {
        z.m = par_calloc(nad, sizeof *z.m, PAR_TAG_OPTIM);
        z.v = par_calloc(nad, sizeof *z.v, PAR_TAG_OPTIM);
        z.mom = par_calloc(nmo, sizeof *z.mom, PAR_TAG_OPTIM);
    }
    /* replicated mode reduces the caller's gradients in place: no packed
     * buffer (it was dp * seg, O(group x largest Muon load) on every rank) */
    z.buf = par_calloc(zero1 ? (size_t)dp * (size_t)z.seg : 0, sizeof *z.buf, PAR_TAG_COMM);
    z.red = par_calloc(zero1 ? (size_t)z.seg : 0, sizeof *z.red, PAR_TAG_COMM);
    if (!z.m || !z.v || !z.mom || !z.buf || !z.red) {
        st = par_err(PAR_ENOMEM, "zero plan: no memory for the state (%lld + %lld elements) and workspace "
                     "(%lld elements) of rank %d of %d", (long long)(2 * nad), (long long)nmo,
                     (long long)((int64_t)dp * z.seg), rank, dp);
        goto fail_free_plan;
    }
    *pl = z;
    return PAR_OK;

fail_free_plan:
    PAR_FN(par_zero_plan_free)(&z);
    return st;
}

void PAR_FN(par_zero_memory_of)(const plan_t *pl, par_zero_memory *out)
{
    par_zero_geom_memory(&pl->geom, pl->mode, (int64_t)sizeof(par_real), out);
}

/* ---- helpers ------------------------------------------------------------- */

static par_status check_comm(const plan_t *pl, par_comm *comm, const char *what)
{
    if (!pl || !pl->t)
        return par_err(PAR_EINVAL, "%s: the plan is not built", what);
    if (!comm)
        return par_err(PAR_EINVAL, "%s: needs the group's comm", what);
    int n = par_comm_size(comm), r = par_comm_rank(comm);
    if (n != pl->dp || r != pl->rank)
        return par_err(PAR_EINVAL, "%s: comm '%s' is rank %d of %d, the plan was built for rank %d of %d", what,
                       par_comm_name(comm), r, n, pl->rank, pl->dp);
    return PAR_OK;
}

/* The part of AdamW entry e inside shard q: [*a, *b) in flat AdamW
 * positions; returns 0 when empty. */
static int adam_piece(const plan_t *pl, const par_zero_entry *e, int q, int64_t *a, int64_t *b)
{
    *a = max64(e->pos, (int64_t)q * pl->shard);
    *b = min64(e->pos + e->numel, (int64_t)(q + 1) * pl->shard);
    return *a < *b;
}

/* Where AdamW flat position p lies in the packed layout. */
static int64_t adam_at(const plan_t *pl, int64_t p)
{
    int64_t q = p / pl->shard;
    return q * pl->seg + (p - q * pl->shard);
}

/* Copies the plan's tensors between flat table-offset buffers and the packed
 * layout (dp segments of seg); AdamW tensors may straddle shard borders. */
static void pack(const plan_t *pl, const par_real *flat, par_real *packed)
{
    for (int i = 0; i < pl->n; i++) {
        const par_zero_entry *e = &pl->e[i];
        const par_real *f = flat + e->off;
        if (e->opt == PAR_OPT_MUON) {
            memcpy(packed + (int64_t)e->owner * pl->seg + pl->shard + e->pos, f, (size_t)e->numel * sizeof *f);
            continue;
        }
        for (int64_t p = e->pos, len; p < e->pos + e->numel; p += len) {
            len = min64(e->pos + e->numel, (p / pl->shard + 1) * pl->shard) - p;
            memcpy(packed + adam_at(pl, p), f + (p - e->pos), (size_t)len * sizeof *f);
        }
    }
}

static void unpack(const plan_t *pl, const par_real *packed, par_real *flat)
{
    for (int i = 0; i < pl->n; i++) {
        const par_zero_entry *e = &pl->e[i];
        par_real *f = flat + e->off;
        if (e->opt == PAR_OPT_MUON) {
            memcpy(f, packed + (int64_t)e->owner * pl->seg + pl->shard + e->pos, (size_t)e->numel * sizeof *f);
            continue;
        }
        for (int64_t p = e->pos, len; p < e->pos + e->numel; p += len) {
            len = min64(e->pos + e->numel, (p / pl->shard + 1) * pl->shard) - p;
            memcpy(f + (p - e->pos), packed + adam_at(pl, p), (size_t)len * sizeof *f);
        }
    }
}

/* The reduced gradient of entry e from AdamW flat position a (Muon: its
 * first element): ZeRO-1 in segment view g [seg], replicated in the flat
 * buffer the reduction summed in place (pl->rg, table offsets). */
static const par_real *grad_of(const plan_t *pl, const par_zero_entry *e, int q, const par_real *g, int64_t a)
{
    if (!g) {
        const int64_t off = e->off;
        return pl->rg + off + (e->opt == PAR_OPT_MUON ? 0 : a - e->pos);
    }
    return e->opt == PAR_OPT_MUON ? g + pl->shard + e->pos : g + (a - (int64_t)q * pl->shard);
}

/* Muon of a matrix held as TP shards (c): the logical [rows, cols] matrix
 * through par_tp_muon_update, orthogonalized on TP rank idx mod TP (the
 * deliberate shard-fed bug under tp_muon_shard_fault). */
static par_status held_muon(const plan_t *pl, const par_model_cut *c, const par_zero_entry *e, const par_param *p,
                            par_real *w, par_real *mom, const par_real *g, const par_config *cfg, double gscale)
{
    const par_tp tp = {.comm = pl->tpc, .sp = 0,
                       .faults = pl->tp_muon_shard_fault > 1 ? (unsigned)PAR_TP_FAULT_MUON_SHARD : 0u,
                       .traffic = NULL};
    if (!pl->tpc || par_comm_size(pl->tpc) != c->P)
        return par_err(PAR_EINTERNAL, "zero: %s is held as a shard of %d but the plan has no TP group of that size",
                       p->name, c->P);
    return PAR_FN(par_tp_muon_update)(w, mom, g, p->shape[0], p->shape[1], c->cut == 1 ? PAR_TP_ROWS : PAR_TP_COLS,
                                      e->idx % c->P, gscale, cfg->lr, p->weight_decay ? cfg->wd : 0.0, cfg->mu, &tp);
}

/* Updates segment q: its AdamW shard and the Muon matrices q owns.
 * g: the reduced gradients of the segment [seg], or NULL: those of the flat
 * buffer pl->rg (replicated); m, v: the shard's AdamW state [shard]; mom:
 * q's Muon momentum [load[q]].  w == NULL updates params in place; else the
 * segment's parameters are copied from params into w [seg] and updated
 * there. */
static par_status update_segment(const plan_t *pl, int q, par_real *params, par_real *w, const par_real *g,
                                 par_real *m, par_real *v, par_real *mom, const par_config *cfg, int64_t step,
                                 double gscale)
{
    const par_param_table *t = pl->t;
    const int64_t base = (int64_t)q * pl->shard;
    for (int i = 0; i < pl->n; i++) {
        const par_zero_entry *e = &pl->e[i];
        int64_t a, b;
        if (e->opt != PAR_OPT_ADAMW || !adam_piece(pl, e, q, &a, &b))
            continue;
        const par_param *p = &t->p[e->idx];
        par_real *src = params + e->off + (a - e->pos);
        par_real *dst = src;
        if (w) {
            dst = w + (a - base);
            memcpy(dst, src, (size_t)(b - a) * sizeof *dst);
        }
        PAR_FN(par_adamw_update)(dst, m + (a - base), v + (a - base), grad_of(pl, e, q, g, a), b - a, gscale, cfg->lr,
                                 p->weight_decay ? cfg->wd : 0.0, step);
    }
    for (int k = pl->owned_begin[q]; k < pl->owned_begin[q + 1]; k++) {
        const par_zero_entry *e = &pl->e[pl->owned[k]];
        const par_param *p = &t->p[e->idx];
        par_real *dst = params + e->off;
        if (w) {
            dst = w + pl->shard + e->pos;
            memcpy(dst, params + e->off, (size_t)e->numel * sizeof *dst);
        }
        const par_model_cut *c = pl->tp_cut && pl->tp_cut[e->idx].cut ? &pl->tp_cut[e->idx] : NULL;
        par_status st =
            c ? held_muon(pl, c, e, p, dst, mom + e->pos, grad_of(pl, e, q, g, e->pos), cfg, gscale)
            : pl->tp_muon_shard_fault > 1
                ? PAR_FN(par_tp_muon_shard_fault)(dst, mom + e->pos, grad_of(pl, e, q, g, e->pos), p->name,
                                                  p->shape[0], p->shape[1], pl->tp_muon_shard_fault, gscale, cfg->lr,
                                                  p->weight_decay ? cfg->wd : 0.0, cfg->mu)
                : PAR_FN(par_muon_update)(dst, mom + e->pos, grad_of(pl, e, q, g, e->pos), p->shape[0], p->shape[1],
                                          gscale, cfg->lr, p->weight_decay ? cfg->wd : 0.0, cfg->mu);
        if (st)
            return st;
    }
    return PAR_OK;
}

/* Copies segment q's state between its packed pieces (m, v: [shard];
 * mom: [load[q]]) and flat table-offset buffers; to_full 1 writes the flat
 * buffers. */
static void state_copy(const plan_t *pl, int q, par_real *m, par_real *v, par_real *mom, par_real *m_full,
                       par_real *v_full, int to_full)
{
    const int64_t base = (int64_t)q * pl->shard;
    for (int i = 0; i < pl->n; i++) {
        const par_zero_entry *e = &pl->e[i];
        int64_t a, b;
        if (e->opt != PAR_OPT_ADAMW || !adam_piece(pl, e, q, &a, &b))
            continue;
        const int64_t off = e->off + (a - e->pos);
        const size_t nb = (size_t)(b - a) * sizeof *m;
        if (to_full) {
            memcpy(m_full + off, m + (a - base), nb);
            memcpy(v_full + off, v + (a - base), nb);
        } else {
            memcpy(m + (a - base), m_full + off, nb);
            memcpy(v + (a - base), v_full + off, nb);
        }
    }
    for (int k = pl->owned_begin[q]; k < pl->owned_begin[q + 1]; k++) {
        const par_zero_entry *e = &pl->e[pl->owned[k]];
        const int64_t off = e->off;
        const size_t nb = (size_t)e->numel * sizeof *mom;
        if (to_full)
            memcpy(m_full + off, mom + e->pos, nb);
        else
            memcpy(mom + e->pos, m_full + off, nb);
    }
}

/* ---- the step ------------------------------------------------------------ */

#define DP_REDUCE_CHUNK ((size_t)PAR_ZERO_REDUCE_CHUNK)

/* Replicated: the plan's tensors of grads summed in place, each element in
 * rank order like the packed all-reduce; the tensors, in table order, cut
 * into chunks of DP_REDUCE_CHUNK elements, one collective per chunk (the
 * reduction module packs a chunk's fields without padding). */
static par_status reduce_in_place(const plan_t *pl, par_comm *comm, par_real *grads)
{
    par_field *f = par_malloc((size_t)(pl->n + 2) * sizeof *f, PAR_TAG_COMM);
    if (!f)
        return par_err(PAR_ENOMEM, "dp reduce: out of memory for %d fields", pl->n);
    par_status st = PAR_OK;
    size_t have = 0;
    int nf = 0;
    for (int i = 0; i < pl->n && !st; i++) {
        par_real *p = grads + pl->e[i].off;
        for (size_t left = (size_t)pl->e[i].numel, take; left > 0 && !st; p += take, left -= take) {
            take = left < DP_REDUCE_CHUNK - have ? left : DP_REDUCE_CHUNK - have;
            f[nf++] = PAR_FIELD(p, take, ZC);
            if ((have += take) == DP_REDUCE_CHUNK) {
                st = par_reduce_fields(comm, f, nf, NULL);
                have = 0;
                nf = 0;
            }
        }
    }
    if (!st && nf > 0)
        st = par_reduce_fields(comm, f, nf, NULL);
    par_free(f);
    return st;
}

par_status PAR_FN(par_dp_reduce_grads)(plan_t *pl, par_comm *comm, par_real *grads)
{
    par_status st = check_comm(pl, comm, "dp reduce");
    if (st)
        return st;
    if (!grads)
        return par_err(PAR_EINVAL, "dp reduce: needs the local gradients");
    const int zero1 = pl->mode == PAR_DP_ZERO1;
    const size_t total = zero1 ? (size_t)pl->dp * (size_t)pl->seg : (size_t)(pl->n_adamw + pl->n_muon);
    pl->reduced = 0;
    pl->rg = NULL;
    if (total == 0) { /* nothing to reduce; every rank of the group knows it */
        pl->reduced = 1;
        return PAR_OK;
    }
    if (!zero1) {
        if ((st = reduce_in_place(pl, comm, grads)))
            return st;
        pl->rg = grads;
        pl->reduced = 1;
        return PAR_OK;
    }
    if (par_racc_lookup(grads, 1).acc) {
        /* the bitwise mode: the order-free accumulator merged in place (the
         * registry backs grads, not the packed copy), then this rank's block */
        if ((st = reduce_in_place(pl, comm, grads)))
            return st;
        memset(pl->buf, 0, total * sizeof *pl->buf);
        pack(pl, grads, pl->buf);
        memcpy(pl->red, pl->buf + (size_t)pl->rank * (size_t)pl->seg, (size_t)pl->seg * sizeof *pl->buf);
        pl->reduced = 1;
        return PAR_OK;
    }
    memset(pl->buf, 0, total * sizeof *pl->buf);
    pack(pl, grads, pl->buf);
    /* the sum through the reduction module (parallel/reduce/reduce_sum.h): ZeRO-1
     * reduce-scatters the packed segments */
    par_field f = PAR_FIELD(pl->buf, total, ZC);
    st = par_reduce_fields(comm, &f, 1, pl->red);
    if (st)
        return st;
    pl->reduced = 1;
    return PAR_OK;
}

par_status PAR_FN(par_zero_reduced_grads)(plan_t *pl, par_comm *comm, par_real *grads)
{
    if ((int64_t)pl->dp * pl->seg == 0 || pl->mode != PAR_DP_ZERO1)
        return PAR_OK; /* replicated: reduced in place in grads already */
    par_status st = par_allgatherv(comm, pl->red, pl->counts[pl->rank], pl->buf, pl->counts, pl->displs, ZC);
    if (st)
        return st;
    unpack(pl, pl->buf, grads);
    return PAR_OK;
}

const par_real *PAR_FN(par_zero_grad_at)(const plan_t *pl, const par_zero_entry *e, int64_t a)
{
    return grad_of(pl, e, pl->rank, pl->mode == PAR_DP_ZERO1 ? pl->red : NULL, a);
}

par_status PAR_FN(par_zero_grad_sumsq)(const plan_t *pl, double *out)
{
    if (!pl || !pl->t || !out)
        return par_err(PAR_EINVAL, "zero sumsq: needs a built plan and an output");
    if (!pl->reduced)
        return par_err(PAR_EINVAL, "zero sumsq: the gradients of rank %d of %d are not reduced yet "
                       "(call par_dp_reduce_grads first)", pl->rank, pl->dp);
    /* the segment's AdamW pieces in flat order, then its Muon matrices: the
     * element order of the packed segment */
    double s = 0.0;
    for (int i = 0; i < pl->n; i++) {
        const par_zero_entry *e = &pl->e[i];
        int64_t a, b;
        if (e->opt != PAR_OPT_ADAMW || !adam_piece(pl, e, pl->rank, &a, &b))
            continue;
        const par_real *g = PAR_FN(par_zero_grad_at)(pl, e, a);
        for (int64_t j = 0; j < b - a; j++)
            s += (double)g[j] * (double)g[j];
    }
    for (int k = pl->owned_begin[pl->rank]; k < pl->owned_begin[pl->rank + 1]; k++) {
        const par_zero_entry *e = &pl->e[pl->owned[k]];
        const par_real *g = PAR_FN(par_zero_grad_at)(pl, e, e->pos);
        for (int64_t j = 0; j < e->numel; j++)
            s += (double)g[j] * (double)g[j];
    }
    *out = s;
    return PAR_OK;
}

par_status PAR_FN(par_dp_apply)(plan_t *pl, par_comm *comm, par_real *params, const par_config *cfg,
                                int64_t step, double gscale)
{
    return PAR_FN(par_dp_apply_ext)(pl, comm, params, cfg, step, gscale, 1);
}

par_status PAR_FN(par_dp_apply_ext)(plan_t *pl, par_comm *comm, par_real *params, const par_config *cfg,
                                    int64_t step, double gscale, int write)
{
    par_status st = check_comm(pl, comm, "dp apply");
    if (st)
        return st;
    if (!params || !cfg)
        return par_err(PAR_EINVAL, "dp apply: needs params and a config");
    if (!pl->reduced)
        return par_err(PAR_EINVAL, "dp apply: the gradients of rank %d of %d are not reduced yet "
                       "(call par_dp_reduce_grads first)", pl->rank, pl->dp);
    if (step < 1)
        return par_err(PAR_EINVAL, "dp apply: the step must be >= 1 (1-based), got %lld", (long long)step);
    pl->reduced = 0;
    if (pl->dp * pl->seg == 0)
        return PAR_OK;
    if (pl->mode == PAR_DP_REPLICATED) {
        for (int q = 0; write && q < pl->dp; q++) {
            st = update_segment(pl, q, params, NULL, NULL, pl->m + (int64_t)q * pl->shard,
                                pl->v + (int64_t)q * pl->shard, pl->mom + pl->muon_base[q], cfg, step, gscale);
            if (st)
                return st;
        }
        return PAR_OK;
    }
    par_real *mine = pl->buf + (int64_t)pl->rank * pl->seg;
    st = update_segment(pl, pl->rank, params, mine, pl->red, pl->m, pl->v, pl->mom, cfg, step, gscale);
    if (st)
        return st;
    st = par_allgatherv(comm, mine, pl->counts[pl->rank], pl->buf, pl->counts, pl->displs, ZC);
    if (st)
        return st;
    if (write)
        unpack(pl, pl->buf, params);
    return PAR_OK;
}

par_status PAR_FN(par_dp_step)(plan_t *const *plans, par_comm *const *comms, int n_plans, par_comm *norm_comm,
                               par_real *params, par_real *grads, const par_config *cfg, int64_t step,
                               double *grad_norm)
{
    if (n_plans < 0 || (n_plans > 0 && (!plans || !comms)) || !norm_comm || !params || !grads || !cfg)
        return par_err(PAR_EINVAL, "dp step: needs plans, their comms, the norm comm, params, grads and a config "
                       "(%d plans)", n_plans);
    par_status st;
    double s = 0.0, tot = 0.0;
    for (int i = 0; i < n_plans; i++) {
        if ((st = PAR_FN(par_dp_reduce_grads)(plans[i], comms[i], grads)))
            return st;
        double share;
        if ((st = PAR_FN(par_zero_grad_sumsq)(plans[i], &share)))
            return st;
        s += share;
    }
    tot = s;
    par_field nf = PAR_FIELD(&tot, 1, PAR_C_F64);
    if ((st = par_reduce_fields(norm_comm, &nf, 1, NULL)))
        return st;
    const double norm = sqrt(tot);
    const double f = par_clip_factor(norm, cfg->clip_grad);
    for (int i = 0; i < n_plans; i++)
        if ((st = PAR_FN(par_dp_apply)(plans[i], comms[i], params, cfg, step, f)))
            return st;
    if (grad_norm)
        *grad_norm = norm;
    return PAR_OK;
}

static par_status step_one(plan_t *pl, par_dp_mode want, const char *what, par_comm *comm, par_real *params,
                           par_real *grads, const par_config *cfg, int64_t step, double *grad_norm)
{
    if (!pl || !pl->t)
        return par_err(PAR_EINVAL, "%s: the plan is not built", what);
    if (pl->mode != want)
        return par_err(PAR_EINVAL, "%s: the plan was built for the %s mode", what,
                       pl->mode == PAR_DP_ZERO1 ? "ZeRO-1" : "replicated");
    return PAR_FN(par_dp_step)(&pl, &comm, 1, comm, params, grads, cfg, step, grad_norm);
}

par_status PAR_FN(par_zero_step)(plan_t *pl, par_comm *comm, par_real *params, par_real *grads,
                                 const par_config *cfg, int64_t step, double *grad_norm)
{
    return step_one(pl, PAR_DP_ZERO1, "zero step", comm, params, grads, cfg, step, grad_norm);
}

par_status PAR_FN(par_dp_step_replicated)(plan_t *pl, par_comm *comm, par_real *params, par_real *grads,
                                          const par_config *cfg, int64_t step, double *grad_norm)
{
    return step_one(pl, PAR_DP_REPLICATED, "dp step (replicated)", comm, params, grads, cfg, step, grad_norm);
}

/* ---- state dump / load --------------------------------------------------- */

par_status PAR_FN(par_zero_state_gather)(const plan_t *pl, par_comm *comm, int root, par_real *m_full,
                                         par_real *v_full)
{
    par_status st = check_comm(pl, comm, "zero state gather");
    if (st)
        return st;
    if (root < 0 || root >= pl->dp)
        return par_err(PAR_ERANGE, "zero state gather: root %d outside the group [0, %d)", root, pl->dp);
    const int me = pl->rank;
    if (me == root && (!m_full || !v_full))
        return par_err(PAR_EINVAL, "zero state gather: root %d needs both output buffers", root);
    if (pl->mode == PAR_DP_REPLICATED) {
        if (me == root)
            for (int q = 0; q < pl->dp; q++)
                state_copy(pl, q, pl->m + (int64_t)q * pl->shard, pl->v + (int64_t)q * pl->shard,
                           pl->mom + pl->muon_base[q], m_full, v_full, 1);
        return PAR_OK;
    }
    if (me != root) {
        const size_t n = (size_t)(2 * pl->shard + pl->load[me]);
        if (n == 0)
            return PAR_OK;
        par_real *tmp = par_malloc(n * sizeof *tmp, PAR_TAG_COMM);
        if (!tmp)
            return par_err(PAR_ENOMEM, "zero state gather: no memory for %zu elements", n);
        memcpy(tmp, pl->m, (size_t)pl->shard * sizeof *tmp);
        memcpy(tmp + pl->shard, pl->v, (size_t)pl->shard * sizeof *tmp);
        memcpy(tmp + 2 * pl->shard, pl->mom, (size_t)pl->load[me] * sizeof *tmp);
        st = par_send(comm, tmp, n, ZC, root, ZERO_STATE_TAG);
        par_free(tmp);
        return st;
    }
    par_real *tmp = par_malloc((size_t)(2 * pl->shard + pl->load_max + 1) * sizeof *tmp, PAR_TAG_COMM);
    if (!tmp)
        return par_err(PAR_ENOMEM, "zero state gather: no memory for %lld elements",
                       (long long)(2 * pl->shard + pl->load_max));
    for (int q = 0; q < pl->dp; q++) {
        if (q == me) {
            state_copy(pl, q, pl->m, pl->v, pl->mom, m_full, v_full, 1);
            continue;
        }
        const size_t n = (size_t)(2 * pl->shard + pl->load[q]);
        if (n == 0)
            continue;
        if ((st = par_recv(comm, tmp, n, ZC, q, ZERO_STATE_TAG)))
            break;
        state_copy(pl, q, tmp, tmp + pl->shard, tmp + 2 * pl->shard, m_full, v_full, 1);
    }
    par_free(tmp);
    return st;
}

void PAR_FN(par_zero_state_load)(plan_t *pl, const par_real *m_full, const par_real *v_full)
{
    if (pl->mode == PAR_DP_REPLICATED) {
        for (int q = 0; q < pl->dp; q++)
            state_copy(pl, q, pl->m + (int64_t)q * pl->shard, pl->v + (int64_t)q * pl->shard,
                       pl->mom + pl->muon_base[q], (par_real *)m_full, (par_real *)v_full, 0);
        return;
    }
    state_copy(pl, pl->rank, pl->m, pl->v, pl->mom, (par_real *)m_full, (par_real *)v_full, 0);
}
