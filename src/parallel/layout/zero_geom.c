/* parallel/layout/zero_geom.c - the geometry of a data-parallel optimizer plan
 * (see parallel/layout/zero_geom.h; untemplated). */
#include "parallel/layout/zero_geom.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

void par_zero_geom_free(par_zero_geom *g)
{
    if (!g)
        return;
    par_free(g->e);
    par_free(g->owned);
    par_free(g->owned_begin);
    par_free(g->load);
    par_free(g->muon_base);
    memset(g, 0, sizeof *g);
}

/* Marks the listed entries in listed [t->n] (1 listed, 0 not). */
static par_status mark_list(const par_zero_geom *g, uint8_t *listed, const int *idx, int n_idx)
{
    const par_param_table *t = g->t;
    for (int k = 0; k < n_idx; k++) {
        if (idx[k] < 0 || idx[k] >= t->n)
            return par_err(PAR_ERANGE, "zero plan: list item %d is table index %d, outside [0, %d)", k, idx[k], t->n);
        if (listed[idx[k]])
            return par_err(PAR_EINVAL, "zero plan: tensor '%s' (index %d) is listed twice; each tensor is reduced "
                           "exactly once per group", t->p[idx[k]].name, idx[k]);
        listed[idx[k]] = 1;
    }
    return PAR_OK;
}

/* The entries of the marked tensors with an optimizer, in table order;
 * AdamW laid out flat.  Returns the number of Muon entries. */
static int lay_out_entries(par_zero_geom *g, const uint8_t *listed, const int64_t *numel)
{
    const par_param_table *t = g->t;
    int n_mu = 0;
    for (int i = 0; i < t->n; i++) {
        const par_param *p = &t->p[i];
        if (!listed[i] || p->dtype != PAR_PDT_REAL || p->opt == PAR_OPT_NONE)
            continue;
        par_zero_entry *e = &g->e[g->n];
        e->idx = i;
        e->off = p->offset;
        e->opt = p->opt;
        e->numel = numel ? numel[i] : p->numel;
        if (p->opt == PAR_OPT_ADAMW) {
            e->owner = PAR_ZERO_SHARDED;
            e->pos = g->n_adamw;
            g->n_adamw += e->numel;
        } else {
            e->owner = 0;
            e->pos = 0;
            g->n_muon += e->numel;
            g->largest = max64(g->largest, e->numel);
            n_mu++;
        }
        g->n++;
    }
    g->shard = (g->n_adamw + g->dp - 1) / g->dp;
    return n_mu;
}

/* Muon order for the greedy assignment: numel descending, then table order. */
static int cmp_muon(const void *a, const void *b)
{
    const par_zero_entry *x = *(const par_zero_entry *const *)a, *y = *(const par_zero_entry *const *)b;
    if (x->numel != y->numel)
        return x->numel > y->numel ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Greedy Muon ownership (numel descending, ties table order; each to the
 * least loaded rank, ties the lower rank): sets owner and g->load. */
static par_status assign_muon(par_zero_geom *g, int n_mu)
{
    par_zero_entry **mu = par_malloc((size_t)(n_mu > 0 ? n_mu : 1) * sizeof *mu, PAR_TAG_MODEL);
    if (!mu)
        return par_err(PAR_ENOMEM, "zero plan: no memory for %d Muon matrices", n_mu);
    int k = 0;
    for (int i = 0; i < g->n; i++)
        if (g->e[i].opt == PAR_OPT_MUON)
            mu[k++] = &g->e[i];
    qsort(mu, (size_t)n_mu, sizeof *mu, cmp_muon);
    for (int j = 0; j < n_mu; j++) {
        int best = 0;
        for (int q = 1; q < g->dp; q++)
            if (g->load[q] < g->load[best])
                best = q;
        mu[j]->owner = best;
        g->load[best] += mu[j]->numel;
    }
    par_free(mu);
    return PAR_OK;
}

/* The owned lists by (owner, table order), each matrix's position inside
 * its owner's block, the prefix sums and the segment size. */
static par_status owned_lists(par_zero_geom *g, int n_mu)
{
    const int dp = g->dp;
    g->owned = par_malloc((size_t)(n_mu > 0 ? n_mu : 1) * sizeof *g->owned, PAR_TAG_MODEL);
    int *fill = par_calloc((size_t)dp, sizeof *fill, PAR_TAG_MODEL);
    int64_t *at = par_calloc((size_t)dp, sizeof *at, PAR_TAG_MODEL);
    if (!g->owned || !fill || !at) {
        par_free(fill);
        par_free(at);
        return par_err(PAR_ENOMEM, "zero plan: no memory for ownership lists of %d ranks", dp);
    }
    for (int i = 0; i < g->n; i++)
        if (g->e[i].opt == PAR_OPT_MUON)
            g->owned_begin[g->e[i].owner + 1]++;
    for (int q = 0; q < dp; q++) {
        g->owned_begin[q + 1] += g->owned_begin[q];
        g->muon_base[q + 1] = g->muon_base[q] + g->load[q];
        g->load_max = max64(g->load_max, g->load[q]);
    }
    for (int i = 0; i < g->n; i++) {
        par_zero_entry *e = &g->e[i];
        if (e->opt != PAR_OPT_MUON)
            continue;
        g->owned[g->owned_begin[e->owner] + fill[e->owner]++] = i;
        e->pos = at[e->owner];
        at[e->owner] += e->numel;
    }
    par_free(fill);
    par_free(at);
    g->seg = g->shard + g->load_max;
    return PAR_OK;
}

par_status par_zero_geom_build(par_zero_geom *g, const par_param_table *t, const int *idx, int n_idx, int dp,
                               int rank)
{
    return par_zero_geom_build_sized(g, t, NULL, idx, n_idx, dp, rank);
}

par_status par_zero_geom_build_sized(par_zero_geom *g, const par_param_table *t, const int64_t *numel,
                                     const int *idx, int n_idx, int dp, int rank)
{
    if (!g || !t || n_idx < 0 || (n_idx > 0 && !idx))
        return par_err(PAR_EINVAL, "zero plan: needs a plan, a table and a list (n_idx = %d)", n_idx);
    if (dp < 1)
        return par_err(PAR_EINVAL, "zero plan: the group size must be >= 1, got %d", dp);
    if (rank < 0 || rank >= dp)
        return par_err(PAR_ERANGE, "zero plan: rank %d outside the group [0, %d)", rank, dp);
    par_zero_geom z;
    memset(&z, 0, sizeof z);
    z.t = t;
    z.dp = dp;
    z.rank = rank;
    par_status st;
    uint8_t *listed = par_calloc((size_t)(t->n > 0 ? t->n : 1), 1, PAR_TAG_MODEL); /* freed here */
    z.e = par_malloc((size_t)(n_idx > 0 ? n_idx : 1) * sizeof *z.e, PAR_TAG_MODEL);
    z.load = par_calloc((size_t)dp, sizeof *z.load, PAR_TAG_MODEL);
    z.muon_base = par_calloc((size_t)dp + 1, sizeof *z.muon_base, PAR_TAG_MODEL);
    z.owned_begin = par_calloc((size_t)dp + 1, sizeof *z.owned_begin, PAR_TAG_MODEL);
    if (!listed || !z.e || !z.load || !z.muon_base || !z.owned_begin) {
        st = par_err(PAR_ENOMEM, "zero plan: no memory for the tables of %d tensors", n_idx);
        goto fail_free_geom;
    }
    if ((st = mark_list(&z, listed, idx, n_idx)))
        goto fail_free_geom;
    int n_mu = lay_out_entries(&z, listed, numel);
    par_free(listed);
    listed = NULL;
    if ((st = assign_muon(&z, n_mu)) || (st = owned_lists(&z, n_mu)))
        goto fail_free_geom;
    *g = z;
    return PAR_OK;

fail_free_geom:
    par_free(listed);
    par_zero_geom_free(&z);
    return st;
}

int par_zero_geom_entry(const par_zero_geom *g, int idx)
{
    if (!g || !g->t || idx < 0 || idx >= g->t->n)
        return -1;
    int lo = 0, hi = g->n; /* g->e ascending by table index */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (g->e[mid].idx < idx)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < g->n && g->e[lo].idx == idx ? lo : -1;
}

int par_zero_geom_owner(const par_zero_geom *g, int idx)
{
    const int j = par_zero_geom_entry(g, idx);
    return j < 0 ? PAR_ZERO_ABSENT : g->e[j].owner;
}

int par_zero_geom_piece(const par_zero_geom *g, int idx, int q, int64_t *begin, int64_t *end)
{
    *begin = *end = 0;
    if (par_zero_geom_owner(g, idx) == PAR_ZERO_ABSENT || q < 0 || q >= g->dp)
        return 0;
    const par_zero_entry *e = &g->e[par_zero_geom_entry(g, idx)];
    if (e->opt == PAR_OPT_MUON) {
        if (e->owner != q)
            return 0;
        *end = e->numel;
        return e->numel > 0;
    }
    const int64_t lo = max64(e->pos, (int64_t)q * g->shard), hi = min64(e->pos + e->numel, (int64_t)(q + 1) * g->shard);
    if (lo >= hi)
        return 0;
    *begin = lo - e->pos;
    *end = hi - e->pos;
    return 1;
}

void par_zero_geom_memory(const par_zero_geom *g, par_dp_mode mode, int64_t elem_bytes, par_zero_memory *out)
{
    const int64_t es = elem_bytes;
    const int zero1 = mode == PAR_DP_ZERO1;
    out->adamw_state = 2 * es * (zero1 ? g->shard : (int64_t)g->dp * g->shard);
    out->muon_state = es * (zero1 ? g->load[g->rank] : g->n_muon);
    out->full_state = es * (2 * g->n_adamw + g->n_muon);
    out->workspace = zero1 ? es * ((int64_t)g->dp * g->seg + g->seg) : 0; /* replicated reduces in place */
}
