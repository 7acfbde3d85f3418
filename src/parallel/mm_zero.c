/* parallel/mm_zero.c - ZeRO-1 plan geometry for the memory model (see
 * parallel/mm_zero.h). */
#include "parallel/mm_zero.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

typedef struct {
    int64_t numel, ws;
    int idx;
} mu_item;

/* numel descending, then table order (zero.c cmp_muon). */
static int cmp_mu(const void *a, const void *b)
{
    const mu_item *x = a, *y = b;
    if (x->numel != y->numel)
        return x->numel > y->numel ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Min-heap of ranks by (load, rank): the least-loaded rank, ties lower. */
static int less(const int64_t *load, int a, int b) { return load[a] != load[b] ? load[a] < load[b] : a < b; }

static void sift_down(int *h, int n, const int64_t *load, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && less(load, h[l], h[m]))
            m = l;
        if (r < n && less(load, h[r], h[m]))
            m = r;
        if (m == i)
            return;
        int t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* zero.c's greedy: matrices by numel descending (ties table order), each
 * to the least-loaded rank (ties the lower); loads, Muon scratch, seg. */
static void assign(par_mm_zero *g, mu_item *mu, int nm, int *heap)
{
    qsort(mu, (size_t)nm, sizeof *mu, cmp_mu);
    for (int q = 0; q < g->dp; q++)
        heap[q] = q; /* all loads 0: rank order is a heap */
    for (int j = 0; j < nm; j++) {
        int best = heap[0];
        g->load[best] += mu[j].numel;
        if (mu[j].ws > g->muon_ws[best])
            g->muon_ws[best] = mu[j].ws;
        sift_down(heap, g->dp, g->load, 0);
    }
    for (int q = 0; q < g->dp; q++)
        if (g->load[q] > g->load_max)
            g->load_max = g->load[q];
    g->seg = g->shard + g->load_max;
}

void par_mm_zero_free(par_mm_zero *g)
{
    if (!g)
        return;
    par_free(g->load);
    par_free(g->muon_ws);
    memset(g, 0, sizeof *g);
}

par_status par_mm_zero_build(par_mm_zero *out, const par_param_table *t, const int *idx, int n, int dp)
{
    if (!t || dp < 1 || n < 0 || (n > 0 && !idx))
        return par_err(PAR_EINVAL, "zero geometry: group of %d ranks, %d entries", dp, n);
    par_mm_zero g;
    memset(&g, 0, sizeof g);
    g.dp = dp;
    g.load = par_calloc((size_t)dp, sizeof *g.load, PAR_TAG_MODEL);
    g.muon_ws = par_calloc((size_t)dp, sizeof *g.muon_ws, PAR_TAG_MODEL);
    mu_item *mu = par_malloc((size_t)(n > 0 ? n : 1) * sizeof *mu, PAR_TAG_MODEL);
    int *heap = par_malloc((size_t)dp * sizeof *heap, PAR_TAG_MODEL);
    if (!g.load || !g.muon_ws || !mu || !heap) {
        par_free(mu);
        par_free(heap);
        par_mm_zero_free(&g);
        return par_err(PAR_ENOMEM, "zero geometry: no memory for %d entries over %d ranks", n, dp);
    }
    int nm = 0;
    for (int k = 0; k < n; k++) {
        if (idx[k] < 0 || idx[k] >= t->n) {
            par_free(mu);
            par_free(heap);
            par_mm_zero_free(&g);
            return par_err(PAR_ERANGE, "zero geometry: item %d is table index %d, outside [0, %d)", k, idx[k], t->n);
        }
        const par_param *p = &t->p[idx[k]];
        if (p->dtype != PAR_PDT_REAL)
            continue;
        if (p->opt == PAR_OPT_ADAMW)
            g.n_adamw += p->numel;
        if (p->opt != PAR_OPT_MUON)
            continue;
        int64_t r = p->ndim == 2 && p->shape[1] < p->shape[0] ? p->shape[1] : p->shape[0];
        mu[nm++] = (mu_item){p->numel, 3 * p->numel + 2 * r * r, idx[k]};
        g.n_muon += p->numel;
        if (mu[nm - 1].ws > g.muon_ws_all)
            g.muon_ws_all = mu[nm - 1].ws;
    }
    g.shard = (g.n_adamw + dp - 1) / dp;
    assign(&g, mu, nm, heap);
    par_free(mu);
    par_free(heap);
    *out = g;
    return PAR_OK;
}
