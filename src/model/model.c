/* model/model.c - model construction, statistics, losses (see model/model.h). */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "core/log.h"
#include "kernels/recipe.h"
#include "model/init.h"
#include "model/optim.h"

par_real *PAR_FN(par_model_ptr)(const PAR_FN(par_model) *M, par_real *flat, int idx)
{
    const int64_t o = idx < 0 || idx >= M->tab.n || !flat ? -1 : PAR_FN(par_model_loc)(M, idx);
    if (o < 0)
        return NULL;
    if (flat == M->params && M->shw) /* the weights: shared entries first */
        return o < M->n_shared ? M->shw + o : flat + (o - M->n_shared);
    return flat + o;
}

int PAR_FN(par_model_holds)(const PAR_FN(par_model) *M, int idx)
{
    return idx >= 0 && idx < M->tab.n && PAR_FN(par_model_loc)(M, idx) >= 0;
}

const par_model_cut *PAR_FN(par_model_cut_of)(const PAR_FN(par_model) *M, int idx)
{
    return M->cut && PAR_FN(par_model_holds)(M, idx) && M->cut[idx].cut != 0 ? &M->cut[idx] : NULL;
}

int64_t PAR_FN(par_model_numel)(const PAR_FN(par_model) *M, int idx)
{
    if (!PAR_FN(par_model_holds)(M, idx))
        return 0;
    const par_model_cut *c = PAR_FN(par_model_cut_of)(M, idx);
    return c ? M->tab.p[idx].numel / c->P : M->tab.p[idx].numel;
}

#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
/* On a device: the entries' sums in one launch (model/optim_gpu.c), then as below; 0 when not */
static int grad_sumsq_batched(const PAR_FN(par_model) *M, double *sum, double *per_entry)
{
    const int n = M->tab.n;
    int64_t *loc = par_malloc((size_t)(2 * (n > 0 ? n : 1)) * sizeof *loc, PAR_TAG_ACT);
    double *v = par_malloc((size_t)(n > 0 ? n : 1) * sizeof *v, PAR_TAG_ACT);
    int done = 0;
    if (loc && v) {
        for (int i = 0; i < n; i++) {
            const par_param *p = &M->tab.p[i];
            const int on = p->dtype == PAR_PDT_REAL && p->has_grad && PAR_FN(par_model_loc)(M, i) >= 0;
            loc[i] = on ? PAR_FN(par_model_loc)(M, i) : -1;
            loc[n + i] = on ? PAR_FN(par_model_numel)(M, i) : 0;
        }
        done = PAR_FN(par_optim_gpu_sumsq)(v, M->grads, loc, loc + n, n);
    }
    double s = 0.0;
    for (int i = 0; done && i < n; i++) { /* the loop's order below */
        s += loc[i] >= 0 ? v[i] : 0.0;
        if (per_entry)
            per_entry[i] = loc[i] >= 0 ? v[i] : 0.0;
    }
    par_free(loc);
    par_free(v);
    if (done)
        *sum = s;
    return done;
}
#endif

double PAR_FN(par_model_grad_sumsq)(const PAR_FN(par_model) *M, double *per_entry)
{
    double s = 0.0;
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
    if (!M->cfg.bitwise && par_dev_device_mode() && grad_sumsq_batched(M, &s, per_entry))
        return s;
#endif
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        double v = 0.0;
        if (p->dtype == PAR_PDT_REAL && p->has_grad && PAR_FN(par_model_loc)(M, i) >= 0) {
            v = PAR_FN(par_model_sumsq)(M, M->grads + PAR_FN(par_model_loc)(M, i), PAR_FN(par_model_numel)(M, i));
            s += v;
        }
        if (per_entry)
            per_entry[i] = v;
    }
    return s;
}

double PAR_FN(par_model_sumsq)(const PAR_FN(par_model) *M, const par_real *x, int64_t n)
{
    if (!M->cfg.bitwise)
        return PAR_FN(par_sumsq)(x, n);
    int32_t e = PAR_RACC_EMPTY;
    int64_t s0 = 0, s1 = 0, s2 = 0;
    par_racc a = {.n = 1, .e = &e, .s0 = &s0, .s1 = &s1, .s2 = &s2};
    for (int64_t j = 0; j < n; j++)
        par_racc_put(&a, 0, (double)x[j] * (double)x[j]);
    return par_racc_value(&a, 0);
}

void PAR_FN(par_model_grads_zero)(PAR_FN(par_model) *M)
{
    par_dev_zero(M->grads, (size_t)M->n_local * sizeof(par_real)); /* memset (core/device.h) */
    if (M->racc.n)
        par_racc_zero(&M->racc, 0, M->racc.n);
}

/* The entry whose local range holds offset o (-1: none). */
static int entry_at(const PAR_FN(par_model) *M, int64_t o)
{
    for (int i = 0; i < M->tab.n; i++) {
        int64_t l = PAR_FN(par_model_loc)(M, i);
        if (M->tab.p[i].dtype == PAR_PDT_REAL && l >= 0 && o >= l && o < l + PAR_FN(par_model_numel)(M, i))
            return i;
    }
    return -1;
}

par_status PAR_FN(par_model_grads_settle)(PAR_FN(par_model) *M)
{
    if (!M->racc.n)
        return PAR_OK;
    for (int64_t o = 0; o < M->n_local; o++)
        if (M->grads[o] != 0) {
            int i = entry_at(M, o);
            return par_err(PAR_EINTERNAL, "bitwise mode: the gradient of %s (element %lld) was written outside "
                           "the order-free accumulator (%g): a kernel bypassed core/racc.h",
                           i >= 0 ? M->tab.p[i].name : "?", (long long)(i >= 0 ? o - PAR_FN(par_model_loc)(M, i) : o),
                           (double)M->grads[o]);
        }
    for (int64_t o = 0; o < M->n_local; o++)
        M->grads[o] = (par_real)par_racc_value(&M->racc, (size_t)o);
    return PAR_OK;
}

/* ------------------------------------------------------------ statistics -- */

par_status PAR_FN(par_stats_alloc)(PAR_FN(par_stats) *st, int64_t n_blocks, int64_t E, int64_t Ns)
{
    return PAR_FN(par_stats_alloc_held)(st, n_blocks, NULL, E, Ns);
}

/* The row map of the held blocks (NULL: every block). */
static par_status stats_rows(PAR_FN(par_stats) *st, const uint8_t *held)
{
    st->n_rows = st->n_blocks;
    if (!held)
        return PAR_OK;
    st->row = par_malloc((size_t)(st->n_blocks > 0 ? st->n_blocks : 1) * sizeof *st->row, PAR_TAG_ACT);
    if (!st->row)
        return par_err(PAR_ENOMEM, "stats: out of memory for %lld blocks", (long long)st->n_blocks);
    st->n_rows = 0;
    for (int64_t b = 0; b < st->n_blocks; b++)
        st->row[b] = held[b] ? (int32_t)st->n_rows++ : -1;
    return PAR_OK;
}

/* The window's arrays; rows: cnt, psum and ntok too (else NULL). */
static par_status stats_alloc(PAR_FN(par_stats) *st, int64_t n_blocks, const uint8_t *held, int64_t E, int64_t Ns,
                              int rows)
{
    memset(st, 0, sizeof *st);
    if (n_blocks < 0 || E < 1 || Ns < 0)
        return par_err(PAR_EINVAL, "stats: bad sizes n_blocks=%lld E=%lld Ns=%lld",
                       (long long)n_blocks, (long long)E, (long long)Ns);
    st->n_blocks = n_blocks;
    st->E = E;
    st->Ns = Ns;
    st->q0 = 0;
    st->Ns_global = Ns;
    par_status s = stats_rows(st, held);
    if (s)
        return s;
    size_t ns = (size_t)(Ns > 0 ? Ns : 1);
    size_t nb = (size_t)(n_blocks > 0 ? n_blocks : 1), nr = (size_t)(st->n_rows > 0 ? st->n_rows : 1);
    st->ce_main = par_calloc(ns, sizeof(double), PAR_TAG_ACT);
    st->ce_mtp = par_calloc(ns, sizeof(double), PAR_TAG_ACT);
    st->loads = par_calloc(nb * (size_t)E, sizeof(int64_t), PAR_TAG_ACT);
    st->aux = par_calloc(nb * ns, sizeof(par_real), PAR_TAG_ACT);
    if (rows) {
        st->cnt = par_calloc(nr * ns * (size_t)E, sizeof(int64_t), PAR_TAG_ACT);
        st->psum = par_calloc(nr * ns * (size_t)E, sizeof(par_real), PAR_TAG_ACT);
        st->ntok = par_calloc(nr * ns, sizeof(int64_t), PAR_TAG_ACT);
    }
    if (!st->ce_main || !st->ce_mtp || !st->loads || !st->aux || (rows && (!st->cnt || !st->psum || !st->ntok))) {
        PAR_FN(par_stats_free)(st);
        return par_err(PAR_ENOMEM, "stats: out of memory (n_blocks=%lld E=%lld Ns=%lld)",
                       (long long)n_blocks, (long long)E, (long long)Ns);
    }
    return PAR_OK;
}

par_status PAR_FN(par_stats_alloc_held)(PAR_FN(par_stats) *st, int64_t n_blocks, const uint8_t *held, int64_t E,
                                        int64_t Ns)
{
    return stats_alloc(st, n_blocks, held, E, Ns, 1);
}

par_status PAR_FN(par_stats_alloc_terms)(PAR_FN(par_stats) *st, int64_t n_blocks, const uint8_t *held, int64_t E,
                                         int64_t Ns)
{
    return stats_alloc(st, n_blocks, held, E, Ns, 0);
}

par_status PAR_FN(par_stats_view)(PAR_FN(par_stats) *v, const PAR_FN(par_stats) *win, par_arena *ar, int64_t q,
                                  int64_t nq)
{
    if (q < 0 || nq < 0 || q + nq > win->Ns)
        return par_err(PAR_EINVAL, "stats view: samples %lld + %lld outside the window's %lld", (long long)q,
                       (long long)nq, (long long)win->Ns);
    const size_t nr = (size_t)(win->n_rows > 0 ? win->n_rows : 1), n = (size_t)(nq > 0 ? nq : 1);
    const size_t E = (size_t)win->E, bc = nr * n * E * sizeof(int64_t), bp = nr * n * E * sizeof(par_real),
                 bt = nr * n * sizeof(int64_t);
    int64_t *cnt = par_arena_alloc(ar, bc, 64), *ntok = par_arena_alloc(ar, bt, 64);
    par_real *psum = par_arena_alloc(ar, bp, 64);
    if (!cnt || !ntok || !psum)
        return par_err(PAR_ENOMEM, "stats view: out of memory for %lld samples x %lld experts", (long long)nq,
                       (long long)E);
    /* kernels read cnt / ntok (the aux backward): the host owns them, zeroed */
    par_dev_host_set(cnt, bc);
    par_dev_host_set(ntok, bt);
    par_dev_host_set(psum, bp);
    memset(cnt, 0, bc);
    memset(ntok, 0, bt);
    memset(psum, 0, bp);
    *v = *win;
    v->Ns = nq;
    v->q0 = win->q0 + q;
    v->ce_main = v->ce_mtp = NULL;
    v->ce_acc = NULL;
    v->psum_acc = NULL;
    if (win->ce_acc) { /* the bitwise mode: the view's psum terms, arena memory like psum */
        const size_t np = nr * n * E;
        par_racc *a = par_arena_alloc(ar, sizeof *a, 64);
        int32_t *e = par_arena_alloc(ar, np * sizeof *e + 1, 64);
        int64_t *s = par_arena_alloc(ar, 3 * np * sizeof *s + 1, 64);
        if (!a || !e || !s)
            return par_err(PAR_ENOMEM, "stats view: out of memory for the order-free aux sums (%zu)", np);
        *a = (par_racc){.n = np, .e = e, .s0 = s, .s1 = s + np, .s2 = s + 2 * np};
        par_racc_zero(a, 0, np);
        v->psum_acc = a;
    }
    v->aux = NULL;
    v->cnt = cnt;
    v->psum = psum;
    v->ntok = ntok;
    return PAR_OK;
}

void PAR_FN(par_stats_zero)(PAR_FN(par_stats) *st)
{
    size_t ns = (size_t)(st->Ns > 0 ? st->Ns : 1);
    size_t nb = (size_t)(st->n_blocks > 0 ? st->n_blocks : 1), nr = (size_t)(st->n_rows > 0 ? st->n_rows : 1);
    size_t E = (size_t)st->E;
    st->n_main = st->n_mtp = st->n_tokens = 0;
    st->grad_sumsq = 0;
    /* kernels read cnt/ntok (the aux backward): the host owns them again */
    memset(st->ce_main, 0, ns * sizeof(double));
    memset(st->ce_mtp, 0, ns * sizeof(double));
    for (int k = 0; st->ce_acc && k < 2; k++)
        par_racc_zero(&st->ce_acc[k], 0, st->ce_acc[k].n);
    if (st->psum_acc)
        par_racc_zero(st->psum_acc, 0, st->psum_acc->n);
    memset(st->loads, 0, nb * E * sizeof(int64_t));
    memset(st->aux, 0, nb * ns * sizeof(par_real));
    if (!st->cnt) /* a window of terms only (par_stats_alloc_terms) */
        return;
    par_dev_host_set(st->cnt, nr * ns * E * sizeof(int64_t));
    par_dev_host_set(st->ntok, nr * ns * sizeof(int64_t));
    memset(st->cnt, 0, nr * ns * E * sizeof(int64_t));
    memset(st->psum, 0, nr * ns * E * sizeof(par_real));
    memset(st->ntok, 0, nr * ns * sizeof(int64_t));
}

par_status PAR_FN(par_stats_exact)(PAR_FN(par_stats) *st)
{
    if (st->ce_acc)
        return PAR_OK;
    const size_t ns = (size_t)(st->Ns > 0 ? st->Ns : 1);
    par_racc *a = par_calloc(2, sizeof *a, PAR_TAG_ACT);
    par_status s = a ? PAR_OK : par_err(PAR_ENOMEM, "stats: out of memory for the order-free CE sums");
    for (int k = 0; !s && k < 2; k++)
        if (!(s = par_racc_init(&a[k], ns)) &&
            (s = par_racc_register(k ? st->ce_mtp : st->ce_main, ns, sizeof(double), &a[k])))
            par_racc_free(&a[k]);
    if (s && a) {
        par_racc_unregister(st->ce_main);
        for (int k = 0; k < 2; k++)
            if (a[k].n)
                par_racc_free(&a[k]);
        par_free(a);
        return s;
    }
    st->ce_acc = a;
    if (!st->psum)
        return PAR_OK;
    const size_t np = (size_t)(st->n_rows > 0 ? st->n_rows : 1) * ns * (size_t)st->E;
    if (!(st->psum_acc = par_calloc(1, sizeof *st->psum_acc, PAR_TAG_ACT)) || par_racc_init(st->psum_acc, np)) {
        par_free(st->psum_acc);
        st->psum_acc = NULL;
        return par_err(PAR_ENOMEM, "stats: out of memory for the order-free aux sums (%zu)", np);
    }
    return PAR_OK;
}

void PAR_FN(par_stats_psum_terms)(PAR_FN(par_stats) *st, int64_t r, const par_real *s, const int32_t *sample_of,
                                  int64_t T)
{
    const int64_t E = st->E;
    for (int64_t t = 0; st->psum_acc && r >= 0 && t < T; t++) {
        const par_real *st_ = s + t * E;
        par_real S = 0;
        for (int64_t e = 0; e < E; e++)
            S += st_[e];
        for (int64_t e = 0; e < E; e++)
            par_racc_put(st->psum_acc, (size_t)((r * st->Ns + sample_of[t]) * E + e), (double)(st_[e] / S));
    }
}

/* psum = the order-free sums (the bitwise mode; a no-op outside it). */
static void psum_settle(const PAR_FN(par_stats) *st)
{
    for (size_t i = 0; st->psum_acc && i < st->psum_acc->n; i++)
        st->psum[i] = (par_real)par_racc_value(st->psum_acc, i);
}

void PAR_FN(par_stats_settle)(PAR_FN(par_stats) *st)
{
    for (int k = 0; st->ce_acc && k < 2; k++)
        for (int64_t q = 0; q < st->Ns; q++)
            (k ? st->ce_mtp : st->ce_main)[q] = par_racc_value(&st->ce_acc[k], (size_t)q);
}

void PAR_FN(par_stats_free)(PAR_FN(par_stats) *st)
{
    if (st->ce_acc) {
        par_racc_unregister(st->ce_main);
        par_racc_unregister(st->ce_mtp);
        par_racc_free(&st->ce_acc[0]);
        par_racc_free(&st->ce_acc[1]);
        par_free(st->ce_acc);
    }
    if (st->psum_acc) {
        par_racc_free(st->psum_acc);
        par_free(st->psum_acc);
    }
    par_free(st->ce_main);
    par_free(st->ce_mtp);
    par_free(st->loads);
    par_free(st->cnt);
    par_free(st->psum);
    par_free(st->ntok);
    par_free(st->aux);
    par_free(st->row);
    memset(st, 0, sizeof *st);
}

par_status PAR_FN(par_stats_combine)(PAR_FN(par_stats) *dst, const PAR_FN(par_stats) *src)
{
    int rows_differ = (dst->row || src->row) &&
                      (!dst->row || !src->row || memcmp(dst->row, src->row, (size_t)dst->n_blocks * sizeof *dst->row));
    if (dst->n_blocks != src->n_blocks || dst->E != src->E || dst->Ns != src->Ns || dst->n_rows != src->n_rows ||
        rows_differ)
        return par_err(PAR_EMISMATCH,
                       "stats combine: sizes or held blocks differ (n_blocks %lld vs %lld, E %lld vs %lld, Ns %lld vs %lld)",
                       (long long)dst->n_blocks, (long long)src->n_blocks, (long long)dst->E,
                       (long long)src->E, (long long)dst->Ns, (long long)src->Ns);
    if (dst->q0 != src->q0 || dst->Ns_global != src->Ns_global)
        return par_err(PAR_EMISMATCH,
                       "stats combine: windows differ (first sample %lld vs %lld, global samples %lld vs %lld)",
                       (long long)dst->q0, (long long)src->q0, (long long)dst->Ns_global,
                       (long long)src->Ns_global);
    int64_t ns = dst->Ns, nb = dst->n_blocks, nr = dst->n_rows, E = dst->E;
    par_dev_host_write(dst->cnt, (size_t)(nr * ns * E) * sizeof(int64_t));
    par_dev_host_write(dst->ntok, (size_t)(nr * ns) * sizeof(int64_t));
    dst->n_main += src->n_main;
    dst->n_mtp += src->n_mtp;
    dst->n_tokens += src->n_tokens;
    dst->grad_sumsq += src->grad_sumsq;
    for (int64_t q = 0; q < ns; q++) {
        dst->ce_main[q] += src->ce_main[q];
        dst->ce_mtp[q] += src->ce_mtp[q];
    }
    for (int64_t i = 0; i < nb * E; i++)
        dst->loads[i] += src->loads[i];
    for (int64_t i = 0; i < nr * ns * E; i++) {
        dst->cnt[i] += src->cnt[i];
        dst->psum[i] += src->psum[i];
    }
    for (int64_t i = 0; i < nr * ns; i++)
        dst->ntok[i] += src->ntok[i];
    return PAR_OK;
}

/* dst[q] = the aux-loss term of src's sample q in its row r (a
 * score-routed block): par_moe_aux_loss of that sample alone. */
static void aux_block(par_real *dst, const PAR_FN(par_stats) *src, int64_t r, int K)
{
    const int64_t Ns = src->Ns, E = src->E;
    /* one sample alone: (0 + inner) / 1 == inner, bit for bit */
    for (int64_t q = 0; q < Ns; q++)
        dst[q] = PAR_FN(par_moe_aux_loss)(src->cnt + (r * Ns + q) * E, src->psum + (r * Ns + q) * E,
                                          src->ntok + r * Ns + q, 1, 1, (int)E, K);
}

void PAR_FN(par_stats_aux_terms)(PAR_FN(par_stats) *st, const par_param_table *tab, int K)
{
    int64_t Ns = st->Ns;
    psum_settle(st);
    for (int64_t b = 0; b < st->n_blocks; b++) {
        par_real *a = st->aux + b * Ns;
        int64_t r = PAR_FN(par_stats_row)(st, b);
        if (tab->blocks[b].gate_bias < 0 || r < 0) { /* hash-routed: no aux loss; not held: another's */
            memset(a, 0, (size_t)Ns * sizeof *a);
            continue;
        }
        aux_block(a, st, r, K);
    }
}

void PAR_FN(par_stats_aux_view)(PAR_FN(par_stats) *win, const PAR_FN(par_stats) *v, const int *blocks, int n,
                                const par_param_table *tab, int K)
{
    const int64_t qd = v->q0 - win->q0;
    psum_settle(v); /* the bitwise mode: psum from its order-free sums */
    for (int j = 0; j < n; j++) {
        int b = blocks[j];
        int64_t r = PAR_FN(par_stats_row)(v, b);
        if (b < 0 || b >= win->n_blocks || tab->blocks[b].gate_bias < 0 || r < 0)
            continue; /* hash-routed: its terms stay the step's zeros */
        aux_block(win->aux + b * win->Ns + qd, v, r, K);
    }
}

void PAR_FN(par_model_losses_from)(const PAR_FN(par_model) *M, int64_t n_main, int64_t n_mtp,
                                   const double *ce_main, const double *ce_mtp, const par_real *aux,
                                   int64_t Ns, par_step_scalars *out)
{
    const par_config *c = &M->cfg;
    double lm = 0, lt = 0, la = 0;
    if (n_main > 0) {
        double s = 0;
        for (int64_t q = 0; q < Ns; q++)
            s += ce_main[q];
        lm = s / (double)n_main;
    }
    if (c->n_mtp_layers > 0 && n_mtp > 0) {
        double s = 0;
        for (int64_t q = 0; q < Ns; q++)
            s += ce_mtp[q];
        lt = s / (double)n_mtp;
    }
    for (int b = 0; b < M->n_blocks; b++) {
        if (M->tab.blocks[b].gate_bias < 0)
            continue; /* hash-routed: no aux loss */
        /* par_moe_aux_loss's sum: samples ascending in par_real (empty
         * samples add an exact 0), then / Ns */
        par_real total = 0;
        for (int64_t q = 0; q < Ns; q++)
            total += aux[(int64_t)b * Ns + q];
        la += (double)(Ns > 0 ? total / (par_real)Ns : 0);
    }
    out->loss_main = lm;
    out->loss_mtp = lt;
    out->loss_aux = la;
    out->loss = lm + (n_mtp > 0 ? c->mtp_lambda * lt : 0.0) + c->aux_alpha * la;
    out->grad_norm = 0;
}

void PAR_FN(par_model_losses)(const PAR_FN(par_model) *M, PAR_FN(par_stats) *st, par_step_scalars *out)
{
    PAR_FN(par_stats_settle)(st);
    PAR_FN(par_stats_aux_terms)(st, &M->tab, (int)M->K);
    PAR_FN(par_model_losses_from)(M, st->n_main, st->n_mtp, st->ce_main, st->ce_mtp, st->aux, st->Ns, out);
    out->grad_norm = sqrt(st->grad_sumsq);
}

/* ------------------------------------------------------------------ model -- */

void PAR_FN(par_model_free)(PAR_FN(par_model) *M)
{
    if (M->blk) {
        for (int b = 0; b < M->n_blocks; b++)
            PAR_FN(par_block_act_release)(&M->blk[b]);
    }
    par_free(M->blk);
    par_free(M->X);
    par_arena_destroy(&M->arena);
    PAR_FN(par_stats_free)(&M->stats);
    if (M->cfg.recipe && M->params) /* the recipe's weight registrations (kernels/recipe.h) */
        par_recipe_unregister(M->params);
    par_free(M->params);
    if (M->racc.n) {
        par_racc_unregister(M->grads);
        par_racc_free(&M->racc);
    }
    par_free(M->grads);
    par_free(M->opt_m);
    par_free(M->opt_v);
    par_free(M->i32);
    par_free(M->rope);
    par_free(M->adims);
    par_free((void *)M->ew);
    par_free(M->egw);
    par_free(M->loc);
    par_free(M->cut);
    if (M->tab.p && !M->tab_borrowed)
        par_param_table_free(&M->tab);
    memset(M, 0, sizeof *M);
}

par_status PAR_FN(par_model_init)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed)
{
    return PAR_FN(par_model_init_owned)(M, cfg, seed, 0, cfg->n_routed_experts);
}

par_status PAR_FN(par_model_init_owned)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed,
                                        int64_t e0, int64_t e1)
{
    return PAR_FN(par_model_init_held)(M, cfg, seed, e0, e1, NULL);
}

/* 1 when `hold` (NULL: everything) names table entry p. */
static int hold_has(const par_model_hold *h, const par_param_table *t, int idx)
{
    if (!h)
        return 1;
    const par_param *p = &t->p[idx];
    if (p->layer >= 0)
        return !h->blocks || h->blocks[p->layer];
    if (idx == t->top.embed)
        return h->embed;
    if (idx == t->top.head)
        return h->head;
    return h->final; /* norm.weight, hc_head_fn/base/scale */
}

/* M->cut from the hold's cut_of (NULL: every entry whole); a cut that does
 * not divide its dimension is PAR_EINVAL naming the numbers. */
static par_status cut_map(PAR_FN(par_model) *M, const par_model_hold *hold)
{
    if (!hold || !hold->cut_of)
        return PAR_OK;
    M->cut = par_calloc((size_t)(M->tab.n > 0 ? M->tab.n : 1), sizeof *M->cut, PAR_TAG_MODEL);
    if (!M->cut)
        return par_err(PAR_ENOMEM, "model: out of memory for the shard map");
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        int rank = 0, P = 1, c = p->dtype == PAR_PDT_REAL ? hold->cut_of(hold->cut_ctx, p->name, &rank, &P) : 0;
        if (c == 0 || P <= 1)
            continue;
        const int64_t dim = c == 1 ? p->shape[0] : p->shape[1];
        if ((c != 1 && c != 2) || dim % P != 0 || rank < 0 || rank >= P)
            return par_err(PAR_EINVAL, "model: %s [%lld, %lld] cannot be held as block %d of %d of its %s",
                           p->name, (long long)p->shape[0], (long long)p->shape[1], rank, P,
                           c == 1 ? "rows" : "columns");
        M->cut[i] = (par_model_cut){(int16_t)c, (int16_t)rank, (int16_t)P};
    }
    return PAR_OK;
}

/* M->loc: each table entry's offset in the local buffers (int32 tables:
 * in M->i32; -1: not held, another EP slice or not in `hold`), and
 * M->n_local, the held floats. */
static par_status local_map(PAR_FN(par_model) *M, const par_model_hold *hold)
{
    int64_t n_exp = 0;
    for (int i = 0; i < M->tab.n; i++)
        n_exp += M->tab.p[i].expert >= 0;
    if (n_exp != (int64_t)M->n_blocks * 3 * M->E)
        return par_err(PAR_EINVAL, "model: the table has %lld routed-expert entries, not n_blocks %d x 3 x E %lld",
                       (long long)n_exp, M->n_blocks, (long long)M->E);
    M->n_dense = M->tab.n - (int)n_exp;
    const int64_t n_held = (int64_t)M->n_blocks * 3 * (M->e1 - M->e0);
    M->loc = par_malloc((size_t)(M->n_dense + n_held + 1) * sizeof *M->loc, PAR_TAG_MODEL);
    if (!M->loc)
        return par_err(PAR_ENOMEM, "model: out of memory for the ownership map");
    M->loc_exp = M->loc + M->n_dense;
    /* with a share hook two passes: the dense entries first (the shareable
     * prefix), then the routed experts; else one pass in table order */
    const int dense_first = hold && hold->share;
    int64_t nf = 0;
    for (int pass = dense_first ? 0 : 2; pass < (dense_first ? 2 : 3); pass++) {
        for (int i = 0; i < M->tab.n; i++) {
            const par_param *p = &M->tab.p[i];
            if (pass < 2 && (p->expert >= 0) != (pass == 1))
                continue;
            int64_t *at = PAR_FN(par__model_loc_at)(M, i);
            if (!at) /* a routed expert of another EP slice: nothing stored */
                continue;
            if (p->dtype == PAR_PDT_I32)
                *at = p->offset;
            else if (!hold_has(hold, &M->tab, i))
                *at = -1;
            else {
                *at = nf;
                nf += PAR_FN(par_model_numel)(M, i);
            }
        }
        if (pass == 0)
            M->n_shared = nf;
    }
    M->n_local = nf;
    return PAR_OK;
}

/* The local buffers (params, grads, optimizer state, int32 tables) and the
 * per-block tables, zeroed. */
static par_status alloc_state(PAR_FN(par_model) *M)
{
    const int64_t nf = M->n_local, np = nf - (M->shw ? M->n_shared : 0);
    M->params = par_calloc((size_t)(np > 0 ? np : 1), sizeof(par_real), PAR_TAG_PARAM);
    M->grads = par_calloc((size_t)(nf > 0 ? nf : 1), sizeof(par_real), PAR_TAG_GRAD);
    M->opt_m = par_calloc((size_t)(nf > 0 ? nf : 1), sizeof(par_real), PAR_TAG_OPTIM);
    M->opt_v = par_calloc((size_t)(nf > 0 ? nf : 1), sizeof(par_real), PAR_TAG_OPTIM);
    M->i32 = par_calloc((size_t)(M->tab.n_i32 > 0 ? M->tab.n_i32 : 1), sizeof(int32_t), PAR_TAG_PARAM);
    M->rope = par_calloc(2, sizeof(par_rope), PAR_TAG_MODEL); /* [0] plain, [1] YaRN: the blocks point at them */
    M->adims = par_calloc((size_t)M->n_blocks, sizeof(par_attn_dims), PAR_TAG_MODEL);
    const size_t El = (size_t)(M->e1 - M->e0); /* held experts only */
    M->ew = par_calloc((size_t)M->n_blocks * 3 * El, sizeof(par_real *), PAR_TAG_MODEL);
    M->egw = par_calloc((size_t)M->n_blocks * 3 * El, sizeof(par_real *), PAR_TAG_MODEL);
    M->blk = par_calloc((size_t)M->n_blocks, sizeof(PAR_FN(par_block_act)), PAR_TAG_MODEL);
    M->X = par_calloc((size_t)M->cfg.n_layers + 1, sizeof(par_real *), PAR_TAG_MODEL);
    if (!M->params || !M->grads || !M->opt_m || !M->opt_v || !M->i32 || !M->rope || !M->adims || !M->ew ||
        !M->egw || !M->blk || !M->X)
        return par_err(PAR_ENOMEM, "model: out of memory for %lld parameters", (long long)nf);
    if (!M->cfg.bitwise || nf == 0)
        return PAR_OK;
    par_status s = par_racc_init(&M->racc, (size_t)nf);
    if (!s && (s = par_racc_register(M->grads, (size_t)nf, sizeof(par_real), &M->racc)))
        par_racc_free(&M->racc);
    return s;
}

/* Entry idx's held values from the serial init into out: the whole tensor,
 * or its block (rows: one contiguous range; columns: a range per row). */
static par_status init_held(const PAR_FN(par_model) *M, par_real *out, int idx, uint64_t seed)
{
    const par_param *p = &M->tab.p[idx];
    const par_model_cut *c = PAR_FN(par_model_cut_of)(M, idx);
    if (!c)
        return PAR_FN(par_init_param_slice)(out, &M->tab, idx, seed, 0, p->numel);
    const int64_t n = p->numel / c->P;
    if (c->cut == 1)
        return PAR_FN(par_init_param_slice)(out, &M->tab, idx, seed, c->rank * n, (c->rank + 1) * n);
    const int64_t cols = p->shape[1], sc = cols / c->P;
    for (int64_t r = 0; r < p->shape[0]; r++) {
        const int64_t a = r * cols + c->rank * sc;
        par_status st = PAR_FN(par_init_param_slice)(out + r * sc, &M->tab, idx, seed, a, a + sc);
        if (st)
            return st;
    }
    return PAR_OK;
}

/* Every held tensor from its slice init: the serial model's values. */
static par_status init_values(PAR_FN(par_model) *M, uint64_t seed)
{
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        par_status st = PAR_OK;
        if (p->dtype == PAR_PDT_I32)
            st = PAR_FN(par_init_param_slice_i32)(M->i32 + PAR_FN(par_model_loc)(M, i), &M->tab, i, 0, p->numel);
        else if (PAR_FN(par_model_loc)(M, i) >= 0 && !(M->shw && PAR_FN(par_model_loc)(M, i) < M->n_shared)) /* shared: filled once */
            st = init_held(M, PAR_FN(par_model_ptr)(M, M->params, i), i, seed);
        if (st)
            return st;
    }
    return PAR_OK;
}

par_status PAR_FN(par_model_fill_shared)(const PAR_FN(par_model) *M, par_real *w)
{
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        if (p->dtype != PAR_PDT_REAL || PAR_FN(par_model_loc)(M, i) < 0 || PAR_FN(par_model_loc)(M, i) >= M->n_shared)
            continue;
        par_status st = init_held(M, w + PAR_FN(par_model_loc)(M, i), i, M->seed);
        if (st)
            return st;
    }
    return PAR_OK;
}

/* Under a recipe: every held 2-D weight (its own buffer or the process's
 * shared copy) registered with its class (kernels/recipe.h), so that the linear kernels cast it. */
static par_status register_recipe(const PAR_FN(par_model) *M, const par_model_hold *hold)
{
    if (M->cfg.recipe == PAR_RECIPE_NONE)
        return PAR_OK;
    for (int i = 0; i < M->tab.n; i++) {
        const par_param *p = &M->tab.p[i];
        par_real *w = PAR_FN(par_model_ptr)(M, M->params, i); /* own or shared (DP replicas) */
        if (p->dtype != PAR_PDT_REAL || p->ndim != 2 || PAR_FN(par_model_loc)(M, i) < 0 || !w)
            continue;
        const par_model_cut *cut = PAR_FN(par_model_cut_of)(M, i);
        par_recipe_shard sh = {0};
        if (cut) { /* a TP/ETP block: the whole tensor's tiles, cut ones maxed over the group */
            sh = (par_recipe_shard){cut->cut, cut->rank, cut->P, hold ? hold->tile_max : NULL,
                                    hold ? hold->tile_ctx : NULL, ""};
            snprintf(sh.name, sizeof sh.name, "%s", p->name);
        }
        /* owner: the model's own buffer, whatever holds *M */
        par_status st = par_recipe_register(M->params, w, PAR_FN(par_model_numel)(M, i) * (int64_t)sizeof(par_real),
                                             (par_recipe)M->cfg.recipe, par_recipe_wclass_of(p->name), &sh);
        if (st)
            return st;
    }
    return PAR_OK;
}

/* Block b's RoPE table and attention dims (checked), and its experts'
 * weight and gradient pointers. */
static par_status block_setup(PAR_FN(par_model) *M, int b)
{
    const par_config *cfg = &M->cfg;
    int64_t m = par_config_ratio(cfg, b);
    if (m > 0) /* the same table for every m > 0 block (filled again: the same values) */
        par_rope_init(&M->rope[1], (int)cfg->rope_head_dim, cfg->compress_rope_theta, 1, cfg->rope_factor,
                      cfg->original_seq_len, cfg->beta_fast, cfg->beta_slow);
    else
        par_rope_init(&M->rope[0], (int)cfg->rope_head_dim, cfg->rope_theta, 0, cfg->rope_factor, 0,
                      cfg->beta_fast, cfg->beta_slow);
    par_attn_dims *dm = &M->adims[b];
    dm->d = cfg->dim;
    dm->H = cfg->n_heads;
    dm->hd = cfg->head_dim;
    dm->rd = cfg->rope_head_dim;
    dm->q_lora = cfg->q_lora_rank;
    dm->o_groups = cfg->o_groups;
    dm->o_lora = cfg->o_lora_rank;
    dm->window = cfg->window_size;
    dm->m = m;
    dm->iH = cfg->index_n_heads;
    dm->ihd = cfg->index_head_dim;
    dm->topk = cfg->index_topk;
    dm->norm_eps = cfg->norm_eps;
    dm->rope = &M->rope[m > 0];
    dm->bitwise = cfg->bitwise;
    dm->fp4_index = par_recipe_fp4_indexer((par_recipe)cfg->recipe);
    par_status st = PAR_FN(par_attn_check_dims)(dm);
    if (st)
        return st;
    const par_block_params *bp = &M->tab.blocks[b];
    for (int64_t e = M->e0; e < M->e1; e++)
        for (int k = 0; k < 3; k++) {
            int idx = bp->expert0 + 3 * (int)e + k;
            PAR_FN(par_model_ew_row)(M, b, k)[e - M->e0] = PAR_FN(par_model_ptr)(M, M->params, idx);
            PAR_FN(par_model_egw_row)(M, b, k)[e - M->e0] = PAR_FN(par_model_ptr)(M, M->grads, idx);
        }
    return PAR_OK;
}

par_status PAR_FN(par_model_init_held)(PAR_FN(par_model) *M, const par_config *cfg, uint64_t seed,
                                       int64_t e0, int64_t e1, const par_model_hold *hold)
{
    memset(M, 0, sizeof *M);
    par_status st = par_config_validate(cfg);
    if (st)
        return st;
    if (cfg->n_mtp_layers > 1)
        return par_err(PAR_EUNSUPPORTED, "model: n_mtp_layers = %lld, the reference supports 0 or 1",
                       (long long)cfg->n_mtp_layers);
    if (cfg->hc_mult > PAR_HC_MAX_N)
        return par_err(PAR_EUNSUPPORTED, "model: hc_mult = %lld exceeds the kernels' limit %d",
                       (long long)cfg->hc_mult, PAR_HC_MAX_N);
    M->cfg = *cfg;
    M->seed = seed;
    if (hold && hold->tab && !memcmp(&hold->tab->cfg, cfg, sizeof *cfg)) { /* all 8-byte fields: no padding */
        M->tab = *hold->tab;
        M->tab_borrowed = 1;
    } else if ((st = par_param_table_build(&M->tab, cfg))) {
        memset(&M->tab, 0, sizeof M->tab);
        return st;
    }
    M->n = cfg->hc_mult;
    M->d = cfg->dim;
    M->V = cfg->vocab_size;
    M->E = cfg->n_routed_experts;
    M->K = cfg->n_activated_experts;
    M->I = cfg->moe_inter_dim;
    M->n_blocks = (int)par_config_n_blocks(cfg);
    if (e0 < 0 || e1 <= e0 || e1 > M->E) {
        st = par_err(PAR_EINVAL, "model: owned expert range [%lld, %lld) is not inside [0, E=%lld)",
                     (long long)e0, (long long)e1, (long long)M->E);
        goto fail_free_model;
    }
    M->e0 = e0;
    M->e1 = e1;
    if ((st = cut_map(M, hold)) || (st = local_map(M, hold)) || (hold && hold->share && (st = hold->share(hold->share_ctx, M))))
        goto fail_free_model;
    if (!M->shw)
        M->n_shared = 0; /* not shared: the local order stays as built, all of it the model's */
    if ((st = alloc_state(M)) || (st = init_values(M, seed)) || (st = register_recipe(M, hold)))
        goto fail_free_model;
    for (int b = 0; b < M->n_blocks; b++)
        if ((st = block_setup(M, b)))
            goto fail_free_model;
    par_arena_init(&M->arena, (size_t)8 << 20, PAR_TAG_ACT);
    return PAR_OK;

fail_free_model:
    PAR_FN(par_model_free)(M);
    return st;
}
