/* parallel/plan/memmodel_zero.c - ZeRO-1 plan geometry for the memory model (see
 * parallel/plan/memmodel_zero.h): parallel/layout/zero_geom.h's geometry, plus the Muon
 * scratch of every rank's matrices. */
#include "parallel/plan/memmodel_zero.h"

#include <string.h>

#include "core/alloc.h"
#include "parallel/layout/zero_geom.h"

void par_memmodel_zero_free(par_memmodel_zero *g)
{
    if (!g)
        return;
    par_free(g->load);
    par_free(g->muon_ws);
    memset(g, 0, sizeof *g);
}

/* optim.c par_muon_update + par_muon_orthogonalize: U [n], X [2 n + 2 r^2],
 * r = min(rows, cols). */
static int64_t muon_scratch(const par_param *p)
{
    int64_t r = p->ndim == 2 && p->shape[1] < p->shape[0] ? p->shape[1] : p->shape[0];
    return 3 * p->numel + 2 * r * r;
}

par_status par_memmodel_zero_build(par_memmodel_zero *out, const par_param_table *t, const int *idx, int n, int dp)
{
    return par_memmodel_zero_build_sized(out, t, NULL, idx, n, dp);
}

par_status par_memmodel_zero_build_sized(par_memmodel_zero *out, const par_param_table *t, const int64_t *numel, const int *idx,
                                   int n, int dp)
{
    if (!t || dp < 1 || n < 0 || (n > 0 && !idx))
        return par_err(PAR_EINVAL, "zero geometry: group of %d ranks, %d entries", dp, n);
    par_zero_geom z;
    par_status s = par_zero_geom_build_sized(&z, t, numel, idx, n, dp, 0);
    if (s)
        return s;
    par_memmodel_zero g;
    memset(&g, 0, sizeof g);
    g.dp = dp;
    g.load = par_calloc((size_t)dp, sizeof *g.load, PAR_TAG_MODEL);
    g.muon_ws = par_calloc((size_t)dp, sizeof *g.muon_ws, PAR_TAG_MODEL);
    if (!g.load || !g.muon_ws) {
        par_zero_geom_free(&z);
        par_memmodel_zero_free(&g);
        return par_err(PAR_ENOMEM, "zero geometry: no memory for %d ranks", dp);
    }
    g.n_ent = z.n;
    g.n_adamw = z.n_adamw, g.shard = z.shard, g.n_muon = z.n_muon, g.load_max = z.load_max, g.seg = z.seg;
    for (int q = 0; q < dp; q++) {
        g.load[q] = z.load[q];
        for (int k = z.owned_begin[q]; k < z.owned_begin[q + 1]; k++) {
            int64_t ws = muon_scratch(&t->p[z.e[z.owned[k]].idx]);
            g.muon_ws[q] = ws > g.muon_ws[q] ? ws : g.muon_ws[q];
            g.muon_ws_all = ws > g.muon_ws_all ? ws : g.muon_ws_all;
        }
    }
    par_zero_geom_free(&z);
    *out = g;
    return PAR_OK;
}
