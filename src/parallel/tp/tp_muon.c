/* parallel/tp/tp_muon.c - Muon on tensor-parallel shards (see
 * parallel/tp/tp_muon.h). */
#include "parallel/tp/tp_muon.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "model/optim.h"
#include "parallel/tp/tp_reduce.h"

#define LL(x) ((long long)(x))

/* model/optim.c's clip scaling of one gradient element (same expression) */
static inline par_real scaled(par_real g, double f)
{
    return f == 1.0 ? g : (par_real)(f * (double)g);
}

/* Gathers the U shards to the owner, orthogonalizes there, X shards back
 * into U (in place). */
static par_status owner_orthogonalize(par_real *U, int64_t rows, int64_t cols, par_tp_cut cut,
                                      int owner, const par_tp *tp)
{
    const int P = par_tp_size(tp), r = par_tp_rank(tp);
    const size_t n = (size_t)(rows * cols) / (size_t)P;
    par_real *all = NULL, *full = NULL;
    if (r == owner) {
        all = par_malloc(2 * n * (size_t)P * sizeof(par_real), PAR_TAG_OPTIM);
        if (!all)
            return par_err(PAR_ENOMEM, "tensor parallel Muon: a [%lld, %lld] matrix", LL(rows),
                           LL(cols));
        full = all + n * (size_t)P;
    }
    par_status st = PAR_FN(par_tp_reduce_to_owner)(tp, owner, all, U, n);
    if (!st && r == owner) {
        for (int q = 0; q < P; q++)
            par_tp_unslice(full, all + (size_t)q * n, rows, cols, cut, q, P, sizeof(par_real));
        st = PAR_FN(par_muon_orthogonalize)(full, full, rows, cols);
        for (int q = 0; q < P && !st; q++)
            par_tp_slice(all + (size_t)q * n, full, rows, cols, cut, q, P, sizeof(par_real));
    }
    if (!st)
        st = PAR_FN(par_tp_reduce_from_owner)(tp, owner, U, all, n);
    par_free(all);
    return st;
}

par_status PAR_FN(par_tp_muon_update)(par_real *w,         /* shard */
                                      par_real *mom,       /* shard */
                                      const par_real *g,   /* shard */
                                      int64_t rows, int64_t cols, par_tp_cut cut, int owner,
                                      double gscale, double lr, double wd, double mu,
                                      const par_tp *tp)
{
    const int P = par_tp_size(tp);
    int64_t sr, sc;
    par_status st = par_tp_shard_shape("a Muon matrix", rows, cols, cut, P, &sr, &sc);
    if (st)
        return st;
    if (cut == PAR_TP_REPLICATED || P == 1)
        return PAR_FN(par_muon_update)(w, mom, g, rows, cols, gscale, lr, wd, mu);
    if (tp->faults & PAR_TP_FAULT_MUON_SHARD) /* the bug: Newton-Schulz of the shard */
        return PAR_FN(par_muon_update)(w, mom, g, sr, sc, gscale, lr, wd, mu);
    if (owner < 0 || owner >= P)
        return par_err(PAR_EINVAL, "tensor parallel Muon: owner %d is not a rank of %d", owner, P);
    const int64_t n = sr * sc;
    par_real *U = par_malloc((size_t)n * sizeof(par_real), PAR_TAG_OPTIM);
    if (!U)
        return par_err(PAR_ENOMEM, "tensor parallel Muon: a shard of %lld reals", LL(n));
    for (int64_t i = 0; i < n; i++) { /* par_muon_update's element loop */
        double G = (double)scaled(g[i], gscale);
        mom[i] = (par_real)(mu * (double)mom[i] + G);
        U[i] = (par_real)(mu * (double)mom[i] + G);
    }
    if (!(st = owner_orthogonalize(U, rows, cols, cut, owner, tp))) {
        const double decay = 1.0 - lr * wd;
        const double step = lr * PAR_MUON_SCALE * sqrt((double)(rows > cols ? rows : cols));
        for (int64_t i = 0; i < n; i++)
            w[i] = (par_real)((double)w[i] * decay - step * (double)U[i]);
    }
    par_free(U);
    return st;
}

par_status PAR_FN(par_tp_muon_shard_fault)(par_real *w, par_real *mom, const par_real *g, const char *name,
                                           int64_t rows, int64_t cols, int P, double gscale, double lr,
                                           double wd, double mu)
{
    const par_tp_split sp = par_tp_split_of(name);
    int64_t sr, sc;
    if (P <= 1 || sp.group != PAR_TP_GROUP_TP || sp.cut == PAR_TP_REPLICATED ||
        par_tp_shard_shape(name, rows, cols, sp.cut, P, &sr, &sc))
        return PAR_FN(par_muon_update)(w, mom, g, rows, cols, gscale, lr, wd, mu);
    const size_t n = (size_t)(sr * sc), es = sizeof(par_real);
    par_real *b = par_malloc(3 * n * es, PAR_TAG_OPTIM);
    if (!b)
        return par_err(PAR_ENOMEM, "tensor parallel Muon (shard fault): a shard of %zu reals", n);
    par_status st = PAR_OK;
    for (int r = 0; r < P && !st; r++) {
        par_tp_slice(b, w, rows, cols, sp.cut, r, P, es);
        par_tp_slice(b + n, mom, rows, cols, sp.cut, r, P, es);
        par_tp_slice(b + 2 * n, g, rows, cols, sp.cut, r, P, es);
        if (!(st = PAR_FN(par_muon_update)(b, b + n, b + 2 * n, sr, sc, gscale, lr, wd, mu))) {
            par_tp_unslice(w, b, rows, cols, sp.cut, r, P, es);
            par_tp_unslice(mom, b + n, rows, cols, sp.cut, r, P, es);
        }
    }
    par_free(b);
    return st;
}
