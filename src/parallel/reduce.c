/* parallel/reduce.c - the one cross-rank reduction point (see
 * parallel/reduce.h, docs/parallel.md). */
#include "parallel/reduce.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"

/* ------------------------------------------------------------ statistics -- */

/* Context parallelism: the CP ranks of an attention-DP group hold parts of
 * the same rows, so they share one sample window (parallel/cpwire.h); their
 * partial statistics are summed over the CP group first (rank order: integer
 * counts exactly, CE sums and psum in rank order 0..CP-1), after which every
 * CP rank holds its DP group's statistics and only cp = 0 contributes to the
 * world step below. */
static par_status cp_combine(const par_pctx *P, PAR_FN(par_stats) *st)
{
    par_comm *c = P->g.g[PAR_GROUP_CP];
    if (!c || par_comm_size(c) == 1)
        return PAR_OK;
    const int64_t nb = st->n_blocks, E = st->E, Ns = st->Ns;
    int CP = par_comm_size(c);
    int64_t win[2] = {st->q0, Ns}, *all = NULL, *iv = NULL;
    double *dv = NULL;
    par_status s;
    size_t nsE = (size_t)(nb * Ns * E), nsb = (size_t)(nb * Ns), ne = (size_t)(nb * E);
    size_t ni = 3 + ne + nsE + nsb;
    all = par_malloc((size_t)CP * 2 * sizeof *all, PAR_TAG_COMM);
    iv = par_malloc(ni * sizeof *iv, PAR_TAG_COMM);
    dv = par_malloc((size_t)(2 * Ns + 1) * sizeof *dv, PAR_TAG_COMM);
    if (!all || !iv || !dv) {
        s = par_err(PAR_ENOMEM, "stats reduce (cp): out of memory for %lld samples", (long long)Ns);
        goto done;
    }
    if ((s = par_allgather(c, win, all, 2, PAR_C_I64)))
        goto done;
    for (int r = 0; r < CP; r++)
        if (all[2 * r] != win[0] || all[2 * r + 1] != win[1]) {
            s = par_err(PAR_EMISMATCH,
                        "stats reduce (cp): CP rank %d's window is samples %lld + %lld, rank %d's %lld + %lld: "
                        "the CP ranks of a data-parallel group must share one window",
                        r, (long long)all[2 * r], (long long)all[2 * r + 1], par_comm_rank(c), (long long)win[0],
                        (long long)win[1]);
            goto done;
        }
    iv[0] = st->n_main;
    iv[1] = st->n_mtp;
    iv[2] = st->n_tokens;
    memcpy(iv + 3, st->loads, ne * sizeof *iv);
    memcpy(iv + 3 + ne, st->cnt, nsE * sizeof *iv);
    memcpy(iv + 3 + ne + nsE, st->ntok, nsb * sizeof *iv);
    if ((s = par_allreduce(c, iv, iv, ni, PAR_C_I64, PAR_OP_SUM)))
        goto done;
    st->n_main = iv[0];
    st->n_mtp = iv[1];
    st->n_tokens = iv[2];
    memcpy(st->loads, iv + 3, ne * sizeof *iv);
    memcpy(st->cnt, iv + 3 + ne, nsE * sizeof *iv);
    memcpy(st->ntok, iv + 3 + ne + nsE, nsb * sizeof *iv);
    memcpy(dv, st->ce_main, (size_t)Ns * sizeof *dv);
    memcpy(dv + Ns, st->ce_mtp, (size_t)Ns * sizeof *dv);
    if ((s = par_allreduce(c, dv, dv, (size_t)(2 * Ns), PAR_C_F64, PAR_OP_SUM)))
        goto done;
    memcpy(st->ce_main, dv, (size_t)Ns * sizeof *dv);
    memcpy(st->ce_mtp, dv + Ns, (size_t)Ns * sizeof *dv);
    if (nsE > 0)
        s = par_allreduce(c, st->psum, st->psum, nsE, PAR_C_REAL, PAR_OP_SUM);
done:
    par_free(all);
    par_free(iv);
    par_free(dv);
    return s;
}

par_status PAR_FN(par_reduce_stats)(const par_pctx *P, PAR_FN(par_model) *M)
{
    PAR_FN(par_stats) *st = &M->stats;
    par_comm *w = P->world;
    const int N = P->N;
    const int64_t nb = st->n_blocks, E = st->E, Ns = st->Ns, Nsg = st->Ns_global;
    par_status s;
    int64_t *ivec = NULL, *wins = NULL;
    size_t *cnt = NULL, *dsp = NULL;
    double *ce_loc = NULL, *ce_all = NULL, *ce_main = NULL;
    par_real *aux_loc = NULL, *aux_all = NULL, *aux = NULL;

    /* 0. context parallelism: sum the CP group's parts of its rows first */
    if ((s = cp_combine(P, st)))
        return s;
    const int contrib = P->rc.cp == 0;
    const int64_t Nc = contrib ? Ns : 0; /* samples this rank contributes */

    /* 1. integer sums: exact in any order */
    size_t ni = 3 + (size_t)(nb * E);
    ivec = par_malloc(ni * sizeof *ivec, PAR_TAG_COMM);
    wins = par_malloc((size_t)N * 2 * sizeof *wins, PAR_TAG_COMM);
    cnt = par_malloc((size_t)N * sizeof *cnt, PAR_TAG_COMM);
    dsp = par_malloc((size_t)N * sizeof *dsp, PAR_TAG_COMM);
    if (!ivec || !wins || !cnt || !dsp)
        goto fail_oom;
    ivec[0] = st->n_main;
    ivec[1] = st->n_mtp;
    ivec[2] = st->n_tokens;
    memcpy(ivec + 3, st->loads, (size_t)(nb * E) * sizeof *ivec);
    if (!contrib)
        memset(ivec, 0, ni * sizeof *ivec);
    if ((s = par_allreduce(w, ivec, ivec, ni, PAR_C_I64, PAR_OP_SUM)))
        goto done;
    st->n_main = ivec[0];
    st->n_mtp = ivec[1];
    st->n_tokens = ivec[2];
    memcpy(st->loads, ivec + 3, (size_t)(nb * E) * sizeof *ivec);

    /* 2. the sample windows must tile [0, Ns_global) in rank order */
    int64_t mine[2] = {st->q0 + Ns - Nc, Nc};
    if ((s = par_allgather(w, mine, wins, 2, PAR_C_I64)))
        goto done;
    int64_t next = 0;
    for (int r = 0; r < N; r++) {
        if (wins[2 * r] != next || wins[2 * r + 1] < 0) {
            s = par_err(PAR_EMISMATCH,
                        "stats reduce: rank %d's samples start at %lld (%lld samples), expected %lld: "
                        "the ranks' windows must tile the %lld samples of the global batch in rank order",
                        r, (long long)wins[2 * r], (long long)wins[2 * r + 1], (long long)next,
                        (long long)Nsg);
            goto done;
        }
        next += wins[2 * r + 1];
    }
    if (next != Nsg) {
        s = par_err(PAR_EMISMATCH, "stats reduce: the ranks hold %lld samples, the global batch %lld",
                    (long long)next, (long long)Nsg);
        goto done;
    }

    /* 3. per-sample terms, gathered in global sample order: [q][2] CE sums,
     * [q][nb] aux terms */
    PAR_FN(par_stats_aux_terms)(st, &M->tab, (int)M->K);
    size_t nsl = (size_t)(Ns > 0 ? Ns : 1), nsg = (size_t)(Nsg > 0 ? Nsg : 1);
    ce_loc = par_malloc(nsl * 2 * sizeof *ce_loc, PAR_TAG_COMM);
    ce_all = par_malloc(nsg * 2 * sizeof *ce_all, PAR_TAG_COMM);
    ce_main = par_malloc(nsg * 2 * sizeof *ce_main, PAR_TAG_COMM);
    aux_loc = par_malloc(nsl * (size_t)(nb > 0 ? nb : 1) * sizeof *aux_loc, PAR_TAG_COMM);
    aux_all = par_malloc(nsg * (size_t)(nb > 0 ? nb : 1) * sizeof *aux_all, PAR_TAG_COMM);
    aux = par_malloc(nsg * (size_t)(nb > 0 ? nb : 1) * sizeof *aux, PAR_TAG_COMM);
    if (!ce_loc || !ce_all || !ce_main || !aux_loc || !aux_all || !aux)
        goto fail_oom;
    for (int64_t q = 0; q < Nc; q++) {
        ce_loc[2 * q] = st->ce_main[q];
        ce_loc[2 * q + 1] = st->ce_mtp[q];
        for (int64_t b = 0; b < nb; b++)
            aux_loc[q * nb + b] = st->aux[b * Ns + q];
    }
    for (int r = 0; r < N; r++) {
        cnt[r] = (size_t)wins[2 * r + 1] * 2;
        dsp[r] = (size_t)wins[2 * r] * 2;
    }
    if ((s = par_allgatherv(w, ce_loc, (size_t)Nc * 2, ce_all, cnt, dsp, PAR_C_F64)))
        goto done;
    for (int r = 0; r < N; r++) {
        cnt[r] = (size_t)(wins[2 * r + 1] * nb);
        dsp[r] = (size_t)(wins[2 * r] * nb);
    }
    if ((s = par_allgatherv(w, aux_loc, (size_t)(Nc * nb), aux_all, cnt, dsp, PAR_C_REAL)))
        goto done;
    double *ce_mtp = ce_main + nsg;
    for (int64_t q = 0; q < Nsg; q++) {
        ce_main[q] = ce_all[2 * q];
        ce_mtp[q] = ce_all[2 * q + 1];
        for (int64_t b = 0; b < nb; b++)
            aux[b * Nsg + q] = aux_all[q * nb + b];
    }
    PAR_FN(par_model_losses_from)(M, st->n_main, st->n_mtp, ce_main, ce_mtp, aux, Nsg, &M->last);
    s = PAR_OK;
    goto done;

fail_oom:
    s = par_err(PAR_ENOMEM, "stats reduce: out of memory (%lld samples, %lld blocks x %lld experts)",
                (long long)Nsg, (long long)nb, (long long)E);
done:
    par_free(ivec);
    par_free(wins);
    par_free(cnt);
    par_free(dsp);
    par_free(ce_loc);
    par_free(ce_all);
    par_free(ce_main);
    par_free(aux_loc);
    par_free(aux_all);
    par_free(aux);
    return s;
}
