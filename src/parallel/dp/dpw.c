/* parallel/dp/dpw.c - the data-parallel optimizer step: ZeRO-1 /
 * replicated DP on a rank's model (see parallel/dp/dpw.h,
 * docs/parallel.md). */
#include "parallel/dp/dpw.h"

#include <string.h>

#include "core/alloc.h"
#include "core/counters.h"
#include "model/optim.h"
#include "parallel/tp/tp_reduce.h"
#include "parallel/layout/tp_split.h"

typedef PAR_FN(par_dpw) dpw_t;
typedef PAR_FN(par_zero_plan) plan_t;

void PAR_FN(par_dpw_free)(dpw_t *w)
{
    if (!w)
        return;
    PAR_FN(par_zero_plan_free)(&w->plan[0]);
    PAR_FN(par_zero_plan_free)(&w->plan[1]);
    memset(w, 0, sizeof *w);
}

par_status PAR_FN(par_dpw_init)(dpw_t *w, const par_pctx *P, PAR_FN(par_model) *M)
{
    return PAR_FN(par_dpw_init_shared)(w, P, M, NULL);
}

par_status PAR_FN(par_dpw_init_shared)(dpw_t *w, const par_pctx *P, PAR_FN(par_model) *M,
                                       PAR_FN(par_replica_ticket) *rt)
{
    memset(w, 0, sizeof *w);
    if (rt && rt->rep && M->shw) {
        w->rt = rt;
        w->base[PAR_DPW_EXPERT] = M->n_shared;
    }
    const par_param_table *t = &M->tab;
    par_status s = PAR_OK;
    int *lists = NULL;
    int64_t *numel = NULL;
    w->mode = P->lay->distributed_optimizer ? PAR_DP_ZERO1 : PAR_DP_REPLICATED;
    w->comm[PAR_DPW_DENSE] = P->g.g[PAR_GROUP_DP_CP];
    w->comm[PAR_DPW_EXPERT] = P->g.g[PAR_GROUP_EDP];
    if (!w->comm[0] || !w->comm[1])
        return par_err(PAR_EINVAL, "dp wiring: rank %d has no dp-cp or edp group", P->rank);

    /* the plans on the model's table, each entry mapped to the model's local
     * buffers (no per-rank copy of the table: 1.7 MiB per rank of v4-mini) */
    w->n_tab = t->n;
    lists = par_malloc((size_t)(t->n > 0 ? t->n : 1) * 2 * sizeof *lists, PAR_TAG_MODEL);
    if (!lists) {
        s = par_err(PAR_ENOMEM, "dp wiring: out of memory for a table of %d entries", t->n);
        goto fail_free;
    }
    int nl[2] = {0, 0};
    for (int i = 0; i < t->n; i++) {
        const par_param *p = &t->p[i];
        if (p->dtype != PAR_PDT_REAL || PAR_FN(par_model_loc)(M, i) < 0)
            continue;
        int k = p->expert >= 0 ? PAR_DPW_EXPERT : PAR_DPW_DENSE;
        lists[k * t->n + nl[k]++] = i;
    }
    if (M->cut && !(numel = par_malloc((size_t)t->n * sizeof *numel, PAR_TAG_MODEL))) {
        s = par_err(PAR_ENOMEM, "dp wiring: out of memory for the held sizes of %d entries", t->n);
        goto fail_free;
    }
    for (int i = 0; numel && i < t->n; i++) /* the plans over the held shards */
        numel[i] = PAR_FN(par_model_numel)(M, i);
    w->chain[PAR_DPW_DENSE] = M->cut ? P->g.g[PAR_GROUP_TP] : NULL;
    w->chain[PAR_DPW_EXPERT] = M->cut ? P->g.g[PAR_GROUP_ETP] : NULL;
    for (int k = 0; k < 2; k++) {
        par_comm *c = w->comm[k];
        const int shared = k == PAR_DPW_DENSE && w->rt;
        if ((s = PAR_FN(par_zero_plan_build_sized)(&w->plan[k], t, numel, lists + k * t->n, nl[k], par_comm_size(c),
                                                   par_comm_rank(c), w->mode,
                                                   shared ? PAR_FN(par_replica_state) : NULL, w->rt)))
            goto fail_free;
        for (int j = 0; j < w->plan[k].n; j++)
            w->plan[k].e[j].off = PAR_FN(par_model_loc)(M, w->plan[k].e[j].idx) - w->base[k];
        w->plan[k].tp_cut = M->cut; /* its shard-held Muon matrices meet on the TP group */
        w->plan[k].tpc = w->chain[k];
    }
    par_free(lists);
    par_free(numel);
    /* the state lives in the plans now */
    par_free(M->opt_m);
    par_free(M->opt_v);
    M->opt_m = M->opt_v = NULL;
    return PAR_OK;

fail_free:
    par_free(lists);
    par_free(numel);
    PAR_FN(par_dpw_free)(w);
    return s;
}

void PAR_FN(par_dpw_set_tp_muon_shard_fault)(dpw_t *w, int tp)
{
    w->plan[PAR_DPW_DENSE].tp_muon_shard_fault = tp;
}

/* Whether the norm mask (bits, NULL: none) skips entry idx (par_dpw_norm). */
static int skips(const unsigned char *skip, int idx) { return skip && skip[idx >> 3] >> (idx & 7) & 1; }

/* Entry idx's cut when M holds it by columns (their element order is not
 * the shards' rank order: counted gathered, col_shares), else NULL. */
static const par_model_cut *col_cut(const par_model_cut *cut, int idx)
{
    return cut && cut[idx].cut == 2 ? &cut[idx] : NULL;
}

/* Adds this rank's share of every entry's squared norm to per[idx]: the
 * reduced elements of ITS segment (AdamW pieces in its shard, its Muon
 * matrices), in element order, in double.  The segments of a group
 * partition its tensors, so over the world every element is counted once;
 * an entry inside one segment gets exactly par_sumsq of the entry.
 * Column shards (cut) are left to col_shares. */
static void entry_shares(const plan_t *pl, const unsigned char *skip, const par_model_cut *cut, const double *start,
                         double *per)
{
    const int64_t base = (int64_t)pl->rank * pl->shard;
    for (int i = 0; i < pl->n; i++) {
        const par_zero_entry *e = &pl->e[i];
        if (e->opt != PAR_OPT_ADAMW || col_cut(cut, e->idx))
            continue;
        int64_t a = e->pos > base ? e->pos : base;
        int64_t b = e->pos + e->numel < base + pl->shard ? e->pos + e->numel : base + pl->shard;
        if (a >= b || skips(skip, e->idx))
            continue;
        const par_real *g = PAR_FN(par_zero_grad_at)(pl, e, a);
        double s = start ? start[e->idx] : 0.0;
        for (int64_t p = 0; p < b - a; p++)
            s += (double)g[p] * (double)g[p];
        per[e->idx] = s;
    }
    for (int k = pl->owned_begin[pl->rank]; k < pl->owned_begin[pl->rank + 1]; k++) {
        const par_zero_entry *e = &pl->e[pl->owned[k]];
        if (skips(skip, e->idx) || col_cut(cut, e->idx))
            continue;
        const par_real *x = PAR_FN(par_zero_grad_at)(pl, e, e->pos);
        double s = start ? start[e->idx] : 0.0;
        for (int64_t j = 0; j < e->numel; j++)
            s += (double)x[j] * (double)x[j];
        per[e->idx] = s;
    }
}

/* The squared norms of the Muon matrices this rank's segment owns that M
 * holds as column shards (wo_b, the shared / routed w2): the shards
 * gathered over the plan's group w->chain[k] on its rank idx mod P, the
 * logical matrix rebuilt there and summed in its element order (exactly
 * the whole entry's par_sumsq; the shards' rank order would interleave the
 * rows).  Collective over the group, every rank in plan order; only the
 * gathering rank sets per[idx]; skip: the norm mask.  A column-cut AdamW entry has no element
 * order of its own in a ZeRO-1 segment: PAR_EINTERNAL (tp_split.c cuts
 * none). */
static par_status col_shares(dpw_t *w, const PAR_FN(par_model) *M, int k, const unsigned char *skip, double *per)
{
    const plan_t *pl = &w->plan[k];
    const par_tp tp = {.comm = w->chain[k], .sp = 0, .faults = 0, .traffic = NULL};
    const int P = w->chain[k] ? par_comm_size(w->chain[k]) : 1, r = w->chain[k] ? par_comm_rank(w->chain[k]) : 0;
    par_real *all = NULL;
    par_status s = PAR_OK;
    for (int j = 0; !s && P > 1 && j < pl->n; j++) {
        const par_zero_entry *e = &pl->e[j];
        const par_model_cut *c = col_cut(M->cut, e->idx);
        if (!c)
            continue;
        if (e->opt != PAR_OPT_MUON) {
            s = par_err(PAR_EINTERNAL, "dp step: %s is held as column shards but is not a Muon matrix (its norm "
                        "would not follow its element order)", M->tab.p[e->idx].name);
            break;
        }
        if (e->owner != pl->rank || skips(skip, e->idx))
            continue;
        const par_param *p = &M->tab.p[e->idx];
        const int owner = e->idx % P;
        const size_t n = (size_t)e->numel;
        par_free(all);
        all = r == owner ? par_malloc(2 * n * (size_t)P * sizeof *all, PAR_TAG_COMM) : NULL;
        if (r == owner && !all) {
            s = par_err(PAR_ENOMEM, "dp step: out of memory for the gathered norm of %s", p->name);
            break;
        }
        if ((s = PAR_FN(par_tp_reduce_to_owner)(&tp, owner, all, PAR_FN(par_zero_grad_at)(pl, e, e->pos), n)) || r != owner)
            continue;
        par_real *full = all + n * (size_t)P;
        for (int q = 0; q < P; q++)
            par_tp_unslice(full, all + (size_t)q * n, p->shape[0], p->shape[1], PAR_TP_COLS, q, P, sizeof *full);
        double sq = 0.0;
        for (int64_t i = 0; i < p->numel; i++)
            sq += (double)full[i] * (double)full[i];
        per[e->idx] = sq;
    }
    par_free(all);
    return s;
}

enum { TAG_NORM_CHAIN = 6204 };

/* 1 when M holds entry idx as row shards (chained in rank order). */
static int row_cut(const PAR_FN(par_model) *M, int idx)
{
    const par_model_cut *c = PAR_FN(par_model_cut_of)(M, idx);
    return c && c->cut == 1;
}

/* Plan k's entries' shares of the squared norm on this rank (entry_shares).
 * Entries held as row shards: chained over the plan's group w->chain[k]
 * (TP, ETP), rank r starting from rank r-1's sums and handing its own on
 * (only the last rank keeps them for the world sum): rows blocks in rank
 * order are the serial element order, so a shard entry inside one segment
 * gets exactly the whole entry's par_sumsq order.  Column shards: gathered
 * (col_shares). */
static par_status plan_shares(dpw_t *w, const PAR_FN(par_model) *M, int k, const unsigned char *skip, double *per)
{
    const plan_t *pl = &w->plan[k];
    par_comm *c = w->chain[k];
    const int r = c ? par_comm_rank(c) : 0, P = c ? par_comm_size(c) : 1;
    int ns = 0;
    for (int j = 0; P > 1 && j < pl->n; j++)
        ns += row_cut(M, pl->e[j].idx);
    if (ns == 0) {
        entry_shares(pl, skip, M->cut, NULL, per);
        return col_shares(w, M, k, skip, per);
    }
    double *start = par_calloc((size_t)w->n_tab + (size_t)ns, sizeof *start, PAR_TAG_COMM), *pk = start + w->n_tab;
    if (!start)
        return par_err(PAR_ENOMEM, "dp step: out of memory for the norm chain of %d shards", ns);
    par_status s = r > 0 ? par_recv(c, pk, (size_t)ns, PAR_C_F64, r - 1, TAG_NORM_CHAIN) : PAR_OK;
    for (int j = 0, q = 0; !s && j < pl->n; j++)
        if (row_cut(M, pl->e[j].idx))
            start[pl->e[j].idx] = pk[q++];
    if (!s)
        entry_shares(pl, skip, M->cut, start, per);
    for (int j = 0, q = 0; !s && r < P - 1 && j < pl->n; j++) {
        const int i = pl->e[j].idx;
        if (row_cut(M, i)) {
            pk[q++] = per[i] != 0.0 ? per[i] : start[i];
            per[i] = 0.0; /* the last rank's sum counts */
        }
    }
    if (!s && r < P - 1)
        s = par_send(c, pk, (size_t)ns, PAR_C_F64, r + 1, TAG_NORM_CHAIN);
    par_free(start);
    return s ? s : col_shares(w, M, k, skip, per);
}

static par_status norm_shares(dpw_t *w, const PAR_FN(par_model) *M, const unsigned char *skip, double *per)
{
    par_status s = plan_shares(w, M, PAR_DPW_DENSE, skip, per);
    return s ? s : plan_shares(w, M, PAR_DPW_EXPERT, skip, per);
}

/* The balance update of gate.bias from the global loads (identical on
 * every replica): on every rank that writes its dense weights. */
static void balance(PAR_FN(par_model) *M)
{
    const par_config *cfg = &M->cfg;
    for (int b = 0; b < M->n_blocks; b++) {
        par_real *bias = PAR_FN(par_model_ptr)(M, M->params, M->tab.blocks[b].gate_bias);
        if (bias)
            PAR_FN(par_balance_update)(bias, M->stats.loads + (int64_t)b * M->E, M->E, M->K, M->stats.n_tokens,
                                       cfg->bias_update_rate);
    }
}

/* 3. AdamW / Muon on what this rank owns (ZeRO-1: + all-gather), 4. the
 * balance update.  With a shared copy the dense plan writes it on the
 * writer alone (ZeRO-1: every member still updates its segment and takes
 * part in the all-gather; replicated: the others skip the update and are
 * charged its counted work, par_replica_wait), and the writer publishes.
 * Safe: every member has entered the norm's world all-reduce, so none
 * reads the copy of this step any more; none reads it again before the
 * phase is published. */
static par_status apply_updates(dpw_t *w, PAR_FN(par_model) *M, int64_t step, double f, int write)
{
    const par_counts c0 = par_counts_get();
    par_status s = PAR_FN(par_dp_apply_ext)(&w->plan[PAR_DPW_DENSE], w->comm[PAR_DPW_DENSE], w->rt ? M->shw : M->params,
                                            &M->cfg, step, f, write);
    const par_counts c1 = par_counts_get();
    if (!s)
        s = PAR_FN(par_dp_apply)(&w->plan[PAR_DPW_EXPERT], w->comm[PAR_DPW_EXPERT], M->params, &M->cfg, step, f);
    if (s)
        return s;
    if (write)
        balance(M);
    if (w->rt && write) {
        /* replicated: the others skipped the dense update's work (ZeRO-1: they did their own) */
        const int rep = w->plan[PAR_DPW_DENSE].mode == PAR_DP_REPLICATED;
        par_counts dw = {rep ? c1.flops - c0.flops : 0, rep ? c1.bytes - c0.bytes : 0};
        PAR_FN(par_replica_publish)(w->rt, dw);
    }
    return PAR_OK;
}

par_status PAR_FN(par_dpw_reduce)(dpw_t *w, PAR_FN(par_model) *M)
{
    if (!M->have_fwd)
        return par_err(PAR_EINVAL, "dp step: no forward / backward to apply");
    for (int k = 0; k < 2; k++) {
        par_status s = PAR_FN(par_dp_reduce_grads)(&w->plan[k], w->comm[k], M->grads + w->base[k]);
        if (s)
            return s;
    }
    return PAR_OK;
}

/* The bitwise mode's shares (docs/bitwise.md): the squares of the same
 * elements entry_shares and col_shares count on this rank (its segment's
 * AdamW pieces and owned Muon entries; of a sharded entry its own shard),
 * each deposited as a term of entry idx's order-free sum, so no chain or
 * gather is needed: the world merge adds every rank's terms exactly. */
static void racc_shares(const dpw_t *w, const PAR_FN(par_model) *M, int k, const unsigned char *skip, par_racc *acc)
{
    const plan_t *pl = &w->plan[k];
    const int64_t base = (int64_t)pl->rank * pl->shard;
    for (int i = 0; i < pl->n; i++) {
        const par_zero_entry *e = &pl->e[i];
        if (e->opt != PAR_OPT_ADAMW || col_cut(M->cut, e->idx) || skips(skip, e->idx))
            continue;
        int64_t a = e->pos > base ? e->pos : base;
        int64_t b = e->pos + e->numel < base + pl->shard ? e->pos + e->numel : base + pl->shard;
        const par_real *g = a < b ? PAR_FN(par_zero_grad_at)(pl, e, a) : NULL;
        for (int64_t p = 0; g && p < b - a; p++)
            par_racc_put(acc, (size_t)e->idx, (double)g[p] * (double)g[p]);
    }
    for (int j = pl->owned_begin[pl->rank]; j < pl->owned_begin[pl->rank + 1]; j++) {
        const par_zero_entry *e = &pl->e[pl->owned[j]];
        if (skips(skip, e->idx))
            continue;
        const par_real *x = PAR_FN(par_zero_grad_at)(pl, e, e->pos);
        for (int64_t q = 0; q < e->numel; q++)
            par_racc_put(acc, (size_t)e->idx, (double)x[q] * (double)x[q]);
    }
}

/* The shares of both plans: in the bitwise mode as order-free sums
 * registered behind per (the world all-reduce then merges them). */
static par_status shares_of(dpw_t *w, const PAR_FN(par_model) *M, const unsigned char *skip, double *per,
                            par_racc *acc)
{
    if (!M->cfg.bitwise)
        return norm_shares(w, M, skip, per);
    par_status s = par_racc_init(acc, (size_t)(M->tab.n > 0 ? M->tab.n : 1));
    if (s || (s = par_racc_register(per, (size_t)(M->tab.n > 0 ? M->tab.n : 1), sizeof *per, acc)))
        return s;
    racc_shares(w, M, PAR_DPW_DENSE, skip, acc);
    racc_shares(w, M, PAR_DPW_EXPERT, skip, acc);
    return PAR_OK;
}

/* The per-entry shares of this rank's segments, one world all-reduce (an
 * entry held by one segment: x + 0 + ... = x, exact), summed in table order
 * like par_grad_sumsq. */
par_status PAR_FN(par_dpw_norm)(dpw_t *w, const par_pctx *P, const PAR_FN(par_model) *M, const unsigned char *skip,
                                double *sumsq)
{
    const par_param_table *t = &M->tab;
    double *per = par_calloc((size_t)(t->n > 0 ? t->n : 1), sizeof *per, PAR_TAG_COMM);
    if (!per)
        return par_err(PAR_ENOMEM, "dp step: out of memory for %d norm shares", t->n);
    par_racc acc = {0};
    par_status s = shares_of(w, M, skip, per, &acc);
    par_field pf = PAR_FIELD(per, t->n, PAR_C_F64);
    if (!s)
        s = par_reduce_fields(P->world, &pf, 1, NULL);
    if (acc.n) {
        par_racc_unregister(per);
        par_racc_free(&acc);
    }
    double sum = 0.0;
    for (int i = 0; !s && i < t->n; i++)
        if (t->p[i].dtype == PAR_PDT_REAL && t->p[i].has_grad)
            sum += per[i];
    par_free(per);
    if (!s)
        *sumsq = sum;
    return s;
}

par_status PAR_FN(par_dpw_update)(dpw_t *w, const par_pctx *P, PAR_FN(par_model) *M, double clip)
{
    const int64_t step = M->step + 1;
    /* 3. and 4. the update, the balance; then a shared copy's phase ends */
    const int write = !w->rt || PAR_FN(par_replica_updater)(w->rt); /* every member joined: the norm's all-reduce */
    par_status s = apply_updates(w, M, step, clip, write);
    if (s)
        return s;
    if (!write && (s = PAR_FN(par_replica_wait)(w->rt, P->world, "the shared dense update")))
        return s;
    M->step++;
    return PAR_OK;
}

par_status PAR_FN(par_dpw_reduced_grads)(dpw_t *w, PAR_FN(par_model) *M)
{
    for (int k = 0; k < 2; k++) {
        par_status s = PAR_FN(par_zero_reduced_grads)(&w->plan[k], w->comm[k], M->grads + w->base[k]);
        if (s)
            return s;
    }
    return PAR_OK;
}

par_status PAR_FN(par_dpw_state_gather)(dpw_t *w, const PAR_FN(par_model) *M, par_real *m, par_real *v)
{
    (void)M;
    for (int k = 0; k < 2; k++) {
        par_status s = PAR_FN(par_zero_state_gather)(&w->plan[k], w->comm[k], 0, m ? m + w->base[k] : NULL,
                                                     v ? v + w->base[k] : NULL);
        if (s)
            return s;
    }
    return PAR_OK;
}

par_real *PAR_FN(par_dpw_state_ptr)(dpw_t *w, int idx, int slot, int64_t begin, int64_t *avail)
{
    for (int k = 0; k < 2; k++) {
        plan_t *pl = &w->plan[k];
        const int j = par_zero_geom_entry(&pl->geom, idx);
        if (j < 0)
            continue;
        const par_zero_entry *e = &pl->e[j];
        if (begin < 0 || begin >= e->numel)
            return NULL;
        const int zero1 = pl->mode == PAR_DP_ZERO1;
        if (e->opt == PAR_OPT_MUON) {
            if (slot != 0 || (zero1 && e->owner != pl->rank))
                return NULL;
            if (avail)
                *avail = e->numel - begin;
            return pl->mom + (zero1 ? 0 : pl->muon_base[e->owner]) + e->pos + begin;
        }
        if (slot < 0 || slot > 1)
            return NULL;
        par_real *st = slot == 0 ? pl->m : pl->v;
        int64_t p = e->pos + begin;
        if (!zero1) {
            if (avail)
                *avail = e->numel - begin;
            return st + p;
        }
        int64_t lo = (int64_t)pl->rank * pl->shard, hi = lo + pl->shard;
        if (p < lo || p >= hi)
            return NULL;
        if (avail)
            *avail = (e->pos + e->numel < hi ? e->pos + e->numel : hi) - p;
        return st + (p - lo);
    }
    return NULL;
}

void PAR_FN(par_dpw_memory_of)(const dpw_t *w, const PAR_FN(par_model) *M, par_dpw_memory *out)
{
    memset(out, 0, sizeof *out);
    const int64_t es = (int64_t)sizeof(par_real);
    /* a shared copy is the process's, no rank's (replicas.h: outside every
     * rank's allocator scope; memmodel.h par_memmodel_shared_of) */
    const int64_t other = w->rt ? M->n_shared : 0;
    out->weights = (M->n_local - other) * es + M->tab.n_i32 * (int64_t)sizeof(int32_t);
    out->grads = M->n_local * es;
    for (int k = 0; k < 2; k++) {
        par_zero_memory zm;
        PAR_FN(par_zero_memory_of)(&w->plan[k], &zm);
        if (!(other && w->plan[k].state_ext))
            out->optim += zm.adamw_state + zm.muon_state;
        out->optim_full += zm.full_state;
        out->comm += zm.workspace;
    }
}
